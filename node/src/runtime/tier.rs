//! The disk tier on disk (`--disk-tier DIR`): the node's values past its
//! memory budget, in a redb B+ tree (`tier.redb`), keyed by partition and
//! key so that a partition's values are together and in key order. The
//! node state machine decides what moves out and back (`causeway_core::
//! tier`); one thread of this node runs that work here, in order, so a
//! read from disk never holds up the request loop.
//!
//! Durability: every value reaches the write-ahead log first (as part of
//! its update), and the tier is synced before a log compaction's
//! checkpoint, which names the values in the tier instead of copying them
//! (`record::LogRecord::OnDisk`), replaces the log. A version stays in
//! the tier until no checkpoint can name it (`core::node::tier`). So the
//! tier commits without syncing (`Durability::None`) in between, but once
//! a second (redb reuses the pages a commit frees only after a synced
//! one). A node without a data directory (no log) starts its tier empty.
//!
//! redb keeps a page cache of its own; it is kept small here (the values
//! were moved out to free memory) and the operating system's page cache
//! does the rest.

use causeway_core::tier::{self, Change, Done, Job, Tier, TierError, Usage, ValueId};
use hdrhistogram::Histogram;
use parking_lot::Mutex;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Instant;

const VALUES: TableDefinition<&[u8], &[u8]> = TableDefinition::new("values");
const FILE: &str = "tier.redb";
/// redb's own page cache.
const CACHE_BYTES: usize = 8 << 20;

/// The tier in a redb file.
pub struct DiskTier {
    db: Database,
    path: PathBuf,
    values: AtomicU64,
    value_bytes: AtomicU64,
    written: AtomicU64,
    /// When a commit last synced.
    synced: Mutex<Instant>,
}

fn io(e: impl Into<redb::Error>) -> TierError {
    match e.into() {
        redb::Error::Io(e) if e.kind() == std::io::ErrorKind::StorageFull => TierError::Full,
        e => TierError::Io(e.to_string()),
    }
}

impl DiskTier {
    /// The tier in `dir`: what an earlier process left there if `keep`
    /// (its log's checkpoints name those values), else a new, empty one.
    pub fn open(dir: &Path, keep: bool) -> Result<DiskTier, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create the disk tier's directory {}: {e}", dir.display()))?;
        let path = dir.join(FILE);
        if !keep {
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(format!("cannot remove the old disk tier {}: {e}", path.display())),
            }
        }
        let db = Database::builder()
            .set_cache_size(CACHE_BYTES)
            .create(&path)
            .map_err(|e| format!("cannot open the disk tier {}: {e}", path.display()))?;
        let tx = db.begin_write().map_err(|e| e.to_string())?;
        tx.open_table(VALUES).map_err(|e| e.to_string())?;
        tx.commit().map_err(|e| e.to_string())?;
        // What it holds (a pass over the file, at start).
        let (mut values, mut value_bytes) = (0u64, 0u64);
        {
            let tx = db.begin_read().map_err(|e| e.to_string())?;
            let table = tx.open_table(VALUES).map_err(|e| e.to_string())?;
            for row in table.iter().map_err(|e| e.to_string())? {
                let (_, v) = row.map_err(|e| e.to_string())?;
                values += 1;
                value_bytes += (v.value().len().saturating_sub(tier::HEADER)) as u64;
            }
        }
        Ok(DiskTier {
            db,
            path,
            values: AtomicU64::new(values),
            value_bytes: AtomicU64::new(value_bytes),
            written: AtomicU64::new(0),
            synced: Mutex::new(Instant::now()),
        })
    }

    fn write(&self, batch: &[Change]) -> Result<(i64, i64, u64), TierError> {
        let mut tx = self.db.begin_write().map_err(io)?;
        let mut synced = self.synced.lock();
        if synced.elapsed() >= std::time::Duration::from_secs(1) {
            *synced = Instant::now();
        } else {
            tx.set_durability(redb::Durability::None).map_err(|e| TierError::Io(e.to_string()))?;
        }
        drop(synced);
        let (mut values, mut bytes, mut written) = (0i64, 0i64, 0u64);
        {
            let mut table = tx.open_table(VALUES).map_err(io)?;
            for c in batch {
                match c {
                    Change::Put(id, value) => {
                        let stored = id.disk_value(value);
                        written += stored.len() as u64;
                        let old = table.insert(id.disk_key().as_slice(), stored.as_slice()).map_err(io)?;
                        match old {
                            Some(old) => bytes -= (old.value().len() - tier::HEADER) as i64,
                            None => values += 1,
                        }
                        bytes += value.len() as i64;
                    }
                    Change::Remove(id) => {
                        if let Some(old) = table.remove(id.disk_key().as_slice()).map_err(io)? {
                            bytes -= (old.value().len() - tier::HEADER) as i64;
                            values -= 1;
                        }
                    }
                }
            }
        }
        tx.commit().map_err(io)?;
        Ok((values, bytes, written))
    }
}

