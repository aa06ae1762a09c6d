//! The site stabilizer: Eunomia's answer to "in which order may this site's
//! updates be shown to other sites?" (Eunomia §3, Algorithms 3 and 4), as a
//! sans-I/O state machine like `node::Node`.
//!
//! # What it guarantees
//!
//! Every partition of a site timestamps its own updates with a hybrid clock,
//! never waiting for anyone (Alg. 2): an update's timestamp is larger than
//! everything its client had seen (Property 1) and than every earlier update
//! of the same partition (Property 2). Partitions report the *identifiers*
//! of their updates (never the values: §5, data and metadata are separated)
//! to the stabilizer, in timestamp order, plus promises ("heartbeats", Alg.
//! 2 lines 10-12) that no later update of theirs will carry a timestamp
//! at or below some time. The stabilizer's *stable time* is the minimum, over
//! partitions, of the latest timestamp each has reported or promised (Alg. 3
//! line 8): no update at or below it can still appear. Everything at or
//! below it is ordered by timestamp (ties between partitions broken by
//! partition id) and shipped to every other site. Timestamp order extends
//! causality (Property 1), so a remote site that applies the stream in order
//! never shows an effect before its cause from this site.
//!
//! The shipped stream is a pure function of the site's updates: the
//! `Position` (timestamp, partition) of an id says where it is in the
//! stream, and every replica of the stabilizer computes the same stream.
//! That is what makes the service fault tolerant cheaply (§3.3, Alg. 4):
//!
//! * Several replicas receive the same partition streams. A partition sends
//!   each replica everything that replica has not acknowledged (`IdBatch`,
//!   `IdsAck`, `Reporter`), so each replica holds a gap-free prefix of every
//!   partition (the paper's prefix property), whatever is lost or reordered.
//! * One replica, the leader, ships; the others only keep what some site has
//!   not applied yet. The leader is chosen from outside (`StabilizerMsg::
//!   Leader`, from the coordinator's Raft); a stale or duplicate leader is
//!   harmless, only wasteful (the paper's remark: uniqueness of the leader
//!   is an optimization, not needed for correctness).
//! * Each shipment says which stream position it continues from (`Ship::
//!   prev`) and up to which position it is complete (`Ship::through`). The
//!   receiving site takes only what extends what it already has and
//!   acknowledges, to every replica, how far it has *received* (drives
//!   retransmission) and how far it has *applied* (drives garbage
//!   collection; a restarted receiver resumes from there). A new leader
//!   resumes every destination from its acknowledged point. So a site never
//!   sees a gap or a duplicate, across leader changes, loss and reordering.
//!
//! # Which chain node reports: the tail
//!
//! In a site whose partitions are chains (ChainReaction), a partition's ids
//! and promises should come from the *tail* of its chain, not the head. A
//! head that crashes may have timestamped writes that never reached another
//! node; had it reported them, the stabilizer would ship ids whose value
//! exists nowhere, and every receiving site would wait for that value
//! forever, holding back every later update of this site. The tail reports
//! an update only once it is stable (on every replica of the chain), so it
//! survives R-1 failures, and the same tail can send the value to the
//! sibling partitions. Property 2 holds at the tail because it applies in
//! the head's order. The tail owns no clock, so the head puts its promise
//! into the chain stream (at the update-order position where it made it)
//! and the tail reports it once it has applied everything before it. After
//! a failure, the new tail resumes from each stabilizer replica's ack (every
//! chain node keeps its ids until the replicas acknowledged them, the acks
//! flowing up the chain like `StableUpTo`; replicas refuse gaps and ignore
//! duplicates), and a new head moves its clock past every timestamp and
//! promise it holds. The price is one chain traversal added to remote
//! visibility. A bonus: whatever a remote update depends on in this site
//! was stable here before it was shipped, so receivers need not check their
//! own site's entry of a vector.
//!
//! # Paper map
//!
//! | paper | here |
//! | --- | --- |
//! | Alg. 2 lines 8, 12 (send op, heartbeat) and §3.3's `Ack_n` | `Reporter` (`geo/reporter.rs`) |
//! | Alg. 3 `add_op`, `heartbeat`; Alg. 4 `new_batch` | `Stabilizer::step` with `StabilizerMsg::Ids` |
//! | Alg. 3/4 `process_stable`: stable time, `find_stable`, `process` | `Stabilizer::tick` (`merge`, `ship`) |
//! | Alg. 4 `new_leader` | `StabilizerMsg::Leader` |
//! | Alg. 4 `stable` (followers drop what the leader processed) | replaced: every replica drops what every site acknowledged as applied |
//! | `Ops`, the red-black tree of §6 | `OrderedIds` (`order.rs`): a FIFO per partition and a heap over their heads |
//!
//! # What is left out
//!
//! * A replica that restarts without its memory cannot rejoin as itself (its
//!   partitions no longer hold what it missed); it would need a state
//!   transfer from another replica. Replicas are crash-stop here.
//! * The set of partitions is fixed when the stabilizer is built; a site
//!   whose partition count changes needs a new stream.
//! * Nothing bounds the memory of ids kept for a site that stays cut off:
//!   they are kept until it applies them (that is how it catches up without
//!   a full copy). Ids not yet stable are bounded (`MAX_UNSTABLE`: past it,
//!   partitions ahead of the stable time are refused and back off).
//! * Every replica merges (orders) what became stable, not only the leader,
//!   so that a new leader is ready at once; followers pay the merge but
//!   never ship.

