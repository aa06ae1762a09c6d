//! The stabilizer's set of reported, not yet stable update identifiers
//! (Eunomia's `Ops`, Alg. 3), kept so that "take everything up to the stable
//! time, in timestamp order" is cheap.
//!
//! The paper's prototype keeps `Ops` in one red-black tree (§6). We use what
//! the input already gives us: each partition reports its ids in increasing
//! timestamp order (Property 2), so one FIFO queue per partition is already
//! sorted, and a k-way merge over the queue heads (a min-heap with one entry
//! per non-empty queue) yields the site's order. Inserting is a push at the
//! back of a queue (plus a heap push when the queue was empty); taking an id
//! is a pop at the front, and the heap is only touched when the next id
//! comes from another partition. With P partitions a heap operation costs
//! O(log P), independent of how many ids are waiting.

use super::{Position, UpdateId};
use crate::hlc::Timestamp;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

/// Update identifiers of a fixed set of partitions, taken out in the site's
/// order: by `Position` (timestamp, then partition).
#[derive(Debug)]
pub struct OrderedIds {
    queues: Vec<VecDeque<UpdateId>>,
    /// The position of the front of every non-empty queue, exactly once.
    heads: BinaryHeap<Reverse<Position>>,
    len: usize,
}

impl OrderedIds {
    pub fn new(partitions: u32) -> OrderedIds {
        OrderedIds { queues: (0..partitions).map(|_| VecDeque::new()).collect(), heads: BinaryHeap::new(), len: 0 }
    }

    /// Adds `id`. Its partition's ids must come in increasing timestamp
    /// order (the caller filters what it has already seen).
    pub fn push(&mut self, id: UpdateId) {
        let queue = &mut self.queues[id.partition as usize];
        debug_assert!(queue.back().is_none_or(|last| last.ts < id.ts), "ids of one partition out of order");
        if queue.is_empty() {
            self.heads.push(Reverse(id.position()));
        }
        queue.push_back(id);
        self.len += 1;
    }

    /// Takes every id with timestamp <= `stable`, in order, into `out`.
    pub fn take_through(&mut self, stable: Timestamp, out: &mut impl Extend<UpdateId>) {
        self.drain(Position::through(stable), |id| out.extend(std::iter::once(id)));
    }

    /// Forgets every id at or before `pos`.
    pub fn discard_through(&mut self, pos: Position) {
        self.drain(pos, drop);
    }

    /// Removes the ids at or before `bound` in order, handing each to `f`.
    /// While the next id of the partition just taken still comes before every
    /// other queue's head, it is taken without touching the heap.
    fn drain(&mut self, bound: Position, mut f: impl FnMut(UpdateId)) {
        while let Some(&Reverse(head)) = self.heads.peek() {
            if head > bound {
                break;
            }
            self.heads.pop();
            let next_other = self.heads.peek().map(|r| r.0);
            let queue = &mut self.queues[head.partition as usize];
            while let Some(id) = queue.pop_front() {
                self.len -= 1;
                f(id);
                let Some(next) = queue.front() else { break };
                let pos = next.position();
                if pos > bound || next_other.is_some_and(|other| pos > other) {
                    self.heads.push(Reverse(pos));
                    break;
                }
            }
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::geo::stabilizer::IdVector;

    fn id(partition: u32, ms: u64, logical: u16) -> UpdateId {
        let ts = Timestamp::new(ms, logical);
        UpdateId { partition, ts, local_dep: Timestamp::ZERO, vv: IdVector::from_elem(ts, 1) }
    }

    fn positions(ids: &[UpdateId]) -> Vec<(u64, u32)> {
        ids.iter().map(|i| (i.ts.physical_ms(), i.partition)).collect()
    }

    #[test]
    fn merges_partitions_in_timestamp_then_partition_order() {
        let mut set = OrderedIds::new(3);
        for (p, ms) in [(0, 1), (0, 4), (0, 5), (1, 2), (1, 4), (2, 3), (2, 9)] {
            set.push(id(p, ms, 0));
        }
        let mut out = Vec::new();
        set.take_through(Timestamp::new(4, 0), &mut out);
        assert_eq!(positions(&out), vec![(1, 0), (2, 1), (3, 2), (4, 0), (4, 1)]);
        assert_eq!(set.len(), 2);
        set.push(id(1, 6, 0));
        out.clear();
        set.take_through(Timestamp::new(100, 0), &mut out);
        assert_eq!(positions(&out), vec![(5, 0), (6, 1), (9, 2)]);
        assert!(set.is_empty());
    }

    #[test]
    fn discard_stops_inside_a_timestamp() {
        let mut set = OrderedIds::new(3);
        for p in 0..3 {
            set.push(id(p, 7, 0));
        }
        set.discard_through(Position { ts: Timestamp::new(7, 0), partition: 1 });
        let mut out = Vec::new();
        set.take_through(Timestamp::new(7, 0), &mut out);
        assert_eq!(positions(&out), vec![(7, 2)]);
    }

    /// Throughput of the ordered set alone: ids of 64 partitions pushed in
    /// interleaved batches and taken out in order.
    /// `cargo test -p causeway-core --release -- --ignored --nocapture ordered_set_throughput`
    #[test]
    #[ignore]
    fn ordered_set_throughput() {
        const PARTITIONS: u32 = 64;
        const IDS: usize = 10_000_000;
        const ROUND: usize = 64 * 16;
        let vv = IdVector::from_elem(Timestamp::ZERO, 3);
        let mut ids: Vec<UpdateId> = Vec::with_capacity(IDS);
        for i in 0..IDS {
            // Partitions write at slightly different paces, so heads interleave.
            let partition = (i % PARTITIONS as usize) as u32;
            let ts = Timestamp::new((i / PARTITIONS as usize) as u64, (i % 7) as u16);
            ids.push(UpdateId { partition, ts, local_dep: Timestamp::ZERO, vv: vv.clone() });
        }
        let mut set = OrderedIds::new(PARTITIONS);
        let mut taken: Vec<UpdateId> = Vec::with_capacity(ROUND * 4);
        let mut total = 0;
        let start = std::time::Instant::now();
        let mut it = ids.into_iter();
        loop {
            let mut last = None;
            for id in it.by_ref().take(ROUND) {
                last = Some(id.ts);
                set.push(id);
            }
            let Some(last) = last else { break };
            set.take_through(last.just_before(), &mut taken);
            total += taken.len();
            taken.clear();
        }
        set.take_through(Timestamp::new(u64::MAX, 0), &mut taken);
        total += taken.len();
        let secs = start.elapsed().as_secs_f64();
        assert_eq!(total, IDS);
        println!("ordered set: {IDS} ids from {PARTITIONS} partitions in {secs:.3} s = {:.1} M ids/s", IDS as f64 / secs / 1e6);
    }
}
