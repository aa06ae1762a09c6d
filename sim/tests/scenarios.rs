//! Scenarios told as stories: each file in tests/scenarios runs a simulated
//! site under the real supervisor through a script of commands, with the
//! expected output below each `---` (goldenscript, as toyDB's
//! raft/testscripts). `UPDATE_GOLDENFILES=1 cargo test -p causeway-sim
//! --test scenarios` rewrites the expectations; the diff is then read like
//! a test failure: does the site do what the protocol says?
//!
//! Times are virtual milliseconds since the site started. Every value
//! written in a script must be unique: the checkers name a write by its
//! value.
//!
//! Commands:
//!
//! * `site nodes=N replicas=R k=K partitions=P fsync=always|everysec
//!   [seed=S]`: a new site, every node admitted.
//! * `put KEY=VALUE [via=N] [level=causal|linearizable|eventual]`: one
//!   write, waited for. `via=N` uses a session on node N (a Redis
//!   connection to N); without it, a native client's.
//! * `get KEY [via=N] [level=...]`: one read, and the node that served it.
//! * `crash N...`, `restart N... [disk=empty]`: kill -9; start again from
//!   the log, or on an empty disk (a new machine).
//! * `pause N ms=MS`, `pause_coordinator ms=MS`: SIGSTOP, of a node or of
//!   the coordinator leader.
//! * `join`: a new node started, and the operator adds it.
//! * `drain N`: the operator removes node N (`causeway cluster remove`).
//! * `run ms=MS`: lets time pass.
//! * `stabilize`: runs until the site has nothing left to do by itself
//!   (`Sim::quiet`).
//! * `status`: the configuration (epoch, nodes, chains) and each node's view.
//! * `digest`: each replica's applied and stable positions and a hash of
//!   its data, by partition.
//! * `check`: causal+ on every read, replicas converged, every acknowledged
//!   write present, and porcupine on the keys only used linearizably.
//!
//! Whatever the coordinator decided during a command is printed after it,
//! one line per change.

use bytes::Bytes;
use causeway_checker::lincheck::{self, Op, OpKind};
use causeway_checker::replicas;
use causeway_core::driver::{Consistency, Request, Response};
use causeway_core::message::Change;
use causeway_core::ring::{NodeId, Shape};
use causeway_sim::check::CausalChecker;
use causeway_sim::{Completed, Fsync, Network, Sim};
use std::collections::{BTreeMap, BTreeSet};
use std::error::Error;
use std::fmt::Write as _;
use std::path::Path;

/// Where the sim's clock starts (`Sim::new`): times are printed from it.
const START_MS: u64 = 1_000;
/// How long a request or `stabilize` may take before the script fails.
const REQUEST_LIMIT_MS: u64 = 10_000;
const STABILIZE_LIMIT_MS: u64 = 60_000;

#[derive(goldenscript::Command)]
enum Command {
    Site {
        #[arg(key)]
        nodes: u16,
        #[arg(key)]
        replicas: usize,
        #[arg(key)]
        k: usize,
        #[arg(key)]
        partitions: u32,
        #[arg(key)]
        fsync: String,
        #[arg(key)]
        seed: Option<u64>,
    },
    Put {
        #[arg(key)]
        via: Option<NodeId>,
        #[arg(key)]
        level: Option<Consistency>,
        pair: Vec<(String, String)>,
    },
    Get {
        key: String,
        #[arg(key)]
        via: Option<NodeId>,
        #[arg(key)]
        level: Option<Consistency>,
    },
    Crash(Vec<NodeId>),
    Restart {
        nodes: Vec<NodeId>,
        #[arg(key)]
        disk: Option<String>,
    },
    Pause {
        node: NodeId,
        #[arg(key)]
        ms: u64,
    },
    PauseCoordinator {
        #[arg(key)]
        ms: u64,
    },
    Join,
    Drain(NodeId),
    Run {
        #[arg(key)]
        ms: u64,
    },
    Stabilize,
    Status,
    Digest,
    Check,
}

/// One script's site and everything it recorded.
#[derive(Default)]
struct Scenario {
    sim: Option<Sim>,
    /// Client index by home node (`None`: the native client).
    clients: BTreeMap<Option<NodeId>, usize>,
    checker: CausalChecker,
    /// Every operation, for porcupine, on a clock that ticks at each call
    /// and return.
    history: Vec<Op>,
    clock: i64,
    /// Keys used at a level other than linearizable: porcupine skips them
    /// (a causal read may rightly be stale).
    not_linearizable: BTreeSet<String>,
    values: BTreeSet<String>,
    /// Coordinator changes already printed.
    printed: usize,
}

