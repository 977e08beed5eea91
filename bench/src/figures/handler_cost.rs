//! S: the signal handler's own cost per sample, as the sampler reports it, and the same
//! cost from outside the handler: the CPU a fixed workload takes under a profile at the
//! top frequency against its unprofiled twin, per sample.

use std::time::{Duration, Instant};

use crate::Options;
use crate::figures::{Row, Verdict};
use crate::harness::{Server, decode, fetch, wait_for_a_window};
use crate::stats::{Spread, median};

/// S: the handler's own time per sample, 30-frame stacks. The sampler times every handler
/// run (`CLOCK_MONOTONIC` at entry and exit, 100 ns buckets) and writes the median and
/// p99 into the profile's comments; this reads them from 5 s profiles at 250 Hz of a
/// service whose one busy thread spins 30 frames deep (no load: every sample is that
/// thread's).
pub fn handler_cost(options: &Options) -> Vec<Row> {
    let window = options.secs(5.0).round().max(1.0) as u64;
    let server = Server::start_spinning(30);
    let (mut medians, mut tails, mut depths) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..options.rounds(3) {
        let cost = handler_line(&server, window, 250);
        medians.push(cost.median_us);
        tails.push(cost.p99_us);
        depths.push(cost.depth);
    }
    let depth = median(depths);
    let handler = median(medians);
    drop(server);
    let outside = outside_cost(options);
    let deep = deep_stack_cost(options, window);
    let crowded = crowded_cost(options);
    let mut rows = vec![
        Row {
            id: "S",
            figure: format!("signal handler per sample, median ({depth:.0}-frame stacks mean)"),
            target: "≤ 4 µs",
            measured: format!("{handler:.1} µs"),
            verdict: Verdict::at_most(handler, 4.0),
        },
        Row {
            id: "S",
            figure: "signal handler per sample, p99".to_owned(),
            target: "—",
            measured: format!("{:.1} µs", median(tails)),
            verdict: Verdict::NoTarget,
        },
    ];
    rows.extend(deep);
    rows.push(crowded);
    rows.push(Row {
        id: "S",
        figure: "per sample from outside: a 30-frame workload's CPU at 1000 Hz − its \
                 SIGPROF-blocking twin's (delivery, handler, return)"
            .to_owned(),
        target: "—",
        measured: format!(
            "{:.1} µs, 95 % ± {} ({} rounds; the handler's own clock {handler:.1} µs; the \
             twins' difference without a profile, subtracted: {:+.1} µs per sample)",
            outside.per_sample.median,
            crate::noise_text(outside.per_sample.noise(), "µs"),
            outside.per_sample.count(),
            outside.unprofiled_per_sample,
        ),
        verdict: Verdict::NoTarget,
    });
    rows
}

/// What a profile's comments say of the handler.
struct HandlerLine {
    median_us: f64,
    p99_us: f64,
    depth: f64,
    /// Stacks unwound, and of those read without a system call.
    unwound: u64,
    direct: u64,
    /// The profile's samples.
    samples: i64,
}

/// A `window`-second profile of `server` at `frequency`, and what its comments say of the
/// handler.
fn handler_line(server: &Server, window: u64, frequency: u32) -> HandlerLine {
    let f = fetch(
        server.addr,
        &format!("/debug/pprof/profile?seconds={window}&frequency={frequency}"),
    );
    assert_eq!(f.status, 200, "{}", String::from_utf8_lossy(&f.body));
    let profile = decode(&f.body);
    let comment = |prefix: &str| {
        profile
            .comment
            .iter()
            .map(|i| profile.string_table[*i as usize].as_str())
            .find(|c| c.contains(prefix))
            .unwrap_or_else(|| panic!("the profile says {prefix:?}"))
            .to_owned()
    };
    let numbers = |line: &str| -> Vec<f64> {
        line.split(|c: char| !(c.is_ascii_digit() || c == '.'))
            .filter_map(|w| w.parse().ok())
            .collect()
    };
    // "signal handler: median N ns, p99 M ns per sample, D frames on average"
    let handler = comment("signal handler:");
    eprintln!("S: {handler}");
    let cost = numbers(&handler);
    // "U stacks unwound: C to their outermost frame, D read without a system call"
    let reads = numbers(&comment("stacks unwound:"));
    HandlerLine {
        median_us: cost[0] / 1e3,
        p99_us: cost[2] / 1e3,
        depth: cost[3],
        unwound: reads[0] as u64,
        direct: reads[2] as u64,
        samples: profile.sample.iter().map(|s| s.value[0]).sum(),
    }
}

