//! The coordinator's decisions, as a state machine: which configuration to
//! propose next, given the nodes' heartbeats and the current one. Time is
//! the caller's *monotonic* clock: a wall-clock jump never removes anyone.
//!
//! * A chain member silent for longer than the failure timeout is removed
//!   from every chain (minimal repair, ChainReaction §3.3.3): its successor
//!   takes over as head, its predecessor as tail, or its neighbours are
//!   bridged; writes continue while k members remain. It is remembered in
//!   `Topology::returning`.
//! * A supervisor acts only on heartbeats it received itself while it was
//!   running: a new leader, or one that notices it was paused (its own
//!   clock jumped), first waits one full failure timeout of fresh
//!   heartbeats before it removes anyone (`grace`).
//! * A restarted node (a new incarnation, see `node`) is admitted in a new
//!   epoch: in place, resuming from its log, when that log is whole (synced
//!   before every acknowledgement, no gap) and holds every chain it is in;
//!   otherwise it leaves its chains and returns through a state transfer
//!   like any failed node, unless no other live member holds those chains
//!   (a whole site restarted): then every member of such a chain is
//!   admitted in place and the chain is reordered by how much of the update
//!   order each one recovered, so the longest log is the head and the
//!   update invariant (each replica holds what its successors hold) holds
//!   again. A site's first start is that case with empty logs.
//! * A failed node that is alive again (a pause, a network blip, a restart)
//!   comes back once it has adopted the configuration that removed it (so
//!   it dropped its old replicas) and stayed alive through a hold-out that
//!   doubles with every failure in a row (flapping is damped).
//! * Once nothing else is due, chains shorter than R grow back at the tail
//!   with live nodes (state transfer, then the new tail serves).
//! * Then roles rebalance: a node that joined or returned took the tail of
//!   its chains; once every member of a chain holds the data, the chain
//!   moves one member up at a time towards its placed order
//!   (`Topology::toward_placed_order`: no node heads or ends more chains
//!   than it must), in the same change as the chains still being placed.
//!   A member that moves up catches up from its new successor before it
//!   serves (`ChainReplica::catch_up`). Members leave or move up only once
//!   every live member has reported the current configuration, so one
//!   change moves every chain that is ready, not the first few.
//! * An operator can drain a node (`drain`): it leaves every chain the same
//!   way, after the chains have been extended past it, so R is never lost;
//!   it does not come back by itself.
//!
//! The Raft leader runs this; whatever it proposes is committed through
//! Raft and pushed to the nodes, which apply it as `Reconfigure`.

use crate::message::{Beat, Message};
use crate::ring::{NodeId, NodeInfo, PartitionId, Topology};
use std::collections::{BTreeMap, BTreeSet};

/// How long a failed node must stay alive before it returns, after its
/// first failure in a row; it doubles with each further one.
pub const HOLD_OUT_MS: u64 = 1_000;
/// The longest a failed node is held out before it may return.
pub const MAX_HOLD_OUT_MS: u64 = 30_000;
/// The longest lease granted for linearizable reads.
pub const MAX_LEASE_MS: u64 = 1_000;
/// Failures further apart than this do not add up.
const STRIKE_MEMORY_MS: u64 = 60_000;

/// A node's last heartbeat: when, and what it said.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Heard {
    at_ms: u64,
    /// Since when it has been heard without a silence as long as the failure
    /// timeout.
    since_ms: u64,
    /// When this incarnation was first heard.
    incarnation_ms: u64,
    beat: Beat,
}

/// A node's recent failures, for damping.
#[derive(Clone, Copy, Debug, Default)]
struct Strikes {
    count: u32,
    last_ms: u64,
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
    /// Replicas that moved up their chain and are catching up from their
    /// successor (they serve nothing meanwhile).
    pub catching_up: u32,
    /// Failed and not back yet: how much longer it is held out (0 once it
    /// may return).
    pub held_out_ms: Option<u64>,
    /// Failures in a row.
    pub failures: u32,
}

/// What a restarted node does with one replica it recovered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    /// Resumes it in place.
    Keep,
    /// Leaves that chain (another copy is further); comes back to it, if
    /// placed there again, with a state transfer.
    Leave,
    /// Nobody else holds the partition: its log is needed (see `readmit`).
    Orphan,
}

/// A change the supervisor proposes, with why (for the operator's log).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub topology: Topology,
    pub why: String,
}

/// Failure detection and repair planning.
#[derive(Debug)]
pub struct Supervisor {
    failure_timeout_ms: u64,
    last_seen: BTreeMap<NodeId, Heard>,
    strikes: BTreeMap<NodeId, Strikes>,
    /// Nodes an operator asked to remove.
    draining: BTreeSet<NodeId>,
    /// Nodes an operator asked to add, not yet in the topology.
    joining: Vec<NodeInfo>,
    /// No removal for silence before this time (see `observe`).
    grace_until_ms: u64,
    /// When `observe` was last called, and whether this member led then.
    observed: Option<(u64, bool)>,
    /// Why a silent node is not being removed, if one is not.
    waiting: Option<String>,
    /// When this member last granted each node a lease (see `lease`).
    granted: BTreeMap<NodeId, u64>,
    /// Nodes granted no more leases: a change waits for theirs to run out.
    revoking: BTreeSet<NodeId>,
    /// A change decided but waiting for leases to run out.
    pending: Option<Change>,
}

impl Supervisor {
    pub fn new(failure_timeout_ms: u64, now_ms: u64) -> Self {
        Supervisor {
            failure_timeout_ms,
            last_seen: BTreeMap::new(),
            strikes: BTreeMap::new(),
            draining: BTreeSet::new(),
            joining: Vec::new(),
            grace_until_ms: now_ms + failure_timeout_ms,
            observed: None,
            waiting: None,
            granted: BTreeMap::new(),
            revoking: BTreeSet::new(),
            pending: None,
        }
    }

    /// Called regularly (every few hundred ms at most) by every coordinator
    /// member, saying whether it leads. A member that just became leader,
    /// or whose clock jumped by half a failure timeout since the last call
    /// (it was paused: what it heard before is stale), waits one failure
    /// timeout of fresh heartbeats before judging anyone.
    pub fn observe(&mut self, now_ms: u64, leader: bool) {
        let fresh_start = match self.observed {
            None => true,
            Some((at, led)) => (leader && !led) || now_ms.saturating_sub(at) > self.failure_timeout_ms / 2,
        };
        if fresh_start {
            self.grace_until_ms = self.grace_until_ms.max(now_ms + self.failure_timeout_ms);
            for h in self.last_seen.values_mut() {
                // Nothing heard before the pause counts as recent.
                h.since_ms = now_ms.max(h.since_ms);
            }
        }
        self.observed = Some((now_ms, leader));
    }

