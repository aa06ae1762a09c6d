//! The coordinator's Raft group: the site's configuration, replicated.
//!
//! What is replicated is one value, the site's `Topology` (which nodes exist,
//! which chain serves each partition, at which `epoch`). A change of
//! configuration (a node joins, a chain is repaired) is proposed as a whole
//! new topology with a greater epoch; the state machine (`state`) keeps the
//! topology with the highest epoch and ignores any proposal whose epoch is not
//! greater, telling its proposer the current epoch. Every member publishes the
//! topology it has applied on a `watch` channel, which is how the rest of the
//! node learns about new epochs.
//!
//! Why Raft: the p2p store (§2.6) needs one coordinator at a time, elected
//! among the coordinator nodes, to decide configuration changes, and a new
//! one elected quickly when it dies. That is exactly Raft's leader election,
//! and Raft's log makes sure a configuration the old leader committed is not
//! lost by the new one. We use openraft (0.9) rather than an election of our
//! own: only the Raft leader can commit a proposal (`propose` elsewhere
//! answers `NotLeader` with a hint). Heartbeats go out every 100 ms; after
//! the last one from a dead leader, a follower waits out openraft's leader
//! lease (the maximum election timeout, 600 ms) plus a random election timeout
//! (300-600 ms) before standing, so writes are unavailable for about a second
//! (1.0-1.2 s on loopback in the tests), within the 2 s we aim for.
//!
//! The rooms: `log` (the Raft log and the vote), `state` (the topology state
//! machine and its snapshots), `network` (Raft RPCs over the node's binary
//! port, on `Hello::Raft` connections); this file ties them into a
//! `RaftHandle`.
//!
//! Durability: with a data directory, a member keeps its Raft state in
//! `<data_dir>/raft/`: the vote, the commit index and the log entries (`log`)
//! and the latest snapshot (`state`), each write synced before openraft is
//! told it is done (the vote before it is answered, entries before they are
//! acknowledged to the leader). A member that restarts still knows its vote,
//! so it cannot vote twice in one term, and its log. On start openraft
//! re-applies the entries a member knew to be committed (the next leader's
//! first entry commits whatever else the group had committed), so a whole
//! group that restarts elects a leader among its members and comes back at
//! the latest committed epoch, whatever topology its nodes start with.
//! Without a data directory all of it is in memory: a restarted member comes
//! back empty (forgetting its vote) and is caught up by the leader, and a
//! whole group that restarts starts again from the topology its nodes start
//! with.
//!
//! A member restarted on an empty disk (its log and vote gone) comes back
//! as the voter it was: it initializes like a new member, the leader finds
//! its log behind what it had acknowledged and sends it everything again.
//! openraft calls that a log reversion and panics the leader's replication
//! unless built with `loosen-follower-log-revert` (we are): without it, one
//! wiped coordinator disk stopped the coordinator for good
//! (`cli/tests/recovery.rs`). What that leaves open: until it has caught
//! up, the wiped member may vote for a member that lacks the latest
//! committed entry, which loses that entry if the member that has it is
//! down at the same moment (a double fault within the catch-up time).
//!
//! Not done yet:
//! * A member restarted on an empty disk should come back as a learner and
//!   be promoted once caught up (openraft membership changes), which closes
//!   the double-fault window above.
//! * Membership of the Raft group is static: the voters given to `start`.
//!   Adding or removing coordinator nodes needs openraft's membership changes.
//!   With a data directory the members' addresses are those the group was
//!   first formed with (they are in the log's membership entry; `start`'s
//!   `initialize` is refused once the log has entries), so a coordinator
//!   node that comes back on another address is not found by the others.

mod log;
mod network;
mod state;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use causeway_core::ring::{NodeId, Topology};
use causeway_core::wire::{put_frame, take_frame};
use openraft::error::{ClientWriteError, RaftError};
use openraft::{BasicNode, Config, Raft, ServerState};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::watch;

use self::log::LogStore;
use self::network::{Network, RaftRequest};
use self::state::{Applied, TopologyMachine};

openraft::declare_raft_types!(
    /// openraft's types for the coordinator group: commands are whole
    /// topologies, node ids are `NodeId`s widened to u64, and a node's
    /// address is its client/peer address.
    TypeConfig:
        D = Topology,
        R = Applied,
        NodeId = u64,
        Node = BasicNode,
        SnapshotData = std::io::Cursor<Vec<u8>>,
);

