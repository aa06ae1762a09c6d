//! CONFIG GET pattern [pattern ...] | SET parameter value [parameter value
//! ...] | RESETSTAT
//!
//! Causeway is configured by flags; what can change at run time is what a
//! Redis user changes there: `maxmemory` and `maxmemory-policy` (the
//! node's memory budget, `runtime::memory::Budget`). CONFIG GET answers
//! those its glob-style patterns match (nothing else: tools such as
//! redis-benchmark ask for `save` and `appendonly` and take no answer);
//! CONFIG SET sets them, all or none, with Redis 7's errors. CONFIG
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

/// The parameters CONFIG knows.
const PARAMETERS: &[&str] = &["maxmemory", "maxmemory-policy"];

pub async fn run(conn: &mut Conn, args: Vec<Bytes>) -> Outcome {
    let budget = conn.node.budget();
    match upper(&args[1]).as_str() {
        "GET" => get(budget, &args[2..]),
        "SET" => set(budget, &args[2..]),
        "RESETSTAT" => {
            conn.server.stats.reset();
            Frame::ok()
        }
        other => unreachable!("CONFIG {other} is not in SUBCOMMANDS"),
    }
    .into()
}

fn value(budget: &Budget, parameter: &str) -> String {
    match parameter {
        "maxmemory" => budget.max().to_string(),
        "maxmemory-policy" => budget.policy().to_string(),
        other => unreachable!("{other} is not in PARAMETERS"),
    }
}

fn get(budget: &Budget, patterns: &[Bytes]) -> Frame {
    let matching = PARAMETERS.iter().filter(|p| patterns.iter().any(|pattern| glob(&pattern.to_ascii_lowercase(), p.as_bytes())));
    Frame::Map(matching.map(|p| (Frame::bulk(Bytes::from_static(p.as_bytes())), Frame::bulk(Bytes::from(value(budget, p))))).collect())
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

/// Redis's glob-style match (`*`, `?`, `[...]` with ranges and `^`, `\`
/// escapes), on bytes.
fn glob(pattern: &[u8], text: &[u8]) -> bool {
    match pattern.split_first() {
        None => text.is_empty(),
        Some((b'*', rest)) => (0..=text.len()).any(|i| glob(rest, &text[i..])),
        Some((b'?', rest)) => !text.is_empty() && glob(rest, &text[1..]),
        Some((b'[', rest)) => {
            let Some((&c, text_rest)) = text.split_first() else { return false };
            let (negate, mut set) = match rest.split_first() {
                Some((b'^', set)) => (true, set),
                _ => (false, rest),
            };
            let mut matched = false;
            loop {
                match set {
                    [] => return false, // no closing bracket
                    [b']', after @ ..] => {
                        set = after;
                        break;
                    }
                    [b'\\', x, after @ ..] => {
                        matched |= *x == c;
                        set = after;
                    }
                    [lo, b'-', hi, after @ ..] if *hi != b']' => {
                        matched |= (*lo.min(hi)..=*lo.max(hi)).contains(&c);
                        set = after;
                    }
                    [x, after @ ..] => {
                        matched |= *x == c;
                        set = after;
                    }
                }
            }
            matched != negate && glob(set, text_rest)
        }
        Some((b'\\', [x, rest @ ..])) => text.first() == Some(x) && glob(rest, &text[1..]),
        Some((x, rest)) => text.first() == Some(x) && glob(rest, &text[1..]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_as_redis_does() {
        for (pattern, text, expected) in [
            ("*", "maxmemory", true),
            ("max*", "maxmemory-policy", true),
            ("maxmemory", "maxmemory-policy", false),
            ("*policy", "maxmemory-policy", true),
            ("max?emory", "maxmemory", true),
            ("[lm]axmemory", "maxmemory", true),
            ("[^m]axmemory", "maxmemory", false),
            ("[a-n]axmemory", "maxmemory", true),
            ("save", "maxmemory", false),
            ("\\*", "*", true),
        ] {
            assert_eq!(glob(pattern.as_bytes(), text.as_bytes()), expected, "{pattern} against {text}");
        }
    }

    #[test]
    fn memory_values_read_as_redis_reads_them() {
        assert_eq!(parse_memory("100"), Ok(100));
        assert_eq!(parse_memory("1kb"), Ok(1024));
        assert_eq!(parse_memory("2MB"), Ok(2 << 20));
        assert_eq!(parse_memory("1g"), Ok(1_000_000_000));
        assert!(parse_memory("ten").is_err() && parse_memory("5tb").is_err() && parse_memory("").is_err());
    }
}
