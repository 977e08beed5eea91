//! Every query parameter, good and bad, and the sentence each bad one gets.

use super::*;

fn parse(query: &str) -> Result<CpuQuery, String> {
    CpuQuery::parse(Some(query), &ProfilingConfig::new())
}

fn secs(query: &str) -> u64 {
    parse(query).unwrap().duration.as_secs()
}

#[test]
fn seconds_clamping() {
    assert_eq!(
        CpuQuery::parse(None, &ProfilingConfig::new())
            .unwrap()
            .duration
            .as_secs(),
        30
    );
    assert_eq!(secs(""), 30);
    assert_eq!(secs("debug=1"), 30, "unknown parameters are ignored");
    assert_eq!(secs("seconds=0"), 1);
    assert_eq!(secs("seconds=1"), 1);
    assert_eq!(secs("seconds=59"), 59);
    assert_eq!(secs("seconds=60"), 60);
    assert_eq!(secs("seconds=61"), 60);
    assert_eq!(secs("seconds=18446744073709551615"), 60);
    assert_eq!(parse("seconds=61").unwrap().seconds_requested, Some(61));
}

#[test]
fn bad_seconds() {
    for bad in [
        "abc",
        "-1",
        "1.5",
        "",
        "+5",
        "5s",
        " 5",
        "0x10",
        "18446744073709551616",
        // `+5` once decoded, which u64 parses.
        "%2B5",
    ] {
        let err = parse(&format!("seconds={bad}")).unwrap_err();
        assert!(err.contains("whole number of seconds"), "{bad}: {err}");
    }
    // Only a number too large for 64 bits is called too large.
    assert!(!parse("seconds=").unwrap_err().contains("too large"));
    assert!(
        parse("seconds=18446744073709551616")
            .unwrap_err()
            .contains("too large")
    );
    assert!(
        parse("seconds=1&seconds=2")
            .unwrap_err()
            .contains("more than once")
    );
}

#[test]
fn clamping_follows_the_config() {
    let config = ProfilingConfig::new()
        .with_cpu_default(Duration::from_secs(5))
        .with_cpu_max(Duration::from_secs(7));
    let q = |s: &str| {
        CpuQuery::parse(Some(s), &config)
            .unwrap()
            .duration
            .as_secs()
    };
    assert_eq!(q(""), 5);
    assert_eq!(q("seconds=100"), 7);
    assert_eq!(q("seconds=0"), 1);
}

#[test]
fn frequency_and_force() {
    assert_eq!(parse("").unwrap().frequency, 99);
    assert_eq!(parse("frequency=1").unwrap().frequency, 1);
    assert_eq!(parse("frequency=250").unwrap().frequency, 250);
    // Above `frequency_max` (unset: 250 Hz): a 400 that names the key.
    let err = parse("frequency=251").unwrap_err();
    assert!(
        err.contains("at most 250 Hz") && err.contains("frequency_max"),
        "{err}"
    );
    let lifted = ProfilingConfig::new().with_frequency_max(1000);
    assert_eq!(
        CpuQuery::parse(Some("frequency=1000"), &lifted)
            .unwrap()
            .frequency,
        1000
    );
    // An app that samples above 250 Hz may always be asked its own frequency.
    let fast = ProfilingConfig::new().with_frequency(500);
    assert_eq!(fast.frequency_max(), 500);
    assert!(CpuQuery::parse(Some("frequency=500"), &fast).is_ok());
    assert!(CpuQuery::parse(Some("frequency=501"), &fast).is_err());
    // `+5` and ` 5` parse as u32 in Rust but are not what the contract accepts.
    for bad in ["0", "1001", "-5", "x", "", "99.5", "%2B5", "+5", "%205"] {
        let err = parse(&format!("frequency={bad}")).unwrap_err();
        assert!(err.contains("from 1 to 1000"), "{bad}: {err}");
    }
    assert!(!parse("").unwrap().force);
    assert!(parse("force=true").unwrap().force);
    assert!(parse("force=1").unwrap().force);
    assert!(!parse("force=false").unwrap().force);
    assert!(
        parse("force=yes")
            .unwrap_err()
            .contains("`force` must be true or false")
    );
}

#[test]
fn heap_window_clamping() {
    let config = ProfilingConfig::new().with_heap(true);
    let w = |q: &str| HeapQuery::parse(Some(q), &config).unwrap().window.as_secs();
    assert_eq!(w(""), 10);
    assert_eq!(w("seconds=0"), 1);
    assert_eq!(w("seconds=30"), 30);
    assert_eq!(w("seconds=31"), 30);
    assert!(HeapQuery::parse(Some("seconds=-2"), &config).is_err());
    assert_eq!(
        HeapQuery::parse(Some("format=text"), &config)
            .unwrap()
            .format,
        Format::Text
    );
}

