//! A replica joining a chain: the state transfer from its predecessor,
//! whole or, for a node returning after a short absence, just the updates
//! it missed (ChainReaction §3.3.3, node join).
//!
//! With a disk tier, a whole state carries the values in memory and names
//! those on disk (keys and versions only), and the new member then asks
//! for those values a chunk at a time, in key order (`Stream`): neither
//! node loads them all into memory, the predecessor reads them off its
//! request loop, and the new member writes them straight to its own tier
//! (values cold there stay cold here). It serves once it has them all and
//! its tier has made them durable; the updates that arrive meanwhile wait,
//! as they wait for the state.

use super::*;
use crate::message::{OnDiskEntry, ValueRef};
use crate::tier::{Job, ValueId};
use std::collections::HashMap;

/// Bytes of values asked for at a time while streaming (and at most that
/// much more on its way into the tier).
pub const STREAM_CHUNK: usize = 2 << 20;

/// A chunk not answered within this long is asked for again (then after
/// twice as long, up to `MAX_ASK_MS`): a predecessor sending many
/// partitions at once reads their chunks one after another.
pub const STREAM_RETRY_MS: u64 = 1_000;

/// A stream waiting for its turn (`Node::grant_streams`) tells its
/// predecessor this often that it still wants the versions kept for it
/// (well within `node::STREAM_IDLE_MS`).
pub const STREAM_KEEPALIVE_MS: u64 = 2_000;

/// A joining replica's values still to come from its predecessor's disk
/// tier (`Message::Transfer`'s `on_disk`).
#[derive(Debug, Default)]
pub struct Stream {
    /// Not asked for yet, in key order.
    wanted: VecDeque<OnDiskEntry>,
    /// Asked for, by key, and when (asked again after `ask_every_ms`).
    asked: BTreeMap<Bytes, OnDiskEntry>,
    asked_ms: u64,
    /// Asked again after this long without an answer: doubles with each
    /// ask, up to `MAX_ASK_MS` (a predecessor sending many partitions at
    /// once answers slowly; asking again only adds to its work).
    ask_every_ms: u64,
    /// Values on their way into this node's tier, by key, and their bytes.
    writing: HashMap<Bytes, OnDiskEntry>,
    writing_bytes: usize,
    /// The tier failed a write lately: ask again on the tick, not at once.
    failed: bool,
    /// All here; the tier is making them durable (`Job::Sync`).
    syncing: bool,
    /// Its turn came: it asks for values (`Node::grant_streams` lets a
    /// few of a node's streams run at once).
    go: bool,
}

fn value_ref(e: &OnDiskEntry) -> ValueRef {
    (e.key.clone(), e.version.ts, e.version.site)
}

impl ChainReplica {
    /// A replica for a node that joins `partition`'s chain: it asks its
    /// predecessor for the partition's state and meanwhile keeps the updates
    /// that arrive (ChainReaction §3.3.3, node join).
    ///
    /// `retained` is what this node held of the partition when it last left
    /// the chain (a node removed while paused or partitioned, now back): it
    /// keeps it and asks only for what came after, which the predecessor
    /// sends if its recent updates reach back that far and the histories
    /// match (else the whole state, which replaces it).
    pub fn joining(
        topology: &Topology,
        partition: PartitionId,
        me: NodeId,
        site: SiteId,
        retained: Option<ChainReplica>,
        now_ms: u64,
        out: &mut Outbox,
    ) -> Option<Self> {
        let mut r = ChainReplica::new(topology, partition, me, site)?;
        if r.index == 0 {
            // Nobody to copy from: the site is being born (or every replica
            // of the partition was lost).
            return ChainReplica::born(topology, partition, me, site);
        }
        if let Some(old) = retained {
            r.store = old.store;
            r.store.keep_history(r.index == 0);
            r.clock = old.clock;
            r.ceiling = old.ceiling;
            r.applied = old.applied;
            r.history = old.history;
            r.stable = old.stable.min(old.applied);
            r.writes = old.writes;
            // Its updates not yet reported to every site: if it becomes the
            // tail, its reporter starts from them (the predecessor sends
            // only what came after, and a tail that started without them
            // would declare them reported).
            r.outgoing = old.outgoing;
            r.reported = old.reported;
        }
        r.joining = true;
        r.asked_ms = now_ms;
        r.request_state(out);
        Some(r)
    }

