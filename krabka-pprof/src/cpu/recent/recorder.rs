//! The recorder's thread and its process-wide state: one recorder per process, started
//! by the first router built with `recent`, on a thread of its own (the router may be
//! built before any tokio runtime exists, and the drains must never run on an async
//! worker; the session's own drain thread gathers its samples). Every second, or when a
//! request asks, it rotates its window (`Sampler::rotate_window`: no gap, no overlap) and
//! pushes the slice into the ring. Asked to leave (another frequency, `force=true`), it
//! closes its window and sits again as soon as the sampler is free, each pause remembered
//! as the gap before the next slice. It never stops for good: a failure to start is
//! retried with a backoff, and a panic restarts its loop.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use super::super::request::RecorderSettings;
use super::super::sessions::{self, AskToLeave, Leaving, Sit, Sitting};
use super::ring::{Ring, SLICE};
use crate::process::PerProcess;
use crate::sampler::{DRAIN_EVERY, WindowStart};

/// The longest the recorder waits before it tries again to start a sampler that failed.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// How often a recorder switched off looks whether it is on again.
const SWITCH_LOOK: Duration = Duration::from_secs(1);

/// The gap a switch-off leaves in the recorder's history.
const SWITCHED_OFF: &str = "profiling was switched off (krabka_pprof::set_profiling_enabled)";

/// The process's recorder.
pub(super) struct Recorder {
    pub(super) settings: RecorderSettings,
    ring: Mutex<Ring>,
    inbox: Mutex<Inbox>,
    wake: Condvar,
    /// Its thread runs (or a start is under way).
    running: AtomicBool,
}

/// What the recorder is asked to do between ticks.
#[derive(Default)]
struct Inbox {
    leave: Option<Leaving>,
    /// Requests waiting for the newest slice to be cut.
    cuts: Vec<tokio::sync::oneshot::Sender<()>>,
    /// Profiling was switched off, and the recorder has not yet stopped sampling.
    switching_off: bool,
}

/// This process's recorder, once started: never freed (a child made by `fork` starts its
/// own, see [`PerProcess`]).
static RECORDER: PerProcess<OnceLock<&'static Recorder>> = PerProcess::new(OnceLock::new);

/// The recorder, started with `settings` if none runs in this process yet (the first
/// router's settings stay).
pub(super) fn start(settings: RecorderSettings) -> &'static Recorder {
    let recorder = *RECORDER.get().get_or_init(|| {
        Box::leak(Box::new(Recorder {
            settings,
            ring: Mutex::new(
                Ring::new(settings.keep, settings.budget).pushed_in(settings.push_interval),
            ),
            inbox: Mutex::new(Inbox::default()),
            wake: Condvar::new(),
            running: AtomicBool::new(false),
        }))
    });
    if !recorder.running.swap(true, Ordering::SeqCst) {
        let spawned = std::thread::Builder::new()
            .name("krabka-recorder".into())
            .spawn(move || {
                let _own = crate::process::OwnThread::register();
                run(recorder)
            });
        if let Err(error) = spawned {
            // Tried again by the next request or router.
            recorder.running.store(false, Ordering::SeqCst);
            recorder.ring().pause(
                SystemTime::now(),
                format!("the recorder's thread could not start ({error})"),
            );
        }
    }
    recorder
}

/// The recorder, if one was started in this process.
pub(super) fn get() -> Option<&'static Recorder> {
    RECORDER.get().get().copied()
}

