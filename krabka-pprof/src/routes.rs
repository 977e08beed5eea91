//! The HTTP contract: the routes, access control, query parsing, the views, and
//! Go-compatible success and error responses. Every request runs in one `tracing` span.

use std::io::Write as _;
use std::sync::Arc;
use std::time::Duration;

use crate::proto::Profile;
use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tracing::{Instrument as _, field};

use crate::config::{ConfigError, Guard, MAX_FREQUENCY, MIN_FREQUENCY, ProfilingConfig};
use crate::cpu::{self, CpuError, CpuRequest};
use crate::heap::{self, HeapError, HeapRequest};
use crate::views;

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
    access: Access,
}

/// Who may use the routes: decided before any profiler work and before the query is read.
struct Access {
    guard: Option<Guard>,
    token: Token,
}

enum Token {
    /// No `token_env`.
    NotRequired,
    /// `token_env` names a variable that was unset or empty at startup: fail closed.
    Locked(&'static str),
    Required {
        variable: &'static str,
        value: Box<[u8]>,
    },
}

impl Access {
    /// Reads the token variable now, when the router is built (at startup).
    fn from_config(config: &ProfilingConfig) -> Access {
        let token = match config.token_env() {
            None => Token::NotRequired,
            Some(variable) => match std::env::var_os(variable) {
                Some(value) if !value.is_empty() => Token::Required {
                    variable,
                    value: value.into_encoded_bytes().into_boxed_slice(),
                },
                _ => {
                    tracing::warn!(
                        variable,
                        "the profiling routes are locked: their token variable is unset or empty"
                    );
                    Token::Locked(variable)
                }
            },
        };
        Access {
            guard: config.guard(),
            token,
        }
    }

    /// The refusal to send, if any, logged without the token.
    fn refusal(&self, parts: &Parts) -> Option<Response> {
        match &self.token {
            Token::NotRequired => {}
            Token::Locked(variable) => {
                tracing::warn!(outcome = "locked", "refused: the token variable is unset");
                return Some(error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    &format!(
                        "profiling is locked: {variable} was unset or empty when the service \
                         started; set it to a secret token and restart the service"
                    ),
                ));
            }
            Token::Required { variable, value } => {
                if !bearer_matches(&parts.headers, value) {
                    tracing::warn!(
                        outcome = "unauthorized",
                        "refused: missing or wrong bearer token"
                    );
                    let mut response = error(
                        StatusCode::UNAUTHORIZED,
                        &format!(
                            "send `Authorization: Bearer <token>` with the token from the \
                             service's {variable} environment variable"
                        ),
                    );
                    response.headers_mut().insert(
                        header::WWW_AUTHENTICATE,
                        HeaderValue::from_static("Bearer realm=\"pprof\""),
                    );
                    return Some(response);
                }
            }
        }
        if let Some(guard) = self.guard
            && !guard(parts)
        {
            tracing::warn!(outcome = "forbidden", "refused by the guard");
            return Some(error(
                StatusCode::FORBIDDEN,
                "the service's guard refused this request; ask its operators for access",
            ));
        }
        None
    }
}

/// `Authorization: Bearer <token>`, compared in constant time.
fn bearer_matches(headers: &HeaderMap, expected: &[u8]) -> bool {
    use subtle::ConstantTimeEq as _;
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return false;
    };
    let value = value.as_bytes();
    let Some(scheme) = value.get(..7) else {
        return false;
    };
    if !scheme.eq_ignore_ascii_case(b"bearer ") {
        return false;
    }
    let presented = value[7..].trim_ascii();
    // Different lengths are unequal at once; equal lengths take the same time whatever
    // the bytes.
    presented.len() == expected.len() && bool::from(presented.ct_eq(expected))
}

pub(crate) fn build<S>(config: ProfilingConfig) -> Router<S>
where
    S: Clone + Send + Sync + 'static,
{
    let shared = Arc::new(Shared {
        config,
        access: Access::from_config(&config),
    });
    let prefix = config.prefix();
    let handler = |route: Route| {
        let shared = shared.clone();
        get(move |request: Request| handle(shared.clone(), route, request))
    };
    let mut router = Router::new()
        .route(prefix, handler(Route::Redirect))
        .route(&format!("{prefix}/"), handler(Route::Index))
        .route(&format!("{prefix}/profile"), handler(Route::Profile));
    if config.heap() {
        // `/allocs` is where Parca and Grafana Alloy look for memory by default.
        router = router
            .route(&format!("{prefix}/heap"), handler(Route::Heap))
            .route(&format!("{prefix}/allocs"), handler(Route::Allocs));
    }
    router
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Route {
    Redirect,
    Index,
    Profile,
    Heap,
    Allocs,
}

impl Route {
    fn name(self) -> &'static str {
        match self {
            Route::Redirect => "",
            Route::Index => "/",
            Route::Profile => "/profile",
            Route::Heap => "/heap",
            Route::Allocs => "/allocs",
        }
    }
}

