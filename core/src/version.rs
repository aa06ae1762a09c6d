//! Versions of a key. Every write gets one at the head of its chain.
//!
//! The model is ready for several sites (Eunomia §4): a version carries its
//! hybrid timestamp, the site where it was written, and a vector with one
//! entry per site (the origin's own entry is the timestamp; the others are the
//! remote updates it depends on). With one site the vector has one entry.
//! Concurrent versions are ordered last-writer-wins on (timestamp, site),
//! ChainReaction §3.4.

use crate::hlc::Timestamp;
use serde::{Deserialize, Serialize};
use smallvec::SmallVec;
use std::cmp::Ordering;
use std::fmt;

/// Identifies a site (datacenter). Single-site deployments use site 0.
pub type SiteId = u16;

/// One entry per site, indexed by `SiteId`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct VersionVector(pub SmallVec<[Timestamp; 3]>);

impl VersionVector {
    /// The vector of an update written at `site` at `ts` with no remote
    /// dependencies.
    pub fn local(site: SiteId, ts: Timestamp) -> Self {
        let mut v = SmallVec::from_elem(Timestamp::ZERO, site as usize + 1);
        v[site as usize] = ts;
        VersionVector(v)
    }

    pub fn get(&self, site: SiteId) -> Timestamp {
        self.0.get(site as usize).copied().unwrap_or(Timestamp::ZERO)
    }

    pub fn set(&mut self, site: SiteId, ts: Timestamp) {
        if self.0.len() <= site as usize {
            self.0.resize(site as usize + 1, Timestamp::ZERO);
        }
        self.0[site as usize] = ts;
    }

    /// Entry by entry, the larger of the two.
    pub fn merge(&mut self, other: &VersionVector) {
        for (site, &ts) in other.0.iter().enumerate() {
            if ts > self.get(site as SiteId) {
                self.set(site as SiteId, ts);
            }
        }
    }

    /// The largest entry: a timestamp after everything the vector covers.
    pub fn max(&self) -> Timestamp {
        self.0.iter().copied().max().unwrap_or(Timestamp::ZERO)
    }
}

/// The identity of one write of one key.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Version {
    pub ts: Timestamp,
    pub site: SiteId,
    pub vv: VersionVector,
}

impl Version {
    pub fn local(site: SiteId, ts: Timestamp) -> Self {
        Version { ts, site, vv: VersionVector::local(site, ts) }
    }
}

/// Last-writer-wins order: timestamp, then site id. Two versions with the
/// same (ts, site) are the same write.
impl Ord for Version {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.ts, self.site).cmp(&(other.ts, other.site))
    }
}

impl PartialOrd for Version {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.ts, self.site)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_writer_wins_on_timestamp_then_site() {
        let a = Version::local(0, Timestamp::new(10, 0));
        let b = Version::local(1, Timestamp::new(10, 0));
        let c = Version::local(0, Timestamp::new(10, 1));
        assert!(a < b && b < c);
        assert_eq!(b.vv.get(1), Timestamp::new(10, 0));
        assert_eq!(b.vv.get(0), Timestamp::ZERO);
    }
}