mod order;

pub use order::OrderedIds;

use crate::geo::reporter::{Reporter, Resend, Stamped};
use crate::hlc::Timestamp;
pub use crate::message::geo::{IdBatch, IdVector, IdsAck, Position, ReplicaId, Ship, SiteAck, UpdateId};
use crate::ring::PartitionId;
use crate::version::SiteId;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};

/// At most this many ids in one `Ship`.
pub const MAX_SHIP: usize = 4096;

/// At most this many ids shipped to one site and not yet acknowledged as
/// received: a site that is cut off is not sent the whole backlog over and
/// over.
pub const SHIP_WINDOW: usize = 65_536;

/// At most this many ids reported and not yet stable are held: past it, a
/// partition ahead of the stable time has its batches with ids refused
/// (acknowledged where it was, so its reporter backs off and resends) until
/// the partitions holding the stable time back catch up. Their batches,
/// and promises alone, are always taken, so the stable time always moves.
/// Bounds a stabilizer's memory when one partition straggles or ids come
/// faster than they become stable.
pub const MAX_UNSTABLE: usize = 1 << 20;

/// A leader that has heard no progress from a site for this long ships again
/// from the site's acknowledged point (the shipment or the ack was lost).
pub const SHIP_RESEND_MS: u64 = 500;

impl Stamped for UpdateId {
    fn ts(&self) -> Timestamp {
        self.ts
    }
}

impl IdsAck {
    /// Hands this acknowledgement to the partition's reporter.
    pub fn deliver(self, reporter: &mut Reporter<ReplicaId, UpdateId>, now_ms: u64) {
        reporter.on_ack(self.replica, self.up_to, Timestamp::ZERO, self.resend, now_ms);
        reporter.forget_through(self.applied.min(self.up_to));
    }
}

/// What a stabilizer replica is told.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StabilizerMsg {
    /// From a partition of this site.
    Ids(IdBatch),
    /// From another site's receiver.
    SiteAck(SiteAck),
    /// From the coordinator: `leader` ships from now on. Ignored if `term`
    /// is older than one already heard.
    Leader { leader: ReplicaId, term: u64 },
}

/// What a stabilizer replica sends.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StabilizerOut {
    /// To the reporting node of `ack.partition`.
    IdsAck(IdsAck),
    /// To the receiver of `ship.to`.
    Ship(Ship),
}

/// What this replica knows of one other site.
#[derive(Clone, Copy, Debug)]
struct Destination {
    /// Acknowledged as received, as applied durably, and as applied.
    received: Position,
    applied: Position,
    visible: Position,
    /// Shipped up to here (by this replica, while leader).
    sent: Position,
    /// When to ship again from `received`.
    resend: Resend,
}

/// One replica of a site's stabilizer (Eunomia Alg. 4, replica `e_f`).
#[derive(Debug)]
pub struct Stabilizer {
    site: SiteId,
    me: ReplicaId,
    leader: Option<ReplicaId>,
    term: u64,
    /// `PartitionTime_f`: per partition, the latest timestamp reported or
    /// promised.
    partition_time: Vec<Timestamp>,
    /// `Ops_f`: reported and not yet stable (at most `max_unstable`, but
    /// for what lagging partitions bring).
    ops: OrderedIds,
    max_unstable: usize,
    /// Stable ids in stream order, from the first one some site has not
    /// applied.
    log: VecDeque<UpdateId>,
    /// The stream is complete in `log` up to here (the stable time).
    log_end: Position,
    dests: BTreeMap<SiteId, Destination>,
}

