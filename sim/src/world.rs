//! Several sites on one virtual clock: each a `Sim` (its nodes, clients and
//! coordinator), joined by emulated wide-area links with a one-way delay per
//! pair of sites, jitter (so messages overtake each other), loss, and cuts.
//!
//! The sites run in lockstep one millisecond at a time; what a site sends
//! to another (`Sim::outgoing`) lands on a random live node of the other
//! site after the link's delay, which is at least a millisecond, so nothing
//! lands in the past.

use crate::{Completed, Network, Rng, Sim};
use causeway_core::geo::Replication;
use causeway_core::message::Message;
use causeway_core::ring::Shape;
use causeway_core::version::SiteId;

/// The wide-area network between sites.
#[derive(Clone, Debug)]
pub struct Wan {
    /// One-way delay from site a to site b.
    pub delay_ms: Vec<Vec<u64>>,
    /// Up to this much more, uniformly.
    pub jitter_ms: u64,
    /// Probability that a message between sites is lost.
    pub drop_rate: f64,
}

impl Wan {
    /// The Eunomia paper's setup for `sites` sites: 40 ms between site 0 and
    /// each other site, 80 ms between two other sites.
    pub fn paper(sites: usize) -> Wan {
        Wan { delay_ms: causeway_core::geo::paper_delays(sites), jitter_ms: 10, drop_rate: 0.0 }
    }
}

/// Several sites under simulation.
pub struct World {
    pub sites: Vec<Sim>,
    pub wan: Wan,
    /// Until when the link between two sites is cut (both ways).
    cut_until: Vec<Vec<u64>>,
    rng: Rng,
    /// Messages carried between sites, and lost on the way.
    pub carried: u64,
    pub lost: u64,
}

impl World {
    /// `sites` sites of `nodes` nodes each, every one running the real
    /// coordinator, with `clients` clients each.
    /// `sites` sites of `nodes` nodes replicating to each other as
    /// `replication` says (`Replication::Causal` but to measure or check a
    /// baseline).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        seed: u64,
        sites: usize,
        replication: Replication,
        nodes: u16,
        shape: Shape,
        clients: usize,
        network: Network,
        wan: Wan,
    ) -> World {
        let ids: Vec<SiteId> = (0..sites as SiteId).collect();
        let sites = ids
            .iter()
            .map(|&s| {
                let seed = seed.wrapping_mul(31).wrapping_add(s as u64);
                let mut site = Sim::site(seed, s, &ids, replication, nodes, shape, clients, network.clone()).with_coordinator();
                site.idle_ticks = true;
                site
            })
            .collect::<Vec<_>>();
        let n = sites.len();
        World { sites, wan, cut_until: vec![vec![0; n]; n], rng: Rng::new(seed ^ 0x6E0), carried: 0, lost: 0 }
    }

    /// Identifier-first disaster recovery: site `pair.backup` backs up
    /// site `pair.primary`.
    pub fn with_dr(mut self, pair: causeway_core::message::geo::DrPair) -> World {
        self.sites = self.sites.into_iter().map(|s| s.with_dr(pair)).collect();
        self
    }

    pub fn now_ms(&self) -> u64 {
        self.sites[0].now_ms
    }

    /// Runs every site until `until_ms`; returns what completed, by site.
    pub fn run_until(&mut self, until_ms: u64) -> Vec<(usize, Completed)> {
        let mut done = Vec::new();
        while self.now_ms() < until_ms {
            let next = self.now_ms() + 1;
            for (i, site) in self.sites.iter_mut().enumerate() {
                done.extend(site.run_until(next).into_iter().map(|c| (i, c)));
            }
            self.carry(next);
        }
        done
    }

    /// Moves what each site sent to other sites onto their networks.
    fn carry(&mut self, now_ms: u64) {
        for from in 0..self.sites.len() {
            for (to, msg) in std::mem::take(&mut self.sites[from].outgoing) {
                // What the real nodes accept over a site link.
                let between_sites = matches!(&msg, Message::Geo(g) if g.from_site(from as SiteId, to));
                assert!(between_sites, "site {from} sent site {to} what sites never send each other: {msg:?}");
                let to = to as usize;
                if to >= self.sites.len() || self.cut_until[from][to] > now_ms || self.rng.chance(self.wan.drop_rate) {
                    self.lost += 1;
                    continue;
                }
                self.carried += 1;
                let delay = self.wan.delay_ms[from][to].max(1) + self.rng.below(self.wan.jitter_ms + 1);
                self.sites[to].deliver_remote(msg, now_ms + delay);
            }
        }
    }

    /// Cuts the link between sites `a` and `b` for `ms` (both ways).
    pub fn cut(&mut self, a: usize, b: usize, ms: u64) {
        let until = self.now_ms() + ms;
        self.cut_until[a][b] = until;
        self.cut_until[b][a] = until;
    }

    /// Whether every site has settled and healed, and no remote update is
    /// waiting anywhere: nothing is left to ship, apply or acknowledge.
    pub fn quiet(&self) -> bool {
        self.sites.iter().all(|s| s.healed() && s.settled() && s.geo_idle())
    }
}
