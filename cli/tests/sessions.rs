//! The site as a whole on a 3-node, R=3, k=2 cluster: every node proxies to
//! the right chain, sessions are causal (read-your-writes, also after
//! moving to another node with CW.SESSION), MGET snapshots, DBSIZE over
//! the site, binary safety, big values, pipelining, concurrency, and a
//! node killed with SIGKILL.

mod common;

use causeway_core::ring::{NodeInfo, Shape, Topology};
use common::{err_line, eventually, expect_err, Cluster, Opts};
use redis::{cmd, Value};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(15);

fn get(con: &mut redis::Connection, key: impl redis::ToRedisArgs) -> Option<Vec<u8>> {
    cmd("GET").arg(key).query(con).unwrap()
}

fn set(con: &mut redis::Connection, key: impl redis::ToRedisArgs, value: impl redis::ToRedisArgs) {
    assert_eq!(cmd("SET").arg(key).arg(value).query::<String>(con).unwrap(), "OK");
}

fn dbsize(con: &mut redis::Connection) -> i64 {
    cmd("DBSIZE").query(con).unwrap()
}

/// Waits until DBSIZE (counted at the tails) reaches `n` through node `via`.
fn wait_dbsize(c: &Cluster, via: usize, n: i64) {
    let mut con = c.conn(via);
    eventually(WAIT, &format!("DBSIZE {n} via node {via}"), || (dbsize(&mut con) == n).then_some(()));
}

/// The same partition map the nodes compute, to pick keys by chain.
fn topology(c: &Cluster) -> Topology {
    let nodes = (0..c.len()).map(|i| NodeInfo { id: i as u16, addr: c.addr(i) }).collect();
    Topology::new(1, Shape { partitions: 64, replicas: c.opts.replicas, k: c.opts.k, coding: None }, nodes).unwrap()
}

#[test]
fn write_through_one_node_read_through_the_others() {
    let c = Cluster::three();
    let mut writer = c.conn(0);
    for i in 0..60 {
        set(&mut writer, format!("key:{i}"), format!("value:{i}"));
    }
    // Causal writes are acknowledged at k=2, so a fresh session elsewhere
    // may briefly read the tail's older state; every node converges.
    for node in [1, 2] {
        let mut reader = c.conn(node);
        for i in 0..60 {
            let want = format!("value:{i}").into_bytes();
            eventually(WAIT, &format!("key:{i} on node {node}"), || {
                (get(&mut reader, format!("key:{i}")) == Some(want.clone())).then_some(())
            });
        }
    }
    // Writes acknowledged by the tail (linearizable) are visible to every
    // new session at once, at any consistency level.
    cmd("CW.CONSISTENCY").arg("linearizable").query::<()>(&mut writer).unwrap();
    for i in 0..60 {
        set(&mut writer, format!("lin:{i}"), i);
    }
    for node in [1, 2] {
        for level in ["causal", "eventual", "linearizable"] {
            let mut reader = c.conn(node);
            cmd("CW.CONSISTENCY").arg(level).query::<()>(&mut reader).unwrap();
            for i in 0..60 {
                assert_eq!(get(&mut reader, format!("lin:{i}")), Some(i.to_string().into_bytes()), "lin:{i} on node {node} ({level})");
            }
        }
    }
}

#[test]
fn read_your_writes_on_one_connection_across_chains() {
    let c = Cluster::three();
    // Through every node, for keys whose chains start everywhere.
    for node in 0..3 {
        let mut con = c.conn(node);
        for round in 0..3 {
            for i in 0..40 {
                let key = format!("ryw:{node}:{i}");
                let value = format!("{round}-{i}");
                set(&mut con, &key, &value);
                assert_eq!(get(&mut con, &key), Some(value.into_bytes()), "{key} round {round} via node {node}");
            }
        }
        // And after a batch of writes, all of them again.
        for i in 0..40 {
            assert_eq!(get(&mut con, format!("ryw:{node}:{i}")), Some(format!("2-{i}").into_bytes()));
        }
        // Deletes too.
        assert_eq!(cmd("DEL").arg(format!("ryw:{node}:0")).query::<i64>(&mut con).unwrap(), 1);
        assert_eq!(get(&mut con, format!("ryw:{node}:0")), None);
        assert_eq!(cmd("EXISTS").arg(format!("ryw:{node}:0")).query::<i64>(&mut con).unwrap(), 0);
    }
}

