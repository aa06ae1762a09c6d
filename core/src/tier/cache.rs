//! Which values stay in memory when a disk tier holds the rest: the cache
//! policies of the p2p store (section 2.4), FIFO, LRU and LFU, each an
//! exact order over the keys whose values are in memory.
//!
//! Keys are named by their 64-bit hash in the store's table (`id`), so a
//! cached key costs 16 bytes of list links and 5 of index here (LFU: one
//! more for its count), whatever its length. `victim` names the next key
//! whose value leaves memory:
//!
//! * FIFO: the one that entered memory first (written or read back from
//!   disk); uses do not reorder.
//! * LRU: the one used least recently.
//! * LFU: the one used least often since it entered memory (counts stop at
//!   255); among equals, the one that reached that count first.

use hashbrown::HashTable;
use std::fmt;
use std::str::FromStr;

/// `--cache-policy`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CachePolicy {
    Fifo,
    #[default]
    Lru,
    Lfu,
}

impl FromStr for CachePolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "fifo" => Ok(CachePolicy::Fifo),
            "lru" => Ok(CachePolicy::Lru),
            "lfu" => Ok(CachePolicy::Lfu),
            _ => Err(format!("unknown cache policy '{s}' (expected fifo, lru or lfu)")),
        }
    }
}

impl fmt::Display for CachePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CachePolicy::Fifo => "fifo",
            CachePolicy::Lru => "lru",
            CachePolicy::Lfu => "lfu",
        })
    }
}

const NONE: u32 = u32::MAX;

#[derive(Clone, Copy)]
struct Slot {
    id: u64,
    prev: u32,
    next: u32,
}

#[derive(Clone, Copy)]
struct List {
    head: u32,
    tail: u32,
}

const EMPTY: List = List { head: NONE, tail: NONE };

/// The keys whose values are in memory, in the order they leave it.
pub struct Cache {
    policy: CachePolicy,
    slots: Vec<Slot>,
    /// LFU: each slot's use count (its list).
    counts: Vec<u8>,
    free: Vec<u32>,
    index: HashTable<u32>,
    /// One list for FIFO and LRU; LFU one per count, oldest first.
    lists: Vec<List>,
    /// LFU: no list below this one holds a key.
    lowest: usize,
    len: usize,
}

impl fmt::Debug for Cache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cache").field("policy", &self.policy).field("len", &self.len).finish()
    }
}

impl Cache {
    pub fn new(policy: CachePolicy) -> Cache {
        let lists = match policy {
            CachePolicy::Lfu => 256,
            _ => 1,
        };
        Cache {
            policy,
            slots: Vec::new(),
            counts: Vec::new(),
            free: Vec::new(),
            index: HashTable::new(),
            lists: vec![EMPTY; lists],
            lowest: 0,
            len: 0,
        }
    }

