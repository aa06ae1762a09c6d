//! The site coordinator: the configuration replicated with Raft (`raft`),
//! failure detection and repair decisions (`causeway_core::supervisor`), and
//! pushing each new configuration to every node.
//!
//! It runs inside the first three nodes (`NodeConfig::coordinators`). Every
//! node sends each of them a heartbeat; the Raft leader's supervisor turns
//! silences, drains and additions into new topologies, commits them through
//! Raft and pushes them as `Reconfigure` to every node (again to any node
//! whose heartbeat shows an older epoch). Followers keep receiving
//! heartbeats, so a new leader judges liveness from fresh data.
//!
//! The member does not know the node it runs in: what it sends (each
//! committed configuration for this node, pushes for the others) goes
//! through the `Deliver` it is given (`spawn`), and the node hands it the
//! heartbeats it receives (`Coordinator::heartbeat`).

pub mod raft;

use crate::config::NodeConfig;
use crate::runtime::clock::mono_ms;
use causeway_core::message::{Dest, Envelope, Message, Outbox};
use causeway_core::node::Beat;
use causeway_core::ring::{NodeId, NodeInfo, Topology};
use causeway_core::supervisor::{NodeReport, Supervisor};
use parking_lot::Mutex;
use raft::RaftHandle;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How often the leader looks for repairs to make (and another member
/// keeps its supervisor's clock). On the grid of the node's idle tick, so
/// that at rest both share their wakeups.
const SUPERVISE: Duration = Duration::from_millis(causeway_core::node::HEARTBEAT_MS);

/// Where the member's messages go: to the node it runs in, which steps
/// those for itself and sends the others.
pub type Deliver = Arc<dyn Fn(Outbox) + Send + Sync>;

/// This node's coordinator member.
pub struct Coordinator {
    pub raft: Arc<RaftHandle>,
    supervisor: Mutex<Supervisor>,
    /// When (mono ms) the last confirmation of this member's leadership
    /// started (`confirm`); 0: never.
    confirmed_ms: AtomicU64,
}

impl Coordinator {
    /// A node's heartbeat; on the leader, the lease to send back to it.
    /// Only a leader whose leadership a quorum confirmed lately grants
    /// leases: one that was paused, or is cut off from the others, may still
    /// believe it leads while another has replaced it and removed the node
    /// (which would then serve reads it should not).
    pub fn heartbeat(&self, beat: Beat) -> Option<Message> {
        let current = self.raft.watch().borrow().clone();
        let mut s = self.supervisor.lock();
        let now = mono_ms();
        s.heartbeat(beat.clone(), now);
        let at = self.confirmed_ms.load(Ordering::Relaxed);
        let confirmed = at != 0 && now.saturating_sub(at) < raft::LEADERSHIP_VALID_MS;
        if self.raft.is_leader() && confirmed {
            s.lease(&beat, &current, self.raft.me(), mono_ms())
        } else {
            None
        }
    }

    /// What the heartbeats say about every node heard from.
    pub fn reports(&self, current: &Topology) -> Vec<NodeReport> {
        self.supervisor.lock().reports(current, mono_ms())
    }

    /// The leader's node id, if known.
    pub fn leader(&self) -> Option<NodeId> {
        self.raft.leader()
    }

    fn leader_only(&self) -> Result<(), String> {
        match self.raft.is_leader() {
            true => Ok(()),
            false => Err(format!(
                "this node is not the coordinator leader (leader: {})",
                self.leader().map_or("unknown".into(), |l| l.to_string())
            )),
        }
    }

    /// Adds a node to the site (it takes its partitions once it heartbeats).
    pub fn add(&self, info: NodeInfo) -> Result<(), String> {
        self.leader_only()?;
        self.supervisor.lock().add(info);
        Ok(())
    }

    /// Drains a node out of every chain.
    pub fn drain(&self, node: NodeId) -> Result<(), String> {
        self.leader_only()?;
        let current = self.raft.watch().borrow().clone();
        let mut s = self.supervisor.lock();
        if !s.knows(&current, node) {
            let ids: Vec<String> = current.nodes.iter().map(|n| n.id.to_string()).collect();
            return Err(format!("no node {node} in this site (its nodes: {})", ids.join(",")));
        }
        s.drain(node);
        Ok(())
    }

    pub async fn shutdown(&self) {
        self.raft.shutdown().await;
    }
}

/// The coordinator member of node `me`, starting from `topology`, if `me`
/// is a coordinator node (`None` if not). It does nothing until `spawn`.
pub async fn start(
    config: &NodeConfig,
    me: NodeId,
    topology: Topology,
    secret: Option<Arc<str>>,
) -> Result<Option<Arc<Coordinator>>, String> {
    let voters: BTreeMap<NodeId, String> =
        config.coordinators().into_iter().filter_map(|id| config.nodes.iter().find(|n| n.id == id).map(|n| (id, n.addr.clone()))).collect();
    if !voters.contains_key(&me) {
        return Ok(None);
    }
    let dir = config.data_dir.as_ref().map(|d| std::path::Path::new(d).join("raft"));
    let raft = RaftHandle::start(me, voters, topology, dir.as_deref(), secret).await?;
    let supervisor = Mutex::new(Supervisor::new(config.failure_timeout_ms, mono_ms()));
    Ok(Some(Arc::new(Coordinator { raft, supervisor, confirmed_ms: AtomicU64::new(0) })))
}

/// Runs the member `c` of node `me`: it applies every committed
/// configuration there and, while it leads, commits repairs and pushes
/// configurations, all through `deliver`.
pub fn spawn(c: &Arc<Coordinator>, me: NodeId, deliver: Deliver) {
    tokio::spawn(follow(me, c.clone(), deliver.clone()));
    tokio::spawn(confirm(c.clone()));
    tokio::spawn(supervise(me, c.clone(), deliver));
}

/// While this member leads: asks a quorum to confirm it once per
/// supervision period (well within `LEADERSHIP_VALID_MS`), so that its
/// leases stay valid (`heartbeat`).
async fn confirm(c: Arc<Coordinator>) {
    loop {
        crate::runtime::clock::next_on_grid(SUPERVISE).await;
        if c.raft.is_leader() {
            let started = mono_ms();
            if c.raft.confirm_leadership().await {
                c.confirmed_ms.fetch_max(started.max(1), Ordering::Relaxed);
            }
        }
    }
}

/// Applies every committed configuration on this node.
async fn follow(me: NodeId, c: Arc<Coordinator>, deliver: Deliver) {
    let mut watch = c.raft.watch();
    loop {
        let topology = (**watch.borrow_and_update()).clone();
        deliver(vec![Envelope { to: Dest::Node(me), msg: Message::Reconfigure { topology: Box::new(topology) } }]);
        if watch.changed().await.is_err() {
            return;
        }
    }
}

/// On every member: keep the supervisor's clock (a pause or a new
/// leadership starts a grace period). On the leader: commit repairs and
/// push configurations.
async fn supervise(me: NodeId, c: Arc<Coordinator>, deliver: Deliver) {
    let mut last_waiting = None;
    let mut led = false;
    loop {
        crate::runtime::clock::next_on_grid(SUPERVISE).await;
        let leader = c.raft.is_leader();
        if leader != led {
            match leader {
                true => {
                    tracing::info!("coordinator: node {} leads; it judges nodes after one failure timeout of fresh heartbeats", me)
                }
                false => tracing::debug!("coordinator: node {} no longer leads", me),
            }
            led = leader;
        }
        c.supervisor.lock().observe(mono_ms(), leader);
        if !leader {
            continue;
        }
        let current = c.raft.watch().borrow().clone();
        let (next, waiting) = {
            let mut s = c.supervisor.lock();
            let next = s.next(&current, mono_ms());
            (next, s.waiting().map(str::to_string))
        };
        if waiting != last_waiting {
            if let Some(w) = &waiting {
                tracing::warn!("coordinator: {w}");
            }
            last_waiting = waiting;
        }
        match next {
            Some(change) => {
                let started = std::time::Instant::now();
                match c.raft.propose(change.topology.clone()).await {
                    Ok(()) => {
                        tracing::info!(
                            "coordinator: epoch {}: {} (committed in {} ms)",
                            change.topology.epoch,
                            change.why,
                            started.elapsed().as_millis()
                        );
                        let everyone: Vec<NodeId> =
                            current.nodes.iter().chain(&change.topology.nodes).chain(&current.returning).map(|n| n.id).collect();
                        push(&deliver, &change.topology, everyone);
                    }
                    Err(e) => tracing::warn!("coordinator: could not commit epoch {} ({}): {e}", change.topology.epoch, change.why),
                }
            }
            None => {
                let lagging = c.supervisor.lock().lagging(current.epoch);
                push(&deliver, &current, lagging);
            }
        }
    }
}

fn push(deliver: &Deliver, topology: &Topology, to: Vec<NodeId>) {
    let out = to
        .into_iter()
        .map(|n| Envelope { to: Dest::Node(n), msg: Message::Reconfigure { topology: Box::new(topology.clone()) } })
        .collect();
    deliver(out);
}
