//! The faults of an erasure-coded site (`torture --redundancy ec:K+M`): as
//! many as the code covers, M losses in all (a lost member does not come
//! back yet), one after the other under the writers, each taken in (the
//! coordinator removed the node, every group's lost slots decoded again)
//! before the next:
//!
//! * kill -9 of a node, then a restart of its process: it must come back
//!   as a non-member that passes requests on, never serving its empty
//!   member;
//! * a pause (SIGSTOP) longer than the failure timeout: the coordinator
//!   removes the node, and when it wakes it must serve nothing it holds.
//!
//! Every node is the data member of K groups and a parity member of M, so
//! the first fault loses data members and the second a data member and a
//! parity member of other groups (and, where both held a group, two
//! members of it).

use super::{rng::Rng, Failure};
use crate::resp_client::RespConn;
use crate::site::Site;
use causeway_resp::Frame;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Strikes the site `faults` times; what each was.
pub async fn strike(site: &mut Site, faults: u8, rng: &mut Rng, failure_timeout: Duration) -> Result<Vec<String>, Failure> {
    let mut lost: Vec<u16> = Vec::new();
    let mut said = Vec::new();
    let started = Instant::now();
    for f in 0..faults {
        tokio::time::sleep(Duration::from_millis(1_000 + rng.below(1_500))).await;
        let alive: Vec<u16> = (0..site.shape.nodes).filter(|n| !lost.contains(n)).collect();
        let node = alive[rng.below(alive.len() as u64) as usize];
        let at = started.elapsed().as_secs_f64();
        let what = if f % 2 == 0 {
            site.kill(node);
            wait_lost(site, &[lost.clone(), vec![node]].concat(), Some(node)).await?;
            site.restart(node)?;
            "kill -9, then a restart (no longer a member)"
        } else {
            site.signal(node, "STOP");
            tokio::time::sleep(failure_timeout * 3).await;
            site.signal(node, "CONT");
            "pause (SIGSTOP) past the failure timeout"
        };
        lost.push(node);
        wait_lost(site, &lost, None).await?;
        println!("{at:7.1} s  node {node}: {what}; groups recovered");
        said.push(format!("node {node}: {what}"));
    }
    Ok(said)
}

/// Waits until every member of the site (all nodes but `lost`, and
/// `skipping` which is down) knows `lost` lost and has decoded every page
/// of the slots it took over.
async fn wait_lost(site: &Site, lost: &[u16], skipping: Option<u16>) -> Result<(), Failure> {
    let mut want: Vec<u16> = lost.to_vec();
    want.sort_unstable();
    let want: Vec<String> = want.iter().map(|n| n.to_string()).collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut done = true;
        for n in (0..site.shape.nodes).filter(|n| !lost.contains(n) && Some(*n) != skipping) {
            let ec = info_ec(site, n).await.unwrap_or_default();
            done &= ec.get("ec_lost_nodes").map(String::as_str) == Some(&want.join(","))
                && ec.get("ec_missing_pages").map(String::as_str) == Some("0");
        }
        if done {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(Failure::Unavailable(format!("the site did not take the loss of nodes {} within 60 s", want.join(","))));
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
