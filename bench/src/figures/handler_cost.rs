//! S: the signal handler's own cost per sample, as the sampler reports it.

use crate::Options;
use crate::figures::{Row, Verdict};
use crate::harness::{Server, decode, fetch};
use crate::stats::median;

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
    vec![
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
    ]
}
