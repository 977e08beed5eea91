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
    /// How long to sample if sampling is not already active.
    pub(crate) window: Duration,
    /// What the profile names (`?symbolize=`).
    pub(crate) symbolize: Symbolize,
}

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
    /// jemalloc profiling is off (`prof:false` in `MALLOC_CONF`/`_RJEM_MALLOC_CONF`).
    ProfilingOff,
    /// A timed window is running; it ends in `retry_after`.
    Busy { retry_after: Duration },
    /// The dump or its parsing failed.
    Failed(String),
}
