//! The client side of ChainReaction: one session's requests, as a state
//! machine without I/O. Every shell runs it the same way: the node's Redis
//! front end one per connection (the node acting as the paper's client
//! proxy, `node/src/redis/conn.rs`), the native client library one per client
//! (`client/src/lib.rs`), the simulator many. The shell `start`s requests,
//! feeds in replies (`on_message`), what it learns about the site
//! (`reconfigured`, `unreachable`, `undeliverable`) and the time (`tick`,
//! when `next_wake` says); each call returns a `Progress`: messages to send
//! and the responses now complete, always in the order the requests were
//! made. Every shell hands it to the same loop, `Driver::pump`, with its
//! `Transport` (`transport.rs`), which sends, reports what could not be
//! reached and rechecks the site. Deadlines, retries, resends and when to
//! look for a newer partition map are decided here, with one set of
//! constants, so the shells only do I/O.
//!
//! # Pipelining: which requests of a session overlap
//!
//! A session may have many requests queued (a pipelined Redis client, a
//! batch), and their responses always come back in order. Whether they
//! also *run* at the same time is a question of the session guarantees,
//! which must hold exactly as if the requests ran one after another:
//!
//! * Only reads at the eventual level overlap, with each other. They read
//!   and write no session metadata and promise nothing about what they see,
//!   so running them together is indistinguishable from some sequential
//!   run.
//! * A causal read must not overlap an earlier read. ChainReaction keeps
//!   reads of different keys consistent by making a version visible only
//!   once everything it depends on is stable (§3.2.1, §3.3.1: "the version
//!   staleness to be only one level deep"). That argument needs the later
//!   read to be *served* after the earlier one: if session S reads `a`
//!   (version v, which depends on version u of `b`) and then `b`, sent
//!   together the read of `b` can reach a replica before u does, while the
//!   read of `a` is served later, after u became stable and v was written:
//!   S sees v and then a `b` older than u, which breaks causality. The same holds for
//!   one key (monotonic reads: two replicas of one chain). Linearizable
//!   reads overlapping each other break real-time order for the same
//!   reason.
//! * An unconditional write (SET without NX/XX/GET; DEL is not one: it
//!   answers whether the key was there) at
//!   the causal or eventual level overlaps the unconditional writes of the
//!   same level before it. Its dependencies (§3.3.1, the session's
//!   accessed objects) travel with it to its head (`Message::Put::deps`):
//!   the earlier write still in flight, named by its write id, and the
//!   session's past not yet known stable. The head, not the proxy, waits
//!   until those are stable at its node (or applied, for the same key)
//!   and orders the write after them (`node/put.rs`), so no replica can
//!   show it before its causes. A causal write therefore starts while one
//!   is in flight only if its head holds a replica of that one's
//!   partition (`Ctx::head_holds`), to wait for it there; otherwise it
//!   waits here. Replicas remember each write in flight by its id
//!   (`chain/writes.rs`), so a resent write is recognised and never
//!   applied twice; `done_below` tells them what they may forget.
//! * Every other write (conditional, GET, linearizable) must not overlap
//!   anything: its condition is decided against what the key holds, and
//!   a linearizable write must be stable before anything after it runs.
//!   A read after a write waits for it (read-your-writes).
//! * MGET, DBSIZE, FLUSHALL and topology fetches run alone, as such writes
//!   do.
//!
//! What a pipelined connection gains beyond that is no per-request
//! overhead: every request of the batch is queued at once, the next starts
//! inside the same call that completes the previous one (no wake-up in
//! between), and the shell flushes all the answers once.

mod op;
mod transport;

use crate::error::Error;
use crate::message::{Change, ClientId, Condition, Item, Keyspace, Message, NewValue};
use crate::ring::{NodeId, PartitionId, Topology};
use crate::session::Session;
use crate::version::Version;
use ahash::AHashMap;
use bytes::Bytes;
use op::{Ctx, Op, Step};
use smallvec::SmallVec;
use std::collections::VecDeque;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
pub use transport::Transport;

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
/// A request waiting this long may be waiting on a node that died or a
/// configuration that changed: the shell is asked (`Progress::recheck`) to
/// look for a newer partition map and unreachable nodes, and again every
/// `RECHECK_MS` while requests wait.
pub const RECHECK_MS: u64 = 100;

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
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        match s.to_ascii_lowercase().as_str() {
            "causal" => Ok(Consistency::Causal),
            "eventual" => Ok(Consistency::Eventual),
            "linearizable" => Ok(Consistency::Linearizable),
            _ => Err(Error::InvalidInput(format!("unknown consistency '{s}' (expected causal, eventual or linearizable)"))),
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
    /// A write: SET, DEL, EXPIRE and their family (`Change` says which).
    Put {
        key: Bytes,
        change: Change,
    },
    /// A get-transaction: a causally consistent snapshot of several keys.
    MultiGet(Vec<Bytes>),
    /// Live keys in the whole site.
    Count,
    /// Live keys of the site matching a Redis glob pattern (all of them
    /// without one), read at each partition's head (KEYS, SCAN, RANDOMKEY).
    Keys {
        pattern: Option<Bytes>,
        scope: KeyScope,
    },
    /// The bytes a key takes at one replica (MEMORY USAGE).
    MemoryUsage(Bytes),
    /// Wait until every version the session wrote or read unstable is
    /// stable: on every replica of its chain (WAIT).
    Stabilize,
    /// Drop every key on every node.
    Flush,
    /// Fetch the current topology.
    Topology,
    /// Take over a session exported elsewhere (`Session::export`), maybe
    /// in another site: once this site has applied every other site's
    /// writes the session saw (ChainReaction §3.4.2), so it never reads
    /// older than it did there. Until the timeout; then `Error::Behind`.
    Resume(Box<Session>),
    /// Fail this backup site over from its primary (`geo::dr`): answered
    /// once every node of the site refuses the keys whose last write never
    /// arrived (`Response::FailedOver` counts them). `force`: without a
    /// majority of stabilizer replicas whose notes are whole (what two of
    /// them lost together cannot be refused: it may be served older).
    Failover {
        force: bool,
    },
}

