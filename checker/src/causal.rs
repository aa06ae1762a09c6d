//! Causal+ over a history recorded from outside the store, from the values
//! read alone (`causal_values`). The simulator sees every read's version
//! and has its own checker for that (`causeway_sim::check::CausalChecker`).

use crate::lincheck::{Op, OpKind};
use std::collections::HashMap;

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
/// still counts.
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

#[cfg(test)]
mod tests {
    //! The checker catches known-bad histories and accepts their fixed
    //! twins.
    use super::*;

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
