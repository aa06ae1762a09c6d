//! A data node's message dispatch: which partition replica a message is for,
//! and the node-wide requests (topology, count, flush, get-transaction parts
//! spanning partitions). The TCP node and the simulator both call `handle`,
//! each with its own way of reaching a partition (`Partitions`): the real
//! node locks one partition at a time so connections on different cores do
//! not contend; the simulator owns them outright.

use crate::chain::{ChainReplica, PutRequest};
use crate::message::{send, Dest, Message, Outbox, Refusal};
use crate::ring::{NodeId, PartitionId, Topology};
use crate::version::SiteId;

/// Access to a node's partition replicas.
pub trait Partitions {
    /// Runs `f` on this node's replica of `partition`, if it has one.
    fn with<R>(&self, partition: PartitionId, f: impl FnOnce(&mut ChainReplica) -> R) -> Option<R>;
    /// Puts (or removes) this node's replica of `partition`.
    fn set(&self, partition: PartitionId, replica: Option<ChainReplica>);
}

/// Handles one message addressed to node `me`.
pub fn handle(topology: &Topology, parts: &impl Partitions, msg: Message, now_ms: u64, out: &mut Outbox) {
    let stale = |epoch: u64| epoch != topology.epoch;
    let refuse = |out: &mut Outbox, op: crate::message::OpId| {
        send(out, Dest::Client(op.client), Message::Refused { op, reason: Refusal::NotResponsible { epoch: topology.epoch } })
    };
    match msg {
        Message::Put { op, epoch, partition, key, value, ttl_ms, condition, after, ack_at, write } => {
            let req = PutRequest { op, key, value, ttl_ms, condition, after, ack_at, write };
            if stale(epoch) || parts.with(partition, |r| r.put(req, now_ms, out)).is_none() {
                refuse(out, op);
            }
        }
        Message::Get { op, epoch, partition, key, min } => {
            if stale(epoch) || parts.with(partition, |r| r.get(op, &key, min.as_ref(), now_ms, out)).is_none() {
                refuse(out, op);
            }
        }
        Message::WaitStable { op, epoch, partition, seq } => {
            if stale(epoch) || parts.with(partition, |r| r.wait_stable(op, seq, out)).is_none() {
                refuse(out, op);
            }
        }
        Message::SnapshotRead { op, epoch, at, keys } => {
            if stale(epoch) {
                return refuse(out, op);
            }
            let mut items = Vec::with_capacity(keys.len());
            for (partition, key) in keys {
                match parts.with(partition, |r| r.snapshot_read(&key, at, now_ms)) {
                    Some(Ok(item)) => items.push(item),
                    Some(Err(reason)) => return send(out, Dest::Client(op.client), Message::Refused { op, reason }),
                    None => return refuse(out, op),
                }
            }
            send(out, Dest::Client(op.client), Message::Snapshot { op, items });
        }
        Message::Count { op, epoch, partitions } => {
            if stale(epoch) {
                return refuse(out, op);
            }
            let mut keys = 0;
            for p in partitions {
                match parts.with(p, |r| r.live_keys(now_ms)) {
                    Some(n) => keys += n,
                    None => return refuse(out, op),
                }
            }
            send(out, Dest::Client(op.client), Message::Counted { op, keys });
        }
        Message::Flush { op } => {
            for p in 0..topology.shape.partitions {
                parts.with(p, |r| r.flush_all());
            }
            send(out, Dest::Client(op.client), Message::Flushed { op });
        }
        Message::GetTopology { op } => {
            send(out, Dest::Client(op.client), Message::TopologyIs { op, topology: topology.clone() });
        }
        Message::Forward { epoch, partition, updates, .. } => {
            if !stale(epoch) {
                parts.with(partition, |r| r.forward(updates, now_ms, out));
            }
        }
        Message::Fetch { epoch, partition, from } => {
            parts.with(partition, |r| r.fetch(epoch, from, out));
        }
        Message::Transfer { epoch, partition, state } => {
            parts.with(partition, |r| r.transfer(epoch, state, now_ms, out));
        }
        // The node's owner installs configurations (`reconfigure`): it owns
        // the topology this function reads; heartbeats are for its
        // coordinator.
        Message::Reconfigure { .. } | Message::Heartbeat { .. } => {}
        Message::StableUpTo { epoch, partition, seq } => {
            if !stale(epoch) {
                parts.with(partition, |r| r.stable_up_to(seq, now_ms, out));
            }
        }
        // Replies are for clients, never for nodes.
        Message::PutDone { .. }
        | Message::Value { .. }
        | Message::Stable { .. }
        | Message::Snapshot { .. }
        | Message::Counted { .. }
        | Message::Flushed { .. }
        | Message::TopologyIs { .. }
        | Message::Refused { .. } => {}
    }
}

/// Periodic work for every replica of the node.
pub fn tick(topology: &Topology, parts: &impl Partitions, now_ms: u64, out: &mut Outbox) {
    for p in 0..topology.shape.partitions {
        parts.with(p, |r| r.tick(now_ms, out));
    }
}

/// Moves node `me` to configuration `new` (from the coordinator): every
/// replica learns its new chain, replicas of chains the node left are
/// dropped, and replicas of chains it joined start by fetching the
/// partition's state. The caller then serves with `new`.
pub fn reconfigure(me: NodeId, site: SiteId, new: &Topology, parts: &impl Partitions, now_ms: u64, out: &mut Outbox) {
    for p in 0..new.shape.partitions {
        match parts.with(p, |r| r.reconfigure(new, me, now_ms, out)) {
            Some(true) => {}
            Some(false) => parts.set(p, None),
            None => {
                if let Some(r) = ChainReplica::joining(new, p, me, site, now_ms, out) {
                    parts.set(p, Some(r));
                }
            }
        }
    }
}
