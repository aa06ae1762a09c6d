//! Shared harness for the integration tests: a `Cluster` of real
//! `causeway node` processes on free loopback ports, killed on drop, plus a
//! raw RESP connection for byte-level tests.
#![allow(dead_code)]

use bytes::BytesMut;
use causeway_resp::{encode_request, parse_frame, Frame, Limits};
use std::collections::HashMap;
use std::collections::HashSet;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The secret test sites share (`--cluster-secret`).
pub const CLUSTER_SECRET: &str = "integration-test-secret";
/// How long a node may take to accept connections after it is spawned.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a test waits for one reply before failing (instead of hanging).
pub const IO_TIMEOUT: Duration = Duration::from_secs(20);

/// Ports handed out in this test process, so parallel tests never share one.
fn used_ports() -> &'static Mutex<HashSet<u16>> {
    static USED: OnceLock<Mutex<HashSet<u16>>> = OnceLock::new();
    USED.get_or_init(|| Mutex::new(HashSet::new()))
}

/// `n` distinct ports that were free a moment ago (bound to 127.0.0.1:0,
/// then released), never handed out before in this process.
pub fn free_ports(n: usize) -> Vec<u16> {
    let mut used = used_ports().lock().unwrap();
    let mut held = Vec::new();
    let mut ports = Vec::new();
    while ports.len() < n {
        let l = TcpListener::bind("127.0.0.1:0").expect("can bind an ephemeral port");
        let port = l.local_addr().unwrap().port();
        if used.insert(port) {
            ports.push(port);
        }
        held.push(l);
    }
    ports
}

/// `n` consecutive free ports (for `causeway dev`, which uses port..port+n).
pub fn free_consecutive_ports(n: u16) -> u16 {
    for _ in 0..200 {
        let base = free_ports(1)[0];
        if base.checked_add(n).is_none() {
            continue;
        }
        let mut used = used_ports().lock().unwrap();
        let candidates: Vec<u16> = (1..n).map(|i| base + i).collect();
        if candidates.iter().any(|p| used.contains(p)) {
            continue;
        }
        let held: Vec<_> = candidates.iter().filter_map(|p| TcpListener::bind(("127.0.0.1", *p)).ok()).collect();
        if held.len() == candidates.len() {
            used.extend(candidates);
            return base;
        }
    }
    panic!("could not find {n} consecutive free ports");
}

fn log_path(tag: &str) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    std::env::temp_dir().join(format!("causeway-it-{}-{n}-{tag}.log", std::process::id()))
}

/// Shape and flags of a test cluster.
#[derive(Clone, Debug)]
pub struct Opts {
    pub nodes: usize,
    pub replicas: usize,
    pub k: usize,
    /// Extra flags for every node, e.g. `["--requirepass", "secret"]`.
    pub extra: Vec<String>,
    /// Give each node a data directory under this one (removed on drop).
    pub data_dir: Option<PathBuf>,
    /// Listen on these ports (else free ones are picked).
    pub ports: Option<Vec<u16>>,
    /// Give each node a disk tier under this directory (removed on drop).
    pub disk_tier: Option<PathBuf>,
}

impl Opts {
    pub fn new(nodes: usize, replicas: usize, k: usize) -> Opts {
        Opts { nodes, replicas, k, extra: Vec::new(), data_dir: None, ports: None, disk_tier: None }
    }

    /// Each node keeps a write-ahead log in its own fresh directory.
    pub fn durable(mut self) -> Opts {
        self.data_dir = Some(log_path("data"));
        self
    }

    /// Each node keeps values past its budget in a disk tier of its own,
    /// with this cache policy.
    pub fn disk_tier(mut self, policy: &str) -> Opts {
        self.disk_tier = Some(log_path("tier"));
        self.flag("--cache-policy", policy)
    }

    pub fn flag(mut self, name: &str, value: impl ToString) -> Opts {
        self.extra.push(name.to_string());
        self.extra.push(value.to_string());
        self
    }
}