    /// Why a silent node is not being removed (for the operator's log).
    pub fn waiting(&self) -> Option<&str> {
        self.waiting.as_deref()
    }

    /// A node's heartbeat.
    pub fn heartbeat(&mut self, beat: Beat, now_ms: u64) {
        let last = self.last_seen.get(&beat.from);
        // Alive since: a new process (even one that restarted faster than
        // the failure timeout) starts over.
        let since_ms = match last {
            Some(h) if now_ms.saturating_sub(h.at_ms) < self.failure_timeout_ms && h.beat.incarnation == beat.incarnation => h.since_ms,
            _ => now_ms,
        };
        let incarnation_ms = last.filter(|h| h.beat.incarnation == beat.incarnation).map_or(now_ms, |h| h.incarnation_ms);
        if incarnation_ms == now_ms {
            // A new process: the old one, and its lease, are gone.
            self.granted.remove(&beat.from);
        }
        self.last_seen.insert(beat.from, Heard { at_ms: now_ms, since_ms, incarnation_ms, beat });
    }

    /// Whether `node` has been heard from within the failure timeout (every
    /// node is, during the grace period).
    pub fn is_alive(&self, node: NodeId, now_ms: u64) -> bool {
        now_ms < self.grace_until_ms || self.heard_recently(node, now_ms)
    }

    /// Whether `node` serves partition `p` with its data: a member of the
    /// chain, admitted, alive, and done fetching its state.
    fn holds(&self, current: &Topology, node: NodeId, p: PartitionId, now_ms: u64) -> bool {
        current.chain(p).index_of(node).is_some()
            && self.alive_beat(node, now_ms).is_some_and(|b| current.admits(node, b.incarnation) && !b.joining.contains(&p))
    }

    /// `holds`, as of the current configuration: the node's last heartbeat
    /// was sent at `current`'s epoch, so what it says it is still fetching
    /// is about its place in `current` (a heartbeat from before it got its
    /// place says it fetches nothing). Copies are only let go on this.
    fn holds_now(&self, current: &Topology, node: NodeId, p: PartitionId, now_ms: u64) -> bool {
        self.holds(current, node, p, now_ms)
            && self.last_seen.get(&node).is_some_and(|h| h.beat.epoch == current.epoch && h.beat.recovered.is_none())
    }

    /// `holds_now`, and not catching up after a move up its chain: it holds
    /// everything the members it passed held. Members leave or move only
    /// once all the others are settled this way.
    fn settled(&self, current: &Topology, node: NodeId, p: PartitionId, now_ms: u64) -> bool {
        self.holds_now(current, node, p, now_ms) && self.last_seen.get(&node).is_some_and(|h| !h.beat.catching_up.contains(&p))
    }

    /// What restarted node `n` (its heartbeat `beat`, back since
    /// `back_ms`) does with the replica of `p` it recovered. A recovered
    /// replica is a prefix of its partition's updates: whole if its log was
    /// synced before every acknowledgement and is not `incomplete` (a gap,
    /// or catching up when it stopped), else maybe missing some it had
    /// acknowledged or that the chain holds.
    fn verdict(&self, current: &Topology, n: NodeId, beat: &Beat, p: PartitionId, back_ms: u64, now_ms: u64) -> Verdict {
        let Some(recovered) = &beat.recovered else { return Verdict::Keep };
        let mine = beat.applied.get(&p).copied();
        // The furthest copy the chain's other live, admitted members hold.
        let best = current
            .chain(p)
            .nodes
            .iter()
            .filter(|&&m| m != n && self.holds(current, m, p, now_ms) && self.heard_since(m, back_ms))
            .map(|&m| self.applied(m, p))
            .max();
        // A head or a middle member catches up from its successor, which
        // holds all that is stable; a tail has none: others may have
        // declared stable, while it was down, writes it lacks (it was out
        // of the chain and put back at its tail before it restarted), and
        // nobody resends those.
        let tail = current.chain(p).tail() == n;
        match (recovered.whole, mine, best) {
            (true, Some(a), b) if !recovered.incomplete.contains(&p) && (!tail || b.is_none_or(|b| a >= b)) => Verdict::Keep,
            (_, _, None) => Verdict::Orphan,
            // Synced, and as far as every other copy: nothing the chain
            // holds is missing (it catches up from its successor anyway).
            (true, Some(a), Some(b)) if a >= b => Verdict::Keep,
            _ => Verdict::Leave,
        }
    }

    /// How far `node`'s replica of `p` had got at its last heartbeat (0 if
    /// it holds none).
    fn applied(&self, node: NodeId, p: PartitionId) -> u64 {
        self.last_seen.get(&node).and_then(|h| h.beat.applied.get(&p).copied()).unwrap_or(0)
    }

    /// Whether `node` was heard at or after `since_ms` (a heartbeat from
    /// before another node restarted says nothing of whether it survived
    /// the same outage).
    fn heard_since(&self, node: NodeId, since_ms: u64) -> bool {
        self.last_seen.get(&node).is_some_and(|h| h.at_ms >= since_ms)
    }

    /// Whether removing `node` would leave some chain it is in with nobody
    /// holding the data (the others are gone or still fetching it).
    fn sole_holder(&self, current: &Topology, node: NodeId, now_ms: u64) -> bool {
        if current.shape.coding.is_some() {
            // An erasure-coded site keeps its data in its groups, not in
            // its chains (`ec::site`): they outlive the loss of M nodes.
            return false;
        }
        (0..current.shape.partitions).any(|p| {
            let chain = current.chain(p);
            chain.index_of(node).is_some() && !chain.nodes.iter().any(|&m| m != node && self.holds_now(current, m, p, now_ms))
        })
    }

    /// `node`'s last heartbeat, if it is recent.
    fn alive_beat(&self, node: NodeId, now_ms: u64) -> Option<&Beat> {
        self.last_seen.get(&node).filter(|_| self.heard_recently(node, now_ms)).map(|h| &h.beat)
    }

    fn heard_recently(&self, node: NodeId, now_ms: u64) -> bool {
        self.last_seen.get(&node).is_some_and(|h| now_ms.saturating_sub(h.at_ms) < self.failure_timeout_ms)
    }

    /// Nodes whose last heartbeat reported an older epoch than `epoch` (they
    /// missed a push).
    pub fn lagging(&self, epoch: u64) -> Vec<NodeId> {
        self.last_seen.iter().filter(|(_, h)| h.beat.epoch < epoch).map(|(&n, _)| n).collect()
    }