#[test]
fn formats() {
    assert_eq!(parse("").unwrap().format, Format::Pprof);
    assert_eq!(parse("format=text").unwrap().format, Format::Text);
    let err = parse("format=pdf").unwrap_err();
    assert!(
        err.starts_with("`format` must be pprof (the default)"),
        "{err}"
    );
    assert!(err.ends_with("found \"pdf\""), "{err}");
    #[cfg(feature = "flamegraph")]
    assert_eq!(parse("format=svg").unwrap().format, Format::Svg);
    assert!(
        parse("format=text&format=pprof")
            .unwrap_err()
            .contains("more than once")
    );
}

#[test]
fn symbolize_and_lines() {
    let naming = |q: &str| parse(q).map(|query| query.naming);
    assert_eq!(naming("").unwrap(), Naming::default());
    assert_eq!(naming("").unwrap().symbolize, Symbolize::Full);
    assert_eq!(naming("symbolize=full").unwrap().symbolize, Symbolize::Full);
    assert_eq!(naming("symbolize=none").unwrap().symbolize, Symbolize::None);
    let err = naming("symbolize=local").unwrap_err();
    assert!(err.starts_with("`symbolize` must be full"), "{err}");
    assert!(err.ends_with("found \"local\""), "{err}");
    let err = naming("symbolize=none&format=text").unwrap_err();
    assert!(err.contains("only the pprof format carries"), "{err}");
    assert!(err.contains("format=text"), "{err}");

    assert!(!naming("format=text").unwrap().lines);
    assert!(naming("format=text&lines=true").unwrap().lines);
    assert!(naming("format=text&lines=1").unwrap().lines);
    assert!(!naming("format=text&lines=false").unwrap().lines);
    let err = naming("format=text&lines=yes").unwrap_err();
    assert!(err.contains("`lines` must be true or false"), "{err}");
    let err = naming("lines=true").unwrap_err();
    assert!(err.contains("go tool pprof -lines"), "{err}");
    assert!(err.contains("format=pprof"), "{err}");

    let config = ProfilingConfig::new().with_heap(true);
    let heap = HeapQuery::parse(Some("symbolize=none"), &config).unwrap();
    assert_eq!(heap.naming.symbolize, Symbolize::None);
    let threads = ThreadsQuery::parse(Some("format=text&lines=true")).unwrap();
    // The heap's views show any of Go's four types; nothing else.
    for name in SAMPLE_TYPES {
        let query = HeapQuery::parse(Some(&format!("sample_index={name}&format=text")), &config);
        assert_eq!(query.unwrap().sample_index, Some(name));
    }
    assert_eq!(HeapQuery::parse(None, &config).unwrap().sample_index, None);
    let err = HeapQuery::parse(Some("sample_index=cpu"), &config).unwrap_err();
    assert_eq!(
        err,
        "`sample_index` must be one of alloc_objects, alloc_space, inuse_objects, \
         inuse_space, as `go tool pprof -sample_index` takes them, found \"cpu\""
    );
    assert!(
        HeapQuery::parse(
            Some("sample_index=inuse_space&sample_index=alloc_space"),
            &config
        )
        .unwrap_err()
        .contains("more than once")
    );
    // Not a parameter of the CPU route: ignored there, as Go ignores what it does not read.
    assert!(parse("sample_index=whatever&sample_index=twice").is_ok());
    assert!(threads.naming.lines);
    let err = ThreadsQuery::parse(Some("debug=2&symbolize=none")).unwrap_err();
    assert!(
        err.contains("takes neither `symbolize` nor `lines`"),
        "{err}"
    );
    assert!(ThreadsQuery::parse(Some("debug=1&lines=true")).is_err());
}

#[test]
fn thread_ids_and_group() {
    assert!(!parse("").unwrap().thread_ids);
    assert!(parse("thread_ids=true").unwrap().thread_ids);
    let err = parse("thread_ids=yes").unwrap_err();
    assert!(err.contains("`thread_ids` must be true or false"), "{err}");

    assert_eq!(parse("format=text").unwrap().group, None);
    let group = parse("format=text&group=tenant").unwrap().group;
    assert_eq!(group.as_deref(), Some("tenant"));
    let group = parse("format=text&group=http.route").unwrap().group;
    assert_eq!(group.as_deref(), Some("http.route"));
    let err = parse("group=tenant").unwrap_err();
    assert!(err.contains("format=text"), "{err}");
    assert!(err.contains("-tagfocus tenant=VALUE"), "{err}");
    for bad in ["", "a=b", "9x", "ten ant"] {
        let err = parse(&format!("format=text&group={bad}")).unwrap_err();
        assert!(
            err.starts_with("`group` must be a label key"),
            "{bad:?}: {err}"
        );
    }
}