/// One `causeway node` child process.
pub struct NodeProc {
    pub id: usize,
    pub port: u16,
    child: Option<Child>,
    log: PathBuf,
    /// A config file written for this node, removed with it.
    config: Option<PathBuf>,
}

impl NodeProc {
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for NodeProc {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_file(&self.log);
        if let Some(c) = &self.config {
            let _ = std::fs::remove_file(c);
        }
    }
}

/// A site of `causeway node` processes on loopback, killed on drop.
pub struct Cluster {
    pub nodes: Vec<NodeProc>,
    pub opts: Opts,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.nodes.clear();
        for dir in [&self.opts.data_dir, &self.opts.disk_tier].into_iter().flatten() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

impl Cluster {
    /// `n` nodes, chains of `replicas`, writes acknowledged at `k`.
    pub fn start(n: usize, replicas: usize, k: usize) -> Cluster {
        Cluster::start_with(Opts::new(n, replicas, k))
    }

    /// The usual test site: 3 nodes, R=3, k=2.
    pub fn three() -> Cluster {
        Cluster::start(3, 3, 2)
    }

    pub fn start_with(opts: Opts) -> Cluster {
        let mut last_error = String::new();
        // A port found free may be taken by someone else before the node
        // binds it: then start over with fresh ports.
        for _attempt in 0..5 {
            match Cluster::try_start(&opts) {
                Ok(c) => return c,
                Err((e, retry)) if retry => last_error = e,
                Err((e, _)) => panic!("{e}"),
            }
        }
        panic!("could not start a cluster: {last_error}");
    }

    /// Starts node `i` of a site whose nodes listen on `ports`.
    fn spawn_node(opts: &Opts, i: usize, ports: &[u16]) -> NodeProc {
        let list: Vec<String> = ports.iter().enumerate().map(|(i, p)| format!("{i}=127.0.0.1:{p}")).collect();
        let port = ports[i];
        let log = log_path(&format!("node{i}"));
        let stderr = std::fs::File::create(&log).expect("can create a log file");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_causeway"));
        cmd.args(["node", "--id", &i.to_string(), "--listen", &format!("127.0.0.1:{port}"), "--nodes", &list.join(",")])
            .args(["--replicas", &opts.replicas.to_string(), "--k", &opts.k.to_string()])
            .args(["--cluster-secret", CLUSTER_SECRET])
            .args(&opts.extra);
        if let Some(dir) = &opts.data_dir {
            cmd.arg("--data-dir").arg(dir.join(format!("node{i}")));
        }
        if let Some(dir) = &opts.disk_tier {
            cmd.arg("--disk-tier").arg(dir.join(format!("node{i}")));
        }
        let child = cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(stderr).spawn().expect("can spawn causeway node");
        NodeProc { id: i, port, child: Some(child), log, config: None }
    }

    /// Starts one more node, `--join`ing the running site (its id is the
    /// next one); `CW.CLUSTER ADD` then gives it partitions.
    pub fn start_joiner(&mut self) -> usize {
        let mut ports: Vec<u16> = self.nodes.iter().map(|n| n.port).collect();
        ports.push(free_ports(1)[0]);
        let i = self.nodes.len();
        let mut opts = self.opts.clone();
        opts.extra.push("--join".into());
        self.nodes.push(Cluster::spawn_node(&opts, i, &ports));
        let addr: SocketAddr = self.nodes[i].addr().parse().unwrap();
        let deadline = Instant::now() + START_TIMEOUT;
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            assert!(Instant::now() < deadline, "node {i} did not start; stderr:\n{}", self.nodes[i].stderr());
            std::thread::sleep(Duration::from_millis(10));
        }
        i
    }