impl Recorder {
    pub(super) fn ring(&self) -> MutexGuard<'_, Ring> {
        self.ring.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn inbox(&self) -> MutexGuard<'_, Inbox> {
        self.inbox.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Asks for the newest slice to be cut now; answered once it is in the ring (at once
    /// if the recorder is not sampling).
    pub(super) fn cut(&self) -> tokio::sync::oneshot::Receiver<()> {
        let (answer, answered) = tokio::sync::oneshot::channel();
        self.inbox().cuts.push(answer);
        self.wake.notify_all();
        answered
    }

    /// Profiling was switched off: the recorder closes its window now; returns once it
    /// has, or after [`SWITCH_LOOK`] (a recorder thread that is slow to run).
    pub(super) fn switch_off(&self) {
        let mut inbox = self.inbox();
        inbox.switching_off = true;
        self.wake.notify_all();
        let _ = self
            .wake
            .wait_timeout_while(inbox, SWITCH_LOOK, |inbox| inbox.switching_off)
            .unwrap_or_else(PoisonError::into_inner);
    }

    /// The recorder has stopped sampling for a switch-off.
    fn switched_off(&self) {
        self.inbox().switching_off = false;
        self.wake.notify_all();
    }

    /// A session asks the recorder to leave it.
    fn ask_to_leave(&self, why: Leaving) {
        self.inbox().leave = Some(why);
        self.wake.notify_all();
    }

    /// Waits until `deadline` or a message, and takes the messages.
    fn wait(&self, deadline: Instant) -> (Option<Leaving>, Vec<tokio::sync::oneshot::Sender<()>>) {
        let (mut inbox, _) = self
            .wake
            .wait_timeout_while(
                self.inbox(),
                deadline.saturating_duration_since(Instant::now()),
                |inbox| inbox.leave.is_none() && inbox.cuts.is_empty() && !inbox.switching_off,
            )
            .unwrap_or_else(PoisonError::into_inner);
        (inbox.leave.take(), std::mem::take(&mut inbox.cuts))
    }
}

/// The recorder's thread: its loop, started again after a panic.
fn run(recorder: &'static Recorder) {
    loop {
        if let Err(panic) = std::panic::catch_unwind(AssertUnwindSafe(|| record(recorder))) {
            let what = crate::offload::panic_message(&*panic).unwrap_or_default();
            tracing::error!(panic = %what, "the recorder's loop panicked; it starts again");
            recorder.ring().pause(
                SystemTime::now(),
                "the recorder's loop failed and started again".to_owned(),
            );
            std::thread::sleep(Duration::from_secs(1));
        }
    }
}

/// The window the recorder has open on the session it sits on.
struct Recording {
    sitting: Sitting,
    start: WindowStart,
    opened: Instant,
    /// The wall clock then: slices end on whole seconds of it.
    opened_wall: SystemTime,
}

/// An id for each of the recorder's windows, apart from the requests' (which count up
/// from 1).
fn next_window() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1 << 63);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

fn record(recorder: &'static Recorder) {
    let settings = recorder.settings;
    let ask: AskToLeave = Arc::new(move |why| recorder.ask_to_leave(why));
    let mut recording: Option<Recording> = None;
    // Why nothing was sampled since the last slice, once the recorder has paused.
    let mut gap: Option<String> = None;
    let mut retry = Retry::at(Instant::now());
    loop {
        // A slice ends on time, not at the tick after.
        let deadline = match &recording {
            Some(current) => slice_end(current.opened, current.opened_wall),
            None => retry.at,
        };
        let (leave, cuts) = recorder.wait(deadline);
        // Read together: the next slice ends on a whole second of the one by the other.
        let (now, now_wall) = (Instant::now(), SystemTime::now());
        // Switched off at run time: the window so far becomes a slice, and nothing is
        // sampled until it is switched on again, looked at once a second.
        if !crate::switch::is_on() {
            if let Some(current) = recording.take() {
                let collected = current.sitting.sampler().close_window(current.start);
                drop(current.sitting);
                let why = SWITCHED_OFF.to_owned();
                let mut ring = recorder.ring();
                ring.push(collected, gap.take());
                ring.pause(SystemTime::now(), why.clone());
                drop(ring);
                gap = Some(why);
            }
            answer(cuts);
            recorder.switched_off();
            retry = Retry::at(now + SWITCH_LOOK);
            continue;
        }
        let Some(mut current) = recording.take() else {
            // Nothing is sampled, nothing to cut.
            answer(cuts);
            if !retry.due(now) {
                continue;
            }
            match sessions::sit(settings.frequency, settings.blocklist, ask.clone()) {
                Sit::Seated(sitting) => {
                    let start = sitting.sampler().open_window(next_window());
                    let (opened, opened_wall) = (Instant::now(), SystemTime::now());
                    recording = Some(Recording {
                        sitting,
                        start,
                        opened,
                        opened_wall,
                    });
                    retry.seated();
                }
                Sit::Busy => {
                    retry.busy(now);
                    if gap.is_none() {
                        let why = match sessions::status().and_then(|s| s.frequency) {
                            Some(hz) => format!("a CPU profile at {hz} Hz held the sampler"),
                            None => "another CPU profile held the sampler".to_owned(),
                        };
                        recorder.ring().pause(SystemTime::now(), why.clone());
                        gap = Some(why);
                    }
                }
                Sit::Failed(error) => {
                    let why = format!("the sampler could not start: {}", describe(&error));
                    if retry.failed(now) {
                        tracing::warn!(reason = %why, "the recorder is not sampling");
                    }
                    recorder.ring().pause(SystemTime::now(), why.clone());
                    gap = Some(why);
                }
            }
            continue;
        };
        if let Some(why) = leave {
            let collected = current.sitting.sampler().close_window(current.start);
            // Leaving may stop the sampler: here, on the recorder's own thread.
            drop(current.sitting);
            let why = match why {
                Leaving::OtherFrequency(hz) => {
                    format!("the recorder yielded the sampler to a profile at {hz} Hz")
                }
                Leaving::Forced => "a profile with force=true took the sampler".to_owned(),
            };
            let mut ring = recorder.ring();
            ring.push(collected, gap.take());
            ring.pause(SystemTime::now(), why.clone());
            drop(ring);
            gap = Some(why);
            answer(cuts);
            retry.left(now);
            continue;
        }
        // Here a request asked for a cut, or the slice's deadline passed (`wait` returns
        // for nothing else): the slice ends now.
        let (collected, next) = current
            .sitting
            .sampler()
            .rotate_window(current.start, next_window());
        let replaced = collected.report.handler_replaced;
        recorder.ring().push(collected, gap.take());
        answer(cuts);
        if replaced {
            // Its timers stopped: the other handler would only be disturbed by them.
            drop(current.sitting.sampler().close_window(next));
            drop(current.sitting);
            let why = "another SIGPROF handler replaced the sampler's".to_owned();
            recorder.ring().pause(SystemTime::now(), why.clone());
            gap = Some(why);
            retry.replaced(now);
            continue;
        }
        current.start = next;
        current.opened = now;
        current.opened_wall = now_wall;
        recording = Some(current);
    }
}

