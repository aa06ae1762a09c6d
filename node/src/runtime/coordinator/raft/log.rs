//! The Raft log: the vote, the entries not yet purged, and the commit index,
//! kept in memory and, when the node has a data directory, on disk under
//! `<data_dir>/raft/`, so that a restarted member still knows whom it voted
//! for and what it accepted (the Raft paper's Figure 2, "persistent state on
//! all servers").
//!
//! Without a directory everything stays in memory (the dev site, most
//! tests): a restarted member comes back empty.
//!
//! On disk there are two files, both made of records
//! `[length u32 LE][crc32 u32 LE][bincode value]` (the write-ahead log's
//! framing, `crate::runtime::wal`):
//!
//! * `hard_state.bin`: one record, `HardState` (the vote, the last committed
//!   log id, the last purged log id). It is replaced whole on every change:
//!   written to a temporary file, synced, renamed over the old one, and the
//!   directory synced, so a crash leaves the old or the new one. `save_vote`
//!   returns only after that, so a vote is on disk before it is answered.
//! * `entries.log`: one record per entry, in index order. `append` writes
//!   the records at the end and syncs before calling openraft's
//!   `LogFlushed` callback. `truncate` cuts the file at the first removed
//!   entry's record and syncs. `purge` first saves the purge point in
//!   `hard_state.bin`, then rewrites `entries.log` with the remaining
//!   entries (temporary file, sync, rename): a crash in between leaves
//!   entries at or below the purge point in the file, and opening drops them.
//!
//! Opening reads `entries.log` up to the first record that is incomplete,
//! fails its checksum, does not decode, or does not follow the previous
//! entry's index (a crash in the middle of an append, or damage) and cuts
//! the file there, with a warning: only an append that never completed can
//! be torn, and openraft was not told about it. A damaged `hard_state.bin`
//! stops the node instead: it is only ever replaced atomically, and guessing
//! a vote is unsafe.
//!
//! One file per log rather than one per entry: appends are one write and one
//! sync, and the coordinator's log is small (a configuration change every
//! now and then; openraft snapshots every 5000 entries and then purges all
//! but the last 1000, so a rewrite on purge is rare and short). The I/O is
//! blocking, done in place by openraft's calls: the coordinator writes
//! rarely, and openraft waits for each write to finish anyway.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use causeway_core::wire;
use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{AnyError, Entry, LogId, LogState, OptionalSend, RaftLogReader, StorageError, StorageIOError, Vote};
use parking_lot::Mutex;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::TypeConfig;

type RaftNodeId = <TypeConfig as openraft::RaftTypeConfig>::NodeId;

const HARD_STATE_FILE: &str = "hard_state.bin";
const LOG_FILE: &str = "entries.log";

/// The log store. Clones share the same log: openraft reads entries through a
/// clone (the log reader of each replication stream) while the core appends.
#[derive(Clone, Default)]
pub struct LogStore {
    log: Arc<Mutex<Log>>,
}

/// What Raft must remember besides the entries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct HardState {
    vote: Option<Vote<RaftNodeId>>,
    committed: Option<LogId<RaftNodeId>>,
    /// The last entry dropped after being folded into a snapshot.
    purged: Option<LogId<RaftNodeId>>,
}

#[derive(Default)]
struct Log {
    hard: HardState,
    entries: BTreeMap<u64, Entry<TypeConfig>>,
    /// None: memory only.
    disk: Option<Disk>,
}

/// The files behind a `Log`.
struct Disk {
    dir: PathBuf,
    /// `entries.log`, opened for appending.
    file: File,
    /// Its length in bytes.
    len: u64,
    /// Where each entry's record starts in it, to cut the file on truncate.
    offsets: BTreeMap<u64, u64>,
}

