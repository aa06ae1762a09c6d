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
use causeway_core::driver::Request;
use causeway_core::message::Condition;
use causeway_core::ring::Shape;
use causeway_core::version::Version;
use causeway_sim::check::{self, CausalChecker};
use causeway_sim::workload::seeds;
use causeway_sim::world::{Wan, World};
use causeway_sim::{Completed, Network, Rng};
use std::collections::BTreeMap;

const SITES: usize = 3;
const CLIENTS: usize = 4;
const KEYS: u64 = 12;

struct Geo {
    wan: Wan,
    network: Network,
    duration_ms: u64,
    /// Called every few milliseconds while clients run.
    faults: fn(&mut World, &mut Rng),
}

fn run(seed: u64, geo: &Geo) {
    let shape = Shape { partitions: 8, replicas: 3, k: 2 };
    let mut world = World::new(seed, SITES, 3, shape, CLIENTS, geo.network.clone(), geo.wan.clone());
    let mut rng = Rng::new(seed ^ 0x5EED);
    let mut checker = CausalChecker::default();
    let global = |site: usize, client: usize| site * 100 + client;
    let record = |checker: &mut CausalChecker, done: Vec<(usize, Completed)>| {
        for (site, mut c) in done {
            c.client = global(site, c.client);
            checker.completed(&c);
        }
    };
    let key = |i: u64| Bytes::from(format!("key{i}"));
    let end = world.now_ms() + geo.duration_ms;
    let mut writes = 0;
    while world.now_ms() < end {
        for site in 0..SITES {
            for client in 0..CLIENTS {
                if !world.sites[site].is_idle(client) || !rng.chance(0.3) {
                    continue;
                }
                let request = match rng.below(10) {
                    0..=3 => {
                        writes += 1;
                        let value = Bytes::from(format!("s{site}c{client}w{writes}"));
                        checker.issued_write(global(site, client), &value);
                        Request::Put { key: key(rng.below(KEYS)), value: Some(value), ttl_ms: None, condition: Condition::Always }
                    }
                    _ => Request::Get(key(rng.below(KEYS))),
                };
                if let Some(c) = world.sites[site].start(client, request) {
                    record(&mut checker, vec![(site, c)]);
                }
            }
        }
        (geo.faults)(&mut world, &mut rng);
        let step = world.now_ms() + 1 + rng.below(3);
        let done = world.run_until(step);
        record(&mut checker, done);
    }
    for s in &mut world.sites {
        s.network.drop_rate = 0.0;
    }
    world.wan.drop_rate = 0.0;
    for _ in 0..600 {
        let until = world.now_ms() + 100;
        let done = world.run_until(until);
        record(&mut checker, done);
        let idle = world.sites.iter().all(|s| (0..CLIENTS).all(|c| s.is_idle(c)));
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
    assert!(checker.violations.is_empty(), "seed {seed}: causal+ violated:\n{}", checker.violations.join("\n"));
    let data: Vec<BTreeMap<Bytes, (Version, Option<Bytes>)>> = world
        .sites
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let digests = s.digests();
            if let Err(e) = check::converged(&digests).and_then(|()| check::durable(&digests, &checker.acknowledged)) {
                panic!("seed {seed}: site {i}: {e}");
            }
            digests.iter().flat_map(|p| p[0].latest.iter().map(|(k, v)| (k.clone(), (v.version.clone(), v.value.clone())))).collect()
        })
        .collect();
    for (i, d) in data.iter().enumerate().skip(1) {
        assert_eq!(d, &data[0], "seed {seed}: site {i} holds other data than site 0");
    }
    assert!(checker.acknowledged.len() > 50, "seed {seed}: only {} writes acknowledged", checker.acknowledged.len());
    let conflicts: u64 = world.sites.iter().map(|s| (0..s.node_count() as u16).map(|n| s.node(n).conflicts()).sum::<u64>()).sum();
    println!(
        "seed {seed}: {} writes acknowledged, {} reads checked, {} keys, {} messages between sites ({} lost), {conflicts} conflicts, quiet at {} ms",
        checker.acknowledged.len(),
        checker.reads_checked,
        data[0].len(),
        world.carried,
        world.lost,
        world.now_ms()
    );
}

fn geo_state(world: &World) -> String {
    let mut lines = Vec::new();
    for (i, s) in world.sites.iter().enumerate() {
        for n in 0..s.node_count() as u16 {
            if let Some(g) = s.node(n).geo() {
                lines.push(format!("site {i} node {n}: unreported {}, backlog {}, applied {:?}", g.unreported(), g.backlog(), g.applied()));
            }
        }
    }
    lines.join("\n")
}

fn no_faults(_: &mut World, _: &mut Rng) {}

#[test]
fn three_sites_converge_causally() {
    let geo = Geo { wan: Wan::paper(SITES), network: Network::default(), duration_ms: 2_000, faults: no_faults };
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
    let geo = Geo { wan, network: Network::default(), duration_ms: 2_000, faults: no_faults };
    for seed in seeds(0..5) {
        run(seed, &geo);
    }
}
