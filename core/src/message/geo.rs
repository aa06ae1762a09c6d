//! What geo-replication sends (`crate::geo`), between sites and inside one,
//! and what those messages carry: update ids and their place in a site's
//! stream (`geo::stabilizer`), values and remote writes (`geo::receiver`),
//! the batches partitions send (`geo::reporter`), sequencer numbers
//! (`geo::sequencer`) and the visibility summary (`geo::visibility`).
//!
//! A `GeoMsg` is taken in two steps: the node (`crate::node`, its `geo`
//! part) keeps those a chain replica answers (`Apply`, `Promises`,
//! `Promise`, `Sequenced`) and hands every other to `geo::Geo::step`.

use crate::hlc::Timestamp;
use crate::message::client::OpId;
use crate::ring::{NodeId, PartitionId};
use crate::version::{SiteId, Version, VersionVector};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use smallvec::SmallVec;
use std::collections::BTreeMap;

/// What geo-replication sends, between sites and inside one.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, strum::IntoStaticStr)]
pub enum GeoMsg {
    /// A node's tails -> a stabilizer replica of its site (one batch per
    /// partition, all of a tick or a `Geo::flush` in one message).
    Ids(Vec<IdBatch>),
    /// A stabilizer replica -> the tail of each `ack.partition`.
    IdsAcks(Vec<IdsAck>),
    /// A stabilizer leader -> another site, for its receiver.
    Ship(Ship),
    /// A receiver -> the origin site, for every stabilizer replica there.
    SiteAck(SiteAck),
    /// A node's tails -> another site, for its receiver: each partition's
    /// values (data and metadata travel apart, Eunomia §5).
    Values {
        origin: SiteId,
        batches: Vec<Batch<RemoteValue>>,
    },
    /// A receiver -> the origin site, for the tail of each `ack.partition`.
    ValuesAcks(Vec<ValuesAck>),
    /// A receiver -> the head of the local chain of `write.partition`.
    Apply {
        epoch: u64,
        write: RemoteWrite,
        from: NodeId,
    },
    /// A head -> the receiver on `from` of `Apply`: the write (or a later
    /// version of its key) is stable in the local chain.
    Applied {
        origin: SiteId,
        partition: PartitionId,
        ts: Timestamp,
    },
    /// Down a chain, batched per successor: (partition, seq, ts) promises
    /// (`ChainReplica::make_promise`). `asked`: made because the leader
    /// asked for promises past this time (`Promise`), so tails send them on
    /// as soon as they all have it (`Geo::flush`).
    Promises {
        epoch: u64,
        items: Vec<(PartitionId, u64, Timestamp)>,
        asked: Option<Timestamp>,
    },
    /// The leader -> every node of its site: what the site has applied of
    /// each other site (for get-transactions, `Message::SnapshotRead`), and
    /// what each other site has applied of this one (`seen_by`, from its
    /// acknowledgements: `CW.WAIT`). `probe` (the leader, its time): each
    /// node answers `Synced` once its disk holds what it had logged when
    /// this arrived (`Geo::take_probes`).
    /// `visible`: the leader's summary of remote visibility per origin
    /// (`visibility`). `durable`: how much of each other site's stream is
    /// also synced on every node here (`Receiver::durable`).
    SiteTime {
        applied: VersionVector,
        durable: VersionVector,
        seen_by: VersionVector,
        probe: (NodeId, u64),
        visible: BTreeMap<SiteId, Delays>,
    },
    /// A node -> the leader that sent `probe`: everything it had logged
    /// when the probe arrived is synced. Once every node of the site says
    /// so, what the receiver had applied when it sent the probe survives
    /// the site crashing whole, and the origins may forget it
    /// (`Receiver::synced`).
    Synced {
        from: NodeId,
        probe: (NodeId, u64),
    },
    /// Passed on inside a site by the node that received it from another
    /// site: handled where it lands, never passed on again.
    Relayed(Box<GeoMsg>),
    /// The stabilizer leader -> every node of its site: ids up to this
    /// time wait to become stable, so heads promise past it at once
    /// (`Geo::ask_promises`). Heads promise only when asked (at most every
    /// `ASK_MS`) and every `IDLE_PROMISE_MS`: a site that takes no writes
    /// sends few promises, and a write's id does not wait for a tick.
    Promise(Timestamp),
    /// `Replication::Sequenced`: a head -> the stabilizer leader, for the
    /// write's number before the head orders it.
    Sequence {
        from: NodeId,
        req: SeqRequest,
    },
    /// The leader's answer.
    Sequenced(SeqReply),
    /// Identifier-first disaster recovery (`geo::dr`): heads of the primary
    /// site -> its backup site: the writes they ordered, by key and
    /// identifier, without their values. Their clients are answered once
    /// the backup has noted them (`Noted`).
    Note {
        origin: SiteId,
        notes: Vec<Note>,
    },
    /// The backup -> its primary: these writes are noted on a majority of
    /// the backup's stabilizer replicas: each a write's id (its session and
    /// `Put::write`) and the timestamp noted (an attempt ordered again by
    /// another head has another).
    Noted {
        from: SiteId,
        ops: Vec<(OpId, Timestamp)>,
    },
    /// The backup's leader -> its other stabilizer replicas: keep these
    /// notes too, and answer `Mirrored` with `tag`.
    Mirror {
        from: NodeId,
        tag: u64,
        notes: Vec<Note>,
    },
    Mirrored {
        from: NodeId,
        tag: u64,
    },
    /// A failover at the backup: the node running it (`from`) -> every node
    /// of its site: send me the notes you keep (`Unfinished`).
    Failover {
        from: NodeId,
        tag: u64,
    },
    /// `whole`: this node holds every note its stabilizer replica ever
    /// acknowledged (or is no replica); only whole replicas count toward
    /// the failover's majority (`geo::dr`).
    Unfinished {
        from: NodeId,
        tag: u64,
        notes: Vec<Note>,
        whole: bool,
    },
    /// The node running the failover -> every node of its site: the keys
    /// whose noted write never arrived; serve none of them older than its
    /// note, and answer `LostTaken`.
    Lost {
        from: NodeId,
        tag: u64,
        notes: Vec<Note>,
    },
    /// `from`'s incarnation `incarnation` holds the lost keys (an answer
    /// of an earlier process must not count for the one admitted now).
    LostTaken {
        from: NodeId,
        incarnation: u64,
        tag: u64,
    },
    /// A stabilizer replica of the backup whose process lost the notes an
    /// earlier one acknowledged (restarted without a whole log) -> the
    /// other replicas: send me yours (`NotesAre`).
    AskNotes {
        from: NodeId,
        incarnation: u64,
    },
    /// A backup node admitted after a failover it may have missed -> every
    /// other node of its site: hand me the lost keys (`Lost`), or say you
    /// have none (`NoLost`).
    AskLost {
        from: NodeId,
        incarnation: u64,
    },
    /// `incarnation`: of the process that asked.
    NoLost {
        from: NodeId,
        incarnation: u64,
    },
    /// The notes a replica keeps, and whether they are whole.
    NotesAre {
        from: NodeId,
        /// Of the process that asked.
        incarnation: u64,
        whole: bool,
        notes: Vec<Note>,
    },
}

