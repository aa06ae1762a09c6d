//! `causeway bench --visible-at ADDR`: remote visibility delay (the Eunomia
//! paper's Figure 6). Writes a fresh value at `--addr` (a node of one site)
//! and polls `ADDR` (a node of another site) until it reads it, `--samples`
//! times one after another; reports the delay beyond the one-way link delay
//! (`--link-ms`, what `causeway dev --sites` emulates between the two), as
//! percentiles. Polling adds up to one loopback round trip.

use crate::resp_client::RespConn;
use causeway_resp::Frame;
use hdrhistogram::Histogram;
use std::time::{Duration, Instant};

pub async fn run(from: &str, to: &str, link_ms: u64, samples: usize) -> Result<(), String> {
    let mut writer = RespConn::connect(from).await?;
    let mut reader = RespConn::connect(to).await?;
    let mut extra = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).map_err(|e| e.to_string())?;
    let run = format!("{:x}", rand::random::<u32>());
    for i in 0..samples {
        let key = format!("causeway-visibility-{run}-{}", i % 16);
        let value = format!("{run}-{i}");
        let start = Instant::now();
        writer.call(&[b"SET", key.as_bytes(), value.as_bytes()]).await?;
        loop {
            if let Frame::Bulk(v) = reader.call(&[b"GET", key.as_bytes()]).await? {
                if v == value.as_bytes() {
                    break;
                }
            }
            if start.elapsed() > Duration::from_secs(30) {
                return Err(format!("{key} not visible at {to} after 30 s"));
            }
        }
        let us = start.elapsed().as_micros() as u64;
        extra.record(us.saturating_sub(link_ms * 1000).max(1)).map_err(|e| e.to_string())?;
    }
    println!("remote visibility, {samples} writes at {from} read at {to}, beyond the {link_ms} ms link (ms):");
    for q in [50.0, 90.0, 95.0, 99.0] {
        println!("  p{q:<4} {:>8.1}", extra.value_at_quantile(q / 100.0) as f64 / 1000.0);
    }
    println!("  max   {:>8.1}", extra.max() as f64 / 1000.0);
    Ok(())
}
