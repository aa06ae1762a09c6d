//! `causeway dev`: a whole site on this machine, one real process per node
//! over real TCP on loopback, so you can `kill` one and watch.

use clap::Args;
use std::net::TcpStream;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct DevArgs {
    /// Port of the first node; node i listens on port + i.
    #[arg(long, default_value_t = 6380)]
    port: u16,
    /// Number of nodes.
    #[arg(long, default_value_t = 3)]
    nodes: u16,
    /// R: nodes per chain.
    #[arg(long, default_value_t = 3)]
    replicas: usize,
    /// Writes are acknowledged once k nodes of the chain have them.
    #[arg(long, default_value_t = 2)]
    k: usize,
    #[arg(long, default_value_t = 64)]
    partitions: u32,
    /// Give node i a write-ahead log in DIR/node-i (memory only without it).
    #[arg(long)]
    data_dir: Option<String>,
    /// Extra flags passed to every node (e.g. --requirepass secret).
    #[arg(last = true)]
    node_args: Vec<String>,
}

pub fn run(args: DevArgs) -> Result<(), String> {
    causeway_core::ring::Shape { partitions: args.partitions, replicas: args.replicas, k: args.k }.validate(args.nodes as usize)?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let addr = |i: u16| format!("127.0.0.1:{}", args.port + i);
    let nodes: Vec<String> = (0..args.nodes).map(|i| format!("{i}={}", addr(i))).collect();
    // The nodes of this site prove a fresh shared secret to each other,
    // unless one was given.
    let secret =
        match args.node_args.iter().any(|a| a.starts_with("--cluster-secret")) || std::env::var_os("CAUSEWAY_CLUSTER_SECRET").is_some() {
            true => Vec::new(),
            false => vec!["--cluster-secret".to_string(), random_secret()],
        };
    let mut children: Vec<(u16, Child)> = Vec::new();
    for i in 0..args.nodes {
        let data: Vec<String> = args.data_dir.iter().flat_map(|d| ["--data-dir".to_string(), format!("{d}/node-{i}")]).collect();
        let child = Command::new(&exe)
            .args(["node", "--id", &i.to_string(), "--listen", &addr(i), "--nodes", &nodes.join(",")])
            .args(["--partitions", &args.partitions.to_string(), "--replicas", &args.replicas.to_string(), "--k", &args.k.to_string()])
            .args(&data)
            .args(&secret)
            .args(&args.node_args)
            .spawn()
            .map_err(|e| format!("cannot start node {i}: {e}"))?;
        children.push((i, child));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    for i in 0..args.nodes {
        while TcpStream::connect(addr(i)).is_err() {
            if Instant::now() > deadline || children.iter_mut().any(|(_, c)| matches!(c.try_wait(), Ok(Some(_)))) {
                stop(&mut children);
                return Err(format!("node {i} did not start on {} (is the port free?)", addr(i)));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    // A node serves once the coordinator has admitted it (a Raft election,
    // then one decision): wait for that, so the first request succeeds.
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    let started = Instant::now();
    for i in 0..args.nodes {
        let serving = runtime.block_on(async {
            while Instant::now() < deadline + Duration::from_secs(20) {
                if let Ok(mut c) = crate::resp_client::RespConn::connect(&addr(i)).await {
                    if let Ok(causeway_resp::Frame::Bulk(s)) = c.call(&[b"CW.STATUS"]).await {
                        if s.windows(11).any(|w| w == b"serving:yes") {
                            return true;
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            false
        });
        if !serving {
            stop(&mut children);
            return Err(format!("node {i} started but was not admitted by the coordinator in time (see its log above)"));
        }
    }
    println!(
        "Causeway site up in {} ms: {} nodes, R={}, k={}, {} partitions.",
        started.elapsed().as_millis(),
        args.nodes,
        args.replicas,
        args.k,
        args.partitions
    );
    for (i, c) in &children {
        println!("  node {i}: {} (pid {})", addr(*i), c.id());
    }
    println!("Connect with any Redis client, e.g.  redis-cli -p {}   or   causeway cli --addr {}", args.port, addr(0));
    println!("Ctrl-C stops the site.");
    runtime.block_on(async {
        let mut watch = tokio::time::interval(Duration::from_millis(500));
        let shutdown = crate::shutdown_signal();
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                _ = watch.tick() => {
                    for (i, c) in children.iter_mut() {
                        if let Ok(Some(status)) = c.try_wait() {
                            println!("node {i} exited ({status}); the others keep serving.");
                        }
                    }
                    children.retain_mut(|(_, c)| !matches!(c.try_wait(), Ok(Some(_))));
                }
            }
        }
    });
    println!("stopping {} nodes", children.len());
    stop(&mut children);
    Ok(())
}

/// 128 random bits, hex.
fn random_secret() -> String {
    format!("{:032x}", rand::random::<u128>())
}

fn stop(children: &mut [(u16, Child)]) {
    for (_, c) in children.iter_mut() {
        // SIGTERM: each node shuts down cleanly.
        let _ = Command::new("kill").arg(c.id().to_string()).status();
    }
    for (_, c) in children.iter_mut() {
        let _ = c.wait();
    }
}
