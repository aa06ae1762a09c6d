//! YCSB core workloads A, B, C, D and F: which operation a benchmark client
//! issues next and which key it targets.
//!
//! The semantics follow YCSB's `CoreWorkload` and its generators
//! (brianfrankcooper/YCSB, `site.ycsb.workloads.CoreWorkload`,
//! `site.ycsb.generator.*`) so that results are comparable with published
//! YCSB numbers. Workload E (scans) is left out: the store has no range scan.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// One of YCSB's core workloads; the letters match YCSB's `workloads/workloada` … files
/// so a result can be quoted as "YCSB workload A".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// Update heavy: 50% read, 50% update, zipfian.
    A,
    /// Read mostly: 95% read, 5% update, zipfian.
    B,
    /// Read only: 100% read, zipfian.
    C,
    /// Read latest: 95% read, 5% insert, reads skewed towards the newest keys.
    D,
    /// Read-modify-write: 50% read, 50% read-modify-write, zipfian.
    F,
}

impl Workload {
    /// The operation proportions and key distribution of YCSB's property file for this
    /// workload, so callers only override what the user asked to change.
    pub fn mix(self) -> Mix {
        let (read, update, insert, rmw, distribution) = match self {
            Self::A => (0.5, 0.5, 0.0, 0.0, Distribution::Zipfian),
            Self::B => (0.95, 0.05, 0.0, 0.0, Distribution::Zipfian),
            Self::C => (1.0, 0.0, 0.0, 0.0, Distribution::Zipfian),
            Self::D => (0.95, 0.0, 0.05, 0.0, Distribution::Latest),
            Self::F => (0.5, 0.0, 0.0, 0.5, Distribution::Zipfian),
        };
        Mix { read, update, insert, rmw, distribution }
    }
}

/// Accepts the YCSB letter in either case, so `--workload a` and `--workload A` both work.
impl FromStr for Workload {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "a" => Ok(Self::A),
            "b" => Ok(Self::B),
            "c" => Ok(Self::C),
            "d" => Ok(Self::D),
            "f" => Ok(Self::F),
            _ => Err(format!("unknown workload {s:?}; valid workloads are a, b, c, d, f (YCSB E needs scans)")),
        }
    }
}

/// The bare letter, as YCSB names its workloads in reports.
impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let letter = match self {
            Self::A => "A",
            Self::B => "B",
            Self::C => "C",
            Self::D => "D",
            Self::F => "F",
        };
        f.write_str(letter)
    }
}

/// How keys are picked for reads, updates and read-modify-writes; YCSB's
/// `requestdistribution` property.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Distribution {
    /// YCSB's `ScrambledZipfianGenerator`: a few keys are hot, scattered over the key space.
    Zipfian,
    /// YCSB's `SkewedLatestGenerator`: the most recently inserted keys are hot.
    Latest,
    /// Every existing key is equally likely.
    Uniform,
}

/// Accepts YCSB's `requestdistribution` spellings.
impl FromStr for Distribution {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "zipfian" => Ok(Self::Zipfian),
            "latest" => Ok(Self::Latest),
            "uniform" => Ok(Self::Uniform),
            _ => Err(format!("unknown distribution {s:?}; valid distributions are zipfian, latest, uniform")),
        }
    }
}

/// The YCSB `requestdistribution` spelling, so it parses back.
impl fmt::Display for Distribution {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Self::Zipfian => "zipfian",
            Self::Latest => "latest",
            Self::Uniform => "uniform",
        };
        f.write_str(name)
    }
}

/// The kinds of operation in YCSB's core workloads (scan omitted).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OpKind {
    /// Read one record.
    Read,
    /// Overwrite one existing record.
    Update,
    /// Write a record under a key that did not exist before.
    Insert,
    /// Read a record, then write it back (YCSB's `readmodifywrite`).
    ReadModifyWrite,
}

impl OpKind {
    /// A short stable name, used as the latency-histogram label in reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Update => "update",
            Self::Insert => "insert",
            Self::ReadModifyWrite => "rmw",
        }
    }
}

