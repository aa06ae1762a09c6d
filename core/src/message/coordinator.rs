//! What nodes tell the coordinator: the heartbeat, and what a restarted
//! node recovered.

use crate::ring::{NodeId, PartitionId};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What a node tells the coordinator members every `node::HEARTBEAT_MS`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Beat {
    pub from: NodeId,
    /// Where it serves (so a node removed after a failure can be brought
    /// back by a coordinator that never knew it).
    pub addr: String,
    /// This process's incarnation.
    pub incarnation: u64,
    /// The configuration it holds.
    pub epoch: u64,
    /// When it was sent, on the node's monotonic clock (echoed by the
    /// lease the coordinator grants in reply).
    pub sent_ms: u64,
    /// Partitions whose replica here is still fetching its state (holds
    /// nothing yet): state transfers in flight.
    pub joining: Vec<PartitionId>,
    /// Partitions whose replica here moved up its chain and is still
    /// catching up from its successor (it holds the data, maybe not all of
    /// what the members it passed hold).
    pub catching_up: Vec<PartitionId>,
    /// The update order position of each replica it holds (not fetching):
    /// for a restarted node, what it recovered.
    pub applied: BTreeMap<PartitionId, u64>,
    /// Not admitted yet: what it recovered from its log, for the
    /// coordinator to decide how it rejoins.
    pub recovered: Option<Recovered>,
}

/// What a node not admitted yet holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recovered {
    /// Its log was synced before every acknowledgement (`fsync=always`): its
    /// replicas hold everything it ever acknowledged or passed on, except
    /// those in `incomplete`.
    pub whole: bool,
    /// Replicas whose log stops at a gap, or that were catching up when the
    /// node stopped: they may lack updates their chain acknowledged.
    pub incomplete: Vec<PartitionId>,
}
