//! Identifier-first disaster recovery measured as its paper does (§4),
//! over the Redis protocol, so the same run measures a pair with `--dr`
//! and one without:
//!
//! * `causeway bench --protection`: the time until a write is protected,
//!   per value size (`--sizes`), `--samples` writes each, one after
//!   another from one client. With `--dr` the SET's reply is it (the
//!   backup has noted the key); `--wait-site S` adds `CW.WAIT SITE S`
//!   after each SET, the time until site S has applied the value
//!   (synchronous replication, the paper's baseline); without either it
//!   is the SET alone, which protects nothing (asynchronous).
//! * `causeway bench --disaster BACKUP`: `--clients` writers at `--addr`
//!   (each owning its keys) for `--seconds`; then the link between the two
//!   sites is cut on every node of both (`CW.WAN CUT`), the backup fails
//!   over if it is one (`CW.DR FAILOVER`), and every acknowledged key is
//!   read at BACKUP: complete (its last acknowledged value or later),
//!   refused (`-LOST`: the backup knew the write and not its value) or
//!   lost (older, or missing, without an error). The paper's Figure 4.

use crate::resp_client::RespConn;
use causeway_resp::Frame;
use hdrhistogram::Histogram;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `--protection`: SET (and `CW.WAIT SITE wait_site`) latency per size.
pub async fn protection(addr: &str, sizes: &[usize], samples: usize, wait_site: Option<u16>) -> Result<(), String> {
    let mut c = RespConn::connect(addr).await?;
    let what = match wait_site {
        Some(s) => format!("SET + CW.WAIT SITE {s}"),
        None => "SET".to_string(),
    };
    println!("protection time at {addr}, {what}, {samples} writes per size, one after another (ms):");
    println!("{:>10} {:>9} {:>9} {:>9}", "value", "p50", "p99", "max");
    for &size in sizes {
        let mut h = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).map_err(|e| e.to_string())?;
        let value = vec![b'v'; size];
        for i in 0..samples {
            let key = format!("causeway-protection-{size}-{}", i % 16);
            let start = Instant::now();
            c.call(&[b"SET", key.as_bytes(), &value]).await?;
            if let Some(site) = wait_site {
                c.call(&[b"CW.WAIT", b"SITE", site.to_string().as_bytes(), b"30000"]).await?;
            }
            h.record((start.elapsed().as_micros() as u64).max(1)).map_err(|e| e.to_string())?;
        }
        let ms = |us: u64| us as f64 / 1000.0;
        println!("{:>10} {:>9.2} {:>9.2} {:>9.2}", human(size), ms(h.value_at_quantile(0.5)), ms(h.value_at_quantile(0.99)), ms(h.max()));
    }
    Ok(())
}

fn human(size: usize) -> String {
    match size {
        s if s >= 1 << 20 && s % (1 << 20) == 0 => format!("{} MB", s >> 20),
        s if s >= 1 << 10 && s % (1 << 10) == 0 => format!("{} KB", s >> 10),
        s => format!("{s} B"),
    }
}

/// What one writer did to its own keys: every value it sent, in order,
/// and the index of the last one acknowledged.
#[derive(Default)]
struct Written {
    sent: BTreeMap<String, Vec<Vec<u8>>>,
    acked: BTreeMap<String, usize>,
}

/// `--disaster BACKUP`: writers, the link cut, a failover, the tally.
pub async fn disaster(addr: &str, backup: &str, clients: usize, seconds: u64, value_size: usize) -> Result<(), String> {
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for w in 0..clients {
        let mut c = RespConn::connect(addr).await?;
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            let mut done = Written::default();
            let mut i = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let key = format!("causeway-disaster-w{w}k{}", i % 100);
                let mut value = format!("w{w}i{i}:").into_bytes();
                value.resize(value_size.max(value.len()), b'v');
                let sent = done.sent.entry(key.clone()).or_default();
                sent.push(value.clone());
                let at = sent.len() - 1;
                if let Ok(Frame::Simple(_)) = c.call(&[b"SET", key.as_bytes(), &value]).await {
                    done.acked.insert(key, at);
                }
                i += 1;
            }
            done
        }));
    }
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    // The disaster: nothing more crosses between the two sites, whatever
    // is on its way; the writers still running are not acknowledged.
    let (primary_nodes, primary_site) = site_of(addr).await?;
    let (backup_nodes, backup_site) = site_of(backup).await?;
    for (nodes, other) in [(&primary_nodes, backup_site), (&backup_nodes, primary_site)] {
        for n in nodes {
            RespConn::connect(n).await?.call(&[b"CW.WAN", b"CUT", other.to_string().as_bytes()]).await?;
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    let mut written = Vec::new();
    for t in tasks {
        written.push(t.await.map_err(|e| e.to_string())?);
    }
    let mut b = RespConn::connect(backup).await?;
    let failover = match b.call(&[b"CW.DR", b"FAILOVER"]).await {
        Ok(Frame::Integer(n)) => format!("failed over, {n} keys refused until written"),
        Ok(f) => format!("no failover ({f:?})"),
        Err(e) => format!("no failover ({e})"),
    };
    let (mut complete, mut refused, mut lost, mut acked) = (0, 0, 0, 0);
    for w in &written {
        for (key, &last) in &w.acked {
            acked += 1;
            match b.call(&[b"GET", key.as_bytes()]).await {
                Ok(Frame::Bulk(v)) => match w.sent[key].iter().position(|s| *s == v.as_ref()) {
                    Some(i) if i >= last => complete += 1,
                    _ => lost += 1,
                },
                Ok(_) => lost += 1,
                Err(e) if e.starts_with("LOST") => refused += 1,
                Err(e) => return Err(format!("GET {key} at {backup}: {e}")),
            }
        }
    }
    println!("{clients} writers at {addr} for {seconds} s, values of {}, then the link cut; {failover}.", human(value_size));
    println!("{acked} keys acknowledged, read at {backup}: complete {complete}, refused {refused}, lost {lost}");
    Ok(())
}

/// Every node's address of the site `addr` is in, and its site id.
async fn site_of(addr: &str) -> Result<(Vec<String>, u16), String> {
    let mut c = RespConn::connect(addr).await?;
    let status = match c.call(&[b"CW.CLUSTER", b"STATUS"]).await? {
        Frame::Bulk(b) => String::from_utf8_lossy(&b).into_owned(),
        f => return Err(format!("CW.CLUSTER STATUS at {addr}: {f:?}")),
    };
    let nodes = status.lines().filter_map(|l| l.split("addr=").nth(1)).map(|r| r.split(',').next().unwrap_or("").to_string()).collect();
    let sites = match c.call(&[b"CW.SITES"]).await? {
        Frame::Bulk(b) => String::from_utf8_lossy(&b).into_owned(),
        f => return Err(format!("CW.SITES at {addr}: {f:?}")),
    };
    let site = sites.lines().find_map(|l| l.strip_prefix("site:")).and_then(|s| s.trim().parse().ok()).ok_or("no site in CW.SITES")?;
    Ok((nodes, site))
}
