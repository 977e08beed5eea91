//! Heap profiles from jemalloc's allocation sampling (feature `heap-profiling`): the
//! allocator users install, the `malloc_conf` that turns sampling on from process start,
//! availability checks that answer instead of panicking, the timed window for processes
//! where sampling is off, and the dump turned into a pprof `Profile` whose stacks start
//! at the allocation site. Parsing the dump and spotting allocator frames are pure, and
//! live in `heap/dump.rs` so that they build and are tested on every target.

use std::time::Duration;

#[cfg(not(heap_dumps))]
use crate::proto::Profile;

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
    pub(crate) symbolize: crate::profile::Symbolize,
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

// Used only where dumps exist (the `linux` module below); compiled everywhere so that
// its tests run on every target and without features.
#[cfg_attr(not(heap_dumps), allow(dead_code))]
mod dump;

#[cfg(all(feature = "heap-profiling", not(target_env = "msvc")))]
pub use allocator::Jemalloc;

#[cfg(all(feature = "heap-profiling", not(target_env = "msvc")))]
mod allocator {
    use std::alloc::{GlobalAlloc, Layout};
    use std::sync::atomic::{AtomicBool, Ordering};

    /// Set by the first allocation through [`Jemalloc`]: proof that it is the global
    /// allocator, which jemalloc itself cannot tell (its `stats` are compiled out).
    pub(crate) static IN_USE: AtomicBool = AtomicBool::new(false);

    /// jemalloc as the global allocator, with heap sampling on from process start.
    ///
    /// ```ignore
    /// #[global_allocator]
    /// static ALLOC: krabka_pprof::Jemalloc = krabka_pprof::Jemalloc;
    /// ```
    ///
    /// It is `tikv_jemallocator::Jemalloc` with the `profiling` feature; this crate also
    /// links a `malloc_conf` of `prof:true,prof_active:true,lg_prof_sample:19`, so the
    /// heap routes work with no environment variable. `MALLOC_CONF` (or
    /// `_RJEM_MALLOC_CONF`) still overrides it at start-up.
    #[derive(Clone, Copy, Debug, Default)]
    pub struct Jemalloc;

    #[inline]
    fn mark() {
        // A read almost always, a write once: the flag's cache line stays shared.
        if !IN_USE.load(Ordering::Relaxed) {
            IN_USE.store(true, Ordering::Relaxed);
        }
    }

    // SAFETY: every method forwards to tikv_jemallocator's implementation, which upholds
    // the `GlobalAlloc` contract.
    unsafe impl GlobalAlloc for Jemalloc {
        #[inline]
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            mark();
            // SAFETY: forwarded with the caller's guarantees.
            unsafe { tikv_jemallocator::Jemalloc.alloc(layout) }
        }

        #[inline]
        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            mark();
            // SAFETY: forwarded with the caller's guarantees.
            unsafe { tikv_jemallocator::Jemalloc.alloc_zeroed(layout) }
        }

        #[inline]
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            // SAFETY: forwarded with the caller's guarantees.
            unsafe { tikv_jemallocator::Jemalloc.dealloc(ptr, layout) }
        }

        #[inline]
        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            // SAFETY: forwarded with the caller's guarantees.
            unsafe { tikv_jemallocator::Jemalloc.realloc(ptr, layout, new_size) }
        }
    }
}

/// jemalloc reads `malloc_conf` before `main`. The symbol is `_rjem_malloc_conf` when
/// jemalloc's symbols are prefixed (tikv-jemalloc-sys's default) and `malloc_conf` when
/// another crate in the build turns on `unprefixed_malloc_on_supported_platforms`; both are
/// defined, so either build reads this setting. `#[used]` plus the export makes rustc's
/// synthetic object reference them, so the linker keeps them even though nothing in Rust
/// does (jemalloc's own weak definition would otherwise win silently).
#[cfg(heap_dumps)]
mod conf {
    /// A C string pointer that may live in a `static`.
    #[repr(transparent)]
    pub struct ConfString(*const u8);

    // SAFETY: it points to a string literal, immutable and 'static.
    unsafe impl Sync for ConfString {}

    const CONF: &[u8] = b"prof:true,prof_active:true,lg_prof_sample:19\0";

    #[used]
    #[unsafe(export_name = "_rjem_malloc_conf")]
    pub static PREFIXED: ConfString = ConfString(CONF.as_ptr());

    #[used]
    #[unsafe(export_name = "malloc_conf")]
    pub static UNPREFIXED: ConfString = ConfString(CONF.as_ptr());
}

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
pub(crate) use linux::profile;

#[cfg(heap_dumps)]
mod linux {
    use std::io::BufReader;
    use std::sync::atomic::Ordering;
    use std::sync::{Mutex, PoisonError};
    use std::time::{Duration, Instant, SystemTime};

    use crate::profile::Symbolize;
    use crate::proto::Profile;
    use tikv_jemalloc_ctl::raw;

    use super::dump::{Parsed, is_allocator_frame, parse};
    use super::{HeapError, HeapRequest};
    use crate::objects::Objects;
    use crate::profile::{Frame, Meta, ProfileBuilder};

    /// The end of the running timed window, if one runs.
    static WINDOW: Mutex<Option<Instant>> = Mutex::new(None);

