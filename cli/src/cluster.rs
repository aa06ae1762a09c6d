//! `causeway cluster status | add ID HOST:PORT | remove ID`: the admin
//! commands, sent as `CW.CLUSTER` over the Redis protocol. Membership
//! changes must reach the coordinator leader; this tries the site's nodes
//! until the leader accepts.
//!
//! `causeway cluster link cut|restore SITE | delay SITE MS`: the emulated
//! wide-area link between the site of `--addr` and site SITE, changed on
//! every node of the site (`CW.WAN`): every message between the two sites
//! passes through one of them, so the link is cut both ways.
//!
//! `causeway cluster clock skew MS`: every node of the site's wall clock
//! put MS ahead (negative: behind; 0: right again), `CW.CLOCK`.
//!
//! `causeway cluster failover`: at the backup site of a disaster-recovery
//! pair (`--dr`), serve on without the primary: keys whose last
//! acknowledged write never arrived are refused (`-LOST`) until written
//! again (`CW.DR FAILOVER`). `causeway cluster missing` lists them
//! (`CW.DR MISSING`); `causeway cluster dr` shows the pair's state.

use crate::resp_client::RespConn;
use causeway_resp::Frame;
use clap::{Args, Subcommand};

#[derive(Args)]
pub struct ClusterArgs {
    /// Any node of the site.
    #[arg(long, default_value = "127.0.0.1:6380")]
    addr: String,
    #[command(subcommand)]
    action: Action,
}

#[derive(Subcommand)]
enum Action {
    /// Nodes, roles, chain lengths, epoch, coordinator leader.
    Status,
    /// Add a node (start it first with `causeway node`); it takes its share of partitions.
    Add { id: u16, addr: String },
    /// Drain a node: it leaves every chain, which grow back on the others.
    Remove { id: u16 },
    /// The emulated wide-area link from this site to another one.
    Link {
        #[command(subcommand)]
        change: Link,
    },
    /// At the backup of a disaster-recovery pair: serve without the
    /// primary; keys whose value never arrived are refused until written.
    Failover {
        /// Without a majority of stabilizer replicas whose notes are whole
        /// (CW.DR STATUS notes_whole): what only replicas that lost their
        /// notes knew of may then be served older instead of refused.
        #[arg(long)]
        force: bool,
    },
    /// After a failover: every key refused, with the write it misses.
    Missing,
    /// The disaster-recovery pair as this node sees it (CW.DR STATUS).
    Dr,
    /// Emulated clock faults of the whole site.
    Clock {
        #[command(subcommand)]
        change: Clock,
    },
}

#[derive(Subcommand)]
enum Clock {
    /// Put every node's wall clock MS ahead (negative: behind; 0: right).
    Skew {
        #[arg(allow_hyphen_values = true)]
        ms: i64,
    },
}

#[derive(Subcommand)]
enum Link {
    /// Drop everything between the two sites until `restore`.
    Cut {
        site: u16,
    },
    Restore {
        site: u16,
    },
    /// Set the one-way delay of the link, in milliseconds.
    Delay {
        site: u16,
        ms: u64,
    },
}

