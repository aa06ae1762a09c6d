//! Eunomia Figure 2 (§6-7.1) as the paper ran it: the site stabilizer and a
//! site sequencer each served over loopback TCP, fed by P partitions.
//!
//! `cargo test -p causeway-node --release --test figure2 -- --ignored --nocapture`
//!
//! The in-process version (`core::geo::stabilizer::tests::
//! stabilizer_against_sequencer`) has no network, so a sequencer request
//! there costs two tiny encodings and an increment. Here each side pays
//! what a served one pays: a socket per partition, length-prefixed bincode
//! frames (`wire::put_frame`, as peers send), and reads and writes through
//! the kernel. Both servers run on one thread (a current-thread tokio
//! runtime, the shape of the node's own I/O), read every complete frame in
//! their buffer, answer them all and then write once.
//!
//! * Sequencer (S-Seq, `geo::sequencer`): each partition keeps a window of
//!   `GeoMsg::Sequence` requests outstanding and sends a new one for each
//!   `GeoMsg::Sequenced` reply. With a window of 1, as the paper ran it
//!   ("partitions issuing operations eagerly, with zero waiting time
//!   between operations", each waiting for its number before the next);
//!   with `WINDOW`, a partition with that many client writes in flight (a
//!   sequencer far better fed than the paper's). Counted: requests
//!   numbered per second.
//! * Stabilizer (`geo::stabilizer`, leader of site 0 of three): each
//!   partition sends one `GeoMsg::Ids` per millisecond holding
//!   `offered / P / 1000` ids (a millisecond missed while the server's
//!   socket pushes back is skipped) and reads the `GeoMsg::IdsAcks`. The
//!   server ticks every millisecond and writes each `Ship` to a TCP
//!   connection per other site, whose reader discards it; sites 1 and 2
//!   acknowledge every `ACK_EVERY_MS` what was shipped to them (made up on
//!   the server: their receivers are not modelled). Counted: ids shipped to
//!   site 1 per second, that is ids ordered, made stable and shipped; each
//!   row keeps the best of the `OFFERED` rates, because past its peak the
//!   server reads faster than it ships (at most `MAX_SHIP` ids a tick, and
//!   ticks come late while reads keep it busy), the backlog grows and
//!   throughput falls.
//!
//! Clients and servers share the machine: the load generator runs on
//! `CLIENT_THREADS` threads and competes with the server for the cores.
//! The server thread's share of a core is printed beside each number (from
//! `/proc/.../schedstat`). Over loopback the kernel's receive path runs in
//! the sender's thread, so that share leaves out part of what the server's
//! traffic costs.

use bytes::BytesMut;
use causeway_core::geo::sequencer::{SeqRequest, Sequencer};
use causeway_core::geo::stabilizer::{IdBatch, IdVector, Position, SiteAck, Stabilizer, StabilizerMsg, StabilizerOut, UpdateId};
use causeway_core::geo::GeoMsg;
use causeway_core::hlc::Timestamp;
use causeway_core::message::Message;
use causeway_core::ring::{NodeId, PartitionId};
use causeway_core::wire::{put_frame, take_frame};
use std::cell::RefCell;
use std::future::Future;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Threads of the load generator: as many as the machine has cores, so it
/// can use whatever the server leaves.
const CLIENT_THREADS: usize = 2;
/// Sequencer requests each partition keeps outstanding.
const WINDOW: usize = 16;
/// Ids the site's partitions write per second, together: each row keeps
/// the best of these (too little leaves the server idle; past its peak the
/// backlog grows and throughput falls). At most `MAX_SHIP` ids a tick can
/// be shipped, about 4.1 M a second.
const OFFERED: [u64; 6] = [2_000_000, 3_000_000, 4_000_000, 5_000_000, 6_000_000, 7_000_000];
/// Sites 1 and 2 acknowledge every this many milliseconds.
const ACK_EVERY_MS: u64 = 10;
const WARMUP: Duration = Duration::from_millis(500);
const MEASURE: Duration = Duration::from_secs(2);
const READ_AHEAD: usize = 64 << 10;

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("after 1970").as_millis() as u64
}

/// Nanoseconds the thread `task` ("<pid>/task/<tid>") has run.
fn cpu_ns(task: &str) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{task}/schedstat")).unwrap_or_default();
    stat.split_whitespace().next().and_then(|ns| ns.parse().ok()).unwrap_or(0)
}

fn on_one_thread(f: impl Future<Output = ()>) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    tokio::task::LocalSet::new().block_on(&rt, f);
}

/// What one run measured.
struct Measured {
    /// Counted per second.
    per_sec: f64,
    /// The server thread's share of a core.
    server_cpu: f64,
}

