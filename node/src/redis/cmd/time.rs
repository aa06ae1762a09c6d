//! TIME
//!
//! Replies with this node's clock: the Unix time in seconds and the
//! microseconds into that second, both as bulk strings, as Redis does
//! (the machine's clock: `CW.CLOCK SKEW` does not move it).

use super::Outcome;
use crate::redis::conn::Conn;
use bytes::Bytes;
use causeway_resp::Frame;

pub async fn run(conn: &mut Conn, _args: Vec<Bytes>) -> Outcome {
    let now = conn.server.clock.unix_time();
    let (secs, micros) = (now.as_secs(), now.subsec_micros());
    Frame::Array(vec![Frame::Bulk(Bytes::from(secs.to_string())), Frame::Bulk(Bytes::from(micros.to_string()))]).into()
}
