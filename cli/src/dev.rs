//! `causeway dev`: a whole site on this machine, one real process per node
//! over real TCP on loopback, so you can `kill` one and watch.

use clap::Args;
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
    let shape = crate::site::Shape {
        port: args.port,
        nodes: args.nodes,
        replicas: args.replicas,
        k: args.k,
        partitions: args.partitions,
        data_dir: args.data_dir,
        node_args: args.node_args,
        logs: None,
    };
    let mut site = crate::site::Site::start(shape)?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    // A node serves once the coordinator has admitted it (a Raft election,
    // then one decision): wait for that, so the first request succeeds.
    let started = Instant::now();
    if let Err(e) = runtime.block_on(site.wait_serving(Duration::from_secs(30))) {
        site.stop();
        return Err(format!("{e} (see its log above)"));
    }
    let s = &site.shape;
    println!(
        "Causeway site up in {} ms: {} nodes, R={}, k={}, {} partitions.",
        started.elapsed().as_millis(),
        s.nodes,
        s.replicas,
        s.k,
        s.partitions
    );
    for i in 0..s.nodes {
        println!("  node {i}: {} (pid {})", site.addr(i), site.pid(i).unwrap_or(0));
    }
    println!("Connect with any Redis client, e.g.  redis-cli -p {}   or   causeway cli --addr {}", s.port, site.addr(0));
    println!("Ctrl-C stops the site.");
    runtime.block_on(async {
        let mut watch = tokio::time::interval(Duration::from_millis(500));
        let shutdown = crate::shutdown_signal();
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                _ = watch.tick() => {
                    while let Some((i, status)) = site.exited() {
                        println!("node {i} exited ({status}); the others keep serving.");
                    }
                }
            }
        }
    });
    println!("stopping {} nodes", site.running());
    site.stop();
    Ok(())
}
