use super::*;
use crate::ring::{NodeInfo, Shape};

fn put(seq: u64, write: u64) -> PutRequest {
    PutRequest {
        op: OpId { client: 9, seq },
        key: Bytes::from("k"),
        change: Change::set(Bytes::from("v")),
        past: VersionVector::default(),
        ack_at: 1,
        write,
        done_below: write,
    }
}

fn take(out: &mut Outbox, to: Dest) -> Vec<Message> {
    let (mine, rest): (Vec<Envelope>, Vec<Envelope>) = std::mem::take(out).into_iter().partition(|e| e.to == to);
    *out = rest;
    mine.into_iter().map(|e| e.msg).collect()
}

/// One partition on a chain of three (R=3, k=2): the topology, the
/// chain's nodes head first, and their replicas.
fn chain_of_three() -> (Topology, [NodeId; 3], [ChainReplica; 3]) {
    let nodes = (0..3).map(|id| NodeInfo { id, addr: format!("n{id}") }).collect();
    let t = Topology::new(1, Shape { partitions: 1, replicas: 3, k: 2, coding: None }, nodes).unwrap();
    let ids = <[NodeId; 3]>::try_from(t.chain(0).nodes.clone()).unwrap();
    let replicas = ids.map(|n| ChainReplica::new(&t, 0, n, 0).unwrap());
    (t, ids, replicas)
}

#[test]
fn a_write_resent_to_a_new_head_that_has_it_is_answered_not_applied_twice() {
    let (t, [a, b, c], [mut head, mut middle, mut tail]) = chain_of_three();
    let mut out = Outbox::new();
    head.put(put(1, 1), 10, &mut out);
    let Some(Message::Forward { updates, .. }) = take(&mut out, Dest::Node(b)).pop() else { panic!("the head forwards") };
    middle.forward(updates, 11, &mut out);
    // The middle's acknowledgement is lost, and the head dies.
    out.clear();
    let repaired = t.without(a);
    middle.reconfigure(&repaired, b, 20, &mut out);
    tail.reconfigure(&repaired, c, 20, &mut out);
    // The new head catches up from its successor before taking writes.
    middle.put(put(2, 1), 20, &mut out);
    assert!(matches!(&take(&mut out, Dest::Client(9))[..], [Message::Refused { .. }]), "no writes while catching up");
    let to_tail = take(&mut out, Dest::Node(c));
    let Some(&Message::CatchUp { epoch, from, after, .. }) = to_tail.iter().find(|m| matches!(m, Message::CatchUp { .. })) else {
        panic!("asks its successor: {to_tail:?}")
    };
    tail.catch_up(epoch, from, after, &mut out);
    let Some(Message::Suffix { updates, applied, .. }) = take(&mut out, Dest::Node(b)).pop() else { panic!("the successor answers") };
    assert!(updates.is_empty() && applied == 0, "the tail never got the write");
    middle.suffix(epoch, updates, applied, None, Timestamp::ZERO, 20, &mut out);
    // The client resends the write with its id to the new head.
    middle.put(put(2, 1), 21, &mut out);
    assert_eq!(middle.digest().applied, 1, "applied once");
    assert!(take(&mut out, Dest::Client(9)).is_empty(), "answered only once stable");
    assert!(take(&mut out, Dest::Node(c)).iter().all(|m| !matches!(m, Message::Forward { .. })), "nothing new to forward");
    let Some(Message::Forward { updates, .. }) = to_tail.into_iter().find(|m| matches!(m, Message::Forward { .. })) else {
        panic!("the new head resends")
    };
    assert_eq!(updates.len(), 1);
    tail.forward(updates, 22, &mut out);
    take(&mut out, Dest::Client(9));
    let Some(Message::StableUpTo { seq, .. }) = take(&mut out, Dest::Node(b)).pop() else { panic!("the tail acknowledges") };
    middle.stable_up_to(seq, 0, seq, 23, &mut out);
    let replies = take(&mut out, Dest::Client(9));
    assert!(
        matches!(&replies[..], [Message::PutDone { op: OpId { seq: 1, .. }, seq: 1, stable: true, .. }]),
        "the write is acknowledged under its id: {replies:?}"
    );
    // A different write from the same session is applied.
    middle.put(put(3, 3), 30, &mut out);
    assert_eq!(middle.digest().applied, 2);
}

