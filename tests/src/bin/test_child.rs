//! A separate process for tests that need a fresh environment at startup, or that change
//! what a process can do: it reports jemalloc's configuration (`test_child config`), or
//! serves on 127.0.0.1 until its stdin closes an app with heap profiling (`serve`; `GET
//! /keep` allocates and keeps 16 MiB more; `serve-sites` also keeps 64 MiB at one site and
//! allocates and frees 64 KiB about 500 times a second at another, `GET /churned` saying
//! how many bytes so far; `serve-no-counts` the same with `alloc_stacks = 0`;
//! `serve-sites-after-no-counts` as `serve-sites`, after building such a router first;
//! `serve-full-table` with `alloc_stacks = 64`, after allocating along 100 distinct
//! stacks; `serve-tikv` as `serve-sites` with `tikv_jemallocator::Jemalloc` as the global
//! allocator), one
//! whose routes need the bearer token in `KRABKA_PPROF_TEST_TOKEN` (`serve-token`; with a
//! guard admitting `X-Internal: yes` too, `serve-token-guard`), or a
//! CPU-profiling app with a busy thread, logging to stderr (`serve-cpu`; with
//! `KRABKA_TEST_SECCOMP=eperm|kill` it first installs a seccomp filter against
//! `process_vm_readv`, with `KRABKA_TEST_FOREIGN_HANDLER=1` another `SIGPROF` handler,
//! with `KRABKA_TEST_FOREIGN_URG_HANDLER=1` another `SIGURG` handler; `GET
//! /replace-handler` installs a `SIGPROF` one during a profile and `GET /foreign-seen`
//! says how many signals it has had; `GET /untimed-burner` lowers `RLIMIT_SIGPENDING` to 0
//! and starts a thread whose CPU timer cannot be created). `exec-during-profile` calls
//! `exec` while its own profile runs; `fork-profile` forks while its own profile runs and
//! has the child profile itself; `spin` burns CPU and says it survived. With
//! `KRABKA_TEST_LONGJMP=1`, `serve-cpu` also runs `child-jumper`, whose SIGALRM handler
//! leaves by `siglongjmp` (`GET /jumps` counts the times). With
//! `KRABKA_TEST_SWITCHED_STACKS=1`, `serve-cpu` also runs `child-switcher`, burning CPU on
//! `stacker` segments mapped and unmapped anew, of changing sizes. With
//! `KRABKA_TEST_THREAD_SECCOMP=1`, `serve-cpu`'s busy thread installs a seccomp filter of
//! its own that kills the process for `process_vm_readv` or `pread64`. `sigq-sessions`
//! (as a user of its own, so that `SigQ` is its own) takes eight 1 s profiles of itself
//! beside a thread that blocks every signal, and prints `SigQ` after each.
//!
//! For thread dumps: `serve-vforked` serves with two threads parked in `vfork` (their
//! children sleep), which cannot take a signal, one of them in code without unwind
//! tables; `serve-vforked-undumpable` the same as a process that is not dumpable (and
//! not root, where it can leave root), whose sleeping threads cannot be read from their
//! `syscall` files; `serve-filtered` with two threads that installed
//! a seccomp filter of their own, killing the process for `gettid`, `futex`, `pread64`
//! or `process_vm_readv` (one spins, one sleeps); `exec-during-dumps [N]` takes dumps of
//! itself in a loop while its main thread spins and then `exec`s `exec-during-dumps N-1`
//! (30 to begin with), until the last one says it survived.
//!
//! For the recorder: `serve-recent` serves an app with the recorder on (`recent = "10m"`),
//! built before any runtime exists, and burns in `krabka_early_phase` (labelled
//! `phase=early`) for the process's first 8 s, then in `krabka_late_phase` (`phase=late`;
//! `GET /switch` says when, in UNIX nanoseconds);
//! `serve-recent-short` keeps 10 s of history; `serve-recent-small` keeps at most 256 KiB
//! of it at 1000 Hz, while a thread samples a new stack nearly every time.

