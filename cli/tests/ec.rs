//! Erasure-coded sites (`--redundancy ec:3+2`) with real processes: Redis
//! clients read and write as on chains (values across pages too), keys
//! expire as in Redis, DBSIZE, MGET, MEMORY USAGE and FLUSHALL work (and
//! give the values' pages back, data and parity), a
//! log it would not keep is refused, and a site loses two of its
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
    // Every node counts the keys of the slots it serves.
    let n: u64 = redis::cmd("DBSIZE").query(&mut b).unwrap();
    assert_eq!(n, 2);
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
    // Not yet on a coded site: a clear refusal, nothing written.
    let e = redis::cmd("INCR").arg("n").query::<i64>(&mut a).unwrap_err();
    assert!(e.to_string().contains("not supported with erasure coding"), "{e}");
    assert_eq!(redis::cmd("GET").arg("n").query::<Option<String>>(&mut a).unwrap(), None);
    for computed in
        [redis::cmd("APPEND").arg("n").arg("x"), redis::cmd("SETRANGE").arg("n").arg(1).arg("x"), redis::cmd("INCRBYFLOAT").arg("n").arg(1)]
    {
        let e = computed.query::<redis::Value>(&mut a).unwrap_err();
        assert!(e.to_string().contains("not supported with erasure coding"), "{e}");
    }
    // The partition map names each partition's group and roles.
    let map: redis::Value = redis::cmd("CW.KEYRANGE").query(&mut a).unwrap();
    let text = format!("{map:?}");
    assert!(text.contains("group 0 slot 0") && text.contains("parity") && text.contains("data"), "{text}");
    // MEMORY USAGE: the value, the key and its metadata entry.
    let used: u64 = redis::cmd("MEMORY").arg("USAGE").arg("big").query(&mut b).unwrap();
    assert!(used > 100_000 && used < 100_200, "{used}");
    let none: Option<u64> = redis::cmd("MEMORY").arg("USAGE").arg("nothing").query(&mut b).unwrap();
    assert_eq!(none, None);
    // MGET: each key read where its value lives, in rounds until two agree.
    let _: () = redis::cmd("SET").arg("k").arg("v5").query(&mut a).unwrap();
    let got: Vec<Option<String>> = redis::cmd("MGET").arg("k").arg("none").arg("big").query(&mut b).unwrap();
    assert_eq!(got, vec![Some("v5".to_string()), None, Some(big.clone())]);
    // FLUSHALL: every node deletes the keys of the slots it serves, and
    // the pages no value is on any more go back, data and parity alike.
    let mut load = redis::pipe();
    for i in 0..2_000 {
        load.cmd("SET").arg(format!("key{i}")).arg(&big[..1_000]).ignore();
    }
    let _: () = load.query(&mut a).unwrap();
    // KEYS and SCAN: every node lists the keys of the slots it serves.
    let mut keys: Vec<String> = redis::cmd("KEYS").arg("key1?").query(&mut b).unwrap();
    keys.sort();
    assert_eq!(keys, (10..20).map(|i| format!("key{i}")).collect::<Vec<_>>());
    let scanned: std::collections::HashSet<String> = redis::Commands::scan_match(&mut b, "key*").unwrap().collect();
    assert_eq!(scanned.len(), 2_000);
    let held = |what: &str| -> u64 { (0..5).map(|i| info_field(&mut c.conn(i), "ec", what)).sum() };
    let (data, parity) = (held("ec_data_bytes"), held("ec_parity_bytes"));
    assert!(data >= 2_000_000 && parity >= 2 * data / 3, "{data} bytes of data pages, {parity} of parity");
    let _: () = redis::cmd("FLUSHALL").query(&mut a).unwrap();
    let n: u64 = redis::cmd("DBSIZE").query(&mut b).unwrap();
    assert_eq!(n, 0);
    let gone: Option<String> = redis::cmd("GET").arg("big").query(&mut b).unwrap();
    assert_eq!(gone, None);
    c.eventually(Duration::from_secs(10), "the pages given back", || {
        (held("ec_data_bytes") == 0 && held("ec_parity_bytes") == 0).then_some(())
    });
    assert!(held("ec_given_back_pages") as usize >= data as usize / 4096, "{data} bytes of data pages were held");
    // The site serves on as before.
    let _: () = redis::cmd("SET").arg("k").arg("v6").query(&mut a).unwrap();
    let got: String = redis::cmd("GET").arg("k").query(&mut b).unwrap();
    assert_eq!(got, "v6");
}