#[test]
fn updates_parked_behind_a_gap_are_dropped_when_the_chain_changes() {
    let (t, [a, b, c], [mut head, mut middle, mut tail]) = chain_of_three();
    let mut out = Outbox::new();
    head.put(put(1, 1), 10, &mut out);
    take(&mut out, Dest::Node(b)); // seq 1 is lost on its way
    head.put(put(2, 2), 11, &mut out);
    let Some(Message::Forward { updates, .. }) = take(&mut out, Dest::Node(b)).pop() else { panic!("the head forwards") };
    assert_eq!(updates.iter().map(|u| u.seq).collect::<Vec<_>>(), [2]);
    middle.forward(updates, 12, &mut out);
    assert_eq!(middle.digest().applied, 0, "seq 2 waits behind the gap");
    // The head dies with seq 1, and the tail moves to the head: [c, b].
    // It has nothing to catch up, and orders a new seq 1.
    out.clear();
    let mut repaired = t.without(a);
    repaired.chains[0].nodes = vec![c, b];
    middle.reconfigure(&repaired, b, 20, &mut out);
    tail.reconfigure(&repaired, c, 20, &mut out);
    let Some(Message::CatchUp { epoch, from, after, .. }) = take(&mut out, Dest::Node(b)).pop() else { panic!("asks its successor") };
    middle.catch_up(epoch, from, after, &mut out);
    let Some(Message::Suffix { updates, applied, .. }) = take(&mut out, Dest::Node(c)).pop() else { panic!("the successor answers") };
    tail.suffix(epoch, updates, applied, None, Timestamp::ZERO, 21, &mut out);
    let mut other = put(3, 1);
    other.key = Bytes::from("new");
    tail.put(other, 22, &mut out);
    let Some(Message::Forward { updates, .. }) = take(&mut out, Dest::Node(b)).pop() else { panic!("the new head forwards") };
    middle.forward(updates, 23, &mut out);
    assert_eq!(middle.digest().applied, 1, "the dead head's seq 2 is not spliced after the new seq 1");
}

#[test]
fn a_replica_that_returns_keeps_what_it_has_not_reported_to_other_sites() {
    let (t, [a, b, c], [mut head, _, _]) = chain_of_three();
    head.enable_geo();
    let mut out = Outbox::new();
    head.put(put(1, 1), 10, &mut out);
    head.recovered_on_disk();
    assert_eq!(head.take_reportable().len(), 1);
    // The head is removed while alive, then placed back at the tail: it
    // keeps its data and asks its predecessor only for what came after.
    let mut back = t.without(a);
    back.epoch = 3;
    back.chains[0].nodes = vec![b, c, a];
    let mut returned = ChainReplica::joining(&back, 0, a, 0, Some(head), 20, &mut out).expect("in the chain");
    returned.enable_geo();
    returned.recovered_on_disk();
    assert_eq!(returned.take_reportable().iter().map(|u| u.seq).collect::<Vec<_>>(), [1], "a new tail reports it");
}

/// With several sites a tail hands its reporter (other sites) only the
/// updates, and passes on only the promises, its disk holds: a site
/// whose machines all crash must not have shown others what it loses.
#[test]
fn a_tail_reports_only_what_its_disk_holds() {
    let (_, [_, b, c], [mut head, mut middle, mut tail]) = chain_of_three();
    for r in [&mut head, &mut middle, &mut tail] {
        r.enable_geo();
    }
    let mut out = Outbox::new();
    head.put(put(1, 1), 10, &mut out);
    for m in take(&mut out, Dest::Node(b)) {
        let Message::Forward { updates, .. } = m else { continue };
        middle.forward(updates, 11, &mut out);
    }
    for m in take(&mut out, Dest::Node(c)) {
        let Message::Forward { updates, .. } = m else { continue };
        tail.forward(updates, 12, &mut out);
    }
    assert_eq!(tail.applied(), 1);
    tail.on_promise(1, Timestamp::new(50, 0));
    assert!(tail.take_reportable().is_empty(), "not on disk yet");
    assert_eq!(tail.reportable_through(), 0);
    assert_eq!(tail.take_promise(), None, "the promise covers what is not on disk");
    tail.mark(7);
    tail.synced(6);
    assert!(tail.take_reportable().is_empty(), "its log record is in ticket 7");
    tail.synced(7);
    assert_eq!(tail.take_reportable().iter().map(|u| u.seq).collect::<Vec<_>>(), [1]);
    assert_eq!(tail.reportable_through(), 1);
    assert_eq!(tail.take_promise(), Some(Timestamp::new(50, 0)));
    assert!(tail.take_reportable().is_empty(), "handed once");
    tail.rewind();
    assert_eq!(tail.take_reportable().len(), 1, "a new reporter gets what is not reported");
}

