//! Helpers for krabka-pprof's HTTP tests: a real server on `127.0.0.1:0`, a loopback
//! client, profile decoding with `pprof::protos`, `go tool pprof`, and CPU burners whose
//! function names the tests look for.

use std::io::Read as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use axum::Router;
pub use pprof::protos::{Message as _, Profile};

/// The CPU profiler is one per process: tests that take profiles hold this so the tests
/// of one binary do not answer each other's requests with 409.
/// A tokio mutex: it is held across awaits, and a failed test must not poison it.
pub async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    LOCK.lock().await
}

/// A server on its own thread and runtime, so the test's runtime cannot help it along.
/// Shut down and joined on drop.
/// The environment variable that makes the servers of this process take CPU profiles with
/// the `pprof` crate's sampler instead of krabka-pprof's own: `KRABKA_TEST_SAMPLER=pprof-rs`.
/// `scripts/test` runs the CPU HTTP tests again with it, so both backends pass them.
pub const SAMPLER_VAR: &str = "KRABKA_TEST_SAMPLER";

/// Whether this process's CPU profiles come from the `pprof` crate's sampler.
pub fn pprof_rs_sampler() -> bool {
    match std::env::var(SAMPLER_VAR).as_deref() {
        Ok("pprof-rs") => true,
        Ok("" | "krabka") | Err(_) => false,
        Ok(other) => panic!("{SAMPLER_VAR}={other}: write pprof-rs or krabka"),
    }
}

/// Applies [`SAMPLER_VAR`] to this process, before its first profile.
pub fn choose_sampler() {
    if pprof_rs_sampler() {
        krabka_pprof::__private::use_pprof_rs_sampler();
    }
}

pub struct TestServer {
    pub addr: SocketAddr,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

/// The runtime a [`TestServer`] runs on.
#[derive(Clone, Copy, Debug)]
pub enum Flavor {
    CurrentThread,
    MultiThread,
}

impl TestServer {
    /// Serves `make_router()` on a multi-threaded runtime.
    pub fn start(make_router: impl FnOnce() -> Router + Send + 'static) -> TestServer {
        TestServer::start_on(Flavor::MultiThread, make_router)
    }

