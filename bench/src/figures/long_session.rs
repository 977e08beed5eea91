//! LS: one sampler session held for ten minutes by two scrapers whose 14 s windows
//! alternate (each starts when the other is halfway), on a service that lives as services
//! do for hours: 100 threads a second come and go, a library is loaded and unloaded every
//! second, a child forked and exec'd every five. Every window's Σ `cpu/nanoseconds`
//! against the process's CPU over the window (from `/proc/PID/stat`, outside the sampler,
//! at the request and when the window closes by the benchmark's clock); `SigQ` and
//! resident memory over the run; the handler's median and p99 in the first minute's
//! windows against the last minute's.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::Options;
use crate::figures::{MB, Row, Verdict};
use crate::harness::{Server, decode, fetch};
use crate::stats::median;
use crate::system;

/// One scraper's window, as the benchmark saw it.
struct Scraped {
    /// Seconds since the run began, at the request.
    at: f64,
    /// Σ cpu/nanoseconds ÷ the process's CPU over the request.
    ratio: f64,
    /// The handler's median and p99, as the window's profile states them.
    handler: (u64, u64),
}

pub fn long_session(options: &Options) -> Vec<Row> {
    let run = if options.quick {
        Duration::from_secs(60)
    } else {
        Duration::from_secs(600)
    };
    let window = 14;
    let server = Server::start_churning();
    let pid = server.pid();
    let addr = server.addr;
    let started = Instant::now();
    let scraper = move |offset: Duration| {
        std::thread::spawn(move || {
            std::thread::sleep(offset);
            let mut scraped = Vec::new();
            while started.elapsed() + Duration::from_secs(window) < run {
                scraped.push(scrape(addr, pid, window, started));
            }
            scraped
        })
    };
    let first = scraper(Duration::ZERO);
    let second = scraper(Duration::from_secs(window / 2));
    // Memory and queued signals, every 5 s.
    let mut readings: Vec<(f64, f64, u64)> = Vec::new();
    while started.elapsed() < run {
        std::thread::sleep(Duration::from_secs(5));
        readings.push((
            started.elapsed().as_secs_f64(),
            system::rss(pid) as f64,
            sigq(pid),
        ));
    }
    let mut scraped = first.join().expect("the first scraper");
    scraped.extend(second.join().expect("the second scraper"));
    scraped.sort_by(|a, b| a.at.total_cmp(&b.at));
    let minute = 60.0;
    let end = started.elapsed().as_secs_f64();
    let worst = scraped
        .iter()
        .map(|s| (s.ratio - 1.0).abs())
        .fold(0.0, f64::max);
    let after_first_minute: Vec<&(f64, f64, u64)> =
        readings.iter().filter(|(t, _, _)| *t >= minute).collect();
    let rss_then = after_first_minute.first().map_or(0.0, |r| r.1);
    let rss_growth = median(
        readings
            .iter()
            .filter(|(t, _, _)| *t >= end - minute)
            .map(|r| r.1)
            .collect(),
    ) - median(
        readings
            .iter()
            .filter(|(t, _, _)| *t >= minute && *t < 2.0 * minute)
            .map(|r| r.1)
            .collect(),
    );
    let sigq_values: Vec<u64> = readings.iter().map(|r| r.2).collect();
    let (sigq_min, sigq_max) = (
        sigq_values.iter().copied().min().unwrap_or(0),
        sigq_values.iter().copied().max().unwrap_or(0),
    );
    let sigq_first_minute = median(
        readings
            .iter()
            .filter(|(t, _, _)| *t < minute)
            .map(|r| r.2 as f64)
            .collect(),
    );
    let sigq_last_minute = median(
        readings
            .iter()
            .filter(|(t, _, _)| *t >= end - minute)
            .map(|r| r.2 as f64)
            .collect(),
    );
    let handler_in = |from: f64, to: f64| {
        let inside: Vec<&Scraped> = scraped
            .iter()
            .filter(|s| s.at >= from && s.at < to)
            .collect();
        (
            median(inside.iter().map(|s| s.handler.0 as f64).collect()),
            median(inside.iter().map(|s| s.handler.1 as f64).collect()),
        )
    };
    let (first_median, first_p99) = handler_in(0.0, minute);
    let (last_median, last_p99) = handler_in(end - minute - f64::from(window as u32), end);
    eprintln!(
        "LS: {} windows in {end:.0} s; Σ/CPU {:.3}..{:.3}; RSS {:.1} MB after a minute; SigQ {sigq_min}..{sigq_max}",
        scraped.len(),
        scraped
            .iter()
            .map(|s| s.ratio)
            .fold(f64::INFINITY, f64::min),
        scraped.iter().map(|s| s.ratio).fold(0.0, f64::max),
        rss_then / MB,
    );
    let unchanged = |first: f64, last: f64| last <= first * 1.25 + 200.0;
    vec![
        Row {
            id: "LS",
            figure: format!(
                "one session held {:.0} min by two alternating scrapers ({window} s windows), 100 threads/s, dlopen/dlclose, fork+exec: every window's Σ cpu/nanoseconds ÷ process CPU",
                run.as_secs_f64() / 60.0
            ),
            target: "within 10 %",
            measured: format!(
                "{} windows, worst {:+.1} %",
                scraped.len(),
                100.0
                    * scraped
                        .iter()
                        .map(|s| s.ratio - 1.0)
                        .fold(0.0, |w: f64, d| if d.abs() > w.abs() { d } else { w })
            ),
            verdict: Verdict::at_most(worst, 0.10),
        },
        Row {
            id: "LS",
            figure: "the same: SigQ (signals queued for the user), first minute → last (median)"
                .to_owned(),
            target: "flat",
            measured: format!(
                "{sigq_first_minute:.0} → {sigq_last_minute:.0} (range {sigq_min}..{sigq_max})"
            ),
            verdict: Verdict::at_most(sigq_last_minute - sigq_first_minute, 1.0),
        },
        Row {
            id: "LS",
            figure: "the same: resident memory, last minute − second minute (medians)".to_owned(),
            target: "≤ 1 MB",
            measured: format!(
                "{:+.2} MB ({:.1} MB after the first minute)",
                rss_growth / MB,
                rss_then / MB
            ),
            verdict: Verdict::at_most(rss_growth, MB),
        },
        Row {
            id: "LS",
            figure: "the same: signal handler median / p99, first minute's windows → last minute's"
                .to_owned(),
            target: "unchanged (≤ +25 % + 0.2 µs)",
            measured: format!(
                "{first_median:.0} / {first_p99:.0} ns → {last_median:.0} / {last_p99:.0} ns"
            ),
            verdict: if unchanged(first_median, last_median) && unchanged(first_p99, last_p99) {
                Verdict::Met
            } else {
                Verdict::Missed
            },
        },
    ]
}

