//! H: heap dump time and memory, and the throughput cost of jemalloc's sampling.

use std::time::Duration;

use crate::Options;
use crate::figures::{MB, Row, Verdict, ratio_row};
use crate::harness::{CONNECTIONS, Load, Server, alternate_on, fetch};
use crate::stats::{Ratios, median};
use crate::system;

/// H: heap dumps (issue 3) and the cost of jemalloc's sampling, on the jemalloc service.
pub fn heap_figures(options: &Options) -> Vec<Row> {
    let (mut first, mut later, mut peak, mut retained) = (vec![], vec![], vec![], vec![]);
    for round in 0..options.rounds(3) {
        let server = Server::start_heap(None);
        let pid = server.pid();
        Load::start(server.addr, CONNECTIONS, 1.0, false).finish();
        std::thread::sleep(Duration::from_millis(500));
        let before = system::rss(pid);
        system::reset_peak(pid);
        let dump = fetch(server.addr, "/debug/pprof/heap");
        assert_eq!(dump.status, 200, "{}", String::from_utf8_lossy(&dump.body));
        let took = dump
            .last_byte
            .duration_since(dump.sent)
            .unwrap()
            .as_secs_f64()
            * 1e3;
        let high = system::peak_rss(pid);
        std::thread::sleep(Duration::from_secs(2));
        let after = system::rss(pid);
        first.push(took);
        peak.push(high as f64 - before as f64);
        retained.push(after as f64 - before as f64);
        for _ in 0..3 {
            let dump = fetch(server.addr, "/debug/pprof/heap");
            assert_eq!(dump.status, 200);
            later.push(
                dump.last_byte
                    .duration_since(dump.sent)
                    .unwrap()
                    .as_secs_f64()
                    * 1e3,
            );
        }
        eprintln!(
            "H round {round}: first dump {took:.1} ms ({} B), RSS {:.1} MB before, {:+.1} MB peak, {:+.1} MB after 2 s",
            dump.body.len(),
            before as f64 / MB,
            (high as f64 - before as f64) / MB,
            (after as f64 - before as f64) / MB,
        );
    }
    let pairs_per_round = if options.quick { 8 } else { 30 };
    let mut pairs = Vec::new();
    for _ in 0..options.rounds(4) {
        let sampled = Server::start_heap(None);
        let unsampled = Server::start_heap(Some("prof:false"));
        for server in [&sampled, &unsampled] {
            Load::start(server.addr, CONNECTIONS, 1.0, false).finish();
        }
        pairs.extend(alternate_on(
            sampled.addr,
            unsampled.addr,
            "/alloc",
            pairs_per_round,
            "H",
        ));
    }
    vec![
        Row {
            id: "H",
            figure: "heap dump (64 MiB live from 16 sites): request → last byte, first".into(),
            target: "—",
            verdict: Verdict::NoTarget,
            measured: format!("{:.1} ms", median(first)),
        },
        Row {
            id: "H",
            figure: "heap dump: request → last byte, later".into(),
            target: "—",
            verdict: Verdict::NoTarget,
            measured: format!("{:.1} ms", median(later)),
        },
        Row {
            id: "H",
            figure: "RSS growth during the first heap dump, peak (retained 2 s later)".into(),
            target: "—",
            verdict: Verdict::NoTarget,
            measured: format!(
                "{:+.1} MB ({:+.1} MB)",
                median(peak) / MB,
                median(retained) / MB
            ),
        },
        Row {
            verdict: Verdict::NoTarget,
            ..ratio_row(
                "H",
                "req/s of an allocating route, 512 KiB sampling on ÷ prof:false".into(),
                "—",
                0.0,
                &Ratios::of(&pairs),
            )
        },
    ]
}
