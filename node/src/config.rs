//! A node's configuration: from flags (`causeway node --id 0 --listen ...`)
//! or a TOML file with the same field names.

use causeway_core::geo::Replication;
use causeway_core::ring::{NodeId, NodeInfo, Shape, Topology};
use causeway_core::version::SiteId;
use causeway_resp::Limits;
use serde::Deserialize;

/// Everything one node needs to start.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeConfig {
    /// This node's id; must appear in `nodes`.
    pub id: NodeId,
    /// Where to listen (host:port), for Redis clients, native clients and
    /// peers alike.
    pub listen: String,
    /// Every node of the site, this one included (static membership until
    /// the coordinator exists).
    pub nodes: Vec<NodeInfo>,
    #[serde(default = "default_partitions")]
    pub partitions: u32,
    pub replicas: usize,
    pub k: usize,
    #[serde(default)]
    pub site: SiteId,
    /// The other sites of a geo-replicated deployment: each one's id, entry
    /// points (any of its nodes), and the one-way delay added to every
    /// message sent to it (an emulated wide-area link; 0 on a real one).
    #[serde(default)]
    pub remote_sites: Vec<RemoteSite>,
    /// Up to this much more delay, at random, on every message to another
    /// site (emulated jitter; order is kept, as on a TCP connection).
    #[serde(default)]
    pub wan_jitter_ms: u64,
    /// How sites replicate to each other: causal (Eunomia), or one of the
    /// baselines it is measured against (`eventual`, `sequenced`); the same
    /// at every site.
    #[serde(default)]
    pub replication: Replication,
    /// Identifier-first disaster recovery: `PRIMARY=BACKUP` (site ids; the
    /// same at both sites). The primary's writes are acknowledged once the
    /// backup has noted their keys; after `causeway cluster failover` the
    /// backup refuses keys whose value never arrived.
    #[serde(default)]
    pub dr: Option<causeway_core::message::geo::DrPair>,
    /// `ec:K+M`: erasure-coded groups instead of replicated chains (a site
    /// of exactly K+M nodes); `replicas` and `k` are then unused.
    #[serde(default)]
    pub redundancy: Option<causeway_core::ring::Coding>,
    /// Like Redis' `requirepass`: clients must AUTH first.
    #[serde(default)]
    pub requirepass: Option<String>,
    /// Shared by every node of the site: peers and coordinator members
    /// prove it (challenge-response, see `auth`) before their traffic is
    /// accepted. None: peer connections are not authenticated.
    #[serde(default)]
    pub cluster_secret: Option<String>,
    /// Largest bulk string (key or value) accepted, like `proto-max-bulk-len`.
    #[serde(default = "default_max_bulk")]
    pub max_bulk_len: usize,
    /// Most arguments in one command.
    #[serde(default = "default_max_args")]
    pub max_array_len: usize,
    /// How long a client request may wait for replicas before an error.
    #[serde(default = "default_timeout")]
    pub request_timeout_ms: u64,
    /// Where the write-ahead log and the last configuration are kept; none:
    /// memory only.
    #[serde(default)]
    pub data_dir: Option<String>,
    /// When the log is synced: always, everysec or no (like appendfsync).
    #[serde(default = "default_fsync")]
    pub fsync: String,
    /// Compact the write-ahead log (checkpoint + recent records) once it
    /// grows past this many bytes.
    #[serde(default = "default_compact")]
    pub wal_compact_bytes: u64,
    /// Join a running site: start with no partitions and wait for the
    /// coordinator (after `CW.CLUSTER ADD`) to hand this node its share.
    #[serde(default)]
    pub join: bool,
    /// A node silent for this long is removed from its chains.
    #[serde(default = "default_failure_timeout")]
    pub failure_timeout_ms: u64,
    /// Like Redis's `maxmemory`: past this many bytes allocated, the node
    /// refuses writes that add data or evicts keys, by
    /// `maxmemory_policy`. 0: no limit.
    #[serde(default)]
    pub maxmemory: u64,
    #[serde(default = "default_policy")]
    pub maxmemory_policy: String,
    /// A directory for the disk tier: past `maxmemory`, values move there
    /// (and back when read, by `cache_policy`) instead of keys being
    /// evicted.
    #[serde(default)]
    pub disk_tier: Option<String>,
    /// Which values stay in memory with a disk tier: fifo, lru or lfu.
    #[serde(default = "default_cache_policy")]
    pub cache_policy: String,
}

fn default_cache_policy() -> String {
    "lru".into()
}

fn default_policy() -> String {
    "noeviction".into()
}

