//! Redis commands against real `causeway node` processes, checked against
//! Redis' own semantics (replies, error texts, options).

mod common;

use causeway_resp::Frame;
use common::{bulk, err_line, error, eventually, expect_err, simple, Cluster, Opts};
use redis::{cmd, Value};
use std::time::Duration;

#[test]
fn ping_echo_select_and_generic_errors() {
    let c = Cluster::three();
    let mut con = c.conn(1);
    assert_eq!(cmd("PING").query::<String>(&mut con).unwrap(), "PONG");
    assert_eq!(cmd("PING").arg("hi there").query::<String>(&mut con).unwrap(), "hi there");
    assert_eq!(cmd("ECHO").arg(b"a\r\nb\0c".as_slice()).query::<Vec<u8>>(&mut con).unwrap(), b"a\r\nb\0c");
    assert_eq!(cmd("SELECT").arg(0).query::<String>(&mut con).unwrap(), "OK");
    assert_eq!(expect_err(&mut con, cmd("SELECT").arg(1)), "ERR DB index is out of range");
    assert_eq!(expect_err(&mut con, cmd("SELECT").arg("x")), "ERR value is not an integer or out of range");
    assert_eq!(expect_err(&mut con, cmd("PING").arg("a").arg("b")), "ERR wrong number of arguments for 'ping' command");
    assert_eq!(expect_err(&mut con, &cmd("GET")), "ERR wrong number of arguments for 'get' command");
    assert_eq!(expect_err(&mut con, cmd("GET").arg("a").arg("b")), "ERR wrong number of arguments for 'get' command");
    assert_eq!(expect_err(&mut con, cmd("SET").arg("a")), "ERR wrong number of arguments for 'set' command");
    assert_eq!(expect_err(&mut con, &cmd("ECHO")), "ERR wrong number of arguments for 'echo' command");
    // Command names are case-insensitive.
    assert_eq!(cmd("pInG").query::<String>(&mut con).unwrap(), "PONG");

    // Unknown commands: Redis' wording (the exact byte layout of the argument
    // list is checked on the raw connection below).
    let e = expect_err(&mut con, cmd("FOO").arg("bar").arg("baz"));
    assert_eq!(e, "ERR unknown command 'FOO', with args beginning with: 'bar' 'baz' ", "Redis's wording, to the trailing space");
    let mut raw = c.raw(2);
    match raw.cmd(&[b"foo"]) {
        Frame::Error(e) => assert_eq!(e, "ERR unknown command 'foo', with args beginning with: "),
        other => panic!("{other:?}"),
    }
    // The connection survives errors.
    assert_eq!(raw.cmd(&[b"PING"]), simple("PONG"));
    assert_eq!(cmd("PING").query::<String>(&mut con).unwrap(), "PONG");
}

#[test]
fn set_options_follow_redis() {
    let c = Cluster::three();
    let mut con = c.conn(0);
    // NX: only if absent; a failed condition is a nil reply.
    assert_eq!(cmd("SET").arg("nx").arg("1").arg("NX").query::<Option<String>>(&mut con).unwrap().as_deref(), Some("OK"));
    assert_eq!(cmd("SET").arg("nx").arg("2").arg("nx").query::<Option<String>>(&mut con).unwrap(), None);
    assert_eq!(cmd("GET").arg("nx").query::<String>(&mut con).unwrap(), "1");
    // XX: only if present.
    assert_eq!(cmd("SET").arg("xx").arg("1").arg("XX").query::<Option<String>>(&mut con).unwrap(), None);
    assert_eq!(cmd("GET").arg("xx").query::<Option<String>>(&mut con).unwrap(), None);
    assert_eq!(cmd("SET").arg("nx").arg("3").arg("XX").query::<Option<String>>(&mut con).unwrap().as_deref(), Some("OK"));
    assert_eq!(cmd("GET").arg("nx").query::<String>(&mut con).unwrap(), "3");
    // Options combine, in any order and case.
    assert_eq!(
        cmd("SET").arg("combo").arg("v").arg("ex").arg(100).arg("nx").query::<Option<String>>(&mut con).unwrap().as_deref(),
        Some("OK")
    );
    assert_eq!(
        cmd("SET").arg("combo").arg("w").arg("PX").arg(100_000).arg("XX").query::<Option<String>>(&mut con).unwrap().as_deref(),
        Some("OK")
    );
    assert_eq!(cmd("GET").arg("combo").query::<String>(&mut con).unwrap(), "w");

    // Invalid expire times.
    for (unit, n) in [("EX", "0"), ("EX", "-1"), ("PX", "0"), ("PX", "-5")] {
        assert_eq!(
            expect_err(&mut con, cmd("SET").arg("k").arg("v").arg(unit).arg(n)),
            "ERR invalid expire time in 'set' command",
            "{unit} {n}"
        );
    }
    assert_eq!(expect_err(&mut con, cmd("SET").arg("k").arg("v").arg("EX").arg("soon")), "ERR value is not an integer or out of range");
    // Bad or conflicting options.
    for opts in [&["FOO"][..], &["NX", "XX"], &["XX", "NX"], &["EX"], &["EX", "10", "PX", "100"], &["PX", "10", "EX", "1"]] {
        let mut c2 = cmd("SET");
        c2.arg("k").arg("v");
        for o in opts {
            c2.arg(*o);
        }
        assert_eq!(expect_err(&mut con, &c2), "ERR syntax error", "{opts:?}");
    }
    // Nothing was written by the failed commands.
    assert_eq!(cmd("EXISTS").arg("k").query::<i64>(&mut con).unwrap(), 0);
}

#[test]
fn ttl_expiry_is_lazy_and_reads_as_absent() {
    let c = Cluster::three();
    let mut con = c.conn(0);
    let written = std::time::Instant::now();
    cmd("SET").arg("short").arg("v").arg("PX").arg(300).query::<()>(&mut con).unwrap();
    let before_expiry = cmd("GET").arg("short").query::<Option<String>>(&mut con).unwrap();
    if written.elapsed() < Duration::from_millis(300) {
        // Read before the TTL could have run out: the value is there.
        assert_eq!(before_expiry.as_deref(), Some("v"));
    }
    cmd("SET").arg("long").arg("v").arg("EX").arg(1000).query::<()>(&mut con).unwrap();
    cmd("SET").arg("plain").arg("v").query::<()>(&mut con).unwrap();
    eventually(Duration::from_secs(10), "the short key to expire", || {
        cmd("GET").arg("short").query::<Option<String>>(&mut con).unwrap().is_none().then_some(())
    });
    assert_eq!(cmd("EXISTS").arg("short").arg("long").arg("plain").query::<i64>(&mut con).unwrap(), 2);
    assert_eq!(
        cmd("MGET").arg("short").arg("long").arg("plain").query::<Vec<Option<String>>>(&mut con).unwrap(),
        vec![None, Some("v".into()), Some("v".into())]
    );
    // Expired on every node, not just the one that wrote it.
    for i in 0..3 {
        let mut other = c.conn(i);
        assert_eq!(cmd("GET").arg("short").query::<Option<String>>(&mut other).unwrap(), None, "node {i}");
    }
    // An expired key does not count, cannot be deleted, and NX may set it again.
    eventually(Duration::from_secs(10), "DBSIZE to drop the expired key", || {
        (cmd("DBSIZE").query::<i64>(&mut con).unwrap() == 2).then_some(())
    });
    assert_eq!(cmd("DEL").arg("short").query::<i64>(&mut con).unwrap(), 0);
    assert_eq!(cmd("SET").arg("short").arg("again").arg("NX").query::<Option<String>>(&mut con).unwrap().as_deref(), Some("OK"));
    assert_eq!(cmd("GET").arg("short").query::<Option<String>>(&mut con).unwrap().as_deref(), Some("again"));
    // A plain SET replaces the TTL (the key no longer expires).
    cmd("SET").arg("t2").arg("a").arg("PX").arg(200).query::<()>(&mut con).unwrap();
    cmd("SET").arg("t2").arg("b").query::<()>(&mut con).unwrap();
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(cmd("GET").arg("t2").query::<Option<String>>(&mut con).unwrap().as_deref(), Some("b"));
}

