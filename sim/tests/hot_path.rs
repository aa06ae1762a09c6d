//! The replicated write path in one thread, for counting instructions: a
//! three-node site (R=3, k=2, 64 partitions), 50 sessions (one per Redis
//! connection, spread over the nodes as proxies) each writing 100-byte
//! values to random keys, every message encoded and decoded as on a peer
//! link, nodes flushed after each round of deliveries as the runtime does
//! after a burst. No network, no clock, no threads: what is left is the
//! protocol, the store and the wire encoding, which `valgrind --tool=callgrind`
//! counts exactly (BENCHMARKS.md, "CPU per request"):
//!
//!     cargo test --release -p causeway-sim --test hot_path --no-run
//!     HOT_PATH_WRITES=20000 valgrind --tool=callgrind target/release/deps/hot_path-* --ignored --exact sets --nocapture
//!
//! and the same with `HOT_PATH_WRITES=0` for the fixed cost of setting up.
//! `HOT_PATH_PIPELINE=16` queues writes 16 at a time per session.

use bytes::Bytes;
use causeway_core::driver::{Driver, Request};
use causeway_core::geo::Replication;
use causeway_core::message::{Change, Dest, Envelope, Message, Outbox};
use causeway_core::node::{Identity, Node, Now};
use causeway_core::ring::{NodeId, NodeInfo, Shape, Topology};
use causeway_core::wire;
use std::collections::VecDeque;
use std::sync::Arc;

const SESSIONS: usize = 50;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Through the wire and back, framed as a peer link carries it (into and
/// out of one buffer that keeps its capacity).
fn over_the_wire(msg: Message) -> Message {
    thread_local!(static BUF: std::cell::RefCell<bytes::BytesMut> = std::cell::RefCell::new(bytes::BytesMut::with_capacity(1 << 16)));
    BUF.with_borrow_mut(|buf| {
        wire::put_message(&msg, buf);
        wire::take_message(buf).expect("decodes").expect("whole")
    })
}

#[test]
#[ignore = "run under callgrind (module doc)"]
fn sets() {
    let (writes, pipeline) = (env("HOT_PATH_WRITES", 20_000), env("HOT_PATH_PIPELINE", 1));
    let (parked, _) = run(writes, pipeline);
    println!("{writes} writes, {pipeline} at a time per session; {parked} waited at their heads");
}

/// Deep pipelines from many sessions, each write waiting at its head for
/// the previous one: every write finishes (a wakeup lost would stall the
/// run), and nothing is left parked.
#[test]
fn deep_pipelines_all_finish() {
    let (parked, waiting) = run(3_000, 16);
    assert!(parked > 2_000, "most writes waited for the one before ({parked})");
    assert_eq!(waiting, 0);
}

/// Runs `writes` writes, `pipeline` at a time per session, until every one
/// is acknowledged: the writes that waited at their heads, and how many
/// wait still.
fn run(writes: usize, pipeline: usize) -> (u64, usize) {
    let infos: Vec<NodeInfo> = (0..3).map(|id| NodeInfo { id, addr: format!("n{id}") }).collect();
    let mut topology = Topology::new(1, Shape { partitions: 64, replicas: 3, k: 2, coding: None }, infos).expect("valid");
    topology.admitted = (0..3).map(|id| (id, 1)).collect();
    let identity = |me: NodeId| Identity {
        me,
        site: 0,
        addr: format!("n{me}"),
        incarnation: 1,
        coordinators: vec![0],
        sites: vec![0],
        replication: Replication::Causal,
        dr: None,
    };
    // No disk, as `causeway dev` runs without `--data-dir`.
    let mut nodes: Vec<Node> = (0..3)
        .map(|n| {
            let mut node = Node::new(identity(n), topology.clone());
            node.without_log();
            node
        })
        .collect();
    let topology = Arc::new(topology);
    let mut sessions: Vec<Driver> = (0..SESSIONS)
        .map(|i| {
            let home = (i % 3) as NodeId;
            Driver::new(causeway_core::message::session_id(home, i as u64), topology.clone(), Some(home), 5_000)
        })
        .collect();
    let value = Bytes::from(vec![b'x'; 100]);
    let mut rng = 0x2545_F491_4F6C_DD1Du64;
    let mut key = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        Bytes::from(format!("key:{:012}", rng % 100_000))
    };
    let now = Now::at(1_000);
    let mut queue: VecDeque<Envelope> = VecDeque::new();
    let (mut started, mut done) = (0, 0);
    while done < writes {
        // Every idle session starts its next writes.
        for (i, d) in sessions.iter_mut().enumerate() {
            while started < writes && !d.is_busy() {
                for _ in 0..pipeline.min(writes - started) {
                    started += 1;
                    let put = Request::Put { key: key(), change: Change::set(value.clone()) };
                    let p = d.start(put, now.wall_ms);
                    done += p.done.len();
                    let home = (i % 3) as NodeId;
                    for (to, msg) in p.send {
                        let msg = if to == home { msg } else { over_the_wire(msg) };
                        queue.push_back(Envelope { to: Dest::Node(to), msg });
                    }
                }
            }
        }
        // One round: everything queued is delivered, then every node
        // flushes what it held back.
        let round: Vec<Envelope> = queue.drain(..).collect();
        assert!(!round.is_empty() || done >= writes, "stalled at {done} of {writes}");
        let mut out: Vec<Outbox> = vec![Outbox::new(), Outbox::new(), Outbox::new()];
        for env in round {
            match env.to {
                Dest::Node(n) => nodes[n as usize].step(env.msg, now, &mut out[n as usize]),
                Dest::Client(c) => {
                    let s = sessions.iter().position(|d| d.id() == c).expect("a session");
                    let p = sessions[s].on_message(env.msg, now.wall_ms);
                    done += p.done.len();
                    let home = (s % 3) as NodeId;
                    for (to, msg) in p.send {
                        let msg = if to == home { msg } else { over_the_wire(msg) };
                        queue.push_back(Envelope { to: Dest::Node(to), msg });
                    }
                }
                Dest::Site(_) => unreachable!("one site"),
            }
        }
        for (n, node) in nodes.iter_mut().enumerate() {
            node.flush(now.wall_ms, &mut out[n]);
            let _ = node.take_log();
            let logged = node.logged();
            node.synced(logged, now.wall_ms, &mut out[n]);
            for env in out[n].drain(..) {
                let local = match env.to {
                    Dest::Node(to) => to == n as NodeId,
                    Dest::Client(c) => causeway_core::message::home_node(c) == Some(n as NodeId),
                    Dest::Site(_) => false,
                };
                let msg = if local { env.msg } else { over_the_wire(env.msg) };
                queue.push_back(Envelope { to: env.to, msg });
            }
        }
    }
    assert_eq!(done, writes);
    let parked = nodes.iter().map(|n| n.parked_writes().0).sum();
    (parked, nodes.iter().map(|n| n.parked_writes().1).sum())
}
