//! The service under test (`bench server`): a trivial route, with or without the
//! attribute, on either runtime flavour, pinned to one core; optionally with a thread
//! spinning at a known depth (S; inside a label scope for the labels figure) or parked
//! threads (T). With the attribute, `/work` runs figure S's outside check: a fixed
//! workload on two threads at once, one of them blocking `SIGPROF`.

use axum::{Router, routing::get};
use krabka_pprof::pprof_routes;

#[pprof_routes(cpu_max = "60s", frequency = 99, frequency_max = 1000)]
fn with_profiling() -> Router {
    plain().route("/work", get(work))
}

/// How deep figure S's workload spins, counted from its thread's entry, as the spinning
/// thread of `--spin-depth 30` does.
const WORK_DEPTH: u32 = 30;

/// `GET /work?calls=N`: the same fixed workload (`N` calls of a 30-frame-deep spin) on
/// two threads started together, `work` and `work-blocked`, which blocks `SIGPROF`
/// first, so a profile running meanwhile samples only the first; both on the service's
/// one core, so that whatever else the machine does slows both alike. Answers
/// `work_ns=A blocked_ns=B`, each thread's own CPU clock over its workload: it counts the
/// kernel's signal delivery and return as well as the handler, which the handler's own
/// clock does not.
async fn work(uri: axum::http::Uri) -> String {
    let calls: u32 = uri
        .query()
        .and_then(|q| q.strip_prefix("calls="))
        .and_then(|n| n.parse().ok())
        .unwrap_or(100);
    tokio::task::spawn_blocking(move || {
        let run = |blocks: bool| {
            std::thread::Builder::new()
                .name(if blocks { "work-blocked" } else { "work" }.into())
                .spawn(move || {
                    if blocks {
                        // SAFETY: blocks one signal in this thread's own mask.
                        unsafe {
                            let mut set: libc::sigset_t = std::mem::zeroed();
                            libc::sigemptyset(&mut set);
                            libc::sigaddset(&mut set, libc::SIGPROF);
                            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
                        }
                    }
                    let started = thread_cpu_time();
                    for _ in 0..calls {
                        std::hint::black_box(recurse(WORK_DEPTH - FRAMES_ABOVE, 1 << 22));
                    }
                    thread_cpu_time() - started
                })
                .expect("spawn a work thread")
        };
        let (work, blocked) = (run(false), run(true));
        let (work, blocked) = (work.join().unwrap(), blocked.join().unwrap());
        format!(
            "work_ns={} blocked_ns={}\n",
            work.as_nanos(),
            blocked.as_nanos()
        )
    })
    .await
    .expect("the work threads")
}

fn thread_cpu_time() -> std::time::Duration {
    // SAFETY: clock_gettime writes into the zeroed timespec we pass.
    let time = unsafe {
        let mut time: libc::timespec = std::mem::zeroed();
        libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut time);
        time
    };
    std::time::Duration::new(time.tv_sec as u64, time.tv_nsec as u32)
}

/// The same, with the recorder on (figure R).
#[pprof_routes(cpu_max = "60s", frequency = 99, recent = "10m")]
fn with_recorder() -> Router {
    plain()
}

fn plain() -> Router {
    Router::new().route("/hello", get(|| async { "hello\n" }))
}

/// The same, pushing (figure P): destinations from the environment the benchmark gives.
#[pprof_routes(cpu_max = "60s", frequency = 99, recent = "10m", push = true)]
fn with_pusher() -> Router {
    plain()
}

/// What the service mounts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mounted {
    /// The trivial route alone.
    Plain,
    /// With the attribute.
    Attribute,
    /// With the attribute and `recent = "10m"`.
    Recorder,
    /// With the attribute, `recent = "10m"` and `push = true`.
    Pusher,
}

/// What `krabka-pprof-bench server` serves, from its flags.
pub struct Serve {
    /// The routes: the attribute's, plain axum, or the attribute's with the recorder.
    pub mounted: Mounted,
    /// A current-thread runtime (`--current-thread`).
    pub current_thread: bool,
    /// The CPU to pin the service to (`--cpu N`).
    pub cpu: Option<usize>,
    /// A thread spinning this many frames deep (`--spin-depth N`).
    pub spin_depth: Option<u32>,
    /// That thread spins inside `labels::scope` (`--spin-in-scope`).
    pub spin_in_scope: bool,
    /// That thread's frames each hold 256 bytes of locals (`--spin-fat`), as an async
    /// request's poll chain through axum, tower and hyper does: the handler's cost on a
    /// deep stack.
    pub spin_fat: bool,
    /// Threads that spin (on the service's one core, sharing it: `--busy N`).
    pub busy: usize,
    /// Threads asleep at different depths (`--parked N`).
    pub parked: usize,
    /// A thread that starts and ends threads without pause (`--churn`).
    pub churn: bool,
    /// A thread sampling a new stack nearly every time among this many (`--varied N`).
    pub varied: Option<u64>,
    /// The multi-threaded runtime's workers (`--workers N`, default 1).
    pub workers: usize,
    /// Blocking-pool threads left idle from the start, kept an hour (`--pool-idle N`).
    pub pool_idle: usize,
    /// One task per worker that blocks its worker inside its poll, in a labelled future:
    /// 20 ms asleep, then it yields, for ever (`--blocked-polls`).
    pub blocked_polls: bool,
}

