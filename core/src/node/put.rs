//! A client write at its head: ordered at once, or parked until what it
//! depends on is in.
//!
//! ChainReaction's dependency stabilization (§3.3.1) makes a write wait
//! until every version its session saw or wrote since its last write is
//! stable (has reached its tail), so that a reader of the new write who
//! then reads one of those keys anywhere in its chain finds that version or
//! a newer one. The paper's proxy waits before it sends the write; then a
//! session's writes cannot overlap, and a pipeline of writes pays a
//! stability round trip per write. Here the write carries its dependencies
//! (`Message::Put::deps`) and its head waits, looking at its own node's
//! replicas of the partitions concerned (the driver sends a dependency
//! only to a head whose node holds a replica of its partition, and waits
//! itself otherwise). A pipelined write names the session's previous write
//! by its id, since it may not be acknowledged yet: the head waits until
//! its node's replica of that partition has applied it (`chain::writes`)
//! and it is stable there, or, for the same key, just applied (the new
//! version supersedes it). Its timestamp is then ordered after the
//! previous write's (`Version`s must follow causality for get-transactions
//! and other sites), which the head reads off that replica too.
//!
//! A parked write is refused when the configuration changes (its client
//! refreshes and sends it again), replaced when its session resends it
//! (maybe with other dependencies: a write before it failed), and dropped
//! after `PARK_MS` (its client has given up on it by then).

use super::*;
use crate::message::{ClientId, DepOn, WriteDep};
use ahash::AHashMap;
use std::cmp::Reverse;
use std::collections::binary_heap::{BinaryHeap, PeekMut};

/// A parked write is dropped after this long.
const PARK_MS: u64 = 10_000;
/// At most this many writes wait at once; past it they are refused.
const MAX_PARKED: usize = 100_000;

/// A write's session and id in it.
type Id = (ClientId, u64);

/// A write waiting for its dependencies.
#[derive(Debug)]
struct Parked {
    partition: PartitionId,
    req: PutRequest,
    deps: Vec<WriteDep>,
    since_ms: u64,
    /// Which of the entries that name it in `Waiting::on` is current (a
    /// resend replaces the write and indexes it again).
    ticket: u64,
}

/// The writes parked at this node's heads, each listed once, under the
/// first dependency it still waits for and what would let it go: a
/// change looks only at the writes it may let go, so a deep pipeline
/// costs nothing per message.
#[derive(Debug, Default)]
pub(super) struct Waiting {
    puts: AHashMap<Id, Parked>,
    /// Writes parked so far (INFO).
    pub(super) parked: u64,
    tickets: u64,
    /// By the partition of the dependency they wait for. An entry stays
    /// when it empties (at most one per partition), its heaps ready for
    /// the next write that waits there.
    on: AHashMap<PartitionId, Waiters>,
    /// `wake_puts`'s list of the writes to look at again, kept empty.
    due: Vec<(Id, u64)>,
}

/// The parked writes waiting on one partition of this node, by what they
/// need of its replica here (entries whose ticket is not their write's
/// are stale: skipped).
#[derive(Debug, Default)]
struct Waiters {
    /// Its `stable` watermark to reach a sequence number.
    stable: BinaryHeap<Reverse<(u64, Id, u64)>>,
    /// Its `applied` watermark to reach one (the same key).
    applied: BinaryHeap<Reverse<(u64, Id, u64)>>,
    /// A session's write to be applied (`ChainReplica::watch_write`).
    written: AHashMap<Id, smallvec::SmallVec<[(Id, u64); 1]>>,
    /// The replica to finish joining.
    joining: Vec<(Id, u64)>,
}

impl Waiters {
    fn is_empty(&self) -> bool {
        self.stable.is_empty() && self.applied.is_empty() && self.written.is_empty() && self.joining.is_empty()
    }
}

impl Waiting {
    pub(super) fn is_empty(&self) -> bool {
        self.puts.is_empty()
    }

    /// Whether writes wait on `partition`.
    pub(super) fn on(&self, partition: PartitionId) -> bool {
        !self.on.is_empty() && self.on.get(&partition).is_some_and(|w| !w.is_empty())
    }
}

/// What a parked write needs of this node's replica of a partition.
enum Need {
    Stable(u64),
    Applied(u64),
    Written(ClientId, u64),
    Joining,
}

