//! The site receiver: shows other sites' updates in this site without ever
//! showing an effect before its cause (Eunomia §4, Algorithm 5), as a sans-I/O
//! state machine like `node::Node`.
//!
//! # What it guarantees
//!
//! Each other site's stabilizer ships this site its stream of update ids in
//! timestamp order (`stabilizer`), and that site's partitions send the
//! values to their siblings here directly (Eunomia §5, data and metadata
//! separated; a value may arrive before or after its id). The receiver
//! keeps one queue per origin site (`Queue_m[k]`) and a vector
//! (`SiteTime_m`, `applied()`): for each origin `k`, every update of `k`
//! with timestamp <= `applied()[k]` is *stable in this site's chains*.
//!
//! It asks for the update at the front of origin `k`'s queue to be applied
//! (`ReceiverOut::Apply`, routed by the caller through the head of the local
//! chain so the chain's invariants hold) once
//!
//! 1. its value has arrived,
//! 2. its dependencies on third sites are stable here: `vv[d] <=
//!    applied()[d]` for every site `d` other than `k` and this one (Alg. 5
//!    line 12), and
//! 3. its dependencies in its own site are stable here: `local_dep <=
//!    applied()[k]`.
//!
//! Updates of one origin are asked for in stream order. An update counts as
//! applied (moves `applied()`, satisfies others' dependencies) only when the
//! caller reports it stable in the local chain (`ReceiverMsg::Applied`), not
//! when it is handed out: a reader anywhere in a chain may see a new version
//! as soon as the head has it, so a dependent update must not reach any head
//! before its cause is everywhere. This is ChainReaction's dependency
//! stabilization (§3.3.1), applied to remote writes.
//!
//! Condition 3 is where we differ from the paper. Alg. 5 waits for "ok" from
//! the partition before the next update of the same origin, i.e. one update
//! of each origin in flight at a time; once "ok" means "stable in a chain"
//! that is one chain round trip per remote update. Every update of an origin
//! could depend on every earlier one (their timestamps say no more), so
//! updates carry the writer's causal past in their own site (`UpdateId::
//! local_dep`) and concurrent updates of one origin flow in parallel. An
//! origin that sends `local_dep = ts.just_before()` gets the paper's
//! behaviour. Dependencies on this site itself are not checked: a local
//! update is stable in its chain before it is reported to the stabilizer
//! (see the stabilizer docs), so anything that depends on it finds it here.
//!
//! The receiver takes from each origin only what extends the stream it has
//! (`Ship::prev` at or before what it received), never a gap or a duplicate,
//! and acknowledges to every replica of the origin's stabilizer how far it
//! received and how far it applied (`stabilizer::SiteAck`). It ignores
//! shipments and values from sites not in its configuration.
//!
//! A shipment that lands ahead of a gap is kept, not refused. Shipments
//! land on any node of this site and are relayed to the receiver, one more
//! hop, so one routinely overtakes the one before it; refusing it cost a
//! round trip to the origin's leader and back. Kept shipments that continue
//! one another are joined into runs (`Run`), and a run is taken in, from
//! what extends the stream, as soon as what it continues from has arrived.
//! That is safe because the stream is a pure function of the origin's
//! updates (see `stabilizer`): every shipment from every leader lists
//! exactly the ids between its `prev` and its `through`, so shipments that
//! overlap agree where they overlap. At most `EARLY_RUNS` runs and
//! `stabilizer::SHIP_WINDOW` ids are kept per origin; beyond that the runs
//! furthest ahead are dropped and a resend asked for at once, as before.
//! Otherwise a resend is asked for only when a gap stays open
//! `GAP_RESEND_MS`: asking at once makes the leader ship everything after
//! the acknowledged point again, which for a shipment merely late is WAN
//! traffic for nothing. A lost shipment costs those milliseconds more (the
//! leader's own silence timer, `stabilizer::SHIP_RESEND_MS`, is the
//! backstop).
//!
//! # Paper map
//!
//! | paper | here |
//! | --- | --- |
//! | Alg. 5 `new_update` | `step` with `ReceiverMsg::Ship` |
//! | Alg. 5 `check_pending` / `flush` | `flush`, run whenever an id, a value or a local stability report arrives |
//! | Alg. 5 lines 13-17 (`apply`, `ok`, `SiteTime[k]`) | `ReceiverOut::Apply`, then `ReceiverMsg::Applied` |
//! | §5 data/metadata separation | `ReceiverMsg::Value` |
//!
//! # What is left out
//!
//! * The receiver is not replicated. A restarted one is rebuilt from the
//!   site's applied vector (`Receiver::new`), and the origins ship again
//!   from there (they keep everything not applied); values it held are gone,
//!   so the sibling partitions must send again the values of updates not yet
//!   applied here.
//! * Catching up is paced by dependency chains: n updates of one origin,
//!   each depending on the previous one, cost n local chain stabilizations
//!   one after the other (the same price local writes pay for dependency
//!   stabilization). A site that was cut off therefore catches up at that
//!   pace, not at link bandwidth. Applying eagerly and hiding remote
//!   versions from readers until `applied()` covers them would lift this;
//!   it is not built.
//! * Values of updates never shipped (lost with their partition before they
//!   were reported) wait forever; nothing expires them yet.

use crate::geo::reporter::{Batch, Stamped};
use crate::geo::stabilizer::{Position, Ship, SiteAck, UpdateId, SHIP_WINDOW};
use crate::hlc::Timestamp;
pub use crate::message::geo::{RemoteValue, RemoteWrite, ValuesAck};
use crate::ring::PartitionId;
use crate::version::{SiteId, Version, VersionVector};
use ahash::AHashMap;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};

/// Every origin is acknowledged at least this often, changed or not. An
/// origin at rest promises about as often (`geo::REST_MS`), which makes
/// its acknowledgement due anyway (each second, idle sites sent each
/// other a sixth more geo messages).
pub const SITE_ACK_REFRESH_MS: u64 = 3_000;

/// At most this many runs of shipments of one origin are kept ahead of a
/// gap (one per gap: shipments that continue one another join a run).
pub const EARLY_RUNS: usize = 64;

