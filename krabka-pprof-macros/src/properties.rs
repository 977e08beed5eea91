//! Property tests of the attribute's entry point: no argument list, however strange,
//! makes it panic or drop the function; and its rules (`rules.rs`) accept exactly the
//! configurations the runtime's `ProfilingConfig::validate` accepts, value by value, so
//! that the two stay one truth.

use std::time::Duration;

use proc_macro2::TokenStream;
use proptest::prelude::*;

use krabka_pprof::ProfilingConfig;

use crate::expand::expand;

/// What the attribute says of `attr` on a plain function: `true` if it expands to the
/// function with the routes merged, `false` if it reports errors (and still emits the
/// function). Panics, failing the property, if the function is missing.
fn accepts(attr: TokenStream) -> bool {
    let item: TokenStream = "fn app() -> Router { Router::new() }".parse().unwrap();
    let out = expand(attr, item).to_string();
    assert!(out.contains("fn app"), "the function was dropped: {out}");
    let refused = out.contains("compile_error");
    assert!(
        refused || out.contains("__private :: merge"),
        "neither an error nor the merge: {out}"
    );
    !refused
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// One balanced piece of an argument list: keys valid and not, punctuation, literals of
/// every kind, arrays, paths.
fn fragment() -> impl Strategy<Value = String> {
    // Every key the attribute knows, and a few it does not.
    let keys = prop::sample::select(
        crate::keys::KEYS
            .iter()
            .copied()
            .chain(["seconds", "Frequency", "r#heap"])
            .collect::<Vec<_>>(),
    )
    .prop_map(str::to_owned);
    prop_oneof![
        keys,
        prop::sample::select(vec!["=", ",", "::", "-", "#", ";", "=="]).prop_map(str::to_owned),
        any::<String>().prop_map(|s| format!("{s:?}")),
        prop::sample::select(vec!["30s", "1h", "0s", "500ms", "61m", "", " ", "1 h"])
            .prop_map(|s| format!("{s:?}")),
        any::<i64>().prop_map(|n| n.to_string()),
        any::<u64>().prop_map(|n| format!("{n}u32")),
        any::<f32>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| format!("{f:?}")),
        any::<bool>().prop_map(|b| b.to_string()),
        prop::collection::vec(any::<String>(), 0..3).prop_map(|items| format!(
            "[{}]",
            items
                .iter()
                .map(|s| format!("{s:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        )),
        Just("some::path".to_owned()),
        Just("(1, 2)".to_owned()),
        Just("{ x }".to_owned()),
        Just("'c'".to_owned()),
        Just("b\"bytes\"".to_owned()),
    ]
}

/// A duration around the rules' bounds (1 s, 1 h), or anywhere, in milliseconds.
fn millis() -> impl Strategy<Value = u64> {
    prop_oneof![
        0u64..3_000,
        3_598_000u64..3_602_000,
        0u64..10_000_000,
        any::<u32>().prop_map(u64::from),
    ]
}

/// A `recent` around the recorder's bounds (10 s, 1 h), or anywhere, in milliseconds.
fn recent_millis() -> impl Strategy<Value = u64> {
    prop_oneof![
        0u64..20_000,
        3_598_000u64..3_602_000,
        any::<u32>().prop_map(u64::from),
    ]
}

/// A `recent_memory` around its bounds (256 KiB, 1 GiB), or anywhere, in bytes; written
/// in bytes, or in the largest unit that divides it.
fn recent_memory() -> impl Strategy<Value = (u64, String)> {
    let bytes = prop_oneof![
        0u64..300_000,
        (250u64..260).prop_map(|k| k * 1024),
        (1_073_741_824u64 - 2_048..1_073_741_824 + 2_048),
        (1020u64..1030).prop_map(|m| m << 20),
        any::<u32>().prop_map(u64::from),
    ];
    (bytes, any::<bool>()).prop_map(|(bytes, in_bytes)| {
        let text = if in_bytes {
            format!("{bytes}B")
        } else {
            crate::size::format(bytes)
        };
        (bytes, text)
    })
}

/// Text with what the string rules look at: slashes, captures, spaces of every kind,
/// control characters, letters and digits.
fn text() -> impl Strategy<Value = String> {
    let chars = prop::sample::select(vec![
        '/', 'a', 'Z', '0', '_', '-', '.', ':', '{', '}', '*', '?', '#', ' ', '\t', '\n', '\u{a0}',
        '\u{2003}', '\u{7f}', '\u{0}', 'é', '\u{feff}',
    ]);
    prop::collection::vec(chars, 0..8).prop_map(|chars| chars.into_iter().collect())
}

fn leak(text: String) -> &'static str {
    Box::leak(text.into_boxed_str())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn no_argument_list_panics_or_drops_the_function(
        pieces in prop::collection::vec(fragment(), 0..10)
    ) {
        // Only lists rustc could hand the attribute: lexically valid tokens.
        let Ok(attr) = pieces.join(" ").parse::<TokenStream>() else {
            return Ok(());
        };
        accepts(attr);
    }

    #[test]
    fn durations_frequency_windows_threads_and_the_recorder_are_judged_as_the_runtime_judges_them(
        cpu_max in prop::option::of(millis()),
        cpu_default in prop::option::of(millis()),
        heap_max in prop::option::of(millis()),
        heap_default in prop::option::of(millis()),
        frequency in prop::option::of(prop_oneof![0u32..1_100, any::<u32>()]),
        max_windows in prop::option::of(prop_oneof![0u32..70, any::<u32>()]),
        alloc_stacks in prop::option::of(prop_oneof![0u32..70, 65_530u32..65_540, any::<u32>()]),
        threads in prop::option::of(any::<bool>()),
        recent in prop::option::of(recent_millis()),
        // Only with `recent`: alone, the attribute refuses it (a rule between keys the
        // runtime has no twin for, as the heap keys without `heap = true`).
        memory in prop::option::of(recent_memory()),
    ) {
        let mut attr = vec!["heap = true".to_owned()];
        let mut config = ProfilingConfig::new().with_heap(true);
        if let Some(ms) = cpu_max {
            attr.push(format!("cpu_max = \"{ms}ms\""));
            config = config.with_cpu_max(Duration::from_millis(ms));
        }
        if let Some(ms) = cpu_default {
            attr.push(format!("cpu_default = \"{ms}ms\""));
            config = config.with_cpu_default(Duration::from_millis(ms));
        }
        if let Some(ms) = heap_max {
            attr.push(format!("heap_max = \"{ms}ms\""));
            config = config.with_heap_max(Duration::from_millis(ms));
        }
        if let Some(ms) = heap_default {
            attr.push(format!("heap_default = \"{ms}ms\""));
            config = config.with_heap_default(Duration::from_millis(ms));
        }
        if let Some(hz) = frequency {
            attr.push(format!("frequency = {hz}"));
            config = config.with_frequency(hz);
        }
        if let Some(windows) = max_windows {
            attr.push(format!("max_windows = {windows}"));
            config = config.with_max_windows(windows);
        }
        if let Some(stacks) = alloc_stacks {
            attr.push(format!("alloc_stacks = {stacks}"));
            config = config.with_alloc_stacks(stacks);
        }
        if let Some(on) = threads {
            attr.push(format!("threads = {on}"));
            config = config.with_threads(on);
        }
        if let Some(ms) = recent {
            attr.push(format!("recent = \"{ms}ms\""));
            config = config.with_recent(Duration::from_millis(ms));
            if let Some((bytes, text)) = memory {
                attr.push(format!("recent_memory = {text:?}"));
                config = config.with_recent_memory(usize::try_from(bytes).unwrap());
            }
        }
        agree(&attr.join(", "), &config)?;
    }

    // One key at a time: together, one key's refusal would hide another's drift.

    #[test]
    fn prefixes_are_judged_as_the_runtime_judges_them(
        // Mostly a valid start, so that the later rules get their turn.
        prefix in prop_oneof![text(), text().prop_map(|t| format!("/debug{t}"))]
    ) {
        let attr = format!("prefix = {prefix:?}");
        let config = ProfilingConfig::new().with_prefix(leak(prefix));
        agree(&attr, &config)?;
    }

    #[test]
    fn blocklists_are_judged_as_the_runtime_judges_them(
        blocklist in prop::collection::vec(text(), 0..3)
    ) {
        let attr = format!("blocklist = {blocklist:?}");
        let entries: Vec<&'static str> = blocklist.into_iter().map(leak).collect();
        let config = ProfilingConfig::new().with_blocklist(Box::leak(entries.into_boxed_slice()));
        agree(&attr, &config)?;
    }

    #[test]
    fn push_intervals_are_judged_as_the_runtime_judges_them(
        // Around the bounds, whole seconds (dividing a minute or not), and anywhere.
        ms in prop_oneof![
            0u64..2_000,
            (0u64..=120).prop_map(|s| s * 1000),
            59_000u64..61_000,
            any::<u32>().prop_map(u64::from),
        ],
        // Short histories (around the interval + 10 s) and long ones.
        recent in prop_oneof![10u64..80, 590u64..610],
        // Unwritten, the interval is the default (15 s) on both sides.
        written in any::<bool>(),
    ) {
        let (attr, config) = if written {
            (
                format!("recent = \"{recent}s\", push = true, push_interval = \"{ms}ms\""),
                ProfilingConfig::new().with_push_interval(Duration::from_millis(ms)),
            )
        } else {
            (format!("recent = \"{recent}s\", push = true"), ProfilingConfig::new())
        };
        let config = config.with_recent(Duration::from_secs(recent)).with_push(true);
        agree(&attr, &config)?;
    }

    #[test]
    fn token_variables_are_judged_as_the_runtime_judges_them(token_env in text()) {
        let attr = format!("token_env = {token_env:?}");
        let config = ProfilingConfig::new().with_token_env(leak(token_env));
        agree(&attr, &config)?;
    }
}

/// The attribute accepts `attr` exactly when `config`, the same settings built at run
/// time, validates.
fn agree(attr: &str, config: &ProfilingConfig) -> Result<(), TestCaseError> {
    prop_assert_eq!(
        accepts(attr.parse().unwrap()),
        config.validate().is_ok(),
        "#[pprof_routes({})]: the runtime says {:?}",
        attr,
        config.validate()
    );
    Ok(())
}
