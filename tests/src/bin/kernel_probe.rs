//! The sampler's kernel-dependent promises, checked on the kernel this runs on:
//! `scripts/test-old-kernel` builds it static (musl) and boots it as `/init` of Debian 12's
//! kernel (6.1) in QEMU. As init it mounts `/proc`, brings up `lo` and powers the machine
//! off when done; anywhere else it only runs the checks. Each check runs in a child
//! process of its own (a fresh sampler, threads and `SigQ`), serves a `#[pprof_routes]`
//! app on 127.0.0.1:0, profiles itself over HTTP and judges the profile by clocks outside
//! the sampler: the process's `getrusage`, the threads' own CPU clocks, `/proc/self/status`.
//! It prints `checks: NAME…` first, then one `PASS NAME: …` or `FAIL NAME: …` line per
//! check with its figures, then `probe: done`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use axum::Router;
use krabka_pprof::pprof_routes;
use krabka_pprof_tests::{
    Profile, TestServer, client, decode, hot, process_cpu_time, profile_window, stacks,
    thread_cpu_time, total, total_in,
};
use reqwest::StatusCode;

#[pprof_routes(cpu_max = "30s")]
fn app() -> Router {
    Router::new()
}

/// A check's name and the check, which returns the text of its verdict line after the name:
/// `Ok` for PASS, `Err` for FAIL.
type Check = (&'static str, fn() -> Result<String, String>);

const CHECKS: [Check; 3] = [
    ("short-lived-threads", short_lived_threads),
    ("sigq-flat", sigq_flat),
    ("unblocked-sigprof", unblocked_sigprof),
];

/// A check that gives no verdict in this long (TCG runs code 10 to 30 times slower than
/// the host) is killed and fails.
const CHECK_LIMIT: Duration = Duration::from_secs(150);

fn main() {
    let init = std::process::id() == 1;
    if init {
        // SAFETY: called once, before any thread exists.
        if let Err(error) = unsafe { become_init() } {
            println!("FAIL init: {error}");
            power_off();
        }
    }
    // A line of its own: the firmware's last escape codes end without a newline.
    println!();
    println!("probe: kernel {}", kernel_release());
    println!("checks: {}", CHECKS.map(|(name, _)| name).join(" "));
    for (name, check) in CHECKS {
        run_in_child(name, check);
    }
    println!("probe: done");
    if init {
        power_off();
    }
}

/// What init must do for the checks: `/proc` (the sampler and the checks read it) and
/// the loopback interface, which nothing else brings up in a bare initramfs.
///
/// # Safety
/// Only in pid 1, before any thread exists.
unsafe fn become_init() -> Result<(), String> {
    // SAFETY: C strings that live through each call; an ifreq we own.
    unsafe {
        libc::mkdir(c"/proc".as_ptr(), 0o555);
        if libc::mount(
            c"proc".as_ptr(),
            c"/proc".as_ptr(),
            c"proc".as_ptr(),
            0,
            std::ptr::null(),
        ) != 0
        {
            return Err(format!("mount /proc: {}", std::io::Error::last_os_error()));
        }
        let socket = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if socket < 0 {
            return Err(format!("socket: {}", std::io::Error::last_os_error()));
        }
        let mut request: libc::ifreq = std::mem::zeroed();
        for (to, from) in request.ifr_name.iter_mut().zip(b"lo\0") {
            *to = *from as libc::c_char;
        }
        request.ifr_ifru.ifru_flags = (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        // The raw call: glibc and musl declare ioctl's request with different types.
        let up = libc::syscall(
            libc::SYS_ioctl,
            socket,
            libc::SIOCSIFFLAGS,
            &raw mut request,
        );
        let error = std::io::Error::last_os_error();
        libc::close(socket);
        if up != 0 {
            return Err(format!("bringing up lo: {error}"));
        }
    }
    Ok(())
}

fn power_off() -> ! {
    // SAFETY: sync and reboot take no pointers; as pid 1 reboot ends the machine.
    unsafe {
        libc::sync();
        libc::reboot(libc::RB_POWER_OFF);
        libc::_exit(1)
    }
}

fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease").map_or_else(
        |error| format!("unknown ({error})"),
        |r| r.trim().to_owned(),
    )
}

