//! The client library's metadata, ChainReaction §3.2.2 and §3.3.2.
//!
//! * The *index table*: for each key whose observed version is not yet known
//!   stable, that version and the deepest chain position known to hold it.
//!   A later read of the key must go to a position <= that index; once the
//!   version is stable it may go anywhere, and the entry is dropped (a stable
//!   version constrains nothing, which keeps the table small).
//! * The *accessed objects*: the unstable versions read or written since the
//!   last write. The next write first waits for all of them to be stable
//!   (dependency stabilization), which is what keeps version divergence one
//!   level deep.
//!   The table also forgets entries as replies say how far their
//!   partitions are stable (`stable_through`): a session that only writes
//!   never reads its keys back stable, and without this kept every key it
//!   ever wrote.
//! * `past`: per site, the latest timestamp of that site's updates the
//!   session has seen, directly or as a dependency of what it saw (Eunomia
//!   §4's client vector). A write's version vector is this vector with its
//!   own timestamp in its site's entry, so a site that receives the write
//!   applies it only after what it depends on from third sites. Writes are
//!   ordered after its largest entry (`max_ts`) and get-transactions read at
//!   or after it, so a session never goes back in time.
//!
//! A session can be exported as a token and resumed elsewhere (another
//! connection, another node): `CW.SESSION`.

use crate::error::Error;
use crate::hlc::Timestamp;
use crate::message::Item;
use crate::ring::PartitionId;
use crate::version::{Version, VersionVector};
use ahash::AHashMap;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Tracked places beyond twice the index before the replaced ones go
/// (`Session::untrack_replaced`).
const UNTRACK_SLACK: usize = 64;

/// What the session knows about one key's latest observed version.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Seen {
    pub version: Version,
    /// The version's place in its partition's update order.
    pub seq: u64,
    /// The deepest chain position known to hold `version`.
    pub chain_index: u8,
}

/// A version the next write depends on, with its place in its partition's
/// update order (what `WaitStable` waits for).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dep {
    pub version: Version,
    pub seq: u64,
}

/// One client's causal metadata.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Session {
    index: AHashMap<Bytes, Seen>,
    accessed: AHashMap<Bytes, Dep>,
    past: VersionVector,
    /// What the session last heard its site had applied of each other
    /// site (`Message::Snapshot`).
    site_time: VersionVector,
    /// The id of the newest write of its own it has seen acknowledged.
    last_write: u64,
    /// The keys of `index` by partition and the place of their version in
    /// the partition's order: what `stable_through` forgets (a version seen
    /// again is here once; one replaced since stays until its place is
    /// stable, bounded by `untrack_replaced`). Not in a token (which keeps
    /// the format every release reads): a resumed session's entries go as
    /// it sees their keys stable.
    #[serde(skip)]
    tracked: BTreeMap<(PartitionId, u64), Bytes>,
}

impl Session {
    /// The largest chain position this session may read `key` from, or
    /// `None` if any position will do.
    pub fn read_limit(&self, key: &[u8]) -> Option<u8> {
        self.index.get(key).map(|s| s.chain_index)
    }

    /// The version of `key` a replica must hold to serve this session.
    pub fn min_version(&self, key: &[u8]) -> Option<&Version> {
        self.index.get(key).map(|s| &s.version)
    }

    pub fn max_ts(&self) -> Timestamp {
        self.past.max()
    }

    /// The session's causal past, per site.
    pub fn past(&self) -> &VersionVector {
        &self.past
    }

    /// Remembers what a node said its site has applied of other sites.
    pub fn observe_site_time(&mut self, site_time: &VersionVector) {
        self.site_time.merge(site_time);
    }

    /// How far a get-transaction may see other sites' writes: what the
    /// site was last heard to have applied, and what this session saw
    /// here (every earlier write of that site was applied before it).
    pub fn snapshot_bound(&self) -> VersionVector {
        let mut bound = self.site_time.clone();
        bound.merge(&self.past);
        bound
    }