impl LogStore {
    /// The log kept in `dir` (created if missing), or in memory only.
    pub fn open(dir: Option<&Path>) -> Result<LogStore, String> {
        let Some(dir) = dir else { return Ok(LogStore::default()) };
        fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let hard: HardState = load(dir, HARD_STATE_FILE)?.unwrap_or_default();
        let path = dir.join(LOG_FILE);
        let bytes = match fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
        };
        let (records, valid) = read_entries(&bytes);
        let file = OpenOptions::new().create(true).append(true).open(&path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
        if valid < bytes.len() {
            tracing::warn!("{}: dropping {} bytes after the last valid entry (torn or corrupt tail)", path.display(), bytes.len() - valid);
            file.set_len(valid as u64).and_then(|()| file.sync_all()).map_err(|e| format!("cannot cut {}: {e}", path.display()))?;
        }
        // The file may have just been created: make its name durable too.
        sync_dir(dir).map_err(|e| format!("cannot sync {}: {e}", dir.display()))?;
        let mut entries = BTreeMap::new();
        let mut offsets = BTreeMap::new();
        // Entries the last purge did not get to remove from the file.
        let kept = records.into_iter().filter(|(_, entry)| hard.purged.map(|p| p.index) < Some(entry.log_id.index));
        for (offset, entry) in kept {
            offsets.insert(entry.log_id.index, offset);
            entries.insert(entry.log_id.index, entry);
        }
        let disk = Disk { dir: dir.to_path_buf(), file, len: valid as u64, offsets };
        Ok(LogStore { log: Arc::new(Mutex::new(Log { hard, entries, disk: Some(disk) })) })
    }
}

impl Log {
    fn save_hard_state(&mut self, hard: HardState) -> io::Result<()> {
        if let Some(disk) = &self.disk {
            save(&disk.dir, HARD_STATE_FILE, &hard)?;
        }
        self.hard = hard;
        Ok(())
    }

    /// Returns once the entries are durable (with a directory).
    fn append(&mut self, new: Vec<Entry<TypeConfig>>) -> io::Result<()> {
        debug_assert!(
            new.first().is_none_or(|first| self.entries.keys().next_back().is_none_or(|&last| last < first.log_id.index)),
            "openraft truncates before it appends over existing entries"
        );
        if let Some(disk) = &mut self.disk {
            let mut records = Vec::new();
            let mut offsets = Vec::with_capacity(new.len());
            for entry in &new {
                offsets.push((entry.log_id.index, disk.len + records.len() as u64));
                put_record(entry, &mut records);
            }
            if !records.is_empty() {
                disk.file.write_all(&records)?;
                disk.file.sync_data()?;
                disk.len += records.len() as u64;
                disk.offsets.extend(offsets);
            }
        }
        self.entries.extend(new.into_iter().map(|entry| (entry.log_id.index, entry)));
        Ok(())
    }

    /// Removes the entries from index `since` on.
    fn truncate(&mut self, since: u64) -> io::Result<()> {
        if let Some(disk) = &mut self.disk {
            if let Some(&at) = disk.offsets.range(since..).next().map(|(_, at)| at) {
                disk.file.set_len(at)?;
                disk.file.sync_data()?;
                disk.len = at;
                disk.offsets.split_off(&since);
            }
        }
        self.entries.split_off(&since);
        Ok(())
    }

    /// Removes the entries up to `upto`, inclusive.
    fn purge(&mut self, upto: LogId<RaftNodeId>) -> io::Result<()> {
        // The purge point first: until the file is rewritten, opening drops
        // the entries it covers, so no hole can appear in between.
        self.save_hard_state(HardState { purged: Some(upto), ..self.hard })?;
        self.entries = self.entries.split_off(&(upto.index + 1));
        if let Some(disk) = &mut self.disk {
            disk.rewrite(self.entries.values())?;
        }
        Ok(())
    }
}

impl Disk {
    /// Replaces `entries.log` with the records of `entries`.
    fn rewrite<'a>(&mut self, entries: impl Iterator<Item = &'a Entry<TypeConfig>>) -> io::Result<()> {
        let mut records = Vec::new();
        let mut offsets = BTreeMap::new();
        for entry in entries {
            offsets.insert(entry.log_id.index, records.len() as u64);
            put_record(entry, &mut records);
        }
        replace_file(&self.dir, LOG_FILE, &records)?;
        self.file = OpenOptions::new().append(true).open(self.dir.join(LOG_FILE))?;
        self.len = records.len() as u64;
        self.offsets = offsets;
        Ok(())
    }
}

/// Appends `value` to `out` as one record: `[length][crc32][bincode]`.
fn put_record<T: Serialize>(value: &T, out: &mut Vec<u8>) {
    let payload = wire::encode(value);
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
    out.extend_from_slice(&payload);
}

