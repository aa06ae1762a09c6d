//! Three sites, each with four partitions, three stabilizer replicas and a
//! receiver, driven together on one virtual clock with a seeded network:
//! wide-area delays with jitter (so shipments overtake each other), loss of
//! batches, shipments and acks, links between sites cut for a while (so an
//! update often reaches a site before what it depends on from a third
//! site), a straggler partition, skewed site clocks, and stabilizer leaders that crash or are replaced (with the old leader
//! told late, so two ship at once for a while). Sessions write with the
//! dependencies of what they read.
//!
//! Checked: every update is applied exactly once in every other site; per
//! origin in stream (timestamp) order; never before everything it depends
//! on is stable in the applying site (ground truth kept by the test, not by
//! the receiver); and at the end every site holds the same vector, equal to
//! each origin's final stable time, with nothing left waiting anywhere.
//!
//! `SEED=n cargo test -p causeway-core --test eunomia` replays one schedule,
//! `SEEDS=a..b` runs more.

use bytes::Bytes;
use causeway_core::geo::receiver::{Receiver, ReceiverMsg, ReceiverOut, RemoteValue, ValuesAck};
use causeway_core::geo::reporter::{Batch, Reporter};
use causeway_core::geo::stabilizer::{IdBatch, IdVector, IdsAck, Position, ReplicaId, Stabilizer, StabilizerMsg, StabilizerOut, UpdateId};
use causeway_core::hlc::{Clock, Timestamp};
use causeway_core::ring::PartitionId;
use causeway_core::version::{SiteId, VersionVector};
use causeway_sim::Rng;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Bound;

const SITES: usize = 3;
const PARTITIONS: u32 = 4;
const REPLICAS: ReplicaId = 3;
const SESSIONS: usize = 4;
const WRITES_END_MS: u64 = 2_000;
const PROMISES_END_MS: u64 = 2_500;
const FAULTS_END_MS: u64 = 3_000;
/// Long enough after the last fault for streams that backed off during a
/// long cut to resume: a reporter's resend and then a shipment's, each up
/// to `MAX_RESEND_MS` (2 s) apart. 7 s left seeds 40 and 166 of 0..300
/// short of converging (they converge by 8 s).
const RUN_MS: u64 = 10_000;
/// One-way delay between sites, as in the Eunomia paper's setup.
const WAN_MS: [[u64; SITES]; SITES] = [[0, 40, 40], [40, 0, 80], [40, 80, 0]];
/// Each site's wall clock is off by this much.
const SKEW_MS: [i64; SITES] = [0, 30, -20];

enum Event {
    Replica { site: usize, replica: ReplicaId, msg: StabilizerMsg },
    Reporter { site: usize, ack: IdsAck },
    Values { site: usize, ack: ValuesAck },
    Receiver { site: usize, msg: ReceiverMsg },
}

struct Site {
    clocks: Vec<Clock>,
    reporters: Vec<Reporter<ReplicaId, UpdateId>>,
    /// Each partition's value stream to the other sites.
    values: Vec<Reporter<SiteId, RemoteValue>>,
    /// `None` once crashed.
    replicas: Vec<Option<Stabilizer>>,
    leader: ReplicaId,
    term: u64,
    receiver: Receiver,
    /// Each session's vector: what it has seen, per site.
    sessions: Vec<[Timestamp; SITES]>,
    last_write: Vec<Timestamp>,
}

/// What the test knows independently of the protocol.
struct Truth {
    /// Every update written, per origin.
    written: Vec<BTreeSet<Position>>,
    /// The own-site dependency of every update written.
    local_dep: HashMap<(usize, Position), Timestamp>,
    /// Per applying site and origin: updates stable there, and how often.
    stable: Vec<Vec<BTreeMap<Position, u32>>>,
    /// Per applying site and origin: every written update up to here is stable there.
    prefix: Vec<Vec<Position>>,
    /// Per applying site and origin: the last update handed out.
    handed_out: Vec<Vec<Position>>,
}

