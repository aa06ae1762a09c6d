//! Expired and deleted keys leave no trace: the head expires keys actively,
//! and every replica collects tombstones once nothing can still need them.
//!
//! *Active expiry.* A key's expiry is an instant in its version, and every
//! reader already treats an expired value as absent (by its own clock).
//! The head decides when the key is gone for good, as Redis's primary
//! sends a DEL: from its queue of keys with an expiry, soonest first, it
//! turns each expired version into a tombstone *of the same version*
//! (`Update::expired`), an update that goes down the chain like any write,
//! so every replica drops the value at the same point of the update order.
//! Keeping the version means the tombstone beats exactly what the expired
//! version beat and loses to any later write, wherever written; each site
//! expires its own copies, so other sites never get these.
//!
//! *Collection.* A tombstone (a DEL's, or an expiry's) stays while a write
//! it must win against could still arrive. Inside a site, once it is stable
//! (every replica of its chain has it) every later write to the key is
//! ordered after it. With several sites, a concurrent older write of
//! another site could still come, until this site has applied every other
//! site's writes up to the tombstone's time (the stabilizers' site time,
//! `Node::tick` passes its minimum). Then the entry is removed; a snapshot
//! older than the latest collected tombstone is refused as too old
//! (`store::PartitionStore::collect`).

use super::*;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// At most this many keys expired per partition per tick: a mass expiry is
/// spread over a few ticks rather than stalling the node.
const EXPIRE_PER_TICK: usize = 10_000;

/// What a replica keeps to reclaim keys.
#[derive(Debug, Default)]
pub struct Reclaim {
    /// At the head: keys with an expiry, soonest first. Built from the
    /// store when the replica becomes head, dropped when it stops.
    pub(super) due: Option<BinaryHeap<Reverse<(u64, Bytes)>>>,
    /// Tombstones applied here, in update order: (seq, version time, key).
    graves: VecDeque<(u64, Timestamp, Bytes)>,
    /// Keys this replica expired as head (INFO `expired_keys`).
    pub(super) expired: u64,
}

impl ChainReplica {
    /// Notes what an applied update leaves to reclaim: a key that will
    /// expire (at the head), a tombstone.
    pub(super) fn note_reclaim(&mut self, u: &Update) {
        if u.value.is_none() {
            self.reclaim.graves.push_back((u.seq, u.version.ts, u.key.clone()));
        }
        if let (Some(due), Some(at)) = (&mut self.reclaim.due, u.expires_at_ms) {
            due.push(Reverse((at, u.key.clone())));
        }
    }

    /// Whether this replica orders writes now: a head serving, not joining
    /// or catching up.
    pub(super) fn heads_now(&self) -> bool {
        self.index == 0 && !self.joining && !self.catching_up && self.epoch != 0
    }

    /// At the head, the keys with an expiry, soonest first (built from the
    /// store on first use).
    pub(super) fn due(&mut self) -> &mut BinaryHeap<Reverse<(u64, Bytes)>> {
        let store = &self.store;
        self.reclaim.due.get_or_insert_with(|| store.expiring().map(|(at, key)| Reverse((at, Bytes::copy_from_slice(key)))).collect())
    }

    /// At the head: turns the versions whose expiry has passed into
    /// tombstones (see the module doc).
    pub(super) fn expire(&mut self, now_ms: u64, out: &mut Outbox) {
        if !self.heads_now() {
            self.reclaim.due = None;
            return;
        }
        let mut expired = Vec::new();
        self.due();
        let due = self.reclaim.due.as_mut().expect("built above");
        while expired.len() < EXPIRE_PER_TICK && due.peek().is_some_and(|Reverse((at, _))| *at <= now_ms) {
            let Reverse((at, key)) = due.pop().expect("peeked");
            // Still that version, and still with a value: rewritten or
            // deleted since, it is someone else's business.
            let Some(v) = self.store.latest(&key).filter(|v| v.expires_at_ms() == Some(at) && !v.is_tombstone()) else {
                continue;
            };
            expired.push((key, v.version()));
        }
        self.reclaim.expired += expired.len() as u64;
        self.tombstone(expired, now_ms, out);
    }

    /// At the head: turns each of these versions into a tombstone of the
    /// same version, down the chain (expiry, eviction).
    pub(super) fn tombstone(&mut self, versions: Vec<(Bytes, Version)>, now_ms: u64, out: &mut Outbox) {
        if versions.is_empty() {
            return;
        }
        let mut forward = Vec::with_capacity(versions.len());
        for (key, version) in versions {
            let update = Update {
                seq: self.applied + 1,
                key,
                version,
                value: None,
                expires_at_ms: None,
                ack: None,
                local_dep: Timestamp::ZERO,
                expired: true,
            };
            self.apply(update, now_ms, &mut forward, out);
        }
        self.flush(forward, now_ms, out);
        self.log_applied();
    }

    /// Removes the tombstones nothing can need any more: stable here, and,
    /// with several sites, older than `floor` (what this site has applied
    /// of every other site; `None` with one site). The tombstones of keys
    /// to `keep` stay in the store (after a failover of a disaster-recovery
    /// backup, a deleted key the primary wrote last: without its tombstone
    /// it would read as never written since, and be refused again).
    pub(super) fn collect_tombstones(&mut self, floor: Option<Timestamp>, keep: &dyn Fn(&[u8]) -> bool) {
        while let Some((seq, ts, _)) = self.reclaim.graves.front() {
            if *seq > self.stable || floor.is_some_and(|f| *ts > f) {
                break;
            }
            let (seq, ts, key) = self.reclaim.graves.pop_front().expect("looked at");
            if keep(&key) {
                continue;
            }
            if !self.store.collect(&key, seq) {
                // Versions before it are kept for snapshots a while yet.
                self.reclaim.graves.push_front((seq, ts, key));
                break;
            }
        }
        crate::shrink_idle(&mut self.reclaim.graves);
    }

    /// A state was installed: its tombstones are to collect, and the head's
    /// queue of expiries is built anew.
    pub(super) fn reclaim_installed(&mut self) {
        let mut graves: Vec<(u64, Timestamp, Bytes)> =
            self.store.tombstones().map(|(seq, ts, key)| (seq, ts, Bytes::copy_from_slice(key))).collect();
        graves.sort_unstable_by_key(|g| g.0);
        self.reclaim.graves = graves.into();
        self.reclaim.due = None;
    }

    /// Tombstones held, not collected yet.
    pub fn tombstones(&self) -> usize {
        self.reclaim.graves.len()
    }

    /// Keys this replica expired as head.
    pub fn expired_keys(&self) -> u64 {
        self.reclaim.expired
    }
}