impl Stabilizer {
    /// Replica `me` of site `site`'s stabilizer, for partitions
    /// `0..partitions`, shipping to every site of `sites` but its own.
    pub fn new(site: SiteId, me: ReplicaId, partitions: u32, sites: &[SiteId]) -> Stabilizer {
        let dest = Destination {
            received: Position::START,
            applied: Position::START,
            visible: Position::START,
            sent: Position::START,
            resend: Resend::default(),
        };
        Stabilizer {
            site,
            me,
            leader: None,
            term: 0,
            partition_time: vec![Timestamp::ZERO; partitions as usize],
            ops: OrderedIds::new(partitions),
            max_unstable: MAX_UNSTABLE,
            log: VecDeque::new(),
            log_end: Position::START,
            dests: sites.iter().filter(|&&s| s != site).map(|&s| (s, dest)).collect(),
        }
    }

    pub fn step(&mut self, msg: StabilizerMsg, now_ms: u64, out: &mut Vec<StabilizerOut>) {
        match msg {
            StabilizerMsg::Ids(batch) => self.new_batch(batch, out),
            StabilizerMsg::SiteAck(ack) => self.site_ack(ack, now_ms),
            StabilizerMsg::Leader { leader, term } => self.new_leader(leader, term, now_ms),
        }
    }

    /// Eunomia's `process_stable` (every θ, about a millisecond): take what
    /// became stable into the log, drop what every site applied, and, on the
    /// leader, ship.
    pub fn tick(&mut self, now_ms: u64, out: &mut Vec<StabilizerOut>) {
        self.merge();
        self.collect_garbage();
        if self.is_leader() {
            self.ship(now_ms, out);
        }
    }

    /// The stable time (Alg. 3 line 8): the minimum over partitions of the
    /// latest timestamp each reported or promised.
    pub fn stable_time(&self) -> Timestamp {
        self.partition_time.iter().copied().min().unwrap_or(Timestamp::ZERO)
    }

    /// Ids wait to become stable: the newest time some partition reported
    /// or promised, which every partition must promise past for all of
    /// them to ship (`None`: nothing waits).
    pub fn waiting_for(&self) -> Option<Timestamp> {
        (!self.ops.is_empty()).then(|| self.partition_time.iter().copied().max().unwrap_or(Timestamp::ZERO))
    }

    pub fn is_leader(&self) -> bool {
        self.leader == Some(self.me)
    }

    /// Ids held: reported and not stable, or stable and not applied by
    /// every other site.
    pub fn held(&self) -> usize {
        self.ops.len() + self.log.len()
    }

    /// Whether nothing here waits on time (`geo::Geo::idle`): no id waits
    /// to become stable, and every site acknowledged every stable id as
    /// applied (so no shipment is left to repeat). A stable time that moved
    /// since it was last shipped does not count: it goes with the next
    /// tick, however late.
    pub fn idle(&self) -> bool {
        self.ops.is_empty() && self.log.is_empty()
    }

    /// What site `site` acknowledged: (received, applied durably).
    pub fn acked(&self, site: SiteId) -> Option<(Position, Position)> {
        self.dests.get(&site).map(|d| (d.received, d.applied))
    }

    /// How far site `site` has applied this site's stream (stable in its
    /// chains, maybe not on its disks yet): what its readers can see.
    pub fn seen(&self, site: SiteId) -> Option<Position> {
        self.dests.get(&site).map(|d| d.visible)
    }

    /// Eunomia Alg. 4 `new_batch`: take the ids not seen yet, in order, and
    /// acknowledge how far this replica holds the partition's stream. A batch
    /// that does not continue what is held (a retransmission overtaken, or a
    /// partition that lost track) is refused so the partition resends; so is
    /// one of a partition ahead of the stable time while `MAX_UNSTABLE` ids
    /// wait to become stable (acknowledged where it was: it backs off).
    fn new_batch(&mut self, batch: IdBatch, out: &mut Vec<StabilizerOut>) {
        let stable = self.stable_time();
        let full = self.ops.len() >= self.max_unstable && !batch.items.is_empty();
        let Some(time) = self.partition_time.get_mut(batch.partition as usize) else { return };
        let resend = batch.prev > *time;
        // Full: only a partition holding the stable time back gets in.
        let refused = resend || (full && *time > stable);
        if !refused {
            for id in batch.items {
                if id.ts > *time {
                    *time = id.ts;
                    self.ops.push(id);
                }
            }
            *time = (*time).max(batch.up_to);
        }
        let up_to = *time;
        let applied = self.applied_everywhere(batch.partition).unwrap_or(up_to);
        out.push(StabilizerOut::IdsAck(IdsAck { replica: self.me, partition: batch.partition, up_to, applied, resend }));
    }

