//! Everything nodes and clients say to each other. One enum, so that the
//! simulator, the TCP transport and the native client carry the same thing.
//!
//! Client requests name the topology `epoch` they were routed with; a node
//! that does not serve the partition at that epoch refuses with
//! `Refusal::NotResponsible` and the caller refreshes its map.
//!
//! This module is plain data, the leaf the protocols stand on: it uses the
//! vocabulary (`hlc` timestamps, `version`s and site ids, `ring` ids and
//! the `Topology`, which is data too: the configuration a node holds and
//! the coordinator pushes) and no protocol (`chain`, `node`, `geo`,
//! `supervisor`, `driver`, `store`, ...). Each protocol's types that travel
//! live here, by topic, and their protocol re-exports them:
//!
//! * `client`: session and request ids, changes, items, refusals.
//! * `chain`: updates down a chain, a replica's state for transfers.
//! * `geo`: geo-replication's messages and what they carry.
//! * `coordinator`: heartbeats.
//! * `ec`: an erasure-coded group's updates and recovery.
//! * `link`: how a binary connection opens.

pub mod chain;
pub mod client;
pub mod coordinator;
pub mod ec;
pub mod geo;
pub mod link;

pub use chain::{Ack, LastWrite, OnDiskEntry, PartitionState, Stored, Update, ValueRef};
pub use client::{
    home_node, session_id, Change, ClientId, Condition, DepOn, Expiry, Item, Keyspace, NewValue, OpId, Put, Refusal, WriteDep, ACK_AT_TAIL,
};
pub use coordinator::{Beat, Recovered};
pub use geo::GeoMsg;
pub use link::{Greeting, Hello, LinkReply, Welcome, BINARY_MAGIC};

use crate::hlc::Timestamp;
use crate::ring::{NodeId, PartitionId, Topology};
use crate::version::{SiteId, Version, VersionVector};
use bytes::Bytes;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, strum::IntoStaticStr)]
pub enum Message {
    // ---- client -> node -------------------------------------------------
    /// Write a key (sent to the head): `Put`, boxed (the largest message
    /// by far, and messages are moved whole several times on their way).
    Put(Box<Put>),
    /// Read the latest version of `key` at this replica; refused as `Behind`
    /// if older than `min` (the version the session already saw).
    Get {
        op: OpId,
        epoch: u64,
        partition: PartitionId,
        key: Bytes,
        min: Option<Box<Version>>,
        /// A linearizable read (sent to the tail): served only while the
        /// node holds the coordinator's lease for its epoch.
        leased: bool,
    },
    /// Answer once the partition's update `seq` has reached the tail (sent to
    /// any replica of the chain): dependency stabilization, ChainReaction
    /// §3.3.1.
    WaitStable {
        op: OpId,
        epoch: u64,
        partition: PartitionId,
        seq: u64,
    },
    /// Read each key's latest version with timestamp <= `at` (sent to heads):
    /// one part of a get-transaction.
    SnapshotRead {
        op: OpId,
        epoch: u64,
        at: Timestamp,
        /// With several sites: only versions whose dependencies on other
        /// sites are within this vector (what the site had applied of each
        /// when the snapshot was taken, `Session::snapshot_bound`), so a
        /// remote write applied meanwhile, older than `at`, never shows up
        /// in half of a snapshot.
        remote: VersionVector,
        keys: Vec<(PartitionId, Bytes)>,
    },
    /// How many bytes `key` takes at this replica (MEMORY USAGE).
    KeyMemory {
        op: OpId,
        epoch: u64,
        partition: PartitionId,
        key: Bytes,
    },
    /// Count live keys in these partitions.
    Count {
        op: OpId,
        epoch: u64,
        partitions: Vec<PartitionId>,
    },
    /// The live keys of these partitions matching `pattern` (KEYS, SCAN);
    /// with `one`, at most one of each partition, at random (RANDOMKEY).
    ListKeys {
        op: OpId,
        epoch: u64,
        partitions: Vec<PartitionId>,
        pattern: Option<Bytes>,
        one: bool,
    },
    /// Drop every key this node holds (FLUSHALL; for tests, not causal).
    Flush {
        op: OpId,
    },
    GetTopology {
        op: OpId,
    },
    /// What this node knows its site has applied of each other site.
    GetSiteTime {
        op: OpId,
    },
    /// Fail this backup site over from its primary (`geo::dr`): from now on
    /// serve no key older than the primary's last noted write of it.
    /// Answered with `FailedOver` once every node of the site knows the
    /// keys whose value never arrived.
    Failover {
        op: OpId,
        force: bool,
    },

