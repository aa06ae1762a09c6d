//! A whole Causeway site in one thread: `causeway-core` nodes and client
//! drivers exchanging messages over a simulated network that delays,
//! reorders and drops them, with virtual time, all from one seed. A failing
//! seed replays exactly.
//!
//! Each node is the real node state machine (`causeway_core::node::Node`)
//! with a simulated disk: its log records are kept, synced at once
//! (`fsync=always`) or once a second (`everysec`, and a crash loses what
//! was not synced). Nodes crash (`crash`), restart from their disk as a new
//! incarnation (`restart`, `restart_without_data`) and pause (`pause`). The
//! coordinator is either scripted by the test (`install`) or the real
//! `Supervisor` fed by the nodes' heartbeats (`with_coordinator`), which
//! can itself be paused (`pause_coordinator`). One partition can be made a
//! straggler (`Straggler`): its reports to the site's stabilizer arrive late.
//!
//! `Sim` runs the site; `check` judges causal+ by the versions reads
//! returned, and the checkers that need no simulator are in
//! `causeway_checker`.

pub mod check;
pub mod ec;
pub mod workload;
pub mod world;

use causeway_core::driver::{Driver, Progress, Request, Response, Sends, Transport};
use causeway_core::error::Error;
use causeway_core::geo::{GeoMsg, Replication};
use causeway_core::message::geo::DrPair;
use causeway_core::message::{Dest, Envelope, Item, Message, Outbox};
use causeway_core::node::{Identity, Node, Now};
use causeway_core::record::LogRecord;
use causeway_core::ring::{NodeId, NodeInfo, PartitionId, Shape, Topology};
use causeway_core::supervisor::Supervisor;
use causeway_core::tier::{CachePolicy, Done, MemTier};
use causeway_core::version::SiteId;
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

/// A partition whose reports to its site's stabilizer (its tail's
/// `GeoMsg::Ids` batches: ids and promises) take `delay_ms` longer than
/// other messages, whichever node is its tail. The stable time is the
/// minimum over partitions (Eunomia §3), so it holds back every update of
/// the site, not only its own (§7.2.3, Figure 7).
#[derive(Clone, Copy, Debug)]
pub struct Straggler {
    pub partition: PartitionId,
    pub delay_ms: u64,
}

/// A simulated node: the node state machine and its disk.
struct SimNode {
    core: Node,
    /// Every log record written, oldest first; the first `synced` of them
    /// survive a crash.
    disk: Vec<LogRecord>,
    synced: usize,
    /// The configuration it last adopted, as the real node keeps it on disk.
    saved: Topology,
    crashed: bool,
    /// Paused (SIGSTOP) until then: messages wait, no ticks.
    paused_until: u64,
    /// How far its wall clock is off (`Sim::skew_clocks`; a restart sets it
    /// right, as a new process on a fixed machine).
    skew_ms: i64,
    /// Idle (`Node::idle`) since its last tick: not ticked again before
    /// then, unless a step makes it busy (`Sim::idle_ticks`).
    rests_until: u64,
    /// Its disk tier (`Sim::tier`), kept across restarts as its disk is.
    tier: Option<Arc<MemTier>>,
    /// Which process this is (restarts count): what a tier job of an
    /// earlier one reports is dropped.
    generation: u64,
}

impl SimNode {
    /// Its clocks at virtual time `ms`: the wall clock skewed.
    fn now(&self, ms: u64) -> Now {
        Now { wall_ms: (ms as i64 + self.skew_ms).max(0) as u64, mono_ms: ms }
    }
}

/// A disk tier on every node (`core::tier`), on `MemTier`: the node's
/// budget comes and goes in pulses (every other 100 ms, a kilobyte below
/// what its stores hold), so values keep moving out and reads keep
/// bringing them back; each batch of the tier's work may fail.
#[derive(Clone, Copy, Debug)]
pub struct SimTier {
    pub policy: CachePolicy,
    /// The chance that a batch of jobs fails (an I/O error).
    pub fail_chance: f64,
}

/// What a node's tier did, reported at `at_ms` (its thread's latency).
struct TierDone {
    at_ms: u64,
    node: usize,
    generation: u64,
    done: Vec<Done>,
}

/// When simulated disks are synced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fsync {
    /// Before anything a step sends leaves the node.
    Always,
    /// Once a second; a crash loses what was written since.
    EverySec,
}

impl Completed {
    /// The value a write set, if it set one.
    pub fn request_value(&self) -> Option<&bytes::Bytes> {
        match &self.request {
            Request::Put { change, .. } => change.new_value(),
            _ => None,
        }
    }
}

/// One completed client operation, with the versions behind what it saw.
#[derive(Clone, Debug)]
pub struct Completed {
    pub client: usize,
    pub request: Request,
    pub result: Result<Response, Error>,
    /// The (key, item) pairs of the replies that produced the result (reads
    /// and get-transactions).
    pub items: Vec<(bytes::Bytes, Item)>,
    /// For writes: the version assigned, if acknowledged.
    pub written: Option<causeway_core::version::Version>,
    /// For writes: the chain position that acknowledged it.
    pub acked_at: Option<u8>,
}

/// A simulated client's way to the site: messages go on the simulated
/// network, except to a crashed node (its connections are refused: the
/// driver hears it as undeliverable); a recheck sees the coordinator's
/// configuration and the crashed nodes, as a proxy on a live node or a
/// native client asking one would.
struct Net<'a> {
    sends: Vec<(NodeId, Message)>,
    crashed: &'a [NodeId],
    topology: Arc<Topology>,
}

