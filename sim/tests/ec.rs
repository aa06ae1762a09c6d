//! Erasure-coded groups (`core/src/ec`) in the simulator: a 3+2 group, 8
//! clients writing values of 0 B to 9 KB (across pages) and deleting, and
//! reading; two members crash one after the other (any two of the five:
//! a data member then the recovery leader, two data members, ...), the
//! second often while the first is being recovered. Then every key is
//! read once more and the whole history must be linearizable (porcupine):
//! no acknowledged write lost, no read older than an acknowledged write;
//! and, once quiet, every live parity page must be the code of the data
//! pages (the recovered ones included).
//!
//! With replacements: members crash in sequence, never more than M down
//! at once, and each lost one is replaced by an empty member, rebuilt
//! while the clients go on (more than M failures over the run in all).
//!
//! `SEED=n cargo test -p causeway-sim --test ec` replays one schedule,
//! `SEEDS=a..b` runs more.

use bytes::Bytes;
use causeway_checker::lincheck::{self, Op, OpKind};
use causeway_core::ec::{Reply, Slot};
use causeway_sim::ec::{check_stripes, EcWorld, Request};
use causeway_sim::workload::seeds;
use causeway_sim::Rng;
use std::collections::HashMap;

const CLIENTS: usize = 16;
const KEYS: u64 = 40;
const WRITE_MS: u64 = 2_500;
const TIMEOUT_MS: u64 = 1_000;

struct Pending {
    client: usize,
    key: String,
    kind: Kind,
    call: u64,
}

#[derive(Clone)]
enum Kind {
    Put(String, Option<Bytes>),
    Get,
}

/// The tag a value starts with (what the history records).
fn tag(value: &[u8]) -> String {
    let end = value.iter().position(|&b| b == b'|').unwrap_or(value.len());
    String::from_utf8_lossy(&value[..end]).into_owned()
}

struct Run {
    world: EcWorld,
    rng: Rng,
    pending: HashMap<u64, Pending>,
    busy: Vec<bool>,
    history: Vec<Op>,
    next_op: u64,
    written: u64,
}

impl Run {
    fn send(&mut self, op: u64) {
        let p = &self.pending[&op];
        let key = Bytes::from(p.key.clone());
        let req = match &p.kind {
            Kind::Put(_, value) => Request::Put { op, key, value: value.clone() },
            Kind::Get => Request::Get { op, key },
        };
        let replies = self.world.submit(req);
        self.answer(replies);
    }

    fn start(&mut self, client: usize, key: String, kind: Kind) {
        let op = self.next_op;
        self.next_op += 1;
        self.busy[client] = true;
        self.pending.insert(op, Pending { client, key, kind, call: self.world.now() });
        self.send(op);
    }

    fn answer(&mut self, replies: Vec<(u64, Reply)>) {
        for (op, reply) in replies {
            if reply == Reply::NotHere {
                // Routed by an older configuration: to the member serving it now.
                if self.pending.contains_key(&op) {
                    self.send(op);
                }
                continue;
            }
            let Some(p) = self.pending.remove(&op) else { continue };
            self.busy[p.client] = false;
            let now = self.world.now() as i64;
            let kind = match (p.kind, reply) {
                (Kind::Put(tag, _), Reply::Done { .. }) => OpKind::Put(tag),
                (Kind::Get, Reply::Value(v)) => OpKind::Get(v.map(|(v, _, _)| tag(&v)).unwrap_or_default()),
                (_, r) => panic!("unexpected reply {r:?}"),
            };
            self.history.push(Op { client: p.client, key: p.key, kind, call: p.call as i64, ret: Some(now) });
        }
    }

    /// Requests older than the timeout: writes of unknown outcome, reads dropped.
    fn expire(&mut self) {
        let now = self.world.now();
        let old: Vec<u64> = self.pending.iter().filter(|(_, p)| now - p.call > TIMEOUT_MS).map(|(op, _)| *op).collect();
        for op in old {
            let p = self.pending.remove(&op).expect("pending");
            self.busy[p.client] = false;
            if let Kind::Put(tag, _) = p.kind {
                self.history.push(Op { client: p.client, key: p.key, kind: OpKind::Put(tag), call: p.call as i64, ret: None });
            }
        }
    }

    fn step(&mut self, ms: u64) {
        for _ in 0..ms {
            let replies = self.world.run(1);
            self.answer(replies);
            self.expire();
        }
    }
}

