//! The coordinator's decisions, as a state machine: which configuration to
//! propose next, given the nodes' heartbeats and the current one.
//!
//! * A chain member silent for longer than the failure timeout is removed
//!   from every chain (minimal repair, ChainReaction §3.3.3): its successor
//!   takes over as head, its predecessor as tail, or its neighbours are
//!   bridged; writes continue while k members remain.
//! * Once nothing is silent, chains shorter than R grow back at the tail
//!   with live nodes (state transfer, then the new tail serves).
//! * An operator can drain a node (`drain`): it leaves every chain the same
//!   way, after the chains have been extended past it, so R is never lost.
//!
//! The Raft leader runs this; whatever it proposes is committed through
//! Raft and pushed to the nodes, which apply it as `Reconfigure`.

use crate::ring::{NodeId, NodeInfo, Topology};
use std::collections::{BTreeMap, BTreeSet};

/// A node's last heartbeat: when, and what it said.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Heard {
    at_ms: u64,
    epoch: u64,
    joining: u32,
}

/// One node as the heartbeats show it (for `CW.CLUSTER STATUS`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeReport {
    pub node: NodeId,
    pub alive: bool,
    pub silent_ms: u64,
    pub epoch: u64,
    /// Replicas still fetching their state: state transfers in flight.
    pub joining: u32,
}

/// Failure detection and repair planning.
#[derive(Debug)]
pub struct Supervisor {
    failure_timeout_ms: u64,
    /// Each node's last heartbeat.
    last_seen: BTreeMap<NodeId, Heard>,
    /// Nodes an operator asked to remove.
    draining: BTreeSet<NodeId>,
    /// Nodes an operator asked to add, not yet in the topology.
    joining: Vec<NodeInfo>,
    /// When this supervisor started (a leader gives every node one timeout
    /// of grace before judging it).
    started_ms: u64,
}

impl Supervisor {
    pub fn new(failure_timeout_ms: u64, now_ms: u64) -> Self {
        Supervisor { failure_timeout_ms, last_seen: BTreeMap::new(), draining: BTreeSet::new(), joining: Vec::new(), started_ms: now_ms }
    }

    /// `node` is alive, serving `epoch`, with `joining` replicas still
    /// fetching their state.
    pub fn heartbeat(&mut self, node: NodeId, epoch: u64, joining: u32, now_ms: u64) {
        self.last_seen.insert(node, Heard { at_ms: now_ms, epoch, joining });
    }

    /// Whether `node` has been heard from within the failure timeout.
    pub fn is_alive(&self, node: NodeId, now_ms: u64) -> bool {
        let since = self.last_seen.get(&node).map_or(self.started_ms, |h| h.at_ms);
        now_ms.saturating_sub(since) < self.failure_timeout_ms
    }

    /// Nodes whose last heartbeat reported an older epoch than `epoch` (they
    /// missed a push).
    pub fn lagging(&self, epoch: u64) -> Vec<NodeId> {
        self.last_seen.iter().filter(|(_, h)| h.epoch < epoch).map(|(&n, _)| n).collect()
    }

    /// Every node heard from, by id.
    pub fn reports(&self, now_ms: u64) -> Vec<NodeReport> {
        self.last_seen
            .iter()
            .map(|(&node, h)| NodeReport {
                node,
                alive: self.is_alive(node, now_ms),
                silent_ms: now_ms.saturating_sub(h.at_ms),
                epoch: h.epoch,
                joining: h.joining,
            })
            .collect()
    }

    /// An operator asks to remove `node` without losing replication.
    pub fn drain(&mut self, node: NodeId) {
        self.draining.insert(node);
    }

    /// An operator adds a node; it takes partitions once it heartbeats.
    pub fn add(&mut self, info: NodeInfo) {
        self.joining.retain(|n| n.id != info.id);
        self.joining.push(info);
    }

    /// The next configuration to propose, if any change is due. One change
    /// per step: the caller commits it, pushes it, and asks again.
    pub fn next(&mut self, current: &Topology, now_ms: u64) -> Option<Topology> {
        // 1. Failures first.
        if let Some(dead) = current.nodes.iter().map(|n| n.id).find(|&n| !self.is_alive(n, now_ms)) {
            return Some(current.without(dead));
        }
        // 2. Drained nodes leave like failed ones (the chains then grow back).
        self.draining.retain(|&n| current.node(n).is_some());
        if let Some(&n) = self.draining.iter().next() {
            return Some(current.without(n));
        }
        // 3. New nodes join once they are up.
        if let Some(pos) = self.joining.iter().position(|n| self.is_alive(n.id, now_ms) && current.node(n.id).is_none()) {
            let mut t = current.clone();
            t.nodes.push(self.joining.remove(pos));
            return Some(t.rebalanced());
        }
        // 4. Chains grow back to R, or move to their place on the ring.
        let placed = current.rebalanced();
        (placed.chains != current.chains).then_some(placed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::Shape;

    fn site(n: u16) -> Topology {
        let nodes = (0..n).map(|id| NodeInfo { id, addr: format!("n{id}") }).collect();
        Topology::new(1, Shape { partitions: 16, replicas: 3, k: 2 }, nodes).unwrap()
    }

    #[test]
    fn a_silent_node_is_removed_then_chains_grow_back() {
        let mut t = site(4);
        let mut s = Supervisor::new(1_000, 0);
        for n in 0..4 {
            s.heartbeat(n, 1, 0, 500);
        }
        assert_eq!(s.next(&t, 900), None);
        for n in [0, 1, 3] {
            s.heartbeat(n, 1, 0, 1_400);
        }
        let cut = s.next(&t, 1_600).expect("node 2 is silent");
        assert!(cut.node(2).is_none() && cut.chains.iter().all(|c| !c.nodes.contains(&2)));
        t = cut;
        let grown = s.next(&t, 1_600).expect("chains are short");
        assert!(grown.chains.iter().all(|c| c.len() == 3));
        assert_eq!(s.next(&grown, 1_600), None);
    }

    #[test]
    fn drain_and_add() {
        let t = site(3);
        let mut s = Supervisor::new(1_000, 0);
        for n in 0..4 {
            s.heartbeat(n, 1, 0, 100);
        }
        s.add(NodeInfo { id: 3, addr: "n3".into() });
        let added = s.next(&t, 200).unwrap();
        assert!(added.node(3).is_some() && added.chains.iter().any(|c| c.nodes.contains(&3)));
        s.drain(0);
        let drained = s.next(&added, 200).unwrap();
        assert!(drained.node(0).is_none());
        let healed = s.next(&drained, 200).unwrap();
        assert!(healed.chains.iter().all(|c| c.len() == 3 && !c.nodes.contains(&0)));
        assert_eq!(s.lagging(2), vec![0, 1, 2, 3]);
        s.heartbeat(3, 3, 5, 900);
        let reports = s.reports(1_500);
        assert_eq!(reports[3], NodeReport { node: 3, alive: true, silent_ms: 600, epoch: 3, joining: 5 });
        assert!(!reports[0].alive && reports[0].silent_ms == 1_400);
    }
}
