//! The disk tier against real `causeway node` processes: past the memory
//! budget, values move to each node's redb file by the cache policy and
//! come back when read; every read answers what was written, deletes and
//! expiries free the disk too, and a node killed with values on disk
//! comes back with everything its log acknowledged.

mod common;

use common::{eventually, Cluster, Opts};
use redis::cmd;
use std::time::Duration;

fn info_field(con: &mut redis::Connection, section: &str, name: &str) -> u64 {
    let info: String = cmd("INFO").arg(section).query(con).unwrap();
    info.lines().find_map(|l| l.strip_prefix(&format!("{name}:"))).unwrap_or_else(|| panic!("no {name} in {info}")).trim().parse().unwrap()
}

/// A distinct value per key, `len` bytes.
fn value(key: &str, len: usize) -> Vec<u8> {
    key.bytes().cycle().take(len).collect()
}

/// Writes `keys`, 100 to a pipeline (with `PX ttl` if given).
fn fill(con: &mut redis::Connection, keys: &[String], ttl_ms: Option<u64>) {
    for chunk in keys.chunks(100) {
        let mut pipe = redis::pipe();
        for k in chunk {
            let c = pipe.cmd("SET").arg(k).arg(value(k, 1000));
            if let Some(ttl) = ttl_ms {
                c.arg("PX").arg(ttl);
            }
        }
        let _: Vec<redis::Value> = pipe.query(con).unwrap();
    }
}

/// Every key of `keys` reads back as written, through `con`.
fn assert_all_read(con: &mut redis::Connection, keys: &[String]) {
    for chunk in keys.chunks(100) {
        let mut pipe = redis::pipe();
        for k in chunk {
            pipe.cmd("GET").arg(k);
        }
        let got: Vec<Option<Vec<u8>>> = pipe.query(con).unwrap();
        for (k, v) in chunk.iter().zip(got) {
            assert_eq!(v.as_deref(), Some(&value(k, 1000)[..]), "{k}");
        }
    }
}

/// Sets a budget `extra` bytes above what the stores hold now.
fn budget_above_now(con: &mut redis::Connection, extra: u64) -> u64 {
    let max = info_field(con, "memory", "used_memory_dataset") + extra;
    let _: () = cmd("CONFIG").arg("SET").arg("maxmemory").arg(max).query(con).unwrap();
    max
}

/// Waits until the node's stores are within the budget with values on disk.
fn settled(con: &mut redis::Connection, max: u64) -> u64 {
    eventually(Duration::from_secs(20), "the stores within the budget, values on disk", || {
        let on_disk = info_field(con, "tier", "tier_keys_on_disk");
        (on_disk > 0 && info_field(con, "memory", "used_memory_dataset") <= max).then_some(on_disk)
    })
}

#[test]
fn past_the_budget_values_move_to_disk_by_each_policy_and_read_back() {
    for policy in ["fifo", "lru", "lfu"] {
        let c = Cluster::start_with(Opts::new(1, 1, 1).disk_tier(policy));
        let mut con = c.conn(0);
        let info: String = cmd("INFO").arg("tier").query(&mut con).unwrap();
        assert!(info.contains(&format!("tier_cache_policy:{policy}")), "{info}");
        let max = budget_above_now(&mut con, 1 << 20);
        let keys: Vec<String> = (0..4000).map(|i| format!("{policy}:{i}")).collect();
        fill(&mut con, &keys, None);
        let on_disk = settled(&mut con, max);
        assert!(on_disk > 2000, "{policy}: {on_disk} of 4000 values of 1000 B on disk with a 1 MB budget");
        // Every value reads back as written: from memory or from disk.
        assert_all_read(&mut con, &keys);
        let misses = info_field(&mut con, "tier", "tier_misses");
        assert!(misses > 1000, "{policy}: {misses} reads found their value on disk");
        assert_eq!(info_field(&mut con, "tier", "tier_errors"), 0);
        assert!(info_field(&mut con, "tier", "tier_disk_reads") >= misses);
        let _rate = info_field(&mut con, "tier", "tier_disk_reads_per_sec");
        // The reads brought values back, and others went out again.
        settled(&mut con, max);
        // Deleting keys whose values are on disk frees their room there.
        let before = info_field(&mut con, "tier", "tier_disk_values");
        let deleted: u64 = cmd("DEL").arg(&keys[..2000]).query(&mut con).unwrap();
        assert_eq!(deleted, 2000);
        eventually(Duration::from_secs(10), "the deleted values gone from disk", || {
            (info_field(&mut con, "tier", "tier_disk_values") + 1000 < before).then_some(())
        });
        assert_all_read(&mut con, &keys[2000..]);
        let gone: Vec<Option<Vec<u8>>> = cmd("MGET").arg(&keys[..10]).query(&mut con).unwrap();
        assert!(gone.iter().all(Option::is_none));
    }
}

#[test]
fn expired_values_leave_the_disk_and_mget_reads_values_on_disk() {
    let c = Cluster::start_with(Opts::new(1, 1, 1).disk_tier("lru"));
    let mut con = c.conn(0);
    let max = budget_above_now(&mut con, 1 << 20);
    let short: Vec<String> = (0..2000).map(|i| format!("short:{i}")).collect();
    let long: Vec<String> = (0..2000).map(|i| format!("long:{i}")).collect();
    fill(&mut con, &short, Some(3000));
    fill(&mut con, &long, None);
    settled(&mut con, max);
    // A snapshot read (MGET) of keys whose values are on disk.
    let got: Vec<Option<Vec<u8>>> = cmd("MGET").arg(&long[..50]).query(&mut con).unwrap();
    for (k, v) in long[..50].iter().zip(got) {
        assert_eq!(v.as_deref(), Some(&value(k, 1000)[..]), "{k}");
    }
    // The short-lived keys expire and their values leave the disk.
    eventually(Duration::from_secs(20), "expired keys reclaimed, on disk too", || {
        let dbsize: u64 = cmd("DBSIZE").query(&mut con).unwrap();
        (dbsize == 2000 && info_field(&mut con, "tier", "tier_disk_values") <= 2000).then_some(())
    });
    assert_all_read(&mut con, &long);
}

