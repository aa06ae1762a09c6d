//! The faults of an erasure-coded site (`torture --redundancy ec:K+M`): one
//! after the other under the writers, more than M in all (at least M + 1,
//! and more while the run's time lasts), each taken in before the next: the
//! coordinator removed the node, the groups decoded what it held, and it
//! came back as a replacement, rebuilt by decoding (its parity from every
//! data slot's state, its data slots taken back and their pages decoded):
//!
//! * kill -9 of a node, then a restart of its process (empty): it must
//!   pass requests on, never serving its empty member, until it is rebuilt;
//! * a pause (SIGSTOP) longer than the failure timeout: the coordinator
//!   removes the node, and when it wakes it must serve nothing it holds,
//!   and rejoin as a replacement;
//! * every third fault, with M >= 2, another node killed -9 and restarted
//!   while the first is still being rebuilt (two down at once).
//!
//! Every node is the data member of K groups and a parity member of M, so
//! each fault loses data members of some groups and parity members of
//! others.

use super::{rng::Rng, Failure};
use crate::resp_client::RespConn;
use crate::site::Site;
use causeway_resp::Frame;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Strikes the site until `deadline` (at least `parity` + 1 times); what
/// each fault was.
pub async fn strike(
    site: &mut Site,
    parity: u8,
    rng: &mut Rng,
    failure_timeout: Duration,
    deadline: Instant,
) -> Result<Vec<String>, Failure> {
    let mut said = Vec::new();
    let started = Instant::now();
    let mut f = 0;
    while f <= parity as usize || Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(1_000 + rng.below(1_500))).await;
        let node = rng.below(site.shape.nodes as u64) as u16;
        let at = started.elapsed().as_secs_f64();
        let mut what = if f % 2 == 0 {
            site.kill(node);
            wait_lost(site, node).await?;
            site.restart(node)?;
            "kill -9, then a restart (empty)".to_string()
        } else {
            site.signal(node, "STOP");
            tokio::time::sleep(failure_timeout * 3).await;
            site.signal(node, "CONT");
            "pause (SIGSTOP) past the failure timeout".to_string()
        };
        if parity >= 2 && f % 3 == 2 {
            // A second loss while the first node is still being rebuilt
            // (M = 2 down at once).
            let other = (node + 1 + rng.below(site.shape.nodes as u64 - 1) as u16) % site.shape.nodes;
            site.kill(other);
            wait_lost(site, other).await?;
            site.restart(other)?;
            what += &format!(", and node {other} killed -9 and restarted while it was rebuilt");
        }
        let took = wait_rebuilt(site).await?;
        println!("{at:7.1} s  node {node}: {what}; rebuilt {took:.1} s later");
        said.push(format!("node {node}: {what}"));
        f += 1;
    }
    Ok(said)
}

/// Waits until the other nodes know `node` is lost (or rejoining).
async fn wait_lost(site: &Site, node: u16) -> Result<(), Failure> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut done = true;
        for n in (0..site.shape.nodes).filter(|&n| n != node) {
            let ec = info_ec(site, n).await.unwrap_or_default();
            let listed = |field: &str| ec.get(field).is_some_and(|v| v.split(',').any(|x| x == node.to_string()));
            done &= listed("ec_lost_nodes") || listed("ec_joining_nodes");
        }
        if done {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(Failure::Unavailable(format!("the site did not take the loss of node {node} within 60 s")));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until every node is a member holding its whole part (nobody lost
/// or joining, every page decoded); how long that took.
async fn wait_rebuilt(site: &Site) -> Result<f64, Failure> {
    let started = Instant::now();
    let deadline = started + Duration::from_secs(120);
    loop {
        let mut done = true;
        for n in 0..site.shape.nodes {
            let ec = info_ec(site, n).await.unwrap_or_default();
            let is = |field: &str, value: &str| ec.get(field).map(String::as_str) == Some(value);
            done &= is("ec_standing", "member") && is("ec_whole", "1") && is("ec_lost_nodes", "") && is("ec_joining_nodes", "");
        }
        if done {
            return Ok(started.elapsed().as_secs_f64());
        }
        if Instant::now() > deadline {
            return Err(Failure::Unavailable("the site did not rebuild its lost node within 120 s".into()));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// INFO ec of `node`, as field -> value.
async fn info_ec(site: &Site, node: u16) -> Option<HashMap<String, String>> {
    let mut c = RespConn::connect(&site.addr(node)).await.ok()?;
    let Frame::Bulk(text) = tokio::time::timeout(Duration::from_secs(1), c.call(&[b"INFO", b"ec"])).await.ok()?.ok()? else {
        return None;
    };
    let text = String::from_utf8_lossy(&text).into_owned();
    Some(text.lines().filter_map(|l| l.split_once(':')).map(|(k, v)| (k.to_string(), v.trim().to_string())).collect())
}