    /// Records a read served at chain position `at` (§3.3.2 rules i–iii).
    pub fn observe_read(&mut self, partition: PartitionId, key: &Bytes, item: &Item, at: u8) {
        let Some(version) = &item.version else { return };
        self.past.merge(&version.vv);
        if item.stable {
            self.forget(key, version);
            return;
        }
        let chain_index = match self.index.get(key) {
            Some(seen) if seen.version == *version => seen.chain_index.max(at),
            Some(seen) if seen.version > *version => return, // older than what we saw: keep ours
            _ => at,
        };
        // Kept in a copy of its own: the key of a read may be a slice of a
        // connection's read buffer, which this would keep whole.
        let key = Bytes::copy_from_slice(key);
        self.note_accessed(&key, Dep { version: version.clone(), seq: item.seq });
        self.index.insert(key.clone(), Seen { version: version.clone(), seq: item.seq, chain_index });
        self.track(partition, item.seq, key);
    }

    fn track(&mut self, partition: PartitionId, seq: u64, key: Bytes) {
        self.tracked.insert((partition, seq), key);
        if self.tracked.len() > 2 * self.index.len() + UNTRACK_SLACK {
            self.untrack_replaced();
        }
    }

    /// Drops the tracked places of versions the index no longer holds (a
    /// key written or read newer since): at most twice the index is
    /// tracked, so this runs at most once per `index.len()` observations.
    fn untrack_replaced(&mut self) {
        let index = &self.index;
        self.tracked.retain(|&(_, seq), key| index.get(key).is_some_and(|s| s.seq == seq));
    }

    /// Records this session's own write `write` (its id), acknowledged at
    /// `chain_index`. The accessed list restarts with just this write. The
    /// acknowledgement of an earlier write of a pipeline may arrive after a
    /// later one's: the later write was ordered once the earlier one was
    /// stable, so the earlier one adds nothing to wait for.
    #[allow(clippy::too_many_arguments)]
    pub fn observe_write(
        &mut self,
        partition: PartitionId,
        key: &Bytes,
        version: &Version,
        seq: u64,
        chain_index: u8,
        stable: bool,
        write: u64,
    ) {
        self.past.merge(&version.vv);
        // Kept in a copy of its own, as a read's: the key of a write is a
        // slice of the connection's read buffer, which this would keep
        // whole (and the connection would allocate another).
        if write < self.last_write {
            if !stable && self.index.get(key).is_none_or(|s| s.version < *version) {
                let key = Bytes::copy_from_slice(key);
                self.index.insert(key.clone(), Seen { version: version.clone(), seq, chain_index });
                self.track(partition, seq, key);
            }
            return;
        }
        self.last_write = write;
        self.accessed.clear();
        if stable {
            self.index.remove(key);
        } else {
            let key = Bytes::copy_from_slice(key);
            self.index.insert(key.clone(), Seen { version: version.clone(), seq, chain_index });
            self.accessed.insert(key.clone(), Dep { version: version.clone(), seq });
            self.track(partition, seq, key);
        }
    }

    /// A replica of `partition` said every update of it up to `seq` is
    /// stable: the session's writes there up to `seq` constrain nothing
    /// any more.
    pub fn stable_through(&mut self, partition: PartitionId, seq: u64) {
        for (_, key) in self.tracked.extract_if((partition, 0)..=(partition, seq), |_, _| true) {
            if self.index.get(&key).is_some_and(|s| s.seq <= seq) {
                self.index.remove(&key);
            }
            if self.accessed.get(&key).is_some_and(|d| d.seq <= seq) {
                self.accessed.remove(&key);
            }
        }
    }

    /// The id of the newest write of its own this session has seen
    /// acknowledged (the accessed objects restarted with it).
    pub fn last_write(&self) -> u64 {
        self.last_write
    }

