//! Erasure-coded groups in a site (`--redundancy ec:K+M`): which nodes form
//! which groups, and this node's members of them (`Engine`).
//!
//! Layout (`ring::Coding`, the paper's interleaved layout): a site of exactly N = K+M
//! nodes, ids 0..N, has N groups; slot s of group g is node (g + s) % N, so
//! every node is a data member of K groups and a parity member of M, and
//! all do the same work. Partition p belongs to group p % N, data slot
//! (p / N) % K.
//!
//! Who is alive: the group forms when the coordinator's configuration first
//! admits all N nodes, with each node's incarnation then. From then on each
//! node has a `Standing` that only moves forward (`gen`), merged by every
//! engine from the coordinator's configurations and the peers' hellos (once
//! a second):
//! * alive -> lost: the coordinator removed the node, or admitted it again
//!   as another incarnation (a restart: its memory is gone). Any engine
//!   decides it from its configuration.
//! * lost -> joining: the node itself, admitted by the coordinator and told
//!   it was lost (a restarted process, or one paused past the failure
//!   timeout), starts over as a replacement with empty members: its parity
//!   members are rebuilt from every data slot's state (`ec::member`).
//! * joining -> alive: the node itself, once every member is rebuilt; its
//!   data members then take their slots back from the leaders (preparation,
//!   the metadata replica, then page repair by decoding).
//!
//! The configuration's epoch is 1 + the sum of the gens: the same at every
//! node for the same standings, and growing with every change (two changes
//! made at once by different nodes may share an epoch until the standings
//! merge: a member checks who serves a slot, not the epoch alone). A node
//! serves as formed (gen 0) only once a majority has confirmed its
//! incarnation, so a restarted process never serves the empty member it
//! came back with.

use super::code::Code;
use super::member::{Config, Member, Out, PutReq, Reply};
use crate::message::ec::{EcMsg, Slot, Standing, State};
use crate::ring::{Coding, NodeId, PartitionId, Topology};
use bytes::Bytes;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

/// How often an engine tells its peers what it knows.
pub const HELLO_MS: u64 = 1_000;
/// A FLUSHALL's deletes in flight from one node at once.
const FLUSH_WINDOW: usize = 1_024;

/// What the engine wants done: a message to a peer (an EC message of a
/// group, or a client request passed on to the node serving it), or an
/// answer to a client request it took.
#[derive(Debug)]
pub enum Action<R> {
    Send {
        to: NodeId,
        group: u16,
        from: Slot,
        msg: EcMsg,
    },
    /// Every node's standing as this one knows it.
    Hello {
        to: NodeId,
        nodes: BTreeMap<NodeId, Standing>,
    },
    /// Pass the request on to the node serving its slot.
    Forward {
        to: NodeId,
        request: R,
    },
    Answer {
        request: R,
        reply: Reply,
    },
    /// Nobody can serve it now (more than M members lost, or this node is
    /// not confirmed and does not know who serves).
    Unavailable {
        request: R,
    },
    /// Its slot moved while it waited (handed back to a rejoined member):
    /// the client sends it again where the configuration says.
    Moved {
        request: R,
    },
}

/// How the groups stand, as this node sees it (INFO).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Standings {
    pub epoch: u64,
    /// This node: forming, member, joining, unconfirmed or lost.
    pub what: &'static str,
    pub lost: Vec<NodeId>,
    pub joining: Vec<NodeId>,
    /// This node holds its whole part (`Engine::whole`).
    pub whole: bool,
}

pub struct Engine<R> {
    me: NodeId,
    incarnation: u64,
    coding: Coding,
    code: Arc<Code>,
    /// One member per group (this node's slot in each).
    members: Vec<Member>,
    /// Every node's standing, once the groups formed.
    nodes: Option<BTreeMap<NodeId, Standing>>,
    /// The peers that said this node's standing is what it holds (a
    /// process serves as formed only once a majority did).
    confirmed_by: BTreeSet<NodeId>,
    /// The coordinator's last configuration admits this process.
    admitted: bool,
    epoch: u64,
    tickets: HashMap<u64, R>,
    next_ticket: u64,
    /// FLUSHALLs in progress: the deletes they wait for (ticket -> flush),
    /// each flush's request and deletes left, and the deletes not sent yet
    /// (group, slot, key, flush): at most `FLUSH_WINDOW` are in flight.
    flush_parts: HashMap<u64, u64>,
    flushes: HashMap<u64, (R, usize)>,
    flush_queue: VecDeque<(u16, Slot, Bytes, u64)>,
    last_hello_ms: Option<u64>,
    actions: Vec<Action<R>>,
}

