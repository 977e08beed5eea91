//! `token_env`: bearer tokens checked in constant time before anything else (the guard
//! included); an unset variable locks the routes (503), never opens them. Run in a child
//! process, whose environment at startup the test chooses. Without a token or a guard, the
//! routes say at startup that they are open.

use krabka_pprof_tests::{ChildServer, client, decode, raw_request};
use reqwest::StatusCode;

const CHILD: &str = env!("CARGO_BIN_EXE_test_child");
const VAR: &str = "KRABKA_PPROF_TEST_TOKEN";

#[tokio::test]
async fn a_bearer_token_is_required_and_checked_first() {
    let child = ChildServer::start(CHILD, "serve-token", &[(VAR, Some("s3cret-token"))]);
    let http = client();
    for path in [
        "/debug/pprof/profile?seconds=abc",
        "/debug/pprof/",
        #[cfg(feature = "heap-profiling")]
        "/debug/pprof/heap",
    ] {
        let missing = http.get(child.url(path)).send().await.unwrap();
        assert_eq!(
            missing.status(),
            StatusCode::UNAUTHORIZED,
            "{path}: auth before the query"
        );
        assert_eq!(
            missing.headers()["www-authenticate"],
            "Bearer realm=\"pprof\""
        );
        let text = missing.text().await.unwrap();
        assert!(text.contains(VAR) && !text.contains("s3cret"), "{text}");

        let wrong = http
            .get(child.url(path))
            .bearer_auth("s3cret-tokeN")
            .send()
            .await
            .unwrap();
        assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    }
    let ok = http
        .get(child.url("/debug/pprof/profile?seconds=1"))
        .bearer_auth("s3cret-token")
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    decode(&ok.bytes().await.unwrap());
    let app = http.get(child.url("/")).send().await.unwrap();
    assert_eq!(
        app.text().await.unwrap(),
        "child",
        "the app's routes need no token"
    );
}

#[tokio::test]
async fn parca_and_alloy_bearer_headers_are_accepted() {
    let child = ChildServer::start(CHILD, "serve-token", &[(VAR, Some("s3cret-token"))]);
    // Both scrapers use prometheus/common's HTTP client: `Authorization: Bearer <token>`,
    // no Accept-Encoding. What they scrape by default: `/allocs`, and the CPU profile where
    // heap profiling is compiled out.
    let path = if cfg!(feature = "heap-profiling") {
        "/debug/pprof/allocs"
    } else {
        "/debug/pprof/profile?seconds=1"
    };
    for agent in ["conprof/v0.23.0", "Alloy/v1.11.0 (linux; binary)"] {
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: {}\r\nUser-Agent: {agent}\r\n\
             Authorization: Bearer s3cret-token\r\nConnection: close\r\n\r\n",
            child.addr
        );
        let (status, headers, body) = raw_request(child.addr, &request).await;
        if cfg!(all(target_env = "musl", feature = "heap-profiling")) {
            // Heap profiles need glibc: past the token, the route's own 503, not a 401.
            assert_eq!(status, 503, "{agent}: {}", String::from_utf8_lossy(&body));
            assert!(String::from_utf8_lossy(&body).contains("glibc"));
            continue;
        }
        assert_eq!(status, 200, "{agent}: {}", String::from_utf8_lossy(&body));
        assert!(
            headers
                .iter()
                .any(|(k, v)| k == "content-type" && v == "application/octet-stream")
        );
        decode(&body);
    }
}

#[tokio::test]
async fn an_unset_token_variable_locks_the_routes() {
    for value in [None, Some("")] {
        let child = ChildServer::start(CHILD, "serve-token", &[(VAR, value)]);
        let http = client();
        for token in [None, Some(""), Some("anything")] {
            let mut request = http.get(child.url("/debug/pprof/profile?seconds=1"));
            if let Some(token) = token {
                request = request.bearer_auth(token);
            }
            let response = request.send().await.unwrap();
            assert_eq!(
                response.status(),
                StatusCode::SERVICE_UNAVAILABLE,
                "{value:?} {token:?}"
            );
            let text = response.text().await.unwrap();
            assert!(text.contains("locked") && text.contains(VAR), "{text}");
        }
    }
}

