//! `causeway torture` itself, briefly: a few faults against a real site (or
//! three), and the verdict must be clean, history included. (BENCHMARKS.md records long
//! runs.)

use std::process::Command;

/// `causeway torture` with `args`.
fn torture(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_causeway")).arg("torture").args(args).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && stdout.contains("verdict: ok"), "torture failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains(" 0 lost"), "{stdout}");
    stdout
}

#[test]
fn a_short_causal_torture_run_ends_with_a_clean_verdict() {
    let stdout = torture(&["--seed", "5", "--seconds", "8", "--clients", "4", "--consistency", "causal"]);
    assert!(stdout.contains("causal+ holds"), "{stdout}");
}

#[test]
fn a_short_linearizable_torture_run_passes_porcupine() {
    let stdout = torture(&["--seed", "5", "--seconds", "8", "--clients", "4", "--consistency", "linearizable"]);
    assert!(stdout.contains("linearizable (porcupine)"), "{stdout}");
}

/// Values moving to each node's disk tier and back (a budget of a third
/// of them, small logs compacted often) through kills, pauses and restarts.
#[test]
fn a_short_torture_run_with_values_on_disk_ends_with_a_clean_verdict() {
    let stdout = torture(&["--seed", "7", "--seconds", "10", "--clients", "4", "--disk-tier"]);
    assert!(stdout.contains("causal+ holds"), "{stdout}");
}

/// Three sites of three nodes (8 partitions: nine debug-build nodes with 64
/// each starve on two cores and take turns being declared failed): seed
/// 28's schedule starts with site 2 cut off and back, then site 0's clocks
/// skewed; the history of all three sites is checked together.
#[test]
fn a_short_three_site_torture_run_keeps_causality_across_sites() {
    let stdout = torture(&["--seed", "28", "--sites", "3", "--nodes", "3", "--partitions", "8", "--clients", "3", "--seconds", "12"]);
    assert!(stdout.contains("causal+ holds") && stdout.contains("in 3 site(s)"), "{stdout}");
    assert!(stdout.contains("clocks of a site skewed") && stdout.contains("site cut off"), "{stdout}");
}

/// Site 1 backs up site 0 (`--dr`): faults on both, then site 0 is lost
/// under writers and site 1 fails over without one of its nodes, which
/// comes back empty after it; every key site 0 acknowledged reads
/// complete or is refused through every node of site 1, none older.
#[test]
fn a_short_disaster_recovery_torture_run_loses_nothing_acknowledged() {
    let stdout =
        torture(&["--seed", "101", "--sites", "2", "--nodes", "3", "--partitions", "8", "--clients", "4", "--seconds", "8", "--dr"]);
    assert!(stdout.contains("causal+ holds") && stdout.contains("site 1 failed over") && stdout.contains("none older"), "{stdout}");
    assert!(stdout.contains("back empty after it"), "{stdout}");
}

/// An erasure-coded site (ec:3+2) struck three times, one more than M: a
/// node killed and restarted empty, then one paused past the failure
/// timeout, then another killed, under writers; each comes back rebuilt
/// by decoding before the next, and every acknowledged key reads back.
#[test]
fn a_short_erasure_coded_torture_run_loses_nothing_acknowledged() {
    let stdout = torture(&["--seed", "3", "--seconds", "8", "--clients", "4", "--redundancy", "ec:3+2"]);
    assert!(stdout.contains("causal+ holds") && stdout.contains("every group's lost slots decoded"), "{stdout}");
    assert_eq!(stdout.matches("; rebuilt ").count(), 3, "{stdout}");
}