    fn note_accessed(&mut self, key: &Bytes, dep: Dep) {
        match self.accessed.get(key) {
            Some(d) if d.version >= dep.version => {}
            _ => {
                self.accessed.insert(key.clone(), dep);
            }
        }
    }

    /// `version` of `key` is known to be stable.
    pub fn forget(&mut self, key: &[u8], version: &Version) {
        if self.index.get(key).is_some_and(|s| s.version <= *version) {
            self.index.remove(key);
        }
        if self.accessed.get(key).is_some_and(|d| d.version <= *version) {
            self.accessed.remove(key);
        }
    }

    /// The versions the next write must wait for, by key (a fixed order,
    /// so a simulated run replays exactly).
    pub fn dependencies(&self) -> impl Iterator<Item = (&Bytes, &Dep)> {
        let mut deps: Vec<(&Bytes, &Dep)> = self.accessed.iter().collect();
        deps.sort_unstable_by(|a, b| a.0.cmp(b.0));
        deps.into_iter()
    }

    /// Forget everything (after FLUSHALL).
    pub fn clear(&mut self) {
        *self = Session::default();
    }

    /// Keys with constraints (for `CW.SESSION INFO`).
    pub fn tracked_keys(&self) -> usize {
        self.index.len()
    }

    /// The session as an opaque token, to resume it elsewhere.
    pub fn export(&self) -> Vec<u8> {
        crate::wire::encode(self)
    }

    /// Resumes a session from `export`'s token, refusing tokens with
    /// timestamps implausibly far ahead of `now_ms`.
    pub fn import(token: &[u8], now_ms: u64) -> Result<Session, Error> {
        let s: Session = crate::wire::decode(token).map_err(|e| Error::InvalidInput(format!("invalid session token: {e}")))?;
        if s.max_ts().physical_ms() > now_ms.saturating_add(crate::hlc::MAX_CLOCK_SKEW_MS) {
            return Err(Error::InvalidInput(format!(
                "invalid session token: its clock ({} ms) is ahead of this node's ({now_ms} ms)",
                s.max_ts().physical_ms()
            )));
        }
        Ok(s)
    }

