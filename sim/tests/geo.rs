//! Several active-active sites (Eunomia over ChainReaction chains): real
//! node state machines in three simulated sites joined by wide-area links.
//! Clients in every site write and read; at the end every site must hold
//! the same data, every acknowledged write must be in every site, and the
//! whole history must be causal+ across sites (a client that reads a
//! remote write, then writes, is never seen elsewhere before what it read).
//!
//! `SEED=n cargo test -p causeway-sim --test geo` replays one schedule,
//! `SEEDS=a..b` runs more.

use bytes::Bytes;
use causeway_checker::replicas;
use causeway_core::driver::{Request, Response};
use causeway_core::geo::Replication;
use causeway_core::hlc::Timestamp;
use causeway_core::message::Change;
use causeway_core::ring::{PartitionId, Shape};
use causeway_core::session::Session;
use causeway_core::tier::CachePolicy;
use causeway_core::version::SiteId;
use causeway_core::version::Version;
use causeway_sim::check::CausalChecker;
use causeway_sim::workload::seeds;
use causeway_sim::world::{Wan, World};
use causeway_sim::TICK_MS;
use causeway_sim::{Completed, Fsync, Network, Rng, SimTier, Straggler};
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};

const SITES: usize = 3;
const CLIENTS: usize = 4;
const KEYS: u64 = 12;

struct Geo {
    replication: Replication,
    wan: Wan,
    network: Network,
    duration_ms: u64,
    faults: Faults,
    /// A disk tier on every node of every site.
    tier: Option<SimTier>,
}

/// Which faults strike while clients run.
#[derive(Clone, Copy, Default)]
struct Faults {
    /// Links between sites cut for 100 ms to 1 s.
    cuts: bool,
    /// Nodes killed (the stabilizer leader among them) and restarted from
    /// their logs a little later, one at a time per site.
    crashes: bool,
    /// A whole site killed and restarted from its logs.
    site_restart: bool,
    /// A site's clocks jump up to 3 s ahead or behind, and stay so (until
    /// its nodes restart).
    skews: bool,
    /// Disks sync once a second (`fsync=everysec`): a crash loses what its
    /// node wrote since. The site restarted whole may lose its own writes
    /// acknowledged since its disks last synced (that contract), then
    /// everywhere alike, but never what it applied of the others.
    unsynced_disks: bool,
}

/// Faults in flight: nodes to restart, by when.
#[derive(Default)]
struct Striking {
    restarts: Vec<(u64, usize, u16)>,
    site_restarted: bool,
}

impl Striking {
    /// Strikes; returns the site it restarted whole, if it did.
    fn step(&mut self, f: Faults, world: &mut World, rng: &mut Rng) -> Option<usize> {
        let now = world.now_ms();
        let (due, later): (Vec<_>, Vec<_>) = self.restarts.drain(..).partition(|&(at, _, _)| at <= now);
        self.restarts = later;
        for (_, site, node) in due {
            world.sites[site].restart(node);
        }
        if f.cuts && rng.chance(0.002) {
            let a = rng.below(SITES as u64) as usize;
            let b = (a + 1 + rng.below(SITES as u64 - 1) as usize) % SITES;
            world.cut(a, b, 100 + rng.below(900));
        }
        if f.crashes && rng.chance(0.002) {
            let site = rng.below(SITES as u64) as usize;
            // With unsynced disks, a node crashes only once its site's
            // chains are whole again: two replicas of a chain that lose
            // their last second together lose acknowledged writes, which
            // `fsync=everysec` allows (and the checks would flag).
            let s = &world.sites[site];
            let whole = |s: &causeway_sim::Sim| {
                s.healed() && (0..s.node_count() as u16).all(|n| s.node(n).joining_replicas() + s.node(n).catching_up_replicas() == 0)
            };
            if !self.restarts.iter().any(|&(_, s, _)| s == site) && (!f.unsynced_disks || whole(s)) {
                let node = rng.below(world.sites[site].node_count() as u64) as u16;
                world.sites[site].crash(node);
                self.restarts.push((now + 200 + rng.below(1_500), site, node));
            }
        }
        if f.skews && rng.chance(0.002) {
            let site = rng.below(SITES as u64) as usize;
            world.sites[site].skew_clocks(rng.below(6_001) as i64 - 3_000);
        }
        if f.site_restart && !self.site_restarted && rng.chance(0.001) && self.restarts.is_empty() {
            self.site_restarted = true;
            let site = rng.below(SITES as u64) as usize;
            for node in 0..world.sites[site].node_count() as u16 {
                world.sites[site].crash(node);
                self.restarts.push((now + 300 + rng.below(300), site, node));
            }
            return Some(site);
        }
        None
    }
}

