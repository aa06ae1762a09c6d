//! The client side of ChainReaction: one session's requests as a state
//! machine. `start` a request, feed it the replies with `on_message`, call
//! `tick` so it can give up; it says what to send and, eventually, the
//! response. The node's Redis front end runs one `Driver` per connection
//! (the node acting as the paper's client proxy), the native client library
//! runs one per client, and the simulator runs many.
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

use crate::hlc::Timestamp;
use crate::message::{ClientId, Condition, Item, Keyspace, Message, OpId, Refusal, ACK_AT_TAIL};
use crate::ring::{NodeId, PartitionId, Topology};
use crate::session::{Dep, Session};
use crate::version::Version;
use ahash::AHashMap;
use bytes::Bytes;
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

/// How many times in a row one request is redirected (topology refreshes)
/// at once; after that it waits `RETRY_MS` between refreshes (a node not
/// serving yet, or a configuration still settling), until it times out.
const MAX_REDIRECTS: u8 = 3;
/// How long a node found unreachable is avoided (unless the configuration
/// changes first).
const SUSPECT_MS: u64 = 1_000;
/// How long a write whose head was unreachable waits before it fetches the
/// partition map again.
const RETRY_MS: u64 = 200;
/// A write unanswered this long is sent again (with its id, so it is
/// applied once): its answer, or the write itself, may have been lost on a
/// connection that broke (a peer restarted).
const RESEND_MS: u64 = 1_000;

/// The guarantee a session asks for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Consistency {
    /// ChainReaction causal+: reads anywhere the metadata allows, writes
    /// acknowledged at k.
    #[default]
    Causal,
    /// Writes acknowledged by the head, reads from any replica, no session
    /// metadata.
    Eventual,
    /// Writes acknowledged by the tail, reads at the tail (classic chain
    /// replication).
    Linearizable,
}

impl FromStr for Consistency {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "causal" => Ok(Consistency::Causal),
            "eventual" => Ok(Consistency::Eventual),
            "linearizable" => Ok(Consistency::Linearizable),
            _ => Err(format!("unknown consistency '{s}' (expected causal, eventual or linearizable)")),
        }
    }
}

impl fmt::Display for Consistency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Consistency::Causal => "causal",
            Consistency::Eventual => "eventual",
            Consistency::Linearizable => "linearizable",
        })
    }
}

/// What a client asks.
#[derive(Clone, Debug, PartialEq)]
pub enum Request {
    Get(Bytes),
    /// `value: None` deletes.
    Put {
        key: Bytes,
        value: Option<Bytes>,
        ttl_ms: Option<u64>,
        condition: Condition,
    },
    /// A get-transaction: a causally consistent snapshot of several keys.
    MultiGet(Vec<Bytes>),
    /// Live keys in the whole site.
    Count,
    /// Drop every key on every node.
    Flush,
    /// Fetch the current topology.
    Topology,
}

/// What a client gets back.
#[derive(Clone, Debug, PartialEq)]
pub enum Response {
    /// `chain_index`: the chain position that served the read.
    Read {
        value: Option<Bytes>,
        chain_index: u8,
    },
    /// Whether the write happened (false: the NX/XX condition did not hold).
    Written(bool),
    Values(Vec<Option<Bytes>>),
    Count(Keyspace),
    Flushed,
    Topology(Arc<Topology>),
}

/// Why a request failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientError {
    /// No answer in time (a node is down or overloaded).
    Timeout,
    /// Too few replicas of the key's partition are alive to accept writes.
    Unavailable { alive: u8, needed: u8 },
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientError::Timeout => f.write_str("timed out waiting for the replicas"),
            ClientError::Unavailable { alive, needed } => {
                write!(f, "only {alive} replicas of this key's partition are alive and writes need {needed}; retry after repair")
            }
        }
    }
}

/// What the driver wants done after a step.
#[derive(Debug, Default)]
pub struct Progress {
    pub send: Vec<(NodeId, Message)>,
    pub done: Option<Result<Response, ClientError>>,
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
    Flushing {
        remaining: usize,
    },
    Refreshing,
    /// A write that never left (its head was unreachable), or a
    /// linearizable read its joining tail refused: fetch the map again at
    /// `at_ms` and retry, until the request times out.
    Retrying {
        at_ms: u64,
    },
}