/// Runs `server` on a thread of its own and `clients` on `CLIENT_THREADS`
/// others, and
/// measures the server's count over `MEASURE` after `WARMUP`.
fn measure<S, SF, C, CF>(server: S, clients: C) -> Measured
where
    S: FnOnce(TcpListener, Arc<AtomicU64>) -> SF + Send + 'static,
    SF: Future<Output = ()> + 'static,
    C: FnOnce(SocketAddr) -> CF + Send + 'static,
    CF: Future<Output = ()> + Send + 'static,
{
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    listener.set_nonblocking(true).expect("nonblocking");
    let addr = listener.local_addr().expect("an address");
    let count = Arc::new(AtomicU64::new(0));
    let (task_tx, task_rx) = std::sync::mpsc::channel();
    let (stop_server, server_stopped) = tokio::sync::oneshot::channel::<()>();
    let (stop_clients, clients_stopped) = tokio::sync::oneshot::channel::<()>();
    let counted = count.clone();
    let server_thread = std::thread::spawn(move || {
        let task = std::fs::read_link("/proc/thread-self").map(|p| p.display().to_string()).unwrap_or_default();
        task_tx.send(task).expect("main waits");
        on_one_thread(async move {
            let listener = TcpListener::from_std(listener).expect("a tokio listener");
            tokio::select! {
                _ = server(listener, counted) => {}
                _ = server_stopped => {}
            }
        });
    });
    let client_thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(CLIENT_THREADS).enable_all().build().expect("a runtime");
        rt.block_on(async move {
            tokio::select! {
                _ = clients(addr) => {}
                _ = clients_stopped => {}
            }
        })
    });
    let task = task_rx.recv().expect("the server thread starts");
    std::thread::sleep(WARMUP);
    let (n0, cpu0, start) = (count.load(Relaxed), cpu_ns(&task), Instant::now());
    std::thread::sleep(MEASURE);
    let (n1, cpu1, secs) = (count.load(Relaxed), cpu_ns(&task), start.elapsed().as_secs_f64());
    let _ = stop_clients.send(());
    let _ = stop_server.send(());
    client_thread.join().expect("clients end");
    server_thread.join().expect("the server ends");
    Measured { per_sec: (n1 - n0) as f64 / secs, server_cpu: (cpu1 - cpu0) as f64 / 1e9 / secs }
}

/// Reads more of `conn` into `buf`; false at the end of the stream or on
/// an error (the other side stopped).
async fn read_more(conn: &mut (impl AsyncReadExt + Unpin), buf: &mut BytesMut) -> bool {
    buf.reserve(READ_AHEAD);
    matches!(conn.read_buf(buf).await, Ok(n) if n > 0)
}

fn sequencer(partitions: u32, window: usize) -> Measured {
    measure(
        |listener, served| async move {
            let sequencer = Rc::new(RefCell::new(Sequencer::new()));
            while let Ok((conn, _)) = listener.accept().await {
                conn.set_nodelay(true).expect("nodelay");
                tokio::task::spawn_local(serve_sequence(conn, sequencer.clone(), served.clone()));
            }
        },
        move |addr| async move {
            for partition in 0..partitions {
                tokio::spawn(ask_for_numbers(addr, partition, window));
            }
            std::future::pending::<()>().await
        },
    )
}

/// One partition's connection to the sequencer: every request in the
/// buffer answered, then one write.
async fn serve_sequence(mut conn: TcpStream, sequencer: Rc<RefCell<Sequencer>>, served: Arc<AtomicU64>) {
    let (mut inbuf, mut outbuf) = (BytesMut::new(), BytesMut::new());
    while read_more(&mut conn, &mut inbuf).await {
        let mut n = 0;
        {
            let mut sequencer = sequencer.borrow_mut();
            while let Some(msg) = take_frame::<Message>(&mut inbuf).expect("well-formed frames") {
                let Some(GeoMsg::Sequence { req, .. }) = msg.into_geo() else { panic!("a sequencer is only asked for numbers") };
                put_frame(&Message::geo(GeoMsg::Sequenced(sequencer.step(req))), &mut outbuf);
                n += 1;
            }
        }
        served.fetch_add(n, Relaxed);
        if conn.write_all_buf(&mut outbuf).await.is_err() {
            return;
        }
    }
}

fn ask(partition: PartitionId, tag: &mut u64, n: usize, out: &mut BytesMut) {
    for _ in 0..n {
        let req = SeqRequest { partition, tag: *tag };
        put_frame(&Message::geo(GeoMsg::Sequence { from: partition as NodeId, req }), out);
        *tag += 1;
    }
}