impl GeoMsg {
    /// Whether this may come over the link from site `from` to site `me`:
    /// only what travels between sites (shipped ids, values, and the
    /// acknowledgements of both), naming `from` as its sender and `me` as
    /// its destination. Everything else is for nodes of one site: from
    /// another site, an `Apply` would write into a head past the receiver's
    /// dependency checks.
    pub fn from_site(&self, from: SiteId, me: SiteId) -> bool {
        match self {
            GeoMsg::Ship(s) => s.origin == from && s.to == me,
            GeoMsg::Values { origin, .. } => *origin == from,
            GeoMsg::SiteAck(a) => a.from == from && a.origin == me,
            GeoMsg::ValuesAcks(acks) => acks.iter().all(|a| a.from == from && a.origin == me),
            GeoMsg::Note { origin, .. } => *origin == from,
            GeoMsg::Noted { from: f, .. } => *f == from,
            _ => false,
        }
    }
}

/// A write of the primary site as its backup notes it before the write is
/// acknowledged (identifier-first, `geo::dr`): its key and identifier (the
/// partition and the version's timestamp; the site is the primary), no
/// value.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Note {
    pub partition: PartitionId,
    pub ts: Timestamp,
    pub key: Bytes,
    /// The write's id (its session and `Put::write`): whom to answer.
    pub op: OpId,
    /// The size of its value, which follows on the site shipping (what
    /// the backup would miss: `CW.DR STATUS`).
    pub value_len: u32,
}

