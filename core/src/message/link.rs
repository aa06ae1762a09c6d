//! How a binary connection opens: the byte that tells it from a Redis
//! client, who is speaking, and what the accepting node answers.

use super::client::ClientId;
use crate::ring::NodeId;
use crate::version::SiteId;
use serde::{Deserialize, Serialize};

/// The first byte of a binary (peer or native client) connection. It is not
/// ASCII, so a node tells binary connections from Redis clients on the same
/// port by it.
pub const BINARY_MAGIC: u8 = 0xCA;

/// The node's answer to a native client's `Hello`, sent once the client is
/// registered (so replies from any node of the site reach it from then on):
/// `Err` says why the connection is refused.
pub type Welcome = Result<Greeting, String>;

/// What a node tells a native client it accepts about the site.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Greeting {
    /// The site is the primary of a disaster-recovery pair (`geo::dr`): a
    /// write is acknowledged once its backup has noted it too
    /// (`driver::Driver::set_noted`).
    pub noted: bool,
}

/// The first frame of a binary connection: who is speaking.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Hello {
    /// Another node of the site: the connection carries its messages to us,
    /// each frame a `(sequence number, Message)` of the sender's `stream`
    /// (one per sending process and peer), so frames that a broken
    /// connection may have lost are resent on the next one and duplicates
    /// dropped. The acceptor answers with `LinkReply`s.
    Node { id: NodeId, stream: u64 },
    /// A native client: replies for it go back on this connection. The
    /// password is checked against the node's `requirepass`.
    Client { id: ClientId, password: Option<String> },
    /// The coordinator's Raft member on node `NodeId`: the connection carries
    /// Raft RPCs, each request frame answered by one response frame.
    Raft(NodeId),
    /// A node of another site: like `Node`, carrying geo-replication only.
    Site { site: SiteId, node: NodeId, stream: u64 },
}

/// What a node sends back on a connection another node opened to it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LinkReply {
    /// Right after the hello: this process (`incarnation`) has taken every
    /// frame of the stream up to `last`; the sender resends what follows.
    Resume { incarnation: u64, last: u64 },
    /// Every frame up to this sequence number has been taken.
    Ack(u64),
    /// To another site's link: dial this node of the site instead (one of
    /// the addresses the link was given), where what the link carries is
    /// taken without a relay: the site's geo leader, which runs its
    /// receiver and leads its stabilizer.
    Redirect(String),
}