/// Runs one schedule and checks it; returns the causal+ violations found
/// (none but with the eventual baseline: the check fails the run).
fn run(seed: u64, geo: &Geo) -> Vec<String> {
    let shape = Shape { partitions: 8, replicas: 3, k: 2, coding: None };
    let mut world = World::new(seed, SITES, geo.replication, 3, shape, CLIENTS, geo.network.clone(), geo.wan.clone());
    if let Some(tier) = geo.tier {
        world.sites = std::mem::take(&mut world.sites).into_iter().map(|s| s.with_tier(tier)).collect();
    }
    // With a tier, values big enough that the budget's pulses move them.
    let pad = if geo.tier.is_some() { "-".repeat(100) } else { String::new() };
    if geo.faults.unsynced_disks {
        for s in &mut world.sites {
            s.fsync = Fsync::EverySec;
        }
    }
    let mut rng = Rng::new(seed ^ 0x5EED);
    let mut checker = CausalChecker::default();
    let global = |site: usize, client: usize| site * 100_000 + client;
    // The client each slot uses: one whose request fails is replaced by a
    // new session, as a Redis client reconnects (its causal past starts
    // empty, and its writes rest on the clocks alone).
    let mut slots: Vec<Vec<usize>> = vec![(0..CLIENTS).collect(); SITES];
    // When each acknowledged write was seen acknowledged (at or after the
    // moment it was).
    let acked_ms: RefCell<HashMap<Version, u64>> = RefCell::default();
    // Sessions that moved to another site (`Request::Resume`): the new
    // client is the same session to the checker.
    let mut alias: HashMap<(usize, usize), usize> = HashMap::new();
    let record = |checker: &mut CausalChecker,
                  world: &mut World,
                  slots: &mut Vec<Vec<usize>>,
                  alias: &HashMap<(usize, usize), usize>,
                  done: Vec<(usize, Completed)>| {
        for (site, mut c) in done {
            if let (Ok(_), Some(v)) = (&c.result, &c.written) {
                acked_ms.borrow_mut().insert(v.clone(), world.now_ms());
            }
            if c.result.is_err() {
                if let Some(slot) = slots[site].iter_mut().find(|s| **s == c.client) {
                    *slot = world.sites[site].add_client(None);
                }
            }
            c.client = alias.get(&(site, c.client)).copied().unwrap_or(global(site, c.client));
            checker.completed(&c);
        }
    };
    let key = |i: u64| Bytes::from(format!("key{i}"));
    let end = world.now_ms() + geo.duration_ms;
    let mut writes = 0;
    let mut striking = Striking::default();
    // With unsynced disks: the site restarted whole, and since when its
    // acknowledged writes may be lost.
    let mut lost_since: Option<(usize, u64)> = None;
    // Sessions that outlive their site's crash: when they come back, as (when, site, slot, global id, session). Their
    // slot issues nothing until then.
    let mut comeback: Vec<(u64, usize, usize, usize, Session)> = Vec::new();
    while world.now_ms() < end {
        let now = world.now_ms();
        for (_, site, slot, id, session) in comeback.extract_if(.., |c| c.0 <= now) {
            // It waits until the site has applied the other sites' writes
            // it saw (the site may have lost what it showed of them, and
            // gets them back), then goes on.
            let back = world.sites[site].add_client(None);
            alias.insert((site, back), id);
            slots[site][slot] = back;
            for c in world.sites[site].start(back, Request::Resume(Box::new(session))) {
                record(&mut checker, &mut world, &mut slots, &alias, vec![(site, c)]);
            }
        }
        for site in 0..SITES {
            for slot in 0..CLIENTS {
                let client = slots[site][slot];
                if comeback.iter().any(|c| (c.1, c.2) == (site, slot)) {
                    continue;
                }
                if !world.sites[site].is_idle(client) || !rng.chance(0.3) {
                    continue;
                }
                let request = match rng.below(10) {
                    0..=3 => {
                        writes += 1;
                        let value = Bytes::from(format!("s{site}c{client}w{writes}{pad}"));
                        checker.issued_write(global(site, client), &value);
                        Request::Put { key: key(rng.below(KEYS)), change: Change::set(value) }
                    }
                    4..=7 => Request::Get(key(rng.below(KEYS))),
                    _ => {
                        let mut ks: Vec<Bytes> = (0..2 + rng.below(3)).map(|_| key(rng.below(KEYS))).collect();
                        ks.sort();
                        ks.dedup();
                        Request::MultiGet(ks)
                    }
                };
                for c in world.sites[site].start(client, request) {
                    record(&mut checker, &mut world, &mut slots, &alias, vec![(site, c)]);
                }
            }
        }
        // Now and then two idle sessions of different sites trade places
        // (`CW.SESSION EXPORT` and `RESUME`): each waits until its new
        // site has applied what it saw, then goes on there.
        if rng.chance(0.01) {
            let (a, b) = (rng.below(SITES as u64) as usize, rng.below(SITES as u64) as usize);
            let (i, j) = (rng.below(CLIENTS as u64) as usize, rng.below(CLIENTS as u64) as usize);
            let (ca, cb) = (slots[a][i], slots[b][j]);
            if a != b && world.sites[a].is_idle(ca) && world.sites[b].is_idle(cb) {
                for (from, client, to, other) in [(a, ca, b, j), (b, cb, a, i)] {
                    let session = world.sites[from].session(client);
                    let moved = world.sites[to].add_client(None);
                    alias.insert((to, moved), alias.get(&(from, client)).copied().unwrap_or(global(from, client)));
                    slots[to][other] = moved;
                    for c in world.sites[to].start(moved, Request::Resume(Box::new(session))) {
                        record(&mut checker, &mut world, &mut slots, &alias, vec![(to, c)]);
                    }
                }
            }
        }
        if let (Some(site), true) = (striking.step(geo.faults, &mut world, &mut rng), geo.faults.unsynced_disks) {
            // Its disks last synced on the last whole second.
            let since = world.now_ms() / 1_000 * 1_000;
            lost_since = Some((site, since));
            // Every connection to the site died with it, requests in
            // flight too. What the site showed of the last second was not
            // on its disks: its own writes since are lost (the contract of
            // `fsync=everysec`), other sites' it gets back. Half the idle
            // sessions come back after the restart with their past (as
            // `CW.SESSION RESUME` brings one: `Request::Resume` waits for
            // the other sites' writes it saw; its own site's lost writes
            // leave its past); the others start anew, as a Redis client
            // reconnecting does.
            let acked = acked_ms.borrow();
            for (i, slot) in slots[site].iter_mut().enumerate() {
                if rng.chance(0.5) && world.sites[site].is_idle(*slot) {
                    let id = alias.get(&(site, *slot)).copied().unwrap_or(global(site, *slot));
                    checker.forget(id, |v| v.site as usize == site && acked.get(v).is_none_or(|&at| at >= since));
                    comeback.push((world.now_ms() + 1_000, site, i, id, world.sites[site].session(*slot)));
                }
                world.sites[site].disconnect(*slot);
                *slot = world.sites[site].add_client(None);
            }
        }
        let step = world.now_ms() + 1 + rng.below(3);
        let done = world.run_until(step);
        record(&mut checker, &mut world, &mut slots, &alias, done);
    }
    for (_, site, node) in striking.restarts.drain(..) {
        world.sites[site].restart(node);
    }
    for s in &mut world.sites {
        s.network.drop_rate = 0.0;
    }
    world.wan.drop_rate = 0.0;
    for _ in 0..600 {
        let until = world.now_ms() + 100;
        let done = world.run_until(until);
        record(&mut checker, &mut world, &mut slots, &alias, done);
        let idle = world.sites.iter().zip(&slots).all(|(s, slots)| slots.iter().all(|&c| s.is_idle(c)));
        if idle && world.quiet() {
            break;
        }
    }
    for (i, s) in world.sites.iter().enumerate() {
        assert!(s.healed() && s.settled(), "seed {seed}: site {i} did not settle:\n{}", s.history());
        assert!(s.geo_idle(), "seed {seed}: site {i} still has geo work: {}", geo_state(&world));
        for n in 0..s.node_count() as u16 {
            let out_of_order = s.node(n).geo().map_or(0, |g| g.out_of_order());
            assert_eq!(out_of_order, 0, "seed {seed}: site {i} node {n} could not report updates in timestamp order");
        }
    }
    if geo.replication != Replication::Eventual {
        assert!(checker.violations.is_empty(), "seed {seed}: causal+ violated:\n{}", checker.violations.join("\n"));
    }
    if let Some((site, since)) = lost_since {
        let acked = acked_ms.borrow();
        let lost = |v: &Version| v.site as usize == site && acked.get(v).is_none_or(|&at| at >= since);
        checker.acknowledged.retain(|(_, v)| !lost(v));
    }
    let data = identical(&world, seed, &checker);
    if geo.tier.is_some() {
        let (mut moved_out, mut misses) = (0, 0);
        for s in &world.sites {
            for n in 0..s.node_count() as u16 {
                let (_, stats) = s.node(n).tier_stats().expect("every node has a tier");
                (moved_out, misses) = (moved_out + stats.moved_out, misses + stats.misses);
            }
        }
        assert!(moved_out > 0 && misses > 0, "seed {seed}: the tier was not used: {moved_out} moved out, {misses} misses");
        println!("seed {seed}: {moved_out} values moved out, {misses} requests waited for the disk");
    }
    assert!(checker.acknowledged.len() > 50, "seed {seed}: only {} writes acknowledged", checker.acknowledged.len());
    let conflicts: u64 = world.sites.iter().map(|s| (0..s.node_count() as u16).map(|n| s.node(n).conflicts()).sum::<u64>()).sum();
    println!(
        "seed {seed}: {} writes acknowledged, {} reads and {} snapshots checked, {} keys, {} messages between sites ({} lost), {conflicts} conflicts, quiet at {} ms",
        checker.acknowledged.len(),
        checker.reads_checked,
        checker.snapshots_checked,
        data.len(),
        world.carried,
        world.lost,
        world.now_ms()
    );
    checker.violations
}