/// Runs `check` in a child, which prints its verdict; says so if the child dies, panics
/// or hangs instead. Forks while this process has one thread (the children make theirs).
fn run_in_child(name: &str, check: fn() -> Result<String, String>) {
    // SAFETY: fork with a single thread; the child runs the check and leaves with exit.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        println!("FAIL {name}: fork: {}", std::io::Error::last_os_error());
        return;
    }
    if pid == 0 {
        let code = match std::panic::catch_unwind(check) {
            Ok(Ok(figures)) => {
                println!("PASS {name}: {figures}");
                0
            }
            Ok(Err(figures)) => {
                println!("FAIL {name}: {figures}");
                0
            }
            Err(panic) => {
                let message = panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("(no message)");
                println!("FAIL {name}: the check panicked: {message}");
                0
            }
        };
        std::process::exit(code);
    }
    let deadline = Instant::now() + CHECK_LIMIT;
    let mut status = 0;
    loop {
        // SAFETY: waiting for our own child, into a local.
        let done = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if done == pid {
            break;
        }
        if Instant::now() > deadline {
            // SAFETY: killing and reaping our own child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            println!(
                "FAIL {name}: no verdict in {} s; the check was killed",
                CHECK_LIMIT.as_secs()
            );
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    if libc::WIFSIGNALED(status) {
        println!(
            "FAIL {name}: the check's process was killed by signal {}",
            libc::WTERMSIG(status)
        );
    } else if libc::WEXITSTATUS(status) != 0 {
        println!(
            "FAIL {name}: the check's process exited with {}",
            libc::WEXITSTATUS(status)
        );
    }
}

/// `GET /debug/pprof/profile?seconds=…&frequency=…` on `server`, with the client's clock
/// around it.
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

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

fn ms(nanos: f64) -> String {
    format!("{:.0} ms", nanos / 1e6)
}

/// A CPU clock (a thread's, the process's), noted as it runs, so that the CPU it counted
/// between two moments of the wall clock is known.
#[derive(Default)]
struct Timeline(Mutex<Vec<(SystemTime, Duration)>>);

impl Timeline {
    fn note(&self, cpu: Duration) {
        self.0.lock().unwrap().push((SystemTime::now(), cpu));
    }

    fn cpu_within(&self, start: SystemTime, end: SystemTime) -> Duration {
        let points = self.0.lock().unwrap();
        let at = |moment: SystemTime| {
            points
                .iter()
                .rev()
                .find(|(time, _)| *time <= moment)
                .map_or(Duration::ZERO, |(_, cpu)| *cpu)
        };
        at(end).saturating_sub(at(start))
    }
}