    /// Holds the timed window for one request. [`finish`](Self::finish) switches sampling
    /// back off and frees the window before the response leaves; dropping it unfinished
    /// (the client hung up) does the same on the blocking pool.
    struct WindowLease {
        finished: bool,
        /// When sampling was switched on: the profile's `time_nanos`, and its
        /// `duration_nanos` measured from here to the dump.
        started: Option<(Instant, SystemTime)>,
    }

    /// What a request gets to do, decided under the window lock so that no request can
    /// see sampling active because another request's window just switched it on.
    enum Plan {
        /// Sampling is active on its own: dump at once.
        DumpNow,
        /// Sampling is off: this request runs a window.
        Window(WindowLease),
    }

    fn plan(window: Duration) -> Result<Plan, HeapError> {
        let mut running = WINDOW.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(ends_at) = *running {
            return Err(HeapError::Busy {
                retry_after: ends_at.saturating_duration_since(Instant::now()),
            });
        }
        if state()? {
            return Ok(Plan::DumpNow);
        }
        *running = Some(Instant::now() + window);
        Ok(Plan::Window(WindowLease {
            finished: false,
            started: None,
        }))
    }

    /// Switches sampling off (which also resets jemalloc's samples) and frees the window.
    fn end_window() {
        if let Some(ctl) = jemalloc_pprof::PROF_CTL.as_ref() {
            let _ = ctl.blocking_lock().deactivate();
        }
        *WINDOW.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }

    impl WindowLease {
        /// Ends the window; call on the blocking pool.
        fn finish(mut self) {
            self.finished = true;
            end_window();
        }
    }

    impl Drop for WindowLease {
        fn drop(&mut self) {
            if self.finished {
                return;
            }
            // Resetting walks jemalloc's samples: not on an async worker.
            match tokio::runtime::Handle::try_current() {
                Ok(handle) => drop(handle.spawn_blocking(end_window)),
                Err(_) => end_window(),
            }
        }
    }

    async fn blocking<T, F>(f: F) -> Result<T, HeapError>
    where
        F: FnOnce() -> Result<T, HeapError> + Send + 'static,
        T: Send + 'static,
    {
        crate::on_blocking_pool(f, HeapError::Failed).await
    }

    /// Whether jemalloc samples this process's heap, and whether sampling is active now.
    fn state() -> Result<bool, HeapError> {
        if !super::allocator::IN_USE.load(Ordering::Relaxed) {
            return Err(HeapError::NotJemalloc);
        }
        // Read `opt.prof` ourselves first: jemalloc_pprof's PROF_CTL unwraps it and would
        // panic (and poison itself) in a jemalloc built without profiling.
        // SAFETY: "opt.prof" is a documented read-only bool.
        match unsafe { raw::read::<bool>(b"opt.prof\0") } {
            Err(_) => Err(HeapError::NoProfilingSupport),
            Ok(false) => Err(HeapError::ProfilingOff),
            // SAFETY: "prof.active" is a documented read-write bool.
            Ok(true) => unsafe { raw::read::<bool>(b"prof.active\0") }
                .map_err(|e| HeapError::Failed(format!("reading prof.active failed: {e}"))),
        }
    }

    /// Takes one heap profile and hands it to `render` on the blocking pool: at once if
    /// sampling is active, else after sampling for `request.window`.
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
                ctl.blocking_lock().activate().map_err(|e| {
                    HeapError::Failed(format!("activating heap sampling failed: {e}"))
                })?;
                lease.started = Some((Instant::now(), SystemTime::now()));
                Ok(Some(lease))
            }
        })
        .await?
        {
            None => return blocking(move || render(dump(None, symbolize)?)).await,
            Some(lease) => lease,
        };
        tokio::time::sleep(window).await;
        blocking(move || {
            let profile = dump(lease.started, symbolize);
            lease.finish();
            render(profile?)
        })
        .await
    }

    /// Dumps jemalloc's samples and builds the profile; `window` is when this request's
    /// window switched sampling on, if it did.
    fn dump(
        window: Option<(Instant, SystemTime)>,
        symbolize: Symbolize,
    ) -> Result<Profile, HeapError> {
        let ctl = jemalloc_pprof::PROF_CTL
            .as_ref()
            .ok_or(HeapError::ProfilingOff)?;
        let file = ctl
            .blocking_lock()
            .dump()
            .map_err(|e| HeapError::Failed(format!("jemalloc's heap dump failed: {e}")))?;
        let parsed = parse(BufReader::new(file))
            .map_err(|e| HeapError::Failed(format!("jemalloc's heap dump is unreadable: {e}")))?;
        Ok(build(&parsed, window, symbolize))
    }

    fn build(
        parsed: &Parsed,
        window: Option<(Instant, SystemTime)>,
        symbolize: Symbolize,
    ) -> Profile {
        let objects = Objects::current();
        let mut builder = ProfileBuilder::new(&objects).symbolize(symbolize);
        for stack in &parsed.stacks {
            // Every address is a return address: minus one lands inside the call.
            let frames = stack
                .addresses
                .iter()
                .map(|a| Frame::Code(a.saturating_sub(1)))
                .collect();
            builder.add(
                frames,
                vec![stack.objects.round() as i64, stack.bytes.round() as i64],
                Vec::new(),
            );
        }
        // A window's profile covers the window, as measured; a dump of sampling that was
        // already on is an instant.
        let (duration, time) = window
            .map_or((Duration::ZERO, SystemTime::now()), |(started, at)| {
                (started.elapsed(), at)
            });
        builder.finish(
            &Meta {
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
}
