//! Where keys live: partitions, the consistent-hashing ring, and chains.
//!
//! Keys hash to a fixed number of partitions (the unit of replication and,
//! later, of state transfer). Nodes are placed on a consistent-hashing ring
//! with virtual points; a partition's chain is the first `replicas` distinct
//! nodes clockwise from the partition's own point (ChainReaction §3.2: "each
//! data item is placed in R consecutive data servers in the DHT ring"). Adding
//! or removing a node therefore only moves the partitions next to it.
//!
//! The ring says who holds a partition, not in which order: load follows
//! roles (heads take writes, tails linearizable reads and geo reporting),
//! and taken in ring order the roles are as uneven as the ring's arcs (on
//! four nodes and 64 partitions one node heads 22 chains and another ends
//! 24, where 16 is the fair share). Each chain's order is chosen so heads
//! and tails spread evenly (`placement`).
//!
//! A `Topology` is immutable and carries an `epoch`; every request names the
//! epoch it was routed with so a node can answer "not responsible" to callers
//! with an old map (the p2p store's `server-not-responsible` + `keyrange`).

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use xxhash_rust::xxh3::xxh3_64;

/// A data node of one site.
pub type NodeId = u16;
/// A partition of the key space.
pub type PartitionId = u32;

/// Virtual points per node on the ring: enough that 3 nodes share 64
/// partitions evenly, few enough that computing chains is instant.
const POINTS_PER_NODE: u32 = 64;

/// A node as the rest of the site knows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    pub id: NodeId,
    /// Where it serves clients and peers (host:port).
    pub addr: String,
}

/// The nodes replicating one partition, head first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chain {
    pub nodes: Vec<NodeId>,
}

impl Chain {
    pub fn head(&self) -> NodeId {
        self.nodes[0]
    }

    pub fn tail(&self) -> NodeId {
        *self.nodes.last().expect("a chain has at least one node")
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The position of `node` in this chain (0 = head).
    pub fn index_of(&self, node: NodeId) -> Option<usize> {
        self.nodes.iter().position(|&n| n == node)
    }
}

/// A node's share of the chains (see `Topology::roles`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Roles {
    pub head: usize,
    pub middle: usize,
    pub tail: usize,
}

/// The shape of a site's replication.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shape {
    pub partitions: u32,
    /// R: the length of every chain.
    pub replicas: usize,
    /// k: a causal write is acknowledged once this many nodes of its chain
    /// hold it (ChainReaction §3.3.1, the eager phase).
    pub k: usize,
    /// Erasure-coded groups instead of replicated chains (`ec`): chains
    /// are then one node long, the data member serving the partition.
    #[serde(default)]
    pub coding: Option<Coding>,
}

/// `--redundancy ec:K+M`: a site of exactly K+M nodes (ids 0..K+M) in
/// K+M groups of K data and M parity members (`ec::site`). Slot s of group
/// g is node (g + s) % N; partition p belongs to group p % N, data slot
/// (p / N) % K: every node is a data member of K groups and a parity
/// member of M (the paper's interleaved layout).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Coding {
    pub data: u8,
    pub parity: u8,
}

impl Coding {
    pub fn nodes(&self) -> u16 {
        (self.data + self.parity) as u16
    }

    /// The group of a partition and the data slot it belongs to.
    pub fn place(&self, partition: PartitionId) -> (u16, u8) {
        let n = self.nodes() as u32;
        ((partition % n) as u16, ((partition / n) % self.data as u32) as u8)
    }

    pub fn node(&self, group: u16, slot: u8) -> NodeId {
        (group + slot as u16) % self.nodes()
    }

    pub fn slot(&self, group: u16, node: NodeId) -> u8 {
        ((node + self.nodes() - group) % self.nodes()) as u8
    }

    /// The node that serves `partition` when `ids` are the site's nodes:
    /// its data member, or, lost, the first parity member left (who leads
    /// its recovery).
    fn server(&self, partition: PartitionId, ids: &[NodeId]) -> Option<NodeId> {
        let (g, s) = self.place(partition);
        std::iter::once(s).chain(self.data..self.data + self.parity).map(|s| self.node(g, s)).find(|n| ids.contains(n))
    }
}