/// The handler on a deep async-like stack: 150 frames of 256 bytes of locals each (about
/// 45 KB read per sample), at 250 Hz; median and p99 over the rounds' profiles.
fn deep_stack_cost(options: &Options, window: u64) -> Vec<Row> {
    let server = Server::start_spinning_fat(150);
    let (mut medians, mut tails, mut direct) = (Vec::new(), Vec::new(), Vec::new());
    let mut depth = Vec::new();
    for _ in 0..options.rounds(3) {
        let cost = handler_line(&server, window, 250);
        medians.push(cost.median_us);
        tails.push(cost.p99_us);
        depth.push(cost.depth);
        direct.push(cost.direct as f64 / cost.unwound.max(1) as f64);
    }
    let handler = median(medians);
    vec![
        Row {
            id: "S",
            figure: format!(
                "signal handler per sample, {:.0}-frame stacks of 256-byte frames (an async \
                 request's depth): median",
                median(depth)
            ),
            target: "≤ 5 µs",
            measured: format!(
                "{handler:.1} µs ({:.0} % of stacks read without a system call)",
                median(direct) * 100.0
            ),
            verdict: Verdict::at_most(handler, 5.0),
        },
        Row {
            id: "S",
            figure: "the same, p99".to_owned(),
            target: "—",
            measured: format!("{:.1} µs", median(tails)),
            verdict: Verdict::NoTarget,
        },
    ]
}

/// The sampler's own CPU in a service of 1,000 threads, 200 of them busy (sharing the
/// service's core) and 800 asleep: over a 10 s profile at 99 Hz, the CPU of its drain
/// thread (`krabka-drain`, by the kernel's clock for it) plus the handler's (its median ×
/// the samples), as a share of one core; the profile's building (`krabka-worker`) is
/// printed beside it. A 1 s profile first starts those threads.
fn crowded_cost(options: &Options) -> Row {
    let window = options.secs(10.0).round().max(2.0) as u64;
    let server = Server::start_crowded(200, 800);
    let _warm = handler_line(&server, 1, 99);
    // Three profiles, the median's figures (the handler's median alone varies two-fold
    // between profiles on a VM).
    let mut rounds: Vec<(f64, String)> = (0..options.rounds(3))
        .map(|round| crowded_round(&server, window, round))
        .collect();
    rounds.sort_by(|a, b| a.0.total_cmp(&b.0));
    let shares: Vec<String> = rounds
        .iter()
        .map(|(share, _)| format!("{share:.3}"))
        .collect();
    let (share, what) = rounds.swap_remove(rounds.len() / 2);
    Row {
        id: "S",
        figure: "sampler CPU, 1,000 threads (200 busy) at 99 Hz: its drain thread + \
                 handlers, share of a core (median profile)"
            .to_owned(),
        target: "≤ 0.5 %",
        measured: format!("{share:.3} % ({what}; all: {} %)", shares.join(", ")),
        verdict: Verdict::at_most(share, 0.5),
    }
}