#[test]
fn session_token_carries_writes_to_another_node() {
    let c = Cluster::three();
    let mut a = c.conn(0);
    for round in 0..2 {
        for i in 0..40 {
            set(&mut a, format!("s:{i}"), format!("{round}:{i}"));
        }
    }
    assert_eq!(cmd("DEL").arg("s:39").query::<i64>(&mut a).unwrap(), 1);
    let info: String = cmd("CW.SESSION").arg("INFO").query(&mut a).unwrap();
    assert!(info.contains("tracked_keys:") && info.contains("max_ts:"), "{info}");
    let token: String = cmd("CW.SESSION").arg("EXPORT").query(&mut a).unwrap();
    assert!(!token.is_empty() && token.bytes().all(|b| b.is_ascii_hexdigit()), "{token}");

    for node in [1, 2] {
        let mut b = c.conn(node);
        assert_eq!(cmd("CW.SESSION").arg("RESUME").arg(&token).query::<String>(&mut b).unwrap(), "OK");
        // No waiting: the session's metadata steers the reads.
        for i in 0..39 {
            assert_eq!(get(&mut b, format!("s:{i}")), Some(format!("1:{i}").into_bytes()), "s:{i} on node {node}");
        }
        assert_eq!(get(&mut b, "s:39"), None, "the delete travels with the session");
        let keys: Vec<String> = (0..40).map(|i| format!("s:{i}")).collect();
        let values: Vec<Option<String>> = cmd("MGET").arg(&keys).query(&mut b).unwrap();
        for (i, v) in values.iter().enumerate() {
            let want = (i < 39).then(|| format!("1:{i}"));
            assert_eq!(v, &want, "MGET s:{i} on node {node}");
        }
        // The resumed session keeps going: its own writes are read back.
        set(&mut b, format!("from-{node}"), "x");
        assert_eq!(get(&mut b, format!("from-{node}")), Some(b"x".to_vec()));
    }

    // A session can be carried twice (node 0 -> 1 -> 2), with writes on the way.
    let mut b = c.conn(1);
    cmd("CW.SESSION").arg("RESUME").arg(&token).query::<()>(&mut b).unwrap();
    set(&mut b, "s:0", "moved");
    let token2: String = cmd("CW.SESSION").arg("EXPORT").query(&mut b).unwrap();
    let mut d = c.conn(2);
    cmd("CW.SESSION").arg("RESUME").arg(&token2).query::<()>(&mut d).unwrap();
    assert_eq!(get(&mut d, "s:0"), Some(b"moved".to_vec()));
    assert_eq!(get(&mut d, "s:1"), Some(b"1:1".to_vec()));

    // RESET forgets the metadata; garbage tokens are refused.
    assert_eq!(cmd("CW.SESSION").arg("RESET").query::<String>(&mut d).unwrap(), "OK");
    let info: String = cmd("CW.SESSION").arg("INFO").query(&mut d).unwrap();
    assert!(info.contains("tracked_keys:0"), "{info}");
    for bad in ["zz", "abc", "00ff", "ffffffffffffffffffff", "deadbeef"] {
        let e = expect_err(&mut d, cmd("CW.SESSION").arg("RESUME").arg(bad));
        assert!(e.starts_with("ERR invalid session token"), "{bad}: {e}");
    }
    assert_eq!(expect_err(&mut d, cmd("CW.SESSION").arg("BOGUS")), "ERR syntax error");
    assert_eq!(expect_err(&mut d, cmd("CW.SESSION").arg("RESUME")), "ERR syntax error");
    assert_eq!(expect_err(&mut d, &cmd("CW.SESSION")), "ERR wrong number of arguments for 'cw.session' command");
    // The empty session's token round-trips too.
    let empty: String = cmd("CW.SESSION").arg("EXPORT").query(&mut d).unwrap();
    assert_eq!(cmd("CW.SESSION").arg("RESUME").arg(&empty).query::<String>(&mut c.conn(0)).unwrap(), "OK");
}

