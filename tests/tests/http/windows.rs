//! Concurrent CPU profiles share one sampler: each request gets the samples of its own
//! window, a window that hangs up leaves the others whole, the sampler stops with the
//! last window, another frequency gets 409 (or takes over with `force=true`), and
//! `max_windows` bounds how many share it. (`max_windows = 1`, one at a time, is what
//! `cpu.rs` and `control.rs` test.) Every window is judged by the client's clock around
//! its request, never by the profile's word alone: a window that joined a running
//! session must not start before its request was sent, nor hold the burner's CPU from
//! before it.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use krabka_pprof::pprof_routes;
use krabka_pprof_tests::{
    Burner, CpuTimeline, Options, Profile, ServerLog, TestServer, assert_cpu_nanos,
    assert_sample_count, assert_window_inside, comments, decode, krabka_sampler_only,
    pprof_rs_sampler, says, serial, skip, total_in, unpooled_client, with_hold_route,
};
use reqwest::StatusCode;

#[pprof_routes(cpu_max = "10s")]
fn app() -> Router {
    Router::new()
}

/// With the route a test holds the blocking pool through.
#[pprof_routes(cpu_max = "10s")]
fn held_app() -> Router {
    with_hold_route(Router::new())
}

#[pprof_routes(cpu_max = "10s", max_windows = 2)]
fn two_at_once() -> Router {
    Router::new()
}

async fn wait_for_windows(server: &TestServer, windows: usize) {
    server.wait_for_windows(windows).await;
}

/// Whether this process has no POSIX timer left within 30 s: the sampler arms one per
/// thread while a session runs, and deletes them all when it stops.
async fn sampler_stops() -> bool {
    // Stopping takes milliseconds; 30 s for a machine busy with other work, where the
    // blocking pool that stops it waits for a core (5 s was too few there).
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        let timers = std::fs::read_to_string("/proc/self/timers").unwrap();
        if !timers.lines().any(|line| line.starts_with("ID:")) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    false
}

/// A profile and the client's wall clock just before its request was sent and just after
/// its answer arrived.
struct Answer {
    profile: Profile,
    sent: SystemTime,
    received: SystemTime,
}

impl Answer {
    /// The profile's window, checked to lie inside the client's request.
    fn window(&self, what: &str) -> (SystemTime, SystemTime) {
        assert_window_inside(&self.profile, self.sent, self.received, what)
    }

    /// Checks the burner's samples against its own clock: the CPU of the profile's window
    /// within 15% (the count, and the pprof crate's nanoseconds, which are its count's,
    /// where the machine left it its core), and never more than the burner used while
    /// the client's request was open (what a window that carried samples from before its
    /// request would show).
    fn assert_burner(&self, timeline: &CpuTimeline, what: &str) {
        let (start, end) = self.window(what);
        let cpu = timeline.cpu_within(start, end);
        let around = timeline.cpu_within(self.sent, self.received);
        let nanos = total_in(&self.profile, 1, "Burner") as f64;
        let period = self.profile.period as f64;
        assert!(
            nanos <= around.as_nanos() as f64 * 1.1 + 2.0 * period,
            "{what}: the burner's samples stand for {nanos} ns, more than the {around:?} it \
             used while the request was open"
        );
        if cpu < Duration::from_millis(500) {
            skip(
                &format!("{what}: the burner's share"),
                &format!(
                    "the burner used only {cpu:?} of CPU in the window (the machine is busy \
                     with other work): too little to judge its samples by"
                ),
            );
            return;
        }
        let frequency = (1e9 / period).round() as u32;
        let share = timeline.least_core_share(start, end);
        assert_cpu_nanos(what, nanos, cpu, frequency, share, 0.15);
        assert_sample_count(
            what,
            total_in(&self.profile, 0, "Burner") as f64,
            cpu,
            frequency,
            share,
            0.15,
        );
    }
}

/// A CPU profile request, `after` from now, on its own connection; its profile.
async fn profile_after(server: &TestServer, query: &str, after: Duration) -> Answer {
    tokio::time::sleep(after).await;
    let sent = SystemTime::now();
    let response = unpooled_client()
        .get(server.url(&format!("/debug/pprof/profile?{query}")))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK, "{query}");
    let profile = decode(&response.bytes().await.unwrap());
    Answer {
        profile,
        sent,
        received: SystemTime::now(),
    }
}