/// The record at the start of `bytes` and its length in bytes, unless it is
/// incomplete, fails its checksum or does not decode.
fn take_record<T: DeserializeOwned>(bytes: &[u8]) -> Option<(T, usize)> {
    let len = u32::from_le_bytes(bytes.get(..4)?.try_into().expect("4 bytes")) as usize;
    let crc = u32::from_le_bytes(bytes.get(4..8)?.try_into().expect("4 bytes"));
    let payload = bytes.get(8..8 + len)?;
    if crc32fast::hash(payload) != crc {
        return None;
    }
    Some((wire::decode(payload).ok()?, 8 + len))
}

/// The valid prefix of an `entries.log`: each entry with the offset of its
/// record, and the prefix's length in bytes.
fn read_entries(bytes: &[u8]) -> (Vec<(u64, Entry<TypeConfig>)>, usize) {
    let mut entries: Vec<(u64, Entry<TypeConfig>)> = Vec::new();
    let mut at = 0;
    while let Some((entry, len)) = take_record::<Entry<TypeConfig>>(&bytes[at..]) {
        if entries.last().is_some_and(|(_, last)| last.log_id.index + 1 != entry.log_id.index) {
            break;
        }
        entries.push((at as u64, entry));
        at += len;
    }
    (entries, at)
}

