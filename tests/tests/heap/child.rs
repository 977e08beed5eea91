//! Processes with a chosen jemalloc environment: zero configuration, sampling off, and
//! sampling inactive (the timed window, and its 409).

use std::process::Command;
use std::time::{Duration, Instant};

use krabka_pprof_tests::{ChildServer, client, column, comments, decode, says, total_in};
use reqwest::StatusCode;

const CHILD: &str = env!("CARGO_BIN_EXE_test_child");

fn child_command(conf: Option<&str>) -> Command {
    let mut command = Command::new(CHILD);
    command
        .env_remove("MALLOC_CONF")
        .env_remove("_RJEM_MALLOC_CONF");
    if let Some(conf) = conf {
        command
            .env("_RJEM_MALLOC_CONF", conf)
            .env("MALLOC_CONF", conf);
    }
    command
}

fn serve(conf: &str) -> ChildServer {
    ChildServer::start(
        CHILD,
        "serve",
        &[
            ("_RJEM_MALLOC_CONF", Some(conf)),
            ("MALLOC_CONF", Some(conf)),
        ],
    )
}

#[test]
fn sampling_is_on_from_start_without_any_environment() {
    let output = child_command(None).arg("config").output().unwrap();
    assert!(output.status.success());
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        "opt.prof=true prof.active=true prof.lg_sample=19",
        "the linked malloc_conf must configure jemalloc with no MALLOC_CONF"
    );
}

#[test]
fn the_environment_still_overrides_the_linked_setting() {
    let output = child_command(Some("lg_prof_sample:20"))
        .arg("config")
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        "opt.prof=true prof.active=true prof.lg_sample=20"
    );
}

#[tokio::test]
async fn profiling_off_is_a_503_naming_the_fix_and_cpu_still_works() {
    let child = serve("prof:false");
    let http = client();
    let response = http
        .get(child.url("/debug/pprof/heap"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()["x-go-pprof"], "1");
    let text = response.text().await.unwrap();
    assert!(
        text.contains("prof:false") && text.contains("restart"),
        "{text}"
    );

    let cpu = http
        .get(child.url("/debug/pprof/profile?seconds=1"))
        .send()
        .await
        .unwrap();
    assert_eq!(cpu.status(), StatusCode::OK);
    decode(&cpu.bytes().await.unwrap());
    let app = http.get(child.url("/")).send().await.unwrap();
    assert_eq!(app.text().await.unwrap(), "child");
}

#[tokio::test]
async fn inactive_sampling_gets_a_timed_window_and_a_second_one_gets_409() {
    let child = serve("prof_active:false");
    let http = client();
    let url = child.url("/debug/pprof/heap?seconds=2");
    let started = Instant::now();
    let (order_tx, mut order_rx) = tokio::sync::mpsc::unbounded_channel();
    let request = |name: &'static str| {
        let (http, url, tx) = (http.clone(), url.clone(), order_tx.clone());
        async move {
            let response = http.get(url).send().await.unwrap();
            tx.send((name, started.elapsed())).unwrap();
            response
        }
    };
    // During the window, the app keeps 16 MiB: the window's profile must show it.
    let keep = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let kept = http.get(child.url("/keep")).send().await.unwrap();
        assert_eq!(kept.status(), StatusCode::OK);
    };
    let ((a, b), ()) = tokio::join!(async { tokio::join!(request("a"), request("b")) }, keep);
    let (first, refused_after) = order_rx.recv().await.unwrap();
    let (ok, refused, refused_name) = match (a.status(), b.status()) {
        (StatusCode::OK, StatusCode::CONFLICT) => (a, b, "b"),
        (StatusCode::CONFLICT, StatusCode::OK) => (b, a, "a"),
        other => panic!("expected one 200 and one 409, got {other:?}"),
    };
    assert_eq!(first, refused_name, "the 409 is answered at once");
    let retry_after: u64 = refused.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=2).contains(&retry_after), "Retry-After {retry_after}");
    // The window began after the requests were sent and ends 2 s after that: when the
    // refusal came back (by this client's clock), at least what is left of those 2 s.
    assert!(
        retry_after as f64 >= 2.0 - refused_after.as_secs_f64(),
        "Retry-After {retry_after} s, answered {refused_after:?} after the requests"
    );
    assert!(
        refused
            .text()
            .await
            .unwrap()
            .contains("heap sampling window")
    );
    let profile = decode(&ok.bytes().await.unwrap());
    // Measured from the moment sampling was switched on to the dump, not echoed.
    assert!(
        (2_000_000_000..2_500_000_000).contains(&profile.duration_nanos),
        "the window lasted {} ns",
        profile.duration_nanos
    );
    assert_ne!(
        profile.duration_nanos, 2_000_000_000,
        "measured, not echoed"
    );
    assert!(started.elapsed() >= Duration::from_secs(2));
    let kept = total_in(
        &profile,
        column(&profile, "inuse_space"),
        "keep_16_mib_in_child",
    );
    assert!(
        kept >= 8 << 20,
        "the 16 MiB kept during the window: {kept} bytes in its profile"
    );
    // Allocated during the window too, and said so.
    let allocated = total_in(
        &profile,
        column(&profile, "alloc_space"),
        "keep_16_mib_in_child",
    );
    assert!(allocated >= 8 << 20, "{allocated} bytes allocated");
    assert!(
        says(&profile, "sampled during this 2 s window only"),
        "{:?}",
        comments(&profile)
    );

    // The window is free again, and sampling off: the next request gets a window of its
    // own, in which the memory kept during the first is not sampled (switching sampling
    // off reset jemalloc's samples).
    let again = http
        .get(child.url("/debug/pprof/heap?seconds=1"))
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), StatusCode::OK);
    let again = decode(&again.bytes().await.unwrap());
    assert!(
        again.duration_nanos >= 1_000_000_000,
        "a window, not a dump of sampling left on: {} ns",
        again.duration_nanos
    );
    for ty in ["inuse_space", "alloc_space"] {
        assert_eq!(
            total_in(&again, column(&again, ty), "keep_16_mib_in_child"),
            0,
            "the first window's samples outlived it ({ty})"
        );
    }
}

