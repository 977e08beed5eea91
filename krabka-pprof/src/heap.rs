//! Heap profiles from jemalloc's allocation sampling (feature `heap-profiling`): what a
//! request asks for and how it fails, availability checks that answer instead of
//! panicking, and the dump turned into a pprof `Profile` whose stacks start at the
//! allocation site. Its rooms: `heap/jemalloc.rs` (the allocator users install, the
//! `malloc_conf` that turns sampling on from process start, jemalloc's state and dumps),
//! `heap/window.rs` (the timed window for processes where sampling is off),
//! `heap/request.rs` (what a request asks for and how it fails) and
//! `heap/dump.rs` (parsing the dump and spotting allocator frames: pure, so built and
//! tested on every target).

use crate::profile::Profile;
#[cfg(heap_dumps)]
use crate::symbolize::Symbolize;

// Used only where dumps exist; compiled everywhere so that its tests run on every target
// and without features.
#[cfg_attr(not(heap_dumps), allow(dead_code))]
mod dump;
#[cfg(jemalloc)]
mod jemalloc;
mod request;
#[cfg(heap_dumps)]
mod window;

pub(crate) use request::{HeapError, HeapRequest, UNAVAILABLE};

#[cfg(jemalloc)]
pub use jemalloc::Jemalloc;

#[cfg(heap_dumps)]
use std::time::{Duration, Instant, SystemTime};

#[cfg(heap_dumps)]
use self::dump::{Parsed, is_allocator_frame};
#[cfg(heap_dumps)]
use self::jemalloc::dump;
#[cfg(heap_dumps)]
use self::window::{Plan, plan};

/// Takes one heap profile and hands it to `render` on the blocking pool.
#[cfg(not(heap_dumps))]
pub(crate) async fn profile<R, F>(_request: HeapRequest, _render: F) -> Result<R, HeapError>
where
    F: FnOnce(Profile) -> Result<R, HeapError> + Send + 'static,
    R: Send + 'static,
{
    Err(HeapError::Unsupported(
        UNAVAILABLE.unwrap_or("heap profiling is not available"),
    ))
}

#[cfg(heap_dumps)]
async fn blocking<T, F>(f: F) -> Result<T, HeapError>
where
    F: FnOnce() -> Result<T, HeapError> + Send + 'static,
    T: Send + 'static,
{
    crate::offload::on_blocking_pool(f, HeapError::Failed).await
}

/// Takes one heap profile and hands it to `render` on the blocking pool: at once if
/// sampling is active, else after sampling for `request.window`.
#[cfg(heap_dumps)]
pub(crate) async fn profile<R, F>(request: HeapRequest, render: F) -> Result<R, HeapError>
where
    F: FnOnce(Profile) -> Result<R, HeapError> + Send + 'static,
    R: Send + 'static,
{
    let window = request.window;
    let symbolize = request.symbolize;
    // Deciding, taking the window and switching sampling on happen in one blocking
    // call, and the lease exists only once sampling is on: if the client hangs up at
    // any point, dropping the lease (here, or with the call's unread result) switches
    // sampling off after it was switched on, never before.
    let lease = match blocking(move || match plan(window)? {
        Plan::DumpNow => Ok(None),
        Plan::Window(mut lease) => {
            let ctl = jemalloc_pprof::PROF_CTL
                .as_ref()
                .ok_or(HeapError::ProfilingOff)?;
            ctl.blocking_lock()
                .activate()
                .map_err(|e| HeapError::Failed(format!("activating heap sampling failed: {e}")))?;
            lease.started = Some((Instant::now(), SystemTime::now()));
            Ok(Some(lease))
        }
    })
    .await?
    {
        None => return blocking(move || render(build(&dump()?, None, symbolize))).await,
        Some(lease) => lease,
    };
    tokio::time::sleep(window).await;
    blocking(move || {
        let parsed = dump();
        let started = lease.started;
        lease.finish();
        render(build(&parsed?, started, symbolize))
    })
    .await
}

/// The profile of a parsed dump; `window` is when this request's window switched
/// sampling on, if it did.
#[cfg(heap_dumps)]
fn build(parsed: &Parsed, window: Option<(Instant, SystemTime)>, symbolize: Symbolize) -> Profile {
    let objects = crate::objects::Objects::current();
    let mut builder = crate::profile::ProfileBuilder::new(&objects).symbolize(symbolize);
    for stack in &parsed.stacks {
        // Every address is a return address: minus one lands inside the call.
        let frames = stack
            .addresses
            .iter()
            .map(|a| crate::profile::Frame::Code(a.saturating_sub(1)))
            .collect();
        builder.add(
            frames,
            vec![stack.objects.round() as i64, stack.bytes.round() as i64],
            Vec::new(),
        );
    }
    // A window's profile covers the window, as measured; a dump of sampling that was
    // already on is an instant.
    let (duration, time) = window.map_or((Duration::ZERO, SystemTime::now()), |(started, at)| {
        (started.elapsed(), at)
    });
    builder.finish(
        &crate::profile::Meta {
            sample_types: &[("inuse_objects", "count"), ("inuse_space", "bytes")],
            period_type: ("space", "bytes"),
            period: parsed.period as i64,
            time,
            duration,
            default_sample_type: Some("inuse_space"),
            comments: Vec::new(),
        },
        &is_allocator_frame,
    )
}