#[derive(Debug)]
struct InFlight {
    request: Request,
    /// This request's level: the session's, or one given for it alone.
    consistency: Consistency,
    started_ms: u64,
    redirects: u8,
    phase: Phase,
    /// Op sequence numbers whose replies we still expect.
    outstanding: Vec<u64>,
    /// Where each outstanding message went.
    targets: AHashMap<u64, NodeId>,
    /// A write's id (the op seq of its first `Put`): every resend carries
    /// it, and its acknowledgement is accepted whichever attempt it answers.
    write: Option<u64>,
    /// How many times `tick` has resent the write.
    resends: u64,
}

/// The keys one head serves in a get-transaction, and their positions in
/// the request.
type KeysAt = (Vec<(PartitionId, Bytes)>, Vec<usize>);

/// One session's request state machine.
#[derive(Debug)]
pub struct Driver {
    id: ClientId,
    topology: Arc<Topology>,
    /// The node this driver runs on, preferred for reads when legal.
    local: Option<NodeId>,
    consistency: Consistency,
    session: Session,
    timeout_ms: u64,
    next_seq: u64,
    rng: u64,
    op: Option<InFlight>,
    /// Nodes that look unreachable, until when (ms): avoided when another
    /// replica may serve.
    down: AHashMap<NodeId, u64>,
}

impl Driver {
    pub fn new(id: ClientId, topology: Arc<Topology>, local: Option<NodeId>, timeout_ms: u64) -> Self {
        Driver {
            id,
            topology,
            local,
            consistency: Consistency::Causal,
            session: Session::default(),
            timeout_ms,
            next_seq: 0,
            rng: id ^ 0x9E37_79B9_7F4A_7C15,
            op: None,
            down: AHashMap::new(),
        }
    }

    pub fn id(&self) -> ClientId {
        self.id
    }

    pub fn topology(&self) -> &Arc<Topology> {
        &self.topology
    }

    pub fn set_topology(&mut self, topology: Arc<Topology>) {
        self.topology = topology;
    }

    pub fn consistency(&self) -> Consistency {
        self.consistency
    }

    pub fn set_consistency(&mut self, c: Consistency) {
        self.consistency = c;
    }

    pub fn session(&self) -> &Session {
        &self.session
    }

    pub fn set_session(&mut self, s: Session) {
        self.session = s;
    }

    /// How long a request may take before `tick` gives up on it.
    pub fn set_timeout(&mut self, timeout_ms: u64) {
        self.timeout_ms = timeout_ms;
    }

    pub fn is_busy(&self) -> bool {
        self.op.is_some()
    }

    /// Starts `request` at the session's consistency level. One request at
    /// a time: a session is sequential.
    pub fn start(&mut self, request: Request, now_ms: u64) -> Progress {
        self.start_at(request, self.consistency, now_ms)
    }

    /// Starts `request` at `consistency`, for this request only. The session
    /// metadata carries over between levels: a linearizable request first
    /// waits for what the session saw unstable, as a causal write does, so
    /// mixing levels in one session keeps its causal past.
    pub fn start_at(&mut self, request: Request, consistency: Consistency, now_ms: u64) -> Progress {
        assert!(self.op.is_none(), "a driver runs one request at a time");
        self.down.retain(|_, until| *until > now_ms);
        self.op = Some(InFlight {
            request,
            consistency,
            started_ms: now_ms,
            redirects: 0,
            phase: Phase::Writing,
            outstanding: Vec::new(),
            targets: AHashMap::new(),
            write: None,
            resends: 0,
        });
        let p = self.begin(now_ms);
        self.sent(p)
    }

    /// Gives up on a request that has taken longer than the timeout,
    /// retries a write whose head was unreachable once its wait is over,
    /// and resends a write left unanswered for `RESEND_MS`.
    pub fn tick(&mut self, now_ms: u64) -> Progress {
        match &self.op {
            Some(op) if now_ms.saturating_sub(op.started_ms) >= self.timeout_ms => {
                self.op = None;
                Progress { send: Vec::new(), done: Some(Err(ClientError::Timeout)) }
            }
            Some(InFlight { phase: Phase::Retrying { at_ms }, .. }) if now_ms >= *at_ms => {
                let mut p = Progress::default();
                self.refresh(&mut p);
                self.sent(p)
            }
            Some(op @ InFlight { phase: Phase::Writing, .. }) if now_ms.saturating_sub(op.started_ms) / RESEND_MS > op.resends => {
                self.op.as_mut().expect("in flight").resends += 1;
                self.restart(now_ms)
            }
            _ => Progress::default(),
        }
    }