    // ---- node -> client -------------------------------------------------
    /// The write reached chain position `chain_index`. `version` is `None`
    /// when its condition did not hold and nothing was written. `old`: the
    /// value the key had, if the change asked for it.
    PutDone {
        op: OpId,
        version: Option<Version>,
        seq: u64,
        chain_index: u8,
        stable: bool,
        /// Every update of the partition up to this one is known to have
        /// reached the tail, at the answering replica (0: not said). The
        /// session forgets what it tracked of them (`Session::stable_through`).
        stable_through: u64,
        old: Option<Box<Bytes>>,
    },
    Value {
        op: OpId,
        item: Box<Item>,
        chain_index: u8,
        /// As `PutDone`'s: the partition's updates up to this one are
        /// stable, at the answering replica (0: not said).
        stable_through: u64,
    },
    Stable {
        op: OpId,
    },
    /// Identifier-first disaster recovery: the backup site has noted write
    /// `op` (its session and `Put::write`) as ordered at `ts`; it may be
    /// acknowledged once its `PutDone` for that version is in too.
    Noted {
        op: OpId,
        ts: Timestamp,
    },
    /// The failover is done: `lost` keys are refused until written again.
    FailedOver {
        op: OpId,
        lost: u64,
    },
    Snapshot {
        op: OpId,
        items: Vec<Item>,
        /// What the node knows its site has applied of each other site.
        site_time: VersionVector,
    },
    Counted {
        op: OpId,
        keyspace: Keyspace,
    },
    KeysAre {
        op: OpId,
        keys: Vec<Bytes>,
    },
    /// The answer to `KeyMemory`: `None` if the key is not there.
    KeyMemoryIs {
        op: OpId,
        bytes: Option<u64>,
    },
    Flushed {
        op: OpId,
    },
    TopologyIs {
        op: OpId,
        topology: Box<Topology>,
    },
    SiteTimeIs {
        op: OpId,
        site: SiteId,
        site_time: VersionVector,
    },
    Refused {
        op: OpId,
        reason: Refusal,
    },

    // ---- node -> node (one chain) ---------------------------------------
    /// Updates for the successor, in seq order. `lazy` when none of them
    /// still has to reach its acknowledging node: the transport sends lazy
    /// traffic after eager traffic (ChainReaction §3.3.1, lazy phase).
    Forward {
        epoch: u64,
        partition: PartitionId,
        updates: Vec<Update>,
        lazy: bool,
    },
    /// A replica that moved up its chain (a role move, or its predecessor
    /// failed) asks its new successor, which may hold more, for what it
    /// holds after `after`, before it serves again.
    CatchUp {
        epoch: u64,
        partition: PartitionId,
        from: NodeId,
        after: u64,
    },
    /// The answer to `CatchUp`: the updates after `after` the successor
    /// holds, and how far it is (`applied`); or, when it no longer has all
    /// of those updates, its whole state.
    Suffix {
        epoch: u64,
        partition: PartitionId,
        updates: Vec<Update>,
        applied: u64,
        state: Option<Box<PartitionState>>,
        /// The sender's clock: the receiver orders its writes after every
        /// timestamp and promise the sender saw.
        clock: Timestamp,
    },
    /// A node that joined the chain asks its predecessor for the state;
    /// `have` is (applied, history) of what it retained of the partition
    /// from its last time in the chain, if anything.
    Fetch {
        epoch: u64,
        partition: PartitionId,
        from: NodeId,
        have: Option<(u64, u64)>,
    },
    /// The partition's state (every key's latest version, the update order
    /// position it reflects, and each session's last write) with the
    /// sender's recent updates, which end where the state is; or, with
    /// `state` None, the `updates` after what the fetching node retained.
    /// Either way `updates` start after history `history_before`.
    Transfer {
        epoch: u64,
        partition: PartitionId,
        state: Option<Box<PartitionState>>,
        updates: Vec<Update>,
        history_before: u64,
        /// The sender's clock (as in `Suffix`).
        clock: Timestamp,
        /// The keys of `state` whose values the sender has in its disk
        /// tier: the new member asks for them after (`FetchValues`), a
        /// chunk at a time, and serves once it has them all.
        on_disk: Vec<OnDiskEntry>,
    },
    /// A new member asks its predecessor for the values of these versions
    /// (a chunk of a `Transfer`'s `on_disk`, in key order); none: it is
    /// still there, waiting for its turn to stream. `done`: it has them
    /// all (the predecessor may let go of versions it kept for it).
    FetchValues {
        partition: PartitionId,
        from: NodeId,
        ids: Vec<ValueRef>,
        done: bool,
    },
    /// The answer: each version's value, `None` if the sender no longer
    /// has it.
    Values {
        partition: PartitionId,
        values: Vec<(ValueRef, Option<Bytes>)>,
    },

    // ---- coordinator <-> node ---------------------------------------------
    /// A new configuration of the site (a higher epoch).
    Reconfigure {
        topology: Box<Topology>,
    },
    /// "I am alive, serve `epoch`, and `joining` of my replicas are still
    /// fetching their state", sent by every node to every coordinator
    /// member: failure detection, rejoin after a restart, and the site's
    /// status.
    Heartbeat(Box<Beat>),
    /// The coordinator leader's answer to a heartbeat sent at `sent_ms` (on
    /// the node's monotonic clock) at `epoch`: the node may serve
    /// linearizable reads until `sent_ms + grant_ms`. The coordinator waits
    /// out a lease before any change that takes the tail role from its
    /// holder, so a tail removed while paused never answers a stale read.
    Lease {
        epoch: u64,
        sent_ms: u64,
        grant_ms: u64,
        /// The coordinator member that leads (heartbeats go mostly to it).
        from: NodeId,
    },

