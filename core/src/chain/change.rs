//! What a client's change does to its key, decided at the head against
//! what the key holds (the chain below sees only the result: a value or a
//! tombstone, and an expiry instant). Redis 7's rules for SET's NX, XX,
//! KEEPTTL and GET, EXPIRE's NX, XX, GT and LT (a key without an expiry
//! counts as expiring never), PERSIST and GETEX.

use crate::message::{Change, Condition, Expiry, NewValue};
use bytes::Bytes;

/// What the key holds as the head sees it: its live value and expiry.
#[derive(Clone, Copy, Debug, Default)]
pub struct Current<'a> {
    pub value: Option<&'a [u8]>,
    pub expires_at_ms: Option<u64>,
}

/// A change decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decided {
    /// The value to write (`None`: a tombstone), and its expiry; `None`
    /// when the change's condition does not hold (nothing is written).
    pub write: Option<(Option<Bytes>, Option<u64>)>,
    /// What the answer carries: the value the key had, if the change asked
    /// for it; for `NewValue::Add`, the value written.
    pub old: Option<Bytes>,
}

/// Redis's errors for an increment the key's value does not allow.
pub const NOT_AN_INTEGER: &str = "value is not an integer or out of range";
pub const OVERFLOW: &str = "increment or decrement would overflow";
pub const NOT_A_FLOAT: &str = "value is not a valid float";
pub const NAN_OR_INFINITY: &str = "increment would produce NaN or Infinity";
pub const TOO_LONG: &str = "string exceeds maximum allowed size (proto-max-bulk-len)";

/// The longest value an APPEND or SETRANGE may make, and the node's
/// default `--max-value-bytes` (`node/src/config.rs` says why it is below
/// Redis's 512 MB).
pub const MAX_VALUE_BYTES: usize = 128 << 20;

/// `NewValue::Add(n)` on `current` (a missing key counts as 0): the value
/// to write, or Redis's error.
pub fn add(current: Option<&[u8]>, n: i64) -> Result<Bytes, &'static str> {
    let now = match current {
        None => 0,
        // As Redis's string2ll: no spaces, no '+', no leading zeros.
        Some(v) => std::str::from_utf8(v)
            .ok()
            .filter(|s| !s.starts_with('+') && (s.len() == 1 || !s.starts_with('0')) && !s.starts_with("-0"))
            .and_then(|s| s.parse::<i64>().ok())
            .ok_or(NOT_AN_INTEGER)?,
    };
    Ok(Bytes::from(now.checked_add(n).ok_or(OVERFLOW)?.to_string()))
}

/// A number as Redis's INCRBYFLOAT reads one: no spaces, not NaN.
pub fn float(text: &[u8]) -> Option<f64> {
    let s = std::str::from_utf8(text).ok().filter(|s| !s.starts_with(|c: char| c.is_ascii_whitespace()))?;
    s.parse::<f64>().ok().filter(|f| !f.is_nan())
}

/// `NewValue::AddFloat` on `current` (a missing key counts as 0): the
/// value to write, in the shortest decimal that reads back the same (Redis
/// prints a long double's 17 digits and trims zeros: 10.5 + 0.1 is "10.6"
/// in both), or Redis's error.
pub fn add_float(current: Option<&[u8]>, by: f64) -> Result<Bytes, &'static str> {
    let now = match current {
        None => 0.0,
        Some(v) => float(v).ok_or(NOT_A_FLOAT)?,
    };
    let sum = now + by;
    if !sum.is_finite() {
        return Err(NAN_OR_INFINITY);
    }
    Ok(Bytes::from(decimal(sum)))
}

/// A double as INCRBYFLOAT writes it: the shortest decimal that reads
/// back the same, or 15 significant digits if that needs more (the sum's
/// binary error then shows: 0.1 + 0.2 is "0.3", as Redis's long double
/// prints it, not "0.30000000000000004").
fn decimal(x: f64) -> String {
    let shortest = format!("{}", x + 0.0);
    let digits = shortest.trim_start_matches(['-', '0', '.']).chars().filter(char::is_ascii_digit).count();
    if digits <= 15 {
        return shortest;
    }
    let rounded: f64 = format!("{x:.14e}").parse().expect("a formatted double reads back");
    format!("{}", rounded + 0.0)
}

