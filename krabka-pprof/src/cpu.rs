//! One CPU profiling session at a time: the busy slot (an RAII guard owned by the
//! request), starting the sampler, waiting, stopping, and building the pprof `Profile`.
//! Everything that can take more than microseconds runs on the blocking pool.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

pub(crate) use pprof::protos::Profile;

/// What one request asks of the CPU profiler, after defaults and clamping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CpuRequest {
    pub(crate) duration: Duration,
    pub(crate) frequency: u32,
    pub(crate) blocklist: &'static [&'static str],
}

/// Why a CPU profile could not be produced.
#[derive(Debug)]
pub(crate) enum CpuError {
    /// Another profile is running; it ends in `retry_after`.
    Busy { retry_after: Duration },
    /// The profiler itself failed.
    Failed(String),
}

/// The end of the running profile's window, if one is running. Process-wide: there is one
/// `SIGPROF` timer per process, whatever the number of routers.
static RUNNING: Mutex<Option<Instant>> = Mutex::new(None);

/// Holds the process's CPU profiler for one request; dropping it frees the profiler, so
/// a client that hangs up (axum drops the handler future) frees it at once.
pub(crate) struct CpuSlot(());

impl CpuSlot {
    pub(crate) fn try_acquire(duration: Duration) -> Result<CpuSlot, CpuError> {
        let mut running = RUNNING.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        if let Some(ends_at) = *running {
            return Err(CpuError::Busy {
                retry_after: ends_at.saturating_duration_since(now),
            });
        }
        *running = Some(now + duration);
        Ok(CpuSlot(()))
    }
}

impl Drop for CpuSlot {
    fn drop(&mut self) {
        *RUNNING.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }
}

/// A running sampler. Dropping it stops sampling; the (slow) teardown is moved off the
/// async workers when a runtime is around.
struct Session {
    guard: Option<pprof::ProfilerGuard<'static>>,
}

impl Session {
    fn start(request: CpuRequest) -> Result<Session, CpuError> {
        let guard = pprof::ProfilerGuardBuilder::default()
            .frequency(request.frequency as i32)
            .blocklist(request.blocklist)
            .build()
            .map_err(|e| CpuError::Failed(format!("could not start the CPU profiler: {e}")))?;
        Ok(Session { guard: Some(guard) })
    }

    fn finish(mut self) -> Result<Profile, CpuError> {
        let guard = self.guard.take().expect("a session is finished once");
        let report = guard
            .report()
            .build()
            .map_err(|e| CpuError::Failed(format!("could not build the CPU report: {e}")))?;
        drop(guard);
        report
            .pprof()
            .map_err(|e| CpuError::Failed(format!("could not encode the CPU report: {e}")))
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if let Some(guard) = self.guard.take() {
            match tokio::runtime::Handle::try_current() {
                Ok(handle) => drop(handle.spawn_blocking(move || drop(guard))),
                Err(_) => drop(guard),
            }
        }
    }
}

/// Runs `f` on the blocking pool; a panic inside becomes a `Failed` error, never a crash.
pub(crate) async fn blocking<T, F>(f: F) -> Result<T, CpuError>
where
    F: FnOnce() -> Result<T, CpuError> + Send + 'static,
    T: Send + 'static,
{
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|join| {
        Err(CpuError::Failed(format!(
            "the profiler task failed: {join}"
        )))
    })
}

/// Takes one CPU profile and hands it to `render` on the blocking pool.
pub(crate) async fn profile<R, F>(request: CpuRequest, render: F) -> Result<R, CpuError>
where
    F: FnOnce(Profile) -> Result<R, CpuError> + Send + 'static,
    R: Send + 'static,
{
    let slot = CpuSlot::try_acquire(request.duration)?;
    let session = blocking(move || Session::start(request)).await?;
    tokio::time::sleep(request.duration).await;
    blocking(move || {
        let profile = session.finish();
        drop(slot);
        render(profile?)
    })
    .await
}
