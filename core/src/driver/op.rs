//! One request of a session as a state machine: what it sends, which
//! replies it waits for, when it is done. The `Driver` (mod.rs) decides when
//! a request may start and hands it the session state it shares with the
//! session's other requests (`Ctx`).
//!
//! Per request:
//! * GET: pick a replica the session may read (`Session::read_limit`),
//!   preferring the local node when it is one, send `Get` with the version
//!   the session already saw; if that replica is behind, retry at the head.
//! * SET / DEL: dependency stabilization first (a `WaitStable` to the tail of
//!   every accessed, unstable version), then `Put` to the head, answered at
//!   chain position k-1 (ChainReaction §3.3.1).
//! * MGET: a get-transaction at snapshot time `at` = max(now, the session's
//!   latest timestamp), one `SnapshotRead` per head; see
//!   `ChainReplica::snapshot_read` for why this never fractures.
//! * a `NotResponsible` answer refreshes the topology and starts over.

use super::{Consistency, KeyScope, Request, Response, MAX_REDIRECTS, RESEND_MS, RETRY_MS};
use crate::error::Error;
use crate::hlc::Timestamp;
use crate::message::{ClientId, DepOn, Item, Keyspace, Message, OpId, Refusal, WriteDep, ACK_AT_TAIL};
use crate::ring::{NodeId, PartitionId, Topology};
use crate::session::{Dep, Session};
use crate::version::Version;
use ahash::AHashMap;
use bytes::Bytes;
use smallvec::SmallVec;
use std::collections::BTreeMap;
use std::sync::Arc;

/// What a session's requests share: who it is, its map of the site, its
/// causal metadata, and the nodes it avoids.
#[derive(Debug)]
pub(super) struct Ctx {
    pub id: ClientId,
    pub topology: Arc<Topology>,
    /// The node this session runs on, preferred for reads when legal.
    pub local: Option<NodeId>,
    pub session: Session,
    pub next_seq: u64,
    pub rng: u64,
    /// Nodes that look unreachable, until when (ms): avoided when another
    /// replica may serve.
    pub down: AHashMap<NodeId, u64>,
    /// The session's writes not finished yet, by id, and their keys.
    pub writes: BTreeMap<u64, Bytes>,
    /// The site is the primary of a disaster-recovery pair (`geo::dr`): a
    /// write is acknowledged once its backup has noted it too
    /// (`Message::Noted`).
    pub noted: bool,
}

impl Ctx {
    /// A new op sequence number that no message uses: a write's id.
    fn reserve(&mut self) -> u64 {
        self.next_seq += 1;
        self.next_seq
    }

    /// The session's latest write before `write` that is not finished, if
    /// any (a pipelined write depends on it).
    pub fn earlier_write(&self, write: u64) -> Option<(u64, &Bytes)> {
        self.writes.range(..write).next_back().map(|(&w, k)| (w, k))
    }

    /// Whether write `write` must wait for the session's accessed objects
    /// (§3.3.1) itself, beside the earlier write in flight it names: it
    /// must unless that write started after them (it waited for them, and
    /// its head orders `write` after it). A later write of the pipeline may
    /// be acknowledged first, unstable: the accessed objects then restart
    /// with it, and nothing in flight waited for it.
    pub fn waits_for_accessed(&self, write: u64) -> bool {
        self.earlier_write(write).is_none_or(|(earlier, _)| self.session.last_write() > earlier)
    }

    /// Whether the head of `key`'s chain holds a replica of the partition
    /// of `dep` (so it can wait for `dep` itself).
    pub fn head_holds(&self, key: &[u8], dep: &[u8]) -> bool {
        let head = self.topology.chain(self.topology.partition_of(key)).head();
        self.topology.chain(self.topology.partition_of(dep)).nodes.contains(&head)
    }

    fn random(&mut self, n: usize) -> usize {
        // xorshift64*: deterministic per client, good enough to spread reads.
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        (self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33) as usize % n
    }

    /// The local node if it may serve, else a random legal one.
    pub fn pick(&mut self, legal: &[NodeId]) -> NodeId {
        let up: SmallVec<[NodeId; 8]> = legal.iter().copied().filter(|n| !self.down.contains_key(n)).collect();
        let legal = if up.is_empty() { legal } else { &up[..] };
        match self.local {
            Some(me) if legal.contains(&me) => me,
            _ => legal[self.random(legal.len())],
        }
    }

    /// Any node of the site (for what every node can answer).
    fn any_node(&mut self) -> NodeId {
        let nodes: Vec<NodeId> = self.topology.nodes.iter().map(|n| n.id).collect();
        self.pick(&nodes)
    }

