//! One node's replica of one partition: a link of a ChainReaction chain.
//!
//! ChainReaction §3.3 changes classic chain replication (§2.3.4) in two ways:
//!
//! * A write is ordered at the head, forwarded *eagerly* down to position
//!   k-1 (0-based), which answers the client, and then *lazily* to the tail.
//!   When it reaches the tail it is *stable* and a `StableUpTo` flows back to
//!   the head. Any prefix of the chain holds every write that any later
//!   position holds ("the update invariant"), so a client that saw a version
//!   at position i may read from any position <= i, and from anywhere once
//!   that version is stable.
//! * Reads are served by every replica, each returning its own latest
//!   version, its chain position and whether that version is stable; the
//!   client library (`session`) turns that into the metadata that keeps its
//!   reads causal+.
//!
//! Updates carry a per-partition sequence number. A replica applies them in
//! order, parks early arrivals and drops duplicates, and keeps every update it
//! forwarded until it is known stable, resending them when the successor goes
//! quiet. Acknowledgements are cumulative (`StableUpTo`), so a lost
//! acknowledgement is repaired by the next one, and a duplicate update is
//! answered with the receiver's stable watermark. This is what lets the
//! simulator drop and reorder messages, and what chain repair (issue 3) will
//! use to retransmit in-flight writes after a failure.
//!
//! Get-transactions (ChainReaction §3.5) are served by heads: see
//! `snapshot_read`.

use crate::geo::receiver::RemoteWrite;
use crate::hlc::{Clock, Timestamp};
use crate::message::{send, ClientId, Condition, Dest, Envelope, Item, Message, OpId, Outbox, Refusal, Update};
use crate::record::LogRecord;
use crate::ring::{NodeId, PartitionId, Topology};
use crate::store::{PartitionStore, Stored};
use crate::version::{SiteId, Version, VersionVector};
use ahash::AHashMap;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};

/// Resend unacknowledged updates to the successor after this long without
/// progress.
pub const RETRANSMIT_MS: u64 = 200;

/// A replica's state in brief, to compare replicas.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Digest {
    pub applied: u64,
    pub stable: u64,
    /// Every key's latest version, sorted by key.
    pub latest: Vec<(Bytes, Stored)>,
}

impl Digest {
    /// A hash of every key's latest version and value.
    pub fn fingerprint(&self) -> u64 {
        xxhash_rust::xxh3::xxh3_64(&crate::wire::encode(&self.latest))
    }
}

/// A write as the head receives it.
#[derive(Clone, Debug)]
pub struct PutRequest {
    pub op: OpId,
    pub key: Bytes,
    pub value: Option<Bytes>,
    pub ttl_ms: Option<u64>,
    pub condition: Condition,
    /// The session's causal past (`Message::Put`).
    pub past: VersionVector,
    pub ack_at: u8,
    /// The write's id in its session (see `Message::Put`).
    pub write: u64,
}

/// How long a replica remembers a session's last write, to recognise it
/// when it is resent after a failure (well past any request timeout).
pub const WRITE_MEMORY_MS: u64 = 60_000;

/// How many bytes of recent updates (keys and values) a replica keeps for
/// a successor that returns after a short absence (`ChainReplica::fetch`):
/// values are shared with the store, so this costs memory only for values
/// overwritten since. Past it, a returning node gets the whole state.
pub const RECENT_BYTES: usize = 256 * 1024;

/// The history after `u`, given the history before it: a hash chain over
/// each update's position, key, version and value.
fn chain_history(before: u64, u: &Update) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::with_seed(before);
    h.update(&u.seq.to_le_bytes());
    h.update(&(u.key.len() as u64).to_le_bytes());
    h.update(&u.key);
    h.update(&u.version.ts.physical_ms().to_le_bytes());
    h.update(&(u.version.ts.logical() as u32).to_le_bytes());
    h.update(&[u.version.site as u8]);
    match &u.value {
        Some(v) => {
            h.update(&[1]);
            h.update(v);
        }
        None => h.update(&[0]),
    }
    h.update(&u.expires_at_ms.unwrap_or(0).to_le_bytes());
    h.digest()
}

fn update_bytes(u: &Update) -> usize {
    u.key.len() + u.value.as_ref().map_or(0, |v| v.len()) + 64
}

/// A replica's state as a state transfer or a checkpoint carries it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PartitionState {
    pub applied: u64,
    pub stable: u64,
    /// Every key's latest version.
    pub entries: Vec<(Bytes, Stored)>,
    /// Each session's last write, so that a resent write is still
    /// recognised by a replica that got its state this way.
    pub sessions: Vec<(ClientId, LastWrite)>,
    /// The partition's update history up to `applied`, hashed
    /// (`ChainReplica::history`).
    pub history: u64,
    /// This site's updates not known to have reached every stabilizer
    /// replica and other site (several sites only; `ChainReplica::
    /// outgoing`).
    pub unreported: Vec<Update>,
}

/// A session's last write this replica applied.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LastWrite {
    key: Bytes,
    write: u64,
    seq: u64,
    version: Version,
    at_ms: u64,
}

/// How far ahead of a promise the logged clock ceiling goes
/// (`ChainReplica::cover`): one log record per partition per this much.
const CEILING_MS: u64 = 1_000;

/// This node's replica of one partition.
#[derive(Debug)]
pub struct ChainReplica {
    partition: PartitionId,
    epoch: u64,
    site: SiteId,
    /// The chain, head first, and this replica's position in it.
    chain: Vec<NodeId>,
    index: usize,
    /// Writes need this many live replicas (k).
    k: usize,
    /// Joined the chain and still waiting for the partition's state from its
    /// predecessor (the paper's "zombie" node): applies nothing, serves no
    /// reads.
    joining: bool,
    /// Moved up the chain past nodes that may hold more: serves nothing
    /// until it has what its successor had (`catch_up`).
    catching_up: bool,
    /// What this replica had not known stable at its last reconfiguration:
    /// a predecessor that moved up past it may need it (`catch_up`), even
    /// once the new order's acknowledgements have pruned `unstable`.
    handoff: Vec<Update>,
    /// A predecessor's `CatchUp` that came while this replica was catching
    /// up itself: answered once it has (node, after).
    owed: Option<(NodeId, u64)>,
    store: PartitionStore,
    /// Orders writes at the head.
    clock: Clock,
    /// No promise this replica made or passed on is above this, and the
    /// log holds it (`LogRecord::Clock`, `cover`).
    ceiling: Timestamp,
    /// Highest seq applied (all below it are applied too).
    applied: u64,
    /// A hash of every update applied, in order (`chain_history`): two
    /// replicas at the same `applied` with the same history hold the same
    /// updates, so a returning replica needs only what came after.
    history: u64,
    /// The latest updates applied, each with the history before it, up to
    /// `RECENT_BYTES`: what a returning successor may lack (`fetch`).
    recent: VecDeque<(Update, u64)>,
    recent_bytes: usize,
    /// Highest seq known to have reached the tail.
    stable: u64,
    /// Highest seq known to be on k replicas (`durable`), as the
    /// successors said; kept by replicas before the k-th only.
    durable: u64,
    /// Applied here, forwarded, not yet known stable: resent on silence.
    unstable: VecDeque<Update>,
    /// Arrived ahead of a gap.
    early: BTreeMap<u64, Update>,
    /// Applied in the current step, to be logged before its effects leave.
    to_log: Vec<Update>,
    /// Records for the write-ahead log, in the order they were produced
    /// (`take_log`).
    log: Vec<LogRecord>,
    /// Replies to send once the update with this seq is stable:
    /// dependency-stabilization answers, acknowledgements of resent
    /// writes, and the receiver's `Applied` for remote writes.
    waiters: BTreeMap<u64, Vec<Envelope>>,
    /// With several sites: every update up to this seq has reached every
    /// stabilizer replica and every other site (`geo`), so a new tail need
    /// not send it again. `None` with one site.
    reported: Option<u64>,
    /// With several sites: this site's updates applied here and not known
    /// reported, in seq order: what a new tail starts its reporter with.
    /// Carried by state transfers and checkpoints, rebuilt by replay.
    outgoing: VecDeque<Update>,
    /// The highest seq of `outgoing` handed to the node's reporter (the
    /// tail's, several sites only).
    handed: u64,
    /// How far this replica's log is on disk (`Node::synced`): a tail hands
    /// its reporter, and so other sites, only updates and promises its disk
    /// holds. A site whose machines all crash loses what its disks had not
    /// synced (`fsync=everysec`); no other site may have applied it.
    on_disk: u64,
    /// Log tickets (`Node::take_log`'s numbers) not known synced yet, with
    /// how far this replica had applied when each was taken.
    marks: VecDeque<(u64, u64)>,
    /// A promise (`make_promise`) to pass down the chain, or, at the tail,
    /// to report, once everything up to its seq is applied here.
    promise: Option<(u64, Timestamp)>,
    /// Concurrent writes of one key from different sites this head
    /// resolved by last-writer-wins, and the latest few of them.
    conflicts: u64,
    recent_conflicts: VecDeque<Conflict>,
    /// Each session's last write applied here (sessions are sequential, so
    /// one per session), to apply a resent write only once.
    last_writes: AHashMap<ClientId, LastWrite>,
    /// When `last_writes` was last pruned.
    pruned_ms: u64,
    /// When the successor last made progress (or we last resent).
    last_progress_ms: u64,
    /// When this replica last asked for what it lacks: the state, from its
    /// predecessor, while joining; the suffix, from its successor, while
    /// catching up. Asked again every `RETRANSMIT_MS` until answered, apart
    /// from `last_progress_ms`: writes flowing past a member that moved up
    /// keep its successor making progress, yet its request may have been
    /// lost, or ignored by a successor not in the new order yet.
    asked_ms: u64,
    /// Since when updates have waited behind a gap (see `tick`).
    gap_since_ms: Option<u64>,
}