/// Where the kernel gives the process-wide backstop's signals to the main thread (before
/// 6.4), threads that live a few milliseconds get no timer and no signal: their CPU must
/// still be in the profile, under their own stacks or the marker, and Σ cpu/nanoseconds
/// must still be the process's CPU.
///
/// The process's CPU is judged over the profile's window, from `getrusage` read every
/// 5 ms: over the whole request it also holds what the server does after the window
/// (symbolizing, encoding) and the load running on meanwhile, which under TCG is seconds,
/// not the host's milliseconds.
fn short_lived_threads() -> Result<String, String> {
    const MARKER: &str = "[threads too short-lived to be sampled]";
    let server = TestServer::start(app);
    let stop = Arc::new(AtomicBool::new(false));
    // Per thread: when it started and ended, and the CPU its own clock measured.
    let lives = Arc::new(Mutex::new(Vec::<(SystemTime, SystemTime, Duration)>::new()));
    // One thread at a time, the next 1 ms after the last was joined: up to 200 threads a
    // second on the host, each 4 ms of its own CPU (counted by its clock, so that the
    // load is the same on a slow emulated CPU). Under TCG starting and joining a thread
    // costs the spawner about as much again, and a second spawner would keep both vCPUs
    // busy, which measures the host's scheduler more than the sampler.
    let spawner = {
        let (stop, lives) = (stop.clone(), lives.clone());
        std::thread::spawn(move || {
            let limit = Instant::now() + Duration::from_secs(60);
            while !stop.load(Ordering::Relaxed) && Instant::now() < limit {
                let lives = lives.clone();
                std::thread::Builder::new()
                    .name("short-lived".into())
                    .spawn(move || {
                        let started = SystemTime::now();
                        let start = thread_cpu_time();
                        while thread_cpu_time() - start < Duration::from_millis(4) {
                            std::hint::black_box(hot::krabka_short_lived(2_000));
                        }
                        let used = thread_cpu_time() - start;
                        lives
                            .lock()
                            .unwrap()
                            .push((started, SystemTime::now(), used));
                    })
                    .unwrap()
                    .join()
                    .unwrap();
                std::thread::sleep(Duration::from_millis(1));
            }
        })
    };
    let process_cpu = Arc::new(Timeline::default());
    let ticker = {
        let (stop, process_cpu) = (stop.clone(), process_cpu.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                process_cpu.note(process_cpu_time());
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    let url = server.url("/debug/pprof/profile?seconds=3&frequency=99");
    let (profile, request_cpu) = runtime().block_on(async move {
        let before = process_cpu_time();
        let response = client().get(url).send().await.unwrap();
        let used = process_cpu_time() - before;
        assert_eq!(response.status(), StatusCode::OK);
        (decode(&response.bytes().await.unwrap()), used)
    });
    stop.store(true, Ordering::Relaxed);
    spawner.join().unwrap();
    ticker.join().unwrap();

    let (start, end) = profile_window(&profile);
    let process = process_cpu.cpu_within(start, end).as_nanos() as f64;
    // The threads that lived inside the window, by their own clocks.
    let lives = lives.lock().unwrap();
    let inside: Vec<_> = lives
        .iter()
        .filter(|(born, died, _)| *born >= start && *died <= end)
        .collect();
    let truth: f64 = inside.iter().map(|(_, _, cpu)| cpu.as_nanos() as f64).sum();
    let own = total_in(&profile, 1, "krabka_short_lived") as f64;
    let marked = total_in(&profile, 1, MARKER) as f64;
    let all = total(&profile, 1) as f64;
    let figures = format!(
        "Σ cpu/nanoseconds {} of the process's {} over the window ({:+.1} %, within 10 % \
         needed; {} over the whole request, with the answer's work after the window); {} threads lived inside the window using {} \
         by their own clocks ({:.0} % of the process's), the profile has {} under their \
         stacks and {} under {MARKER} ({:.0} % of theirs, 80 % needed)",
        ms(all),
        ms(process),
        (all - process) / process * 100.0,
        ms(request_cpu.as_nanos() as f64),
        inside.len(),
        ms(truth),
        truth / process * 100.0,
        ms(own),
        ms(marked),
        (own + marked) / truth * 100.0,
    );
    // Losing the threads' CPU must put Σ further off than the 10 % it may be: losing
    // them loses their starts and exits too, which their own clocks do not count.
    if truth < process * 0.12 {
        return Err(format!(
            "{figures}: the threads used too little of the process's CPU to test this (12 % \
             needed)"
        ));
    }
    if (all - process).abs() <= process * 0.1 && own + marked >= truth * 0.8 {
        Ok(figures)
    } else {
        Err(figures)
    }
}

/// This process's `SigQ:` (signals queued for its user).
fn sigq() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|line| line.strip_prefix("SigQ:"))
        .and_then(|value| value.trim().split('/').next()?.parse().ok())
        .expect("SigQ in /proc/self/status")
}

/// Makes `SigQ` (per user, across processes) count this process alone: it becomes a user
/// of its own (in the guest as on a host, root is every process's user) and stays
/// dumpable, as it was.
fn own_sigq() -> Result<(), String> {
    let uid = 40_000 + std::process::id() % 20_000;
    // SAFETY: changing this process's own credentials, then its dumpable flag back.
    let changed = unsafe {
        libc::setresgid(uid, uid, uid) == 0
            && libc::setresuid(uid, uid, uid) == 0
            && libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) == 0
    };
    if changed {
        Ok(())
    } else {
        Err(
            "SigQ counts all of this user's processes, and this process cannot become a \
             user of its own (not root)"
                .into(),
        )
    }
}