impl Truth {
    fn new() -> Truth {
        Truth {
            written: vec![BTreeSet::new(); SITES],
            local_dep: HashMap::new(),
            stable: vec![vec![BTreeMap::new(); SITES]; SITES],
            prefix: vec![vec![Position::START; SITES]; SITES],
            handed_out: vec![vec![Position::START; SITES]; SITES],
        }
    }

    /// Whether every update of `origin` with timestamp <= `ts` is stable at `site`.
    fn all_stable(&mut self, site: usize, origin: usize, ts: Timestamp) -> bool {
        let mut prefix = self.prefix[site][origin];
        for pos in self.written[origin].range((Bound::Excluded(prefix), Bound::Unbounded)) {
            if !self.stable[site][origin].contains_key(pos) {
                break;
            }
            prefix = *pos;
        }
        self.prefix[site][origin] = prefix;
        Position::through(ts) <= prefix
            || self.written[origin].range((Bound::Excluded(prefix), Bound::Included(Position::through(ts)))).next().is_none()
    }
}

struct Sim {
    seed: u64,
    rng: Rng,
    now: u64,
    seq: u64,
    net: BTreeMap<(u64, u64), Event>,
    sites: Vec<Site>,
    /// Until when the link between two sites is cut (both ways).
    cut_until: [[u64; SITES]; SITES],
    truth: Truth,
    applies: u64,
}

impl Sim {
    fn new(seed: u64) -> Sim {
        let all: Vec<SiteId> = (0..SITES as SiteId).collect();
        let replica_ids: Vec<ReplicaId> = (0..REPLICAS).collect();
        let sites = (0..SITES)
            .map(|s| Site {
                clocks: (0..PARTITIONS).map(|_| Clock::default()).collect(),
                reporters: (0..PARTITIONS).map(|p| Reporter::new(p, &replica_ids)).collect(),
                values: {
                    let others: Vec<SiteId> = all.iter().copied().filter(|&o| o != s as SiteId).collect();
                    (0..PARTITIONS).map(|p| Reporter::new(p, &others)).collect()
                },
                replicas: (0..REPLICAS).map(|r| Some(Stabilizer::new(s as SiteId, r, PARTITIONS, &all))).collect(),
                leader: 0,
                term: 1,
                receiver: Receiver::new(s as SiteId, &all, &VersionVector::default()),
                sessions: vec![[Timestamp::ZERO; SITES]; SESSIONS],
                last_write: vec![Timestamp::ZERO; PARTITIONS as usize],
            })
            .collect();
        let mut sim = Sim {
            seed,
            rng: Rng::new(seed),
            now: 0,
            seq: 0,
            net: BTreeMap::new(),
            sites,
            cut_until: [[0; SITES]; SITES],
            truth: Truth::new(),
            applies: 0,
        };
        for site in 0..SITES {
            for replica in 0..REPLICAS {
                sim.send(0, Event::Replica { site, replica, msg: StabilizerMsg::Leader { leader: 0, term: 1 } });
            }
        }
        sim
    }

    fn send(&mut self, delay: u64, event: Event) {
        self.seq += 1;
        self.net.insert((self.now + delay, self.seq), event);
    }

    /// The delay of a message between sites, or `None` if it is lost.
    fn wan(&mut self, from: usize, to: usize) -> Option<u64> {
        let cut = self.cut_until[from][to] > self.now;
        let lost = self.rng.below(100) < 2;
        let delay = WAN_MS[from][to] + self.rng.below(25);
        (!cut && !lost).then_some(delay)
    }

    /// Cuts the link between two sites for 100 to 700 ms.
    fn cut_link(&mut self) {
        let a = self.rng.below(SITES as u64) as usize;
        let b = (a + 1 + self.rng.below(SITES as u64 - 1) as usize) % SITES;
        let until = self.now + 100 + self.rng.below(600);
        self.cut_until[a][b] = until;
        self.cut_until[b][a] = until;
    }

    fn wall(&self, site: usize) -> u64 {
        (self.now as i64 + 1_000 + SKEW_MS[site]) as u64
    }