/// Every site's replicas converged and hold every acknowledged write, and
/// every site holds the same data: site 0's, by key.
/// A site's data: each key's latest write, named by (timestamp, site) (the
/// eventual baseline applies remote writes without their vectors), and value.
type SiteData = BTreeMap<Bytes, ((Timestamp, SiteId), Option<Bytes>)>;

fn identical(world: &World, seed: u64, checker: &CausalChecker) -> SiteData {
    let data: Vec<SiteData> = world
        .sites
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let digests = s.digests();
            if let Err(e) = replicas::converged(&digests).and_then(|()| replicas::durable(&digests, &checker.acknowledged)) {
                panic!("seed {seed}: site {i}: {e}\n{}", s.history());
            }
            digests
                .iter()
                .flat_map(|p| p[0].latest.iter().map(|(k, v)| (k.clone(), ((v.version.ts, v.version.site), v.value.clone()))))
                .collect()
        })
        .collect();
    for (i, d) in data.iter().enumerate().skip(1) {
        assert_eq!(d, &data[0], "seed {seed}: site {i} holds other data than site 0");
    }
    data.into_iter().next().expect("sites")
}

fn geo_state(world: &World) -> String {
    let mut lines = Vec::new();
    for (i, s) in world.sites.iter().enumerate() {
        for n in 0..s.node_count() as u16 {
            if let Some(g) = s.node(n).geo() {
                lines.push(format!("site {i} node {n}: unreported {}, backlog {}, applied {:?}", g.unreported(), g.backlog(), g.applied()));
                lines.push(g.describe());
            }
        }
    }
    lines.join("\n")
}

