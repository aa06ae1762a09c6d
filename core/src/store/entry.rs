//! A key's latest version in one allocation: a fixed header, then what
//! only some keys need, then the key and the value.
//!
//! ```text
//!  0..8    timestamp (`Timestamp::to_bits`)
//!  8..16   seq
//! 16..18   site
//! 18       flags: TOMBSTONE, EXPIRES, REPLACED
//! 19       n: the version vector's length, or 0 when it holds nothing but
//!          this version's own entry (one site, or a write that saw
//!          nothing of the others)
//! 20..24   key length
//! [8]      the expiry (ms), if EXPIRES
//! [...]    the vector's other entries, each as its distance below this
//!          version's timestamp (LEB128; 0 for an entry never set)
//! key, then the value (to the end; nothing for a tombstone)
//! ```
//!
//! A Redis key with a 12-byte name and a 16-byte value takes 52 bytes
//! here (a 64-byte block from the allocator): the version, its place in
//! the update order and, with several sites, what it depends on there
//! cost 24 bytes, about what Redis spends on its object header and LRU
//! clock. Nothing points into other allocations.

use super::Stored;
use crate::hlc::Timestamp;
use crate::version::{SiteId, Version, VersionVector};
use bytes::Bytes;
use smallvec::SmallVec;

const HEADER: usize = 24;
const TOMBSTONE: u8 = 1;
const EXPIRES: u8 = 2;
/// The key had a version before this one (a snapshot that asks for
/// something older must find it in the history, or be told it is gone).
const REPLACED: u8 = 4;

/// One key's latest version, packed.
#[derive(Clone, PartialEq, Eq)]
pub struct Entry(Box<[u8]>);

impl Entry {
    pub fn new(key: &[u8], version: &Version, seq: u64, value: Option<&[u8]>, expires_at_ms: Option<u64>, replaced: bool) -> Entry {
        let own = version.site as usize;
        let entries = &version.vv.0;
        // Exactly what `Version::local` makes: nothing to store.
        let plain = entries.len() == own + 1 && entries.iter().enumerate().all(|(s, &t)| s == own || t == Timestamp::ZERO);
        let mut vv = SmallVec::<[u8; 16]>::new();
        if !plain {
            for (s, &t) in entries.iter().enumerate() {
                if s != own {
                    leb128(if t == Timestamp::ZERO { 0 } else { version.ts.to_bits().saturating_sub(t.to_bits()).max(1) }, &mut vv);
                }
            }
        }
        let n = if plain { 0 } else { entries.len() };
        assert!(n <= u8::MAX as usize, "at most 255 sites");
        let body = value.unwrap_or_default();
        let len = HEADER + expires_at_ms.map_or(0, |_| 8) + vv.len() + key.len() + body.len();
        let mut b = Vec::with_capacity(len);
        b.extend_from_slice(&version.ts.to_bits().to_le_bytes());
        b.extend_from_slice(&seq.to_le_bytes());
        b.extend_from_slice(&version.site.to_le_bytes());
        let flag = |bit: u8, on: bool| if on { bit } else { 0 };
        b.push(flag(TOMBSTONE, value.is_none()) | flag(EXPIRES, expires_at_ms.is_some()) | flag(REPLACED, replaced));
        b.push(n as u8);
        b.extend_from_slice(&(key.len() as u32).to_le_bytes());
        if let Some(at) = expires_at_ms {
            b.extend_from_slice(&at.to_le_bytes());
        }
        b.extend_from_slice(&vv);
        b.extend_from_slice(key);
        b.extend_from_slice(body);
        debug_assert_eq!(b.len(), len);
        Entry(b.into_boxed_slice())
    }

    pub fn from_stored(key: &[u8], s: &Stored, replaced: bool) -> Entry {
        Entry::new(key, &s.version, s.seq, s.value.as_deref(), s.expires_at_ms, replaced)
    }

    pub fn view(&self) -> View<'_> {
        View(&self.0)
    }

    /// Bytes this entry takes (its allocation).
    pub fn size(&self) -> usize {
        self.0.len()
    }
}

/// A packed entry, read.
#[derive(Clone, Copy)]
pub struct View<'a>(&'a [u8]);

impl<'a> View<'a> {
    fn u64_at(&self, at: usize) -> u64 {
        u64::from_le_bytes(self.0[at..at + 8].try_into().expect("8 bytes"))
    }

    fn flags(&self) -> u8 {
        self.0[18]
    }

    pub fn ts(&self) -> Timestamp {
        Timestamp::from_bits(self.u64_at(0))
    }

    pub fn seq(&self) -> u64 {
        self.u64_at(8)
    }

    pub fn site(&self) -> SiteId {
        u16::from_le_bytes([self.0[16], self.0[17]])
    }

    pub fn replaced(&self) -> bool {
        self.flags() & REPLACED != 0
    }