/// A memory size as Redis's configuration writes it: bytes, or a number
/// with a unit (`k`, `m`, `g` are powers of 1000; `kb`, `mb`, `gb` of
/// 1024), case-insensitive.
pub fn parse_memory(s: &str) -> Result<u64, String> {
    let lower = s.trim().to_ascii_lowercase();
    let digits = lower.find(|c: char| !c.is_ascii_digit()).unwrap_or(lower.len());
    let (number, unit) = lower.split_at(digits);
    let unit = match unit {
        "" | "b" => 1,
        "k" => 1_000,
        "kb" => 1 << 10,
        "m" => 1_000_000,
        "mb" => 1 << 20,
        "g" => 1_000_000_000,
        "gb" => 1 << 30,
        _ => return Err(format!("argument must be a memory value, got '{s}'")),
    };
    let n: u64 = number.parse().map_err(|_| format!("argument must be a memory value, got '{s}'"))?;
    n.checked_mul(unit).ok_or_else(|| format!("memory value '{s}' is too large"))
}

/// Another site, as a node reaches it.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteSite {
    pub id: SiteId,
    /// Any of its nodes: messages go to the first that answers.
    pub addrs: Vec<String>,
    #[serde(default)]
    pub delay_ms: u64,
}

fn default_partitions() -> u32 {
    64
}
/// The largest key or value a node takes by default: 128 MiB, not Redis's
/// 512 MB (`proto-max-bulk-len`): a value travels between nodes in one
/// message, and a peer link drops one that would take its backlog past
/// 256 MiB, so a larger value could never be replicated. (APPEND and
/// SETRANGE stop there too.)
pub const MAX_VALUE_BYTES: usize = causeway_core::chain::change::MAX_VALUE_BYTES;

fn default_max_bulk() -> usize {
    MAX_VALUE_BYTES
}
fn default_max_args() -> usize {
    Limits::default().max_array_len
}
fn default_timeout() -> u64 {
    5_000
}
fn default_compact() -> u64 {
    64 << 20
}
fn default_fsync() -> String {
    "everysec".into()
}
fn default_failure_timeout() -> u64 {
    1_000
}

impl NodeConfig {
    pub fn from_toml(text: &str) -> Result<Self, String> {
        toml::from_str(text).map_err(|e| format!("invalid node config: {e}"))
    }

    pub fn shape(&self) -> Shape {
        match self.redundancy {
            Some(coding) => Shape { partitions: self.partitions, replicas: 1, k: 1, coding: Some(coding) },
            None => Shape { partitions: self.partitions, replicas: self.replicas, k: self.k, coding: None },
        }
    }

    pub fn limits(&self) -> Limits {
        Limits { max_bulk_len: self.max_bulk_len, max_array_len: self.max_array_len, ..Limits::default() }
    }

    /// The nodes that run the coordinator (its Raft group): the first three
    /// node ids, so a site has no extra process and no single point of
    /// failure. An erasure-coded site survives M lost nodes, so its
    /// coordinator runs on 2M+1 (a majority must be left to remove them).
    pub fn coordinators(&self) -> Vec<NodeId> {
        let mut ids: Vec<NodeId> = self.nodes.iter().map(|n| n.id).collect();
        ids.sort_unstable();
        ids.truncate(self.redundancy.map_or(3, |c| 2 * c.parity as usize + 1).max(3));
        ids
    }

    /// Every site of the deployment, this one included.
    pub fn sites(&self) -> Vec<SiteId> {
        let mut sites: Vec<SiteId> = std::iter::once(self.site).chain(self.remote_sites.iter().map(|s| s.id)).collect();
        sites.sort_unstable();
        sites.dedup();
        sites
    }

    /// The site's topology, checked.
    pub fn topology(&self) -> Result<Topology, String> {
        if self.redundancy.is_some() && !self.remote_sites.is_empty() {
            return Err("--redundancy ec:K+M is for one site: erasure-coded sites do not replicate to other sites yet".into());
        }
        if self.redundancy.is_some() && (self.data_dir.is_some() || self.disk_tier.is_some()) {
            // Its values would not be in the log, and a restart would
            // silently come back empty.
            return Err(
                "--redundancy ec:K+M keeps everything in memory: it has no write-ahead log (--data-dir) or disk tier (--disk-tier) yet"
                    .into(),
            );
        }
        if self.remote_sites.iter().any(|s| s.id == self.site || s.addrs.is_empty()) {
            return Err(format!("site {} lists itself, or a remote site without an address", self.site));
        }
        if !self.nodes.iter().any(|n| n.id == self.id) {
            return Err(format!("node id {} is not in the node list", self.id));
        }
        Ok(Topology::new(1, self.shape(), self.nodes.clone())?)
    }
}

