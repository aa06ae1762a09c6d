//! A key's latest version in one allocation, found through one thin
//! pointer: the entry's own length, a header, what only some keys need,
//! the key and the value.
//!
//! ```text
//! length      LEB128, the whole entry's
//! key length  LEB128
//! key         (first: the table compares keys on every probe)
//! timestamp   8 bytes (`Timestamp::to_bits`)
//! seq         LEB128
//! site        1 byte
//! flags       1 byte: TOMBSTONE, EXPIRES, REPLACED, ON_DISK, CLEAN
//! n           1 byte: the version vector's length, or 0 when it holds
//!             nothing but this version's own entry (one site, or a write
//!             that saw nothing of the others)
//! access      4 bytes: when and how often the key was used (`access`),
//!             for LRU and LFU eviction; the only part that changes in
//!             place
//! [expiry]    8 bytes (ms), if EXPIRES
//! [vector]    the other entries, each as its distance below this
//!             version's timestamp (LEB128; 0 for an entry never set)
//! value       to the end; nothing for a tombstone, nor for a value
//!             the disk tier holds instead (ON_DISK)
//! ```
//!
//! A YCSB key (24 bytes) with a 16-byte value takes 60 bytes here, a
//! 64-byte block from the allocator, plus an 8-byte pointer in the table:
//! the version, its place in the update order and, with several sites,
//! what it depends on there, and the access clock cost about 20 bytes,
//! less than Redis spends on its object header (with its own LRU clock).
//! Nothing points into other allocations.

use super::access::Access;
use super::Stored;
use crate::hlc::Timestamp;
use crate::version::{SiteId, Version, VersionVector};
use bytes::Bytes;
use smallvec::SmallVec;
use std::ptr::NonNull;

const TOMBSTONE: u8 = 1;
const EXPIRES: u8 = 2;
/// The key had a version before this one (a snapshot that asks for
/// something older must find it in the history, or be told it is gone).
const REPLACED: u8 = 4;
/// The value is in the disk tier, not here (`tier`).
const ON_DISK: u8 = 8;
/// The value is here and the disk tier holds it too (it was read back and
/// not written since): it can leave memory without being written again.
const CLEAN: u8 = 16;

/// One key's latest version, packed, owned through a thin pointer.
pub struct Entry(NonNull<u8>);

// SAFETY: an `Entry` owns its allocation alone (like a `Box<[u8]>`) and
// never shares it.
unsafe impl Send for Entry {}
// SAFETY: `&Entry` only reads.
unsafe impl Sync for Entry {}

impl Entry {
    pub fn new(
        key: &[u8],
        version: &Version,
        seq: u64,
        value: Option<&[u8]>,
        expires_at_ms: Option<u64>,
        replaced: bool,
        access: Access,
    ) -> Entry {
        let own = version.site as usize;
        assert!(own <= u8::MAX as usize, "at most 256 sites");
        let entries = &version.vv.0;
        debug_assert_eq!(version.vv.get(version.site), version.ts, "a version's own entry is its timestamp");
        // Exactly what `Version::local` makes: nothing to store.
        let plain = entries.len() == own + 1 && entries.iter().enumerate().all(|(s, &t)| s == own || t == Timestamp::ZERO);
        let mut head = SmallVec::<[u8; 32]>::new();
        leb128(key.len() as u64, &mut head);
        let mut tail = SmallVec::<[u8; 32]>::new();
        tail.extend_from_slice(&version.ts.to_bits().to_le_bytes());
        leb128(seq, &mut tail);
        tail.push(own as u8);
        let flag = |bit: u8, on: bool| if on { bit } else { 0 };
        tail.push(flag(TOMBSTONE, value.is_none()) | flag(EXPIRES, expires_at_ms.is_some()) | flag(REPLACED, replaced));
        let n = if plain { 0 } else { entries.len() };
        assert!(n <= u8::MAX as usize, "at most 255 sites");
        tail.push(n as u8);
        tail.extend_from_slice(&access.to_bytes());
        if let Some(at) = expires_at_ms {
            tail.extend_from_slice(&at.to_le_bytes());
        }
        if !plain {
            for (s, &t) in entries.iter().enumerate() {
                if s != own {
                    leb128(if t == Timestamp::ZERO { 0 } else { version.ts.to_bits().saturating_sub(t.to_bits()).max(1) }, &mut tail);
                }
            }
        }
        let body = value.unwrap_or_default();
        let rest = head.len() + key.len() + tail.len() + body.len();
        // The length counts its own bytes too.
        let mut len = rest + 1;
        while leb128_len(len as u64) + rest > len {
            len += 1;
        }
        let mut b = Vec::with_capacity(len);
        let mut prefix = SmallVec::<[u8; 32]>::new();
        leb128(len as u64, &mut prefix);
        b.extend_from_slice(&prefix);
        b.extend_from_slice(&head);
        b.extend_from_slice(key);
        b.extend_from_slice(&tail);
        b.extend_from_slice(body);
        debug_assert_eq!(b.len(), len);
        let raw = Box::into_raw(b.into_boxed_slice()) as *mut u8;
        Entry(NonNull::new(raw).expect("a box is not null"))
    }