/// A gap in an origin's stream open this long (shipments kept ahead of it,
/// the one before them not here) asks the leader to ship again from what
/// was received. Well above a relay hop inside a site or WAN jitter, well
/// below the leader's own `stabilizer::SHIP_RESEND_MS`.
pub const GAP_RESEND_MS: u64 = 20;

/// What the receiver is told.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReceiverMsg {
    /// From another site's stabilizer leader.
    Ship(Ship),
    /// From a sibling partition in another site: the next part of its value
    /// stream (`geo::reporter`).
    Values { origin: SiteId, batch: Batch<RemoteValue> },
    /// From this site's chain of `partition`: the remote update `(origin,
    /// partition, ts)` is stable (has reached the tail).
    Applied { origin: SiteId, partition: PartitionId, ts: Timestamp },
}

/// What the receiver sends.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReceiverOut {
    /// To the head of the local chain of `partition`.
    Apply(RemoteWrite),
    /// To every stabilizer replica of `ack.origin`.
    Ack(SiteAck),
    /// To the sibling partition of `ack.partition` in `ack.origin`.
    ValuesAck(ValuesAck),
}

impl Stamped for RemoteValue {
    fn ts(&self) -> Timestamp {
        self.ts
    }
}

/// One sibling partition's value stream, as received here.
#[derive(Clone, Debug, Default)]
struct ValueStream {
    received: Timestamp,
    due: bool,
    resend: bool,
    /// `Receiver::eventual`: values handed out and not reported stable,
    /// with when they were last handed out.
    applying: BTreeMap<Timestamp, (RemoteWrite, Option<u64>)>,
    /// `Receiver::eventual`: the latest value handed out, and what the last
    /// acknowledgement said was applied: the origin keeps every value
    /// until acknowledged (`Receiver::idle`).
    handed: Timestamp,
    acked: Timestamp,
}

impl ValueStream {
    /// `Receiver::eventual`: every value of the stream up to here is
    /// stable in this site's chains.
    fn applied(&self) -> Timestamp {
        self.applying.keys().next().map_or(self.received, |ts| ts.just_before())
    }
}

/// A remote update handed out and not reported stable yet.
#[derive(Debug)]
struct InFlight {
    pos: Position,
    stable: bool,
    /// `None` for an update this site had applied before (never sent).
    write: Option<RemoteWrite>,
    /// When it was last handed out (set on the first tick after).
    sent_ms: Option<u64>,
}

/// A remote update not reported stable this long after it was handed out
/// is handed out again.
pub const APPLY_RESEND_MS: u64 = 500;

/// What the receiver holds of one origin site's stream.
#[derive(Debug)]
struct Origin {
    /// The stream is here without a gap up to this position.
    received: Position,
    /// `Queue_m[k]`: received, not handed out yet, in stream order.
    pending: VecDeque<UpdateId>,
    /// Shipments that landed ahead of a gap (`prev` past `received`),
    /// joined into runs, by `prev`: taken in once the stream reaches their
    /// `prev`. No two runs touch (else they would be one).
    early: BTreeMap<Position, Run>,
    /// Since when (a tick's time) the gap before `early` is open.
    gap_since_ms: Option<u64>,
    /// Handed out and not reported stable, in stream order: reports come in
    /// any order, and what is not reported in `APPLY_RESEND_MS` is handed
    /// out again (the head changed, or a message was lost; applying twice
    /// is harmless).
    in_flight: VecDeque<InFlight>,
    /// Everything up to here is stable in the local chains.
    applied: Position,
    /// Everything up to here is also synced on every node's disk here
    /// (`Receiver::synced`): what this site acknowledges as applied, so
    /// that its origin forgets only what survives this site crashing whole.
    durable: Position,
    /// Everything up to here was handed out (values for it are stale).
    handed_out: Position,
    /// `durable` as last acknowledged: the origin keeps every id (and its
    /// value) after it (`Receiver::idle`).
    acked_durable: Position,
    ack_due: bool,
    resend: bool,
    /// When it was last acknowledged.
    acked_ms: u64,
    /// Its partitions' value streams.
    streams: BTreeMap<PartitionId, ValueStream>,
}

/// A stretch of an origin's stream: exactly the ids after `prev` up to
/// `through`, in stream order (one shipment, or several that continue one
/// another).
#[derive(Debug)]
struct Run {
    prev: Position,
    ids: Vec<UpdateId>,
    through: Position,
}

impl Run {
    /// Adds `next`, which continues from within this run or right at its
    /// end (`self.prev <= next.prev <= self.through`).
    fn join(&mut self, next: Run) {
        let end = self.through;
        self.ids.extend(next.ids.into_iter().filter(|id| id.position() > end));
        self.through = self.through.max(next.through);
    }
}

impl Origin {
    /// Takes from `run` (which continues from at or before `received`) the
    /// ids past `received`, in stream order.
    fn extend(&mut self, run: Run) {
        debug_assert!(run.prev <= self.received, "a run continuing past what is received leaves a gap");
        let before = self.received;
        for id in run.ids {
            if id.position() > self.received {
                self.received = id.position();
                self.pending.push_back(id);
            }
        }
        self.received = self.received.max(run.through);
        if self.received > before {
            self.gap_since_ms = None; // a gap left after it starts its own wait
        }
    }

    /// Keeps `run`, which lands ahead of a gap, joining it with the kept
    /// runs it touches; past the bounds, drops the runs furthest ahead
    /// and asks for a resend.
    fn keep(&mut self, run: Run) {
        let mut runs: Vec<Run> = std::mem::take(&mut self.early).into_values().collect();
        let at = runs.partition_point(|r| r.prev <= run.prev);
        runs.insert(at, run);
        for run in runs {
            match self.early.last_entry() {
                Some(mut last) if last.get().through >= run.prev => last.get_mut().join(run),
                _ => {
                    self.early.insert(run.prev, run);
                }
            }
        }
        while self.early.len() > EARLY_RUNS || self.early.values().map(|r| r.ids.len()).sum::<usize>() > SHIP_WINDOW {
            self.early.pop_last();
            self.resend = true;
        }
    }
}

