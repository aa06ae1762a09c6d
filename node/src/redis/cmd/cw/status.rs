//! CW.STATUS
//!
//! This node at a glance, as `field:value` lines: id, whether it serves,
//! its lease, incarnation, epoch, the site's shape and its roles.

use crate::redis::cmd::Outcome;
use crate::redis::conn::Conn;
use bytes::Bytes;
use causeway_resp::Frame;

pub async fn run(conn: &mut Conn, _args: Vec<Bytes>) -> Outcome {
    let status = conn.node.status();
    let causeway_core::ring::Roles { head, middle, tail } = status.topology.roles(status.me);
    let t = &status.topology;
    let text = format!(
        "node:{}\r\nserving:{}\r\nlease:{}\r\nincarnation:{:x}\r\nepoch:{}\r\nnodes:{}\r\npartitions:{}\r\nreplicas:{}\r\nk:{}\r\nhead_of:{head}\r\nmiddle_of:{middle}\r\ntail_of:{tail}\r\n",
        status.me,
        if status.admitted { "yes" } else { "no" },
        if status.lease { "held" } else { "none" },
        status.incarnation,
        t.epoch,
        t.nodes.len(),
        t.shape.partitions,
        t.shape.replicas,
        t.shape.k
    );
    Frame::Bulk(Bytes::from(text)).into()
}