#[test]
fn a_tail_moved_to_the_head_catches_up_before_it_serves() {
    let (t, [a, b, c], [mut head, mut middle, mut tail]) = chain_of_three();
    let mut out = Outbox::new();
    // Two writes reach the middle (acknowledged at k=2), not the tail.
    head.put(put(1, 1), 10, &mut out);
    head.put(put(2, 2), 10, &mut out);
    for m in take(&mut out, Dest::Node(b)) {
        let Message::Forward { updates, .. } = m else { continue };
        middle.forward(updates, 11, &mut out);
    }
    out.clear();
    // The tail moves to the head: [c, a, b].
    let mut moved = t.clone();
    moved.epoch = 2;
    moved.chains[0].nodes = vec![c, a, b];
    for (r, me) in [(&mut head, a), (&mut middle, b), (&mut tail, c)] {
        r.reconfigure(&moved, me, 20, &mut out);
    }
    // Until it has caught up it takes no writes and serves no reads.
    tail.put(put(3, 3), 21, &mut out);
    assert!(matches!(tail.get(b"k", None, 21), Err(Refusal::NotResponsible { .. })));
    let refused = take(&mut out, Dest::Client(9));
    assert_eq!(refused.iter().filter(|m| matches!(m, Message::Refused { .. })).count(), 1, "{refused:?}");
    let to_a = take(&mut out, Dest::Node(a));
    let Some(&Message::CatchUp { epoch, from, after, .. }) = to_a.iter().find(|m| matches!(m, Message::CatchUp { .. })) else {
        panic!("asks its new successor, the old head: {to_a:?}")
    };
    assert_eq!(after, 0);
    head.catch_up(epoch, from, after, &mut out);
    let Some(Message::Suffix { updates, applied, .. }) = take(&mut out, Dest::Node(c)).pop() else { panic!("the old head answers") };
    assert_eq!((updates.len(), applied), (2, 2));
    tail.suffix(epoch, updates, applied, None, Timestamp::ZERO, 22, &mut out);
    // Now it orders the next write after what the chain holds.
    out.clear();
    tail.put(put(5, 5), 23, &mut out);
    assert_eq!(tail.digest().applied, 3, "the next write is seq 3, not a reused 1");
}

