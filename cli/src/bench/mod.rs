//! `causeway bench`: YCSB core workloads A, B, C, D and F against Causeway
//! (through the native client) or any RESP server (redis-server included),
//! so one run can put both side by side. Latencies go into HDR histograms;
//! the report is a table and, with `--json`, a JSON file.
//!
//! `--hot-key` runs the workload's mix on one key and reports which chain
//! positions served the reads: ChainReaction's point that causal reads
//! spread over the whole chain while linearizable reads all land on the
//! tail (`--consistency linearizable`). `CW.CHAIN causeway-bench-hot-key`
//! shows that key's chain, e.g. to kill its head or tail during a run.
//!
//! `--codec ec:K+M` measures the erasure code alone (`codec`).
//!
//! Every report ends with a per-second timeline of completed operations and
//! errors, and the longest stretch any client went without a successful
//! write: the write unavailability when a node is killed during the run.

pub mod codec;
pub mod dr;
pub mod report;
pub mod visibility;
pub mod workload;

use crate::resp_client::RespConn;
use bytes::Bytes;
use causeway_client::Client;
use causeway_core::driver::Consistency;
use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use report::{Recorder, Report};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use workload::{key_name, value_for, Distribution, Generator, Keyspace, OpKind, Workload};

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TargetKind {
    /// Causeway through the native client (routes and keeps metadata itself).
    Causeway,
    /// Any Redis-protocol server (redis-server, or Causeway's Redis front end).
    Resp,
}

#[derive(Args)]
pub struct BenchArgs {
    #[arg(long, value_enum, default_value = "causeway")]
    target: TargetKind,
    /// A node of the site, or the Redis server. Several, comma-separated
    /// (e.g. one node of each site), spread the clients over them in turn.
    #[arg(long, default_value = "127.0.0.1:6380")]
    addr: String,
    /// YCSB workload: a, b, c, d or f.
    #[arg(long, default_value = "a")]
    workload: Workload,
    /// Override the workload's key distribution: zipfian, latest or uniform.
    #[arg(long)]
    distribution: Option<Distribution>,
    /// Override the workload's mix: this percentage of operations read, the
    /// rest update (e.g. 99, 90, 75, 50 for the Eunomia paper's Figure 5).
    #[arg(long, value_parser = clap::value_parser!(u8).range(0..=100))]
    read_percent: Option<u8>,
    /// Concurrent clients (one connection each).
    #[arg(long, default_value_t = 32)]
    clients: usize,
    /// Records loaded before the run.
    #[arg(long, default_value_t = 10_000)]
    records: u64,
    /// Seconds to run.
    #[arg(long, default_value_t = 10)]
    duration: u64,
    /// Value size in bytes.
    #[arg(long, default_value_t = 1024)]
    value_size: usize,
    /// Skip the load phase (the records are already there).
    #[arg(long)]
    no_load: bool,
    /// Consistency for the native client.
    #[arg(long, default_value = "causal")]
    consistency: String,
    /// Run the workload on one hot key and report which chain positions served its reads.
    #[arg(long)]
    hot_key: bool,
    /// Also write the report as JSON to this file.
    #[arg(long)]
    json: Option<String>,
    /// Name for the target in the report (defaults to target@addr).
    #[arg(long)]
    label: Option<String>,
    /// Measure remote visibility instead: write at --addr, poll this node of
    /// another site until the write shows (see `visibility`).
    #[arg(long)]
    visible_at: Option<String>,
    /// The one-way link delay between the two sites, subtracted (ms).
    #[arg(long, default_value_t = 40)]
    link_ms: u64,
    /// Writes measured by --visible-at.
    #[arg(long, default_value_t = 200)]
    samples: usize,
    /// Measure the time until a write is protected instead (identifier-
    /// first disaster recovery, see `dr`): SETs of each of `--sizes` at
    /// --addr, `--samples` each.
    #[arg(long)]
    protection: bool,
    /// With --protection: value sizes in bytes, comma-separated.
    #[arg(long, default_value = "1024,10240,102400,1048576,10485760", value_delimiter = ',')]
    sizes: Vec<usize>,
    /// With --protection: after each SET, CW.WAIT SITE this site
    /// (synchronous replication, the baseline).
    #[arg(long)]
    wait_site: Option<u16>,
    /// Write at --addr, cut the link to this node's site, fail it over
    /// (if it is a disaster-recovery backup) and count the acknowledged
    /// keys it serves complete, refuses or lost (see `dr`).
    #[arg(long, value_name = "BACKUP_ADDR")]
    disaster: Option<String>,
    /// Measure the erasure code of `ec:K+M` alone instead (no server):
    /// parity updates per write, stripes encoded, lost pages decoded, for
    /// `--duration` seconds each (see `codec`).
    #[arg(long, value_name = "ec:K+M")]
    codec: Option<causeway_core::ring::Coding>,
}