impl goldenscript::Runner for Scenario {
    type Command = Command;

    fn run(&mut self, command: &Command, _: &goldenscript::Context) -> Result<String, Box<dyn Error>> {
        let mut out = String::new();
        if let Command::Site { nodes, replicas, k, partitions, fsync, seed } = command {
            let shape = Shape { partitions: *partitions, replicas: *replicas, k: *k, coding: None };
            shape.validate(*nodes as usize)?;
            let mut sim = Sim::new(seed.unwrap_or(1), *nodes, shape, 0, Network::default()).with_coordinator();
            sim.fsync = match fsync.as_str() {
                "always" => Fsync::Always,
                "everysec" => Fsync::EverySec,
                other => return Err(format!("fsync is always or everysec, not {other}").into()),
            };
            *self = Scenario { sim: Some(sim), ..Scenario::default() };
            self.status(&mut out)?;
            return Ok(out);
        }
        let sim = self.sim.as_mut().ok_or("start with `site`")?;
        let at = |sim: &Sim| sim.now_ms - START_MS;
        match command {
            Command::Site { .. } => unreachable!("handled above"),
            Command::Put { via, level, pair } => {
                let [(key, value)] = pair.as_slice() else { return Err("put one KEY=VALUE".into()) };
                if !self.values.insert(value.clone()) {
                    return Err(format!("value {value} was written before: values must be unique").into());
                }
                let bytes = Bytes::from(value.clone());
                let request = Request::Put { key: Bytes::from(key.clone()), change: Change::set(bytes.clone()) };
                let client = self.client(*via, *level, key);
                self.checker.issued_write(client, &bytes);
                let done = self.request(client, request, OpKind::Put(value.clone()), key)?;
                let sim = self.sim.as_ref().expect("site");
                let (t, now) = (sim.topology(), at(sim));
                let p = t.partition_of(key.as_bytes());
                match (&done.result, done.acked_at.and_then(|i| t.chain(p).nodes.get(i as usize))) {
                    (Ok(_), Some(n)) => writeln!(out, "{now} ms: put {key}={value} → ok (p{p}, acked by n{n})")?,
                    (Ok(_), None) => writeln!(out, "{now} ms: put {key}={value} → ok (p{p})")?,
                    (Err(e), _) => writeln!(out, "{now} ms: put {key}={value} → error: {e}")?,
                }
            }
            Command::Get { key, via, level } => {
                let client = self.client(*via, *level, key);
                let done = self.request(client, Request::Get(Bytes::from(key.clone())), OpKind::Get(String::new()), key)?;
                let sim = self.sim.as_ref().expect("site");
                let (t, now) = (sim.topology(), at(sim));
                match &done.result {
                    Ok(Response::Read { value, chain_index, .. }) => {
                        let value = value.as_ref().map_or("nil".into(), |v| String::from_utf8_lossy(v).to_string());
                        match t.chain(t.partition_of(key.as_bytes())).nodes.get(*chain_index as usize) {
                            Some(n) => writeln!(out, "{now} ms: get {key} → {value} (from n{n})")?,
                            None => writeln!(out, "{now} ms: get {key} → {value} (from position {chain_index})")?,
                        }
                    }
                    Ok(other) => return Err(format!("get answered {other:?}").into()),
                    Err(e) => writeln!(out, "{now} ms: get {key} → error: {e}")?,
                }
            }
            Command::Crash(nodes) => {
                for &n in nodes {
                    sim.crash(n);
                    writeln!(out, "{} ms: n{n} crashed", at(sim))?;
                }
            }
            Command::Restart { nodes, disk } => {
                for &n in nodes {
                    let how = match disk.as_deref() {
                        None => {
                            sim.restart(n);
                            "from its log"
                        }
                        Some("empty") => {
                            sim.restart_without_data(n);
                            "on an empty disk"
                        }
                        Some(other) => return Err(format!("disk=empty or nothing, not {other}").into()),
                    };
                    let node = sim.node(n);
                    let recovered = node.beat(sim.now_ms).recovered.expect("a restarted node is not admitted yet");
                    // Each replica's position in its partition's update order.
                    let beat = node.beat(sim.now_ms);
                    let parts: Vec<String> = beat.applied.iter().map(|(p, a)| format!("p{p}@{a}")).collect();
                    let incomplete: Vec<String> = recovered.incomplete.iter().map(|p| format!("p{p}")).collect();
                    let parts = match (parts.is_empty(), recovered.whole, incomplete.is_empty()) {
                        (true, _, _) => "nothing".to_string(),
                        (false, true, true) => format!("{} (whole)", parts.join(" ")),
                        (false, true, false) => format!("{} (whole but {} incomplete)", parts.join(" "), incomplete.join(" ")),
                        (false, false, _) => format!("{} (not whole)", parts.join(" ")),
                    };
                    writeln!(out, "{} ms: n{n} restarted {how} as #{}: recovered {parts}", at(sim), node.incarnation())?;
                }
            }
            Command::Pause { node, ms } => {
                sim.pause(*node, *ms);
                writeln!(out, "{} ms: n{node} paused for {ms} ms", at(sim))?;
            }
            Command::PauseCoordinator { ms } => {
                sim.pause_coordinator(*ms);
                writeln!(out, "{} ms: coordinator paused for {ms} ms", at(sim))?;
            }
            Command::Join => {
                let n = sim.join();
                writeln!(out, "{} ms: n{n} started as #{}; the operator adds it", at(sim), sim.node(n).incarnation())?;
            }
            Command::Drain(n) => {
                sim.drain(*n);
                writeln!(out, "{} ms: the operator drains n{n}", at(sim))?;
            }
            Command::Run { ms } => {
                let until = sim.now_ms + ms;
                self.record(until);
            }
            Command::Stabilize => {
                let limit = sim.now_ms + STABILIZE_LIMIT_MS;
                while !self.sim.as_ref().expect("site").quiet() {
                    let sim = self.sim.as_ref().expect("site");
                    if sim.now_ms >= limit {
                        return Err(format!("not quiet after {STABILIZE_LIMIT_MS} ms; the coordinator did:\n{}", sim.history()).into());
                    }
                    self.record(sim.now_ms + 100);
                }
                writeln!(out, "{} ms: quiet", at(self.sim.as_ref().expect("site")))?;
            }
            Command::Status => self.status(&mut out)?,
            Command::Digest => {
                writeln!(out, "partition: node applied/stable data-hash, head first")?;
                for p in 0..sim.topology().shape.partitions {
                    let replicas: Vec<String> = sim
                        .topology()
                        .chain(p)
                        .nodes
                        .iter()
                        .map(|&n| match sim.node(n).digest(p) {
                            Some(d) => format!("n{n} {}/{} {:04x}", d.applied, d.stable, d.fingerprint() & 0xffff),
                            None => format!("n{n} -"),
                        })
                        .collect();
                    writeln!(out, "p{p}: {}", replicas.join(", "))?;
                }
            }
            Command::Check => {
                // Heartbeats may be on their way: let what is in flight land.
                for _ in 0..100 {
                    let sim = self.sim.as_ref().expect("site");
                    if sim.settled() {
                        break;
                    }
                    self.record(sim.now_ms + 1);
                }
                self.check(&mut out)?
            }
        }
        // What the coordinator did meanwhile came first.
        let mut changes = String::new();
        self.changes(&mut changes)?;
        Ok(changes + &out)
    }
}

