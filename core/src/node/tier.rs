//! The node's disk tier (`crate::tier`): past the memory budget its
//! replicas move values out by their cache policy (`move_out`, instead of
//! evicting), and a client request that needs a value on disk waits here,
//! without holding up any other, until the shell has read it back
//! (`tier_done`). Requests for a key that has some waiting wait behind
//! them, so a key's requests keep their order at this node.
//!
//! What the tier does is this node's alone: no message about it crosses
//! the network, and every replica of a chain moves its own values.

use super::*;
use crate::message::ValueRef;
use crate::tier::{CachePolicy, Done, Job, Tier, TierError, ValueId};
use bytes::Bytes;
use std::collections::{BTreeMap, HashMap};

/// A node streaming values from this one that is not heard from for this
/// long has given up (died, or started over elsewhere).
pub const STREAM_IDLE_MS: u64 = 10_000;

/// At most this many of a node's replicas stream values in at once
/// (`Node::grant_streams`).
pub const STREAMS_AT_ONCE: usize = 2;

/// INFO `tier`: what the node's tier did so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierStats {
    /// Client reads (and changes that read the value) that found it in
    /// memory, and on disk.
    pub hits: u64,
    pub misses: u64,
    /// Values moved out (written to disk, or already there), and read
    /// back.
    pub moved_out: u64,
    pub read_back: u64,
    /// Jobs the tier failed.
    pub errors: u64,
    /// Values read from this node's disk for nodes that joined a chain
    /// (state transfers stream them), and values streamed in here.
    pub streamed_out: u64,
    pub streamed_in: u64,
    /// Replicas here streaming values in now, and waiting for their turn
    /// (`Node::grant_streams`).
    pub streams_running: usize,
    pub streams_waiting: usize,
    /// Where the values are, over every replica here.
    pub places: crate::store::Places,
}

pub(super) struct NodeTier {
    policy: CachePolicy,
    tier: Arc<dyn Tier>,
    /// Requests waiting for a key's value to come back from disk (or
    /// behind others that do), in arrival order.
    waiting: HashMap<(PartitionId, Bytes), Vec<Message>>,
    jobs: Vec<Job>,
    /// Removals of versions a checkpoint in the log may still name: held
    /// until a checkpoint taken after them has replaced the log
    /// (`checkpoint_taken`, `compacted`). Without a log, none are held.
    held: Vec<Job>,
    pending: Vec<Job>,
    /// Nodes streaming a partition's values on disk from this one (a state
    /// transfer named them: `Message::FetchValues`), and when last heard
    /// from. While any streams a partition, the removals of its versions
    /// wait here: the versions the transfer named stay readable.
    streams: BTreeMap<(PartitionId, NodeId), u64>,
    stream_held: BTreeMap<PartitionId, Vec<Job>>,
    /// The tier could not take values lately: writes that add data are
    /// refused with this, while over the budget, until one goes through.
    failing: Option<TierError>,
    /// Keys whose value read as absent once while still on disk: read
    /// again before the requests are told it is missing.
    reread: std::collections::HashSet<(PartitionId, Bytes)>,
    /// Re-stepping requests that waited: their hit or miss is counted.
    resuming: bool,
    pub(super) stats: TierStats,
}

impl NodeTier {
    pub(super) fn policy(&self) -> CachePolicy {
        self.policy
    }

    pub(super) fn tier(&self) -> Arc<dyn Tier> {
        self.tier.clone()
    }
}

impl std::fmt::Debug for NodeTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeTier").field("policy", &self.policy).field("waiting", &self.waiting.len()).finish()
    }
}

impl Node {
    /// Gives the node a disk tier: from now on its replicas move values
    /// out past the budget, by `policy`, instead of evicting.
    pub fn enable_tier(&mut self, policy: CachePolicy, tier: Arc<dyn Tier>) {
        self.tier = Some(Box::new(NodeTier {
            policy,
            tier,
            waiting: HashMap::new(),
            jobs: Vec::new(),
            held: Vec::new(),
            pending: Vec::new(),
            streams: BTreeMap::new(),
            stream_held: BTreeMap::new(),
            failing: None,
            reread: Default::default(),
            resuming: false,
            stats: TierStats::default(),
        }));
        self.tier_replicas();
    }

