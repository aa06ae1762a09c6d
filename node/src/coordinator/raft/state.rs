//! The replicated state machine: the site's current `Topology`.
//!
//! A command is a whole proposed topology. Epochs only move forward: an entry
//! whose epoch is not greater than the current one is ignored (it lost a race
//! with another proposal, or it is a retry of one already applied) and its
//! proposer is told the current epoch. Every member applies the same entries
//! in the same order, so every member ignores the same ones.
//!
//! A snapshot is just the encoded current topology; openraft keeps the log
//! position and membership it covers in the snapshot's metadata.

use std::io::Cursor;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use causeway_core::ring::Topology;
use causeway_core::wire;
use openraft::storage::RaftStateMachine;
use openraft::{
    BasicNode, EntryPayload, LogId, OptionalSend, RaftSnapshotBuilder, Snapshot, SnapshotMeta, StorageError, StorageIOError,
    StoredMembership,
};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::TypeConfig;

type RaftNodeId = <TypeConfig as openraft::RaftTypeConfig>::NodeId;
type Entry = openraft::Entry<TypeConfig>;

/// What applying one entry did: the epoch current afterwards, and whether the
/// entry's topology is the one that became current.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applied {
    pub epoch: u64,
    pub adopted: bool,
}

/// The last built (or received) snapshot, kept so openraft can send it to a
/// follower that is behind the purged part of the log.
#[derive(Clone)]
struct StoredSnapshot {
    meta: SnapshotMeta<RaftNodeId, BasicNode>,
    data: Vec<u8>,
}

impl StoredSnapshot {
    fn to_snapshot(&self) -> Snapshot<TypeConfig> {
        Snapshot { meta: self.meta.clone(), snapshot: Box::new(Cursor::new(self.data.clone())) }
    }
}

pub struct TopologyMachine {
    last_applied: Option<LogId<RaftNodeId>>,
    membership: StoredMembership<RaftNodeId, BasicNode>,
    /// The current topology; receivers are handed out by `RaftHandle::watch`.
    current: watch::Sender<Arc<Topology>>,
    snapshot: Arc<Mutex<Option<StoredSnapshot>>>,
    /// Makes snapshot ids unique even when two are built at the same log id.
    snapshots_built: Arc<AtomicU64>,
}

impl TopologyMachine {
    /// A state machine holding `initial` (the topology the site booted with)
    /// before any entry is applied.
    pub fn new(initial: Topology) -> (Self, watch::Receiver<Arc<Topology>>) {
        let (current, rx) = watch::channel(Arc::new(initial));
        let machine = TopologyMachine {
            last_applied: None,
            membership: StoredMembership::default(),
            current,
            snapshot: Arc::default(),
            snapshots_built: Arc::default(),
        };
        (machine, rx)
    }

    fn epoch(&self) -> u64 {
        self.current.borrow().epoch
    }

    fn propose(&mut self, topology: Topology) -> Applied {
        if topology.epoch <= self.epoch() {
            return Applied { epoch: self.epoch(), adopted: false };
        }
        let epoch = topology.epoch;
        self.current.send_replace(Arc::new(topology));
        Applied { epoch, adopted: true }
    }
}

impl RaftStateMachine<TypeConfig> for TopologyMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<RaftNodeId>>, StoredMembership<RaftNodeId, BasicNode>), StorageError<RaftNodeId>> {
        Ok((self.last_applied, self.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Applied>, StorageError<RaftNodeId>>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut replies = Vec::new();
        for entry in entries {
            self.last_applied = Some(entry.log_id);
            let reply = match entry.payload {
                EntryPayload::Normal(topology) => self.propose(topology),
                EntryPayload::Membership(membership) => {
                    self.membership = StoredMembership::new(Some(entry.log_id), membership);
                    Applied { epoch: self.epoch(), adopted: false }
                }
                EntryPayload::Blank => Applied { epoch: self.epoch(), adopted: false },
            };
            replies.push(reply);
        }
        Ok(replies)
    }

    async fn get_snapshot_builder(&mut self) -> SnapshotBuilder {
        SnapshotBuilder {
            last_applied: self.last_applied,
            membership: self.membership.clone(),
            topology: self.current.borrow().clone(),
            snapshot: self.snapshot.clone(),
            snapshots_built: self.snapshots_built.clone(),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError<RaftNodeId>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<RaftNodeId, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<RaftNodeId>> {
        let data = snapshot.into_inner();
        let topology: Topology =
            wire::decode(&data).map_err(|e| StorageIOError::read_snapshot(Some(meta.signature()), openraft::AnyError::error(e)))?;
        self.last_applied = meta.last_log_id;
        self.membership = meta.last_membership.clone();
        self.current.send_replace(Arc::new(topology));
        *self.snapshot.lock() = Some(StoredSnapshot { meta: meta.clone(), data });
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError<RaftNodeId>> {
        Ok(self.snapshot.lock().as_ref().map(StoredSnapshot::to_snapshot))
    }
}

/// The state as of `get_snapshot_builder`, so the snapshot is consistent even
/// if more entries are applied while it is being built.
pub struct SnapshotBuilder {
    last_applied: Option<LogId<RaftNodeId>>,
    membership: StoredMembership<RaftNodeId, BasicNode>,
    topology: Arc<Topology>,
    snapshot: Arc<Mutex<Option<StoredSnapshot>>>,
    snapshots_built: Arc<AtomicU64>,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<RaftNodeId>> {
        let built = self.snapshots_built.fetch_add(1, Ordering::Relaxed) + 1;
        let at = self.last_applied.map_or_else(|| "none".to_string(), |id| id.to_string());
        let meta =
            SnapshotMeta { last_log_id: self.last_applied, last_membership: self.membership.clone(), snapshot_id: format!("{at}-{built}") };
        let stored = StoredSnapshot { meta, data: wire::encode(&*self.topology) };
        let snapshot = stored.to_snapshot();
        *self.snapshot.lock() = Some(stored);
        Ok(snapshot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use causeway_core::ring::{NodeInfo, Shape};

    fn topology(epoch: u64) -> Topology {
        let nodes = (1..=3).map(|id| NodeInfo { id, addr: format!("127.0.0.1:{}", 7000 + id) }).collect();
        Topology::new(epoch, Shape { partitions: 8, replicas: 3, k: 2 }, nodes).unwrap()
    }

    #[test]
    fn keeps_the_highest_epoch() {
        let (mut machine, rx) = TopologyMachine::new(topology(1));
        assert_eq!(machine.propose(topology(3)), Applied { epoch: 3, adopted: true });
        assert_eq!(machine.propose(topology(3)), Applied { epoch: 3, adopted: false });
        assert_eq!(machine.propose(topology(2)), Applied { epoch: 3, adopted: false });
        assert_eq!(rx.borrow().epoch, 3);
    }

    #[tokio::test]
    async fn snapshot_round_trips_the_topology() {
        let (mut machine, _rx) = TopologyMachine::new(topology(1));
        machine.propose(topology(5));
        let snapshot = machine.get_snapshot_builder().await.build_snapshot().await.unwrap();
        let (mut other, rx) = TopologyMachine::new(topology(1));
        other.install_snapshot(&snapshot.meta, snapshot.snapshot).await.unwrap();
        assert_eq!(**rx.borrow(), topology(5));
        assert!(other.get_current_snapshot().await.unwrap().is_some());
    }
}
