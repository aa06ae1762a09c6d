//! Key expiry against real `causeway node` processes, ported from Redis's
//! own tests of it (tests/unit/expire.tcl, Redis 7.0) where they need only
//! commands Causeway has. Each test names the Redis test it mirrors.
//!
//! A key's expiry is decided by its chain's head and replicated as part of
//! the write, so the tests that exercise those decisions run twice: on a
//! single node, and on a three-node site (R=3) through node 1, where most
//! keys' heads are another node. Where Redis sleeps for a key to expire,
//! these tests sleep as long.
//!
//! Left out, by their Redis names, and why:
//! - "EXPIRE - write on expire should work": LPUSH and LRANGE (lists).
//! - "Redis should lazy expire keys" and "EXPIRE should not resurrect keys
//!   (issue #1026)": DEBUG SET-ACTIVE-EXPIRE, to turn active expiry off so
//!   that only a read or a write can find the key expired.
//! - "5 keys in, 5 keys out": KEYS.
//! - "All time-to-live(TTL) in commands are propagated as absolute
//!   timestamp in milliseconds in AOF", "SET - use KEEPTTL option, TTL
//!   should not be removed after loadaof" and "GETEX use of PERSIST option
//!   should remove TTL after loadaof": the AOF file's contents, DEBUG
//!   LOADAOF, CONFIG SET appendonly, DUMP and RESTORE. What they protect,
//!   that a reload keeps absolute expiry times, is checked against
//!   Causeway's write-ahead log by `a_restart_keeps_absolute_expiry_times`.
//! - "All TTL in commands are propagated as absolute timestamp in
//!   replication stream" and "GETEX propagate as to replica as PERSIST,
//!   DEL, or nothing": the replication stream (attach_to_replication_stream),
//!   DUMP and RESTORE.
//! - "First server should have role slave after REPLICAOF" and "For all
//!   replicated TTL-related commands, absolute expire times are identical
//!   on primary and replica": REPLICAOF, WAIT, KEYS, DUMP and RESTORE. The
//!   property itself, among a chain's replicas, is checked by
//!   `every_replica_holds_the_same_absolute_expiry`.
//! - "expired key which is created in writeable replicas should be deleted
//!   by active expiry": writable replicas and CONFIG SET.
//! - "SCAN: Lazy-expire should not be wrapped in MULTI/EXEC" and
//!   "RANDOMKEY: Lazy-expire should not be wrapped in MULTI/EXEC": SCAN,
//!   RANDOMKEY, DEBUG SET-ACTIVE-EXPIRE and the replication stream.

mod common;

use common::{expect_err, poll, Cluster, Opts};
use redis::{cmd, Cmd, Connection};
use std::thread::sleep;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// One node serving the whole key space.
fn single() -> Cluster {
    Cluster::start(1, 1, 1)
}

/// Runs `test` on a single node.
fn on_one_node(test: fn(&mut Connection)) {
    let c = single();
    test(&mut c.conn(0));
}

/// Runs `test` on a three-node site (R=3) through node 1: the heads that
/// decide most keys' expiry are elsewhere.
fn on_three_nodes(test: fn(&mut Connection)) {
    let c = Cluster::three();
    test(&mut c.conn(1));
}

/// A command's words, for failure messages.
fn words(c: &Cmd) -> String {
    let word = |a| match a {
        redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
        redis::Arg::Cursor => "<cursor>".into(),
    };
    c.args_iter().map(word).collect::<Vec<_>>().join(" ")
}

/// A command whose reply is an integer.
fn int(con: &mut Connection, c: &Cmd) -> i64 {
    c.query(con).unwrap_or_else(|e| panic!("{}: {e}", words(c)))
}

/// A command that replies `+OK`.
fn ok(con: &mut Connection, c: &Cmd) {
    assert_eq!(c.query::<String>(con).unwrap_or_else(|e| panic!("{}: {e}", words(c))), "OK", "{}", words(c));
}

fn get(con: &mut Connection, key: &str) -> Option<String> {
    cmd("GET").arg(key).query(con).unwrap()
}