impl ChainReplica {
    /// `me`'s replica of `partition`, if `me` is in its chain.
    pub fn new(topology: &Topology, partition: PartitionId, me: NodeId, site: SiteId) -> Option<Self> {
        let chain = topology.chain(partition);
        let index = chain.index_of(me)?;
        Some(ChainReplica::at(partition, site, topology.epoch, chain.nodes.clone(), index, topology.shape.k))
    }

    /// An empty replica at position `index` of `chain`.
    fn at(partition: PartitionId, site: SiteId, epoch: u64, chain: Vec<NodeId>, index: usize, k: usize) -> Self {
        ChainReplica {
            partition,
            epoch,
            site,
            chain,
            index,
            k,
            joining: false,
            catching_up: false,
            handoff: Vec::new(),
            owed: None,
            store: PartitionStore::default(),
            clock: Clock::default(),
            ceiling: Timestamp::ZERO,
            applied: 0,
            history: 0,
            recent: VecDeque::new(),
            recent_bytes: 0,
            stable: 0,
            unstable: VecDeque::new(),
            early: BTreeMap::new(),
            to_log: Vec::new(),
            log: Vec::new(),
            waiters: BTreeMap::new(),
            last_writes: AHashMap::new(),
            pruned_ms: 0,
            last_progress_ms: 0,
            asked_ms: 0,
            gap_since_ms: None,
            durable: 0,
            reported: None,
            outgoing: VecDeque::new(),
            handed: 0,
            on_disk: 0,
            marks: VecDeque::new(),
            promise: None,
            conflicts: 0,
            recent_conflicts: VecDeque::new(),
        }
    }

    /// A replica recovered from the log, in no chain yet (epoch 0, alone,
    /// and no tail): `reconfigure` gives it its place once the node is
    /// admitted.
    pub fn detached(partition: PartitionId, me: NodeId, site: SiteId, k: usize) -> Self {
        ChainReplica::at(partition, site, 0, vec![me], 0, k)
    }

    /// A replica of a partition that starts empty (the site's birth): its
    /// log starts with the empty state, as every replica's log starts with
    /// a state record (see `node::Node::recover`).
    pub fn born(topology: &Topology, partition: PartitionId, me: NodeId, site: SiteId) -> Option<Self> {
        let mut r = ChainReplica::new(topology, partition, me, site)?;
        r.log.push(LogRecord::State { partition, state: r.state() });
        Some(r)
    }

    /// Still waiting for the partition's state (a node that just joined).
    pub fn is_joining(&self) -> bool {
        self.joining
    }

    /// Catching up from its successor after moving up the chain (it holds
    /// the partition's data, maybe without the latest updates).
    pub fn is_catching_up(&self) -> bool {
        self.catching_up
    }

    /// The highest sequence number applied here.
    pub fn applied(&self) -> u64 {
        self.applied
    }

    /// A detached replica (epoch 0, recovered from the log) is no tail: it
    /// keeps what it does not know stable, to resend it once it has a place.
    fn is_tail(&self) -> bool {
        self.epoch != 0 && self.index + 1 == self.chain.len()
    }

    fn successor(&self) -> Option<NodeId> {
        self.chain.get(self.index + 1).copied()
    }

    fn predecessor(&self) -> Option<NodeId> {
        self.index.checked_sub(1).map(|i| self.chain[i])
    }

    fn refuse(&self, out: &mut Outbox, op: OpId, reason: Refusal) {
        send(out, Dest::Client(op.client), Message::Refused { op, reason });
    }

    fn not_responsible(&self, out: &mut Outbox, op: OpId) {
        self.refuse(out, op, Refusal::NotResponsible { epoch: self.epoch });
    }

    /// Whether this replica heads its chain (client writes are ordered here).
    pub fn is_head(&self) -> bool {
        self.index == 0
    }

    /// A write at the head: order it, apply it, start it down the chain.
    pub fn put(&mut self, req: PutRequest, now_ms: u64, out: &mut Outbox) {
        if self.index != 0 || self.catching_up {
            // A head still catching up would order writes over sequence
            // numbers its successor may hold: the client retries shortly.
            return self.not_responsible(out, req.op);
        }
        if self.chain.len() < self.k {
            // Acknowledging with fewer than k copies would promise durability
            // we do not have (ChainReaction §3.3.3: R - k failures tolerated).
            return self.refuse(out, req.op, Refusal::Unavailable { alive: self.chain.len() as u8, needed: self.k as u8 });
        }
        let write = OpId { client: req.op.client, seq: req.write };
        if self.last_writes.get(&write.client).is_some_and(|l| write.seq < l.write) {
            // A late resend of an earlier write of this session (resent on a
            // new configuration, overtaken by the session's next write):
            // the session has moved on, so that write was answered or given
            // up on, and applying it now would put an old value over a
            // newer one. Dropped; nobody waits for an answer.
            return;
        }
        if let Some(last) = self.last_writes.get(&write.client).filter(|l| l.write == write.seq && l.key == req.key) {
            // A resend of a write this chain already has (its first head
            // failed after forwarding it): answer once it is stable, which
            // satisfies every level, instead of applying it twice.
            let chain_index = (self.chain.len() - 1) as u8;
            let done = Message::PutDone { op: write, version: Some(last.version.clone()), seq: last.seq, chain_index, stable: true };
            return self.when_stable(last.seq, Envelope { to: Dest::Client(write.client), msg: done }, out);
        }
        let current = self.store.latest(&req.key).and_then(|s| s.live_value(now_ms)).is_some();
        let holds = match req.condition {
            Condition::Always => true,
            Condition::IfAbsent => !current,
            Condition::IfPresent => current,
        };
        if !holds {
            let msg = Message::PutDone { op: req.op, version: None, seq: 0, chain_index: 0, stable: false };
            return send(out, Dest::Client(req.op.client), msg);
        }
        let ts = self.clock.tick(now_ms, req.past.max());
        let local_dep = req.past.get(self.site);
        let mut vv = req.past;
        vv.set(self.site, ts);
        let update = Update {
            seq: self.applied + 1,
            key: req.key,
            version: Version { ts, site: self.site, vv },
            value: req.value,
            expires_at_ms: req.ttl_ms.map(|t| now_ms.saturating_add(t)),
            ack: Some((write, req.ack_at)),
            local_dep,
        };
        let mut effects = Outbox::new();
        let mut forward = Vec::with_capacity(1);
        self.apply(update, now_ms, &mut forward, &mut effects);
        self.flush(forward, now_ms, &mut effects);
        self.emit(effects, out);
    }

    /// Puts a step's effects in `out` and the updates it applied in the log
    /// records (`take_log`): the node makes those durable (per its fsync
    /// policy) before anything of the step leaves it.
    fn emit(&mut self, effects: Outbox, out: &mut Outbox) {
        if !self.to_log.is_empty() {
            let updates = std::mem::take(&mut self.to_log);
            self.log.push(LogRecord::Updates { partition: self.partition, updates });
        }
        out.extend(effects);
    }

    /// The log records produced since the last call, in order.
    pub fn take_log(&mut self) -> Vec<LogRecord> {
        std::mem::take(&mut self.log)
    }

    /// Updates from the predecessor.
    pub fn forward(&mut self, updates: Vec<Update>, now_ms: u64, out: &mut Outbox) {
        if self.joining {
            // Kept until the state transfer says where they start.
            self.early.extend(updates.into_iter().map(|u| (u.seq, u)));
            return;
        }
        let mut effects = Outbox::new();
        let mut forward = Vec::with_capacity(updates.len());
        let mut duplicate = false;
        for u in updates {
            if u.seq <= self.applied {
                duplicate = true;
                // Already here, maybe inside the state transfer that
                // installed this replica: its answer may never have been
                // sent (answering twice is harmless).
                self.answer(&u, &mut effects);
            } else if u.seq == self.applied + 1 {
                self.apply(u, now_ms, &mut forward, &mut effects);
                while let Some(next) = self.early.remove(&(self.applied + 1)) {
                    self.apply(next, now_ms, &mut forward, &mut effects);
                }
            } else {
                self.early.insert(u.seq, u);
            }
        }
        if duplicate && self.stable > 0 {
            // The predecessor resent what we have: our acknowledgement may
            // have been lost.
            self.ack_upwards(&mut effects);
        }
        self.flush(forward, now_ms, &mut effects);
        self.emit(effects, out);
    }

