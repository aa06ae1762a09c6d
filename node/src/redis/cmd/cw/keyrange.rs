//! CW.KEYRANGE
//!
//! The partition map, as the p2p store's `keyrange`: one entry per
//! partition, `[partition, [[node id, address, role], ...]]`, head first.
//! In an erasure-coded site: `[partition, members, "group G slot S"]`,
//! the members being the partition's data member ("data", or "data
//! (lost)" once another serves its slot) and its group's parity members
//! ("parity", or "parity, serving" for the one serving a lost slot).

use crate::redis::cmd::Outcome;
use crate::redis::conn::Conn;
use bytes::Bytes;
use causeway_resp::Frame;

pub async fn run(conn: &mut Conn, _args: Vec<Bytes>) -> Outcome {
    let t = conn.node.topology();
    if let Some(coding) = t.shape.coding {
        let entries = (0..t.shape.partitions)
            .map(|p| {
                let (group, slot) = coding.place(p);
                let serving = t.chain(p).head();
                let member = |n: u16, role: &'static str| {
                    let addr = t.node(n).map(|n| n.addr.clone()).unwrap_or_default();
                    Frame::Array(vec![Frame::Integer(n as i64), Frame::Bulk(addr.into()), Frame::Simple(role.into())])
                };
                let data = coding.node(group, slot);
                let mut members = vec![member(data, if data == serving { "data" } else { "data (lost)" })];
                for s in coding.data..coding.data + coding.parity {
                    let n = coding.node(group, s);
                    members.push(member(n, if n == serving { "parity, serving" } else { "parity" }));
                }
                let place = format!("group {group} slot {slot}");
                Frame::Array(vec![Frame::Integer(p as i64), Frame::Array(members), Frame::Bulk(place.into())])
            })
            .collect();
        return Frame::Array(entries).into();
    }
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
