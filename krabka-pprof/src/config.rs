//! [`ProfilingConfig`]: the settings the routes run with, their defaults, and the rules
//! they must obey. `#[pprof_routes]` repeats the rules, under the same names, in
//! `krabka-pprof-macros/src/rules.rs` only to point at the offending token; the two files
//! change together. Its expansion runs [`ProfilingConfig::checked`] in an inline `const`,
//! so these checks also run at compile time.

use std::fmt;
use std::time::Duration;

use axum::http::request::Parts;

mod chars;
use chars::{char_at, is_control, is_whitespace};

/// Decides whether a request may reach the profiling routes: `true` admits it, `false`
/// answers 403 before any profiler work. Set with `guard = path::to::fn` in the attribute
/// or [`ProfilingConfig::with_guard`].
pub type Guard = fn(&Parts) -> bool;

/// The shortest duration any of the `*_default`/`*_max` settings may take.
pub const MIN_DURATION: Duration = Duration::from_secs(1);
/// The longest duration any of the `*_default`/`*_max` settings may take.
pub const MAX_DURATION: Duration = Duration::from_secs(3600);
/// The lowest sampling frequency, in Hz.
pub const MIN_FREQUENCY: u32 = 1;
/// The highest sampling frequency, in Hz. Above it the signal handler's own cost starts to
/// distort what it measures.
pub const MAX_FREQUENCY: u32 = 1000;
/// The fewest CPU profile windows that may share one sampler: 1 is one profile at a time.
pub const MIN_WINDOWS: u32 = 1;
/// The most CPU profile windows that may share one sampler. Each holds its own stack
/// counts while it is open.
pub const MAX_WINDOWS: u32 = 64;

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
    max_windows: u32,
    blocklist: &'static [&'static str],
    heap: bool,
    /// `None`: 10 s, or `heap_max` if that is shorter.
    heap_default: Option<Duration>,
    heap_max: Duration,
    threads: bool,
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
    /// (10 s default window, 30 s max when on); thread dumps on; routes under
    /// `/debug/pprof`; no guard and no token.
    pub const fn new() -> Self {
        Self {
            cpu_default: None,
            cpu_max: Duration::from_secs(60),
            frequency: 99,
            max_windows: 8,
            blocklist: &[],
            heap: false,
            heap_default: None,
            heap_max: Duration::from_secs(30),
            threads: true,
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

    /// Serve the thread dumps `/threads`, `/goroutine` and `/tasks` (on unless set);
    /// `false` leaves them out.
    pub const fn with_threads(mut self, on: bool) -> Self {
        self.threads = on;
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
    /// See [`with_threads`](Self::with_threads).
    pub const fn threads(&self) -> bool {
        self.threads
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

    /// Checks every rule; the first broken one is returned.
    pub const fn validate(&self) -> Result<(), ConfigError> {
        if let Err(e) = check_duration(DurationField::CpuDefault, self.cpu_default()) {
            return Err(e);
        }
        if let Err(e) = check_duration(DurationField::CpuMax, self.cpu_max) {
            return Err(e);
        }
        if self.cpu_default().as_nanos() > self.cpu_max.as_nanos() {
            return Err(ConfigError::DefaultAboveMax {
                default_field: DurationField::CpuDefault,
                default: self.cpu_default(),
                max_field: DurationField::CpuMax,
                max: self.cpu_max,
            });
        }
        if self.frequency < MIN_FREQUENCY || self.frequency > MAX_FREQUENCY {
            return Err(ConfigError::FrequencyOutOfRange {
                found: self.frequency,
            });
        }
        if self.max_windows < MIN_WINDOWS || self.max_windows > MAX_WINDOWS {
            return Err(ConfigError::WindowsOutOfRange {
                found: self.max_windows,
            });
        }
        let mut index = 0;
        while index < self.blocklist.len() {
            if is_blank(self.blocklist[index]) {
                return Err(ConfigError::BlankBlocklistEntry { index });
            }
            index += 1;
        }
        if let Err(e) = check_duration(DurationField::HeapDefault, self.heap_default()) {
            return Err(e);
        }
        if let Err(e) = check_duration(DurationField::HeapMax, self.heap_max) {
            return Err(e);
        }
        if self.heap_default().as_nanos() > self.heap_max.as_nanos() {
            return Err(ConfigError::DefaultAboveMax {
                default_field: DurationField::HeapDefault,
                default: self.heap_default(),
                max_field: DurationField::HeapMax,
                max: self.heap_max,
            });
        }
        if let Some(reason) = prefix_problem(self.prefix) {
            return Err(ConfigError::InvalidPrefix {
                prefix: self.prefix,
                reason,
            });
        }
        if let Some(name) = self.token_env
            && !is_env_name(name)
        {
            return Err(ConfigError::InvalidTokenEnv { name });
        }
        Ok(())
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

const fn check_duration(field: DurationField, value: Duration) -> Result<(), ConfigError> {
    if value.as_nanos() < MIN_DURATION.as_nanos() || value.as_nanos() > MAX_DURATION.as_nanos() {
        Err(ConfigError::DurationOutOfRange {
            field,
            found: value,
        })
    } else {
        Ok(())
    }
}

const fn is_blank(text: &str) -> bool {
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let (c, len) = char_at(bytes, i);
        if !is_whitespace(c) {
            return false;
        }
        i += len;
    }
    true
}

const fn prefix_problem(prefix: &str) -> Option<&'static str> {
    let bytes = prefix.as_bytes();
    if bytes.is_empty() || bytes[0] != b'/' {
        return Some("it must start with `/`");
    }
    if bytes.len() == 1 {
        return Some("it must name a path below the root, such as \"/debug/pprof\"");
    }
    if bytes[bytes.len() - 1] == b'/' {
        return Some("it must not end with `/`");
    }
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'{' || b == b'}' || b == b'*' || b == b'?' || b == b'#' {
            return Some("it must be a plain path without `{`, `}`, `*`, `?` or `#`");
        }
        let (c, len) = char_at(bytes, i);
        if is_whitespace(c) || is_control(c) {
            return Some("it must not contain spaces or control characters");
        }
        if b == b'/' && i + 1 < bytes.len() {
            if bytes[i + 1] == b'/' {
                return Some("it must not contain empty segments (`//`)");
            }
            if bytes[i + 1] == b':' {
                return Some("its segments must not start with `:` (axum 0.8 reserves it)");
            }
        }
        i += len;
    }
    None
}

const fn is_env_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes[0].is_ascii_digit() {
        return false;
    }
    let mut i = 0;
    while i < bytes.len() {
        if !(bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
            return false;
        }
        i += 1;
    }
    true
}

/// A [`ProfilingConfig`] duration setting, as it is spelled in `#[pprof_routes(...)]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DurationField {
    /// `cpu_default`
    CpuDefault,
    /// `cpu_max`
    CpuMax,
    /// `heap_default`
    HeapDefault,
    /// `heap_max`
    HeapMax,
}

