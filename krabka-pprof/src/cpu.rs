//! CPU profiles: one sampler session at a time in a process, whichever sampler runs it:
//! the lease (an RAII guard the session owns: 409, `force=true`, freed when its last
//! request ends or hangs up), what a request asks for and how it fails, and the choice of
//! sampler. With this crate's sampler (`crate::sampler`) several requests share a session,
//! each with its own *window* (`cpu/sessions.rs`), and what a window collected becomes its
//! profile in `cpu/report.rs`; the `pprof` crate's sampler (`cpu/pprof_rs.rs`) serves one
//! request per session. Everything that can take more than microseconds runs on the
//! blocking pool.
//!
//! The recorder (`cpu/recent.rs`) is one more, always-on window of the same sessions, for
//! `/recent`'s profiles of the past.
//!
//! Names: a *lease* is a session's hold on the profiler; a *slot* is the sampler's
//! scratch memory for one signal handler; a *session* is one start-to-stop run of the
//! sampler; a *window* is one request's part of a session, from its arrival for its
//! `seconds`.

// Without a sampler every request is a 503: the busy state goes unused there.
#![cfg_attr(not(any(sampler, pprof_rs)), allow(dead_code))]

#[cfg(sampler)]
mod drainer;
mod lease;
#[cfg(pprof_rs)]
pub(crate) mod pprof_rs;
#[cfg(sampler)]
mod recent;
#[cfg(sampler)]
mod report;
mod request;
#[cfg(sampler)]
mod sessions;

use std::time::Instant;

pub(crate) use request::{
    CpuError, CpuRequest, RecentError, RecentRequest, Recorded, RecorderSettings, RecorderStatus,
    Split, Status, UNAVAILABLE,
};

// The `pprof` crate's profile() names it itself where it is the only sampler.
use crate::profile::Profile;

/// The running CPU profile session of this process, if any.
pub(crate) fn status() -> Option<Status> {
    #[cfg(sampler)]
    if shares_windows() {
        return sessions::status();
    }
    lease::running_until().map(|(ends_at, sampling)| Status {
        frequency: None,
        windows: usize::from(sampling),
        ends_in: ends_at.saturating_duration_since(Instant::now()),
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
    sessions::profile(request, render).await
}

#[cfg(all(pprof_rs, not(sampler)))]
pub(crate) use pprof_rs::profile;

/// One window of this crate's sampler, for a profile built from what it collected by
/// another kind (the wall-clock profile's running part): see [`sessions::window`].
#[cfg(sampler)]
pub(crate) use sessions::{Closed, window};

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

/// Why the recorder cannot run in this process, if it cannot: it needs this crate's own
/// sampler, whose sessions it shares.
pub(crate) fn recorder_unavailable() -> Option<&'static str> {
    if shares_windows() {
        None
    } else if cfg!(any(sampler, pprof_rs)) {
        Some(
            "the recorder needs krabka-pprof's own CPU sampler (Linux on x86_64 and aarch64); \
             this process takes CPU profiles with the pprof crate's, one at a time: take \
             /profile?seconds=N instead",
        )
    } else {
        Some(
            "the recorder needs krabka-pprof's own CPU sampler, which runs on Linux on x86_64 \
             and aarch64 only",
        )
    }
}

/// Starts this process's recorder with `settings`, where it can run and none runs yet.
pub(crate) fn start_recorder(settings: RecorderSettings) {
    #[cfg(sampler)]
    if recorder_unavailable().is_none() {
        recent::start(settings);
    }
    #[cfg(not(sampler))]
    let _ = settings;
}

/// The window `from .. to` of the recorder's history as the pusher takes it, built on
/// the calling thread (the pusher's own); `None` while it is not complete, or where no
/// recorder runs. See `recent::window`.
#[cfg_attr(not(feature = "push"), allow(dead_code))]
pub(crate) fn recorded_window(
    after: Option<std::time::SystemTime>,
    from: std::time::SystemTime,
    to: std::time::SystemTime,
) -> Option<Recorded> {
    #[cfg(sampler)]
    return recent::window(after, from, to);
    #[cfg(not(sampler))]
    {
        let _ = (after, from, to);
        None
    }
}

/// Profiling was switched off: the recorder, if one runs, stops sampling; returns once it
/// has (at most a second).
pub(crate) fn recorder_switched_off() {
    #[cfg(sampler)]
    recent::switched_off();
}

/// The recorder, if one runs in this process.
pub(crate) fn recorder_status() -> Option<RecorderStatus> {
    #[cfg(sampler)]
    return recent::status();
    #[cfg(not(sampler))]
    None
}

/// The CPU profile of a window of the past, from the recorder (started with `settings`
/// if it does not run yet), handed to `render` on the blocking pool.
pub(crate) async fn recent_profile<R, F>(
    settings: RecorderSettings,
    request: RecentRequest,
    render: F,
) -> Result<R, RecentError>
where
    F: FnOnce(Profile) -> Result<R, RecentError> + Send + 'static,
    R: Send + 'static,
{
    if let Some(why) = recorder_unavailable() {
        return Err(RecentError::Unavailable(why));
    }
    #[cfg(sampler)]
    return recent::profile(settings, request, render).await;
    #[cfg(not(sampler))]
    {
        let _ = (settings, request, render);
        unreachable!("no sampler shares windows here")
    }
}

#[cfg(test)]
#[cfg(sampler)]
mod tests {
    use std::sync::PoisonError;
    use std::time::Duration;

    use super::lease::CpuLease;
    use super::{CpuRequest, profile};
    use crate::sampler::tests::{ONE_SAMPLER, TORN_DOWN_ON};

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
            symbolize: crate::symbolize::Symbolize::Full,
            split: Default::default(),
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