/// Replaces `dir/name` with `bytes` so that a crash leaves either the old or
/// the new file whole: a temporary file, synced, renamed over it, and the
/// directory synced so the rename itself is durable.
fn replace_file(dir: &Path, name: &str, bytes: &[u8]) -> io::Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    let mut file = File::create(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    fs::rename(&tmp, dir.join(name))?;
    sync_dir(dir)
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Saves `value` as the only record of `dir/name`, atomically (the hard
/// state here, the snapshot in `state`).
pub(super) fn save<T: Serialize>(dir: &Path, name: &str, value: &T) -> io::Result<()> {
    let mut record = Vec::new();
    put_record(value, &mut record);
    replace_file(dir, name, &record)
}

/// What `save` wrote to `dir/name`, None if nothing was ever saved. A file
/// that is not exactly one valid record is an error: it is only ever
/// replaced whole, so it was damaged, and what it held cannot be guessed.
pub(super) fn load<T: DeserializeOwned>(dir: &Path, name: &str) -> Result<Option<T>, String> {
    let path = dir.join(name);
    let bytes = match fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    match take_record(&bytes) {
        Some((value, len)) if len == bytes.len() => Ok(Some(value)),
        _ => Err(format!("{} is damaged (bad length or checksum); refusing to start without it", path.display())),
    }
}

fn write_error(e: io::Error) -> StorageError<RaftNodeId> {
    StorageIOError::write_logs(AnyError::new(&e)).into()
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError<RaftNodeId>> {
        Ok(self.log.lock().entries.range(range).map(|(_, entry)| entry.clone()).collect())
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError<RaftNodeId>> {
        let log = self.log.lock();
        let last_purged_log_id = log.hard.purged;
        let last_log_id = log.entries.values().next_back().map(|entry| entry.log_id).or(last_purged_log_id);
        Ok(LogState { last_purged_log_id, last_log_id })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<RaftNodeId>) -> Result<(), StorageError<RaftNodeId>> {
        let mut log = self.log.lock();
        let hard = HardState { vote: Some(*vote), ..log.hard };
        log.save_hard_state(hard).map_err(|e| StorageIOError::write_vote(AnyError::new(&e)).into())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<RaftNodeId>>, StorageError<RaftNodeId>> {
        Ok(self.log.lock().hard.vote)
    }

    async fn save_committed(&mut self, committed: Option<LogId<RaftNodeId>>) -> Result<(), StorageError<RaftNodeId>> {
        let mut log = self.log.lock();
        if log.hard.committed == committed {
            return Ok(());
        }
        let hard = HardState { committed, ..log.hard };
        log.save_hard_state(hard).map_err(write_error)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<RaftNodeId>>, StorageError<RaftNodeId>> {
        Ok(self.log.lock().hard.committed)
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), StorageError<RaftNodeId>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let written = self.log.lock().append(entries.into_iter().collect());
        match written {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                let error = write_error(io::Error::new(e.kind(), e.to_string()));
                callback.log_io_completed(Err(e));
                Err(error)
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId<RaftNodeId>) -> Result<(), StorageError<RaftNodeId>> {
        self.log.lock().truncate(log_id.index).map_err(write_error)
    }

    async fn purge(&mut self, log_id: LogId<RaftNodeId>) -> Result<(), StorageError<RaftNodeId>> {
        self.log.lock().purge(log_id).map_err(write_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::coordinator::raft::state::TopologyMachine;
    use crate::runtime::coordinator::raft::tests::Scratch;
    use causeway_core::ring::{NodeInfo, Shape, Topology};
    use openraft::testing::{log_id, membership_ent, StoreBuilder, Suite};
    use openraft::EntryPayload;
    use std::collections::BTreeSet;

    fn topology(epoch: u64) -> Topology {
        let nodes = (1..=3).map(|id| NodeInfo { id, addr: format!("127.0.0.1:{}", 7000 + id) }).collect();
        Topology::new(epoch, Shape { partitions: 8, replicas: 3, k: 2, coding: None }, nodes).unwrap()
    }

    /// Entries `from..=to` of `term`: a membership entry at index 0, then
    /// topologies whose epoch is their index.
    fn entries(term: u64, from: u64, to: u64) -> Vec<Entry<TypeConfig>> {
        (from..=to)
            .map(|index| match index {
                0 => membership_ent::<TypeConfig>(term, 1, 0, vec![BTreeSet::from([1, 2, 3])]),
                _ => Entry { log_id: log_id(term, 1, index), payload: EntryPayload::Normal(topology(index)) },
            })
            .collect()
    }

    fn indexes(store: &LogStore) -> Vec<(u64, u64)> {
        store.log.lock().entries.values().map(|e| (e.log_id.leader_id.term, e.log_id.index)).collect()
    }

    fn open(dir: &Scratch) -> LogStore {
        LogStore::open(Some(dir.path())).unwrap()
    }

    fn log_file(dir: &Scratch) -> PathBuf {
        dir.path().join(LOG_FILE)
    }

    #[tokio::test]
    async fn everything_acknowledged_survives_reopening() {
        let dir = Scratch::new("log-reopen");
        let vote = Vote::new_committed(3, 1);
        {
            let mut store = open(&dir);
            store.save_vote(&Vote::new(2, 2)).await.unwrap();
            store.save_vote(&vote).await.unwrap();
            store.log.lock().append(entries(1, 0, 3)).unwrap();
            store.log.lock().append(entries(1, 4, 6)).unwrap();
            store.save_committed(Some(log_id(1, 1, 4))).await.unwrap();
        }
        let mut store = open(&dir);
        assert_eq!(store.read_vote().await.unwrap(), Some(vote));
        assert_eq!(store.read_committed().await.unwrap(), Some(log_id(1, 1, 4)));
        assert_eq!(store.try_get_log_entries(0..).await.unwrap(), entries(1, 0, 6));
        assert_eq!(store.get_log_state().await.unwrap(), LogState { last_purged_log_id: None, last_log_id: Some(log_id(1, 1, 6)) });

        // A new leader overwrites the uncommitted tail.
        store.truncate(log_id(1, 1, 5)).await.unwrap();
        store.log.lock().append(entries(3, 5, 5)).unwrap();
        drop(store);
        let mut store = open(&dir);
        assert_eq!(indexes(&store), [(1, 0), (1, 1), (1, 2), (1, 3), (1, 4), (3, 5)]);

        // A snapshot covers up to 2: the entries go, the purge point stays.
        store.purge(log_id(1, 1, 2)).await.unwrap();
        store.log.lock().append(entries(3, 6, 7)).unwrap();
        drop(store);
        let mut store = open(&dir);
        assert_eq!(indexes(&store), [(1, 3), (1, 4), (3, 5), (3, 6), (3, 7)]);
        assert_eq!(store.get_log_state().await.unwrap().last_purged_log_id, Some(log_id(1, 1, 2)));
        assert_eq!(store.read_vote().await.unwrap(), Some(vote));
        assert_eq!(store.read_committed().await.unwrap(), Some(log_id(1, 1, 4)));

        // Truncating right after a purge (offsets from the rewritten file).
        store.truncate(log_id(3, 1, 6)).await.unwrap();
        drop(store);
        let mut store = open(&dir);
        assert_eq!(indexes(&store), [(1, 3), (1, 4), (3, 5)]);

        // Everything purged: the log is empty but remembers where it ended.
        store.purge(log_id(3, 1, 9)).await.unwrap();
        drop(store);
        let mut store = open(&dir);
        assert!(indexes(&store).is_empty());
        assert_eq!(
            store.get_log_state().await.unwrap(),
            LogState { last_purged_log_id: Some(log_id(3, 1, 9)), last_log_id: Some(log_id(3, 1, 9)) }
        );
    }

    #[test]
    fn a_torn_or_corrupt_tail_reopens_with_the_valid_prefix() {
        let dir = Scratch::new("log-tail");
        open(&dir).log.lock().append(entries(1, 0, 4)).unwrap();
        let whole = std::fs::read(log_file(&dir)).unwrap();

        // Garbage after the last record (a torn header, or junk).
        std::fs::write(log_file(&dir), [&whole[..], &[7, 0, 0, 0, 1, 2]].concat()).unwrap();
        assert_eq!(indexes(&open(&dir)).len(), 5);
        assert_eq!(std::fs::read(log_file(&dir)).unwrap(), whole, "the garbage is cut off");

        // The last record cut short: it was never acknowledged.
        std::fs::write(log_file(&dir), &whole[..whole.len() - 3]).unwrap();
        let store = open(&dir);
        assert_eq!(indexes(&store), [(1, 0), (1, 1), (1, 2), (1, 3)]);
        // Appending after the cut continues a clean file.
        store.log.lock().append(entries(2, 4, 5)).unwrap();
        drop(store);
        assert_eq!(indexes(&open(&dir)), [(1, 0), (1, 1), (1, 2), (1, 3), (2, 4), (2, 5)]);

        // A flipped byte in the third record: its checksum fails, the prefix before it stays.
        let mut damaged = whole.clone();
        let third = open_offsets(&whole)[2] as usize;
        damaged[third + 10] ^= 0xff;
        std::fs::write(log_file(&dir), &damaged).unwrap();
        assert_eq!(indexes(&open(&dir)), [(1, 0), (1, 1)]);
        assert_eq!(std::fs::metadata(log_file(&dir)).unwrap().len(), third as u64);
    }

    fn open_offsets(bytes: &[u8]) -> Vec<u64> {
        read_entries(bytes).0.into_iter().map(|(offset, _)| offset).collect()
    }

    #[test]
    fn a_crash_between_saving_the_purge_point_and_rewriting_the_file_leaves_no_hole() {
        let dir = Scratch::new("log-purge-crash");
        {
            let store = open(&dir);
            let mut log = store.log.lock();
            log.append(entries(1, 0, 5)).unwrap();
            // What `purge` does first; the rewrite of entries.log never happens.
            let hard = HardState { purged: Some(log_id(1, 1, 2)), ..log.hard };
            log.save_hard_state(hard).unwrap();
        }
        let store = open(&dir);
        assert_eq!(indexes(&store), [(1, 3), (1, 4), (1, 5)]);
        // The stale records are still in the file; cutting the log still works.
        store.log.lock().truncate(4).unwrap();
        drop(store);
        assert_eq!(indexes(&open(&dir)), [(1, 3)]);
    }

    #[test]
    fn a_damaged_hard_state_stops_the_member() {
        let dir = Scratch::new("log-hard-state");
        std::fs::write(dir.path().join(HARD_STATE_FILE), b"\x05\x00\x00\x00\x00\x00\x00\x00abc").unwrap();
        assert!(LogStore::open(Some(dir.path())).is_err());
    }

    /// openraft's own storage suite, on disk and in memory.
    struct Builder {
        on_disk: bool,
    }

    impl StoreBuilder<TypeConfig, LogStore, TopologyMachine, Option<Scratch>> for Builder {
        async fn build(&self) -> Result<(Option<Scratch>, LogStore, TopologyMachine), StorageError<RaftNodeId>> {
            let dir = self.on_disk.then(|| Scratch::new("suite"));
            let path = dir.as_ref().map(Scratch::path);
            let log = LogStore::open(path).unwrap();
            let (machine, _) = TopologyMachine::open(topology(1), path).unwrap();
            Ok((dir, log, machine))
        }
    }

    #[test]
    fn passes_openraft_storage_suite_on_disk() {
        Suite::test_all(Builder { on_disk: true }).unwrap();
    }

    #[test]
    fn passes_openraft_storage_suite_in_memory() {
        Suite::test_all(Builder { on_disk: false }).unwrap();
    }
}