fn exists(con: &mut Connection, key: &str) -> i64 {
    int(con, cmd("EXISTS").arg(key))
}

fn ttl(con: &mut Connection, key: &str) -> i64 {
    int(con, cmd("TTL").arg(key))
}

fn pttl(con: &mut Connection, key: &str) -> i64 {
    int(con, cmd("PTTL").arg(key))
}

fn pexpiretime(con: &mut Connection, key: &str) -> i64 {
    int(con, cmd("PEXPIRETIME").arg(key))
}

/// Redis's `assert_range`.
fn assert_range(value: i64, min: i64, max: i64, what: &str) {
    assert!((min..=max).contains(&value), "{what}: {value} not in [{min}, {max}]");
}

/// The Unix time in seconds and milliseconds (Tcl's `clock seconds`,
/// `clock milliseconds`).
fn clock_seconds() -> i64 {
    clock_milliseconds() / 1000
}

fn clock_milliseconds() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64
}

/// `expired_keys` in INFO stats.
fn expired_keys(con: &mut Connection) -> u64 {
    let text: String = cmd("INFO").arg("stats").query(con).unwrap();
    let value = text.split("\r\n").find_map(|l| l.strip_prefix("expired_keys:")).expect("expired_keys in INFO stats");
    value.parse().unwrap()
}

/// `expired_keys` summed over every node of the site: each head counts
/// the keys it expired.
fn expired_keys_in_site(c: &Cluster) -> u64 {
    (0..c.len()).map(|i| expired_keys(&mut c.conn(i))).sum()
}

/// "EXPIRE - set timeouts multiple times", "EXPIRE - It should be still
/// possible to read 'x'", "EXPIRE - After 2.1 seconds the key should no
/// longer be here".
fn expire_set_read_and_wait(con: &mut Connection) {
    ok(con, cmd("SET").arg("x").arg("foobar"));
    let v1 = int(con, cmd("EXPIRE").arg("x").arg(5));
    let v2 = ttl(con, "x");
    let v3 = int(con, cmd("EXPIRE").arg("x").arg(10));
    let v4 = ttl(con, "x");
    int(con, cmd("EXPIRE").arg("x").arg(2));
    assert_eq!((v1, v3, v4), (1, 1, 10));
    assert_range(v2, 4, 5, "TTL after EXPIRE x 5");

    assert_eq!(get(con, "x").as_deref(), Some("foobar"));

    sleep(Duration::from_millis(2100));
    assert_eq!((get(con, "x"), exists(con, "x")), (None, 0));
}

#[test]
fn expire_set_read_and_wait_on_one_node() {
    on_one_node(expire_set_read_and_wait);
}

#[test]
fn expire_set_read_and_wait_on_three_nodes() {
    on_three_nodes(expire_set_read_and_wait);
}

/// "EXPIREAT - Check for EXPIRE alike behavior", "SETEX - Set + Expire
/// combo operation. Check for TTL", "SETEX - Check value", "SETEX -
/// Overwrite old key", "SETEX - Wait for the key to expire", "SETEX - Wrong
/// time parameter".
#[test]
fn expireat_and_setex() {
    let c = single();
    let mut con = c.conn(0);
    let con = &mut con;
    int(con, cmd("DEL").arg("x"));
    ok(con, cmd("SET").arg("x").arg("foo"));
    int(con, cmd("EXPIREAT").arg("x").arg(clock_seconds() + 15));
    assert_range(ttl(con, "x"), 13, 15, "TTL after EXPIREAT now+15");

    ok(con, cmd("SETEX").arg("x").arg(12).arg("test"));
    assert_range(ttl(con, "x"), 10, 12, "TTL after SETEX 12");
    assert_eq!(get(con, "x").as_deref(), Some("test"));

    ok(con, cmd("SETEX").arg("y").arg(1).arg("foo"));
    assert_eq!(get(con, "y").as_deref(), Some("foo"));
    sleep(Duration::from_millis(1100));
    assert_eq!(get(con, "y"), None);

    assert_eq!(expect_err(con, cmd("SETEX").arg("z").arg(-10).arg("foo")), "ERR invalid expire time in 'setex' command");
}