    fn run(&mut self) {
        while self.now < RUN_MS {
            while let Some(entry) = self.net.first_entry() {
                if entry.key().0 > self.now {
                    break;
                }
                let event = entry.remove();
                self.deliver(event);
            }
            for site in 0..SITES {
                self.sessions_act(site);
                self.partitions_tick(site);
                self.stabilizers_tick(site);
                self.receiver_tick(site);
                if self.now < FAULTS_END_MS && self.rng.below(300) == 0 {
                    self.leader_fault(site);
                }
            }
            if self.now < FAULTS_END_MS && self.rng.below(150) == 0 {
                self.cut_link();
            }
            self.now += 1;
        }
    }

    fn deliver(&mut self, event: Event) {
        let now = self.now;
        match event {
            Event::Replica { site, replica, msg } => {
                let Some(r) = self.sites[site].replicas[replica as usize].as_mut() else { return };
                let mut out = Vec::new();
                r.step(msg, now, &mut out);
                self.stabilizer_out(site, out);
            }
            Event::Reporter { site, ack } => ack.deliver(&mut self.sites[site].reporters[ack.partition as usize], now),
            Event::Values { site, ack } => {
                self.sites[site].values[ack.partition as usize].on_ack(ack.from, ack.received, ack.applied, ack.resend, now)
            }
            Event::Receiver { site, msg } => {
                if let ReceiverMsg::Applied { origin, partition, ts } = &msg {
                    let count = self.truth.stable[site][*origin as usize].entry(Position { ts: *ts, partition: *partition }).or_default();
                    *count += 1;
                    assert_eq!(*count, 1, "seed {}: site {site} applied {ts}@{origin} twice", self.seed);
                }
                let mut out = Vec::new();
                self.sites[site].receiver.step(msg, &mut out);
                self.receiver_out(site, out);
            }
        }
    }

    /// Sessions write (with what they saw as dependencies) and read (local
    /// writes, and remote updates as far as this site has applied them).
    fn sessions_act(&mut self, site: usize) {
        if self.now >= WRITES_END_MS {
            return;
        }
        let wall = self.wall(site);
        for s in 0..SESSIONS {
            match self.rng.below(20) {
                0..=1 => {
                    let partition = self.rng.below(PARTITIONS as u64) as PartitionId;
                    let seen = self.sites[site].sessions[s];
                    let ts = self.sites[site].clocks[partition as usize].tick(wall, seen[site]);
                    let mut vv: IdVector = seen.iter().copied().collect();
                    vv[site] = ts;
                    let id = UpdateId { partition, ts, local_dep: seen[site], vv };
                    self.sites[site].sessions[s][site] = ts;
                    self.sites[site].last_write[partition as usize] = ts;
                    assert!(self.sites[site].reporters[partition as usize].record(id));
                    self.truth.written[site].insert(Position { ts, partition });
                    self.truth.local_dep.insert((site, Position { ts, partition }), seen[site]);
                    // Values go straight to the sibling partitions, over the same lossy links as
                    // everything else: sometimes before their ids, sometimes after.
                    let key = Bytes::from(format!("{site}/{partition}/{ts}"));
                    let value =
                        RemoteValue { origin: site as SiteId, partition, ts, key, value: Some(Bytes::from("v")), expires_at_ms: None };
                    assert!(self.sites[site].values[partition as usize].record(value));
                }
                2..=4 => {
                    let partition = self.rng.below(PARTITIONS as u64) as usize;
                    let read = self.sites[site].last_write[partition];
                    let seen = &mut self.sites[site].sessions[s][site];
                    *seen = (*seen).max(read);
                }
                5..=7 => {
                    let origin = self.rng.below(SITES as u64) as usize;
                    if origin != site {
                        let visible = self.sites[site].receiver.applied().get(origin as SiteId);
                        let seen = &mut self.sites[site].sessions[s][origin];
                        *seen = (*seen).max(visible);
                    }
                }
                _ => {}
            }
        }
    }

