//! M5: worst latency on a `current_thread` runtime while a profile starts and finishes.

use std::time::{Duration, SystemTime};

use crate::Options;
use crate::figures::{Row, Verdict};
use crate::harness::{Load, Server, fetch, unix_ns};
use crate::stats::median;

/// M5: worst latency of `/hello` on a current_thread runtime (one closed-loop connection)
/// in the 100 ms after a profile request is sent (the sampler starts within the first few
/// milliseconds), and from 20 ms before its window ends to 50 ms after its response
/// (stopping, symbolizing, encoding); the same windows in a round without a profile.
/// Narrow windows, because this machine adds 1-4 ms spikes at random, profile or not.
pub fn current_thread_latency(options: &Options) -> Vec<Row> {
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
            verdict: Verdict::at_most(s, bs + 2.0),
        },
        Row {
            id: "M5",
            figure: "current_thread: worst latency while a profile finishes (baseline)".into(),
            target: "≤ baseline + 2 ms",
            measured: format!("{f:.2} ms ({bf:.2} ms)"),
            verdict: Verdict::at_most(f, bf + 2.0),
        },
    ]
}
