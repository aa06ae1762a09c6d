//! Geo-replication told as stories (goldenscript, like `scenarios.rs`):
//! the real stabilizer replicas, partition reporters and receiver of
//! `core::geo`, driven message by message. Each file in tests/geo_stories
//! is a script with the expected output below each `---`;
//! `UPDATE_GOLDENFILES=1 cargo test -p causeway-sim --test geo_stories`
//! rewrites them, and the diff is read like a test failure.
//!
//! Times are milliseconds; `10` is the timestamp 10.0 of a hybrid clock.
//!
//! Site 0's stabilizer, shipping to site 1:
//!
//! * `stabilizer replicas=N partitions=P`: replicas 1..=N, one reporter per
//!   partition (a chain's tail) reporting to all of them.
//! * `write 0@10 1@12 ...`: partition p's tail records an update at ts.
//! * `promise 1@15 ...`: partition p promises nothing more at or below ts.
//! * `report [lose=R]`: every reporter sends its batches; those to replica
//!   R are lost. Replicas acknowledge to the reporters.
//! * `leader N`: the coordinator names replica N leader (a new term).
//! * `crash N`: replica N stops for good.
//! * `tick [ms=MS] [lose=true]`: time passes, every live replica ticks; what
//!   the leader ships to site 1 is printed, then taken by site 1 (unless
//!   lost), which acknowledges it to every live replica as received and
//!   applied. Site 1 takes a shipment only if it continues its stream, and
//!   prints the ids it takes (so an id lost or shown twice shows in the
//!   expected output).
//! * `status`: each live replica's stable time, ids held and role.
//!
//! Site 2's receiver, applying updates of sites 0 and 1:
//!
//! * `receiver`: a new receiver for site 2 of sites 0, 1, 2.
//! * `ship from=S partition=P ts=T vv=A/B/C`: the next id of site S's
//!   stream (stable time T), with its vector.
//! * `value from=S partition=P ts=T key=K value=V`: its value, from the
//!   sibling partition.
//! * `stable from=S partition=P ts=T`: the local chain reports the remote
//!   update stable.
//!
//! After a receiver command, every write it hands to a local head and its
//! site time are printed.

use bytes::Bytes;
use causeway_core::geo::receiver::{Receiver, ReceiverMsg, ReceiverOut, RemoteValue};
use causeway_core::geo::reporter::{Batch, Reporter};
use causeway_core::geo::stabilizer::{IdVector, Position, ReplicaId, Ship, SiteAck, Stabilizer, StabilizerMsg, StabilizerOut, UpdateId};
use causeway_core::hlc::Timestamp;
use causeway_core::ring::PartitionId;
use causeway_core::version::{SiteId, VersionVector};
use std::collections::BTreeMap;
use std::error::Error;
use std::fmt::Write as _;
use std::path::Path;

#[derive(goldenscript::Command)]
enum Command {
    Stabilizer {
        #[arg(key)]
        replicas: ReplicaId,
        #[arg(key)]
        partitions: PartitionId,
    },
    Write(Vec<String>),
    Promise(Vec<String>),
    Report {
        #[arg(key)]
        lose: Option<ReplicaId>,
    },
    Leader(ReplicaId),
    Crash(ReplicaId),
    Tick {
        #[arg(key)]
        ms: Option<u64>,
        #[arg(key)]
        lose: Option<bool>,
    },
    Status,
    Receiver,
    Ship {
        #[arg(key)]
        from: SiteId,
        #[arg(key)]
        partition: PartitionId,
        #[arg(key)]
        ts: u64,
        #[arg(key)]
        vv: String,
    },
    Value {
        #[arg(key)]
        from: SiteId,
        #[arg(key)]
        partition: PartitionId,
        #[arg(key)]
        ts: u64,
        #[arg(key)]
        key: String,
        #[arg(key)]
        value: String,
    },
    Stable {
        #[arg(key)]
        from: SiteId,
        #[arg(key)]
        partition: PartitionId,
        #[arg(key)]
        ts: u64,
    },
}

const ORIGIN: SiteId = 0;
const DEST: SiteId = 1;
const RECEIVING: SiteId = 2;

fn ts(ms: u64) -> Timestamp {
    Timestamp::new(ms, 0)
}

/// `10` for 10.0, `10.3` for a logical 3, `20-` for the time just before
/// 20 (everything below 20).
fn show(t: Timestamp) -> String {
    match t.logical() {
        0 => t.physical_ms().to_string(),
        Timestamp::MAX_LOGICAL => format!("{}-", t.physical_ms() + 1),
        l => format!("{}.{l}", t.physical_ms()),
    }
}

fn show_position(p: Position) -> String {
    match p.partition {
        PartitionId::MAX => format!("through {}", show(p.ts)),
        part => format!("p{part}@{}", show(p.ts)),
    }
}

