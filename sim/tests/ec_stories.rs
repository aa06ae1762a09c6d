//! Erasure-coded groups told as stories (goldenscript, like
//! `dr_stories.rs`): the real `core::ec::Member`s of one group, every
//! message delivered by hand, so the paper's sequences (a SET through the
//! group, the preparation after a data member is lost, the race between a
//! SET and a page repair) can be followed step by step. Each file in
//! tests/ec_stories is a script with the expected output below each `---`;
//! `UPDATE_GOLDENFILES=1 cargo test -p causeway-sim --test ec_stories`
//! rewrites them.
//!
//! * `group k=K m=M`: a new group, slots 0..K data, K..K+M parity.
//! * `put slot=S key=K value=V [px=MS]` / `del slot=S key=K` /
//!   `get slot=S key=K` / `expire slot=S key=K px=MS`: a client's request
//!   to the member serving data slot S (an expiry is MS after the story's
//!   time).
//! * `deliver [from=A] [to=B] [count=N]`: the first message of each link
//!   from A to B (any, if not given), link by link, until none is left (or
//!   N were delivered); prints each and what clients are answered.
//! * `drop from=A [to=B]`: the messages on those links are lost.
//! * `crash S`: member S stops (what it sent stays on the links).
//! * `reconfigure`: the coordinator's next configuration, without the
//!   crashed members, reaches every live member.
//! * `tick [ms=N]`: N ms (10) pass on every live member (background
//!   repair, resends, expiry).
//! * `status`: every live member's slots and parity.
//! * `check`: every parity page is the code of the data pages.

use bytes::Bytes;
use causeway_core::ec::code::Code;
use causeway_core::ec::member::OWN_OP;
use causeway_core::ec::{Config, EcMsg, Member, Out, PutReq, Reply, Slot};
use causeway_core::message::{Change, Condition, Expiry, NewValue};
use causeway_sim::ec::{check_stripes, describe};
use std::collections::{BTreeMap, VecDeque};
use std::error::Error;
use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;

#[derive(goldenscript::Command)]
enum Command {
    Group {
        #[arg(key)]
        k: u8,
        #[arg(key)]
        m: u8,
    },
    Put {
        #[arg(key)]
        slot: Slot,
        #[arg(key)]
        key: String,
        #[arg(key)]
        value: String,
        #[arg(key)]
        px: Option<u64>,
    },
    Expire {
        #[arg(key)]
        slot: Slot,
        #[arg(key)]
        key: String,
        #[arg(key)]
        px: u64,
    },
    Del {
        #[arg(key)]
        slot: Slot,
        #[arg(key)]
        key: String,
    },
    Get {
        #[arg(key)]
        slot: Slot,
        #[arg(key)]
        key: String,
    },
    Deliver {
        #[arg(key)]
        from: Option<Slot>,
        #[arg(key)]
        to: Option<Slot>,
        #[arg(key)]
        count: Option<usize>,
    },
    Drop {
        #[arg(key)]
        from: Slot,
        #[arg(key)]
        to: Option<Slot>,
    },
    Crash(Slot),
    Reconfigure,
    Tick {
        #[arg(key)]
        ms: Option<u64>,
    },
    Status,
    Check,
}

#[derive(Default)]
struct Story {
    code: Option<Arc<Code>>,
    config: Option<Config>,
    members: Vec<Option<Member>>,
    links: BTreeMap<(Slot, Slot), VecDeque<EcMsg>>,
    ops: u64,
    /// Each `tick` is 10 ms later.
    now: u64,
}

impl Story {
    fn member(&mut self, slot: Slot) -> Result<&mut Member, Box<dyn Error>> {
        self.members.get_mut(slot as usize).and_then(|m| m.as_mut()).ok_or_else(|| format!("member {slot} is down").into())
    }

    /// Takes member `slot`'s output onto the links; prints the answers.
    fn flush(&mut self, slot: Slot, text: &mut String) -> Result<(), Box<dyn Error>> {
        for out in self.member(slot)?.drain() {
            match out {
                Out::Send { to, msg } => self.links.entry((slot, to)).or_default().push_back(msg),
                Out::Reply { op, reply } => {
                    let what = match reply {
                        Reply::Done { version: Some(version), .. } => format!("done v{version}"),
                        Reply::Done { version: None, .. } => "not written".to_string(),
                        Reply::Value(None) => "nil".to_string(),
                        Reply::Value(Some((v, version, None))) => format!("{:?} v{version}", String::from_utf8_lossy(&v)),
                        Reply::Value(Some((v, version, Some(at)))) => format!("{:?} v{version} until {at}", String::from_utf8_lossy(&v)),
                        Reply::NotHere => "not here".to_string(),
                    };
                    match op {
                        OWN_OP => writeln!(text, "the member's own write: {what}")?,
                        op => writeln!(text, "op {op}: {what}")?,
                    }
                }
            }
        }
        Ok(())
    }

    /// A read (`None`), or a write of `change` to `key` in data `slot`.
    fn request(&mut self, slot: Slot, key: &str, change: Option<Change>, text: &mut String) -> Result<(), Box<dyn Error>> {
        self.ops += 1;
        let op = self.ops;
        let to = self.config.as_ref().ok_or("no group")?.acting(slot).ok_or("nobody serves that slot")?;
        let key = Bytes::from(key.to_string());
        let now = self.now;
        let m = self.member(to)?;
        m.advance(now);
        match change {
            Some(change) => m.write(op, slot, PutReq { key, change, version: op, id: None }),
            None => m.get(op, slot, key),
        }
        writeln!(text, "op {op} at member {to}")?;
        self.flush(to, text)
    }
}