/// A coded node keeps nothing on disk yet: asking for a log or a disk
/// tier is refused at start, not silently ignored.
#[test]
fn an_ec_node_refuses_a_log_it_would_not_keep() {
    let dir = std::env::temp_dir().join(format!("causeway-ec-refuse-{}", std::process::id()));
    let nodes = "0=127.0.0.1:1,1=127.0.0.1:2,2=127.0.0.1:3,3=127.0.0.1:4,4=127.0.0.1:5";
    let (ok, _, stderr) = common::run_causeway(&[
        "node",
        "--id",
        "0",
        "--listen",
        "127.0.0.1:0",
        "--nodes",
        nodes,
        "--redundancy",
        "ec:3+2",
        "--data-dir",
        dir.to_str().unwrap(),
    ]);
    assert!(!ok && stderr.contains("no write-ahead log (--data-dir)"), "{stderr}");
}

fn info_field(conn: &mut redis::Connection, section: &str, field: &str) -> u64 {
    let info: String = redis::cmd("INFO").arg(section).query(conn).unwrap();
    let line = info.lines().find_map(|l| l.strip_prefix(&format!("{field}:"))).unwrap_or_else(|| panic!("no {field} in {info}"));
    line.trim().parse().unwrap()
}

/// Expiry as Redis has it, decided by the data member that serves the key
/// (the metadata carries the instant to the parity members): the TTL
/// family, EXPIRE's conditions, PERSIST, GETEX, and keys deleted once they
/// expire without being read.
#[test]
fn an_ec_site_expires_keys_as_redis_does() {
    let c = site();
    let mut a = c.conn(0);
    let mut b = c.conn(2);
    let _: () = redis::cmd("SET").arg("t").arg("x").arg("EX").arg(100).query(&mut a).unwrap();
    let ttl: i64 = redis::cmd("TTL").arg("t").query(&mut b).unwrap();
    assert!((99..=100).contains(&ttl), "{ttl}");
    let set: u64 = redis::cmd("EXPIRE").arg("t").arg(50).arg("GT").query(&mut b).unwrap();
    assert_eq!(set, 0, "GT: 50 s is not later than 100 s");
    let set: u64 = redis::cmd("EXPIRE").arg("t").arg(200).arg("GT").query(&mut b).unwrap();
    assert_eq!(set, 1);
    let pttl: i64 = redis::cmd("PTTL").arg("t").query(&mut a).unwrap();
    assert!(pttl > 199_000 && pttl <= 200_000, "{pttl}");
    let set: u64 = redis::cmd("PERSIST").arg("t").query(&mut a).unwrap();
    assert_eq!(set, 1);
    let ttl: i64 = redis::cmd("TTL").arg("t").query(&mut a).unwrap();
    assert_eq!(ttl, -1);
    let got: String = redis::cmd("GETEX").arg("t").arg("PX").arg(300).query(&mut b).unwrap();
    assert_eq!(got, "x");
    let ttl: i64 = redis::cmd("TTL").arg("missing").query(&mut a).unwrap();
    assert_eq!(ttl, -2);
    let _: () = redis::cmd("SETEX").arg("s").arg(100).arg("y").query(&mut a).unwrap();
    let _: () = redis::cmd("SET").arg("s").arg("z").arg("KEEPTTL").query(&mut a).unwrap();
    let ttl: i64 = redis::cmd("TTL").arg("s").query(&mut a).unwrap();
    assert!((99..=100).contains(&ttl), "KEEPTTL keeps the expiry: {ttl}");
    // An instant already past deletes the key.
    let _: () = redis::cmd("SET").arg("p").arg("v").query(&mut a).unwrap();
    let set: u64 = redis::cmd("PEXPIREAT").arg("p").arg(1).query(&mut a).unwrap();
    assert_eq!(set, 1);
    let gone: Option<String> = redis::cmd("GET").arg("p").query(&mut b).unwrap();
    assert_eq!(gone, None);

    // Keys nobody reads again are deleted once they expire: every node's
    // expiring keys back to s alone, and the keys counted as expired.
    for i in 0..300 {
        let _: () = redis::cmd("SET").arg(format!("e{i}")).arg("v").arg("PX").arg(200).query(&mut a).unwrap();
    }
    let info: String = redis::cmd("INFO").arg("keyspace").query(&mut b).unwrap();
    let field = |name: &str| -> u64 {
        let at = info.find(&format!("{name}=")).unwrap_or_else(|| panic!("no {name} in {info}")) + name.len() + 1;
        info[at..].split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
    };
    assert!(field("expires") >= 1 && field("keys") >= field("expires"), "{info}");
    let gone: Option<String> = {
        std::thread::sleep(Duration::from_millis(400));
        redis::cmd("GET").arg("e7").query(&mut b).unwrap()
    };
    assert_eq!(gone, None, "past its expiry a key reads as missing");
    let mut conns: Vec<_> = (0..5).map(|i| c.conn(i)).collect();
    eventually(Duration::from_secs(20), "expired keys to be deleted", || {
        let left: u64 = conns.iter_mut().map(|c| info_field(c, "ec", "ec_expires")).sum();
        (left == 1).then_some(())
    });
    let expired: u64 = conns.iter_mut().map(|c| info_field(c, "stats", "expired_keys")).sum();
    assert!(expired >= 301, "300 keys and t: {expired}");
    let keys: u64 = conns.iter_mut().map(|c| info_field(c, "ec", "ec_keys")).sum();
    assert_eq!(keys, 1, "every key written but s expired or was deleted: {keys}");
    let n: u64 = redis::cmd("DBSIZE").query(&mut a).unwrap();
    assert_eq!(n, 1);
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
    // The slots of the lost nodes are counted where they are served now.
    let n: u64 = redis::cmd("DBSIZE").query(&mut c.conn(1)).unwrap();
    assert!(n >= written.acked.len() as u64, "DBSIZE {n} < {} keys acknowledged", written.acked.len());
}

