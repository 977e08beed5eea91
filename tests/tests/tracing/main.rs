//! The `tracing` output of the routes: one span per request with what was asked and what
//! was served, refusals at warn or debug, and never the token. One test in this binary,
//! so that it owns the global subscriber and the environment it sets at its start.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use krabka_pprof::pprof_routes;
use krabka_pprof_tests::{Burner, TestServer, client, decode, total};
use reqwest::StatusCode;

#[pprof_routes(token_env = "KRABKA_PPROF_TRACING_TOKEN", cpu_max = "5s")]
fn app() -> Router {
    Router::new()
}

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn take(&self) -> String {
        String::from_utf8(std::mem::take(&mut *self.0.lock().unwrap())).unwrap()
    }
}

/// Whether the log line carries `field` (`name=value`) as a whole field: `seconds=1` is
/// not found in `seconds=10` nor in `seconds_requested=1`.
fn has_field(line: &str, field: &str) -> bool {
    line.split([' ', '{', '}', ','])
        .map(|token| token.trim_end_matches(':'))
        .any(|token| token == field)
}

/// The value of `name` in the log line: a quoted string whole (it may hold spaces), else
/// the token up to the next space or brace.
fn field<'l>(line: &'l str, name: &str) -> Option<&'l str> {
    let at = line
        .match_indices(&format!("{name}="))
        .map(|(at, _)| at)
        .find(|&at| at == 0 || line[..at].ends_with([' ', '{']))?;
    let rest = &line[at + name.len() + 1..];
    if let Some(quoted) = rest.strip_prefix('"') {
        return quoted.split_once('"').map(|(value, _)| value);
    }
    rest.split([' ', '}']).next()
}

/// The lines of `log` that close a span of `route`, in order.
fn closings<'l>(log: &'l str, route: &str) -> Vec<&'l str> {
    log.lines()
        .filter(|l| l.contains(": close ") && has_field(l, &format!("route={route}")))
        .collect()
}

/// The line of `log` that closes the first span of `route`.
fn closing<'l>(log: &'l str, route: &str) -> &'l str {
    closings(log, route)
        .first()
        .unwrap_or_else(|| panic!("no span of {route} closed:\n{log}"))
}

/// [`has_field`] matches whole fields only; called by the binary's one test.
fn a_field_is_matched_whole() {
    let line = "pprof{route=/debug/pprof/profile seconds_requested=1 seconds=10}: served";
    assert!(has_field(line, "seconds=10"));
    assert!(has_field(line, "route=/debug/pprof/profile"));
    assert!(!has_field(line, "seconds=1"));
    assert!(has_field(line, "seconds_requested=1"));
    let line = r#"pprof{seconds=10 stack_reader="the pprof crate's sampler" windows=1}: close"#;
    assert_eq!(field(line, "seconds"), Some("10"));
    assert_eq!(
        field(line, "stack_reader"),
        Some("the pprof crate's sampler")
    );
    assert_eq!(field(line, "windows"), Some("1"));
    assert_eq!(field(line, "readers"), None);
}

