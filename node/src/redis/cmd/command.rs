//! COMMAND [COUNT | DOCS [name ...] | INFO [name ...]]
//!
//! The command table, as far as clients use it: every command's entry
//! (name, arity, flags, first key, last key, step: `spec`), their count, no docs,
//! or the entries of the named commands (a null for an unknown one).
//! Another subcommand is `ERR unknown subcommand '...' for 'command'`
//! (answered in `mod.rs`, as is COUNT with arguments).

use super::{upper, Command, Outcome, Subcommand, COMMANDS};
use crate::redis::conn::Conn;
use bytes::Bytes;
use causeway_resp::Frame;

/// Arities as Redis 7 states them, counting COMMAND.
pub const SUBCOMMANDS: &[Subcommand] =
    &[Subcommand { name: "count", arity: 2 }, Subcommand { name: "docs", arity: -2 }, Subcommand { name: "info", arity: -2 }];

pub async fn run(_conn: &mut Conn, args: Vec<Bytes>) -> Outcome {
    match args.get(1).map(|a| upper(a)).as_deref() {
        None => Frame::Array(COMMANDS.iter().map(entry).collect()),
        Some("COUNT") => Frame::Integer(COMMANDS.len() as i64),
        Some("DOCS") => Frame::Map(Vec::new()),
        Some("INFO") => Frame::Array(
            args[2..]
                .iter()
                .map(|n| COMMANDS.iter().find(|c| c.name.as_bytes().eq_ignore_ascii_case(n)).map_or(Frame::Null, entry))
                .collect(),
        ),
        Some(other) => unreachable!("COMMAND {other} is not in SUBCOMMANDS"),
    }
    .into()
}

fn entry(c: &Command) -> Frame {
    let (flags, first, last, step) = spec(c.name);
    Frame::Array(vec![
        Frame::Bulk(Bytes::from_static(c.name.as_bytes())),
        Frame::Integer(c.arity),
        Frame::Array(flags.iter().map(|f| Frame::Simple((*f).into())).collect()),
        Frame::Integer(first),
        Frame::Integer(last),
        Frame::Integer(step),
    ])
}

/// A command's flags and where its keys are (first, last, step; 0 0 0:
/// none), as Redis 7 gives them for its commands: clients and proxies read
/// these to route by key and to tell reads from writes. Causeway's own
/// commands take no keys as Redis sees them.
fn spec(name: &str) -> (&'static [&'static str], i64, i64, i64) {
    const READ: &[&str] = &["readonly", "fast"];
    const WRITE: &[&str] = &["write", "fast"];
    const GROW: &[&str] = &["write", "denyoom"];
    const ANY: &[&str] = &["loading", "stale", "fast"];
    match name {
        "get" | "strlen" | "type" | "ttl" | "pttl" | "expiretime" | "pexpiretime" => (READ, 1, 1, 1),
        "getrange" | "substr" => (&["readonly"], 1, 1, 1),
        "setnx" | "append" | "setrange" => (GROW, 1, 1, 1),
        "incrbyfloat" => (&["write", "denyoom", "fast"], 1, 1, 1),
        "exists" | "mget" | "touch" => (READ, 1, -1, 1),
        "set" | "setex" | "psetex" => (GROW, 1, 1, 1),
        "getset" | "incr" | "decr" | "incrby" | "decrby" => (&["write", "denyoom", "fast"], 1, 1, 1),
        "mset" => (GROW, 1, -1, 2),
        "getex" | "getdel" | "expire" | "pexpire" | "expireat" | "pexpireat" | "persist" => (WRITE, 1, 1, 1),
        "del" | "unlink" => (&["write"], 1, -1, 1),
        "dbsize" | "randomkey" => (READ, 0, 0, 0),
        "keys" | "scan" => (&["readonly"], 0, 0, 0),
        "flushall" | "flushdb" => (&["write"], 0, 0, 0),
        "hello" | "auth" => (&["noscript", "loading", "stale", "fast", "no_auth"], 0, 0, 0),
        "ping" | "echo" | "time" | "select" => (ANY, 0, 0, 0),
        "wait" => (&["noscript"], 0, 0, 0),
        "info" | "command" | "client" | "config" | "memory" | "object" => (&["loading", "stale"], 0, 0, 0),
        "quit" => (&["loading", "stale", "fast", "no_auth"], 0, 0, 0),
        "multi" | "discard" | "unwatch" => (&["noscript", "loading", "stale", "fast", "allow_busy"], 0, 0, 0),
        "exec" => (&["noscript", "loading", "stale", "skip_slowlog"], 0, 0, 0),
        "watch" => (&["noscript", "loading", "stale", "fast", "allow_busy"], 1, -1, 1),
        _ => (&[], 0, 0, 0),
    }
}

#[cfg(test)]
mod tests {
    use super::spec;
    use crate::redis::cmd::COMMANDS;

    #[test]
    fn every_data_command_names_its_keys() {
        for c in COMMANDS {
            let (flags, first, _, _) = spec(c.name);
            let data = matches!(c.handler, crate::redis::cmd::Handler::Queue(_)) && !c.name.starts_with("cw.");
            let keyless = matches!(c.name, "dbsize" | "flushall" | "flushdb" | "keys" | "scan" | "randomkey" | "unwatch");
            assert!(!data || keyless || first == 1, "{}: where are its keys?", c.name);
            assert!(c.name.starts_with("cw.") || !flags.is_empty(), "{}: no flags", c.name);
        }
    }
}
