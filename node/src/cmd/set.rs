//! SET key value [NX | XX] [EX seconds | PX milliseconds]
//!
//! Replies `+OK` once written, or a null when NX or XX kept it from being
//! written. Bad input, as Redis answers it: an unknown or conflicting
//! option (NX with XX, EX with PX, EX without its number) is
//! `ERR syntax error`; a number that is not an integer is
//! `ERR value is not an integer or out of range`; a time that is not
//! positive or whose instant overflows is
//! `ERR invalid expire time in 'set' command`.

use super::{only, own, syntax_error, upper, Batch};
use crate::conn::client_error;
use crate::server::now_ms;
use bytes::Bytes;
use causeway_core::driver::{Request, Response};
use causeway_core::message::Condition;
use causeway_resp::Frame;

/// SET's arguments as one conditional write on the session.
pub fn parse(args: &[Bytes]) -> Result<Batch, Frame> {
    let mut condition = Condition::Always;
    let mut ttl_ms = None;
    let mut unit = None;
    let mut i = 3;
    // Like Redis: a flag may repeat, conflicting flags (NX with XX, EX with
    // PX) are a syntax error.
    while i < args.len() {
        let opt = upper(&args[i]);
        match opt.as_str() {
            "NX" if condition != Condition::IfPresent => condition = Condition::IfAbsent,
            "XX" if condition != Condition::IfAbsent => condition = Condition::IfPresent,
            "EX" | "PX" if unit.as_ref().is_none_or(|u| *u == opt) && i + 1 < args.len() => {
                let Some(n) = std::str::from_utf8(&args[i + 1]).ok().and_then(|s| s.parse::<i64>().ok()) else {
                    return Err(Frame::error("ERR value is not an integer or out of range"));
                };
                // The expiry instant must fit, as in Redis.
                let ms = if opt == "EX" { n.checked_mul(1000) } else { Some(n) };
                match ms.filter(|&ms| ms > 0 && ms.checked_add(now_ms() as i64).is_some()) {
                    Some(ms) => ttl_ms = Some(ms as u64),
                    None => return Err(Frame::error("ERR invalid expire time in 'set' command")),
                }
                unit = Some(opt);
                i += 1;
            }
            _ => return Err(syntax_error()),
        }
        i += 1;
    }
    let request = Request::Put { key: own(&args[1]), value: Some(own(&args[2])), ttl_ms, condition };
    Batch::new(vec![request], |_, responses| match only(responses) {
        Ok(Response::Written(true)) => Frame::ok(),
        Ok(_) => Frame::Null,
        Err(e) => client_error(e),
    })
}

#[cfg(test)]
mod tests {
    use crate::cmd::{requests, syntax_error, wrong_arity};
    use bytes::Bytes;
    use causeway_core::driver::Request;
    use causeway_core::message::Condition;
    use causeway_resp::Frame;

    fn put(ttl_ms: Option<u64>, condition: Condition) -> Result<Vec<Request>, Frame> {
        Ok(vec![Request::Put { key: Bytes::from("k"), value: Some(Bytes::from("v")), ttl_ms, condition }])
    }

    #[test]
    fn plain_set_always_writes_without_ttl() {
        assert_eq!(requests(&["SET", "k", "v"]), put(None, Condition::Always));
    }

    #[test]
    fn key_and_value_are_required() {
        assert_eq!(requests(&["SET"]), Err(wrong_arity("set")));
        assert_eq!(requests(&["SET", "k"]), Err(wrong_arity("set")));
    }

    #[test]
    fn nx_and_xx_set_the_condition_in_any_case_and_may_repeat() {
        assert_eq!(requests(&["SET", "k", "v", "NX"]), put(None, Condition::IfAbsent));
        assert_eq!(requests(&["SET", "k", "v", "xx"]), put(None, Condition::IfPresent));
        assert_eq!(requests(&["SET", "k", "v", "nx", "NX"]), put(None, Condition::IfAbsent));
    }

    #[test]
    fn nx_with_xx_is_a_syntax_error() {
        assert_eq!(requests(&["SET", "k", "v", "NX", "XX"]), Err(syntax_error()));
        assert_eq!(requests(&["SET", "k", "v", "XX", "NX"]), Err(syntax_error()));
    }

    #[test]
    fn ex_is_seconds_and_px_milliseconds() {
        assert_eq!(requests(&["SET", "k", "v", "EX", "10"]), put(Some(10_000), Condition::Always));
        assert_eq!(requests(&["SET", "k", "v", "px", "1500", "XX"]), put(Some(1500), Condition::IfPresent));
        // The same unit may repeat: the last one counts, as in Redis.
        assert_eq!(requests(&["SET", "k", "v", "EX", "1", "EX", "2"]), put(Some(2000), Condition::Always));
    }

    #[test]
    fn ex_with_px_or_without_a_number_is_a_syntax_error() {
        assert_eq!(requests(&["SET", "k", "v", "EX", "1", "PX", "1"]), Err(syntax_error()));
        assert_eq!(requests(&["SET", "k", "v", "EX"]), Err(syntax_error()));
    }

    #[test]
    fn a_time_that_is_not_an_integer_is_refused() {
        let not_integer = Err(Frame::error("ERR value is not an integer or out of range"));
        assert_eq!(requests(&["SET", "k", "v", "EX", "ten"]), not_integer);
        assert_eq!(requests(&["SET", "k", "v", "PX", "1.5"]), not_integer);
    }

    #[test]
    fn a_time_that_is_not_positive_or_overflows_is_an_invalid_expire_time() {
        let invalid = Err(Frame::error("ERR invalid expire time in 'set' command"));
        assert_eq!(requests(&["SET", "k", "v", "EX", "0"]), invalid);
        assert_eq!(requests(&["SET", "k", "v", "PX", "-5"]), invalid);
        assert_eq!(requests(&["SET", "k", "v", "EX", &i64::MAX.to_string()]), invalid);
        assert_eq!(requests(&["SET", "k", "v", "PX", &i64::MAX.to_string()]), invalid);
    }

    #[test]
    fn unsupported_options_are_syntax_errors() {
        // KEEPTTL, GET, EXAT and PXAT are not implemented: refused, never ignored.
        for option in ["KEEPTTL", "GET", "EXAT", "PXAT", "bogus"] {
            assert_eq!(requests(&["SET", "k", "v", option]), Err(syntax_error()), "{option}");
        }
    }
}
