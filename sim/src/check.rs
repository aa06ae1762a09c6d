//! The invariants simulated runs are judged by.
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
//! Once a run has settled, `converged` compares the replicas of every
//! partition and `durable` looks for every acknowledged write in them.

use crate::lincheck::{Op, OpKind};
use crate::Completed;
use bytes::Bytes;
use causeway_core::chain::Digest;
use causeway_core::driver::{Request, Response};
use causeway_core::message::Item;
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

    /// Call for every completed operation, in completion order.
    pub fn completed(&mut self, c: &Completed) {
        if let Request::Put { value: Some(value), .. } = &c.request {
            if let Some(in_flight) = self.in_flight.get_mut(&c.client) {
                in_flight.retain(|v| v != value);
            }
            if !matches!(c.result, Ok(Response::Written(_))) {
                self.failed.insert(value.clone());
            }
        }
        match (&c.request, &c.result) {
            (Request::Put { key, value: Some(value), .. }, Ok(Response::Written(true))) => {
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
                            "client {client} MGET fractured: {key:?} was written after its writer saw {dep_key:?}@{dep_version}, but the snapshot has {dep_key:?}@{}",
                            have.map(|h| h.to_string()).unwrap_or("nothing".into())
                        ));
                    }
                }
            }
        }
    }
}

/// A session's writes to one key, in order: (index in the session, place).
type SessionWrites = Vec<(usize, u64)>;

/// Causal+ over a history seen from outside, where reads return values
/// but not versions (a stock Redis client, sessions in several sites).
/// Values are unique; `order(value)` gives a value's place among its key's
/// writes (keys each written by one sequential writer, possibly over
/// several sessions, in issue order). Each operation's causal past is a
/// vector over sessions: how many of each session's operations precede it
/// (its own session's, and, through every value it read, that value's
/// write's past, transitively). A read of key K must not return nothing,
/// or a value placed before the newest write to K in its past. This is
/// read-your-writes, monotonic reads and writes-follow-reads across keys
/// and sessions. A value whose write failed is exempt when read (a failed
/// write may take effect at any later time), though what it depends on
/// still counts. The simulator's `CausalChecker` sees versions and also
/// checks get-transactions.
pub fn causal_values(history: &[Op], order: impl Fn(&str) -> Option<u64>) -> Vec<String> {
    // Sessions, densely numbered; each one's operations in issue order.
    let mut sessions: Vec<usize> = history.iter().map(|op| op.client).collect();
    sessions.sort_unstable();
    sessions.dedup();
    let dense: HashMap<usize, usize> = sessions.iter().enumerate().map(|(i, &s)| (s, i)).collect();
    let mut by_session: Vec<Vec<&Op>> = vec![Vec::new(); sessions.len()];
    for op in history {
        by_session[dense[&op.client]].push(op);
    }
    by_session.iter_mut().for_each(|ops| ops.sort_by_key(|op| op.call));
    // For each key, each session that wrote it, with its writes to it.
    let mut writes_of: HashMap<&str, Vec<(usize, SessionWrites)>> = HashMap::new();
    let failed: std::collections::HashSet<&str> = history
        .iter()
        .filter_map(|op| match &op.kind {
            OpKind::Put(v) if op.ret.is_none() => Some(v.as_str()),
            _ => None,
        })
        .collect();
    // Events in time order: a write is issued at its call, a read seen at
    // its return (a read's value was issued before the read returned).
    let mut events: Vec<(i64, usize, usize)> = Vec::new();
    for (s, ops) in by_session.iter().enumerate() {
        for (i, op) in ops.iter().enumerate() {
            match &op.kind {
                OpKind::Put(v) => {
                    events.push((op.call, s, i));
                    if let Some(place) = order(v) {
                        let per = writes_of.entry(op.key.as_str()).or_default();
                        match per.iter_mut().find(|(ws, _)| *ws == s) {
                            Some((_, list)) => list.push((i, place)),
                            None => per.push((s, vec![(i, place)])),
                        }
                    }
                }
                OpKind::Get(_) | OpKind::MultiGet { .. } => events.extend(op.ret.map(|ret| (ret, s, i))),
            }
        }
    }
    events.sort_unstable();
    // Each session's past so far, and each issued value's.
    let mut past: Vec<Vec<u32>> = vec![vec![0; sessions.len()]; sessions.len()];
    let mut past_of: HashMap<&str, Vec<u32>> = HashMap::new();
    let mut violations = Vec::new();
    // The newest write to `key` in a past: its place, and its session.
    let newest = |key: &str, past: &[u32]| -> Option<(u64, usize)> {
        let per = writes_of.get(key)?;
        per.iter()
            .filter_map(|(ws, list)| {
                let before = list.partition_point(|&(idx, _)| (idx as u32) < past[*ws]);
                before.checked_sub(1).map(|j| (list[j].1, sessions[*ws]))
            })
            .max()
    };
    for (_, s, i) in events {
        let op = by_session[s][i];
        past[s][s] = past[s][s].max(i as u32);
        match &op.kind {
            OpKind::Put(v) => {
                let mut mine = past[s].clone();
                mine[s] = i as u32 + 1;
                past_of.insert(v.as_str(), mine);
            }
            OpKind::Get(_) | OpKind::MultiGet { .. } => {
                let pairs: Vec<(&str, &str)> = match &op.kind {
                    OpKind::MultiGet { keys, values } => keys.iter().map(String::as_str).zip(values.iter().map(String::as_str)).collect(),
                    OpKind::Get(v) => vec![(op.key.as_str(), v.as_str())],
                    OpKind::Put(_) => unreachable!(),
                };
                // A get-transaction is never fractured: each value's past
                // is satisfied by the rest of the snapshot.
                for &(key, v) in &pairs {
                    let Some(theirs) = past_of.get(v) else { continue };
                    for &(other, w) in pairs.iter().filter(|(k, _)| *k != key) {
                        let Some((need, _)) = newest(other, theirs) else { continue };
                        if !failed.contains(w) && order(w).is_none_or(|p| p < need) {
                            violations.push(format!(
                                "session {} MGET fractured: {key}={v} was written after {other}'s write #{need}, but the snapshot has {other}={w:?}",
                                op.client
                            ));
                        }
                    }
                }
                // Each value is no older than the read's past demands.
                for &(key, v) in &pairs {
                    let Some((need, by)) = newest(key, &past[s]) else { continue };
                    match order(v) {
                        _ if v.is_empty() => violations.push(format!(
                            "session {} read nothing for {key} at {}, but its causal past has its write #{need} (by session {by})",
                            op.client, op.call
                        )),
                        Some(place) if place < need && !failed.contains(v) => violations.push(format!(
                            "session {} read {v} for {key} at {}, older than write #{need} (by session {by}) in its causal past",
                            op.client, op.call
                        )),
                        _ => {}
                    }
                }
                for &(_, v) in &pairs {
                    if let Some(theirs) = past_of.get(v) {
                        for (mine, &t) in past[s].iter_mut().zip(theirs) {
                            *mine = (*mine).max(t);
                        }
                    }
                }
            }
        }
        past[s][s] = past[s][s].max(i as u32 + 1);
    }
    violations
}

