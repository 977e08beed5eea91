//! `/recent`: the recorder's profiles of the past, answered at once. Each test with the
//! recorder on runs a `test_child serve-recent…` process of its own, so that the recorder
//! starts with the process (and never runs in this one, where the other suites need the
//! sampler idle). Times are the test's own clocks: when it spawned the child, when it sent
//! each request and when the last byte came back. Where the `pprof` crate samples, the
//! route is a 503 saying so.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use krabka_pprof::pprof_routes;
use krabka_pprof_tests::{
    ChildServer, Profile, TestServer, client, comments, decode, go_pprof_each, profile_window,
    raw_request, says, serial, stacks, string, total, total_in, unpooled_client,
};
use reqwest::StatusCode;

const EXE: &str = env!("CARGO_BIN_EXE_test_child");
const EARLY: &str = "krabka_early_phase";
const LATE: &str = "krabka_late_phase";

/// The recorder is off here.
#[pprof_routes]
fn without_recorder() -> Router {
    Router::new()
}

/// `GET /debug/pprof/recent?{query}` on its own connection: the status, the body, and
/// the client's clock when it sent the request and when the last byte arrived.
async fn ask(child: &ChildServer, query: &str) -> (StatusCode, Vec<u8>, Asked) {
    let sent = SystemTime::now();
    let response = unpooled_client()
        .get(child.url(&format!("/debug/pprof/recent?{query}")))
        .send()
        .await
        .unwrap();
    let status = response.status();
    let body = response.bytes().await.unwrap().to_vec();
    (
        status,
        body,
        Asked {
            sent,
            answered: SystemTime::now(),
        },
    )
}

/// When a request was sent and answered, by the client's clock.
#[derive(Clone, Copy)]
struct Asked {
    sent: SystemTime,
    answered: SystemTime,
}

impl Asked {
    /// An answer "at once" is of the past: it begins before the request was sent, and
    /// what it sampled (`duration_nanos`, which leaves out the gaps where the recorder
    /// yielded) fits between its start and the answer's arrival, holding nothing that ran
    /// more than the newest slice's cut (held to 150 ms; 1.5 s allowed for a busy
    /// machine) after the request. A route that opened a window and waited for it would
    /// begin after the request, one that waited for more history would end after it. How
    /// long an answer takes is the benchmark's (figure RM), not a test's; how fresh it
    /// is, the tests' that know there was no gap.
    fn assert_up_to_the_request(self, profile: &Profile, what: &str) {
        let (start, end) = profile_window(profile);
        assert!(start < self.sent, "{what}: begins after it was asked for");
        assert!(
            end <= self.answered,
            "{what}: sampled more than it could have"
        );
        assert!(
            end <= self.sent + Duration::from_millis(1_500),
            "{what}: holds what ran {:?} after it was asked for",
            end.duration_since(self.sent).unwrap_or_default()
        );
    }
}

/// A profile from `/recent?{query}`; without `end=`, of the past up to the request.
async fn recent(child: &ChildServer, query: &str) -> Profile {
    let (status, body, asked) = ask(child, query).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "{query}: {}",
        String::from_utf8_lossy(&body)
    );
    let profile = decode(&body);
    if !query.contains("end=") {
        asked.assert_up_to_the_request(&profile, query);
    }
    profile
}

/// A `/recent` answer that is not a profile: its status and sentence.
async fn refused(child: &ChildServer, query: &str) -> (StatusCode, String) {
    let (status, body, _) = ask(child, query).await;
    assert_ne!(status, StatusCode::OK, "{query}");
    (status, String::from_utf8(body).unwrap())
}

fn seconds(profile: &Profile) -> f64 {
    profile.duration_nanos as f64 / 1e9
}

