//! Histories recorded in linearizable mode, with a node killed midway,
//! checked by a real linearizability checker: porcupine, through the small
//! Go program in tools/lincheck.

mod common;

use causeway_checker::lincheck::{check, to_json, Op, OpKind};
use common::{Cluster, Opts};
use redis::Commands;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[test]
fn the_checker_rejects_a_stale_read() {
    // put(a,1) completes, then a get that starts later reads nothing.
    let op = |kind, call, ret| Op { client: 0, key: "a".into(), kind, call, ret: Some(ret) };
    let bad = [op(OpKind::Put("1".into()), 0, 10), op(OpKind::Get(String::new()), 20, 30)];
    assert!(!check(&bad));
    let good = [op(OpKind::Put("1".into()), 0, 10), op(OpKind::Get("1".into()), 20, 30)];
    assert!(check(&good));
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
    let history = Arc::new(Mutex::new(Vec::<Op>::new()));
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
                    let op = if n.is_multiple_of(2) {
                        let value = format!("c{client}-{n}");
                        let result: redis::RedisResult<String> = con.set(&key, &value);
                        // A put that failed may still have happened.
                        let ret = result.is_ok().then(|| start.elapsed().as_nanos() as i64);
                        Some(Op { client, key, kind: OpKind::Put(value), call, ret })
                    } else if n % 6 == 1 {
                        // An MGET of two keys: one snapshot. A failed read
                        // tells nothing: left out.
                        let keys = vec![key.clone(), format!("lk{}", (n + client as u64) % 4)];
                        let result: redis::RedisResult<Vec<Option<String>>> = con.mget(&keys);
                        let ret = Some(start.elapsed().as_nanos() as i64);
                        result.ok().map(|v| {
                            let values = v.into_iter().map(Option::unwrap_or_default).collect();
                            Op { client, key, kind: OpKind::MultiGet { keys, values }, call, ret }
                        })
                    } else {
                        // A get that failed tells nothing: left out.
                        let result: redis::RedisResult<Option<String>> = con.get(&key);
                        let ret = Some(start.elapsed().as_nanos() as i64);
                        result.ok().map(|v| Op { client, key, kind: OpKind::Get(v.unwrap_or_default()), call, ret })
                    };
                    let failed = op.as_ref().is_none_or(|o| o.ret.is_none());
                    history.lock().unwrap().extend(op);
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
    assert!(check(&history), "linearizable mode produced a non-linearizable history:\n{}", to_json(&history));
}