/// The least `Retry-After` a 409 may give when the window it waits for was asked for,
/// for `seconds`, after `before`, and the 409 came back at `refused_at` (the client's
/// monotonic clock, the server's too): that window ends no earlier than `seconds` after
/// `before`, and the header rounds the time left up to whole seconds.
fn least_retry_after(seconds: u64, before: Instant, refused_at: Instant) -> u64 {
    let elapsed = refused_at.saturating_duration_since(before);
    let left = Duration::from_secs(seconds).saturating_sub(elapsed);
    left.as_secs() + u64::from(left.subsec_nanos() > 0)
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
    says(profile, "windows shared the sampler")
}

#[tokio::test]
async fn a_scraper_and_people_each_get_a_profile_of_their_own_window() {
    let _serial = serial().await;
    if krabka_sampler_only(
        "a_scraper_and_people_each_get_a_profile_of_their_own_window",
        "serves one request at a time: the people would be refused, not share the scraper's session",
    ) {
        return;
    }
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
    for (seconds, answer) in scraped.iter().map(|p| (2, p)).chain(people) {
        let profile = &answer.profile;
        let length = profile.duration_nanos as f64 / 1e9;
        assert!(
            (seconds as f64..seconds as f64 + 0.5).contains(&length),
            "a {seconds} s request's profile covers {length} s"
        );
        answer.assert_burner(&timeline, &format!("a {seconds} s window"));
    }
    for (seconds, answer) in people {
        assert!(
            shared(&answer.profile),
            "the {seconds} s request shared the scraper's sampler: {:?}",
            comments(&answer.profile)
        );
    }
}

#[tokio::test]
async fn a_window_that_hangs_up_leaves_the_others_whole_and_the_last_stops_the_sampler() {
    use tokio::io::AsyncWriteExt as _;
    let _serial = serial().await;
    if krabka_sampler_only(
        "a_window_that_hangs_up_leaves_the_others_whole_and_the_last_stops_the_sampler",
        "serves one request at a time: there is no other window to stay whole",
    ) {
        return;
    }
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
    staying.window("the staying window");
    let staying = staying.profile;
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
    if krabka_sampler_only(
        "another_frequency_gets_409_and_the_same_frequency_joins",
        "serves one request at a time: no request joins a running one (cpu.rs tests its 409)",
    ) {
        return;
    }
    let server = TestServer::start(app);
    let before = Instant::now();
    let running = profile_after(&server, "seconds=3", Duration::ZERO);
    let others = async {
        wait_for_windows(&server, 1).await;
        let (retry_after, text) = refused(&server, "seconds=1&frequency=50").await;
        // Until the running window ends, by the client's clock.
        let least = least_retry_after(3, before, Instant::now());
        assert!(
            (least.max(1)..=3).contains(&retry_after),
            "Retry-After {retry_after}, at least {least}"
        );
        for said in ["running at 99 Hz", "at 99 Hz joins it", "force=true"] {
            assert!(text.contains(said), "{said:?} in {text}");
        }
        profile_after(&server, "seconds=1", Duration::ZERO).await
    };
    let (running, joined) = tokio::join!(running, others);
    // The joined window is its own: it starts after its request was sent, not at the
    // running session's start.
    let (running_start, _) = running.window("the running window");
    let (joined_start, _) = joined.window("the joined window");
    assert!(joined_start > running_start);
    let (running, joined) = (running.profile, joined.profile);
    assert!(running.duration_nanos >= 3_000_000_000);
    assert!(shared(&running) && shared(&joined));
    assert_eq!(joined.period, running.period);
}