/// Found by `cli/tests/recovery.rs` on a loaded machine: a member that
/// moved up adopted the new order before its successor, which ignored
/// its `CatchUp`; it was to ask again after a silence, but writes kept
/// flowing through it and the successor kept acknowledging them, so it
/// never did, and stayed catching up (the coordinator waited for it).
#[test]
fn a_member_that_moved_up_asks_again_while_writes_flow_past_it() {
    let (t, ids, [head, middle, tail]) = chain_of_three();
    let [a, b, c] = ids;
    let mut rs = [head, middle, tail];
    let mut out = Outbox::new();
    // The tail moves up to the middle: [a, c, b]. It adopts the new
    // order first; b, still in the old one, ignores its request.
    let mut moved = t.clone();
    moved.epoch = 2;
    moved.chains[0].nodes = vec![a, c, b];
    rs[2].reconfigure(&moved, c, 10, &mut out);
    assert!(rs[2].is_catching_up());
    let Some(Message::CatchUp { epoch, from, after, .. }) = take(&mut out, Dest::Node(b)).pop() else { panic!("asks b") };
    rs[1].catch_up(epoch, from, after, &mut out);
    assert!(out.is_empty(), "b is still in the old order: {out:?}");
    rs[0].reconfigure(&moved, a, 11, &mut out);
    rs[1].reconfigure(&moved, b, 11, &mut out);
    // A write every 50 ms flows through c, and b acknowledges each.
    let mut write = 0;
    for ms in (20..2_000).step_by(10) {
        if ms % 50 == 0 {
            write += 1;
            rs[0].put(put(write, write), ms, &mut out);
        }
        for r in rs.iter_mut() {
            r.tick(ms, None, &|_| false, &mut out);
        }
        while !out.is_empty() {
            for env in std::mem::take(&mut out) {
                let Dest::Node(n) = env.to else { continue };
                let r = &mut rs[ids.iter().position(|&i| i == n).unwrap()];
                match env.msg {
                    Message::Forward { updates, .. } => r.forward(updates, ms, &mut out),
                    Message::StableUpTo { seq, reported, durable, .. } => r.stable_up_to(seq, reported, durable, ms, &mut out),
                    Message::CatchUp { epoch, from, after, .. } => r.catch_up(epoch, from, after, &mut out),
                    Message::Suffix { epoch, updates, applied, state, clock, .. } => {
                        r.suffix(epoch, updates, applied, state.map(|s| *s), clock, ms, &mut out)
                    }
                    _ => {}
                }
            }
        }
        if !rs[2].is_catching_up() {
            break;
        }
    }
    assert!(!rs[2].is_catching_up(), "c is still catching up after {write} writes passed it");
    assert_eq!(rs.iter().map(|r| r.digest().applied).collect::<Vec<_>>(), [write; 3]);
}

#[test]
fn a_recovered_replica_placed_ahead_of_a_longer_log_takes_its_successors_state() {
    let (t, [a, b, c], [mut head, _, _]) = chain_of_three();
    let mut out = Outbox::new();
    head.put(put(1, 1), 10, &mut out);
    let first = logged(&mut head);
    head.put(put(2, 2), 11, &mut out);
    head.stable_up_to(2, 0, 2, 12, &mut out);
    out.clear();
    // c recovers a log with only the first write, and a reorder that
    // was committed while the site was down puts it at the head.
    let mut recovered = ChainReplica::detached(0, c, 0, 2);
    recovered.restore(
        PartitionState { applied: 0, stable: 0, entries: Vec::new(), sessions: Vec::new(), history: 0, unreported: Vec::new() },
        20,
    );
    assert_eq!(recovered.replay(first, 20), None);
    let mut moved = t.clone();
    moved.epoch = 2;
    moved.chains[0].nodes = vec![c, a, b];
    recovered.reconfigure(&moved, c, 21, &mut out);
    head.reconfigure(&moved, a, 21, &mut out);
    let to_a = take(&mut out, Dest::Node(a));
    let Some(&Message::CatchUp { epoch, from, after, .. }) = to_a.iter().find(|m| matches!(m, Message::CatchUp { .. })) else {
        panic!("asks its successor: {to_a:?}")
    };
    head.catch_up(epoch, from, after, &mut out);
    let Some(Message::Suffix { updates, applied, state, .. }) = take(&mut out, Dest::Node(c)).pop() else { panic!("answered") };
    assert!(state.is_some(), "the second write is stable at a and no longer kept as an update: the whole state");
    recovered.suffix(epoch, updates, applied, state.map(|s| *s), Timestamp::ZERO, 22, &mut out);
    recovered.put(put(3, 3), 23, &mut out);
    assert_eq!(recovered.digest().applied, 3, "orders after what the chain holds");
}

fn logged(r: &mut ChainReplica) -> Vec<Update> {
    r.take_log()
        .into_iter()
        .flat_map(|rec| match rec {
            LogRecord::Updates { updates, .. } => updates,
            LogRecord::State { .. }
            | LogRecord::Dropped { .. }
            | LogRecord::Behind { .. }
            | LogRecord::Clock { .. }
            | LogRecord::OnDisk { .. }
            | LogRecord::Lost { .. }
            | LogRecord::Noted { .. }
            | LogRecord::NotesWhole
            | LogRecord::FailingOver => Vec::new(),
        })
        .collect()
}

