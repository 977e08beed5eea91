//! One sampler session at a time in a process, whichever sampler runs it: the lease (an
//! RAII guard the session owns: 409, `force=true`, freed when its last request ends or
//! hangs up), what a request asks for and how it fails, and the choice of sampler. With
//! this crate's sampler several requests share a session, each with its own *window*
//! (`linux.rs`); the `pprof` crate's serves one request per session. The request side of
//! each sampler is its own file: `linux.rs` for this crate's (signal path in `sampler.rs`,
//! thread table in `threads.rs`, timers in `timers.rs`, stack reads in `memory.rs`),
//! `pprof_rs.rs` for the `pprof` crate's. Everything that can take more than microseconds
//! runs on the blocking pool.
//!
//! Names: a *lease* is a session's hold on the profiler; a *slot* is the sampler's
//! scratch memory for one signal handler; a *session* is one start-to-stop run of the
//! sampler; a *window* is one request's part of a session, from its arrival for its
//! `seconds`.

// Without a sampler every request is a 503: the busy state goes unused there.
#![cfg_attr(not(any(sampler, pprof_rs)), allow(dead_code))]

#[cfg(sampler)]
mod memory;
#[cfg(sampler)]
mod sampler;
#[cfg(sampler)]
mod threads;
#[cfg(sampler)]
mod timers;

use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

pub(crate) use crate::proto::Profile;

/// Why CPU profiles cannot be taken on this target, if they cannot: the 503's sentence
/// and the index page's note.
pub(crate) const UNAVAILABLE: Option<&str> = if cfg!(any(sampler, pprof_rs)) {
    None
} else {
    Some("CPU profiling is not available on this platform: it needs Linux, macOS or another Unix")
};

/// What one request asks of the CPU profiler, after defaults and clamping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CpuRequest {
    pub(crate) duration: Duration,
    pub(crate) frequency: u32,
    pub(crate) blocklist: &'static [&'static str],
    /// Stop a running profile early instead of answering 409.
    pub(crate) force: bool,
    /// How many windows may share one session (`max_windows`).
    pub(crate) max_windows: u32,
    /// What the profile names (`?symbolize=`).
    pub(crate) symbolize: crate::profile::Symbolize,
}

/// What is running now, for the index page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Status {
    /// The session's frequency, where the sampler shares it.
    pub(crate) frequency: Option<u32>,
    /// Windows open on it.
    pub(crate) windows: usize,
    /// Until the last one ends.
    pub(crate) ends_in: Duration,
}

/// The running CPU profile session of this process, if any.
pub(crate) fn status() -> Option<Status> {
    #[cfg(sampler)]
    if shares_windows() {
        return linux::status();
    }
    running().as_ref().map(|running| Status {
        frequency: None,
        windows: 1,
        ends_in: running.ends_at.saturating_duration_since(Instant::now()),
    })
}

/// Whether requests share the sampler (this crate's does; the `pprof` crate's serves one
/// request at a time).
pub(crate) fn shares_windows() -> bool {
    #[cfg(sampler)]
    return !is_pprof_rs_chosen();
    #[cfg(not(sampler))]
    false
}

/// Whether this process takes CPU profiles with the `pprof` crate's sampler.
#[cfg(sampler)]
fn is_pprof_rs_chosen() -> bool {
    #[cfg(pprof_rs)]
    return pprof_rs::chosen();
    #[cfg(not(pprof_rs))]
    false
}

