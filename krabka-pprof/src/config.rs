//! [`ProfilingConfig`]: the settings the routes run with, their defaults and const
//! builders. The rules they must obey are `config/rules.rs` (`ProfilingConfig::validate`),
//! which `#[pprof_routes]` repeats, under the same names, in
//! `krabka-pprof-macros/src/rules.rs` only to point at the offending token; the two files
//! change together. The expansion runs [`ProfilingConfig::checked`] in an inline `const`,
//! so these checks also run at compile time. What a broken rule says is
//! `config/error.rs`.

use std::time::Duration;

use axum::http::request::Parts;

mod bounds;
mod chars;
mod error;
mod rules;
#[cfg(test)]
mod tests;

pub use bounds::{
    DEFAULT_FREQUENCY_MAX, DEFAULT_PUSH_INTERVAL, DEFAULT_RECENT_MEMORY, MAX_ALLOC_STACKS,
    MAX_DURATION, MAX_FREQUENCY, MAX_PUSH_INTERVAL, MAX_RECENT, MAX_RECENT_MEMORY, MAX_WINDOWS,
    MIN_ALLOC_STACKS, MIN_DURATION, MIN_FREQUENCY, MIN_PUSH_INTERVAL, MIN_RECENT,
    MIN_RECENT_MEMORY, MIN_WINDOWS, PUSH_HISTORY_MARGIN,
};
pub(crate) use error::Bytes;
pub use error::{ConfigError, DurationField};

/// Decides whether a request may reach the profiling routes: `true` admits it, `false`
/// answers 403 before any profiler work. Set with `guard = path::to::fn` in the attribute
/// or [`ProfilingConfig::with_guard`].
pub type Guard = fn(&Parts) -> bool;

/// Settings for the profiling routes.
///
/// Build it in a `const` or `static` and every rule is checked by the compiler:
///
/// ```
/// use std::time::Duration;
/// use krabka_pprof::ProfilingConfig;
///
/// static CONFIG: ProfilingConfig = ProfilingConfig::new()
///     .with_cpu_max(Duration::from_secs(120))
///     .with_frequency(250)
///     .with_prefix("/internal/pprof")
///     .checked();
/// ```
///
/// At run time, [`validate`](Self::validate) returns the same rules as a [`ConfigError`].
#[derive(Clone, Copy, Debug)]
pub struct ProfilingConfig {
    /// `None`: 30 s, or `cpu_max` if that is shorter.
    cpu_default: Option<Duration>,
    cpu_max: Duration,
    frequency: u32,
    /// `None`: 250 Hz, or `frequency` if that is higher.
    frequency_max: Option<u32>,
    max_windows: u32,
    blocklist: &'static [&'static str],
    heap: bool,
    /// `None`: 10 s, or `heap_max` if that is shorter.
    heap_default: Option<Duration>,
    heap_max: Duration,
    /// Distinct stacks the cumulative allocation counts keep; `0`: no counts.
    alloc_stacks: u32,
    threads: bool,
    cmdline: bool,
    /// `None`: no recorder.
    recent: Option<Duration>,
    recent_memory: usize,
    /// Push the recorder's windows (needs `recent`).
    push: bool,
    push_interval: Duration,
    prefix: &'static str,
    guard: Option<Guard>,
    token_env: Option<&'static str>,
}

impl Default for ProfilingConfig {
    fn default() -> Self {
        Self::new()
    }
}

impl ProfilingConfig {
    /// The defaults: CPU profiles of 30 s unless asked otherwise, at most 60 s, at 99 Hz,
    /// unwinding through every library (an empty blocklist); heap profiling off
    /// (10 s default window, 30 s max, and allocation counts of up to 4096 stacks when
    /// on); thread dumps on; `/cmdline` off; no recorder (`recent` off, 8 MiB when on); routes under
    /// `/debug/pprof`; no guard and no token.
    pub const fn new() -> Self {
        Self {
            cpu_default: None,
            cpu_max: Duration::from_secs(60),
            frequency: 99,
            frequency_max: None,
            max_windows: 8,
            blocklist: &[],
            heap: false,
            heap_default: None,
            heap_max: Duration::from_secs(30),
            alloc_stacks: 4096,
            threads: true,
            cmdline: false,
            recent: None,
            recent_memory: DEFAULT_RECENT_MEMORY,
            push: false,
            push_interval: DEFAULT_PUSH_INTERVAL,
            prefix: "/debug/pprof",
            guard: None,
            token_env: None,
        }
    }

    /// CPU profile length when the request has no `seconds`. Unset, it is 30 s, or
    /// `cpu_max` if that is shorter.
    pub const fn with_cpu_default(mut self, duration: Duration) -> Self {
        self.cpu_default = Some(duration);
        self
    }

    /// Longest CPU profile; longer requests are clamped to it. Keep it below any timeout
    /// in front of the service (a `TimeoutLayer`, a proxy, the scraper's own timeout).
    pub const fn with_cpu_max(mut self, duration: Duration) -> Self {
        self.cpu_max = duration;
        self
    }

