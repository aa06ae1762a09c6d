//! EXPIRE key seconds [NX | XX | GT | LT], and PEXPIRE (milliseconds),
//! EXPIREAT (a Unix time in seconds), PEXPIREAT (in milliseconds); PERSIST
//! key.
//!
//! Replies 1 if the key's expiry was set (or removed, for PERSIST), 0 if
//! the key holds no value or the option kept it from changing: NX, only if
//! it has no expiry; XX, only if it has one; GT, only if the new one is
//! later; LT, sooner (no expiry counts as never, as in Redis 7). A time
//! not in the future deletes the key (and replies 1). The head decides it
//! (`core::chain::change`), and the change goes down the chain as a write.
//! Bad input, as Redis answers it: `ERR value is not an integer or out of
//! range`, `ERR invalid expire time in 'expire' command` for a time whose
//! instant overflows, `ERR NX and XX, GT or LT options at the same time are
//! not compatible`, `ERR GT and LT options at the same time are not
//! compatible`, `ERR Unsupported option x` (the option as given); the
//! options are checked before the number, as Redis checks them.

use super::{integer, only, own, upper, Batch};
use crate::redis::conn::client_error;
use crate::runtime::Clock;
use bytes::Bytes;
use causeway_core::driver::{Request, Response};
use causeway_core::message::{Change, Condition, Expiry, NewValue};
use causeway_resp::Frame;

/// EXPIRE, PEXPIRE, EXPIREAT or PEXPIREAT (`args[0]`).
pub fn parse(args: &[Bytes], clock: Clock) -> Result<Batch, Frame> {
    let name = String::from_utf8_lossy(&args[0]).to_ascii_lowercase();
    // The options first, then the number, in Redis's order: a bad option
    // is the error even when the number is bad too.
    let (mut nx, mut xx, mut gt, mut lt) = (false, false, false, false);
    for option in &args[3..] {
        match upper(option).as_str() {
            "NX" => nx = true,
            "XX" => xx = true,
            "GT" => gt = true,
            "LT" => lt = true,
            _ => return Err(Frame::error(format!("ERR Unsupported option {}", String::from_utf8_lossy(option)))),
        }
    }
    if nx && (xx || gt || lt) {
        return Err(Frame::error("ERR NX and XX, GT or LT options at the same time are not compatible"));
    }
    if gt && lt {
        return Err(Frame::error("ERR GT and LT options at the same time are not compatible"));
    }
    let when = integer(&args[2])?;
    let (seconds, absolute) = match name.as_str() {
        "expire" => (true, false),
        "pexpire" => (false, false),
        "expireat" => (true, true),
        _ => (false, true),
    };
    let invalid = || Frame::error(format!("ERR invalid expire time in '{name}' command"));
    let ms = if seconds { when.checked_mul(1000).ok_or_else(invalid)? } else { when };
    let base = if absolute { 0 } else { clock.now_ms() as i64 };
    let at = ms.checked_add(base).ok_or_else(invalid)?;
    // GT already needs an expiry (none counts as never); LT with XX needs
    // one too, LT alone does not.
    let condition = match (nx, xx, gt, lt) {
        (true, ..) => Condition::IfNoExpiry,
        (_, _, true, _) => Condition::IfLater,
        (_, true, _, true) => Condition::IfExpiryAndSooner,
        (_, _, _, true) => Condition::IfSooner,
        (_, true, ..) => Condition::IfExpiry,
        _ => Condition::Always,
    };
    let expiry = Expiry::At(at.max(0) as u64);
    let change = Change { value: NewValue::Keep, expiry, condition, get: false };
    Batch::new(smallvec::smallvec![Request::Put { key: own(&args[1]), change }], |_, responses| match only(responses) {
        Ok(Response::Written(written)) => Frame::Integer(written as i64),
        Ok(other) => unreachable!("EXPIRE answered {other:?}"),
        Err(e) => client_error(e),
    })
}