    /// Recovery: re-applies updates read back from this node's log (those
    /// after its last state record), sending nothing. They are sorted by
    /// sequence number first: the log holds them in the order they were
    /// applied, but a replay must not depend on it. Updates not known
    /// stable are kept for the successor, which is sent them once the node
    /// serves again (duplicates are ignored there); a checkpoint's list of
    /// such updates lands here too. Returns the first missing sequence
    /// number if the log has a gap: nothing after it is applied (it is
    /// recovered from the chain instead, never guessed).
    pub fn replay(&mut self, mut updates: Vec<Update>, now_ms: u64) -> Option<u64> {
        updates.sort_by_key(|u| u.seq);
        updates.dedup_by_key(|u| u.seq);
        let mut forward = Vec::new();
        let mut ignored = Outbox::new();
        let mut gap = None;
        for u in updates {
            if u.seq == self.applied + 1 {
                self.apply(u, now_ms, &mut forward, &mut ignored);
            } else if u.seq > self.applied + 1 {
                gap = Some(self.applied + 1);
                break;
            } else if !self.is_tail() && u.seq > self.stable && !self.unstable.iter().any(|x| x.seq == u.seq) {
                let at = self.unstable.partition_point(|x| x.seq < u.seq);
                self.unstable.insert(at, u);
            }
        }
        self.to_log.clear();
        for u in forward {
            let at = self.unstable.partition_point(|x| x.seq < u.seq);
            self.unstable.insert(at, u);
        }
        gap
    }

    /// This replica as log records, for compacting the log: its state and
    /// the updates not yet known stable. Empty while the replica is still
    /// joining.
    pub fn checkpoint(&self) -> Vec<LogRecord> {
        if self.joining {
            return Vec::new();
        }
        let state = LogRecord::State { partition: self.partition, state: self.state() };
        let unstable = LogRecord::Updates { partition: self.partition, updates: self.unstable.iter().cloned().collect() };
        let behind = LogRecord::Behind { partition: self.partition, behind: self.catching_up };
        let clock = LogRecord::Clock { partition: self.partition, ceiling: self.ceiling };
        vec![state, unstable, behind, clock]
    }

    fn state(&self) -> PartitionState {
        PartitionState {
            applied: self.applied,
            stable: self.stable,
            entries: self.store.digest(),
            sessions: self.last_writes.iter().map(|(c, w)| (*c, w.clone())).collect(),
            history: self.history,
            unreported: self.outgoing.iter().cloned().collect(),
        }
    }

    /// Recovery: installs a state transfer read back from this node's log.
    pub fn restore(&mut self, state: PartitionState, now_ms: u64) {
        let PartitionState { applied, stable, entries, sessions, history, unreported } = state;
        if self.reported.is_some() {
            self.outgoing = unreported.into();
        }
        for (_, s) in &entries {
            self.clock.observe(s.version.ts);
        }
        self.store.install(entries);
        for (client, mut w) in sessions {
            w.at_ms = now_ms;
            self.last_writes.insert(client, w);
        }
        self.applied = applied;
        self.history = history;
        self.set_recent(VecDeque::new());
        self.stable = if self.is_tail() { applied } else { stable.min(applied) };
        self.unstable.clear();
        self.early.clear();
        self.joining = false;
    }

    fn apply(&mut self, u: Update, now_ms: u64, forward: &mut Vec<Update>, out: &mut Outbox) {
        self.applied = u.seq;
        self.remember(&u);
        self.to_log.push(u.clone());
        self.clock.observe(u.version.ts);
        let stored = Stored { version: u.version.clone(), seq: u.seq, value: u.value.clone(), expires_at_ms: u.expires_at_ms };
        self.store.apply(u.key.clone(), stored, now_ms);
        if let Some((op, _)) = u.ack {
            let last = LastWrite { key: u.key.clone(), write: op.seq, seq: u.seq, version: u.version.clone(), at_ms: now_ms };
            self.last_writes.insert(op.client, last);
        }
        self.answer(&u, out);
        if self.reported.is_some_and(|r| u.seq > r) && u.version.site == self.site {
            self.outgoing.push_back(u.clone());
        }
        if self.is_tail() {
            self.stable = u.seq;
            self.wake_waiters(out);
        } else {
            forward.push(u);
        }
    }

    /// Adds `u` to the history and to the recent updates.
    fn remember(&mut self, u: &Update) {
        let before = self.history;
        self.history = chain_history(before, u);
        self.recent_bytes += update_bytes(u);
        self.recent.push_back((u.clone(), before));
        while self.recent_bytes > RECENT_BYTES && self.recent.len() > 1 {
            let (old, _) = self.recent.pop_front().expect("not empty");
            self.recent_bytes -= update_bytes(&old);
        }
    }

    /// Answers the client of `u` if this position is the one it waits for.
    /// The tail also answers for positions past the end of a chain that
    /// has shrunk.
    fn answer(&self, u: &Update, out: &mut Outbox) {
        if let Some((op, at)) = u.ack {
            if at as usize == self.index || (self.is_tail() && at as usize > self.index) {
                let msg = Message::PutDone {
                    op,
                    version: Some(u.version.clone()),
                    seq: u.seq,
                    chain_index: self.index as u8,
                    stable: self.is_tail(),
                };
                send(out, Dest::Client(op.client), msg);
            }
        }
    }

    /// Sends what `apply` produced on to the successor, or, at the tail,
    /// acknowledges it.
    fn flush(&mut self, forward: Vec<Update>, now_ms: u64, out: &mut Outbox) {
        if self.is_tail() {
            if self.applied > 0 {
                self.ack_upwards(out);
            }
            return;
        }
        if forward.is_empty() {
            return;
        }
        if self.predecessor_waits_durable() {
            self.ack_upwards(out);
        }
        if self.unstable.is_empty() {
            self.last_progress_ms = now_ms;
        }
        self.unstable.extend(forward.iter().cloned());
        self.send_forward(forward, out);
    }

    fn send_forward(&self, updates: Vec<Update>, out: &mut Outbox) {
        let next = self.index + 1;
        let lazy = updates.iter().all(|u| u.ack.is_none_or(|(_, at)| (at as usize) < next));
        let msg = Message::Forward { epoch: self.epoch, partition: self.partition, updates, lazy };
        send(out, Dest::Node(self.successor().expect("only non-tails forward")), msg);
    }

    fn ack_upwards(&self, out: &mut Outbox) {
        if let Some(prev) = self.predecessor() {
            let (epoch, partition, seq, reported) = (self.epoch, self.partition, self.stable, self.reported.unwrap_or(0));
            let durable = self.durable();
            send(out, Dest::Node(prev), Message::StableUpTo { epoch, partition, seq, reported, durable });
        }
    }

    /// Everything up to here is on at least k replicas of the chain: a
    /// write the chain acknowledges, which no failure of fewer than k
    /// replicas loses. The k-th replica and those after it hold only such
    /// updates (each replica holds what its successors hold); replicas
    /// before it learn it from `StableUpTo::durable`. Reads by other
    /// sessions are answered only with durable versions (`node`): a version
    /// read at a head that then crashed with it would be a cause its
    /// readers' later writes lose.
    pub fn durable(&self) -> u64 {
        match self.index + 1 >= self.k || self.is_tail() {
            true => self.applied,
            false => self.durable.max(self.stable).min(self.applied),
        }
    }

    /// Whether this replica's predecessor learns durability from it (it is
    /// before the k-th replica).
    fn predecessor_waits_durable(&self) -> bool {
        self.index > 0 && self.index < self.k
    }

    /// The successor says everything up to `seq` reached the tail (and up
    /// to `reported` every stabilizer replica and site).
    pub fn stable_up_to(&mut self, seq: u64, reported: u64, durable: u64, now_ms: u64, out: &mut Outbox) {
        let more_reported = self.reported.is_some_and(|r| reported > r);
        if more_reported {
            self.set_reported(reported, out);
        }
        let durable = durable.min(self.applied);
        let more_durable = durable > self.durable;
        self.durable = self.durable.max(durable);
        if seq <= self.stable {
            if more_durable && self.predecessor_waits_durable() {
                self.ack_upwards(out);
            }
            return;
        }
        self.stable = seq.min(self.applied);
        while self.unstable.front().is_some_and(|u| u.seq <= self.stable) {
            self.unstable.pop_front();
        }
        self.wake_waiters(out);
        self.last_progress_ms = now_ms;
        self.ack_upwards(out);
    }