/// One window of `seconds`, with the process's CPU over the window by the benchmark's own
/// clock: read when the request is sent and again `seconds` later, when the window closes
/// (the answer's rendering and symbolizing come after that, outside the window, and are
/// not CPU the window could have sampled).
fn scrape(addr: SocketAddr, pid: u32, seconds: u64, started: Instant) -> Scraped {
    let at = started.elapsed().as_secs_f64();
    let sent = Instant::now();
    let cpu_before = process_cpu(pid);
    let closing = std::thread::spawn(move || {
        std::thread::sleep(
            (sent + Duration::from_secs(seconds)).saturating_duration_since(Instant::now()),
        );
        process_cpu(pid)
    });
    let fetched = fetch(addr, &format!("/debug/pprof/profile?seconds={seconds}"));
    let over_request = process_cpu(pid) - cpu_before;
    let cpu = closing.join().expect("the closing reading") - cpu_before;
    assert_eq!(
        fetched.status,
        200,
        "LS window at {at:.0} s: {}",
        String::from_utf8_lossy(&fetched.body)
    );
    let profile = decode(&fetched.body);
    let column = profile
        .sample_type
        .iter()
        .position(|t| profile.string_table[t.ty as usize] == "cpu")
        .expect("a cpu column");
    let sampled: i64 = profile.sample.iter().map(|s| s.value[column]).sum();
    let handler = profile
        .comment
        .iter()
        .map(|&i| profile.string_table[i as usize].as_str())
        .find_map(|c| c.strip_prefix("signal handler: median "))
        .and_then(|rest| {
            let (median, rest) = rest.split_once(" ns, p99 ")?;
            let (p99, _) = rest.split_once(" ns")?;
            Some((median.parse().ok()?, p99.parse().ok()?))
        })
        .unwrap_or((0, 0));
    let stated = profile
        .comment
        .iter()
        .map(|&i| profile.string_table[i as usize].as_str())
        .find_map(|c| c.strip_prefix("process CPU time over the window: "))
        .unwrap_or("?");
    eprintln!(
        "LS window at {at:.0} s: sampled {} ms; process CPU {} ms over the window, {} ms over the request; the profile says {stated}",
        sampled / 1_000_000,
        cpu.as_millis(),
        over_request.as_millis(),
    );
    Scraped {
        at,
        ratio: sampled as f64 / cpu.as_nanos().max(1) as f64,
        handler,
    }
}

/// The process's user and system CPU so far, from `/proc/PID/stat` (clock ticks).
fn process_cpu(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("read stat");
    let rest = &stat[stat.rfind(')').expect("a stat line") + 1..];
    let fields: Vec<u64> = rest
        .split_ascii_whitespace()
        .skip(11)
        .take(2)
        .map(|f| f.parse().expect("a tick count"))
        .collect();
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_nanos((fields[0] + fields[1]) * (1_000_000_000 / per_second))
}

/// `SigQ:` of a process: signals queued for its user.
fn sigq(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .expect("read status")
        .lines()
        .find_map(|line| line.strip_prefix("SigQ:"))
        .and_then(|value| value.trim().split('/').next()?.parse().ok())
        .expect("SigQ in status")
}