#[test]
fn three_sites_converge_causally() {
    let geo = Geo {
        replication: Replication::Causal,
        wan: Wan::paper(SITES),
        network: Network::default(),
        duration_ms: 2_000,
        faults: Faults::default(),
        tier: None,
    };
    for seed in seeds(0..5) {
        run(seed, &geo);
    }
}

/// Site 0's updates take far longer to reach site 2 than anything through
/// site 1: site 2 often receives a write of site 1 before the write of site
/// 0 it depends on (Eunomia Alg. 5: the receiver must hold it back).
#[test]
fn a_write_waits_for_its_dependency_from_a_third_site() {
    let mut wan = Wan::paper(SITES);
    wan.delay_ms = vec![vec![0, 10, 300], vec![10, 0, 10], vec![300, 10, 0]];
    let geo = Geo {
        replication: Replication::Causal,
        wan,
        network: Network::default(),
        duration_ms: 2_000,
        faults: Faults::default(),
        tier: None,
    };
    for seed in seeds(0..5) {
        run(seed, &geo);
    }
}

/// The eventual baseline (`Replication::Eventual`) on the same schedules:
/// values applied as they arrive converge everywhere with nothing lost, but
/// site 2 shows site 1's writes before the site-0 writes they depend on, and
/// the causal+ checker must say so (the baseline is what the receiver's
/// dependency check prevents).
#[test]
fn the_eventual_baseline_converges_but_breaks_causality() {
    let mut wan = Wan::paper(SITES);
    wan.delay_ms = vec![vec![0, 10, 300], vec![10, 0, 10], vec![300, 10, 0]];
    let geo = Geo {
        replication: Replication::Eventual,
        wan,
        network: Network::default(),
        duration_ms: 2_000,
        faults: Faults::default(),
        tier: None,
    };
    let violations: usize = seeds(0..3).into_iter().map(|seed| run(seed, &geo).len()).sum();
    println!("eventual: {violations} causal+ violations");
    assert!(violations > 0, "the eventual baseline showed no effect before its cause: the checker or the baseline is broken");
}

/// Messages lost inside sites and between them, links between sites cut.
/// Every node of every site with a disk tier whose budget keeps moving
/// values out and back (`SimTier`; one batch of its work in ten fails),
/// under cuts, crashes and a site restarted whole: remote writes land on
/// keys whose values are on disk, reads bring them back, and every check
/// holds as without the tier.
#[test]
fn three_sites_with_values_on_disk() {
    let faults = Faults { cuts: true, crashes: true, site_restart: true, ..Faults::default() };
    let tier = Some(SimTier { policy: CachePolicy::Lru, fail_chance: 0.1 });
    let geo = Geo { replication: Replication::Causal, wan: lossy_wan(), network: lossy_network(), duration_ms: 4_000, faults, tier };
    for seed in seeds(0..4) {
        run(seed, &geo);
    }
}

#[test]
fn lossy_links_and_cuts() {
    let geo = Geo {
        replication: Replication::Causal,
        wan: lossy_wan(),
        network: lossy_network(),
        duration_ms: 4_000,
        faults: Faults { cuts: true, ..Faults::default() },
        tier: None,
    };
    for seed in seeds(0..5) {
        run(seed, &geo);
    }
}

/// The same, with nodes killed and restarted (stabilizer leaders and
/// receivers among them) and a whole site restarted from its logs.
#[test]
fn crashes_and_a_site_restart() {
    let faults = Faults { cuts: true, crashes: true, site_restart: true, ..Faults::default() };
    let geo = Geo { replication: Replication::Causal, wan: lossy_wan(), network: lossy_network(), duration_ms: 4_000, faults, tier: None };
    for seed in seeds(0..5) {
        run(seed, &geo);
    }
}

/// Disks that sync once a second, and the whole-site restart of a site
/// whose disks had not synced its last moments. What it had applied of
/// the others it gets again (its origins forget only what it applied
/// durably). Its own writes since its last sync may be lost (that
/// contract), but then everywhere: its tails report to the other sites
/// only what their disks hold, so every site still converges, with every
/// other acknowledged write. (Seeds 25 and 26 diverge when tails report
/// what they applied.)
#[test]
fn a_site_restarted_whole_loses_only_its_own_unsynced_writes_and_gets_back_the_others() {
    let faults = Faults { cuts: true, crashes: true, site_restart: true, unsynced_disks: true, ..Faults::default() };
    let geo = Geo { replication: Replication::Causal, wan: lossy_wan(), network: lossy_network(), duration_ms: 4_000, faults, tier: None };
    for seed in seeds(0..27) {
        run(seed, &geo);
    }
}

