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
//! admits all N nodes; each node's incarnation then is its member's. A
//! node removed by the coordinator, or admitted again as another
//! incarnation (a restart: its memory is gone), is lost for good: a
//! replacement rebuilt by decoding is not built yet. Every engine tells the
//! others, once a second, which nodes it knows lost and which incarnation it
//! holds for them (`Hello`): a node serves its own slots only after a peer
//! has confirmed its incarnation, so a restarted process never serves the
//! empty member it came back with, and a node that learns it was declared
//! lost (it was paused, say) stops serving. The configuration's epoch is 1
//! + the number of lost nodes: the same at every node for the same losses.

use super::code::Code;
use super::member::{Config, Member, Out, PutReq, Reply};
use crate::message::ec::{EcMsg, Slot};
use crate::ring::{Coding, NodeId, PartitionId, Topology};
use bytes::Bytes;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

/// How often an engine tells its peers what it knows.
pub const HELLO_MS: u64 = 1_000;

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
    /// The incarnations the groups formed with, and the nodes known lost.
    Hello {
        to: NodeId,
        formed: BTreeMap<NodeId, u64>,
        lost: Vec<NodeId>,
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
}

pub struct Engine<R> {
    me: NodeId,
    incarnation: u64,
    coding: Coding,
    code: Arc<Code>,
    /// One member per group (this node's slot in each).
    members: Vec<Member>,
    /// The incarnation of each node when the group formed.
    formed: Option<BTreeMap<NodeId, u64>>,
    lost: BTreeSet<NodeId>,
    /// A peer has confirmed this node's incarnation.
    confirmed: bool,
    epoch: u64,
    tickets: HashMap<u64, R>,
    next_ticket: u64,
    /// FLUSHALLs in progress: the deletes they wait for (ticket -> flush),
    /// and each flush's request and deletes left.
    flush_parts: HashMap<u64, u64>,
    flushes: HashMap<u64, (R, usize)>,
    last_hello_ms: Option<u64>,
    actions: Vec<Action<R>>,
}

impl<R> std::fmt::Debug for Engine<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").field("me", &self.me).field("epoch", &self.epoch).field("lost", &self.lost).finish_non_exhaustive()
    }
}

