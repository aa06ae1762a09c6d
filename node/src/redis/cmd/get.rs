//! GET key
//!
//! Replies with the value as a bulk string, or a null when the key is
//! absent (counted in INFO's keyspace hits and misses). Any other number of
//! arguments is refused by the arity check in `mod.rs`.

use super::{only, Batch};
use crate::redis::conn::client_error;
use crate::runtime::Clock;
use bytes::Bytes;
use causeway_core::driver::{Request, Response};
use causeway_resp::Frame;
use std::sync::atomic::Ordering::Relaxed;

/// GET key: one read on the session. The key stays a slice of the
/// connection's read buffer (a read holds it only while it runs; the
/// session copies what it keeps).
pub fn parse(args: &[Bytes], _: Clock) -> Result<Batch, Frame> {
    Batch::new(smallvec::smallvec![Request::Get(args[1].clone())], |server, responses| match only(responses) {
        Ok(Response::Read { value: Some(v), .. }) => {
            server.stats.keyspace_hits.fetch_add(1, Relaxed);
            Frame::Bulk(v)
        }
        Ok(_) => {
            server.stats.keyspace_misses.fetch_add(1, Relaxed);
            Frame::Null
        }
        Err(e) => client_error(e),
    })
}

#[cfg(test)]
mod tests {
    use crate::redis::cmd::{requests, wrong_arity};
    use bytes::Bytes;
    use causeway_core::driver::Request;

    #[test]
    fn one_key_is_one_read() {
        assert_eq!(requests(&["GET", "k"]), Ok(vec![Request::Get(Bytes::from("k"))]));
    }

    #[test]
    fn exactly_one_key() {
        assert_eq!(requests(&["GET"]), Err(wrong_arity("get")));
        assert_eq!(requests(&["get", "a", "b"]), Err(wrong_arity("get")));
    }
}
