//! The app's own routes keep answering while a profile is sampled and while it is
//! encoded, on both runtime flavours: the profiler's work runs on the blocking pool.

use std::time::{Duration, SystemTime};

use axum::{Router, routing::get};
use krabka_pprof::pprof_routes;
use krabka_pprof_tests::{Flavor, TestServer, client, decode, serial};
use reqwest::StatusCode;

#[pprof_routes(frequency = 1000)]
fn app() -> Router {
    Router::new().route("/ping", get(|| async { "pong" }))
}

async fn other_routes_answer_during_a_profile(flavor: Flavor) {
    let _serial = serial().await;
    let server = TestServer::start_on(flavor, app);
    let http = client();
    let profile = tokio::spawn({
        let http = http.clone();
        let url = server.url("/debug/pprof/profile?seconds=2");
        async move {
            let response = http.get(url).send().await.unwrap();
            assert_eq!(response.status(), StatusCode::OK);
            let body = response.bytes().await.unwrap();
            (body, SystemTime::now())
        }
    });

    // Ping until the profile is back (bounded in count as well as by its window).
    let mut answered = Vec::new();
    let ping = server.url("/ping");
    while !profile.is_finished() && answered.len() < 200_000 {
        let response = tokio::time::timeout(Duration::from_secs(5), http.get(&ping).send())
            .await
            .expect("a ping is answered while the profile runs")
            .unwrap();
        assert_eq!(response.text().await.unwrap(), "pong");
        answered.push(SystemTime::now());
    }
    let (body, profile_done) = profile.await.unwrap();
    let profile = decode(&body);
    let window_start = SystemTime::UNIX_EPOCH + Duration::from_nanos(profile.time_nanos as u64);
    let window_end = window_start + Duration::from_nanos(profile.duration_nanos as u64);

    let during_window = answered
        .iter()
        .filter(|t| **t > window_start && **t < window_end)
        .count();
    let after_window = answered
        .iter()
        .filter(|t| **t >= window_end && **t <= profile_done)
        .count();
    assert!(
        during_window >= 10,
        "{flavor:?}: only {during_window} pings answered while sampling"
    );
    assert!(
        after_window >= 1,
        "{flavor:?}: no ping was answered between the end of sampling and the profile's arrival"
    );
}

#[tokio::test]
async fn current_thread_runtime_keeps_serving() {
    other_routes_answer_during_a_profile(Flavor::CurrentThread).await;
}

#[tokio::test]
async fn multi_thread_runtime_keeps_serving() {
    other_routes_answer_during_a_profile(Flavor::MultiThread).await;
}
