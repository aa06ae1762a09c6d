//! One member of an erasure-coded group.
//!
//! **Update** (data member i, a SET or DEL of a key it owns): place the
//! value in the area (a hole of its size class or the end), write it at
//! once and send the diff (`old ^ new` of those bytes) with the key's new
//! place to every live parity member (`Update`, stamped with i's next
//! `Stamp`). A parity member folds `coefficient * diff` into its parity at
//! once, records the place in its replica of i's metadata, keeps the update
//! in a buffer (it may have to be undone) and answers `Ack`. Once every
//! live parity member has acknowledged an update and everything before it,
//! the data member commits: the key points at the new place (reads see
//! it), the old place becomes a hole, the client is answered, and the
//! parity members hear `Commit` and forget the buffered updates. Nothing is
//! acknowledged before it is on the data member and every live parity
//! member (M+1 members while none is lost).
//!
//! **Recovery** of lost data slots, led by the first live parity member:
//! * Preparation. The leader asks every live parity member for the last
//!   update it received from each lost slot (`Prepare`/`Received`); the
//!   smallest is the stable stamp (every committed update is at or below
//!   it, because committing needs every parity member's ack). Each parity
//!   member undoes the lost slots' buffered updates above it (XOR is its own
//!   inverse), keeps those at or below, and refuses any more from earlier
//!   epochs (`Stable`/`Prepared`). Now all parity members agree on the lost
//!   slots, and the leader serves them from its replica of their metadata,
//!   stamping its updates with the new epoch.
//! * Online page repair. A page of a lost slot is decoded from the other
//!   data slots' page and the parity's, taken at one consistent cut: the
//!   leader asks the data members (`Cut`); each sends its page as it is at
//!   that point of its FIFO stream, and a `Marker` to the parity members
//!   that will decode; a parity member copies its page at the first marker
//!   and keeps adding the updates of the data slots whose marker has not
//!   arrived yet, so the copy holds exactly the updates in the data pages.
//!   Requests that touch a missing page wait for it (it is repaired first);
//!   the rest is repaired in the background, a few pages at a time.
//!
//! **Giving pages back**: a page of a data area no value is on any more
//! is zeroed by an update that changes no key (`gives_back`), its diff the
//! page's bytes, so the parity drops the page's share as for any update,
//! and dropped (`give_back`); a parity page goes once its stripe is all
//! zeros.
//!
//! **Expiry**, as Redis's primary does it: the member serving a data slot
//! decides a write's expiry (`chain::change::decide`, the same rules as a
//! chain's head), keeps the instant in the key's metadata, answers reads
//! of a key past it with nothing, and deletes such keys with ordinary
//! updates (`tick`), so parity members never disagree about a key.
//!
//! A leader that fails is replaced by the next live parity member, which
//! prepares the slots again (the old leader's committed writes are in every
//! parity) and repairs them from scratch.
//!
//! **Replacement** of a lost member by a new, empty one (a restarted
//! process), `joining` in the configuration:
//! * A parity member asks the member serving each data slot for its state
//!   (`Join`): the server sends its pages and metadata as they are, with
//!   its updates not committed yet (`State`, in parts), and from then on
//!   sends it every update and waits for its acknowledgement too, so the
//!   parity built from the state plus the updates that follow is the
//!   slot's. A new configuration while joining starts it over. Once every
//!   slot's state is in, its node says it is alive; a server that never
//!   sent it its slot's state (the slot changed server meanwhile) tells it
//!   it is `Stale`, and it starts over.
//! * A data member, once alive, takes its slot back from the leader like a
//!   leader takes a lost one: it prepares (the leader answers only once it
//!   has let the slot go), fetches the metadata replica from the leader
//!   (`Join`/`State` without pages), and serves the slot with every page
//!   missing, decoded at cuts as above. A cut's source that has not
//!   decoded the page yet either (two slots handed back at once) sends no
//!   pages, only its marker, and is decoded too, with one more parity
//!   member's pages.

use super::area::{pages_of, Area, Free, PAGE};
use super::code::Code;
use super::index::Index;
use crate::chain::change::{decide, Current};
use crate::message::ec::{gives_back, Diff, EcMsg, Loc, Meta, Received, Sessions, Slot, Stamp, StateEnd, StatePending, WriteId};
use crate::message::{Change, NewValue};
use bytes::Bytes;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

/// A key as the metadata keeps it: its bytes alone (16 bytes and the bytes,
/// where `Bytes` takes 32 and may hold a larger buffer alive).
type Key = Box<[u8]>;

/// Pages repaired per cut in the background.
const BATCH: usize = 16;
/// Background cuts in flight at once.
const IN_FLIGHT: usize = 2;
/// How long (ms) an update (or a preparation step) waits for its answers
/// before it is sent again: a link that broke lost it.
const RESEND_MS: u64 = 200;
/// How often (ms) sessions that stopped writing are forgotten.
const SWEEP_MS: u64 = 1_000;
/// Expired keys a served slot deletes per tick, at most.
const EXPIRE_PER_TICK: usize = 256;
/// Pages (128 KB) a served slot gives back in one update; it sends the
/// next once that one is committed. (At 1 MB per update and per tick, a
/// FLUSHALL of 500k keys of 1 KB on a 5-node site queued more than the
/// peer links' backlog limit: messages were dropped and nodes removed.)
const GIVE_BACK_PAGES: usize = 32;
/// The op of a member's own writes (expiry): nobody waits for their answer.
pub const OWN_OP: u64 = u64::MAX;
/// How long (ms) a page repair may take before it is given up and
/// started again.
const REPAIR_MS: u64 = 2_000;
/// How long (ms) a joining member waits for the next part of a slot's
/// state before it asks again.
const JOIN_RETRY_MS: u64 = 3_000;
/// Pages (1 MB) and metadata entries in one part of a slot's state, and
/// parts in flight to the receiver at once (the state of a large slot
/// would otherwise fill the link past what it holds).
const STATE_PAGES: usize = 256;
const STATE_ENTRIES: usize = 16_384;
const STATE_WINDOW: u32 = 4;

/// Who is alive in the group, as the coordinator decided at `epoch`, and
/// who is coming back: a member `joining` is being rebuilt (a parity
/// member gets every data slot's state; a data member nothing yet: its slot
/// is still served by the leader) and counts as lost until it is alive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub epoch: u64,
    pub k: u8,
    pub m: u8,
    pub alive: Vec<bool>,
    pub joining: Vec<bool>,
}

impl Config {
    pub fn new(k: u8, m: u8) -> Config {
        Config { epoch: 1, k, m, alive: vec![true; (k + m) as usize], joining: vec![false; (k + m) as usize] }
    }

    /// The next configuration, with `slot` failed.
    pub fn without(&self, slot: Slot) -> Config {
        let mut c = self.clone();
        c.epoch += 1;
        c.alive[slot as usize] = false;
        c.joining[slot as usize] = false;
        c
    }

    /// The next configuration, with a replacement of lost `slot` joining.
    pub fn rejoining(&self, slot: Slot) -> Config {
        let mut c = self.without(slot);
        c.joining[slot as usize] = true;
        c
    }

    /// The next configuration, with `slot` (rebuilt) alive.
    pub fn with(&self, slot: Slot) -> Config {
        let mut c = self.clone();
        c.epoch += 1;
        c.alive[slot as usize] = true;
        c.joining[slot as usize] = false;
        c
    }

    pub fn is_data(&self, slot: Slot) -> bool {
        slot < self.k
    }

    pub fn live_parity(&self) -> impl Iterator<Item = Slot> + '_ {
        (self.k..self.k + self.m).filter(|&s| self.alive[s as usize])
    }

    /// The member leading the recovery of lost data slots.
    pub fn leader(&self) -> Option<Slot> {
        self.live_parity().next()
    }

    pub fn lost(&self) -> Vec<Slot> {
        (0..self.k).filter(|&s| !self.alive[s as usize]).collect()
    }

    /// The member serving data slot `slot`: itself, or the leader.
    pub fn acting(&self, slot: Slot) -> Option<Slot> {
        if self.alive[slot as usize] {
            Some(slot)
        } else {
            self.leader()
        }
    }

    fn parity_mask(&self) -> u64 {
        self.live_parity().fold(0, |m, s| m | 1 << s)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Out {
    Send { to: Slot, msg: EcMsg },
    Reply { op: u64, reply: Reply },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// The write is committed: M+1 members hold it (`None`: its condition
    /// did not hold, or a DEL found nothing; nothing was written). `old`:
    /// the value the key had, if asked for.
    Done { version: Option<u64>, old: Option<Bytes> },
    /// The value, its version and its expiry (Unix ms), or nothing.
    Value(Option<(Bytes, u64, Option<u64>)>),
    /// This member does not serve that slot at its configuration.
    NotHere,
}

/// What a member holds, by part (bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Memory {
    /// Bytes in data pages and in parity pages.
    pub data: usize,
    pub parity: usize,
    /// Placed bytes of data areas (values, holes, padding) and of holes.
    pub placed: u64,
    pub holes: u64,
    /// Keys of the data slots served here, and metadata replicas kept for
    /// other members' slots.
    pub keys: usize,
    pub replicas: usize,
    /// Buffered, uncommitted updates at a parity member.
    pub buffered: usize,
    /// Pages of taken-over slots not repaired yet, and repaired so far.
    pub missing: usize,
    pub repaired: u64,
    /// Data pages given back so far (`Member::give_back`).
    pub given_back: u64,
    /// Keys with an expiry in the slots served here, and keys expired
    /// (deleted by this member) so far.
    pub expires: usize,
    pub expired: u64,
}

impl std::ops::AddAssign for Memory {
    fn add_assign(&mut self, o: Memory) {
        self.data += o.data;
        self.parity += o.parity;
        self.placed += o.placed;
        self.holes += o.holes;
        self.keys += o.keys;
        self.replicas += o.replicas;
        self.buffered += o.buffered;
        self.missing += o.missing;
        self.repaired += o.repaired;
        self.given_back += o.given_back;
        self.expires += o.expires;
        self.expired += o.expired;
    }
}

/// A client's change to a key (SET with its options, DEL, EXPIRE, ...), at
/// `version` (or just above the key's current one if that is not above
/// it). `id` names the client request, so that a resend is answered
/// without writing again.
#[derive(Clone, Debug)]
pub struct PutReq {
    pub key: Bytes,
    pub change: Change,
    pub version: u64,
    pub id: Option<WriteId>,
}

enum Req {
    Put { op: u64, put: PutReq },
    Get { op: u64, key: Bytes },
}

