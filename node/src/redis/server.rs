//! What the Redis connections of a node share, as Redis keeps it in its
//! `server` struct: the clock commands read, the counters INFO shows, and
//! the limits on what a client may send.

use super::stats::Stats;
use crate::runtime::Clock;
use causeway_resp::Limits;

pub struct Server {
    /// The node's wall clock (`runtime::Clock`): commands read the time
    /// through it.
    pub clock: Clock,
    pub stats: Stats,
    /// What a request may hold (`NodeConfig::limits`).
    pub limits: Limits,
}
