//! What a replica asks its node to make durable: the write-ahead log's
//! records, a type of their own (not `Message`), so the log format can
//! change apart from the wire protocol.
//!
//! A replica produces records in the order it applies things; the node
//! appends them in that order (under the same lock, see `node`), and
//! nothing a step sends leaves before that step's records are durable under
//! `fsync=always`. Recovery (`node::Node::recover`) reads them back per
//! partition: the last `State` record, then the updates after it, sorted
//! by sequence number, unless a `Dropped` record came after them; and
//! whether it was catching up (`Behind`) when the node stopped.

use crate::error::Error;
use crate::hlc::Timestamp;
pub use crate::message::OnDiskEntry;
use crate::message::{PartitionState, Update};
use crate::ring::PartitionId;
use serde::{Deserialize, Serialize};

/// The version of the record encoding. A log written by another version is
/// refused at start with a clear error rather than misread.
pub const FORMAT: u8 = 8;

/// One write-ahead log record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum LogRecord {
    /// Updates a replica applied, in sequence order.
    Updates { partition: PartitionId, updates: Vec<Update> },
    /// A whole replica state: installed by a state transfer, or written by
    /// a compaction checkpoint. Everything before it for this partition is
    /// superseded.
    State { partition: PartitionId, state: PartitionState },
    /// The node left the partition's chain and dropped its replica: what
    /// came before is not to be recovered (a node that returns to the chain
    /// fetches the state anew).
    Dropped { partition: PartitionId },
    /// The replica moved up its chain and is catching up (`behind`), or has
    /// caught up: a replica that restarts while behind does not have all
    /// its position needs, so its log is not whole (see `node::Recovery`).
    Behind { partition: PartitionId, behind: bool },
    /// The replica made or passed on no promise above `ceiling`
    /// (`ChainReplica::cover`): after a restart its clock starts there.
    Clock { partition: PartitionId, ceiling: Timestamp },
    /// With a disk tier, the keys of the `State` before it whose values
    /// are in the tier (a checkpoint names them rather than copy them:
    /// the tier keeps each such version until a later checkpoint replaces
    /// this one, `node::tier`).
    OnDisk { partition: PartitionId, entries: Vec<OnDiskEntry> },
    /// After a failover of this backup site (`geo::dr`): keys whose
    /// primary's last noted write never arrived, with its timestamp.
    /// Belongs to no partition.
    Lost { keys: Vec<(bytes::Bytes, Timestamp)> },
    /// At a stabilizer replica of a disaster-recovery backup (`geo::dr`):
    /// writes of the primary it noted, kept until their values are applied
    /// here. Belongs to no partition.
    Noted { notes: Vec<crate::message::geo::Note> },
    /// At such a replica: from here on its notes are whole (every note its
    /// replica acknowledged, through any process, is in this log). A log
    /// synced throughout that has it needs no catching up at restart.
    NotesWhole,
    /// This node answered a failover (`geo::dr`), which may not be over:
    /// it notes nothing more. (`Lost` says it is over.)
    FailingOver,
}

impl LogRecord {
    pub fn partition(&self) -> PartitionId {
        match self {
            LogRecord::Updates { partition, .. }
            | LogRecord::State { partition, .. }
            | LogRecord::Dropped { partition }
            | LogRecord::Behind { partition, .. }
            | LogRecord::Clock { partition, .. }
            | LogRecord::OnDisk { partition, .. } => *partition,
            LogRecord::Lost { .. } | LogRecord::Noted { .. } | LogRecord::NotesWhole | LogRecord::FailingOver => 0,
        }
    }

    /// The record's bytes: the format version, then the encoding.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![FORMAT];
        crate::wire::encode_into(self, &mut out);
        crate::wire::within_limit(out.len());
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<LogRecord, Error> {
        match bytes.split_first() {
            Some((&FORMAT, rest)) => crate::wire::decode(rest),
            Some((v, _)) => Err(Error::InvalidData(format!("log record format {v}, this build reads format {FORMAT}"))),
            None => Err(Error::InvalidData("empty log record".into())),
        }
    }
}