/// "PERSIST can undo an EXPIRE", "PERSIST returns 0 against non existing or
/// non volatile keys".
fn persist(con: &mut Connection) {
    ok(con, cmd("SET").arg("x").arg("foo"));
    int(con, cmd("EXPIRE").arg("x").arg(50));
    let before = ttl(con, "x");
    assert_eq!(int(con, cmd("PERSIST").arg("x")), 1);
    assert_eq!((before, ttl(con, "x"), get(con, "x").as_deref()), (50, -1, Some("foo")));

    ok(con, cmd("SET").arg("x").arg("foo"));
    assert_eq!((int(con, cmd("PERSIST").arg("foo")), int(con, cmd("PERSIST").arg("nokeyatall"))), (0, 0));
}

#[test]
fn persist_on_one_node() {
    on_one_node(persist);
}

#[test]
fn persist_on_three_nodes() {
    on_three_nodes(persist);
}

/// Redis's loop for a timing-sensitive check: up to `attempts` tries, and
/// the last one's outcome.
fn attempts<T: PartialEq>(tries: usize, expected: T, mut attempt: impl FnMut() -> T) -> T {
    let mut got = attempt();
    for _ in 1..tries {
        if got == expected {
            break;
        }
        got = attempt();
    }
    got
}

/// "EXPIRE precision is now the millisecond", "PSETEX can set sub-second
/// expires", "PEXPIRE can set sub-second expires", "PEXPIREAT can set
/// sub-second expires". Redis retries each a few times in case the server
/// is slow; so do these.
fn sub_second_expiry(con: &mut Connection) {
    let expected = (Some("somevalue".to_string()), None);
    let got = attempts(10, expected.clone(), || {
        int(con, cmd("DEL").arg("x"));
        ok(con, cmd("SETEX").arg("x").arg(1).arg("somevalue"));
        sleep(Duration::from_millis(900));
        let a = get(con, "x");
        sleep(Duration::from_millis(1100));
        (a, get(con, "x"))
    });
    assert_eq!(got, expected, "EXPIRE precision is now the millisecond");

    let got = attempts(50, expected.clone(), || {
        int(con, cmd("DEL").arg("x"));
        ok(con, cmd("PSETEX").arg("x").arg(100).arg("somevalue"));
        let a = get(con, "x");
        sleep(Duration::from_millis(101));
        (a, get(con, "x"))
    });
    assert_eq!(got, expected, "PSETEX can set sub-second expires");

    let got = attempts(50, expected.clone(), || {
        ok(con, cmd("SET").arg("x").arg("somevalue"));
        int(con, cmd("PEXPIRE").arg("x").arg(100));
        let c = get(con, "x");
        sleep(Duration::from_millis(101));
        (c, get(con, "x"))
    });
    assert_eq!(got, expected, "PEXPIRE can set sub-second expires");

    let got = attempts(50, expected.clone(), || {
        ok(con, cmd("SET").arg("x").arg("somevalue"));
        let (secs, micros): (i64, i64) = cmd("TIME").query(con).unwrap();
        int(con, cmd("PEXPIREAT").arg("x").arg(secs * 1000 + micros / 1000 + 200));
        let e = get(con, "x");
        sleep(Duration::from_millis(201));
        (e, get(con, "x"))
    });
    assert_eq!(got, expected, "PEXPIREAT can set sub-second expires");
}

#[test]
fn sub_second_expiry_on_one_node() {
    on_one_node(sub_second_expiry);
}

#[test]
fn sub_second_expiry_on_three_nodes() {
    on_three_nodes(sub_second_expiry);
}

