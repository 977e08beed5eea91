//! The HTTP contract: routes, query parsing, and Go-compatible success and error responses.

use std::io::Write as _;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::config::{ConfigError, ProfilingConfig};
use crate::cpu::{self, CpuError, CpuRequest};
use crate::heap::{self, HeapError, HeapRequest};
use crate::views;
use pprof::protos::Profile;

/// The profiling routes with the default [`ProfilingConfig`], to merge into an app or
/// serve on an internal listener.
///
/// ```
/// let internal: axum::Router = krabka_pprof::pprof_router();
/// ```
pub fn pprof_router<S>() -> Router<S>
where
    S: Clone + Send + Sync + 'static,
{
    build(ProfilingConfig::new())
}

/// The profiling routes with `config`, after checking it.
///
/// ```
/// use std::time::Duration;
/// use krabka_pprof::{ProfilingConfig, pprof_router_with_config};
///
/// let config = ProfilingConfig::new().with_cpu_max(Duration::from_secs(120));
/// let router: axum::Router = pprof_router_with_config(config)?;
/// # Ok::<(), krabka_pprof::ConfigError>(())
/// ```
pub fn pprof_router_with_config<S>(config: ProfilingConfig) -> Result<Router<S>, ConfigError>
where
    S: Clone + Send + Sync + 'static,
{
    config.validate()?;
    Ok(build(config))
}

/// What every handler shares.
struct Shared {
    config: ProfilingConfig,
}

pub(crate) fn build<S>(config: ProfilingConfig) -> Router<S>
where
    S: Clone + Send + Sync + 'static,
{
    let shared = Arc::new(Shared { config });
    let prefix = config.prefix();
    let mut router = Router::new().route(&format!("{prefix}/profile"), {
        let shared = shared.clone();
        get(move |request: Request| cpu_profile(shared.clone(), request))
    });
    if config.heap() {
        // `/allocs` is where Parca and Grafana Alloy look for memory by default.
        for route in ["heap", "allocs"] {
            let shared = shared.clone();
            router = router.route(
                &format!("{prefix}/{route}"),
                get(move |request: Request| heap_profile(shared.clone(), request)),
            );
        }
    }
    router
}

async fn cpu_profile(shared: Arc<Shared>, request: Request) -> Response {
    let (parts, _body) = request.into_parts();
    let query = match CpuQuery::parse(parts.uri.query(), &shared.config) {
        Ok(query) => query,
        Err(message) => return error(StatusCode::BAD_REQUEST, &message),
    };
    let request = CpuRequest {
        duration: query.duration,
        frequency: query.frequency,
        blocklist: shared.config.blocklist(),
    };
    let format = query.format;
    let rendered = cpu::profile(request, move |profile| {
        render(&profile, format).map_err(CpuError::Failed)
    });
    match rendered.await {
        Ok(view) => view.into_response("profile"),
        Err(CpuError::Busy { retry_after }) => busy(
            retry_after,
            "a CPU profile is already running and ends in about {}s; retry after that",
        ),
        Err(CpuError::Unsupported) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "CPU profiling is not available on this platform: it needs Linux on x86_64 or aarch64",
        ),
        Err(CpuError::Failed(reason)) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!(
                "CPU profiling failed: {reason}; the profiler is free again, retry the request"
            ),
        ),
    }
}

