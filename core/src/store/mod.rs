//! The versions one replica holds for one partition.
//!
//! Each key's latest version is one packed allocation (`entry`), found
//! through one hash table of those entries: the key is not stored twice,
//! the value is inline, and the version costs a few bytes
//! (`entry::Entry`). A node's RSS grows by about 103 bytes per key with
//! 16-byte values and 204 with 100-byte values, where Redis's grows by 130
//! and 208 (BENCHMARKS.md, "Memory").
//!
//! Get-transactions read "the latest version at or before timestamp S" at
//! the chain heads (see `chain`), and S is at most a few milliseconds old,
//! so the versions a key had before its latest are kept only for a while
//! (`RETAIN_MS`, at most `MAX_VERSIONS`), in a side table that holds
//! nothing for keys not written lately (`history`). A snapshot that would
//! need a dropped version is refused as `SnapshotTooOld` (the caller
//! retries with a fresh S) rather than answered wrongly.
//!
//! With a disk tier (`tier`), a store keeps its values in memory in a
//! cache policy's order and moves them out past the node's budget
//! (`move_out`): the entry stays, without the value's bytes (ON_DISK).
//!
//! Deletes are tombstone versions (value `None`) so that they order and
//! replicate like any write. Expired values read as absent; the head
//! expires them actively (`chain/expiry.rs`: a tombstone of the same
//! version, replicated down the chain), and tombstones are collected once
//! no write they must win against can still arrive.

mod access;
mod entry;
pub mod glob;
mod history;

pub use crate::message::Stored;
use crate::ring::PartitionId;
use crate::tier::{Cache, CachePolicy, Job, Tier, ValueId};
use crate::version::Version;
pub use access::Access;
use bytes::Bytes;
use entry::Entry;
pub use entry::View;
use hashbrown::HashTable;
use history::History;
use std::sync::Arc;

/// How long a replaced version stays readable by snapshots.
pub const RETAIN_MS: u64 = 5_000;
/// At most this many versions of one key are kept, whatever their age.
pub const MAX_VERSIONS: usize = 8;

/// At most this many bytes of values start moving out of one store per
/// call (`move_out`, once per tick): the copies are made under the node's
/// lock, and a budget lowered at once must not stall requests while a
/// whole data set is copied.
const MOVE_PER_CALL: usize = 1 << 20;

/// A key absent from the retained history at the requested time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooOld;

/// A version to store, borrowed from whatever carries it.
#[derive(Clone, Copy, Debug)]
pub struct Write<'a> {
    pub version: &'a Version,
    pub seq: u64,
    pub value: Option<&'a [u8]>,
    pub expires_at_ms: Option<u64>,
    /// The head expired `version` (`message::Update::expired`): if it is
    /// still the key's latest, it becomes a tombstone of that version.
    pub expired: bool,
}

/// All keys of one partition at one replica.
pub struct PartitionStore {
    latest: HashTable<Entry>,
    hasher: ahash::RandomState,
    /// Versions replaced lately, for snapshots.
    history: History,
    /// Bytes of the entries (their allocations), for MEMORY and INFO.
    bytes: usize,
    /// The latest tombstone collected (`collect`): a snapshot from before
    /// it may have needed what it deleted.
    collected: Option<Version>,
    /// Whether replaced versions are kept for snapshots (`keep_history`).
    keeps_history: bool,
    /// State of `chance` (never 0).
    rng: u32,
    /// When a snapshot last read here (`snapshot_seen`): versions are
    /// kept only while snapshots come.
    snapshot_ms: Option<u64>,
    /// The disk tier, if the node has one.
    tier: Option<Box<StoreTier>>,
}

/// A store's part in the disk tier.
struct StoreTier {
    partition: PartitionId,
    /// The keys whose values are in memory, in the order they leave it.
    /// A key with its value here and not in the cache is on its way out
    /// (written, not yet freed: `moved_out`).
    cache: Cache,
    tier: Arc<dyn Tier>,
    /// Work for the shell (`take_jobs`).
    jobs: Vec<Job>,
    /// Bytes of values on their way out.
    leaving: usize,
    /// Keys whose value is on disk, and the values' bytes.
    keys_on_disk: usize,
    bytes_on_disk: usize,
}

/// Where a store's values are (INFO `tier`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Places {
    pub keys_in_memory: usize,
    pub keys_on_disk: usize,
    pub bytes_on_disk: usize,
    /// Bytes of values being written out.
    pub leaving: usize,
}

impl Default for PartitionStore {
    fn default() -> Self {
        PartitionStore {
            latest: HashTable::new(),
            hasher: ahash::RandomState::new(),
            history: History::default(),
            bytes: 0,
            collected: None,
            keeps_history: true,
            rng: 0x9e37_79b9,
            snapshot_ms: None,
            tier: None,
        }
    }
}

impl std::fmt::Debug for PartitionStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartitionStore").field("keys", &self.latest.len()).field("bytes", &self.bytes).finish()
    }
}

impl PartitionStore {
    fn hash(&self, key: &[u8]) -> u64 {
        self.hasher.hash_one(key)
    }

    fn find(&self, key: &[u8]) -> Option<&Entry> {
        self.latest.find(self.hash(key), |e| e.key() == key)
    }

