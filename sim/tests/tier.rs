//! The disk tier in the simulator: every node moves values out to its tier
//! (`MemTier`) and back, under budget pulses that keep them moving
//! (`SimTier`), while concurrent clients write, read and read snapshots,
//! and faults come in a row: logs compacted now and then (checkpoints that
//! name values on disk), a node killed and restarted from its log and its
//! tier, a node paused while its tier's answers wait, lost messages, and
//! the tier's own I/O errors. At the end
//! the whole history is checked: causal+, replicas identical, and no
//! acknowledged write lost. Reads and writes the tier failed are refused
//! (`-ERR disk tier: ...`), never answered wrongly.
//!
//! `SEED=n` replays one seed.

use causeway_core::node::STREAMS_AT_ONCE;
use causeway_core::ring::{NodeId, Shape};
use causeway_core::tier::CachePolicy;
use causeway_sim::workload::{run_site, seeds, Site};
use causeway_sim::{Fsync, Network, Rng, SimTier};

const SHAPE: Shape = Shape { partitions: 8, replicas: 3, k: 2, coding: None };
const NODES: u16 = 4;

/// What one run checked.
#[derive(Default)]
struct Checked {
    completed: usize,
    failed: usize,
    acknowledged: usize,
    /// Requests that waited for a value on disk, and values moved out, at
    /// the nodes alive at the end.
    misses: u64,
    moved_out: u64,
    /// Values streamed from one node's tier to another's by state
    /// transfers.
    streamed: u64,
    /// Steps where a node had streams waiting for their turn.
    queued: u64,
}

/// Runs `seed` with `policy`.
fn run(seed: u64, policy: CachePolicy, fail_chance: f64) -> Checked {
    let site = Site {
        shape: SHAPE,
        nodes: NODES,
        network: Network { min_delay_ms: 0, max_delay_ms: 6, drop_rate: 0.005 },
        keys: 30,
        duration_ms: 5_000,
        check_causal: true,
        coordinator: true,
        fsync: Fsync::Always,
        tier: Some(SimTier { policy, fail_chance }),
    };
    let mut rng = Rng::new(seed ^ 0x7135);
    let victim = rng.below(NODES as u64) as NodeId;
    let paused = (victim + 1 + rng.below(NODES as u64 - 1) as NodeId) % NODES;
    let mut start = None;
    let mut step = 0;
    let mut tier = (0, 0, 0);
    let mut next_compaction = 200;
    let mut queued = 0;
    let run = run_site(
        seed,
        &site,
        |sim| {
            for n in (0..NODES).filter(|&n| !sim.is_crashed(n)) {
                if let Some((_, s)) = sim.node(n).tier_stats() {
                    assert!(s.streams_running <= STREAMS_AT_ONCE, "seed {seed}: node {n} streams {} partitions", s.streams_running);
                    queued += (s.streams_waiting > 0) as u64;
                }
            }
            let t = sim.now_ms - *start.get_or_insert(sim.now_ms);
            if t >= next_compaction {
                // Checkpoints name values on disk; the restart below
                // recovers from one.
                sim.compact(rng.below(NODES as u64) as NodeId);
                next_compaction = t + 100 + rng.below(300);
            }
            if step == 0 && t >= 1_000 {
                sim.crash(victim);
                step = 1;
            } else if step == 1 && t >= 1_000 + 300 + rng.below(900) {
                sim.restart(victim);
                step = 2;
            } else if step == 2 && t >= 3_000 {
                sim.pause(paused, 200 + rng.below(400));
                step = 3;
            }
        },
        |sim, _| {
            for n in 0..sim.node_count() as NodeId {
                if let Some((_, s)) = sim.node(n).tier_stats() {
                    tier = (tier.0 + s.misses, tier.1 + s.moved_out, tier.2 + s.streamed_in);
                }
            }
        },
    );
    let acknowledged = run.checker.acknowledged.len();
    assert!(acknowledged > 100, "seed {seed}: {acknowledged} acknowledged");
    assert!(tier.0 > 0 && tier.1 > 0, "seed {seed}: the tier was not used: {tier:?}");
    Checked { completed: run.completed, failed: run.failed, acknowledged, misses: tier.0, moved_out: tier.1, streamed: tier.2, queued }
}

/// Runs the seeds and says what was checked (`--nocapture` shows it).
fn report(name: &str, policy: CachePolicy, fail_chance: f64, seeds: Vec<u64>) -> Checked {
    let runs = seeds.len();
    let mut all = Checked::default();
    for seed in seeds {
        let c = run(seed, policy, fail_chance);
        all.completed += c.completed;
        all.failed += c.failed;
        all.acknowledged += c.acknowledged;
        all.misses += c.misses;
        all.moved_out += c.moved_out;
        all.streamed += c.streamed;
        all.queued += c.queued;
    }
    eprintln!(
        "{name}: {runs} runs, {} requests completed ({} failed), {} acknowledged writes checked; {} values moved out, {} requests waited for the disk, {} values streamed by state transfers ({} steps with streams waiting their turn)",
        all.completed, all.failed, all.acknowledged, all.moved_out, all.misses, all.streamed, all.queued
    );
    all
}

#[test]
fn values_moving_out_and_back_keep_causal_consistency_through_a_crash_and_a_pause() {
    report("lru", CachePolicy::Lru, 0.0, seeds(0..8));
    report("fifo", CachePolicy::Fifo, 0.0, seeds(100..104));
    report("lfu", CachePolicy::Lfu, 0.0, seeds(200..204));
}

#[test]
fn a_failing_tier_refuses_requests_and_loses_nothing() {
    let all = report("lru, one batch in ten failing", CachePolicy::Lru, 0.1, seeds(300..308));
    assert!(all.failed > 0, "some requests met a failing tier");
}
