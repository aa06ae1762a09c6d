//! A data node as one state machine: its view of the configuration, its
//! partition replicas, its admission by the coordinator, and its
//! heartbeats. Driven by `step` (a message) and `tick` (time), it puts what
//! it wants sent in an outbox and what it wants made durable in its log
//! (`take_log`), like toyDB's `raft/node.rs`. The TCP node (`causeway-node`)
//! and the simulator (`causeway-sim`) are thin drivers of it.
//!
//! # Admission: a restarted node never serves what it had before
//!
//! Every process start is a new *incarnation* (a random number). A node
//! serves (client requests, chain traffic) only while the configuration it
//! holds admits its own incarnation (`Topology::admitted`). A restarted
//! node therefore starts silent, whatever its saved configuration says:
//! it replays its log, then reports in its heartbeat what it recovered (the
//! update order position of each replica, and whether its log was whole:
//! synced before every acknowledgement, without gaps), and the coordinator
//! decides in a new epoch (`supervisor`): resume in place from the log, or
//! leave the chains and come back through a state transfer. So a restarted
//! head never reuses sequence numbers its successors already hold, and a
//! node restarted without its data never answers as if it had it.
//!
//! # Durability
//!
//! Replicas produce log records in the order they apply updates; the node
//! collects them (`take_log`) in that order and its driver appends them in
//! that order before anything of the same step is sent (with
//! `fsync=always`, after they are synced). Recovery (`recover`) reads them
//! back per partition: the last state record, then the updates after it
//! sorted by sequence number; a gap is reported, and the node then comes
//! back through a state transfer instead of guessing.

use crate::chain::{ChainReplica, Digest, PutRequest};
use crate::geo::{Geo, GeoMsg, Replication};
use crate::hlc::Timestamp;
use crate::message::{send, Dest, Envelope, Item, Keyspace, Message, OpId, Outbox, Refusal, Update};
pub use crate::message::{Beat, Recovered};
use crate::record::LogRecord;
use crate::ring::{NodeId, PartitionId, Topology};
use crate::version::{SiteId, Version, VersionVector};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

mod coalesce;
mod ec;
mod geo;
mod memory;
mod put;
mod tier;

pub use tier::{TierStats, STREAMS_AT_ONCE};

use coalesce::{coalesce, is_chain_traffic};

/// How often a node sends its heartbeat to the coordinator leader (the
/// member its last lease came from), and to every member once it has
/// heard from no leader for two of these.
pub const HEARTBEAT_MS: u64 = 200;
/// How often the members that do not lead get a heartbeat too: enough for
/// their reports (CW.CLUSTER STATUS) and for one taking over, which first
/// waits a failure timeout of fresh heartbeats anyway (`supervisor`).
pub const FOLLOWER_HEARTBEAT_MS: u64 = 1_000;
/// How early by the clock a tick may come for what is due every so often:
/// an idle node's ticks sit on a grid of `HEARTBEAT_MS` (the runtime puts
/// the timers that fire at rest on one grid, to share wakeups), and a
/// timer fires up to a millisecond either side of its instant.
const EARLY_MS: u64 = 5;

/// The time, as the node's driver reads it: the wall clock for hybrid
/// timestamps and expiries, the monotonic clock (which a wall-clock step
/// never moves) for leases.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Now {
    pub wall_ms: u64,
    pub mono_ms: u64,
}

impl Now {
    /// One clock for both (the simulator's virtual time).
    pub fn at(ms: u64) -> Now {
        Now { wall_ms: ms, mono_ms: ms }
    }
}

/// Who a node is.
#[derive(Clone, Debug)]
pub struct Identity {
    pub me: NodeId,
    pub site: SiteId,
    pub addr: String,
    pub incarnation: u64,
    /// The nodes running the coordinator (heartbeats go to each). With
    /// several sites they are also the site's stabilizer replicas.
    pub coordinators: Vec<NodeId>,
    /// Every site of the deployment (this one included); one site, or
    /// none listed, is a single-site deployment.
    pub sites: Vec<SiteId>,
    /// How sites replicate to each other (the same at every site).
    pub replication: Replication,
    /// Identifier-first disaster recovery: which site backs up which.
    pub dr: Option<crate::message::geo::DrPair>,
}

/// What `recover` found in the log.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recovery {
    pub records: usize,
    /// Partitions whose updates stop at a gap: (partition, first missing).
    pub gaps: Vec<(PartitionId, u64)>,
    /// Partitions whose replica was catching up after moving up its chain:
    /// it may lack what its position needs.
    pub behind: Vec<PartitionId>,
    /// Partitions whose values are partly in a disk tier this node was not
    /// given (`enable_tier` before `recover`): the shell must not serve.
    pub need_tier: Vec<PartitionId>,
}

/// The (partition, seq) pairs a reply waits to be durable for (inline:
/// a read has one).
type Needs = smallvec::SmallVec<[(PartitionId, u64); 1]>;

/// A read's answer (`Node::read`): the item, the replica's chain index and
/// stable watermark, and what must be durable first.
struct Read {
    item: Item,
    chain_index: u8,
    stable_through: u64,
    needs: Needs,
}

/// One data node.
#[derive(Debug)]
pub struct Node {
    id: Identity,
    topology: Arc<Topology>,
    /// Whether `topology` admits this incarnation: only then does it serve.
    admitted: bool,
    /// Whether this incarnation's log was synced, and which recovered
    /// replicas are incomplete anyway (see `Recovered`).
    whole: bool,
    incomplete: Vec<PartitionId>,
    parts: Vec<Option<ChainReplica>>,
    /// The replicas this process held when the configuration removed it
    /// (after a pause or a partition): if it is placed in the same chains
    /// again, each asks only for the updates it missed (`ChainReplica::
    /// joining`). Memory only: the log says they were dropped.
    retained: Vec<Option<ChainReplica>>,
    /// State transfers received: (only the missing updates, the whole state).
    transfers: (u64, u64),
    /// Records to make durable before this step's messages leave.
    log: Vec<LogRecord>,
    /// Whether the driver keeps a log (`without_log`).
    logs: bool,
    /// How many times `take_log` handed out records, and how many of those
    /// the driver has synced (`synced`).
    logged: u64,
    synced: u64,
    /// Geo probes to answer once `synced` reaches the position paired with
    /// them (`GeoMsg::Synced`).
    probes: Vec<(u64, (NodeId, u64))>,
    last_beat_ms: Option<u64>,
    /// When heartbeats last went to every coordinator member.
    all_beat_ms: Option<u64>,
    /// The coordinator member the last lease came from, and when it came.
    leader: Option<(NodeId, u64)>,
    /// The coordinator's lease for linearizable reads: the epoch it is for,
    /// and until when (monotonic).
    lease: Option<(u64, u64)>,
    /// With several sites: this node's part in geo-replication.
    geo: Option<Geo>,
    /// Read replies waiting for what they return to be durable
    /// (`ChainReplica::durable`): for each, the (partition, seq) pairs.
    parked: Vec<(Needs, Envelope)>,
    /// Chain traffic of the steps since the last `flush`.
    chain_out: Outbox,
    /// Disaster recovery at the primary: notes of the writes ordered here
    /// since the last `flush`, sent to the backup in one message.
    notes: Vec<crate::message::geo::Note>,
    /// Client writes parked at heads here until what they depend on is in
    /// (`put`), and the partitions touched by the step under way that
    /// such writes wait on.
    waiting: put::Waiting,
    /// The memory budget and eviction (`memory`).
    memory: memory::Memory,
    /// The disk tier, if the node has one (`tier`).
    tier: Option<Box<tier::NodeTier>>,
    touched: Vec<PartitionId>,
    /// An erasure-coded site (`Shape::coding`): this node's members of its
    /// groups (`ec`).
    ec: Option<Box<crate::ec::site::Engine<Message>>>,
    /// Requests of a coded site waiting for its groups or this node's
    /// lease (`ec`).
    ec_waiting: Vec<(u64, Message)>,
}

