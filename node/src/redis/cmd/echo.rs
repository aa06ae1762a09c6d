//! ECHO message
//!
//! Replies with the message as a bulk string.

use super::Outcome;
use crate::redis::conn::Conn;
use bytes::Bytes;
use causeway_resp::Frame;

pub async fn run(_conn: &mut Conn, args: Vec<Bytes>) -> Outcome {
    Frame::Bulk(args[1].clone()).into()
}
