//! The node's memory budget (`--maxmemory`): what its replicas' stores
//! take (INFO `used_memory_dataset`: entries, tables, versions kept for
//! snapshots) against the budget the shell passes (`set_memory`). Over it,
//! the heads here refuse writes that add data (`noeviction`, or nothing
//! left to evict) or evict keys by the policy (`chain::evict`). As Redis
//! leaves its replication buffers out of the comparison, the updates kept
//! for returning replicas and those in flight are left out: eviction
//! cannot free them, and they are bounded on their own
//! (`chain::RECENT_BYTES`). A budget is per node, as Redis's is per server.
//! With a disk tier, values move to disk past the budget instead of keys
//! being evicted (`tier`), and growth is refused only once no value is
//! left in memory to move, or the tier fails.

use super::*;
use crate::chain::Policy;
use std::collections::VecDeque;

/// Evicted bytes count as on their way out this long: the tombstones
/// reach the other replicas here a few milliseconds after their heads
/// elsewhere decided, and until then this node would evict again for the
/// same excess.
const RETURNING_MS: u64 = 100;

#[derive(Debug, Default)]
pub(super) struct Memory {
    /// Bytes; 0: no budget.
    max: u64,
    policy: Policy,
    /// Bytes over the budget when last measured (`measure`), and when.
    over_by: usize,
    measured_ms: u64,
    /// Lately evicted here: (when, bytes).
    returning: VecDeque<(u64, usize)>,
    /// Over the budget with nothing left that the policy may evict: writes
    /// that add data are refused, as with `noeviction`.
    exhausted: bool,
    /// Keys evicted by heads here, replicas since dropped included (INFO
    /// `evicted_keys`).
    evicted: u64,
}

impl Node {
    /// The memory budget in bytes (0: none) and what to do past it: the
    /// shell says so before each step and tick (it can change at run time).
    pub fn set_memory(&mut self, max: u64, policy: Policy) {
        let m = &mut self.memory;
        if policy != m.policy || max != m.max {
            m.exhausted = false;
        }
        (m.max, m.policy) = (max, policy);
    }

    /// Keys evicted by heads here (INFO `evicted_keys`).
    pub fn evicted_keys(&self) -> u64 {
        self.memory.evicted
    }

    /// Whether a write that adds data is refused here (`Refusal::
    /// OutOfMemory`), measured at most a millisecond ago.
    pub(super) fn refuses_growth(&mut self, now_ms: u64) -> bool {
        if self.memory.max == 0 {
            return false;
        }
        if self.memory.measured_ms != now_ms {
            self.measure(now_ms);
        }
        let m = &self.memory;
        m.over_by > 0 && (!self.reclaims() || m.exhausted || self.tier_failing().is_some())
    }

    /// Why a write that adds data is refused (`refuses_growth`).
    pub(super) fn refusal(&self) -> Refusal {
        match self.tier_failing() {
            Some(e) => Refusal::Disk(format!("{e}, and the node is over its memory budget: writes that add data are refused")),
            None => Refusal::OutOfMemory,
        }
    }

    /// Whether the node makes room past its budget: values move to its
    /// disk tier, or keys are evicted by a policy.
    fn reclaims(&self) -> bool {
        self.has_tier() || self.memory.policy != Policy::NoEviction
    }

    /// Whether the stores are over the budget with keys left to evict or
    /// values to move out (the node then ticks as a busy one, to do so).
    pub(super) fn evicting(&self) -> bool {
        let m = &self.memory;
        m.max > 0 && m.over_by > 0 && self.reclaims() && !m.exhausted
    }

    /// The stores' bytes, all and those of the partitions headed here;
    /// notes how far over the budget they are.
    fn measure(&mut self, now_ms: u64) -> (usize, usize) {
        let (mut total, mut headed) = (0, 0);
        for r in self.parts.iter().flatten() {
            let bytes = r.store_memory();
            total += bytes;
            headed += if r.is_head() { bytes } else { 0 };
        }
        let m = &mut self.memory;
        m.over_by = total.saturating_sub(m.max as usize);
        m.measured_ms = now_ms;
        (total, headed)
    }

    /// Measures the stores against the budget and, over it, evicts at the
    /// heads here their share of the excess (every replica of a chain
    /// drops what its head evicts: each node's heads take the part of the
    /// excess their partitions hold here), less what is on its way out.
    pub(super) fn evict(&mut self, now_ms: u64, out: &mut Outbox) {
        if self.memory.max == 0 {
            self.memory.over_by = 0;
            return;
        }
        let (total, headed) = self.measure(now_ms);
        let m = &mut self.memory;
        if m.over_by == 0 {
            m.exhausted = false;
            return;
        }
        let over_by = m.over_by;
        if self.has_tier() {
            // Values move to disk instead (`tier`); every replica here
            // moves its own.
            self.memory.exhausted = !self.move_out(over_by, total);
            return;
        }
        let m = &mut self.memory;
        if m.policy == Policy::NoEviction {
            return;
        }
        while m.returning.front().is_some_and(|&(at, _)| now_ms.saturating_sub(at) >= RETURNING_MS) {
            m.returning.pop_front();
        }
        let returning: usize = m.returning.iter().map(|&(_, b)| b).sum();
        let share = (m.over_by as u128 * headed as u128 / total.max(1) as u128) as usize;
        let want = share.saturating_sub(returning);
        if want == 0 {
            return;
        }
        let policy = m.policy;
        let heads = self.parts.iter().flatten().filter(|r| r.is_head()).count().max(1);
        let each = want.div_ceil(heads);
        let (mut freed, mut keys) = (0, 0);
        for r in self.parts.iter_mut().flatten() {
            let (b, k) = r.evict(policy, each, now_ms, out);
            (freed, keys) = (freed + b, keys + k);
        }
        let m = &mut self.memory;
        m.evicted += keys as u64;
        m.exhausted = keys == 0;
        if freed > 0 {
            m.returning.push_back((now_ms, freed));
        }
    }
}
