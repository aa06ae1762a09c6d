//! A replica joining a chain: the state transfer from its predecessor,
//! whole or, for a node returning after a short absence, just the updates
//! it missed (ChainReaction §3.3.3, node join).

use super::*;

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
            Some((updates, history_before)) => Message::Transfer { epoch, partition, state: None, updates, history_before, clock },
            // With the recent updates, so the new member can in turn serve
            // a returning successor that was away since before this.
            None => {
                let history_before = self.recent.front().map_or(self.history, |(_, h, _)| *h);
                let updates = self.recent.iter().map(|(u, _, _)| u.clone()).collect();
                Message::Transfer { epoch, partition, state: Some(Box::new(self.state())), updates, history_before, clock }
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
        now_ms: u64,
        out: &mut Outbox,
    ) -> bool {
        if epoch != self.epoch {
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
        }
        // Taken before `restore`, which clears it.
        let early: Vec<Update> = std::mem::take(&mut self.early).into_values().collect();
        match state {
            Some(state) => {
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
                self.log.push(LogRecord::State { partition: self.partition, state: self.state() });
                self.joining = false;
                self.unstable.clear();
                if self.is_tail() {
                    self.stable = self.applied;
                }
                self.forward(updates, now_ms, out);
            }
        }
        self.forward(early, now_ms, out);
        if self.is_tail() {
            self.wake_waiters(out);
            self.ack_upwards(out);
        }
        true
    }
}
