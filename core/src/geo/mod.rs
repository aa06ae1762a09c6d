//! Geo-replication (Eunomia): several sites, each taking writes, each
//! showing the others' writes without ever showing an effect before its
//! cause.
//!
//! * `reporter`: a partition's outgoing streams (ids to its site's
//!   stabilizer replicas, values to the other sites' receivers).
//! * `stabilizer`: the site stabilizer, which orders the site's update ids
//!   by timestamp once stable and ships them to the other sites.
//! * `receiver`: applies other sites' updates once their dependencies are
//!   stable here.
//! * `dr`: identifier-first disaster recovery between a primary site and
//!   its backup.

pub mod dr;
pub mod receiver;
pub mod reporter;
pub mod sequencer;
pub mod stabilizer;
pub mod visibility;

use crate::chain::PutRequest;
use crate::hlc::Timestamp;
pub use crate::message::GeoMsg;
use crate::message::{send, Dest, Message, OpId, Outbox, Update};
use crate::ring::{NodeId, PartitionId, Topology};
use crate::version::{SiteId, VersionVector};
use receiver::{Receiver, ReceiverMsg, ReceiverOut, RemoteValue};
use reporter::{Batch, Reporter, Stamped};
use sequencer::{SeqReply, SeqRequest, Sequencer};
use serde::{Deserialize, Serialize};
use stabilizer::{IdBatch, IdsAck, Stabilizer, StabilizerMsg, StabilizerOut, UpdateId};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use visibility::{Delays, Visibility};

/// How a deployment replicates between sites (`causeway node --replication`).
/// Every site of a deployment must use the same. The two baselines exist to
/// measure what causality costs (Eunomia §6, Figures 2 and 5): they are not
/// modes to run a store in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Replication {
    /// Eunomia: tails report ids to the site stabilizer, which ships them in
    /// timestamp order; receivers apply an update once its dependencies are
    /// stable here. Causal+ everywhere.
    #[default]
    Causal,
    /// Baseline: no causal order. Tails send values to the other sites and
    /// nothing else (no ids, no stabilizer); a receiver applies each value
    /// as it arrives, last-writer-wins. Converges, but a reader may see an
    /// effect before its cause.
    Eventual,
    /// Baseline S-Seq: as `Causal`, plus a synchronous round trip from the
    /// head to the site's sequencer (on the stabilizer leader) before every
    /// write is ordered, as designs that put a sequencer in the critical
    /// path do (`sequencer`). Shipping stays Eunomia's, so this measures
    /// the cost of the sequencer in the write path, not a whole S-Seq
    /// system.
    Sequenced,
}

impl std::str::FromStr for Replication {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "causal" => Ok(Replication::Causal),
            "eventual" => Ok(Replication::Eventual),
            "sequenced" => Ok(Replication::Sequenced),
            _ => Err(format!("unknown replication '{s}' (causal, eventual or sequenced)")),
        }
    }
}

/// One-way delays in ms between `sites` sites as in the Eunomia paper's
/// setup: 40 between site 0 and each other site, 80 between two others
/// (`causeway dev --sites`, the simulator's `Wan::paper`).
pub fn paper_delays(sites: usize) -> Vec<Vec<u64>> {
    let delay = |a: usize, b: usize| match (a, b) {
        _ if a == b => 0,
        (0, _) | (_, 0) => 40,
        _ => 80,
    };
    (0..sites).map(|a| (0..sites).map(|b| delay(a, b)).collect()).collect()
}

/// A tail's outgoing streams for one partition.
#[derive(Debug)]
struct Outbound {
    partition: PartitionId,
    ids: Reporter<NodeId, UpdateId>,
    values: Reporter<SiteId, RemoteValue>,
    /// (timestamp, seq) of every update recorded and not yet applied
    /// everywhere: what `reported` is computed from.
    seqs: VecDeque<(Timestamp, u64)>,
    /// Ids go to the stabilizer (not with `Replication::Eventual`).
    report_ids: bool,
    /// The latest item sent to any destination: one sent again up to
    /// here is a resend (`Geo::send_batches`).
    sent_through: Timestamp,
}

/// What stabilizer replicas that do not lead need only to take over goes
/// to them at most this often: promises alone (only the leader's stable
/// time makes remote writes visible) and other sites' acknowledgements
/// (where to resume shipping, what to forget).
const FOLLOWER_MS: u64 = 500;
/// Promises alone go to other sites' receivers at most this often: values
/// wait for their ids there anyway.
const VALUE_PROMISE_MS: u64 = 250;
/// How often the leader tells its site's nodes what the site has applied.
const SITE_TIME_MS: u64 = 50;
/// Busy heads promise this often unasked: promises only move the stable time,
/// which matters once ids wait for it (then the leader asks,
/// `GeoMsg::Promise`). Each promise costs a message down every chain, to
/// the stabilizer and on to every site: at every 5 ms tick, nine idle geo
/// nodes used more than a core of two.
const IDLE_PROMISE_MS: u64 = 100;
/// At rest (`idle`: nothing of geo-replication in flight here) heads
/// promise unasked, and the leader tells its site what it applied, only
/// this often (stabilizer followers hear other sites' acknowledgements
/// this often too). Nothing waits on either then: a write makes the nodes
/// on its way busy and has the promises it needs asked for; what moves at
/// rest is CW.SITES `applied_ms` (its `lag_ms` grows to about this much)
/// and the stable time tombstones are collected behind
/// (`store::RETAIN_MS` is longer). Three nodes of each of three sites at
/// rest: 0.31% of a core per node, 0.43% at one second (the aim is 0.3%;
/// BENCHMARKS.md, "Idle"); CW.SITES `lag_ms` at rest is up to this much.
const REST_MS: u64 = 3_000;
/// The leader asks its site's heads for promises at most this often: under
/// load, one round of promises per `ASK_MS` whatever the write rate.
const ASK_MS: u64 = 5;
/// Between ticks, a node's tails send new ids and values at once only if
/// they sent none (promises and resends do not count) for this long: the first
/// write after a quiet spell does not wait for the tick, and a busy node
/// sends on its ticks only (a batch per write would cost more than the
/// wait saves).
const EAGER_MS: u64 = 10;
/// `Replication::Sequenced`: a write whose number has not come back this
/// long after it was asked for is refused (the client retries; the leader
/// may have changed or the message been lost).
const SEQUENCE_TIMEOUT_MS: u64 = 1_000;

