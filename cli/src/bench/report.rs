//! Latency recording for a benchmark run and the report printed at its end.
//!
//! Latencies go into HdrHistograms (as YCSB's `hdrhistogram` measurement type
//! does) so that tail percentiles stay accurate without keeping every sample,
//! and per-client recorders can be merged after the run.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

/// Histogram range in microseconds: 1 us to 60 s; slower operations are clamped to 60 s.
const LOWEST_US: u64 = 1;
const HIGHEST_US: u64 = 60_000_000;
const SIGNIFICANT_DIGITS: u8 = 3;

#[derive(Clone, Debug)]
struct OpStats {
    latency: Histogram<u64>,
    errors: u64,
}

impl OpStats {
    fn new() -> Self {
        Self {
            latency: Histogram::new_with_bounds(LOWEST_US, HIGHEST_US, SIGNIFICANT_DIGITS).expect("constant histogram bounds are valid"),
            errors: 0,
        }
    }
}

/// Per-operation latency histograms and error counts of one client (or, after
/// [`Recorder::merge`], of a whole run). Recording is allocation-free after an
/// operation's first sample, so clients can record on their hot path without locks.
#[derive(Clone, Debug, Default)]
pub struct Recorder {
    ops: BTreeMap<&'static str, OpStats>,
}

impl Recorder {
    /// An empty recorder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records one successful `op` that took `micros` microseconds; anything over
    /// 60 s counts as 60 s rather than being lost.
    pub fn record(&mut self, op: &'static str, micros: u64) {
        self.stats(op).latency.saturating_record(micros);
    }

    /// Records one failed `op`. Failures are kept out of the latency histograms and
    /// throughput, so fast failures cannot make a run look better.
    pub fn record_error(&mut self, op: &'static str) {
        self.stats(op).errors += 1;
    }

    /// Adds another recorder's samples and errors, to combine clients after a run.
    pub fn merge(&mut self, other: &Recorder) {
        for (&op, theirs) in &other.ops {
            let mine = self.stats(op);
            mine.latency.add(&theirs.latency).expect("histograms with identical bounds always add");
            mine.errors += theirs.errors;
        }
    }

    /// Successful operations of all kinds (errors excluded), e.g. for progress output.
    pub fn total_ops(&self) -> u64 {
        self.ops.values().map(|stats| stats.latency.len()).sum()
    }

    fn stats(&mut self, op: &'static str) -> &mut OpStats {
        self.ops.entry(op).or_insert_with(OpStats::new)
    }
}

/// Results for one operation kind. Latencies are in microseconds.
#[derive(Serialize, Clone, Debug)]
pub struct OpSummary {
    /// The operation name given to [`Recorder::record`].
    pub op: String,
    /// Successful operations.
    pub count: u64,
    /// Failed operations (not in `count` or the latencies).
    pub errors: u64,
    /// Successful operations per second of wall-clock time.
    pub ops_per_sec: f64,
    /// Median latency.
    pub p50_us: u64,
    /// 99th-percentile latency.
    pub p99_us: u64,
    /// 99.9th-percentile latency.
    pub p999_us: u64,
    /// Slowest operation (clamped at 60 s).
    pub max_us: u64,
    /// Mean latency.
    pub mean_us: f64,
}

/// The outcome of a benchmark run, printed as a table for people or as JSON for
/// scripts that compare runs.
#[derive(Serialize, Clone, Debug)]
pub struct Report {
    /// What was benchmarked, e.g. the server address.
    pub target: String,
    /// The workload's name, e.g. "A".
    pub workload: String,
    /// Concurrent clients.
    pub clients: usize,
    /// Wall-clock length of the measured phase.
    pub duration_secs: f64,
    /// Successful operations of all kinds.
    pub total_ops: u64,
    /// Successful operations per second, all kinds together.
    pub ops_per_sec: f64,
    /// One entry per operation kind, sorted by name.
    pub ops: Vec<OpSummary>,
    /// Free-form remarks for the reader (warnings, settings); empty from [`Report::new`].
    pub notes: Vec<String>,
}

