//! Identifier-first disaster recovery (Wicaksono and Aikoh, §3.2-3.3): a
//! primary site's writes are acknowledged once their key and identifier are
//! noted at its backup site, whatever the size of the value; the values
//! follow on the ordinary site shipping (`reporter`, `receiver`). After a
//! failover the backup refuses the keys whose last noted write never
//! arrived, instead of serving an older value.
//!
//! The parts, one `Dr` per node of either site:
//! * a head of the primary notes every client write it orders (`node::put`
//!   sends a `GeoMsg::Note`); the write's session waits for `Noted` as well
//!   as for its chain's acknowledgement (`driver`), and a session that
//!   hears nothing sends its write again, which its head notes again.
//! * the backup's stabilizer replicas keep the notes (`ledger`): the leader
//!   (the receiver's node, where the primary's link lands) mirrors them to
//!   the others and answers `Noted` once a majority holds them. A note is
//!   forgotten once the site has applied the primary up to its timestamp
//!   (`prune`, from the leader's `SiteTime`): its value, or a later version
//!   of its key, is in the site's chains.
//! * a failover (`start_failover`, on any node of the backup) gathers the
//!   notes every node of the site keeps (`Unfinished`), and hands the
//!   newest per key to every node (`Lost`); answered once all have them. A
//!   node then serves no version of such a key older than its note
//!   (`lost`): a later value (the primary's, once it is back, or a write
//!   here) clears it.
//!
//! The lost keys are in every node's log (`LogRecord::Lost`), and a node
//! that has them sends them to any admitted incarnation not known to hold
//! them (one that restarted without its log, or joined later). Such a node
//! serves nothing until it knows (`asking`): once admitted, it asks every
//! other admitted node (`AskLost`), and serves once one of them handed it
//! the lost keys or all of them said they have none (`NoLost`; a node that
//! answered a failover not over yet says nothing). A failover finishes
//! only once every node admitted at the time took them; if none of those
//! is admitted while a node asks, it serves as if there had been none,
//! until one of them is back and tells it. A node that answered a failover
//! is *frozen* (notes nothing more, `LogRecord::FailingOver`) until the
//! lost keys come; if they do not (the node running it crashed, the site
//! restarted whole), it runs the failover again itself (`RESUME_MS`).
//!
//! Known limit: a log is trusted as whole when this process syncs every
//! record (`fsync=always`), whatever the process that wrote it did: keep
//! `--fsync` the same across a crash (a log of `everysec` restarted with
//! `always` may lack notes its replica acknowledged).
//!
//! The notes are in the logs of the stabilizer replicas that keep them
//! (`LogRecord::Noted`, written before the replica answers), so a backup
//! site that restarts whole still knows them.
//!
//! A replica whose process lost the notes an earlier process of it
//! acknowledged (restarted without a whole log, or its log not synced
//! throughout) is not *whole*: the failover's majority counts only whole
//! replicas, since an acknowledged note may have been kept by that
//! earlier process and one other replica only. It catches up by asking
//! the other replicas for their notes (`AskNotes`, `NotesAre`), and is
//! whole once
//! * enough whole replicas answered that every majority holding a note
//!   meets one of them (`replicas - majority + 1`);
//! * or every other replica answered: it then holds every note any of
//!   them holds, all a note lost with fewer than a majority of the
//!   replicas' notes at once. That is how replicas are whole at the site's
//!   birth (a process cannot tell its node's first start from a restart
//!   without data: the supervisor puts both straight in the chains), and
//!   again after the whole site restarted from logs not synced throughout;
//! * or the site has applied the primary past every note an earlier
//!   process could have acknowledged (the admission time plus twice the
//!   clock skew a session may bring, about two minutes, while the primary
//!   ships): the way on when another replica is gone for good.
//!
//! It logs that (`LogRecord::NotesWhole`), so its next restart from a
//! synced log needs no catching up.

use crate::hlc::Timestamp;
use crate::message::geo::{DrPair, Note};
use crate::message::{send, Dest, GeoMsg, Message, OpId, Outbox};
use crate::record::LogRecord;
use crate::ring::{NodeId, PartitionId, Topology};
use crate::version::{SiteId, Version};
use ahash::AHashMap;
use bytes::Bytes;
use std::collections::{BTreeMap, BTreeSet};

/// A mirror no majority answered in this long is given up: the writes'
/// sessions send them again, and their heads note them again.
const MIRROR_MS: u64 = 5_000;
/// A failover asks the nodes that have not answered again this often.
const FAILOVER_RESEND_MS: u64 = 200;
/// After a failover, nodes not known to hold the lost keys get them this
/// often.
const TELL_MS: u64 = 1_000;
/// A node that answered a failover which is not over this long after
/// (its runner gone: crashed, or the whole site restarted) runs it again
/// itself, node `n` after `n` more seconds (the first usually finishes it
/// for all): nobody else would hand out the lost keys, and nodes asking
/// whether there was one would wait for them.
const RESUME_MS: u64 = 5_000;
/// A replica catching up asks the replicas that have not answered whole
/// again this often.
const CATCH_UP_MS: u64 = 1_000;

/// A node's part in identifier-first disaster recovery.
#[derive(Debug)]
pub struct Dr {
    pair: DrPair,
    site: SiteId,
    me: NodeId,
    /// This process's incarnation (`LostTaken` names it).
    incarnation: u64,
    /// The backup's stabilizer replicas: where notes are kept.
    replicas: Vec<NodeId>,
    /// Notes kept here (a stabilizer replica of the backup), by timestamp.
    ledger: BTreeMap<(Timestamp, PartitionId), Note>,
    ledger_bytes: usize,
    /// The primary is applied here up to this time: older notes are done.
    applied: Timestamp,
    /// While leading the backup: notes mirrored, by tag, until a majority
    /// of the replicas hold them.
    mirroring: BTreeMap<u64, Mirroring>,
    next_tag: u64,
    /// The failover this node runs.
    failover: Option<Failover>,
    /// After a failover: the newest lost write of each key.
    lost: Option<AHashMap<Bytes, Timestamp>>,
    /// Took part in a failover (answered `Failover`), which may not be
    /// over: notes nothing more (`lost` comes once it is). Since when (set
    /// at the first tick after a restart).
    frozen: bool,
    frozen_ms: Option<u64>,
    /// Writes noted here (the backup's leader) so far.
    noted: u64,
    /// After a failover: the incarnation of each node known to hold the
    /// lost keys, and when they were last sent to the others (a node that
    /// restarted without its log, or was not admitted at the failover,
    /// gets them from every node that has them).
    told: BTreeMap<NodeId, u64>,
    told_ms: u64,
    /// Lost keys to make durable (`take_log`) before what the step sends
    /// (`LostTaken`) leaves.
    log: Vec<LogRecord>,
    /// This process holds every note its replica ever acknowledged
    /// (always, for a node that is no stabilizer replica of the backup).
    whole: bool,
    /// Admitted once already (`admitted` acts on the first admission).
    admitted: bool,
    /// While not whole and admitted.
    catching_up: Option<CatchUp>,
    /// At the backup, from the first admission of a process that may have
    /// missed a failover until it knows: the other nodes that said they did
    /// not fail over, and when those that did not answer were last asked.
    asking: Option<(BTreeSet<NodeId>, u64)>,
}