impl Tier for DiskTier {
    fn sync(&self) -> Result<(), TierError> {
        let tx = self.db.begin_write().map_err(io)?;
        tx.commit().map_err(io)
    }

    fn apply(&self, batch: &[Change]) -> Result<(), TierError> {
        let (values, bytes, written) = self.write(batch)?;
        self.values.fetch_add(values as u64, Ordering::Relaxed);
        self.value_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        self.written.fetch_add(written, Ordering::Relaxed);
        Ok(())
    }

    fn read(&self, id: &ValueId) -> Result<Option<bytes::Bytes>, TierError> {
        Ok(self.read_many(std::slice::from_ref(id))?.pop().flatten())
    }

    fn read_many(&self, ids: &[ValueId]) -> Result<Vec<Option<bytes::Bytes>>, TierError> {
        let tx = self.db.begin_read().map_err(io)?;
        let table = tx.open_table(VALUES).map_err(io)?;
        let mut values = Vec::with_capacity(ids.len());
        for id in ids {
            let stored = table.get(id.disk_key().as_slice()).map_err(io)?;
            values.push(stored.and_then(|s| id.value_in(s.value()).map(bytes::Bytes::copy_from_slice)));
        }
        Ok(values)
    }

    fn usage(&self) -> Usage {
        Usage {
            values: self.values.load(Ordering::Relaxed),
            value_bytes: self.value_bytes.load(Ordering::Relaxed),
            disk_bytes: std::fs::metadata(&self.path).map_or(0, |m| m.len()),
            written_bytes: self.written.load(Ordering::Relaxed),
        }
    }
}

/// What the tier's thread measured (INFO `tier`).
#[derive(Clone, Debug, Default)]
pub struct Reads {
    /// Values read back from disk, and the p99 of a read in microseconds.
    pub count: u64,
    pub p99_us: u64,
    /// Reads a second since the one asked a second or more before.
    pub per_sec: f64,
}

/// The threads that run the node's tier jobs: one writes (batches of
/// values moved out and versions removed, one transaction each), one
/// reads, so that a read never waits behind a commit, and one reads the
/// chunks of partitions other nodes stream from here. A read is only ever
/// asked for a version whose write was done (its entry says it is on
/// disk), so the two need no order between them; a version removed while
/// its read was on the way reads as absent, and the node then serves the
/// key's newer version.
pub struct Worker {
    writes: mpsc::Sender<Vec<Job>>,
    reads: mpsc::Sender<Vec<Job>>,
    /// Reads for nodes streaming a partition from here: a thread of their
    /// own, so a client's read never queues behind a stream's chunks.
    sends: mpsc::Sender<Vec<Job>>,
    pub tier: Arc<dyn Tier>,
    latency: Arc<Mutex<Histogram<u64>>>,
    /// Where the last rate was taken (count, when) and what it was.
    rate: Mutex<(u64, Instant, f64)>,
}

