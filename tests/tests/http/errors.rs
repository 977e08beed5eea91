//! Bad queries get a 400 in Go's error format, and leave the profiler usable.

use axum::Router;
use krabka_pprof::pprof_routes;
use krabka_pprof_tests::queries::{self, Route};
use krabka_pprof_tests::{TestServer, assert_head_like_get, client, decode, serial};
use proptest::prelude::*;
use reqwest::StatusCode;

#[pprof_routes(cpu_max = "5s")]
fn app() -> Router {
    Router::new()
}

#[tokio::test]
async fn bad_seconds_are_400_in_go_format() {
    let _serial = serial().await;
    let server = TestServer::start(app);
    let http = client();
    for bad in ["abc", "-1", "1.5", "", "99999999999999999999", "1e3", "%20"] {
        let response = http
            .get(server.url(&format!("/debug/pprof/profile?seconds={bad}")))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "seconds={bad}");
        let headers = response.headers().clone();
        assert_eq!(headers["content-type"], "text/plain; charset=utf-8");
        assert_eq!(headers["x-go-pprof"], "1");
        assert_eq!(headers["x-content-type-options"], "nosniff");
        assert!(headers.get("content-disposition").is_none());
        let text = response.text().await.unwrap();
        assert!(
            text.starts_with("`seconds` must be a whole number of seconds such as ?seconds=30")
                && text.contains("above 5 means 5")
                && text.ends_with('\n')
                && text.matches('\n').count() == 1,
            "seconds={bad}: {text:?}"
        );
    }
    let repeated = http
        .get(server.url("/debug/pprof/profile?seconds=1&seconds=2"))
        .send()
        .await
        .unwrap();
    assert_eq!(repeated.status(), StatusCode::BAD_REQUEST);
    assert!(repeated.text().await.unwrap().contains("more than once"));

    let format = http
        .get(server.url("/debug/pprof/profile?format=pdf"))
        .send()
        .await
        .unwrap();
    assert_eq!(format.status(), StatusCode::BAD_REQUEST);
    assert!(
        format
            .text()
            .await
            .unwrap()
            .contains("`format` must be pprof")
    );

    // The profiler was never touched: a valid request works right away.
    let ok = http
        .get(server.url("/debug/pprof/profile?seconds=1&debug=1"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        ok.status(),
        StatusCode::OK,
        "unknown parameters are ignored, as in Go"
    );
    decode(&ok.bytes().await.unwrap());
}

