//! The chain side of geo-replication, replica by replica.

use bytes::Bytes;
use causeway_core::chain::{ChainReplica, PutRequest};
use causeway_core::geo::receiver::RemoteWrite;
use causeway_core::hlc::Timestamp;
use causeway_core::message::{Condition, Dest, Envelope, Message, OpId, Outbox};
use causeway_core::ring::{NodeInfo, Shape, Topology};
use causeway_core::version::{Version, VersionVector};

fn ts(ms: u64) -> Timestamp {
    Timestamp::new(ms, 0)
}

/// Site 1, one node holding partitions 0 and 1 (R=1).
fn heads() -> (Topology, ChainReplica, ChainReplica) {
    let t = Topology::new(1, Shape { partitions: 2, replicas: 1, k: 1 }, vec![NodeInfo { id: 0, addr: "n0".into() }]).unwrap();
    let x = ChainReplica::new(&t, 0, 0, 1).unwrap();
    let y = ChainReplica::new(&t, 1, 0, 1).unwrap();
    (t, x, y)
}

fn put(key: &str, past: VersionVector) -> PutRequest {
    PutRequest {
        op: OpId { client: 7, seq: 1 },
        key: Bytes::from(key.to_string()),
        value: Some(Bytes::from("y2")),
        ttl_ms: None,
        condition: Condition::Always,
        past,
        ack_at: 0,
        write: 1,
    }
}

fn vector(entries: &[(u16, u64)]) -> VersionVector {
    let mut v = VersionVector::default();
    for &(site, ms) in entries {
        v.set(site, ts(ms));
    }
    v
}

/// A remote write (site 0, timestamp 100) reaches x's head after a
/// get-transaction at 200 read x there; a client then reads it and writes y
/// (timestamp 150 < 200). Read at y's head by timestamp alone, the
/// transaction would hold y2 without what y2 depends on: the snapshot
/// excludes versions that depend on more of site 0 than the site had
/// applied when it began.
#[test]
fn a_snapshot_never_holds_a_write_without_the_remote_write_it_depends_on() {
    let (_, mut x, mut y) = heads();
    let mut out = Outbox::new();
    let applied_then = vector(&[]); // nothing of site 0 applied yet
    let at = ts(200);
    let before = x.snapshot_read(b"x", at, &applied_then, 120).unwrap();
    assert!(before.version.is_none());

    let u = Version { ts: ts(100), site: 0, vv: vector(&[(0, 100)]) };
    let write = RemoteWrite { partition: 0, key: Bytes::from("x"), value: Some(Bytes::from("u")), expires_at_ms: None, version: u };
    let reply = Envelope { to: Dest::Node(0), msg: Message::Flushed { op: OpId { client: 0, seq: 0 } } };
    x.apply_remote(write, reply, 130, &mut out);
    y.put(put("y", vector(&[(0, 100)])), 150, &mut out);
    let y2 = y.digest().latest[0].1.version.clone();
    assert!(y2.ts <= at && y2.vv.get(0) == ts(100), "y2 depends on u and is older than the snapshot: {y2}");

    let unbounded = y.snapshot_read(b"y", at, &vector(&[(0, u64::MAX)]), 160).unwrap();
    assert_eq!(unbounded.version.as_ref(), Some(&y2), "by timestamp alone the snapshot would be fractured");
    let bounded = y.snapshot_read(b"y", at, &applied_then, 160).unwrap();
    assert!(bounded.version.is_none(), "y2 depends on more of site 0 than the snapshot's bound: excluded");
}