impl<R> std::fmt::Debug for Engine<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").field("me", &self.me).field("epoch", &self.epoch).field("nodes", &self.nodes).finish_non_exhaustive()
    }
}

impl<R> Engine<R> {
    pub fn new(me: NodeId, incarnation: u64, coding: Coding) -> Result<Engine<R>, String> {
        let code = Arc::new(Code::new(coding.data as usize, coding.parity as usize)?);
        // Epoch 0: older than any configuration the groups form with.
        let config = Config { epoch: 0, ..Config::new(coding.data, coding.parity) };
        let members = (0..coding.nodes()).map(|g| Member::new(coding.slot(g, me), code.clone(), config.clone())).collect();
        Ok(Engine {
            me,
            incarnation,
            coding,
            code,
            members,
            nodes: None,
            confirmed_by: BTreeSet::new(),
            admitted: false,
            epoch: 1,
            tickets: HashMap::new(),
            next_ticket: 0,
            flush_parts: HashMap::new(),
            flushes: HashMap::new(),
            flush_queue: VecDeque::new(),
            last_hello_ms: None,
            actions: Vec::new(),
        })
    }

    pub fn coding(&self) -> Coding {
        self.coding
    }

    /// Takes what the engine wants done.
    pub fn drain(&mut self) -> Vec<Action<R>> {
        std::mem::take(&mut self.actions)
    }

    fn standing_of(&self, node: NodeId) -> Option<Standing> {
        self.nodes.as_ref().and_then(|n| n.get(&node).copied())
    }

    /// This process's own standing, if it is the process the groups count.
    fn mine(&self) -> Option<State> {
        self.standing_of(self.me).filter(|s| s.incarnation == self.incarnation).map(|s| s.state())
    }

    fn alive(&self, node: NodeId) -> bool {
        if node == self.me {
            // As formed: only once a majority confirmed this process.
            let confirmed = 2 * (self.confirmed_by.len() + 1) > self.coding.nodes() as usize;
            return self.mine() == Some(State::Alive) && (confirmed || self.standing_of(node).is_some_and(|s| s.gen > 0));
        }
        self.standing_of(node).is_some_and(|s| s.state() == State::Alive)
    }

    fn joining(&self, node: NodeId) -> bool {
        if node == self.me {
            return self.mine() == Some(State::Joining);
        }
        self.standing_of(node).is_some_and(|s| s.state() == State::Joining)
    }

    /// The coordinator's new configuration: forms the groups, or marks
    /// removed and restarted nodes lost.
    pub fn topology(&mut self, t: &Topology) {
        let n = self.coding.nodes();
        self.admitted = t.node(self.me).is_some() && t.admits(self.me, self.incarnation);
        let Some(mut nodes) = self.nodes.clone() else {
            if (0..n).all(|id| t.admitted.contains_key(&id) && t.node(id).is_some()) {
                let formed = (0..n).map(|id| (id, Standing { gen: 0, incarnation: t.admitted[&id] })).collect();
                self.nodes = Some(formed);
                self.reconfigure();
            }
            return;
        };
        for (id, s) in nodes.iter_mut() {
            let gone = t.node(*id).is_none() || t.admitted.get(id).is_some_and(|i| *i != s.incarnation);
            if gone && s.state() != State::Lost {
                *s = s.then(State::Lost, s.incarnation);
            }
        }
        self.update(nodes, self.alive(self.me));
    }

