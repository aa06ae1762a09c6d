//! SET key value [NX | XX] [GET] [EX seconds | PX milliseconds |
//! EXAT unix-seconds | PXAT unix-milliseconds | KEEPTTL]
//!
//! Replies `+OK` once written, or a null when NX or XX kept it from being
//! written; with GET, the value the key had (or a null) either way. The
//! head decides NX, XX, KEEPTTL and GET against what the key holds then
//! (`core::chain::change`). Bad input, as Redis answers it: an unknown or
//! conflicting option (NX with XX, two kinds of expiry, EX without its
//! number) is `ERR syntax error`; a number that is not an integer is
//! `ERR value is not an integer or out of range`; a time that is not
//! positive or whose instant overflows is
//! `ERR invalid expire time in 'set' command`. The number is checked after
//! the options, as Redis checks it.

use super::{expiry_in, only, own_both, syntax_error, upper, Batch, Responses};
use crate::redis::conn::client_error;
use crate::redis::server::Server;
use crate::runtime::Clock;
use bytes::Bytes;
use causeway_core::driver::{Request, Response};
use causeway_core::message::{Change, Condition, Expiry, NewValue};
use causeway_resp::Frame;

/// SET's arguments as one change on the session.
pub fn parse(args: &[Bytes], clock: Clock) -> Result<Batch, Frame> {
    let (key, value) = own_both(&args[1], &args[2]);
    let mut change = Change::set(value);
    // Which expiry option was given, if any, with its number (none for
    // KEEPTTL): the same one may repeat (the last counts), two kinds may
    // not. The number is read once every option is, as Redis reads it: a
    // syntax error comes before a bad number.
    let mut expiry: Option<(String, Option<&Bytes>)> = None;
    let mut i = 3;
    while i < args.len() {
        let opt = upper(&args[i]);
        let same = expiry.as_ref().is_none_or(|(o, _)| *o == opt);
        match opt.as_str() {
            "NX" if change.condition != Condition::IfPresent => change.condition = Condition::IfAbsent,
            "XX" if change.condition != Condition::IfAbsent => change.condition = Condition::IfPresent,
            "GET" => change.get = true,
            "KEEPTTL" if same => expiry = Some((opt, None)),
            "EX" | "PX" | "EXAT" | "PXAT" if same && i + 1 < args.len() => {
                expiry = Some((opt, Some(&args[i + 1])));
                i += 1;
            }
            _ => return Err(syntax_error()),
        }
        i += 1;
    }
    change.expiry = match expiry {
        None => Expiry::Never,
        Some((_, None)) => Expiry::Keep,
        Some((unit, Some(n))) => expiry_in(&unit, n, "set", clock)?,
    };
    debug_assert!(matches!(change.value, NewValue::Set(_)));
    let answer = if change.get { old } else { written };
    Batch::new(smallvec::smallvec![Request::Put { key, change }], answer)
}

/// `+OK`, or a null when the condition kept it from being written.
fn written(_: &Server, responses: Responses) -> Frame {
    match only(responses) {
        Ok(Response::Written(true)) => Frame::ok(),
        Ok(_) => Frame::Null,
        Err(e) => client_error(e),
    }
}

/// With GET: the value the key had.
fn old(_: &Server, responses: Responses) -> Frame {
    match only(responses) {
        Ok(Response::Replaced { old: Some(v), .. }) => Frame::Bulk(v),
        Ok(_) => Frame::Null,
        Err(e) => client_error(e),
    }
}

#[cfg(test)]
mod tests {
    use crate::redis::cmd::{requests, syntax_error, wrong_arity};
    use bytes::Bytes;
    use causeway_core::driver::Request;
    use causeway_core::message::{Change, Condition, Expiry};
    use causeway_resp::Frame;

    fn put(expiry: Expiry, condition: Condition) -> Result<Vec<Request>, Frame> {
        Ok(vec![Request::Put { key: Bytes::from("k"), change: Change { expiry, condition, ..Change::set(Bytes::from("v")) } }])
    }

    #[test]
    fn plain_set_always_writes_without_ttl() {
        assert_eq!(requests(&["SET", "k", "v"]), put(Expiry::Never, Condition::Always));
    }

    #[test]
    fn key_and_value_are_required() {
        assert_eq!(requests(&["SET"]), Err(wrong_arity("set")));
        assert_eq!(requests(&["SET", "k"]), Err(wrong_arity("set")));
    }