#[tokio::test]
async fn force_where_the_request_can_join_joins_and_stops_nothing() {
    let _serial = serial().await;
    if krabka_sampler_only(
        "force_where_the_request_can_join_joins_and_stops_nothing",
        "serves one request at a time: a forced request always stops the running one \
         (control.rs tests its force)",
    ) {
        return;
    }
    let log = ServerLog::new();
    let server = TestServer::start_with(
        Options {
            log: Some(log.clone()),
            ..Options::default()
        },
        app,
    );
    let running = profile_after(&server, "seconds=3", Duration::ZERO);
    let forced = async {
        wait_for_windows(&server, 1).await;
        profile_after(&server, "seconds=1&force=true", Duration::ZERO).await
    };
    let (running, forced) = tokio::join!(running, forced);
    // The running window ran its whole 3 s and shared the sampler with the forced one,
    // which started when its request was sent: it joined, at the running frequency.
    let (running_start, _) = running.window("the running window");
    let (forced_start, _) = forced.window("the forced window");
    assert!(forced_start > running_start);
    assert!(
        running.profile.duration_nanos >= 3_000_000_000,
        "the running window was cut to {} ns by a force that could join",
        running.profile.duration_nanos
    );
    assert!(
        shared(&running.profile) && shared(&forced.profile),
        "both windows say they shared the sampler: {:?} {:?}",
        comments(&running.profile),
        comments(&forced.profile)
    );
    assert_eq!(forced.profile.period, running.profile.period);
    // The server says when a force closes windows early: it never did.
    let closing: Vec<String> = log
        .lines()
        .into_iter()
        .filter(|line| line.contains("force=true: closing"))
        .collect();
    assert!(
        closing.is_empty(),
        "a force that could join closed: {closing:?}"
    );
}

