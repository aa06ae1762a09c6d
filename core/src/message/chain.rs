//! What travels along a chain: updates, with the answer they owe a client,
//! and a replica's whole state as a state transfer or a checkpoint carries
//! it.

use super::client::{ClientId, OpId};
use crate::hlc::Timestamp;
use crate::version::Version;
use bytes::Bytes;
use serde::{Deserialize, Serialize};

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

/// A replica's state as a state transfer or a checkpoint carries it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PartitionState {
    pub applied: u64,
    pub stable: u64,
    /// Every key's latest version.
    pub entries: Vec<(Bytes, Stored)>,
    /// Each session's writes in flight (`chain::writes`), so that a resent
    /// write is still recognised by a replica that got its state this way.
    pub sessions: Vec<(ClientId, LastWrite)>,
    /// The partition's update history up to `applied`, hashed
    /// (`ChainReplica::history`).
    pub history: u64,
    /// This site's updates not known to have reached every stabilizer
    /// replica and other site (several sites only; `ChainReplica::
    /// outgoing`).
    pub unreported: Vec<Update>,
}

/// A key whose value is in the disk tier: named rather than carried, by
/// a checkpoint (the value stays in this node's tier) and by a state
/// transfer (the values follow, streamed: `Message::FetchValues`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OnDiskEntry {
    pub key: Bytes,
    pub version: Version,
    pub seq: u64,
    pub expires_at_ms: Option<u64>,
    /// The value's length.
    pub len: u32,
}

/// One version of a key, named: the key, the version's timestamp and site.
pub type ValueRef = (Bytes, crate::hlc::Timestamp, crate::version::SiteId);

/// One version of one key, owned: what state transfers, checkpoints and
/// digests carry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stored {
    pub version: Version,
    /// The position of the write in its partition's update order (assigned by
    /// the head); a replica's `stable` watermark is compared against it.
    pub seq: u64,
    /// `None` is a tombstone.
    pub value: Option<Bytes>,
    pub expires_at_ms: Option<u64>,
}

impl Stored {
    /// The value as a reader at `now_ms` sees it.
    pub fn live_value(&self, now_ms: u64) -> Option<&Bytes> {
        match self.expires_at_ms {
            Some(at) if at <= now_ms => None,
            _ => self.value.as_ref(),
        }
    }
}

/// One write of a session this replica applied.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LastWrite {
    pub key: Bytes,
    /// The write's id in its session.
    pub write: u64,
    /// Its place in the partition's update order.
    pub seq: u64,
    pub version: Version,
    pub at_ms: u64,
    /// The value the key had, for a change that asked for it (a resend is
    /// answered with it again).
    pub old: Option<Bytes>,
}
