//! OBJECT ENCODING key | REFCOUNT key | HELP
//!
//! What tools ask of a key (redis-cli --memkeys, GUIs). ENCODING is the
//! encoding Redis would give the value (`int` for an integer Redis would
//! parse of at most 20 characters, `embstr` up to 44 bytes, `raw` beyond:
//! Causeway keeps every value as its bytes); REFCOUNT is 1. Both are nil
//! for a missing key. IDLETIME and FREQ are not kept per key where a
//! client can read them: `ERR unknown subcommand` (in `mod.rs`).

use super::{upper, Outcome, Subcommand};
use crate::redis::conn::{client_error, Conn};
use bytes::Bytes;
use causeway_core::driver::{Request, Response};
use causeway_resp::Frame;

/// Arities as Redis 7 states them, counting OBJECT.
pub const SUBCOMMANDS: &[Subcommand] =
    &[Subcommand { name: "encoding", arity: 3 }, Subcommand { name: "refcount", arity: 3 }, Subcommand { name: "help", arity: 2 }];

pub async fn run(conn: &mut Conn, args: Vec<Bytes>) -> Outcome {
    let sub = upper(&args[1]);
    if sub == "HELP" {
        let lines = [
            "OBJECT <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
            "ENCODING <key>",
            "    Return the kind of internal representation the Redis object stored at <key> would use.",
            "REFCOUNT <key>",
            "    Return the reference count of the object stored at <key> (always 1).",
            "HELP",
            "    Print this help.",
        ];
        return Frame::Array(lines.iter().map(|&l| Frame::Simple(l.into())).collect()).into();
    }
    match conn.run(Request::Get(args[2].clone())).await {
        Ok(Response::Read { value: Some(v), .. }) if sub == "ENCODING" => Frame::Bulk(Bytes::from_static(encoding(&v).as_bytes())),
        Ok(Response::Read { value: Some(_), .. }) => Frame::Integer(1),
        Ok(_) => Frame::Null,
        Err(e) => client_error(e),
    }
    .into()
}

/// The encoding Redis 7 gives a string value.
fn encoding(v: &[u8]) -> &'static str {
    let integer = v.len() <= 20 && std::str::from_utf8(v).ok().is_some_and(|s| s.parse::<i64>().is_ok_and(|n| n.to_string() == s));
    match v.len() {
        _ if integer => "int",
        0..=44 => "embstr",
        _ => "raw",
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn encodings_are_redis_s() {
        assert_eq!(super::encoding(b"12345"), "int");
        assert_eq!(super::encoding(b"-7"), "int");
        assert_eq!(super::encoding(b"007"), "embstr", "not as Redis would parse it");
        assert_eq!(super::encoding(b"hello"), "embstr");
        assert_eq!(super::encoding(&[b'x'; 44]), "embstr");
        assert_eq!(super::encoding(&[b'x'; 45]), "raw");
    }
}
