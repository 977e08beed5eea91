//! A session that never ends (scrapers overlapping, a recorder) meets what a service does
//! over hours: libraries loaded and unloaded, threads by the thousand, a thread that
//! unblocks `SIGPROF` after a while, forks and execs. Each test holds one session open
//! with a long window while it happens, then judges a later window by clocks outside the
//! sampler (the threads' own CPU clocks, `/proc/self/timers`, `/proc/self/maps`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use axum::Router;
use krabka_pprof::pprof_routes;
use krabka_pprof_tests::{
    Profile, TestServer, assert_window_inside, client, comments, decode, hot, says, serial, stacks,
    thread_cpu_time, total,
};
use reqwest::StatusCode;

#[pprof_routes(cpu_max = "30s")]
fn app() -> Router {
    Router::new()
}

/// A window of `seconds` at `frequency`, and the client's clock around it.
fn window(
    server: &TestServer,
    seconds: u64,
    frequency: u32,
) -> tokio::task::JoinHandle<(Profile, SystemTime, SystemTime)> {
    let url = server.url(&format!(
        "/debug/pprof/profile?seconds={seconds}&frequency={frequency}"
    ));
    tokio::spawn(async move {
        let sent = SystemTime::now();
        let response = client().get(url).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let body = response.bytes().await.unwrap();
        (decode(&body), sent, SystemTime::now())
    })
}

/// Waits until `condition` holds, at most `limit`.
async fn until(limit: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if condition() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    condition()
}

/// Whether the sampler's timers appear in `/proc/self/timers` (within 10 s), waited for on
/// the blocking pool: the window that arms them is a task of this test's runtime, which a
/// wait on its own thread would keep from ever sending its request.
async fn timers_armed() -> bool {
    tokio::task::spawn_blocking(|| krabka_pprof_tests::wait_for_timers(std::process::id()))
        .await
        .unwrap()
}

/// This thread's kernel id.
fn gettid() -> u32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::syscall(libc::SYS_gettid) as u32 }
}

/// Whether `/proc/self/timers` lists a timer that signals thread `tid`.
fn has_timer(tid: u32) -> bool {
    std::fs::read_to_string("/proc/self/timers")
        .unwrap_or_default()
        .lines()
        .any(|line| line.trim() == format!("notify: signal/tid.{tid}"))
}

/// Whether a library named `name` is mapped in this process now.
fn is_mapped(name: &str) -> bool {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap_or_default()
        .lines()
        .any(|line| line.ends_with(name) || line.contains(&format!("/{name}")))
}

/// A thread's CPU between two moments of the client's clock, from its own clock's
/// readings (taken every few milliseconds by the thread itself).
#[derive(Default)]
struct Timeline(std::sync::Mutex<Vec<(SystemTime, Duration)>>);

impl Timeline {
    fn note(&self) {
        self.0
            .lock()
            .unwrap()
            .push((SystemTime::now(), thread_cpu_time()));
    }

    fn cpu_within(&self, start: SystemTime, end: SystemTime) -> Duration {
        let points = self.0.lock().unwrap();
        cpu_at(&points, end).saturating_sub(cpu_at(&points, start))
    }

    /// The least CPU the thread used in any `span` of the client's clock between `start`
    /// and `end`: wherever a window of that length lay inside them, the thread used at
    /// least this in it. (The CPU over a span, read as `cpu_within` reads it, changes
    /// only where a reading enters or leaves the span, so those starts are the ones to
    /// try.)
    fn least_in_any(&self, span: Duration, start: SystemTime, end: SystemTime) -> Duration {
        let Some(last_start) = end.checked_sub(span).filter(|last| *last >= start) else {
            return Duration::ZERO;
        };
        let points = self.0.lock().unwrap();
        let at = |moment: SystemTime| cpu_at(&points, moment);
        points
            .iter()
            .flat_map(|(time, _)| [Some(*time), time.checked_sub(span)])
            .flatten()
            .chain([start, last_start])
            .filter(|from| (start..=last_start).contains(from))
            .map(|from| at(from + span).saturating_sub(at(from)))
            .min()
            .unwrap_or(Duration::ZERO)
    }
}

/// The thread's CPU at its last reading at or before `moment` (none: zero). The
/// readings are in time order: the thread takes them one after another.
fn cpu_at(points: &[(SystemTime, Duration)], moment: SystemTime) -> Duration {
    match points.partition_point(|(time, _)| *time <= moment) {
        0 => Duration::ZERO,
        after => points[after - 1].1,
    }
}