    pub(super) fn request_state(&self, out: &mut Outbox) {
        if let Some(prev) = self.predecessor() {
            let me = self.chain[self.index];
            let have = (self.applied > 0).then_some((self.applied, self.history));
            send(out, Dest::Node(prev), Message::Fetch { epoch: self.epoch, partition: self.partition, from: me, have });
        }
    }

    /// The successor `from` asks for the partition's state: the latest
    /// version of every key (one level of divergence means nothing older is
    /// needed) and where the update order stands. Updates after it follow on
    /// the same link.
    ///
    /// A successor that still holds the partition up to some position
    /// (`have`: applied, history) gets only the updates after it, if this
    /// replica's recent updates reach back there and its history at that
    /// position is the same (the successor did not apply updates that were
    /// later lost, like a head's unforwarded writes); else the whole state.
    pub fn fetch(&self, epoch: u64, from: NodeId, have: Option<(u64, u64)>, out: &mut Outbox) {
        if epoch != self.epoch || self.joining || self.successor() != Some(from) {
            return;
        }
        let (partition, clock) = (self.partition, self.clock.last());
        let msg = match have.and_then(|(applied, history)| Some((self.updates_after(applied, history)?, history))) {
            Some((updates, history_before)) => {
                Message::Transfer { epoch, partition, state: None, updates, history_before, clock, on_disk: Vec::new() }
            }
            // With the recent updates, so the new member can in turn serve
            // a returning successor that was away since before this.
            None => {
                let history_before = self.recent.front().map_or(self.history, |(_, h, _)| *h);
                let updates = self.recent.iter().map(|(u, _, _)| u.clone()).collect();
                let (state, mut on_disk) = self.state_named();
                // Streamed in key order: the tier keeps a partition's
                // values in key order, so reading them back is sequential.
                on_disk.sort_unstable_by(|a, b| a.key.cmp(&b.key));
                Message::Transfer { epoch, partition, state: Some(Box::new(state)), updates, history_before, clock, on_disk }
            }
        };
        send(out, Dest::Node(from), msg);
    }

    /// Takes `updates` (the sender's recent updates, ending at this
    /// replica's position, starting after history `before`) as this
    /// replica's recent updates, if they hash to its history.
    pub(super) fn seed_recent(&mut self, updates: Vec<Update>, before: u64, now_ms: u64) {
        let mut history = before;
        let recent: VecDeque<(Update, u64, u64)> = updates
            .into_iter()
            .map(|u| {
                let entry = (u, history, now_ms);
                history = chain_history(history, &entry.0);
                entry
            })
            .collect();
        if history == self.history && recent.back().is_none_or(|(u, _, _)| u.seq == self.applied) {
            self.set_recent(recent);
        }
    }

    pub(super) fn set_recent(&mut self, recent: VecDeque<(Update, u64, u64)>) {
        self.recent_bytes = recent.iter().map(|(u, _, _)| update_bytes(u)).sum();
        self.recent = recent;
    }

    /// The updates after `applied`, if this replica has all of them and
    /// its history at `applied` is `history`.
    pub(super) fn updates_after(&self, applied: u64, history: u64) -> Option<Vec<Update>> {
        if applied == self.applied {
            return (history == self.history).then(Vec::new);
        }
        let first = self.recent.front()?.0.seq;
        if applied < first.saturating_sub(1) || applied > self.applied {
            return None;
        }
        let from = (applied + 1 - first) as usize;
        let (_, before, _) = &self.recent[from];
        (*before == history).then(|| self.recent.iter().skip(from).map(|(u, _, _)| u.clone()).collect())
    }

