//! Hybrid logical clocks (Kulkarni et al.), as Eunomia §3.1 uses them: a
//! timestamp is the physical time in milliseconds plus a logical counter, so
//! it stays close to wall time yet never goes backwards and always moves past
//! every timestamp the node has observed.
//!
//! The clock never reads the system time itself: callers pass `now_ms`, which
//! keeps the protocols deterministic under simulation.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A hybrid logical clock timestamp. Ordered by physical time, then logical.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Timestamp {
    pub physical_ms: u64,
    pub logical: u32,
}

impl Timestamp {
    pub const ZERO: Timestamp = Timestamp { physical_ms: 0, logical: 0 };

    pub fn new(physical_ms: u64, logical: u32) -> Self {
        Timestamp { physical_ms, logical }
    }

    /// The largest timestamp smaller than this one (`ZERO` stays `ZERO`):
    /// "everything strictly before `ts`" as an inclusive bound.
    pub fn just_before(self) -> Timestamp {
        match (self.physical_ms, self.logical) {
            (0, 0) => Timestamp::ZERO,
            (p, 0) => Timestamp::new(p - 1, u32::MAX),
            (p, l) => Timestamp::new(p, l - 1),
        }
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.physical_ms, self.logical)
    }
}

/// How far ahead of this node's wall clock a timestamp from a client may be.
/// A session token from further in the future would drag the heads' clocks
/// (and with them every get-transaction snapshot) into the future.
pub const MAX_CLOCK_SKEW_MS: u64 = 60_000;

/// One node's hybrid clock.
#[derive(Clone, Debug, Default)]
pub struct Clock {
    last: Timestamp,
}

impl Clock {
    /// A fresh timestamp greater than every one issued or observed before,
    /// and greater than `after` (the client's causal past: its writes must be
    /// timestamped after everything it has seen, Eunomia Alg. 2 line 5).
    pub fn tick(&mut self, now_ms: u64, after: Timestamp) -> Timestamp {
        let floor = self.last.max(after);
        self.last = if now_ms > floor.physical_ms {
            Timestamp::new(now_ms, 0)
        } else if floor.logical == u32::MAX {
            // The counter is spent: borrow the next millisecond.
            Timestamp::new(floor.physical_ms + 1, 0)
        } else {
            Timestamp::new(floor.physical_ms, floor.logical + 1)
        };
        self.last
    }

    /// Remember `ts` so that every later `tick` is greater than it.
    pub fn observe(&mut self, ts: Timestamp) {
        self.last = self.last.max(ts);
    }

    /// The latest timestamp issued or observed.
    pub fn last(&self) -> Timestamp {
        self.last
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn follows_wall_time_and_never_goes_back() {
        let mut c = Clock::default();
        let a = c.tick(100, Timestamp::ZERO);
        assert_eq!(a, Timestamp::new(100, 0));
        let b = c.tick(100, Timestamp::ZERO);
        assert_eq!(b, Timestamp::new(100, 1));
        let back = c.tick(50, Timestamp::ZERO); // wall clock stepped back
        assert!(back > b);
        assert_eq!(c.tick(200, Timestamp::ZERO), Timestamp::new(200, 0));
    }

    #[test]
    fn just_before_is_the_predecessor() {
        assert_eq!(Timestamp::new(5, 3).just_before(), Timestamp::new(5, 2));
        assert_eq!(Timestamp::new(5, 0).just_before(), Timestamp::new(4, u32::MAX));
        assert_eq!(Timestamp::ZERO.just_before(), Timestamp::ZERO);
    }

    #[test]
    fn a_spent_logical_counter_moves_to_the_next_millisecond() {
        let mut c = Clock::default();
        let t = c.tick(10, Timestamp::new(10, u32::MAX));
        assert_eq!(t, Timestamp::new(11, 0));
    }

    #[test]
    fn moves_past_dependencies_and_observations() {
        let mut c = Clock::default();
        let dep = Timestamp::new(500, 7);
        assert!(c.tick(100, dep) > dep);
        c.observe(Timestamp::new(900, 0));
        assert!(c.tick(100, Timestamp::ZERO) > Timestamp::new(900, 0));
    }
}
