//! The node process: shared state, the ticker, and routing of the
//! messages the protocol state machines produce.

use super::clock::{self, mono_ms, now_ms};
use crate::config::NodeConfig;
use crate::runtime::coordinator::Coordinator;
use crate::runtime::peer::link::{Inbound, Link, Sent, SOFT_LIMIT};
use crate::runtime::peer::wan::SiteLink;
use crate::runtime::peer::Peer;
use crate::runtime::wal::{Fsync, Wal};
use ahash::AHashMap;
use causeway_core::driver::ReadHere;
use causeway_core::message::{home_node, session_id, ClientId, Dest, Envelope, Item, Message, Outbox};
use causeway_core::node::{self as core_node, Identity, Now};
use causeway_core::ring::{NodeId, Topology};
use causeway_core::version::{SiteId, VersionVector};
use parking_lot::{Mutex, RwLock};
use std::collections::VecDeque;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

/// How often the node state machine gets a tick (retransmissions,
/// heartbeats), and how often when it is idle (every heartbeat).
///
/// An idle geo node ticks no faster, and promises only every three seconds
/// (`geo::REST_MS`): those promises move other sites' `applied` times
/// while nobody writes, so at rest CW.SITES `lag_ms` is 0.7-3.3 s; but
/// nothing waits on that: a write makes the nodes on its way busy and has
/// the promises it needs asked for (`GeoMsg::Promise`), and tombstones
/// are kept 5 s anyway (`store::RETAIN_MS`).
const TICK: Duration = Duration::from_millis(20);
const IDLE_TICK: Duration = Duration::from_millis(causeway_core::node::HEARTBEAT_MS);
/// With several sites the tick also drives geo-replication (promises,
/// reporters, the stabilizer: Eunomia batches about every millisecond),
/// and remote visibility waits on it a few times over: 5 ms took the extra
/// visibility delay from 60 to 17 ms (p50) on this machine (now 10). 2 ms
/// and 1 ms take it to 6.5 and 5 ms, but under load nine nodes on two cores
/// then spend 20-45% more CPU per operation (timer wakeups and batches
/// sent, each tick).
const GEO_TICK: Duration = Duration::from_millis(5);

/// Both clocks, for the node state machine.
fn now() -> Now {
    Now { wall_ms: now_ms(), mono_ms: mono_ms() }
}

/// A node's shared state: the node state machine (`causeway_core::node`)
/// behind one lock, and the I/O around it.
pub struct Node {
    pub me: NodeId,
    /// The protocol state. Log records are appended while it is held, so
    /// they reach the log in the order the replicas produced them.
    core: Mutex<core_node::Node>,
    /// A copy of the configuration the core holds, for readers that must
    /// not wait for the core lock.
    topology: RwLock<Arc<Topology>>,
    pub config: NodeConfig,
    pub started: Instant,
    /// One outbound connection per other node, added as nodes join.
    peers: RwLock<AHashMap<NodeId, Link>>,
    /// Where each peer's link stands on this side (frames taken).
    inbound: Mutex<AHashMap<Peer, Arc<Inbound>>>,
    /// One link per other site (geo-replication), through the emulated
    /// wide-area network (`peer::wan`).
    sites: AHashMap<SiteId, Arc<SiteLink>>,
    /// The write-ahead log, when the node has a data directory.
    wal: OnceLock<Wal>,
    /// This node's coordinator member, if it is one of the coordinator nodes.
    pub coordinator: OnceLock<Arc<Coordinator>>,
    /// Where to deliver replies for sessions and native clients on this node.
    clients: Mutex<AHashMap<ClientId, mpsc::UnboundedSender<Message>>>,
    next_session: AtomicU64,
    /// Wakes `flush_loop` once messages were stepped.
    flush_wake: tokio::sync::Notify,
    /// Wakes an idle `tick_loop` once messages were stepped, to see whether
    /// they made the node busy.
    tick_wake: tokio::sync::Notify,
    /// The memory budget, told to the core before each step.
    pub budget: super::memory::Budget,
    /// The disk tier's thread, if the node has one (`--disk-tier`).
    tier: OnceLock<super::tier::Worker>,
}