    /// Installs a state transfer (or, with `state` None, keeps the state
    /// this replica retained and applies the `updates` after it), then
    /// applies the updates that arrived meanwhile.
    /// Returns whether it was taken (not stale).
    #[allow(clippy::too_many_arguments)]
    pub fn transfer(
        &mut self,
        epoch: u64,
        state: Option<PartitionState>,
        updates: Vec<Update>,
        history_before: u64,
        clock: Timestamp,
        on_disk: Vec<OnDiskEntry>,
        now_ms: u64,
        out: &mut Outbox,
    ) -> bool {
        if epoch != self.epoch || self.stream.is_some() {
            // Streaming the values of a state taken: this is the answer to
            // an ask made before it arrived (one stream at a time; a new
            // configuration or a lost value starts it over).
            return false;
        }
        self.cover(clock);
        if !self.joining {
            // The answer to a fetch for a gap (`tick`): only what extends
            // this replica.
            let extends = match &state {
                Some(state) => state.applied > self.applied,
                None => history_before == self.history,
            };
            if !extends || self.catching_up {
                return false;
            }
        } else if state.is_none() && (self.applied == 0 || history_before != self.history) {
            // The answer to an earlier ask for what came after a retained
            // state this replica no longer has (it took a whole state
            // since, and maybe gave up streaming its values).
            return false;
        }
        // Taken before `restore`, which clears it.
        let early: Vec<Update> = std::mem::take(&mut self.early).into_values().collect();
        match state {
            Some(state) if !on_disk.is_empty() => {
                // The values on disk follow (`Stream`): this replica
                // serves, and logs the state, once they are all here.
                self.restore(state, now_ms);
                self.seed_recent(updates, history_before, now_ms);
                self.early = early.into_iter().map(|u| (u.seq, u)).collect();
                self.joining = true;
                // It asks for the values in its turn (`start_stream`).
                let asked_ms = now_ms;
                self.stream =
                    Some(Box::new(Stream { wanted: on_disk.into(), ask_every_ms: STREAM_RETRY_MS, asked_ms, ..Stream::default() }));
                return true;
            }
            Some(state) => {
                self.stream = None;
                self.log.push(LogRecord::State { partition: self.partition, state: state.clone() });
                self.restore(state, now_ms);
                self.seed_recent(updates, history_before, now_ms);
            }
            None if !self.joining => self.forward(updates, now_ms, out),
            None => {
                // The predecessor matched this history before answering.
                debug_assert_eq!(history_before, self.history);
                // The log holds nothing of this partition since the node
                // left the chain (`Dropped`): the state it keeps goes in
                // first, then the updates as they apply.
                let records = self.state_records();
                self.log.extend(records);
                self.joining = false;
                self.unstable.clear();
                if self.is_tail() {
                    self.stable = self.applied;
                }
                self.forward(updates, now_ms, out);
            }
        }
        self.serve_from(early, now_ms, out);
        true
    }

    /// Installed: applies the updates that arrived meanwhile, and serves.
    fn serve_from(&mut self, early: Vec<Update>, now_ms: u64, out: &mut Outbox) {
        self.forward(early, now_ms, out);
        if self.is_tail() {
            self.wake_waiters(out);
            self.ack_upwards(out);
        }
    }

    /// Whether this replica streams values in (`Some`), and whether its
    /// turn came.
    pub fn streaming(&self) -> Option<bool> {
        self.stream.as_deref().map(|s| s.go)
    }

    /// Its turn to stream came: it starts asking.
    pub fn start_stream(&mut self, now_ms: u64, out: &mut Outbox) {
        let Some(s) = self.stream.as_deref_mut() else { return };
        s.go = true;
        s.asked_ms = now_ms;
        self.ask_values(now_ms, out);
    }

    /// Asks the predecessor for the next chunk of values, if none is on
    /// its way and the tier keeps up; once all are here, has the tier
    /// make them durable, then serves (`streamed`).
    fn ask_values(&mut self, now_ms: u64, out: &mut Outbox) {
        let Some(s) = self.stream.as_deref_mut() else { return };
        if !s.go || !s.asked.is_empty() || s.syncing || s.failed || s.writing_bytes > STREAM_CHUNK {
            return;
        }
        let mut bytes = 0;
        let mut ids = Vec::new();
        while bytes < STREAM_CHUNK {
            let Some(e) = s.wanted.pop_front() else { break };
            bytes += e.len as usize + e.key.len();
            ids.push(value_ref(&e));
            s.asked.insert(e.key.clone(), e);
        }
        if ids.is_empty() {
            if s.writing.is_empty() {
                match self.store.has_tier() {
                    true => {
                        s.syncing = true;
                        self.store.tier_job(Job::Sync(self.partition));
                    }
                    false => self.streamed(now_ms, out),
                }
            }
            return;
        }
        s.asked_ms = now_ms;
        if let Some(prev) = self.predecessor() {
            send(out, Dest::Node(prev), Message::FetchValues { partition: self.partition, from: self.chain[self.index], ids, done: false });
        }
    }

