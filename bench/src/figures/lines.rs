//! L: a CPU profile of the service built with line tables, the way
//! krabka-pprof/docs/release-builds.md tells users to build for lines
//! (`debug = "line-tables-only"` in the release profile): the same
//! rounds as M1/M4, so the difference is what reading DWARF costs. Resident memory is
//! also split into file-backed and anonymous pages at their peaks (`VmHWM` has no such
//! split), sampled every millisecond while the profile is asked for: pages of a mapped
//! file are what a container's memory graph shows as a spike on every scrape.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::Options;
use crate::figures::{MB, Row, Verdict};
use crate::harness::{CONNECTIONS, Load, Server, decode, fetch};
use crate::stats::median;
use crate::system;

/// L: fresh service (built with line tables) per round, under the 8-connection load; a
/// 10 s 99 Hz profile: window end to last byte, resident memory added at peak (all of it,
/// and its file-backed and anonymous parts) and 2 s after the response.
pub fn lines(options: &Options) -> Vec<Row> {
    let exe = crate::harness::build_with_lines();
    let window = options.secs(10.0).round() as u64;
    let (mut late, mut peak, mut after) = (Vec::new(), Vec::new(), Vec::new());
    let (mut file_peak, mut anon_peak) = (Vec::new(), Vec::new());
    for round in 0..options.rounds(3) {
        let server = Server::start_exe(&exe);
        let pid = server.pid();
        let load = Load::start(server.addr, CONNECTIONS, 2.0 + window as f64 + 4.0, false);
        std::thread::sleep(Duration::from_secs(2));
        let rss_before = system::rss(pid);
        let split_before = Split::of(pid);
        system::reset_peak(pid);
        let sampling = SplitPeaks::start(pid);
        let profile = fetch(
            server.addr,
            &format!("/debug/pprof/profile?seconds={window}"),
        );
        let split_peak = sampling.finish();
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
        file_peak.push(split_peak.file.saturating_sub(split_before.file) as f64);
        anon_peak.push(split_peak.anon.saturating_sub(split_before.anon) as f64);
        eprintln!(
            "L round {round}: {} locations, {with_lines} with lines, {inlined} with inlined \
             calls (up to {deepest} functions deep); ready {:.1} ms after its window; RSS \
             {:.1} MB before, {:+.2} MB peak (file-backed {:+.2} MB, anonymous {:+.2} MB), \
             {:+.2} MB 2 s after ({:.0} req/s load, {} B profile)",
            decoded.location.len(),
            late.last().unwrap(),
            rss_before as f64 / MB,
            peak.last().unwrap() / MB,
            file_peak.last().unwrap() / MB,
            anon_peak.last().unwrap() / MB,
            after.last().unwrap() / MB,
            load.per_second(),
            profile.body.len(),
        );
    }
    let (late, peak, after) = (median(late), median(peak), median(after));
    let (file_peak, anon_peak) = (median(file_peak), median(anon_peak));
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
            figure: "with line tables: file-backed RSS growth, peak (sampled every ms)".into(),
            target: "≤ 2 MB",
            measured: format!("{:+.1} MB", file_peak / MB),
            verdict: Verdict::at_most(file_peak, 2.0 * MB),
        },
        Row {
            id: "L",
            figure: "with line tables: anonymous RSS growth, peak (sampled every ms)".into(),
            target: "—",
            measured: format!("{:+.1} MB", anon_peak / MB),
            verdict: Verdict::NoTarget,
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

/// A process's resident memory, split: pages backed by files (its binary's code, and any
/// file it maps) and anonymous pages (heap, stacks, anonymous maps), in bytes.
#[derive(Clone, Copy, Default)]
struct Split {
    file: u64,
    anon: u64,
}

impl Split {
    /// `RssFile` and `RssAnon` from one reading of `/proc/PID/status`.
    fn of(pid: u32) -> Split {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read status");
        let kib = |field: &str| -> u64 {
            status
                .lines()
                .find_map(|line| line.strip_prefix(field))
                .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
                .unwrap_or_else(|| panic!("{field} in /proc/{pid}/status"))
        };
        Split {
            file: kib("RssFile:") * 1024,
            anon: kib("RssAnon:") * 1024,
        }
    }
}

/// The peaks of each part of a [`Split`], sampled every millisecond on a thread of the
/// benchmark's own until [`SplitPeaks::finish`].
struct SplitPeaks {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Split>,
}

impl SplitPeaks {
    fn start(pid: u32) -> SplitPeaks {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::spawn({
            let stop = stop.clone();
            move || {
                let mut peaks = Split::default();
                while !stop.load(Ordering::Relaxed) {
                    let now = Split::of(pid);
                    peaks.file = peaks.file.max(now.file);
                    peaks.anon = peaks.anon.max(now.anon);
                    std::thread::sleep(Duration::from_millis(1));
                }
                peaks
            }
        });
        SplitPeaks { stop, thread }
    }

    fn finish(self) -> Split {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("the sampling thread")
    }
}
