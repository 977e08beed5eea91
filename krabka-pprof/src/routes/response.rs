//! Answers, as Go's `net/http/pprof` sends them: gzipped pprof, the text and SVG views and
//! the index page on success; on failure one plain-text sentence with `X-Go-Pprof: 1`, and
//! `Retry-After` when busy. Each records its outcome on the request's span.

use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;

use crate::views::{View, ViewBody};

/// A response with the headers every answer with a body carries: its type, `nosniff` (no
/// browser may guess another) and `no-store` (a profile is one moment, never to be cached).
fn answer(status: StatusCode, content_type: &'static str, body: Body) -> Response {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// 200 with a rendered view: pprof as Go sends it, or the text or SVG view.
pub(super) fn view(view: View, filename: &'static str) -> Response {
    let span = tracing::Span::current();
    span.record("samples", view.samples);
    let (content_type, body): (&'static str, Body) = match view.body {
        ViewBody::Pprof(bytes) => {
            span.record("bytes", bytes.len());
            span.record("outcome", "ok");
            tracing::info!("profile served");
            return pprof_response(bytes, filename);
        }
        ViewBody::Svg(svg) => ("image/svg+xml", svg.into()),
        ViewBody::Text(text) => ("text/plain; charset=utf-8", text.into()),
    };
    let mut response = answer(StatusCode::OK, content_type, body);
    // inferno's SVG scripts its own zoom and search; nothing may load from elsewhere.
    response.headers_mut().insert(
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

/// 200 with a dump as plain text (tokio's tasks), as Go sends `goroutine?debug=1`.
pub(super) fn dump_text(text: String) -> Response {
    let span = tracing::Span::current();
    span.record("bytes", text.len());
    span.record("outcome", "ok");
    tracing::info!("dump served");
    answer(
        StatusCode::OK,
        "text/plain; charset=utf-8",
        Body::from(text),
    )
}

/// 200 with a gzipped pprof body, as Go's `net/http/pprof` sends it.
fn pprof_response(body: Vec<u8>, filename: &'static str) -> Response {
    let disposition = match filename {
        "heap" => HeaderValue::from_static("attachment; filename=\"heap\""),
        "threads" => HeaderValue::from_static("attachment; filename=\"threads\""),
        "goroutine" => HeaderValue::from_static("attachment; filename=\"goroutine\""),
        _ => HeaderValue::from_static("attachment; filename=\"profile\""),
    };
    let mut response = answer(StatusCode::OK, "application/octet-stream", Body::from(body));
    response
        .headers_mut()
        .insert(header::CONTENT_DISPOSITION, disposition);
    response
}

/// 200 with `/cmdline`'s bytes (arguments separated by NUL), typed as Go types them.
pub(super) fn cmdline(line: Vec<u8>) -> Response {
    let span = tracing::Span::current();
    span.record("bytes", line.len());
    span.record("outcome", "ok");
    answer(
        StatusCode::OK,
        "text/plain; charset=utf-8",
        Body::from(line),
    )
}

/// The index page, HTML that loads nothing from elsewhere.
pub(super) fn index(html: String) -> Response {
    let mut response = answer(StatusCode::OK, "text/html; charset=utf-8", Body::from(html));
    response.headers_mut().insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("default-src 'none'; style-src 'unsafe-inline'"),
    );
    tracing::Span::current().record("outcome", "ok");
    response
}

/// `{prefix}` → `{prefix}/`, as Go's mux answers.
pub(super) fn redirect(location: &str) -> Response {
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::MOVED_PERMANENTLY;
    if let Ok(value) = HeaderValue::from_str(location) {
        response.headers_mut().insert(header::LOCATION, value);
    }
    response
}

/// Go's `serveError`: plain text, `X-Go-Pprof: 1` (so `go tool pprof` prints the body),
/// one sentence and a newline.
pub(super) fn error(status: StatusCode, message: &str) -> Response {
    let mut body = String::with_capacity(message.len() + 1);
    body.push_str(message);
    body.push('\n');
    let mut response = answer(status, "text/plain; charset=utf-8", Body::from(body));
    response.headers_mut().insert(
        header::HeaderName::from_static("x-go-pprof"),
        HeaderValue::from_static("1"),
    );
    response
}

pub(super) fn bad_request(message: &str) -> Response {
    let span = tracing::Span::current();
    span.record("outcome", "bad_query");
    tracing::debug!(reason = message, "refused: bad query");
    error(StatusCode::BAD_REQUEST, message)
}

/// 404: nothing exists for what was asked (a window of the past the recorder did not
/// keep).
pub(super) fn not_found(message: &str) -> Response {
    let span = tracing::Span::current();
    span.record("outcome", "not_kept");
    tracing::debug!(reason = message, "nothing to answer with");
    error(StatusCode::NOT_FOUND, message)
}

pub(super) fn unavailable(message: &str) -> Response {
    tracing::Span::current().record("outcome", "unavailable");
    tracing::warn!(reason = message, "profiling unavailable");
    error(StatusCode::SERVICE_UNAVAILABLE, message)
}

pub(super) fn failed(message: &str) -> Response {
    tracing::Span::current().record("outcome", "failed");
    tracing::warn!(reason = message, "profiling failed");
    error(StatusCode::INTERNAL_SERVER_ERROR, message)
}

/// 409 with `Retry-After`: answered at once, never queued. `message` has one `{}` for
/// the seconds.
pub(super) fn busy(retry_after: Duration, message: &str) -> Response {
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

    async fn body_of(response: Response) -> String {
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    /// A failure (which no test can provoke from outside: the sampler and the dumps do
    /// not fail on demand) is a 500 that `go tool pprof` prints: plain text, one sentence.
    #[tokio::test]
    async fn a_failure_is_a_500_go_tool_pprof_prints() {
        let response = failed("the thread dump failed: x; retry the request");
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(response.headers()["x-go-pprof"], "1");
        assert_eq!(
            response.headers()[header::CONTENT_TYPE],
            "text/plain; charset=utf-8"
        );
        assert_eq!(
            body_of(response).await,
            "the thread dump failed: x; retry the request\n"
        );
    }

    /// tokio's task dump (run by the `tasks` suite only in a `tokio_unstable` build) is
    /// served as text, as Go serves `goroutine?debug=1`.
    #[tokio::test]
    async fn a_dump_is_served_as_plain_text() {
        let response = dump_text("task 1\n".to_owned());
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            response.headers()[header::CONTENT_TYPE],
            "text/plain; charset=utf-8"
        );
        assert_eq!(response.headers()[header::CACHE_CONTROL], "no-store");
        assert_eq!(body_of(response).await, "task 1\n");
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
        // Whole seconds stay as they are: nothing to round.
        let whole = busy(Duration::from_secs(2), "ends in {}s");
        assert_eq!(whole.headers()[header::RETRY_AFTER], "2");
    }
}
