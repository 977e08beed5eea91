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
    let handler = median(medians);
    drop(server);
    let outside = outside_cost(options);
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