impl Outbound {
    /// No `replicas`: ids are not reported at all (values only).
    fn new(partition: PartitionId, replicas: &[NodeId], others: &[SiteId], leader: Option<NodeId>) -> Outbound {
        let mut o = Outbound {
            partition,
            ids: Reporter::new(partition, replicas),
            values: Reporter::new(partition, others),
            seqs: VecDeque::new(),
            report_ids: !replicas.is_empty(),
            sent_through: Timestamp::ZERO,
        };
        for &site in others {
            o.values.set_idle_ms(site, VALUE_PROMISE_MS);
        }
        o.follow(replicas, leader);
        o
    }

    /// Promises go to the leader every tick, to the other replicas rarely.
    fn follow(&mut self, replicas: &[NodeId], leader: Option<NodeId>) {
        for &r in replicas {
            self.ids.set_idle_ms(r, if Some(r) == leader { 0 } else { FOLLOWER_MS });
        }
    }

    /// Records a local update the tail applied; false if it is not after
    /// everything recorded and promised (which would break the order every
    /// destination relies on: counted, never shipped).
    fn record(&mut self, site: SiteId, u: &Update) -> bool {
        let (partition, ts) = (self.partition, u.version.ts);
        if self.report_ids {
            let vv = u.version.vv.0.iter().copied().collect();
            if !self.ids.record(UpdateId { partition, ts, local_dep: u.local_dep, vv }) {
                return false;
            }
        }
        let (key, value, expires_at_ms) = (u.key.clone(), u.value.clone(), u.expires_at_ms);
        if !self.values.record(RemoteValue { origin: site, partition, ts, key, value, expires_at_ms }) {
            return false;
        }
        self.seqs.push_back((ts, u.seq));
        true
    }

    fn promise(&mut self, ts: Timestamp) {
        self.ids.promise(ts);
        self.values.promise(ts);
    }

    /// Everything up to the returned seq is applied everywhere (`applied`,
    /// the tail's position, when nothing recorded is left).
    fn reported(&mut self, applied: u64) -> u64 {
        let everywhere = self.ids.applied().min(self.values.applied());
        while self.seqs.front().is_some_and(|&(ts, _)| ts <= everywhere) {
            self.seqs.pop_front();
        }
        self.seqs.front().map_or(applied, |&(_, seq)| seq - 1)
    }
}

/// A node's part in geo-replication: the reporters of the partitions it is
/// the tail of, its stabilizer replica if it runs one, and the site's
/// receiver while it leads. The node (`node::Node`) routes messages here
/// and runs the chain side (promises, remote writes at heads).
///
/// The leader (which ships, and runs the receiver) is the first stabilizer
/// replica the configuration admits; its term is the configuration's epoch.
/// Two nodes holding different configurations may both lead for a while:
/// harmless (the stabilizer tolerates it, and remote writes apply once).
#[derive(Debug)]
pub struct Geo {
    site: SiteId,
    me: NodeId,
    replication: Replication,
    partitions: u32,
    /// Every other site.
    others: Vec<SiteId>,
    all: Vec<SiteId>,
    /// This site's stabilizer replicas (the coordinator's nodes).
    replicas: Vec<NodeId>,
    stabilizer: Option<Stabilizer>,
    receiver: Option<Receiver>,
    leader: Option<NodeId>,
    tails: BTreeMap<PartitionId, Outbound>,
    /// What this site has applied of each other site, as last heard from
    /// the leader (or, on the leader, from its receiver).
    site_time: VersionVector,
    /// What each other site has applied of this one, as last heard.
    seen_by: VersionVector,
    /// What this site has applied of each other site and synced on every
    /// node, as last heard from the leader.
    site_durable: VersionVector,
    site_time_sent_ms: u64,
    /// Remote visibility delays per origin: recorded here while this node
    /// runs the receiver, else the leader's summary.
    visibility: Visibility,
    /// When heads here last promised.
    promised_ms: u64,
    /// Heads here promise past this at once (`GeoMsg::Promise`, or this
    /// node's own stabilizer leader asked: `take_asked`).
    asked: Option<Timestamp>,
    /// While leading: when it last asked for promises.
    asked_ms: u64,
    /// Partitions whose reporter got items since it last sent (`flush`).
    fed: BTreeSet<PartitionId>,
    /// Promises past this answer the leader: tails here send theirs as
    /// soon as they all have one (`flush`).
    flush_at: Option<Timestamp>,
    /// When tails here last sent new ids or values (not promises alone,
    /// nor resends).
    sent_ms: u64,
    /// The stabilizer replica's acknowledgements of ids, sent on the tick
    /// (one message per tail a tick, however many batches came: the
    /// acknowledgements are not on the way to visibility).
    ids_acks: Vec<IdsAck>,
    /// When another site's acknowledgement was last passed on to the
    /// replicas that do not lead (`FOLLOWER_MS`).
    site_ack_relayed_ms: u64,
    /// Local updates a tail could not report in timestamp order (never
    /// shipped). None should ever be: every head orders above the promises
    /// its chain passed on, and a replica drops updates parked behind a gap
    /// when its chain changes (`ChainReplica::reconfigure`; the simulator
    /// once found them spliced after a new head's update at the gap). The
    /// simulator asserts 0.
    out_of_order: u64,
    /// `Replication::Sequenced`: the site's sequencer (on stabilizer
    /// replicas; the leader's answers), and the writes heads here wait to
    /// order, by tag, with the partition and when they were parked.
    sequencer: Option<Sequencer>,
    sequencing: BTreeMap<u64, (PartitionId, PutRequest, u64)>,
    next_tag: u64,
    /// Probes this node got (or, leading, sent) and must answer once its
    /// disk holds what it has logged so far (the node pairs them with its
    /// log position: `take_probes`).
    probes: Vec<(NodeId, u64)>,
    /// While leading: the last of its probes each node answered.
    synced: BTreeMap<NodeId, u64>,
    /// Identifier-first disaster recovery, if this site is in the pair.
    dr: Option<dr::Dr>,
}

impl Geo {
    /// `me`'s part in site `site` of a deployment of `sites`, whose
    /// stabilizer replicas are `replicas`.
    ///
    /// With `Replication::Eventual` there is no stabilizer: ids are never
    /// reported, and the receiver applies values as they arrive.
    pub fn new(site: SiteId, sites: &[SiteId], me: NodeId, replicas: &[NodeId], partitions: u32, replication: Replication) -> Geo {
        let causal = replication != Replication::Eventual;
        let stabilizer = (causal && replicas.contains(&me)).then(|| Stabilizer::new(site, me, partitions, sites));
        Geo {
            site,
            me,
            replication,
            partitions,
            others: sites.iter().copied().filter(|&s| s != site).collect(),
            all: sites.to_vec(),
            replicas: replicas.to_vec(),
            stabilizer,
            receiver: None,
            leader: None,
            tails: BTreeMap::new(),
            site_time: VersionVector::default(),
            seen_by: VersionVector::default(),
            site_durable: VersionVector::default(),
            site_time_sent_ms: 0,
            visibility: Visibility::default(),
            promised_ms: 0,
            asked: None,
            asked_ms: 0,
            fed: BTreeSet::new(),
            flush_at: None,
            sent_ms: 0,
            ids_acks: Vec::new(),
            site_ack_relayed_ms: 0,
            out_of_order: 0,
            sequencer: (replication == Replication::Sequenced && replicas.contains(&me)).then(Sequencer::new),
            sequencing: BTreeMap::new(),
            next_tag: 0,
            probes: Vec::new(),
            synced: BTreeMap::new(),
            dr: None,
        }
    }