/// How long a client waits after a failed operation before the next.
const ERROR_PAUSE: Duration = Duration::from_millis(10);

/// One benchmark connection.
enum Target {
    Native(Box<Client>),
    Resp(RespConn),
}

impl Target {
    /// Client `i`'s connection: to the `i`-th address of `--addr`, in turn.
    async fn connect(args: &BenchArgs, i: usize) -> Result<Target, String> {
        let addrs: Vec<&str> = args.addr.split(',').collect();
        let addr = addrs[i % addrs.len()];
        Ok(match args.target {
            TargetKind::Causeway => {
                let mut c =
                    Client::connect_with_password(addr, crate::resp_client::password().as_deref()).await.map_err(|e| e.to_string())?;
                c.set_consistency(args.consistency.parse::<Consistency>()?);
                Target::Native(Box::new(c))
            }
            TargetKind::Resp => Target::Resp(RespConn::connect(addr).await?),
        })
    }

    /// Reads a key: whether it had a value, and the chain position that
    /// served it, if known.
    async fn read(&mut self, key: &[u8]) -> Result<(bool, Option<u8>), String> {
        match self {
            Target::Native(c) => c.get_at(key).await.map(|(v, at)| (v.is_some(), Some(at))).map_err(|e| e.to_string()),
            Target::Resp(c) => c.call(&[b"GET", key]).await.map(|f| (f != causeway_resp::Frame::Null, None)),
        }
    }

    async fn write(&mut self, key: &[u8], value: &[u8]) -> Result<(), String> {
        match self {
            Target::Native(c) => c.put(key, value).await.map_err(|e| e.to_string()),
            Target::Resp(c) => c.call(&[b"SET", key, value]).await.map(|_| ()),
        }
    }
}

pub fn run(args: BenchArgs) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(|e| e.to_string())?;
    runtime.block_on(bench(args))
}

