//! `/wall`: where the threads doing work spent their time, on a CPU and off it. Judged by
//! the service's own clocks: each part of a request timed by the thread that ran it (its
//! CPU clock around the burn; around each blocking call, the wall clock less its CPU and
//! its wait for a CPU by the kernel's count), read every 2 ms so that only what fell
//! inside the profile's window counts.

use std::collections::HashMap;
use std::io::{Read as _, Write as _};
use std::os::fd::FromRawFd as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use axum::Router;
use axum::routing::get;
use krabka_pprof::labels::LabelsExt as _;
use krabka_pprof::pprof_routes;
use krabka_pprof_tests::{
    Profile, Readings, TestServer, assert_window_inside, client, column, decode,
    krabka_sampler_only, serial, stacks, string,
};
use reqwest::StatusCode;

#[pprof_routes(cpu_max = "30s")]
fn app() -> Router {
    Router::new().route(
        "/blocky",
        get(|| async { blocky().with_labels(&[("route", "blocky")]).await }),
    )
}

/// The parts of one request, in the order it does them.
#[derive(Clone, Copy)]
enum Part {
    Burn,
    Sleep,
    Pipe,
    Mutex,
}

/// Nanoseconds each part took, over every request ended so far.
static ENDED: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];

/// The part each worker is in now, by thread id: its clocks when it began.
static IN_PROGRESS: Mutex<Option<HashMap<u32, (Part, Clocks)>>> = Mutex::new(None);

/// A thread's clocks: the wall clock, its CPU clock, and the kernel's count of its time
/// waiting for a CPU (`schedstat`).
#[derive(Clone, Copy)]
struct Clocks {
    wall: Instant,
    cpu: Duration,
    waited: Duration,
}

impl Clocks {
    fn of(tid: u32) -> Clocks {
        let waited = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat"))
            .ok()
            .and_then(|line| line.split_whitespace().nth(1)?.parse().ok())
            .map(Duration::from_nanos)
            .unwrap_or_default();
        Clocks {
            wall: Instant::now(),
            cpu: cpu_of(tid),
            waited,
        }
    }

    /// The time since `self` a part took: CPU time for the burn; for a blocking call, the
    /// time its thread was off the CPU and not waiting for one (what a wall profile calls
    /// sleeping; the wait for a CPU after the call woke is its `runnable` time).
    fn since(self, part: Part, tid: u32) -> Duration {
        let now = Clocks::of(tid);
        let cpu = now.cpu.saturating_sub(self.cpu);
        match part {
            Part::Burn => cpu,
            _ => now
                .wall
                .duration_since(self.wall)
                .saturating_sub(cpu)
                .saturating_sub(now.waited.saturating_sub(self.waited)),
        }
    }
}

fn tid() -> u32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() as u32 }
}

fn cpu_of(tid: u32) -> Duration {
    let clock = (!(tid as libc::clockid_t) << 3) | 4 | 2;
    let mut time = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into `time`; a gone thread's clock is an error.
    if unsafe { libc::clock_gettime(clock, &mut time) } != 0 {
        return Duration::ZERO;
    }
    Duration::new(time.tv_sec as u64, time.tv_nsec as u32)
}

/// Times `f` as `part` of the calling worker's request.
fn timed<R>(part: Part, f: impl FnOnce() -> R) -> R {
    let me = tid();
    let since = Clocks::of(me);
    IN_PROGRESS
        .lock()
        .unwrap()
        .get_or_insert_with(HashMap::new)
        .insert(me, (part, since));
    let out = f();
    let took = since.since(part, me);
    let mut in_progress = IN_PROGRESS.lock().unwrap();
    ENDED[part as usize].fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
    in_progress.as_mut().unwrap().remove(&me);
    out
}

/// Each part's time so far, the parts in progress included.
fn parts_so_far() -> [u64; 4] {
    let in_progress = IN_PROGRESS.lock().unwrap();
    let mut sums: [u64; 4] = std::array::from_fn(|i| ENDED[i].load(Ordering::Relaxed));
    for (&tid, &(part, since)) in in_progress.iter().flatten() {
        sums[part as usize] += since.since(part, tid).as_nanos() as u64;
    }
    sums
}

