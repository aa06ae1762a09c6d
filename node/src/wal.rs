//! The write-ahead log: every update a replica applies (and every state
//! transfer it installs) is appended here before anything that reveals it
//! leaves the node, so a restarted node recovers what it acknowledged and
//! then catches up from its chain neighbours (which resend what it lacks).
//!
//! Records are `[length u32][crc32 u32][wire-encoded Message]`. On start the
//! log is read back up to the first record that is incomplete or fails its
//! checksum (a crash mid-write, or a corrupt tail): that valid prefix is
//! replayed and the rest is cut off, with a warning.
//!
//! One writer thread appends with group commit: it takes every record
//! queued, writes them in one go, then syncs per the fsync policy (like
//! Redis' appendfsync): `always` syncs before the records' follow-up
//! messages (acknowledgements, forwards) are released, `everysec` syncs in
//! the background once a second, `no` leaves it to the OS.
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
use causeway_core::message::{Envelope, Message};
use causeway_core::wire;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

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
    Append {
        record: Vec<u8>,
        /// Sent once the record is durable (fsync=always only).
        then: Vec<Envelope>,
    },
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
}

impl Wal {
    /// Opens (or creates) the log in `dir`, returning it and the valid
    /// records to replay. `release` is how the writer sends the follow-up
    /// messages of durable records.
    pub fn open(dir: &Path, policy: Fsync, release: impl Fn(Vec<Envelope>) + Send + 'static) -> Result<(Wal, Vec<Message>), String> {
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
        let (records, valid) = read_records(&bytes);
        if valid < bytes.len() {
            tracing::warn!("{}: dropping {} bytes after the last valid record (torn or corrupt tail)", path.display(), bytes.len() - valid);
            file.set_len(valid as u64).map_err(|e| e.to_string())?;
        }
        file.seek(SeekFrom::End(0)).map_err(|e| e.to_string())?;
        let (tx, rx) = mpsc::channel();
        let size = Arc::new(AtomicU64::new(valid as u64));
        let writer = Writer { file, path, policy, size: size.clone(), since_mark: None };
        std::thread::Builder::new().name("causeway-wal".into()).spawn(move || writer.run(rx, release)).map_err(|e| e.to_string())?;
        Ok((Wal { policy, tx, size }, records))
    }

    /// Bytes in the log.
    pub fn size(&self) -> u64 {
        self.size.load(Ordering::Relaxed)
    }

    /// First step of a compaction: call before taking the checkpoint.
    pub fn mark(&self) {
        let _ = self.tx.send(Job::Mark);
    }

    /// Second step: the checkpoint records, taken after `mark`.
    pub fn compact(&self, checkpoint: &[Message]) {
        let mut buf = BytesMut::new();
        for record in checkpoint {
            encode_record(record, &mut buf);
        }
        let _ = self.tx.send(Job::Compact(buf.to_vec()));
    }

    /// Appends `record`. With fsync=always, `then` is sent by the writer once
    /// the record is on disk; otherwise it is returned to send now.
    pub fn append(&self, record: &Message, then: Vec<Envelope>) -> Vec<Envelope> {
        let mut buf = BytesMut::new();
        encode_record(record, &mut buf);
        let (then, now) = match self.policy {
            Fsync::Always => (then, Vec::new()),
            _ => (Vec::new(), then),
        };
        if self.tx.send(Job::Append { record: buf.to_vec(), then }).is_err() {
            tracing::error!("the write-ahead log writer has stopped");
        }
        now
    }
}

fn encode_record(record: &Message, out: &mut BytesMut) {
    let payload = wire::encode(record);
    out.put_u32_le(payload.len() as u32);
    out.put_u32_le(crc32fast::hash(&payload));
    out.extend_from_slice(&payload);
}