impl Node {
    /// A node holding `topology`. If it admits this incarnation (a site
    /// being born, as the simulator builds one), the node serves its chains
    /// at once with empty replicas; otherwise it waits for the coordinator.
    pub fn new(id: Identity, topology: Topology) -> Node {
        let partitions = topology.shape.partitions as usize;
        let admitted = topology.admits(id.me, id.incarnation);
        let mut node = Node {
            id,
            topology: Arc::new(topology),
            admitted,
            whole: false,
            incomplete: Vec::new(),
            parts: (0..partitions).map(|_| None).collect(),
            retained: (0..partitions).map(|_| None).collect(),
            transfers: (0, 0),
            log: Vec::new(),
            logs: true,
            logged: 0,
            synced: 0,
            probes: Vec::new(),
            last_beat_ms: None,
            all_beat_ms: None,
            leader: None,
            lease: None,
            geo: None,
            parked: Vec::new(),
            chain_out: Outbox::new(),
            notes: Vec::new(),
            waiting: put::Waiting::default(),
            memory: memory::Memory::default(),
            tier: None,
            touched: Vec::new(),
            ec: None,
            ec_waiting: Vec::new(),
        };
        if let Some(coding) = node.topology.shape.coding {
            let engine = crate::ec::site::Engine::new(node.id.me, node.id.incarnation, coding).expect("a validated shape");
            node.ec = Some(Box::new(engine));
            node.ec_configure(&mut Outbox::new());
        }
        if node.id.sites.len() > 1 {
            let mut geo = Geo::new(node.id.site, &node.id.sites, node.id.me, &node.id.coordinators, partitions as u32, node.id.replication);
            if let Some(pair) = node.id.dr {
                geo.set_dr(pair, node.id.incarnation);
            }
            geo.configure(&node.topology, 0);
            node.geo = Some(geo);
        }
        if admitted {
            let topology = node.topology.clone();
            for p in 0..topology.shape.partitions {
                node.parts[p as usize] = ChainReplica::born(&topology, p, node.id.me, node.id.site);
                node.log.extend(node.parts[p as usize].as_mut().map(|r| r.take_log()).unwrap_or_default());
            }
            node.geo_replicas(&mut Outbox::new());
            node.dr_admitted(0, &mut Outbox::new());
        }
        node
    }

    pub fn me(&self) -> NodeId {
        self.id.me
    }

    pub fn incarnation(&self) -> u64 {
        self.id.incarnation
    }

    /// The configuration this node holds.
    pub fn topology(&self) -> &Arc<Topology> {
        &self.topology
    }

    /// Whether the configuration admits this incarnation (it serves).
    pub fn is_admitted(&self) -> bool {
        self.admitted
    }

    /// Rebuilds the replicas from log records read back at start (before
    /// any `step`). `synced` says whether every record was synced before
    /// what followed it was sent (`fsync=always`).
    pub fn recover(&mut self, records: impl IntoIterator<Item = LogRecord>, synced: bool, now_ms: u64) -> Recovery {
        let mut report = Recovery::default();
        // Per partition: the last state, and the updates logged after it.
        let mut segments: BTreeMap<PartitionId, (Option<crate::chain::PartitionState>, Vec<Update>)> = BTreeMap::new();
        let mut on_disk: BTreeMap<PartitionId, Vec<crate::record::OnDiskEntry>> = BTreeMap::new();
        let mut behind: BTreeSet<PartitionId> = BTreeSet::new();
        let mut ceilings: BTreeMap<PartitionId, Timestamp> = BTreeMap::new();
        let mut notes_whole = false;
        for record in records {
            report.records += 1;
            match record {
                LogRecord::State { partition, state } => {
                    segments.insert(partition, (Some(state), Vec::new()));
                    on_disk.remove(&partition);
                    behind.remove(&partition);
                }
                LogRecord::OnDisk { partition, entries } => on_disk.entry(partition).or_default().extend(entries),
                LogRecord::Updates { partition, updates } => segments.entry(partition).or_default().1.extend(updates),
                LogRecord::Dropped { partition } => {
                    segments.remove(&partition);
                    on_disk.remove(&partition);
                    behind.remove(&partition);
                }
                LogRecord::Behind { partition, behind: true } => {
                    behind.insert(partition);
                }
                LogRecord::Behind { partition, behind: false } => {
                    behind.remove(&partition);
                }
                LogRecord::Clock { partition, ceiling } => {
                    let c = ceilings.entry(partition).or_insert(ceiling);
                    *c = (*c).max(ceiling);
                }
                LogRecord::Lost { keys } => {
                    if let Some(d) = self.geo.as_mut().and_then(Geo::dr_mut) {
                        d.restore(keys);
                    }
                }
                LogRecord::Noted { notes } => {
                    if let Some(d) = self.geo.as_mut().and_then(Geo::dr_mut) {
                        d.restore_notes(notes);
                    }
                }
                LogRecord::NotesWhole => notes_whole = true,
                LogRecord::FailingOver => {
                    if let Some(d) = self.geo.as_mut().and_then(Geo::dr_mut) {
                        d.restore_frozen();
                    }
                }
            }
        }
        if report.records > 0 {
            if let Some(d) = self.geo.as_mut().and_then(Geo::dr_mut) {
                // Unsynced, the log may lack notes this process answered for.
                d.recovered(notes_whole && synced);
            }
        }
        report.behind = behind.into_iter().filter(|p| segments.get(p).is_some_and(|(s, _)| s.is_some())).collect();
        for (p, (state, updates)) in segments {
            // Every replica's log starts with a state record (an empty one at
            // the site's birth); updates without one are from a replica that
            // never finished joining, and are worth nothing.
            let Some(state) = state else { continue };
            // Its place in the chain comes with the admission (the
            // configuration held now may be older than the log).
            let mut r = ChainReplica::detached(p, self.id.me, self.id.site, self.topology.shape.k);
            if self.geo.is_some() {
                // Before the replay: what is not reported stays in `recent`.
                r.enable_geo();
            }
            r.restore(state, now_ms);
            if let Some(entries) = on_disk.remove(&p).filter(|e| !e.is_empty()) {
                match self.tier.as_deref() {
                    Some(t) => {
                        r.enable_tier(p, t.policy(), t.tier());
                        r.restore_on_disk(entries, now_ms);
                    }
                    // Values in a tier this process does not have.
                    None => report.need_tier.push(p),
                }
            }
            if let Some(&ceiling) = ceilings.get(&p) {
                r.observe_ceiling(ceiling);
            }
            if let Some(missing) = r.replay(updates, now_ms) {
                report.gaps.push((p, missing));
            }
            r.recovered_on_disk();
            if !self.logs {
                r.without_log();
            }
            self.parts[p as usize] = Some(r);
        }
        self.whole = synced;
        self.incomplete = report.gaps.iter().map(|&(p, _)| p).chain(report.behind.iter().copied()).collect();
        if self.topology.node(self.id.me).is_none() {
            // The configuration this node holds removed it from every chain
            // (it adopted it, then crashed before the log said `Dropped`:
            // fsync=everysec): what it recovered is what it held when it
            // left, as `install` keeps it. It comes back through a state
            // transfer that asks only for what came after (`ChainReplica::
            // joining`), never in place: its chains declared stable what it
            // never got, and would send it nothing more.
            for p in 0..self.parts.len() {
                if let Some(replica) = self.drop_replica(p as PartitionId) {
                    self.retained[p] = Some(replica);
                }
            }
            self.whole = false;
        }
        self.geo_replicas(&mut Outbox::new());
        report
    }

