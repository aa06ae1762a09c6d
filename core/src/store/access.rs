//! How recently and how often a key was used, in four bytes of its entry,
//! as Redis keeps them for its LRU and LFU eviction: a 24-bit clock of
//! seconds (it wraps after 194 days; an idle time is taken modulo that)
//! and an 8-bit logarithmic frequency counter that decays by one for each
//! minute the key goes unused (Redis's `lfu-log-factor` 10 and
//! `lfu-decay-time` 1).

/// A new key's counter: it is not evicted before it had a chance to be
/// used again (Redis's `LFU_INIT_VAL`).
pub const LFU_INIT: u8 = 5;
const LFU_LOG_FACTOR: u32 = 10;
const CLOCK_MASK: u32 = (1 << 24) - 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access {
    /// Seconds, modulo 2^24, of the last use.
    pub clock: u32,
    pub counter: u8,
}

impl Access {
    /// A key written for the first time at `now_ms`.
    pub fn new(now_ms: u64) -> Access {
        Access { clock: clock(now_ms), counter: LFU_INIT }
    }

    /// Seconds since the last use.
    pub fn idle_s(&self, now_ms: u64) -> u32 {
        clock(now_ms).wrapping_sub(self.clock) & CLOCK_MASK
    }

    /// The counter as of `now_ms`: less one per minute unused.
    pub fn frequency(&self, now_ms: u64) -> u8 {
        self.counter.saturating_sub((self.idle_s(now_ms) / 60).min(255) as u8)
    }

    /// Used again at `now_ms`; `chance` is a uniform random number: the
    /// counter goes up with a probability that falls as it grows (about 1
    /// in 10 at 6, 1 in 1 000 at 100, so 255 takes about a million uses).
    pub fn used(self, now_ms: u64, chance: u32) -> Access {
        let mut counter = self.frequency(now_ms);
        let base = counter.saturating_sub(LFU_INIT) as u32;
        if counter < u8::MAX && (chance as u64) * (base * LFU_LOG_FACTOR + 1) as u64 <= u32::MAX as u64 {
            counter += 1;
        }
        Access { clock: clock(now_ms), counter }
    }

    pub fn to_bytes(self) -> [u8; 4] {
        let c = self.clock.to_le_bytes();
        [c[0], c[1], c[2], self.counter]
    }

    pub fn from_bytes(b: [u8; 4]) -> Access {
        Access { clock: u32::from_le_bytes([b[0], b[1], b[2], 0]), counter: b[3] }
    }
}

fn clock(now_ms: u64) -> u32 {
    (now_ms / 1000) as u32 & CLOCK_MASK
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_time_and_frequency_follow_the_clock() {
        let a = Access::new(10_000);
        assert_eq!(Access::from_bytes(a.to_bytes()), a);
        assert_eq!(a.idle_s(70_000), 60);
        assert_eq!(a.frequency(70_000), LFU_INIT - 1, "a minute unused");
        assert_eq!(a.frequency(10_000_000), 0);
        // Across the clock's wrap.
        let late = Access::new((CLOCK_MASK as u64) * 1000);
        assert_eq!(late.idle_s((CLOCK_MASK as u64 + 5) * 1000), 5);
    }

    #[test]
    fn the_counter_grows_logarithmically() {
        let mut a = Access::new(0);
        let mut x: u32 = 12345;
        let mut uses = 0;
        while a.counter < 30 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            a = a.used(0, x);
            uses += 1;
        }
        // From 5 to 30: about 10 * (0 + 1 + ... + 24) + 25 = 3 025 uses.
        assert!((1_500..6_000).contains(&uses), "{uses} uses");
        assert_eq!(a.used(0, u32::MAX).counter, 30, "an unlucky use adds nothing");
        assert_eq!(a.used(0, 0).counter, 31, "a lucky one adds one");
    }
}
