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
