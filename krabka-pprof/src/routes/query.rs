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
        if frequency > config.frequency_max() {
            return Err(format!(
                "`frequency` may be at most {} Hz here, found {frequency}: the app's \
                 `frequency_max` bounds what a request may ask for (raise it in \
                 #[pprof_routes(frequency_max = N)], up to {MAX_FREQUENCY})",
                config.frequency_max()
            ));
        }
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

/// A `/wall` request: the CPU route's parameters, and which threads it shows.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct WallQuery {
    pub(crate) cpu: CpuQuery,
    /// `threads=all`: every thread, idle ones too; `threads=working` (the default): the
    /// threads doing work.
    pub(crate) every_thread: bool,
}

impl WallQuery {
    /// As [`CpuQuery::parse`], and `threads`: `working` (the default) or `all`.
    pub(crate) fn parse(query: Option<&str>, config: &ProfilingConfig) -> Result<Self, String> {
        let cpu = CpuQuery::parse(query, config)?;
        let params = Params::parse_known(query, Params::WALL)?;
        let every_thread = match params.get("threads") {
            None | Some("working") => false,
            Some("all") => true,
            Some(other) => {
                return Err(format!(
                    "`threads` must be working (the default: threads doing work, inside \
                     labels or not idle in a runtime or pool) or all (idle ones too), found \
                     {other:?}"
                ));
            }
        };
        Ok(WallQuery { cpu, every_thread })
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
    /// The text view groups by this label's values, as for `/profile`.
    pub(crate) group: Option<String>,
}

impl RecentQuery {
    /// `seconds`: missing → 60 s (or `keep`, the recorder's `recent`, if shorter), `0` →
    /// 1 s, above `keep` → `keep`. `end`: the window's end in whole UNIX seconds, missing
    /// → now, later than `now` → now. `format`, `symbolize`, `lines` and `group` as for
    /// `/profile`; `frequency` and `force` are the recorder's, not a request's, and are
    /// ignored; `thread_ids=true` is refused (the recorder keeps threads by name).
    pub(crate) fn parse(
        query: Option<&str>,
        keep: Duration,
        now: std::time::SystemTime,
    ) -> Result<Self, String> {
        let params = Params::parse_known(query, Params::RECENT)?;
        let format = parse_format(&params)?;
        let naming = Naming::parse(&params, format)?;
        if parse_bool(&params, "thread_ids")? {
            return Err(
                "`thread_ids=true` needs a window of its own: the recorder keeps \
                        threads by name, so /recent has no thread ids; ask \
                        /profile?seconds=N&thread_ids=true"
                    .to_owned(),
            );
        }
        let group = params
            .get("group")
            .map(|key| parse_group(key, format))
            .transpose()?;
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
            group,
        })
    }
}

/// The query parameters this crate reads, each at most once. Others are ignored, as Go
/// ignores them (`debug`, `gc`), so generic tooling keeps working.
struct Params(Vec<(&'static str, String)>);

impl Params {
    /// The parameters of the profile routes: `/wall`'s but its last.
    const PROFILES: &'static [&'static str] = Params::WALL.split_at(Params::WALL.len() - 1).0;
    /// The parameters of `/wall`: the profile routes' and `threads`.
    const WALL: &'static [&'static str] = &[
        "seconds",
        "format",
        "frequency",
        "force",
        "symbolize",
        "lines",
        "thread_ids",
        "group",
        "threads",
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
    const RECENT: &'static [&'static str] = &[
        "seconds",
        "end",
        "format",
        "symbolize",
        "lines",
        "group",
        "thread_ids",
    ];
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
mod tests;
