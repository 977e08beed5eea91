//! Every way a profile kind can fail, as the answer Go's `net/http/pprof` would give: one
//! sentence saying what to do, 409 with `Retry-After` when busy, 503 where it cannot work,
//! 500 when it failed. The kinds (`cpu`, `heap`, `threads`, `tasks`) know no HTTP; this is
//! where their errors meet it, and where each refusal is logged.

use axum::response::Response;

use super::response::{bad_request, busy, failed, not_found, unavailable};
use crate::cpu::{CpuError, RecentError};
use crate::heap::HeapError;
use crate::tasks::TaskError;
use crate::threads::DumpError;

/// A CPU profile's failure.
pub(super) fn cpu(error: CpuError) -> Response {
    let span = tracing::Span::current();
    match error {
        CpuError::Busy { retry_after }
        | CpuError::Full {
            max_windows: 1,
            retry_after,
        } => {
            span.record("outcome", "busy");
            tracing::debug!("refused: a CPU profile is already running");
            busy(
                retry_after,
                "a CPU profile is already running and ends in about {}s; retry after that, \
                 or add force=true to stop it early",
            )
        }
        CpuError::ForcedRunning { retry_after } => {
            span.record("outcome", "busy");
            tracing::debug!("refused: a forced CPU profile is running");
            busy(
                retry_after,
                "a CPU profile started with force=true is running and ends in about {}s; \
                 force=true does not stop another forced profile, retry after that",
            )
        }
        CpuError::OtherFrequency {
            running,
            retry_after,
        } => {
            span.record("outcome", "busy");
            tracing::debug!("refused: a CPU profile runs at {running} Hz");
            busy(
                retry_after,
                &format!(
                    "a CPU profile is running at {running} Hz and ends in about {{}}s; a \
                     request at {running} Hz joins it at once, another frequency must wait \
                     for it, or add force=true to stop it early",
                ),
            )
        }
        CpuError::Full {
            max_windows,
            retry_after,
        } => {
            span.record("outcome", "busy");
            tracing::debug!("refused: {max_windows} CPU profiles are running");
            busy(
                retry_after,
                &format!(
                    "{max_windows} CPU profiles are running, the most this app allows at once \
                     (max_windows); the first ends in about {{}}s, retry after that, or add \
                     force=true to stop them early",
                ),
            )
        }
        CpuError::Unavailable(reason) => unavailable(reason),
        CpuError::Failed(reason) => failed(&format!(
            "CPU profiling failed: {reason}; the profiler is free again, retry the request"
        )),
    }
}

/// `/recent` on a router built without `recent`.
pub(super) fn recorder_off() -> Response {
    unavailable(
        "the recorder is off in this app: add `recent = \"10m\"` to #[pprof_routes(...)] (or \
         ProfilingConfig::with_recent) to keep the last minutes of CPU profiles, or take \
         /profile?seconds=N now",
    )
}

/// A profile of the past's failure.
pub(super) fn recent(error: RecentError) -> Response {
    match error {
        RecentError::Unavailable(reason) => unavailable(reason),
        RecentError::NothingKept(why) => not_found(&format!(
            "nothing is recorded for that window ({why}); ask for a later `end` or a longer \
             `seconds`, or see the index page for what is kept"
        )),
        RecentError::Failed(reason) => failed(&format!(
            "the recorded CPU profile could not be built: {reason}; retry the request"
        )),
    }
}

/// A heap profile's failure.
pub(super) fn heap(error: HeapError) -> Response {
    let span = tracing::Span::current();
    match error {
        HeapError::Busy { retry_after } => {
            span.record("outcome", "busy");
            tracing::debug!("refused: a timed heap window is already running");
            busy(
                retry_after,
                "a timed heap sampling window is already running and ends in about {}s; \
                 retry after that",
            )
        }
        HeapError::WindowsFull { max, retry_after } => {
            span.record("outcome", "busy");
            tracing::debug!("refused: {max} heap windows are open");
            busy(
                retry_after,
                &format!(
                    "{max} windows of allocations are open, the most at once; the first ends in \
                     about {{}}s, retry after that, or leave out `seconds` for the counts since \
                     the start"
                ),
            )
        }
        HeapError::BadRequest(reason) => bad_request(&reason),
        HeapError::Unsupported(reason) => unavailable(reason),
        HeapError::NotJemalloc => unavailable(
            "heap profiling needs jemalloc as the global allocator, and this binary's is \
             another (the system's, mimalloc, ...): make its #[global_allocator] line \
             `static ALLOC: krabka_pprof::Jemalloc = krabka_pprof::Jemalloc;` (or \
             tikv_jemallocator::Jemalloc), in place of the one it has, and restart it",
        ),
        HeapError::NoProfilingSupport => unavailable(
            "this binary's jemalloc was built without profiling: enable krabka-pprof's \
             `heap-profiling` feature, which builds it with profiling, and rebuild",
        ),
        HeapError::ProfilingOff => unavailable(
            "jemalloc heap sampling is off in this process (_RJEM_MALLOC_CONF sets prof:false): \
             remove that setting and restart the process",
        ),
        HeapError::Failed(reason) => failed(&format!(
            "heap profiling failed: {reason}; retry the request"
        )),
    }
}

/// A thread dump's failure.
pub(super) fn thread_dump(error: DumpError) -> Response {
    match error {
        DumpError::Unavailable(reason) => unavailable(reason),
        DumpError::Busy { retry_after } => {
            tracing::Span::current().record("outcome", "busy");
            tracing::debug!("refused: a thread dump is already running");
            busy(
                retry_after,
                "a thread dump is already running and waits for its threads about {}s \
                 more at most (its deadline); retry after that",
            )
        }
        DumpError::Failed(reason) => failed(&format!(
            "the thread dump failed: {reason}; retry the request"
        )),
    }
}

/// A task dump's failure.
pub(super) fn task_dump(error: TaskError) -> Response {
    match error {
        TaskError::Unavailable(reason) => unavailable(&reason),
        TaskError::Busy { retry_after } => {
            tracing::Span::current().record("outcome", "busy");
            tracing::debug!("refused: a task dump is already running");
            busy(
                retry_after,
                "a task dump is already running (one that timed out waits for a blocked \
                 worker thread until tokio answers); retry after {}s",
            )
        }
        TaskError::Failed(reason) => failed(&reason),
    }
}