#[test]
fn mget_returns_every_value() {
    let c = Cluster::three();
    let mut con = c.conn(1);
    let keys: Vec<String> = (0..50).map(|i| format!("m:{i}")).collect();
    for (i, k) in keys.iter().enumerate() {
        set(&mut con, k, i);
    }
    let values: Vec<Option<i64>> = cmd("MGET").arg(&keys).query(&mut con).unwrap();
    assert_eq!(values, (0..50).map(Some).collect::<Vec<_>>());
    // Missing keys are nil in place; repeated keys repeat.
    let values: Vec<Option<i64>> = cmd("MGET").arg("m:3").arg("missing").arg("m:3").arg("m:49").query(&mut con).unwrap();
    assert_eq!(values, vec![Some(3), None, Some(3), Some(49)]);
    // Overwrites and deletes are reflected in the next snapshot.
    set(&mut con, "m:0", 100);
    assert_eq!(cmd("DEL").arg("m:1").query::<i64>(&mut con).unwrap(), 1);
    let values: Vec<Option<i64>> = cmd("MGET").arg("m:0").arg("m:1").arg("m:2").query(&mut con).unwrap();
    assert_eq!(values, vec![Some(100), None, Some(2)]);
    // Linearizable writes are in any later snapshot, through any node.
    let mut lin = c.conn(0);
    cmd("CW.CONSISTENCY").arg("linearizable").query::<()>(&mut lin).unwrap();
    for k in &keys {
        set(&mut lin, k, "L");
    }
    for node in 0..3 {
        let values: Vec<Option<String>> = cmd("MGET").arg(&keys).query(&mut c.conn(node)).unwrap();
        assert!(values.iter().all(|v| v.as_deref() == Some("L")), "node {node}: {values:?}");
    }
}

#[test]
fn dbsize_counts_keys_across_the_site() {
    let c = Cluster::three();
    assert_eq!(dbsize(&mut c.conn(0)), 0);
    for node in 0..3 {
        let mut con = c.conn(node);
        for i in 0..30 {
            set(&mut con, format!("d:{node}:{i}"), i);
        }
    }
    for node in 0..3 {
        wait_dbsize(&c, node, 90);
    }
    // Overwrites do not add keys; deletes remove them.
    let mut con = c.conn(2);
    for i in 0..30 {
        set(&mut con, format!("d:0:{i}"), "again");
    }
    let keys: Vec<String> = (0..10).map(|i| format!("d:1:{i}")).collect();
    assert_eq!(cmd("DEL").arg(&keys).query::<i64>(&mut con).unwrap(), 10);
    for node in 0..3 {
        wait_dbsize(&c, node, 80);
    }
    // It stays there (no double counting once everything is stable).
    std::thread::sleep(Duration::from_millis(300));
    for node in 0..3 {
        assert_eq!(dbsize(&mut c.conn(node)), 80);
    }
}

#[test]
fn del_then_get_is_nil_everywhere() {
    let c = Cluster::three();
    let mut con = c.conn(0);
    let keys: Vec<String> = (0..30).map(|i| format!("del:{i}")).collect();
    for k in &keys {
        set(&mut con, k, "doomed");
    }
    assert_eq!(cmd("DEL").arg(&keys).query::<i64>(&mut con).unwrap(), 30);
    for k in &keys {
        assert_eq!(get(&mut con, k), None, "{k} on the deleting connection");
    }
    let token: String = cmd("CW.SESSION").arg("EXPORT").query(&mut con).unwrap();
    for node in 0..3 {
        // With the deleter's session: at once.
        let mut follower = c.conn(node);
        cmd("CW.SESSION").arg("RESUME").arg(&token).query::<()>(&mut follower).unwrap();
        for k in &keys {
            assert_eq!(get(&mut follower, k), None, "{k} on node {node} (resumed session)");
        }
        // A fresh session: eventually (the tail learns lazily).
        let mut fresh = c.conn(node);
        for k in &keys {
            eventually(WAIT, &format!("{k} gone on node {node}"), || get(&mut fresh, k).is_none().then_some(()));
        }
        assert_eq!(cmd("EXISTS").arg(&keys).query::<i64>(&mut fresh).unwrap(), 0);
        assert_eq!(cmd("DEL").arg(&keys).query::<i64>(&mut fresh).unwrap(), 0);
    }
    wait_dbsize(&c, 1, 0);
}

