//! GETEX key [EX seconds | PX milliseconds | EXAT unix-seconds |
//! PXAT unix-milliseconds | PERSIST]
//!
//! Replies with the value (a null when the key holds none) and, with an
//! option, changes the key's expiry: then it is a write the head decides,
//! answered with the value the key had. The same option may repeat (the
//! last counts). Bad input, as Redis answers it: an unknown option, two
//! different options or one without its number is `ERR syntax error`; a
//! time that is not positive or overflows, `ERR invalid expire time in
//! 'getex' command`, checked after the options.

use super::{expiry_in, only, own, syntax_error, upper, Batch};
use crate::redis::conn::client_error;
use crate::runtime::Clock;
use bytes::Bytes;
use causeway_core::driver::{Request, Response};
use causeway_core::message::{Change, Condition, Expiry, NewValue};
use causeway_resp::Frame;

pub fn parse(args: &[Bytes], clock: Clock) -> Result<Batch, Frame> {
    let key = own(&args[1]);
    // The option given, if any, with its number (none for PERSIST): the
    // same one may repeat (the last counts), two may not, as Redis's
    // parseExtendedStringArgumentsOrReply has it for SET and GETEX alike;
    // the number is read once every option is.
    let mut option: Option<(String, Option<&Bytes>)> = None;
    let mut i = 2;
    while i < args.len() {
        let opt = upper(&args[i]);
        let same = option.as_ref().is_none_or(|(o, _)| *o == opt);
        match opt.as_str() {
            "PERSIST" if same => option = Some((opt, None)),
            "EX" | "PX" | "EXAT" | "PXAT" if same && i + 1 < args.len() => {
                option = Some((opt, Some(&args[i + 1])));
                i += 1;
            }
            _ => return Err(syntax_error()),
        }
        i += 1;
    }
    let expiry = match option {
        None => None,
        Some((_, None)) => Some(Expiry::Never),
        Some((unit, Some(n))) => Some(expiry_in(&unit, n, "getex", clock)?),
    };
    let Some(expiry) = expiry else {
        return Batch::new(smallvec::smallvec![Request::Get(key)], |_, responses| match only(responses) {
            Ok(Response::Read { value: Some(v), .. }) => Frame::Bulk(v),
            Ok(_) => Frame::Null,
            Err(e) => client_error(e),
        });
    };
    let change = Change { value: NewValue::Keep, expiry, condition: Condition::IfPresent, get: true };
    Batch::new(smallvec::smallvec![Request::Put { key, change }], |_, responses| match only(responses) {
        Ok(Response::Replaced { old: Some(v), .. }) => Frame::Bulk(v),
        Ok(_) => Frame::Null,
        Err(e) => client_error(e),
    })
}

#[cfg(test)]
mod tests {
    use crate::redis::cmd::{requests, syntax_error};
    use bytes::Bytes;
    use causeway_core::driver::Request;
    use causeway_core::message::{Change, Condition, Expiry, NewValue};
    use causeway_resp::Frame;

    fn getex(expiry: Expiry) -> Result<Vec<Request>, Frame> {
        let change = Change { value: NewValue::Keep, expiry, condition: Condition::IfPresent, get: true };
        Ok(vec![Request::Put { key: Bytes::from("k"), change }])
    }

    #[test]
    fn no_option_is_a_read() {
        assert_eq!(requests(&["GETEX", "k"]), Ok(vec![Request::Get(Bytes::from("k"))]));
    }

    #[test]
    fn every_option() {
        assert_eq!(requests(&["GETEX", "k", "ex", "10"]), getex(Expiry::After(10_000)));
        assert_eq!(requests(&["GETEX", "k", "PX", "1500"]), getex(Expiry::After(1500)));
        assert_eq!(requests(&["GETEX", "k", "EXAT", "1700000000"]), getex(Expiry::At(1_700_000_000_000)));
        assert_eq!(requests(&["GETEX", "k", "PXAT", "1700000000123"]), getex(Expiry::At(1_700_000_000_123)));
        assert_eq!(requests(&["GETEX", "k", "persist"]), getex(Expiry::Never));
    }

    /// Redis 7.0 answers `GETEX k EX 1 EX 2` and `GETEX k PERSIST PERSIST`
    /// with the value: the same option may repeat, the last counts.
    #[test]
    fn the_same_option_may_repeat() {
        assert_eq!(requests(&["GETEX", "k", "EX", "1", "ex", "2"]), getex(Expiry::After(2000)));
        assert_eq!(requests(&["GETEX", "k", "PERSIST", "persist"]), getex(Expiry::Never));
    }

    #[test]
    fn two_options_a_missing_number_or_an_unknown_option_is_a_syntax_error() {
        for words in [&["EX", "1", "PX", "1"][..], &["EX"], &["PERSIST", "EX", "1"], &["EX", "1", "PERSIST"], &["bogus"], &["KEEPTTL"]] {
            let mut all = vec!["GETEX", "k"];
            all.extend_from_slice(words);
            assert_eq!(requests(&all), Err(syntax_error()), "{words:?}");
        }
    }

    /// Redis 7.0: `GETEX k EX abc BOGUS` is a syntax error (the options
    /// are read first), `GETEX k EX 0` an invalid expire time.
    #[test]
    fn the_number_is_checked_after_the_options() {
        assert_eq!(requests(&["GETEX", "k", "EX", "abc", "BOGUS"]), Err(syntax_error()));
        assert_eq!(requests(&["GETEX", "k", "EX", "abc"]), Err(Frame::error("ERR value is not an integer or out of range")));
        assert_eq!(requests(&["GETEX", "k", "EX", "0"]), Err(Frame::error("ERR invalid expire time in 'getex' command")));
    }
}
