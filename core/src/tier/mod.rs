//! The disk tier (`--disk-tier DIR`): past the memory budget, values move
//! to an embedded store on disk and come back into memory when read, by a
//! cache policy (`cache`), as in the p2p store's B+ tree with its cache.
//! Keys and their versions stay in memory (`store::entry`, flag ON_DISK),
//! so the chain, sessions and snapshots see every key as before; only the
//! bytes of a value are elsewhere.
//!
//! The tier is a node's own business: each replica moves its values out
//! and back on its own, and nothing about it crosses the network. The node
//! state machine never touches the disk: it asks for work (`Job`) and is
//! told what came of it (`Done`); the shell runs the jobs in order, off the
//! request loop, on a `Tier` (redb in `causeway-node`, `MemTier` in the
//! simulator and the tests).
//!
//! The tier keeps values by version (partition, key, version): a version
//! moved out again replaces nothing, so what a checkpoint names stays
//! until the node removes it (`Job::Remove`), once no checkpoint or
//! entry names it any more.

pub mod cache;

use crate::hlc::Timestamp;
use crate::ring::{NodeId, PartitionId};
use crate::version::SiteId;
use bytes::Bytes;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Mutex;

pub use cache::{Cache, CachePolicy};

/// Bytes before a value on disk: its version's timestamp and site.
pub const HEADER: usize = 10;

/// One version's value, as the tier names it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct ValueId {
    pub partition: PartitionId,
    pub key: Bytes,
    pub ts: Timestamp,
    pub site: SiteId,
}

impl ValueId {
    /// The tier's key: the partition (big-endian, so a partition's keys
    /// are together and in key order), the key, the version, and the key's
    /// length (so that no two ids share a tier key).
    pub fn disk_key(&self) -> Vec<u8> {
        let mut k = Vec::with_capacity(4 + self.key.len() + 14);
        k.extend_from_slice(&self.partition.to_be_bytes());
        k.extend_from_slice(&self.key);
        k.extend_from_slice(&self.ts.to_bits().to_be_bytes());
        k.extend_from_slice(&self.site.to_be_bytes());
        k.extend_from_slice(&(self.key.len() as u32).to_be_bytes());
        k
    }

    /// What the tier stores for it: the version, then the value.
    pub fn disk_value(&self, value: &[u8]) -> Vec<u8> {
        let mut v = Vec::with_capacity(HEADER + value.len());
        v.extend_from_slice(&self.ts.to_bits().to_le_bytes());
        v.extend_from_slice(&self.site.to_le_bytes());
        v.extend_from_slice(value);
        v
    }

    /// The value in `stored` (what `disk_value` made), if it is this
    /// version's.
    pub fn value_in<'a>(&self, stored: &'a [u8]) -> Option<&'a [u8]> {
        if stored.len() < HEADER {
            return None;
        }
        let ts = Timestamp::from_bits(u64::from_le_bytes(stored[..8].try_into().expect("8 bytes")));
        let site = SiteId::from_le_bytes(stored[8..HEADER].try_into().expect("2 bytes"));
        (ts == self.ts && site == self.site).then(|| &stored[HEADER..])
    }
}

/// Why the tier could not do what it was asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TierError {
    /// No room left on disk.
    Full,
    Io(String),
}

impl fmt::Display for TierError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TierError::Full => f.write_str("the disk tier is full"),
            TierError::Io(e) => write!(f, "disk tier I/O error: {e}"),
        }
    }
}

/// A change to the tier.
#[derive(Clone, Debug)]
pub enum Change {
    /// Keep this value for its key (replacing what the key had).
    Put(ValueId, Bytes),
    /// Forget the key's value if it is this version's.
    Remove(ValueId),
}

/// What the tier holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Values held, and their bytes.
    pub values: u64,
    pub value_bytes: u64,
    /// Bytes the tier takes on disk.
    pub disk_bytes: u64,
    /// Bytes written to disk so far (write amplification: against the
    /// values' bytes moved out).
    pub written_bytes: u64,
}

/// An embedded store on disk, as the node uses it: changes in batches,
/// durable and all-or-nothing once `apply` returns Ok; reads by version,
/// from any thread (the jobs' thread, and a store that must read a value
/// back at once: `store::PartitionStore::stored`).
pub trait Tier: Send + Sync {
    fn apply(&self, batch: &[Change]) -> Result<(), TierError>;
    fn read(&self, id: &ValueId) -> Result<Option<Bytes>, TierError>;
    /// `read` for many (a state transfer's values): one pass where the
    /// store can.
    fn read_many(&self, ids: &[ValueId]) -> Result<Vec<Option<Bytes>>, TierError> {
        ids.iter().map(|id| self.read(id)).collect()
    }
    fn usage(&self) -> Usage;
    /// Makes every change applied so far durable (before a checkpoint
    /// that names values in the tier replaces the log).
    fn sync(&self) -> Result<(), TierError>;
}