    /// `replaced` (or removed) gives way to a version without its value
    /// on disk: the tier's copy is garbage, and the cache forgets the key
    /// unless the new version has a value here.
    fn replacing(&mut self, hash: u64, replaced: &Entry, value_here: bool) {
        let Some(t) = self.tier.as_deref_mut() else { return };
        let v = replaced.view();
        if v.on_disk() || v.clean() {
            t.jobs.push(Job::Remove(ValueId { partition: t.partition, key: Bytes::copy_from_slice(v.key()), ts: v.ts(), site: v.site() }));
        }
        if v.on_disk() {
            t.keys_on_disk -= 1;
            t.bytes_on_disk -= v.disk_len();
        }
        match value_here {
            true => t.cache.insert(hash),
            false => {
                t.cache.remove(hash);
            }
        }
    }

    /// Keeps values in memory by `policy`'s order and moves them to `tier`
    /// past the node's budget (`move_out`). Every value here now is in
    /// the cache, in the table's order.
    pub fn enable_tier(&mut self, partition: PartitionId, policy: CachePolicy, tier: Arc<dyn Tier>) {
        let mut cache = Cache::new(policy);
        for e in &self.latest {
            if e.view().value().is_some() {
                cache.insert(self.hasher.hash_one(e.key()));
            }
        }
        self.tier = Some(Box::new(StoreTier { partition, cache, tier, jobs: Vec::new(), leaving: 0, keys_on_disk: 0, bytes_on_disk: 0 }));
    }

    pub fn has_tier(&self) -> bool {
        self.tier.is_some()
    }

    /// The work this store asks of the tier since last asked.
    pub fn take_jobs(&mut self, into: &mut Vec<Job>) {
        if let Some(t) = self.tier.as_deref_mut() {
            // Taken whole: a burst of work leaves no room behind.
            into.extend(std::mem::take(&mut t.jobs));
        }
    }

    /// Where this store's values are.
    pub fn places(&self) -> Places {
        self.tier.as_deref().map_or(Places { keys_in_memory: self.latest.len(), ..Places::default() }, |t| Places {
            keys_in_memory: t.cache.len(),
            keys_on_disk: t.keys_on_disk,
            bytes_on_disk: t.bytes_on_disk,
            leaving: t.leaving,
        })
    }

    /// Starts moving values out, by the cache's order, until `want` bytes
    /// are on their way (less what already is): values the tier holds
    /// already (CLEAN) leave at once, the others once written
    /// (`moved_out`). Returns the bytes freed now or on their way; 0 when
    /// no value is left in memory to move.
    pub fn move_out(&mut self, want: usize) -> usize {
        let Some(t) = self.tier.as_deref_mut() else { return 0 };
        let mut moved = 0;
        let want = want.min(MOVE_PER_CALL);
        while moved < want.saturating_sub(t.leaving) {
            let Some(id) = t.cache.pop() else { break };
            let hasher = &self.hasher;
            let Ok(mut slot) = self.latest.find_entry(id, |e| hasher.hash_one(e.key()) == id && e.view().value().is_some()) else {
                continue;
            };
            let v = slot.get().view();
            let value = v.value().expect("found with a value");
            if v.clean() {
                let out = slot.get().moved_out();
                moved += slot.get().size() - out.size();
                self.bytes = self.bytes + out.size() - slot.get().size();
                t.keys_on_disk += 1;
                t.bytes_on_disk += value.len();
                *slot.get_mut() = out;
                continue;
            }
            let vid = ValueId { partition: t.partition, key: Bytes::copy_from_slice(v.key()), ts: v.ts(), site: v.site() };
            t.leaving += value.len();
            moved += value.len();
            t.jobs.push(Job::Write(vid, Bytes::copy_from_slice(value)));
        }
        moved + t.leaving
    }

    /// The tier wrote `id`'s value of `len` bytes (`ok`) or could not: the
    /// value leaves memory if the key still has that version and was not
    /// used since (else it stays, in the cache).
    pub fn moved_out(&mut self, id: &ValueId, len: usize, ok: bool) {
        let hash = self.hash(&id.key);
        let Some(t) = self.tier.as_deref_mut() else { return };
        t.leaving = t.leaving.saturating_sub(len);
        let Ok(mut slot) = self.latest.find_entry(hash, |e| e.key() == id.key) else {
            if ok {
                // The key is gone (collected, or the store was installed
                // anew): nothing names this copy.
                t.jobs.push(Job::Remove(id.clone()));
            }
            return;
        };
        let v = slot.get().view();
        if (v.ts(), v.site()) != (id.ts, id.site) {
            if ok {
                // Written again meanwhile: the copy is garbage (no entry
                // names this version any more).
                t.jobs.push(Job::Remove(id.clone()));
            }
            return;
        }
        // This version, but on disk already (an earlier write of it was
        // answered first): nothing to do. Used since (in
        // the cache again): it stays. Its copy is not trusted as CLEAN: a
        // removal of this version may be queued after the write (a state
        // transfer installed the same version again), and only a read
        // back proves the tier holds it.
        if v.is_tombstone() {
            if ok {
                // Expired meanwhile: nothing names the copy.
                t.jobs.push(Job::Remove(id.clone()));
            }
            return;
        }
        if v.value().is_none() || t.cache.contains(hash) {
            return;
        }
        if !ok {
            t.cache.insert(hash);
            return;
        }
        let len = v.value().map_or(0, <[u8]>::len);
        let out = slot.get().moved_out();
        self.bytes = self.bytes + out.size() - slot.get().size();
        t.keys_on_disk += 1;
        t.bytes_on_disk += len;
        *slot.get_mut() = out;
    }

