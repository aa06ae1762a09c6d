//! The node's part in geo-replication around `geo::Geo`: promises down
//! the chains, remote writes at heads, tails' reporters.

use super::*;

/// Geo-replication: the chain side of it (promises down the chain, remote
/// writes at heads, tails' reporters), around `geo::Geo`.
impl Node {
    /// With several sites: every replica keeps what is not reported yet,
    /// and each tail's reporter follows its replica.
    pub(super) fn geo_replicas(&mut self, out: &mut Outbox) {
        if self.geo.is_none() {
            return;
        }
        for p in 0..self.parts.len() as PartitionId {
            if let Some(r) = &mut self.parts[p as usize] {
                r.enable_geo();
            }
            self.geo_tail(p, out);
        }
    }

    /// Starts, feeds or stops `partition`'s reporter as its replica here is
    /// the serving tail or not; returns how far everything is reported.
    pub(super) fn geo_feed(&mut self, partition: PartitionId) -> Option<u64> {
        let geo = self.geo.as_mut()?;
        if let Some(r) = self.parts[partition as usize].as_mut() {
            // Whatever it applied is in the node's log now.
            self.log.extend(r.take_log());
            r.mark(ticket(self.logged, &self.log));
        }
        let tail = self.parts[partition as usize].as_mut().filter(|r| self.admitted && r.reports());
        geo.tail(partition, tail)
    }

    /// `geo_feed`, then tells the chain how far everything is reported.
    pub(super) fn geo_tail(&mut self, partition: PartitionId, out: &mut Outbox) {
        if let Some(seq) = self.geo_feed(partition) {
            if let Some(r) = &mut self.parts[partition as usize] {
                r.set_reported(seq, out);
            }
        }
    }

    /// Sends at once what this node's reporters got in this step
    /// (`Geo::flush`): a write or a promise reaches the stabilizer leader
    /// without waiting for the tick.
    pub(super) fn flush_geo(&mut self, now_ms: u64, out: &mut Outbox) {
        if let Some(geo) = &mut self.geo {
            geo.flush(now_ms, out);
        }
    }

    pub(super) fn geo_tick(&mut self, now_ms: u64, out: &mut Outbox) {
        if self.geo.is_none() {
            return;
        }
        for op in self.geo.as_mut().map(|g| g.unsequenced(now_ms)).unwrap_or_default() {
            self.not_responsible(op, out);
        }
        let due = self.geo.as_mut().is_some_and(|g| g.promises_due(now_ms));
        self.promise(due, None, now_ms, out);
        for p in 0..self.parts.len() as PartitionId {
            self.geo_tail(p, out);
        }
        let topology = self.topology.clone();
        if let Some(geo) = &mut self.geo {
            geo.tick(&topology, now_ms, out);
        }
        self.promise_if_asked(now_ms, out);
        self.answer_probes(now_ms, out);
    }

    /// Heads promise at once if the stabilizer leader asked them to.
    pub(super) fn promise_if_asked(&mut self, now_ms: u64, out: &mut Outbox) {
        if let Some(at) = self.geo.as_mut().and_then(|g| g.take_asked(now_ms)) {
            self.promise(true, Some(at), now_ms, out);
        }
    }

    /// Heads make a promise (if `make`; past `asked`, if the leader asked),
    /// and every replica passes on the promise it has all updates for.
    pub(super) fn promise(&mut self, make: bool, asked: Option<Timestamp>, now_ms: u64, out: &mut Outbox) {
        let mut promises = BTreeMap::new();
        for p in 0..self.parts.len() as PartitionId {
            if let Some(r) = self.parts[p as usize].as_mut().filter(|_| make) {
                r.make_promise(now_ms, asked.unwrap_or(Timestamp::ZERO));
            }
            self.pass_promise(p, asked, &mut promises);
        }
        self.send_promises(promises, asked, out);
    }

    /// Passes `partition`'s promise on once this replica has what it covers:
    /// to the successor, or, at the tail, to the reporter.
    /// `asked`: the promise answers the leader's ask for promises past that
    /// time (`GeoMsg::Promise`): tails send it on without waiting for the
    /// tick.
    pub(super) fn pass_promise(
        &mut self,
        partition: PartitionId,
        asked: Option<Timestamp>,
        to: &mut BTreeMap<NodeId, Vec<(PartitionId, u64, Timestamp)>>,
    ) {
        let Some(r) = &mut self.parts[partition as usize] else { return };
        let Some(ts) = r.take_promise() else { return };
        // Its clock ceiling is durable before the promise leaves.
        self.log.extend(r.take_log());
        match r.next() {
            Some(next) => to.entry(next).or_default().push((partition, r.applied(), ts)),
            None if r.reports() => {
                // The updates it covers are on disk: the reporter has them
                // before the promise.
                self.geo_feed(partition);
                if let Some(geo) = &mut self.geo {
                    geo.promise(partition, ts, asked);
                }
            }
            None => {}
        }
    }