/// A partition with `window` writes waiting for numbers: each reply lets
/// the next write ask.
async fn ask_for_numbers(addr: SocketAddr, partition: PartitionId, window: usize) {
    let Ok(mut conn) = TcpStream::connect(addr).await else { return };
    conn.set_nodelay(true).expect("nodelay");
    let (mut inbuf, mut outbuf, mut tag) = (BytesMut::new(), BytesMut::new(), 0);
    ask(partition, &mut tag, window, &mut outbuf);
    while conn.write_all_buf(&mut outbuf).await.is_ok() && read_more(&mut conn, &mut inbuf).await {
        let mut answered = 0;
        while let Ok(Some(msg)) = take_frame::<Message>(&mut inbuf) {
            let Some(GeoMsg::Sequenced(reply)) = msg.into_geo() else { panic!("a sequencer answers with numbers") };
            std::hint::black_box(reply);
            answered += 1;
        }
        ask(partition, &mut tag, answered, &mut outbuf);
    }
}

fn stabilizer(partitions: u32, offered: u64) -> Measured {
    let sinks = [(); 2].map(|_| {
        let sink = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
        sink.set_nonblocking(true).expect("nonblocking");
        sink
    });
    let sink_addrs = sinks.each_ref().map(|s| s.local_addr().expect("an address"));
    measure(
        move |listener, shipped| async move {
            let mut stabilizer = Stabilizer::new(0, 1, partitions, &[0, 1, 2]);
            stabilizer.step(StabilizerMsg::Leader { leader: 1, term: 1 }, now_ms(), &mut Vec::new());
            let stabilizer = Rc::new(RefCell::new(stabilizer));
            let mut to_sites = Vec::new();
            for addr in sink_addrs {
                let conn = TcpStream::connect(addr).await.expect("the sinks listen");
                conn.set_nodelay(true).expect("nodelay");
                to_sites.push(conn);
            }
            tokio::task::spawn_local(ship_every_ms(stabilizer.clone(), to_sites, shipped));
            while let Ok((conn, _)) = listener.accept().await {
                conn.set_nodelay(true).expect("nodelay");
                tokio::task::spawn_local(serve_ids(conn, stabilizer.clone()));
            }
        },
        move |addr| async move {
            for sink in sinks {
                tokio::spawn(discard(sink));
            }
            let per_ms = (offered / 1_000 / partitions as u64) as usize;
            for partition in 0..partitions {
                tokio::spawn(report_ids(addr, partition, per_ms));
            }
            std::future::pending::<()>().await
        },
    )
}

/// One partition's connection to the stabilizer: every batch in the buffer
/// taken and acknowledged, then one write.
async fn serve_ids(mut conn: TcpStream, stabilizer: Rc<RefCell<Stabilizer>>) {
    let (mut inbuf, mut outbuf, mut out) = (BytesMut::new(), BytesMut::new(), Vec::new());
    while read_more(&mut conn, &mut inbuf).await {
        {
            let now = now_ms();
            let mut stabilizer = stabilizer.borrow_mut();
            while let Some(msg) = take_frame::<Message>(&mut inbuf).expect("well-formed frames") {
                let Some(GeoMsg::Ids(batches)) = msg.into_geo() else { panic!("partitions send ids") };
                for batch in batches {
                    stabilizer.step(StabilizerMsg::Ids(batch), now, &mut out);
                }
                let acks = out
                    .drain(..)
                    .map(|o| match o {
                        StabilizerOut::IdsAck(ack) => ack,
                        StabilizerOut::Ship(_) => unreachable!("ships only on tick"),
                    })
                    .collect();
                put_frame(&Message::geo(GeoMsg::IdsAcks(acks)), &mut outbuf);
            }
        }
        if conn.write_all_buf(&mut outbuf).await.is_err() {
            return;
        }
    }
}

/// Eunomia's `process_stable` every millisecond, each site's shipments in
/// one write to it; counts the ids shipped to site 1.
async fn ship_every_ms(stabilizer: Rc<RefCell<Stabilizer>>, mut to_sites: Vec<TcpStream>, shipped: Arc<AtomicU64>) {
    // Missed ticks are caught up at once (`MissedTickBehavior::Burst`).
    let mut every_ms = tokio::time::interval(Duration::from_millis(1));
    let (mut out, mut bufs, mut through) = (Vec::new(), [BytesMut::new(), BytesMut::new()], [Position::START; 2]);
    for ticks in 1u64.. {
        every_ms.tick().await;
        let now = now_ms();
        let mut ids = 0;
        {
            let mut stabilizer = stabilizer.borrow_mut();
            if ticks % ACK_EVERY_MS == 0 {
                for (from, received) in [1, 2].into_iter().zip(through) {
                    let ack = SiteAck { from, origin: 0, received, applied: received, visible: received, resend: false };
                    stabilizer.step(StabilizerMsg::SiteAck(ack), now, &mut out);
                }
            }
            stabilizer.tick(now, &mut out);
            for o in out.drain(..) {
                let StabilizerOut::Ship(ship) = o else { unreachable!("acks only on ids") };
                let site = ship.to as usize - 1;
                if site == 0 {
                    ids += ship.ids.len() as u64;
                }
                through[site] = through[site].max(ship.through);
                put_frame(&Message::geo(GeoMsg::Ship(ship)), &mut bufs[site]);
            }
        }
        shipped.fetch_add(ids, Relaxed);
        for (conn, buf) in to_sites.iter_mut().zip(&mut bufs) {
            if conn.write_all_buf(buf).await.is_err() {
                return;
            }
        }
    }
}