/// PERSIST key: the key's expiry removed, if it has one.
pub fn persist(args: &[Bytes], _: Clock) -> Result<Batch, Frame> {
    let change = Change { value: NewValue::Keep, expiry: Expiry::Never, condition: Condition::IfExpiry, get: false };
    Batch::new(smallvec::smallvec![Request::Put { key: own(&args[1]), change }], |_, responses| match only(responses) {
        Ok(Response::Written(written)) => Frame::Integer(written as i64),
        Ok(other) => unreachable!("PERSIST answered {other:?}"),
        Err(e) => client_error(e),
    })
}

#[cfg(test)]
mod tests {
    use crate::redis::cmd::requests;
    use causeway_core::driver::Request;
    use causeway_core::message::{Condition, Expiry, NewValue};
    use causeway_resp::Frame;

    fn change(words: &[&str]) -> (Expiry, Condition) {
        let Ok(rs) = requests(words) else { panic!("{words:?}") };
        let [Request::Put { change, .. }] = &rs[..] else { panic!() };
        assert_eq!(change.value, NewValue::Keep);
        (change.expiry, change.condition)
    }

    #[test]
    fn absolute_times_in_seconds_and_milliseconds() {
        assert_eq!(change(&["EXPIREAT", "k", "1700000000"]), (Expiry::At(1_700_000_000_000), Condition::Always));
        assert_eq!(change(&["PEXPIREAT", "k", "1700000000123", "nx"]), (Expiry::At(1_700_000_000_123), Condition::IfNoExpiry));
        assert_eq!(change(&["EXPIREAT", "k", "-5"]).0, Expiry::At(0), "in the past: the key is deleted");
    }

    #[test]
    fn options_as_redis_combines_them() {
        assert_eq!(change(&["EXPIRE", "k", "10", "XX"]).1, Condition::IfExpiry);
        assert_eq!(change(&["EXPIRE", "k", "10", "GT"]).1, Condition::IfLater);
        assert_eq!(change(&["EXPIRE", "k", "10", "LT"]).1, Condition::IfSooner);
        assert_eq!(change(&["EXPIRE", "k", "10", "XX", "LT"]).1, Condition::IfExpiryAndSooner);
        assert_eq!(change(&["EXPIRE", "k", "10", "GT", "XX", "gt"]).1, Condition::IfLater);
        let err = |words: &[&str]| requests(words).expect_err("an error");
        assert_eq!(
            err(&["EXPIRE", "k", "10", "NX", "XX"]),
            Frame::error("ERR NX and XX, GT or LT options at the same time are not compatible")
        );
        assert_eq!(
            err(&["EXPIRE", "k", "10", "GT", "NX"]),
            Frame::error("ERR NX and XX, GT or LT options at the same time are not compatible")
        );
        assert_eq!(err(&["EXPIRE", "k", "10", "GT", "LT"]), Frame::error("ERR GT and LT options at the same time are not compatible"));
        assert_eq!(err(&["EXPIRE", "k", "10", "FOO"]), Frame::error("ERR Unsupported option FOO"));
        assert_eq!(err(&["EXPIRE", "k", "10", "nx", "Foo"]), Frame::error("ERR Unsupported option Foo"), "as given, as Redis says it");
        assert_eq!(err(&["EXPIRE", "k", "ten"]), Frame::error("ERR value is not an integer or out of range"));
        assert_eq!(err(&["EXPIRE", "k", &i64::MAX.to_string()]), Frame::error("ERR invalid expire time in 'expire' command"));
        assert_eq!(err(&["PEXPIRE", "k", &i64::MAX.to_string()]), Frame::error("ERR invalid expire time in 'pexpire' command"));
    }

    /// Redis 7.0 parses the options before the number: `EXPIRE k abc AB`
    /// is `ERR Unsupported option AB`, `EXPIRE k abc NX XX` the NX error.
    #[test]
    fn options_are_checked_before_the_number() {
        let err = |words: &[&str]| requests(words).expect_err("an error");
        assert_eq!(err(&["EXPIRE", "k", "abc", "AB"]), Frame::error("ERR Unsupported option AB"));
        assert_eq!(
            err(&["PEXPIREAT", "k", "abc", "NX", "XX"]),
            Frame::error("ERR NX and XX, GT or LT options at the same time are not compatible")
        );
        assert_eq!(err(&["EXPIRE", "k", "abc", "NX"]), Frame::error("ERR value is not an integer or out of range"));
    }
}
