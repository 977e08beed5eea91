//! What one request asks of the CPU profiler, after defaults and clamping; every way it
//! can fail (which `routes` turns into answers); what runs now, for the index page; and
//! whether CPU profiles can be taken on this target at all.

use std::time::Duration;

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
    pub(crate) symbolize: crate::symbolize::Symbolize,
    /// What its samples are told apart by (`?thread_ids=`).
    pub(crate) split: Split,
}

/// What the samples of a profile are told apart by, besides stack, thread name and labels.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Split {
    /// Each sample also carries `thread_id` (`?thread_ids=true`): one sample per thread,
    /// for a person at `go tool pprof -tags`, not for a series store.
    pub(crate) thread_ids: bool,
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

/// What the recorder runs with: the attribute's `recent`, `recent_memory`, `frequency`
/// and `blocklist`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RecorderSettings {
    /// How much history it keeps.
    pub(crate) keep: Duration,
    /// The most bytes that history may take.
    pub(crate) budget: usize,
    pub(crate) frequency: u32,
    pub(crate) blocklist: &'static [&'static str],
    /// The pusher's windows (`push_interval`), if it pushes: the history's folding keeps
    /// within them.
    pub(crate) push_interval: Option<Duration>,
}

/// What one `/recent` request asks for, after defaults and clamping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RecentRequest {
    /// The window's length, at most what is kept.
    pub(crate) seconds: Duration,
    /// When it ends; `None`: now.
    pub(crate) end: Option<std::time::SystemTime>,
    pub(crate) symbolize: crate::symbolize::Symbolize,
}

/// Why `/recent` has no profile to give.
#[derive(Debug)]
pub(crate) enum RecentError {
    /// The recorder cannot run here (this target, this process's sampler); the sentence
    /// says why.
    Unavailable(&'static str),
    /// Nothing is kept for the window asked for; the sentence says why. (Only the
    /// recorder, krabka-pprof's own sampler's, keeps anything.)
    #[cfg_attr(not(sampler), allow(dead_code))]
    NothingKept(String),
    /// Building the profile failed.
    Failed(String),
}

/// The recorder now, for the index page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RecorderStatus {
    pub(crate) settings: RecorderSettings,
    /// From the oldest slice's start to the newest's end, and of that what was sampled.
    pub(crate) span: Duration,
    pub(crate) sampled: Duration,
    /// What the history takes, as counted against `budget`, and its distinct stacks.
    pub(crate) bytes: usize,
    pub(crate) stacks: usize,
    /// Why it does not sample now, if it does not.
    pub(crate) paused: Option<String>,
}

/// A window of the recorder's history as the pusher takes it (`crate::push`).
#[cfg_attr(not(feature = "push"), allow(dead_code))]
pub(crate) struct Recorded {
    /// The window's CPU profile, starting at the window's start; `None` when no slice
    /// fell in it (the recorder did not sample then).
    pub(crate) profile: Option<crate::profile::Profile>,
    /// What the next window is taken after (see `Ring::take`).
    pub(crate) last: Option<std::time::SystemTime>,
}
