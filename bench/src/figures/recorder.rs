//! R: what the recorder (`recent = "10m"`, 99 Hz, 8 MiB) costs the service it watches:
//! throughput with it on ÷ the same app with it off (M3's method: fresh processes, 250 ms
//! windows alternating between the two); the signal handler's share of a core, from the
//! handler's cost and the samples the recorder took, and the recorder thread's own CPU
//! from `/proc`; a service whose stacks vary (2,000 distinct) against the memory bound.
//! RM (ten minutes and more, only with `--soak` or `--only RM`): resident memory of the
//! service under load after ten minutes of history and flat after that, and
//! `/recent?seconds=600` from request to last byte once ten minutes are kept.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::Options;
use crate::figures::{MB, Row, Verdict, ratio_row};
use crate::harness::{CONNECTIONS, Load, Server, alternate, decode, fetch};
use crate::stats::{Ratios, median};
use crate::system;

/// The recorder's bound unless `recent_memory` says otherwise.
const BOUND: f64 = 8.0 * MB;

pub fn recorder(options: &Options) -> Vec<Row> {
    let mut rows = vec![throughput(options)];
    rows.extend(handler_share(options));
    rows.extend(varied_stacks(options));
    rows
}

/// R: req/s with the recorder on ÷ the same app with it off.
fn throughput(options: &Options) -> Row {
    let pairs_per_round = if options.quick { 8 } else { 30 };
    let mut pairs = Vec::new();
    for _ in 0..options.rounds(8) {
        let on = Server::start_recording(None);
        let off = Server::start(true, false);
        for server in [&on, &off] {
            Load::start(server.addr, CONNECTIONS, 1.0, false).finish();
        }
        pairs.extend(alternate(on.addr, off.addr, pairs_per_round, "R"));
    }
    let without = pairs.iter().map(|p| p.1).sum::<f64>() / pairs.len().max(1) as f64;
    ratio_row(
        "R",
        format!("req/s with the recorder on (99 Hz) ÷ off ({without:.0} req/s off)"),
        "≥ 0.98",
        0.98,
        &Ratios::of(&pairs),
    )
}

/// The numbers of a comment line, in order.
fn numbers(line: &str) -> Vec<f64> {
    line.split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .filter_map(|w| w.parse().ok())
        .collect()
}

fn comment<'p>(profile: &'p pprof::protos::Profile, starts: &str) -> Option<&'p str> {
    profile
        .comment
        .iter()
        .map(|i| profile.string_table[*i as usize].as_str())
        .find(|c| c.starts_with(starts))
}

/// CPU time of the process's thread named `name`, from `/proc` (`schedstat`: the
/// scheduler's own count, in nanoseconds).
pub fn thread_cpu(pid: u32, name: &str) -> Option<Duration> {
    for entry in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let path = entry.ok()?.path();
        let comm = std::fs::read_to_string(path.join("comm")).ok()?;
        if comm.trim() != name {
            continue;
        }
        let schedstat = std::fs::read_to_string(path.join("schedstat")).ok()?;
        let nanos = schedstat.split_whitespace().next()?.parse().ok()?;
        return Some(Duration::from_nanos(nanos));
    }
    None
}

