//! Servers the tests talk to: [`TestServer`] (the app on its own thread and runtime; with
//! [`Options`], a blocking pool of known size that a test can hold, and the server's log
//! kept for the test to wait on) and [`ChildServer`] (the `test_child` binary, for what
//! must happen in another process), loopback clients, raw HTTP for exact scraper
//! requests, and the temp files and timers the child tests wait on.

use std::io::Read as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use axum::Router;

use crate::choose_sampler;

/// A server on its own thread and runtime, so the test's runtime cannot help it along.
/// Shut down and joined on drop.
pub struct TestServer {
    pub addr: SocketAddr,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

/// The runtime a [`TestServer`] runs on.
#[derive(Clone, Copy, Debug, Default)]
pub enum Flavor {
    CurrentThread,
    #[default]
    MultiThread,
}

/// How a [`TestServer`]'s runtime is built.
#[derive(Clone, Debug, Default)]
pub struct Options {
    pub flavor: Flavor,
    /// The blocking pool's size (tokio's default, 512, if `None`). With 1, a test that
    /// holds the pool ([`TestServer::hold_blocking_pool`]) holds every piece of the
    /// profiler's work that runs there (starting and stopping the sampler, closing a
    /// window, building and rendering its profile), each waiting its turn in order.
    pub blocking_threads: Option<usize>,
    /// Where the server's `tracing` events go (debug and up), for a test to wait on.
    pub log: Option<ServerLog>,
    /// Run on a worker before each task's poll (tokio's `on_before_task_poll`), on a
    /// multi-threaded runtime: where a test holds a worker at a chosen task's poll.
    #[cfg(tokio_unstable)]
    pub before_task_poll: Option<TaskHook>,
    /// krabka-pprof's task hooks installed (`krabka_pprof::task_hooks`), before
    /// `before_task_poll`'s hook where both are asked.
    #[cfg(tokio_unstable)]
    pub task_hooks: bool,
}

/// A hook tokio calls with a task's id and the place it was spawned.
#[cfg(tokio_unstable)]
#[derive(Clone)]
pub struct TaskHook(pub Arc<dyn Fn(&tokio::runtime::TaskMeta<'_>) + Send + Sync>);

#[cfg(tokio_unstable)]
impl std::fmt::Debug for TaskHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TaskHook(..)")
    }
}

/// What a [`TestServer`]'s threads logged, one line per event with its spans' fields
/// (`tracing_subscriber::fmt`, no colour), as an operator would read it.
#[derive(Clone, Debug, Default)]
pub struct ServerLog {
    lines: Arc<Mutex<Vec<String>>>,
    logged: Arc<tokio::sync::Notify>,
}

impl ServerLog {
    pub fn new() -> ServerLog {
        ServerLog::default()
    }

    /// Every line so far.
    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    /// Waits for the first line after the first `skip` lines that contains each of
    /// `words`, and returns it with its position; panics with the log after 30 s (an
    /// event that never comes, not a slow one).
    pub async fn wait_for(&self, skip: usize, words: &[&str]) -> (usize, String) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let logged = self.logged.notified();
            tokio::pin!(logged);
            // Registered before looking, so a line logged in between is not missed.
            logged.as_mut().enable();
            if let Some(found) = self
                .lines
                .lock()
                .unwrap()
                .iter()
                .enumerate()
                .skip(skip)
                .find(|(_, line)| words.iter().all(|word| line.contains(word)))
            {
                return (found.0, found.1.clone());
            }
            if tokio::time::timeout_at(deadline, logged).await.is_err() {
                panic!(
                    "the server never logged a line with {words:?}; it logged:\n{}",
                    self.lines().join("\n")
                );
            }
        }
    }

    /// The subscriber the server's threads log to.
    fn dispatch(&self) -> tracing::Dispatch {
        let writer = LogWriter(self.clone());
        tracing::Dispatch::new(
            tracing_subscriber::fmt()
                .with_max_level(tracing::Level::DEBUG)
                .with_ansi(false)
                .with_writer(move || writer.clone())
                .finish(),
        )
    }
}

/// Appends each event (one `write` per line from `fmt`) to a [`ServerLog`].
#[derive(Clone)]
struct LogWriter(ServerLog);

impl std::io::Write for LogWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let text = String::from_utf8_lossy(bytes);
        self.0
            .lines
            .lock()
            .unwrap()
            .extend(text.lines().map(str::to_owned));
        self.0.logged.notify_waiters();
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A hold on one of a [`TestServer`]'s blocking threads (see
/// [`TestServer::hold_blocking_pool`]), and of the profiler's own thread; dropping it lets
/// both go.
pub struct PoolHold(
    #[allow(dead_code, reason = "dropped to let go")] std::sync::mpsc::Sender<()>,
    #[allow(dead_code, reason = "dropped to let go")] krabka_pprof::__private::ProfilerThreadHold,
);

/// The holds the `/hold` route waits for, by number.
static HOLDS: Mutex<Vec<(u64, std::sync::mpsc::Receiver<()>)>> = Mutex::new(Vec::new());

