//! TTL key, PTTL key, EXPIRETIME key, PEXPIRETIME key
//!
//! Reply with the time to live in seconds (rounded) or milliseconds, or the
//! expiry as a Unix time in seconds or milliseconds: -2 when the key holds
//! no value, -1 when it does and does not expire, as in Redis 7. A read at
//! the session's level (it sees the session's own writes), timed by this
//! node's clock.

use super::{only, own, Batch, Responses};
use crate::conn::client_error;
use crate::server::{now_ms, Node};
use bytes::Bytes;
use causeway_core::driver::{Request, Response};
use causeway_resp::Frame;

/// TTL, PTTL, EXPIRETIME or PEXPIRETIME (`args[0]`): one read.
pub fn parse(args: &[Bytes]) -> Result<Batch, Frame> {
    let answer = match String::from_utf8_lossy(&args[0]).to_ascii_lowercase().as_str() {
        "ttl" => ttl,
        "pttl" => pttl,
        "expiretime" => expiretime,
        _ => pexpiretime,
    };
    Batch::new(vec![Request::Get(own(&args[1]))], answer)
}

fn ttl(_: &Node, r: Responses) -> Frame {
    reply(only(r), |at| (at.saturating_sub(now_ms()) as i64 + 500) / 1000)
}

fn pttl(_: &Node, r: Responses) -> Frame {
    reply(only(r), |at| at.saturating_sub(now_ms()) as i64)
}

fn expiretime(_: &Node, r: Responses) -> Frame {
    reply(only(r), |at| (at / 1000) as i64)
}

fn pexpiretime(_: &Node, r: Responses) -> Frame {
    reply(only(r), |at| at as i64)
}

fn reply(response: Result<Response, causeway_core::error::Error>, of: impl Fn(u64) -> i64) -> Frame {
    match response {
        Ok(Response::Read { value: None, .. }) => Frame::Integer(-2),
        Ok(Response::Read { expires_at_ms: None, .. }) => Frame::Integer(-1),
        Ok(Response::Read { expires_at_ms: Some(at), .. }) => Frame::Integer(of(at)),
        Ok(other) => unreachable!("a read answered {other:?}"),
        Err(e) => client_error(e),
    }
}