impl Node {
    /// The configuration this node currently holds.
    pub fn topology(&self) -> Arc<Topology> {
        self.topology.read().clone()
    }

    /// Whether the coordinator has admitted this process (it serves).
    pub fn is_admitted(&self) -> bool {
        self.core.lock().is_admitted()
    }

    /// Whether this node may serve linearizable reads now.
    pub fn has_lease(&self) -> bool {
        self.core.lock().has_lease(mono_ms())
    }

    /// This process's incarnation.
    pub fn incarnation(&self) -> u64 {
        self.core.lock().incarnation()
    }

    /// Runs the node state machine on one message (or a tick), makes its
    /// log records durable in order, and returns what may be sent now (with
    /// fsync=always the rest is sent by the log writer once synced).
    fn step(&self, run: impl FnOnce(&mut core_node::Node, &mut Outbox)) -> Outbox {
        self.step_at(now_ms(), run)
    }

    /// `step`, at `wall_ms` (a caller that read the clock already).
    fn step_at(&self, wall_ms: u64, run: impl FnOnce(&mut core_node::Node, &mut Outbox)) -> Outbox {
        let mut out = Outbox::new();
        let mut core = self.core.lock();
        core.set_memory(self.budget.max(), self.budget.policy());
        let before = core.topology().epoch;
        run(&mut core, &mut out);
        let log = core.take_log();
        let tier_jobs = match self.tier.get() {
            Some(_) => core.take_tier_jobs(),
            None => Vec::new(),
        };
        let ticket = match self.wal.get() {
            Some(_) if log.is_empty() => None,
            Some(w) => {
                // Several sites: tails report only what is on disk.
                w.append(core.logged(), &log, core.geo().is_some());
                Some((w, core.logged()))
            }
            // No disk: nothing to wait for (`core::node::Node::without_log`).
            None => {
                let logged = core.logged();
                core.synced(logged, wall_ms, &mut out);
                None
            }
        };
        if !tier_jobs.is_empty() {
            // Under the lock, as the log's records: the tier runs jobs in
            // the order the core made them (a removal of a version, then
            // its write again, must not cross), and steps run on several
            // threads (the event loop, the tier's own).
            if let Some(t) = self.tier.get() {
                t.send(tier_jobs);
            }
        }
        let adopted = (core.topology().epoch != before).then(|| core.topology().clone());
        drop(core);
        if let Some(t) = adopted {
            self.adopted(t);
        }
        match ticket {
            Some((wal, ticket)) => wal.after(ticket, out),
            None => out,
        }
    }

    /// What came of the disk tier's jobs, stepped into the core.
    fn tier_done(&self, done: Vec<causeway_core::tier::Done>) {
        let out = self.step(|core, out| {
            let now = now();
            core.tier_done(done, now, out);
            core.flush(now.wall_ms, out);
        });
        self.route(out, None);
    }

    /// The disk tier's thread, if the node has one.
    pub fn tier(&self) -> Option<&super::tier::Worker> {
        self.tier.get()
    }

    /// The core moved to a new configuration: connect to new nodes, keep
    /// it on disk, let readers see it.
    fn adopted(&self, new: Arc<Topology>) {
        let admitted = self.is_admitted();
        tracing::info!(
            "node {} moves to epoch {}{}",
            self.me,
            new.epoch,
            if admitted { "" } else { " (not serving: waiting to be admitted)" }
        );
        {
            let mut peers = self.peers.write();
            for n in &new.nodes {
                if n.id != self.me && !peers.contains_key(&n.id) {
                    peers.insert(n.id, Link::spawn(self.me, n.addr.clone(), self.secret()));
                }
            }
        }
        if let Some(dir) = &self.config.data_dir {
            if let Err(e) = save_topology(Path::new(dir), &new) {
                tracing::error!("cannot save the configuration: {e}");
            }
        }
        *self.topology.write() = new;
    }