/// A site's receiver (Eunomia Alg. 5, `r_m`).
#[derive(Debug)]
pub struct Receiver {
    me: SiteId,
    origins: BTreeMap<SiteId, Origin>,
    /// `SiteTime_m`; this site's own entry stays zero.
    site_time: VersionVector,
    /// Values whose update has not been handed out.
    values: AHashMap<(SiteId, PartitionId, Timestamp), RemoteValue>,
    /// `Some(partitions)`: the eventual baseline (`Receiver::eventual`).
    eventual: Option<u32>,
    /// What was applied of each origin when probe `.0` went to the site's
    /// nodes (`mark`), oldest first, until every node synced past it.
    marks: VecDeque<(u64, Vec<(SiteId, Position)>)>,
}

/// At most this many marks are kept (`Receiver::mark`); past it the oldest
/// go (durability then moves in larger steps, never wrongly).
pub const MARKS: usize = 256;

impl Receiver {
    /// The receiver of site `me` in a deployment of `sites`, resuming from
    /// `applied` (what the site's chains hold of each origin; all zero for a
    /// new site).
    pub fn new(me: SiteId, sites: &[SiteId], applied: &VersionVector) -> Receiver {
        let mut site_time = VersionVector::default();
        site_time.0.resize(sites.iter().map(|&s| s as usize + 1).max().unwrap_or(0), Timestamp::ZERO);
        let origins = sites
            .iter()
            .filter(|&&s| s != me)
            .map(|&s| {
                let from = Position::through(applied.get(s));
                site_time.0[s as usize] = from.time();
                let origin = Origin {
                    received: from,
                    pending: VecDeque::new(),
                    early: BTreeMap::new(),
                    gap_since_ms: None,
                    in_flight: VecDeque::new(),
                    applied: from,
                    durable: from,
                    handed_out: from,
                    acked_durable: from,
                    ack_due: true,
                    resend: false,
                    acked_ms: 0,
                    streams: BTreeMap::new(),
                };
                (s, origin)
            })
            .collect();
        Receiver { me, origins, site_time, values: AHashMap::new(), eventual: None, marks: VecDeque::new() }
    }

    /// The baseline without causal order (`geo::Replication::Eventual`):
    /// no ids are shipped; each value is handed out as soon as it arrives,
    /// in any order, and resent until reported stable. Each origin's entry
    /// of `applied()` is still exact (the minimum over its `partitions`
    /// value streams of what is stable here), so lag and `CW.WAIT` keep
    /// their meaning; only the order of visibility is given up.
    pub fn eventual(me: SiteId, sites: &[SiteId], partitions: u32) -> Receiver {
        let mut r = Receiver::new(me, sites, &VersionVector::default());
        r.eventual = Some(partitions);
        r
    }

    /// Probe `probe` goes to every node of the site: remembers what is
    /// applied now, to count it durable once every node synced what it
    /// had logged when the probe reached it (`synced`). Everything applied
    /// now was logged by every replica of its chain before its stability
    /// report reached this receiver, so before the probe reached them.
    pub fn mark(&mut self, probe: u64) {
        let now: Vec<(SiteId, Position)> = self.origins.iter().map(|(&s, o)| (s, o.applied)).collect();
        if self.marks.back().is_some_and(|(_, last)| *last == now) {
            return;
        }
        self.marks.push_back((probe, now));
        if self.marks.len() > MARKS {
            self.marks.pop_front();
        }
    }

    /// Every node of the site synced what it had logged when it got probe
    /// `probe` (and every earlier one): what was applied then is durable.
    pub fn synced(&mut self, probe: u64) {
        while self.marks.front().is_some_and(|&(p, _)| p <= probe) {
            let (_, applied) = self.marks.pop_front().expect("a mark");
            for (origin, pos) in applied {
                let o = self.origins.get_mut(&origin).expect("a known origin");
                if pos > o.durable {
                    o.durable = pos;
                    o.ack_due = true;
                    for v in o.streams.values_mut() {
                        v.due = true;
                    }
                }
            }
        }
    }

    pub fn step(&mut self, msg: ReceiverMsg, out: &mut Vec<ReceiverOut>) {
        match msg {
            ReceiverMsg::Ship(ship) => self.new_updates(ship),
            ReceiverMsg::Values { origin, batch } => self.new_values(origin, batch, out),
            ReceiverMsg::Applied { origin, partition, ts } => self.stable_locally(origin, Position { ts, partition }),
        }
        self.flush(out);
    }

    /// Acknowledges, once per tick, every origin whose stream moved here,
    /// and every origin again each `SITE_ACK_REFRESH_MS` (an ack lost on the
    /// way to a stabilizer replica that is not leading is otherwise never
    /// repaired once the stream is quiet, and that replica keeps ids every
    /// site applied).
    pub fn tick(&mut self, now_ms: u64, out: &mut Vec<ReceiverOut>) {
        for o in self.origins.values_mut() {
            for f in o.in_flight.iter_mut().filter(|f| !f.stable) {
                if overdue(&mut f.sent_ms, now_ms) {
                    out.extend(f.write.clone().map(ReceiverOut::Apply));
                }
            }
            for (write, sent_ms) in o.streams.values_mut().flat_map(|v| v.applying.values_mut()) {
                if overdue(sent_ms, now_ms) {
                    out.push(ReceiverOut::Apply(write.clone()));
                }
            }
        }
        for (&origin, o) in self.origins.iter_mut() {
            if o.early.is_empty() {
                o.gap_since_ms = None;
            } else {
                match o.gap_since_ms {
                    None => o.gap_since_ms = Some(now_ms),
                    Some(at) if now_ms.saturating_sub(at) >= GAP_RESEND_MS => {
                        // Not merely late: lost, or dropped by a leader
                        // that changed. Asked again each `GAP_RESEND_MS`.
                        o.resend = true;
                        o.ack_due = true;
                        o.gap_since_ms = Some(now_ms);
                    }
                    Some(_) => {}
                }
            }
            let refresh = now_ms.saturating_sub(o.acked_ms) >= SITE_ACK_REFRESH_MS;
            for (&partition, v) in o.streams.iter_mut().filter(|(_, v)| v.due || refresh) {
                // Everything of this partition at or before the durable
                // point. (The eventual baseline acknowledges what is
                // stable: it makes no promise across a whole-site crash.)
                let applied = match self.eventual {
                    Some(_) => v.applied(),
                    None if o.durable.partition >= partition => o.durable.ts,
                    None => o.durable.ts.just_before(),
                };
                let ack = ValuesAck { from: self.me, origin, partition, received: v.received, applied, resend: v.resend };
                out.push(ReceiverOut::ValuesAck(ack));
                v.acked = applied;
                v.due = false;
                v.resend = false;
            }
            if self.eventual.is_some() {
                o.acked_ms = now_ms;
                continue; // no stabilizer to acknowledge to
            }
            if !o.ack_due && !refresh {
                continue;
            }
            let ack = SiteAck { from: self.me, origin, received: o.received, applied: o.durable, visible: o.applied, resend: o.resend };
            out.push(ReceiverOut::Ack(ack));
            o.acked_durable = o.durable;
            o.ack_due = false;
            o.resend = false;
            o.acked_ms = now_ms;
        }
    }

