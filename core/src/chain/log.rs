//! What a replica makes durable and reads back: its log records (updates
//! as applied, states, checkpoints, clock ceilings), replay after a
//! restart, and how far its log is on disk.

use super::*;

impl ChainReplica {
    /// Puts the updates a step applied in the log records (`take_log`):
    /// the node makes those durable (per its fsync policy) before anything
    /// the step put in its outbox leaves it.
    pub(super) fn log_applied(&mut self) {
        if !self.to_log.is_empty() {
            let updates = std::mem::take(&mut self.to_log);
            self.log.push(LogRecord::Updates { partition: self.partition, updates });
        }
    }

    /// The log records produced since the last call, in order.
    pub fn take_log(&mut self) -> Vec<LogRecord> {
        std::mem::take(&mut self.log)
    }

    /// Recovery: re-applies updates read back from this node's log (those
    /// after its last state record), sending nothing. They are sorted by
    /// sequence number first: the log holds them in the order they were
    /// applied, but a replay must not depend on it. Updates not known
    /// stable are kept for the successor, which is sent them once the node
    /// serves again (duplicates are ignored there); a checkpoint's list of
    /// such updates lands here too. Returns the first missing sequence
    /// number if the log has a gap: nothing after it is applied (it is
    /// recovered from the chain instead, never guessed).
    pub fn replay(&mut self, mut updates: Vec<Update>, now_ms: u64) -> Option<u64> {
        updates.sort_by_key(|u| u.seq);
        updates.dedup_by_key(|u| u.seq);
        let mut forward = Vec::new();
        let mut ignored = Outbox::new();
        let mut gap = None;
        for u in updates {
            if u.seq == self.applied + 1 {
                self.apply(u, now_ms, &mut forward, &mut ignored);
            } else if u.seq > self.applied + 1 {
                gap = Some(self.applied + 1);
                break;
            } else if !self.is_tail() && u.seq > self.stable && !self.unstable.iter().any(|x| x.seq == u.seq) {
                let at = self.unstable.partition_point(|x| x.seq < u.seq);
                self.unstable.insert(at, u);
            }
        }
        self.to_log.clear();
        for u in forward {
            let at = self.unstable.partition_point(|x| x.seq < u.seq);
            self.unstable.insert(at, u);
        }
        gap
    }

    /// This replica as log records, for compacting the log: its state and
    /// the updates not yet known stable. Empty while the replica is still
    /// joining.
    pub fn checkpoint(&self) -> Vec<LogRecord> {
        if self.joining {
            return Vec::new();
        }
        let [state, on_disk] = self.state_records();
        let unstable = LogRecord::Updates { partition: self.partition, updates: self.unstable.iter().cloned().collect() };
        let behind = LogRecord::Behind { partition: self.partition, behind: self.catching_up };
        let clock = LogRecord::Clock { partition: self.partition, ceiling: self.ceiling };
        vec![state, on_disk, unstable, behind, clock]
    }

    /// The state as log records: the values here in the `State`, those in
    /// the disk tier named in the `OnDisk` after it.
    pub(super) fn state_records(&self) -> [LogRecord; 2] {
        let (state, on_disk) = self.state_named();
        [LogRecord::State { partition: self.partition, state }, LogRecord::OnDisk { partition: self.partition, entries: on_disk }]
    }

    /// The state with the values here, and the keys whose values are in
    /// the disk tier (named, not read back).
    pub(super) fn state_named(&self) -> (PartitionState, Vec<crate::record::OnDiskEntry>) {
        let (entries, on_disk) = self.store.checkpoint_entries();
        (PartitionState { entries, ..self.state_without_entries() }, on_disk)
    }

    /// The state without its entries (`checkpoint` adds them its way).
    fn state_without_entries(&self) -> PartitionState {
        PartitionState {
            applied: self.applied,
            stable: self.stable,
            entries: Vec::new(),
            sessions: self.writes.export(),
            history: self.history,
            unreported: self.outgoing.iter().cloned().collect(),
        }
    }

    /// Recovery: the keys whose values a checkpoint left in the disk tier
    /// (after `restore`, before `replay`).
    pub fn restore_on_disk(&mut self, entries: Vec<crate::record::OnDiskEntry>, now_ms: u64) {
        for d in &entries {
            self.clock.observe(d.version.ts);
        }
        self.store.install_on_disk(entries, now_ms);
    }

    pub(super) fn state(&self) -> PartitionState {
        PartitionState { entries: self.store.entries(), ..self.state_without_entries() }
    }

    /// Recovery: installs a state transfer read back from this node's log.
    pub fn restore(&mut self, state: PartitionState, now_ms: u64) {
        let PartitionState { applied, stable, entries, sessions, history, unreported } = state;
        if self.reported.is_some() {
            self.outgoing = unreported.into();
            self.scanned = 0;
        }
        for (_, s) in &entries {
            self.clock.observe(s.version.ts);
        }
        self.store.install(entries, now_ms);
        self.reclaim_installed();
        self.writes.import(sessions, now_ms);
        self.applied = applied;
        self.history = history;
        self.set_recent(VecDeque::new());
        self.stable = if self.is_tail() { applied } else { stable.min(applied) };
        self.unstable.clear();
        self.early.clear();
        self.joining = false;
    }

    /// What it has applied goes into the node's log with ticket `ticket`
    /// (the next or last `take_log`).
    pub fn mark(&mut self, ticket: u64) {
        if !self.logs {
            self.on_disk = self.applied;
            return;
        }
        let last = self.marks.back().map_or(self.on_disk, |&(_, seq)| seq);
        if self.applied > last {
            self.marks.push_back((ticket, self.applied));
        }
    }

    /// The node's log is synced through ticket `through`; returns whether
    /// more of this replica is on disk now.
    pub fn synced(&mut self, through: u64) -> bool {
        let before = self.on_disk;
        while let Some(&(_, seq)) = self.marks.front().filter(|&&(ticket, _)| ticket <= through) {
            self.on_disk = self.on_disk.max(seq);
            self.marks.pop_front();
        }
        self.on_disk > before
    }

    /// The node has no disk: updates are not logged (state, clock and
    /// membership records still are, for the driver to drop), and what is
    /// applied counts as on disk at once.
    pub fn without_log(&mut self) {
        self.logs = false;
        self.to_log.clear();
        self.on_disk = self.applied;
        self.marks.clear();
    }

    /// Recovered from this node's disk: all of it is there.
    pub fn recovered_on_disk(&mut self) {
        self.on_disk = self.applied;
        self.marks.clear();
    }

    /// Moves the clock past `ts` and logs a ceiling above it, before a
    /// promise of `ts` leaves this replica. A promise lets the stabilizer, and then other sites, count
    /// everything up to it as stable. A node whose clock ran ahead and
    /// restarts with it set right again must still never order a write
    /// below a promise its chain passed on (the stabilizer would drop the
    /// write's id, and updates that depend on it would be applied
    /// elsewhere without it): recovery starts the clock at the ceiling.
    /// One record per `CEILING_MS` of promises. State transfers cover the
    /// sender's clock the same way.
    pub(super) fn cover(&mut self, ts: Timestamp) {
        self.clock.observe(ts);
        if ts > self.ceiling {
            self.ceiling = Timestamp::new(ts.physical_ms() + CEILING_MS, 0);
            self.log.push(LogRecord::Clock { partition: self.partition, ceiling: self.ceiling });
        }
    }

    /// After recovery: the clock starts above every promise made before.
    pub fn observe_ceiling(&mut self, ceiling: Timestamp) {
        self.ceiling = self.ceiling.max(ceiling);
        self.clock.observe(ceiling);
    }
}