#[test]
fn del_and_exists_count_like_redis() {
    let c = Cluster::three();
    let mut con = c.conn(2);
    for k in ["a", "b", "c"] {
        cmd("SET").arg(k).arg(k).query::<()>(&mut con).unwrap();
    }
    // EXISTS counts repeats again.
    assert_eq!(cmd("EXISTS").arg("a").arg("a").arg("b").arg("nope").query::<i64>(&mut con).unwrap(), 3);
    // DEL counts only keys that existed, and a repeated key once.
    assert_eq!(cmd("DEL").arg("a").arg("a").arg("nope").arg("b").query::<i64>(&mut con).unwrap(), 2);
    assert_eq!(cmd("DEL").arg("a").query::<i64>(&mut con).unwrap(), 0);
    assert_eq!(cmd("EXISTS").arg("a").arg("b").arg("c").query::<i64>(&mut con).unwrap(), 1);
    assert_eq!(cmd("GET").arg("a").query::<Option<String>>(&mut con).unwrap(), None);
    // Deleted keys can be written again.
    cmd("SET").arg("a").arg("again").query::<()>(&mut con).unwrap();
    assert_eq!(cmd("GET").arg("a").query::<String>(&mut con).unwrap(), "again");
    assert_eq!(expect_err(&mut con, &cmd("DEL")), "ERR wrong number of arguments for 'del' command");
    assert_eq!(expect_err(&mut con, &cmd("EXISTS")), "ERR wrong number of arguments for 'exists' command");
    assert_eq!(expect_err(&mut con, &cmd("MGET")), "ERR wrong number of arguments for 'mget' command");
}

/// String commands that are a read or a write answered another way.
#[test]
fn string_commands_beyond_get_and_set() {
    let c = Cluster::three();
    let mut con = c.conn(0);
    assert_eq!(cmd("MSET").arg("a").arg("1").arg("b").arg("22").query::<String>(&mut con).unwrap(), "OK");
    assert_eq!(cmd("MGET").arg("a").arg("b").query::<Vec<String>>(&mut con).unwrap(), ["1", "22"]);
    assert_eq!(expect_err(&mut con, cmd("MSET").arg("a").arg("1").arg("b")), "ERR wrong number of arguments for 'mset' command");
    assert_eq!(cmd("STRLEN").arg("b").query::<i64>(&mut con).unwrap(), 2);
    assert_eq!(cmd("STRLEN").arg("nosuch").query::<i64>(&mut con).unwrap(), 0);
    assert_eq!(cmd("TYPE").arg("a").query::<String>(&mut con).unwrap(), "string");
    assert_eq!(cmd("TYPE").arg("nosuch").query::<String>(&mut con).unwrap(), "none");
    cmd("SET").arg("t").arg("x").arg("EX").arg(100).query::<()>(&mut con).unwrap();
    assert_eq!(cmd("GETSET").arg("t").arg("y").query::<Option<String>>(&mut con).unwrap().as_deref(), Some("x"));
    assert_eq!(cmd("TTL").arg("t").query::<i64>(&mut con).unwrap(), -1, "GETSET drops the expiry, as SET does");
    assert_eq!(cmd("GETSET").arg("new").arg("z").query::<Option<String>>(&mut con).unwrap(), None);
    assert_eq!(cmd("GETDEL").arg("t").query::<Option<String>>(&mut con).unwrap().as_deref(), Some("y"));
    assert_eq!(cmd("GETDEL").arg("t").query::<Option<String>>(&mut con).unwrap(), None);
    assert_eq!(cmd("EXISTS").arg("t").query::<i64>(&mut con).unwrap(), 0);
    assert_eq!(cmd("TOUCH").arg("a").arg("b").arg("nosuch").query::<i64>(&mut con).unwrap(), 2);
    assert_eq!(cmd("OBJECT").arg("ENCODING").arg("b").query::<String>(&mut con).unwrap(), "int");
    assert_eq!(cmd("OBJECT").arg("ENCODING").arg("new").query::<String>(&mut con).unwrap(), "embstr");
    assert_eq!(cmd("OBJECT").arg("ENCODING").arg("nosuch").query::<Option<String>>(&mut con).unwrap(), None);
    assert_eq!(cmd("OBJECT").arg("REFCOUNT").arg("a").query::<i64>(&mut con).unwrap(), 1);
    assert_eq!(cmd("UNLINK").arg("a").arg("b").arg("nosuch").query::<i64>(&mut con).unwrap(), 2);
}

