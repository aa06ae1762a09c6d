//! `causeway torture`: a fault campaign against a real local site, or
//! several active-active sites (`--sites`). It starts them with `--fsync
//! always`, runs clients through every node of every site at a chosen
//! consistency level (each writes its own keys and reads everyone's),
//! injects random faults one after another for a chosen time, lets the
//! sites heal by themselves, then checks the whole run. Faults, each on one
//! site: kill -9 and restart, restart on an empty disk, SIGSTOP/SIGCONT, a
//! pause of the coordinator leader, a whole-site kill -9 and restart; with
//! several sites also the site cut off from the others for a while
//! (`CW.WAN`), and its clocks put ahead or behind (`CW.CLOCK SKEW`, kept
//! until the site restarts). Checks:
//!
//! * the recorded history of every site together: causal+ for causal and
//!   linearizable runs (`causeway_checker::causal::causal_values`: every
//!   read returns a value no older than its causal past across keys,
//!   sessions and sites), and, at one site, linearizability with porcupine
//!   (every operation, `causeway_checker::lincheck`);
//! * durability and convergence: each key's last acknowledged value reads
//!   back at every level through every node of every site (`readback`: a
//!   read that fails with an error is tried again while the site heals,
//!   and only a wrong or missing value counts as a lost write);
//! * every chain's replicas are identical (`CW.DIGEST`), every node is a
//!   member again and writes flow.
//!
//! It prints a verdict with the seed, which replays the same fault schedule
//! (`rng`): ok; FAILED, with what went wrong (a lost write, a violated
//! check, a site that did not heal); or UNAVAILABLE, when reads of the
//! final read-back still failed with errors after a minute and none came
//! back wrong. Each node's log (stderr, `node-i.log` in the run's
//! directory) keeps every incarnation, one after the other.
//!
//! With `--sites 2 --dr`, site 1 is site 0's disaster-recovery backup, and
//! the run ends with a disaster: site 0 is lost under writers and site 1
//! fails over (`disaster`).

mod coded;
mod disaster;
mod readback;
mod rng;

use crate::resp_client::RespConn;
use crate::site::{free_ports, start_sites, Shape, Site};
use causeway_checker::lincheck::{Op, OpKind};
use causeway_resp::Frame;
use clap::Args;
use rng::Rng;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct TortureArgs {
    /// How long faults are injected.
    #[arg(long, default_value_t = 30)]
    seconds: u64,
    /// Replays a run's fault schedule (default: a fresh one, printed).
    #[arg(long)]
    seed: Option<u64>,
    /// The writers' consistency level: causal, linearizable or eventual.
    #[arg(long, default_value = "causal")]
    consistency: String,
    /// Nodes per site.
    #[arg(long, default_value_t = 4)]
    nodes: u16,
    /// Sites, active-active, with the Eunomia paper's delays between them.
    #[arg(long, default_value_t = 1)]
    sites: u16,
    /// Port of the first node (node i of site s on port + 10*s + i); 0:
    /// free ports.
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Partitions (chains) per site.
    #[arg(long, default_value_t = 64)]
    partitions: u32,
    /// Concurrent clients (each writes its own keys and reads everyone's),
    /// spread over the sites and their nodes.
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// Give every node a disk tier and a budget its values do not fit in
    /// (values of a few hundred bytes), so they keep moving to disk and back.
    #[arg(long)]
    disk_tier: bool,
    /// With --sites 2: site 1 is site 0's disaster-recovery backup
    /// (`--dr 0=1`); after the campaign site 0 is lost while clients
    /// write, site 1 fails over, and what it serves is checked (`disaster`).
    #[arg(long)]
    dr: bool,
    /// An erasure-coded site (`ec:K+M`, K+M nodes): instead of the campaign,
    /// more than M faults one at a time (`coded`), each node rebuilt before
    /// the next; the run lasts as long as those take, past --seconds.
    #[arg(long, value_name = "ec:K+M")]
    redundancy: Option<causeway_core::ring::Coding>,
}

/// With `--disk-tier`: each node's budget, and the bytes each value is
/// padded with (the values then fill about three times the budget).
const TIER_BUDGET: &str = "96kb";
const TIER_PAD: usize = 300;

