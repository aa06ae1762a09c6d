//! INFO commandstats, errorstats and latencystats against real `causeway
//! node` processes, ported from Redis's own tests of them
//! (tests/unit/info-command.tcl, tests/unit/info.tcl,
//! tests/integration/redis-benchmark.tcl) where they need only commands
//! Causeway has. Each test names the Redis test it mirrors.

mod common;

use common::{eventually, expect_err, Cluster, Opts};
use redis::{cmd, Connection};
use std::time::Duration;

/// One node serving the whole key space: enough for counters.
fn single() -> Cluster {
    Cluster::start_with(Opts::new(1, 1, 1))
}

fn info(con: &mut Connection, section: &str) -> String {
    cmd("INFO").arg(section).query(con).unwrap()
}

fn resetstat(con: &mut Connection) {
    assert_eq!(cmd("CONFIG").arg("RESETSTAT").query::<String>(con).unwrap(), "OK");
}

/// The value of `field` in INFO `section` (Redis's `s` and `cmdrstat`).
fn field(con: &mut Connection, section: &str, field: &str) -> Option<String> {
    let text = info(con, section);
    text.split("\r\n").find_map(|l| l.strip_prefix(field)?.strip_prefix(':')).map(str::to_string)
}

/// `total_error_replies` in INFO stats.
fn total_error_replies(con: &mut Connection) -> u64 {
    field(con, "stats", "total_error_replies").expect("total_error_replies in INFO stats").parse().unwrap()
}

/// A command's calls, rejected calls and failed calls from INFO
/// commandstats (None: no line, the command was never called).
fn cmdstat(con: &mut Connection, name: &str) -> Option<(u64, u64, u64)> {
    let line = field(con, "commandstats", &format!("cmdstat_{name}"))?;
    let kv = pairs(&line);
    let keys: Vec<&str> = kv.iter().map(|(k, _)| *k).collect();
    assert_eq!(keys, ["calls", "usec", "usec_per_call", "rejected_calls", "failed_calls"], "{line}");
    assert!(kv[2].1.split_once('.').is_some_and(|(_, d)| d.len() == 2), "usec_per_call has two decimals: {line}");
    let n = |i: usize| kv[i].1.parse::<u64>().unwrap_or_else(|_| panic!("{line}"));
    Some((n(0), n(3), n(4)))
}

/// An error code's count from INFO errorstats.
fn errorstat(con: &mut Connection, code: &str) -> Option<u64> {
    let line = field(con, "errorstats", &format!("errorstat_{code}"))?;
    Some(line.strip_prefix("count=").unwrap_or_else(|| panic!("{line}")).parse().unwrap())
}

/// A command's p50, p99 and p99.9 latencies in microseconds from INFO
/// latencystats.
fn latency_percentiles_usec(con: &mut Connection, name: &str) -> Option<[f64; 3]> {
    let line = field(con, "latencystats", &format!("latency_percentiles_usec_{name}"))?;
    let kv = pairs(&line);
    let keys: Vec<&str> = kv.iter().map(|(k, _)| *k).collect();
    assert_eq!(keys, ["p50", "p99", "p99.9"], "{line}");
    assert!(kv.iter().all(|(_, v)| v.split_once('.').is_some_and(|(_, d)| d.len() == 3)), "three decimals: {line}");
    let p = |i: usize| kv[i].1.parse::<f64>().unwrap_or_else(|_| panic!("{line}"));
    Some([p(0), p(1), p(2)])
}

/// `a=1,b=2` as (a, 1), (b, 2).
fn pairs(line: &str) -> Vec<(&str, &str)> {
    line.split(',').map(|kv| kv.split_once('=').unwrap_or_else(|| panic!("{line}"))).collect()
}