/// Every route: one span, access first, then the route's own work.
async fn handle(shared: Arc<Shared>, route: Route, request: Request) -> Response {
    let (parts, _body) = request.into_parts();
    let span = tracing::info_span!(
        "pprof",
        route = %format_args!("{}{}", shared.config.prefix(), route.name()),
        seconds_requested = field::Empty,
        seconds = field::Empty,
        frequency = field::Empty,
        format = field::Empty,
        samples = field::Empty,
        bytes = field::Empty,
        outcome = field::Empty,
        stack_reader = field::Empty,
        threads_timed = field::Empty,
        foreign_signals = field::Empty,
        handler_p50_ns = field::Empty,
        handler_p99_ns = field::Empty,
        rate_capped = field::Empty,
        handler_replaced = field::Empty,
    );
    async move {
        if let Some(refusal) = shared.access.refusal(&parts) {
            tracing::Span::current().record("outcome", "refused");
            return refusal;
        }
        match route {
            Route::Redirect => redirect(&format!("{}/", shared.config.prefix())),
            Route::Index => index(&shared.config, &parts),
            Route::Profile => cpu_profile(&shared.config, &parts).await,
            Route::Heap | Route::Allocs => heap_profile(&shared.config, &parts).await,
        }
    }
    .instrument(span)
    .await
}

async fn cpu_profile(config: &ProfilingConfig, parts: &Parts) -> Response {
    let span = tracing::Span::current();
    let query = match CpuQuery::parse(parts.uri.query(), config) {
        Ok(query) => query,
        Err(message) => return bad_request(&message),
    };
    span.record("seconds", query.duration.as_secs_f64());
    span.record("frequency", query.frequency);
    span.record("format", query.format.name());
    if let Some(requested) = query.seconds_requested {
        span.record("seconds_requested", requested);
    }
    let request = CpuRequest {
        duration: query.duration,
        frequency: query.frequency,
        blocklist: config.blocklist(),
        force: query.force,
    };
    let format = query.format;
    let subtitle = format!("{} s at {} Hz", query.duration.as_secs(), query.frequency);
    let rendered = cpu::profile(request, move |profile| {
        render(&profile, format, "CPU", &subtitle).map_err(CpuError::Failed)
    });
    match rendered.await {
        Ok(view) => view.into_response("profile"),
        Err(CpuError::Busy { retry_after }) => {
            span.record("outcome", "busy");
            tracing::debug!("refused: a CPU profile is already running");
            busy(
                retry_after,
                "a CPU profile is already running and ends in about {}s; retry after that, \
                 or add force=true to stop it early",
            )
        }
        Err(CpuError::Unavailable(reason)) => unavailable(reason),
        Err(CpuError::Failed(reason)) => failed(&format!(
            "CPU profiling failed: {reason}; the profiler is free again, retry the request"
        )),
    }
}

async fn heap_profile(config: &ProfilingConfig, parts: &Parts) -> Response {
    let span = tracing::Span::current();
    let query = match HeapQuery::parse(parts.uri.query(), config) {
        Ok(query) => query,
        Err(message) => return bad_request(&message),
    };
    span.record("format", query.format.name());
    if let Some(requested) = query.seconds_requested {
        span.record("seconds_requested", requested);
    }
    let format = query.format;
    let rendered = heap::profile(
        HeapRequest {
            window: query.window,
        },
        move |profile| {
            let subtitle = if profile.duration_nanos > 0 {
                format!(
                    "live memory sampled over {} s",
                    profile.duration_nanos / 1_000_000_000
                )
            } else {
                "live memory, sampled since the process started".to_owned()
            };
            render(&profile, format, "Heap in use", &subtitle).map_err(HeapError::Failed)
        },
    );
    match rendered.await {
        Ok(view) => view.into_response("heap"),
        Err(HeapError::Busy { retry_after }) => {
            span.record("outcome", "busy");
            tracing::debug!("refused: a timed heap window is already running");
            busy(
                retry_after,
                "a timed heap sampling window is already running and ends in about {}s; \
                 retry after that",
            )
        }
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
        Err(HeapError::Failed(reason)) => failed(&format!(
            "heap profiling failed: {reason}; retry the request"
        )),
    }
}

