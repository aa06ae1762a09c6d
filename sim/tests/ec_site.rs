//! An erasure-coded site (`Shape::coding`, ec:3+2 on 5 nodes) in the full
//! simulator: the real nodes (`core::node` with its `ec::site::Engine`),
//! the real drivers as clients, and the real coordinator logic
//! (`Supervisor`) noticing crashes and removing nodes. Clients write and
//! read a few keys while two nodes crash one after the other (any two of
//! the five: each is a data member of three groups and a parity member of
//! two; the coordinator runs on all five); the whole
//! history must pass porcupine, and once quiet every parity page must be
//! the code of its group's data pages. Links between group
//! members keep order (TCP does); with `drop_rate` messages are lost too.
//!
//! With restarts: nodes crash in sequence (never more than two down or
//! still being rebuilt) and each comes back as a new process, rejoins and is
//! rebuilt while the clients go on: more than M failures over the run.
//!
//! `SEED=n cargo test -p causeway-sim --test ec_site` replays one schedule.

use bytes::Bytes;
use causeway_checker::lincheck::{self, Op, OpKind};
use causeway_core::driver::{Consistency, Request, Response};
use causeway_core::ec::code::Code;
use causeway_core::message::Change;
use causeway_core::ring::{Coding, NodeId, Shape};
use causeway_sim::ec::check_stripes;
use causeway_sim::workload::seeds;
use causeway_sim::{Completed, Network, Rng, Sim, FAILURE_TIMEOUT_MS};

const SHAPE: Shape = Shape { partitions: 20, replicas: 1, k: 1, coding: Some(Coding { data: 3, parity: 2 }) };
const CLIENTS: usize = 8;
const KEYS: u64 = 12;

fn text(value: &Option<Bytes>) -> String {
    value.as_ref().map(|v| String::from_utf8_lossy(v).to_string()).unwrap_or_default()
}

/// Whether node `n` is down for the group's tolerance: crashed, or back but
/// not yet rebuilt (not a member, or pages still to decode).
fn down(sim: &Sim, n: NodeId) -> bool {
    if sim.is_crashed(n) {
        return true;
    }
    !sim.node(n).ec().expect("an ec node").whole()
}

fn run(seed: u64, network: Network, restarts: bool) -> Result<String, String> {
    let mut sim = Sim::new(seed, 5, SHAPE, CLIENTS, network).with_coordinator();
    for c in 0..CLIENTS {
        sim.set_consistency(c, Consistency::Linearizable);
    }
    let mut rng = Rng::new(seed ^ 0xec5);
    // Any two: the coordinator of a coded site runs on 2M+1 nodes, all
    // five here.
    let first = rng.below(5) as NodeId;
    let second = (first + 1 + rng.below(4) as NodeId) % 5;
    let start = sim.now_ms;
    let crash_at = [start + 500 + rng.below(500), 0];
    let crash_at = [crash_at[0], crash_at[0] + 100 + rng.below(FAILURE_TIMEOUT_MS * 2)];
    let mut clock = 0i64;
    let mut pending: Vec<Option<Op>> = vec![None; CLIENTS];
    let mut history = Vec::new();
    let (mut acked, mut failed) = (0, 0);
    let mut finish = |c: Completed, clock: &mut i64, pending: &mut Vec<Option<Op>>, history: &mut Vec<Op>| {
        *clock += 1;
        let mut op = pending[c.client].take().expect("a call was recorded");
        match (&mut op.kind, &c.result) {
            (OpKind::Put(_), Ok(_)) => {
                acked += 1;
                op.ret = Some(*clock);
            }
            (OpKind::Put(_), Err(_)) => failed += 1,
            (OpKind::Get(out), Ok(Response::Read { value, .. })) => {
                *out = text(value);
                op.ret = Some(*clock);
            }
            (OpKind::Get(_), _) => return,
            (OpKind::MultiGet { .. }, _) => unreachable!("no MGET here"),
        }
        history.push(op);
    };
    let mut writes = 0;
    let end = start + if restarts { 12_000 } else { 4_000 };
    let mut next_crash = crash_at[0];
    let mut back_at: Vec<(NodeId, u64)> = Vec::new();
    let mut victims = Vec::new();
    while sim.now_ms < end {
        if !restarts {
            for (i, &at) in crash_at.iter().enumerate() {
                let victim = [first, second][i];
                if sim.now_ms >= at && !sim.is_crashed(victim) {
                    sim.crash(victim);
                }
            }
        } else {
            if sim.now_ms >= next_crash && sim.now_ms < end - 3_000 {
                next_crash = sim.now_ms + 500 + rng.below(1_500);
                let victim = rng.below(5) as NodeId;
                if (0..5).filter(|&n| down(&sim, n)).count() < 2 && !sim.is_crashed(victim) {
                    sim.crash(victim);
                    victims.push(victim);
                    back_at.push((victim, sim.now_ms + 200 + rng.below(FAILURE_TIMEOUT_MS * 2)));
                }
            }
            let now = sim.now_ms;
            for (n, _) in back_at.iter().filter(|(_, at)| *at <= now) {
                sim.restart(*n);
            }
            back_at.retain(|(_, at)| *at > now);
        }
        for client in 0..CLIENTS {
            if !sim.is_idle(client) || pending[client].is_some() || !rng.chance(0.5) {
                continue;
            }
            // (More keys over the longer run: porcupine checks each key's
            // history on its own.)
            let key = format!("k{}", rng.below(if restarts { 8 * KEYS } else { KEYS }));
            let kind = if rng.chance(0.5) {
                writes += 1;
                OpKind::Put(format!("c{client}-{writes}"))
            } else {
                OpKind::Get(String::new())
            };
            let request = match &kind {
                OpKind::Put(v) => Request::Put { key: Bytes::from(key.clone()), change: Change::set(Bytes::from(v.clone())) },
                _ => Request::Get(Bytes::from(key.clone())),
            };
            clock += 1;
            pending[client] = Some(Op { client, key, kind, call: clock, ret: None });
            for c in sim.start(client, request) {
                finish(c, &mut clock, &mut pending, &mut history);
            }
        }
        let step = sim.now_ms + 1 + rng.below(3);
        for c in sim.run_until(step) {
            finish(c, &mut clock, &mut pending, &mut history);
        }
    }
    history.extend(pending.into_iter().flatten().filter(|op| matches!(op.kind, OpKind::Put(_))));
    for (n, _) in back_at {
        sim.restart(n);
    }
    // Quiet: every group settles (lost slots repaired, restarted nodes
    // rebuilt), and every live parity page is the code of the data pages.
    let live: Vec<NodeId> = (0..5).filter(|&n| !sim.is_crashed(n)).collect();
    let quiet_by = sim.now_ms + 20_000;
    let what = if restarts { format!("crashed and restarted {victims:?}") } else { format!("crashed {first} then {second}") };
    while !live.iter().all(|&n| sim.node(n).ec().expect("an ec node").idle() && (!restarts || !down(&sim, n))) {
        if sim.now_ms > quiet_by {
            let status: Vec<String> = live.iter().map(|&n| sim.node(n).ec().expect("ec").status().join("\n  ")).collect();
            return Err(format!("not settled 20 s after the clients stopped ({what}):\n{}", status.join("\n")));
        }
        let _ = sim.run_until(sim.now_ms + 10);
    }
    check_groups(&sim).map_err(|e| format!("{e} ({what})"))?;
    let late = history.iter().filter(|o| o.call > 0 && o.ret.is_some()).filter(|o| matches!(o.kind, OpKind::Put(_))).count();
    if late == 0 {
        return Err("no write acknowledged".into());
    }
    if !lincheck::check(&history) {
        return Err(format!("not linearizable ({what}):\n{}", lincheck::to_json(&history)));
    }
    Ok(format!("{what}: {} ops, {acked} writes acknowledged, {failed} failed", history.len()))
}

