//! The rules a [`ProfilingConfig`] must obey, as `const fn`s so that a config built in a
//! `const` (as the attribute's expansion builds it) is checked by the compiler. The
//! macro's twin is `krabka-pprof-macros/src/rules.rs`: same bounds, same names.

use std::time::Duration;

use super::ProfilingConfig;
use super::bounds::{
    MAX_ALLOC_STACKS, MAX_DURATION, MAX_FREQUENCY, MAX_PUSH_INTERVAL, MAX_RECENT,
    MAX_RECENT_MEMORY, MAX_WINDOWS, MIN_ALLOC_STACKS, MIN_DURATION, MIN_FREQUENCY,
    MIN_PUSH_INTERVAL, MIN_RECENT, MIN_RECENT_MEMORY, MIN_WINDOWS, PUSH_HISTORY_MARGIN,
};
use super::chars::{char_at, is_control, is_whitespace};
use super::error::{ConfigError, DurationField};

impl ProfilingConfig {
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
        if let Some(hz) = self.frequency_max {
            if hz < MIN_FREQUENCY || hz > MAX_FREQUENCY {
                return Err(ConfigError::FrequencyMaxOutOfRange { found: hz });
            }
            if hz < self.frequency {
                return Err(ConfigError::FrequencyAboveMax {
                    frequency: self.frequency,
                    max: hz,
                });
            }
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
        if self.alloc_stacks != 0
            && (self.alloc_stacks < MIN_ALLOC_STACKS || self.alloc_stacks > MAX_ALLOC_STACKS)
        {
            return Err(ConfigError::AllocStacksOutOfRange {
                found: self.alloc_stacks,
            });
        }
        if let Some(keep) = self.recent
            && (keep.as_nanos() < MIN_RECENT.as_nanos() || keep.as_nanos() > MAX_RECENT.as_nanos())
        {
            return Err(ConfigError::RecentOutOfRange { found: keep });
        }
        if self.recent_memory < MIN_RECENT_MEMORY || self.recent_memory > MAX_RECENT_MEMORY {
            return Err(ConfigError::RecentMemoryOutOfRange {
                found: self.recent_memory,
            });
        }
        if !push_interval_fits(self.push_interval) {
            return Err(ConfigError::PushIntervalOutOfRange {
                found: self.push_interval,
            });
        }
        if self.push {
            let Some(recent) = self.recent else {
                return Err(ConfigError::PushWithoutRecent);
            };
            if recent.as_nanos() < self.push_interval.as_nanos() + PUSH_HISTORY_MARGIN.as_nanos() {
                return Err(ConfigError::RecentBelowPushInterval {
                    recent,
                    interval: self.push_interval,
                });
            }
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

/// A push interval is whole seconds within its bounds that divide a minute.
pub(crate) const fn push_interval_fits(interval: Duration) -> bool {
    interval.subsec_nanos() == 0
        && interval.as_secs() >= MIN_PUSH_INTERVAL.as_secs()
        && interval.as_secs() <= MAX_PUSH_INTERVAL.as_secs()
        && 60 % interval.as_secs() == 0
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