    /// The cluster secret, for connections to other nodes.
    pub fn secret(&self) -> Option<Arc<str>> {
        self.config.cluster_secret.as_deref().map(Arc::from)
    }

    /// Peers this node cannot reach right now.
    pub fn down_peers(&self) -> Vec<NodeId> {
        self.peers.read().iter().filter(|(_, p)| p.is_down()).map(|(&n, _)| n).collect()
    }

    fn send_to_peer(&self, n: NodeId, msg: Message) {
        match self.peers.read().get(&n) {
            Some(p) => p.send(&msg),
            None => tracing::debug!("dropping a message for unknown node {n}"),
        }
    }

    /// Where peer `id`'s link stands on this side.
    pub fn inbound(&self, id: Peer) -> Arc<Inbound> {
        self.inbound.lock().entry(id).or_default().clone()
    }

    /// Waits, up to `MAX_STALL`, until no link to a member of the
    /// configuration that is up is over its backlog's soft limit: a slow
    /// peer slows the clients of this node instead of growing its memory.
    /// Links to nodes that are down or not members do not hold clients back
    /// (the driver routes around them, the coordinator removes them).
    pub async fn wait_for_peers(&self) {
        const MAX_STALL: Duration = Duration::from_secs(1);
        let deadline = tokio::time::Instant::now() + MAX_STALL;
        loop {
            let topology = self.topology();
            let full = self.peers.read().iter().find_map(|(&n, link)| {
                (topology.node(n).is_some() && !link.is_down() && link.backlog() > SOFT_LIMIT).then(|| link.clone())
            });
            let Some(link) = full else { return };
            if tokio::time::timeout_at(deadline, link.room()).await.is_err() {
                return;
            }
        }
    }

    /// Bytes queued for peers or not yet acknowledged by them.
    pub fn peer_backlog(&self) -> usize {
        self.peers.read().values().map(Link::backlog).sum()
    }

    /// Messages dropped because a peer's backlog was over its limit.
    pub fn dropped_peer_messages(&self) -> u64 {
        self.peers.read().values().map(Link::dropped).sum()
    }

    /// What this node queued for other nodes so far, of its site and of
    /// others.
    pub fn peer_sent(&self) -> Sent {
        let mut sent = Sent::default();
        for link in self.peers.read().values() {
            sent.add(&link.sent());
        }
        for site in self.sites.values() {
            sent.add(&site.sent());
        }
        sent
    }

    /// A fresh client id for a session on this node.
    pub fn new_session(&self) -> ClientId {
        session_id(self.me, self.next_session.fetch_add(1, Ordering::Relaxed))
    }

    /// Registers where replies for `client` go; `unregister` when it leaves.
    pub fn register(&self, client: ClientId, tx: mpsc::UnboundedSender<Message>) {
        self.clients.lock().insert(client, tx);
    }

    /// Forgets `client`, unless it has registered again since on another
    /// connection (`tx` tells which registration is ending).
    pub fn unregister(&self, client: ClientId, tx: &mpsc::UnboundedSender<Message>) {
        let mut clients = self.clients.lock();
        if clients.get(&client).is_some_and(|t| t.same_channel(tx)) {
            clients.remove(&client);
        }
    }

