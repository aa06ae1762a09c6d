//! Listing keys, read at each partition's head (which holds every write
//! of its chain), expired keys left out:
//!
//! * KEYS pattern: every key of the site matching a glob-style pattern
//!   (`*`, `?`, `[a-z]`, `[^a]`, `\x`), as an array in no set order. It
//!   reads the whole keyspace, as Redis's does: for a large site, SCAN.
//! * SCAN cursor [MATCH pattern] [COUNT count] [TYPE type]: the cursor is
//!   the partition read next (0 to start); each call returns the matching
//!   keys of one partition and the cursor of the next, `0` once all were
//!   read. COUNT is a hint, as in Redis, and is not used: a call returns a
//!   whole partition, however large. Every key present for the whole scan
//!   is returned. TYPE `string` keeps every key (Causeway keeps only
//!   strings); any other type none. Errors as Redis's: `ERR invalid
//!   cursor`, a COUNT that is not a positive integer, an unknown option
//!   (`ERR syntax error`).
//! * RANDOMKEY: a key of the site at random, null if it is empty (one key
//!   of each partition is drawn at random, then one of those).

use super::{integer, only, Batch};
use crate::redis::conn::client_error;
use crate::redis::server::Server;
use crate::runtime::Clock;
use bytes::Bytes;
use causeway_core::driver::{KeyScope, Request, Response};
use causeway_resp::Frame;

pub fn keys(args: &[Bytes], _: Clock) -> Result<Batch, Frame> {
    let pattern = Some(args[1].clone()).filter(|p| p.as_ref() != b"*");
    Batch::new(smallvec::smallvec![Request::Keys { pattern, scope: KeyScope::All }], |_, responses| match only(responses) {
        Ok(Response::Keys { keys, .. }) => Frame::Array(keys.into_iter().map(Frame::Bulk).collect()),
        Ok(other) => unreachable!("KEYS answered {other:?}"),
        Err(e) => client_error(e),
    })
}

pub fn scan(args: &[Bytes], _: Clock) -> Result<Batch, Frame> {
    let cursor =
        std::str::from_utf8(&args[1]).ok().and_then(|c| c.parse::<u64>().ok()).ok_or_else(|| Frame::error("ERR invalid cursor"))?;
    let mut pattern = None;
    let mut strings = true;
    for option in args[2..].chunks(2) {
        let [name, value] = option else { return Err(Frame::error("ERR syntax error")) };
        match name.to_ascii_lowercase().as_slice() {
            b"match" => pattern = Some(value.clone()).filter(|p| p.as_ref() != b"*"),
            b"count" => {
                if integer(value)? < 1 {
                    return Err(Frame::error("ERR syntax error"));
                }
            }
            b"type" => strings = value.eq_ignore_ascii_case(b"string"),
            _ => return Err(Frame::error("ERR syntax error")),
        }
    }
    let request = Request::Keys { pattern, scope: KeyScope::Cursor(cursor) };
    Batch::new(smallvec::smallvec![request], if strings { scanned } else { scanned_none })
}

/// A SCAN reply: the next cursor and the keys.
fn scanned(_: &Server, responses: super::Responses) -> Frame {
    match only(responses) {
        Ok(Response::Keys { keys, cursor }) => {
            Frame::Array(vec![Frame::Bulk(Bytes::from(cursor.to_string())), Frame::Array(keys.into_iter().map(Frame::Bulk).collect())])
        }
        Ok(other) => unreachable!("SCAN answered {other:?}"),
        Err(e) => client_error(e),
    }
}

/// A SCAN for a type Causeway does not keep: the cursor goes on, no keys.
fn scanned_none(server: &Server, responses: super::Responses) -> Frame {
    match scanned(server, responses) {
        Frame::Array(mut reply) if reply.len() == 2 => {
            reply[1] = Frame::Array(Vec::new());
            Frame::Array(reply)
        }
        error => error,
    }
}

pub fn randomkey(_: &[Bytes], _: Clock) -> Result<Batch, Frame> {
    Batch::new(smallvec::smallvec![Request::Keys { pattern: None, scope: KeyScope::Random }], |_, responses| match only(responses) {
        Ok(Response::Keys { keys, .. }) if keys.is_empty() => Frame::Null,
        Ok(Response::Keys { mut keys, .. }) => {
            let at = random_below(keys.len());
            Frame::Bulk(keys.swap_remove(at))
        }
        Ok(other) => unreachable!("RANDOMKEY answered {other:?}"),
        Err(e) => client_error(e),
    })
}

/// A number below `n` (n > 0), from the clock's nanoseconds mixed: enough
/// for picking a key, which needs no stronger randomness.
fn random_below(n: usize) -> usize {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let mixed = nanos.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    ((mixed >> 32) % n as u64) as usize
}

#[cfg(test)]
mod tests {
    use crate::redis::cmd::requests;
    use bytes::Bytes;
    use causeway_core::driver::{KeyScope, Request};
    use causeway_resp::Frame;

    #[test]
    fn each_lists_keys_of_its_scope() {
        let keys = |pattern: Option<&'static str>, scope| Request::Keys { pattern: pattern.map(Bytes::from), scope };
        assert_eq!(requests(&["KEYS", "*"]), Ok(vec![keys(None, KeyScope::All)]));
        assert_eq!(requests(&["keys", "user:*"]), Ok(vec![keys(Some("user:*"), KeyScope::All)]));
        assert_eq!(requests(&["SCAN", "0"]), Ok(vec![keys(None, KeyScope::Cursor(0))]));
        assert_eq!(
            requests(&["SCAN", "7", "MATCH", "a?", "COUNT", "100", "TYPE", "string"]),
            Ok(vec![keys(Some("a?"), KeyScope::Cursor(7))])
        );
        assert_eq!(requests(&["RANDOMKEY"]), Ok(vec![keys(None, KeyScope::Random)]));
    }

    #[test]
    fn scan_refuses_what_redis_refuses() {
        let err = |s: &str| Err(Frame::error(s));
        assert_eq!(requests(&["SCAN", "x"]), err("ERR invalid cursor"));
        assert_eq!(requests(&["SCAN", "-1"]), err("ERR invalid cursor"));
        assert_eq!(requests(&["SCAN", "0", "COUNT", "0"]), err("ERR syntax error"));
        assert_eq!(requests(&["SCAN", "0", "COUNT", "x"]), err("ERR value is not an integer or out of range"));
        assert_eq!(requests(&["SCAN", "0", "MATCH"]), err("ERR syntax error"));
        assert_eq!(requests(&["SCAN", "0", "LIMIT", "3"]), err("ERR syntax error"));
    }
}
