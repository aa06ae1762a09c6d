//! A simulated erasure-coded group: the real `core::ec::Member`s of one
//! K+M group over FIFO links with seeded delays, one thread, one clock.
//!
//! * Links keep order (TCP does); each message is delayed at random, never
//!   before the one sent ahead of it on its link; one member's links may
//!   be slower than the rest (`slow`).
//! * `crash(slot)`: the member stops; of what it had sent, a random prefix
//!   of each link still arrives (bytes already on the wire), the rest is
//!   lost, and so is everything sent to it.
//! * The coordinator notices a crash `detect_ms` later and pushes the next
//!   configuration to every live member (`Config::without`).
//! * Clients hand requests to the member serving the key's data slot (as
//!   the configuration says); a `NotHere` is sent again to the new one.

use crate::Rng;
use bytes::Bytes;
use causeway_core::ec::area::PAGE;
use causeway_core::ec::code::Code;
use causeway_core::ec::{Config, EcMsg, Member, Memory, Out, Reply, Slot};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

pub struct EcWorld {
    pub config: Config,
    code: Arc<Code>,
    members: Vec<Option<Member>>,
    links: BTreeMap<(Slot, Slot), VecDeque<(u64, EcMsg)>>,
    now: u64,
    rng: Rng,
    pub min_delay_ms: u64,
    pub max_delay_ms: u64,
    pub detect_ms: u64,
    /// A member whose messages all take this much longer (a slow link).
    pub slow: Option<(Slot, u64)>,
    detections: Vec<(u64, Slot)>,
    /// Requests answered `NotHere`, to send again at the time given.
    resend: Vec<(u64, Request)>,
    /// Every message delivered, by kind (for the stories and the counts).
    pub delivered: BTreeMap<&'static str, u64>,
    /// Messages delivered, printed, when `trace` is on (the stories).
    pub trace: Option<Vec<String>>,
}

#[derive(Clone, Debug)]
pub enum Request {
    Put { op: u64, key: Bytes, value: Option<Bytes> },
    Get { op: u64, key: Bytes },
}

impl EcWorld {
    pub fn new(seed: u64, k: u8, m: u8) -> EcWorld {
        let code = Arc::new(Code::new(k as usize, m as usize).expect("a valid code"));
        let config = Config::new(k, m);
        let members = (0..k + m).map(|s| Some(Member::new(s, code.clone(), config.clone()))).collect();
        EcWorld {
            config,
            code,
            members,
            links: BTreeMap::new(),
            now: 0,
            rng: Rng::new(seed),
            min_delay_ms: 1,
            max_delay_ms: 4,
            detect_ms: 40,
            slow: None,
            detections: Vec::new(),
            resend: Vec::new(),
            delivered: BTreeMap::new(),
            trace: None,
        }
    }

    pub fn now(&self) -> u64 {
        self.now
    }

    /// The data slot a key belongs to.
    pub fn slot_of(&self, key: &[u8]) -> Slot {
        (xxhash(key) % self.config.k as u64) as Slot
    }

    pub fn member(&self, slot: Slot) -> Option<&Member> {
        self.members[slot as usize].as_ref()
    }

    pub fn submit(&mut self, req: Request) -> Vec<(u64, Reply)> {
        let key = match &req {
            Request::Put { key, .. } | Request::Get { key, .. } => key.clone(),
        };
        let slot = self.slot_of(&key);
        let Some(to) = self.config.acting(slot) else {
            self.resend.push((self.now + 5, req));
            return Vec::new();
        };
        let Some(m) = self.members[to as usize].as_mut() else {
            // Crashed, not yet noticed: the request is lost with it.
            return Vec::new();
        };
        match req {
            Request::Put { op, key, value } => m.put(op, slot, key, value, op),
            Request::Get { op, key } => m.get(op, slot, key),
        }
        self.flush(to)
    }