    /// Replicas placed here since get the tier too.
    pub(super) fn tier_replicas(&mut self) {
        let Some(t) = self.tier.as_deref() else { return };
        for (p, r) in self.parts.iter_mut().enumerate() {
            if let Some(r) = r.as_mut().filter(|r| !r.has_tier()) {
                r.enable_tier(p as PartitionId, t.policy, t.tier.clone());
            }
        }
    }

    /// What the tier did so far, and where the values are.
    pub fn tier_stats(&self) -> Option<(CachePolicy, TierStats)> {
        let t = self.tier.as_deref()?;
        let mut stats = t.stats;
        for r in self.parts.iter().flatten() {
            let p = r.places();
            stats.places.keys_in_memory += p.keys_in_memory;
            stats.places.keys_on_disk += p.keys_on_disk;
            stats.places.bytes_on_disk += p.bytes_on_disk;
            stats.places.leaving += p.leaving;
            match r.streaming() {
                Some(true) => stats.streams_running += 1,
                Some(false) => stats.streams_waiting += 1,
                None => {}
            }
        }
        Some((t.policy, stats))
    }

    /// The work for the shell to run on the tier, in order.
    pub fn take_tier_jobs(&mut self) -> Vec<Job> {
        let Some(t) = self.tier.as_deref_mut() else { return Vec::new() };
        let mut jobs = std::mem::take(&mut t.jobs);
        let mut from_stores = Vec::new();
        for r in self.parts.iter_mut().flatten() {
            r.take_tier_jobs(&mut from_stores);
        }
        let logs = self.logs;
        for job in from_stores {
            match job {
                Job::Remove(ref id) if t.streams.keys().any(|(p, _)| *p == id.partition) => {
                    t.stream_held.entry(id.partition).or_default().push(job)
                }
                Job::Remove(_) if logs => t.held.push(job),
                job => jobs.push(job),
            }
        }
        jobs
    }

    /// A state transfer of `partition` to `to` named values on disk here:
    /// they stay until it has them (or is not heard from for
    /// `STREAM_IDLE_MS`).
    pub(super) fn stream_to(&mut self, partition: PartitionId, to: NodeId, now_ms: u64) {
        let Some(t) = self.tier.as_deref_mut() else { return };
        if self.parts.get(partition as usize).and_then(Option::as_ref).is_some_and(|r| r.places().keys_on_disk > 0) {
            t.streams.insert((partition, to), now_ms);
        }
    }

    /// `from` asks for the values of `ids` (none: it waits for its turn;
    /// `done`: it has them all).
    pub(super) fn fetch_values(
        &mut self,
        partition: PartitionId,
        from: NodeId,
        ids: Vec<ValueRef>,
        done: bool,
        now_ms: u64,
        out: &mut Outbox,
    ) {
        let Some(t) = self.tier.as_deref_mut() else {
            if !ids.is_empty() {
                let values = ids.into_iter().map(|id| (id, None)).collect();
                send(out, Dest::Node(from), Message::Values { partition, values });
            }
            return;
        };
        if done {
            t.streams.remove(&(partition, from));
            return self.release_streamed(now_ms);
        }
        if let Some(heard) = t.streams.get_mut(&(partition, from)) {
            *heard = now_ms;
        }
        if ids.is_empty() {
            return;
        }
        t.streams.insert((partition, from), now_ms);
        let ids = ids.into_iter().map(|(key, ts, site)| ValueId { partition, key, ts, site }).collect();
        t.jobs.push(Job::Send { to: from, partition, ids });
    }

    /// Streams not heard from for `STREAM_IDLE_MS` are given up; the
    /// removals held for streams that ended go ahead.
    pub(super) fn release_streamed(&mut self, now_ms: u64) {
        let logs = self.logs;
        let Some(t) = self.tier.as_deref_mut() else { return };
        t.streams.retain(|_, heard| now_ms.saturating_sub(*heard) < STREAM_IDLE_MS);
        let streams = &t.streams;
        let done: Vec<PartitionId> = t.stream_held.keys().copied().filter(|p| !streams.keys().any(|(q, _)| q == p)).collect();
        let mut go = Vec::new();
        for p in done {
            go.extend(t.stream_held.remove(&p).unwrap_or_default());
        }
        match logs {
            true => t.held.extend(go),
            false => self.release(go),
        }
    }

    /// A checkpoint was taken (`checkpoint`) to replace the log: the
    /// removals held so far may go once it has (`compacted`).
    pub fn checkpoint_taken(&mut self) {
        if let Some(t) = self.tier.as_deref_mut() {
            let held = std::mem::take(&mut t.held);
            t.pending.extend(held);
        }
    }