/// info-command.tcl: "info command with at most one sub command", "info
/// command with one sub-section", "info command with multiple sub-sections".
#[test]
fn info_default_leaves_out_the_per_command_sections_and_all_has_them() {
    let c = single();
    let mut con = c.conn(0);
    let _: String = cmd("PING").query(&mut con).unwrap();
    for arg in ["", "all", "default", "everything"] {
        let text: String = if arg.is_empty() { cmd("INFO").query(&mut con).unwrap() } else { info(&mut con, arg) };
        for f in ["redis_version", "used_cpu_user", "used_memory", "# Errorstats"] {
            assert!(text.contains(f), "INFO {arg} lacks {f}:\n{text}");
        }
        let per_command = text.contains("rejected_calls") || text.contains("# Latencystats");
        assert_eq!(per_command, arg == "all" || arg == "everything", "INFO {arg}:\n{text}");
    }

    let cpu = info(&mut con, "cpu");
    assert!(cpu.contains("used_cpu_user") && !cpu.contains("used_memory"), "{cpu}");
    // Section names in any case.
    let commandstats = info(&mut con, "commandSTATS");
    assert!(commandstats.contains("rejected_calls") && !commandstats.contains("used_memory"), "{commandstats}");

    let text: String = cmd("INFO").arg("cpu").arg("all").query(&mut con).unwrap();
    for f in ["used_cpu_user", "used_memory", "epoch:", "rejected_calls"] {
        assert!(text.contains(f), "INFO cpu all lacks {f}:\n{text}");
    }
    assert_eq!(text.matches("used_cpu_user").count(), 1, "the same section twice:\n{text}");
    let text: String = cmd("INFO").arg("cpu").arg("default").query(&mut con).unwrap();
    for f in ["used_cpu_user", "used_memory", "epoch:"] {
        assert!(text.contains(f), "INFO cpu default lacks {f}:\n{text}");
    }
    assert!(!text.contains("rejected_calls"), "{text}");
    assert_eq!(text.matches("used_cpu_user").count(), 1, "the same section twice:\n{text}");
}

/// info.tcl: "errorstats: rejected call unknown command".
#[test]
fn errorstats_rejected_call_unknown_command() {
    let c = single();
    let mut con = c.conn(0);
    resetstat(&mut con);
    assert_eq!(total_error_replies(&mut con), 0);
    assert_eq!(errorstat(&mut con, "ERR"), None);
    assert!(expect_err(&mut con, &cmd("asdf")).starts_with("ERR unknown"));
    assert_eq!(errorstat(&mut con, "ERR"), Some(1));
    assert_eq!(total_error_replies(&mut con), 1);
    assert_eq!(cmdstat(&mut con, "asdf"), None);
    resetstat(&mut con);
    assert_eq!(errorstat(&mut con, "ERR"), None);
}

/// info.tcl: "errorstats: rejected call due to wrong arity".
#[test]
fn errorstats_rejected_call_due_to_wrong_arity() {
    let c = single();
    let mut con = c.conn(0);
    resetstat(&mut con);
    assert_eq!(total_error_replies(&mut con), 0);
    assert_eq!(errorstat(&mut con, "ERR"), None);
    assert_eq!(expect_err(&mut con, cmd("SET").arg("k")), "ERR wrong number of arguments for 'set' command");
    assert_eq!(errorstat(&mut con, "ERR"), Some(1));
    assert_eq!(cmdstat(&mut con, "set"), Some((0, 1, 0)));
    // After a rejected command, valid ones are counted properly.
    let _: () = redis::Commands::set(&mut con, "k1", "v1").unwrap();
    let _: () = redis::Commands::set(&mut con, "k2", "v2").unwrap();
    assert_eq!(cmdstat(&mut con, "set"), Some((2, 1, 0)));
    assert_eq!(total_error_replies(&mut con), 1);
}

/// info.tcl: "errorstats: failed call authentication error" (AUTH with no
/// password configured fails as it runs).
#[test]
fn errorstats_failed_call_authentication_error() {
    let c = single();
    let mut con = c.conn(0);
    resetstat(&mut con);
    assert_eq!(errorstat(&mut con, "ERR"), None);
    assert_eq!(total_error_replies(&mut con), 0);
    assert!(expect_err(&mut con, cmd("AUTH").arg("k")).starts_with("ERR AUTH"));
    assert_eq!(errorstat(&mut con, "ERR"), Some(1));
    assert_eq!(cmdstat(&mut con, "auth"), Some((1, 0, 1)));
    assert_eq!(total_error_replies(&mut con), 1);
    resetstat(&mut con);
    assert_eq!(errorstat(&mut con, "ERR"), None);
}