    /// Handles one message addressed to this node. What it sends down and
    /// up its chains (`Forward`, `StableUpTo`) waits for `flush`, which the
    /// driver calls once it has stepped every message at hand: all of a
    /// burst's traffic for one neighbour and partition leaves as one
    /// message.
    pub fn step(&mut self, msg: Message, now: Now, out: &mut Outbox) {
        let at = out.len();
        self.handle(msg, now, out);
        self.wake_touched(now.wall_ms, out);
        self.defer_chain_traffic(out, at);
    }

    /// Orders the parked writes that the step's changes let go (`put`).
    fn wake_touched(&mut self, now_ms: u64, out: &mut Outbox) {
        // In rounds, each partition once per round, in order. Ordering a
        // write touches its partition in turn: the next round is what the
        // last one appended (the list keeps its capacity, where taking it
        // allocated another for every round of a pipeline's wakeups).
        let mut from = 0;
        while from < self.touched.len() {
            let to = self.touched.len();
            self.touched[from..to].sort_unstable();
            for i in from..to {
                let p = self.touched[i];
                if i == from || self.touched[i - 1] != p {
                    self.wake_puts(p, now_ms, out);
                }
            }
            from = to;
        }
        self.touched.clear();
    }

    /// Sends what the steps since the last flush hold back: chain traffic,
    /// coalesced (`coalesce`), and what this node's tails have for the
    /// stabilizer and other sites (`Geo::flush`).
    pub fn flush(&mut self, now_ms: u64, out: &mut Outbox) {
        coalesce(std::mem::take(&mut self.chain_out), out);
        self.flush_notes(out);
        self.flush_geo(now_ms, out);
    }

    /// Moves the chain traffic in `out[at..]` to `chain_out`.
    fn defer_chain_traffic(&mut self, out: &mut Outbox, at: usize) {
        self.chain_out.extend(out.extract_if(at.., |e| is_chain_traffic(&e.msg)));
    }

    fn handle(&mut self, msg: Message, now: Now, out: &mut Outbox) {
        let now_ms = now.wall_ms;
        if let Message::Reconfigure { topology } = msg {
            return self.install(*topology, now_ms, out);
        }
        if let Message::GetTopology { op } = msg {
            let topology = (*self.topology).clone();
            return send(out, Dest::Client(op.client), Message::TopologyIs { op, topology: Box::new(topology) });
        }
        let Some(msg) = self.ec_step(msg, now, out) else { return };
        if !self.admitted {
            // Not serving yet: requests go elsewhere (or wait), chain
            // traffic is resent once this node serves.
            if let Some(op) = msg.op().filter(|_| !msg.is_reply()) {
                self.not_responsible(op, out);
            }
            return;
        }
        if let Some(key) = self.cold(&msg) {
            // A value on disk: read back first (`tier`).
            return self.wait_for_disk(key, msg);
        }
        let stale = |epoch: u64| epoch != self.topology.epoch;
        match msg {
            Message::Put(put) => {
                let crate::message::Put { op, epoch, partition, key, change, past, ack_at, write, deps, done_below } = *put;
                if stale(epoch) || self.dr_asking() {
                    return self.not_responsible(op, out);
                }
                let req = PutRequest { op, key, change, past, ack_at, write, done_below };
                self.client_put(partition, req, deps, now_ms, out);
            }
            Message::Get { op, epoch, partition, key, min, leased } => {
                if leased && !self.has_lease(now.mono_ms) {
                    return send(out, Dest::Client(op.client), Message::Refused { op, reason: Refusal::NoLease });
                }
                match self.read(epoch, partition, &key, min.as_deref(), now_ms) {
                    Err(reason) => send(out, Dest::Client(op.client), Message::Refused { op, reason }),
                    Ok(Read { item, chain_index, stable_through, needs }) => {
                        let reply = Envelope {
                            to: Dest::Client(op.client),
                            msg: Message::Value { op, item: Box::new(item), chain_index, stable_through },
                        };
                        self.when_durable(needs, reply, out);
                    }
                }
            }
            Message::WaitStable { op, epoch, partition, seq } => {
                if stale(epoch) || self.with(partition, |r| r.wait_stable(op, seq, out)).is_none() {
                    self.not_responsible(op, out);
                }
            }
            Message::SnapshotRead { op, epoch, at, remote, keys } => {
                if stale(epoch) || self.dr_asking() {
                    return self.not_responsible(op, out);
                }
                let mut items = Vec::with_capacity(keys.len());
                let mut needs = Needs::with_capacity(keys.len());
                for (partition, key) in keys {
                    if self.parts.get(partition as usize).is_some_and(Option::is_some) && self.refuse_lost(op, partition, &key, out) {
                        return;
                    }
                    match self.with(partition, |r| r.snapshot_read(&key, at, &remote, now_ms)) {
                        Some(Ok(item)) => {
                            needs.push((partition, item.seq));
                            items.push(item);
                        }
                        Some(Err(reason)) => return send(out, Dest::Client(op.client), Message::Refused { op, reason }),
                        None => return self.not_responsible(op, out),
                    }
                }
                let site_time = self.geo.as_ref().map(|g| g.site_time().clone()).unwrap_or_default();
                let reply = Envelope { to: Dest::Client(op.client), msg: Message::Snapshot { op, items, site_time } };
                self.when_durable(needs, reply, out);
            }
            Message::KeyMemory { op, epoch, partition, key } => {
                if stale(epoch) {
                    return self.not_responsible(op, out);
                }
                match self.with(partition, |r| r.key_memory(&key, now_ms)) {
                    Some(bytes) => send(out, Dest::Client(op.client), Message::KeyMemoryIs { op, bytes: bytes.map(|b| b as u64) }),
                    None => self.not_responsible(op, out),
                }
            }
            Message::Count { op, epoch, partitions } => {
                if stale(epoch) {
                    return self.not_responsible(op, out);
                }
                let mut keyspace = Keyspace::default();
                for p in partitions {
                    match self.with(p, |r| r.keyspace(now_ms)) {
                        Some(k) => keyspace += k,
                        None => return self.not_responsible(op, out),
                    }
                }
                send(out, Dest::Client(op.client), Message::Counted { op, keyspace });
            }
            Message::ListKeys { op, epoch, partitions, pattern, one } => {
                if stale(epoch) {
                    return self.not_responsible(op, out);
                }
                let mut keys = Vec::new();
                for p in partitions {
                    if self.with(p, |r| r.keys(pattern.as_deref(), one, now_ms, &mut keys)).is_none() {
                        return self.not_responsible(op, out);
                    }
                }
                send(out, Dest::Client(op.client), listed(op, keys));
            }
            Message::Flush { op } => {
                for r in self.parts.iter_mut().flatten() {
                    r.flush_all();
                }
                send(out, Dest::Client(op.client), Message::Flushed { op });
            }
            Message::Forward { epoch, partition, updates, .. } => {
                if !stale(epoch) {
                    self.with(partition, |r| r.forward(updates, now_ms, out));
                }
            }
            Message::CatchUp { epoch, partition, from, after } => {
                self.with(partition, |r| r.catch_up(epoch, from, after, out));
            }
            Message::Suffix { epoch, partition, updates, applied, state, clock } => {
                self.with(partition, |r| r.suffix(epoch, updates, applied, state.map(|s| *s), clock, now_ms, out));
            }
            Message::Fetch { epoch, partition, from, have } => {
                self.with(partition, |r| r.fetch(epoch, from, have, out));
                self.stream_to(partition, from, now_ms);
            }
            Message::FetchValues { partition, from, ids, done } => self.fetch_values(partition, from, ids, done, now_ms, out),
            Message::Values { partition, values } => {
                if let Some(t) = self.tier.as_deref_mut() {
                    t.stats.streamed_in += values.len() as u64;
                }
                self.with(partition, |r| r.values(values, now_ms, out));
                self.grant_streams(now_ms, out);
            }
            Message::Transfer { epoch, partition, state, updates, history_before, clock, on_disk } => {
                // A state with nothing applied yet (a new site's chains
                // forming) is no catching up: not counted.
                let whole = state.as_ref().map(|s| s.applied > 0);
                if self.with(partition, |r| r.transfer(epoch, state.map(|s| *s), updates, history_before, clock, on_disk, now_ms, out))
                    == Some(true)
                {
                    match whole {
                        Some(true) => self.transfers.1 += 1,
                        Some(false) => {}
                        None => self.transfers.0 += 1,
                    }
                }
                self.grant_streams(now_ms, out);
            }
            Message::StableUpTo { epoch, partition, seq, reported, durable } => {
                if !stale(epoch) {
                    self.with(partition, |r| r.stable_up_to(seq, reported, durable, now_ms, out));
                    self.wake_parked(out);
                }
            }
            Message::Geo(msg) => self.geo_step(*msg, now_ms, out),
            Message::Lease { epoch, sent_ms, grant_ms, from } => {
                self.leader = Some((from, now.mono_ms));
                if epoch == self.topology.epoch {
                    let until = sent_ms + grant_ms;
                    self.lease = Some((epoch, self.lease.filter(|l| l.0 == epoch).map_or(until, |l| l.1.max(until))));
                }
            }
            // Heartbeats are for the coordinator, which the node's driver
            // runs; configurations and topology requests were handled above.
            Message::Failover { op, force } => {
                let topology = self.topology.clone();
                if let Some(geo) = &mut self.geo {
                    geo.failover(op, force, &topology, now_ms, out);
                }
            }
            Message::GetSiteTime { op } => {
                let site_time = self.geo.as_ref().map_or_else(VersionVector::default, |g| g.site_time().clone());
                send(out, Dest::Client(op.client), Message::SiteTimeIs { op, site: self.id.site, site_time });
            }
            Message::Heartbeat(_) | Message::Reconfigure { .. } | Message::GetTopology { .. } => {}
            // Handled before (`ec_step`); without groups, nothing to do.
            Message::Ec { .. } | Message::EcHello { .. } => {}
            // Replies are for clients, never for nodes.
            Message::PutDone { .. }
            | Message::Value { .. }
            | Message::Stable { .. }
            | Message::Noted { .. }
            | Message::FailedOver { .. }
            | Message::Snapshot { .. }
            | Message::Counted { .. }
            | Message::KeysAre { .. }
            | Message::KeyMemoryIs { .. }
            | Message::Flushed { .. }
            | Message::TopologyIs { .. }
            | Message::SiteTimeIs { .. }
            | Message::Refused { .. } => {}
        }
    }