/// The writes of each session done here lately (session -> write number ->
/// version), kept until the session says it finished them, and the number
/// below which it has finished every write (the highest `done_below` seen).
/// A session that stops writing is forgotten `WRITE_MEMORY_MS` after its
/// last write, as a chain's replica forgets it (`chain::writes`).
#[derive(Clone, Default)]
struct Recent(HashMap<u64, Session>);

#[derive(Clone, Default)]
struct Session {
    finished_below: u64,
    writes: BTreeMap<u64, u64>,
    /// When it last wrote (the member's clock, ms).
    last_ms: u64,
}

/// What a member knows of a client's write request.
enum Seen {
    New,
    /// Done here, at this version: a resend is answered with it.
    Done(u64),
    /// Below what its session has finished: a copy that wandered (held by a
    /// paused node, say) and arrives after the session went on. Applying it
    /// would put an old value back over newer ones.
    Finished,
}

impl Recent {
    fn seen(&mut self, id: WriteId) -> Seen {
        let Some(session) = self.0.get_mut(&id.client) else { return Seen::New };
        session.finish(id.done_below);
        if id.write < session.finished_below {
            return Seen::Finished;
        }
        session.writes.get(&id.write).map_or(Seen::New, |&v| Seen::Done(v))
    }

    fn insert(&mut self, id: WriteId, version: u64, now_ms: u64) {
        let session = self.0.entry(id.client).or_default();
        session.finish(id.done_below);
        session.writes.insert(id.write, version);
        session.last_ms = now_ms;
    }

    fn forget_idle(&mut self, now_ms: u64) {
        self.0.retain(|_, s| now_ms.saturating_sub(s.last_ms) < crate::chain::WRITE_MEMORY_MS);
    }

    /// As a slot's state carries it (client, finished below, writes).
    fn export(&self) -> Sessions {
        self.0.iter().map(|(&c, s)| (c, s.finished_below, s.writes.iter().map(|(&w, &v)| (w, v)).collect())).collect()
    }

    fn import(sessions: Sessions, now_ms: u64) -> Recent {
        let session = |(finished_below, writes): (u64, Vec<(u64, u64)>)| Session {
            finished_below,
            writes: writes.into_iter().collect(),
            last_ms: now_ms,
        };
        Recent(sessions.into_iter().map(|(c, f, w)| (c, session((f, w)))).collect())
    }

    fn remove(&mut self, id: WriteId) {
        if let Some(session) = self.0.get_mut(&id.client) {
            session.writes.remove(&id.write);
        }
    }
}

impl Session {
    fn finish(&mut self, below: u64) {
        if below > self.finished_below {
            self.finished_below = below;
            self.writes = self.writes.split_off(&below);
        }
    }
}

/// A data slot this member serves: its own, or a lost one it took over.
struct Data {
    area: Area,
    free: Free,
    /// Committed places: what reads see.
    index: Index,
    /// The committed keys with an expiry, soonest first.
    expiring: BTreeSet<(u64, Key)>,
    /// Committed writes by request id.
    recent: Recent,
    next: Stamp,
    /// The last update sent (what a cut's marker names), and whom it went
    /// to (all ones: not known).
    last: Stamp,
    last_to: u64,
    pending: VecDeque<Pending>,
    /// Pages not repaired yet (a taken-over slot).
    missing: BTreeSet<u32>,
    /// Requests waiting for missing pages, in arrival order.
    queue: VecDeque<(Req, Vec<u32>)>,
    /// Rebuilding parity members sent this slot's state at the current
    /// configuration: its updates go to them too, and commit waits for
    /// their acknowledgements as for the live ones'.
    joined: u64,
}

struct Pending {
    stamp: Stamp,
    key: Bytes,
    meta: Option<Meta>,
    version: u64,
    diffs: Vec<Diff>,
    /// Parity members that have not acknowledged yet, and all it went to.
    waiting: u64,
    to: u64,
    op: u64,
    /// Resends of the same request that arrived meanwhile.
    also: Vec<u64>,
    id: Option<WriteId>,
    /// The value the key had, if the request asked for it.
    old: Option<Bytes>,
    /// When it was last sent (ms).
    sent: u64,
}

impl Pending {
    /// An update not stamped and sent yet (`Member::issue`).
    fn new(key: Bytes, meta: Option<Meta>, version: u64, diffs: Vec<Diff>, op: u64, id: Option<WriteId>, old: Option<Bytes>) -> Pending {
        let (stamp, waiting, to, sent, also) = (Stamp::default(), 0, 0, 0, Vec::new());
        Pending { stamp, key, meta, version, diffs, waiting, to, op, also, id, old, sent }
    }
}

/// A parity member's part.
struct Parity {
    j: usize,
    area: Area,
    /// Per data slot: its metadata as received, the last update received,
    /// the updates not committed yet, the end of its bytes, and the epoch
    /// below which its updates are refused.
    index: Vec<Index>,
    received: Vec<Stamp>,
    buffer: Vec<VecDeque<Buffered>>,
    extent: Vec<u64>,
    fence: Vec<u64>,
    /// Per data slot: the stamp epoch of the server whose updates this
    /// member follows (set by each change of server it took part in, or
    /// by the state it was rebuilt from).
    source: Vec<u64>,
    /// Per data slot: whom the last update received went to (all ones: not
    /// known).
    to: Vec<u64>,
    /// The sessions' recent writes of each data slot (`Recent`): a leader
    /// taking the slot over answers their resends.
    recent: Vec<Recent>,
    /// Copies at cuts, by (leader, epoch, id): two leaders' ids may meet.
    cuts: HashMap<(Slot, u64, u64), CutCopy>,
    /// Being rebuilt (a replacement joining the group).
    rebuild: Option<Rebuild>,
}

/// A replacement parity member's rebuilding, at one configuration: each
/// data slot's state (`State`), asked of the member serving it, is added
/// to the parity as a diff from zero; the slot's updates that follow it on
/// the link go in as usual. Done when every slot's state is in.
struct Rebuild {
    epoch: u64,
    have: Vec<bool>,
    /// The part of each slot's state expected next.
    next_part: Vec<u32>,
    /// When each slot's state was last asked for, or a part of it arrived.
    heard: Vec<u64>,
}

/// A slot handed back to its rejoined member, kept a while for its fetch:
/// the pages (with this member's updates in flight) and which of them
/// were not decoded yet.
struct Handed {
    /// The stamp epoch this member served it at: the pages are the slot's
    /// only while the stable stamp is from this member's stream (or
    /// before it), i.e. no server came after.
    epoch: u64,
    area: Area,
    pending: Vec<(Stamp, Vec<Diff>)>,
    missing: BTreeSet<u32>,
    since: u64,
}

/// A slot's state on its way to a member, a few parts at a time (`Join`
/// with the parts it has asks for more). For a rebuilding parity member,
/// the slot's updates and commits meanwhile wait behind it (`behind`); it
/// counts (`Data::joined`) from the moment the state is taken, so the
/// slot's writes wait for it while the state goes (seconds for a large
/// slot) rather than commit without it.
struct Outgoing {
    epoch: u64,
    parts: VecDeque<EcMsg>,
    sent: u32,
    behind: Vec<EcMsg>,
    rebuild: bool,
}

/// How long (ms) a slot handed back is kept for its new server's fetch.
const HANDED_MS: u64 = 30_000;

/// A data member taking its slot back (a replacement, alive again): after
/// its preparation, the metadata replica asked of a parity member.
struct Fetch {
    epoch: u64,
    slot: Slot,
    from: Slot,
    stable: Stamp,
    index: Index,
    /// Pages the leader had decoded (they need no decoding here).
    pages: Vec<(u32, Bytes)>,
    next_part: u32,
    /// When it was asked, or a part arrived.
    since: u64,
}

struct Buffered {
    stamp: Stamp,
    key: Bytes,
    old: Option<Meta>,
    id: Option<WriteId>,
    diffs: Vec<Diff>,
    /// It only gives pages back (`gives_back`): no key to restore.
    zeroes: bool,
}

/// A parity member's copy of some pages at a cut.
struct CutCopy {
    epoch: u64,
    pages: Vec<u32>,
    bytes: Vec<Vec<u8>>,
    /// Per source data slot: `None` until its marker arrives, then the
    /// last update it had sent. Its updates up to that one go into the copy
    /// (those already received when the copy was taken are in it).
    sources: BTreeMap<Slot, Option<Stamp>>,
    leader: Slot,
    /// When the copy was taken (ms), to give up on a lost cut.
    since: u64,
}

/// The leader's preparation of lost slots.
struct Prep {
    epoch: u64,
    slots: Vec<Slot>,
    received: BTreeMap<Slot, Vec<Received>>,
    stable: Option<Vec<(Slot, Stamp)>>,
    /// The stamp epoch the slots' new server stamps with: above every
    /// earlier server's.
    source: u64,
    prepared: BTreeSet<Slot>,
    since: u64,
}

/// A page repair in flight at the leader.
struct Repair {
    pages: Vec<u32>,
    lost: Vec<Slot>,
    sources: Vec<Slot>,
    parity: Vec<Slot>,
    got: BTreeMap<Slot, Vec<Bytes>>,
    since: u64,
}

pub struct Member {
    slot: Slot,
    code: Arc<Code>,
    config: Config,
    data: BTreeMap<Slot, Data>,
    parity: Option<Parity>,
    /// Requests for lost slots while they are being prepared.
    held: VecDeque<(Slot, Req)>,
    prep: Option<Prep>,
    fetch: Option<Fetch>,
    handed: BTreeMap<Slot, Handed>,
    /// Slot states being sent, by (to, slot).
    outgoing: BTreeMap<(Slot, Slot), Outgoing>,
    repairs: BTreeMap<u64, Repair>,
    next_cut: u64,
    /// The time of the last tick (ms).
    now: u64,
    /// Pages decoded so far.
    repaired: u64,
    /// Keys expired so far.
    expired: u64,
    /// Data pages given back so far.
    given_back: u64,
    /// Told its parity misses a slot's updates (`Stale`).
    stale: bool,
    /// The configuration epoch this member was last made alive at.
    alive_since: u64,
    /// Parity members found stale here (told so, until they are lost or
    /// joining): not counted.
    stale_peers: u64,
    /// When idle sessions were last forgotten (ms).
    swept_ms: u64,
    out: Vec<Out>,
}

