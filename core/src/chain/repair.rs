//! Chain repair (ChainReaction §3.3.3): a replica takes its place in a new
//! configuration, and one that moved up its chain catches up from its
//! successor before it serves.

use super::*;

impl ChainReplica {
    /// Installs a new configuration of the chain (ChainReaction §3.3.3):
    /// after a failure the survivors close ranks, a new successor is sent
    /// everything not yet known stable, a new tail declares everything it
    /// holds stable. Returns false if this node left the chain.
    pub fn reconfigure(&mut self, topology: &Topology, me: NodeId, now_ms: u64, out: &mut Outbox) -> bool {
        let chain = topology.chain(self.partition);
        let Some(index) = chain.index_of(me) else { return false };
        let was = self.index;
        let source = self.predecessor();
        // Recovered from the log: its place now may not be the one it had.
        let recovered = self.epoch == 0;
        self.epoch = topology.epoch;
        self.k = topology.shape.k;
        self.chain = chain.nodes.clone();
        self.index = index;
        self.keep_recent = !topology.returning.is_empty();
        self.store.keep_history(index == 0);
        if self.joining {
            if self.stream.is_some() && self.predecessor() == source {
                // Streaming the values of a state from the same
                // predecessor: it goes on (a site's configuration changes
                // for other partitions' sake while a big one streams).
                return true;
            }
            // Else the stream starts over: the state comes anew from
            // whoever precedes this replica now.
            self.abandon_stream();
            self.asked_ms = now_ms;
            self.ask_every_ms = RETRANSMIT_MS;
            self.request_state(out);
            return true;
        }
        // What waits behind a gap, and a promise not passed on yet, came
        // from the old order. Its head may have died with the missing
        // update, and a new head orders a different update at that
        // position: applied after it, the parked ones would splice two
        // histories (and their timestamps would fall below the new head's
        // promises). A predecessor that stays resends what is unstable.
        self.early.clear();
        self.gap_since_ms = None;
        self.promise = None;
        // Moved up past nodes that may hold more than this replica (the
        // update invariant held in the old order, not necessarily in the
        // new one), or recovered from the log into a place it may not have
        // had (a reorder committed while the site was down): catch up from
        // the new successor, which holds the most of those, before serving.
        if (index < was || recovered) && !self.catching_up {
            self.catching_up = true;
            self.log.push(LogRecord::Behind { partition: self.partition, behind: true });
        }
        // A predecessor that moved up may ask for these; the acknowledgements
        // of the new order (whose tail is not the most behind until it has
        // caught up) must not take them away first.
        self.handoff = self.unstable.iter().cloned().collect();
        self.owed = None;
        if self.catching_up {
            self.asked_ms = now_ms;
            self.request_suffix(out);
        }
        if self.is_tail() {
            self.stable = self.applied;
            // Writes waiting for a position that no longer exists are
            // answered here, the end of the chain.
            for u in std::mem::take(&mut self.unstable) {
                if let Some(Ack { op, at, old, .. }) = u.ack {
                    if at as usize > was && at as usize >= index {
                        let msg = Message::PutDone {
                            op,
                            version: Some(u.version),
                            seq: u.seq,
                            chain_index: index as u8,
                            stable: true,
                            stable_through: self.stable,
                            old: old.map(Box::new),
                        };
                        send(out, Dest::Client(op.client), msg);
                    }
                }
            }
            self.wake_waiters(out);
        } else if !self.unstable.is_empty() {
            self.last_progress_ms = now_ms;
            self.send_forward(self.unstable.iter().cloned().collect(), out);
        }
        if self.stable > 0 {
            self.ack_upwards(out);
        }
        true
    }

    /// Asks the successor for what it holds beyond this replica; with no
    /// successor, there is nobody who could hold more.
    pub(super) fn request_suffix(&mut self, out: &mut Outbox) {
        match self.successor() {
            Some(next) => {
                let me = self.chain[self.index];
                send(
                    out,
                    Dest::Node(next),
                    Message::CatchUp { epoch: self.epoch, partition: self.partition, from: me, after: self.applied },
                );
            }
            None => {
                self.caught_up();
                if let Some((from, after)) = self.owed.take() {
                    self.catch_up(self.epoch, from, after, out);
                }
            }
        }
    }

    pub(super) fn caught_up(&mut self) {
        self.catching_up = false;
        self.log.push(LogRecord::Behind { partition: self.partition, behind: false });
    }

    /// The predecessor `from` moved up past this replica and asks for what
    /// this replica holds after `after`. Everything it lacks was not known
    /// stable here when the order changed (it was at or past the tail that
    /// defined stability), so `handoff` has it (and `unstable` what came
    /// since). A replica still catching up itself answers once it has.
    pub fn catch_up(&mut self, epoch: u64, from: NodeId, after: u64, out: &mut Outbox) {
        if epoch != self.epoch || self.joining || self.predecessor() != Some(from) {
            return;
        }
        if self.catching_up {
            self.owed = Some((from, after));
            return;
        }
        let mut updates: Vec<Update> = self.unstable.iter().chain(&self.handoff).filter(|u| u.seq > after).cloned().collect();
        updates.sort_by_key(|u| u.seq);
        updates.dedup_by_key(|u| u.seq);
        let (partition, applied, clock) = (self.partition, self.applied, self.clock.last());
        let msg = match updates.iter().map(|u| u.seq).eq(after + 1..=applied) || applied <= after {
            true => Message::Suffix { epoch, partition, updates, applied, state: None, clock },
            // Some of what it lacks was already stable here (declared by a
            // tail while it was away): the whole state instead.
            false => Message::Suffix { epoch, partition, updates: Vec::new(), applied, state: Some(Box::new(self.state())), clock },
        };
        send(out, Dest::Node(from), msg);
    }

    /// The successor's answer to `request_suffix`: applies what it sent;
    /// serves again once it has all the successor had.
    #[allow(clippy::too_many_arguments)]
    pub fn suffix(
        &mut self,
        epoch: u64,
        updates: Vec<Update>,
        applied: u64,
        state: Option<PartitionState>,
        clock: Timestamp,
        now_ms: u64,
        out: &mut Outbox,
    ) {
        if epoch != self.epoch || !self.catching_up {
            return;
        }
        // The sender's clock covers promises this replica never saw: it
        // must survive a restart here too.
        self.cover(clock);
        if let Some(state) = state.filter(|s| s.applied > self.applied) {
            self.log.push(LogRecord::State { partition: self.partition, state: state.clone() });
            let early: Vec<Update> = std::mem::take(&mut self.early).into_values().collect();
            self.restore(state, now_ms);
            self.forward(early, now_ms, out);
        }
        self.forward(updates, now_ms, out);
        if self.applied >= applied {
            self.caught_up();
            if let Some((from, after)) = self.owed.take() {
                self.catch_up(epoch, from, after, out);
            }
        }
    }
}
