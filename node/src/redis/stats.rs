//! The counters INFO shows, kept as Redis 7 keeps them, so tools written
//! for Redis read them the same way.
//!
//! Per command (INFO commandstats and latencystats, `server.c` `call()`
//! and `rejectCommand()`): a command that ran counts a call, its time and a
//! latency sample, and a failed call if it replied with an error (SET's
//! syntax error, a timeout from the replicas); one refused before it ran
//! (wrong number of arguments, NOAUTH) counts only a rejected call; an
//! unknown command or subcommand has no row and counts only as an error.
//! A command's time runs from when it was parsed to when its reply is
//! encoded, so a data command's includes the wait for the replicas (as a
//! blocked command's does in Redis).
//!
//! Per error reply (INFO errorstats, `networking.c` `afterErrorReply()`):
//! a count by the reply's first word (ERR, NOAUTH, WRONGPASS, TIMEOUT, ...)
//! and a total (`total_error_replies`). Causeway's error words are its own
//! constants, never a client's bytes, so this table stays small without
//! Redis's limit of 128 codes.

use causeway_resp::Frame;
use hdrhistogram::Histogram;
use parking_lot::{Mutex, MutexGuard};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Latency samples are nanoseconds from 1 ns to 1 s, with 2 significant
/// digits, as Redis records them (`LATENCY_HISTOGRAM_*` in `server.h`).
const LATENCY_MIN_NS: u64 = 1;
const LATENCY_MAX_NS: u64 = 1_000_000_000;
const LATENCY_DIGITS: u8 = 2;

/// Counters shown by INFO and CW.STATUS.
pub struct Stats {
    pub connections: AtomicU64,
    pub total_connections: AtomicU64,
    pub commands: AtomicU64,
    /// GETs that found a value, and that found none.
    pub keyspace_hits: AtomicU64,
    pub keyspace_misses: AtomicU64,
    /// Commands in the last whole second (sampled once a second).
    pub ops_per_sec: AtomicU64,
    /// One row per command and subcommand (`cmd::rows`). A lock per row:
    /// a node's connections run on one thread, so it is never contended,
    /// and one lock per reply costs less than an atomic add per counter.
    rows: Box<[Mutex<Calls>]>,
    errors: Mutex<Errors>,
}

/// A command's row in the table of calls: `cmd::rows` numbers them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Row(pub usize);

/// What a reply counts toward, decided when its command is dispatched.
#[derive(Clone, Copy, Debug)]
pub enum Call {
    /// An unknown command or subcommand, or bytes that were no command:
    /// only the error counts.
    Unknown,
    /// Refused before it ran: a rejected call.
    Rejected(Row),
    /// Ran, from the moment it was parsed: a call, its time and latency,
    /// and a failed call if it replied with an error.
    Ran(Row, Instant),
}

/// One command's counters since start or `CONFIG RESETSTAT`.
#[derive(Default)]
pub struct Calls {
    pub calls: u64,
    /// Time from parse to reply, summed over the calls.
    pub nanos: u64,
    pub rejected: u64,
    pub failed: u64,
    /// Made on the first call, as Redis makes it (24 KiB each).
    pub latency: Option<Histogram<u64>>,
}

/// Error replies since start or `CONFIG RESETSTAT`.
#[derive(Default)]
pub struct Errors {
    pub total: u64,
    /// By code, in byte order (Redis keeps them in a radix tree).
    pub by_code: BTreeMap<String, u64>,
}

impl Stats {
    /// Counters at zero, with `rows` rows of command calls (`cmd::row_count`).
    pub fn new(rows: usize) -> Stats {
        Stats {
            connections: AtomicU64::new(0),
            total_connections: AtomicU64::new(0),
            commands: AtomicU64::new(0),
            keyspace_hits: AtomicU64::new(0),
            keyspace_misses: AtomicU64::new(0),
            ops_per_sec: AtomicU64::new(0),
            rows: (0..rows).map(|_| Mutex::default()).collect(),
            errors: Mutex::default(),
        }
    }

    /// Counts a reply as it is encoded (`now`: about then).
    pub fn replied(&self, call: Call, reply: &Frame, now: Instant) {
        let failed = match reply {
            Frame::Error(text) => {
                self.errors.lock().count(code(text));
                true
            }
            _ => false,
        };
        match call {
            Call::Unknown => {}
            Call::Rejected(row) => self.rows[row.0].lock().rejected += 1,
            Call::Ran(row, parsed) => {
                let nanos = now.saturating_duration_since(parsed).as_nanos() as u64;
                let mut c = self.rows[row.0].lock();
                c.calls += 1;
                c.nanos += nanos;
                c.failed += failed as u64;
                c.latency
                    .get_or_insert_with(|| {
                        Histogram::new_with_bounds(LATENCY_MIN_NS, LATENCY_MAX_NS, LATENCY_DIGITS).expect("valid bounds")
                    })
                    .saturating_record(nanos.max(LATENCY_MIN_NS));
            }
        }
    }

    /// One command's counters, held while INFO reads them.
    pub fn calls(&self, row: Row) -> MutexGuard<'_, Calls> {
        self.rows[row.0].lock()
    }

    pub fn errors(&self) -> MutexGuard<'_, Errors> {
        self.errors.lock()
    }

    /// Starts every counter afresh but the open connections (CONFIG
    /// RESETSTAT, as Redis's `resetServerStats()`).
    pub fn reset(&self) {
        for c in [&self.total_connections, &self.commands, &self.keyspace_hits, &self.keyspace_misses, &self.ops_per_sec] {
            c.store(0, Ordering::Relaxed);
        }
        for row in self.rows.iter() {
            *row.lock() = Calls::default();
        }
        *self.errors.lock() = Errors::default();
    }
}