    /// Runs `ms` milliseconds; returns the replies clients got.
    pub fn run(&mut self, ms: u64) -> Vec<(u64, Reply)> {
        let mut replies = Vec::new();
        for _ in 0..ms {
            self.now += 1;
            let now = self.now;
            let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.detections).into_iter().partition(|(at, _)| *at <= now);
            self.detections = later;
            for (_, slot) in due {
                self.config = self.config.without(slot);
                replies.extend(self.reconfigure_all());
            }
            let (again, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.resend).into_iter().partition(|(at, _)| *at <= now);
            self.resend = later;
            for (_, req) in again {
                replies.extend(self.submit(req));
            }
            replies.extend(self.deliver_due());
            // A replacement whose parity (or nothing, for a data member) is
            // rebuilt is alive: the coordinator hears it and says so.
            let rebuilt = (0..self.members.len() as Slot)
                .find(|&s| self.config.joining[s as usize] && self.members[s as usize].as_ref().is_some_and(|m| m.rebuilt()));
            if let Some(slot) = rebuilt {
                self.config = self.config.with(slot);
                replies.extend(self.reconfigure_all());
            }
            if now.is_multiple_of(5) {
                for s in 0..self.members.len() {
                    if let Some(m) = self.members[s].as_mut() {
                        m.tick(now);
                        replies.extend(self.flush(s as Slot));
                    }
                }
            }
        }
        replies
    }

    fn deliver_due(&mut self) -> Vec<(u64, Reply)> {
        let mut replies = Vec::new();
        loop {
            let due: Vec<(Slot, Slot)> =
                self.links.iter().filter(|(_, q)| q.front().is_some_and(|(at, _)| *at <= self.now)).map(|(l, _)| *l).collect();
            if due.is_empty() {
                return replies;
            }
            let (from, to) = due[self.rng.below(due.len() as u64) as usize];
            let (_, msg) = self.links.get_mut(&(from, to)).expect("link").pop_front().expect("due");
            let Some(m) = self.members[to as usize].as_mut() else { continue };
            *self.delivered.entry(kind(&msg)).or_default() += 1;
            if let Some(t) = &mut self.trace {
                t.push(format!("{from} -> {to}: {}", describe(&msg)));
            }
            m.step(from, msg);
            replies.extend(self.flush(to));
        }
    }

    /// Takes a member's output: messages onto the links, replies back.
    fn flush(&mut self, from: Slot) -> Vec<(u64, Reply)> {
        let Some(m) = self.members[from as usize].as_mut() else { return Vec::new() };
        let mut replies = Vec::new();
        for out in m.drain() {
            match out {
                Out::Send { to, msg } => {
                    let q = self.links.entry((from, to)).or_default();
                    let mut delay = self.min_delay_ms + self.rng.below(self.max_delay_ms - self.min_delay_ms + 1);
                    if let Some((_, extra)) = self.slow.filter(|(s, _)| *s == from) {
                        delay += extra;
                    }
                    let at = q.back().map_or(0, |(t, _)| *t).max(self.now + delay);
                    q.push_back((at, msg));
                }
                Out::Reply { op, reply } => replies.push((op, reply)),
            }
        }
        replies
    }

    fn reconfigure_all(&mut self) -> Vec<(u64, Reply)> {
        let mut replies = Vec::new();
        for s in 0..self.members.len() {
            if let Some(m) = self.members[s].as_mut() {
                m.reconfigure(self.config.clone());
                replies.extend(self.flush(s as Slot));
            }
        }
        replies
    }

    /// A new, empty member for lost slot `slot` (crashed and noticed):
    /// the coordinator admits it as joining; it is rebuilt, then alive.
    pub fn replace(&mut self, slot: Slot) -> Vec<(u64, Reply)> {
        assert!(self.members[slot as usize].is_none() && !self.config.alive[slot as usize], "replace a lost member");
        self.config = self.config.rejoining(slot);
        self.members[slot as usize] = Some(Member::new(slot, self.code.clone(), self.config.clone()));
        self.reconfigure_all()
    }

    /// Whether `slot` is lost (crashed and noticed), so it can be replaced.
    pub fn is_lost(&self, slot: Slot) -> bool {
        self.members[slot as usize].is_none() && !self.config.alive[slot as usize] && !self.detections.iter().any(|(_, s)| *s == slot)
    }

    /// Member `slot` stops; the coordinator notices `detect_ms` later.
    pub fn crash(&mut self, slot: Slot) {
        if self.members[slot as usize].take().is_none() {
            return;
        }
        for ((from, to), q) in self.links.iter_mut() {
            if *to == slot {
                q.clear();
            } else if *from == slot {
                let keep = self.rng.below(q.len() as u64 + 1) as usize;
                q.truncate(keep);
            }
        }
        self.detections.push((self.now + self.detect_ms, slot));
    }

    /// Nothing in flight and every live member settled.
    pub fn quiet(&self) -> bool {
        self.detections.is_empty()
            && self.resend.is_empty()
            && self.links.values().all(|q| q.is_empty())
            && self.members.iter().flatten().all(|m| m.settled())
    }

    /// Every page of the group, `[page][slot]`: the data pages as the
    /// members serving them hold them, the live parity members' pages
    /// (`None` for a parity member that is down). Call when quiet.
    pub fn stripes(&self) -> Result<Vec<Vec<Option<Vec<u8>>>>, String> {
        let (k, m) = (self.config.k, self.config.m);
        let mut holders = Vec::new();
        for s in 0..k {
            let at = self.config.acting(s).ok_or(format!("data slot {s} has nobody"))?;
            holders.push(self.members[at as usize].as_ref().ok_or(format!("slot {s}'s member {at} is down"))?);
        }
        let parity: Vec<Option<&Member>> =
            (k..k + m).map(|p| self.members[p as usize].as_ref().filter(|_| self.config.alive[p as usize])).collect();
        let pages = holders
            .iter()
            .enumerate()
            .map(|(s, h)| h.pages(s as Slot))
            .chain(parity.iter().enumerate().map(|(j, p)| p.map_or(0, |p| p.pages(k + j as Slot))))
            .max()
            .unwrap_or(0);
        let mut stripes = Vec::new();
        for page in 0..pages {
            let mut row = Vec::new();
            for (s, h) in holders.iter().enumerate() {
                row.push(Some(h.page(s as Slot, page).ok_or(format!("page {page} of slot {s} not repaired"))?));
            }
            for (j, p) in parity.iter().enumerate() {
                row.push(p.and_then(|p| p.page(k + j as Slot, page)));
            }
            stripes.push(row);
        }
        Ok(stripes)
    }

    pub fn code(&self) -> &Code {
        &self.code
    }

    pub fn memory(&self) -> Vec<Option<Memory>> {
        self.members.iter().map(|m| m.as_ref().map(|m| m.memory())).collect()
    }
}