/// Operation proportions and key distribution, like YCSB's `readproportion`,
/// `updateproportion`, `insertproportion`, `readmodifywriteproportion` and
/// `requestdistribution` properties. Proportions are relative weights; they need not sum to 1.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Mix {
    /// Weight of [`OpKind::Read`].
    pub read: f64,
    /// Weight of [`OpKind::Update`].
    pub update: f64,
    /// Weight of [`OpKind::Insert`].
    pub insert: f64,
    /// Weight of [`OpKind::ReadModifyWrite`].
    pub rmw: f64,
    /// How keys are chosen for everything but inserts.
    pub distribution: Distribution,
}

/// The key numbers of one run, shared by all its clients, so that inserts get
/// fresh keys and reads only target keys that exist (YCSB's
/// `transactioninsertkeysequence`, an `AcknowledgedCounterGenerator`).
///
/// A claimed key counts as inserted only once it has been acknowledged and every
/// smaller key has been too; [`Generator`] acknowledges an insert when its client
/// asks for the following operation, which is when the write has completed.
#[derive(Debug)]
pub struct Keyspace {
    /// Keys loaded before the run; the scrambled zipfian folds onto these.
    record_count: u64,
    /// The next key number an insert will claim.
    next_insert: AtomicU64,
    /// Every key below this exists.
    inserted: AtomicU64,
    /// Acknowledged keys at or above `inserted`, waiting for a smaller one.
    acknowledged: Mutex<BTreeSet<u64>>,
}

impl Keyspace {
    /// A key space whose keys `0..record_count` were loaded before the run.
    ///
    /// # Panics
    /// If `record_count` is 0: every core workload reads, so there must be something to read.
    pub fn new(record_count: u64) -> Arc<Self> {
        assert!(record_count > 0, "a YCSB run needs at least one loaded record");
        Arc::new(Self {
            record_count,
            next_insert: AtomicU64::new(record_count),
            inserted: AtomicU64::new(record_count),
            acknowledged: Mutex::new(BTreeSet::new()),
        })
    }

    /// How many keys exist: keys `0..inserted()` have all been written, so reads may target them.
    pub fn inserted(&self) -> u64 {
        self.inserted.load(Ordering::Relaxed)
    }

    fn claim(&self) -> u64 {
        self.next_insert.fetch_add(1, Ordering::Relaxed)
    }

    fn acknowledge(&self, key: u64) {
        // A poisoned set is still a valid set; losing the benchmark over it helps no one.
        let mut waiting = self.acknowledged.lock().unwrap_or_else(PoisonError::into_inner);
        waiting.insert(key);
        let mut limit = self.inserted.load(Ordering::Relaxed);
        while waiting.remove(&limit) {
            limit += 1;
        }
        self.inserted.store(limit, Ordering::Relaxed);
    }
}

/// The zipfian constant of YCSB's `ZipfianGenerator.ZIPFIAN_CONSTANT`.
const THETA: f64 = 0.99;
/// Gray et al.'s `alpha`.
const ALPHA: f64 = 1.0 / (1.0 - THETA);
/// YCSB's `ScrambledZipfianGenerator.ITEM_COUNT`.
const SCRAMBLED_ITEM_COUNT: u64 = 10_000_000_000;
/// YCSB's `ScrambledZipfianGenerator.ZETAN`: zeta(ITEM_COUNT, 0.99), precomputed.
const SCRAMBLED_ZETAN: f64 = 26.469_028_201_783_02;

/// Gray et al.'s zipfian generator ("Quickly Generating Billion-Record Synthetic
/// Databases", SIGMOD 1994) as in YCSB's `ZipfianGenerator`: rank 0 is the most
/// popular, and the item count can grow without recomputing zeta from scratch.
#[derive(Debug)]
struct Zipfian {
    items: u64,
    zetan: f64,
    eta: f64,
    /// 0.5^theta, the probability threshold of rank 1.
    half_pow_theta: f64,
}