#[test]
fn binary_keys_and_values_are_safe() {
    let c = Cluster::three();
    let mut con = c.conn(0);
    let all_bytes: Vec<u8> = (0..=255u8).collect();
    let pairs: Vec<(Vec<u8>, Vec<u8>)> = vec![
        (b"crlf\r\nkey".to_vec(), b"value\r\nwith\r\n\r\nbreaks".to_vec()),
        (b"nul\0key\0".to_vec(), b"\0\0\0".to_vec()),
        (b"\xff\xfe\x00\x80".to_vec(), all_bytes.clone()),
        (all_bytes.clone(), b"key is every byte".to_vec()),
        (b"$3\r\nSET\r\n".to_vec(), b"*1\r\n$4\r\nPING\r\n".to_vec()),
        (b"empty-value".to_vec(), Vec::new()),
        (Vec::new(), b"empty key".to_vec()),
        (" spaces and \"quotes\" ".as_bytes().to_vec(), "ünïcödé ✓".as_bytes().to_vec()),
    ];
    for (k, v) in &pairs {
        set(&mut con, k.as_slice(), v.as_slice());
        assert_eq!(get(&mut con, k.as_slice()).as_deref(), Some(v.as_slice()), "{k:?}");
    }
    let keys: Vec<&[u8]> = pairs.iter().map(|(k, _)| k.as_slice()).collect();
    let values: Vec<Option<Vec<u8>>> = cmd("MGET").arg(&keys).query(&mut con).unwrap();
    assert_eq!(values, pairs.iter().map(|(_, v)| Some(v.clone())).collect::<Vec<_>>());
    // Through the other nodes, with the session carried over.
    let token: String = cmd("CW.SESSION").arg("EXPORT").query(&mut con).unwrap();
    for node in [1, 2] {
        let mut other = c.conn(node);
        cmd("CW.SESSION").arg("RESUME").arg(&token).query::<()>(&mut other).unwrap();
        for (k, v) in &pairs {
            assert_eq!(get(&mut other, k.as_slice()).as_deref(), Some(v.as_slice()), "{k:?} on node {node}");
        }
    }
    // Keys differing only after a NUL are different keys.
    set(&mut con, b"a\0b".as_slice(), "1");
    set(&mut con, b"a\0c".as_slice(), "2");
    assert_eq!(get(&mut con, b"a\0b".as_slice()), Some(b"1".to_vec()));
    assert_eq!(get(&mut con, b"a".as_slice()), None);
    assert_eq!(cmd("DEL").arg(b"\xff\xfe\x00\x80".as_slice()).query::<i64>(&mut con).unwrap(), 1);
    assert_eq!(get(&mut con, b"\xff\xfe\x00\x80".as_slice()), None);
}

