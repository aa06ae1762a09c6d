//! The replicated state machine: the site's current `Topology`.
//!
//! A command is a whole proposed topology. Epochs only move forward: an entry
//! whose epoch is not greater than the current one is ignored (it lost a race
//! with another proposal, or it is a retry of one already applied) and its
//! proposer is told the current epoch. Every member applies the same entries
//! in the same order, so every member ignores the same ones.
//!
//! A snapshot is just the encoded current topology; openraft keeps the log
//! position and membership it covers in the snapshot's metadata. With a data
//! directory the latest snapshot (built here, or installed from the leader)
//! is saved in `snapshot.bin` (one checksummed record, replaced atomically,
//! see `log`) before openraft hears of it, so before it purges the entries
//! the snapshot covers. The state machine itself is not saved: a restarted
//! member starts from its saved snapshot, and openraft re-applies the
//! committed entries after it (the log saves the commit index).
//!
//! The machine starts from `initial` (the node's own last configuration, or
//! the boot topology): it is replaced only by a topology with a greater
//! epoch, whether from the saved snapshot, an entry or an installed
//! snapshot, so nothing moves the configuration back.

use std::io::{self, Cursor};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use causeway_core::ring::Topology;
use causeway_core::wire;
use openraft::storage::RaftStateMachine;
use openraft::{
    AnyError, BasicNode, EntryPayload, LogId, OptionalSend, RaftSnapshotBuilder, Snapshot, SnapshotMeta, StorageError, StorageIOError,
    StoredMembership,
};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::log::{load, save};
use super::TypeConfig;

type RaftNodeId = <TypeConfig as openraft::RaftTypeConfig>::NodeId;
type Entry = openraft::Entry<TypeConfig>;

const SNAPSHOT_FILE: &str = "snapshot.bin";

/// What applying one entry did: the epoch current afterwards, and whether the
/// entry's topology is the one that became current.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applied {
    pub epoch: u64,
    pub adopted: bool,
}

/// A built (or received) snapshot.
#[derive(Clone, Serialize, Deserialize)]
struct StoredSnapshot {
    meta: SnapshotMeta<RaftNodeId, BasicNode>,
    data: Vec<u8>,
}

impl StoredSnapshot {
    fn to_snapshot(&self) -> Snapshot<TypeConfig> {
        Snapshot { meta: self.meta.clone(), snapshot: Box::new(Cursor::new(self.data.clone())) }
    }

    fn topology(&self) -> Result<Topology, String> {
        Ok(wire::decode(&self.data)?)
    }
}

/// The latest snapshot, kept so openraft can send it to a follower that is
/// behind the purged part of the log. Shared by the machine and its
/// builders, which openraft runs in a task of their own.
struct Snapshots {
    /// None: memory only.
    dir: Option<PathBuf>,
    latest: Mutex<Option<StoredSnapshot>>,
}

impl Snapshots {
    /// Keeps `snapshot` (on disk first) unless the one kept is newer: a
    /// build may finish after a newer snapshot was installed.
    fn keep(&self, snapshot: StoredSnapshot) -> io::Result<()> {
        let mut latest = self.latest.lock();
        if latest.as_ref().is_some_and(|kept| kept.meta.last_log_id > snapshot.meta.last_log_id) {
            return Ok(());
        }
        if let Some(dir) = &self.dir {
            save(dir, SNAPSHOT_FILE, &snapshot)?;
        }
        *latest = Some(snapshot);
        Ok(())
    }
}

fn write_error(meta: &SnapshotMeta<RaftNodeId, BasicNode>, e: io::Error) -> StorageError<RaftNodeId> {
    StorageIOError::write_snapshot(Some(meta.signature()), AnyError::new(&e)).into()
}

pub struct TopologyMachine {
    last_applied: Option<LogId<RaftNodeId>>,
    membership: StoredMembership<RaftNodeId, BasicNode>,
    /// The current topology; receivers are handed out by `RaftHandle::watch`.
    current: watch::Sender<Arc<Topology>>,
    snapshots: Arc<Snapshots>,
    /// Makes snapshot ids unique even when two are built at the same log id.
    snapshots_built: Arc<AtomicU64>,
}