/// The S-Seq baseline (`Replication::Sequenced`: every head waits for a
/// number from its site's sequencer, on the stabilizer leader, before
/// ordering a write) under the same faults: writes whose number is lost
/// with a crashed leader are refused and retried, and everything the
/// Eunomia checks ask still holds.
#[test]
fn the_sequenced_baseline_under_crashes() {
    let faults = Faults { cuts: true, crashes: true, site_restart: true, ..Faults::default() };
    let geo =
        Geo { replication: Replication::Sequenced, wan: lossy_wan(), network: lossy_network(), duration_ms: 4_000, faults, tier: None };
    for seed in seeds(0..3) {
        run(seed, &geo);
    }
}

/// Sites' clocks jump ahead and behind (and stay off) while links are cut
/// and nodes crash: hybrid timestamps keep causality, last-writer-wins
/// still converges, and nothing acknowledged is lost.
#[test]
fn skewed_clocks() {
    let faults = Faults { cuts: true, crashes: true, site_restart: true, skews: true, ..Faults::default() };
    let geo = Geo { replication: Replication::Causal, wan: lossy_wan(), network: lossy_network(), duration_ms: 4_000, faults, tier: None };
    for seed in seeds(0..5) {
        run(seed, &geo);
    }
}

fn lossy_wan() -> Wan {
    let mut wan = Wan::paper(SITES);
    wan.drop_rate = 0.02;
    wan.jitter_ms = 30;
    wan
}

fn lossy_network() -> Network {
    Network { min_delay_ms: 0, max_delay_ms: 5, drop_rate: 0.01 }
}

/// Site 2 is cut off from both others for 3 s while 8 clients in each of
/// them write (each a session writing in a loop: its writes depend on one
/// another, the sessions' do not). Once the links return, site 2 catches
/// up and every site holds the same data. How long that takes is printed
/// (BENCHMARKS.md, "Catching up after a cut").
#[test]
fn a_site_cut_off_catches_up() {
    const CUT_MS: u64 = 3_000;
    let clients = 8;
    for seed in seeds(0..1) {
        let shape = Shape { partitions: 8, replicas: 3, k: 2, coding: None };
        let mut world = World::new(seed, SITES, Replication::Causal, 3, shape, clients, Network::default(), Wan::paper(SITES));
        let mut rng = Rng::new(seed ^ 0xCA7C);
        let mut checker = CausalChecker::default();
        world.cut(0, 2, CUT_MS);
        world.cut(1, 2, CUT_MS);
        let end = world.now_ms() + CUT_MS;
        let mut writes = 0;
        while world.now_ms() < end {
            for site in 0..2 {
                for client in 0..clients {
                    if !world.sites[site].is_idle(client) {
                        continue;
                    }
                    writes += 1;
                    let value = Bytes::from(format!("s{site}c{client}w{writes}"));
                    checker.issued_write(site * 100 + client, &value);
                    let key = Bytes::from(format!("key{}", rng.below(1_000)));
                    let put = Request::Put { key, change: Change::set(value) };
                    for mut c in world.sites[site].start(client, put) {
                        c.client += site * 100;
                        checker.completed(&c);
                    }
                }
            }
            let step = world.now_ms() + 1;
            for (site, mut c) in world.run_until(step) {
                c.client += site * 100;
                checker.completed(&c);
            }
        }
        let restored = world.now_ms();
        while !world.quiet() {
            let step = world.now_ms() + 10;
            world.run_until(step);
            assert!(world.now_ms() < restored + 600_000, "seed {seed}: site 2 did not catch up:\n{}", geo_state(&world));
        }
        identical(&world, seed, &checker);
        println!(
            "seed {seed}: {} writes acknowledged in sites 0 and 1 during a {CUT_MS} ms cut; site 2 caught up {} ms after the links returned",
            checker.acknowledged.len(),
            world.now_ms() - restored
        );
    }
}

