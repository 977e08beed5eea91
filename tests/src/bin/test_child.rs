//! A separate process for tests that need a fresh environment at startup, or that change
//! what a process can do: it reports jemalloc's configuration (`test_child config`), or
//! serves on 127.0.0.1 until its stdin closes an app with heap profiling (`serve`; `GET
//! /keep` allocates and keeps 16 MiB more), one
//! whose routes need the bearer token in `KRABKA_PPROF_TEST_TOKEN` (`serve-token`; with a
//! guard admitting `X-Internal: yes` too, `serve-token-guard`), or a
//! CPU-profiling app with a busy thread, logging to stderr (`serve-cpu`; with
//! `KRABKA_TEST_SECCOMP=eperm|kill` it first installs a seccomp filter against
//! `process_vm_readv`, with `KRABKA_TEST_FOREIGN_HANDLER=1` another `SIGPROF` handler, and
//! `GET /replace-handler` installs one during a profile). `exec-during-profile` calls
//! `exec` while its own profile runs; `fork-profile` forks while its own profile runs and
//! has the child profile itself; `spin` burns CPU and says it survived. With
//! `KRABKA_TEST_THREAD_SECCOMP=1`, `serve-cpu`'s busy thread installs a seccomp filter of
//! its own that kills the process for `process_vm_readv` or `pread64`. `sigq-sessions`
//! (as a user of its own, so that `SigQ` is its own) takes eight 1 s profiles of itself
//! beside a thread that blocks every signal, and prints `SigQ` after each. `serve-recent`
//! serves an app with the recorder on (`recent = "10m"`), built before any runtime exists,
//! and burns in `krabka_early_phase` for the process's first 8 s, then in
//! `krabka_late_phase` (`GET /switch` says when, in UNIX nanoseconds); `serve-recent-short`
//! keeps 10 s of history; `serve-recent-small` keeps at most 256 KiB of it at 1000 Hz,
//! while a thread samples a new stack nearly every time.

use std::io::Read as _;
use std::os::unix::process::CommandExt as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::{Router, routing::get};
use krabka_pprof::pprof_routes;

#[cfg(feature = "heap-profiling")]
#[global_allocator]
static ALLOC: krabka_pprof::Jemalloc = krabka_pprof::Jemalloc;

// With the tests crate's `heap-profiling` feature off (the HTTP tests' second run), the
// apps are those of a build without it: no `heap = true`, the system allocator.
#[cfg_attr(
    feature = "heap-profiling",
    pprof_routes(heap = true, heap_default = "2s", heap_max = "5s")
)]
#[cfg_attr(not(feature = "heap-profiling"), pprof_routes)]
fn app() -> Router {
    Router::new().route("/", get(|| async { "child" })).route(
        "/keep",
        get(|| async { format!("{} MiB kept", keep_16_mib_in_child()) }),
    )
}

/// Memory the heap tests find in a profile, or not, depending on when it was allocated.
static KEPT: std::sync::Mutex<Vec<Vec<u8>>> = std::sync::Mutex::new(Vec::new());

/// Allocates 16 MiB in 1 MiB blocks and keeps them for the life of the process: 32 of
/// jemalloc's 512 KiB sampling periods, so sampled for certain while sampling is active.
#[inline(never)]
fn keep_16_mib_in_child() -> usize {
    let mut kept = KEPT.lock().unwrap();
    for _ in 0..16 {
        kept.push(std::hint::black_box(vec![7u8; 1 << 20]));
    }
    kept.len()
}

#[cfg_attr(
    feature = "heap-profiling",
    pprof_routes(token_env = "KRABKA_PPROF_TEST_TOKEN", cpu_max = "10s", heap = true)
)]
#[cfg_attr(
    not(feature = "heap-profiling"),
    pprof_routes(token_env = "KRABKA_PPROF_TEST_TOKEN", cpu_max = "10s")
)]
fn token_app() -> Router {
    Router::new().route("/", get(|| async { "child" }))
}

#[cfg_attr(
    feature = "heap-profiling",
    pprof_routes(
        token_env = "KRABKA_PPROF_TEST_TOKEN",
        guard = krabka_pprof_tests::internal_only,
        heap = true,
        cpu_max = "10s"
    )
)]
#[cfg_attr(
    not(feature = "heap-profiling"),
    pprof_routes(
        token_env = "KRABKA_PPROF_TEST_TOKEN",
        guard = krabka_pprof_tests::internal_only,
        cpu_max = "10s"
    )
)]
fn token_guard_app() -> Router {
    Router::new().route("/", get(|| async { "child" }))
}

