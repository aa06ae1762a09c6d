//! Remote visibility, live (Eunomia Figure 6 as an operator sees it): per
//! origin site, how long after its timestamp each of its updates became
//! stable in this site's chains, as p50 and p99 over the last minute.
//!
//! The receiver's node (the site's leader) records an update when its head
//! reports it stable (`GeoMsg::Applied`) and summarizes once a second; the
//! summary travels to every node of the site in `GeoMsg::SiteTime`, so
//! `INFO` and `CW.SITES` show it anywhere. The delay counts from the
//! origin's hybrid timestamp to this site's wall clock: the link's delay
//! included, and any skew between the two sites' clocks too.

use crate::hlc::Timestamp;
pub use crate::message::geo::Delays;
use crate::version::SiteId;
use std::collections::{BTreeMap, VecDeque};

/// Samples older than this are dropped.
pub const WINDOW_MS: u64 = 60_000;
/// At most this many samples per origin (the latest): under heavy load the
/// window is shorter than a minute.
pub const MAX_SAMPLES: usize = 10_000;
/// How often the leader summarizes.
pub const SUMMARY_MS: u64 = 1_000;

#[derive(Debug, Default)]
pub struct Visibility {
    /// Per origin: (when it became stable here, its delay), oldest first.
    samples: BTreeMap<SiteId, VecDeque<(u64, u64)>>,
    summary: BTreeMap<SiteId, Delays>,
    summarized_ms: u64,
}

impl Visibility {
    /// An update of `origin` timestamped `ts` became stable here at `now_ms`.
    pub fn record(&mut self, origin: SiteId, ts: Timestamp, now_ms: u64) {
        let s = self.samples.entry(origin).or_default();
        if s.len() == MAX_SAMPLES {
            s.pop_front();
        }
        s.push_back((now_ms, now_ms.saturating_sub(ts.physical_ms())));
    }

    /// Recomputes the summary if `SUMMARY_MS` passed since the last time;
    /// returns whether it did.
    pub fn summarize(&mut self, now_ms: u64) -> bool {
        if now_ms.saturating_sub(self.summarized_ms) < SUMMARY_MS {
            return false;
        }
        self.summarized_ms = now_ms;
        self.summary.clear();
        for (&origin, s) in self.samples.iter_mut() {
            while s.front().is_some_and(|&(at, _)| now_ms.saturating_sub(at) > WINDOW_MS) {
                s.pop_front();
            }
            let mut delays: Vec<u64> = s.iter().map(|&(_, d)| d).collect();
            if delays.is_empty() {
                continue;
            }
            delays.sort_unstable();
            let at = |q: f64| delays[((delays.len() - 1) as f64 * q).round() as usize];
            self.summary.insert(origin, Delays { p50_ms: at(0.50), p99_ms: at(0.99), count: delays.len() as u64 });
        }
        self.samples.retain(|_, s| !s.is_empty());
        true
    }

    /// The last summary, per origin (origins with no update in the window
    /// are absent).
    pub fn summary(&self) -> &BTreeMap<SiteId, Delays> {
        &self.summary
    }

    /// The leader's summary, on the other nodes of the site.
    pub fn adopt(&mut self, summary: BTreeMap<SiteId, Delays>) {
        self.summary = summary;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_over_the_last_minute() {
        let mut v = Visibility::default();
        // 100 updates of site 1, 40..=139 ms after their timestamps.
        for i in 0..100 {
            let at = 1_000 + i;
            v.record(1, Timestamp::new(at - 40 - i, 0), at);
        }
        assert!(v.summarize(2_000));
        assert_eq!(v.summary()[&1], Delays { p50_ms: 90, p99_ms: 138, count: 100 });
        assert!(!v.summarize(2_500), "once a second");
        // A minute later those are gone; one new one is all there is.
        v.record(1, Timestamp::new(70_000, 0), 70_005);
        assert!(v.summarize(70_010));
        assert_eq!(v.summary()[&1], Delays { p50_ms: 5, p99_ms: 5, count: 1 });
        // And with nothing in the window, the origin is not listed.
        assert!(v.summarize(200_000));
        assert!(v.summary().is_empty());
    }

    #[test]
    fn keeps_the_latest_samples_under_load() {
        let mut v = Visibility::default();
        for i in 0..(MAX_SAMPLES as u64 + 10) {
            v.record(2, Timestamp::new(0, 0), i);
        }
        v.summarize(MAX_SAMPLES as u64 + 10);
        assert_eq!(v.summary()[&2].count, MAX_SAMPLES as u64);
        assert_eq!(v.summary()[&2].p50_ms, 5_010);
    }
}