impl DurationField {
    /// The key's name in the attribute.
    pub const fn name(self) -> &'static str {
        match self {
            DurationField::CpuDefault => "cpu_default",
            DurationField::CpuMax => "cpu_max",
            DurationField::HeapDefault => "heap_default",
            DurationField::HeapMax => "heap_max",
        }
    }
}

/// A broken [`ProfilingConfig`] rule. The `Display` names the setting, the value found and
/// what is allowed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// A duration outside 1 s ..= 1 h.
    DurationOutOfRange {
        /// The setting.
        field: DurationField,
        /// Its value.
        found: Duration,
    },
    /// A `*_default` longer than its `*_max`.
    DefaultAboveMax {
        /// `cpu_default` or `heap_default`.
        default_field: DurationField,
        /// Its value.
        default: Duration,
        /// `cpu_max` or `heap_max`.
        max_field: DurationField,
        /// Its value.
        max: Duration,
    },
    /// A frequency outside 1 ..= 1000 Hz.
    FrequencyOutOfRange {
        /// The value.
        found: u32,
    },
    /// A `max_windows` outside 1 ..= 64.
    WindowsOutOfRange {
        /// The value.
        found: u32,
    },
    /// An empty or blank library name in the blocklist.
    BlankBlocklistEntry {
        /// Its position.
        index: usize,
    },
    /// A prefix that is not a plain absolute path.
    InvalidPrefix {
        /// The prefix.
        prefix: &'static str,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A `token_env` that is not a portable environment variable name.
    InvalidTokenEnv {
        /// The name.
        name: &'static str,
    },
}

