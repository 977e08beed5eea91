//! Query parsing: each route's parameters read once, defaulted and clamped to the
//! configured bounds, with a message that says what to send when one is wrong. Pure
//! functions of the query string and the config, so every rule is unit-tested here.

use std::time::Duration;

use crate::config::{MAX_FREQUENCY, MIN_FREQUENCY, ProfilingConfig};
use crate::heap::SAMPLE_TYPES;
use crate::symbolize::Symbolize;
use crate::views::Format;

/// A `/profile` request after defaults and clamping.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct CpuQuery {
    pub(crate) duration: Duration,
    pub(crate) seconds_requested: Option<u64>,
    pub(crate) frequency: u32,
    pub(crate) format: Format,
    pub(crate) naming: Naming,
    pub(crate) force: bool,
    /// Samples also carry `thread_id` (`?thread_ids=true`).
    pub(crate) thread_ids: bool,
    /// The text view groups by this label's values (`?group=tenant`).
    pub(crate) group: Option<String>,
}

/// What a profile names and how its text view groups it: `symbolize` and `lines`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Naming {
    pub(crate) symbolize: Symbolize,
    /// The text view by line (`go tool pprof -lines`) rather than by function.
    pub(crate) lines: bool,
}

impl Naming {
    /// `symbolize`: `full` (the default: names, and files, lines and inlined calls where
    /// DWARF has them) or `none` (addresses and mappings only, in the pprof format);
    /// `lines`: `true` groups the text view by line.
    fn parse(params: &Params, format: Format) -> Result<Naming, String> {
        let symbolize = match params.get("symbolize") {
            None | Some("full") => Symbolize::Full,
            Some("none") => Symbolize::None,
            Some(other) => {
                return Err(format!(
                    "`symbolize` must be full (the default: names, and lines where the binary \
                     has them) or none (addresses and mappings only), found {other:?}"
                ));
            }
        };
        if symbolize == Symbolize::None && format != Format::Pprof {
            return Err(format!(
                "`symbolize=none` leaves only addresses, which only the pprof format carries, \
                 not format={}: drop one of them",
                format.name()
            ));
        }
        let lines = match params.get("lines") {
            None | Some("false" | "0") => false,
            Some("true" | "1") => true,
            Some(other) => {
                return Err(format!("`lines` must be true or false, found {other:?}"));
            }
        };
        if lines && format != Format::Text {
            return Err(format!(
                "`lines=true` groups the text view (format=text) by line, not format={}; \
                 `go tool pprof -lines` does the same from the pprof format",
                format.name()
            ));
        }
        Ok(Naming { symbolize, lines })
    }
}

impl CpuQuery {
    /// `seconds`: missing → `cpu_default`, `0` → 1 s, above `cpu_max` → `cpu_max`; anything
    /// that is not a non-negative integer is an error. `frequency`: 1 ..= 1000 Hz, default
    /// the configured one. `force`: `true` stops a running profile early. Unknown
    /// parameters are ignored, as Go ignores them (`debug`, `gc`).
    pub(crate) fn parse(query: Option<&str>, config: &ProfilingConfig) -> Result<Self, String> {
        let params = Params::parse(query)?;
        let format = parse_format(&params)?;
        let naming = Naming::parse(&params, format)?;
        let (duration, seconds_requested) =
            window(&params, config.cpu_default(), config.cpu_max())?;
        let frequency = match params.get("frequency") {
            None => config.frequency(),
            Some(text) => parse_frequency(text)?,
        };
        let force = parse_bool(&params, "force")?;
        let thread_ids = parse_bool(&params, "thread_ids")?;
        let group = params
            .get("group")
            .map(|key| parse_group(key, format))
            .transpose()?;
        Ok(CpuQuery {
            duration,
            seconds_requested,
            frequency,
            format,
            naming,
            force,
            thread_ids,
            group,
        })
    }
}

