//! The request side of this crate's own sampler (Linux on x86_64 and aarch64): requests
//! share one [`Sampler`](sampler::Sampler) session, each with a *window* of its own (from
//! its arrival, for its `seconds`) that gets exactly the samples taken while it was open.
//! The session starts with its first window and stops, on the blocking pool, when its
//! last one closes or hangs up. What a window collected becomes the pprof `Profile`, with
//! the markers and comments that say what the profile cannot show.
//!
//! A request at another frequency than the running session's gets 409 (or, with
//! `force=true`, closes every window early and starts its own session); past
//! `max_windows` windows, 409 too.
//!
//! The recorder (`cpu/recent.rs`) *sits* on a session rather than opening a request's
//! window: it counts for neither `max_windows` nor the refusals, the session lasts while
//! it sits, and it is asked to leave when a request needs the sampler at another
//! frequency while no other window is open (the request then waits for the session to
//! end and starts its own) or when `force=true` takes the sampler. It sits again once the
//! sampler is free, or on any session at its own frequency; until then every request it
//! yielded to is owed the sampler, so it never takes it back in between.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::drainer::Drainer;
use super::lease::{CpuLease, FORCE_WAIT, blocking, drop_off_the_async_worker, released};
use super::report::{log_report, report_profile};
use super::request::{CpuError, CpuRequest, Status};
use crate::process::PerProcess;
use crate::profile::Profile;
use crate::sampler::{DRAIN_EVERY, Sampler, StartError};

/// Windows at least this long symbolize what they have gathered before they end (see
/// [`profile`]); shorter ones hold too little to gain from it.
const EARLY_SYMBOLS_FROM: Duration = Duration::from_secs(2);

/// This process's sessions (a child made by `fork` starts with none; see [`PerProcess`]).
struct Sessions {
    /// The session windows join, if one runs. Never held across an await: a window that
    /// leaves (also from a `Drop`, also while its runtime shuts down) takes it at once.
    shared: Mutex<Option<Arc<Shared>>>,
    /// Held by the request that starts a session, until the session is in `shared`: two
    /// requests never start two sessions, and a request that arrives meanwhile joins.
    starting: tokio::sync::Mutex<()>,
    /// Requests the recorder left a session for that have not started theirs yet: while
    /// any is owed, the recorder does not start a session of its own.
    owed: AtomicUsize,
}

static SESSIONS: PerProcess<Sessions> = PerProcess::new(|| Sessions {
    shared: Mutex::new(None),
    starting: tokio::sync::Mutex::const_new(()),
    owed: AtomicUsize::new(0),
});

fn shared_slot() -> std::sync::MutexGuard<'static, Option<Arc<Shared>>> {
    SESSIONS
        .get()
        .shared
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

/// One running session: its drain thread, its sampler, the windows open on it, and the
/// lease. Fields drop in order: the drains have stopped before the sampler stops, and the
/// sampler has stopped before the lease frees the profiler.
struct Shared {
    drainer: Drainer,
    sampler: Sampler,
    windows: Mutex<Windows>,
    lease: CpuLease,
}

#[derive(Default)]
struct Windows {
    open: Vec<Window>,
    /// No window may join: the last one closed, or a forced request is taking over.
    closing: bool,
    /// The recorder, while it sits on this session.
    recorder: Option<Seat>,
}

/// Why the recorder was asked to leave its session, for what `/recent` says of the gap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Leaving {
    /// A request needed the sampler at this frequency.
    OtherFrequency(u32),
    /// A request with `force=true` took the sampler.
    Forced,
}

/// How a session asks the recorder sitting on it to leave: it must not block (it runs
/// under the session's lock).
pub(super) type AskToLeave = Arc<dyn Fn(Leaving) + Send + Sync>;

/// The recorder's place on a session.
struct Seat {
    ask: AskToLeave,
    /// Asked already: a request that comes after waits as the first one does.
    asked: bool,
}

impl Windows {
    /// Asks the recorder, if it sits here, to leave; whether it sits here.
    fn ask_recorder(&mut self, why: Leaving) -> bool {
        let Some(seat) = self.recorder.as_mut() else {
            return false;
        };
        if !seat.asked {
            seat.asked = true;
            (seat.ask)(why);
        }
        true
    }
}