    /// Identifier-first disaster recovery between `pair`'s sites (nothing
    /// if this site is neither).
    pub fn set_dr(&mut self, pair: crate::message::geo::DrPair, incarnation: u64) {
        if pair.primary == self.site || pair.backup == self.site {
            self.dr = Some(dr::Dr::new(pair, self.site, self.me, incarnation, &self.replicas));
        }
    }

    /// This node's part in disaster recovery, if its site has one.
    pub fn dr(&self) -> Option<&dr::Dr> {
        self.dr.as_ref()
    }

    pub fn dr_mut(&mut self) -> Option<&mut dr::Dr> {
        self.dr.as_mut()
    }

    /// Starts a failover of this backup site (`Message::Failover`); false
    /// if this site is no backup.
    pub fn failover(&mut self, op: OpId, force: bool, topology: &Topology, now_ms: u64, out: &mut Outbox) -> bool {
        self.dr.as_mut().is_some_and(|d| d.start_failover(op, force, topology, now_ms, out))
    }

    /// The leader `topology` names: its first admitted stabilizer replica.
    pub fn leader_of(&self, topology: &Topology) -> Option<NodeId> {
        self.replicas.iter().copied().find(|&r| topology.admitted.contains_key(&r))
    }

    /// Follows a new configuration: a new leader ships, and runs the
    /// receiver (a new one, from scratch: the other sites ship again what
    /// it has not applied, and applying twice is harmless).
    pub fn configure(&mut self, topology: &Topology, now_ms: u64) {
        if let Some(d) = &mut self.dr {
            d.reconfigured(topology);
        }
        let leader = self.leader_of(topology);
        if let (Some(s), Some(l)) = (&mut self.stabilizer, leader) {
            s.step(StabilizerMsg::Leader { leader: l, term: topology.epoch }, now_ms, &mut Vec::new());
        }
        if leader != self.leader {
            self.leader = leader;
            for o in self.tails.values_mut() {
                o.follow(&self.replicas, leader);
            }
            self.synced.clear();
            self.receiver = (leader == Some(self.me)).then(|| match self.replication {
                Replication::Eventual => Receiver::eventual(self.site, &self.all, self.partitions),
                _ => Receiver::new(self.site, &self.all, &VersionVector::default()),
            });
        }
    }

    /// This node is the tail of `partition` (`tail` is its replica) or not
    /// (`None`): starts or stops its reporter, records what it applied, and
    /// returns how far everything is applied everywhere (for
    /// `ChainReplica::set_reported`).
    pub fn tail(&mut self, partition: PartitionId, tail: Option<&mut crate::chain::ChainReplica>) -> Option<u64> {
        let Some(r) = tail else {
            self.tails.remove(&partition);
            return None;
        };
        let fresh = !self.tails.contains_key(&partition);
        let replicas: &[NodeId] = if self.replication == Replication::Eventual { &[] } else { &self.replicas };
        let (others, leader) = (&self.others, self.leader);
        let o = self.tails.entry(partition).or_insert_with(|| Outbound::new(partition, replicas, others, leader));
        // A new tail starts from what the chain has not reported yet (which
        // includes what it just applied).
        if fresh {
            r.rewind();
        }
        for u in &r.take_reportable() {
            if !o.record(self.site, u) && !fresh {
                self.out_of_order += 1;
            }
            self.fed.insert(partition);
        }
        Some(o.reported(r.reportable_through()))
    }

    /// A promise reached the tail of `partition`. `asked`: it answers the
    /// leader's ask for promises past that time (`flush`).
    pub fn promise(&mut self, partition: PartitionId, ts: Timestamp, asked: Option<Timestamp>) {
        if let Some(o) = self.tails.get_mut(&partition) {
            o.promise(ts);
            if let Some(at) = asked {
                self.flush_at = Some(self.flush_at.map_or(at, |f| f.max(at)));
            }
        }
    }

    /// Whether heads here promise at this tick unasked: every
    /// `IDLE_PROMISE_MS`, or `REST_MS` at rest.
    pub fn promises_due(&mut self, now_ms: u64) -> bool {
        // At rest on multiples of `REST_MS` of the wall clock, so the site's heads
        // promise together and its stable time moves (and is shipped)
        // once per round rather than once per node.
        let due =
            now_ms.saturating_sub(self.promised_ms) >= IDLE_PROMISE_MS && (now_ms / REST_MS > self.promised_ms / REST_MS || !self.idle());
        if due {
            self.promised_ms = now_ms;
        }
        due
    }

    /// The leader asked heads here to promise past `at`
    /// (`GeoMsg::Promise`; `take_asked`).
    pub fn asked(&mut self, at: Timestamp) {
        self.asked = Some(self.asked.map_or(at, |a| a.max(at)));
    }

    /// Past what heads here must promise now, if the leader asked.
    pub fn take_asked(&mut self, now_ms: u64) -> Option<Timestamp> {
        let at = self.asked.take()?;
        self.promised_ms = now_ms;
        Some(at)
    }

    /// While leading: if ids wait to become stable, asks every head of the
    /// site to promise past the newest of them (this node's too, through
    /// `asked`), at most every `ASK_MS`.
    fn ask_promises(&mut self, topology: &Topology, now_ms: u64, out: &mut Outbox) {
        let Some(at) = self.stabilizer.as_ref().filter(|s| s.is_leader()).and_then(Stabilizer::waiting_for) else { return };
        if now_ms.saturating_sub(self.asked_ms) < ASK_MS {
            return;
        }
        self.asked_ms = now_ms;
        self.asked(at);
        for n in topology.nodes.iter().map(|n| n.id).filter(|&n| n != self.me) {
            send(out, Dest::Node(n), Message::geo(GeoMsg::Promise(at)));
        }
    }