#[tokio::test]
#[cfg_attr(
    target_env = "musl",
    ignore = "a static musl binary cannot dlopen: no library is loaded or unloaded"
)]
async fn a_library_loaded_during_a_session_is_unwound_and_its_dlclose_unloads_it() {
    let _serial = serial().await;
    if krabka_pprof_tests::pprof_rs_sampler() {
        return;
    }
    let server = TestServer::start(app);
    // A session held open by a long window, as a scraper holds it.
    let held = window(&server, 8, 250);
    assert!(timers_armed().await, "the session armed its timers");
    assert!(
        !is_mapped("libz.so.1"),
        "this test needs libz unloaded at first"
    );
    // SAFETY: loads libz (zlib1g, on every Debian), which the session has never seen.
    let handle = unsafe { libc::dlopen(c"libz.so.1".as_ptr(), libc::RTLD_NOW) };
    assert!(!handle.is_null(), "libz.so.1 loads");
    // SAFETY: a symbol of the library just loaded, of zlib's documented signature.
    let crc32: hot::Crc32 = unsafe {
        let symbol = libc::dlsym(handle, c"crc32".as_ptr());
        assert!(!symbol.is_null(), "libz exports crc32");
        std::mem::transmute::<*mut libc::c_void, hot::Crc32>(symbol)
    };
    let stop = Arc::new(AtomicBool::new(false));
    let burner = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let limit = Instant::now() + Duration::from_secs(20);
            while !stop.load(Ordering::Relaxed) && Instant::now() < limit {
                std::hint::black_box(hot::krabka_calls_into_zlib(crc32));
            }
        })
    };
    // The window opens with a drain, which follows the library loaded since the last.
    let (profile, sent, received) = window(&server, 2, 250).await.unwrap();
    assert_window_inside(&profile, sent, received, "the window after the dlopen");
    stop.store(true, Ordering::Relaxed);
    burner.join().unwrap();
    let zlib: Vec<(Vec<String>, Vec<i64>)> = stacks(&profile)
        .into_iter()
        .filter(|(frames, _)| frames.first().is_some_and(|f| f.contains("crc32")))
        .collect();
    let samples: i64 = zlib.iter().map(|(_, v)| v[0]).sum();
    let under_caller: i64 = zlib
        .iter()
        .filter(|(frames, _)| frames.iter().any(|f| f.contains("krabka_calls_into_zlib")))
        .map(|(_, v)| v[0])
        .sum();
    // 500 on a quiet machine, a tenth of that where the burner gets a tenth of a core:
    // a few dozen make the share below a measure.
    assert!(samples > 20, "{samples} samples in libz's crc32");
    assert!(
        under_caller as f64 >= samples as f64 * 0.9,
        "{under_caller} of {samples} libz samples under their Rust caller: {:?}",
        zlib.first()
    );
    // The session still runs; the app unloads its library, which the sampler must not
    // hold.
    // SAFETY: closing the handle opened above, once, after its last caller stopped.
    unsafe { libc::dlclose(handle) };
    assert!(
        !is_mapped("libz.so.1"),
        "the app's dlclose unloaded libz while the session ran"
    );
    let (held, sent, received) = held.await.unwrap();
    assert_window_inside(&held, sent, received, "the held window");
    assert!(total(&held, 0) > 0);
    // The held window was open when libz came: its profile says the unwinder followed.
    assert!(
        says(&held, "the unwinder followed them"),
        "{:?}",
        comments(&held)
    );
}