/// `p@ts` pairs.
fn pairs(args: &[String]) -> Result<Vec<(PartitionId, u64)>, Box<dyn Error>> {
    args.iter()
        .map(|a| {
            let (p, t) = a.split_once('@').ok_or_else(|| format!("{a}: want partition@ts"))?;
            Ok((p.parse()?, t.parse()?))
        })
        .collect()
}

/// Site 1's end of site 0's stream: like the receiver, it takes a shipment
/// only if it continues what it has, and from it only what is new.
#[derive(Default)]
struct Stream {
    received: Position,
}

impl Stream {
    fn take(&mut self, ship: &Ship, out: &mut String) -> Result<(), Box<dyn Error>> {
        if ship.prev > self.received {
            let (prev, has) = (show_position(ship.prev), show_position(self.received));
            writeln!(out, "site 1 refuses it: it continues from {prev}, site 1 has {has}")?;
            return Ok(());
        }
        if ship.ids.windows(2).any(|w| w[0].position() >= w[1].position()) {
            return Err("a shipment out of stream order".into());
        }
        let (old, new): (Vec<&UpdateId>, Vec<&UpdateId>) = ship.ids.iter().partition(|id| id.position() <= self.received);
        self.received = new.last().map_or(self.received, |id| id.position()).max(ship.through);
        let took: Vec<String> = new.iter().map(|id| show_position(id.position())).collect();
        let again = if old.is_empty() { String::new() } else { format!(" ({} already here)", old.len()) };
        writeln!(out, "site 1 takes [{}]{again}, has the stream {}", took.join(" "), show_position(self.received))?;
        Ok(())
    }
}

#[derive(Default)]
struct Story {
    now: u64,
    replicas: BTreeMap<ReplicaId, Stabilizer>,
    reporters: Vec<Reporter<ReplicaId, UpdateId>>,
    term: u64,
    site1: Stream,
    receiver: Option<Receiver>,
    /// Per origin: the stream position shipped so far; per value stream,
    /// the last value's ts.
    shipped: BTreeMap<SiteId, Position>,
    valued: BTreeMap<(SiteId, PartitionId), Timestamp>,
}

impl Story {
    fn reporter(&mut self, p: PartitionId) -> Result<&mut Reporter<ReplicaId, UpdateId>, Box<dyn Error>> {
        self.reporters.get_mut(p as usize).ok_or_else(|| format!("no partition {p}").into())
    }

    fn stabilizer_outs(&mut self, from: ReplicaId, outs: Vec<StabilizerOut>, lose: bool, out: &mut String) -> Result<(), Box<dyn Error>> {
        for o in outs {
            match o {
                StabilizerOut::IdsAck(ack) => ack.deliver(&mut self.reporters[ack.partition as usize], self.now),
                StabilizerOut::Ship(ship) => {
                    let ids: Vec<String> = ship.ids.iter().map(|id| show_position(id.position())).collect();
                    writeln!(
                        out,
                        "r{from} ships [{}] {} to site 1{}",
                        ids.join(" "),
                        show_position(ship.through),
                        if lose { ", lost" } else { "" }
                    )?;
                    if lose {
                        continue;
                    }
                    self.site1.take(&ship, out)?;
                    let received = self.site1.received;
                    let ack = SiteAck { from: DEST, origin: ORIGIN, received, applied: received, visible: received, resend: false };
                    for r in self.replicas.values_mut() {
                        r.step(StabilizerMsg::SiteAck(ack), self.now, &mut Vec::new());
                    }
                }
            }
        }
        Ok(())
    }

    fn receive(&mut self, msg: ReceiverMsg, out: &mut String) -> Result<(), Box<dyn Error>> {
        let receiver = self.receiver.as_mut().ok_or("no receiver: run `receiver` first")?;
        let mut outs = Vec::new();
        receiver.step(msg, &mut outs);
        for o in outs {
            if let ReceiverOut::Apply(w) = o {
                let value = w.value.as_ref().map(|v| String::from_utf8_lossy(v).into_owned()).unwrap_or_default();
                let key = String::from_utf8_lossy(&w.key);
                writeln!(out, "apply {key}={value} (site {} p{}@{}) at the local head", w.version.site, w.partition, show(w.version.ts))?;
            }
        }
        let time: Vec<String> = receiver.applied().0.iter().map(|&t| show(t)).collect();
        writeln!(out, "site time [{}]", time.join(" "))?;
        Ok(())
    }
}

impl goldenscript::Runner for Story {
    type Command = Command;