/// Remote visibility in the simulator (no CPU contention: only the
/// protocol's ticks and hops): a write at site 0, read at site 1, after a
/// random pause (so writes find the site idle or busy). Prints the
/// delay beyond the 40 ms link, and the messages each site delivers and
/// the ticks each node runs per second while idle. Asserts that nobody
/// writing, every node stays idle (`Node::idle`: it ticks only every
/// `IDLE_TICK_MS`) whatever flows between them, that every write shows,
/// and what `run` checks once the sites settle.
#[test]
fn remote_visibility_and_idle_traffic() {
    for seed in seeds(0..1) {
        let mut world = visibility_world(seed, 64);
        let mut rng = Rng::new(seed ^ 0x715);
        let settled = world.now_ms() + 3_000;
        world.run_until(settled);
        let delivered = |w: &World| w.sites.iter().map(|s| s.delivered).sum::<u64>();
        let ticks = |w: &World| w.sites.iter().map(|s| s.ticks).sum::<u64>();
        let (before, ticked, idle_ms) = (delivered(&world), ticks(&world), 2_000);
        while world.now_ms() < settled + idle_ms {
            world.run_until(world.now_ms() + 1);
            for (i, s) in world.sites.iter().enumerate() {
                for n in 0..s.node_count() as u16 {
                    // Promises, shipments and value batches without
                    // updates, and their acknowledgements, make no node
                    // busy: else their flow alone would keep every node
                    // ticking.
                    assert!(s.node(n).idle(), "seed {seed}: site {i} node {n} busy at {} ms with nobody writing", world.now_ms());
                }
            }
        }
        let idle = (delivered(&world) - before) * 1_000 / idle_ms / SITES as u64;
        let nodes: u64 = world.sites.iter().map(|s| s.node_count() as u64).sum();
        let idle_ticks = (ticks(&world) - ticked) * 1_000 / idle_ms / nodes;
        let keys: Vec<Bytes> = (0..8).map(|i| Bytes::from(format!("key{i}"))).collect();
        let mut checker = CausalChecker::default();
        let extra = visibility(&mut world, &mut rng, seed, &keys, 60, 2_000, &mut checker);
        settle_and_check(&mut world, seed, &mut checker);
        let q = |p: usize| quantile(&extra, p);
        // Simulated time, not a timing threshold: with hops of at most
        // 1 ms, a write that waits for no tick on its way (its id and the
        // promises it needs go out as they arrive, `Geo::flush`, and the
        // leader asks for those promises, `GeoMsg::Promise`) shows about
        // one tick beyond the link, its hops alone (8-10 ms at the median
        // over seeds 0..100). When ids and promises waited for ticks, the
        // median was two ticks (20-21 ms).
        let bound = TICK_MS * 3 / 2;
        assert!(q(50) < bound, "seed {seed}: half the writes took {bound} ms or more beyond the link");
        println!(
            "seed {seed}: extra delay at site 1 (ms): p50 {} p90 {} p95 {} p99 {} max {}; idle: {idle} messages per site and {idle_ticks} ticks per node per second",
            q(50),
            q(90),
            q(95),
            q(99),
            extra[extra.len() - 1]
        );
    }
}

/// Eunomia Figure 7 (§7.2.3): one partition of site 0 is a straggler, its
/// reports to the stabilizer (ids and promises) `D` ms late. The stable
/// time is the minimum over the site's partitions (§3), so the writes of
/// every other partition wait for it too: writes at site 0 on keys of
/// other partitions, read at site 1, as in `remote_visibility_and_idle_traffic`.
/// Prints the extra delay per `D` (BENCHMARKS.md, "The straggler effect").
/// Asserts that every write shows, no sooner than `D` late, and that the
/// sites converge, causally.
#[test]
fn a_straggler_partition_delays_remote_visibility() {
    const DELAYS_MS: [u64; 4] = [0, 10, 50, 100];
    // Fewer partitions and writes than `remote_visibility_and_idle_traffic`
    // (four runs a seed; `SEEDS` for more samples), writes closer together.
    const PARTITIONS: u32 = 16;
    const WRITES: usize = 12;
    let mut extra: Vec<Vec<u64>> = vec![Vec::new(); DELAYS_MS.len()];
    for seed in seeds(0..1) {
        for (row, &delay_ms) in DELAYS_MS.iter().enumerate() {
            let mut world = visibility_world(seed, PARTITIONS);
            let mut rng = Rng::new(seed ^ 0x715);
            let settled = world.now_ms() + 1_000;
            world.run_until(settled);
            let keys: Vec<Bytes> = (0..8).map(|i| Bytes::from(format!("key{i}"))).collect();
            let topology = world.sites[0].topology();
            let written: Vec<PartitionId> = keys.iter().map(|k| topology.partition_of(k)).collect();
            let partition = (0..topology.shape.partitions).find(|p| !written.contains(p)).expect("a partition no key is in");
            world.sites[0].straggler = (delay_ms > 0).then_some(Straggler { partition, delay_ms });
            let mut checker = CausalChecker::default();
            let e = visibility(&mut world, &mut rng, seed, &keys, WRITES, 500, &mut checker);
            settle_and_check(&mut world, seed, &mut checker);
            // Not a timing threshold: no write is stable before the
            // straggler's promise past it reaches the stabilizer, sent
            // after the write and `D` late.
            assert!(e[0] >= delay_ms, "seed {seed}: a write showed {} ms late with the straggler {delay_ms} ms late", e[0]);
            let q = |p: usize| quantile(&e, p);
            println!(
                "seed {seed}: partition {partition} {delay_ms} ms late: extra delay min {} p50 {} p90 {} p99 {} max {}",
                e[0],
                q(50),
                q(90),
                q(99),
                e[e.len() - 1]
            );
            extra[row].extend(e);
        }
    }
    println!("| straggler delay | min | p50 | p90 | p99 | max | writes |");
    println!("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for (e, delay_ms) in extra.iter_mut().zip(DELAYS_MS) {
        e.sort();
        let q = |p: usize| quantile(e, p);
        println!("| {delay_ms} ms | {} | {} | {} | {} | {} | {} |", e[0], q(50), q(90), q(99), e[e.len() - 1], e.len());
    }
}