impl std::str::FromStr for Coding {
    type Err = String;
    /// `ec:K+M`.
    fn from_str(s: &str) -> std::result::Result<Coding, String> {
        let bad = || format!("{s:?}: expected ec:K+M (K data and M parity members, e.g. ec:3+2)");
        let (k, m) = s.strip_prefix("ec:").and_then(|r| r.split_once('+')).ok_or_else(bad)?;
        let (data, parity) = (k.parse::<u8>().map_err(|_| bad())?, m.parse::<u8>().map_err(|_| bad())?);
        if data == 0 || parity == 0 || data as u16 + parity as u16 > 64 {
            return Err(format!("{s}: need at least one data and one parity member, at most 64 in all"));
        }
        Ok(Coding { data, parity })
    }
}

impl Shape {
    pub fn validate(&self, nodes: usize) -> Result<()> {
        if self.partitions == 0 {
            return Err(Error::InvalidInput("partitions must be at least 1".into()));
        }
        if self.replicas == 0 || self.replicas > nodes {
            return Err(Error::InvalidInput(format!(
                "replicas must be between 1 and the number of nodes ({nodes}), got {}",
                self.replicas
            )));
        }
        if self.k == 0 || self.k > self.replicas {
            return Err(Error::InvalidInput(format!("k must be between 1 and replicas ({}), got {}", self.replicas, self.k)));
        }
        if let Some(c) = self.coding {
            if c.nodes() as usize != nodes || self.replicas != 1 {
                return Err(Error::InvalidInput(format!(
                    "ec:{}+{} needs exactly {} nodes (has {nodes}) and chains of one node",
                    c.data,
                    c.parity,
                    c.nodes()
                )));
            }
        }
        Ok(())
    }
}

/// The partition map of a site at one epoch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Topology {
    pub epoch: u64,
    pub shape: Shape,
    pub nodes: Vec<NodeInfo>,
    pub chains: Vec<Chain>,
    /// The process incarnation of each node the coordinator admitted. A
    /// node serves only a configuration that admits its own incarnation: a
    /// restarted node (a new incarnation) waits until the coordinator has
    /// decided how it rejoins (see `supervisor`), so it never serves, nor
    /// orders writes with, what it had before the restart.
    pub admitted: BTreeMap<NodeId, u64>,
    /// Nodes removed after a failure (not drained): brought back
    /// automatically once they are alive again.
    pub returning: Vec<NodeInfo>,
}

impl Topology {
    /// Places `shape.partitions` partitions on a ring of `nodes`.
    pub fn new(epoch: u64, shape: Shape, nodes: Vec<NodeInfo>) -> Result<Self> {
        shape.validate(nodes.len())?;
        let mut ids: Vec<NodeId> = nodes.iter().map(|n| n.id).collect();
        ids.sort_unstable();
        if ids.windows(2).any(|w| w[0] == w[1]) {
            return Err(Error::InvalidInput("node ids must be distinct".into()));
        }
        let chains = placement(&ids, shape).iter().map(|nodes| Chain { nodes: nodes.clone() }).collect();
        Ok(Topology { epoch, shape, nodes, chains, admitted: BTreeMap::new(), returning: Vec::new() })
    }

    /// The partition a key belongs to.
    pub fn partition_of(&self, key: &[u8]) -> PartitionId {
        (xxh3_64(key) % self.shape.partitions as u64) as PartitionId
    }

    pub fn chain(&self, partition: PartitionId) -> &Chain {
        &self.chains[partition as usize]
    }

    pub fn node(&self, id: NodeId) -> Option<&NodeInfo> {
        self.nodes.iter().find(|n| n.id == id)
    }