    /// A peer's hello: every node's standing as it knows it. The higher
    /// gen wins.
    pub fn hello(&mut self, from: NodeId, theirs: BTreeMap<NodeId, Standing>) {
        let mut nodes = self.nodes.clone().unwrap_or_else(|| theirs.clone());
        for (id, s) in &theirs {
            let mine = nodes.entry(*id).or_insert(*s);
            if s.gen > mine.gen {
                *mine = *s;
            }
        }
        let was_alive = self.alive(self.me);
        if theirs.get(&self.me) == nodes.get(&self.me) {
            self.confirmed_by.insert(from);
        }
        self.update(nodes, was_alive);
    }

    /// New standings: what this node decides for itself follows (rejoining
    /// when lost, alive once rebuilt), then every member's configuration.
    fn update(&mut self, mut nodes: BTreeMap<NodeId, Standing>, was_alive: bool) {
        let before = self.nodes.clone();
        let mine = nodes[&self.me];
        let other = mine.incarnation != self.incarnation;
        if self.admitted && (mine.state() == State::Lost || other && mine.state() != State::Lost) {
            // Declared lost (or the groups count another process here):
            // start over as a replacement.
            nodes.insert(self.me, mine.then(State::Joining, self.incarnation));
        }
        let changed = before.as_ref().and_then(|b| b.get(&self.me)) != nodes.get(&self.me);
        if changed && before.is_some() {
            self.confirmed_by.clear();
        }
        self.nodes = Some(nodes);
        let fresh = self.mine() == Some(State::Joining) && changed
            || !was_alive && self.alive(self.me) && self.standing_of(self.me).is_some_and(|s| s.gen == 0);
        if fresh {
            // A member now (confirmed as formed), or a replacement: its
            // members start afresh (nothing reached them before), at
            // configuration 0 so that the one below is news to them.
            self.members = (0..self.coding.nodes())
                .map(|g| Member::new(self.coding.slot(g, self.me), self.code.clone(), Config { epoch: 0, ..self.config_of(g) }))
                .collect();
            for g in 0..self.coding.nodes() {
                self.members[g as usize].drain();
            }
            // What waited for the old members never gets their answer:
            // the clients are told now (a FLUSHALL's deletes not sent yet
            // are dropped, or they would delete what is written later).
            for (_, request) in std::mem::take(&mut self.tickets) {
                self.actions.push(Action::Moved { request });
            }
            for (_, (request, _)) in std::mem::take(&mut self.flushes) {
                self.actions.push(Action::Unavailable { request });
            }
            self.flush_parts.clear();
            self.flush_queue = VecDeque::new();
        }
        if fresh || before != self.nodes {
            self.reconfigure();
        }
    }

    /// Group `group`'s configuration as this node sees the standings.
    fn config_of(&self, group: u16) -> Config {
        let slots = 0..self.coding.nodes() as Slot;
        Config {
            epoch: self.epoch,
            k: self.coding.data,
            m: self.coding.parity,
            alive: slots.clone().map(|s| self.alive(self.coding.node(group, s))).collect(),
            joining: slots.map(|s| self.joining(self.coding.node(group, s))).collect(),
        }
    }

    /// Every member's configuration from the standings now.
    fn reconfigure(&mut self) {
        let gens: u64 = self.nodes.iter().flat_map(|n| n.values()).map(|s| s.gen).sum();
        self.epoch = 1 + gens;
        for g in 0..self.coding.nodes() {
            let config = self.config_of(g);
            self.members[g as usize].reconfigure(config);
            self.collect(g);
        }
    }

    /// A joining node whose members are all rebuilt is alive; an alive
    /// one told its parity misses a slot's updates is lost (and starts over).
    fn rejoin(&mut self) {
        if self.alive(self.me) && self.members.iter().any(Member::stale) {
            let mut nodes = self.nodes.clone().expect("alive");
            let mine = nodes[&self.me];
            nodes.insert(self.me, mine.then(State::Lost, self.incarnation));
            return self.update(nodes, true);
        }
        if self.joining(self.me) && self.members.iter().all(Member::rebuilt) {
            let mut nodes = self.nodes.clone().expect("joining");
            let mine = nodes[&self.me];
            nodes.insert(self.me, mine.then(State::Alive, self.incarnation));
            self.update(nodes, false);
        }
    }