/// A `/profile` request after defaults and clamping.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct CpuQuery {
    pub(crate) duration: Duration,
    pub(crate) seconds_requested: Option<u64>,
    pub(crate) frequency: u32,
    pub(crate) format: Format,
    pub(crate) force: bool,
}

impl CpuQuery {
    /// `seconds`: missing → `cpu_default`, `0` → 1 s, above `cpu_max` → `cpu_max`; anything
    /// that is not a non-negative integer is an error. `frequency`: 1 ..= 1000 Hz, default
    /// the configured one. `force`: `true` stops a running profile early. Unknown
    /// parameters are ignored, as Go ignores them (`debug`, `gc`).
    pub(crate) fn parse(query: Option<&str>, config: &ProfilingConfig) -> Result<Self, String> {
        let params = Params::parse(query)?;
        let format = Format::from_params(&params)?;
        let (duration, seconds_requested) =
            window(&params, config.cpu_default(), config.cpu_max())?;
        let frequency = match params.get("frequency") {
            None => config.frequency(),
            Some(text) => parse_frequency(text)?,
        };
        let force = match params.get("force") {
            None | Some("false" | "0") => false,
            Some("true" | "1") => true,
            Some(other) => {
                return Err(format!("`force` must be true or false, found {other:?}"));
            }
        };
        Ok(CpuQuery {
            duration,
            seconds_requested,
            frequency,
            format,
            force,
        })
    }
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
    /// The sampling window, used only if sampling is not already active.
    pub(crate) window: Duration,
    pub(crate) seconds_requested: Option<u64>,
    pub(crate) format: Format,
}

impl HeapQuery {
    /// `seconds` (used only when sampling is not already active): missing →
    /// `heap_default`, `0` → 1 s, above `heap_max` → `heap_max`.
    pub(crate) fn parse(query: Option<&str>, config: &ProfilingConfig) -> Result<Self, String> {
        let params = Params::parse(query)?;
        let format = Format::from_params(&params)?;
        let (window, seconds_requested) =
            window(&params, config.heap_default(), config.heap_max())?;
        Ok(HeapQuery {
            window,
            seconds_requested,
            format,
        })
    }
}

/// The `?format=` views of a profile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Format {
    /// Gzipped pprof protobuf, what `go tool pprof` and the scrapers read.
    Pprof,
    /// A flamegraph, SVG.
    #[cfg_attr(not(feature = "flamegraph"), allow(dead_code))]
    Svg,
    /// A `go tool pprof -top`-style table.
    Text,
}

impl Format {
    #[cfg(feature = "flamegraph")]
    const VALID: &'static str = "pprof (the default), svg or text";
    #[cfg(not(feature = "flamegraph"))]
    const VALID: &'static str =
        "pprof (the default) or text (svg needs krabka-pprof's `flamegraph` feature)";