impl ConfigError {
    /// The broken rule without the value found: what a compile-time panic can say.
    pub const fn rule(&self) -> &'static str {
        match self {
            ConfigError::DurationOutOfRange { field, .. } => match field {
                DurationField::CpuDefault => {
                    "krabka-pprof: `cpu_default` must be between 1s and 1h"
                }
                DurationField::CpuMax => "krabka-pprof: `cpu_max` must be between 1s and 1h",
                DurationField::HeapDefault => {
                    "krabka-pprof: `heap_default` must be between 1s and 1h"
                }
                DurationField::HeapMax => "krabka-pprof: `heap_max` must be between 1s and 1h",
            },
            ConfigError::DefaultAboveMax { default_field, .. } => match default_field {
                DurationField::HeapDefault | DurationField::HeapMax => {
                    "krabka-pprof: `heap_default` must not exceed `heap_max`"
                }
                DurationField::CpuDefault | DurationField::CpuMax => {
                    "krabka-pprof: `cpu_default` must not exceed `cpu_max`"
                }
            },
            ConfigError::FrequencyOutOfRange { .. } => {
                "krabka-pprof: `frequency` must be between 1 and 1000 Hz"
            }
            ConfigError::WindowsOutOfRange { .. } => {
                "krabka-pprof: `max_windows` must be between 1 and 64"
            }
            ConfigError::BlankBlocklistEntry { .. } => {
                "krabka-pprof: `blocklist` entries must be non-empty library names"
            }
            ConfigError::InvalidPrefix { .. } => {
                "krabka-pprof: `prefix` must be a plain path such as \"/debug/pprof\""
            }
            ConfigError::InvalidTokenEnv { .. } => {
                "krabka-pprof: `token_env` must be an environment variable name"
            }
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = |d: &Duration| humantime::format_duration(*d);
        match self {
            ConfigError::DurationOutOfRange { field, found } => write!(
                f,
                "`{}` must be between {} and {}, found {}",
                field.name(),
                d(&MIN_DURATION),
                d(&MAX_DURATION),
                d(found)
            ),
            ConfigError::DefaultAboveMax {
                default_field,
                default,
                max_field,
                max,
            } => write!(
                f,
                "`{}` must not exceed `{}` ({}), found {}",
                default_field.name(),
                max_field.name(),
                d(max),
                d(default)
            ),
            ConfigError::FrequencyOutOfRange { found } => write!(
                f,
                "`frequency` must be between {MIN_FREQUENCY} and {MAX_FREQUENCY} Hz, found {found}"
            ),
            ConfigError::WindowsOutOfRange { found } => write!(
                f,
                "`max_windows` must be between {MIN_WINDOWS} and {MAX_WINDOWS}, found {found}"
            ),
            ConfigError::BlankBlocklistEntry { index } => write!(
                f,
                "`blocklist` entries must be non-empty library names such as \"libc\", found a blank one at position {index}"
            ),
            ConfigError::InvalidPrefix { prefix, reason } => {
                write!(f, "`prefix` {prefix:?} is not usable: {reason}")
            }
            ConfigError::InvalidTokenEnv { name } => write!(
                f,
                "`token_env` must be an environment variable name (letters, digits, `_`, not starting with a digit), found {name:?}"
            ),
        }
    }
}

