//! krabka-pprof's benchmark: `cargo run --release -p krabka-pprof-bench`.
//!
//! Measures, side by side in one run, and prints a table of medians over alternating rounds:
//!
//! - M1 resident memory of the service: before the first profile, peak during a 10 s profile
//!   at 99 Hz under load, and 2 s after the response;
//! - M2 throughput of a trivial route while a 99 Hz profile runs, against idle;
//! - M3 throughput with the attribute mounted but idle, against the same app without it;
//! - M4 time from the end of the sampling window to the last byte of the response, for the
//!   first request of a process and for later ones;
//! - M5 worst latency of another route on a `current_thread` runtime while a profile starts
//!   and finishes, against the same windows without a profile;
//! - M6 release build time of a small app using the attribute against the same app
//!   registering the routes by hand, and the attribute's expansion time;
//! - V the time each view (pprof, svg, text) of a 10 s CPU profile takes after its window;
//! - H heap dump time and memory, and the throughput cost of jemalloc's sampling;
//! - S the signal handler's cost per sample on a thread spinning 30 frames deep (median
//!   and p99, as the sampler measures and reports in the profile's comments).
//!
//! The service (`bench server`) and the load (`bench load`) are this same binary run as
//! separate processes, each pinned to its own core, talking over loopback; every load run
//! is bounded in time. `--quick` shortens everything (a smoke run, not a measurement),
//! `--only M2,M3` picks figures, `--clean-build` adds M6 from an empty target directory.

mod expansion;
mod load;
mod server;
mod system;

// The attribute's modules, compiled in to time `expand` outside rustc (see expansion.rs).
#[path = "../../krabka-pprof-macros/src/args.rs"]
#[allow(dead_code, unreachable_pub)]
mod args;
#[path = "../../krabka-pprof-macros/src/duration.rs"]
#[allow(dead_code, unreachable_pub)]
mod duration;
#[path = "../../krabka-pprof-macros/src/expand.rs"]
#[allow(dead_code, unreachable_pub)]
mod expand;
#[path = "../../krabka-pprof-macros/src/rules.rs"]
#[allow(dead_code, unreachable_pub)]
mod rules;

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use pprof::protos::Message as _;

const SERVER_CPU: usize = 1;
/// Keep-alive connections of the throughput load: enough to keep the service's core busy.
const CONNECTIONS: usize = 8;
const LOAD_CPU: usize = 0;
const MB: f64 = 1024.0 * 1024.0;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("server") => {
            let attribute = !args.iter().any(|a| a == "--plain");
            let current_thread = args.iter().any(|a| a == "--current-thread");
            let cpu = flag_value(&args, "--cpu").map(|v| v.parse().expect("--cpu N"));
            let spin =
                flag_value(&args, "--spin-depth").map(|v| v.parse().expect("--spin-depth N"));
            server::serve(attribute, current_thread, cpu, spin);
        }
        Some("load") => load_command(&args),
        Some("--help" | "-h") => {
            println!(
                "usage: krabka-pprof-bench [--quick] [--only M1,M2,M3,M4,M5,M6,V,H,S] [--clean-build]"
            );
        }
        _ => {
            let options = Options::from_args(&args);
            run(&options);
        }
    }
}

fn flag_value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