    /// The value of `key`'s latest version, if it is on disk: what to read
    /// back before serving it without waiting (`moved_back`).
    pub fn on_disk(&self, key: &[u8]) -> Option<ValueId> {
        let t = self.tier.as_deref()?;
        let v = self.latest(key)?;
        v.on_disk().then(|| ValueId { partition: t.partition, key: Bytes::copy_from_slice(key), ts: v.ts(), site: v.site() })
    }

    /// `id`'s value, read back from disk: into memory (and the cache), if
    /// the key still has that version on disk.
    pub fn moved_back(&mut self, id: &ValueId, value: &[u8]) {
        let hash = self.hash(&id.key);
        let Some(t) = self.tier.as_deref_mut() else { return };
        let Ok(mut slot) = self.latest.find_entry(hash, |e| e.key() == id.key) else { return };
        let v = slot.get().view();
        if (v.ts(), v.site()) != (id.ts, id.site) || !v.on_disk() {
            return;
        }
        t.keys_on_disk -= 1;
        t.bytes_on_disk -= v.disk_len();
        let back = slot.get().moved_back(value);
        self.bytes = self.bytes + back.size() - slot.get().size();
        *slot.get_mut() = back;
        t.cache.insert(hash);
    }

    /// `v` as a transfer carries it: a value on disk is read back now,
    /// from this thread (state transfers and checkpoints read every value;
    /// client requests have theirs read back first, off the request loop).
    pub fn stored(&self, v: View<'_>) -> Stored {
        if !v.on_disk() {
            return v.stored();
        }
        let t = self.tier.as_deref().expect("a value on disk has a tier");
        let id = ValueId { partition: t.partition, key: Bytes::copy_from_slice(v.key()), ts: v.ts(), site: v.site() };
        let value = match t.tier.read(&id) {
            Ok(Some(value)) => value,
            // The tier holds every value the store has on disk (a value
            // leaves memory only once written, and its copy is removed
            // only once the key has another version): a value gone is a
            // lost disk, which this replica cannot serve from.
            Ok(None) => panic!("the disk tier lost the value of {id:?}"),
            Err(e) => panic!("reading {id:?} back: {e}"),
        };
        Stored { version: v.version(), seq: v.seq(), value: Some(value), expires_at_ms: v.expires_at_ms() }
    }

    /// Installs a version. An older version than the latest (a concurrent
    /// write that lost last-writer-wins, possible once several sites write)
    /// is kept in the history so snapshots stay exact; the same version
    /// twice is ignored.
    pub fn apply(&mut self, key: &[u8], w: Write<'_>, now_ms: u64) {
        let hash = self.hash(key);
        let hasher = &self.hasher;
        let wants_history = self.wants_history(now_ms);
        match self.latest.entry(hash, |e| e.key() == key, |e| hasher.hash_one(e.key())) {
            hashbrown::hash_table::Entry::Vacant(_) if w.expired => return,
            hashbrown::hash_table::Entry::Vacant(slot) => {
                let e = Entry::new(key, w.version, w.seq, w.value, w.expires_at_ms, false, Access::new(now_ms));
                self.bytes += e.size();
                slot.insert(e);
                if let (Some(t), Some(_)) = (self.tier.as_deref_mut(), w.value) {
                    t.cache.insert(hash);
                }
            }
            hashbrown::hash_table::Entry::Occupied(mut slot) => {
                let old = slot.get().view();
                let old_version = (old.ts(), old.site());
                if w.expired {
                    // Only the version the head expired; a write after it
                    // (here first) stays.
                    if old_version == (w.version.ts, w.version.site) && !old.is_tombstone() {
                        let e = Entry::new(key, w.version, w.seq, None, None, true, old.access());
                        let expired = std::mem::replace(slot.get_mut(), e);
                        self.bytes = self.bytes + slot.get().size() - expired.size();
                        self.replacing(hash, &expired, false);
                    }
                    return;
                }
                let new_version = (w.version.ts, w.version.site);
                if old_version == new_version {
                    return;
                }
                if old_version > new_version {
                    // Lost last-writer-wins (or a duplicate of one that
                    // did): kept for snapshots, if this replica keeps
                    // history; else the latest says older ones are gone.
                    if !wants_history {
                        if !old.replaced() {
                            let flagged = slot.get().with_replaced();
                            *slot.get_mut() = flagged;
                        }
                        // What is kept from before may be older than this
                        // one: a snapshot must not skip over it to them.
                        self.history.forget(key);
                        return;
                    }
                    if self.history.holds(key, w.version) {
                        return;
                    }
                    let lost = Stored {
                        version: w.version.clone(),
                        seq: w.seq,
                        value: w.value.map(Bytes::copy_from_slice),
                        expires_at_ms: w.expires_at_ms,
                    };
                    let after_another = old.replaced();
                    self.history.keep(key, lost, after_another, now_ms);
                    return;
                }
                // A write is a use, as Redis counts one.
                let access = old.access().used(now_ms, chance(&mut self.rng));
                let e = Entry::new(key, w.version, w.seq, w.value, w.expires_at_ms, true, access);
                let replaced = std::mem::replace(slot.get_mut(), e);
                self.bytes = self.bytes + slot.get().size() - replaced.size();
                self.replacing(hash, &replaced, w.value.is_some());
                if wants_history && !replaced.view().on_disk() {
                    self.history.keep(key, replaced.view().stored(), replaced.view().replaced(), now_ms);
                } else {
                    // Versions kept from while snapshots came are older than
                    // the one replaced now: a snapshot between the two must
                    // be refused, not given the older one. (A value on disk
                    // is not read back to be kept: snapshots before it are
                    // refused too.)
                    self.history.forget(key);
                }
            }
        }
        self.history.prune(now_ms);
    }