    /// CPU sampling frequency in Hz when the request has no `frequency`.
    pub const fn with_frequency(mut self, hz: u32) -> Self {
        self.frequency = hz;
        self
    }

    /// The highest frequency a request may ask for with `?frequency=` (1 ..= 1000 Hz, at
    /// least `frequency`); above it, a 400 that names this setting. Unset: 250 Hz, or
    /// `frequency` if that is higher. A caller who can reach the routes can otherwise make
    /// the signal handler run up to 1000 times a second on every busy thread.
    pub const fn with_frequency_max(mut self, hz: u32) -> Self {
        self.frequency_max = Some(hz);
        self
    }

    /// How many CPU profiles may run at once, sharing one sampler at one frequency (8
    /// unless set). A request that arrives while a profile runs at the same frequency
    /// joins it and gets the samples of its own window; past this many it gets 409. `1`
    /// is one profile at a time.
    pub const fn with_max_windows(mut self, windows: u32) -> Self {
        self.max_windows = windows;
        self
    }

    /// Shared libraries the sampler does not unwind through, by file name (`libc` names
    /// `libc.so.6`, not `libcrypto.so.3`; `pthread` names `libpthread.so.0`; `vdso` the
    /// vDSO). Samples that land in them are kept, under the library's name. Empty by
    /// default: the sampler reads memory only through calls that cannot fault and calls
    /// nothing in these libraries, so unwinding through them is safe, and without it the
    /// callers of `memcpy`, `malloc` or `write` are lost.
    pub const fn with_blocklist(mut self, libraries: &'static [&'static str]) -> Self {
        self.blocklist = libraries;
        self
    }

    /// Serve `/heap` and `/allocs` (needs the `heap-profiling` feature and jemalloc).
    pub const fn with_heap(mut self, on: bool) -> Self {
        self.heap = on;
        self
    }

    /// Heap sampling window when sampling is not already active and the request has no
    /// `seconds`. Unset, it is 10 s, or `heap_max` if that is shorter.
    pub const fn with_heap_default(mut self, duration: Duration) -> Self {
        self.heap_default = Some(duration);
        self
    }

    /// Longest heap sampling window.
    pub const fn with_heap_max(mut self, duration: Duration) -> Self {
        self.heap_max = duration;
        self
    }

    /// How many distinct allocation stacks the cumulative allocation counts keep (4096
    /// unless set); `0` turns them off. With them, `/allocs` and `/heap` carry Go's
    /// `alloc_objects` and `alloc_space` (counted since the routes were built, never
    /// decreasing) beside `inuse_*`, and `?seconds=N` is the allocations of those seconds.
    /// jemalloc's sample hook feeds them, once per sampled allocation (about one per
    /// 512 KiB allocated): a fixed table of about 560 bytes per stack at most, resident
    /// as stacks arrive; stacks beyond it are counted together under one marker. The
    /// first router built with heap profiling installs the hook, with its size, for the
    /// life of the process. See the guide's heap page.
    pub const fn with_alloc_stacks(mut self, stacks: u32) -> Self {
        self.alloc_stacks = stacks;
        self
    }

    /// Serve the thread dumps `/threads`, `/goroutine` and `/tasks` (on unless set);
    /// `false` leaves them out.
    pub const fn with_threads(mut self, on: bool) -> Self {
        self.threads = on;
        self
    }

    /// Serve `/cmdline`, the process's command line as Go serves it (off unless set: a
    /// command line often carries secrets, and a profiler needs none of it). Off, the
    /// route answers 404 with a sentence that names this setting.
    pub const fn with_cmdline(mut self, on: bool) -> Self {
        self.cmdline = on;
        self
    }

    /// Keep this much CPU history, at the configured `frequency`, in an always-on
    /// recorder that `/recent?seconds=N` answers from at once. The recorder starts when
    /// the router is built and runs for the life of the process (see the guide's
    /// `recent` page); off unless set.
    pub const fn with_recent(mut self, keep: Duration) -> Self {
        self.recent = Some(keep);
        self
    }

    /// The most memory the recorder's history may take, in bytes (8 MiB unless set):
    /// past it, the oldest slices are dropped first. Used only with
    /// [`with_recent`](Self::with_recent).
    pub const fn with_recent_memory(mut self, bytes: usize) -> Self {
        self.recent_memory = bytes;
        self
    }

    /// Push the recorder's history, a window every
    /// [`push_interval`](Self::with_push_interval), to the profile stores the process's
    /// environment names: an OpenTelemetry Collector (`OTEL_EXPORTER_OTLP_ENDPOINT` or
    /// `OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT`) and Grafana Pyroscope
    /// (`PYROSCOPE_SERVER_ADDRESS`). Needs [`with_recent`](Self::with_recent) (and feature
    /// `push`): the recorder's slices are what is pushed, so nothing is sampled twice and
    /// a service that is also scraped is never counted twice. With neither variable set,
    /// one warning at start and nothing is pushed. Off unless set; see the guide's push
    /// page.
    pub const fn with_push(mut self, on: bool) -> Self {
        self.push = on;
        self
    }

    /// The length of each pushed window (15 s unless set): whole seconds from 1 s to
    /// 60 s that divide a minute, so that windows start on the same seconds of every
    /// minute in every process.
    pub const fn with_push_interval(mut self, interval: Duration) -> Self {
        self.push_interval = interval;
        self
    }

    /// Path under which the routes are mounted, such as `/debug/pprof`.
    pub const fn with_prefix(mut self, prefix: &'static str) -> Self {
        self.prefix = prefix;
        self
    }

    /// A function that admits or refuses (403) each request before any profiler work.
    pub const fn with_guard(mut self, guard: Guard) -> Self {
        self.guard = Some(guard);
        self
    }

    /// Require `Authorization: Bearer <token>`, where the token is the value of this
    /// environment variable when the router is built. Unset or empty: the routes answer
    /// 503 (they fail closed, never open).
    pub const fn with_token_env(mut self, variable: &'static str) -> Self {
        self.token_env = Some(variable);
        self
    }

    /// See [`with_cpu_default`](Self::with_cpu_default).
    pub const fn cpu_default(&self) -> Duration {
        match self.cpu_default {
            Some(duration) => duration,
            None => shorter(Duration::from_secs(30), self.cpu_max),
        }
    }
    /// See [`with_cpu_max`](Self::with_cpu_max).
    pub const fn cpu_max(&self) -> Duration {
        self.cpu_max
    }
    /// See [`with_frequency`](Self::with_frequency).
    pub const fn frequency(&self) -> u32 {
        self.frequency
    }
    /// See [`with_frequency_max`](Self::with_frequency_max).
    pub const fn frequency_max(&self) -> u32 {
        match self.frequency_max {
            Some(hz) => hz,
            None if self.frequency > DEFAULT_FREQUENCY_MAX => self.frequency,
            None => DEFAULT_FREQUENCY_MAX,
        }
    }
    /// See [`with_max_windows`](Self::with_max_windows).
    pub const fn max_windows(&self) -> u32 {
        self.max_windows
    }
    /// See [`with_blocklist`](Self::with_blocklist).
    pub const fn blocklist(&self) -> &'static [&'static str] {
        self.blocklist
    }
    /// See [`with_heap`](Self::with_heap).
    pub const fn heap(&self) -> bool {
        self.heap
    }
    /// See [`with_heap_default`](Self::with_heap_default).
    pub const fn heap_default(&self) -> Duration {
        match self.heap_default {
            Some(duration) => duration,
            None => shorter(Duration::from_secs(10), self.heap_max),
        }
    }
    /// See [`with_heap_max`](Self::with_heap_max).
    pub const fn heap_max(&self) -> Duration {
        self.heap_max
    }
    /// See [`with_alloc_stacks`](Self::with_alloc_stacks).
    pub const fn alloc_stacks(&self) -> u32 {
        self.alloc_stacks
    }
    /// See [`with_threads`](Self::with_threads).
    pub const fn threads(&self) -> bool {
        self.threads
    }
    /// See [`with_cmdline`](Self::with_cmdline).
    pub const fn cmdline(&self) -> bool {
        self.cmdline
    }
    /// See [`with_recent`](Self::with_recent): `None` when the recorder is off.
    pub const fn recent(&self) -> Option<Duration> {
        self.recent
    }
    /// See [`with_recent_memory`](Self::with_recent_memory).
    pub const fn recent_memory(&self) -> usize {
        self.recent_memory
    }
    /// See [`with_push`](Self::with_push).
    pub const fn push(&self) -> bool {
        self.push
    }
    /// See [`with_push_interval`](Self::with_push_interval).
    pub const fn push_interval(&self) -> Duration {
        self.push_interval
    }
    /// See [`with_prefix`](Self::with_prefix).
    pub const fn prefix(&self) -> &'static str {
        self.prefix
    }
    /// See [`with_guard`](Self::with_guard).
    pub const fn guard(&self) -> Option<Guard> {
        self.guard
    }
    /// See [`with_token_env`](Self::with_token_env).
    pub const fn token_env(&self) -> Option<&'static str> {
        self.token_env
    }

    /// `self` if every rule holds; otherwise a panic naming the broken rule. In a `const`
    /// or `static` initializer the panic is a compile error.
    #[track_caller]
    pub const fn checked(self) -> Self {
        match self.validate() {
            Ok(()) => self,
            Err(error) => panic!("{}", error.rule()),
        }
    }
}

const fn shorter(a: Duration, b: Duration) -> Duration {
    if a.as_nanos() <= b.as_nanos() { a } else { b }
}
