//! Erasure-coded groups (Cocytus, FAST '16): a memory-efficient redundancy
//! mode. A group has K data members and M parity members. Each value is
//! kept once, in the area of the data member its key belongs to; the M
//! parity members keep the Reed-Solomon parity of the K data areas, page by
//! page, and a replica of every data member's metadata (key -> place). Any
//! M members of a group can fail with nothing acknowledged lost, for
//! (K+M)/K times the values' bytes instead of R times.
//!
//! * `code`: the Reed-Solomon code, parity deltas, decoding.
//! * `area`: a member's bytes in 4 KB pages, and where values go in them.
//! * `member`: one member as a state machine: the update protocol
//!   (data member -> parity members -> commit) and the online recovery of
//!   a lost data member, led by a parity member (preparation, then page
//!   repair at consistent cuts, on demand and in the background).
//! * `site`: the groups of a site (`ring::Coding`) and a node's members of
//!   them, as one `Engine` the node drives.
//!
//! What the group does not decide: who is alive. That comes in as a
//! `Config` (the coordinator's, or the simulator's), each change with a new
//! epoch.

pub mod area;
pub mod code;
pub mod index;
pub mod member;
pub mod site;

pub use crate::message::ec::{EcMsg, Loc, Meta, Slot, Stamp, Standing, State, WriteId};
pub use member::{Config, Member, Memory, Out, PutReq, Reply};