/// A `true`/`false` parameter (also `1`/`0`); false when missing.
fn parse_bool(params: &Params, key: &str) -> Result<bool, String> {
    match params.get(key) {
        None | Some("false" | "0") => Ok(false),
        Some("true" | "1") => Ok(true),
        Some(other) => Err(format!("`{key}` must be true or false, found {other:?}")),
    }
}

/// `group`: a label key (`thread`, `tenant`, `span_name`…), for the text view only.
fn parse_group(key: &str, format: Format) -> Result<String, String> {
    let valid = !key.is_empty()
        && !key.starts_with(|c: char| c.is_ascii_digit())
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.');
    if !valid {
        return Err(format!(
            "`group` must be a label key (ASCII letters, digits, `_` and `.`, such as \
             ?group=tenant or ?group=thread), found {key:?}"
        ));
    }
    if format != Format::Text {
        return Err(format!(
            "`group` groups the text view (format=text), not format={}; from the pprof \
             format, `go tool pprof -tags` splits by every label and `-tagfocus {key}=VALUE` \
             keeps one value",
            format.name()
        ));
    }
    Ok(key.to_owned())
}

fn parse_frequency(text: &str) -> Result<u32, String> {
    let message = || {
        format!(
            "`frequency` must be a whole number of Hz from {MIN_FREQUENCY} to {MAX_FREQUENCY}, \
             such as ?frequency=99, found {text:?}"
        )
    };
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(message());
    }
    match text.parse::<u32>() {
        Ok(hz) if (MIN_FREQUENCY..=MAX_FREQUENCY).contains(&hz) => Ok(hz),
        _ => Err(message()),
    }
}

/// A `/heap` or `/allocs` request after defaults and clamping.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct HeapQuery {
    /// The window: of allocations where sampling is on (only if `seconds` is given), of
    /// sampling where it is off.
    pub(crate) window: Duration,
    pub(crate) seconds_requested: Option<u64>,
    pub(crate) format: Format,
    pub(crate) naming: Naming,
    /// The sample type the views show, one of Go's four heap types.
    pub(crate) sample_index: Option<&'static str>,
}

impl HeapQuery {
    /// `seconds`: missing → `heap_default` (used only where sampling is off; where it is
    /// on, the profile is of now), `0` → 1 s, above `heap_max` → `heap_max`.
    /// `sample_index`: `alloc_objects`, `alloc_space`, `inuse_objects` or `inuse_space`.
    pub(crate) fn parse(query: Option<&str>, config: &ProfilingConfig) -> Result<Self, String> {
        let params = Params::parse_known(query, Params::HEAP)?;
        let format = parse_format(&params)?;
        let naming = Naming::parse(&params, format)?;
        let (window, seconds_requested) =
            window(&params, config.heap_default(), config.heap_max())?;
        let sample_index = match params.get("sample_index") {
            None => None,
            Some(name) => Some(*SAMPLE_TYPES.iter().find(|t| **t == name).ok_or_else(|| {
                format!(
                    "`sample_index` must be one of {}, as `go tool pprof -sample_index` \
                         takes them, found {name:?}",
                    SAMPLE_TYPES.join(", ")
                )
            })?),
        };
        Ok(HeapQuery {
            window,
            seconds_requested,
            format,
            naming,
            sample_index,
        })
    }
}

/// A `/threads` or `/goroutine` request.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct ThreadsQuery {
    /// What to send: a profile in a [`Format`], or Go's text forms (`debug=1`, `debug=2`).
    pub(crate) answer: ThreadsAnswer,
    /// How long to wait for the threads' answers.
    pub(crate) deadline: Duration,
    /// `symbolize` and `lines`, for the profile form.
    pub(crate) naming: Naming,
}

/// The form of a thread dump.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ThreadsAnswer {
    Profile(Format),
    /// `debug=1`: grouped by identical stack, largest group first.
    Grouped,
    /// `debug=2`: every thread with its state.
    Every,
}

