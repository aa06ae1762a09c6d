//! TTL key, PTTL key, EXPIRETIME key, PEXPIRETIME key
//!
//! Reply with the time to live in seconds or milliseconds, or the expiry as
//! a Unix time in seconds or milliseconds: -2 when the key holds no value,
//! -1 when it does and does not expire, as in Redis 7. Seconds are rounded
//! to the nearest, for TTL and EXPIRETIME alike (Redis's
//! `ttlGenericCommand`: `(ttl+500)/1000`). A read at
//! the session's level (it sees the session's own writes), timed by this
//! node's clock.

use super::{only, own, Batch, Responses};
use crate::redis::conn::client_error;
use crate::redis::server::Server;
use crate::runtime::Clock;
use bytes::Bytes;
use causeway_core::driver::{Request, Response};
use causeway_resp::Frame;

/// TTL, PTTL, EXPIRETIME or PEXPIRETIME (`args[0]`): one read.
pub fn parse(args: &[Bytes], _: Clock) -> Result<Batch, Frame> {
    let answer = match String::from_utf8_lossy(&args[0]).to_ascii_lowercase().as_str() {
        "ttl" => ttl,
        "pttl" => pttl,
        "expiretime" => expiretime,
        _ => pexpiretime,
    };
    Batch::new(smallvec::smallvec![Request::Get(own(&args[1]))], answer)
}

fn ttl(server: &Server, r: Responses) -> Frame {
    reply(only(r), |at| seconds(at.saturating_sub(server.clock.now_ms())))
}

fn pttl(server: &Server, r: Responses) -> Frame {
    reply(only(r), |at| at.saturating_sub(server.clock.now_ms()) as i64)
}

fn expiretime(_: &Server, r: Responses) -> Frame {
    reply(only(r), seconds)
}

fn pexpiretime(_: &Server, r: Responses) -> Frame {
    reply(only(r), |at| at as i64)
}

/// Milliseconds as seconds, rounded to the nearest as Redis does.
fn seconds(ms: u64) -> i64 {
    (ms.saturating_add(500) / 1000) as i64
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

#[cfg(test)]
mod tests {
    use super::{reply, seconds};
    use bytes::Bytes;
    use causeway_core::driver::Response;
    use causeway_resp::Frame;

    fn read(value: Option<&'static str>, expires_at_ms: Option<u64>) -> Response {
        Response::Read { value: value.map(Bytes::from), chain_index: 0, expires_at_ms }
    }

    #[test]
    fn seconds_round_to_the_nearest() {
        assert_eq!([0, 499, 500, 1_499, 1_500, 10_000].map(seconds), [0, 0, 1, 1, 2, 10]);
    }

    /// Redis 7.0 answers `PEXPIREAT k 1795696701600` then `EXPIRETIME k`
    /// with 1795696702: rounded, not cut.
    #[test]
    fn expiretime_rounds_like_ttl() {
        assert_eq!(reply(Ok(read(Some("v"), Some(1_795_696_701_600))), seconds), Frame::Integer(1_795_696_702));
        assert_eq!(reply(Ok(read(Some("v"), Some(1_795_696_701_499))), seconds), Frame::Integer(1_795_696_701));
    }

    #[test]
    fn missing_key_and_no_expiry() {
        assert_eq!(reply(Ok(read(None, None)), seconds), Frame::Integer(-2));
        assert_eq!(reply(Ok(read(Some("v"), None)), seconds), Frame::Integer(-1));
    }
}