/// "TTL returns time to live in seconds", "PTTL returns time to live in
/// milliseconds", "TTL / PTTL / EXPIRETIME / PEXPIRETIME return -1 if key
/// has no expire", "TTL / PTTL / EXPIRETIME / PEXPIRETIME return -2 if key
/// does not exit", "EXPIRETIME returns absolute expiration time in
/// seconds", "PEXPIRETIME returns absolute expiration time in
/// milliseconds".
fn ttl_family(con: &mut Connection) {
    int(con, cmd("DEL").arg("x"));
    ok(con, cmd("SETEX").arg("x").arg(10).arg("somevalue"));
    let t = ttl(con, "x");
    assert!(t > 8 && t <= 10, "TTL {t}");

    int(con, cmd("DEL").arg("x"));
    ok(con, cmd("SETEX").arg("x").arg(1).arg("somevalue"));
    let t = pttl(con, "x");
    assert!(t > 900 && t <= 1000, "PTTL {t}");

    let all = |con: &mut Connection| -> Vec<i64> {
        ["TTL", "PTTL", "EXPIRETIME", "PEXPIRETIME"].iter().map(|name| int(con, cmd(name).arg("x"))).collect()
    };
    int(con, cmd("DEL").arg("x"));
    ok(con, cmd("SET").arg("x").arg("hello"));
    assert_eq!(all(con), [-1, -1, -1, -1]);
    int(con, cmd("DEL").arg("x"));
    assert_eq!(all(con), [-2, -2, -2, -2]);

    int(con, cmd("DEL").arg("x"));
    let abs_expire = clock_seconds() + 100;
    ok(con, cmd("SET").arg("x").arg("somevalue").arg("EXAT").arg(abs_expire));
    assert_eq!(int(con, cmd("EXPIRETIME").arg("x")), abs_expire);

    int(con, cmd("DEL").arg("x"));
    let abs_expire = clock_milliseconds() + 100_000;
    ok(con, cmd("SET").arg("x").arg("somevalue").arg("PXAT").arg(abs_expire));
    assert_eq!(pexpiretime(con, "x"), abs_expire);
}

#[test]
fn ttl_family_on_one_node() {
    on_one_node(ttl_family);
}

#[test]
fn ttl_family_on_three_nodes() {
    on_three_nodes(ttl_family);
}

/// "Redis should actively expire keys incrementally". Causeway's DBSIZE
/// counts only keys that have not expired, so it would reach 0 without
/// active expiry: the heads' `expired_keys` must count the three as well.
#[test]
fn keys_are_actively_expired() {
    let c = single();
    let mut con = c.conn(0);
    let con = &mut con;
    ok(con, &cmd("FLUSHDB"));
    let before = expired_keys(con);
    for key in ["key1", "key2", "key3"] {
        ok(con, cmd("PSETEX").arg(key).arg(500).arg("a"));
    }
    assert_eq!(int(con, &cmd("DBSIZE")), 3);
    // Redis's wait_for_condition 20 100.
    let expired = poll(Duration::from_millis(2000), || (int(con, &cmd("DBSIZE")) == 0 && expired_keys(con) == before + 3).then_some(()));
    assert!(expired.is_some(), "Keys did not actively expire (expired_keys {} -> {})", before, expired_keys(con));
}

