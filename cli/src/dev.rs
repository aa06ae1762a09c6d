//! `causeway dev`: a whole site on this machine, one real process per node
//! over real TCP on loopback, so you can `kill` one and watch. With
//! `--sites N`, N such sites, active-active (geo-replication), joined by
//! emulated wide-area links.

use crate::site::{start_sites, Shape, Site};
use clap::Args;
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct DevArgs {
    /// Port of the first node; node i of site s listens on port + 10*s + i.
    #[arg(long, default_value_t = 6380)]
    port: u16,
    /// Number of nodes (per site).
    #[arg(long, default_value_t = 3)]
    nodes: u16,
    /// R: nodes per chain (default 3, or --nodes if fewer).
    #[arg(long)]
    replicas: Option<usize>,
    /// Writes are acknowledged once k nodes of the chain have them
    /// (default 2, or R if less).
    #[arg(long)]
    k: Option<usize>,
    /// `ec:K+M`: instead of chains of R copies, values kept once and
    /// erasure-coded over groups of K data and M parity nodes (needs
    /// --nodes K+M); any M nodes can be lost. E.g. --nodes 5 --redundancy ec:3+2.
    #[arg(long, value_name = "ec:K+M")]
    redundancy: Option<causeway_core::ring::Coding>,
    #[arg(long, default_value_t = 64)]
    partitions: u32,
    /// Number of sites, each holding every key and taking writes.
    #[arg(long, default_value_t = 1)]
    sites: u16,
    /// Emulated one-way delays between sites in ms, a,b=ms pairs (default:
    /// as the Eunomia paper, 40 between site 0 and each other site, 80
    /// between two others).
    #[arg(long)]
    wan: Option<String>,
    /// Identifier-first disaster recovery between two of the sites,
    /// PRIMARY=BACKUP: the primary's writes are acknowledged once the
    /// backup has noted their keys (`causeway cluster failover` at the
    /// backup serves on without the primary).
    #[arg(long, value_name = "PRIMARY=BACKUP")]
    dr: Option<causeway_core::message::geo::DrPair>,
    /// Up to this much more delay, at random, on each message between sites.
    #[arg(long, default_value_t = 2)]
    wan_jitter_ms: u64,
    /// Give node i a write-ahead log in DIR/node-i (DIR/site-s/node-i with several sites).
    #[arg(long)]
    data_dir: Option<String>,
    /// Give node i a disk tier in DIR/node-i: values past the budget
    /// (`-- --maxmemory 100mb`) move there instead of keys being evicted.
    #[arg(long, value_name = "DIR")]
    disk_tier: Option<String>,
    /// Extra flags passed to every node (e.g. --requirepass secret: then
    /// `causeway cli`, `cluster` and `bench` take the password from
    /// $CAUSEWAY_PASSWORD).
    #[arg(last = true)]
    node_args: Vec<String>,
}

/// The password of `--requirepass X` (or `--requirepass=X`) among the
/// nodes' flags.
fn requirepass(node_args: &[String]) -> Option<String> {
    node_args.iter().enumerate().find_map(|(i, a)| match a.strip_prefix("--requirepass") {
        Some("") => node_args.get(i + 1).cloned(),
        Some(rest) => rest.strip_prefix('=').map(str::to_string),
        None => None,
    })
}