async fn bench(args: BenchArgs) -> Result<(), String> {
    if let Some(coding) = args.codec {
        return codec::run(coding, args.duration as f64);
    }
    if let Some(to) = &args.visible_at {
        return visibility::run(&args.addr, to, args.link_ms, args.samples).await;
    }
    if args.protection {
        return dr::protection(&args.addr, &args.sizes, args.samples, args.wait_site).await;
    }
    if let Some(backup) = &args.disaster {
        return dr::disaster(&args.addr, backup, args.clients, args.duration, args.value_size).await;
    }
    if args.clients == 0 || args.records == 0 {
        return Err("--clients and --records must be at least 1".into());
    }
    let args = Arc::new(args);
    let label = args
        .label
        .clone()
        .unwrap_or_else(|| format!("{}@{}", if args.target == TargetKind::Causeway { "causeway" } else { "resp" }, args.addr));
    if !args.no_load && !args.hot_key {
        load(&args).await?;
    }
    let mut mix = args.workload.mix();
    if let Some(d) = args.distribution {
        mix.distribution = d;
    }
    if let Some(p) = args.read_percent {
        let read = p as f64 / 100.0;
        mix = workload::Mix { read, update: 1.0 - read, insert: 0.0, rmw: 0.0, ..mix };
    }
    let keyspace = Keyspace::new(args.records);
    let stop = Arc::new(AtomicBool::new(false));
    let done_ops = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let hot = Bytes::from_static(b"causeway-bench-hot-key");
    if args.hot_key {
        Target::connect(&args, 0).await?.write(&hot, &value_for(0, args.value_size, 0)).await?;
    }
    let mut tasks = Vec::new();
    for i in 0..args.clients {
        let mut target = Target::connect(&args, i).await?;
        let (args, stop, done_ops, errors, keyspace, hot) =
            (args.clone(), stop.clone(), done_ops.clone(), errors.clone(), keyspace.clone(), hot.clone());
        tasks.push(tokio::spawn(async move {
            let mut rec = Recorder::new();
            let mut served = [0u64; 256];
            let mut absent = 0u64;
            let mut generator = Generator::new(mix, keyspace, 0x5EED ^ i as u64);
            let mut n = 0u64;
            let mut last_write = Instant::now();
            let mut write_gap = Duration::ZERO;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let started = Instant::now();
                let (op, k) = generator.next_op();
                let key = if args.hot_key { hot.to_vec() } else { key_name(k) };
                let mut read = async |target: &mut Target| {
                    let r = target.read(&key).await;
                    if let Ok((found, at)) = r {
                        if let Some(at) = at {
                            served[at as usize] += 1;
                        }
                        absent += u64::from(!found);
                    }
                    r.map(|_| ())
                };
                let result = match op {
                    OpKind::Read => read(&mut target).await,
                    OpKind::Update | OpKind::Insert => target.write(&key, &value_for(k, args.value_size, n)).await,
                    OpKind::ReadModifyWrite => match read(&mut target).await {
                        Ok(_) => target.write(&key, &value_for(k, args.value_size, n)).await,
                        Err(e) => Err(e),
                    },
                };
                match result {
                    Ok(()) => {
                        rec.record(op.name(), started.elapsed().as_micros() as u64);
                        if op != OpKind::Read {
                            write_gap = write_gap.max(last_write.elapsed());
                            last_write = Instant::now();
                        }
                        done_ops.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(_) => {
                        rec.record_error(op.name());
                        errors.fetch_add(1, Ordering::Relaxed);
                        // A node that is gone refuses connections at once:
                        // do not spin on it (and count millions of errors).
                        tokio::time::sleep(ERROR_PAUSE).await;
                    }
                }
            }
            (rec, served, write_gap, absent)
        }));
    }
    let counters_before = lookups(&args.addr).await;
    let bar = ProgressBar::new(args.duration);
    bar.set_style(ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len}s {msg}").map_err(|e| e.to_string())?);
    let started = Instant::now();
    let mut timeline = Vec::new();
    let (mut ops_before, mut errors_before) = (0, 0);
    for s in 1..=args.duration {
        tokio::time::sleep_until((started + Duration::from_secs(s)).into()).await;
        let (ops, errs) = (done_ops.load(Ordering::Relaxed), errors.load(Ordering::Relaxed));
        timeline.push(format!("{}/{}", ops - ops_before, errs - errors_before));
        (ops_before, errors_before) = (ops, errs);
        bar.set_position(s);
        bar.set_message(format!("{:.0} ops/s", ops as f64 / started.elapsed().as_secs_f64()));
    }
    stop.store(true, Ordering::Relaxed);
    let elapsed = started.elapsed();
    bar.finish_and_clear();
    let mut rec = Recorder::new();
    let mut served = [0u64; 256];
    let mut write_gap = Duration::ZERO;
    let mut absent = 0;
    for t in tasks {
        let (r, s, gap, a) = t.await.map_err(|e| e.to_string())?;
        absent += a;
        rec.merge(&r);
        write_gap = write_gap.max(gap);
        for (a, b) in served.iter_mut().zip(s) {
            *a += b;
        }
    }
    let workload = match (args.hot_key, args.read_percent) {
        (true, _) => format!("{} on one hot key", args.workload),
        (false, Some(p)) => format!("{p}:{} read:update ({})", 100 - p, mix.distribution),
        (false, None) => format!("{} ({})", args.workload, mix.distribution),
    };
    let mut report = Report::new(&label, &workload, args.clients, elapsed, &rec);
    if args.target == TargetKind::Causeway {
        report.notes.push(format!("consistency {}", args.consistency));
    }
    let total: u64 = served.iter().sum();
    for (i, n) in served.iter().enumerate().filter(|(_, n)| **n > 0) {
        report.notes.push(format!("reads served by chain position {i}: {n} ({:.1}%)", 100.0 * *n as f64 / total as f64));
    }
    report.notes.push(format!("per second, completed/errors: {}", timeline.join(" ")));
    let reads = report.ops.iter().filter(|o| o.op == "read" || o.op == "readmodifywrite").map(|o| o.count).sum::<u64>();
    if reads > 0 && !args.hot_key {
        // Every record was loaded: a read without a value is a wrong answer
        // (a key an eviction dropped).
        report.notes.push(format!("reads answered without a value: {absent} of {reads} ({:.2}%)", 100.0 * absent as f64 / reads as f64));
    }
    if let (Some(before), Some(after)) = (counters_before, lookups(&args.addr).await) {
        let (hits, misses) = (after.hits - before.hits, after.misses - before.misses);
        // Nothing counted: INFO's keyspace counts only GETs of Redis
        // clients, not the native client's reads.
        if hits + misses > 0 {
            let ratio = 100.0 * hits as f64 / (hits + misses) as f64;
            report.notes.push(format!("{}: {ratio:.1}% ({hits} hits, {misses} misses)", after.what));
        }
    }
    if mix.read < 1.0 {
        report.notes.push(format!("longest stretch a client went without a successful write: {} ms", write_gap.as_millis()));
    }
    println!("{}", report.to_table());
    if let Some(path) = &args.json {
        std::fs::write(path, report.to_json()).map_err(|e| format!("cannot write {path}: {e}"))?;
    }
    Ok(())
}