    /// Serves `make_router()` on a runtime of the given flavour.
    pub fn start_on(
        flavor: Flavor,
        make_router: impl FnOnce() -> Router + Send + 'static,
    ) -> TestServer {
        choose_sampler();
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (shutdown_tx, shutdown_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(format!("test-server-{flavor:?}"))
            .spawn(move || {
                let runtime = match flavor {
                    Flavor::CurrentThread => tokio::runtime::Builder::new_current_thread(),
                    Flavor::MultiThread => {
                        let mut b = tokio::runtime::Builder::new_multi_thread();
                        b.worker_threads(2);
                        b
                    }
                }
                .enable_all()
                .build()
                .expect("a tokio runtime");
                runtime.block_on(async move {
                    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                        .await
                        .expect("bind 127.0.0.1:0");
                    addr_tx.send(listener.local_addr().unwrap()).unwrap();
                    axum::serve(listener, make_router())
                        .with_graceful_shutdown(async {
                            let _ = shutdown_rx.await;
                        })
                        .await
                        .expect("serve");
                });
            })
            .expect("spawn the server thread");
        let addr = addr_rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the server reports its address");
        TestServer {
            addr,
            shutdown: Some(shutdown_tx),
            thread: Some(thread),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(thread) = self.thread.take() {
            // A profile still in flight finishes within its (bounded) window.
            let _ = thread.join();
        }
    }
}

/// A `test_child serve…` process (see `src/bin/test_child.rs`), killed on drop. `exe` is
/// `env!("CARGO_BIN_EXE_test_child")`, which only integration tests can name.
pub struct ChildServer {
    child: std::process::Child,
    pub addr: SocketAddr,
    /// Where its stderr goes, for [`ChildServer::start_logged`].
    log: Option<PathBuf>,
}

impl ChildServer {
    /// Starts `exe mode` with `MALLOC_CONF` and `_RJEM_MALLOC_CONF` removed, then `env`
    /// applied (`None` removes a variable).
    pub fn start(exe: &str, mode: &str, env: &[(&str, Option<&str>)]) -> ChildServer {
        ChildServer::spawn(exe, mode, env, None)
    }

    /// Like [`start`](Self::start), with the child's stderr kept for [`log`](Self::log).
    pub fn start_logged(exe: &str, mode: &str, env: &[(&str, Option<&str>)]) -> ChildServer {
        ChildServer::spawn(exe, mode, env, Some(temp_path("child.log")))
    }

    /// What the child wrote to stderr so far.
    pub fn log(&self) -> String {
        self.log
            .as_ref()
            .and_then(|path| std::fs::read_to_string(path).ok())
            .unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the child is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    fn spawn(
        exe: &str,
        mode: &str,
        env: &[(&str, Option<&str>)],
        log: Option<PathBuf>,
    ) -> ChildServer {
        use std::io::BufRead as _;
        let mut command = Command::new(exe);
        if let Some(log) = &log {
            command.stderr(std::fs::File::create(log).expect("create the child's log"));
        }
        command
            .arg(mode)
            .env_remove("MALLOC_CONF")
            .env_remove("_RJEM_MALLOC_CONF")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped());
        for (key, value) in env {
            match value {
                Some(value) => command.env(key, value),
                None => command.env_remove(key),
            };
        }
        let mut child = command.spawn().expect("start test_child");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .trim()
            .strip_prefix("addr=")
            .expect("test_child prints addr=")
            .parse()
            .unwrap();
        ChildServer { child, addr, log }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

impl Drop for ChildServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(log) = &self.log {
            let _ = std::fs::remove_file(log);
        }
    }
}

/// Runs `exe mode` to its end (killed after `limit`), returning its exit status and stdout.
pub fn run_child(exe: &str, mode: &str, limit: Duration) -> (std::process::ExitStatus, String) {
    let mut child = Command::new(exe)
        .arg(mode)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start test_child");
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        text
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for test_child") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            break child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    (status, reader.join().unwrap())
}

/// Sends `request` (a full HTTP/1.1 request with `Connection: close`) on a new connection
/// and returns the status, the headers (lowercased names) and the body. For tests that
/// must send exactly what a scraper sends.
pub async fn raw_request(addr: SocketAddr, request: &str) -> (u16, Vec<(String, String)>, Vec<u8>) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    parse_response(&raw)
}

/// Splits a raw `Content-Length` HTTP/1.1 response.
pub fn parse_response(raw: &[u8]) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a complete header");
    let head = String::from_utf8_lossy(&raw[..end]);
    let mut lines = head.lines();
    let status = lines.next().unwrap()[9..12].parse().unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    assert!(
        !headers
            .iter()
            .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked")),
        "these tests read Content-Length bodies"
    );
    (status, headers, raw[end + 4..].to_vec())
}

/// A client for loopback: no proxy from the environment, no transparent decompression,
/// a timeout well above any profile the tests request.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(120))
        .build()
        .expect("an HTTP client")
}

/// Like [`client`], but every request opens a new connection, so that requests reach the
/// server in the order they were sent (a pooled connection would overtake a new one).
pub fn unpooled_client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(120))
        .build()
        .expect("an HTTP client")
}

/// Gunzips and decodes a profile body, failing with a clear message if it is not one.
pub fn decode(body: &[u8]) -> Profile {
    assert!(
        body.starts_with(&[0x1f, 0x8b]),
        "the body is not gzip: {:?}",
        String::from_utf8_lossy(&body[..body.len().min(200)])
    );
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(body)
        .read_to_end(&mut raw)
        .expect("the gzip stream is complete");
    Profile::decode(raw.as_slice()).expect("the body is a pprof Profile")
}

pub fn string(profile: &Profile, index: i64) -> &str {
    &profile.string_table[usize::try_from(index).expect("a string index")]
}