/// Heartbeats from the leader. Followers stand for election after a random
/// 500-800 ms without one, plus the leader lease (the 800 ms maximum). A
/// heartbeat every 200 ms (not 100) halves what an idle coordinator costs;
/// a dead leader is replaced about 200 ms later than it was.
const HEARTBEAT_MS: u64 = 200;
const ELECTION_TIMEOUT_MS: (u64, u64) = (500, 800);

/// How long after a confirmation of its leadership (`confirm_leadership`,
/// started then) a leader may still act as one: no follower that heard it
/// then stands for election sooner, so no other leader exists yet.
pub const LEADERSHIP_VALID_MS: u64 = ELECTION_TIMEOUT_MS.0;

/// How long `propose` waits for its entry to be applied. Without a quorum a
/// Raft write waits forever; the caller should rather hear about it.
const PROPOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// This node's member of the coordinator's Raft group.
pub struct RaftHandle {
    me: NodeId,
    raft: Raft<TypeConfig>,
    topology: watch::Receiver<Arc<Topology>>,
}

/// Why a proposal was not adopted.
#[derive(Debug)]
pub enum ProposeError {
    /// Only the leader commits; `leader` is who this member believes it is.
    NotLeader { leader: Option<NodeId> },
    /// The proposal's epoch is not greater than the applied one, `current_epoch`.
    Stale { current_epoch: u64 },
    /// The member stopped, or the entry was not applied within the timeout
    /// (it may still commit later: `watch` will tell).
    Failed(String),
}

impl std::fmt::Display for ProposeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProposeError::NotLeader { leader: Some(leader) } => write!(f, "not the coordinator's leader; node {leader} is"),
            ProposeError::NotLeader { leader: None } => write!(f, "not the coordinator's leader, and no leader is known"),
            ProposeError::Stale { current_epoch } => write!(f, "stale topology: the current epoch is already {current_epoch}"),
            ProposeError::Failed(why) => write!(f, "proposal failed: {why}"),
        }
    }
}

impl std::error::Error for ProposeError {}

/// Raft member ids are our node ids; the group is made only of them.
fn node_id(id: u64) -> NodeId {
    NodeId::try_from(id).expect("coordinator members are causeway node ids")
}

impl RaftHandle {
    /// Starts this node's Raft member. `voters` maps every coordinator node id
    /// to its address (host:port, the port the node serves clients and peers
    /// on). Every member initializes the group with all voters as members.
    /// `initial` is the topology the node starts with: the state machine
    /// starts from it (or from its saved snapshot, if newer), so `watch` has
    /// a value before any proposal. `dir` is where the member keeps its log,
    /// vote and snapshot; None keeps them in memory.
    pub async fn start(
        me: NodeId,
        voters: BTreeMap<NodeId, String>,
        initial: Topology,
        dir: Option<&Path>,
        secret: Option<Arc<str>>,
    ) -> Result<Arc<RaftHandle>, String> {
        if !voters.contains_key(&me) {
            return Err(format!("node {me} is not among the coordinator's voters {:?}", voters.keys().collect::<Vec<_>>()));
        }
        let config = Config {
            cluster_name: "causeway-coordinator".into(),
            heartbeat_interval: HEARTBEAT_MS,
            election_timeout_min: ELECTION_TIMEOUT_MS.0,
            election_timeout_max: ELECTION_TIMEOUT_MS.1,
            ..Config::default()
        }
        .validate()
        .map_err(|e| format!("raft config: {e}"))?;
        let log = LogStore::open(dir).map_err(|e| format!("the coordinator's raft log: {e}"))?;
        let (machine, topology) = TopologyMachine::open(initial, dir).map_err(|e| format!("the coordinator's raft snapshot: {e}"))?;
        let raft = Raft::new(me.into(), Arc::new(config), Network::new(me, secret), log, machine)
            .await
            .map_err(|e| format!("starting the raft member: {e}"))?;
        // Every voter initializes the group with the same membership (which
        // openraft allows): if only one did and died before replicating it,
        // the others could never elect a leader.
        let members: BTreeMap<u64, BasicNode> = voters.iter().map(|(&id, addr)| (id.into(), BasicNode::new(addr))).collect();
        // Another member's initialization may already have reached this one,
        // or this member restarted with its log (then openraft refuses a
        // second one): that is the group forming or already formed, not an
        // error worth stopping the node for.
        match raft.initialize(members).await {
            Ok(()) => tracing::debug!(node = me, voters = ?voters, "initialized the coordinator's raft group"),
            Err(openraft::error::RaftError::APIError(openraft::error::InitializeError::NotAllowed(_))) => {}
            Err(e) => tracing::info!(node = me, "initializing the raft group: {e}; joining the group another member formed"),
        }
        Ok(Arc::new(RaftHandle { me, raft, topology }))
    }