    /// A client write at the head of `partition`, to order now.
    fn put(&mut self, partition: PartitionId, mut req: PutRequest, now_ms: u64, out: &mut Outbox) {
        let op = req.op;
        let write = OpId { client: op.client, seq: req.write };
        let value_len = req.change.payload_len();
        if let Some(missing) = self.lost_write(partition, &req.key) {
            // After a failover, over a write of the primary that never
            // arrived: a change that depends on what the key holds cannot
            // be decided; one that does not replaces it, so it must win.
            if !req.change.is_blind() {
                let reason = Refusal::Lost { key: req.key, missing };
                return send(out, Dest::Client(op.client), Message::Refused { op, reason });
            }
            // A DEL writes its tombstone even where no older value is
            // here (it would be a no-op otherwise, and the key stay
            // refused): the key had a value at the primary.
            if req.change.value == crate::message::NewValue::Delete {
                req.change.condition = crate::message::Condition::Always;
            }
            self.with(partition, |r| r.observe(missing.ts));
        }
        if self.with(partition, |r| r.put(req, now_ms, out)).is_none() {
            return self.not_responsible(op, out);
        }
        self.note_write(partition, write, value_len);
    }

    /// After a failover: refuses a read of a key whose replica here is
    /// older than the primary's last noted write of it. The head and the
    /// tail know (`Lost`); a replica between them may only be behind.
    fn refuse_lost(&self, op: OpId, partition: PartitionId, key: &[u8], out: &mut Outbox) -> bool {
        let Some(reason) = self.lost_refusal(partition, key) else { return false };
        send(out, Dest::Client(op.client), Message::Refused { op, reason });
        true
    }

    /// After a failover of this backup site, the refusal of a read of a key
    /// whose last write never arrived (`geo::dr`).
    fn lost_refusal(&self, partition: PartitionId, key: &[u8]) -> Option<Refusal> {
        let missing = self.lost_write(partition, key)?;
        let ends = self.parts[partition as usize].as_ref().is_some_and(|r| r.is_head() || r.next().is_none());
        Some(if ends { Refusal::Lost { key: bytes::Bytes::copy_from_slice(key), missing } } else { Refusal::Behind })
    }

    /// A client's read of `key` (`Message::Get`, or `read_now`): this
    /// replica's latest version and what must be durable before it is
    /// answered.
    fn read(&mut self, epoch: u64, partition: PartitionId, key: &[u8], min: Option<&Version>, now_ms: u64) -> Result<Read, Refusal> {
        let not_responsible = Refusal::NotResponsible { epoch: self.topology.epoch };
        if epoch != self.topology.epoch || self.dr_asking() {
            return Err(not_responsible);
        }
        if let Some(reason) = self.lost_refusal(partition, key) {
            return Err(reason);
        }
        let (item, chain_index, stable_through) =
            self.with(partition, |r| r.get(key, min, now_ms).map(|(item, at)| (item, at, r.stable()))).ok_or(not_responsible)??;
        // A version the session already depends on needs no wait: it
        // cannot be lost to this reader.
        let vouched = min.is_some_and(|m| item.version.as_ref() == Some(m));
        let needs = if vouched { Needs::new() } else { smallvec::smallvec![(partition, item.seq)] };
        Ok(Read { item, chain_index, stable_through, needs })
    }

    /// A client's read answered in place of a `Message::Get` (the client's
    /// session runs on this node, and nothing else of it is in flight): the
    /// `Value` that message would get at once, or `None` when it would get
    /// anything else (a refusal, a wait for the disk, for durability or for
    /// a coded site's groups) and the client sends the message instead.
    pub fn read_now(
        &mut self,
        epoch: u64,
        partition: PartitionId,
        key: &[u8],
        min: Option<&Version>,
        now_ms: u64,
    ) -> Option<(Item, u8, u64)> {
        if self.ec.is_some() || !self.admitted || self.tier.is_some() {
            return None;
        }
        let Read { item, chain_index, stable_through, needs } = self.read(epoch, partition, key, min, now_ms).ok()?;
        self.durable(&needs).then_some((item, chain_index, stable_through))
    }

