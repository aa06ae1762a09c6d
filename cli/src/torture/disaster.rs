//! `causeway torture --sites 2 --dr`: after the fault campaign, the
//! disaster. Site 1 backs up site 0 (`--dr 0=1`). Clients write fresh keys
//! at site 0, whose nodes are then all killed (not restarted: the site is
//! lost) while they write; site 1 fails over (`CW.DR FAILOVER`), and every
//! key whose last write site 0 acknowledged is read through every node of
//! site 1: it must read that value or a later one of its writer, or be
//! refused (`-LOST`: site 1 knew of the write but never got its value).
//! Anything else (an older value, nil) is an acknowledged write lost.
//!
//! One node of site 1 is killed before the failover and comes back after
//! it with an empty disk: it must catch up on the notes and learn the lost
//! keys before it serves the reads (it is read through like the others).

use super::{order, Failure};
use crate::resp_client::RespConn;
use crate::site::Site;
use causeway_resp::Frame;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long the clients write before site 0 is lost, and after.
const BEFORE: Duration = Duration::from_millis(2_000);
const AFTER: Duration = Duration::from_millis(300);

/// Runs the disaster on `sites` (site 0 the primary, site 1 its backup)
/// with `clients` writers; what it came to.
pub async fn run(sites: &mut [Site], clients: usize) -> Result<String, Failure> {
    let stop = Arc::new(AtomicBool::new(false));
    let acked: Arc<Mutex<HashMap<String, String>>> = Arc::default();
    let nodes = sites[0].shape.nodes;
    let writers: Vec<_> = (0..clients)
        .map(|w| {
            let (addr, stop, acked) = (sites[0].addr(w as u16 % nodes), stop.clone(), acked.clone());
            tokio::spawn(async move {
                let Ok(mut c) = RespConn::connect(&addr).await else { return };
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let (key, value) = (format!("torture:dr:w{w}:k{}", n % 32), format!("w{w}:v{n}"));
                    let answer = tokio::time::timeout(Duration::from_secs(5), c.call(&[b"SET", key.as_bytes(), value.as_bytes()])).await;
                    match answer {
                        Ok(Ok(_)) => {
                            acked.lock().unwrap().insert(key, value);
                        }
                        // Unknown: the key's last acknowledged value stays
                        // what it was (its writer goes on with the next).
                        _ => {
                            if RespConn::connect(&addr).await.map(|fresh| c = fresh).is_err() {
                                return;
                            }
                        }
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(BEFORE).await;
    for i in 0..nodes {
        sites[0].kill(i);
    }
    tokio::time::sleep(AFTER).await;
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        let _ = w.await;
    }
    let acked = std::mem::take(&mut *acked.lock().unwrap());
    if acked.is_empty() {
        return Err(Failure::Failed("no write was acknowledged at site 0 before the disaster".into()));
    }
    // A backup node misses the failover, and comes back empty after it.
    let missed = sites[1].shape.nodes - 1;
    sites[1].kill(missed);
    let lost = failover(&sites[1]).await?;
    sites[1].wipe(missed);
    sites[1].restart(missed).map_err(Failure::Failed)?;
    let backup = &sites[1];
    let (mut complete, mut refused) = (0, 0);
    for node in 0..backup.shape.nodes {
        let mut c = connect(&backup.addr(node)).await?;
        for (key, value) in &acked {
            let want = order(value).expect("a torture value");
            match read(&mut c, key).await {
                Ok(Some(got)) if order(&got).is_some_and(|n| n >= want) => complete += 1,
                Ok(got) => {
                    return Err(Failure::Failed(format!(
                        "after the failover, GET {key} through site 1 node {node} returned {got:?}; site 0 had acknowledged {value:?}"
                    )))
                }
                Err(e) if e.starts_with("LOST") => refused += 1,
                Err(e) => return Err(Failure::Unavailable(format!("GET {key} through site 1 node {node}: {e}"))),
            }
        }
    }
    Ok(format!(
        "site 0 lost with {} keys acknowledged, site 1 failed over without its node {missed}, back empty after it ({lost} keys refused): {complete} reads complete, {refused} refused, none older",
        acked.len()
    ))
}

/// `CW.DR FAILOVER` at the backup, tried until it answers (a node may
/// still be taking the loss of the other site in).
async fn failover(backup: &Site) -> Result<i64, Failure> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = String::new();
    while Instant::now() < deadline {
        for node in 0..backup.shape.nodes {
            let Ok(mut c) = RespConn::connect(&backup.addr(node)).await else { continue };
            match c.call(&[b"CW.DR", b"FAILOVER"]).await {
                Ok(Frame::Integer(n)) => return Ok(n),
                Ok(other) => last = format!("{other:?}"),
                Err(e) => last = e,
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(Failure::Unavailable(format!("the backup did not fail over within 60 s: {last}")))
}

/// A connection to `addr`, tried again while the node starts.
async fn connect(addr: &str) -> Result<RespConn, Failure> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match RespConn::connect(addr).await {
            Ok(c) => return Ok(c),
            Err(e) if Instant::now() > deadline => return Err(Failure::Unavailable(format!("cannot connect to {addr}: {e}"))),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// A causal GET, tried again while it times out (the site healing).
async fn read(c: &mut RespConn, key: &str) -> Result<Option<String>, String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match c.call(&[b"GET", key.as_bytes()]).await {
            Ok(Frame::Bulk(v)) => return Ok(Some(String::from_utf8_lossy(&v).into_owned())),
            Ok(_) => return Ok(None),
            Err(e) if e.starts_with("LOST") || Instant::now() > deadline => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}