    /// Sends at once, between ticks: every tail's promise to the leader
    /// once all of them answer its ask (one batch per ask, not one per
    /// chain it came down); new items if tails here sent nothing for
    /// `EAGER_MS`.
    pub fn flush(&mut self, now_ms: u64, out: &mut Outbox) {
        let answered = self.flush_at.is_some_and(|at| self.tails.values().all(|o| o.ids.promised() >= at));
        let items = !self.fed.is_empty() && now_ms.saturating_sub(self.sent_ms) >= EAGER_MS;
        if !answered && !items {
            return;
        }
        let (mut ids, mut values) = (Vec::new(), Vec::new());
        if answered {
            self.flush_at = None;
            for o in self.tails.values_mut() {
                o.ids.flush(now_ms, true, &mut ids);
            }
        }
        if items {
            for p in std::mem::take(&mut self.fed) {
                if let Some(o) = self.tails.get_mut(&p) {
                    o.ids.flush(now_ms, false, &mut ids);
                    o.values.flush(now_ms, false, &mut values);
                }
            }
        }
        self.send_batches(ids, values, now_ms, out);
    }

    /// `Replication::Sequenced`: a write `req` at the head of `partition`
    /// asks the site's sequencer for its number and waits here (returned
    /// at once, numbered, when this node is the leader: no round trip).
    /// `None`: parked until `sequenced`. Other modes: returned as it is.
    pub fn sequence(&mut self, partition: PartitionId, req: PutRequest, now_ms: u64, out: &mut Outbox) -> Option<PutRequest> {
        if self.replication != Replication::Sequenced {
            return Some(req);
        }
        self.next_tag += 1;
        let ask = SeqRequest { partition, tag: self.next_tag };
        match (self.leader, &mut self.sequencer) {
            (Some(l), Some(s)) if l == self.me => {
                s.step(ask);
                Some(req)
            }
            (Some(l), _) => {
                self.sequencing.insert(ask.tag, (partition, req, now_ms));
                send(out, Dest::Node(l), Message::geo(GeoMsg::Sequence { from: self.me, req: ask }));
                None
            }
            // No leader: the write is refused when the timeout passes.
            (None, _) => {
                self.sequencing.insert(ask.tag, (partition, req, now_ms));
                None
            }
        }
    }

    /// Probes to answer (`GeoMsg::Synced`) once the disk holds what this
    /// node has logged so far.
    pub fn take_probes(&mut self) -> Vec<(NodeId, u64)> {
        std::mem::take(&mut self.probes)
    }

    /// The node that ships and receives for the site, as this node knows.
    pub fn leader(&self) -> Option<NodeId> {
        self.leader
    }

    /// A number came back: the write it was for, to order now.
    pub fn sequenced(&mut self, reply: SeqReply) -> Option<(PartitionId, PutRequest)> {
        self.sequencing.remove(&reply.tag).map(|(p, req, _)| (p, req))
    }

    /// Writes whose number did not come back in time, to refuse.
    pub fn unsequenced(&mut self, now_ms: u64) -> Vec<OpId> {
        let late: Vec<u64> =
            self.sequencing.iter().filter(|(_, (_, _, at))| now_ms.saturating_sub(*at) >= SEQUENCE_TIMEOUT_MS).map(|(&t, _)| t).collect();
        late.into_iter().filter_map(|t| self.sequencing.remove(&t)).map(|(_, req, _)| req.op).collect()
    }

    /// How this deployment replicates between sites.
    pub fn replication(&self) -> Replication {
        self.replication
    }

    /// Numbers handed out by the sequencer here.
    pub fn sequenced_count(&self) -> u64 {
        self.sequencer.as_ref().map_or(0, Sequencer::served)
    }

    /// Periodic work: reporters send their batches, the stabilizer ships,
    /// the receiver acknowledges and hands out again what is overdue.
    pub fn tick(&mut self, topology: &Topology, now_ms: u64, out: &mut Outbox) {
        let (mut ids, mut values) = (Vec::new(), Vec::new());
        for o in self.tails.values_mut() {
            o.ids.tick(now_ms, &mut ids);
            o.values.tick(now_ms, &mut values);
            crate::shrink_idle(&mut o.seqs);
        }
        // The tick sent the leader every tail's latest promise: nothing
        // waits for an answer any more (a tail whose head is down never
        // answers, and must not keep `flush` checking every step).
        self.fed.clear();
        self.flush_at = None;
        self.send_batches(ids, values, now_ms, out);
        if let Some(s) = &mut self.stabilizer {
            let mut sout = Vec::new();
            s.tick(now_ms, &mut sout);
            self.stabilizer_out(sout, out);
        }
        let acks = std::mem::take(&mut self.ids_acks).into_iter().filter_map(|a| Some((*topology.chain(a.partition).nodes.last()?, a)));
        for (tail, acks) in group(acks.collect()) {
            send(out, Dest::Node(tail), Message::geo(GeoMsg::IdsAcks(acks)));
        }
        self.ask_promises(topology, now_ms, out);
        if let Some(d) = &mut self.dr {
            d.tick(topology, now_ms, out);
        }
        if let Some(r) = &mut self.receiver {
            let mut rout = Vec::new();
            r.tick(now_ms, &mut rout);
            self.site_time.merge(r.applied());
            self.site_durable.merge(&r.durable());
            if let Some(s) = &self.stabilizer {
                for &other in &self.others {
                    let seen = s.seen(other).map_or(Timestamp::ZERO, |p| p.time());
                    if seen > self.seen_by.get(other) {
                        self.seen_by.set(other, seen);
                    }
                }
            }
            self.receiver_out(topology, rout, out);
            self.visibility.summarize(now_ms);
            self.prune_dr();
            // At rest only promises move it, and nothing waits on that.
            let every = if self.receiver.as_ref().is_some_and(Receiver::idle) { REST_MS } else { SITE_TIME_MS };
            if now_ms.saturating_sub(self.site_time_sent_ms) >= every {
                self.site_time_sent_ms = now_ms;
                let probe = (self.me, now_ms);
                if let Some(r) = &mut self.receiver {
                    r.mark(now_ms);
                }
                self.probes.push(probe);
                for n in topology.nodes.iter().map(|n| n.id).filter(|&n| n != self.me) {
                    let (applied, seen_by) = (self.site_time.clone(), self.seen_by.clone());
                    let (durable, visible) = (self.site_durable.clone(), self.visibility.summary().clone());
                    send(out, Dest::Node(n), Message::geo(GeoMsg::SiteTime { applied, durable, seen_by, probe, visible }));
                }
            }
        }
    }

