//! Concurrent CPU profiles share one sampler: each request gets the samples of its own
//! window, a window that hangs up leaves the others whole, the sampler stops with the
//! last window, another frequency gets 409 (or takes over with `force=true`), and
//! `max_windows` bounds how many share it. (`max_windows = 1`, one at a time, is what
//! `cpu.rs` and `control.rs` test.)

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use krabka_pprof::pprof_routes;
use krabka_pprof_tests::{
    Burner, Profile, TestServer, comments, decode, profile_window, serial, total_in,
    unpooled_client,
};
use reqwest::StatusCode;

#[pprof_routes(cpu_max = "10s")]
fn app() -> Router {
    Router::new()
}

#[pprof_routes(cpu_max = "10s", max_windows = 2)]
fn two_at_once() -> Router {
    Router::new()
}

/// Waits until the index page says `windows` windows are open (at most 10 s).
async fn wait_for_windows(server: &TestServer, windows: usize) {
    let said = if windows == 0 {
        "<td>no CPU profile</td>".to_owned()
    } else {
        format!(
            "{windows} window{} open",
            if windows == 1 { "" } else { "s" }
        )
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let index = server.text("/debug/pprof/").await;
        if index.contains(&said) {
            return;
        }
        assert!(Instant::now() < deadline, "the index never said {said:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Whether this process has no POSIX timer left within 5 s: the sampler arms one per
/// thread while a session runs, and deletes them all when it stops.
async fn sampler_stops() -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        let timers = std::fs::read_to_string("/proc/self/timers").unwrap();
        if !timers.lines().any(|line| line.starts_with("ID:")) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    false
}

/// A CPU profile request, `after` from now, on its own connection; its profile.
async fn profile_after(server: &TestServer, query: &str, after: Duration) -> Profile {
    tokio::time::sleep(after).await;
    let response = unpooled_client()
        .get(server.url(&format!("/debug/pprof/profile?{query}")))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK, "{query}");
    decode(&response.bytes().await.unwrap())
}

/// A request's 409: its Retry-After and its sentence.
async fn refused(server: &TestServer, query: &str) -> (u64, String) {
    let response = unpooled_client()
        .get(server.url(&format!("/debug/pprof/profile?{query}")))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CONFLICT, "{query}");
    let retry_after = response.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    (retry_after, response.text().await.unwrap())
}

fn shared(profile: &Profile) -> bool {
    comments(profile)
        .iter()
        .any(|c| c.contains("windows shared the sampler"))
}

#[tokio::test]
async fn a_scraper_and_people_each_get_a_profile_of_their_own_window() {
    let _serial = serial().await;
    let server = TestServer::start(app);
    let burner = Burner::start(1, Duration::from_secs(20));
    // A scraper's loop, back to back, and three people at moments drawn from the clock
    // (printed, to replay a failure).
    let scraper = async {
        let mut profiles = Vec::new();
        for _ in 0..5 {
            profiles.push(profile_after(&server, "seconds=2", Duration::ZERO).await);
        }
        profiles
    };
    let seed = u64::from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .subsec_nanos(),
    );
    let at = [seed % 1500, 1500 + seed / 7 % 2000, 3000 + seed / 13 % 2000];
    eprintln!("people arrive at {at:?} ms");
    let (scraped, one, three, five) = tokio::join!(
        scraper,
        profile_after(&server, "seconds=1", Duration::from_millis(at[0])),
        profile_after(&server, "seconds=3", Duration::from_millis(at[1])),
        profile_after(&server, "seconds=5", Duration::from_millis(at[2])),
    );
    let timeline = burner.finish();
    let people = [(1, &one), (3, &three), (5, &five)];
    for (seconds, profile) in scraped.iter().map(|p| (2, p)).chain(people) {
        let length = profile.duration_nanos as f64 / 1e9;
        assert!(
            (seconds as f64..seconds as f64 + 0.5).contains(&length),
            "a {seconds} s request's profile covers {length} s"
        );
        let (start, end) = profile_window(profile);
        let cpu = timeline.cpu_within(start, end);
        let expected = cpu.as_secs_f64() * 99.0;
        let samples = total_in(profile, 0, "Burner") as f64;
        assert!(
            expected >= 50.0,
            "the burner barely ran in a {seconds} s window ({cpu:?})"
        );
        assert!(
            (samples - expected).abs() <= expected * 0.15,
            "{samples} samples in a {seconds} s window with {cpu:?} of the burner's CPU: \
             {expected:.0} expected at 99 Hz"
        );
    }
    for (seconds, profile) in people {
        assert!(
            shared(profile),
            "the {seconds} s request shared the scraper's sampler: {:?}",
            comments(profile)
        );
    }
}

