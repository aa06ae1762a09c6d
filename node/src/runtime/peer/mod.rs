//! Binary connections to the other nodes of the site and to other sites.
//!
//! Each node keeps one outbound `link::Link` per peer (ordered, resent
//! across reconnects, bounded: see `link`), and one `wan::SiteLink` per
//! other site, through an emulated wide-area network. What peers send this
//! node arrives on the connections they open (`runtime::inbound`).

pub mod link;
pub mod wan;

use causeway_core::ring::NodeId;
use causeway_core::version::SiteId;

/// Who is at the other end of a peer connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Peer {
    /// A node of this site.
    Node(NodeId),
    /// A node of another site.
    Site(SiteId, NodeId),
}
