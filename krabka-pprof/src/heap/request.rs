//! What a heap request asks for, after defaults and clamping, and every way it can fail
//! (which `routes` turns into answers); and whether heap profiles can be taken in this
//! build at all.

use std::time::Duration;

use crate::symbolize::Symbolize;

/// Why heap profiles cannot be taken in this build, if they cannot: the 503's sentence and
/// the index page's note.
pub(crate) const UNAVAILABLE: Option<&str> = if !cfg!(target_os = "linux") {
    Some("heap profiling needs Linux: jemalloc_pprof reads the process's mappings from /proc")
} else if cfg!(target_env = "musl") {
    // jemalloc's configure finds no unwinder in musl and falls back to walking frame
    // pointers, which Rust code and musl do not keep: the first sampled allocation
    // would crash the process. So sampling stays off there.
    Some(
        "heap profiling needs a glibc build (…-linux-gnu): with musl, jemalloc can only \
         walk stacks by frame pointers, which would crash the process",
    )
} else if !cfg!(feature = "heap-profiling") {
    Some("heap profiling is compiled out: enable krabka-pprof's `heap-profiling` feature")
} else {
    None
};

/// What a heap request asks for, after defaults and clamping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct HeapRequest {
    /// `/heap` or `/allocs`.
    pub(crate) route: HeapRoute,
    /// The window: `seconds` as asked and clamped, else `heap_default`.
    pub(crate) window: Duration,
    /// Whether `seconds` was given: with sampling active, the profile is then what was
    /// allocated during the window; without it, the profile is of now.
    pub(crate) seconds_given: bool,
    /// What the profile names (`?symbolize=`).
    pub(crate) symbolize: Symbolize,
    /// The router's `alloc_stacks`: 0 means no allocation counts.
    pub(crate) alloc_stacks: u32,
    /// The `sample_index` asked for, if any: one of [`SAMPLE_TYPES`].
    pub(crate) sample_index: Option<&'static str>,
}

/// Which heap route.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HeapRoute {
    /// `/heap`: shown as `inuse_space` by default.
    Heap,
    /// `/allocs`: shown as `alloc_space` by default, where allocation counts exist.
    Allocs,
}

/// Go's sample types of a heap profile, in Go's order; the `alloc_*` pair exists only
/// where allocation counts do.
pub(crate) const SAMPLE_TYPES: [&str; 4] = [
    "alloc_objects",
    "alloc_space",
    "inuse_objects",
    "inuse_space",
];

/// Why a heap profile could not be produced.
#[derive(Debug)]
#[allow(
    dead_code,
    reason = "which variants can occur depends on the target and the features"
)]
pub(crate) enum HeapError {
    /// The crate was built without `heap-profiling`, or not for Linux with glibc.
    Unsupported(&'static str),
    /// jemalloc is not the global allocator.
    NotJemalloc,
    /// jemalloc was built without profiling support.
    NoProfilingSupport,
    /// jemalloc profiling is off (`prof:false` in `_RJEM_MALLOC_CONF`).
    ProfilingOff,
    /// A timed window is running; it ends in `retry_after`.
    Busy { retry_after: Duration },
    /// `max` windows of allocations are open; the first ends in `retry_after`.
    WindowsFull { max: usize, retry_after: Duration },
    /// The request asks for what this process cannot give (the sentence says why).
    BadRequest(String),
    /// The dump or its parsing failed.
    Failed(String),
}