impl Errors {
    fn count(&mut self, code: &str) {
        self.total += 1;
        match self.by_code.get_mut(code) {
            Some(n) => *n += 1,
            None => {
                self.by_code.insert(code.to_string(), 1);
            }
        }
    }
}

/// An error reply's code as Redis reads it (`afterErrorReply`): its first
/// word, if a space ends it within the reply's first 32 bytes (counting
/// the `-`), else ERR.
fn code(text: &str) -> &str {
    match text.bytes().take(31).position(|b| b == b' ') {
        Some(end) if end > 0 => &text[..end],
        _ => "ERR",
    }
}

/// The latency at `percentile` (0-100) in nanoseconds, as Redis's
/// `hdr_value_at_percentile` picks it: the rank is rounded to the nearest
/// sample (the crate's `value_at_percentile` rounds it up, which gives
/// another sample at some counts).
pub fn at_percentile(h: &Histogram<u64>, percentile: f64) -> u64 {
    let rank = ((percentile.min(100.0) / 100.0 * h.len() as f64 + 0.5) as u64).max(1);
    let mut seen = 0;
    for v in h.iter_recorded() {
        seen += v.count_at_value();
        if seen >= rank {
            return v.value_iterated_to();
        }
    }
    0
}

#[cfg(test)]
mod tests {
    use super::{at_percentile, code, Call, Row, Stats};
    use causeway_resp::Frame;
    use hdrhistogram::Histogram;
    use std::time::{Duration, Instant};

    #[test]
    fn an_error_code_is_the_first_word() {
        assert_eq!(code("ERR syntax error"), "ERR");
        assert_eq!(code("NOAUTH Authentication required."), "NOAUTH");
        assert_eq!(code("WRONGPASS invalid username-password pair"), "WRONGPASS");
    }

    #[test]
    fn an_error_without_a_short_first_word_is_err() {
        assert_eq!(code("TIMEOUT"), "ERR");
        assert_eq!(code(" leading space"), "ERR");
        assert_eq!(code(&format!("{} word", "X".repeat(30))), "XXXXXXXXXXXXXXXXXXXXXXXXXXXXXX");
        assert_eq!(code(&format!("{} word", "X".repeat(31))), "ERR");
    }

    #[test]
    fn a_call_that_ran_counts_time_and_latency_and_fails_on_an_error() {
        let stats = Stats::new(2);
        let row = Row(0);
        let parsed = Instant::now();
        stats.replied(Call::Ran(row, parsed), &Frame::ok(), parsed + Duration::from_micros(10));
        stats.replied(Call::Ran(row, parsed), &Frame::error("ERR boom"), parsed + Duration::from_micros(30));
        let c = stats.calls(row);
        assert_eq!((c.calls, c.nanos, c.rejected, c.failed), (2, 40_000, 0, 1));
        assert_eq!(c.latency.as_ref().map(|h| h.len()), Some(2));
        assert_eq!(stats.errors().total, 1);
    }

    #[test]
    fn a_rejected_or_unknown_call_counts_no_call_and_no_latency() {
        let stats = Stats::new(2);
        let now = Instant::now();
        stats.replied(Call::Rejected(Row(1)), &Frame::error("NOAUTH Authentication required."), now);
        stats.replied(Call::Unknown, &Frame::error("ERR unknown command 'x'"), now);
        let c = stats.calls(Row(1));
        assert_eq!((c.calls, c.rejected, c.failed), (0, 1, 0));
        assert!(c.latency.is_none());
        let errors = stats.errors();
        assert_eq!(errors.total, 2);
        assert_eq!(errors.by_code.iter().map(|(k, v)| (k.as_str(), *v)).collect::<Vec<_>>(), [("ERR", 1), ("NOAUTH", 1)]);
    }

    #[test]
    fn reset_forgets_calls_errors_and_latency() {
        let stats = Stats::new(2);
        let now = Instant::now();
        stats.replied(Call::Ran(Row(0), now), &Frame::error("ERR boom"), now);
        stats.reset();
        let c = stats.calls(Row(0));
        assert_eq!((c.calls, c.failed), (0, 0));
        assert!(c.latency.is_none());
        assert_eq!(stats.errors().total, 0);
        assert!(stats.errors().by_code.is_empty());
    }

    #[test]
    fn percentiles_round_the_rank_to_the_nearest_sample_as_redis_does() {
        let mut h = Histogram::<u64>::new_with_bounds(1, 1_000_000_000, 2).unwrap();
        // 60 samples: p99 is rank 59.4, which Redis rounds to 59 (1 µs)
        // where rounding up gives 60 (the 2 ms outlier).
        for _ in 0..59 {
            h.record(1_000).unwrap();
        }
        h.record(2_000_000).unwrap();
        assert_eq!(at_percentile(&h, 99.0), h.highest_equivalent(1_000));
        assert_eq!(at_percentile(&h, 99.9), h.highest_equivalent(2_000_000));
        assert_eq!(at_percentile(&h, 50.0), h.highest_equivalent(1_000));
    }
}
