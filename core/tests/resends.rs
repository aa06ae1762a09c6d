//! Regressions found by review: writes resent after a failure, and writes
//! that travel inside a state transfer, are applied once and answered right.
use bytes::Bytes;
use causeway_core::chain::{ChainReplica, PutRequest};
use causeway_core::message::{Change, Condition, Dest, Envelope, Expiry, Message, NewValue, OpId, Outbox, Update, ACK_AT_TAIL};
use causeway_core::record::LogRecord;
use causeway_core::ring::{Chain, NodeId, NodeInfo, Shape, Topology};

fn topo(epoch: u64, replicas: usize, k: usize, chain: &[NodeId]) -> Topology {
    let nodes = (0..6).map(|id| NodeInfo { id, addr: format!("n{id}") }).collect();
    Topology {
        epoch,
        shape: Shape { partitions: 1, replicas, k, coding: None },
        nodes,
        chains: vec![Chain { nodes: chain.to_vec() }],
        admitted: Default::default(),
        returning: Vec::new(),
    }
}

fn put(seq: u64, write: u64, ack_at: u8, condition: Condition, value: Option<&'static str>) -> PutRequest {
    PutRequest {
        op: OpId { client: 9, seq },
        key: Bytes::from("k"),
        change: Change {
            value: value.map_or(NewValue::Delete, |v| NewValue::Set(Bytes::from(v))),
            expiry: Expiry::Never,
            condition,
            get: false,
        },
        past: Default::default(),
        ack_at,
        write,
        done_below: write,
    }
}

fn take(out: &mut Outbox, to: Dest) -> Vec<Message> {
    let (mine, rest): (Vec<Envelope>, Vec<Envelope>) = std::mem::take(out).into_iter().partition(|e| e.to == to);
    *out = rest;
    mine.into_iter().map(|e| e.msg).collect()
}

fn fwd(m: Vec<Message>) -> Vec<Update> {
    m.into_iter()
        .flat_map(|m| match m {
            Message::Forward { updates, .. } => updates,
            _ => vec![],
        })
        .collect()
}

/// A write the joining tail receives inside its state transfer (it was
/// applied at the predecessor before the predecessor answered the Fetch) is
/// never acknowledged: only `apply` answers, and `transfer` treats the
/// parked copy as a duplicate. `ack_at` = ACK_AT_TAIL (linearizable) or a
/// causal k-1 that is the joiner's position (k = R).
fn joining_tail_never_acks(shape_k: usize, ack_at: u8) {
    let (a, b, c, d) = (0, 1, 2, 3);
    let t1 = topo(1, 3, shape_k, &[a, b, c]);
    let mut ra = ChainReplica::new(&t1, 0, a, 0).unwrap();
    let mut rb = ChainReplica::new(&t1, 0, b, 0).unwrap();
    let mut out = Outbox::new();
    // c fails; the chain is repaired and extended with d at the tail.
    let t2 = topo(2, 3, shape_k, &[a, b]);
    let t3 = topo(3, 3, shape_k, &[a, b, d]);
    let t2k = if shape_k > 2 { topo(2, 3, 2, &[a, b]) } else { t2.clone() };
    ra.reconfigure(&t2k, a, 10, &mut out);
    rb.reconfigure(&t2k, b, 10, &mut out);
    ra.reconfigure(&t3, a, 20, &mut out);
    rb.reconfigure(&t3, b, 20, &mut out);
    let mut rd = ChainReplica::joining(&t3, 0, d, 0, None, 20, &mut out).unwrap();
    let fetch = take(&mut out, Dest::Node(b));
    out.clear();
    // The client's write arrives at the head, goes to b, and on to d
    // (parked: d is still joining) before b handles d's Fetch.
    ra.put(put(1, 1, ack_at, Condition::Always, Some("v")), 21, &mut out);
    let u = fwd(take(&mut out, Dest::Node(b)));
    rb.forward(u, 22, &mut out);
    let u = fwd(take(&mut out, Dest::Node(d)));
    assert_eq!(u.len(), 1);
    rd.forward(u, 23, &mut out);
    let mut to_client = take(&mut out, Dest::Client(9));
    // Now b answers the Fetch: its state already holds the write.
    assert!(matches!(fetch[..], [Message::Fetch { .. }]));
    rb.fetch(3, d, None, &mut out);
    let Some(Message::Transfer { epoch, state, updates, history_before, clock, on_disk, .. }) = take(&mut out, Dest::Node(d)).pop() else {
        panic!()
    };
    rd.transfer(epoch, state.map(|s| *s), updates, history_before, clock, on_disk, 24, &mut out);
    // Stability flows back up; run everything to quiescence, with ticks.
    for now in (25..2_000).step_by(10) {
        to_client.extend(take(&mut out, Dest::Client(9)));
        for m in take(&mut out, Dest::Node(b)) {
            match m {
                Message::StableUpTo { seq, reported, durable, .. } => rb.stable_up_to(seq, reported, durable, now, &mut out),
                Message::Forward { updates, .. } => rb.forward(updates, now, &mut out),
                _ => {}
            }
        }
        for m in take(&mut out, Dest::Node(a)) {
            if let Message::StableUpTo { seq, reported, durable, .. } = m {
                ra.stable_up_to(seq, reported, durable, now, &mut out)
            }
        }
        for m in take(&mut out, Dest::Node(d)) {
            if let Message::Forward { updates, .. } = m {
                rd.forward(updates, now, &mut out)
            }
        }
        ra.tick(now, None, &|_| false, &mut out);
        rb.tick(now, None, &|_| false, &mut out);
        rd.tick(now, None, &|_| false, &mut out);
    }
    assert_eq!(ra.digest().stable, 1, "the write is stable everywhere");
    assert_eq!(rd.digest().applied, 1);
    assert!(
        to_client.iter().any(|m| matches!(m, Message::PutDone { .. })),
        "the write reached the tail and is stable, yet nobody acknowledged it to the client: {to_client:?}"
    );
}

