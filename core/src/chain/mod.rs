//! One node's replica of one partition: a link of a ChainReaction chain.
//!
//! ChainReaction §3.3 changes classic chain replication (§2.3.4) in two ways:
//!
//! * A write is ordered at the head, forwarded *eagerly* down to position
//!   k-1 (0-based), which answers the client, and then *lazily* to the tail.
//!   When it reaches the tail it is *stable*, and the tail says so
//!   (`StableUpTo`) to every replica before it, the head included. Any
//!   prefix of the chain holds every write that any later position holds
//!   ("the update invariant"), so a client that saw a version at position i
//!   may read from any position <= i, and from anywhere once that version
//!   is stable.
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
//! simulator drop and reorder messages, and what chain repair uses to
//! retransmit in-flight writes after a failure.
//!
//! Get-transactions (ChainReaction §3.5) are served by heads: see
//! `snapshot_read`.

pub mod change;
mod evict;
mod expiry;
mod geo;
mod log;
mod repair;
#[cfg(test)]
mod tests;
mod transfer;
mod writes;

pub use crate::message::{LastWrite, PartitionState};
pub use evict::Policy;
pub use geo::{Conflict, RECENT_CONFLICTS};
use writes::Writes;
pub use writes::WRITE_MEMORY_MS;

use crate::hlc::{Clock, Timestamp};
use crate::message::geo::RemoteWrite;
use crate::message::{send, Ack, Change, ClientId, Dest, Envelope, Item, Message, OpId, Outbox, Refusal, Update};
use crate::record::LogRecord;
use crate::ring::{NodeId, PartitionId, Topology};
use crate::store::{PartitionStore, Stored, View, Write};
use crate::version::{SiteId, Version, VersionVector};
use bytes::Bytes;
use std::collections::{BTreeMap, VecDeque};

/// Resend unacknowledged updates to the successor after this long without
/// progress.
pub const RETRANSMIT_MS: u64 = 200;
/// A resend waits for the bytes of at most this many unstable updates
/// (`crate::resend_wait_ms`): counted at every tick while stalled.
const RESEND_SIZED: usize = 1_024;

/// The longest a joining replica waits before asking for the state again.
pub const MAX_ASK_MS: u64 = 3_200;

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
    pub change: Change,
    /// The session's causal past (`Message::Put`).
    pub past: VersionVector,
    pub ack_at: u8,
    /// The write's id in its session (see `Message::Put`).
    pub write: u64,
    /// The session finished its writes below this one (`Message::Put`).
    pub done_below: u64,
}

/// How many bytes of recent updates (keys and values) a replica keeps for
/// a successor that returns after a short absence (`ChainReplica::fetch`):
/// one that missed more gets the whole state. While no node of the site is
/// out waiting to return, only the last `RECENT_MS` of them (what a node
/// that stopped answering a moment ago, not removed yet, will need), so at
/// rest the window is empty and costs nothing per key.
pub const RECENT_BYTES: usize = 256 * 1024;
pub const RECENT_MS: u64 = 2_000;
/// How often a replica drops recent updates past `RECENT_MS`.
const FORGET_EVERY_MS: u64 = 100;

/// The history after `u`, given the history before it: a hash chain over
/// each update's position, key and version (a version names one write, so
/// its value adds nothing).
fn chain_history(before: u64, u: &Update) -> u64 {
    use xxhash_rust::xxh3::xxh3_64_with_seed;
    // Two one-shot hashes: the streaming hasher costs ten times more.
    let key = xxh3_64_with_seed(&u.key, before);
    let mut fixed = [0u8; 32];
    fixed[..8].copy_from_slice(&u.seq.to_le_bytes());
    fixed[8..16].copy_from_slice(&u.version.ts.to_bits().to_le_bytes());
    fixed[16..24].copy_from_slice(&u.expires_at_ms.unwrap_or(0).to_le_bytes());
    fixed[24..32].copy_from_slice(&((u64::from(u.version.site) << 1) | u64::from(u.value.is_some())).to_le_bytes());
    xxh3_64_with_seed(&fixed, key)
}