    /// The checkpoint last taken replaced the log: what only the log
    /// before it named leaves the tier.
    pub fn compacted(&mut self) {
        if let Some(t) = self.tier.as_deref_mut() {
            let pending = std::mem::take(&mut t.pending);
            self.release(pending);
        }
    }

    /// Removals held back go ahead, but for versions an entry names again
    /// (written out once more since: a state transfer installed the same
    /// version, say). Held back, a removal could otherwise reach the tier
    /// after that write, and the entry would name a value that is gone.
    /// (A version named again only in memory then leaves its old copy as
    /// garbage.)
    fn release(&mut self, removals: Vec<Job>) {
        let named = |id: &ValueId| {
            let r = self.parts.get(id.partition as usize).and_then(Option::as_ref);
            r.and_then(|r| r.version_of(&id.key)) == Some((id.ts, id.site))
        };
        let go: Vec<Job> = removals.into_iter().filter(|j| !matches!(j, Job::Remove(id) if named(id))).collect();
        if let Some(t) = self.tier.as_deref_mut() {
            t.jobs.extend(go);
        }
    }

    /// Why writes that add data are refused while over the budget, if the
    /// tier is failing.
    pub(super) fn tier_failing(&self) -> Option<&TierError> {
        self.tier.as_deref()?.failing.as_ref()
    }

    /// Whether the node has a tier (over the budget it moves values out).
    pub(super) fn has_tier(&self) -> bool {
        self.tier.is_some()
    }

    /// Over the budget by `over_by` of `total` bytes: each replica moves
    /// its share of values out. Returns whether any could.
    pub(super) fn move_out(&mut self, over_by: usize, total: usize) -> bool {
        let mut any = false;
        for r in self.parts.iter_mut().flatten() {
            // Rounded up: a small excess spread over many stores must not
            // round to nothing everywhere (the node would then call itself
            // out of values to move and refuse writes).
            let share = (over_by as u128 * r.store_memory() as u128).div_ceil(total.max(1) as u128) as usize;
            if share > 0 && r.move_out(share) > 0 {
                any = true;
            }
        }
        any
    }

    /// A key `msg` needs whose value is on disk (or that has requests
    /// waiting already): `msg` waits for it.
    pub(super) fn cold(&mut self, msg: &Message) -> Option<(PartitionId, Bytes)> {
        let t = self.tier.as_deref()?;
        let needs = |p: PartitionId, key: &Bytes, value: bool| -> Option<Option<ValueId>> {
            if t.waiting.contains_key(&(p, key.clone())) {
                return Some(None);
            }
            // A replica still joining serves nothing (its values may not
            // be here yet): it refuses the request at once.
            let r = self.parts.get(p as usize)?.as_ref().filter(|r| !r.is_joining())?;
            value.then(|| r.on_disk(key)).flatten().map(Some)
        };
        let mut found = None;
        let mut reads = 0;
        match msg {
            Message::Get { partition, key, .. } => {
                reads = 1;
                found = needs(*partition, key, true).map(|id| (*partition, key.clone(), id));
            }
            Message::Put(put) => {
                let value = put.change.needs_value();
                reads = value as u64;
                found = needs(put.partition, &put.key, value).map(|id| (put.partition, put.key.clone(), id));
            }
            Message::SnapshotRead { keys, .. } => {
                for (p, key) in keys {
                    reads += 1;
                    if let Some(id) = needs(*p, key, true) {
                        found = Some((*p, key.clone(), id));
                        break;
                    }
                }
            }
            _ => return None,
        }
        let t = self.tier.as_deref_mut().expect("seen above");
        if !t.resuming {
            match found {
                Some((_, _, Some(_))) => {
                    t.stats.misses += 1;
                    t.stats.hits += reads - 1;
                }
                _ => t.stats.hits += reads,
            }
        }
        let (p, key, id) = found?;
        if let Some(id) = id {
            t.jobs.push(Job::Read(id));
        }
        Some((p, key))
    }

    /// `msg` waits for `key`'s value.
    pub(super) fn wait_for_disk(&mut self, key: (PartitionId, Bytes), msg: Message) {
        let t = self.tier.as_deref_mut().expect("only with a tier");
        t.waiting.entry(key).or_default().push(msg);
    }