    fn send_batches(&mut self, ids: Vec<(NodeId, IdBatch)>, values: Vec<(SiteId, Batch<RemoteValue>)>, now_ms: u64, out: &mut Outbox) {
        // Only new items say the tails are busy (`EAGER_MS`). A resend
        // (what a destination did not acknowledge in time, which a site
        // 80 ms away never does within `REPORT_RESEND_MS`) counted too, and
        // a write right after one waited for the tick.
        let last_ids = ids.iter().map(|(_, b)| (b.partition, b.items.last().map(UpdateId::ts)));
        let last_values = values.iter().map(|(_, b)| (b.partition, b.items.last().map(RemoteValue::ts)));
        for (partition, last) in last_ids.chain(last_values) {
            if let (Some(ts), Some(o)) = (last, self.tails.get_mut(&partition)) {
                if ts > o.sent_through {
                    o.sent_through = ts;
                    self.sent_ms = now_ms;
                }
            }
        }
        for (replica, batches) in group(ids) {
            send(out, Dest::Node(replica), Message::geo(GeoMsg::Ids(batches)));
        }
        for (to, batches) in group(values) {
            send(out, Dest::Site(to), Message::geo(GeoMsg::Values { origin: self.site, batches }));
        }
    }

    /// What this site has applied of each other site, as this node knows.
    pub fn site_time(&self) -> &VersionVector {
        &self.site_time
    }

    /// Remote visibility per origin over the last minute (p50, p99).
    pub fn visibility(&self) -> &BTreeMap<SiteId, Delays> {
        self.visibility.summary()
    }

    /// What each other site has applied of this one, as this node knows.
    pub fn seen_by(&self) -> &VersionVector {
        &self.seen_by
    }

    /// A geo message that is not for a chain replica (those are `Apply`,
    /// `Promises`, `Promise` and `Sequenced`: the node handles them, in
    /// `node::geo`, and hands every other here). `relayed`: it was passed on
    /// by another node of this site, so it is handled here or dropped.
    pub fn step(&mut self, msg: GeoMsg, relayed: bool, topology: &Topology, now_ms: u64, out: &mut Outbox) {
        match msg {
            GeoMsg::Ids(batches) => {
                if let Some(s) = &mut self.stabilizer {
                    let mut sout = Vec::new();
                    for batch in batches {
                        s.step(StabilizerMsg::Ids(batch), now_ms, &mut sout);
                    }
                    if s.is_leader() && !s.idle() {
                        // Ship what became stable now rather than at the
                        // next tick (Eunomia's `process_stable`, driven by
                        // arrivals: a tick's wait less of visibility delay).
                        // Without ids, a shipment only moves the stable
                        // time: that waits for the tick, or every promise
                        // that moved it would cost a message to every site.
                        s.tick(now_ms, &mut sout);
                    }
                    self.stabilizer_out(sout, out);
                    self.ask_promises(topology, now_ms, out);
                }
            }
            GeoMsg::IdsAcks(acks) => {
                for ack in acks {
                    if let Some(o) = self.tails.get_mut(&ack.partition) {
                        ack.deliver(&mut o.ids, now_ms);
                    }
                }
            }
            GeoMsg::SiteAck(ack) => {
                if !self.all.contains(&ack.from) || ack.origin != self.site {
                    return;
                }
                if let Some(s) = &mut self.stabilizer {
                    s.step(StabilizerMsg::SiteAck(ack), now_ms, &mut Vec::new());
                }
                if !relayed {
                    // To the leader always; to the others now and then (a
                    // later acknowledgement covers an earlier one).
                    let since = now_ms.saturating_sub(self.site_ack_relayed_ms);
                    let followers = since >= REST_MS || (since >= FOLLOWER_MS && !self.idle());
                    if followers {
                        self.site_ack_relayed_ms = now_ms;
                    }
                    for &r in self.replicas.iter().filter(|&&r| r != self.me && (followers || Some(r) == self.leader)) {
                        send(out, Dest::Node(r), Message::geo(GeoMsg::Relayed(Box::new(GeoMsg::SiteAck(ack)))));
                    }
                }
            }
            GeoMsg::ValuesAcks(acks) => {
                let mut elsewhere = Vec::new();
                for ack in acks.into_iter().filter(|a| self.all.contains(&a.from) && a.origin == self.site) {
                    match self.tails.get_mut(&ack.partition) {
                        Some(o) => o.values.on_ack(ack.from, ack.received, ack.applied, ack.resend, now_ms),
                        None if !relayed => elsewhere.extend(topology.chain(ack.partition).nodes.last().map(|&tail| (tail, ack))),
                        None => {}
                    }
                }
                for (tail, acks) in group(elsewhere) {
                    send(out, Dest::Node(tail), Message::geo(GeoMsg::Relayed(Box::new(GeoMsg::ValuesAcks(acks)))));
                }
            }
            GeoMsg::Ship(_) | GeoMsg::Values { .. } => self.for_receiver(msg, relayed, topology, out),
            GeoMsg::Applied { origin, partition, ts } => {
                if let Some(r) = &mut self.receiver {
                    self.visibility.record(origin, ts, now_ms);
                    let mut rout = Vec::new();
                    r.step(ReceiverMsg::Applied { origin, partition, ts }, &mut rout);
                    self.receiver_out(topology, rout, out);
                }
            }
            GeoMsg::Relayed(inner) => {
                if !relayed {
                    self.step(*inner, true, topology, now_ms, out);
                }
            }
            GeoMsg::SiteTime { applied, durable, seen_by, probe, visible } => {
                self.site_time.merge(&applied);
                self.site_durable.merge(&durable);
                self.seen_by.merge(&seen_by);
                self.probes.push(probe);
                self.visibility.adopt(visible);
                self.prune_dr();
            }
            GeoMsg::Note { .. }
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
            | GeoMsg::NotesAre { .. } => {
                if let Some(d) = &mut self.dr {
                    d.step(msg, relayed, self.leader, topology, now_ms, out);
                }
            }
            GeoMsg::Synced { from, probe: (leader, probe) } => {
                let Some(r) = self.receiver.as_mut().filter(|_| leader == self.me) else { return };
                let at = self.synced.entry(from).or_default();
                *at = (*at).max(probe);
                // Every node of the site, this one included, must have
                // answered.
                let all = topology.nodes.iter().map(|n| self.synced.get(&n.id).copied()).min().flatten();
                if let Some(probe) = all {
                    r.synced(probe);
                }
            }
            GeoMsg::Sequence { from, req } => {
                if let (Some(s), true) = (&mut self.sequencer, self.leader == Some(self.me)) {
                    send(out, Dest::Node(from), Message::geo(GeoMsg::Sequenced(s.step(req))));
                }
            }
            // The node's (chain) business.
            GeoMsg::Apply { .. } | GeoMsg::Promises { .. } | GeoMsg::Promise(_) | GeoMsg::Sequenced(_) => {}
        }
    }

