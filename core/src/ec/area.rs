//! A member's bytes: a data slot's values, or the parity of the group's
//! data areas, in 4 KB pages that exist once written (a page never written
//! reads as zeros, in the area and in the code). Pages are the unit of
//! repair. `Free` places values in a data area: a bump pointer and holes of
//! freed values, reused by size; it counts the values on each page, so a
//! page no value is on any more can be given back (zeroed, its diff sent to
//! the parity as any other, and dropped: `Member::give_back`).

use super::code::Code;
use crate::message::ec::Loc;
use std::collections::{BTreeMap, BTreeSet};

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

    /// Takes page `page` out (it reads as zeros from now on): its bytes, if
    /// it was written and not all zeros.
    pub fn take_page(&mut self, page: u32) -> Option<Box<[u8]>> {
        let bytes = self.pages.get_mut(page as usize)?.take()?;
        self.trim();
        bytes.iter().any(|&b| b != 0).then_some(bytes)
    }

    /// Drops page `page` if it holds only zeros (a parity page once every
    /// data page of its stripe was given back).
    pub fn drop_if_zero(&mut self, page: u32) {
        if let Some(slot) = self.pages.get_mut(page as usize) {
            if slot.as_ref().is_some_and(|p| p.iter().all(|&b| b == 0)) {
                *slot = None;
                self.trim();
            }
        }
    }

    fn trim(&mut self) {
        while self.pages.last().is_some_and(Option::is_none) {
            self.pages.pop();
        }
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
    /// Per page, the placed values whose bytes are on it.
    on_page: Vec<u32>,
    /// Pages no placed value is on any more since they last had one.
    emptied: BTreeSet<u32>,
}

impl Free {
    /// A free place for `len` bytes: a hole of the same class, or the end.
    pub fn alloc(&mut self, len: u32) -> Loc {
        let size = class(len);
        let loc = match self.holes.get_mut(&size).and_then(|v| v.pop()) {
            Some(at) => {
                self.hole_bytes -= size;
                Loc { at, len }
            }
            None => {
                let at = self.bump;
                self.bump += size;
                Loc { at, len }
            }
        };
        self.placed(loc);
        loc
    }

    pub fn free(&mut self, loc: Loc) {
        let size = class(loc.len);
        self.holes.entry(size).or_default().push(loc.at);
        self.hole_bytes += size;
        for p in pages_of(loc) {
            let n = &mut self.on_page[p as usize];
            *n -= 1;
            if *n == 0 {
                self.emptied.insert(p);
            }
        }
    }

    fn placed(&mut self, loc: Loc) {
        for p in pages_of(loc) {
            if self.on_page.len() <= p as usize {
                self.on_page.resize(p as usize + 1, 0);
            }
            self.on_page[p as usize] += 1;
            self.emptied.remove(&p);
        }
    }

    /// Takes up to `max` of the pages no value is on any more.
    pub fn take_emptied(&mut self, max: usize) -> Vec<u32> {
        let pages: Vec<u32> = self.emptied.iter().copied().take(max).collect();
        for p in &pages {
            self.emptied.remove(p);
        }
        pages
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
            free.placed(l);
        }
        free.bump = free.bump.max(end);
        let pages = free.bump.div_ceil(PAGE as u64) as u32;
        free.on_page.resize(pages as usize, 0);
        free.emptied = (0..pages).filter(|&p| free.on_page[p as usize] == 0).collect();
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

    #[test]
    fn a_page_is_emptied_once_no_value_is_on_it() {
        let mut f = Free::default();
        let a = f.alloc(3000); // page 0
        let b = f.alloc(2000); // pages 0 and 1
        let c = f.alloc(100); // page 1
        assert_eq!(pages_of(b), 0..2);
        f.free(a);
        assert!(f.take_emptied(10).is_empty(), "b is still on page 0");
        f.free(b);
        assert_eq!(f.take_emptied(10), vec![0]);
        // A value placed on an emptied page takes it back.
        f.free(c);
        let d = f.alloc(100);
        assert_eq!(d.at, c.at);
        assert!(f.take_emptied(10).is_empty());
        // Rebuilt from the live values: the pages none is on.
        let r = Free::rebuild(vec![Loc { at: 5000, len: 10 }], 3 * PAGE as u64);
        let mut r = r;
        assert_eq!(r.take_emptied(10), vec![0, 2]);
    }

    #[test]
    fn a_page_taken_out_reads_as_zeros() {
        let mut a = Area::default();
        a.xor(PAGE as u64, &[7; 10]);
        a.xor(0, &[0; 10]);
        assert_eq!(a.take_page(0), None, "all zeros: nothing to give back");
        assert_eq!(a.take_page(1).map(|p| p[0]), Some(7));
        assert_eq!((a.bytes(), a.pages()), (0, 0));
        let mut out = [1; 4];
        a.read(PAGE as u64, &mut out);
        assert_eq!(out, [0; 4]);
        a.xor(2 * PAGE as u64, &[1]);
        a.xor(2 * PAGE as u64, &[1]);
        a.drop_if_zero(2);
        assert_eq!(a.bytes(), 0);
    }
}
