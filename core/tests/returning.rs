//! A node removed from a chain while alive (paused, partitioned) keeps its
//! replica; when it is placed in the chain again it asks its predecessor
//! only for the updates it missed. The predecessor sends them if its recent
//! updates reach back that far and the two histories agree at that point;
//! otherwise (the returning replica applied a write nobody else has, or it
//! was away too long) the whole state, which replaces what it kept.
use bytes::Bytes;
use causeway_core::chain::{ChainReplica, PutRequest, RECENT_BYTES};
use causeway_core::message::{Change, Dest, Envelope, Message, OpId, Outbox, Update};
use causeway_core::ring::{Chain, NodeId, NodeInfo, Shape, Topology};

const A: NodeId = 0;
const B: NodeId = 1;
const C: NodeId = 2;

fn topo(epoch: u64, chain: &[NodeId]) -> Topology {
    Topology {
        epoch,
        shape: Shape { partitions: 1, replicas: 2, k: 1, coding: None },
        nodes: (0..3).map(|id| NodeInfo { id, addr: format!("n{id}") }).collect(),
        chains: vec![Chain { nodes: chain.to_vec() }],
        admitted: Default::default(),
        returning: Vec::new(),
    }
}

fn put(write: u64, value: Bytes) -> PutRequest {
    PutRequest {
        op: OpId { client: 9, seq: write },
        key: Bytes::from(format!("k{}", write % 5)),
        change: Change::set(value),
        past: Default::default(),
        ack_at: 0,
        write,
        done_below: write,
    }
}

fn take(out: &mut Outbox, to: Dest) -> Vec<Message> {
    let (mine, rest): (Vec<Envelope>, Vec<Envelope>) = std::mem::take(out).into_iter().partition(|e| e.to == to);
    *out = rest;
    mine.into_iter().map(|e| e.msg).collect()
}

fn forwarded(out: &mut Outbox, to: NodeId) -> Vec<Update> {
    take(out, Dest::Node(to))
        .into_iter()
        .flat_map(|m| match m {
            Message::Forward { updates, .. } => updates,
            _ => Vec::new(),
        })
        .collect()
}

/// Writes `writes` at the head `head` (values of `size` bytes), delivering
/// its forwards to `next` if there is one.
fn write(head: &mut ChainReplica, next: Option<(&mut ChainReplica, NodeId)>, writes: std::ops::Range<u64>, size: usize, at: u64) {
    let mut out = Outbox::new();
    for w in writes.clone() {
        head.put(put(w, Bytes::from(vec![b'v' ^ w as u8; size])), at, &mut out);
    }
    if let Some((next, id)) = next {
        let updates = forwarded(&mut out, id);
        assert_eq!(updates.len(), writes.count());
        next.forward(updates, at, &mut out);
    }
}

/// Chain [A, B] takes writes 1..3, then B is removed after a failure
/// (epoch 2: [A], B returning, as the coordinator records it); returns A's
/// replica and the one B kept.
fn b_removed() -> (ChainReplica, ChainReplica) {
    let t1 = topo(1, &[A, B]);
    let (mut a, mut b) = (ChainReplica::new(&t1, 0, A, 0).unwrap(), ChainReplica::new(&t1, 0, B, 0).unwrap());
    write(&mut a, Some((&mut b, B)), 1..4, 10, 10);
    let mut t2 = topo(2, &[A]);
    t2.returning = vec![NodeInfo { id: B, addr: format!("n{B}") }];
    a.reconfigure(&t2, A, 20, &mut Outbox::new());
    (a, b)
}

/// `returning`, kept from its last time in the chain, joins at the tail of
/// `t` behind `a`: returns whether `a` sent only the missing updates, and
/// checks that the two replicas end identical.
fn rejoin(a: &mut ChainReplica, returning: ChainReplica, t: &Topology) -> bool {
    join(a, A, Some(returning), B, t).1
}

/// Node `me` joins at the tail of `t` behind `pred` (node `pred_id`), with
/// what it `kept`: returns its replica and whether it got only a suffix,
/// after checking that it ends identical to its predecessor.
fn join(pred: &mut ChainReplica, pred_id: NodeId, kept: Option<ChainReplica>, me: NodeId, t: &Topology) -> (ChainReplica, bool) {
    let mut out = Outbox::new();
    pred.reconfigure(t, pred_id, 100, &mut out);
    let kept_something = kept.is_some();
    let mut r = ChainReplica::joining(t, 0, me, 0, kept, 100, &mut out).unwrap();
    let Some(Message::Fetch { epoch, from, have, .. }) = take(&mut out, Dest::Node(pred_id)).pop() else { panic!("the joiner fetches") };
    assert_eq!(have.is_some(), kept_something, "it says what it kept");
    pred.fetch(epoch, from, have, &mut out);
    let Some(Message::Transfer { epoch, state, updates, history_before, clock, on_disk, .. }) = take(&mut out, Dest::Node(me)).pop() else {
        panic!("the predecessor answers")
    };
    let suffix = state.is_none();
    assert!(r.transfer(epoch, state.map(|s| *s), updates, history_before, clock, on_disk, 101, &mut out));
    assert!(!r.is_joining());
    let (dp, dr) = (pred.digest(), r.digest());
    assert_eq!((dp.applied, dp.latest), (dr.applied, dr.latest), "the new member ends identical to its predecessor");
    (r, suffix)
}

#[test]
fn a_returning_replica_gets_only_the_updates_it_missed() {
    // b is removed (a pause): a goes on alone.
    let (mut a, b) = b_removed();
    write(&mut a, None, 4..9, 10, 30);
    assert!(rejoin(&mut a, b, &topo(3, &[A, B])), "5 updates missed: a suffix");
}