    /// Periodic work: retransmissions, and the heartbeat when it is due.
    pub fn tick(&mut self, now: Now, out: &mut Outbox) {
        let now_ms = now.wall_ms;
        let at = out.len();
        if self.admitted {
            let floor = self.remote_floor();
            // A backup process that has not heard yet whether its site
            // failed over keeps every tombstone (one may be a lost key's).
            let asking = self.dr_asking();
            for p in 0..self.parts.len() {
                let dr = self.geo.as_ref().and_then(Geo::dr).filter(|d| d.failed_over());
                let keep = |key: &[u8]| asking || dr.is_some_and(|d| d.lost(key).is_some());
                let Some(r) = self.parts[p].as_mut() else { continue };
                r.tick(now_ms, floor, &keep, out);
                self.stepped(p as PartitionId);
            }
            self.tier_replicas();
            self.grant_streams(now_ms, out);
            self.release_streamed(now_ms);
            self.evict(now_ms, out);
            self.wake_touched(now_ms, out);
            self.expire_puts(now_ms);
            self.geo_tick(now_ms, out);
        }
        self.ec_tick(now, out);
        self.defer_chain_traffic(out, at);
        self.flush(now_ms, out);
        let due = |last: Option<u64>, every: u64| last.is_none_or(|at| now.mono_ms.saturating_sub(at) + EARLY_MS >= every);
        if due(self.last_beat_ms, HEARTBEAT_MS) {
            self.last_beat_ms = Some(now.mono_ms);
            let beat = self.beat(now.mono_ms);
            let leader = self.leader.filter(|&(_, at)| now.mono_ms.saturating_sub(at) < 2 * HEARTBEAT_MS).map(|(l, _)| l);
            let everyone = leader.is_none() || due(self.all_beat_ms, FOLLOWER_HEARTBEAT_MS);
            if everyone {
                self.all_beat_ms = Some(now.mono_ms);
            }
            for &c in self.id.coordinators.iter().filter(|&&c| everyone || Some(c) == leader) {
                send(out, Dest::Node(c), Message::Heartbeat(Box::new(beat.clone())));
            }
        }
    }

    /// Whether nothing here waits on time but the heartbeat: no replica
    /// with anything to resend or ask for, no write or read parked, and,
    /// with several sites, nothing of geo-replication in flight
    /// (`Geo::idle`). The driver may then tick only every `HEARTBEAT_MS`,
    /// as long as a step does not make it busy again.
    pub fn idle(&self) -> bool {
        self.geo.as_ref().is_none_or(Geo::idle)
            && self.ec.as_ref().is_none_or(|e| e.idle())
            && self.ec_waiting.is_empty()
            && !self.evicting()
            && self.parked.is_empty()
            && self.waiting.is_empty()
            && self.parts.iter().flatten().all(ChainReplica::idle)
    }

    /// Whether this node holds the coordinator's lease for the epoch it
    /// serves (linearizable reads need it).
    pub fn has_lease(&self, mono_ms: u64) -> bool {
        self.admitted && self.lease.is_some_and(|(epoch, until)| epoch == self.topology.epoch && mono_ms < until)
    }

    /// This node's heartbeat, sent at `mono_ms`.
    pub fn beat(&self, mono_ms: u64) -> Beat {
        let recovered = (!self.admitted).then(|| Recovered { whole: self.whole, incomplete: self.incomplete.clone() });
        let applied =
            self.parts.iter().enumerate().filter_map(|(p, r)| Some((p as PartitionId, r.as_ref().filter(|r| !r.is_joining())?.applied())));
        Beat {
            from: self.id.me,
            addr: self.id.addr.clone(),
            incarnation: self.id.incarnation,
            epoch: self.topology.epoch,
            sent_ms: mono_ms,
            joining: self.joining(),
            catching_up: self.catching_up(),
            applied: applied.collect(),
            recovered,
        }
    }

    /// The driver keeps no log (no disk): replicas stop recording the
    /// updates they apply, which nobody would read, and count them as on
    /// disk at once. Records of other kinds still come out of `take_log`;
    /// the driver says they are synced by calling `synced` after every step.
    pub fn without_log(&mut self) {
        self.logs = false;
        for r in self.parts.iter_mut().chain(self.retained.iter_mut()).flatten() {
            r.without_log();
        }
    }

    /// The log records produced since the last call, in order: the driver
    /// makes them durable before it sends what the same step produced.
    ///
    /// Non-empty results are numbered 1, 2, ... (`logged`): the driver says
    /// how far they are synced with `synced`.
    pub fn take_log(&mut self) -> Vec<LogRecord> {
        if !self.log.is_empty() {
            self.logged += 1;
        }
        std::mem::take(&mut self.log)
    }

    /// How many non-empty `take_log` results this node handed out.
    pub fn logged(&self) -> u64 {
        self.logged
    }

    /// The driver synced the first `through` non-empty `take_log` results
    /// to disk (a driver without a disk, or one that never syncs, says so
    /// at once: a crash of its machine loses what its page cache held, and
    /// geo-replication cannot promise more than the disk does).
    pub fn synced(&mut self, through: u64, now_ms: u64, out: &mut Outbox) {
        self.synced = self.synced.max(through);
        if self.geo.is_some() {
            // Without a log, replicas count what they apply as on disk at
            // once: none has more to report now.
            let logged = if self.logs { self.parts.len() as PartitionId } else { 0 };
            for p in 0..logged {
                // Only a replica with more on disk has more to report.
                if self.parts[p as usize].as_mut().is_some_and(|r| r.synced(self.synced)) {
                    self.geo_tail(p, out);
                    // A promise at the tail may have waited for the disk
                    // (tails pass promises to their reporter only).
                    if self.parts[p as usize].as_ref().is_some_and(ChainReplica::reports) {
                        self.pass_promise(p, None, &mut BTreeMap::new());
                    }
                }
            }
            // What this produced leaves now only if it logged nothing: a
            // promise must not leave before the clock ceiling it logged is
            // on disk (the driver syncs it with the next step's records,
            // before that step's output, and the flush goes then).
            if self.log.is_empty() {
                self.flush_geo(now_ms, out);
            }
        }
        self.answer_probes(now_ms, out);
    }

    /// Pairs new geo probes with what is logged now, and answers those
    /// whose records are synced.
    fn answer_probes(&mut self, now_ms: u64, out: &mut Outbox) {
        let Some(geo) = &mut self.geo else { return };
        let logged = ticket(self.logged, &self.log);
        self.probes.extend(geo.take_probes().into_iter().map(|p| (logged, p)));
        let synced = self.synced;
        let mut due: BTreeMap<NodeId, u64> = BTreeMap::new();
        self.probes.retain(|&(at, (leader, probe))| {
            if at > synced {
                return true;
            }
            let p = due.entry(leader).or_default();
            *p = (*p).max(probe);
            false
        });
        let topology = self.topology.clone();
        for (leader, probe) in due {
            let msg = GeoMsg::Synced { from: self.id.me, probe: (leader, probe) };
            match leader == self.id.me {
                true => geo.step(msg, false, &topology, now_ms, out),
                false => send(out, Dest::Node(leader), Message::geo(msg)),
            }
        }
    }

    /// With several sites, what this site has applied of every other one
    /// (the least of them): tombstones older than it may be collected
    /// (`chain::expiry`). `None` with one site.
    fn remote_floor(&self) -> Option<Timestamp> {
        let geo = self.geo.as_ref()?;
        let me = self.id.site;
        Some(self.id.sites.iter().filter(|&&s| s != me).map(|&s| geo.site_time().get(s)).min().unwrap_or(Timestamp::ZERO))
    }

    /// Tombstones the replicas here hold, not collected yet.
    pub fn tombstones(&self) -> usize {
        self.parts.iter().flatten().map(|r| r.tombstones()).sum()
    }

    /// Keys the heads (or the erasure-coded members) here expired (INFO
    /// `expired_keys`).
    pub fn expired_keys(&self) -> u64 {
        self.parts.iter().flatten().map(|r| r.expired_keys()).sum::<u64>() + self.ec.as_ref().map_or(0, |e| e.memory().expired)
    }

