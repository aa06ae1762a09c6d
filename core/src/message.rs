//! Everything nodes and clients say to each other. One enum, so that the
//! simulator, the TCP transport and the native client carry the same thing.
//!
//! Client requests name the topology `epoch` they were routed with; a node
//! that does not serve the partition at that epoch refuses with
//! `Refusal::NotResponsible` and the caller refreshes its map.

use crate::hlc::Timestamp;
use crate::ring::{NodeId, PartitionId, Topology};
use crate::version::{SiteId, Version, VersionVector};
use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// A client session (a Redis connection's proxy session or a native client).
/// The top 16 bits are 1 + the node the session lives on, or 0 for a native
/// client (connected to every node), so replies can be routed without a
/// lookup service.
pub type ClientId = u64;

/// The node a client id lives on, if it is a proxy session.
pub fn home_node(client: ClientId) -> Option<NodeId> {
    match client >> 48 {
        0 => None,
        n => Some((n - 1) as NodeId),
    }
}

/// A client id for the `n`th session of `node`.
pub fn session_id(node: NodeId, n: u64) -> ClientId {
    ((node as u64 + 1) << 48) | (n & ((1 << 48) - 1))
}

/// One request of one client; replies carry it back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct OpId {
    pub client: ClientId,
    pub seq: u64,
}

/// What a write does to its key. Its head decides it against what the key
/// holds then (SET's NX and XX, EXPIRE's conditions, KEEPTTL, GET), so the
/// update that goes down the chain is plain: a value (or none) and an
/// expiry instant.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    pub value: NewValue,
    pub expiry: Expiry,
    pub condition: Condition,
    /// The answer carries the value the key had (SET ... GET, GETEX).
    pub get: bool,
}

impl Change {
    /// SET key value: a new value, no expiry.
    pub fn set(value: Bytes) -> Change {
        Change { value: NewValue::Set(value), expiry: Expiry::Never, condition: Condition::Always, get: false }
    }

    /// DEL key: a tombstone, if the key holds a value.
    pub fn delete() -> Change {
        Change { value: NewValue::Delete, expiry: Expiry::Never, condition: Condition::IfPresent, get: false }
    }

    /// The new value, if the change sets one.
    pub fn new_value(&self) -> Option<&Bytes> {
        match &self.value {
            NewValue::Set(v) => Some(v),
            NewValue::Delete | NewValue::Keep => None,
        }
    }
}

/// A change's value.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NewValue {
    Set(Bytes),
    Delete,
    /// The key keeps its value (EXPIRE, PERSIST, GETEX): only its expiry
    /// changes, and only if it holds a value.
    Keep,
}

/// A change's expiry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Expiry {
    /// The key keeps its expiry (SET ... KEEPTTL).
    Keep,
    /// None (a plain SET, PERSIST).
    Never,
    /// This many milliseconds after the head orders the write (EX, PX,
    /// EXPIRE, PEXPIRE).
    After(u64),
    /// At this Unix time in milliseconds (EXAT, PXAT, EXPIREAT,
    /// PEXPIREAT). An instant already past deletes the key.
    At(u64),
}

/// When a change applies, given what its key holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Condition {
    Always,
    /// NX: the key holds no value.
    IfAbsent,
    /// XX: the key holds a value.
    IfPresent,
    /// EXPIRE ... NX: the key holds a value without an expiry.
    IfNoExpiry,
    /// EXPIRE ... XX: the key holds a value with an expiry.
    IfExpiry,
    /// EXPIRE ... GT: the new expiry is later (no expiry counts as never).
    IfLater,
    /// EXPIRE ... LT: the new expiry is sooner.
    IfSooner,
    /// EXPIRE ... XX LT: the key has an expiry and the new one is sooner.
    IfExpiryAndSooner,
}