/// Work the node asks of its tier.
#[derive(Clone, Debug)]
pub enum Job {
    /// Move this value out (the node frees it once `Done::Written` says so).
    Write(ValueId, Bytes),
    /// Bring this value back (a request waits for it).
    Read(ValueId),
    /// The key no longer has this version (written again, deleted,
    /// expired, or its partition left): its value on disk is garbage.
    Remove(ValueId),
    /// Read these values for node `to`, which streams a partition's
    /// values on disk from this one (`Message::Values`).
    Send { to: NodeId, partition: PartitionId, ids: Vec<ValueId> },
    /// Make the changes so far durable: a replica that streamed its values
    /// into the tier logs that it holds them once this is done.
    Sync(PartitionId),
}

/// What came of a job.
#[derive(Clone, Debug)]
pub enum Done {
    /// The value, its length, and whether it is on disk now.
    Written(ValueId, usize, Result<(), TierError>),
    Read(ValueId, Result<Option<Bytes>, TierError>),
    Sent {
        to: NodeId,
        partition: PartitionId,
        ids: Vec<ValueId>,
        values: Result<Vec<Option<Bytes>>, TierError>,
    },
    Synced(PartitionId, Result<(), TierError>),
}

/// Runs `jobs` in order on `tier`: consecutive writes and removals go in
/// one batch. Removals report nothing (a failed one leaves garbage, not a
/// wrong answer: reads name their version); the count of failures is
/// returned beside the results.
pub fn run(tier: &dyn Tier, jobs: Vec<Job>) -> (Vec<Done>, u64) {
    let mut done = Vec::with_capacity(jobs.len());
    let mut failed = 0;
    let mut batch: Vec<Change> = Vec::new();
    let flush = |tier: &dyn Tier, batch: &mut Vec<Change>, done: &mut Vec<Done>, failed: &mut u64| {
        if batch.is_empty() {
            return;
        }
        let result = tier.apply(batch);
        if result.is_err() {
            *failed += 1;
        }
        for c in batch.drain(..) {
            if let Change::Put(id, value) = c {
                done.push(Done::Written(id, value.len(), result.clone()));
            }
        }
    };
    for job in jobs {
        match job {
            Job::Write(id, value) => batch.push(Change::Put(id, value)),
            Job::Remove(id) => batch.push(Change::Remove(id)),
            Job::Read(id) => {
                flush(tier, &mut batch, &mut done, &mut failed);
                let result = tier.read(&id);
                if result.is_err() {
                    failed += 1;
                }
                done.push(Done::Read(id, result));
            }
            Job::Send { to, partition, ids } => {
                flush(tier, &mut batch, &mut done, &mut failed);
                let values = tier.read_many(&ids);
                if values.is_err() {
                    failed += 1;
                }
                done.push(Done::Sent { to, partition, ids, values });
            }
            Job::Sync(partition) => {
                flush(tier, &mut batch, &mut done, &mut failed);
                let result = tier.sync();
                if result.is_err() {
                    failed += 1;
                }
                done.push(Done::Synced(partition, result));
            }
        }
    }
    flush(tier, &mut batch, &mut done, &mut failed);
    (done, failed)
}

/// The tier in memory, for the simulator and tests: the same behaviour as
/// the one on disk, with a capacity (past it, `TierError::Full`) and
/// failures on demand.
#[derive(Debug, Default)]
pub struct MemTier(Mutex<Held>);

#[derive(Debug, Default)]
struct Held {
    values: BTreeMap<Vec<u8>, Vec<u8>>,
    /// Bytes of values it may hold (0: no limit).
    capacity: u64,
    /// The next this many operations fail with an I/O error.
    failures: u32,
    value_bytes: u64,
    written: u64,
}

impl MemTier {
    /// A tier that holds at most `bytes` of values.
    pub fn with_capacity(bytes: u64) -> MemTier {
        MemTier(Mutex::new(Held { capacity: bytes, ..Held::default() }))
    }

    /// The next `n` operations fail with an I/O error.
    pub fn fail_next(&self, n: u32) {
        self.0.lock().expect("not poisoned").failures = n;
    }
}

impl Held {
    fn fail(&mut self) -> Result<(), TierError> {
        if self.failures > 0 {
            self.failures -= 1;
            return Err(TierError::Io("injected failure".into()));
        }
        Ok(())
    }
}

impl Tier for MemTier {
    fn apply(&self, batch: &[Change]) -> Result<(), TierError> {
        let mut guard = self.0.lock().expect("not poisoned");
        let this = &mut *guard;
        this.fail()?;
        // All or nothing: check the room first.
        let mut bytes = this.value_bytes as i64;
        for c in batch {
            if let Change::Put(id, v) = c {
                bytes += v.len() as i64 - this.values.get(&id.disk_key()).map_or(0, |old| old.len() as i64 - HEADER as i64);
            }
        }
        if this.capacity > 0 && bytes > this.capacity as i64 {
            return Err(TierError::Full);
        }
        for c in batch {
            match c {
                Change::Put(id, v) => {
                    let stored = id.disk_value(v);
                    this.written += stored.len() as u64;
                    if let Some(old) = this.values.insert(id.disk_key(), stored) {
                        this.value_bytes -= old.len() as u64 - HEADER as u64;
                    }
                    this.value_bytes += v.len() as u64;
                }
                Change::Remove(id) => {
                    let key = id.disk_key();
                    if this.values.get(&key).is_some_and(|s| id.value_in(s).is_some()) {
                        let old = this.values.remove(&key).expect("just seen");
                        this.value_bytes -= old.len() as u64 - HEADER as u64;
                    }
                }
            }
        }
        Ok(())
    }

