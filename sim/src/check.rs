//! Causal+ of simulated runs, judged by the versions the reads returned.
//!
//! Causal+ is checked against the causal order the run itself produced:
//! every written value is unique, so a read names the write it saw. Each
//! write carries the *frontier* of its writer when it was issued (for every
//! key, the newest version in the writer's causal past); each client carries
//! its own frontier, merged with the frontier of every write it reads.
//! Then:
//!
//! * a read of key K must return a version >= the client's frontier for K
//!   (never older than something it saw, wrote, or depends on), and never
//!   "nothing" once its causal past holds a version of K;
//! * a get-transaction must in addition be closed under the frontiers of the
//!   writes it returns: if it returns y2 and y2's writer had seen x2, it must
//!   return x2 or newer for x (no fractured reads, ChainReaction §3.5).
//!
//! The checkers that need no simulator (linearizability, causal+ from the
//! values alone, the replicas' final state) are in `causeway_checker`.

use crate::Completed;
use bytes::Bytes;
use causeway_core::driver::{Request, Response};
use causeway_core::message::{Change, Item, NewValue};
use causeway_core::version::Version;
use std::collections::HashMap;

/// For every key, the newest version in some causal past.
pub type Frontier = HashMap<Bytes, Version>;

fn merge(into: &mut Frontier, from: &Frontier) {
    for (k, v) in from {
        bump(into, k, v);
    }
}

fn bump(into: &mut Frontier, key: &Bytes, v: &Version) {
    match into.get(key) {
        Some(have) if have >= v => {}
        _ => {
            into.insert(key.clone(), v.clone());
        }
    }
}

/// Tracks causality over a run and reports violations.
#[derive(Default)]
pub struct CausalChecker {
    clients: HashMap<usize, Frontier>,
    /// The writer's frontier for each written value (unique per write).
    writes: HashMap<Bytes, Frontier>,
    /// For each written value, the writes its client had issued before it
    /// and not seen completed yet (a pipeline): they precede it too, once
    /// acknowledged.
    after: HashMap<Bytes, Vec<Bytes>>,
    /// Each client's writes issued and not completed.
    in_flight: HashMap<usize, Vec<Bytes>>,
    /// Writes that completed with an error (they may or may not have taken
    /// effect: nothing after them in their session depends on them).
    failed: std::collections::HashSet<Bytes>,
    /// Acknowledged writes: (key, version).
    pub acknowledged: Vec<(Bytes, Version)>,
    pub violations: Vec<String>,
    pub reads_checked: u64,
    pub snapshots_checked: u64,
}

impl CausalChecker {
    /// Call when a client *issues* a write of `value` to `key` (before it
    /// completes: a write that times out may still become visible).
    pub fn issued_write(&mut self, client: usize, value: &Bytes) {
        let frontier = self.clients.entry(client).or_default().clone();
        self.writes.insert(value.clone(), frontier);
        let in_flight = self.in_flight.entry(client).or_default();
        self.after.insert(value.clone(), in_flight.clone());
        in_flight.push(value.clone());
    }

    /// The causal past of the write of `value`: its writer's frontier when
    /// it issued it, and that of every acknowledged write its session had
    /// in flight then (with their own versions).
    fn past_of(&self, value: &Bytes) -> Frontier {
        let mut past = Frontier::new();
        let mut todo = vec![value.clone()];
        let mut seen = std::collections::HashSet::new();
        while let Some(v) = todo.pop() {
            if !seen.insert(v.clone()) {
                continue;
            }
            if let Some(f) = self.writes.get(&v) {
                merge(&mut past, f);
            }
            for before in self.after.get(&v).into_iter().flatten() {
                if !self.failed.contains(before) {
                    todo.push(before.clone());
                }
            }
        }
        past
    }

    /// Takes `lost` versions out of `client`'s causal past: writes its
    /// site lost in a crash its contract allows (`fsync=everysec`), which
    /// a session that outlives the crash may read older than. What its
    /// past held of their keys before them is not known, so those keys go
    /// unchecked for it until read or written again. (Other sessions'
    /// pasts and the writes' keep them: no other site may have seen them.)
    pub fn forget(&mut self, client: usize, lost: impl Fn(&Version) -> bool) {
        if let Some(f) = self.clients.get_mut(&client) {
            f.retain(|_, v| !lost(v));
        }
    }

    /// Call for every completed operation, in completion order.
    pub fn completed(&mut self, c: &Completed) {
        if let Some(value) = c.request_value() {
            if let Some(in_flight) = self.in_flight.get_mut(&c.client) {
                in_flight.retain(|v| v != value);
            }
            if !matches!(c.result, Ok(Response::Written(_))) {
                self.failed.insert(value.clone());
            }
        }
        match (&c.request, &c.result) {
            (Request::Put { key, change: Change { value: NewValue::Set(value), .. } }, Ok(Response::Written(true))) => {
                let version = c.written.clone().expect("an acknowledged write has a version");
                // The write itself is part of its own frontier (readers of it
                // depend on it) and of its writer's.
                if let Some(f) = self.writes.get_mut(value) {
                    bump(f, key, &version);
                }
                bump(self.clients.entry(c.client).or_default(), key, &version);
                self.acknowledged.push((key.clone(), version));
            }
            (Request::Get(_), Ok(Response::Read { .. })) => {
                self.reads_checked += 1;
                let items = c.items.clone();
                self.check_reads(c.client, &items, "GET");
            }
            (Request::MultiGet(keys), Ok(Response::Values(values))) => {
                self.snapshots_checked += 1;
                let items: HashMap<Bytes, Item> = c.items.iter().cloned().collect();
                assert_eq!(values.len(), keys.len());
                let pairs: Vec<(Bytes, Item)> = keys.iter().map(|k| (k.clone(), items[k].clone())).collect();
                self.check_snapshot(c.client, &pairs);
                self.check_reads(c.client, &pairs, "MGET");
            }
            _ => {}
        }
    }

