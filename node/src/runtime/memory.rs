//! What the process has allocated, as INFO's `used_memory` reports it: the
//! system allocator, counted. The `causeway` binary installs `Counting` as
//! its global allocator; without it (a library user's own binary) the
//! count stays at zero and INFO falls back to the resident set.
//!
//! The count is one relaxed atomic add per allocation and free, on memory
//! the allocating thread owns: no contention on the event loop's thread.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

static ALLOCATED: AtomicIsize = AtomicIsize::new(0);

/// The system allocator, counting the bytes it hands out.
pub struct Counting;

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, which
        // is passed on unchanged.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            ALLOCATED.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            ALLOCATED.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        ALLOCATED.fetch_sub(layout.size() as isize, Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from this allocator with `layout`.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            ALLOCATED.fetch_add(new_size as isize - layout.size() as isize, Ordering::Relaxed);
        }
        p
    }
}

/// Bytes allocated and not freed (0 if `Counting` is not the global
/// allocator).
pub fn allocated() -> u64 {
    ALLOCATED.load(Ordering::Relaxed).max(0) as u64
}

/// Gives memory the allocator holds free back to the system, once a good
/// part of what was allocated is freed (expired or deleted keys, a state
/// transfer's buffers): glibc keeps freed blocks for reuse, and the
/// resident set would stay at its peak. Called about once a second; cheap
/// when there is nothing to return. Returns whether it trimmed.
pub fn release_freed(peak: &mut u64) -> bool {
    const AT_LEAST: u64 = 8 << 20;
    let now = allocated();
    *peak = (*peak).max(now);
    if now == 0 || *peak - now < AT_LEAST {
        return false;
    }
    *peak = now;
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only releases free memory; it may be called at
    // any time.
    unsafe {
        libc::malloc_trim(0);
    }
    true
}