#[tokio::test]
async fn only_get_and_head_are_routes() {
    let server = TestServer::start(app);
    let response = client()
        .post(server.url("/debug/pprof/profile?seconds=1"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(response.headers()["allow"], "GET,HEAD");
}

#[cfg_attr(feature = "heap-profiling", pprof_routes(heap = true, cmdline = true))]
#[cfg_attr(not(feature = "heap-profiling"), pprof_routes(cmdline = true))]
fn heap_app() -> Router {
    Router::new()
}

/// This test binary allocates with the system allocator, not jemalloc.
#[cfg(feature = "heap-profiling")]
#[tokio::test]
async fn heap_without_jemalloc_is_a_503_naming_the_fix() {
    let server = TestServer::start(heap_app);
    let http = client();
    for route in ["/debug/pprof/heap", "/debug/pprof/allocs"] {
        let response = http.get(server.url(route)).send().await.unwrap();
        assert_eq!(
            response.status(),
            StatusCode::SERVICE_UNAVAILABLE,
            "{route}"
        );
        assert_eq!(response.headers()["x-go-pprof"], "1");
        let text = response.text().await.unwrap();
        let fix = if cfg!(target_env = "musl") {
            // Before the allocator matters: heap profiles need a glibc build.
            "heap profiling needs a glibc build"
        } else {
            "static ALLOC: krabka_pprof::Jemalloc = krabka_pprof::Jemalloc;"
        };
        assert!(text.contains(fix), "{text}");
    }
    // The CPU route is unaffected.
    let response = http
        .get(server.url("/debug/pprof/profile?seconds=x"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
}

/// `HEAD` on every route: what `GET` answers, headers and status, without the body (a
/// HEAD on `/profile` takes the profile, as Go's handler does).
#[tokio::test]
async fn head_answers_every_route_like_get_without_a_body() {
    let _serial = serial().await;
    let server = TestServer::start(heap_app);
    for (path, status) in [
        ("/debug/pprof", StatusCode::MOVED_PERMANENTLY),
        ("/debug/pprof/", StatusCode::OK),
        ("/debug/pprof/profile?seconds=1", StatusCode::OK),
        ("/debug/pprof/profile?seconds=1&format=text", StatusCode::OK),
        #[cfg(feature = "flamegraph")]
        ("/debug/pprof/profile?seconds=1&format=svg", StatusCode::OK),
        ("/debug/pprof/profile?seconds=x", StatusCode::BAD_REQUEST),
        // This binary's allocator is not jemalloc: the heap routes' 503.
        #[cfg(feature = "heap-profiling")]
        ("/debug/pprof/heap", StatusCode::SERVICE_UNAVAILABLE),
        #[cfg(feature = "heap-profiling")]
        ("/debug/pprof/allocs", StatusCode::SERVICE_UNAVAILABLE),
        // The thread dumps in each of their forms, and their bad queries.
        ("/debug/pprof/threads", StatusCode::OK),
        ("/debug/pprof/goroutine", StatusCode::OK),
        ("/debug/pprof/goroutine?debug=1", StatusCode::OK),
        ("/debug/pprof/goroutine?debug=2", StatusCode::OK),
        ("/debug/pprof/threads?format=text", StatusCode::OK),
        ("/debug/pprof/threads?deadline=x", StatusCode::BAD_REQUEST),
        ("/debug/pprof/cmdline", StatusCode::OK),
        // No recorder in this app: the 503 naming the key.
        ("/debug/pprof/recent", StatusCode::SERVICE_UNAVAILABLE),
    ] {
        assert_eq!(
            assert_head_like_get(&server.url(path)).await,
            status,
            "{path}"
        );
    }
    let started = std::time::Instant::now();
    let head = client()
        .head(server.url("/debug/pprof/profile?seconds=2"))
        .send()
        .await
        .unwrap();
    assert_eq!(head.status(), StatusCode::OK);
    assert!(
        started.elapsed() >= std::time::Duration::from_secs(2),
        "HEAD took the whole profile"
    );
}

/// The thread dumps' pprof answers download as Go's do, each under its route's name:
/// `attachment; filename="threads"` (or `"goroutine"`), `application/octet-stream`,
/// `nosniff`, and a profile of this process's threads in the body.
#[tokio::test]
async fn thread_dumps_download_under_their_own_names() {
    let _serial = serial().await;
    let server = TestServer::start(heap_app);
    for (path, name) in [
        ("/debug/pprof/threads", "threads"),
        ("/debug/pprof/goroutine", "goroutine"),
        ("/debug/pprof/goroutine?debug=0", "goroutine"),
    ] {
        let response = client().get(server.url(path)).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        let headers = response.headers();
        assert_eq!(
            headers["content-disposition"],
            format!("attachment; filename=\"{name}\"").as_str(),
            "{path}"
        );
        assert_eq!(
            headers["content-type"], "application/octet-stream",
            "{path}"
        );
        assert_eq!(headers["x-content-type-options"], "nosniff", "{path}");
        let profile = decode(&response.bytes().await.unwrap());
        assert!(
            profile.sample.len() > 1,
            "{path}: every thread of this process, the test's own among them"
        );
    }
}

/// A build without `heap-profiling` has no heap routes, and `heap = true` does not
/// compile there (the ui case `heap_without_feature`).
#[cfg(not(feature = "heap-profiling"))]
#[tokio::test]
async fn without_heap_profiling_the_heap_routes_are_absent() {
    let server = TestServer::start(heap_app);
    for route in ["/debug/pprof/heap", "/debug/pprof/allocs"] {
        let response = client().get(server.url(route)).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::NOT_FOUND, "{route}");
    }
    let index = server.text("/debug/pprof/").await;
    assert!(index.contains("off (enable with <code>heap = true</code>)"));
}

/// Requests up to 1000 Hz, so that the contract's 1 ..= 1000 Hz is what is checked here;
/// `frequency_max` below that is the query parser's unit tests'.
#[pprof_routes(cpu_max = "60s", max_windows = 1, frequency_max = 1000)]
fn long_app() -> Router {
    Router::new()
}

/// Every query on the thread dump routes: a dump (200) where the contract accepts it, a
/// 400 in Go's error format where it does not.
#[test]
fn any_query_on_the_thread_routes_gets_the_contracts_answer() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let _serial = runtime.block_on(serial());
    let server = TestServer::start(app);
    // Half the cases on each name of the route (one handler): each accepted query is a
    // whole dump of this process, most of the suite's time in this test at 256 a name.
    for path in ["/debug/pprof/threads", "/debug/pprof/goroutine"] {
        queries::check_routes_answers(
            &runtime,
            server.addr,
            path,
            queries::query(),
            128,
            |query, answer| {
                let accepted = queries::contract_accepts(query, Route::Threads);
                if accepted {
                    prop_assert_eq!(answer.status, 200, "{}: {}", query, answer.text());
                } else {
                    prop_assert_eq!(answer.status, 400, "{}: {}", query, answer.text());
                    prop_assert!(answer.is_a_sentence(), "{:?}", answer.text());
                }
                Ok(accepted)
            },
        );
    }
}

/// Any query string on `/profile`, `/wall` and `/blocking` (the CPU route's parameters,
/// and a window of its sampler), while another profile holds the profiler: what the
/// contract accepts gets the 409 any valid request gets then, everything else a 400; each
/// with a sentence in Go's error format, never a 5xx. (A query that forces is left out: it
/// would stop the held profile and wait for its own.)
#[test]
fn any_query_on_the_cpu_routes_gets_the_contracts_answer() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let _serial = runtime.block_on(serial());
    let server = TestServer::start(long_app);
    let held = runtime.block_on(server.hold_profiler("seconds=60"));
    // Where the wall routes answer 503 (the pprof crate's sampler), they are left out.
    let wall = !krabka_pprof_tests::pprof_rs_sampler();
    for (path, cases) in [
        ("/debug/pprof/profile", 256),
        ("/debug/pprof/wall", if wall { 64 } else { 0 }),
        ("/debug/pprof/blocking", if wall { 64 } else { 0 }),
    ] {
        if cases == 0 {
            continue;
        }
        let forcing = queries::query().prop_filter("forces", |q| !queries::forces(q));
        queries::check_routes_answers(
            &runtime,
            server.addr,
            path,
            forcing,
            cases,
            |query, answer| {
                let accepted = queries::contract_accepts(query, Route::Cpu);
                let expected = if accepted { 409 } else { 400 };
                prop_assert_eq!(
                    answer.status,
                    expected,
                    "{} {}: {}",
                    path,
                    query,
                    answer.text()
                );
                prop_assert!(answer.is_a_sentence(), "{:?}", answer.text());
                Ok(accepted)
            },
        );
    }
    drop(held);
}