/// What an update kept among the recent ones takes: its key and value, its
/// place in the window.
/// The most bytes of keys and values in one `Forward` (`send_forward`, and
/// `node::coalesce` merging a burst's): one larger update goes alone.
pub const FORWARD_BYTES: usize = 16 << 20;

/// An update's key and value bytes, as `FORWARD_BYTES` counts them.
pub fn forward_bytes(u: &Update) -> usize {
    u.key.len() + u.value.as_ref().map_or(0, |v| v.len())
}

fn update_bytes(u: &Update) -> usize {
    u.key.len() + u.value.as_ref().map_or(0, |v| v.len()) + std::mem::size_of::<(Update, u64, u64)>()
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
    /// Got the state, still getting the values its predecessor has on disk
    /// (`transfer::Stream`); `joining` until they are all here.
    stream: Option<Box<transfer::Stream>>,
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
    /// The latest updates applied, each with the history before it and
    /// when it was applied, up to `RECENT_BYTES` and `RECENT_MS`: what a
    /// returning successor may lack (`fetch`).
    recent: VecDeque<(Update, u64, u64)>,
    recent_bytes: usize,
    /// A node of the site is out and may return (`Topology::returning`):
    /// recent updates are kept whatever their age.
    keep_recent: bool,
    /// When `forget_recent` last looked.
    forgot_ms: u64,
    /// Highest seq known to have reached the tail.
    stable: u64,
    /// Highest seq known to be on k replicas (`durable`), as the
    /// successors said; kept by replicas before the k-th only.
    durable: u64,
    /// The epoch and `durable()` this replica last told its predecessor
    /// (`ack_upwards`), so a tick can tell it what a lagging tail holds
    /// back.
    told_durable: (u64, u64),
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
    /// `take_reportable` handed everything of `outgoing` up to here
    /// (`on_disk` when it last looked).
    scanned: u64,
    /// How far this replica's log is on disk (`Node::synced`): a tail hands
    /// its reporter, and so other sites, only updates and promises its disk
    /// holds. A site whose machines all crash loses what its disks had not
    /// synced (`fsync=everysec`); no other site may have applied it.
    on_disk: u64,
    /// Log tickets (`Node::take_log`'s numbers) not known synced yet, with
    /// how far this replica had applied when each was taken.
    marks: VecDeque<(u64, u64)>,
    /// Whether the node keeps a log (`without_log`): a node without a disk
    /// records no updates (a copy of every write that nobody would read)
    /// and counts what it applied as on disk at once.
    logs: bool,
    /// A promise (`make_promise`) to pass down the chain, or, at the tail,
    /// to report, once everything up to its seq is applied here.
    promise: Option<(u64, Timestamp)>,
    /// Concurrent writes of one key from different sites this head
    /// resolved by last-writer-wins, and the latest few of them.
    conflicts: u64,
    recent_conflicts: VecDeque<Conflict>,
    /// Each session's writes applied here that it may still resend or
    /// depend on (`writes`).
    writes: Writes,
    /// Keys to expire (at the head) and tombstones to collect (`expiry`).
    reclaim: expiry::Reclaim,
    /// When the successor last made progress (or we last resent).
    last_progress_ms: u64,
    /// When this replica last asked for what it lacks: the state, from its
    /// predecessor, while joining; the suffix, from its successor, while
    /// catching up. Asked again every `RETRANSMIT_MS` until answered, apart
    /// from `last_progress_ms`: writes flowing past a member that moved up
    /// keep its successor making progress, yet its request may have been
    /// lost, or ignored by a successor not in the new order yet.
    asked_ms: u64,
    /// How long to wait before asking for the state again: doubles with
    /// each ask, up to `MAX_ASK_MS` (a big partition's state takes a while
    /// to build and send, and each ask has the predecessor build it anew).
    ask_every_ms: u64,
    /// Since when updates have waited behind a gap (see `tick`).
    gap_since_ms: Option<u64>,
}

