//! The lease: one sampler session at a time in a process, whichever sampler runs it. A
//! session owns an RAII guard ([`CpuLease`]); a request that finds the profiler held gets
//! 409, or with `force=true` asks the holder to stop early; the lease is freed when the
//! session's last request ends or hangs up. Also how a session's sampler is dropped off
//! the async workers.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::request::CpuError;
use crate::process::PerProcess;

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
    /// The sampler runs (set by `CpuLease::sampling`): until then the index page shows
    /// the profile as starting, with no window open yet.
    sampling: bool,
}

/// Who holds the profiler, when a request could not take it: the running profile's end,
/// its early-stop switch, and whether a forced request started it.
pub(super) struct Occupied {
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
    /// windows itself (`sessions.rs`); the `pprof` crate's request waits on this.
    #[cfg_attr(not(pprof_rs), allow(dead_code))]
    pub(super) stop_early: Arc<Notify>,
}

impl CpuLease {
    pub(super) fn try_acquire(duration: Duration, forced: bool) -> Result<CpuLease, Occupied> {
        let mut running = running();
        let now = Instant::now();
        if let Some(current) = running.as_ref() {
            let busy = CpuError::Busy {
                retry_after: current.ends_at.saturating_duration_since(now),
            };
            return Err(Occupied {
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
            sampling: false,
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
                Err(Occupied { ending: true, .. }) => {
                    if tokio::time::timeout_at(deadline, released).await.is_err() {
                        return Err(CpuError::Failed(
                            "the last CPU profile's sampler did not stop".into(),
                        ));
                    }
                }
                Err(taken) if !force => return Err(taken.busy),
                Err(Occupied {
                    busy: CpuError::Busy { retry_after },
                    forced: true,
                    ..
                }) => return Err(CpuError::ForcedRunning { retry_after }),
                Err(Occupied { stop_early, .. }) => {
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

    /// The `pprof` crate's sampler has started, for `duration`: its window is open from
    /// now (the index page shows it from here, ending when it will).
    #[cfg(pprof_rs)]
    pub(crate) fn sampling(&self, duration: Duration) {
        if let Some(running) = running().as_mut() {
            running.sampling = true;
            running.ends_at = Instant::now() + duration;
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
pub(crate) const FORCE_WAIT: Duration = Duration::from_secs(10);

impl Drop for CpuLease {
    fn drop(&mut self) {
        *running() = None;
        released().notify_waiters();
    }
}

/// Runs `f` on the blocking pool; a panic inside becomes a `Failed` error, never a crash.
#[cfg(any(sampler, pprof_rs))]
pub(crate) async fn blocking<T, F>(f: F) -> Result<T, CpuError>
where
    F: FnOnce() -> Result<T, CpuError> + Send + 'static,
    T: Send + 'static,
{
    crate::offload::on_blocking_pool(f, CpuError::Failed).await
}

/// Drops `value` on the blocking pool (stopping a sampler deletes timers, waits for
/// handlers, frees buffers: no work for an async worker), or here when there is no
/// runtime.
#[cfg(any(sampler, pprof_rs))]
pub(crate) fn drop_off_the_async_worker<T: Send + 'static>(value: T) {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => drop(runtime.spawn_blocking(move || drop(value))),
        Err(_) => drop(value),
    }
}

/// Until when the profiler is held, if it is, and whether its sampler runs yet (the
/// `pprof` crate's starts on the blocking pool after the lease is taken).
pub(super) fn running_until() -> Option<(Instant, bool)> {
    running()
        .as_ref()
        .map(|running| (running.ends_at, running.sampling))
}