/// A write as it travels down a chain.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Update {
    /// Position in the partition's update order, from 1, assigned by the head.
    pub seq: u64,
    pub key: Bytes,
    pub version: Version,
    /// `None` deletes.
    pub value: Option<Bytes>,
    pub expires_at_ms: Option<u64>,
    /// Who to answer and where (a client's write; `None` for other sites'
    /// writes applied here).
    pub ack: Option<Ack>,
    /// The writer's causal past in this site when it wrote (its session's
    /// entry for this site): the update depends on no other update of this
    /// site after it. Other sites apply concurrent updates of this site in
    /// parallel thanks to it (`geo::receiver`). Zero for other sites'
    /// updates applied here.
    pub local_dep: Timestamp,
    /// The head's active expiry (`chain::expiry`): version `version` of the
    /// key, whose expiry has passed, is now a tombstone, with the same
    /// version, so it beats exactly what that version beat and loses to
    /// any later write, wherever written. Each site expires its own copies
    /// (other sites never get these).
    pub expired: bool,
}

/// A client write's answer, as its update carries it down the chain.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ack {
    /// The client and the write's id in its session.
    pub op: OpId,
    /// The chain position that answers (k-1 for causal writes).
    pub at: u8,
    /// Every write of the session with a smaller id was finished when this
    /// one was sent (`Message::Put`): replicas forget those.
    pub done_below: u64,
    /// The value the key had, for a change that asked for it
    /// (`Change::get`): the head knows it, the answering replica says it.
    pub old: Option<Bytes>,
}

/// Something a write's head must wait for before it orders the write
/// (`Message::Put`): a version of another key the session saw or wrote,
/// stable, so that nobody reads the write and then an older value of that
/// key (ChainReaction's dependency stabilization, done at the head); or,
/// for the same key, just applied before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteDep {
    pub partition: PartitionId,
    pub on: DepOn,
    /// It writes the same key: applied is enough (the new version
    /// supersedes it).
    pub same_key: bool,
}

/// How a dependency is named.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DepOn {
    /// The partition's update with this sequence number (a version the
    /// session read, or a write of its that was acknowledged).
    Seq(u64),
    /// The session's write with this id, not acknowledged yet when this
    /// one was sent (pipelined writes).
    Write(u64),
}

/// A value as read, with what the client library needs to keep its metadata.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Item {
    pub value: Option<Bytes>,
    /// `None` if the key was never written (or flushed).
    pub version: Option<Version>,
    /// The version's position in its partition's update order.
    pub seq: u64,
    /// Whether the version is known to have reached the tail.
    pub stable: bool,
    /// When the value expires (Unix ms), if it does.
    pub expires_at_ms: Option<u64>,
}

/// Live keys, and how many of them expire (DBSIZE, INFO keyspace).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Keyspace {
    pub keys: u64,
    pub expires: u64,
}

impl std::ops::AddAssign for Keyspace {
    fn add_assign(&mut self, other: Keyspace) {
        self.keys += other.keys;
        self.expires += other.expires;
    }
}

/// Why a node did not serve a request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Refusal {
    /// This node does not serve that partition at the caller's epoch; `epoch`
    /// is the node's own.
    NotResponsible { epoch: u64 },
    /// This replica has not yet received the version the client already saw
    /// (its chain index is stale); ChainReaction §3.3.3: try nearer the head.
    Behind,
    /// A snapshot read asked for history this replica no longer keeps.
    SnapshotTooOld,
    /// Fewer than k replicas of the partition are alive: writes would not be
    /// as durable as promised.
    Unavailable { alive: u8, needed: u8 },
    /// A linearizable read reached a node without a current lease from the
    /// coordinator (it may have been removed without knowing it yet).
    NoLease,
}