    fn read(&self, id: &ValueId) -> Result<Option<Bytes>, TierError> {
        let mut this = self.0.lock().expect("not poisoned");
        this.fail()?;
        Ok(this.values.get(&id.disk_key()).and_then(|s| id.value_in(s)).map(Bytes::copy_from_slice))
    }

    fn sync(&self) -> Result<(), TierError> {
        self.0.lock().expect("not poisoned").fail()
    }

    fn usage(&self) -> Usage {
        let this = self.0.lock().expect("not poisoned");
        Usage {
            values: this.values.len() as u64,
            value_bytes: this.value_bytes,
            disk_bytes: this.values.iter().map(|(k, v)| (k.len() + v.len()) as u64).sum(),
            written_bytes: this.written,
        }
    }
}

/// The behaviour every `Tier` must have, run on `MemTier` here and on the
/// disk tier in `causeway-node`.
pub fn check_tier(tier: &dyn Tier) {
    let id =
        |key: &'static str, ms: u64| ValueId { partition: 3, key: Bytes::from_static(key.as_bytes()), ts: Timestamp::new(ms, 0), site: 0 };
    let v = |s: &'static str| Bytes::from_static(s.as_bytes());
    tier.apply(&[Change::Put(id("a", 1), v("one")), Change::Put(id("b", 1), v("bee"))]).expect("a write");
    assert_eq!(tier.read(&id("a", 1)).unwrap(), Some(v("one")));
    assert_eq!(tier.read(&id("a", 2)).unwrap(), None, "another version counts as absent");
    tier.apply(&[Change::Put(id("a", 2), v("two"))]).unwrap();
    assert_eq!(tier.read(&id("a", 1)).unwrap(), Some(v("one")), "by version: the older one stays until removed");
    assert_eq!(tier.read(&id("a", 2)).unwrap(), Some(v("two")));
    tier.apply(&[Change::Remove(id("a", 1))]).unwrap();
    assert_eq!(tier.read(&id("a", 1)).unwrap(), None);
    assert_eq!(tier.read(&id("a", 2)).unwrap(), Some(v("two")), "removing another version leaves it");
    let ab = ValueId { partition: 3, key: Bytes::from_static(b"a\x00"), ts: Timestamp::new(1, 0), site: 0 };
    assert_ne!(ab.disk_key(), id("a", 1).disk_key(), "keys that are prefixes of others do not meet");
    tier.sync().expect("a sync");
    tier.apply(&[Change::Remove(id("a", 2)), Change::Put(id("c", 5), Bytes::new())]).unwrap();
    assert_eq!(tier.read(&id("a", 2)).unwrap(), None);
    assert_eq!(tier.read(&id("c", 5)).unwrap(), Some(Bytes::new()), "an empty value is a value");
    let many = tier.read_many(&[id("b", 1), id("a", 2), id("c", 5)]).unwrap();
    assert_eq!(many, [Some(v("bee")), None, Some(Bytes::new())]);
    let u = tier.usage();
    assert_eq!((u.values, u.value_bytes), (2, 3), "{u:?}");
    assert!(u.written_bytes >= 3 + 3 + 3 + 3 * HEADER as u64, "{u:?}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stand_in_behaves_as_a_tier() {
        check_tier(&MemTier::default());
    }

    #[test]
    fn the_stand_in_fails_whole_batches_when_full_or_told_to() {
        let t = MemTier::with_capacity(10);
        let id = |key: &'static str| ValueId { partition: 0, key: Bytes::from_static(key.as_bytes()), ts: Timestamp::new(1, 0), site: 1 };
        let jobs = vec![
            Job::Write(id("a"), Bytes::from_static(b"123456")),
            Job::Write(id("b"), Bytes::from_static(b"123456")),
            Job::Read(id("a")),
            Job::Write(id("c"), Bytes::from_static(b"1234")),
        ];
        let (done, failed) = run(&t, jobs);
        assert_eq!(failed, 1, "{done:?}");
        assert!(matches!(&done[0], Done::Written(_, _, Err(TierError::Full))), "both or neither: {done:?}");
        assert!(matches!(&done[1], Done::Written(_, _, Err(TierError::Full))));
        assert!(matches!(&done[2], Done::Read(_, Ok(None))), "nothing of the failed batch is there");
        assert!(matches!(&done[3], Done::Written(_, _, Ok(()))));
        t.fail_next(1);
        let (done, failed) = run(&t, vec![Job::Read(id("c")), Job::Read(id("c"))]);
        assert_eq!(failed, 1);
        assert!(matches!(&done[0], Done::Read(_, Err(TierError::Io(_)))));
        assert!(matches!(&done[1], Done::Read(_, Ok(Some(v))) if v.as_ref() == b"1234"));
        assert_eq!(TierError::Full.to_string(), "the disk tier is full");
    }
}