    pub(super) fn send_promises(
        &self,
        promises: BTreeMap<NodeId, Vec<(PartitionId, u64, Timestamp)>>,
        asked: Option<Timestamp>,
        out: &mut Outbox,
    ) {
        for (next, items) in promises {
            send(out, Dest::Node(next), Message::geo(GeoMsg::Promises { epoch: self.topology.epoch, items, asked }));
        }
    }

    /// Where every geo message goes: the one place `GeoMsg` is dispatched
    /// (`Geo::step` then sorts those it is handed among its parts).
    pub(super) fn geo_step(&mut self, msg: GeoMsg, now_ms: u64, out: &mut Outbox) {
        let epoch = self.topology.epoch;
        match msg {
            GeoMsg::Promises { epoch: e, items, asked } if e == epoch => {
                let mut promises = BTreeMap::new();
                for (p, seq, ts) in items {
                    if let Some(r) = self.parts.get_mut(p as usize).and_then(Option::as_mut) {
                        r.on_promise(seq, ts);
                        self.pass_promise(p, asked, &mut promises);
                    }
                }
                self.send_promises(promises, asked, out);
            }
            GeoMsg::Promises { .. } => {}
            GeoMsg::Promise(at) => {
                if let Some(geo) = &mut self.geo {
                    geo.asked(at);
                }
                self.promise_if_asked(now_ms, out);
            }
            GeoMsg::Sequenced(reply) => {
                if let Some((partition, req)) = self.geo.as_mut().and_then(|g| g.sequenced(reply)) {
                    self.put(partition, req, now_ms, out);
                }
            }
            GeoMsg::Apply { epoch: e, write, from } => {
                if e != epoch {
                    return;
                }
                let reply = crate::message::Envelope {
                    to: Dest::Node(from),
                    msg: Message::geo(GeoMsg::Applied { origin: write.version.site, partition: write.partition, ts: write.version.ts }),
                };
                self.with(write.partition, |r| r.apply_remote(write, reply, now_ms, out));
            }
            // Every variant is named here, so a new one must be routed on
            // purpose: the ones above act on this node's replicas; these
            // go to the site's geo machinery (reporters, stabilizer,
            // receiver, sequencer: `Geo::step`).
            msg @ (GeoMsg::Ids(_)
            | GeoMsg::IdsAcks(_)
            | GeoMsg::Ship(_)
            | GeoMsg::SiteAck(_)
            | GeoMsg::Values { .. }
            | GeoMsg::ValuesAcks(_)
            | GeoMsg::Applied { .. }
            | GeoMsg::SiteTime { .. }
            | GeoMsg::Synced { .. }
            | GeoMsg::Relayed(_)
            | GeoMsg::Sequence { .. }
            | GeoMsg::Note { .. }
            | GeoMsg::Noted { .. }
            | GeoMsg::Mirror { .. }
            | GeoMsg::Mirrored { .. }
            | GeoMsg::Failover { .. }
            | GeoMsg::Unfinished { .. }
            | GeoMsg::Lost { .. }
            | GeoMsg::LostTaken { .. }
            | GeoMsg::AskLost { .. }
            | GeoMsg::NoLost { .. }
            | GeoMsg::AskNotes { .. }
            | GeoMsg::NotesAre { .. }) => {
                let topology = self.topology.clone();
                if let Some(geo) = &mut self.geo {
                    geo.step(msg, false, &topology, now_ms, out);
                    // Lost keys a failover handed here are durable before
                    // this node says it took them.
                    self.log.extend(geo.dr_mut().map(|d| d.take_log()).unwrap_or_default());
                }
                self.promise_if_asked(now_ms, out);
                self.answer_probes(now_ms, out);
            }
        }
    }

    /// Identifier-first disaster recovery at a head of the primary: the
    /// client write `op` (its session and write id) of `partition` is
    /// noted at the backup, whose answer lets its session acknowledge it.
    /// Every attempt of the write is noted (a session that heard nothing
    /// sends it again), so nothing here waits or resends. The notes of a
    /// burst of steps leave together (`flush_notes`).
    pub(super) fn note_write(&mut self, partition: PartitionId, op: crate::message::OpId, value_len: usize) {
        if self.geo.as_ref().and_then(Geo::dr).and_then(|d| d.backup_of_primary()).is_none() {
            return;
        }
        let Some(last) = self.parts.get(partition as usize).and_then(Option::as_ref).and_then(|r| r.written(op.client, op.seq)) else {
            return;
        };
        let value_len = value_len.min(u32::MAX as usize) as u32;
        self.notes.push(crate::message::geo::Note { partition, ts: last.version.ts, key: last.key.clone(), op, value_len });
    }