/// Why a CPU profile could not be produced.
#[derive(Debug)]
pub(crate) enum CpuError {
    /// Another profile is running; it ends in `retry_after`.
    Busy { retry_after: Duration },
    /// A profile started with `?force=true` is running, which a `?force=true` request
    /// does not stop; it ends in `retry_after`.
    ForcedRunning { retry_after: Duration },
    /// The session runs at another frequency; it ends in `retry_after`. (Only this
    /// crate's sampler shares sessions.)
    #[cfg_attr(not(sampler), allow(dead_code))]
    OtherFrequency { running: u32, retry_after: Duration },
    /// `max_windows` windows share the session already; the first ends in `retry_after`.
    #[cfg_attr(not(sampler), allow(dead_code))]
    Full {
        max_windows: u32,
        retry_after: Duration,
    },
    /// Profiling cannot run here (this target, or this process as it is now); the
    /// sentence says why.
    Unavailable(&'static str),
    /// The profiler itself failed.
    Failed(String),
}

/// State of this process, never of its parent: a child made by `fork` gets a fresh one
/// the first time it looks, because it inherits the parent's memory as it was, a lock
/// taken by one of the parent's threads included, and that thread does not exist in the
/// child. The parent's copy is left alone (leaked) in the child.
pub(crate) struct PerProcess<T> {
    current: AtomicPtr<(u32, T)>,
    init: fn() -> T,
}

impl<T: Sync> PerProcess<T> {
    pub(crate) const fn new(init: fn() -> T) -> Self {
        PerProcess {
            current: AtomicPtr::new(std::ptr::null_mut()),
            init,
        }
    }

    /// This process's state.
    pub(crate) fn get(&self) -> &T {
        let pid = std::process::id();
        loop {
            let current = self.current.load(Ordering::Acquire);
            // SAFETY: a published state is never freed (see below).
            if let Some((owner, state)) = unsafe { current.as_ref() }
                && *owner == pid
            {
                return state;
            }
            let fresh = Box::into_raw(Box::new((pid, (self.init)())));
            match self
                .current
                .compare_exchange(current, fresh, Ordering::AcqRel, Ordering::Acquire)
            {
                // The state replaced, if any, was the parent's: it stays allocated, so a
                // reference the parent's threads held before `fork` can never dangle.
                // SAFETY: just published, and never freed.
                Ok(_) => return unsafe { &(*fresh).1 },
                // Another thread of this process published first; this one was never
                // shared.
                // SAFETY: `fresh` came from `Box::into_raw` above.
                Err(_) => drop(unsafe { Box::from_raw(fresh) }),
            }
        }
    }
}

/// The profiler of this process: the running session's lease, if any, and the
/// notification of its release.
struct Profiler {
    running: Mutex<Option<Running>>,
    /// Notified every time the profiler is freed, for requests waiting on it.
    released: Notify,
}

/// Process-wide: there is one `SIGPROF` disposition per process, whatever the number of
/// routers.
static PROFILER: PerProcess<Profiler> = PerProcess::new(|| Profiler {
    running: Mutex::new(None),
    released: Notify::new(),
});

fn running() -> std::sync::MutexGuard<'static, Option<Running>> {
    PROFILER
        .get()
        .running
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

/// Notified every time the profiler is freed.
pub(crate) fn released() -> &'static Notify {
    &PROFILER.get().released
}

struct Running {
    ends_at: Instant,
    /// Notified by a `?force=true` request: the running profile stops early.
    stop_early: Arc<Notify>,
    /// Started by a `?force=true` request.
    forced: bool,
    /// Its last window has closed and the sampler is stopping: a request waits for it
    /// rather than being refused.
    ending: bool,
}

/// Why the profiler could not be taken: the running profile's end, its early-stop switch,
/// and whether a forced request started it.
struct Taken {
    busy: CpuError,
    stop_early: Arc<Notify>,
    forced: bool,
    ending: bool,
}

/// Holds the process's CPU profiler for one session (one request, with the `pprof`
/// crate's sampler); dropping it frees the profiler, so a client that hangs up (axum
/// drops the handler future) frees it at once.
pub(crate) struct CpuLease {
    /// Notified when a forced request stops the session. This crate's sampler stops its
    /// windows itself (`linux.rs`); the `pprof` crate's request waits on this.
    #[cfg_attr(not(pprof_rs), allow(dead_code))]
    stop_early: Arc<Notify>,
}