/// R: the handler's share of a core at 99 Hz, under load, and the recorder thread's.
fn handler_share(options: &Options) -> Vec<Row> {
    let seconds = options.secs(30.0).round().max(5.0) as u64;
    let server = Server::start_recording(None);
    let load = Load::start(server.addr, CONNECTIONS, seconds as f64, false);
    // The recorder's own thread (slices) and its session's drain thread (drains), which
    // starts with the recorder's first session, a tick after the server.
    let seated = Instant::now() + Duration::from_secs(30);
    while thread_cpu(server.pid(), "krabka-drain").is_none() {
        assert!(
            Instant::now() < seated,
            "the recorder's session never started"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let threads = || {
        thread_cpu(server.pid(), "krabka-recorder").expect("the recorder's thread")
            + thread_cpu(server.pid(), "krabka-drain").expect("the session's drain thread")
    };
    let before = threads();
    let started = Instant::now();
    let _ = load.finish();
    let recorder_cpu = threads() - before;
    let wall = started.elapsed();
    let f = fetch(
        server.addr,
        &format!("/debug/pprof/recent?seconds={seconds}"),
    );
    assert_eq!(f.status, 200, "{}", String::from_utf8_lossy(&f.body));
    let profile = decode(&f.body);
    let samples: i64 = profile.sample.iter().map(|s| s.value[0]).sum();
    let covered = profile.duration_nanos as f64 / 1e9;
    let handler = numbers(comment(&profile, "signal handler:").expect("the handler's cost"));
    // "signal handler: median N ns, p99 M ns per sample, …": the 99 of "p99" is a number.
    let (p50, p99) = (handler[0], handler[2]);
    let per_second = samples as f64 / covered;
    let share = per_second * p50 / 1e9 * 100.0;
    let share_p99 = per_second * p99 / 1e9 * 100.0;
    let thread = recorder_cpu.as_secs_f64() / wall.as_secs_f64() * 100.0;
    eprintln!(
        "R: {samples} samples in {covered:.1} s, handler median {p50} ns, p99 {p99} ns; \
         recorder and drain threads {recorder_cpu:?} in {wall:?}"
    );
    vec![
        Row {
            id: "R",
            figure: format!(
                "signal handler's share of a core under load, 99 Hz ({per_second:.0} samples/s \
                 × median; × p99)"
            ),
            target: "≤ 0.1 %",
            measured: format!("{share:.3} % ({share_p99:.3} %)"),
            verdict: Verdict::at_most(share, 0.1),
        },
        Row {
            id: "R",
            figure: "the recorder's threads (slices; the session's drains), share of a core \
                     under load"
                .into(),
            target: "—",
            measured: format!(
                "{thread:.2} % ({} ms in {:.0} s)",
                recorder_cpu.as_millis(),
                wall.as_secs_f64()
            ),
            verdict: Verdict::NoTarget,
        },
    ]
}

/// The recorder's counted bytes and distinct stacks, as the index page states them.
fn kept(addr: SocketAddr) -> (f64, usize) {
    let index = String::from_utf8(fetch(addr, "/debug/pprof/").body).unwrap();
    let after = index
        .split("sampled), ")
        .nth(1)
        .expect("the recorder's row");
    let (used, rest) = after.split_once(" of the ").unwrap();
    let stacks = rest
        .split_once("allowed, ")
        .and_then(|(_, s)| s.split_once(' '))
        .map_or(0, |(n, _)| n.parse().unwrap_or(0));
    let parse = |text: &str| -> f64 {
        for (unit, size) in [
            ("GiB", 1u64 << 30),
            ("MiB", 1 << 20),
            ("KiB", 1 << 10),
            ("B", 1),
        ] {
            if let Some(number) = text.strip_suffix(unit) {
                return number.parse::<f64>().unwrap() * size as f64;
            }
        }
        panic!("not a size: {text}")
    };
    (parse(used), stacks)
}

/// R: a service whose busy thread cycles through 2,000 distinct stacks, the recorder
/// keeping its history: counted bytes against the bound, and resident memory.
fn varied_stacks(options: &Options) -> Vec<Row> {
    // Quick: one step after the first 10 s, enough to see the code run to its end.
    let run = Duration::from_secs_f64(if options.quick { 20.0 } else { 180.0 });
    let server = Server::start_recording(Some(2000));
    let started = Instant::now();
    std::thread::sleep(Duration::from_secs(10));
    let rss_start = system::rss(server.pid()) as f64;
    let (mut most, mut stacks) = (0.0f64, 0);
    while started.elapsed() < run {
        std::thread::sleep(Duration::from_secs(10));
        let (bytes, distinct) = kept(server.addr);
        most = most.max(bytes);
        stacks = stacks.max(distinct);
    }
    let rss_end = system::rss(server.pid()) as f64;
    let f = fetch(server.addr, "/debug/pprof/recent?seconds=600");
    assert_eq!(f.status, 200);
    let profile = decode(&f.body);
    let span = profile.duration_nanos as f64 / 1e9;
    vec![Row {
        id: "R",
        figure: format!(
            "{stacks} distinct stacks, {span:.0} s kept: counted bytes, most (resident memory \
             growth from 10 s to {:.0} s)",
            run.as_secs_f64()
        ),
        target: "≤ 8 MiB",
        measured: format!(
            "{:.2} MiB ({:+.2} MB)",
            most / MB,
            (rss_end - rss_start) / MB
        ),
        verdict: Verdict::at_most(most, BOUND),
    }]
}

/// RM: ten minutes under load, then two more with nothing asked of the recorder (so the
/// flatness is the history's, not the allocator's high-water mark after a request); then,
/// still under load, five `/recent?seconds=600` and the memory they leave behind.
pub fn recorder_residency(options: &Options) -> Vec<Row> {
    let (ten, more) = if options.quick {
        (Duration::from_secs(60), Duration::from_secs(20))
    } else {
        (Duration::from_secs(600), Duration::from_secs(120))
    };
    let asking = Duration::from_secs(40);
    let server = Server::start_recording(None);
    let pid = server.pid();
    std::thread::sleep(Duration::from_secs(2));
    let rss_idle = system::rss(pid) as f64;
    let load = Load::start(
        server.addr,
        CONNECTIONS,
        (ten + more + asking).as_secs_f64(),
        false,
    );
    let started = Instant::now();
    let mut readings: Vec<(f64, f64)> = Vec::new();
    while started.elapsed() < ten + more {
        std::thread::sleep(Duration::from_secs(5));
        readings.push((started.elapsed().as_secs_f64(), system::rss(pid) as f64));
    }
    let before_asking = system::rss(pid) as f64;
    let mut under_load = Vec::new();
    while under_load.len() < 5 {
        let f = fetch(server.addr, "/debug/pprof/recent?seconds=600");
        assert_eq!(f.status, 200);
        under_load.push(duration_ms(&f));
        std::thread::sleep(Duration::from_secs(5));
    }
    let after_asking = system::rss(pid) as f64;
    let _ = load.finish();
    let (bytes, stacks) = kept(server.addr);
    let around = |at: f64| {
        median(
            readings
                .iter()
                .filter(|(t, _)| (*t - at).abs() <= 15.0)
                .map(|r| r.1)
                .collect(),
        )
    };
    let at_ten = around(ten.as_secs_f64());
    let at_end = around((ten + more).as_secs_f64() - 15.0);
    // Once the load is gone, as a person asks.
    let idle: Vec<f64> = (0..7)
        .map(|_| {
            let f = fetch(server.addr, "/debug/pprof/recent?seconds=600");
            assert_eq!(f.status, 200);
            duration_ms(&f)
        })
        .collect();
    let covered = decode(&fetch(server.addr, "/debug/pprof/recent?seconds=600").body).duration_nanos
        as f64
        / 1e9;
    let latency = median(idle.clone());
    vec![
        Row {
            id: "RM",
            figure: format!(
                "resident memory after {:.0} min under load ({:.1} MB idle at start; history \
                 {bytes:.0} B counted, {stacks} stacks)",
                ten.as_secs_f64() / 60.0,
                rss_idle / MB
            ),
            target: "≤ start + 8 MiB",
            measured: format!(
                "{:.1} MB ({:+.1} MB)",
                at_ten / MB,
                (at_ten - rss_idle) / MB
            ),
            verdict: Verdict::at_most(at_ten - rss_idle, BOUND),
        },
        Row {
            id: "RM",
            figure: format!(
                "resident memory {:.0} min later, against the {:.0}-minute mark",
                more.as_secs_f64() / 60.0,
                ten.as_secs_f64() / 60.0
            ),
            target: "≤ +0.5 MB",
            measured: format!("{:+.2} MB", (at_end - at_ten) / MB),
            verdict: Verdict::at_most(at_end - at_ten, 0.5 * MB),
        },
        Row {
            id: "RM",
            figure: "resident memory after five /recent?seconds=600 under load, against before \
                     them (the allocator keeps what a request used for the next)"
                .to_owned(),
            target: "—",
            measured: format!("{:+.2} MB", (after_asking - before_asking) / MB),
            verdict: Verdict::NoTarget,
        },
        Row {
            id: "RM",
            figure: format!(
                "/recent?seconds=600 ({covered:.0} s kept), request → last byte, median of 7 \
                 (max; the first under load, median)"
            ),
            target: "≤ 30 ms",
            measured: format!(
                "{latency:.1} ms ({:.1} ms; {:.1} ms)",
                idle.iter().copied().fold(0.0, f64::max),
                median(under_load)
            ),
            verdict: Verdict::at_most(latency, 30.0),
        },
    ]
}

fn duration_ms(f: &crate::harness::Fetched) -> f64 {
    f.last_byte
        .duration_since(f.sent)
        .unwrap_or_default()
        .as_secs_f64()
        * 1e3
}