/// A replica catching up on the notes its earlier process acknowledged.
#[derive(Debug, Default)]
struct CatchUp {
    /// The other replicas that answered, and those of them that are whole.
    answered: BTreeSet<NodeId>,
    whole: BTreeSet<NodeId>,
    asked_ms: u64,
    /// Every note an earlier process could have acknowledged is older than
    /// this: once the site applied the primary past it, none is needed.
    past: Timestamp,
}

#[derive(Debug)]
struct Mirroring {
    ops: Vec<(OpId, Timestamp)>,
    holders: BTreeSet<NodeId>,
    since_ms: u64,
}

#[derive(Debug)]
struct Failover {
    /// The operator's request (none: resumed by this node, `tick`).
    op: Option<OpId>,
    tag: u64,
    /// Nodes whose notes are in.
    heard: BTreeSet<NodeId>,
    /// The stabilizer replicas among them whose notes are whole.
    whole: BTreeSet<NodeId>,
    /// Counts replicas whose notes are not whole (the operator's choice).
    force: bool,
    /// The newest note of each key heard so far.
    notes: AHashMap<Bytes, Note>,
    /// Once every node answered: the lost notes, sent to every node, and
    /// the nodes that have taken them.
    lost: Option<Vec<Note>>,
    taken: BTreeSet<NodeId>,
    sent_ms: u64,
    /// When replicas that answered without whole notes were last asked
    /// again (each answer carries all their notes: not every resend).
    reasked_ms: u64,
}

/// What `CW.DR STATUS` shows of a node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DrStatus {
    /// "primary" or "backup".
    pub role: &'static str,
    pub pair: Option<DrPair>,
    /// Notes kept here: writes noted whose value has not been applied, and
    /// the bytes of their keys and values.
    pub unfinished: usize,
    pub unfinished_bytes: usize,
    /// The oldest of them.
    pub oldest: Option<Timestamp>,
    /// Writes noted by this node while leading the backup.
    pub noted: u64,
    /// Keys refused after a failover, if it failed over.
    pub lost: Option<usize>,
    /// This node holds every note its replica acknowledged (no: it lost
    /// them in a restart and is catching up from the other replicas).
    pub whole: bool,
    /// It answered a failover that is not over yet.
    pub failing_over: bool,
    /// It serves no client until it knows whether the site failed over.
    pub asking: bool,
}

impl Dr {
    /// `me`'s part, in `site`, of the pair; `replicas` are the site's
    /// stabilizer replicas.
    pub fn new(pair: DrPair, site: SiteId, me: NodeId, incarnation: u64, replicas: &[NodeId]) -> Dr {
        Dr {
            pair,
            site,
            me,
            incarnation,
            replicas: replicas.to_vec(),
            ledger: BTreeMap::new(),
            ledger_bytes: 0,
            applied: Timestamp::ZERO,
            mirroring: BTreeMap::new(),
            next_tag: 0,
            failover: None,
            lost: None,
            frozen: false,
            frozen_ms: None,
            noted: 0,
            told: BTreeMap::new(),
            told_ms: 0,
            log: Vec::new(),
            whole: !(site == pair.backup && replicas.contains(&me)),
            admitted: false,
            catching_up: None,
            asking: None,
        }
    }

    /// This process started from a log (`whole`: synced throughout, and
    /// its notes were whole when it was written: `LogRecord::NotesWhole`).
    pub fn recovered(&mut self, whole: bool) {
        self.whole |= whole;
    }

    /// The configuration admits this process. The first time, at the
    /// backup: unless its log says the site failed over, it asks whether
    /// it did (`asking`: a process cannot tell whether it is its node's
    /// first, and one that missed a failover would serve lost keys older);
    /// a stabilizer replica that is not whole starts catching up (at the
    /// site's birth too: there every other replica answers at once).
    ///
    /// It asks at every admission (a node removed and admitted again, the
    /// same process, may have missed one meanwhile); it catches up once.
    pub fn admitted(&mut self, topology: &Topology, now_ms: u64, out: &mut Outbox) {
        if !self.is_backup() {
            return;
        }
        if self.lost.is_none() {
            self.asking = Some((BTreeSet::new(), now_ms));
            self.ask_lost(topology, out);
        }
        if std::mem::replace(&mut self.admitted, true) {
            return;
        }
        if !self.whole {
            // A note's timestamp is the primary head's clock, at most
            // `MAX_CLOCK_SKEW_MS` ahead of its wall clock (sessions cannot
            // drag it further), and that wall clock as far off this one.
            let past = Timestamp::new(now_ms + 2 * crate::hlc::MAX_CLOCK_SKEW_MS, 0);
            self.catching_up = Some(CatchUp { asked_ms: now_ms, past, ..CatchUp::default() });
            self.ask_notes(out);
            self.caught_up();
        }
    }

    /// Whether this node must serve nothing yet: it does not know whether
    /// its site failed over (`admitted`).
    pub fn asking(&self) -> bool {
        self.asking.is_some()
    }

    /// Asks the other admitted nodes that have not answered whether they
    /// failed over.
    fn ask_lost(&mut self, topology: &Topology, out: &mut Outbox) {
        let Some((answered, _)) = &self.asking else { return };
        let others: Vec<NodeId> = topology.admitted.keys().copied().filter(|&n| n != self.me && !answered.contains(&n)).collect();
        if others.is_empty() {
            self.asking = None;
        }
        for n in others {
            send(out, Dest::Node(n), Message::geo(GeoMsg::AskLost { from: self.me, incarnation: self.incarnation }));
        }
    }

    /// Done asking once every other admitted node said no.
    fn ask_lost_done(&mut self, topology: &Topology) {
        if let Some((answered, _)) = &self.asking {
            if topology.admitted.keys().all(|n| *n == self.me || answered.contains(n)) {
                self.asking = None;
            }
        }
    }

    fn become_whole(&mut self) {
        self.whole = true;
        self.catching_up = None;
        self.log.push(LogRecord::NotesWhole);
    }

    /// Asks the other replicas that have not answered whole for their notes.
    fn ask_notes(&self, out: &mut Outbox) {
        let Some(c) = &self.catching_up else { return };
        for &r in self.replicas.iter().filter(|&&r| r != self.me && !c.whole.contains(&r)) {
            send(out, Dest::Node(r), Message::geo(GeoMsg::AskNotes { from: self.me, incarnation: self.incarnation }));
        }
    }

    /// Whole once enough whole replicas answered that every majority of
    /// the replicas (one that held a note this process lost) meets one of
    /// them, or once every other replica answered.
    fn caught_up(&mut self) {
        let needed = self.replicas.len() - self.majority() + 1;
        let others = self.replicas.iter().filter(|&&r| r != self.me).count();
        if self.catching_up.as_ref().is_some_and(|c| c.whole.len() >= needed || c.answered.len() >= others) {
            self.become_whole();
        }
    }