/// A head asked to promise past a time promises past it, so the id
/// waiting for it becomes stable even if this clock lags; but an ask
/// from a clock more than `MAX_CLOCK_SKEW_MS` ahead does not drag this
/// one along.
#[test]
fn a_head_promises_past_what_the_leader_asks_within_the_skew_bound() {
    let (_, _, [mut r, _, _]) = chain_of_three();
    r.make_promise(13_000, Timestamp::new(13_050, 3));
    assert_eq!(r.take_promise(), Some(Timestamp::new(13_050, 3)));
    let far = 20_000 + crate::hlc::MAX_CLOCK_SKEW_MS + 1;
    r.make_promise(20_000, Timestamp::new(far, 0));
    let promised = r.take_promise().expect("a promise");
    assert!(promised.physical_ms() <= 20_000 + crate::hlc::MAX_CLOCK_SKEW_MS, "{promised:?}");
}

/// A head whose clock ran 3 s ahead promises; restarted with the clock
/// right again, it recovers the logged ceiling and orders its next
/// write above the promise (before the fix it ordered it 3 s below).
#[test]
fn a_promise_leaves_only_under_a_logged_ceiling() {
    let (t, [head, ..], [mut r, _, _]) = chain_of_three();
    r.make_promise(13_000, Timestamp::ZERO);
    let promised = r.take_promise().expect("a head promises at once");
    let ceiling = r
        .take_log()
        .into_iter()
        .find_map(|rec| match rec {
            LogRecord::Clock { ceiling, .. } => Some(ceiling),
            _ => None,
        })
        .expect("the ceiling is logged before the promise leaves");
    assert!(ceiling > promised);
    let mut back = ChainReplica::new(&t, 0, head, 0).unwrap();
    back.observe_ceiling(ceiling);
    let mut out = Outbox::new();
    back.put(put(1, 1), 10_000, &mut out);
    assert!(logged(&mut back)[0].version.ts > promised);
}

/// The whole-site restart bug: two connections writing through one head
/// could log update n+1 before n, and replay dropped every update after
/// the inversion, so the restarted head reused sequence numbers its
/// successors held. Replay now orders what it reads, and stops loudly at
/// a real gap.
#[test]
fn replay_orders_the_log_and_reports_a_gap() {
    let (t, [head, ..], [mut r, _, _]) = chain_of_three();
    let mut out = Outbox::new();
    for i in 0..5 {
        r.put(put(i, i), 10 + i, &mut out);
    }
    let mut log = logged(&mut r);
    assert_eq!(log.iter().map(|u| u.seq).collect::<Vec<_>>(), vec![1, 2, 3, 4, 5]);
    log.swap(1, 2);
    let mut back = ChainReplica::new(&t, 0, head, 0).unwrap();
    assert_eq!(back.replay(log.clone(), 100), None);
    assert_eq!(back.digest(), r.digest(), "every update back, in order");
    log.remove(2); // seq 2 (after the swap) is lost
    let mut gapped = ChainReplica::new(&t, 0, head, 0).unwrap();
    assert_eq!(gapped.replay(log, 100), Some(2), "the gap is reported");
    assert_eq!(gapped.digest().applied, 1, "nothing after the gap is guessed");
}

#[test]
fn the_tail_tells_every_replica_before_it_that_a_write_is_stable() {
    let (_, [a, b, c], [mut head, mut middle, mut tail]) = chain_of_three();
    let mut out = Outbox::new();
    head.put(put(1, 1), 10, &mut out);
    let Some(Message::Forward { updates, .. }) = take(&mut out, Dest::Node(b)).pop() else { panic!("the head forwards") };
    middle.forward(updates, 11, &mut out);
    take(&mut out, Dest::Client(9));
    let Some(Message::Forward { updates, .. }) = take(&mut out, Dest::Node(c)).pop() else { panic!("the middle forwards") };
    tail.forward(updates, 12, &mut out);
    let to_head = take(&mut out, Dest::Node(a));
    let to_middle = take(&mut out, Dest::Node(b));
    assert!(matches!(&to_head[..], [Message::StableUpTo { seq: 1, .. }]), "the head hears from the tail: {to_head:?}");
    assert!(matches!(&to_middle[..], [Message::StableUpTo { seq: 1, .. }]), "and so does the middle: {to_middle:?}");
    for (r, msg) in [(&mut middle, &to_middle[0]), (&mut head, &to_head[0])] {
        let &Message::StableUpTo { seq, reported, durable, .. } = msg else { unreachable!() };
        r.stable_up_to(seq, reported, durable, 13, &mut out);
        assert_eq!(r.stable(), 1);
    }
    assert!(out.is_empty(), "nobody passes it on: {out:?}");
}