/// A thread that blocks every signal for its whole life (as librdkafka's do) keeps each
/// of its timer's signals queued: over sessions, `SigQ` must stay flat.
fn sigq_flat() -> Result<String, String> {
    own_sigq()?;
    let stop = Arc::new(AtomicBool::new(false));
    let blocker = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            // SAFETY: an all-zero sigset_t, then filled and blocked in this thread.
            unsafe {
                let mut all: libc::sigset_t = std::mem::zeroed();
                libc::sigfillset(&mut all);
                libc::pthread_sigmask(libc::SIG_BLOCK, &all, std::ptr::null_mut());
            }
            let limit = Instant::now() + Duration::from_secs(90);
            while !stop.load(Ordering::Relaxed) && Instant::now() < limit {
                std::hint::black_box(hot::krabka_hot_spin(2_000));
            }
        })
    };
    let before = sigq();
    let counts = runtime().block_on(async {
        let mut counts = Vec::new();
        for _ in 0..8 {
            // A server of its own each time: the session stops on the blocking pool after
            // its last window has answered, and the server's runtime waits for that as it
            // shuts down, so `SigQ` is read once the session has stopped.
            let server = TestServer::start(app);
            window(&server, 1, 99).await.unwrap();
            drop(server);
            counts.push(sigq());
        }
        counts
    });
    stop.store(true, Ordering::Relaxed);
    blocker.join().unwrap();
    let figures = format!(
        "SigQ {before} before, then after each of 8 sessions of 1 s: {} (at most 1 more \
         than after the first allowed)",
        counts
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(" ")
    );
    if counts[7] <= counts[0] + 1 {
        Ok(figures)
    } else {
        Err(figures)
    }
}

/// Burns with `SIGPROF` blocked until `unblock`, then unblocked until `stop`, noting its
/// CPU clock; named so that its samples can be found.
#[inline(never)]
fn krabka_probe_unblocks_late(unblock: &AtomicBool, stop: &AtomicBool, timeline: &Timeline) {
    // SAFETY: an all-zero sigset_t is a valid (empty) set.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: building a signal set and blocking it in this thread's own mask.
    unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGPROF);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
    let limit = Instant::now() + Duration::from_secs(60);
    let mut unblocked = false;
    while !stop.load(Ordering::Relaxed) && Instant::now() < limit {
        if !unblocked && unblock.load(Ordering::Relaxed) {
            // SAFETY: unblocking what was blocked above.
            unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut()) };
            unblocked = true;
        }
        std::hint::black_box(hot::krabka_hot_spin(2_000));
        timeline.note(thread_cpu_time());
    }
}

/// A thread that unblocks `SIGPROF` after 3 s gets one signal standing for all 3 s (and,
/// before 6.13, the stale signals of timers deleted meanwhile): a window that opened
/// at 2.5 s, while another held the session, must be charged only what it used since.
fn unblocked_sigprof() -> Result<String, String> {
    let server = TestServer::start(app);
    let timeline = Arc::new(Timeline::default());
    let unblock = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let (charged, used, before) = runtime().block_on(async {
        let held = window(&server, 10, 99);
        let blocker = {
            let (unblock, stop, timeline) = (unblock.clone(), stop.clone(), timeline.clone());
            std::thread::spawn(move || krabka_probe_unblocks_late(&unblock, &stop, &timeline))
        };
        tokio::time::sleep(Duration::from_millis(2_500)).await;
        let joined = window(&server, 2, 99);
        tokio::time::sleep(Duration::from_millis(500)).await;
        unblock.store(true, Ordering::Relaxed);
        // The thread stops when the window's 2 s are over: under TCG the answer comes
        // seconds later, and CPU used meanwhile would hide what the window was charged.
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        stop.store(true, Ordering::Relaxed);
        let (profile, sent, received) = joined.await.unwrap();
        blocker.join().unwrap();
        held.abort();
        let charged: i64 = stacks(&profile)
            .into_iter()
            .filter(|(frames, _)| {
                frames.iter().any(|f| {
                    f.contains("krabka_probe_unblocks_late") || f.contains("blocks SIGPROF")
                })
            })
            .map(|(_, values)| values[1])
            .sum();
        (
            charged as f64,
            timeline.cpu_within(sent, received).as_nanos() as f64,
            timeline.cpu_within(SystemTime::UNIX_EPOCH, sent).as_nanos() as f64,
        )
    });
    let figures = format!(
        "the window that joined at 2.5 s was charged {} for the thread that unblocked at 3 s; \
         it used {} while that window was open (at most 115 % + 30 ms allowed; {} before it \
         opened)",
        ms(charged),
        ms(used),
        ms(before)
    );
    if charged <= used * 1.15 + 30e6 {
        Ok(figures)
    } else {
        Err(figures)
    }
}