pub fn run(args: ClusterArgs) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    runtime.block_on(async {
        let status = call(&args.addr, &[b"CW.CLUSTER", b"STATUS"]).await?;
        let change: Vec<Vec<u8>> = match &args.action {
            Action::Status => {
                println!("{}", status.replace("\r\n", "\n").trim_end());
                return Ok(());
            }
            Action::Add { id, addr } => {
                vec![b"CW.CLUSTER".to_vec(), b"ADD".to_vec(), id.to_string().into_bytes(), addr.clone().into_bytes()]
            }
            Action::Remove { id } => vec![b"CW.CLUSTER".to_vec(), b"REMOVE".to_vec(), id.to_string().into_bytes()],
            Action::Link { change } => {
                let command: Vec<String> = match change {
                    Link::Cut { site } => vec!["CW.WAN".into(), "CUT".into(), site.to_string()],
                    Link::Restore { site } => vec!["CW.WAN".into(), "RESTORE".into(), site.to_string()],
                    Link::Delay { site, ms } => vec!["CW.WAN".into(), "DELAY".into(), site.to_string(), ms.to_string()],
                };
                return every_node(&status, &command).await;
            }
            Action::Failover { force } => {
                let mut c = RespConn::connect(&args.addr).await?;
                let command: &[&[u8]] = if *force { &[b"CW.DR", b"FAILOVER", b"FORCE"] } else { &[b"CW.DR", b"FAILOVER"] };
                return match c.call(command).await? {
                    Frame::Integer(n) => {
                        println!("failed over: {n} keys whose last write never arrived are refused until written again (`causeway cluster missing` lists them)");
                        Ok(())
                    }
                    Frame::Error(e) => Err(e.to_string()),
                    other => Err(format!("unexpected answer {other:?}")),
                };
            }
            Action::Missing => return missing(&args.addr).await,
            Action::Dr => {
                println!("{}", call(&args.addr, &[b"CW.DR", b"STATUS"]).await?.replace("\r\n", "\n").trim_end());
                return Ok(());
            }
            Action::Clock { change: Clock::Skew { ms } } => {
                return every_node(&status, &["CW.CLOCK".into(), "SKEW".into(), ms.to_string()]).await;
            }
        };
        let request: Vec<&[u8]> = change.iter().map(|a| a.as_slice()).collect();
        // Every node's address is in the status; the leader takes the change.
        let mut last = String::new();
        for addr in node_addrs(&status) {
            match call(&addr, &request).await {
                Ok(_) => {
                    println!("OK (accepted by {addr}); watch it with `causeway cluster status`");
                    return Ok(());
                }
                Err(e) => last = e,
            }
        }
        Err(format!("no coordinator leader accepted the change: {last}"))
    })
}

/// Sends `command` to every node of the site (emulated faults: each node
/// keeps its own link and clock).
async fn every_node(status: &str, command: &[String]) -> Result<(), String> {
    let request: Vec<&[u8]> = command.iter().map(|a| a.as_bytes()).collect();
    for addr in node_addrs(status) {
        call(&addr, &request).await.map_err(|e| format!("{addr}: {e}"))?;
    }
    println!("OK (every node of the site)");
    Ok(())
}

/// Prints every refused key and the write it misses, page by page.
async fn missing(addr: &str) -> Result<(), String> {
    let mut c = RespConn::connect(addr).await?;
    let mut cursor = b"0".to_vec();
    let mut total = 0;
    loop {
        let page = c.call(&[b"CW.DR", b"MISSING", &cursor, b"COUNT", b"1000"]).await?;
        let Frame::Array(parts) = page else {
            return Err(match page {
                Frame::Error(e) => e.to_string(),
                other => format!("unexpected answer {other:?}"),
            });
        };
        let [Frame::Bulk(next), Frame::Array(items)] = &parts[..] else { return Err(format!("unexpected answer {parts:?}")) };
        for pair in items.chunks(2) {
            if let [Frame::Bulk(key), Frame::Bulk(write)] = pair {
                println!("{}\t{}", String::from_utf8_lossy(key), String::from_utf8_lossy(write));
                total += 1;
            }
        }
        if next.as_ref() == b"0" {
            break;
        }
        cursor = next.to_vec();
    }
    eprintln!("{total} keys refused");
    Ok(())
}

/// Every node's address, from `CW.CLUSTER STATUS`.
fn node_addrs(status: &str) -> Vec<String> {
    status.lines().filter_map(|l| l.split("addr=").nth(1)).map(|r| r.split(',').next().unwrap_or("").to_string()).collect()
}

async fn call(addr: &str, request: &[&[u8]]) -> Result<String, String> {
    let mut c = RespConn::connect(addr).await?;
    match c.call(request).await? {
        Frame::Bulk(b) => Ok(String::from_utf8_lossy(&b).into_owned()),
        Frame::Simple(s) => Ok(s.into_owned()),
        other => Ok(format!("{other:?}")),
    }
}