/// One open window, as other requests see it.
struct Window {
    id: u64,
    ends_at: Instant,
    stop_early: Arc<Notify>,
    forced: bool,
    /// The most windows open at once while this one was.
    shared_with: usize,
}

impl Shared {
    /// Registers a window for `request`, or says why not; decided under one lock, so a
    /// window leaving meanwhile cannot turn "closing, wait" into a refusal.
    fn join(&self, request: &CpuRequest, id: u64) -> Verdict {
        let mut windows = self.windows.lock().unwrap_or_else(PoisonError::into_inner);
        if windows.closing {
            return Verdict::Closing;
        }
        if windows.open.is_empty()
            && request.frequency != self.sampler.frequency()
            && windows.ask_recorder(Leaving::OtherFrequency(request.frequency))
        {
            // Only the recorder samples: it yields, and this request starts a session of
            // its own once this one has ended. No one joins meanwhile.
            windows.closing = true;
            return Verdict::Yielded(Owed::new());
        }
        if let Some(refusal) = refusal(&windows, self.sampler.frequency(), request) {
            return Verdict::Refused(refusal);
        }
        let ends_at = Instant::now() + request.duration;
        let stop_early = Arc::new(Notify::new());
        windows.open.push(Window {
            id,
            ends_at,
            stop_early: stop_early.clone(),
            forced: request.force,
            shared_with: 0,
        });
        let count = windows.open.len();
        for window in &mut windows.open {
            window.shared_with = window.shared_with.max(count);
        }
        drop(windows);
        self.lease.extend(ends_at);
        Verdict::Joined(stop_early)
    }

    /// Removes a window; returns how many windows shared the session while it was open,
    /// and whether it was the last (then the session is closing).
    fn leave(&self, id: u64) -> (usize, bool) {
        let mut windows = self.windows.lock().unwrap_or_else(PoisonError::into_inner);
        let shared_with = windows
            .open
            .iter()
            .position(|w| w.id == id)
            .map_or(1, |at| windows.open.swap_remove(at).shared_with);
        let last = windows.open.is_empty() && windows.recorder.is_none();
        if last {
            windows.closing = true;
            self.lease.ending();
        }
        (shared_with, last)
    }

    /// Closes every window early (`force=true`): each caller gets what its window had;
    /// the recorder is asked to leave. Returns how many windows were open.
    fn close_all(&self) -> usize {
        let mut windows = self.windows.lock().unwrap_or_else(PoisonError::into_inner);
        windows.closing = true;
        for window in &windows.open {
            window.stop_early.notify_one();
        }
        windows.ask_recorder(Leaving::Forced);
        windows.open.len()
    }

    /// Seats the recorder, unless the session is ending or runs at another frequency.
    fn seat(&self, frequency: u32, ask: AskToLeave) -> bool {
        let mut windows = self.windows.lock().unwrap_or_else(PoisonError::into_inner);
        if windows.closing || windows.recorder.is_some() || self.sampler.frequency() != frequency {
            return false;
        }
        windows.recorder = Some(Seat { ask, asked: false });
        true
    }

    /// The recorder leaves; whether it was the last (then the session is closing).
    fn unseat(&self) -> bool {
        let mut windows = self.windows.lock().unwrap_or_else(PoisonError::into_inner);
        windows.recorder = None;
        let last = windows.open.is_empty();
        if last {
            windows.closing = true;
            self.lease.ending();
        }
        last
    }

    /// Whether window `id` is still open (it has not left).
    fn is_open(&self, id: u64) -> bool {
        self.windows
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .open
            .iter()
            .any(|w| w.id == id)
    }
}

/// What [`Shared::join`] decided.
enum Verdict {
    Joined(Arc<Notify>),
    /// The session is ending (or being taken over): wait for it.
    Closing,
    /// The recorder alone sampled, at another frequency: it is leaving, and the session
    /// ends with it. Wait for that, then start.
    Yielded(Owed),
    Refused(CpuError),
}

/// A request the recorder yielded to, until it has started its own session (or given
/// up): meanwhile the recorder does not start one.
struct Owed;

impl Owed {
    fn new() -> Owed {
        SESSIONS.get().owed.fetch_add(1, Ordering::SeqCst);
        Owed
    }
}