impl Report {
    /// Summarises `rec` for a run of `elapsed` wall-clock time.
    pub fn new(target: &str, workload: &str, clients: usize, elapsed: Duration, rec: &Recorder) -> Self {
        let secs = elapsed.as_secs_f64();
        // A zero-length run has no meaningful rate; 0 keeps the JSON free of NaN/null.
        let rate = |count: u64| if secs > 0.0 { count as f64 / secs } else { 0.0 };
        let ops = rec
            .ops
            .iter()
            .map(|(op, stats)| {
                let h = &stats.latency;
                OpSummary {
                    op: (*op).to_owned(),
                    count: h.len(),
                    errors: stats.errors,
                    ops_per_sec: rate(h.len()),
                    p50_us: h.value_at_quantile(0.5),
                    p99_us: h.value_at_quantile(0.99),
                    p999_us: h.value_at_quantile(0.999),
                    max_us: h.max(),
                    mean_us: h.mean(),
                }
            })
            .collect();
        let total_ops = rec.total_ops();
        Self {
            target: target.to_owned(),
            workload: workload.to_owned(),
            clients,
            duration_secs: secs,
            total_ops,
            ops_per_sec: rate(total_ops),
            ops,
            notes: Vec::new(),
        }
    }

    /// A fixed-width table: a header line, one row per operation kind, a total
    /// row, then the notes.
    pub fn to_table(&self) -> String {
        let name_width = self.ops.iter().map(|s| s.op.len()).chain([5]).max().unwrap_or(5);
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = writeln!(out, "workload {} against {}: {} clients, {:.2} s", self.workload, self.target, self.clients, self.duration_secs);
        let _ = writeln!(
            out,
            "{:<name_width$} {:>10} {:>10} {:>9} {:>9} {:>9} {:>9} {:>8}",
            "op", "count", "ops/s", "p50", "p99", "p99.9", "max", "errors"
        );
        for s in &self.ops {
            let _ = writeln!(
                out,
                "{:<name_width$} {:>10} {:>10.0} {:>9} {:>9} {:>9} {:>9} {:>8}",
                s.op,
                s.count,
                s.ops_per_sec,
                format_latency(s.p50_us),
                format_latency(s.p99_us),
                format_latency(s.p999_us),
                format_latency(s.max_us),
                s.errors
            );
        }
        let errors: u64 = self.ops.iter().map(|s| s.errors).sum();
        let _ = writeln!(
            out,
            "{:<name_width$} {:>10} {:>10.0} {:>9} {:>9} {:>9} {:>9} {:>8}",
            "total", self.total_ops, self.ops_per_sec, "", "", "", "", errors
        );
        for note in &self.notes {
            let _ = writeln!(out, "note: {note}");
        }
        out
    }

    /// Pretty-printed JSON with the struct's field names.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a Report always serializes")
    }
}