/// `bench load --addr A --path P --connections N --seconds S [--cpu C] [--record]`: prints
/// `requests=N elapsed_ns=E start_unix_ns=T`, then `offset_ns latency_ns` per request if
/// `--record`.
fn load_command(args: &[String]) {
    if let Some(cpu) = flag_value(args, "--cpu") {
        system::pin_to_cpu(cpu.parse().expect("--cpu N"));
    }
    if let Some(pair) = flag_value(args, "--alternate") {
        let (a, b) = pair.split_once(',').expect("--alternate A,B");
        let window = flag_value(args, "--window-ms").map_or(250, |v| v.parse().unwrap());
        let pairs = flag_value(args, "--pairs").map_or(100, |v| v.parse().unwrap());
        let connections = flag_value(args, "--connections").map_or(8, |v| v.parse().unwrap());
        let path = flag_value(args, "--path").unwrap_or("/hello");
        let counts = load::run_alternating(
            a.parse().unwrap(),
            b.parse().unwrap(),
            path,
            connections,
            Duration::from_millis(window),
            pairs,
        );
        let mut out = std::io::stdout().lock();
        for (a, b) in counts {
            writeln!(out, "{a} {b}").unwrap();
        }
        return;
    }
    let addr: SocketAddr = flag_value(args, "--addr").expect("--addr").parse().unwrap();
    let path = flag_value(args, "--path").unwrap_or("/hello");
    let connections = flag_value(args, "--connections").map_or(4, |v| v.parse().unwrap());
    let seconds: f64 = flag_value(args, "--seconds").map_or(5.0, |v| v.parse().unwrap());
    let record = args.iter().any(|a| a == "--record");
    let start_unix = unix_ns(SystemTime::now());
    let result = load::run(
        addr,
        path,
        connections,
        Duration::from_secs_f64(seconds),
        record,
    );
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "requests={} elapsed_ns={} start_unix_ns={start_unix}",
        result.requests,
        result.elapsed.as_nanos()
    )
    .unwrap();
    for (at, latency) in result.latencies {
        writeln!(out, "{} {}", at.as_nanos(), latency.as_nanos()).unwrap();
    }
}

fn unix_ns(t: SystemTime) -> u128 {
    t.duration_since(UNIX_EPOCH).unwrap().as_nanos()
}

struct Options {
    quick: bool,
    only: Option<Vec<String>>,
    clean_build: bool,
}

impl Options {
    fn from_args(args: &[String]) -> Options {
        Options {
            quick: args.iter().any(|a| a == "--quick"),
            only: flag_value(args, "--only")
                .map(|v| v.split(',').map(|s| s.trim().to_uppercase()).collect()),
            clean_build: args.iter().any(|a| a == "--clean-build"),
        }
    }

    fn wants(&self, figure: &str) -> bool {
        self.only
            .as_ref()
            .is_none_or(|only| only.iter().any(|f| f == figure))
    }

    fn secs(&self, full: f64) -> f64 {
        if self.quick {
            (full / 4.0).max(1.0)
        } else {
            full
        }
    }

    fn rounds(&self, full: usize) -> usize {
        if self.quick { 1 } else { full }
    }
}

/// A service process, killed on drop.
struct Server {
    child: Child,
    addr: SocketAddr,
}