#[tokio::test]
async fn force_at_another_frequency_closes_every_window_early_and_takes_over() {
    let _serial = serial().await;
    if krabka_sampler_only(
        "force_at_another_frequency_closes_every_window_early_and_takes_over",
        "serves one request at a time: there are no two windows to close (control.rs tests its force)",
    ) {
        return;
    }
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
    // One session at a time: the forced one starts once both windows it closed ended, and
    // they ended after the force was sent (it closed them; they did not just end).
    let (forced_start, _) = forced.window("the forced window");
    for (stopped, what) in [(&first, "the first window"), (&second, "the second window")] {
        let (_, end) = stopped.window(what);
        assert!(
            end >= forced.sent && end <= forced_start,
            "{what} ended at {end:?}: after the force was sent ({:?}) and before its session \
             started ({forced_start:?})",
            forced.sent
        );
    }
    let forced = forced.profile;
    assert_eq!(
        forced.period, 20_000_000,
        "the forced profile runs at 50 Hz"
    );
    assert!(forced.duration_nanos >= 1_000_000_000);
    for stopped in [first.profile, second.profile] {
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
    if pprof_rs_sampler() {
        // The pprof crate's sampler serves one request at a time, whatever max_windows
        // says: the second is refused at once as the profiler is busy.
        let before = Instant::now();
        let a = profile_after(&server, "seconds=3", Duration::ZERO);
        let second = async {
            let opened_after = server.wait_for_windows(1).await.unwrap_or(before);
            let answer = refused(&server, "seconds=1").await;
            (answer, opened_after, Instant::now())
        };
        let (a, ((retry_after, text), opened_after, refused_at)) = tokio::join!(a, second);
        // Until the window ends, by the client's clock: its end is counted from the
        // sampler's start, which the index page showed between two of the client's looks.
        let least = least_retry_after(3, opened_after, refused_at);
        assert!(
            (least.max(1)..=3).contains(&retry_after),
            "Retry-After {retry_after}, at least {least}"
        );
        assert!(text.contains("already running"), "{text}");
        a.window("the one window");
        assert!(!shared(&a.profile), "{:?}", comments(&a.profile));
        return;
    }
    let before = Instant::now();
    let a = profile_after(&server, "seconds=3", Duration::ZERO);
    let b = async {
        wait_for_windows(&server, 1).await;
        profile_after(&server, "seconds=3", Duration::ZERO).await
    };
    let third = async {
        wait_for_windows(&server, 2).await;
        let answer = refused(&server, "seconds=1").await;
        (answer, Instant::now())
    };
    let (a, b, ((retry_after, text), refused_at)) = tokio::join!(a, b, third);
    // Until the first window ends, by the client's clock.
    let least = least_retry_after(3, before, refused_at);
    assert!(
        (least.max(1)..=3).contains(&retry_after),
        "Retry-After {retry_after}, at least {least}"
    );
    for said in ["2 CPU profiles are running", "max_windows", "force=true"] {
        assert!(text.contains(said), "{said:?} in {text}");
    }
    a.window("the first window");
    b.window("the second window");
    assert!(shared(&a.profile) && shared(&b.profile));
}

/// A forced request at another frequency closes the running window; plain requests at
/// the old frequency arrive while that window is closing (made so: the server's one
/// blocking thread is held, so the closing window waits for it, and the server's log
/// says when the force has closed the window and when each plain request waits). When
/// the window is let go, they all wake together; no plain one may start a session of its
/// own then (which the forced request would stop in turn): each waits for the forced
/// one's session, and gets the 409 for another frequency. Which of them the runtime
/// polls first is its own choice, so three plain requests race the forced one, and the
/// scene is played four times.
#[tokio::test]
async fn a_takeover_is_not_overtaken_by_a_request_at_the_old_frequency() {
    let _serial = serial().await;
    if krabka_sampler_only(
        "a_takeover_is_not_overtaken_by_a_request_at_the_old_frequency",
        "has no sessions to take over: a forced request waits for the one running",
    ) {
        return;
    }
    let log = ServerLog::new();
    let server = TestServer::start_with(
        Options {
            blocking_threads: Some(1),
            log: Some(log.clone()),
            ..Options::default()
        },
        held_app,
    );
    let ask = |query: &'static str| {
        let url = server.url(&format!("/debug/pprof/profile?{query}"));
        async move {
            let sent = SystemTime::now();
            let response = unpooled_client().get(url).send().await.unwrap();
            (response, sent)
        }
    };
    for round in 1..=4 {
        let logged = log.lines().len();
        let first = tokio::spawn(ask("seconds=10"));
        wait_for_windows(&server, 1).await;
        let hold = server.hold_blocking_pool(true).await;
        let forced = tokio::spawn(ask("seconds=1&frequency=50&force=true"));
        let (at, _) = log
            .wait_for(
                logged,
                &["force=true: closing 1 CPU profile window at 99 Hz early"],
            )
            .await;
        let plain: Vec<_> = (0..3).map(|_| tokio::spawn(ask("seconds=1"))).collect();
        let mut waiting = at;
        for _ in &plain {
            waiting = log
                .wait_for(
                    waiting + 1,
                    &[
                        "frequency=99",
                        "waiting for the CPU profile session at 99 Hz",
                    ],
                )
                .await
                .0;
        }
        // The phase this test is about, reached by events, not by timing.
        eprintln!("round {round}: the plain requests wait on the closing window; letting go");
        drop(hold);

        let (first, first_sent) = first.await.unwrap();
        let first_received = SystemTime::now();
        assert_eq!(first.status(), StatusCode::OK);
        let first = decode(&first.bytes().await.unwrap());
        let (_, first_end) = assert_window_inside(&first, first_sent, first_received, "the first");
        assert!(
            first.duration_nanos < 9_000_000_000,
            "round {round}: the 10 s window was stopped"
        );
        for plain in plain {
            let (plain, _) = plain.await.unwrap();
            let status = plain.status();
            let text = plain.text().await.unwrap();
            assert_eq!(
                status,
                StatusCode::CONFLICT,
                "round {round}: a plain request started a session in the takeover: {text}"
            );
            assert!(text.contains("running at 50 Hz"), "round {round}: {text}");
        }
        let (forced, forced_sent) = forced.await.unwrap();
        assert_eq!(forced.status(), StatusCode::OK);
        let forced = decode(&forced.bytes().await.unwrap());
        let (forced_start, _) =
            assert_window_inside(&forced, forced_sent, SystemTime::now(), "the forced");
        assert!(forced_start >= first_end, "one session at a time");
        assert_eq!(forced.period, 20_000_000);
        assert!(
            forced.duration_nanos >= 1_000_000_000,
            "round {round}: the forced profile ran whole"
        );
        wait_for_windows(&server, 0).await;
    }
}
