//! A site that never loses an acknowledged write and heals itself, with
//! real processes and a stock Redis client:
//!
//! * the whole site killed at once (kill -9) while 16 connections spread
//!   over every node write, then restarted from its logs (fsync=always):
//!   every acknowledged value reads back at every consistency level through
//!   every node, and the replicas of each chain are identical;
//! * a node paused past the failure timeout, then the coordinator leader
//!   paused as long: the site comes back to every node a member, every
//!   chain at R and back in its placed order (roles balanced), and writes
//!   keep flowing;
//! * a coordinator member restarted on an empty disk: it rejoins (its Raft
//!   log caught up from the leader) and the coordinator keeps deciding.

mod common;

use common::{cluster_status, is_member, Cluster, Opts, Workload, Written};
use redis::Commands;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);

/// Every node's `CW.DIGEST`: partition -> (node -> line).
fn digests(c: &Cluster, nodes: &[usize]) -> BTreeMap<String, BTreeMap<usize, String>> {
    let mut all: BTreeMap<String, BTreeMap<usize, String>> = BTreeMap::new();
    for &n in nodes {
        let text: String = redis::cmd("CW.DIGEST").query(&mut c.conn(n)).unwrap();
        for line in text.lines() {
            let (p, rest) = line.split_once(':').unwrap();
            all.entry(p.to_string()).or_default().insert(n, rest.to_string());
        }
    }
    all
}

/// Waits until every chain's replicas show the same digest, with nothing
/// left unstable, and returns how many partitions were compared.
fn replicas_identical(c: &Cluster, nodes: &[usize]) -> usize {
    c.eventually(WAIT, "every chain's replicas to be identical", || {
        let all = digests(c, nodes);
        let same = all.values().all(|by_node| {
            let lines: Vec<&String> = by_node.values().collect();
            let stable = lines.iter().all(|l| {
                let f: Vec<&str> = l.split(':').collect();
                f[0] == f[1]
            });
            stable && lines.windows(2).all(|w| w[0] == w[1])
        });
        same.then_some(all.len())
    })
}

/// Every acknowledged value through every node at every level.
fn readable_everywhere(c: &Cluster, nodes: &[usize], acked: &HashMap<String, String>) {
    for &node in nodes {
        for level in ["linearizable", "causal", "eventual"] {
            let mut con = c.conn(node);
            let _: () = redis::cmd("CW.CONSISTENCY").arg(level).query(&mut con).unwrap();
            for (k, v) in acked {
                let got: Option<String> = con.get(k).unwrap();
                assert_eq!(got.as_deref(), Some(v.as_str()), "{level} read of {k} through node {node}\n{}", c.logs());
            }
        }
    }
}

#[test]
fn a_whole_site_killed_under_concurrent_writers_comes_back_with_every_acknowledged_write() {
    let mut c = Cluster::start_with(Opts::new(3, 3, 2).durable().flag("--fsync", "always").flag("--request-timeout-ms", 2000));
    let load = Workload::spread(&c, &[0, 1, 2], 16, 400);
    std::thread::sleep(Duration::from_secs(2));
    for i in 0..3 {
        c.kill(i);
    }
    let Written { acked, tried, .. } = load.finish();
    assert!(acked.len() > 200, "only {} keys acknowledged ({tried} writes tried)", acked.len());
    for i in 0..3 {
        c.restart(i);
    }
    c.wait_serving(&[0, 1, 2]);
    let partitions = replicas_identical(&c, &[0, 1, 2]);
    assert_eq!(partitions, 64);
    readable_everywhere(&c, &[0, 1, 2], &acked);
    // And it takes writes again, through every node.
    for n in 0..3 {
        let _: () = c.conn(n).set(format!("after:{n}"), "x").unwrap();
    }
}

