//! CLIENT SETNAME name | GETNAME | ID | SETINFO attribute value
//!
//! What client libraries send on connect. SETINFO is accepted and
//! forgotten. Another subcommand is `ERR unknown subcommand '...' for
//! 'client'`, and the wrong number of arguments for one is
//! `ERR wrong number of arguments for 'client|setname' command`, as Redis 7
//! names it (both answered in `mod.rs` before this runs).

use super::{upper, Outcome, Subcommand};
use crate::redis::conn::Conn;
use bytes::Bytes;
use causeway_resp::Frame;

/// Arities as Redis 7 states them, counting CLIENT.
pub const SUBCOMMANDS: &[Subcommand] = &[
    Subcommand { name: "setname", arity: 3 },
    Subcommand { name: "getname", arity: 2 },
    Subcommand { name: "id", arity: 2 },
    Subcommand { name: "setinfo", arity: 4 },
];

pub async fn run(conn: &mut Conn, args: Vec<Bytes>) -> Outcome {
    match upper(&args[1]).as_str() {
        "SETNAME" => {
            conn.name = Some(String::from_utf8_lossy(&args[2]).into_owned());
            Frame::ok()
        }
        "GETNAME" => conn.name.clone().map_or(Frame::Null, |n| Frame::Bulk(n.into())),
        "ID" => Frame::Integer((conn.id() & 0xFFFF_FFFF_FFFF) as i64),
        "SETINFO" => Frame::ok(),
        other => unreachable!("CLIENT {other} is not in SUBCOMMANDS"),
    }
    .into()
}