/// When the slice opened at `opened` (`opened_wall` by the wall clock) ends: at the
/// first whole second of the wall clock at least half a slice later, so that slices
/// end on whole seconds and a pushed window of whole seconds (`crate::push`) is made of
/// whole slices; from half a slice to a slice and a half long (a request's cut makes one
/// shorter).
fn slice_end(opened: Instant, opened_wall: SystemTime) -> Instant {
    let into_second = opened_wall
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |since| since.subsec_nanos());
    let to_next = SLICE - Duration::from_nanos(u64::from(into_second));
    opened
        + if to_next < SLICE / 2 {
            to_next + SLICE
        } else {
            to_next
        }
}

/// When the recorder, not sampling, next tries to sit on the sampler: the pace of its
/// retries after a start failed, while another profile holds the sampler, after another
/// `SIGPROF` handler replaced the sampler's, and after it left for another profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Retry {
    at: Instant,
    /// The starts that failed in a row.
    failures: u32,
}

impl Retry {
    /// A first try at `at`.
    fn at(at: Instant) -> Self {
        Self { at, failures: 0 }
    }

    /// Whether it is time to try, at `now`.
    fn due(&self, now: Instant) -> bool {
        now >= self.at
    }

    /// Seated: the next failure is the first again.
    fn seated(&mut self) {
        self.failures = 0;
    }

    /// Another profile holds the sampler: look again after a drain's time (it may be
    /// a short one).
    fn busy(&mut self, now: Instant) {
        self.at = now + DRAIN_EVERY;
    }

    /// A start failed at `now`: try again after [`backoff`]. True for the first failure in
    /// a row, the one worth a warning.
    fn failed(&mut self, now: Instant) -> bool {
        let first = self.failures == 0;
        self.failures += 1;
        self.at = now + backoff(self.failures);
        first
    }

    /// Another `SIGPROF` handler replaced the sampler's: it is given `MAX_BACKOFF` before
    /// the recorder's timers disturb it again.
    fn replaced(&mut self, now: Instant) {
        self.at = now + MAX_BACKOFF;
    }

    /// The recorder left for another profile: it sits again as soon as the sampler is
    /// free, that is at once if it is.
    fn left(&mut self, now: Instant) {
        self.at = now;
    }
}

/// How long the recorder waits before it tries again after `failures` starts in a row
/// failed: twice as long after each, from two drains' time up to `MAX_BACKOFF`.
fn backoff(failures: u32) -> Duration {
    (DRAIN_EVERY * 2u32.saturating_pow(failures)).min(MAX_BACKOFF)
}

/// Tells the requests waiting for a cut that the ring holds what there is.
fn answer(cuts: Vec<tokio::sync::oneshot::Sender<()>>) {
    for cut in cuts {
        // A request that went away no longer waits.
        let _ = cut.send(());
    }
}

