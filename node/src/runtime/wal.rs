//! The write-ahead log: every update a replica applies (and every state
//! transfer it installs) is appended here before anything that reveals it
//! leaves the node, so a restarted node recovers what it acknowledged and
//! then catches up from its chain neighbours (which resend what it lacks).
//!
//! Records are `[length u32][crc32 u32][LogRecord::encode]`. On start the
//! log is read back up to the first record that is incomplete or fails its
//! checksum (a crash mid-write, or a corrupt tail): that valid prefix is
//! replayed and the rest is cut off, with a warning. A record whose checksum
//! holds but that does not decode (a log from another format version) stops
//! the node with an error instead.
//!
//! The node appends a step's records while it still holds its state lock,
//! so they reach the log in the order the replicas produced them; each
//! append gets a ticket (its position in the queue). One writer thread
//! appends with group commit: it takes every record queued, writes them in
//! one go, then syncs per the fsync policy (like Redis' appendfsync):
//! `always` syncs before the step's messages (acknowledgements, forwards)
//! are released (`after`), `everysec` syncs once a second, `no` leaves it
//! to the OS.
//!
//! What a crash can lose: with `always`, nothing that was acknowledged or
//! passed to another node. With `everysec`, the records of the last second
//! or so (up to the last sync) on the crashed node; its chain neighbours
//! still hold them unless they crashed too. With `no`, whatever the OS had
//! not written (a process crash alone loses nothing: the OS keeps it).
//!
//! Compaction: once the log passes a size, the node `mark`s it, takes a
//! checkpoint of every replica (its state and its not-yet-stable updates,
//! as records) and hands it to `compact`; the writer replaces the log with
//! the checkpoint followed by every record appended since the mark. A record
//! appended before the mark belongs to an update applied before it, so the
//! checkpoint (taken after the mark) holds it; one appended after the mark
//! is kept (replaying it again is harmless: replicas skip what they have).
//! The new log is written beside the old one and renamed over it, so a crash
//! during compaction leaves one of the two whole.
//!
//! The coordinator's Raft state (vote, log, snapshot) has its own files under
//! `<data_dir>/raft/`: see `coordinator::raft::log`.

use bytes::{Buf, BufMut, BytesMut};
use causeway_core::message::Outbox;
use causeway_core::record::LogRecord;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// With fsync=everysec, an append asked to be synced soon (`Wal::append`)
/// is synced at most this long after the previous sync: group commit that
/// bounds the syncs to a hundred a second per node. (Nine nodes of three
/// sites sharing a 2-core machine and its disk: one sync per append took
/// write throughput from 4 600 to 2 200-2 900 ops/s, 5 ms 2 800-3 100,
/// 25 ms 3 200-3 600; BENCHMARKS.md.)
const SOON: Duration = Duration::from_millis(10);

/// When the log is synced to disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fsync {
    Always,
    EverySec,
    No,
}

impl FromStr for Fsync {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "always" => Ok(Fsync::Always),
            "everysec" => Ok(Fsync::EverySec),
            "no" => Ok(Fsync::No),
            _ => Err(format!("unknown fsync policy '{s}' (expected always, everysec or no)")),
        }
    }
}

enum Job {
    /// Encoded records, the ticket of the append, and whether it is to be
    /// synced soon whatever the policy (`Wal::append`).
    Append { records: Vec<u8>, ticket: u64, soon: bool },
    /// Start keeping a copy of every record from here on.
    Mark,
    /// Replace the log with this checkpoint and the records since the mark.
    Compact(Vec<u8>),
}

/// The sending side of the log.
pub struct Wal {
    policy: Fsync,
    tx: mpsc::Sender<Job>,
    /// Bytes in the log file.
    size: Arc<AtomicU64>,
    /// Compactions done (the checkpoint replaced the log).
    compactions: Arc<AtomicU64>,
    /// When the log was last synced (wall-clock ms; 0: never).
    last_sync_ms: Arc<AtomicU64>,
    /// The last ticket appended; held while its records are queued, so
    /// tickets reach the writer in order.
    tickets: Mutex<u64>,
    released: Arc<Released>,
}

/// Messages waiting for their records to be synced (fsync=always).
#[derive(Default)]
struct Released {
    inner: Mutex<ReleasedInner>,
}

#[derive(Default)]
struct ReleasedInner {
    /// Every append up to this ticket is synced.
    synced: u64,
    waiting: BTreeMap<u64, Outbox>,
}