/// The default wait for threads to answer a dump.
pub(crate) const DUMP_DEADLINE: Duration = Duration::from_millis(100);
/// The longest wait a dump may ask for.
const MAX_DUMP_DEADLINE: Duration = Duration::from_secs(10);

impl ThreadsQuery {
    /// `debug`: 0 (the default: a profile in `format`), 1 or 2 (Go's text forms);
    /// `format`: as for profiles, only with `debug=0`; `deadline`: a duration such as
    /// `250ms`, 1 ms to 10 s, default 100 ms.
    pub(crate) fn parse(query: Option<&str>) -> Result<Self, String> {
        let params = Params::parse_known(query, Params::THREADS)?;
        let format = parse_format(&params)?;
        let answer = match params.get("debug") {
            Some(debug @ ("1" | "2"))
                if params.get("symbolize").is_some() || params.get("lines").is_some() =>
            {
                return Err(format!(
                    "`debug={debug}` is a text form of its own and takes neither `symbolize` \
                     nor `lines`: send one of them"
                ));
            }
            None | Some("0") => ThreadsAnswer::Profile(format),
            Some(debug @ ("1" | "2")) if params.get("format").is_some() => {
                return Err(format!(
                    "`debug={debug}` is a text form of its own and takes no `format`: send one of \
                     them"
                ));
            }
            Some("1") => ThreadsAnswer::Grouped,
            Some("2") => ThreadsAnswer::Every,
            Some(other) => {
                return Err(format!(
                    "`debug` must be 0 (a profile, the default), 1 (text grouped by stack) \
                     or 2 (every thread with its state), found {other:?}"
                ));
            }
        };
        let deadline = match params.get("deadline") {
            None => DUMP_DEADLINE,
            Some(text) => match humantime::parse_duration(text) {
                Ok(deadline)
                    if (Duration::from_millis(1)..=MAX_DUMP_DEADLINE).contains(&deadline) =>
                {
                    deadline
                }
                _ => {
                    return Err(format!(
                        "`deadline` must be a duration from 1ms to 10s such as \
                         ?deadline=250ms, found {text:?}"
                    ));
                }
            },
        };
        let naming = Naming::parse(&params, format)?;
        Ok(ThreadsQuery {
            answer,
            deadline,
            naming,
        })
    }
}

/// `format`: which view of the profile to send.
fn parse_format(params: &Params) -> Result<Format, String> {
    #[cfg(feature = "flamegraph")]
    const VALID: &str = "pprof (the default), svg or text";
    #[cfg(not(feature = "flamegraph"))]
    const VALID: &str =
        "pprof (the default) or text (svg needs krabka-pprof's `flamegraph` feature)";
    match params.get("format") {
        None | Some("pprof" | "proto") => Ok(Format::Pprof),
        Some("text" | "top") => Ok(Format::Text),
        Some("svg" | "flamegraph") if cfg!(feature = "flamegraph") => Ok(Format::Svg),
        Some(other) => Err(format!("`format` must be {VALID}, found {other:?}")),
    }
}

/// A `/recent` request after defaults and clamping.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct RecentQuery {
    pub(crate) duration: Duration,
    pub(crate) seconds_requested: Option<u64>,
    /// When the window ends; `None`: now.
    pub(crate) end: Option<std::time::SystemTime>,
    pub(crate) format: Format,
    pub(crate) naming: Naming,
}

