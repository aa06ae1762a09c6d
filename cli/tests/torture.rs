//! `causeway torture` itself, briefly: a few faults against a real site, and
//! the verdict must be clean. (BENCHMARKS.md records long runs.)

use std::process::Command;

#[test]
fn a_short_torture_run_ends_with_a_clean_verdict() {
    let out =
        Command::new(env!("CARGO_BIN_EXE_causeway")).args(["torture", "--seconds", "8", "--seed", "5", "--clients", "4"]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && stdout.contains("verdict: ok"), "torture failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains(" 0 lost"), "{stdout}");
}