#[tokio::test]
async fn a_client_that_hangs_up_during_a_window_leaves_sampling_off() {
    use tokio::io::AsyncWriteExt as _;
    let child = serve("prof_active:false");
    let request = "GET /debug/pprof/heap?seconds=1 HTTP/1.1\r\nHost: x\r\n\r\n";
    // Hang up at different moments: before the handler starts, while it takes the window
    // and switches sampling on, and during the window.
    for delay_ms in [0u64, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144] {
        let mut stream = tokio::net::TcpStream::connect(child.addr).await.unwrap();
        stream.write_all(request.as_bytes()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(delay_ms)).await;
        drop(stream);
    }
    // Once the last window is let go, a request finds sampling off again: it gets a window
    // of its own (a profile of its 1 s), not an immediate dump of sampling left on.
    let http = client();
    let deadline = Instant::now() + Duration::from_secs(20);
    let response = loop {
        let response = http
            .get(child.url("/debug/pprof/heap?seconds=1"))
            .send()
            .await
            .unwrap();
        if response.status() != StatusCode::CONFLICT || Instant::now() > deadline {
            break response;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(response.status(), StatusCode::OK);
    let profile = decode(&response.bytes().await.unwrap());
    // A dump of sampling left on would be an instant (duration 0).
    assert!(
        profile.duration_nanos >= 1_000_000_000,
        "sampling was left on by a client that hung up: {} ns",
        profile.duration_nanos
    );
}

/// A container with a read-only root and no TMPDIR: heap dumps need no file.
#[tokio::test]
async fn heap_profiles_need_no_writable_filesystem() {
    let child = ChildServer::start(
        CHILD,
        "serve",
        &[("TMPDIR", Some("/nonexistent/krabka-pprof-tmp"))],
    );
    let http = client();
    for route in ["/debug/pprof/heap", "/debug/pprof/allocs"] {
        let response = http.get(child.url(route)).send().await.unwrap();
        let status = response.status();
        let body = response.bytes().await.unwrap();
        assert_eq!(
            status,
            StatusCode::OK,
            "{route}: {}",
            String::from_utf8_lossy(&body)
        );
        let profile = decode(&body);
        assert!(!profile.sample.is_empty(), "{route}: samples of the heap");
    }
}

/// A service already on `tikv_jemallocator::Jemalloc` (the same jemalloc) gets heap
/// profiles, with its allocation site in them, and never the 503 for another allocator.
#[tokio::test]
async fn a_service_on_tikv_jemallocator_gets_heap_profiles() {
    let child = ChildServer::start(CHILD, "serve-tikv", &[]);
    let response = client()
        .get(child.url("/debug/pprof/heap"))
        .send()
        .await
        .unwrap();
    let status = response.status();
    let body = response.bytes().await.unwrap();
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let profile = decode(&body);
    // `serve-tikv` keeps 64 MiB at one site from start.
    let held = total_in(&profile, 3, "retain_64_mib");
    assert!(held >= 32 << 20, "inuse_space at the site: {held} bytes");
}
