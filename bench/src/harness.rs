//! The harness: the processes the figures measure and how the benchmark drives them.
//! `harness/server.rs` and `harness/load.rs` are the child processes' own code
//! (`bench server`, `bench load`); this file starts them pinned to their cores, reads what
//! they report, and fetches profiles over plain HTTP/1.1.

pub mod load;
pub mod server;

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use pprof::protos::Message as _;

use crate::stats::Ratios;

pub const SERVER_CPU: usize = 1;
/// Keep-alive connections of the throughput load: enough to keep the service's core busy.
pub const CONNECTIONS: usize = 8;
pub const LOAD_CPU: usize = 0;

pub fn unix_ns(t: SystemTime) -> u128 {
    t.duration_since(UNIX_EPOCH).unwrap().as_nanos()
}

/// A service process, killed on drop.
pub struct Server {
    child: Child,
    pub addr: SocketAddr,
}

impl Server {
    pub fn start(attribute: bool, current_thread: bool) -> Server {
        let mut command = Command::new(std::env::current_exe().unwrap());
        command
            .arg("server")
            .args(["--cpu", &SERVER_CPU.to_string()]);
        if !attribute {
            command.arg("--plain");
        }
        if current_thread {
            command.arg("--current-thread");
        }
        Server::spawn(command)
    }

    /// The service with the recorder on (`recent = "10m"`), and a thread cycling through
    /// `varied` distinct stacks if given, for figure R.
    pub fn start_recording(varied: Option<u64>) -> Server {
        let mut command = Command::new(std::env::current_exe().unwrap());
        command
            .arg("server")
            .args(["--cpu", &SERVER_CPU.to_string()])
            .arg("--recent");
        if let Some(stacks) = varied {
            command.args(["--varied", &stacks.to_string()]);
        }
        Server::spawn(command)
    }

    /// The service with the recorder and the pusher on, pushing to the destinations `env`
    /// names, a thread cycling through `varied` distinct stacks (figure P).
    pub fn start_pushing(varied: u64, env: &[(&str, &str)]) -> Server {
        let mut command = Command::new(std::env::current_exe().unwrap());
        command
            .arg("server")
            .args(["--cpu", &SERVER_CPU.to_string()])
            .arg("--push")
            .args(["--varied", &varied.to_string()])
            .envs(env.iter().copied());
        Server::spawn(command)
    }

    /// The jemalloc service of `src/bin/heap_server.rs`, with `_RJEM_MALLOC_CONF`.
    pub fn start_heap(conf: Option<&str>) -> Server {
        Server::start_heap_with(conf, &[])
    }

    /// [`start_heap`](Self::start_heap) with more arguments (`--no-counts`).
    pub fn start_heap_with(conf: Option<&str>, args: &[&str]) -> Server {
        let exe = std::env::current_exe()
            .unwrap()
            .with_file_name("krabka-pprof-bench-heap-server");
        let mut command = Command::new(exe);
        command
            .args(["--cpu", &SERVER_CPU.to_string()])
            .args(args)
            .env_remove("MALLOC_CONF")
            .env_remove("_RJEM_MALLOC_CONF");
        if let Some(conf) = conf {
            command.env("_RJEM_MALLOC_CONF", conf);
        }
        Server::spawn(command)
    }

    /// The service as `exe` (this benchmark built another way) runs it, for figure L.
    pub fn start_exe(exe: &std::path::Path) -> Server {
        let mut command = Command::new(exe);
        command
            .arg("server")
            .args(["--cpu", &SERVER_CPU.to_string()]);
        Server::spawn(command)
    }

    /// The service with one thread spinning `depth` frames deep, for figure S.
    pub fn start_spinning(depth: u32) -> Server {
        let mut command = Command::new(std::env::current_exe().unwrap());
        command
            .arg("server")
            .args(["--cpu", &SERVER_CPU.to_string()])
            .args(["--spin-depth", &depth.to_string()]);
        Server::spawn(command)
    }

    /// The service with one thread spinning `depth` frames deep, each frame holding 256
    /// bytes of locals (as an async request's poll chain does), for figure S's deep stack.
    pub fn start_spinning_fat(depth: u32) -> Server {
        let mut command = Command::new(std::env::current_exe().unwrap());
        command
            .arg("server")
            .args(["--cpu", &SERVER_CPU.to_string()])
            .args(["--spin-depth", &depth.to_string()])
            .arg("--spin-fat");
        Server::spawn(command)
    }

    /// The service with `busy` threads spinning and `parked` asleep, for figure S's
    /// sampler CPU with many threads.
    pub fn start_crowded(busy: usize, parked: usize) -> Server {
        let mut command = Command::new(std::env::current_exe().unwrap());
        command
            .arg("server")
            .args(["--cpu", &SERVER_CPU.to_string()])
            .args(["--busy", &busy.to_string()])
            .args(["--parked", &parked.to_string()]);
        Server::spawn(command)
    }

