//! L: a CPU profile of the service built with line tables, the way
//! krabka-pprof/docs/release-builds.md tells users to build for lines
//! (`debug = "line-tables-only"` in the release profile): the same
//! rounds as M1/M4, so the difference is what reading DWARF costs.

use std::time::Duration;

use crate::Options;
use crate::figures::{MB, Row, Verdict};
use crate::harness::{CONNECTIONS, Load, Server, decode, fetch};
use crate::stats::median;
use crate::system;

/// L: fresh service (built with line tables) per round, under the 8-connection load; a
/// 10 s 99 Hz profile: window end to last byte, resident memory added at peak and 2 s
/// after the response.
pub fn lines(options: &Options) -> Vec<Row> {
    let exe = crate::harness::build_with_lines();
    let window = options.secs(10.0).round() as u64;
    let (mut late, mut peak, mut after) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..options.rounds(3) {
        let server = Server::start_exe(&exe);
        let pid = server.pid();
        let load = Load::start(server.addr, CONNECTIONS, 2.0 + window as f64 + 4.0, false);
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
        std::thread::sleep(Duration::from_secs(2));
        let rss_after = system::rss(pid);
        let load = load.finish();
        let decoded = decode(&profile.body);
        let with_lines = decoded
            .location
            .iter()
            .filter(|l| l.line.iter().any(|line| line.line > 0))
            .count();
        let inlined = decoded.location.iter().filter(|l| l.line.len() > 1).count();
        let deepest = decoded
            .location
            .iter()
            .map(|l| l.line.len())
            .max()
            .unwrap_or(0);
        late.push(profile.after_window().as_secs_f64() * 1e3);
        peak.push(rss_peak.saturating_sub(rss_before) as f64);
        after.push(rss_after.saturating_sub(rss_before) as f64);
        eprintln!(
            "L round {round}: {} locations, {with_lines} with lines, {inlined} with inlined \
             calls (up to {deepest} functions deep); ready {:.1} ms after its window; RSS \
             {:.1} MB before, {:+.2} MB peak, {:+.2} MB 2 s after ({:.0} req/s load, {} B \
             profile)",
            decoded.location.len(),
            late.last().unwrap(),
            rss_before as f64 / MB,
            peak.last().unwrap() / MB,
            after.last().unwrap() / MB,
            load.per_second(),
            profile.body.len(),
        );
    }
    let (late, peak, after) = (median(late), median(peak), median(after));
    vec![
        Row {
            id: "L",
            figure: format!(
                "with line tables: window end → last byte ({window} s profile, first request)"
            ),
            target: "≤ 50 ms",
            measured: format!("{late:.1} ms"),
            verdict: Verdict::at_most(late, 50.0),
        },
        Row {
            id: "L",
            figure: "with line tables: RSS growth, peak during the profile".into(),
            target: "≤ 16 MB",
            measured: format!("{:+.1} MB", peak / MB),
            verdict: Verdict::at_most(peak, 16.0 * MB),
        },
        Row {
            id: "L",
            figure: "with line tables: RSS growth retained 2 s after the response".into(),
            target: "≤ 2 MB",
            measured: format!("{:+.1} MB", after / MB),
            verdict: Verdict::at_most(after, 2.0 * MB),
        },
    ]
}