    /// Who to ask whether an update is stable: our own node (no hop) if it
    /// is in the chain, else the tail (it knows first), avoiding nodes that
    /// look down.
    fn stability_witness(&self, chain: &[NodeId]) -> NodeId {
        let up = |n: &NodeId| !self.down.contains_key(n);
        match self.local {
            Some(me) if chain.contains(&me) && up(&me) => me,
            _ => chain.iter().rev().copied().find(up).unwrap_or(*chain.last().expect("chains are not empty")),
        }
    }

    /// The versions of `keys` this session saw and does not know stable.
    fn seen_unstable(&self, keys: &[Bytes]) -> Vec<(Bytes, Dep)> {
        let seen = keys.iter().filter_map(|k| self.session.seen(k).map(|s| (k.clone(), s)));
        seen.map(|(k, s)| (k, Dep { version: s.version.clone(), seq: s.seq })).collect()
    }
}

/// What one request wants after a step.
#[derive(Debug, Default)]
pub(super) struct Step {
    /// Nearly always one message: kept inline.
    pub send: SmallVec<[(NodeId, Message); 1]>,
    pub done: Option<Result<Response, Error>>,
}

#[derive(Debug)]
enum Phase {
    /// Waiting for replicas to confirm these dependencies are stable, then
    /// writing (dependency stabilization) or reading at the tail (a
    /// linearizable read of a key the session saw unstable).
    Stabilizing {
        deps: AHashMap<u64, (Bytes, Version)>,
        then_read: bool,
    },
    Writing,
    Reading,
    Snapshot {
        items: Vec<Option<Item>>,
        parts: AHashMap<u64, Vec<usize>>,
    },
    /// A linearizable MGET's round of tail reads (see `collect`): replies
    /// by op seq to key position, and the previous round's items.
    Collect {
        items: Vec<Option<Item>>,
        parts: AHashMap<u64, usize>,
        previous: Option<Vec<Item>>,
    },
    Counting {
        remaining: usize,
        total: Keyspace,
    },
    Listing {
        remaining: usize,
        keys: Vec<Bytes>,
        cursor: u64,
    },
    Flushing {
        remaining: usize,
    },
    Refreshing,
    /// `Request::Resume`: asked a node what its site has applied.
    Resuming,
    /// A write that never left (its head was unreachable), or a
    /// linearizable read its joining tail refused: fetch the map again at
    /// `at_ms` and retry, until the request times out.
    Retrying {
        at_ms: u64,
    },
}

/// The keys one head serves in a get-transaction, and their positions in
/// the request.
type KeysAt = (Vec<(PartitionId, Bytes)>, Vec<usize>);

/// One started request.
#[derive(Debug)]
pub(super) struct Op {
    pub request: Request,
    /// This request's level: the session's, or one given for it alone.
    pub consistency: Consistency,
    pub started_ms: u64,
    redirects: u8,
    phase: Phase,
    /// Op sequence numbers whose replies we still expect.
    outstanding: SmallVec<[u64; 2]>,
    /// Where each message went, by op seq (a few per request).
    targets: SmallVec<[(u64, NodeId); 2]>,
    /// A write's id (the op seq of its first `Put`): every resend carries
    /// it, and its acknowledgement is accepted whichever attempt it answers.
    write: Option<u64>,
    /// How many times `tick` has resent the write.
    resends: u64,
    /// `Request::Resume`: the sites whose writes the session saw and this
    /// site had not applied at the last look.
    behind: Vec<crate::version::SiteId>,
    /// The versions (timestamps) of this write its backup noted
    /// (`Ctx::noted`): an attempt ordered again by another head after its
    /// first head failed has another.
    noted: SmallVec<[Timestamp; 1]>,
    /// A write's answer and its version, held until its backup noted that
    /// version.
    held: Option<(Response, Timestamp)>,
}

impl Op {
    /// Starts `request`.
    pub fn start(cx: &mut Ctx, request: Request, consistency: Consistency, now_ms: u64) -> (Box<Op>, Step) {
        let mut op = Box::new(Op {
            request,
            consistency,
            started_ms: now_ms,
            redirects: 0,
            phase: Phase::Writing,
            outstanding: SmallVec::new(),
            targets: SmallVec::new(),
            write: None,
            resends: 0,
            behind: Vec::new(),
            noted: SmallVec::new(),
            held: None,
        });
        if let Request::Put { key, .. } = &op.request {
            let write = cx.reserve();
            op.write = Some(write);
            cx.writes.insert(write, key.clone());
        }
        let step = op.begin(cx, now_ms);
        let step = op.sent(step);
        (op, step)
    }

    /// The write's id, for a write.
    pub fn write_id(&self) -> Option<u64> {
        self.write
    }

    /// Whether `msg` (an answer to op `seq`) is for this request.
    pub fn awaits(&self, seq: u64, msg: &Message) -> bool {
        // The write's acknowledgement answers its first attempt even after
        // a resend. A "not written" answer (NX/XX) counts only from the
        // attempt in flight: an earlier attempt's may be stale.
        self.outstanding.contains(&seq)
            || (matches!(msg, Message::PutDone { version: Some(_), .. } | Message::Noted { .. }) && self.write == Some(seq))
    }