/// One profile of `window` seconds of figure S's crowded service: the share of a core,
/// and what it is made of.
fn crowded_round(server: &Server, window: u64, round: usize) -> (f64, String) {
    // Per thread, the most its clock was seen at, looked at every 200 ms while the profile
    // runs: a session's drain thread exits with its session, and a sum read only at the
    // end would miss it (and could come out below the sum before).
    // By name: the drain thread's share (which grows with the threads) apart from the
    // worker's (building the profile, which grows with the samples).
    let (line, by_name) = profiler_cpu_during(server.pid(), || handler_line(server, window, 99));
    let by_name: std::collections::BTreeMap<String, f64> = by_name
        .into_iter()
        .map(|(name, cpu)| (name, cpu.as_secs_f64()))
        .collect();
    let threads: f64 = by_name.values().sum();
    // The profile's building (symbolizing, encoding, gzip: the request's, on the worker
    // when it is idle, else on the blocking pool, which is not counted) apart: it grows
    // with the stacks, and figures M2 and L measure it.
    let building = by_name.get("krabka-worker").copied().unwrap_or_default();
    let sampler = threads - building;
    let by_name: Vec<String> = by_name
        .iter()
        .map(|(name, cpu)| format!("{name} {:.1} ms", cpu * 1e3))
        .collect();
    let handlers = line.median_us * 1e-6 * line.samples as f64;
    let share = (sampler + handlers) / window as f64 * 100.0;
    eprintln!(
        "S crowded, round {}: profiler threads {:.1} ms ({}), handlers {:.1} ms ({} samples) \
         over {window} s: the sampler {share:.3} %, with the profile's building {:.3} %",
        round + 1,
        threads * 1e3,
        by_name.join(", "),
        handlers * 1e3,
        line.samples,
        (threads + handlers) / window as f64 * 100.0
    );
    (
        share,
        format!(
            "{:.1} ms of its threads, {:.1} ms of handlers in {window} s; building the \
             profile {:.1} ms more",
            sampler * 1e3,
            handlers * 1e3,
            building * 1e3
        ),
    )
}

/// Runs `f` while watching the CPU of process `pid`'s threads named `krabka-*` every 200 ms:
/// what `f` returned, and the CPU they used meanwhile, by thread name. Each thread counts
/// at the most its clock was seen at: a session's drain thread (or a wall window's sweep)
/// exits with it, and a sum read only at the end would miss it (and could come out below
/// the sum before).
pub(crate) fn profiler_cpu_during<T: Send>(
    pid: u32,
    f: impl FnOnce() -> T + Send,
) -> (T, std::collections::HashMap<String, Duration>) {
    let before = profiler_threads_cpu(pid);
    let done = std::sync::atomic::AtomicBool::new(false);
    let (out, seen) = std::thread::scope(|scope| {
        let watcher = scope.spawn(|| {
            let mut seen = before.clone();
            loop {
                let last = done.load(std::sync::atomic::Ordering::Acquire);
                for (tid, (name, cpu)) in profiler_threads_cpu(pid) {
                    let most = seen.entry(tid).or_insert((name, Duration::ZERO));
                    most.1 = most.1.max(cpu);
                }
                if last {
                    return seen;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        });
        let out = f();
        done.store(true, std::sync::atomic::Ordering::Release);
        (out, watcher.join().unwrap())
    });
    let mut by_name = std::collections::HashMap::<String, Duration>::new();
    for (tid, (name, cpu)) in seen {
        let then = before.get(&tid).map(|(_, cpu)| *cpu).unwrap_or_default();
        *by_name.entry(name).or_default() += cpu.saturating_sub(then);
    }
    (out, by_name)
}

/// The CPU so far of each of process `pid`'s threads named `krabka-*`, by the kernel's
/// clocks, with its name: `/proc/PID/task/TID/schedstat` (nanoseconds), else `stat` (clock
/// ticks, 10 ms: coarser than the figure, whose threads use tens of milliseconds).
fn profiler_threads_cpu(pid: u32) -> std::collections::HashMap<u32, (String, Duration)> {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    let mut threads = std::collections::HashMap::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let path = task.path();
        let Ok(comm) = std::fs::read_to_string(path.join("comm")) else {
            continue;
        };
        if !comm.starts_with("krabka-") {
            continue;
        }
        let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) else {
            continue;
        };
        let precise = std::fs::read_to_string(path.join("schedstat"))
            .ok()
            .and_then(|line| line.split_whitespace().next()?.parse::<u64>().ok())
            .map(Duration::from_nanos);
        let cpu = match precise {
            Some(cpu) => cpu,
            None => {
                let Ok(stat) = std::fs::read_to_string(path.join("stat")) else {
                    continue;
                };
                // Fields after the name (which ends at the last ')'): utime and stime are
                // the 12th and 13th.
                let fields: Vec<&str> = stat
                    .rsplit_once(')')
                    .map_or("", |(_, rest)| rest)
                    .split_whitespace()
                    .collect();
                let ticks = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
                Duration::from_nanos(ticks * 1_000_000_000 / hz)
            }
        };
        threads.insert(tid, (comm.trim().to_owned(), cpu));
    }
    threads
}

