//! A partition's outgoing streams in a geo-replicated site: the identifiers
//! of its updates to every stabilizer replica of its site (Eunomia Alg. 2
//! lines 8 and 10-12), and their values to the receiver of every other site
//! (§5, data and metadata separated). Both are the same protocol, so one
//! type serves both: `Reporter<ReplicaId, UpdateId>` and
//! `Reporter<SiteId, RemoteValue>`.
//!
//! Each destination ends up with a gap-free prefix of the partition's stream
//! (§3.3, the prefix property), whatever is lost or reordered. As in the
//! paper's implementation, the reporter remembers how far each destination
//! acknowledged (`Ack_n`) and keeps every item until all destinations have
//! applied it. Unlike the paper it does not resend the whole unacknowledged
//! suffix every time: each batch says where it continues from
//! (`Batch::prev`), a destination refuses a batch that would leave a gap,
//! and the reporter goes back to the destination's acknowledged point when
//! refused or when `REPORT_RESEND_MS` pass without progress (doubling while
//! nothing comes back, `Resend`). At most `REPORT_WINDOW` items are in
//! flight beyond the acknowledged point, so a site that is cut off costs
//! its origin nothing but memory. Batches are sent on `tick` (Eunomia §5:
//! batch at partitions, about every millisecond) and, when the node asks,
//! at once (`flush`).
//!
//! Acknowledgements carry two points: *received* (what need not be sent
//! again) and *applied* (what may be forgotten: a receiver that fails over
//! loses the values it held but not applied, and asks again from there). A
//! refusal (`resend`) may move `received` back: a new receiver starts from
//! scratch.

use crate::hlc::Timestamp;
pub use crate::message::geo::Batch;
use crate::ring::PartitionId;
use std::collections::{BTreeMap, VecDeque};

/// At most this many items in one batch.
pub const MAX_REPORT: usize = 4096;

/// A reporter that has heard no progress from a destination for this long
/// sends again from the destination's acknowledged point.
pub const REPORT_RESEND_MS: u64 = 50;

/// At most this many items beyond what a destination acknowledged are in
/// flight to it: a destination that is cut off is not streamed the whole
/// backlog over and over.
pub const REPORT_WINDOW: usize = 4 * MAX_REPORT;

/// Resends to a silent destination back off: each one that brings no
/// progress doubles the wait, up to this.
pub const MAX_RESEND_MS: u64 = 2_000;

/// When a stream goes again from a destination's acknowledged point: after
/// a silence (a batch or its acknowledgement was lost), a longer one each
/// time nothing came back. Shared by the reporters and the stabilizer's
/// shipping.
#[derive(Clone, Copy, Debug, Default)]
pub struct Resend {
    progress_ms: u64,
    misses: u32,
}

impl Resend {
    /// The destination made progress (or answered) at `now_ms`.
    pub fn progress(&mut self, now_ms: u64) {
        self.progress_ms = now_ms;
        self.misses = 0;
    }

    /// Where the stream continues to a destination that acknowledged
    /// `received`: never before it, and back to it once the silence since
    /// the last progress or resend reached `base_ms`, doubled for each
    /// resend in a row that brought nothing (at most `MAX_RESEND_MS`).
    pub fn resume<T: Ord + Copy>(&mut self, sent: &mut T, received: T, now_ms: u64, base_ms: u64) {
        if *sent < received {
            *sent = received;
        }
        let wait = base_ms.saturating_mul(1 << self.misses.min(16)).min(MAX_RESEND_MS.max(base_ms));
        if *sent > received && now_ms.saturating_sub(self.progress_ms) >= wait {
            *sent = received;
            self.progress_ms = now_ms;
            self.misses += 1;
        }
    }
}

/// What a stream carries: items in timestamp order.
pub trait Stamped: Clone {
    fn ts(&self) -> Timestamp;
}

#[derive(Clone, Copy, Debug, Default)]
struct Peer {
    received: Timestamp,
    applied: Timestamp,
    sent: Timestamp,
    resend: Resend,
    /// A batch that only moves the promise goes out at most this often
    /// (`set_idle_ms`), and when it last went.
    idle_ms: u64,
    last_ms: u64,
}

/// The sending side of one partition's stream to destinations `P`.
#[derive(Debug)]
pub struct Reporter<P, T> {
    partition: PartitionId,
    /// Recorded and not yet applied by every destination, in timestamp order.
    items: VecDeque<T>,
    /// The latest item's timestamp or promise, whichever is larger.
    promised: Timestamp,
    peers: BTreeMap<P, Peer>,
    /// Nobody needs the items up to here any more (`forget_through`).
    forgotten: Timestamp,
}