    /// Every node heard from, by id.
    pub fn reports(&self, current: &Topology, now_ms: u64) -> Vec<NodeReport> {
        self.last_seen
            .iter()
            .map(|(&node, h)| NodeReport {
                node,
                alive: self.heard_recently(node, now_ms),
                silent_ms: now_ms.saturating_sub(h.at_ms),
                epoch: h.beat.epoch,
                joining: h.beat.joining.len() as u32,
                catching_up: h.beat.catching_up.len() as u32,
                held_out_ms: current.returning.iter().any(|n| n.id == node).then(|| self.held_out_ms(node, now_ms)),
                failures: self.strikes.get(&node).map_or(0, |s| s.count),
            })
            .collect()
    }

    /// How much longer failed `node` must stay alive before it returns: the
    /// hold-out counts from when it failed out or, if later, from when it
    /// was last seen coming back (a new process, or the end of a silence).
    fn held_out_ms(&self, node: NodeId, now_ms: u64) -> u64 {
        let Some(h) = self.last_seen.get(&node).filter(|_| self.heard_recently(node, now_ms)) else {
            return self.hold_out_ms(node);
        };
        let failed_ms = self.strikes.get(&node).map_or(0, |s| s.last_ms);
        (h.since_ms.max(failed_ms) + self.hold_out_ms(node)).saturating_sub(now_ms)
    }

    /// The hold-out after the node's failures in a row: `HOLD_OUT_MS`,
    /// doubling with each further failure, at most `MAX_HOLD_OUT_MS`.
    fn hold_out_ms(&self, node: NodeId) -> u64 {
        let count = self.strikes.get(&node).map_or(1, |s| s.count.max(1));
        (HOLD_OUT_MS << (count - 1).min(16)).min(MAX_HOLD_OUT_MS)
    }

    fn strike(&mut self, node: NodeId, now_ms: u64) {
        let s = self.strikes.entry(node).or_default();
        s.count = if s.count > 0 && now_ms.saturating_sub(s.last_ms) < STRIKE_MEMORY_MS { s.count + 1 } else { 1 };
        s.last_ms = now_ms;
    }

    /// An operator asks to remove `node` without losing replication (a
    /// node still waiting to be added is just not added).
    /// Whether `node` is in the site, failed and may return, or joins it:
    /// what an operator may drain.
    pub fn knows(&self, current: &Topology, node: NodeId) -> bool {
        current.nodes.iter().chain(&current.returning).chain(&self.joining).any(|n| n.id == node)
    }

    pub fn drain(&mut self, node: NodeId) {
        self.joining.retain(|n| n.id != node);
        self.draining.insert(node);
    }

    /// An operator adds a node; it takes partitions once it heartbeats.
    pub fn add(&mut self, info: NodeInfo) {
        self.joining.retain(|n| n.id != info.id);
        self.joining.push(info);
    }

    /// How long a lease lasts: half the failure timeout (so the lease of a
    /// node that falls silent has run out well before it is removed), at
    /// most `MAX_LEASE_MS` (heartbeats renew it five times a second; a
    /// change that takes a tail's role waits this long).
    pub fn lease_ms(&self) -> u64 {
        (self.failure_timeout_ms / 2).min(MAX_LEASE_MS)
    }

    /// The leader's answer to `beat` (the leader is member `me`): a lease
    /// for linearizable reads, to a node admitted in `current` and serving
    /// it, unless a change waits for that node's lease to run out. The node
    /// counts it from when it sent the heartbeat, so it ends before
    /// `now_ms + lease_ms` here.
    pub fn lease(&mut self, beat: &Beat, current: &Topology, me: NodeId, now_ms: u64) -> Option<Message> {
        if beat.epoch != current.epoch || !current.admits(beat.from, beat.incarnation) || self.revoking.contains(&beat.from) {
            return None;
        }
        self.granted.insert(beat.from, now_ms);
        Some(Message::Lease { epoch: current.epoch, sent_ms: beat.sent_ms, grant_ms: self.lease_ms(), from: me })
    }

    /// The next configuration to propose, if any change is due. One change
    /// per step: the caller commits it, pushes it, and asks again. A change
    /// that takes the tail role from a node (removal, drain, a newcomer
    /// placed after it) waits until that node's lease has run out, and no
    /// new lease is granted to it meanwhile: until then it may still serve
    /// linearizable reads without knowing of the change.
    pub fn next(&mut self, current: &Topology, now_ms: u64) -> Option<Change> {
        let change = match self.pending.take() {
            Some(c) if c.topology.epoch == current.epoch + 1 => c,
            _ => self.decide(current, now_ms)?,
        };
        // A lease ends by grant + lease_ms in real time; an eighth more
        // covers clocks that run at slightly different rates.
        let until = |g: u64| g + self.lease_ms() + self.lease_ms() / 8;
        let losing: BTreeSet<NodeId> = (0..current.shape.partitions)
            .filter(|&p| change.topology.chain(p).nodes.last() != current.chain(p).nodes.last())
            .filter_map(|p| current.chain(p).nodes.last().copied())
            .collect();
        let holders: Vec<String> =
            losing.iter().filter(|t| self.granted.get(t).is_some_and(|&g| now_ms < until(g))).map(|n| n.to_string()).collect();
        if !holders.is_empty() {
            self.waiting = Some(format!("waiting out the lease of node {} before: {}", holders.join(","), change.why));
            self.revoking = losing;
            self.pending = Some(change);
            return None;
        }
        self.revoking.clear();
        Some(change)
    }