/// info.tcl: "errorstats: rejected call by authorization error" (there by
/// an ACL's NOPERM; here by NOAUTH, Causeway's one way to refuse a known
/// command to a client), and a wrong password as a failed AUTH.
#[test]
fn errorstats_rejected_call_by_authorization_error() {
    let c = Cluster::start_with(Opts::new(1, 1, 1).flag("--requirepass", "pw"));
    let mut admin = c.conn(0);
    let _: String = cmd("AUTH").arg("pw").query(&mut admin).unwrap();
    resetstat(&mut admin);
    assert_eq!(total_error_replies(&mut admin), 0);
    assert_eq!(errorstat(&mut admin, "NOAUTH"), None);

    let mut raw = c.raw(0);
    assert_eq!(raw.cmd(&[b"SET", b"a", b"b"]), common::error("NOAUTH Authentication required."));
    assert_eq!(errorstat(&mut admin, "NOAUTH"), Some(1));
    assert_eq!(cmdstat(&mut admin, "set"), Some((0, 1, 0)));
    assert_eq!(total_error_replies(&mut admin), 1);

    assert_eq!(raw.cmd(&[b"AUTH", b"wrong"]), common::error("WRONGPASS invalid username-password pair or user is disabled."));
    assert_eq!(errorstat(&mut admin, "WRONGPASS"), Some(1));
    assert_eq!(cmdstat(&mut admin, "auth"), Some((1, 0, 1)));
    assert_eq!(total_error_replies(&mut admin), 2);
    resetstat(&mut admin);
    assert_eq!(errorstat(&mut admin, "NOAUTH"), None);
}

/// info.tcl: "errorstats: failed call NOSCRIPT error" and "errorstats:
/// blocking commands" (a command that fails as it runs counts a call and a
/// failed call), with a SET that fails on its options, and one that the
/// replicas do not complete before the request timeout; and "latencystats:
/// measure latency" (there DEBUG SLEEP 0.05; here the wait for the
/// replicas, which a data command's latency includes).
#[test]
fn errorstats_failed_calls_and_latency_includes_the_wait_for_the_replicas() {
    let timeout_ms = 300;
    // Every write needs all three replicas; nobody gives up on a frozen one
    // during the test.
    let c = Cluster::start_with(Opts::new(3, 3, 3).flag("--request-timeout-ms", timeout_ms).flag("--failure-timeout-ms", 60_000));
    let mut con = c.conn(0);
    // Just started, the site may take longer than the timeout for a write.
    eventually(Duration::from_secs(20), "a write to succeed", || redis::Commands::set::<_, _, ()>(&mut con, "before", "v").ok());
    resetstat(&mut con);
    assert_eq!(expect_err(&mut con, cmd("SET").arg("k").arg("v").arg("BADOPT")), "ERR syntax error");
    assert_eq!(cmdstat(&mut con, "set"), Some((1, 0, 1)));
    assert_eq!(errorstat(&mut con, "ERR"), Some(1));

    resetstat(&mut con);
    c.signal(2, "STOP");
    let e = expect_err(&mut con, cmd("SET").arg("k").arg("v"));
    c.signal(2, "CONT");
    assert!(e.starts_with("ERR "), "{e}");
    assert_eq!(cmdstat(&mut con, "set"), Some((1, 0, 1)));
    assert_eq!(errorstat(&mut con, "ERR"), Some(1));
    assert_eq!(total_error_replies(&mut con), 1);
    let [p50, p99, p999] = latency_percentiles_usec(&mut con, "set").expect("a latency line for set");
    // The timeout is counted in whole milliseconds from the request's start.
    assert!(p50 >= (timeout_ms - 1) as f64 * 1000.0, "set p50 {p50} µs, timeout {timeout_ms} ms");
    assert!(p50 <= p99 && p99 <= p999, "{p50} {p99} {p999}");
    let _: String = cmd("PING").query(&mut con).unwrap();
    let [ping, ..] = latency_percentiles_usec(&mut con, "ping").expect("a latency line for ping");
    assert!(ping < p50, "ping {ping} µs against set {p50} µs");
}