    /// Periodic work: resend unacknowledged updates if the successor has made
    /// no progress for `RETRANSMIT_MS`.
    pub fn tick(&mut self, now_ms: u64, out: &mut Outbox) {
        if now_ms.saturating_sub(self.pruned_ms) >= WRITE_MEMORY_MS / 4 {
            self.pruned_ms = now_ms;
            self.last_writes.retain(|_, w| now_ms.saturating_sub(w.at_ms) < WRITE_MEMORY_MS);
        }
        if self.joining && now_ms.saturating_sub(self.asked_ms) >= RETRANSMIT_MS {
            self.asked_ms = now_ms;
            self.request_state(out);
        }
        if self.catching_up && now_ms.saturating_sub(self.asked_ms) >= RETRANSMIT_MS {
            self.asked_ms = now_ms;
            self.request_suffix(out);
        }
        // Updates wait behind a gap that resends have not filled: the
        // predecessor may no longer count what is missing as unstable (this
        // replica resumed from its log into a chain that moved on), so it
        // asks for the updates after its position, or the whole state.
        match self.early.keys().next() {
            Some(&first) if !self.joining && !self.catching_up && first > self.applied + 1 => {
                let since = *self.gap_since_ms.get_or_insert(now_ms);
                if now_ms.saturating_sub(since) >= 2 * RETRANSMIT_MS {
                    self.gap_since_ms = Some(now_ms);
                    self.request_state(out);
                }
            }
            _ => self.gap_since_ms = None,
        }
        if !self.unstable.is_empty() && now_ms.saturating_sub(self.last_progress_ms) >= RETRANSMIT_MS {
            self.last_progress_ms = now_ms;
            self.send_forward(self.unstable.iter().cloned().collect(), out);
        }
    }

    /// A client read of the latest version held here, and this replica's
    /// position in the chain. The node answers once the version is
    /// `durable`.
    pub fn get(&self, key: &[u8], min: Option<&Version>, now_ms: u64) -> Result<(Item, u8), Refusal> {
        if self.joining {
            return Err(Refusal::Behind);
        }
        if self.catching_up {
            // Below this position may be versions a session saw: not yet here.
            return Err(if self.index == 0 { Refusal::NotResponsible { epoch: self.epoch } } else { Refusal::Behind });
        }
        let latest = self.store.latest(key);
        if let Some(min) = min {
            if latest.is_none_or(|s| s.version < *min) {
                return Err(Refusal::Behind);
            }
        }
        Ok((self.item(latest, now_ms), self.index as u8))
    }

    fn item(&self, stored: Option<&Stored>, now_ms: u64) -> Item {
        match stored {
            None => Item { value: None, version: None, seq: 0, stable: true },
            Some(s) => {
                Item { value: s.live_value(now_ms).cloned(), version: Some(s.version.clone()), seq: s.seq, stable: s.seq <= self.stable }
            }
        }
    }

    /// Dependency stabilization: answer once the update with sequence
    /// number `seq` is known to have reached the tail. Any replica of the
    /// chain can answer (the tail at once, the others when `StableUpTo`
    /// reaches them), so a session asks its own node when it is in the chain
    /// and spares a round trip.
    pub fn wait_stable(&mut self, op: OpId, seq: u64, out: &mut Outbox) {
        self.when_stable(seq, Envelope { to: Dest::Client(op.client), msg: Message::Stable { op } }, out);
    }

    /// Sends `reply` once update `seq` is stable.
    fn when_stable(&mut self, seq: u64, reply: Envelope, out: &mut Outbox) {
        if seq <= self.stable {
            out.push(reply);
        } else {
            self.waiters.entry(seq).or_default().push(reply);
        }
    }

    fn wake_waiters(&mut self, out: &mut Outbox) {
        while let Some(entry) = self.waiters.first_entry() {
            if *entry.key() > self.stable {
                break;
            }
            out.extend(entry.remove());
        }
    }

    /// One key of a get-transaction, read at the head at snapshot time `at`.
    ///
    /// The head first moves its clock past `at`, so every write it orders
    /// from now on is timestamped after the snapshot; every write it ordered
    /// before is already in its store. So "latest version <= at" here is
    /// final. A version included this way was written after all of its
    /// dependencies were stable (dependency stabilization), and those have
    /// smaller timestamps (the client passes its causal past as `after`), so
    /// they are at their heads too and inside the same snapshot: no
    /// fractured reads (the ACL / photo-album example of §3.5).
    ///
    /// With several sites, remote writes arrive with timestamps of their
    /// own, possibly below `at` after the snapshot was read elsewhere: a
    /// version is included only if its dependencies on every other site are
    /// within `remote` (what this site had applied of each when the
    /// snapshot began). Every such remote version is stable here already,
    /// and none arriving later is, so the snapshot stays final.
    pub fn snapshot_read(&mut self, key: &[u8], at: Timestamp, remote: &VersionVector, now_ms: u64) -> Result<Item, Refusal> {
        if self.index != 0 || self.joining || self.catching_up {
            return Err(Refusal::NotResponsible { epoch: self.epoch });
        }
        self.clock.observe(at);
        let site = self.site;
        let visible =
            |v: &Version| v.ts <= at && v.vv.0.iter().enumerate().all(|(s, &t)| s as SiteId == site || t <= remote.get(s as SiteId));
        let stored = self.store.latest_where(key, visible).map_err(|_| Refusal::SnapshotTooOld)?;
        Ok(self.item(stored, now_ms))
    }

    /// A replica for a node that joins `partition`'s chain: it asks its
    /// predecessor for the partition's state and meanwhile keeps the updates
    /// that arrive (ChainReaction §3.3.3, node join).
    ///
    /// `retained` is what this node held of the partition when it last left
    /// the chain (a node removed while paused or partitioned, now back): it
    /// keeps it and asks only for what came after, which the predecessor
    /// sends if its recent updates reach back that far and the histories
    /// match (else the whole state, which replaces it).
    pub fn joining(
        topology: &Topology,
        partition: PartitionId,
        me: NodeId,
        site: SiteId,
        retained: Option<ChainReplica>,
        now_ms: u64,
        out: &mut Outbox,
    ) -> Option<Self> {
        let mut r = ChainReplica::new(topology, partition, me, site)?;
        if r.index == 0 {
            // Nobody to copy from: the site is being born (or every replica
            // of the partition was lost).
            return ChainReplica::born(topology, partition, me, site);
        }
        if let Some(old) = retained {
            r.store = old.store;
            r.clock = old.clock;
            r.ceiling = old.ceiling;
            r.applied = old.applied;
            r.history = old.history;
            r.stable = old.stable.min(old.applied);
            r.last_writes = old.last_writes;
            // Its updates not yet reported to every site: if it becomes the
            // tail, its reporter starts from them (the predecessor sends
            // only what came after, and a tail that started without them
            // would declare them reported).
            r.outgoing = old.outgoing;
            r.reported = old.reported;
        }
        r.joining = true;
        r.asked_ms = now_ms;
        r.request_state(out);
        Some(r)
    }

    fn request_state(&self, out: &mut Outbox) {
        if let Some(prev) = self.predecessor() {
            let me = self.chain[self.index];
            let have = (self.applied > 0).then_some((self.applied, self.history));
            send(out, Dest::Node(prev), Message::Fetch { epoch: self.epoch, partition: self.partition, from: me, have });
        }
    }

    /// The successor `from` asks for the partition's state: the latest
    /// version of every key (one level of divergence means nothing older is
    /// needed) and where the update order stands. Updates after it follow on
    /// the same link.
    ///
    /// A successor that still holds the partition up to some position
    /// (`have`: applied, history) gets only the updates after it, if this
    /// replica's recent updates reach back there and its history at that
    /// position is the same (the successor did not apply updates that were
    /// later lost, like a head's unforwarded writes); else the whole state.
    pub fn fetch(&self, epoch: u64, from: NodeId, have: Option<(u64, u64)>, out: &mut Outbox) {
        if epoch != self.epoch || self.joining || self.successor() != Some(from) {
            return;
        }
        let (partition, clock) = (self.partition, self.clock.last());
        let msg = match have.and_then(|(applied, history)| Some((self.updates_after(applied, history)?, history))) {
            Some((updates, history_before)) => Message::Transfer { epoch, partition, state: None, updates, history_before, clock },
            // With the recent updates, so the new member can in turn serve
            // a returning successor that was away since before this.
            None => {
                let history_before = self.recent.front().map_or(self.history, |(_, h)| *h);
                let updates = self.recent.iter().map(|(u, _)| u.clone()).collect();
                Message::Transfer { epoch, partition, state: Some(self.state()), updates, history_before, clock }
            }
        };
        send(out, Dest::Node(from), msg);
    }

    /// Takes `updates` (the sender's recent updates, ending at this
    /// replica's position, starting after history `before`) as this
    /// replica's recent updates, if they hash to its history.
    fn seed_recent(&mut self, updates: Vec<Update>, before: u64) {
        let mut history = before;
        let recent: VecDeque<(Update, u64)> = updates
            .into_iter()
            .map(|u| {
                let entry = (u, history);
                history = chain_history(history, &entry.0);
                entry
            })
            .collect();
        if history == self.history && recent.back().is_none_or(|(u, _)| u.seq == self.applied) {
            self.set_recent(recent);
        }
    }

    fn set_recent(&mut self, recent: VecDeque<(Update, u64)>) {
        self.recent_bytes = recent.iter().map(|(u, _)| update_bytes(u)).sum();
        self.recent = recent;
    }

    /// The updates after `applied`, if this replica has all of them and
    /// its history at `applied` is `history`.
    fn updates_after(&self, applied: u64, history: u64) -> Option<Vec<Update>> {
        if applied == self.applied {
            return (history == self.history).then(Vec::new);
        }
        let first = self.recent.front()?.0.seq;
        if applied < first.saturating_sub(1) || applied > self.applied {
            return None;
        }
        let from = (applied + 1 - first) as usize;
        let (_, before) = &self.recent[from];
        (*before == history).then(|| self.recent.iter().skip(from).map(|(u, _)| u.clone()).collect())
    }