/// Microseconds below 1 ms, milliseconds with two decimals above, so a column
/// stays readable from cache hits to timeouts.
fn format_latency(micros: u64) -> String {
    if micros < 1_000 {
        format!("{micros}us")
    } else {
        format!("{:.2}ms", micros as f64 / 1_000.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recorder_1_to_1000() -> Recorder {
        let mut rec = Recorder::new();
        for us in 1..=1_000 {
            rec.record("read", us);
        }
        rec
    }

    #[test]
    fn percentiles_of_known_inputs() {
        let report = Report::new("t", "A", 1, Duration::from_secs(2), &recorder_1_to_1000());
        let read = &report.ops[0];
        assert_eq!(read.op, "read");
        assert_eq!(read.count, 1_000);
        // Values below 2048 are exact at 3 significant digits.
        assert_eq!(read.p50_us, 500);
        assert_eq!(read.p99_us, 990);
        assert_eq!(read.p999_us, 999);
        assert_eq!(read.max_us, 1_000);
        assert!((read.mean_us - 500.5).abs() < 1e-9);
        assert!((read.ops_per_sec - 500.0).abs() < 1e-9);
        assert_eq!(report.total_ops, 1_000);
        assert!((report.ops_per_sec - 500.0).abs() < 1e-9);
    }

    #[test]
    fn percentiles_keep_three_significant_digits_at_large_values() {
        let mut rec = Recorder::new();
        rec.record("update", 123_456);
        let report = Report::new("t", "A", 1, Duration::from_secs(1), &rec);
        let p50 = report.ops[0].p50_us;
        assert!((123_000..=123_600).contains(&p50), "{p50}");
    }

    #[test]
    fn latencies_beyond_range_are_clamped_not_lost() {
        let mut rec = Recorder::new();
        rec.record("read", 0);
        rec.record("read", 3_600_000_000);
        assert_eq!(rec.total_ops(), 2);
        let report = Report::new("t", "A", 1, Duration::from_secs(1), &rec);
        let max = report.ops[0].max_us;
        assert!((HIGHEST_US..HIGHEST_US + HIGHEST_US / 100).contains(&max), "{max}");
    }

    #[test]
    fn merge_adds_counts_and_errors() {
        let mut a = recorder_1_to_1000();
        a.record_error("read");
        let mut b = recorder_1_to_1000();
        b.record("insert", 50);
        b.record_error("read");
        b.record_error("mget");
        a.merge(&b);
        assert_eq!(a.total_ops(), 2_001);
        let report = Report::new("t", "D", 2, Duration::from_secs(1), &a);
        let names: Vec<&str> = report.ops.iter().map(|s| s.op.as_str()).collect();
        assert_eq!(names, ["insert", "mget", "read"], "sorted by name");
        let read = &report.ops[2];
        assert_eq!((read.count, read.errors), (2_000, 2));
        assert_eq!(read.p50_us, 500);
        let mget = &report.ops[1];
        assert_eq!((mget.count, mget.errors, mget.max_us), (0, 1, 0));
        assert_eq!(mget.mean_us, 0.0);
    }

    #[test]
    fn zero_duration_gives_zero_rate() {
        let report = Report::new("t", "A", 1, Duration::ZERO, &recorder_1_to_1000());
        assert_eq!(report.ops_per_sec, 0.0);
        assert_eq!(report.ops[0].ops_per_sec, 0.0);
    }

    #[test]
    fn json_round_trips_with_all_fields() {
        let mut rec = recorder_1_to_1000();
        rec.record_error("update");
        let mut report = Report::new("127.0.0.1:6379", "A", 8, Duration::from_millis(1_500), &rec);
        report.notes.push("warm-up skipped".into());
        let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
        assert_eq!(json["target"], "127.0.0.1:6379");
        assert_eq!(json["workload"], "A");
        assert_eq!(json["clients"], 8);
        assert_eq!(json["duration_secs"], 1.5);
        assert_eq!(json["total_ops"], 1_000);
        assert!(json["ops_per_sec"].is_f64());
        assert_eq!(json["notes"][0], "warm-up skipped");
        let ops = json["ops"].as_array().unwrap();
        assert_eq!(ops.len(), 2);
        for field in ["op", "count", "errors", "ops_per_sec", "p50_us", "p99_us", "p999_us", "max_us", "mean_us"] {
            assert!(ops[0].get(field).is_some(), "missing {field}");
        }
        assert_eq!(ops[0]["p99_us"], 990);
        assert_eq!(ops[1]["op"], "update");
        assert_eq!(ops[1]["errors"], 1);
    }

    #[test]
    fn table_has_a_row_per_op_and_a_total() {
        let mut rec = recorder_1_to_1000();
        rec.record("rmw", 2_500);
        rec.record_error("rmw");
        let mut report = Report::new("host:1", "F", 4, Duration::from_secs(1), &rec);
        report.notes.push("hello".into());
        let table = report.to_table();
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 6, "{table}");
        assert!(lines[0].contains("workload F against host:1"), "{table}");
        assert!(lines[1].starts_with("op "), "{table}");
        assert!(lines[2].starts_with("read "), "{table}");
        assert!(lines[2].contains("500us") && lines[2].contains("1.00ms"), "{table}");
        assert!(lines[3].starts_with("rmw ") && lines[3].contains("2.50ms"), "{table}");
        assert!(lines[4].starts_with("total "), "{table}");
        let total: Vec<&str> = lines[4].split_whitespace().collect();
        assert_eq!(total, ["total", "1001", "1001", "1"]);
        assert_eq!(lines[5], "note: hello");
        // Every row is as wide as the header.
        assert!(lines[1..5].iter().all(|l| l.len() == lines[1].len()), "{table}");
    }

    #[test]
    fn latency_formatting() {
        assert_eq!(format_latency(0), "0us");
        assert_eq!(format_latency(999), "999us");
        assert_eq!(format_latency(1_000), "1.00ms");
        assert_eq!(format_latency(12_345), "12.35ms");
        assert_eq!(format_latency(60_000_000), "60000.00ms");
    }
}
