//! COMMAND [COUNT | DOCS [name ...] | INFO [name ...]]
//!
//! The command table, as far as clients use it: every command's entry
//! (name, arity, flags, first key, last key, step), their count, no docs,
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
    Frame::Array(vec![
        Frame::Bulk(Bytes::from_static(c.name.as_bytes())),
        Frame::Integer(c.arity),
        Frame::Array(Vec::new()),
        Frame::Integer(if c.name.starts_with("cw.") || c.arity == 1 { 0 } else { 1 }),
        Frame::Integer(if c.arity == 1 { 0 } else { -1 }),
        Frame::Integer(1),
    ])
}
