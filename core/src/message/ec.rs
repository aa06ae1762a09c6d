//! What the members of an erasure-coded group say to each other (Cocytus):
//! a data member's updates to the parity members and their answers, and
//! the recovery of a lost data member (preparation, then page repair at
//! consistent cuts). Sent over FIFO links, like every link between nodes.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// A member's place in its group: `0..K` data, `K..K+M` parity.
pub type Slot = u8;

/// The order of one data slot's updates. A parity member that takes over a
/// lost data slot stamps its updates with the configuration epoch it took
/// it over at, so they order after everything the lost member sent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Stamp {
    pub epoch: u64,
    pub seq: u64,
}

/// Where a value lies in its data slot's area.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Loc {
    pub at: u64,
    pub len: u32,
}

/// A key's metadata: where its value lies, the caller's word for its
/// version (a node keeps its hybrid timestamp there), and when it expires
/// (Unix ms, 0: never; a plain number keeps every key's metadata 8 bytes
/// smaller than an `Option`). Replicated at every parity member; never
/// erasure-coded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Meta {
    pub loc: Loc,
    pub version: u64,
    pub expires_at_ms: u64,
}

impl Meta {
    pub fn expires_at(&self) -> Option<u64> {
        (self.expires_at_ms != 0).then_some(self.expires_at_ms)
    }

    /// Whether the key is gone at `now_ms` (a read finds nothing).
    pub fn expired(&self, now_ms: u64) -> bool {
        self.expires_at().is_some_and(|at| at <= now_ms)
    }
}

/// Which client request a write is (its session and the write's number
/// there), and below which number the session has finished every write: a
/// resend is answered without writing again, wherever the slot is served
/// by then.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WriteId {
    pub client: u64,
    pub write: u64,
    pub done_below: u64,
}

/// A node's standing in a coded site's groups, as every node's engine
/// merges it (the higher `gen` wins): `gen` counts its changes, round and
/// round alive (`gen % 3 == 0`), lost (1), joining (2: a replacement being
/// rebuilt), and `incarnation` is the process it stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Standing {
    pub gen: u64,
    pub incarnation: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Alive,
    Lost,
    Joining,
}

impl Standing {
    pub fn state(&self) -> State {
        match self.gen % 3 {
            0 => State::Alive,
            1 => State::Lost,
            _ => State::Joining,
        }
    }

    /// The next standing in `state`, for `incarnation`.
    pub fn then(&self, state: State, incarnation: u64) -> Standing {
        let want = match state {
            State::Alive => 0,
            State::Lost => 1,
            State::Joining => 2,
        };
        let gen = (self.gen + 1..).find(|g| g % 3 == want).expect("one of the next three");
        Standing { gen, incarnation }
    }
}

/// `old ^ new` for the bytes at `at` of a data slot's area: a parity
/// member adds `coefficient * bytes` to its parity at the same offset.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Diff {
    pub at: u64,
    pub bytes: Bytes,
}

