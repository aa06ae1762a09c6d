//! The memory budget against real `causeway node` processes: `maxmemory`
//! and `maxmemory-policy` set with CONFIG SET (or flags), `-OOM` under
//! `noeviction`, and eviction decided at the heads and replicated down the
//! chains. The budget is set a few megabytes above what the node's stores
//! hold, then filled past it.

mod common;

use common::{eventually, expect_err, Cluster, Opts};
use redis::cmd;
use std::time::Duration;

fn info_field(con: &mut redis::Connection, section: &str, name: &str) -> u64 {
    let info: String = cmd("INFO").arg(section).query(con).unwrap();
    info.lines().find_map(|l| l.strip_prefix(&format!("{name}:"))).unwrap_or_else(|| panic!("no {name} in {info}")).trim().parse().unwrap()
}

/// Sets a budget `extra` bytes above what the node's stores hold now
/// (`used_memory_dataset`, what the budget is compared with).
fn budget_above_now(con: &mut redis::Connection, extra: u64, policy: &str) -> u64 {
    let max = info_field(con, "memory", "used_memory_dataset") + extra;
    let _: () = cmd("CONFIG").arg("SET").arg("maxmemory").arg(max).arg("maxmemory-policy").arg(policy).query(con).unwrap();
    max
}

/// Writes `n` keys `prefix:i` of 1 000 bytes (with `EX ttl` if given), 100
/// to a pipeline; the first error, if any.
fn fill(con: &mut redis::Connection, prefix: &str, n: usize, ttl: Option<u64>) -> Option<String> {
    let value = vec![b'x'; 1000];
    for chunk in (0..n).collect::<Vec<_>>().chunks(100) {
        let mut pipe = redis::pipe();
        for i in chunk {
            let c = pipe.cmd("SET").arg(format!("{prefix}:{i}")).arg(&value[..]);
            if let Some(ttl) = ttl {
                c.arg("EX").arg(ttl);
            }
        }
        if let Err(e) = pipe.query::<Vec<redis::Value>>(con) {
            return Some(common::err_line(&e));
        }
    }
    None
}

#[test]
fn config_reads_and_sets_the_budget_as_redis_does() {
    let c = Cluster::start_with(Opts::new(1, 1, 1).flag("--maxmemory", "64mb").flag("--maxmemory-policy", "volatile-ttl"));
    let mut con = c.conn(0);
    let got: Vec<String> = cmd("CONFIG").arg("GET").arg("maxmemory*").query(&mut con).unwrap();
    assert_eq!(got, ["maxmemory", &(64u64 << 20).to_string(), "maxmemory-policy", "volatile-ttl"]);
    let _: () = cmd("CONFIG").arg("SET").arg("maxmemory").arg("1gb").query(&mut con).unwrap();
    assert_eq!(info_field(&mut con, "memory", "maxmemory"), 1 << 30);
    // What tools ask for that flags set (redis-benchmark: save and
    // appendonly), not settable; nothing else is known, and a bad value
    // sets nothing.
    let fixed: Vec<String> = cmd("CONFIG").arg("GET").arg("save").arg("appendonly").arg("databases").query(&mut con).unwrap();
    assert_eq!(fixed, ["save", "", "appendonly", "no", "databases", "1"]);
    let none: Vec<String> = cmd("CONFIG").arg("GET").arg("nosuch*").query(&mut con).unwrap();
    assert!(none.is_empty());
    assert_eq!(
        expect_err(&mut con, cmd("CONFIG").arg("SET").arg("appendonly").arg("yes")),
        "ERR Unknown option or number of arguments for CONFIG SET - 'appendonly'"
    );
    let e = expect_err(&mut con, cmd("CONFIG").arg("SET").arg("maxmemory").arg("2gb").arg("maxmemory-policy").arg("sometimes"));
    assert!(e.starts_with("ERR CONFIG SET failed (possibly related to argument 'maxmemory-policy')"), "{e}");
    assert_eq!(info_field(&mut con, "memory", "maxmemory"), 1 << 30, "all or nothing");
    for policy in ["allkeys-lru", "volatile-lru", "allkeys-lfu", "volatile-lfu", "allkeys-random", "volatile-random", "noeviction"] {
        let _: () = cmd("CONFIG").arg("SET").arg("maxmemory-policy").arg(policy.to_uppercase()).query(&mut con).unwrap();
        let got: Vec<String> = cmd("CONFIG").arg("GET").arg("maxmemory-policy").query(&mut con).unwrap();
        assert_eq!(got, ["maxmemory-policy", policy]);
    }
}