    /// Delivers what a state machine produced: messages for this node are
    /// handled here and now (no hop), messages for `local`'s client go to
    /// its vector, everything else goes to its peer or client connection.
    pub fn route(&self, out: Outbox, mut local: Option<(ClientId, &mut Vec<Message>)>) {
        let mut queue: VecDeque<Envelope> = out.into();
        // One clock reading for the messages stepped here (microseconds
        // apart).
        let mut at: Option<Now> = None;
        while let Some(env) = queue.pop_front() {
            match env.to {
                Dest::Node(n) if n == self.me => match env.msg {
                    Message::Heartbeat(beat) => {
                        let from = beat.from;
                        if let Some(lease) = self.coordinator.get().and_then(|c| c.heartbeat(*beat)) {
                            queue.push_back(Envelope { to: Dest::Node(from), msg: lease });
                        }
                    }
                    msg => {
                        let at = *at.get_or_insert_with(now);
                        queue.extend(self.step_at(at.wall_ms, |core, out| core.step(msg, at, out)));
                        // What the step holds back for its chains leaves
                        // with the rest of the burst (`flush_loop`).
                        self.flush_wake.notify_one();
                        self.tick_wake.notify_one();
                    }
                },
                Dest::Node(n) => self.send_to_peer(n, env.msg),
                Dest::Site(s) => {
                    if let Some(link) = self.sites.get(&s) {
                        link.send(env.msg);
                    }
                }
                Dest::Client(c) if local.as_ref().is_some_and(|(l, _)| *l == c) => {
                    if let Some((_, mine)) = local.as_mut() {
                        mine.push(env.msg);
                    }
                }
                Dest::Client(c) => match home_node(c) {
                    Some(home) if home != self.me => self.send_to_peer(home, env.msg),
                    // A client that left gets nothing: its request was abandoned.
                    _ => {
                        if let Some(tx) = self.clients.lock().get(&c) {
                            let _ = tx.send(env.msg);
                        }
                    }
                },
            }
        }
    }

    /// A driver's sends, routed: the replies for `local` that were produced
    /// right here, and the nodes that could not be sent to (their
    /// connection is down, so those messages never left).
    pub fn route_sends(
        &self,
        sends: impl IntoIterator<Item = (NodeId, Message)>,
        local: ClientId,
        replies: &mut Vec<Message>,
        undelivered: &mut Vec<NodeId>,
    ) {
        let sends = sends.into_iter();
        let mut out = Vec::with_capacity(sends.size_hint().0);
        for (n, msg) in sends {
            if n != self.me && self.peers.read().get(&n).is_none_or(|p| p.is_down()) {
                undelivered.push(n);
            } else {
                out.push(Envelope { to: Dest::Node(n), msg });
            }
        }
        self.route(out, Some((local, replies)));
    }

    /// A client's read answered in place (`core::node::Node::read_now`):
    /// nothing to log, send or wait for.
    pub fn read_now(&self, here: &ReadHere, key: &[u8], now_ms: u64) -> Option<(Item, u8, u64)> {
        self.core.lock().read_now(here.epoch, here.partition, key, here.min.as_ref(), now_ms)
    }

    /// The write-ahead log, if the node keeps one.
    pub fn wal(&self) -> Option<&Wal> {
        self.wal.get()
    }

    /// Every replica this node holds, in brief.
    pub fn digests(&self) -> Vec<(causeway_core::ring::PartitionId, causeway_core::chain::Digest)> {
        let core = self.core.lock();
        (0..core.topology().shape.partitions).filter_map(|p| Some((p, core.digest(p)?))).collect()
    }

    /// State transfers this node received: (only the updates a returning
    /// replica missed, whole states).
    pub fn transfers(&self) -> (u64, u64) {
        self.core.lock().transfers()
    }

    /// Replicas on this node catching up after moving up a chain.
    pub fn catching_up_replicas(&self) -> usize {
        self.core.lock().catching_up_replicas()
    }

    /// The link to another site, if it is in the configuration.
    pub fn site_link(&self, site: SiteId) -> Option<&Arc<SiteLink>> {
        self.sites.get(&site)
    }

    /// Every link to another site, by site.
    pub fn site_links(&self) -> Vec<Arc<SiteLink>> {
        let mut links: Vec<Arc<SiteLink>> = self.sites.values().cloned().collect();
        links.sort_by_key(|l| l.site);
        links
    }

