//! Erasure-coded sites (`--redundancy ec:3+2`) with real processes: Redis
//! clients read and write as on chains (values across pages too), what is
//! not done yet is refused with a clear error, and a site loses two of its
//! five nodes (kill -9, one after the other, under writers) without losing
//! an acknowledged write.

mod common;

use common::{check_acknowledged, cluster_status, eventually, Cluster, Opts, Workload};
use std::time::Duration;

fn site() -> Cluster {
    Cluster::start_with(
        Opts::new(5, 1, 1)
            .flag("--redundancy", "ec:3+2")
            .flag("--request-timeout-ms", 1500)
            .flag("--failure-timeout-ms", 800)
            .flag("--partitions", 20),
    )
}

#[test]
fn an_ec_site_serves_redis_clients() {
    let c = site();
    let mut a = c.conn(0);
    let mut b = c.conn(3);
    let big: String = (0..100_000).map(|i| (b'a' + (i % 26) as u8) as char).collect();
    let _: () = redis::cmd("SET").arg("k").arg("v1").query(&mut a).unwrap();
    let _: () = redis::cmd("SET").arg("big").arg(&big).query(&mut a).unwrap();
    let got: String = redis::cmd("GET").arg("k").query(&mut b).unwrap();
    assert_eq!(got, "v1");
    let got: String = redis::cmd("GET").arg("big").query(&mut b).unwrap();
    assert_eq!(got, big);
    // Conditions are decided where the key's value lives.
    let nx: Option<String> = redis::cmd("SET").arg("k").arg("v2").arg("NX").query(&mut b).unwrap();
    assert_eq!(nx, None);
    let old: Option<String> = redis::cmd("SET").arg("k").arg("v3").arg("GET").query(&mut b).unwrap();
    assert_eq!(old.as_deref(), Some("v1"));
    let deleted: u64 = redis::cmd("DEL").arg("k").arg("nothing").query(&mut a).unwrap();
    assert_eq!(deleted, 1);
    let gone: Option<String> = redis::cmd("GET").arg("k").query(&mut a).unwrap();
    assert_eq!(gone, None);
    let xx: Option<String> = redis::cmd("SET").arg("k").arg("v4").arg("XX").query(&mut a).unwrap();
    assert_eq!(xx, None);
    // Not done yet: a clear error, nothing half done.
    let e = redis::cmd("MGET").arg("k").arg("big").query::<Vec<Option<String>>>(&mut a).unwrap_err();
    assert!(e.to_string().contains("not supported with erasure coding"), "{e}");
    let e = redis::cmd("SET").arg("t").arg("x").arg("PX").arg(1000).query::<()>(&mut a).unwrap_err();
    assert!(e.to_string().contains("expiry not supported with erasure coding"), "{e}");
    let none: Option<String> = redis::cmd("GET").arg("t").query(&mut a).unwrap();
    assert_eq!(none, None);
}

/// Waits until node `via` serves a configuration without `gone`.
fn wait_removed(c: &Cluster, via: usize, gone: usize) {
    eventually(Duration::from_secs(20), "the lost node to be removed", || {
        let s = cluster_status(c, via)?;
        (!common::is_member(&s, gone)).then_some(())
    });
}

#[test]
fn two_of_five_nodes_are_lost_under_writers_and_no_acknowledged_write_is() {
    let mut c = site();
    let survivors = [0, 1, 2];
    let load = Workload::spread(&c, &survivors, 6, 40);
    std::thread::sleep(Duration::from_millis(600));
    c.kill(3);
    wait_removed(&c, 0, 3);
    std::thread::sleep(Duration::from_millis(600));
    c.kill(4);
    wait_removed(&c, 0, 4);
    std::thread::sleep(Duration::from_millis(600));
    let written = load.finish();
    eprintln!("{} keys acknowledged; longest write gap seen by a writer {:?}", written.acked.len(), written.longest_gap);
    check_acknowledged(&c, &survivors, &written.acked);
}