/// Token and guard together: the token is checked first, so a stranger learns nothing of
/// the guard (401, never 403); a holder of the token still needs the guard's consent;
/// with both, every route answers, and the index page says which rules are in force.
#[tokio::test]
async fn with_a_token_and_a_guard_the_token_is_checked_first() {
    let child = ChildServer::start(CHILD, "serve-token-guard", &[(VAR, Some("s3cret-token"))]);
    let http = client();
    let get = |token: Option<&str>, internal: bool| {
        let mut request = http.get(child.url("/debug/pprof/"));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if internal {
            request = request.header("x-internal", "yes");
        }
        request.send()
    };
    for internal in [false, true] {
        for token in [None, Some("wrong")] {
            let refused = get(token, internal).await.unwrap();
            assert_eq!(
                refused.status(),
                StatusCode::UNAUTHORIZED,
                "token {token:?}, internal {internal}: the token first"
            );
        }
    }
    let forbidden = get(Some("s3cret-token"), false).await.unwrap();
    assert_eq!(forbidden.status(), StatusCode::FORBIDDEN);
    assert!(forbidden.text().await.unwrap().contains("guard"));

    let index = get(Some("s3cret-token"), true).await.unwrap();
    assert_eq!(index.status(), StatusCode::OK);
    let html = index.text().await.unwrap();
    for said in [
        "bearer token from <code>KRABKA_PPROF_TEST_TOKEN</code>, and a guard function",
        #[cfg(feature = "heap-profiling")]
        "<code>heap</code>",
        #[cfg(feature = "heap-profiling")]
        "<code>allocs</code>",
        #[cfg(feature = "heap-profiling")]
        "on (<code>/heap</code>, <code>/allocs</code>)",
        #[cfg(not(feature = "heap-profiling"))]
        "off (enable with <code>heap = true</code>)",
    ] {
        assert!(html.contains(said), "the index page says {said:?}:\n{html}");
    }
    assert!(!html.contains("s3cret"), "the index never shows the token");
    let heap = http
        .get(child.url("/debug/pprof/heap"))
        .bearer_auth("s3cret-token")
        .header("x-internal", "yes")
        .send()
        .await
        .unwrap();
    if cfg!(not(feature = "heap-profiling")) {
        // A build without heap profiling has no heap route at all.
        assert_eq!(heap.status(), StatusCode::NOT_FOUND);
    } else if cfg!(target_env = "musl") {
        // Past both checks, the heap route's own answer: it needs glibc.
        assert_eq!(heap.status(), StatusCode::SERVICE_UNAVAILABLE);
    } else {
        assert_eq!(heap.status(), StatusCode::OK);
        decode(&heap.bytes().await.unwrap());
    }
}

/// With neither a token nor a guard, building the routes says once, at `warn`, that they
/// are open, naming them and how to close them.
#[tokio::test]
async fn open_routes_are_announced_once_at_warn() {
    let child = ChildServer::start_logged(CHILD, "serve-cpu", &[]);
    // Served: the routes were built before the listener answered.
    let index = client()
        .get(child.url("/debug/pprof/"))
        .send()
        .await
        .unwrap();
    assert_eq!(index.status(), StatusCode::OK);
    let log = child.log();
    let announced: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("open to every client"))
        .collect();
    assert_eq!(announced.len(), 1, "once: {log}");
    let line = announced[0];
    assert!(line.contains(" WARN "), "{line}");
    for part in [
        "/debug/pprof/profile",
        "/debug/pprof/threads",
        "token_env",
        "guard",
    ] {
        assert!(line.contains(part), "{part}: {line}");
    }
    assert!(!line.contains("/cmdline"), "off by default: {line}");
}

/// The run-time switches: the token replaced in place (the startup one no longer opens
/// the routes), and profiling switched off (every route 503 after the token check) and on
/// again (the routes answer), all without a restart.
#[tokio::test]
async fn the_token_rotates_and_profiling_switches_off_and_on_without_a_restart() {
    let child = ChildServer::start(CHILD, "serve-switches", &[(VAR, Some("first-token"))]);
    let http = client();
    let ask = |path: &str, token: &str| http.get(child.url(path)).bearer_auth(token).send();
    let status = |response: reqwest::Response| response.status();
    assert_eq!(
        status(ask("/debug/pprof/", "first-token").await.unwrap()),
        StatusCode::OK
    );

    let rotated = http
        .get(child.url("/rotate/second-token"))
        .send()
        .await
        .unwrap();
    assert_eq!(rotated.text().await.unwrap(), "rotated");
    assert_eq!(
        status(ask("/debug/pprof/", "first-token").await.unwrap()),
        StatusCode::UNAUTHORIZED,
        "the startup token no longer opens the routes"
    );
    assert_eq!(
        status(ask("/debug/pprof/", "second-token").await.unwrap()),
        StatusCode::OK
    );

    let off = http.get(child.url("/switch/false")).send().await.unwrap();
    assert_eq!(off.text().await.unwrap(), "profiling on: false");
    for path in [
        "/debug/pprof/profile?seconds=1",
        "/debug/pprof/recent",
        "/debug/pprof/",
    ] {
        let response = ask(path, "second-token").await.unwrap();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE, "{path}");
        let text = response.text().await.unwrap();
        assert!(text.contains("switched off"), "{path}: {text}");
        assert!(
            text.contains("set_profiling_enabled(true)"),
            "{path}: {text}"
        );
    }
    // Access comes first: a stranger learns nothing, not even that it is off.
    let stranger = http.get(child.url("/debug/pprof/")).send().await.unwrap();
    assert_eq!(stranger.status(), StatusCode::UNAUTHORIZED);

    let on = http.get(child.url("/switch/true")).send().await.unwrap();
    assert_eq!(on.text().await.unwrap(), "profiling on: true");
    let profile = ask("/debug/pprof/profile?seconds=1", "second-token")
        .await
        .unwrap();
    assert_eq!(profile.status(), StatusCode::OK);
    decode(&profile.bytes().await.unwrap());
}
