//! SELECT index
//!
//! Only database 0 exists: replies `+OK` for it and
//! `ERR DB index is out of range` for any other.

use super::Outcome;
use crate::redis::conn::Conn;
use bytes::Bytes;
use causeway_resp::Frame;

pub async fn run(_conn: &mut Conn, args: Vec<Bytes>) -> Outcome {
    match args[1].as_ref() {
        b"0" => Frame::ok(),
        _ => Frame::error("ERR DB index is out of range"),
    }
    .into()
}
