//! `causeway`: one binary for everything.
//!
//! * `causeway dev`: a local site of N node processes on loopback.
//! * `causeway node`: one data node.
//! * `causeway cli`: an interactive client.
//! * `causeway bench`: YCSB-style benchmarks against Causeway or any Redis.
//! * `causeway cluster`: site status and membership changes.

mod bench;
mod cluster;
mod dev;
mod repl;
mod resp_client;
mod site;
mod torture;

use causeway_core::geo::Replication;
use causeway_node::config::{parse_nodes, parse_remote_sites, NodeConfig};
use clap::{Args, Parser, Subcommand};
use std::process::ExitCode;

/// mimalloc, counted: INFO `used_memory` (`causeway_node::runtime::memory`).
#[global_allocator]
static ALLOCATOR: causeway_node::runtime::memory::Counting = causeway_node::runtime::memory::Counting;

#[derive(Parser)]
#[command(name = "causeway", version, about = "A geo-replicated, causally consistent key-value store that speaks Redis.")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start a local site: one `causeway node` process per node, on loopback.
    Dev(dev::DevArgs),
    /// Run one data node.
    Node(NodeArgs),
    /// Interactive client (get, put, delete, keyrange, status, ...). A site
    /// started with --requirepass: the password in $CAUSEWAY_PASSWORD.
    Cli(repl::CliArgs),
    /// YCSB-style benchmark against Causeway or any Redis server (a
    /// password, if needed, in $CAUSEWAY_PASSWORD).
    Bench(bench::BenchArgs),
    /// Site administration: status, add a node, remove (drain) a node (a
    /// password, if needed, in $CAUSEWAY_PASSWORD).
    Cluster(cluster::ClusterArgs),
    /// Fault campaign against a local site: random kills, pauses, wipes and
    /// whole-site restarts under writers, then every check on the run.
    Torture(torture::TortureArgs),
}

#[derive(Args)]
struct NodeArgs {
    /// A TOML file with the node's configuration (the flags below are then ignored).
    #[arg(long)]
    config: Option<String>,
    /// This node's id.
    #[arg(long, default_value_t = 0)]
    id: u16,
    /// Address to serve clients and peers on.
    #[arg(long, default_value = "127.0.0.1:6380")]
    listen: String,
    /// Every node of the site: id=host:port,... (defaults to just this one).
    #[arg(long)]
    nodes: Option<String>,
    #[arg(long, default_value_t = 64)]
    partitions: u32,
    /// R: nodes per chain.
    #[arg(long, default_value_t = 1)]
    replicas: usize,
    /// Writes are acknowledged once k nodes of the chain have them.
    #[arg(long, default_value_t = 1)]
    k: usize,
    /// Require AUTH with this password.
    #[arg(long)]
    requirepass: Option<String>,
    /// The secret every node of the site proves to the others before they
    /// accept its peer or coordinator traffic (never sent in clear).
    #[arg(long, env = "CAUSEWAY_CLUSTER_SECRET")]
    cluster_secret: Option<String>,
    /// Largest key or value accepted, in bytes (Redis's proto-max-bulk-len;
    /// 128 MiB rather than its 512 MB: `config::MAX_VALUE_BYTES` says why).
    #[arg(long, default_value_t = causeway_node::config::MAX_VALUE_BYTES)]
    max_value_bytes: usize,
    /// Most arguments in one command.
    #[arg(long, default_value_t = 1024 * 1024)]
    max_args: usize,
    /// How long a request may wait for the replicas, in milliseconds.
    #[arg(long, default_value_t = 5000)]
    request_timeout_ms: u64,
    /// A node silent for this long (ms) is removed from its chains.
    #[arg(long, default_value_t = 1000)]
    failure_timeout_ms: u64,
    /// Keep a write-ahead log here and recover from it on restart (default: memory only).
    #[arg(long)]
    data_dir: Option<String>,
    /// When the log is synced to disk: always, everysec or no.
    #[arg(long, default_value = "everysec")]
    fsync: String,
    /// Compact the write-ahead log once it passes this many bytes.
    #[arg(long, default_value_t = 64 << 20)]
    wal_compact_bytes: u64,
    /// Join a running site (then `causeway cluster add ID ADDR` hands this node its partitions).
    #[arg(long)]
    join: bool,
    /// This node's site (geo-replication).
    #[arg(long, default_value_t = 0)]
    site: u16,
    /// Another site: id=host:port,host:port (any of its nodes); repeat for each.
    #[arg(long = "remote-site")]
    remote_sites: Vec<String>,
    /// Emulated one-way delay to each other site, in ms: id=ms,id=ms.
    #[arg(long)]
    wan_delay: Option<String>,
    /// Up to this much more delay, at random, on each message to another site.
    #[arg(long, default_value_t = 0)]
    wan_jitter_ms: u64,
    /// How sites replicate: causal (Eunomia), or a baseline to measure it
    /// against: eventual (no causal order) or sequenced (a synchronous site
    /// sequencer in the write path). The same at every site.
    #[arg(long, default_value = "causal")]
    replication: Replication,
    /// Identifier-first disaster recovery between two sites: PRIMARY=BACKUP
    /// (site ids, the same at both). The primary's writes are acknowledged
    /// once the backup has noted their keys; after `causeway cluster
    /// failover` the backup refuses keys whose value never arrived.
    #[arg(long, value_name = "PRIMARY=BACKUP")]
    dr: Option<causeway_core::message::geo::DrPair>,
    /// `ec:K+M`: keep values once, erasure-coded over groups of K data and
    /// M parity nodes, instead of R copies (the site must have exactly K+M
    /// nodes; --replicas and --k are then unused). Any M nodes can be lost.
    #[arg(long, value_name = "ec:K+M")]
    redundancy: Option<causeway_core::ring::Coding>,
    /// Like Redis's maxmemory: past this much memory (bytes, or 100mb,
    /// 2gb, ...), refuse writes or evict by --maxmemory-policy (0: no limit).
    #[arg(long, default_value = "0", value_parser = causeway_node::config::parse_memory)]
    maxmemory: u64,
    /// noeviction (writes that add data get -OOM), or what to evict:
    /// allkeys-lru, allkeys-lfu, allkeys-random, volatile-lru,
    /// volatile-lfu, volatile-random, volatile-ttl (as Redis).
    #[arg(long, default_value = "noeviction")]
    maxmemory_policy: String,
    /// Keep values past --maxmemory in a B+ tree in this directory (and
    /// bring them back when read) instead of evicting keys.
    #[arg(long, value_name = "DIR")]
    disk_tier: Option<String>,
    /// With --disk-tier, which values stay in memory: fifo, lru or lfu.
    #[arg(long, default_value = "lru")]
    cache_policy: String,
}