/// The route [`TestServer::hold_blocking_pool`] calls: add it to an app whose test holds
/// the pool. `GET /hold?id=N&until=running` answers once its blocking task runs;
/// `until=queued`, once it is queued (behind whatever holds the pool now).
pub fn with_hold_route(router: Router) -> Router {
    router.route(
        "/hold",
        axum::routing::get(|uri: axum::http::Uri| async move {
            let query = uri.query().unwrap_or_default().to_owned();
            let field = |name: &str| {
                query
                    .split('&')
                    .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
                    .unwrap_or_default()
                    .to_owned()
            };
            let id: u64 = field("id").parse().expect("/hold?id=N");
            let release = {
                let mut holds = HOLDS.lock().unwrap();
                let at = holds
                    .iter()
                    .position(|(held, _)| *held == id)
                    .expect("a hold");
                holds.swap_remove(at).1
            };
            let (running, runs) = tokio::sync::oneshot::channel();
            drop(tokio::task::spawn_blocking(move || {
                let _ = running.send(());
                // Until the test's PoolHold is dropped.
                let _ = release.recv();
            }));
            if field("until") == "running" {
                runs.await.expect("the hold's blocking task ran");
            }
            "held"
        }),
    )
}

impl TestServer {
    /// Serves `make_router()` on a multi-threaded runtime.
    pub fn start(make_router: impl FnOnce() -> Router + Send + 'static) -> TestServer {
        TestServer::start_with(Options::default(), make_router)
    }

    /// Serves `make_router()` on a runtime of the given flavour.
    pub fn start_on(
        flavor: Flavor,
        make_router: impl FnOnce() -> Router + Send + 'static,
    ) -> TestServer {
        TestServer::start_with(
            Options {
                flavor,
                ..Options::default()
            },
            make_router,
        )
    }

