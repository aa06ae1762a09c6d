//! What clients ask and are answered: session and request ids, the change a
//! write makes, what a read returns, and why a node refused.

use crate::ring::{NodeId, PartitionId};
use crate::version::{Version, VersionVector};
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
    /// The answer carries the value the key had (SET ... GET, GETEX; for
    /// `NewValue::Add`, the value written).
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

    /// Whether deciding the change reads the key's value (not only
    /// whether it exists and its expiry): GET, or an expiry change that
    /// keeps it.
    pub fn needs_value(&self) -> bool {
        self.get || self.value == NewValue::Keep || self.value.is_computed()
    }

    /// Whether the change is decided without anything of what the key
    /// holds: a plain SET (with or without a fresh expiry), or a DEL.
    pub fn is_blind(&self) -> bool {
        !self.get
            && match self.value {
                NewValue::Set(_) => self.condition == Condition::Always && self.expiry != Expiry::Keep,
                NewValue::Delete => true,
                NewValue::Keep | NewValue::Add(_) | NewValue::AddFloat(_) | NewValue::Append(_) | NewValue::SetRange(..) => false,
            }
    }

    /// The bytes the change brings (a SET's value, what APPEND or SETRANGE
    /// add): what a DR note counts.
    pub fn payload_len(&self) -> usize {
        match &self.value {
            NewValue::Set(v) | NewValue::Append(v) | NewValue::SetRange(_, v) => v.len(),
            _ => 0,
        }
    }

    /// The new value, if the change sets one.
    pub fn new_value(&self) -> Option<&Bytes> {
        match &self.value {
            NewValue::Set(v) => Some(v),
            NewValue::Delete | NewValue::Keep | NewValue::Add(_) | NewValue::AddFloat(_) | NewValue::Append(_) | NewValue::SetRange(..) => {
                None
            }
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
    /// The key's integer plus this (INCR, DECR, INCRBY, DECRBY; a missing
    /// key counts as 0), decided at the head; the answer carries the value
    /// written (`Decided::old`).
    Add(i64),
    /// The key's number plus this `f64` (its bits: INCRBYFLOAT), decided
    /// at the head like `Add`.
    AddFloat(u64),
    /// The key's value with these bytes after it (APPEND; a missing key is
    /// empty), decided at the head; the answer carries the new length in
    /// decimal.
    Append(Bytes),
    /// The key's value with these bytes written at this offset, zeros
    /// filling any gap (SETRANGE), decided at the head; the answer carries
    /// the new length in decimal.
    SetRange(u64, Bytes),
}

impl NewValue {
    /// Whether the head computes the value from the key's (INCR and its
    /// family, APPEND, SETRANGE): the answer carries what it made.
    pub fn is_computed(&self) -> bool {
        matches!(self, NewValue::Add(_) | NewValue::AddFloat(_) | NewValue::Append(_) | NewValue::SetRange(..))
    }
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
    /// The head's node is over its memory budget and may not grow
    /// (`--maxmemory`, with `noeviction` or nothing left to evict).
    OutOfMemory,
    /// The node's disk tier failed: a value could not be read back, or
    /// values could not move out and the node is over its budget (why).
    Disk(String),
    /// After a failover (`geo::dr`): the primary site acknowledged a write
    /// of `key`, `missing`, whose value never arrived here.
    Lost { key: Bytes, missing: Version },
    /// Not done with this site's redundancy mode (why).
    Unsupported(String),
}

/// `ack_at` for a write answered only by the tail (linearizable): a
/// position past any chain's end, so that a chain that grows while the
/// write is on its way still answers only at its end.
pub const ACK_AT_TAIL: u8 = u8::MAX;

/// Write `key` (sent to the head). `past` is the session's causal past
/// (`Session::past`): the new version's timestamp will be greater than
/// every entry, and its vector is `past` with its own timestamp. The node at chain
/// position `ack_at` answers, or the tail if the chain is shorter
/// (`ACK_AT_TAIL`: whichever node is the tail when the write gets there).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Put {
    pub op: OpId,
    pub epoch: u64,
    pub partition: PartitionId,
    pub key: Bytes,
    pub change: Change,
    pub past: VersionVector,
    pub ack_at: u8,
    /// The write's id within the client's session. A write resent after
    /// a failure keeps it, so a head that already has the write answers
    /// instead of applying it again; its acknowledgement names it.
    pub write: u64,
    /// What the head waits for before it orders the write: the
    /// session's unstable past, when the head holds a replica of the
    /// partition concerned (otherwise the session waited for it before
    /// sending), and the session's previous write if it is still in
    /// flight. A session's writes thus run together (pipelining)
    /// without any reader seeing one before what it depends on.
    pub deps: Vec<WriteDep>,
    /// Every write of the session with a smaller id is finished (answered
    /// or given up): a late copy of one is dropped, and replicas forget
    /// them.
    pub done_below: u64,
}