impl std::error::Error for ConfigError {}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn every_setting_reads_back_what_was_set() {
        fn admit(parts: &Parts) -> bool {
            parts.method == axum::http::Method::GET
        }
        let c = ProfilingConfig::new()
            .with_cpu_default(S(5))
            .with_cpu_max(S(7))
            .with_frequency(250)
            .with_max_windows(3)
            .with_blocklist(&["libc"])
            .with_heap(true)
            .with_heap_default(S(2))
            .with_heap_max(S(4))
            .with_threads(false)
            .with_prefix("/pp")
            .with_guard(admit)
            .with_token_env("PPROF_TOKEN");
        assert_eq!(c.validate(), Ok(()));
        assert_eq!((c.cpu_default(), c.cpu_max()), (S(5), S(7)));
        assert_eq!((c.frequency(), c.max_windows()), (250, 3));
        assert_eq!(c.blocklist(), ["libc"]);
        assert!(c.heap());
        assert_eq!((c.heap_default(), c.heap_max()), (S(2), S(4)));
        assert!(!c.threads());
        assert_eq!(c.prefix(), "/pp");
        let guard = c.guard().expect("the guard set");
        let (get, _) = axum::http::Request::get("/").body(()).unwrap().into_parts();
        let (post, _) = axum::http::Request::post("/")
            .body(())
            .unwrap()
            .into_parts();
        assert!(
            guard(&get) && !guard(&post),
            "the function set, not another"
        );
        assert_eq!(c.token_env(), Some("PPROF_TOKEN"));
    }

    #[test]
    fn defaults_are_valid_and_documented() {
        let c = ProfilingConfig::default();
        assert_eq!(c.validate(), Ok(()));
        assert_eq!(c.cpu_default(), S(30));
        assert_eq!(c.cpu_max(), S(60));
        assert_eq!(c.frequency(), 99);
        assert!(c.blocklist().is_empty(), "unwind through every library");
        assert!(!c.heap());
        assert_eq!((c.heap_default(), c.heap_max()), (S(10), S(30)));
        assert!(c.threads(), "thread dumps on");
        assert_eq!(c.prefix(), "/debug/pprof");
        assert!(c.guard().is_none() && c.token_env().is_none());
    }

    #[test]
    fn cpu_max_bounds() {
        let base = ProfilingConfig::new().with_cpu_default(S(1));
        assert_eq!(base.with_cpu_max(S(1)).validate(), Ok(()));
        assert_eq!(base.with_cpu_max(S(3600)).validate(), Ok(()));
        let low = base
            .with_cpu_max(Duration::from_millis(999))
            .validate()
            .unwrap_err();
        assert_eq!(
            low.to_string(),
            "`cpu_max` must be between 1s and 1h, found 999ms"
        );
        let high = base.with_cpu_max(S(3601)).validate().unwrap_err();
        assert_eq!(
            high.to_string(),
            "`cpu_max` must be between 1s and 1h, found 1h 1s"
        );
    }

    #[test]
    fn cpu_default_bounds() {
        let c = ProfilingConfig::new();
        assert_eq!(c.with_cpu_default(S(1)).validate(), Ok(()));
        assert_eq!(c.with_cpu_default(S(60)).validate(), Ok(()));
        let low = c
            .with_cpu_default(Duration::from_millis(500))
            .validate()
            .unwrap_err();
        assert!(matches!(
            low,
            ConfigError::DurationOutOfRange {
                field: DurationField::CpuDefault,
                ..
            }
        ));
        let above = c.with_cpu_default(S(61)).validate().unwrap_err();
        assert_eq!(
            above.to_string(),
            "`cpu_default` must not exceed `cpu_max` (1m), found 1m 1s"
        );
        assert_eq!(
            c.with_cpu_max(S(10)).validate(),
            Ok(()),
            "an unset default follows the max"
        );
        assert_eq!(c.with_cpu_max(S(10)).cpu_default(), S(10));
        assert_eq!(c.with_cpu_max(S(45)).cpu_default(), S(30));
        assert_eq!(
            c.with_cpu_default(S(20))
                .with_cpu_max(S(10))
                .validate()
                .unwrap_err()
                .rule(),
            "krabka-pprof: `cpu_default` must not exceed `cpu_max`"
        );
    }

    #[test]
    fn frequency_bounds() {
        let c = ProfilingConfig::new();
        assert_eq!(c.with_frequency(1).validate(), Ok(()));
        assert_eq!(c.with_frequency(1000).validate(), Ok(()));
        assert_eq!(
            c.with_frequency(0).validate().unwrap_err().to_string(),
            "`frequency` must be between 1 and 1000 Hz, found 0"
        );
        assert!(c.with_frequency(1001).validate().is_err());
    }

    #[test]
    fn max_windows_bounds() {
        let c = ProfilingConfig::new();
        assert_eq!(c.max_windows(), 8);
        assert_eq!(c.with_max_windows(1).validate(), Ok(()));
        assert_eq!(c.with_max_windows(64).validate(), Ok(()));
        assert_eq!(
            c.with_max_windows(0).validate().unwrap_err().to_string(),
            "`max_windows` must be between 1 and 64, found 0"
        );
        assert_eq!(
            c.with_max_windows(65).validate().unwrap_err().rule(),
            "krabka-pprof: `max_windows` must be between 1 and 64"
        );
    }

    #[test]
    fn heap_bounds() {
        let c = ProfilingConfig::new().with_heap(true);
        assert_eq!(c.with_heap_default(S(1)).validate(), Ok(()));
        assert_eq!(c.with_heap_default(S(30)).validate(), Ok(()));
        assert!(c.with_heap_default(S(31)).validate().is_err());
        assert!(
            c.with_heap_default(Duration::from_millis(999))
                .validate()
                .is_err()
        );
        assert_eq!(c.with_heap_max(S(3600)).validate(), Ok(()));
        assert!(c.with_heap_max(S(3601)).validate().is_err());
        assert_eq!(
            c.with_heap_max(S(5)).heap_default(),
            S(5),
            "an unset default follows the max"
        );
        assert!(
            c.with_heap_default(S(6))
                .with_heap_max(S(5))
                .validate()
                .is_err()
        );
    }

    #[test]
    fn blocklist_rules() {
        let c = ProfilingConfig::new();
        assert_eq!(c.with_blocklist(&[]).validate(), Ok(()));
        assert_eq!(
            c.with_blocklist(&["libc", " "]).validate(),
            Err(ConfigError::BlankBlocklistEntry { index: 1 })
        );
        assert!(c.with_blocklist(&[""]).validate().is_err());
    }

    #[test]
    fn prefix_rules() {
        let c = ProfilingConfig::new();
        assert_eq!(c.with_prefix("/x").validate(), Ok(()));
        assert_eq!(c.with_prefix("/internal/debug/pprof").validate(), Ok(()));
        for bad in [
            "", "x", "/", "/x/", "/{id}", "/a/*r", "/a b", "/a//b", "/:id", "/a?b", "/a#b",
        ] {
            assert!(
                matches!(
                    c.with_prefix(bad).validate(),
                    Err(ConfigError::InvalidPrefix { .. })
                ),
                "{bad:?} should be rejected"
            );
        }
    }

    #[test]
    fn token_env_rules() {
        let c = ProfilingConfig::new();
        assert_eq!(c.with_token_env("PPROF_TOKEN").validate(), Ok(()));
        assert_eq!(c.with_token_env("_t9").validate(), Ok(()));
        for bad in ["", "9X", "A-B", "A B"] {
            assert!(c.with_token_env(bad).validate().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn checked_is_usable_in_const() {
        const C: ProfilingConfig = ProfilingConfig::new().with_frequency(250).checked();
        assert_eq!(C.frequency(), 250);
    }

    #[test]
    #[should_panic(expected = "`frequency` must be between 1 and 1000 Hz")]
    fn checked_panics_with_the_rule() {
        let _ = std::hint::black_box(ProfilingConfig::new().with_frequency(0)).checked();
    }
}
