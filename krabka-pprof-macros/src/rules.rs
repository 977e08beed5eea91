//! The attribute's value rules: the macro-side twin of `ProfilingConfig::validate` in
//! `krabka-pprof/src/config.rs`, with the same bounds under the same names, here with a
//! message for the offending token. The two files change together.
//!
//! The expansion builds its config in an inline `const` through `ProfilingConfig::checked`,
//! so a value this file lets through that config.rs refuses still stops the build, only
//! with the runtime's plainer message. These cases under `ui-tests/tests/ui/` pin the
//! rules, and the pass cases their bounds:
//! `fail/cpu_max_below_one_second`, `fail/cpu_max_above_one_hour`,
//! `fail/cpu_default_above_cpu_max`, `fail/frequency_zero`, `fail/frequency_above_1000`,
//! `fail/blocklist_empty_name`, `fail/prefix_without_leading_slash`,
//! `fail/prefix_with_trailing_slash`, `fail/prefix_with_capture`,
//! `fail/token_env_not_a_variable_name`, `fail/all_value_errors_at_once`,
//! `fail/cpu_default_below_one_second`, `fail/heap_max_above_one_hour`,
//! `fail/heap_default_above_heap_max`, `fail/prefix_with_empty_segment`,
//! `fail/prefix_with_colon_segment`, `fail/max_windows_zero`, `fail/max_windows_above_64`,
//! `fail/alloc_stacks_below_64`, `fail/alloc_stacks_without_heap`,
//! `fail/recent_below_ten_seconds`, `fail/recent_above_one_hour`,
//! `fail/recent_memory_below_256_kib`, `fail/recent_memory_above_1_gib`,
//! `pass/every_key_at_its_bounds` and `pass/cpu_max_below_builtin_default`; and
//! `src/properties.rs` checks, value by value, that these rules accept exactly what
//! `validate` accepts.
//!
//! Rules the runtime has no twin for stay with the syntax: value types in `values.rs`,
//! keys in `keys.rs`, heap keys only with `heap = true` and `recent_memory` only with
//! `recent` in `args.rs`. Like config.rs, this file knows no spans and imports nothing but
//! `duration.rs` and `size.rs`: callers put its messages on the user's tokens.

use std::time::Duration;

use crate::duration;
use crate::size;

/// `MIN_DURATION` in config.rs.
pub(crate) const MIN_DURATION: Duration = Duration::from_secs(1);
/// `MAX_DURATION` in config.rs.
pub(crate) const MAX_DURATION: Duration = Duration::from_secs(3600);
/// `MIN_FREQUENCY` in config.rs.
pub(crate) const MIN_FREQUENCY: u32 = 1;
/// `MAX_FREQUENCY` in config.rs.
pub(crate) const MAX_FREQUENCY: u32 = 1000;
/// `MIN_WINDOWS` in config.rs.
pub(crate) const MIN_WINDOWS: u32 = 1;
/// `MAX_WINDOWS` in config.rs.
pub(crate) const MAX_WINDOWS: u32 = 64;
/// `MIN_ALLOC_STACKS` in config.rs.
pub(crate) const MIN_ALLOC_STACKS: u32 = 64;
/// `MAX_ALLOC_STACKS` in config.rs.
pub(crate) const MAX_ALLOC_STACKS: u32 = 65_536;
/// `MIN_RECENT` in config.rs.
pub(crate) const MIN_RECENT: Duration = Duration::from_secs(10);
/// `MAX_RECENT` in config.rs.
pub(crate) const MAX_RECENT: Duration = Duration::from_secs(3600);
/// `MIN_RECENT_MEMORY` in config.rs, bytes.
pub(crate) const MIN_RECENT_MEMORY: u64 = 256 * 1024;
/// `MAX_RECENT_MEMORY` in config.rs, bytes.
pub(crate) const MAX_RECENT_MEMORY: u64 = 1024 * 1024 * 1024;
/// `MIN_PUSH_INTERVAL` in config.rs.
pub(crate) const MIN_PUSH_INTERVAL: Duration = Duration::from_secs(1);
/// `MAX_PUSH_INTERVAL` in config.rs.
pub(crate) const MAX_PUSH_INTERVAL: Duration = Duration::from_secs(60);
/// `PUSH_HISTORY_MARGIN` in config.rs.
pub(crate) const PUSH_HISTORY_MARGIN: Duration = Duration::from_secs(10);
/// `push_interval` in `ProfilingConfig::new()`.
pub(crate) const DEFAULT_PUSH_INTERVAL: Duration = Duration::from_secs(15);
/// `cpu_max` in `ProfilingConfig::new()`.
pub(crate) const DEFAULT_CPU_MAX: Duration = Duration::from_secs(60);
/// `heap_max` in `ProfilingConfig::new()`.
pub(crate) const DEFAULT_HEAP_MAX: Duration = Duration::from_secs(30);

