//! The versions keys had before their latest, kept `RETAIN_MS` after they
//! were replaced (at most `MAX_VERSIONS` per key) for get-transactions,
//! and nothing for keys not written lately.

use super::{Stored, MAX_VERSIONS, RETAIN_MS};
use crate::version::Version;
use ahash::AHashMap;
use bytes::Bytes;
use smallvec::SmallVec;
use std::collections::VecDeque;

/// A version kept: when it was replaced, and whether the key had a
/// version before it (that is not kept: a snapshot looking that far back
/// is refused).
#[derive(Debug)]
struct Kept {
    stored: Stored,
    replaced_ms: u64,
    after_another: bool,
}

#[derive(Debug, Default)]
pub struct History {
    /// Per key, oldest first.
    keys: AHashMap<Bytes, SmallVec<[Kept; 1]>>,
    /// When keys got a version here, oldest first: what `prune` looks at.
    order: VecDeque<(u64, Bytes)>,
}

impl History {
    /// Keeps `old`, a version of `key` replaced (or beaten) at `now_ms`;
    /// `after_another`: the key had a version before it.
    pub fn keep(&mut self, key: &[u8], old: Stored, after_another: bool, now_ms: u64) {
        let key = Bytes::copy_from_slice(key);
        let versions = self.keys.entry(key.clone()).or_default();
        let at = versions.partition_point(|k| k.stored.version < old.version);
        let after_another = after_another || at > 0;
        versions.insert(at, Kept { stored: old, replaced_ms: now_ms, after_another });
        if versions.len() >= MAX_VERSIONS {
            versions.remove(0);
            versions[0].after_another = true;
        }
        self.order.push_back((now_ms, key));
    }

    /// Forgets every version kept of `key` (a newer one was not kept: the
    /// latest then says older ones are gone).
    pub fn forget(&mut self, key: &[u8]) {
        // Most replicas keep nothing: no hashing for them.
        if !self.keys.is_empty() {
            self.keys.remove(key);
        }
    }

    /// Whether versions of `key` older than those kept may have existed:
    /// `None` if none is kept.
    pub fn truncated(&self, key: &[u8]) -> Option<bool> {
        self.keys.get(key)?.first().map(|k| k.after_another)
    }

    /// Forgets what was replaced more than `RETAIN_MS` ago.
    pub fn prune(&mut self, now_ms: u64) {
        while let Some((at, _)) = self.order.front() {
            if at + RETAIN_MS > now_ms {
                return;
            }
            let (_, key) = self.order.pop_front().expect("looked at");
            if let Some(versions) = self.keys.get_mut(&key) {
                let before = versions.len();
                versions.retain(|k| k.replaced_ms + RETAIN_MS > now_ms);
                let dropped = versions.len() < before;
                match versions.first_mut() {
                    None => {
                        self.keys.remove(&key);
                    }
                    Some(first) if dropped => first.after_another = true,
                    Some(_) => {}
                }
            }
        }
    }

    pub fn holds(&self, key: &[u8], version: &Version) -> bool {
        self.seq_of(key, version).is_some()
    }

    pub fn seq_of(&self, key: &[u8], version: &Version) -> Option<u64> {
        let versions = self.keys.get(key)?;
        versions.iter().find(|k| (k.stored.version.ts, k.stored.version.site) == (version.ts, version.site)).map(|k| k.stored.seq)
    }

    /// The oldest version kept of `key`.
    pub fn oldest(&self, key: &[u8]) -> Option<Version> {
        self.keys.get(key)?.first().map(|k| k.stored.version.clone())
    }

    /// The latest version kept of `key` that `visible` accepts.
    pub fn latest_where(&self, key: &[u8], visible: &impl Fn(&Version) -> bool) -> Option<Stored> {
        self.keys.get(key)?.iter().rev().find(|k| visible(&k.stored.version)).map(|k| k.stored.clone())
    }

    /// Versions kept of `key` (tests).
    #[cfg(test)]
    pub fn versions_of(&self, key: &[u8]) -> usize {
        self.keys.get(key).map_or(0, |v| v.len())
    }

    /// About what the history takes.
    pub fn memory(&self) -> usize {
        let per = std::mem::size_of::<Kept>() + 48;
        self.keys.values().map(|v| v.len() * per).sum::<usize>() + self.order.len() * 48
    }

    pub fn key_memory(&self, key: &[u8]) -> usize {
        let size = |k: &Kept| std::mem::size_of::<Kept>() + 48 + k.stored.value.as_ref().map_or(0, |b| b.len());
        self.keys.get(key).map_or(0, |v| v.iter().map(size).sum())
    }
}