impl goldenscript::Runner for Story {
    type Command = Command;

    fn run(&mut self, command: &Command, _: &goldenscript::Context) -> Result<String, Box<dyn Error>> {
        let mut out = String::new();
        match command {
            Command::Group { k, m } => {
                let code = Arc::new(Code::new(*k as usize, *m as usize)?);
                let config = Config::new(*k, *m);
                self.members = (0..k + m).map(|s| Some(Member::new(s, code.clone(), config.clone()))).collect();
                self.code = Some(code);
                self.config = Some(config);
                self.links.clear();
            }
            Command::Put { slot, key, value, px } => {
                let expiry = px.map_or(Expiry::Never, Expiry::After);
                self.request(*slot, key, Some(Change { expiry, ..Change::set(Bytes::from(value.clone())) }), &mut out)?
            }
            Command::Expire { slot, key, px } => {
                let change = Change { value: NewValue::Keep, expiry: Expiry::After(*px), condition: Condition::Always, get: false };
                self.request(*slot, key, Some(change), &mut out)?
            }
            Command::Del { slot, key } => {
                self.request(*slot, key, Some(Change { condition: Condition::Always, ..Change::delete() }), &mut out)?
            }
            Command::Get { slot, key } => self.request(*slot, key, None, &mut out)?,
            Command::Deliver { from, to, count } => {
                let mut n = 0;
                loop {
                    let due: Vec<(Slot, Slot)> = self
                        .links
                        .iter()
                        .filter(|((f, t), q)| !q.is_empty() && from.is_none_or(|x| x == *f) && to.is_none_or(|x| x == *t))
                        .map(|(l, _)| *l)
                        .collect();
                    if due.is_empty() || count.is_some_and(|c| n >= c) {
                        break;
                    }
                    for (f, t) in due {
                        if count.is_some_and(|c| n >= c) {
                            break;
                        }
                        let msg = self.links.get_mut(&(f, t)).and_then(|q| q.pop_front()).expect("due");
                        n += 1;
                        if self.members[t as usize].is_none() {
                            writeln!(out, "{f} -> {t}: {} (down)", describe(&msg))?;
                            continue;
                        }
                        writeln!(out, "{f} -> {t}: {}", describe(&msg))?;
                        self.member(t)?.step(f, msg);
                        self.flush(t, &mut out)?;
                    }
                }
            }
            Command::Drop { from, to } => {
                for ((f, t), q) in self.links.iter_mut() {
                    if f == from && to.is_none_or(|x| x == *t) {
                        for msg in q.drain(..) {
                            writeln!(out, "{f} -> {t}: {} (lost)", describe(&msg))?;
                        }
                    }
                }
            }
            Command::Crash(slot) => {
                self.members[*slot as usize].take().ok_or("already down")?;
                for ((_, t), q) in self.links.iter_mut() {
                    if t == slot {
                        q.clear();
                    }
                }
            }
            Command::Reconfigure => {
                let mut config = self.config.clone().ok_or("no group")?;
                for (s, m) in self.members.iter().enumerate() {
                    if m.is_none() && config.alive[s] {
                        config = config.without(s as Slot);
                    }
                }
                writeln!(out, "epoch {}: lost {:?}, leader {:?}", config.epoch, config.lost(), config.leader())?;
                self.config = Some(config.clone());
                for s in 0..self.members.len() as Slot {
                    if let Some(m) = self.members[s as usize].as_mut() {
                        m.reconfigure(config.clone());
                        self.flush(s, &mut out)?;
                    }
                }
            }
            Command::Tick { ms } => {
                self.now += ms.unwrap_or(10);
                for s in 0..self.members.len() as Slot {
                    if let Some(m) = self.members[s as usize].as_mut() {
                        m.tick(self.now);
                        self.flush(s, &mut out)?;
                    }
                }
            }
            Command::Status => {
                for (s, m) in self.members.iter().enumerate() {
                    match m {
                        Some(m) => {
                            for line in m.status() {
                                writeln!(out, "member {s}: {line}")?;
                            }
                        }
                        None => writeln!(out, "member {s}: down")?,
                    }
                }
            }
            Command::Check => {
                let config = self.config.as_ref().ok_or("no group")?;
                let (k, m) = (config.k, config.m);
                let holder = |s: Slot| config.acting(s).and_then(|a| self.members[a as usize].as_ref());
                let pages = (0..k + m)
                    .filter_map(|s| holder(s.min(k - 1)).map(|h| h.pages(s)).max(self.members[s as usize].as_ref().map(|p| p.pages(s))))
                    .max()
                    .unwrap_or(0);
                let mut stripes = Vec::new();
                for page in 0..pages {
                    let mut row = Vec::new();
                    for s in 0..k {
                        row.push(Some(holder(s).and_then(|h| h.page(s, page)).ok_or(format!("page {page} of slot {s} is not here"))?));
                    }
                    for p in k..k + m {
                        row.push(self.members[p as usize].as_ref().and_then(|m| m.page(p, page)));
                    }
                    stripes.push(row);
                }
                check_stripes(self.code.as_ref().ok_or("no group")?, &stripes)?;
                writeln!(out, "{pages} pages: every parity page is the code of the data pages")?;
            }
        }
        Ok(out)
    }
}

#[test]
fn stories() -> Result<(), Box<dyn Error>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/ec_stories");
    let mut files: Vec<_> = std::fs::read_dir(&dir)?.map(|e| e.map(|e| e.path())).collect::<Result<_, _>>()?;
    files.sort();
    for path in files {
        goldenscript::run(&mut Story::default(), &path)?;
    }
    Ok(())
}