    /// Another site's shipment or values: to the receiver, here or (once)
    /// on the leader.
    fn for_receiver(&mut self, msg: GeoMsg, relayed: bool, topology: &Topology, out: &mut Outbox) {
        let origin = match &msg {
            GeoMsg::Ship(s) => s.origin,
            GeoMsg::Values { origin, .. } => *origin,
            _ => return,
        };
        if !self.others.contains(&origin) {
            return; // never from a site not in the configuration
        }
        match (&mut self.receiver, self.leader) {
            (Some(r), _) => {
                let mut rout = Vec::new();
                match msg {
                    GeoMsg::Ship(ship) => r.step(ReceiverMsg::Ship(ship), &mut rout),
                    GeoMsg::Values { origin, batches } => {
                        for batch in batches {
                            r.step(ReceiverMsg::Values { origin, batch }, &mut rout);
                        }
                    }
                    _ => {}
                }
                self.receiver_out(topology, rout, out);
            }
            (None, Some(leader)) if !relayed && leader != self.me => {
                send(out, Dest::Node(leader), Message::geo(GeoMsg::Relayed(Box::new(msg))));
            }
            _ => {}
        }
    }

    /// Notes of the primary's writes the site has applied, and synced on
    /// every node (so that they survive the site crashing whole, whatever
    /// `--fsync`), are done.
    fn prune_dr(&mut self) {
        if let Some(d) = &mut self.dr {
            let primary = d.pair().primary;
            d.prune(self.site_durable.get(primary));
        }
    }

    /// Ships now; acknowledgements wait for the tick (`ids_acks`).
    fn stabilizer_out(&mut self, sout: Vec<StabilizerOut>, out: &mut Outbox) {
        for o in sout {
            match o {
                StabilizerOut::IdsAck(ack) => self.ids_acks.push(ack),
                StabilizerOut::Ship(ship) => send(out, Dest::Site(ship.to), Message::geo(GeoMsg::Ship(ship))),
            }
        }
    }

    fn receiver_out(&self, topology: &Topology, rout: Vec<ReceiverOut>, out: &mut Outbox) {
        let mut value_acks = Vec::new();
        for o in rout {
            match o {
                ReceiverOut::Apply(write) => {
                    if let Some(&head) = topology.chain(write.partition).nodes.first() {
                        let msg = GeoMsg::Apply { epoch: topology.epoch, write, from: self.me };
                        send(out, Dest::Node(head), Message::geo(msg));
                    }
                }
                ReceiverOut::Ack(ack) => send(out, Dest::Site(ack.origin), Message::geo(GeoMsg::SiteAck(ack))),
                ReceiverOut::ValuesAck(ack) => value_acks.push((ack.origin, ack)),
            }
        }
        for (origin, acks) in group(value_acks) {
            send(out, Dest::Site(origin), Message::geo(GeoMsg::ValuesAcks(acks)));
        }
    }

    /// What this site has applied of each other site (while it leads).
    pub fn applied(&self) -> Option<&VersionVector> {
        self.receiver.as_ref().map(Receiver::applied)
    }

    /// Local updates a tail could not report in timestamp order.
    pub fn out_of_order(&self) -> u64 {
        self.out_of_order
    }

    /// Remote updates received and not yet stable here (while it leads).
    pub fn backlog(&self) -> usize {
        self.receiver.as_ref().map_or(0, |r| r.waiting() + r.in_flight())
    }

    /// Ids and values the tails here keep for some destination.
    pub fn unreported(&self) -> usize {
        self.tails.values().map(|o| o.ids.unacked() + o.values.unacked()).sum()
    }

    /// Whether nothing of geo-replication here waits on time, so the node
    /// may tick as seldom as an idle single site (`node::Node::idle`):
    ///
    /// * the tails keep no id or value some stabilizer replica or site has
    ///   not applied (they resend them on ticks), and none got one it has
    ///   not sent (`fed`);
    /// * no ask for promises is pending, to make here (`asked`) or to
    ///   answer (`flush_at`), and no write waits for its number
    ///   (`Replication::Sequenced`);
    /// * the stabilizer replica, if any, holds no id (`Stabilizer::idle`)
    ///   and owes no tail a refusal (a tail resends once it hears it);
    /// * the receiver, if any, holds no remote update and owes no
    ///   acknowledgement its origin keeps anything for (`Receiver::idle`).
    ///
    /// What flows while nobody writes does not count: promises, shipments
    /// and value batches that only move a stream's time, their
    /// acknowledgements (refusals aside), `SiteTime`. It goes on every
    /// tick, and an idle node still ticks; were it to count, its flow
    /// alone would keep every node busy. A write makes the node it reaches
    /// busy at once (its chain, then this), and the nodes that get its id,
    /// value or shipment as they step them.
    pub fn idle(&self) -> bool {
        self.tails.values().all(|o| o.ids.unacked() == 0 && o.values.unacked() == 0)
            && self.fed.is_empty()
            && !self.ids_acks.iter().any(|a| a.resend)
            && self.asked.is_none()
            && self.flush_at.is_none()
            && self.sequencing.is_empty()
            && self.stabilizer.as_ref().is_none_or(Stabilizer::idle)
            && self.receiver.as_ref().is_none_or(Receiver::idle)
            && self.dr.as_ref().is_none_or(dr::Dr::idle)
    }

    /// The state of every reporter here, one line each (diagnostics).
    pub fn describe(&self) -> String {
        let mut lines = Vec::new();
        for (p, o) in &self.tails {
            if o.ids.unacked() + o.values.unacked() > 0 {
                lines.push(format!(
                    "p{p}: {} ids, {} values, promised {}; replicas {:?}; sites {:?}",
                    o.ids.unacked(),
                    o.values.unacked(),
                    o.ids.promised(),
                    o.ids.peers(),
                    o.values.peers()
                ));
            }
        }
        if let Some(r) = &self.receiver {
            lines.push(r.describe());
        }
        if let Some(s) = &self.stabilizer {
            lines.push(format!(
                "stabilizer: stable {}, holds {}, acks {:?}",
                s.stable_time(),
                s.held(),
                self.others.iter().map(|&o| s.acked(o)).collect::<Vec<_>>()
            ));
        }
        lines.join("\n")
    }

    /// The stabilizer replica here, if any.
    pub fn stabilizer(&self) -> Option<&Stabilizer> {
        self.stabilizer.as_ref()
    }
}