impl Drop for Owed {
    fn drop(&mut self) {
        SESSIONS.get().owed.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Why `request` cannot join a session running at `frequency` with these windows, if it
/// cannot: another frequency, or no room.
fn refusal(windows: &Windows, frequency: u32, request: &CpuRequest) -> Option<CpuError> {
    let now = Instant::now();
    let last_end = windows.open.iter().map(|w| w.ends_at).max().unwrap_or(now);
    if windows.open.iter().any(|w| w.forced) && request.force {
        let other =
            request.frequency != frequency || windows.open.len() >= request.max_windows as usize;
        if other {
            return Some(CpuError::ForcedRunning {
                retry_after: last_end.saturating_duration_since(now),
            });
        }
    }
    if request.frequency != frequency {
        return Some(CpuError::OtherFrequency {
            running: frequency,
            retry_after: last_end.saturating_duration_since(now),
        });
    }
    if windows.open.len() >= request.max_windows as usize {
        let first_end = windows.open.iter().map(|w| w.ends_at).min().unwrap_or(now);
        return Some(CpuError::Full {
            max_windows: request.max_windows,
            retry_after: first_end.saturating_duration_since(now),
        });
    }
    None
}

/// Forgets a session whose last window has left, so the next request starts a new one.
/// Whoever drops the last reference then stops the sampler and frees the lease.
fn forget_session(shared: &Arc<Shared>) {
    let mut slot = shared_slot();
    if slot.as_ref().is_some_and(|s| Arc::ptr_eq(s, shared)) {
        *slot = None;
    }
}

/// A request's window while it runs. If the request is dropped (the client hung up), the
/// window leaves the session on the blocking pool, ending the session if it was the last.
struct WindowGuard {
    shared: Option<Arc<Shared>>,
    id: u64,
}

impl Drop for WindowGuard {
    fn drop(&mut self) {
        let Some(shared) = self.shared.take() else {
            return;
        };
        // Leaving takes short locks, done here so that it happens even while the runtime
        // shuts down; stopping the sampler (if this was the last reference) goes to the
        // blocking pool, or happens here if there is none. Leave, then forget: a window
        // still being opened on the blocking pool either sees it left and forgets itself,
        // or was opened before and is forgotten here.
        let last = shared.leave(self.id).1;
        shared.sampler.forget_window(self.id);
        if last {
            forget_session(&shared);
        }
        drop_off_the_async_worker(shared);
    }
}

/// What [`sit`] found.
pub(super) enum Sit {
    /// Sitting on a session at the recorder's frequency (its own, or a running one).
    Seated(Sitting),
    /// The sampler is another's for now (another frequency, a session starting or
    /// ending, a request the recorder yielded to): look again later.
    Busy,
    /// The sampler could not start; the error says why.
    Failed(CpuError),
}

/// The recorder on a session, until dropped: then it leaves, and the session stops if no
/// window is open. Dropped on the recorder's own thread, which may stop the sampler.
pub(super) struct Sitting {
    shared: Arc<Shared>,
}

impl Sitting {
    pub(super) fn sampler(&self) -> &Sampler {
        &self.shared.sampler
    }
}

impl Drop for Sitting {
    fn drop(&mut self) {
        if self.shared.unseat() {
            forget_session(&self.shared);
        }
    }
}

/// Seats the recorder (`frequency`, `blocklist`) on the running session if it runs at
/// that frequency, or on a session of its own if none runs and none is owed to a request
/// it yielded to; `ask` is how the session will ask it to leave. Never waits: called from
/// the recorder's thread every tick until it sits.
pub(super) fn sit(frequency: u32, blocklist: &'static [&'static str], ask: AskToLeave) -> Sit {
    if let Some(running) = shared_slot().as_ref() {
        return if running.seat(frequency, ask) {
            Sit::Seated(Sitting {
                shared: running.clone(),
            })
        } else {
            Sit::Busy
        };
    }
    if SESSIONS.get().owed.load(Ordering::SeqCst) > 0 {
        return Sit::Busy;
    }
    // A request that starts a session holds `starting` until the session is published.
    let Ok(starting) = SESSIONS.get().starting.try_lock() else {
        return Sit::Busy;
    };
    if shared_slot().is_some() {
        return Sit::Busy;
    }
    let Ok(lease) = CpuLease::try_acquire(DRAIN_EVERY, false) else {
        // The last session's sampler is still stopping.
        return Sit::Busy;
    };
    let started = match start(frequency, blocklist) {
        Ok(sampler) => Started::new(sampler, lease),
        Err(CpuError::Busy { .. }) => return Sit::Busy,
        Err(error) => return Sit::Failed(error),
    };
    let shared = match started {
        Ok(started) => started.into_session(),
        Err(error) => return Sit::Failed(error),
    };
    let seated = shared.seat(frequency, ask);
    debug_assert!(seated, "a new session at the recorder's frequency seats it");
    *shared_slot() = Some(shared.clone());
    drop(starting);
    Sit::Seated(Sitting { shared })
}

/// The running session, if any: its frequency, its open windows, the latest end.
pub(crate) fn status() -> Option<Status> {
    let slot = shared_slot();
    let shared = slot.as_ref()?;
    let windows = shared
        .windows
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    let last_end = windows.open.iter().map(|w| w.ends_at).max()?;
    Some(Status {
        frequency: Some(shared.sampler.frequency()),
        windows: windows.open.len(),
        ends_in: last_end.saturating_duration_since(Instant::now()),
    })
}

/// What a request does about the running session.
enum Next {
    Joined(Arc<Shared>, Arc<Notify>),
    /// Wait for the session (at this frequency) to end, then look again.
    Wait(u32),
    /// Close the running windows early and start a session of this request's own.
    TakeOver,
    Start,
}

/// A freshly started sampler, its drain thread and its lease, on their way from the
/// blocking pool to the request. Dropped on an async worker (the request went away after
/// the start finished), it sends them back to the blocking pool, the drainer first.
struct Started(Option<(Drainer, Sampler, CpuLease)>);

impl Started {
    /// With a drain thread of its own; without one (the process may start no thread), the
    /// sampler stops and the error says why.
    fn new(sampler: Sampler, lease: CpuLease) -> Result<Started, CpuError> {
        match Drainer::spawn() {
            Ok(drainer) => Ok(Started(Some((drainer, sampler, lease)))),
            Err(error) => {
                lease.ending();
                drop_off_the_async_worker((sampler, lease));
                Err(CpuError::Failed(format!(
                    "the profiler could not start its drain thread: {error}"
                )))
            }
        }
    }

