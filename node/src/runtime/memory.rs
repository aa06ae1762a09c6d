//! The allocator the node runs on, and what the process has allocated, as
//! INFO's `used_memory` reports it. The `causeway` binary installs
//! `Counting` as its global allocator: mimalloc, counted. Without it (a
//! library user's own binary) the count stays at zero and INFO falls back
//! to the resident set.
//!
//! mimalloc rather than the system's (glibc) malloc: a request allocates
//! and frees a few small blocks at every step (messages, envelopes,
//! buffers), and glibc's malloc and free were a quarter of the replicated
//! write path's instructions (BENCHMARKS.md, "CPU per request"). mimalloc
//! keeps no header per block, so a key's one allocation also costs less.
//! It is built without transparent huge pages: with them each fault zeroed
//! 2 MB (4% of a loaded node's CPU went to clearing pages) and the resident
//! set grew in 2 MB steps.
//!
//! The count is one relaxed atomic add per allocation and free, on memory
//! the allocating thread owns: no contention on the event loop's thread.

use causeway_core::chain::Policy;
use libmimalloc_sys as mi;
use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;
use std::sync::atomic::{AtomicIsize, AtomicU64, Ordering};

static ALLOCATED: AtomicIsize = AtomicIsize::new(0);

/// mimalloc aligns every block of at least this size to this: a smaller
/// alignment takes its plain (fast) path, as std's system allocator does
/// with malloc. (The `mimalloc` crate always takes the aligned path, which
/// costs a few instructions more per allocation.)
const MIN_ALIGN: usize = 16;

fn plain(align: usize, size: usize) -> bool {
    align <= MIN_ALIGN && align <= size
}

/// mimalloc, counting the bytes it hands out.
pub struct Counting;

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: mimalloc's allocation functions have no preconditions;
        // the block is at least `layout.size()` bytes with the alignment
        // asked (`plain`).
        let p = unsafe {
            match plain(layout.align(), layout.size()) {
                true => mi::mi_malloc(layout.size()),
                false => mi::mi_malloc_aligned(layout.size(), layout.align()),
            }
        } as *mut u8;
        if !p.is_null() {
            ALLOCATED.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        let p = unsafe {
            match plain(layout.align(), layout.size()) {
                true => mi::mi_zalloc(layout.size()),
                false => mi::mi_zalloc_aligned(layout.size(), layout.align()),
            }
        } as *mut u8;
        if !p.is_null() {
            ALLOCATED.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from mimalloc (this allocator).
        unsafe { mi::mi_free(ptr as *mut c_void) };
        ALLOCATED.fetch_sub(layout.size() as isize, Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from mimalloc with `layout`; the new block keeps
        // its alignment.
        let p = unsafe {
            match plain(layout.align(), new_size) {
                true => mi::mi_realloc(ptr as *mut c_void, new_size),
                false => mi::mi_realloc_aligned(ptr as *mut c_void, new_size, layout.align()),
            }
        } as *mut u8;
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
/// transfer's buffers): mimalloc returns what it freed on its own after a
/// short delay, but pages with a few live blocks stay with their thread's
/// heap until it collects. Called about once a second; cheap when there is
/// nothing to return. Returns whether it collected.
pub fn release_freed(peak: &mut u64) -> bool {
    const AT_LEAST: u64 = 8 << 20;
    let now = allocated();
    *peak = (*peak).max(now);
    if now == 0 || *peak - now < AT_LEAST {
        return false;
    }
    *peak = now;
    // SAFETY: mi_collect only frees what is unused; it may be called at
    // any time, from any thread (it collects that thread's heap).
    unsafe {
        mi::mi_collect(true);
    }
    true
}

/// The node's memory budget (`--maxmemory`, `CONFIG SET maxmemory`) and
/// what to do past it, handed to the node state machine before every step
/// (`causeway_core::node::Node::set_memory`, which measures its stores
/// against it).
#[derive(Debug, Default)]
pub struct Budget {
    /// Bytes; 0: no limit.
    max: AtomicU64,
    policy: parking_lot::Mutex<Policy>,
}

impl Budget {
    pub fn new(max: u64, policy: Policy) -> Budget {
        Budget { max: AtomicU64::new(max), policy: parking_lot::Mutex::new(policy) }
    }

    pub fn set(&self, max: u64) {
        self.max.store(max, Ordering::Relaxed);
    }

    pub fn set_policy(&self, policy: Policy) {
        *self.policy.lock() = policy;
    }

    pub fn max(&self) -> u64 {
        self.max.load(Ordering::Relaxed)
    }

    pub fn policy(&self) -> Policy {
        *self.policy.lock()
    }
}
