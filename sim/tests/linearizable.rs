//! Linearizable mode through chain repair: clients write, read and MGET a few keys
//! while a node dies, the coordinator removes it, then extends the chains
//! back with a joining tail (state transfer). Every history must pass
//! porcupine (tools/lincheck), with writes whose outcome is unknown allowed
//! to land at any time after their call.

use bytes::Bytes;
use causeway_checker::lincheck::{self, Op, OpKind};
use causeway_core::driver::{Consistency, Request, Response};
use causeway_core::message::Change;
use causeway_core::ring::{Shape, Topology};
use causeway_sim::workload::{seeds, Failure};
use causeway_sim::{Completed, Network, Rng, Sim, FAILURE_TIMEOUT_MS};

fn text(value: &Option<Bytes>) -> String {
    value.as_ref().map(|v| String::from_utf8_lossy(v).to_string()).unwrap_or_default()
}

const SHAPE: Shape = Shape { partitions: 8, replicas: 3, k: 2, coding: None };
const CLIENTS: usize = 6;

fn history_through_repair(seed: u64, network: Network) {
    let (crash_at, detect, extend) = (300 + seed * 37 % 400, 100 + seed % 150, 150 + seed * 13 % 300);
    // Head, middle or tail of one partition's chain.
    let mut failure =
        Failure::new(crash_at, detect, extend, |t: &Topology| t.chain((seed % SHAPE.partitions as u64) as u32).nodes[seed as usize % 3]);
    let sim = Sim::new(seed, 5, SHAPE, CLIENTS, network);
    check_history(seed, sim, |sim| failure.step(sim));
    assert!(failure.repaired(), "seed {seed}: the repair did not run");
}

/// Runs linearizable clients on `sim` for 2 s of virtual time with `faults`
/// between steps, and checks the history with porcupine.
fn check_history(seed: u64, mut sim: Sim, mut faults: impl FnMut(&mut Sim)) {
    for c in 0..CLIENTS {
        sim.set_consistency(c, Consistency::Linearizable);
    }
    let mut rng = Rng::new(seed ^ 0x11E4);
    // Real-time order: one counter ticks at every call and every return.
    let mut clock = 0i64;
    let mut pending: Vec<Option<Op>> = vec![None; CLIENTS];
    let mut history = Vec::new();
    let finish = |c: Completed, clock: &mut i64, pending: &mut Vec<Option<Op>>, history: &mut Vec<Op>| {
        *clock += 1;
        let mut op = pending[c.client].take().expect("a call was recorded");
        match (&mut op.kind, &c.result) {
            (OpKind::Put(_), Ok(_)) => op.ret = Some(*clock),
            (OpKind::Put(_), Err(_)) => {}
            (OpKind::Get(out), Ok(Response::Read { value, .. })) => {
                *out = text(value);
                op.ret = Some(*clock);
            }
            (OpKind::MultiGet { values, .. }, Ok(Response::Values(got))) => {
                *values = got.iter().map(text).collect();
                op.ret = Some(*clock);
            }
            // A failed read tells nothing.
            (OpKind::Get(_) | OpKind::MultiGet { .. }, _) => return,
        }
        history.push(op);
    };
    let start = sim.now_ms;
    let mut writes = 0;
    while sim.now_ms < start + 2_000 {
        for client in 0..CLIENTS {
            if !sim.is_idle(client) || pending[client].is_some() || !rng.chance(0.5) {
                continue;
            }
            let key = format!("k{}", rng.below(3));
            let kind = match rng.below(10) {
                0..=4 => {
                    writes += 1;
                    OpKind::Put(format!("c{client}-{writes}"))
                }
                5..=7 => OpKind::Get(String::new()),
                _ => {
                    let first = rng.below(3);
                    let keys = vec![format!("k{first}"), format!("k{}", (first + 1 + rng.below(2)) % 3)];
                    OpKind::MultiGet { keys, values: Vec::new() }
                }
            };
            let request = match &kind {
                OpKind::Put(v) => Request::Put { key: Bytes::from(key.clone()), change: Change::set(Bytes::from(v.clone())) },
                OpKind::Get(_) => Request::Get(Bytes::from(key.clone())),
                OpKind::MultiGet { keys, .. } => Request::MultiGet(keys.iter().map(|k| Bytes::from(k.clone())).collect()),
            };
            clock += 1;
            pending[client] = Some(Op { client, key, kind, call: clock, ret: None });
            for c in sim.start(client, request) {
                finish(c, &mut clock, &mut pending, &mut history);
            }
        }
        faults(&mut sim);
        let step = sim.now_ms + 1 + rng.below(3);
        for c in sim.run_until(step) {
            finish(c, &mut clock, &mut pending, &mut history);
        }
    }
    // Operations still in flight: unknown outcome for writes.
    history.extend(pending.into_iter().flatten().filter(|op| matches!(op.kind, OpKind::Put(_))));
    eprintln!("seed {seed}: {} operations, {} with unknown outcome", history.len(), history.iter().filter(|o| o.ret.is_none()).count());
    assert!(history.len() > 50, "seed {seed}: only {} operations", history.len());
    assert!(lincheck::check(&history), "seed {seed}: not linearizable (replay with SEED={seed}):\n{}", lincheck::to_json(&history));
}

#[test]
fn linearizable_through_head_middle_and_tail_failures() {
    for seed in seeds(0..24) {
        history_through_repair(seed, Network { min_delay_ms: 0, max_delay_ms: 8, drop_rate: 0.0 });
    }
}

#[test]
fn linearizable_through_failures_with_lossy_links() {
    for seed in seeds(100..116) {
        history_through_repair(seed, Network { min_delay_ms: 1, max_delay_ms: 12, drop_rate: 0.02 });
    }
}

/// The stale read leases prevent: the tail of a chain is paused (SIGSTOP)
/// past the failure timeout, the coordinator removes it and a new tail
/// acknowledges writes; when the old tail wakes, requests sent to it while
/// it slept (by clients still routing with the old map) find it still
/// believing it is the tail. Without a lease it would answer them with what
/// it had before the pause.
#[test]
fn linearizable_while_tails_are_paused_and_removed() {
    for seed in seeds(200..216) {
        let sim = Sim::new(seed, 4, SHAPE, CLIENTS, Network { min_delay_ms: 0, max_delay_ms: 8, drop_rate: 0.0 }).with_coordinator();
        let mut paused = 0;
        let mut next_at = sim.now_ms + 200;
        check_history(seed, sim, |sim| {
            if sim.now_ms >= next_at {
                let key = format!("k{}", (seed + paused) % 3);
                let tail = sim.topology().chain(sim.topology().partition_of(key.as_bytes())).tail();
                sim.pause(tail, FAILURE_TIMEOUT_MS * 2);
                paused += 1;
                next_at = sim.now_ms + FAILURE_TIMEOUT_MS * 3;
            }
        });
    }
}