#[pprof_routes(cpu_max = "10s")]
fn cpu_app() -> Router {
    Router::new().route(
        "/replace-handler",
        get(|| async {
            // Once the profile has had 300 ms of CPU to sample (30 samples at 99 Hz).
            let start = krabka_pprof_tests::process_cpu_time();
            let limit = Instant::now() + Duration::from_secs(5);
            while krabka_pprof_tests::process_cpu_time() - start < Duration::from_millis(300)
                && Instant::now() < limit
            {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            install_foreign_handler();
            "replaced"
        }),
    )
}

#[pprof_routes(recent = "10m", cpu_max = "10s")]
fn recent_app() -> Router {
    Router::new().route(
        "/switch",
        get(|| async { PHASE_SWITCH_UNIX_NS.load(Ordering::Relaxed).to_string() }),
    )
}

#[pprof_routes(recent = "10s")]
fn recent_short_app() -> Router {
    Router::new()
}

#[pprof_routes(recent = "10m", recent_memory = "256KiB", frequency = 1000)]
fn recent_small_app() -> Router {
    Router::new()
}

/// When the phase burner switched (or will switch) to its second phase.
static PHASE_SWITCH_UNIX_NS: AtomicU64 = AtomicU64::new(0);

/// The first 8 s of the process in `krabka_early_phase`, then a minute in
/// `krabka_late_phase`, on a thread of its own.
fn start_phases(started: Instant) {
    let switch = started + Duration::from_secs(8);
    let switch_unix = std::time::SystemTime::now() + (switch - Instant::now());
    let unix_ns = switch_unix
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    PHASE_SWITCH_UNIX_NS.store(unix_ns as u64, Ordering::Relaxed);
    std::thread::Builder::new()
        .name("phases".into())
        .spawn(move || {
            use krabka_pprof_tests::hot::{krabka_early_phase, krabka_late_phase};
            while Instant::now() < switch {
                std::hint::black_box(krabka_early_phase(20_000));
            }
            while Instant::now() < switch + Duration::from_secs(60) {
                std::hint::black_box(krabka_late_phase(20_000));
            }
        })
        .expect("spawn the phases");
}

/// A thread that samples a new stack nearly every time, for a minute.
fn start_varied_stacks() {
    std::thread::Builder::new()
        .name("varied".into())
        .spawn(|| {
            let until = Instant::now() + Duration::from_secs(60);
            let mut pattern = 0u64;
            while Instant::now() < until {
                pattern = pattern.wrapping_add(0x9e37_79b9);
                std::hint::black_box(krabka_pprof_tests::hot::krabka_varied_stack(pattern, 16));
            }
        })
        .expect("spawn the varied stacks");
}

/// Signals the foreign handler saw.
static FOREIGN_SEEN: AtomicU64 = AtomicU64::new(0);

extern "C" fn foreign_handler(_: libc::c_int) {
    FOREIGN_SEEN.fetch_add(1, Ordering::Relaxed);
}

/// Installs a `SIGPROF` handler of "another profiler", with `SA_RESTART` as profilers
/// install theirs (Go's runtime, the `pprof` crate): the sampler's timers still signal for
/// up to a drain period after the replacement, and without it those signals would fail
/// this process's socket calls with `EINTR`, a fault of the other handler, not the
/// sampler's.
fn install_foreign_handler() {
    // SAFETY: a fully initialised sigaction whose handler only touches an atomic.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = foreign_handler as *const () as usize;
        action.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut action.sa_mask);
        assert_eq!(
            libc::sigaction(libc::SIGPROF, &action, std::ptr::null_mut()),
            0
        );
    }
}

/// A seccomp filter that answers `process_vm_readv` with `action` and allows the rest,
/// as hardened services and sandboxes do. Installed before any thread starts, so every
/// thread has it.
fn install_seccomp(action: u32) {
    install_seccomp_against(&[libc::SYS_process_vm_readv], action);
}

/// A seccomp filter on the calling thread (and the threads it starts later) that answers
/// each of `calls` with `action` and allows the rest.
fn install_seccomp_against(calls: &[libc::c_long], action: u32) {
    #[cfg(target_arch = "x86_64")]
    const AUDIT_ARCH: u32 = 0xC000_003E;
    #[cfg(target_arch = "aarch64")]
    const AUDIT_ARCH: u32 = 0xC000_00B7;
    let statement = |code: u32, k: u32| libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    };
    let jump = |k: u32, jt: u8, jf: u8| libc::sock_filter {
        code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
        jt,
        jf,
        k,
    };
    let load = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
    let ret = libc::BPF_RET | libc::BPF_K;
    let mut filter = vec![
        statement(load, 4), // seccomp_data.arch
        jump(AUDIT_ARCH, 1, 0),
        statement(ret, libc::SECCOMP_RET_ALLOW),
        statement(load, 0), // seccomp_data.nr
    ];
    for &call in calls {
        filter.push(jump(call as u32, 0, 1));
        filter.push(statement(ret, action));
    }
    filter.push(statement(ret, libc::SECCOMP_RET_ALLOW));
    let program = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_mut_ptr(),
    };
    // SAFETY: no_new_privs, then a filter program that lives through the call.
    unsafe {
        assert_eq!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
        assert_eq!(
            libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &raw const program,
            ),
            0,
            "installing the seccomp filter"
        );
    }
}

