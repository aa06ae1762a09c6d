//! EXISTS key [key ...]
//!
//! Replies with how many of the keys exist (repeats count again), or with
//! the first error. Without a key: the arity error.

use super::{count, own, Batch};
use bytes::Bytes;
use causeway_core::driver::{Request, Response};
use causeway_resp::Frame;

/// One read per key, in order.
pub fn parse(args: &[Bytes]) -> Result<Batch, Frame> {
    let requests = args[1..].iter().map(|key| Request::Get(own(key)));
    Batch::new(requests.collect(), |_, responses| count(responses, |r| matches!(r, Response::Read { value: Some(_), .. })))
}
