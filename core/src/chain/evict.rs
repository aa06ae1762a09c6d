//! Eviction: a node over its memory budget (`--maxmemory`) deletes keys by
//! the operator's policy, as Redis does. In a replicated store the head
//! decides, as it does for expiry: each evicted key's latest version
//! becomes a tombstone of the same version (`expiry::tombstone`), which
//! goes down the chain like any write, so the replicas drop the value at
//! the same point of the update order, and which any later write beats.
//! The memory comes back when the tombstones are collected (`expiry`).
//! Each site evicts its own copies, on its own budget; other sites never
//! get these.

use super::*;
use std::cmp::Reverse;

/// At most this many keys evicted per partition per call: a large excess
/// is worked off over a few ticks.
const EVICT_PER_CALL: usize = 10_000;

/// What a node does when it is over its memory budget, named as Redis's
/// `maxmemory-policy`. The LRU and LFU policies need a per-key access
/// clock, which the store does not keep yet: they are refused by name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Policy {
    /// Writes that would add data get `-OOM`; deletes still go.
    #[default]
    NoEviction,
    /// Any key.
    AllKeysRandom,
    /// Any key with an expiry.
    VolatileRandom,
    /// The keys with an expiry that expire soonest.
    VolatileTtl,
}

impl std::str::FromStr for Policy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "noeviction" => Ok(Policy::NoEviction),
            "allkeys-random" => Ok(Policy::AllKeysRandom),
            "volatile-random" => Ok(Policy::VolatileRandom),
            "volatile-ttl" => Ok(Policy::VolatileTtl),
            p @ ("allkeys-lru" | "allkeys-lfu" | "volatile-lru" | "volatile-lfu") => {
                Err(format!("maxmemory-policy {p} is not supported yet (no per-key access clock): use noeviction, allkeys-random, volatile-random or volatile-ttl"))
            }
            p => Err(format!("unknown maxmemory-policy '{p}'")),
        }
    }
}

impl std::fmt::Display for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Policy::NoEviction => "noeviction",
            Policy::AllKeysRandom => "allkeys-random",
            Policy::VolatileRandom => "volatile-random",
            Policy::VolatileTtl => "volatile-ttl",
        })
    }
}

impl ChainReplica {
    /// At the head: evicts keys by `policy` until their entries add up to
    /// `bytes` or more. The random policies take live keys in the store
    /// table's order (random: its hasher is seeded at random), the TTL
    /// policy the soonest to expire. Returns the bytes and keys evicted.
    pub fn evict(&mut self, policy: Policy, bytes: usize, now_ms: u64, out: &mut Outbox) -> (usize, usize) {
        if !self.heads_now() || bytes == 0 {
            return (0, 0);
        }
        let mut victims = Vec::new();
        let mut freed = 0;
        match policy {
            Policy::NoEviction => {}
            Policy::AllKeysRandom | Policy::VolatileRandom => {
                for (v, size) in self.store.evictable(now_ms, policy == Policy::VolatileRandom) {
                    if freed >= bytes || victims.len() >= EVICT_PER_CALL {
                        break;
                    }
                    freed += size;
                    victims.push((Bytes::copy_from_slice(v.key()), v.version()));
                }
            }
            Policy::VolatileTtl => {
                self.due();
                let due = self.reclaim.due.as_mut().expect("built above");
                while freed < bytes && victims.len() < EVICT_PER_CALL {
                    let Some(Reverse((at, key))) = due.pop() else { break };
                    // Still that version with a value (else rewritten or
                    // gone since: someone else's business).
                    let Some(v) = self.store.latest(&key).filter(|v| v.expires_at_ms() == Some(at) && v.live_value(now_ms).is_some())
                    else {
                        continue;
                    };
                    freed += self.store.key_size(&key);
                    victims.push((key, v.version()));
                }
            }
        }
        let n = victims.len();
        self.tombstone(victims, now_ms, out);
        (freed, n)
    }
}