impl Member {
    /// A member of a new group. Stamps start at 1: `Stamp::default()`
    /// means nothing received.
    ///
    /// A member created `joining` (a replacement) starts empty: a parity
    /// member asks for every data slot's state; a data member waits to be
    /// alive, then takes its slot back from the leader.
    pub fn new(slot: Slot, code: Arc<Code>, config: Config) -> Member {
        let k = config.k as usize;
        let mut data = BTreeMap::new();
        let parity = if config.is_data(slot) {
            if !config.joining[slot as usize] {
                data.insert(slot, Data::new(Stamp { epoch: 0, seq: 1 }, Stamp::default()));
            }
            None
        } else {
            Some(Parity::new(slot as usize - k, k))
        };
        let mut member = Member {
            slot,
            code,
            config,
            data,
            parity,
            held: VecDeque::new(),
            prep: None,
            fetch: None,
            handed: BTreeMap::new(),
            outgoing: BTreeMap::new(),
            repairs: BTreeMap::new(),
            next_cut: 0,
            now: 0,
            repaired: 0,
            expired: 0,
            given_back: 0,
            stale: false,
            alive_since: 0,
            stale_peers: 0,
            swept_ms: 0,
            out: Vec::new(),
        };
        member.start_rebuild();
        member
    }

    pub fn slot(&self) -> Slot {
        self.slot
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// What this member has to send and answer since the last call.
    pub fn drain(&mut self) -> Vec<Out> {
        std::mem::take(&mut self.out)
    }

    /// SET (`Some`) or DEL (`None`) of `key`, which belongs to data `slot`,
    /// unconditionally. Its version is `version`, or just above the key's
    /// current one if that is not above it.
    pub fn put(&mut self, op: u64, slot: Slot, key: Bytes, value: Option<Bytes>, version: u64) {
        let change = match value {
            Some(v) => Change::set(v),
            None => Change { condition: crate::message::Condition::Always, ..Change::delete() },
        };
        self.write(op, slot, PutReq { key, change, version, id: None });
    }

    /// A write (`PutReq`). A condition (NX, XX, DEL's "if present", an
    /// expiry's) is decided against the committed state, after the key's
    /// writes in flight commit: what reads see.
    pub fn write(&mut self, op: u64, slot: Slot, put: PutReq) {
        self.request(slot, Req::Put { op, put });
    }

    pub fn get(&mut self, op: u64, slot: Slot, key: Bytes) {
        self.request(slot, Req::Get { op, key });
    }

    /// The time now (Unix ms) as a request arrives: what expiry is decided
    /// against (ticks may be far apart when the node is idle).
    pub fn advance(&mut self, now_ms: u64) {
        self.now = self.now.max(now_ms);
    }

    fn request(&mut self, slot: Slot, req: Req) {
        if self.config.acting(slot) != Some(self.slot) || slot >= self.config.k {
            let op = match req {
                Req::Put { op, .. } | Req::Get { op, .. } => op,
            };
            return self.reply(op, Reply::NotHere);
        }
        if !self.data.contains_key(&slot) {
            // A lost slot being prepared.
            self.held.push_back((slot, req));
            return;
        }
        self.serve(slot, req);
    }

    /// Serves a request now, or queues it behind the repair of its pages.
    fn serve(&mut self, slot: Slot, req: Req) {
        let d = self.data.get_mut(&slot).expect("served slot");
        match req {
            Req::Get { op, key } => {
                let now = self.now;
                let committed = d.index.get(&key);
                if committed.is_some_and(|m| m.expired(now)) && d.pending.iter().any(|p| p.key == key) {
                    // A change decided before the instant (PERSIST, EXPIRE)
                    // may still commit: whether the key is gone depends on it.
                    d.queue.push_back((Req::Get { op, key }, Vec::new()));
                    return;
                }
                let Some(Meta { loc, version, expires_at_ms }) = committed.filter(|m| !m.expired(now)) else {
                    return self.reply(op, Reply::Value(None));
                };
                let need: Vec<u32> = pages_of(loc).filter(|p| d.missing.contains(p)).collect();
                if !need.is_empty() || !d.queue.is_empty() && d.queue.iter().any(|(r, _)| req_key(r) == &key) {
                    d.queue.push_back((Req::Get { op, key }, need));
                    return self.repair_soon();
                }
                let mut value = vec![0; loc.len as usize];
                d.area.read(loc.at, &mut value);
                let expires = (expires_at_ms != 0).then_some(expires_at_ms);
                self.reply(op, Reply::Value(Some((value.into(), version, expires))));
            }
            Req::Put { op, put } => {
                if let Some(id) = put.id {
                    // A resend: answered from the first, never written twice.
                    match d.recent.seen(id) {
                        Seen::Done(version) => return self.reply(op, Reply::Done { version: Some(version), old: None }),
                        Seen::Finished => return self.reply(op, Reply::Done { version: None, old: None }),
                        Seen::New => {}
                    }
                    if let Some(p) = d.pending.iter_mut().find(|p| p.id.is_some_and(|i| (i.client, i.write) == (id.client, id.write))) {
                        p.also.push(op);
                        return;
                    }
                }
                let PutReq { key, change, version, id } = put;
                let now = self.now;
                let raw = d.index.get(&key);
                let current = raw.filter(|m| !m.expired(now));
                let keep = change.value == NewValue::Keep;
                let mut need: Vec<u32> = Vec::new();
                if change.get {
                    need.extend(current.into_iter().flat_map(|m| pages_of(m.loc)).filter(|p| d.missing.contains(p)));
                }
                // A new value gets a new place; an expiry change (EXPIRE,
                // PERSIST, GETEX) leaves the value where it is.
                let loc = match &change.value {
                    NewValue::Set(v) => Some(d.free.alloc(v.len() as u32)),
                    _ => None,
                };
                need.extend(loc.into_iter().flat_map(pages_of).filter(|p| d.missing.contains(p)));
                // A condition (DEL's "if present" too) is decided after the
                // key's writes in flight: two DELs must not both delete.
                let decides = !change.is_blind() || change.condition != crate::message::Condition::Always;
                let behind = d.queue.iter().any(|(r, _)| req_key(r) == &key) || decides && d.pending.iter().any(|p| p.key == key);
                if !need.is_empty() || behind {
                    // Its bytes must be known before they can be diffed; a
                    // condition waits for the key's writes in flight.
                    if let Some(l) = loc {
                        d.free.free(l);
                    }
                    d.queue.push_back((Req::Put { op, put: PutReq { key, change, version, id } }, need));
                    return self.repair_soon();
                }
                let old = current.filter(|_| change.get).map(|m| {
                    let mut v = vec![0; m.loc.len as usize];
                    d.area.read(m.loc.at, &mut v);
                    Bytes::from(v)
                });
                // Decided as a chain's head decides it; the old value's
                // bytes matter only to GET (read above).
                let seen =
                    Current { value: current.map(|_| old.as_deref().unwrap_or(&[])), expires_at_ms: current.and_then(|m| m.expires_at()) };
                let decided = decide(&change, seen, now).expect("increments are refused before a coded site's members (`node::ec`)");
                let decided_any = decided.write.is_some();
                // (A delete of a key only in flight is written too: it
                // orders after that write.)
                let write = decided.write.filter(|(value, _)| value.is_some() || raw.is_some() || d.pending.iter().any(|p| p.key == key));
                let Some((value, expires)) = write else {
                    if let Some(l) = loc {
                        d.free.free(l);
                    }
                    // Nothing to write: a condition that does not hold, or
                    // a DEL of a key that was never there.
                    let version = decided_any.then_some(version);
                    return self.reply(op, Reply::Done { version, old: decided.old });
                };
                let loc = match (&value, keep) {
                    (Some(_), true) => current.map(|m| m.loc),
                    (Some(_), false) => loc,
                    (None, _) => {
                        if let Some(l) = loc {
                            d.free.free(l); // an expiry already past: a delete
                        }
                        None
                    }
                };
                let old = decided.old;
                // Versions of a key only grow, whatever the caller's clock.
                // (At least 1: version 0 marks an update that gives pages
                // back, `gives_back`.)
                let newest = d.pending.iter().rev().find(|p| p.key == key && p.version > 0).map(|p| p.version);
                let newest = newest.or(d.index.get(&key).map(|m| m.version));
                let version = newest.map_or(version, |n| version.max(n + 1)).max(1);
                let meta = loc.map(|loc| Meta { loc, version, expires_at_ms: expires.unwrap_or(0) });
                let value = value.filter(|_| !keep);
                let mut diffs = Vec::new();
                if let (Some(l), Some(v)) = (loc, &value) {
                    let mut diff = vec![0; v.len()];
                    d.area.read(l.at, &mut diff);
                    for (a, b) in diff.iter_mut().zip(v.iter()) {
                        *a ^= b;
                    }
                    d.area.xor(l.at, &diff);
                    diffs.push(Diff { at: l.at, bytes: diff.into() });
                }
                self.issue(slot, Pending::new(key, meta, version, diffs, op, id, old));
            }
        }
    }

    /// Stamps an update of data `slot`, applied to its area already, and
    /// sends it to the parity members; committed once they all have it.
    fn issue(&mut self, slot: Slot, mut p: Pending) {
        let d = self.data.get_mut(&slot).expect("served slot");
        let stamp = d.next;
        d.next.seq += 1;
        d.last = stamp;
        let waiting = d.targets(&self.config, self.stale_peers);
        d.last_to = waiting;
        (p.stamp, p.waiting, p.to, p.sent) = (stamp, waiting, waiting, self.now);
        let msg = EcMsg::Update {
            slot,
            stamp,
            key: p.key.clone(),
            meta: p.meta,
            version: p.version,
            id: p.id,
            diffs: p.diffs.clone(),
            to: waiting,
        };
        d.pending.push_back(p);
        for to in bits(waiting).filter(|&to| !self.streaming(to, slot)).collect::<Vec<_>>() {
            self.out.push(Out::Send { to, msg: msg.clone() });
        }
        if !self.outgoing.is_empty() {
            self.behind_states(slot, &msg);
        }
        self.try_commit(slot);
    }

    /// Gives back the pages of the data slots served here that no value is
    /// on any more (deleted, expired, overwritten elsewhere: FLUSHALL
    /// leaves none): each is zeroed by an update that changes no key
    /// (`gives_back`), its diff the page's bytes, so parity members take
    /// the page out of their parity as for any update, and it is dropped
    /// here at once (an absent page reads as zeros). A parity page goes
    /// once its stripe is all zeros. One such update per slot is in flight
    /// at a time. A slot taken over gives nothing back
    /// before all its pages are repaired, nor while lost slots are being
    /// prepared.
    fn give_back(&mut self) {
        let slots: Vec<Slot> = self.data.keys().copied().collect();
        for slot in slots {
            self.give_back_of(slot);
        }
    }

    /// `give_back` for one slot: at every tick, and as soon as the one in
    /// flight is committed.
    fn give_back_of(&mut self, slot: Slot) {
        let Some(d) = self.data.get_mut(&slot).filter(|_| self.prep.is_none()) else { return };
        if !d.missing.is_empty() || d.pending.iter().any(|p| gives_back(&p.key, p.version)) {
            return;
        }
        let pages = d.free.take_emptied(GIVE_BACK_PAGES);
        let diffs: Vec<Diff> =
            pages.into_iter().filter_map(|p| Some(Diff { at: p as u64 * PAGE as u64, bytes: Bytes::from(d.area.take_page(p)?) })).collect();
        if !diffs.is_empty() {
            self.given_back += diffs.len() as u64;
            self.issue(slot, Pending::new(Bytes::new(), None, 0, diffs, OWN_OP, None, None));
        }
    }

    /// Commits the acknowledged prefix of `slot`'s pending updates.
    fn try_commit(&mut self, slot: Slot) {
        let stale = self.stale_peers;
        let Some(d) = self.data.get_mut(&slot) else { return };
        let mask = d.targets(&self.config, stale);
        let mut last = None;
        while d.pending.front().is_some_and(|p| p.waiting & mask == 0) {
            let p = d.pending.pop_front().expect("front");
            let old = match p.meta {
                _ if gives_back(&p.key, p.version) => None,
                Some(m) => d.index.insert(&p.key, m),
                None => d.index.remove(&p.key),
            };
            if let Some(old) = old {
                if p.meta.map(|m| m.loc) != Some(old.loc) {
                    d.free.free(old.loc); // not an expiry change in place
                }
                if let Some(at) = old.expires_at() {
                    d.expiring.remove(&(at, Key::from(&p.key[..])));
                }
            }
            if let Some(at) = p.meta.and_then(|m| m.expires_at()) {
                d.expiring.insert((at, Key::from(&p.key[..])));
            }
            if let Some(id) = p.id {
                d.recent.insert(id, p.version, self.now);
            }
            for op in p.also {
                self.out.push(Out::Reply { op, reply: Reply::Done { version: Some(p.version), old: p.old.clone() } });
            }
            self.out.push(Out::Reply { op: p.op, reply: Reply::Done { version: Some(p.version), old: p.old } });
            last = Some(p.stamp);
        }
        if let Some(stamp) = last {
            for p in bits(mask).filter(|&p| !self.streaming(p, slot)).collect::<Vec<_>>() {
                self.out.push(Out::Send { to: p, msg: EcMsg::Commit { slot, stamp } });
            }
            if !self.outgoing.is_empty() {
                self.behind_states(slot, &EcMsg::Commit { slot, stamp });
            }
            if self.data.get(&slot).is_some_and(|d| !d.queue.is_empty()) {
                self.retry_queue(slot);
            }
        }
    }

    pub fn step(&mut self, from: Slot, msg: EcMsg) {
        let slots = self.config.alive.len() as Slot;
        let names = match &msg {
            EcMsg::Update { slot, .. }
            | EcMsg::Ack { slot, .. }
            | EcMsg::Commit { slot, .. }
            | EcMsg::Join { slot, .. }
            | EcMsg::Stale { slot, .. }
            | EcMsg::State { slot, .. } => Some(*slot),
            _ => None,
        };
        if from >= slots || names.is_some_and(|s| s >= self.config.k) {
            return; // not a member of this group
        }
        match msg {
            EcMsg::Update { slot, stamp, key, meta, version, id, diffs, to } => {
                self.on_update(from, slot, stamp, key, meta, (version, id, to), diffs)
            }
            EcMsg::Ack { slot, stamp } => {
                if let Some(d) = self.data.get_mut(&slot) {
                    if let Some(p) = d.pending.iter_mut().find(|p| p.stamp == stamp) {
                        p.waiting &= !(1 << from);
                    }
                    self.try_commit(slot);
                    self.give_back_of(slot);
                }
            }
            EcMsg::Commit { slot, stamp } => {
                if let Some(par) = &mut self.parity {
                    let buf = &mut par.buffer[slot as usize];
                    while buf.front().is_some_and(|b| b.stamp <= stamp) {
                        buf.pop_front();
                    }
                }
            }
            EcMsg::Prepare { epoch, slots } => {
                // Only from the member this one knows serves the slots: a
                // member that lags (still serving a slot handed back to
                // its rejoined member, say) answers once it has let it go.
                if slots.iter().any(|&s| self.config.acting(s) != Some(from)) {
                    return;
                }
                let Some(par) = self.parity.as_mut().filter(|p| p.rebuild.is_none()) else { return };
                if epoch >= self.config.epoch {
                    // What this answers must be final: from now on nothing
                    // more from the lost members (a paused one may wake),
                    // or an update committed after this answer could be
                    // above the stable stamp and undone.
                    for &s in &slots {
                        par.fence[s as usize] = par.fence[s as usize].max(epoch);
                    }
                    let stamps = slots
                        .iter()
                        .map(|&s| {
                            let i = s as usize;
                            Received { slot: s, last: par.received[i], source: par.source[i], to: par.to[i] }
                        })
                        .collect();
                    self.out.push(Out::Send { to: from, msg: EcMsg::Received { epoch, stamps } });
                }
            }
            EcMsg::Received { epoch, stamps } => {
                if let Some(prep) = self.prep.as_mut().filter(|p| p.epoch == epoch && p.stable.is_none()) {
                    prep.received.insert(from, stamps);
                    self.advance_prep();
                }
            }
            EcMsg::Stable { epoch, stamps, source } => self.on_stable(from, epoch, stamps, source),
            EcMsg::Prepared { epoch } => {
                if let Some(prep) = self.prep.as_mut().filter(|p| p.epoch == epoch && p.stable.is_some()) {
                    prep.prepared.insert(from);
                    self.advance_prep();
                }
            }
            EcMsg::Cut { epoch, id, pages, sources, parity, leader } => self.on_cut(epoch, id, pages, sources, parity, leader),
            EcMsg::Marker { epoch, id, slot, through, pages, sources, leader } => {
                self.on_marker(epoch, id, slot, through, pages, sources, leader)
            }
            EcMsg::Pages { epoch, id, slot, pages } => self.on_pages(epoch, id, slot, pages),
            EcMsg::Join { epoch, slot, have: 0 } => self.on_join(from, epoch, slot),
            EcMsg::Join { epoch, slot, have } => {
                if self.outgoing.get(&(from, slot)).is_some_and(|o| o.epoch == epoch) {
                    self.pump(from, slot, have);
                }
            }
            EcMsg::Stale { epoch, .. } => {
                // (Not one about an earlier life: said before it was last
                // made alive.)
                if self.parity.is_some() && self.config.alive[self.slot as usize] && epoch >= self.alive_since {
                    self.stale = true;
                }
            }
            EcMsg::State { epoch, slot, part, pages, entries, end } => self.on_state(from, epoch, slot, part, pages, entries, end),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn on_update(
        &mut self,
        from: Slot,
        slot: Slot,
        stamp: Stamp,
        key: Bytes,
        meta: Option<Meta>,
        (version, id, to): (u64, Option<WriteId>, u64),
        diffs: Vec<Diff>,
    ) {
        let code = self.code.clone();
        let Some(par) = &mut self.parity else { return };
        let i = slot as usize;
        if stamp.epoch < par.fence[i] || self.config.acting(slot) != Some(from) {
            return; // from a member that lost the slot (or not yet known to serve it)
        }
        if par.rebuild.as_ref().is_some_and(|r| !r.have[i]) {
            return; // before the slot's state: in it
        }
        if stamp <= par.received[i] {
            // A resend whose ack was lost: acknowledged again if it is the
            // update held (never one that only reuses its stamp).
            if par.buffer[i].iter().any(|b| b.stamp == stamp && b.key == key) {
                self.out.push(Out::Send { to: from, msg: EcMsg::Ack { slot, stamp } });
            }
            return;
        }
        let last = par.received[i];
        let next = if stamp.epoch == last.epoch { stamp.seq == last.seq + 1 } else { stamp.seq == 1 };
        if !next {
            return; // one before it was lost on the way: it comes again
        }
        let zeroes = gives_back(&key, version);
        for d in &diffs {
            par.area.add_delta(&code, par.j, i, d.at, &d.bytes);
            par.extent[i] = par.extent[i].max(d.at + d.bytes.len() as u64);
            for copy in par.cuts.values_mut().filter(|c| c.takes(slot, stamp)) {
                copy.add(&code, par.j, i, d);
            }
            if zeroes {
                for page in pages_of(Loc { at: d.at, len: d.bytes.len() as u32 }) {
                    par.area.drop_if_zero(page);
                }
            }
        }
        let old = match meta {
            _ if zeroes => None,
            Some(m) => par.index[i].insert(&key, m),
            None => par.index[i].remove(&key),
        };
        par.received[i] = stamp;
        par.to[i] = to;
        if let Some(id) = id {
            par.recent[i].insert(id, version, self.now);
        }
        par.buffer[i].push_back(Buffered { stamp, key, old, id, diffs, zeroes });
        self.out.push(Out::Send { to: from, msg: EcMsg::Ack { slot, stamp } });
        self.finish_cuts();
    }

    fn on_stable(&mut self, from: Slot, epoch: u64, stamps: Vec<(Slot, Stamp)>, source: u64) {
        let code = self.code.clone();
        let Some(par) = &mut self.parity else { return };
        if epoch < self.config.epoch {
            return;
        }
        for (slot, stable) in stamps {
            let i = slot as usize;
            // Undo what no data member committed, newest first.
            while par.buffer[i].back().is_some_and(|b| b.stamp > stable) {
                let b = par.buffer[i].pop_back().expect("back");
                for d in &b.diffs {
                    par.area.add_delta(&code, par.j, i, d.at, &d.bytes);
                }
                match b.old {
                    _ if b.zeroes => None,
                    Some(m) => par.index[i].insert(&b.key, m),
                    None => par.index[i].remove(&b.key),
                };
                if let Some(id) = b.id {
                    par.recent[i].remove(id);
                }
            }
            par.buffer[i].clear();
            par.received[i] = stable;
            par.fence[i] = par.fence[i].max(epoch).max(source);
            par.source[i] = source;
            par.to[i] = u64::MAX;
        }
        self.out.push(Out::Send { to: from, msg: EcMsg::Prepared { epoch } });
    }

    /// The leader's preparation, one step further if it can go.
    fn advance_prep(&mut self) {
        let mut live: BTreeSet<Slot> = self.live_parity().collect();
        let Some(prep) = &mut self.prep else { return };
        if prep.stable.is_none() {
            if !live.iter().all(|p| prep.received.contains_key(p)) {
                return;
            }
            let unknown = Received { slot: 0, last: Stamp::default(), source: 0, to: u64::MAX };
            let of = |p: &Slot, s: Slot| prep.received[p].iter().find(|r| r.slot == s).copied().unwrap_or(unknown);
            // A member that may miss writes committed without it has a
            // parity that is not the slot's: it is not counted, and is told
            // so; if it is this member, its node starts over. Such a member
            // never followed the server whose updates another holds (its
            // stream is from an earlier server: it was told alive before it
            // heard of the change), or lacks the newest update another holds
            // and was not among whom it went to (its server counted it lost
            // or stale). (A change of server that never served leaves no
            // such update, and no one stale.)
            let mut stale = BTreeSet::new();
            for &s in &prep.slots {
                let newest = live.iter().map(|p| of(p, s).last).max().unwrap_or_default();
                stale.extend(live.iter().filter(|p| of(p, s).source < newest.epoch).copied());
                let to = live.iter().map(|p| of(p, s)).filter(|r| r.last == newest).fold(u64::MAX, |m, r| m & r.to);
                stale.extend(live.iter().filter(|&&p| of(&p, s).last < newest && to & (1 << p) == 0).copied());
            }
            if stale.contains(&self.slot) {
                self.stale = true;
                self.prep = None;
                return;
            }
            let epoch = prep.epoch;
            for &p in &stale {
                self.stale_peers |= 1 << p;
                live.remove(&p);
                self.out.push(Out::Send { to: p, msg: EcMsg::Stale { epoch, slot: 0 } });
            }
            let prep = self.prep.as_mut().expect("prep");
            let of = |p: &Slot, s: Slot| prep.received[p].iter().find(|r| r.slot == s).copied().unwrap_or(unknown);
            let stable: Vec<(Slot, Stamp)> =
                prep.slots.iter().map(|&s| (s, live.iter().map(|p| of(p, s).last).min().unwrap_or_default())).collect();
            // The new server stamps above every earlier one: stamps only grow.
            let top = prep
                .slots
                .iter()
                .flat_map(|&s| live.iter().map(move |p| (p, s)))
                .map(|(p, s)| of(p, s).source.max(of(p, s).last.epoch))
                .max();
            prep.source = prep.epoch.max(top.map_or(0, |t| t + 1));
            prep.stable = Some(stable.clone());
            for &p in &live {
                let msg = EcMsg::Stable { epoch: prep.epoch, stamps: stable.clone(), source: prep.source };
                self.out.push(Out::Send { to: p, msg });
            }
            return;
        }
        if !live.iter().all(|p| prep.prepared.contains(p)) {
            return;
        }
        // Every parity member agrees on the slots: the leader serves lost
        // ones from its replica of their metadata; a data member taking its
        // own slot back asks the leader for that replica first.
        let prep = self.prep.take().expect("prep");
        let stable_of = |s: Slot| prep.stable.as_ref().and_then(|st| st.iter().find(|(x, _)| *x == s)).map(|(_, t)| *t).unwrap_or_default();
        let Some(par) = self.parity.as_ref() else {
            let (slot, from) = (self.slot, *live.first().expect("prepared with a live parity member"));
            let stable = stable_of(slot);
            let epoch = prep.source;
            self.fetch =
                Some(Fetch { epoch, slot, from, stable, index: Index::default(), pages: Vec::new(), next_part: 0, since: self.now });
            self.out.push(Out::Send { to: from, msg: EcMsg::Join { epoch, slot, have: 0 } });
            return;
        };
        for &s in &prep.slots {
            let index = par.index[s as usize].clone();
            let (extent, recent) = (par.extent[s as usize], par.recent[s as usize].clone());
            let d = Data::taken_over(Stamp { epoch: prep.source, seq: 1 }, stable_of(s), index, extent, recent);
            self.data.insert(s, d);
        }
        self.serve_held();
    }

    /// The requests held while their slots were being taken over.
    fn serve_held(&mut self) {
        for (slot, req) in std::mem::take(&mut self.held) {
            self.request(slot, req);
        }
        self.repair_soon();
    }

    /// A parity member joining (a replacement): starts (again, at a new
    /// configuration) from nothing, and asks the member serving each data
    /// slot for its state.
    fn start_rebuild(&mut self) {
        let (epoch, now, k) = (self.config.epoch, self.now, self.config.k as usize);
        let Some(par) = self.parity.as_mut().filter(|_| self.config.joining[self.slot as usize]) else { return };
        *par = Parity::new(par.j, k);
        par.rebuild = Some(Rebuild { epoch, have: vec![false; k], next_part: vec![0; k], heard: vec![now; k] });
        for slot in 0..self.config.k {
            if let Some(to) = self.config.acting(slot) {
                self.out.push(Out::Send { to, msg: EcMsg::Join { epoch, slot, have: 0 } });
            }
        }
    }

    /// A `Join`: a rebuilding parity member asks for a data slot served
    /// here; a data member taking its slot back asks this parity member
    /// for its metadata replica.
    fn on_join(&mut self, from: Slot, epoch: u64, slot: Slot) {
        let now = self.now;
        if self.config.is_data(from) {
            // (`epoch`: the stamp epoch its preparation chose.) Only once
            // that preparation has reached this member: nothing changes the
            // replica after it but the new server's updates.
            let i = slot as usize;
            let Some(par) = self.parity.as_ref().filter(|p| p.rebuild.is_none() && p.source[i] == epoch) else { return };
            if from != slot || self.config.acting(slot) != Some(from) {
                return;
            }
            let entries = par.index[i].iter().map(|(key, m)| (Bytes::copy_from_slice(key), m)).collect();
            let (last, extent, sessions) = (par.received[i], par.extent[i], par.recent[i].export());
            // The pages, if this member served the slot until it was handed
            // back: as they are at the stable stamp (its updates above it,
            // undone in the parity, are taken out again).
            let pages = match self.handed.remove(&slot).filter(|h| last.epoch <= h.epoch) {
                Some(mut h) => {
                    for (stamp, diffs) in &h.pending {
                        if *stamp > last {
                            for d in diffs {
                                h.area.xor(d.at, &d.bytes);
                            }
                        }
                    }
                    h.area.written().filter(|(n, _)| !h.missing.contains(n)).map(|(n, b)| (n, Bytes::copy_from_slice(b))).collect()
                }
                None => Vec::new(),
            };
            let end = StateEnd { last, last_to: par.to[i], source: epoch, extent, sessions, pending: Vec::new() };
            return self.send_state(from, epoch, slot, pages, entries, end, false);
        }
        if epoch != self.config.epoch || !self.config.joining[from as usize] || self.prep.is_some() {
            return;
        }
        let Some(d) = self.data.get_mut(&slot) else { return };
        if !d.missing.is_empty() {
            return; // asked again once the pages are decoded here
        }
        // The pages as they are (with the updates in flight), and the
        // metadata as a parity member holds it: the committed entries
        // with the updates in flight applied, which it can undo.
        let pages = d.area.written().map(|(n, bytes)| (n, Bytes::copy_from_slice(bytes))).collect();
        let mut recent = d.recent.clone();
        let mut newest: HashMap<&[u8], Option<Meta>> = HashMap::new();
        let mut pending = Vec::new();
        for p in d.pending.iter() {
            if gives_back(&p.key, p.version) {
                let diffs = p.diffs.clone();
                pending.push(StatePending { stamp: p.stamp, key: p.key.clone(), old: None, version: 0, id: None, diffs });
                continue;
            }
            let old = newest.get(&p.key[..]).copied().unwrap_or_else(|| d.index.get(&p.key));
            newest.insert(&p.key[..], p.meta);
            if let Some(id) = p.id {
                recent.insert(id, p.version, now);
            }
            let diffs = p.diffs.clone();
            pending.push(StatePending { stamp: p.stamp, key: p.key.clone(), old, version: p.version, id: p.id, diffs });
        }
        let mut entries: Vec<(Bytes, Meta)> =
            d.index.iter().filter(|(key, _)| !newest.contains_key(key)).map(|(key, m)| (Bytes::copy_from_slice(key), m)).collect();
        entries.extend(newest.iter().filter_map(|(key, m)| Some((Bytes::copy_from_slice(key), (*m)?))));
        let end = StateEnd {
            last: d.last,
            last_to: d.last_to,
            source: d.next.epoch,
            extent: d.free.used().0,
            sessions: recent.export(),
            pending,
        };
        // Its updates from now on go to it behind the state, and commit
        // waits for it from now on (an update queued behind the state and
        // lost on the way is resent, never committed without it).
        d.joined |= 1 << from;
        self.send_state(from, epoch, slot, pages, entries, end, true);
    }

    /// A slot's state, in parts of bounded size, all sent now (what follows
    /// on the link is not in it).
    #[allow(clippy::too_many_arguments)]
    fn send_state(
        &mut self,
        to: Slot,
        epoch: u64,
        slot: Slot,
        pages: Vec<(u32, Bytes)>,
        entries: Vec<(Bytes, Meta)>,
        end: StateEnd,
        rebuild: bool,
    ) {
        let mut pages = pages.into_iter().peekable();
        let mut entries = entries.into_iter().peekable();
        let mut end = Some(Box::new(end));
        let mut parts = VecDeque::new();
        let mut part = 0;
        while end.is_some() {
            let chunk: Vec<(u32, Bytes)> = pages.by_ref().take(STATE_PAGES).collect();
            let keys: Vec<(Bytes, Meta)> = entries.by_ref().take(STATE_ENTRIES).collect();
            let last = pages.peek().is_none() && entries.peek().is_none();
            parts.push_back(EcMsg::State { epoch, slot, part, pages: chunk, entries: keys, end: if last { end.take() } else { None } });
            part += 1;
        }
        self.outgoing.insert((to, slot), Outgoing { epoch, parts, sent: 0, behind: Vec::new(), rebuild });
        self.pump(to, slot, 0);
    }

    /// Sends the next parts of a slot's state to `to`, who has `have` of
    /// them; once all are sent, what waited behind them.
    fn pump(&mut self, to: Slot, slot: Slot, have: u32) {
        let Some(o) = self.outgoing.get_mut(&(to, slot)) else { return };
        while o.sent < have + STATE_WINDOW {
            let Some(msg) = o.parts.pop_front() else { break };
            self.out.push(Out::Send { to, msg });
            o.sent += 1;
        }
        if !o.parts.is_empty() {
            return;
        }
        let o = self.outgoing.remove(&(to, slot)).expect("outgoing");
        for msg in o.behind {
            self.out.push(Out::Send { to, msg });
        }
    }

    /// Whether `slot`'s state is on its way to rebuilding member `to`
    /// (what the slot sends it goes behind the state).
    fn streaming(&self, to: Slot, slot: Slot) -> bool {
        self.outgoing.get(&(to, slot)).is_some_and(|o| o.rebuild)
    }

    /// A message of `slot` for the members whose state of it is on its way:
    /// it goes after the state.
    fn behind_states(&mut self, slot: Slot, msg: &EcMsg) {
        for o in self.outgoing.iter_mut().filter(|((_, s), o)| *s == slot && o.rebuild).map(|(_, o)| o) {
            o.behind.push(msg.clone());
        }
    }

    /// A part of a slot's state: added to the parity being rebuilt here, or
    /// to the metadata of the slot this data member takes back.
    #[allow(clippy::too_many_arguments)]
    fn on_state(
        &mut self,
        from: Slot,
        epoch: u64,
        slot: Slot,
        part: u32,
        pages: Vec<(u32, Bytes)>,
        entries: Vec<(Bytes, Meta)>,
        end: Option<Box<StateEnd>>,
    ) {
        let (now, i) = (self.now, slot as usize);
        if self.parity.is_none() {
            let Some(f) = self.fetch.as_mut().filter(|f| f.epoch == epoch && f.slot == slot && f.from == from) else { return };
            if part != f.next_part {
                return; // a part lost on the way: asked again (`tick`)
            }
            f.next_part += 1;
            f.since = now;
            let more = EcMsg::Join { epoch, slot, have: f.next_part };
            for (key, meta) in entries {
                f.index.insert(&key, meta);
            }
            f.pages.extend(pages);
            let Some(end) = end else { return self.out.push(Out::Send { to: from, msg: more }) };
            let f = self.fetch.take().expect("fetch");
            let recent = Recent::import(end.sessions, now);
            let mut d = Data::taken_over(Stamp { epoch, seq: 1 }, f.stable, f.index, end.extent, recent);
            for (n, bytes) in f.pages {
                d.area.set_page(n, &bytes);
                d.missing.remove(&n);
            }
            self.data.insert(slot, d);
            return self.serve_held();
        }
        if epoch != self.config.epoch {
            return;
        }
        let code = self.code.clone();
        let acting = self.config.acting(slot);
        let Some(par) = self.parity.as_mut() else { return };
        let Some(rb) = par.rebuild.as_mut().filter(|r| r.epoch == epoch && !r.have[i] && acting == Some(from)) else { return };
        if part != rb.next_part[i] {
            if part == 0 {
                // A stream started again after one cut short: what came of
                // the first is in the parity, so start over.
                self.start_rebuild();
            }
            return;
        }
        rb.next_part[i] += 1;
        rb.heard[i] = now;
        if end.is_none() {
            self.out.push(Out::Send { to: from, msg: EcMsg::Join { epoch, slot, have: rb.next_part[i] } });
        }
        for (n, bytes) in pages {
            par.area.add_delta(&code, par.j, i, n as u64 * PAGE as u64, &bytes);
        }
        for (key, meta) in entries {
            par.index[i].insert(&key, meta);
        }
        let Some(end) = end else { return };
        rb.have[i] = true;
        par.received[i] = end.last;
        par.source[i] = end.source;
        par.to[i] = end.last_to;
        par.fence[i] = par.fence[i].max(end.source);
        par.extent[i] = end.extent;
        par.recent[i] = Recent::import(end.sessions, now);
        par.buffer[i] = end
            .pending
            .into_iter()
            .map(|p| Buffered { zeroes: gives_back(&p.key, p.version), stamp: p.stamp, key: p.key, old: p.old, id: p.id, diffs: p.diffs })
            .collect();
    }

    /// The live parity members not found stale here.
    fn live_parity(&self) -> impl Iterator<Item = Slot> + '_ {
        self.config.live_parity().filter(|p| self.stale_peers & (1 << p) == 0)
    }

    /// A parity member alive now that was not: counted with the live ones
    /// from now on if it got this slot's state from this member (its
    /// updates since went to it, and commit waited for it); if not (the
    /// slot changed server while it was rebuilding, and it was told alive
    /// before it heard), its parity is not this slot's, and it must be
    /// rebuilt again (`Stale`). A member lost or joining again is dropped
    /// from the slot's `joined` (a new process asks for the state again).
    fn welcome(&mut self, old: &Config) {
        let epoch = self.config.epoch;
        let mut stale = Vec::new();
        for (&slot, d) in self.data.iter_mut() {
            for p in self.config.k..self.config.k + self.config.m {
                let bit = 1u64 << p;
                let (was, is) = (old.alive[p as usize], self.config.alive[p as usize]);
                if !is {
                    if !self.config.joining[p as usize] {
                        d.joined &= !bit;
                    }
                } else if !was {
                    if d.joined & bit == 0 {
                        stale.push((p, slot));
                    }
                    d.joined &= !bit;
                }
            }
        }
        for (to, slot) in stale {
            self.stale_peers |= 1 << to;
            self.out.push(Out::Send { to, msg: EcMsg::Stale { epoch, slot } });
        }
    }

    /// Whether this member was told its parity misses a slot's updates
    /// (`Stale`): its node must be rebuilt again.
    pub fn stale(&self) -> bool {
        self.stale
    }

    /// Whether this member has its part: a rebuilding parity member once
    /// every data slot's state is in.
    pub fn rebuilt(&self) -> bool {
        self.parity.as_ref().and_then(|p| p.rebuild.as_ref()).is_none_or(|r| r.have.iter().all(|&h| h))
    }

    /// Lets go of the slots no longer served here (handed back to their
    /// rejoined member): what waited is answered `NotHere` (sent on).
    fn hand_back(&mut self) {
        let me = Some(self.slot);
        let gone: Vec<Slot> = self.data.keys().copied().filter(|&s| self.config.acting(s) != me).collect();
        for s in gone {
            let d = self.data.remove(&s).expect("served");
            let pending = d.pending.iter().map(|p| (p.stamp, p.diffs.clone())).collect();
            let ops = d.pending.into_iter().flat_map(|p| std::iter::once(p.op).chain(p.also));
            let ops: Vec<u64> = ops.chain(d.queue.into_iter().map(|(r, _)| req_op(&r))).collect();
            for op in ops {
                self.reply(op, Reply::NotHere);
            }
            // Its new server needs not decode what was decoded here.
            if self.parity.is_some() {
                let h = Handed { epoch: d.next.epoch, area: d.area, pending, missing: d.missing, since: self.now };
                self.handed.insert(s, h);
            }
        }
        let (held, gone): (VecDeque<_>, VecDeque<_>) =
            std::mem::take(&mut self.held).into_iter().partition(|(s, _)| self.config.acting(*s) == me);
        self.held = held;
        for (_, r) in gone {
            self.reply(req_op(&r), Reply::NotHere);
        }
    }

    pub fn reconfigure(&mut self, config: Config) {
        if config.epoch <= self.config.epoch {
            return;
        }
        let old = std::mem::replace(&mut self.config, config);
        if self.config.alive[self.slot as usize] && !old.alive[self.slot as usize] {
            self.alive_since = self.config.epoch;
        }
        if let Some(par) = &mut self.parity {
            let epoch = self.config.epoch;
            par.cuts.retain(|_, c| c.epoch >= epoch);
            par.rebuild = None;
        }
        self.start_rebuild(); // still joining: again, at this configuration
        self.repairs.clear();
        self.outgoing.clear(); // asked again at this configuration
        self.fetch = None; // prepared again below
                           // Members lost or joining again are not stale any more (a new
                           // process is rebuilt from the start).
        let gone = (0..self.config.alive.len()).filter(|&p| !self.config.alive[p]).fold(0u64, |m, p| m | 1 << p);
        self.stale_peers &= !gone;
        // (Before the slots handed back go: a member alive now must have
        // had their state from here.)
        self.welcome(&old);
        self.hand_back();
        for slot in self.data.keys().copied().collect::<Vec<_>>() {
            self.try_commit(slot);
        }
        // The slots to take over: lost ones at the leader, its own slot at
        // a data member alive again (a replacement). Either prepares first.
        self.prep = None;
        let me = Some(self.slot);
        let slots: Vec<Slot> = (0..self.config.k).filter(|&s| self.config.acting(s) == me && !self.data.contains_key(&s)).collect();
        if slots.is_empty() {
            return self.repair_soon();
        }
        let epoch = self.config.epoch;
        for p in self.live_parity().collect::<Vec<_>>() {
            self.out.push(Out::Send { to: p, msg: EcMsg::Prepare { epoch, slots: slots.clone() } });
        }
        self.prep =
            Some(Prep { epoch, slots, received: BTreeMap::new(), stable: None, source: epoch, prepared: BTreeSet::new(), since: self.now });
    }

    /// Time passes (`now_ms`, any monotonic clock): what went unanswered is
    /// sent again, lost repairs start again, and the background repair goes
    /// on.
    pub fn tick(&mut self, now_ms: u64) {
        self.now = self.now.max(now_ms);
        let now = self.now;
        if now >= self.swept_ms + SWEEP_MS {
            self.swept_ms = now;
            // Stale members are told again until they start over (the
            // first word may have been lost with a connection).
            for to in bits(self.stale_peers) {
                self.out.push(Out::Send { to, msg: EcMsg::Stale { epoch: self.config.epoch, slot: 0 } });
            }
            for d in self.data.values_mut() {
                d.recent.forget_idle(now);
            }
            for recent in self.parity.iter_mut().flat_map(|p| p.recent.iter_mut()) {
                recent.forget_idle(now);
            }
        }
        let stale = self.stale_peers;
        let outgoing: BTreeSet<(Slot, Slot)> = self.outgoing.iter().filter(|(_, o)| o.rebuild).map(|(&k, _)| k).collect();
        for (&slot, d) in self.data.iter_mut() {
            let mask = d.targets(&self.config, stale);
            if d.pending.front().is_some_and(|p| now - p.sent >= RESEND_MS) {
                for p in d.pending.iter_mut().filter(|p| now - p.sent >= RESEND_MS) {
                    p.sent = now;
                    for to in bits(p.waiting & mask).filter(|&to| !outgoing.contains(&(to, slot))) {
                        let msg = EcMsg::Update {
                            slot,
                            stamp: p.stamp,
                            key: p.key.clone(),
                            meta: p.meta,
                            version: p.version,
                            id: p.id,
                            diffs: p.diffs.clone(),
                            to: p.to,
                        };
                        self.out.push(Out::Send { to, msg });
                    }
                }
            }
        }
        let live: Vec<Slot> = self.live_parity().collect();
        if let Some(prep) = self.prep.as_mut().filter(|p| now - p.since >= RESEND_MS) {
            prep.since = now;
            for &p in &live {
                let msg = match &prep.stable {
                    None if !prep.received.contains_key(&p) => EcMsg::Prepare { epoch: prep.epoch, slots: prep.slots.clone() },
                    Some(stable) if !prep.prepared.contains(&p) => {
                        EcMsg::Stable { epoch: prep.epoch, stamps: stable.clone(), source: prep.source }
                    }
                    _ => continue,
                };
                self.out.push(Out::Send { to: p, msg });
            }
        }
        self.ask_again(now);
        self.handed.retain(|_, h| now - h.since < HANDED_MS);
        self.expire();
        self.give_back();
        self.repairs.retain(|_, r| now - r.since < REPAIR_MS);
        if let Some(par) = &mut self.parity {
            par.cuts.retain(|_, c| now - c.since < REPAIR_MS);
        }
        self.repair(true);
    }

    /// A joining member asks again for a slot's state that stopped coming
    /// (a link broke, or the server was still decoding its pages).
    fn ask_again(&mut self, now: u64) {
        let epoch = self.config.epoch;
        if let Some(f) = self.fetch.as_mut().filter(|f| now - f.since >= JOIN_RETRY_MS) {
            (f.since, f.next_part, f.index, f.pages) = (now, 0, Index::default(), Vec::new());
            let msg = EcMsg::Join { epoch: f.epoch, slot: f.slot, have: 0 };
            self.out.push(Out::Send { to: f.from, msg });
        }
        let Some(rb) = self.parity.as_mut().and_then(|p| p.rebuild.as_mut()) else { return };
        let mut again = Vec::new();
        for i in 0..rb.have.len() {
            if !rb.have[i] && now - rb.heard[i] >= JOIN_RETRY_MS {
                rb.heard[i] = now;
                if rb.next_part[i] > 0 {
                    // Cut short: its parts are in the parity already.
                    return self.start_rebuild();
                }
                again.push(i as Slot);
            }
        }
        for slot in again {
            if let Some(to) = self.config.acting(slot) {
                self.out.push(Out::Send { to, msg: EcMsg::Join { epoch, slot, have: 0 } });
            }
        }
    }

    /// Deletes keys of the served slots whose expiry has passed, a few at a
    /// time, with ordinary updates (skipping keys with writes in flight:
    /// they may give the key a new expiry).
    fn expire(&mut self) {
        let now = self.now;
        for slot in self.data.keys().copied().collect::<Vec<_>>() {
            let d = &self.data[&slot];
            let due: Vec<Key> = d
                .expiring
                .iter()
                .take_while(|(at, _)| *at <= now)
                .filter(|(_, key)| {
                    !d.pending.iter().any(|p| p.key[..] == key[..]) && !d.queue.iter().any(|(r, _)| req_key(r)[..] == key[..])
                })
                .take(EXPIRE_PER_TICK)
                .map(|(_, key)| key.clone())
                .collect();
            for key in due {
                self.expired += 1;
                let change = Change { condition: crate::message::Condition::Always, ..Change::delete() };
                let put = PutReq { key: Bytes::from(key.into_vec()), change, version: 0, id: None };
                self.serve(slot, Req::Put { op: OWN_OP, put });
            }
        }
    }

    /// Starts the repairs waiting requests need.
    fn repair_soon(&mut self) {
        self.repair(false);
    }

    /// Starts repairs: first the pages waiting requests need, then (with
    /// `background`) the rest, a few cuts at a time.
    fn repair(&mut self, background: bool) {
        if self.prep.is_some() || self.data.values().all(|d| d.missing.is_empty()) {
            return;
        }
        let busy: BTreeSet<u32> = self.repairs.values().flat_map(|r| r.pages.iter().copied()).collect();
        let wanted: BTreeSet<u32> = self.data.values().flat_map(|d| d.queue.iter().flat_map(|(_, need)| need.iter().copied())).collect();
        let mut urgent: Vec<u32> = wanted.into_iter().filter(|p| !busy.contains(p)).collect();
        loop {
            let background = background && self.repairs.len() < IN_FLIGHT;
            if urgent.is_empty() && !background {
                return;
            }
            let busy: BTreeSet<u32> = self.repairs.values().flat_map(|r| r.pages.iter().copied()).collect();
            let first = if urgent.is_empty() {
                let all: BTreeSet<u32> = self.data.values().flat_map(|d| d.missing.iter().copied()).collect();
                match all.into_iter().find(|p| !busy.contains(p)) {
                    Some(p) => p,
                    None => return,
                }
            } else {
                urgent.remove(0)
            };
            let lost = self.lost_at(first);
            let mut pages = vec![first];
            // Batch the following pages missing from the same slots.
            let candidates: Vec<u32> = if urgent.is_empty() { (first + 1..first + 4 * BATCH as u32).collect() } else { urgent.clone() };
            for p in candidates {
                if pages.len() >= BATCH {
                    break;
                }
                if !busy.contains(&p) && self.lost_at(p) == lost {
                    pages.push(p);
                }
            }
            urgent.retain(|p| !pages.contains(p));
            let n = lost.len();
            if !self.start_repair(pages, lost, n) {
                return;
            }
        }
    }

    /// The served slots page `page` is missing from.
    fn lost_at(&self, page: u32) -> Vec<Slot> {
        self.data.iter().filter(|(_, d)| d.missing.contains(&page)).map(|(&s, _)| s).collect()
    }

    /// A cut of `pages` to decode the `lost` slots' (served here), with
    /// `parity` parity members' pages (one per erasure).
    fn start_repair(&mut self, pages: Vec<u32>, lost: Vec<Slot>, parity: usize) -> bool {
        let want = parity;
        let parity: Vec<Slot> = self.live_parity().take(want).collect();
        if lost.is_empty() || parity.len() < want {
            return false; // more members lost than the code covers
        }
        let sources: Vec<Slot> = (0..self.config.k).filter(|s| !lost.contains(s)).collect();
        let (epoch, id, leader) = (self.config.epoch, self.next_cut, self.slot);
        self.next_cut += 1;
        let holders: BTreeSet<Slot> = sources.iter().map(|&s| self.config.acting(s).expect("a source is served")).collect();
        for to in holders {
            let msg = EcMsg::Cut { epoch, id, pages: pages.clone(), sources: sources.clone(), parity: parity.clone(), leader };
            self.out.push(Out::Send { to, msg });
        }
        if sources.is_empty() {
            for &p in &parity {
                let msg = EcMsg::Cut { epoch, id, pages: pages.clone(), sources: vec![], parity: parity.clone(), leader };
                self.out.push(Out::Send { to: p, msg });
            }
        }
        self.repairs.insert(id, Repair { pages, lost, sources, parity, got: BTreeMap::new(), since: self.now });
        true
    }

    /// At a source: send the pages as they are now, and a marker after the
    /// updates already sent. At a parity member with no source: the copy.
    fn on_cut(&mut self, epoch: u64, id: u64, pages: Vec<u32>, sources: Vec<Slot>, parity: Vec<Slot>, leader: Slot) {
        if sources.is_empty() {
            return self.on_marker(epoch, id, Slot::MAX, Stamp::default(), pages, sources, leader);
        }
        for &s in &sources {
            let Some(d) = self.data.get(&s) else { continue };
            // Pages not decoded here yet either (two slots handed back to
            // their rejoined members at once) go as none: the leader
            // decodes this slot's too. The marker goes all the same, so
            // that the parity copies agree on this slot's updates (it may
            // be written elsewhere in the stripe meanwhile).
            let bytes = if pages.iter().any(|p| d.missing.contains(p)) {
                Vec::new()
            } else {
                pages.iter().map(|&p| Bytes::from(d.area.page(p))).collect()
            };
            let through = d.last;
            self.out.push(Out::Send { to: leader, msg: EcMsg::Pages { epoch, id, slot: s, pages: bytes } });
            for &p in &parity {
                let msg = EcMsg::Marker { epoch, id, slot: s, through, pages: pages.clone(), sources: sources.clone(), leader };
                self.out.push(Out::Send { to: p, msg });
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn on_marker(&mut self, epoch: u64, id: u64, slot: Slot, through: Stamp, pages: Vec<u32>, sources: Vec<Slot>, leader: Slot) {
        let now = self.now;
        let Some(par) = self.parity.as_mut().filter(|p| p.rebuild.is_none()) else { return };
        if epoch < self.config.epoch {
            return;
        }
        let copy = par.cuts.entry((leader, epoch, id)).or_insert_with(|| CutCopy {
            epoch,
            bytes: pages.iter().map(|&p| par.area.page(p)).collect(),
            pages,
            sources: sources.into_iter().map(|s| (s, None)).collect(),
            leader,
            since: now,
        });
        if let Some(t) = copy.sources.get_mut(&slot) {
            *t = Some(through);
        }
        self.finish_cuts();
    }

    /// Sends every copy whose sources' updates up to their markers are all
    /// in.
    fn finish_cuts(&mut self) {
        let me = self.slot;
        let Some(par) = &mut self.parity else { return };
        let done: Vec<(Slot, u64, u64)> = par
            .cuts
            .iter()
            .filter(|(_, c)| c.sources.iter().all(|(&s, t)| t.is_some_and(|t| par.received[s as usize] >= t)))
            .map(|(&key, _)| key)
            .collect();
        for key in done {
            let copy = par.cuts.remove(&key).expect("copy");
            let id = key.2;
            let pages = copy.bytes.into_iter().map(Bytes::from).collect();
            self.out.push(Out::Send { to: copy.leader, msg: EcMsg::Pages { epoch: copy.epoch, id, slot: me, pages } });
        }
    }

    /// At the leader: once every source's and parity's pages are in,
    /// decode the lost slots' pages and serve what waited for them.
    fn on_pages(&mut self, epoch: u64, id: u64, slot: Slot, pages: Vec<Bytes>) {
        if epoch != self.config.epoch {
            return;
        }
        let Some(r) = self.repairs.get_mut(&id) else { return };
        r.got.insert(slot, pages);
        if !r.sources.iter().chain(&r.parity).all(|s| r.got.contains_key(s)) {
            return;
        }
        let mut r = self.repairs.remove(&id).expect("repair");
        // Sources without the pages are decoded too, if there is parity
        // enough; if not, again with more.
        r.got.retain(|_, pages| !pages.is_empty());
        let erasures = r.lost.len() + r.sources.iter().filter(|s| !r.got.contains_key(s)).count();
        if erasures > r.parity.len() {
            self.start_repair(r.pages, r.lost, erasures);
            return;
        }
        let (k, m) = (self.config.k as usize, self.config.m as usize);
        for (n, &page) in r.pages.iter().enumerate() {
            let mut shards: Vec<Option<Vec<u8>>> = vec![None; k + m];
            for (s, bytes) in &r.got {
                shards[*s as usize] = Some(bytes[n].to_vec());
            }
            self.code.reconstruct_data(&mut shards).expect("a cut has K shards");
            for &s in &r.lost {
                let Some(d) = self.data.get_mut(&s).filter(|d| d.missing.contains(&page)) else { continue };
                d.area.set_page(page, shards[s as usize].as_ref().expect("decoded"));
                d.missing.remove(&page);
                self.repaired += 1;
            }
        }
        for s in r.lost {
            self.retry_queue(s);
        }
        self.repair(true);
    }

    /// Serves the queued requests of `slot` whose pages are all here now.
    fn retry_queue(&mut self, slot: Slot) {
        let Some(d) = self.data.get_mut(&slot) else { return };
        let queue = std::mem::take(&mut d.queue);
        for (req, _) in queue {
            self.serve(slot, req);
        }
    }

    fn reply(&mut self, op: u64, reply: Reply) {
        self.out.push(Out::Reply { op, reply });
    }

    /// The bytes of page `page` of data slot `slot` if this member serves
    /// it and has it, or of its parity (`slot` = its own parity slot).
    pub fn page(&self, slot: Slot, page: u32) -> Option<Vec<u8>> {
        if let (Some(par), true) = (&self.parity, slot == self.slot) {
            return Some(par.area.page(page));
        }
        let d = self.data.get(&slot)?;
        (!d.missing.contains(&page)).then(|| d.area.page(page))
    }

    /// The pages of data slot `slot` (as this member knows its extent).
    pub fn pages(&self, slot: Slot) -> u32 {
        match (&self.parity, self.data.get(&slot)) {
            (_, Some(d)) => d.area.pages().max(d.missing.last().map_or(0, |p| p + 1)),
            (Some(par), None) if slot == self.slot => par.area.pages(),
            _ => 0,
        }
    }

    /// True once every served slot has all its pages and nothing waits on
    /// time. (A parity member may still buffer updates whose commit was
    /// lost on the way: the slot's next commit covers them.)
    pub fn settled(&self) -> bool {
        self.prep.is_none()
            && self.fetch.is_none()
            && self.rebuilt()
            && self.held.is_empty()
            && self.data.values().all(|d| d.missing.is_empty() && d.queue.is_empty() && d.pending.is_empty())
            && self.parity.as_ref().is_none_or(|p| p.cuts.is_empty())
    }

    /// The committed keys (and those with an expiry) of the data slots
    /// served here, of those `keep` says.
    pub fn count(&self, keep: impl Fn(Slot, &[u8]) -> bool) -> (usize, usize) {
        let (mut keys, mut expires) = (0, 0);
        for (&slot, d) in &self.data {
            for (key, meta) in d.index.iter() {
                if keep(slot, key) {
                    keys += 1;
                    expires += usize::from(meta.expires_at().is_some());
                }
            }
        }
        (keys, expires)
    }

    /// The keys of the data slots served here that `keep` takes and that
    /// have not expired at `now_ms` (KEYS, SCAN).
    pub fn live_keys(&self, keep: impl Fn(Slot, &[u8]) -> bool, now_ms: u64, into: &mut Vec<Bytes>) {
        for (&slot, d) in &self.data {
            for (key, meta) in d.index.iter() {
                if !meta.expired(now_ms) && keep(slot, key) {
                    into.push(Bytes::copy_from_slice(key));
                }
            }
        }
    }

    /// Whether this member holds its whole part: its own data slot (once
    /// alive) with every page, its parity rebuilt, and no slot it serves
    /// still being taken over. Until then it does not count towards the
    /// group's tolerance (M more failures).
    pub fn whole(&self) -> bool {
        let own = !self.config.is_data(self.slot) || !self.config.alive[self.slot as usize] || self.data.contains_key(&self.slot);
        own && self.rebuilt() && self.prep.is_none() && self.fetch.is_none() && self.data.values().all(|d| d.missing.is_empty())
    }

    /// Whether a lost slot is being taken over here (its requests wait).
    pub fn preparing(&self) -> bool {
        self.prep.is_some() || self.fetch.is_some() || !self.held.is_empty()
    }

    /// The data slots served here.
    pub fn served(&self) -> Vec<Slot> {
        self.data.keys().copied().collect()
    }

    /// The committed keys of data slot `slot` served here.
    pub fn keys(&self, slot: Slot) -> Vec<Bytes> {
        self.data.get(&slot).map(|d| d.index.iter().map(|(k, _)| Bytes::copy_from_slice(k)).collect()).unwrap_or_default()
    }

    /// One line per part, for the stories: the slots served (committed
    /// keys and places, updates waiting for acks, pages not repaired) and
    /// the parity (last update received and buffered, per data slot).
    pub fn status(&self) -> Vec<String> {
        let mut lines = Vec::new();
        for (slot, d) in &self.data {
            let mut keys: Vec<String> =
                d.index.iter().map(|(k, m)| format!("{}@{}+{}{}", String::from_utf8_lossy(k), m.loc.at, m.loc.len, until(&m))).collect();
            keys.sort();
            let mut line = format!("slot {slot}: {}", if keys.is_empty() { "no keys".into() } else { keys.join(" ") });
            if !d.pending.is_empty() {
                let stamps: Vec<String> = d.pending.iter().map(|p| format!("{}.{}", p.stamp.epoch, p.stamp.seq)).collect();
                line += &format!("; waiting {}", stamps.join(" "));
            }
            if !d.missing.is_empty() {
                line += &format!("; missing pages {:?}", d.missing.iter().collect::<Vec<_>>());
            }
            lines.push(line);
        }
        if let Some(par) = &self.parity {
            let per: Vec<String> = (0..par.received.len())
                .map(|i| {
                    let r = par.received[i];
                    format!("{i}@{}.{} ({} buffered)", r.epoch, r.seq, par.buffer[i].len())
                })
                .collect();
            lines.push(format!("parity: {}", per.join(", ")));
        }
        if self.prep.is_some() {
            lines.push("preparing".into());
        }
        lines
    }

    pub fn memory(&self) -> Memory {
        let mut m = Memory { repaired: self.repaired, expired: self.expired, given_back: self.given_back, ..Memory::default() };
        for d in self.data.values() {
            m.expires += d.expiring.len();
            m.data += d.area.bytes();
            let (placed, holes) = d.free.used();
            m.placed += placed;
            m.holes += holes;
            m.keys += d.index.len();
            m.missing += d.missing.len();
        }
        if let Some(par) = &self.parity {
            m.parity += par.area.bytes();
            m.replicas += par.index.iter().map(|i| i.len()).sum::<usize>();
            m.buffered += par.buffer.iter().map(|b| b.len()).sum::<usize>();
        }
        m
    }
}

/// A key's expiry, as status shows it.
fn until(m: &Meta) -> String {
    m.expires_at().map_or(String::new(), |at| format!(" until {at}"))
}

impl Data {
    fn new(next: Stamp, last: Stamp) -> Data {
        Data {
            area: Area::default(),
            free: Free::default(),
            index: Index::default(),
            expiring: BTreeSet::new(),
            recent: Recent::default(),
            next,
            last,
            last_to: u64::MAX,
            pending: VecDeque::new(),
            missing: BTreeSet::new(),
            queue: VecDeque::new(),
            joined: 0,
        }
    }

    /// A slot taken over (by the leader, or back by its rejoined member)
    /// from a parity member's metadata replica, every page missing until
    /// it is decoded: its updates are stamped from `next` on, after the
    /// last stable one.
    fn taken_over(next: Stamp, stable: Stamp, index: Index, extent: u64, recent: Recent) -> Data {
        let mut d = Data::new(next, stable);
        d.free = Free::rebuild(index.iter().map(|(_, m)| m.loc).collect(), extent);
        d.recent = recent;
        d.expiring = index.iter().filter_map(|(key, m)| Some((m.expires_at()?, Key::from(key)))).collect();
        d.missing = (0..extent.div_ceil(PAGE as u64) as u32).collect();
        d.index = index;
        d
    }

    /// The parity members an update goes to and commit waits for.
    fn targets(&self, config: &Config, stale: u64) -> u64 {
        config.parity_mask() & !stale | self.joined
    }
}

impl Parity {
    fn new(j: usize, k: usize) -> Parity {
        Parity {
            j,
            area: Area::default(),
            index: vec![Index::default(); k],
            received: vec![Stamp::default(); k],
            buffer: (0..k).map(|_| VecDeque::new()).collect(),
            extent: vec![0; k],
            fence: vec![0; k],
            source: vec![0; k],
            to: vec![u64::MAX; k],
            recent: vec![Recent::default(); k],
            cuts: HashMap::new(),
            rebuild: None,
        }
    }
}

impl CutCopy {
    /// Whether an update of `slot` stamped `stamp` belongs in the copy.
    fn takes(&self, slot: Slot, stamp: Stamp) -> bool {
        self.sources.get(&slot).is_some_and(|t| t.is_none_or(|t| stamp <= t))
    }

    /// Adds data slot i's diff to the copied pages it touches.
    fn add(&mut self, code: &Code, j: usize, i: usize, d: &Diff) {
        super::area::each_page(d.at, d.bytes.len(), |page, off, range| {
            if let Some(n) = self.pages.iter().position(|&p| p as usize == page) {
                let len = range.len();
                code.add_delta(j, i, &d.bytes[range], &mut self.bytes[n][off..off + len]);
            }
        });
    }
}

/// The slots of a mask.
fn bits(mask: u64) -> impl Iterator<Item = Slot> {
    (0..64).filter(move |b| mask & (1 << b) != 0)
}

fn req_op(r: &Req) -> u64 {
    match r {
        Req::Put { op, .. } | Req::Get { op, .. } => *op,
    }
}

fn req_key(r: &Req) -> &Bytes {
    match r {
        Req::Put { put, .. } => &put.key,
        Req::Get { key, .. } => key,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_is_remembered_until_it_stops_writing_for_a_minute() {
        let mut recent = Recent::default();
        let id = |write, done_below| WriteId { client: 7, write, done_below };
        recent.insert(id(3, 3), 30, 1_000);
        assert!(matches!(recent.seen(id(3, 3)), Seen::Done(30)), "a resend is answered");
        recent.insert(id(4, 4), 40, 2_000);
        assert!(matches!(recent.seen(id(3, 3)), Seen::Finished), "a late copy of a finished write is not applied");
        recent.forget_idle(2_000 + crate::chain::WRITE_MEMORY_MS - 1);
        assert!(matches!(recent.seen(id(4, 4)), Seen::Done(40)));
        recent.forget_idle(2_000 + crate::chain::WRITE_MEMORY_MS);
        assert!(matches!(recent.seen(id(4, 4)), Seen::New), "forgotten");
        assert!(recent.0.is_empty());
    }
}