#[test]
fn linearizable_write_inside_a_state_transfer_is_never_acknowledged() {
    joining_tail_never_acks(2, ACK_AT_TAIL);
}

#[test]
fn causal_write_with_k_eq_r_inside_a_state_transfer_is_never_acknowledged() {
    joining_tail_never_acks(3, 2);
}

/// Replay of the log rebuilds `last_writes`; a checkpoint (restore + replay
/// of its unstable list) does not. A node restarted from a compacted log
/// applies a resent write a second time (here a SET NX, answered "not
/// written" although the first attempt wrote it).
#[test]
fn a_head_restored_from_a_checkpoint_forgets_the_writes_it_has() {
    let (a, b, c) = (0, 1, 2);
    let t = topo(1, 3, 2, &[a, b, c]);
    let mut ra = ChainReplica::new(&t, 0, a, 0).unwrap();
    let mut out = Outbox::new();
    ra.put(put(1, 1, 1, Condition::IfAbsent, Some("v")), 10, &mut out);
    let log: Vec<Update> = ra
        .take_log()
        .into_iter()
        .flat_map(|r| match r {
            LogRecord::Updates { updates, .. } => updates,
            _ => vec![],
        })
        .collect();
    // Restart 1: the plain log.
    let mut replayed = ChainReplica::new(&t, 0, a, 0).unwrap();
    replayed.replay(log, 20);
    let mut o1 = Outbox::new();
    replayed.put(put(2, 1, 1, Condition::IfAbsent, Some("v")), 21, &mut o1);
    assert_eq!(replayed.digest().applied, 1, "log replay: the resend is recognised");
    // Restart 2: the same state, from a checkpoint.
    let cp = ra.checkpoint();
    let mut restored = ChainReplica::new(&t, 0, a, 0).unwrap();
    for m in cp {
        match m {
            LogRecord::State { state, .. } => restored.restore(state, 20),
            LogRecord::Updates { updates, .. } => assert_eq!(restored.replay(updates, 20), None),
            LogRecord::Clock { ceiling, .. } => restored.observe_ceiling(ceiling),
            LogRecord::OnDisk { entries, .. } => assert!(entries.is_empty(), "no disk tier"),
            LogRecord::Dropped { .. }
            | LogRecord::Behind { .. }
            | LogRecord::Lost { .. }
            | LogRecord::Noted { .. }
            | LogRecord::NotesWhole
            | LogRecord::FailingOver => {}
        }
    }
    let mut o2 = Outbox::new();
    restored.put(put(2, 1, 1, Condition::IfAbsent, Some("v")), 21, &mut o2);
    let answers = take(&mut o2, Dest::Client(9));
    assert!(
        !answers.iter().any(|m| matches!(m, Message::PutDone { version: None, .. })),
        "checkpoint restore lost last_writes; the resent SET NX (which did write) is answered 'not written': {answers:?}"
    );
    // And a plain SET resent to it is applied twice.
    let mut restored2 = ChainReplica::new(&t, 0, a, 0).unwrap();
    for m in ra.checkpoint() {
        match m {
            LogRecord::State { state, .. } => restored2.restore(state, 20),
            LogRecord::Updates { updates, .. } => assert_eq!(restored2.replay(updates, 20), None),
            LogRecord::Clock { ceiling, .. } => restored2.observe_ceiling(ceiling),
            LogRecord::OnDisk { entries, .. } => assert!(entries.is_empty(), "no disk tier"),
            LogRecord::Dropped { .. }
            | LogRecord::Behind { .. }
            | LogRecord::Lost { .. }
            | LogRecord::Noted { .. }
            | LogRecord::NotesWhole
            | LogRecord::FailingOver => {}
        }
    }
    restored2.put(put(2, 1, 1, Condition::Always, Some("v")), 21, &mut o2);
    assert_eq!(restored2.digest().applied, 1, "applied twice after checkpoint restore");
}