    fn decide(&mut self, current: &Topology, now_ms: u64) -> Option<Change> {
        // 1. Failures first; never the last member of a chain that holds its
        // data (the partition would be gone: it waits for the node instead),
        // and nobody while most nodes are silent (this member may be the
        // one cut off; a site-wide outage is waited out).
        let heard = current.nodes.iter().filter(|n| self.heard_recently(n.id, now_ms)).count();
        let silent: Vec<NodeId> = current.nodes.iter().map(|n| n.id).filter(|&n| !self.is_alive(n, now_ms)).collect();
        let dead = match 2 * heard >= current.nodes.len() {
            true => silent.iter().copied().find(|&n| !self.sole_holder(current, n, now_ms)),
            false => None,
        };
        self.waiting = match (silent.first(), dead) {
            (Some(n), None) if 2 * heard < current.nodes.len() => {
                Some(format!("node {n} and others silent, but most nodes are: not removing anyone (this member may be the one cut off)"))
            }
            (Some(n), None) => Some(format!("node {n} is silent but holds the only copy of some partition: waiting for it")),
            _ => None,
        };
        if let Some(dead) = dead {
            self.strike(dead, now_ms);
            let why = format!("node {dead} silent for {} ms: removed from its chains", self.failure_timeout_ms);
            return Some(Change { topology: current.failed(dead), why });
        }
        // 2. Restarted nodes rejoin.
        if let Some(change) = self.readmit(current, now_ms) {
            return Some(change);
        }
        // 3. New nodes join, failed nodes return, once they are up (first,
        // so a node that replaces a drained one can take its place).
        if let Some(change) = self.admit_new(current, now_ms) {
            return Some(change);
        }
        // 4. Drained nodes leave, once their chains no longer need them.
        self.draining.retain(|&n| current.node(n).is_some() || current.returning.iter().any(|r| r.id == n));
        if let Some(&n) = self.draining.iter().next() {
            return self.drain_step(current, n, now_ms);
        }
        // 5. Chains grow back to R, or move to their place on the ring;
        // 6. in the same change, the chains that have their members already
        // and all of them hold the data move one step nearer their placed
        // order (balanced roles). Each chain makes at most one of these
        // moves per change, so a chain waits for no other.
        let mut next = self.placed(current, current, now_ms);
        let placed = next.chains.iter().zip(&current.chains).filter(|(a, b)| a != b).count();
        let reordered = self.rebalance_roles(&mut next, current, now_ms);
        let why = match (placed, reordered) {
            (0, 0) => return None,
            (_, 0) => format!("{placed} chains placed on the ring"),
            (0, _) => format!("{reordered} chains reordered towards their placed order (balanced roles)"),
            (_, _) => format!("{placed} chains placed on the ring, {reordered} reordered towards their placed order (balanced roles)"),
        };
        Some(Change { topology: next, why })
    }

    /// Whether every admitted member heard lately has sent a heartbeat at
    /// `current`'s epoch. Members leave or move up a chain only then
    /// (`placed`, `rebalance_roles`): a member is `settled` only by such a
    /// heartbeat, so a change made on the first few would move the few
    /// chains whose members all had sent one, and send every other chain
    /// back to waiting for the next ones: a cascade of changes of a chain
    /// or two, each waiting out a lease, that took seconds to balance roles
    /// after a heal.
    fn all_reported(&self, current: &Topology, now_ms: u64) -> bool {
        current
            .nodes
            .iter()
            .all(|n| self.alive_beat(n.id, now_ms).is_none_or(|b| !current.admits(n.id, b.incarnation) || b.epoch == current.epoch))
    }

    /// Moves each chain of `next` that is as in `current`, with every
    /// member holding the data, one step nearer its placed order
    /// (`Topology::toward_placed_order`); returns how many moved.
    fn rebalance_roles(&self, next: &mut Topology, current: &Topology, now_ms: u64) -> usize {
        let mut moved = 0;
        if !self.all_reported(current, now_ms) {
            return 0;
        }
        for p in 0..current.shape.partitions {
            let chain = &current.chain(p).nodes;
            if &next.chain(p).nodes != chain || !chain.iter().all(|&n| self.settled(current, n, p, now_ms)) {
                continue;
            }
            if let Some(order) = current.toward_placed_order(p) {
                next.chains[p as usize].nodes = order;
                moved += 1;
            }
        }
        moved
    }

    /// A node of `current` heard with an incarnation it does not admit: see
    /// the module doc for how it rejoins.
    fn readmit(&mut self, current: &Topology, now_ms: u64) -> Option<Change> {
        let restarted: Vec<(NodeId, Beat)> = current
            .nodes
            .iter()
            .filter_map(|n| Some((n.id, self.alive_beat(n.id, now_ms)?.clone())))
            .filter(|(n, beat)| !current.admits(*n, beat.incarnation))
            .collect();
        for (n, beat) in &restarted {
            if beat.recovered.is_none() {
                continue;
            }
            let mine: Vec<PartitionId> = (0..current.shape.partitions).filter(|&p| current.chain(p).index_of(*n).is_some()).collect();
            let back_ms = self.last_seen.get(n).map_or(now_ms, |h| h.incarnation_ms);
            let verdict = |p: PartitionId| self.verdict(current, *n, beat, p, back_ms, now_ms);
            let orphans: Vec<PartitionId> = mine.iter().copied().filter(|&p| verdict(p) == Verdict::Orphan).collect();
            if orphans.is_empty() {
                let leave: Vec<PartitionId> = mine.iter().copied().filter(|&p| verdict(p) == Verdict::Leave).collect();
                if !mine.is_empty() && leave.len() == mine.len() {
                    self.strike(*n, now_ms);
                    let why = format!("node {n} restarted without a whole log: leaves its chains, returns with a state transfer");
                    return Some(Change { topology: current.failed(*n), why });
                }
                let mut t = current.clone();
                t.epoch += 1;
                t.admitted.insert(*n, beat.incarnation);
                for &p in &leave {
                    t.chains[p as usize].nodes.retain(|m| m != n);
                }
                let why = match leave.len() {
                    0 => format!("node {n} restarted with a whole log: resumes in place"),
                    k => format!("node {n} restarted: resumes in place, leaves {k} chains where another copy is further"),
                };
                return Some(Change { topology: t, why });
            }
            // Every member of those chains must have been heard since n came
            // back (the restarted ones say what they recovered); only one
            // that stays silent past the failure timeout (or the grace
            // period) is given up on.
            let members: BTreeSet<NodeId> = orphans.iter().flat_map(|&p| current.chain(p).nodes.clone()).collect();
            let unknown = |m: NodeId| !self.heard_since(m, back_ms) && (self.heard_recently(m, now_ms) || now_ms < self.grace_until_ms);
            if members.iter().any(|&m| unknown(m)) {
                continue;
            }
            let mut t = current.clone();
            t.epoch += 1;
            for (m, b) in restarted.iter().filter(|(m, _)| members.contains(m)) {
                t.admitted.insert(*m, b.incarnation);
                // Its other chains, where another copy is further than its
                // own, go on without it (it would serve a shorter prefix).
                let back_ms = self.last_seen.get(m).map_or(now_ms, |h| h.incarnation_ms);
                for p in (0..current.shape.partitions).filter(|p| !orphans.contains(p)) {
                    if current.chain(p).index_of(*m).is_some() && self.verdict(current, *m, b, p, back_ms, now_ms) == Verdict::Leave {
                        t.chains[p as usize].nodes.retain(|x| x != m);
                    }
                }
            }
            for &p in &orphans {
                let applied = |m: &NodeId| self.last_seen.get(m).and_then(|h| h.beat.applied.get(&p).copied());
                // Longest log first; members with no replica last (they fetch
                // the state from the ones before them). Stable: ties keep order.
                t.chains[p as usize].nodes.sort_by_key(|m| std::cmp::Reverse(applied(m).map_or(0, |a| a + 1)));
            }
            let who: Vec<String> = members.iter().map(|m| m.to_string()).collect();
            let new_site = restarted.iter().all(|(_, b)| b.applied.is_empty());
            let why = match new_site {
                true => format!("nodes {} admitted: a new site", who.join(",")),
                false => format!("nodes {} admitted with what they recovered ({} chains had no other copy)", who.join(","), orphans.len()),
            };
            return Some(Change { topology: t, why });
        }
        None
    }