#[tokio::test]
async fn a_window_that_hangs_up_leaves_the_others_whole_and_the_last_stops_the_sampler() {
    use tokio::io::AsyncWriteExt as _;
    let _serial = serial().await;
    let server = TestServer::start(app);
    let staying = profile_after(&server, "seconds=3", Duration::ZERO);
    let hanging_up = async {
        wait_for_windows(&server, 1).await;
        let mut raw = tokio::net::TcpStream::connect(server.addr).await.unwrap();
        let request = format!(
            "GET /debug/pprof/profile?seconds=10 HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            server.addr
        );
        raw.write_all(request.as_bytes()).await.unwrap();
        wait_for_windows(&server, 2).await;
        drop(raw);
        // The window leaves as soon as its client is gone; the other runs on.
        wait_for_windows(&server, 1).await;
    };
    let (staying, ()) = tokio::join!(staying, hanging_up);
    let length = staying.duration_nanos as f64 / 1e9;
    assert!(
        (3.0..3.5).contains(&length),
        "the staying window covers {length} s of its 3 s"
    );
    assert!(shared(&staying), "{:?}", comments(&staying));
    assert!(
        sampler_stops().await,
        "the sampler's timers outlived the last window"
    );
    wait_for_windows(&server, 0).await;
}

#[tokio::test]
async fn another_frequency_gets_409_and_the_same_frequency_joins() {
    let _serial = serial().await;
    let server = TestServer::start(app);
    let running = profile_after(&server, "seconds=3", Duration::ZERO);
    let others = async {
        wait_for_windows(&server, 1).await;
        let (retry_after, text) = refused(&server, "seconds=1&frequency=50").await;
        assert!((1..=3).contains(&retry_after), "Retry-After {retry_after}");
        for said in ["running at 99 Hz", "at 99 Hz joins it", "force=true"] {
            assert!(text.contains(said), "{said:?} in {text}");
        }
        profile_after(&server, "seconds=1", Duration::ZERO).await
    };
    let (running, joined) = tokio::join!(running, others);
    assert!(running.duration_nanos >= 3_000_000_000);
    assert!(shared(&running) && shared(&joined));
    assert_eq!(joined.period, running.period);
}

#[tokio::test]
async fn force_at_another_frequency_closes_every_window_early_and_takes_over() {
    let _serial = serial().await;
    let server = TestServer::start(app);
    let first = profile_after(&server, "seconds=10", Duration::ZERO);
    let second = async {
        wait_for_windows(&server, 1).await;
        profile_after(&server, "seconds=10", Duration::ZERO).await
    };
    let forced = async {
        wait_for_windows(&server, 2).await;
        profile_after(&server, "seconds=1&frequency=50&force=true", Duration::ZERO).await
    };
    let started = Instant::now();
    let (first, second, forced) = tokio::join!(first, second, forced);
    assert!(
        started.elapsed() < Duration::from_secs(9),
        "the forced request did not wait for the 10 s windows"
    );
    assert_eq!(
        forced.period, 20_000_000,
        "the forced profile runs at 50 Hz"
    );
    assert!(forced.duration_nanos >= 1_000_000_000);
    for stopped in [first, second] {
        assert_eq!(stopped.period, 10_101_010);
        assert!(
            stopped.duration_nanos < 9_000_000_000,
            "a pre-empted window still answers, with the time it had"
        );
    }
}

#[tokio::test]
async fn past_max_windows_a_request_gets_409() {
    let _serial = serial().await;
    let server = TestServer::start(two_at_once);
    let a = profile_after(&server, "seconds=3", Duration::ZERO);
    let b = async {
        wait_for_windows(&server, 1).await;
        profile_after(&server, "seconds=3", Duration::ZERO).await
    };
    let third = async {
        wait_for_windows(&server, 2).await;
        refused(&server, "seconds=1").await
    };
    let (a, b, (retry_after, text)) = tokio::join!(a, b, third);
    assert!((1..=3).contains(&retry_after), "Retry-After {retry_after}");
    for said in ["2 CPU profiles are running", "max_windows", "force=true"] {
        assert!(text.contains(said), "{said:?} in {text}");
    }
    assert!(shared(&a) && shared(&b));
}

/// A forced request at another frequency closes the running window; a plain request at
/// the old frequency arrives the moment that window answers, while the forced one is
/// still starting its session. It must not start a session of its own in between (which
/// the forced request would then stop): it waits, and gets the 409 for another frequency.
#[tokio::test]
async fn a_takeover_is_not_overtaken_by_a_request_at_the_old_frequency() {
    let _serial = serial().await;
    let server = TestServer::start(app);
    let (closed, on_close) = tokio::sync::oneshot::channel();
    let first = async {
        let profile = profile_after(&server, "seconds=10", Duration::ZERO).await;
        closed.send(()).unwrap();
        profile
    };
    let ask = |query: &'static str| {
        let url = server.url(&format!("/debug/pprof/profile?{query}"));
        async move { unpooled_client().get(url).send().await.unwrap() }
    };
    let forced = async {
        wait_for_windows(&server, 1).await;
        ask("seconds=2&frequency=50&force=true").await
    };
    let plain = async {
        on_close.await.unwrap();
        ask("seconds=1").await
    };
    let (first, forced, plain) = tokio::join!(first, forced, plain);
    assert!(
        first.duration_nanos < 9_000_000_000,
        "the 10 s window was stopped"
    );
    assert_eq!(forced.status(), StatusCode::OK);
    let forced = decode(&forced.bytes().await.unwrap());
    assert_eq!(forced.period, 20_000_000);
    assert!(
        forced.duration_nanos >= 2_000_000_000,
        "the forced profile ran whole"
    );
    assert_eq!(plain.status(), StatusCode::CONFLICT);
    let text = plain.text().await.unwrap();
    assert!(text.contains("running at 50 Hz"), "{text}");
}