    /// Lost keys read back from the log at start.
    pub fn restore(&mut self, keys: Vec<(Bytes, Timestamp)>) {
        self.take_lost(keys.into_iter());
        self.log.clear();
    }

    /// Read back from the log at start: this node answered a failover.
    pub fn restore_frozen(&mut self) {
        self.frozen = true;
    }

    /// What must be durable before this step's messages leave.
    pub fn take_log(&mut self) -> Vec<LogRecord> {
        std::mem::take(&mut self.log)
    }

    /// The notes kept and the lost keys as log records, for a compacted
    /// log.
    pub fn checkpoint(&self) -> Vec<LogRecord> {
        let notes = (!self.ledger.is_empty()).then(|| LogRecord::Noted { notes: self.ledger.values().cloned().collect() });
        let whole = (self.whole && self.is_backup() && self.replicas.contains(&self.me)).then_some(LogRecord::NotesWhole);
        let lost = match &self.lost {
            Some(lost) => Some(LogRecord::Lost { keys: lost.iter().map(|(k, &ts)| (k.clone(), ts)).collect() }),
            None => self.frozen.then_some(LogRecord::FailingOver),
        };
        notes.into_iter().chain(whole).chain(lost).collect()
    }

    /// Adds lost keys (the newest write of each wins), logged: the set a
    /// failover that is over handed out (whole; several are merged).
    fn take_lost(&mut self, keys: impl Iterator<Item = (Bytes, Timestamp)>) {
        self.frozen = true;
        self.asking = None;
        let first = self.lost.is_none();
        let lost = self.lost.get_or_insert_with(AHashMap::new);
        let mut logged = Vec::new();
        for (key, ts) in keys {
            match lost.get_mut(&key) {
                Some(had) if *had >= ts => continue,
                Some(had) => *had = ts,
                None => {
                    lost.insert(key.clone(), ts);
                }
            }
            logged.push((key, ts));
        }
        // Once (this node failed over), then only what is new to it.
        if first || !logged.is_empty() {
            self.log.push(LogRecord::Lost { keys: logged });
        }
    }

    pub fn pair(&self) -> DrPair {
        self.pair
    }

    /// The backup site, if this is the primary: heads here note their writes there.
    pub fn backup_of_primary(&self) -> Option<SiteId> {
        (self.site == self.pair.primary).then_some(self.pair.backup)
    }

    pub fn is_backup(&self) -> bool {
        self.site == self.pair.backup
    }

    fn majority(&self) -> usize {
        self.replicas.len() / 2 + 1
    }

    /// Keeps notes, logged (`take_log`) before this step's answers leave.
    fn keep(&mut self, notes: Vec<Note>) {
        let fresh: Vec<Note> = notes.into_iter().filter(|n| n.ts > self.applied).collect();
        if fresh.is_empty() {
            return;
        }
        self.log.push(LogRecord::Noted { notes: fresh.clone() });
        self.remember(fresh);
    }

    fn remember(&mut self, notes: Vec<Note>) {
        for n in notes {
            let bytes = n.bytes();
            if self.ledger.insert((n.ts, n.partition), n).is_none() {
                self.ledger_bytes += bytes;
            }
        }
    }

    /// Notes read back from the log at start.
    pub fn restore_notes(&mut self, notes: Vec<Note>) {
        self.remember(notes);
    }

    /// The site has applied the primary up to `applied` (its `SiteTime`):
    /// the notes up to it are done.
    /// A replica catching up is whole once that passes every note its
    /// earlier processes could have acknowledged (a way on when another
    /// replica is gone for good and the primary still ships).
    pub fn prune(&mut self, applied: Timestamp) {
        if applied <= self.applied {
            return;
        }
        self.applied = applied;
        if self.catching_up.as_ref().is_some_and(|c| applied >= c.past) {
            self.become_whole();
        }
        let later = self.ledger.split_off(&(applied, PartitionId::MAX));
        for n in std::mem::replace(&mut self.ledger, later).into_values() {
            self.ledger_bytes -= n.bytes();
        }
    }

    /// A note batch from the primary at the backup's leader.
    ///
    /// Once this node took part in a failover it notes nothing more: what
    /// it answered must be in what it gave the failover.
    fn note(&mut self, notes: Vec<Note>, now_ms: u64, out: &mut Outbox) {
        if self.frozen {
            return;
        }
        let ops: Vec<(OpId, Timestamp)> = notes.iter().map(|n| (n.op, n.ts)).collect();
        self.noted += ops.len() as u64;
        let others: Vec<NodeId> = self.replicas.iter().copied().filter(|&r| r != self.me).collect();
        if self.replicas.contains(&self.me) {
            self.keep(notes.clone());
        }
        if self.majority() <= usize::from(self.replicas.contains(&self.me)) || others.is_empty() {
            return send(out, Dest::Site(self.pair.primary), Message::geo(GeoMsg::Noted { from: self.site, ops }));
        }
        self.next_tag += 1;
        let tag = self.next_tag;
        for r in others {
            send(out, Dest::Node(r), Message::geo(GeoMsg::Mirror { from: self.me, tag, notes: notes.clone() }));
        }
        let holders = if self.replicas.contains(&self.me) { BTreeSet::from([self.me]) } else { BTreeSet::new() };
        self.mirroring.insert(tag, Mirroring { ops, holders, since_ms: now_ms });
    }