use std::io::Read as _;
use std::os::unix::process::CommandExt as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::{Router, routing::get};
use krabka_pprof::pprof_routes;

/// The global allocator: jemalloc through `krabka_pprof::Jemalloc`, as the docs say to
/// install it, once `main` has chosen it (every mode but `serve-tikv`); until then, and
/// for the whole life of `serve-tikv`, through `tikv_jemallocator::Jemalloc`, as a
/// service already on tikv-jemallocator has it. One jemalloc either way: a block either
/// allocated may be freed by the other.
#[cfg(feature = "heap-profiling")]
mod allocator {
    use std::alloc::{GlobalAlloc, Layout};
    use std::sync::atomic::{AtomicBool, Ordering};

    pub(crate) static KRABKAS: AtomicBool = AtomicBool::new(false);

    pub(crate) struct Chosen;

    /// The wrapper of jemalloc that serves allocations now.
    fn chosen() -> &'static dyn GlobalAlloc {
        if KRABKAS.load(Ordering::Relaxed) {
            &krabka_pprof::Jemalloc
        } else {
            &tikv_jemallocator::Jemalloc
        }
    }

    // SAFETY: each method forwards to one of two allocators of the same jemalloc, both of
    // which uphold the GlobalAlloc contract; a block either allocated may be freed or
    // grown by the other.
    unsafe impl GlobalAlloc for Chosen {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            // SAFETY: forwarded with the caller's guarantees.
            unsafe { chosen().alloc(layout) }
        }
        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            // SAFETY: forwarded with the caller's guarantees.
            unsafe { chosen().alloc_zeroed(layout) }
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            // SAFETY: forwarded with the caller's guarantees.
            unsafe { chosen().dealloc(ptr, layout) }
        }
        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            // SAFETY: forwarded with the caller's guarantees.
            unsafe { chosen().realloc(ptr, layout, new_size) }
        }
    }

    #[global_allocator]
    static ALLOC: Chosen = Chosen;
}

// With the tests crate's `heap-profiling` feature off (the HTTP tests' second run), the
// apps are those of a build without it: no `heap = true`, the system allocator.
#[cfg_attr(
    feature = "heap-profiling",
    pprof_routes(heap = true, heap_default = "2s", heap_max = "5s")
)]
#[cfg_attr(not(feature = "heap-profiling"), pprof_routes)]
fn app() -> Router {
    sites_routes()
}

/// The routes of the heap apps: `/`, `/keep` and `/churned`.
fn sites_routes() -> Router {
    Router::new()
        .route("/", get(|| async { "child" }))
        .route(
            "/keep",
            get(|| async { format!("{} MiB kept", keep_16_mib_in_child()) }),
        )
        .route(
            "/churned",
            get(|| async { CHURNED.load(Ordering::Relaxed).to_string() }),
        )
}

#[cfg(feature = "heap-profiling")]
#[pprof_routes(heap = true, heap_max = "5s", alloc_stacks = 0)]
fn no_counts_app() -> Router {
    sites_routes()
}

#[cfg(feature = "heap-profiling")]
#[pprof_routes(heap = true, alloc_stacks = 64)]
fn small_table_app() -> Router {
    sites_routes()
}

/// Bytes the churning site has allocated (and freed) so far: the test's own count.
static CHURNED: AtomicU64 = AtomicU64::new(0);
/// What the retaining site keeps.
#[cfg(feature = "heap-profiling")]
static RETAINED: std::sync::OnceLock<Vec<Vec<u8>>> = std::sync::OnceLock::new();

/// Keeps 64 MiB at one site, and starts a thread that allocates and frees 64 KiB at
/// another about 500 times a second (for at most two minutes), counting the bytes.
#[cfg(feature = "heap-profiling")]
fn start_sites() {
    RETAINED.get_or_init(krabka_pprof_heap_sites::retain_64_mib);
    std::thread::Builder::new()
        .name("churn".into())
        .spawn(|| {
            let until = Instant::now() + Duration::from_secs(120);
            while Instant::now() < until {
                let bytes = krabka_pprof_heap_sites::churn_64_kib();
                CHURNED.fetch_add(bytes as u64, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(2));
            }
        })
        .expect("spawn the churning thread");
}