impl Transport for Net<'_> {
    fn send(&mut self, batch: Sends, _replies: &mut Vec<Message>, undeliverable: &mut Vec<NodeId>) {
        for (node, msg) in batch {
            if self.crashed.contains(&node) {
                undeliverable.push(node);
            } else {
                self.sends.push((node, msg));
            }
        }
    }

    fn recheck(&mut self) -> (Option<Arc<Topology>>, Vec<NodeId>) {
        (Some(self.topology.clone()), self.crashed.to_vec())
    }
}

struct SimClient {
    driver: Driver,
    /// Its requests started and not answered, oldest first (the driver
    /// answers in that order; a pipeline has several).
    pending: std::collections::VecDeque<Pending>,
    /// Which pending request (by `Pending::serial`) each op seq sent, and
    /// each write id, belongs to.
    ops: std::collections::HashMap<u64, u64>,
    serial: u64,
    /// Its connection died (`Sim::disconnect`): what it had in flight is
    /// never answered, and it starts nothing more.
    gone: bool,
}

/// A request of a simulated client in flight, and what its replies showed.
struct Pending {
    serial: u64,
    request: Request,
    /// Items from the replies, with the op seq of the reply each came from.
    items: Vec<(bytes::Bytes, Item, u64)>,
    /// Keys of the snapshot reads sent, by op seq.
    snapshot_keys: std::collections::HashMap<u64, Vec<bytes::Bytes>>,
    written: Option<causeway_core::version::Version>,
    acked_at: Option<u8>,
}

impl SimClient {
    /// The pending request a message it sends belongs to: a write by its
    /// (unique) value, a read by its key, a get-transaction by its keys.
    fn owner(&self, msg: &Message) -> Option<u64> {
        let found = self.pending.iter().find(|p| match (&p.request, msg) {
            (Request::Put { change, .. }, Message::Put(put)) => change.new_value() == put.change.new_value(),
            (Request::Get(k), Message::Get { key, .. }) => k == key,
            (Request::MultiGet(ks), Message::SnapshotRead { keys, .. }) => keys.iter().all(|(_, k)| ks.contains(k)),
            (Request::MultiGet(ks), Message::Get { key, .. }) => ks.contains(key),
            _ => false,
        });
        found.map(|p| p.serial)
    }

    fn pending_mut(&mut self, serial: u64) -> Option<&mut Pending> {
        self.pending.iter_mut().find(|p| p.serial == serial)
    }
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
    pub straggler: Option<Straggler>,
    pub fsync: Fsync,
    /// Nodes tick as the TCP node's runtime does (`tick_loop`): an idle
    /// node only every `IDLE_TICK_MS`, back to every tick as soon as a
    /// step makes it busy. Off: every node ticks every `TICK_MS`.
    pub idle_ticks: bool,
    /// The coordinator's configuration.
    topology: Arc<Topology>,
    nodes: Vec<SimNode>,
    clients: Vec<SimClient>,
    queue: BinaryHeap<InFlight>,
    /// Erasure-coded groups count on FIFO links (TCP): when the last
    /// message between two nodes of a group arrives.
    ec_links: std::collections::HashMap<(NodeId, NodeId), u64>,
    /// Message bodies, indexed by `InFlight::envelope_index` (slots reused).
    bodies: Vec<Option<Envelope>>,
    free: Vec<usize>,
    order: u64,
    /// The coordinator, when the sim runs the real one.
    supervisor: Option<Supervisor>,
    coordinator_paused_until: u64,
    /// Nodes an operator drained: they keep running, out of the site.
    drained: Vec<NodeId>,
    /// The last tick boundary run.
    ticked_ms: u64,
    incarnations: u64,
    pub delivered: u64,
    pub dropped: u64,
    /// Node ticks run.
    pub ticks: u64,
    /// What the coordinator did, with when (for failure messages).
    pub changes: Vec<(u64, String)>,
    /// This site, and every site of the deployment (`world` runs several).
    site: SiteId,
    sites: Vec<SiteId>,
    replication: Replication,
    /// Identifier-first disaster recovery (`with_dr`).
    dr: Option<DrPair>,
    /// Messages for other sites, for `world::World` to carry.
    pub outgoing: Vec<(SiteId, Message)>,
    /// A disk tier on every node (`with_tier`), and what the tiers did
    /// that the nodes have not heard yet.
    tier: Option<SimTier>,
    tier_done: Vec<TierDone>,
}

/// Milliseconds between node ticks.
pub const TICK_MS: u64 = 10;
/// Milliseconds between an idle node's ticks (`Sim::idle_ticks`), as the
/// TCP node's.
pub const IDLE_TICK_MS: u64 = causeway_core::node::HEARTBEAT_MS;
/// Client request timeout in the simulation.
pub const CLIENT_TIMEOUT_MS: u64 = 500;
/// The coordinator's failure timeout in the simulation.
pub const FAILURE_TIMEOUT_MS: u64 = 600;
/// The node the simulated coordinator's heartbeats go to.
const COORDINATOR: NodeId = 0;

impl Sim {
    pub fn new(seed: u64, nodes: u16, shape: Shape, clients: usize, network: Network) -> Sim {
        Sim::site(seed, 0, &[0], Replication::Causal, nodes, shape, clients, network)
    }