fn xxhash(key: &[u8]) -> u64 {
    // FNV-1a: deterministic and dependency-free.
    key.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

pub fn kind(msg: &EcMsg) -> &'static str {
    match msg {
        EcMsg::Update { .. } => "update",
        EcMsg::Ack { .. } => "ack",
        EcMsg::Commit { .. } => "commit",
        EcMsg::Prepare { .. } => "prepare",
        EcMsg::Received { .. } => "received",
        EcMsg::Stable { .. } => "stable",
        EcMsg::Prepared { .. } => "prepared",
        EcMsg::Cut { .. } => "cut",
        EcMsg::Marker { .. } => "marker",
        EcMsg::Pages { .. } => "pages",
        EcMsg::Join { .. } => "join",
        EcMsg::Stale { .. } => "stale",
        EcMsg::State { .. } => "state",
    }
}

/// Every stripe's parity is the code of its data pages: the parity
/// members hold exactly the updates the data areas hold.
pub fn check_stripes(code: &Code, stripes: &[Vec<Option<Vec<u8>>>]) -> Result<(), String> {
    let (k, m) = (code.k(), code.m());
    for (page, row) in stripes.iter().enumerate() {
        let mut shards: Vec<Vec<u8>> = row[..k].iter().map(|d| d.clone().expect("data pages are all there")).collect();
        shards.extend((0..m).map(|_| vec![0u8; PAGE]));
        code.encode(&mut shards)?;
        for j in 0..m {
            if let Some(p) = &row[k + j] {
                if p[..] != shards[k + j][..] {
                    return Err(format!("parity slot {} page {page} is not the code of the data pages{}", k + j, culprit(code, row)));
                }
            }
        }
    }
    Ok(())
}