    /// How far every other site has applied `partition`'s updates (`None`
    /// without other sites).
    fn applied_everywhere(&self, partition: PartitionId) -> Option<Timestamp> {
        let of_partition = |pos: Position| if pos.partition >= partition { pos.ts } else { pos.ts.just_before() };
        self.dests.values().map(|d| of_partition(d.applied)).min()
    }

    fn site_ack(&mut self, ack: SiteAck, now_ms: u64) {
        if ack.origin != self.site {
            return;
        }
        let Some(dest) = self.dests.get_mut(&ack.from) else { return };
        if ack.received > dest.received {
            dest.received = ack.received;
            dest.resend.progress(now_ms);
        }
        dest.applied = dest.applied.max(ack.applied);
        dest.visible = dest.visible.max(ack.visible).max(ack.applied);
        if ack.resend {
            // The site saw a gap: go back to what it holds (further back
            // than before if its receiver started anew).
            dest.received = ack.received;
            dest.sent = ack.received;
            dest.resend.progress(now_ms);
        }
    }

    /// Eunomia Alg. 4 `new_leader`. A replica that becomes leader resumes
    /// every site from what it acknowledged as received.
    fn new_leader(&mut self, leader: ReplicaId, term: u64, now_ms: u64) {
        if term < self.term {
            return;
        }
        let was_leader = self.is_leader();
        self.term = term;
        self.leader = Some(leader);
        if self.is_leader() && !was_leader {
            for dest in self.dests.values_mut() {
                dest.sent = dest.received;
                dest.resend.progress(now_ms);
            }
        }
    }

    /// Alg. 3 lines 8-9: everything at or below the stable time joins the log,
    /// in stream order. Every replica does this, so a follower that becomes
    /// leader has its log ready.
    fn merge(&mut self) {
        let stable = self.stable_time();
        if Position::through(stable) > self.log_end {
            self.ops.take_through(stable, &mut self.log);
            self.log_end = Position::through(stable);
        }
    }

    /// Drops what every other site has applied: no leader will need it again.
    fn collect_garbage(&mut self) {
        let applied = self.dests.values().map(|d| d.applied).min().unwrap_or(self.log_end);
        while self.log.front().is_some_and(|id| id.position() <= applied) {
            self.log.pop_front();
        }
        if applied > self.log_end {
            // A site is ahead of this replica (it heard another leader).
            self.ops.discard_through(applied);
        }
    }

    /// Alg. 3 line 10 `process`: ship each site the next part of the stream,
    /// from where it is, at most `SHIP_WINDOW` ids beyond what it
    /// acknowledged. Shipping again from the acknowledged point after
    /// `SHIP_RESEND_MS` without progress repairs lost shipments and acks. A
    /// shipment without ids still goes out when the stable time moved: it
    /// lets the site's vector follow this site's clock while nobody writes
    /// (one small message per site per tick).
    fn ship(&mut self, now_ms: u64, out: &mut Vec<StabilizerOut>) {
        for (&site, dest) in self.dests.iter_mut() {
            dest.resend.resume(&mut dest.sent, dest.received, now_ms, SHIP_RESEND_MS);
            let start = self.log.partition_point(|id| id.position() <= dest.sent);
            let acked = self.log.partition_point(|id| id.position() <= dest.received);
            let room = SHIP_WINDOW.saturating_sub(start - acked).min(MAX_SHIP);
            let end = (start + room).min(self.log.len());
            let through = if end == self.log.len() {
                self.log_end
            } else if end > start {
                self.log[end - 1].position()
            } else {
                continue; // the window is full
            };
            if end == start && through <= dest.sent {
                continue;
            }
            let ids = self.log.range(start..end).cloned().collect();
            out.push(StabilizerOut::Ship(Ship { origin: self.site, to: site, prev: dest.sent, ids, through, applied: dest.applied }));
            dest.sent = dest.sent.max(through);
        }
    }
}

#[cfg(test)]
mod tests;