    /// Asks the successor for what it holds beyond this replica; with no
    /// successor, there is nobody who could hold more.
    fn request_suffix(&mut self, out: &mut Outbox) {
        match self.successor() {
            Some(next) => {
                let me = self.chain[self.index];
                send(
                    out,
                    Dest::Node(next),
                    Message::CatchUp { epoch: self.epoch, partition: self.partition, from: me, after: self.applied },
                );
            }
            None => {
                self.caught_up();
                if let Some((from, after)) = self.owed.take() {
                    self.catch_up(self.epoch, from, after, out);
                }
            }
        }
    }

    fn caught_up(&mut self) {
        self.catching_up = false;
        self.log.push(LogRecord::Behind { partition: self.partition, behind: false });
    }

    /// The predecessor `from` moved up past this replica and asks for what
    /// this replica holds after `after`. Everything it lacks was not known
    /// stable here when the order changed (it was at or past the tail that
    /// defined stability), so `handoff` has it (and `unstable` what came
    /// since). A replica still catching up itself answers once it has.
    pub fn catch_up(&mut self, epoch: u64, from: NodeId, after: u64, out: &mut Outbox) {
        if epoch != self.epoch || self.joining || self.predecessor() != Some(from) {
            return;
        }
        if self.catching_up {
            self.owed = Some((from, after));
            return;
        }
        let mut updates: Vec<Update> = self.unstable.iter().chain(&self.handoff).filter(|u| u.seq > after).cloned().collect();
        updates.sort_by_key(|u| u.seq);
        updates.dedup_by_key(|u| u.seq);
        let (partition, applied, clock) = (self.partition, self.applied, self.clock.last());
        let msg = match updates.iter().map(|u| u.seq).eq(after + 1..=applied) || applied <= after {
            true => Message::Suffix { epoch, partition, updates, applied, state: None, clock },
            // Some of what it lacks was already stable here (declared by a
            // tail while it was away): the whole state instead.
            false => Message::Suffix { epoch, partition, updates: Vec::new(), applied, state: Some(self.state()), clock },
        };
        send(out, Dest::Node(from), msg);
    }

    /// The successor's answer to `request_suffix`: applies what it sent;
    /// serves again once it has all the successor had.
    #[allow(clippy::too_many_arguments)]
    pub fn suffix(
        &mut self,
        epoch: u64,
        updates: Vec<Update>,
        applied: u64,
        state: Option<PartitionState>,
        clock: Timestamp,
        now_ms: u64,
        out: &mut Outbox,
    ) {
        if epoch != self.epoch || !self.catching_up {
            return;
        }
        // The sender's clock covers promises this replica never saw: it
        // must survive a restart here too.
        self.cover(clock);
        if let Some(state) = state.filter(|s| s.applied > self.applied) {
            self.log.push(LogRecord::State { partition: self.partition, state: state.clone() });
            let early: Vec<Update> = std::mem::take(&mut self.early).into_values().collect();
            self.restore(state, now_ms);
            self.forward(early, now_ms, out);
        }
        self.forward(updates, now_ms, out);
        if self.applied >= applied {
            self.caught_up();
            if let Some((from, after)) = self.owed.take() {
                self.catch_up(epoch, from, after, out);
            }
        }
    }

    /// Installs a state transfer (or, with `state` None, keeps the state
    /// this replica retained and applies the `updates` after it), then
    /// applies the updates that arrived meanwhile.
    /// Returns whether it was taken (not stale).
    #[allow(clippy::too_many_arguments)]
    pub fn transfer(
        &mut self,
        epoch: u64,
        state: Option<PartitionState>,
        updates: Vec<Update>,
        history_before: u64,
        clock: Timestamp,
        now_ms: u64,
        out: &mut Outbox,
    ) -> bool {
        if epoch != self.epoch {
            return false;
        }
        self.cover(clock);
        if !self.joining {
            // The answer to a fetch for a gap (`tick`): only what extends
            // this replica.
            let extends = match &state {
                Some(state) => state.applied > self.applied,
                None => history_before == self.history,
            };
            if !extends || self.catching_up {
                return false;
            }
        }
        // Taken before `restore`, which clears it.
        let early: Vec<Update> = std::mem::take(&mut self.early).into_values().collect();
        match state {
            Some(state) => {
                self.log.push(LogRecord::State { partition: self.partition, state: state.clone() });
                self.restore(state, now_ms);
                self.seed_recent(updates, history_before);
            }
            None if !self.joining => self.forward(updates, now_ms, out),
            None => {
                // The predecessor matched this history before answering.
                debug_assert_eq!(history_before, self.history);
                // The log holds nothing of this partition since the node
                // left the chain (`Dropped`): the state it keeps goes in
                // first, then the updates as they apply.
                self.log.push(LogRecord::State { partition: self.partition, state: self.state() });
                self.joining = false;
                self.unstable.clear();
                if self.is_tail() {
                    self.stable = self.applied;
                }
                self.forward(updates, now_ms, out);
            }
        }
        self.forward(early, now_ms, out);
        if self.is_tail() {
            self.wake_waiters(out);
            self.ack_upwards(out);
        }
        true
    }

    /// Installs a new configuration of the chain (ChainReaction §3.3.3):
    /// after a failure the survivors close ranks, a new successor is sent
    /// everything not yet known stable, a new tail declares everything it
    /// holds stable. Returns false if this node left the chain.
    pub fn reconfigure(&mut self, topology: &Topology, me: NodeId, now_ms: u64, out: &mut Outbox) -> bool {
        let chain = topology.chain(self.partition);
        let Some(index) = chain.index_of(me) else { return false };
        let was = self.index;
        // Recovered from the log: its place now may not be the one it had.
        let recovered = self.epoch == 0;
        self.epoch = topology.epoch;
        self.k = topology.shape.k;
        self.chain = chain.nodes.clone();
        self.index = index;
        if self.joining {
            self.asked_ms = now_ms;
            self.request_state(out);
            return true;
        }
        // What waits behind a gap, and a promise not passed on yet, came
        // from the old order. Its head may have died with the missing
        // update, and a new head orders a different update at that
        // position: applied after it, the parked ones would splice two
        // histories (and their timestamps would fall below the new head's
        // promises). A predecessor that stays resends what is unstable.
        self.early.clear();
        self.gap_since_ms = None;
        self.promise = None;
        // Moved up past nodes that may hold more than this replica (the
        // update invariant held in the old order, not necessarily in the
        // new one), or recovered from the log into a place it may not have
        // had (a reorder committed while the site was down): catch up from
        // the new successor, which holds the most of those, before serving.
        if (index < was || recovered) && !self.catching_up {
            self.catching_up = true;
            self.log.push(LogRecord::Behind { partition: self.partition, behind: true });
        }
        // A predecessor that moved up may ask for these; the acknowledgements
        // of the new order (whose tail is not the most behind until it has
        // caught up) must not take them away first.
        self.handoff = self.unstable.iter().cloned().collect();
        self.owed = None;
        if self.catching_up {
            self.asked_ms = now_ms;
            self.request_suffix(out);
        }
        if self.is_tail() {
            self.stable = self.applied;
            // Writes waiting for a position that no longer exists are
            // answered here, the end of the chain.
            for u in std::mem::take(&mut self.unstable) {
                if let Some((op, at)) = u.ack {
                    if at as usize > was && at as usize >= index {
                        let msg = Message::PutDone { op, version: Some(u.version), seq: u.seq, chain_index: index as u8, stable: true };
                        send(out, Dest::Client(op.client), msg);
                    }
                }
            }
            self.wake_waiters(out);
        } else if !self.unstable.is_empty() {
            self.last_progress_ms = now_ms;
            self.send_forward(self.unstable.iter().cloned().collect(), out);
        }
        if self.stable > 0 {
            self.ack_upwards(out);
        }
        true
    }

    // ---- several sites (`geo`) ----------------------------------------

    /// Turns on what several sites need: the tail hands its local updates
    /// to the node's reporter, and every replica keeps what is not reported
    /// yet.
    pub fn enable_geo(&mut self) {
        self.reported.get_or_insert(0);
    }

    /// The tail's reporter has everything up to `seq` acknowledged by every
    /// stabilizer replica and site: the chain may forget it.
    pub fn set_reported(&mut self, seq: u64, out: &mut Outbox) {
        if self.reported.is_some_and(|r| seq > r) {
            self.reported = Some(seq.min(self.applied));
            while self.outgoing.front().is_some_and(|u| u.seq <= seq) {
                self.outgoing.pop_front();
            }
            if self.is_tail() {
                self.ack_upwards(out);
            }
        }
    }

    /// The local updates not handed to the reporter yet that this
    /// replica's disk holds (all of them not reported, after `rewind`).
    pub fn take_reportable(&mut self) -> Vec<Update> {
        let from = self.outgoing.partition_point(|u| u.seq <= self.handed);
        let to = self.outgoing.partition_point(|u| u.seq <= self.on_disk);
        let updates: Vec<Update> = self.outgoing.range(from..to.max(from)).cloned().collect();
        if let Some(u) = updates.last() {
            self.handed = u.seq;
        }
        updates
    }