    /// Minimal repair after `node` failed (ChainReaction §3.3.3): it leaves
    /// every chain it was in; the others keep their order, so a failed head
    /// is replaced by its successor, a failed tail by its predecessor, and a
    /// failed middle node is bridged.
    pub fn without(&self, node: NodeId) -> Topology {
        let mut t = self.clone();
        t.epoch += 1;
        t.nodes.retain(|n| n.id != node);
        t.admitted.remove(&node);
        for c in &mut t.chains {
            c.nodes.retain(|&n| n != node);
        }
        if let Some(coding) = t.shape.coding {
            // A chain of an erasure-coded site only says where to send
            // requests: to the node that serves the partition now.
            let ids: Vec<NodeId> = t.nodes.iter().map(|n| n.id).collect();
            for (p, c) in t.chains.iter_mut().enumerate() {
                if c.nodes.is_empty() {
                    c.nodes.extend(coding.server(p as PartitionId, &ids));
                }
            }
        }
        t
    }

    /// `without(node)` after a failure: the node is remembered in
    /// `returning`, to come back once it is alive again.
    pub fn failed(&self, node: NodeId) -> Topology {
        let mut t = self.without(node);
        if let Some(info) = self.node(node) {
            t.returning.retain(|n| n.id != node);
            t.returning.push(info.clone());
        }
        t
    }

    /// Whether this configuration admits incarnation `incarnation` of `node`.
    pub fn admits(&self, node: NodeId, incarnation: u64) -> bool {
        self.admitted.get(&node) == Some(&incarnation)
    }

    /// Moves every chain towards its place on the ring of the current
    /// nodes, changing only chains that must change: members that no longer
    /// belong leave, missing ones join at the tail (where they receive the
    /// partition's state before they serve). After a failure this grows
    /// short chains back to R; after a node is added it hands that node its
    /// share of partitions.
    pub fn rebalanced(&self) -> Topology {
        let mut t = self.clone();
        t.epoch += 1;
        let ids: Vec<NodeId> = t.nodes.iter().map(|n| n.id).collect();
        let placed = placement(&ids, t.shape);
        for (c, ideal) in t.chains.iter_mut().zip(placed.iter()) {
            c.nodes.retain(|n| ideal.contains(n));
            let missing: Vec<NodeId> = ideal.iter().copied().filter(|n| !c.nodes.contains(n)).collect();
            c.nodes.extend(missing);
        }
        t
    }

    /// Chain `p` one step nearer its placed order (`placement`), if it has
    /// its placed members but not in that order: the first member out of
    /// place moves up to its place (the others keep their order). Moving up
    /// is the only safe move (the mover catches up from its new successor,
    /// `ChainReplica::catch_up`); repeated, at most R - 1 times, it restores
    /// the placed order, which spreads head and tail roles evenly over the
    /// nodes. Joins and returns append at the tail; this undoes that.
    pub fn toward_placed_order(&self, p: PartitionId) -> Option<Vec<NodeId>> {
        let ids: Vec<NodeId> = self.nodes.iter().map(|n| n.id).collect();
        let placed = placement(&ids, self.shape);
        let ideal = &placed[p as usize];
        let chain = &self.chain(p).nodes;
        if chain.len() != ideal.len() || ideal.iter().any(|n| !chain.contains(n)) {
            return None;
        }
        let at = chain.iter().zip(ideal).position(|(c, i)| c != i)?;
        let mut moved: Vec<NodeId> = chain.iter().copied().filter(|&n| n != ideal[at]).collect();
        moved.insert(at, ideal[at]);
        Some(moved)
    }

    /// How many chains `node` heads, sits in the middle of, and ends. The
    /// only member of a one-node chain is both its head and its tail.
    pub fn roles(&self, node: NodeId) -> Roles {
        let mut r = Roles::default();
        for c in &self.chains {
            match c.index_of(node) {
                Some(i) if i == 0 || i + 1 == c.len() => {
                    r.head += (i == 0) as usize;
                    r.tail += (i + 1 == c.len()) as usize;
                }
                Some(_) => r.middle += 1,
                None => {}
            }
        }
        r
    }
}