/// Which keys `Request::Keys` lists.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KeyScope {
    /// Every partition's (KEYS).
    All,
    /// One partition's: a SCAN cursor is the partition it reads next.
    /// Partitions do not move between cursors, so every key present for
    /// the whole scan is returned (some maybe twice, across a partition
    /// map change), as Redis promises.
    Cursor(u64),
    /// One key of each partition, at random (RANDOMKEY picks among them).
    Random,
}

/// What a client gets back.
#[derive(Clone, Debug, PartialEq)]
pub enum Response {
    /// `chain_index`: the chain position that served the read;
    /// `expires_at_ms`: when the value expires (Unix ms), if it does.
    Read {
        value: Option<Bytes>,
        chain_index: u8,
        expires_at_ms: Option<u64>,
    },
    /// Whether the write happened (false: its condition did not hold).
    Written(bool),
    /// A change that asked for the key's value (`Change::get`): whether it
    /// was written, and the value the key had.
    Replaced {
        written: bool,
        old: Option<Bytes>,
    },
    Values(Vec<Option<Bytes>>),
    Count(Keyspace),
    /// `Keys`: the keys, and the cursor that goes on (0 when done).
    Keys {
        keys: Vec<Bytes>,
        cursor: u64,
    },
    /// `MemoryUsage`: `None` if the key is not there.
    Memory(Option<u64>),
    Flushed,
    /// `Stabilize`: done.
    Stabilized,
    Topology(Arc<Topology>),
    Resumed,
    /// `Failover`: the keys refused until written again.
    FailedOver(u64),
}

/// Messages to send, each to its node (inline: a step usually sends one).
pub type Sends = SmallVec<[(NodeId, Message); 1]>;

/// What the shell should do after a step.
#[derive(Debug, Default)]
pub struct Progress {
    /// Messages to send.
    pub send: Sends,
    /// Responses now complete, in the order their requests were started.
    pub done: SmallVec<[Result<Response, Error>; 1]>,
    /// Look for a newer partition map (and feed it to `reconfigured`) and
    /// for unreachable nodes (`unreachable`): a request has waited
    /// `RECHECK_MS`.
    pub recheck: bool,
}

/// A request of the session, in the order it was made.
#[derive(Debug)]
enum Slot {
    /// Not started: an earlier request it may not overlap is unfinished.
    Waiting(Request, Consistency),
    /// Boxed: slots move (queue, start, finish) and an `Op` is large.
    Running(Box<Op>),
    /// Finished, held until every earlier request has finished too.
    Done(Result<Response, Error>),
}

/// What runs before a waiting request of its session (see the module doc).
/// It borrows the last write's key from its slot: `advance` walks every
/// running request of a pipeline on each reply, and a clone was a
/// reference count taken and dropped per request walked.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Before<'a> {
    Nothing,
    /// Eventual reads only: another may run with them.
    EventualReads,
    /// Unconditional writes at `level`, the last of them to `key`: another
    /// such write may run with them (the head waits for the one before).
    Writes {
        level: Consistency,
        key: &'a Bytes,
    },
    /// Nothing may run with it.
    Barrier,
}

impl<'a> Before<'a> {
    /// What runs once `request` at `level` runs too.
    fn then(self, request: &'a Request, level: Consistency) -> Before<'a> {
        match (self, pipelined(request, level)) {
            (Before::Nothing | Before::EventualReads, _) if overlaps(request, level) => Before::EventualReads,
            (Before::Nothing, Some(key)) => Before::Writes { level, key },
            (Before::Writes { level: l, .. }, Some(key)) if l == level => Before::Writes { level, key },
            _ => Before::Barrier,
        }
    }

    /// Whether `request` at `level` may start now. A causal write after
    /// one in flight may only if its head holds a replica of that one's
    /// partition, to wait for it there.
    fn lets_start(&self, request: &Request, level: Consistency, cx: &Ctx) -> bool {
        match self {
            Before::Nothing => true,
            Before::EventualReads => overlaps(request, level),
            Before::Writes { level: l, key: last } => pipelined(request, level)
                .is_some_and(|key| *l == level && (level == Consistency::Eventual || key == *last || cx.head_holds(key, last))),
            Before::Barrier => false,
        }
    }
}

/// Whether a request may run while other requests of its session run (see
/// the module doc: eventual reads, with each other).
fn overlaps(request: &Request, level: Consistency) -> bool {
    level == Consistency::Eventual && matches!(request, Request::Get(_) | Request::MultiGet(_))
}

/// The key of a write that may run while earlier writes of its session run
/// (unconditional, causal or eventual: see the module doc).
fn pipelined(request: &Request, level: Consistency) -> Option<&Bytes> {
    match request {
        Request::Put {
            key,
            change: Change { condition: Condition::Always, get: false, value: NewValue::Set(_) | NewValue::Delete, .. },
        } if level != Consistency::Linearizable => Some(key),
        _ => None,
    }
}

/// A GET the session's own node may answer in place (`Driver::read_here`):
/// where, and the version the session already saw.
#[derive(Clone, Debug)]
pub struct ReadHere {
    /// The session's own node.
    pub node: NodeId,
    pub partition: PartitionId,
    pub epoch: u64,
    pub min: Option<Version>,
}

/// One session: its metadata and its requests, in order.
#[derive(Debug)]
pub struct Driver {
    cx: Ctx,
    consistency: Consistency,
    timeout_ms: u64,
    queue: VecDeque<Slot>,
    /// When the last `Progress::recheck` was asked for.
    rechecked_ms: u64,
    /// `pump`'s buffer for replies a transport has at once, kept empty.
    replies: Vec<Message>,
}

impl Driver {
    pub fn new(id: ClientId, topology: Arc<Topology>, local: Option<NodeId>, timeout_ms: u64) -> Self {
        let cx = Ctx {
            id,
            topology,
            local,
            session: Session::default(),
            next_seq: 0,
            rng: id ^ 0x9E37_79B9_7F4A_7C15,
            down: AHashMap::new(),
            writes: Default::default(),
            noted: false,
        };
        Driver { cx, consistency: Consistency::Causal, timeout_ms, queue: VecDeque::new(), rechecked_ms: 0, replies: Vec::new() }
    }