/// A write of `key` with an expiry `ttl_ms` after it is ordered, if any.
fn put_key(write: u64, key: &str, ttl_ms: Option<u64>) -> PutRequest {
    let mut change = Change::set(Bytes::from("value"));
    if let Some(ttl) = ttl_ms {
        change.expiry = crate::message::Expiry::After(ttl);
    }
    PutRequest { key: Bytes::from(key.to_string()), change, ..put(write, write) }
}

#[test]
fn a_head_evicts_by_its_policy_with_tombstones_down_the_chain() {
    let (_, [_, b, _], [mut head, _, _]) = chain_of_three();
    let mut out = Outbox::new();
    // Six keys: a, b and c forever, d, e and f expiring in 30, 10 and 20 s.
    for (i, (key, ttl)) in
        [("a", None), ("b", None), ("c", None), ("d", Some(30_000)), ("e", Some(10_000)), ("f", Some(20_000))].into_iter().enumerate()
    {
        head.put(put_key(i as u64 + 1, key, ttl), 10, &mut out);
    }
    out.clear();
    let live = |r: &ChainReplica| {
        ["a", "b", "c", "d", "e", "f"]
            .into_iter()
            .filter(|k| r.store.latest(k.as_bytes()).is_some_and(|v| v.value().is_some()))
            .collect::<String>()
    };
    assert_eq!(head.evict(Policy::NoEviction, 1 << 20, 20, &mut out), (0, 0));
    // Soonest to expire first, one key at a time (each is a few dozen bytes).
    let (freed, n) = head.evict(Policy::VolatileTtl, 1, 20, &mut out);
    assert!(n == 1 && freed > 0);
    assert_eq!(live(&head), "abcdf");
    head.evict(Policy::VolatileTtl, 1, 20, &mut out);
    assert_eq!(live(&head), "abcd");
    // Random among keys with an expiry: only d is left of those.
    head.evict(Policy::VolatileRandom, 1 << 20, 20, &mut out);
    assert_eq!(live(&head), "abc");
    assert_eq!(head.evict(Policy::VolatileRandom, 1 << 20, 20, &mut out), (0, 0), "nothing volatile left");
    // Any key: one of the three, then the others.
    let (_, n) = head.evict(Policy::AllKeysRandom, 1, 20, &mut out);
    assert_eq!((n, live(&head).len()), (1, 2));
    head.evict(Policy::AllKeysRandom, 1 << 20, 20, &mut out);
    assert_eq!(live(&head), "");
    // Every eviction went down the chain as a tombstone of the version it
    // deleted, which a later write beats.
    let forwarded: Vec<Update> = take(&mut out, Dest::Node(b))
        .into_iter()
        .flat_map(|m| match m {
            Message::Forward { updates, .. } => updates,
            _ => Vec::new(),
        })
        .collect();
    assert_eq!(forwarded.len(), 6);
    assert!(forwarded.iter().all(|u| u.value.is_none() && u.expired && u.ack.is_none()));
    head.put(put_key(7, "a", None), 30, &mut out);
    assert_eq!(live(&head), "a");
}

#[test]
fn only_a_serving_head_evicts() {
    let (_, _, [_, mut middle, _]) = chain_of_three();
    let mut out = Outbox::new();
    assert_eq!(middle.evict(Policy::AllKeysRandom, 1 << 20, 20, &mut out), (0, 0));
    assert!(out.is_empty());
}