impl<R> Engine<R> {
    pub fn new(me: NodeId, incarnation: u64, coding: Coding) -> Result<Engine<R>, String> {
        let code = Arc::new(Code::new(coding.data as usize, coding.parity as usize)?);
        let config = Config::new(coding.data, coding.parity);
        let members = (0..coding.nodes()).map(|g| Member::new(coding.slot(g, me), code.clone(), config.clone())).collect();
        Ok(Engine {
            me,
            incarnation,
            coding,
            code,
            members,
            formed: None,
            lost: BTreeSet::new(),
            confirmed: false,
            epoch: 1,
            tickets: HashMap::new(),
            next_ticket: 0,
            flush_parts: HashMap::new(),
            flushes: HashMap::new(),
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

    fn alive(&self, node: NodeId) -> bool {
        self.formed.is_some() && !self.lost.contains(&node) && (node != self.me || self.confirmed)
    }

    /// The coordinator's new configuration: forms the groups, or marks
    /// removed and restarted nodes lost.
    pub fn topology(&mut self, t: &Topology) {
        let n = self.coding.nodes();
        if self.formed.is_none() {
            if (0..n).all(|id| t.admitted.contains_key(&id) && t.node(id).is_some()) {
                self.form((0..n).map(|id| (id, t.admitted[&id])).collect());
            } else {
                return;
            }
        }
        let formed = self.formed.as_ref().expect("formed");
        let gone: Vec<NodeId> =
            (0..n).filter(|id| t.node(*id).is_none() || t.admitted.get(id).is_some_and(|i| Some(i) != formed.get(id))).collect();
        self.lose(gone);
    }

    /// The groups formed with these incarnations (from the configuration
    /// that first admitted every node, or a peer's hello for a node that
    /// missed it).
    fn form(&mut self, formed: BTreeMap<NodeId, u64>) {
        let other = formed.get(&self.me) != Some(&self.incarnation);
        self.formed = Some(formed);
        // This node's slots count as lost until a peer confirms it (`alive`).
        self.reconfigure();
        if other {
            // The groups formed with another process on this node.
            self.lose(vec![self.me]);
        }
    }

    fn lose(&mut self, nodes: Vec<NodeId>) {
        let before = self.lost.len();
        self.lost.extend(nodes.into_iter().filter(|&id| id < self.coding.nodes()));
        if self.lost.len() != before {
            self.reconfigure();
        }
    }

    /// Every member's configuration from who is alive now.
    fn reconfigure(&mut self) {
        let dead = (0..self.coding.nodes()).filter(|&id| !self.alive(id)).count() as u64;
        self.epoch = 1 + dead;
        for g in 0..self.coding.nodes() {
            let alive = (0..self.coding.nodes() as Slot).map(|s| self.alive(self.coding.node(g, s))).collect();
            let config = Config { epoch: self.epoch, k: self.coding.data, m: self.coding.parity, alive };
            self.members[g as usize].reconfigure(config);
            self.collect(g);
        }
    }

    /// A peer's hello: the incarnations the groups formed with (its word
    /// for this node among them), and the nodes it knows lost.
    pub fn hello(&mut self, formed: BTreeMap<NodeId, u64>, lost: Vec<NodeId>) {
        if self.formed.is_none() {
            self.form(formed.clone());
        }
        let yours = formed.get(&self.me).copied();
        if lost.contains(&self.me) || yours != Some(self.incarnation) || self.formed.as_ref() != Some(&formed) {
            self.lose(vec![self.me]);
        } else if !self.confirmed && !self.lost.contains(&self.me) {
            self.confirmed = true;
            // A member now: its members start afresh (nothing reached them
            // while it was not one), then take the losses known so far
            // (the leader among them starts preparing).
            self.members = (0..self.coding.nodes())
                .map(|g| Member::new(self.coding.slot(g, self.me), self.code.clone(), Config::new(self.coding.data, self.coding.parity)))
                .collect();
            self.reconfigure();
        }
        self.lose(lost);
    }

    /// A client request for `key` of `partition`: served here, or passed on
    /// to the node serving its data slot; a read, or a write (`PutReq`).
    /// `now_ms`: Unix time, what expiry is decided against.
    pub fn request(&mut self, request: R, partition: PartitionId, key: Bytes, write: Option<PutReq>, now_ms: u64) {
        let (group, slot) = self.coding.place(partition);
        let config = self.members[group as usize].config().clone();
        if self.formed.is_none() || !self.confirmed && !self.lost.contains(&self.me) {
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

    /// FLUSHALL: every key of the data slots this node serves is deleted
    /// with an ordinary update (the parity follows); answered (`Done`)
    /// once all are. Keys written meanwhile may stay, as they would have
    /// a moment later. (The data areas keep their pages, as holes.)
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
        self.flushes.insert(flush, (request, deletes.len()));
        for (g, slot, key) in deletes {
            self.next_ticket += 1;
            self.flush_parts.insert(self.next_ticket, flush);
            self.members[g].put(self.next_ticket, slot, key, None, 0);
        }
        self.next_ticket += 1;
        for g in 0..self.coding.nodes() {
            self.collect(g);
        }
    }

    /// A message of group `group` from its member at slot `from`.
    pub fn step(&mut self, group: u16, from: Slot, msg: EcMsg) {
        if !self.alive(self.me) || group >= self.coding.nodes() {
            return; // not a member (yet, or any more): say nothing
        }
        self.members[group as usize].step(from, msg);
        self.collect(group);
    }

    /// Time passes: background repair, and the hello when it is due.
    pub fn tick(&mut self, now_ms: u64) {
        if self.formed.is_none() {
            return;
        }
        if self.alive(self.me) {
            for g in 0..self.coding.nodes() {
                self.members[g as usize].tick(now_ms);
                self.collect(g);
            }
        }
        if self.last_hello_ms.is_none_or(|at| now_ms >= at + HELLO_MS) {
            self.last_hello_ms = Some(now_ms);
            let formed = self.formed.clone().expect("formed");
            let lost: Vec<NodeId> = self.lost.iter().copied().collect();
            for &to in formed.keys().filter(|&&id| id != self.me) {
                self.actions.push(Action::Hello { to, formed: formed.clone(), lost: lost.clone() });
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
                            Reply::NotHere => self.actions.push(Action::Unavailable { request }),
                            reply => self.actions.push(Action::Answer { request, reply }),
                        }
                    } else if let Some(flush) = self.flush_parts.remove(&op) {
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
    /// confirmed a member or known lost (then it passes them on).
    pub fn ready(&self) -> bool {
        self.formed.is_some() && (self.confirmed || self.lost.contains(&self.me))
    }

    /// Whether nothing waits on time here but the hello.
    pub fn idle(&self) -> bool {
        self.members.iter().all(Member::settled)
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
    pub fn standing(&self) -> (u64, &'static str, Vec<NodeId>) {
        let what = if self.formed.is_none() {
            "forming"
        } else if self.alive(self.me) {
            "member"
        } else if self.lost.contains(&self.me) {
            "lost"
        } else {
            "unconfirmed"
        };
        (self.epoch, what, self.lost.iter().copied().collect())
    }

    /// One line per group: its members' roles and state, for status.
    pub fn status(&self) -> Vec<String> {
        let mut lines = vec![format!(
            "epoch {}, {}, lost {:?}",
            self.epoch,
            if self.formed.is_none() {
                "not formed"
            } else if self.alive(self.me) {
                "serving"
            } else {
                "not a member"
            },
            self.lost
        )];
        for (g, m) in self.members.iter().enumerate() {
            let nodes: Vec<String> = (0..self.coding.nodes() as Slot)
                .map(|s| format!("{}{}", if s < self.coding.data { "d" } else { "p" }, self.coding.node(g as u16, s)))
                .collect();
            lines.push(format!("group {g} [{}]: {}", nodes.join(" "), m.status().join("; ")));
        }
        lines
    }
}