async fn heap_profile(shared: Arc<Shared>, request: Request) -> Response {
    let (parts, _body) = request.into_parts();
    let query = match HeapQuery::parse(parts.uri.query(), &shared.config) {
        Ok(query) => query,
        Err(message) => return error(StatusCode::BAD_REQUEST, &message),
    };
    let format = query.format;
    let rendered = heap::profile(
        HeapRequest {
            window: query.window,
        },
        move |profile| render(&profile, format).map_err(HeapError::Failed),
    );
    let unavailable = |message: &str| error(StatusCode::SERVICE_UNAVAILABLE, message);
    match rendered.await {
        Ok(view) => view.into_response("heap"),
        Err(HeapError::Busy { retry_after }) => busy(
            retry_after,
            "a timed heap sampling window is already running and ends in about {}s; retry after that",
        ),
        Err(HeapError::Unsupported(reason)) => unavailable(reason),
        Err(HeapError::NotJemalloc) => unavailable(
            "heap profiling needs jemalloc as the global allocator: add \
             `#[global_allocator] static ALLOC: krabka_pprof::Jemalloc = krabka_pprof::Jemalloc;` \
             to the binary and restart it",
        ),
        Err(HeapError::NoProfilingSupport) => unavailable(
            "this binary's jemalloc was built without profiling: enable krabka-pprof's \
             `heap-profiling` feature, which builds it with profiling, and rebuild",
        ),
        Err(HeapError::ProfilingOff) => unavailable(
            "jemalloc heap sampling is off in this process (MALLOC_CONF or _RJEM_MALLOC_CONF \
             sets prof:false): remove that setting and restart the process",
        ),
        Err(HeapError::Failed(reason)) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("heap profiling failed: {reason}; retry the request"),
        ),
    }
}

/// A `/heap` or `/allocs` request after defaults and clamping.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct HeapQuery {
    /// The sampling window, used only if sampling is not already active.
    pub(crate) window: Duration,
    pub(crate) format: Format,
}

impl HeapQuery {
    /// `seconds` (used only when sampling is not already active): missing →
    /// `heap_default`, `0` → 1 s, above `heap_max` → `heap_max`.
    pub(crate) fn parse(query: Option<&str>, config: &ProfilingConfig) -> Result<Self, String> {
        let params = Params::parse(query)?;
        let format = match params.get("format") {
            None => Format::Pprof,
            Some(text) => Format::parse(text)?,
        };
        let max_secs = config.heap_max().as_secs();
        let window = match params.get("seconds") {
            None => config.heap_default(),
            Some(text) => Duration::from_secs(parse_seconds(text, max_secs)?.clamp(1, max_secs)),
        };
        Ok(HeapQuery {
            window: window.min(config.heap_max()),
            format,
        })
    }
}

/// A `/profile` request after defaults and clamping.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct CpuQuery {
    pub(crate) duration: Duration,
    pub(crate) frequency: u32,
    pub(crate) format: Format,
}

/// The `?format=` views of a profile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Format {
    /// Gzipped pprof protobuf, what `go tool pprof` and the scrapers read.
    Pprof,
    /// A `go tool pprof -top`-style table.
    Text,
}

impl Format {
    const VALID: &'static str = "pprof (the default) or text";

    fn parse(text: &str) -> Result<Format, String> {
        match text {
            "pprof" | "proto" => Ok(Format::Pprof),
            "text" | "top" => Ok(Format::Text),
            other => Err(format!(
                "`format` must be {}, found {other:?}",
                Format::VALID
            )),
        }
    }
}

/// A rendered view, ready to send.
pub(crate) enum View {
    Pprof(Vec<u8>),
    Text(String),
}