/// A thread that burns CPU in `krabka_hot_spin` for at most a minute.
fn start_burner() {
    start_burner_with(|| {});
}

/// [`start_burner`], the thread first running `prepare`; returns once it has.
fn start_burner_with(prepare: fn()) {
    let (ready, prepared) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("child-burner".into())
        .spawn(move || {
            prepare();
            ready.send(()).unwrap();
            let until = Instant::now() + Duration::from_secs(60);
            while Instant::now() < until {
                std::hint::black_box(krabka_pprof_tests::hot::krabka_hot_spin(20_000));
            }
        })
        .expect("spawn the burner");
    prepared.recv().expect("the burner is ready");
}

/// A filter of the burner thread's own (no `TSYNC`: the process's other threads have
/// none), as a sandboxed parser thread installs one: it kills the whole process for
/// `process_vm_readv` or `pread64`, the two calls a sampler reads stacks with.
fn sandbox_this_thread() {
    install_seccomp_against(
        &[libc::SYS_process_vm_readv, libc::SYS_pread64],
        libc::SECCOMP_RET_KILL_PROCESS,
    );
}

/// This process's `SigQ:` (signals queued for its user, of the user's limit).
fn sigq() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|line| line.strip_prefix("SigQ:"))
        .and_then(|value| value.trim().split('/').next()?.parse().ok())
        .expect("SigQ in /proc/self/status")
}

/// Becomes a user of its own, so that `SigQ` (per user, across processes) counts this
/// process alone; stays dumpable, as it was. False where this process may not (not root).
fn become_a_user_of_its_own() -> bool {
    let uid = 40_000 + std::process::id() % 20_000;
    // SAFETY: changing this process's own credentials, then its dumpable flag back.
    unsafe {
        libc::setresgid(uid, uid, uid) == 0
            && libc::setresuid(uid, uid, uid) == 0
            && libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) == 0
    }
}

/// Whether this process has armed a POSIX timer (the sampler's), waiting at most 10 s.
fn wait_for_own_timers() -> bool {
    krabka_pprof_tests::wait_for_timers(std::process::id())
}

/// Writes a line to stdout without std's lock (a forked child may not take it).
fn say(line: &str) {
    let line = format!("{line}\n");
    // SAFETY: writing our own buffer to fd 1.
    unsafe { libc::write(1, line.as_ptr().cast(), line.len()) };
}

/// Serves `cpu_app` on a fresh runtime and listener, and takes a profile of itself.
fn profile_self(seconds: u64) -> (u16, usize) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, cpu_app()).await });
        let response = krabka_pprof_tests::client()
            .get(format!(
                "http://{addr}/debug/pprof/profile?seconds={seconds}"
            ))
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let body = response.bytes().await.unwrap();
        let samples = if status == 200 {
            krabka_pprof_tests::decode(&body).sample.len()
        } else {
            0
        };
        (status, samples)
    })
}

fn serve(router: Router) {
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        println!("addr={}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, router).await });
        // Exit when the test drops its end of stdin (or after a bound).
        let stdin_closed = tokio::task::spawn_blocking(|| {
            let _ = std::io::stdin().read(&mut [0u8; 1]);
        });
        let _ = tokio::time::timeout(Duration::from_secs(120), stdin_closed).await;
    });
}

