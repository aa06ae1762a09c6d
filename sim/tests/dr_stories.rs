//! Identifier-first disaster recovery told as stories (goldenscript, like
//! `geo_stories.rs`): the real `core::geo::dr::Dr` of every node of a
//! backup site (site 1) and of one node of its primary (site 0), driven
//! message by message. Each file in tests/dr_stories is a script with the
//! expected output below each `---`; `UPDATE_GOLDENFILES=1 cargo test -p
//! causeway-sim --test dr_stories` rewrites them.
//!
//! * `backup nodes=N replicas=R`: the backup's nodes 0..N, the first R its
//!   stabilizer replicas, node 0 leading.
//! * `note key=K ts=T [partition=P] [at=N] [lose=M]`: the primary's head
//!   notes its write of K at T; it lands on backup node N (0). Messages
//!   inside the backup are delivered until none is left (those to node M
//!   lost); what leaves the site is printed.
//! * `applied ts=T`: the backup has applied the primary up to T (the
//!   leader's `SiteTime`): notes up to T are done.
//! * `crash N`, `restart N [empty=true]`: node N stops; it starts again
//!   from its log (or with nothing), a new incarnation, and is admitted
//!   again (in place from its log, out of its chains when empty).
//! * `failover at=N [force=true]`: the operator fails over at node N
//!   (forced: without a majority of replicas whose notes are whole).
//! * `tick [ms=MS]`: time passes on every live node.
//! * `status`: every live node's notes and lost keys.

use causeway_core::geo::dr::Dr;
use causeway_core::hlc::Timestamp;
use causeway_core::message::geo::{DrPair, Note};
use causeway_core::message::{Dest, GeoMsg, Message, OpId, Outbox};
use causeway_core::record::LogRecord;
use causeway_core::ring::{NodeId, NodeInfo, PartitionId, Shape, Topology};
use std::collections::BTreeMap;
use std::error::Error;
use std::fmt::Write as _;
use std::path::Path;

#[derive(goldenscript::Command)]
enum Command {
    Backup {
        #[arg(key)]
        nodes: NodeId,
        #[arg(key)]
        replicas: NodeId,
    },
    Note {
        #[arg(key)]
        key: String,
        #[arg(key)]
        ts: u64,
        #[arg(key)]
        partition: Option<PartitionId>,
        #[arg(key)]
        at: Option<NodeId>,
        #[arg(key)]
        lose: Option<NodeId>,
    },
    Applied {
        #[arg(key)]
        ts: u64,
    },
    Crash(NodeId),
    Restart(NodeId, #[arg(key = "empty", optional)] bool),
    Failover {
        #[arg(key)]
        at: NodeId,
        #[arg(key, optional)]
        force: bool,
    },
    Tick {
        #[arg(key)]
        ms: Option<u64>,
    },
    Status,
}

const PAIR: DrPair = DrPair { primary: 0, backup: 1 };
const OPERATOR: u64 = 99;

#[derive(Default)]
struct Story {
    now: u64,
    replicas: Vec<NodeId>,
    /// Live backup nodes.
    nodes: BTreeMap<NodeId, Dr>,
    /// Every backup node's log, kept through crashes.
    logs: BTreeMap<NodeId, Vec<LogRecord>>,
    topology: Option<Topology>,
    primary: Option<Dr>,
    writes: u64,
}

impl Story {
    fn topology(&self) -> Result<&Topology, Box<dyn Error>> {
        self.topology.as_ref().ok_or_else(|| "no backup: run `backup` first".into())
    }

    /// Delivers `out` inside the backup until nothing is left; prints what
    /// leaves it (to the primary, to the operator).
    fn settle(&mut self, mut out: Outbox, lose: Option<NodeId>, text: &mut String) -> Result<(), Box<dyn Error>> {
        let topology = self.topology()?.clone();
        while !out.is_empty() {
            let mut next = Outbox::new();
            for e in out {
                match (e.to, e.msg) {
                    (Dest::Node(n), Message::Geo(g)) => {
                        // Passed on inside the site (`Geo::step` unwraps it).
                        let g = match *g {
                            GeoMsg::Relayed(inner) => inner,
                            g => Box::new(g),
                        };
                        let what: &'static str = g.as_ref().into();
                        if Some(n) == lose {
                            writeln!(text, "{what} to node {n}: lost")?;
                            continue;
                        }
                        let Some(dr) = self.nodes.get_mut(&n) else {
                            writeln!(text, "{what} to node {n}: down")?;
                            continue;
                        };
                        dr.step(*g, true, Some(0), &topology, self.now, &mut next);
                        self.logs.entry(n).or_default().extend(dr.take_log());
                    }
                    (Dest::Site(0), Message::Geo(g)) => {
                        let GeoMsg::Noted { ops, .. } = &*g else { return Err(format!("to the primary: {g:?}").into()) };
                        let writes: Vec<String> = ops.iter().map(|(op, _)| format!("w{}", op.seq)).collect();
                        writeln!(text, "primary: noted [{}]", writes.join(" "))?;
                        let mut answers = Outbox::new();
                        self.primary.as_mut().expect("a primary").step(*g, false, Some(0), &topology, self.now, &mut answers);
                        for a in answers {
                            if let Message::Noted { op, .. } = a.msg {
                                writeln!(text, "primary: the session of w{} is answered", op.seq)?;
                            }
                        }
                    }
                    (Dest::Client(OPERATOR), Message::FailedOver { lost, .. }) => {
                        writeln!(text, "operator: failed over, {lost} keys refused")?
                    }
                    (to, msg) => return Err(format!("unexpected {msg:?} to {to:?}").into()),
                }
            }
            out = next;
        }
        Ok(())
    }
}

fn ts(ms: u64) -> Timestamp {
    Timestamp::new(ms, 0)
}

impl goldenscript::Runner for Story {
    type Command = Command;

