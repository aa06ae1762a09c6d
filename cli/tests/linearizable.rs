//! Histories recorded in linearizable mode, with a node killed midway,
//! checked by a real linearizability checker: porcupine, through the small
//! Go program in tools/lincheck.

mod common;

use common::{Cluster, Opts};
use redis::Commands;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Builds tools/lincheck once per test binary.
fn lincheck() -> PathBuf {
    static BUILT: Mutex<Option<PathBuf>> = Mutex::new(None);
    let mut built = BUILT.lock().unwrap();
    if let Some(p) = &*built {
        return p.clone();
    }
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tools/lincheck");
    let out = std::env::temp_dir().join(format!("causeway-lincheck-{}", std::process::id()));
    let status = Command::new("go")
        .arg("build")
        .arg("-o")
        .arg(&out)
        .arg(".")
        .current_dir(&dir)
        .status()
        .expect("go is installed (.ci/run installs it)");
    assert!(status.success(), "building tools/lincheck failed");
    *built = Some(out.clone());
    out
}

/// Runs the checker on a JSON history; true if linearizable.
fn check(history: &str) -> bool {
    let mut child = Command::new(lincheck()).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    child.stdin.take().unwrap().write_all(history.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    eprintln!("{text}");
    match out.status.code() {
        Some(0) => true,
        Some(1) => false,
        other => panic!("lincheck failed ({other:?}): {text}"),
    }
}

#[test]
fn the_checker_rejects_a_stale_read() {
    // put(a,1) completes, then a get that starts later reads nothing.
    let bad = r#"[{"client":0,"op":"put","key":"a","value":"1","output":"","call":0,"return":10},
                 {"client":1,"op":"get","key":"a","value":"","output":"","call":20,"return":30}]"#;
    assert!(!check(bad));
}

#[test]
fn linearizable_mode_through_a_node_failure() {
    let mut c = Cluster::start_with(Opts::new(4, 3, 2).flag("--request-timeout-ms", 1500).flag("--failure-timeout-ms", 800));
    let survivors = [0usize, 1, 2];
    for &n in &survivors {
        common::eventually(Duration::from_secs(10), &format!("node {n} to answer\n{}", c.logs()), || {
            let mut con = c.client(n).get_connection_with_timeout(Duration::from_secs(1)).ok()?;
            redis::cmd("PING").query::<String>(&mut con).ok()
        });
    }
    let start = Instant::now();
    let history = Arc::new(Mutex::new(Vec::<String>::new()));
    let threads: Vec<_> = (0..6)
        .map(|client| {
            let (redis_client, history) = (c.client(survivors[client % 3]), history.clone());
            std::thread::spawn(move || {
                let connect = || {
                    let mut con = redis_client.get_connection().unwrap();
                    let _: () = redis::cmd("CW.CONSISTENCY").arg("linearizable").query(&mut con).unwrap();
                    con
                };
                let mut con = connect();
                let mut n = 0u64;
                let deadline = start + Duration::from_millis(3_000);
                while Instant::now() < deadline {
                    n += 1;
                    let key = format!("lk{}", (n * 7 + client as u64) % 4);
                    let call = start.elapsed().as_nanos() as i64;
                    let entry = if n.is_multiple_of(2) {
                        let value = format!("c{client}-{n}");
                        let result: redis::RedisResult<String> = con.set(&key, &value);
                        // A put that failed may still have happened.
                        let ret = if result.is_ok() { start.elapsed().as_nanos() as i64 } else { -1 };
                        Some(format!(
                            r#"{{"client":{client},"op":"put","key":"{key}","value":"{value}","output":"","call":{call},"return":{ret}}}"#
                        ))
                    } else {
                        // A get that failed tells nothing: left out.
                        let result: redis::RedisResult<Option<String>> = con.get(&key);
                        let ret = start.elapsed().as_nanos() as i64;
                        result.ok().map(|v| {
                            format!(
                                r#"{{"client":{client},"op":"get","key":"{key}","value":"","output":"{}","call":{call},"return":{ret}}}"#,
                                v.unwrap_or_default()
                            )
                        })
                    };
                    let failed = entry.as_ref().is_none_or(|e| e.contains(r#""return":-1"#));
                    history.lock().unwrap().extend(entry);
                    if failed {
                        con = connect();
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(800));
    c.kill(3);
    for t in threads {
        t.join().unwrap();
    }
    let history = history.lock().unwrap();
    assert!(history.len() > 100, "only {} operations recorded", history.len());
    let json = format!("[{}]", history.join(","));
    assert!(check(&json), "linearizable mode produced a non-linearizable history:\n{json}");
}