    /// `SiteTime_m`: for each origin, every update of it with timestamp <= its
    /// entry is stable in this site (this site's own entry is zero).
    pub fn applied(&self) -> &VersionVector {
        &self.site_time
    }

    /// What this site has applied of each origin and synced on every node
    /// (survives the site crashing whole).
    pub fn durable(&self) -> VersionVector {
        let mut vv = VersionVector::default();
        for (&origin, o) in &self.origins {
            vv.set(origin, o.durable.time());
        }
        vv
    }

    /// Ids received and not handed out yet (not counting shipments kept
    /// ahead of a gap).
    pub fn waiting(&self) -> usize {
        self.origins.values().map(|o| o.pending.len()).sum()
    }

    /// Ids kept ahead of a gap.
    pub fn early(&self) -> usize {
        self.origins.values().flat_map(|o| o.early.values()).map(|run| run.ids.len()).sum()
    }

    /// Whether nothing here waits on time (`geo::Geo::idle`): every update
    /// received is stable here and acknowledged to its origin as durable
    /// (which keeps it until then), no value waits for its id, no shipment
    /// for a gap to fill, no resend is to be asked for. What moves with
    /// promises alone (an origin's stream past its last id, a value stream
    /// past its last value) does not count: acknowledging it on the next
    /// tick, however late, holds nothing back at the origin.
    pub fn idle(&self) -> bool {
        let stream_idle = |v: &ValueStream| v.applying.is_empty() && !v.resend && v.handed <= v.acked;
        self.values.is_empty()
            && self.origins.values().all(|o| {
                o.pending.is_empty()
                    && o.early.is_empty()
                    && o.in_flight.is_empty()
                    && !o.resend
                    && o.handed_out <= o.acked_durable
                    && o.streams.values().all(stream_idle)
            })
    }

    /// Remote updates handed out and not reported stable yet.
    pub fn in_flight(&self) -> usize {
        self.origins.values().map(|o| o.in_flight.len() + o.streams.values().map(|v| v.applying.len()).sum::<usize>()).sum()
    }

    /// Each origin's stream here, one line each (diagnostics).
    pub fn describe(&self) -> String {
        let mut lines = Vec::new();
        for (origin, o) in &self.origins {
            let front = o.pending.front().map(|id| {
                let has_value = self.values.contains_key(&(*origin, id.partition, id.ts));
                format!("{}@p{} (value here: {has_value}, local_dep {}, vv {:?})", id.ts, id.partition, id.local_dep, id.vv)
            });
            let flying = o.in_flight.front().map(|f| format!("{}@p{} stable {}", f.pos.ts, f.pos.partition, f.stable));
            lines.push(format!(
                "from {origin}: received {:?}, applied {:?}, {} pending (front {front:?}), {} early (first after {:?}), {} in flight (front {flying:?}), value streams {:?}",
                o.received,
                o.applied,
                o.pending.len(),
                o.early.len(),
                o.early.keys().next(),
                o.in_flight.len(),
                o.streams.iter().map(|(p, v)| (*p, v.received)).collect::<Vec<_>>()
            ));
        }
        lines.join("\n")
    }

    /// Alg. 5 `new_update`, for a whole shipment: take what extends the
    /// stream, keep a shipment ahead of a gap for when the gap fills.
    fn new_updates(&mut self, ship: Ship) {
        if ship.to != self.me {
            return;
        }
        let Some(o) = self.origins.get_mut(&ship.origin) else { return };
        o.ack_due = true;
        if ship.applied > o.applied {
            // This site applied more before this receiver started (its own
            // earlier acknowledgement, echoed, durable): resume from there.
            o.applied = ship.applied;
            o.durable = o.durable.max(ship.applied);
            o.handed_out = o.handed_out.max(ship.applied);
            o.received = o.received.max(ship.applied);
            o.pending.retain(|id| id.position() > ship.applied);
            for f in o.in_flight.iter_mut().filter(|f| f.pos <= ship.applied) {
                f.stable = true;
            }
            while o.in_flight.front().is_some_and(|f| f.stable) {
                o.in_flight.pop_front();
            }
            self.site_time.0[ship.origin as usize] = self.site_time.get(ship.origin).max(ship.applied.time());
            self.values.retain(|&(origin, partition, ts), _| origin != ship.origin || Position { ts, partition } > ship.applied);
            // Kept runs wholly at or before it go with the loop below.
        }
        let run = Run { prev: ship.prev, ids: ship.ids, through: ship.through };
        if run.prev > o.received {
            o.keep(run);
        } else {
            o.extend(run);
        }
        // Each kept run that now continues the stream: `extend` takes only
        // what is past `received`, so overlaps add nothing twice and, every
        // run being gap-free from its `prev`, leave no gap.
        while o.early.first_key_value().is_some_and(|(&prev, _)| prev <= o.received) {
            let (_, run) = o.early.pop_first().expect("a first run");
            o.extend(run);
        }
        self.settle(ship.origin);
    }

