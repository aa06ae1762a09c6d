//! A node of an erasure-coded site (`Shape::coding`, `ec::site`): client
//! reads and writes of keys go to the node's `ec::site::Engine` instead of
//! chains. The driver needs no change: chains are one node long, the data
//! member serving the partition, so requests usually arrive where they are
//! served; after a loss they arrive anywhere and are passed on to the node
//! that serves them now.
//!
//! MGET reads each key at its data member, in rounds until two agree
//! (the driver's double collect), since no older versions are kept to
//! read a snapshot at. FLUSHALL deletes every key with ordinary updates.
//! Several sites are not supported yet.

use super::{send, Node, Now};
use crate::ec::site::{Action, Engine};
use crate::ec::{PutReq, Reply, WriteId};
use crate::hlc::Timestamp;
use crate::message::{Dest, Item, Keyspace, Message, OpId, Outbox, Refusal};
use crate::version::{Version, VersionVector};

impl Node {
    /// Handles `msg` if it is the erasure-coded site's business (`None`),
    /// or gives it back.
    pub(super) fn ec_step(&mut self, msg: Message, now: Now, out: &mut Outbox) -> Option<Message> {
        let leased = self.ec.is_some() && self.has_lease(now.mono_ms);
        let Some(engine) = self.ec.as_mut() else { return Some(msg) };
        let request = matches!(
            msg,
            Message::Put(_)
                | Message::Get { .. }
                | Message::KeyMemory { .. }
                | Message::Flush { .. }
                | Message::Count { .. }
                | Message::ListKeys { .. }
        );
        if request && (!engine.ready() || matches!(msg, Message::Get { .. }) && !leased) {
            // The groups are forming, or this node has no lease of the
            // current configuration (removed without knowing it yet, say:
            // another node may serve the slot now): the request waits
            // (`ec_tick`).
            if self.ec_waiting.len() >= MAX_WAITING {
                let op = msg.op().expect("a request");
                return send_back(out, op, Refusal::Unavailable { alive: 0, needed: 1 });
            }
            self.ec_waiting.push((now.mono_ms, msg));
            return None;
        }
        match msg {
            Message::Ec { group, from, msg } => engine.step(group, from, *msg),
            Message::EcHello { from, nodes } => engine.hello(from, nodes.into_iter().collect()),
            Message::Put(put) if put.change.value.is_computed() => {
                return unsupported(put.op, "INCR and its family, APPEND and SETRANGE are", out);
            }
            Message::Put(put) => {
                // No lease needed: a member removed without knowing it
                // yet gets no acknowledgement from the parity members once
                // the slot's new leader has asked them (`ec::member`).
                // The write's version: the node's time, above what the
                // session has seen (and the member keeps it above the key's).
                let floor = put.past.0.iter().map(|ts| ts.to_bits() + 1).max().unwrap_or(0);
                let version = Timestamp::new(now.wall_ms, 0).to_bits().max(floor);
                let id = WriteId { client: put.op.client, write: put.write, done_below: put.done_below };
                let write = PutReq { key: put.key.clone(), change: put.change.clone(), version, id: Some(id) };
                let (partition, key) = (put.partition, put.key.clone());
                engine.request(Message::Put(put), partition, key, Some(write), now.wall_ms);
            }
            Message::Get { partition, ref key, .. } => {
                let key = key.clone();
                engine.request(msg, partition, key, None, now.wall_ms);
            }
            Message::SnapshotRead { op, .. } => return unsupported(op, "snapshot reads (MGET goes by rounds of GETs)", out),
            Message::Count { op, partitions, .. } => {
                // Every node is asked (`driver::op`): each counts the slots
                // it serves.
                let topology = &self.topology;
                let (keys, expires) = engine.count(&partitions, |key| topology.partition_of(key));
                let keyspace = Keyspace { keys, expires };
                send(out, Dest::Client(op.client), Message::Counted { op, keyspace });
                return None;
            }
            Message::ListKeys { op, partitions, pattern, one, .. } => {
                // Every node is asked, as for a count.
                let topology = &self.topology;
                let mut keys = engine.keys(&partitions, pattern.as_deref(), now.wall_ms, |key| topology.partition_of(key));
                if one && keys.len() > 1 {
                    // RANDOMKEY: one of them (the driver picks among nodes).
                    let at = (now.wall_ms as usize ^ keys.len()) % keys.len();
                    keys.swap(0, at);
                    keys.truncate(1);
                }
                send(out, Dest::Client(op.client), super::listed(op, keys));
                return None;
            }
            Message::KeyMemory { partition, ref key, .. } => {
                // Read like a GET where the value lives (any copy would do).
                let key = key.clone();
                engine.request(msg, partition, key, None, now.wall_ms);
            }
            Message::Flush { .. } => engine.flush(msg, now.wall_ms),
            msg => return Some(msg),
        }
        self.ec_flush(out);
        None
    }

