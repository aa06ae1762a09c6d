//! INFO `used_memory` counts what every thread allocates
//! (`runtime::memory::Counting`). A test binary of its own, with one test:
//! the count is process-wide, so tests running beside it would move it.

use causeway_node::runtime::memory::{allocated, Counting};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The count follows what threads allocate and free, also what a thread had
/// not added to the total when it ended (its count is added every 64 KB).
#[test]
fn the_count_follows_allocations_of_every_thread() {
    const SLACK: i64 = 1 << 20;
    let before = allocated() as i64;
    let big = std::thread::spawn(|| vec![1u8; 32 << 20]).join().unwrap();
    let grown = allocated() as i64 - before;
    assert!((grown - (32 << 20)).abs() < SLACK, "32 MB from another thread: {grown}");
    // Blocks kept by threads that end below their threshold: counted when
    // each ends.
    let small: Vec<Vec<u8>> = (0..128).map(|_| std::thread::spawn(|| vec![1u8; 60 << 10]).join().unwrap()).collect();
    let grown = allocated() as i64 - before;
    assert!((grown - (32 << 20) - 128 * (60 << 10)).abs() < SLACK, "and 7.5 MB in 128 threads: {grown}");
    drop(big);
    drop(small);
    let left = allocated() as i64 - before;
    assert!(left.abs() < SLACK, "freed on this thread: {left}");
}
