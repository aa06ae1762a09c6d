//! SELECT index
//!
//! Only database 0 exists: replies `+OK` for it,
//! `ERR DB index is out of range` for another number and `ERR value is not
//! an integer or out of range` for what is not one.

use super::Outcome;
use crate::redis::conn::Conn;
use bytes::Bytes;
use causeway_resp::Frame;

pub async fn run(_conn: &mut Conn, args: Vec<Bytes>) -> Outcome {
    match super::integer(&args[1]) {
        Ok(0) => Frame::ok(),
        Ok(_) => Frame::error("ERR DB index is out of range"),
        Err(e) => e,
    }
    .into()
}
