//! What a front end may do with the node (`Handle`): register a session
//! and submit its requests, read a snapshot of the node's status, and the
//! few operator actions the `CW.*` commands offer. The Redis front end
//! (`crate::redis`) reaches the runtime through this and nothing else.

use super::clock::Clock;
use super::peer::link::Sent;
use super::server::Node;
use crate::config::NodeConfig;
use bytes::Bytes;
use causeway_core::chain::{Conflict, Digest};
use causeway_core::driver::ReadHere;
use causeway_core::geo::visibility::Delays;
use causeway_core::geo::Replication;
use causeway_core::message::{ClientId, Item, Message};
use causeway_core::ring::{NodeId, NodeInfo, PartitionId, Topology};
use causeway_core::supervisor::NodeReport;
use causeway_core::version::{SiteId, Version, VersionVector};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// The node, as a front end sees it. Cheap to clone.
#[derive(Clone)]
pub struct Handle {
    node: Arc<Node>,
}

/// The node as INFO and the `CW.*` commands show it, copied at one moment
/// (`Handle::status`).
pub struct Status {
    pub me: NodeId,
    pub incarnation: u64,
    /// Whether the coordinator has admitted this process (it serves).
    pub admitted: bool,
    /// Whether it may serve linearizable reads now.
    pub lease: bool,
    /// Since the process started.
    pub uptime: Duration,
    /// The configuration the node holds.
    pub topology: Arc<Topology>,
    /// Keys the replicas here expired.
    pub expired_keys: u64,
    /// Keys the heads here evicted (`--maxmemory`).
    pub evicted_keys: u64,
    /// The memory budget in bytes (0: none) and its policy.
    pub maxmemory: (u64, causeway_core::chain::Policy),
    /// Bytes the replicas' stores take.
    pub store_bytes: usize,
    /// Bytes the allocator holds for this process (0: the counting
    /// allocator is not installed, `memory::Counting`).
    pub allocated: u64,
    /// State transfers received: only the updates a returning replica
    /// missed, and whole states.
    pub suffix_transfers: u64,
    pub whole_transfers: u64,
    /// Replicas here still waiting for a state transfer.
    pub joining_replicas: usize,
    /// Replicas here catching up after moving up a chain.
    pub catching_up_replicas: usize,
    /// Client writes that waited at a head here for what they depend on
    /// (a session's previous write to be stable), so far, and now.
    pub parked_writes: (u64, usize),
    /// Bytes queued for peers or not yet acknowledged by them.
    pub peer_backlog: usize,
    /// Messages dropped because a peer's backlog was over its limit.
    pub peer_dropped: u64,
    /// What this node queued for other nodes so far, of its site and of
    /// others.
    pub peer_sent: Sent,
    /// The write-ahead log, if the node keeps one.
    pub wal: Option<WalStatus>,
    /// The disk tier, if the node has one.
    pub tier: Option<TierStatus>,
    /// Geo-replication, with several sites.
    pub geo: Option<GeoStatus>,
    /// Erasure-coded groups (`--redundancy ec:K+M`).
    pub ec: Option<EcStatus>,
    /// This node's coordinator member, if it runs one.
    pub coordinator: Option<CoordinatorStatus>,
}

/// This node's members of its site's erasure-coded groups.
pub struct EcStatus {
    pub coding: causeway_core::ring::Coding,
    pub standing: causeway_core::ec::site::Standings,
    pub memory: causeway_core::ec::Memory,
}

/// The disk tier (`tier`).
pub struct TierStatus {
    pub policy: causeway_core::tier::CachePolicy,
    /// What the node state machine counted, and where the values are.
    pub stats: causeway_core::node::TierStats,
    /// What the tier holds on disk.
    pub usage: causeway_core::tier::Usage,
    /// Reads from disk so far, and their p99.
    pub reads: super::tier::Reads,
}

/// The write-ahead log (`wal`).
pub struct WalStatus {
    /// The fsync policy, as configured.
    pub fsync: &'static str,
    pub bytes: u64,
    /// When it was last synced (wall-clock ms, skew left out; 0: never).
    pub last_sync_ms: u64,
}

/// Geo-replication as this node knows it (`causeway_core::geo`).
pub struct GeoStatus {
    /// The site's leader (it ships this site's updates and applies the
    /// others').
    pub leader: Option<NodeId>,
    pub replication: Replication,
    /// Numbers this node's sequencer handed out (`Replication::Sequenced`).
    pub sequenced: u64,
    /// Concurrent writes from different sites resolved at heads here.
    pub conflicts: u64,
    /// Other sites' updates received and not yet applied.
    pub remote_backlog: usize,
    /// This site's updates not yet acknowledged by every stabilizer
    /// replica and other site.
    pub unreported: usize,
    /// Local updates a tail could not report in timestamp order.
    pub out_of_order: u64,
    /// Every other site, by site.
    pub sites: Vec<SiteStatus>,
    /// Identifier-first disaster recovery, if this site is in a pair.
    pub dr: Option<causeway_core::geo::dr::DrStatus>,
}