    fn run(&mut self, command: &Command, _: &goldenscript::Context) -> Result<String, Box<dyn Error>> {
        let mut out = String::new();
        match command {
            Command::Backup { nodes, replicas } => {
                self.replicas = (0..*replicas).collect();
                let infos = (0..*nodes).map(|id| NodeInfo { id, addr: format!("n{id}") }).collect();
                let mut t = Topology::new(1, Shape { partitions: 4, replicas: 3.min(*nodes as usize), k: 1, coding: None }, infos)?;
                t.admitted = (0..*nodes).map(|n| (n, 1)).collect();
                self.nodes = (0..*nodes).map(|n| (n, Dr::new(PAIR, 1, n, 1, &self.replicas))).collect();
                // The site's birth: the replicas hear each other, and are
                // whole.
                let mut next = Outbox::new();
                for dr in self.nodes.values_mut() {
                    dr.admitted(&t, 0, &mut next);
                }
                self.topology = Some(t);
                self.primary = Some(Dr::new(PAIR, 0, 0, 1, &[0]));
                self.settle(next, None, &mut out)?;
                for (n, dr) in &mut self.nodes {
                    self.logs.entry(*n).or_default().extend(dr.take_log());
                }
            }
            Command::Note { key, ts: t, partition, at, lose } => {
                self.writes += 1;
                let note = Note {
                    partition: partition.unwrap_or(0),
                    ts: ts(*t),
                    key: key.clone().into(),
                    op: OpId { client: 7, seq: self.writes },
                    value_len: 100,
                };
                writeln!(out, "w{}: {key}@{t} noted at node {}", self.writes, at.unwrap_or(0))?;
                // Landing from the other site: not relayed.
                let n = at.unwrap_or(0);
                let topology = self.topology()?.clone();
                let mut next = Outbox::new();
                let dr = self.nodes.get_mut(&n).ok_or("that node is down")?;
                dr.step(GeoMsg::Note { origin: 0, notes: vec![note] }, false, Some(0), &topology, self.now, &mut next);
                self.logs.entry(n).or_default().extend(dr.take_log());
                self.settle(next, *lose, &mut out)?;
            }
            Command::Applied { ts: t } => {
                for dr in self.nodes.values_mut() {
                    dr.prune(ts(*t));
                }
            }
            Command::Crash(n) => {
                self.nodes.remove(n).ok_or("no such live node")?;
                self.topology.as_mut().expect("a backup").admitted.remove(n);
            }
            Command::Restart(n, empty) => {
                let incarnation = self.topology.as_ref().expect("a backup").admitted.values().max().copied().unwrap_or(1) + 1;
                let mut dr = Dr::new(PAIR, 1, *n, incarnation, &self.replicas);
                if *empty {
                    self.logs.remove(n);
                }
                let log = self.logs.get(n).cloned().unwrap_or_default();
                if !log.is_empty() {
                    dr.recovered(log.contains(&LogRecord::NotesWhole));
                }
                for record in log {
                    match record {
                        LogRecord::Noted { notes } => dr.restore_notes(notes),
                        LogRecord::Lost { keys } => dr.restore(keys),
                        LogRecord::NotesWhole => {}
                        LogRecord::FailingOver => dr.restore_frozen(),
                        other => return Err(format!("unexpected {other:?}").into()),
                    }
                }
                self.topology.as_mut().expect("a backup").admitted.insert(*n, incarnation);
                let mut next = Outbox::new();
                dr.admitted(&self.topology()?.clone(), self.now, &mut next);
                self.logs.entry(*n).or_default().extend(dr.take_log());
                self.nodes.insert(*n, dr);
                self.settle(next, None, &mut out)?;
            }
            Command::Failover { at, force } => {
                let topology = self.topology()?.clone();
                let mut next = Outbox::new();
                let dr = self.nodes.get_mut(at).ok_or("that node is down")?;
                dr.start_failover(OpId { client: OPERATOR, seq: 1 }, *force, &topology, self.now, &mut next);
                self.settle(next, None, &mut out)?;
            }
            Command::Tick { ms } => {
                self.now += ms.unwrap_or(1_000);
                let topology = self.topology()?.clone();
                let mut next = Outbox::new();
                for dr in self.nodes.values_mut() {
                    dr.tick(&topology, self.now, &mut next);
                }
                self.settle(next, None, &mut out)?;
            }
            Command::Status => {
                for (n, dr) in &self.nodes {
                    let s = dr.status();
                    let (lost, _) = dr.missing(b"", 100, |_, _| true);
                    let lost: Vec<String> =
                        lost.iter().map(|(k, v)| format!("{}@{}", String::from_utf8_lossy(k), v.ts.physical_ms())).collect();
                    let lost = match s.lost {
                        Some(_) => format!(", refuses [{}]", lost.join(" ")),
                        None => String::new(),
                    };
                    let whole = if s.whole { "" } else { " (not whole)" };
                    writeln!(out, "node {n}: {} notes{whole}{lost}", s.unfinished)?;
                }
            }
        }
        Ok(out)
    }
}

#[test]
fn dr_stories() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/dr_stories");
    let mut scripts: Vec<_> = std::fs::read_dir(&dir).expect("tests/dr_stories").map(|e| e.expect("entry").path()).collect();
    scripts.sort();
    assert!(!scripts.is_empty());
    for script in scripts {
        eprintln!("{}", script.display());
        goldenscript::run(&mut Story::default(), &script).unwrap_or_else(|e| panic!("{}: {e}", script.display()));
    }
}
