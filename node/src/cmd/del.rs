//! DEL key [key ...]
//!
//! Deletes each key that exists (a tombstone written only if the head finds
//! a live value) and replies with how many did, or with the first error
//! (the other keys are still tried). Without a key: the arity error.

use super::{count, own, Batch};
use bytes::Bytes;
use causeway_core::driver::{Request, Response};
use causeway_core::message::Condition;
use causeway_resp::Frame;

/// One conditional delete per key, in order.
pub fn parse(args: &[Bytes]) -> Result<Batch, Frame> {
    let requests = args[1..].iter().map(|key| Request::Put { key: own(key), value: None, ttl_ms: None, condition: Condition::IfPresent });
    Batch::new(requests.collect(), |_, responses| count(responses, |r| matches!(r, Response::Written(true))))
}