/// Every `*_default`/`*_max` lies within `MIN_DURATION ..= MAX_DURATION`
/// (`check_duration` in config.rs). The error is the whole message.
pub(crate) fn check_duration(key: &str, value: Duration) -> Result<(), String> {
    if value < MIN_DURATION || value > MAX_DURATION {
        return Err(format!(
            "`{key}` must be between {} and {}, found {}",
            duration::format(MIN_DURATION),
            duration::format(MAX_DURATION),
            duration::format(value),
        ));
    }
    Ok(())
}

/// A written `*_default` does not exceed its `*_max`, written (`Some`) or built in (the
/// `DefaultAboveMax` checks in `ProfilingConfig::validate`). Unset, the default is the
/// built-in one or the maximum, whichever is shorter, so it can only break the rule when
/// written. The error is the whole message; the caller puts it on the default's token.
pub(crate) fn check_default_within_max(
    (default_key, default): (&str, Duration),
    (max_key, max, builtin_max): (&str, Option<Duration>, Duration),
) -> Result<(), String> {
    match max {
        None if default > builtin_max => Err(format!(
            "`{default_key}` must not exceed `{max_key}` (default {}), found {}; raise `{max_key}` too",
            duration::format(builtin_max),
            duration::format(default),
        )),
        Some(max) if default > max => Err(format!(
            "`{default_key}` must not exceed `{max_key}` ({}), found {}",
            duration::format(max),
            duration::format(default),
        )),
        _ => Ok(()),
    }
}

/// `recent` lies within `MIN_RECENT ..= MAX_RECENT` (the `RecentOutOfRange` check in
/// `ProfilingConfig::validate`). The error is the whole message.
pub(crate) fn check_recent(value: Duration) -> Result<(), String> {
    if value < MIN_RECENT || value > MAX_RECENT {
        return Err(format!(
            "`recent` must be between {} and {}, found {}",
            duration::format(MIN_RECENT),
            duration::format(MAX_RECENT),
            duration::format(value),
        ));
    }
    Ok(())
}

/// `push_interval` is whole seconds within `MIN_PUSH_INTERVAL ..= MAX_PUSH_INTERVAL`
/// that divide a minute (the `PushIntervalOutOfRange` check in
/// `ProfilingConfig::validate`). The error is the whole message.
pub(crate) fn check_push_interval(value: Duration) -> Result<(), String> {
    let seconds = value.as_secs();
    if value.subsec_nanos() != 0
        || value < MIN_PUSH_INTERVAL
        || value > MAX_PUSH_INTERVAL
        || 60 % seconds != 0
    {
        return Err(format!(
            "`push_interval` must be whole seconds from {} to {} that divide a minute (1s, \
             2s, 3s, 4s, 5s, 6s, 10s, 12s, 15s, 20s, 30s, 60s), found {}",
            duration::format(MIN_PUSH_INTERVAL),
            duration::format(MAX_PUSH_INTERVAL),
            duration::format(value),
        ));
    }
    Ok(())
}

/// With `push`, `recent` keeps at least `push_interval` + `PUSH_HISTORY_MARGIN` (the
/// `RecentBelowPushInterval` check in `ProfilingConfig::validate`). The error is the
/// whole message.
pub(crate) fn check_recent_for_push(recent: Duration, interval: Duration) -> Result<(), String> {
    if recent < interval + PUSH_HISTORY_MARGIN {
        return Err(format!(
            "with `push`, `recent` must keep at least `push_interval` ({}) + {} of history, \
             so that each window is still there when it is sent; found {}",
            duration::format(interval),
            duration::format(PUSH_HISTORY_MARGIN),
            duration::format(recent),
        ));
    }
    Ok(())
}