    pub fn id(&self) -> ClientId {
        self.cx.id
    }

    pub fn topology(&self) -> &Arc<Topology> {
        &self.cx.topology
    }

    pub fn set_topology(&mut self, topology: Arc<Topology>) {
        self.cx.topology = topology;
    }

    pub fn consistency(&self) -> Consistency {
        self.consistency
    }

    /// The session's site is the primary of a disaster-recovery pair
    /// (`geo::dr`): its writes are acknowledged once the backup has noted
    /// them too.
    pub fn set_noted(&mut self, noted: bool) {
        self.cx.noted = noted;
    }

    pub fn set_consistency(&mut self, c: Consistency) {
        self.consistency = c;
    }

    pub fn session(&self) -> &Session {
        &self.cx.session
    }

    pub fn set_session(&mut self, s: Session) {
        self.cx.session = s;
    }

    /// What the site has applied of the other sites, as a node of it says
    /// (the proxy session's node, before an MGET): its snapshots may
    /// include other sites' writes up to there.
    pub fn observe_site_time(&mut self, site_time: &crate::version::VersionVector) {
        self.cx.session.observe_site_time(site_time);
    }

    /// How long a request may take, from when it starts running, before
    /// `tick` gives up on it.
    pub fn set_timeout(&mut self, timeout_ms: u64) {
        self.timeout_ms = timeout_ms;
    }

    /// Requests started and not yet handed out (running, waiting or done
    /// behind one that runs).
    pub fn in_flight(&self) -> usize {
        self.queue.len()
    }

    /// Whether some request has not been answered yet.
    pub fn is_busy(&self) -> bool {
        !self.queue.is_empty()
    }

    /// Queues `request` at the session's consistency level.
    pub fn start(&mut self, request: Request, now_ms: u64) -> Progress {
        self.start_at(request, self.consistency, now_ms)
    }

    /// Queues `request` at `consistency`, for this request only; it runs as
    /// soon as the requests before it allow (module doc). The session
    /// metadata carries over between levels: a linearizable request first
    /// waits for what the session saw unstable, as a causal write does, so
    /// mixing levels in one session keeps its causal past.
    pub fn start_at(&mut self, request: Request, consistency: Consistency, now_ms: u64) -> Progress {
        if self.queue.is_empty() {
            self.cx.down.retain(|_, until| *until > now_ms);
        }
        self.queue.push_back(Slot::Waiting(request, consistency));
        let mut p = Progress::default();
        self.advance(now_ms, &mut p);
        p
    }

    /// Whether a GET of `key` at `level` may be answered in place by the
    /// node the session runs on, as the request would be answered there
    /// (a shell that holds the node skips the message and the request's
    /// state machine, about half of a GET's instructions): nothing of the
    /// session runs or waits, so nothing can overlap it; the level reads
    /// where the session's metadata allows (causal, eventual), which is
    /// always the local node when it is legal (`Ctx::pick`); and the node
    /// holds a replica the session may read from. The shell then asks the
    /// node (`node::Node::read_now`, with this) and hands its answer to
    /// `read_answered`; if the node has none (a refusal, a wait), it starts
    /// the request as usual.
    pub fn read_here(&self, key: &Bytes, level: Consistency) -> Option<ReadHere> {
        let me = self.cx.local?;
        if !self.queue.is_empty()
            || level == Consistency::Linearizable
            || self.cx.topology.shape.coding.is_some()
            || self.cx.down.contains_key(&me)
        {
            return None;
        }
        let partition = self.cx.topology.partition_of(key);
        let at = self.cx.topology.chain(partition).nodes.iter().position(|&n| n == me)?;
        let min = match level {
            Consistency::Causal if self.cx.session.read_limit(key).is_some_and(|limit| at > limit as usize) => return None,
            Consistency::Causal => self.cx.session.min_version(key).cloned(),
            _ => None,
        };
        Some(ReadHere { node: me, partition, epoch: self.cx.topology.epoch, min })
    }

    /// The node's answer to a GET `read_here` allowed: the session takes
    /// it as the request's `Message::Value`.
    #[allow(clippy::too_many_arguments)]
    pub fn read_answered(
        &mut self,
        key: &Bytes,
        level: Consistency,
        here: ReadHere,
        item: Item,
        chain_index: u8,
        stable_through: u64,
    ) -> Response {
        op::answered_read(&mut self.cx.session, level, here.partition, key, item, chain_index, stable_through)
    }

    /// A reply from a node. Replies to abandoned attempts are ignored; a
    /// partition map nobody waits for (the shell asked for it after
    /// `Progress::recheck`) is taken as news of the configuration.
    pub fn on_message(&mut self, msg: Message, now_ms: u64) -> Progress {
        let mut p = Progress::default();
        let Some(id) = msg.op().filter(|id| id.client == self.cx.id) else { return p };
        let Some(i) = self.queue.iter().position(|s| matches!(s, Slot::Running(op) if op.awaits(id.seq, &msg))) else {
            return match msg {
                Message::TopologyIs { topology, .. } => self.reconfigured(Arc::new(*topology), now_ms),
                _ => p,
            };
        };
        let Slot::Running(op) = &mut self.queue[i] else { unreachable!("found above") };
        let step = op.on_message(&mut self.cx, msg, id.seq, now_ms);
        settle(&mut self.cx, &mut self.queue[i], step, &mut p);
        self.advance(now_ms, &mut p);
        p
    }

