//! CW.DIGEST
//!
//! Each replica this node holds in brief, one line per partition:
//! `partition:applied:stable:hash` (the hash covers every key's latest
//! version and value). Replicas of one chain that hold the same data show
//! the same line: tests and operators compare them across nodes.

use crate::redis::cmd::Outcome;
use crate::redis::conn::Conn;
use bytes::Bytes;
use causeway_resp::Frame;

pub async fn run(conn: &mut Conn, _args: Vec<Bytes>) -> Outcome {
    let mut text = String::new();
    for (p, d) in conn.node.digests() {
        text.push_str(&format!("{p}:{}:{}:{:016x}\r\n", d.applied, d.stable, d.fingerprint()));
    }
    Frame::Bulk(Bytes::from(text)).into()
}