    pub fn from_stored(key: &[u8], s: &Stored, replaced: bool, access: Access) -> Entry {
        Entry::new(key, &s.version, s.seq, s.value.as_deref(), s.expires_at_ms, replaced, access)
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: the allocation starts with its own length (LEB128, at
        // most 10 bytes, each read only while the previous says more
        // follows, all inside the allocation); the slice is the whole
        // allocation `new` made, alive while `self` is.
        unsafe {
            let p = self.0.as_ptr();
            let mut len = 0usize;
            let mut i = 0;
            loop {
                let byte = *p.add(i);
                len |= ((byte & 0x7f) as usize) << (7 * i);
                i += 1;
                if byte & 0x80 == 0 {
                    break;
                }
            }
            std::slice::from_raw_parts(p, len)
        }
    }

    pub fn view(&self) -> View<'_> {
        View::new(self.bytes())
    }

    /// Notes a use of the key (`access`).
    #[cfg(test)]
    pub fn set_access(&mut self, access: Access) {
        self.set_access_at(self.view().access_at as usize, access);
    }

    /// `set_access`, where a view of this entry said the access bytes are
    /// (`View::access_at`).
    pub fn set_access_at(&mut self, at: usize, access: Access) {
        let len = self.size();
        // SAFETY: the allocation is `len` bytes (`bytes`), owned by this
        // entry alone, and borrowed mutably through `self`; the four bytes
        // at `access_at` are inside it.
        let b = unsafe { std::slice::from_raw_parts_mut(self.0.as_ptr(), len) };
        b[at..at + 4].copy_from_slice(&access.to_bytes());
    }

    /// The same entry, saying that the key had versions before this one
    /// (what else it says is kept).
    pub fn with_replaced(&self) -> Entry {
        let mut e = self.clone();
        e.set_flags(REPLACED, 0);
        e
    }

    /// Turns `on` flags on and `off` flags off, in place.
    fn set_flags(&mut self, on: u8, off: u8) {
        let at = self.view().access_at() - 2;
        let len = self.size();
        // SAFETY: as `set_access_at`; the flags byte is two before the
        // access bytes (`View::new`).
        let b = unsafe { std::slice::from_raw_parts_mut(self.0.as_ptr(), len) };
        b[at] = (b[at] | on) & !off;
    }

    /// This entry with its value on disk: the same but for the value's
    /// bytes, which the disk tier holds.
    pub fn moved_out(&self) -> Entry {
        let v = self.view();
        debug_assert!(!v.is_tombstone() && !v.on_disk());
        let mut len = SmallVec::<[u8; 32]>::new();
        leb128(v.value().map_or(0, <[u8]>::len) as u64, &mut len);
        let mut e = Entry::new(v.key(), &v.version(), v.seq(), Some(&len), v.expires_at_ms(), v.replaced(), v.access());
        e.set_flags(ON_DISK, 0);
        e
    }

    /// This entry with `value`, read back from the disk tier (which keeps
    /// it: CLEAN).
    pub fn moved_back(&self, value: &[u8]) -> Entry {
        let v = self.view();
        debug_assert!(v.on_disk());
        let mut e = Entry::new(v.key(), &v.version(), v.seq(), Some(value), v.expires_at_ms(), v.replaced(), v.access());
        e.set_flags(CLEAN, 0);
        e
    }

    /// The key alone, without reading the rest (a table probe).
    pub fn key(&self) -> &[u8] {
        let b = self.bytes();
        let (_, at) = read_leb128(b);
        let (len, used) = read_leb128(&b[at..]);
        &b[at + used..at + used + len as usize]
    }

    /// Bytes this entry takes (its allocation).
    pub fn size(&self) -> usize {
        self.bytes().len()
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        let len = self.size();
        // SAFETY: the pointer and length are those of the boxed slice `new`
        // leaked; it is freed once, here.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.0.as_ptr(), len)) });
    }
}