/// One request: 45 ms of CPU, then three calls that block the worker inside its poll (a
/// 40 ms sleep, a read of a pipe written 40 ms later, a `std::sync::Mutex` held by
/// another thread for 40 ms), then an awaited timer, which does not block it, and a sleep
/// on the blocking pool, which does not either.
async fn blocky() -> &'static str {
    timed(Part::Burn, || wall_burn(Duration::from_millis(45)));
    timed(Part::Sleep, || wall_sleep(Duration::from_millis(40)));
    let mut fds = [0; 2];
    // SAFETY: pipe writes two descriptors into `fds`.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: both are new and owned here from now on.
    let (mut reader, mut writer) = unsafe {
        (
            std::fs::File::from_raw_fd(fds[0]),
            std::fs::File::from_raw_fd(fds[1]),
        )
    };
    let writing = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(40));
        writer.write_all(b"x").unwrap();
    });
    timed(Part::Pipe, || wall_pipe_read(&mut reader));
    writing.join().unwrap();
    let lock = Arc::new(Mutex::new(()));
    let (held_tx, held_rx) = std::sync::mpsc::channel();
    let holding = {
        let lock = lock.clone();
        std::thread::spawn(move || {
            let _held = lock.lock().unwrap();
            held_tx.send(()).unwrap();
            std::thread::sleep(Duration::from_millis(40));
        })
    };
    held_rx.recv().unwrap();
    timed(Part::Mutex, || wall_mutex_wait(&lock));
    holding.join().unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    // Blocking where it may: on tokio's blocking pool, not the worker.
    tokio::task::spawn_blocking(|| wall_pool_sleep(Duration::from_millis(10)))
        .await
        .unwrap();
    "ok"
}

#[inline(never)]
fn wall_pool_sleep(time: Duration) {
    std::thread::sleep(time);
    std::hint::black_box(());
}

#[inline(never)]
fn wall_burn(cpu: Duration) {
    let me = tid();
    let until = cpu_of(me) + cpu;
    while cpu_of(me) < until {
        std::hint::black_box((0..2_000u64).sum::<u64>());
    }
}

#[inline(never)]
fn wall_sleep(time: Duration) {
    std::thread::sleep(time);
    std::hint::black_box(());
}

#[inline(never)]
fn wall_pipe_read(reader: &mut std::fs::File) {
    let mut byte = [0u8; 1];
    reader.read_exact(&mut byte).unwrap();
    std::hint::black_box(byte);
}

#[inline(never)]
fn wall_mutex_wait(lock: &Mutex<()>) {
    let held = lock.lock().unwrap();
    std::hint::black_box(&held);
}

/// Each sample's labels, by key.
fn labels(profile: &Profile, sample: usize) -> HashMap<String, String> {
    profile.sample[sample]
        .label
        .iter()
        .map(|label| {
            (
                string(profile, label.key).to_owned(),
                string(profile, label.str).to_owned(),
            )
        })
        .collect()
}

/// `wall/nanoseconds` of samples whose stack has `function` and whose labels `keep`.
fn wall_in(
    profile: &Profile,
    function: &str,
    keep: impl Fn(&HashMap<String, String>) -> bool,
) -> i64 {
    let wall = column(profile, "wall");
    stacks(profile)
        .iter()
        .enumerate()
        .filter(|(i, (stack, _))| {
            stack.iter().any(|f| f.contains(function)) && keep(&labels(profile, *i))
        })
        .map(|(_, (_, values))| values[wall])
        .sum()
}

/// `wall/nanoseconds` asleep under `route=blocky` in one of `syscalls`.
fn by_syscall_under_route(profile: &Profile, syscalls: &[&str]) -> i64 {
    let wall = column(profile, "wall");
    (0..profile.sample.len())
        .filter(|&i| {
            let labels = labels(profile, i);
            labels.get("thread_state").map(String::as_str) == Some("sleeping")
                && labels.get("route").map(String::as_str) == Some("blocky")
                && labels
                    .get("syscall")
                    .is_some_and(|syscall| syscalls.contains(&syscall.as_str()))
        })
        .map(|i| profile.sample[i].value[wall])
        .sum()
}

