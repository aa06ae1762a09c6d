//! The Raft log, in memory: the vote, the entries not yet purged, and the
//! commit index. A restart of the process loses it (see the module doc of
//! `coordinator::raft` for what that means for the group).

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::ops::RangeBounds;
use std::sync::Arc;

use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{Entry, LogId, LogState, OptionalSend, RaftLogReader, StorageError, Vote};
use parking_lot::Mutex;

use super::TypeConfig;

type RaftNodeId = <TypeConfig as openraft::RaftTypeConfig>::NodeId;

/// The log store. Clones share the same log: openraft reads entries through a
/// clone (the log reader of each replication stream) while the core appends.
#[derive(Clone, Default)]
pub struct LogStore {
    log: Arc<Mutex<Log>>,
}

#[derive(Default)]
struct Log {
    vote: Option<Vote<RaftNodeId>>,
    committed: Option<LogId<RaftNodeId>>,
    /// The last entry dropped after being folded into a snapshot.
    last_purged: Option<LogId<RaftNodeId>>,
    entries: BTreeMap<u64, Entry<TypeConfig>>,
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
        let last_log_id = log.entries.values().next_back().map(|entry| entry.log_id).or(log.last_purged);
        Ok(LogState { last_purged_log_id: log.last_purged, last_log_id })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<RaftNodeId>) -> Result<(), StorageError<RaftNodeId>> {
        self.log.lock().vote = Some(*vote);
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<RaftNodeId>>, StorageError<RaftNodeId>> {
        Ok(self.log.lock().vote)
    }

    async fn save_committed(&mut self, committed: Option<LogId<RaftNodeId>>) -> Result<(), StorageError<RaftNodeId>> {
        self.log.lock().committed = committed;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<RaftNodeId>>, StorageError<RaftNodeId>> {
        Ok(self.log.lock().committed)
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), StorageError<RaftNodeId>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        self.log.lock().entries.extend(entries.into_iter().map(|entry| (entry.log_id.index, entry)));
        // Memory is as durable as this store gets: the entries are "flushed" now.
        callback.log_io_completed(Ok(()));
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<RaftNodeId>) -> Result<(), StorageError<RaftNodeId>> {
        self.log.lock().entries.split_off(&log_id.index);
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId<RaftNodeId>) -> Result<(), StorageError<RaftNodeId>> {
        let mut log = self.log.lock();
        log.entries = log.entries.split_off(&(log_id.index + 1));
        log.last_purged = Some(log_id);
        Ok(())
    }
}