    /// When `tick` next has something to do for this request.
    pub fn next_due(&self, timeout_ms: u64) -> u64 {
        let deadline = self.started_ms + timeout_ms;
        match self.phase {
            Phase::Retrying { at_ms } => deadline.min(at_ms),
            Phase::Writing => deadline.min(self.started_ms + (self.resends + 1) * self.resend_ms()),
            _ => deadline,
        }
    }

    /// Gives up once the request has taken longer than `timeout_ms`,
    /// retries a write whose head was unreachable once its wait is over,
    /// and resends a write left unanswered for `RESEND_MS`.
    pub fn tick(&mut self, cx: &mut Ctx, timeout_ms: u64, now_ms: u64) -> Step {
        let waited = now_ms.saturating_sub(self.started_ms);
        match self.phase {
            _ if waited >= timeout_ms => {
                let error = match (self.behind.is_empty(), self.held.is_some()) {
                    (false, _) => Error::Behind { sites: self.behind.clone() },
                    // Written here; its backup never noted it (`geo::dr`).
                    (true, true) => Error::NotNoted,
                    (true, false) => Error::Timeout,
                };
                Step { send: SmallVec::new(), done: Some(Err(error)) }
            }
            Phase::Retrying { at_ms } if now_ms >= at_ms => {
                let mut p = Step::default();
                self.refresh(cx, &mut p);
                self.sent(p)
            }
            Phase::Writing if waited / self.resend_ms() > self.resends => {
                self.resends += 1;
                self.restart(cx, now_ms)
            }
            _ => Step::default(),
        }
    }

    /// How long a write waits for its answer before it is sent again:
    /// longer for a large value (`crate::resend_wait_ms`).
    fn resend_ms(&self) -> u64 {
        let bytes = match &self.request {
            Request::Put { key, change } => key.len() + change.payload_len(),
            _ => 0,
        };
        crate::resend_wait_ms(RESEND_MS, bytes)
    }

    /// Whether a reply is awaited from `node`.
    fn waits_on(&self, node: NodeId) -> bool {
        self.targets.iter().any(|&(seq, to)| to == node && self.outstanding.contains(&seq))
    }

    /// This step's messages to `node` could not be sent (`known`: the node
    /// was already suspected). They never left, so even a write can be
    /// redone: a write waits `RETRY_MS`, refreshes the partition map and
    /// goes to whichever node heads the chain then; other work restarts
    /// elsewhere now.
    pub fn undeliverable(&mut self, cx: &mut Ctx, node: NodeId, known: bool, now_ms: u64) -> Step {
        if !self.waits_on(node) {
            return Step::default();
        }
        // Work that may go elsewhere does so at once (the new choice avoids
        // this node); a write, or work with nowhere else to go (it picked a
        // node already known down), waits and retries on a fresh map.
        if matches!(self.phase, Phase::Writing) || known {
            self.retry_later(now_ms);
            return Step::default();
        }
        self.restart(cx, now_ms)
    }

    /// `node` looks unreachable (its connection closed). Reads, stability
    /// checks and other idempotent work waiting on it start over elsewhere;
    /// a write waits (it may have been applied) until the configuration
    /// changes or the request times out.
    pub fn unreachable(&mut self, cx: &mut Ctx, node: NodeId, now_ms: u64) -> Step {
        if !self.waits_on(node) || matches!(self.phase, Phase::Writing | Phase::Flushing { .. } | Phase::Retrying { .. }) {
            return Step::default();
        }
        self.restart(cx, now_ms)
    }

    /// The site moved to a new configuration (already in `cx`).
    pub fn reconfigured(&mut self, cx: &mut Ctx, now_ms: u64) -> Step {
        match self.phase {
            // A write is resent with its id: a new head that already has it
            // (the old head forwarded it before failing) answers instead of
            // applying it again (ChainReaction §3.3.3: the proxy
            // retransmits to the new head). A write that reached no
            // survivor is applied now. A flush or a pending retry waits.
            Phase::Flushing { .. } | Phase::Retrying { .. } => Step::default(),
            _ => self.restart(cx, now_ms),
        }
    }

    fn next_op(&mut self, cx: &mut Ctx) -> OpId {
        cx.next_seq += 1;
        self.outstanding.push(cx.next_seq);
        OpId { client: cx.id, seq: cx.next_seq }
    }