impl CpuLease {
    fn try_acquire(duration: Duration, forced: bool) -> Result<CpuLease, Taken> {
        let mut running = running();
        let now = Instant::now();
        if let Some(current) = running.as_ref() {
            let busy = CpuError::Busy {
                retry_after: current.ends_at.saturating_duration_since(now),
            };
            return Err(Taken {
                busy,
                stop_early: current.stop_early.clone(),
                forced: current.forced,
                ending: current.ending,
            });
        }
        let stop_early = Arc::new(Notify::new());
        *running = Some(Running {
            ends_at: now + duration,
            stop_early: stop_early.clone(),
            forced,
            ending: false,
        });
        Ok(CpuLease { stop_early })
    }

    /// Takes the profiler. With `force`, a running profile is asked to stop early (its
    /// caller still gets what it sampled) and this request waits for it to let go; but
    /// a profile that was itself forced is not stopped (`ForcedRunning`). Forcing takes
    /// the profiler from a scraper; two people forcing at once would otherwise cut each
    /// other's profiles to nothing, in an order set by the network. So of two forced
    /// requests, whichever takes the profiler first runs its whole window.
    pub(crate) async fn acquire(duration: Duration, force: bool) -> Result<CpuLease, CpuError> {
        let deadline = tokio::time::Instant::now() + FORCE_WAIT;
        loop {
            let released = released().notified();
            tokio::pin!(released);
            // Registered before looking, so a release in between is not missed.
            released.as_mut().enable();
            match CpuLease::try_acquire(duration, force) {
                Ok(lease) => return Ok(lease),
                Err(Taken { ending: true, .. }) => {
                    if tokio::time::timeout_at(deadline, released).await.is_err() {
                        return Err(CpuError::Failed(
                            "the last CPU profile's sampler did not stop".into(),
                        ));
                    }
                }
                Err(taken) if !force => return Err(taken.busy),
                Err(Taken {
                    busy: CpuError::Busy { retry_after },
                    forced: true,
                    ..
                }) => return Err(CpuError::ForcedRunning { retry_after }),
                Err(Taken { stop_early, .. }) => {
                    stop_early.notify_one();
                    if tokio::time::timeout_at(deadline, released).await.is_err() {
                        return Err(CpuError::Failed(
                            "the running CPU profile did not stop when asked to".into(),
                        ));
                    }
                }
            }
        }
    }
}

impl CpuLease {
    /// The session now runs until `ends_at` at least (a window joined it).
    #[cfg(sampler)]
    pub(crate) fn extend(&self, ends_at: Instant) {
        if let Some(running) = running().as_mut() {
            running.ends_at = running.ends_at.max(ends_at);
        }
    }

    /// The session's last window has closed: requests wait for the sampler to stop
    /// instead of getting 409.
    #[cfg(sampler)]
    pub(crate) fn ending(&self) {
        if let Some(running) = running().as_mut() {
            running.ending = true;
        }
    }
}

/// How long a `?force=true` request waits for the running profile to stop: it stops at
/// its next scheduling point, then needs the blocking pool to stop the sampler.
const FORCE_WAIT: Duration = Duration::from_secs(10);

impl Drop for CpuLease {
    fn drop(&mut self) {
        *running() = None;
        released().notify_waiters();
    }
}

/// Runs `f` on the blocking pool; a panic inside becomes a `Failed` error, never a crash.
#[cfg(any(sampler, pprof_rs))]
async fn blocking<T, F>(f: F) -> Result<T, CpuError>
where
    F: FnOnce() -> Result<T, CpuError> + Send + 'static,
    T: Send + 'static,
{
    crate::on_blocking_pool(f, CpuError::Failed).await
}

/// What a request holds while the `pprof` crate's sampler (`S`) runs. If the request is dropped (the client hung up), the sampler is stopped and freed
/// on the blocking pool (stopping deletes timers or restores the signal disposition,
/// waits for handlers, frees buffers: no work for an async worker), and only then is the
/// lease freed, so the next request never finds the sampler still stopping. A request
/// that finishes takes both out first.
#[cfg(pprof_rs)]
struct Hold<S: Send + 'static> {
    sampler: Option<S>,
    lease: Option<CpuLease>,
}