/// Where a write's dependencies stand at this node.
enum Dep {
    /// All in: the new write's timestamp must be above this one.
    Ready(Timestamp),
    /// The first one not in yet.
    Wait(PartitionId, Need),
    /// This node holds no replica of its partition: the client's map is
    /// not this node's.
    Elsewhere,
}

impl Node {
    /// Client writes that had to wait at a head here for what they depend
    /// on, so far, and how many wait now.
    pub fn parked_writes(&self) -> (u64, usize) {
        (self.waiting.parked, self.waiting.puts.len())
    }

    /// A client write for `partition`, with what it depends on.
    pub(super) fn client_put(&mut self, partition: PartitionId, req: PutRequest, deps: Vec<WriteDep>, now_ms: u64, out: &mut Outbox) {
        let known = self
            .parts
            .get(partition as usize)
            .and_then(Option::as_ref)
            .is_some_and(|r| !r.is_head() || r.written(req.op.client, req.write).is_some() || r.finished(req.op.client, req.write));
        if !known && (req.change.new_value().is_some() || req.change.value.is_computed()) && self.refuses_growth(now_ms) {
            // Over the memory budget (`memory`): like Redis, writes that add
            // data are refused, deletes go.
            let reason = self.refusal();
            return send(out, Dest::Client(req.op.client), Message::Refused { op: req.op, reason });
        }
        if known || deps.is_empty() {
            // Not the head (the replica refuses), a resend or a late copy
            // of a write it has (the replica answers or drops it), or
            // nothing to wait for.
            return self.order(partition, req, Timestamp::ZERO, now_ms, out);
        }
        match self.readiness(req.op.client, &deps) {
            Dep::Ready(floor) => self.order(partition, req, floor, now_ms, out),
            Dep::Elsewhere => self.not_responsible(req.op, out),
            _ if self.waiting.puts.len() >= MAX_PARKED => self.not_responsible(req.op, out),
            Dep::Wait(on, need) => {
                let id = (req.op.client, req.write);
                self.waiting.parked += 1;
                self.waiting.tickets += 1;
                let ticket = self.waiting.tickets;
                self.waiting.puts.insert(id, Parked { partition, req, deps, since_ms: now_ms, ticket });
                self.index(id, ticket, on, need, now_ms);
            }
        }
    }

    /// Lists a parked write under what it waits for.
    fn index(&mut self, id: Id, ticket: u64, partition: PartitionId, need: Need, now_ms: u64) {
        let w = self.waiting.on.entry(partition).or_default();
        match need {
            Need::Stable(seq) => w.stable.push(Reverse((seq, id, ticket))),
            Need::Applied(seq) => w.applied.push(Reverse((seq, id, ticket))),
            Need::Joining => w.joining.push((id, ticket)),
            Need::Written(client, write) => {
                w.written.entry((client, write)).or_default().push((id, ticket));
                if let Some(r) = self.parts.get_mut(partition as usize).and_then(Option::as_mut) {
                    r.watch_write(client, write, now_ms);
                }
            }
        }
    }

    /// Whether every dependency is in (`Ready` with the highest timestamp
    /// to order after), which one is not yet, or whether one is not this
    /// node's.
    fn readiness(&self, client: ClientId, deps: &[WriteDep]) -> Dep {
        let mut floor = Timestamp::ZERO;
        for dep in deps {
            match self.dependency(client, dep) {
                Dep::Ready(ts) => floor = floor.max(ts),
                other => return other,
            }
        }
        Dep::Ready(floor)
    }

    fn dependency(&self, client: ClientId, dep: &WriteDep) -> Dep {
        let Some(r) = self.parts.get(dep.partition as usize).and_then(Option::as_ref) else {
            return Dep::Elsewhere;
        };
        let wait = |need| Dep::Wait(dep.partition, need);
        if r.is_joining() {
            return wait(Need::Joining);
        }
        let done = |seq: u64| (dep.same_key && r.applied() >= seq) || r.stable() >= seq;
        let need = |seq| wait(if dep.same_key { Need::Applied(seq) } else { Need::Stable(seq) });
        match dep.on {
            DepOn::Seq(seq) if done(seq) => Dep::Ready(Timestamp::ZERO),
            DepOn::Seq(seq) => need(seq),
            DepOn::Write(w) => match r.written(client, w) {
                Some(last) if done(last.seq) => Dep::Ready(last.version.ts),
                Some(last) => need(last.seq),
                None => wait(Need::Written(client, w)),
            },
        }
    }

