//! The app's own routes keep answering while a profile is sampled and while it is
//! encoded, on both runtime flavours: the profiler's work runs on the blocking pool.

use std::time::{Duration, SystemTime};

use axum::{Router, routing::get};
use krabka_pprof::pprof_routes;
use krabka_pprof_tests::{Flavor, TestServer, client, decode, profile_window, serial};
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
            // Headers come only once the profile is rendered: everything before this
            // instant overlapped with sampling or rendering.
            let headers_at = SystemTime::now();
            assert_eq!(response.status(), StatusCode::OK);
            (response.bytes().await.unwrap(), headers_at)
        }
    });

    // One ping at a time, until the profile is back (bounded in count as well as by its
    // window): `(sent, answered)` for each.
    let mut pings = Vec::new();
    let url = server.url("/ping");
    while !profile.is_finished() && pings.len() < 200_000 {
        let sent = SystemTime::now();
        let response = tokio::time::timeout(Duration::from_secs(5), http.get(&url).send())
            .await
            .expect("a ping is answered while the profile runs")
            .unwrap();
        assert_eq!(response.text().await.unwrap(), "pong");
        pings.push((sent, SystemTime::now()));
    }
    let (body, headers_at) = profile.await.unwrap();
    let (start, end) = profile_window(&decode(&body));

    let while_sampling = pings
        .iter()
        .filter(|(sent, done)| *sent > start && *done < end)
        .count();
    // Pings go one after another. Had rendering (stop, symbolize, encode) held the only
    // worker of a current_thread runtime, a ping sent after the window could not have
    // been answered before the rendered profile, bar the one already waiting; several
    // are.
    let while_rendering = pings
        .iter()
        .filter(|(sent, done)| *sent >= end && *done <= headers_at)
        .count();
    assert!(
        while_sampling >= 10,
        "{flavor:?}: only {while_sampling} pings answered while sampling"
    );
    assert!(
        while_rendering >= 3,
        "{flavor:?}: {while_rendering} pings sent after the window were answered before the profile"
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