impl Scenario {
    /// The client for `via` (created on first use), set to `level`.
    fn client(&mut self, via: Option<NodeId>, level: Option<Consistency>, key: &str) -> usize {
        let sim = self.sim.as_mut().expect("site");
        let client = *self.clients.entry(via).or_insert_with(|| sim.add_client(via));
        let level = level.unwrap_or_default();
        sim.set_consistency(client, level);
        if level != Consistency::Linearizable {
            self.not_linearizable.insert(key.to_string());
        }
        client
    }

    /// Runs one request to completion and records it.
    fn request(&mut self, client: usize, request: Request, mut kind: OpKind, key: &str) -> Result<Completed, Box<dyn Error>> {
        let sim = self.sim.as_mut().expect("site");
        self.clock += 1;
        let call = self.clock;
        let limit = sim.now_ms + REQUEST_LIMIT_MS;
        let mut done = sim.start(client, request).into_iter().collect::<Vec<_>>();
        while done.is_empty() {
            if sim.now_ms >= limit {
                return Err(format!("no answer after {REQUEST_LIMIT_MS} ms").into());
            }
            let until = sim.now_ms + 1;
            done = sim.run_until(until);
        }
        let [done] = <[Completed; 1]>::try_from(done).map_err(|_| "one request at a time")?;
        self.clock += 1;
        self.checker.completed(&done);
        let ret = match (&mut kind, &done.result) {
            (OpKind::Get(out), Ok(Response::Read { value, .. })) => {
                *out = value.as_ref().map(|v| String::from_utf8_lossy(v).to_string()).unwrap_or_default();
                Some(self.clock)
            }
            (OpKind::Put(_), Ok(_)) => Some(self.clock),
            // A failed write may still take effect later; a failed read
            // says nothing.
            (OpKind::Put(_), Err(_)) => None,
            _ => return Ok(done),
        };
        self.history.push(Op { client, key: key.to_string(), kind, call, ret });
        Ok(done)
    }