/// Allocates and frees 4 MiB at the bottom of `depth` frames of itself: one distinct
/// stack per depth, each sampled for certain (4 MiB is eight of jemalloc's 512 KiB
/// periods). Not optimised (this binary is a dev build), so the recursion stays.
#[cfg(feature = "heap-profiling")]
#[inline(never)]
fn allocate_deep(depth: u32) -> usize {
    if depth == 0 {
        let mut block = Vec::<u8>::with_capacity(4 << 20);
        block.push(1);
        return std::hint::black_box(block).capacity();
    }
    std::hint::black_box(allocate_deep(depth - 1)) + depth as usize
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

/// `serve-switches`: the token's routes with the recorder, and two routes of the app's own
/// that turn the run-time switches, as a service's admin endpoint or a file watcher would.
#[pprof_routes(token_env = "KRABKA_PPROF_TEST_TOKEN", cpu_max = "5s", recent = "10m")]
fn switches_app() -> Router {
    use axum::extract::Path;
    Router::new()
        .route(
            "/switch/{on}",
            get(|Path(on): Path<bool>| async move {
                krabka_pprof::set_profiling_enabled(on);
                format!("profiling on: {}", krabka_pprof::profiling_enabled())
            }),
        )
        .route(
            "/rotate/{token}",
            get(|Path(token): Path<String>| async move {
                krabka_pprof::set_profiling_token(&token);
                "rotated"
            }),
        )
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

#[pprof_routes(cpu_max = "10s", frequency_max = 1000)]
fn cpu_app() -> Router {
    Router::new()
        .route(
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
        .route(
            "/foreign-seen",
            get(|| async { FOREIGN_SEEN.load(Ordering::Relaxed).to_string() }),
        )
        .route("/untimed-burner", get(|| async { start_untimed_burner() }))
        .route(
            "/jumps",
            get(|| async {
                // SAFETY: reads a counter the C half only increments.
                unsafe { krabka_longjmp_count() }.to_string()
            }),
        )
}

// The C half of `child-jumper` (csrc/longjmp_host.c, built by build.rs).
unsafe extern "C" {
    fn krabka_longjmp_install(every_ns: libc::c_long) -> libc::c_int;
    fn krabka_longjmp_spin(rounds: u64) -> u64;
    fn krabka_longjmp_count() -> u64;
}

/// Starts `child-jumper`: for 60 s it spins under a SIGALRM every 20 µs whose handler (the C timeout idiom) leaves by `siglongjmp`; returns once the timer is
/// set.
fn start_jumper() {
    let (ready, installed) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("child-jumper".into())
        .spawn(move || {
            // SAFETY: installs a handler and a timer of this thread's own; the spin
            // leaves and re-enters by the C library's sigsetjmp and siglongjmp, in C.
            unsafe {
                assert_eq!(krabka_longjmp_install(20_000), 0, "the alarm's timer");
                ready.send(()).unwrap();
                let until = Instant::now() + Duration::from_secs(60);
                while Instant::now() < until {
                    std::hint::black_box(krabka_longjmp_spin(100));
                }
            }
        })
        .expect("spawn child-jumper");
    installed.recv().expect("child-jumper set its alarm");
}

/// Lowers this process's `RLIMIT_SIGPENDING` to 0, under which the kernel refuses to
/// create a POSIX timer (each holds a queued signal against that limit; `EAGAIN`), as a
/// host's limits may; proves it with a timer of its own; then starts a thread named
/// `untimed-burner` that burns CPU for 20 s, whose CPU timer the sampler cannot create.
/// Answers `untimed` once the thread runs, or `timers not limited` where this kernel
/// creates timers whatever the limit (no thread started then).
fn start_untimed_burner() -> &'static str {
    // SAFETY: plain system calls on values of our own; the probe timer, if created, is
    // deleted at once.
    unsafe {
        let mut limit: libc::rlimit = std::mem::zeroed();
        assert_eq!(libc::getrlimit(libc::RLIMIT_SIGPENDING, &mut limit), 0);
        limit.rlim_cur = 0;
        assert_eq!(libc::setrlimit(libc::RLIMIT_SIGPENDING, &limit), 0);
        let mut event: libc::sigevent = std::mem::zeroed();
        // As the sampler's: a signal on expiry (this one is never armed).
        event.sigev_notify = libc::SIGEV_SIGNAL;
        event.sigev_signo = libc::SIGPROF;
        let mut timer: libc::timer_t = std::ptr::null_mut();
        if libc::timer_create(libc::CLOCK_MONOTONIC, &mut event, &mut timer) == 0 {
            libc::timer_delete(timer);
            return "timers not limited";
        }
    }
    start_burner_named("untimed-burner", Duration::from_secs(20), || {});
    "untimed"
}

#[pprof_routes(recent = "10m", cpu_max = "10s")]
fn recent_app() -> Router {
    Router::new().route(
        "/switch",
        get(|| async { PHASE_SWITCH_UNIX_NS.load(Ordering::Relaxed).to_string() }),
    )
}

/// The pusher: one-second windows, so that a test sees several in seconds.
#[cfg(feature = "push")]
#[pprof_routes(recent = "10m", push = true, push_interval = "1s")]
fn push_app() -> Router {
    Router::new()
}

/// The pusher with heap profiles: each window also carries the heap.
#[cfg(all(feature = "push", feature = "heap-profiling"))]
#[pprof_routes(heap = true, recent = "10m", push = true, push_interval = "1s")]
fn push_heap_app() -> Router {
    sites_routes()
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
            use krabka_pprof::labels::scope;
            use krabka_pprof_tests::hot::{krabka_early_phase, krabka_late_phase};
            scope(&[("phase", "early")], || {
                while Instant::now() < switch {
                    std::hint::black_box(krabka_early_phase(20_000));
                }
            });
            scope(&[("phase", "late")], || {
                while Instant::now() < switch + Duration::from_secs(60) {
                    std::hint::black_box(krabka_late_phase(20_000));
                }
            });
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
    install_foreign_handler_for(libc::SIGPROF);
}

/// Installs the counting handler of [`install_foreign_handler`] for `signal`.
fn install_foreign_handler_for(signal: libc::c_int) {
    // SAFETY: a fully initialised sigaction whose handler only touches an atomic.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = foreign_handler as *const () as usize;
        action.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut action.sa_mask);
        assert_eq!(libc::sigaction(signal, &action, std::ptr::null_mut()), 0);
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

/// A seccomp filter on the calling thread alone (no `TSYNC`, as seccompiler's
/// `apply_filter` installs one) that kills the process for any of `calls` and allows
/// the rest.
fn install_thread_filter(calls: &[libc::c_long]) {
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
    let load = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
    let ret = libc::BPF_RET | libc::BPF_K;
    let mut filter = vec![
        statement(load, 4), // seccomp_data.arch
        libc::sock_filter {
            code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
            jt: 1,
            jf: 0,
            k: AUDIT_ARCH,
        },
        statement(ret, libc::SECCOMP_RET_ALLOW),
        statement(load, 0), // seccomp_data.nr
    ];
    for (i, &call) in calls.iter().enumerate() {
        // Equal: jump to the kill at the end; else the next comparison.
        let to_kill = (calls.len() - i) as u8;
        filter.push(libc::sock_filter {
            code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
            jt: to_kill,
            jf: 0,
            k: call as u32,
        });
    }
    filter.push(statement(ret, libc::SECCOMP_RET_ALLOW));
    filter.push(statement(ret, libc::SECCOMP_RET_KILL_PROCESS));
    let program = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_mut_ptr(),
    };
    // SAFETY: no_new_privs, then a filter program that lives through the call; this
    // thread only.
    unsafe {
        assert_eq!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
        assert_eq!(
            libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER,
                0,
                &raw const program,
            ),
            0,
            "installing the thread's seccomp filter"
        );
    }
}

