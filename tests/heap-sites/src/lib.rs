//! The allocation sites of the heap tests (`tests/tests/heap/allocs.rs`, through
//! `test_child serve-sites`), in a crate of their own so that the root `Cargo.toml` can
//! build them with `opt-level = 2` in dev builds: as a release build compiles a service's
//! own code, the allocator's plumbing (`alloc::alloc::alloc`, `RawVec…`,
//! `Vec::with_capacity`) is inlined into each site, so that with line tables the site's
//! location carries those functions as inlined frames, which a heap profile must trim for
//! its stacks to start at the site. Workspace members keep full debug info.

use std::hint::black_box;

/// The size of each block [`retain_64_mib`] keeps.
pub const RETAINED_BLOCK: usize = 256 * 1024;
/// The size of the block [`churn_64_kib`] allocates and frees.
pub const CHURN_BLOCK: usize = 64 * 1024;

/// Allocates 64 MiB in 256 blocks of 256 KiB and returns them, to be kept: jemalloc
/// samples each block with probability 1 - e^(-1/2), so about 100 samples carry the
/// estimate (a standard error near 8 %).
#[inline(never)]
pub fn retain_64_mib() -> Vec<Vec<u8>> {
    let mut kept = Vec::with_capacity(256);
    for i in 0..256 {
        let mut block = Vec::<u8>::with_capacity(RETAINED_BLOCK);
        block.push(i as u8);
        kept.push(black_box(block));
    }
    kept
}

/// Allocates a 64 KiB block, touches it and frees it; returns the bytes allocated.
#[inline(never)]
pub fn churn_64_kib() -> usize {
    let mut block = Vec::<u8>::with_capacity(CHURN_BLOCK);
    block.push(1);
    black_box(&mut block);
    block.capacity()
}