#[test]
fn allkeys_lru_keeps_the_keys_in_use() {
    let c = Cluster::start_with(Opts::new(1, 1, 1));
    let mut con = c.conn(0);
    assert_eq!(fill(&mut con, "hot", 500, None), None);
    budget_above_now(&mut con, 3 << 20, "allkeys-lru");
    // Batches of cold keys a second apart (the clock counts seconds), the
    // hot keys read before each: the cold keys of earlier batches are
    // always the least recently used.
    for batch in 0..4 {
        std::thread::sleep(Duration::from_millis(1100));
        for i in 0..500 {
            let _: Option<Vec<u8>> = cmd("GET").arg(format!("hot:{i}")).query(&mut con).unwrap();
        }
        assert_eq!(fill(&mut con, &format!("cold{batch}"), 1_500, None), None);
    }
    assert!(info_field(&mut con, "stats", "evicted_keys") > 1_000);
    let left = |con: &mut redis::Connection, prefix: &str, n: usize| {
        (0..n).filter(|i| cmd("EXISTS").arg(format!("{prefix}:{i}")).query::<u64>(con).unwrap() == 1).count()
    };
    let (hot, oldest) = (left(&mut con, "hot", 500), left(&mut con, "cold0", 1_500));
    assert!(hot >= 490 && oldest < 750, "hot keys left: {hot} of 500; the first cold batch: {oldest} of 1500");
}

#[test]
fn noeviction_refuses_writes_that_add_data_and_keeps_everything() {
    let c = Cluster::start_with(Opts::new(1, 1, 1));
    let mut con = c.conn(0);
    budget_above_now(&mut con, 4 << 20, "noeviction");
    let e = fill(&mut con, "k", 20_000, None).expect("20 MB past a 4 MB budget is refused");
    assert_eq!(e, "OOM command not allowed when used memory > 'maxmemory'.");
    // What was stored is all there; reads and deletes still go.
    let stored: u64 = cmd("DBSIZE").query(&mut con).unwrap();
    assert!(stored > 1000, "{stored} keys stored before the refusal");
    for i in (0..stored).step_by(97) {
        let v: Option<Vec<u8>> = cmd("GET").arg(format!("k:{i}")).query(&mut con).unwrap();
        assert_eq!(v.map(|v| v.len()), Some(1000), "k:{i}");
    }
    let _: u64 = cmd("DEL").arg("k:0").query(&mut con).unwrap();
    assert_eq!(info_field(&mut con, "stats", "evicted_keys"), 0);
    // With no budget, writes go again.
    let _: () = cmd("CONFIG").arg("SET").arg("maxmemory").arg(0).query(&mut con).unwrap();
    let _: () = cmd("SET").arg("after").arg("v").query(&mut con).unwrap();
}

#[test]
fn allkeys_random_evicts_at_the_heads_and_the_replicas_follow() {
    let c = Cluster::three();
    let mut cons: Vec<_> = (0..3).map(|i| c.conn(i)).collect();
    let mut max = 0;
    for con in &mut cons {
        max = max.max(budget_above_now(con, 6 << 20, "allkeys-random"));
    }
    assert_eq!(fill(&mut cons[1], "k", 20_000, None), None, "no write is refused");
    // The heads evict until every node's stores are within its budget.
    let written = 20_000;
    let kept: u64 = eventually(Duration::from_secs(20), "eviction", || {
        let kept: u64 = cmd("DBSIZE").query(&mut cons[0]).unwrap();
        let used = (0..3).map(|i| info_field(&mut cons[i], "memory", "used_memory_dataset")).max().unwrap();
        (kept < written && used <= max).then_some(kept)
    });
    let evicted: u64 = (0..3).map(|i| info_field(&mut cons[i], "stats", "evicted_keys")).sum();
    assert!(evicted >= written - kept, "{evicted} evicted, {kept} of {written} kept");
    // The replicas agree on what is left: every key reads the same at
    // every node (each node reads its own replica first).
    for i in (0..written).step_by(101) {
        let key = format!("k:{i}");
        let at: Vec<Option<Vec<u8>>> = (0..3).map(|n| cmd("GET").arg(&key).query(&mut cons[n]).unwrap()).collect();
        assert!(at.iter().all(|v| v == &at[0]), "{key} differs between nodes");
    }
    // A key written after the eviction is kept.
    let _: () = cmd("CONFIG").arg("SET").arg("maxmemory").arg(0).query(&mut cons[0]).unwrap();
    let _: () = cmd("SET").arg("k:0").arg("new").query(&mut cons[0]).unwrap();
    assert_eq!(cmd("GET").arg("k:0").query::<String>(&mut cons[2]).unwrap(), "new");
}