/// "EXPIRE with empty string as TTL should report an error", "SET with EX
/// with big integer should report an error", "SET with EX with smallest
/// integer should report an error", "GETEX with big integer should report
/// an error", "GETEX with smallest integer should report an error", "EXPIRE
/// with big integer overflows when converted to milliseconds", "PEXPIRE
/// with big integer overflow when basetime is added", "EXPIRE with big
/// negative integer", "PEXPIREAT with big integer works", "PEXPIREAT with
/// big negative integer works".
#[test]
fn out_of_range_expiry_times() {
    let c = single();
    let mut con = c.conn(0);
    let con = &mut con;
    ok(con, cmd("SET").arg("foo").arg("bar"));
    let e = expect_err(con, cmd("EXPIRE").arg("foo").arg(""));
    assert!(e.contains("not an integer"), "{e}");

    let invalid_set = "ERR invalid expire time in 'set' command";
    assert_eq!(expect_err(con, cmd("SET").arg("foo").arg("bar").arg("EX").arg("10000000000000000")), invalid_set);
    assert_eq!(expect_err(con, cmd("SET").arg("foo").arg("bar").arg("EX").arg("-9999999999999999")), invalid_set);

    ok(con, cmd("SET").arg("foo").arg("bar"));
    let invalid_getex = "ERR invalid expire time in 'getex' command";
    assert_eq!(expect_err(con, cmd("GETEX").arg("foo").arg("EX").arg("10000000000000000")), invalid_getex);
    ok(con, cmd("SET").arg("foo").arg("bar"));
    assert_eq!(expect_err(con, cmd("GETEX").arg("foo").arg("EX").arg("-9999999999999999")), invalid_getex);

    ok(con, cmd("SET").arg("foo").arg("bar"));
    let invalid_expire = "ERR invalid expire time in 'expire' command";
    // `when > LLONG_MAX - basetime`, then `when > LLONG_MAX / 1000`.
    for seconds in ["9223370399119966", "9223372036854776", "10000000000000000", "18446744073709561"] {
        assert_eq!(expect_err(con, cmd("EXPIRE").arg("foo").arg(seconds)), invalid_expire, "EXPIRE foo {seconds}");
    }
    assert_eq!(ttl(con, "foo"), -1);

    ok(con, cmd("SET").arg("foo").arg("bar"));
    assert_eq!(expect_err(con, cmd("PEXPIRE").arg("foo").arg("9223372036854770000")), "ERR invalid expire time in 'pexpire' command");

    ok(con, cmd("SET").arg("foo").arg("bar"));
    // `when < LLONG_MIN / 1000`.
    for seconds in ["-9223372036854776", "-9999999999999999"] {
        assert_eq!(expect_err(con, cmd("EXPIRE").arg("foo").arg(seconds)), invalid_expire, "EXPIRE foo {seconds}");
    }
    assert_eq!(ttl(con, "foo"), -1);

    ok(con, cmd("SET").arg("foo").arg("bar"));
    assert_eq!(int(con, cmd("PEXPIREAT").arg("foo").arg("9223372036854770000")), 1);

    ok(con, cmd("SET").arg("foo").arg("bar"));
    int(con, cmd("PEXPIREAT").arg("foo").arg("-9223372036854770000"));
    assert_eq!(ttl(con, "foo"), -2);
}

/// "SET command will remove expire", "SET - use KEEPTTL option, TTL should
/// not be removed", "GETEX use of PERSIST option should remove TTL".
fn set_and_getex_expiry(con: &mut Connection) {
    ok(con, cmd("SET").arg("foo").arg("bar").arg("EX").arg(100));
    ok(con, cmd("SET").arg("foo").arg("bar"));
    assert_eq!(ttl(con, "foo"), -1);

    ok(con, cmd("SET").arg("foo").arg("bar").arg("EX").arg(100));
    ok(con, cmd("SET").arg("foo").arg("bar").arg("KEEPTTL"));
    let t = ttl(con, "foo");
    assert!(t <= 100 && t > 90, "TTL {t}");

    ok(con, cmd("SET").arg("foo").arg("bar").arg("EX").arg(100));
    assert_eq!(cmd("GETEX").arg("foo").arg("PERSIST").query::<String>(con).unwrap(), "bar");
    assert_eq!(ttl(con, "foo"), -1);
}

#[test]
fn set_and_getex_expiry_on_one_node() {
    on_one_node(set_and_getex_expiry);
}

#[test]
fn set_and_getex_expiry_on_three_nodes() {
    on_three_nodes(set_and_getex_expiry);
}

/// One of Redis's tests of EXPIRE's NX, XX, GT and LT: `SET foo bar`
/// (with `EX ex` if given), then `EXPIRE foo seconds options` replies
/// `reply` and TTL is within `ttl` (both ends included).
struct Condition {
    redis: &'static str,
    ex: Option<u64>,
    seconds: u64,
    options: &'static [&'static str],
    reply: i64,
    ttl: (i64, i64),
}