/// One other site, as this node sees it.
pub struct SiteStatus {
    pub site: SiteId,
    /// How far this site has applied its updates (its stable time).
    pub applied_ms: u64,
    /// How long its updates took to become visible here (none yet: `None`).
    pub visible: Option<Delays>,
    pub link: LinkState,
    /// The link's emulated one-way delay.
    pub delay_ms: u64,
    /// Messages dropped because the link was cut.
    pub dropped: u64,
}

/// A link to another site.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkState {
    Up,
    /// The connection is down.
    Down,
    /// Cut on purpose (`CW.WAN CUT`).
    Cut,
}

/// This node's coordinator member.
pub struct CoordinatorStatus {
    /// The Raft leader, if known.
    pub leader: Option<NodeId>,
    /// What the heartbeats say about every node heard from.
    pub reports: Vec<NodeReport>,
}

impl Handle {
    pub(super) fn new(node: Arc<Node>) -> Handle {
        Handle { node }
    }

    #[inline]
    pub fn me(&self) -> NodeId {
        self.node.me
    }

    #[inline]
    pub fn config(&self) -> &NodeConfig {
        &self.node.config
    }

    /// The memory budget (`--maxmemory`), which CONFIG SET changes.
    pub fn budget(&self) -> &super::memory::Budget {
        &self.node.budget
    }

    /// The node's wall clock.
    #[inline]
    pub fn clock(&self) -> Clock {
        Clock::new()
    }

    /// A fresh client id for a session on this node.
    #[inline]
    pub fn new_session(&self) -> ClientId {
        self.node.new_session()
    }

    /// Registers where replies for `client` go; `unregister` when it leaves.
    #[inline]
    pub fn register(&self, client: ClientId, tx: mpsc::UnboundedSender<Message>) {
        self.node.register(client, tx)
    }

    /// Forgets `client`, unless it has registered again since on another
    /// connection (`tx` tells which registration is ending).
    #[inline]
    pub fn unregister(&self, client: ClientId, tx: &mpsc::UnboundedSender<Message>) {
        self.node.unregister(client, tx)
    }

    /// Sends a session's requests (a driver's sends): the replies for
    /// `client` produced right here go to `replies` (messages for this node
    /// are stepped in place, no hop), and the nodes that could not be sent
    /// to (their connection is down, so those messages never left) to
    /// `undelivered`.
    #[inline]
    pub fn submit(
        &self,
        sends: impl IntoIterator<Item = (NodeId, Message)>,
        client: ClientId,
        replies: &mut Vec<Message>,
        undelivered: &mut Vec<NodeId>,
    ) {
        self.node.route_sends(sends, client, replies, undelivered)
    }

    /// A client's read answered in place, if the node can at once
    /// (`causeway_core::driver::Driver::read_here`).
    #[inline]
    pub fn read_now(&self, here: &ReadHere, key: &[u8], now_ms: u64) -> Option<(Item, u8, u64)> {
        self.node.read_now(here, key, now_ms)
    }

    /// Waits, up to a second, while a link to a live member is over its
    /// backlog's soft limit: a slow peer slows the clients of this node.
    #[inline]
    pub async fn wait_for_peers(&self) {
        self.node.wait_for_peers().await
    }

    /// The configuration this node currently holds.
    #[inline]
    pub fn topology(&self) -> Arc<Topology> {
        self.node.topology()
    }

    /// Peers this node cannot reach right now.
    #[inline]
    pub fn down_peers(&self) -> Vec<NodeId> {
        self.node.down_peers()
    }

    /// With several sites, as this node knows: what this site has applied
    /// of the others, and what each other site has applied of this one.
    #[inline]
    pub fn geo_view(&self) -> Option<(VersionVector, VersionVector)> {
        self.node.geo_view()
    }

    /// The other sites in this node's configuration, by site.
    pub fn remote_sites(&self) -> Vec<SiteId> {
        self.node.site_links().iter().map(|l| l.site).collect()
    }