#[test]
fn volatile_ttl_evicts_only_keys_with_an_expiry_soonest_first_then_refuses() {
    let c = Cluster::start_with(Opts::new(1, 1, 1));
    let mut con = c.conn(0);
    // Keys that never expire, then keys that do: only the latter may go.
    assert_eq!(fill(&mut con, "keep", 2_000, None), None);
    budget_above_now(&mut con, 4 << 20, "volatile-ttl");
    assert_eq!(fill(&mut con, "late", 3_000, Some(2_000)), None);
    assert_eq!(fill(&mut con, "soon", 3_000, Some(1_000)), None);
    eventually(Duration::from_secs(20), "eviction", || (info_field(&mut con, "stats", "evicted_keys") > 0).then_some(()));
    for i in 0..2_000 {
        let v: Option<Vec<u8>> = cmd("GET").arg(format!("keep:{i}")).query(&mut con).unwrap();
        assert!(v.is_some(), "keep:{i} has no expiry and was evicted");
    }
    // The soonest to expire went first: more of `late` is left than of
    // `soon`.
    let left = |con: &mut redis::Connection, prefix: &str| {
        (0..3_000).filter(|i| cmd("EXISTS").arg(format!("{prefix}:{i}")).query::<u64>(con).unwrap() == 1).count()
    };
    let (late, soon) = (left(&mut con, "late"), left(&mut con, "soon"));
    assert!(late > soon, "late {late} against soon {soon}");
    // Once nothing with an expiry is left, writes that add data are
    // refused, as with noeviction.
    let e = fill(&mut con, "more", 20_000, None).expect("nothing left to evict");
    assert!(e.starts_with("OOM "), "{e}");
}

/// A value near the size limit travels once: its forward was resent every
/// 200 ms while the first copy was still on its way, the peer link's
/// backlog filled, the heartbeats behind it were dropped, and the
/// coordinator removed two live nodes of three, losing the acknowledged
/// value (2 runs in 10). Nothing is dropped, nobody removed, every node
/// holds it.
#[test]
fn a_value_at_the_size_limit_is_sent_once_and_kept_everywhere() {
    let c = Cluster::three();
    let mut con = c.conn(0);
    let epoch = |con: &mut redis::Connection| info_field(con, "replication", "epoch");
    let before = epoch(&mut con);
    let value = vec![b'x'; (128 << 20) - 64];
    let _: () = cmd("SET").arg("big").arg(&value[..]).query(&mut con).unwrap();
    drop(value);
    for i in 0..3 {
        let mut con = c.conn(i);
        eventually(Duration::from_secs(20), "the value at every node", || {
            let len: u64 = cmd("STRLEN").arg("big").query(&mut con).unwrap();
            (len == (128 << 20) - 64).then_some(())
        });
        assert_eq!(info_field(&mut con, "replication", "peer_dropped_messages"), 0, "node {i} dropped messages");
    }
    assert_eq!(epoch(&mut con), before, "no node was removed");
}

/// Large values leave nothing behind once deleted: the buffers of the
/// client connection and of the links between nodes that carried them give
/// their room back (they kept their largest allocation: 100 MB written and
/// deleted left 248/143/143 MB allocated on a 3-node site).
#[test]
fn large_values_written_then_deleted_give_their_memory_back() {
    let c = Cluster::three();
    let mut cons: Vec<redis::Connection> = (0..3).map(|i| c.conn(i)).collect();
    let base: Vec<u64> = cons.iter_mut().map(|con| info_field(con, "memory", "used_memory")).collect();
    let value = vec![b'x'; 40 << 20];
    // Through a connection that stays open, and through one that does not.
    for i in 0..2 {
        let _: () = cmd("SET").arg(format!("big{i}")).arg(&value[..]).query(&mut cons[0]).unwrap();
    }
    let got: Vec<u8> = cmd("GET").arg("big1").query(&mut c.conn(1)).unwrap();
    assert_eq!(got.len(), value.len());
    let _: () = cmd("DEL").arg("big0").arg("big1").query(&mut cons[0]).unwrap();
    for (i, con) in cons.iter_mut().enumerate() {
        eventually(Duration::from_secs(20), "memory back after the large values were deleted", || {
            let used = info_field(con, "memory", "used_memory");
            (used < base[i] + (10 << 20)).then_some(())
        });
    }
}