    /// Site `site` of a deployment of `sites` (see `world`).
    #[allow(clippy::too_many_arguments)]
    pub fn site(
        seed: u64,
        site: SiteId,
        sites: &[SiteId],
        replication: Replication,
        nodes: u16,
        shape: Shape,
        clients: usize,
        network: Network,
    ) -> Sim {
        let infos = (0..nodes).map(|id| NodeInfo { id, addr: format!("sim-{id}") }).collect();
        let mut topology = Topology::new(1, shape, infos).expect("valid shape");
        // The site is born with every node admitted (incarnations 1..=n).
        topology.admitted = (0..nodes).map(|id| (id, id as u64 + 1)).collect();
        let nodes = (0..nodes)
            .map(|me| {
                let mut core = Node::new(identity(me, me as u64 + 1, site, sites, replication, nodes), topology.clone());
                let disk = core.take_log();
                SimNode {
                    core,
                    synced: disk.len(),
                    disk,
                    saved: topology.clone(),
                    crashed: false,
                    paused_until: 0,
                    skew_ms: 0,
                    rests_until: 0,
                    tier: None,
                    generation: 0,
                }
            })
            .collect();
        let mut sim = Sim {
            now_ms: 1_000,
            rng: Rng::new(seed),
            network,
            straggler: None,
            fsync: Fsync::Always,
            idle_ticks: false,
            topology: Arc::new(topology),
            nodes,
            clients: Vec::new(),
            queue: BinaryHeap::new(),
            ec_links: std::collections::HashMap::new(),
            bodies: Vec::new(),
            free: Vec::new(),
            order: 0,
            supervisor: None,
            coordinator_paused_until: 0,
            drained: Vec::new(),
            ticked_ms: 1_000,
            incarnations: 1_000,
            delivered: 0,
            dropped: 0,
            ticks: 0,
            changes: Vec::new(),
            site,
            sites: sites.to_vec(),
            replication,
            dr: None,
            outgoing: Vec::new(),
            tier: None,
            tier_done: Vec::new(),
        };
        for i in 0..clients {
            // Half the clients sit on a node (like a Redis connection's
            // proxy session), half are native clients with no home.
            let local = (i % 2 == 0).then(|| sim.rng.below(sim.topology.nodes.len() as u64) as NodeId);
            sim.add_client(local);
        }
        sim
    }

    /// Gives every node a disk tier (and every node restarted later).
    pub fn with_tier(mut self, tier: SimTier) -> Sim {
        self.tier = Some(tier);
        for n in 0..self.nodes.len() {
            self.give_tier(n);
        }
        self
    }

    fn give_tier(&mut self, n: usize) {
        let Some(t) = self.tier else { return };
        let tier = Arc::new(MemTier::default());
        self.nodes[n].core.enable_tier(t.policy, tier.clone());
        self.nodes[n].tier = Some(tier);
    }

    /// Runs what `n` asked of its tier; the node hears of it a few
    /// milliseconds later.
    fn run_tier(&mut self, n: usize) {
        let Some(t) = self.tier else { return };
        let node = &mut self.nodes[n];
        let jobs = node.core.take_tier_jobs();
        if jobs.is_empty() {
            return;
        }
        let tier = node.tier.clone().expect("given with the sim's tier");
        if self.rng.chance(t.fail_chance) {
            tier.fail_next(1);
        }
        let (done, _) = causeway_core::tier::run(&*tier, jobs);
        // A failure meant for these jobs, never for a later read (the
        // checks' digests read the tier too).
        tier.fail_next(0);
        let at_ms = self.now_ms + 1 + self.rng.below(5);
        self.tier_done.push(TierDone { at_ms, node: n, generation: self.nodes[n].generation, done });
    }

    /// The tier's reports due by `until_ms`, the earliest first.
    fn next_tier_done(&self, before_ms: u64) -> Option<usize> {
        let (i, t) = self.tier_done.iter().enumerate().min_by_key(|(_, t)| t.at_ms)?;
        (t.at_ms < before_ms).then_some(i)
    }

    /// Identifier-first disaster recovery between `pair`'s sites: this
    /// site's nodes take part, and if it is the primary its clients'
    /// writes are acknowledged once the backup noted them.
    pub fn with_dr(mut self, pair: DrPair) -> Sim {
        self.dr = Some(pair);
        for n in &mut self.nodes {
            n.core.enable_dr(pair);
        }
        for c in &mut self.clients {
            c.driver.set_noted(pair.primary == self.site);
        }
        self
    }

    /// A new client session, on node `local` (a Redis connection's proxy
    /// session, which prefers its own node for reads) or native (`None`).
    /// Returns its index.
    pub fn add_client(&mut self, local: Option<NodeId>) -> usize {
        let i = self.clients.len();
        let id = causeway_core::message::session_id(local.unwrap_or(0), i as u64);
        let mut driver = Driver::new(id, self.topology.clone(), local, CLIENT_TIMEOUT_MS);
        driver.set_noted(self.dr.is_some_and(|p| p.primary == self.site));
        self.clients.push(SimClient { driver, pending: Default::default(), ops: Default::default(), serial: 0, gone: false });
        i
    }

    /// Client `client`'s session metadata (`CW.SESSION EXPORT`).
    pub fn session(&self, client: usize) -> causeway_core::session::Session {
        self.clients[client].driver.session().clone()
    }

    /// Client `client`'s connection dies (its node or site crashed under
    /// it): the request in flight, if any, is never answered, as a Redis
    /// client gets an error, and its session is gone with it.
    pub fn disconnect(&mut self, client: usize) {
        self.clients[client].gone = true;
    }