/// `NewValue::SetRange(offset, bytes)` on `current`: the new value, or
/// `None` when nothing changes (no bytes to write).
pub fn set_range(current: Option<&[u8]>, offset: u64, bytes: &[u8]) -> Result<Option<Bytes>, &'static str> {
    if bytes.is_empty() {
        return Ok(None);
    }
    let end = offset.checked_add(bytes.len() as u64).filter(|&e| e <= MAX_VALUE_BYTES as u64).ok_or(TOO_LONG)? as usize;
    let mut value = current.unwrap_or_default().to_vec();
    if value.len() < end {
        value.resize(end, 0);
    }
    value[offset as usize..end].copy_from_slice(bytes);
    Ok(Some(Bytes::from(value)))
}

/// Decides `change` at `now_ms` against `current`.
pub fn decide(change: &Change, current: Current<'_>, now_ms: u64) -> Result<Decided, &'static str> {
    if !change.value.is_computed() {
        return Ok(decide_set(change, current, now_ms));
    }
    // Computed from the key's value, which keeps its expiry (as Redis's
    // INCR, INCRBYFLOAT, APPEND and SETRANGE do).
    let expires_at = current.expires_at_ms.filter(|_| current.value.is_some());
    let length = |v: &Bytes| Bytes::from(v.len().to_string());
    let (value, answer) = match &change.value {
        NewValue::Add(n) => {
            let v = add(current.value, *n)?;
            (Some(v.clone()), v)
        }
        NewValue::AddFloat(bits) => {
            let v = add_float(current.value, f64::from_bits(*bits))?;
            (Some(v.clone()), v)
        }
        NewValue::Append(bytes) => {
            let old = current.value.unwrap_or_default();
            if old.len() + bytes.len() > MAX_VALUE_BYTES {
                return Err(TOO_LONG);
            }
            let v = Bytes::from([old, bytes.as_ref()].concat());
            let len = length(&v);
            (Some(v), len)
        }
        NewValue::SetRange(offset, bytes) => match set_range(current.value, *offset, bytes)? {
            Some(v) => {
                let len = length(&v);
                (Some(v), len)
            }
            // Nothing to write: the length as it is (0 for no key).
            None => (None, Bytes::from(current.value.map_or(0, <[u8]>::len).to_string())),
        },
        _ => unreachable!("not computed"),
    };
    Ok(Decided { write: value.map(|v| (Some(v), expires_at)), old: Some(answer) })
}

/// `decide` for every change but an increment.
fn decide_set(change: &Change, current: Current<'_>, now_ms: u64) -> Decided {
    let exists = current.value.is_some();
    let expires_at = match change.expiry {
        Expiry::Keep => current.expires_at_ms.filter(|_| exists),
        Expiry::Never => None,
        Expiry::After(ms) => Some(now_ms.saturating_add(ms)),
        Expiry::At(at) => Some(at),
    };
    let holds = match change.condition {
        Condition::Always => true,
        Condition::IfAbsent => !exists,
        Condition::IfPresent => exists,
        Condition::IfNoExpiry => exists && current.expires_at_ms.is_none(),
        Condition::IfExpiry => exists && current.expires_at_ms.is_some(),
        Condition::IfLater => exists && matches!((expires_at, current.expires_at_ms), (Some(new), Some(old)) if new > old),
        Condition::IfSooner => exists && matches!((expires_at, current.expires_at_ms), (Some(new), old) if old.is_none_or(|old| new < old)),
        Condition::IfExpiryAndSooner => exists && matches!((expires_at, current.expires_at_ms), (Some(new), Some(old)) if new < old),
    } && (exists || change.value != NewValue::Keep);
    let old = if change.get { current.value.map(Bytes::copy_from_slice) } else { None };
    if !holds {
        return Decided { write: None, old };
    }
    let value = match &change.value {
        NewValue::Set(v) => Some(v.clone()),
        NewValue::Delete => None,
        NewValue::Keep => current.value.map(Bytes::copy_from_slice),
        NewValue::Add(_) | NewValue::AddFloat(_) | NewValue::Append(_) | NewValue::SetRange(..) => unreachable!("decided in `decide`"),
    };
    // An expiry already past deletes the key (EXPIRE with a time not in
    // the future, as in Redis).
    let write = match expires_at {
        Some(at) if value.is_none() || at <= now_ms => (None, None),
        _ => (value, expires_at),
    };
    Decided { write: Some(write), old }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expire(expiry: Expiry, condition: Condition) -> Change {
        Change { value: NewValue::Keep, expiry, condition, get: false }
    }

    fn with(value: &'static [u8], expires_at_ms: Option<u64>) -> Current<'static> {
        Current { value: Some(value), expires_at_ms }
    }

    const NONE: Current = Current { value: None, expires_at_ms: None };

    #[test]
    fn set_with_its_options() {
        let set = Change::set(Bytes::from("v"));
        assert_eq!(
            decide_set(&set, with(b"old", Some(500)), 100).write,
            Some((Some(Bytes::from("v")), None)),
            "a plain SET clears the TTL"
        );
        let keep = Change { expiry: Expiry::Keep, ..set.clone() };
        assert_eq!(decide_set(&keep, with(b"old", Some(500)), 100).write, Some((Some(Bytes::from("v")), Some(500))));
        assert_eq!(decide_set(&keep, NONE, 100).write, Some((Some(Bytes::from("v")), None)));
        let nx = Change { condition: Condition::IfAbsent, get: true, ..set.clone() };
        assert_eq!(decide_set(&nx, with(b"old", None), 100), Decided { write: None, old: Some(Bytes::from("old")) });
        let ex = Change { expiry: Expiry::After(1_000), ..set.clone() };
        assert_eq!(decide_set(&ex, NONE, 100).write, Some((Some(Bytes::from("v")), Some(1_100))));
        let past = Change { expiry: Expiry::At(50), ..set };
        assert_eq!(decide_set(&past, NONE, 100).write, Some((None, None)), "EXAT in the past deletes");
    }

    #[test]
    fn expire_needs_the_key_and_follows_nx_xx_gt_lt() {
        let e = |c| expire(Expiry::After(1_000), c);
        assert_eq!(decide_set(&e(Condition::Always), NONE, 100).write, None, "no key, nothing to expire");
        assert_eq!(decide_set(&e(Condition::Always), with(b"v", None), 100).write, Some((Some(Bytes::from("v")), Some(1_100))));
        assert!(decide_set(&e(Condition::IfNoExpiry), with(b"v", None), 100).write.is_some());
        assert!(decide_set(&e(Condition::IfNoExpiry), with(b"v", Some(9)), 100).write.is_none());
        assert!(decide_set(&e(Condition::IfExpiry), with(b"v", None), 100).write.is_none());
        assert!(decide_set(&e(Condition::IfLater), with(b"v", None), 100).write.is_none(), "never is later than any time");
        assert!(decide_set(&e(Condition::IfLater), with(b"v", Some(500)), 100).write.is_some());
        assert!(decide_set(&e(Condition::IfSooner), with(b"v", None), 100).write.is_some());
        assert!(decide_set(&e(Condition::IfSooner), with(b"v", Some(500)), 100).write.is_none());
        assert!(decide_set(&e(Condition::IfExpiryAndSooner), with(b"v", None), 100).write.is_none());
        assert!(decide_set(&e(Condition::IfExpiryAndSooner), with(b"v", Some(5_000)), 100).write.is_some());
        assert_eq!(
            decide_set(&expire(Expiry::After(0), Condition::Always), with(b"v", None), 100).write,
            Some((None, None)),
            "now: deleted"
        );
    }

    #[test]
    fn persist_and_getex() {
        let persist = expire(Expiry::Never, Condition::IfExpiry);
        assert_eq!(decide_set(&persist, with(b"v", Some(500)), 100).write, Some((Some(Bytes::from("v")), None)));
        assert_eq!(decide_set(&persist, with(b"v", None), 100).write, None);
        let getex = Change { get: true, ..expire(Expiry::At(900), Condition::IfPresent) };
        assert_eq!(
            decide_set(&getex, with(b"v", None), 100),
            Decided { write: Some((Some(Bytes::from("v")), Some(900))), old: Some(Bytes::from("v")) }
        );
        assert_eq!(decide_set(&getex, NONE, 100), Decided { write: None, old: None });
    }

    #[test]
    fn del_only_what_is_there() {
        assert_eq!(decide_set(&Change::delete(), with(b"v", Some(500)), 100).write, Some((None, None)));
        assert_eq!(decide_set(&Change::delete(), NONE, 100).write, None);
    }

    #[test]
    fn an_increment_of_an_integer_keeps_the_expiry_and_answers_the_value_written() {
        let incr = |n| Change { value: NewValue::Add(n), expiry: Expiry::Keep, condition: Condition::Always, get: true };
        assert_eq!(decide(&incr(1), NONE, 100), Ok(Decided { write: Some((Some(Bytes::from("1")), None)), old: Some(Bytes::from("1")) }));
        assert_eq!(decide(&incr(-5), with(b"10", Some(500)), 100).unwrap().write, Some((Some(Bytes::from("5")), Some(500))));
        for bad in [&b"x"[..], b" 1", b"1.5", b"+1", b"01", b"", b"99999999999999999999"] {
            assert_eq!(decide(&incr(1), with(bad, None), 100), Err(NOT_AN_INTEGER), "{bad:?}");
        }
        assert_eq!(decide(&incr(1), with(b"9223372036854775807", None), 100), Err(OVERFLOW));
        assert_eq!(decide(&incr(i64::MIN), with(b"-1", None), 100), Err(OVERFLOW));
    }

    #[test]
    fn appends_ranges_and_floats_are_computed_from_the_value() {
        let computed = |value| Change { value, expiry: Expiry::Keep, condition: Condition::Always, get: true };
        let b = |s: &'static str| Some(Bytes::from(s));
        let append = computed(NewValue::Append(Bytes::from("de")));
        assert_eq!(decide(&append, with(b"abc", Some(500)), 100), Ok(Decided { write: Some((b("abcde"), Some(500))), old: b("5") }));
        assert_eq!(decide(&append, NONE, 100), Ok(Decided { write: Some((b("de"), None)), old: b("2") }));
        let range = |at, s: &'static str| computed(NewValue::SetRange(at, Bytes::from(s)));
        assert_eq!(decide(&range(1, "XY"), with(b"abcd", None), 100).unwrap(), Decided { write: Some((b("aXYd"), None)), old: b("4") });
        assert_eq!(decide(&range(3, "X"), NONE, 100).unwrap(), Decided { write: Some((b("\0\0\0X"), None)), old: b("4") });
        assert_eq!(decide(&range(9, ""), with(b"abc", None), 100).unwrap(), Decided { write: None, old: b("3") }, "nothing to write");
        assert_eq!(decide(&range(0, ""), NONE, 100).unwrap(), Decided { write: None, old: b("0") });
        assert_eq!(decide(&range(MAX_VALUE_BYTES as u64, "x"), NONE, 100), Err(TOO_LONG));
        let add = |f: f64| computed(NewValue::AddFloat(f.to_bits()));
        assert_eq!(decide(&add(0.1), with(b"10.5", Some(9)), 100).unwrap(), Decided { write: Some((b("10.6"), Some(9))), old: b("10.6") });
        assert_eq!(decide(&add(5.0e3), with(b"2.0e2", None), 100).unwrap().old, b("5200"));
        assert_eq!(decide(&add(-1.5), NONE, 100).unwrap().old, b("-1.5"));
        assert_eq!(decide(&add(0.2), with(b"0.1", None), 100).unwrap().old, b("0.3"));
        assert_eq!(decide(&add(1.0), with(b"1e20", None), 100).unwrap().old, b("100000000000000000000"));
        assert_eq!(decide(&add(0.5), with(b"3.14159265358979", None), 100).unwrap().old, b("3.64159265358979"));
        assert_eq!(decide(&add(1.0), with(b"abc", None), 100), Err(NOT_A_FLOAT));
        assert_eq!(decide(&add(1.0), with(b" 1", None), 100), Err(NOT_A_FLOAT));
        assert_eq!(decide(&add(f64::MAX), with(b"1.7976931348623157e308", None), 100), Err(NAN_OR_INFINITY));
    }
}