#[test]
fn recent_windows_and_ends() {
    use std::time::UNIX_EPOCH;
    let now = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let ten_minutes = Duration::from_secs(600);
    let q = |query: &str| RecentQuery::parse(Some(query), ten_minutes, now);
    assert_eq!(
        q("").unwrap().duration.as_secs(),
        60,
        "a minute unless asked"
    );
    assert_eq!(q("seconds=0").unwrap().duration.as_secs(), 1);
    assert_eq!(q("seconds=15").unwrap().duration.as_secs(), 15);
    assert_eq!(q("seconds=600").unwrap().duration.as_secs(), 600);
    assert_eq!(
        q("seconds=601").unwrap().duration.as_secs(),
        600,
        "at most what is kept"
    );
    assert_eq!(q("seconds=601").unwrap().seconds_requested, Some(601));
    let short = RecentQuery::parse(None, Duration::from_secs(20), now).unwrap();
    assert_eq!(
        short.duration.as_secs(),
        20,
        "a shorter recent is the default"
    );
    assert_eq!(q("").unwrap().end, None, "now");
    assert_eq!(
        q("end=1799999000").unwrap().end,
        Some(UNIX_EPOCH + Duration::from_secs(1_799_999_000))
    );
    assert_eq!(
        q("end=1900000000").unwrap().end,
        Some(now),
        "no later than now"
    );
    for bad in ["", "-5", "1.5", "yesterday", "%2B5", "18446744073709551616"] {
        let err = q(&format!("end={bad}")).unwrap_err();
        assert!(
            err.starts_with("`end` must be the window's end in whole UNIX seconds"),
            "{bad}: {err}"
        );
    }
    let err = q("seconds=soon").unwrap_err();
    assert!(err.contains("above 600 means 600"), "{err}");
    assert!(q("end=1&end=2").unwrap_err().contains("more than once"));
    assert!(
        q("frequency=0&force=maybe").is_ok(),
        "the recorder's, ignored"
    );
    assert_eq!(q("format=text").unwrap().format, Format::Text);
    assert!(q("format=text&lines=true").unwrap().naming.lines);
    assert_eq!(
        q("symbolize=none").unwrap().naming.symbolize,
        Symbolize::None
    );
    assert!(q("symbolize=none&format=text").is_err());
    assert_eq!(
        q("format=text&group=tenant").unwrap().group.as_deref(),
        Some("tenant")
    );
    assert!(q("group=tenant").unwrap_err().contains("format=text"));
    assert!(q("thread_ids=false").is_ok());
    let err = q("thread_ids=true").unwrap_err();
    assert!(err.contains("keeps threads by name"), "{err}");
}

#[test]
fn threads_debug_format_and_deadline() {
    let threads = |query: &str| ThreadsQuery::parse(Some(query));
    let default = ThreadsQuery::parse(None).unwrap();
    assert_eq!(default.answer, ThreadsAnswer::Profile(Format::Pprof));
    assert_eq!(default.deadline, DUMP_DEADLINE);
    assert_eq!(threads("debug=0").unwrap(), default);
    assert_eq!(threads("debug=1").unwrap().answer, ThreadsAnswer::Grouped);
    assert_eq!(threads("debug=2").unwrap().answer, ThreadsAnswer::Every);
    assert_eq!(
        threads("debug=0&format=text").unwrap().answer,
        ThreadsAnswer::Profile(Format::Text)
    );
    for query in ["debug=1&format=text", "debug=2&format=pprof"] {
        let err = threads(query).unwrap_err();
        assert!(err.contains("takes no `format`"), "{query}: {err}");
    }
    assert!(
        threads("debug=3")
            .unwrap_err()
            .contains("`debug` must be 0")
    );
    // The deadline: 1 ms to 10 s, both ends included.
    for (query, deadline) in [
        ("deadline=1ms", Duration::from_millis(1)),
        ("deadline=250ms", Duration::from_millis(250)),
        ("deadline=10s", Duration::from_secs(10)),
    ] {
        assert_eq!(threads(query).unwrap().deadline, deadline, "{query}");
    }
    for query in [
        "deadline=0ms",
        "deadline=10001ms",
        "deadline=1m",
        "deadline=soon",
    ] {
        let err = threads(query).unwrap_err();
        assert!(err.contains("from 1ms to 10s"), "{query}: {err}");
    }
    // svg where the flamegraph feature is built, and a sentence that says so where not.
    assert_eq!(
        threads("format=svg").is_ok(),
        cfg!(feature = "flamegraph"),
        "{:?}",
        threads("format=svg")
    );
}
