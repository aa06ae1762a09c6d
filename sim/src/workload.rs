//! A random client workload over a simulated site, with a hook for faults,
//! and the end-of-run checks every simulation test shares.

use crate::check::CausalChecker;
use crate::{Completed, Fsync, Network, Rng, Sim, SimTier};
use bytes::Bytes;
use causeway_checker::replicas;
use causeway_core::driver::Request;
use causeway_core::message::Change;
use causeway_core::ring::{NodeId, Shape, Topology};

/// What a run did.
pub struct Run {
    pub checker: CausalChecker,
    pub completed: usize,
    pub failed: usize,
    /// Writes of pipelines that waited at their heads for the write before
    /// them (`core::node::put`).
    pub parked: u64,
}

/// Drives `clients` random clients over `keys` keys for `duration_ms` of
/// virtual time, then lets the network settle and checks everything.
pub fn run(seed: u64, shape: Shape, nodes: u16, network: Network, keys: usize, duration_ms: u64) -> Run {
    run_with_faults(seed, shape, nodes, network, keys, duration_ms, |_| {})
}

/// `run`, calling `faults` between steps so a test can crash nodes and
/// install configurations.
pub fn run_with_faults(
    seed: u64,
    shape: Shape,
    nodes: u16,
    network: Network,
    keys: usize,
    duration_ms: u64,
    faults: impl FnMut(&mut Sim),
) -> Run {
    let site = Site { shape, nodes, network, keys, duration_ms, check_causal: true, coordinator: false, fsync: Fsync::Always, tier: None };
    run_site(seed, &site, faults, |_, _| {})
}

/// What a simulated run looks like.
#[derive(Clone, Debug)]
pub struct Site {
    pub shape: Shape,
    pub nodes: u16,
    pub network: Network,
    pub keys: usize,
    pub duration_ms: u64,
    pub check_causal: bool,
    /// Run the real supervisor from heartbeats (else the test installs
    /// configurations itself).
    pub coordinator: bool,
    pub fsync: Fsync,
    /// A disk tier on every node; values are then a few hundred bytes
    /// (they, not the keys, fill the memory the tier frees).
    pub tier: Option<SimTier>,
}