/// `recent_memory` lies within `MIN_RECENT_MEMORY ..= MAX_RECENT_MEMORY` bytes (the
/// `RecentMemoryOutOfRange` check in `ProfilingConfig::validate`). The error is the whole
/// message.
pub(crate) fn check_recent_memory(bytes: u64) -> Result<(), String> {
    if !(MIN_RECENT_MEMORY..=MAX_RECENT_MEMORY).contains(&bytes) {
        return Err(format!(
            "`recent_memory` must be between {} and {}, found {}",
            size::format(MIN_RECENT_MEMORY),
            size::format(MAX_RECENT_MEMORY),
            size::format(bytes),
        ));
    }
    Ok(())
}

/// The frequency lies within `MIN_FREQUENCY ..= MAX_FREQUENCY` Hz (the
/// `FrequencyOutOfRange` check in `ProfilingConfig::validate`). `found` is the integer as
/// written, in decimal digits, with a leading `-` if negated; the error is the whole
/// message.
pub(crate) fn check_frequency(found: &str) -> Result<u32, String> {
    match found.parse::<u64>() {
        Ok(hz) if (u64::from(MIN_FREQUENCY)..=u64::from(MAX_FREQUENCY)).contains(&hz) => {
            Ok(hz as u32)
        }
        _ => Err(format!(
            "`frequency` must be between {MIN_FREQUENCY} and {MAX_FREQUENCY} Hz, found {found}"
        )),
    }
}

/// The frequency when `frequency` is not written (`ProfilingConfig::new`'s).
pub(crate) const DEFAULT_FREQUENCY: u32 = 99;

/// `frequency_max` lies within `MIN_FREQUENCY ..= MAX_FREQUENCY` Hz (the
/// `FrequencyMaxOutOfRange` check in `ProfilingConfig::validate`). `found` as in
/// [`check_frequency`].
pub(crate) fn check_frequency_max(found: &str) -> Result<u32, String> {
    check_frequency(found).map_err(|message| message.replacen("`frequency`", "`frequency_max`", 1))
}

/// `max_windows` lies within `MIN_WINDOWS ..= MAX_WINDOWS` (the `WindowsOutOfRange` check
/// in `ProfilingConfig::validate`). `found` as in [`check_frequency`].
pub(crate) fn check_max_windows(found: &str) -> Result<u32, String> {
    match found.parse::<u64>() {
        Ok(n) if (u64::from(MIN_WINDOWS)..=u64::from(MAX_WINDOWS)).contains(&n) => Ok(n as u32),
        _ => Err(format!(
            "`max_windows` must be between {MIN_WINDOWS} and {MAX_WINDOWS}, found {found}"
        )),
    }
}

/// `alloc_stacks` is 0 (no allocation counts) or lies within `MIN_ALLOC_STACKS ..=
/// MAX_ALLOC_STACKS` (the `AllocStacksOutOfRange` check in `ProfilingConfig::validate`).
/// `found` as in [`check_frequency`].
pub(crate) fn check_alloc_stacks(found: &str) -> Result<u32, String> {
    match found.parse::<u64>() {
        Ok(0) => Ok(0),
        Ok(n) if (u64::from(MIN_ALLOC_STACKS)..=u64::from(MAX_ALLOC_STACKS)).contains(&n) => {
            Ok(n as u32)
        }
        _ => Err(format!(
            "`alloc_stacks` must be 0 (no allocation counts) or between {MIN_ALLOC_STACKS} and {MAX_ALLOC_STACKS}, found {found}"
        )),
    }
}

/// A blocklist entry that names no library (`is_blank` in config.rs).
pub(crate) fn is_blank(text: &str) -> bool {
    text.trim().is_empty()
}

/// The reason a prefix is not a plain axum path, or `None` if it is one (`prefix_problem`
/// in config.rs).
pub(crate) fn prefix_problem(prefix: &str) -> Option<String> {
    if !prefix.starts_with('/') {
        return Some(format!(
            "`prefix` must start with `/`, found {prefix:?}; write \"/{prefix}\""
        ));
    }
    if prefix.len() > 1 && prefix.ends_with('/') {
        return Some(format!(
            "`prefix` must not end with `/`, found {prefix:?}; write {:?}",
            prefix.trim_end_matches('/')
        ));
    }
    if prefix == "/" {
        return Some(
            "`prefix` must name a path below the root such as \"/debug/pprof\", found \"/\""
                .to_owned(),
        );
    }
    if let Some(bad) = prefix
        .chars()
        .find(|c| matches!(c, '{' | '}' | '*' | '?' | '#') || c.is_whitespace() || c.is_control())
    {
        return Some(format!(
            "`prefix` must be a plain path without {bad:?} (no captures, wildcards, queries or spaces), found {prefix:?}"
        ));
    }
    if prefix.contains("//") {
        return Some(format!(
            "`prefix` must not contain empty segments (`//`), found {prefix:?}"
        ));
    }
    if prefix.split('/').any(|segment| segment.starts_with(':')) {
        return Some(format!(
            "`prefix` segments must not start with `:` (axum 0.8 reserves it), found {prefix:?}"
        ));
    }
    None
}