    fn check_reads(&mut self, client: usize, items: &[(Bytes, Item)], what: &str) {
        let mut learned = Frontier::new();
        let frontier = self.clients.entry(client).or_default().clone();
        for (key, item) in items {
            match (&item.version, frontier.get(key)) {
                (None, Some(need)) => {
                    self.violations.push(format!("client {client} {what} {key:?}: read nothing, but its causal past has {need}"))
                }
                (Some(got), Some(need)) if got < need => {
                    self.violations.push(format!("client {client} {what} {key:?}: read {got}, older than {need} in its causal past"))
                }
                _ => {}
            }
            if let (Some(version), Some(value)) = (&item.version, &item.value) {
                bump(&mut learned, key, version);
                merge(&mut learned, &self.past_of(value));
            }
        }
        merge(self.clients.entry(client).or_default(), &learned);
    }

    fn check_snapshot(&mut self, client: usize, items: &[(Bytes, Item)]) {
        let got: HashMap<&Bytes, Option<&Version>> = items.iter().map(|(k, i)| (k, i.version.as_ref())).collect();
        for (key, item) in items {
            let Some(value) = &item.value else { continue };
            if !self.writes.contains_key(value) {
                continue;
            }
            for (dep_key, dep_version) in &self.past_of(value) {
                if let Some(have) = got.get(dep_key) {
                    if have.is_none_or(|h| h < dep_version) {
                        self.violations.push(format!(
                            "client {client} MGET fractured: {key:?}@{} was written after its writer saw {dep_key:?}@{dep_version}, but the snapshot has {dep_key:?}@{}",
                            item.version.as_ref().map(|v| v.to_string()).unwrap_or_default(),
                            have.map(|h| h.to_string()).unwrap_or("nothing".into())
                        ));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! Each check catches a known-bad history.
    use super::*;
    use crate::Completed;
    use causeway_core::driver::Response;
    use causeway_core::hlc::Timestamp;
    use causeway_core::message::Change;

    fn v(ts: u64) -> Version {
        Version::local(0, Timestamp::new(ts, 0))
    }

    fn put(checker: &mut CausalChecker, client: usize, key: &str, value: &str, ts: u64) {
        let value = Bytes::from(value.to_string());
        checker.issued_write(client, &value);
        let request = Request::Put { key: Bytes::from(key.to_string()), change: Change::set(value) };
        let c =
            Completed { client, request, result: Ok(Response::Written(true)), items: Vec::new(), written: Some(v(ts)), acked_at: Some(1) };
        checker.completed(&c);
    }

    fn item(value: Option<&str>, ts: Option<u64>) -> Item {
        Item { value: value.map(|s| Bytes::from(s.to_string())), version: ts.map(v), seq: 0, stable: true, expires_at_ms: None }
    }

    fn get(checker: &mut CausalChecker, client: usize, key: &str, value: Option<&str>, ts: Option<u64>) {
        let key = Bytes::from(key.to_string());
        let c = Completed {
            client,
            request: Request::Get(key.clone()),
            result: Ok(Response::Read { value: value.map(|s| Bytes::from(s.to_string())), chain_index: 0, expires_at_ms: None }),
            items: vec![(key, item(value, ts))],
            written: None,
            acked_at: None,
        };
        checker.completed(&c);
    }

    #[test]
    fn a_read_older_than_the_readers_own_write_is_caught() {
        let mut c = CausalChecker::default();
        put(&mut c, 0, "k", "new", 20);
        get(&mut c, 0, "k", Some("old"), Some(10));
        assert_eq!(c.violations.len(), 1, "{:?}", c.violations);
        assert!(c.violations[0].contains("older than"));
    }

    #[test]
    fn a_read_that_misses_a_dependency_is_caught() {
        let mut c = CausalChecker::default();
        // Client 0 writes x, then y; client 1 reads y, then x from before.
        put(&mut c, 0, "x", "x1", 10);
        put(&mut c, 0, "y", "y1", 20);
        get(&mut c, 1, "y", Some("y1"), Some(20));
        get(&mut c, 1, "x", None, None);
        assert_eq!(c.violations.len(), 1, "{:?}", c.violations);
    }

    #[test]
    fn a_fractured_snapshot_is_caught() {
        let mut c = CausalChecker::default();
        put(&mut c, 0, "acl", "private", 10);
        put(&mut c, 0, "album", "photo", 20);
        let keys = vec![Bytes::from("acl"), Bytes::from("album")];
        let snapshot = Completed {
            client: 1,
            request: Request::MultiGet(keys.clone()),
            result: Ok(Response::Values(vec![None, Some(Bytes::from("photo"))])),
            items: vec![(keys[0].clone(), item(None, None)), (keys[1].clone(), item(Some("photo"), Some(20)))],
            written: None,
            acked_at: None,
        };
        c.completed(&snapshot);
        assert!(c.violations.iter().any(|v| v.contains("fractured")), "{:?}", c.violations);
    }
}
