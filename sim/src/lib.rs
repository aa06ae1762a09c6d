//! A whole Causeway site in one thread: `causeway-core` nodes and client
//! drivers exchanging messages over a simulated network that delays,
//! reorders and drops them, with virtual time, all from one seed. A failing
//! seed replays exactly.
//!
//! `Sim` runs the site; `check` holds the invariants the runs are judged by.

pub mod check;
pub mod lincheck;
pub mod workload;

use causeway_core::chain::ChainReplica;
use causeway_core::driver::{ClientError, Driver, Request, Response};
use causeway_core::message::{Dest, Envelope, Item, Message, Outbox};
use causeway_core::node::{self, Partitions};
use causeway_core::ring::{NodeId, NodeInfo, PartitionId, Shape, Topology};
use std::cell::RefCell;
use std::collections::BinaryHeap;
use std::sync::Arc;

/// A seeded splitmix64: tiny, fast, and the same on every platform.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in 0..n.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
}

/// How hostile the network is.
#[derive(Clone, Debug)]
pub struct Network {
    pub min_delay_ms: u64,
    pub max_delay_ms: u64,
    /// Probability that any one message is lost.
    pub drop_rate: f64,
}

impl Default for Network {
    fn default() -> Self {
        Network { min_delay_ms: 0, max_delay_ms: 5, drop_rate: 0.0 }
    }
}

/// A simulated node: its replicas and its view of the topology, owned
/// outright.
struct SimNode {
    parts: Vec<RefCell<Option<ChainReplica>>>,
    topology: Arc<Topology>,
    crashed: bool,
}

impl Partitions for SimNode {
    fn with<R>(&self, partition: PartitionId, f: impl FnOnce(&mut ChainReplica) -> R) -> Option<R> {
        self.parts.get(partition as usize)?.borrow_mut().as_mut().map(f)
    }

    fn set(&self, partition: PartitionId, replica: Option<ChainReplica>) {
        *self.parts[partition as usize].borrow_mut() = replica;
    }
}

/// One completed client operation, with the versions behind what it saw.
#[derive(Clone, Debug)]
pub struct Completed {
    pub client: usize,
    pub request: Request,
    pub result: Result<Response, ClientError>,
    /// The (key, item) pairs of the replies that produced the result (reads
    /// and get-transactions).
    pub items: Vec<(bytes::Bytes, Item)>,
    /// For writes: the version assigned, if acknowledged.
    pub written: Option<causeway_core::version::Version>,
    /// For writes: the chain position that acknowledged it.
    pub acked_at: Option<u8>,
}

struct SimClient {
    driver: Driver,
    /// Items from the replies to the request in flight.
    items: Vec<(bytes::Bytes, Item)>,
    /// Keys of the snapshot reads sent, by op seq.
    snapshot_keys: std::collections::HashMap<u64, Vec<bytes::Bytes>>,
    written: Option<causeway_core::version::Version>,
    acked_at: Option<u8>,
    request: Option<Request>,
}

#[derive(PartialEq, Eq)]
struct InFlight {
    at_ms: u64,
    order: u64,
    envelope_index: usize,
}

impl Ord for InFlight {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (other.at_ms, other.order).cmp(&(self.at_ms, self.order))
    }
}