/// Keys per client.
const KEYS: u64 = 64;

/// What the clients saw.
struct Writes {
    /// The last acknowledged value of each key whose last write was
    /// acknowledged (a failed write leaves its key unknown: forgotten).
    acked: HashMap<String, String>,
    tried: u64,
    acknowledged: u64,
    longest_gap: Duration,
    /// Every operation, in microseconds since `started`; each connection
    /// is its own session (`Op::client`).
    history: Vec<Op>,
    sessions: usize,
    started: Instant,
}

impl Writes {
    fn micros(&self) -> i64 {
        self.started.elapsed().as_micros() as i64
    }
}

/// Why a run failed.
#[derive(Debug)]
enum Failure {
    /// Something went wrong: a write lost, a check violated, a site that
    /// did not heal.
    Failed(String),
    /// Reads back kept failing with errors until the read-back gave up,
    /// and none came back wrong: the site was unavailable, not lossy.
    Unavailable(String),
}

impl From<String> for Failure {
    fn from(e: String) -> Self {
        Failure::Failed(e)
    }
}

/// A value's place among its key's writes: values are `w{client}:v{n}`, and
/// each key has one sequential writer.
fn order(value: &str) -> Option<u64> {
    value.split_once(":v")?.1.split(':').next()?.parse().ok()
}