impl Server {
    fn start(attribute: bool, current_thread: bool) -> Server {
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

    /// The jemalloc service of `src/bin/heap_server.rs`, with `_RJEM_MALLOC_CONF`.
    fn start_heap(conf: Option<&str>) -> Server {
        let exe = std::env::current_exe()
            .unwrap()
            .with_file_name("krabka-pprof-bench-heap-server");
        let mut command = Command::new(exe);
        command
            .args(["--cpu", &SERVER_CPU.to_string()])
            .env_remove("MALLOC_CONF")
            .env_remove("_RJEM_MALLOC_CONF");
        if let Some(conf) = conf {
            command.env("_RJEM_MALLOC_CONF", conf);
        }
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

    fn pid(&self) -> u32 {
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
struct Load(Child);

struct LoadOutput {
    requests: u64,
    elapsed: Duration,
    start_unix_ns: u128,
    /// `(unix ns at start, latency)`.
    latencies: Vec<(u128, Duration)>,
}

impl Load {
    fn start(addr: SocketAddr, connections: usize, seconds: f64, record: bool) -> Load {
        let mut command = Command::new(std::env::current_exe().unwrap());
        command
            .arg("load")
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

    fn finish(self) -> LoadOutput {
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
    fn per_second(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64()
    }
}

/// A fetched profile and when its last byte arrived.
struct Fetched {
    status: u16,
    body: Vec<u8>,
    sent: SystemTime,
    last_byte: SystemTime,
}

impl Fetched {
    /// Time from the end of the sampling window (as the profile states it) to the last byte.
    fn after_window(&self) -> Duration {
        let profile = decode(&self.body);
        let window_end =
            u128::try_from(profile.time_nanos + profile.duration_nanos).expect("a positive time");
        let last = unix_ns(self.last_byte);
        Duration::from_nanos(last.saturating_sub(window_end) as u64)
    }
}

fn fetch(addr: SocketAddr, path: &str) -> Fetched {
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

fn decode(body: &[u8]) -> pprof::protos::Profile {
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(body)
        .read_to_end(&mut raw)
        .expect("a gzipped body");
    pprof::protos::Profile::decode(raw.as_slice()).expect("a pprof body")
}

fn median(mut values: Vec<f64>) -> f64 {
    assert!(!values.is_empty());
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

/// One line of the final table.
struct Row {
    id: &'static str,
    figure: String,
    target: &'static str,
    measured: String,
}

fn run(options: &Options) {
    assert!(
        system::cpus() >= 2,
        "the benchmark pins the service and the load to separate cores; it needs 2 CPUs"
    );
    eprintln!(
        "krabka-pprof benchmark{}: service on CPU {SERVER_CPU}, load on CPU {LOAD_CPU}",
        if options.quick {
            " (--quick: a smoke run, not a measurement)"
        } else {
            ""
        }
    );
    if options.wants("H") {
        build_heap_server();
    }
    let mut rows = Vec::new();
    if options.wants("M1") || options.wants("M4") {
        memory_and_latency(options, &mut rows);
    }
    if options.wants("M2") {
        rows.push(profiling_overhead(options));
    }
    if options.wants("M3") {
        rows.extend(idle_overhead(options));
    }
    if options.wants("M5") {
        rows.extend(current_thread_latency(options));
    }
    if options.wants("V") {
        rows.extend(view_times(options));
    }
    if options.wants("H") {
        rows.extend(heap_figures(options));
    }
    if options.wants("S") {
        rows.extend(handler_cost(options));
    }
    if options.wants("M6") {
        rows.extend(build_cost(options));
    }

    let width = rows.iter().map(|r| r.figure.len()).max().unwrap_or(10);
    println!();
    println!(
        "| id | {:width$} | target | measured |",
        "figure (medians of alternating rounds)"
    );
    println!("|---|{}|---|---|", "-".repeat(width + 2));
    for row in rows {
        println!(
            "| {} | {:width$} | {} | {} |",
            row.id, row.figure, row.target, row.measured
        );
    }
}

/// `cargo run` builds only the benchmark's own binary; the heap service is its sibling.
fn build_heap_server() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .args(["build", "--release", "--quiet", "-p", "krabka-pprof-bench"])
        .args(["--bin", "krabka-pprof-bench-heap-server"])
        .status()
        .expect("run cargo");
    assert!(status.success(), "building the heap service failed");
}

/// M1 and M4: fresh service per round, 4-connection load throughout.
fn memory_and_latency(options: &Options, rows: &mut Vec<Row>) {
    let window = options.secs(10.0).round() as u64;
    let later_window = options.secs(3.0).round() as u64;
    let (mut before, mut peak, mut after) = (Vec::new(), Vec::new(), Vec::new());
    let (mut first, mut later) = (Vec::new(), Vec::new());
    for round in 0..options.rounds(3) {
        let server = Server::start(true, false);
        let pid = server.pid();
        let total = 2.0 + window as f64 + 2.0 + 2.0 * (later_window as f64 + 0.5) + 2.0;
        let load = Load::start(server.addr, CONNECTIONS, total, false);
        std::thread::sleep(Duration::from_secs(2));
        let rss_before = system::rss(pid);
        system::reset_peak(pid);
        let profile = fetch(
            server.addr,
            &format!("/debug/pprof/profile?seconds={window}"),
        );
        assert_eq!(
            profile.status,
            200,
            "{}",
            String::from_utf8_lossy(&profile.body)
        );
        let rss_peak = system::peak_rss(pid);
        first.push(profile.after_window().as_secs_f64() * 1e3);
        std::thread::sleep(Duration::from_secs(2));
        let rss_after = system::rss(pid);
        for _ in 0..2 {
            let profile = fetch(
                server.addr,
                &format!("/debug/pprof/profile?seconds={later_window}"),
            );
            assert_eq!(profile.status, 200);
            later.push(profile.after_window().as_secs_f64() * 1e3);
        }
        let load = load.finish();
        eprintln!(
            "M1/M4 round {round}: RSS {:.1} MB before, {:.1} MB peak, {:.1} MB after; \
             first profile ready {:.1} ms after its window ({:.0} req/s load, {} B profile)",
            rss_before as f64 / MB,
            rss_peak as f64 / MB,
            rss_after as f64 / MB,
            first.last().unwrap(),
            load.per_second(),
            profile.body.len(),
        );
        before.push(rss_before as f64);
        peak.push(rss_peak as f64 - rss_before as f64);
        after.push(rss_after as f64 - rss_before as f64);
    }
    if options.wants("M1") {
        rows.push(Row {
            id: "M1",
            figure: "RSS before the first profile".into(),
            target: "—",
            measured: format!("{:.1} MB", median(before) / MB),
        });
        rows.push(Row {
            id: "M1",
            figure: format!("RSS growth, peak during a {window} s 99 Hz profile under load"),
            target: "≤ 8 MB",
            measured: format!("{:+.1} MB", median(peak) / MB),
        });
        rows.push(Row {
            id: "M1",
            figure: "RSS growth retained 2 s after the response".into(),
            target: "≤ 2 MB",
            measured: format!("{:+.1} MB", median(after) / MB),
        });
    }
    if options.wants("M4") {
        rows.push(Row {
            id: "M4",
            figure: format!("window end → last byte, first request ({window} s profile)"),
            target: "≤ 25 ms",
            measured: format!("{:.1} ms", median(first)),
        });
        rows.push(Row {
            id: "M4",
            figure: format!("window end → last byte, later requests ({later_window} s profiles)"),
            target: "≤ 25 ms",
            measured: format!("{:.1} ms", median(later)),
        });
    }
}

/// Req/s on `a` and on `b` in alternating 250 ms windows, per pair, from one load
/// process pinned to the load core. Both services are pinned to the same core; only the
/// one under load uses it. Pairing adjacent windows cancels the machine's drift.
fn alternate(a: SocketAddr, b: SocketAddr, pairs: usize, label: &str) -> Vec<(f64, f64)> {
    alternate_on(a, b, "/hello", pairs, label)
}

fn alternate_on(
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
    let (median_ratio, _) = ratio_summary(&pairs);
    eprintln!(
        "{label}: {} pairs, median ratio {median_ratio:.4}",
        pairs.len()
    );
    pairs
}

/// Median and interquartile range of per-pair ratios, formatted.
fn ratio_summary(pairs: &[(f64, f64)]) -> (f64, String) {
    let mut ratios: Vec<f64> = pairs.iter().map(|(a, b)| a / b).collect();
    ratios.sort_by(f64::total_cmp);
    let q = |f: f64| ratios[((ratios.len() - 1) as f64 * f).round() as usize];
    let median = median(ratios.clone());
    (
        median,
        format!(
            "{median:.4} (IQR {:.3}–{:.3}, {} pairs)",
            q(0.25),
            q(0.75),
            ratios.len()
        ),
    )
}

/// M2: req/s of a service while a 99 Hz profile runs on it, against an identical idle
/// service, in alternating 250 ms windows. A profile costs CPU only while the process
/// runs, so the profiled service pays for sampling exactly during its own windows. The
/// two processes swap roles every round, so a difference between them cancels out.
fn profiling_overhead(options: &Options) -> Row {
    let servers = [Server::start(true, false), Server::start(true, false)];
    for server in &servers {
        Load::start(server.addr, CONNECTIONS, 1.0, false).finish();
    }
    let pairs_per_round = if options.quick { 8 } else { 60 };
    let mut pairs = Vec::new();
    for round in 0..options.rounds(4) {
        let (profiled, idle) = (&servers[round % 2], &servers[1 - round % 2]);
        // One profile covering this round's windows (0.5 s per pair), with margin.
        let seconds = (pairs_per_round as u64).div_ceil(2) + 2;
        let addr = profiled.addr;
        let profile = std::thread::spawn(move || {
            fetch(addr, &format!("/debug/pprof/profile?seconds={seconds}"))
        });
        std::thread::sleep(Duration::from_millis(500));
        pairs.extend(alternate(profiled.addr, idle.addr, pairs_per_round, "M2"));
        let profile = profile.join().unwrap();
        assert_eq!(
            profile.status,
            200,
            "{}",
            String::from_utf8_lossy(&profile.body)
        );
    }
    let (_, summary) = ratio_summary(&pairs);
    Row {
        id: "M2",
        figure: format!(
            "req/s while profiling at 99 Hz ÷ idle ({:.0} req/s idle)",
            mean(&pairs, |p| p.1)
        ),
        target: "≥ 0.98",
        measured: summary,
    }
}

fn mean(pairs: &[(f64, f64)], side: fn(&(f64, f64)) -> f64) -> f64 {
    pairs.iter().map(side).sum::<f64>() / pairs.len() as f64
}

/// M3: req/s with the attribute mounted and idle against the same app without it; fresh
/// processes every other round. Also the method's noise floor: two identical services.
fn idle_overhead(options: &Options) -> Vec<Row> {
    // Short rounds of fresh processes: a process's memory layout alone moves its
    // throughput by a percent or two here, so many processes average it out.
    let pairs_per_round = if options.quick { 8 } else { 30 };
    let (mut pairs, mut floor) = (Vec::new(), Vec::new());
    for round in 0..options.rounds(8) {
        let with = Server::start(true, false);
        let without = Server::start(false, false);
        for server in [&with, &without] {
            Load::start(server.addr, CONNECTIONS, 1.0, false).finish();
        }
        pairs.extend(alternate(with.addr, without.addr, pairs_per_round, "M3"));
        if round % 2 == 0 {
            let twin = Server::start(false, false);
            Load::start(twin.addr, CONNECTIONS, 1.0, false).finish();
            floor.extend(alternate(twin.addr, without.addr, pairs_per_round, "A/A"));
        }
    }
    let (_, summary) = ratio_summary(&pairs);
    let (_, floor_summary) = ratio_summary(&floor);
    vec![
        Row {
            id: "M3",
            figure: format!(
                "req/s with the attribute idle ÷ without ({:.0} req/s without)",
                mean(&pairs, |p| p.1)
            ),
            target: "≥ 0.995",
            measured: summary,
        },
        Row {
            id: "—",
            figure: "noise floor: two identical services, same method (A/A)".into(),
            target: "1",
            measured: floor_summary,
        },
    ]
}

/// M5: worst latency of `/hello` on a current_thread runtime (one closed-loop connection)
/// in the 100 ms after a profile request is sent (the sampler starts within the first few
/// milliseconds), and from 20 ms before its window ends to 50 ms after its response
/// (stopping, symbolizing, encoding); the same windows in a round without a profile.
/// Narrow windows, because this machine adds 1-4 ms spikes at random, profile or not.
fn current_thread_latency(options: &Options) -> Vec<Row> {
    let window = 3u64;
    let (mut base_start, mut base_finish) = (Vec::new(), Vec::new());
    let (mut start, mut finish) = (Vec::new(), Vec::new());
    for round in 0..options.rounds(5) {
        for with_profile in [false, true] {
            let server = Server::start(true, true);
            Load::start(server.addr, 1, 1.0, false).finish();
            let probe = Load::start(server.addr, 1, 6.0, true);
            std::thread::sleep(Duration::from_secs(1));
            let (sent, done) = if with_profile {
                let f = fetch(
                    server.addr,
                    &format!("/debug/pprof/profile?seconds={window}"),
                );
                assert_eq!(f.status, 200);
                (unix_ns(f.sent), unix_ns(f.last_byte))
            } else {
                let sent = unix_ns(SystemTime::now());
                std::thread::sleep(Duration::from_secs(window));
                (sent, unix_ns(SystemTime::now()))
            };
            let probe = probe.finish();
            assert!(probe.start_unix_ns < sent);
            let worst = |from: u128, to: u128| {
                probe
                    .latencies
                    .iter()
                    .filter(|(at, latency)| *at + latency.as_nanos() >= from && *at <= to)
                    .map(|(at, latency)| (latency.as_secs_f64() * 1e3, *at as f64 - sent as f64))
                    .fold((0.0, 0.0), |a, b| if b.0 > a.0 { b } else { a })
            };
            let window_end = sent + u128::from(window) * 1_000_000_000;
            let (s, s_at) = worst(sent, sent + 100_000_000);
            let (f, f_at) = worst(window_end - 20_000_000, done.max(window_end) + 50_000_000);
            eprintln!(
                "M5 round {round}: {} worst {s:.2} ms at start (+{:.1} ms), {f:.2} ms at finish (+{:.1} ms) ({} probes)",
                if with_profile { "profiled" } else { "baseline" },
                s_at / 1e6,
                f_at / 1e6,
                probe.latencies.len()
            );
            if with_profile {
                start.push(s);
                finish.push(f);
            } else {
                base_start.push(s);
                base_finish.push(f);
            }
        }
    }
    let (bs, bf, s, f) = (
        median(base_start),
        median(base_finish),
        median(start),
        median(finish),
    );
    vec![
        Row {
            id: "M5",
            figure: "current_thread: worst latency while a profile starts (baseline)".into(),
            target: "≤ baseline + 2 ms",
            measured: format!("{s:.2} ms ({bs:.2} ms)"),
        },
        Row {
            id: "M5",
            figure: "current_thread: worst latency while a profile finishes (baseline)".into(),
            target: "≤ baseline + 2 ms",
            measured: format!("{f:.2} ms ({bf:.2} ms)"),
        },
    ]
}

/// V: time from the end of a 10 s window to the last byte, per view, under load.
fn view_times(options: &Options) -> Vec<Row> {
    let window = options.secs(10.0).round() as u64;
    let server = Server::start(true, false);
    let load = Load::start(
        server.addr,
        CONNECTIONS,
        (window as f64 + 1.0) * 3.0 * options.rounds(2) as f64 + 3.0,
        false,
    );
    std::thread::sleep(Duration::from_secs(1));
    let mut rows = Vec::new();
    let mut times: Vec<(&str, Vec<f64>)> =
        vec![("pprof", vec![]), ("svg", vec![]), ("text", vec![])];
    for _ in 0..options.rounds(2) {
        for (format, samples) in &mut times {
            let f = fetch(
                server.addr,
                &format!("/debug/pprof/profile?seconds={window}&format={format}"),
            );
            assert_eq!(f.status, 200, "{}", String::from_utf8_lossy(&f.body));
            let total = f.last_byte.duration_since(f.sent).unwrap();
            let after = total.saturating_sub(Duration::from_secs(window));
            eprintln!(
                "V: {format} ready {:.1} ms after its {window} s window ({} B)",
                after.as_secs_f64() * 1e3,
                f.body.len()
            );
            samples.push(after.as_secs_f64() * 1e3);
        }
    }
    drop(load.finish());
    for (format, samples) in times {
        rows.push(Row {
            id: "V",
            figure: format!(
                "{window} s CPU profile as {format}: window end → last byte (client clock)"
            ),
            target: "—",
            measured: format!("{:.1} ms", median(samples)),
        });
    }
    rows
}

/// S: the handler's own time per sample, 30-frame stacks. The sampler times every handler
/// run (`CLOCK_MONOTONIC` at entry and exit, 100 ns buckets) and writes the median and
/// p99 into the profile's comments; this reads them from 5 s profiles at 250 Hz of a
/// service whose one busy thread spins 30 frames deep (no load: every sample is that
/// thread's).
fn handler_cost(options: &Options) -> Vec<Row> {
    let window = options.secs(5.0).round().max(1.0) as u64;
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .arg("server")
        .args(["--cpu", &SERVER_CPU.to_string()])
        .args(["--spin-depth", "30"]);
    let server = Server::spawn(command);
    let (mut medians, mut tails, mut depths) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..options.rounds(3) {
        let f = fetch(
            server.addr,
            &format!("/debug/pprof/profile?seconds={window}&frequency=250"),
        );
        assert_eq!(f.status, 200, "{}", String::from_utf8_lossy(&f.body));
        let profile = decode(&f.body);
        let line = profile
            .comment
            .iter()
            .map(|i| profile.string_table[*i as usize].as_str())
            .find(|c| c.starts_with("signal handler:"))
            .expect("the profile reports the handler's cost")
            .to_owned();
        eprintln!("S: {line}");
        // "signal handler: median N ns, p99 M ns per sample, D frames on average"
        let numbers: Vec<f64> = line
            .split(|c: char| !(c.is_ascii_digit() || c == '.'))
            .filter_map(|w| w.parse().ok())
            .collect();
        medians.push(numbers[0] / 1e3);
        tails.push(numbers[2] / 1e3);
        depths.push(numbers[3]);
    }
    let depth = median(depths);
    vec![
        Row {
            id: "S",
            figure: format!("signal handler per sample, median ({depth:.0}-frame stacks mean)"),
            target: "≤ 4 µs",
            measured: format!("{:.1} µs", median(medians)),
        },
        Row {
            id: "S",
            figure: "signal handler per sample, p99".to_owned(),
            target: "—",
            measured: format!("{:.1} µs", median(tails)),
        },
    ]
}

/// H: heap dumps (issue 3) and the cost of jemalloc's sampling, on the jemalloc service.
fn heap_figures(options: &Options) -> Vec<Row> {
    let (mut first, mut later, mut peak, mut retained) = (vec![], vec![], vec![], vec![]);
    for round in 0..options.rounds(3) {
        let server = Server::start_heap(None);
        let pid = server.pid();
        Load::start(server.addr, CONNECTIONS, 1.0, false).finish();
        std::thread::sleep(Duration::from_millis(500));
        let before = system::rss(pid);
        system::reset_peak(pid);
        let dump = fetch(server.addr, "/debug/pprof/heap");
        assert_eq!(dump.status, 200, "{}", String::from_utf8_lossy(&dump.body));
        let took = dump
            .last_byte
            .duration_since(dump.sent)
            .unwrap()
            .as_secs_f64()
            * 1e3;
        let high = system::peak_rss(pid);
        std::thread::sleep(Duration::from_secs(2));
        let after = system::rss(pid);
        first.push(took);
        peak.push(high as f64 - before as f64);
        retained.push(after as f64 - before as f64);
        for _ in 0..3 {
            let dump = fetch(server.addr, "/debug/pprof/heap");
            assert_eq!(dump.status, 200);
            later.push(
                dump.last_byte
                    .duration_since(dump.sent)
                    .unwrap()
                    .as_secs_f64()
                    * 1e3,
            );
        }
        eprintln!(
            "H round {round}: first dump {took:.1} ms ({} B), RSS {:.1} MB before, {:+.1} MB peak, {:+.1} MB after 2 s",
            dump.body.len(),
            before as f64 / MB,
            (high as f64 - before as f64) / MB,
            (after as f64 - before as f64) / MB,
        );
    }
    let pairs_per_round = if options.quick { 8 } else { 30 };
    let mut pairs = Vec::new();
    for _ in 0..options.rounds(4) {
        let sampled = Server::start_heap(None);
        let unsampled = Server::start_heap(Some("prof:false"));
        for server in [&sampled, &unsampled] {
            Load::start(server.addr, CONNECTIONS, 1.0, false).finish();
        }
        pairs.extend(alternate_on(
            sampled.addr,
            unsampled.addr,
            "/alloc",
            pairs_per_round,
            "H",
        ));
    }
    let (_, sampling) = ratio_summary(&pairs);
    vec![
        Row {
            id: "H",
            figure: "heap dump (64 MiB live from 16 sites): request → last byte, first".into(),
            target: "—",
            measured: format!("{:.1} ms", median(first)),
        },
        Row {
            id: "H",
            figure: "heap dump: request → last byte, later".into(),
            target: "—",
            measured: format!("{:.1} ms", median(later)),
        },
        Row {
            id: "H",
            figure: "RSS growth during the first heap dump, peak (retained 2 s later)".into(),
            target: "—",
            measured: format!(
                "{:+.1} MB ({:+.1} MB)",
                median(peak) / MB,
                median(retained) / MB
            ),
        },
        Row {
            id: "H",
            figure: "req/s of an allocating route, 512 KiB sampling on ÷ prof:false".into(),
            target: "—",
            measured: sampling,
        },
    ]
}

/// M6: build cost of the attribute.
fn build_cost(options: &Options) -> Vec<Row> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let build = |package: &str, target_dir: Option<&std::path::Path>| -> f64 {
        let mut command = Command::new(&cargo);
        command
            .current_dir(&root)
            .args(["build", "--release", "--quiet", "-p", package]);
        if let Some(dir) = target_dir {
            command.arg("--target-dir").arg(dir);
        }
        let started = Instant::now();
        let status = command.status().expect("run cargo");
        assert!(status.success(), "cargo build -p {package} failed");
        started.elapsed().as_secs_f64()
    };
    let touch = |package: &str| {
        let dir = if package.ends_with("attr") {
            "with-attr"
        } else {
            "by-hand"
        };
        let path = root.join("bench/apps").join(dir).join("src/main.rs");
        let file = std::fs::File::options().append(true).open(&path).unwrap();
        file.set_modified(SystemTime::now()).unwrap();
    };
    let packages = ["bench-app-with-attr", "bench-app-by-hand"];
    for package in packages {
        build(package, None);
    }
    let (mut with, mut by_hand) = (Vec::new(), Vec::new());
    for round in 0..options.rounds(3) {
        let order = if round % 2 == 0 {
            packages
        } else {
            [packages[1], packages[0]]
        };
        for package in order {
            touch(package);
            let seconds = build(package, None);
            eprintln!("M6 round {round}: rebuilt {package} in {seconds:.2} s");
            if package.ends_with("attr") {
                with.push(seconds)
            } else {
                by_hand.push(seconds)
            }
        }
    }
    let (w, h) = (median(with), median(by_hand));
    let expansion = expansion::median_expansion_time(options.rounds(9), 200);
    let mut rows = vec![
        Row {
            id: "M6",
            figure: format!(
                "release build of the app crate, attribute ÷ by hand ({w:.2} s / {h:.2} s)"
            ),
            target: "≤ 1.05",
            measured: format!("{:.3}", w / h),
        },
        Row {
            id: "M6",
            figure: "expansion of one attribute (proc-macro2 fallback, outside rustc)".into(),
            target: "≤ 5 ms",
            measured: format!("{:.3} ms", expansion.as_secs_f64() * 1e3),
        },
    ];
    if options.clean_build {
        let mut clean = [0.0f64; 2];
        for (i, package) in packages.iter().enumerate() {
            let dir = std::env::temp_dir().join(format!("krabka-bench-clean-{package}"));
            let _ = std::fs::remove_dir_all(&dir);
            clean[i] = build(package, Some(&dir));
            let _ = std::fs::remove_dir_all(&dir);
            eprintln!("M6 clean: {package} in {:.1} s", clean[i]);
        }
        rows.push(Row {
            id: "M6",
            figure: format!(
                "clean release build, attribute ÷ by hand ({:.1} s / {:.1} s)",
                clean[0], clean[1]
            ),
            target: "≤ 1.05",
            measured: format!("{:.3}", clean[0] / clean[1]),
        });
    }
    rows
}
