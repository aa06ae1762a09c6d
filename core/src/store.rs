//! The versions one replica holds for one partition.
//!
//! A key keeps its latest version plus the few before it that were replaced
//! moments ago: get-transactions read "the latest version at or before
//! timestamp S" at the chain heads (see `chain`), and S is at most a few
//! milliseconds old, so a short history is enough. Older history is dropped
//! and a read that would need it is refused as `SnapshotTooOld` (the caller
//! retries with a fresh S) rather than answered wrongly.
//!
//! Deletes are tombstone versions (value `None`) so that they order and
//! replicate like any write. Expired values read as absent; nothing expires
//! them actively yet (memory is reclaimed when the key is written again).

use crate::hlc::Timestamp;
use crate::version::Version;
use ahash::AHashMap;
use bytes::Bytes;
use smallvec::SmallVec;

/// How long a replaced version stays readable by snapshots.
pub const RETAIN_MS: u64 = 5_000;
/// At most this many versions of one key are kept, whatever their age.
pub const MAX_VERSIONS: usize = 8;

/// One version of one key as stored.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Stored {
    pub version: Version,
    /// The position of the write in its partition's update order (assigned by
    /// the head); a replica's `stable` watermark is compared against it.
    pub seq: u64,
    /// `None` is a tombstone.
    pub value: Option<Bytes>,
    pub expires_at_ms: Option<u64>,
}

impl Stored {
    /// The value as a reader at `now_ms` sees it.
    pub fn live_value(&self, now_ms: u64) -> Option<&Bytes> {
        match self.expires_at_ms {
            Some(at) if at <= now_ms => None,
            _ => self.value.as_ref(),
        }
    }
}

#[derive(Debug, Default)]
struct History {
    /// Oldest first; ordered by version.
    versions: SmallVec<[Stored; 1]>,
    /// Whether versions older than `versions[0]` were dropped.
    truncated: bool,
}

/// A key absent from the retained history at the requested time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooOld;

/// All keys of one partition at one replica.
#[derive(Debug, Default)]
pub struct PartitionStore {
    keys: AHashMap<Bytes, History>,
}

impl PartitionStore {
    /// Installs a version. An older version than the latest (a concurrent
    /// write that lost last-writer-wins, possible once several sites write)
    /// is kept in order so snapshots stay exact; the same version twice is
    /// ignored.
    pub fn apply(&mut self, key: Bytes, stored: Stored, now_ms: u64) {
        let h = self.keys.entry(key).or_default();
        let pos = h.versions.partition_point(|s| s.version < stored.version);
        if h.versions.get(pos).is_some_and(|s| s.version == stored.version) {
            return;
        }
        h.versions.insert(pos, stored);
        // Drop versions whose successor was written before the retention
        // window: no snapshot can ask for them any more.
        let keep_from = (1..h.versions.len())
            .find(|&i| h.versions[i].version.ts.physical_ms() + RETAIN_MS > now_ms)
            .map(|i| i - 1)
            .unwrap_or(h.versions.len() - 1)
            .max(h.versions.len().saturating_sub(MAX_VERSIONS));
        if keep_from > 0 {
            h.versions.drain(..keep_from);
            h.truncated = true;
        }
    }

    /// Whether `version` of `key` is here (or older than what is kept):
    /// the seq to wait for before it counts as stable.
    pub fn holds(&self, key: &[u8], version: &Version) -> Option<u64> {
        let h = self.keys.get(key)?;
        if let Some(s) = h.versions.iter().find(|s| s.version == *version) {
            return Some(s.seq);
        }
        let older = h.truncated && h.versions.first().is_some_and(|s| *version < s.version);
        older.then(|| h.versions.last().expect("a truncated history keeps a version").seq)
    }

    pub fn latest(&self, key: &[u8]) -> Option<&Stored> {
        self.keys.get(key).and_then(|h| h.versions.last())
    }

    /// The latest version with a timestamp at or before `at`.
    pub fn at(&self, key: &[u8], at: Timestamp) -> Result<Option<&Stored>, TooOld> {
        self.latest_where(key, |v| v.ts <= at)
    }

