//! CONFIG GET pattern [pattern ...] | SET parameter value [parameter value
//! ...] | RESETSTAT
//!
//! Causeway is configured by flags; what can change at run time is what a
//! Redis user changes there: `maxmemory` and `maxmemory-policy` (the
//! node's memory budget, `runtime::memory::Budget`). CONFIG GET answers
//! those its glob-style patterns match, and what tools ask for that flags
//! set (`save` is "", `appendonly` says whether the node keeps a log,
//! `databases` is 1); CONFIG SET sets the first two, all or none, with
//! Redis 7's errors. CONFIG
//! RESETSTAT starts INFO's counters afresh (commandstats, errorstats,
//! latencystats and those in stats), as Redis does; connected_clients
//! stays. Another subcommand is `ERR unknown subcommand '...' for
//! 'config'`, and the wrong number of arguments for one is `ERR wrong
//! number of arguments for 'config|get' command`, as Redis 7 names it
//! (both answered in `mod.rs` before this runs).

use super::{upper, Outcome, Subcommand};
use crate::config::parse_memory;
use crate::redis::conn::Conn;
use crate::runtime::memory::Budget;
use bytes::Bytes;
use causeway_core::chain::Policy;
use causeway_resp::Frame;

/// Arities as Redis 7 states them, counting CONFIG.
pub const SUBCOMMANDS: &[Subcommand] =
    &[Subcommand { name: "get", arity: -3 }, Subcommand { name: "set", arity: -4 }, Subcommand { name: "resetstat", arity: 2 }];

/// The parameters CONFIG SET sets.
const PARAMETERS: &[&str] = &["maxmemory", "maxmemory-policy"];
/// And those CONFIG GET also answers (set by flags at start).
const FIXED: &[&str] = &["save", "appendonly", "databases"];

pub async fn run(conn: &mut Conn, args: Vec<Bytes>) -> Outcome {
    let budget = conn.node.budget();
    match upper(&args[1]).as_str() {
        "GET" => get(budget, conn.node.config().data_dir.is_some(), &args[2..]),
        "SET" => set(budget, &args[2..]),
        "RESETSTAT" => {
            conn.server.stats.reset();
            Frame::ok()
        }
        other => unreachable!("CONFIG {other} is not in SUBCOMMANDS"),
    }
    .into()
}

fn value(budget: &Budget, logs: bool, parameter: &str) -> String {
    match parameter {
        "maxmemory" => budget.max().to_string(),
        "maxmemory-policy" => budget.policy().to_string(),
        "save" => String::new(),
        "appendonly" => if logs { "yes" } else { "no" }.to_string(),
        "databases" => "1".to_string(),
        other => unreachable!("{other} is not in PARAMETERS or FIXED"),
    }
}

fn get(budget: &Budget, logs: bool, patterns: &[Bytes]) -> Frame {
    let matching = PARAMETERS
        .iter()
        .chain(FIXED)
        .filter(|p| patterns.iter().any(|pattern| causeway_core::store::glob::matches(&pattern.to_ascii_lowercase(), p.as_bytes())));
    Frame::Map(
        matching.map(|p| (Frame::bulk(Bytes::from_static(p.as_bytes())), Frame::bulk(Bytes::from(value(budget, logs, p))))).collect(),
    )
}

fn set(budget: &Budget, args: &[Bytes]) -> Frame {
    let name = |b: &Bytes| String::from_utf8_lossy(b).to_ascii_lowercase();
    if !args.len().is_multiple_of(2) || !args.chunks(2).all(|kv| PARAMETERS.contains(&name(&kv[0]).as_str())) {
        let first = args.chunks(2).map(|kv| name(&kv[0])).find(|n| !PARAMETERS.contains(&n.as_str())).unwrap_or_else(|| name(&args[0]));
        return Frame::error(format!("ERR Unknown option or number of arguments for CONFIG SET - '{first}'"));
    }
    // Every value checked before any is set.
    let (mut max, mut policy) = (None, None);
    for kv in args.chunks(2) {
        let (parameter, text) = (name(&kv[0]), String::from_utf8_lossy(&kv[1]).into_owned());
        let parsed = match parameter.as_str() {
            "maxmemory" => parse_memory(&text).map(|m| max = Some(m)),
            _ => text.parse::<Policy>().map(|p| policy = Some(p)),
        };
        if let Err(why) = parsed {
            return Frame::error(format!("ERR CONFIG SET failed (possibly related to argument '{parameter}') - {why}"));
        }
    }
    if let Some(max) = max {
        budget.set(max);
    }
    if let Some(policy) = policy {
        budget.set_policy(policy);
    }
    Frame::ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_values_read_as_redis_reads_them() {
        assert_eq!(parse_memory("100"), Ok(100));
        assert_eq!(parse_memory("1kb"), Ok(1024));
        assert_eq!(parse_memory("2MB"), Ok(2 << 20));
        assert_eq!(parse_memory("1g"), Ok(1_000_000_000));
        assert!(parse_memory("ten").is_err() && parse_memory("5tb").is_err() && parse_memory("").is_err());
    }
}