    /// Serves `make_router()` on a runtime built as `options` say.
    pub fn start_with(
        options: Options,
        make_router: impl FnOnce() -> Router + Send + 'static,
    ) -> TestServer {
        choose_sampler();
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (shutdown_tx, shutdown_rx) = tokio::sync::oneshot::channel::<()>();
        let Options {
            flavor,
            blocking_threads,
            log,
            #[cfg(tokio_unstable)]
            before_task_poll,
            #[cfg(tokio_unstable)]
            task_hooks,
        } = options;
        let thread = std::thread::Builder::new()
            .name(format!("test-server-{flavor:?}"))
            .spawn(move || {
                let dispatch = log.as_ref().map(ServerLog::dispatch);
                // The server's own thread, and each thread the runtime starts.
                let _logging = dispatch.as_ref().map(tracing::dispatcher::set_default);
                let mut builder = match flavor {
                    Flavor::CurrentThread => tokio::runtime::Builder::new_current_thread(),
                    Flavor::MultiThread => {
                        let mut b = tokio::runtime::Builder::new_multi_thread();
                        b.worker_threads(2);
                        b
                    }
                };
                if let Some(threads) = blocking_threads {
                    builder.max_blocking_threads(threads);
                }
                #[cfg(tokio_unstable)]
                if task_hooks {
                    krabka_pprof::task_hooks::install(&mut builder);
                }
                #[cfg(tokio_unstable)]
                if let Some(TaskHook(hook)) = before_task_poll {
                    builder.on_before_task_poll(move |meta| {
                        if task_hooks {
                            krabka_pprof::task_hooks::before_poll();
                        }
                        hook(meta)
                    });
                }
                if let Some(dispatch) = dispatch {
                    builder.on_thread_start(move || {
                        // For the thread's whole life.
                        std::mem::forget(tracing::dispatcher::set_default(&dispatch));
                    });
                }
                let runtime = builder.enable_all().build().expect("a tokio runtime");
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

    /// Starts a CPU profile (`/debug/pprof/profile?{query}`) on a raw connection and
    /// returns that connection once the profile holds the profiler: a probe sent after it,
    /// on a new connection, is refused with 409. If the probe wins the race anyway, the raw
    /// request is the one refused, and it is sent again (at most 20 times). Dropping the
    /// connection hangs up mid-profile; reading it to the end gets the profile.
    pub async fn hold_profiler(&self, query: &str) -> tokio::net::TcpStream {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let http = unpooled_client();
        let probe = self.url("/debug/pprof/profile?seconds=1");
        for _ in 0..20 {
            let mut raw = tokio::net::TcpStream::connect(self.addr).await.unwrap();
            let request = format!(
                "GET /debug/pprof/profile?{query} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
                self.addr
            );
            raw.write_all(request.as_bytes()).await.unwrap();
            raw.flush().await.unwrap();
            let refused = http.get(&probe).send().await.unwrap();
            let status = refused.status();
            if status == reqwest::StatusCode::CONFLICT {
                let text = refused.text().await.unwrap();
                assert!(text.contains("force=true"), "{text}");
                return raw;
            }
            assert_eq!(status, reqwest::StatusCode::OK);
            let mut answer = Vec::new();
            raw.read_to_end(&mut answer).await.unwrap();
            assert!(
                answer.starts_with(b"HTTP/1.1 409"),
                "{}",
                String::from_utf8_lossy(&answer)
            );
        }
        panic!("the profile ({query}) never got the profiler in 20 attempts");
    }

    /// Holds one of the server's blocking threads until the hold is dropped: with
    /// [`Options::blocking_threads`] 1, every later piece of blocking work waits behind it.
    /// `running`: returns once the hold has the thread (the pool is held from then on);
    /// else once it is queued, behind whatever holds the thread now, so that work queued
    /// after it waits for it in turn. The app needs [`with_hold_route`].
    pub async fn hold_blocking_pool(&self, running: bool) -> PoolHold {
        // The profiler builds profiles on a thread of its own while it is idle: held, it
        // takes none, and they wait on the pool as the test means them to. Another test's
        // profile may be finishing there.
        let thread = krabka_pprof::__private::hold_profiler_thread();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !thread.idle() {
            assert!(
                Instant::now() < deadline,
                "the profiler's thread stayed busy for 30 s"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        let (hold, release) = std::sync::mpsc::channel();
        HOLDS.lock().unwrap().push((id, release));
        let until = if running { "running" } else { "queued" };
        let answer = unpooled_client()
            .get(self.url(&format!("/hold?id={id}&until={until}")))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), reqwest::StatusCode::OK, "/hold");
        PoolHold(hold, thread)
    }

    /// Waits until the index page says `windows` CPU windows are open (at most 10 s), and
    /// returns when the last look that did not say so was sent (`None` if the first
    /// did): by the client's clock, the windows opened after it.
    pub async fn wait_for_windows(&self, windows: usize) -> Option<Instant> {
        let said = if windows == 0 {
            "<td>no CPU profile</td>".to_owned()
        } else {
            format!(
                "{windows} window{} open",
                if windows == 1 { "" } else { "s" }
            )
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut not_yet = None;
        loop {
            let sent = Instant::now();
            let index = self.text("/debug/pprof/").await;
            if index.contains(&said) {
                return not_yet;
            }
            not_yet = Some(sent);
            assert!(Instant::now() < deadline, "the index never said {said:?}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// The body of `GET path`, as text (the index page, say).
    pub async fn text(&self, path: &str) -> String {
        text_at(&self.url(path)).await
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

    /// How the child ended, waiting up to a second for it; `None` while it still runs.
    pub fn exit_status(&mut self) -> Option<std::process::ExitStatus> {
        let until = Instant::now() + Duration::from_secs(1);
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return Some(status),
                Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(10)),
                _ => return None,
            }
        }
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

    /// The body of `GET path`, as text, as [`TestServer::text`].
    pub async fn text(&self, path: &str) -> String {
        text_at(&self.url(path)).await
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
    let mut command = Command::new(exe);
    command.arg(mode);
    run_to_end(command, limit)
}

/// Runs `command` to its end (killed after `limit`), returning its exit status and
/// stdout (read while it runs; its stderr goes where the test's does).
pub fn run_to_end(mut command: Command, limit: Duration) -> (std::process::ExitStatus, String) {
    let mut child = command
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|err| panic!("start {:?}: {err}", command.get_program()));
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        text
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the child") {
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

/// The body of `GET url`, as text.
async fn text_at(url: &str) -> String {
    client()
        .get(url)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
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

/// Sends `GET url`, then `HEAD url`: HEAD must answer the same status and headers,
/// without a body. Redirects are not followed. Returns the status.
pub async fn assert_head_like_get(url: &str) -> reqwest::StatusCode {
    let http = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(120))
        .build()
        .expect("an HTTP client");
    let get = http.get(url).send().await.unwrap();
    let head = http.head(url).send().await.unwrap();
    let status = get.status();
    assert_eq!(head.status(), status, "HEAD {url}");
    for name in [
        "content-type",
        "content-disposition",
        "x-content-type-options",
        "x-go-pprof",
        "location",
        "www-authenticate",
    ] {
        assert_eq!(
            head.headers().get(name),
            get.headers().get(name),
            "{name} of HEAD {url}"
        );
    }
    assert_eq!(
        head.headers().contains_key("retry-after"),
        get.headers().contains_key("retry-after"),
        "retry-after of HEAD {url}"
    );
    let body = get.bytes().await.unwrap();
    assert!(
        status.is_redirection() || !body.is_empty(),
        "GET {url} sent no body"
    );
    assert!(
        head.bytes().await.unwrap().is_empty(),
        "HEAD {url} sent a body"
    );
    status
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
    wait_for_timer_line(pid, "ID:")
}

/// Waits (10 s at most) until process `pid`'s sampler has made its process-wide timer,
/// the last timer its start makes (after each thread's own, whose appearance
/// [`wait_for_timers`] waits for): a `notify: signal/pid.` entry in `/proc/PID/timers`.
pub fn wait_for_backstop(pid: u32) -> bool {
    wait_for_timer_line(pid, "notify: signal/pid.")
}

/// Waits (10 s at most) until a line of `/proc/PID/timers` starts with `start`.
fn wait_for_timer_line(pid: u32, start: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let timers = std::fs::read_to_string(format!("/proc/{pid}/timers")).unwrap_or_default();
        if timers.lines().any(|line| line.starts_with(start)) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    false
}