/// Every replica of every partition (`Sim::digests`: by partition, then
/// chain position) holds the same data, with nothing left unstable.
pub fn converged(digests: &[Vec<Digest>]) -> Result<(), String> {
    for (p, replicas) in digests.iter().enumerate() {
        for (i, r) in replicas.iter().enumerate() {
            if r.applied != r.stable {
                return Err(format!("partition {p} replica {i} applied {} but only {} stable", r.applied, r.stable));
            }
            if r != &replicas[0] {
                let (h, fingerprint) = (&replicas[0], Digest::fingerprint);
                return Err(format!(
                    "partition {p} replica {i} differs from the head: applied {} (head {}), {} keys (head {}), data {:x} (head {:x})",
                    r.applied,
                    h.applied,
                    r.latest.len(),
                    h.latest.len(),
                    fingerprint(r),
                    fingerprint(h)
                ));
            }
        }
    }
    Ok(())
}

/// Every acknowledged write (key, version) is in the heads of `digests`, or
/// overwritten by a newer version.
pub fn durable(digests: &[Vec<Digest>], acknowledged: &[(Bytes, Version)]) -> Result<(), String> {
    let latest: HashMap<&Bytes, &Version> =
        digests.iter().filter_map(|replicas| replicas.first()).flat_map(|head| head.latest.iter().map(|(k, s)| (k, &s.version))).collect();
    for (key, version) in acknowledged {
        let have = latest.get(key);
        if have.is_none_or(|h| *h < version) {
            return Err(format!("acknowledged write {key:?}@{version} lost (have {have:?})"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! Each check catches a known-bad history.
    use super::*;
    use crate::Completed;
    use causeway_core::driver::Response;
    use causeway_core::hlc::Timestamp;
    use causeway_core::message::Condition;

    fn v(ts: u64) -> Version {
        Version::local(0, Timestamp::new(ts, 0))
    }

    fn put(checker: &mut CausalChecker, client: usize, key: &str, value: &str, ts: u64) {
        let value = Bytes::from(value.to_string());
        checker.issued_write(client, &value);
        let request = Request::Put { key: Bytes::from(key.to_string()), value: Some(value), ttl_ms: None, condition: Condition::Always };
        let c =
            Completed { client, request, result: Ok(Response::Written(true)), items: Vec::new(), written: Some(v(ts)), acked_at: Some(1) };
        checker.completed(&c);
    }

    fn item(value: Option<&str>, ts: Option<u64>) -> Item {
        Item { value: value.map(|s| Bytes::from(s.to_string())), version: ts.map(v), seq: 0, stable: true }
    }

    fn get(checker: &mut CausalChecker, client: usize, key: &str, value: Option<&str>, ts: Option<u64>) {
        let key = Bytes::from(key.to_string());
        let c = Completed {
            client,
            request: Request::Get(key.clone()),
            result: Ok(Response::Read { value: value.map(|s| Bytes::from(s.to_string())), chain_index: 0 }),
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

    fn digest(applied: u64, stable: u64, latest: &[(&str, &str, u64)]) -> Digest {
        let latest = latest
            .iter()
            .map(|&(k, value, ts)| {
                let stored = causeway_core::store::Stored {
                    version: v(ts),
                    seq: 0,
                    value: Some(Bytes::from(value.to_string())),
                    expires_at_ms: None,
                };
                (Bytes::from(k.to_string()), stored)
            })
            .collect();
        Digest { applied, stable, latest }
    }

    #[test]
    fn a_lost_acknowledged_write_is_caught() {
        let replicas = vec![vec![digest(1, 1, &[("k", "old", 5)]); 3]];
        assert_eq!(durable(&replicas, &[(Bytes::from("k"), v(5))]), Ok(()));
        let lost = durable(&replicas, &[(Bytes::from("k"), v(10))]).unwrap_err();
        assert!(lost.contains("lost"), "{lost}");
    }

    #[test]
    fn diverged_replicas_are_caught() {
        let same = digest(2, 2, &[("k", "a", 10), ("x", "b", 20)]);
        assert_eq!(converged(&[vec![same.clone(); 3]]), Ok(()));
        // A middle replica that missed the write to x, at the same position.
        let mut missed = same.clone();
        missed.latest.pop();
        let diverged = converged(&[vec![same.clone(), missed, same.clone()]]).unwrap_err();
        assert!(diverged.contains("replica 1 differs"), "{diverged}");
        // A tail that never declared its last update stable.
        let unstable = converged(&[vec![same.clone(), same, digest(2, 1, &[("k", "a", 10), ("x", "b", 20)])]]).unwrap_err();
        assert!(unstable.contains("only 1 stable"), "{unstable}");
    }

    #[test]
    fn causal_values_catch_stale_and_fractured_reads_and_allow_a_late_failed_write() {
        let op = |client, key: &str, kind, call, ret| Op { client, key: key.into(), kind, call, ret };
        let order = |v: &str| v.strip_prefix('v')?.parse().ok();
        let put = |v: &str| OpKind::Put(v.into());
        let get = |v: &str| OpKind::Get(v.into());
        // Session 0 writes v2, then reads v1: a stale read.
        let bad = [op(0, "k", put("v1"), 0, Some(1)), op(0, "k", put("v2"), 2, Some(3)), op(0, "k", get("v1"), 4, Some(5))];
        assert_eq!(causal_values(&bad, order).len(), 1);
        // Session 1 reads v2, then nothing.
        let bad = [op(0, "k", put("v2"), 0, Some(1)), op(1, "k", get("v2"), 2, Some(3)), op(1, "k", get(""), 4, Some(5))];
        assert_eq!(causal_values(&bad, order).len(), 1);
        // v1's write failed: it may land after v2, and be read after it.
        let fine = [
            op(0, "k", put("v1"), 0, None),
            op(0, "k", put("v2"), 2, Some(3)),
            op(0, "k", get("v2"), 4, Some(5)),
            op(0, "k", get("v1"), 6, Some(7)),
        ];
        assert!(causal_values(&fine, order).is_empty());
        // Across keys and sessions: session 0 writes x then y; session 1
        // reads y, then writes z; session 2 reads z, then x must show.
        let chain = |last: &str| {
            [
                op(0, "x", put("v1"), 0, Some(1)),
                op(0, "y", put("v1"), 2, Some(3)),
                op(1, "y", get("v1"), 4, Some(5)),
                op(1, "z", put("v1"), 6, Some(7)),
                op(2, "z", get("v1"), 8, Some(9)),
                op(2, "x", get(last), 10, Some(11)),
            ]
        };
        assert!(causal_values(&chain("v1"), order).is_empty());
        let violations = causal_values(&chain(""), order);
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert!(violations[0].contains("session 2 read nothing for x"), "{violations:?}");
        // A get-transaction with y's v1 must have x's v1 (y was written
        // after it), even in a session that had seen nothing.
        let mget = |x: &str| OpKind::MultiGet { keys: vec!["x".into(), "y".into()], values: vec![x.into(), "v1".into()] };
        let snapshot = |x: &str| [op(0, "x", put("v1"), 0, Some(1)), op(0, "y", put("v1"), 2, Some(3)), op(3, "", mget(x), 4, Some(5))];
        assert!(causal_values(&snapshot("v1"), order).is_empty());
        let violations = causal_values(&snapshot(""), order);
        assert!(violations.len() == 1 && violations[0].contains("MGET fractured"), "{violations:?}");
        // A read concurrent with the write it returns is fine, and so is
        // reading a key nobody in the past wrote.
        let fine = [op(0, "x", put("v1"), 3, Some(9)), op(1, "x", get("v1"), 0, Some(5)), op(1, "q", get(""), 6, Some(7))];
        assert!(causal_values(&fine, order).is_empty());
    }
}