/// How often reads found what they asked for at the servers, as their
/// INFO counts it: in memory against on disk where a node has a disk tier
/// (`tier_hits`, `tier_misses`), else keys found against keys missing
/// (Redis's `keyspace_hits`, `keyspace_misses`: with eviction, a miss is a
/// key the server dropped).
struct Lookups {
    what: &'static str,
    hits: u64,
    misses: u64,
}

/// `Lookups` summed over the servers at `addrs`; `None` if one does not
/// answer INFO.
async fn lookups(addrs: &str) -> Option<Lookups> {
    let mut sum = Lookups { what: "", hits: 0, misses: 0 };
    for addr in addrs.split(',') {
        let mut c = RespConn::connect(addr).await.ok()?;
        let causeway_resp::Frame::Bulk(info) = c.call(&[b"INFO"]).await.ok()? else { return None };
        let info = String::from_utf8_lossy(&info).into_owned();
        let field = |name: &str| info.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(':')?.trim().parse::<u64>().ok());
        let (what, hits, misses) = match field("tier_enabled") {
            Some(1) => ("memory hit ratio of reads (INFO tier)", field("tier_hits")?, field("tier_misses")?),
            _ => ("keyspace hit ratio (INFO keyspace_hits)", field("keyspace_hits")?, field("keyspace_misses")?),
        };
        sum = Lookups { what, hits: sum.hits + hits, misses: sum.misses + misses };
    }
    Some(sum)
}

/// Inserts `records` keys, spread over the clients.
async fn load(args: &Arc<BenchArgs>) -> Result<(), String> {
    let bar = ProgressBar::new(args.records);
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for i in 0..args.clients.min(16) {
        let mut target = Target::connect(args, i).await?;
        let (args, next, bar) = (args.clone(), next.clone(), bar.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                if k >= args.records {
                    return Ok::<(), String>(());
                }
                target.write(&key_name(k), &value_for(k, args.value_size, 0)).await?;
                bar.inc(1);
            }
        }));
    }
    for t in tasks {
        t.await.map_err(|e| e.to_string())??;
    }
    bar.finish_and_clear();
    Ok(())
}