impl PartialOrd for InFlight {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// A site under simulation.
pub struct Sim {
    pub now_ms: u64,
    pub rng: Rng,
    pub network: Network,
    topology: Arc<Topology>,
    nodes: Vec<SimNode>,
    clients: Vec<SimClient>,
    queue: BinaryHeap<InFlight>,
    /// Message bodies, indexed by `InFlight::envelope_index` (slots reused).
    bodies: Vec<Option<Envelope>>,
    free: Vec<usize>,
    order: u64,
    pub delivered: u64,
    pub dropped: u64,
}

/// Milliseconds between node ticks.
const TICK_MS: u64 = 10;
/// Client request timeout in the simulation.
pub const CLIENT_TIMEOUT_MS: u64 = 500;

impl Sim {
    pub fn new(seed: u64, nodes: u16, shape: Shape, clients: usize, network: Network) -> Sim {
        let infos = (0..nodes).map(|id| NodeInfo { id, addr: format!("sim-{id}") }).collect();
        let topology = Arc::new(Topology::new(1, shape, infos).expect("valid shape"));
        let nodes = (0..nodes)
            .map(|me| SimNode {
                parts: (0..shape.partitions).map(|p| RefCell::new(ChainReplica::new(&topology, p, me, 0))).collect(),
                topology: topology.clone(),
                crashed: false,
            })
            .collect();
        let mut rng = Rng::new(seed);
        let clients = (0..clients)
            .map(|i| {
                // Half the clients sit on a node (like a Redis connection's
                // proxy session), half are native clients with no home.
                let local = (i % 2 == 0).then(|| rng.below(topology.nodes.len() as u64) as NodeId);
                let id = causeway_core::message::session_id(local.unwrap_or(0), i as u64);
                SimClient {
                    driver: Driver::new(id, topology.clone(), local, CLIENT_TIMEOUT_MS),
                    items: Vec::new(),
                    snapshot_keys: Default::default(),
                    written: None,
                    acked_at: None,
                    request: None,
                }
            })
            .collect();
        Sim {
            now_ms: 1_000,
            rng,
            network,
            topology,
            nodes,
            clients,
            queue: BinaryHeap::new(),
            bodies: Vec::new(),
            free: Vec::new(),
            order: 0,
            delivered: 0,
            dropped: 0,
        }
    }

    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    pub fn set_consistency(&mut self, client: usize, level: causeway_core::driver::Consistency) {
        self.clients[client].driver.set_consistency(level);
    }

    pub fn is_idle(&self, client: usize) -> bool {
        !self.clients[client].driver.is_busy()
    }

    fn enqueue(&mut self, env: Envelope) {
        if self.rng.chance(self.network.drop_rate) {
            self.dropped += 1;
            return;
        }
        let span = self.network.max_delay_ms - self.network.min_delay_ms + 1;
        let at_ms = self.now_ms + self.network.min_delay_ms + self.rng.below(span);
        let slot = match self.free.pop() {
            Some(i) => {
                self.bodies[i] = Some(env);
                i
            }
            None => {
                self.bodies.push(Some(env));
                self.bodies.len() - 1
            }
        };
        self.order += 1;
        self.queue.push(InFlight { at_ms, order: self.order, envelope_index: slot });
    }

    fn send_all(&mut self, out: Outbox) {
        // Simulated nodes have no disk (crash-restart is not simulated yet):
        // log records are dropped.
        for env in out.into_iter().filter(|e| e.to != Dest::Log) {
            self.enqueue(env);
        }
    }

    /// Starts `request` on an idle client; returns its result if it needed
    /// no messages.
    pub fn start(&mut self, client: usize, request: Request) -> Option<Completed> {
        let c = &mut self.clients[client];
        c.items.clear();
        c.snapshot_keys.clear();
        c.written = None;
        c.request = Some(request.clone());
        let progress = c.driver.start(request, self.now_ms);
        self.client_sends(client, progress.send);
        progress.done.map(|result| self.complete(client, result))
    }

    fn client_sends(&mut self, client: usize, send: Vec<(NodeId, Message)>) {
        for (n, msg) in send {
            if let Message::SnapshotRead { op, keys, .. } = &msg {
                self.clients[client].snapshot_keys.insert(op.seq, keys.iter().map(|(_, k)| k.clone()).collect());
            }
            self.enqueue(Envelope { to: Dest::Node(n), msg });
        }
    }

    /// Runs until `until_ms`, returning the operations completed meanwhile.
    pub fn run_until(&mut self, until_ms: u64) -> Vec<Completed> {
        let mut done = Vec::new();
        while self.now_ms < until_ms {
            let next_tick = (self.now_ms / TICK_MS + 1) * TICK_MS;
            match self.queue.peek() {
                Some(m) if m.at_ms <= next_tick.min(until_ms) => {
                    let m = self.queue.pop().expect("peeked");
                    self.now_ms = self.now_ms.max(m.at_ms);
                    let env = self.bodies[m.envelope_index].take().expect("queued body");
                    self.free.push(m.envelope_index);
                    self.delivered += 1;
                    self.deliver(env, &mut done);
                }
                _ => {
                    self.now_ms = next_tick.min(until_ms);
                    if self.now_ms == next_tick {
                        self.tick(&mut done);
                    }
                }
            }
        }
        done
    }