impl NodeArgs {
    fn config(self) -> Result<NodeConfig, String> {
        if let Some(path) = self.config {
            let text = std::fs::read_to_string(&path).map_err(|e| format!("cannot read {path}: {e}"))?;
            return NodeConfig::from_toml(&text);
        }
        let nodes = match &self.nodes {
            Some(s) => parse_nodes(s)?,
            None => parse_nodes(&format!("{}={}", self.id, self.listen))?,
        };
        let remote_sites = parse_remote_sites(&self.remote_sites, self.wan_delay.as_deref())?;
        Ok(NodeConfig {
            id: self.id,
            listen: self.listen,
            nodes,
            partitions: self.partitions,
            replicas: self.replicas,
            k: self.k,
            site: self.site,
            remote_sites,
            wan_jitter_ms: self.wan_jitter_ms,
            replication: self.replication,
            dr: self.dr,
            redundancy: self.redundancy,
            requirepass: self.requirepass,
            cluster_secret: self.cluster_secret,
            max_bulk_len: self.max_value_bytes,
            max_array_len: self.max_args,
            request_timeout_ms: self.request_timeout_ms,
            failure_timeout_ms: self.failure_timeout_ms,
            data_dir: self.data_dir,
            fsync: self.fsync,
            join: self.join,
            wal_compact_bytes: self.wal_compact_bytes,
            maxmemory: self.maxmemory,
            maxmemory_policy: self.maxmemory_policy,
            disk_tier: self.disk_tier,
            cache_policy: self.cache_policy,
        })
    }
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        // Quiet by default: warnings, and the coordinator's decisions (a node
        // removed, back, admitted), one line each. openraft reports every
        // unreachable member as an error; the coordinator says what matters.
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("CAUSEWAY_LOG")
                .unwrap_or_else(|_| "warn,openraft=off,causeway_node::runtime::coordinator=info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Dev(args) => dev::run(args),
        Command::Node(args) => run_node(args),
        Command::Cli(args) => repl::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Cluster(args) => cluster::run(args),
        Command::Torture(args) => torture::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("causeway: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run_node(args: NodeArgs) -> Result<(), String> {
    let config = args.config()?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    runtime.block_on(causeway_node::run(config, shutdown_signal()))
}

/// Resolves on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("can install a SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
