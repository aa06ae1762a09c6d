//! The chain's part in geo-replication: what the tail reports to the
//! stabilizer and other sites, promises down the chain (Eunomia Alg. 2), and
//! other sites' writes applied at the head with last-writer-wins.

use super::*;

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
pub(super) fn concurrent(a: &Version, b: &Version) -> bool {
    a.site != b.site && a.vv.get(b.site) < b.ts && b.vv.get(a.site) < a.ts
}

impl ChainReplica {
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
        if self.on_disk <= self.scanned.max(self.handed) {
            return Vec::new(); // nothing new on disk: no search (cold memory at every tick)
        }
        self.scanned = self.on_disk;
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
        self.scanned = 0;
    }

    /// How far the reporter may count this replica's updates reported: the
    /// updates its disk holds.
    pub fn reportable_through(&self) -> u64 {
        self.applied.min(self.on_disk)
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
        if let Some(latest) = self.store.latest(&w.key).map(|s| s.version()).filter(|v| concurrent(v, &w.version)) {
            self.conflicts += 1;
            let (kept, lost) = match latest < w.version {
                true => (w.version.clone(), latest),
                false => (latest, w.version.clone()),
            };
            if self.recent_conflicts.len() == RECENT_CONFLICTS {
                self.recent_conflicts.pop_front();
            }
            self.recent_conflicts.push_back(Conflict { key: w.key.clone(), kept, lost, at_ms: now_ms });
        }
        let (key, version, value, expires_at_ms) = (w.key, w.version, w.value, w.expires_at_ms);
        let update =
            Update { seq: self.applied + 1, key, version, value, expires_at_ms, ack: None, local_dep: Timestamp::ZERO, expired: false };
        let seq = update.seq;
        let mut forward = Vec::new();
        self.apply(update, now_ms, &mut forward, out);
        self.flush(forward, now_ms, out);
        self.log_applied();
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
}