    /// With several sites, as this node knows: what this site has applied
    /// of the others, and what each other site has applied of this one.
    pub fn geo_view(&self) -> Option<(VersionVector, VersionVector)> {
        if self.sites.is_empty() {
            return None;
        }
        self.core.lock().geo().map(|g| (g.site_time().clone(), g.seen_by().clone()))
    }

    /// Runs `f` on the node state machine (read-only).
    pub fn with_core<R>(&self, f: impl FnOnce(&core_node::Node) -> R) -> R {
        f(&self.core.lock())
    }

    /// Replicas on this node still waiting for a state transfer.
    pub fn joining_replicas(&self) -> usize {
        self.core.lock().joining_replicas()
    }
}

/// Starts a node: binds its port, builds its state (recovered from its
/// log) and starts its loops. The caller serves the port and aborts the
/// loops when it stops (`runtime::run`).
pub async fn start(config: NodeConfig) -> Result<(Arc<Node>, TcpListener, [tokio::task::JoinHandle<()>; 4]), String> {
    let mut topology = config.topology()?;
    // A restarted node starts from the last configuration it adopted (it
    // serves again only once the coordinator admits this incarnation).
    if let Some(saved) = config.data_dir.as_ref().and_then(|d| saved_topology(Path::new(d))) {
        if saved.shape != topology.shape {
            return Err(format!(
                "{} holds a site of another shape ({}) than this node's flags ask for ({}): start it with the same shape, or with an empty data directory",
                config.data_dir.as_deref().unwrap_or_default(),
                describe(&saved.shape),
                describe(&topology.shape)
            ));
        }
        if saved.epoch > topology.epoch {
            topology = saved;
        }
    }
    if config.join && topology.epoch == 1 {
        // Not a member of anything until the coordinator says so: epoch 0
        // is older than any configuration it will push.
        topology.epoch = 0;
        topology.chains.iter_mut().for_each(|c| c.nodes.retain(|&n| n != config.id));
    }
    let listener = TcpListener::bind(&config.listen).await.map_err(|e| format!("cannot listen on {}: {e}", config.listen))?;
    let me = config.id;
    // Every process start is a new incarnation; session ids must not repeat
    // across restarts either (replicas remember each session's last write,
    // and a new session reusing an old id would look like a resend).
    let incarnation = random_u64() | 1;
    let identity = Identity {
        me,
        site: config.site,
        addr: config.listen.clone(),
        incarnation,
        coordinators: config.coordinators(),
        sites: config.sites(),
        replication: config.replication,
        dr: config.dr,
    };
    let secret: Option<Arc<str>> = config.cluster_secret.as_deref().map(Arc::from);
    if secret.is_none() {
        tracing::warn!("no --cluster-secret: connections from other nodes are not authenticated");
    }
    let peers = topology.nodes.iter().filter(|n| n.id != me).map(|n| (n.id, Link::spawn(me, n.addr.clone(), secret.clone()))).collect();
    let jitter = config.wan_jitter_ms;
    let sites = config.remote_sites.iter().map(|s| (s.id, SiteLink::spawn(config.site, me, s, secret.clone(), jitter))).collect();
    let policy = config.maxmemory_policy.parse()?;
    let node = Arc::new(Node {
        budget: super::memory::Budget::new(config.maxmemory, policy),
        me,
        topology: RwLock::new(Arc::new(topology.clone())),
        core: Mutex::new({
            let mut core = core_node::Node::new(identity, topology);
            if config.data_dir.is_none() {
                core.without_log();
            }
            core
        }),
        peers: RwLock::new(peers),
        inbound: Mutex::new(AHashMap::new()),
        sites,
        coordinator: OnceLock::new(),
        wal: OnceLock::new(),
        config,
        started: Instant::now(),
        clients: Mutex::new(AHashMap::new()),
        next_session: AtomicU64::new(random_u64() >> 17),
        flush_wake: tokio::sync::Notify::new(),
        tick_wake: tokio::sync::Notify::new(),
        tier: OnceLock::new(),
    });
    if let Some(dir) = &node.config.disk_tier {
        let policy: causeway_core::tier::CachePolicy = node.config.cache_policy.parse()?;
        // With a log, the tier keeps what checkpoints name across
        // restarts; without one it starts empty.
        let keep = node.config.data_dir.is_some();
        let tier: Arc<dyn causeway_core::tier::Tier> = Arc::new(super::tier::DiskTier::open(Path::new(dir), keep)?);
        if node.config.maxmemory == 0 {
            tracing::warn!("--disk-tier without --maxmemory: values stay in memory until CONFIG SET maxmemory sets a budget");
        }
        node.core.lock().enable_tier(policy, tier.clone());
        let weak = Arc::downgrade(&node);
        let worker = super::tier::Worker::spawn(tier, move |done| {
            if let Some(node) = weak.upgrade() {
                node.tier_done(done);
            }
        });
        let _ = node.tier.set(worker);
    }
    if let Some(dir) = &node.config.data_dir {
        recover(&node, Path::new(dir))?;
    }
    tracing::info!("node {me} listening on {} (incarnation {incarnation:x}); serving once the coordinator admits it", node.config.listen);
    let ticker = tokio::spawn(tick_loop(node.clone()));
    let flusher = tokio::spawn(flush_loop(node.clone()));
    let sampler = tokio::spawn(sample_loop());
    let compaction = tokio::spawn(compact_loop(node.clone()));
    Ok((node, listener, [ticker, flusher, sampler, compaction]))
}