impl Note {
    /// Its key's and value's bytes.
    pub fn bytes(&self) -> usize {
        self.key.len() + self.value_len as usize
    }
}

/// Which site backs up which (`causeway node --dr PRIMARY=BACKUP`): the
/// primary's writes are acknowledged once the backup has noted them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrPair {
    pub primary: SiteId,
    pub backup: SiteId,
}

impl std::str::FromStr for DrPair {
    type Err = String;
    fn from_str(s: &str) -> Result<DrPair, String> {
        let bad = || format!("--dr takes PRIMARY=BACKUP (two site ids), not '{s}'");
        let (p, b) = s.split_once('=').ok_or_else(bad)?;
        let (primary, backup) = (p.trim().parse().map_err(|_| bad())?, b.trim().parse().map_err(|_| bad())?);
        if primary == backup {
            return Err(format!("--dr {s}: a site cannot be its own backup"));
        }
        Ok(DrPair { primary, backup })
    }
}

/// A stabilizer replica. The coordinator nodes are the natural home, so it
/// is named like a node.
pub type ReplicaId = NodeId;

/// Where an id sits in its site's shipped stream: by timestamp, then by
/// partition (Eunomia §3.1: equal timestamps of different partitions are
/// concurrent, any fixed order will do). A position also stands for "every id
/// up to here": `Position::through(t)` covers every id with timestamp <= t.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Position {
    pub ts: Timestamp,
    pub partition: PartitionId,
}

impl Position {
    /// The beginning of a stream, before every id.
    pub const START: Position = Position { ts: Timestamp::ZERO, partition: PartitionId::MAX };

    /// Covers every id with timestamp <= `ts`.
    pub fn through(ts: Timestamp) -> Position {
        Position { ts, partition: PartitionId::MAX }
    }

    /// The largest time `t` such that this position covers every id with
    /// timestamp <= `t`.
    pub fn time(self) -> Timestamp {
        if self.partition == PartitionId::MAX {
            self.ts
        } else {
            self.ts.just_before()
        }
    }

    /// The position just before this one.
    pub fn before(self) -> Position {
        match self.partition {
            0 => Position::through(self.ts.just_before()),
            p => Position { ts: self.ts, partition: p - 1 },
        }
    }
}

impl Default for Position {
    fn default() -> Position {
        Position::START
    }
}

/// An update's vector as ids carry it: one entry per site, inline up to four
/// sites so that copying an id (once per destination) never allocates
/// (`VersionVector` keeps two inline, for per-key memory).
pub type IdVector = SmallVec<[Timestamp; 4]>;

/// The identifier of one update, what the stabilizer orders and ships
/// (Eunomia §5: `u.id` and the partition, no key and no value; the value
/// travels from the partition to its siblings in the other sites directly).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct UpdateId {
    /// The partition that wrote it (the same partition holds the key in every
    /// site, so it also says where the value comes from).
    pub partition: PartitionId,
    /// Its timestamp: its entry in its own site's slot of `vv`.
    pub ts: Timestamp,
    /// The writer's causal past in its own site: the update depends on every
    /// update of its site with timestamp <= `local_dep` (the `after` the
    /// head received with the write, Alg. 2 line 5's Clock_c). With it a
    /// receiver may apply concurrent updates of one site in parallel instead
    /// of one at a time; `ts.just_before()` is always safe.
    pub local_dep: Timestamp,
    /// Its vector (Eunomia §4, `u.vts`): its dependencies on other sites.
    pub vv: IdVector,
}

impl UpdateId {
    pub fn position(&self) -> Position {
        Position { ts: self.ts, partition: self.partition }
    }
}