#[test]
fn lru_and_lfu_evict_the_keys_least_used_at_the_head() {
    let (_, _, [mut head, _, _]) = chain_of_three();
    let mut out = Outbox::new();
    let keys = ["a", "b", "c", "d"];
    for (i, key) in keys.into_iter().enumerate() {
        head.put(put_key(i as u64 + 1, key, None), 1_000, &mut out);
    }
    // a read a minute later, b two, c three; d never again. c read often.
    for (key, at) in [("a", 61_000), ("b", 121_000), ("c", 181_000)] {
        head.get(key.as_bytes(), None, at).unwrap();
    }
    for _ in 0..50 {
        head.get(b"c", None, 181_000).unwrap();
    }
    let live = |r: &ChainReplica| {
        keys.into_iter().filter(|k| r.store.latest(k.as_bytes()).is_some_and(|v| v.value().is_some())).collect::<String>()
    };
    // LRU: the longest idle first (the sample is the whole partition here).
    head.evict(Policy::AllKeysLru, 1, 200_000, &mut out);
    assert_eq!(live(&head), "abc");
    head.evict(Policy::AllKeysLru, 1, 200_000, &mut out);
    assert_eq!(live(&head), "bc");
    // LFU: b was used twice (written, read), c fifty times more.
    head.evict(Policy::AllKeysLfu, 1, 200_000, &mut out);
    assert_eq!(live(&head), "c");
    // The volatile ones find nothing: no key has an expiry.
    assert_eq!(head.evict(Policy::VolatileLru, 1 << 20, 200_000, &mut out), (0, 0));
    assert_eq!(head.evict(Policy::VolatileLfu, 1 << 20, 200_000, &mut out), (0, 0));
}

#[test]
fn a_sample_of_tombstones_is_not_taken_for_nothing_left_to_evict() {
    let (_, _, [mut head, _, _]) = chain_of_three();
    let mut out = Outbox::new();
    for i in 0..200 {
        head.put(put_key(i + 1, &format!("k{i}"), None), 1_000, &mut out);
    }
    // All but one deleted: tombstones, not collected (nothing is stable).
    for i in 1..200 {
        let delete = PutRequest { change: Change::delete(), ..put_key(300 + i, &format!("k{i}"), None) };
        head.put(delete, 2_000, &mut out);
    }
    assert_eq!(head.evict(Policy::AllKeysLru, 1, 3_000, &mut out).1, 1, "k0 is found however the sample falls");
}

/// Large values go down the chain in messages of at most `FORWARD_BYTES`
/// (one larger value alone), first as written and again when resent: a
/// peer link drops a message past its backlog's limit, so one message of
/// everything unstable would be dropped at every resend.
#[test]
fn large_updates_are_forwarded_and_resent_in_bounded_messages() {
    let (_, [_, b, _], [mut head, ..]) = chain_of_three();
    let mut out = Outbox::new();
    let mut forwarded = Vec::new();
    for (i, len) in [(1, 6 << 20), (2, 6 << 20), (3, 20 << 20)] {
        let mut req = put(i, i);
        req.key = Bytes::from(format!("k{i}"));
        req.change = Change::set(Bytes::from(vec![b'v'; len]));
        head.put(req, 10, &mut out);
        forwarded.extend(take(&mut out, Dest::Node(b)));
    }
    let sizes = |msgs: &[Message]| -> Vec<usize> {
        msgs.iter()
            .map(|m| match m {
                Message::Forward { updates, .. } => updates.iter().map(forward_bytes).sum(),
                other => panic!("{other:?}"),
            })
            .collect()
    };
    assert_eq!(forwarded.len(), 3, "one message per write here");
    // Nothing acknowledged: the head resends everything unstable, once the
    // first copies could have arrived (32 MB: half a second more).
    let wait = crate::resend_wait_ms(RETRANSMIT_MS, sizes(&forwarded).iter().sum());
    assert!(wait >= RETRANSMIT_MS + 400, "{wait}");
    head.tick(10 + wait - 1, None, &|_| false, &mut out);
    assert!(take(&mut out, Dest::Node(b)).is_empty(), "not resent while the first copies may be on their way");
    head.tick(10 + wait, None, &|_| false, &mut out);
    let resent = take(&mut out, Dest::Node(b));
    let resent_sizes = sizes(&resent);
    assert_eq!(resent_sizes.len(), 2, "6 + 6 MB, then 20 MB alone: {resent_sizes:?}");
    assert!(resent_sizes[0] <= FORWARD_BYTES);
    assert_eq!(resent_sizes.iter().sum::<usize>(), sizes(&forwarded).iter().sum::<usize>());
}
