//! CONFIG GET pattern | SET ...
//!
//! CONFIG GET answers with no parameters (Causeway is configured by flags,
//! not at run time), which is what tools such as redis-benchmark need;
//! CONFIG SET is refused. Another subcommand, or GET without a pattern:
//! `ERR unknown subcommand or wrong number of arguments for '...'`.

use super::{upper, Outcome};
use crate::conn::Conn;
use bytes::Bytes;
use causeway_resp::Frame;

pub async fn run(_conn: &mut Conn, args: Vec<Bytes>) -> Outcome {
    match (upper(&args[1]).as_str(), args.len()) {
        ("GET", n) if n >= 3 => Frame::Map(Vec::new()),
        ("SET", _) => Frame::error("ERR CONFIG SET is not supported: Causeway is configured by flags or its TOML file"),
        _ => Frame::error(format!("ERR unknown subcommand or wrong number of arguments for '{}'", String::from_utf8_lossy(&args[1]))),
    }
    .into()
}