    /// Orders a write whose dependencies are in, after `floor`.
    fn order(&mut self, partition: PartitionId, mut req: PutRequest, floor: Timestamp, now_ms: u64, out: &mut Outbox) {
        let site = self.id.site;
        if floor > req.past.get(site) {
            req.past.set(site, floor);
        }
        // Only a head's writes wait for a number (others are refused by the
        // replica, as always, in `put`).
        let head = self.parts.get(partition as usize).and_then(Option::as_ref).is_some_and(ChainReplica::is_head);
        let req = match &mut self.geo {
            Some(geo) if head => geo.sequence(partition, req, now_ms, out),
            _ => Some(req),
        };
        if let Some(req) = req {
            self.put(partition, req, now_ms, out);
        }
    }

    /// Orders the parked writes that waited on partition `p` and are
    /// ready now.
    pub(super) fn wake_puts(&mut self, p: PartitionId, now_ms: u64, out: &mut Outbox) {
        let Some(w) = self.waiting.on.get_mut(&p) else { return };
        // A buffer kept between calls (`recheck` never comes back here).
        let mut due = std::mem::take(&mut self.waiting.due);
        match self.parts.get_mut(p as usize).and_then(Option::as_mut) {
            Some(r) => {
                let (stable, applied) = (r.stable(), r.applied());
                while let Some(Reverse((_, id, ticket))) = w.stable.peek_mut().filter(|e| e.0 .0 <= stable).map(PeekMut::pop) {
                    due.push((id, ticket));
                }
                while let Some(Reverse((_, id, ticket))) = w.applied.peek_mut().filter(|e| e.0 .0 <= applied).map(PeekMut::pop) {
                    due.push((id, ticket));
                }
                for write in r.seen_writes() {
                    due.extend(w.written.remove(&write).into_iter().flatten());
                }
                if !r.is_joining() {
                    due.append(&mut w.joining);
                }
            }
            // The replica is gone: each finds out where it stands.
            None => {
                let w = std::mem::take(w);
                due.extend(w.stable.into_iter().chain(w.applied).map(|Reverse((_, id, t))| (id, t)));
                due.extend(w.written.into_values().flatten().chain(w.joining));
            }
        }
        for &(id, ticket) in &due {
            self.recheck(id, ticket, now_ms, out);
        }
        due.clear();
        self.waiting.due = due;
    }

    /// A parked write whose dependency came in: ordered, refused, or
    /// listed under the next one it waits for.
    fn recheck(&mut self, id: Id, ticket: u64, now_ms: u64, out: &mut Outbox) {
        let Some(parked) = self.waiting.puts.get(&id).filter(|p| p.ticket == ticket) else { return };
        match self.readiness(id.0, &parked.deps) {
            Dep::Ready(floor) => {
                let parked = self.waiting.puts.remove(&id).expect("looked up above");
                self.order(parked.partition, parked.req, floor, now_ms, out);
            }
            Dep::Elsewhere => {
                let parked = self.waiting.puts.remove(&id).expect("looked up above");
                self.not_responsible(parked.req.op, out);
            }
            Dep::Wait(on, need) => self.index(id, ticket, on, need, now_ms),
        }
    }

    /// Drops writes parked for longer than `PARK_MS` (and the entries
    /// that name them).
    pub(super) fn expire_puts(&mut self, now_ms: u64) {
        let before = self.waiting.puts.len();
        if before == 0 {
            return;
        }
        self.waiting.puts.retain(|_, p| now_ms.saturating_sub(p.since_ms) < PARK_MS);
        if self.waiting.puts.len() == before {
            return;
        }
        let puts = &self.waiting.puts;
        let live = |id: &Id, ticket: &u64| puts.get(id).is_some_and(|p| p.ticket == *ticket);
        self.waiting.on.retain(|_, w| {
            w.stable.retain(|Reverse((_, id, t))| live(id, t));
            w.applied.retain(|Reverse((_, id, t))| live(id, t));
            w.written.retain(|_, ids| {
                ids.retain(|(id, t)| live(id, t));
                !ids.is_empty()
            });
            w.joining.retain(|(id, t)| live(id, t));
            !w.is_empty()
        });
    }

    /// The configuration changed: every parked write is refused, and its
    /// client sends it again on the new one.
    pub(super) fn refuse_parked_puts(&mut self, out: &mut Outbox) {
        self.waiting.on.clear();
        for (_, parked) in std::mem::take(&mut self.waiting.puts) {
            self.not_responsible(parked.req.op, out);
        }
    }
}