    fn begin(&mut self, cx: &mut Ctx, now_ms: u64) -> Step {
        let mut p = Step::default();
        match self.request.clone() {
            Request::Get(key) => self.read(cx, &key, false, &mut p),
            Request::Put { key, .. } => {
                // What the session waits for itself before it sends the
                // write: everything, for a linearizable write; for a causal
                // one, the versions of other keys whose partitions the head
                // holds no replica of (the head waits for the others,
                // `write_deps`). Nothing after a write still in flight: the
                // head waits for that one, which waited for these.
                let write = self.write.expect("a write's id is set at its start");
                let deps: Vec<(Bytes, Dep)> = match self.consistency {
                    Consistency::Linearizable => cx.session.dependencies().map(|(k, d)| (k.clone(), d.clone())).collect(),
                    Consistency::Causal if cx.waits_for_accessed(write) => cx
                        .session
                        .dependencies()
                        .filter(|(k, _)| **k != key && !cx.head_holds(&key, k))
                        .map(|(k, d)| (k.clone(), d.clone()))
                        .collect(),
                    _ => Vec::new(),
                };
                if !self.stabilize(cx, deps, false, &mut p) {
                    self.write(cx, &mut p);
                }
            }
            // An erasure-coded site keeps no versions to read a snapshot
            // at: its reads are linearizable, and so is the double collect.
            Request::MultiGet(keys) if self.consistency == Consistency::Linearizable || cx.topology.shape.coding.is_some() => {
                self.collect(cx, &keys, None, &mut p)
            }
            Request::MultiGet(keys) => self.snapshot(cx, &keys, now_ms, &mut p),
            Request::Count => {
                let mut by_node: BTreeMap<NodeId, Vec<PartitionId>> = BTreeMap::new();
                if cx.topology.shape.coding.is_some() {
                    // Erasure-coded: every node counts the slots it serves
                    // (a chain may name a node that passes requests on).
                    let all: Vec<PartitionId> = (0..cx.topology.shape.partitions).collect();
                    for n in &cx.topology.nodes {
                        by_node.insert(n.id, all.clone());
                    }
                } else {
                    // At the heads, which hold every write (the session's
                    // own included).
                    for (partition, chain) in cx.topology.chains.iter().enumerate() {
                        by_node.entry(chain.head()).or_default().push(partition as PartitionId);
                    }
                }
                self.phase = Phase::Counting { remaining: by_node.len(), total: Keyspace::default() };
                for (node, partitions) in by_node {
                    let op = self.next_op(cx);
                    p.send.push((node, Message::Count { op, epoch: cx.topology.epoch, partitions }));
                }
            }
            Request::Keys { pattern, scope } => {
                let all = cx.topology.shape.partitions as u64;
                let (partitions, cursor): (Vec<PartitionId>, u64) = match scope {
                    KeyScope::All | KeyScope::Random => ((0..cx.topology.shape.partitions).collect(), 0),
                    KeyScope::Cursor(c) if c < all => (vec![c as PartitionId], if c + 1 < all { c + 1 } else { 0 }),
                    // Past the end (a cursor of a larger site): done, as
                    // Redis answers a cursor it does not know.
                    KeyScope::Cursor(_) => (Vec::new(), 0),
                };
                // One message per partition and node that lists it: each
                // answer holds one partition's keys at most.
                let mut asks: Vec<(NodeId, PartitionId)> = Vec::new();
                for partition in partitions {
                    if cx.topology.shape.coding.is_some() {
                        // Erasure-coded: every node lists the slots it
                        // serves, as for a count.
                        asks.extend(cx.topology.nodes.iter().map(|n| (n.id, partition)));
                    } else {
                        asks.push((cx.topology.chain(partition).head(), partition));
                    }
                }
                if asks.is_empty() {
                    p.done = Some(Ok(Response::Keys { keys: Vec::new(), cursor }));
                    return p;
                }
                self.phase = Phase::Listing { remaining: asks.len(), keys: Vec::new(), cursor };
                for (node, partition) in asks {
                    let op = self.next_op(cx);
                    let one = scope == KeyScope::Random;
                    let partitions = vec![partition];
                    p.send.push((node, Message::ListKeys { op, epoch: cx.topology.epoch, partitions, pattern: pattern.clone(), one }));
                }
            }
            Request::Flush => {
                let nodes: Vec<NodeId> = cx.topology.nodes.iter().map(|n| n.id).collect();
                self.phase = Phase::Flushing { remaining: nodes.len() };
                for node in nodes {
                    let op = self.next_op(cx);
                    p.send.push((node, Message::Flush { op }));
                }
            }
            Request::Topology => self.refresh(cx, &mut p),
            Request::Stabilize => {
                let deps: Vec<(Bytes, Dep)> = cx.session.dependencies().map(|(k, d)| (k.clone(), d.clone())).collect();
                if !self.stabilize(cx, deps, false, &mut p) {
                    p.done = Some(Ok(Response::Stabilized));
                }
            }
            Request::MemoryUsage(key) => {
                // At this node's replica if it has one, else at the head
                // (it holds every key the chain does).
                let partition = cx.topology.partition_of(&key);
                let chain = cx.topology.chain(partition);
                let node = match cx.local {
                    Some(me) if chain.nodes.contains(&me) => me,
                    _ => chain.head(),
                };
                let op = self.next_op(cx);
                p.send.push((node, Message::KeyMemory { op, epoch: cx.topology.epoch, partition, key }));
                self.phase = Phase::Reading;
            }
            Request::Resume(_) => {
                let node = cx.any_node();
                let op = self.next_op(cx);
                p.send.push((node, Message::GetSiteTime { op }));
                self.phase = Phase::Resuming;
            }
            Request::Failover { force } => {
                let node = cx.local.unwrap_or_else(|| cx.any_node());
                let op = self.next_op(cx);
                p.send.push((node, Message::Failover { op, force }));
                self.phase = Phase::Reading;
            }
        }
        p
    }

