//! krabka-pprof's benchmark: `cargo run --release -p krabka-pprof-bench`.
//!
//! Measures, side by side in one run, and prints a table of medians over alternating rounds:
//!
//! - M1 resident memory of the service: before the first profile, peak during a 10 s profile
//!   at 99 Hz under load, and 2 s after the response;
//! - M2 throughput of a trivial route while a 99 Hz profile runs, against idle (M1 and M2
//!   also with 8 concurrent profiles sharing the sampler);
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
//!   and p99, as the sampler measures and reports in the profile's comments), and
//!   cross-checked from outside: a fixed workload's CPU under a 1000 Hz profile against
//!   its twin's that blocks `SIGPROF`, per sample (delivery and return included);
//! - F how soon a client that hangs up mid-profile frees the profiler: the hang-up to the
//!   next request's window opening;
//! - T a thread dump of a service with 100 parked threads: the request's time (median over
//!   rounds), the collection alone (as the dump reports it), and resident memory added;
//! - labels what labels cost: `scope` on a cache hit, `with_labels` per poll, a tracing
//!   span's enter and exit with `labels::layer()` above the registry alone, and the
//!   signal handler's cost per sample inside a `scope` above outside one;
//! - L a 10 s CPU profile of the service built with line tables (the `bench-lines`
//!   profile), as M1/M4 measure it: lines and inlined calls read from DWARF per request;
//! - K the soak: 1,000 sequential 1 s CPU profiles and 1,000 heap dumps under load, every
//!   response valid and resident memory flat after the first 50 (about 18 minutes; only
//!   with `--soak` or `--only K`);
//! - LS one session held ten minutes by two alternating scrapers on a service whose
//!   threads, libraries and children come and go: every window's CPU total, queued
//!   signals, resident memory and the handler's cost from the first minute to the last
//!   (10 minutes; only with `--soak` or `--only LS`);
//! - P the pusher (`push = true` beside the recorder, 15 s windows) over a service with
//!   4,000 distinct stacks, pushing to an OTLP and a Pyroscope receiver the benchmark
//!   serves: its thread's CPU per window, resident memory against the recorder alone,
//!   window end to arrival, bytes sent per hour;
//! - R the recorder (`recent = "10m"`): throughput with it on ÷ off, the signal handler's
//!   and the recorder thread's share of a core, a service with 2,000 distinct stacks
//!   against the memory bound; RM resident memory after ten minutes under load and two
//!   more, and `/recent?seconds=600` request → last byte (12 minutes; only with `--soak`
//!   or `--only RM`).
//!
//! Each row says whether it met its target; the benchmark exits with status 1 if any
//! did not. A ratio meets its target only where the whole 95 % interval of its median
//! is on the target's side, misses it where the whole interval is on the other, and is
//! otherwise inconclusive, saying its noise (not a pass). `--quick` prints the verdicts
//! without enforcing them: it proves the figures run, not what they measure.
//!
//! The service (`bench server`) and the load (`bench load`) are this same binary run as
//! separate processes, each pinned to its own core, talking over loopback; every load run
//! is bounded in time. `--quick` shortens everything (a smoke run, not a measurement),
//! `--only M2,M3` picks figures, `--clean-build` adds M6 from an empty target directory,
//! `--soak` adds K.
//!
//! This file holds the arguments and the run order; `harness.rs` (and `harness/`) the
//! processes and fetching, `stats.rs` the statistics, `verdict.rs` the verdicts and the
//! run's exit rule, `figures/` a file per thing measured.

mod figures;
mod harness;
mod stats;
mod system;
mod verdict;

// The attribute's modules, compiled in to time `expand` outside rustc (see
// figures/build_time.rs); each is declared here because they name one another `crate::…`.
#[path = "../../krabka-pprof-macros/src/args.rs"]
#[allow(dead_code, unreachable_pub)]
mod args;
#[path = "../../krabka-pprof-macros/src/duration.rs"]
#[allow(dead_code, unreachable_pub)]
mod duration;
#[path = "../../krabka-pprof-macros/src/expand.rs"]
#[allow(dead_code, unreachable_pub)]
mod expand;
#[path = "../../krabka-pprof-macros/src/keys.rs"]
#[allow(dead_code, unreachable_pub)]
mod keys;
#[path = "../../krabka-pprof-macros/src/placement.rs"]
#[allow(dead_code, unreachable_pub)]
mod placement;
#[path = "../../krabka-pprof-macros/src/rules.rs"]
#[allow(dead_code, unreachable_pub)]
mod rules;
#[path = "../../krabka-pprof-macros/src/size.rs"]
#[allow(dead_code, unreachable_pub)]
mod size;
#[path = "../../krabka-pprof-macros/src/values.rs"]
#[allow(dead_code, unreachable_pub)]
mod values;

