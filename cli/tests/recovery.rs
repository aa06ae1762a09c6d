//! A site that never loses an acknowledged write and heals itself, with
//! real processes and a stock Redis client:
//!
//! * the whole site killed at once (kill -9) while 16 connections spread
//!   over every node write, then restarted from its logs (fsync=always):
//!   every acknowledged value reads back at every consistency level through
//!   every node, and the replicas of each chain are identical;
//! * a node paused past the failure timeout, then the coordinator leader
//!   paused as long: the site comes back to every node a member, every
//!   chain at R, and writes keep flowing.

mod common;

use common::{cluster_status, is_member, Cluster, Opts};
use redis::Commands;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);

/// `writers` connections spread over `nodes`, each writing its own keys
/// (so the last acknowledged value of a key is well defined) as fast as it
/// can; returns the stop flag, the acknowledged values and the threads.
fn writers(
    c: &Cluster,
    nodes: &[usize],
    writers: usize,
    keys_each: usize,
) -> (Arc<AtomicBool>, Arc<Mutex<HashMap<String, String>>>, Vec<std::thread::JoinHandle<u64>>) {
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(Mutex::new(HashMap::new()));
    let threads = (0..writers)
        .map(|w| {
            let (client, stop, acked) = (c.client(nodes[w % nodes.len()]), stop.clone(), acked.clone());
            std::thread::spawn(move || {
                let Ok(mut con) = client.get_connection_with_timeout(Duration::from_secs(2)) else { return 0 };
                let _ = con.set_read_timeout(Some(Duration::from_secs(3)));
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let (key, value) = (format!("w{w}:k{}", n % keys_each as u64), format!("w{w}:v{n}"));
                    match con.set::<_, _, String>(&key, &value) {
                        Ok(_) => {
                            acked.lock().unwrap().insert(key, value);
                        }
                        // Unknown outcome (the node died mid-request): the
                        // key holds this value or the one before.
                        Err(_) => {
                            acked.lock().unwrap().remove(&key);
                            std::thread::sleep(Duration::from_millis(20));
                            match client.get_connection_with_timeout(Duration::from_millis(500)) {
                                Ok(c) => con = c,
                                Err(_) => continue,
                            }
                        }
                    }
                }
                n
            })
        })
        .collect();
    (stop, acked, threads)
}

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
    let (stop, acked, threads) = writers(&c, &[0, 1, 2], 16, 400);
    std::thread::sleep(Duration::from_secs(2));
    for i in 0..3 {
        c.kill(i);
    }
    stop.store(true, Ordering::Relaxed);
    let written: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    let acked = Arc::try_unwrap(acked).unwrap().into_inner().unwrap();
    assert!(acked.len() > 200, "only {} keys acknowledged ({written} writes tried)", acked.len());
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
    let (stop, acked, threads) = writers(&c, &[0, 1, 2, 3], 8, 50);
    let healed = |what: &str| {
        c.eventually(WAIT, what, || {
            let leader: usize = (0..3).find_map(|i| cluster_status(&c, i)?.get("coordinator_leader")?.parse().ok())?;
            let s = cluster_status(&c, leader)?;
            let whole = (0..4).all(|n| is_member(&s, n)) && s.get("short_chains")? == "0" && s.get("transfers_in_flight")? == "0";
            whole.then_some(leader)
        })
    };
    let leader = healed("the site to start whole");
    // A data node (not the leader) frozen past the failure timeout: removed,
    // then back by itself once it wakes.
    let victim = (0..4).find(|&n| n != leader).unwrap();
    c.signal(victim, "STOP");
    c.eventually(WAIT, "the frozen node to be removed", || (!is_member(&cluster_status(&c, leader)?, victim)).then_some(()));
    c.signal(victim, "CONT");
    let leader = healed("the woken node to be back");
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
    let before_stop = acked.lock().unwrap().len();
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let written: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    let acked = Arc::try_unwrap(acked).unwrap().into_inner().unwrap();
    assert!(before_stop > 20 && written > 100, "writes kept flowing: {before_stop} keys, {written} writes");
    readable_everywhere(&c, &[0, 1, 2, 3], &acked);
    replicas_identical(&c, &[0, 1, 2, 3]);
}