impl TopologyMachine {
    /// A state machine holding `initial` (the topology the node starts
    /// with), or the snapshot saved in `dir` if it has a greater epoch, and
    /// the log position that snapshot covers. Without `dir`, memory only.
    pub fn open(initial: Topology, dir: Option<&Path>) -> Result<(Self, watch::Receiver<Arc<Topology>>), String> {
        let saved: Option<StoredSnapshot> = match dir {
            Some(dir) => {
                std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
                load(dir, SNAPSHOT_FILE)?
            }
            None => None,
        };
        let (current, rx) = watch::channel(Arc::new(initial));
        let mut machine = TopologyMachine {
            last_applied: None,
            membership: StoredMembership::default(),
            current,
            snapshots: Arc::new(Snapshots { dir: dir.map(Path::to_path_buf), latest: Mutex::new(None) }),
            snapshots_built: Arc::default(),
        };
        if let Some(saved) = saved {
            let topology = saved.topology().map_err(|e| format!("the saved raft snapshot: {e}"))?;
            machine.restore(&saved.meta, topology);
            *machine.snapshots.latest.lock() = Some(saved);
        }
        Ok((machine, rx))
    }

    fn epoch(&self) -> u64 {
        self.current.borrow().epoch
    }

    /// Makes `topology` current if its epoch is greater.
    fn adopt(&mut self, topology: Topology) -> Applied {
        if topology.epoch <= self.epoch() {
            return Applied { epoch: self.epoch(), adopted: false };
        }
        let epoch = topology.epoch;
        self.current.send_replace(Arc::new(topology));
        Applied { epoch, adopted: true }
    }