/// Which one data page of a stripe that does not check out would make it
/// check out if it were decoded from the others (when all parity is there).
fn culprit(code: &Code, row: &[Option<Vec<u8>>]) -> String {
    let (k, m) = (code.k(), code.m());
    if row[k..].iter().any(|p| p.is_none()) {
        return String::new();
    }
    for s in 0..k {
        let mut shards: Vec<Option<Vec<u8>>> = row.to_vec();
        shards[s] = None;
        shards[k + m - 1] = None;
        if code.reconstruct_data(&mut shards).is_err() {
            continue;
        }
        let mut all: Vec<Vec<u8>> = shards[..k].iter().map(|d| d.clone().expect("decoded")).collect();
        all.extend((0..m).map(|_| vec![0u8; PAGE]));
        if code.encode(&mut all).is_ok() && (0..m).all(|j| row[k + j].as_deref() == Some(&all[k + j][..])) {
            return format!(" (data slot {s}'s page is not what the parity says)");
        }
    }
    String::new()
}

/// One line for a message, for the stories.
pub fn describe(msg: &EcMsg) -> String {
    let st = |s: &causeway_core::ec::Stamp| format!("{}.{}", s.epoch, s.seq);
    let stamps = |v: &[(Slot, causeway_core::ec::Stamp)]| v.iter().map(|(s, t)| format!("{s}@{}", st(t))).collect::<Vec<_>>().join(",");
    match msg {
        EcMsg::Update { slot, stamp, key, version, diffs, .. } if causeway_core::message::ec::gives_back(key, *version) => {
            let pages: Vec<u64> = diffs.iter().map(|d| d.at / causeway_core::ec::area::PAGE as u64).collect();
            format!("Update slot={slot} stamp={} gives back pages {pages:?}", st(stamp))
        }
        EcMsg::Update { slot, stamp, key, meta, diffs, .. } => format!(
            "Update slot={slot} stamp={} key={} loc={} diff={}B",
            st(stamp),
            String::from_utf8_lossy(key),
            meta.map_or("deleted".into(), |m| format!(
                "{}+{}{}",
                m.loc.at,
                m.loc.len,
                m.expires_at().map_or(String::new(), |at| format!(" until {at}"))
            )),
            diffs.iter().map(|d| d.bytes.len()).sum::<usize>()
        ),
        EcMsg::Ack { slot, stamp } => format!("Ack slot={slot} stamp={}", st(stamp)),
        EcMsg::Commit { slot, stamp } => format!("Commit slot={slot} stamp={}", st(stamp)),
        EcMsg::Prepare { epoch, slots } => format!("Prepare epoch={epoch} slots={slots:?}"),
        EcMsg::Received { epoch, stamps: s } => {
            let (got, sources): (Vec<(Slot, causeway_core::ec::Stamp)>, Vec<u64>) = s.iter().map(|r| ((r.slot, r.last), r.source)).unzip();
            format!("Received epoch={epoch} {} source={sources:?}", stamps(&got))
        }
        EcMsg::Stable { epoch, stamps: s, source } => format!("Stable epoch={epoch} {} source={source}", stamps(s)),
        EcMsg::Prepared { epoch } => format!("Prepared epoch={epoch}"),
        EcMsg::Cut { id, pages, sources, parity, .. } => format!("Cut id={id} pages={pages:?} sources={sources:?} parity={parity:?}"),
        EcMsg::Marker { id, slot, .. } => format!("Marker id={id} slot={slot}"),
        EcMsg::Pages { id, slot, pages, .. } => format!("Pages id={id} slot={slot} pages={}", pages.len()),
        EcMsg::Join { epoch, slot, have } => format!("Join epoch={epoch} slot={slot} have={have}"),
        EcMsg::Stale { epoch, slot } => format!("Stale epoch={epoch} slot={slot}"),
        EcMsg::State { epoch, slot, part, pages, entries, end } => format!(
            "State epoch={epoch} slot={slot} part={part} pages={} keys={}{}",
            pages.len(),
            entries.len(),
            end.as_ref().map_or(String::new(), |e| format!(" end last={}.{} pending={}", e.last.epoch, e.last.seq, e.pending.len()))
        ),
    }
}
