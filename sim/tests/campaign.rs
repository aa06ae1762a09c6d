//! Fault campaigns: many seeds, each a random sequence of faults in a row
//! under concurrent clients, with the real supervisor repairing: kill and
//! restart from the log (quick, or after removal), restart with no data,
//! pauses of nodes and of the coordinator, whole-site crashes, a node
//! replaced (one added, one drained at once). At the end
//! the site must have healed by itself and every check must hold on the
//! whole history: no acknowledged write lost, replicas identical, and
//! causal+ (a head answers other sessions only with versions on k nodes,
//! so no fault here loses a write a client has read).
//!
//! `SEED=n` replays one seed; `SIM_TRACE=1` prints what the coordinator did.

use causeway_core::ring::{NodeId, Shape};
use causeway_sim::workload::{run_site, seeds, Site};
use causeway_sim::{Fsync, Network, Rng, Sim, FAILURE_TIMEOUT_MS};

const SHAPE: Shape = Shape { partitions: 16, replicas: 3, k: 2, coding: None };
const NODES: u16 = 5;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    /// kill -9, restart from the log after `down` ms.
    Crash {
        node: NodeId,
        down: u64,
    },
    /// kill -9, restart on an empty disk after `down` ms.
    Wipe {
        node: NodeId,
        down: u64,
    },
    Pause {
        node: NodeId,
        ms: u64,
    },
    PauseCoordinator {
        ms: u64,
    },
    /// Every node killed at once, restarted after `down` ms.
    WholeSite {
        down: u64,
    },
    /// A new node added and `node` drained at once (an operator replacing
    /// a machine), maybe while chains are still forming after the last
    /// fault.
    Replace {
        node: NodeId,
    },
}

/// A random fault every 300 to 900 ms, keeping at most one node down or
/// paused at a time (R=3, k=2: the site stays writable), except for
/// whole-site crashes.
struct Campaign {
    rng: Rng,
    wipes: bool,
    next_at: Option<u64>,
    /// When the fault in progress ends, and what ends it.
    pending: Vec<(u64, Fault)>,
    busy_until: u64,
    /// The site's members (not drained), which faults pick from.
    members: Vec<NodeId>,
    pub injected: Vec<(u64, Fault)>,
}

impl Campaign {
    fn new(seed: u64, wipes: bool) -> Self {
        Campaign {
            rng: Rng::new(seed ^ 0xFA17),
            wipes,
            next_at: None,
            pending: Vec::new(),
            busy_until: 0,
            members: (0..NODES).collect(),
            injected: Vec::new(),
        }
    }

    fn step(&mut self, sim: &mut Sim, end: u64) {
        let now = sim.now_ms;
        let next = *self.next_at.get_or_insert(now + 300);
        self.pending.retain(|&(at, fault)| {
            if now < at {
                return true;
            }
            match fault {
                Fault::Crash { node, .. } => sim.restart(node),
                Fault::Wipe { node, .. } => sim.restart_without_data(node),
                Fault::WholeSite { .. } => (0..sim.node_count() as NodeId).for_each(|n| sim.restart(n)),
                Fault::Pause { .. } | Fault::PauseCoordinator { .. } | Fault::Replace { .. } => {}
            }
            false
        });
        // Faults stop a while before the end (the longest outage and a
        // failure timeout) so the site can heal.
        if now < next || now < self.busy_until || now + 4 * FAILURE_TIMEOUT_MS + 100 > end {
            return;
        }
        self.next_at = Some(now + 300 + self.rng.below(600));
        let node = self.members[self.rng.below(self.members.len() as u64) as usize];
        let down = 50 + self.rng.below(3 * FAILURE_TIMEOUT_MS);
        let kinds = if self.wipes { 7 } else { 6 };
        let fault = match self.rng.below(kinds) {
            0 | 1 => Fault::Crash { node, down },
            2 => Fault::Pause { node, ms: down },
            3 => Fault::PauseCoordinator { ms: down },
            4 => Fault::WholeSite { down },
            5 => Fault::Replace { node },
            _ => Fault::Wipe { node, down },
        };
        match fault {
            Fault::Crash { node, down } | Fault::Wipe { node, down } => {
                sim.crash(node);
                self.pending.push((now + down, fault));
            }
            Fault::Pause { node, ms } => sim.pause(node, ms),
            Fault::PauseCoordinator { ms } => sim.pause_coordinator(ms),
            Fault::WholeSite { down } => {
                (0..sim.node_count() as NodeId).for_each(|n| sim.crash(n));
                self.pending.push((now + down, fault));
            }
            Fault::Replace { node } => {
                self.members.push(sim.join());
                sim.drain(node);
                self.members.retain(|&m| m != node);
            }
        }
        // The next fault waits until this one is over and the site had a
        // moment to react.
        self.busy_until = now + down + FAILURE_TIMEOUT_MS;
        self.injected.push((now, fault));
    }
}

/// Runs one seed; returns (faults injected, acknowledged writes checked).
fn campaign(seed: u64, wipes: bool, drop_rate: f64) -> (usize, usize) {
    let site = Site {
        shape: SHAPE,
        nodes: NODES,
        network: Network { min_delay_ms: 0, max_delay_ms: 8, drop_rate },
        keys: 60,
        duration_ms: 8_000,
        check_causal: true,
        coordinator: true,
        fsync: Fsync::Always,
        tier: None,
    };
    let end = 1_000 + site.duration_ms;
    let mut faults = Campaign::new(seed, wipes);
    let injected = std::cell::RefCell::new(Vec::new());
    let run = run_site(
        seed,
        &site,
        |sim| {
            faults.step(sim, end);
            injected.replace(faults.injected.clone());
        },
        |_, _| {},
    );
    let injected = injected.into_inner();
    assert!(injected.len() >= 3, "seed {seed}: only {} faults: {injected:?}", injected.len());
    assert!(run.checker.acknowledged.len() > 100, "seed {seed}: {} acknowledged", run.checker.acknowledged.len());
    (injected.len(), run.checker.acknowledged.len())
}

/// Runs the seeds and says what was checked (`--nocapture` shows it).
fn report(name: &str, seeds: Vec<u64>, wipes: bool, drop_rate: f64) {
    let (runs, mut faults, mut acked) = (seeds.len(), 0, 0);
    for seed in seeds {
        let (f, a) = campaign(seed, wipes, drop_rate);
        faults += f;
        acked += a;
    }
    eprintln!("{name}: {runs} runs, {faults} faults injected, {acked} acknowledged writes checked, 0 lost");
}

#[test]
fn crashes_pauses_and_whole_site_restarts_in_a_row() {
    report("crashes, pauses, whole-site restarts", seeds(0..40), false, 0.0);
}

#[test]
fn with_lost_messages_and_nodes_restarted_on_empty_disks() {
    report("with lost messages and wiped disks", seeds(1_000..1_030), true, 0.01);
}