impl<P: Ord + Copy, T: Stamped> Reporter<P, T> {
    pub fn new(partition: PartitionId, peers: &[P]) -> Self {
        Reporter {
            partition,
            items: VecDeque::new(),
            promised: Timestamp::ZERO,
            peers: peers.iter().map(|&r| (r, Peer::default())).collect(),
            forgotten: Timestamp::ZERO,
        }
    }

    /// An item of this partition, in timestamp order: after every item
    /// recorded and every promise made (Property 2). One that is not is
    /// refused (returns false): reporting it would break the order every
    /// destination relies on.
    pub fn record(&mut self, item: T) -> bool {
        if item.ts() <= self.promised {
            return false;
        }
        self.promised = item.ts();
        self.items.push_back(item);
        true
    }

    /// A heartbeat (Alg. 2 line 12): no later item of this partition will
    /// be timestamped at or below `ts`.
    pub fn promise(&mut self, ts: Timestamp) {
        self.promised = self.promised.max(ts);
    }

    /// The latest timestamp recorded or promised.
    pub fn promised(&self) -> Timestamp {
        self.promised
    }

    /// `peer` holds the stream up to `received` and has applied it up to
    /// `applied`; `resend`: the last batch did not continue what it holds,
    /// send again from `received` (which may be further back than before).
    pub fn on_ack(&mut self, peer: P, received: Timestamp, applied: Timestamp, resend: bool, now_ms: u64) {
        let Some(p) = self.peers.get_mut(&peer) else { return };
        if received > p.received {
            p.received = received;
            p.resend.progress(now_ms);
        }
        p.applied = p.applied.max(applied);
        if resend {
            p.received = received;
            p.sent = received;
            p.resend.progress(now_ms);
        }
        self.collect_garbage();
    }

    /// Nobody will need the items up to `ts` again, whatever the
    /// destinations acknowledged (the stabilizer's replicas say so once
    /// every other site has applied them: one that is down for good must
    /// not make the partition keep them).
    pub fn forget_through(&mut self, ts: Timestamp) {
        self.forgotten = self.forgotten.max(ts);
        self.collect_garbage();
    }

    fn collect_garbage(&mut self) {
        let done = self.applied();
        while self.items.front().is_some_and(|i| i.ts() <= done) {
            self.items.pop_front();
        }
    }

    /// Every destination has applied the stream up to here (or nobody
    /// needs it any more).
    pub fn applied(&self) -> Timestamp {
        self.peers.values().map(|p| p.applied).min().unwrap_or(self.promised).max(self.forgotten)
    }

    /// Sends each destination what it has not been sent (or, after a
    /// refusal or a silence, what it has not acknowledged), and the latest
    /// promise.
    pub fn tick(&mut self, now_ms: u64, out: &mut Vec<(P, Batch<T>)>) {
        crate::shrink_idle(&mut self.items);
        for (&peer, p) in self.peers.iter_mut() {
            p.resend.resume(&mut p.sent, p.received, now_ms, REPORT_RESEND_MS);
            if p.sent >= self.promised {
                continue; // sent everything: no search of `items` (cold memory at every tick)
            }
            let start = self.items.partition_point(|i| i.ts() <= p.sent);
            if start == self.items.len() && now_ms.saturating_sub(p.last_ms) < p.idle_ms {
                continue; // only a promise, and one went out recently
            }
            Self::send(self.partition, &self.items, self.promised, peer, p, now_ms, out);
        }
    }

    /// The next batch for `peer`, if there is anything new to send it: what
    /// it was not sent, at most `MAX_REPORT` items and at most
    /// `REPORT_WINDOW` beyond what it acknowledged, and the promise.
    fn send(
        partition: PartitionId,
        items: &VecDeque<T>,
        promised: Timestamp,
        peer: P,
        p: &mut Peer,
        now_ms: u64,
        out: &mut Vec<(P, Batch<T>)>,
    ) {
        p.sent = p.sent.max(p.received);
        let start = items.partition_point(|i| i.ts() <= p.sent);
        let acked = items.partition_point(|i| i.ts() <= p.received);
        let room = REPORT_WINDOW.saturating_sub(start - acked).min(MAX_REPORT);
        let end = (start + room).min(items.len());
        let up_to = if end == items.len() { promised } else { items[end - 1].ts() };
        if end == start && up_to <= p.sent {
            return;
        }
        let batch = items.range(start..end).cloned().collect();
        out.push((peer, Batch { partition, prev: p.sent, items: batch, up_to }));
        p.sent = p.sent.max(up_to);
        p.last_ms = now_ms;
    }