    /// Gives up on requests that have run longer than the timeout, retries
    /// and resends what is due (see `Op::tick`), and asks for a recheck
    /// when a request has waited `RECHECK_MS`.
    pub fn tick(&mut self, now_ms: u64) -> Progress {
        let mut p = Progress::default();
        let timeout_ms = self.timeout_ms;
        for slot in self.queue.iter_mut() {
            if let Slot::Running(op) = slot {
                let step = op.tick(&mut self.cx, timeout_ms, now_ms);
                settle(&mut self.cx, slot, step, &mut p);
            }
        }
        if self.recheck_due().is_some_and(|at| now_ms >= at) {
            self.rechecked_ms = now_ms;
            p.recheck = true;
        }
        self.advance(now_ms, &mut p);
        p
    }

    /// When `tick` next has something to do (a deadline, a retry, a resend,
    /// a recheck), or `None` while nothing runs.
    pub fn next_wake(&self) -> Option<u64> {
        let due = self.running().map(|op| op.next_due(self.timeout_ms)).min()?;
        Some(self.recheck_due().map_or(due, |at| due.min(at)))
    }

    fn running(&self) -> impl Iterator<Item = &Op> {
        self.queue.iter().filter_map(|s| match s {
            Slot::Running(op) => Some(&**op),
            _ => None,
        })
    }

    /// When the running requests next call for a recheck.
    fn recheck_due(&self) -> Option<u64> {
        let oldest = self.running().map(|op| op.started_ms).min()?;
        Some((oldest + RECHECK_MS).max(self.rechecked_ms + RECHECK_MS))
    }

    /// The shell could not send a step's messages to `node` (no
    /// connection): see `Op::undeliverable`.
    pub fn undeliverable(&mut self, node: NodeId, now_ms: u64) -> Progress {
        let known = self.cx.down.insert(node, now_ms + SUSPECT_MS).is_some();
        self.each_running(now_ms, |op, cx| op.undeliverable(cx, node, known, now_ms))
    }

    /// The shell found `node` unreachable (its connection closed): see
    /// `Op::unreachable`.
    pub fn unreachable(&mut self, node: NodeId, now_ms: u64) -> Progress {
        self.cx.down.insert(node, now_ms + SUSPECT_MS);
        self.each_running(now_ms, |op, cx| op.unreachable(cx, node, now_ms))
    }

    /// The site moved to `topology` while requests may be running: work
    /// that is safe to repeat starts over on the new chains, writes are
    /// resent with their ids (`Op::reconfigured`).
    pub fn reconfigured(&mut self, topology: Arc<Topology>, now_ms: u64) -> Progress {
        if topology.epoch <= self.cx.topology.epoch {
            return Progress::default();
        }
        self.cx.topology = topology;
        self.cx.down.clear();
        self.each_running(now_ms, |op, cx| op.reconfigured(cx, now_ms))
    }

    fn each_running(&mut self, now_ms: u64, mut f: impl FnMut(&mut Op, &mut Ctx) -> Step) -> Progress {
        let mut p = Progress::default();
        for slot in self.queue.iter_mut() {
            if let Slot::Running(op) = slot {
                let step = f(op, &mut self.cx);
                settle(&mut self.cx, slot, step, &mut p);
            }
        }
        self.advance(now_ms, &mut p);
        p
    }

    /// Starts every waiting request the ones before it allow, and hands
    /// out the finished responses at the front, in order.
    fn advance(&mut self, now_ms: u64, p: &mut Progress) {
        // Requests start in order, so those waiting are the queue's tail:
        // none waits unless the last does (a pipeline's replies then cost
        // no walk over the requests in flight).
        if matches!(self.queue.back(), Some(Slot::Waiting(..))) {
            self.start_waiting(now_ms, p);
        }
        while let Some(Slot::Done(_)) = self.queue.front() {
            let Some(Slot::Done(result)) = self.queue.pop_front() else { unreachable!("checked above") };
            p.done.push(result);
        }
    }