    fn deliver(&mut self, env: Envelope, done: &mut Vec<Completed>) {
        match env.to {
            Dest::Node(n) => {
                let now = self.now_ms;
                let node = &mut self.nodes[n as usize];
                if node.crashed {
                    return;
                }
                let mut out = Outbox::new();
                match env.msg {
                    Message::Reconfigure { topology } => {
                        if topology.epoch > node.topology.epoch {
                            node::reconfigure(n, 0, &topology, node, now, &mut out);
                            node.topology = Arc::new(topology);
                        }
                    }
                    msg => node::handle(&node.topology, node, msg, now, &mut out),
                }
                self.send_all(out);
            }
            Dest::Log => unreachable!("send_all drops log records"),
            Dest::Client(id) => {
                let Some(i) = self.clients.iter().position(|c| c.driver.id() == id) else {
                    return;
                };
                let c = &mut self.clients[i];
                match (&env.msg, &c.request) {
                    (Message::Value { item, .. }, Some(Request::Get(key))) => c.items = vec![(key.clone(), item.clone())],
                    (Message::Snapshot { op, items }, _) => {
                        if let Some(keys) = c.snapshot_keys.get(&op.seq) {
                            c.items.extend(keys.iter().cloned().zip(items.iter().cloned()));
                        }
                    }
                    (Message::PutDone { version, chain_index, .. }, _) => {
                        c.written = version.clone();
                        c.acked_at = Some(*chain_index);
                    }
                    _ => {}
                }
                let progress = c.driver.on_message(env.msg, self.now_ms);
                self.client_sends(i, progress.send);
                if let Some(result) = progress.done {
                    done.push(self.complete(i, result));
                }
            }
        }
    }

    fn complete(&mut self, client: usize, result: Result<Response, ClientError>) -> Completed {
        let c = &mut self.clients[client];
        let request = c.request.take().expect("a request was in flight");
        let items = if result.is_ok() { std::mem::take(&mut c.items) } else { Vec::new() };
        let written = if matches!(result, Ok(Response::Written(true))) { c.written.clone() } else { None };
        Completed { client, request, result, items, written, acked_at: c.acked_at.take() }
    }

    fn tick(&mut self, done: &mut Vec<Completed>) {
        // The coordinator keeps pushing its configuration to nodes that have
        // not adopted it (the push may have been lost).
        if self.now_ms.is_multiple_of(100) {
            for n in 0..self.nodes.len() {
                if !self.nodes[n].crashed && self.nodes[n].topology.epoch < self.topology.epoch {
                    let topology = (*self.topology).clone();
                    self.enqueue(Envelope { to: Dest::Node(n as NodeId), msg: Message::Reconfigure { topology } });
                }
            }
        }
        for n in 0..self.nodes.len() {
            if self.nodes[n].crashed {
                continue;
            }
            let mut out = Outbox::new();
            node::tick(&self.nodes[n].topology, &self.nodes[n], self.now_ms, &mut out);
            self.send_all(out);
        }
        for i in 0..self.clients.len() {
            let progress = self.clients[i].driver.tick(self.now_ms);
            if let Some(result) = progress.done {
                done.push(self.complete(i, result));
            }
        }
    }

    /// Stops `node` dead: it handles nothing from now on (kill -9).
    pub fn crash(&mut self, node: NodeId) {
        self.nodes[node as usize].crashed = true;
    }

    /// The coordinator's move: sends the new configuration to every node
    /// (over the same unreliable network; nodes adopt it as it arrives).
    pub fn install(&mut self, topology: Topology) {
        self.topology = Arc::new(topology.clone());
        for n in 0..self.nodes.len() as NodeId {
            self.enqueue(Envelope { to: Dest::Node(n), msg: Message::Reconfigure { topology: topology.clone() } });
        }
    }

    /// Whether every live node has adopted the coordinator's configuration.
    pub fn configured(&self) -> bool {
        self.nodes.iter().all(|n| n.crashed || n.topology.epoch == self.topology.epoch)
    }

    /// Whether no message is in flight and every write has reached its
    /// tail (nothing is left to retransmit).
    pub fn settled(&self) -> bool {
        self.queue.is_empty() && self.configured() && self.digests().iter().flatten().all(|d| d.applied == d.stable)
    }

    /// Every replica's digest, by partition then chain position.
    pub fn digests(&self) -> Vec<Vec<causeway_core::chain::Digest>> {
        (0..self.topology.shape.partitions)
            .map(|p| {
                self.topology
                    .chain(p)
                    .nodes
                    .iter()
                    .map(|&n| self.nodes[n as usize].with(p, |r| r.digest()).expect("chain member has a replica"))
                    .collect()
            })
            .collect()
    }
}
