//! A local site: one `causeway node` child process per node on loopback,
//! with a shared cluster secret, that can be killed, paused, wiped and
//! restarted node by node (`causeway dev`, `causeway torture`).

use crate::resp_client::RespConn;
use causeway_resp::Frame;
use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The shape of a local site.
#[derive(Clone, Debug)]
pub struct Shape {
    pub nodes: u16,
    pub replicas: usize,
    pub k: usize,
    pub partitions: u32,
    /// Erasure-coded groups instead of chains (`--redundancy ec:K+M`).
    pub coding: Option<causeway_core::ring::Coding>,
    /// Node i keeps its write-ahead log in `DIR/node-i`.
    pub data_dir: Option<String>,
    /// Node i keeps values past its budget in a disk tier in `DIR/node-i`.
    pub disk_tier: Option<String>,
    /// Extra flags for every node.
    pub node_args: Vec<String>,
    /// Where the nodes' stderr goes, node i's in `LOGS/node-i.log`, every
    /// incarnation after the one before (None: inherited).
    pub logs: Option<PathBuf>,
}

/// The running site.
pub struct Site {
    pub shape: Shape,
    ports: Vec<u16>,
    exe: PathBuf,
    secret: Vec<String>,
    children: Vec<Option<Child>>,
    /// How many times each node has been started.
    starts: Vec<u32>,
}

