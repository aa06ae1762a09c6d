//! SETEX key seconds value, PSETEX key milliseconds value
//!
//! SET with EX or PX: replies `+OK`. A time that is not a positive integer
//! whose instant fits is `ERR invalid expire time in 'setex' command` (or
//! `'psetex'`); one that is not an integer, `ERR value is not an integer or
//! out of range`, as in Redis.

use super::{expiry_in, only, own_both, Batch};
use crate::redis::conn::client_error;
use crate::runtime::Clock;
use bytes::Bytes;
use causeway_core::driver::Request;
use causeway_core::message::Change;
use causeway_resp::Frame;

pub fn parse(args: &[Bytes], clock: Clock) -> Result<Batch, Frame> {
    let name = String::from_utf8_lossy(&args[0]).to_ascii_lowercase();
    let unit = if name == "setex" { "EX" } else { "PX" };
    let expiry = expiry_in(unit, &args[2], &name, clock)?;
    let (key, value) = own_both(&args[1], &args[3]);
    let change = Change { expiry, ..Change::set(value) };
    Batch::new(smallvec::smallvec![Request::Put { key, change }], |_, responses| match only(responses) {
        Ok(_) => Frame::ok(),
        Err(e) => client_error(e),
    })
}
