//! One error type for what Causeway's core reports, in user terms (toyDB's
//! `error.rs` is the model).
//!
//! Two kinds, and callers treat them differently:
//! * deterministic: `InvalidInput` (a request, flag or token that cannot be
//!   used) and `InvalidData` (bytes that do not decode: a corrupt frame or
//!   log record, or another format). The same input fails the same way:
//!   retrying does not help, fixing the input does;
//! * transient: `Timeout`, `Unavailable` and `Behind`. The site may answer
//!   later (after repair, or once other sites' writes arrive): retrying is
//!   the remedy.

use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// No answer in time (a node is down or overloaded).
    Timeout,
    /// Too few replicas of the key's partition are alive to accept writes.
    Unavailable { alive: u8, needed: u8 },
    /// A request, setting or token that cannot be used, and why.
    InvalidInput(String),
    /// Bytes that do not decode, and why.
    InvalidData(String),
    /// A session resumed in this site depends on writes of these sites
    /// that it has not applied yet (ChainReaction §3.4.2).
    Behind { sites: Vec<crate::version::SiteId> },
    /// The write's head is over its memory budget (Redis's `-OOM`).
    OutOfMemory,
    /// A node's disk tier failed (why); nothing acknowledged is lost.
    Disk(String),
    /// After a failover to this backup site (identifier-first disaster
    /// recovery): the primary acknowledged write `missing` of `key`, whose
    /// value never arrived. The key is refused, never served older, until
    /// it is written again (Redis's `-LOST`).
    Lost { key: bytes::Bytes, missing: crate::version::Version },
    /// Disaster recovery at the primary: the write was applied here, but
    /// the backup site did not note it in time, so it is not acknowledged
    /// (the backup is unreachable or slow).
    NotNoted,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Timeout => f.write_str("timed out waiting for the replicas"),
            Error::Unavailable { alive, needed } => {
                write!(f, "only {alive} replicas of this key's partition are alive and writes need {needed}; retry after repair")
            }
            Error::InvalidInput(why) | Error::InvalidData(why) => f.write_str(why),
            Error::OutOfMemory => f.write_str("command not allowed when used memory > 'maxmemory'."),
            Error::Disk(why) => write!(f, "disk tier: {why}"),
            Error::NotNoted => f.write_str(
                "timed out waiting for the backup site to note the write (disaster recovery): it is applied here but not acknowledged; retry, or check the link to the backup and whether the backup has failed over (CW.DR STATUS at the backup)",
            ),
            Error::Lost { key, missing } => write!(
                f,
                "key '{}': its write {missing} was acknowledged by site {} and its value never reached this site; write the key to clear this",
                String::from_utf8_lossy(key),
                missing.site
            ),
            Error::Behind { sites } => {
                let sites: Vec<String> = sites.iter().map(|s| s.to_string()).collect();
                write!(f, "the session depends on writes of site(s) {} this site has not applied yet; try again later", sites.join(","))
            }
        }
    }
}

impl std::error::Error for Error {}

/// The shells (CLI, node start-up) report errors as text.
impl From<Error> for String {
    fn from(e: Error) -> String {
        e.to_string()
    }
}

pub type Result<T> = std::result::Result<T, Error>;