    /// After a failover of this backup site: the keys refused because
    /// their last write never arrived, from `cursor` on (at most `count`),
    /// with the write each misses, and where the next page starts.
    pub fn dr_missing(&self, cursor: &[u8], count: usize) -> (Vec<(Bytes, Version)>, Option<Bytes>) {
        self.node.with_core(|core| core.dr_missing(cursor, count))
    }

    /// The node's status, now.
    pub fn status(&self) -> Status {
        let node = &self.node;
        let topology = node.topology();
        let coordinator = node.coordinator.get().map(|c| CoordinatorStatus { leader: c.leader(), reports: c.reports(&topology) });
        let tier = node.tier().and_then(|worker| {
            let (policy, stats) = node.with_core(|core| core.tier_stats())?;
            Some(TierStatus { policy, stats, usage: worker.tier.usage(), reads: worker.reads() })
        });
        let ec = node.with_core(|core| core.ec().map(|e| EcStatus { coding: e.coding(), standing: e.standing(), memory: e.memory() }));
        let (expired_keys, evicted_keys, store_bytes, geo, parked_writes) = node.with_core(|core| {
            let geo = core.geo().map(|geo| GeoStatus {
                leader: geo.leader_of(&topology),
                replication: geo.replication(),
                sequenced: geo.sequenced_count(),
                conflicts: core.conflicts(),
                remote_backlog: geo.backlog(),
                unreported: geo.unreported(),
                out_of_order: geo.out_of_order(),
                dr: geo.dr().map(|d| causeway_core::geo::dr::DrStatus { lost: core.dr_missing_count(), ..d.status() }),
                sites: node
                    .site_links()
                    .iter()
                    .map(|link| SiteStatus {
                        site: link.site,
                        applied_ms: geo.site_time().get(link.site).physical_ms(),
                        visible: geo.visibility().get(&link.site).copied(),
                        link: if link.is_cut() {
                            LinkState::Cut
                        } else if link.is_down() {
                            LinkState::Down
                        } else {
                            LinkState::Up
                        },
                        delay_ms: link.delay_ms(),
                        dropped: link.dropped.load(std::sync::atomic::Ordering::Relaxed),
                    })
                    .collect(),
            });
            (core.expired_keys(), core.evicted_keys(), core.store_memory(), geo, core.parked_writes())
        });
        let (suffix_transfers, whole_transfers) = node.transfers();
        Status {
            me: node.me,
            incarnation: node.incarnation(),
            admitted: node.is_admitted(),
            lease: node.has_lease(),
            uptime: node.started.elapsed(),
            topology,
            expired_keys,
            evicted_keys,
            maxmemory: (node.budget.max(), node.budget.policy()),
            store_bytes,
            allocated: super::memory::allocated(),
            suffix_transfers,
            whole_transfers,
            joining_replicas: node.joining_replicas(),
            catching_up_replicas: node.catching_up_replicas(),
            parked_writes,
            peer_backlog: node.peer_backlog(),
            peer_dropped: node.dropped_peer_messages(),
            peer_sent: node.peer_sent(),
            wal: node.wal().map(|w| WalStatus { fsync: w.policy(), bytes: w.size(), last_sync_ms: w.last_sync_ms() }),
            tier,
            geo,
            ec,
            coordinator,
        }
    }

    /// Every replica this node holds, in brief.
    pub fn digests(&self) -> Vec<(PartitionId, Digest)> {
        self.node.digests()
    }

    /// The latest `n` concurrent writes from different sites resolved at
    /// heads here, newest first.
    pub fn recent_conflicts(&self, n: usize) -> Vec<Conflict> {
        self.node.with_core(|core| core.recent_conflicts(n))
    }

    /// Adds a node to the site, on the coordinator leader; `None` if this
    /// node runs no coordinator member.
    pub fn add_node(&self, info: NodeInfo) -> Option<Result<(), String>> {
        self.node.coordinator.get().map(|c| c.add(info))
    }

    /// Drains a node out of every chain, on the coordinator leader; `None`
    /// if this node runs no coordinator member.
    pub fn remove_node(&self, id: NodeId) -> Option<Result<(), String>> {
        self.node.coordinator.get().map(|c| c.drain(id))
    }

    /// Cuts the emulated wide-area link to `site` (both ways), or restores
    /// it. Nothing if the site is not in the configuration.
    pub fn set_site_cut(&self, site: SiteId, cut: bool) {
        if let Some(link) = self.node.site_link(site) {
            link.set_cut(cut);
        }
    }

    /// Sets the emulated one-way delay of the link to `site`.
    pub fn set_site_delay_ms(&self, site: SiteId, ms: u64) {
        if let Some(link) = self.node.site_link(site) {
            link.set_delay_ms(ms);
        }
    }
}