/// INFO ec of node `i`: `ec_standing` and `ec_whole`.
fn ec_standing(c: &Cluster, i: usize) -> Option<(String, bool)> {
    let mut con = c.client(i).get_connection_with_timeout(Duration::from_secs(1)).ok()?;
    let info: String = redis::cmd("INFO").arg("ec").query(&mut con).ok()?;
    let field = |name: &str| info.lines().find_map(|l| l.strip_prefix(&format!("{name}:")).map(|v| v.trim().to_string()));
    Some((field("ec_standing")?, field("ec_whole")? == "1"))
}

/// Three nodes killed in turn (more than M = 2 over the run), each
/// restarted as a new, empty process: it rejoins, is rebuilt by decoding
/// (its parity from the data slots' state, its data slots taken back and
/// their pages decoded) while writers go on, and the next is killed only
/// once it is whole again. Every acknowledged write reads back at the end,
/// from every node.
#[test]
fn nodes_killed_in_turn_come_back_rebuilt_and_no_acknowledged_write_is_lost() {
    let mut c = site();
    let all = [0, 1, 2, 3, 4];
    let load = Workload::spread(&c, &all, 6, 40);
    std::thread::sleep(Duration::from_millis(600));
    for victim in [3, 0, 4] {
        c.kill(victim);
        let via = (victim + 1) % 5;
        wait_removed(&c, via, victim);
        std::thread::sleep(Duration::from_millis(300));
        c.restart(victim);
        eventually(Duration::from_secs(30), "the restarted node to be rebuilt", || {
            let (standing, whole) = ec_standing(&c, victim)?;
            (standing == "member" && whole).then_some(())
        });
        std::thread::sleep(Duration::from_millis(300));
    }
    let written = load.finish();
    eprintln!("{} keys acknowledged; longest write gap seen by a writer {:?}", written.acked.len(), written.longest_gap);
    for n in all {
        let (standing, whole) = ec_standing(&c, n).expect("INFO ec");
        assert_eq!((standing.as_str(), whole), ("member", true), "node {n}");
    }
    check_acknowledged(&c, &all, &written.acked);
}