    /// Every partition promises its clock (partition 0 of site 1 only every
    /// 50 ms: a straggler) and reports to every replica.
    fn partitions_tick(&mut self, site: usize) {
        let wall = self.wall(site);
        for p in 0..PARTITIONS as usize {
            let straggler = site == 1 && p == 0;
            if self.now < PROMISES_END_MS && (!straggler || self.now.is_multiple_of(50)) {
                let clock = &mut self.sites[site].clocks[p];
                let promise = clock.last().max(Timestamp::new(wall, 0));
                clock.observe(promise);
                self.sites[site].reporters[p].promise(promise);
                self.sites[site].values[p].promise(promise);
            }
            let mut values: Vec<(SiteId, Batch<RemoteValue>)> = Vec::new();
            self.sites[site].values[p].tick(self.now, &mut values);
            for (to, batch) in values {
                if let Some(delay) = self.wan(site, to as usize) {
                    self.send(delay, Event::Receiver { site: to as usize, msg: ReceiverMsg::Values { origin: site as SiteId, batch } });
                }
            }
            let mut batches: Vec<(ReplicaId, IdBatch)> = Vec::new();
            self.sites[site].reporters[p].tick(self.now, &mut batches);
            for (replica, batch) in batches {
                if self.rng.below(100) >= 2 {
                    let delay = self.rng.below(3);
                    self.send(delay, Event::Replica { site, replica, msg: StabilizerMsg::Ids(batch) });
                }
            }
        }
    }

    fn stabilizers_tick(&mut self, site: usize) {
        for r in 0..REPLICAS as usize {
            let mut out = Vec::new();
            let Some(replica) = self.sites[site].replicas[r].as_mut() else { continue };
            replica.tick(self.now, &mut out);
            self.stabilizer_out(site, out);
        }
    }

    fn stabilizer_out(&mut self, site: usize, out: Vec<StabilizerOut>) {
        for o in out {
            match o {
                StabilizerOut::IdsAck(ack) => {
                    if self.rng.below(100) >= 2 {
                        let delay = self.rng.below(3);
                        self.send(delay, Event::Reporter { site, ack });
                    }
                }
                StabilizerOut::Ship(ship) => {
                    let to = ship.to as usize;
                    if let Some(delay) = self.wan(site, to) {
                        self.send(delay, Event::Receiver { site: to, msg: ReceiverMsg::Ship(ship) });
                    }
                }
            }
        }
    }

    fn receiver_tick(&mut self, site: usize) {
        let mut out = Vec::new();
        // The site's disks sync at once (fsync=always): what is applied is
        // durable.
        let receiver = &mut self.sites[site].receiver;
        receiver.mark(self.now);
        receiver.synced(self.now);
        receiver.tick(self.now, &mut out);
        self.receiver_out(site, out);
    }

    fn receiver_out(&mut self, site: usize, out: Vec<ReceiverOut>) {
        for o in out {
            match o {
                ReceiverOut::Ack(ack) => {
                    let origin = ack.origin as usize;
                    for replica in 0..REPLICAS {
                        if let Some(delay) = self.wan(site, origin) {
                            self.send(delay, Event::Replica { site: origin, replica, msg: StabilizerMsg::SiteAck(ack) });
                        }
                    }
                }
                ReceiverOut::ValuesAck(ack) => {
                    if let Some(delay) = self.wan(site, ack.origin as usize) {
                        self.send(delay, Event::Values { site: ack.origin as usize, ack });
                    }
                }
                ReceiverOut::Apply(write) => {
                    self.check_apply(site, &write.version.vv, write.version.site as usize, write.partition);
                    // Through the local chain: stable at the tail a little later.
                    let (origin, partition, ts) = (write.version.site, write.partition, write.version.ts);
                    let delay = 1 + self.rng.below(3);
                    self.send(delay, Event::Receiver { site, msg: ReceiverMsg::Applied { origin, partition, ts } });
                }
            }
        }
    }

