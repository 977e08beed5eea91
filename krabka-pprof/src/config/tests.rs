//! The config's rules and builders, value by value.

use super::*;
use axum::http::request::Parts;

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
        .with_alloc_stacks(100)
        .with_threads(false)
        .with_recent(S(300))
        .with_recent_memory(1 << 20)
        .with_prefix("/pp")
        .with_guard(admit)
        .with_token_env("PPROF_TOKEN");
    assert_eq!(c.validate(), Ok(()));
    assert_eq!((c.cpu_default(), c.cpu_max()), (S(5), S(7)));
    assert_eq!((c.frequency(), c.max_windows()), (250, 3));
    assert_eq!(c.blocklist(), ["libc"]);
    assert!(c.heap());
    assert_eq!((c.heap_default(), c.heap_max()), (S(2), S(4)));
    assert_eq!(c.alloc_stacks(), 100);
    assert!(!c.threads());
    assert_eq!((c.recent(), c.recent_memory()), (Some(S(300)), 1 << 20));
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
    assert_eq!(c.alloc_stacks(), 4096, "allocation counts on");
    assert!(c.threads(), "thread dumps on");
    assert_eq!(c.recent(), None, "no recorder");
    assert_eq!(c.recent_memory(), 8 * 1024 * 1024);
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
fn frequency_max_bounds_and_its_relation_to_frequency() {
    let c = ProfilingConfig::new();
    assert_eq!(c.frequency_max(), 250, "unset: 250 Hz");
    assert_eq!(
        c.with_frequency(400).frequency_max(),
        400,
        "unset: at least frequency"
    );
    assert_eq!(c.with_frequency_max(1000).validate(), Ok(()));
    assert_eq!(
        c.with_frequency_max(0).validate().unwrap_err().to_string(),
        "`frequency_max` must be between 1 and 1000 Hz, found 0"
    );
    assert!(c.with_frequency_max(1001).validate().is_err());
    assert_eq!(
        c.with_frequency(200)
            .with_frequency_max(100)
            .validate()
            .unwrap_err()
            .to_string(),
        "`frequency` must not exceed `frequency_max` (100 Hz), found 200"
    );
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
fn recent_bounds() {
    let c = ProfilingConfig::new();
    assert_eq!(c.with_recent(S(10)).validate(), Ok(()));
    assert_eq!(c.with_recent(S(3600)).validate(), Ok(()));
    assert_eq!(
        c.with_recent(Duration::from_millis(9_999))
            .validate()
            .unwrap_err()
            .to_string(),
        "`recent` must be between 10s and 1h, found 9s 999ms"
    );
    let high = c.with_recent(S(3601)).validate().unwrap_err();
    assert_eq!(high, ConfigError::RecentOutOfRange { found: S(3601) });
    assert_eq!(
        high.rule(),
        "krabka-pprof: `recent` must be between 10s and 1h"
    );
}

#[test]
fn push_needs_the_recorder_and_an_interval_that_divides_a_minute() {
    let c = ProfilingConfig::new().with_recent(S(600));
    assert_eq!(c.push_interval(), S(15), "the default interval");
    assert!(!c.push(), "off unless set");
    assert_eq!(c.with_push(true).validate(), Ok(()));
    for seconds in [1, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30, 60] {
        assert_eq!(
            c.with_push(true).with_push_interval(S(seconds)).validate(),
            Ok(()),
            "{seconds} s divides a minute"
        );
    }
    for bad in [
        Duration::ZERO,
        S(7),
        S(45),
        S(120),
        Duration::from_millis(1_500),
    ] {
        assert_eq!(
            c.with_push(true).with_push_interval(bad).validate(),
            Err(ConfigError::PushIntervalOutOfRange { found: bad }),
            "{bad:?}"
        );
    }
    assert_eq!(
        c.with_push_interval(S(7))
            .validate()
            .unwrap_err()
            .to_string(),
        "`push_interval` must be whole seconds from 1s to 1m that divide a minute (1s, 2s, \
         3s, 4s, 5s, 6s, 10s, 12s, 15s, 20s, 30s, 60s), found 7s"
    );
    // The history holds a window and the time it takes to be sent.
    assert_eq!(
        c.with_recent(S(24)).with_push(true).validate(),
        Err(ConfigError::RecentBelowPushInterval {
            recent: S(24),
            interval: S(15)
        })
    );
    assert_eq!(c.with_recent(S(25)).with_push(true).validate(), Ok(()));
    assert_eq!(
        c.with_recent(S(69))
            .with_push(true)
            .with_push_interval(S(60))
            .validate()
            .unwrap_err()
            .to_string(),
        "with `push`, `recent` must keep at least `push_interval` (1m) + 10s of history, so \
         that each window is still there when it is sent; found 1m 9s"
    );
    let alone = ProfilingConfig::new()
        .with_push(true)
        .validate()
        .unwrap_err();
    assert_eq!(alone, ConfigError::PushWithoutRecent);
    assert!(
        alone.to_string().contains("add `recent = \"10m\"`"),
        "{alone}"
    );
    assert_eq!(
        alone.rule(),
        "krabka-pprof: `push` needs `recent`: the recorder's history is what is pushed"
    );
}

#[test]
fn recent_memory_bounds() {
    let c = ProfilingConfig::new().with_recent(S(600));
    assert_eq!(c.with_recent_memory(256 * 1024).validate(), Ok(()));
    assert_eq!(c.with_recent_memory(1 << 30).validate(), Ok(()));
    assert_eq!(
        c.with_recent_memory(256 * 1024 - 1)
            .validate()
            .unwrap_err()
            .to_string(),
        "`recent_memory` must be between 256KiB and 1GiB, found 262143B"
    );
    assert_eq!(
        c.with_recent_memory((1 << 30) + (1 << 20))
            .validate()
            .unwrap_err()
            .to_string(),
        "`recent_memory` must be between 256KiB and 1GiB, found 1025MiB"
    );
    assert_eq!(
        c.with_recent_memory(0).validate().unwrap_err().rule(),
        "krabka-pprof: `recent_memory` must be between 256KiB and 1GiB"
    );
    // Checked also without `recent`, as `heap_max` is without `heap`: a config is
    // valid or not whatever else it sets.
    assert!(
        ProfilingConfig::new()
            .with_recent_memory(1)
            .validate()
            .is_err()
    );
}

#[test]
fn sizes_are_written_as_the_attribute_writes_them() {
    for (bytes, text) in [
        (0, "0B"),
        (1000, "1000B"),
        (1024, "1KiB"),
        (1536 * 1024, "1536KiB"),
        (8 << 20, "8MiB"),
        (1 << 30, "1GiB"),
        ((1 << 30) + (1 << 20), "1025MiB"),
    ] {
        assert_eq!(Bytes(bytes).to_string(), text);
    }
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

#[test]
fn alloc_stacks_bounds() {
    let c = ProfilingConfig::new().with_heap(true);
    for ok in [0, 64, 4096, 65_536] {
        assert_eq!(c.with_alloc_stacks(ok).validate(), Ok(()), "{ok}");
    }
    assert_eq!(
        c.with_alloc_stacks(63).validate().unwrap_err().to_string(),
        "`alloc_stacks` must be 0 (no allocation counts) or between 64 and 65536, found 63"
    );
    assert_eq!(
        c.with_alloc_stacks(1).validate().unwrap_err().to_string(),
        "`alloc_stacks` must be 0 (no allocation counts) or between 64 and 65536, found 1"
    );
    assert_eq!(
        c.with_alloc_stacks(65_537).validate().unwrap_err().rule(),
        "krabka-pprof: `alloc_stacks` must be 0 (no allocation counts) or between 64 and 65536"
    );
}