    /// The shell could not send this step's messages to `node` (no
    /// connection): they never left, so even a write can be redone. A write
    /// waits `RETRY_MS`, refreshes the partition map and goes to whichever
    /// node heads the chain then; other work restarts elsewhere now.
    pub fn undeliverable(&mut self, node: NodeId, now_ms: u64) -> Progress {
        let known = self.down.insert(node, now_ms + SUSPECT_MS).is_some();
        let Some(op) = &mut self.op else { return Progress::default() };
        if !op.outstanding.iter().any(|s| op.targets.get(s) == Some(&node)) {
            return Progress::default();
        }
        // Work that may go elsewhere does so at once (the new choice avoids
        // this node); a write, or work with nowhere else to go (it picked a
        // node already known down), waits and retries on a fresh map.
        if matches!(op.phase, Phase::Writing) || known {
            self.retry_later(now_ms);
            return Progress::default();
        }
        self.restart(now_ms)
    }

    fn next_op(&mut self) -> OpId {
        self.next_seq += 1;
        if let Some(op) = &mut self.op {
            op.outstanding.push(self.next_seq);
        }
        OpId { client: self.id, seq: self.next_seq }
    }

    fn random(&mut self, n: usize) -> usize {
        // xorshift64*: deterministic per client, good enough to spread reads.
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        (self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33) as usize % n
    }

    fn set_phase(&mut self, phase: Phase) {
        if let Some(op) = &mut self.op {
            op.phase = phase;
        }
    }

    fn request(&self) -> &Request {
        &self.op.as_ref().expect("in flight").request
    }

    /// The consistency level of the request in flight.
    fn level(&self) -> Consistency {
        self.op.as_ref().map_or(self.consistency, |op| op.consistency)
    }

    fn begin(&mut self, now_ms: u64) -> Progress {
        let mut p = Progress::default();
        match self.request().clone() {
            Request::Get(key) => self.read(&key, false, &mut p),
            Request::Put { .. } => {
                let deps: Vec<(Bytes, Dep)> = match self.level() {
                    Consistency::Causal | Consistency::Linearizable => {
                        self.session.dependencies().map(|(k, d)| (k.clone(), d.clone())).collect()
                    }
                    _ => Vec::new(),
                };
                if !self.stabilize(deps, false, &mut p) {
                    self.write(&mut p);
                }
            }
            Request::MultiGet(keys) if self.level() == Consistency::Linearizable => self.collect(&keys, None, &mut p),
            Request::MultiGet(keys) => self.snapshot(&keys, now_ms, &mut p),
            Request::Count => {
                let mut by_node: BTreeMap<NodeId, Vec<PartitionId>> = BTreeMap::new();
                // At the heads, which hold every write (the session's own
                // included).
                for (partition, chain) in self.topology.chains.iter().enumerate() {
                    by_node.entry(chain.head()).or_default().push(partition as PartitionId);
                }
                self.set_phase(Phase::Counting { remaining: by_node.len(), total: Keyspace::default() });
                for (node, partitions) in by_node {
                    let op = self.next_op();
                    p.send.push((node, Message::Count { op, epoch: self.topology.epoch, partitions }));
                }
            }
            Request::Flush => {
                let nodes: Vec<NodeId> = self.topology.nodes.iter().map(|n| n.id).collect();
                self.set_phase(Phase::Flushing { remaining: nodes.len() });
                for node in nodes {
                    let op = self.next_op();
                    p.send.push((node, Message::Flush { op }));
                }
            }
            Request::Topology => self.refresh(&mut p),
        }
        p
    }