/// Figure S from outside the handler.
struct Outside {
    /// µs of CPU per sample: the profiled workload's CPU minus its twin's, less the same
    /// difference without a profile, over the samples the profile took of it.
    per_sample: Spread,
    /// The twins' difference without a profile, in µs per sample of the profiled rounds:
    /// the method's own bias.
    unprofiled_per_sample: f64,
}

/// Rounds of `/work` (see harness/server.rs) on a service with nothing else to do: the
/// same workload on two threads sharing the service's core, one blocking `SIGPROF`, once
/// with no profile and once inside a 1000 Hz one (capped at the tick: a few hundred
/// samples a second). The twin's CPU clock is the measure of the workload unprofiled at
/// the same moment; its difference without a profile is subtracted.
fn outside_cost(options: &Options) -> Outside {
    let server = Server::start(true, false);
    // About half a second of each thread's CPU.
    let calls = 1000;
    let work = |addr| {
        let f = fetch(addr, &format!("/work?calls={calls}"));
        assert_eq!(f.status, 200, "{}", String::from_utf8_lossy(&f.body));
        let text = String::from_utf8(f.body).unwrap();
        let field = |name: &str| -> f64 {
            text.split_whitespace()
                .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{name} in {text:?}"))
        };
        (field("work_ns"), field("blocked_ns"))
    };
    let (mut per_sample, mut unprofiled) = (Vec::new(), Vec::new());
    for round in 0..options.rounds(9) {
        let (work_a, blocked_a) = work(server.addr);
        let addr = server.addr;
        let profile = std::thread::spawn(move || {
            fetch(addr, "/debug/pprof/profile?seconds=4&frequency=1000")
        });
        wait_for_a_window(server.addr);
        let started = Instant::now();
        let (work_b, blocked_b) = work(server.addr);
        let took = started.elapsed();
        let profile = profile.join().unwrap();
        assert_eq!(profile.status, 200);
        let profile = decode(&profile.body);
        let samples = samples_of_thread(&profile, "work");
        assert!(
            took < Duration::from_secs(3),
            "the profiled workload took {took:?}, more than its window holds"
        );
        assert!(samples > 0, "the profile sampled the work thread");
        let profiled = (work_b - blocked_b) / 1e3;
        let bias = (work_a - blocked_a) / 1e3;
        eprintln!(
            "S outside, round {round}: work {:.1} ms, twin {:.1} ms profiled ({samples} \
             samples); {:.1} ms, {:.1} ms unprofiled",
            work_b / 1e6,
            blocked_b / 1e6,
            work_a / 1e6,
            blocked_a / 1e6
        );
        per_sample.push((profiled - bias) / samples as f64);
        unprofiled.push(bias / samples as f64);
    }
    Outside {
        per_sample: Spread::of_values(per_sample),
        unprofiled_per_sample: median(unprofiled),
    }
}

/// The samples whose `thread` label is `name`.
fn samples_of_thread(profile: &pprof::protos::Profile, name: &str) -> i64 {
    let string = |i: i64| profile.string_table[i as usize].as_str();
    profile
        .sample
        .iter()
        .filter(|sample| {
            sample
                .label
                .iter()
                .any(|label| string(label.key) == "thread" && string(label.str) == name)
        })
        .map(|sample| sample.value[0])
        .sum()
}
