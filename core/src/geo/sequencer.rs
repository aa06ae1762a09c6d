//! The S-Seq baseline's site sequencer (Eunomia §6): the design Eunomia is
//! measured against, where every update of a site gets a site-wide sequence
//! number from one service *before* it is ordered, in the critical path of
//! the write. Eunomia's stabilizer does the same ordering off the critical
//! path, from ids the partitions report after answering their clients.
//!
//! With `geo::Replication::Sequenced` the site's stabilizer leader runs one
//! and every head waits for its number before ordering a write. It is a
//! baseline to measure, not a mode to run a store in.

use crate::ring::PartitionId;
use serde::{Deserialize, Serialize};

/// A head asks its site's sequencer for the next number before ordering a
/// write; `tag` names the write at the head.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeqRequest {
    pub partition: PartitionId,
    pub tag: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeqReply {
    pub partition: PartitionId,
    pub tag: u64,
    pub seq: u64,
}

#[derive(Debug, Default)]
pub struct Sequencer {
    next: u64,
}

impl Sequencer {
    pub fn new() -> Sequencer {
        Sequencer::default()
    }

    /// Numbers the request: consecutive from 1, one per request.
    pub fn step(&mut self, req: SeqRequest) -> SeqReply {
        self.next += 1;
        SeqReply { partition: req.partition, tag: req.tag, seq: self.next }
    }

    /// Requests answered so far.
    pub fn served(&self) -> u64 {
        self.next
    }
}
