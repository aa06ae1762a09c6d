//! GETEX key [EX seconds | PX milliseconds | EXAT unix-seconds |
//! PXAT unix-milliseconds | PERSIST]
//!
//! Replies with the value (a null when the key holds none) and, with an
//! option, changes the key's expiry: then it is a write the head decides,
//! answered with the value the key had. Bad input, as Redis answers it: an
//! unknown option, two options or one without its number is
//! `ERR syntax error`; a time that is not positive or overflows,
//! `ERR invalid expire time in 'getex' command`.

use super::{expiry_in, only, own, syntax_error, upper, Batch};
use crate::conn::client_error;
use bytes::Bytes;
use causeway_core::driver::{Request, Response};
use causeway_core::message::{Change, Condition, Expiry, NewValue};
use causeway_resp::Frame;

pub fn parse(args: &[Bytes]) -> Result<Batch, Frame> {
    let key = own(&args[1]);
    let expiry = match args.len() {
        2 => None,
        3 if upper(&args[2]) == "PERSIST" => Some(Expiry::Never),
        4 => match upper(&args[2]).as_str() {
            unit @ ("EX" | "PX" | "EXAT" | "PXAT") => Some(expiry_in(unit, &args[3], "getex")?),
            _ => return Err(syntax_error()),
        },
        _ => return Err(syntax_error()),
    };
    let Some(expiry) = expiry else {
        return Batch::new(vec![Request::Get(key)], |_, responses| match only(responses) {
            Ok(Response::Read { value: Some(v), .. }) => Frame::Bulk(v),
            Ok(_) => Frame::Null,
            Err(e) => client_error(e),
        });
    };
    let change = Change { value: NewValue::Keep, expiry, condition: Condition::IfPresent, get: true };
    Batch::new(vec![Request::Put { key, change }], |_, responses| match only(responses) {
        Ok(Response::Replaced { old: Some(v), .. }) => Frame::Bulk(v),
        Ok(_) => Frame::Null,
        Err(e) => client_error(e),
    })
}