/// Every group's live parity pages are the code of its data pages, as the
/// nodes serving each data slot hold them.
fn check_groups(sim: &Sim) -> Result<(), String> {
    let coding = SHAPE.coding.expect("coded");
    let code = Code::new(coding.data as usize, coding.parity as usize)?;
    for g in 0..coding.nodes() {
        let member = |s: u8| {
            let n = coding.node(g, s);
            (!sim.is_crashed(n)).then(|| sim.node(n).ec().expect("an ec node").member(g))
        };
        // Who serves each data slot: its member, or the parity member
        // leading its recovery; the parity members alive (not rebuilding).
        let holders: Vec<_> =
            (0..coding.data).map(|s| (0..coding.nodes() as u8).filter_map(member).find(|m| m.served().contains(&s))).collect();
        let parity = |p: u8| member(p).filter(|m| m.config().alive[p as usize]);
        let pages = (0..coding.data + coding.parity)
            .filter_map(|s| if s < coding.data { holders[s as usize].map(|m| m.pages(s)) } else { parity(s).map(|m| m.pages(s)) })
            .max()
            .unwrap_or(0);
        let mut stripes = Vec::new();
        for page in 0..pages {
            let mut row = Vec::new();
            for s in 0..coding.data {
                let m = holders[s as usize].ok_or(format!("group {g}: nobody serves slot {s}"))?;
                row.push(Some(m.page(s, page).ok_or(format!("group {g}: page {page} of slot {s} not repaired"))?));
            }
            for p in coding.data..coding.data + coding.parity {
                row.push(parity(p).and_then(|m| m.page(p, page)));
            }
            stripes.push(row);
        }
        check_stripes(&code, &stripes).map_err(|e| format!("group {g}: {e}"))?;
    }
    Ok(())
}

#[test]
fn an_ec_site_loses_two_nodes_under_linearizable_clients() {
    for seed in seeds(0..40) {
        match run(seed, Network { min_delay_ms: 0, max_delay_ms: 6, drop_rate: 0.0 }, false) {
            Ok(summary) => eprintln!("seed {seed}: {summary}"),
            Err(e) => panic!("seed {seed}: {e}"),
        }
    }
}

#[test]
fn an_ec_site_loses_two_nodes_over_lossy_links() {
    for seed in seeds(100..120) {
        match run(seed, Network { min_delay_ms: 1, max_delay_ms: 8, drop_rate: 0.01 }, false) {
            Ok(summary) => eprintln!("seed {seed}: {summary}"),
            Err(e) => panic!("seed {seed}: {e}"),
        }
    }
}

#[test]
fn an_ec_site_whose_nodes_crash_and_come_back_rebuilds_them() {
    for seed in seeds(200..220) {
        match run(seed, Network { min_delay_ms: 0, max_delay_ms: 6, drop_rate: 0.0 }, true) {
            Ok(summary) => eprintln!("seed {seed}: {summary}"),
            Err(e) => panic!("seed {seed}: {e}"),
        }
    }
}

#[test]
fn an_ec_site_whose_nodes_crash_and_come_back_over_lossy_links() {
    for seed in seeds(300..310) {
        match run(seed, Network { min_delay_ms: 1, max_delay_ms: 8, drop_rate: 0.01 }, true) {
            Ok(summary) => eprintln!("seed {seed}: {summary}"),
            Err(e) => panic!("seed {seed}: {e}"),
        }
    }
}