pub fn run(args: TortureArgs) -> Result<(), String> {
    let seed = args.seed.unwrap_or_else(|| rand::random::<u16>() as u64);
    let dir = std::env::temp_dir().join(format!("causeway-torture-{}-{seed}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    if args.sites == 0 || (args.sites > 1 && args.port != 0 && args.nodes > 10) {
        return Err("--sites must be at least 1, and fixed ports leave room for 10 nodes per site".into());
    }
    if args.dr && args.sites != 2 {
        return Err("--dr needs --sites 2 (site 1 backs up site 0)".into());
    }
    if args.redundancy.is_some() && (args.sites > 1 || args.dr || args.disk_tier) {
        return Err("--redundancy is for one site, without --dr or --disk-tier".into());
    }
    let mut args = args;
    if let Some(c) = args.redundancy {
        args.nodes = c.nodes();
        args.partitions = args.partitions.next_multiple_of(c.nodes() as u32 * c.data as u32);
    }
    let shape = Shape {
        nodes: args.nodes,
        replicas: 3.min(args.nodes as usize),
        k: 2.min(args.nodes as usize),
        partitions: args.partitions,
        coding: args.redundancy,
        // A coded site keeps no log (its nodes refuse one).
        data_dir: args.redundancy.is_none().then(|| dir.to_string_lossy().into_owned()),
        disk_tier: args.disk_tier.then(|| dir.join("tier").to_string_lossy().into_owned()),
        node_args: ["--fsync", "always", "--failure-timeout-ms", "1000", "--request-timeout-ms", "2000"]
            .map(String::from)
            .into_iter()
            // A small log: compactions come often, and their checkpoints
            // name values on disk (what a restart then recovers).
            .chain(
                args.disk_tier
                    .then(|| ["--maxmemory", TIER_BUDGET, "--wal-compact-bytes", "2000000"].map(String::from))
                    .into_iter()
                    .flatten(),
            )
            .chain(args.dr.then(|| ["--dr", "0=1"].map(String::from)).into_iter().flatten())
            .collect(),
        logs: Some(dir.clone()),
    };
    println!(
        "torture: seed {seed}, {} site(s) of {} nodes, {} s of faults, writers at {}; logs in {}",
        args.sites,
        args.nodes,
        args.seconds,
        args.consistency,
        dir.display()
    );
    let mut sites = start(&shape, &args)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().map_err(|e| e.to_string())?;
    let verdict = runtime.block_on(campaign(&mut sites, &args, seed, &dir));
    sites.iter_mut().for_each(Site::stop);
    match verdict {
        Ok(summary) => {
            println!("{summary}\nverdict: ok (seed {seed})");
            let _ = std::fs::remove_dir_all(&dir);
            Ok(())
        }
        Err(Failure::Failed(e)) => Err(format!("verdict: FAILED (seed {seed}): {e}; node logs in {}", dir.display())),
        Err(Failure::Unavailable(e)) => Err(format!("verdict: UNAVAILABLE (seed {seed}): {e}; node logs in {}", dir.display())),
    }
}

/// Starts the sites, on `--port` or on ports free a moment ago. Such a port
/// may be taken by another process before its node binds it (and that
/// process may answer for it): a node that exits at start sends the sites
/// back to start on fresh ports.
fn start(shape: &Shape, args: &TortureArgs) -> Result<Vec<Site>, String> {
    let delays = causeway_core::geo::paper_delays(args.sites as usize);
    let mut last = String::new();
    for _ in 0..5 {
        let ports = (0..args.sites)
            .map(|s| match args.port {
                0 => free_ports(args.nodes),
                p => Ok((0..args.nodes).map(|i| p + 10 * s + i).collect()),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut sites = match start_sites(shape, &ports, &delays, 2) {
            Ok(sites) => sites,
            Err(e) if args.port == 0 => {
                last = e;
                continue;
            }
            Err(e) => return Err(e),
        };
        std::thread::sleep(Duration::from_millis(500));
        match sites.iter_mut().find_map(Site::exited) {
            Some((node, status)) if args.port == 0 => {
                sites.iter_mut().for_each(Site::stop);
                last = format!("node {node} exited at start ({status})");
            }
            _ => return Ok(sites),
        }
    }
    Err(last)
}

async fn campaign(sites: &mut [Site], args: &TortureArgs, seed: u64, dir: &std::path::Path) -> Result<String, Failure> {
    for site in sites.iter() {
        site.wait_serving(Duration::from_secs(30)).await?;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let writes = Arc::new(Mutex::new(Writes {
        acked: HashMap::new(),
        tried: 0,
        acknowledged: 0,
        longest_gap: Duration::ZERO,
        history: Vec::new(),
        sessions: 0,
        started: Instant::now(),
    }));
    let n = sites.len();
    let pad: Arc<str> = match args.disk_tier {
        true => format!(":{}", "x".repeat(TIER_PAD)).into(),
        false => "".into(),
    };
    let writers: Vec<_> = (0..args.clients)
        .map(|w| {
            let rng = Rng::new(seed ^ (w as u64 + 1).wrapping_mul(0x9E37_79B9));
            let addr = sites[w % n].addr((w / n) as u16 % args.nodes);
            tokio::spawn(client(addr, w, args.clients, rng, args.consistency.clone(), pad.clone(), stop.clone(), writes.clone()))
        })
        .collect();
    // Faults, one at a time, until the deadline.
    // A seed gives the same fault schedule.
    let mut rng = Rng::new(seed);
    let mut faults: BTreeMap<&str, u32> = BTreeMap::new();
    let (started, deadline) = (Instant::now(), Instant::now() + Duration::from_secs(args.seconds));
    if let Some(c) = args.redundancy {
        for what in coded::strike(&mut sites[0], c.parity, &mut rng, Duration::from_millis(1_000), deadline).await? {
            let first = if what.contains(": kill") { "kill -9, then a restart" } else { "pause past the failure timeout" };
            *faults.entry(first).or_default() += 1;
            if what.contains("while it was rebuilt") {
                *faults.entry("kill -9 and a restart of another node during a rebuild").or_default() += 1;
            }
        }
    }
    while args.redundancy.is_none() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(1_000 + rng.below(1_500))).await;
        let s = rng.below(n as u64) as usize;
        let node = rng.below(args.nodes as u64) as u16;
        let at = started.elapsed().as_secs_f64();
        let fault = strike(sites, s, node, &mut rng).await?;
        println!("{at:7.1} s  site {s} node {node}: {fault}");
        *faults.entry(fault).or_default() += 1;
        // Wait for the sites to take the fault before the next one (as
        // operators would); a site that does not heal fails the run here.
        for site in sites.iter() {
            wait_healed(site, Duration::from_secs(60)).await.map_err(|e| format!("after {fault} of site {s} node {node}: {e}"))?;
        }
    }
    for site in sites.iter().filter(|_| args.redundancy.is_none()) {
        wait_healed(site, Duration::from_secs(60)).await?;
    }
    // Writes flow again once healed.
    let before = writes.lock().unwrap().acknowledged;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let flowing = writes.lock().unwrap().acknowledged - before;
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        let _ = w.await;
    }
    if flowing == 0 {
        return Err(Failure::Failed("no write was acknowledged in the second after the sites healed".into()));
    }
    let writes = Arc::try_unwrap(writes).map_err(|_| "writers still running".to_string())?.into_inner().unwrap();
    let history = check_history(&writes.history, &args.consistency, n).inspect_err(|_| {
        // For a closer look: one operation per line, in call order.
        let mut ops: Vec<&Op> = writes.history.iter().collect();
        ops.sort_by_key(|op| op.call);
        let lines: String = ops.iter().map(|op| format!("{op:?}\n")).collect();
        let _ = std::fs::write(dir.join("history.txt"), lines);
    })?;
    let read_back = readback::check(sites, &writes.acked).await?;
    let mut partitions = 0;
    for site in sites.iter().filter(|_| args.redundancy.is_none()) {
        partitions += check_replicas(site).await?;
        if n > 1 {
            check_shipped(site).await?;
        }
    }
    let replicas = match args.redundancy {
        Some(_) => "erasure-coded: every group's lost slots decoded, every node rebuilt (parity is compared in the simulator)".to_string(),
        None => format!("{partitions} partitions with identical replicas"),
    };
    let total: u32 = faults.values().sum();
    let list: Vec<String> = faults.iter().map(|(f, n)| format!("{n} x {f}")).collect();
    let disaster = match args.dr {
        true => format!("; disaster: {}", disaster::run(sites, args.clients).await?),
        false => String::new(),
    };
    Ok(format!(
        "{total} faults ({}); {} writes tried, {} acknowledged; history of {} operations in {} sessions: {history}; {} keys' last acknowledged values read back at 3 levels through {} nodes in {n} site(s): {read_back}; {replicas}; longest write gap {:.2} s{disaster}",
        list.join(", "),
        writes.tried,
        writes.acknowledged,
        writes.history.len(),
        writes.sessions,
        writes.acked.len(),
        args.nodes,
        writes.longest_gap.as_secs_f64()
    ))
}

/// One random fault on site `s` (`node` if it takes one), over when this
/// returns; what it was.
async fn strike(sites: &mut [Site], s: usize, node: u16, rng: &mut Rng) -> Result<&'static str, String> {
    let ms = |rng: &mut Rng, lo: u64, hi: u64| Duration::from_millis(lo + rng.below(hi - lo));
    let others: Vec<usize> = (0..sites.len()).filter(|&t| t != s).collect();
    let site = &mut sites[s];
    let nodes = site.shape.nodes;
    // Geo faults only with several sites.
    let kinds = if others.is_empty() { 5 } else { 7 };
    Ok(match rng.below(kinds) {
        0 => {
            site.kill(node);
            tokio::time::sleep(ms(rng, 200, 2_000)).await;
            site.restart(node)?;
            "kill -9 and restart"
        }
        1 => {
            site.kill(node);
            site.wipe(node);
            tokio::time::sleep(ms(rng, 200, 1_000)).await;
            site.restart(node)?;
            "kill -9 and restart on an empty disk"
        }
        2 => {
            site.signal(node, "STOP");
            tokio::time::sleep(ms(rng, 500, 2_500)).await;
            site.signal(node, "CONT");
            "pause (SIGSTOP)"
        }
        3 => {
            let leader = leader(site).await.unwrap_or(node);
            site.signal(leader, "STOP");
            tokio::time::sleep(ms(rng, 1_000, 2_500)).await;
            site.signal(leader, "CONT");
            "pause of the coordinator leader"
        }
        4 => {
            (0..nodes).for_each(|i| site.kill(i));
            tokio::time::sleep(ms(rng, 200, 1_000)).await;
            for i in 0..nodes {
                site.restart(i)?;
            }
            "whole-site kill -9 and restart"
        }
        5 => {
            for &t in &others {
                on_every_node(site, &["CW.WAN", "CUT", &t.to_string()]).await?;
            }
            tokio::time::sleep(ms(rng, 1_000, 5_000)).await;
            for &t in &others {
                on_every_node(site, &["CW.WAN", "RESTORE", &t.to_string()]).await?;
            }
            "site cut off from the others, then back"
        }
        _ => {
            // Up to 3 s ahead or behind, until the site's nodes restart.
            let skew = rng.below(6_001) as i64 - 3_000;
            on_every_node(site, &["CW.CLOCK", "SKEW", &skew.to_string()]).await?;
            "clocks of a site skewed"
        }
    })
}

