//! EXISTS key [key ...], TOUCH key [key ...]
//!
//! Replies with how many of the keys exist (repeats count again), or with
//! the first error. Without a key: the arity error. TOUCH is the same read
//! (it counts as a use of the key where it is served, as any read does).

use super::{count, own, Batch};
use crate::runtime::Clock;
use bytes::Bytes;
use causeway_core::driver::{Request, Response};
use causeway_resp::Frame;

/// One read per key, in order.
pub fn parse(args: &[Bytes], _: Clock) -> Result<Batch, Frame> {
    let requests = args[1..].iter().map(|key| Request::Get(own(key)));
    Batch::new(requests.collect(), |_, responses| count(responses, |r| matches!(r, Response::Read { value: Some(_), .. })))
}

#[cfg(test)]
mod tests {
    use crate::redis::cmd::{requests, wrong_arity};
    use bytes::Bytes;
    use causeway_core::driver::Request;

    #[test]
    fn each_key_is_a_read_repeats_included() {
        let get = |k: &'static str| Request::Get(Bytes::from(k));
        assert_eq!(requests(&["EXISTS", "a", "a"]), Ok(vec![get("a"), get("a")]));
        assert_eq!(requests(&["EXISTS"]), Err(wrong_arity("exists")));
    }
}