/// Waits until the recorder has sampled something of the last second and ended a slice
/// after `after` (at most 15 s): it is recording, or recording again.
async fn wait_for_recording_after(child: &ChildServer, after: SystemTime) -> Profile {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (status, body, _) = ask(child, "seconds=1").await;
        if status == StatusCode::OK {
            let profile = decode(&body);
            if profile_window(&profile).1 > after && total(&profile, 0) > 0 {
                return profile;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the recorder did not record again after {after:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// When the child's phase burner switched to its second phase, by its own clock.
async fn phase_switch(child: &ChildServer) -> SystemTime {
    let text = client()
        .get(child.url("/switch"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    UNIX_EPOCH + Duration::from_nanos(text.parse().unwrap())
}

async fn sleep_until(at: Instant) {
    tokio::time::sleep_until(at.into()).await;
}

#[tokio::test]
async fn the_last_seconds_hold_the_late_phase_and_a_minute_the_whole_process() {
    let _serial = serial().await;
    let spawned = Instant::now();
    let child = ChildServer::start(EXE, "serve-recent", &[]);
    sleep_until(spawned + Duration::from_secs(13)).await;

    let asked = SystemTime::now();
    let last = recent(&child, "seconds=3").await;
    // The newest slice is cut for the request: the profile reaches up to it.
    let lag = asked
        .duration_since(profile_window(&last).1)
        .unwrap_or_default();
    assert!(
        lag < Duration::from_millis(150),
        "ends {lag:?} before it was asked for"
    );
    let (early, late) = (total_in(&last, 0, EARLY), total_in(&last, 0, LATE));
    assert_eq!(early, 0, "the last 3 s ran only the second phase");
    assert!(late > 50, "{late} samples of the second phase in 3 s");
    assert!(
        (2.4..=3.6).contains(&seconds(&last)),
        "covers {} s",
        seconds(&last)
    );

    let (status, body, asked) = ask(&child, "seconds=60").await;
    let sent = asked.sent;
    assert_eq!(status, StatusCode::OK);
    let minute = decode(&body);
    asked.assert_up_to_the_request(&minute, "seconds=60");
    let (early, late) = (total_in(&minute, 0, EARLY), total_in(&minute, 0, LATE));
    assert!(
        early > 150 && late > 100,
        "both phases: {early} and {late} samples"
    );
    // A process younger than the minute asked for: its life, as the test's clock saw it.
    let age = sent
        .duration_since(SystemTime::now() - spawned.elapsed())
        .unwrap();
    let covered = seconds(&minute);
    assert!(
        (age.as_secs_f64() - 1.0..=age.as_secs_f64() + 0.2).contains(&covered),
        "covers {covered} s of a process {age:?} old"
    );
    let (start, end) = profile_window(&minute);
    let lag = sent.duration_since(end).unwrap_or_default();
    assert!(
        lag < Duration::from_millis(150),
        "ends {lag:?} before it was asked for"
    );
    assert!(
        start
            .duration_since(SystemTime::now() - spawned.elapsed())
            .unwrap()
            < Duration::from_secs(1),
        "begins with the process"
    );
    assert!(
        says(&minute, "the recorder started") && says(&minute, "krabka-pprof recorder:"),
        "{:?}",
        comments(&minute)
    );
    assert_eq!(minute.period, 1_000_000_000 / 99);
    for (reader, top) in go_pprof_each(&["-top", "-nodecount=1000"], &body) {
        assert!(
            top.contains(EARLY) && top.contains(LATE),
            "{reader:?} -top reads both phases:\n{top}"
        );
    }
    // Every view of the CPU route.
    for view in ["format=text", "format=text&lines=true", "symbolize=none"] {
        let (status, body, _) = ask(&child, &format!("seconds=60&{view}")).await;
        assert_eq!(status, StatusCode::OK, "{view}");
        if view == "format=text" {
            assert!(String::from_utf8(body).unwrap().contains(LATE));
        }
    }
    #[cfg(feature = "flamegraph")]
    {
        let (status, body, _) = ask(&child, "seconds=60&format=svg").await;
        assert_eq!(status, StatusCode::OK);
        assert!(String::from_utf8(body).unwrap().contains(EARLY));
    }
    // The labels each phase ran in (`labels::scope`) are on its samples, as on
    // /profile's, and the text view groups by them.
    for (function, phase) in [(EARLY, "early"), (LATE, "late")] {
        let phases = phases_of_samples_in(&minute, function);
        assert!(!phases.is_empty(), "samples in {function}");
        assert!(
            phases.iter().all(|p| p == phase),
            "{function}'s samples carry phase={phase}: {phases:?}"
        );
    }
    let (status, body, _) = ask(&child, "seconds=60&format=text&group=phase").await;
    assert_eq!(status, StatusCode::OK);
    let text = String::from_utf8(body).unwrap();
    assert!(
        text.contains("Grouped by label phase")
            && text.contains("phase=early")
            && text.contains("phase=late"),
        "{text}"
    );
    let (status, body, _) = ask(&child, "seconds=60&thread_ids=true").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        String::from_utf8_lossy(&body).contains("/profile?seconds=N&thread_ids=true"),
        "the 400 says where thread ids are"
    );
}

/// The `phase` label of each sample whose stack holds `function` (empty where it has
/// none).
fn phases_of_samples_in(profile: &Profile, function: &str) -> Vec<String> {
    stacks(profile)
        .iter()
        .zip(&profile.sample)
        .filter(|((names, _), _)| names.iter().any(|name| name.contains(function)))
        .map(|(_, sample)| {
            sample
                .label
                .iter()
                .find(|label| string(profile, label.key) == "phase")
                .map_or_else(String::new, |label| string(profile, label.str).to_owned())
        })
        .collect()
}

#[tokio::test]
async fn an_end_in_the_past_holds_only_what_ran_then() {
    let _serial = serial().await;
    let child = ChildServer::start(EXE, "serve-recent", &[]);
    let switch = phase_switch(&child).await;
    // A window from 5 s to 1 s before the switch (whole seconds, as `end` takes them).
    let end = switch.duration_since(UNIX_EPOCH).unwrap().as_secs() - 1;
    let wait = switch + Duration::from_millis(1500);
    sleep_until(Instant::now() + wait.duration_since(SystemTime::now()).unwrap_or_default()).await;
    let past = recent(&child, &format!("seconds=4&end={end}")).await;
    let (early, late) = (total_in(&past, 0, EARLY), total_in(&past, 0, LATE));
    assert_eq!(late, 0, "nothing of the second phase before it began");
    assert!(early > 50, "{early} samples of the first phase");
    let (start, stop) = profile_window(&past);
    let asked_end = UNIX_EPOCH + Duration::from_secs(end);
    assert!(
        stop <= asked_end + Duration::from_millis(600)
            && start + Duration::from_millis(600) >= asked_end - Duration::from_secs(4),
        "covers {start:?}..{stop:?} for the 4 s before {asked_end:?}"
    );
    // Before the process began, nothing: a 404 that says why.
    let (status, text) = refused(&child, &format!("seconds=5&end={}", end - 30)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(
        text.starts_with("nothing is recorded for that window (the recorder started"),
        "{text}"
    );
}

#[tokio::test]
async fn history_older_than_recent_is_dropped() {
    let _serial = serial().await;
    let spawned = SystemTime::now();
    let child = ChildServer::start(EXE, "serve-recent-short", &[]);
    let old_end = spawned.duration_since(UNIX_EPOCH).unwrap().as_secs() + 3;
    // Seconds 1 to 3 of the process are recorded at first…
    sleep_until(Instant::now() + Duration::from_secs(5)).await;
    let early = recent(&child, &format!("seconds=2&end={old_end}")).await;
    assert!(total(&early, 0) > 0);
    // …and gone once they are more than `recent = "10s"` old.
    sleep_until(Instant::now() + Duration::from_secs(11)).await;
    let (status, text) = refused(&child, &format!("seconds=2&end={old_end}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{text}");
    assert!(
        text.contains("history older than recent (10 s) is not kept"),
        "{text}"
    );
    // What is kept is the last 10 s, which is also the most a request gets.
    let kept = recent(&child, "seconds=60").await;
    assert!(
        (9.0..=11.0).contains(&seconds(&kept)),
        "{} s kept",
        seconds(&kept)
    );
}

/// The recorder's counted bytes, as the index page states them.
fn kept_bytes(index: &str) -> (usize, usize) {
    let parse = |text: &str| -> usize {
        for (unit, size) in [
            ("GiB", 1 << 30),
            ("MiB", 1 << 20),
            ("KiB", 1 << 10),
            ("B", 1),
        ] {
            if let Some(number) = text.strip_suffix(unit) {
                return number.parse::<usize>().unwrap() * size;
            }
        }
        panic!("not a size: {text}")
    };
    let after = index
        .split("sampled), ")
        .nth(1)
        .expect("the recorder's row");
    let (used, rest) = after.split_once(" of the ").unwrap();
    let allowed = rest.split_once(" allowed").unwrap().0;
    (parse(used), parse(allowed))
}

#[tokio::test]
async fn the_memory_bound_drops_the_oldest_slices() {
    let _serial = serial().await;
    let spawned = Instant::now();
    let child = ChildServer::start(EXE, "serve-recent-small", &[]);
    wait_for_recording_after(&child, SystemTime::now()).await;
    // A new stack nearly every sample fills 256 KiB in a few seconds.
    let deadline = spawned + Duration::from_secs(40);
    let dropped = loop {
        let profile = recent(&child, "seconds=600").await;
        if says(
            &profile,
            "was dropped to stay within recent_memory (256KiB)",
        ) {
            break profile;
        }
        assert!(Instant::now() < deadline, "{:?}", comments(&profile));
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(total_in(&dropped, 0, "krabka_varied_stack") > 0);
    // The newest stay and the oldest go: what is covered stops growing with the process.
    let first = seconds(&dropped);
    tokio::time::sleep(Duration::from_secs(4)).await;
    let asked = SystemTime::now();
    let later = recent(&child, "seconds=600").await;
    let age = spawned.elapsed().as_secs_f64();
    assert!(
        seconds(&later) < first + 2.0 && seconds(&later) < age - 3.0,
        "covers {} s of a process {age} s old ({first} s when the first slice was dropped)",
        seconds(&later)
    );
    // The newest slices are kept: the window reaches the request, by the client's clock
    // before it was sent, but for at most a slice (1 s) the recorder cut late, and its
    // 250 ms wait (dropping the newest would leave it 4 s behind, where the first drop
    // was). Not timed from the answer, which a busy machine renders late.
    let behind = asked
        .duration_since(profile_window(&later).1)
        .unwrap_or_default();
    assert!(
        behind < Duration::from_millis(1500),
        "the newest slices are kept: the window ends {behind:?} before the request was sent"
    );
    // Within the bound, and it stays there while stacks keep coming.
    for _ in 0..5 {
        let index = client()
            .get(child.url("/debug/pprof/"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let (used, allowed) = kept_bytes(&index);
        assert_eq!(allowed, 256 * 1024);
        assert!(used <= allowed, "{used} bytes kept of {allowed}");
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
}

#[tokio::test]
async fn a_profile_at_another_frequency_gets_its_window_and_the_recorder_yields_then_resumes() {
    let _serial = serial().await;
    let child = ChildServer::start(EXE, "serve-recent", &[]);
    wait_for_recording_after(&child, SystemTime::now()).await;
    // At the recorder's frequency, a profile joins its session: nothing is missed.
    let joined = unpooled_client()
        .get(child.url("/debug/pprof/profile?seconds=2"))
        .send()
        .await
        .unwrap();
    assert_eq!(joined.status(), StatusCode::OK);
    let joined = decode(&joined.bytes().await.unwrap());
    assert_eq!(joined.period, 1_000_000_000 / 99);
    let beside = recent(&child, "seconds=3").await;
    assert!(!says(&beside, "not sampled"), "{:?}", comments(&beside));

    // At another frequency it gets the sampler: the recorder yields for its window.
    let before = SystemTime::now();
    let other = unpooled_client()
        .get(child.url("/debug/pprof/profile?seconds=3&frequency=50"))
        .send()
        .await
        .unwrap();
    assert_eq!(other.status(), StatusCode::OK);
    let other = decode(&other.bytes().await.unwrap());
    assert_eq!(other.period, 20_000_000, "its own 50 Hz session");
    assert!(seconds(&other) >= 3.0);
    // 150 on a quiet machine, 38 where three builds shared its two cores: sampled, at its
    // own frequency.
    assert!(total(&other, 0) > 10, "{} samples", total(&other, 0));
    let (_, other_end) = profile_window(&other);
    wait_for_recording_after(&child, other_end).await;
    // The gap shows in what the recorder says it covers.
    let span = SystemTime::now().duration_since(before).unwrap();
    let after = recent(&child, &format!("seconds={}", span.as_secs() + 2)).await;
    assert!(
        says(&after, "yielded the sampler to a profile at 50 Hz"),
        "{:?}",
        comments(&after)
    );
    // `duration_nanos` is what was sampled; the wall clock from its start to now is more.
    let wall = SystemTime::now()
        .duration_since(profile_window(&after).0)
        .unwrap();
    let missing = wall.as_secs_f64() - seconds(&after);
    assert!(
        (2.8..=4.5).contains(&missing),
        "{missing} s not covered around a 3 s profile at 50 Hz"
    );
    assert!(
        profile_window(&after).0 < before,
        "it still holds what came before"
    );
}

/// Waits until the child's index says `windows` request windows are open (at most 10 s).
async fn wait_for_windows(child: &ChildServer, windows: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let said = format!(
        "{windows} window{} open",
        if windows == 1 { "" } else { "s" }
    );
    loop {
        let index = client()
            .get(child.url("/debug/pprof/"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        if index.contains(&said) {
            return;
        }
        assert!(Instant::now() < deadline, "the index never said {said:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn force_beside_the_recorder_and_a_scraper_takes_the_sampler_and_the_recorder_resumes() {
    let _serial = serial().await;
    let child = ChildServer::start(EXE, "serve-recent", &[]);
    wait_for_recording_after(&child, SystemTime::now()).await;
    let before = SystemTime::now();
    let scraper = async {
        let response = unpooled_client()
            .get(child.url("/debug/pprof/profile?seconds=10"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        decode(&response.bytes().await.unwrap())
    };
    let forced = async {
        wait_for_windows(&child, 1).await;
        let response = unpooled_client()
            .get(child.url("/debug/pprof/profile?seconds=2&frequency=50&force=true"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        decode(&response.bytes().await.unwrap())
    };
    let (scraped, forced) = tokio::join!(scraper, forced);
    assert_eq!(forced.period, 20_000_000);
    assert!(seconds(&forced) >= 2.0);
    assert!(
        seconds(&scraped) < 9.0,
        "the scraper's window was stopped early"
    );
    let (_, forced_end) = profile_window(&forced);
    wait_for_recording_after(&child, forced_end).await;
    let span = SystemTime::now().duration_since(before).unwrap();
    let after = recent(&child, &format!("seconds={}", span.as_secs() + 2)).await;
    assert!(
        says(&after, "a profile with force=true took the sampler"),
        "{:?}",
        comments(&after)
    );
    assert!(total_in(&after, 0, EARLY) + total_in(&after, 0, LATE) > 0);
}

#[tokio::test]
async fn clients_that_hang_up_leave_the_recorder_recording() {
    use tokio::io::AsyncWriteExt as _;
    let _serial = serial().await;
    let child = ChildServer::start(EXE, "serve-recent", &[]);
    wait_for_recording_after(&child, SystemTime::now()).await;
    for round in 0..20u64 {
        let mut raw = tokio::net::TcpStream::connect(child.addr).await.unwrap();
        let request = format!(
            "GET /debug/pprof/recent?seconds=600&format=text HTTP/1.1\r\nHost: {}\r\n\
             Connection: close\r\n\r\n",
            child.addr
        );
        raw.write_all(request.as_bytes()).await.unwrap();
        // Gone at once, or while its profile is being built.
        tokio::time::sleep(Duration::from_millis(round % 4 * 3)).await;
        drop(raw);
    }
    let after = SystemTime::now();
    wait_for_recording_after(&child, after + Duration::from_secs(1)).await;
    let index = child.text("/debug/pprof/").await;
    assert!(
        index.contains("<td>no CPU profile; the recorder samples at 99 Hz</td>"),
        "no window left open, the recorder still sampling: {index}"
    );
    let whole = recent(&child, "seconds=60").await;
    assert!(!says(&whole, "not sampled"), "{:?}", comments(&whole));
}

#[tokio::test]
async fn scrapers_get_the_last_seconds_at_once_and_bad_queries_a_sentence() {
    let _serial = serial().await;
    let child = ChildServer::start(EXE, "serve-recent", &[]);
    wait_for_recording_after(&child, SystemTime::now()).await;
    // Alloy and Parca with `delta = false` and `params = { seconds = 15 }`, every 15 s.
    for agent in ["Alloy/v1.11.0 (linux; binary)", "conprof/v0.23.0"] {
        let request = format!(
            "GET /debug/pprof/recent?seconds=15 HTTP/1.1\r\nHost: {}\r\nUser-Agent: {agent}\r\n\
             Connection: close\r\n\r\n",
            child.addr
        );
        let sent = SystemTime::now();
        let (status, headers, body) = raw_request(child.addr, &request).await;
        let asked = Asked {
            sent,
            answered: SystemTime::now(),
        };
        assert_eq!(status, 200, "{agent}");
        let content_type = headers.iter().find(|(k, _)| k == "content-type").unwrap();
        assert_eq!(content_type.1, "application/octet-stream");
        assert_eq!(&body[..2], &[0x1f, 0x8b]);
        let profile = decode(&body);
        assert!(total(&profile, 0) > 0);
        asked.assert_up_to_the_request(&profile, agent);
    }
    for (query, says) in [
        ("seconds=abc", "`seconds` must be a whole number of seconds"),
        (
            "end=yesterday",
            "`end` must be the window's end in whole UNIX seconds",
        ),
        ("format=pdf", "`format` must be pprof"),
        (
            "symbolize=none&format=text",
            "only the pprof format carries",
        ),
        ("seconds=1&seconds=2", "more than once"),
    ] {
        let (status, text) = refused(&child, query).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}");
        assert!(
            text.contains(says) && text.ends_with('\n'),
            "{query}: {text}"
        );
    }
    // Above what is kept, a request gets what is kept.
    let clamped = recent(&child, "seconds=86400").await;
    assert!(seconds(&clamped) < 60.0);
}

#[tokio::test]
async fn without_recent_the_route_says_which_key_turns_it_on() {
    let server = TestServer::start(without_recorder);
    for query in ["", "?seconds=15", "?seconds=abc"] {
        let response = client()
            .get(server.url(&format!("/debug/pprof/recent{query}")))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()["x-go-pprof"], "1");
        let text = response.text().await.unwrap();
        assert!(
            text.starts_with("the recorder is off in this app: add `recent = \"10m\"`"),
            "{text}"
        );
    }
    let index = server.text("/debug/pprof/").await;
    assert!(index.contains("Off: add <code>recent = \"10m\"</code>"));
}

/// Where CPU profiles come from the `pprof` crate's sampler (macOS, the BSDs), the
/// recorder cannot run: `/recent` is a 503 that says what to take instead, the index page
/// says the route is not here, and `/profile` still answers.
#[tokio::test]
async fn with_the_pprof_crates_sampler_recent_is_a_503_saying_what_to_take_instead() {
    let _serial = serial().await;
    let child = ChildServer::start(
        EXE,
        "serve-recent-short",
        &[("KRABKA_TEST_SAMPLER", Some("pprof-rs"))],
    );
    let response = client()
        .get(child.url("/debug/pprof/recent?seconds=1"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()["x-go-pprof"], "1");
    let text = response.text().await.unwrap();
    assert!(
        text.starts_with("the recorder needs krabka-pprof's own CPU sampler")
            && text.contains("take /profile?seconds=N instead"),
        "{text}"
    );
    let index = child.text("/debug/pprof/").await;
    assert!(
        index.contains("<strong>Not here</strong>: the recorder needs krabka-pprof"),
        "{index}"
    );
    let profile = client()
        .get(child.url("/debug/pprof/profile?seconds=1"))
        .send()
        .await
        .unwrap();
    assert_eq!(profile.status(), StatusCode::OK);
    let profile = decode(&profile.bytes().await.unwrap());
    assert!(
        says(&profile, "through the pprof crate's sampler"),
        "{:?}",
        comments(&profile)
    );
}
