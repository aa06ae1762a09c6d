//! A member's bytes: a data slot's values, or the parity of the group's
//! data areas, in 4 KB pages that exist once written (a page never written
//! reads as zeros, in the area and in the code). Pages are the unit of
//! repair. `Free` places values in a data area: a bump pointer and holes of
//! freed values, reused by size.

use super::code::Code;
use crate::message::ec::Loc;
use std::collections::BTreeMap;

pub const PAGE: usize = 4096;
/// Values are placed at multiples of this (a hole fits values of its class).
pub const ALIGN: u64 = 8;

#[derive(Default)]
pub struct Area {
    pages: Vec<Option<Box<[u8]>>>,
}

impl Area {
    pub fn read(&self, at: u64, out: &mut [u8]) {
        each_page(at, out.len(), |page, off, range| match self.pages.get(page).and_then(|p| p.as_ref()) {
            Some(p) => out[range.clone()].copy_from_slice(&p[off..off + range.len()]),
            None => out[range].fill(0),
        });
    }

    /// `area ^= bytes` at `at`.
    pub fn xor(&mut self, at: u64, bytes: &[u8]) {
        each_page(at, bytes.len(), |page, off, range| {
            let p = self.page_mut(page);
            for (a, b) in p[off..off + range.len()].iter_mut().zip(&bytes[range]) {
                *a ^= b;
            }
        });
    }

    /// `area ^= coefficient(j, i) * bytes` at `at`: parity j's share of
    /// data slot i's diff.
    pub fn add_delta(&mut self, code: &Code, j: usize, i: usize, at: u64, bytes: &[u8]) {
        each_page(at, bytes.len(), |page, off, range| {
            let n = range.len();
            code.add_delta(j, i, &bytes[range], &mut self.page_mut(page)[off..off + n]);
        });
    }

    pub fn page(&self, page: u32) -> Vec<u8> {
        match self.pages.get(page as usize).and_then(|p| p.as_ref()) {
            Some(p) => p.to_vec(),
            None => vec![0; PAGE],
        }
    }

    pub fn set_page(&mut self, page: u32, bytes: &[u8]) {
        self.page_mut(page as usize).copy_from_slice(bytes);
    }

    /// Bytes held in pages.
    pub fn bytes(&self) -> usize {
        self.pages.iter().flatten().count() * PAGE
    }

    pub fn pages(&self) -> u32 {
        self.pages.len() as u32
    }

    /// The pages written so far (number, bytes): the others are zeros.
    pub fn written(&self) -> impl Iterator<Item = (u32, &[u8])> {
        self.pages.iter().enumerate().filter_map(|(n, p)| Some((n as u32, &p.as_ref()?[..])))
    }

    fn page_mut(&mut self, page: usize) -> &mut [u8] {
        if self.pages.len() <= page {
            self.pages.resize_with(page + 1, || None);
        }
        self.pages[page].get_or_insert_with(|| vec![0u8; PAGE].into_boxed_slice())
    }
}

/// Calls `f(page, offset in page, range of the caller's bytes)` for each
/// page `len` bytes at `at` touch.
pub fn each_page(at: u64, len: usize, mut f: impl FnMut(usize, usize, std::ops::Range<usize>)) {
    let mut done = 0;
    while done < len {
        let pos = at as usize + done;
        let (page, off) = (pos / PAGE, pos % PAGE);
        let n = (PAGE - off).min(len - done);
        f(page, off, done..done + n);
        done += n;
    }
}

/// The pages `loc` touches.
pub fn pages_of(loc: Loc) -> std::ops::Range<u32> {
    let first = (loc.at / PAGE as u64) as u32;
    let end = (loc.at + loc.len as u64).div_ceil(PAGE as u64) as u32;
    first..end.max(first)
}

/// Where a data area's values go.
#[derive(Default)]
pub struct Free {
    bump: u64,
    holes: BTreeMap<u64, Vec<u64>>,
    hole_bytes: u64,
}

impl Free {
    /// A free place for `len` bytes: a hole of the same class, or the end.
    pub fn alloc(&mut self, len: u32) -> Loc {
        let size = class(len);
        if let Some(at) = self.holes.get_mut(&size).and_then(|v| v.pop()) {
            self.hole_bytes -= size;
            return Loc { at, len };
        }
        let at = self.bump;
        self.bump += size;
        Loc { at, len }
    }

    pub fn free(&mut self, loc: Loc) {
        let size = class(loc.len);
        self.holes.entry(size).or_default().push(loc.at);
        self.hole_bytes += size;
    }

    /// The allocator of an area whose live values are `live` and whose
    /// bytes end by `extent`: everything else is a hole.
    pub fn rebuild(mut live: Vec<Loc>, extent: u64) -> Free {
        live.sort_by_key(|l| l.at);
        let mut free = Free { bump: extent.next_multiple_of(ALIGN), ..Free::default() };
        let mut end = 0;
        for l in live {
            free.gap(end, l.at);
            end = end.max(l.at + class(l.len));
        }
        free.bump = free.bump.max(end);
        free
    }

    /// Bytes placed so far (the area's high-water mark) and bytes in holes.
    pub fn used(&self) -> (u64, u64) {
        (self.bump, self.hole_bytes)
    }

    fn gap(&mut self, from: u64, to: u64) {
        if to > from {
            // A gap becomes one hole of its own size (never split: values
            // of that class reuse it).
            self.holes.entry(to - from).or_default().push(from);
            self.hole_bytes += to - from;
        }
    }
}

/// The size class of a value: 16 classes per doubling (multiples of 8 up
/// to 128 bytes, of 16 up to 256, ..., of 64 up to 1 KiB), so a hole is
/// reused by values near its size and a value wastes at most 1/16 of it.
fn class(len: u32) -> u64 {
    let len = (len as u64).max(1);
    let floor = 1u64 << (63 - len.leading_zeros());
    let align = (floor / 16).max(ALIGN);
    len.next_multiple_of(align)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_and_xors_cross_pages() {
        let mut a = Area::default();
        let data: Vec<u8> = (0..10_000).map(|i| i as u8).collect();
        a.xor(4000, &data);
        let mut out = vec![0; 10_000];
        a.read(4000, &mut out);
        assert_eq!(out, data);
        assert_eq!(a.bytes(), 4 * PAGE);
        let mut head = vec![1; 8];
        a.read(0, &mut head);
        assert_eq!(head, vec![0; 8]);
        assert_eq!(pages_of(Loc { at: 4000, len: 10_000 }), 0..4);
    }

    #[test]
    fn holes_are_reused_by_class() {
        let mut f = Free::default();
        let a = f.alloc(10);
        let b = f.alloc(100);
        assert_eq!((a.at, b.at), (0, 16));
        f.free(a);
        assert_eq!(f.alloc(12).at, 0);
        assert_eq!(f.alloc(10).at, 120);
        assert_eq!((class(64), class(65), class(100), class(1000), class(1024), class(1025)), (64, 72, 104, 1024, 1024, 1088));
        let r = Free::rebuild(vec![Loc { at: 16, len: 100 }], 200);
        assert_eq!(r.used(), (200, 16));
    }
}