impl Clone for Entry {
    fn clone(&self) -> Entry {
        let raw = Box::into_raw(Box::<[u8]>::from(self.bytes())) as *mut u8;
        Entry(NonNull::new(raw).expect("a box is not null"))
    }
}

impl PartialEq for Entry {
    fn eq(&self, other: &Entry) -> bool {
        self.bytes() == other.bytes()
    }
}

impl Eq for Entry {}

/// A packed entry, read: where its parts start, found once.
#[derive(Clone, Copy)]
pub struct View<'a> {
    b: &'a [u8],
    key_at: u32,
    /// The timestamp's 8 bytes follow the key.
    key_len: u32,
    seq: u64,
    site: u8,
    flags: u8,
    n: u8,
    access_at: u32,
    /// Where the optional parts start, and the value.
    extra_at: u32,
    value_at: u32,
}

impl<'a> View<'a> {
    fn new(b: &'a [u8]) -> View<'a> {
        let (_, mut at) = read_leb128(b);
        let (key_len, used) = read_leb128(&b[at..]);
        at += used;
        let key_at = at;
        at += key_len as usize + 8;
        let (seq, used) = read_leb128(&b[at..]);
        at += used;
        let (site, flags, n) = (b[at], b[at + 1], b[at + 2]);
        at += 3;
        let access_at = at as u32;
        at += 4;
        let extra_at = at as u32;
        if flags & EXPIRES != 0 {
            at += 8;
        }
        for _ in 1..n {
            at += read_leb128(&b[at..]).1;
        }
        View { b, seq, site, flags, n, access_at, extra_at, key_at: key_at as u32, key_len: key_len as u32, value_at: at as u32 }
    }

    pub fn ts(&self) -> Timestamp {
        let at = (self.key_at + self.key_len) as usize;
        Timestamp::from_bits(u64::from_le_bytes(self.b[at..at + 8].try_into().expect("8 bytes")))
    }

    pub fn seq(&self) -> u64 {
        self.seq
    }

    pub fn site(&self) -> SiteId {
        self.site as SiteId
    }

    pub fn replaced(&self) -> bool {
        self.flags & REPLACED != 0
    }

    /// Where the access bytes are in the entry (`Entry::set_access_at`).
    pub fn access_at(&self) -> usize {
        self.access_at as usize
    }

    /// When and how often the key was used.
    pub fn access(&self) -> Access {
        let at = self.access_at as usize;
        Access::from_bytes(self.b[at..at + 4].try_into().expect("4 bytes"))
    }

    pub fn expires_at_ms(&self) -> Option<u64> {
        let at = self.extra_at as usize;
        (self.flags & EXPIRES != 0).then(|| u64::from_le_bytes(self.b[at..at + 8].try_into().expect("8 bytes")))
    }

    pub fn key(&self) -> &'a [u8] {
        let at = self.key_at as usize;
        &self.b[at..at + self.key_len as usize]
    }

    /// The value; `None` for a tombstone, and for a value on disk
    /// (`on_disk`: the store reads it back).
    pub fn value(&self) -> Option<&'a [u8]> {
        (self.flags & (TOMBSTONE | ON_DISK) == 0).then(|| &self.b[self.value_at as usize..])
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
        if self.n == 0 {
            return Version::local(site, ts);
        }
        let mut at = self.extra_at as usize + if self.flags & EXPIRES != 0 { 8 } else { 0 };
        let mut vv = VersionVector(SmallVec::with_capacity(self.n as usize));
        for s in 0..self.n as usize {
            if s == site as usize {
                vv.0.push(ts);
                continue;
            }
            let (d, used) = read_leb128(&self.b[at..]);
            at += used;
            vv.0.push(if d == 0 { Timestamp::ZERO } else { Timestamp::from_bits(ts.to_bits() - d) });
        }
        Version { ts, site, vv }
    }

    /// Whether the key is deleted (or expired by its head): no value.
    pub fn is_tombstone(&self) -> bool {
        self.flags & TOMBSTONE != 0
    }

    /// Whether the value is in the disk tier rather than here.
    pub fn on_disk(&self) -> bool {
        self.flags & ON_DISK != 0
    }

    /// The length of a value on disk (0 for one here).
    pub fn disk_len(&self) -> usize {
        match self.on_disk() {
            true => read_leb128(&self.b[self.value_at as usize..]).0 as usize,
            false => 0,
        }
    }

    /// Whether the value is here and in the disk tier too.
    pub fn clean(&self) -> bool {
        self.flags & CLEAN != 0
    }

    /// Whether a reader at `now_ms` sees a value (here or on disk).
    pub fn is_live(&self, now_ms: u64) -> bool {
        !self.is_tombstone() && self.expires_at_ms().is_none_or(|at| at > now_ms)
    }

    /// The version as the owned `Stored` that transfers and digests carry
    /// (a value on disk must be read back: `PartitionStore::stored`).
    pub fn stored(&self) -> Stored {
        debug_assert!(!self.on_disk(), "a value on disk is read back by the store");
        Stored {
            version: self.version(),
            seq: self.seq(),
            value: self.value().map(Bytes::copy_from_slice),
            expires_at_ms: self.expires_at_ms(),
        }
    }
}