use std::io::Write as _;
use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

use figures::{Row, Verdict};
use harness::{LOAD_CPU, SERVER_CPU, load, server, unix_ns};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("server") => {
            let mounted = if args.iter().any(|a| a == "--plain") {
                server::Mounted::Plain
            } else if args.iter().any(|a| a == "--push") {
                server::Mounted::Pusher
            } else if args.iter().any(|a| a == "--recent") {
                server::Mounted::Recorder
            } else {
                server::Mounted::Attribute
            };
            let current_thread = args.iter().any(|a| a == "--current-thread");
            let cpu = flag_value(&args, "--cpu").map(|v| v.parse().expect("--cpu N"));
            let spin =
                flag_value(&args, "--spin-depth").map(|v| v.parse().expect("--spin-depth N"));
            let spin_in_scope = args.iter().any(|a| a == "--spin-in-scope");
            let spin_fat = args.iter().any(|a| a == "--spin-fat");
            let busy = flag_value(&args, "--busy").map_or(0, |v| v.parse().expect("--busy N"));
            let parked =
                flag_value(&args, "--parked").map_or(0, |v| v.parse().expect("--parked N"));
            let churn = args.iter().any(|a| a == "--churn");
            let varied = flag_value(&args, "--varied").map(|v| v.parse().expect("--varied N"));
            let workers =
                flag_value(&args, "--workers").map_or(1, |v| v.parse().expect("--workers N"));
            let pool_idle =
                flag_value(&args, "--pool-idle").map_or(0, |v| v.parse().expect("--pool-idle N"));
            let blocked_polls = args.iter().any(|a| a == "--blocked-polls");
            server::serve(server::Serve {
                mounted,
                current_thread,
                cpu,
                spin_depth: spin,
                spin_in_scope,
                spin_fat,
                busy,
                parked,
                churn,
                varied,
                workers,
                pool_idle,
                blocked_polls,
            });
        }
        Some("load") => load_command(&args),
        Some("--help" | "-h") => {
            println!(
                "usage: krabka-pprof-bench [--quick] [--only M1,M2,M3,M4,M5,M6,V,H,S,F,T,W,L,labels,K,LS,R,RM,P] [--clean-build] [--soak]"
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

struct Options {
    quick: bool,
    only: Option<Vec<String>>,
    clean_build: bool,
    soak: bool,
}

impl Options {
    fn from_args(args: &[String]) -> Options {
        Options {
            quick: args.iter().any(|a| a == "--quick"),
            only: flag_value(args, "--only")
                .map(|v| v.split(',').map(|s| s.trim().to_uppercase()).collect()),
            clean_build: args.iter().any(|a| a == "--clean-build"),
            soak: args.iter().any(|a| a == "--soak"),
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
    let soak = options.soak
        || options
            .only
            .as_ref()
            .is_some_and(|o| o.iter().any(|f| f == "K"));
    // Each figure's time (its own builds included), so that CI's cost can be read.
    let mut lap = {
        let mut since = std::time::Instant::now();
        move |id: &str| {
            eprintln!("{id}: took {:.0} s", since.elapsed().as_secs_f64());
            since = std::time::Instant::now();
        }
    };
    if options.wants("H") || soak {
        harness::build_heap_server();
        lap("the heap service's build");
    }
    let mut rows = Vec::new();
    if options.wants("M1") || options.wants("M4") {
        figures::cpu_profile_cost::memory_and_latency(options, &mut rows);
        lap("M1/M4");
    }
    if options.wants("M1") {
        rows.extend(figures::cpu_profile_cost::memory_with_windows(options, 8));
        lap("M1 (8 windows)");
    }
    if options.wants("M2") {
        rows.push(figures::throughput_while_profiling::profiling_overhead(
            options, 1,
        ));
        rows.push(figures::throughput_while_profiling::profiling_overhead(
            options, 8,
        ));
        lap("M2");
    }
    if options.wants("M3") {
        rows.extend(figures::throughput_idle_attribute::idle_overhead(options));
        lap("M3");
    }
    if options.wants("M5") {
        rows.extend(figures::current_thread_latency::current_thread_latency(
            options,
        ));
        lap("M5");
    }
    if options.wants("V") {
        rows.extend(figures::views::view_times(options));
        lap("V");
    }
    if options.wants("H") {
        rows.extend(figures::heap::heap_figures(options));
        lap("H");
    }
    if options.wants("S") {
        rows.extend(figures::handler_cost::handler_cost(options));
        lap("S");
    }
    if options.wants("F") {
        rows.extend(figures::hang_up::hang_up(options));
        lap("F");
    }
    if options.wants("T") {
        rows.extend(figures::thread_dump::thread_dumps(options));
        lap("T");
    }
    if options.wants("W") {
        rows.extend(figures::wall::wall(options));
        lap("W");
    }
    if options.wants("LABELS") {
        rows.extend(figures::labels_cost::labels_cost(options));
        lap("LABELS");
    }
    if options.wants("L") {
        rows.extend(figures::lines::lines(options));
        lap("L");
    }
    if options.wants("R") {
        rows.extend(figures::recorder::recorder(options));
        lap("R");
    }
    if options.wants("P") {
        rows.extend(figures::push::push(options));
        lap("P");
    }
    if options.wants("M6") {
        rows.extend(figures::build_time::build_cost(options));
        lap("M6");
    }
    if soak {
        rows.extend(figures::soak::soak(options));
        lap("soak");
    }
    if options.soak
        || options
            .only
            .as_ref()
            .is_some_and(|o| o.iter().any(|f| f == "LS"))
    {
        rows.extend(figures::long_session::long_session(options));
    }
    if options.soak
        || options
            .only
            .as_ref()
            .is_some_and(|o| o.iter().any(|f| f == "RM"))
    {
        rows.extend(figures::recorder::recorder_residency(options));
    }

    let width = rows.iter().map(|r| r.figure.len()).max().unwrap_or(10);
    println!();
    println!(
        "| id | {:width$} | target | measured |",
        "figure (medians of alternating rounds)"
    );
    println!("|---|{}|---|---|", "-".repeat(width + 2));
    for row in &rows {
        let mark = match row.verdict {
            Verdict::Missed => " **missed**".to_owned(),
            Verdict::Inconclusive { noise } => {
                format!(" **inconclusive** (noise ± {})", noise_text(noise, ""))
            }
            Verdict::Met | Verdict::NoTarget => String::new(),
        };
        println!(
            "| {} | {:width$} | {} | {}{mark} |",
            row.id, row.figure, row.target, row.measured
        );
    }
    let with = |wanted: fn(&Verdict) -> bool| -> Vec<&Row> {
        rows.iter().filter(|r| wanted(&r.verdict)).collect()
    };
    let missed = with(|v| *v == Verdict::Missed);
    let inconclusive = with(|v| matches!(v, Verdict::Inconclusive { .. }));
    let met = with(|v| *v == Verdict::Met).len();
    println!();
    let judged = met + missed.len() + inconclusive.len();
    if missed.is_empty() && inconclusive.is_empty() {
        println!("{met} figures with a target: all met.");
    } else {
        println!(
            "{judged} figures with a target: {met} met, {} missed, {} inconclusive (the \
             target within the run's own noise: no evidence either way):",
            missed.len(),
            inconclusive.len()
        );
        for row in missed.iter().chain(&inconclusive) {
            let verdict = match row.verdict {
                Verdict::Inconclusive { noise } => {
                    format!("inconclusive, noise ± {}", noise_text(noise, ""))
                }
                _ => "missed".to_owned(),
            };
            println!(
                "  {} {}: {} (target {}): {verdict}",
                row.id, row.figure, row.measured, row.target
            );
        }
    }
    if options.quick {
        // One short round per figure: its verdicts are printed, not enforced. What this
        // run proves is that every figure still runs to its end.
        println!("--quick: a smoke run; the verdicts above are not a measurement.");
    }
    if verdict::fails(&rows, options.quick) {
        std::process::exit(1);
    }
}

/// A noise half-width as the table prints it, in `unit`.
fn noise_text(noise: f64, unit: &str) -> String {
    if noise.is_finite() {
        format!("{noise:.3} {unit}").trim_end().to_owned()
    } else {
        "∞ (too few rounds for an interval)".to_owned()
    }
}