impl View {
    fn into_response(self, filename: &'static str) -> Response {
        match self {
            View::Pprof(body) => pprof_response(body, filename),
            View::Text(text) => (
                StatusCode::OK,
                [
                    (
                        header::CONTENT_TYPE,
                        HeaderValue::from_static("text/plain; charset=utf-8"),
                    ),
                    (
                        header::X_CONTENT_TYPE_OPTIONS,
                        HeaderValue::from_static("nosniff"),
                    ),
                    (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
                ],
                text,
            )
                .into_response(),
        }
    }
}

/// Renders `profile` as `format`; runs on the blocking pool.
fn render(profile: &Profile, format: Format) -> Result<View, String> {
    match format {
        Format::Pprof => gzip_profile(profile).map(View::Pprof),
        Format::Text => Ok(View::Text(views::top_table(profile, views::TOP_ROWS))),
    }
}

impl CpuQuery {
    /// `seconds`: missing → `cpu_default`, `0` → 1 s, above `cpu_max` → `cpu_max`; anything
    /// that is not a non-negative integer is an error. Unknown parameters are ignored, as
    /// Go ignores them (`debug`, `gc`).
    pub(crate) fn parse(query: Option<&str>, config: &ProfilingConfig) -> Result<Self, String> {
        let params = Params::parse(query)?;
        let seconds = params.get("seconds");
        let format = match params.get("format") {
            None => Format::Pprof,
            Some(text) => Format::parse(text)?,
        };
        let max_secs = config.cpu_max().as_secs();
        let duration = match seconds {
            None => config.cpu_default(),
            Some(text) => Duration::from_secs(parse_seconds(text, max_secs)?.clamp(1, max_secs)),
        };
        Ok(CpuQuery {
            duration: duration.min(config.cpu_max()),
            frequency: config.frequency(),
            format,
        })
    }
}

/// The query parameters this crate reads, each at most once. Others are ignored, as Go
/// ignores them (`debug`, `gc`), so generic tooling keeps working.
struct Params(Vec<(&'static str, String)>);

impl Params {
    const KNOWN: &'static [&'static str] = &["seconds", "format", "frequency", "force"];

    fn parse(query: Option<&str>) -> Result<Params, String> {
        let mut found: Vec<(&'static str, String)> = Vec::new();
        for (key, value) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
            let Some(known) = Self::KNOWN.iter().find(|k| **k == key) else {
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

/// Encodes and gzips a profile the way Go serves it (fastest level: the payload is small
/// and the time is better spent elsewhere).
fn gzip_profile(profile: &Profile) -> Result<Vec<u8>, String> {
    use pprof::protos::Message as _;
    let encoded = profile.encode_to_vec();
    let mut gz = flate2::write::GzEncoder::new(
        Vec::with_capacity(encoded.len() / 2 + 64),
        flate2::Compression::fast(),
    );
    gz.write_all(&encoded)
        .and_then(|()| gz.finish())
        .map_err(|e| format!("could not gzip the profile: {e}"))
}

/// 200 with a gzipped pprof body, as Go's `net/http/pprof` sends it.
fn pprof_response(body: Vec<u8>, filename: &'static str) -> Response {
    let disposition = match filename {
        "heap" => HeaderValue::from_static("attachment; filename=\"heap\""),
        _ => HeaderValue::from_static("attachment; filename=\"profile\""),
    };
    (
        StatusCode::OK,
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            ),
            (header::CONTENT_DISPOSITION, disposition),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
        ],
        Body::from(body),
    )
        .into_response()
}

/// Go's `serveError`: plain text, `X-Go-Pprof: 1` (so `go tool pprof` prints the body),
/// one sentence and a newline.
pub(crate) fn error(status: StatusCode, message: &str) -> Response {
    let mut body = String::with_capacity(message.len() + 1);
    body.push_str(message);
    body.push('\n');
    (
        status,
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            ),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            ),
            (
                header::HeaderName::from_static("x-go-pprof"),
                HeaderValue::from_static("1"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
        ],
        body,
    )
        .into_response()
}

/// 409 with `Retry-After`: answered at once, never queued. `message` has one `{}` for
/// the seconds.
fn busy(retry_after: Duration, message: &str) -> Response {
    let seconds = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
    let seconds = seconds.max(1);
    let mut response = error(
        StatusCode::CONFLICT,
        &message.replacen("{}", &seconds.to_string(), 1),
    );
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    response
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
        ] {
            let err = parse(&format!("seconds={bad}")).unwrap_err();
            assert!(err.contains("whole number of seconds"), "{bad}: {err}");
        }
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
        assert_eq!(
            err,
            "`format` must be pprof (the default) or text, found \"pdf\""
        );
        assert!(
            parse("format=text&format=pprof")
                .unwrap_err()
                .contains("more than once")
        );
    }

    #[test]
    fn busy_rounds_retry_after_up() {
        let response = busy(Duration::from_millis(2100), "ends in {}s");
        assert_eq!(response.status(), StatusCode::CONFLICT);
        assert_eq!(response.headers()[header::RETRY_AFTER], "3");
        assert_eq!(
            busy(Duration::ZERO, "{}").headers()[header::RETRY_AFTER],
            "1"
        );
    }
}