    fn run(&mut self, command: &Command, _: &goldenscript::Context) -> Result<String, Box<dyn Error>> {
        let mut out = String::new();
        match command {
            Command::Stabilizer { replicas, partitions } => {
                let ids: Vec<ReplicaId> = (1..=*replicas).collect();
                self.replicas = ids.iter().map(|&r| (r, Stabilizer::new(ORIGIN, r, *partitions, &[ORIGIN, DEST]))).collect();
                self.reporters = (0..*partitions).map(|p| Reporter::new(p, &ids)).collect();
            }
            Command::Write(args) => {
                for (p, t) in pairs(args)? {
                    let id = UpdateId { partition: p, ts: ts(t), local_dep: ts(t).just_before(), vv: IdVector::from_elem(ts(t), 1) };
                    if !self.reporter(p)?.record(id) {
                        return Err(format!("p{p}@{t} is not after what p{p} reported or promised").into());
                    }
                }
            }
            Command::Promise(args) => {
                for (p, t) in pairs(args)? {
                    self.reporter(p)?.promise(ts(t));
                }
            }
            Command::Report { lose } => {
                self.now += 1;
                let mut batches = Vec::new();
                for r in &mut self.reporters {
                    r.tick(self.now, &mut batches);
                }
                for (to, batch) in batches {
                    let ids: Vec<String> = batch.items.iter().map(|id| show(id.ts)).collect();
                    let fate = match (Some(to) == *lose, self.replicas.contains_key(&to)) {
                        (true, _) => ", lost",
                        (false, false) => ", to a crashed replica",
                        (false, true) => "",
                    };
                    writeln!(out, "p{} -> r{to}: [{}] up to {}{fate}", batch.partition, ids.join(" "), show(batch.up_to))?;
                    if !fate.is_empty() {
                        continue;
                    }
                    let mut outs = Vec::new();
                    self.replicas.get_mut(&to).expect("live").step(StabilizerMsg::Ids(batch), self.now, &mut outs);
                    self.stabilizer_outs(to, outs, false, &mut out)?;
                }
            }
            Command::Leader(leader) => {
                self.term += 1;
                for r in self.replicas.values_mut() {
                    r.step(StabilizerMsg::Leader { leader: *leader, term: self.term }, self.now, &mut Vec::new());
                }
            }
            Command::Crash(r) => {
                self.replicas.remove(r).ok_or_else(|| format!("no live replica {r}"))?;
            }
            Command::Tick { ms, lose } => {
                self.now += ms.unwrap_or(1);
                let ids: Vec<ReplicaId> = self.replicas.keys().copied().collect();
                for r in ids {
                    let mut outs = Vec::new();
                    self.replicas.get_mut(&r).expect("live").tick(self.now, &mut outs);
                    self.stabilizer_outs(r, outs, lose.unwrap_or(false), &mut out)?;
                }
            }
            Command::Status => {
                for (id, r) in &self.replicas {
                    let role = if r.is_leader() { "leader" } else { "follower" };
                    writeln!(out, "r{id}: {role}, stable time {}, holds {} ids", show(r.stable_time()), r.held())?;
                }
                writeln!(out, "site 1 has the stream {}", show_position(self.site1.received))?;
            }
            Command::Receiver => {
                self.receiver = Some(Receiver::new(RECEIVING, &[0, 1, 2], &VersionVector::default()));
            }
            Command::Ship { from, partition, ts: t, vv } => {
                let vv: IdVector = vv.split('/').map(|t| t.parse().map(ts)).collect::<Result<_, _>>()?;
                let id = UpdateId { partition: *partition, ts: ts(*t), local_dep: ts(*t).just_before(), vv };
                let prev = self.shipped.get(from).copied().unwrap_or(Position::START);
                let through = Position::through(ts(*t));
                self.shipped.insert(*from, through);
                let ship = Ship { origin: *from, to: RECEIVING, prev, ids: vec![id], through, applied: Position::START };
                self.receive(ReceiverMsg::Ship(ship), &mut out)?;
            }
            Command::Value { from, partition, ts: t, key, value } => {
                let prev = self.valued.insert((*from, *partition), ts(*t)).unwrap_or(Timestamp::ZERO);
                let value = RemoteValue {
                    origin: *from,
                    partition: *partition,
                    ts: ts(*t),
                    key: Bytes::from(key.clone()),
                    value: Some(Bytes::from(value.clone())),
                    expires_at_ms: None,
                };
                let batch = Batch { partition: *partition, prev, items: vec![value], up_to: ts(*t) };
                self.receive(ReceiverMsg::Values { origin: *from, batch }, &mut out)?;
            }
            Command::Stable { from, partition, ts: t } => {
                self.receive(ReceiverMsg::Applied { origin: *from, partition: *partition, ts: ts(*t) }, &mut out)?;
            }
        }
        Ok(out)
    }
}

#[test]
fn geo_stories() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/geo_stories");
    let mut scripts: Vec<_> = std::fs::read_dir(&dir).expect("tests/geo_stories").map(|e| e.expect("entry").path()).collect();
    scripts.sort();
    assert!(!scripts.is_empty());
    for script in scripts {
        eprintln!("{}", script.display());
        goldenscript::run(&mut Story::default(), &script).unwrap_or_else(|e| panic!("{}: {e}", script.display()));
    }
}