    /// `t` (the current configuration, maybe with nodes added) with every
    /// chain moved towards its place on the ring (`Topology::rebalanced`),
    /// safely: members it should gain join at the tail at once if alive
    /// (they fetch the state), but a member it should lose leaves only once
    /// every member of its new chain holds the data (`settled`, and every
    /// member has reported this configuration: `all_reported`), so a chain
    /// is never left with nobody but replicas still fetching. Meanwhile it
    /// is one longer.
    ///
    /// A head that should leave first hands its role over: the first member
    /// that stays moves up to the head and catches up from it (a head may
    /// have writes its successor has not received yet; dropped at once, a
    /// live head would lose them, and reads may have seen them). Then every
    /// member that should leave moves to the tail, the others moving up and
    /// catching up from it, and leaves from there: a tail's predecessor
    /// holds all it holds. (A middle member dropped at once would leave its
    /// updates to its predecessor alone, and a write acknowledged by the
    /// two of them was lost when that predecessor crashed in the same
    /// moment: campaign seed 1552.)
    fn placed(&self, t: &Topology, current: &Topology, now_ms: u64) -> Topology {
        let ideal = t.rebalanced();
        if t.shape.coding.is_some() {
            // A coded site's chains only say where requests go (the data
            // is in its groups): they move at once, nothing to transfer.
            return ideal;
        }
        let mut next = ideal.clone();
        let reported = self.all_reported(current, now_ms);
        for (p, chain) in next.chains.iter_mut().enumerate() {
            let p = p as PartitionId;
            let before = &current.chain(p).nodes;
            let ready = reported && chain.nodes.iter().all(|&n| before.contains(&n) && self.settled(current, n, p, now_ms));
            let stays = |n: &NodeId| chain.nodes.contains(n);
            if let (true, Some(&head), Some(heir)) = (ready, before.first(), before.iter().position(stays)) {
                if !stays(&head) {
                    let mut nodes = before.clone();
                    let heir = nodes.remove(heir);
                    nodes.insert(0, heir);
                    chain.nodes = nodes;
                    continue;
                }
            }
            if ready {
                let (mut nodes, leaving): (Vec<NodeId>, Vec<NodeId>) = before.iter().partition(|n| stays(n));
                nodes.extend(leaving);
                if &nodes != before {
                    chain.nodes = nodes;
                    continue;
                }
            }
            let mut nodes: Vec<NodeId> = before.iter().copied().filter(|n| stays(n) || !ready).collect();
            // A node not heard lately would be a tail that never fetches:
            // it joins once alive, or leaves the ring when found dead.
            let alive = |n: &NodeId| self.alive_beat(*n, now_ms).is_some_and(|b| t.admits(*n, b.incarnation));
            nodes.extend(chain.nodes.iter().copied().filter(|n| !before.contains(n) && alive(n)));
            chain.nodes = nodes;
        }
        next
    }

    /// One step of draining `n`: its chains are extended past it (the new
    /// members join at the tail and fetch the state) and it leaves each
    /// chain only once every other member holds the data, so a chain never
    /// loses its last holder, even when the drain comes while the chain is
    /// still being formed. `None` while waiting for those transfers
    /// (nothing else is decided meanwhile: the ring still counts `n`).
    fn drain_step(&mut self, current: &Topology, n: NodeId, now_ms: u64) -> Option<Change> {
        let mut without = current.clone();
        without.nodes.retain(|x| x.id != n);
        without.returning.retain(|r| r.id != n);
        without.admitted.remove(&n);
        let mut t = self.placed(&without, current, now_ms);
        if !t.chains.iter().any(|c| c.nodes.contains(&n)) {
            return Some(Change { topology: t, why: format!("node {n} drained") });
        }
        if t.chains == current.chains {
            self.waiting = Some(format!("draining node {n}: waiting for its chains' other members to hold the data"));
            return None;
        }
        t.nodes = current.nodes.clone();
        t.admitted = current.admitted.clone();
        let left = t.chains.iter().filter(|c| c.nodes.contains(&n)).count();
        Some(Change {
            topology: t,
            why: format!("draining node {n}: {left} chains still have it (extended past it, or it handed over their head)"),
        })
    }