    /// A new reporter starts here: it is handed everything not reported.
    pub fn rewind(&mut self) {
        self.handed = 0;
    }

    /// How far the reporter may count this replica's updates reported: the
    /// updates its disk holds.
    pub fn reportable_through(&self) -> u64 {
        self.applied.min(self.on_disk)
    }

    /// What it has applied goes into the node's log with ticket `ticket`
    /// (the next or last `take_log`).
    pub fn mark(&mut self, ticket: u64) {
        let last = self.marks.back().map_or(self.on_disk, |&(_, seq)| seq);
        if self.applied > last {
            self.marks.push_back((ticket, self.applied));
        }
    }

    /// The node's log is synced through ticket `through`; returns whether
    /// more of this replica is on disk now.
    pub fn synced(&mut self, through: u64) -> bool {
        let before = self.on_disk;
        while let Some(&(_, seq)) = self.marks.front().filter(|&&(ticket, _)| ticket <= through) {
            self.on_disk = self.on_disk.max(seq);
            self.marks.pop_front();
        }
        self.on_disk > before
    }

    /// Recovered from this node's disk: all of it is there.
    pub fn recovered_on_disk(&mut self) {
        self.on_disk = self.applied;
        self.marks.clear();
    }

    /// Whether this replica is its chain's tail and serving.
    pub fn reports(&self) -> bool {
        self.is_tail() && !self.joining && !self.catching_up
    }

    /// The next member of the chain, if any.
    pub fn next(&self) -> Option<NodeId> {
        self.successor()
    }

    /// At the head: promises that no later update of the partition will be
    /// timestamped at or below the time it returns (Eunomia Alg. 2 lines
    /// 10-12; at least `at`, past which the stabilizer leader asked), once
    /// everything it applied so far is reported. The promise
    /// travels down the chain behind those updates (`on_promise`).
    pub fn make_promise(&mut self, now_ms: u64, at: Timestamp) {
        if self.index != 0 || self.joining || self.catching_up || self.epoch == 0 {
            return;
        }
        // A leader's ask from a clock far ahead of this one does not drag
        // this clock along (as a session's past would not: `MAX_CLOCK_SKEW_MS`).
        let at = at.min(Timestamp::new(now_ms.saturating_add(crate::hlc::MAX_CLOCK_SKEW_MS), 0));
        let ts = self.clock.last().max(Timestamp::new(now_ms, 0)).max(at);
        self.clock.observe(ts);
        self.on_promise(self.applied, ts);
    }

    /// A promise from the predecessor (or this head's own).
    pub fn on_promise(&mut self, seq: u64, ts: Timestamp) {
        if self.promise.is_none_or(|(_, t)| ts > t) {
            self.promise = Some((seq, ts));
        }
    }

    /// The promise to pass on (or, at the tail, to report) once everything
    /// it covers is applied here. Every replica's clock moves past it, so
    /// whichever becomes head never orders a write below it.
    pub fn take_promise(&mut self) -> Option<Timestamp> {
        let (seq, ts) = self.promise?;
        if seq > self.applied || self.joining || self.catching_up || (self.is_tail() && seq > self.on_disk) {
            return None;
        }
        self.promise = None;
        self.cover(ts);
        Some(ts)
    }

    /// Moves the clock past `ts` and logs a ceiling above it, before a
    /// promise of `ts` leaves this replica. A promise lets the stabilizer, and then other sites, count
    /// everything up to it as stable. A node whose clock ran ahead and
    /// restarts with it set right again must still never order a write
    /// below a promise its chain passed on (the stabilizer would drop the
    /// write's id, and updates that depend on it would be applied
    /// elsewhere without it): recovery starts the clock at the ceiling.
    /// One record per `CEILING_MS` of promises. State transfers cover the
    /// sender's clock the same way.
    fn cover(&mut self, ts: Timestamp) {
        self.clock.observe(ts);
        if ts > self.ceiling {
            self.ceiling = Timestamp::new(ts.physical_ms() + CEILING_MS, 0);
            self.log.push(LogRecord::Clock { partition: self.partition, ceiling: self.ceiling });
        }
    }

    /// After recovery: the clock starts above every promise made before.
    pub fn observe_ceiling(&mut self, ceiling: Timestamp) {
        self.ceiling = self.ceiling.max(ceiling);
        self.clock.observe(ceiling);
    }

    /// At the head: another site's update, from this site's receiver, to be
    /// applied with its own version (last-writer-wins against what the key
    /// holds). `reply` goes out once it, or a later version of the key, is
    /// stable. Not the head (any more): dropped, the receiver sends again.
    pub fn apply_remote(&mut self, w: RemoteWrite, reply: Envelope, now_ms: u64, out: &mut Outbox) {
        if self.index != 0 || self.joining || self.catching_up {
            return;
        }
        // A write that lost last-writer-wins is kept too, in its place in
        // the key's history: a get-transaction whose bound leaves the
        // winner out must find it rather than something older.
        if let Some(seq) = self.store.holds(&w.key, &w.version) {
            return self.when_stable(seq, reply, out);
        }
        if let Some(latest) = self.store.latest(&w.key).filter(|s| concurrent(&s.version, &w.version)) {
            self.conflicts += 1;
            let (kept, lost) = match latest.version < w.version {
                true => (w.version.clone(), latest.version.clone()),
                false => (latest.version.clone(), w.version.clone()),
            };
            if self.recent_conflicts.len() == RECENT_CONFLICTS {
                self.recent_conflicts.pop_front();
            }
            self.recent_conflicts.push_back(Conflict { key: w.key.clone(), kept, lost, at_ms: now_ms });
        }
        let (key, version, value, expires_at_ms) = (w.key, w.version, w.value, w.expires_at_ms);
        let update = Update { seq: self.applied + 1, key, version, value, expires_at_ms, ack: None, local_dep: Timestamp::ZERO };
        let seq = update.seq;
        let mut effects = Outbox::new();
        let mut forward = Vec::with_capacity(1);
        self.apply(update, now_ms, &mut forward, &mut effects);
        self.flush(forward, now_ms, &mut effects);
        self.emit(effects, out);
        self.when_stable(seq, reply, out);
    }

    /// Concurrent writes of one key from different sites resolved here.
    pub fn conflicts(&self) -> u64 {
        self.conflicts
    }

    /// The latest of them, oldest first.
    pub fn recent_conflicts(&self) -> impl Iterator<Item = &Conflict> {
        self.recent_conflicts.iter()
    }

    /// What this replica holds, to compare replicas.
    pub fn digest(&self) -> Digest {
        Digest { applied: self.applied, stable: self.stable, latest: self.store.digest() }
    }

    /// Live keys held here.
    pub fn keyspace(&self, now_ms: u64) -> crate::message::Keyspace {
        self.store.keyspace(now_ms)
    }

    /// FLUSHALL: forget every key. Sequence numbers carry on so that updates
    /// in flight still line up.
    pub fn flush_all(&mut self) {
        self.store.clear();
        // Not ordered with the updates: replicas flush at different points
        // of the history, so none of them can vouch for another's state by
        // history any more (a returning replica gets the whole state).
        self.history = xxhash_rust::xxh3::xxh3_64_with_seed(b"FLUSHALL", self.history);
        self.set_recent(VecDeque::new());
    }
}

/// How many resolved conflicts a head remembers (`CW.CONFLICTS`).
pub const RECENT_CONFLICTS: usize = 16;

/// Two writes of one key from different sites, neither aware of the other:
/// last-writer-wins kept one and threw the other away.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflict {
    pub key: Bytes,
    pub kept: Version,
    pub lost: Version,
    /// When the head resolved it (wall clock).
    pub at_ms: u64,
}