    /// A client request for `key` of `partition`: served here, or passed on
    /// to the node serving its data slot; a read, or a write (`PutReq`).
    /// `now_ms`: Unix time, what expiry is decided against.
    pub fn request(&mut self, request: R, partition: PartitionId, key: Bytes, write: Option<PutReq>, now_ms: u64) {
        let (group, slot) = self.coding.place(partition);
        let config = self.members[group as usize].config().clone();
        if !self.ready() {
            // Not a member yet: no peer has confirmed this process is the
            // one the groups formed with.
            return self.actions.push(Action::Unavailable { request });
        }
        let Some(acting) = config.acting(slot) else {
            return self.actions.push(Action::Unavailable { request });
        };
        let node = self.coding.node(group, acting);
        if node != self.me {
            return self.actions.push(Action::Forward { to: node, request });
        }
        if !self.alive(self.me) {
            // (Its members' configuration says it serves, but it is not
            // a member: never answer from them.)
            return self.actions.push(Action::Unavailable { request });
        }
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        self.tickets.insert(ticket, request);
        let member = &mut self.members[group as usize];
        member.advance(now_ms);
        match write {
            Some(put) => member.write(ticket, slot, put),
            None => member.get(ticket, slot, key),
        }
        self.collect(group);
    }

    /// The keys of `partitions` (and those with an expiry) in the data slots
    /// this node serves (DBSIZE sums them over every node).
    pub fn count(&self, partitions: &[PartitionId], partition_of: impl Fn(&[u8]) -> PartitionId) -> (u64, u64) {
        if !self.alive(self.me) {
            return (0, 0);
        }
        let wanted: std::collections::HashSet<PartitionId> = partitions.iter().copied().collect();
        let (mut keys, mut expires) = (0, 0);
        for (g, member) in self.members.iter().enumerate() {
            let (k, e) = member.count(|slot, key| {
                let p = partition_of(key);
                self.coding.place(p) == (g as u16, slot) && wanted.contains(&p)
            });
            keys += k as u64;
            expires += e as u64;
        }
        (keys, expires)
    }

    /// The live keys of `partitions` in the data slots this node serves
    /// that match `pattern` (KEYS, SCAN).
    pub fn keys(
        &self,
        partitions: &[PartitionId],
        pattern: Option<&[u8]>,
        now_ms: u64,
        partition_of: impl Fn(&[u8]) -> PartitionId,
    ) -> Vec<Bytes> {
        let mut keys = Vec::new();
        if !self.alive(self.me) {
            return keys;
        }
        let wanted: std::collections::HashSet<PartitionId> = partitions.iter().copied().collect();
        for (g, member) in self.members.iter().enumerate() {
            let keep = |slot, key: &[u8]| {
                let p = partition_of(key);
                self.coding.place(p) == (g as u16, slot)
                    && wanted.contains(&p)
                    && pattern.is_none_or(|pat| crate::store::glob::matches(pat, key))
            };
            member.live_keys(keep, now_ms, &mut keys);
        }
        keys
    }

    /// FLUSHALL: every key of the data slots this node serves is deleted
    /// with an ordinary update (the parity follows), `FLUSH_WINDOW` at a
    /// time; answered (`Done`) once all are. Keys written meanwhile may
    /// stay, as they would have a moment later. The pages go back once
    /// no value is on them (`Member::give_back`). (All at once, a flush
    /// of 100 000 keys a node held its event loop for seconds: its
    /// heartbeats stopped and the coordinator removed it.)
    pub fn flush(&mut self, request: R, now_ms: u64) {
        if self.members.iter().any(Member::preparing) {
            // A lost slot's keys are not served here until its takeover is
            // prepared: a flush now would miss them.
            return self.actions.push(Action::Unavailable { request });
        }
        let mut deletes = Vec::new();
        for (g, member) in self.members.iter_mut().enumerate() {
            member.advance(now_ms);
            for slot in member.served() {
                deletes.extend(member.keys(slot).into_iter().map(|key| (g, slot, key)));
            }
        }
        if !self.alive(self.me) || deletes.is_empty() {
            return self.actions.push(Action::Answer { request, reply: Reply::Done { version: None, old: None } });
        }
        let flush = self.next_ticket;
        self.next_ticket += 1;
        self.flushes.insert(flush, (request, deletes.len()));
        self.flush_queue.extend(deletes.into_iter().map(|(g, slot, key)| (g as u16, slot, key, flush)));
        self.send_flushes();
    }