fn run(seed: u64, replace: bool) -> Result<String, String> {
    let mut rng = Rng::new(seed ^ 0xec);
    let mut world = EcWorld::new(seed, 3, 2);
    world.max_delay_ms = 1 + rng.below(12);
    if rng.chance(0.5) {
        world.slow = Some((rng.below(3) as Slot, 5 + rng.below(20)));
    }
    let first = rng.below(5) as Slot;
    let second = (first + 1 + rng.below(4) as Slot) % 5;
    let crash_at = [300 + rng.below(600), 0];
    let crash_at = [crash_at[0], crash_at[0] + 20 + rng.below(700)];
    // With replacements: a crash every 300-1000 ms while fewer than M are
    // down, and each lost member replaced 0-300 ms after it is noticed.
    let mut next_crash = crash_at[0];
    let mut replace_at: Vec<(Slot, u64)> = Vec::new();
    let mut victims = Vec::new();
    let write_ms = if replace { 3 * WRITE_MS } else { WRITE_MS };
    let mut r = Run { world, rng, pending: HashMap::new(), busy: vec![false; CLIENTS + 1], history: Vec::new(), next_op: 0, written: 0 };
    while r.world.now() < write_ms {
        if !replace {
            for (i, &at) in crash_at.iter().enumerate() {
                if r.world.now() == at {
                    r.world.crash([first, second][i]);
                }
            }
        } else {
            let now = r.world.now();
            // Down: crashed, lost, joining, or a replacement not whole yet
            // (its slot not taken back, or pages not decoded yet).
            let down = (0..5)
                .filter(|&s| {
                    let m = r.world.member(s);
                    m.is_none() || !r.world.config.alive[s as usize] || m.is_some_and(|m| !m.whole())
                })
                .count();
            if now >= next_crash && now < write_ms - 1_000 {
                next_crash = now + 300 + r.rng.below(700);
                let victim = r.rng.below(5) as Slot;
                if down < 2 && r.world.member(victim).is_some() {
                    r.world.crash(victim);
                    victims.push(victim);
                }
            }
            for s in 0..5 {
                if r.world.is_lost(s) && !replace_at.iter().any(|(x, _)| *x == s) {
                    replace_at.push((s, now + r.rng.below(300)));
                }
            }
            let due: Vec<Slot> = replace_at.iter().filter(|(_, at)| *at <= now).map(|(s, _)| *s).collect();
            replace_at.retain(|(_, at)| *at > now);
            for s in due {
                let replies = r.world.replace(s);
                r.answer(replies);
            }
        }
        for c in 0..CLIENTS {
            if r.busy[c] {
                continue;
            }
            let key = format!("k{}", r.rng.below(KEYS));
            let kind = if r.rng.chance(0.5) {
                Kind::Get
            } else if r.rng.chance(0.1) {
                Kind::Put(String::new(), None)
            } else {
                r.written += 1;
                let tag = format!("c{c}w{}", r.written);
                let size = if r.rng.chance(0.5) { r.rng.below(9_000) } else { r.rng.below(200) } as usize;
                let mut v = format!("{tag}|").into_bytes();
                v.extend((0..size).map(|i| b'a' + ((i as u64 + r.written) % 26) as u8));
                Kind::Put(tag, Some(v.into()))
            };
            r.start(c, key, kind);
        }
        r.step(1);
    }
    // Quiet: no writers, recovery finished.
    let mut waited = 0;
    while !(r.pending.is_empty() && r.world.quiet()) {
        r.step(10);
        waited += 10;
        if replace {
            for s in 0..5 {
                if r.world.is_lost(s) {
                    let replies = r.world.replace(s);
                    r.answer(replies);
                }
            }
        }
        if waited > 60_000 {
            let status: Vec<String> =
                (0..5).map(|s| format!("{s}: {:?}", r.world.member(s).map(|m| (m.settled(), m.rebuilt(), m.status())))).collect();
            return Err(format!(
                "not quiet 60 s after the writers stopped (crashed {first} then {second}, victims {victims:?}), {:?}, pending {}:\n{}",
                r.world.config,
                r.pending.len(),
                status.join("\n")
            ));
        }
    }
    check_stripes(r.world.code(), &r.world.stripes()?)?;
    // Every key read once more: each must answer.
    for k in 0..KEYS {
        r.start(CLIENTS, format!("k{k}"), Kind::Get);
        let mut waited = 0;
        while r.busy[CLIENTS] {
            r.step(1);
            waited += 1;
            if waited > 5_000 {
                return Err(format!("final read of k{k} never answered"));
            }
        }
    }
    if !lincheck::check(&r.history) {
        if replace {
            return Err(format!("not linearizable (crashed and replaced {victims:?})"));
        }
        return Err(format!("not linearizable (crashed {first} at {} then {second} at {})", crash_at[0], crash_at[1]));
    }
    let given_back: u64 = r.world.memory().iter().flatten().map(|m| m.given_back).sum();
    if replace {
        let joins = r.world.delivered.get("state").copied().unwrap_or(0);
        let acked = r.history.iter().filter(|o| matches!(o.kind, OpKind::Put(_)) && o.ret.is_some()).count();
        return Ok(format!(
            "crashed and replaced {victims:?}; {} ops, {acked} writes acknowledged; {joins} state parts; {given_back} pages given back by the live members",
            r.history.len()
        ));
    }
    let acked = r.history.iter().filter(|o| matches!(o.kind, OpKind::Put(_)) && o.ret.is_some()).count();
    let d = &r.world.delivered;
    let n = |k: &str| d.get(k).copied().unwrap_or(0);
    Ok(format!(
        "crashed {first} then {second}; {} ops, {acked} writes acknowledged; {} preparations, {} cuts, {} page sets; {given_back} pages given back by the live members",
        r.history.len(),
        n("stable"),
        n("cut"),
        n("pages")
    ))
}