    /// Runs the site until `until_ms`, recording what completes (nothing
    /// should: requests are waited for).
    fn record(&mut self, until_ms: u64) {
        for done in self.sim.as_mut().expect("site").run_until(until_ms) {
            self.checker.completed(&done);
        }
    }

    /// The coordinator's changes not printed yet.
    fn changes(&mut self, out: &mut String) -> Result<(), Box<dyn Error>> {
        let sim = self.sim.as_ref().expect("site");
        for (at, what) in &sim.changes[self.printed..] {
            writeln!(out, "{} ms: {what}", at - START_MS)?;
        }
        self.printed = sim.changes.len();
        Ok(())
    }

    fn status(&self, out: &mut String) -> Result<(), Box<dyn Error>> {
        let sim = self.sim.as_ref().expect("site");
        let t = sim.topology();
        let reports = sim.supervisor().expect("the real coordinator").reports(t, sim.now_ms);
        writeln!(out, "epoch {}", t.epoch)?;
        for n in 0..sim.node_count() as NodeId {
            let node = sim.node(n);
            if sim.is_crashed(n) {
                writeln!(out, "n{n} #{}: crashed", node.incarnation())?;
                continue;
            }
            let role = match (t.node(n).is_some(), t.admits(n, node.incarnation())) {
                (true, true) => "member".to_string(),
                (true, false) => "member, not admitted (waits)".to_string(),
                (false, _) => match reports.iter().find(|r| r.node == n).and_then(|r| Some((r.held_out_ms?, r.failures))) {
                    Some((held, failures)) => format!("returning, held out {held} ms more ({failures} failure(s) in a row)"),
                    None => "not a member".to_string(),
                },
            };
            let paused = if sim.is_paused(n) { ", paused" } else { "" };
            let transfers = match node.transfers() {
                (0, 0) => String::new(),
                (suffixes, whole) => format!(", received {suffixes} suffix(es) and {whole} whole state(s)"),
            };
            writeln!(out, "n{n} #{} at epoch {}: {role}{paused}{transfers}", node.incarnation(), node.topology().epoch)?;
        }
        for p in 0..t.shape.partitions {
            let chain: Vec<String> = t.chain(p).nodes.iter().map(|n| format!("n{n}")).collect();
            // What each node would tell the coordinator now.
            let fetching: Vec<String> =
                t.chain(p).nodes.iter().filter(|&&n| sim.node(n).beat(sim.now_ms).joining.contains(&p)).map(|n| format!("n{n}")).collect();
            let fetching = if fetching.is_empty() { String::new() } else { format!(" ({} fetching)", fetching.join(" ")) };
            writeln!(out, "p{p}: {}{fetching}", chain.join(" "))?;
        }
        Ok(())
    }

    fn check(&self, out: &mut String) -> Result<(), Box<dyn Error>> {
        let sim = self.sim.as_ref().expect("site");
        if !sim.settled() {
            return Err("check a settled site (stabilize first)".into());
        }
        let c = &self.checker;
        if !c.violations.is_empty() {
            return Err(format!("causal+ violated:\n{}", c.violations.join("\n")).into());
        }
        writeln!(out, "causal+: every read ({}) saw its causal past", c.reads_checked)?;
        let digests = sim.digests();
        replicas::converged(&digests)?;
        writeln!(out, "converged: the replicas of each of {} partitions are identical", digests.len())?;
        replicas::durable(&digests, &c.acknowledged)?;
        writeln!(out, "durable: {} acknowledged writes present", c.acknowledged.len())?;
        let history: Vec<Op> = self.history.iter().filter(|op| !self.not_linearizable.contains(&op.key)).cloned().collect();
        if !history.is_empty() {
            if !lincheck::check(&history) {
                return Err(format!("not linearizable:\n{}", lincheck::to_json(&history)).into());
            }
            writeln!(out, "porcupine: {} operations on linearizable keys, linearizable", history.len())?;
        }
        Ok(())
    }
}

#[test]
fn scenarios() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scenarios");
    let mut scripts: Vec<_> = std::fs::read_dir(&dir).expect("tests/scenarios").map(|e| e.expect("entry").path()).collect();
    scripts.sort();
    assert!(!scripts.is_empty());
    for script in scripts {
        eprintln!("{}", script.display());
        goldenscript::run(&mut Scenario::default(), &script).unwrap_or_else(|e| panic!("{}: {e}", script.display()));
    }
}