    fn into_session(mut self) -> Arc<Shared> {
        let (drainer, sampler, lease) = self.0.take().expect("taken once");
        let shared = Arc::new(Shared {
            drainer,
            sampler,
            windows: Mutex::new(Windows::default()),
            lease,
        });
        // The thread holds the session only while it drains: the last window's leave
        // still stops the sampler.
        let session = Arc::downgrade(&shared);
        let drain = Box::new(move || Some(session.upgrade()?.sampler.drain()));
        shared.drainer.serve(drain);
        shared
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        let Some(parts) = self.0.take() else {
            return;
        };
        // Requests wait for it rather than being refused meanwhile.
        parts.2.ending();
        // The drainer ends, then the sampler stops, then the lease frees (a tuple drops
        // in order).
        drop_off_the_async_worker(parts);
    }
}

/// Starts a session's sampler (on the blocking pool).
fn start(frequency: u32, blocklist: &'static [&'static str]) -> Result<Sampler, CpuError> {
    Sampler::start(frequency, blocklist).map_err(|err| match err {
        // A cancelled request's sampler may still be stopping.
        StartError::Running => CpuError::Busy {
            retry_after: Duration::from_secs(1),
        },
        StartError::ForeignHandler => CpuError::Unavailable(
            "another SIGPROF handler is installed in this process (another profiler?); \
             stop it, or remove it, to take CPU profiles here",
        ),
        StartError::System(call, error) => CpuError::Failed(format!("{call} failed: {error}")),
    })
}

/// Takes one CPU profile (a window of the running session, or a new session) and hands
/// it to `render` on the blocking pool.
pub(crate) async fn profile<R, F>(request: CpuRequest, render: F) -> Result<R, CpuError>
where
    F: FnOnce(Profile) -> Result<R, CpuError> + Send + 'static,
    R: Send + 'static,
{
    let split = request.split;
    window(
        request,
        || (),
        |()| {},
        move |closed: Closed, ()| {
            let (profile, capped) = report_profile(
                closed.collected,
                closed.shared_with,
                closed.symbolize,
                closed.before,
                split,
            );
            (render(profile), capped)
        },
    )
    .await
}