/// Another site's end of the stream: reads and drops it.
async fn discard(sink: std::net::TcpListener) {
    let sink = TcpListener::from_std(sink).expect("a tokio listener");
    let Ok((mut conn, _)) = sink.accept().await else { return };
    let mut buf = vec![0; READ_AHEAD];
    while matches!(conn.read(&mut buf).await, Ok(n) if n > 0) {}
}

/// A partition's tail: every millisecond a batch of `per_ms` new ids with
/// its promise (no id of it at or below the last one will follow), back to
/// back when behind; the acknowledgements are read and dropped.
async fn report_ids(addr: SocketAddr, partition: PartitionId, per_ms: usize) {
    let Ok(conn) = TcpStream::connect(addr).await else { return };
    conn.set_nodelay(true).expect("nodelay");
    let (mut rx, mut tx) = conn.into_split();
    tokio::spawn(async move {
        let mut inbuf = BytesMut::new();
        while read_more(&mut rx, &mut inbuf).await {
            while let Ok(Some(msg)) = take_frame::<Message>(&mut inbuf) {
                std::hint::black_box(msg);
            }
        }
    });
    let mut every_ms = tokio::time::interval(Duration::from_millis(1));
    // Behind (the server pushes back): the next batch when it can go, the
    // missed ones never.
    every_ms.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let (mut last, mut outbuf) = (Timestamp::ZERO, BytesMut::new());
    loop {
        every_ms.tick().await;
        let ms = now_ms();
        // Its dependencies on the other two sites, a wide-area delay behind.
        let remote = [Timestamp::new(ms - 40, 0), Timestamp::new(ms - 80, 0)];
        let prev = last;
        let items = (0..per_ms)
            .map(|_| {
                last = if last.physical_ms() < ms { Timestamp::new(ms, 0) } else { Timestamp::new(last.physical_ms(), last.logical() + 1) };
                let vv: IdVector = [last, remote[0], remote[1]].into_iter().collect();
                UpdateId { partition, ts: last, local_dep: last.just_before(), vv }
            })
            .collect();
        put_frame(&Message::geo(GeoMsg::Ids(vec![IdBatch { partition, prev, items, up_to: last }])), &mut outbuf);
        if tx.write_all_buf(&mut outbuf).await.is_err() {
            return;
        }
    }
}

/// Eunomia Figure 2: the most ids per second the stabilizer orders and
/// ships, against the most updates per second a sequencer numbers, both
/// served over TCP, for 1 to 64 partitions.
#[test]
#[ignore]
fn stabilizer_against_sequencer_over_tcp() {
    // Warm the allocator and the kernel's socket paths before the first row.
    stabilizer(8, OFFERED[0]);
    sequencer(8, WINDOW);
    println!(
        "| partitions | stabilizer ids/s (offered) | server CPU | sequencer, 1 in flight per partition | server CPU | sequencer, {WINDOW} in flight | server CPU | stabilizer / sequencer (1, {WINDOW}) |"
    );
    println!("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for partitions in [1, 2, 4, 8, 16, 32, 64] {
        let (offered, stab) = OFFERED
            .into_iter()
            .map(|offered| (offered, stabilizer(partitions, offered)))
            .max_by(|a, b| a.1.per_sec.total_cmp(&b.1.per_sec))
            .expect("rates to offer");
        let (one, seq) = (sequencer(partitions, 1), sequencer(partitions, WINDOW));
        println!(
            "| {partitions} | {:.2} M ({:.1} M) | {:.2} | {:.0} k | {:.2} | {:.0} k | {:.2} | {:.1}, {:.1} |",
            stab.per_sec / 1e6,
            offered as f64 / 1e6,
            stab.server_cpu,
            one.per_sec / 1e3,
            one.server_cpu,
            seq.per_sec / 1e3,
            seq.server_cpu,
            stab.per_sec / one.per_sec,
            stab.per_sec / seq.per_sec
        );
    }
}