    /// Moves to the state a snapshot describes.
    fn restore(&mut self, meta: &SnapshotMeta<RaftNodeId, BasicNode>, topology: Topology) {
        self.last_applied = meta.last_log_id;
        self.membership = meta.last_membership.clone();
        self.adopt(topology);
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
                EntryPayload::Normal(topology) => self.adopt(topology),
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
            snapshots: self.snapshots.clone(),
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
        let stored = StoredSnapshot { meta: meta.clone(), data: snapshot.into_inner() };
        let topology =
            stored.topology().map_err(|e| StorageError::from(StorageIOError::read_snapshot(Some(meta.signature()), AnyError::error(e))))?;
        self.snapshots.keep(stored).map_err(|e| write_error(meta, e))?;
        self.restore(meta, topology);
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError<RaftNodeId>> {
        Ok(self.snapshots.latest.lock().as_ref().map(StoredSnapshot::to_snapshot))
    }
}

/// The state as of `get_snapshot_builder`, so the snapshot is consistent even
/// if more entries are applied while it is being built.
pub struct SnapshotBuilder {
    last_applied: Option<LogId<RaftNodeId>>,
    membership: StoredMembership<RaftNodeId, BasicNode>,
    topology: Arc<Topology>,
    snapshots: Arc<Snapshots>,
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
        self.snapshots.keep(stored).map_err(|e| write_error(&snapshot.meta, e))?;
        Ok(snapshot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::coordinator::raft::tests::Scratch;
    use causeway_core::ring::{NodeInfo, Shape};
    use openraft::testing::log_id;

    fn topology(epoch: u64) -> Topology {
        let nodes = (1..=3).map(|id| NodeInfo { id, addr: format!("127.0.0.1:{}", 7000 + id) }).collect();
        Topology::new(epoch, Shape { partitions: 8, replicas: 3, k: 2, coding: None }, nodes).unwrap()
    }

    fn proposal(index: u64, epoch: u64) -> Entry {
        Entry { log_id: log_id(1, 1, index), payload: EntryPayload::Normal(topology(epoch)) }
    }

    #[test]
    fn keeps_the_highest_epoch() {
        let (mut machine, rx) = TopologyMachine::open(topology(1), None).unwrap();
        assert_eq!(machine.adopt(topology(3)), Applied { epoch: 3, adopted: true });
        assert_eq!(machine.adopt(topology(3)), Applied { epoch: 3, adopted: false });
        assert_eq!(machine.adopt(topology(2)), Applied { epoch: 3, adopted: false });
        assert_eq!(rx.borrow().epoch, 3);
    }

    #[tokio::test]
    async fn snapshot_round_trips_the_topology() {
        let (mut machine, _rx) = TopologyMachine::open(topology(1), None).unwrap();
        machine.adopt(topology(5));
        let snapshot = machine.get_snapshot_builder().await.build_snapshot().await.unwrap();
        let (mut other, rx) = TopologyMachine::open(topology(1), None).unwrap();
        other.install_snapshot(&snapshot.meta, snapshot.snapshot).await.unwrap();
        assert_eq!(**rx.borrow(), topology(5));
        assert!(other.get_current_snapshot().await.unwrap().is_some());
    }

    #[tokio::test]
    async fn a_saved_snapshot_brings_the_state_back_unless_the_initial_topology_is_newer() {
        let dir = Scratch::new("sm-reopen");
        let built = {
            let (mut machine, _rx) = TopologyMachine::open(topology(1), Some(dir.path())).unwrap();
            machine.apply([proposal(1, 4), proposal(2, 5)]).await.unwrap();
            machine.get_snapshot_builder().await.build_snapshot().await.unwrap().meta
        };
        // Applied entries alone are not saved; the snapshot is.
        let (mut machine, rx) = TopologyMachine::open(topology(1), Some(dir.path())).unwrap();
        assert_eq!(**rx.borrow(), topology(5));
        assert_eq!(machine.applied_state().await.unwrap().0, Some(log_id(1, 1, 2)));
        assert_eq!(machine.get_current_snapshot().await.unwrap().map(|s| s.meta), Some(built.clone()));

        // A node that already runs a newer configuration keeps it.
        let (mut machine, rx) = TopologyMachine::open(topology(7), Some(dir.path())).unwrap();
        assert_eq!(rx.borrow().epoch, 7);
        assert_eq!(machine.applied_state().await.unwrap().0, Some(log_id(1, 1, 2)));
        // And re-applying the entries after the snapshot does not move it back.
        assert_eq!(machine.apply([proposal(3, 6)]).await.unwrap(), vec![Applied { epoch: 7, adopted: false }]);
    }

    #[tokio::test]
    async fn an_installed_snapshot_is_saved_and_never_moves_the_epoch_back() {
        let dir = Scratch::new("sm-install");
        let (mut leader, _rx) = TopologyMachine::open(topology(1), None).unwrap();
        leader.apply([proposal(1, 3)]).await.unwrap();
        let snapshot = leader.get_snapshot_builder().await.build_snapshot().await.unwrap();
        {
            let (mut follower, rx) = TopologyMachine::open(topology(4), Some(dir.path())).unwrap();
            follower.install_snapshot(&snapshot.meta, snapshot.snapshot).await.unwrap();
            assert_eq!(rx.borrow().epoch, 4);
            assert_eq!(follower.applied_state().await.unwrap().0, Some(log_id(1, 1, 1)));
        }
        let (mut reopened, rx) = TopologyMachine::open(topology(1), Some(dir.path())).unwrap();
        assert_eq!(rx.borrow().epoch, 3);
        assert_eq!(reopened.get_current_snapshot().await.unwrap().map(|s| s.meta), Some(snapshot.meta));
    }

    #[test]
    fn a_damaged_snapshot_file_is_an_error() {
        let dir = Scratch::new("sm-damaged");
        std::fs::write(dir.path().join(SNAPSHOT_FILE), b"not a record").unwrap();
        assert!(TopologyMachine::open(topology(1), Some(dir.path())).is_err());
    }
}