/// Serves until killed; prints `addr=...` once listening. With `spin_depth`, a thread also
/// spins that many frames deep (counted from the thread's entry), for the handler's cost
/// per sample at a known stack depth, inside `labels::scope` if `spin_in_scope` (the
/// handler's cost with a label set active). With `churn`, the process lives the way a service
/// does for hours (figure LS): threads come and go, a library is loaded and unloaded,
/// children are forked and exec'd. With `varied`, a thread cycles through that many
/// distinct stacks (figure R).
pub fn serve(settings: Serve) {
    let Serve {
        mounted,
        current_thread,
        cpu,
        spin_depth,
        spin_in_scope,
        spin_fat,
        busy,
        parked,
        churn,
        varied,
        workers,
        pool_idle,
        blocked_polls,
    } = settings;
    if let Some(cpu) = cpu {
        crate::system::pin_to_cpu(cpu);
    }
    if churn {
        std::thread::Builder::new()
            .name("churn".into())
            .spawn(churn_forever)
            .expect("spawn the churning thread");
    }
    // Threads asleep at different depths (4 to 23 frames of `recurse` above the sleep),
    // for figure T's thread dumps.
    for i in 0..parked {
        std::thread::Builder::new()
            .name(format!("parked-{i}"))
            .spawn(move || park_deep(4 + (i % 20) as u32))
            .expect("spawn a parked thread");
    }
    if let Some(depth) = spin_depth {
        std::thread::Builder::new()
            .name("spin".into())
            .spawn(move || {
                // `scope` puts frames of its own under the closure: the recursion is that
                // much shallower, so both services' stacks are `depth` frames.
                let above = FRAMES_ABOVE + if spin_in_scope { SCOPE_FRAMES } else { 0 };
                let spin = || loop {
                    let depth = depth.saturating_sub(above);
                    if spin_fat {
                        std::hint::black_box(recurse_fat(depth, 1 << 22));
                    } else {
                        std::hint::black_box(recurse(depth, 1 << 22));
                    }
                };
                if spin_in_scope {
                    krabka_pprof::labels::scope(&[("tenant", "bench")], spin)
                } else {
                    spin()
                }
            })
            .expect("spawn the spinning thread");
    }
    for i in 0..busy {
        std::thread::Builder::new()
            .name(format!("busy-{i}"))
            .spawn(|| {
                loop {
                    std::hint::black_box(recurse(20, 1 << 16));
                }
            })
            .expect("spawn a busy thread");
    }
    if let Some(stacks) = varied {
        std::thread::Builder::new()
            .name("varied".into())
            .spawn(move || {
                let mut pattern = 0u64;
                loop {
                    pattern = (pattern + 1) % stacks;
                    std::hint::black_box(varied_stack(pattern, 11));
                }
            })
            .expect("spawn the varied thread");
    }
    let mut builder = if current_thread {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(workers.max(1));
        b
    };
    if pool_idle > 0 {
        builder
            .max_blocking_threads(pool_idle + 16)
            .thread_keep_alive(std::time::Duration::from_secs(3600));
    }
    let runtime = builder.enable_all().build().expect("a runtime");
    if pool_idle > 0 {
        // As many blocking tasks at once as threads wanted: each gets a thread of its own,
        // which then waits for work for the rest of the hour.
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(pool_idle));
        let tasks: Vec<_> = (0..pool_idle)
            .map(|_| {
                let barrier = barrier.clone();
                runtime.spawn_blocking(move || {
                    barrier.wait();
                })
            })
            .collect();
        runtime.block_on(async {
            for task in tasks {
                task.await.expect("a pool task");
            }
        });
    }
    if blocked_polls {
        use krabka_pprof::labels::LabelsExt as _;
        for _ in 0..workers.max(1) {
            runtime.spawn(
                async {
                    loop {
                        blocked_poll();
                        tokio::task::yield_now().await;
                    }
                }
                .with_labels(&[("route", "blocked")]),
            );
        }
    }
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        println!("addr={}", listener.local_addr().unwrap());
        let app = match mounted {
            Mounted::Plain => plain(),
            Mounted::Attribute => with_profiling(),
            Mounted::Recorder => with_recorder(),
            Mounted::Pusher => with_pusher(),
        };
        axum::serve(listener, app).await.unwrap();
    });
}