    /// What the engine wants done, as messages.
    pub(super) fn ec_flush(&mut self, out: &mut Outbox) {
        let Some(engine) = self.ec.as_mut() else { return };
        let site = self.id.site;
        for action in engine.drain() {
            match action {
                Action::Send { to, group, from, msg } => send(out, Dest::Node(to), Message::Ec { group, from, msg: Box::new(msg) }),
                Action::Hello { to, nodes } => {
                    let from = self.id.me;
                    send(out, Dest::Node(to), Message::EcHello { from, nodes: nodes.into_iter().collect() })
                }
                Action::Forward { to, request } => send(out, Dest::Node(to), request),
                Action::Moved { request } => {
                    // Its slot was handed back to its rejoined member: the
                    // driver refreshes and sends it there.
                    if let Some(op) = request.op() {
                        send_back(out, op, Refusal::NotResponsible { epoch: self.topology.epoch });
                    }
                }
                Action::Unavailable { request } => {
                    if let Some(op) = request.op() {
                        let (alive, needed) = (0, 1);
                        send_back(out, op, Refusal::Unavailable { alive, needed });
                    }
                }
                Action::Answer { request, reply } => {
                    let Some(op) = request.op() else { continue };
                    let version = |v: u64| Version { ts: Timestamp::from_bits(v), site, vv: VersionVector::default() };
                    let msg = match reply {
                        Reply::Done { .. } if matches!(request, Message::Flush { .. }) => Message::Flushed { op },
                        Reply::Done { version: v, old } => {
                            let old = old.map(Box::new);
                            Message::PutDone { op, version: v.map(version), seq: 0, chain_index: 0, stable: true, stable_through: 0, old }
                        }
                        Reply::Value(found) if matches!(request, Message::KeyMemory { .. }) => {
                            // What the key takes where its value lives: the
                            // value, the key and its metadata entry (each
                            // parity member keeps another entry and its
                            // share of the parity).
                            let Message::KeyMemory { key, .. } = &request else { unreachable!("matched above") };
                            let bytes = found.map(|(value, ..)| (value.len() + key.len() + crate::ec::index::ENTRY_BYTES) as u64);
                            Message::KeyMemoryIs { op, bytes }
                        }
                        Reply::Value(found) => {
                            let (value, v, expires_at_ms) =
                                found.map_or((None, None, None), |(value, v, expires)| (Some(value), Some(version(v)), expires));
                            let item = Item { value, version: v, seq: 0, stable: true, expires_at_ms };
                            Message::Value { op, item: Box::new(item), chain_index: 0, stable_through: 0 }
                        }
                        Reply::NotHere => Message::Refused { op, reason: Refusal::Unavailable { alive: 0, needed: 1 } },
                    };
                    send(out, Dest::Client(op.client), msg);
                }
            }
        }
    }

    /// A new configuration: the engine learns who is lost.
    pub(super) fn ec_configure(&mut self, out: &mut Outbox) {
        if let Some(engine) = self.ec.as_mut() {
            engine.topology(&self.topology);
            self.ec_flush(out);
        }
    }

    pub(super) fn ec_tick(&mut self, now: Now, out: &mut Outbox) {
        let Some(engine) = self.ec.as_mut() else { return };
        engine.tick(now.wall_ms);
        self.ec_flush(out);
        if !self.ec_waiting.is_empty() {
            // Requests that waited; those waiting longer than a client
            // would are dropped (it has given up). Still not ready: they
            // wait again.
            for (at, msg) in std::mem::take(&mut self.ec_waiting) {
                if now.mono_ms.saturating_sub(at) < WAIT_MS {
                    if let Some(msg) = self.ec_step(msg, now, out) {
                        debug_assert!(false, "a read is the engine's: {msg:?}");
                    }
                }
            }
        }
    }

    /// What the node's groups hold and how they stand (INFO, status).
    pub fn ec(&self) -> Option<&Engine<Message>> {
        self.ec.as_deref()
    }
}

/// Requests waiting (for the groups, or the lease), at most, and for how
/// long.
const MAX_WAITING: usize = 100_000;
const WAIT_MS: u64 = 5_000;

fn send_back(out: &mut Outbox, op: OpId, reason: Refusal) -> Option<Message> {
    send(out, Dest::Client(op.client), Message::Refused { op, reason });
    None
}

fn unsupported(op: OpId, what: &str, out: &mut Outbox) -> Option<Message> {
    send_back(out, op, Refusal::Unsupported(format!("{what} not supported with erasure coding (--redundancy ec:K+M) yet")))
}
