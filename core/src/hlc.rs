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
///
/// Packed in one word, 48 bits of milliseconds (until the year 10889) above
/// a 16-bit logical counter, so that a version vector of three sites fits in
/// a key's version without a heap allocation (`version::VersionVector`): a
/// key at rest costs the same at one site as at three. On the wire and on
/// disk it is still (physical_ms, logical) as before.
#[derive(Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(u64);

const LOGICAL_BITS: u32 = 16;

impl Timestamp {
    pub const ZERO: Timestamp = Timestamp(0);
    /// The largest logical counter; `Clock::tick` moves to the next
    /// millisecond rather than past it.
    pub const MAX_LOGICAL: u16 = u16::MAX;

    pub const fn new(physical_ms: u64, logical: u16) -> Self {
        Timestamp((physical_ms << LOGICAL_BITS) | logical as u64)
    }

    pub const fn physical_ms(self) -> u64 {
        self.0 >> LOGICAL_BITS
    }

    pub const fn logical(self) -> u16 {
        self.0 as u16
    }

    /// The packed word (milliseconds above the counter): what the store
    /// keeps (`store::entry`).
    pub const fn to_bits(self) -> u64 {
        self.0
    }

    pub const fn from_bits(bits: u64) -> Self {
        Timestamp(bits)
    }

    /// The largest timestamp smaller than this one (`ZERO` stays `ZERO`):
    /// "everything strictly before `ts`" as an inclusive bound.
    pub fn just_before(self) -> Timestamp {
        Timestamp(self.0.saturating_sub(1))
    }
}

/// The encoding every earlier release wrote (two integers).
#[derive(Serialize, Deserialize)]
#[serde(rename = "Timestamp")]
struct WireTimestamp {
    physical_ms: u64,
    logical: u32,
}

impl Serialize for Timestamp {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        WireTimestamp { physical_ms: self.physical_ms(), logical: self.logical() as u32 }.serialize(s)
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    /// A counter beyond 16 bits (only a crafted or very old message has one)
    /// reads as the last of its millisecond, which keeps its order against
    /// every other timestamp; milliseconds beyond 48 bits are refused.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let w = WireTimestamp::deserialize(d)?;
        if w.physical_ms >> (64 - LOGICAL_BITS) != 0 {
            return Err(serde::de::Error::custom(format!("timestamp {} ms is out of range", w.physical_ms)));
        }
        Ok(Timestamp::new(w.physical_ms, w.logical.min(Timestamp::MAX_LOGICAL as u32) as u16))
    }
}

impl fmt::Debug for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Timestamp").field("physical_ms", &self.physical_ms()).field("logical", &self.logical()).finish()
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.physical_ms(), self.logical())
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
        self.last = if now_ms > floor.physical_ms() {
            Timestamp::new(now_ms, 0)
        } else if floor.logical() == Timestamp::MAX_LOGICAL {
            // The counter is spent: borrow the next millisecond.
            Timestamp::new(floor.physical_ms() + 1, 0)
        } else {
            Timestamp::new(floor.physical_ms(), floor.logical() + 1)
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
        assert_eq!(Timestamp::new(5, 0).just_before(), Timestamp::new(4, Timestamp::MAX_LOGICAL));
        assert_eq!(Timestamp::ZERO.just_before(), Timestamp::ZERO);
    }

    #[test]
    fn a_spent_logical_counter_moves_to_the_next_millisecond() {
        let mut c = Clock::default();
        let t = c.tick(10, Timestamp::new(10, Timestamp::MAX_LOGICAL));
        assert_eq!(t, Timestamp::new(11, 0));
    }

    /// Packing keeps the order of (physical, logical) and the old encoding.
    #[test]
    fn packed_timestamps_order_and_encode_as_two_integers() {
        let (a, b, c) = (Timestamp::new(5, Timestamp::MAX_LOGICAL), Timestamp::new(6, 0), Timestamp::new(6, 1));
        assert!(a < b && b < c && a.just_before() < a);
        assert_eq!((c.physical_ms(), c.logical()), (6, 1));
        let old = bincode::serialize(&WireTimestamp { physical_ms: 6, logical: 1 }).unwrap();
        assert_eq!(bincode::serialize(&c).unwrap(), old);
        assert_eq!(bincode::deserialize::<Timestamp>(&old).unwrap(), c);
        let spent = bincode::serialize(&WireTimestamp { physical_ms: 6, logical: u32::MAX }).unwrap();
        assert_eq!(bincode::deserialize::<Timestamp>(&spent).unwrap(), Timestamp::new(6, Timestamp::MAX_LOGICAL));
        let far = bincode::serialize(&WireTimestamp { physical_ms: u64::MAX, logical: 0 }).unwrap();
        assert!(bincode::deserialize::<Timestamp>(&far).is_err());
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