impl Zipfian {
    fn new(items: u64, zetan: f64) -> Self {
        Self { items, zetan, eta: eta(items, zetan), half_pow_theta: 0.5f64.powf(THETA) }
    }

    /// Extends the distribution to `items` items by adding only the new terms to
    /// zeta, as YCSB's `nextLong(itemcount)` does when the count goes up.
    fn grow(&mut self, items: u64) {
        if items > self.items {
            self.zetan += (self.items + 1..=items).map(|i| 1.0 / (i as f64).powf(THETA)).sum::<f64>();
            self.items = items;
            // YCSB keeps eta's 2/n at the construction-time count; Gray et al. use the
            // current one. The difference is negligible for a run's worth of inserts.
            self.eta = eta(items, self.zetan);
        }
    }

    /// A rank in `0..items`.
    fn sample(&self, rng: &mut StdRng) -> u64 {
        let u: f64 = rng.gen();
        let uz = u * self.zetan;
        if uz < 1.0 {
            return 0;
        }
        if uz < 1.0 + self.half_pow_theta {
            return 1;
        }
        let rank = (self.items as f64 * (self.eta * u - self.eta + 1.0).powf(ALPHA)) as u64;
        // Rounding can land exactly on `items` (or, for tiny counts, past rank 1).
        rank.min(self.items - 1)
    }
}

fn eta(items: u64, zetan: f64) -> f64 {
    let zeta2theta = 1.0 + 0.5f64.powf(THETA);
    (1.0 - (2.0 / items as f64).powf(1.0 - THETA)) / (1.0 - zeta2theta / zetan)
}

/// zeta(n, theta) = sum of i^-theta for i in 1..=n, the normaliser of a zipfian over n items.
///
/// YCSB sums every term, which takes over a minute for 10^8 items. Here the first
/// terms are summed and the tail comes from the Euler–Maclaurin formula, which
/// agrees with the full sum to about 1e-12 in constant time.
fn zeta(n: u64) -> f64 {
    const EXACT_TERMS: u64 = 1000;
    let head: f64 = (1..=n.min(EXACT_TERMS)).map(|i| 1.0 / (i as f64).powf(THETA)).sum();
    if n <= EXACT_TERMS {
        return head;
    }
    let (a, b) = (EXACT_TERMS as f64, n as f64);
    let f = |x: f64| x.powf(-THETA);
    let f1 = |x: f64| -THETA * x.powf(-THETA - 1.0);
    let f3 = |x: f64| -THETA * (THETA + 1.0) * (THETA + 2.0) * x.powf(-THETA - 3.0);
    // Sum over a+1..=b: the integral, minus the half-weighted end at a, plus the
    // B2 and B4 correction terms.
    let integral = (b.powf(1.0 - THETA) - a.powf(1.0 - THETA)) / (1.0 - THETA);
    let tail = integral + (f(b) - f(a)) / 2.0 + (f1(b) - f1(a)) / 12.0 - (f3(b) - f3(a)) / 720.0;
    head + tail
}

/// YCSB's `Utils.fnvhash64`: FNV-1a over the 8 little-endian bytes of `n`, made
/// non-negative as Java's `Math.abs` does.
fn fnvhash64(n: u64) -> u64 {
    const OFFSET_BASIS: u64 = 0xCBF2_9CE4_8422_2325;
    const PRIME: u64 = 0x100_0000_01B3;
    let hash = n.to_le_bytes().iter().fold(OFFSET_BASIS, |hash, &byte| (hash ^ u64::from(byte)).wrapping_mul(PRIME));
    (hash as i64).unsigned_abs()
}

#[derive(Debug)]
enum KeyChooser {
    /// YCSB's `ScrambledZipfianGenerator`: a zipfian rank over 10 billion items,
    /// hashed onto the loaded records so the hot keys are spread out. Folding onto
    /// the loaded records only (as YCSB folds onto its predicted key count) keeps
    /// which keys are hot fixed while inserts grow the key space.
    Scrambled(Zipfian),
    /// YCSB's `SkewedLatestGenerator`: the newest key minus a zipfian rank.
    Latest(Zipfian),
    Uniform,
}

