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
//! The count is kept per thread and added to the process's total once it
//! moved by `FLUSH_BYTES` (and when the thread ends): an atomic add per
//! allocation and free, even uncontended, was 6% of a replicated write's
//! CPU (the locked instruction waits for the stores before it), where a
//! thread-local add costs next to nothing. The total is therefore off by at
//! most `FLUSH_BYTES` per running thread.

use causeway_core::chain::Policy;
use libmimalloc_sys as mi;
use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::ffi::c_void;
use std::sync::atomic::{AtomicIsize, AtomicU64, Ordering};

static ALLOCATED: AtomicIsize = AtomicIsize::new(0);
/// How far a thread's own count may move before it is added to the total.
const FLUSH_BYTES: isize = 64 * 1024;

/// What this thread allocated (less what it freed) and has not added to
/// `ALLOCATED` yet; added when the thread ends.
struct Pending(Cell<isize>);

impl Drop for Pending {
    fn drop(&mut self) {
        ALLOCATED.fetch_add(self.0.get(), Ordering::Relaxed);
    }
}

thread_local! {
    // Const-initialised: no allocation on first use (this runs inside the
    // allocator); the destructor is registered with the C library's
    // `__cxa_thread_atexit_impl`, which allocates with its own malloc.
    static PENDING: Pending = const { Pending(Cell::new(0)) };
}

/// Counts `bytes` (negative: freed) allocated by this thread.
#[inline]
fn count(bytes: isize) {
    let added = PENDING.try_with(|p| {
        let n = p.0.get() + bytes;
        if n.abs() >= FLUSH_BYTES {
            ALLOCATED.fetch_add(n, Ordering::Relaxed);
            p.0.set(0);
        } else {
            p.0.set(n);
        }
    });
    if added.is_err() {
        // The thread is ending and its count was added already.
        ALLOCATED.fetch_add(bytes, Ordering::Relaxed);
    }
}

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
            count(layout.size() as isize);
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
            count(layout.size() as isize);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from mimalloc (this allocator).
        unsafe { mi::mi_free(ptr as *mut c_void) };
        count(-(layout.size() as isize));
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
            count(new_size as isize - layout.size() as isize);
        }
        p
    }
}

/// Bytes allocated and not freed, within `FLUSH_BYTES` per running thread
/// (0 if `Counting` is not the global allocator).
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