impl Site {
    /// Starts every node, node i listening on `ports[i]`, and waits until
    /// each accepts connections.
    pub fn start_on(shape: Shape, ports: Vec<u16>) -> Result<Site, String> {
        let (replicas, k) = if shape.coding.is_some() { (1, 1) } else { (shape.replicas, shape.k) };
        causeway_core::ring::Shape { partitions: shape.partitions, replicas, k, coding: shape.coding }.validate(shape.nodes as usize)?;
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        // The nodes of this site prove a fresh shared secret to each other,
        // unless one was given.
        let given =
            shape.node_args.iter().any(|a| a.starts_with("--cluster-secret")) || std::env::var_os("CAUSEWAY_CLUSTER_SECRET").is_some();
        let secret = if given { Vec::new() } else { vec!["--cluster-secret".to_string(), format!("{:032x}", rand::random::<u128>())] };
        let mut site =
            Site { children: (0..shape.nodes).map(|_| None).collect(), starts: vec![0; shape.nodes as usize], shape, ports, exe, secret };
        for i in 0..site.shape.nodes {
            site.spawn(i)?;
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        for i in 0..site.shape.nodes {
            while std::net::TcpStream::connect(site.addr(i)).is_err() {
                if Instant::now() > deadline || site.exited().is_some() {
                    site.stop();
                    return Err(format!("node {i} did not start on {} (is the port free?)", site.addr(i)));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(site)
    }

    pub fn addr(&self, i: u16) -> String {
        format!("127.0.0.1:{}", self.ports[i as usize])
    }

    pub fn pid(&self, i: u16) -> Option<u32> {
        self.children[i as usize].as_ref().map(|c| c.id())
    }

    fn spawn(&mut self, i: u16) -> Result<(), String> {
        let s = &self.shape;
        let nodes: Vec<String> = (0..s.nodes).map(|n| format!("{n}={}", self.addr(n))).collect();
        let mut data: Vec<String> = s.data_dir.iter().flat_map(|d| ["--data-dir".to_string(), format!("{d}/node-{i}")]).collect();
        data.extend(s.disk_tier.iter().flat_map(|d| ["--disk-tier".to_string(), format!("{d}/node-{i}")]));
        let mut cmd = Command::new(&self.exe);
        cmd.args(["node", "--id", &i.to_string(), "--listen", &self.addr(i), "--nodes", &nodes.join(",")])
            .args(["--partitions", &s.partitions.to_string(), "--replicas", &s.replicas.to_string(), "--k", &s.k.to_string()])
            .args(s.coding.iter().flat_map(|c| ["--redundancy".to_string(), format!("ec:{}+{}", c.data, c.parity)]))
            .args(&data)
            .args(&self.secret)
            .args(&s.node_args)
            .stdin(Stdio::null());
        self.starts[i as usize] += 1;
        if let Some(dir) = &s.logs {
            let log = open_log(&dir.join(format!("node-{i}.log")), i, self.starts[i as usize])?;
            cmd.stdout(Stdio::null()).stderr(log);
        }
        self.children[i as usize] = Some(cmd.spawn().map_err(|e| format!("cannot start node {i}: {e}"))?);
        Ok(())
    }

    /// kill -9 node `i`.
    pub fn kill(&mut self, i: u16) {
        if let Some(mut c) = self.children[i as usize].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts a killed node again (same port, flags and data directory).
    pub fn restart(&mut self, i: u16) -> Result<(), String> {
        self.kill(i);
        self.spawn(i)
    }

    /// Deletes a killed node's data directory (a new disk).
    pub fn wipe(&self, i: u16) {
        for d in [&self.shape.data_dir, &self.shape.disk_tier].into_iter().flatten() {
            let _ = std::fs::remove_dir_all(format!("{d}/node-{i}"));
        }
    }

    /// Sends `signal` ("STOP", "CONT", "TERM") to node `i`.
    pub fn signal(&self, i: u16, signal: &str) {
        if let Some(pid) = self.pid(i) {
            let _ = Command::new("kill").arg(format!("-{signal}")).arg(pid.to_string()).status();
        }
    }

    /// A node whose process has exited, and how.
    pub fn exited(&mut self) -> Option<(u16, std::process::ExitStatus)> {
        for (i, c) in self.children.iter_mut().enumerate() {
            if let Some(status) = c.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                *c = None;
                return Some((i as u16, status));
            }
        }
        None
    }

    pub fn running(&self) -> usize {
        self.children.iter().flatten().count()
    }

    /// Waits until every running node serves (the coordinator admitted it).
    pub async fn wait_serving(&self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        for i in (0..self.shape.nodes).filter(|&i| self.children[i as usize].is_some()) {
            loop {
                if let Ok(mut c) = RespConn::connect(&self.addr(i)).await {
                    if let Ok(Frame::Bulk(s)) = c.call(&[b"CW.STATUS"]).await {
                        if s.windows(11).any(|w| w == b"serving:yes") {
                            break;
                        }
                    }
                }
                if Instant::now() > deadline {
                    return Err(format!("node {i} was not admitted by the coordinator in time"));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Ok(())
    }

    /// Stops every node (SIGTERM: each shuts down cleanly).
    pub fn stop(&mut self) {
        for i in 0..self.shape.nodes {
            self.signal(i, "CONT");
            self.signal(i, "TERM");
        }
        for c in self.children.iter_mut().flatten() {
            let _ = c.wait();
        }
        self.children.iter_mut().for_each(|c| *c = None);
    }
}

/// Node `i`'s log for its `start`-th incarnation: appended to the file, so
/// that a failure can be read back across the restarts that led to it,
/// after a line that marks where this incarnation begins (with the time in
/// the format of the log lines around it).
fn open_log(path: &Path, i: u16, start: u32) -> Result<File, String> {
    let mut log = std::fs::OpenOptions::new().create(true).append(true).open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    let line = match start {
        1 => format!("=== node {i} started at {now} ===\n"),
        n => format!("=== node {i} restarted at {now} (start {n}) ===\n"),
    };
    log.write_all(line.as_bytes()).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(log)
}

/// Starts `ports.len()` sites of `shape`, active-active: site s's node i
/// on `ports[s][i]`, its log in `DATA/site-s/node-i` and its stderr in
/// `LOGS/site-s/`, one-way delays `delays[s][t]` ms plus up to `jitter_ms`
/// between sites, one shared cluster secret (sites authenticate each
/// other with it). One site: `start_on`, unchanged.
pub fn start_sites(shape: &Shape, ports: &[Vec<u16>], delays: &[Vec<u64>], jitter_ms: u64) -> Result<Vec<Site>, String> {
    if ports.len() == 1 {
        return Ok(vec![Site::start_on(shape.clone(), ports[0].clone())?]);
    }
    let secret = format!("{:032x}", rand::random::<u128>());
    let mut sites: Vec<Site> = Vec::new();
    for s in 0..ports.len() {
        let mut shape = shape.clone();
        shape.node_args.extend(["--site".to_string(), s.to_string(), "--cluster-secret".to_string(), secret.clone()]);
        shape.node_args.extend(["--wan-jitter-ms".to_string(), jitter_ms.to_string()]);
        let mut wan = Vec::new();
        for t in (0..ports.len()).filter(|&t| t != s) {
            let addrs: Vec<String> = ports[t].iter().map(|p| format!("127.0.0.1:{p}")).collect();
            shape.node_args.extend(["--remote-site".to_string(), format!("{t}={}", addrs.join(","))]);
            wan.push(format!("{t}={}", delays[s][t]));
        }
        shape.node_args.extend(["--wan-delay".to_string(), wan.join(",")]);
        shape.data_dir = shape.data_dir.map(|d| format!("{d}/site-{s}"));
        shape.disk_tier = shape.disk_tier.map(|d| format!("{d}/site-{s}"));
        if let Some(logs) = &mut shape.logs {
            logs.push(format!("site-{s}"));
            std::fs::create_dir_all(&*logs).map_err(|e| e.to_string())?;
        }
        match Site::start_on(shape, ports[s].clone()) {
            Ok(site) => sites.push(site),
            Err(e) => {
                sites.iter_mut().for_each(Site::stop);
                return Err(e);
            }
        }
    }
    Ok(sites)
}

/// `n` ports free a moment ago (bound to port 0, then released).
pub fn free_ports(n: u16) -> Result<Vec<u16>, String> {
    let listeners: Vec<std::net::TcpListener> =
        (0..n).map(|_| std::net::TcpListener::bind("127.0.0.1:0")).collect::<Result<_, _>>().map_err(|e| e.to_string())?;
    listeners.iter().map(|l| l.local_addr().map(|a| a.port()).map_err(|e| e.to_string())).collect()
}

impl Drop for Site {
    fn drop(&mut self) {
        for c in self.children.iter_mut().flatten() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A restart appends to the node's log: what the earlier incarnation
    /// wrote is still there, after its own marker and before the new one.
    #[test]
    fn a_restarted_nodes_log_keeps_the_earlier_incarnation() {
        let path = std::env::temp_dir().join(format!("causeway-site-log-{}.log", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let mut first = open_log(&path, 2, 1).unwrap();
        first.write_all(b"the first incarnation's last words\n").unwrap();
        drop(first);
        open_log(&path, 2, 2).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(lines[0].starts_with("=== node 2 started at ") && lines[0].ends_with(" ==="), "{text}");
        assert_eq!(lines[1], "the first incarnation's last words");
        assert!(lines[2].starts_with("=== node 2 restarted at ") && lines[2].ends_with("(start 2) ==="), "{text}");
    }
}