#[tokio::test]
async fn spans_and_refusals() {
    // SAFETY: this binary's only test sets the variable before it starts any thread of
    // its own; nothing reads the environment concurrently.
    unsafe { std::env::set_var("KRABKA_PPROF_TRACING_TOKEN", "tr4cing-s3cret") };
    a_field_is_matched_whole();
    let captured = Captured::default();
    let writer = captured.clone();
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        // A line as each span closes, with every field it was given: the outcome of a
        // refusal is recorded after the last event inside it.
        .with_span_events(tracing_subscriber::fmt::format::FmtSpan::CLOSE)
        .init();

    let server = TestServer::start(app);
    let http = client();

    let burner = Burner::start(1, Duration::from_secs(20));
    let ok = http
        .get(server.url("/debug/pprof/profile?seconds=1&frequency=50"))
        .bearer_auth("tr4cing-s3cret")
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    let body = ok.bytes().await.unwrap();
    drop(burner);
    let profile = decode(&body);
    let log = captured.take();
    let line = log
        .lines()
        .find(|l| l.contains("profile served"))
        .unwrap_or_else(|| panic!("no 'profile served' event:\n{log}"));
    for field in [
        "route=/debug/pprof/profile",
        "seconds_requested=1",
        // The window actually granted, in seconds (a float: it may be clamped or cut).
        "seconds=1.0",
        "frequency=50",
        "format=\"pprof\"",
        &format!("bytes={}", body.len()),
        "outcome=\"ok\"",
        // The only window of its session.
        "windows=1",
    ] {
        assert!(has_field(line, field), "missing {field} in {line}");
    }
    assert!(line.contains(" INFO "), "{line}");
    let samples: i64 = line
        .split("samples=")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .expect("a samples field");
    assert!(samples > 0, "the burner was sampled");
    assert_eq!(
        samples,
        total(&profile, 0),
        "the span counts the samples it served"
    );
    // What the sampler noticed, in the span as it closes.
    let closed = closing(&log, "/debug/pprof/profile");
    assert_eq!(field(closed, "symbolize"), Some("full"), "{closed}");
    assert_eq!(field(closed, "outcome"), Some("ok"), "{closed}");
    let reader = field(closed, "stack_reader").expect("the stack reader");
    if reader == "the pprof crate's sampler" {
        // That sampler reports nothing of its own threads, signals or handler.
        assert_eq!(field(closed, "threads_timed"), None, "{closed}");
    } else {
        assert!(
            ["process_vm_readv", "/proc/self/mem"].contains(&reader),
            "a stack reader this crate names: {closed}"
        );
        let number = |name: &str| -> u64 {
            field(closed, name)
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no {name} in {closed}"))
        };
        assert!(
            number("threads_timed") >= 2,
            "the burner and the server: {closed}"
        );
        assert_eq!(number("foreign_signals"), 0, "{closed}");
        let (p50, p99) = (number("handler_p50_ns"), number("handler_p99_ns"));
        assert!(0 < p50 && p50 <= p99, "{closed}");
        // 50 Hz is under every kernel tick (100 Hz at the least).
        assert_eq!(field(closed, "rate_capped"), Some("false"), "{closed}");
        assert_eq!(field(closed, "handler_replaced"), Some("false"), "{closed}");
        // The reader chosen first, for the usual reason, is a debug line; a fallback, or
        // the first chosen because of a seccomp filter, which a reader of the profile
        // should know of, an info line.
        let said = format!("stack reader: {reader}");
        let line = log
            .lines()
            .find(|l| l.contains(&said))
            .unwrap_or_else(|| panic!("{said:?} in:\n{log}"));
        let level = if reader == "/proc/self/mem" && !line.contains("seccomp") {
            " DEBUG "
        } else {
            " INFO "
        };
        assert!(line.contains(level), "{said:?} at{level}: {line}");
    }

    let refused = http
        .get(server.url("/debug/pprof/profile?seconds=1"))
        .bearer_auth("wrong-but-logged?")
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    let bad = http
        .get(server.url("/debug/pprof/profile?seconds=xyz"))
        .bearer_auth("tr4cing-s3cret")
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
    let log = captured.take();
    assert!(
        log.lines()
            .any(|l| l.contains(" WARN ") && l.contains("missing or wrong bearer token")),
        "{log}"
    );
    assert!(
        log.lines()
            .any(|l| l.contains("DEBUG") && l.contains("bad query")),
        "{log}"
    );
    let closed = closings(&log, "/debug/pprof/profile");
    assert_eq!(closed.len(), 2, "{log}");
    assert_eq!(field(closed[0], "outcome"), Some("refused"), "{log}");
    assert_eq!(field(closed[1], "outcome"), Some("bad_query"), "{log}");
    assert_eq!(field(closed[1], "seconds"), None, "nothing granted: {log}");

    // Another route's span: what was asked and what was served.
    let dump = http
        .get(server.url("/debug/pprof/threads?debug=1"))
        .bearer_auth("tr4cing-s3cret")
        .send()
        .await
        .unwrap();
    assert_eq!(dump.status(), StatusCode::OK);
    let dump = dump.bytes().await.unwrap();
    let log = captured.take();
    let closed = closing(&log, "/debug/pprof/threads");
    assert_eq!(field(closed, "format"), Some("debug=1"), "{closed}");
    assert_eq!(field(closed, "symbolize"), Some("full"), "{closed}");
    assert_eq!(field(closed, "outcome"), Some("ok"), "{closed}");
    assert_eq!(
        field(closed, "bytes"),
        Some(dump.len().to_string().as_str()),
        "{closed}"
    );
    assert!(
        !log.contains("tr4cing-s3cret") && !log.contains("wrong-but-logged"),
        "tokens must never be logged:\n{log}"
    );
}
