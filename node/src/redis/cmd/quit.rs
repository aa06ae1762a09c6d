//! QUIT
//!
//! Replies `+OK` and closes the connection.

use super::Outcome;
use crate::redis::conn::Conn;
use bytes::Bytes;
use causeway_resp::Frame;

pub async fn run(_conn: &mut Conn, _args: Vec<Bytes>) -> Outcome {
    Outcome::Close(Frame::ok())
}
