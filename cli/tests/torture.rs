//! `causeway torture` itself, briefly: a few faults against a real site, and
//! the verdict must be clean, history included. (BENCHMARKS.md records long
//! runs.)

use std::process::Command;

fn torture(level: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_causeway"))
        .args(["torture", "--seconds", "8", "--seed", "5", "--clients", "4", "--consistency", level])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && stdout.contains("verdict: ok"), "torture failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains(" 0 lost"), "{stdout}");
    stdout
}

#[test]
fn a_short_causal_torture_run_ends_with_a_clean_verdict() {
    let stdout = torture("causal");
    assert!(stdout.contains("session guarantees hold"), "{stdout}");
}

#[test]
fn a_short_linearizable_torture_run_passes_porcupine() {
    let stdout = torture("linearizable");
    assert!(stdout.contains("linearizable (porcupine)"), "{stdout}");
}