/// Whether an update (its key and version) only gives pages back: it
/// zeroes pages no value is on any more and changes no key
/// (`Member::give_back`). No write has version 0 (they start at 1), so an
/// empty key at version 0 says it.
pub fn gives_back(key: &[u8], version: u64) -> bool {
    version == 0 && key.is_empty()
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum EcMsg {
    /// Data slot `slot` wrote `key` (`meta`, or deleted it with `None`):
    /// its area changed by `diffs`. The parity member applies the diffs at
    /// once, keeps the update until it is committed, and acknowledges.
    Update {
        slot: Slot,
        stamp: Stamp,
        key: Bytes,
        meta: Option<Meta>,
        version: u64,
        id: Option<WriteId>,
        diffs: Vec<Diff>,
        /// The parity members it went to (what its commit waits for): one
        /// outside it that lacks it was not counted by its server.
        to: u64,
    },
    Ack {
        slot: Slot,
        stamp: Stamp,
    },
    /// Every parity member has the slot's updates through `stamp`: the
    /// parity member forgets them (they will never be undone).
    Commit {
        slot: Slot,
        stamp: Stamp,
    },
    /// Preparation (the recovery leader, at configuration `epoch`): which
    /// updates of the lost data `slots` do you have?
    Prepare {
        epoch: u64,
        slots: Vec<Slot>,
    },
    /// Per slot: the last update received, the stamp epoch of the server
    /// whose stream this member follows (`source`), and whom that update
    /// went to (`Update::to`; all ones when not known): a member that lacks
    /// an update another holds and was not among whom it went to missed
    /// writes committed without it (a change of server, or a server that
    /// counted it lost), and its parity is not the slot's.
    Received {
        epoch: u64,
        stamps: Vec<Received>,
    },
    /// Keep the lost slots' updates through these stamps, undo the later
    /// ones (no data member committed them), refuse any more from them:
    /// the new server stamps its updates from epoch `source` on.
    Stable {
        epoch: u64,
        stamps: Vec<(Slot, Stamp)>,
        source: u64,
    },
    Prepared {
        epoch: u64,
    },
    /// Page repair `id` (the recovery leader to the members holding the
    /// `sources` data slots, and to the `parity` members): send `pages` of
    /// your area, as they are at your place in the FIFO stream. A data
    /// member sends a `Marker` to each parity member after its pages.
    Cut {
        epoch: u64,
        id: u64,
        pages: Vec<u32>,
        sources: Vec<Slot>,
        parity: Vec<Slot>,
        leader: Slot,
    },
    /// The data slot `slot`'s updates through `through` are in the pages it
    /// sent for cut `id`; those after it are not.
    Marker {
        epoch: u64,
        id: u64,
        slot: Slot,
        through: Stamp,
        pages: Vec<u32>,
        sources: Vec<Slot>,
        leader: Slot,
    },
    /// `slot`'s pages for cut `id`, in the cut's order.
    Pages {
        epoch: u64,
        id: u64,
        slot: Slot,
        pages: Vec<Bytes>,
    },
    /// A member coming back (a replacement, rebuilt at configuration
    /// `epoch`) asks for data slot `slot`'s state: a rebuilding parity
    /// member asks the member serving each data slot (pages and metadata);
    /// a data member taking its slot back asks a parity member (the
    /// metadata replica, once its preparation fenced the slot).
    Join {
        epoch: u64,
        slot: Slot,
        /// Parts of the state received so far: 0 asks for it (again, from
        /// the start); more lets the sender send the next few (the state
        /// goes a few parts at a time, paced by the receiver).
        have: u32,
    },
    /// You are alive in my configuration, but I never sent you data slot
    /// `slot`'s state as its server (it changed server while you were
    /// being rebuilt): your parity is not its; be rebuilt again.
    Stale {
        epoch: u64,
        slot: Slot,
    },
    /// Part `part` (from 0) of data slot `slot`'s state for a `Join`: pages (number, bytes;
    /// pages never written are left out), metadata entries, and in the last
    /// part what comes with them. The sender's updates of the slot that
    /// follow on the link are not in it.
    State {
        epoch: u64,
        slot: Slot,
        part: u32,
        pages: Vec<(u32, Bytes)>,
        entries: Vec<(Bytes, Meta)>,
        end: Option<Box<StateEnd>>,
    },
}

/// One parity member's word on one slot in a preparation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Received {
    pub slot: Slot,
    pub last: Stamp,
    pub source: u64,
    pub to: u64,
}

/// The last part of a slot's state: the last update in it, where its bytes
/// end, the sessions' recent writes (`WriteId`s: client, finished below,
/// write -> version), and the updates in it not committed yet (a parity
/// member may have to undo them).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateEnd {
    pub last: Stamp,
    /// Whom the update at `last` went to (all ones when not known).
    pub last_to: u64,
    /// The epoch the sender's updates of the slot are stamped with.
    pub source: u64,
    pub extent: u64,
    pub sessions: Sessions,
    pub pending: Vec<StatePending>,
}

/// Sessions' recent writes: (client, finished below, [(write, version)]).
pub type Sessions = Vec<(u64, u64, Vec<(u64, u64)>)>;

/// An update in a slot's state that is not committed yet: as a parity
/// member buffers it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatePending {
    pub stamp: Stamp,
    pub key: Bytes,
    pub old: Option<Meta>,
    pub version: u64,
    pub id: Option<WriteId>,
    pub diffs: Vec<Diff>,
}