    fn write(&mut self, p: &mut Progress) {
        let Request::Put { key, value, ttl_ms, condition } = self.request().clone() else { unreachable!("write() runs for puts") };
        let partition = self.topology.partition_of(&key);
        let chain = self.topology.chain(partition);
        let ack_at = match self.level() {
            Consistency::Causal => self.topology.shape.k.min(chain.len()) - 1,
            Consistency::Eventual => 0,
            Consistency::Linearizable => ACK_AT_TAIL as usize,
        } as u8;
        let head = chain.head();
        let after = self.session.max_ts();
        let op = self.next_op();
        let write = *self.op.as_mut().expect("in flight").write.get_or_insert(op.seq);
        let epoch = self.topology.epoch;
        p.send.push((head, Message::Put { op, epoch, partition, key, value, ttl_ms, condition, after, ack_at, write }));
        self.set_phase(Phase::Writing);
    }

    fn read(&mut self, key: &Bytes, at_head: bool, p: &mut Progress) {
        let partition = self.topology.partition_of(key);
        let chain = self.topology.chain(partition).clone();
        let (target, min) = if at_head {
            (chain.head(), None)
        } else {
            match self.level() {
                Consistency::Linearizable => {
                    // The session wrote or read a version the tail may not
                    // have yet: wait for it to get there first.
                    if self.stabilize(self.seen_unstable(std::slice::from_ref(key)), true, p) {
                        return;
                    }
                    (chain.tail(), None)
                }
                Consistency::Eventual => (self.pick(&chain.nodes), None),
                Consistency::Causal => {
                    let legal = match self.session.read_limit(key) {
                        Some(limit) => &chain.nodes[..=(limit as usize).min(chain.len() - 1)],
                        None => &chain.nodes[..],
                    };
                    (self.pick(legal), self.session.min_version(key).cloned())
                }
            }
        };
        let op = self.next_op();
        let leased = self.level() == Consistency::Linearizable;
        p.send.push((target, Message::Get { op, epoch: self.topology.epoch, partition, key: key.clone(), min, leased }));
        self.set_phase(Phase::Reading);
    }