/// The visibility tests' sites: links with no jitter (a write's extra
/// delay is the protocol's alone).
fn visibility_world(seed: u64, partitions: u32) -> World {
    let shape = Shape { partitions, replicas: 3, k: 2, coding: None };
    let wan = Wan { jitter_ms: 0, ..Wan::paper(SITES) };
    // Hops inside a site as on a LAN (0-1 ms), far shorter than a tick.
    let lan = Network { min_delay_ms: 0, max_delay_ms: 1, drop_rate: 0.0 };
    World::new(seed, SITES, Replication::Causal, 3, shape, 1, lan, wan)
}

/// Writes `writes` values at site 0 (client 0) on `keys` in turn, each
/// after a random pause of up to `max_pause_ms`, and polls site 1 (client
/// 0) until it reads it. Returns each write's delay beyond the 40 ms link,
/// sorted. Every operation goes to `checker`.
fn visibility(
    world: &mut World,
    rng: &mut Rng,
    seed: u64,
    keys: &[Bytes],
    writes: usize,
    max_pause_ms: u64,
    checker: &mut CausalChecker,
) -> Vec<u64> {
    let global = |site: usize| site * 100_000;
    let mut extra = Vec::new();
    for i in 0..writes {
        let pause = world.now_ms() + rng.below(max_pause_ms);
        world.run_until(pause);
        let (key, value) = (keys[i % keys.len()].clone(), Bytes::from(format!("v{i}")));
        let put = Request::Put { key: key.clone(), change: Change::set(value.clone()) };
        let start = world.now_ms();
        checker.issued_write(global(0), &value);
        let _ = world.sites[0].start(0, put);
        loop {
            let mut done = Vec::new();
            if world.sites[1].is_idle(0) {
                done.extend(world.sites[1].start(0, Request::Get(key.clone())).into_iter().map(|c| (1, c)));
            }
            let step = world.now_ms() + 1;
            done.extend(world.run_until(step));
            let seen = done.iter().any(|(site, c)| {
                *site == 1 && matches!(&c.result, Ok(causeway_core::driver::Response::Read { value: Some(v), .. }) if *v == value)
            });
            for (site, mut c) in done {
                c.client += global(site);
                checker.completed(&c);
            }
            if seen {
                break;
            }
            assert!(world.now_ms() < start + 10_000, "seed {seed}: write {i} not visible at site 1 after 10 s");
        }
        extra.push(world.now_ms() - start - 40);
    }
    extra.sort();
    extra
}

/// The `p`th percentile of `sorted`.
fn quantile(sorted: &[u64], p: usize) -> u64 {
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)]
}

/// Runs until the clients are idle and every site is quiet (what completes
/// meanwhile goes to `checker`), then checks what `run` checks: nothing
/// left to ship, causal+, every site holding the same data and every
/// acknowledged write.
fn settle_and_check(world: &mut World, seed: u64, checker: &mut CausalChecker) {
    for _ in 0..600 {
        let until = world.now_ms() + 100;
        for (site, mut c) in world.run_until(until) {
            c.client += site * 100_000;
            checker.completed(&c);
        }
        if world.sites.iter().all(|s| s.is_idle(0)) && world.quiet() {
            break;
        }
    }
    assert!(world.quiet(), "seed {seed}: the sites did not settle: {}", geo_state(world));
    assert!(checker.violations.is_empty(), "seed {seed}: causal+ violated:\n{}", checker.violations.join("\n"));
    identical(world, seed, checker);
}