#[test]
fn a_returning_replica_that_applied_a_write_nobody_else_has_gets_the_whole_state() {
    // b is the head; its last write never reaches a before b is removed.
    let t1 = topo(1, &[B, A]);
    let (mut b, mut a) = (ChainReplica::new(&t1, 0, B, 0).unwrap(), ChainReplica::new(&t1, 0, A, 0).unwrap());
    write(&mut b, Some((&mut a, A)), 1..4, 10, 10);
    write(&mut b, None, 4..5, 10, 11);
    assert_eq!(b.digest().applied, 4);
    let mut out = Outbox::new();
    a.reconfigure(&topo(2, &[A]), A, 20, &mut out);
    // a, head now, orders other writes over the same positions.
    write(&mut a, None, 10..12, 10, 30);
    assert!(!rejoin(&mut a, b, &topo(3, &[A, B])), "b's write 4 is not a's: the whole state");
}

#[test]
fn a_returning_replica_at_the_same_position_with_another_history_gets_the_whole_state() {
    let t1 = topo(1, &[B, A]);
    let (mut b, mut a) = (ChainReplica::new(&t1, 0, B, 0).unwrap(), ChainReplica::new(&t1, 0, A, 0).unwrap());
    write(&mut b, Some((&mut a, A)), 1..4, 10, 10);
    write(&mut b, None, 4..5, 10, 11);
    let mut out = Outbox::new();
    a.reconfigure(&topo(2, &[A]), A, 20, &mut out);
    write(&mut a, None, 20..21, 10, 30);
    assert_eq!(a.digest().applied, b.digest().applied, "both at position 4, with different writes there");
    assert!(!rejoin(&mut a, b, &topo(3, &[A, B])));
}

#[test]
fn a_replica_away_longer_than_the_recent_updates_reach_gets_the_whole_state() {
    let (mut a, b) = b_removed();
    let size = 4096;
    write(&mut a, None, 4..(8 + (RECENT_BYTES / size) as u64), size, 30);
    assert!(!rejoin(&mut a, b, &topo(3, &[A, B])), "more than RECENT_BYTES missed: the whole state");
}

/// The spare that took the returning node's place got a whole state, and
/// with it its predecessor's recent updates: it can serve the returning
/// node the updates it missed, from before the spare joined.
#[test]
fn a_member_that_joined_by_whole_state_serves_a_suffix_from_before_it_joined() {
    let (mut a, b) = b_removed();
    write(&mut a, None, 4..7, 10, 30);
    let (mut spare, suffix) = join(&mut a, A, None, C, &topo(3, &[A, C]));
    assert!(!suffix);
    let t4 = topo(4, &[A, C, B]);
    a.reconfigure(&t4, A, 110, &mut Outbox::new());
    let (_, suffix) = join(&mut spare, C, Some(b), B, &t4);
    assert!(suffix, "the spare's recent updates reach back to before it joined");
}

/// Found by the campaign (seed 1678): a replica that resumed from its log
/// into a chain that had moved on (its predecessor counts what it lacks as
/// stable, so never resends it) waited forever behind the gap. It now asks
/// its predecessor for what comes after its position.
#[test]
fn a_replica_behind_a_gap_that_resends_do_not_fill_fetches_what_it_lacks() {
    // b is gone for a while; a, alone, is the tail and declares 4..6 stable.
    let (mut a, mut b) = b_removed();
    let mut out = Outbox::new();
    write(&mut a, None, 4..7, 10, 30);
    // b is back in place, as from its log: a has nothing unstable to resend.
    let t3 = topo(3, &[A, B]);
    a.reconfigure(&t3, A, 40, &mut out);
    b.reconfigure(&t3, B, 40, &mut out);
    assert!(forwarded(&mut out, B).is_empty());
    // The next write reaches b across the gap.
    a.put(put(7, Bytes::from("v7")), 50, &mut out);
    b.forward(forwarded(&mut out, B), 50, &mut out);
    assert_eq!(b.digest().applied, 3, "4..6 are missing");
    out.clear();
    let mut fetched = None;
    for now in (60..1_000).step_by(10) {
        b.tick(now, None, &|_| false, &mut out);
        if let Some(Message::Fetch { epoch, from, have, .. }) = take(&mut out, Dest::Node(A)).pop() {
            fetched = Some((epoch, from, have));
            break;
        }
    }
    let (epoch, from, have) = fetched.expect("b asks for what it lacks");
    a.fetch(epoch, from, have, &mut out);
    let Some(Message::Transfer { epoch, state, updates, history_before, clock, on_disk, .. }) = take(&mut out, Dest::Node(B)).pop() else {
        panic!("a answers")
    };
    assert!(state.is_none(), "a's recent updates reach back: a suffix");
    assert!(b.transfer(epoch, state.map(|s| *s), updates, history_before, clock, on_disk, 1_000, &mut out));
    let (da, db) = (a.digest(), b.digest());
    assert_eq!((da.applied, da.latest), (db.applied, db.latest));
}

/// A replica alone in its chain, with no node out that may come back (B
/// was drained, not failed), keeps no recent updates: if B is placed again
/// after all, it gets the whole state, and ends identical.
#[test]
fn a_lone_replica_with_nobody_returning_keeps_no_recent_updates() {
    let t1 = topo(1, &[A, B]);
    let (mut a, mut b) = (ChainReplica::new(&t1, 0, A, 0).unwrap(), ChainReplica::new(&t1, 0, B, 0).unwrap());
    write(&mut a, Some((&mut b, B)), 1..4, 10, 10);
    a.reconfigure(&topo(2, &[A]), A, 20, &mut Outbox::new());
    write(&mut a, None, 4..9, 10, 30);
    assert!(!rejoin(&mut a, b, &topo(3, &[A, B])), "nothing recent kept: the whole state");
}