    fn write(&mut self, cx: &mut Ctx, p: &mut Step) {
        let Request::Put { key, change } = self.request.clone() else { unreachable!("write() runs for puts") };
        let partition = cx.topology.partition_of(&key);
        let chain = cx.topology.chain(partition);
        let ack_at = match self.consistency {
            Consistency::Causal => cx.topology.shape.k.min(chain.len()) - 1,
            Consistency::Eventual => 0,
            Consistency::Linearizable => ACK_AT_TAIL as usize,
        } as u8;
        let head = chain.head();
        let past = cx.session.past().clone();
        let op = self.next_op(cx);
        let write = self.write.expect("a write's id is set at its start");
        let deps = self.write_deps(cx, &key, write);
        let done_below = cx.writes.keys().next().copied().unwrap_or(write);
        let epoch = cx.topology.epoch;
        let put = Message::Put(Box::new(crate::message::Put { op, epoch, partition, key, change, past, ack_at, write, deps, done_below }));
        p.send.push((head, put));
        self.phase = Phase::Writing;
    }

    /// What the write's head waits for before it orders it (see
    /// `core::node::put`): the session's previous write if it is still in
    /// flight (for an eventual write, only if it wrote the same key: two
    /// writes of one key must not swap); and, for a causal write, the
    /// unstable versions of other keys the session accessed, unless that
    /// write waited for them (`Ctx::waits_for_accessed`; those whose
    /// partitions the head holds no replica of were waited for already,
    /// `begin`). A version of the same key needs no wait: the head holds
    /// it, and the new one supersedes it.
    fn write_deps(&self, cx: &Ctx, key: &Bytes, write: u64) -> Vec<WriteDep> {
        let on_key = |k: &Bytes| k == key;
        let mut deps = match cx.earlier_write(write) {
            Some((w, k)) if self.consistency == Consistency::Causal || (self.consistency == Consistency::Eventual && on_key(k)) => {
                vec![WriteDep { partition: cx.topology.partition_of(k), on: DepOn::Write(w), same_key: on_key(k) }]
            }
            _ => Vec::new(),
        };
        if self.consistency == Consistency::Causal && cx.waits_for_accessed(write) {
            deps.extend(cx.session.dependencies().filter(|(k, _)| !on_key(k)).map(|(k, d)| WriteDep {
                partition: cx.topology.partition_of(k),
                on: DepOn::Seq(d.seq),
                same_key: false,
            }));
        }
        deps
    }

    fn read(&mut self, cx: &mut Ctx, key: &Bytes, at_head: bool, p: &mut Step) {
        let partition = cx.topology.partition_of(key);
        let topology = cx.topology.clone();
        let chain = topology.chain(partition);
        let (target, min) = if at_head {
            (chain.head(), None)
        } else {
            match self.consistency {
                Consistency::Linearizable => {
                    // The session wrote or read a version the tail may not
                    // have yet: wait for it to get there first.
                    if self.stabilize(cx, cx.seen_unstable(std::slice::from_ref(key)), true, p) {
                        return;
                    }
                    (chain.tail(), None)
                }
                Consistency::Eventual => (cx.pick(&chain.nodes), None),
                Consistency::Causal => {
                    let legal = match cx.session.read_limit(key) {
                        Some(limit) => &chain.nodes[..=(limit as usize).min(chain.len() - 1)],
                        None => &chain.nodes[..],
                    };
                    (cx.pick(legal), cx.session.min_version(key).cloned().map(Box::new))
                }
            }
        };
        let op = self.next_op(cx);
        let leased = self.consistency == Consistency::Linearizable;
        p.send.push((target, Message::Get { op, epoch: cx.topology.epoch, partition, key: key.clone(), min, leased }));
        self.phase = Phase::Reading;
    }