    /// Lets the replicas streaming values in take their turns, so that at
    /// most `STREAMS_AT_ONCE` ask at a time, in partition order: a node
    /// joining many chains would otherwise have its predecessors read and
    /// send every partition's chunks at once (their links backed up, both
    /// nodes' CPU taken), and every partition would serve only at the end.
    /// (The state transfers before the streams are not in turns: a
    /// replica's predecessor may itself be joining, and turns held while
    /// waiting on each other would never end.)
    pub(super) fn grant_streams(&mut self, now_ms: u64, out: &mut Outbox) {
        let mut running = self.parts.iter().flatten().filter(|r| r.streaming() == Some(true)).count();
        for p in 0..self.parts.len() {
            if running >= STREAMS_AT_ONCE {
                break;
            }
            if self.parts[p].as_ref().is_some_and(|r| r.streaming() == Some(false)) {
                self.with(p as PartitionId, |r| r.start_stream(now_ms, out));
                running += 1;
            }
        }
    }

    /// What came of the tier's jobs: values freed or kept, values back
    /// in memory and the requests that waited for them, stepped now.
    pub fn tier_done(&mut self, done: Vec<Done>, now: Now, out: &mut Outbox) {
        for d in done {
            match d {
                Done::Written(id, len, result) => {
                    let ok = result.is_ok();
                    self.with(id.partition, |r| r.tier_written(&id, len, ok, now.wall_ms, out));
                    let t = self.tier.as_deref_mut().expect("jobs come from a tier");
                    match result {
                        Ok(()) => {
                            t.stats.moved_out += 1;
                            t.failing = None;
                        }
                        Err(e) => {
                            t.stats.errors += 1;
                            t.failing = Some(e);
                        }
                    }
                }
                Done::Sent { to, partition, ids, values } => match values {
                    Ok(values) => {
                        self.tier.as_deref_mut().expect("jobs come from a tier").stats.streamed_out += values.len() as u64;
                        let values = ids.into_iter().map(|id| (id.key, id.ts, id.site)).zip(values).collect();
                        send(out, Dest::Node(to), Message::Values { partition, values });
                    }
                    // It asks again.
                    Err(_) => self.tier.as_deref_mut().expect("jobs come from a tier").stats.errors += 1,
                },
                Done::Synced(partition, result) => {
                    if result.is_err() {
                        self.tier.as_deref_mut().expect("jobs come from a tier").stats.errors += 1;
                    }
                    self.with(partition, |r| r.tier_synced(result.is_ok(), now.wall_ms, out));
                    self.grant_streams(now.wall_ms, out);
                }
                Done::Read(id, result) => {
                    let failed = match result {
                        Ok(Some(value)) => {
                            self.with(id.partition, |r| r.moved_back(&id, &value));
                            self.tier.as_deref_mut().expect("jobs come from a tier").stats.read_back += 1;
                            None
                        }
                        // Written since (the requests find the new version);
                        // or removed and written out again between the read
                        // and its answer (the tier reads and writes on
                        // threads of their own): read once more; or gone from
                        // the disk under the node.
                        Ok(None) => {
                            let still = self.parts.get(id.partition as usize).and_then(Option::as_ref).and_then(|r| r.on_disk(&id.key));
                            let t = self.tier.as_deref_mut().expect("jobs come from a tier");
                            if still == Some(id.clone()) && t.reread.insert((id.partition, id.key.clone())) {
                                t.jobs.push(Job::Read(id));
                                continue;
                            }
                            (still == Some(id.clone())).then(|| "the value of this key is missing from the disk".to_string())
                        }
                        Err(e) => Some(e.to_string()),
                    };
                    let t = self.tier.as_deref_mut().expect("jobs come from a tier");
                    t.reread.remove(&(id.partition, id.key.clone()));
                    let waiting = t.waiting.remove(&(id.partition, id.key.clone())).unwrap_or_default();
                    if let Some(why) = failed {
                        t.stats.errors += 1;
                        for msg in waiting {
                            if let Some(op) = msg.op() {
                                send(out, Dest::Client(op.client), Message::Refused { op, reason: Refusal::Disk(why.clone()) });
                            }
                        }
                        continue;
                    }
                    t.resuming = true;
                    for msg in waiting {
                        self.step(msg, now, out);
                    }
                    if let Some(t) = self.tier.as_deref_mut() {
                        t.resuming = false;
                    }
                }
            }
        }
    }
}
