//! DBSIZE
//!
//! Replies with the live keys in the whole site, counted at each
//! partition's head.

use super::{only, Batch};
use crate::redis::conn::client_error;
use crate::runtime::Clock;
use bytes::Bytes;
use causeway_core::driver::{Request, Response};
use causeway_resp::Frame;

/// One count over every partition.
pub fn parse(_args: &[Bytes], _: Clock) -> Result<Batch, Frame> {
    Batch::new(smallvec::smallvec![Request::Count], |_, responses| match only(responses) {
        Ok(Response::Count(k)) => Frame::Integer(k.keys as i64),
        Ok(other) => unreachable!("DBSIZE answered {other:?}"),
        Err(e) => client_error(e),
    })
}
