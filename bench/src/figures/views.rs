//! V: how long each view (pprof, svg, text) of a CPU profile takes after its window.

use std::time::Duration;

use crate::Options;
use crate::figures::{Row, Verdict};
use crate::harness::{CONNECTIONS, Load, Server, fetch};
use crate::stats::median;

/// V: time from the end of a 10 s window to the last byte, per view, under load.
pub fn view_times(options: &Options) -> Vec<Row> {
    let window = options.secs(10.0).round() as u64;
    let server = Server::start(true, false);
    let load = Load::start(
        server.addr,
        CONNECTIONS,
        (window as f64 + 1.0) * 3.0 * options.rounds(2) as f64 + 3.0,
        false,
    );
    std::thread::sleep(Duration::from_secs(1));
    let mut rows = Vec::new();
    let mut times: Vec<(&str, Vec<f64>)> =
        vec![("pprof", vec![]), ("svg", vec![]), ("text", vec![])];
    for _ in 0..options.rounds(2) {
        for (format, samples) in &mut times {
            let f = fetch(
                server.addr,
                &format!("/debug/pprof/profile?seconds={window}&format={format}"),
            );
            assert_eq!(f.status, 200, "{}", String::from_utf8_lossy(&f.body));
            let total = f.last_byte.duration_since(f.sent).unwrap();
            let after = total.saturating_sub(Duration::from_secs(window));
            eprintln!(
                "V: {format} ready {:.1} ms after its {window} s window ({} B)",
                after.as_secs_f64() * 1e3,
                f.body.len()
            );
            samples.push(after.as_secs_f64() * 1e3);
        }
    }
    drop(load.finish());
    for (format, samples) in times {
        rows.push(Row {
            id: "V",
            figure: format!(
                "{window} s CPU profile as {format}: window end → last byte (client clock)"
            ),
            target: "—",
            verdict: Verdict::NoTarget,
            measured: format!("{:.1} ms", median(samples)),
        });
    }
    rows
}
