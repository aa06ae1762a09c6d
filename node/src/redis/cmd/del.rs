//! DEL key [key ...], UNLINK key [key ...] (the same: a delete frees
//! nothing more later)
//!
//! Deletes each key that exists (a tombstone written only if the head finds
//! a live value) and replies with how many did, or with the first error
//! (the other keys are still tried). Without a key: the arity error.

use super::{count, own, Batch};
use crate::runtime::Clock;
use bytes::Bytes;
use causeway_core::driver::{Request, Response};
use causeway_core::message::Change;
use causeway_resp::Frame;

/// One conditional delete per key, in order.
pub fn parse(args: &[Bytes], _: Clock) -> Result<Batch, Frame> {
    let requests = args[1..].iter().map(|key| Request::Put { key: own(key), change: Change::delete() });
    Batch::new(requests.collect(), |_, responses| count(responses, |r| matches!(r, Response::Written(true))))
}

#[cfg(test)]
mod tests {
    use crate::redis::cmd::{requests, wrong_arity};
    use bytes::Bytes;
    use causeway_core::driver::Request;
    use causeway_core::message::Change;

    #[test]
    fn each_key_is_a_delete_if_present() {
        let delete = |k: &'static str| Request::Put { key: Bytes::from(k), change: Change::delete() };
        assert_eq!(requests(&["DEL", "a", "b", "a"]), Ok(vec![delete("a"), delete("b"), delete("a")]));
    }

    #[test]
    fn at_least_one_key() {
        assert_eq!(requests(&["DEL"]), Err(wrong_arity("del")));
    }
}