/// Threads with their own seccomp filter, after it is installed.
static FILTERED_READY: AtomicU64 = AtomicU64::new(0);

/// Spins, with no system call at all, for two minutes, then sleeps.
#[inline(never)]
fn krabka_filtered_spinning() {
    let until = Instant::now() + Duration::from_secs(120);
    while Instant::now() < until {
        std::hint::black_box(krabka_pprof_tests::hot::krabka_hot_spin(20_000));
    }
    krabka_filtered_sleeping();
}

/// Sleeps (nanosleep, no futex), for ever.
#[inline(never)]
fn krabka_filtered_sleeping() {
    loop {
        std::thread::sleep(std::hint::black_box(Duration::from_secs(3600)));
    }
}

/// Two threads that install a seccomp filter of their own killing the process for
/// `gettid`, `futex`, `pread64` and `process_vm_readv`, the calls a dump's handler made
/// (one spins, so it is asked with a signal; one sleeps, so it is read without one);
/// returns once both have it.
fn start_filtered_threads() {
    const FORBIDDEN: [libc::c_long; 4] = [
        libc::SYS_gettid,
        libc::SYS_futex,
        libc::SYS_pread64,
        libc::SYS_process_vm_readv,
    ];
    for (name, body) in [
        ("filtered-spin", krabka_filtered_spinning as fn()),
        ("filtered-sleep", krabka_filtered_sleeping as fn()),
    ] {
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                install_thread_filter(&FORBIDDEN);
                FILTERED_READY.fetch_add(1, Ordering::SeqCst);
                body();
            })
            .expect("spawn a filtered thread");
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while FILTERED_READY.load(Ordering::SeqCst) < 2 {
        assert!(
            Instant::now() < deadline,
            "the filtered threads never started"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The child of the `vfork`: it sleeps two minutes at most, and dies with the thread
/// that made it (a `vfork` child shares its parent's memory: raw system calls only).
extern "C" fn vforked_child(_: *mut libc::c_void) -> libc::c_int {
    let sleep = libc::timespec {
        tv_sec: 120,
        tv_nsec: 0,
    };
    // SAFETY: system calls on this child's own state; the timespec lives on its stack.
    unsafe {
        libc::syscall(libc::SYS_prctl, libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        libc::syscall(
            libc::SYS_nanosleep,
            &raw const sleep,
            std::ptr::null_mut::<()>(),
        );
    }
    0
}

/// A thread parked in `vfork` (`clone` with `CLONE_VM | CLONE_VFORK`, as `posix_spawn`
/// makes its children, but without blocking signals first) while its child sleeps: in
/// uninterruptible sleep, it takes no signal until the child exits.
#[inline(never)]
fn krabka_in_vfork() {
    // The child's own stack: it never runs on this thread's.
    let mut stack = vec![0u8; 64 * 1024];
    let top = (stack.as_mut_ptr() as usize + stack.len()) & !15;
    // SAFETY: the child runs `vforked_child` on `stack`, which outlives it (this thread
    // waits in `clone` until the child exits).
    let pid = unsafe {
        libc::clone(
            vforked_child,
            top as *mut libc::c_void,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            std::ptr::null_mut(),
        )
    };
    assert!(pid > 0, "clone: {}", std::io::Error::last_os_error());
    let mut status = 0;
    // SAFETY: reaping our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    drop(stack);
}

// `vfork` from code whose unwind rule needs a register that neither a sleeping thread's
// `syscall` file nor the unwinder has (its frame found from `r12`, as JIT code may keep
// its frame): the stack of a thread parked in it cannot be read from where it sleeps,
// and it takes no signal. (Code with no unwind table at all would be read: as far as its
// frame, its callers unknown, which is what a signal would answer too.) The child runs on
// this stack below the stack pointer, sleeps two minutes at most, dying with this thread
// (PR_SET_PDEATHSIG), with raw system calls only.
#[cfg(target_arch = "x86_64")]
std::arch::global_asm!(
    ".globl krabka_vfork_unwound_from_r12",
    "krabka_vfork_unwound_from_r12:",
    ".cfi_startproc",
    "push r12",
    ".cfi_def_cfa_offset 16",
    ".cfi_offset r12, -16",
    "mov r12, rsp",
    ".cfi_def_cfa r12, 16",
    "mov eax, 58", // vfork
    "syscall",
    "test eax, eax",
    "jnz 2f",
    "mov edi, 1", // prctl(PR_SET_PDEATHSIG, SIGKILL)
    "mov esi, 9",
    "mov eax, 157",
    "syscall",
    "sub rsp, 16", // nanosleep({120, 0}, NULL)
    "mov qword ptr [rsp], 120",
    "mov qword ptr [rsp + 8], 0",
    "mov rdi, rsp",
    "xor esi, esi",
    "mov eax, 35",
    "syscall",
    "xor edi, edi", // exit(0)
    "mov eax, 60",
    "syscall",
    "2:",
    "mov rsp, r12",
    ".cfi_def_cfa rsp, 16",
    "pop r12",
    ".cfi_def_cfa_offset 8",
    ".cfi_restore r12",
    "ret",
    ".cfi_endproc",
);

#[cfg(target_arch = "x86_64")]
unsafe extern "C" {
    /// Returns the child's pid once it exits.
    fn krabka_vfork_unwound_from_r12() -> libc::c_long;
}

/// Two threads parked in `vfork`: one through glibc's `clone` (`vfork-clone`), one
/// through code whose frame is found from a register the unwinder does not have
/// (`vfork-asm`; elsewhere than on x86_64, glibc's too).
fn start_vforked() {
    std::thread::Builder::new()
        .name("vfork-clone".into())
        .spawn(krabka_in_vfork)
        .expect("spawn a vforked thread");
    std::thread::Builder::new()
        .name("vfork-asm".into())
        .spawn(|| {
            #[cfg(target_arch = "x86_64")]
            {
                // SAFETY: the stub keeps r12 for its caller and leaves the stack as it
                // found it; its child makes raw system calls only, below this thread's
                // stack pointer.
                let pid = unsafe { krabka_vfork_unwound_from_r12() };
                let mut status = 0;
                // SAFETY: reaping our own child.
                unsafe { libc::waitpid(pid as libc::pid_t, &mut status, 0) };
            }
            #[cfg(not(target_arch = "x86_64"))]
            krabka_in_vfork();
        })
        .expect("spawn a vforked thread");
}

/// One process of `exec-during-dumps`: serves, takes dumps of itself in a loop, spins
/// its main thread a while (a running thread is asked with a signal), and `exec`s the
/// next, with long arguments (a longer `execve`, during which a dump's signal stays
/// pending into the new program); the last says it survived.
fn exec_during_dumps(left: u32) {
    if left == 0 {
        // SIGURG and SIGPROF have their default actions here (exec resets handlers): a
        // dump's signal left over from a program before would have killed this one if
        // its default were to terminate.
        say("survived");
        return;
    }
    say(&format!("hop {left}"));
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            addr_tx.send(listener.local_addr().unwrap()).unwrap();
            axum::serve(listener, cpu_app()).await
        })
    });
    let addr = addr_rx.recv().expect("the server's address");
    let dumped = std::sync::Arc::new(AtomicU64::new(0));
    {
        let dumped = dumped.clone();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            runtime.block_on(async move {
                let client = krabka_pprof_tests::client();
                let url = format!("http://{addr}/debug/pprof/threads?symbolize=none&deadline=20ms");
                // Until the exec ends this program (a bound: 2000 dumps).
                for _ in 0..2000 {
                    if let Ok(response) = client.get(&url).send().await
                        && response.status() == 200
                        && response.bytes().await.is_ok()
                    {
                        dumped.fetch_add(1, Ordering::SeqCst);
                    }
                }
            })
        });
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while dumped.load(Ordering::SeqCst) < 2 {
        assert!(Instant::now() < deadline, "no dump was taken");
        std::thread::sleep(Duration::from_millis(1));
    }
    // Running, so that the dumps signal this thread, right up to the exec.
    let until = Instant::now() + Duration::from_millis(20);
    while Instant::now() < until {
        std::hint::black_box(krabka_pprof_tests::hot::krabka_hot_spin(2_000));
    }
    let long = "x".repeat(100 * 1024);
    let error = std::process::Command::new(std::env::current_exe().unwrap())
        .arg("exec-during-dumps")
        .arg((left - 1).to_string())
        .args(std::iter::repeat_n(&long, 12))
        .exec();
    panic!("exec failed: {error}");
}