    /// Records where this step's messages went, so that a node found
    /// unreachable can be routed around.
    fn sent(&mut self, p: Step) -> Step {
        for (node, msg) in &p.send {
            if let Some(id) = msg.op() {
                self.targets.push((id.seq, *node));
            }
        }
        p
    }

    /// Drops what the request waits for and retries it on a fresh map
    /// after `RETRY_MS`.
    fn retry_later(&mut self, now_ms: u64) {
        self.outstanding.clear();
        self.targets.clear();
        self.phase = Phase::Retrying { at_ms: now_ms + RETRY_MS };
    }

    fn restart(&mut self, cx: &mut Ctx, now_ms: u64) -> Step {
        self.outstanding.clear();
        self.targets.clear();
        let p = self.begin(cx, now_ms);
        self.sent(p)
    }

    fn snapshot(&mut self, cx: &mut Ctx, keys: &[Bytes], now_ms: u64, p: &mut Step) {
        // The end of this millisecond: every write completed before it
        // started (on a machine with this clock) is in.
        let at = cx.session.max_ts().max(Timestamp::new(now_ms, Timestamp::MAX_LOGICAL));
        let mut by_head: BTreeMap<NodeId, KeysAt> = BTreeMap::new();
        for (i, key) in keys.iter().enumerate() {
            let partition = cx.topology.partition_of(key);
            let entry = by_head.entry(cx.topology.chain(partition).head()).or_default();
            entry.0.push((partition, key.clone()));
            entry.1.push(i);
        }
        let mut parts = AHashMap::new();
        for (head, (keys, positions)) in by_head {
            let op = self.next_op(cx);
            let remote = cx.session.snapshot_bound();
            p.send.push((head, Message::SnapshotRead { op, epoch: cx.topology.epoch, at, remote, keys }));
            parts.insert(op.seq, positions);
        }
        self.phase = Phase::Snapshot { items: vec![None; keys.len()], parts };
        if keys.is_empty() {
            p.done = Some(Ok(Response::Values(Vec::new())));
        }
    }

    /// Asks replicas to confirm `deps` reached their tails, then (`Stable`)
    /// reads (`then_read`) or writes. False if there is nothing to wait for.
    fn stabilize(&mut self, cx: &mut Ctx, deps: Vec<(Bytes, Dep)>, then_read: bool, p: &mut Step) -> bool {
        if deps.is_empty() {
            return false;
        }
        let mut waiting = AHashMap::new();
        for (key, dep) in deps {
            let partition = cx.topology.partition_of(&key);
            // Any replica learns stability; our own node (no hop) if it is
            // one, else the tail (which knows first).
            let at = cx.stability_witness(&cx.topology.chain(partition).nodes);
            let op = self.next_op(cx);
            p.send.push((at, Message::WaitStable { op, epoch: cx.topology.epoch, partition, seq: dep.seq }));
            waiting.insert(op.seq, (key, dep.version));
        }
        self.phase = Phase::Stabilizing { deps: waiting, then_read };
        true
    }

    /// A linearizable MGET: every key read at its tail, in rounds ("double
    /// collect"). When no version changed between two consecutive rounds,
    /// each value was the current one for the whole time between them, so
    /// the read takes effect there; otherwise the last round is compared
    /// with a new one, until the request times out. A session that saw some
    /// of the keys unstable first waits for those versions to reach the
    /// tail, as a linearizable GET does.
    fn collect(&mut self, cx: &mut Ctx, keys: &[Bytes], previous: Option<Vec<Item>>, p: &mut Step) {
        if keys.is_empty() {
            p.done = Some(Ok(Response::Values(Vec::new())));
            return;
        }
        if previous.is_none() && self.stabilize(cx, cx.seen_unstable(keys), true, p) {
            return;
        }
        let mut parts = AHashMap::new();
        for (i, key) in keys.iter().enumerate() {
            let partition = cx.topology.partition_of(key);
            let op = self.next_op(cx);
            let get = Message::Get { op, epoch: cx.topology.epoch, partition, key: key.clone(), min: None, leased: true };
            p.send.push((cx.topology.chain(partition).tail(), get));
            parts.insert(op.seq, i);
        }
        self.phase = Phase::Collect { items: vec![None; keys.len()], parts, previous };
    }

    fn refresh(&mut self, cx: &mut Ctx, p: &mut Step) {
        let node = cx.any_node();
        let op = self.next_op(cx);
        p.send.push((node, Message::GetTopology { op }));
        self.phase = Phase::Refreshing;
    }

    /// A reply for this request (`awaits` said so).
    pub fn on_message(&mut self, cx: &mut Ctx, msg: Message, seq: u64, now_ms: u64) -> Step {
        if let Some(pos) = self.outstanding.iter().position(|&s| s == seq) {
            self.outstanding.swap_remove(pos);
        }
        let p = self.handle(cx, msg, seq, now_ms);
        self.sent(p)
    }

