//! Heap profiling over HTTP, in a process whose global allocator is `krabka_pprof::Jemalloc`
//! and that sets no `MALLOC_CONF`: sampling is on from start, with the crate's defaults.

#[global_allocator]
static ALLOC: krabka_pprof::Jemalloc = krabka_pprof::Jemalloc;

mod allocs;
mod child;
mod counts;
mod dumps;
mod sites;
mod together;
