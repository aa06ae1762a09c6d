//! Balanced roles: load follows roles (heads take writes, tails take
//! linearizable reads and geo reporting), so after a heal, a join or a
//! drain no node may head or end more than 1.25 times its fair share of
//! the chains for long. Each test runs a site of 64 partitions under
//! concurrent clients, measures from the event how long until the roles
//! are balanced for good, and requires it within 10 s of virtual time;
//! every other check of a run holds too (causal+, no acknowledged write
//! lost, replicas identical, the site healed).
//!
//! `SEED=n` replays one seed; `SEEDS=a..b` runs more; `SIM_TRACE=1` prints
//! what the coordinator did; `--nocapture` shows each seed's timeline.

use causeway_core::ring::{NodeId, Shape, Topology};
use causeway_sim::workload::{run_site, seeds, Site};
use causeway_sim::{Fsync, Network, Sim};

const SHAPE: Shape = Shape { partitions: 64, replicas: 3, k: 2, coding: None };
/// How long a paused process stays stopped.
const PAUSE_MS: u64 = 3_000;
/// A Raft election: how long the site has no coordinator leader once the
/// leader's process stops (elections after 500-800 ms, `node/`).
const ELECTION_MS: u64 = 700;
/// From the event until the roles are balanced, at most.
const BALANCED_WITHIN_MS: u64 = 10_000;
/// How long a run goes on after the event (clients keep running).
const OBSERVED_MS: u64 = 20_000;

/// The most chains any member heads, and the most any member ends.
fn busiest(t: &Topology) -> (usize, usize) {
    let roles = t.nodes.iter().map(|n| t.roles(n.id));
    roles.fold((0, 0), |(h, tl), r| (h.max(r.head), tl.max(r.tail)))
}

/// Whether the site has `members` members and none heads or ends more
/// than 1.25 times its fair share of the chains.
fn balanced(t: &Topology, members: usize) -> bool {
    let (head, tail) = busiest(t);
    let limit = t.shape.partitions as usize * 5 / (4 * members);
    t.nodes.len() == members && head <= limit && tail <= limit
}

/// How long after the event the roles stayed balanced for good (ms), and
/// the busiest (heads, tails) at each second after it.
struct Balance {
    took_ms: u64,
    by_second: Vec<(usize, usize)>,
}

/// Runs `nodes` nodes under clients; `act` (given the time since the
/// start) injects faults or does the operator's work, and returns the
/// moment the measurement starts from once it has come. The site should
/// end with `members` members.
fn balance_after(seed: u64, nodes: u16, members: usize, mut act: impl FnMut(&mut Sim, u64) -> Option<u64>) -> Balance {
    let site = Site {
        shape: SHAPE,
        nodes,
        network: Network { min_delay_ms: 0, max_delay_ms: 6, drop_rate: 0.0 },
        keys: 200,
        duration_ms: 30_000,
        check_causal: true,
        coordinator: true,
        fsync: Fsync::Always,
        tier: None,
    };
    let mut start = None;
    let mut from = None;
    let mut unbalanced_at = 0;
    let mut by_second = Vec::new();
    run_site(
        seed,
        &site,
        |sim: &mut Sim| {
            let t0 = *start.get_or_insert(sim.now_ms);
            if from.is_none() {
                from = act(sim, sim.now_ms - t0);
            }
            if let Some(from) = from.filter(|&f| sim.now_ms >= f && sim.now_ms < f + OBSERVED_MS) {
                if by_second.len() as u64 <= (sim.now_ms - from) / 1_000 {
                    by_second.push(busiest(sim.topology()));
                }
                if !balanced(sim.topology(), members) {
                    unbalanced_at = sim.now_ms - from;
                }
            }
        },
        |_, _| {},
    );
    assert!(from.is_some(), "seed {seed}: the event never came");
    Balance { took_ms: unbalanced_at, by_second }
}

fn check(what: &str, seed: u64, b: &Balance) {
    eprintln!("{what}, seed {seed}: balanced {} ms after; busiest (heads, tails) by second: {:?}", b.took_ms, b.by_second);
    assert!(b.took_ms <= BALANCED_WITHIN_MS, "{what}, seed {seed}: roles balanced only {} ms after: {:?}", b.took_ms, b.by_second);
}

/// The run that took long on real processes: four nodes, one paused 3 s,
/// then (a second after it resumed) the coordinator leader's process paused
/// 3 s: its node, and its coordinator member until another is elected.
/// Counted from when the second one resumes.
#[test]
fn roles_balance_within_10_s_of_a_heal_after_two_pauses() {
    for seed in seeds(0..4) {
        // Any node but the leader's first (node 0 hears the simulated
        // coordinator's heartbeats).
        let first = 1 + (seed % 3) as NodeId;
        let mut step = 0;
        let b = balance_after(seed, 4, 4, |sim, t| {
            if step == 0 && t >= 1_000 {
                sim.pause(first, PAUSE_MS);
                step = 1;
            } else if step == 1 && t >= 1_000 + PAUSE_MS + 1_000 {
                sim.pause(0, PAUSE_MS);
                sim.pause_coordinator(ELECTION_MS);
                return Some(sim.now_ms + PAUSE_MS);
            }
            None
        });
        check("two pauses", seed, &b);
    }
}

/// A fifth node added to a site of four: it joins at the tail of the
/// chains it takes, and moves up to its share of heads.
#[test]
fn roles_balance_within_10_s_of_a_join() {
    for seed in seeds(10..14) {
        let b = balance_after(seed, 4, 5, |sim, t| {
            (t >= 1_000).then(|| {
                sim.join();
                sim.now_ms
            })
        });
        check("a join", seed, &b);
    }
}

/// One node of five drained: the others take its chains at their tails.
#[test]
fn roles_balance_within_10_s_of_a_drain() {
    for seed in seeds(20..24) {
        let b = balance_after(seed, 5, 4, |sim, t| {
            (t >= 1_000).then(|| {
                sim.drain((seed % 5) as NodeId);
                sim.now_ms
            })
        });
        check("a drain", seed, &b);
    }
}