    /// Operator-added nodes and failed nodes that are back, once alive.
    fn admit_new(&mut self, current: &Topology, now_ms: u64) -> Option<Change> {
        if let Some(pos) = self.joining.iter().position(|n| self.alive_beat(n.id, now_ms).is_some() && current.node(n.id).is_none()) {
            let info = self.joining.remove(pos);
            let beat = self.alive_beat(info.id, now_ms).expect("checked alive").clone();
            let mut t = current.clone();
            t.returning.retain(|r| r.id != info.id);
            t.admitted.insert(info.id, beat.incarnation);
            let why = format!("node {} added", info.id);
            t.nodes.push(info);
            return Some(Change { topology: self.placed(&t, current, now_ms), why });
        }
        for r in &current.returning {
            // Back only once it has dropped its old replicas (it holds the
            // configuration that removed it) and stayed up through its
            // hold-out.
            let Some(beat) = self.alive_beat(r.id, now_ms) else { continue };
            if beat.epoch < current.epoch || self.held_out_ms(r.id, now_ms) > 0 {
                continue;
            }
            let mut t = current.clone();
            t.returning.retain(|x| x.id != r.id);
            t.admitted.insert(r.id, beat.incarnation);
            t.nodes.push(NodeInfo { id: r.id, addr: beat.addr.clone() });
            let why = format!("node {} is back (after {} failure(s) in a row)", r.id, self.strikes.get(&r.id).map_or(0, |s| s.count));
            return Some(Change { topology: self.placed(&t, current, now_ms), why });
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Recovered;
    use crate::ring::Shape;

    fn site(n: u16) -> Topology {
        let nodes = (0..n).map(|id| NodeInfo { id, addr: format!("n{id}") }).collect();
        let mut t = Topology::new(1, Shape { partitions: 16, replicas: 3, k: 2, coding: None }, nodes).unwrap();
        t.admitted = (0..n).map(|id| (id, 100 + id as u64)).collect();
        t
    }

    fn beat(t: &Topology, n: NodeId, epoch: u64) -> Beat {
        Beat {
            from: n,
            addr: format!("n{n}"),
            incarnation: 100 + n as u64,
            epoch,
            sent_ms: 0,
            joining: Vec::new(),
            catching_up: Vec::new(),
            applied: BTreeMap::new(),
            recovered: None,
        }
        .with_admission(t)
    }

    trait WithAdmission {
        fn with_admission(self, t: &Topology) -> Self;
    }
    impl WithAdmission for Beat {
        fn with_admission(mut self, t: &Topology) -> Self {
            if !t.admits(self.from, self.incarnation) {
                self.recovered = Some(Recovered { whole: false, incomplete: Vec::new() });
            }
            self
        }
    }

    fn all_beat(s: &mut Supervisor, t: &Topology, nodes: &[NodeId], at: u64) {
        for &n in nodes {
            s.heartbeat(beat(t, n, t.epoch), at);
        }
    }

    #[test]
    fn a_silent_node_is_removed_then_chains_grow_back() {
        let mut t = site(4);
        let mut s = Supervisor::new(1_000, 0);
        all_beat(&mut s, &t, &[0, 1, 2, 3], 500);
        assert_eq!(s.next(&t, 900), None);
        all_beat(&mut s, &t, &[0, 1, 3], 1_400);
        let cut = s.next(&t, 1_600).expect("node 2 is silent").topology;
        assert!(cut.node(2).is_none() && cut.chains.iter().all(|c| !c.nodes.contains(&2)));
        assert_eq!(cut.returning.iter().map(|n| n.id).collect::<Vec<_>>(), vec![2]);
        t = cut;
        let grown = s.next(&t, 1_600).expect("chains are short").topology;
        assert!(grown.chains.iter().all(|c| c.len() == 3));
        assert_eq!(s.next(&grown, 1_600), None);
    }

    /// Nodes 0 and 1 came back at the tail of their chains. A change made
    /// as soon as the chains without node 1 had every member settled would
    /// move those only, and send every other chain back to waiting for
    /// heartbeats at the new epoch (seconds of one-chain changes after a
    /// heal): nothing moves until node 1 has reported the configuration
    /// too, then every chain out of its placed order moves in one change.
    #[test]
    fn roles_move_once_every_member_has_reported_and_all_in_one_change() {
        let placed = site(6);
        let mut t = placed.clone();
        for c in &mut t.chains {
            for n in [1, 0] {
                if let Some(i) = c.index_of(n) {
                    c.nodes.remove(i);
                    c.nodes.push(n);
                }
            }
        }
        let out_of_order: Vec<PartitionId> = (0..16).filter(|&p| t.toward_placed_order(p).is_some()).collect();
        let without_1 = out_of_order.iter().filter(|&&p| t.chain(p).index_of(1).is_none()).count();
        assert!(without_1 > 0 && without_1 < out_of_order.len());
        let mut s = Supervisor::new(1_000, 0);
        all_beat(&mut s, &t, &[0, 2, 3, 4, 5], 1_500);
        s.heartbeat(beat(&t, 1, t.epoch - 1), 1_500);
        assert_eq!(s.next(&t, 1_500), None, "node 1 has not reported epoch {}", t.epoch);
        all_beat(&mut s, &t, &[1], 1_600);
        let moved = s.next(&t, 1_600).expect("every member reported").topology;
        for p in 0..16 {
            let want = t.toward_placed_order(p).unwrap_or_else(|| t.chain(p).nodes.clone());
            assert_eq!(moved.chain(p).nodes, want, "p{p}: one step nearer its placed order");
        }
        let steps = settle(&mut s, &moved, &[0, 1, 2, 3, 4, 5], 1_700);
        assert_eq!(steps.last().unwrap().chains, placed.chains);
    }

    /// Runs the supervisor from `t` with every node of `nodes` beating,
    /// holding and caught up after each change, until it has nothing left
    /// to do; returns every configuration it went through.
    fn settle(s: &mut Supervisor, t: &Topology, nodes: &[NodeId], at: u64) -> Vec<Topology> {
        let mut steps = vec![t.clone()];
        all_beat(s, t, nodes, at);
        while let Some(change) = s.next(steps.last().unwrap(), at) {
            all_beat(s, &change.topology, nodes, at);
            steps.push(change.topology);
        }
        steps
    }

    /// What a drain must keep true at each step: a chain keeps every member
    /// that stays, its head leaves only after handing the role over (it is
    /// no longer the head one step before it leaves), and the node stays a
    /// member while any chain has it.
    fn assert_drained_safely(steps: &[Topology], n: NodeId) {
        for pair in steps.windows(2) {
            let (a, b) = (&pair[0], &pair[1]);
            for p in 0..a.shape.partitions {
                let (before, after) = (&a.chain(p).nodes, &b.chain(p).nodes);
                if before.first() == Some(&n) {
                    assert!(after.contains(&n), "p{p}: the head {n} left without handing over: {before:?} -> {after:?}");
                }
                if before.contains(&n) && !after.contains(&n) {
                    assert_eq!(before.last(), Some(&n), "p{p}: {n} left from the middle: {before:?} -> {after:?}");
                }
            }
            assert!(b.node(n).is_some() || b.chains.iter().all(|c| !c.nodes.contains(&n)));
        }
        let last = steps.last().unwrap();
        assert!(last.node(n).is_none() && last.returning.is_empty(), "a drained node does not come back");
        assert!(last.chains.iter().all(|c| c.len() == 3 && !c.nodes.contains(&n)));
    }

    #[test]
    fn drain_and_add() {
        let t = site(3);
        let mut s = Supervisor::new(1_000, 0);
        all_beat(&mut s, &t, &[0, 1, 2, 3], 100);
        s.add(NodeInfo { id: 3, addr: "n3".into() });
        let added = s.next(&t, 200).unwrap().topology;
        assert!(added.node(3).is_some() && added.chains.iter().any(|c| c.nodes.contains(&3)));
        assert!(added.admits(3, 103));
        let added = settle(&mut s, &added, &[0, 1, 2, 3], 300).pop().unwrap();
        assert!(added.chains.iter().all(|c| c.len() == 3));
        s.drain(0);
        let extended = s.next(&added, 300).unwrap().topology;
        assert!(extended.node(0).is_some(), "node 0 stays a member while its chains need it");
        for (p, c) in extended.chains.iter().enumerate() {
            let before = &added.chains[p].nodes;
            match before.contains(&0) {
                true => assert!(c.len() == 4 && c.nodes.starts_with(before), "extended at the tail: {c:?}"),
                false => assert_eq!(&c.nodes, before),
            }
        }
        assert_eq!(s.next(&extended, 300), None, "waiting for the new tails to hold the data");
        let steps = settle(&mut s, &extended, &[0, 1, 2, 3], 400);
        assert_drained_safely(&steps, 0);
        let drained = steps.last().unwrap();
        assert_eq!(s.lagging(drained.epoch + 1), vec![0, 1, 2, 3]);
        let reports = s.reports(drained, 1_500);
        assert_eq!(reports[3].silent_ms, 1_100);
        assert!(!reports[0].alive);
    }

    /// Found by `cli/tests/coordinator.rs` on a loaded machine: a node
    /// drained right after the site was born left chains whose other
    /// members were still fetching their (empty) state from it, so nobody
    /// held those partitions and their transfers never ended.
    #[test]
    fn a_drain_waits_for_the_other_members_to_hold_the_data() {
        let t = site(4);
        let mut s = Supervisor::new(1_000, 0);
        let fetching = |n: NodeId| (0..16).filter(|&p| t.chain(p).index_of(n).is_some_and(|i| i > 0)).collect::<Vec<_>>();
        for n in 0..4 {
            s.heartbeat(Beat { joining: fetching(n), ..beat(&t, n, t.epoch) }, 100);
        }
        s.drain(0);
        let extended = s.next(&t, 100).unwrap().topology;
        for (p, c) in extended.chains.iter().enumerate() {
            assert!(t.chains[p].nodes.iter().all(|n| c.nodes.contains(n)), "nobody leaves a chain still forming: {c:?}");
        }
        let mut steps = vec![t.clone()];
        steps.extend(settle(&mut s, &extended, &[0, 1, 2, 3], 200));
        assert_drained_safely(&steps, 0);
    }

    /// A member that moved up and is still catching up holds the data but
    /// maybe not all of it: no member leaves its chain meanwhile.
    #[test]
    fn nobody_leaves_a_chain_while_a_member_catches_up() {
        let t = site(4);
        let mut s = Supervisor::new(1_000, 0);
        let heads: Vec<PartitionId> = (0..16).filter(|&p| t.chain(p).head() == 0).collect();
        s.drain(0);
        // Every heir of node 0's head roles stays catching up: the drain
        // stalls after the hand-over.
        let mut t2 = t.clone();
        let mut at = 100;
        loop {
            let heirs: Vec<(NodeId, PartitionId)> = heads.iter().map(|&p| (t2.chain(p).head(), p)).filter(|&(h, _)| h != 0).collect();
            for n in 0..4 {
                let catching_up = heirs.iter().filter(|&&(h, _)| h == n).map(|&(_, p)| p).collect();
                s.heartbeat(Beat { catching_up, ..beat(&t2, n, t2.epoch) }, at);
            }
            match s.next(&t2, at) {
                Some(change) => t2 = change.topology,
                None => break,
            }
            at += 10;
        }
        for &p in &heads {
            assert!(t2.chain(p).nodes.contains(&0), "p{p}: node 0 left while its heir was catching up: {:?}", t2.chain(p));
        }
    }

    /// The stale-leader bug: a leader paused past the failure timeout
    /// resumed with heartbeats from before the pause and removed a healthy
    /// node at once.
    #[test]
    fn a_paused_leader_waits_for_fresh_heartbeats_before_removing_anyone() {
        let t = site(4);
        let mut s = Supervisor::new(1_000, 0);
        s.observe(0, true);
        for at in (100..3_000).step_by(100) {
            all_beat(&mut s, &t, &[0, 1, 2, 3], at);
            s.observe(at, true);
        }
        assert_eq!(s.next(&t, 3_000), None);
        // Paused for 3 s: the last heartbeats it holds are 3 s old.
        s.observe(6_000, true);
        assert_eq!(s.next(&t, 6_000), None, "nothing is judged on stale heartbeats");
        // Fresh heartbeats from everyone but node 3.
        for at in (6_100..7_200).step_by(100) {
            all_beat(&mut s, &t, &[0, 1, 2], at);
            s.observe(at, true);
            if at < 7_000 {
                assert_eq!(s.next(&t, at), None, "grace: a full timeout of fresh heartbeats first");
            }
        }
        let cut = s.next(&t, 7_100).expect("node 3 is silent to this leader too").topology;
        assert!(cut.node(3).is_none());
        // A new leader waits the same way.
        let mut fresh = Supervisor::new(1_000, 10_000);
        fresh.observe(10_000, true);
        assert_eq!(fresh.next(&t, 10_500), None);
    }

    #[test]
    fn a_failed_node_that_is_alive_again_returns_after_a_growing_hold_out() {
        let t = site(4);
        let mut s = Supervisor::new(1_000, 0);
        all_beat(&mut s, &t, &[0, 1, 2, 3], 0);
        all_beat(&mut s, &t, &[0, 1, 2], 1_500);
        let cut = s.next(&t, 1_500).unwrap().topology;
        // The chains grow back (and their roles rebalance over three nodes).
        let grown = s.next(&cut, 1_500).unwrap().topology;
        // Node 3 resumes, still at the old epoch: not back until it has
        // adopted the configuration that removed it.
        s.heartbeat(beat(&grown, 3, 1), 1_600);
        let mut t = settle(&mut s, &grown, &[0, 1, 2], 1_600).pop().unwrap();
        assert!(t.node(3).is_none());
        let mut at = 1_600;
        let back_at = loop {
            at += 100;
            all_beat(&mut s, &t, &[0, 1, 2], at);
            s.heartbeat(Beat { epoch: t.epoch, ..beat(&t, 3, t.epoch) }, at);
            if let Some(c) = s.next(&t, at) {
                break (c, at);
            }
            assert!(at < 10_000);
        };
        assert_eq!(back_at.1, 1_600 + 1_000, "back after one failure timeout alive");
        t = back_at.0.topology;
        assert!(t.node(3).is_some() && t.returning.is_empty() && t.admits(3, 103));
        // It joins the chains it takes at the tail; the members it replaces
        // leave only once it holds the data (here: its next heartbeat).
        assert!(t.chains.iter().all(|c| c.len() >= 3) && t.chains.iter().any(|c| c.len() == 4));
        // A replaced member in the middle first moves to the tail (the
        // members after it catch up from it), then leaves.
        all_beat(&mut s, &t, &[0, 1, 2, 3], at);
        t = s.next(&t, at).expect("the replaced members move to the tail, or leave from there").topology;
        all_beat(&mut s, &t, &[0, 1, 2, 3], at);
        t = s.next(&t, at).expect("the replaced members leave").topology;
        assert!(t.chains.iter().all(|c| c.len() == 3), "{:?}", t.chains);
        // It fails again at once: the next hold-out is twice as long.
        let later = at + 5_000;
        all_beat(&mut s, &t, &[0, 1, 2], later);
        let cut = s.next(&t, later).unwrap().topology;
        assert!(cut.node(3).is_none());
        let reports = s.reports(&cut, later);
        assert_eq!(reports[3].failures, 2);
        assert_eq!(reports[3].held_out_ms, Some(2_000));
    }

    #[test]
    fn a_restarted_node_resumes_only_with_a_whole_log() {
        let t = site(4);
        let mut s = Supervisor::new(1_000, 0);
        all_beat(&mut s, &t, &[0, 1, 2, 3], 2_000);
        // Node 1 restarted without its data (new incarnation, empty log).
        let restarted =
            Beat { incarnation: 7, recovered: Some(Recovered { whole: false, incomplete: Vec::new() }), ..beat(&t, 1, t.epoch) };
        s.heartbeat(restarted.clone(), 2_100);
        // Until the others are heard after its restart, nobody knows they
        // survived the same outage: it waits.
        assert_eq!(s.next(&t, 2_100), None);
        all_beat(&mut s, &t, &[0, 2, 3], 2_150);
        let out = s.next(&t, 2_150).unwrap();
        assert!(out.topology.node(1).is_none(), "{}", out.why);
        // The same with a whole log of every chain it is in: resumes.
        let mine: BTreeMap<PartitionId, u64> = (0..16).filter(|&p| t.chain(p).nodes.contains(&1)).map(|p| (p, 5)).collect();
        s.heartbeat(Beat { applied: mine, recovered: Some(Recovered { whole: true, incomplete: Vec::new() }), ..restarted }, 2_200);
        let out = s.next(&t, 2_200).unwrap();
        assert!(out.topology.admits(1, 7) && out.topology.chains == t.chains, "{}", out.why);
    }

    /// Found by the campaign (seed 1770, lost messages and wipes): after a
    /// whole-site restart a node whose synced log had one replica still
    /// catching up left every chain, its whole replicas too; the one copy
    /// left of one of them was then wiped. Now an incomplete replica leaves
    /// its chain only if another member holds the partition further, and
    /// the whole ones stay.
    /// Found by the campaign (seed 243, with balanced roles): a node
    /// crashed as it left a chain from its tail, was put back at that tail
    /// as a newcomer while still counted alive, and restarted with a whole
    /// log before it ever adopted that. Resumed in place, it served its old
    /// copy as the tail: the others had declared stable, without it, writes
    /// it lacked, and nobody sent them (a read older than the reader's own
    /// past). A recovered tail has no successor to catch up from: it stays
    /// in place only if no other copy is further; a head or a middle member
    /// catches up from its successor and stays.
    #[test]
    fn a_restarted_tail_that_another_copy_is_ahead_of_returns_by_state_transfer() {
        let t = site(4);
        let mut s = Supervisor::new(1_000, 0);
        let mine: Vec<PartitionId> = (0..16).filter(|&p| t.chain(p).nodes.contains(&1)).collect();
        let ends: Vec<PartitionId> = mine.iter().copied().filter(|&p| t.chain(p).tail() == 1).collect();
        assert!(!ends.is_empty() && ends.len() < mine.len());
        let at = |n: NodeId, a: u64| Beat { applied: (0..16).map(|p| (p, a)).collect(), ..beat(&t, n, t.epoch) };
        let restarted = Beat {
            incarnation: 7,
            applied: mine.iter().map(|&p| (p, 5)).collect(),
            recovered: Some(Recovered { whole: true, incomplete: Vec::new() }),
            ..beat(&t, 1, t.epoch)
        };
        s.heartbeat(restarted, 2_100);
        for n in [0, 2, 3] {
            s.heartbeat(at(n, 9), 2_150);
        }
        let out = s.next(&t, 2_150).unwrap();
        assert!(out.topology.admits(1, 7), "{}", out.why);
        for &p in &mine {
            assert_eq!(out.topology.chain(p).nodes.contains(&1), !ends.contains(&p), "p{p}: {}", out.why);
        }
    }

    #[test]
    fn a_restart_with_incomplete_replicas_keeps_what_no_other_copy_has() {
        let t = site(4);
        let mut s = Supervisor::new(1_000, 0);
        let mine: Vec<PartitionId> = (0..16).filter(|&p| t.chain(p).nodes.contains(&1)).collect();
        let at = |n: NodeId, a: u64| Beat { applied: (0..16).map(|p| (p, a)).collect(), ..beat(&t, n, t.epoch) };
        for n in [0, 2, 3] {
            s.heartbeat(at(n, 5), 2_000);
        }
        // Recovered incomplete: one shorter than the others' copies, one as
        // far, one further.
        let (shorter, as_far, further) = (mine[0], mine[1], mine[2]);
        let applied = |p| match p {
            _ if p == shorter => 3,
            _ if p == further => 9,
            _ => 5,
        };
        let restarted = Beat {
            incarnation: 7,
            applied: mine.iter().map(|&p| (p, applied(p))).collect(),
            recovered: Some(Recovered { whole: true, incomplete: vec![shorter, as_far, further] }),
            ..beat(&t, 1, t.epoch)
        };
        s.heartbeat(restarted, 2_100);
        for n in [0, 2, 3] {
            s.heartbeat(at(n, 5), 2_150);
        }
        let out = s.next(&t, 2_150).unwrap();
        assert!(out.topology.admits(1, 7), "{}", out.why);
        for &p in &mine {
            assert_eq!(out.topology.chain(p).nodes.contains(&1), p != shorter, "p{p}: {}", out.why);
        }
        assert!(s.reports(&out.topology, 2_150).iter().find(|r| r.node == 1).is_some_and(|r| r.failures == 0), "not a failure");
    }

    #[test]
    fn a_whole_site_restart_puts_the_longest_log_at_the_head() {
        let mut t = site(3);
        t.admitted.clear();
        let mut s = Supervisor::new(1_000, 0);
        s.observe(0, true);
        let applied = |n: NodeId| -> BTreeMap<PartitionId, u64> { (0..16).map(|p| (p, [10, 30, 20][n as usize])).collect() };
        let b =
            |n: NodeId| Beat { applied: applied(n), recovered: Some(Recovered { whole: false, incomplete: Vec::new() }), ..beat(&t, n, 1) };
        s.heartbeat(b(0), 100);
        s.heartbeat(b(1), 100);
        assert_eq!(s.next(&t, 150), None, "waits for every member of the chains");
        s.heartbeat(b(2), 200);
        let out = s.next(&t, 250).unwrap().topology;
        assert!((0..3).all(|n| out.admits(n, 100 + n as u64)));
        assert!(out.chains.iter().all(|c| c.nodes == vec![1, 2, 0]), "{:?}", out.chains[0]);
    }
}
