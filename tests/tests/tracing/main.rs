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

/// [`has_field`] matches whole fields only; called by the binary's one test.
fn a_field_is_matched_whole() {
    let line = "pprof{route=/debug/pprof/profile seconds_requested=1 seconds=10}: served";
    assert!(has_field(line, "seconds=10"));
    assert!(has_field(line, "route=/debug/pprof/profile"));
    assert!(!has_field(line, "seconds=1"));
    assert!(has_field(line, "seconds_requested=1"));
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
    assert!(
        !log.contains("tr4cing-s3cret") && !log.contains("wrong-but-logged"),
        "tokens must never be logged:\n{log}"
    );
}