/// Draws the operations of one benchmark client, like one YCSB client thread
/// running `CoreWorkload.doTransaction`. Each client owns one, seeded differently,
/// so runs are reproducible without sharing a random number generator.
#[derive(Debug)]
pub struct Generator {
    /// Cumulative weights of read, update, insert, rmw (YCSB's `DiscreteGenerator` order).
    thresholds: [f64; 4],
    chooser: KeyChooser,
    keyspace: Arc<Keyspace>,
    rng: StdRng,
    /// The key of the last insert handed out, acknowledged once the client is back for more.
    pending_insert: Option<u64>,
}

impl Generator {
    /// A client's generator for `mix` over `keyspace`; the same seed and keyspace
    /// history give the same operations.
    ///
    /// # Panics
    /// If a weight in `mix` is negative or not finite, or all weights are zero.
    pub fn new(mix: Mix, keyspace: Arc<Keyspace>, seed: u64) -> Self {
        let weights = [mix.read, mix.update, mix.insert, mix.rmw];
        assert!(
            weights.iter().all(|w| w.is_finite() && *w >= 0.0) && weights.iter().sum::<f64>() > 0.0,
            "operation proportions must be finite, non-negative and not all zero: {mix:?}"
        );
        let mut thresholds = weights;
        for i in 1..thresholds.len() {
            thresholds[i] += thresholds[i - 1];
        }
        let chooser = match mix.distribution {
            Distribution::Zipfian => KeyChooser::Scrambled(Zipfian::new(
                // YCSB's ZipfianGenerator(0, ITEM_COUNT) spans ITEM_COUNT + 1 items.
                SCRAMBLED_ITEM_COUNT + 1,
                SCRAMBLED_ZETAN,
            )),
            Distribution::Latest => {
                let items = keyspace.inserted();
                KeyChooser::Latest(Zipfian::new(items, zeta(items)))
            }
            Distribution::Uniform => KeyChooser::Uniform,
        };
        Self { thresholds, chooser, keyspace, rng: StdRng::seed_from_u64(seed), pending_insert: None }
    }

    /// The next operation and the key number it targets. For [`OpKind::Insert`]
    /// the key is fresh, claimed atomically from the [`Keyspace`]; other kinds
    /// target a key below [`Keyspace::inserted`].
    ///
    /// Calling this again tells the keyspace that the previous insert has been
    /// written, so other clients may start reading it (as YCSB acknowledges an
    /// insert once the database call returns).
    pub fn next_op(&mut self) -> (OpKind, u64) {
        if let Some(key) = self.pending_insert.take() {
            self.keyspace.acknowledge(key);
        }
        let kind = self.next_kind();
        let key = match kind {
            OpKind::Insert => {
                let key = self.keyspace.claim();
                self.pending_insert = Some(key);
                key
            }
            _ => self.next_key(),
        };
        (kind, key)
    }

    fn next_kind(&mut self) -> OpKind {
        let total = self.thresholds[3];
        let u = self.rng.gen::<f64>() * total;
        if u < self.thresholds[0] {
            OpKind::Read
        } else if u < self.thresholds[1] {
            OpKind::Update
        } else if u < self.thresholds[2] {
            OpKind::Insert
        } else {
            OpKind::ReadModifyWrite
        }
    }

    fn next_key(&mut self) -> u64 {
        match &mut self.chooser {
            KeyChooser::Scrambled(zipfian) => fnvhash64(zipfian.sample(&mut self.rng)) % self.keyspace.record_count,
            KeyChooser::Latest(zipfian) => {
                let inserted = self.keyspace.inserted();
                zipfian.grow(inserted);
                inserted - 1 - zipfian.sample(&mut self.rng)
            }
            KeyChooser::Uniform => self.rng.gen_range(0..self.keyspace.inserted()),
        }
    }
}