impl ChainReplica {
    /// `me`'s replica of `partition`, if `me` is in its chain.
    pub fn new(topology: &Topology, partition: PartitionId, me: NodeId, site: SiteId) -> Option<Self> {
        let chain = topology.chain(partition);
        let index = chain.index_of(me)?;
        let mut r = ChainReplica::at(partition, site, topology.epoch, chain.nodes.clone(), index, topology.shape.k);
        r.keep_recent = !topology.returning.is_empty();
        r.store.keep_history(index == 0);
        Some(r)
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
            stream: None,
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
            keep_recent: false,
            forgot_ms: 0,
            stable: 0,
            unstable: VecDeque::new(),
            early: BTreeMap::new(),
            to_log: Vec::new(),
            log: Vec::new(),
            waiters: BTreeMap::new(),
            writes: Writes::default(),
            reclaim: expiry::Reclaim::default(),
            last_progress_ms: 0,
            asked_ms: 0,
            ask_every_ms: RETRANSMIT_MS,
            gap_since_ms: None,
            durable: 0,
            told_durable: (0, 0),
            reported: None,
            outgoing: VecDeque::new(),
            handed: 0,
            scanned: 0,
            on_disk: 0,
            marks: VecDeque::new(),
            logs: true,
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

    /// Whether nothing here waits on time: nothing to resend or to ask
    /// for, nobody waiting (the node's ticks may then be rare).
    pub fn idle(&self) -> bool {
        self.unstable.is_empty() && self.early.is_empty() && self.waiters.is_empty() && !self.joining && !self.catching_up
    }

    /// Highest seq known to have reached the tail.
    pub fn stable(&self) -> u64 {
        self.stable
    }

    /// Write `write` of session `client`, if applied here and still
    /// remembered (`writes`).
    pub fn written(&self, client: ClientId, write: u64) -> Option<&LastWrite> {
        self.writes.get(client, write)
    }

    /// Notes write `write` of `client` once applied here: a parked write
    /// waits for it (`seen_writes`).
    pub fn watch_write(&mut self, client: ClientId, write: u64, now_ms: u64) {
        self.writes.watch(client, write, now_ms);
    }

    /// The watched writes applied since the last call.
    pub fn seen_writes(&mut self) -> std::vec::Drain<'_, (ClientId, u64)> {
        self.writes.take_seen()
    }

    /// Whether session `client` has finished with its write `write`.
    pub fn finished(&self, client: ClientId, write: u64) -> bool {
        self.writes.finished(client, write)
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
        if self.writes.finished(write.client, write.seq) {
            // A late copy of a write its session has finished with (resent
            // on a new configuration, then answered or given up on): applying
            // it now could put an old value over a newer one. Dropped;
            // nobody waits for an answer.
            return;
        }
        if let Some(last) = self.writes.get(write.client, write.seq).filter(|l| l.key == req.key) {
            // A resend of a write this chain already has (its first head
            // failed after forwarding it): answer once it is stable, which
            // satisfies every level, instead of applying it twice.
            let chain_index = (self.chain.len() - 1) as u8;
            let (version, seq, old) = (Some(last.version.clone()), last.seq, last.old.clone());
            let done = Message::PutDone { op: write, version, seq, chain_index, stable: true, stable_through: 0, old: old.map(Box::new) };
            return self.when_stable(last.seq, Envelope { to: Dest::Client(write.client), msg: done }, out);
        }
        let read_back;
        let current = match self.store.latest(&req.key) {
            Some(v) if v.on_disk() && v.is_live(now_ms) => match req.change.needs_value() {
                // The node reads a value on disk back before a change that
                // needs it (`Node::cold`); a caller that did not gets it
                // read here.
                true => {
                    read_back = self.store.stored(v).value;
                    change::Current { value: read_back.as_deref(), expires_at_ms: v.expires_at_ms() }
                }
                // Only whether the key exists matters: its bytes are not read.
                false => change::Current { value: Some(&[]), expires_at_ms: v.expires_at_ms() },
            },
            Some(v) => change::Current { value: v.live_value(now_ms), expires_at_ms: v.expires_at_ms() },
            None => change::Current::default(),
        };
        let decided = match change::decide(&req.change, current, now_ms) {
            Ok(decided) => decided,
            Err(why) => {
                // INCR of a value that is no integer: Redis's error.
                let msg = Message::Refused { op: req.op, reason: Refusal::Unsupported(why.to_string()) };
                return send(out, Dest::Client(req.op.client), msg);
            }
        };
        let Some((value, expires_at_ms)) = decided.write else {
            let msg = Message::PutDone {
                op: req.op,
                version: None,
                seq: 0,
                chain_index: 0,
                stable: false,
                stable_through: 0,
                old: decided.old.map(Box::new),
            };
            return send(out, Dest::Client(req.op.client), msg);
        };
        let ts = self.clock.tick(now_ms, req.past.max());
        let local_dep = req.past.get(self.site);
        let mut vv = req.past;
        vv.set(self.site, ts);
        let update = Update {
            seq: self.applied + 1,
            key: req.key,
            version: Version { ts, site: self.site, vv },
            value,
            expires_at_ms,
            ack: Some(Ack { op: write, at: req.ack_at, done_below: req.done_below, old: decided.old }),
            local_dep,
            expired: false,
        };
        let mut forward = Vec::new();
        self.apply(update, now_ms, &mut forward, out);
        self.flush(forward, now_ms, out);
        self.log_applied();
    }