/// Reads a whole document with an XML parser, failing the test on any error.
pub fn assert_valid_xml(document: &str) {
    let mut reader = quick_xml::Reader::from_str(document);
    loop {
        match reader.read_event() {
            Ok(quick_xml::events::Event::Eof) => break,
            Ok(_) => {}
            Err(err) => panic!("invalid XML at byte {}: {err}", reader.buffer_position()),
        }
    }
}

/// `(type, unit)` of each sample value.
pub fn sample_types(profile: &Profile) -> Vec<(String, String)> {
    profile
        .sample_type
        .iter()
        .map(|t| {
            (
                string(profile, t.ty).to_owned(),
                string(profile, t.unit).to_owned(),
            )
        })
        .collect()
}

/// Function names of every sample's stack, leaf first, with the sample's values.
pub fn stacks(profile: &Profile) -> Vec<(Vec<String>, Vec<i64>)> {
    profile
        .sample
        .iter()
        .map(|sample| {
            let names = sample
                .location_id
                .iter()
                .flat_map(|id| {
                    let location = profile
                        .location
                        .iter()
                        .find(|l| l.id == *id)
                        .expect("every sample location exists");
                    location.line.iter().map(|line| {
                        let function = profile
                            .function
                            .iter()
                            .find(|f| f.id == line.function_id)
                            .expect("every line's function exists");
                        string(profile, function.name).to_owned()
                    })
                })
                .collect();
            (names, sample.value.clone())
        })
        .collect()
}

/// The sum of one value column over all samples.
pub fn total(profile: &Profile, column: usize) -> i64 {
    profile.sample.iter().map(|s| s.value[column]).sum()
}

/// The sum of `column` over samples whose stack contains a function matching `name`.
pub fn total_in(profile: &Profile, column: usize, name: &str) -> i64 {
    stacks(profile)
        .iter()
        .filter(|(stack, _)| stack.iter().any(|f| f.contains(name)))
        .map(|(_, values)| values[column])
        .sum()
}

/// Checks that a profile splits the samples of three functions as their own CPU clocks
/// did (`measured`, nanoseconds): each share within 3 points. `nominal` is what the
/// workload was built to give, within `workload_tolerance` points, so that a workload
/// gone lopsided fails as such. Returns the samples of each function.
pub fn assert_split(
    profile: &Profile,
    functions: [&str; 3],
    measured: [f64; 3],
    nominal: [f64; 3],
    workload_tolerance: f64,
) -> [i64; 3] {
    let parts = functions.map(|f| total_in(profile, 0, f));
    let sum: i64 = parts.iter().sum();
    assert!(
        sum > 2000,
        "{sum} samples in the workload: too few to judge a split"
    );
    eprintln!("split of {functions:?}: {parts:?} of {sum} samples; measured CPU {measured:?} ns");
    let measured_sum: f64 = measured.iter().sum();
    for ((part, truth), nominal) in parts.iter().zip(measured).zip(nominal) {
        let share = *part as f64 * 100.0 / sum as f64;
        let expected = truth * 100.0 / measured_sum;
        assert!(
            (expected - nominal).abs() <= workload_tolerance,
            "the workload itself is off: {expected:.1}% where about {nominal}% was meant"
        );
        assert!(
            (share - expected).abs() <= 3.0,
            "the profile says {share:.1}%, the CPU clock {expected:.1}% ({parts:?} of {sum} samples)"
        );
    }
    parts
}