#[test]
fn a_chain_with_values_on_disk_survives_a_kill_and_restart() {
    let mut c = Cluster::start_with(Opts::new(3, 3, 2).durable().disk_tier("lru"));
    let mut maxes = Vec::new();
    for i in 0..3 {
        let mut con = c.conn(i);
        maxes.push(budget_above_now(&mut con, 1 << 20));
    }
    let keys: Vec<String> = (0..3000).map(|i| format!("chain:{i}")).collect();
    fill(&mut c.conn(0), &keys, None);
    for (i, &max) in maxes.iter().enumerate() {
        settled(&mut c.conn(i), max);
    }
    // Reads spread over the chain: each replica reads its own disk.
    for i in 0..3 {
        assert_all_read(&mut c.conn(i), &keys);
    }
    c.kill(1);
    c.restart(1);
    // The restarted node replays its log, comes back, and moves values
    // out again (its budget is a flag no more: set it again).
    eventually(Duration::from_secs(30), "node 1 serving again", || {
        let mut con = c.conn(1);
        let _: () = cmd("CONFIG").arg("SET").arg("maxmemory").arg(maxes[1]).query(&mut con).ok()?;
        let serving: String = cmd("INFO").arg("replication").query(&mut con).ok()?;
        serving.contains("serving:yes").then_some(())
    });
    for i in 0..3 {
        assert_all_read(&mut c.conn(i), &keys);
    }
}

#[test]
fn a_restarted_node_recovers_values_on_disk_without_loading_them() {
    // A small log: compactions come often, and their checkpoints name the
    // values on disk instead of copying them.
    let opts = Opts::new(1, 1, 1).durable().disk_tier("lru").flag("--maxmemory", "2mb").flag("--wal-compact-bytes", 1 << 20);
    let mut c = Cluster::start_with(opts);
    let mut con = c.conn(0);
    let keys: Vec<String> = (0..4000).map(|i| format!("restart:{i}")).collect();
    fill(&mut con, &keys, None);
    settled(&mut con, 2 << 20);
    let log = eventually(Duration::from_secs(20), "a compaction that names the values on disk", || {
        let size = info_field(&mut con, "persistence", "aof_current_size");
        (size < 2 << 20).then_some(size)
    });
    assert!(log < 2 << 20, "the log holds {log} bytes for 4 MB of values");
    c.kill(0);
    c.restart(0);
    let mut con = eventually(Duration::from_secs(30), "the node serving again", || {
        let mut con = c.conn(0);
        let info: String = cmd("INFO").arg("replication").query(&mut con).ok()?;
        info.contains("serving:yes").then_some(con)
    });
    let on_disk = info_field(&mut con, "tier", "tier_keys_on_disk");
    assert!(on_disk > 2000, "{on_disk} values still on disk after the restart");
    assert!(info_field(&mut con, "memory", "used_memory_dataset") < 3 << 20, "the values were not loaded into memory");
    assert_all_read(&mut con, &keys);
}

/// Sends a membership change to whichever node leads the coordinator.
fn change(c: &Cluster, args: &[String]) {
    eventually(Duration::from_secs(10), "the coordinator leader to accept the change", || {
        (0..3).find(|&i| {
            let Ok(mut con) = c.client(i).get_connection_with_timeout(Duration::from_secs(1)) else { return false };
            cmd("CW.CLUSTER").arg(args).query::<String>(&mut con).is_ok()
        })
    });
}

#[test]
fn a_joining_node_receives_partitions_whose_values_are_on_disk() {
    let mut c = Cluster::start_with(Opts::new(3, 3, 2).disk_tier("lfu").flag("--maxmemory", "2mb"));
    let keys: Vec<String> = (0..3000).map(|i| format!("join:{i}")).collect();
    fill(&mut c.conn(0), &keys, None);
    for i in 0..3 {
        settled(&mut c.conn(i), 2 << 20);
    }
    let new = c.start_joiner();
    change(&c, &["ADD".into(), new.to_string(), c.addr(new)]);
    eventually(Duration::from_secs(30), "the new node placed and filled", || {
        let s = common::cluster_status(&c, new)?;
        let placed = s.get(&format!("node{new}")).is_some_and(|r| !r.contains("head=0,middle=0,tail=0"));
        (placed && s.get("short_chains")? == "0" && s.get("joining_replicas_here")? == "0").then_some(())
    });
    // The new node got values the others had on disk streamed from their
    // disks to its own (not carried in the state transfer), and keeps to
    // its own budget.
    let mut con = c.conn(new);
    let streamed_in = info_field(&mut con, "tier", "tier_streamed_in");
    let streamed_out: u64 = (0..3).map(|i| info_field(&mut c.conn(i), "tier", "tier_streamed_out")).sum();
    assert!(streamed_in > 0 && streamed_out >= streamed_in, "streamed in {streamed_in}, out {streamed_out}");
    settled(&mut con, 2 << 20);
    assert_all_read(&mut con, &keys);
    for i in 0..3 {
        assert_all_read(&mut c.conn(i), &keys);
    }
}