/// A thread that burns CPU in `krabka_hot_spin` for at most a minute.
fn start_burner() {
    start_burner_with(|| {});
}

/// Burns CPU `depth` calls deep, on whatever stack it is called on.
#[inline(never)]
#[unsafe(no_mangle)]
pub extern "C" fn krabka_segment_spin(depth: u32) -> u64 {
    if depth == 0 {
        krabka_pprof_tests::hot::krabka_hot_spin(20_000)
    } else {
        std::hint::black_box(krabka_segment_spin(std::hint::black_box(depth) - 1)) + 1
    }
}

/// Starts `child-switcher`, which burns CPU for 60 s on stack segments `stacker` maps for
/// it, switches onto and unmaps: each call a new one, of a size other than the last (256,
/// 32, 128, 16 KiB), as parsers and query engines on `stacker` run deep recursion.
fn start_switcher() {
    std::thread::Builder::new()
        .name("child-switcher".into())
        .spawn(|| {
            let sizes = [256 << 10, 32 << 10, 128 << 10, 16 << 10];
            let until = Instant::now() + Duration::from_secs(60);
            let mut round = 0;
            while Instant::now() < until {
                stacker::grow(sizes[round % sizes.len()], || {
                    std::hint::black_box(krabka_segment_spin(20))
                });
                round += 1;
            }
        })
        .expect("spawn child-switcher");
}