    /// Sends the queued deletes of flushes in progress, up to
    /// `FLUSH_WINDOW` in flight (those of a flush given up are dropped).
    fn send_flushes(&mut self) {
        // (Deletes answered at once, of keys already gone, leave the
        // window as their answers are collected: then more go.)
        while self.flush_parts.len() < FLUSH_WINDOW && !self.flush_queue.is_empty() {
            let mut touched = BTreeSet::new();
            while self.flush_parts.len() < FLUSH_WINDOW {
                let Some((g, slot, key, flush)) = self.flush_queue.pop_front() else { break };
                if !self.flushes.contains_key(&flush) {
                    continue;
                }
                let ticket = self.next_ticket;
                self.next_ticket += 1;
                self.flush_parts.insert(ticket, flush);
                self.members[g as usize].put(ticket, slot, key, None, 0);
                touched.insert(g);
            }
            for g in touched {
                self.collect(g);
            }
        }
        if self.flush_queue.is_empty() && self.flush_queue.capacity() > FLUSH_WINDOW {
            self.flush_queue = VecDeque::new(); // (a large flush's capacity)
        }
    }

    /// A message of group `group` from its member at slot `from`.
    pub fn step(&mut self, group: u16, from: Slot, msg: EcMsg) {
        if !self.alive(self.me) && !self.joining(self.me) || group >= self.coding.nodes() {
            return; // not a member (yet, or any more): say nothing
        }
        self.members[group as usize].step(from, msg);
        self.collect(group);
        self.rejoin();
        if !self.flush_queue.is_empty() {
            self.send_flushes();
        }
    }

    /// Time passes: background repair, and the hello when it is due.
    pub fn tick(&mut self, now_ms: u64) {
        let Some(nodes) = self.nodes.clone() else { return };
        if self.alive(self.me) || self.joining(self.me) {
            for g in 0..self.coding.nodes() {
                self.members[g as usize].tick(now_ms);
                self.collect(g);
            }
            self.rejoin();
            self.send_flushes();
        }
        if self.last_hello_ms.is_none_or(|at| now_ms >= at + HELLO_MS) {
            self.last_hello_ms = Some(now_ms);
            for &to in nodes.keys().filter(|&&id| id != self.me) {
                self.actions.push(Action::Hello { to, nodes: nodes.clone() });
            }
        }
    }

    fn collect(&mut self, group: u16) {
        let me = self.coding.slot(group, self.me);
        for out in self.members[group as usize].drain() {
            match out {
                Out::Send { to, msg } => self.actions.push(Action::Send { to: self.coding.node(group, to), group, from: me, msg }),
                Out::Reply { op, reply } => {
                    if let Some(request) = self.tickets.remove(&op) {
                        match reply {
                            Reply::NotHere => self.actions.push(Action::Moved { request }),
                            reply => self.actions.push(Action::Answer { request, reply }),
                        }
                    } else if let Some(flush) = self.flush_parts.remove(&op) {
                        if reply == Reply::NotHere {
                            // A slot handed back meanwhile: its keys were not
                            // all deleted here. The client is told to try again.
                            if let Some((request, _)) = self.flushes.remove(&flush) {
                                self.actions.push(Action::Moved { request });
                            }
                            continue;
                        }
                        let left = self.flushes.get_mut(&flush).map(|(_, left)| {
                            *left -= 1;
                            *left
                        });
                        if left == Some(0) {
                            let (request, _) = self.flushes.remove(&flush).expect("flush");
                            self.actions.push(Action::Answer { request, reply: Reply::Done { version: None, old: None } });
                        }
                    }
                }
            }
        }
    }