/// A deleted key never comes back (chain/expiry.rs): site 1, cut off from
/// site 0, writes `k`; then site 0 writes and deletes it. Site 0 keeps its
/// tombstone, stable in its chains though it is, while site 1's older write
/// may still come; when the link heals that write arrives after the delete
/// and loses to it, at both sites. Then every tombstone is collected, and
/// `k` is still gone everywhere, read through every node.
#[test]
fn a_deleted_key_never_comes_back() {
    for seed in seeds(0..5) {
        let shape = Shape { partitions: 4, replicas: 3, k: 2, coding: None };
        let lan = Network { min_delay_ms: 0, max_delay_ms: 1, drop_rate: 0.0 };
        let mut world = World::new(seed, 2, Replication::Causal, 3, shape, 1, lan, Wan::paper(2));
        let key = Bytes::from("k");
        world.run_until(world.now_ms() + 1_000);
        world.cut(0, 1, 30_000);
        let write = |world: &mut World, site: usize, change: Change| {
            let _ = world.sites[site].start(0, Request::Put { key: key.clone(), change });
            let until = world.now_ms() + 2_000;
            while !world.sites[site].is_idle(0) && world.now_ms() < until {
                world.run_until(world.now_ms() + 1);
            }
            assert!(world.sites[site].is_idle(0), "seed {seed}: site {site}'s write did not complete");
        };
        write(&mut world, 1, Change::set(Bytes::from("older")));
        world.run_until(world.now_ms() + 10);
        write(&mut world, 0, Change::set(Bytes::from("newer")));
        write(&mut world, 0, Change::delete());
        let tombstones = |world: &World, site: usize| (0..3).map(|n| world.sites[site].node(n).tombstones()).sum::<usize>();
        // Long enough for the delete to be stable everywhere in site 0 and
        // its tombstone to be collected (past the time the version it
        // replaced stays readable by snapshots), were it not for site 1.
        world.run_until(world.now_ms() + causeway_core::store::RETAIN_MS + 3_000);
        assert!(world.sites[0].settled(), "seed {seed}: site 0 did not settle");
        assert_eq!(tombstones(&world, 0), 3, "seed {seed}: site 0 collected its tombstone while site 1 could still send an older write");
        // The link heals: site 1's older write reaches site 0 after the delete.
        world.cut(0, 1, 0);
        for _ in 0..200 {
            world.run_until(world.now_ms() + 100);
            if world.quiet() && tombstones(&world, 0) + tombstones(&world, 1) == 0 {
                break;
            }
        }
        assert!(world.quiet(), "seed {seed}: the sites did not settle: {}", geo_state(&world));
        assert_eq!(tombstones(&world, 0) + tombstones(&world, 1), 0, "seed {seed}: tombstones were not collected");
        let mut reads = Vec::new();
        for site in 0..2 {
            for node in 0..3u16 {
                let c = world.sites[site].add_client(Some(node));
                reads.extend(world.sites[site].start(c, Request::Get(key.clone())).into_iter().map(|c| c.result));
            }
        }
        while reads.len() < 6 {
            reads.extend(world.run_until(world.now_ms() + 10).into_iter().map(|(_, c)| c.result));
        }
        for r in reads {
            assert!(matches!(r, Ok(Response::Read { value: None, .. })), "seed {seed}: the deleted key came back: {r:?}");
        }
    }
}

/// A session outlives its site's crash (a native client's does): it read
/// site 1's write at site 0, then site 0 crashed whole before its disks
/// synced, so it came back without that write (`fsync=everysec`) and gets
/// it back from site 1 later. The session resumes (`Request::Resume`,
/// retried until it succeeds, what the native client does not do by
/// itself yet: README): it waits until site 0 has applied what it saw of
/// site 1, so it never reads the key older. (Handed over without the
/// wait, it read nothing in 9 seeds of 10.)
#[test]
fn a_session_that_outlives_its_site_never_reads_older_than_it_read() {
    let shape = Shape { partitions: 8, replicas: 3, k: 2, coding: None };
    let key = Bytes::from("k");
    for seed in seeds(0..10) {
        let mut world = World::new(seed, 2, Replication::Causal, 3, shape, 1, Network::default(), Wan::paper(2));
        for s in &mut world.sites {
            s.fsync = Fsync::EverySec;
        }
        // Until the sites formed, then just past a whole second (a sync).
        let t = (world.now_ms() + 2_000) / 1_000 * 1_000 + 10;
        world.run_until(t);
        let writer = world.sites[1].add_client(None);
        let mut done = world.sites[1].start(writer, Request::Put { key: key.clone(), change: Change::set(Bytes::from("v1")) });
        while done.is_empty() {
            done = world.run_until(world.now_ms() + 1).into_iter().filter(|(s, _)| *s == 1).map(|(_, c)| c).collect();
        }
        assert!(matches!(done[0].result, Ok(Response::Written(true))), "seed {seed}: {:?}", done[0].result);
        // A session at site 0 reads it there, within the same second.
        let reader = world.sites[0].add_client(None);
        let read = |world: &mut World, client: usize, site: usize| -> Option<Bytes> {
            let mut done = world.sites[site].start(client, Request::Get(key.clone()));
            while done.is_empty() {
                done = world.run_until(world.now_ms() + 1).into_iter().filter(|(s, _)| *s == site).map(|(_, c)| c).collect();
            }
            match &done[0].result {
                Ok(Response::Read { value, .. }) => value.clone(),
                other => panic!("seed {seed}: {other:?}"),
            }
        };
        while read(&mut world, reader, 0).is_none() {
            world.run_until(world.now_ms() + 5);
        }
        assert!(world.now_ms() % 1_000 < 900, "seed {seed}: read at {} ms, too close to the next sync", world.now_ms());
        let session = world.sites[0].session(reader);
        world.sites[0].disconnect(reader);
        for n in 0..3 {
            world.sites[0].crash(n);
        }
        world.run_until(world.now_ms() + 300);
        for n in 0..3 {
            world.sites[0].restart(n);
        }
        let back = world.sites[0].add_client(None);
        let mut tries = 0;
        loop {
            tries += 1;
            assert!(tries < 40, "seed {seed}: the session could not resume in {tries} tries");
            let mut done = world.sites[0].start(back, Request::Resume(Box::new(session.clone())));
            while done.is_empty() {
                done = world.run_until(world.now_ms() + 1).into_iter().filter(|(s, _)| *s == 0).map(|(_, c)| c).collect();
            }
            if done[0].result.is_ok() {
                break;
            }
        }
        assert_eq!(read(&mut world, back, 0).as_deref(), Some(&b"v1"[..]), "seed {seed}: the resumed session read older");
    }
}
