//! CW.KEYRANGE
//!
//! The partition map, as the p2p store's `keyrange`: one entry per
//! partition, `[partition, [[node id, address, role], ...]]`, head first.

use crate::redis::cmd::Outcome;
use crate::redis::conn::Conn;
use bytes::Bytes;
use causeway_resp::Frame;

pub async fn run(conn: &mut Conn, _args: Vec<Bytes>) -> Outcome {
    let t = conn.node.topology();
    let entries = t
        .chains
        .iter()
        .enumerate()
        .map(|(p, chain)| {
            let members = chain
                .nodes
                .iter()
                .enumerate()
                .map(|(i, &n)| {
                    let role = if i == 0 {
                        "head"
                    } else if i + 1 == chain.len() {
                        "tail"
                    } else {
                        "middle"
                    };
                    let addr = t.node(n).map(|n| n.addr.clone()).unwrap_or_default();
                    Frame::Array(vec![Frame::Integer(n as i64), Frame::Bulk(addr.into()), Frame::Simple(role.into())])
                })
                .collect();
            Frame::Array(vec![Frame::Integer(p as i64), Frame::Array(members)])
        })
        .collect();
    Frame::Array(entries).into()
}