/// Runs `go tool pprof -top` on a profile body and returns its output.
pub fn go_pprof_top(body: &[u8]) -> String {
    let path = temp_path("profile.pb.gz");
    std::fs::write(&path, body).expect("write the profile");
    let output = Command::new("go")
        .args(["tool", "pprof", "-top", "-nodecount=1000"])
        .arg(&path)
        .env("HOME", std::env::temp_dir())
        .output()
        .unwrap_or_else(|err| {
            panic!(
                "cannot run `go tool pprof` ({err}); install Go (Debian: apt-get install golang-go) \
                 or run the tests through scripts/test, which does"
            )
        });
    let _ = std::fs::remove_file(&path);
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "go tool pprof failed: {}\n{stdout}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// A fresh file path under the system temp dir.
pub fn temp_path(name: &str) -> PathBuf {
    use std::sync::atomic::AtomicU64;
    static NEXT: AtomicU64 = AtomicU64::new(0);
    std::env::temp_dir().join(format!(
        "krabka-pprof-test-{}-{}-{name}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ))
}

/// Waits until process `pid` has a POSIX timer (the sampler has armed its timers), for at
/// most 10 s; false if it never does. Reads `/proc/PID/timers`, which lists them.
pub fn wait_for_timers(pid: u32) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let timers = std::fs::read_to_string(format!("/proc/{pid}/timers")).unwrap_or_default();
        if timers.lines().any(|line| line.starts_with("ID:")) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    false
}

/// The profile's comments, as `go tool pprof -comments` prints them.
pub fn comments(profile: &Profile) -> Vec<&str> {
    profile
        .comment
        .iter()
        .map(|index| string(profile, *index))
        .collect()
}

/// CPU time used by this process so far (user + system).
pub fn process_cpu_time() -> Duration {
    // SAFETY: getrusage writes into the zeroed struct we pass and nothing else.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        assert_eq!(libc::getrusage(libc::RUSAGE_SELF, &mut usage), 0);
        usage
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// Threads that call a workload in a loop until dropped or finished, or until `limit` has
/// passed. Each thread notes its own CPU clock every few milliseconds, so a test can tell
/// exactly how much CPU the burners used inside a profile's window.
pub struct Burner {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<Vec<(SystemTime, Duration)>>>,
}

/// Per burner thread: `(wall clock, that thread's CPU time)` readings.
pub struct CpuTimeline(Vec<Vec<(SystemTime, Duration)>>);

impl CpuTimeline {
    /// CPU the burner threads used between `start` and `end` (to within a few ms).
    pub fn cpu_within(&self, start: SystemTime, end: SystemTime) -> Duration {
        self.0
            .iter()
            .filter_map(|readings| {
                let first = readings.iter().find(|(at, _)| *at >= start)?;
                let last = readings.iter().rev().find(|(at, _)| *at <= end)?;
                Some(last.1.saturating_sub(first.1))
            })
            .sum()
    }
}

impl Burner {
    /// Burns CPU in [`hot::krabka_hot_spin`].
    pub fn start(threads: usize, limit: Duration) -> Burner {
        Burner::start_with(threads, limit, || {
            std::hint::black_box(hot::krabka_hot_spin(std::hint::black_box(20_000)));
        })
    }

    /// Calls `work` repeatedly on `threads` threads.
    pub fn start_with(threads: usize, limit: Duration, work: fn()) -> Burner {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..threads)
            .map(|i| {
                let stop = stop.clone();
                std::thread::Builder::new()
                    .name(format!("burner-{i}"))
                    .spawn(move || {
                        let started = Instant::now();
                        let mut readings = vec![(SystemTime::now(), thread_cpu_time())];
                        while !stop.load(Ordering::Relaxed) && started.elapsed() < limit {
                            work();
                            let now = SystemTime::now();
                            let due = readings.last().is_none_or(|(at, _)| {
                                now.duration_since(*at).unwrap_or_default()
                                    >= Duration::from_millis(2)
                            });
                            if due {
                                readings.push((now, thread_cpu_time()));
                            }
                        }
                        readings.push((SystemTime::now(), thread_cpu_time()));
                        readings
                    })
                    .expect("spawn a burner")
            })
            .collect();
        Burner { stop, threads }
    }

    /// Stops the threads and returns their CPU timelines.
    pub fn finish(mut self) -> CpuTimeline {
        self.stop.store(true, Ordering::Relaxed);
        CpuTimeline(
            self.threads
                .drain(..)
                .map(|t| t.join().expect("a burner thread"))
                .collect(),
        )
    }
}

/// CPU time of the calling thread.
pub fn thread_cpu_time() -> Duration {
    // SAFETY: clock_gettime writes into the zeroed timespec we pass.
    let time = unsafe {
        let mut time: libc::timespec = std::mem::zeroed();
        libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut time);
        time
    };
    Duration::new(time.tv_sec as u64, time.tv_nsec as u32)
}

/// The wall-clock window a profile says it sampled.
pub fn profile_window(profile: &Profile) -> (SystemTime, SystemTime) {
    let start = SystemTime::UNIX_EPOCH + Duration::from_nanos(profile.time_nanos as u64);
    (
        start,
        start + Duration::from_nanos(profile.duration_nanos as u64),
    )
}

impl Drop for Burner {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// Functions with names the tests search for in profiles.
pub mod hot {
    use std::hint::black_box;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Three functions with the same loop, so CPU time is about proportional to iterations.
    macro_rules! split {
        ($($name:ident),*) => {$(
            #[inline(never)]
            pub fn $name(rounds: u64) -> u64 {
                let mut x = black_box(0x2545_f491_4f6c_dd1du64);
                for i in 0..rounds {
                    x ^= x >> 12;
                    x ^= x << 25;
                    x ^= x >> 27;
                    x = x.wrapping_mul(0x2545_f491_4f6c_dd1d).wrapping_add(i);
                }
                black_box(x)
            }
        )*};
    }
    split!(split_fifty, split_thirty, split_twenty);

    /// CPU time spent in each of the three split functions, for the tests' ground truth.
    pub static SPLIT_CPU_NANOS: [AtomicU64; 3] = [const { AtomicU64::new(0) }; 3];

    /// One round of the workload: 5000, 3000 and 2000 iterations of the same loop, about
    /// 50/30/20 of the CPU. The exact split (code alignment can make one copy of the loop
    /// a little faster) is measured per call in [`SPLIT_CPU_NANOS`].
    pub fn split_round() {
        timed_into(&SPLIT_CPU_NANOS, 0, || split_fifty(black_box(5_000)));
        timed_into(&SPLIT_CPU_NANOS, 1, || split_thirty(black_box(3_000)));
        timed_into(&SPLIT_CPU_NANOS, 2, || split_twenty(black_box(2_000)));
    }

    fn thread_cpu_nanos() -> u64 {
        super::thread_cpu_time().as_nanos() as u64
    }

    /// CPU time spent in each part of [`copy_round`], for the tests' ground truth.
    pub static COPY_CPU_NANOS: [AtomicU64; 3] = [const { AtomicU64::new(0) }; 3];

    /// One round of about 40 % arithmetic, 40 % `copy_from_slice` (libc's `memcpy`, whose
    /// samples must be unwound to [`copy_forty`]) and 20 % other arithmetic, each part
    /// timed by the thread's own CPU clock into [`COPY_CPU_NANOS`]. The copy's length is
    /// calibrated once per thread against the arithmetic, since memory speed varies more
    /// than arithmetic between machines and with what else runs.
    pub fn copy_round() {
        thread_local! {
            static STATE: std::cell::RefCell<(Vec<u8>, Vec<u8>, usize)> =
                std::cell::RefCell::new((vec![1u8; 1 << 20], vec![0u8; 1 << 20], 0));
        }
        STATE.with_borrow_mut(|(from, to, length)| {
            if *length == 0 {
                *length = calibrate_copy(from, to);
            }
            timed_into(&COPY_CPU_NANOS, 0, || split_fifty(black_box(4_000)));
            timed_into(&COPY_CPU_NANOS, 1, || {
                copy_forty(&from[..*length], &mut to[..*length])
            });
            timed_into(&COPY_CPU_NANOS, 2, || split_twenty(black_box(2_000)));
        });
    }

    /// The copy length that takes as long as 4000 rounds of the arithmetic loop.
    fn calibrate_copy(from: &[u8], to: &mut [u8]) -> usize {
        let time = |f: &mut dyn FnMut()| {
            let before = thread_cpu_nanos();
            for _ in 0..200 {
                f();
            }
            (thread_cpu_nanos() - before).max(1)
        };
        let arithmetic = time(&mut || {
            black_box(split_fifty(black_box(4_000)));
        });
        let probe = 64 * 1024;
        let copying = time(&mut || {
            black_box(copy_forty(&from[..probe], &mut to[..probe]));
        });
        let length = (probe as u64 * arithmetic / copying) as usize;
        length.clamp(4 * 1024, from.len())
    }

    /// Copies `from` into `to` three times with `copy_from_slice`.
    #[inline(never)]
    pub fn copy_forty(from: &[u8], to: &mut [u8]) -> u64 {
        let mut copied = 0;
        for _ in 0..3 {
            to.copy_from_slice(black_box(from));
            copied += u64::from(black_box(to[7]));
        }
        copied
    }

    /// Runs `work`, adding the CPU time it took on this thread to `counters[index]`.
    fn timed_into(counters: &[AtomicU64; 3], index: usize, work: impl FnOnce() -> u64) {
        let before = thread_cpu_nanos();
        black_box(work());
        counters[index].fetch_add(thread_cpu_nanos() - before, Ordering::Relaxed);
    }

    /// Recurses `depth` frames deep, then spins at the bottom for `rounds`.
    #[inline(never)]
    pub fn krabka_deep_recursion(depth: u32, rounds: u64) -> u64 {
        if depth == 0 {
            return krabka_hot_spin(rounds);
        }
        // Not a tail call: the addition after it keeps every frame on the stack.
        black_box(krabka_deep_recursion(black_box(depth - 1), rounds)) + u64::from(depth)
    }

    /// The lowest address of the calling thread's stack.
    pub fn stack_floor() -> usize {
        // SAFETY: pthread_getattr_np fills the attribute object we pass, which we destroy.
        unsafe {
            let mut attr: libc::pthread_attr_t = std::mem::zeroed();
            assert_eq!(libc::pthread_getattr_np(libc::pthread_self(), &mut attr), 0);
            let mut address = std::ptr::null_mut();
            let mut size = 0;
            assert_eq!(
                libc::pthread_attr_getstack(&attr, &mut address, &mut size),
                0
            );
            libc::pthread_attr_destroy(&mut attr);
            address as usize
        }
    }

    /// Recurses until fewer than `leave` bytes of the thread's stack (whose lowest address
    /// is `floor`) remain below this frame, then spins there for `rounds`.
    #[inline(never)]
    pub fn krabka_near_stack_end(floor: usize, leave: usize, rounds: u64) -> u64 {
        let marker = 0u8;
        let here = black_box(&raw const marker) as usize;
        if here < floor + leave {
            return krabka_hot_spin(rounds);
        }
        black_box(krabka_near_stack_end(floor, leave, rounds)) + 1
    }

    /// Work for threads that live a few milliseconds.
    #[inline(never)]
    pub fn krabka_short_lived(rounds: u64) -> u64 {
        krabka_hot_spin(black_box(rounds))
    }

    /// Time spent inside libc's `memset`: the leaf of every sample is in libc.
    #[inline(never)]
    pub fn burn_in_libc() {
        let mut buffer = vec![0u8; 1 << 20];
        for round in 0..64u8 {
            // SAFETY: the buffer is ours and exactly this long.
            unsafe { libc::memset(buffer.as_mut_ptr().cast(), i32::from(round), buffer.len()) };
            black_box(&mut buffer);
        }
    }

    /// Pure arithmetic: every sample taken in it has it as the leaf.
    #[inline(never)]
    pub fn krabka_hot_spin(rounds: u64) -> u64 {
        let mut x = black_box(0x9e37_79b9_7f4a_7c15u64);
        for i in 0..rounds {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x = x.wrapping_add(i);
        }
        black_box(x)
    }
}