    /// Whether to keep replaced versions for snapshots: only heads serve
    /// snapshots (`chain::snapshot_read`), so other replicas keep none and
    /// their entries say older versions are gone (a replica that becomes
    /// head answers snapshots from before that as too old, and the client
    /// asks again with a fresh time). A head keeps them only while
    /// snapshots come (`snapshot_seen`): a write-heavy partition nobody
    /// reads by snapshot pays nothing for them, and the first snapshot
    /// after a quiet spell may be asked again, with a fresh time.
    pub fn keep_history(&mut self, keep: bool) {
        if self.keeps_history && !keep {
            self.history = History::default();
        }
        self.keeps_history = keep;
    }

    /// A snapshot read here at `now_ms`: replaced versions are kept from now
    /// on, for `RETAIN_MS` after the last one.
    pub fn snapshot_seen(&mut self, now_ms: u64) {
        self.snapshot_ms = Some(now_ms);
    }

    fn wants_history(&self, now_ms: u64) -> bool {
        self.keeps_history && self.snapshot_ms.is_some_and(|at| now_ms.saturating_sub(at) < RETAIN_MS)
    }

    /// Forgets replaced versions past their time (`history`), and gives
    /// back the table's room once it holds less than a quarter of it
    /// (after mass deletes or expiries).
    pub fn tick(&mut self, now_ms: u64) {
        self.history.prune(now_ms);
        if let Some(t) = self.tier.as_deref_mut() {
            t.cache.shrink();
        }
        if self.latest.capacity() > 64 && self.latest.len() < self.latest.capacity() / 4 {
            let hasher = &self.hasher;
            self.latest.shrink_to_fit(|e| hasher.hash_one(e.key()));
        }
    }

    /// Whether `version` of `key` is here (or older than what is kept):
    /// the seq to wait for before it counts as stable.
    pub fn holds(&self, key: &[u8], version: &Version) -> Option<u64> {
        let latest = self.find(key)?.view();
        if (latest.ts(), latest.site()) == (version.ts, version.site) {
            return Some(latest.seq());
        }
        if let Some(seq) = self.history.seq_of(key, version) {
            return Some(seq);
        }
        // Older than what is kept: it was here, and the latest covers it.
        let truncated = self.history.truncated(key).unwrap_or(latest.replaced());
        let older = truncated && *version < self.history.oldest(key).unwrap_or_else(|| latest.version());
        older.then(|| latest.seq())
    }