    /// A geo message of disaster recovery. `leader`: this node leads its
    /// site (where another site's messages land); `None` when it does not
    /// and does not know who does.
    pub fn step(&mut self, msg: GeoMsg, relayed: bool, leader: Option<NodeId>, topology: &Topology, now_ms: u64, out: &mut Outbox) {
        match msg {
            GeoMsg::Note { origin, notes } => {
                if !self.is_backup() || origin != self.pair.primary {
                    return;
                }
                match leader {
                    Some(l) if l == self.me => self.note(notes, now_ms, out),
                    Some(l) if !relayed => {
                        send(out, Dest::Node(l), Message::geo(GeoMsg::Relayed(Box::new(GeoMsg::Note { origin, notes }))))
                    }
                    _ => {}
                }
            }
            GeoMsg::Noted { from, ops } => {
                if from != self.pair.backup || self.site != self.pair.primary {
                    return;
                }
                for (op, ts) in ops {
                    send(out, Dest::Client(op.client), Message::Noted { op, ts });
                }
            }
            GeoMsg::Mirror { from, tag, notes } if self.is_backup() && self.replicas.contains(&self.me) && !self.frozen => {
                self.keep(notes);
                send(out, Dest::Node(from), Message::geo(GeoMsg::Mirrored { from: self.me, tag }));
            }
            GeoMsg::Mirrored { from, tag } => {
                let majority = self.majority();
                let Some(m) = self.mirroring.get_mut(&tag) else { return };
                m.holders.insert(from);
                if m.holders.len() >= majority {
                    let m = self.mirroring.remove(&tag).expect("just seen");
                    send(out, Dest::Site(self.pair.primary), Message::geo(GeoMsg::Noted { from: self.site, ops: m.ops }));
                }
            }
            GeoMsg::Failover { from, tag } if self.is_backup() => {
                // From now on this node notes nothing more (`note`; a mirror
                // is not kept either): every write acknowledged through it
                // is in what it answers. Logged, as the lost keys are.
                if !std::mem::replace(&mut self.frozen, true) {
                    self.frozen_ms = Some(now_ms);
                    self.log.push(LogRecord::FailingOver);
                }
                let notes: Vec<Note> = self.ledger.values().cloned().collect();
                send(out, Dest::Node(from), Message::geo(GeoMsg::Unfinished { from: self.me, tag, notes, whole: self.whole }));
            }
            GeoMsg::Unfinished { from, tag, notes, whole } => {
                let Some(f) = self.failover.as_mut().filter(|f| f.tag == tag && f.lost.is_none()) else { return };
                f.heard.insert(from);
                if whole {
                    f.whole.insert(from);
                }
                for n in notes {
                    match f.notes.get(&n.key) {
                        Some(had) if had.ts >= n.ts => {}
                        _ => {
                            f.notes.insert(n.key.clone(), n);
                        }
                    }
                }
                self.failover_step(topology, now_ms, out);
            }
            GeoMsg::Lost { from, tag, notes } => {
                self.take_lost(notes.into_iter().map(|n| (n.key, n.ts)));
                let incarnation = self.incarnation;
                send(out, Dest::Node(from), Message::geo(GeoMsg::LostTaken { from: self.me, incarnation, tag }));
            }
            GeoMsg::LostTaken { from, incarnation, tag: 0 } => {
                self.told.insert(from, incarnation);
            }
            GeoMsg::LostTaken { from, incarnation, tag } => {
                self.told.insert(from, incarnation);
                let Some(f) = self.failover.as_mut().filter(|f| f.tag == tag && f.lost.is_some()) else { return };
                f.taken.insert(from);
                self.failover_step(topology, now_ms, out);
            }
            // A node whose failover is not over yet says nothing: the asker
            // asks again (and hears the lost keys once it is).
            GeoMsg::AskLost { from, incarnation } if self.is_backup() => match (&self.lost, self.frozen) {
                (Some(lost), _) => {
                    send(out, Dest::Node(from), Message::geo(GeoMsg::Lost { from: self.me, tag: 0, notes: lost_notes(lost) }))
                }
                (None, false) => send(out, Dest::Node(from), Message::geo(GeoMsg::NoLost { from: self.me, incarnation })),
                (None, true) => {}
            },
            // An answer to an earlier process of this node does not count:
            // the failover may have come after it.
            GeoMsg::NoLost { from, incarnation } if incarnation == self.incarnation => {
                if let Some((answered, _)) = &mut self.asking {
                    answered.insert(from);
                    self.ask_lost_done(topology);
                }
            }
            GeoMsg::AskNotes { from, incarnation } if self.is_backup() && self.replicas.contains(&self.me) => {
                let notes: Vec<Note> = self.ledger.values().cloned().collect();
                send(out, Dest::Node(from), Message::geo(GeoMsg::NotesAre { from: self.me, incarnation, whole: self.whole, notes }));
            }
            // Likewise: it may lack notes acknowledged since.
            GeoMsg::NotesAre { from, incarnation, whole, notes } if incarnation == self.incarnation => {
                if self.catching_up.is_none() {
                    return;
                }
                // Kept (and logged) whoever sends them: more notes only
                // refuse more keys at a failover.
                self.keep(notes);
                let Some(c) = &mut self.catching_up else { return };
                if self.replicas.contains(&from) {
                    c.answered.insert(from);
                    if whole {
                        c.whole.insert(from);
                    }
                }
                self.caught_up();
            }
            _ => {}
        }
    }

    /// Starts failing this backup over from its primary (`Message::Failover`
    /// from client `op`); `FailedOver` answers once every node of the site
    /// has the lost keys. Only at the backup.
    pub fn start_failover(&mut self, op: OpId, force: bool, topology: &Topology, now_ms: u64, out: &mut Outbox) -> bool {
        self.run_failover(Some(op), force, topology, now_ms, out)
    }

    fn run_failover(&mut self, op: Option<OpId>, force: bool, topology: &Topology, now_ms: u64, out: &mut Outbox) -> bool {
        if !self.is_backup() {
            return false;
        }
        self.next_tag += 1;
        let tag = self.next_tag;
        self.failover = Some(Failover {
            op,
            tag,
            force,
            heard: BTreeSet::new(),
            whole: BTreeSet::new(),
            notes: AHashMap::new(),
            lost: None,
            taken: BTreeSet::new(),
            sent_ms: 0,
            reasked_ms: now_ms,
        });
        self.failover_step(topology, now_ms, out);
        true
    }

    /// Moves the failover on: asks (again) those not heard, hands out the
    /// lost notes once every node answered, answers once all took them.
    fn failover_step(&mut self, topology: &Topology, now_ms: u64, out: &mut Outbox) {
        let majority = self.majority();
        let Some(f) = self.failover.as_mut() else { return };
        let nodes: Vec<NodeId> = topology.admitted.keys().copied().collect();
        let resend = now_ms.saturating_sub(f.sent_ms) >= FAILOVER_RESEND_MS;
        // A majority of the stabilizer replicas must answer with whole
        // notes: every acknowledged write was noted on one of any majority
        // (by a process whose notes the replica still holds). A replica
        // catching up is asked again until it is whole.
        let whole = self.replicas.iter().filter(|r| f.whole.contains(r) || (f.force && f.heard.contains(r))).count();
        let all_heard = nodes.iter().all(|n| f.heard.contains(n)) && whole >= majority;
        if f.lost.is_none() && !all_heard {
            if resend || f.sent_ms == 0 {
                f.sent_ms = now_ms.max(1);
                let reask = now_ms.saturating_sub(f.reasked_ms) >= CATCH_UP_MS;
                if reask {
                    f.reasked_ms = now_ms;
                }
                let again = |n: &&NodeId| !f.heard.contains(n) || (reask && self.replicas.contains(n) && !f.whole.contains(n));
                for &n in nodes.iter().filter(again) {
                    send(out, Dest::Node(n), Message::geo(GeoMsg::Failover { from: self.me, tag: f.tag }));
                }
            }
            return;
        }
        if f.lost.is_none() {
            let mut lost: Vec<Note> = f.notes.drain().map(|(_, n)| n).collect();
            lost.sort_by(|a, b| (a.partition, &a.key).cmp(&(b.partition, &b.key)));
            f.lost = Some(lost);
            f.sent_ms = 0;
        }
        let all_taken = nodes.iter().all(|n| f.taken.contains(n));
        if all_taken {
            let f = self.failover.take().expect("running");
            let lost = f.lost.map_or(0, |l| l.len() as u64);
            if let Some(op) = f.op {
                send(out, Dest::Client(op.client), Message::FailedOver { op, lost });
            }
            return;
        }
        if resend || f.sent_ms == 0 {
            f.sent_ms = now_ms.max(1);
            let lost = f.lost.as_ref().expect("set above");
            for &n in nodes.iter().filter(|n| !f.taken.contains(n)) {
                send(out, Dest::Node(n), Message::geo(GeoMsg::Lost { from: self.me, tag: f.tag, notes: lost.clone() }));
            }
        }
    }