    /// The service with one thread spinning `depth` frames deep, inside a
    /// `labels::scope` if `in_scope`, for the labels figure's handler cost.
    pub fn start_spinning_labelled(depth: u32, in_scope: bool) -> Server {
        let mut command = Command::new(std::env::current_exe().unwrap());
        command
            .arg("server")
            .args(["--cpu", &SERVER_CPU.to_string()])
            .args(["--spin-depth", &depth.to_string()]);
        if in_scope {
            command.arg("--spin-in-scope");
        }
        Server::spawn(command)
    }

    /// The service living as services do for hours (threads, libraries, children come
    /// and go), for figure LS.
    pub fn start_churning() -> Server {
        let mut command = Command::new(std::env::current_exe().unwrap());
        command
            .arg("server")
            .args(["--cpu", &SERVER_CPU.to_string()])
            .arg("--churn");
        Server::spawn(command)
    }

    /// The service for figure W: `workers` runtime workers, `pool_idle` idle blocking-pool
    /// threads, `parked` threads asleep at various depths, and with `blocked_polls` one
    /// task per worker blocking it inside its poll.
    pub fn start_wall(
        workers: usize,
        pool_idle: usize,
        parked: usize,
        blocked_polls: bool,
    ) -> Server {
        let mut command = Command::new(std::env::current_exe().unwrap());
        command
            .arg("server")
            .args(["--cpu", &SERVER_CPU.to_string()])
            .args(["--workers", &workers.to_string()])
            .args(["--pool-idle", &pool_idle.to_string()])
            .args(["--parked", &parked.to_string()]);
        if blocked_polls {
            command.arg("--blocked-polls");
        }
        Server::spawn(command)
    }

    /// The service with `threads` more threads asleep at various depths, for figure T.
    pub fn start_parked(threads: usize) -> Server {
        let mut command = Command::new(std::env::current_exe().unwrap());
        command
            .arg("server")
            .args(["--cpu", &SERVER_CPU.to_string()])
            .args(["--parked", &threads.to_string()]);
        Server::spawn(command)
    }