    /// The local node if it may serve, else a random legal one.
    fn pick(&mut self, legal: &[NodeId]) -> NodeId {
        let up: Vec<NodeId> = legal.iter().copied().filter(|n| !self.down.contains_key(n)).collect();
        let legal = if up.is_empty() { legal } else { &up[..] };
        match self.local {
            Some(me) if legal.contains(&me) => me,
            _ => legal[self.random(legal.len())],
        }
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

    /// Records where this step's messages went, so that a node found
    /// unreachable can be routed around.
    fn sent(&mut self, p: Progress) -> Progress {
        if let Some(op) = &mut self.op {
            for (node, msg) in &p.send {
                if let Some(id) = msg.op() {
                    op.targets.insert(id.seq, *node);
                }
            }
        }
        p
    }

    /// The shell found `node` unreachable (its connection closed). Reads,
    /// stability checks and other idempotent work waiting on it start over
    /// elsewhere; a write waits (it may have been applied) until the
    /// configuration changes or the request times out.
    pub fn unreachable(&mut self, node: NodeId, now_ms: u64) -> Progress {
        self.down.insert(node, now_ms + SUSPECT_MS);
        let Some(op) = &self.op else { return Progress::default() };
        let waits_on_it = op.outstanding.iter().any(|s| op.targets.get(s) == Some(&node));
        if !waits_on_it || matches!(op.phase, Phase::Writing | Phase::Flushing { .. } | Phase::Retrying { .. }) {
            return Progress::default();
        }
        self.restart(now_ms)
    }

    /// The site moved to `topology` while a request may be in flight: work
    /// that is safe to repeat starts over on the new chains.
    pub fn reconfigured(&mut self, topology: Arc<Topology>, now_ms: u64) -> Progress {
        if topology.epoch <= self.topology.epoch {
            return Progress::default();
        }
        self.topology = topology;
        self.down.clear();
        match &self.op {
            // A write is resent with its id: a new head that already has it
            // (the old head forwarded it before failing) answers instead of
            // applying it again (ChainReaction §3.3.3: the proxy
            // retransmits to the new head). A write that reached no
            // survivor is applied now. A flush or a pending retry waits.
            Some(op) if !matches!(op.phase, Phase::Flushing { .. } | Phase::Retrying { .. }) => self.restart(now_ms),
            _ => Progress::default(),
        }
    }

    /// Drops what the request waits for and retries it on a fresh map
    /// after `RETRY_MS`.
    fn retry_later(&mut self, now_ms: u64) {
        if let Some(op) = &mut self.op {
            op.outstanding.clear();
            op.targets.clear();
            op.phase = Phase::Retrying { at_ms: now_ms + RETRY_MS };
        }
    }

    fn restart(&mut self, now_ms: u64) -> Progress {
        if let Some(op) = &mut self.op {
            op.outstanding.clear();
            op.targets.clear();
        }
        let p = self.begin(now_ms);
        self.sent(p)
    }

    fn snapshot(&mut self, keys: &[Bytes], now_ms: u64, p: &mut Progress) {
        let at = self.session.max_ts().max(Timestamp::new(now_ms, 0));
        let mut by_head: BTreeMap<NodeId, KeysAt> = BTreeMap::new();
        for (i, key) in keys.iter().enumerate() {
            let partition = self.topology.partition_of(key);
            let entry = by_head.entry(self.topology.chain(partition).head()).or_default();
            entry.0.push((partition, key.clone()));
            entry.1.push(i);
        }
        let mut parts = AHashMap::new();
        for (head, (keys, positions)) in by_head {
            let op = self.next_op();
            p.send.push((head, Message::SnapshotRead { op, epoch: self.topology.epoch, at, keys }));
            parts.insert(op.seq, positions);
        }
        self.set_phase(Phase::Snapshot { items: vec![None; keys.len()], parts });
        if keys.is_empty() {
            p.done = self.finish(Ok(Response::Values(Vec::new())));
        }
    }

    /// The versions of `keys` this session saw and does not know stable.
    fn seen_unstable(&self, keys: &[Bytes]) -> Vec<(Bytes, Dep)> {
        let seen = keys.iter().filter_map(|k| self.session.seen(k).map(|s| (k.clone(), s)));
        seen.map(|(k, s)| (k, Dep { version: s.version.clone(), seq: s.seq })).collect()
    }

    /// Asks replicas to confirm `deps` reached their tails, then (`Stable`)
    /// reads (`then_read`) or writes. False if there is nothing to wait for.
    fn stabilize(&mut self, deps: Vec<(Bytes, Dep)>, then_read: bool, p: &mut Progress) -> bool {
        if deps.is_empty() {
            return false;
        }
        let mut waiting = AHashMap::new();
        for (key, dep) in deps {
            let partition = self.topology.partition_of(&key);
            // Any replica learns stability; our own node (no hop) if it is
            // one, else the tail (which knows first).
            let at = self.stability_witness(&self.topology.chain(partition).nodes.clone());
            let op = self.next_op();
            p.send.push((at, Message::WaitStable { op, epoch: self.topology.epoch, partition, seq: dep.seq }));
            waiting.insert(op.seq, (key, dep.version));
        }
        self.set_phase(Phase::Stabilizing { deps: waiting, then_read });
        true
    }

    /// A linearizable MGET: every key read at its tail, in rounds ("double
    /// collect"). When no version changed between two consecutive rounds,
    /// each value was the current one for the whole time between them, so
    /// the read takes effect there; otherwise the last round is compared
    /// with a new one, until the request times out. A session that saw some
    /// of the keys unstable first waits for those versions to reach the
    /// tail, as a linearizable GET does.
    fn collect(&mut self, keys: &[Bytes], previous: Option<Vec<Item>>, p: &mut Progress) {
        if keys.is_empty() {
            p.done = self.finish(Ok(Response::Values(Vec::new())));
            return;
        }
        if previous.is_none() && self.stabilize(self.seen_unstable(keys), true, p) {
            return;
        }
        let mut parts = AHashMap::new();
        for (i, key) in keys.iter().enumerate() {
            let partition = self.topology.partition_of(key);
            let op = self.next_op();
            let get = Message::Get { op, epoch: self.topology.epoch, partition, key: key.clone(), min: None, leased: true };
            p.send.push((self.topology.chain(partition).tail(), get));
            parts.insert(op.seq, i);
        }
        self.set_phase(Phase::Collect { items: vec![None; keys.len()], parts, previous });
    }

    fn refresh(&mut self, p: &mut Progress) {
        let nodes: Vec<NodeId> = self.topology.nodes.iter().map(|n| n.id).collect();
        let node = self.pick(&nodes);
        let op = self.next_op();
        p.send.push((node, Message::GetTopology { op }));
        self.set_phase(Phase::Refreshing);
    }

    fn finish(&mut self, result: Result<Response, ClientError>) -> Option<Result<Response, ClientError>> {
        self.op = None;
        Some(result)
    }

    /// A reply from a node. Replies to earlier or abandoned requests are
    /// ignored.
    pub fn on_message(&mut self, msg: Message, now_ms: u64) -> Progress {
        let p = self.handle(msg, now_ms);
        self.sent(p)
    }

    fn handle(&mut self, msg: Message, now_ms: u64) -> Progress {
        let mut p = Progress::default();
        let Some(op) = msg.op() else { return p };
        let Some(inflight) = &mut self.op else {
            return p;
        };
        if op.client != self.id {
            return p;
        }
        match inflight.outstanding.iter().position(|&s| s == op.seq) {
            Some(pos) => {
                inflight.outstanding.swap_remove(pos);
            }
            // The write's acknowledgement answers its first attempt even
            // after a resend.
            // A "not written" answer (NX/XX) counts only from the attempt
            // in flight: an earlier attempt's may be stale.
            None if matches!(msg, Message::PutDone { version: Some(_), .. }) && inflight.write == Some(op.seq) => {}
            None => return p,
        }
        match msg {
            Message::Refused { reason: Refusal::NotResponsible { .. }, .. } | Message::Refused { reason: Refusal::SnapshotTooOld, .. } => {
                let inflight = self.op.as_mut().expect("in flight");
                inflight.redirects += 1;
                inflight.outstanding.clear();
                if inflight.redirects > MAX_REDIRECTS {
                    self.retry_later(now_ms);
                } else if matches!(msg, Message::Refused { reason: Refusal::SnapshotTooOld, .. }) {
                    return self.begin(now_ms);
                } else {
                    self.refresh(&mut p);
                }
            }
            Message::Refused { reason: Refusal::Unavailable { alive, needed }, .. } => {
                p.done = self.finish(Err(ClientError::Unavailable { alive, needed }));
            }
            Message::Refused { reason: Refusal::Behind | Refusal::NoLease, .. } => {
                if self.level() == Consistency::Linearizable {
                    // The tail is still joining (fetching the partition's
                    // state), or holds no lease (it may have been removed).
                    // The head would answer with versions the tail may not
                    // have acknowledged yet: wait, then ask the tail of a
                    // fresh map.
                    self.retry_later(now_ms);
                    return p;
                }
                let Request::Get(key) = self.request().clone() else {
                    return p;
                };
                // The replica's chain index is stale: go to the head, which
                // has every version (ChainReaction §3.3.3). If even the head
                // lacks it, the data is gone (FLUSHALL) and the head's answer
                // is the truth.
                self.read(&key, true, &mut p);
            }
            Message::TopologyIs { topology, .. } => {
                self.topology = Arc::new(topology);
                if matches!(self.request(), Request::Topology) {
                    let t = self.topology.clone();
                    p.done = self.finish(Ok(Response::Topology(t)));
                } else {
                    return self.begin(now_ms);
                }
            }
            Message::Stable { .. } => {
                let Some(InFlight { phase: Phase::Stabilizing { deps, then_read }, .. }) = &mut self.op else {
                    return p;
                };
                let then_read = *then_read;
                if let Some((key, version)) = deps.remove(&op.seq) {
                    self.session.forget(&key, &version);
                }
                if deps.is_empty() {
                    match self.request().clone() {
                        Request::Get(key) if then_read => self.read(&key, false, &mut p),
                        Request::MultiGet(keys) if then_read => self.collect(&keys, None, &mut p),
                        _ => self.write(&mut p),
                    }
                }
            }
            Message::PutDone { version, seq, chain_index, stable, .. } => {
                let Request::Put { key, .. } = self.request().clone() else {
                    return p;
                };
                if let Some(version) = &version {
                    if self.level() != Consistency::Eventual {
                        self.session.observe_write(&key, version, seq, chain_index, stable);
                    }
                }
                p.done = self.finish(Ok(Response::Written(version.is_some())));
            }
            Message::Value { item, .. } if matches!(self.op, Some(InFlight { phase: Phase::Collect { .. }, .. })) => {
                let Some(InFlight { phase: Phase::Collect { items, parts, previous }, .. }) = &mut self.op else {
                    unreachable!("matched above")
                };
                let Some(pos) = parts.remove(&op.seq) else {
                    return p;
                };
                items[pos] = Some(item);
                if parts.is_empty() {
                    let items: Vec<Item> = std::mem::take(items).into_iter().map(|i| i.expect("every key answered")).collect();
                    let unchanged = previous.as_ref().is_some_and(|prev| prev.iter().zip(&items).all(|(a, b)| a.version == b.version));
                    let Request::MultiGet(keys) = self.request().clone() else {
                        return p;
                    };
                    if !unchanged {
                        self.collect(&keys, Some(items), &mut p);
                        return p;
                    }
                    for (key, item) in keys.iter().zip(&items) {
                        self.session.observe_read(key, item, 0);
                    }
                    p.done = self.finish(Ok(Response::Values(items.into_iter().map(|i| i.value).collect())));
                }
            }
            Message::Value { item, chain_index, .. } => {
                let Request::Get(key) = self.request().clone() else {
                    return p;
                };
                if self.level() != Consistency::Eventual {
                    self.session.observe_read(&key, &item, chain_index);
                }
                p.done = self.finish(Ok(Response::Read { value: item.value, chain_index }));
            }
            Message::Snapshot { items: got, .. } => {
                let Some(InFlight { phase: Phase::Snapshot { items, parts, .. }, .. }) = &mut self.op else {
                    return p;
                };
                let Some(positions) = parts.remove(&op.seq) else {
                    return p;
                };
                for (pos, item) in positions.into_iter().zip(got) {
                    items[pos] = Some(item);
                }
                if parts.is_empty() {
                    let items: Vec<Item> = std::mem::take(items).into_iter().map(|i| i.expect("every key answered")).collect();
                    let Request::MultiGet(keys) = self.request().clone() else {
                        return p;
                    };
                    if self.level() != Consistency::Eventual {
                        for (key, item) in keys.iter().zip(&items) {
                            self.session.observe_read(key, item, 0);
                        }
                    }
                    p.done = self.finish(Ok(Response::Values(items.into_iter().map(|i| i.value).collect())));
                }
            }
            Message::Counted { keyspace, .. } => {
                let Some(InFlight { phase: Phase::Counting { remaining, total }, .. }) = &mut self.op else {
                    return p;
                };
                *remaining -= 1;
                *total += keyspace;
                if *remaining == 0 {
                    let total = *total;
                    p.done = self.finish(Ok(Response::Count(total)));
                }
            }
            Message::Flushed { .. } => {
                let Some(InFlight { phase: Phase::Flushing { remaining }, .. }) = &mut self.op else {
                    return p;
                };
                *remaining -= 1;
                if *remaining == 0 {
                    self.session.clear();
                    p.done = self.finish(Ok(Response::Flushed));
                }
            }
            _ => {}
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::{NodeInfo, Shape};

    fn site() -> Arc<Topology> {
        let nodes = (0..3).map(|id| NodeInfo { id, addr: format!("n{id}") }).collect();
        Arc::new(Topology::new(1, Shape { partitions: 4, replicas: 3, k: 2 }, nodes).unwrap())
    }

    #[test]
    fn a_read_waiting_on_an_unreachable_node_goes_elsewhere() {
        let mut d = Driver::new(7, site(), None, 5_000);
        let p = d.start(Request::Get(Bytes::from("k")), 0);
        let first = p.send[0].0;
        let p = d.unreachable(first, 10);
        assert_eq!(p.send.len(), 1);
        assert_ne!(p.send[0].0, first, "the read moved to another replica");
        // The old reply is ignored; the new one completes the read.
        let Message::Get { op, .. } = p.send[0].1.clone() else { panic!("expected a Get") };
        let item = Item { value: Some(Bytes::from("v")), version: None, seq: 0, stable: true };
        let done = d.on_message(Message::Value { op, item, chain_index: 2 }, 20).done;
        assert_eq!(done, Some(Ok(Response::Read { value: Some(Bytes::from("v")), chain_index: 2 })));
    }

    #[test]
    fn a_write_keeps_waiting_when_its_head_is_unreachable() {
        let mut d = Driver::new(7, site(), None, 5_000);
        let put = Request::Put { key: Bytes::from("k"), value: Some(Bytes::from("v")), ttl_ms: None, condition: Condition::Always };
        let p = d.start(put, 0);
        let head = p.send[0].0;
        assert!(d.unreachable(head, 10).send.is_empty(), "a write is not resent: it may have been applied");
        assert!(d.is_busy());
    }

    #[test]
    fn a_write_that_never_left_is_retried_on_a_fresh_map() {
        let mut d = Driver::new(7, site(), None, 5_000);
        let put = Request::Put { key: Bytes::from("k"), value: Some(Bytes::from("v")), ttl_ms: None, condition: Condition::Always };
        let head = d.start(put, 0).send[0].0;
        assert!(d.undeliverable(head, 10).send.is_empty());
        assert!(d.tick(100).send.is_empty(), "it waits a little first");
        let p = d.tick(10 + RETRY_MS);
        let [(asked, Message::GetTopology { op })] = &p.send[..] else { panic!("expected a topology refresh, got {:?}", p.send) };
        assert_ne!(*asked, head);
        // The site moved on: the chain has a new head.
        let mut t = (**d.topology()).clone().without(head);
        t.epoch = 2;
        let new_head = t.chain(t.partition_of(b"k")).head();
        let p = d.on_message(Message::TopologyIs { op: *op, topology: t }, 300);
        assert!(matches!(&p.send[..], [(n, Message::Put { .. })] if *n == new_head));
    }

    #[test]
    fn a_request_can_run_at_its_own_level() {
        let t = site();
        let mut d = Driver::new(7, t.clone(), Some(0), 5_000);
        let chain = t.chain(t.partition_of(b"k")).clone();
        let put = Request::Put { key: Bytes::from("k"), value: Some(Bytes::from("v")), ttl_ms: None, condition: Condition::Always };
        let p = d.start_at(put, Consistency::Linearizable, 0);
        let [(_, Message::Put { op, ack_at, .. })] = &p.send[..] else { panic!("expected a put, got {:?}", p.send) };
        assert_eq!(*ack_at, ACK_AT_TAIL, "answered by the tail");
        let version = Version::local(0, Timestamp { physical_ms: 1, logical: 0 });
        let acked = Message::PutDone { op: *op, version: Some(version), seq: 1, chain_index: 2, stable: true };
        assert_eq!(d.on_message(acked, 1).done, Some(Ok(Response::Written(true))));
        // The session's level is unchanged; a linearizable read goes to the tail.
        assert_eq!(d.consistency(), Consistency::Causal);
        let p = d.start_at(Request::Get(Bytes::from("k")), Consistency::Linearizable, 2);
        assert!(matches!(&p.send[..], [(n, Message::Get { .. })] if *n == chain.tail()), "got {:?}", p.send);
    }

    #[test]
    fn a_linearizable_write_first_waits_for_what_the_session_saw_unstable() {
        let t = site();
        let mut d = Driver::new(7, t.clone(), None, 5_000);
        // A causal read of a version not yet at the tail.
        let p = d.start(Request::Get(Bytes::from("a")), 0);
        let [(at, Message::Get { op, .. })] = &p.send[..] else { panic!("expected a get") };
        let version = Version::local(0, Timestamp { physical_ms: 1, logical: 0 });
        let item = Item { value: Some(Bytes::from("x")), version: Some(version), seq: 4, stable: false };
        let at = t.chain(t.partition_of(b"a")).index_of(*at).unwrap() as u8;
        assert!(d.on_message(Message::Value { op: *op, item, chain_index: at }, 1).done.is_some());
        let put = Request::Put { key: Bytes::from("b"), value: Some(Bytes::from("v")), ttl_ms: None, condition: Condition::Always };
        let p = d.start_at(put, Consistency::Linearizable, 2);
        assert!(matches!(&p.send[..], [(_, Message::WaitStable { seq: 4, .. })]), "got {:?}", p.send);
    }
}