#[test]
fn any_two_members_of_a_3_plus_2_group_fail_and_nothing_acknowledged_is_lost() {
    for seed in seeds(0..100) {
        match run(seed, false) {
            Ok(summary) => eprintln!("seed {seed}: {summary}"),
            Err(e) => panic!("seed {seed}: {e}"),
        }
    }
}

#[test]
fn members_fail_in_sequence_and_replacements_are_rebuilt_under_load() {
    for seed in seeds(0..60) {
        match run(seed, true) {
            Ok(summary) => eprintln!("seed {seed}: {summary}"),
            Err(e) => panic!("seed {seed}: {e}"),
        }
    }
}

/// Deleted and overwritten values give their pages back: the data pages
/// no value is on any more are zeroed through the parity (an update that
/// changes no key) and dropped, and a parity page goes once its stripe is
/// all zeros. After every key is deleted, nothing is left but the pages
/// nothing was ever freed from.
#[test]
fn pages_no_value_is_on_are_given_back_through_the_parity() {
    let mut world = EcWorld::new(7, 3, 2);
    let held = |world: &EcWorld| -> (usize, usize) { world.memory().iter().flatten().fold((0, 0), |(d, p), m| (d + m.data, p + m.parity)) };
    let mut op = 0;
    for round in 0..3u8 {
        for k in 0..300 {
            op += 1;
            let value = vec![b'a' + round; 50 + (k * 37) % 3_000];
            world.submit(Request::Put { op, key: format!("k{k}").into(), value: Some(value.into()) });
        }
        world.run(100);
    }
    world.run(500);
    assert!(world.quiet());
    check_stripes(world.code(), &world.stripes().unwrap()).expect("a quiet group agrees");
    let (data, parity) = held(&world);
    // 300 values of 1.5 KB on average over three data slots, rewritten
    // twice: the pages of the first two rounds went back.
    assert!(data < 3 * 300 * 1_600 / 2, "{data} bytes of data pages for 450 KB of values");
    for k in (0..300).step_by(2) {
        op += 1;
        world.submit(Request::Put { op, key: format!("k{k}").into(), value: None });
    }
    world.run(500);
    // Half the values are left: read back whole.
    for k in (1..300).step_by(2) {
        op += 1;
        let replies = world.submit(Request::Get { op, key: format!("k{k}").into() });
        let replies = if replies.is_empty() { world.run(50) } else { replies };
        let expected = vec![b'c'; 50 + (k * 37) % 3_000];
        assert!(
            replies.iter().any(|(o, r)| *o == op && matches!(r, Reply::Value(Some((v, _, _))) if v[..] == expected[..])),
            "k{k}: {replies:?}"
        );
    }
    for k in (1..300).step_by(2) {
        op += 1;
        world.submit(Request::Put { op, key: format!("k{k}").into(), value: None });
    }
    world.run(1_000);
    assert!(world.quiet());
    check_stripes(world.code(), &world.stripes().unwrap()).expect("a quiet group agrees");
    let (after, parity_after) = held(&world);
    let given_back: u64 = world.memory().iter().flatten().map(|m| m.given_back).sum();
    assert_eq!((after, parity_after), (0, 0), "{data} and {parity} bytes of data and parity pages before, {given_back} pages given back");
}

#[test]
fn the_parity_check_catches_a_parity_page_that_missed_an_update() {
    let mut world = EcWorld::new(1, 3, 2);
    for k in 0..20 {
        world.submit(Request::Put { op: k, key: format!("k{k}").into(), value: Some(vec![b'x'; 300].into()) });
    }
    world.run(200);
    assert!(world.quiet());
    let mut stripes = world.stripes().unwrap();
    check_stripes(world.code(), &stripes).expect("a quiet group agrees");
    stripes[0][4].as_mut().unwrap()[7] ^= 1;
    assert!(check_stripes(world.code(), &stripes).is_err());
}