    /// This node's member of `group`.
    pub fn member(&self, group: u16) -> &Member {
        &self.members[group as usize]
    }

    /// Whether requests can be taken: the groups formed, and this node is
    /// a confirmed member, or lost or joining (then it passes them on).
    pub fn ready(&self) -> bool {
        self.nodes.is_some()
            && (self.alive(self.me)
                || self.standing_of(self.me).is_some_and(|s| s.state() != State::Alive || s.incarnation != self.incarnation))
    }

    /// Whether this node is a member holding its whole part in every group
    /// (`Member::whole`): a replacement once rebuilt and its slots taken
    /// back, with every page.
    pub fn whole(&self) -> bool {
        self.alive(self.me) && self.members.iter().all(Member::whole)
    }

    /// Whether nothing waits on time here but the hello.
    pub fn idle(&self) -> bool {
        self.members.iter().all(Member::settled) && self.flush_queue.is_empty()
    }

    /// What this node holds in all its groups, and how its recovery goes.
    pub fn memory(&self) -> super::Memory {
        let mut m = super::Memory::default();
        for member in &self.members {
            m += member.memory();
        }
        m
    }

    /// The configuration as this node sees it: its epoch, whether the
    /// groups formed and this node is a member of them, the nodes lost.
    pub fn standing(&self) -> Standings {
        let what = match (&self.nodes, self.mine()) {
            (None, _) => "forming",
            _ if self.alive(self.me) => "member",
            (_, Some(State::Joining)) => "joining",
            (_, Some(State::Alive)) => "unconfirmed",
            _ => "lost",
        };
        let of = |state| self.nodes.iter().flatten().filter(|(_, s)| s.state() == state).map(|(&id, _)| id).collect();
        Standings { epoch: self.epoch, what, lost: of(State::Lost), joining: of(State::Joining), whole: self.whole() }
    }