/// Parses `1=127.0.0.1:6390,127.0.0.1:6391` (a site id and its entry
/// points) and the delays of `--wan-delay 1=40,2=80` into remote sites.
pub fn parse_remote_sites(sites: &[String], delays: Option<&str>) -> Result<Vec<RemoteSite>, String> {
    let mut delay_of = std::collections::BTreeMap::new();
    for d in delays.unwrap_or("").split(',').filter(|d| !d.trim().is_empty()) {
        let (site, ms) = d.split_once('=').ok_or_else(|| format!("expected site=ms, got '{d}'"))?;
        let site: SiteId = site.trim().parse().map_err(|_| format!("invalid site id '{site}'"))?;
        delay_of.insert(site, ms.trim().parse::<u64>().map_err(|_| format!("invalid delay '{ms}'"))?);
    }
    sites
        .iter()
        .map(|s| {
            let (id, addrs) = s.split_once('=').ok_or_else(|| format!("expected site=host:port,..., got '{s}'"))?;
            let id: SiteId = id.trim().parse().map_err(|_| format!("invalid site id '{id}'"))?;
            let addrs = addrs.split(',').map(|a| a.trim().to_string()).filter(|a| !a.is_empty()).collect();
            Ok(RemoteSite { id, addrs, delay_ms: delay_of.get(&id).copied().unwrap_or(0) })
        })
        .collect()
}

/// Parses `0=127.0.0.1:6380,1=127.0.0.1:6381` into node infos.
pub fn parse_nodes(s: &str) -> Result<Vec<NodeInfo>, String> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            let (id, addr) = p.split_once('=').ok_or_else(|| format!("expected id=host:port, got '{p}'"))?;
            let id = id.trim().parse().map_err(|_| format!("invalid node id '{id}'"))?;
            Ok(NodeInfo { id, addr: addr.trim().to_string() })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_flags_and_toml() {
        let nodes = parse_nodes("0=127.0.0.1:1,1=127.0.0.1:2").unwrap();
        assert_eq!(nodes[1], NodeInfo { id: 1, addr: "127.0.0.1:2".into() });
        assert!(parse_nodes("0:127.0.0.1").is_err());
        let c = NodeConfig::from_toml(
            "id = 1\nlisten = \"127.0.0.1:2\"\nreplicas = 2\nk = 1\nnodes = [{id = 0, addr = \"127.0.0.1:1\"}, {id = 1, addr = \"127.0.0.1:2\"}]\n",
        )
        .unwrap();
        assert_eq!(c.partitions, 64);
        assert!(c.topology().is_ok());
        assert!(NodeConfig::from_toml("id = 1\nbogus = 3").is_err());
    }

    /// A node of a geo-replicated deployment, from flags or from TOML: its
    /// site, the others' entry points, the emulated link delays and jitter.
    #[test]
    fn parses_sites_from_flags_and_toml() {
        let flags =
            parse_remote_sites(&["1=127.0.0.1:6390, 127.0.0.1:6391".into(), "2=127.0.0.1:6400".into()], Some("1=40, 2=80")).unwrap();
        assert_eq!(flags[0], RemoteSite { id: 1, addrs: vec!["127.0.0.1:6390".into(), "127.0.0.1:6391".into()], delay_ms: 40 });
        assert_eq!(flags[1], RemoteSite { id: 2, addrs: vec!["127.0.0.1:6400".into()], delay_ms: 80 });
        assert_eq!(parse_remote_sites(&["2=127.0.0.1:6400".into()], None).unwrap()[0].delay_ms, 0, "a real link: no delay");
        assert!(parse_remote_sites(&["127.0.0.1:6400".into()], None).is_err());
        assert!(parse_remote_sites(&["x=127.0.0.1:6400".into()], None).is_err());
        assert!(parse_remote_sites(&["2=127.0.0.1:6400".into()], Some("2:80")).is_err());
        let c = NodeConfig::from_toml(
            "id = 0\nlisten = \"127.0.0.1:6380\"\nreplicas = 1\nk = 1\nnodes = [{id = 0, addr = \"127.0.0.1:6380\"}]\n\
             site = 0\nwan_jitter_ms = 2\nreplication = \"eventual\"\n\
             remote_sites = [{id = 1, addrs = [\"127.0.0.1:6390\"], delay_ms = 40}, {id = 2, addrs = [\"127.0.0.1:6400\"], delay_ms = 80}]\n",
        )
        .unwrap();
        assert_eq!((c.site, c.wan_jitter_ms, c.replication), (0, 2, Replication::Eventual));
        assert_eq!(c.remote_sites, flags.iter().map(|s| RemoteSite { addrs: vec![s.addrs[0].clone()], ..s.clone() }).collect::<Vec<_>>());
        assert_eq!(c.sites(), [0, 1, 2]);
        assert!(c.topology().is_ok());
        // A site that lists itself, or a remote site without an address.
        let own = NodeConfig { remote_sites: vec![RemoteSite { id: 0, addrs: vec!["a".into()], delay_ms: 0 }], ..c.clone() };
        assert!(own.topology().is_err());
        let empty = NodeConfig { remote_sites: vec![RemoteSite { id: 1, addrs: Vec::new(), delay_ms: 0 }], ..c };
        assert!(empty.topology().is_err());
    }
}
