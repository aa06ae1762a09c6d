//! MGET key [key ...]
//!
//! Replies with an array holding each key's value, or a null for an absent
//! key. Without a key: the arity error.

use super::{only, own, Batch};
use crate::redis::conn::client_error;
use crate::runtime::Clock;
use bytes::Bytes;
use causeway_core::driver::{Request, Response};
use causeway_resp::Frame;

/// One get-transaction, not one read per key, so the values form a
/// causally consistent snapshot (ChainReaction §3.5).
pub fn parse(args: &[Bytes], _: Clock) -> Result<Batch, Frame> {
    let keys = args[1..].iter().map(own).collect();
    Batch::new(smallvec::smallvec![Request::MultiGet(keys)], |_, responses| match only(responses) {
        Ok(Response::Values(values)) => Frame::Array(values.into_iter().map(|v| v.map_or(Frame::Null, Frame::Bulk)).collect()),
        Ok(other) => unreachable!("MGET answered {other:?}"),
        Err(e) => client_error(e),
    })
}

#[cfg(test)]
mod tests {
    use crate::redis::cmd::{requests, wrong_arity};
    use bytes::Bytes;
    use causeway_core::driver::Request;

    #[test]
    fn all_keys_are_one_get_transaction() {
        let keys = ["a", "b", "a"].map(Bytes::from).to_vec();
        assert_eq!(requests(&["MGET", "a", "b", "a"]), Ok(vec![Request::MultiGet(keys)]));
    }

    #[test]
    fn at_least_one_key() {
        assert_eq!(requests(&["MGET"]), Err(wrong_arity("mget")));
    }
}