    /// Sends at once, between ticks, each destination the items it was
    /// not sent and, if `promises`, each that takes promises every tick
    /// (the stabilizer leader) the latest promise. The caller decides when
    /// (`Geo::flush`).
    pub fn flush(&mut self, now_ms: u64, promises: bool, out: &mut Vec<(P, Batch<T>)>) {
        for (&peer, p) in self.peers.iter_mut() {
            let items = self.items.back().is_some_and(|i| i.ts() > p.sent);
            if items || (promises && p.idle_ms == 0) {
                Self::send(self.partition, &self.items, self.promised, peer, p, now_ms, out);
            }
        }
    }

    /// Each destination's (received, applied, sent), for diagnostics.
    pub fn peers(&self) -> Vec<(P, Timestamp, Timestamp, Timestamp)> {
        self.peers.iter().map(|(&k, p)| (k, p.received, p.applied, p.sent)).collect()
    }

    /// Sends `peer` a batch that only moves the promise at most every
    /// `ms` (0: every tick). Batches with items always go at once.
    pub fn set_idle_ms(&mut self, peer: P, ms: u64) {
        if let Some(p) = self.peers.get_mut(&peer) {
            p.idle_ms = ms;
        }
    }

    /// Items some destination has not applied yet.
    pub fn unacked(&self) -> usize {
        self.items.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Debug)]
    struct Item(u64);

    impl Stamped for Item {
        fn ts(&self) -> Timestamp {
            Timestamp::new(self.0, 0)
        }
    }

    /// A destination that never answers (a site cut off) is sent one window
    /// beyond what it acknowledged, again after a silence that doubles each
    /// time: not the whole backlog every tick.
    #[test]
    fn a_silent_destination_gets_a_window_and_backed_off_resends() {
        let mut r: Reporter<u16, Item> = Reporter::new(0, &[1]);
        for t in 1..=100_000 {
            assert!(r.record(Item(t)));
        }
        let (mut items, mut resends, mut last_start) = (0, Vec::new(), None);
        for now in (0..10_000).step_by(5) {
            let mut out = Vec::new();
            r.tick(now, &mut out);
            for (_, batch) in out {
                items += batch.items.len();
                if batch.prev == Timestamp::ZERO && last_start != Some(now) {
                    resends.push(now);
                    last_start = Some(now);
                }
            }
        }
        assert_eq!(resends, [0, 50, 150, 350, 750, 1550, 3150, 5150, 7150, 9150]);
        assert_eq!(items, resends.len() * REPORT_WINDOW, "one window per round");
        // It answers: the stream goes on from there at once.
        r.on_ack(1, Timestamp::new(REPORT_WINDOW as u64, 0), Timestamp::ZERO, false, 10_000);
        let mut out = Vec::new();
        r.tick(10_005, &mut out);
        assert_eq!(out[0].1.prev, Timestamp::new(REPORT_WINDOW as u64, 0));
    }

    /// Between ticks, new items go to every destination at once, and a new
    /// promise alone only to those that take one every tick (the
    /// stabilizer leader), and only when asked.
    #[test]
    fn a_flush_sends_new_items_everywhere_and_promises_to_the_leader_only() {
        let mut r: Reporter<u16, Item> = Reporter::new(0, &[1, 2]);
        r.set_idle_ms(2, 500);
        let sent = |r: &mut Reporter<u16, Item>, promises: bool| {
            let mut out = Vec::new();
            r.flush(1_000, promises, &mut out);
            out.into_iter().map(|(peer, b)| (peer, b.items.len(), b.up_to.physical_ms())).collect::<Vec<_>>()
        };
        assert!(r.record(Item(5)));
        assert_eq!(sent(&mut r, false), [(1, 1, 5), (2, 1, 5)]);
        r.promise(Timestamp::new(9, 0));
        assert_eq!(sent(&mut r, false), [], "a promise alone waits for the tick unless asked");
        assert_eq!(sent(&mut r, true), [(1, 0, 9)], "asked: to the leader only");
        assert_eq!(sent(&mut r, true), [], "nothing new");
    }
}
