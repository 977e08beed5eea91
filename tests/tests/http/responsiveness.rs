//! The app's own routes keep answering while a profile is sampled and while it is
//! closed, built and rendered, on both runtime flavours: the profiler's work runs on the
//! blocking pool. Made deterministic by holding the server's one blocking thread once
//! the window is open: the window's end then finds its closing work waiting for the pool
//! (the index page says so), pings are answered meanwhile, and the profile cannot be
//! answered until the pool is let go. How fast the pings are answered is a benchmark
//! figure (M5 in bench/README.md), not a test's.

use std::time::{Duration, Instant, SystemTime};

use axum::{Router, routing::get};
use krabka_pprof::pprof_routes;
use krabka_pprof_tests::{
    Flavor, Options, TestServer, client, decode, profile_window, serial, with_hold_route,
};
use reqwest::StatusCode;

#[pprof_routes(frequency = 1000, frequency_max = 1000)]
fn app() -> Router {
    with_hold_route(Router::new().route("/ping", get(|| async { "pong" })))
}

/// One ping: `(sent, answered)` by the client's clock.
async fn ping(http: &reqwest::Client, url: &str) -> (SystemTime, SystemTime) {
    let sent = SystemTime::now();
    let response = tokio::time::timeout(Duration::from_secs(10), http.get(url).send())
        .await
        .expect("a ping is answered while the profile runs")
        .unwrap();
    assert_eq!(response.text().await.unwrap(), "pong");
    (sent, SystemTime::now())
}

async fn other_routes_answer_during_a_profile(flavor: Flavor) {
    let _serial = serial().await;
    let server = TestServer::start_with(
        Options {
            flavor,
            blocking_threads: Some(1),
            ..Options::default()
        },
        app,
    );
    let http = client();
    let profile = tokio::spawn({
        let http = http.clone();
        // 5 s: room for a ping sent once the window shows open to be answered inside it on
        // a machine busy with other work (one came back after a 2 s window had ended, under
        // `scripts/test` beside two busy loops and two builds), while a runtime the sampler
        // held would answer it only after the window.
        let url = server.url("/debug/pprof/profile?seconds=5");
        async move {
            let response = http.get(url).send().await.unwrap();
            // Headers come only once the profile is rendered.
            let headers_at = SystemTime::now();
            assert_eq!(response.status(), StatusCode::OK);
            (response.bytes().await.unwrap(), headers_at)
        }
    });
    let url = server.url("/ping");
    server.wait_for_windows(1).await;
    let while_sampling = ping(&http, &url).await;
    // From here every piece of the profile's blocking work waits its turn behind the hold.
    let hold = server.hold_blocking_pool(true).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !server
        .text("/debug/pprof/")
        .await
        .contains("the last ending in 0s")
    {
        assert!(
            Instant::now() < deadline,
            "{flavor:?}: the window never showed as past its end"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Past its end, the window waits for the pool to be closed, built and rendered.
    let mut after_the_window = Vec::new();
    for _ in 0..3 {
        after_the_window.push(ping(&http, &url).await);
    }
    assert!(
        !profile.is_finished(),
        "{flavor:?}: the profile was answered while the blocking pool was held: its closing \
         and rendering ran elsewhere"
    );
    drop(hold);
    let (body, headers_at) = profile.await.unwrap();
    // The profile's own end is when its closing work got the pool; the window was asked
    // to end 5 s after it started.
    let (start, end) = profile_window(&decode(&body));
    let asked_end = start + Duration::from_secs(5);

    assert!(
        while_sampling.0 > start && while_sampling.1 < asked_end.min(end),
        "{flavor:?}: the ping sent once the window showed open was answered inside it \
         (sent {:?} after the window's start, answered {:?} after it; the window {:?})",
        while_sampling.0.duration_since(start),
        while_sampling.1.duration_since(start),
        end.duration_since(start),
    );
    for (sent, answered) in after_the_window {
        // Had the profile's closing work held the only worker of a current_thread
        // runtime, none of these could have been answered before the profile.
        assert!(
            sent >= asked_end && answered <= headers_at,
            "{flavor:?}: a ping sent after the window and answered before the profile"
        );
    }
}

#[tokio::test]
async fn current_thread_runtime_keeps_serving() {
    other_routes_answer_during_a_profile(Flavor::CurrentThread).await;
}

#[tokio::test]
async fn multi_thread_runtime_keeps_serving() {
    other_routes_answer_during_a_profile(Flavor::MultiThread).await;
}