pub fn run(args: DevArgs) -> Result<(), String> {
    if args.sites > 1 && args.nodes > 10 {
        return Err("with several sites, at most 10 nodes per site (site s uses ports port+10*s ..)".into());
    }
    if args.redundancy.is_some() && args.sites > 1 {
        return Err("--redundancy ec:K+M is for one site: erasure-coded sites do not replicate to other sites yet".into());
    }
    let delays = wan_delays(args.sites, args.wan.as_deref())?;
    let mut node_args = args.node_args.clone();
    if let Some(password) = requirepass(&node_args) {
        // For this process's own checks of the nodes (`Site::wait_serving`,
        // `resp_client::RespConn::connect`).
        std::env::set_var(crate::resp_client::PASSWORD_ENV, password);
    }
    if let Some(pair) = args.dr {
        if pair.primary >= args.sites || pair.backup >= args.sites {
            return Err(format!("--dr {}={}: both must be sites of this deployment (0..{})", pair.primary, pair.backup, args.sites));
        }
        node_args.extend(["--dr".to_string(), format!("{}={}", pair.primary, pair.backup)]);
    }
    // Coded: as many partitions for every data slot of every group, so the
    // data areas (and the parity over them) are even.
    let partitions = args.redundancy.map_or(args.partitions, |c| args.partitions.next_multiple_of(c.nodes() as u32 * c.data as u32));
    if let Some(dir) = &args.data_dir {
        // A node started without a place in the saved site would never be
        // admitted (nodes join with `causeway cluster add`).
        for s in 0..args.sites {
            let node_0 = match args.sites {
                1 => format!("{dir}/node-0"),
                _ => format!("{dir}/site-{s}/node-0"),
            };
            let Some(saved) = causeway_node::runtime::saved_topology(std::path::Path::new(&node_0)) else { continue };
            if saved.shape.partitions != partitions || saved.shape.coding != args.redundancy {
                let coding = saved.shape.coding.map_or(String::new(), |c| format!(", --redundancy ec:{}+{}", c.data, c.parity));
                return Err(format!(
                    "{dir} holds a site of {} partitions{coding}: start it with the same --partitions and --redundancy, or use another directory",
                    saved.shape.partitions
                ));
            }
            if saved.nodes.len() != args.nodes as usize {
                return Err(format!(
                    "{dir} holds a site of {} nodes, and --nodes is {}: start it with --nodes {} (more nodes join with `causeway cluster add`), or use another directory",
                    saved.nodes.len(),
                    args.nodes,
                    saved.nodes.len()
                ));
            }
        }
    }
    let ports: Vec<Vec<u16>> = (0..args.sites).map(|s| (0..args.nodes).map(|i| args.port + 10 * s + i).collect()).collect();
    let replicas = args.replicas.unwrap_or(3.min(args.nodes as usize));
    let shape = Shape {
        nodes: args.nodes,
        replicas,
        k: args.k.unwrap_or(2.min(replicas)),
        partitions,
        coding: args.redundancy,
        data_dir: args.data_dir.clone(),
        disk_tier: args.disk_tier.clone(),
        node_args,
        logs: None,
    };
    let mut sites = start_sites(&shape, &ports, &delays, args.wan_jitter_ms)?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    // A node serves once the coordinator has admitted it (a Raft election,
    // then one decision): wait for that, so the first request succeeds.
    let started = Instant::now();
    for site in &mut sites {
        if let Err(e) = runtime.block_on(site.wait_serving(Duration::from_secs(30))) {
            sites.iter_mut().for_each(Site::stop);
            return Err(format!("{e} (see its log above)"));
        }
    }
    let s = &sites[0].shape;
    let what = if args.sites > 1 { format!("{} sites of", args.sites) } else { "Causeway site up:".into() };
    let redundancy = match s.coding {
        Some(c) => format!("erasure-coded ec:{}+{} (any {} nodes can be lost)", c.data, c.parity, c.parity),
        None => format!("R={}, k={}", s.replicas, s.k),
    };
    let plural = if s.nodes == 1 { "" } else { "s" };
    println!("{what} {} node{plural}, {redundancy}, {} partitions, up in {} ms.", s.nodes, s.partitions, started.elapsed().as_millis());
    for (n, site) in sites.iter().enumerate() {
        for i in 0..site.shape.nodes {
            let at = if args.sites > 1 { format!("site {n} ") } else { String::new() };
            println!("  {at}node {i}: {} (pid {})", site.addr(i), site.pid(i).unwrap_or(0));
        }
    }
    if args.sites > 1 {
        println!("Wide-area links (one-way ms): {}", describe(&delays));
        println!("Each site takes reads and writes; CW.SITES (or INFO geo) shows how far it has applied the others.");
        if let Some(pair) = args.dr {
            println!(
                "Site {} backs up site {}: its writes are acknowledged once site {} has noted them (CW.DR STATUS); `causeway cluster --addr {} failover` fails over.",
                pair.backup,
                pair.primary,
                pair.backup,
                sites[pair.backup as usize].addr(0)
            );
        }
    }
    println!("Connect with any Redis client, e.g.  redis-cli -p {}   or   causeway cli --addr {}", args.port, sites[0].addr(0));
    println!("Ctrl-C stops everything.");
    runtime.block_on(async {
        let mut watch = tokio::time::interval(Duration::from_millis(500));
        let shutdown = crate::shutdown_signal();
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                _ = watch.tick() => {
                    for (n, site) in sites.iter_mut().enumerate() {
                        while let Some((i, status)) = site.exited() {
                            println!("site {n} node {i} exited ({status}); the others keep serving.");
                        }
                    }
                }
            }
        }
    });
    let running: usize = sites.iter().map(Site::running).sum();
    println!("stopping {running} nodes");
    sites.iter_mut().for_each(Site::stop);
    Ok(())
}

/// One-way delays between `sites` sites: the paper's by default, or `a,b=ms`
/// pairs (both ways) over it.
fn wan_delays(sites: u16, spec: Option<&str>) -> Result<Vec<Vec<u64>>, String> {
    let n = sites as usize;
    let mut d = causeway_core::geo::paper_delays(n);
    for pair in spec.unwrap_or("").split_whitespace().flat_map(|s| s.split(';')).filter(|p| !p.is_empty()) {
        let bad = || format!("expected a,b=ms, got '{pair}'");
        let (ab, ms) = pair.split_once('=').ok_or_else(bad)?;
        let (a, b) = ab.split_once(',').ok_or_else(bad)?;
        let (a, b, ms): (usize, usize, u64) =
            (a.trim().parse().map_err(|_| bad())?, b.trim().parse().map_err(|_| bad())?, ms.trim().parse().map_err(|_| bad())?);
        if a >= n || b >= n {
            return Err(format!("no site {} here", a.max(b)));
        }
        d[a][b] = ms;
        d[b][a] = ms;
    }
    Ok(d)
}

fn describe(d: &[Vec<u64>]) -> String {
    let mut pairs = Vec::new();
    for (a, row) in d.iter().enumerate() {
        for (b, ms) in row.iter().enumerate().skip(a + 1) {
            pairs.push(format!("{a}-{b} {ms}"));
        }
    }
    pairs.join(", ")
}