    /// Periodic work: mirrors no majority answered are given up; a
    /// failover asks again; after one, nodes not known to hold the lost
    /// keys get them.
    pub fn tick(&mut self, topology: &Topology, now_ms: u64, out: &mut Outbox) {
        self.mirroring.retain(|_, m| now_ms.saturating_sub(m.since_ms) < MIRROR_MS);
        if self.frozen && self.lost.is_none() && self.failover.is_none() && self.admitted {
            let since = *self.frozen_ms.get_or_insert(now_ms);
            if now_ms.saturating_sub(since) >= RESUME_MS + 1_000 * u64::from(self.me) {
                self.frozen_ms = Some(now_ms);
                self.run_failover(None, false, topology, now_ms, out);
            }
        }
        if let Some((_, asked_ms)) = &mut self.asking {
            if now_ms.saturating_sub(*asked_ms) >= FAILOVER_RESEND_MS {
                *asked_ms = now_ms;
                // Nodes removed meanwhile are no longer waited for.
                self.ask_lost_done(topology);
                self.ask_lost(topology, out);
            }
        }
        if let Some(c) = &mut self.catching_up {
            if now_ms.saturating_sub(c.asked_ms) >= CATCH_UP_MS {
                c.asked_ms = now_ms;
                self.ask_notes(out);
            }
        }
        if self.failover.is_some() {
            self.failover_step(topology, now_ms, out);
        }
        let Some(lost) = &self.lost else { return };
        if self.failover.is_some() || now_ms.saturating_sub(self.told_ms) < TELL_MS {
            return;
        }
        let untold: Vec<NodeId> =
            topology.admitted.iter().filter(|&(&n, &inc)| n != self.me && self.told.get(&n) != Some(&inc)).map(|(&n, _)| n).collect();
        self.told_ms = now_ms.max(1);
        if untold.is_empty() {
            return;
        }
        let notes = lost_notes(lost);
        for n in untold {
            send(out, Dest::Node(n), Message::geo(GeoMsg::Lost { from: self.me, tag: 0, notes: notes.clone() }));
        }
    }

    /// A new configuration: nodes it admits anew (a restart, a join) hear
    /// the lost keys at the next tick rather than after `TELL_MS`.
    pub fn reconfigured(&mut self, topology: &Topology) {
        if self.lost.is_some() && topology.admitted.iter().any(|(n, inc)| *n != self.me && self.told.get(n) != Some(inc)) {
            self.told_ms = 0;
        }
    }

    /// Whether nothing here waits on time.
    pub fn idle(&self) -> bool {
        // A node newly admitted waits to hear the lost keys (`reconfigured`).
        self.mirroring.is_empty()
            && self.failover.is_none()
            && !(self.frozen && self.lost.is_none())
            && self.catching_up.is_none()
            && self.asking.is_none()
            && !(self.lost.is_some() && self.told_ms == 0)
    }

    /// After a failover: the primary's write of `key` this node must not
    /// serve an older version than (its note's).
    pub fn lost(&self, key: &[u8]) -> Option<Version> {
        let ts = *self.lost.as_ref()?.get(key)?;
        Some(Version::local(self.pair.primary, ts))
    }

    /// Whether this backup has failed over.
    pub fn failed_over(&self) -> bool {
        self.lost.is_some()
    }

    /// The lost keys still refused (`still`: not written since), in key
    /// order, from `cursor` on, at most `count`, and the cursor after them
    /// (`CW.DR MISSING`).
    pub fn missing(&self, cursor: &[u8], count: usize, still: impl Fn(&[u8], &Version) -> bool) -> (Vec<(Bytes, Version)>, Option<Bytes>) {
        let Some(lost) = &self.lost else { return (Vec::new(), None) };
        let primary = self.pair.primary;
        let mut keys: Vec<(&Bytes, &Timestamp)> =
            lost.iter().filter(|(k, &ts)| k.as_ref() >= cursor && still(k, &Version::local(primary, ts))).collect();
        keys.sort_unstable();
        let next = keys.get(count).map(|(k, _)| (*k).clone());
        let page = keys.into_iter().take(count).map(|(k, &ts)| (k.clone(), Version::local(self.pair.primary, ts))).collect();
        (page, next)
    }

    /// How many lost keys are `still` refused.
    pub fn count_missing(&self, still: impl Fn(&[u8], &Version) -> bool) -> usize {
        let Some(lost) = &self.lost else { return 0 };
        lost.iter().filter(|(k, &ts)| still(k, &Version::local(self.pair.primary, ts))).count()
    }

    pub fn status(&self) -> DrStatus {
        DrStatus {
            role: if self.is_backup() { "backup" } else { "primary" },
            pair: Some(self.pair),
            unfinished: self.ledger.len(),
            unfinished_bytes: self.ledger_bytes,
            oldest: self.ledger.keys().next().map(|(ts, _)| *ts),
            noted: self.noted,
            lost: self.lost.as_ref().map(|l| l.len()),
            whole: self.whole,
            failing_over: self.frozen && self.lost.is_none(),
            asking: self.asking.is_some(),
        }
    }
}

