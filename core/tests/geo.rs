//! The chain side of geo-replication, replica by replica.

use bytes::Bytes;
use causeway_core::chain::{ChainReplica, PutRequest};
use causeway_core::geo::receiver::RemoteWrite;
use causeway_core::hlc::Timestamp;
use causeway_core::message::{Change, Dest, Envelope, Message, OpId, Outbox};
use causeway_core::ring::{NodeInfo, Shape, Topology};
use causeway_core::version::{Version, VersionVector};

fn ts(ms: u64) -> Timestamp {
    Timestamp::new(ms, 0)
}

/// Site 1, one node holding partitions 0 and 1 (R=1).
fn heads() -> (Topology, ChainReplica, ChainReplica) {
    let t =
        Topology::new(1, Shape { partitions: 2, replicas: 1, k: 1, coding: None }, vec![NodeInfo { id: 0, addr: "n0".into() }]).unwrap();
    let x = ChainReplica::new(&t, 0, 0, 1).unwrap();
    let y = ChainReplica::new(&t, 1, 0, 1).unwrap();
    (t, x, y)
}

fn put(key: &str, past: VersionVector) -> PutRequest {
    PutRequest {
        op: OpId { client: 7, seq: 1 },
        key: Bytes::from(key.to_string()),
        change: Change::set(Bytes::from("y2")),
        past,
        ack_at: 0,
        write: 1,
        done_below: 1,
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

/// What a link from another site may carry: only what sites send each
/// other, naming that site as the sender and this one as the destination.
#[test]
fn a_site_link_carries_only_what_sites_send_each_other() {
    use causeway_core::geo::receiver::ValuesAck;
    use causeway_core::geo::stabilizer::{Position, Ship, SiteAck};
    use causeway_core::geo::GeoMsg;
    let ship = |origin, to| {
        GeoMsg::Ship(Ship { origin, to, prev: Position::START, ids: Vec::new(), through: Position::START, applied: Position::START })
    };
    let site_ack = |from, origin| {
        GeoMsg::SiteAck(SiteAck {
            from,
            origin,
            received: Position::START,
            applied: Position::START,
            visible: Position::START,
            resend: false,
        })
    };
    let values_ack =
        |from, origin| GeoMsg::ValuesAcks(vec![ValuesAck { from, origin, partition: 0, received: ts(1), applied: ts(1), resend: false }]);
    // From site 2 to site 1.
    assert!(ship(2, 1).from_site(2, 1));
    assert!(!ship(0, 1).from_site(2, 1), "site 2 shipping site 0's ids");
    assert!(!ship(2, 0).from_site(2, 1), "a shipment for another site");
    assert!(GeoMsg::Values { origin: 2, batches: Vec::new() }.from_site(2, 1));
    assert!(!GeoMsg::Values { origin: 0, batches: Vec::new() }.from_site(2, 1));
    assert!(site_ack(2, 1).from_site(2, 1));
    assert!(!site_ack(0, 1).from_site(2, 1));
    assert!(values_ack(2, 1).from_site(2, 1));
    assert!(!values_ack(2, 0).from_site(2, 1));
    // What only nodes of one site send each other.
    let version = Version { ts: ts(5), site: 2, vv: VersionVector::local(2, ts(5)) };
    let write = RemoteWrite { partition: 0, key: Bytes::from("k"), value: Some(Bytes::from("v")), expires_at_ms: None, version };
    assert!(!GeoMsg::Apply { epoch: 1, write, from: 0 }.from_site(2, 1), "an Apply past the receiver");
    assert!(!GeoMsg::Promise(Timestamp::ZERO).from_site(2, 1));
    assert!(!GeoMsg::Promises { epoch: 1, items: Vec::new(), asked: None }.from_site(2, 1));
}
