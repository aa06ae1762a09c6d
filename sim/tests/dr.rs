//! Identifier-first disaster recovery (`core/src/geo/dr.rs`) in the
//! simulator: site 1 backs up site 0. Many clients write at site 0 while
//! the links lose messages and backup nodes crash (in one schedule in
//! four they come back without their data: a stabilizer replica then
//! catches up on the notes from the others before it counts again); then
//! site 0 is lost (in one schedule in three the backup then restarts whole;
//! in one in two a backup node is down through the failover)
//! (its link cut for good, writes in flight), site 1 fails over, and every
//! key is read at site 1 through every node. Nothing acknowledged at site
//! 0 may be served older: each key must read at or past its last
//! acknowledged version, or be refused as lost (`Error::Lost`) naming a
//! write at least that new. Writing a refused key clears it.
//!
//! Then the old primary's link comes back: what the backup never got
//! arrives, and every key reads complete.
//!
//! The same schedule without disaster recovery (sites replicating
//! asynchronously, as before) shows what the check catches: there, reads
//! of keys whose last acknowledged write never arrived return older values.
//!
//! `SEED=n cargo test -p causeway-sim --test dr` replays one schedule,
//! `SEEDS=a..b` runs more.

use bytes::Bytes;
use causeway_core::driver::{Request, Response};
use causeway_core::error::Error;
use causeway_core::geo::Replication;
use causeway_core::message::geo::DrPair;
use causeway_core::message::{Change, Condition};
use causeway_core::ring::Shape;
use causeway_core::version::Version;
use causeway_sim::workload::seeds;
use causeway_sim::world::{Wan, World};
use causeway_sim::{Completed, Network, Rng};
use std::collections::HashMap;

const CLIENTS: usize = 8;
const KEYS: u64 = 40;
const PAIR: DrPair = DrPair { primary: 0, backup: 1 };

/// How the keys read at the backup after the failover.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Tally {
    /// At or past the last acknowledged write.
    complete: usize,
    /// Refused: the last write noted never arrived (`-LOST`).
    refused: usize,
    /// Served older than the last acknowledged write, or missing: loss.
    stale: usize,
}

/// Judges reads at the backup against the primary's acknowledged writes
/// (`acked`: the newest acknowledged version of each key). Returns the
/// tally and a line per stale read.
fn judge(acked: &HashMap<Bytes, Version>, reads: &[Completed]) -> (Tally, Vec<String>) {
    let mut tally = Tally::default();
    let mut stale = Vec::new();
    for c in reads {
        let Request::Get(key) = &c.request else { continue };
        let Some(last) = acked.get(key) else { continue };
        match &c.result {
            Err(Error::Lost { key: k, missing }) if k == key && missing >= last => tally.refused += 1,
            Err(Error::Lost { missing, .. }) => {
                tally.stale += 1;
                stale.push(format!("{key:?}: refused naming {missing}, older than the acknowledged {last}"));
            }
            Ok(Response::Read { .. }) => {
                let version = c.items.iter().find(|(k, _)| k == key).and_then(|(_, i)| i.version.clone());
                match version {
                    Some(v) if v >= *last => tally.complete += 1,
                    v => {
                        tally.stale += 1;
                        stale.push(format!("{key:?}: read {v:?}, older than the acknowledged {last}"));
                    }
                }
            }
            other => panic!("a read at the backup failed otherwise: {other:?}"),
        }
    }
    (tally, stale)
}