/// A client that stops (end of run, error) has finished its last insert; without
/// this its key would hold back every later one from [`Keyspace::inserted`].
impl Drop for Generator {
    fn drop(&mut self) {
        if let Some(key) = self.pending_insert.take() {
            self.keyspace.acknowledge(key);
        }
    }
}

/// The key for key number `n`: YCSB's `CoreWorkload.buildKeyName` with hashed
/// insert order, `"user"` followed by the decimal `fnvhash64(n)`, so that
/// consecutive (and zipfian-popular) key numbers land far apart in the key space.
pub fn key_name(n: u64) -> Vec<u8> {
    format!("user{}", fnvhash64(n)).into_bytes()
}

/// A value of `len` printable ASCII bytes derived from key number `n` and `salt`.
///
/// Deterministic so that runs are reproducible and a value can be checked
/// later; varying `salt` (e.g. a per-client write counter) makes each update
/// actually change the stored bytes.
pub fn value_for(n: u64, len: usize, salt: u64) -> Vec<u8> {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    // SplitMix64, seeded from both inputs.
    let mut state = n.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ salt.rotate_left(32);
    let mut value = Vec::with_capacity(len);
    while value.len() < len {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        let take = (len - value.len()).min(8);
        value.extend(z.to_le_bytes()[..take].iter().map(|b| ALPHABET[usize::from(b & 63)]));
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{HashMap, HashSet};

    const ALL: [Workload; 5] = [Workload::A, Workload::B, Workload::C, Workload::D, Workload::F];

    fn draw(mix: Mix, record_count: u64, seed: u64, n: usize) -> Vec<(OpKind, u64)> {
        let mut generator = Generator::new(mix, Keyspace::new(record_count), seed);
        (0..n).map(|_| generator.next_op()).collect()
    }

    #[test]
    fn op_proportions_match_each_workload() {
        const DRAWS: usize = 100_000;
        for workload in ALL {
            let mix = workload.mix();
            let mut counts: HashMap<OpKind, usize> = HashMap::new();
            for (kind, _) in draw(mix, 10_000, 7, DRAWS) {
                *counts.entry(kind).or_default() += 1;
            }
            for (kind, want) in
                [(OpKind::Read, mix.read), (OpKind::Update, mix.update), (OpKind::Insert, mix.insert), (OpKind::ReadModifyWrite, mix.rmw)]
            {
                let got = counts.get(&kind).copied().unwrap_or(0) as f64 / DRAWS as f64;
                assert!((got - want).abs() < 0.01, "workload {workload}: {kind:?} at {got}, want {want}");
                if want == 0.0 {
                    assert_eq!(got, 0.0, "workload {workload}: {kind:?} must never occur");
                }
            }
        }
    }

    #[test]
    fn ycsb_default_distributions() {
        for workload in ALL {
            let want = if workload == Workload::D { Distribution::Latest } else { Distribution::Zipfian };
            assert_eq!(workload.mix().distribution, want, "workload {workload}");
        }
    }

    #[test]
    fn scrambled_zipfian_is_skewed_and_scattered() {
        const RECORDS: u64 = 10_000;
        const DRAWS: usize = 100_000;
        let mut counts = vec![0usize; RECORDS as usize];
        for (_, key) in draw(Workload::C.mix(), RECORDS, 1, DRAWS) {
            counts[key as usize] += 1;
        }
        let (hottest, &top) = counts.iter().enumerate().max_by_key(|(_, count)| **count).unwrap();
        let share = top as f64 / DRAWS as f64;
        // Rank 0 has probability 1/zetan = 3.8%.
        assert!((0.02..0.10).contains(&share), "hottest key share {share}");
        // Scrambling puts rank 0 at fnvhash64(0), not at key 0.
        assert_eq!(hottest as u64, fnvhash64(0) % RECORDS);
        let mut sorted = counts.clone();
        sorted.sort_unstable();
        let median = sorted[sorted.len() / 2].max(1);
        assert!(top > 50 * median, "hottest {top} vs median {median}");
    }

    #[test]
    fn latest_favours_recent_inserts() {
        const RECORDS: u64 = 1_000;
        let keyspace = Keyspace::new(RECORDS);
        let mut generator = Generator::new(Workload::D.mix(), keyspace.clone(), 3);
        let (mut reads, mut recent, mut newest_inserted) = (0usize, 0usize, 0usize);
        for _ in 0..100_000 {
            let (kind, key) = generator.next_op();
            if kind != OpKind::Read {
                continue;
            }
            let inserted = keyspace.inserted();
            assert!(key < inserted);
            reads += 1;
            // The newest tenth of the keys that existed at the time.
            if key >= inserted - inserted / 10 {
                recent += 1;
            }
            if key == inserted - 1 {
                newest_inserted += 1;
            }
        }
        assert!(keyspace.inserted() > RECORDS + 4_000, "inserts grew the keyspace");
        let recent_share = recent as f64 / reads as f64;
        assert!(recent_share > 0.6, "newest tenth got {recent_share} of reads");
        // Rank 0 of a zipfian over ~6000 items: about 1/9.
        let newest_share = newest_inserted as f64 / reads as f64;
        assert!(newest_share > 0.05, "newest key got {newest_share} of reads");
    }

    #[test]
    fn keys_stay_below_inserted_for_every_distribution() {
        for workload in ALL {
            for distribution in [Distribution::Zipfian, Distribution::Latest, Distribution::Uniform] {
                let mix = Mix { distribution, ..workload.mix() };
                let keyspace = Keyspace::new(500);
                let mut generator = Generator::new(mix, keyspace.clone(), 11);
                for _ in 0..20_000 {
                    let (kind, key) = generator.next_op();
                    if kind != OpKind::Insert {
                        assert!(key < keyspace.inserted(), "{workload} {distribution}: {key}");
                    }
                }
            }
        }
    }

    #[test]
    fn uniform_covers_the_keyspace() {
        let mix = Mix { distribution: Distribution::Uniform, ..Workload::C.mix() };
        let keys: HashSet<u64> = draw(mix, 100, 5, 100_000).into_iter().map(|(_, k)| k).collect();
        assert_eq!(keys, (0..100).collect());
    }

    #[test]
    fn inserts_claim_fresh_keys_and_are_acknowledged_on_the_next_call() {
        let mix = Mix { read: 0.0, update: 0.0, insert: 1.0, rmw: 0.0, distribution: Distribution::Latest };
        let keyspace = Keyspace::new(10);
        let mut generator = Generator::new(mix, keyspace.clone(), 0);
        assert_eq!(generator.next_op(), (OpKind::Insert, 10));
        assert_eq!(keyspace.inserted(), 10, "not written yet");
        assert_eq!(generator.next_op(), (OpKind::Insert, 11));
        assert_eq!(keyspace.inserted(), 11);
        drop(generator);
        assert_eq!(keyspace.inserted(), 12, "dropping acknowledges the last insert");
    }

    #[test]
    fn out_of_order_acknowledgements_wait_for_the_gap() {
        let keyspace = Keyspace::new(5);
        let (a, b, c) = (keyspace.claim(), keyspace.claim(), keyspace.claim());
        keyspace.acknowledge(c);
        keyspace.acknowledge(b);
        assert_eq!(keyspace.inserted(), 5);
        keyspace.acknowledge(a);
        assert_eq!(keyspace.inserted(), 8);
    }

    #[test]
    fn concurrent_clients_insert_distinct_contiguous_keys() {
        const RECORDS: u64 = 1_000;
        let keyspace = Keyspace::new(RECORDS);
        let handles: Vec<_> = (0..4)
            .map(|seed| {
                let keyspace = keyspace.clone();
                std::thread::spawn(move || {
                    let mut generator = Generator::new(Workload::D.mix(), keyspace, seed);
                    (0..20_000)
                        .map(|_| generator.next_op())
                        .filter(|(kind, _)| *kind == OpKind::Insert)
                        .map(|(_, key)| key)
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut inserted: Vec<u64> = handles.into_iter().flat_map(|h| h.join().unwrap()).collect();
        inserted.sort_unstable();
        let want: Vec<u64> = (RECORDS..RECORDS + inserted.len() as u64).collect();
        assert_eq!(inserted, want);
        assert_eq!(keyspace.inserted(), RECORDS + inserted.len() as u64);
    }

    #[test]
    fn same_seed_same_operations() {
        for workload in ALL {
            let a = draw(workload.mix(), 1_000, 42, 5_000);
            assert_eq!(a, draw(workload.mix(), 1_000, 42, 5_000), "workload {workload}");
            assert_ne!(a, draw(workload.mix(), 1_000, 43, 5_000), "workload {workload}");
        }
    }

    #[test]
    fn zeta_matches_ycsb() {
        // YCSB's precomputed constant for its 10 billion scrambled items.
        assert!((zeta(SCRAMBLED_ITEM_COUNT) - SCRAMBLED_ZETAN).abs() < 1e-9);
        for n in [1, 2, 999, 1_000, 1_001, 54_321, 300_000] {
            let direct: f64 = (1..=n).map(|i| 1.0 / (i as f64).powf(THETA)).sum();
            assert!((zeta(n) - direct).abs() < 1e-10, "n = {n}");
        }
    }

    #[test]
    fn zipfian_growth_matches_fresh_computation() {
        let mut grown = Zipfian::new(5_000, zeta(5_000));
        grown.grow(7_500);
        let fresh = Zipfian::new(7_500, zeta(7_500));
        assert!((grown.zetan - fresh.zetan).abs() < 1e-10);
        assert!((grown.eta - fresh.eta).abs() < 1e-10);
    }

    #[test]
    fn key_names_match_ycsb_and_are_distinct() {
        // Computed with YCSB's Java `Utils.fnvhash64`.
        for (n, want) in [
            (0, "user6284781860667377211"),
            (1, "user8517097267634966620"),
            (999, "user2071219101098386137"),
            (123_456_789_012, "user2556987882972209844"),
        ] {
            assert_eq!(key_name(n), want.as_bytes());
        }
        let names: HashSet<Vec<u8>> = (0..200_000).map(key_name).collect();
        assert_eq!(names.len(), 200_000);
    }

    #[test]
    fn values_are_deterministic_printable_and_salted() {
        for len in [0, 1, 7, 8, 9, 100, 1_000] {
            let value = value_for(3, len, 0);
            assert_eq!(value.len(), len);
            assert!(value.iter().all(|b| b.is_ascii_graphic()));
            assert_eq!(value, value_for(3, len, 0));
        }
        assert_ne!(value_for(3, 32, 0), value_for(3, 32, 1));
        assert_ne!(value_for(3, 32, 0), value_for(4, 32, 0));
    }

    #[test]
    fn parsing_and_display() {
        for workload in ALL {
            assert_eq!(workload.to_string().parse::<Workload>(), Ok(workload));
            assert_eq!(workload.to_string().to_lowercase().parse::<Workload>(), Ok(workload));
        }
        let err = "e".parse::<Workload>().unwrap_err();
        assert!(err.contains("a, b, c, d, f"), "{err}");
        for distribution in [Distribution::Zipfian, Distribution::Latest, Distribution::Uniform] {
            assert_eq!(distribution.to_string().parse(), Ok(distribution));
        }
        assert_eq!("Uniform".parse(), Ok(Distribution::Uniform));
        let err = "hotspot".parse::<Distribution>().unwrap_err();
        assert!(err.contains("zipfian, latest, uniform"), "{err}");
        assert_eq!(OpKind::ReadModifyWrite.name(), "rmw");
    }
}
