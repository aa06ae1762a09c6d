//! Failures with real processes: kill -9 a node (the coordinator leader
//! among them) or freeze it with SIGSTOP during a write workload, and check
//! that the site heals itself (the coordinator removes the node, the chains
//! grow back to R with state transfer) without losing any acknowledged
//! write, and that every survivor serves the same data.

mod common;

use common::{check_acknowledged, cluster_status, eventually, Cluster, Opts, Workload};
use std::time::Duration;

/// A site of 4 nodes, R=3, k=2, fast failure detection.
fn site() -> Cluster {
    Cluster::start_with(Opts::new(4, 3, 2).flag("--request-timeout-ms", 1500).flag("--failure-timeout-ms", 800))
}

/// Waits until node `via` serves a configuration without `gone`, with every
/// chain back to R.
fn wait_healed(c: &Cluster, via: usize, gone: usize) -> u64 {
    eventually(Duration::from_secs(20), "the site to heal", || {
        let s = cluster_status(c, via)?;
        let healed = !common::is_member(&s, gone) && s.get("short_chains")? == "0" && s.get("joining_replicas_here")? == "0";
        healed.then(|| s["epoch"].parse().unwrap())
    })
}

fn kill_during_writes(victim: usize) {
    kill_during(victim, Workload::start);
}

fn kill_during(victim: usize, start: impl Fn(&Cluster, &[usize]) -> Workload) {
    let mut c = site();
    let survivors: Vec<usize> = (0..4).filter(|&n| n != victim).collect();
    let load = start(&c, &survivors);
    std::thread::sleep(Duration::from_millis(400));
    c.kill(victim);
    let epoch = wait_healed(&c, survivors[0], victim);
    std::thread::sleep(Duration::from_millis(300));
    let written = load.finish();
    let (acked, gap) = (written.acked, written.longest_gap);
    eprintln!(
        "killed node {victim}: healed at epoch {epoch}; {} keys acknowledged; longest write gap seen by a writer {gap:?}",
        acked.len()
    );
    assert!(epoch >= 3, "expected a removal and a re-extension, got epoch {epoch}");
    check_acknowledged(&c, &survivors, &acked);
}

#[test]
fn kill_the_coordinator_leader_during_writes() {
    // Node 0 bootstraps the Raft group and is its first leader.
    kill_during_writes(0);
}

#[test]
fn kill_a_data_node_during_writes() {
    // Node 3 runs no coordinator: only chains change.
    kill_during_writes(3);
}

/// Pipelined causal writes (each parked at its head until the one before
/// is stable) through a kill -9: every acknowledged one reads back.
#[test]
fn kill_a_data_node_during_pipelined_writes() {
    kill_during(3, |c, survivors| Workload::pipelined(c, survivors, 6, 64, 16));
}

#[test]
fn a_frozen_node_is_replaced_and_comes_back_when_it_wakes() {
    let c = site();
    let load = Workload::start(&c, &[0, 1, 2]);
    std::thread::sleep(Duration::from_millis(300));
    c.signal(3, "STOP");
    wait_healed(&c, 0, 3);
    c.signal(3, "CONT");
    // The woken node learns it was removed (its heartbeats show an old
    // epoch, so the leader pushes the current one), drops its replicas, and
    // after its hold-out the coordinator takes it back: it fetches its
    // partitions' state and the chains are whole again with it.
    eventually(Duration::from_secs(20), "node 3 to be a member again with every chain at R", || {
        let s = cluster_status(&c, 0)?;
        (common::is_member(&s, 3) && s.get("short_chains")? == "0" && s.get("transfers_in_flight")? == "0").then_some(())
    });
    c.wait_serving(&[3]);
    let acked = load.finish().acked;
    check_acknowledged(&c, &[0, 1, 2, 3], &acked);
}