/// The lost keys as notes (what `Lost` carries).
fn lost_notes(lost: &AHashMap<Bytes, Timestamp>) -> Vec<Note> {
    lost.iter().map(|(k, &ts)| Note { partition: 0, ts, key: k.clone(), op: OpId { client: 0, seq: 0 }, value_len: 0 }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::{NodeInfo, Shape};

    fn topology(nodes: u16) -> Topology {
        let infos = (0..nodes).map(|i| NodeInfo { id: i, addr: format!("n{i}") }).collect();
        let mut t = Topology::new(1, Shape { partitions: 4, replicas: 3, k: 2, coding: None }, infos).unwrap();
        t.admitted = (0..nodes).map(|i| (i, 1)).collect();
        t
    }

    fn note(p: PartitionId, ts: u64, key: &str, seq: u64) -> Note {
        Note { partition: p, ts: Timestamp::new(ts, 0), key: Bytes::from(key.to_string()), op: OpId { client: 7, seq }, value_len: 10 }
    }

    const PAIR: DrPair = DrPair { primary: 0, backup: 1 };

    /// Runs messages between the backup's nodes until none is left;
    /// returns what left the site or went to clients.
    fn settle(nodes: &mut [Dr], t: &Topology, out: Outbox) -> Outbox {
        settle_but(nodes, t, out, &[])
    }

    /// The same, with the nodes in `down` hearing nothing.
    fn settle_but(nodes: &mut [Dr], t: &Topology, mut out: Outbox, down: &[NodeId]) -> Outbox {
        let mut away = Vec::new();
        while let Some(e) = out.pop() {
            match (e.to, e.msg) {
                (Dest::Node(n), Message::Geo(_)) if down.contains(&n) => {}
                (Dest::Node(n), Message::Geo(g)) => nodes[n as usize].step(*g, true, Some(0), t, 0, &mut out),
                (to, msg) => away.push(crate::message::Envelope { to, msg }),
            }
        }
        away
    }

    /// The backup's nodes `0..n` at the site's birth, `0..3` its replicas:
    /// the replicas hear each other and are whole, nobody failed over.
    fn born(n: u16) -> Vec<Dr> {
        let t = topology(n);
        let mut nodes: Vec<Dr> = (0..n).map(|i| Dr::new(PAIR, 1, i, 1, &[0, 1, 2])).collect();
        assert!(!nodes[0].status().whole && nodes[3.min(n as usize - 1)].status().whole == (n > 3));
        let mut out = Vec::new();
        for d in nodes.iter_mut() {
            d.admitted(&t, 0, &mut out);
        }
        settle(&mut nodes, &t, out);
        assert!(nodes.iter().all(|d| d.status().whole && !d.asking()), "born whole");
        nodes
    }

    /// After a failover, node 1 restarts (incarnation 2, admitted): an
    /// answer of its earlier process that arrives late must not count as
    /// the new one holding the lost keys.
    #[test]
    fn a_late_answer_of_an_earlier_process_does_not_count_for_the_new_one() {
        let mut t = topology(3);
        let mut taker = Dr::new(PAIR, 1, 0, 1, &[0, 1, 2]);
        taker.take_lost([(Bytes::from_static(b"a"), Timestamp::new(10, 0))].into_iter());
        let mut out = Vec::new();
        taker.step(GeoMsg::LostTaken { from: 2, incarnation: 1, tag: 0 }, false, Some(0), &t, 0, &mut out);
        t.admitted.insert(1, 2);
        taker.step(GeoMsg::LostTaken { from: 1, incarnation: 1, tag: 0 }, false, Some(0), &t, 0, &mut out);
        taker.tick(&t, TELL_MS, &mut out);
        let told: Vec<NodeId> = out
            .iter()
            .filter_map(|e| match (&e.to, &e.msg) {
                (Dest::Node(n), Message::Geo(g)) if matches!(**g, GeoMsg::Lost { .. }) => Some(*n),
                _ => None,
            })
            .collect();
        assert_eq!(told, vec![1], "the new process of node 1 is told, node 2 is not again");
    }

    #[test]
    fn a_note_is_answered_once_a_majority_of_the_replicas_keep_it() {
        let t = topology(4);
        let mut nodes = born(4);
        let mut out = Vec::new();
        nodes[0].step(GeoMsg::Note { origin: 0, notes: vec![note(0, 10, "a", 1)] }, false, Some(0), &t, 0, &mut out);
        assert!(out.iter().all(|e| matches!(e.to, Dest::Node(_))), "not answered before a majority: {out:?}");
        let away = settle(&mut nodes, &t, out);
        assert!(
            matches!(&away[..], [crate::message::Envelope { to: Dest::Site(0), msg: Message::Geo(g) }] if matches!(&**g, GeoMsg::Noted { ops, .. } if ops.len() == 1)),
            "{away:?}"
        );
        assert_eq!((nodes[0].status().unfinished, nodes[1].status().unfinished, nodes[3].status().unfinished), (1, 1, 0));
        // Applied past it: done.
        nodes[1].prune(Timestamp::new(10, 0));
        assert_eq!(nodes[1].status().unfinished, 0);
    }

    #[test]
    fn a_failover_refuses_the_newest_unfinished_write_of_each_key() {
        let t = topology(3);
        let mut nodes = born(3);
        let mut out = Vec::new();
        let notes = vec![note(0, 10, "a", 1), note(0, 12, "a", 2), note(1, 11, "b", 3), note(2, 5, "c", 4)];
        nodes[0].step(GeoMsg::Note { origin: 0, notes }, false, Some(0), &t, 0, &mut out);
        settle(&mut nodes, &t, out);
        // "c" arrived; the leader's replica is gone and only one other
        // replica kept the rest (a majority of 3 holds each note).
        for n in nodes.iter_mut() {
            n.prune(Timestamp::new(5, 0));
        }
        nodes[0].ledger.clear();
        let mut out = Vec::new();
        assert!(nodes[2].start_failover(OpId { client: 9, seq: 1 }, false, &t, 0, &mut out));
        let away = settle(&mut nodes, &t, out);
        assert!(matches!(&away[..], [crate::message::Envelope { msg: Message::FailedOver { lost: 2, .. }, .. }]), "{away:?}");
        for n in &nodes {
            assert_eq!(n.lost(b"a"), Some(Version::local(0, Timestamp::new(12, 0))));
            assert_eq!(n.lost(b"b"), Some(Version::local(0, Timestamp::new(11, 0))));
            assert_eq!(n.lost(b"c"), None);
        }
        let (page, next) = nodes[1].missing(b"", 1, |_, _| true);
        assert_eq!((page.len(), next), (1, Some(Bytes::from_static(b"b"))));
        // The primary's link comes back with a write in flight: a backup
        // that failed over notes nothing more, so that write is never
        // acknowledged without being among the refused keys.
        for leader in [1, 2] {
            let mut out = Vec::new();
            nodes[leader].step(
                GeoMsg::Note { origin: 0, notes: vec![note(3, 30, "d", 9)] },
                false,
                Some(leader as NodeId),
                &t,
                0,
                &mut out,
            );
            let away = settle(&mut nodes, &t, out);
            assert!(away.is_empty(), "noted after the failover: {away:?}");
        }
    }

    /// Note "a" is kept by replicas 0 and 1 only (the mirror to 2 lost);
    /// replica 1 restarts without its log. Counted at a failover with 2,
    /// it would make a majority that knows nothing of "a", and the backup
    /// would serve an older "a" as complete.
    #[test]
    fn a_replica_that_lost_its_notes_counts_at_a_failover_only_once_caught_up() {
        let mut t = topology(4);
        let mut nodes = born(4);
        let mut out = Vec::new();
        nodes[0].step(GeoMsg::Note { origin: 0, notes: vec![note(0, 10, "a", 1)] }, false, Some(0), &t, 0, &mut out);
        let away = settle_but(&mut nodes, &t, out, &[2]);
        assert!(matches!(&away[..], [crate::message::Envelope { to: Dest::Site(0), .. }]), "noted by 0 and 1: {away:?}");
        // Node 1 restarts without its log, and node 0 goes down before node
        // 1 hears from it.
        nodes[1] = Dr::new(PAIR, 1, 1, 2, &[0, 1, 2]);
        t.admitted.insert(1, 2);
        let mut out = Vec::new();
        nodes[1].admitted(&t, 0, &mut out);
        assert!(!nodes[1].status().whole);
        settle_but(&mut nodes, &t, out, &[0]);
        assert!(!nodes[1].status().whole, "one whole answer of the two it needs");
        t.admitted.remove(&0);
        let mut out = Vec::new();
        assert!(nodes[2].start_failover(OpId { client: 9, seq: 1 }, false, &t, 0, &mut out));
        let away = settle_but(&mut nodes, &t, out, &[0]);
        assert!(away.is_empty(), "failed over with one whole replica of three: {away:?}");
        // Node 0 comes back from its log (synced, whole): node 1 catches up,
        // and the failover, asking again, finds "a".
        let log = nodes[0].checkpoint();
        assert!(log.contains(&LogRecord::NotesWhole));
        nodes[0] = Dr::new(PAIR, 1, 0, 3, &[0, 1, 2]);
        for r in log {
            if let LogRecord::Noted { notes } = r {
                nodes[0].restore_notes(notes);
            }
        }
        nodes[0].recovered(true);
        nodes[0].admitted(&t, 0, &mut Vec::new());
        t.admitted.insert(0, 3);
        let mut out = Vec::new();
        nodes[1].tick(&t, CATCH_UP_MS, &mut out);
        settle(&mut nodes, &t, out);
        assert!(nodes[1].status().whole && nodes[1].status().unfinished == 1, "caught up: {:?}", nodes[1].status());
        assert!(nodes[1].take_log().contains(&LogRecord::NotesWhole));
        let mut out = Vec::new();
        nodes[2].tick(&t, CATCH_UP_MS, &mut out);
        let away = settle(&mut nodes, &t, out);
        assert!(matches!(&away[..], [crate::message::Envelope { msg: Message::FailedOver { lost: 1, .. }, .. }]), "{away:?}");
        assert_eq!(nodes[3].lost(b"a"), Some(Version::local(0, Timestamp::new(10, 0))));
    }

    /// A restarted replica that is not whole: from a log that was not
    /// synced, or of a process that was not whole itself.
    #[test]
    fn only_a_synced_log_of_a_whole_replica_makes_a_restarted_one_whole() {
        let mut out = Vec::new();
        for (synced_whole, whole) in [(true, true), (false, false)] {
            let mut d = Dr::new(PAIR, 1, 1, 2, &[0, 1, 2]);
            d.recovered(synced_whole);
            d.admitted(&topology(4), 0, &mut out);
            assert_eq!(d.status().whole, whole);
        }
        // Not whole: it asks the two others.
        assert_eq!(out.iter().filter(|e| matches!(&e.msg, Message::Geo(g) if matches!(**g, GeoMsg::AskNotes { .. }))).count(), 2);
        // A node that is no replica is always whole.
        assert!(Dr::new(PAIR, 1, 3, 2, &[0, 1, 2]).status().whole);
    }

    /// The whole backup restarts from logs not synced throughout: no
    /// replica is whole, and each becomes whole once it heard all the
    /// others (holding every note any of them kept).
    #[test]
    fn replicas_restarted_together_from_unsynced_logs_are_whole_once_they_heard_each_other() {
        let t = topology(3);
        let mut nodes: Vec<Dr> = (0..3)
            .map(|i| {
                let mut d = Dr::new(PAIR, 1, i, 2, &[0, 1, 2]);
                d.restore_notes(vec![note(i as PartitionId, 10 + i as u64, &format!("k{i}"), i as u64)]);
                d.recovered(false);
                d
            })
            .collect();
        let mut out = Vec::new();
        nodes[0].admitted(&t, 0, &mut out);
        settle(&mut nodes, &t, out);
        assert!(nodes[0].status().whole, "heard both others");
        for i in 1..3 {
            let mut out = Vec::new();
            nodes[i].admitted(&t, 0, &mut out);
            settle(&mut nodes, &t, out);
        }
        for n in &nodes {
            assert!(n.status().whole);
        }
        assert_eq!(nodes[2].status().unfinished, 3, "every note any of them kept");
    }

    /// Node 3 is down during the failover and restarts without its log
    /// after it: until it knows whether the site failed over, it must
    /// serve nothing (it would serve "a" older than its lost write).
    #[test]
    fn a_node_that_may_have_missed_a_failover_serves_nothing_until_it_knows() {
        let mut t = topology(4);
        let mut nodes = born(4);
        let mut out = Vec::new();
        nodes[0].step(GeoMsg::Note { origin: 0, notes: vec![note(0, 10, "a", 1)] }, false, Some(0), &t, 0, &mut out);
        settle(&mut nodes, &t, out);
        // The same process admitted again (it was removed meanwhile) asks
        // again: a failover may have happened while it was out.
        let mut out = Vec::new();
        nodes[2].admitted(&t, 0, &mut out);
        assert!(nodes[2].asking());
        settle(&mut nodes, &t, out);
        assert!(!nodes[2].asking());
        // Restarted before any failover: every other node says none.
        nodes[3] = Dr::new(PAIR, 1, 3, 2, &[0, 1, 2]);
        t.admitted.insert(3, 2);
        let mut out = Vec::new();
        nodes[3].admitted(&t, 0, &mut out);
        assert!(nodes[3].asking());
        settle(&mut nodes, &t, out);
        assert!(!nodes[3].asking() && !nodes[3].failed_over());
        // Down during the failover, back after it.
        t.admitted.remove(&3);
        let mut out = Vec::new();
        assert!(nodes[1].start_failover(OpId { client: 9, seq: 1 }, false, &t, 0, &mut out));
        let away = settle_but(&mut nodes, &t, out, &[3]);
        assert!(matches!(&away[..], [crate::message::Envelope { msg: Message::FailedOver { lost: 1, .. }, .. }]), "{away:?}");
        nodes[3] = Dr::new(PAIR, 1, 3, 3, &[0, 1, 2]);
        t.admitted.insert(3, 3);
        let mut out = Vec::new();
        nodes[3].admitted(&t, 0, &mut out);
        assert!(nodes[3].asking(), "serves nothing yet");
        settle(&mut nodes, &t, out);
        assert!(!nodes[3].asking());
        assert_eq!(nodes[3].lost(b"a"), Some(Version::local(0, Timestamp::new(10, 0))));
        // A stale answer to node 3's earlier process does not count.
        nodes[3] = Dr::new(PAIR, 1, 3, 4, &[0, 1, 2]);
        nodes[3].admitted(&t, 0, &mut Vec::new());
        nodes[3].step(GeoMsg::NoLost { from: 0, incarnation: 3 }, true, Some(0), &t, 0, &mut Vec::new());
        nodes[3].step(GeoMsg::NoLost { from: 1, incarnation: 3 }, true, Some(0), &t, 0, &mut Vec::new());
        nodes[3].step(GeoMsg::NoLost { from: 2, incarnation: 3 }, true, Some(0), &t, 0, &mut Vec::new());
        assert!(nodes[3].asking());
    }

    /// Node 3 restarts empty and is admitted in a configuration the
    /// others do not hold yet, while a failover (on theirs, without node 3)
    /// is under way: the nodes that answered `Failover` but do not have the
    /// lost keys yet must not tell node 3 there are none, nor count it as
    /// told. Once the failover is over, node 3 learns the lost keys.
    #[test]
    fn a_node_asking_during_a_failover_learns_the_lost_keys_once_it_is_over() {
        let new = topology(4);
        let mut old = new.clone();
        old.admitted.remove(&3);
        let mut nodes = born(4);
        let mut out = Vec::new();
        nodes[0].step(GeoMsg::Note { origin: 0, notes: vec![note(0, 10, "a", 1)] }, false, Some(0), &new, 0, &mut out);
        settle(&mut nodes, &new, out);
        nodes[3] = Dr::new(PAIR, 1, 3, 2, &[0, 1, 2]);
        let mut views = [old.clone(), old.clone(), old.clone(), new.clone()];
        // Delivers on each node's own configuration; holds what `hold` says.
        let deliver = |nodes: &mut [Dr], views: &[Topology], mut out: Outbox, hold: &dyn Fn(&GeoMsg) -> bool| {
            let (mut away, mut held) = (Vec::new(), Vec::new());
            while let Some(e) = out.pop() {
                match (e.to, e.msg) {
                    (Dest::Node(n), Message::Geo(g)) if hold(&g) => {
                        held.push(crate::message::Envelope { to: Dest::Node(n), msg: Message::Geo(g) })
                    }
                    (Dest::Node(n), Message::Geo(g)) => nodes[n as usize].step(*g, true, Some(0), &views[n as usize], 0, &mut out),
                    (to, msg) => away.push(crate::message::Envelope { to, msg }),
                }
            }
            (away, held)
        };
        let mut out = Vec::new();
        assert!(nodes[1].start_failover(OpId { client: 9, seq: 1 }, false, &views[1], 0, &mut out));
        let (_, unfinished) = deliver(&mut nodes, &views, out, &|g| matches!(g, GeoMsg::Unfinished { .. }));
        let mut out = Vec::new();
        nodes[3].admitted(&views[3], 0, &mut out);
        deliver(&mut nodes, &views, out, &|_| false);
        assert!(nodes[3].asking(), "no node may say nothing is lost while its failover is not over");
        let (away, _) = deliver(&mut nodes, &views, unfinished, &|_| false);
        assert!(matches!(&away[..], [crate::message::Envelope { msg: Message::FailedOver { lost: 1, .. }, .. }]), "{away:?}");
        // Everyone holds the new configuration; node 3 asks again.
        for v in views.iter_mut() {
            *v = new.clone();
        }
        let mut out = Vec::new();
        for (n, d) in nodes.iter_mut().enumerate() {
            d.reconfigured(&views[n]);
            d.tick(&views[n], 10_000, &mut out);
        }
        deliver(&mut nodes, &views, out, &|_| false);
        assert!(!nodes[3].asking());
        assert_eq!(nodes[3].lost(b"a"), Some(Version::local(0, Timestamp::new(10, 0))));
    }

    /// Replica 1 restarts empty and replica 0 is gone for good: once the
    /// site has applied the primary past anything replica 1's earlier
    /// process could have acknowledged, it is whole without hearing 0.
    #[test]
    fn a_replica_whose_peer_is_gone_for_good_is_whole_once_the_site_applied_past_its_restart() {
        let t = topology(4);
        let mut nodes = born(4);
        nodes[1] = Dr::new(PAIR, 1, 1, 2, &[0, 1, 2]);
        let admitted_ms = 50_000;
        let mut out = Vec::new();
        nodes[1].admitted(&t, admitted_ms, &mut out);
        settle_but(&mut nodes, &t, out, &[0]);
        assert!(!nodes[1].status().whole);
        let past = admitted_ms + 2 * crate::hlc::MAX_CLOCK_SKEW_MS;
        nodes[1].prune(Timestamp::new(past - 1, 0));
        assert!(!nodes[1].status().whole, "a note acknowledged before its restart may still be open");
        nodes[1].prune(Timestamp::new(past, 0));
        assert!(nodes[1].status().whole);
        assert!(nodes[1].take_log().contains(&LogRecord::NotesWhole));
    }

    /// The node running a failover dies after the others answered it:
    /// they are frozen, nobody would hand out the lost keys, and node 1,
    /// back empty, would ask forever. The first of them runs it again.
    #[test]
    fn a_failover_whose_runner_died_is_run_again_by_a_node_that_answered_it() {
        let mut t = topology(4);
        let mut nodes = born(4);
        let mut out = Vec::new();
        nodes[0].step(GeoMsg::Note { origin: 0, notes: vec![note(0, 10, "a", 1)] }, false, Some(0), &t, 0, &mut out);
        settle(&mut nodes, &t, out);
        let mut out = Vec::new();
        assert!(nodes[1].start_failover(OpId { client: 9, seq: 1 }, false, &t, 0, &mut out));
        settle_but(&mut nodes, &t, out, &[1]);
        nodes[1] = Dr::new(PAIR, 1, 1, 2, &[0, 1, 2]);
        t.admitted.insert(1, 2);
        let mut out = Vec::new();
        nodes[1].admitted(&t, 0, &mut out);
        settle(&mut nodes, &t, out);
        assert!(nodes[1].asking() && nodes[0].status().failing_over);
        let tick_all = |nodes: &mut [Dr], now_ms: u64| {
            let mut out = Vec::new();
            for d in nodes.iter_mut() {
                d.tick(&t, now_ms, &mut out);
            }
            settle(nodes, &t, out)
        };
        tick_all(&mut nodes, RESUME_MS - 1);
        assert!(nodes[1].asking(), "not yet");
        let away = tick_all(&mut nodes, RESUME_MS);
        assert!(away.is_empty(), "nobody to answer: {away:?}");
        for (n, d) in nodes.iter().enumerate() {
            let s = d.status();
            assert!(!s.asking && !s.failing_over && s.lost == Some(1), "node {n}: {s:?}");
            assert_eq!(d.lost(b"a"), Some(Version::local(0, Timestamp::new(10, 0))));
        }
    }

    #[test]
    fn a_primary_node_answers_the_sessions_of_noted_writes() {
        let t = topology(3);
        let mut primary = Dr::new(PAIR, 0, 0, 1, &[0, 1, 2]);
        assert_eq!(primary.backup_of_primary(), Some(1));
        let mut out = Vec::new();
        let op = OpId { client: 5, seq: 3 };
        let ts = Timestamp::new(10, 0);
        primary.step(GeoMsg::Noted { from: 1, ops: vec![(op, ts)] }, false, Some(0), &t, 0, &mut out);
        assert!(
            matches!(&out[..], [crate::message::Envelope { to: Dest::Client(5), msg: Message::Noted { op: o, ts: t } }] if *o == op && *t == ts)
        );
        // Not from its backup: ignored.
        out.clear();
        primary.step(GeoMsg::Noted { from: 2, ops: vec![(op, ts)] }, false, Some(0), &t, 0, &mut out);
        assert!(out.is_empty());
    }
}