    /// Sends the notes of the steps since the last flush to the backup, in
    /// one message.
    pub(super) fn flush_notes(&mut self, out: &mut Outbox) {
        if self.notes.is_empty() {
            return;
        }
        let notes = std::mem::take(&mut self.notes);
        if let Some(backup) = self.geo.as_ref().and_then(Geo::dr).and_then(|d| d.backup_of_primary()) {
            send(out, Dest::Site(backup), Message::geo(GeoMsg::Note { origin: self.id.site, notes }));
        }
    }

    /// After a failover of this backup: the primary's write of `key` that
    /// never arrived, if any, when `partition`'s replica here holds only
    /// older versions of the key.
    pub(super) fn lost_write(&self, partition: PartitionId, key: &[u8]) -> Option<Version> {
        let missing = self.geo.as_ref()?.dr()?.lost(key)?;
        let r = self.parts.get(partition as usize)?.as_ref()?;
        r.newest(key).is_none_or(|v| v < (missing.ts, missing.site)).then_some(missing)
    }

    /// After a failover of this backup site: the keys still refused (not
    /// written since, as far as this node's replicas tell: a key of a
    /// partition it holds no replica of is listed), from `cursor` on, at
    /// most `count`, and where the next page starts (`CW.DR MISSING`).
    pub fn dr_missing(&self, cursor: &[u8], count: usize) -> (Vec<(bytes::Bytes, Version)>, Option<bytes::Bytes>) {
        let Some(dr) = self.geo.as_ref().and_then(Geo::dr) else { return (Vec::new(), None) };
        dr.missing(cursor, count, |key, missing| self.still_lost(key, missing))
    }

    /// How many keys `dr_missing` lists in all (one pass, nothing sorted:
    /// INFO asks).
    pub fn dr_missing_count(&self) -> Option<usize> {
        let dr = self.geo.as_ref().and_then(Geo::dr).filter(|d| d.failed_over())?;
        Some(dr.count_missing(|key, missing| self.still_lost(key, missing)))
    }

    /// Whether `key`, lost at the failover (`missing`), is not written
    /// since as far as this node's replica of its partition tells (one it
    /// holds no replica of: it cannot tell, and says it is).
    fn still_lost(&self, key: &[u8], missing: &Version) -> bool {
        let partition = self.topology.partition_of(key);
        let newest = self.parts.get(partition as usize).and_then(Option::as_ref).map(|r| r.newest(key));
        newest.is_none_or(|n| n.is_none_or(|v| v < (missing.ts, missing.site)))
    }

    /// Identifier-first disaster recovery between `pair`'s sites (set at
    /// start, like `Identity::dr`).
    pub fn enable_dr(&mut self, pair: crate::message::geo::DrPair) {
        self.id.dr = Some(pair);
        if let Some(geo) = &mut self.geo {
            geo.set_dr(pair, self.id.incarnation);
        }
        if self.admitted {
            // Admitted from the start (`new`, the simulator's birth): what it
            // asks goes at its first tick.
            self.dr_admitted(0, &mut Outbox::new());
        }
    }

    /// A backup node that does not know yet whether its site failed over
    /// serves no client (`Dr::asking`): the driver tries again.
    pub(super) fn dr_asking(&self) -> bool {
        self.geo.as_ref().and_then(Geo::dr).is_some_and(|d| d.asking())
    }

    /// This process is admitted (the first time, for `Dr::admitted`).
    pub(super) fn dr_admitted(&mut self, now_ms: u64, out: &mut Outbox) {
        let topology = self.topology.clone();
        if let Some(d) = self.geo.as_mut().and_then(|g| g.dr_mut()) {
            d.admitted(&topology, now_ms, out);
            self.log.extend(d.take_log());
        }
    }

    /// The version of `key`'s latest write in `partition`'s replica here.
    pub fn newest(&self, partition: PartitionId, key: &[u8]) -> Option<(Timestamp, SiteId)> {
        self.parts.get(partition as usize)?.as_ref()?.newest(key)
    }

    /// This node's part in geo-replication, if the deployment has several
    /// sites.
    pub fn geo(&self) -> Option<&Geo> {
        self.geo.as_ref()
    }

    /// Concurrent writes from different sites resolved at heads here.
    pub fn conflicts(&self) -> u64 {
        self.parts.iter().flatten().map(|r| r.conflicts()).sum()
    }

    /// The latest `n` of them, newest first.
    pub fn recent_conflicts(&self, n: usize) -> Vec<crate::chain::Conflict> {
        let mut all: Vec<crate::chain::Conflict> = self.parts.iter().flatten().flat_map(|r| r.recent_conflicts().cloned()).collect();
        all.sort_by_key(|c| std::cmp::Reverse(c.at_ms));
        all.truncate(n);
        all
    }
}
