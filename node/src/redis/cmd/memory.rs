//! MEMORY USAGE key [SAMPLES count] | STATS | HELP
//!
//! MEMORY USAGE answers the bytes the key takes at one replica (this
//! node's, if it holds the key's partition, else the head's): its packed
//! entry and its share of the partition's table, plus versions kept for
//! snapshots (`core::store`); nil for a missing, expired or deleted key.
//! SAMPLES is accepted and ignored (the size is exact, not sampled).
//! MEMORY STATS lists what INFO memory says. Another subcommand is refused
//! in `mod.rs`.

use super::{upper, Outcome, Subcommand};
use crate::redis::conn::{client_error, Conn};
use bytes::Bytes;
use causeway_core::driver::{Request, Response};
use causeway_resp::Frame;

/// Arities as Redis 7 states them, counting MEMORY.
pub const SUBCOMMANDS: &[Subcommand] =
    &[Subcommand { name: "usage", arity: -3 }, Subcommand { name: "stats", arity: 2 }, Subcommand { name: "help", arity: 2 }];

pub async fn run(conn: &mut Conn, args: Vec<Bytes>) -> Outcome {
    match upper(&args[1]).as_str() {
        "USAGE" => {
            let samples =
                args.len() == 5 && upper(&args[3]) == "SAMPLES" && std::str::from_utf8(&args[4]).is_ok_and(|n| n.parse::<u64>().is_ok());
            if args.len() != 3 && !samples {
                return Frame::error("ERR syntax error").into();
            }
            match conn.run(Request::MemoryUsage(args[2].clone())).await {
                Ok(Response::Memory(Some(bytes))) => Frame::Integer(bytes as i64),
                Ok(_) => Frame::Null,
                Err(e) => client_error(e),
            }
        }
        "STATS" => {
            let fields = super::info::memory_fields(&conn.node.status());
            Frame::Array(fields.into_iter().flat_map(|(k, v)| [Frame::Bulk(Bytes::from(k)), Frame::Bulk(Bytes::from(v))]).collect())
        }
        "HELP" => Frame::Array(
            [
                "MEMORY <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
                "STATS",
                "    Return information about the memory usage of the server.",
                "USAGE <key> [SAMPLES <count>]",
                "    Return memory in bytes used by <key> and its value.",
            ]
            .into_iter()
            .map(|l| Frame::Simple(l.into()))
            .collect(),
        ),
        other => unreachable!("MEMORY {other} is not in SUBCOMMANDS"),
    }
    .into()
}