/// A portable environment variable name: letters, digits and `_`, not starting with a
/// digit (`is_env_name` in config.rs).
pub(crate) fn is_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    match chars.next() {
        Some(first) if first.is_ascii_alphabetic() || first == '_' => {
            chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_rules() {
        assert_eq!(prefix_problem("/debug/pprof"), None);
        assert_eq!(prefix_problem("/x"), None);
        for bad in [
            "debug", "/debug/", "/", "/{id}", "/a/*rest", "/a b", "/a//b", "/:id", "/a?b",
        ] {
            assert!(prefix_problem(bad).is_some(), "{bad} should be rejected");
        }
    }

    #[test]
    fn default_within_max_rules() {
        let (sixty, sixty_one) = (Duration::from_secs(60), Duration::from_secs(61));
        let cpu = |default, max| {
            check_default_within_max(("cpu_default", default), ("cpu_max", max, DEFAULT_CPU_MAX))
        };
        assert_eq!(cpu(sixty, Some(sixty)), Ok(()));
        assert_eq!(cpu(sixty, None), Ok(()), "at the built-in maximum");
        assert_eq!(
            cpu(sixty_one, Some(sixty)),
            Err("`cpu_default` must not exceed `cpu_max` (1m), found 1m 1s".to_owned())
        );
        assert_eq!(
            cpu(sixty_one, None),
            Err(
                "`cpu_default` must not exceed `cpu_max` (default 1m), found 1m 1s; raise `cpu_max` too"
                    .to_owned()
            )
        );
        // A written maximum replaces the built-in one, above it as below it.
        assert_eq!(cpu(sixty_one, Some(Duration::from_secs(120))), Ok(()));
    }

    #[test]
    fn alloc_stacks_rules() {
        for ok in ["0", "64", "4096", "65536"] {
            assert!(check_alloc_stacks(ok).is_ok(), "{ok}");
        }
        for bad in ["1", "63", "65537", "-1", "99999999999999999999"] {
            let message = check_alloc_stacks(bad).unwrap_err();
            assert!(message.ends_with(&format!("found {bad}")), "{message}");
        }
    }

    #[test]
    fn push_interval_rules() {
        for seconds in [1, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30, 60] {
            assert_eq!(check_push_interval(Duration::from_secs(seconds)), Ok(()));
        }
        assert_eq!(
            check_push_interval(Duration::from_secs(7)),
            Err(
                "`push_interval` must be whole seconds from 1s to 1m that divide a minute \
                 (1s, 2s, 3s, 4s, 5s, 6s, 10s, 12s, 15s, 20s, 30s, 60s), found 7s"
                    .to_owned()
            )
        );
        for bad in [0, 500, 1_500, 120_000] {
            assert!(
                check_push_interval(Duration::from_millis(bad)).is_err(),
                "{bad} ms"
            );
        }
    }

    #[test]
    fn recent_rules() {
        assert_eq!(check_recent(Duration::from_secs(10)), Ok(()));
        assert_eq!(check_recent(Duration::from_secs(3600)), Ok(()));
        assert_eq!(
            check_recent(Duration::from_secs(5)),
            Err("`recent` must be between 10s and 1h, found 5s".to_owned())
        );
        assert!(check_recent(Duration::from_secs(3601)).is_err());
        assert_eq!(check_recent_memory(256 * 1024), Ok(()));
        assert_eq!(check_recent_memory(1 << 30), Ok(()));
        assert_eq!(
            check_recent_memory(100 * 1024),
            Err("`recent_memory` must be between 256KiB and 1GiB, found 100KiB".to_owned())
        );
        assert!(check_recent_memory((1 << 30) + 1).is_err());
    }

    #[test]
    fn token_env_rules() {
        assert!(is_env_name("PPROF_TOKEN"));
        assert!(is_env_name("_x1"));
        for bad in ["", "1TOKEN", "MY-TOKEN", "A B", "TÖKEN"] {
            assert!(!is_env_name(bad), "{bad} should be rejected");
        }
    }
}