fn main() {
    krabka_pprof_tests::choose_sampler();
    match std::env::args().nth(1).as_deref() {
        #[cfg(feature = "heap-profiling")]
        Some("config") => {
            // One allocation so that jemalloc has initialised and read its configuration.
            std::hint::black_box(vec![1u8; 4096]);
            // SAFETY: documented jemalloc controls of these types.
            let (prof, active, lg_sample) = unsafe {
                (
                    tikv_jemalloc_ctl::raw::read::<bool>(b"opt.prof\0"),
                    tikv_jemalloc_ctl::raw::read::<bool>(b"prof.active\0"),
                    tikv_jemalloc_ctl::raw::read::<usize>(b"prof.lg_sample\0"),
                )
            };
            println!(
                "opt.prof={} prof.active={} prof.lg_sample={}",
                prof.map_or("error".into(), |v| v.to_string()),
                active.map_or("error".into(), |v| v.to_string()),
                lg_sample.map_or("error".into(), |v| v.to_string()),
            );
        }
        Some("serve") => serve(app()),
        Some("serve-recent") => {
            let started = Instant::now();
            // Built before any runtime exists: the recorder runs on a thread of its own.
            let router = recent_app();
            start_phases(started);
            serve(router);
        }
        Some("serve-recent-short") => {
            let router = recent_short_app();
            start_burner();
            serve(router);
        }
        Some("serve-recent-small") => {
            let router = recent_small_app();
            start_varied_stacks();
            serve(router);
        }
        Some("serve-token") => serve(token_app()),
        Some("serve-token-guard") => serve(token_guard_app()),
        Some("serve-cpu") => {
            if std::env::var_os("KRABKA_TEST_THREAD_SECCOMP").is_some() {
                // A thread of its own with a filter of its own, before any profile.
                start_burner_with(sandbox_this_thread);
                tracing_subscriber::fmt()
                    .with_max_level(tracing::Level::INFO)
                    .with_ansi(false)
                    .with_writer(std::io::stderr)
                    .init();
                serve(cpu_app());
                return;
            }
            match std::env::var("KRABKA_TEST_SECCOMP").as_deref() {
                Ok("eperm") => install_seccomp(libc::SECCOMP_RET_ERRNO | libc::EPERM as u32),
                Ok("kill") => install_seccomp(libc::SECCOMP_RET_KILL_PROCESS),
                _ => {}
            }
            if std::env::var_os("KRABKA_TEST_FOREIGN_HANDLER").is_some() {
                install_foreign_handler();
            }
            tracing_subscriber::fmt()
                .with_max_level(tracing::Level::INFO)
                .with_ansi(false)
                .with_writer(std::io::stderr)
                .init();
            start_burner();
            serve(cpu_app());
        }
        Some("sigq-sessions") => {
            if !become_a_user_of_its_own() {
                say("cannot: not root");
                return;
            }
            // A thread that blocks every signal for its whole life, as librdkafka's do,
            // and burns: each session's timer on it fires once, its signal stays queued.
            std::thread::spawn(|| {
                // SAFETY: an all-zero sigset_t, then filled and blocked in this thread.
                unsafe {
                    let mut all: libc::sigset_t = std::mem::zeroed();
                    libc::sigfillset(&mut all);
                    libc::pthread_sigmask(libc::SIG_BLOCK, &all, std::ptr::null_mut());
                }
                let until = Instant::now() + Duration::from_secs(60);
                while Instant::now() < until {
                    std::hint::black_box(krabka_pprof_tests::hot::krabka_hot_spin(20_000));
                }
            });
            let mut counts = Vec::new();
            for _ in 0..8 {
                let (status, _) = profile_self(1);
                assert_eq!(status, 200);
                counts.push(sigq());
            }
            say(&format!(
                "sigq {}",
                counts
                    .iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(" ")
            ));
        }
        Some("exec-during-profile") => {
            start_burner();
            let profiling = std::thread::spawn(|| profile_self(5));
            assert!(wait_for_own_timers(), "the profile started");
            // A hot upgrade: this process becomes another program while its profile runs.
            let error = std::process::Command::new(std::env::current_exe().unwrap())
                .arg("spin")
                .exec();
            drop(profiling);
            panic!("exec failed: {error}");
        }
        Some("spin") => {
            // SIGPROF has its default action here (exec resets handlers): a timer left
            // over from the program before would kill this one.
            let until = Instant::now() + Duration::from_millis(300);
            let start = krabka_pprof_tests::thread_cpu_time();
            while krabka_pprof_tests::thread_cpu_time() - start < Duration::from_millis(300)
                && Instant::now() < until + Duration::from_secs(5)
            {
                std::hint::black_box(krabka_pprof_tests::hot::krabka_hot_spin(20_000));
            }
            say("survived");
        }
        Some("fork-profile") => {
            start_burner();
            let profiling = std::thread::spawn(|| profile_self(3));
            assert!(wait_for_own_timers(), "the profile started");
            // SAFETY: fork; the child only builds a fresh runtime and threads of its own,
            // writes with write(2) and leaves with _exit.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                start_burner();
                let (status, samples) = profile_self(1);
                say(&format!("child status={status} samples={samples}"));
                // SAFETY: leaving the child without running the parent's destructors.
                unsafe { libc::_exit(0) };
            }
            assert!(pid > 0, "fork failed");
            let (status, samples) = profiling.join().unwrap();
            let mut child_status = 0;
            // SAFETY: waiting for our own child.
            unsafe { libc::waitpid(pid, &mut child_status, 0) };
            say(&format!(
                "parent status={status} samples={samples} child_exit={}",
                if libc::WIFEXITED(child_status) {
                    libc::WEXITSTATUS(child_status)
                } else {
                    -1
                }
            ));
        }
        _ => {
            eprintln!(
                "usage: test_child config|serve|serve-token|serve-token-guard|serve-cpu|exec-during-profile|\
                 fork-profile|spin|sigq-sessions|serve-recent|serve-recent-short|serve-recent-small"
            );
            std::process::exit(2);
        }
    }
}