fn leb128_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

fn leb128(mut v: u64, out: &mut SmallVec<[u8; 32]>) {
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
        let mut e = Entry::new(key, &version, 42, value, expires, true, Access::new(5_000));
        assert_eq!(e.view().access(), Access::new(5_000));
        let later = Access::new(9_000).used(9_000, 0);
        e.set_access(later);
        assert_eq!(e.view().access(), later);
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
        let e = round_trip(b"user1234567890123456789", Version::local(0, ts), Some(&[7u8; 16]), None);
        assert!(e.size() <= 60, "one site, a YCSB key and 16 bytes fit a 64-byte block: {}", e.size());
        let big = round_trip(b"k", Version::local(0, ts), Some(&[1u8; 300]), None);
        assert_eq!(big.view().value().map(<[u8]>::len), Some(300), "a length of two bytes");
        assert!(big.clone() == big);
        round_trip(b"k", Version::local(0, ts), None, None);
        round_trip(b"k", Version::local(0, ts), Some(b""), Some(99));
        round_trip(b"", Version::local(2, ts), Some(b"v"), None);
        let mut vv = VersionVector::local(1, ts);
        vv.set(0, Timestamp::new(1_699_999_999_990, 0));
        vv.set(2, Timestamp::new(1_600_000_000_000, 65_535));
        let e = round_trip(b"k", Version { ts, site: 1, vv }, Some(b"value"), Some(5));
        assert!(e.size() < 1 + 8 + 1 + 3 + 1 + 8 + 2 * 8 + 1 + 5, "remote entries cost less than a timestamp each: {}", e.size());
        let mut vv = VersionVector::local(2, ts);
        vv.set(0, Timestamp::new(1_699_999_999_999, 0));
        round_trip(b"k", Version { ts, site: 2, vv }, Some(b"v"), None);
        // Keys past 64 KiB: the timestamp after them was once read at its
        // place modulo 2^16, inside the key.
        for len in [65_535, 65_536, 70_000, 1 << 20] {
            round_trip(&vec![b'k'; len], Version::local(0, ts), Some(b"v"), Some(5));
        }
    }

    #[test]
    fn a_value_moves_out_and_back_and_the_rest_stays() {
        let ts = Timestamp::new(1_700_000_000_000, 3);
        let e = Entry::new(b"user1234567890123456789", &Version::local(0, ts), 7, Some(&[9u8; 100]), Some(77), true, Access::new(5));
        let out = e.moved_out();
        let v = out.view();
        assert!(v.on_disk() && !v.clean() && !v.is_tombstone() && v.is_live(76) && !v.is_live(77));
        assert_eq!((v.value(), v.seq(), v.expires_at_ms(), v.replaced()), (None, 7, Some(77), true));
        assert_eq!((v.version(), v.disk_len()), (e.view().version(), 100));
        let plain = Entry::new(b"user1234567890123456789", &Version::local(0, ts), 7, Some(&[9u8; 100]), None, true, Access::new(5));
        let size = plain.moved_out().size();
        assert!(size <= 48, "a YCSB key with its value on disk (and no expiry) fits a 48-byte block: {size}");
        let back = out.moved_back(&[9u8; 100]);
        assert!(back.view().clean() && !back.view().on_disk());
        assert_eq!(back.view().value(), e.view().value());
        let flagged = back.with_replaced();
        assert!(flagged.view().clean() && flagged.view().replaced());
    }

    #[test]
    fn expired_values_read_as_absent() {
        let e = Entry::new(b"k", &Version::local(0, Timestamp::new(1, 0)), 1, Some(b"x"), Some(50), false, Access::new(0));
        assert_eq!(e.view().live_value(49), Some(&b"x"[..]));
        assert_eq!(e.view().live_value(50), None);
        assert!(!e.view().replaced());
    }
}