    fn handle(&mut self, cx: &mut Ctx, msg: Message, seq: u64, now_ms: u64) -> Step {
        let mut p = Step::default();
        match msg {
            Message::Refused { reason: Refusal::NotResponsible { .. }, .. } | Message::Refused { reason: Refusal::SnapshotTooOld, .. } => {
                self.redirects += 1;
                self.outstanding.clear();
                if self.redirects > MAX_REDIRECTS {
                    self.retry_later(now_ms);
                } else if matches!(msg, Message::Refused { reason: Refusal::SnapshotTooOld, .. }) {
                    return self.begin(cx, now_ms);
                } else {
                    self.refresh(cx, &mut p);
                }
            }
            Message::Refused { reason: Refusal::Unavailable { alive, needed }, .. } => {
                p.done = Some(Err(Error::Unavailable { alive, needed }));
            }
            Message::Refused { reason: Refusal::OutOfMemory, .. } => {
                p.done = Some(Err(Error::OutOfMemory));
            }
            Message::Refused { reason: Refusal::Disk(why), .. } => {
                p.done = Some(Err(Error::Disk(why)));
            }
            Message::Refused { reason: Refusal::Unsupported(why), .. } => {
                p.done = Some(Err(Error::InvalidInput(why)));
            }
            Message::Refused { reason: Refusal::Lost { key, missing }, .. } => {
                // A tail may not have a write of the key that is on its
                // way down the chain (say, the one that cleared it): the
                // head knows. A linearizable read goes by the tail.
                let head = cx.topology.chain(cx.topology.partition_of(&key)).head();
                let at_head = self.targets.iter().any(|&(s, to)| s == seq && to == head);
                match &self.request {
                    Request::Get(k) if !at_head && self.consistency != Consistency::Linearizable => {
                        let k = k.clone();
                        self.read(cx, &k, true, &mut p);
                    }
                    _ => p.done = Some(Err(Error::Lost { key, missing })),
                }
            }
            Message::Refused { reason: Refusal::Behind | Refusal::NoLease, .. } => {
                if self.consistency == Consistency::Linearizable {
                    // The tail is still joining (fetching the partition's
                    // state), or holds no lease (it may have been removed).
                    // The head would answer with versions the tail may not
                    // have acknowledged yet: wait, then ask the tail of a
                    // fresh map.
                    self.retry_later(now_ms);
                    return p;
                }
                let Request::Get(key) = self.request.clone() else {
                    return p;
                };
                // The replica's chain index is stale: go to the head, which
                // has every version (ChainReaction §3.3.3). If even the head
                // lacks it, the data is gone (FLUSHALL) and the head's answer
                // is the truth.
                self.read(cx, &key, true, &mut p);
            }
            Message::SiteTimeIs { site, site_time, .. } => {
                let Request::Resume(session) = &self.request else { return p };
                let past = session.past();
                self.behind =
                    (0..past.0.len() as crate::version::SiteId).filter(|&s| s != site && past.get(s) > site_time.get(s)).collect();
                if self.behind.is_empty() {
                    cx.session = (**session).clone();
                    p.done = Some(Ok(Response::Resumed));
                } else {
                    self.retry_later(now_ms);
                }
            }
            Message::TopologyIs { topology, .. } => {
                // Never back to an older map (a lagging node may answer).
                if topology.epoch > cx.topology.epoch {
                    cx.topology = Arc::new(*topology);
                }
                if matches!(self.request, Request::Topology) {
                    p.done = Some(Ok(Response::Topology(cx.topology.clone())));
                } else {
                    return self.begin(cx, now_ms);
                }
            }
            Message::Stable { .. } => {
                let Phase::Stabilizing { deps, then_read } = &mut self.phase else {
                    return p;
                };
                let then_read = *then_read;
                if let Some((key, version)) = deps.remove(&seq) {
                    cx.session.forget(&key, &version);
                }
                if deps.is_empty() {
                    match self.request.clone() {
                        Request::Get(key) if then_read => self.read(cx, &key, false, &mut p),
                        Request::MultiGet(keys) if then_read => self.collect(cx, &keys, None, &mut p),
                        Request::Stabilize => p.done = Some(Ok(Response::Stabilized)),
                        _ => self.write(cx, &mut p),
                    }
                }
            }
            Message::PutDone { version, seq, chain_index, stable, stable_through, old, .. } => {
                let Request::Put { key, change } = &self.request else {
                    return p;
                };
                let partition = cx.topology.partition_of(key);
                if let Some(version) = &version {
                    if self.consistency != Consistency::Eventual {
                        let write = self.write.expect("a write's id is set at its start");
                        cx.session.observe_write(partition, key, version, seq, chain_index, stable, write);
                    }
                }
                cx.session.stable_through(partition, stable_through);
                let written = version.as_ref().map(|v| v.ts);
                let response = match change.get {
                    true => Response::Replaced { written: written.is_some(), old: old.map(|o| *o) },
                    false => Response::Written(written.is_some()),
                };
                match written.filter(|ts| cx.noted && !self.noted.contains(ts)) {
                    // Its backup has not noted this version yet (`geo::dr`).
                    Some(ts) => self.held = Some((response, ts)),
                    None => p.done = Some(Ok(response)),
                }
            }
            Message::Noted { ts, .. } => {
                self.noted.push(ts);
                if self.held.as_ref().is_some_and(|(_, held)| *held == ts) {
                    p.done = self.held.take().map(|(response, _)| Ok(response));
                }
            }
            Message::FailedOver { lost, .. } => p.done = Some(Ok(Response::FailedOver(lost))),
            Message::Value { item, .. } if matches!(self.phase, Phase::Collect { .. }) => {
                let Phase::Collect { items, parts, previous } = &mut self.phase else { unreachable!("matched above") };
                let Some(pos) = parts.remove(&seq) else {
                    return p;
                };
                items[pos] = Some(*item);
                if parts.is_empty() {
                    let items: Vec<Item> = std::mem::take(items).into_iter().map(|i| i.expect("every key answered")).collect();
                    let unchanged = previous.as_ref().is_some_and(|prev| prev.iter().zip(&items).all(|(a, b)| a.version == b.version));
                    let Request::MultiGet(keys) = self.request.clone() else {
                        return p;
                    };
                    if !unchanged {
                        self.collect(cx, &keys, Some(items), &mut p);
                        return p;
                    }
                    for (key, item) in keys.iter().zip(&items) {
                        cx.session.observe_read(cx.topology.partition_of(key), key, item, 0);
                    }
                    p.done = Some(Ok(Response::Values(items.into_iter().map(|i| i.value).collect())));
                }
            }
            Message::Value { item, chain_index, stable_through, .. } => {
                let Request::Get(key) = &self.request else {
                    return p;
                };
                let partition = cx.topology.partition_of(key);
                p.done = Some(Ok(answered_read(&mut cx.session, self.consistency, partition, key, *item, chain_index, stable_through)));
            }
            Message::Snapshot { items: got, site_time, .. } => {
                cx.session.observe_site_time(&site_time);
                let Phase::Snapshot { items, parts } = &mut self.phase else {
                    return p;
                };
                let Some(positions) = parts.remove(&seq) else {
                    return p;
                };
                for (pos, item) in positions.into_iter().zip(got) {
                    items[pos] = Some(item);
                }
                if parts.is_empty() {
                    let items: Vec<Item> = std::mem::take(items).into_iter().map(|i| i.expect("every key answered")).collect();
                    let Request::MultiGet(keys) = &self.request else {
                        return p;
                    };
                    if self.consistency != Consistency::Eventual {
                        for (key, item) in keys.iter().zip(&items) {
                            cx.session.observe_read(cx.topology.partition_of(key), key, item, 0);
                        }
                    }
                    p.done = Some(Ok(Response::Values(items.into_iter().map(|i| i.value).collect())));
                }
            }
            Message::KeyMemoryIs { bytes, .. } => p.done = Some(Ok(Response::Memory(bytes))),
            Message::Counted { keyspace, .. } => {
                let Phase::Counting { remaining, total } = &mut self.phase else {
                    return p;
                };
                *remaining -= 1;
                *total += keyspace;
                if *remaining == 0 {
                    p.done = Some(Ok(Response::Count(*total)));
                }
            }
            Message::KeysAre { keys, .. } => {
                let Phase::Listing { remaining, keys: all, cursor } = &mut self.phase else {
                    return p;
                };
                *remaining -= 1;
                all.extend(keys);
                if *remaining == 0 {
                    p.done = Some(Ok(Response::Keys { keys: std::mem::take(all), cursor: *cursor }));
                }
            }
            Message::Flushed { .. } => {
                let Phase::Flushing { remaining } = &mut self.phase else {
                    return p;
                };
                *remaining -= 1;
                if *remaining == 0 {
                    cx.session.clear();
                    p.done = Some(Ok(Response::Flushed));
                }
            }
            _ => {}
        }
        p
    }
}

/// What a read's answer (`Message::Value`, or a read answered in place,
/// `Driver::read_here`) does to the session, and the response.
pub(super) fn answered_read(
    session: &mut Session,
    level: Consistency,
    partition: PartitionId,
    key: &Bytes,
    item: Item,
    chain_index: u8,
    stable_through: u64,
) -> Response {
    if level != Consistency::Eventual {
        session.observe_read(partition, key, &item, chain_index);
    }
    session.stable_through(partition, stable_through);
    Response::Read { value: item.value, chain_index, expires_at_ms: item.expires_at_ms }
}