    // ---- node -> node (one chain), continued ------------------------------
    /// Everything up to `seq` has reached the tail; flows head-wards. With
    /// several sites, everything up to `reported` has also reached every
    /// stabilizer replica and every other site (`geo`): before that, every
    /// replica keeps it among its recent updates, for a new tail to send.
    /// Also, everything up to `durable` is on k replicas
    /// (`ChainReplica::durable`): sent by the replicas up to the k-th as
    /// soon as they apply updates, for the heads before them.
    StableUpTo {
        epoch: u64,
        partition: PartitionId,
        seq: u64,
        reported: u64,
        durable: u64,
    },

    // ---- geo-replication (between sites, and inside one for geo) --------
    Geo(Box<GeoMsg>),
    /// A message of erasure-coded group `group` from its member at slot
    /// `from` (`ec`).
    Ec {
        group: u16,
        from: u8,
        msg: Box<ec::EcMsg>,
    },
    /// Erasure coding: each node's standing in the groups as the sender
    /// knows it (`ec::site`).
    EcHello {
        from: NodeId,
        nodes: Vec<(NodeId, ec::Standing)>,
    },
}

impl Message {
    /// The message's variant, or for geo-replication the geo message's
    /// (`Ids`, `Promises`, ...): what INFO counts peer messages by.
    pub fn kind(&self) -> &'static str {
        match self {
            Message::Geo(g) => g.as_ref().into(),
            m => m.into(),
        }
    }

    /// A geo-replication message (`Message::Geo`, boxed: messages are
    /// moved whole several times on their way, so the enum stays small).
    pub fn geo(msg: GeoMsg) -> Message {
        Message::Geo(Box::new(msg))
    }

    /// The geo-replication message this is, if it is one.
    pub fn as_geo(&self) -> Option<&GeoMsg> {
        match self {
            Message::Geo(g) => Some(g),
            _ => None,
        }
    }

    /// The geo-replication message this is, if it is one, unboxed.
    pub fn into_geo(self) -> Option<GeoMsg> {
        match self {
            Message::Geo(g) => Some(*g),
            _ => None,
        }
    }

    /// The request a reply answers, or a request's own id.
    pub fn op(&self) -> Option<OpId> {
        use Message::*;
        match self {
            Put(put) => Some(put.op),
            Get { op, .. }
            | WaitStable { op, .. }
            | SnapshotRead { op, .. }
            | Count { op, .. }
            | ListKeys { op, .. }
            | KeyMemory { op, .. }
            | Flush { op }
            | GetTopology { op }
            | GetSiteTime { op }
            | Failover { op, .. } => Some(*op),
            PutDone { op, .. }
            | Value { op, .. }
            | Stable { op }
            | Noted { op, .. }
            | FailedOver { op, .. }
            | Snapshot { op, .. }
            | Counted { op, .. }
            | KeysAre { op, .. }
            | KeyMemoryIs { op, .. }
            | Flushed { op }
            | TopologyIs { op, .. }
            | SiteTimeIs { op, .. }
            | Refused { op, .. } => Some(*op),
            Forward { .. }
            | StableUpTo { .. }
            | CatchUp { .. }
            | Suffix { .. }
            | Fetch { .. }
            | Transfer { .. }
            | FetchValues { .. }
            | Values { .. }
            | Reconfigure { .. }
            | Heartbeat { .. }
            | Lease { .. }
            | Geo(_)
            | Ec { .. }
            | EcHello { .. } => None,
        }
    }

    /// Whether this goes from a node to a client.
    pub fn is_reply(&self) -> bool {
        use Message::*;
        matches!(
            self,
            PutDone { .. }
                | Value { .. }
                | Stable { .. }
                | Noted { .. }
                | FailedOver { .. }
                | Snapshot { .. }
                | Counted { .. }
                | KeysAre { .. }
                | KeyMemoryIs { .. }
                | Flushed { .. }
                | TopologyIs { .. }
                | SiteTimeIs { .. }
                | Refused { .. }
        )
    }
}

/// Where a message goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Dest {
    Node(NodeId),
    Client(ClientId),
    /// Another site: whichever of its nodes gets it passes it on to the
    /// one it is for (`geo`).
    Site(SiteId),
}

/// A message and where it goes.
#[derive(Clone, Debug, PartialEq)]
pub struct Envelope {
    pub to: Dest,
    pub msg: Message,
}

/// Where a state machine puts what it wants sent.
pub type Outbox = Vec<Envelope>;

/// Sends `msg` to `to`.
pub fn send(out: &mut Outbox, to: Dest, msg: Message) {
    out.push(Envelope { to, msg });
}
