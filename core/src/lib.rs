//! Causeway's protocols as plain state machines.
//!
//! Nothing here opens a socket, starts a thread or reads a clock: callers
//! pass messages in, pass the time in, and get messages out. The TCP node
//! (`causeway-node`), the native client (`causeway-client`) and the
//! deterministic simulator (`causeway-sim`) are thin shells around this.
//!
//! * `hlc`, `version`: hybrid timestamps and versions ready for several sites.
//! * `ring`: partitions, the consistent-hashing ring, chains, epochs.
//! * `store`: one partition's versions at one replica.
//! * `chain`: ChainReaction's chain replica (head/middle/tail, k-of-R acks,
//!   lazy propagation, stability, get-transaction reads).
//! * `session`, `driver`: the client library side (metadata, routing,
//!   dependency stabilization, retries).
//! * `node`: one data node as a state machine (`step`, `tick`): its
//!   replicas, its admission by the coordinator, its heartbeats.
//! * `record`: the write-ahead log's records.
//! * `tier`: the disk tier: values moved out of memory and back, by a
//!   cache policy (FIFO, LRU, LFU), through jobs the shell runs.
//! * `supervisor`: the coordinator's failure detection and repair plans.
//! * `ec`: erasure-coded groups (Cocytus): values kept once, striped with
//!   parity over K data and M parity members; metadata replicated; a
//!   parity member leads the online recovery of a lost data member.
//! * `geo`: geo-replication (Eunomia): the site stabilizer orders a site's
//!   updates and ships their ids to the other sites; the receiver applies
//!   other sites' updates once their dependencies are stable here.
//! * `message`, `wire`: what crosses the network and how it is encoded.
//!   `message` is plain data: it uses `hlc`, `version` and `ring` and no
//!   protocol, so every protocol can use it.

pub mod chain;
pub mod driver;
pub mod ec;
pub mod error;
pub mod geo;
pub mod hlc;
pub mod message;
pub mod node;
pub mod record;
pub mod ring;
pub mod session;
pub mod store;
pub mod supervisor;
pub mod tier;
pub mod version;
pub mod wire;

/// Gives a queue's spare room back once it holds less than a quarter of
/// it: queues that filled under load (recent updates, what waits to be
/// reported) must not keep their peak size at rest.
pub(crate) fn shrink_idle<T>(q: &mut std::collections::VecDeque<T>) {
    if q.capacity() > 64 && q.len() < q.capacity() / 4 {
        q.shrink_to_fit();
    }
}

/// How long after `base_ms` a resend of `bytes` may go: a resend is for
/// what a broken connection lost, so it waits as long as the first copy
/// may still be on its way (at 64 MB/s, slow for loopback or a LAN: a
/// node's one loop also decodes and applies it). Every 200 ms, one 128 MiB
/// value was once resent until its peer link's backlog was full, and the
/// heartbeats behind it were dropped.
pub fn resend_wait_ms(base_ms: u64, bytes: usize) -> u64 {
    base_ms + (bytes / RESEND_BYTES_PER_MS) as u64
}

/// The rate `resend_wait_ms` assumes.
const RESEND_BYTES_PER_MS: usize = 64 << 10;
