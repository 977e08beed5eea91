//! `?frequency=`, `?force=true`, and the guard.

use std::time::Duration;

use axum::Router;
use krabka_pprof::pprof_routes;
use krabka_pprof_tests::{
    Burner, TestServer, assert_valid_xml, client, decode, internal_only, parse_response,
    profile_window, serial, total_in, unpooled_client,
};
use reqwest::StatusCode;
use tokio::io::AsyncReadExt as _;

// One profile at a time: force and its hand-over (windows.rs tests sharing).
#[pprof_routes(cpu_max = "20s", max_windows = 1)]
fn app() -> Router {
    Router::new()
}

#[pprof_routes(guard = internal_only, cpu_max = "5s")]
fn guarded() -> Router {
    Router::new().route("/", axum::routing::get(|| async { "open" }))
}

#[tokio::test]
async fn frequency_sets_the_period_and_the_rate() {
    let _serial = serial().await;
    let server = TestServer::start(app);
    let burner = Burner::start(1, Duration::from_secs(20));
    let response = client()
        .get(server.url("/debug/pprof/profile?seconds=2&frequency=50"))
        .send()
        .await
        .unwrap();
    let profile = decode(&response.bytes().await.unwrap());
    // The burner's own clock inside the profile's window: the process's CPU around the
    // request would also count symbolizing after the window (seconds, the first time,
    // for the pprof crate's sampler).
    let cpu = burner
        .finish()
        .cpu_within(profile_window(&profile).0, profile_window(&profile).1);
    assert_eq!(profile.period, 20_000_000, "1/50 s");
    let expected = cpu.as_secs_f64() * 50.0;
    let samples = total_in(&profile, 0, "Burner") as f64;
    assert!(
        expected >= 50.0,
        "the burner barely ran ({cpu:?} in the window)"
    );
    assert!(
        (samples - expected).abs() <= expected * 0.25,
        "{samples} samples at 50 Hz for {cpu:?} of CPU"
    );
    for bad in ["0", "1001", "fast"] {
        let response = client()
            .get(server.url(&format!("/debug/pprof/profile?frequency={bad}")))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{bad}");
        assert!(response.text().await.unwrap().contains("from 1 to 1000"));
    }
}

#[tokio::test]
async fn force_ends_the_running_profile_early_and_both_get_profiles() {
    let _serial = serial().await;
    let server = TestServer::start(app);
    let probe = unpooled_client();
    // A 20 s profile holds the profiler (on its own connection, sent first).
    let long = server.hold_profiler("seconds=20").await;
    let forced = probe
        .get(server.url("/debug/pprof/profile?seconds=1&force=true"))
        .send()
        .await
        .unwrap();
    assert_eq!(forced.status(), StatusCode::OK);
    decode(&forced.bytes().await.unwrap());

    // The stopped profile still answers, with a valid profile of the time it had.
    let stopped = stopped_profile(long).await;
    assert!(
        stopped.duration_nanos < 15_000_000_000,
        "it stopped early: {} ns",
        stopped.duration_nanos
    );

    let bad = probe
        .get(server.url("/debug/pprof/profile?force=maybe"))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn the_guard_refuses_before_the_query_is_read() {
    let _serial = serial().await;
    let server = TestServer::start(guarded);
    let http = client();
    for path in [
        "/debug/pprof/profile?seconds=abc",
        "/debug/pprof/",
        "/debug/pprof/profile",
    ] {
        let response = http.get(server.url(path)).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::FORBIDDEN, "{path}");
        assert_eq!(response.headers()["x-go-pprof"], "1");
        assert!(response.text().await.unwrap().contains("guard refused"));
    }
    // The app's own routes are not guarded.
    assert_eq!(
        http.get(server.url("/"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap(),
        "open"
    );
    let admitted = http
        .get(server.url("/debug/pprof/profile?seconds=1"))
        .header("x-internal", "yes")
        .send()
        .await
        .unwrap();
    assert_eq!(
        admitted.status(),
        StatusCode::OK,
        "refusals left the profiler free"
    );
    decode(&admitted.bytes().await.unwrap());
}

#[tokio::test]
async fn of_two_forces_at_once_one_runs_whole_and_the_other_gets_409() {
    let _serial = serial().await;
    let server = TestServer::start(app);
    let long = server.hold_profiler("seconds=20").await;
    let http = unpooled_client();
    let force = server.url("/debug/pprof/profile?seconds=2&force=true");
    let (a, b) = tokio::join!(http.get(&force).send(), http.get(&force).send());
    let (a, b) = (a.unwrap(), b.unwrap());
    let (won, refused) = match (a.status(), b.status()) {
        (StatusCode::OK, StatusCode::CONFLICT) => (a, b),
        (StatusCode::CONFLICT, StatusCode::OK) => (b, a),
        other => panic!("expected one 200 and one 409, got {other:?}"),
    };
    let retry_after: u64 = refused.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=2).contains(&retry_after), "Retry-After {retry_after}");
    let text = refused.text().await.unwrap();
    assert!(
        text.contains("started with force=true"),
        "the refusal says why: {text}"
    );
    // The winner was not cut short by the other force.
    let won = decode(&won.bytes().await.unwrap());
    assert!(
        won.duration_nanos >= 2_000_000_000,
        "the forced profile ran {} ns of its 2 s",
        won.duration_nanos
    );
    // The stopped profile answers with what it had.
    assert!(stopped_profile(long).await.duration_nanos < 15_000_000_000);
}

/// The answer of a 20 s profile that a forced request stopped: a 200 with a valid
/// profile, long before its 20 s.
async fn stopped_profile(mut connection: tokio::net::TcpStream) -> krabka_pprof_tests::Profile {
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(15), connection.read_to_end(&mut raw))
        .await
        .expect("the stopped profile answers long before its 20 s")
        .unwrap();
    let (status, _, body) = parse_response(&raw);
    assert_eq!(status, 200);
    decode(&body)
}

/// A force that arrives while the running profile's window closes, stops, or renders:
/// whichever moment it hits, both callers get valid profiles.
#[tokio::test]
async fn a_force_at_the_end_of_a_window_leaves_both_profiles_valid() {
    let _serial = serial().await;
    let server = TestServer::start(app);
    let http = unpooled_client();
    // Offsets around the end of a 1 s window, SVG (where built) so that rendering takes
    // a while.
    let format = if cfg!(feature = "flamegraph") {
        "svg"
    } else {
        "text"
    };
    for offset_ms in [900u64, 980, 1000, 1020, 1100] {
        let first = http
            .get(server.url(&format!("/debug/pprof/profile?seconds=1&format={format}")))
            .send();
        let forced = async {
            tokio::time::sleep(Duration::from_millis(offset_ms)).await;
            http.get(server.url("/debug/pprof/profile?seconds=1&force=true"))
                .send()
                .await
        };
        let (first, forced) = tokio::join!(first, forced);
        let (first, forced) = (first.unwrap(), forced.unwrap());
        assert_eq!(first.status(), StatusCode::OK, "at {offset_ms} ms");
        let view = first.text().await.unwrap();
        if cfg!(feature = "flamegraph") {
            assert_valid_xml(&view);
        } else {
            assert!(view.contains("flat%"), "{view}");
        }
        assert_eq!(forced.status(), StatusCode::OK, "at {offset_ms} ms");
        let profile = decode(&forced.bytes().await.unwrap());
        assert!(profile.duration_nanos >= 1_000_000_000, "at {offset_ms} ms");
    }
}
