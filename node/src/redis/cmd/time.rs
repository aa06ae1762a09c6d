//! TIME
//!
//! Replies with this node's clock: the Unix time in seconds and the
//! microseconds into that second, both as bulk strings, as Redis does.

use super::Outcome;
use crate::redis::conn::Conn;
use bytes::Bytes;
use causeway_resp::Frame;

pub async fn run(_conn: &mut Conn, _args: Vec<Bytes>) -> Outcome {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let (secs, micros) = (now.as_secs(), now.subsec_micros());
    Frame::Array(vec![Frame::Bulk(Bytes::from(secs.to_string())), Frame::Bulk(Bytes::from(micros.to_string()))]).into()
}