    pub fn policy(&self) -> CachePolicy {
        self.policy
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes this takes.
    pub fn memory(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<Slot>()
            + self.counts.capacity()
            + self.free.capacity() * 4
            + self.index.capacity() * 5
            + self.lists.len() * std::mem::size_of::<List>()
    }

    fn find(&self, id: u64) -> Option<u32> {
        let slots = &self.slots;
        self.index.find(id, |&s| slots[s as usize].id == id).copied()
    }

    pub fn contains(&self, id: u64) -> bool {
        self.find(id).is_some()
    }

    /// `id`'s value entered memory (written, or read back from disk); if
    /// it was there already, a use.
    pub fn insert(&mut self, id: u64) {
        if self.touch(id) {
            return;
        }
        let s = match self.free.pop() {
            Some(s) => {
                self.slots[s as usize] = Slot { id, prev: NONE, next: NONE };
                s
            }
            None => {
                self.slots.push(Slot { id, prev: NONE, next: NONE });
                self.counts.push(0);
                (self.slots.len() - 1) as u32
            }
        };
        let slots = &self.slots;
        self.index.insert_unique(id, s, |&s| slots[s as usize].id);
        let list = match self.policy {
            CachePolicy::Lfu => 1,
            _ => 0,
        };
        self.counts[s as usize] = list as u8;
        self.push(list, s);
        self.lowest = self.lowest.min(list);
        self.len += 1;
    }

    /// A use of `id`: whether its value is in memory (a hit).
    pub fn touch(&mut self, id: u64) -> bool {
        let Some(s) = self.find(id) else { return false };
        match self.policy {
            CachePolicy::Fifo => {}
            CachePolicy::Lru => {
                self.unlink(0, s);
                self.push(0, s);
            }
            CachePolicy::Lfu => {
                let count = self.counts[s as usize] as usize;
                if count < 255 {
                    self.unlink(count, s);
                    self.counts[s as usize] += 1;
                    self.push(count + 1, s);
                }
            }
        }
        true
    }

    /// `id`'s value left memory (or the key is gone): forgets it.
    pub fn remove(&mut self, id: u64) -> bool {
        let slots = &self.slots;
        let Ok(found) = self.index.find_entry(id, |&s| slots[s as usize].id == id) else { return false };
        let (s, _) = found.remove();
        let list = self.list_of(s);
        self.unlink(list, s);
        self.free.push(s);
        self.len -= 1;
        true
    }

    /// The key whose value should leave memory next.
    pub fn victim(&mut self) -> Option<u64> {
        if self.len == 0 {
            return None;
        }
        while self.lists[self.lowest].head == NONE {
            self.lowest += 1;
        }
        Some(self.slots[self.lists[self.lowest].head as usize].id)
    }

    /// `victim`, forgotten.
    pub fn pop(&mut self) -> Option<u64> {
        let id = self.victim()?;
        self.remove(id);
        Some(id)
    }

    /// Gives back the room of keys gone, once it holds less than a
    /// quarter of what it had (its values moved out): the order and the
    /// counts stay.
    pub fn shrink(&mut self) {
        if self.slots.len() <= 64 || self.len >= self.slots.len() / 4 {
            return;
        }
        let mut small = Cache::new(self.policy);
        small.slots.reserve_exact(self.len);
        for list in 0..self.lists.len() {
            let mut s = self.lists[list].head;
            while s != NONE {
                small.insert(self.slots[s as usize].id);
                let last = (small.slots.len() - 1) as u32;
                if list != small.list_of(last) {
                    small.unlink(small.list_of(last), last);
                    small.counts[last as usize] = list as u8;
                    small.push(list, last);
                }
                s = self.slots[s as usize].next;
            }
        }
        small.lowest = 0;
        *self = small;
    }

    fn list_of(&self, s: u32) -> usize {
        match self.policy {
            CachePolicy::Lfu => self.counts[s as usize] as usize,
            _ => 0,
        }
    }

    fn push(&mut self, list: usize, s: u32) {
        let tail = self.lists[list].tail;
        self.slots[s as usize].prev = tail;
        self.slots[s as usize].next = NONE;
        match tail {
            NONE => self.lists[list].head = s,
            t => self.slots[t as usize].next = s,
        }
        self.lists[list].tail = s;
    }

    fn unlink(&mut self, list: usize, s: u32) {
        let Slot { prev, next, .. } = self.slots[s as usize];
        match prev {
            NONE => self.lists[list].head = next,
            p => self.slots[p as usize].next = next,
        }
        match next {
            NONE => self.lists[list].tail = prev,
            n => self.slots[n as usize].prev = prev,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Plays `accesses` on a cache of `capacity` keys: a hit is a use, a
    /// miss brings the key in (and, when full, sends the victim out).
    fn play(policy: CachePolicy, capacity: usize, accesses: &str) -> String {
        let mut c = Cache::new(policy);
        accesses
            .chars()
            .map(|k| {
                let id = k as u64;
                if c.touch(id) {
                    return 'H';
                }
                if c.len() == capacity {
                    c.pop();
                }
                c.insert(id);
                'm'
            })
            .collect()
    }

    #[test]
    fn a_known_sequence_gives_the_known_hits_for_each_policy() {
        // Capacity 3. After a b c, `a` is used again and `d` comes in.
        // FIFO sends `a` out (first in), LRU `b` (least recent), LFU `b`
        // (used once, before `c`).
        let seq = "abcadab";
        assert_eq!(play(CachePolicy::Fifo, 3, seq), "mmmHmmm");
        assert_eq!(play(CachePolicy::Lru, 3, seq), "mmmHmHm");
        assert_eq!(play(CachePolicy::Lfu, 3, seq), "mmmHmHm");
        // A key used often survives a scan under LFU, not under LRU.
        let scan = "aaaabcdea";
        assert_eq!(play(CachePolicy::Lru, 3, scan), "mHHHmmmmm");
        assert_eq!(play(CachePolicy::Lfu, 3, scan), "mHHHmmmmH");
        assert_eq!(play(CachePolicy::Fifo, 3, scan), "mHHHmmmmm");
        // LRU keeps what is used in a loop that fits; FIFO too.
        assert_eq!(play(CachePolicy::Lru, 2, "ababab"), "mmHHHH");
        assert_eq!(play(CachePolicy::Fifo, 2, "abcabc"), "mmmmmm");
    }

    #[test]
    fn removed_keys_are_forgotten_and_slots_reused() {
        for policy in [CachePolicy::Fifo, CachePolicy::Lru, CachePolicy::Lfu] {
            let mut c = Cache::new(policy);
            for id in 0..100 {
                c.insert(id);
            }
            for id in (0..100).step_by(2) {
                assert!(c.remove(id));
            }
            assert!(!c.remove(0), "{policy}: once");
            assert_eq!(c.len(), 50);
            for id in 100..150 {
                c.insert(id);
            }
            assert_eq!(c.slots.len(), 100, "{policy}: freed slots are reused");
            let mut out = Vec::new();
            while let Some(id) = c.pop() {
                out.push(id);
            }
            let expect: Vec<u64> = (1..100).step_by(2).chain(100..150).collect();
            assert_eq!(out, expect, "{policy}: nothing used, so first in first out");
            assert!(c.is_empty() && c.victim().is_none());
        }
    }

    #[test]
    fn shrinking_keeps_the_order_and_the_counts() {
        for policy in [CachePolicy::Fifo, CachePolicy::Lru, CachePolicy::Lfu] {
            // 1000 keys in, 990 out, the rest used 10, 9, ... 1 times.
            let filled = || {
                let mut c = Cache::new(policy);
                for id in 0..1000 {
                    c.insert(id);
                }
                for id in 0..990 {
                    c.remove(id);
                }
                for id in (990..1000).rev() {
                    for _ in 0..(id - 989) {
                        c.touch(id);
                    }
                }
                c
            };
            let (mut shrunk, mut plain) = (filled(), filled());
            let before = shrunk.memory();
            shrunk.shrink();
            assert!(shrunk.memory() < before / 10, "{policy}: {} of {before}", shrunk.memory());
            let a: Vec<u64> = std::iter::from_fn(|| shrunk.pop()).collect();
            let b: Vec<u64> = std::iter::from_fn(|| plain.pop()).collect();
            assert_eq!(a, b, "{policy}: the same victims in the same order");
            assert_eq!(a.len(), 10);
        }
    }

    #[test]
    fn lfu_counts_stop_at_255_and_ties_go_by_arrival() {
        let mut c = Cache::new(CachePolicy::Lfu);
        c.insert(1);
        for _ in 0..1000 {
            c.touch(1);
        }
        c.insert(2);
        c.insert(3);
        c.touch(3);
        c.touch(2);
        assert_eq!(c.pop(), Some(3), "2 and 3 were used twice; 3 got there first");
        assert_eq!(c.pop(), Some(2));
        assert_eq!(c.pop(), Some(1));
        assert_eq!("lfu".parse::<CachePolicy>(), Ok(CachePolicy::Lfu));
        assert!("mru".parse::<CachePolicy>().unwrap_err().contains("fifo, lru or lfu"));
    }
}