/// Frames other than `recurse`'s on the spinning thread's stack: clone3, start_thread, five
/// of std's thread start, the closure, and the spinning leaf (the profile's mean depth
/// confirms the total).
const FRAMES_ABOVE: u32 = 9;

/// Frames `labels::scope` adds between the spinning thread's closure and the recursion
/// (scope, the closure it calls, the loop's closure; the profile's mean depth confirms).
const SCOPE_FRAMES: u32 = 3;

/// Blocks the worker that polls it: 20 ms asleep inside the poll.
#[inline(never)]
fn blocked_poll() {
    std::thread::sleep(std::time::Duration::from_millis(20));
    std::hint::black_box(());
}

#[inline(never)]
fn recurse(depth: u32, rounds: u64) -> u64 {
    if depth == 0 {
        return spin(rounds);
    }
    std::hint::black_box(recurse(std::hint::black_box(depth - 1), rounds)) + u64::from(depth)
}

/// [`recurse`] with 256 bytes of locals in each frame, kept by `black_box`: the stack is
/// read `depth` × about 300 bytes deep (45 KB for 150 frames), not `depth` × 32.
#[inline(never)]
fn recurse_fat(depth: u32, rounds: u64) -> u64 {
    if depth == 0 {
        return spin(rounds);
    }
    let locals = std::hint::black_box([depth as u8; 256]);
    std::hint::black_box(recurse_fat(std::hint::black_box(depth - 1), rounds))
        + u64::from(locals[usize::from(locals[0])])
}

/// Recurses `depth` frames deep through one of two call sites per frame, chosen by the
/// bits of `pattern`, then spins: each pattern below 2^depth is a stack of its own.
#[inline(never)]
fn varied_stack(pattern: u64, depth: u32) -> u64 {
    if depth == 0 {
        return spin(20_000);
    }
    if pattern & 1 == 0 {
        std::hint::black_box(varied_stack(std::hint::black_box(pattern >> 1), depth - 1)) + 1
    } else {
        std::hint::black_box(varied_stack(std::hint::black_box(pattern >> 1), depth - 1)) + 2
    }
}

/// Sleeps forever `depth` frames deep.
#[inline(never)]
fn park_deep(depth: u32) {
    if depth == 0 {
        loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
    }
    park_deep(std::hint::black_box(depth - 1));
    std::hint::black_box(());
}

#[inline(never)]
fn spin(rounds: u64) -> u64 {
    let mut x = std::hint::black_box(1u64);
    for i in 0..rounds {
        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(i);
    }
    x
}

/// 100 threads a second that each burn 1.5 ms and exit; every second a
/// library loaded, called and unloaded; every 5 seconds a child forked and exec'd.
fn churn_forever() {
    let mut tick = 0u64;
    loop {
        let started = std::time::Instant::now();
        let threads: Vec<_> = (0..10)
            .map(|_| {
                std::thread::Builder::new()
                    .name("short".into())
                    .stack_size(128 * 1024)
                    .spawn(burn_a_while)
                    .expect("spawn a short-lived thread")
            })
            .collect();
        for thread in threads {
            let _ = thread.join();
        }
        if tick.is_multiple_of(10) {
            load_and_unload_zlib();
        }
        if tick.is_multiple_of(50) {
            let _ = std::process::Command::new("true").status();
        }
        tick += 1;
        std::thread::sleep(std::time::Duration::from_millis(100).saturating_sub(started.elapsed()));
    }
}

/// What a short-lived thread of figure LS burns: 1.5 ms of its own CPU clock, whatever the
/// machine's speed (so the churn is 15 % of a core, CPU a sampler can lose or find).
fn burn_a_while() {
    let until = thread_cpu_time() + std::time::Duration::from_micros(1_500);
    while thread_cpu_time() < until {
        std::hint::black_box(spin(10_000));
    }
}

/// `dlopen`s zlib (on every Debian), calls its `crc32` a little, and `dlclose`s it.
fn load_and_unload_zlib() {
    // SAFETY: libz is loaded, its crc32 (of zlib's documented signature) called on our
    // buffer, and unloaded.
    unsafe {
        let handle = libc::dlopen(c"libz.so.1".as_ptr(), libc::RTLD_NOW);
        if handle.is_null() {
            return;
        }
        let crc32 = libc::dlsym(handle, c"crc32".as_ptr());
        if !crc32.is_null() {
            let crc32: extern "C" fn(u64, *const u8, u32) -> u64 = std::mem::transmute(crc32);
            let data = [7u8; 4096];
            for _ in 0..50 {
                std::hint::black_box(crc32(0, data.as_ptr(), data.len() as u32));
            }
        }
        libc::dlclose(handle);
    }
}