    /// A sibling partition's values: keeps what extends its stream and was
    /// not handed out yet, refuses a gap. The eventual baseline hands each
    /// one out at once.
    fn new_values(&mut self, origin: SiteId, batch: Batch<RemoteValue>, out: &mut Vec<ReceiverOut>) {
        let Some(o) = self.origins.get_mut(&origin) else { return };
        let stream = o.streams.entry(batch.partition).or_default();
        stream.due = true;
        if batch.prev > stream.received {
            stream.resend = true;
            return;
        }
        for value in batch.items {
            if value.ts > stream.received && value.origin == origin && value.partition == batch.partition {
                stream.received = value.ts;
                if self.eventual.is_some() {
                    let write = RemoteWrite {
                        partition: value.partition,
                        key: value.key,
                        value: value.value,
                        expires_at_ms: value.expires_at_ms,
                        version: Version::local(origin, value.ts),
                    };
                    out.push(ReceiverOut::Apply(write.clone()));
                    stream.applying.insert(value.ts, (write, None));
                    stream.handed = value.ts;
                } else if (Position { ts: value.ts, partition: value.partition }) > o.handed_out {
                    self.values.insert((value.origin, value.partition, value.ts), value);
                }
            }
        }
        stream.received = stream.received.max(batch.up_to);
        if self.eventual.is_some() {
            self.settle(origin);
        }
    }

    fn stable_locally(&mut self, origin: SiteId, pos: Position) {
        let Some(o) = self.origins.get_mut(&origin) else { return };
        if self.eventual.is_some() {
            if let Some(v) = o.streams.get_mut(&pos.partition) {
                v.due |= v.applying.remove(&pos.ts).is_some();
            }
            return self.settle(origin);
        }
        if let Ok(i) = o.in_flight.binary_search_by_key(&pos, |f| f.pos) {
            o.in_flight[i].stable = true;
        }
        while o.in_flight.front().is_some_and(|f| f.stable) {
            o.in_flight.pop_front();
        }
        self.settle(origin);
    }

    /// Moves `origin`'s applied point (and its `SiteTime` entry) up to just
    /// before the first update of it that is not stable here.
    fn settle(&mut self, origin: SiteId) {
        let o = self.origins.get_mut(&origin).expect("settle a known origin");
        if let Some(partitions) = self.eventual {
            // Every partition of the origin must have been heard from.
            if o.streams.len() == partitions as usize {
                let applied = o.streams.values().map(ValueStream::applied).min().unwrap_or(Timestamp::ZERO);
                let entry = &mut self.site_time.0[origin as usize];
                *entry = (*entry).max(applied);
            }
            return;
        }
        let first_missing = o.in_flight.front().map(|f| f.pos).or_else(|| o.pending.front().map(UpdateId::position));
        let applied = first_missing.map_or(o.received, Position::before);
        if applied > o.applied {
            o.applied = applied;
            o.ack_due = true;
            self.site_time.0[origin as usize] = applied.time();
        }
    }

    /// Alg. 5 `flush`: hand out, per origin in stream order, every update
    /// whose value is here and whose dependencies are stable here. Handing
    /// out changes no dependency (only `Applied` does), so one pass is
    /// enough.
    fn flush(&mut self, out: &mut Vec<ReceiverOut>) {
        loop {
            let mut skipped = Vec::new();
            for (&origin, o) in self.origins.iter_mut() {
                while let Some(next) = o.pending.front() {
                    if !ready(self.me, origin, next, &self.site_time) {
                        break;
                    }
                    let value = self.values.remove(&(origin, next.partition, next.ts));
                    let passed = o.streams.get(&next.partition).is_some_and(|v| v.received >= next.ts);
                    if value.is_none() && !passed {
                        break; // the value is on its way
                    }
                    let id = o.pending.pop_front().expect("front exists");
                    o.handed_out = id.position();
                    let Some(value) = value else {
                        // The partition's value stream went past it without
                        // it: its origin dropped it because this site had
                        // acknowledged it applied (an earlier receiver did,
                        // and this one was shipped the id again).
                        o.in_flight.push_back(InFlight { pos: id.position(), stable: true, write: None, sent_ms: None });
                        skipped.push(origin);
                        continue;
                    };
                    let write = RemoteWrite {
                        partition: id.partition,
                        key: value.key,
                        value: value.value,
                        expires_at_ms: value.expires_at_ms,
                        version: Version { ts: id.ts, site: origin, vv: VersionVector(id.vv.iter().copied().collect()) },
                    };
                    o.in_flight.push_back(InFlight { pos: id.position(), stable: false, write: Some(write.clone()), sent_ms: None });
                    out.push(ReceiverOut::Apply(write));
                }
            }
            if skipped.is_empty() {
                return;
            }
            for origin in skipped {
                let o = self.origins.get_mut(&origin).expect("known origin");
                while o.in_flight.front().is_some_and(|f| f.stable) {
                    o.in_flight.pop_front();
                }
                self.settle(origin);
            }
        }
    }
}

/// Whether a remote write handed out at `sent_ms` (`None`: this tick, which
/// is noted) is to be handed out again: not reported stable within
/// `APPLY_RESEND_MS` (then the clock restarts).
fn overdue(sent_ms: &mut Option<u64>, now_ms: u64) -> bool {
    match *sent_ms {
        None => *sent_ms = Some(now_ms),
        Some(at) if now_ms.saturating_sub(at) >= APPLY_RESEND_MS => {
            *sent_ms = Some(now_ms);
            return true;
        }
        Some(_) => {}
    }
    false
}

