//! M1 (resident memory around a profile) and M4 (window end to last byte), measured in
//! the same rounds of a fresh service under load.

use std::time::Duration;

use crate::Options;
use crate::figures::{MB, Row, Verdict};
use crate::harness::{CONNECTIONS, Load, Server, fetch};
use crate::stats::median;
use crate::system;

/// M1 and M4: fresh service per round, 4-connection load throughout.
pub fn memory_and_latency(options: &Options, rows: &mut Vec<Row>) {
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
    let (peak, after, first, later) = (median(peak), median(after), median(first), median(later));
    if options.wants("M1") {
        rows.push(Row {
            id: "M1",
            figure: "RSS before the first profile".into(),
            target: "—",
            measured: format!("{:.1} MB", median(before) / MB),
            verdict: Verdict::NoTarget,
        });
        rows.push(Row {
            id: "M1",
            figure: format!("RSS growth, peak during a {window} s 99 Hz profile under load"),
            target: "≤ 8 MB",
            measured: format!("{:+.1} MB", peak / MB),
            verdict: Verdict::at_most(peak, 8.0 * MB),
        });
        rows.push(Row {
            id: "M1",
            figure: "RSS growth retained 2 s after the response".into(),
            target: "≤ 2 MB",
            measured: format!("{:+.1} MB", after / MB),
            verdict: Verdict::at_most(after, 2.0 * MB),
        });
    }
    if options.wants("M4") {
        rows.push(Row {
            id: "M4",
            figure: format!("window end → last byte, first request ({window} s profile)"),
            target: "≤ 25 ms",
            measured: format!("{first:.1} ms"),
            verdict: Verdict::at_most(first, 25.0),
        });
        rows.push(Row {
            id: "M4",
            figure: format!("window end → last byte, later requests ({later_window} s profiles)"),
            target: "≤ 25 ms",
            measured: format!("{later:.1} ms"),
            verdict: Verdict::at_most(later, 25.0),
        });
    }
}

/// M1 with `windows` concurrent profiles of the same length sharing the sampler: resident
/// memory added at peak and 2 s after, on a fresh service under load per round.
pub fn memory_with_windows(options: &Options, windows: usize) -> Vec<Row> {
    let window = options.secs(10.0).round() as u64;
    let (mut peak, mut after) = (Vec::new(), Vec::new());
    for round in 0..options.rounds(3) {
        let server = Server::start(true, false);
        let pid = server.pid();
        let load = Load::start(server.addr, CONNECTIONS, 2.0 + window as f64 + 4.0, false);
        std::thread::sleep(Duration::from_secs(2));
        let rss_before = system::rss(pid);
        system::reset_peak(pid);
        // Arrivals 100 ms apart, as people and scrapers would, each its own window.
        let fetches: Vec<_> = (0..windows)
            .map(|i| {
                let addr = server.addr;
                std::thread::sleep(Duration::from_millis(if i == 0 { 0 } else { 100 }));
                std::thread::spawn(move || {
                    fetch(addr, &format!("/debug/pprof/profile?seconds={window}"))
                })
            })
            .collect();
        for fetched in fetches {
            let fetched = fetched.join().unwrap();
            assert_eq!(
                fetched.status,
                200,
                "{}",
                String::from_utf8_lossy(&fetched.body)
            );
        }
        let rss_peak = system::peak_rss(pid);
        std::thread::sleep(Duration::from_secs(2));
        let rss_after = system::rss(pid);
        drop(load.finish());
        eprintln!(
            "M1 ({windows} windows) round {round}: RSS {:.1} MB before, {:+.1} MB peak, {:+.1} MB after 2 s",
            rss_before as f64 / MB,
            (rss_peak as f64 - rss_before as f64) / MB,
            (rss_after as f64 - rss_before as f64) / MB,
        );
        peak.push(rss_peak as f64 - rss_before as f64);
        after.push(rss_after as f64 - rss_before as f64);
    }
    let (peak, after) = (median(peak), median(after));
    vec![
        Row {
            id: "M1",
            figure: format!(
                "RSS growth, peak during {windows} concurrent {window} s 99 Hz profiles under load"
            ),
            target: "≤ 8 MB",
            measured: format!("{:+.1} MB", peak / MB),
            verdict: Verdict::at_most(peak, 8.0 * MB),
        },
        // For context: the target for concurrent windows is on the peak (issue 11).
        Row {
            id: "M1",
            figure: format!("RSS growth retained 2 s after {windows} concurrent profiles"),
            target: "—",
            measured: format!("{:+.1} MB", after / MB),
            verdict: Verdict::NoTarget,
        },
    ]
}
