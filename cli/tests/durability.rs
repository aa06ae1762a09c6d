//! The write-ahead log: a whole site killed with kill -9 and restarted
//! with fsync=always loses no acknowledged write, and a single node that
//! restarts catches up from its chain neighbours.

mod common;

use common::{eventually, write_keys, Cluster, Opts};
use redis::Commands;
use std::time::Duration;

fn all_present(c: &Cluster, node: usize, keys: &[(String, String)]) -> bool {
    let Ok(mut con) = c.client(node).get_connection_with_timeout(Duration::from_secs(1)) else { return false };
    keys.iter().all(|(k, v)| con.get::<_, Option<String>>(k).ok().flatten().as_deref() == Some(v.as_str()))
}

#[test]
fn a_whole_site_restarted_with_fsync_always_keeps_every_acknowledged_write() {
    let mut c = Cluster::start_with(Opts::new(3, 3, 2).durable().flag("--fsync", "always").flag("--request-timeout-ms", 2000));
    let keys = write_keys(&c, "site:", 300);
    for i in 0..3 {
        c.kill(i);
    }
    for i in 0..3 {
        c.restart(i);
    }
    for node in 0..3 {
        eventually(Duration::from_secs(15), "every key after the restart", || all_present(&c, node, &keys).then_some(()));
    }
    // And the site takes writes again.
    let more = write_keys(&c, "after:", 20);
    assert!(all_present(&c, 2, &more));
}

#[test]
fn a_restarted_node_catches_up_from_its_neighbours() {
    // A long failure timeout: the node comes back before the coordinator
    // would remove it, so it resumes its place in its chains.
    let mut c = Cluster::start_with(
        Opts::new(3, 3, 2).durable().flag("--fsync", "always").flag("--failure-timeout-ms", 60_000).flag("--request-timeout-ms", 500),
    );
    let before = write_keys(&c, "before:", 100);
    c.kill(2);
    // While node 2 is down, writes whose chain has it as the tail still
    // reach k=2 nodes and are acknowledged; the others time out.
    let mut con = c.conn(0);
    let during: Vec<(String, String)> =
        (0..24).map(|i| (format!("during:{i}"), format!("v{i}"))).filter(|(k, v)| con.set::<_, _, ()>(k, v).is_ok()).collect();
    assert!(!during.is_empty(), "no write succeeded while node 2 was down");
    c.restart(2);
    // Node 2 has what it logged before it died, and gets what it missed
    // from its predecessors' resends. Linearizable reads are served by the
    // tails, node 2 among them.
    for keys in [&before, &during] {
        eventually(Duration::from_secs(15), "node 2 to serve every key", || {
            let mut con = c.client(2).get_connection_with_timeout(Duration::from_secs(1)).ok()?;
            let _: () = redis::cmd("CW.CONSISTENCY").arg("linearizable").query(&mut con).ok()?;
            keys.iter().all(|(k, v)| con.get::<_, Option<String>>(k).ok().flatten().as_deref() == Some(v.as_str())).then_some(())
        });
    }
}

#[test]
fn a_compacted_log_recovers_everything() {
    // A small compaction threshold: the log is checkpointed while 4 KiB
    // values are written and overwritten.
    let mut c = Cluster::start_with(Opts::new(3, 3, 2).durable().flag("--fsync", "always").flag("--wal-compact-bytes", 100_000));
    let big = |round: usize, i: usize| format!("{round}-{i}-{}", "x".repeat(4096));
    let mut con = c.conn(1);
    for round in 0..4 {
        for i in 0..100 {
            let _: () = con.set(format!("k:{i}"), big(round, i)).unwrap();
        }
        std::thread::sleep(Duration::from_millis(1100));
    }
    // 400 writes of 4 KiB went through every node's log (1.6 MiB); after
    // compaction it holds about the 100 live values.
    let dir = c.opts.data_dir.clone().unwrap();
    let log = std::fs::metadata(dir.join("node0").join("wal.log")).unwrap().len();
    assert!(log < 1_000_000, "the log was not compacted ({log} bytes)");
    for i in 0..3 {
        c.kill(i);
    }
    for i in 0..3 {
        c.restart(i);
    }
    let expect: Vec<(String, String)> = (0..100).map(|i| (format!("k:{i}"), big(3, i))).collect();
    for node in 0..3 {
        eventually(Duration::from_secs(15), "every key after the restart", || all_present(&c, node, &expect).then_some(()));
    }
}

/// Regression: after a restart, new Redis connections got session ids the
/// node had already used, and replicas (which remember each session's last
/// write, to apply a resent write once) acknowledged their first SET
/// without applying it.
#[test]
fn new_sessions_after_a_restart_are_not_mistaken_for_old_ones() {
    let mut c = Cluster::start_with(Opts::new(3, 3, 2).durable().flag("--fsync", "always").flag("--failure-timeout-ms", 60_000));
    for i in 0..6 {
        let _: () = redis::Commands::set(&mut c.conn(0), "k", format!("before-{i}")).unwrap();
    }
    c.kill(0);
    c.restart(0);
    common::eventually(Duration::from_secs(10), "node 0 to serve again", || {
        let mut con = c.client(0).get_connection_with_timeout(Duration::from_secs(1)).ok()?;
        redis::cmd("PING").query::<String>(&mut con).ok()
    });
    // The restarted node catches up from its neighbours first (peer
    // connections are re-established lazily): writes through it may time
    // out meanwhile; see the issue-3 note.
    common::eventually(Duration::from_secs(20), "writes through node 0 to work again", || {
        redis::cmd("SET").arg("probe").arg("1").query::<String>(&mut c.conn(0)).ok()
    });
    for i in 0..6 {
        let mut con = c.conn(0);
        let ok: String = redis::cmd("SET").arg("k").arg(format!("after-{i}")).query(&mut con).unwrap();
        assert_eq!(ok, "OK");
        let got: Option<String> = redis::cmd("CW.WITH").arg("causal").arg("GET").arg("k").query(&mut con).unwrap();
        assert_eq!(got, Some(format!("after-{i}")), "an acknowledged SET of a new session must be applied");
    }
}