/// Whether two versions of a key were written without either writer having
/// seen the other (a conflict last-writer-wins resolves).
fn concurrent(a: &Version, b: &Version) -> bool {
    a.site != b.site && a.vv.get(b.site) < b.ts && b.vv.get(a.site) < a.ts
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::{NodeInfo, Shape};

    fn put(seq: u64, write: u64) -> PutRequest {
        PutRequest {
            op: OpId { client: 9, seq },
            key: Bytes::from("k"),
            value: Some(Bytes::from("v")),
            ttl_ms: None,
            condition: Condition::Always,
            past: VersionVector::default(),
            ack_at: 1,
            write,
        }
    }

    fn take(out: &mut Outbox, to: Dest) -> Vec<Message> {
        let (mine, rest): (Vec<Envelope>, Vec<Envelope>) = std::mem::take(out).into_iter().partition(|e| e.to == to);
        *out = rest;
        mine.into_iter().map(|e| e.msg).collect()
    }

    /// One partition on a chain of three (R=3, k=2): the topology, the
    /// chain's nodes head first, and their replicas.
    fn chain_of_three() -> (Topology, [NodeId; 3], [ChainReplica; 3]) {
        let nodes = (0..3).map(|id| NodeInfo { id, addr: format!("n{id}") }).collect();
        let t = Topology::new(1, Shape { partitions: 1, replicas: 3, k: 2 }, nodes).unwrap();
        let ids = <[NodeId; 3]>::try_from(t.chain(0).nodes.clone()).unwrap();
        let replicas = ids.map(|n| ChainReplica::new(&t, 0, n, 0).unwrap());
        (t, ids, replicas)
    }

    #[test]
    fn a_write_resent_to_a_new_head_that_has_it_is_answered_not_applied_twice() {
        let (t, [a, b, c], [mut head, mut middle, mut tail]) = chain_of_three();
        let mut out = Outbox::new();
        head.put(put(1, 1), 10, &mut out);
        let Some(Message::Forward { updates, .. }) = take(&mut out, Dest::Node(b)).pop() else { panic!("the head forwards") };
        middle.forward(updates, 11, &mut out);
        // The middle's acknowledgement is lost, and the head dies.
        out.clear();
        let repaired = t.without(a);
        middle.reconfigure(&repaired, b, 20, &mut out);
        tail.reconfigure(&repaired, c, 20, &mut out);
        // The new head catches up from its successor before taking writes.
        middle.put(put(2, 1), 20, &mut out);
        assert!(matches!(&take(&mut out, Dest::Client(9))[..], [Message::Refused { .. }]), "no writes while catching up");
        let to_tail = take(&mut out, Dest::Node(c));
        let Some(&Message::CatchUp { epoch, from, after, .. }) = to_tail.iter().find(|m| matches!(m, Message::CatchUp { .. })) else {
            panic!("asks its successor: {to_tail:?}")
        };
        tail.catch_up(epoch, from, after, &mut out);
        let Some(Message::Suffix { updates, applied, .. }) = take(&mut out, Dest::Node(b)).pop() else { panic!("the successor answers") };
        assert!(updates.is_empty() && applied == 0, "the tail never got the write");
        middle.suffix(epoch, updates, applied, None, Timestamp::ZERO, 20, &mut out);
        // The client resends the write with its id to the new head.
        middle.put(put(2, 1), 21, &mut out);
        assert_eq!(middle.digest().applied, 1, "applied once");
        assert!(take(&mut out, Dest::Client(9)).is_empty(), "answered only once stable");
        assert!(take(&mut out, Dest::Node(c)).iter().all(|m| !matches!(m, Message::Forward { .. })), "nothing new to forward");
        let Some(Message::Forward { updates, .. }) = to_tail.into_iter().find(|m| matches!(m, Message::Forward { .. })) else {
            panic!("the new head resends")
        };
        assert_eq!(updates.len(), 1);
        tail.forward(updates, 22, &mut out);
        take(&mut out, Dest::Client(9));
        let Some(Message::StableUpTo { seq, .. }) = take(&mut out, Dest::Node(b)).pop() else { panic!("the tail acknowledges") };
        middle.stable_up_to(seq, 0, seq, 23, &mut out);
        let replies = take(&mut out, Dest::Client(9));
        assert!(
            matches!(&replies[..], [Message::PutDone { op: OpId { seq: 1, .. }, seq: 1, stable: true, .. }]),
            "the write is acknowledged under its id: {replies:?}"
        );
        // A different write from the same session is applied.
        middle.put(put(3, 3), 30, &mut out);
        assert_eq!(middle.digest().applied, 2);
    }

    #[test]
    fn updates_parked_behind_a_gap_are_dropped_when_the_chain_changes() {
        let (t, [a, b, c], [mut head, mut middle, mut tail]) = chain_of_three();
        let mut out = Outbox::new();
        head.put(put(1, 1), 10, &mut out);
        take(&mut out, Dest::Node(b)); // seq 1 is lost on its way
        head.put(put(2, 2), 11, &mut out);
        let Some(Message::Forward { updates, .. }) = take(&mut out, Dest::Node(b)).pop() else { panic!("the head forwards") };
        assert_eq!(updates.iter().map(|u| u.seq).collect::<Vec<_>>(), [2]);
        middle.forward(updates, 12, &mut out);
        assert_eq!(middle.digest().applied, 0, "seq 2 waits behind the gap");
        // The head dies with seq 1, and the tail moves to the head: [c, b].
        // It has nothing to catch up, and orders a new seq 1.
        out.clear();
        let mut repaired = t.without(a);
        repaired.chains[0].nodes = vec![c, b];
        middle.reconfigure(&repaired, b, 20, &mut out);
        tail.reconfigure(&repaired, c, 20, &mut out);
        let Some(Message::CatchUp { epoch, from, after, .. }) = take(&mut out, Dest::Node(b)).pop() else { panic!("asks its successor") };
        middle.catch_up(epoch, from, after, &mut out);
        let Some(Message::Suffix { updates, applied, .. }) = take(&mut out, Dest::Node(c)).pop() else { panic!("the successor answers") };
        tail.suffix(epoch, updates, applied, None, Timestamp::ZERO, 21, &mut out);
        let mut other = put(3, 1);
        other.key = Bytes::from("new");
        tail.put(other, 22, &mut out);
        let Some(Message::Forward { updates, .. }) = take(&mut out, Dest::Node(b)).pop() else { panic!("the new head forwards") };
        middle.forward(updates, 23, &mut out);
        assert_eq!(middle.digest().applied, 1, "the dead head's seq 2 is not spliced after the new seq 1");
    }

    #[test]
    fn a_replica_that_returns_keeps_what_it_has_not_reported_to_other_sites() {
        let (t, [a, b, c], [mut head, _, _]) = chain_of_three();
        head.enable_geo();
        let mut out = Outbox::new();
        head.put(put(1, 1), 10, &mut out);
        head.recovered_on_disk();
        assert_eq!(head.take_reportable().len(), 1);
        // The head is removed while alive, then placed back at the tail: it
        // keeps its data and asks its predecessor only for what came after.
        let mut back = t.without(a);
        back.epoch = 3;
        back.chains[0].nodes = vec![b, c, a];
        let mut returned = ChainReplica::joining(&back, 0, a, 0, Some(head), 20, &mut out).expect("in the chain");
        returned.enable_geo();
        returned.recovered_on_disk();
        assert_eq!(returned.take_reportable().iter().map(|u| u.seq).collect::<Vec<_>>(), [1], "a new tail reports it");
    }

    /// With several sites a tail hands its reporter (other sites) only the
    /// updates, and passes on only the promises, its disk holds: a site
    /// whose machines all crash must not have shown others what it loses.
    #[test]
    fn a_tail_reports_only_what_its_disk_holds() {
        let (_, [_, b, c], [mut head, mut middle, mut tail]) = chain_of_three();
        for r in [&mut head, &mut middle, &mut tail] {
            r.enable_geo();
        }
        let mut out = Outbox::new();
        head.put(put(1, 1), 10, &mut out);
        for m in take(&mut out, Dest::Node(b)) {
            let Message::Forward { updates, .. } = m else { continue };
            middle.forward(updates, 11, &mut out);
        }
        for m in take(&mut out, Dest::Node(c)) {
            let Message::Forward { updates, .. } = m else { continue };
            tail.forward(updates, 12, &mut out);
        }
        assert_eq!(tail.applied(), 1);
        tail.on_promise(1, Timestamp::new(50, 0));
        assert!(tail.take_reportable().is_empty(), "not on disk yet");
        assert_eq!(tail.reportable_through(), 0);
        assert_eq!(tail.take_promise(), None, "the promise covers what is not on disk");
        tail.mark(7);
        tail.synced(6);
        assert!(tail.take_reportable().is_empty(), "its log record is in ticket 7");
        tail.synced(7);
        assert_eq!(tail.take_reportable().iter().map(|u| u.seq).collect::<Vec<_>>(), [1]);
        assert_eq!(tail.reportable_through(), 1);
        assert_eq!(tail.take_promise(), Some(Timestamp::new(50, 0)));
        assert!(tail.take_reportable().is_empty(), "handed once");
        tail.rewind();
        assert_eq!(tail.take_reportable().len(), 1, "a new reporter gets what is not reported");
    }

    #[test]
    fn a_tail_moved_to_the_head_catches_up_before_it_serves() {
        let (t, [a, b, c], [mut head, mut middle, mut tail]) = chain_of_three();
        let mut out = Outbox::new();
        // Two writes reach the middle (acknowledged at k=2), not the tail.
        head.put(put(1, 1), 10, &mut out);
        head.put(put(2, 2), 10, &mut out);
        for m in take(&mut out, Dest::Node(b)) {
            let Message::Forward { updates, .. } = m else { continue };
            middle.forward(updates, 11, &mut out);
        }
        out.clear();
        // The tail moves to the head: [c, a, b].
        let mut moved = t.clone();
        moved.epoch = 2;
        moved.chains[0].nodes = vec![c, a, b];
        for (r, me) in [(&mut head, a), (&mut middle, b), (&mut tail, c)] {
            r.reconfigure(&moved, me, 20, &mut out);
        }
        // Until it has caught up it takes no writes and serves no reads.
        tail.put(put(3, 3), 21, &mut out);
        assert!(matches!(tail.get(b"k", None, 21), Err(Refusal::NotResponsible { .. })));
        let refused = take(&mut out, Dest::Client(9));
        assert_eq!(refused.iter().filter(|m| matches!(m, Message::Refused { .. })).count(), 1, "{refused:?}");
        let to_a = take(&mut out, Dest::Node(a));
        let Some(&Message::CatchUp { epoch, from, after, .. }) = to_a.iter().find(|m| matches!(m, Message::CatchUp { .. })) else {
            panic!("asks its new successor, the old head: {to_a:?}")
        };
        assert_eq!(after, 0);
        head.catch_up(epoch, from, after, &mut out);
        let Some(Message::Suffix { updates, applied, .. }) = take(&mut out, Dest::Node(c)).pop() else { panic!("the old head answers") };
        assert_eq!((updates.len(), applied), (2, 2));
        tail.suffix(epoch, updates, applied, None, Timestamp::ZERO, 22, &mut out);
        // Now it orders the next write after what the chain holds.
        out.clear();
        tail.put(put(5, 5), 23, &mut out);
        assert_eq!(tail.digest().applied, 3, "the next write is seq 3, not a reused 1");
    }

    /// Found by `cli/tests/recovery.rs` on a loaded machine: a member that
    /// moved up adopted the new order before its successor, which ignored
    /// its `CatchUp`; it was to ask again after a silence, but writes kept
    /// flowing through it and the successor kept acknowledging them, so it
    /// never did, and stayed catching up (the coordinator waited for it).
    #[test]
    fn a_member_that_moved_up_asks_again_while_writes_flow_past_it() {
        let (t, ids, [head, middle, tail]) = chain_of_three();
        let [a, b, c] = ids;
        let mut rs = [head, middle, tail];
        let mut out = Outbox::new();
        // The tail moves up to the middle: [a, c, b]. It adopts the new
        // order first; b, still in the old one, ignores its request.
        let mut moved = t.clone();
        moved.epoch = 2;
        moved.chains[0].nodes = vec![a, c, b];
        rs[2].reconfigure(&moved, c, 10, &mut out);
        assert!(rs[2].is_catching_up());
        let Some(Message::CatchUp { epoch, from, after, .. }) = take(&mut out, Dest::Node(b)).pop() else { panic!("asks b") };
        rs[1].catch_up(epoch, from, after, &mut out);
        assert!(out.is_empty(), "b is still in the old order: {out:?}");
        rs[0].reconfigure(&moved, a, 11, &mut out);
        rs[1].reconfigure(&moved, b, 11, &mut out);
        // A write every 50 ms flows through c, and b acknowledges each.
        let mut write = 0;
        for ms in (20..2_000).step_by(10) {
            if ms % 50 == 0 {
                write += 1;
                rs[0].put(put(write, write), ms, &mut out);
            }
            for r in rs.iter_mut() {
                r.tick(ms, &mut out);
            }
            while !out.is_empty() {
                for env in std::mem::take(&mut out) {
                    let Dest::Node(n) = env.to else { continue };
                    let r = &mut rs[ids.iter().position(|&i| i == n).unwrap()];
                    match env.msg {
                        Message::Forward { updates, .. } => r.forward(updates, ms, &mut out),
                        Message::StableUpTo { seq, reported, durable, .. } => r.stable_up_to(seq, reported, durable, ms, &mut out),
                        Message::CatchUp { epoch, from, after, .. } => r.catch_up(epoch, from, after, &mut out),
                        Message::Suffix { epoch, updates, applied, state, clock, .. } => {
                            r.suffix(epoch, updates, applied, state, clock, ms, &mut out)
                        }
                        _ => {}
                    }
                }
            }
            if !rs[2].is_catching_up() {
                break;
            }
        }
        assert!(!rs[2].is_catching_up(), "c is still catching up after {write} writes passed it");
        assert_eq!(rs.iter().map(|r| r.digest().applied).collect::<Vec<_>>(), [write; 3]);
    }

    #[test]
    fn a_recovered_replica_placed_ahead_of_a_longer_log_takes_its_successors_state() {
        let (t, [a, b, c], [mut head, _, _]) = chain_of_three();
        let mut out = Outbox::new();
        head.put(put(1, 1), 10, &mut out);
        let first = logged(&mut head);
        head.put(put(2, 2), 11, &mut out);
        head.stable_up_to(2, 0, 2, 12, &mut out);
        out.clear();
        // c recovers a log with only the first write, and a reorder that
        // was committed while the site was down puts it at the head.
        let mut recovered = ChainReplica::detached(0, c, 0, 2);
        recovered.restore(
            PartitionState { applied: 0, stable: 0, entries: Vec::new(), sessions: Vec::new(), history: 0, unreported: Vec::new() },
            20,
        );
        assert_eq!(recovered.replay(first, 20), None);
        let mut moved = t.clone();
        moved.epoch = 2;
        moved.chains[0].nodes = vec![c, a, b];
        recovered.reconfigure(&moved, c, 21, &mut out);
        head.reconfigure(&moved, a, 21, &mut out);
        let to_a = take(&mut out, Dest::Node(a));
        let Some(&Message::CatchUp { epoch, from, after, .. }) = to_a.iter().find(|m| matches!(m, Message::CatchUp { .. })) else {
            panic!("asks its successor: {to_a:?}")
        };
        head.catch_up(epoch, from, after, &mut out);
        let Some(Message::Suffix { updates, applied, state, .. }) = take(&mut out, Dest::Node(c)).pop() else { panic!("answered") };
        assert!(state.is_some(), "the second write is stable at a and no longer kept as an update: the whole state");
        recovered.suffix(epoch, updates, applied, state, Timestamp::ZERO, 22, &mut out);
        recovered.put(put(3, 3), 23, &mut out);
        assert_eq!(recovered.digest().applied, 3, "orders after what the chain holds");
    }

    fn logged(r: &mut ChainReplica) -> Vec<Update> {
        r.take_log()
            .into_iter()
            .flat_map(|rec| match rec {
                LogRecord::Updates { updates, .. } => updates,
                LogRecord::State { .. } | LogRecord::Dropped { .. } | LogRecord::Behind { .. } | LogRecord::Clock { .. } => Vec::new(),
            })
            .collect()
    }

    /// A head asked to promise past a time promises past it, so the id
    /// waiting for it becomes stable even if this clock lags; but an ask
    /// from a clock more than `MAX_CLOCK_SKEW_MS` ahead does not drag this
    /// one along.
    #[test]
    fn a_head_promises_past_what_the_leader_asks_within_the_skew_bound() {
        let (_, _, [mut r, _, _]) = chain_of_three();
        r.make_promise(13_000, Timestamp::new(13_050, 3));
        assert_eq!(r.take_promise(), Some(Timestamp::new(13_050, 3)));
        let far = 20_000 + crate::hlc::MAX_CLOCK_SKEW_MS + 1;
        r.make_promise(20_000, Timestamp::new(far, 0));
        let promised = r.take_promise().expect("a promise");
        assert!(promised.physical_ms() <= 20_000 + crate::hlc::MAX_CLOCK_SKEW_MS, "{promised:?}");
    }

    /// A head whose clock ran 3 s ahead promises; restarted with the clock
    /// right again, it recovers the logged ceiling and orders its next
    /// write above the promise (before the fix it ordered it 3 s below).
    #[test]
    fn a_promise_leaves_only_under_a_logged_ceiling() {
        let (t, [head, ..], [mut r, _, _]) = chain_of_three();
        r.make_promise(13_000, Timestamp::ZERO);
        let promised = r.take_promise().expect("a head promises at once");
        let ceiling = r
            .take_log()
            .into_iter()
            .find_map(|rec| match rec {
                LogRecord::Clock { ceiling, .. } => Some(ceiling),
                _ => None,
            })
            .expect("the ceiling is logged before the promise leaves");
        assert!(ceiling > promised);
        let mut back = ChainReplica::new(&t, 0, head, 0).unwrap();
        back.observe_ceiling(ceiling);
        let mut out = Outbox::new();
        back.put(put(1, 1), 10_000, &mut out);
        assert!(logged(&mut back)[0].version.ts > promised);
    }

    /// The whole-site restart bug: two connections writing through one head
    /// could log update n+1 before n, and replay dropped every update after
    /// the inversion, so the restarted head reused sequence numbers its
    /// successors held. Replay now orders what it reads, and stops loudly at
    /// a real gap.
    #[test]
    fn replay_orders_the_log_and_reports_a_gap() {
        let (t, [head, ..], [mut r, _, _]) = chain_of_three();
        let mut out = Outbox::new();
        for i in 0..5 {
            r.put(put(i, i), 10 + i, &mut out);
        }
        let mut log = logged(&mut r);
        assert_eq!(log.iter().map(|u| u.seq).collect::<Vec<_>>(), vec![1, 2, 3, 4, 5]);
        log.swap(1, 2);
        let mut back = ChainReplica::new(&t, 0, head, 0).unwrap();
        assert_eq!(back.replay(log.clone(), 100), None);
        assert_eq!(back.digest(), r.digest(), "every update back, in order");
        log.remove(2); // seq 2 (after the swap) is lost
        let mut gapped = ChainReplica::new(&t, 0, head, 0).unwrap();
        assert_eq!(gapped.replay(log, 100), Some(2), "the gap is reported");
        assert_eq!(gapped.digest().applied, 1, "nothing after the gap is guessed");
    }
}
