//! `?frequency=`, `?force=true`, and the guard.

use std::time::{Duration, Instant, SystemTime};

use axum::Router;
use krabka_pprof::pprof_routes;
use krabka_pprof_tests::{
    Burner, Options, ServerLog, TestServer, assert_sample_count, assert_valid_xml,
    assert_window_inside, client, decode, internal_only, parse_response, pprof_rs_sampler,
    profile_window, serial, skip, total_in, unpooled_client, with_hold_route,
};
use reqwest::StatusCode;
use tokio::io::AsyncReadExt as _;

// One profile at a time: force and its hand-over (windows.rs tests sharing).
#[pprof_routes(cpu_max = "20s", max_windows = 1)]
fn app() -> Router {
    Router::new()
}

/// [`app`], with the route a test holds the blocking pool through.
#[pprof_routes(cpu_max = "20s", max_windows = 1)]
fn held_app() -> Router {
    with_hold_route(Router::new())
}

#[pprof_routes(guard = internal_only, cpu_max = "5s")]
fn guarded() -> Router {
    Router::new().route("/", axum::routing::get(|| async { "open" }))
}

#[tokio::test]
async fn frequency_sets_the_period_and_the_rate() {
    let _serial = serial().await;
    let server = TestServer::start(app);
    let burner = Burner::start(1, Duration::from_secs(60));
    // 1.5 s of the burner's CPU: 75 periods at 50 Hz.
    let seconds = match burner.window_for(Duration::from_millis(1500), 2, 19).await {
        Ok(seconds) => seconds,
        Err(why) => return skip("frequency_sets_the_period_and_the_rate", &why),
    };
    let response = client()
        .get(server.url(&format!(
            "/debug/pprof/profile?seconds={seconds}&frequency=50"
        )))
        .send()
        .await
        .unwrap();
    let profile = decode(&response.bytes().await.unwrap());
    // The burner's own clock inside the profile's window: the process's CPU around the
    // request would also count symbolizing after the window (seconds, the first time,
    // for the pprof crate's sampler).
    let timeline = burner.finish();
    let (start, end) = profile_window(&profile);
    let cpu = timeline.cpu_within(start, end);
    assert_eq!(profile.period, 20_000_000, "1/50 s");
    let expected = cpu.as_secs_f64() * 50.0;
    let samples = total_in(&profile, 0, "Burner") as f64;
    assert!(
        expected >= 50.0,
        "the burner barely ran ({cpu:?} in the window)"
    );
    assert_sample_count(
        "the burner at 50 Hz",
        samples,
        cpu,
        50,
        timeline.least_core_share(start, end),
        0.25,
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

/// A force that arrives around the end of the running profile's window, whatever it
/// finds (the window still open; ended but not yet closed; closing, stopping or
/// rendering; answered), leaves both callers with valid profiles, the forced one whole
/// and after the first's window. Ended-but-not-closed is made deterministically: with
/// the server's one blocking thread held the ended window cannot close, which the index
/// page shows ("ending in 0s"), and the server's log says the force took it over. The
/// moments that cannot be held (stopping, rendering) come from offsets around the end,
/// and each of those rounds says which phase it hit: the log says whether the force took
/// over the window, the client's clock whether the first had answered before the forced
/// window started.
#[tokio::test]
async fn a_force_at_the_end_of_a_window_leaves_both_profiles_valid() {
    let _serial = serial().await;
    let log = ServerLog::new();
    let server = TestServer::start_with(
        Options {
            blocking_threads: Some(1),
            log: Some(log.clone()),
            ..Options::default()
        },
        held_app,
    );
    let http = unpooled_client();
    // SVG (where built) so that rendering takes a while.
    let format = if cfg!(feature = "flamegraph") {
        "svg"
    } else {
        "text"
    };
    let assert_view = |view: &str, phase: &str| {
        if cfg!(feature = "flamegraph") {
            assert_valid_xml(view);
        } else {
            assert!(view.contains("flat%"), "{phase}: {view}");
        }
    };
    let forced = |phase: &'static str| {
        let url = server.url("/debug/pprof/profile?seconds=1&force=true");
        let http = http.clone();
        async move {
            let sent = SystemTime::now();
            let response = http.get(url).send().await.unwrap();
            assert_eq!(response.status(), StatusCode::OK, "{phase}");
            let profile = decode(&response.bytes().await.unwrap());
            let (start, _) = assert_window_inside(&profile, sent, SystemTime::now(), phase);
            assert!(
                profile.duration_nanos >= 1_000_000_000,
                "{phase}: ran whole"
            );
            start
        }
    };

    // Ended but not closed, by events. Only krabka-pprof's own sampler can take a window
    // over while it waits to close: the `pprof` crate's builds its report on the held
    // blocking thread, so a force then waits for it and gets the 500 that says so.
    if !pprof_rs_sampler() {
        ended_not_closed(&server, &log, format, &assert_view, &forced).await;
    }

    // Offsets around the end of a 1 s window, from the moment the index shows it open.
    let mut phases = Vec::new();
    for offset_ms in [900u64, 970, 985, 990, 995, 1000, 1100] {
        let logged = log.lines().len();
        let sent = SystemTime::now();
        let first = {
            let url = server.url(&format!("/debug/pprof/profile?seconds=1&format={format}"));
            let http = http.clone();
            tokio::spawn(async move {
                let response = http.get(url).send().await.unwrap();
                assert_eq!(response.status(), StatusCode::OK);
                let view = response.text().await.unwrap();
                (view, SystemTime::now())
            })
        };
        server.wait_for_windows(1).await;
        tokio::time::sleep(Duration::from_millis(offset_ms)).await;
        let forced_start = forced("around the end").await;
        let (view, answered) = first.await.unwrap();
        let took_over = log.lines()[logged..]
            .iter()
            .any(|line| line.contains("force=true: closing 1 CPU profile window"));
        let phase = if took_over {
            "took the window over"
        } else if forced_start < answered {
            "waited for the first's session to stop"
        } else {
            "started after the first answered"
        };
        eprintln!("force {offset_ms} ms after the window showed open: {phase}");
        assert_view(&view, phase);
        assert!(forced_start >= sent, "{phase}");
        phases.push(phase);
        server.wait_for_windows(0).await;
    }
    eprintln!("phases hit: {phases:?}");
}

/// A force while the first window has ended but cannot close (the server's one blocking
/// thread held): the force takes the window over, as the server logs, and both profiles
/// are whole.
async fn ended_not_closed<F, Fut>(
    server: &TestServer,
    log: &ServerLog,
    format: &'static str,
    assert_view: &dyn Fn(&str, &str),
    forced: &F,
) where
    F: Fn(&'static str) -> Fut,
    Fut: Future<Output = SystemTime> + Send + 'static,
{
    let http = unpooled_client();
    let logged = log.lines().len();
    let first = {
        let url = server.url(&format!("/debug/pprof/profile?seconds=2&format={format}"));
        let http = http.clone();
        tokio::spawn(async move { http.get(url).send().await.unwrap() })
    };
    server.wait_for_windows(1).await;
    let hold = server.hold_blocking_pool(true).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !server
        .text("/debug/pprof/")
        .await
        .contains("the last ending in 0s")
    {
        assert!(
            Instant::now() < deadline,
            "the held window never showed as past its end"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let taking_over = tokio::spawn(forced("ended, not yet closed"));
    log.wait_for(
        logged,
        &["force=true: closing 1 CPU profile window at 99 Hz"],
    )
    .await;
    drop(hold);
    let first = first.await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    assert_view(&first.text().await.unwrap(), "ended, not yet closed");
    taking_over.await.unwrap();
    server.wait_for_windows(0).await;
}