/// One schedule: writes at site 0, faults, the disaster, a failover at
/// site 1 (with `dr`), reads of every key at site 1 through every node.
/// Returns the tally and the stale reads.
fn run(seed: u64, dr: bool) -> (Tally, Vec<String>) {
    let shape = Shape { partitions: 8, replicas: 3, k: 2, coding: None };
    let wan = Wan { delay_ms: vec![vec![0, 5], vec![5, 0]], jitter_ms: 3, drop_rate: 0.01 };
    let network = Network { min_delay_ms: 0, max_delay_ms: 2, drop_rate: 0.002 };
    let mut world = World::new(seed, 2, Replication::Causal, 4, shape, CLIENTS, network, wan);
    if dr {
        world = world.with_dr(PAIR);
    }
    let mut rng = Rng::new(seed ^ 0xD15A);
    while !world.sites.iter().all(|s| s.configured() && s.healed()) {
        world.run_until(world.now_ms() + 10);
    }
    let mut acked: HashMap<Bytes, Version> = HashMap::new();
    let record = |c: Completed, acked: &mut HashMap<Bytes, Version>| {
        if let (Request::Put { key, .. }, Some(v)) = (&c.request, c.written) {
            let last = acked.entry(key.clone()).or_insert_with(|| v.clone());
            *last = (*last).clone().max(v);
        }
    };
    let disaster_at = world.now_ms() + 1_500 + rng.below(2_500);
    let mut crashed: Option<(u64, u16)> = None;
    let mut writes = 0u64;
    // Clients keep writing a little after the disaster: those writes are
    // never acknowledged (their backup never answers), or are only if the
    // backup had noted them.
    while world.now_ms() < disaster_at + 300 {
        for client in 0..CLIENTS {
            if !world.sites[0].is_idle(client) {
                continue;
            }
            writes += 1;
            let key = Bytes::from(format!("key{}", rng.below(KEYS)));
            // Values from tiny to large: the note carries none of them.
            let value = Bytes::from(format!("c{client}w{writes}").repeat(1 + rng.below(40) as usize));
            for c in world.sites[0].start(client, Request::Put { key, change: Change::set(value) }) {
                record(c, &mut acked);
            }
        }
        // A backup node crashes now and then (the stabilizer leader among
        // them) and comes back from its disk, or empty.
        match crashed {
            Some((at, node)) if at <= world.now_ms() => {
                match seed % 4 == 1 {
                    true => world.sites[1].restart_without_data(node),
                    false => world.sites[1].restart(node),
                }
                crashed = None;
            }
            None if rng.chance(0.0005) => {
                let node = rng.below(4) as u16;
                world.sites[1].crash(node);
                crashed = Some((world.now_ms() + 300 + rng.below(700), node));
            }
            _ => {}
        }
        if world.now_ms() == disaster_at {
            // Site 0 is lost: nothing more crosses, whatever was on its way.
            world.cut(0, 1, u64::MAX / 4);
        }
        for (site, c) in world.run_until(world.now_ms() + 1) {
            if site == 0 {
                record(c, &mut acked);
            }
        }
    }
    if let Some((_, node)) = crashed {
        world.sites[1].restart(node);
    }
    if seed.is_multiple_of(3) {
        // The backup site restarts whole before it fails over: its nodes
        // come back from their logs, the notes with them.
        world.run_until(world.now_ms() + 50);
        for node in 0..4u16 {
            if !world.sites[1].is_crashed(node) {
                world.sites[1].crash(node);
            }
        }
        world.run_until(world.now_ms() + 200 + rng.below(300));
        for node in 0..4u16 {
            world.sites[1].restart(node);
        }
    }
    // Whatever site 0 still reports is gone; site 1 settles.
    let settle = world.now_ms() + 3_000;
    while world.now_ms() < settle {
        for (site, c) in world.run_until(world.now_ms() + 10) {
            if site == 0 {
                record(c, &mut acked);
            }
        }
    }
    // In one schedule in two a backup node is down through the failover
    // and comes back from its disk right after it: it must learn the lost
    // keys before it serves the reads below.
    let missed = (seed % 2 == 1).then(|| rng.below(4) as u16);
    if let Some(node) = missed {
        world.sites[1].crash(node);
    }
    if dr {
        // The operator tries again if it times out (a node slow to answer).
        let at = (0..4u16).cycle().skip(rng.below(4) as usize).find(|&n| Some(n) != missed).expect("a live node");
        let c = world.sites[1].add_client(Some(at));
        let done = request(&mut world, seed, c, Request::Failover { force: false });
        assert!(matches!(done.result, Ok(Response::FailedOver(_))), "seed {seed}: the failover failed: {:?}", done.result);
    }
    if let Some(node) = missed {
        world.sites[1].restart(node);
    }
    // Every key, through every node of the backup.
    let mut reads = Vec::new();
    for node in 0..4u16 {
        let c = world.sites[1].add_client(Some(node));
        for k in 0..KEYS {
            reads.push(request(&mut world, seed, c, Request::Get(Bytes::from(format!("key{k}")))));
        }
    }
    let (tally, stale) = judge(&acked, &reads);
    if dr && tally.refused > 0 {
        refused_keys_clear_on_write(&mut world, seed, &reads);
    }
    if dr {
        failback(&mut world, seed, &acked);
    }
    (tally, stale)
}

/// The old primary comes back (its link heals, its nodes kept their
/// logs): what the backup never got is shipped as usual, and every key
/// the backup refused reads complete again, everywhere.
fn failback(world: &mut World, seed: u64, acked: &HashMap<Bytes, Version>) {
    world.cut(0, 1, 0);
    let until = world.now_ms() + 60_000;
    while !world.quiet() {
        world.run_until(world.now_ms() + 10);
        assert!(world.now_ms() < until, "seed {seed}: the sites did not settle after the link came back");
    }
    let mut reads = Vec::new();
    for node in 0..4u16 {
        let c = world.sites[1].add_client(Some(node));
        for key in acked.keys() {
            reads.push(request(world, seed, c, Request::Get(key.clone())));
        }
    }
    let (tally, stale) = judge(acked, &reads);
    assert!(stale.is_empty(), "seed {seed}: after failback:\n{}", stale.join("\n"));
    assert_eq!(tally.refused, 0, "seed {seed}: keys still refused after failback");
}