/// A start failure in a few words.
fn describe(error: &super::super::request::CpuError) -> String {
    use super::super::request::CpuError;
    match error {
        CpuError::Unavailable(why) => (*why).to_owned(),
        CpuError::Failed(why) => why.clone(),
        other => format!("{other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The recorder's window ids count up from 2^63, where no request's (counting up from
    /// 1) can reach: a window of the recorder and a request's never share an id.
    #[test]
    fn the_recorders_window_ids_are_apart_from_the_requests() {
        let first = next_window();
        let second = next_window();
        assert!(first >= 1 << 63, "{first}");
        assert!(second > first, "{first} then {second}");
    }

    /// After each failed start the recorder waits twice as long as after the one before,
    /// from 200 ms, and never longer than 30 s, however many failed.
    #[test]
    fn failed_starts_back_off_doubling_up_to_thirty_seconds() {
        assert_eq!(backoff(1), Duration::from_millis(200));
        assert_eq!(backoff(2), Duration::from_millis(400));
        assert_eq!(backoff(8), Duration::from_millis(25_600));
        assert_eq!(backoff(9), Duration::from_secs(30));
        assert_eq!(backoff(u32::MAX), Duration::from_secs(30));
    }

    /// A slice ends on the first whole second of the wall clock at least half a slice
    /// after it opened.
    #[test]
    fn a_slice_ends_on_a_whole_second_at_least_half_a_slice_after_it_opened() {
        let opened = Instant::now();
        let second = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let ms = Duration::from_millis;
        assert_eq!(SLICE, Duration::from_secs(1));
        assert_eq!(
            slice_end(opened, second),
            opened + SLICE,
            "on a whole second"
        );
        assert_eq!(slice_end(opened, second + ms(300)), opened + ms(700));
        assert_eq!(slice_end(opened, second + ms(500)), opened + ms(500));
        assert_eq!(slice_end(opened, second + ms(501)), opened + ms(1_499));
        assert_eq!(slice_end(opened, second + ms(999)), opened + ms(1_001));
    }

    /// The recorder tries to sit when its retry time has come, not a moment before.
    #[test]
    fn a_retry_is_due_at_its_time_and_after() {
        let now = Instant::now();
        let retry = Retry::at(now + Duration::from_millis(200));
        assert!(!retry.due(now));
        assert!(!retry.due(now + Duration::from_millis(199)));
        assert!(retry.due(now + Duration::from_millis(200)));
        assert!(retry.due(now + Duration::from_secs(1)));
        assert!(Retry::at(now).due(now));
    }

    /// Failed starts are retried later and later, and only the first of a run is worth a
    /// warning; once seated, the next failure is the first again.
    #[test]
    fn failed_starts_are_retried_with_a_growing_backoff_and_warned_of_once() {
        let now = Instant::now();
        let mut retry = Retry::at(now);
        assert!(retry.failed(now), "the first failure is not warned of");
        assert_eq!(retry.at, now + Duration::from_millis(200));
        assert!(!retry.due(now));
        let later = now + Duration::from_secs(1);
        assert!(
            !retry.failed(later),
            "the second failure in a row is warned of again"
        );
        assert_eq!(retry.at, later + Duration::from_millis(400));
        assert!(!retry.failed(later));
        assert_eq!(retry.at, later + Duration::from_millis(800));
        assert_eq!(retry.failures, 3);
        retry.seated();
        assert_eq!(retry.failures, 0);
        assert!(
            retry.failed(later),
            "a failure after a start is not the first again"
        );
        assert_eq!(retry.at, later + Duration::from_millis(200));
    }

    /// While another profile holds the sampler the recorder looks again every drain; after
    /// another `SIGPROF` handler took over it waits 30 s; after leaving it tries at once.
    #[test]
    fn a_busy_sampler_a_replaced_handler_and_a_leaving_set_their_own_retry_times() {
        let now = Instant::now();
        let later = now + Duration::from_secs(5);
        let mut retry = Retry::at(now);
        retry.busy(later);
        assert_eq!(retry, Retry::at(later + DRAIN_EVERY));
        retry.replaced(later);
        assert_eq!(retry, Retry::at(later + Duration::from_secs(30)));
        retry.left(later);
        assert_eq!(retry, Retry::at(later));
        assert!(retry.due(later));
        // None of them forgets the failures counted before.
        let mut failing = Retry::at(now);
        failing.failed(now);
        failing.busy(later);
        failing.replaced(later);
        failing.left(later);
        assert_eq!(failing.failures, 1);
    }

    /// The pause the recorder leaves in its history when the sampler cannot start gives
    /// the sampler's own sentence, not the error's name.
    #[test]
    fn a_failed_start_is_described_by_its_sentence() {
        use super::super::super::request::CpuError;
        assert_eq!(
            describe(&CpuError::Unavailable("no timers in this process")),
            "no timers in this process"
        );
        assert_eq!(
            describe(&CpuError::Failed("timer_create: EAGAIN".to_owned())),
            "timer_create: EAGAIN"
        );
        let busy = CpuError::Busy {
            retry_after: Duration::from_secs(2),
        };
        assert!(describe(&busy).starts_with("Busy"), "{}", describe(&busy));
    }

    /// Every request waiting for a cut is told, and one that went away is no obstacle to
    /// the others.
    #[test]
    fn every_waiting_request_hears_of_the_cut() {
        let (first, mut first_told) = tokio::sync::oneshot::channel();
        let (gone, gone_told) = tokio::sync::oneshot::channel();
        let (last, mut last_told) = tokio::sync::oneshot::channel();
        drop(gone_told);
        answer(vec![first, gone, last]);
        assert_eq!(first_told.try_recv(), Ok(()));
        assert_eq!(last_told.try_recv(), Ok(()));
    }
}