/// [`start_burner`], the thread first running `prepare`; returns once it has.
fn start_burner_with(prepare: fn()) {
    start_burner_named("child-burner", Duration::from_secs(60), prepare);
}

/// Starts a thread named `name` that runs `prepare`, then burns CPU for `burn_for`;
/// returns once `prepare` has run.
fn start_burner_named(name: &str, burn_for: Duration, prepare: fn()) {
    let (ready, prepared) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            prepare();
            ready.send(()).unwrap();
            let until = Instant::now() + burn_for;
            while Instant::now() < until {
                std::hint::black_box(krabka_pprof_tests::hot::krabka_hot_spin(20_000));
            }
        })
        .unwrap_or_else(|err| panic!("spawn {name}: {err}"));
    prepared
        .recv()
        .unwrap_or_else(|_| panic!("{name} never became ready"));
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
/// process alone (or so that it is not root); stays dumpable, as it was. False where this
/// process may not (not root).
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
    #[cfg(feature = "heap-profiling")]
    if std::env::args().nth(1).as_deref() != Some("serve-tikv") {
        allocator::KRABKAS.store(true, Ordering::Relaxed);
    }
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
        // A service already on tikv-jemallocator: the same routes.
        #[cfg(feature = "heap-profiling")]
        Some("serve-tikv") => {
            let router = app();
            start_sites();
            serve(router);
        }
        #[cfg(feature = "heap-profiling")]
        Some("serve-sites") => {
            // The routes first: building them starts the allocation counts.
            let router = app();
            start_sites();
            serve(router);
        }
        #[cfg(feature = "heap-profiling")]
        Some("serve-no-counts") => {
            let router = no_counts_app();
            start_sites();
            serve(router);
        }
        #[cfg(feature = "heap-profiling")]
        Some("serve-sites-after-no-counts") => {
            // A router without counts first (an admin router, say): the first router
            // with them, built next, installs the table.
            drop(no_counts_app());
            let router = app();
            start_sites();
            serve(router);
        }
        #[cfg(feature = "heap-profiling")]
        Some("serve-full-table") => {
            let router = small_table_app();
            for depth in 0..100 {
                std::hint::black_box(allocate_deep(depth));
            }
            serve(router);
        }
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
        #[cfg(feature = "push")]
        Some("serve-push") => {
            tracing_subscriber::fmt()
                .with_max_level(tracing::Level::INFO)
                .with_ansi(false)
                .with_writer(std::io::stderr)
                .init();
            // Built before any runtime exists: the pusher runs on a thread of its own.
            let router = push_app();
            // One thread burning for two minutes, every sample labelled with its tenant.
            std::thread::Builder::new()
                .name("child-burner".into())
                .spawn(|| {
                    krabka_pprof::labels::scope(&[("tenant", "acme")], || {
                        let until = Instant::now() + Duration::from_secs(120);
                        while Instant::now() < until {
                            std::hint::black_box(krabka_pprof_tests::hot::krabka_hot_spin(20_000));
                        }
                    });
                })
                .expect("spawn the burner");
            serve(router);
        }
        #[cfg(all(feature = "push", feature = "heap-profiling"))]
        Some("serve-push-heap") => {
            tracing_subscriber::fmt()
                .with_max_level(tracing::Level::INFO)
                .with_ansi(false)
                .with_writer(std::io::stderr)
                .init();
            // The routes first: building them starts the allocation counts.
            let router = push_heap_app();
            start_sites();
            serve(router);
        }
        Some("serve-token") => serve(token_app()),
        Some("serve-switches") => serve(switches_app()),
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
            if std::env::var_os("KRABKA_TEST_SWITCHED_STACKS").is_some() {
                start_switcher();
            }
            if std::env::var_os("KRABKA_TEST_LONGJMP").is_some() {
                start_jumper();
            }
            if std::env::var_os("KRABKA_TEST_FOREIGN_HANDLER").is_some() {
                install_foreign_handler();
            }
            // A Go runtime linked in, or a library watching sockets' urgent data: a
            // `SIGURG` handler, the signal thread dumps ask with.
            if std::env::var_os("KRABKA_TEST_FOREIGN_URG_HANDLER").is_some() {
                install_foreign_handler_for(libc::SIGURG);
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
        Some("serve-vforked") => {
            start_vforked();
            serve(cpu_app());
        }
        Some("serve-vforked-undumpable") => {
            // Not dumpable, and not root where it can leave root: its threads' `syscall`
            // files are then root's, readable by root alone, so no thread can be read
            // asleep without a signal, and the threads in `vfork` take none.
            become_a_user_of_its_own();
            // SAFETY: this process's own dumpable flag.
            unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
            start_vforked();
            serve(cpu_app());
        }
        Some("serve-filtered") => {
            start_filtered_threads();
            serve(cpu_app());
        }
        Some("exec-during-dumps") => {
            // 30 programs unless told how many are left.
            let left = std::env::args()
                .nth(2)
                .map_or(30, |n| n.parse().expect("exec-during-dumps N"));
            exec_during_dumps(left);
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
                "usage: test_child config|serve|serve-sites|serve-no-counts|serve-sites-after-no-counts|serve-full-table|serve-token|serve-token-guard|serve-cpu|exec-during-profile|\
                 fork-profile|spin|sigq-sessions|serve-vforked|serve-vforked-undumpable|serve-filtered|exec-during-dumps [N]|serve-recent|serve-recent-short|serve-recent-small"
            );
            std::process::exit(2);
        }
    }
}