    /// Starts node `i` again (after `kill`), same port, flags and data
    /// directory, and waits until it accepts connections.
    pub fn restart(&mut self, i: usize) {
        let ports: Vec<u16> = self.nodes.iter().map(|n| n.port).collect();
        self.nodes[i] = Cluster::spawn_node(&self.opts, i, &ports);
        let addr: SocketAddr = self.nodes[i].addr().parse().unwrap();
        let deadline = Instant::now() + START_TIMEOUT;
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            assert!(Instant::now() < deadline, "node {i} did not come back; stderr:\n{}", self.nodes[i].stderr());
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn try_start(opts: &Opts) -> Result<Cluster, (String, bool)> {
        let ports = opts.ports.clone().unwrap_or_else(|| free_ports(opts.nodes));
        let nodes = (0..ports.len()).map(|i| Cluster::spawn_node(opts, i, &ports)).collect();
        let mut cluster = Cluster { nodes, opts: opts.clone() };
        let deadline = Instant::now() + START_TIMEOUT;
        for node in &mut cluster.nodes {
            let addr: SocketAddr = node.addr().parse().unwrap();
            while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
                if let Some(status) = node.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                    let log = node.stderr();
                    let retry = log.contains("cannot listen");
                    return Err((format!("node {} exited ({status}) before serving; stderr:\n{log}", node.id), retry));
                }
                if Instant::now() > deadline {
                    return Err((format!("node {} did not accept on {} in time; stderr:\n{}", node.id, node.addr(), node.stderr()), false));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        // Something else may have answered on a port a node failed to bind.
        for node in &mut cluster.nodes {
            if let Some(status) = node.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                let log = node.stderr();
                let retry = log.contains("cannot listen");
                return Err((format!("node {} exited ({status}) after start; stderr:\n{log}", node.id), retry));
            }
        }
        if !opts.extra.iter().any(|f| f == "--join") {
            // As `wait_serving`, but a node that exits meanwhile (another
            // process answered on the port it could not bind) starts the
            // site over.
            for i in 0..cluster.len() {
                while !cluster.is_serving(i) {
                    if let Some(status) = cluster.nodes[i].child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                        let log = cluster.nodes[i].stderr();
                        let retry = log.contains("cannot listen");
                        return Err((format!("node {i} exited ({status}) before it was admitted; stderr:\n{log}"), retry));
                    }
                    if Instant::now() > deadline {
                        return Err((format!("node {i} was not admitted in time\n{}", cluster.logs()), false));
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
        Ok(cluster)
    }

    /// Whether node `i` says it serves (the coordinator admitted it).
    pub fn is_serving(&self, i: usize) -> bool {
        let Ok(mut con) = self.client(i).get_connection_with_timeout(Duration::from_secs(1)) else { return false };
        if let Some(pass) = self.opts.extra.iter().skip_while(|f| *f != "--requirepass").nth(1) {
            let _: Result<(), _> = redis::cmd("AUTH").arg(pass).query(&mut con);
        }
        let status: Result<String, _> = redis::cmd("CW.STATUS").query(&mut con);
        status.is_ok_and(|s| s.contains("serving:yes"))
    }

    /// Waits until each of `nodes` serves: a started or restarted node
    /// answers only once the coordinator has admitted it.
    pub fn wait_serving(&self, nodes: &[usize]) {
        let deadline = Instant::now() + START_TIMEOUT;
        for &i in nodes {
            while !self.is_serving(i) {
                assert!(Instant::now() < deadline, "node {i} was not admitted in time\n{}", self.logs());
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    pub fn addr(&self, i: usize) -> String {
        self.nodes[i].addr()
    }

    pub fn port(&self, i: usize) -> u16 {
        self.nodes[i].port
    }

    pub fn url(&self, i: usize) -> String {
        format!("redis://127.0.0.1:{}/", self.port(i))
    }

    /// Every node's stderr, for failure messages.
    pub fn logs(&self) -> String {
        self.nodes.iter().map(|n| format!("--- node {} stderr ---\n{}", n.id, n.stderr())).collect()
    }

    /// A redis client for node `i`.
    pub fn client(&self, i: usize) -> redis::Client {
        redis::Client::open(self.url(i)).unwrap()
    }

    /// A blocking redis connection to node `i`, with read/write timeouts.
    pub fn conn(&self, i: usize) -> redis::Connection {
        let c = self.client(i).get_connection_with_timeout(IO_TIMEOUT).unwrap_or_else(|e| panic!("connect to node {i}: {e}"));
        c.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        c.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
        c
    }

    /// An async multiplexed connection to node `i`.
    pub async fn aconn(&self, i: usize) -> redis::aio::MultiplexedConnection {
        self.client(i).get_multiplexed_async_connection().await.unwrap_or_else(|e| panic!("connect to node {i}: {e}"))
    }

    /// A raw TCP connection to node `i`.
    pub fn raw(&self, i: usize) -> Raw {
        Raw::connect(&self.addr(i))
    }

    /// Node `i`'s process id.
    pub fn pid(&self, i: usize) -> u32 {
        self.nodes[i].child.as_ref().expect("node is running").id()
    }

    /// Sends `signal` (e.g. "STOP", "CONT") to node `i`'s process.
    pub fn signal(&self, i: usize, signal: &str) {
        let pid = self.nodes[i].child.as_ref().expect("node is running").id();
        let ok = std::process::Command::new("kill").arg(format!("-{signal}")).arg(pid.to_string()).status().unwrap().success();
        assert!(ok, "kill -{signal} {pid}");
    }

    /// SIGKILL node `i` and reap it.
    pub fn kill(&mut self, i: usize) {
        self.nodes[i].kill();
    }

    /// The partition map as `CW.KEYRANGE` reports it: for each partition,
    /// the chain's node ids, head first.
    pub fn chains(&self, via: usize) -> Vec<Vec<usize>> {
        let mut c = self.conn(via);
        let v: redis::Value = redis::cmd("CW.KEYRANGE").query(&mut c).unwrap();
        let redis::Value::Array(parts) = v else { panic!("CW.KEYRANGE answered {v:?}") };
        parts
            .into_iter()
            .map(|p| {
                let redis::Value::Array(entry) = p else { panic!("bad entry {p:?}") };
                let redis::Value::Array(members) = &entry[1] else { panic!("bad members {entry:?}") };
                members
                    .iter()
                    .map(|m| match m {
                        redis::Value::Array(f) => match f[0] {
                            redis::Value::Int(id) => id as usize,
                            ref other => panic!("bad node id {other:?}"),
                        },
                        other => panic!("bad member {other:?}"),
                    })
                    .collect()
            })
            .collect()
    }
}

/// Starts one `causeway node --config <file>` whose TOML text is made by
/// `config(port)`, and waits until it accepts connections.
pub fn spawn_with_config(config: impl Fn(u16) -> String) -> NodeProc {
    let port = free_ports(1)[0];
    let path = log_path("config.toml");
    std::fs::write(&path, config(port)).unwrap();
    let log = log_path("config-node");
    let child = Command::new(env!("CARGO_BIN_EXE_causeway"))
        .args(["node", "--config", path.to_str().unwrap()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("can spawn causeway node");
    let mut node = NodeProc { id: 0, port, child: Some(child), log, config: Some(path) };
    let addr: SocketAddr = node.addr().parse().unwrap();
    let deadline = Instant::now() + START_TIMEOUT;
    while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
        if let Some(status) = node.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
            panic!("node exited ({status}); stderr:\n{}", node.stderr());
        }
        assert!(Instant::now() < deadline, "node did not start; stderr:\n{}", node.stderr());
        std::thread::sleep(Duration::from_millis(10));
    }
    node
}

/// Runs `causeway <args>` to completion (it must exit by itself), with a
/// deadline; returns (success, stdout, stderr).
pub fn run_causeway(args: &[&str]) -> (bool, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_causeway"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + START_TIMEOUT;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("causeway {args:?} did not exit");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// The text of a Redis error reply as the server sent it ("ERR syntax error").
pub fn err_line(e: &redis::RedisError) -> String {
    match (e.code(), e.detail()) {
        (Some(code), Some(detail)) => format!("{code} {detail}"),
        (Some(code), None) => code.to_string(),
        _ => e.to_string(),
    }
}

/// Runs a command that must fail and returns the error line.
pub fn expect_err(con: &mut redis::Connection, cmd: &redis::Cmd) -> String {
    match cmd.query::<redis::Value>(con) {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => err_line(&e),
    }
}

/// Polls `f` until it returns `Some`, failing after `timeout`.
pub fn eventually<T>(timeout: Duration, what: &str, f: impl FnMut() -> Option<T>) -> T {
    poll(timeout, f).unwrap_or_else(|| panic!("timed out waiting for {what}"))
}

/// Polls `f` until it returns `Some`, or `None` after `timeout`.
pub fn poll<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Cluster {
    /// Waits until the site is settled (see `settled_leader`) and returns
    /// its coordinator leader; on timeout, says what each node reported.
    pub fn settled(&self, nodes: &[usize], what: &str) -> usize {
        poll(Duration::from_secs(30), || settled_leader(self, nodes)).unwrap_or_else(|| {
            let statuses: Vec<String> =
                nodes.iter().map(|&n| format!("--- CW.CLUSTER STATUS via node {n} ---\n{:?}", cluster_status(self, n))).collect();
            panic!("timed out waiting for {what}\n{}\n{}", statuses.join("\n"), self.logs())
        })
    }

    /// `eventually`, with every node's log in the failure message.
    pub fn eventually<T>(&self, timeout: Duration, what: &str, f: impl FnMut() -> Option<T>) -> T {
        poll(timeout, f).unwrap_or_else(|| panic!("timed out waiting for {what}\n{}", self.logs()))
    }
}

/// A raw RESP connection: send arbitrary bytes, read frames or the close.
pub struct Raw {
    pub stream: TcpStream,
    buf: BytesMut,
}

impl Raw {
    pub fn connect(addr: &str) -> Raw {
        let stream = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
        stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        stream.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
        stream.set_nodelay(true).unwrap();
        Raw { stream, buf: BytesMut::new() }
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).unwrap();
    }

    /// Encodes and sends one command.
    pub fn send_cmd(&mut self, args: &[&[u8]]) {
        let mut out = BytesMut::new();
        encode_request(args, &mut out);
        self.send(&out);
    }

    /// Sends one command and reads its reply.
    pub fn cmd(&mut self, args: &[&[u8]]) -> Frame {
        self.send_cmd(args);
        self.read_frame()
    }

    /// Reads one reply frame (panics on EOF or timeout).
    pub fn read_frame(&mut self) -> Frame {
        let limits = Limits::default();
        loop {
            if let Some(f) = parse_frame(&mut self.buf, &limits).expect("the server sends valid RESP") {
                return f;
            }
            let mut chunk = [0u8; 64 * 1024];
            let n = self.stream.read(&mut chunk).unwrap_or_else(|e| panic!("reading a reply: {e}"));
            assert!(n > 0, "connection closed while waiting for a reply (buffered: {:?})", self.buf);
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// Reads until the server closes the connection; returns everything read
    /// (including any reply bytes still buffered). Panics if it stays open.
    pub fn read_to_close(&mut self) -> Vec<u8> {
        let mut all = self.buf.split().to_vec();
        let mut chunk = [0u8; 64 * 1024];
        loop {
            match self.stream.read(&mut chunk) {
                Ok(0) => return all,
                Ok(n) => all.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::ConnectionReset => return all,
                Err(e) => panic!("expected the server to close the connection, got {e} after {:?}", String::from_utf8_lossy(&all)),
            }
        }
    }

    /// Reads exactly `n` bytes of raw reply.
    pub fn read_exact_raw(&mut self, n: usize) -> Vec<u8> {
        let mut out = self.buf.split().to_vec();
        let mut chunk = vec![0u8; 64 * 1024];
        while out.len() < n {
            let got = self.stream.read(&mut chunk).unwrap();
            assert!(got > 0, "closed after {} of {n} bytes", out.len());
            out.extend_from_slice(&chunk[..got]);
        }
        self.buf.extend_from_slice(&out[n..]);
        out.truncate(n);
        out
    }
}

/// Shorthand for a bulk reply.
pub fn bulk(b: &[u8]) -> Frame {
    Frame::Bulk(bytes::Bytes::copy_from_slice(b))
}

/// Shorthand for a simple string reply.
pub fn simple(s: &str) -> Frame {
    Frame::Simple(s.to_string().into())
}

/// Shorthand for an error reply.
pub fn error(s: &str) -> Frame {
    Frame::Error(s.to_string())
}

/// `CW.CLUSTER STATUS` through node `via`, as field -> value (None if the
/// node does not answer).
pub fn cluster_status(c: &Cluster, via: usize) -> Option<std::collections::HashMap<String, String>> {
    let mut con = c.client(via).get_connection_with_timeout(Duration::from_secs(1)).ok()?;
    let text: String = redis::cmd("CW.CLUSTER").arg("STATUS").query(&mut con).ok()?;
    Some(text.lines().filter_map(|l| l.split_once(':')).map(|(k, v)| (k.to_string(), v.to_string())).collect())
}

/// Whether `CW.CLUSTER STATUS` lists `node` in the configuration (a
/// coordinator also lists nodes it hears from outside it, as `member=no`).
pub fn is_member(status: &std::collections::HashMap<String, String>, node: usize) -> bool {
    status.get(&format!("node{node}")).is_some_and(|l| !l.starts_with("member=no"))
}

/// The coordinator leader, if the site is settled as it reports: every
/// node of `nodes` a member, heard at the current epoch with nothing left
/// to fetch, and every chain at R.
fn settled_leader(c: &Cluster, nodes: &[usize]) -> Option<usize> {
    let leader: usize = (0..3).find_map(|i| cluster_status(c, i)?.get("coordinator_leader")?.parse().ok())?;
    let s = cluster_status(c, leader)?;
    let settled = format!("epoch={},joining=0,catching_up=0,", s.get("epoch")?);
    let all = nodes.iter().all(|&n| is_member(&s, n) && s[&format!("node{n}")].contains(&settled));
    (all && s.get("short_chains")? == "0").then_some(leader)
}

/// Writes `n` keys `{prefix}{i}` through node 0 and returns what was
/// acknowledged.
pub fn write_keys(c: &Cluster, prefix: &str, n: usize) -> Vec<(String, String)> {
    let mut con = c.conn(0);
    (0..n)
        .map(|i| {
            let (k, v) = (format!("{prefix}{i}"), format!("v{i}"));
            let _: () = redis::Commands::set(&mut con, &k, &v).unwrap();
            (k, v)
        })
        .collect()
}

/// Every (key, value) reads back through each of `nodes`, with a
/// linearizable (tail) read and a causal read.
pub fn assert_readable(c: &Cluster, nodes: &[usize], keys: &[(String, String)]) {
    for &node in nodes {
        for level in ["linearizable", "causal"] {
            let mut con = c.conn(node);
            let _: () = redis::cmd("CW.CONSISTENCY").arg(level).query(&mut con).unwrap();
            for (k, v) in keys {
                let got: Option<String> = redis::Commands::get(&mut con, k).unwrap();
                assert_eq!(got.as_deref(), Some(v.as_str()), "{level} read of {k} via node {node}\n{}", c.logs());
            }
        }
    }
}

/// Writers on the surviving nodes: each writes its own keys in sequence and
/// records what was acknowledged. Errors (timeouts while a chain is
/// repaired) are retried with the next value.
pub struct Workload {
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<HashMap<String, String>>>,
    threads: Vec<std::thread::JoinHandle<(Duration, u64)>>,
}

/// What a finished workload did.
pub struct Written {
    /// The last acknowledged value of every key whose last write was
    /// acknowledged.
    pub acked: HashMap<String, String>,
    /// The longest time a writer went without an acknowledgement.
    pub longest_gap: Duration,
    /// Writes tried.
    pub tried: u64,
}

impl Workload {
    /// One writer per node of `via`, 50 keys each.
    pub fn start(c: &Cluster, via: &[usize]) -> Workload {
        Workload::spread(c, via, via.len(), 50)
    }

    /// `writers` connections spread over `nodes`, each writing its own
    /// `keys_each` keys (so a key's last acknowledged value is well
    /// defined) in a loop until `finish`. A failed write (a node died or
    /// the request timed out) leaves the key's value unknown: it is
    /// forgotten, and the writer reconnects.
    pub fn spread(c: &Cluster, nodes: &[usize], writers: usize, keys_each: u64) -> Workload {
        Workload::pipelined(c, nodes, writers, keys_each, 1)
    }

    /// `spread`, each writer sending `depth` SETs of distinct keys at once
    /// (one write of a pipeline, then all the answers): all are
    /// acknowledged when the pipeline answers them all; if it fails, every
    /// key in it is forgotten.
    pub fn pipelined(c: &Cluster, nodes: &[usize], writers: usize, keys_each: u64, depth: u64) -> Workload {
        assert!(depth <= keys_each, "a pipeline writes distinct keys");
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(Mutex::new(HashMap::new()));
        let threads = (0..writers)
            .map(|w| {
                let (client, stop, acked) = (c.client(nodes[w % nodes.len()]), stop.clone(), acked.clone());
                std::thread::spawn(move || {
                    let connect = || {
                        let con = client.get_connection_with_timeout(Duration::from_millis(500)).ok()?;
                        con.set_read_timeout(Some(Duration::from_secs(3))).ok()?;
                        Some(con)
                    };
                    let mut con = connect();
                    let mut longest_gap = Duration::ZERO;
                    let mut last_ok = Instant::now();
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let Some(c) = con.as_mut() else {
                            std::thread::sleep(Duration::from_millis(20));
                            con = connect();
                            continue;
                        };
                        let batch: Vec<(String, String)> = (0..depth)
                            .map(|_| {
                                n += 1;
                                (format!("w{w}:k{}", n % keys_each), format!("w{w}:v{n}"))
                            })
                            .collect();
                        let mut pipe = redis::pipe();
                        for (key, value) in &batch {
                            pipe.set(key, value);
                        }
                        match pipe.query::<Vec<String>>(c) {
                            Ok(_) => {
                                longest_gap = longest_gap.max(last_ok.elapsed());
                                last_ok = Instant::now();
                                acked.lock().unwrap().extend(batch);
                            }
                            Err(_) => {
                                let mut acked = acked.lock().unwrap();
                                for (key, _) in &batch {
                                    acked.remove(key);
                                }
                                drop(acked);
                                con = connect();
                            }
                        }
                    }
                    (longest_gap, n)
                })
            })
            .collect();
        Workload { stop, acked, threads }
    }

    /// Acknowledged keys so far.
    pub fn acked_keys(&self) -> usize {
        self.acked.lock().unwrap().len()
    }

    pub fn finish(self) -> Written {
        self.stop.store(true, Ordering::Relaxed);
        let (mut longest_gap, mut tried) = (Duration::ZERO, 0);
        for t in self.threads {
            let (gap, n) = t.join().unwrap();
            longest_gap = longest_gap.max(gap);
            tried += n;
        }
        Written { acked: Arc::try_unwrap(self.acked).unwrap().into_inner().unwrap(), longest_gap, tried }
    }
}

/// Every acknowledged value (the last one per key) is what every survivor
/// returns, through a linearizable (tail) read and a causal read.
pub fn check_acknowledged(c: &Cluster, survivors: &[usize], acked: &HashMap<String, String>) {
    assert!(acked.len() >= 20, "only {} keys were acknowledged", acked.len());
    let keys: Vec<(String, String)> = acked.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    assert_readable(c, survivors, &keys);
}