/// Runs `request` of client `c` at the backup to its end. One that times
/// out (a message lost, a node still coming back) is tried again:
/// unavailability is not loss.
fn request(world: &mut World, seed: u64, c: usize, request: Request) -> Completed {
    for _ in 0..20 {
        let mut done = world.sites[1].start(c, request.clone());
        while done.is_empty() {
            done.extend(world.run_until(world.now_ms() + 1).into_iter().filter(|(s, _)| *s == 1).map(|(_, c)| c));
        }
        let c = done.remove(0);
        if !matches!(c.result, Err(Error::Timeout)) {
            return c;
        }
    }
    panic!("seed {seed}: {request:?} keeps timing out at the backup:\n{}", world.sites[1].history());
}

/// A refused key: a conditional write is refused too (what the key holds
/// is unknown); a plain SET clears it, and reads through every node serve
/// the new value; a DEL clears another (a tombstone, even where no older
/// value was), and both leave the list of missing keys. (A value may still
/// arrive late, from updates the backup had in hand: then the key is
/// complete, and the next refused key is tried.)
fn refused_keys_clear_on_write(world: &mut World, seed: u64, reads: &[Completed]) {
    let refused: Vec<Bytes> = reads
        .iter()
        .filter_map(|c| match (&c.request, &c.result) {
            (Request::Get(k), Err(Error::Lost { .. })) => Some(k.clone()),
            _ => None,
        })
        .collect();
    let c = world.sites[1].add_client(Some(0));
    let nx = Change { condition: Condition::IfAbsent, ..Change::set(Bytes::from("nx")) };
    let mut refused = refused.into_iter();
    let mut still_refused = |world: &mut World| {
        refused.by_ref().find(|key| {
            let r = request(world, seed, c, Request::Put { key: key.clone(), change: nx.clone() }).result;
            let head = world.sites[1].topology().chain(world.sites[1].topology().partition_of(key)).head();
            let arrived = world.sites[1].node(head).geo().and_then(|g| g.dr()).and_then(|d| d.lost(key)).is_some_and(|missing| {
                let p = world.sites[1].topology().partition_of(key);
                world.sites[1].node(head).newest(p, key).is_some_and(|v| v >= (missing.ts, missing.site))
            });
            assert!(matches!(r, Err(Error::Lost { .. })) || arrived, "seed {seed}: SET NX on a lost key: {r:?}");
            !arrived
        })
    };
    let Some(key) = still_refused(world) else { return };
    let r = request(world, seed, c, Request::Put { key: key.clone(), change: Change::set(Bytes::from("fresh")) }).result;
    assert!(matches!(r, Ok(Response::Written(true))), "seed {seed}: SET on a lost key: {r:?}");
    for node in 0..4u16 {
        let reader = world.sites[1].add_client(Some(node));
        let r = request(world, seed, reader, Request::Get(key.clone())).result;
        assert!(
            matches!(&r, Ok(Response::Read { value: Some(v), .. }) if v == "fresh"),
            "seed {seed}: node {node} after the key was written again: {r:?}"
        );
    }
    let mut cleared = vec![key];
    // For the DEL, a key the backup never had a value of, if any (a DEL
    // of an older value there wrote its tombstone anyway).
    let rest: Vec<Bytes> = std::iter::from_fn(|| still_refused(world)).collect();
    let never_here = |key: &Bytes| {
        let t = world.sites[1].topology();
        let p = t.partition_of(key);
        world.sites[1].node(t.chain(p).head()).newest(p, key).is_none()
    };
    if let Some(key) = rest.iter().find(|k| never_here(k)).or(rest.first()).cloned() {
        let r = request(world, seed, c, Request::Put { key: key.clone(), change: Change::delete() }).result;
        assert!(matches!(r, Ok(Response::Written(true))), "seed {seed}: DEL of a lost key: {r:?}");
        for node in 0..4u16 {
            let reader = world.sites[1].add_client(Some(node));
            let r = request(world, seed, reader, Request::Get(key.clone())).result;
            assert!(matches!(&r, Ok(Response::Read { value: None, .. })), "seed {seed}: node {node} after DEL of a lost key: {r:?}");
        }
        cleared.push(key);
    }
    // Once every replica has the writes (the link to the primary is still
    // cut: only the backup's own traffic).
    world.run_until(world.now_ms() + 2_000);
    for key in cleared {
        let t = world.sites[1].topology().clone();
        for &node in &t.chain(t.partition_of(&key)).nodes {
            let (missing, _) = world.sites[1].node(node).dr_missing(b"", usize::MAX);
            assert!(missing.iter().all(|(k, _)| *k != key), "seed {seed}: node {node} still lists {key:?} as missing once written");
        }
    }
}