/// Threads asleep in `poll`, `epoll_wait` and `nanosleep` for 500 ms at a time, counting
/// the waits cut short with `EINTR`: what a signal sent to read a sleeping thread (as a
/// thread dump's `SIGURG`) would do. They block `SIGPROF`, the CPU half's signal: without
/// that, in this test's process (hundreds of helper threads coming and going), they saw 1
/// or 2 `EINTR`s in a 7 s window, from the CPU sampler that `/profile` runs too; a simpler
/// process (three such sleepers, two burners, 500 threads a second coming and going, 8 s
/// of `/profile` or `/wall`) saw none in four runs, and the cause is not found yet
/// (docs/limits.md says so). What this test holds is the sweep's own promise.
struct Sleepers {
    stop: Arc<AtomicBool>,
    interrupted: Arc<AtomicU64>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

/// One kind of wait: made once, then waited on until it times out.
type Wait = fn() -> Box<dyn FnMut() -> i32 + Send>;

impl Sleepers {
    fn start() -> Sleepers {
        let stop = Arc::new(AtomicBool::new(false));
        let interrupted = Arc::new(AtomicU64::new(0));
        let waits: [Wait; 3] = [
            || {
                let mut fds = [0; 2];
                // SAFETY: pipe writes two descriptors, kept open for the thread's life.
                assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
                Box::new(move || {
                    let mut pollfd = libc::pollfd {
                        fd: fds[0],
                        events: libc::POLLIN,
                        revents: 0,
                    };
                    // SAFETY: poll reads and writes the one pollfd.
                    unsafe { libc::poll(&mut pollfd, 1, 500) }
                })
            },
            || {
                // SAFETY: an epoll instance of no descriptors, kept for the thread's life.
                let epoll = unsafe { libc::epoll_create1(0) };
                assert!(epoll >= 0);
                Box::new(move || {
                    let mut event = libc::epoll_event { events: 0, u64: 0 };
                    // SAFETY: epoll_wait writes at most one event into `event`.
                    unsafe { libc::epoll_wait(epoll, &mut event, 1, 500) }
                })
            },
            || {
                Box::new(|| {
                    let wait = libc::timespec {
                        tv_sec: 0,
                        tv_nsec: 500_000_000,
                    };
                    // SAFETY: nanosleep reads `wait`; the remainder is not asked for.
                    unsafe { libc::nanosleep(&wait, std::ptr::null_mut()) }
                })
            },
        ];
        let threads = waits
            .into_iter()
            .map(|make| {
                let (stop, interrupted) = (stop.clone(), interrupted.clone());
                std::thread::spawn(move || {
                    // SAFETY: a signal set of SIGPROF, blocked on this thread only.
                    unsafe {
                        let mut set: libc::sigset_t = std::mem::zeroed();
                        libc::sigemptyset(&mut set);
                        libc::sigaddset(&mut set, libc::SIGPROF);
                        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
                    }
                    let mut wait = make();
                    while !stop.load(Ordering::Relaxed) {
                        if wait() == -1
                            && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR)
                        {
                            interrupted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        Sleepers {
            stop,
            interrupted,
            threads,
        }
    }

    fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads {
            thread.join().unwrap();
        }
        self.interrupted.load(Ordering::Relaxed)
    }
}

#[tokio::test]
async fn blocking_calls_and_cpu_land_under_their_functions_labels_system_calls_and_the_blocking_view()
 {
    let _serial = serial().await;
    if krabka_sampler_only(
        "blocking_calls_and_cpu_land_under_their_functions_labels_system_calls_and_the_blocking_view",
        "has no wall-clock profiles (they answer 503)",
    ) {
        return;
    }
    let server = TestServer::start(app);
    let readings = Readings::start("wall-parts", parts_so_far);
    let sleepers = Sleepers::start();
    // Two requests at a time, each about 150 ms, for as long as the window and a margin.
    let stop = Arc::new(AtomicBool::new(false));
    let load: Vec<_> = (0..2)
        .map(|_| {
            let (url, stop) = (server.url("/blocky"), stop.clone());
            tokio::spawn(async move {
                let http = client();
                let until = Instant::now() + Duration::from_secs(30);
                while !stop.load(Ordering::Relaxed) && Instant::now() < until {
                    assert_eq!(
                        http.get(&url).send().await.unwrap().status(),
                        StatusCode::OK
                    );
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The wall profile and its blocking view side by side, sharing the CPU sampler.
    let sent = SystemTime::now();
    let take = |route: &'static str| {
        let url = server.url(&format!("/debug/pprof/{route}?seconds=14"));
        tokio::spawn(async move {
            let response = client().get(url).send().await.unwrap();
            assert_eq!(response.status(), StatusCode::OK, "{route}");
            decode(&response.bytes().await.unwrap())
        })
    };
    let (wall, blocking) = (take("wall"), take("blocking"));
    let (profile, blocking) = (wall.await.unwrap(), blocking.await.unwrap());
    let received = SystemTime::now();
    stop.store(true, Ordering::Relaxed);
    for load in load {
        load.await.unwrap();
    }
    let interrupted = sleepers.stop();
    let (start, end) = assert_window_inside(&profile, sent, received, "the wall profile");
    let (before, after) = readings.around(start, end);
    let truth: Vec<i64> = (0..4).map(|i| (after[i] - before[i]) as i64).collect();

    // The blocking view: nothing but the request's blocking calls, each under its
    // handler (where static musl's C library lets the stack be read that far) and its
    // route's label; as long as they took.
    let (start, end) = assert_window_inside(&blocking, sent, received, "the blocking view");
    let (before, after) = readings.around(start, end);
    let blocked: i64 = (1..4).map(|i| (after[i] - before[i]) as i64).sum();
    let wall_column = column(&blocking, "wall");
    for (i, (stack, values)) in stacks(&blocking).iter().enumerate() {
        let labels = labels(&blocking, i);
        assert_eq!(
            (
                labels.get("thread_state").map(String::as_str),
                labels.get("route").map(String::as_str)
            ),
            (Some("sleeping"), Some("blocky")),
            "a sample of the blocking view ({} ms): {stack:?}",
            values[wall_column] / 1_000_000
        );
        assert!(
            cfg!(target_env = "musl") || stack.iter().any(|f| f.contains("wall::blocky")),
            "a sample of the blocking view has no handler's frame: {stack:?}"
        );
        assert!(
            !stack.iter().any(|f| f.contains("wall_pool_sleep")),
            "the blocking view holds a sleep on the blocking pool: {stack:?}"
        );
    }
    // ... which the wall profile shows (where the stack can be read past the C library:
    // on static musl, an unlabelled sleep whose stack stops in musl shows nothing of the
    // program, and the default profile leaves it out with the idle waits).
    assert!(
        cfg!(target_env = "musl")
            || wall_in(&profile, "wall_pool_sleep", |labels| {
                labels.get("thread_state").map(String::as_str) == Some("sleeping")
            }) > 0,
        "the wall profile shows no sleep on the blocking pool"
    );
    let shown: i64 = blocking.sample.iter().map(|s| s.value[wall_column]).sum();
    let error = (shown - blocked) as f64 / blocked as f64;
    eprintln!(
        "blocking view: {} ms, {} ms by the service's clocks ({:+.1} %)",
        shown / 1_000_000,
        blocked / 1_000_000,
        error * 100.0
    );
    assert!(
        error.abs() <= 0.10,
        "the blocking view holds {} ms, the blocking calls took {} ms ({:+.1} %)",
        shown / 1_000_000,
        blocked / 1_000_000,
        error * 100.0
    );

    let types: Vec<(&str, &str)> = profile
        .sample_type
        .iter()
        .map(|t| (string(&profile, t.ty), string(&profile, t.unit)))
        .collect();
    assert_eq!(types, [("samples", "count"), ("wall", "nanoseconds")]);
    let period_type = profile.period_type.as_ref().unwrap();
    assert_eq!(
        (
            string(&profile, period_type.ty),
            string(&profile, period_type.unit)
        ),
        ("wall", "nanoseconds")
    );
    assert_eq!(interrupted, 0, "a sleeper's wait was cut short by a signal");

    let state_is = |state: &'static str| {
        move |labels: &HashMap<String, String>| {
            labels.get("thread_state").map(String::as_str) == Some(state)
                && labels.get("route").map(String::as_str) == Some("blocky")
        }
    };
    let syscall_of = |function: &str| -> HashMap<String, i64> {
        let wall = column(&profile, "wall");
        let mut by_syscall = HashMap::new();
        for (i, (stack, values)) in stacks(&profile).iter().enumerate() {
            if stack.iter().any(|f| f.contains(function)) {
                let labels = labels(&profile, i);
                if labels.get("thread_state").map(String::as_str) == Some("sleeping") {
                    let syscall = labels.get("syscall").cloned().unwrap_or_default();
                    *by_syscall.entry(syscall).or_default() += values[wall];
                }
            }
        }
        by_syscall
    };
    let parts = [
        ("wall_burn", Part::Burn, "running", &["" as &str][..]),
        (
            "wall_sleep",
            Part::Sleep,
            "sleeping",
            &["clock_nanosleep", "nanosleep"][..],
        ),
        ("wall_pipe_read", Part::Pipe, "sleeping", &["read"][..]),
        ("wall_mutex_wait", Part::Mutex, "sleeping", &["futex"][..]),
    ];
    for (function, part, state, syscalls) in parts {
        let expected = truth[part as usize];
        assert!(
            expected >= 2_000_000_000,
            "{function}: only {} ms of it in the window; the workload is too slow to judge",
            expected / 1_000_000
        );
        // Static musl's C functions have no unwind tables: a stack read asleep stops in
        // them, and the time is told by its labels and system call alone.
        let shown = if cfg!(target_env = "musl") && state == "sleeping" {
            by_syscall_under_route(&profile, syscalls)
        } else {
            wall_in(&profile, function, state_is(state))
        };
        let error = (shown - expected) as f64 / expected as f64;
        eprintln!(
            "{function}: {} ms {state} in the profile, {} ms by the service's clocks ({:+.1} %)",
            shown / 1_000_000,
            expected / 1_000_000,
            error * 100.0
        );
        assert!(
            error.abs() <= 0.10,
            "{function}: {} ms {state} under route=blocky in the profile, {} ms by the \
             service's own clocks ({:+.1} %)",
            shown / 1_000_000,
            expected / 1_000_000,
            error * 100.0
        );
        if state == "sleeping" {
            let by_syscall = syscall_of(function);
            let named: i64 = by_syscall
                .iter()
                .filter(|(syscall, _)| syscalls.contains(&syscall.as_str()))
                .map(|(_, wall)| wall)
                .sum();
            let all: i64 = by_syscall.values().sum();
            assert!(
                named as f64 >= 0.9 * all as f64,
                "{function}: asleep in {by_syscall:?}, expected {syscalls:?}"
            );
        }
    }
}

#[tokio::test]
async fn idle_runtime_threads_are_left_out_unless_every_thread_is_asked_for() {
    let _serial = serial().await;
    if krabka_sampler_only(
        "idle_runtime_threads_are_left_out_unless_every_thread_is_asked_for",
        "has no wall-clock profiles (they answer 503)",
    ) {
        return;
    }
    // Nothing runs: the server's workers wait for work in tokio's park.
    let server = TestServer::start(app);
    let sleeping = |profile: &Profile, park_only: bool| {
        let wall = column(profile, "wall");
        stacks(profile)
            .iter()
            .enumerate()
            .filter(|(i, (stack, _))| {
                labels(profile, *i).get("thread_state").map(String::as_str) == Some("sleeping")
                    && (!park_only
                        || stack
                            .iter()
                            .any(|f| f.contains("tokio::runtime::scheduler::multi_thread::park")))
            })
            .map(|(_, (_, values))| values[wall])
            .sum::<i64>()
    };
    let wall = |query: &'static str| {
        let url = server.url(&format!("/debug/pprof/wall?seconds=1{query}"));
        async move {
            decode(
                &client()
                    .get(url)
                    .send()
                    .await
                    .unwrap()
                    .bytes()
                    .await
                    .unwrap(),
            )
        }
    };
    let working = wall("").await;
    let every = wall("&threads=all&thread_ids=true").await;
    assert_eq!(
        sleeping(&working, true),
        0,
        "the default profile shows idle workers"
    );
    // Two workers parked for most of a second, and the server's own thread (where
    // static musl's C library stops the stack, they show as that, not as tokio's park).
    let idle = sleeping(&every, false) - sleeping(&working, false);
    assert!(
        idle >= 1_000_000_000,
        "threads=all shows {} ms asleep more than the default, not two idle workers' second",
        idle / 1_000_000
    );
    // Each thread's time adds up to the window: a quiet thread, looked at seldom, has its
    // time up to the window's end charged by a last look, and none beyond it.
    let window = every.duration_nanos;
    let wall_column = column(&every, "wall");
    let mut by_thread: HashMap<(String, String), i64> = HashMap::new();
    for (i, sample) in every.sample.iter().enumerate() {
        let labels = labels(&every, i);
        let key = (
            labels.get("thread").cloned().unwrap_or_default(),
            labels.get("thread_id").cloned().unwrap_or_default(),
        );
        *by_thread.entry(key).or_default() += sample.value[wall_column];
    }
    let workers: Vec<_> = by_thread
        .iter()
        .filter(|((name, _), _)| name.starts_with("tokio-r"))
        .collect();
    assert!(
        workers.len() >= 2,
        "the server's two workers: {by_thread:?}"
    );
    for ((name, id), total) in &by_thread {
        assert!(
            *total <= window + window / 10,
            "thread {name} ({id}) has {} ms in a {} ms window",
            total / 1_000_000,
            window / 1_000_000
        );
    }
    for ((name, id), total) in workers {
        assert!(
            *total >= window - window / 10,
            "worker {name} ({id}), there all along, has {} ms of a {} ms window",
            total / 1_000_000,
            window / 1_000_000
        );
    }
    let bad = client()
        .get(server.url("/debug/pprof/wall?threads=some"))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
    let text = bad.text().await.unwrap();
    assert!(text.starts_with("`threads` must be working"), "{text}");
}

/// The looks' counts, from the profile's comment: looks, stacks read asleep, places
/// counted again unread.
fn look_counts(profile: &Profile) -> (u64, u64, u64) {
    let counts = look_numbers(
        profile,
        &[
            " looks over",
            " stacks read asleep",
            " places counted again",
        ],
    );
    (counts[0], counts[1], counts[2])
}

/// The numbers before each of `texts` in the profile's comment on its looks.
fn look_numbers(profile: &Profile, texts: &[&str]) -> Vec<u64> {
    let comment = krabka_pprof_tests::comments(profile)
        .into_iter()
        .find(|c| c.contains(" looks over "))
        .unwrap_or_else(|| {
            panic!(
                "no looks comment: {:?}",
                krabka_pprof_tests::comments(profile)
            )
        })
        .to_owned();
    let number_before = |text: &str| -> u64 {
        let at = comment
            .find(text)
            .unwrap_or_else(|| panic!("{text:?} in {comment:?}"));
        comment[..at]
            .rsplit(|c: char| !c.is_ascii_digit())
            .find(|n| !n.is_empty())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("a number before {text:?} in {comment:?}"))
    };
    texts.iter().map(|text| number_before(text)).collect()
}

/// 2,000 threads parked all along cost a wall window one stack read each and then a clock
/// read every few ticks, thinning out: not a read a tick. A second window right after
/// reads none of them again: where the first left them asleep, their clocks unchanged.
/// (What that costs in CPU is the benchmark's figure W; here, the kernel's count of the
/// threads that ran says how many reads the sweep may take beyond the first look at each.)
#[tokio::test]
async fn parked_threads_are_read_once_and_then_looked_at_seldom() {
    let _serial = serial().await;
    if krabka_sampler_only(
        "parked_threads_are_read_once_and_then_looked_at_seldom",
        "has no wall-clock profiles (they answer 503)",
    ) {
        return;
    }
    const PARKED: usize = 2_000;
    let release = Arc::new(AtomicBool::new(false));
    let (parked_tx, parked_rx) = std::sync::mpsc::channel::<()>();
    let parked: Vec<_> = (0..PARKED)
        .map(|_| {
            let release = release.clone();
            let parked_tx = parked_tx.clone();
            std::thread::Builder::new()
                .stack_size(64 * 1024)
                .spawn(move || {
                    parked_tx.send(()).unwrap();
                    while !release.load(Ordering::Acquire) {
                        std::thread::park();
                    }
                })
                .unwrap()
        })
        .collect();
    for _ in 0..PARKED {
        parked_rx.recv().unwrap();
    }
    let server = TestServer::start(app);
    // Every thread's voluntary switches before and after: the threads that ran meanwhile
    // (the parked ones, if a spurious wake-up came, and the server's and the test's own).
    let switches = || -> HashMap<u32, u64> {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|entry| {
                let tid: u32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
                let status =
                    std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).ok()?;
                let switches = status
                    .lines()
                    .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))?
                    .trim()
                    .parse()
                    .ok()?;
                Some((tid, switches))
            })
            .collect()
    };
    let wall = |seconds: u64| {
        let request =
            client().get(server.url(&format!("/debug/pprof/wall?seconds={seconds}&threads=all")));
        async move { request.send().await.unwrap().bytes().await.unwrap() }
    };
    let before = switches();
    let body = wall(2).await;
    let after = switches();
    let second = wall(1).await;
    let after_second = switches();
    release.store(true, Ordering::Release);
    for thread in &parked {
        thread.thread().unpark();
    }
    for thread in parked {
        thread.join().unwrap();
    }
    let profile = decode(&body);
    let (looks, read, again) = look_counts(&profile);
    let threads = before.len() as u64;
    // Threads that ran during the window, each of which may be read at every tick.
    let ran = after
        .iter()
        .filter(|(tid, n)| before.get(tid).is_none_or(|was| was != *n))
        .count() as u64;
    let ticks = 2 * 99 + 2;
    assert!(
        read <= threads + ran * ticks,
        "{read} stacks read of {threads} threads, {ran} of which ran"
    );
    assert!(
        again >= PARKED as u64,
        "each parked thread counted again unread: {again}"
    );
    // Looked at every tick, 2,000 threads would take 400,000 looks in 2 s; thinned out
    // (1, 2, 4 ... ticks apart), about a tenth of a look a tick each.
    assert!(
        looks <= threads * 20 + ran * ticks,
        "{looks} looks of {threads} threads ({ran} ran) in 2 s"
    );

    // The second window: a parked thread that did not run since the first ended is
    // taken as the first left it, not read again; still shown, under its function.
    let second = decode(&second);
    let counts = look_numbers(&second, &[" stacks read asleep", " first looks taken"]);
    let (read_again, remembered) = (counts[0], counts[1]);
    let ran_since = after_second
        .iter()
        .filter(|(tid, n)| after.get(tid).is_none_or(|was| was != *n))
        .count() as u64;
    assert!(
        remembered >= PARKED as u64 - ran_since,
        "{remembered} first looks remembered of {PARKED} parked threads, {ran_since} threads ran"
    );
    assert!(
        read_again <= (threads - PARKED as u64) + ran_since * (99 + 2),
        "{read_again} stacks read again ({ran_since} threads ran between the windows)"
    );
    // Each thread a sample of its own (its id a label): every parked one is there.
    assert!(
        second.sample.len() >= PARKED,
        "{} samples in the second profile, {PARKED} threads parked",
        second.sample.len()
    );
}
