//! CW.CHAIN key
//!
//! The partition of `key` and its chain, head first, as
//! `[partition, [[node id, address], ...]]`.

use crate::redis::cmd::Outcome;
use crate::redis::conn::Conn;
use bytes::Bytes;
use causeway_resp::Frame;

pub async fn run(conn: &mut Conn, args: Vec<Bytes>) -> Outcome {
    let t = conn.node.topology();
    let p = t.partition_of(&args[1]);
    let members = t
        .chain(p)
        .nodes
        .iter()
        .map(|&n| Frame::Array(vec![Frame::Integer(n as i64), Frame::Bulk(t.node(n).map(|i| i.addr.clone()).unwrap_or_default().into())]))
        .collect();
    Frame::Array(vec![Frame::Integer(p as i64), Frame::Array(members)]).into()
}
