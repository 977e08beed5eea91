//! Tests of the attribute's argument list through `parse`, the one door: every key, every
//! kind of value and every rule between keys, asserted on the messages a user reads. They
//! sit with `args.rs`, not with `values.rs` or `keys.rs`, because the messages are only
//! whole here (the key, the span, the errors combined), and so that no test imports
//! upwards against the one-way rule.

use std::time::Duration;

use proc_macro2::TokenStream;
use quote::quote;

use super::{Args, parse};
use crate::keys::KEYS;

fn parse_ok(tokens: TokenStream) -> Args {
    parse(tokens).unwrap_or_else(|err| panic!("unexpected error: {err}"))
}

fn messages(tokens: TokenStream) -> Vec<String> {
    match parse(tokens) {
        Ok(_) => panic!("expected an error"),
        Err(err) => err.into_iter().map(|e| e.to_string()).collect(),
    }
}

#[test]
fn empty_means_defaults() {
    let args = parse_ok(quote!());
    assert!(args.cpu_max.is_none() && args.frequency.is_none() && args.heap.is_none());
}

#[test]
fn all_keys_parse() {
    let args = parse_ok(quote!(
        cpu_default = "10s",
        cpu_max = "2m",
        frequency = 250,
        frequency_max = 500,
        blocklist = ["libc", "vdso"],
        heap = true,
        heap_default = "5s",
        heap_max = "1m",
        threads = false,
        cmdline = true,
        prefix = "/internal/pprof",
        guard = crate::admin::allow,
        token_env = "PPROF_TOKEN",
        crate = "::other::krabka_pprof",
    ));
    assert_eq!(args.cpu_default.unwrap().value, Duration::from_secs(10));
    assert_eq!(args.cpu_max.unwrap().value, Duration::from_secs(120));
    assert_eq!(args.frequency.unwrap().value, 250);
    assert_eq!(args.frequency_max.unwrap().value, 500);
    assert_eq!(args.blocklist.unwrap().value, ["libc", "vdso"]);
    assert!(args.heap.unwrap().value);
    assert_eq!(args.heap_default.unwrap().value, Duration::from_secs(5));
    assert_eq!(args.heap_max.unwrap().value, Duration::from_secs(60));
    assert!(!args.threads.unwrap().value);
    assert!(args.cmdline.unwrap().value);
    assert_eq!(args.prefix.unwrap().value, "/internal/pprof");
    assert_eq!(args.token_env.unwrap().value, "PPROF_TOKEN");
    let krate = args.krate.unwrap().value;
    assert_eq!(quote!(#krate).to_string(), ":: other :: krabka_pprof");
}

#[test]
fn duration_bounds_on_both_sides() {
    parse_ok(quote!(cpu_max = "1s", cpu_default = "1s"));
    parse_ok(quote!(cpu_max = "1h"));
    let low = messages(quote!(cpu_max = "999ms"));
    assert_eq!(
        low,
        ["`cpu_max` must be between 1s and 1h, found 999ms"],
        "below the floor"
    );
    let high = messages(quote!(cpu_max = "1h 1s"));
    assert_eq!(high, ["`cpu_max` must be between 1s and 1h, found 1h 1s"]);
    assert!(messages(quote!(cpu_default = "500ms"))[0].contains("between 1s and 1h"));
    assert!(messages(quote!(heap = true, heap_max = "2h"))[0].contains("between 1s and 1h"));
}

#[test]
fn default_must_not_exceed_max() {
    parse_ok(quote!(cpu_default = "60s", cpu_max = "60s"));
    let found = messages(quote!(cpu_default = "61s", cpu_max = "60s"));
    assert_eq!(
        found,
        ["`cpu_default` must not exceed `cpu_max` (1m), found 1m 1s"]
    );
    // Unset, the default follows a lower maximum.
    parse_ok(quote!(cpu_max = "10s"));
    let above_builtin = messages(quote!(cpu_default = "2m"));
    assert!(
        above_builtin[0].contains("raise `cpu_max` too"),
        "{above_builtin:?}"
    );
    parse_ok(quote!(heap = true, heap_default = "30s"));
    assert!(messages(quote!(heap = true, heap_default = "31s"))[0].contains("raise `heap_max`"));
    parse_ok(quote!(heap = true, heap_max = "5s"));
}

#[test]
fn frequency_bounds_and_types() {
    parse_ok(quote!(frequency = 1));
    parse_ok(quote!(frequency = 1000));
    assert_eq!(
        messages(quote!(frequency = 0)),
        ["`frequency` must be between 1 and 1000 Hz, found 0"]
    );
    assert_eq!(
        messages(quote!(frequency = 1001)),
        ["`frequency` must be between 1 and 1000 Hz, found 1001"]
    );
    assert!(messages(quote!(frequency = -5))[0].contains("found -5"));
    assert!(messages(quote!(frequency = 99999999999999999999))[0].contains("between 1 and 1000"));
    assert!(messages(quote!(frequency = "99Hz"))[0].contains("write `frequency = 99`"));
    assert!(messages(quote!(frequency = 99u8))[0].contains("drop the `u8` suffix"));
}

#[test]
fn max_windows_bounds_and_types() {
    assert_eq!(
        parse_ok(quote!(max_windows = 1)).max_windows.unwrap().value,
        1
    );
    assert_eq!(
        parse_ok(quote!(max_windows = 64))
            .max_windows
            .unwrap()
            .value,
        64
    );
    assert_eq!(
        messages(quote!(max_windows = 0)),
        ["`max_windows` must be between 1 and 64, found 0"]
    );
    assert_eq!(
        messages(quote!(max_windows = 65)),
        ["`max_windows` must be between 1 and 64, found 65"]
    );
    assert_eq!(
        messages(quote!(max_windows = "8")),
        ["`max_windows` takes an integer, found a string; write `max_windows = 8`"]
    );
    assert_eq!(
        messages(quote!(max_windows = 8usize)),
        ["`max_windows` takes a plain integer; drop the `usize` suffix"]
    );
    assert_eq!(
        messages(quote!(max_windows = true)),
        ["`max_windows` takes an integer such as 8, found a bool"]
    );
}

#[test]
fn all_value_errors_are_reported_together() {
    let found = messages(quote!(cpu_max = "2h", frequency = 0, prefix = "pprof"));
    assert_eq!(found.len(), 3, "{found:?}");
}

#[test]
fn unknown_key_suggests_and_lists() {
    let found = messages(quote!(cpu_maxx = "60s"));
    assert!(found[0].starts_with("unknown key `cpu_maxx`; did you mean `cpu_max`?"));
    assert!(found[0].contains("cpu_default, cpu_max, frequency"));
    let far = messages(quote!(verbose = true));
    assert!(!far[0].contains("did you mean"), "{far:?}");
}

#[test]
fn repeated_key_is_an_error() {
    let found = messages(quote!(frequency = 99, frequency = 100));
    assert_eq!(
        found,
        ["`frequency` is set more than once; keep one of them"]
    );
}

#[test]
fn key_without_value() {
    assert_eq!(
        messages(quote!(heap)),
        ["`heap` needs a value: write `heap = true`"]
    );
    // Every other key's message shows a value it takes.
    for (key, value) in [
        ("cpu_default", "\"30s\""),
        ("cpu_max", "\"60s\""),
        ("frequency", "99"),
        ("frequency_max", "250"),
        ("max_windows", "8"),
        ("blocklist", "[\"libc\", \"libgcc\", \"pthread\", \"vdso\"]"),
        ("heap_default", "\"10s\""),
        ("heap_max", "\"30s\""),
        ("alloc_stacks", "4096"),
        ("threads", "true"),
        ("cmdline", "true"),
        ("recent", "\"10m\""),
        ("recent_memory", "\"8MiB\""),
        ("push", "true"),
        ("push_interval", "\"15s\""),
        ("prefix", "\"/debug/pprof\""),
        ("guard", "crate::auth::is_admin"),
        ("token_env", "\"PPROF_TOKEN\""),
        ("crate", "\"::krabka_pprof\""),
    ] {
        let attr: TokenStream = key.parse().unwrap();
        assert_eq!(
            messages(attr),
            [format!("`{key}` needs a value: write `{key} = {value}`")]
        );
    }
    assert_eq!(KEYS.len(), 20, "a new key needs its example above");
    // An unknown key without a value is unknown first.
    assert!(
        messages(quote!(cpu_maxx))[0]
            .starts_with("unknown key `cpu_maxx`; did you mean `cpu_max`?")
    );
}

#[test]
fn a_value_of_the_wrong_kind_is_named() {
    // Each kind of token, named in the message.
    for (attr, found) in [
        (quote!(cpu_max = ["60s"]), "found an array"),
        (quote!(cpu_max = some::path), "found a path"),
        (quote!(cpu_max = -x), "found an expression"),
        (quote!(cpu_max = 1.5), "found a float"),
        (quote!(cpu_max = true), "found a bool"),
        (quote!(token_env = 5), "found an integer"),
        (quote!(heap = "yes"), "found a string"),
    ] {
        let found_in = messages(attr.clone());
        assert!(found_in[0].ends_with(found), "{attr}: {found_in:?}");
    }
    // An integer is read as seconds only where a duration is asked for.
    assert_eq!(
        messages(quote!(cpu_max = 60)),
        ["`cpu_max` takes a duration string, found an integer; write `cpu_max = \"60s\"`"]
    );
    assert_eq!(
        messages(quote!(prefix = 5)),
        ["`prefix` takes a path string such as \"/debug/pprof\", found an integer"]
    );
    // A negated non-literal is an expression, not a negative number.
    assert_eq!(
        messages(quote!(frequency = -x)),
        ["`frequency` takes an integer in Hz such as 99, found an expression"]
    );
    // Only "true" and "false" in quotes are taken for a quoted bool.
    assert_eq!(
        messages(quote!(heap = "true")),
        ["`heap` takes a bool, found a string; write `heap = true` without quotes"]
    );
    assert_eq!(
        messages(quote!(heap = "yes")),
        ["`heap` takes `true` or `false`, found a string"]
    );
    // A qualified path (`<T as Trait>::f`) is not a plain function path.
    assert!(
        messages(quote!(guard = <T as Trait>::admit))[0]
            .starts_with("`guard` takes a path to a `fn(&axum::http::request::Parts) -> bool`")
    );
}

#[test]
fn suggestions_are_within_two_edits() {
    assert!(
        messages(quote!(cpu_maxxx = "1s"))[0].contains("did you mean `cpu_max`?"),
        "two extra letters"
    );
    assert!(
        !messages(quote!(cpu_maxxxx = "1s"))[0].contains("did you mean"),
        "three are too many"
    );
}

#[test]
fn the_root_is_not_a_prefix() {
    assert_eq!(
        messages(quote!(prefix = "/")),
        ["`prefix` must name a path below the root such as \"/debug/pprof\", found \"/\""]
    );
}

#[test]
fn threads_is_a_bool_like_heap() {
    assert!(parse_ok(quote!(threads = true)).threads.unwrap().value);
    assert!(!parse_ok(quote!(threads = false)).threads.unwrap().value);
    assert!(
        parse_ok(quote!()).threads.is_none(),
        "unset: the runtime's default"
    );
    // No feature needed and no keys tied to it: it parses with and without `heap`.
    parse_ok(quote!(heap = true, threads = false));
    assert_eq!(
        messages(quote!(threads = "false")),
        ["`threads` takes a bool, found a string; write `threads = false` without quotes"]
    );
    assert_eq!(
        messages(quote!(threads = 0)),
        ["`threads` takes `true` or `false`, found an integer"]
    );
    assert_eq!(
        messages(quote!(thread = false)),
        [format!(
            "unknown key `thread`; did you mean `threads`? The keys are: {}",
            KEYS.join(", ")
        )]
    );
}

#[test]
fn heap_keys_need_heap() {
    let found = messages(quote!(heap_max = "20s"));
    assert!(found[0].contains("only applies with `heap = true`"));
    let off = messages(quote!(heap = false, heap_default = "5s"));
    assert!(off[0].contains("only applies with `heap = true`"));
    assert_eq!(
        messages(quote!(alloc_stacks = 0)),
        [
            "`alloc_stacks` only applies with `heap = true`; add `heap = true` or remove `alloc_stacks`"
        ]
    );
}

#[test]
fn alloc_stacks_bounds_and_types() {
    let stacks = |attr| parse_ok(attr).alloc_stacks.unwrap().value;
    assert_eq!(stacks(quote!(heap = true, alloc_stacks = 0)), 0);
    assert_eq!(stacks(quote!(heap = true, alloc_stacks = 64)), 64);
    assert_eq!(stacks(quote!(heap = true, alloc_stacks = 65536)), 65_536);
    for (attr, found) in [
        (quote!(heap = true, alloc_stacks = 63), "63"),
        (quote!(heap = true, alloc_stacks = 65537), "65537"),
        (quote!(heap = true, alloc_stacks = -1), "-1"),
    ] {
        assert_eq!(
            messages(attr),
            [format!(
                "`alloc_stacks` must be 0 (no allocation counts) or between 64 and 65536, found {found}"
            )]
        );
    }
    assert_eq!(
        messages(quote!(heap = true, alloc_stacks = "4096")),
        ["`alloc_stacks` takes an integer, found a string; write `alloc_stacks = 4096`"]
    );
}

#[test]
fn blocklist_rules() {
    parse_ok(quote!(blocklist = []));
    assert!(messages(quote!(blocklist = ["libc", ""]))[0].contains("non-empty"));
    assert!(messages(quote!(blocklist = [libc]))[0].contains("must be strings"));
    assert!(messages(quote!(blocklist = "libc"))[0].contains("array"));
}

#[test]
fn wrong_types_say_what_to_write() {
    assert!(messages(quote!(cpu_max = 60))[0].contains("write `cpu_max = \"60s\"`"));
    assert!(messages(quote!(heap = "true"))[0].contains("without quotes"));
    assert!(messages(quote!(guard = "auth::check"))[0].contains("not a string"));
    assert!(messages(quote!(crate = "not a path"))[0].contains("must be a path"));
}

#[test]
fn recent_keys_parse_and_keep_their_bounds() {
    let args = parse_ok(quote!(recent = "10m", recent_memory = "2MiB"));
    assert_eq!(args.recent.unwrap().value, Duration::from_secs(600));
    assert_eq!(args.recent_memory.unwrap().value, 2 << 20);
    let unset = parse_ok(quote!(recent = "1m"));
    assert!(unset.recent_memory.is_none(), "unset: the runtime's 8 MiB");
    assert_eq!(
        messages(quote!(recent = "5s")),
        ["`recent` must be between 10s and 1h, found 5s"]
    );
    assert_eq!(
        messages(quote!(recent = "2h")),
        ["`recent` must be between 10s and 1h, found 2h"]
    );
    assert_eq!(
        messages(quote!(recent = "10m", recent_memory = "100KiB")),
        ["`recent_memory` must be between 256KiB and 1GiB, found 100KiB"]
    );
    assert_eq!(
        messages(quote!(recent = "10m", recent_memory = "2GiB")),
        ["`recent_memory` must be between 256KiB and 1GiB, found 2GiB"]
    );
    assert_eq!(
        messages(quote!(recent = 600)),
        ["`recent` takes a duration string, found an integer; write `recent = \"600s\"`"]
    );
}

#[test]
fn recent_memory_is_a_size_string_and_needs_recent() {
    assert_eq!(
        messages(quote!(recent_memory = "8MiB")),
        [
            "`recent_memory` bounds the recorder, which only runs with `recent`; add \
          `recent = \"10m\"` or remove `recent_memory`"
        ]
    );
    assert_eq!(
        messages(quote!(recent = "1m", recent_memory = 8388608)),
        [
            "`recent_memory` takes a size string, found an integer; write \
          `recent_memory = \"8388608B\"` (or in KiB, MiB, GiB)"
        ]
    );
    let decimal = messages(quote!(recent = "1m", recent_memory = "8MB"));
    assert!(
        decimal[0].starts_with("`recent_memory` has an unknown unit \"MB\"; use B, KiB"),
        "{decimal:?}"
    );
    let bare = messages(quote!(recent = "1m", recent_memory = "8"));
    assert!(
        bare[0].starts_with("`recent_memory` needs a unit: write \"8MiB\""),
        "{bare:?}"
    );
    assert_eq!(
        messages(quote!(recent = "1m", recent_memory = true)),
        ["`recent_memory` takes a size string such as \"8MiB\", found a bool"]
    );
}

#[test]
fn frequency_max_is_at_least_the_frequency_written_or_the_default() {
    assert_eq!(
        messages(quote!(frequency = 300, frequency_max = 200)),
        ["`frequency_max` must be at least `frequency` (300 Hz), found 200"]
    );
    assert_eq!(
        messages(quote!(frequency_max = 50)),
        ["`frequency_max` must be at least `frequency` (default 99 Hz), found 50"]
    );
    assert_eq!(
        messages(quote!(frequency_max = 1001)),
        ["`frequency_max` must be between 1 and 1000 Hz, found 1001"]
    );
    parse_ok(quote!(frequency = 500, frequency_max = 500));
}