    /// The latest version of `key`.
    pub fn latest(&self, key: &[u8]) -> Option<View<'_>> {
        self.find(key).map(Entry::view)
    }

    /// The latest version of `key`, read by a client at `now_ms`: a use
    /// of the key (`access`), which LRU and LFU eviction go by.
    pub fn latest_used(&mut self, key: &[u8], now_ms: u64) -> Option<View<'_>> {
        let chance = chance(&mut self.rng);
        let hash = self.hasher.hash_one(key);
        let e = self.latest.find_mut(hash, |e| e.key() == key)?;
        if let Some(t) = self.tier.as_deref_mut() {
            // A value here but on its way out comes back into the cache.
            if e.view().value().is_some() {
                t.cache.insert(hash);
            }
        }
        let (at, access) = {
            let v = e.view();
            (v.access_at(), v.access())
        };
        let used = access.used(now_ms, chance);
        if used != access {
            e.set_access_at(at, used);
        }
        Some(e.view())
    }

    /// `n` entries from position `start` of the table's order (wrapping
    /// around, each once at most), with the bytes each takes: a random
    /// sample for eviction (`chain::evict`), the hasher being randomly
    /// seeded.
    pub fn window(&self, start: usize, n: usize) -> impl Iterator<Item = (View<'_>, usize)> {
        let len = self.latest.len();
        let start = start.checked_rem(len).unwrap_or(0);
        let first = n.min(len - start);
        let rest = (n - first).min(start);
        self.latest.iter().skip(start).take(first).chain(self.latest.iter().take(rest)).map(|e| (e.view(), e.size()))
    }

    /// A random number (xorshift), for sampling and LFU counters.
    pub fn chance(&mut self) -> u32 {
        chance(&mut self.rng)
    }

    /// The latest version `visible` accepts.
    pub fn latest_where(&self, key: &[u8], visible: impl Fn(&Version) -> bool) -> Result<Option<Stored>, TooOld> {
        let Some(latest) = self.latest(key) else {
            // Absent: unless a tombstone it may have had was collected
            // after the snapshot's time.
            return match &self.collected {
                Some(v) if !visible(v) => Err(TooOld),
                _ => Ok(None),
            };
        };
        let version = latest.version();
        if visible(&version) {
            return Ok(Some(self.stored(latest)));
        }
        if let Some(s) = self.history.latest_where(key, &visible) {
            return Ok(Some(s));
        }
        // Nothing kept is visible: if older versions were dropped, one of
        // them may have been.
        match self.history.truncated(key).unwrap_or(latest.replaced()) {
            true => Err(TooOld),
            false => Ok(None),
        }
    }

    /// Keys with a live value at `now_ms`.
    pub fn keyspace(&self, now_ms: u64) -> crate::message::Keyspace {
        let mut k = crate::message::Keyspace::default();
        for e in &self.latest {
            let v = e.view();
            if v.is_live(now_ms) {
                k.keys += 1;
                k.expires += v.expires_at_ms().is_some() as u64;
            }
        }
        k
    }

    /// The live keys matching `pattern` (all of them without one), added
    /// to `into`; with `one`, at most one, from a random place in the
    /// table (RANDOMKEY).
    pub fn keys(&mut self, pattern: Option<&[u8]>, one: bool, now_ms: u64, into: &mut Vec<Bytes>) {
        // A random place near the table's start: reaching a place costs a
        // step per entry before it.
        let start = if one { self.chance() as usize % self.latest.len().clamp(1, 64) } else { 0 };
        let len = self.latest.len();
        for (v, _) in self.window(start, len) {
            if v.is_live(now_ms) && pattern.is_none_or(|p| glob::matches(p, v.key())) {
                into.push(Bytes::copy_from_slice(v.key()));
                if one {
                    return;
                }
            }
        }
    }

    /// Every key's latest version, tombstones too: what a state transfer
    /// or a checkpoint carries.
    pub fn entries(&self) -> Vec<(Bytes, Stored)> {
        self.stored_all(self.latest.iter().map(Entry::view))
    }

    /// `stored` for many entries, the values on disk read back in one go
    /// (`Tier::read_many`).
    fn stored_all<'a>(&'a self, views: impl Iterator<Item = View<'a>>) -> Vec<(Bytes, Stored)> {
        let views: Vec<View<'a>> = views.collect();
        let Some(t) = self.tier.as_deref().filter(|t| t.keys_on_disk > 0) else {
            return views.iter().map(|v| (Bytes::copy_from_slice(v.key()), v.stored())).collect();
        };
        let ids: Vec<ValueId> = views
            .iter()
            .filter(|v| v.on_disk())
            .map(|v| ValueId { partition: t.partition, key: Bytes::copy_from_slice(v.key()), ts: v.ts(), site: v.site() })
            .collect();
        let values = match t.tier.read_many(&ids) {
            Ok(values) => values,
            // As `stored`: a replica that cannot read its own disk cannot
            // hand its state on.
            Err(e) => panic!("reading {} values back from the disk tier: {e}", ids.len()),
        };
        let mut values = ids.into_iter().zip(values);
        views
            .iter()
            .map(|v| {
                let stored = match v.on_disk() {
                    false => v.stored(),
                    true => {
                        let (id, value) = values.next().expect("one value per id");
                        let value = value.unwrap_or_else(|| panic!("the disk tier lost the value of {id:?}"));
                        Stored { version: v.version(), seq: v.seq(), value: Some(value), expires_at_ms: v.expires_at_ms() }
                    }
                };
                (Bytes::copy_from_slice(v.key()), stored)
            })
            .collect()
    }

    /// `entries`, for a checkpoint with a disk tier: the versions whose
    /// values are here (tombstones too), and those whose values are in the
    /// tier, named rather than read back.
    pub fn checkpoint_entries(&self) -> (Vec<(Bytes, Stored)>, Vec<crate::record::OnDiskEntry>) {
        let (mut here, mut on_disk) = (Vec::new(), Vec::new());
        for e in &self.latest {
            let v = e.view();
            match v.on_disk() {
                true => on_disk.push(crate::record::OnDiskEntry {
                    key: Bytes::copy_from_slice(v.key()),
                    version: v.version(),
                    seq: v.seq(),
                    expires_at_ms: v.expires_at_ms(),
                    len: v.disk_len() as u32,
                }),
                false => here.push((Bytes::copy_from_slice(v.key()), v.stored())),
            }
        }
        (here, on_disk)
    }

    /// Recovery: the keys a checkpoint named as in the tier, installed
    /// with their values there (after `install` of the rest); and a
    /// streamed state transfer's values, once written to this node's tier.
    pub fn install_on_disk(&mut self, entries: Vec<crate::record::OnDiskEntry>, now_ms: u64) {
        let Some(t) = self.tier.as_deref_mut() else { return };
        t.keys_on_disk += entries.len();
        t.bytes_on_disk += entries.iter().map(|d| d.len as usize).sum::<usize>();
        for d in entries {
            let placeholder = vec![0u8; d.len as usize];
            let e = Entry::new(&d.key, &d.version, d.seq, Some(&placeholder), d.expires_at_ms, true, Access::new(now_ms)).moved_out();
            self.put_entry(e);
        }
    }

    /// A streamed state transfer's value, into memory (a node without a
    /// disk tier).
    pub fn install_value(&mut self, d: &crate::record::OnDiskEntry, value: &[u8], now_ms: u64) {
        let e = Entry::new(&d.key, &d.version, d.seq, Some(value), d.expires_at_ms, true, Access::new(now_ms));
        let hash = self.hash(&d.key);
        if let Some(t) = self.tier.as_deref_mut() {
            t.cache.insert(hash);
        }
        self.put_entry(e);
    }

    /// Puts `e` in the table, in place of its key's entry if any (the
    /// replaced entry must be neither on disk nor in the cache).
    fn put_entry(&mut self, e: Entry) {
        self.bytes += e.size();
        let hash = self.hasher.hash_one(e.key());
        let hasher = &self.hasher;
        match self.latest.find_entry(hash, |x| x.key() == e.key()) {
            Ok(mut slot) => {
                self.bytes -= slot.get().size();
                *slot.get_mut() = e;
            }
            Err(_) => {
                self.latest.insert_unique(hash, e, |x| hasher.hash_one(x.key()));
            }
        }
    }

    /// Work for the tier on this store's behalf (a streamed value to keep,
    /// a sync); nothing without a tier.
    pub fn tier_job(&mut self, job: Job) {
        if let Some(t) = self.tier.as_deref_mut() {
            t.jobs.push(job);
        }
    }

    /// Every key's latest version but tombstones, sorted by key: to compare
    /// replicas (they collect tombstones each in its own time).
    pub fn digest(&self) -> Vec<(Bytes, Stored)> {
        let mut all = self.stored_all(self.latest.iter().map(Entry::view).filter(|v| !v.is_tombstone()));
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    /// Removes `key`'s tombstone, if its latest version is still the one
    /// written at `seq` (`chain::expiry`: once nothing it must win against
    /// can arrive any more). False while versions before it are still kept
    /// for snapshots (ask again later); true once done, or if there is
    /// nothing to do (the key was written since).
    pub fn collect(&mut self, key: &[u8], seq: u64) -> bool {
        let hash = self.hash(key);
        let Ok(slot) = self.latest.find_entry(hash, |e| e.key() == key) else {
            return true;
        };
        let v = slot.get().view();
        if v.seq() != seq || !v.is_tombstone() || self.history.truncated(key).is_some() {
            // Rewritten since, or versions before it are still kept for
            // snapshots (`collect` is asked again later).
            return v.seq() != seq || !v.is_tombstone();
        }
        let version = v.version();
        if self.collected.as_ref().is_none_or(|c| *c < version) {
            self.collected = Some(version);
        }
        let (e, _) = slot.remove();
        self.bytes -= e.size();
        true
    }

    /// The bytes `key`'s entry takes (0 if absent).
    pub fn key_size(&self, key: &[u8]) -> usize {
        self.find(key).map_or(0, Entry::size)
    }

    /// Every tombstone: (seq, version time, key).
    pub fn tombstones(&self) -> impl Iterator<Item = (u64, crate::hlc::Timestamp, &[u8])> {
        self.latest.iter().filter(|e| e.view().is_tombstone()).map(|e| (e.view().seq(), e.view().ts(), e.view().key()))
    }

    /// Every key with an expiry, and when (the head's active expiry starts
    /// from it).
    pub fn expiring(&self) -> impl Iterator<Item = (u64, &[u8])> {
        self.latest.iter().filter_map(|e| {
            let v = e.view();
            Some((v.expires_at_ms()?, v.key()))
        })
    }

    /// Replaces everything with a state transfer's latest versions, as if
    /// written at `now_ms`. Their history is unknown, so snapshot reads
    /// before them are refused.
    pub fn install(&mut self, entries: Vec<(Bytes, Stored)>, now_ms: u64) {
        self.clear();
        self.latest.reserve(entries.len(), |e| self.hasher.hash_one(e.key()));
        for (key, s) in entries {
            let e = Entry::from_stored(&key, &s, true, Access::new(now_ms));
            self.bytes += e.size();
            let hash = self.hash(&key);
            if let (Some(t), Some(_)) = (self.tier.as_deref_mut(), &s.value) {
                t.cache.insert(hash);
            }
            let hasher = &self.hasher;
            self.latest.insert_unique(hash, e, |e| hasher.hash_one(e.key()));
        }
    }

    /// Forgets every key (and its values on disk).
    pub fn clear(&mut self) {
        if let Some(t) = self.tier.as_deref_mut() {
            for e in &self.latest {
                let v = e.view();
                if v.on_disk() || v.clean() {
                    t.jobs.push(Job::Remove(ValueId {
                        partition: t.partition,
                        key: Bytes::copy_from_slice(v.key()),
                        ts: v.ts(),
                        site: v.site(),
                    }));
                }
            }
            let policy = t.cache.policy();
            (t.cache, t.leaving, t.keys_on_disk, t.bytes_on_disk) = (Cache::new(policy), 0, 0, 0);
        }
        self.latest.clear();
        self.history = History::default();
        self.bytes = 0;
    }

    /// Keys held (live, expired or deleted).
    pub fn len(&self) -> usize {
        self.latest.len()
    }

    pub fn is_empty(&self) -> bool {
        self.latest.is_empty()
    }

    /// Bytes this store takes: its entries, its table and the history.
    pub fn memory(&self) -> usize {
        let cache = self.tier.as_deref().map_or(0, |t| t.cache.memory());
        self.bytes + self.latest.capacity() * (std::mem::size_of::<Entry>() + 1) + self.history.memory() + cache
    }

    /// The bytes `key` takes, as `MEMORY USAGE` reports them: its entry and
    /// its share of the table.
    pub fn key_memory(&self, key: &[u8]) -> Option<usize> {
        let e = self.find(key)?;
        let slot = (std::mem::size_of::<Entry>() + 1) * self.latest.capacity() / self.latest.len().max(1);
        Some(e.size() + slot + self.history.key_memory(key))
    }
}