    /// The predecessor's answer to `FetchValues`: each value goes to this
    /// node's tier (or into memory, without one). A version it no longer
    /// has (it kept them for this stream, but gave up on it meanwhile)
    /// means the state is out of date: the join starts over.
    pub fn values(&mut self, values: Vec<(ValueRef, Option<Bytes>)>, now_ms: u64, out: &mut Outbox) {
        let Some(s) = self.stream.as_deref_mut() else { return };
        let mut lost = false;
        for ((key, ts, site), value) in values {
            let Some(e) = s.asked.remove(&key).filter(|e| (e.version.ts, e.version.site) == (ts, site)) else { continue };
            s.ask_every_ms = STREAM_RETRY_MS;
            match value {
                None => lost = true,
                Some(v) if self.store.has_tier() => {
                    s.writing_bytes += e.len as usize;
                    let id = ValueId { partition: self.partition, key: key.clone(), ts, site };
                    s.writing.insert(key, e);
                    self.store.tier_job(Job::Write(id, v));
                }
                Some(v) => self.store.install_value(&e, &v, now_ms),
            }
        }
        if lost {
            self.abandon_stream();
            self.asked_ms = now_ms;
            self.ask_every_ms = RETRANSMIT_MS;
            self.request_state(out);
            return;
        }
        self.ask_values(now_ms, out);
    }

    /// Gives up the values on their way, and the state they belonged to:
    /// the next ask is for a whole state (a replica that asked for what
    /// came after the state it half has would serve without the values).
    pub(super) fn abandon_stream(&mut self) {
        if self.stream.take().is_some() {
            self.store.clear();
            self.applied = 0;
            self.set_recent(VecDeque::new());
        }
    }

    /// Whether `id`'s write was a value streamed in (then it is on disk
    /// here now, or asked for again).
    pub(super) fn streamed_in(&mut self, id: &ValueId, ok: bool, now_ms: u64, out: &mut Outbox) -> bool {
        let Some(s) = self.stream.as_deref_mut() else { return false };
        let Some(e) = s.writing.remove(&id.key) else { return false };
        if (e.version.ts, e.version.site) != (id.ts, id.site) {
            s.writing.insert(id.key.clone(), e);
            return false;
        }
        s.writing_bytes -= e.len as usize;
        match ok {
            true => self.store.install_on_disk(vec![e], now_ms),
            false => {
                s.failed = true;
                s.asked_ms = now_ms;
                s.wanted.push_back(e);
            }
        }
        self.ask_values(now_ms, out);
        true
    }

    /// The tier made the streamed values durable (`ok`), or could not
    /// (tried again on the tick).
    pub fn tier_synced(&mut self, ok: bool, now_ms: u64, out: &mut Outbox) {
        let Some(s) = self.stream.as_deref_mut().filter(|s| s.syncing) else { return };
        s.syncing = false;
        match ok {
            true => self.streamed(now_ms, out),
            false => (s.failed, s.asked_ms) = (true, now_ms),
        }
    }

    /// Every value is here: the state goes in the log (values in the tier
    /// named), and this replica serves.
    fn streamed(&mut self, now_ms: u64, out: &mut Outbox) {
        self.stream = None;
        self.joining = false;
        let records = self.state_records();
        self.log.extend(records);
        if let Some(prev) = self.predecessor() {
            let from = self.chain[self.index];
            send(out, Dest::Node(prev), Message::FetchValues { partition: self.partition, from, ids: Vec::new(), done: true });
        }
        let early: Vec<Update> = std::mem::take(&mut self.early).into_values().collect();
        self.serve_from(early, now_ms, out);
    }

    /// Asks again for what was not answered, or after the tier failed;
    /// waiting for its turn, says it is still there.
    pub(super) fn stream_tick(&mut self, now_ms: u64, out: &mut Outbox) {
        let Some(s) = self.stream.as_deref_mut() else { return };
        if !s.go {
            if now_ms.saturating_sub(s.asked_ms) >= STREAM_KEEPALIVE_MS {
                s.asked_ms = now_ms;
                if let Some(prev) = self.predecessor() {
                    let (partition, from) = (self.partition, self.chain[self.index]);
                    send(out, Dest::Node(prev), Message::FetchValues { partition, from, ids: Vec::new(), done: false });
                }
            }
            return;
        }
        if now_ms.saturating_sub(s.asked_ms) < s.ask_every_ms {
            return;
        }
        if s.asked.is_empty() {
            s.failed = false;
            s.asked_ms = now_ms;
            return self.ask_values(now_ms, out);
        }
        s.asked_ms = now_ms;
        s.ask_every_ms = (2 * s.ask_every_ms).min(MAX_ASK_MS);
        let ids = s.asked.values().map(value_ref).collect();
        if let Some(prev) = self.predecessor() {
            send(out, Dest::Node(prev), Message::FetchValues { partition: self.partition, from: self.chain[self.index], ids, done: false });
        }
    }
}
