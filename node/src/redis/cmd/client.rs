//! CLIENT SETNAME name | GETNAME | ID | SETINFO attribute value
//!
//! What client libraries send on connect. SETNAME takes a name of
//! printable characters without spaces (else Redis's error), and an empty
//! one clears it. SETINFO is accepted and forgotten. Another subcommand is `ERR unknown subcommand '...' for
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

/// Names the connection (CLIENT SETNAME, HELLO SETNAME), as Redis checks
/// the name: no spaces, newlines or other characters outside `!`..=`~`;
/// an empty name clears it.
pub fn set_name(conn: &mut Conn, name: &[u8]) -> Result<(), Frame> {
    if name.iter().any(|&c| !(b'!'..=b'~').contains(&c)) {
        return Err(Frame::error("ERR Client names cannot contain spaces, newlines or special characters."));
    }
    conn.name = (!name.is_empty()).then(|| String::from_utf8_lossy(name).into_owned());
    Ok(())
}

pub async fn run(conn: &mut Conn, args: Vec<Bytes>) -> Outcome {
    match upper(&args[1]).as_str() {
        "SETNAME" => match set_name(conn, &args[2]) {
            Ok(()) => Frame::ok(),
            Err(e) => e,
        },
        "GETNAME" => conn.name.clone().map_or(Frame::Null, |n| Frame::Bulk(n.into())),
        "ID" => Frame::Integer((conn.id() & 0xFFFF_FFFF_FFFF) as i64),
        "SETINFO" => Frame::ok(),
        other => unreachable!("CLIENT {other} is not in SUBCOMMANDS"),
    }
    .into()
}
