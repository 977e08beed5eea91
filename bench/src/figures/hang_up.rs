//! F: a client that hangs up mid-profile frees the profiler at once: how long from the
//! hang-up until the next request's window opens. (The HTTP test proves that it is
//! freed; how soon is this figure.)

use std::io::Write as _;
use std::net::TcpStream;
use std::time::{Duration, SystemTime};

use crate::Options;
use crate::figures::{Row, Verdict};
use crate::harness::{Server, decode, fetch, wait_for_a_window};
use crate::stats::median;

/// F: per round, a 30 s profile on a raw connection, hung up once its window shows open
/// on the index page; then 1 s profiles, back to back (each refused one answered 409 at
/// once) until one is accepted: the time from the hang-up to that one's window opening
/// (the profile's `time_nanos`, same machine's clock), which includes the server noticing
/// the EOF and the sampler stopping and starting again.
pub fn hang_up(options: &Options) -> Vec<Row> {
    let server = Server::start(true, false);
    let mut freed = Vec::new();
    for round in 0..options.rounds(10) {
        let mut held = TcpStream::connect(server.addr).expect("connect");
        write!(
            held,
            "GET /debug/pprof/profile?seconds=30 HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            server.addr
        )
        .unwrap();
        wait_for_a_window(server.addr);
        let hung_up = SystemTime::now();
        drop(held);
        let mut refused = 0;
        let accepted = loop {
            let probe = fetch(server.addr, "/debug/pprof/profile?seconds=1");
            if probe.status == 200 {
                break decode(&probe.body);
            }
            assert_eq!(
                probe.status,
                409,
                "{}",
                String::from_utf8_lossy(&probe.body)
            );
            refused += 1;
            assert!(refused < 100_000, "the profiler was never freed");
        };
        let opened = SystemTime::UNIX_EPOCH + Duration::from_nanos(accepted.time_nanos as u64);
        let after = opened.duration_since(hung_up).unwrap_or_default();
        eprintln!(
            "F round {round}: the next window opened {:.1} ms after the hang-up ({refused} \
             409s first)",
            after.as_secs_f64() * 1e3
        );
        freed.push(after.as_secs_f64() * 1e3);
    }
    let worst = freed.iter().copied().fold(0.0, f64::max);
    let typical = median(freed);
    vec![Row {
        id: "F",
        figure: "a client hangs up mid-profile: hang-up → the next request's window opens, \
                 median (worst)"
            .into(),
        target: "≤ 200 ms",
        measured: format!("{typical:.1} ms ({worst:.1} ms)"),
        verdict: Verdict::at_most(typical, 200.0),
    }]
}
