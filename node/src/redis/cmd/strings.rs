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
//! * SETNX key value: SET key value NX, replying 1 if it set the key, 0
//!   if not.
//! * APPEND key value, SETRANGE key offset value: the new value computed
//!   at the key's head from the one it holds (`NewValue::Append`,
//!   `NewValue::SetRange`: concurrent appends in a site all count, as
//!   increments do); the reply is the new length. The key keeps its
//!   expiry. SETRANGE pads with zero bytes, writes nothing for an empty
//!   value, and refuses a negative offset (`ERR offset is out of range`)
//!   and a value past 128 MiB (`ERR string exceeds maximum allowed size
//!   (proto-max-bulk-len)`), as APPEND does.
//! * INCRBYFLOAT key increment: the key's number plus the increment,
//!   computed at the head (`NewValue::AddFloat`), replied as the value
//!   written: the shortest decimal that reads back as the same double
//!   (Redis computes in long double: the last digits of a long fraction
//!   may differ). `ERR value is not a valid float` for an increment or a
//!   value that is no number, `ERR increment would produce NaN or
//!   Infinity`.
//! * GETRANGE key start end: the bytes from start to end, both included,
//!   negative counting from the end, as Redis clamps them; `""` for a
//!   missing key.
//!
//! Arity as Redis states it, checked in `mod.rs`.

use super::{integer, only, own, own_both, wrong_arity, Batch};
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

pub fn setnx(args: &[Bytes], _: Clock) -> Result<Batch, Frame> {
    let (key, value) = own_both(&args[1], &args[2]);
    let change = Change { condition: Condition::IfAbsent, ..Change::set(value) };
    Batch::new(smallvec::smallvec![Request::Put { key, change }], |_, responses| match only(responses) {
        Ok(Response::Written(w)) => Frame::Integer(w as i64),
        Ok(other) => unreachable!("SETNX answered {other:?}"),
        Err(e) => client_error(e),
    })
}

/// A change the head computes from the key's value; the answer carries
/// what it made (`Decided::old`).
fn computed(key: &Bytes, value: NewValue) -> Request {
    Request::Put { key: own(key), change: Change { value, expiry: Expiry::Keep, condition: Condition::Always, get: true } }
}

/// The new length a computed change answers with.
fn new_length(responses: super::Responses) -> Frame {
    match only(responses) {
        Ok(Response::Replaced { old: Some(len), .. }) => {
            std::str::from_utf8(&len).ok().and_then(|s| s.parse().ok()).map_or_else(|| Frame::error("ERR bad length"), Frame::Integer)
        }
        Ok(other) => Frame::error(format!("ERR unexpected answer to a string change: {other:?}")),
        Err(e) => client_error(e),
    }
}

pub fn append(args: &[Bytes], _: Clock) -> Result<Batch, Frame> {
    let request = computed(&args[1], NewValue::Append(own(&args[2])));
    Batch::new(smallvec::smallvec![request], |_, responses| new_length(responses))
}

pub fn setrange(args: &[Bytes], _: Clock) -> Result<Batch, Frame> {
    let offset = integer(&args[2])?;
    if offset < 0 {
        return Err(Frame::error("ERR offset is out of range"));
    }
    if offset as u64 + args[3].len() as u64 > causeway_core::chain::change::MAX_VALUE_BYTES as u64 && !args[3].is_empty() {
        return Err(Frame::error("ERR string exceeds maximum allowed size (proto-max-bulk-len)"));
    }
    let request = computed(&args[1], NewValue::SetRange(offset as u64, own(&args[3])));
    Batch::new(smallvec::smallvec![request], |_, responses| new_length(responses))
}

pub fn incrbyfloat(args: &[Bytes], _: Clock) -> Result<Batch, Frame> {
    let by = causeway_core::chain::change::float(&args[2]).ok_or_else(|| Frame::error("ERR value is not a valid float"))?;
    if by.is_infinite() {
        return Err(Frame::error("ERR increment would produce NaN or Infinity"));
    }
    let request = computed(&args[1], NewValue::AddFloat(by.to_bits()));
    Batch::new(smallvec::smallvec![request], |_, responses| match only(responses) {
        Ok(Response::Replaced { old: Some(v), .. }) => Frame::Bulk(v),
        Ok(other) => Frame::error(format!("ERR unexpected answer to an increment: {other:?}")),
        Err(e) => client_error(e),
    })
}

pub fn getrange(args: &[Bytes], _: Clock) -> Result<Batch, Frame> {
    let range = [integer(&args[2])?, integer(&args[3])?];
    Batch::with(smallvec::smallvec![Request::Get(args[1].clone())], range, |_, responses, [start, end]| match only(responses) {
        Ok(Response::Read { value: Some(v), .. }) => Frame::Bulk(substring(&v, start, end)),
        Ok(_) => Frame::Bulk(Bytes::new()),
        Err(e) => client_error(e),
    })
}

/// GETRANGE's bytes of `v`, as Redis clamps the range.
fn substring(v: &Bytes, start: i64, end: i64) -> Bytes {
    let len = v.len() as i64;
    if len == 0 || (start < 0 && end < 0 && start > end) {
        return Bytes::new();
    }
    let start = if start < 0 { (len + start).max(0) } else { start };
    let end = if end < 0 { (len + end).max(0) } else { end.min(len - 1) };
    if start > end || start >= len {
        return Bytes::new();
    }
    v.slice(start as usize..=end as usize)
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
    fn getrange_clamps_as_redis_does() {
        let v = Bytes::from("This is a string");
        let r = |a, b| super::substring(&v, a, b);
        assert_eq!(r(0, 3), "This");
        assert_eq!(r(-3, -1), "ing");
        assert_eq!(r(0, -1), "This is a string");
        assert_eq!(r(10, 100), "string");
        assert_eq!(r(5, 2), "");
        assert_eq!(r(-1, -5), "");
        assert_eq!(r(-100, 3), "This");
        assert_eq!(r(100, 200), "");
        assert_eq!(super::substring(&Bytes::new(), 0, -1), "");
    }

    #[test]
    fn computed_changes_check_their_arguments() {
        use causeway_resp::Frame;
        let err = |s: &str| Err(Frame::error(s));
        assert_eq!(requests(&["SETRANGE", "k", "-1", "x"]), err("ERR offset is out of range"));
        assert_eq!(requests(&["SETRANGE", "k", "x", "x"]), err("ERR value is not an integer or out of range"));
        assert_eq!(requests(&["SETRANGE", "k", "134217728", "x"]), err("ERR string exceeds maximum allowed size (proto-max-bulk-len)"));
        assert_eq!(requests(&["INCRBYFLOAT", "k", "abc"]), err("ERR value is not a valid float"));
        assert_eq!(requests(&["INCRBYFLOAT", "k", "inf"]), err("ERR increment would produce NaN or Infinity"));
        assert_eq!(requests(&["GETRANGE", "k", "0", "x"]), err("ERR value is not an integer or out of range"));
    }

    #[test]
    fn mset_takes_pairs() {
        assert_eq!(requests(&["MSET", "a"]), Err(wrong_arity("mset")));
        assert_eq!(requests(&["MSET", "a", "1", "b"]), Err(wrong_arity("mset")));
    }
}