/// Drives the node state machine's clock: retransmissions, heartbeats,
/// expiry, geo-replication's batches. An idle node (`core::node::Node::
/// idle`) ticks only as often as it heartbeats: at rest it costs next to
/// nothing. A step that makes it busy (a client's write, another site's
/// update) brings the busy cadence back at once; steps that leave it idle
/// (heartbeats, promises, leases) do not, or their flow alone would keep
/// every node ticking.
async fn tick_loop(node: Arc<Node>) {
    let busy = if node.config.remote_sites.is_empty() { TICK } else { GEO_TICK };
    loop {
        let out = node.step(|core, out| core.tick(now(), out));
        node.route(out, None);
        if !node.with_core(|core| core.idle()) {
            tokio::time::sleep(busy).await;
            continue;
        }
        let rest = clock::on_grid(IDLE_TICK);
        let mut looked: Option<tokio::time::Instant> = None;
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(rest) => break,
                _ = node.tick_wake.notified() => {}
            }
            // Looked at once per busy tick at most: a flood of steps that
            // leave the node idle (reads) costs a look a tick, not one a
            // step.
            if let Some(at) = looked {
                tokio::time::sleep_until((at + busy).min(rest)).await;
            }
            if !node.with_core(|core| core.idle()) {
                tokio::time::sleep(busy).await;
                break;
            }
            looked = Some(tokio::time::Instant::now());
        }
    }
}

/// Sends what the steps of a burst held back (`core::node::Node::flush`).
/// The runtime has one thread: this task runs once the tasks woken with it
/// (connections and peers with input at hand) have all stepped theirs, so
/// a burst's chain traffic for one neighbour leaves as one message per
/// partition, in one write. It leaves once everything logged so far is
/// durable (it may come from any earlier step).
async fn flush_loop(node: Arc<Node>) {
    loop {
        node.flush_wake.notified().await;
        let out = node.step(|core, out| core.flush(now_ms(), out));
        let ticket = node.with_core(|core| core.logged());
        let out = match node.wal.get() {
            Some(wal) => wal.after(ticket, out),
            None => out,
        };
        node.route(out, None);
    }
}

/// Gives freed memory back once a second (`memory::release_freed`).
async fn sample_loop() {
    let mut peak = 0;
    loop {
        clock::next_on_grid(Duration::from_secs(1)).await;
        crate::runtime::memory::release_freed(&mut peak);
    }
}

