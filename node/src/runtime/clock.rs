//! The node's clocks: the wall clock (the physical part of hybrid
//! timestamps, expiry, TTLs), with the skew `CW.CLOCK SKEW` emulates, and a
//! monotonic clock (failure detection, timeouts, leases). The runtime reads
//! them through the functions here; a front end is handed a `Clock`
//! (`Handle::clock`) and reads the same wall clock through it.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Added to this process's wall clock: a clock fault, emulated
/// (`CW.CLOCK SKEW`, `causeway torture --sites`).
static SKEW_MS: AtomicI64 = AtomicI64::new(0);

/// Wall-clock milliseconds: the physical part of hybrid timestamps.
pub fn now_ms() -> u64 {
    let wall = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0);
    (wall + SKEW_MS.load(Ordering::Relaxed)).max(0) as u64
}

/// Sets how far this node's wall clock is off (0: not at all).
pub fn set_skew_ms(ms: i64) {
    SKEW_MS.store(ms, Ordering::Relaxed);
}

/// Monotonic milliseconds since the process started: failure detection,
/// timeouts and leases, which a wall-clock jump must not disturb.
pub fn mono_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// The node's wall clock, as a front end is handed it (`Handle::clock`):
/// commands read the time, and set the emulated skew, through it. Only the
/// runtime makes one.
#[derive(Clone, Copy, Debug)]
pub struct Clock(());

impl Clock {
    pub(super) fn new() -> Clock {
        Clock(())
    }

    /// A clock for tests of what is handed one.
    #[cfg(test)]
    pub(crate) fn for_tests() -> Clock {
        Clock(())
    }

    /// Wall-clock milliseconds, skew included (`now_ms`).
    #[inline]
    pub fn now_ms(&self) -> u64 {
        now_ms()
    }

    /// Sets how far this node's wall clock is off (`set_skew_ms`).
    pub fn set_skew_ms(&self, ms: i64) {
        set_skew_ms(ms)
    }

    /// Time since the Unix epoch by the machine's clock, to the
    /// microsecond and without the emulated skew (what TIME answers).
    pub fn unix_time(&self) -> Duration {
        SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default()
    }

    /// Waits for the next instant of the runtime's grid of `period`
    /// (`next_on_grid`): a front end's periodic work shares the runtime's
    /// wakeups at rest.
    pub async fn next_on_grid(&self, period: Duration) {
        next_on_grid(period).await
    }
}

/// The next instant of this process's grid of `period` (every multiple of
/// `period` since the first call). The timers that fire at rest (the idle
/// tick, the coordinator's supervision, the once-a-second chores) sit on
/// one grid, so they share their wakeups: at rest a wakeup costs more than
/// the work it does.
pub fn on_grid(period: Duration) -> tokio::time::Instant {
    static ORIGIN: OnceLock<tokio::time::Instant> = OnceLock::new();
    let origin = *ORIGIN.get_or_init(tokio::time::Instant::now);
    let (since, period) = (origin.elapsed().as_micros(), period.as_micros().max(1));
    origin + Duration::from_micros(((since / period + 1) * period) as u64)
}

/// Waits for the next instant of the grid of `period` (`on_grid`).
pub async fn next_on_grid(period: Duration) {
    tokio::time::sleep_until(on_grid(period)).await;
}
