//! `causeway bench --codec ec:K+M`: the erasure code alone, no server. The
//! three things an erasure-coded site asks of it (`core::ec::code`):
//!
//! - a write: every parity member adds `coefficient * (old ^ new)` of the
//!   bytes that changed to its page (one `add_delta` per parity member);
//! - a whole stripe encoded (checks; what a rebuilt parity member would
//!   do), K data pages of 4 KB into M parity pages;
//! - recovery: a stripe's lost data pages decoded from K survivors, with
//!   one and with M data pages missing.
//!
//! Each figure is data bytes processed per second on one thread, over at
//! least `seconds` of repetitions.

use causeway_core::ec::area::PAGE;
use causeway_core::ec::code::Code;
use causeway_core::ring::Coding;
use std::hint::black_box;
use std::time::{Duration, Instant};

pub fn run(coding: Coding, seconds: f64) -> Result<(), String> {
    let (k, m) = (coding.data as usize, coding.parity as usize);
    let code = Code::new(k, m)?;
    let budget = Duration::from_secs_f64(seconds.max(0.1));
    let stripes = 256; // 256 stripes of K pages: 3 MB of data at 3+2, past L2
    let data: Vec<Vec<Vec<u8>>> = (0..stripes).map(|s| (0..k).map(|i| pattern(s * k + i, PAGE)).collect()).collect();

    println!("erasure code ec:{k}+{m} (reed-solomon-erasure, GF(2^8)), one thread, pages of {PAGE} B");
    println!("{:<44} {:>12} {:>12}", "operation", "MB/s", "us each");

    // A write's parity update, for the value sizes a store sees.
    for size in [100usize, 1024, PAGE] {
        let diff = pattern(7, size);
        let mut parity = vec![0u8; PAGE];
        let (n, took) = repeat(budget, || {
            for j in 0..m {
                code.add_delta(j, 0, &diff, &mut parity[..size]);
            }
            black_box(&parity);
        });
        report(&format!("write of {size} B: delta into {m} parity pages"), size * n, n, took);
    }

    // Whole stripes encoded.
    let mut shards: Vec<Vec<Vec<u8>>> = data.iter().map(|d| d.iter().cloned().chain((0..m).map(|_| vec![0u8; PAGE])).collect()).collect();
    let mut next = 0;
    let (n, took) = repeat(budget, || {
        code.encode(&mut shards[next % stripes]).expect("same sizes");
        next += 1;
    });
    report(&format!("encode a stripe ({k} data pages -> {m} parity)"), n * k * PAGE, n, took);

    // Lost data pages decoded from the survivors.
    for lost in [1, m.min(k)] {
        let mut next = 0;
        let (n, took) = repeat(budget, || {
            let full = &shards[next % stripes];
            next += 1;
            let mut partial: Vec<Option<Vec<u8>>> = full.iter().cloned().map(Some).collect();
            for shard in partial.iter_mut().take(lost) {
                *shard = None;
            }
            code.reconstruct_data(&mut partial).expect("K survive");
            black_box(&partial);
        });
        // What was rebuilt: `lost` pages per stripe (copying the survivors
        // in is part of the cost, as it is when a repair gathers them).
        report(&format!("decode {lost} lost data page(s) of a stripe"), n * lost * PAGE, n, took);
    }
    Ok(())
}

/// Runs `f` until `budget` has passed, in batches; how many times, how long.
fn repeat(budget: Duration, mut f: impl FnMut()) -> (usize, Duration) {
    let start = Instant::now();
    let mut n = 0;
    while start.elapsed() < budget {
        for _ in 0..64 {
            f();
        }
        n += 64;
    }
    (n, start.elapsed())
}

fn report(what: &str, bytes: usize, n: usize, took: Duration) {
    let secs = took.as_secs_f64();
    println!("{what:<44} {:>12.0} {:>12.2}", bytes as f64 / secs / 1e6, secs * 1e6 / n as f64);
}

/// Bytes that are not all alike (GF multiplication by tables does not care,
/// but a compiler might).
fn pattern(seed: usize, len: usize) -> Vec<u8> {
    let mut x = seed as u64 * 0x9E37_79B9_7F4A_7C15 + 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