    /// Bytes the replicas' stores take (INFO `used_memory_dataset`).
    pub fn store_memory(&self) -> usize {
        self.parts.iter().flatten().map(|r| r.store_memory()).sum()
    }

    /// Every replica as log records (compaction).
    pub fn checkpoint(&self) -> Vec<LogRecord> {
        let dr = self.geo.as_ref().and_then(Geo::dr).map(|d| d.checkpoint()).unwrap_or_default();
        self.parts.iter().flatten().flat_map(|r| r.checkpoint()).chain(dr).collect()
    }

    /// Replicas still waiting for a state transfer.
    pub fn joining_replicas(&self) -> usize {
        self.joining().len()
    }

    /// State transfers this node received: (suffixes: only the updates a
    /// returning replica missed, whole states).
    pub fn transfers(&self) -> (u64, u64) {
        self.transfers
    }

    /// Replicas catching up from their successor after moving up a chain.
    pub fn catching_up_replicas(&self) -> usize {
        self.catching_up().len()
    }

    fn catching_up(&self) -> Vec<PartitionId> {
        self.partitions_where(ChainReplica::is_catching_up)
    }

    /// The partitions whose replica here `holds`.
    fn partitions_where(&self, holds: impl Fn(&ChainReplica) -> bool) -> Vec<PartitionId> {
        (0..self.parts.len() as PartitionId).filter(|&p| self.parts[p as usize].as_ref().is_some_and(&holds)).collect()
    }

    /// The partitions whose replica here is still fetching its state.
    fn joining(&self) -> Vec<PartitionId> {
        self.partitions_where(ChainReplica::is_joining)
    }

    /// This node's replica of `partition` in brief, if it has one.
    pub fn digest(&self, partition: PartitionId) -> Option<Digest> {
        self.parts.get(partition as usize)?.as_ref().map(|r| r.digest())
    }

    /// Runs `f` on this node's replica of `partition` and collects the log
    /// records it produced.
    fn with<R>(&mut self, partition: PartitionId, f: impl FnOnce(&mut ChainReplica) -> R) -> Option<R> {
        let result = f(self.parts.get_mut(partition as usize)?.as_mut()?);
        self.stepped(partition);
        Some(result)
    }

    /// After `partition`'s replica ran: its log records, what its tail has
    /// for other sites, and the parked writes it may let go.
    fn stepped(&mut self, partition: PartitionId) {
        if let Some(r) = self.parts.get_mut(partition as usize).and_then(Option::as_mut) {
            self.log.extend(r.take_log());
        }
        self.geo_feed(partition);
        if self.waiting.on(partition) {
            self.touched.push(partition);
        }
    }

    fn not_responsible(&self, op: OpId, out: &mut Outbox) {
        send(out, Dest::Client(op.client), Message::Refused { op, reason: Refusal::NotResponsible { epoch: self.topology.epoch } });
    }

    /// Moves to configuration `new` (from the coordinator) if it is newer.
    /// Not listed in it: the node is out of every chain and drops its
    /// replicas (it comes back, if ever, through a state transfer). Listed
    /// but not admitted (this incarnation is not the one the coordinator
    /// knows): it keeps its recovered replicas untouched and waits.
    /// Admitted: every replica learns its new chain, replicas of chains the
    /// node left are dropped, and replicas of chains it joined start by
    /// fetching the partition's state.
    fn install(&mut self, new: Topology, now_ms: u64, out: &mut Outbox) {
        if new.epoch <= self.topology.epoch {
            return;
        }
        let me = self.id.me;
        let was_admitted = std::mem::replace(&mut self.admitted, new.admits(me, self.id.incarnation));
        self.topology = Arc::new(new);
        if self.admitted && !was_admitted {
            self.dr_admitted(now_ms, out);
        }
        if self.topology.node(me).is_none() {
            for p in 0..self.parts.len() {
                if let Some(replica) = self.drop_replica(p as PartitionId) {
                    self.retained[p] = Some(replica);
                }
            }
            self.whole = false;
        } else if self.admitted {
            self.place_replicas(now_ms, out);
        }
        if let Some(geo) = &mut self.geo {
            geo.configure(&self.topology, now_ms);
        }
        self.geo_replicas(out);
        self.wake_parked(out);
        self.refuse_parked_puts(out);
        self.ec_configure(out);
    }

    /// Sends `reply` once every (partition, seq) in `needs` is durable here
    /// (`ChainReplica::durable`): at once, nearly always.
    fn when_durable(&mut self, needs: Needs, reply: Envelope, out: &mut Outbox) {
        match self.durable(&needs) {
            true => out.push(reply),
            false => self.parked.push((needs, reply)),
        }
    }

    /// Whether every update `needs` names is durable here.
    fn durable(&self, needs: &Needs) -> bool {
        needs.iter().all(|&(p, seq)| self.parts.get(p as usize).and_then(Option::as_ref).is_some_and(|r| r.durable() >= seq))
    }

    /// Sends the parked replies that are due, and refuses those whose
    /// replica left this node (the client asks again elsewhere).
    fn wake_parked(&mut self, out: &mut Outbox) {
        for (mut needs, reply) in std::mem::take(&mut self.parked) {
            let mut gone = false;
            needs.retain(|&mut (p, seq)| match self.parts.get(p as usize).and_then(Option::as_ref) {
                Some(r) => r.durable() < seq,
                None => {
                    gone = true;
                    false
                }
            });
            if gone {
                if let Some(op) = reply.msg.op() {
                    let reason = Refusal::NotResponsible { epoch: self.topology.epoch };
                    out.push(Envelope { to: reply.to, msg: Message::Refused { op, reason } });
                }
            } else if needs.is_empty() {
                out.push(reply);
            } else {
                self.parked.push((needs, reply));
            }
        }
    }

    /// Drops this node's replica of `partition`, in the log too.
    fn drop_replica(&mut self, partition: PartitionId) -> Option<ChainReplica> {
        let replica = self.parts[partition as usize].take();
        if replica.is_some() {
            self.log.push(LogRecord::Dropped { partition });
        }
        replica
    }

    /// Puts every replica where the configuration says (see `install`).
    fn place_replicas(&mut self, now_ms: u64, out: &mut Outbox) {
        let (me, site) = (self.id.me, self.id.site);
        let topology = self.topology.clone();
        for p in 0..topology.shape.partitions {
            let slot = &mut self.parts[p as usize];
            match slot {
                Some(r) => {
                    if !r.reconfigure(&topology, me, now_ms, out) {
                        let _ = self.drop_replica(p);
                        continue;
                    }
                }
                None => *slot = ChainReplica::joining(&topology, p, me, site, self.retained[p as usize].take(), now_ms, out),
            }
            if let Some(r) = &mut self.parts[p as usize] {
                if !self.logs {
                    r.without_log();
                }
                self.log.extend(r.take_log());
            }
        }
        self.retained.iter_mut().for_each(|r| *r = None);
    }
}

/// The `take_log` number of everything logged so far: the next one if
/// records wait in `log`, else the last one handed out.
fn ticket(logged: u64, log: &[LogRecord]) -> u64 {
    logged + u64::from(!log.is_empty())
}

/// At most this many bytes of keys in one answer to `ListKeys` (one
/// partition's): an answer travels in one message.
const LIST_BYTES: usize = 64 << 20;