const CONDITIONS: &[Condition] = &[
    Condition { redis: "EXPIRE with NX option on a key with ttl", ex: Some(100), seconds: 200, options: &["NX"], reply: 0, ttl: (50, 100) },
    Condition { redis: "EXPIRE with NX option on a key without ttl", ex: None, seconds: 200, options: &["NX"], reply: 1, ttl: (100, 200) },
    Condition {
        redis: "EXPIRE with XX option on a key with ttl",
        ex: Some(100),
        seconds: 200,
        options: &["XX"],
        reply: 1,
        ttl: (100, 200),
    },
    Condition { redis: "EXPIRE with XX option on a key without ttl", ex: None, seconds: 200, options: &["XX"], reply: 0, ttl: (-1, -1) },
    Condition {
        redis: "EXPIRE with GT option on a key with lower ttl",
        ex: Some(100),
        seconds: 200,
        options: &["GT"],
        reply: 1,
        ttl: (100, 200),
    },
    Condition {
        redis: "EXPIRE with GT option on a key with higher ttl",
        ex: Some(200),
        seconds: 100,
        options: &["GT"],
        reply: 0,
        ttl: (100, 200),
    },
    Condition { redis: "EXPIRE with GT option on a key without ttl", ex: None, seconds: 200, options: &["GT"], reply: 0, ttl: (-1, -1) },
    Condition {
        redis: "EXPIRE with LT option on a key with higher ttl",
        ex: Some(100),
        seconds: 200,
        options: &["LT"],
        reply: 0,
        ttl: (50, 100),
    },
    Condition {
        redis: "EXPIRE with LT option on a key with lower ttl",
        ex: Some(200),
        seconds: 100,
        options: &["LT"],
        reply: 1,
        ttl: (50, 100),
    },
    Condition { redis: "EXPIRE with LT option on a key without ttl", ex: None, seconds: 100, options: &["LT"], reply: 1, ttl: (50, 100) },
    Condition {
        redis: "EXPIRE with LT and XX option on a key with ttl",
        ex: Some(200),
        seconds: 100,
        options: &["LT", "XX"],
        reply: 1,
        ttl: (50, 100),
    },
    Condition {
        redis: "EXPIRE with LT and XX option on a key without ttl",
        ex: None,
        seconds: 200,
        options: &["LT", "XX"],
        reply: 0,
        ttl: (-1, -1),
    },
];

/// The tests in `CONDITIONS`, then "EXPIRE with negative expiry", "EXPIRE
/// with negative expiry on a non-valitale key", "EXPIRE with non-existed
/// key".
fn expire_conditions(con: &mut Connection) {
    for case in CONDITIONS {
        let mut set = cmd("SET");
        set.arg("foo").arg("bar");
        if let Some(ex) = case.ex {
            set.arg("EX").arg(ex);
        }
        ok(con, &set);
        assert_eq!(int(con, cmd("EXPIRE").arg("foo").arg(case.seconds).arg(case.options)), case.reply, "{}", case.redis);
        assert_range(ttl(con, "foo"), case.ttl.0, case.ttl.1, case.redis);
    }

    ok(con, cmd("SET").arg("foo").arg("bar").arg("EX").arg(100));
    assert_eq!(int(con, cmd("EXPIRE").arg("foo").arg(-10).arg("LT")), 1);
    assert_eq!(ttl(con, "foo"), -2);

    ok(con, cmd("SET").arg("foo").arg("bar"));
    assert_eq!(int(con, cmd("EXPIRE").arg("foo").arg(-10).arg("LT")), 1);
    assert_eq!(ttl(con, "foo"), -2);

    for option in ["NX", "XX", "GT", "LT"] {
        assert_eq!(int(con, cmd("EXPIRE").arg("none").arg(100).arg(option)), 0, "EXPIRE none 100 {option}");
    }
}

#[test]
fn expire_conditions_on_one_node() {
    on_one_node(expire_conditions);
}

#[test]
fn expire_conditions_on_three_nodes() {
    on_three_nodes(expire_conditions);
}

/// "EXPIRE with conflicting options: LT GT", "... NX GT", "... NX LT",
/// "... NX XX", and both "EXPIRE with unsupported options".
#[test]
fn expire_option_errors() {
    let c = single();
    let mut con = c.conn(0);
    let con = &mut con;
    let nx_and = "ERR NX and XX, GT or LT options at the same time are not compatible";
    for (options, error) in [
        (["LT", "GT"], "ERR GT and LT options at the same time are not compatible"),
        (["NX", "GT"], nx_and),
        (["NX", "LT"], nx_and),
        (["NX", "XX"], nx_and),
    ] {
        assert_eq!(expect_err(con, cmd("EXPIRE").arg("foo").arg(200).arg(&options)), error, "{options:?}");
    }
    assert_eq!(expect_err(con, cmd("EXPIRE").arg("foo").arg(200).arg("AB")), "ERR Unsupported option AB");
    assert_eq!(expect_err(con, cmd("EXPIRE").arg("foo").arg(200).arg("XX").arg("AB")), "ERR Unsupported option AB");
}