/// Compacts the write-ahead log when it has grown past its limit: marks
/// it and checkpoints every replica under the core lock (so no record falls
/// between the two), and lets the writer swap the files (see `wal`).
async fn compact_loop(node: Arc<Node>) {
    loop {
        clock::next_on_grid(Duration::from_secs(1)).await;
        let Some(wal) = node.wal.get() else { continue };
        if wal.size() < node.config.wal_compact_bytes {
            continue;
        }
        let done = wal.compactions();
        let checkpoint = {
            let mut core = node.core.lock();
            wal.mark();
            core.checkpoint_taken();
            core.checkpoint()
        };
        if let Some(t) = node.tier.get() {
            // The checkpoint names values in the tier: durable first.
            if let Err(e) = t.tier.sync() {
                tracing::error!("the disk tier could not sync ({e}); the log is not compacted");
                continue;
            }
        }
        wal.compact(&checkpoint);
        drop(checkpoint);
        // Give the writer time to swap the files before looking again;
        // then what only the old log named may leave the tier.
        for _ in 0..600 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if wal.compactions() > done {
                let out = node.step(|core, _| core.compacted());
                node.route(out, None);
                break;
            }
        }
    }
}

/// Opens the write-ahead log and replays it into the node.
fn recover(node: &Arc<Node>, dir: &Path) -> Result<(), String> {
    let policy: Fsync = node.config.fsync.parse()?;
    let releaser = Arc::downgrade(node);
    let (wal, records) = Wal::open(dir, policy, move |synced, then| {
        if let Some(node) = releaser.upgrade() {
            node.route(then, None);
            let more = node.step(|core, out| {
                let now = now_ms();
                core.synced(synced, now, out);
                core.flush(now, out);
            });
            node.route(more, None);
        }
    })?;
    let report = node.core.lock().recover(records, wal.synced(), now_ms());
    if !report.need_tier.is_empty() {
        return Err(format!(
            "the log in {} names values in a disk tier ({} partitions): start the node with the --disk-tier it had",
            dir.display(),
            report.need_tier.len()
        ));
    }
    for (p, missing) in &report.gaps {
        tracing::error!(
            "node {}: the log of partition {p} has a gap at update {missing}; what follows is ignored and the node rejoins with a state transfer",
            node.me
        );
    }
    if !report.behind.is_empty() {
        tracing::warn!(
            "node {}: {} replicas were catching up when the node stopped; it rejoins with a state transfer (or, if nobody else has them, by log length)",
            node.me,
            report.behind.len()
        );
    }
    if report.records > 0 {
        tracing::info!("node {} recovered {} log records from {}", node.me, report.records, dir.display());
    }
    let _ = node.wal.set(wal);
    Ok(())
}

const TOPOLOGY_FILE: &str = "topology.bin";

fn save_topology(dir: &Path, t: &Topology) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let tmp = dir.join("topology.tmp");
    std::fs::write(&tmp, causeway_core::wire::encode(t)).map_err(|e| e.to_string())?;
    std::fs::File::open(&tmp).and_then(|f| f.sync_all()).map_err(|e| e.to_string())?;
    std::fs::rename(&tmp, dir.join(TOPOLOGY_FILE)).map_err(|e| e.to_string())
}

/// The configuration a node with data directory `dir` last adopted, if any.
pub fn saved_topology(dir: &Path) -> Option<Topology> {
    causeway_core::wire::decode(&std::fs::read(dir.join(TOPOLOGY_FILE)).ok()?).ok()
}

/// A site's shape in the words of the node's flags.
fn describe(s: &causeway_core::ring::Shape) -> String {
    match s.coding {
        Some(c) => format!("{} partitions, --redundancy ec:{}+{}", s.partitions, c.data, c.parity),
        None => format!("{} partitions, --replicas {} --k {}", s.partitions, s.replicas, s.k),
    }
}

/// A random number from the standard library's per-process hash seed.
fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos());
    h.finish()
}