/// No node of `site` holds local updates it could not report in timestamp
/// order (never shipped to the other sites; `out_of_order` in CW.SITES,
/// counted since the node last started).
async fn check_shipped(site: &Site) -> Result<(), String> {
    for i in 0..site.shape.nodes {
        let mut c = RespConn::connect(&site.addr(i)).await?;
        let Frame::Bulk(text) = c.call(&[b"CW.SITES"]).await? else { return Err("CW.SITES answered no text".into()) };
        let text = String::from_utf8_lossy(&text).into_owned();
        if let Some(line) = text.lines().find(|l| l.starts_with("out_of_order:") && *l != "out_of_order:0") {
            return Err(format!("{}: {line}: local updates never shipped to the other sites", site.addr(i)));
        }
    }
    Ok(())
}

/// Sends one command to every node of `site`.
async fn on_every_node(site: &Site, command: &[&str]) -> Result<(), String> {
    let args: Vec<&[u8]> = command.iter().map(|a| a.as_bytes()).collect();
    for i in 0..site.shape.nodes {
        let mut c = RespConn::connect(&site.addr(i)).await?;
        c.call(&args).await.map_err(|e| format!("{} on {}: {e}", command.join(" "), site.addr(i)))?;
    }
    Ok(())
}

/// One client, through node `addr`: writes unique values to its own keys,
/// reads any client's keys, and records every operation. A connection that
/// fails is replaced by a new one (a new session).
/// Values are padded with `pad` (`--disk-tier`).
#[allow(clippy::too_many_arguments)]
async fn client(
    addr: String,
    w: usize,
    clients: usize,
    mut rng: Rng,
    level: String,
    pad: Arc<str>,
    stop: Arc<AtomicBool>,
    writes: Arc<Mutex<Writes>>,
) {
    let mut con: Option<(RespConn, usize)> = None;
    let mut last_ok = Instant::now();
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let Some((c, session)) = con.as_mut() else {
            if let Ok(mut c) = RespConn::connect(&addr).await {
                if c.call(&[b"CW.CONSISTENCY", level.as_bytes()]).await.is_ok() {
                    let mut ws = writes.lock().unwrap();
                    ws.sessions += 1;
                    con = Some((c, ws.sessions));
                    continue;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let session = *session;
        let call = writes.lock().unwrap().micros();
        if rng.below(2) == 0 {
            n += 1;
            let (key, value) = (format!("torture:w{w}:k{}", n % KEYS), format!("w{w}:v{n}{pad}"));
            let answer = tokio::time::timeout(Duration::from_secs(5), c.call(&[b"SET", key.as_bytes(), value.as_bytes()])).await;
            let mut ws = writes.lock().unwrap();
            ws.tried += 1;
            let ok = matches!(answer, Ok(Ok(_)));
            let ret = ok.then(|| ws.micros());
            ws.history.push(Op { client: session, key: key.clone(), kind: OpKind::Put(value.clone()), call, ret });
            if ok {
                ws.acknowledged += 1;
                ws.longest_gap = ws.longest_gap.max(last_ok.elapsed());
                last_ok = Instant::now();
                ws.acked.insert(key, value);
            } else {
                ws.acked.remove(&key);
                con = None;
            }
        } else {
            let key = format!("torture:w{}:k{}", rng.below(clients as u64), rng.below(KEYS));
            let answer = tokio::time::timeout(Duration::from_secs(5), c.call(&[b"GET", key.as_bytes()])).await;
            let value = match answer {
                Ok(Ok(Frame::Bulk(v))) => String::from_utf8_lossy(&v).into_owned(),
                Ok(Ok(Frame::Null)) => String::new(),
                _ => {
                    // A failed read says nothing: left out of the history.
                    con = None;
                    continue;
                }
            };
            let mut ws = writes.lock().unwrap();
            let ret = Some(ws.micros());
            ws.history.push(Op { client: session, key, kind: OpKind::Get(value), call, ret });
        }
    }
}

/// Checks the recorded history for the run's level: what it says, or the
/// violation.
fn check_history(history: &[Op], level: &str, sites: usize) -> Result<String, String> {
    if level == "eventual" {
        return Ok("no ordering promised at eventual".into());
    }
    let violations = causeway_checker::causal::causal_values(history, order);
    if let Some(first) = violations.first() {
        return Err(format!("{} causal+ violations, the first: {first}", violations.len()));
    }
    let mut said = "causal+ holds".to_string();
    if level == "linearizable" && sites > 1 {
        said += " (linearizability is per site: not checked across sites)";
    } else if level == "linearizable" {
        match causeway_checker::lincheck::verdict(history) {
            Ok(true) => said += ", linearizable (porcupine)",
            Ok(false) => return Err("the history is not linearizable (porcupine's explanation is above)".into()),
            Err(e) => said += &format!(", linearizability NOT checked: {e}"),
        }
    }
    Ok(said)
}

/// `CW.CLUSTER STATUS` of `node`, as field -> value.
async fn status(site: &Site, node: u16) -> Option<HashMap<String, String>> {
    let mut c = RespConn::connect(&site.addr(node)).await.ok()?;
    let Frame::Bulk(text) = tokio::time::timeout(Duration::from_secs(1), c.call(&[b"CW.CLUSTER", b"STATUS"])).await.ok()?.ok()? else {
        return None;
    };
    let text = String::from_utf8_lossy(&text).into_owned();
    Some(text.lines().filter_map(|l| l.split_once(':')).map(|(k, v)| (k.to_string(), v.to_string())).collect())
}

async fn leader(site: &Site) -> Option<u16> {
    for i in 0..site.shape.nodes.min(3) {
        if let Some(l) = status(site, i).await.and_then(|s| s.get("coordinator_leader")?.parse().ok()) {
            return Some(l);
        }
    }
    None
}

/// Waits until the leader reports every node a member, heard at the current
/// epoch with nothing left to fetch, and every chain at R, and every node
/// serves.
async fn wait_healed(site: &Site, timeout: Duration) -> Result<(), String> {
    let (deadline, nodes) = (Instant::now() + timeout, site.shape.nodes);
    loop {
        if let Some(l) = leader(site).await {
            if let Some(s) = status(site, l).await {
                let settled = format!("epoch={},joining=0,catching_up=0,", s.get("epoch").map_or("", |e| e.as_str()));
                let whole = (0..nodes)
                    .all(|n| s.get(&format!("node{n}")).is_some_and(|line| !line.starts_with("member=no") && line.contains(&settled)));
                if whole
                    && s.get("short_chains").map(String::as_str) == Some("0")
                    && site.wait_serving(Duration::from_secs(1)).await.is_ok()
                {
                    return Ok(());
                }
            }
        }
        if Instant::now() > deadline {
            return Err(format!("the site did not heal within {} s", timeout.as_secs()));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every chain's replicas identical and stable, by `CW.DIGEST`.
async fn check_replicas(site: &Site) -> Result<usize, String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut by_partition: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for node in 0..site.shape.nodes {
            let mut c = RespConn::connect(&site.addr(node)).await?;
            let Frame::Bulk(text) = c.call(&[b"CW.DIGEST"]).await? else { return Err("CW.DIGEST answered no text".into()) };
            for line in String::from_utf8_lossy(&text).lines() {
                if let Some((p, rest)) = line.split_once(':') {
                    by_partition.entry(p.to_string()).or_default().push(rest.to_string());
                }
            }
        }
        let same = by_partition.values().all(|lines| {
            lines.windows(2).all(|w| w[0] == w[1])
                && lines.iter().all(|l| l.split(':').take(2).collect::<Vec<_>>().windows(2).all(|w| w[0] == w[1]))
        });
        if same {
            return Ok(by_partition.len());
        }
        if Instant::now() > deadline {
            return Err(format!("replicas differ: {by_partition:?}"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
