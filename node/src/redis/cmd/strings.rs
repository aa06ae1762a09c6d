//! String commands that are a read or a write the session already runs,
//! answered another way:
//!
//! * GETDEL key: the value (null if none), and the key deleted (a delete
//!   that asks for the old value, decided at the head).
//! * GETSET key value: SET key value GET (the expiry is dropped, as SET
//!   does).
//! * STRLEN key: the value's length, 0 for a missing key.
//! * TYPE key: `string`, or `none` for a missing key (Causeway keeps only
//!   strings).
//! * MSET key value [key value ...]: one SET per pair, `+OK` once all are
//!   written, or the first error. Not atomic as Redis's: each key is its
//!   own write (a reader may see some of the pairs before the others), in
//!   order on the session. An odd number of arguments is the arity error.
//!
//! Arity as Redis states it, checked in `mod.rs`.

use super::{only, own, own_both, wrong_arity, Batch};
use crate::redis::conn::client_error;
use crate::runtime::Clock;
use bytes::Bytes;
use causeway_core::driver::{Request, Response};
use causeway_core::message::{Change, Condition, Expiry, NewValue};
use causeway_resp::Frame;

/// A reply of the value a change replaced (GETDEL, GETSET).
fn replaced(responses: super::Responses) -> Frame {
    match only(responses) {
        Ok(Response::Replaced { old: Some(v), .. }) => Frame::Bulk(v),
        Ok(_) => Frame::Null,
        Err(e) => client_error(e),
    }
}

pub fn getdel(args: &[Bytes], _: Clock) -> Result<Batch, Frame> {
    let change = Change { value: NewValue::Delete, expiry: Expiry::Never, condition: Condition::IfPresent, get: true };
    Batch::new(smallvec::smallvec![Request::Put { key: own(&args[1]), change }], |_, responses| replaced(responses))
}

pub fn getset(args: &[Bytes], _: Clock) -> Result<Batch, Frame> {
    let (key, value) = own_both(&args[1], &args[2]);
    let change = Change { get: true, ..Change::set(value) };
    Batch::new(smallvec::smallvec![Request::Put { key, change }], |_, responses| replaced(responses))
}

pub fn strlen(args: &[Bytes], _: Clock) -> Result<Batch, Frame> {
    Batch::new(smallvec::smallvec![Request::Get(args[1].clone())], |_, responses| match only(responses) {
        Ok(Response::Read { value, .. }) => Frame::Integer(value.map_or(0, |v| v.len() as i64)),
        Ok(_) => Frame::Integer(0),
        Err(e) => client_error(e),
    })
}

pub fn type_of(args: &[Bytes], _: Clock) -> Result<Batch, Frame> {
    Batch::new(smallvec::smallvec![Request::Get(args[1].clone())], |_, responses| match only(responses) {
        Ok(Response::Read { value: Some(_), .. }) => Frame::Simple("string".into()),
        Ok(_) => Frame::Simple("none".into()),
        Err(e) => client_error(e),
    })
}

pub fn mset(args: &[Bytes], _: Clock) -> Result<Batch, Frame> {
    if args.len().is_multiple_of(2) {
        return Err(wrong_arity("mset"));
    }
    let requests = args[1..].chunks(2).map(|kv| {
        let (key, value) = own_both(&kv[0], &kv[1]);
        Request::Put { key, change: Change::set(value) }
    });
    Batch::new(requests.collect(), |_, responses| {
        for response in responses {
            if let Err(e) = response {
                return client_error(e);
            }
        }
        Frame::ok()
    })
}

#[cfg(test)]
mod tests {
    use crate::redis::cmd::{requests, wrong_arity};
    use bytes::Bytes;
    use causeway_core::driver::Request;
    use causeway_core::message::{Change, Condition, Expiry, NewValue};

    #[test]
    fn each_is_the_read_or_write_it_answers_from() {
        let k = || Bytes::from("k");
        let getdel = Change { value: NewValue::Delete, expiry: Expiry::Never, condition: Condition::IfPresent, get: true };
        assert_eq!(requests(&["GETDEL", "k"]), Ok(vec![Request::Put { key: k(), change: getdel }]));
        let getset = Change { get: true, ..Change::set(Bytes::from("v")) };
        assert_eq!(requests(&["getset", "k", "v"]), Ok(vec![Request::Put { key: k(), change: getset }]));
        assert_eq!(requests(&["STRLEN", "k"]), Ok(vec![Request::Get(k())]));
        assert_eq!(requests(&["TYPE", "k"]), Ok(vec![Request::Get(k())]));
        let set = |key: &'static str, v: &'static str| Request::Put { key: Bytes::from(key), change: Change::set(Bytes::from(v)) };
        assert_eq!(requests(&["MSET", "a", "1", "b", "2"]), Ok(vec![set("a", "1"), set("b", "2")]));
    }

    #[test]
    fn mset_takes_pairs() {
        assert_eq!(requests(&["MSET", "a"]), Err(wrong_arity("mset")));
        assert_eq!(requests(&["MSET", "a", "1", "b"]), Err(wrong_arity("mset")));
    }
}