/// Runs `site`, calling `faults` between steps, then lets it settle (with
/// a coordinator: until it has healed, every node back in the chains) and
/// checks causal+ (if asked), convergence and, through `acknowledged`
/// (which may drop what the run's faults were allowed to lose), that no
/// acknowledged write is lost.
pub fn run_site(seed: u64, site: &Site, mut faults: impl FnMut(&mut Sim), allowed_loss: impl FnOnce(&Sim, &mut CausalChecker)) -> Run {
    let Site { shape, nodes, ref network, keys, duration_ms, check_causal, coordinator, fsync, tier } = *site;
    let mut sim = Sim::new(seed, nodes, shape, 6, network.clone());
    sim.fsync = fsync;
    if let Some(tier) = tier {
        sim = sim.with_tier(tier);
    }
    let pad = if tier.is_some() { "-".repeat(200) } else { String::new() };
    if coordinator {
        sim = sim.with_coordinator();
    }
    let clients = 6;
    let mut rng = Rng::new(seed ^ 0xC0FFEE);
    let mut checker = CausalChecker::default();
    let mut writes = 0u64;
    let mut completed = 0;
    let mut failed = 0;
    let key = |i: u64| Bytes::from(format!("key{i}"));
    let end = sim.now_ms + duration_ms;
    let mut record = |checker: &mut CausalChecker, done: Vec<Completed>| {
        for c in done {
            if c.result.is_err() {
                failed += 1;
            }
            completed += 1;
            checker.completed(&c);
        }
    };
    while sim.now_ms < end {
        for client in 0..clients {
            if !sim.is_idle(client) || !rng.chance(0.5) {
                continue;
            }
            let request = match rng.below(10) {
                0..=3 => {
                    // Half the time a pipeline: writes sent together, each
                    // ordered after the one before it by its head.
                    let burst = if rng.chance(0.5) { 2 + rng.below(3) } else { 1 };
                    for _ in 1..burst {
                        writes += 1;
                        let value = Bytes::from(format!("c{client}-w{writes}{pad}"));
                        checker.issued_write(client, &value);
                        let put = Request::Put { key: key(rng.below(keys as u64)), change: Change::set(value) };
                        let done = sim.start(client, put);
                        record(&mut checker, done);
                    }
                    writes += 1;
                    let value = Bytes::from(format!("c{client}-w{writes}{pad}"));
                    checker.issued_write(client, &value);
                    Request::Put { key: key(rng.below(keys as u64)), change: Change::set(value) }
                }
                4..=7 => Request::Get(key(rng.below(keys as u64))),
                _ => {
                    let n = 2 + rng.below(3);
                    let mut ks: Vec<Bytes> = (0..n).map(|_| key(rng.below(keys as u64))).collect();
                    ks.sort();
                    ks.dedup();
                    Request::MultiGet(ks)
                }
            };
            let done = sim.start(client, request);
            record(&mut checker, done);
        }
        faults(&mut sim);
        let step = sim.now_ms + 1 + rng.below(3);
        let done = sim.run_until(step);
        record(&mut checker, done);
    }
    // Let everything in flight land; retransmissions repair any drops.
    sim.network.drop_rate = 0.0;
    for _ in 0..600 {
        let until = sim.now_ms + 100;
        let done = sim.run_until(until);
        record(&mut checker, done);
        if sim.settled() && (0..clients).all(|c| sim.is_idle(c)) && (!coordinator || sim.healed()) {
            break;
        }
    }
    if coordinator {
        assert!(sim.healed(), "seed {seed}: the site did not heal by itself; the coordinator did:\n{}", sim.history());
    }
    allowed_loss(&sim, &mut checker);
    let digests = sim.digests();
    if let Err(e) = replicas::converged(&digests).and_then(|()| replicas::durable(&digests, &checker.acknowledged)) {
        panic!("seed {seed}: {e}");
    }
    if check_causal {
        assert!(checker.violations.is_empty(), "seed {seed}: causal+ violated:\n{}", checker.violations.join("\n"));
    }
    let parked = (0..sim.node_count() as NodeId).map(|n| sim.node(n).parked_writes().0).sum();
    Run { checker, completed, failed, parked }
}

/// The seeds to run: `SEED=n` replays one, `SEEDS=a..b` runs a longer
/// campaign than the default.
pub fn seeds(default: std::ops::Range<u64>) -> Vec<u64> {
    if let Ok(s) = std::env::var("SEED") {
        return vec![s.parse().expect("SEED is a number")];
    }
    match std::env::var("SEEDS").ok().and_then(|r| r.split_once("..").map(|(a, b)| (a.parse(), b.parse()))) {
        Some((Ok(a), Ok(b))) => (a..b).collect(),
        _ => default.collect(),
    }
}

/// A node failure as the coordinator handles it: the node `pick` chooses
/// (from the topology at that moment) crashes `crash_at` ms after the first
/// `step`, is removed from every chain `detect` ms later, and the chains
/// grow back to R (state transfer) `extend` ms after that.
pub struct Failure<F> {
    pick: F,
    crash_at: u64,
    detect: u64,
    extend: u64,
    start: Option<u64>,
    victim: NodeId,
    phase: u8,
}

impl<F: Fn(&Topology) -> NodeId> Failure<F> {
    pub fn new(crash_at: u64, detect: u64, extend: u64, pick: F) -> Self {
        Failure { pick, crash_at, detect, extend, start: None, victim: 0, phase: 0 }
    }

    /// Does what is due by now; call it between simulation steps.
    pub fn step(&mut self, sim: &mut Sim) {
        let t = sim.now_ms - *self.start.get_or_insert(sim.now_ms);
        if self.phase == 0 && t >= self.crash_at {
            self.victim = (self.pick)(sim.topology());
            sim.crash(self.victim);
            self.phase = 1;
        } else if self.phase == 1 && t >= self.crash_at + self.detect {
            let repaired = sim.topology().without(self.victim);
            sim.install(repaired);
            self.phase = 2;
        } else if self.phase == 2 && t >= self.crash_at + self.detect + self.extend {
            let extended = sim.topology().rebalanced();
            sim.install(extended);
            self.phase = 3;
        }
    }

    /// Whether the chains were extended back (the whole repair ran).
    pub fn repaired(&self) -> bool {
        self.phase == 3
    }
}