/// The answer to `ListKeys`: the keys, or a refusal past `LIST_BYTES`.
fn listed(op: OpId, keys: Vec<bytes::Bytes>) -> Message {
    let bytes: usize = keys.iter().map(|k| k.len() + 8).sum();
    if bytes > LIST_BYTES {
        let why = format!("a partition holds more than {} MiB of matching keys: too many to list at once", LIST_BYTES >> 20);
        return Message::Refused { op, reason: Refusal::Unsupported(why) };
    }
    Message::KeysAre { op, keys }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chain::Policy;
    use crate::geo::Replication;
    use crate::message::Change;
    use crate::ring::{NodeInfo, Shape};
    use bytes::Bytes;

    fn heartbeats(node: &mut Node, at_ms: u64) -> usize {
        let mut out = Outbox::new();
        node.tick(Now::at(at_ms), &mut out);
        out.iter().filter(|e| matches!(e.msg, Message::Heartbeat(_))).count()
    }

    /// An idle node ticks on a grid of `HEARTBEAT_MS`, and a timer may fire
    /// a little early by the clock: the heartbeat still goes at every tick.
    #[test]
    fn a_tick_a_little_early_still_heartbeats() {
        let topology =
            Topology::new(1, Shape { partitions: 4, replicas: 1, k: 1, coding: None }, vec![NodeInfo { id: 0, addr: "n0".into() }])
                .expect("valid");
        let id = Identity {
            me: 0,
            site: 0,
            addr: "n0".into(),
            incarnation: 1,
            coordinators: vec![0],
            sites: vec![0],
            replication: Replication::Causal,
            dr: None,
        };
        let mut node = Node::new(id, topology);
        node.without_log();
        assert_eq!(heartbeats(&mut node, 1_000), 1);
        assert_eq!(heartbeats(&mut node, 1_100), 0, "not due");
        assert_eq!(heartbeats(&mut node, 1_199), 1, "a tick 1 ms early by the clock");
        assert_eq!(heartbeats(&mut node, 1_398), 1);
    }

    /// A one-node site (R=1) of 4 partitions, serving.
    fn lone_node() -> Node {
        let mut topology =
            Topology::new(1, Shape { partitions: 4, replicas: 1, k: 1, coding: None }, vec![NodeInfo { id: 0, addr: "n0".into() }])
                .expect("valid");
        topology.admitted.insert(0, 1);
        let id = Identity {
            me: 0,
            site: 0,
            addr: "n0".into(),
            incarnation: 1,
            coordinators: vec![0],
            sites: vec![0],
            replication: Replication::Causal,
            dr: None,
        };
        let mut node = Node::new(id, topology);
        node.without_log();
        node
    }

    /// Client `seq`'s write of `key`: a 1 000-byte value, or a delete.
    fn write(node: &mut Node, seq: u64, key: &str, value: bool, now_ms: u64) -> Message {
        try_write(node, seq, key, value, now_ms).expect("answered")
    }

    /// `write`, if answered at once.
    fn try_write(node: &mut Node, seq: u64, key: &str, value: bool, now_ms: u64) -> Option<Message> {
        let key = Bytes::from(key.to_string());
        let change = if value { Change::set(Bytes::from(vec![b'x'; 1000])) } else { Change::delete() };
        let partition = node.topology().partition_of(&key);
        let op = OpId { client: 7 << 48, seq };
        let put = crate::message::Put {
            op,
            epoch: 1,
            partition,
            key,
            change,
            past: VersionVector::default(),
            ack_at: 0,
            write: seq,
            deps: Vec::new(),
            done_below: seq,
        };
        let mut out = Outbox::new();
        node.step(Message::Put(Box::new(put)), Now::at(now_ms), &mut out);
        node.flush(now_ms, &mut out);
        out.into_iter().find(|e| e.to == Dest::Client(op.client)).map(|e| e.msg)
    }

    #[test]
    fn over_its_budget_a_node_refuses_growth_or_evicts_by_its_policy() {
        let mut node = lone_node();
        for i in 0..100 {
            let done = write(&mut node, i + 1, &format!("k{i}"), true, 1_000);
            assert!(matches!(done, Message::PutDone { .. }), "{done:?}");
        }
        let stores = node.store_memory() as u64;
        // Within the budget: writes go.
        node.set_memory(stores + 10_000, Policy::NoEviction);
        assert!(matches!(write(&mut node, 101, "k100", true, 1_001), Message::PutDone { .. }));
        // Over it: a write that adds data is refused, a delete goes.
        node.set_memory(stores / 2, Policy::NoEviction);
        let refused = write(&mut node, 102, "k101", true, 1_002);
        assert!(matches!(refused, Message::Refused { reason: Refusal::OutOfMemory, .. }), "{refused:?}");
        assert!(matches!(write(&mut node, 103, "k0", false, 1_003), Message::PutDone { .. }));
        // Evicting: the ticks bring the stores within the budget (the
        // tombstones are collected at once: nothing to wait for at R=1).
        node.set_memory(stores / 2, Policy::AllKeysRandom);
        assert!(!node.idle(), "an evicting node ticks as a busy one");
        for ms in (1_010..1_200).step_by(20) {
            node.tick(Now::at(ms), &mut Outbox::new());
        }
        assert!(node.store_memory() as u64 <= stores / 2, "{} over {}", node.store_memory(), stores / 2);
        assert!((40..60).contains(&node.evicted_keys()), "{} evicted: about half of the keys", node.evicted_keys());
        assert!(matches!(write(&mut node, 104, "k102", true, 1_200), Message::PutDone { .. }));
    }

    /// Runs what the node asks of its tier, and steps what came of it.
    fn run_tier(node: &mut Node, tier: &crate::tier::MemTier, now_ms: u64) -> Outbox {
        let mut out = Outbox::new();
        let jobs = node.take_tier_jobs();
        let (done, _) = crate::tier::run(tier, jobs);
        node.tier_done(done, Now::at(now_ms), &mut out);
        node.flush(now_ms, &mut out);
        out
    }

    fn get(node: &mut Node, seq: u64, key: &str, now_ms: u64) -> Option<Message> {
        let key = Bytes::from(key.to_string());
        let partition = node.topology().partition_of(&key);
        let op = OpId { client: 7 << 48, seq };
        let mut out = Outbox::new();
        node.step(Message::Get { op, epoch: 1, partition, key, min: None, leased: false }, Now::at(now_ms), &mut out);
        out.into_iter().find(|e| e.to == Dest::Client(op.client)).map(|e| e.msg)
    }

    #[test]
    fn over_its_budget_a_node_with_a_disk_tier_moves_values_out_and_reads_them_back() {
        use crate::tier::{CachePolicy, Job, MemTier};
        let tier = Arc::new(MemTier::default());
        let mut node = lone_node();
        node.enable_tier(CachePolicy::Lru, tier.clone());
        for i in 0..100 {
            assert!(matches!(write(&mut node, i + 1, &format!("k{i}"), true, 1_000), Message::PutDone { .. }));
        }
        let stores = node.store_memory() as u64;
        let budget = stores / 2;
        // Past the budget: values are written out, then freed.
        node.set_memory(budget, Policy::NoEviction);
        node.tick(Now::at(1_005), &mut Outbox::new());
        assert!(!node.idle(), "a node moving values out ticks as a busy one");
        for ms in (1_010..1_100).step_by(20) {
            node.tick(Now::at(ms), &mut Outbox::new());
            run_tier(&mut node, &tier, ms);
        }
        assert!(node.store_memory() as u64 <= budget, "{} over {budget}", node.store_memory());
        let (_, stats) = node.tier_stats().expect("a tier");
        assert!((45..60).contains(&stats.places.keys_on_disk), "{stats:?}");
        assert_eq!(stats.places.keys_on_disk + stats.places.keys_in_memory, 100, "{stats:?}");
        assert_eq!(stats.places.bytes_on_disk, 1000 * stats.places.keys_on_disk);
        // The first keys written were used least recently: on disk. A read
        // waits for its value, then gets it, in memory again.
        assert_eq!(get(&mut node, 200, "k0", 1_100), None, "waits for the disk");
        let jobs = node.take_tier_jobs();
        assert!(matches!(&jobs[..], [Job::Read(id)] if id.key.as_ref() == b"k0"), "{jobs:?}");
        let (done, _) = crate::tier::run(&*tier, jobs);
        let mut out = Outbox::new();
        node.tier_done(done, Now::at(1_101), &mut out);
        let value = out.iter().find_map(|e| match &e.msg {
            Message::Value { item, .. } => item.value.clone(),
            _ => None,
        });
        assert_eq!(value, Some(Bytes::from(vec![b'x'; 1000])));
        assert_eq!(get(&mut node, 201, "k0", 1_102).map(|m| matches!(m, Message::Value { .. })), Some(true), "in memory now");
        let (_, stats) = node.tier_stats().expect("a tier");
        assert_eq!((stats.misses, stats.hits, stats.read_back), (1, 1, 1), "{stats:?}");
        // A request for a key behind one waiting for the disk waits too:
        // a pipeline's read is answered before its next write applies.
        assert_eq!(get(&mut node, 202, "k4", 1_102), None, "waits for the disk");
        let overwrite = try_write(&mut node, 203, "k4", true, 1_102);
        assert_eq!(overwrite, None, "waits behind the read");
        let jobs = node.take_tier_jobs();
        let (done, _) = crate::tier::run(&*tier, jobs);
        let mut out = Outbox::new();
        node.tier_done(done, Now::at(1_102), &mut out);
        node.flush(1_102, &mut out);
        let answers: Vec<&Message> = out.iter().filter(|e| e.to == Dest::Client(7 << 48)).map(|e| &e.msg).collect();
        assert!(matches!(answers[..], [Message::Value { .. }, Message::PutDone { .. }]), "in order: {answers:?}");
        // A plain write of a key on disk does not read it; a delete
        // removes the copy on disk.
        assert!(matches!(write(&mut node, 300, "k1", true, 1_103), Message::PutDone { .. }));
        assert!(matches!(write(&mut node, 301, "k2", false, 1_103), Message::PutDone { .. }));
        let jobs = node.take_tier_jobs();
        assert_eq!(jobs.len(), 3, "k1's and k2's copies, and k4's (read back, then written): {jobs:?}");
        assert!(jobs.iter().all(|j| matches!(j, Job::Remove(_))), "{jobs:?}");
        crate::tier::run(&*tier, jobs);
        // A read the disk fails is refused, with why; nothing is lost.
        tier.fail_next(1);
        assert_eq!(get(&mut node, 400, "k3", 1_104), None);
        let out = run_tier(&mut node, &tier, 1_104);
        let refused = out.iter().find(|e| matches!(e.msg, Message::Refused { .. })).map(|e| e.msg.clone());
        assert!(matches!(&refused, Some(Message::Refused { reason: Refusal::Disk(why), .. }) if why.contains("injected")), "{refused:?}");
        assert_eq!(get(&mut node, 401, "k3", 1_105), None);
        let out = run_tier(&mut node, &tier, 1_105);
        assert!(out.iter().any(|e| matches!(&e.msg, Message::Value { item, .. } if item.value.is_some())), "read on the next try");
        // The disk fails to take values: over the budget, writes that add
        // data are refused with the reason, until the disk takes them.
        for i in 0..50 {
            write(&mut node, 500 + i, &format!("n{i}"), true, 1_200);
        }
        tier.fail_next(1);
        node.tick(Now::at(1_210), &mut Outbox::new());
        run_tier(&mut node, &tier, 1_210);
        let refused = write(&mut node, 600, "more", true, 1_211);
        assert!(
            matches!(&refused, Message::Refused { reason: Refusal::Disk(why), .. } if why.contains("over its memory budget")),
            "{refused:?}"
        );
        for ms in (1_220..1_300).step_by(20) {
            node.tick(Now::at(ms), &mut Outbox::new());
            run_tier(&mut node, &tier, ms);
        }
        assert!(matches!(write(&mut node, 601, "more", true, 1_300), Message::PutDone { .. }));
        // Keys alone over the budget: every value goes to disk, then
        // writes that add data get -OOM, as under noeviction.
        node.set_memory(1_000, Policy::AllKeysLru);
        for ms in (1_310..1_390).step_by(20) {
            node.tick(Now::at(ms), &mut Outbox::new());
            run_tier(&mut node, &tier, ms);
        }
        let (_, stats) = node.tier_stats().expect("a tier");
        assert_eq!(stats.places.keys_in_memory, 0, "{stats:?}");
        let refused = write(&mut node, 650, "k5", true, 1_390);
        assert!(matches!(refused, Message::Refused { reason: Refusal::OutOfMemory, .. }), "{refused:?}");
        // Every value reads back as written.
        for i in 3..100 {
            let key = format!("k{i}");
            let mut answer = get(&mut node, 700 + i, &key, 1_400);
            if answer.is_none() {
                answer = run_tier(&mut node, &tier, 1_400).into_iter().find(|e| matches!(e.msg, Message::Value { .. })).map(|e| e.msg);
            }
            assert!(
                matches!(&answer, Some(Message::Value { item, .. }) if item.value.as_deref() == Some(&[b'x'; 1000][..])),
                "{key}: {answer:?}"
            );
        }
    }

    #[test]
    fn a_full_disk_refuses_writes_that_add_data_and_loses_nothing() {
        use crate::tier::{CachePolicy, MemTier};
        // Room on disk for 20 of the values.
        let tier = Arc::new(MemTier::with_capacity(20 * 1_000));
        let mut node = lone_node();
        node.enable_tier(CachePolicy::Fifo, tier.clone());
        for i in 0..100 {
            assert!(matches!(write(&mut node, i + 1, &format!("k{i}"), true, 1_000), Message::PutDone { .. }));
        }
        node.set_memory(node.store_memory() as u64 / 2, Policy::NoEviction);
        for ms in (1_010..1_200).step_by(20) {
            node.tick(Now::at(ms), &mut Outbox::new());
            run_tier(&mut node, &tier, ms);
        }
        let (_, stats) = node.tier_stats().expect("a tier");
        assert!(stats.places.keys_on_disk <= 20 && stats.errors > 0, "{stats:?}");
        let refused = write(&mut node, 200, "more", true, 1_200);
        assert!(
            matches!(&refused, Message::Refused { reason: Refusal::Disk(why), .. } if why.contains("the disk tier is full")),
            "{refused:?}"
        );
        let again = write(&mut node, 201, "more", true, 1_201);
        assert!(matches!(&again, Message::Refused { reason: Refusal::Disk(_), .. }), "refused until the disk takes values: {again:?}");
        // A delete frees room: values move out again, and writes go in.
        for i in 0..40 {
            assert!(matches!(write(&mut node, 300 + i, &format!("k{i}"), false, 1_210), Message::PutDone { .. }));
        }
        for ms in (1_220..1_400).step_by(20) {
            node.tick(Now::at(ms), &mut Outbox::new());
            run_tier(&mut node, &tier, ms);
        }
        assert!(matches!(write(&mut node, 400, "more", true, 1_400), Message::PutDone { .. }));
        // Every value acknowledged and not deleted reads back as written.
        for i in 40..100 {
            let key = format!("k{i}");
            let mut answer = get(&mut node, 500 + i, &key, 1_400);
            if answer.is_none() {
                answer = run_tier(&mut node, &tier, 1_400).into_iter().find(|e| matches!(e.msg, Message::Value { .. })).map(|e| e.msg);
            }
            assert!(
                matches!(&answer, Some(Message::Value { item, .. }) if item.value.as_deref() == Some(&[b'x'; 1000][..])),
                "{key}: {answer:?}"
            );
        }
    }
}