/// The latest version at or before `at` (tests).
#[cfg(test)]
fn at(s: &PartitionStore, key: &[u8], at: crate::hlc::Timestamp) -> Result<Option<Stored>, TooOld> {
    s.latest_where(key, |v| v.ts <= at)
}

/// xorshift32: cheap, and the same sequence on every run (the simulator
/// replays schedules exactly).
fn chance(state: &mut u32) -> u32 {
    let mut x = *state;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    *state = x;
    x
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hlc::Timestamp;

    /// A write at `now`, snapshots reading meanwhile (so history is kept).
    fn put(s: &mut PartitionStore, key: &str, ms: u64, seq: u64, now: u64) {
        s.snapshot_seen(now);
        let version = Version::local(0, Timestamp::new(ms, 0));
        let value = format!("v{seq}");
        s.apply(key.as_bytes(), Write { version: &version, seq, value: Some(value.as_bytes()), expires_at_ms: None, expired: false }, now);
    }

    #[test]
    fn reads_at_a_timestamp_from_recent_history() {
        let mut s = PartitionStore::default();
        put(&mut s, "k", 100, 1, 100);
        put(&mut s, "k", 200, 2, 200);
        assert_eq!(at(&s, b"k", Timestamp::new(150, 0)).unwrap().unwrap().seq, 1);
        assert_eq!(at(&s, b"k", Timestamp::new(250, 0)).unwrap().unwrap().seq, 2);
        assert_eq!(at(&s, b"k", Timestamp::new(50, 0)), Ok(None));
        assert_eq!(s.latest(b"k").unwrap().seq(), 2);
    }

    #[test]
    fn drops_old_history_and_says_so() {
        let mut s = PartitionStore::default();
        put(&mut s, "k", 100, 1, 100);
        put(&mut s, "k", 200, 2, 200);
        put(&mut s, "k", 10_000, 3, 10_000);
        assert_eq!(at(&s, b"k", Timestamp::new(150, 0)), Err(TooOld));
        assert_eq!(at(&s, b"k", Timestamp::new(10_001, 0)).unwrap().unwrap().seq, 3);
        for i in 0..20 {
            put(&mut s, "k", 10_001 + i, 4 + i, 10_001 + i);
        }
        assert_eq!(s.history.versions_of(b"k"), MAX_VERSIONS - 1, "the latest and at most seven before it");
        put(&mut s, "other", 30_000, 40, 30_000);
        assert_eq!(s.history.versions_of(b"k"), 0, "nothing is kept past the retention time");
    }

    #[test]
    fn out_of_order_and_duplicate_versions() {
        let mut s = PartitionStore::default();
        put(&mut s, "k", 200, 2, 200);
        put(&mut s, "k", 100, 1, 200);
        put(&mut s, "k", 200, 2, 200);
        put(&mut s, "k", 100, 1, 200);
        assert_eq!(s.latest(b"k").unwrap().seq(), 2);
        assert_eq!(s.history.versions_of(b"k"), 1);
        assert_eq!(s.holds(b"k", &Version::local(0, Timestamp::new(100, 0))), Some(1));
        assert_eq!(at(&s, b"k", Timestamp::new(150, 0)).unwrap().unwrap().seq, 1, "the loser stays readable by snapshots");
    }

    #[test]
    fn without_snapshots_no_history_is_kept_and_older_snapshots_are_refused() {
        let mut s = PartitionStore::default();
        let v = |ms| Version::local(0, Timestamp::new(ms, 0));
        s.apply(b"k", Write { version: &v(100), seq: 1, value: Some(b"a"), expires_at_ms: None, expired: false }, 100);
        s.apply(b"k", Write { version: &v(200), seq: 2, value: Some(b"b"), expires_at_ms: None, expired: false }, 200);
        assert_eq!(s.history.versions_of(b"k"), 0);
        assert_eq!(at(&s, b"k", Timestamp::new(150, 0)), Err(TooOld), "asked again with a fresh time");
        s.snapshot_seen(200);
        s.apply(b"k", Write { version: &v(300), seq: 3, value: Some(b"c"), expires_at_ms: None, expired: false }, 300);
        assert_eq!(at(&s, b"k", Timestamp::new(250, 0)).unwrap().unwrap().seq, 2, "kept once snapshots come");
    }

    /// Found by the simulator (sim/tests/roles.rs, seed 4): snapshots
    /// stopped a while; a version kept from when they came stayed in the
    /// history, the one after it was replaced without being kept, and a
    /// snapshot between the two got the older one (a fractured MGET).
    #[test]
    fn a_version_replaced_while_snapshots_pause_is_not_skipped_by_older_history() {
        let mut s = PartitionStore::default();
        let v = |ms| Version::local(0, Timestamp::new(ms, 0));
        s.snapshot_seen(100);
        s.apply(b"k", Write { version: &v(100), seq: 1, value: Some(b"a"), expires_at_ms: None, expired: false }, 100);
        s.apply(b"k", Write { version: &v(4_000), seq: 2, value: Some(b"b"), expires_at_ms: None, expired: false }, 4_000);
        // No snapshot since 100: from 5100 on, replaced versions are not kept.
        s.apply(b"k", Write { version: &v(6_000), seq: 3, value: Some(b"c"), expires_at_ms: None, expired: false }, 6_000);
        assert_eq!(at(&s, b"k", Timestamp::new(5_000, 0)), Err(TooOld), "seq 2 is gone: asked again with a fresh time");
        // The same with a write that lost last-writer-wins (several sites).
        s.snapshot_seen(20_000);
        s.apply(b"j", Write { version: &v(20_000), seq: 1, value: Some(b"a"), expires_at_ms: None, expired: false }, 20_000);
        s.apply(b"j", Write { version: &v(22_000), seq: 2, value: Some(b"b"), expires_at_ms: None, expired: false }, 22_000);
        s.apply(b"j", Write { version: &v(21_000), seq: 3, value: Some(b"c"), expires_at_ms: None, expired: false }, 26_000);
        assert_eq!(at(&s, b"j", Timestamp::new(21_500, 0)), Err(TooOld), "the loser at 21000 is gone");
    }

    #[test]
    fn expired_values_read_as_absent() {
        let mut s = PartitionStore::default();
        let version = Version::local(0, Timestamp::new(1, 0));
        s.apply(b"k", Write { version: &version, seq: 1, value: Some(b"x"), expires_at_ms: Some(50), expired: false }, 1);
        assert!(s.latest(b"k").unwrap().live_value(49).is_some());
        assert!(s.latest(b"k").unwrap().live_value(50).is_none());
        assert_eq!(s.keyspace(10), crate::message::Keyspace { keys: 1, expires: 1 });
        assert_eq!(s.keyspace(60).keys, 0);
    }

    #[test]
    fn an_expiry_turns_only_its_version_into_a_tombstone_and_collection_removes_it() {
        let mut s = PartitionStore::default();
        let v1 = Version::local(0, Timestamp::new(100, 0));
        s.apply(b"k", Write { version: &v1, seq: 1, value: Some(b"x"), expires_at_ms: Some(150), expired: false }, 100);
        let v2 = Version::local(0, Timestamp::new(160, 0));
        let newer = Write { version: &v2, seq: 2, value: Some(b"y"), expires_at_ms: None, expired: false };
        let mut t = PartitionStore::default();
        t.install(s.entries(), 0);
        // Here the expiry comes first; elsewhere a newer write did.
        s.apply(b"k", Write { version: &v1, seq: 2, value: None, expires_at_ms: None, expired: true }, 160);
        assert_eq!(s.latest(b"k").map(|v| (v.value().is_none(), v.seq(), v.ts())), Some((true, 2, v1.ts)));
        assert!(s.digest().is_empty(), "a tombstone is not compared");
        assert_eq!(s.entries().len(), 1, "but a state transfer carries it");
        t.apply(b"k", newer, 160);
        t.apply(b"k", Write { version: &v1, seq: 3, value: None, expires_at_ms: None, expired: true }, 170);
        assert_eq!(t.latest(b"k").unwrap().value(), Some(&b"y"[..]), "the expiry of an older version is nothing");
        assert!(s.collect(b"k", 2));
        assert!(s.latest(b"k").is_none() && s.is_empty());
        // A delete's tombstone waits until the version it replaced is no
        // longer kept for snapshots.
        let v3 = Version::local(0, Timestamp::new(300, 0));
        s.snapshot_seen(300);
        s.apply(b"d", Write { version: &v1, seq: 3, value: Some(b"x"), expires_at_ms: None, expired: false }, 300);
        s.apply(b"d", Write { version: &v3, seq: 4, value: None, expires_at_ms: None, expired: false }, 300);
        assert!(!s.collect(b"d", 4), "the deleted version is kept for snapshots a while");
        s.tick(300 + RETAIN_MS);
        assert!(s.collect(b"d", 4) && s.is_empty());
        assert!(s.collect(b"d", 4), "nothing left to do");
        assert_eq!(at(&s, b"k", Timestamp::new(250, 0)), Err(TooOld), "a snapshot from before the collected tombstone");
        assert_eq!(at(&s, b"k", Timestamp::new(500, 0)), Ok(None));
    }

    #[test]
    fn a_transfer_installs_latest_versions_without_their_history() {
        let mut s = PartitionStore::default();
        put(&mut s, "a", 100, 1, 100);
        put(&mut s, "b", 200, 2, 200);
        let mut t = PartitionStore::default();
        t.install(s.entries(), 0);
        assert_eq!(t.digest(), s.digest());
        assert_eq!(t.memory() > 0, s.memory() > 0);
        assert_eq!(at(&t, b"a", Timestamp::new(50, 0)), Err(TooOld), "what came before is unknown");
    }
}