/// APPEND, SETRANGE, GETRANGE, INCRBYFLOAT and SETNX as Redis answers
/// them; appends from many clients through every node all count (each
/// computed at the key's head).
#[test]
fn appends_ranges_and_float_increments() {
    let c = Cluster::three();
    let mut con = c.conn(0);
    assert_eq!(cmd("APPEND").arg("a").arg("hello").query::<i64>(&mut con).unwrap(), 5);
    assert_eq!(cmd("APPEND").arg("a").arg(" world").query::<i64>(&mut con).unwrap(), 11);
    assert_eq!(cmd("SETRANGE").arg("a").arg(6).arg("Redis").query::<i64>(&mut con).unwrap(), 11);
    assert_eq!(cmd("GETRANGE").arg("a").arg(-5).arg(-1).query::<String>(&mut con).unwrap(), "Redis");
    assert_eq!(cmd("GETRANGE").arg("a").arg(0).arg(4).query::<String>(&mut con).unwrap(), "hello");
    assert_eq!(cmd("SETRANGE").arg("z").arg(3).arg("x").query::<i64>(&mut con).unwrap(), 4);
    assert_eq!(cmd("GET").arg("z").query::<Vec<u8>>(&mut con).unwrap(), b"\0\0\0x");
    assert_eq!(cmd("SETRANGE").arg("none").arg(3).arg("").query::<i64>(&mut con).unwrap(), 0);
    assert_eq!(cmd("EXISTS").arg("none").query::<i64>(&mut con).unwrap(), 0, "an empty SETRANGE writes nothing");
    assert_eq!(expect_err(&mut con, cmd("SETRANGE").arg("a").arg(-1).arg("x")), "ERR offset is out of range");
    cmd("SET").arg("f").arg("10.50").arg("EX").arg(100).query::<()>(&mut con).unwrap();
    assert_eq!(cmd("INCRBYFLOAT").arg("f").arg("0.1").query::<String>(&mut con).unwrap(), "10.6");
    assert!(cmd("TTL").arg("f").query::<i64>(&mut con).unwrap() > 0, "INCRBYFLOAT keeps the expiry");
    assert_eq!(expect_err(&mut con, cmd("INCRBYFLOAT").arg("a").arg(1)), "ERR value is not a valid float");
    assert_eq!(cmd("SETNX").arg("n").arg(1).query::<i64>(&mut con).unwrap(), 1);
    assert_eq!(cmd("SETNX").arg("n").arg(2).query::<i64>(&mut con).unwrap(), 0);
    let threads: Vec<_> = (0..6)
        .map(|i| {
            let mut con = c.conn(i % 3);
            std::thread::spawn(move || {
                for _ in 0..100 {
                    cmd("APPEND").arg("log").arg("x").query::<i64>(&mut con).unwrap();
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    assert_eq!(cmd("STRLEN").arg("log").query::<i64>(&mut c.conn(2)).unwrap(), 600);
}

/// WAIT: R - 1 once the session's writes are on every replica; every node
/// then serves them from its own replica.
#[test]
fn wait_counts_the_replicas_that_hold_the_writes() {
    let c = Cluster::three();
    let mut con = c.conn(0);
    for i in 0..20 {
        cmd("SET").arg(format!("w{i}")).arg(i).query::<()>(&mut con).unwrap();
    }
    assert_eq!(cmd("WAIT").arg(2).arg(1000).query::<i64>(&mut con).unwrap(), 2);
    for n in 0..3 {
        let mut at = c.conn(n);
        cmd("CW.CONSISTENCY").arg("eventual").query::<()>(&mut at).unwrap();
        for i in 0..20 {
            assert_eq!(cmd("GET").arg(format!("w{i}")).query::<Option<i64>>(&mut at).unwrap(), Some(i), "node {n}");
        }
    }
    assert_eq!(expect_err(&mut con, cmd("WAIT").arg(1).arg(-1)), "ERR timeout is negative");
    assert_eq!(cmd("WAIT").arg(0).arg(0).query::<i64>(&mut c.conn(1)).unwrap(), 2, "nothing to wait for");
}

/// MULTI/EXEC: nothing runs before EXEC, which answers every reply in its
/// place (redis-py's and the redis crate's pipelines use it); an unknown
/// command aborts the transaction; Redis's errors.
#[test]
fn multi_queues_until_exec() {
    let c = Cluster::three();
    let mut con = c.conn(0);
    let mut other = c.conn(1);
    assert_eq!(cmd("MULTI").query::<String>(&mut con).unwrap(), "OK");
    assert_eq!(cmd("INCR").arg("cnt").query::<String>(&mut con).unwrap(), "QUEUED");
    assert_eq!(cmd("SET").arg("k").arg("v").query::<String>(&mut con).unwrap(), "QUEUED");
    assert_eq!(cmd("GET").arg("cnt").query::<Option<String>>(&mut other).unwrap(), None, "nothing ran before EXEC");
    let replies: (i64, String) = cmd("EXEC").query(&mut con).unwrap();
    assert_eq!(replies, (1, "OK".to_string()));
    let (n, v, ttl): (i64, String, i64) = redis::pipe().atomic().incr("cnt", 1).get("k").ttl("k").query(&mut con).unwrap();
    assert_eq!((n, v.as_str(), ttl), (2, "v", -1));
    // A wrong argument is queued and answered in its place; an unknown
    // command aborts.
    let mut raw = c.raw(2);
    assert_eq!(raw.cmd(&[b"MULTI"]), simple("OK"));
    assert_eq!(raw.cmd(&[b"SET", b"k", b"v", b"EX", b"x"]), simple("QUEUED"));
    assert_eq!(raw.cmd(&[b"INCR", b"cnt"]), simple("QUEUED"));
    match raw.cmd(&[b"EXEC"]) {
        Frame::Array(items) => {
            assert!(matches!(&items[0], Frame::Error(e) if e.starts_with("ERR value is not an integer")), "{items:?}");
            assert_eq!(items[1], Frame::Integer(3));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(raw.cmd(&[b"MULTI"]), simple("OK"));
    assert_eq!(raw.cmd(&[b"INCR", b"cnt"]), simple("QUEUED"));
    assert!(matches!(raw.cmd(&[b"NOSUCH"]), Frame::Error(_)));
    assert_eq!(raw.cmd(&[b"EXEC"]), error("EXECABORT Transaction discarded because of previous errors."));
    assert_eq!(cmd("GET").arg("cnt").query::<String>(&mut other).unwrap(), "3", "nothing of the aborted transaction ran");
    // EXEC with arguments ends the transaction, discarded.
    assert_eq!(raw.cmd(&[b"MULTI"]), simple("OK"));
    assert_eq!(raw.cmd(&[b"INCR", b"cnt"]), simple("QUEUED"));
    assert_eq!(
        raw.cmd(&[b"EXEC", b"x"]),
        error("EXECABORT Transaction discarded because of: wrong number of arguments for 'exec' command")
    );
    assert_eq!(raw.cmd(&[b"GET", b"cnt"]), Frame::Bulk("3".into()), "out of the transaction, nothing of it ran");
    assert_eq!(expect_err(&mut con, &cmd("EXEC")), "ERR EXEC without MULTI");
    assert_eq!(expect_err(&mut con, &cmd("DISCARD")), "ERR DISCARD without MULTI");
    cmd("MULTI").query::<()>(&mut con).unwrap();
    assert_eq!(expect_err(&mut con, &cmd("MULTI")), "ERR MULTI calls can not be nested");
    assert_eq!(cmd("DISCARD").query::<String>(&mut con).unwrap(), "OK");
    assert_eq!(expect_err(&mut con, cmd("WATCH").arg("k")), "ERR WATCH is not supported: Causeway has no optimistic transactions yet");
}

/// A client that sends its whole pipeline before it reads a reply (as
/// redis-py does): 40 000 GETs of a key and a value of 1 000 bytes each are
/// 40 MB each way, more than the sockets' buffers hold, so the node must
/// read on while it writes; it once blocked its write on the client's full
/// buffer while the client blocked its send on the node's, for good.
#[test]
fn a_pipeline_sent_whole_before_any_reply_is_read() {
    use std::io::{Read, Write};
    let c = Cluster::start_with(Opts::new(1, 1, 1));
    let key = vec![b'k'; 1000];
    cmd("SET").arg(&key).arg(vec![b'x'; 1000]).query::<()>(&mut c.conn(0)).unwrap();
    let mut stream = std::net::TcpStream::connect(c.addr(0)).unwrap();
    stream.set_write_timeout(Some(Duration::from_secs(30))).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let n = 40_000;
    let mut get = b"*2\r\n$3\r\nGET\r\n$1000\r\n".to_vec();
    get.extend_from_slice(&key);
    get.extend_from_slice(b"\r\n");
    stream.write_all(&get.repeat(n)).expect("the node reads the whole pipeline while its replies wait");
    let reply = b"$1000\r\n".len() + 1000 + 2;
    let mut got = vec![0u8; n * reply];
    stream.read_exact(&mut got).expect("every reply");
    assert!(got.starts_with(b"$1000\r\nxxx") && got.ends_with(b"xx\r\n"));
}

/// KEYS, SCAN and RANDOMKEY: read at every partition's head, expired
/// keys left out; a scan returns every key present for its whole length,
/// while writers add and delete others.
#[test]
fn keys_scan_and_randomkey_list_the_whole_site() {
    let c = Cluster::three();
    let mut con = c.conn(0);
    assert_eq!(cmd("RANDOMKEY").query::<Option<String>>(&mut con).unwrap(), None);
    assert_eq!(cmd("KEYS").arg("*").query::<Vec<String>>(&mut con).unwrap(), Vec::<String>::new());
    let mut load = redis::pipe();
    for i in 0..1_000 {
        load.cmd("SET").arg(format!("user:{i}")).arg(i).ignore();
    }
    load.cmd("SET").arg("gone").arg("x").arg("PX").arg(1).ignore();
    load.cmd("SET").arg(b"bin\x00[ary]".as_slice()).arg("x").ignore();
    load.query::<()>(&mut con).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let mut other = c.conn(2);
    let mut keys: Vec<String> = cmd("KEYS").arg("user:1?").query(&mut other).unwrap();
    keys.sort();
    assert_eq!(keys, (10..20).map(|i| format!("user:{i}")).collect::<Vec<_>>());
    assert_eq!(cmd("KEYS").arg("*").query::<Vec<Vec<u8>>>(&mut other).unwrap().len(), 1_001, "the expired key is left out");
    assert_eq!(cmd("KEYS").arg(b"bin\x00\\[*".as_slice()).query::<Vec<Vec<u8>>>(&mut other).unwrap(), [b"bin\x00[ary]".to_vec()]);
    let key: String = cmd("RANDOMKEY").query(&mut other).unwrap();
    assert!(key.starts_with("user:") || key.starts_with("bin"), "{key}");
    // A scan while others write: every key there throughout is returned.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (stop, mut w) = (stop.clone(), c.conn(1));
        std::thread::spawn(move || {
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                cmd("SET").arg(format!("new:{i}")).arg(i).query::<()>(&mut w).unwrap();
                cmd("DEL").arg(format!("new:{}", i / 2)).query::<()>(&mut w).unwrap();
                i += 1;
            }
        })
    };
    let mut cursor = 0u64;
    let mut seen = std::collections::HashSet::new();
    let mut calls = 0;
    loop {
        let (next, keys): (u64, Vec<String>) =
            cmd("SCAN").arg(cursor).arg("MATCH").arg("user:*").arg("COUNT").arg(10).query(&mut other).unwrap();
        seen.extend(keys);
        calls += 1;
        if next == 0 {
            break;
        }
        cursor = next;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.join().unwrap();
    assert_eq!(seen.len(), 1_000);
    assert_eq!(calls, 64, "one partition a call");
    let all: std::collections::HashSet<Vec<u8>> = redis::Commands::scan(&mut con).unwrap().collect();
    assert!(all.len() >= 1_001, "{}", all.len());
    let none: (u64, Vec<String>) = cmd("SCAN").arg(0).arg("TYPE").arg("hash").query(&mut con).unwrap();
    assert_eq!(none, (1, vec![]));
    assert_eq!(expect_err(&mut con, cmd("SCAN").arg("x")), "ERR invalid cursor");
    assert_eq!(expect_err(&mut con, cmd("SCAN").arg(0).arg("COUNT").arg(0)), "ERR syntax error");
    assert_eq!(expect_err(&mut con, &cmd("KEYS")), "ERR wrong number of arguments for 'keys' command");
}

/// INCR and its family, decided at the key's head: increments through
/// every node at once all count; Redis's errors and expiry rules.
#[test]
fn increments_from_many_clients_all_count() {
    let c = Cluster::three();
    let mut con = c.conn(0);
    assert_eq!(cmd("INCR").arg("n").query::<i64>(&mut con).unwrap(), 1);
    assert_eq!(cmd("INCRBY").arg("n").arg(41).query::<i64>(&mut con).unwrap(), 42);
    assert_eq!(cmd("DECR").arg("n").query::<i64>(&mut con).unwrap(), 41);
    assert_eq!(cmd("DECRBY").arg("n").arg(-9).query::<i64>(&mut con).unwrap(), 50);
    assert_eq!(cmd("GET").arg("n").query::<String>(&mut con).unwrap(), "50");
    cmd("SET").arg("s").arg("abc").query::<()>(&mut con).unwrap();
    assert_eq!(expect_err(&mut con, cmd("INCR").arg("s")), "ERR value is not an integer or out of range");
    assert_eq!(expect_err(&mut con, cmd("INCRBY").arg("n").arg("1.5")), "ERR value is not an integer or out of range");
    cmd("SET").arg("max").arg(i64::MAX).query::<()>(&mut con).unwrap();
    assert_eq!(expect_err(&mut con, cmd("INCR").arg("max")), "ERR increment or decrement would overflow");
    cmd("SET").arg("t").arg("5").arg("EX").arg(100).query::<()>(&mut con).unwrap();
    assert_eq!(cmd("INCR").arg("t").query::<i64>(&mut con).unwrap(), 6);
    assert!(cmd("TTL").arg("t").query::<i64>(&mut con).unwrap() > 0, "INCR keeps the expiry");
    // Eight clients through all three nodes, 200 increments each.
    let threads: Vec<_> = (0..8)
        .map(|i| {
            let mut con = c.conn(i % 3);
            std::thread::spawn(move || {
                for _ in 0..200 {
                    cmd("INCR").arg("shared").query::<i64>(&mut con).unwrap();
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    assert_eq!(cmd("GET").arg("shared").query::<String>(&mut c.conn(2)).unwrap(), "1600");
}

/// A key past 64 KiB: its version's timestamp (packed after the key) was
/// once read at its place modulo 2^16, inside the key, and the session's
/// next writes carried that garbage: a snapshot read (MGET) on another
/// connection then missed them, or timed out.
#[test]
fn a_key_longer_than_64_kib_keeps_its_version() {
    let c = Cluster::three();
    let mut con = c.conn(0);
    let long = vec![b'k'; 70_000];
    cmd("SET").arg(&long).arg("v").query::<()>(&mut con).unwrap();
    assert_eq!(cmd("GET").arg(&long).query::<String>(&mut con).unwrap(), "v");
    cmd("SET").arg("after").arg("1").query::<()>(&mut con).unwrap();
    let mut other = c.conn(1);
    assert_eq!(cmd("MGET").arg("after").query::<Vec<Option<String>>>(&mut other).unwrap(), [Some("1".to_string())]);
}

#[test]
fn hello_switches_to_resp3_and_back() {
    let c = Cluster::three();
    let mut raw = c.raw(0);
    raw.send_cmd(&[b"SET", b"k", b"v"]);
    assert_eq!(raw.read_frame(), simple("OK"));
    // RESP2 nil is $-1.
    raw.send_cmd(&[b"GET", b"missing"]);
    assert_eq!(raw.read_exact_raw(5), b"$-1\r\n");
    // HELLO 3: a map reply, then RESP3 encodings.
    match raw.cmd(&[b"HELLO", b"3", b"SETNAME", b"tester"]) {
        Frame::Map(fields) => {
            let get = |name: &str| fields.iter().find(|(k, _)| *k == bulk(name.as_bytes())).map(|(_, v)| v.clone());
            assert_eq!(get("proto"), Some(Frame::Integer(3)));
            assert_eq!(get("server"), Some(bulk(b"causeway")));
            // Not a Redis Cluster (whose clients would ask for slots).
            assert_eq!(get("mode"), Some(bulk(b"standalone")));
            assert!(matches!(get("id"), Some(Frame::Integer(_))));
        }
        other => panic!("HELLO 3 answered {other:?}"),
    }
    raw.send_cmd(&[b"GET", b"missing"]);
    assert_eq!(raw.read_exact_raw(3), b"_\r\n");
    assert_eq!(raw.cmd(&[b"GET", b"k"]), bulk(b"v"));
    assert_eq!(raw.cmd(&[b"CLIENT", b"GETNAME"]), bulk(b"tester"));
    // MGET with a nil inside, in RESP3.
    raw.send_cmd(&[b"MGET", b"k", b"missing"]);
    assert_eq!(raw.read_exact_raw(14), b"*2\r\n$1\r\nv\r\n_\r\n");
    // HELLO with no version keeps the protocol; HELLO 2 goes back.
    assert!(matches!(raw.cmd(&[b"HELLO"]), Frame::Map(_)));
    match raw.cmd(&[b"HELLO", b"2"]) {
        Frame::Array(flat) => {
            let i = flat.iter().position(|f| *f == bulk(b"proto")).expect("proto field");
            assert_eq!(flat[i + 1], Frame::Integer(2));
        }
        other => panic!("HELLO 2 answered {other:?}"),
    }
    raw.send_cmd(&[b"GET", b"missing"]);
    assert_eq!(raw.read_exact_raw(5), b"$-1\r\n");
    assert_eq!(raw.cmd(&[b"HELLO", b"4"]), error("NOPROTO unsupported protocol version"));
    assert_eq!(raw.cmd(&[b"HELLO", b"x"]), error("ERR Protocol version is not an integer or out of range"));
    assert_eq!(raw.cmd(&[b"HELLO", b"3", b"BOGUS"]), error("ERR syntax error"));

    // The redis crate's own RESP3 mode works end to end.
    let client = redis::Client::open(format!("redis://127.0.0.1:{}/?protocol=resp3", c.port(1))).unwrap();
    let mut con = client.get_connection_with_timeout(common::IO_TIMEOUT).unwrap();
    cmd("SET").arg("r3").arg("x").query::<()>(&mut con).unwrap();
    assert_eq!(cmd("GET").arg("r3").query::<Option<String>>(&mut con).unwrap().as_deref(), Some("x"));
    assert_eq!(cmd("GET").arg("nothing").query::<Value>(&mut con).unwrap(), Value::Nil);
}

#[test]
fn client_subcommands() {
    let c = Cluster::three();
    let mut con = c.conn(0);
    assert_eq!(cmd("CLIENT").arg("GETNAME").query::<Option<String>>(&mut con).unwrap(), None);
    assert_eq!(cmd("CLIENT").arg("SETNAME").arg("worker-1").query::<String>(&mut con).unwrap(), "OK");
    assert_eq!(cmd("CLIENT").arg("GETNAME").query::<Option<String>>(&mut con).unwrap().as_deref(), Some("worker-1"));
    assert_eq!(
        expect_err(&mut con, cmd("CLIENT").arg("SETNAME").arg("bad name")),
        "ERR Client names cannot contain spaces, newlines or special characters."
    );
    assert_eq!(cmd("CLIENT").arg("GETNAME").query::<Option<String>>(&mut con).unwrap().as_deref(), Some("worker-1"));
    assert_eq!(cmd("CLIENT").arg("SETNAME").arg("").query::<String>(&mut con).unwrap(), "OK");
    assert_eq!(cmd("CLIENT").arg("GETNAME").query::<Option<String>>(&mut con).unwrap(), None, "an empty name clears it");
    assert_eq!(cmd("CLIENT").arg("SETINFO").arg("LIB-NAME").arg("x").query::<String>(&mut con).unwrap(), "OK");
    let id1: i64 = cmd("CLIENT").arg("ID").query(&mut con).unwrap();
    let id2: i64 = cmd("CLIENT").arg("ID").query(&mut c.conn(0)).unwrap();
    assert!(id1 > 0 && id2 > 0 && id1 != id2, "{id1} {id2}");
    // The name is per connection.
    assert_eq!(cmd("CLIENT").arg("GETNAME").query::<Option<String>>(&mut c.conn(0)).unwrap(), None);
    assert_eq!(expect_err(&mut con, cmd("CLIENT").arg("BOGUS")), "ERR unknown subcommand 'BOGUS' for 'client'");
    assert_eq!(expect_err(&mut con, &cmd("CLIENT")), "ERR wrong number of arguments for 'client' command");
    // A subcommand's arity is its own, named as Redis 7 names it.
    assert_eq!(expect_err(&mut con, cmd("CLIENT").arg("SETNAME")), "ERR wrong number of arguments for 'client|setname' command");
    assert_eq!(expect_err(&mut con, cmd("client").arg("id").arg("x")), "ERR wrong number of arguments for 'client|id' command");
    // INFO and LIST in Redis's format; KILL closes another connection.
    cmd("CLIENT").arg("SETNAME").arg("lister").query::<()>(&mut con).unwrap();
    let info: String = cmd("CLIENT").arg("INFO").query(&mut con).unwrap();
    assert!(
        info.starts_with(&format!("id={id1} addr=127.0.0.1:")) && info.contains(" name=lister ") && info.contains(" cmd=client|info "),
        "{info}"
    );
    let mut victim = c.conn(0);
    let victim_id: i64 = cmd("CLIENT").arg("ID").query(&mut victim).unwrap();
    cmd("GET").arg("x").query::<Option<String>>(&mut victim).unwrap();
    let list: String = cmd("CLIENT").arg("LIST").query(&mut con).unwrap();
    let line = list.lines().find(|l| l.starts_with(&format!("id={victim_id} "))).unwrap_or_else(|| panic!("{list}"));
    assert!(line.contains(" cmd=get ") && line.contains(" multi=-1 "), "{line}");
    let only: String = cmd("CLIENT").arg("LIST").arg("ID").arg(victim_id).query(&mut con).unwrap();
    assert_eq!(only.lines().count(), 1, "{only}");
    assert_eq!(cmd("CLIENT").arg("KILL").arg("ID").arg(victim_id).query::<i64>(&mut con).unwrap(), 1);
    assert!(cmd("GET").arg("x").query::<Option<String>>(&mut victim).is_err(), "the killed connection is closed");
    assert_eq!(expect_err(&mut con, cmd("CLIENT").arg("KILL").arg("1.2.3.4:5")), "ERR No such client");
    assert_eq!(cmd("CLIENT").arg("KILL").arg("ID").arg(id1).query::<i64>(&mut con).unwrap(), 0, "SKIPME yes by default");
    assert_eq!(cmd("CLIENT").arg("KILL").arg("TYPE").arg("pubsub").query::<i64>(&mut con).unwrap(), 0);
    let _other = c.conn(0);
    assert!(cmd("CLIENT").arg("KILL").arg("TYPE").arg("normal").arg("USER").arg("default").query::<i64>(&mut con).unwrap() >= 1);
}

#[test]
fn quit_answers_ok_and_closes() {
    let c = Cluster::three();
    let mut raw = c.raw(1);
    raw.send(b"*1\r\n$4\r\nPING\r\n*1\r\n$4\r\nQUIT\r\n*1\r\n$4\r\nPING\r\n");
    assert_eq!(raw.read_to_close(), b"+PONG\r\n+OK\r\n");
    // The node keeps serving.
    assert_eq!(c.raw(1).cmd(&[b"PING"]), simple("PONG"));
}

#[test]
fn requirepass_gates_commands_until_auth() {
    let c = Cluster::start_with(Opts::new(3, 3, 2).flag("--requirepass", "s3cret"));
    let mut raw = c.raw(0);
    assert_eq!(raw.cmd(&[b"GET", b"k"]), error("NOAUTH Authentication required."));
    assert_eq!(raw.cmd(&[b"PING"]), error("NOAUTH Authentication required."));
    assert_eq!(raw.cmd(&[b"SET", b"k", b"v"]), error("NOAUTH Authentication required."));
    // Unknown commands are still unknown.
    assert!(matches!(raw.cmd(&[b"NOPE"]), Frame::Error(e) if e.starts_with("ERR unknown command")));
    match raw.cmd(&[b"AUTH", b"wrong"]) {
        Frame::Error(e) => assert!(e.starts_with("WRONGPASS"), "{e}"),
        other => panic!("{other:?}"),
    }
    match raw.cmd(&[b"AUTH", b"someone", b"s3cret"]) {
        Frame::Error(e) => assert!(e.starts_with("WRONGPASS"), "{e}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(raw.cmd(&[b"GET", b"k"]), error("NOAUTH Authentication required."));
    // HELLO without AUTH is refused and does not switch protocols.
    match raw.cmd(&[b"HELLO", b"3"]) {
        Frame::Error(e) => assert!(e.starts_with("NOAUTH"), "{e}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(raw.cmd(&[b"AUTH", b"s3cret"]), simple("OK"));
    assert_eq!(raw.cmd(&[b"SET", b"k", b"v"]), simple("OK"));
    raw.send_cmd(&[b"GET", b"missing"]);
    assert_eq!(raw.read_exact_raw(5), b"$-1\r\n", "still RESP2 after the refused HELLO");

    // AUTH default <pass>, and HELLO 3 AUTH in one go.
    let mut raw2 = c.raw(1);
    assert_eq!(raw2.cmd(&[b"AUTH", b"default", b"s3cret"]), simple("OK"));
    assert_eq!(raw2.cmd(&[b"PING"]), simple("PONG"));
    let mut raw3 = c.raw(2);
    assert!(matches!(raw3.cmd(&[b"HELLO", b"3", b"AUTH", b"default", b"s3cret"]), Frame::Map(_)));
    raw3.send_cmd(&[b"GET", b"missing"]);
    assert_eq!(raw3.read_exact_raw(3), b"_\r\n");
    let mut raw4 = c.raw(2);
    match raw4.cmd(&[b"HELLO", b"3", b"AUTH", b"default", b"nope"]) {
        Frame::Error(e) => assert!(e.starts_with("WRONGPASS"), "{e}"),
        other => panic!("{other:?}"),
    }
    // QUIT works before AUTH.
    let mut raw5 = c.raw(1);
    raw5.send_cmd(&[b"QUIT"]);
    assert_eq!(raw5.read_to_close(), b"+OK\r\n");

    // Clients configured with the password just work.
    for url in [format!("redis://:s3cret@127.0.0.1:{}/", c.port(1)), format!("redis://default:s3cret@127.0.0.1:{}/", c.port(2))] {
        let mut con = redis::Client::open(url.as_str()).unwrap().get_connection_with_timeout(common::IO_TIMEOUT).unwrap();
        cmd("SET").arg("via-url").arg(&url).query::<()>(&mut con).unwrap();
        assert_eq!(cmd("GET").arg("via-url").query::<String>(&mut con).unwrap(), url);
    }
    // A client with the wrong password fails to connect.
    let bad = redis::Client::open(format!("redis://:nope@127.0.0.1:{}/", c.port(0))).unwrap();
    assert!(bad.get_connection_with_timeout(common::IO_TIMEOUT).is_err());
}

#[test]
fn auth_without_requirepass() {
    let c = Cluster::three();
    let mut con = c.conn(0);
    // Like Redis: AUTH <password> with no password configured is an error.
    assert!(expect_err(&mut con, cmd("AUTH").arg("x")).starts_with("ERR AUTH <password> called without any password configured"));
    assert_eq!(cmd("PING").query::<String>(&mut con).unwrap(), "PONG");
}

/// In Redis, with no `requirepass` the default user is `nopass`, so the
/// two-argument form `AUTH default <anything>` (and `HELLO 3 AUTH default
/// <anything>`) succeeds; clients that are configured with a username and
/// password (e.g. `redis://default:pw@host`) rely on this.
#[test]
fn auth_with_username_succeeds_without_requirepass_like_redis() {
    let c = Cluster::three();
    let mut raw = c.raw(0);
    assert_eq!(raw.cmd(&[b"AUTH", b"default", b"anything"]), simple("OK"));
    assert!(matches!(raw.cmd(&[b"HELLO", b"3", b"AUTH", b"default", b"anything"]), Frame::Map(_)));
    let mut con = redis::Client::open(format!("redis://default:anything@127.0.0.1:{}/", c.port(1)))
        .unwrap()
        .get_connection_with_timeout(common::IO_TIMEOUT)
        .unwrap();
    assert_eq!(cmd("PING").query::<String>(&mut con).unwrap(), "PONG");
}

#[test]
fn info_status_and_command_table() {
    let c = Cluster::three();
    let mut con = c.conn(1);
    let info: String = cmd("INFO").query(&mut con).unwrap();
    for field in [
        "# Server",
        "redis_version:",
        "node_id:1",
        &format!("tcp_port:{}", c.port(1)),
        "# Replication",
        "replicas:3",
        "k:2",
        "partitions:64",
    ] {
        assert!(info.contains(field), "INFO lacks {field:?}:\n{info}");
    }
    assert!(info.contains("consistency:causal"), "{info}");
    // The sections and fields Redis tools read.
    let _: () = redis::Commands::set(&mut con, "info:k", "v").unwrap();
    let _: () = cmd("SET").arg("info:t").arg("v").arg("EX").arg(100).query(&mut con).unwrap();
    let _: Option<String> = redis::Commands::get(&mut con, "info:k").unwrap();
    let _: Option<String> = redis::Commands::get(&mut con, "info:absent").unwrap();
    let info: String = cmd("INFO").query(&mut con).unwrap();
    for field in [
        "# Clients\r\nconnected_clients:",
        "# Memory\r\nused_memory:",
        "used_memory_rss:",
        "maxmemory:0",
        "# Cpu\r\nused_cpu_sys:",
        "used_cpu_user:",
        "total_commands_processed:",
        "instantaneous_ops_per_sec:",
        "keyspace_hits:1\r\n",
        "keyspace_misses:1\r\n",
        "# Persistence\r\naof_enabled:0",
        &format!("process_id:{}", c.pid(1)),
        "uptime_in_seconds:",
        "# Keyspace\r\ndb0:keys=2,expires=1,",
    ] {
        assert!(info.contains(field), "INFO lacks {field:?}:\n{info}");
    }
    // INFO <section> and INFO <s1> <s2> select, like Redis.
    let server: String = cmd("INFO").arg("server").query(&mut con).unwrap();
    assert!(server.starts_with("# Server\r\n") && !server.contains("# Clients"), "{server}");
    let two: String = cmd("INFO").arg("CPU").arg("keyspace").query(&mut con).unwrap();
    assert!(two.contains("# Cpu") && two.contains("# Keyspace") && !two.contains("# Server"), "{two}");
    // What the node sent its peers: the writes went down their chains.
    let replication: String = cmd("INFO").arg("replication").query(&mut c.conn(1)).unwrap();
    let field = |name: &str| -> &str {
        replication.lines().find_map(|l| l.strip_prefix(&format!("{name}:"))).unwrap_or_else(|| panic!("no {name} in {replication}")).trim()
    };
    let (messages, bytes): (u64, u64) = (field("peer_messages_sent").parse().unwrap(), field("peer_bytes_sent").parse().unwrap());
    assert!(messages > 0 && bytes > messages, "{messages} messages, {bytes} bytes");
    // By kind (counted where the total is: they add up to it).
    let kinds: Vec<(&str, u64)> =
        field("peer_messages_by_kind").split(',').map(|kv| kv.split_once('=').map(|(k, n)| (k, n.parse().unwrap())).unwrap()).collect();
    // The SETs went to their heads (`Put`) or, where this node is the
    // head, down their chains (`Forward`).
    assert!(kinds.iter().any(|&(k, _)| k == "Put" || k == "Forward"), "{kinds:?}");
    assert!(kinds.iter().map(|&(_, n)| n).sum::<u64>() >= messages, "{kinds:?} against {messages}");
    // Writes that waited at a head here for what they depend on: a count,
    // and none waiting once every reply is in.
    let _: u64 = field("parked_writes_total").parse().unwrap();
    assert_eq!(field("parked_writes"), "0");

    // CW.STATUS on every node; roles add up to the partition count.
    let (mut heads, mut middles, mut tails) = (0, 0, 0);
    for i in 0..3 {
        let status: String = cmd("CW.STATUS").query(&mut c.conn(i)).unwrap();
        let field = |name: &str| -> u64 {
            status
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{name}:")))
                .unwrap_or_else(|| panic!("no {name} in {status}"))
                .trim()
                .parse()
                .unwrap()
        };
        assert_eq!(field("node"), i as u64);
        assert_eq!(field("nodes"), 3);
        assert_eq!(field("partitions"), 64);
        assert_eq!(field("replicas"), 3);
        assert_eq!(field("k"), 2);
        heads += field("head_of");
        middles += field("middle_of");
        tails += field("tail_of");
    }
    assert_eq!((heads, middles, tails), (64, 64, 64));

    let count: i64 = cmd("COMMAND").arg("COUNT").query(&mut con).unwrap();
    let Value::Array(table) = cmd("COMMAND").query::<Value>(&mut con).unwrap() else { panic!("COMMAND is not an array") };
    assert_eq!(table.len() as i64, count);
    let names: Vec<String> = table
        .iter()
        .map(|e| match e {
            Value::Array(f) => redis::from_redis_value::<String>(&f[0]).unwrap().to_lowercase(),
            other => panic!("{other:?}"),
        })
        .collect();
    for name in ["get", "set", "del", "exists", "mget", "dbsize", "ping", "hello", "auth", "cw.keyrange", "cw.session"] {
        assert!(names.iter().any(|n| n == name), "COMMAND lacks {name}: {names:?}");
    }
    let _: Value = cmd("COMMAND").arg("DOCS").query(&mut con).unwrap();
    let Value::Array(info) = cmd("COMMAND").arg("INFO").arg("get").arg("nosuch").query::<Value>(&mut con).unwrap() else { panic!() };
    assert_eq!(info.len(), 2);
    assert_eq!(info[1], Value::Nil);
    // Flags and key positions as Redis gives them: clients route by these.
    let Value::Array(specs) = cmd("COMMAND").arg("INFO").arg("get").arg("set").arg("mset").arg("ping").query::<Value>(&mut con).unwrap()
    else {
        panic!()
    };
    let spec = |v: &Value| -> (Vec<String>, i64, i64, i64) {
        let Value::Array(f) = v else { panic!("{v:?}") };
        let flags = redis::from_redis_value::<Vec<String>>(&f[2]).unwrap();
        let n = |i: usize| redis::from_redis_value::<i64>(&f[i]).unwrap();
        (flags, n(3), n(4), n(5))
    };
    assert_eq!(spec(&specs[0]), (vec!["readonly".to_string(), "fast".to_string()], 1, 1, 1));
    assert_eq!(spec(&specs[1]), (vec!["write".to_string(), "denyoom".to_string()], 1, 1, 1));
    assert_eq!((spec(&specs[2]).1, spec(&specs[2]).2, spec(&specs[2]).3), (1, -1, 2));
    assert_eq!((spec(&specs[3]).1, spec(&specs[3]).2), (0, 0), "PING's argument is no key");
    assert!(expect_err(&mut con, cmd("COMMAND").arg("BOGUS")).starts_with("ERR"));
}

#[test]
fn keyrange_lists_every_partition_head_first() {
    let c = Cluster::three();
    let mut con = c.conn(0);
    let Value::Array(parts) = cmd("CW.KEYRANGE").query::<Value>(&mut con).unwrap() else { panic!("not an array") };
    assert_eq!(parts.len(), 64);
    for (p, entry) in parts.iter().enumerate() {
        let Value::Array(entry) = entry else { panic!("{entry:?}") };
        assert_eq!(entry[0], Value::Int(p as i64));
        let Value::Array(members) = &entry[1] else { panic!("{entry:?}") };
        assert_eq!(members.len(), 3, "partition {p}");
        let mut ids = Vec::new();
        for (i, m) in members.iter().enumerate() {
            let Value::Array(f) = m else { panic!("{m:?}") };
            let Value::Int(id) = f[0] else { panic!("{f:?}") };
            let addr: String = redis::from_redis_value(&f[1]).unwrap();
            let role: String = redis::from_redis_value(&f[2]).unwrap();
            assert_eq!(addr, c.addr(id as usize));
            assert_eq!(role, ["head", "middle", "tail"][i]);
            ids.push(id);
        }
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), 3, "chain of partition {p} repeats a node");
    }
    // Every node answers the same map.
    assert_eq!(c.chains(1), c.chains(0));
    assert_eq!(c.chains(2), c.chains(0));
    // Every node heads some partitions.
    let chains = c.chains(0);
    for n in 0..3 {
        assert!(chains.iter().any(|ch| ch[0] == n), "node {n} heads nothing");
    }
}

#[test]
fn partitions_flag_shapes_the_keyrange() {
    let c = Cluster::start_with(Opts::new(3, 2, 1).flag("--partitions", 8));
    let chains = c.chains(2);
    assert_eq!(chains.len(), 8);
    assert!(chains.iter().all(|ch| ch.len() == 2 && ch[0] != ch[1]), "{chains:?}");
    // And it serves data in that shape (R=2, k=1).
    let mut con = c.conn(0);
    for i in 0..20 {
        cmd("SET").arg(format!("k{i}")).arg(i).query::<()>(&mut con).unwrap();
        assert_eq!(cmd("GET").arg(format!("k{i}")).query::<i64>(&mut con).unwrap(), i);
    }
}

#[test]
fn consistency_levels_are_per_connection() {
    let c = Cluster::three();
    let mut a = c.conn(0);
    let mut b = c.conn(0);
    assert_eq!(cmd("CW.CONSISTENCY").query::<String>(&mut a).unwrap(), "causal");
    for level in ["eventual", "LINEARIZABLE", "causal", "linearizable"] {
        assert_eq!(cmd("CW.CONSISTENCY").arg(level).query::<String>(&mut a).unwrap(), "OK");
        assert_eq!(cmd("CW.CONSISTENCY").query::<String>(&mut a).unwrap(), level.to_lowercase());
    }
    assert_eq!(cmd("CW.CONSISTENCY").query::<String>(&mut b).unwrap(), "causal", "another connection keeps its own level");
    assert!(expect_err(&mut a, cmd("CW.CONSISTENCY").arg("strong")).starts_with("ERR "));
    assert!(expect_err(&mut a, cmd("CW.CONSISTENCY").arg("causal").arg("extra")).starts_with("ERR "));
    assert_eq!(cmd("CW.CONSISTENCY").query::<String>(&mut a).unwrap(), "linearizable", "a refused change changes nothing");
    let info: String = cmd("INFO").query(&mut a).unwrap();
    assert!(info.contains("consistency:linearizable"), "{info}");

    // Every level reads and writes.
    for (i, level) in ["causal", "eventual", "linearizable"].into_iter().enumerate() {
        let mut con = c.conn(i);
        cmd("CW.CONSISTENCY").arg(level).query::<()>(&mut con).unwrap();
        let key = format!("level-{level}");
        cmd("SET").arg(&key).arg(level).query::<()>(&mut con).unwrap();
        if level != "eventual" {
            // Eventual reads may be served by a replica the write has not
            // reached; the others read their writes.
            assert_eq!(cmd("GET").arg(&key).query::<String>(&mut con).unwrap(), level);
        }
        eventually(Duration::from_secs(10), "the value to show up", || {
            (cmd("GET").arg(&key).query::<Option<String>>(&mut con).unwrap().as_deref() == Some(level)).then_some(())
        });
        assert_eq!(cmd("DEL").arg(&key).query::<i64>(&mut con).unwrap(), 1);
    }
}

#[test]
fn cw_with_runs_one_command_at_a_level() {
    let c = Cluster::three();
    let mut a = c.conn(0);
    // A write the tail has answered is on every replica: eventual readers
    // anywhere, picking replicas at random, all see it at once.
    for i in 0..20 {
        let key = format!("with-{i}");
        assert_eq!(cmd("CW.WITH").arg("linearizable").arg("SET").arg(&key).arg("v").query::<String>(&mut a).unwrap(), "OK");
        for n in 0..3 {
            let mut reader = c.conn(n);
            cmd("CW.CONSISTENCY").arg("eventual").query::<()>(&mut reader).unwrap();
            assert_eq!(cmd("GET").arg(&key).query::<Option<String>>(&mut reader).unwrap().as_deref(), Some("v"), "{key} at node {n}");
        }
    }
    assert_eq!(cmd("CW.CONSISTENCY").query::<String>(&mut a).unwrap(), "causal", "the connection's level is unchanged");
    assert_eq!(cmd("CW.WITH").arg("eventual").arg("get").arg("with-0").query::<String>(&mut a).unwrap(), "v");
    assert_eq!(
        cmd("CW.WITH").arg("linearizable").arg("MGET").arg("with-0").arg("with-1").query::<Vec<String>>(&mut a).unwrap(),
        ["v", "v"]
    );
    assert_eq!(cmd("CW.WITH").arg("linearizable").arg("EXISTS").arg("with-0").arg("nope").query::<i64>(&mut a).unwrap(), 1);
    assert_eq!(cmd("CW.WITH").arg("causal").arg("DEL").arg("with-0").query::<i64>(&mut a).unwrap(), 1);
    assert!(expect_err(&mut a, cmd("CW.WITH").arg("strong").arg("GET").arg("k")).starts_with("ERR unknown consistency"));
    assert!(expect_err(&mut a, cmd("CW.WITH").arg("causal").arg("PING")).starts_with("ERR CW.WITH runs"));
    assert!(
        expect_err(&mut a, cmd("CW.WITH").arg("causal").arg("CW.WITH").arg("eventual").arg("GET").arg("k")).starts_with("ERR CW.WITH runs")
    );
    assert!(expect_err(&mut a, cmd("CW.WITH").arg("causal")).starts_with("ERR wrong number of arguments"));
    assert!(expect_err(&mut a, cmd("CW.WITH").arg("causal").arg("GET")).starts_with("ERR wrong number of arguments for 'get'"));
    assert_eq!(cmd("PING").query::<String>(&mut a).unwrap(), "PONG", "the connection still works");
}

#[test]
fn flushall_clears_every_node() {
    let c = Cluster::three();
    let mut con = c.conn(0);
    for i in 0..30 {
        cmd("SET").arg(format!("f{i}")).arg(i).query::<()>(&mut con).unwrap();
    }
    eventually(Duration::from_secs(10), "30 keys", || (cmd("DBSIZE").query::<i64>(&mut con).unwrap() == 30).then_some(()));
    let mut other = c.conn(1);
    assert_eq!(cmd("FLUSHALL").query::<String>(&mut other).unwrap(), "OK");
    assert_eq!(cmd("DBSIZE").query::<i64>(&mut other).unwrap(), 0);
    for i in 0..3 {
        let mut con = c.conn(i);
        for k in 0..30 {
            assert_eq!(cmd("GET").arg(format!("f{k}")).query::<Option<String>>(&mut con).unwrap(), None, "node {i} key f{k}");
        }
    }
    // The writer's own session does not resurrect what it saw.
    assert_eq!(cmd("GET").arg("f0").query::<Option<String>>(&mut con).unwrap(), None);
    cmd("SET").arg("after").arg("1").query::<()>(&mut con).unwrap();
    assert_eq!(cmd("GET").arg("after").query::<String>(&mut con).unwrap(), "1");
    assert_eq!(cmd("FLUSHDB").query::<String>(&mut con).unwrap(), "OK");
    assert_eq!(cmd("FLUSHALL").arg("ASYNC").query::<String>(&mut con).unwrap(), "OK");
    assert_eq!(expect_err(&mut con, cmd("FLUSHALL").arg("LATER")), "ERR syntax error");
    assert_eq!(cmd("GET").arg("after").query::<Option<String>>(&mut con).unwrap(), None);
}

#[test]
fn single_node_site() {
    let c = Cluster::start(1, 1, 1);
    let mut con = c.conn(0);
    for i in 0..50 {
        cmd("SET").arg(format!("s{i}")).arg(format!("v{i}")).query::<()>(&mut con).unwrap();
    }
    // With one replica every write is stable at once: DBSIZE is exact.
    assert_eq!(cmd("DBSIZE").query::<i64>(&mut con).unwrap(), 50);
    assert_eq!(cmd("GET").arg("s7").query::<String>(&mut con).unwrap(), "v7");
    assert_eq!(
        cmd("MGET").arg("s1").arg("nope").arg("s2").query::<Vec<Option<String>>>(&mut con).unwrap(),
        vec![Some("v1".into()), None, Some("v2".into())]
    );
    assert_eq!(cmd("DEL").arg("s1").arg("s2").query::<i64>(&mut con).unwrap(), 2);
    assert_eq!(cmd("DBSIZE").query::<i64>(&mut con).unwrap(), 48);
    for level in ["linearizable", "eventual", "causal"] {
        cmd("CW.CONSISTENCY").arg(level).query::<()>(&mut con).unwrap();
        cmd("SET").arg("lvl").arg(level).query::<()>(&mut con).unwrap();
        assert_eq!(cmd("GET").arg("lvl").query::<String>(&mut con).unwrap(), level);
    }
    let chains = c.chains(0);
    assert_eq!(chains.len(), 64);
    assert!(chains.iter().all(|ch| ch == &vec![0]));
    // A fresh connection sees everything at once.
    let mut fresh = c.conn(0);
    assert_eq!(cmd("GET").arg("s49").query::<String>(&mut fresh).unwrap(), "v49");
    let status: String = cmd("CW.STATUS").query(&mut fresh).unwrap();
    assert!(status.contains("nodes:1") && status.contains("replicas:1") && status.contains("k:1"), "{status}");
}

#[test]
fn error_lines_are_redis_like_through_the_redis_crate() {
    // err_line must reconstruct what the server sent; sanity-check it on
    // codes the redis crate maps and on ones it does not.
    let c = Cluster::start_with(Opts::new(1, 1, 1).flag("--requirepass", "pw"));
    let mut raw = c.raw(0);
    assert_eq!(raw.cmd(&[b"AUTH", b"pw"]), simple("OK"));
    let mut con = redis::Client::open(format!("redis://:pw@127.0.0.1:{}/", c.port(0))).unwrap().get_connection().unwrap();
    let e = cmd("SET").arg("k").arg("v").arg("BAD").query::<Value>(&mut con).unwrap_err();
    assert_eq!(err_line(&e), "ERR syntax error");
    let e = cmd("HELLO").arg("9").query::<Value>(&mut con).unwrap_err();
    assert_eq!(err_line(&e), "NOPROTO unsupported protocol version");
}

/// Redis accepts a repeated flag (`SET k v NX NX`, `XX XX`); only
/// conflicting flags are a syntax error.
#[test]
fn set_accepts_repeated_flags_like_redis() {
    let c = Cluster::start(1, 1, 1);
    let mut con = c.conn(0);
    assert_eq!(cmd("SET").arg("k").arg("1").arg("NX").arg("NX").query::<Option<String>>(&mut con).unwrap().as_deref(), Some("OK"));
    assert_eq!(cmd("SET").arg("k").arg("2").arg("XX").arg("XX").query::<Option<String>>(&mut con).unwrap().as_deref(), Some("OK"));
}

/// Redis refuses an expire time that overflows when added to the current
/// time ("invalid expire time in 'set' command"); Causeway used to accept
/// it (the expiry saturated to "never").
#[test]
fn set_rejects_overflowing_expire_like_redis() {
    let c = Cluster::start(1, 1, 1);
    let mut con = c.conn(0);
    assert_eq!(expect_err(&mut con, cmd("SET").arg("k").arg("v").arg("PX").arg(i64::MAX)), "ERR invalid expire time in 'set' command");
    assert_eq!(
        expect_err(&mut con, cmd("SET").arg("k").arg("v").arg("EX").arg(i64::MAX / 1000)),
        "ERR invalid expire time in 'set' command"
    );
    assert_eq!(cmd("EXISTS").arg("k").query::<i64>(&mut con).unwrap(), 0);
}

#[test]
fn node_runs_from_a_toml_config() {
    let node = common::spawn_with_config(|port| {
        format!(
            "id = 0\nlisten = \"127.0.0.1:{port}\"\nreplicas = 1\nk = 1\npartitions = 16\nrequirepass = \"tomlpw\"\n\
             nodes = [{{ id = 0, addr = \"127.0.0.1:{port}\" }}]\n"
        )
    });
    let mut raw = common::Raw::connect(&node.addr());
    assert_eq!(raw.cmd(&[b"GET", b"k"]), error("NOAUTH Authentication required."));
    assert_eq!(raw.cmd(&[b"AUTH", b"tomlpw"]), simple("OK"));
    assert_eq!(raw.cmd(&[b"SET", b"k", b"from toml"]), simple("OK"));
    assert_eq!(raw.cmd(&[b"GET", b"k"]), bulk(b"from toml"));
    match raw.cmd(&[b"CW.KEYRANGE"]) {
        Frame::Array(parts) => assert_eq!(parts.len(), 16),
        other => panic!("{other:?}"),
    }
}

#[test]
fn bad_node_configurations_are_refused_at_start() {
    let port = common::free_ports(1)[0];
    let listen = format!("127.0.0.1:{port}");
    let nodes = format!("0={listen}");
    for (args, why) in [
        (vec!["--replicas", "2", "--k", "1"], "replicas"),
        (vec!["--replicas", "1", "--k", "2"], "k must be"),
        (vec!["--replicas", "1", "--k", "1", "--partitions", "0"], "partitions"),
        (vec!["--replicas", "1", "--k", "1", "--id", "5"], "not in the node list"),
    ] {
        let mut all = vec!["node", "--listen", &listen, "--nodes", &nodes];
        all.extend(args.iter().copied());
        let (ok, _out, err) = common::run_causeway(&all);
        assert!(!ok, "{args:?} was accepted");
        assert!(err.contains(why), "{args:?}: stderr {err:?}");
    }
    let (ok, _, err) = common::run_causeway(&["node", "--config", "/nonexistent/causeway.toml"]);
    assert!(!ok && err.contains("cannot read"), "{err}");
}