/// Items by destination, in destination order.
fn group<K: Ord, T>(items: Vec<(K, T)>) -> BTreeMap<K, Vec<T>> {
    let mut by: BTreeMap<K, Vec<T>> = BTreeMap::new();
    for (k, t) in items {
        by.entry(k).or_default().push(t);
    }
    by
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::geo::{Ship, SiteAck, ValuesAck};
    use crate::ring::{NodeInfo, Shape};
    use stabilizer::{IdVector, Position};

    fn ts(ms: u64) -> Timestamp {
        Timestamp::new(ms, 0)
    }

    /// Ids of partition `p` (at `ms`), promised up to `up_to`.
    fn ids(p: PartitionId, prev: u64, ms: &[u64], up_to: u64) -> GeoMsg {
        let items = ms
            .iter()
            .map(|&m| UpdateId { partition: p, ts: ts(m), local_dep: ts(m).just_before(), vv: IdVector::from_elem(ts(m), 2) })
            .collect();
        GeoMsg::Ids(vec![IdBatch { partition: p, prev: ts(prev), items, up_to: ts(up_to) }])
    }

    /// Site 0 of sites 0 and 1: three nodes, all admitted, all stabilizer
    /// replicas (node 0 leads), and node `me`'s part in it.
    fn site(partitions: u32, me: NodeId) -> (Topology, Geo) {
        let nodes = (0..3).map(|id| NodeInfo { id, addr: format!("n{id}") }).collect();
        let mut topology = Topology::new(1, Shape { partitions, replicas: 3, k: 2, coding: None }, nodes).unwrap();
        topology.admitted = (0..3).map(|n| (n, 1)).collect();
        let mut geo = Geo::new(0, &[0, 1], me, &[0, 1, 2], partitions, Replication::Causal);
        geo.configure(&topology, 0);
        (topology, geo)
    }

    /// Takes everything out of `out`, keeping what `keep` picks.
    fn drain<T>(out: &mut Outbox, mut keep: impl FnMut(Dest, GeoMsg) -> Option<T>) -> Vec<T> {
        std::mem::take(out)
            .into_iter()
            .filter_map(|e| match e.msg {
                Message::Geo(g) => keep(e.to, *g),
                _ => None,
            })
            .collect()
    }

    /// The promises `out` asks of other nodes.
    fn asks(out: &mut Outbox) -> Vec<(Dest, Timestamp)> {
        drain(out, |to, g| if let GeoMsg::Promise(at) = g { Some((to, at)) } else { None })
    }

    /// An id that waits for other partitions' promises makes the leader ask
    /// every node of its site (itself included) to promise past it at once,
    /// rather than wait for heads to promise on their own; at most every
    /// `ASK_MS`, and not once nothing waits.
    #[test]
    fn the_leader_asks_for_promises_when_ids_wait_for_them() {
        let (topology, mut geo) = site(2, 0);
        let mut out = Outbox::new();
        // Partition 1 promised up to 50; partition 0 reports an id at 100.
        geo.step(ids(1, 0, &[], 50), false, &topology, 1_000, &mut out);
        assert!(asks(&mut out).is_empty(), "nothing waits yet");
        geo.step(ids(0, 0, &[100], 100), false, &topology, 1_000, &mut out);
        assert_eq!(asks(&mut out), [(Dest::Node(1), ts(100)), (Dest::Node(2), ts(100))]);
        assert_eq!(geo.take_asked(1_000), Some(ts(100)), "its own heads too");
        // Another id soon after: no new ask before `ASK_MS`.
        geo.step(ids(0, 100, &[120], 120), false, &topology, 1_001, &mut out);
        assert!(asks(&mut out).is_empty());
        geo.tick(&topology, 1_000 + ASK_MS, &mut out);
        assert_eq!(asks(&mut out), [(Dest::Node(1), ts(120)), (Dest::Node(2), ts(120))]);
        // Partition 1 promises past both: they ship, nothing waits.
        geo.step(ids(1, 50, &[], 130), false, &topology, 1_000 + 2 * ASK_MS, &mut out);
        let shipped: usize = out.iter().map(|e| if let Some(GeoMsg::Ship(s)) = e.msg.as_geo() { s.ids.len() } else { 0 }).sum();
        assert_eq!(shipped, 2);
        geo.tick(&topology, 1_000 + 3 * ASK_MS, &mut out);
        assert!(asks(&mut out).is_empty(), "nothing waits any more");
    }

    /// A local update of site 0 the tail applied: `seq` at `ms`.
    fn local_update(seq: u64, ms: u64) -> Update {
        Update {
            seq,
            key: bytes::Bytes::from("k"),
            version: crate::version::Version::local(0, ts(ms)),
            value: Some(bytes::Bytes::from("v")),
            expires_at_ms: None,
            ack: None,
            local_dep: Timestamp::ZERO,
            expired: false,
        }
    }

    /// The timestamps (ms) of the ids and values `out` carries, which it
    /// empties.
    fn items(out: &mut Outbox) -> (Vec<u64>, Vec<u64>) {
        let (mut ids, mut values) = (Vec::new(), Vec::new());
        for e in std::mem::take(out) {
            match e.msg.into_geo() {
                Some(GeoMsg::Ids(b)) => ids.extend(b.iter().flat_map(|b| b.items.iter().map(|i| i.ts.physical_ms()))),
                Some(GeoMsg::Values { batches, .. }) => {
                    values.extend(batches.iter().flat_map(|b| b.items.iter().map(|i| i.ts.physical_ms())))
                }
                _ => {}
            }
        }
        (ids, values)
    }

    /// A write goes at once between ticks after a quiet spell, and after a
    /// tick that only sent an unacknowledged one again: a resend does not
    /// make the tails count as busy (`EAGER_MS`).
    #[test]
    fn a_resend_does_not_hold_the_next_write_back_for_the_tick() {
        let (topology, mut geo) = site(2, 0);
        let mut out = Outbox::new();
        geo.tails.insert(1, Outbound::new(1, &[0, 1, 2], &[1], Some(0)));
        let record = |geo: &mut Geo, seq, ms| {
            assert!(geo.tails.get_mut(&1).unwrap().record(0, &local_update(seq, ms)));
            geo.fed.insert(1);
        };
        record(&mut geo, 1, 100);
        geo.flush(1_000, &mut out);
        assert_eq!(items(&mut out), (vec![100; 3], vec![100]), "at once, to every replica and site");
        let resent = 1_000 + reporter::REPORT_RESEND_MS;
        geo.tick(&topology, resent, &mut out);
        assert_eq!(items(&mut out), (vec![100; 3], vec![100]), "not acknowledged: sent again");
        record(&mut geo, 2, 200);
        geo.flush(resent + 1, &mut out);
        assert_eq!(items(&mut out), (vec![200; 3], vec![200]));
        // A new write right after it waits for the tick.
        record(&mut geo, 3, 300);
        geo.flush(resent + 2, &mut out);
        assert_eq!(items(&mut out), (vec![], vec![]));
    }

    /// A tail's update keeps its node busy until every stabilizer replica
    /// said every other site applied its id, and every other site
    /// acknowledged its value as applied.
    #[test]
    fn a_tail_is_idle_once_every_destination_applied_what_it_reported() {
        let (topology, mut geo) = site(2, 0);
        let mut out = Outbox::new();
        assert!(geo.idle());
        let mut tail = Outbound::new(1, &[0, 1, 2], &[1], Some(0));
        assert!(tail.record(0, &local_update(1, 100)));
        geo.tails.insert(1, tail);
        assert!(!geo.idle(), "its id and value are in flight");
        let ids_ack = |replica, applied| IdsAck { replica, partition: 1, up_to: ts(100), applied, resend: false };
        geo.step(GeoMsg::IdsAcks(vec![ids_ack(1, Timestamp::ZERO)]), false, &topology, 1_000, &mut out);
        assert!(!geo.idle(), "received, not applied by site 1");
        geo.step(GeoMsg::IdsAcks(vec![ids_ack(0, ts(100))]), false, &topology, 1_000, &mut out);
        assert!(!geo.idle(), "the id is applied everywhere, the value not acknowledged");
        let value_ack = ValuesAck { from: 1, origin: 0, partition: 1, received: ts(100), applied: ts(100), resend: false };
        geo.step(GeoMsg::ValuesAcks(vec![value_ack]), false, &topology, 1_000, &mut out);
        assert!(geo.idle());
        // Promises reach it and go on to the stabilizer and site 1.
        geo.promise(1, ts(200), None);
        geo.tick(&topology, 1_300, &mut out);
        assert!(!out.is_empty());
        assert!(geo.idle());
    }

    /// The leader is busy from an id reported to its stabilizer until every
    /// other site acknowledged it applied (asking for promises on the way),
    /// and while another site's update is in its receiver.
    #[test]
    fn the_leader_is_idle_once_no_id_waits_to_be_shipped_or_applied() {
        let (topology, mut geo) = site(2, 0);
        let mut out = Outbox::new();
        geo.step(ids(1, 0, &[], 50), false, &topology, 1_000, &mut out);
        geo.tick(&topology, 1_005, &mut out);
        assert!(geo.idle(), "promises alone");
        geo.step(ids(0, 0, &[100], 100), false, &topology, 1_010, &mut out);
        assert!(!geo.idle(), "an id waits for partition 1");
        assert_eq!(geo.take_asked(1_010), Some(ts(100)), "heads here are asked to promise");
        geo.step(ids(1, 50, &[], 120), false, &topology, 1_012, &mut out);
        let shipped = drain(&mut out, |_, g| if let GeoMsg::Ship(s) = g { Some(s) } else { None });
        assert_eq!(shipped.iter().map(|s| s.ids.len()).sum::<usize>(), 1);
        geo.tick(&topology, 1_015, &mut out);
        assert!(!geo.idle(), "shipped, not applied by site 1");
        let through = Position::through(ts(100));
        let ack = SiteAck { from: 1, origin: 0, received: through, applied: through, visible: through, resend: false };
        geo.step(GeoMsg::SiteAck(ack), false, &topology, 1_100, &mut out);
        geo.tick(&topology, 1_105, &mut out);
        assert!(geo.idle());
        // Site 1's update reaches the receiver here.
        let id = UpdateId { partition: 0, ts: ts(90), local_dep: Timestamp::ZERO, vv: IdVector::from_elem(Timestamp::ZERO, 2) };
        let ship =
            Ship { origin: 1, to: 0, prev: Position::START, ids: vec![id], through: Position::through(ts(90)), applied: Position::START };
        geo.step(GeoMsg::Ship(ship), false, &topology, 1_110, &mut out);
        assert!(!geo.idle(), "site 1's update waits for its value");
    }

    /// A stabilizer replica acknowledges the batches of a tick in one
    /// message per tail, on its tick: not one per batch.
    #[test]
    fn ids_are_acknowledged_on_the_tick_once_per_tail() {
        let (topology, mut geo) = site(2, 0);
        let acks = |out: &mut Outbox| drain(out, |to, g| if let GeoMsg::IdsAcks(a) = g { Some((to, a.len())) } else { None });
        let mut out = Outbox::new();
        for (p, up_to) in [(0, 10), (1, 10), (0, 20), (1, 20)] {
            geo.step(ids(p, up_to - 10, &[], up_to), false, &topology, 1_000, &mut out);
        }
        assert!(acks(&mut out).is_empty(), "none before the tick");
        geo.tick(&topology, 1_005, &mut out);
        let tails: BTreeSet<NodeId> = (0..2).map(|p| *topology.chain(p).nodes.last().unwrap()).collect();
        let sent = acks(&mut out);
        let to: Vec<Dest> = sent.iter().map(|&(to, _)| to).collect();
        assert_eq!(to, tails.into_iter().map(Dest::Node).collect::<Vec<_>>(), "one message per tail");
        assert_eq!(sent.iter().map(|&(_, n)| n).sum::<usize>(), 4, "every batch acknowledged");
    }

    /// A tail's promise that answers an ask goes to the leader as soon as
    /// every tail here has one past the asked time (one message, not one per
    /// chain it came down), without a tick.
    #[test]
    fn tails_send_what_the_leader_waits_for_without_waiting_for_a_tick() {
        let me = 2;
        let (topology, mut geo) = site(12, me);
        let tails: Vec<PartitionId> = (0..12).filter(|&p| topology.chain(p).nodes.last() == Some(&me)).collect();
        let mut replicas: Vec<crate::chain::ChainReplica> =
            tails.iter().map(|&p| crate::chain::ChainReplica::new(&topology, p, me, 1).unwrap()).collect();
        for (&p, r) in tails.iter().zip(&mut replicas) {
            geo.tail(p, Some(r));
        }
        assert!(tails.len() > 1, "tails of several partitions here");
        let to_leader = |out: &mut Outbox| -> Vec<IdBatch> {
            drain(out, |to, g| match (to, g) {
                (Dest::Node(0), GeoMsg::Ids(b)) => Some(b),
                _ => None,
            })
            .concat()
        };
        let mut out = Outbox::new();
        // Promises that answer no ask wait for the tick.
        for &p in &tails {
            geo.promise(p, ts(10), None);
        }
        geo.flush(1_000, &mut out);
        assert!(to_leader(&mut out).is_empty());
        // Answers to an ask for 100: sent once every tail has one.
        let (first, rest) = tails.split_first().unwrap();
        geo.promise(*first, ts(100), Some(ts(100)));
        geo.flush(1_001, &mut out);
        assert!(to_leader(&mut out).is_empty(), "not every tail answered yet");
        for &p in rest {
            geo.promise(p, ts(100), Some(ts(100)));
        }
        geo.flush(1_002, &mut out);
        let sent = to_leader(&mut out);
        assert_eq!(sent.len(), tails.len(), "one batch per tail, in one message");
        assert!(sent.iter().all(|b| b.up_to == ts(100)));
    }
}
