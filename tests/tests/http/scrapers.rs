//! Requests exactly as Parca and Grafana Alloy send them (prometheus/common's client: no
//! Accept-Encoding; their own User-Agent), checked the way each one checks the answer,
//! and the window each profile covers checked against the client's clock around it.

use std::time::{Duration, SystemTime};

use axum::Router;
use krabka_pprof::pprof_routes;
use krabka_pprof_tests::{Burner, TestServer, assert_window_inside, decode, raw_request, serial};

#[pprof_routes]
fn app() -> Router {
    Router::new()
}

/// A service that caps profiles at 3 s: Alloy's 14 s request is answered after 3 s.
#[pprof_routes(cpu_max = "3s")]
fn capped() -> Router {
    Router::new()
}

fn header<'h>(headers: &'h [(String, String)], name: &str) -> Option<&'h str> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

#[tokio::test]
async fn parca_process_cpu_scrape() {
    let _serial = serial().await;
    let server = TestServer::start(app);
    let burner = Burner::start(1, Duration::from_secs(30));
    // Parca's default: scrape_interval 10 s, so seconds=10; its timeout is 13 s.
    let request = format!(
        "GET /debug/pprof/profile?seconds=10 HTTP/1.1\r\nHost: {}\r\nUser-Agent: conprof/v0.23.0\r\n\
         Connection: close\r\n\r\n",
        server.addr
    );
    let started = std::time::Instant::now();
    let sent = SystemTime::now();
    let (status, headers, body) = raw_request(server.addr, &request).await;
    let received = SystemTime::now();
    drop(burner);
    // Parca: anything but 200 is an error, an empty body is an error, the body goes
    // through profile.ParseData (gzip or raw protobuf).
    assert_eq!(status, 200);
    assert!(!body.is_empty());
    assert!(
        header(&headers, "content-encoding").is_none(),
        "no transparent encoding"
    );
    let profile = decode(&body);
    assert!(profile.duration_nanos >= 9_900_000_000);
    assert_window_inside(&profile, sent, received, "Parca's scrape");
    assert!(
        started.elapsed() < Duration::from_secs(13),
        "Parca gives a 10 s profile 13 s"
    );
}

#[tokio::test]
async fn alloy_process_cpu_scrape() {
    let _serial = serial().await;
    let server = TestServer::start(capped);
    // Alloy's default: scrape_interval 15 s, so seconds=14.
    let request = format!(
        "GET /debug/pprof/profile?seconds=14 HTTP/1.1\r\nHost: {}\r\n\
         User-Agent: Alloy/v1.11.0 (linux; binary)\r\nConnection: close\r\n\r\n",
        server.addr
    );
    let sent = SystemTime::now();
    let (status, headers, body) = raw_request(server.addr, &request).await;
    let received = SystemTime::now();
    // Alloy's validate.go: 2xx; a non-empty body; a Content-Type that starts with
    // application/octet-stream; not HTML, not JSON; gzip magic or a protobuf wire type.
    assert!((200..300).contains(&status));
    assert!(!body.is_empty());
    let content_type = header(&headers, "content-type").expect("Alloy requires Content-Type");
    assert!(content_type.starts_with("application/octet-stream"));
    assert!(!body.starts_with(b"<") && !body.starts_with(b"{"));
    assert_eq!(&body[..2], &[0x1f, 0x8b]);
    // Answered after the service's 3 s, not the 14 s asked for.
    let profile = decode(&body);
    let (start, end) = assert_window_inside(&profile, sent, received, "Alloy's scrape");
    let length = end.duration_since(start).unwrap();
    assert!(
        (Duration::from_secs(3)..Duration::from_millis(3500)).contains(&length),
        "a 14 s scrape of a service capped at 3 s covers {length:?}"
    );
    assert!(
        received.duration_since(sent).unwrap() < Duration::from_secs(10),
        "the answer came after {:?}, not after the 14 s asked for",
        received.duration_since(sent).unwrap()
    );
}

#[tokio::test]
async fn errors_are_plain_text_that_scrapers_report() {
    let server = TestServer::start(app);
    let request = format!(
        "GET /debug/pprof/profile?seconds=fourteen HTTP/1.1\r\nHost: {}\r\n\
         User-Agent: Alloy/v1.11.0\r\nConnection: close\r\n\r\n",
        server.addr
    );
    let (status, headers, body) = raw_request(server.addr, &request).await;
    assert_eq!(status, 400);
    assert_eq!(
        header(&headers, "content-type"),
        Some("text/plain; charset=utf-8")
    );
    assert_eq!(header(&headers, "x-go-pprof"), Some("1"));
    let text = String::from_utf8(body).unwrap();
    assert!(
        text.ends_with('\n') && text.len() < 200,
        "short enough for a scrape error: {text}"
    );
}
