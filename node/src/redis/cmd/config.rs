//! CONFIG GET pattern | SET parameter value ... | RESETSTAT
//!
//! CONFIG GET answers with no parameters (Causeway is configured by flags,
//! not at run time), which is what tools such as redis-benchmark need;
//! CONFIG SET is refused. CONFIG RESETSTAT starts INFO's counters afresh
//! (commandstats, errorstats, latencystats and those in stats), as Redis
//! does; connected_clients stays. Another subcommand is
//! `ERR unknown subcommand '...' for 'config'`, and the wrong number of
//! arguments for one is `ERR wrong number of arguments for 'config|get'
//! command`, as Redis 7 names it (both answered in `mod.rs` before this
//! runs).

use super::{upper, Outcome, Subcommand};
use crate::redis::conn::Conn;
use bytes::Bytes;
use causeway_resp::Frame;

/// Arities as Redis 7 states them, counting CONFIG.
pub const SUBCOMMANDS: &[Subcommand] =
    &[Subcommand { name: "get", arity: -3 }, Subcommand { name: "set", arity: -4 }, Subcommand { name: "resetstat", arity: 2 }];

pub async fn run(conn: &mut Conn, args: Vec<Bytes>) -> Outcome {
    match upper(&args[1]).as_str() {
        "GET" => Frame::Map(Vec::new()),
        "SET" => Frame::error("ERR CONFIG SET is not supported: Causeway is configured by flags or its TOML file"),
        "RESETSTAT" => {
            conn.server.stats.reset();
            Frame::ok()
        }
        other => unreachable!("CONFIG {other} is not in SUBCOMMANDS"),
    }
    .into()
}