    fn spawn(mut command: Command) -> Server {
        let mut child = command
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the server");
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .expect("the server prints its address");
        let addr = line
            .trim()
            .strip_prefix("addr=")
            .expect("addr=")
            .parse()
            .unwrap();
        Server { child, addr }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A load process running in the background.
pub struct Load(Child);

pub struct LoadOutput {
    pub requests: u64,
    pub elapsed: Duration,
    pub start_unix_ns: u128,
    /// `(unix ns at start, latency)`.
    pub latencies: Vec<(u128, Duration)>,
}

impl Load {
    pub fn start(addr: SocketAddr, connections: usize, seconds: f64, record: bool) -> Load {
        Load::spawn(addr, "/hello", connections, seconds, record)
    }

    /// Load on another route than `/hello`, unrecorded.
    pub fn start_on(addr: SocketAddr, path: &str, connections: usize, seconds: f64) -> Load {
        Load::spawn(addr, path, connections, seconds, false)
    }

    fn spawn(addr: SocketAddr, path: &str, connections: usize, seconds: f64, record: bool) -> Load {
        let mut command = Command::new(std::env::current_exe().unwrap());
        command
            .arg("load")
            .args(["--path", path])
            .args(["--addr", &addr.to_string()])
            .args(["--connections", &connections.to_string()])
            .args(["--seconds", &seconds.to_string()])
            .args(["--cpu", &LOAD_CPU.to_string()]);
        if record {
            command.arg("--record");
        }
        Load(
            command
                .stdout(Stdio::piped())
                .spawn()
                .expect("start the load"),
        )
    }

    pub fn finish(self) -> LoadOutput {
        let output = self.0.wait_with_output().expect("the load finishes");
        assert!(output.status.success(), "the load process failed");
        let text = String::from_utf8(output.stdout).unwrap();
        let mut lines = text.lines();
        let head = lines.next().expect("a summary line");
        let field = |name: &str| -> u128 {
            head.split_whitespace()
                .find_map(|kv| kv.strip_prefix(name))
                .and_then(|v| v.strip_prefix('='))
                .expect("summary field")
                .parse()
                .unwrap()
        };
        let start_unix_ns = field("start_unix_ns");
        let latencies = lines
            .map(|line| {
                let (at, latency) = line.split_once(' ').unwrap();
                (
                    start_unix_ns + at.parse::<u128>().unwrap(),
                    Duration::from_nanos(latency.parse().unwrap()),
                )
            })
            .collect();
        LoadOutput {
            requests: field("requests") as u64,
            elapsed: Duration::from_nanos(field("elapsed_ns") as u64),
            start_unix_ns,
            latencies,
        }
    }
}

impl LoadOutput {
    pub fn per_second(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64()
    }
}

/// A fetched profile and when its last byte arrived.
pub struct Fetched {
    pub status: u16,
    pub body: Vec<u8>,
    pub sent: SystemTime,
    pub last_byte: SystemTime,
}

impl Fetched {
    /// Time from the end of the sampling window (as the profile states it) to the last byte.
    pub fn after_window(&self) -> Duration {
        let profile = decode(&self.body);
        let window_end =
            u128::try_from(profile.time_nanos + profile.duration_nanos).expect("a positive time");
        let last = unix_ns(self.last_byte);
        Duration::from_nanos(last.saturating_sub(window_end) as u64)
    }
}

pub fn fetch(addr: SocketAddr, path: &str) -> Fetched {
    let sent = SystemTime::now();
    let mut stream = TcpStream::connect(addr).expect("connect");
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).expect("read the response");
    let last_byte = SystemTime::now();
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("headers");
    let head = String::from_utf8_lossy(&raw[..end]).into_owned();
    let status = head[9..12].parse().expect("a status code");
    assert!(
        !head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked"),
        "the benchmark reads Content-Length bodies"
    );
    Fetched {
        status,
        body: raw[end + 4..].to_vec(),
        sent,
        last_byte,
    }
}

/// Waits until the service's index page shows a CPU window open (at most 10 s).
pub fn wait_for_a_window(addr: SocketAddr) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let index = fetch(addr, "/debug/pprof/");
        if String::from_utf8_lossy(&index.body).contains("1 window open") {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the profile never started"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

pub fn decode(body: &[u8]) -> pprof::protos::Profile {
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(body)
        .read_to_end(&mut raw)
        .expect("a gzipped body");
    pprof::protos::Profile::decode(raw.as_slice()).expect("a pprof body")
}

/// Req/s on `a` and on `b` in alternating 250 ms windows, per pair, from one load
/// process pinned to the load core. Both services are pinned to the same core; only the
/// one under load uses it. Pairing adjacent windows cancels the machine's drift.
pub fn alternate(a: SocketAddr, b: SocketAddr, pairs: usize, label: &str) -> Vec<(f64, f64)> {
    alternate_on(a, b, "/hello", pairs, label)
}

pub fn alternate_on(
    a: SocketAddr,
    b: SocketAddr,
    path: &str,
    pairs: usize,
    label: &str,
) -> Vec<(f64, f64)> {
    let output = Command::new(std::env::current_exe().unwrap())
        .arg("load")
        .args(["--alternate", &format!("{a},{b}")])
        .args(["--path", path])
        .args(["--window-ms", "250", "--pairs", &pairs.to_string()])
        .args(["--connections", &CONNECTIONS.to_string()])
        .args(["--cpu", &LOAD_CPU.to_string()])
        .output()
        .expect("run the alternating load");
    assert!(output.status.success(), "the load process failed");
    let pairs: Vec<(f64, f64)> = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|line| {
            let (a, b) = line.split_once(' ').unwrap();
            (
                a.parse::<f64>().unwrap() * 4.0,
                b.parse::<f64>().unwrap() * 4.0,
            )
        })
        .collect();
    let median_ratio = Ratios::of(&pairs).median;
    eprintln!(
        "{label}: {} pairs, median ratio {median_ratio:.4}",
        pairs.len()
    );
    pairs
}

/// The cargo profile this benchmark was built with: the name of the directory its binary
/// is in (`target/release/`, `target/bench-lines/`). The builds it makes itself (the heap
/// service, figure M6's apps) use the same, so that they share its dependencies' build.
/// `target/debug/` is the `dev` profile's directory.
pub fn own_profile() -> String {
    let exe = std::env::current_exe().unwrap();
    let dir = exe
        .parent()
        .and_then(|dir| dir.file_name())
        .and_then(|name| name.to_str())
        .expect("the benchmark runs from target/PROFILE/");
    if dir == "debug" { "dev" } else { dir }.to_owned()
}

/// This benchmark built with line tables (the workspace's `bench-lines` profile: release
/// with `debug = "line-tables-only"`), for figure L; returns its path. Where the
/// benchmark runs from such a build already (CI's `bench-quick`, which inherits it: one
/// build of everything, not two), itself.
pub fn build_with_lines() -> std::path::PathBuf {
    let current = std::env::current_exe().unwrap();
    if matches!(own_profile().as_str(), "bench-lines" | "bench-quick") {
        return current;
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let workspace = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let status = Command::new(cargo)
        .current_dir(workspace)
        .args(["build", "--profile", "bench-lines", "--quiet"])
        .args(["-p", "krabka-pprof-bench", "--bin", "krabka-pprof-bench"])
        .status()
        .expect("run cargo");
    assert!(
        status.success(),
        "building the benchmark with line tables failed"
    );
    // Next to the release build's own directory: target/bench-lines/.
    current
        .parent()
        .and_then(|dir| dir.parent())
        .expect("target/release/")
        .join("bench-lines")
        .join("krabka-pprof-bench")
}

/// `cargo run` builds only the benchmark's own binary; the heap service is its sibling.
pub fn build_heap_server() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .args(["build", "--quiet", "-p", "krabka-pprof-bench", "--profile"])
        .arg(own_profile())
        .args(["--bin", "krabka-pprof-bench-heap-server"])
        .status()
        .expect("run cargo");
    assert!(status.success(), "building the heap service failed");
}