/// Whether `id` of `origin` may be applied at site `me` (Alg. 5 line 12,
/// plus its own site's dependencies, see the module docs).
fn ready(me: SiteId, origin: SiteId, id: &UpdateId, site_time: &VersionVector) -> bool {
    let third_sites = id.vv.iter().enumerate().all(|(d, &t)| {
        let d = d as SiteId;
        d == origin || d == me || t <= site_time.get(d)
    });
    third_sites && id.local_dep <= site_time.get(origin)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::geo::stabilizer::IdVector;
    use bytes::Bytes;

    fn ts(ms: u64) -> Timestamp {
        Timestamp::new(ms, 0)
    }

    /// An update of `origin` at `ms` in partition `partition`, depending on
    /// `deps` (site, ms) in other sites and on `local_dep` in its own.
    fn update(origin: SiteId, partition: PartitionId, ms: u64, local_dep: u64, deps: &[(SiteId, u64)]) -> UpdateId {
        let mut vv = IdVector::from_elem(Timestamp::ZERO, origin as usize + 1);
        vv[origin as usize] = ts(ms);
        for &(site, dep) in deps {
            if vv.len() <= site as usize {
                vv.resize(site as usize + 1, Timestamp::ZERO);
            }
            vv[site as usize] = ts(dep);
        }
        UpdateId { partition, ts: ts(ms), local_dep: ts(local_dep), vv }
    }

    fn ship(origin: SiteId, prev: Position, ids: Vec<UpdateId>, through_ms: u64) -> ReceiverMsg {
        ReceiverMsg::Ship(Ship { origin, to: 2, prev, ids, through: Position::through(ts(through_ms)), applied: Position::START })
    }

    fn value(origin: SiteId, partition: PartitionId, ms: u64) -> ReceiverMsg {
        let key = Bytes::from(format!("k{origin}.{partition}.{ms}"));
        let value = RemoteValue { origin, partition, ts: ts(ms), key, value: Some(Bytes::from("v")), expires_at_ms: None };
        // Each test value continues its partition's stream from the start.
        ReceiverMsg::Values { origin, batch: Batch { partition, prev: Timestamp::ZERO, items: vec![value], up_to: ts(ms) } }
    }

    fn applied(origin: SiteId, partition: PartitionId, ms: u64) -> ReceiverMsg {
        ReceiverMsg::Applied { origin, partition, ts: ts(ms) }
    }

    /// The (origin, ms) of every Apply in `out`, which it empties.
    fn applies(out: &mut Vec<ReceiverOut>) -> Vec<(SiteId, u64)> {
        let mut got = Vec::new();
        out.retain(|o| match o {
            ReceiverOut::Apply(w) => {
                got.push((w.version.site, w.version.ts.physical_ms()));
                false
            }
            ReceiverOut::Ack(_) | ReceiverOut::ValuesAck(_) => true,
        });
        got
    }

    fn acks(r: &mut Receiver) -> Vec<SiteAck> {
        acks_at(r, 0)
    }

    fn acks_at(r: &mut Receiver, now_ms: u64) -> Vec<SiteAck> {
        let mut out = Vec::new();
        r.tick(now_ms, &mut out);
        out.into_iter().filter_map(|o| if let ReceiverOut::Ack(a) = o { Some(a) } else { None }).collect()
    }

    /// Site 2 receives an update of site 1 that depends on an update of site
    /// 0 it has not received yet: it waits for it, and then for it to be
    /// stable in the local chain.
    #[test]
    fn an_update_waits_for_its_dependency_from_a_third_site() {
        let mut r = Receiver::new(2, &[0, 1, 2], &VersionVector::default());
        let mut out = Vec::new();
        r.step(ship(1, Position::START, vec![update(1, 0, 10, 0, &[(0, 5)])], 10), &mut out);
        r.step(value(1, 0, 10), &mut out);
        assert!(applies(&mut out).is_empty(), "site 0's update at 5 is not here");

        r.step(value(0, 3, 5), &mut out);
        r.step(ship(0, Position::START, vec![update(0, 3, 5, 0, &[])], 6), &mut out);
        assert_eq!(applies(&mut out), vec![(0, 5)]);
        assert_eq!(r.applied().get(0), ts(5).just_before(), "handed out is not applied");

        r.step(applied(0, 3, 5), &mut out);
        assert_eq!(r.applied().get(0), ts(6));
        assert_eq!(applies(&mut out), vec![(1, 10)]);
        r.step(applied(1, 0, 10), &mut out);
        assert_eq!(r.applied().get(1), ts(10));
    }

    #[test]
    fn a_value_may_arrive_before_or_after_its_id() {
        let mut r = Receiver::new(2, &[0, 1, 2], &VersionVector::default());
        let mut out = Vec::new();
        r.step(value(0, 0, 1), &mut out);
        assert!(applies(&mut out).is_empty());
        r.step(ship(0, Position::START, vec![update(0, 0, 1, 0, &[]), update(0, 1, 2, 0, &[])], 2), &mut out);
        assert_eq!(applies(&mut out), vec![(0, 1)], "the second waits for its value");
        r.step(value(0, 1, 2), &mut out);
        assert_eq!(applies(&mut out), vec![(0, 2)]);
        // A value sent again after its update was handed out is not kept.
        r.step(value(0, 1, 2), &mut out);
        assert!(r.values.is_empty());
    }

    /// Updates of one origin are handed out in order. One that depends on
    /// the previous one waits until that one is stable here; concurrent ones
    /// flow together, and count as applied only up to the first not stable.
    #[test]
    fn an_update_counts_as_applied_only_once_stable_here() {
        let mut r = Receiver::new(2, &[0, 1, 2], &VersionVector::default());
        let mut out = Vec::new();
        let ids = vec![update(0, 0, 1, 0, &[]), update(0, 1, 2, 1, &[]), update(0, 2, 3, 0, &[])];
        for ms in 1..=3 {
            r.step(value(0, ms as PartitionId - 1, ms), &mut out);
        }
        r.step(ship(0, Position::START, ids, 3), &mut out);
        assert_eq!(applies(&mut out), vec![(0, 1)], "2 depends on 1, which is not stable yet; 3 is behind 2");
        r.step(applied(0, 0, 1), &mut out);
        assert_eq!(r.applied().get(0), ts(2).just_before(), "everything before 2");
        assert_eq!(applies(&mut out), vec![(0, 2), (0, 3)], "3 is concurrent with 2");
        r.step(applied(0, 2, 3), &mut out);
        assert_eq!(r.applied().get(0), ts(2).just_before(), "2 is not stable yet");
        r.step(applied(0, 1, 2), &mut out);
        assert_eq!(r.applied().get(0), ts(3));
        let ack = acks(&mut r).into_iter().find(|a| a.origin == 0).unwrap();
        assert_eq!(ack.visible, Position::through(ts(3)));
        // Stable is not synced: the origin must keep it until every node
        // here synced what it had logged when probe 7 reached it.
        assert_eq!(ack.applied, Position::START, "nothing synced yet");
        r.mark(7);
        r.synced(6);
        assert_eq!(acks(&mut r).into_iter().find(|a| a.origin == 0).map(|a| a.applied), None, "an older probe says nothing new");
        r.synced(7);
        let ack = acks(&mut r).into_iter().find(|a| a.origin == 0).unwrap();
        assert_eq!(ack.applied, Position::through(ts(3)));
    }

    #[test]
    fn takes_only_what_extends_the_stream() {
        let mut r = Receiver::new(2, &[0, 1, 2], &VersionVector::default());
        let mut out = Vec::new();
        acks(&mut r);
        let a = update(0, 0, 1, 0, &[]);
        let b = update(0, 0, 2, 0, &[]);
        let c = update(0, 0, 3, 0, &[]);
        // The shipment of `a` is lost: the one of `b` is kept ahead of the
        // gap, and a resend asked for only once the gap stayed open
        // `GAP_RESEND_MS`.
        r.step(ship(0, a.position(), vec![b.clone()], 2), &mut out);
        assert_eq!((r.waiting(), r.early()), (0, 1));
        let ack = acks_at(&mut r, 10);
        assert!(!ack[0].resend && ack[0].received == Position::through(Timestamp::ZERO));
        assert!(acks_at(&mut r, 10 + GAP_RESEND_MS - 1).is_empty());
        let ack = acks_at(&mut r, 10 + GAP_RESEND_MS);
        assert!(ack[0].resend && ack[0].received == Position::through(Timestamp::ZERO));
        // The leader ships again from the start, twice (a retransmission).
        r.step(ship(0, Position::START, vec![a.clone(), b.clone()], 2), &mut out);
        r.step(ship(0, Position::START, vec![a, b, c], 3), &mut out);
        assert_eq!((r.waiting(), r.early()), (3, 0));
        assert!(!acks_at(&mut r, 100)[0].resend, "no gap left");
        // A site that is not in the configuration, and a shipment for another site, are ignored.
        r.step(ship(7, Position::START, vec![update(7, 0, 1, 0, &[])], 1), &mut out);
        r.step(
            ReceiverMsg::Ship(Ship {
                origin: 1,
                to: 0,
                prev: Position::START,
                ids: vec![],
                through: Position::through(ts(9)),
                applied: Position::START,
            }),
            &mut out,
        );
        assert_eq!(r.waiting(), 3);
        assert_eq!(r.applied().get(1), Timestamp::ZERO);
    }

    /// Shipments land on any node of the site and are relayed to the
    /// receiver, so one may overtake the one before it: the later one is
    /// kept, and both are handed out as soon as the earlier one lands, with
    /// no resend asked for. A re-shipment that overlaps what is kept adds
    /// no duplicate.
    #[test]
    fn a_shipment_that_overtakes_the_one_before_it_waits_for_it() {
        let mut r = Receiver::new(2, &[0, 1, 2], &VersionVector::default());
        let mut out = Vec::new();
        acks(&mut r);
        let ids: Vec<UpdateId> = (1..=5).map(|ms| update(0, 0, ms, 0, &[])).collect();
        for ms in 1..=5 {
            r.step(value(0, 0, ms), &mut out);
        }
        r.step(ship(0, ids[0].position(), vec![ids[1].clone()], 2), &mut out);
        assert!(applies(&mut out).is_empty(), "2 waits for 1");
        r.step(ship(0, Position::START, vec![ids[0].clone()], 1), &mut out);
        assert_eq!(applies(&mut out), vec![(0, 1), (0, 2)]);
        let ack = acks_at(&mut r, 10);
        assert!(!ack[0].resend && ack[0].received == Position::through(ts(2)));

        // 4 and 5 overtake 3, in two shipments that overlap (the second a
        // retransmission that covers 4 again).
        r.step(ship(0, ids[2].position(), vec![ids[3].clone()], 4), &mut out);
        r.step(ship(0, ids[2].position(), vec![ids[3].clone(), ids[4].clone()], 5), &mut out);
        assert_eq!(r.early(), 2, "one run: 4 once, and 5");
        // The leader ships again from what was acknowledged, overlapping
        // what is kept.
        r.step(ship(0, Position::through(ts(2)), ids[2..4].to_vec(), 4), &mut out);
        assert_eq!(applies(&mut out), vec![(0, 3), (0, 4), (0, 5)]);
        assert_eq!((r.waiting(), r.early(), r.in_flight()), (0, 0, 5));
        // Retransmissions of anything already here add nothing.
        r.step(ship(0, Position::START, ids.clone(), 5), &mut out);
        r.step(ship(0, ids[3].position(), vec![ids[4].clone()], 5), &mut out);
        assert!(applies(&mut out).is_empty());
        for ms in 1..=5 {
            r.step(applied(0, 0, ms), &mut out);
        }
        assert_eq!(r.applied().get(0), ts(5));
        assert!(!acks_at(&mut r, 100).iter().any(|a| a.resend));
    }

    /// Shipments kept ahead of a gap are bounded: past `EARLY_RUNS` runs,
    /// the ones furthest ahead are dropped and a resend asked for at once.
    #[test]
    fn shipments_kept_ahead_of_a_gap_are_bounded() {
        let mut r = Receiver::new(2, &[0, 1, 2], &VersionVector::default());
        let mut out = Vec::new();
        acks(&mut r);
        // Every other id, each after a gap: one run each.
        let n = EARLY_RUNS as u64 + 1;
        for i in 1..=n {
            let id = update(0, 0, 2 * i, 0, &[]);
            r.step(ship(0, Position::through(ts(2 * i - 1)), vec![id], 2 * i), &mut out);
        }
        assert_eq!(r.early(), EARLY_RUNS);
        let ack = acks(&mut r);
        assert!(ack[0].resend, "a shipment was dropped");
    }

    /// Idle once every update received is stable here and acknowledged as
    /// durable; a shipment or a value batch that only moves a stream's time
    /// leaves it idle, its acknowledgement due on the next tick.
    #[test]
    fn idle_once_what_came_is_applied_and_acknowledged_durable() {
        let mut r = Receiver::new(2, &[0, 1, 2], &VersionVector::default());
        let mut out = Vec::new();
        assert!(r.idle());
        r.step(value(0, 1, 5), &mut out);
        assert!(!r.idle(), "a value waits for its id");
        r.step(ship(0, Position::START, vec![update(0, 1, 5, 0, &[]), update(0, 0, 10, 0, &[])], 10), &mut out);
        assert_eq!(applies(&mut out), vec![(0, 5)]);
        assert!(!r.idle(), "10 waits for its value, 5 to be stable here");
        r.step(value(0, 0, 10), &mut out);
        r.step(applied(0, 1, 5), &mut out);
        r.step(applied(0, 0, 10), &mut out);
        assert_eq!(applies(&mut out), vec![(0, 10)]);
        assert_eq!(r.applied().get(0), ts(10));
        acks_at(&mut r, 5);
        assert!(!r.idle(), "applied, not durable: its origin keeps it");
        r.mark(1);
        r.synced(1);
        assert!(!r.idle(), "durable, not acknowledged as such");
        let ack = acks_at(&mut r, 10).into_iter().find(|a| a.origin == 0).unwrap();
        assert_eq!(ack.applied, Position::through(ts(10)));
        assert!(r.idle());
        // Site 0's stream and partition 0's values move on, without updates.
        r.step(ship(0, Position::through(ts(10)), vec![], 30), &mut out);
        let promise = Batch { partition: 0, prev: ts(10), items: vec![], up_to: ts(30) };
        r.step(ReceiverMsg::Values { origin: 0, batch: promise }, &mut out);
        assert_eq!(r.applied().get(0), ts(30));
        assert!(r.idle());
        assert!(acks_at(&mut r, 20).iter().any(|a| a.origin == 0 && a.received == Position::through(ts(30))));
        // A gap in the stream: not idle while it waits to be filled.
        r.step(ship(0, Position::through(ts(40)), vec![update(0, 0, 50, 0, &[])], 50), &mut out);
        assert!(!r.idle());
    }

    /// The eventual baseline: idle once every value handed out is stable
    /// here and acknowledged.
    #[test]
    fn the_eventual_baseline_is_idle_once_values_are_applied_and_acknowledged() {
        let mut r = Receiver::eventual(2, &[0, 1, 2], 1);
        let mut out = Vec::new();
        r.step(value(0, 0, 5), &mut out);
        assert_eq!(applies(&mut out), vec![(0, 5)]);
        assert!(!r.idle());
        r.step(applied(0, 0, 5), &mut out);
        assert!(!r.idle(), "stable, not acknowledged");
        r.tick(10, &mut out);
        assert!(r.idle());
    }

    #[test]
    fn a_restarted_receiver_resumes_from_the_applied_vector() {
        let applied_vv = VersionVector(smallvec::smallvec![ts(2), ts(0), ts(0)]);
        let mut r = Receiver::new(2, &[0, 1, 2], &applied_vv);
        let ack = acks(&mut r).into_iter().find(|a| a.origin == 0).unwrap();
        assert_eq!((ack.received, ack.applied), (Position::through(ts(2)), Position::through(ts(2))));
        let mut out = Vec::new();
        r.step(value(0, 0, 3), &mut out);
        let ids = vec![update(0, 0, 1, 0, &[]), update(0, 0, 2, 0, &[]), update(0, 0, 3, 0, &[])];
        r.step(ship(0, Position::START, ids, 3), &mut out);
        assert_eq!(applies(&mut out), vec![(0, 3)], "1 and 2 were applied before the restart");
    }

    /// A receiver that started anew (its site's leader changed) is shipped
    /// again ids its site applied before. The origin echoes how far the
    /// site acknowledged (`Ship::applied`), and a value the origin no longer
    /// sends (its stream went past it) means the site had applied it.
    #[test]
    fn a_new_receiver_resumes_from_what_its_site_applied_before() {
        let mut r = Receiver::new(2, &[0, 1, 2], &VersionVector::default());
        let mut out = Vec::new();
        let ids = vec![update(0, 0, 1, 0, &[]), update(0, 1, 2, 1, &[]), update(0, 0, 3, 2, &[]), update(0, 1, 4, 3, &[])];
        let echoed = ids[0].position();
        r.step(
            ReceiverMsg::Ship(Ship { origin: 0, to: 2, prev: Position::START, ids, through: Position::through(ts(4)), applied: echoed }),
            &mut out,
        );
        assert_eq!(r.applied().get(0), ts(2).just_before(), "the echoed point counts as applied");
        // Partition 1's value stream starts past 2 (dropped at the origin
        // once applied here); partition 0 still sends 3.
        r.step(
            ReceiverMsg::Values { origin: 0, batch: Batch { partition: 1, prev: Timestamp::ZERO, items: vec![], up_to: ts(2) } },
            &mut out,
        );
        r.step(value(0, 0, 3), &mut out);
        assert_eq!(applies(&mut out), vec![(0, 3)], "2 is skipped as applied before, 3 is handed out");
        assert_eq!(r.applied().get(0), ts(3).just_before());
        r.step(applied(0, 0, 3), &mut out);
        assert_eq!(r.waiting(), 1, "4 waits for its value: partition 1's stream has not passed it");
        r.step(value(0, 1, 4), &mut out);
        assert_eq!(applies(&mut out), vec![(0, 4)]);
    }
}