/// Every partition's chain on the ring of `ids`, head first: its members
/// are the first `replicas` distinct nodes clockwise from its point
/// (`ring_order`); its head, then its tail among the others, are chosen so
/// that no node heads (ends) more chains than it must (`spread`), and the
/// middles keep their ring order. Every coordinator member and node
/// computes the same chains. The coordinator asks on every round, for the
/// site's nodes and, while it drains one, for the nodes without it: the
/// last few are kept.
fn placement(ids: &[NodeId], shape: Shape) -> Placement {
    const KEPT: usize = 4;
    thread_local! {
        static LAST: std::cell::RefCell<Vec<(Vec<NodeId>, Shape, Placement)>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let mut ids = ids.to_vec();
    ids.sort_unstable();
    LAST.with(|last| {
        if let Some((_, _, placed)) = last.borrow().iter().find(|(i, s, _)| *i == ids && *s == shape) {
            return placed.clone();
        }
        let placed = std::rc::Rc::new(place(&ids, shape));
        let mut last = last.borrow_mut();
        last.truncate(KEPT - 1);
        last.insert(0, (ids, shape, placed.clone()));
        placed
    })
}

/// `placement`, computed.
fn place(ids: &[NodeId], shape: Shape) -> Vec<Vec<NodeId>> {
    if let Some(c) = shape.coding {
        if let Some(chains) = (0..shape.partitions).map(|p| c.server(p, ids).map(|n| vec![n])).collect() {
            return chains;
        }
    }
    let ring: Vec<Vec<NodeId>> = (0..shape.partitions).map(|p| ring_order(ids, p).take(shape.replicas).collect()).collect();
    if ids.is_empty() {
        return ring;
    }
    let mut heads: Vec<NodeId> = ring.iter().map(|c| c[0]).collect();
    spread(&mut heads, &ring);
    let others: Vec<Vec<NodeId>> = ring.iter().zip(&heads).map(|(c, h)| c.iter().copied().filter(|n| n != h).collect()).collect();
    // A chain of one member (fewer nodes than R) has no tail to choose: it
    // gets a stand-in that is nobody's candidate, so it never moves.
    let mut tails: Vec<NodeId> = others.iter().map(|o| o.last().copied().unwrap_or(NodeId::MAX)).collect();
    spread(&mut tails, &others);
    heads
        .iter()
        .zip(&tails)
        .zip(&others)
        .map(|((&head, &tail), others)| {
            let middles = others.iter().copied().filter(|&n| n != tail);
            std::iter::once(head).chain(middles).chain(others.contains(&tail).then_some(tail)).collect()
        })
        .collect()
}

/// Chains, head first, by partition.
type Placement = std::rc::Rc<Vec<Vec<NodeId>>>;

/// Gives each partition's role (`chosen[p]`, one of `candidates[p]`) to
/// other candidates until no node has the role for more partitions than it
/// must. A move follows a path: node x hands the role of one of its
/// partitions to a candidate y, y hands one of its own to z, ... until one
/// that has it at least two fewer times than x (x loses one, that node
/// gains one, the others keep their count). When no node has such a path,
/// the busiest node's count is the least possible: every node it reaches
/// has at least one fewer, and the partitions they hold the role for have
/// no candidate outside them. Starting from the ring's choice, only what
/// must change changes.
fn spread(chosen: &mut [NodeId], candidates: &[Vec<NodeId>]) {
    let mut load: BTreeMap<NodeId, usize> = candidates.iter().flatten().map(|&n| (n, 0)).collect();
    for n in chosen.iter() {
        *load.entry(*n).or_default() += 1;
    }
    let mut held: BTreeMap<NodeId, BTreeSet<usize>> = BTreeMap::new();
    for (p, &n) in chosen.iter().enumerate() {
        held.entry(n).or_default().insert(p);
    }
    loop {
        let mut busiest: Vec<(usize, NodeId)> = load.iter().map(|(&n, &l)| (l, n)).collect();
        busiest.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        let Some((from, path)) = busiest.iter().find_map(|&(l, x)| Some((x, relief(x, l, &held, candidates, &load)?))) else {
            return;
        };
        *load.get_mut(&from).expect("a candidate") -= 1;
        *load.get_mut(&path[0].1).expect("a candidate") += 1;
        for (p, n) in path {
            held.get_mut(&chosen[p]).expect("held").remove(&p);
            held.entry(n).or_default().insert(p);
            chosen[p] = n;
        }
    }
}

/// A path relieving `x`, which has the role `load` times (see `spread`):
/// the partitions to hand over, each with its new holder, from the node
/// that ends it back to `x`; breadth first, so the shortest.
fn relief(
    x: NodeId,
    load: usize,
    held: &BTreeMap<NodeId, BTreeSet<usize>>,
    candidates: &[Vec<NodeId>],
    loads: &BTreeMap<NodeId, usize>,
) -> Option<Vec<(usize, NodeId)>> {
    // Who reached each node, through which partition.
    let mut came: BTreeMap<NodeId, (NodeId, usize)> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([x]);
    while let Some(u) = queue.pop_front() {
        for &p in held.get(&u).into_iter().flatten() {
            for &v in &candidates[p] {
                if v == x || came.contains_key(&v) {
                    continue;
                }
                came.insert(v, (u, p));
                if loads[&v] + 2 <= load {
                    let mut path = Vec::new();
                    let mut at = v;
                    while at != x {
                        let (u, p) = came[&at];
                        path.push((p, at));
                        at = u;
                    }
                    return Some(path);
                }
                queue.push_back(v);
            }
        }
    }
    None
}

/// The distinct nodes clockwise from `partition`'s point on the ring of
/// `ids`: a chain is a prefix of this, and a chain that lost a node grows
/// back by taking the next ones.
fn ring_order(ids: &[NodeId], partition: PartitionId) -> impl Iterator<Item = NodeId> {
    let ring = ring_of(ids);
    let at = point(&[b"partition", &partition.to_le_bytes()]);
    let start = ring.partition_point(|&(h, _)| h < at);
    let mut seen = Vec::with_capacity(ids.len());
    (0..ring.len()).filter_map(move |i| {
        let node = ring[(start + i) % ring.len()].1;
        (!seen.contains(&node)).then(|| {
            seen.push(node);
            node
        })
    })
}

/// Every node's points on the ring, sorted.
type Ring = std::rc::Rc<Vec<(u64, NodeId)>>;

/// The ring of `ids`: each node's points, sorted. The coordinator asks for
/// every partition's order on every round (`Supervisor::next`), so the
/// last ring built is kept (it depends on nothing but `ids`).
fn ring_of(ids: &[NodeId]) -> Ring {
    thread_local! {
        static LAST: std::cell::RefCell<Option<(Vec<NodeId>, Ring)>> = const { std::cell::RefCell::new(None) };
    }
    LAST.with(|last| {
        if let Some((for_ids, ring)) = &*last.borrow() {
            if for_ids == ids {
                return ring.clone();
            }
        }
        let mut ring: Vec<(u64, NodeId)> = ids
            .iter()
            .flat_map(|&id| (0..POINTS_PER_NODE).map(move |p| (point(&[b"node", &id.to_le_bytes(), &p.to_le_bytes()]), id)))
            .collect();
        ring.sort_unstable();
        let ring = std::rc::Rc::new(ring);
        *last.borrow_mut() = Some((ids.to_vec(), ring.clone()));
        ring
    })
}

/// A point on the ring: the hash of its parts, one after the other.
fn point(parts: &[&[u8]]) -> u64 {
    let mut buf = [0u8; 32];
    let mut len = 0;
    for part in parts {
        buf[len..len + part.len()].copy_from_slice(part);
        len += part.len();
    }
    xxh3_64(&buf[..len])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(n: u16) -> Vec<NodeInfo> {
        (0..n).map(|id| NodeInfo { id, addr: format!("127.0.0.1:{}", 6380 + id) }).collect()
    }

    #[test]
    fn chains_are_distinct_consecutive_nodes() {
        let t = Topology::new(1, Shape { partitions: 64, replicas: 3, k: 2, coding: None }, nodes(5)).unwrap();
        for c in &t.chains {
            assert_eq!(c.len(), 3);
            let mut s = c.nodes.clone();
            s.sort();
            s.dedup();
            assert_eq!(s.len(), 3);
        }
        // Every node heads some partitions; roles add up to the chains.
        for n in 0..5 {
            assert!(t.chains.iter().any(|c| c.head() == n), "node {n} heads nothing");
        }
        let roles: Vec<Roles> = (0..5).map(|n| t.roles(n)).collect();
        assert_eq!(roles.iter().map(|r| r.head).sum::<usize>(), 64);
        assert_eq!(roles.iter().map(|r| r.tail).sum::<usize>(), 64);
        assert_eq!(roles.iter().map(|r| r.middle).sum::<usize>(), 64);
        let single = Topology::new(1, Shape { partitions: 8, replicas: 1, k: 1, coding: None }, nodes(1)).unwrap();
        assert_eq!(single.roles(0), Roles { head: 8, middle: 0, tail: 8 });
    }

    #[test]
    fn adding_a_node_moves_only_some_partitions() {
        let shape = Shape { partitions: 256, replicas: 1, k: 1, coding: None };
        let a = Topology::new(1, shape, nodes(4)).unwrap();
        let b = Topology::new(2, shape, nodes(5)).unwrap();
        let moved = a.chains.iter().zip(&b.chains).filter(|(x, y)| x != y).count();
        assert!(moved > 0 && moved < 256 / 2, "moved {moved} of 256");
        // Whatever moved, moved to the new node.
        assert!(a.chains.iter().zip(&b.chains).all(|(x, y)| x == y || y.head() == 4));
    }

    #[test]
    fn repair_removes_then_extends_at_the_tail() {
        let t = Topology::new(1, Shape { partitions: 32, replicas: 3, k: 2, coding: None }, nodes(5)).unwrap();
        let cut = t.without(2);
        assert_eq!(cut.epoch, 2);
        for (before, after) in t.chains.iter().zip(&cut.chains) {
            let expect: Vec<NodeId> = before.nodes.iter().copied().filter(|&n| n != 2).collect();
            assert_eq!(after.nodes, expect);
        }
        let grown = cut.rebalanced();
        assert_eq!(grown.epoch, 3);
        for (short, full) in cut.chains.iter().zip(&grown.chains) {
            assert_eq!(full.len(), 3);
            assert_eq!(&full.nodes[..short.len()], &short.nodes[..], "existing members keep their positions");
            assert!(!full.nodes.contains(&2));
        }
        // Growing back gives what placing on the smaller ring would.
        let fresh = Topology::new(9, t.shape, cut.nodes.clone()).unwrap();
        let same = grown.chains.iter().zip(&fresh.chains).filter(|(a, b)| a.nodes.iter().all(|n| b.nodes.contains(n))).count();
        assert_eq!(same, 32);
    }

    /// Taken in ring order, four nodes and 64 partitions give one node 22
    /// heads and another 24 tails (fair: 16); placed, nobody has more than
    /// a quarter above the fair share, on any site size and partition count
    /// where a chain has a choice (R of at least 3, or R = N).
    #[test]
    fn placed_roles_are_within_a_quarter_of_the_fair_share() {
        for n in 3..=12u16 {
            for partitions in [16, 64, 256, 1024] {
                for replicas in [3, n as usize].into_iter().filter(|&r| r <= n as usize) {
                    let t = Topology::new(1, Shape { partitions, replicas, k: 1, coding: None }, nodes(n)).unwrap();
                    let fair = partitions as f64 / n as f64;
                    let limit = (fair * 1.25).floor().max(fair.ceil()) as usize;
                    for id in 0..n {
                        let r = t.roles(id);
                        assert!(
                            r.head <= limit && r.tail <= limit,
                            "{n} nodes, {partitions} partitions, R={replicas}: node {id} heads {} and ends {} (limit {limit})",
                            r.head,
                            r.tail
                        );
                    }
                    // The members are the ring's: only their order changed.
                    let ids: Vec<NodeId> = (0..n).collect();
                    for (p, c) in t.chains.iter().enumerate() {
                        let mut ring: Vec<NodeId> = ring_order(&ids, p as PartitionId).take(replicas).collect();
                        let mut members = c.nodes.clone();
                        ring.sort_unstable();
                        members.sort_unstable();
                        assert_eq!(members, ring);
                    }
                }
            }
        }
    }

    /// With fewer nodes than R (failures), chains are as long as the nodes
    /// allow; with none, empty.
    #[test]
    fn a_site_smaller_than_r_places_what_it_has() {
        let t = Topology::new(1, Shape { partitions: 16, replicas: 3, k: 2, coding: None }, nodes(3)).unwrap();
        let one = t.without(0).without(1).rebalanced();
        assert!(one.chains.iter().all(|c| c.nodes == vec![2]));
        let two = t.without(0).rebalanced();
        assert!(two.chains.iter().all(|c| c.len() == 2));
        assert!(two.roles(1).head.abs_diff(two.roles(2).head) <= 1, "heads spread over the two");
        assert!(one.without(2).rebalanced().chains.iter().all(|c| c.is_empty()));
    }

    #[test]
    fn roles_return_to_the_placed_order_one_move_up_at_a_time() {
        let t = Topology::new(1, Shape { partitions: 64, replicas: 3, k: 2, coding: None }, nodes(4)).unwrap();
        assert!((0..64).all(|p| t.toward_placed_order(p).is_none()), "a new site's chains are in their placed order");
        // Node 0 fails and returns: it is at the tail of every chain it is in.
        let mut back = t.clone();
        for c in &mut back.chains {
            if let Some(i) = c.index_of(0) {
                c.nodes.remove(i);
                c.nodes.push(0);
            }
        }
        assert_eq!(back.roles(0).head, 0);
        for p in 0..64 {
            let mut steps = 0;
            while let Some(order) = back.toward_placed_order(p) {
                // One member moves up; the others keep their order.
                let before = &back.chains[p as usize].nodes;
                let mover = *order.iter().zip(before).find(|(a, b)| a != b).unwrap().0;
                let rest = |c: &[NodeId]| c.iter().copied().filter(|&n| n != mover).collect::<Vec<_>>();
                assert_eq!(rest(&order), rest(before));
                assert!(order.iter().position(|&n| n == mover) < before.iter().position(|&n| n == mover));
                back.chains[p as usize].nodes = order;
                steps += 1;
            }
            assert!(steps <= 2);
        }
        assert_eq!(back.chains, t.chains);
        assert_eq!(back.roles(0), t.roles(0));
    }

    #[test]
    fn a_new_node_joins_at_the_tail_of_the_chains_it_takes() {
        let t = Topology::new(1, Shape { partitions: 64, replicas: 3, k: 2, coding: None }, nodes(4)).unwrap();
        let mut with = t.clone();
        with.nodes.push(NodeInfo { id: 4, addr: "x".into() });
        let r = with.rebalanced();
        let ideal = Topology::new(1, t.shape, with.nodes.clone()).unwrap();
        let mut moved = 0;
        for ((old, new), want) in t.chains.iter().zip(&r.chains).zip(&ideal.chains) {
            let mut a = new.nodes.clone();
            let mut b = want.nodes.clone();
            a.sort();
            b.sort();
            assert_eq!(a, b, "same members as the ring says");
            if old != new {
                moved += 1;
                assert_eq!(new.tail(), 4, "the newcomer joins at the tail");
            }
        }
        assert!(moved > 0 && moved < 64);
        assert_eq!(r.rebalanced().chains, r.chains, "stable once placed");
    }

    #[test]
    fn rejects_bad_shapes() {
        assert!(Topology::new(1, Shape { partitions: 64, replicas: 4, k: 2, coding: None }, nodes(3)).is_err());
        assert!(Topology::new(1, Shape { partitions: 64, replicas: 3, k: 0, coding: None }, nodes(3)).is_err());
        assert!(Topology::new(1, Shape { partitions: 0, replicas: 1, k: 1, coding: None }, nodes(3)).is_err());
    }
}