#[test]
fn a_paused_node_then_a_paused_leader_and_the_site_heals_by_itself() {
    let c = Cluster::start_with(Opts::new(4, 3, 2).flag("--request-timeout-ms", 1500).flag("--failure-timeout-ms", 800));
    let load = Workload::spread(&c, &[0, 1, 2, 3], 8, 50);
    let healed = |what: &str| c.settled(&[0, 1, 2, 3], what);
    let leader = healed("the site to start whole");
    let placed = c.chains(0);
    // A data node (not the leader) frozen past the failure timeout: removed,
    // then back by itself once it wakes.
    let victim = (0..4).find(|&n| n != leader).unwrap();
    c.signal(victim, "STOP");
    c.eventually(WAIT, "the frozen node to be removed", || (!is_member(&cluster_status(&c, leader)?, victim)).then_some(()));
    c.signal(victim, "CONT");
    let leader = healed("the woken node to be back");
    // It kept its replicas while out: where its predecessor's recent
    // updates reached back far enough, it got only what it missed.
    let info: String = redis::cmd("INFO").arg("replication").query(&mut c.conn(victim)).unwrap();
    let suffixes = info.lines().find_map(|l| l.strip_prefix("state_transfers_suffix:")).unwrap().trim().parse::<u64>().unwrap();
    eprintln!("the woken node's transfers: {}", info.lines().filter(|l| l.starts_with("state_transfers")).collect::<Vec<_>>().join(", "));
    assert!(suffixes > 0, "the woken node got every partition back as a whole state:\n{info}");
    // Then the coordinator leader frozen as long: when it wakes, what it
    // heard before is stale and it must not remove a healthy node.
    let epoch_before: u64 = cluster_status(&c, leader).unwrap()["epoch"].parse().unwrap();
    c.signal(leader, "STOP");
    std::thread::sleep(Duration::from_millis(2500));
    c.signal(leader, "CONT");
    healed("the site to be whole after the leader's pause");
    std::thread::sleep(Duration::from_millis(1500));
    let after = healed("the site to stay whole");
    let status = cluster_status(&c, after).unwrap();
    // The frozen leader itself was removed and came back (epochs moved), but
    // every node is a member and serving.
    assert!(status["epoch"].parse::<u64>().unwrap() >= epoch_before);
    c.wait_serving(&[0, 1, 2, 3]);
    let before_stop = load.acked_keys();
    std::thread::sleep(Duration::from_millis(500));
    let Written { acked, tried, longest_gap } = load.finish();
    eprintln!("pause, then leader pause: longest write gap {longest_gap:?}, {tried} writes tried");
    assert!(before_stop > 20 && tried > 100, "writes kept flowing: {before_stop} keys, {tried} writes");
    readable_everywhere(&c, &[0, 1, 2, 3], &acked);
    replicas_identical(&c, &[0, 1, 2, 3]);
    // The nodes that came back took the tail of their chains; roles move
    // back to the placed order by themselves (heads, middles and tails as
    // at the start).
    c.eventually(WAIT, "every chain back in its placed order", || (c.chains(0) == placed).then_some(()));
}

#[test]
fn a_coordinator_member_restarted_on_an_empty_disk_rejoins_and_the_coordinator_keeps_deciding() {
    let mut c = Cluster::start_with(Opts::new(4, 3, 2).durable().flag("--fsync", "always").flag("--failure-timeout-ms", 800));
    let leader_of = |c: &Cluster| (0..3).find_map(|i| cluster_status(c, i)?.get("coordinator_leader")?.parse::<usize>().ok());
    let whole = |c: &Cluster, what: &str| c.settled(&[0, 1, 2, 3], what);
    whole(&c, "the site to start whole");
    for i in 0..50 {
        let _: () = c.conn(i % 4).set(format!("before:{i}"), i).unwrap();
    }
    // A coordinator member that follows (the leader has replicated its log
    // to it) loses its disk: its Raft log is gone.
    let leader = leader_of(&c).unwrap();
    let victim = (0..3).find(|&n| n != leader).unwrap();
    c.kill(victim);
    let dir = c.opts.data_dir.clone().unwrap().join(format!("node{victim}"));
    std::fs::remove_dir_all(&dir).unwrap();
    c.restart(victim);
    // Serving means admitted again (a restarted process is not, until the
    // coordinator decides); then settled.
    c.wait_serving(&[victim]);
    whole(&c, "the wiped member to be back");
    // The coordinator still decides: a node killed now is removed.
    c.kill(3);
    c.eventually(WAIT, "the killed node to be removed", || (!is_member(&cluster_status(&c, leader_of(&c)?)?, 3)).then_some(()));
    for i in 0..50 {
        let got: i64 = c.conn(i % 3).get(format!("before:{i}")).unwrap();
        assert_eq!(got, i as i64);
    }
    assert!(!c.logs().contains("panicked"), "{}", c.logs());
}