#[test]
fn after_a_failover_the_backup_serves_nothing_older_than_an_acknowledged_write() {
    let mut total = Tally::default();
    for seed in seeds(0..30) {
        let (tally, stale) = run(seed, true);
        assert!(stale.is_empty(), "seed {seed}: acknowledged writes served older after the failover:\n{}", stale.join("\n"));
        println!("seed {seed}: {tally:?}");
        total.complete += tally.complete;
        total.refused += tally.refused;
    }
    // The schedules must reach the case that matters: keys whose value
    // never arrived.
    assert!(total.refused > 0, "no key was ever refused: the disaster never caught a value in flight");
}

/// The check catches loss: without disaster recovery, the same schedules
/// serve keys older than their last acknowledged write.
#[test]
fn without_it_the_backup_serves_older_values_and_the_check_says_so() {
    let mut stale = 0;
    for seed in seeds(0..30) {
        let (tally, lines) = run(seed, false);
        println!("seed {seed}: {tally:?}");
        assert_eq!(tally.refused, 0);
        stale += lines.len();
    }
    assert!(stale > 0, "asynchronous replication lost nothing in any schedule: the check may not see loss");
}

/// A stabilizer replica of the backup restarted without its data while
/// another replica is down cannot know the notes only its earlier process
/// and the down one kept: it is not whole, so a failover meanwhile cannot
/// count it (and waits) until the down replica is back from its disk and
/// it caught up. (The supervisor admits a returning node straight into its
/// chains, so nothing but the catching up tells it from a site's birth.)
#[test]
fn a_replica_restarted_empty_while_another_is_down_counts_only_once_caught_up() {
    for seed in seeds(0..5) {
        let shape = Shape { partitions: 8, replicas: 3, k: 2, coding: None };
        let wan = Wan { delay_ms: vec![vec![0, 5], vec![5, 0]], jitter_ms: 1, drop_rate: 0.0 };
        let network = Network { min_delay_ms: 0, max_delay_ms: 2, drop_rate: 0.0 };
        let mut world = World::new(seed, 2, Replication::Causal, 4, shape, 2, network, wan).with_dr(PAIR);
        while !world.sites.iter().all(|s| s.configured() && s.healed()) {
            world.run_until(world.now_ms() + 10);
        }
        let whole = |w: &World, n: u16| w.sites[1].node(n).geo().and_then(|g| g.dr()).is_some_and(|d| d.status().whole);
        let until = world.now_ms() + 5_000;
        while !(0..4).all(|n| whole(&world, n)) {
            world.run_until(world.now_ms() + 10);
            assert!(world.now_ms() < until, "seed {seed}: the replicas are not whole after the site's birth");
        }
        world.sites[1].crash(2);
        world.sites[1].crash(1);
        world.run_until(world.now_ms() + 50);
        world.sites[1].restart_without_data(1);
        let until = world.now_ms() + 20_000;
        while !world.sites[1].node(1).is_admitted() {
            world.run_until(world.now_ms() + 10);
            assert!(world.now_ms() < until, "seed {seed}: node 1 was not admitted again");
        }
        world.run_until(world.now_ms() + 3_000);
        assert!(!whole(&world, 1), "seed {seed}: node 1 lost its notes and one replica is down, yet it says they are whole");
        // A failover now waits (the operator's request times out) ...
        let c = world.sites[1].add_client(Some(0));
        let mut done = world.sites[1].start(c, Request::Failover { force: false });
        let until = world.now_ms() + 3_000;
        while done.is_empty() && world.now_ms() < until {
            done.extend(world.run_until(world.now_ms() + 10).into_iter().filter(|(s, _)| *s == 1).map(|(_, c)| c));
        }
        assert!(
            done.iter().all(|c| !matches!(c.result, Ok(Response::FailedOver(_)))),
            "seed {seed}: failed over with one whole replica of three"
        );
        // ... until node 2 is back from its disk: node 1 catches up.
        world.sites[1].restart(2);
        let until = world.now_ms() + 20_000;
        while !whole(&world, 1) {
            world.run_until(world.now_ms() + 10);
            assert!(world.now_ms() < until, "seed {seed}: node 1 never caught up");
        }
        let c = world.sites[1].add_client(Some(0));
        let done = request(&mut world, seed, c, Request::Failover { force: false });
        assert!(matches!(done.result, Ok(Response::FailedOver(_))), "seed {seed}: {:?}", done.result);
    }
}
