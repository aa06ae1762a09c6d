//! CLIENT SETNAME name | GETNAME | ID | SETINFO attribute value
//!
//! What client libraries send on connect. SETINFO is accepted and
//! forgotten. Another subcommand, or the wrong number of arguments for one:
//! `ERR unknown subcommand or wrong number of arguments for '...'`.

use super::{upper, Outcome};
use crate::conn::Conn;
use bytes::Bytes;
use causeway_resp::Frame;

pub async fn run(conn: &mut Conn, args: Vec<Bytes>) -> Outcome {
    match (upper(&args[1]).as_str(), args.len()) {
        ("SETNAME", 3) => {
            conn.name = Some(String::from_utf8_lossy(&args[2]).into_owned());
            Frame::ok()
        }
        ("GETNAME", 2) => conn.name.clone().map_or(Frame::Null, |n| Frame::Bulk(n.into())),
        ("ID", 2) => Frame::Integer((conn.id() & 0xFFFF_FFFF_FFFF) as i64),
        ("SETINFO", 4) => Frame::ok(),
        _ => Frame::error(format!("ERR unknown subcommand or wrong number of arguments for '{}'", String::from_utf8_lossy(&args[1]))),
    }
    .into()
}
