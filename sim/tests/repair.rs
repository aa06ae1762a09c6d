//! Chain repair under a write workload (ChainReaction §3.3.3): a node dies
//! (head, middle or tail of some chain), the coordinator removes it from
//! every chain, then extends the chains back to R with state transfer. No
//! acknowledged write may be lost, every live replica must converge, and
//! the history must be causal+.

use causeway_core::ring::{Shape, Topology};
use causeway_sim::workload::{run_with_faults, seeds, Failure};
use causeway_sim::{Network, Sim};

const SHAPE: Shape = Shape { partitions: 16, replicas: 3, k: 2, coding: None };

#[derive(Clone, Copy, Debug)]
enum Role {
    Head,
    Middle,
    Tail,
}

/// Kills the node playing `role` in partition `seed % 16`'s chain at
/// `crash_at` ms, repairs after `detect` ms, extends 300 ms later.
fn crash_and_repair(seed: u64, role: Role, crash_at: u64, detect: u64, network: Network) {
    let mut failure = Failure::new(crash_at, detect, 300, |t: &Topology| {
        let chain = t.chain((seed % 16) as u32);
        match role {
            Role::Head => chain.head(),
            Role::Middle => chain.nodes[1],
            Role::Tail => chain.tail(),
        }
    });
    let run = run_with_faults(seed, SHAPE, 5, network, 200, 3_000, |sim: &mut Sim| failure.step(sim));
    assert!(failure.repaired(), "seed {seed}: the repair did not run");
    assert!(run.checker.acknowledged.len() > 50, "seed {seed}: only {} acknowledged writes", run.checker.acknowledged.len());
}

#[test]
fn head_failure() {
    for seed in seeds(0..25) {
        crash_and_repair(seed, Role::Head, 500 + seed * 37 % 500, 150, Network { min_delay_ms: 0, max_delay_ms: 8, drop_rate: 0.0 });
    }
}

#[test]
fn middle_failure() {
    for seed in seeds(100..125) {
        crash_and_repair(seed, Role::Middle, 500 + seed * 37 % 500, 150, Network { min_delay_ms: 0, max_delay_ms: 8, drop_rate: 0.0 });
    }
}

#[test]
fn tail_failure() {
    for seed in seeds(200..225) {
        crash_and_repair(seed, Role::Tail, 500 + seed * 37 % 500, 150, Network { min_delay_ms: 0, max_delay_ms: 8, drop_rate: 0.0 });
    }
}

#[test]
fn failure_with_lossy_links() {
    for seed in seeds(300..320) {
        let role = [Role::Head, Role::Middle, Role::Tail][seed as usize % 3];
        crash_and_repair(
            seed,
            role,
            400 + seed * 53 % 800,
            100 + seed % 200,
            Network { min_delay_ms: 1, max_delay_ms: 12, drop_rate: 0.02 },
        );
    }
}