    /// Updates from the predecessor.
    pub fn forward(&mut self, updates: Vec<Update>, now_ms: u64, out: &mut Outbox) {
        if self.joining {
            // Kept until the state transfer says where they start.
            self.early.extend(updates.into_iter().map(|u| (u.seq, u)));
            return;
        }
        let mut forward = Vec::with_capacity(updates.len());
        let mut duplicate = false;
        for u in updates {
            if u.seq <= self.applied {
                duplicate = true;
                // Already here, maybe inside the state transfer that
                // installed this replica: its answer may never have been
                // sent (answering twice is harmless).
                self.answer(&u, out);
            } else if u.seq == self.applied + 1 {
                self.apply(u, now_ms, &mut forward, out);
                while let Some(next) = self.early.remove(&(self.applied + 1)) {
                    self.apply(next, now_ms, &mut forward, out);
                }
            } else {
                self.early.insert(u.seq, u);
            }
        }
        if duplicate && self.stable > 0 {
            // The predecessor resent what we have: our acknowledgement may
            // have been lost.
            self.ack_upwards(out);
        }
        self.flush(forward, now_ms, out);
        self.log_applied();
    }

    fn apply(&mut self, u: Update, now_ms: u64, forward: &mut Vec<Update>, out: &mut Outbox) {
        self.applied = u.seq;
        self.remember(&u, now_ms);
        if self.logs {
            self.to_log.push(u.clone());
        }
        self.clock.observe(u.version.ts);
        let write =
            Write { version: &u.version, seq: u.seq, value: u.value.as_deref(), expires_at_ms: u.expires_at_ms, expired: u.expired };
        self.store.apply(&u.key, write, now_ms);
        self.note_reclaim(&u);
        if let Some(ack) = &u.ack {
            // Copies: the update's bytes may be slices of the whole
            // message it came in (`wire::decode_message`), which this
            // record would keep for as long as it is remembered.
            let last = LastWrite {
                key: Bytes::copy_from_slice(&u.key),
                write: ack.op.seq,
                seq: u.seq,
                version: u.version.clone(),
                at_ms: now_ms,
                old: ack.old.as_deref().map(Bytes::copy_from_slice),
            };
            self.writes.applied(ack.op.client, last, ack.done_below, self.stable);
        }
        self.answer(&u, out);
        // An expiry is this site's own business (`expiry`): not reported.
        if self.reported.is_some_and(|r| u.seq > r) && u.version.site == self.site && !u.expired {
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
    fn remember(&mut self, u: &Update, now_ms: u64) {
        let before = self.history;
        self.history = chain_history(before, u);
        if self.chain.len() == 1 && !self.keep_recent {
            // Alone in its chain, with no node out that may come back:
            // nobody can ask for recent updates (a newcomer gets the state).
            // What it kept goes too: the window must be one unbroken run.
            if !self.recent.is_empty() {
                self.set_recent(VecDeque::new());
            }
            return;
        }
        self.recent_bytes += update_bytes(u);
        self.recent.push_back((u.clone(), before, now_ms));
        while self.recent_bytes > RECENT_BYTES && self.recent.len() > 1 {
            let (old, _, _) = self.recent.pop_front().expect("not empty");
            self.recent_bytes -= update_bytes(&old);
        }
    }

    /// Drops recent updates older than `RECENT_MS` (all but the last: a
    /// returning replica at this position needs none of them), unless a
    /// node is out and may return.
    fn forget_recent(&mut self, now_ms: u64) {
        // Every `FORGET_EVERY_MS`, not every tick: the oldest recent update
        // is cold memory, a cache miss per partition per tick.
        if now_ms.saturating_sub(self.forgot_ms) < FORGET_EVERY_MS {
            return;
        }
        self.forgot_ms = now_ms;
        while !self.keep_recent && self.recent.len() > 1 && self.recent.front().is_some_and(|(_, _, at)| at + RECENT_MS <= now_ms) {
            let (old, _, _) = self.recent.pop_front().expect("not empty");
            self.recent_bytes -= update_bytes(&old);
        }
        crate::shrink_idle(&mut self.recent);
        crate::shrink_idle(&mut self.unstable);
        crate::shrink_idle(&mut self.outgoing);
    }

    /// Answers the client of `u` if this position is the one it waits for.
    /// The tail also answers for positions past the end of a chain that
    /// has shrunk.
    fn answer(&self, u: &Update, out: &mut Outbox) {
        if let Some(Ack { op, at, old, .. }) = &u.ack {
            let (op, at) = (*op, *at);
            if at as usize == self.index || (self.is_tail() && at as usize > self.index) {
                let msg = Message::PutDone {
                    op,
                    version: Some(u.version.clone()),
                    seq: u.seq,
                    chain_index: self.index as u8,
                    stable: self.is_tail(),
                    stable_through: self.stable,
                    old: old.clone().map(Box::new),
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
        if self.unstable.is_empty() {
            self.last_progress_ms = now_ms;
        }
        self.unstable.extend(forward.iter().cloned());
        self.send_forward(forward, out);
    }

    /// Sends `updates` to the successor, in messages of at most
    /// `FORWARD_BYTES` of keys and values (or one update): a peer link
    /// drops a message that would take its backlog past its limit, and a
    /// resend of everything unstable would be dropped again every time.
    fn send_forward(&self, updates: Vec<Update>, out: &mut Outbox) {
        let next = self.index + 1;
        let to = Dest::Node(self.successor().expect("only non-tails forward"));
        let lazy = |part: &[Update]| part.iter().all(|u| u.ack.as_ref().is_none_or(|a| (a.at as usize) < next));
        if updates.iter().map(forward_bytes).sum::<usize>() <= FORWARD_BYTES {
            let lazy = lazy(&updates);
            return send(out, to, Message::Forward { epoch: self.epoch, partition: self.partition, updates, lazy });
        }
        let mut updates = updates.into_iter().peekable();
        while updates.peek().is_some() {
            let mut bytes = 0;
            let part: Vec<Update> = std::iter::from_fn(|| {
                let u = updates.next_if(|u| bytes == 0 || bytes + forward_bytes(u) <= FORWARD_BYTES)?;
                bytes += forward_bytes(&u);
                Some(u)
            })
            .collect();
            let lazy = lazy(&part);
            send(out, to, Message::Forward { epoch: self.epoch, partition: self.partition, updates: part, lazy });
        }
    }

    /// Tells the predecessor how far this replica is stable and durable;
    /// the tail tells every replica before it (stability is news to each
    /// of them, and a relay through each position would add a hop per
    /// position to the time a head waits for a write's dependencies).
    fn ack_upwards(&mut self, out: &mut Outbox) {
        let Some(prev) = self.predecessor() else { return };
        let (epoch, partition, seq, reported) = (self.epoch, self.partition, self.stable, self.reported.unwrap_or(0));
        let durable = self.durable();
        self.told_durable = (epoch, durable);
        let to = match self.is_tail() {
            true => &self.chain[..self.index],
            false => std::slice::from_ref(&prev),
        };
        for &node in to {
            send(out, Dest::Node(node), Message::StableUpTo { epoch, partition, seq, reported, durable });
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
        // The tail told the replicas before this one too; what only this
        // one knows (its own durability, when it is the k-th) goes up on
        // its tick.
    }

    /// Periodic work: resend unacknowledged updates if the successor has made
    /// no progress for `RETRANSMIT_MS`; expire keys (at the head) and
    /// collect tombstones (`expiry`; `floor`: what this site has applied of
    /// every other site, `None` with one site; `keep`: keys whose tombstone
    /// stays, see `collect_tombstones`).
    pub fn tick(&mut self, now_ms: u64, floor: Option<Timestamp>, keep: &dyn Fn(&[u8]) -> bool, out: &mut Outbox) {
        self.expire(now_ms, out);
        self.collect_tombstones(floor, keep);
        self.writes.prune(now_ms);
        self.store.tick(now_ms);
        self.forget_recent(now_ms);
        if self.stream.is_some() {
            self.stream_tick(now_ms, out);
        } else if self.joining && now_ms.saturating_sub(self.asked_ms) >= self.ask_every_ms {
            self.asked_ms = now_ms;
            self.ask_every_ms = (2 * self.ask_every_ms).min(MAX_ASK_MS);
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
        let stalled = now_ms.saturating_sub(self.last_progress_ms);
        if !self.unstable.is_empty()
            && stalled >= RETRANSMIT_MS
            && stalled >= crate::resend_wait_ms(RETRANSMIT_MS, self.unstable.iter().take(RESEND_SIZED).map(forward_bytes).sum())
        {
            self.last_progress_ms = now_ms;
            self.send_forward(self.unstable.iter().cloned().collect(), out);
        }
        // The replicas before the k-th learn durability with stability,
        // from the tail; what the k-th holds beyond that goes up on its
        // tick (reads at the head of versions not yet stable wait for it:
        // `Node::when_durable`).
        if self.predecessor_waits_durable() && self.told_durable < (self.epoch, self.durable()) {
            self.ack_upwards(out);
        }
    }

    /// A client read of the latest version held here (a use of the key, for
    /// eviction: `store::Access`), and this replica's position in the
    /// chain. The node answers once the version is `durable`.
    pub fn get(&mut self, key: &[u8], min: Option<&Version>, now_ms: u64) -> Result<(Item, u8), Refusal> {
        if self.joining {
            return Err(Refusal::Behind);
        }
        if self.catching_up {
            // Below this position may be versions a session saw: not yet here.
            return Err(if self.index == 0 { Refusal::NotResponsible { epoch: self.epoch } } else { Refusal::Behind });
        }
        let (stable, index) = (self.stable, self.index as u8);
        let latest = self.store.latest_used(key, now_ms);
        if let Some(min) = min {
            if latest.is_none_or(|s| (s.ts(), s.site()) < (min.ts, min.site)) {
                return Err(Refusal::Behind);
            }
        }
        if latest.is_some_and(|v| v.on_disk()) {
            // The node reads a value on disk back before it asks
            // (`Node::cold`); a caller that did not gets it read here.
            let stored = self.store.latest(key).map(|v| self.store.stored(v));
            return Ok((self.item_of(stored, now_ms), index));
        }
        Ok((item(latest, stable, now_ms), index))
    }

    /// The version of `key`'s latest write here (a delete or an expiry
    /// included), in last-writer-wins order.
    pub fn newest(&self, key: &[u8]) -> Option<(Timestamp, SiteId)> {
        self.store.latest(key).map(|v| (v.ts(), v.site()))
    }

    /// Orders the next writes after `ts` (a write here over a lost write
    /// of another site, `geo::dr`, must win over it).
    pub fn observe(&mut self, ts: Timestamp) {
        self.clock.observe(ts);
    }

    fn item_of(&self, stored: Option<Stored>, now_ms: u64) -> Item {
        match stored {
            None => Item { value: None, version: None, seq: 0, stable: true, expires_at_ms: None },
            Some(s) => {
                let value = s.live_value(now_ms).cloned();
                let expires_at_ms = value.as_ref().and(s.expires_at_ms);
                Item { value, version: Some(s.version), seq: s.seq, stable: s.seq <= self.stable, expires_at_ms }
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
        self.store.snapshot_seen(now_ms);
        let stored = self.store.latest_where(key, visible).map_err(|_| Refusal::SnapshotTooOld)?;
        Ok(self.item_of(stored, now_ms))
    }

    /// What this replica holds, to compare replicas.
    pub fn digest(&self) -> Digest {
        Digest { applied: self.applied, stable: self.stable, latest: self.store.digest() }
    }

    /// Bytes `key` takes here (MEMORY USAGE), if it is here; an expired or
    /// deleted key is not.
    pub fn key_memory(&self, key: &[u8], now_ms: u64) -> Option<usize> {
        if self.joining {
            return None;
        }
        self.store.latest(key).filter(|v| v.is_live(now_ms))?;
        self.store.key_memory(key)
    }

    /// Bytes this replica's store takes.
    pub fn store_memory(&self) -> usize {
        self.store.memory()
    }

    /// The disk tier (`crate::tier`): this replica's values move out and
    /// back in its store; these pass the node's asks through.
    pub fn enable_tier(&mut self, partition: PartitionId, policy: crate::tier::CachePolicy, tier: std::sync::Arc<dyn crate::tier::Tier>) {
        self.store.enable_tier(partition, policy, tier);
    }

    pub fn has_tier(&self) -> bool {
        self.store.has_tier()
    }

    pub fn take_tier_jobs(&mut self, into: &mut Vec<crate::tier::Job>) {
        self.store.take_jobs(into);
    }

    pub fn places(&self) -> crate::store::Places {
        self.store.places()
    }

    pub fn move_out(&mut self, want: usize) -> usize {
        self.store.move_out(want)
    }

    /// The tier wrote `id`'s value (`ok`) or could not: a value streamed
    /// in by a state transfer, or one this replica moved out.
    pub fn tier_written(&mut self, id: &crate::tier::ValueId, len: usize, ok: bool, now_ms: u64, out: &mut Outbox) {
        if !self.streamed_in(id, ok, now_ms, out) {
            self.store.moved_out(id, len, ok);
        }
    }

    pub fn moved_back(&mut self, id: &crate::tier::ValueId, value: &[u8]) {
        self.store.moved_back(id, value);
    }

    /// The version (timestamp, site) `key` has here, if any.
    pub fn version_of(&self, key: &[u8]) -> Option<(Timestamp, SiteId)> {
        self.store.latest(key).map(|v| (v.ts(), v.site()))
    }

    pub fn on_disk(&self, key: &[u8]) -> Option<crate::tier::ValueId> {
        self.store.on_disk(key)
    }

    /// Live keys held here.
    pub fn keyspace(&self, now_ms: u64) -> crate::message::Keyspace {
        self.store.keyspace(now_ms)
    }

    /// The live keys held here matching `pattern` (KEYS, SCAN); with
    /// `one`, at most one, at random (RANDOMKEY).
    pub fn keys(&mut self, pattern: Option<&[u8]>, one: bool, now_ms: u64, into: &mut Vec<Bytes>) {
        self.store.keys(pattern, one, now_ms, into)
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

/// What a client read of `latest` answers, `stable` being the replica's
/// stable watermark.
fn item(latest: Option<View<'_>>, stable: u64, now_ms: u64) -> Item {
    match latest {
        None => Item { value: None, version: None, seq: 0, stable: true, expires_at_ms: None },
        Some(v) => Item {
            value: v.live_value(now_ms).map(Bytes::copy_from_slice),
            version: Some(v.version()),
            seq: v.seq(),
            stable: v.seq() <= stable,
            expires_at_ms: v.live_value(now_ms).and(v.expires_at_ms()),
        },
    }
}
