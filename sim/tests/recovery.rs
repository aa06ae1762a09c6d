//! Crashes, restarts and pauses under concurrent writers, with the real
//! supervisor deciding from heartbeats (no scripted repair): the site must
//! heal by itself (every node back in the chains, chains at R), every
//! acknowledged write must survive (with `fsync=always`; with `everysec`,
//! everything written before the last sync), and all replicas converge.

use bytes::Bytes;
use causeway_core::driver::Request;
use causeway_core::message::Change;
use causeway_core::ring::Shape;
use causeway_sim::workload::{run_site, seeds, Site};
use causeway_sim::{Fsync, Network, Rng, Sim, FAILURE_TIMEOUT_MS};

const SHAPE: Shape = Shape { partitions: 16, replicas: 3, k: 2, coding: None };

fn site(nodes: u16, fsync: Fsync) -> Site {
    Site {
        shape: SHAPE,
        nodes,
        network: Network { min_delay_ms: 0, max_delay_ms: 6, drop_rate: 0.01 },
        keys: 100,
        duration_ms: 4_000,
        // With `everysec` a whole-site crash loses the last second's
        // acknowledged writes, which clients may have read.
        check_causal: fsync == Fsync::Always,
        coordinator: true,
        fsync,
        tier: None,
    }
}

/// A fault at a time (ms after the run's start).
type Event = (u64, Box<dyn FnMut(&mut Sim)>);

/// Runs each event once, when the run's clock first reaches its time.
fn schedule(mut events: Vec<Event>) -> impl FnMut(&mut Sim) {
    let mut start = None;
    move |sim: &mut Sim| {
        let t0 = *start.get_or_insert(sim.now_ms);
        for (at, event) in events.iter_mut() {
            if *at != u64::MAX && sim.now_ms >= t0 + *at {
                event(sim);
                *at = u64::MAX;
            }
        }
    }
}

/// The whole site killed at once (kill -9 of every node) with writers
/// running, then started again from the logs: with fsync=always every
/// acknowledged write is back and readable, and causal+ holds.
#[test]
fn whole_site_crash_with_fsync_always_loses_nothing_acknowledged() {
    for seed in seeds(0..12) {
        let crash_at = 1_000 + seed * 97 % 1_000;
        let faults = schedule(vec![
            (crash_at, Box::new(|sim: &mut Sim| (0..3).for_each(|n| sim.crash(n)))),
            (crash_at + 50 + seed % 200, Box::new(|sim: &mut Sim| (0..3).for_each(|n| sim.restart(n)))),
        ]);
        let run = run_site(seed, &site(3, Fsync::Always), faults, |_, _| {});
        assert!(run.checker.acknowledged.len() > 100, "seed {seed}: only {} acknowledged writes", run.checker.acknowledged.len());
    }
}

/// The same with everysec: what was written before the last sync survives
/// (what came after may be lost, on every node at once), and the replicas
/// still converge: the chains are reordered so the longest log leads.
#[test]
fn whole_site_crash_with_fsync_everysec_loses_at_most_the_last_second() {
    for seed in seeds(20..30) {
        let crash_at = 1_500 + seed * 97 % 1_000;
        let faults = schedule(vec![
            (crash_at, Box::new(|sim: &mut Sim| (0..3).for_each(|n| sim.crash(n)))),
            (crash_at + 100, Box::new(|sim: &mut Sim| (0..3).for_each(|n| sim.restart(n)))),
        ]);
        let run = run_site(seed, &site(3, Fsync::EverySec), faults, |_, checker| {
            // Disks are synced at every whole second of virtual time; runs
            // start at 1000 ms, and the crash comes at or just after
            // `crash_at`.
            let last_sync = (1_000 + crash_at) / 1_000 * 1_000;
            checker.acknowledged.retain(|(_, v)| v.ts.physical_ms() < last_sync);
        });
        assert!(run.checker.acknowledged.len() > 20, "seed {seed}: only {} writes checked", run.checker.acknowledged.len());
    }
}

/// One node killed and started again at once with no data (a new disk, or
/// no data dir), before the coordinator noticed the silence: it must not
/// serve as the replica it was (a head would reuse sequence numbers, a tail
/// would declare unreplicated writes stable); it leaves its chains and
/// comes back through a state transfer.
#[test]
fn a_node_restarted_without_its_data_rejoins_by_state_transfer() {
    for seed in seeds(40..52) {
        let victim = (seed % 4) as u16;
        let at = 800 + seed * 131 % 1_500;
        let faults = schedule(vec![
            (at, Box::new(move |sim: &mut Sim| sim.crash(victim))),
            (at + 30, Box::new(move |sim: &mut Sim| sim.restart_without_data(victim))),
        ]);
        run_site(seed, &site(4, Fsync::Always), faults, |_, _| {});
    }
}

/// One node killed and restarted from its log (fsync=always), quickly or
/// after the coordinator removed it.
#[test]
fn a_node_restarted_from_its_log_resumes_or_returns() {
    for seed in seeds(60..72) {
        let victim = (seed % 4) as u16;
        let at = 800 + seed * 131 % 1_000;
        let down = if seed % 2 == 0 { 50 } else { FAILURE_TIMEOUT_MS * 3 };
        let faults = schedule(vec![
            (at, Box::new(move |sim: &mut Sim| sim.crash(victim))),
            (at + down, Box::new(move |sim: &mut Sim| sim.restart(victim))),
        ]);
        run_site(seed, &site(4, Fsync::Always), faults, |_, _| {});
    }
}