    /// The coordinator is the real `Supervisor`, fed by the nodes'
    /// heartbeats, committing at once what it decides (Raft is not
    /// simulated: its commits are what `node/` tests with real processes).
    pub fn with_coordinator(mut self) -> Sim {
        self.supervisor = Some(Supervisor::new(FAILURE_TIMEOUT_MS, self.now_ms));
        self
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

    fn enqueue(&mut self, mut env: Envelope) {
        if let Dest::Site(to) = env.to {
            return self.outgoing.push((to, env.msg));
        }
        let ids = match &mut env.msg {
            Message::Geo(g) => match &mut **g {
                GeoMsg::Ids(batches) => Some(batches),
                _ => None,
            },
            _ => None,
        };
        if let (Some(s), Some(batches)) = (self.straggler, ids) {
            // The straggler's batch travels apart from the rest of its
            // node's tick (one batch per partition, Eunomia's per-partition
            // heartbeats).
            let (late, on_time): (Vec<_>, Vec<_>) = std::mem::take(batches).into_iter().partition(|b| b.partition == s.partition);
            if !late.is_empty() {
                self.send_after(Envelope { to: env.to, msg: Message::geo(GeoMsg::Ids(late)) }, s.delay_ms);
            }
            if on_time.is_empty() {
                return;
            }
            *batches = on_time;
        }
        self.send_after(env, 0);
    }

    /// Sends `env` over the site's network, `extra_ms` later than it would.
    fn send_after(&mut self, env: Envelope, extra_ms: u64) {
        if self.rng.chance(self.network.drop_rate) {
            self.dropped += 1;
            return;
        }
        let span = self.network.max_delay_ms - self.network.min_delay_ms + 1;
        let mut at_ms = self.now_ms + extra_ms + self.network.min_delay_ms + self.rng.below(span);
        if let (Message::Ec { group, from, .. }, Dest::Node(to), Some(c)) = (&env.msg, env.to, self.topology.shape.coding) {
            // Kept in order on their link (lost ones leave a gap).
            let last = self.ec_links.entry((c.node(*group, *from), to)).or_default();
            at_ms = at_ms.max(*last);
            *last = at_ms;
        }
        self.enqueue_at(env, at_ms);
    }

    fn enqueue_at(&mut self, env: Envelope, at_ms: u64) {
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
        for env in out {
            self.enqueue(env);
        }
    }

    /// Runs node `n`'s state machine, writes its log records to its disk
    /// (synced at once with `Fsync::Always`), and sends what it produced.
    fn step_node(&mut self, n: usize, run: impl FnOnce(&mut Node, &mut Outbox)) {
        let node = &mut self.nodes[n];
        let mut out = Outbox::new();
        let before = node.core.topology().epoch;
        run(&mut node.core, &mut out);
        node.core.flush(node.now(self.now_ms).wall_ms, &mut out);
        node.disk.extend(node.core.take_log());
        if self.fsync == Fsync::Always {
            node.synced = node.disk.len();
            let through = node.core.logged();
            node.core.synced(through, self.now_ms, &mut out);
        }
        if node.core.topology().epoch != before {
            node.saved = (**node.core.topology()).clone();
        }
        if node.rests_until > self.now_ms && !node.core.idle() {
            node.rests_until = 0;
        }
        self.run_tier(n);
        self.send_all(out);
    }

    /// Starts `request` on a client, after what it has in flight (a
    /// pipeline); returns what completed at once (requests that needed no
    /// messages, and a proxy session's read answered in place by its node:
    /// `read_here`).
    #[must_use = "a read may complete at once"]
    pub fn start(&mut self, client: usize, request: Request) -> Vec<Completed> {
        let c = &mut self.clients[client];
        assert!(!c.gone, "client {client} was disconnected");
        c.serial += 1;
        let pending = Pending {
            serial: c.serial,
            request: request.clone(),
            items: Vec::new(),
            snapshot_keys: Default::default(),
            written: None,
            acked_at: None,
        };
        c.pending.push_back(pending);
        if let Request::Get(key) = &request {
            if let Some(done) = self.read_here(client, key) {
                return vec![done];
            }
        }
        let progress = self.clients[client].driver.start(request, self.now_ms);
        let mut done = Vec::new();
        self.pump(client, progress, &mut done);
        done
    }

    /// A proxy session's GET answered in place by its own node, as the
    /// Redis front end does (`node/src/redis/conn.rs`), when the driver
    /// allows it (`Driver::read_here`) and the node, up and running, has
    /// the answer at once (`Node::read_now`).
    fn read_here(&mut self, client: usize, key: &bytes::Bytes) -> Option<Completed> {
        let c = &self.clients[client];
        let level = c.driver.consistency();
        let here = c.driver.read_here(key, level)?;
        let node = &mut self.nodes[here.node as usize];
        if node.crashed || node.paused_until > self.now_ms {
            return None;
        }
        let now = node.now(self.now_ms);
        let (item, chain_index, stable_through) = node.core.read_now(here.epoch, here.partition, key, here.min.as_ref(), now.wall_ms)?;
        let c = &mut self.clients[client];
        c.pending.back_mut().expect("just queued").items = vec![(key.clone(), item.clone(), 0)];
        let response = c.driver.read_answered(key, level, here, item, chain_index, stable_through);
        Some(self.complete(client, Ok(response)))
    }

    /// Does what client `client`'s driver asked, as every shell does
    /// (`Driver::pump`, through `Net`), and completes its responses.
    fn pump(&mut self, client: usize, progress: Progress, done: &mut Vec<Completed>) {
        let crashed: Vec<NodeId> = (0..self.nodes.len() as NodeId).filter(|&n| self.nodes[n as usize].crashed).collect();
        let mut net = Net { sends: Vec::new(), crashed: &crashed, topology: self.topology.clone() };
        let mut results = Vec::new();
        self.clients[client].driver.pump(progress, self.now_ms, &mut net, &mut results);
        let sends = net.sends;
        self.client_sends(client, sends);
        for result in results {
            done.push(self.complete(client, result));
        }
    }

    fn client_sends(&mut self, client: usize, send: Vec<(NodeId, Message)>) {
        for (n, msg) in send {
            let c = &mut self.clients[client];
            if let (Some(op), Some(serial)) = (msg.op(), c.owner(&msg)) {
                c.ops.insert(op.seq, serial);
                if let Message::Put(put) = &msg {
                    c.ops.insert(put.write, serial);
                }
                if let (Message::SnapshotRead { op, keys, .. }, Some(p)) = (&msg, c.pending_mut(serial)) {
                    p.snapshot_keys.insert(op.seq, keys.iter().map(|(_, k)| k.clone()).collect());
                }
            }
            self.enqueue(Envelope { to: Dest::Node(n), msg });
        }
    }

    /// Runs until `until_ms`, returning the operations completed meanwhile.
    pub fn run_until(&mut self, until_ms: u64) -> Vec<Completed> {
        let mut done = Vec::new();
        loop {
            // Every tick boundary is visited, also when a message lands on it.
            let next_tick = (self.ticked_ms / TICK_MS + 1) * TICK_MS;
            let next_message = self.queue.peek().map_or(u64::MAX, |m| m.at_ms);
            if let Some(i) = self.next_tier_done(next_tick.min(next_message).min(until_ms + 1)) {
                let TierDone { at_ms, node, generation, done } = self.tier_done.swap_remove(i);
                self.now_ms = self.now_ms.max(at_ms);
                let n = &self.nodes[node];
                if n.crashed || n.generation != generation {
                    continue;
                }
                if n.paused_until > self.now_ms {
                    self.tier_done.push(TierDone { at_ms: n.paused_until, node, generation, done });
                    continue;
                }
                let now = n.now(self.now_ms);
                self.step_node(node, |core, out| core.tier_done(done, now, out));
                continue;
            }
            match self.queue.peek() {
                Some(m) if m.at_ms < next_tick && m.at_ms <= until_ms => {
                    let m = self.queue.pop().expect("peeked");
                    self.now_ms = self.now_ms.max(m.at_ms);
                    let env = self.bodies[m.envelope_index].take().expect("queued body");
                    self.free.push(m.envelope_index);
                    self.delivered += 1;
                    self.deliver(env, &mut done);
                }
                _ if next_tick <= until_ms => {
                    self.now_ms = next_tick;
                    self.ticked_ms = next_tick;
                    self.tick(&mut done);
                }
                _ => {
                    self.now_ms = self.now_ms.max(until_ms);
                    return done;
                }
            }
        }
    }

    fn deliver(&mut self, env: Envelope, done: &mut Vec<Completed>) {
        match env.to {
            Dest::Node(n) => {
                let now = self.now_ms;
                if let Message::Heartbeat(beat) = env.msg {
                    // The simulated coordinator stands apart from the nodes
                    // (with several sites heartbeats go to three members:
                    // one copy is enough).
                    if n != COORDINATOR || self.coordinator_paused_until > now || !self.coordinator_up() {
                        return;
                    }
                    let from = beat.from;
                    let lease = match &mut self.supervisor {
                        Some(s) => {
                            s.heartbeat((*beat).clone(), now);
                            s.lease(&beat, &self.topology, COORDINATOR, now)
                        }
                        // Scripted configurations: every admitted node
                        // serving the current one gets a lease (the tests
                        // that pause tails run the real supervisor).
                        None => {
                            (beat.epoch == self.topology.epoch && self.topology.admits(from, beat.incarnation)).then_some(Message::Lease {
                                epoch: beat.epoch,
                                sent_ms: beat.sent_ms,
                                grant_ms: FAILURE_TIMEOUT_MS / 2,
                                from: COORDINATOR,
                            })
                        }
                    };
                    if let Some(lease) = lease {
                        self.enqueue(Envelope { to: Dest::Node(from), msg: lease });
                    }
                    return;
                }
                let node = &self.nodes[n as usize];
                if node.crashed {
                    return;
                }
                if node.paused_until > now {
                    // SIGSTOP: the message waits in the socket buffer.
                    let at_ms = node.paused_until + self.rng.below(3);
                    return self.enqueue_at(env, at_ms);
                }
                let now = node.now(now);
                if let (Message::Ec { group, from, msg }, Some(g)) = (&env.msg, ec_trace()) {
                    if *group == g || g == 99 {
                        eprintln!("{} ms: g{group} s{from} -> node {n}: {}", self.now_ms, crate::ec::describe(msg));
                    }
                }
                let before = ec_trace().and_then(|_| self.nodes[n as usize].core.ec().map(|e| e.status()[0].clone()));
                self.step_node(n as usize, |core, out| core.step(env.msg, now, out));
                if let Some(before) = before {
                    let after = self.nodes[n as usize].core.ec().map(|e| e.status()[0].clone()).unwrap_or_default();
                    if after != before {
                        eprintln!("{} ms: node {n}: {after}", self.now_ms);
                    }
                }
            }
            Dest::Client(id) => {
                let Some(i) = self.clients.iter().position(|c| c.driver.id() == id && !c.gone) else {
                    return;
                };
                let c = &mut self.clients[i];
                let serial = env.msg.op().and_then(|op| c.ops.get(&op.seq).copied());
                if let Some(p) = serial.and_then(|s| c.pending_mut(s)) {
                    match (&env.msg, &p.request) {
                        (Message::Value { item, .. }, Request::Get(key)) => p.items = vec![(key.clone(), (**item).clone(), 0)],
                        (Message::Snapshot { op, items, .. }, _) => {
                            // A get-transaction that was refused somewhere
                            // starts over with a new snapshot: a key's item
                            // is the one of the latest attempt that read it
                            // (the one the driver answers with).
                            if let Some(keys) = p.snapshot_keys.get(&op.seq) {
                                for (key, item) in keys.iter().zip(items) {
                                    match p.items.iter_mut().find(|(k, _, _)| k == key) {
                                        Some((_, _, seq)) if *seq > op.seq => {}
                                        Some(slot) => *slot = (key.clone(), item.clone(), op.seq),
                                        None => p.items.push((key.clone(), item.clone(), op.seq)),
                                    }
                                }
                            }
                        }
                        (Message::PutDone { version, chain_index, .. }, _) => {
                            p.written = version.clone();
                            p.acked_at = Some(*chain_index);
                        }
                        _ => {}
                    }
                }
                let progress = c.driver.on_message(env.msg, self.now_ms);
                self.pump(i, progress, done);
            }
            Dest::Site(_) => unreachable!("other sites' messages leave through `outgoing`"),
        }
    }

    /// A message from another site, landing at `at_ms` on one of this
    /// site's live nodes (any: it passes the message on inside the site).
    pub fn deliver_remote(&mut self, msg: Message, at_ms: u64) {
        let live: Vec<NodeId> = (0..self.nodes.len() as NodeId).filter(|&n| !self.nodes[n as usize].crashed).collect();
        if live.is_empty() {
            return;
        }
        let to = live[self.rng.below(live.len() as u64) as usize];
        self.enqueue_at(Envelope { to: Dest::Node(to), msg }, at_ms);
    }

    /// This site's id.
    pub fn site_id(&self) -> SiteId {
        self.site
    }

    /// Whether geo-replication has nothing left to do here: no tail keeps
    /// ids or values some stabilizer replica or site has not applied, and
    /// the receiver has nothing waiting.
    pub fn geo_idle(&self) -> bool {
        self.nodes.iter().filter(|n| !n.crashed).filter_map(|n| n.core.geo()).all(|g| g.unreported() == 0 && g.backlog() == 0)
    }

    fn complete(&mut self, client: usize, result: Result<Response, Error>) -> Completed {
        let c = &mut self.clients[client];
        let p = c.pending.pop_front().expect("a request was in flight");
        c.ops.retain(|_, s| *s != p.serial);
        let items = if result.is_ok() { p.items.into_iter().map(|(k, item, _)| (k, item)).collect() } else { Vec::new() };
        let written = if matches!(result, Ok(Response::Written(true))) { p.written } else { None };
        Completed { client, request: p.request, result, items, written, acked_at: p.acked_at }
    }

    fn tick(&mut self, done: &mut Vec<Completed>) {
        let now = self.now_ms;
        if now.is_multiple_of(100) {
            self.coordinate();
            // Sessions follow the configuration as proxies do (and resend
            // the writes a new configuration may have stranded).
            for i in 0..self.clients.len() {
                if self.clients[i].gone {
                    continue;
                }
                let progress = self.clients[i].driver.reconfigured(self.topology.clone(), now);
                self.pump(i, progress, done);
            }
        }
        if self.fsync == Fsync::EverySec && now.is_multiple_of(1_000) {
            for n in 0..self.nodes.len() {
                self.nodes[n].synced = self.nodes[n].disk.len();
                if !self.nodes[n].crashed && self.nodes[n].paused_until <= now {
                    self.step_node(n, |core, out| core.synced(core.logged(), now, out));
                }
            }
        }
        for n in 0..self.nodes.len() {
            let node = &mut self.nodes[n];
            if self.tier.is_some() && !node.crashed {
                // Pressure in pulses (`SimTier`).
                let budget = match (now / 100).is_multiple_of(2) {
                    true => (node.core.store_memory() as u64).saturating_sub(1_000).max(1),
                    false => 0,
                };
                node.core.set_memory(budget, causeway_core::chain::Policy::NoEviction);
            }
            let node = &self.nodes[n];
            if node.crashed || node.paused_until > now || node.rests_until > now {
                continue;
            }
            let at = node.now(now);
            self.ticks += 1;
            self.step_node(n, |core, out| core.tick(at, out));
            let node = &mut self.nodes[n];
            node.rests_until = if self.idle_ticks && node.core.idle() { now + IDLE_TICK_MS } else { 0 };
        }
        for i in 0..self.clients.len() {
            if self.clients[i].gone {
                continue;
            }
            let progress = self.clients[i].driver.tick(now);
            self.pump(i, progress, done);
        }
    }

    /// The coordinator's turn (every 100 ms): the supervisor, if the sim
    /// runs one, decides; the configuration is pushed again to every node
    /// that has not adopted it (the push may have been lost).
    fn coordinate(&mut self) {
        let now = self.now_ms;
        if self.coordinator_paused_until > now || !self.coordinator_up() {
            return;
        }
        if let Some(s) = &mut self.supervisor {
            s.observe(now, true);
            let next = s.next(&self.topology, now);
            if let (Some(w), true) = (s.waiting(), std::env::var_os("SIM_TRACE").is_some()) {
                eprintln!("s{} {now} ms: coordinator: {w}", self.site);
            }
            if let Some(change) = next {
                let line = format!("epoch {}: {}", change.topology.epoch, change.why);
                if std::env::var_os("SIM_TRACE").is_some() {
                    eprintln!("s{} {now} ms: {line}", self.site);
                    if let Some(p) = std::env::var("SIM_TRACE_PARTITION").ok().and_then(|p| p.parse().ok()) {
                        eprintln!("    p{p}: {:?}", change.topology.chain(p).nodes);
                    }
                }
                self.changes.push((now, line));
                self.install(change.topology);
                return;
            }
        }
        for n in 0..self.nodes.len() {
            if !self.nodes[n].crashed && self.nodes[n].core.topology().epoch < self.topology.epoch {
                let topology = (*self.topology).clone();
                self.enqueue(Envelope { to: Dest::Node(n as NodeId), msg: Message::Reconfigure { topology: Box::new(topology) } });
            }
        }
    }

    /// The coordinator runs on the first three nodes (a Raft group): it is
    /// up while most of them are. Down, it hears and decides nothing; back,
    /// it finds its clock jumped and waits for fresh heartbeats, like a new
    /// leader.
    fn coordinator_up(&self) -> bool {
        // Three members, as `NodeConfig::coordinators`; 2M+1 for a coded site.
        let members = self.nodes.len().min(self.topology.shape.coding.map_or(3, |c| 2 * c.parity as usize + 1).max(3));
        2 * self.nodes[..members].iter().filter(|n| !n.crashed).count() > members
    }

    /// Stops `node` dead: it handles nothing from now on (kill -9). What its
    /// disk had not synced is lost.
    pub fn crash(&mut self, node: NodeId) {
        if ec_trace().is_some() {
            eprintln!("{} ms: node {node} crashes", self.now_ms);
        }
        let n = &mut self.nodes[node as usize];
        n.crashed = true;
        if std::env::var_os("SIM_TRACE").is_some() {
            eprintln!("s{} {} ms: node {node} crashes: {} of {} log records synced", self.site, self.now_ms, n.synced, n.disk.len());
        }
        n.disk.truncate(n.synced);
    }

    /// Compacts `node`'s log as the real node does (`compact_loop`): its
    /// checkpoint replaces the log, then what only the old log named may
    /// leave its tier.
    pub fn compact(&mut self, node: NodeId) {
        let n = &mut self.nodes[node as usize];
        if n.crashed {
            return;
        }
        n.core.checkpoint_taken();
        n.disk = n.core.checkpoint();
        n.synced = n.disk.len();
        n.core.compacted();
        self.run_tier(node as usize);
    }

    /// Starts a crashed `node` again from its disk, as a new incarnation:
    /// it recovers its replicas from the log and waits to be admitted.
    pub fn restart(&mut self, node: NodeId) {
        if ec_trace().is_some() {
            eprintln!("{} ms: node {node} restarts", self.now_ms);
        }
        self.incarnations += 1;
        let identity = identity(node, self.incarnations, self.site, &self.sites, self.replication, self.nodes.len() as u16);
        let n = &mut self.nodes[node as usize];
        assert!(n.crashed, "restart a crashed node");
        let mut core = Node::new(identity, n.saved.clone());
        if let Some(pair) = self.dr {
            core.enable_dr(pair);
        }
        if let Some(t) = self.tier {
            // Before the log's replay, as the real node: checkpoints name
            // values in the tier.
            let tier = n.tier.get_or_insert_with(Default::default).clone();
            core.enable_tier(t.policy, tier);
        }
        let report = core.recover(n.disk.clone(), self.fsync == Fsync::Always, self.now_ms);
        assert!(report.need_tier.is_empty(), "node {node}: its log names values in a tier it was not given");
        if std::env::var_os("SIM_TRACE").is_some() {
            let applied: Vec<String> =
                (0..self.topology.shape.partitions).map(|p| format!("{p}:{:?}", core.digest(p).map(|d| d.applied))).collect();
            eprintln!("s{} {} ms: node {node} restarts: {report:?}, applied {}", self.site, self.now_ms, applied.join(" "));
        }
        n.core = core;
        n.crashed = false;
        n.skew_ms = 0;
        n.rests_until = 0;
        n.generation += 1;
    }

    /// Starts a crashed `node` again with nothing: no log, no saved
    /// configuration (a new machine, or a node run without a data dir).
    pub fn restart_without_data(&mut self, node: NodeId) {
        let n = &mut self.nodes[node as usize];
        n.disk.clear();
        n.tier = None;
        n.synced = 0;
        let mut birth = Topology::new(
            1,
            self.topology.shape,
            (0..self.nodes.len() as NodeId).map(|id| NodeInfo { id, addr: format!("sim-{id}") }).collect(),
        )
        .expect("valid shape");
        birth.admitted.clear();
        self.nodes[node as usize].saved = birth;
        self.restart(node);
    }

    /// Starts a new node, in no chain yet, and asks the coordinator to add
    /// it (`causeway cluster add`): it takes its share of the partitions
    /// once the coordinator hears its heartbeat. Returns its id.
    pub fn join(&mut self) -> NodeId {
        let id = self.nodes.len() as NodeId;
        self.incarnations += 1;
        let saved = (*self.topology).clone();
        let mut core =
            Node::new(identity(id, self.incarnations, self.site, &self.sites, self.replication, self.nodes.len() as u16), saved.clone());
        if let Some(pair) = self.dr {
            core.enable_dr(pair);
        }
        self.nodes.push(SimNode {
            core,
            disk: Vec::new(),
            synced: 0,
            saved,
            crashed: false,
            paused_until: 0,
            skew_ms: 0,
            rests_until: 0,
            tier: None,
            generation: 0,
        });
        self.give_tier(id as usize);
        self.supervisor.as_mut().expect("joins need the coordinator").add(NodeInfo { id, addr: format!("sim-{id}") });
        id
    }

    /// Asks the coordinator to drain `node` (`causeway cluster remove`): it
    /// leaves every chain once the others hold the data, and keeps running
    /// outside the site.
    pub fn drain(&mut self, node: NodeId) {
        self.supervisor.as_mut().expect("drains need the coordinator").drain(node);
        self.drained.push(node);
    }

    /// Pauses `node` (SIGSTOP) for `ms`: it handles nothing meanwhile and
    /// finds its messages waiting when it resumes.
    /// Puts the wall clock of every node of the site `ms` ahead (negative:
    /// behind), as of now: a jump, then a steady offset.
    pub fn skew_clocks(&mut self, ms: i64) {
        for n in &mut self.nodes {
            n.skew_ms = ms;
        }
    }

    pub fn pause(&mut self, node: NodeId, ms: u64) {
        self.nodes[node as usize].paused_until = self.now_ms + ms;
    }

    /// Pauses the coordinator leader for `ms`: no heartbeats reach it, it
    /// decides nothing; when it resumes, what it heard before is stale.
    pub fn pause_coordinator(&mut self, ms: u64) {
        self.coordinator_paused_until = self.now_ms + ms;
    }

    /// The coordinator's move: sends the new configuration to every node
    /// (over the same unreliable network; nodes adopt it as it arrives).
    pub fn install(&mut self, topology: Topology) {
        self.topology = Arc::new(topology.clone());
        for n in 0..self.nodes.len() as NodeId {
            self.enqueue(Envelope { to: Dest::Node(n), msg: Message::Reconfigure { topology: Box::new(topology.clone()) } });
        }
    }

    /// Whether every live node has adopted the coordinator's configuration
    /// and every member serves (is admitted).
    pub fn configured(&self) -> bool {
        self.nodes.iter().enumerate().all(|(i, n)| {
            n.crashed
                || (n.core.topology().epoch == self.topology.epoch && (self.topology.node(i as NodeId).is_none() || n.core.is_admitted()))
        })
    }

    /// Whether no message is in flight and every write has reached its
    /// tail (nothing is left to retransmit).
    pub fn settled(&self) -> bool {
        // With several sites promises always travel down chains: there the
        // replicas' state says it all (with `geo_idle`).
        (self.sites.len() > 1 || self.queue.is_empty())
            && self.configured()
            && self.nodes.iter().all(|n| n.crashed || n.core.joining_replicas() + n.core.catching_up_replicas() == 0)
            && self.digests().iter().flatten().all(|d| d.applied == d.stable)
    }

    /// Whether the coordinator has nothing left to do: every node not
    /// drained is a member, every chain is R long and in its placed order
    /// (roles balanced).
    pub fn healed(&self) -> bool {
        let t = &self.topology;
        let drained = |n: NodeId| self.drained.contains(&n);
        t.returning.is_empty()
            && (0..self.nodes.len() as NodeId).all(|n| t.node(n).is_some() != drained(n))
            && t.chains.iter().all(|c| c.len() == t.shape.replicas)
            && (0..t.shape.partitions).all(|p| t.toward_placed_order(p).is_none())
    }

    /// Whether the site has nothing left to do by itself: every live node
    /// (paused ones too) is a serving member, every chain is R long with no
    /// crashed node in it, and everything has settled.
    pub fn quiet(&self) -> bool {
        let t = &self.topology;
        let crashed = |n: NodeId| self.nodes[n as usize].crashed;
        (0..self.nodes.len() as NodeId).all(|n| crashed(n) || t.node(n).is_some() != self.drained.contains(&n))
            && t.chains.iter().all(|c| c.len() == t.shape.replicas && !c.nodes.iter().any(|&n| crashed(n)))
            && (0..t.shape.partitions).all(|p| t.toward_placed_order(p).is_none())
            && self.settled()
    }

    /// Node `id`'s state machine (as it was when it crashed, if it did).
    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id as usize].core
    }

    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_crashed(&self, id: NodeId) -> bool {
        self.nodes[id as usize].crashed
    }

    pub fn is_paused(&self, id: NodeId) -> bool {
        self.nodes[id as usize].paused_until > self.now_ms
    }

    /// The coordinator, when the sim runs the real one.
    pub fn supervisor(&self) -> Option<&Supervisor> {
        self.supervisor.as_ref()
    }

    /// What the coordinator did, one line each.
    pub fn history(&self) -> String {
        let t = &self.topology;
        let mut lines: Vec<String> = self.changes.iter().map(|(at, what)| format!("  {at} ms: {what}")).collect();
        let members: Vec<NodeId> = t.nodes.iter().map(|n| n.id).collect();
        let returning: Vec<NodeId> = t.returning.iter().map(|n| n.id).collect();
        lines.push(format!("  now, epoch {}: members {members:?}, returning {returning:?}, drained {:?}", t.epoch, self.drained));
        if let Some(waiting) = self.supervisor.as_ref().and_then(|s| s.waiting()) {
            lines.push(format!("  the coordinator is {waiting}"));
        }
        for (i, n) in self.nodes.iter().enumerate().filter(|(_, n)| !n.crashed) {
            let beat = n.core.beat(self.now_ms);
            if !beat.joining.is_empty() || !beat.catching_up.is_empty() || beat.epoch != t.epoch {
                lines.push(format!("  n{i} at epoch {}: joining {:?}, catching up {:?}", beat.epoch, beat.joining, beat.catching_up));
            }
        }
        for (p, c) in t.chains.iter().enumerate() {
            if c.len() != t.shape.replicas || t.toward_placed_order(p as causeway_core::ring::PartitionId).is_some() {
                lines.push(format!("  p{p}: {:?} (not R long or not in its placed order)", c.nodes));
            }
        }
        lines.join("\n")
    }

    /// Every replica's digest, by partition then chain position.
    pub fn digests(&self) -> Vec<Vec<causeway_core::chain::Digest>> {
        (0..self.topology.shape.partitions)
            .map(|p| {
                self.topology
                    .chain(p)
                    .nodes
                    .iter()
                    .map(|&n| {
                        self.nodes[n as usize].core.digest(p).unwrap_or_else(|| panic!("node {n} of partition {p}'s chain has no replica"))
                    })
                    .collect()
            })
            .collect()
    }
}

/// Simulated node `me` of site `site`: heartbeats go to the (simulated)
/// coordinator. With several sites the first three nodes are the
/// coordinator's members, and so the stabilizer's replicas.
fn identity(me: NodeId, incarnation: u64, site: SiteId, sites: &[SiteId], replication: Replication, nodes: u16) -> Identity {
    let coordinators = if sites.len() > 1 { (0..nodes.min(3)).collect() } else { vec![COORDINATOR] };
    Identity { me, site, addr: format!("sim-{me}"), incarnation, coordinators, sites: sites.to_vec(), replication, dr: None }
}

/// `EC_TRACE=g`: print group g's messages as they are delivered, and the
/// nodes' coded-site standings as they change.
fn ec_trace() -> Option<u16> {
    std::env::var("EC_TRACE").ok().and_then(|g| g.parse().ok())
}