impl Worker {
    /// Starts the threads; `done` steps what came of each batch of jobs
    /// into the node.
    pub fn spawn(tier: Arc<dyn Tier>, done: impl Fn(Vec<Done>) + Send + Sync + 'static) -> Worker {
        let latency = Arc::new(Mutex::new(Histogram::new_with_bounds(1, 60_000_000, 2).expect("valid bounds")));
        let timed: Arc<dyn Tier> = Arc::new(Timed { tier: tier.clone(), reads: latency.clone() });
        let done = Arc::new(done);
        let thread = |name: &str| {
            let (tx, rx) = mpsc::channel::<Vec<Job>>();
            let (timed, done) = (timed.clone(), done.clone());
            std::thread::Builder::new()
                .name(name.into())
                .spawn(move || {
                    while let Ok(mut jobs) = rx.recv() {
                        while let Ok(more) = rx.try_recv() {
                            jobs.extend(more);
                        }
                        let (results, failed) = tier::run(&*timed, jobs);
                        if failed > 0 {
                            tracing::warn!("the disk tier failed {failed} of its jobs");
                        }
                        done(results);
                    }
                })
                .expect("a thread");
            tx
        };
        let rate = Mutex::new((0, Instant::now(), 0.0));
        Worker { writes: thread("disk-tier-write"), reads: thread("disk-tier-read"), sends: thread("disk-tier-send"), tier, latency, rate }
    }

    pub fn send(&self, jobs: Vec<Job>) {
        // Reads (for a request, or for a node streaming values from here)
        // name versions already written; a sync waits for the writes.
        let (mut reads, mut sends, mut writes) = (Vec::new(), Vec::new(), Vec::new());
        for job in jobs {
            match job {
                Job::Read(_) => reads.push(job),
                Job::Send { .. } => sends.push(job),
                _ => writes.push(job),
            }
        }
        for (thread, jobs) in [(&self.reads, reads), (&self.sends, sends), (&self.writes, writes)] {
            if !jobs.is_empty() {
                let _ = thread.send(jobs);
            }
        }
    }

    pub fn reads(&self) -> Reads {
        let (count, p99_us) = {
            let h = self.latency.lock();
            (h.len(), h.value_at_quantile(0.99))
        };
        let mut rate = self.rate.lock();
        let elapsed = rate.1.elapsed().as_secs_f64();
        if elapsed >= 1.0 {
            *rate = (count, Instant::now(), (count - rate.0) as f64 / elapsed);
        }
        Reads { count, p99_us, per_sec: rate.2 }
    }
}

/// The tier, with each read timed.
struct Timed {
    tier: Arc<dyn Tier>,
    reads: Arc<Mutex<Histogram<u64>>>,
}

impl Tier for Timed {
    fn apply(&self, batch: &[Change]) -> Result<(), TierError> {
        self.tier.apply(batch)
    }

    fn read_many(&self, ids: &[ValueId]) -> Result<Vec<Option<bytes::Bytes>>, TierError> {
        self.tier.read_many(ids)
    }

    fn read(&self, id: &ValueId) -> Result<Option<bytes::Bytes>, TierError> {
        let start = Instant::now();
        let r = self.tier.read(id);
        let _ = self.reads.lock().record(start.elapsed().as_micros().max(1) as u64);
        r
    }

    fn usage(&self) -> Usage {
        self.tier.usage()
    }

    fn sync(&self) -> Result<(), TierError> {
        self.tier.sync()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_redb_tier_behaves_as_a_tier_and_keeps_its_values_if_asked() {
        let dir = std::env::temp_dir().join(format!("cw-tier-test-{}", std::process::id()));
        let t = DiskTier::open(&dir, false).unwrap();
        tier::check_tier(&t);
        assert!(t.usage().disk_bytes > 0);
        let held = (t.usage().values, t.usage().value_bytes);
        drop(t);
        let kept = DiskTier::open(&dir, true).unwrap();
        assert_eq!((kept.usage().values, kept.usage().value_bytes), held, "kept for the log's checkpoints");
        drop(kept);
        let again = DiskTier::open(&dir, false).unwrap();
        assert_eq!(again.usage(), Usage { disk_bytes: again.usage().disk_bytes, ..Usage::default() }, "without a log it starts afresh");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