    /// Commits `topology` through Raft (only the leader can; others answer
    /// `NotLeader` with a hint). Returns once it is applied on this member.
    pub async fn propose(&self, topology: Topology) -> Result<(), ProposeError> {
        let written = tokio::time::timeout(PROPOSE_TIMEOUT, self.raft.client_write(topology))
            .await
            .map_err(|_| ProposeError::Failed(format!("not applied within {PROPOSE_TIMEOUT:?}")))?;
        match written {
            Ok(response) if response.data.adopted => Ok(()),
            Ok(response) => Err(ProposeError::Stale { current_epoch: response.data.epoch }),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(forward))) => {
                Err(ProposeError::NotLeader { leader: forward.leader_id.map(node_id) })
            }
            Err(e) => Err(ProposeError::Failed(e.to_string())),
        }
    }

    /// This member's node.
    pub fn me(&self) -> NodeId {
        self.me
    }

    /// Who this member believes leads the group.
    pub fn leader(&self) -> Option<NodeId> {
        self.raft.metrics().borrow().current_leader.map(node_id)
    }

    /// Whether a quorum still follows this member as leader (a round of
    /// heartbeats, as for a linearizable read). A leader that was paused or
    /// cut off believes it leads until it hears otherwise: this asks.
    pub async fn confirm_leadership(&self) -> bool {
        let asked = tokio::time::timeout(Duration::from_millis(LEADERSHIP_VALID_MS), self.raft.ensure_linearizable());
        matches!(asked.await, Ok(Ok(_)))
    }

    pub fn is_leader(&self) -> bool {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        metrics.state == ServerState::Leader && metrics.current_leader == Some(self.me.into())
    }

    /// The latest applied topology. The channel closes when the member stops.
    pub fn watch(&self) -> watch::Receiver<Arc<Topology>> {
        self.topology.clone()
    }

    /// Serves Raft RPCs arriving on an accepted connection. The accept loop
    /// has already read the magic byte and the `Hello::Raft` frame; `buf`
    /// holds whatever was read past them. Each request frame gets exactly one
    /// response frame. Once the member is stopped the connection is closed
    /// instead, so peers see this member as unreachable.
    pub async fn serve(self: Arc<Self>, mut rd: OwnedReadHalf, mut wr: OwnedWriteHalf, mut buf: BytesMut) {
        let mut out = BytesMut::new();
        loop {
            let request = match take_frame::<RaftRequest>(&mut buf) {
                Ok(Some(request)) => request,
                Ok(None) => match rd.read_buf(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => continue,
                },
                Err(e) => {
                    tracing::debug!(node = self.me, "closing a raft connection: {e}");
                    return;
                }
            };
            let Some(response) = network::answer(&self.raft, request).await else { return };
            out.clear();
            put_frame(&response, &mut out);
            if wr.write_all(&out).await.is_err() {
                return;
            }
        }
    }

    /// Stops the Raft member (for tests and clean shutdown).
    pub async fn shutdown(&self) {
        if let Err(e) = self.raft.shutdown().await {
            tracing::warn!(node = self.me, "the raft member did not stop cleanly: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use causeway_core::message::{Hello, BINARY_MAGIC};
    use causeway_core::ring::{NodeInfo, Shape};
    use tokio::net::TcpListener;
    use tokio::task::JoinHandle;

    const WAIT: Duration = Duration::from_secs(10);

    fn topology(epoch: u64) -> Topology {
        let nodes = (1..=3).map(|id| NodeInfo { id, addr: format!("127.0.0.1:{}", 7000 + id) }).collect();
        Topology::new(epoch, Shape { partitions: 8, replicas: 3, k: 2, coding: None }, nodes).unwrap()
    }

    /// One member and the test's stand-in for the node's accept loop.
    struct Member {
        handle: Arc<RaftHandle>,
        listener: JoinHandle<()>,
    }

    impl Member {
        async fn stop(&self) {
            self.listener.abort();
            self.handle.shutdown().await;
        }
    }

    /// What the node's accept loop does for a `Hello::Raft` connection.
    async fn accept(listener: TcpListener, handle: Arc<RaftHandle>) {
        while let Ok((stream, _)) = listener.accept().await {
            let handle = handle.clone();
            tokio::spawn(async move {
                let (mut rd, wr) = stream.into_split();
                assert_eq!(rd.read_u8().await.unwrap(), BINARY_MAGIC);
                let mut buf = BytesMut::new();
                let hello = loop {
                    if let Some(hello) = take_frame::<Hello>(&mut buf).unwrap() {
                        break hello;
                    }
                    if rd.read_buf(&mut buf).await.unwrap() == 0 {
                        return;
                    }
                };
                assert!(matches!(hello, Hello::Raft(_)));
                handle.serve(rd, wr, buf).await;
            });
        }
    }

    /// A fresh directory under the system's temp dir, removed on drop (for
    /// the storage tests here, in `log` and in `state`).
    pub(super) struct Scratch(std::path::PathBuf);

    impl Scratch {
        pub(super) fn new(name: &str) -> Scratch {
            static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
            let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let dir = std::env::temp_dir().join(format!("causeway-raft-{name}-{}-{n}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            Scratch(dir)
        }

        pub(super) fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// Binds `addr` again once the member that listened there has stopped.
    async fn rebind(addr: &str) -> TcpListener {
        tokio::time::timeout(WAIT, async {
            loop {
                match TcpListener::bind(addr).await {
                    Ok(listener) => return listener,
                    Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                }
            }
        })
        .await
        .expect("the address is free again")
    }

    /// Starts member `id` on `listener`; `voters` are everyone's addresses.
    async fn start_member(id: NodeId, listener: TcpListener, voters: &BTreeMap<NodeId, String>, dir: Option<&Path>) -> Member {
        let handle = RaftHandle::start(id, voters.clone(), topology(1), dir, None).await.unwrap();
        let listener = tokio::spawn(accept(listener, handle.clone()));
        Member { handle, listener }
    }

    /// Three members on fresh ports, keeping their state in `dirs` if given.
    async fn cluster_in(dirs: Option<&BTreeMap<NodeId, Scratch>>) -> (Vec<Member>, BTreeMap<NodeId, String>) {
        let mut listeners = BTreeMap::new();
        for id in 1..=3 {
            listeners.insert(id, TcpListener::bind("127.0.0.1:0").await.unwrap());
        }
        let voters: BTreeMap<NodeId, String> = listeners.iter().map(|(&id, l)| (id, l.local_addr().unwrap().to_string())).collect();
        let mut members = Vec::new();
        for (id, listener) in listeners {
            members.push(start_member(id, listener, &voters, dirs.map(|d| d[&id].path())).await);
        }
        (members, voters)
    }

    async fn cluster() -> Vec<Member> {
        cluster_in(None).await.0
    }

    /// Waits until every running member agrees on a leader, and it knows it.
    async fn elected(members: &[&Member]) -> NodeId {
        tokio::time::timeout(WAIT, async {
            loop {
                let leader = members[0].handle.leader();
                if let Some(leader) = leader {
                    let agreed = members.iter().all(|m| m.handle.leader() == Some(leader));
                    if agreed && members.iter().any(|m| m.handle.me == leader && m.handle.is_leader()) {
                        return leader;
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("a leader is elected")
    }

    async fn sees_epoch(member: &Member, epoch: u64) {
        let mut rx = member.handle.watch();
        tokio::time::timeout(WAIT, rx.wait_for(|t| t.epoch == epoch)).await.expect("the epoch arrives").unwrap();
    }

    fn member(members: &[Member], id: NodeId) -> &Member {
        members.iter().find(|m| m.handle.me == id).unwrap()
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn the_leader_commits_and_others_point_to_it() {
        let members = cluster().await;
        for m in &members {
            assert_eq!(m.handle.watch().borrow().epoch, 1, "the boot topology is there before any proposal");
        }
        let leader = elected(&members.iter().collect::<Vec<_>>()).await;

        member(&members, leader).handle.propose(topology(2)).await.unwrap();
        for m in &members {
            sees_epoch(m, 2).await;
        }

        let follower = members.iter().find(|m| m.handle.me != leader).unwrap();
        assert!(!follower.handle.is_leader());
        match follower.handle.propose(topology(3)).await {
            Err(ProposeError::NotLeader { leader: hint }) => assert_eq!(hint, Some(leader)),
            other => panic!("a follower answered {other:?}"),
        }

        match member(&members, leader).handle.propose(topology(2)).await {
            Err(ProposeError::Stale { current_epoch }) => assert_eq!(current_epoch, 2),
            other => panic!("a stale proposal was answered {other:?}"),
        }
        assert_eq!(member(&members, leader).handle.watch().borrow().epoch, 2);

        for m in &members {
            m.stop().await;
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_new_leader_takes_over_when_the_leader_stops() {
        let members = cluster().await;
        let old = elected(&members.iter().collect::<Vec<_>>()).await;
        member(&members, old).handle.propose(topology(2)).await.unwrap();

        member(&members, old).stop().await;
        let rest: Vec<&Member> = members.iter().filter(|m| m.handle.me != old).collect();
        let new = elected(&rest).await;
        assert_ne!(new, old);

        member(&members, new).handle.propose(topology(3)).await.unwrap();
        for m in &rest {
            sees_epoch(m, 3).await;
        }

        for m in &rest {
            m.stop().await;
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_group_restarted_with_its_data_comes_back_at_the_latest_epoch() {
        let dirs: BTreeMap<NodeId, Scratch> = (1..=3).map(|id| (id, Scratch::new(&format!("group-{id}")))).collect();
        let dir = |id: NodeId| Some(dirs[&id].path());
        let (members, voters) = cluster_in(Some(&dirs)).await;
        let leader = elected(&members.iter().collect::<Vec<_>>()).await;
        member(&members, leader).handle.propose(topology(2)).await.unwrap();
        member(&members, leader).handle.propose(topology(3)).await.unwrap();
        for m in &members {
            sees_epoch(m, 3).await;
            m.stop().await;
        }

        // Every member starts again from the boot topology (epoch 1): only
        // its own log can bring epoch 3 back.
        let mut members = Vec::new();
        for (&id, addr) in &voters {
            members.push(start_member(id, rebind(addr).await, &voters, dir(id)).await);
        }
        for m in &members {
            sees_epoch(m, 3).await;
        }
        let leader = elected(&members.iter().collect::<Vec<_>>()).await;
        match member(&members, leader).handle.propose(topology(3)).await {
            Err(ProposeError::Stale { current_epoch }) => assert_eq!(current_epoch, 3),
            other => panic!("a stale proposal after the restart was answered {other:?}"),
        }
        member(&members, leader).handle.propose(topology(4)).await.unwrap();

        // The leader alone restarts: it comes back with its log and vote, as
        // the leader again if the others have not elected another one
        // meanwhile (openraft resumes a leader whose committed vote
        // survived), else as a follower.
        member(&members, leader).stop().await;
        let restarted = start_member(leader, rebind(&voters[&leader]).await, &voters, dir(leader)).await;
        let mut members: Vec<Member> = members.into_iter().filter(|m| m.handle.me != leader).collect();
        members.push(restarted);
        sees_epoch(member(&members, leader), 4).await;
        let now = elected(&members.iter().collect::<Vec<_>>()).await;

        // It is a working voter: with another member stopped, the group
        // needs it to commit.
        let other = members.iter().find(|m| m.handle.me != leader && m.handle.me != now).map_or(now, |m| m.handle.me);
        member(&members, other).stop().await;
        let rest: Vec<&Member> = members.iter().filter(|m| m.handle.me != other).collect();
        let now = elected(&rest).await;
        member(&members, now).handle.propose(topology(5)).await.unwrap();
        for m in &rest {
            sees_epoch(m, 5).await;
        }
        for m in &rest {
            m.stop().await;
        }
    }
}