impl Wal {
    /// Opens (or creates) the log in `dir`, returning it and the valid
    /// records to replay. `release` is how the writer says every append up
    /// to a ticket is synced (with `no`: written, as the page cache holds
    /// it), with the follow-up messages that waited for it (fsync=always).
    pub fn open(dir: &Path, policy: Fsync, release: impl Fn(u64, Outbox) + Send + 'static) -> Result<(Wal, Vec<LogRecord>), String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let path = dir.join("wal.log");
        let mut file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let (records, valid) = read_records(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
        if valid < bytes.len() {
            tracing::warn!("{}: dropping {} bytes after the last valid record (torn or corrupt tail)", path.display(), bytes.len() - valid);
            file.set_len(valid as u64).map_err(|e| e.to_string())?;
        }
        file.seek(SeekFrom::End(0)).map_err(|e| e.to_string())?;
        let (tx, rx) = mpsc::channel();
        let size = Arc::new(AtomicU64::new(valid as u64));
        let released = Arc::new(Released::default());
        let last_sync_ms = Arc::new(AtomicU64::new(0));
        let compactions = Arc::new(AtomicU64::new(0));
        let writer = Writer {
            file,
            path,
            policy,
            size: size.clone(),
            compactions: compactions.clone(),
            since_mark: None,
            released: released.clone(),
            last_sync_ms: last_sync_ms.clone(),
        };
        std::thread::Builder::new().name("causeway-wal".into()).spawn(move || writer.run(rx, release)).map_err(|e| e.to_string())?;
        Ok((Wal { policy, tx, size, compactions, last_sync_ms, tickets: Mutex::new(0), released }, records))
    }

    /// Whether this log's records are synced before what follows them is
    /// sent: a replay then holds everything the node ever revealed.
    pub fn synced(&self) -> bool {
        self.policy == Fsync::Always
    }

    /// The fsync policy, as configured.
    pub fn policy(&self) -> &'static str {
        match self.policy {
            Fsync::Always => "always",
            Fsync::EverySec => "everysec",
            Fsync::No => "no",
        }
    }

    /// When the log was last synced (wall-clock ms; 0: never).
    pub fn last_sync_ms(&self) -> u64 {
        self.last_sync_ms.load(Ordering::Relaxed)
    }

    /// Bytes in the log.
    pub fn size(&self) -> u64 {
        self.size.load(Ordering::Relaxed)
    }

    /// Compactions done so far (a checkpoint replaced the log).
    pub fn compactions(&self) -> u64 {
        self.compactions.load(Ordering::Acquire)
    }

    /// First step of a compaction: call before taking the checkpoint.
    pub fn mark(&self) {
        let _ = self.tx.send(Job::Mark);
    }

    /// Second step: the checkpoint records, taken after `mark`.
    pub fn compact(&self, checkpoint: &[LogRecord]) {
        let mut buf = BytesMut::new();
        for record in checkpoint {
            encode_record(record, &mut buf);
        }
        let _ = self.tx.send(Job::Compact(buf.to_vec()));
    }

    /// Appends `records` as `ticket` (call in the order they were
    /// produced, under the lock that produced them, with increasing tickets:
    /// the node's `take_log` count) for `after` and for the writer's
    /// report of what is synced. `soon`: with fsync=everysec, sync it
    /// within `SOON` (group commit, no client waits for it) rather than
    /// within the second: a geo-replicated node reports its updates to
    /// other sites only once its disk holds them.
    pub fn append(&self, ticket: u64, records: &[LogRecord], soon: bool) {
        let mut buf = BytesMut::new();
        for record in records {
            encode_record(record, &mut buf);
        }
        let mut last = self.tickets.lock();
        debug_assert!(ticket > *last, "tickets increase");
        *last = ticket;
        if self.tx.send(Job::Append { records: buf.to_vec(), ticket, soon }).is_err() {
            tracing::error!("the write-ahead log writer has stopped");
        }
    }

    /// What may be sent now of `then`, which must not leave before append
    /// `ticket` is durable: all of it, unless fsync=always and the append
    /// is not synced yet (the writer sends it then).
    pub fn after(&self, ticket: u64, then: Outbox) -> Outbox {
        if self.policy != Fsync::Always || then.is_empty() {
            return then;
        }
        let mut r = self.released.inner.lock();
        if ticket <= r.synced {
            return then;
        }
        r.waiting.entry(ticket).or_default().extend(then);
        Outbox::new()
    }
}

fn encode_record(record: &LogRecord, out: &mut BytesMut) {
    let payload = record.encode();
    out.put_u32_le(payload.len() as u32);
    out.put_u32_le(crc32fast::hash(&payload));
    out.extend_from_slice(&payload);
}