    /// Starts every waiting request the ones before it allow.
    fn start_waiting(&mut self, now_ms: u64, p: &mut Progress) {
        let mut before = Before::Nothing;
        for slot in self.queue.iter_mut() {
            if let Slot::Waiting(request, level) = slot {
                if !before.lets_start(request, *level, &self.cx) {
                    break;
                }
                // Moved out, not cloned; the placeholder is replaced below.
                let Slot::Waiting(request, level) = std::mem::replace(slot, Slot::Done(Err(Error::Timeout))) else {
                    unreachable!("matched above")
                };
                let (op, step) = Op::start(&mut self.cx, request, level, now_ms);
                *slot = Slot::Running(op);
                settle(&mut self.cx, slot, step, p);
            }
            // Read only from here: `before` borrows from the slot.
            let slot: &Slot = slot;
            if let Slot::Running(op) = slot {
                before = before.then(&op.request, op.consistency);
                if before == Before::Barrier {
                    // Nothing after it may start.
                    break;
                }
            }
        }
    }
}

/// Applies one request's step to its slot: what it sends goes out, and a
/// finished request keeps its response until the ones before it are done
/// (a finished write leaves the session's writes in flight).
fn settle(cx: &mut Ctx, slot: &mut Slot, step: Step, p: &mut Progress) {
    let Step { send, done } = step;
    if p.send.is_empty() {
        p.send = send;
    } else {
        p.send.extend(send);
    }
    if let Some(result) = done {
        if let Slot::Running(op) = slot {
            if let Some(write) = op.write_id() {
                cx.writes.remove(&write);
            }
        }
        *slot = Slot::Done(result);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hlc::Timestamp;
    use crate::message::{DepOn, Item, OpId, WriteDep, ACK_AT_TAIL};
    use crate::ring::{NodeInfo, Shape};
    use crate::version::Version;

    fn site() -> Arc<Topology> {
        let nodes = (0..3).map(|id| NodeInfo { id, addr: format!("n{id}") }).collect();
        Arc::new(Topology::new(1, Shape { partitions: 4, replicas: 3, k: 2, coding: None }, nodes).unwrap())
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
        let item = Item { value: Some(Bytes::from("v")), version: None, seq: 0, stable: true, expires_at_ms: None };
        let done = d.on_message(Message::Value { op, item: Box::new(item), chain_index: 2, stable_through: 0 }, 20).done;
        assert_eq!(done[..], [Ok(Response::Read { value: Some(Bytes::from("v")), chain_index: 2, expires_at_ms: None })]);
    }

    #[test]
    fn a_write_keeps_waiting_when_its_head_is_unreachable() {
        let mut d = Driver::new(7, site(), None, 5_000);
        let put = Request::Put { key: Bytes::from("k"), change: Change::set(Bytes::from("v")) };
        let p = d.start(put, 0);
        let head = p.send[0].0;
        assert!(d.unreachable(head, 10).send.is_empty(), "a write is not resent: it may have been applied");
        assert!(d.is_busy());
    }

    #[test]
    fn a_write_that_never_left_is_retried_on_a_fresh_map() {
        let mut d = Driver::new(7, site(), None, 5_000);
        let put = Request::Put { key: Bytes::from("k"), change: Change::set(Bytes::from("v")) };
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
        let p = d.on_message(Message::TopologyIs { op: *op, topology: Box::new(t) }, 300);
        assert!(matches!(&p.send[..], [(n, Message::Put { .. })] if *n == new_head));
    }

    /// Disaster recovery at the primary: a write is answered once both its
    /// chain and its backup site have it, in either order; without the
    /// backup's note it fails as not acknowledged, never as written.
    #[test]
    fn a_write_at_a_primary_waits_for_its_backup_note_too() {
        for noted_first in [false, true] {
            let mut d = Driver::new(7, site(), Some(0), 5_000);
            d.set_noted(true);
            let put = Request::Put { key: Bytes::from("k"), change: Change::set(Bytes::from("v")) };
            let p = d.start(put, 0);
            let [(_, Message::Put(put))] = &p.send[..] else { panic!("expected a put, got {:?}", p.send) };
            let write = OpId { client: 7, seq: put.write };
            let version = Version::local(0, Timestamp::new(1, 0));
            let acked =
                Message::PutDone { op: write, version: Some(version), seq: 1, chain_index: 1, stable: false, stable_through: 0, old: None };
            let noted = Message::Noted { op: write, ts: Timestamp::new(1, 0) };
            let (first, second) = match noted_first {
                true => (noted, acked),
                false => (acked, noted),
            };
            assert!(d.on_message(first, 1).done.is_empty(), "one of the two is not an acknowledgement");
            assert_eq!(d.on_message(second, 2).done[..], [Ok(Response::Written(true))]);
        }
        let mut d = Driver::new(7, site(), Some(0), 5_000);
        d.set_noted(true);
        let put = Request::Put { key: Bytes::from("k"), change: Change::set(Bytes::from("v")) };
        let p = d.start(put, 0);
        let [(_, Message::Put(put))] = &p.send[..] else { panic!("expected a put, got {:?}", p.send) };
        let write = OpId { client: 7, seq: put.write };
        let version = Version::local(0, Timestamp::new(1, 0));
        let acked =
            Message::PutDone { op: write, version: Some(version), seq: 1, chain_index: 1, stable: false, stable_through: 0, old: None };
        // A note of another version (an earlier attempt, ordered by a head
        // that failed) does not acknowledge this one.
        assert!(d.on_message(Message::Noted { op: write, ts: Timestamp::new(0, 5) }, 1).done.is_empty());
        assert!(d.on_message(acked, 1).done.is_empty());
        assert_eq!(d.tick(5_001).done[..], [Err(Error::NotNoted)]);
    }

    #[test]
    fn a_request_can_run_at_its_own_level() {
        let t = site();
        let mut d = Driver::new(7, t.clone(), Some(0), 5_000);
        let chain = t.chain(t.partition_of(b"k")).clone();
        let put = Request::Put { key: Bytes::from("k"), change: Change::set(Bytes::from("v")) };
        let p = d.start_at(put, Consistency::Linearizable, 0);
        let [(_, Message::Put(put))] = &p.send[..] else { panic!("expected a put, got {:?}", p.send) };
        let (op, ack_at) = (&put.op, &put.ack_at);
        assert_eq!(*ack_at, ACK_AT_TAIL, "answered by the tail");
        let version = Version::local(0, Timestamp::new(1, 0));
        let acked =
            Message::PutDone { op: *op, version: Some(version), seq: 1, chain_index: 2, stable: true, stable_through: 0, old: None };
        assert_eq!(d.on_message(acked, 1).done[..], [Ok(Response::Written(true))]);
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
        let version = Version::local(0, Timestamp::new(1, 0));
        let item = Item { value: Some(Bytes::from("x")), version: Some(version), seq: 4, stable: false, expires_at_ms: None };
        let at = t.chain(t.partition_of(b"a")).index_of(*at).unwrap() as u8;
        assert_eq!(d.on_message(Message::Value { op: *op, item: Box::new(item), chain_index: at, stable_through: 0 }, 1).done.len(), 1);
        let put = Request::Put { key: Bytes::from("b"), change: Change::set(Bytes::from("v")) };
        let p = d.start_at(put, Consistency::Linearizable, 2);
        assert!(matches!(&p.send[..], [(_, Message::WaitStable { seq: 4, .. })]), "got {:?}", p.send);
    }

    fn set(key: &str, value: &str) -> Request {
        Request::Put { key: Bytes::from(key.to_string()), change: Change::set(Bytes::from(value.to_string())) }
    }

    fn get(key: &str) -> Request {
        Request::Get(Bytes::from(key.to_string()))
    }

    fn op_of(msg: &Message) -> OpId {
        msg.op().expect("a request message")
    }

    fn value(op: OpId, v: &str, version: Option<Version>, seq: u64, chain_index: u8) -> Message {
        let item = Item { value: Some(Bytes::from(v.to_string())), version, seq, stable: false, expires_at_ms: None };
        Message::Value { op, item: Box::new(item), chain_index, stable_through: 0 }
    }

    #[test]
    fn a_read_is_answered_in_place_only_where_and_when_the_request_would_read_locally() {
        let t = site();
        let k = Bytes::from("k");
        let partition = t.partition_of(&k);
        let chain = t.chain(partition).clone();
        assert!(Driver::new(7, t.clone(), None, 5_000).read_here(&k, Consistency::Causal).is_none(), "a native session has no node");
        let mut at_head = Driver::new(7, t.clone(), Some(chain.head()), 5_000);
        let mut at_tail = Driver::new(8, t.clone(), Some(chain.tail()), 5_000);
        let here = at_tail.read_here(&k, Consistency::Causal).expect("a session that saw nothing of k reads anywhere");
        assert_eq!((here.node, here.partition, here.epoch, here.min), (chain.tail(), partition, 1, None));
        assert!(at_tail.read_here(&k, Consistency::Linearizable).is_none(), "linearizable reads go by the tail's lease");
        // Both sessions write k, acknowledged at position 1 (the tail may
        // not have it yet).
        let v1 = Version::local(0, Timestamp::new(1, 0));
        for d in [&mut at_head, &mut at_tail] {
            let p = d.start(set("k", "v1"), 0);
            assert!(d.read_here(&k, Consistency::Eventual).is_none(), "nothing overlaps a write in flight");
            assert_eq!(d.on_message(acked_at_1(op_of(&p.send[0].1), v1.clone()), 1).done[..], [Ok(Response::Written(true))]);
        }
        assert!(at_tail.read_here(&k, Consistency::Causal).is_none(), "the tail is past the write's position");
        assert!(at_tail.read_here(&k, Consistency::Eventual).is_some(), "an eventual read goes anywhere");
        let here = at_head.read_here(&k, Consistency::Causal).expect("the head has every write");
        assert_eq!(here.min.as_ref(), Some(&v1), "and must hold the one the session wrote");
        // The head's answer counts as the read's: stable, so the session
        // may read k anywhere again.
        let item = Item { value: Some(Bytes::from("v1")), version: Some(v1.clone()), seq: 1, stable: true, expires_at_ms: None };
        let response = at_head.read_answered(&k, Consistency::Causal, here, item, 0, 1);
        assert_eq!(response, Response::Read { value: Some(Bytes::from("v1")), chain_index: 0, expires_at_ms: None });
        assert!(!at_head.is_busy());
        assert_eq!(at_head.session().min_version(&k), None);
        // The tail session learns it through a read by message.
        let p = at_tail.start(get("k"), 2);
        let [(node, Message::Get { op, .. })] = &p.send[..] else { panic!("expected a get, got {:?}", p.send) };
        assert!(chain.index_of(*node).unwrap() <= 1);
        let stable = Item { value: Some(Bytes::from("v1")), version: Some(v1), seq: 1, stable: true, expires_at_ms: None };
        let p = at_tail.on_message(Message::Value { op: *op, item: Box::new(stable), chain_index: 1, stable_through: 1 }, 3);
        assert_eq!(p.done.len(), 1);
        assert!(at_tail.read_here(&k, Consistency::Causal).is_some());
    }

    /// A write's acknowledgement at chain position 1, not stable.
    fn acked_at_1(op: OpId, version: Version) -> Message {
        Message::PutDone { op, version: Some(version), seq: 1, chain_index: 1, stable: false, stable_through: 0, old: None }
    }

    #[test]
    fn a_causal_pipeline_runs_in_order_and_reads_its_own_writes() {
        let t = site();
        let mut d = Driver::new(7, t.clone(), Some(0), 5_000);
        let chain = t.chain(t.partition_of(b"k")).clone();
        // SET k v1; GET k; SET j v2; GET j, all queued at once.
        let p = d.start(set("k", "v1"), 0);
        assert!(matches!(&p.send[..], [(_, Message::Put { .. })]), "got {:?}", p.send);
        let first = op_of(&p.send[0].1);
        for r in [get("k"), set("j", "v2"), get("j")] {
            assert!(d.start(r, 0).send.is_empty(), "nothing overtakes the write and the read");
        }
        // The write is acknowledged at position 1: the read starts in the
        // same step and may only go to positions 0..=1 (read-your-writes).
        let v1 = Version::local(0, Timestamp::new(1, 0));
        let p = d.on_message(
            Message::PutDone { op: first, version: Some(v1.clone()), seq: 1, chain_index: 1, stable: false, stable_through: 0, old: None },
            1,
        );
        assert_eq!(p.done[..], [Ok(Response::Written(true))]);
        let [(at, Message::Get { op, min, .. })] = &p.send[..] else { panic!("expected the read, got {:?}", p.send) };
        assert!(chain.index_of(*at).unwrap() <= 1);
        assert_eq!(min.as_deref(), Some(&v1));
        // The read answers; the second write carries the first as a
        // dependency its head waits for (every node holds every partition
        // here), instead of the session waiting for it to be stable.
        let p = d.on_message(value(*op, "v1", Some(v1.clone()), 1, 1), 2);
        assert_eq!(p.done[..], [Ok(Response::Read { value: Some(Bytes::from("v1")), chain_index: 1, expires_at_ms: None })]);
        let [(_, Message::Put(put))] = &p.send[..] else { panic!("expected the second write, got {:?}", p.send) };
        let (op, deps) = (&put.op, &put.deps);
        assert_eq!(deps, &vec![WriteDep { partition: t.partition_of(b"k"), on: DepOn::Seq(1), same_key: false }]);
        let v2 = Version::local(0, Timestamp::new(4, 0));
        let p = d.on_message(
            Message::PutDone { op: *op, version: Some(v2.clone()), seq: 2, chain_index: 1, stable: false, stable_through: 0, old: None },
            4,
        );
        assert_eq!(p.done[..], [Ok(Response::Written(true))]);
        let [(_, Message::Get { op, min, .. })] = &p.send[..] else { panic!("expected the last read, got {:?}", p.send) };
        assert_eq!(min.as_deref(), Some(&v2), "the last read must see the second write");
        let p = d.on_message(value(*op, "v2", Some(v2), 2, 1), 5);
        assert_eq!(p.done[..], [Ok(Response::Read { value: Some(Bytes::from("v2")), chain_index: 1, expires_at_ms: None })]);
        assert!(!d.is_busy());
    }

    #[test]
    fn pipelined_writes_run_together_each_naming_the_one_before() {
        let t = site();
        let mut d = Driver::new(7, t.clone(), Some(0), 5_000);
        let mut puts = Vec::new();
        for (k, v) in [("a", "1"), ("b", "2"), ("a", "3")] {
            let p = d.start(set(k, v), 0);
            let [(_, Message::Put(put))] = &p.send[..] else { panic!("each write leaves at once: {:?}", p.send) };
            let (write, deps, done_below) = (&put.write, &put.deps, &put.done_below);
            puts.push((*write, deps.clone(), *done_below));
        }
        let (w1, w2) = (puts[0].0, puts[1].0);
        assert!(puts[0].1.is_empty(), "nothing before the first");
        assert_eq!(puts[1].1, vec![WriteDep { partition: t.partition_of(b"a"), on: DepOn::Write(w1), same_key: false }]);
        assert_eq!(puts[2].1, vec![WriteDep { partition: t.partition_of(b"b"), on: DepOn::Write(w2), same_key: false }]);
        assert!(puts.iter().all(|p| p.2 == w1), "the first is unfinished");
        // A read waits for the writes before it.
        assert!(d.start(get("a"), 0).send.is_empty());
        // The second write's acknowledgement arrives first; answers stay in order.
        let v = |ms| Version::local(0, Timestamp::new(ms, 0));
        let ack = |w, ms| Message::PutDone {
            op: OpId { client: 7, seq: w },
            version: Some(v(ms)),
            seq: ms,
            chain_index: 1,
            stable: false,
            stable_through: 0,
            old: None,
        };
        assert!(d.on_message(ack(w2, 2), 3).done.is_empty());
        assert_eq!(d.on_message(ack(w1, 1), 3).done.len(), 2);
        let deps: Vec<Bytes> = d.session().dependencies().map(|(k, _)| k.clone()).collect();
        assert_eq!(deps, vec![Bytes::from("b")], "the first write's late acknowledgement adds nothing to wait for");
    }

    #[test]
    fn a_write_after_a_later_write_acknowledged_first_waits_for_that_one_too() {
        // Writes a, b pipelined; b's acknowledgement (unstable) arrives
        // while a is still in flight; c starts then. Naming a alone would
        // let c's head order c before b is stable: a reader of c could
        // then miss b.
        let t = site();
        let mut d = Driver::new(7, t.clone(), Some(0), 5_000);
        let wa = match &d.start(set("a", "1"), 0).send[..] {
            [(_, Message::Put(put))] => put.write,
            other => panic!("{other:?}"),
        };
        let [(_, Message::Put(put))] = &d.start(set("b", "2"), 0).send[..] else { panic!("the second write leaves at once") };
        let ack = Message::PutDone {
            op: put.op,
            version: Some(Version::local(0, Timestamp::new(2, 0))),
            seq: 5,
            chain_index: 1,
            stable: false,
            stable_through: 0,
            old: None,
        };
        assert!(d.on_message(ack, 1).done.is_empty(), "answers stay in order");
        let [(_, Message::Put(put))] = &d.start(set("c", "3"), 2).send[..] else { panic!("the third write leaves at once") };
        assert_eq!(
            put.deps,
            vec![
                WriteDep { partition: t.partition_of(b"a"), on: DepOn::Write(wa), same_key: false },
                WriteDep { partition: t.partition_of(b"b"), on: DepOn::Seq(5), same_key: false },
            ]
        );
    }

    #[test]
    fn a_write_whose_head_holds_no_replica_of_a_dependency_waits_for_it_first() {
        let nodes = (0..6).map(|id| NodeInfo { id, addr: format!("n{id}") }).collect();
        let t = Arc::new(Topology::new(1, Shape { partitions: 16, replicas: 2, k: 1, coding: None }, nodes).unwrap());
        let keys: Vec<String> = (0..64).map(|i| format!("k{i}")).collect();
        let holds = |a: &str, b: &str| t.chain(t.partition_of(b.as_bytes())).nodes.contains(&t.chain(t.partition_of(a.as_bytes())).head());
        let (a, b) = keys
            .iter()
            .flat_map(|a| keys.iter().map(move |b| (a, b)))
            .find(|(a, b)| !holds(a, b))
            .expect("some head holds no replica of another key's partition");
        let mut d = Driver::new(7, t.clone(), None, 5_000);
        let p = d.start(get(b), 0);
        let [(_, Message::Get { op, .. })] = &p.send[..] else { panic!("{:?}", p.send) };
        let item = Item {
            value: Some(Bytes::from("x")),
            version: Some(Version::local(0, Timestamp::new(1, 0))),
            seq: 9,
            stable: false,
            expires_at_ms: None,
        };
        d.on_message(Message::Value { op: *op, item: Box::new(item), chain_index: 0, stable_through: 0 }, 1);
        let p = d.start(set(a, "v"), 2);
        assert!(matches!(&p.send[..], [(_, Message::WaitStable { seq: 9, .. })]), "the session waits: {:?}", p.send);
        // And a write after one in flight whose partition its head does not
        // hold waits for that one to finish.
        let mut d = Driver::new(8, t.clone(), None, 5_000);
        assert_eq!(d.start(set(b, "1"), 0).send.len(), 1);
        assert!(d.start(set(a, "2"), 0).send.is_empty());
    }

    #[test]
    fn causal_reads_of_different_keys_do_not_overlap() {
        let mut d = Driver::new(7, site(), None, 5_000);
        assert_eq!(d.start(get("a"), 0).send.len(), 1);
        assert!(d.start(get("b"), 0).send.is_empty(), "the second read waits for the first to be served");
    }

    #[test]
    fn eventual_reads_overlap_and_answer_in_order() {
        let mut d = Driver::new(7, site(), None, 5_000);
        d.set_consistency(Consistency::Eventual);
        let ops: Vec<OpId> = ["a", "b", "c"].iter().map(|k| op_of(&d.start(get(k), 0).send[0].1)).collect();
        // Answers arrive last first: held until the first is answered.
        assert!(d.on_message(value(ops[2], "c", None, 0, 0), 1).done.is_empty());
        assert!(d.on_message(value(ops[1], "b", None, 0, 0), 1).done.is_empty());
        let done = d.on_message(value(ops[0], "a", None, 0, 0), 1).done;
        let values: Vec<_> = done
            .into_iter()
            .map(|r| match r {
                Ok(Response::Read { value, .. }) => value.unwrap(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(values, vec![Bytes::from("a"), Bytes::from("b"), Bytes::from("c")]);
    }

    #[test]
    fn a_write_is_a_barrier_even_at_the_eventual_level() {
        let mut d = Driver::new(7, site(), None, 5_000);
        d.set_consistency(Consistency::Eventual);
        let read = op_of(&d.start(get("a"), 0).send[0].1);
        assert!(d.start(set("b", "x"), 0).send.is_empty(), "the write waits for the read");
        assert!(d.start(get("c"), 0).send.is_empty(), "and the read after it for the write");
        let p = d.on_message(value(read, "a", None, 0, 0), 1);
        let [(_, Message::Put(put))] = &p.send[..] else { panic!("expected the write, got {:?}", p.send) };
        let op = &put.op;
        let version = Version::local(0, Timestamp::new(2, 0));
        let p = d.on_message(
            Message::PutDone { op: *op, version: Some(version), seq: 1, chain_index: 0, stable: false, stable_through: 0, old: None },
            2,
        );
        assert!(matches!(&p.send[..], [(_, Message::Get { .. })]), "got {:?}", p.send);
    }

    #[test]
    fn a_waiting_request_asks_for_a_recheck_every_interval_and_times_out() {
        let mut d = Driver::new(7, site(), None, 1_000);
        assert_eq!(d.next_wake(), None);
        d.start(get("a"), 0);
        d.start(get("b"), 0);
        assert_eq!(d.next_wake(), Some(RECHECK_MS));
        assert!(!d.tick(RECHECK_MS - 1).recheck);
        assert!(d.tick(RECHECK_MS).recheck);
        assert!(!d.tick(RECHECK_MS + 50).recheck);
        assert_eq!(d.next_wake(), Some(2 * RECHECK_MS));
        // The first read times out; the second starts then, with its own
        // deadline.
        let p = d.tick(1_000);
        assert_eq!(p.done[..], [Err(Error::Timeout)]);
        assert!(matches!(&p.send[..], [(_, Message::Get { .. })]));
        assert!(d.tick(1_999).done.is_empty());
        assert_eq!(d.tick(2_000).done[..], [Err(Error::Timeout)]);
    }

    #[test]
    fn a_newer_map_nobody_asked_for_moves_the_requests() {
        let t = site();
        let mut d = Driver::new(7, t.clone(), None, 5_000);
        let head = d.start(set("k", "v"), 0).send[0].0;
        let mut moved = (*t).clone().without(head);
        moved.epoch = 2;
        let new_head = moved.chain(moved.partition_of(b"k")).head();
        // The answer to a recheck the shell sent on its own.
        let p = d.on_message(Message::TopologyIs { op: OpId { client: 7, seq: u64::MAX }, topology: Box::new(moved) }, 150);
        assert!(matches!(&p.send[..], [(n, Message::Put { .. })] if *n == new_head), "resent to the new head, got {:?}", p.send);
        assert_eq!(d.topology().epoch, 2);
    }

    #[test]
    fn an_unreachable_node_moves_only_the_reads_waiting_on_it() {
        let mut d = Driver::new(7, site(), None, 5_000);
        d.set_consistency(Consistency::Eventual);
        let sent: Vec<(NodeId, OpId)> =
            (0..12).map(|i| d.start(get(&format!("k{i}")), 0).send.into_iter().map(|(n, m)| (n, op_of(&m))).next().unwrap()).collect();
        let down = sent[0].0;
        let waiting = sent.iter().filter(|(n, _)| *n == down).count();
        let p = d.unreachable(down, 10);
        assert_eq!(p.send.len(), waiting, "each read that went to {down} is sent again");
        assert!(p.send.iter().all(|(n, _)| *n != down));
        // Another read's answer still counts, held until the first (moved)
        // one is answered.
        let (_, other) = sent.iter().find(|(n, _)| *n != down).unwrap();
        assert!(d.on_message(value(*other, "x", None, 0, 0), 11).done.is_empty());
        assert!(d.is_busy());
    }
}