#[test]
fn one_megabyte_value_round_trip() {
    let c = Cluster::three();
    let value: Vec<u8> = (0..1024 * 1024).map(|i: u32| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let mut con = c.conn(0);
    set(&mut con, "big", value.as_slice());
    assert_eq!(get(&mut con, "big").as_deref(), Some(value.as_slice()));
    let token: String = cmd("CW.SESSION").arg("EXPORT").query(&mut con).unwrap();
    for node in [1, 2] {
        let mut other = c.conn(node);
        cmd("CW.SESSION").arg("RESUME").arg(&token).query::<()>(&mut other).unwrap();
        assert_eq!(get(&mut other, "big").as_deref(), Some(value.as_slice()), "node {node}");
    }
    // Replace it with a different 1 MB value via another node, read it back.
    let value2: Vec<u8> = value.iter().map(|b| b ^ 0x5a).collect();
    let mut other = c.conn(2);
    cmd("CW.CONSISTENCY").arg("linearizable").query::<()>(&mut other).unwrap();
    set(&mut other, "big", value2.as_slice());
    for node in 0..3 {
        assert_eq!(get(&mut c.conn(node), "big").as_deref(), Some(value2.as_slice()), "node {node}");
    }
    let v: Vec<Option<Vec<u8>>> = cmd("MGET").arg("big").arg("big").query(&mut other).unwrap();
    assert_eq!(v, vec![Some(value2.clone()), Some(value2)]);
}

/// One pipeline, every level: each read sees the write just before it in
/// the pipeline (read-your-writes), replies come back in order, and a
/// connection command in the middle (CW.CONSISTENCY, CW.SESSION INFO)
/// runs after the commands before it. The eventual reads at the end run
/// together (the only requests a session overlaps); they read keys a
/// linearizable write made stable, so every replica has them.
#[test]
fn a_pipeline_reads_its_own_writes_in_order() {
    let c = Cluster::three();
    let mut con = c.conn(2);
    let mut p = redis::pipe();
    for level in ["causal", "linearizable"] {
        p.cmd("CW.CONSISTENCY").arg(level);
        for i in 0..50 {
            let key = format!("ryw:{level}:{}", i % 7);
            p.cmd("SET").arg(&key).arg(format!("v1-{i}"));
            p.cmd("GET").arg(&key);
            p.cmd("SET").arg(&key).arg(format!("v2-{i}"));
            p.cmd("GET").arg(&key);
            p.cmd("MGET").arg(&key).arg("ryw:none");
        }
    }
    p.cmd("CW.SESSION").arg("INFO");
    p.cmd("CW.CONSISTENCY").arg("eventual");
    for i in 0..7 {
        p.cmd("GET").arg(format!("ryw:linearizable:{i}"));
    }
    p.cmd("EXISTS").arg("ryw:linearizable:0").arg("ryw:none").arg("ryw:linearizable:1");
    let replies: Vec<Value> = p.query(&mut con).unwrap();
    let mut it = replies.into_iter();
    let mut next = || it.next().expect("a reply per command");
    for level in ["causal", "linearizable"] {
        assert_eq!(next(), Value::Okay, "CW.CONSISTENCY {level}");
        for i in 0..50 {
            let at = format!("{level} {i}");
            assert_eq!(next(), Value::Okay, "{at}");
            assert_eq!(next(), Value::BulkString(format!("v1-{i}").into_bytes()), "{at}: the first GET sees the first SET");
            assert_eq!(next(), Value::Okay, "{at}");
            assert_eq!(next(), Value::BulkString(format!("v2-{i}").into_bytes()), "{at}: the second GET sees the second SET");
            assert_eq!(next(), Value::Array(vec![Value::BulkString(format!("v2-{i}").into_bytes()), Value::Nil]), "{at}: MGET");
        }
    }
    assert!(matches!(next(), Value::BulkString(info) if info.starts_with(b"tracked_keys:")));
    assert_eq!(next(), Value::Okay);
    for i in 0..7 {
        let last = (0..50).filter(|j| j % 7 == i).max().unwrap();
        assert_eq!(next(), Value::BulkString(format!("v2-{last}").into_bytes()), "eventual GET {i}");
    }
    assert_eq!(next(), Value::Int(2));
}

#[test]
fn pipelined_commands_answer_in_order() {
    let c = Cluster::three();
    let mut con = c.conn(1);
    let mut p = redis::pipe();
    for i in 0..200 {
        p.cmd("SET").arg(format!("pipe:{i}")).arg(i);
        p.cmd("GET").arg(format!("pipe:{i}"));
        if i % 10 == 0 {
            p.cmd("ECHO").arg(format!("echo {i}"));
            p.cmd("EXISTS").arg(format!("pipe:{i}")).arg("nope");
            p.cmd("GET").arg("nope");
        }
    }
    p.cmd("DEL").arg("pipe:0").arg("pipe:1");
    p.cmd("MGET").arg("pipe:0").arg("pipe:2");
    let replies: Vec<Value> = p.query(&mut con).unwrap();
    let mut it = replies.into_iter();
    let mut next = || it.next().expect("a reply per command");
    for i in 0..200 {
        assert_eq!(next(), Value::Okay, "SET {i}");
        assert_eq!(next(), Value::BulkString(i.to_string().into_bytes()), "GET {i}");
        if i % 10 == 0 {
            assert_eq!(next(), Value::BulkString(format!("echo {i}").into_bytes()));
            assert_eq!(next(), Value::Int(1));
            assert_eq!(next(), Value::Nil);
        }
    }
    assert_eq!(next(), Value::Int(2));
    assert_eq!(next(), Value::Array(vec![Value::Nil, Value::BulkString(b"2".to_vec())]));
    // The redis crate stops at the first error of a pipeline; the server
    // answers every command regardless (checked on a raw connection).
    let e = redis::pipe().cmd("SET").arg("a").arg("1").cmd("SET").arg("a").arg("2").arg("BAD").query::<Vec<Value>>(&mut con).unwrap_err();
    assert_eq!(err_line(&e), "ERR syntax error");
    let mut raw = c.raw(1);
    raw.send(
        b"*3\r\n$3\r\nSET\r\n$1\r\nb\r\n$1\r\n1\r\n*4\r\n$3\r\nSET\r\n$1\r\nb\r\n$1\r\n2\r\n$3\r\nBAD\r\n*2\r\n$3\r\nGET\r\n$1\r\nb\r\n",
    );
    assert_eq!(raw.read_frame(), common::simple("OK"));
    assert_eq!(raw.read_frame(), common::error("ERR syntax error"));
    assert_eq!(raw.read_frame(), common::bulk(b"1"));
    assert_eq!(get(&mut con, "a"), Some(b"1".to_vec()));
}

/// Causal+ across sessions on different nodes while writes are in flight:
/// the writer sets `a` then `b` to the same counter; a reader that sees
/// `b = n` must then see `a >= n` (the write of `b` depends on `a`), and
/// each key it reads never goes backwards (monotonic reads).
#[test]
fn causality_holds_across_nodes_under_concurrent_writes() {
    let c = Cluster::three();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let mut con = c.conn(0);
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) || n < 50 {
                n += 1;
                set(&mut con, "causal:a", n);
                set(&mut con, "causal:b", n);
            }
            n
        })
    };
    let readers: Vec<_> = [1usize, 2, 0]
        .into_iter()
        .map(|node| {
            let mut con = c.conn(node);
            std::thread::spawn(move || {
                let (mut last_a, mut last_b, mut checks) = (0u64, 0u64, 0);
                for _ in 0..150 {
                    let b: u64 = cmd("GET").arg("causal:b").query::<Option<u64>>(&mut con).unwrap().unwrap_or(0);
                    let a: u64 = cmd("GET").arg("causal:a").query::<Option<u64>>(&mut con).unwrap().unwrap_or(0);
                    assert!(a >= b, "node {node}: read b={b} then a={a}");
                    assert!(b >= last_b && a >= last_a, "node {node}: went back: a {last_a}->{a}, b {last_b}->{b}");
                    let both: Vec<Option<u64>> = cmd("MGET").arg("causal:a").arg("causal:b").query(&mut con).unwrap();
                    let (sa, sb) = (both[0].unwrap_or(0), both[1].unwrap_or(0));
                    assert!(sa >= sb, "node {node}: MGET snapshot a={sa} b={sb}");
                    assert!(sb >= b, "node {node}: MGET went back: b {b}->{sb}");
                    (last_a, last_b) = (sa, sb);
                    checks += 1;
                }
                checks
            })
        })
        .collect();
    for r in readers {
        assert_eq!(r.join().expect("a reader saw a causality violation"), 150);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let n = writer.join().unwrap();
    // Everyone converges on the last write.
    for node in 0..3 {
        let mut con = c.conn(node);
        eventually(WAIT, "convergence", || (get(&mut con, "causal:b") == Some(n.to_string().into_bytes())).then_some(()));
        assert_eq!(get(&mut con, "causal:a"), Some(n.to_string().into_bytes()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_concurrent_connections() {
    let c = Cluster::three();
    let mut tasks = Vec::new();
    for t in 0..20usize {
        let mut con = c.aconn(t % 3).await;
        tasks.push(tokio::spawn(async move {
            for i in 0..25 {
                let key = format!("conc:{t}:{i}");
                let value = format!("{t}/{i}");
                let ok: String = redis::cmd("SET").arg(&key).arg(&value).query_async(&mut con).await.unwrap();
                assert_eq!(ok, "OK");
                let got: Option<String> = redis::cmd("GET").arg(&key).query_async(&mut con).await.unwrap();
                assert_eq!(got.as_deref(), Some(value.as_str()), "{key}");
            }
            let keys: Vec<String> = (0..25).map(|i| format!("conc:{t}:{i}")).collect();
            let all: Vec<Option<String>> = redis::cmd("MGET").arg(&keys).query_async(&mut con).await.unwrap();
            for (i, v) in all.iter().enumerate() {
                assert_eq!(v.as_deref(), Some(format!("{t}/{i}").as_str()));
            }
        }));
    }
    for t in tasks {
        t.await.expect("a client task failed");
    }
    let mut con = c.aconn(0).await;
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let n: i64 = redis::cmd("DBSIZE").query_async(&mut con).await.unwrap();
        if n == 500 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "DBSIZE stuck at {n}, want 500");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[test]
fn killing_a_node_leaves_reads_through_the_others_working() {
    let mut c = Cluster::start_with(Opts::new(3, 3, 2).flag("--request-timeout-ms", 1000));
    let keys: Vec<String> = (0..60).map(|i| format!("survive:{i}")).collect();
    {
        let mut con = c.conn(0);
        for k in &keys {
            set(&mut con, k, k);
        }
    }
    // Every write has reached its tail before the crash.
    wait_dbsize(&c, 0, keys.len() as i64);
    let dead = 2;
    c.kill(dead);

    // Reads of existing keys through the surviving nodes keep working. A
    // fresh connection per read; a read routed to the dead node times out
    // (after --request-timeout-ms), so allow one retry.
    for node in [0, 1] {
        for k in &keys {
            let mut last = None;
            for _attempt in 0..3 {
                let mut con = c.conn(node);
                match cmd("GET").arg(k).query::<Option<String>>(&mut con) {
                    Ok(v) => {
                        last = Some(Ok(v));
                        break;
                    }
                    Err(e) => last = Some(Err(err_line(&e))),
                }
            }
            match last {
                Some(Ok(v)) => assert_eq!(v.as_deref(), Some(k.as_str()), "{k} via node {node}"),
                other => panic!("{k} via node {node}: {other:?}\n{}", c.logs()),
            }
        }
    }

    // A write whose chain started at the dead node does not hang: it
    // succeeds once the coordinator has repaired the chain (the driver
    // retries a write that could not be sent), or fails with an error
    // reply if that takes longer than the request timeout; either way the
    // connection stays usable.
    let t = topology(&c);
    let headless = (0..).map(|i| format!("headless:{i}")).find(|k| t.chain(t.partition_of(k.as_bytes())).head() == dead as u16).unwrap();
    let mut con = c.conn(0);
    match cmd("SET").arg(&headless).arg("x").query::<Value>(&mut con) {
        Ok(v) => assert_eq!(v, Value::Okay),
        Err(e) => assert!(err_line(&e).starts_with("ERR"), "{e}"),
    }
    assert_eq!(cmd("PING").query::<String>(&mut con).unwrap(), "PONG");
    let mut fresh = c.conn(1);
    assert_eq!(get(&mut fresh, &keys[0]).as_deref(), Some(keys[0].as_bytes()));
}

#[test]
fn keyrange_matches_the_ring() {
    // The harness's own map (used to pick keys by chain) agrees with what
    // the nodes say.
    let c = Cluster::three();
    let t = topology(&c);
    let from_node = c.chains(0);
    let local: Vec<Vec<usize>> = t.chains.iter().map(|ch| ch.nodes.iter().map(|&n| n as usize).collect()).collect();
    assert_eq!(from_node, local);
}

/// Regression (fixed; this was the bug):
/// A connection that wrote causally (acknowledged at k=2, not yet at the
/// tail) and then switches to `CW.CONSISTENCY linearizable` reads at the
/// tail without the session's version floor, so it can read a value older
/// than its own last write, or nil. A stronger level should never show a
/// session less than it has already written.
#[test]
fn switching_to_linearizable_keeps_read_your_writes() {
    let c = Cluster::three();
    let mut raw = c.raw(0);
    let mut stale = Vec::new();
    for i in 0..200 {
        let key = format!("mix:{}", i % 7);
        let value = i.to_string();
        let mut out = bytes::BytesMut::new();
        causeway_resp::encode_request(&[b"SET", key.as_bytes(), value.as_bytes()], &mut out);
        causeway_resp::encode_request(&[b"CW.CONSISTENCY", b"linearizable"], &mut out);
        causeway_resp::encode_request(&[b"GET", key.as_bytes()], &mut out);
        causeway_resp::encode_request(&[b"CW.CONSISTENCY", b"causal"], &mut out);
        raw.send(&out);
        assert_eq!(raw.read_frame(), common::simple("OK"));
        assert_eq!(raw.read_frame(), common::simple("OK"));
        let got = raw.read_frame();
        assert_eq!(raw.read_frame(), common::simple("OK"));
        if got != common::bulk(value.as_bytes()) {
            stale.push((i, got));
        }
    }
    assert!(
        stale.is_empty(),
        "{} of 200 linearizable reads missed the session's own write, e.g. {:?}",
        stale.len(),
        &stale[..stale.len().min(3)]
    );
}

/// A session token as `CW.SESSION EXPORT` makes it, for a session with no
/// tracked keys whose past is the given `max_ts` in site 0 (bincode, varint
/// integers: two empty maps, the past as a one-entry vector of the
/// timestamp's physical milliseconds and logical counter, an empty
/// site-time vector, and no write acknowledged yet).
fn crafted_token(physical_ms: u64, logical: u32) -> String {
    fn varint(v: u64, out: &mut Vec<u8>) {
        match v {
            0..=250 => out.push(v as u8),
            251..=0xFFFF => {
                out.push(251);
                out.extend_from_slice(&(v as u16).to_le_bytes());
            }
            0x1_0000..=0xFFFF_FFFF => {
                out.push(252);
                out.extend_from_slice(&(v as u32).to_le_bytes());
            }
            _ => {
                out.push(253);
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
    }
    let mut b = vec![0u8, 0u8, 1u8];
    varint(physical_ms, &mut b);
    varint(logical as u64, &mut b);
    b.push(0);
    b.push(0);
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
}

#[test]
fn crafted_token_helper_matches_export() {
    // The helper above produces what the node itself exports.
    let c = Cluster::start(1, 1, 1);
    let mut con = c.conn(0);
    let token = crafted_token(1_700_000_000_000, 7);
    assert_eq!(cmd("CW.SESSION").arg("RESUME").arg(&token).query::<String>(&mut con).unwrap(), "OK");
    let info: String = cmd("CW.SESSION").arg("INFO").query(&mut con).unwrap();
    assert!(info.contains("max_ts:1700000000000.7"), "{info}");
    assert_eq!(cmd("CW.SESSION").arg("EXPORT").query::<String>(&mut con).unwrap(), token);
}

/// Regression (fixed; this was the bug):
/// A session token is client input, but its `max_ts` becomes the `after`
/// of the session's writes unchecked: with the logical counter at
/// u32::MAX, the head's `Clock::tick` computes `floor.logical + 1`
/// (core/src/hlc.rs, `tick`), which panics in debug builds ("attempt to add
/// with overflow"; the client's connection, or the head's inbound peer
/// link, dies) and wraps in release builds (a write timestamped before its
/// own causal past).
#[test]
fn session_token_with_saturated_logical_clock_is_handled() {
    let c = Cluster::start_with(Opts::new(3, 3, 2).flag("--request-timeout-ms", 1000));
    let token = crafted_token(now_ms() + 60_000, u32::MAX);
    for i in 0..12 {
        let mut con = c.conn(i % 3);
        if cmd("CW.SESSION").arg("RESUME").arg(&token).query::<String>(&mut con).is_err() {
            continue; // refusing such a token is a fine answer too
        }
        let key = format!("sat:{i}");
        match cmd("SET").arg(&key).arg("v").query::<String>(&mut con) {
            Ok(ok) => assert_eq!(ok, "OK"),
            Err(e) => panic!("SET {key} after resuming the token: {e}\n{}", c.logs()),
        }
        assert_eq!(get(&mut con, &key), Some(b"v".to_vec()));
    }
    assert!(!c.logs().contains("panicked"), "{}", c.logs());
}

/// Regression (fixed; this was the bug):
/// A token whose `max_ts` lies far in the future (crafted, or exported on
/// a machine with a badly skewed clock) pushes the clock of every head the
/// session writes to into the future. From then on, that partition's new
/// versions are timestamped in the future, and MGET from any fresh session
/// (snapshot at "now") keeps returning the pre-poisoning value: it never
/// converges, while GET returns the new value.
#[test]
fn far_future_session_token_does_not_freeze_snapshots() {
    let c = Cluster::three();
    let mut setup = c.conn(0);
    cmd("CW.CONSISTENCY").arg("linearizable").query::<()>(&mut setup).unwrap();
    set(&mut setup, "frozen", "old");
    let mut poison = c.conn(1);
    let ten_years = 10 * 365 * 24 * 3_600_000;
    if cmd("CW.SESSION").arg("RESUME").arg(crafted_token(now_ms() + ten_years, 0)).query::<String>(&mut poison).is_ok() {
        set(&mut poison, "frozen", "poisoned");
    }
    // A later, tail-acknowledged write by someone else.
    set(&mut setup, "frozen", "new");
    assert_eq!(get(&mut c.conn(2), "frozen"), Some(b"new".to_vec()));
    eventually(Duration::from_secs(3), "a fresh session's MGET to see the latest write", || {
        let mut fresh = c.conn(2);
        let v: Vec<Option<String>> = cmd("MGET").arg("frozen").query(&mut fresh).unwrap();
        (v[0].as_deref() == Some("new")).then_some(())
    });
}