/// The records of the valid prefix of `bytes`, and that prefix's length;
/// an error for a whole record that does not decode.
fn read_records(mut bytes: &[u8]) -> Result<(Vec<LogRecord>, usize), String> {
    let total = bytes.len();
    let mut records = Vec::new();
    while bytes.len() >= 8 {
        let len = u32::from_le_bytes(bytes[..4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes"));
        if bytes.len() < 8 + len || crc32fast::hash(&bytes[8..8 + len]) != crc {
            break;
        }
        let record = LogRecord::decode(&bytes[8..8 + len]).map_err(|e| format!("record {} cannot be read ({e})", records.len() + 1))?;
        records.push(record);
        bytes.advance(8 + len);
    }
    Ok((records, total - bytes.len()))
}

struct Writer {
    file: File,
    path: PathBuf,
    policy: Fsync,
    size: Arc<AtomicU64>,
    compactions: Arc<AtomicU64>,
    /// Records appended since a compaction's mark.
    since_mark: Option<Vec<u8>>,
    released: Arc<Released>,
    last_sync_ms: Arc<AtomicU64>,
}

impl Writer {
    fn run(mut self, rx: mpsc::Receiver<Job>, release: impl Fn(u64, Outbox)) {
        let mut last_sync = Instant::now();
        let (mut dirty, mut soon) = (false, false);
        // The last ticket written, and the last reported synced.
        let (mut written, mut reported) = (0, 0);
        loop {
            // Nothing written since the last sync: nothing to do until a
            // job comes (an idle node's writer does not wake).
            let wait = match (dirty, soon) {
                (false, _) => None,
                (true, true) => Some(SOON.saturating_sub(last_sync.elapsed())),
                (true, false) => Some(Duration::from_millis(200)),
            };
            let first = match wait.map_or_else(|| rx.recv().map_err(|_| mpsc::RecvTimeoutError::Disconnected), |w| rx.recv_timeout(w)) {
                Ok(job) => Some(job),
                Err(mpsc::RecvTimeoutError::Timeout) => None,
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            };
            let mut buf = Vec::new();
            let mut compact = None;
            for job in first.into_iter().chain(std::iter::from_fn(|| rx.try_recv().ok())) {
                match job {
                    Job::Append { records, ticket, soon: asked } => {
                        soon |= asked;
                        if let Some(since) = &mut self.since_mark {
                            since.extend_from_slice(&records);
                        }
                        buf.extend_from_slice(&records);
                        written = ticket;
                    }
                    Job::Mark => self.since_mark = Some(Vec::new()),
                    Job::Compact(checkpoint) => compact = Some(checkpoint),
                }
            }
            if !buf.is_empty() {
                if let Err(e) = self.file.write_all(&buf) {
                    // Nothing after this record may be acknowledged: stop.
                    tracing::error!("{}: write failed ({e}); the node stops acknowledging writes", self.path.display());
                    return;
                }
                self.size.fetch_add(buf.len() as u64, Ordering::Relaxed);
                // Without fsync nothing waits for a sync.
                dirty = self.policy != Fsync::No;
            }
            let due = match self.policy {
                Fsync::Always => dirty,
                Fsync::EverySec => {
                    let since = last_sync.elapsed();
                    dirty && ((soon && since >= SOON) || since >= Duration::from_secs(1))
                }
                Fsync::No => false,
            };
            if due {
                if let Err(e) = self.file.sync_data() {
                    tracing::error!("{}: fsync failed ({e}); the node stops acknowledging writes", self.path.display());
                    return;
                }
                last_sync = Instant::now();
                (dirty, soon) = (false, false);
                let wall = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
                self.last_sync_ms.store(wall, Ordering::Relaxed);
            }
            let synced = if self.policy == Fsync::No || !dirty { written } else { reported };
            if synced > reported {
                reported = synced;
                let then: Outbox = {
                    let mut r = self.released.inner.lock();
                    r.synced = synced;
                    let later = r.waiting.split_off(&(synced + 1));
                    std::mem::replace(&mut r.waiting, later).into_values().flatten().collect()
                };
                release(synced, then);
            }
            if let Some(checkpoint) = compact {
                if let Err(e) = self.compact(checkpoint) {
                    tracing::error!("{}: compaction failed ({e}); the log keeps growing", self.path.display());
                }
            }
        }
    }

    fn compact(&mut self, checkpoint: Vec<u8>) -> std::io::Result<()> {
        let since = self.since_mark.take().unwrap_or_default();
        let tmp = self.path.with_extension("compacting");
        let mut f = File::create(&tmp)?;
        f.write_all(&checkpoint)?;
        f.write_all(&since)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &self.path)?;
        self.file = OpenOptions::new().append(true).open(&self.path)?;
        let before = self.size.swap((checkpoint.len() + since.len()) as u64, Ordering::Relaxed);
        self.compactions.fetch_add(1, Ordering::Release);
        tracing::info!("{}: compacted from {before} to {} bytes", self.path.display(), checkpoint.len() + since.len());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use causeway_core::message::{Dest, Envelope, Message, OpId};

    fn record(i: u64) -> LogRecord {
        LogRecord::Updates { partition: i as u32, updates: Vec::new() }
    }

    #[test]
    fn a_torn_or_corrupt_tail_keeps_the_valid_prefix() {
        let mut buf = BytesMut::new();
        for i in 0..3 {
            encode_record(&record(i), &mut buf);
        }
        let whole = buf.to_vec();
        assert_eq!(read_records(&whole).unwrap().0.len(), 3);
        // Torn: the last record is cut short.
        let one = 8 + record(0).encode().len();
        let (recs, valid) = read_records(&whole[..whole.len() - 2]).unwrap();
        assert_eq!((recs.len(), valid), (2, 2 * one));
        // Corrupt: a flipped byte in the second record's payload.
        let mut bad = whole.clone();
        let second = one + 9;
        bad[second] ^= 0xff;
        assert_eq!(read_records(&bad).unwrap().0, vec![record(0)]);
    }

    #[test]
    fn a_log_of_another_format_is_refused_not_cut() {
        let mut payload = record(1).encode();
        payload[0] = causeway_core::record::FORMAT + 1;
        let mut buf = BytesMut::new();
        buf.put_u32_le(payload.len() as u32);
        buf.put_u32_le(crc32fast::hash(&payload));
        buf.extend_from_slice(&payload);
        let err = read_records(&buf).unwrap_err();
        assert!(err.contains("format"), "{err}");
    }

    #[test]
    fn records_survive_reopening() {
        let dir = std::env::temp_dir().join(format!("causeway-wal-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (released_tx, released_rx) = mpsc::channel();
        {
            let (wal, old) = Wal::open(&dir, Fsync::Always, move |_, e| released_tx.send(e.len()).unwrap()).unwrap();
            assert!(old.is_empty());
            for i in 0..5 {
                wal.append(i + 1, &[record(i)], false);
            }
            let then = vec![Envelope { to: Dest::Node(1), msg: Message::Stable { op: OpId { client: 1, seq: 9 } } }];
            let ticket = 6;
            wal.append(ticket, &[record(5)], false);
            // The follow-up is released only by the writer, after the sync.
            let now = wal.after(ticket, then.clone());
            // The writer may release earlier tickets' (empty) follow-ups
            // first, as it syncs them: wait for this one's.
            let released = if now.is_empty() {
                std::iter::repeat_with(|| released_rx.recv_timeout(Duration::from_secs(5)).unwrap()).find(|&n| n > 0).unwrap()
            } else {
                now.len()
            };
            assert_eq!(released, 1);
            // Once synced, later follow-ups of that ticket go at once.
            std::thread::sleep(Duration::from_millis(50));
            assert_eq!(wal.after(ticket, then).len(), 1);
        }
        // A torn write at the end, as after a crash.
        OpenOptions::new().append(true).open(dir.join("wal.log")).unwrap().write_all(&[9, 0, 0, 0, 1]).unwrap();
        let (_wal, replay) = Wal::open(&dir, Fsync::No, |_, _| {}).unwrap();
        assert_eq!(replay, (0..6).map(record).collect::<Vec<_>>());
        assert_eq!(
            std::fs::metadata(dir.join("wal.log")).unwrap().len() as usize,
            read_records(&std::fs::read(dir.join("wal.log")).unwrap()).unwrap().1
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn compaction_keeps_the_checkpoint_and_what_came_after_the_mark() {
        let dir = std::env::temp_dir().join(format!("causeway-wal-compact-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        {
            let (wal, _) = Wal::open(&dir, Fsync::Always, |_, _| {}).unwrap();
            for i in 0..100 {
                wal.append(i + 1, &[record(i)], false);
            }
            wal.mark();
            wal.append(101, &[record(100)], false);
            wal.compact(&[record(1000)]);
            wal.append(102, &[record(101)], false);
            let deadline = Instant::now() + Duration::from_secs(5);
            while wal.size() > 1000 {
                assert!(Instant::now() < deadline, "no compaction");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        std::thread::sleep(Duration::from_millis(300));
        let (_wal, replay) = Wal::open(&dir, Fsync::No, |_, _| {}).unwrap();
        assert_eq!(replay, vec![record(1000), record(100), record(101)]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
