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

pub mod raft;

use crate::runtime::clock::mono_ms;
use crate::runtime::server::Node;
use causeway_core::message::{Dest, Envelope, Message};
use causeway_core::node::Beat;
use causeway_core::ring::{NodeId, NodeInfo, Topology};
use causeway_core::supervisor::{NodeReport, Supervisor};
use parking_lot::Mutex;
use raft::RaftHandle;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// How often the leader looks for repairs to make.
const SUPERVISE: Duration = Duration::from_millis(100);

/// This node's coordinator member.
pub struct Coordinator {
    pub raft: Arc<RaftHandle>,
    supervisor: Mutex<Supervisor>,
}

impl Coordinator {
    /// A node's heartbeat; on the leader, the lease to send back to it.
    pub fn heartbeat(&self, beat: Beat) -> Option<Message> {
        let current = self.raft.watch().borrow().clone();
        let mut s = self.supervisor.lock();
        s.heartbeat(beat.clone(), mono_ms());
        if self.raft.is_leader() {
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
        self.supervisor.lock().drain(node);
        Ok(())
    }

    pub async fn shutdown(&self) {
        self.raft.shutdown().await;
    }
}

/// Starts the coordinator member on `node` if it is a coordinator node.
pub async fn start(node: &Arc<Node>) -> Result<(), String> {
    let voters: BTreeMap<NodeId, String> = node
        .config
        .coordinators()
        .into_iter()
        .filter_map(|id| node.config.nodes.iter().find(|n| n.id == id).map(|n| (id, n.addr.clone())))
        .collect();
    if !voters.contains_key(&node.me) {
        return Ok(());
    }
    let dir = node.config.data_dir.as_ref().map(|d| std::path::Path::new(d).join("raft"));
    let raft = RaftHandle::start(node.me, voters, (*node.topology()).clone(), dir.as_deref(), node.secret()).await?;
    let coordinator = Arc::new(Coordinator { raft, supervisor: Mutex::new(Supervisor::new(node.config.failure_timeout_ms, mono_ms())) });
    let _ = node.coordinator.set(coordinator.clone());
    tokio::spawn(follow(node.clone(), coordinator.clone()));
    tokio::spawn(supervise(node.clone(), coordinator));
    Ok(())
}

/// Applies every committed configuration on this node.
async fn follow(node: Arc<Node>, c: Arc<Coordinator>) {
    let mut watch = c.raft.watch();
    loop {
        let topology = (**watch.borrow_and_update()).clone();
        node.route(vec![Envelope { to: Dest::Node(node.me), msg: Message::Reconfigure { topology } }], None);
        if watch.changed().await.is_err() {
            return;
        }
    }
}

/// On every member: keep the supervisor's clock (a pause or a new
/// leadership starts a grace period). On the leader: commit repairs and
/// push configurations.
async fn supervise(node: Arc<Node>, c: Arc<Coordinator>) {
    let mut interval = tokio::time::interval(SUPERVISE);
    let mut last_waiting = None;
    let mut led = false;
    loop {
        interval.tick().await;
        let leader = c.raft.is_leader();
        if leader != led {
            match leader {
                true => {
                    tracing::info!("coordinator: node {} leads; it judges nodes after one failure timeout of fresh heartbeats", node.me)
                }
                false => tracing::debug!("coordinator: node {} no longer leads", node.me),
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
                        push(&node, &change.topology, everyone);
                    }
                    Err(e) => tracing::warn!("coordinator: could not commit epoch {} ({}): {e}", change.topology.epoch, change.why),
                }
            }
            None => {
                let lagging = c.supervisor.lock().lagging(current.epoch);
                push(&node, &current, lagging);
            }
        }
    }
}

fn push(node: &Node, topology: &Topology, to: Vec<NodeId>) {
    let out = to.into_iter().map(|n| Envelope { to: Dest::Node(n), msg: Message::Reconfigure { topology: topology.clone() } }).collect();
    node.route(out, None);
}