/// Keys foo1 to foo16 as Redis's AOF and replication tests of expiry times
/// leave them: foo1 to foo15 but foo11 expire about 100 s from now, each
/// given its expiry by another command; foo11 was given one in the past
/// (deleted), foo16 none.
fn set_every_kind_of_expiry(con: &mut Connection) -> Vec<String> {
    let (s, ms) = (clock_seconds(), clock_milliseconds());
    ok(con, cmd("SET").arg("foo1").arg("bar").arg("EX").arg(100));
    ok(con, cmd("SET").arg("foo2").arg("bar").arg("PX").arg(100_000));
    ok(con, cmd("SET").arg("foo3").arg("bar").arg("EXAT").arg(s + 100));
    ok(con, cmd("SET").arg("foo4").arg("bar").arg("PXAT").arg(ms + 100_000));
    ok(con, cmd("SETEX").arg("foo5").arg(100).arg("bar"));
    ok(con, cmd("PSETEX").arg("foo6").arg(100_000).arg("bar"));
    let expire: [(&str, &str, i64); 5] = [
        ("foo7", "EXPIRE", 100),
        ("foo8", "PEXPIRE", 100_000),
        ("foo9", "EXPIREAT", s + 100),
        ("foo10", "PEXPIREAT", s * 1000 + 100_000),
        ("foo11", "EXPIREAT", s - 100),
    ];
    for (key, command, when) in expire {
        ok(con, cmd("SET").arg(key).arg("bar"));
        assert_eq!(int(con, cmd(command).arg(key).arg(when)), 1, "{command} {key} {when}");
    }
    let getex: [(&str, &str, i64); 4] =
        [("foo12", "EX", 100), ("foo13", "PX", 100_000), ("foo14", "EXAT", s + 100), ("foo15", "PXAT", ms + 100_000)];
    for (key, option, when) in getex {
        ok(con, cmd("SET").arg(key).arg("bar"));
        assert_eq!(cmd("GETEX").arg(key).arg(option).arg(when).query::<String>(con).unwrap(), "bar");
    }
    ok(con, cmd("SET").arg("foo16").arg("bar"));
    (1..=16).map(|i| format!("foo{i}")).collect()
}

/// After "For all replicated TTL-related commands, absolute expire times
/// are identical on primary and replica" (its RESTORE keys left out): what
/// the head decided is what every replica of the chain holds, the absolute
/// expiry time, not a time to live each would count from its own arrival.
#[test]
fn every_replica_holds_the_same_absolute_expiry() {
    let c = Cluster::three();
    let mut con = c.conn(0);
    let keys = set_every_kind_of_expiry(&mut con);
    let expected: Vec<i64> = keys.iter().map(|k| pexpiretime(&mut con, k)).collect();
    assert_eq!((expected[10], expected[15]), (-2, -1), "foo11 is gone, foo16 has no TTL");
    for node in 0..3 {
        // Eventual reads answer from the node's own replica.
        let mut con = c.conn(node);
        ok(&mut con, cmd("CW.CONSISTENCY").arg("eventual"));
        c.eventually(Duration::from_secs(10), &format!("node {node}'s replicas to hold the same expiry times"), || {
            let got: Vec<i64> = keys.iter().map(|k| pexpiretime(&mut con, k)).collect();
            (got == expected).then_some(())
        });
    }
}