/// A replica that got the write through a state transfer (joined) and
/// later heads the chain applies a resend of it again.
#[test]
fn a_head_that_joined_by_state_transfer_applies_a_resend_twice() {
    let (a, d, e) = (0, 3, 4);
    let t = topo(1, 2, 1, &[a]);
    let mut ra = ChainReplica::new(&t, 0, a, 0).unwrap();
    let mut out = Outbox::new();
    ra.put(put(1, 1, ACK_AT_TAIL, Condition::Always, Some("v")), 10, &mut out);
    out.clear();
    let t2 = topo(2, 2, 1, &[a, d]);
    ra.reconfigure(&t2, a, 20, &mut out);
    let mut rd = ChainReplica::joining(&t2, 0, d, 0, None, 20, &mut out).unwrap();
    ra.fetch(2, d, None, &mut out);
    let Some(Message::Transfer { epoch, state, updates, history_before, clock, on_disk, .. }) = take(&mut out, Dest::Node(d)).pop() else {
        panic!()
    };
    rd.transfer(epoch, state.map(|s| *s), updates, history_before, clock, on_disk, 21, &mut out);
    // a fails: d heads the chain; the client (still waiting) resends.
    let t3 = topo(3, 2, 1, &[d, e]);
    rd.reconfigure(&t3, d, 30, &mut out);
    rd.put(put(2, 1, ACK_AT_TAIL, Condition::Always, Some("v")), 31, &mut out);
    assert_eq!(rd.digest().applied, 1, "the resent write was applied a second time");
}

/// The driver accepts the first attempt's reply after it resent the write
/// (acknowledgements name the write's id), but not a condition-false "not written" that the
/// old head sent before the configuration changed; the resend meanwhile
/// wrote the key at the new head.
#[test]
fn a_stale_not_written_reply_of_the_first_attempt_wins_over_the_resend() {
    use causeway_core::driver::{Driver, Request};
    use std::sync::Arc;
    let (a, b, c) = (0, 1, 2);
    let t1 = topo(1, 3, 2, &[a, b, c]);
    let mut d = Driver::new(9, Arc::new(t1.clone()), None, 5_000);
    let req = Request::Put { key: Bytes::from("k"), change: Change { condition: Condition::IfAbsent, ..Change::set(Bytes::from("mine")) } };
    let p = d.start(req, 0);
    let [(to, Message::Put(put))] = &p.send[..] else { panic!("{:?}", p.send) };
    let (first, first_write) = (&put.op, &put.write);
    assert_eq!(*to, a);
    // a evaluates the NX: the key is there -> "not written"; the reply is
    // slow. a leaves the chain (e.g. rebalanced away) and b heads it.
    let stale = Message::PutDone { op: *first, version: None, seq: 0, chain_index: 0, stable: false, stable_through: 0, old: None };
    let t2 = topo(2, 3, 2, &[b, c]);
    let p = d.reconfigured(Arc::new(t2.clone()), 100);
    let [(to, Message::Put(put))] = &p.send[..] else { panic!("{:?}", p.send) };
    let causeway_core::message::Put { op: second, write, key, change, past, ack_at, epoch, .. } = &**put;
    assert_eq!(*to, b);
    assert_eq!(write, first_write, "a resend keeps the write's id");
    // Someone deleted k meanwhile; b evaluates the resend: absent -> writes it.
    let mut rb = ChainReplica::new(&t2, 0, b, 0).unwrap();
    let mut out = Outbox::new();
    let _ = epoch;
    rb.put(
        PutRequest {
            op: *second,
            key: key.clone(),
            change: change.clone(),
            past: past.clone(),
            ack_at: *ack_at,
            write: *write,
            done_below: *write,
        },
        101,
        &mut out,
    );
    assert_eq!(rb.digest().applied, 1, "the resend wrote the key");
    // The old head's reply arrives now: ignored, it answers an attempt no
    // longer in flight; the resend's answer counts.
    assert!(d.on_message(stale, 102).done.is_empty(), "a stale 'not written' must not answer the resend");
    assert!(d.is_busy(), "still waiting for the resend's answer (from position k-1)");
}

/// Found by the simulator once its sessions followed configuration changes
/// as proxies do: a write resent on a new configuration was overtaken by the
/// session's next write (the first attempt's answer arrived meanwhile), and
/// the late resend was applied on top of it: an old value over a newer one.
#[test]
fn a_late_resend_of_an_earlier_write_is_not_applied_over_a_newer_one() {
    let t = topo(1, 1, 1, &[0]);
    let mut head = ChainReplica::new(&t, 0, 0, 0).unwrap();
    let mut out = Outbox::new();
    head.put(put(1, 1, 0, Condition::Always, Some("old")), 10, &mut out);
    head.put(put(2, 2, 0, Condition::Always, Some("new")), 11, &mut out);
    // The resend of write 1 (op 3, write id 1) arrives last.
    head.put(put(3, 1, 0, Condition::Always, Some("old")), 12, &mut out);
    let digest = head.digest();
    assert_eq!(digest.applied, 2, "the late resend was applied again");
    assert_eq!(digest.latest[0].1.value.as_deref(), Some(&b"new"[..]));
}