/// partition -> one destination: the items it has not acknowledged, and a
/// promise (Alg. 2 `add_op`, `heartbeat`, and §3.3's batches).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Batch<T> {
    pub partition: PartitionId,
    /// The batch continues the partition's stream right after this time:
    /// the destination must already hold everything up to it.
    pub prev: Timestamp,
    /// In increasing timestamp order, all greater than `prev`.
    pub items: Vec<T>,
    /// No item of this partition at or below `up_to` is missing from what
    /// the destination then holds (>= the last item's timestamp).
    pub up_to: Timestamp,
}

/// partition -> every stabilizer replica of its site: the ids the replica
/// has not acknowledged, and a promise (`geo::reporter`).
pub type IdBatch = Batch<UpdateId>;

/// stabilizer replica -> partition: "I hold your stream up to `up_to`, and
/// every other site has applied it up to `applied`". The partition keeps
/// ids until they are applied everywhere, so that stabilizer replicas that
/// all restarted (a whole-site restart) get again what no site has applied.
/// `resend`: the last batch did not continue what the replica holds; send
/// again from `up_to`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdsAck {
    pub replica: ReplicaId,
    pub partition: PartitionId,
    pub up_to: Timestamp,
    pub applied: Timestamp,
    pub resend: bool,
}

/// stabilizer leader of `origin` -> the receiver of site `to`: the next part
/// of `origin`'s stream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ship {
    pub origin: SiteId,
    pub to: SiteId,
    /// The stream position this shipment continues from.
    pub prev: Position,
    /// In stream order, all after `prev`.
    pub ids: Vec<UpdateId>,
    /// The stream is complete up to here once `ids` are added: the origin's
    /// stable time when `ids` reach it, else the last id's position.
    pub through: Position,
    /// What site `to` acknowledged as applied: a receiver that started anew
    /// (its site's leader changed) resumes from there instead of waiting
    /// for values the origin no longer keeps.
    pub applied: Position,
}

/// receiver of `from` -> every stabilizer replica of `origin`: how far
/// `from` has received `origin`'s stream (everything up to `received`,
/// without a gap), how far it has applied it (made it stable in its local
/// chains, `visible`), and how far what it applied is also synced to disk
/// on every node of `from` (`applied`: what survives `from` crashing
/// whole, so the origin may forget it). `resend`: a shipment left a gap,
/// ship again from `received`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SiteAck {
    pub from: SiteId,
    pub origin: SiteId,
    pub received: Position,
    pub applied: Position,
    pub visible: Position,
    pub resend: bool,
}

/// A value sent by a partition of `origin` to its sibling partition here.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteValue {
    pub origin: SiteId,
    pub partition: PartitionId,
    pub ts: Timestamp,
    pub key: Bytes,
    /// `None` deletes.
    pub value: Option<Bytes>,
    pub expires_at_ms: Option<u64>,
}

/// A remote update ready to be applied: to be written through the head of
/// `partition`'s local chain with exactly this version (last-writer-wins
/// against what the chain holds), then reported stable with
/// `ReceiverMsg::Applied` once the chain's tail has it, whether it won or
/// lost.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteWrite {
    pub partition: PartitionId,
    pub key: Bytes,
    pub value: Option<Bytes>,
    pub expires_at_ms: Option<u64>,
    pub version: Version,
}

/// receiver of `from` -> the partition `partition` of `origin`: how far its
/// value stream is here (`received`) and how far the values were applied
/// (stable in this site's chains, so never needed again); `resend`: a batch
/// left a gap, send again from `received`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ValuesAck {
    pub from: SiteId,
    pub origin: SiteId,
    pub partition: PartitionId,
    pub received: Timestamp,
    pub applied: Timestamp,
    pub resend: bool,
}

/// A head asks its site's sequencer for the next number before ordering a
/// write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeqRequest {
    /// The partition whose head asks, so the reply finds its way back.
    pub partition: PartitionId,
    /// Chosen by the asker to match the reply to the write waiting for it.
    pub tag: u64,
}

/// The sequencer's answer to a `SeqRequest`: its `partition` and `tag`, and
/// the number the write gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeqReply {
    pub partition: PartitionId,
    pub tag: u64,
    /// The write's place in the site's stream: consecutive from 1.
    pub seq: u64,
}

/// One origin's delays over the window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delays {
    pub p50_ms: u64,
    pub p99_ms: u64,
    /// Updates the percentiles are over.
    pub count: u64,
}
