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

/// A parked write is dropped after this long.
const PARK_MS: u64 = 10_000;
/// At most this many writes wait at once; past it they are refused.
const MAX_PARKED: usize = 100_000;

/// A write waiting for its dependencies.
#[derive(Debug)]
struct Parked {
    partition: PartitionId,
    req: PutRequest,
    deps: Vec<WriteDep>,
    since_ms: u64,
}

/// The writes parked at this node's heads.
#[derive(Debug, Default)]
pub(super) struct Waiting {
    puts: AHashMap<(ClientId, u64), Parked>,
    /// Writes parked so far (INFO).
    pub(super) parked: u64,
    /// For each partition, the writes waiting on it (entries of writes
    /// ordered or dropped since are skipped when looked at).
    on: AHashMap<PartitionId, Vec<(ClientId, u64)>>,
}

impl Waiting {
    pub(super) fn is_empty(&self) -> bool {
        self.puts.is_empty()
    }

    /// Whether writes wait on `partition`.
    pub(super) fn on(&self, partition: PartitionId) -> bool {
        !self.on.is_empty() && self.on.contains_key(&partition)
    }
}

/// Where a dependency stands at this node.
enum Dep {
    /// In: the new write's timestamp must be above this one.
    Ready(Timestamp),
    Wait,
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
        if known || deps.is_empty() {
            // Not the head (the replica refuses), a resend or a late copy
            // of a write it has (the replica answers or drops it), or
            // nothing to wait for.
            return self.order(partition, req, Timestamp::ZERO, now_ms, out);
        }
        match self.readiness(req.op.client, &deps) {
            Some(Dep::Ready(floor)) => self.order(partition, req, floor, now_ms, out),
            Some(Dep::Elsewhere) => self.not_responsible(req.op, out),
            _ if self.waiting.puts.len() >= MAX_PARKED => self.not_responsible(req.op, out),
            _ => {
                let id = (req.op.client, req.write);
                for dep in &deps {
                    self.waiting.on.entry(dep.partition).or_default().push(id);
                }
                self.waiting.parked += 1;
                self.waiting.puts.insert(id, Parked { partition, req, deps, since_ms: now_ms });
            }
        }
    }

    /// Whether every dependency is in (`Ready` with the highest timestamp
    /// to order after), one is not yet, or one is not this node's.
    fn readiness(&self, client: ClientId, deps: &[WriteDep]) -> Option<Dep> {
        let mut floor = Timestamp::ZERO;
        for dep in deps {
            match self.dependency(client, dep) {
                Dep::Ready(ts) => floor = floor.max(ts),
                other => return Some(other),
            }
        }
        Some(Dep::Ready(floor))
    }

    fn dependency(&self, client: ClientId, dep: &WriteDep) -> Dep {
        let Some(r) = self.parts.get(dep.partition as usize).and_then(Option::as_ref) else {
            return Dep::Elsewhere;
        };
        if r.is_joining() {
            return Dep::Wait;
        }
        let done = |seq: u64| (dep.same_key && r.applied() >= seq) || r.stable() >= seq;
        match dep.on {
            DepOn::Seq(seq) if done(seq) => Dep::Ready(Timestamp::ZERO),
            DepOn::Write(w) => match r.written(client, w) {
                Some(last) if done(last.seq) => Dep::Ready(last.version.ts),
                _ => Dep::Wait,
            },
            DepOn::Seq(_) => Dep::Wait,
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

    /// Orders the parked writes that waited on `partitions` and are ready
    /// now.
    pub(super) fn wake_puts(&mut self, partitions: &[PartitionId], now_ms: u64, out: &mut Outbox) {
        for p in partitions {
            let Some(ids) = self.waiting.on.remove(p) else { continue };
            let mut still = Vec::new();
            for id in ids {
                let Some(parked) = self.waiting.puts.get(&id) else { continue };
                // A write waiting on several partitions is listed under each.
                if !parked.deps.iter().any(|d| d.partition == *p) {
                    continue;
                }
                match self.readiness(id.0, &parked.deps) {
                    Some(Dep::Ready(floor)) => {
                        let parked = self.waiting.puts.remove(&id).expect("looked up above");
                        self.order(parked.partition, parked.req, floor, now_ms, out);
                    }
                    Some(Dep::Elsewhere) => {
                        let parked = self.waiting.puts.remove(&id).expect("looked up above");
                        self.not_responsible(parked.req.op, out);
                    }
                    _ => still.push(id),
                }
            }
            if !still.is_empty() {
                self.waiting.on.entry(*p).or_default().extend(still);
            }
        }
    }

    /// Drops writes parked for longer than `PARK_MS`.
    pub(super) fn expire_puts(&mut self, now_ms: u64) {
        if self.waiting.puts.is_empty() {
            return;
        }
        self.waiting.puts.retain(|_, p| now_ms.saturating_sub(p.since_ms) < PARK_MS);
        let puts = &self.waiting.puts;
        self.waiting.on.retain(|_, ids| {
            ids.retain(|id| puts.contains_key(id));
            !ids.is_empty()
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