    /// The session's unstable version of `key`, if any.
    pub fn seen(&self, key: &[u8]) -> Option<&Seen> {
        self.index.get(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(ms: u64) -> Version {
        Version::local(0, Timestamp::new(ms, 0))
    }

    fn item(ms: u64, stable: bool) -> Item {
        Item { value: Some(Bytes::from("x")), version: Some(v(ms)), seq: ms, stable, expires_at_ms: None }
    }

    #[test]
    fn read_rules_follow_the_paper() {
        let mut s = Session::default();
        let k = Bytes::from("k");
        s.observe_read(0, &k, &item(10, false), 1);
        assert_eq!(s.read_limit(b"k"), Some(1));
        // Same version seen deeper: index grows (rule ii).
        s.observe_read(0, &k, &item(10, false), 2);
        assert_eq!(s.read_limit(b"k"), Some(2));
        // A newer version: index is where it was read (rule iii).
        s.observe_read(0, &k, &item(20, false), 0);
        assert_eq!(s.read_limit(b"k"), Some(0));
        // An older version never replaces a newer one.
        s.observe_read(0, &k, &item(10, false), 2);
        assert_eq!(s.min_version(b"k"), Some(&v(20)));
        // Stable: no constraint left (rule i).
        s.observe_read(0, &k, &item(20, true), 2);
        assert_eq!(s.read_limit(b"k"), None);
        assert_eq!(s.dependencies().count(), 0);
        assert_eq!(s.max_ts(), Timestamp::new(20, 0));
    }

    #[test]
    fn a_write_resets_accessed_objects_to_itself() {
        let mut s = Session::default();
        s.observe_read(0, &Bytes::from("a"), &item(10, false), 0);
        s.observe_read(0, &Bytes::from("b"), &item(11, false), 0);
        assert_eq!(s.dependencies().count(), 2);
        s.observe_write(0, &Bytes::from("c"), &v(12), 12, 1, false, 1);
        let deps: Vec<_> = s.dependencies().map(|(k, _)| k.clone()).collect();
        assert_eq!(deps, vec![Bytes::from("c")]);
        // The reads still constrain where those keys may be read.
        assert_eq!(s.read_limit(b"a"), Some(0));
    }

    #[test]
    fn an_earlier_write_acknowledged_late_does_not_reset_accessed_objects() {
        let mut s = Session::default();
        s.observe_write(0, &Bytes::from("b"), &v(13), 13, 1, false, 2);
        s.observe_write(0, &Bytes::from("a"), &v(12), 12, 1, false, 1);
        let deps: Vec<_> = s.dependencies().map(|(k, _)| k.clone()).collect();
        assert_eq!(deps, vec![Bytes::from("b")], "the later write waited for the earlier one to be stable");
        assert_eq!(s.read_limit(b"a"), Some(1));
        assert_eq!(s.max_ts(), Timestamp::new(13, 0));
    }

    #[test]
    fn a_session_that_only_writes_forgets_its_writes_once_told_they_are_stable() {
        let mut s = Session::default();
        for (i, key) in ["a", "b", "c"].into_iter().enumerate() {
            s.observe_write(7, &Bytes::from(key), &v(10 + i as u64), 10 + i as u64, 1, false, i as u64 + 1);
        }
        s.observe_write(8, &Bytes::from("d"), &v(20), 3, 1, false, 4);
        assert_eq!(s.tracked_keys(), 4);
        // Another partition's watermark says nothing of partition 7.
        s.stable_through(9, 100);
        assert_eq!(s.tracked_keys(), 4);
        s.stable_through(7, 11);
        assert_eq!((s.read_limit(b"a"), s.read_limit(b"b"), s.read_limit(b"c")), (None, None, Some(1)));
        assert_eq!(s.dependencies().count(), 1, "the last write, c, is still a dependency");
        // A key written again keeps its newer version.
        s.observe_write(7, &Bytes::from("c"), &v(30), 15, 1, false, 5);
        s.stable_through(7, 12);
        assert_eq!(s.min_version(b"c"), Some(&v(30)));
        s.stable_through(7, 15);
        s.stable_through(8, 3);
        assert_eq!(s.tracked_keys(), 0);
        assert_eq!(s.dependencies().count(), 0);
        assert!(s.tracked.is_empty());
    }

    #[test]
    fn keys_read_again_and_again_are_tracked_a_bounded_number_of_times() {
        let mut s = Session::default();
        for i in 0..10_000u64 {
            let key = Bytes::from(format!("k{}", i % 3));
            s.observe_read(5, &key, &item(10 + i, false), 0);
        }
        assert_eq!(s.tracked_keys(), 3);
        assert!(s.tracked.len() <= 2 * 3 + UNTRACK_SLACK, "{}", s.tracked.len());
        s.stable_through(5, 10_009);
        assert_eq!(s.tracked_keys(), 0);
        // One unstable version read again and again (its tail lags).
        for at in 0..10_000u64 {
            s.observe_read(5, &Bytes::from("k"), &item(20_000, false), (at % 3) as u8);
        }
        assert_eq!(s.tracked.len(), 1);
    }

    #[test]
    fn tokens_round_trip_and_reject_garbage() {
        let mut s = Session::default();
        s.observe_write(0, &Bytes::from("c"), &v(12), 12, 1, false, 1);
        assert_eq!(Session::import(&s.export(), 12).unwrap().export(), s.export());
        assert!(Session::import(b"\xff\xff garbage", 12).is_err());
        let mut future = Session::default();
        future.observe_write(0, &Bytes::from("c"), &v(10_000_000), 1, 1, false, 1);
        assert!(Session::import(&future.export(), 12).is_err());
    }
}