/// The records of the valid prefix of `bytes`, and that prefix's length.
fn read_records(mut bytes: &[u8]) -> (Vec<Message>, usize) {
    let total = bytes.len();
    let mut records = Vec::new();
    while bytes.len() >= 8 {
        let len = u32::from_le_bytes(bytes[..4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes"));
        if bytes.len() < 8 + len || crc32fast::hash(&bytes[8..8 + len]) != crc {
            break;
        }
        match wire::decode::<Message>(&bytes[8..8 + len]) {
            Ok(m) => records.push(m),
            Err(_) => break,
        }
        bytes.advance(8 + len);
    }
    (records, total - bytes.len())
}

struct Writer {
    file: File,
    path: PathBuf,
    policy: Fsync,
    size: Arc<AtomicU64>,
    /// Records appended since a compaction's mark.
    since_mark: Option<Vec<u8>>,
}

impl Writer {
    fn run(mut self, rx: mpsc::Receiver<Job>, release: impl Fn(Vec<Envelope>)) {
        let mut last_sync = Instant::now();
        let mut dirty = false;
        loop {
            let first = match rx.recv_timeout(Duration::from_millis(200)) {
                Ok(job) => Some(job),
                Err(mpsc::RecvTimeoutError::Timeout) => None,
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            };
            let mut buf = Vec::new();
            let mut then = Vec::new();
            let mut compact = None;
            for job in first.into_iter().chain(std::iter::from_fn(|| rx.try_recv().ok())) {
                match job {
                    Job::Append { record, then: t } => {
                        if let Some(since) = &mut self.since_mark {
                            since.extend_from_slice(&record);
                        }
                        buf.extend_from_slice(&record);
                        then.extend(t);
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
                dirty = true;
            }
            let due = match self.policy {
                Fsync::Always => dirty,
                Fsync::EverySec => dirty && last_sync.elapsed() >= Duration::from_secs(1),
                Fsync::No => false,
            };
            if due {
                if let Err(e) = self.file.sync_data() {
                    tracing::error!("{}: fsync failed ({e}); the node stops acknowledging writes", self.path.display());
                    return;
                }
                last_sync = Instant::now();
                dirty = false;
            }
            if !then.is_empty() {
                release(then);
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
        tracing::info!("{}: compacted from {before} to {} bytes", self.path.display(), checkpoint.len() + since.len());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use causeway_core::message::OpId;

    fn record(i: u64) -> Message {
        Message::Stable { op: OpId { client: 1, seq: i } }
    }

    #[test]
    fn a_torn_or_corrupt_tail_keeps_the_valid_prefix() {
        let mut buf = BytesMut::new();
        for i in 0..3 {
            encode_record(&record(i), &mut buf);
        }
        let whole = buf.to_vec();
        assert_eq!(read_records(&whole).0.len(), 3);
        // Torn: the last record is cut short.
        let one = 8 + wire::encode(&record(0)).len();
        let (recs, valid) = read_records(&whole[..whole.len() - 2]);
        assert_eq!((recs.len(), valid), (2, 2 * one));
        // Corrupt: a flipped byte in the second record's payload.
        let mut bad = whole.clone();
        let second = one + 9;
        bad[second] ^= 0xff;
        assert_eq!(read_records(&bad).0, vec![record(0)]);
    }

    #[test]
    fn records_survive_reopening() {
        let dir = std::env::temp_dir().join(format!("causeway-wal-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (released_tx, released_rx) = mpsc::channel();
        {
            let (wal, old) = Wal::open(&dir, Fsync::Always, move |e| released_tx.send(e.len()).unwrap()).unwrap();
            assert!(old.is_empty());
            for i in 0..5 {
                assert!(wal.append(&record(i), vec![]).is_empty());
            }
            let then = vec![Envelope { to: causeway_core::message::Dest::Node(1), msg: record(9) }];
            wal.append(&record(5), then);
            // The follow-up is released only by the writer, after the sync.
            assert_eq!(released_rx.recv_timeout(Duration::from_secs(5)).unwrap(), 1);
        }
        // A torn write at the end, as after a crash.
        OpenOptions::new().append(true).open(dir.join("wal.log")).unwrap().write_all(&[9, 0, 0, 0, 1]).unwrap();
        let (_wal, replay) = Wal::open(&dir, Fsync::No, |_| {}).unwrap();
        assert_eq!(replay, (0..6).map(record).collect::<Vec<_>>());
        assert_eq!(
            std::fs::metadata(dir.join("wal.log")).unwrap().len() as usize,
            read_records(&std::fs::read(dir.join("wal.log")).unwrap()).1
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn compaction_keeps_the_checkpoint_and_what_came_after_the_mark() {
        let dir = std::env::temp_dir().join(format!("causeway-wal-compact-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        {
            let (wal, _) = Wal::open(&dir, Fsync::Always, |_| {}).unwrap();
            for i in 0..100 {
                wal.append(&record(i), vec![]);
            }
            wal.mark();
            wal.append(&record(100), vec![]);
            wal.compact(&[record(1000)]);
            wal.append(&record(101), vec![]);
            let deadline = Instant::now() + Duration::from_secs(5);
            while wal.size() > 1000 {
                assert!(Instant::now() < deadline, "no compaction");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        std::thread::sleep(Duration::from_millis(300));
        let (_wal, replay) = Wal::open(&dir, Fsync::No, |_| {}).unwrap();
        assert_eq!(replay, vec![record(1000), record(100), record(101)]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