#[tokio::test]
async fn every_thread_has_a_timer_after_twelve_thousand_came_and_went() {
    let _serial = serial().await;
    if krabka_pprof_tests::pprof_rs_sampler() {
        return;
    }
    let server = TestServer::start(app);
    let held = window(&server, 20, 99);
    assert!(timers_armed().await, "the session armed its timers");
    // Waves of threads that each live through a drain or two, so that the sampler sees
    // every one of them (12,000 in all, 400 alive at a time), with forks and execs of
    // children meanwhile, as a service's blocking pool and its subprocesses would.
    let started = Instant::now();
    let mut seen = 0usize;
    let children = std::thread::spawn(|| {
        let limit = Instant::now() + Duration::from_secs(15);
        let mut ran = 0;
        while ran < 50 && Instant::now() < limit {
            let status = std::process::Command::new("true").status().unwrap();
            assert!(status.success());
            ran += 1;
        }
        ran
    });
    while seen < 12_000 && started.elapsed() < Duration::from_secs(20) {
        let wave: Vec<_> = (0..400)
            .map(|_| {
                std::thread::Builder::new()
                    .stack_size(64 * 1024)
                    .spawn(|| std::thread::sleep(Duration::from_millis(130)))
                    .unwrap()
            })
            .collect();
        seen += wave.len();
        for thread in wave {
            thread.join().unwrap();
        }
    }
    assert!(seen >= 12_000, "{seen} threads in {:?}", started.elapsed());
    assert!(children.join().unwrap() >= 10, "children forked and exec'd");
    // A thread started at the end gets its own timer, and is sampled for its CPU.
    let timeline = Arc::new(Timeline::default());
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    let stop = Arc::new(AtomicBool::new(false));
    let late = {
        let (stop, timeline) = (stop.clone(), timeline.clone());
        std::thread::Builder::new()
            .name("late-thread".into())
            .spawn(move || {
                tid_tx.send(gettid()).unwrap();
                let limit = Instant::now() + Duration::from_secs(20);
                while !stop.load(Ordering::Relaxed) && Instant::now() < limit {
                    std::hint::black_box(hot::krabka_hot_spin(20_000));
                    timeline.note();
                }
            })
            .unwrap()
    };
    let tid = tid_rx.recv().unwrap();
    // Within a drain or two (every 100 ms); 10 s for a machine busy with other work.
    assert!(
        until(Duration::from_secs(10), || has_timer(tid)).await,
        "the late thread got a timer of its own: {}",
        std::fs::read_to_string("/proc/self/timers")
            .unwrap_or_default()
            .lines()
            .count()
    );
    let (profile, sent, received) = window(&server, 2, 99).await.unwrap();
    stop.store(true, Ordering::Relaxed);
    late.join().unwrap();
    assert_window_inside(&profile, sent, received, "the late thread's window");
    // Everything the late thread did: its stacks run through this test's closure.
    let sampled: i64 = stacks(&profile)
        .into_iter()
        .filter(|(frames, _)| {
            frames
                .iter()
                .any(|f| f.contains("every_thread_has_a_timer_after"))
        })
        .map(|(_, v)| v[1])
        .sum();
    // The profile's window lies within the client's request: the thread's CPU over the
    // request is the most it can have, and the least it used in any 1.9 s of the request
    // (the 2 s window less a margin for its edges) the least. Where the server answers
    // late on a busy machine, the request is much longer than its window, and only the
    // latter bound holds (CPU over the request's middle did not, by 25 %).
    let used = timeline.cpu_within(sent, received).as_nanos() as f64;
    let within = timeline
        .least_in_any(Duration::from_millis(1_900), sent, received)
        .as_nanos() as f64;
    assert!(
        sampled as f64 <= used * 1.15 && sampled as f64 >= within * 0.85,
        "the late thread: {sampled} ns sampled, its clock says {within:.0}..{used:.0} ns"
    );
    drop(held);
}

#[tokio::test]
async fn a_thread_that_unblocks_sigprof_charges_no_window_with_cpu_from_before_it() {
    let _serial = serial().await;
    if krabka_pprof_tests::pprof_rs_sampler() {
        return;
    }
    let server = TestServer::start(app);
    let held = window(&server, 10, 99);
    let timeline = Arc::new(Timeline::default());
    let unblock = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let blocker = {
        let (unblock, stop, timeline) = (unblock.clone(), stop.clone(), timeline.clone());
        std::thread::spawn(move || {
            // SAFETY: an all-zero sigset_t is a valid (empty) set.
            let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
            // SAFETY: building a signal set and blocking it in this thread's own mask.
            unsafe {
                libc::sigemptyset(&mut set);
                libc::sigaddset(&mut set, libc::SIGPROF);
                libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            }
            let limit = Instant::now() + Duration::from_secs(20);
            let mut unblocked = false;
            while !stop.load(Ordering::Relaxed) && Instant::now() < limit {
                if !unblocked && unblock.load(Ordering::Relaxed) {
                    // SAFETY: unblocking what was blocked above.
                    unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut()) };
                    unblocked = true;
                }
                std::hint::black_box(hot::krabka_hot_spin(20_000));
                timeline.note();
            }
        })
    };
    // The thread burns with SIGPROF blocked until its own clock says 2 s; then a window
    // joins the held session, and once the index shows it open the thread unblocks: its
    // one pending signal stands for all that CPU, nearly all of it from before the window.
    assert!(
        until(Duration::from_secs(30), || {
            timeline.cpu_within(SystemTime::UNIX_EPOCH, SystemTime::now()) >= Duration::from_secs(2)
        })
        .await,
        "the blocking thread burned 2 s of CPU"
    );
    let joined = window(&server, 2, 99);
    server.wait_for_windows(2).await;
    unblock.store(true, Ordering::Relaxed);
    let (profile, sent, received) = joined.await.unwrap();
    assert_window_inside(&profile, sent, received, "the joined window");
    stop.store(true, Ordering::Relaxed);
    blocker.join().unwrap();
    let charged: i64 = stacks(&profile)
        .into_iter()
        .filter(|(frames, _)| {
            frames.iter().any(|f| {
                f.contains("charges_no_window_with_cpu_from_before") || f.contains("blocks SIGPROF")
            })
        })
        .map(|(_, v)| v[1])
        .sum();
    let used = timeline.cpu_within(sent, received).as_nanos() as f64;
    assert!(
        charged as f64 <= used * 1.15 + 30e6,
        "the window was charged {charged} ns for the thread; it used {used:.0} ns while the \
         window was open"
    );
    drop(held);
}