    /// One line per group: its members' roles and state, for status.
    pub fn status(&self) -> Vec<String> {
        let Standings { epoch, what, lost, joining, .. } = self.standing();
        let mut lines = vec![format!("epoch {epoch}, {what}, lost {lost:?}, joining {joining:?}")];
        for (g, m) in self.members.iter().enumerate() {
            let nodes: Vec<String> = (0..self.coding.nodes() as Slot)
                .map(|s| format!("{}{}", if s < self.coding.data { "d" } else { "p" }, self.coding.node(g as u16, s)))
                .collect();
            lines.push(format!("group {g} [{}]: {}", nodes.join(" "), m.status().join("; ")));
        }
        lines
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Change;
    use crate::ring::{NodeInfo, Shape};
    use std::collections::VecDeque;

    const SHAPE: Shape = Shape { partitions: 20, replicas: 1, k: 1, coding: Some(Coding { data: 3, parity: 2 }) };

    struct Net {
        engines: Vec<Engine<u64>>,
        queue: VecDeque<(NodeId, Action<u64>)>,
        answers: Vec<(NodeId, u64, Reply)>,
        other: Vec<(NodeId, String)>,
        now: u64,
        t: Topology,
    }

    impl Net {
        fn new() -> Net {
            let nodes = (0..5).map(|id| NodeInfo { id, addr: String::new() }).collect();
            let mut t = Topology::new(1, SHAPE, nodes).unwrap();
            t.admitted = (0..5).map(|id| (id, 1)).collect();
            let engines = (0..5).map(|id| Engine::new(id, 1, SHAPE.coding.unwrap()).unwrap()).collect();
            Net { engines, queue: VecDeque::new(), answers: vec![], other: vec![], now: 1_000, t }
        }
        fn collect(&mut self, n: NodeId) {
            for a in self.engines[n as usize].drain() {
                self.queue.push_back((n, a));
            }
        }
        /// Delivers everything queued, and what that sends, in order.
        fn deliver(&mut self) {
            while let Some((from, a)) = self.queue.pop_front() {
                match a {
                    Action::Send { to, group, from: slot, msg } => {
                        self.engines[to as usize].step(group, slot, msg);
                        self.collect(to);
                    }
                    Action::Hello { to, nodes } => {
                        self.engines[to as usize].hello(from, nodes);
                        self.collect(to);
                    }
                    Action::Answer { request, reply } => self.answers.push((from, request, reply)),
                    Action::Forward { request, .. } => self.other.push((from, format!("forward {request}"))),
                    Action::Unavailable { request } => self.other.push((from, format!("unavailable {request}"))),
                    Action::Moved { request } => self.other.push((from, format!("moved {request}"))),
                }
            }
        }
        fn tick(&mut self, ms: u64) {
            for _ in 0..ms / 10 {
                self.now += 10;
                for n in 0..5 {
                    self.engines[n as usize].tick(self.now);
                    self.collect(n);
                }
                self.deliver();
            }
        }
        fn put(&mut self, op: u64, key: &str) {
            let key = Bytes::from(key.to_string());
            let p = self.t.partition_of(&key);
            let (g, s) = SHAPE.coding.unwrap().place(p);
            let n = SHAPE.coding.unwrap().node(g, self.engines[0].members[g as usize].config().acting(s).unwrap());
            let put = PutReq { key: key.clone(), change: Change::set(Bytes::from(vec![7u8; 100])), version: 1, id: None };
            self.engines[n as usize].request(op, p, key, Some(put), self.now);
            self.collect(n);
        }
    }

    /// A FLUSHALL in progress when the node's members start afresh (it
    /// was lost, and is a replacement now): its client is told, and the
    /// deletes it had in flight no longer hold the window (they did, and
    /// every later FLUSHALL there went unanswered).
    #[test]
    fn a_flush_cut_short_by_fresh_members_is_answered_and_frees_its_window() {
        let mut net = Net::new();
        for n in 0..5 {
            net.engines[n].topology(&net.t.clone());
            net.collect(n as NodeId);
        }
        net.deliver();
        net.tick(3_000);
        assert!((0..5).all(|n| net.engines[n].alive(n as NodeId)), "formed");
        let mut op = 0;
        for i in 0..20_000 {
            op += 1;
            net.put(op, &format!("key{i}"));
            if i % 100 == 0 {
                net.deliver();
            }
        }
        net.tick(500);
        let done = net.answers.len();
        assert_eq!(done, 20_000, "{:?}", &net.other[..net.other.len().min(5)]);
        // FLUSHALL at node 0: its deletes go out, node 0 is cut off before
        // any is acknowledged (the coordinator's path: it stalls, is
        // declared lost by the others, hears it, starts over as a
        // replacement).
        net.engines[0].flush(1_000_000, net.now);
        net.collect(0);
        // Node 0 hears it is lost (a peer's hello with a newer standing).
        let mut nodes = net.engines[1].nodes.clone().unwrap();
        let s0 = nodes[&0];
        nodes.insert(0, s0.then(State::Lost, 1));
        net.queue.retain(|(from, _)| *from != 0); // what node 0 sent is lost with its links
        net.engines[0].hello(1, nodes.clone());
        net.collect(0);
        // The others learn it too.
        for n in 1..5 {
            let theirs = net.engines[0].nodes.clone().unwrap();
            net.engines[n].hello(0, theirs);
            net.collect(n as NodeId);
        }
        net.deliver();
        net.tick(20_000);
        // Node 0 is a member again. A new FLUSHALL there:
        let before = net.answers.len();
        net.engines[0].flush(2_000_000, net.now);
        net.collect(0);
        net.deliver();
        net.tick(10_000);
        let answered: Vec<_> = net.answers[before..].iter().filter(|(_, r, _)| *r >= 1_000_000).collect();
        assert!(answered.iter().any(|(_, r, _)| *r == 2_000_000), "the second FLUSHALL at node 0 is never answered");
        // The first was told it could not finish, once.
        let told: Vec<_> = net.other.iter().filter(|(_, s)| s.contains("1000000")).collect();
        assert_eq!(told.len(), 1, "{told:?}");
        assert!(told[0].1.starts_with("unavailable"), "{told:?}");
    }
}
