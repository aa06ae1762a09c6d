//! A partition's side of the stabilizer protocol: it reports the partition's
//! update ids and promises to every stabilizer replica of its site (Eunomia
//! Alg. 2 lines 8 and 10-12) so that each replica holds a gap-free prefix of
//! the partition's stream (§3.3, the prefix property).
//!
//! As in the paper's implementation, the reporter remembers how far each
//! replica acknowledged (`Ack_n`) and keeps every id until all replicas
//! have it. Unlike the paper it does not resend the whole unacknowledged
//! suffix every time: each batch says where it continues from
//! (`IdBatch::prev`), a replica refuses a batch that would leave a gap, and
//! the reporter goes back to the replica's acknowledged point when refused
//! or when `REPORT_RESEND_MS` pass without progress. Batches are sent on
//! `tick` (Eunomia §5: batch at partitions, about every millisecond).

use super::{IdBatch, IdsAck, ReplicaId, UpdateId};
use crate::hlc::Timestamp;
use crate::ring::PartitionId;
use std::collections::{BTreeMap, VecDeque};

/// At most this many ids in one batch.
pub const MAX_REPORT: usize = 4096;

/// A reporter that has heard no progress from a replica for this long sends
/// again from the replica's acknowledged point.
pub const REPORT_RESEND_MS: u64 = 50;

#[derive(Clone, Copy, Debug, Default)]
struct Peer {
    acked: Timestamp,
    sent: Timestamp,
    progress_ms: u64,
}

/// The reporting side of one partition.
#[derive(Debug)]
pub struct Reporter {
    partition: PartitionId,
    /// Recorded and not yet acknowledged by every replica, in timestamp order.
    ids: VecDeque<UpdateId>,
    /// The latest id's timestamp or promise, whichever is larger.
    promised: Timestamp,
    replicas: BTreeMap<ReplicaId, Peer>,
}

impl Reporter {
    pub fn new(partition: PartitionId, replicas: &[ReplicaId]) -> Reporter {
        Reporter {
            partition,
            ids: VecDeque::new(),
            promised: Timestamp::ZERO,
            replicas: replicas.iter().map(|&r| (r, Peer::default())).collect(),
        }
    }

    /// An update of this partition, in timestamp order: after every id
    /// recorded and every promise made (Property 2).
    pub fn record(&mut self, id: UpdateId) {
        assert!(id.ts > self.promised, "partition {} reported {} after {}", self.partition, id.ts, self.promised);
        self.promised = id.ts;
        self.ids.push_back(id);
    }

    /// A heartbeat (Alg. 2 line 12): no later update of this partition will
    /// be timestamped at or below `ts`. With `hlc::Clock`, promise
    /// `max(clock.last(), Timestamp::new(now_ms, 0))` and `observe` it.
    pub fn promise(&mut self, ts: Timestamp) {
        self.promised = self.promised.max(ts);
    }

    pub fn on_ack(&mut self, ack: IdsAck, now_ms: u64) {
        if ack.partition != self.partition {
            return;
        }
        let Some(peer) = self.replicas.get_mut(&ack.replica) else { return };
        if ack.up_to > peer.acked {
            peer.acked = ack.up_to;
            peer.progress_ms = now_ms;
        }
        if ack.resend {
            peer.sent = peer.acked;
            peer.progress_ms = now_ms;
        }
        let everyone = self.replicas.values().map(|p| p.acked).min().unwrap_or(self.promised);
        while self.ids.front().is_some_and(|id| id.ts <= everyone) {
            self.ids.pop_front();
        }
    }

    /// Sends each replica what it has not been sent (or, after a refusal or
    /// a silence, what it has not acknowledged), and the latest promise.
    pub fn tick(&mut self, now_ms: u64, out: &mut Vec<(ReplicaId, IdBatch)>) {
        for (&replica, peer) in self.replicas.iter_mut() {
            if peer.sent < peer.acked {
                peer.sent = peer.acked;
            }
            if peer.sent > peer.acked && now_ms.saturating_sub(peer.progress_ms) >= REPORT_RESEND_MS {
                peer.sent = peer.acked;
                peer.progress_ms = now_ms;
            }
            let start = self.ids.partition_point(|id| id.ts <= peer.sent);
            let end = (start + MAX_REPORT).min(self.ids.len());
            let up_to = if end == self.ids.len() { self.promised } else { self.ids[end - 1].ts };
            if end == start && up_to <= peer.sent {
                continue;
            }
            let ids = self.ids.range(start..end).cloned().collect();
            out.push((replica, IdBatch { partition: self.partition, prev: peer.sent, ids, up_to }));
            peer.sent = peer.sent.max(up_to);
        }
    }

    /// Ids some replica has not acknowledged yet.
    pub fn unacked(&self) -> usize {
        self.ids.len()
    }
}
