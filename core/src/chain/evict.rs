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
use crate::store::View;
use std::cmp::Reverse;

/// At most this many keys evicted per partition per call: a large excess
/// is worked off over a few ticks.
const EVICT_PER_CALL: usize = 10_000;
/// Keys sampled per key evicted by the LRU and LFU policies (Redis's
/// `maxmemory-samples`).
const SAMPLES: usize = 5;

/// What a node does when it is over its memory budget, named as Redis's
/// `maxmemory-policy`. The heads decide by what they see: reads served by
/// the other replicas of a chain count where they are served (as a Redis
/// primary does not see its replicas' reads), which matters only once one
/// of those replicas heads the chain.
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
    /// The least recently used of a sample of keys.
    AllKeysLru,
    /// The least recently used of a sample of keys with an expiry.
    VolatileLru,
    /// The least frequently used of a sample of keys (`store::Access`).
    AllKeysLfu,
    /// The least frequently used of a sample of keys with an expiry.
    VolatileLfu,
}

impl Policy {
    /// Whether only keys with an expiry may go.
    fn volatile(self) -> bool {
        matches!(self, Policy::VolatileRandom | Policy::VolatileTtl | Policy::VolatileLru | Policy::VolatileLfu)
    }
}

impl std::str::FromStr for Policy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "noeviction" => Ok(Policy::NoEviction),
            "allkeys-random" => Ok(Policy::AllKeysRandom),
            "volatile-random" => Ok(Policy::VolatileRandom),
            "volatile-ttl" => Ok(Policy::VolatileTtl),
            "allkeys-lru" => Ok(Policy::AllKeysLru),
            "volatile-lru" => Ok(Policy::VolatileLru),
            "allkeys-lfu" => Ok(Policy::AllKeysLfu),
            "volatile-lfu" => Ok(Policy::VolatileLfu),
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
            Policy::AllKeysLru => "allkeys-lru",
            Policy::VolatileLru => "volatile-lru",
            Policy::AllKeysLfu => "allkeys-lfu",
            Policy::VolatileLfu => "volatile-lfu",
        })
    }
}

impl ChainReplica {
    /// At the head: evicts keys by `policy` until their entries add up to
    /// `bytes` or more. The random policies take live keys in the store
    /// table's order from a random place (random: its hasher is seeded at
    /// random), the LRU and LFU policies the least used of `SAMPLES` times
    /// as many keys taken so, the TTL policy the soonest to expire.
    /// Returns the bytes and keys evicted.
    pub fn evict(&mut self, policy: Policy, bytes: usize, now_ms: u64, out: &mut Outbox) -> (usize, usize) {
        if !self.heads_now() || bytes == 0 {
            return (0, 0);
        }
        let mut victims = Vec::new();
        let mut freed = 0;
        match policy {
            Policy::NoEviction => {}
            Policy::AllKeysRandom
            | Policy::VolatileRandom
            | Policy::AllKeysLru
            | Policy::VolatileLru
            | Policy::AllKeysLfu
            | Policy::VolatileLfu => {
                let keys = self.store.len();
                let wanted = (bytes / (self.store.memory() / keys.max(1)).max(1) + 1).min(EVICT_PER_CALL);
                let random = matches!(policy, Policy::AllKeysRandom | Policy::VolatileRandom);
                let start = self.store.chance() as usize;
                // Worst first: the longest idle, or the least frequent and
                // then the longest idle; in table order for the random ones.
                let pool_of = |sample: usize| -> Vec<(u64, View, usize)> {
                    self.store
                        .window(start, sample)
                        .filter(|(v, _)| v.is_live(now_ms) && (!policy.volatile() || v.expires_at_ms().is_some()))
                        .map(|(v, size)| {
                            let a = v.access();
                            let rank = match policy {
                                Policy::AllKeysLru | Policy::VolatileLru => u32::MAX as u64 - a.idle_s(now_ms) as u64,
                                Policy::AllKeysLfu | Policy::VolatileLfu => {
                                    ((a.frequency(now_ms) as u64) << 32) | (u32::MAX - a.idle_s(now_ms)) as u64
                                }
                                _ => 0,
                            };
                            (rank, v, size)
                        })
                        .take(if random { wanted.max(1) * 4 } else { usize::MAX })
                        .collect()
                };
                let mut pool = pool_of(if random { keys } else { (wanted * SAMPLES).max(16) });
                if pool.is_empty() {
                    // The sample held nothing the policy may evict (only
                    // tombstones, say): nothing left is said only after a
                    // look at every key.
                    pool = pool_of(keys);
                }
                pool.sort_by_key(|&(rank, _, _)| rank);
                for (_, v, size) in pool {
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
                    let Some(v) = self.store.latest(&key).filter(|v| v.expires_at_ms() == Some(at) && v.is_live(now_ms)) else {
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