    #[test]
    fn nx_and_xx_set_the_condition_in_any_case_and_may_repeat() {
        assert_eq!(requests(&["SET", "k", "v", "NX"]), put(Expiry::Never, Condition::IfAbsent));
        assert_eq!(requests(&["SET", "k", "v", "xx"]), put(Expiry::Never, Condition::IfPresent));
        assert_eq!(requests(&["SET", "k", "v", "nx", "NX"]), put(Expiry::Never, Condition::IfAbsent));
    }

    #[test]
    fn nx_with_xx_is_a_syntax_error() {
        assert_eq!(requests(&["SET", "k", "v", "NX", "XX"]), Err(syntax_error()));
        assert_eq!(requests(&["SET", "k", "v", "XX", "NX"]), Err(syntax_error()));
    }

    #[test]
    fn every_kind_of_expiry() {
        assert_eq!(requests(&["SET", "k", "v", "EX", "10"]), put(Expiry::After(10_000), Condition::Always));
        assert_eq!(requests(&["SET", "k", "v", "px", "1500", "XX"]), put(Expiry::After(1500), Condition::IfPresent));
        assert_eq!(requests(&["SET", "k", "v", "EXAT", "1700000000"]), put(Expiry::At(1_700_000_000_000), Condition::Always));
        assert_eq!(requests(&["SET", "k", "v", "PXAT", "1700000000123"]), put(Expiry::At(1_700_000_000_123), Condition::Always));
        assert_eq!(requests(&["SET", "k", "v", "KEEPTTL"]), put(Expiry::Keep, Condition::Always));
        // The same option may repeat: the last one counts, as in Redis.
        assert_eq!(requests(&["SET", "k", "v", "EX", "1", "EX", "2"]), put(Expiry::After(2000), Condition::Always));
    }

    #[test]
    fn get_asks_for_the_old_value() {
        let Ok(batch) = crate::redis::cmd::queue(&["SET", "k", "v", "NX", "GET"]) else { panic!() };
        let [Request::Put { change, .. }] = &batch.requests[..] else { panic!() };
        assert!(change.get && change.condition == Condition::IfAbsent);
    }

    #[test]
    fn two_kinds_of_expiry_or_a_missing_number_is_a_syntax_error() {
        for words in [&["EX", "1", "PX", "1"][..], &["EX"], &["KEEPTTL", "EX", "1"], &["PXAT", "5", "KEEPTTL"], &["bogus"]] {
            let mut all = vec!["SET", "k", "v"];
            all.extend_from_slice(words);
            assert_eq!(requests(&all), Err(syntax_error()), "{words:?}");
        }
    }

    #[test]
    fn a_time_that_is_not_an_integer_is_refused() {
        let not_integer = Err(Frame::error("ERR value is not an integer or out of range"));
        assert_eq!(requests(&["SET", "k", "v", "EX", "ten"]), not_integer);
        assert_eq!(requests(&["SET", "k", "v", "PX", "1.5"]), not_integer);
    }

    /// Redis 7.0 reads the options before the number: `SET k v EX abc
    /// BOGUS` and `SET k v EX 0 BOGUS` are syntax errors.
    #[test]
    fn a_syntax_error_comes_before_a_bad_number() {
        assert_eq!(requests(&["SET", "k", "v", "EX", "abc", "BOGUS"]), Err(syntax_error()));
        assert_eq!(requests(&["SET", "k", "v", "EX", "0", "BOGUS"]), Err(syntax_error()));
        assert_eq!(requests(&["SET", "k", "v", "PX", "abc", "EX", "1"]), Err(syntax_error()));
    }

    #[test]
    fn a_time_that_is_not_positive_or_overflows_is_an_invalid_expire_time() {
        let invalid = Err(Frame::error("ERR invalid expire time in 'set' command"));
        assert_eq!(requests(&["SET", "k", "v", "EX", "0"]), invalid);
        assert_eq!(requests(&["SET", "k", "v", "PX", "-5"]), invalid);
        assert_eq!(requests(&["SET", "k", "v", "EXAT", "0"]), invalid);
        assert_eq!(requests(&["SET", "k", "v", "EX", &i64::MAX.to_string()]), invalid);
        assert_eq!(requests(&["SET", "k", "v", "PX", &i64::MAX.to_string()]), invalid);
    }
}