    pub fn expires_at_ms(&self) -> Option<u64> {
        (self.flags() & EXPIRES != 0).then(|| self.u64_at(HEADER))
    }

    fn key_len(&self) -> usize {
        u32::from_le_bytes(self.0[20..24].try_into().expect("4 bytes")) as usize
    }

    /// Where the vector's entries start, and how many there are.
    fn vv_at(&self) -> (usize, usize) {
        (HEADER + if self.flags() & EXPIRES != 0 { 8 } else { 0 }, self.0[19] as usize)
    }

    /// Where the key starts.
    fn key_at(&self) -> usize {
        let (mut at, n) = self.vv_at();
        for _ in 1..n {
            while self.0[at] & 0x80 != 0 {
                at += 1;
            }
            at += 1;
        }
        at
    }

    pub fn key(&self) -> &'a [u8] {
        let at = self.key_at();
        &self.0[at..at + self.key_len()]
    }

    /// The value; `None` for a tombstone.
    pub fn value(&self) -> Option<&'a [u8]> {
        let at = self.key_at() + self.key_len();
        (self.flags() & TOMBSTONE == 0).then(|| &self.0[at..])
    }

    /// The value as a reader at `now_ms` sees it: none once expired.
    pub fn live_value(&self, now_ms: u64) -> Option<&'a [u8]> {
        match self.expires_at_ms() {
            Some(at) if at <= now_ms => None,
            _ => self.value(),
        }
    }

    pub fn version(&self) -> Version {
        let ts = self.ts();
        let site = self.site();
        let (mut at, n) = self.vv_at();
        if n == 0 {
            return Version::local(site, ts);
        }
        let mut vv = VersionVector(SmallVec::with_capacity(n));
        for s in 0..n {
            if s == site as usize {
                vv.0.push(ts);
                continue;
            }
            let (d, used) = read_leb128(&self.0[at..]);
            at += used;
            vv.0.push(if d == 0 { Timestamp::ZERO } else { Timestamp::from_bits(ts.to_bits() - d) });
        }
        Version { ts, site, vv }
    }

    /// The version as the owned `Stored` that transfers and digests carry.
    pub fn stored(&self) -> Stored {
        Stored {
            version: self.version(),
            seq: self.seq(),
            value: self.value().map(Bytes::copy_from_slice),
            expires_at_ms: self.expires_at_ms(),
        }
    }
}

fn leb128(mut v: u64, out: &mut SmallVec<[u8; 16]>) {
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

fn read_leb128(b: &[u8]) -> (u64, usize) {
    let mut v = 0u64;
    for (i, &byte) in b.iter().enumerate() {
        v |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return (v, i + 1);
        }
    }
    unreachable!("an entry's vector is written whole")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(key: &[u8], version: Version, value: Option<&[u8]>, expires: Option<u64>) -> Entry {
        let e = Entry::new(key, &version, 42, value, expires, true);
        let v = e.view();
        assert_eq!(v.key(), key);
        assert_eq!(v.value(), value);
        assert_eq!(v.version(), version);
        assert_eq!(v.seq(), 42);
        assert_eq!(v.expires_at_ms(), expires);
        assert!(v.replaced());
        e
    }

    #[test]
    fn every_shape_of_entry_reads_back() {
        let ts = Timestamp::new(1_700_000_000_000, 3);
        let e = round_trip(b"key:000000000012", Version::local(0, ts), Some(&[7u8; 16]), None);
        assert_eq!(e.size(), 24 + 16 + 16, "one site: header, key, value");
        round_trip(b"k", Version::local(0, ts), None, None);
        round_trip(b"k", Version::local(0, ts), Some(b""), Some(99));
        round_trip(b"", Version::local(2, ts), Some(b"v"), None);
        let mut vv = VersionVector::local(1, ts);
        vv.set(0, Timestamp::new(1_699_999_999_990, 0));
        vv.set(2, Timestamp::new(1_600_000_000_000, 65_535));
        let e = round_trip(b"k", Version { ts, site: 1, vv }, Some(b"value"), Some(5));
        assert!(e.size() < 24 + 8 + 2 * 8 + 1 + 5, "remote entries cost less than a timestamp each: {}", e.size());
        let mut vv = VersionVector::local(2, ts);
        vv.set(0, Timestamp::new(1_699_999_999_999, 0));
        round_trip(b"k", Version { ts, site: 2, vv }, Some(b"v"), None);
    }

    #[test]
    fn expired_values_read_as_absent() {
        let e = Entry::new(b"k", &Version::local(0, Timestamp::new(1, 0)), 1, Some(b"x"), Some(50), false);
        assert_eq!(e.view().live_value(49), Some(&b"x"[..]));
        assert_eq!(e.view().live_value(50), None);
        assert!(!e.view().replaced());
    }
}