/// info.tcl: "latencystats: subcommands".
#[test]
fn latencystats_subcommands() {
    let c = single();
    let mut con = c.conn(0);
    resetstat(&mut con);
    let _: i64 = cmd("CLIENT").arg("ID").query(&mut con).unwrap();
    assert!(latency_percentiles_usec(&mut con, "client|id").is_some());
    assert!(latency_percentiles_usec(&mut con, "config|resetstat").is_some());
    assert_eq!(cmdstat(&mut con, "client|id"), Some((1, 0, 0)));
    // A container alone, or a subcommand with the wrong number of
    // arguments, is rejected on its own line, as Redis 7 counts it.
    assert_eq!(expect_err(&mut con, &cmd("CLIENT")), "ERR wrong number of arguments for 'client' command");
    assert_eq!(expect_err(&mut con, cmd("CLIENT").arg("SETNAME")), "ERR wrong number of arguments for 'client|setname' command");
    assert_eq!(cmdstat(&mut con, "client"), Some((0, 1, 0)));
    assert_eq!(cmdstat(&mut con, "client|setname"), Some((0, 1, 0)));
    // An unknown subcommand is only an error.
    assert!(expect_err(&mut con, cmd("CLIENT").arg("NOSUCH")).starts_with("ERR unknown subcommand 'NOSUCH'"));
    assert_eq!(errorstat(&mut con, "ERR"), Some(3));
    assert_eq!(cmdstat(&mut con, "client|nosuch"), None);
    assert_eq!(latency_percentiles_usec(&mut con, "client|setname"), None);
}

/// info.tcl: "latencystats: disable/enable" and "latencystats: configure
/// percentiles", as far as Causeway goes (latency is always tracked, at
/// p50, p99 and p99.9): a command's latency shows once it ran, and CONFIG
/// RESETSTAT clears it.
#[test]
fn latencystats_show_after_a_call_and_resetstat_clears_them() {
    let c = single();
    let mut con = c.conn(0);
    resetstat(&mut con);
    assert_eq!(latency_percentiles_usec(&mut con, "set"), None);
    let _: () = redis::Commands::set(&mut con, "a", "b").unwrap();
    let _: String = redis::Commands::get(&mut con, "a").unwrap();
    for name in ["set", "get"] {
        let [p50, p99, p999] = latency_percentiles_usec(&mut con, name).unwrap();
        assert!(0.0 < p50 && p50 <= p99 && p99 <= p999, "{name}: {p50} {p99} {p999}");
    }
    resetstat(&mut con);
    assert_eq!(latency_percentiles_usec(&mut con, "set"), None);
    assert_eq!(cmdstat(&mut con, "set"), None);
}

/// redis-benchmark.tcl: "benchmark: pipelined full set,get" (`-P 5 -c 10`),
/// with the redis crate's pipelines: every queued command counts once, and
/// commands not sent have no line.
#[test]
fn pipelined_calls_are_each_counted() {
    let c = Cluster::three();
    let mut con = c.conn(0);
    resetstat(&mut con);
    let (clients, pipelines, depth) = (10, 20, 5);
    let sent = (clients * pipelines * depth) as u64;
    std::thread::scope(|s| {
        for client in 0..clients {
            let c = &c;
            s.spawn(move || {
                let mut con = c.conn(client % 3);
                for _ in 0..pipelines {
                    let mut pipe = redis::pipe();
                    for _ in 0..depth {
                        pipe.cmd("SET").arg("key:__rand_int__").arg("xxx").ignore();
                        pipe.cmd("GET").arg("key:__rand_int__").ignore();
                    }
                    let () = pipe.query(&mut con).unwrap();
                }
            });
        }
    });
    // The three nodes' counts add up to what was sent.
    let total = |name: &str| -> u64 { (0..3).filter_map(|i| cmdstat(&mut c.conn(i), name)).map(|(calls, _, _)| calls).sum() };
    assert_eq!(total("set"), sent);
    assert_eq!(total("get"), sent);
    assert_eq!(total("mget"), 0);
}