    /// An update handed out at `site` comes after the previous one of its
    /// origin, and everything it depends on is already stable at `site`.
    fn check_apply(&mut self, site: usize, vv: &VersionVector, origin: usize, partition: PartitionId) {
        let seed = self.seed;
        let ts = vv.get(origin as SiteId);
        let pos = Position { ts, partition };
        assert!(pos > self.truth.handed_out[site][origin], "seed {seed}: site {site} got {ts}@{origin} out of order");
        self.truth.handed_out[site][origin] = pos;
        for d in (0..SITES).filter(|&d| d != site && d != origin) {
            let dep = vv.get(d as SiteId);
            assert!(self.truth.all_stable(site, d, dep), "seed {seed}: site {site} applies {ts}@{origin} before its dependency {dep}@{d}");
        }
        // The writer's causal past in its own site, as the test recorded it.
        let local_dep = self.truth.local_dep[&(origin, pos)];
        assert!(
            self.truth.all_stable(site, origin, local_dep),
            "seed {seed}: site {site} applies {ts}@{origin} before {local_dep}@{origin}"
        );
        self.applies += 1;
    }

    /// Crash the leader (keeping at least one replica alive) or hand the
    /// leadership to another live replica without telling the old one at once.
    fn leader_fault(&mut self, site: usize) {
        let live: Vec<ReplicaId> = (0..REPLICAS).filter(|&r| self.sites[site].replicas[r as usize].is_some()).collect();
        let old = self.sites[site].leader;
        let crash = live.len() > 1 && (self.rng.below(100) < 50);
        if crash {
            self.sites[site].replicas[old as usize] = None;
        }
        let candidates: Vec<ReplicaId> = live.iter().copied().filter(|&r| r != old || live.len() == 1).collect();
        let new = candidates[self.rng.below(candidates.len() as u64) as usize];
        self.sites[site].leader = new;
        self.sites[site].term += 1;
        let msg = StabilizerMsg::Leader { leader: new, term: self.sites[site].term };
        for replica in live {
            let delay = if replica == old { 20 + self.rng.below(60) } else { self.rng.below(5) };
            self.send(delay, Event::Replica { site, replica, msg: msg.clone() });
        }
    }

    fn check_end(&mut self) {
        let seed = self.seed;
        for origin in 0..SITES {
            let leader = self.sites[origin].leader as usize;
            let stable = self.sites[origin].replicas[leader].as_ref().expect("the leader is alive").stable_time();
            assert!(stable >= Timestamp::new(WRITES_END_MS, 0), "seed {seed}: site {origin} stable time stuck at {stable}");
            for site in (0..SITES).filter(|&s| s != origin) {
                let written = &self.truth.written[origin];
                let stable_here = &self.truth.stable[site][origin];
                assert_eq!(
                    stable_here.len(),
                    written.len(),
                    "seed {seed}: site {site} applied {} of {} updates of site {origin}",
                    stable_here.len(),
                    written.len()
                );
                assert!(written.iter().all(|p| stable_here.get(p) == Some(&1)), "seed {seed}: site {site} misses an update of {origin}");
                let vector = self.sites[site].receiver.applied().get(origin as SiteId);
                assert_eq!(vector, stable, "seed {seed}: site {site} sees site {origin} at {vector}, its stable time is {stable}");
            }
            for r in self.sites[origin].replicas.iter().flatten() {
                assert_eq!(r.held(), 0, "seed {seed}: a replica of site {origin} still holds ids every site applied");
            }
            assert_eq!(self.sites[origin].receiver.waiting() + self.sites[origin].receiver.in_flight(), 0);
            for v in &self.sites[origin].values {
                assert_eq!(v.unacked(), 0, "seed {seed}: site {origin} keeps values every site applied");
            }
        }
        assert!(self.applies > 1000, "seed {seed}: only {} remote applies", self.applies);
    }
}

#[test]
fn three_sites_apply_every_update_once_in_causal_order_and_converge() {
    let seeds: Vec<u64> = if let Ok(seed) = std::env::var("SEED") {
        vec![seed.parse().expect("SEED is a number")]
    } else if let Ok(range) = std::env::var("SEEDS") {
        let (a, b) = range.split_once("..").expect("SEEDS is a..b");
        (a.parse().expect("a number")..b.parse().expect("a number")).collect()
    } else {
        (0..4).collect()
    };
    for seed in seeds {
        let mut sim = Sim::new(seed);
        sim.run();
        sim.check_end();
    }
}