/// The sequence that left a real site without writes: a node paused past
/// the failure timeout (removed, and never taken back), then the
/// coordinator leader paused as long (on resuming it removed a healthy
/// node on heartbeats from before its pause). Now the paused node comes
/// back by itself, and the resumed coordinator removes nobody.
#[test]
fn pause_a_node_then_the_coordinator_and_the_site_heals() {
    for seed in seeds(80..90) {
        let victim = (seed % 4) as u16;
        let faults = schedule(vec![
            (500, Box::new(move |sim: &mut Sim| sim.pause(victim, FAILURE_TIMEOUT_MS * 3))),
            (2_500, Box::new(|sim: &mut Sim| sim.pause_coordinator(FAILURE_TIMEOUT_MS * 3))),
        ]);
        let mut sim_changes = Vec::new();
        let run = run_site(seed, &site(4, Fsync::Always), faults, |sim, _| sim_changes = sim.changes.clone());
        let after_pause: Vec<_> = sim_changes.iter().filter(|(at, _)| *at >= 1_000 + 2_500).collect();
        assert!(
            after_pause.iter().all(|(_, what)| !what.contains("silent")),
            "seed {seed}: the resumed coordinator removed a node: {after_pause:?}"
        );
        assert!(sim_changes.iter().any(|(_, what)| what.contains(&format!("node {victim} is back"))), "seed {seed}: {sim_changes:?}");
        assert!(run.completed > 100);
    }
}

/// Found by `cli/tests/recovery.rs` on a loaded machine: a node paused
/// past the failure timeout comes back at the tail of its chains, which
/// then move it up towards their placed order while writers keep writing. A
/// member that moved up adopted the new order before its successor, which
/// ignored its request to catch up; with writes flowing past it (its
/// successor acknowledging them) it never asked again, and the site never
/// settled until the writes stopped. Here the writers never stop: the
/// chains must be back in their placed order with every replica holding its
/// data while they write.
#[test]
fn a_node_back_from_a_pause_moves_up_its_chains_while_writers_keep_writing() {
    for seed in seeds(0..8) {
        let network = Network { min_delay_ms: 0, max_delay_ms: 6, drop_rate: 0.0 };
        let mut sim = Sim::new(seed, 4, SHAPE, 12, network).with_coordinator();
        let mut rng = Rng::new(seed ^ 0xBEEF);
        let start = sim.now_ms;
        let mut writes = 0u64;
        let mut paused = false;
        let settled = |sim: &Sim| {
            sim.healed() && sim.configured() && (0..4).all(|n| sim.node(n).joining_replicas() + sim.node(n).catching_up_replicas() == 0)
        };
        // Up to 20 s of virtual time: the pause and the return take a few.
        while sim.now_ms < start + 20_000 {
            for client in 0..12 {
                if sim.is_idle(client) {
                    writes += 1;
                    let key = Bytes::from(format!("key{}", rng.below(200)));
                    let change = Change::set(Bytes::from(format!("w{writes}")));
                    let _ = sim.start(client, Request::Put { key, change });
                }
            }
            if !paused && sim.now_ms >= start + 500 {
                sim.pause((seed % 4) as u16, FAILURE_TIMEOUT_MS * 3);
                paused = true;
            }
            let step = sim.now_ms + 1 + rng.below(3);
            sim.run_until(step);
            let back = sim.changes.iter().any(|(_, what)| what.contains("is back"));
            if back && settled(&sim) {
                break;
            }
        }
        assert!(settled(&sim), "seed {seed}: not settled while writing ({writes} writes); the coordinator did:\n{}", sim.history());
    }
}

/// A node crashes (fsync=everysec), is removed from its chains, restarts,
/// adopts the configuration that removed it (its replicas dropped, the
/// `Dropped` records not synced yet) and crashes again before its disk
/// syncs: it starts from its log with replicas and a configuration that
/// lists it nowhere. It must come back through a state transfer like any
/// returning node: put back in place as the tail of its chains, it served
/// the prefix it had logged while its predecessors, which counted
/// everything stable, sent it nothing more (writes had stopped).
#[test]
fn a_node_that_restarts_after_its_removal_with_an_unsynced_log_returns_by_state_transfer() {
    for seed in seeds(100..106) {
        let victim = (seed % 3) as u16;
        let faults = schedule(vec![
            (1_200, Box::new(move |sim: &mut Sim| sim.crash(victim))),
            (2_100, Box::new(move |sim: &mut Sim| sim.restart(victim))),
            (2_600, Box::new(move |sim: &mut Sim| sim.crash(victim))),
            (2_700, Box::new(move |sim: &mut Sim| sim.restart(victim))),
        ]);
        let mut changes = Vec::new();
        run_site(seed, &Site { duration_ms: 3_000, ..site(3, Fsync::EverySec) }, faults, |sim, _| changes = sim.changes.clone());
        assert!(changes.iter().any(|(_, what)| what.contains(&format!("node {victim} is back"))), "seed {seed}: {changes:?}");
    }
}