    fn from_params(params: &Params) -> Result<Format, String> {
        match params.get("format") {
            None | Some("pprof" | "proto") => Ok(Format::Pprof),
            Some("text" | "top") => Ok(Format::Text),
            Some("svg" | "flamegraph") if cfg!(feature = "flamegraph") => Ok(Format::Svg),
            Some(other) => Err(format!(
                "`format` must be {}, found {other:?}",
                Format::VALID
            )),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Format::Pprof => "pprof",
            Format::Svg => "svg",
            Format::Text => "text",
        }
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

/// A rendered view, ready to send, and how many samples it holds.
pub(crate) struct View {
    body: ViewBody,
    samples: i64,
}

enum ViewBody {
    Pprof(Vec<u8>),
    #[cfg_attr(not(feature = "flamegraph"), allow(dead_code))]
    Svg(String),
    Text(String),
}

/// Renders `profile` as `format`; runs on the blocking pool.
fn render(profile: &Profile, format: Format, title: &str, subtitle: &str) -> Result<View, String> {
    let samples = profile
        .sample
        .iter()
        .map(|s| s.value.first().copied().unwrap_or(0))
        .sum();
    let body = match format {
        Format::Pprof => ViewBody::Pprof(gzip_profile(profile)?),
        Format::Text => ViewBody::Text(views::top_table(profile, views::TOP_ROWS)),
        #[cfg(feature = "flamegraph")]
        Format::Svg => ViewBody::Svg(views::flamegraph(profile, title, subtitle)?),
        #[cfg(not(feature = "flamegraph"))]
        Format::Svg => {
            let _ = (title, subtitle);
            return Err("flamegraphs are compiled out".to_owned());
        }
    };
    Ok(View { body, samples })
}

impl View {
    fn into_response(self, filename: &'static str) -> Response {
        let span = tracing::Span::current();
        span.record("samples", self.samples);
        let (content_type, body): (&'static str, Body) = match self.body {
            ViewBody::Pprof(bytes) => {
                span.record("bytes", bytes.len());
                span.record("outcome", "ok");
                tracing::info!("profile served");
                return pprof_response(bytes, filename);
            }
            ViewBody::Svg(svg) => ("image/svg+xml", svg.into()),
            ViewBody::Text(text) => ("text/plain; charset=utf-8", text.into()),
        };
        let mut response = Response::new(body);
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
        headers.insert(
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        );
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        // inferno's SVG scripts its own zoom and search; nothing may load from elsewhere.
        headers.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'",
            ),
        );
        if let Some(length) = axum::body::HttpBody::size_hint(response.body()).exact() {
            span.record("bytes", length);
        }
        span.record("outcome", "ok");
        tracing::info!("profile served");
        response
    }
}

/// Encodes and gzips a profile the way Go serves it (fastest level: the payload is small
/// and the time is better spent elsewhere).
fn gzip_profile(profile: &Profile) -> Result<Vec<u8>, String> {
    use crate::proto::Message as _;
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

fn bad_request(message: &str) -> Response {
    let span = tracing::Span::current();
    span.record("outcome", "bad_query");
    tracing::debug!(reason = message, "refused: bad query");
    error(StatusCode::BAD_REQUEST, message)
}

fn unavailable(message: &str) -> Response {
    tracing::Span::current().record("outcome", "unavailable");
    tracing::warn!(reason = message, "profiling unavailable");
    error(StatusCode::SERVICE_UNAVAILABLE, message)
}

fn failed(message: &str) -> Response {
    tracing::Span::current().record("outcome", "failed");
    tracing::warn!(reason = message, "profiling failed");
    error(StatusCode::INTERNAL_SERVER_ERROR, message)
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

/// `{prefix}` → `{prefix}/`, as Go's mux answers.
fn redirect(location: &str) -> Response {
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::MOVED_PERMANENTLY;
    if let Ok(value) = HeaderValue::from_str(location) {
        response.headers_mut().insert(header::LOCATION, value);
    }
    response
}

/// The index page: every route this app serves, the settings in force, ready links.
fn index(config: &ProfilingConfig, parts: &Parts) -> Response {
    let host = parts
        .headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("HOST");
    let html = views::index_html(config, host);
    let mut response = Response::new(Body::from(html));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("default-src 'none'; style-src 'unsafe-inline'"),
    );
    tracing::Span::current().record("outcome", "ok");
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
    fn frequency_and_force() {
        assert_eq!(parse("").unwrap().frequency, 99);
        assert_eq!(parse("frequency=1").unwrap().frequency, 1);
        assert_eq!(parse("frequency=1000").unwrap().frequency, 1000);
        for bad in ["0", "1001", "-5", "x", "", "99.5"] {
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
    fn bearer_tokens() {
        let with = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::AUTHORIZATION, HeaderValue::from_str(value).unwrap());
            headers
        };
        assert!(bearer_matches(&with("Bearer s3cret"), b"s3cret"));
        assert!(bearer_matches(&with("bearer s3cret"), b"s3cret"));
        assert!(bearer_matches(&with("Bearer  s3cret "), b"s3cret"));
        assert!(!bearer_matches(&with("Bearer s3cre"), b"s3cret"));
        assert!(!bearer_matches(&with("Bearer s3cretX"), b"s3cret"));
        assert!(!bearer_matches(&with("Basic s3cret"), b"s3cret"));
        assert!(!bearer_matches(&with("Bearer"), b"s3cret"));
        assert!(!bearer_matches(&HeaderMap::new(), b"s3cret"));
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