/// `ack_at` for a write answered only by the tail (linearizable): a
/// position past any chain's end, so that a chain that grows while the
/// write is on its way still answers only at its end.
pub const ACK_AT_TAIL: u8 = u8::MAX;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, strum::IntoStaticStr)]
pub enum Message {
    // ---- client -> node -------------------------------------------------
    /// Write `key` (sent to the head). `past` is the session's causal past
    /// (`Session::past`): the new version's timestamp will be greater than
    /// every entry, and its vector is `past` with its own timestamp. The node at chain
    /// position `ack_at` answers, or the tail if the chain is shorter
    /// (`ACK_AT_TAIL`: whichever node is the tail when the write gets there).
    Put {
        op: OpId,
        epoch: u64,
        partition: PartitionId,
        key: Bytes,
        change: Change,
        past: VersionVector,
        ack_at: u8,
        /// The write's id within the client's session. A write resent after
        /// a failure keeps it, so a head that already has the write answers
        /// instead of applying it again; its acknowledgement names it.
        write: u64,
        /// What the head waits for before it orders the write: the
        /// session's unstable past, when the head holds a replica of the
        /// partition concerned (otherwise the session waited for it before
        /// sending), and the session's previous write if it is still in
        /// flight. A session's writes thus run together (pipelining)
        /// without any reader seeing one before what it depends on.
        deps: Vec<WriteDep>,
        /// Every write of the session with a smaller id is finished (answered
        /// or given up): a late copy of one is dropped, and replicas forget
        /// them.
        done_below: u64,
    },
    /// Read the latest version of `key` at this replica; refused as `Behind`
    /// if older than `min` (the version the session already saw).
    Get {
        op: OpId,
        epoch: u64,
        partition: PartitionId,
        key: Bytes,
        min: Option<Version>,
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
        old: Option<Bytes>,
    },
    Value {
        op: OpId,
        item: Item,
        chain_index: u8,
    },
    Stable {
        op: OpId,
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
        topology: Topology,
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
        state: Option<crate::chain::PartitionState>,
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
        state: Option<crate::chain::PartitionState>,
        updates: Vec<Update>,
        history_before: u64,
        /// The sender's clock (as in `Suffix`).
        clock: Timestamp,
    },

    // ---- coordinator <-> node ---------------------------------------------
    /// A new configuration of the site (a higher epoch).
    Reconfigure {
        topology: Topology,
    },
    /// "I am alive, serve `epoch`, and `joining` of my replicas are still
    /// fetching their state", sent by every node to every coordinator
    /// member: failure detection, rejoin after a restart, and the site's
    /// status.
    Heartbeat(crate::node::Beat),
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
    Geo(crate::geo::GeoMsg),
}

impl Message {
    /// The message's variant, or for geo-replication the geo message's
    /// (`Ids`, `Promises`, ...): what INFO counts peer messages by.
    pub fn kind(&self) -> &'static str {
        match self {
            Message::Geo(g) => g.into(),
            m => m.into(),
        }
    }

    /// The request a reply answers, or a request's own id.
    pub fn op(&self) -> Option<OpId> {
        use Message::*;
        match self {
            Put { op, .. }
            | Get { op, .. }
            | WaitStable { op, .. }
            | SnapshotRead { op, .. }
            | Count { op, .. }
            | KeyMemory { op, .. }
            | Flush { op }
            | GetTopology { op }
            | GetSiteTime { op } => Some(*op),
            PutDone { op, .. }
            | Value { op, .. }
            | Stable { op }
            | Snapshot { op, .. }
            | Counted { op, .. }
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
            | Reconfigure { .. }
            | Heartbeat { .. }
            | Lease { .. }
            | Geo(_) => None,
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
                | Snapshot { .. }
                | Counted { .. }
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

/// The first byte of a binary (peer or native client) connection. It is not
/// ASCII, so a node tells binary connections from Redis clients on the same
/// port by it.
pub const BINARY_MAGIC: u8 = 0xCA;

/// The node's answer to a native client's `Hello`, sent once the client is
/// registered (so replies from any node of the site reach it from then on):
/// `Err` says why the connection is refused.
pub type Welcome = Result<(), String>;

/// The first frame of a binary connection: who is speaking.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Hello {
    /// Another node of the site: the connection carries its messages to us,
    /// each frame a `(sequence number, Message)` of the sender's `stream`
    /// (one per sending process and peer), so frames that a broken
    /// connection may have lost are resent on the next one and duplicates
    /// dropped. The acceptor answers with `LinkReply`s.
    Node { id: NodeId, stream: u64 },
    /// A native client: replies for it go back on this connection. The
    /// password is checked against the node's `requirepass`.
    Client { id: ClientId, password: Option<String> },
    /// The coordinator's Raft member on node `NodeId`: the connection carries
    /// Raft RPCs, each request frame answered by one response frame.
    Raft(NodeId),
    /// A node of another site: like `Node`, carrying geo-replication only.
    Site { site: crate::version::SiteId, node: NodeId, stream: u64 },
}

/// What a node sends back on a connection another node opened to it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LinkReply {
    /// Right after the hello: this process (`incarnation`) has taken every
    /// frame of the stream up to `last`; the sender resends what follows.
    Resume { incarnation: u64, last: u64 },
    /// Every frame up to this sequence number has been taken.
    Ack(u64),
}
