//! What a broken rule of a `ProfilingConfig` says: one value
//! per rule, with a `Display` a person can act on, and the same sentence at compile time
//! (`rule`, for `checked`'s panic).

use std::fmt;
use std::time::Duration;

use super::bounds::{
    MAX_ALLOC_STACKS, MAX_DURATION, MAX_FREQUENCY, MAX_PUSH_INTERVAL, MAX_RECENT,
    MAX_RECENT_MEMORY, MAX_WINDOWS, MIN_ALLOC_STACKS, MIN_DURATION, MIN_FREQUENCY,
    MIN_PUSH_INTERVAL, MIN_RECENT, MIN_RECENT_MEMORY, MIN_WINDOWS,
};

/// A `ProfilingConfig` duration setting, as it is spelled in `#[pprof_routes(...)]`.
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

/// A broken [`ProfilingConfig`](super::ProfilingConfig) rule. The `Display` names the
/// setting, the value found and what is allowed.
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
    /// A `frequency_max` outside 1 ..= 1000 Hz.
    FrequencyMaxOutOfRange {
        /// The value.
        found: u32,
    },
    /// A `frequency_max` below `frequency`.
    FrequencyAboveMax {
        /// `frequency`.
        frequency: u32,
        /// `frequency_max`.
        max: u32,
    },
    /// A `max_windows` outside 1 ..= 64.
    WindowsOutOfRange {
        /// The value.
        found: u32,
    },
    /// An `alloc_stacks` other than 0 outside 64 ..= 65536.
    AllocStacksOutOfRange {
        /// The value.
        found: u32,
    },
    /// A `recent` outside 10 s ..= 1 h.
    RecentOutOfRange {
        /// The value.
        found: Duration,
    },
    /// A `recent_memory` outside 256 KiB ..= 1 GiB.
    RecentMemoryOutOfRange {
        /// The value, in bytes.
        found: usize,
    },
    /// A `push_interval` that is not whole seconds from 1 s to 60 s dividing a minute.
    PushIntervalOutOfRange {
        /// The value.
        found: Duration,
    },
    /// `push` without `recent`: the recorder's history is what is pushed.
    PushWithoutRecent,
    /// A `recent` shorter than `push_interval` + 10 s: the pusher would find its windows
    /// dropped before it takes them.
    RecentBelowPushInterval {
        /// `recent`.
        recent: Duration,
        /// `push_interval`.
        interval: Duration,
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
            ConfigError::FrequencyMaxOutOfRange { .. } => {
                "krabka-pprof: `frequency_max` must be between 1 and 1000 Hz"
            }
            ConfigError::FrequencyAboveMax { .. } => {
                "krabka-pprof: `frequency` must not exceed `frequency_max`"
            }
            ConfigError::WindowsOutOfRange { .. } => {
                "krabka-pprof: `max_windows` must be between 1 and 64"
            }
            ConfigError::AllocStacksOutOfRange { .. } => {
                "krabka-pprof: `alloc_stacks` must be 0 (no allocation counts) or between 64 and 65536"
            }
            ConfigError::RecentOutOfRange { .. } => {
                "krabka-pprof: `recent` must be between 10s and 1h"
            }
            ConfigError::RecentMemoryOutOfRange { .. } => {
                "krabka-pprof: `recent_memory` must be between 256KiB and 1GiB"
            }
            ConfigError::PushIntervalOutOfRange { .. } => {
                "krabka-pprof: `push_interval` must be whole seconds from 1s to 60s that divide a minute"
            }
            ConfigError::PushWithoutRecent => {
                "krabka-pprof: `push` needs `recent`: the recorder's history is what is pushed"
            }
            ConfigError::RecentBelowPushInterval { .. } => {
                "krabka-pprof: with `push`, `recent` must be at least `push_interval` + 10s"
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
            ConfigError::FrequencyMaxOutOfRange { found } => write!(
                f,
                "`frequency_max` must be between {MIN_FREQUENCY} and {MAX_FREQUENCY} Hz, found \
                 {found}"
            ),
            ConfigError::FrequencyAboveMax { frequency, max } => write!(
                f,
                "`frequency` must not exceed `frequency_max` ({max} Hz), found {frequency}"
            ),
            ConfigError::WindowsOutOfRange { found } => write!(
                f,
                "`max_windows` must be between {MIN_WINDOWS} and {MAX_WINDOWS}, found {found}"
            ),
            ConfigError::AllocStacksOutOfRange { found } => write!(
                f,
                "`alloc_stacks` must be 0 (no allocation counts) or between {MIN_ALLOC_STACKS} and {MAX_ALLOC_STACKS}, found {found}"
            ),
            ConfigError::RecentOutOfRange { found } => write!(
                f,
                "`recent` must be between {} and {}, found {}",
                d(&MIN_RECENT),
                d(&MAX_RECENT),
                d(found)
            ),
            ConfigError::RecentMemoryOutOfRange { found } => write!(
                f,
                "`recent_memory` must be between {} and {}, found {}",
                Bytes(MIN_RECENT_MEMORY),
                Bytes(MAX_RECENT_MEMORY),
                Bytes(*found)
            ),
            ConfigError::PushIntervalOutOfRange { found } => write!(
                f,
                "`push_interval` must be whole seconds from {} to {} that divide a minute \
                 (1s, 2s, 3s, 4s, 5s, 6s, 10s, 12s, 15s, 20s, 30s, 60s), found {}",
                d(&MIN_PUSH_INTERVAL),
                d(&MAX_PUSH_INTERVAL),
                d(found)
            ),
            ConfigError::RecentBelowPushInterval { recent, interval } => write!(
                f,
                "with `push`, `recent` must keep at least `push_interval` ({}) + {} of \
                 history, so that each window is still there when it is sent; found {}",
                d(interval),
                d(&super::bounds::PUSH_HISTORY_MARGIN),
                d(recent)
            ),
            ConfigError::PushWithoutRecent => write!(
                f,
                "`push` needs `recent`: the recorder's history is what is pushed; add \
                 `recent = \"10m\"` (with_recent) or remove `push`"
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

/// A size as the attribute writes it: the largest of GiB, MiB, KiB that divides it
/// exactly, else bytes (`8MiB`, `1536KiB`, `1000B`); the macro's `size::format` twin.
pub(crate) struct Bytes(pub(crate) usize);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bytes = self.0;
        for (unit, size) in [("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
            if bytes >= size && bytes.is_multiple_of(size) {
                return write!(f, "{}{unit}", bytes / size);
            }
        }
        write!(f, "{bytes}B")
    }
}