impl RecentQuery {
    /// `seconds`: missing → 60 s (or `keep`, the recorder's `recent`, if shorter), `0` →
    /// 1 s, above `keep` → `keep`. `end`: the window's end in whole UNIX seconds, missing
    /// → now, later than `now` → now. `format`, `symbolize`, `lines` as for `/profile`;
    /// `frequency` and `force` are the recorder's, not a request's, and are ignored.
    pub(crate) fn parse(
        query: Option<&str>,
        keep: Duration,
        now: std::time::SystemTime,
    ) -> Result<Self, String> {
        let params = Params::parse_known(query, Params::RECENT)?;
        let format = parse_format(&params)?;
        let naming = Naming::parse(&params, format)?;
        let (duration, seconds_requested) =
            window(&params, keep.min(Duration::from_secs(60)), keep)?;
        let end = params
            .get("end")
            .map(|text| {
                let hint = || {
                    format!(
                        "`end` must be the window's end in whole UNIX seconds such as \
                         ?end=1767225600 (missing means now), found {text:?}"
                    )
                };
                if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(hint());
                }
                let secs = text.parse::<u64>().map_err(|_| hint())?;
                std::time::SystemTime::UNIX_EPOCH
                    .checked_add(Duration::from_secs(secs))
                    .map(|end| end.min(now))
                    .ok_or_else(hint)
            })
            .transpose()?;
        Ok(RecentQuery {
            duration,
            seconds_requested,
            end,
            format,
            naming,
        })
    }
}

/// The query parameters this crate reads, each at most once. Others are ignored, as Go
/// ignores them (`debug`, `gc`), so generic tooling keeps working.
struct Params(Vec<(&'static str, String)>);

impl Params {
    /// The parameters of the profile routes.
    const PROFILES: &'static [&'static str] = &[
        "seconds",
        "format",
        "frequency",
        "force",
        "symbolize",
        "lines",
        "thread_ids",
        "group",
    ];
    /// The parameters of the heap routes.
    const HEAP: &'static [&'static str] = &[
        "seconds",
        "format",
        "frequency",
        "force",
        "symbolize",
        "lines",
        "sample_index",
    ];
    /// The parameters of `/recent`.
    const RECENT: &'static [&'static str] = &["seconds", "end", "format", "symbolize", "lines"];
    /// The parameters of the thread dump routes.
    const THREADS: &'static [&'static str] = &["debug", "format", "deadline", "symbolize", "lines"];

    fn parse(query: Option<&str>) -> Result<Params, String> {
        Params::parse_known(query, Params::PROFILES)
    }

    fn parse_known(query: Option<&str>, known: &[&'static str]) -> Result<Params, String> {
        let mut found: Vec<(&'static str, String)> = Vec::new();
        for (key, value) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
            let Some(known) = known.iter().find(|k| **k == key) else {
                continue;
            };
            if found.iter().any(|(k, _)| k == known) {
                return Err(format!("`{known}` is given more than once; send it once"));
            }
            found.push((known, value.into_owned()));
        }
        Ok(Params(found))
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// The `seconds` window: missing → `default`, `0` → 1 s, above `max` → `max`. Also the
/// number asked for, for the logs.
fn window(
    params: &Params,
    default: Duration,
    max: Duration,
) -> Result<(Duration, Option<u64>), String> {
    let max_secs = max.as_secs();
    let requested = params
        .get("seconds")
        .map(|text| parse_seconds(text, max_secs))
        .transpose()?;
    let duration = match requested {
        None => default,
        Some(seconds) => Duration::from_secs(seconds.clamp(1, max_secs)),
    };
    Ok((duration.min(max), requested))
}

/// A whole, non-negative number of seconds.
fn parse_seconds(text: &str, max_secs: u64) -> Result<u64, String> {
    let hint = format!(
        "`seconds` must be a whole number of seconds such as ?seconds=30 (0 means 1, above {max_secs} means {max_secs})"
    );
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{hint}, found {text:?}"));
    }
    text.parse::<u64>().map_err(|_| {
        format!("{hint}, found {text:?}, which is too large to be a number of seconds")
    })
}

#[cfg(test)]
mod tests {
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
        assert_eq!(parse("frequency=1000").unwrap().frequency, 1000);
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
            let query =
                HeapQuery::parse(Some(&format!("sample_index={name}&format=text")), &config);
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
    }
}