    /// The latest version `visible` accepts.
    pub fn latest_where(&self, key: &[u8], visible: impl Fn(&Version) -> bool) -> Result<Option<&Stored>, TooOld> {
        let Some(h) = self.keys.get(key) else {
            return Ok(None);
        };
        match h.versions.iter().rev().find(|s| visible(&s.version)) {
            Some(s) => Ok(Some(s)),
            None if h.truncated => Err(TooOld),
            None => Ok(None),
        }
    }

    /// Keys with a live value at `now_ms`.
    pub fn keyspace(&self, now_ms: u64) -> crate::message::Keyspace {
        let mut k = crate::message::Keyspace::default();
        for s in self.keys.values().filter_map(|h| h.versions.last()).filter(|s| s.live_value(now_ms).is_some()) {
            k.keys += 1;
            k.expires += s.expires_at_ms.is_some() as u64;
        }
        k
    }

    /// Every key's latest version, sorted by key (to compare replicas).
    pub fn digest(&self) -> Vec<(Bytes, Stored)> {
        let mut all: Vec<_> = self.keys.iter().filter_map(|(k, h)| h.versions.last().map(|s| (k.clone(), s.clone()))).collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    /// Replaces everything with a state transfer's latest versions. Their
    /// history is unknown, so snapshot reads before them are refused.
    pub fn install(&mut self, entries: Vec<(Bytes, Stored)>) {
        self.keys = entries.into_iter().map(|(k, s)| (k, History { versions: smallvec::smallvec![s], truncated: true })).collect();
    }

    pub fn clear(&mut self) {
        self.keys.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(s: &mut PartitionStore, key: &str, ms: u64, seq: u64, now: u64) {
        let stored = Stored {
            version: Version::local(0, Timestamp::new(ms, 0)),
            seq,
            value: Some(Bytes::from(format!("v{seq}"))),
            expires_at_ms: None,
        };
        s.apply(Bytes::from(key.to_string()), stored, now);
    }

    #[test]
    fn reads_at_a_timestamp_from_recent_history() {
        let mut s = PartitionStore::default();
        put(&mut s, "k", 100, 1, 100);
        put(&mut s, "k", 200, 2, 200);
        assert_eq!(s.at(b"k", Timestamp::new(150, 0)).unwrap().unwrap().seq, 1);
        assert_eq!(s.at(b"k", Timestamp::new(250, 0)).unwrap().unwrap().seq, 2);
        assert_eq!(s.at(b"k", Timestamp::new(50, 0)), Ok(None));
        assert_eq!(s.latest(b"k").unwrap().seq, 2);
    }

    #[test]
    fn drops_old_history_and_says_so() {
        let mut s = PartitionStore::default();
        put(&mut s, "k", 100, 1, 100);
        put(&mut s, "k", 200, 2, 200);
        put(&mut s, "k", 10_000, 3, 10_000);
        assert_eq!(s.at(b"k", Timestamp::new(150, 0)), Err(TooOld));
        assert_eq!(s.at(b"k", Timestamp::new(10_001, 0)).unwrap().unwrap().seq, 3);
        for i in 0..20 {
            put(&mut s, "k", 10_001 + i, 4 + i, 10_001 + i);
        }
        assert_eq!(s.keys[&b"k"[..]].versions.len(), MAX_VERSIONS);
    }

    #[test]
    fn out_of_order_and_duplicate_versions() {
        let mut s = PartitionStore::default();
        put(&mut s, "k", 200, 2, 200);
        put(&mut s, "k", 100, 1, 200);
        put(&mut s, "k", 200, 2, 200);
        assert_eq!(s.latest(b"k").unwrap().seq, 2);
        assert_eq!(s.keys[&b"k"[..]].versions.len(), 2);
    }

    #[test]
    fn expired_values_read_as_absent() {
        let mut s = PartitionStore::default();
        let stored =
            Stored { version: Version::local(0, Timestamp::new(1, 0)), seq: 1, value: Some(Bytes::from("x")), expires_at_ms: Some(50) };
        s.apply(Bytes::from("k"), stored, 1);
        assert!(s.latest(b"k").unwrap().live_value(49).is_some());
        assert!(s.latest(b"k").unwrap().live_value(50).is_none());
        assert_eq!(s.keyspace(10), crate::message::Keyspace { keys: 1, expires: 1 });
        assert_eq!(s.keyspace(60).keys, 0);
    }
}