#[cfg(pprof_rs)]
impl<S: Send + 'static> Drop for Hold<S> {
    fn drop(&mut self) {
        let (sampler, lease) = (self.sampler.take(), self.lease.take());
        if sampler.is_none() && lease.is_none() {
            return;
        }
        // A tuple drops its fields in order: the sampler stops before the lease frees.
        drop_off_the_async_worker((sampler, lease));
    }
}

/// Drops `value` on the blocking pool (stopping a sampler deletes timers, waits for
/// handlers, frees buffers: no work for an async worker), or here when there is no
/// runtime.
#[cfg(any(sampler, pprof_rs))]
fn drop_off_the_async_worker<T: Send + 'static>(value: T) {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => drop(runtime.spawn_blocking(move || drop(value))),
        Err(_) => drop(value),
    }
}

#[cfg(sampler)]
mod linux;
#[cfg(sampler)]
pub(crate) use linux::{stack_frames, take_thread_dump};
#[cfg(sampler)]
pub(crate) use sampler::{MAX_DUMP_THREADS, Stack as ThreadStack};
#[cfg(sampler)]
pub(crate) use timers::thread_cpu_time;
#[cfg(pprof_rs)]
pub(crate) mod pprof_rs;

/// Takes one CPU profile with this crate's sampler (or the `pprof` crate's, when the tests
/// chose it) and hands it to `render` on the blocking pool.
#[cfg(sampler)]
pub(crate) async fn profile<R, F>(request: CpuRequest, render: F) -> Result<R, CpuError>
where
    F: FnOnce(Profile) -> Result<R, CpuError> + Send + 'static,
    R: Send + 'static,
{
    #[cfg(pprof_rs)]
    if pprof_rs::chosen() {
        return pprof_rs::profile(request, render).await;
    }
    linux::profile(request, render).await
}

#[cfg(all(pprof_rs, not(sampler)))]
pub(crate) use pprof_rs::profile;

/// Without a sampler for this target, every request is a 503.
#[cfg(not(any(sampler, pprof_rs)))]
pub(crate) async fn profile<R, F>(_request: CpuRequest, _render: F) -> Result<R, CpuError>
where
    F: FnOnce(Profile) -> Result<R, CpuError> + Send + 'static,
    R: Send + 'static,
{
    Err(CpuError::Unavailable(UNAVAILABLE.unwrap_or(
        "CPU profiling is not available on this platform",
    )))
}

#[cfg(all(test, sampler))]
mod tests {
    use std::sync::PoisonError;
    use std::time::Duration;

    use super::sampler::tests::{ONE_SAMPLER, TORN_DOWN_ON};
    use super::{CpuLease, CpuRequest, profile};

    #[tokio::test]
    #[expect(
        clippy::await_holding_lock,
        reason = "serialises with the synchronous sampler tests; this runtime has one task"
    )]
    async fn a_cancelled_profile_is_torn_down_off_the_async_worker() {
        let _one = ONE_SAMPLER.lock().unwrap_or_else(PoisonError::into_inner);
        let worker = std::thread::current().id();
        *TORN_DOWN_ON.lock().unwrap() = None;
        let request = CpuRequest {
            duration: Duration::from_secs(10),
            frequency: 99,
            blocklist: &[],
            force: false,
            max_windows: 1,
            symbolize: crate::profile::Symbolize::Full,
        };
        // The client hangs up 300 ms into its 10 s window: the request's future is dropped.
        let cancelled =
            tokio::time::timeout(Duration::from_millis(300), profile(request, Ok)).await;
        assert!(cancelled.is_err(), "the profile was still running");
        // The profiler is free once the sampler is gone.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while CpuLease::try_acquire(Duration::from_secs(1), false).is_err() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the profiler was freed"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let torn_down_on = TORN_DOWN_ON
            .lock()
            .unwrap()
            .expect("the session was torn down");
        assert_ne!(
            torn_down_on, worker,
            "stopping the sampler (timers, dlclose, freeing) ran on the async worker"
        );
    }
}