/// What a closed window hands to its request's `finish`.
pub(crate) struct Closed {
    pub(crate) collected: crate::sampler::Collected,
    /// The windows that shared the session while this one was open, this one included.
    pub(crate) shared_with: usize,
    pub(crate) symbolize: crate::symbolize::Symbolize,
    /// Addresses already symbolized while the window was open.
    pub(crate) before: crate::symbolize::Resolved,
}

/// One window of the shared session for `request`: `opened` runs (on the blocking pool)
/// as the window opens, `closing` on what it gave just before the window closes, and
/// `finish` with it and what the window collected, off the async workers; `finish` says
/// whether the rate was capped, for the request's log line. A request refused (409) or
/// dropped runs none of them, or drops what `opened` gave.
pub(crate) async fn window<T, O, C, R, F>(
    request: CpuRequest,
    opened: O,
    closing: C,
    finish: F,
) -> Result<R, CpuError>
where
    O: FnOnce() -> T + Send + 'static,
    C: FnOnce(&mut T) + Send + 'static,
    T: Send + 'static,
    F: FnOnce(Closed, T) -> (Result<R, CpuError>, bool) + Send + 'static,
    R: Send + 'static,
{
    static NEXT_WINDOW: AtomicU64 = AtomicU64::new(1);
    let id = NEXT_WINDOW.fetch_add(1, Ordering::Relaxed);
    let symbolize = request.symbolize;
    let deadline = tokio::time::Instant::now() + FORCE_WAIT;
    // A forced request that takes over holds `starting` from the moment it closes the
    // running windows until its own session runs, so that no other request starts a
    // session in between (which it would then have to stop in turn).
    let mut starting: Option<tokio::sync::MutexGuard<'static, ()>> = None;
    // Held from the moment the recorder yields to this request until its session runs.
    let mut owed: Option<Owed> = None;
    let (shared, stop_early) = loop {
        let released = released().notified();
        tokio::pin!(released);
        // Registered before looking, so a session that ends in between is not missed.
        released.as_mut().enable();
        // Decided under the slot's lock, which is released before any await.
        let decision = match shared_slot().as_ref() {
            Some(running) => match running.join(&request, id) {
                Verdict::Joined(stop_early) => Next::Joined(running.clone(), stop_early),
                Verdict::Closing => Next::Wait(running.sampler.frequency()),
                Verdict::Yielded(yielded) => {
                    owed = Some(yielded);
                    Next::Wait(running.sampler.frequency())
                }
                Verdict::Refused(refusal)
                    if !request.force || matches!(refusal, CpuError::ForcedRunning { .. }) =>
                {
                    return Err(refusal);
                }
                // Take over: every window closes early with what it has, and this
                // request starts a session of its own once the sampler is free.
                Verdict::Refused(_) => Next::TakeOver,
            },
            None => Next::Start,
        };
        match decision {
            Next::Joined(shared, stop_early) => {
                // A takeover that found it could join after all starts nothing.
                drop(starting.take());
                drop(owed.take());
                break (shared, stop_early);
            }
            Next::Wait(running) => {
                tracing::debug!(
                    "waiting for the CPU profile session at {running} Hz to stop: its windows \
                     are closing"
                );
            }
            Next::TakeOver => {
                if starting.is_none() {
                    starting = Some(SESSIONS.get().starting.lock().await);
                    // Looked at again under `starting`: the session may have changed.
                    continue;
                }
                if let Some(running) = shared_slot().as_ref() {
                    let closed = running.close_all();
                    // Whoever's profile this cuts short (a scraper's, often) can find why.
                    tracing::info!(
                        "force=true: closing {closed} CPU profile window{} at {} Hz early, to \
                         start a session at {} Hz",
                        if closed == 1 { "" } else { "s" },
                        running.sampler.frequency(),
                        request.frequency
                    );
                }
            }
            Next::Start => {
                let guard = match starting.take() {
                    Some(guard) => guard,
                    None => SESSIONS.get().starting.lock().await,
                };
                if shared_slot().is_some() {
                    // Another session runs now: look at it again (holding `starting`
                    // still, if this request takes over).
                    if request.force {
                        starting = Some(guard);
                    }
                    continue;
                }
                let lease = CpuLease::acquire(request.duration, request.force).await?;
                // The lease travels with the start, in a `Started` that stops the sampler
                // and frees the lease on the blocking pool if this request is dropped
                // before it takes them out.
                let started = blocking(move || {
                    Started::new(start(request.frequency, request.blocklist)?, lease)
                })
                .await?;
                let shared = started.into_session();
                let Verdict::Joined(stop_early) = shared.join(&request, id) else {
                    unreachable!("a new session at the request's frequency has room for it");
                };
                *shared_slot() = Some(shared.clone());
                drop(guard);
                drop(owed.take());
                break (shared, stop_early);
            }
        }
        if tokio::time::timeout_at(deadline, released).await.is_err() {
            return Err(CpuError::Failed(
                "the running CPU profile did not stop when asked to".into(),
            ));
        }
    };
    // From here the request's only reference to the session is its window's, so that the
    // sampler is never stopped on an async worker, whenever the request is dropped.
    let mut window = WindowGuard {
        shared: Some(shared),
        id,
    };
    let session = window.shared.as_ref().expect("set above");
    let opening = session.clone();
    let (start, opened) = blocking(move || {
        let start = opening.sampler.open_window(id);
        if !opening.is_open(id) {
            // Its client hung up meanwhile (see `WindowGuard`).
            opening.sampler.forget_window(id);
        }
        Ok((start, opened()))
    })
    .await?;
    let end = tokio::time::Instant::now() + request.duration;
    // The session's drain thread gathers the samples meanwhile. A fifth of the way before
    // the window ends, what it has gathered so far is symbolized (names, and lines from
    // DWARF), while it runs: after the window only the addresses first sampled since are
    // left to look up.
    let early = (symbolize == crate::symbolize::Symbolize::Full
        && request.duration >= EARLY_SYMBOLS_FROM)
        .then(|| end - request.duration / 5);
    // Its answer, read on the blocking pool once the window is closed.
    let mut symbolized: Option<std::sync::mpsc::Receiver<crate::symbolize::Resolved>> = None;
    loop {
        tokio::select! {
            () = tokio::time::sleep_until(end) => break,
            () = stop_early.notified() => break,
            () = tokio::time::sleep_until(early.unwrap_or(end)),
                if symbolized.is_none() && early.is_some() =>
            {
                let session = session.clone();
                let (answer, answered) = std::sync::mpsc::sync_channel(1);
                symbolized = Some(answered);
                // Detached: a request dropped meanwhile just leaves the answer unread.
                drop(tokio::spawn(crate::offload::on_profiler_thread(move || {
                    let addresses = session.sampler.window_addresses(id);
                    // The objects the profile will be built with, not today's.
                    let objects = session.sampler.objects().clone();
                    // The session is not kept for the lookup: a window whose client
                    // hung up must be able to stop the sampler meanwhile.
                    drop(session);
                    let _ = answer.send(crate::symbolize::Resolved::of(&objects, addresses));
                    Ok(())
                }, CpuError::Failed)));
            }
        }
    }
    // Closed off the async workers from here on, whatever happens to the request: on the
    // profiler's own thread if it is idle (see `on_profiler_thread`), else on the
    // blocking pool.
    let shared = window.shared.take().expect("set above");
    let (rendered, report) = crate::offload::on_profiler_thread(
        move || {
            let mut opened = opened;
            closing(&mut opened);
            let collected = shared.sampler.close_window(start);
            let (shared_with, last) = shared.leave(id);
            if last {
                forget_session(&shared);
            }
            // The last reference stops the sampler, then frees the lease.
            drop(shared);
            // A window that ended early (or a slow lookup) may find its early symbols still
            // being looked up, now that the window is closed: they are waited for, being the
            // bulk of what would be looked up anyway. A lookup that failed left nothing.
            let before = symbolized
                .and_then(|answered| answered.recv().ok())
                .unwrap_or_default();
            let report = collected.report.clone();
            let closed = Closed {
                collected,
                shared_with,
                symbolize,
                before,
            };
            let (rendered, capped) = finish(closed, opened);
            crate::profile::give_back_freed_memory();
            Ok((rendered, (report, capped, shared_with)))
        },
        CpuError::Failed,
    )
    .await?;
    log_report(&report.0, report.1, report.2);
    rendered
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU32;

    use super::*;

    fn request(frequency: u32, force: bool, max_windows: u32) -> CpuRequest {
        CpuRequest {
            duration: Duration::from_secs(10),
            frequency,
            blocklist: &[],
            force,
            max_windows,
            symbolize: crate::symbolize::Symbolize::Full,
            split: Default::default(),
        }
    }

    /// Windows open until `ends_in` from now, `forced` or not.
    fn windows(open: &[(Duration, bool)]) -> Windows {
        let now = Instant::now();
        Windows {
            open: open
                .iter()
                .enumerate()
                .map(|(id, &(ends_in, forced))| Window {
                    id: id as u64,
                    ends_at: now + ends_in,
                    stop_early: Arc::new(Notify::new()),
                    forced,
                    shared_with: 1,
                })
                .collect(),
            ..Windows::default()
        }
    }

    const S: fn(u64) -> Duration = Duration::from_secs;

    /// Whether `retry_after` says about `expected` (a little less: time passes).
    fn about(retry_after: Duration, expected: Duration) -> bool {
        retry_after <= expected && retry_after + Duration::from_secs(5) > expected
    }

    #[test]
    fn a_request_joins_where_the_frequency_agrees_and_there_is_room() {
        let two = windows(&[(S(30), false), (S(60), false)]);
        assert!(refusal(&two, 99, &request(99, false, 3)).is_none());
        assert!(
            refusal(&two, 99, &request(99, true, 3)).is_none(),
            "force with room"
        );
        assert!(refusal(&windows(&[]), 99, &request(99, false, 1)).is_none());
    }

    #[test]
    fn another_frequency_is_refused_until_the_last_window_ends() {
        let two = windows(&[(S(30), false), (S(60), false)]);
        match refusal(&two, 99, &request(250, false, 3)) {
            Some(CpuError::OtherFrequency {
                running: 99,
                retry_after,
            }) => assert!(about(retry_after, S(60)), "{retry_after:?}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_full_session_is_refused_until_its_first_window_ends() {
        let two = windows(&[(S(60), false), (S(30), false)]);
        match refusal(&two, 99, &request(99, false, 2)) {
            Some(CpuError::Full {
                max_windows: 2,
                retry_after,
            }) => assert!(about(retry_after, S(30)), "{retry_after:?}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn force_does_not_overtake_a_forced_window_unless_it_can_join_it() {
        let forced = windows(&[(S(60), true), (S(30), false)]);
        for (asking, why) in [
            (request(250, true, 3), "another frequency"),
            (request(99, true, 2), "no room"),
        ] {
            match refusal(&forced, 99, &asking) {
                Some(CpuError::ForcedRunning { retry_after }) => {
                    assert!(about(retry_after, S(60)), "{why}: {retry_after:?}");
                }
                other => panic!("{why}: {other:?}"),
            }
        }
        // Where it can join, it joins; without force, the usual refusals.
        assert!(refusal(&forced, 99, &request(99, true, 3)).is_none());
        assert!(matches!(
            refusal(&forced, 99, &request(250, false, 3)),
            Some(CpuError::OtherFrequency { .. })
        ));
        // A forced request beside windows none of which was forced is refused as any.
        let unforced = windows(&[(S(60), false)]);
        assert!(matches!(
            refusal(&unforced, 99, &request(250, true, 3)),
            Some(CpuError::OtherFrequency { .. })
        ));
    }

    #[test]
    fn the_recorder_is_asked_to_leave_once_and_only_where_it_sits() {
        let mut windows = Windows::default();
        assert!(
            !windows.ask_recorder(Leaving::Forced),
            "no recorder sits here"
        );
        let asked = Arc::new(AtomicU32::new(0));
        let counting = asked.clone();
        windows.recorder = Some(Seat {
            ask: Arc::new(move |why| {
                assert_eq!(why, Leaving::OtherFrequency(250));
                counting.fetch_add(1, Ordering::SeqCst);
            }),
            asked: false,
        });
        assert!(windows.ask_recorder(Leaving::OtherFrequency(250)));
        assert!(
            windows.ask_recorder(Leaving::OtherFrequency(250)),
            "it still sits"
        );
        assert_eq!(asked.load(Ordering::SeqCst), 1, "asked once");
    }
}
