//! INCR key, DECR key, INCRBY key increment, DECRBY key decrement
//!
//! Adds to the key's integer (a missing key counts as 0) and replies with
//! the result, decided at the key's head so that concurrent increments in
//! one site all count (`NewValue::Add`); the key keeps its expiry. A value
//! that is not an integer Redis would parse, or a result past 64 bits, is
//! Redis's error (`ERR value is not an integer or out of range`, `ERR
//! increment or decrement would overflow`), as is an increment that is not
//! an integer. Across sites, increments of one key at two sites at once
//! are concurrent writes: the last writer wins and one is lost (a counter
//! that merges is not built yet). Not on an erasure-coded site yet.

use super::{integer, only, own, Batch};
use crate::redis::conn::client_error;
use crate::runtime::Clock;
use bytes::Bytes;
use causeway_core::driver::{Request, Response};
use causeway_core::message::{Change, Condition, Expiry, NewValue};
use causeway_resp::Frame;

pub fn parse(args: &[Bytes], _: Clock) -> Result<Batch, Frame> {
    let by = match args[0].to_ascii_lowercase().as_slice() {
        b"incr" => 1,
        b"decr" => -1,
        b"incrby" => integer(&args[2])?,
        _ => integer(&args[2])?.checked_neg().ok_or_else(|| Frame::error("ERR decrement would overflow"))?,
    };
    // `get`: the answer carries what the head wrote.
    let change = Change { value: NewValue::Add(by), expiry: Expiry::Keep, condition: Condition::Always, get: true };
    Batch::new(smallvec::smallvec![Request::Put { key: own(&args[1]), change }], |_, responses| match only(responses) {
        // The head answers with the value it wrote.
        Ok(Response::Replaced { old: Some(v), .. }) => std::str::from_utf8(&v)
            .ok()
            .and_then(|s| s.parse::<i64>().ok())
            .map_or_else(|| Frame::error("ERR value is not an integer or out of range"), Frame::Integer),
        Ok(other) => Frame::error(format!("ERR unexpected answer to an increment: {other:?}")),
        Err(e) => client_error(e),
    })
}

#[cfg(test)]
mod tests {
    use crate::redis::cmd::{requests, wrong_arity};
    use bytes::Bytes;
    use causeway_core::driver::Request;
    use causeway_core::message::{Change, Condition, Expiry, NewValue};
    use causeway_resp::Frame;

    fn add(by: i64) -> Result<Vec<Request>, Frame> {
        // `get`: the answer carries what the head wrote.
        let change = Change { value: NewValue::Add(by), expiry: Expiry::Keep, condition: Condition::Always, get: true };
        Ok(vec![Request::Put { key: Bytes::from("k"), change }])
    }

    #[test]
    fn each_is_an_addition_at_the_head() {
        assert_eq!(requests(&["INCR", "k"]), add(1));
        assert_eq!(requests(&["decr", "k"]), add(-1));
        assert_eq!(requests(&["INCRBY", "k", "-7"]), add(-7));
        assert_eq!(requests(&["DECRBY", "k", "7"]), add(-7));
        assert_eq!(requests(&["INCRBY", "k", "x"]), Err(Frame::error("ERR value is not an integer or out of range")));
        assert_eq!(requests(&["DECRBY", "k", &i64::MIN.to_string()]), Err(Frame::error("ERR decrement would overflow")));
        assert_eq!(requests(&["INCR"]), Err(wrong_arity("incr")));
        assert_eq!(requests(&["INCRBY", "k"]), Err(wrong_arity("incrby")));
    }
}