/// After "All time-to-live(TTL) in commands are propagated as absolute
/// timestamp in milliseconds in AOF" (its RESTORE keys left out), "SET -
/// use KEEPTTL option, TTL should not be removed after loadaof" and "GETEX
/// use of PERSIST option should remove TTL after loadaof": a node killed
/// and restarted from its write-ahead log 2 s later has the same absolute
/// expiry times, so the times to live went down meanwhile.
#[test]
fn a_restart_keeps_absolute_expiry_times() {
    let mut c = Cluster::start_with(Opts::new(1, 1, 1).durable().flag("--fsync", "always"));
    let mut con = c.conn(0);
    let keys = set_every_kind_of_expiry(&mut con);
    ok(&mut con, cmd("SET").arg("keepttl").arg("bar").arg("EX").arg(100));
    ok(&mut con, cmd("SET").arg("keepttl").arg("bar2").arg("KEEPTTL"));
    ok(&mut con, cmd("SET").arg("persisted").arg("bar").arg("EX").arg(100));
    assert_eq!(cmd("GETEX").arg("persisted").arg("PERSIST").query::<String>(&mut con).unwrap(), "bar");
    let expected: Vec<i64> = keys.iter().map(|k| pexpiretime(&mut con, k)).collect();
    drop(con);

    sleep(Duration::from_millis(2000));
    c.kill(0);
    c.restart(0);
    c.wait_serving(&[0]);

    let mut con = c.conn(0);
    for key in &keys {
        match key.as_str() {
            "foo11" => assert_eq!(ttl(&mut con, key), -2, "foo11 is gone"),
            "foo16" => assert_eq!(ttl(&mut con, key), -1, "foo16 has no TTL"),
            _ => assert_range(ttl(&mut con, key), 90, 98, key),
        }
    }
    let got: Vec<i64> = keys.iter().map(|k| pexpiretime(&mut con, k)).collect();
    assert_eq!(got, expected);
    let t = ttl(&mut con, "keepttl");
    assert!(t <= 98 && t > 90, "keepttl's TTL {t}");
    assert_eq!(get(&mut con, "keepttl").as_deref(), Some("bar2"));
    assert_eq!(ttl(&mut con, "persisted"), -1);
}

/// Expiry is decided by a key's head and replicated: keys written with PX
/// through node 0 are gone, once their time has passed, through every
/// node at every consistency level, and the heads counted them.
#[test]
fn a_key_expired_through_one_node_is_gone_through_every_node() {
    let c = Cluster::three();
    let mut con = c.conn(0);
    // Enough keys that every node heads some of them.
    let keys: Vec<String> = (0..30).map(|i| format!("gone:{i}")).collect();
    for key in &keys {
        ok(&mut con, cmd("SET").arg(key).arg("v").arg("PX").arg(100));
    }
    sleep(Duration::from_millis(200));
    for node in 0..3 {
        for level in ["eventual", "causal", "linearizable"] {
            let mut con = c.conn(node);
            ok(&mut con, cmd("CW.CONSISTENCY").arg(level));
            for key in &keys {
                let what = format!("{key} via node {node}, {level}");
                assert_eq!(get(&mut con, key), None, "GET {what}");
                assert_eq!(exists(&mut con, key), 0, "EXISTS {what}");
                assert_eq!(ttl(&mut con, key), -2, "TTL {what}");
            }
        }
    }
    c.eventually(Duration::from_secs(10), "the heads to expire the keys", || (expired_keys_in_site(&c) > 0).then_some(()));
}

/// Active expiry reclaims keys nobody reads: 1000 keys written with PX 100
/// in one pipeline are, 1.5 s later, all counted in `expired_keys` by their
/// heads, with no read in between to find them expired.
#[test]
fn active_expiry_reclaims_keys_nobody_reads() {
    let c = Cluster::three();
    let mut con = c.conn(0);
    let before = expired_keys_in_site(&c);
    let mut pipe = redis::pipe();
    for i in 0..1000 {
        pipe.cmd("SET").arg(format!("reclaim:{i}")).arg("v").arg("PX").arg(100).ignore();
    }
    let () = pipe.query(&mut con).unwrap();
    sleep(Duration::from_millis(1500));
    assert_eq!(int(&mut con, &cmd("DBSIZE")), 0);
    assert_eq!(expired_keys_in_site(&c), before + 1000);
}
