//! T: a thread dump of a service with 100 parked threads.

use std::time::Duration;

use crate::Options;
use crate::figures::{MB, Row, Verdict};
use crate::harness::{Server, decode, fetch};
use crate::stats::median;
use crate::system::{peak_rss, reset_peak, rss, rss_anon};

/// Parked threads besides the service's own (main, one tokio worker).
const PARKED: usize = 100;

/// T: `GET /debug/pprof/threads` (the pprof form: every thread signalled, unwound,
/// symbolized, gzipped) against a service with 100 threads asleep 4 to 23 frames deep.
/// Each round's time is from the request to the last byte; the collection alone (first
/// signal to last answer) is what the dump's comment reports. Memory: the first dump's
/// peak against before it (it pages in code and touches each parked thread's stack once),
/// then the later dumps' peak against after the first, and 2 s after the last.
pub fn thread_dumps(options: &Options) -> Vec<Row> {
    let server = Server::start_parked(PARKED);
    let pid = server.pid();
    // Let the threads park.
    std::thread::sleep(Duration::from_millis(500));
    let before = rss(pid);
    let anon_before = rss_anon(pid);
    reset_peak(pid);
    // The first dump pages in its code and touches each parked thread's stack below its
    // sleeping frame (the kernel's signal frame and the handler): once per process.
    let first = dump(server.addr);
    let first_peak = peak_rss(pid).saturating_sub(before) as f64 / MB;
    let first_anon = rss_anon(pid).saturating_sub(anon_before) as f64 / MB;
    let warm = rss(pid);
    reset_peak(pid);
    let (mut requests, mut collections) = (Vec::new(), Vec::new());
    let mut threads = 0;
    for _ in 0..options.rounds(30).max(3) {
        let (request, collection, listed) = dump(server.addr);
        requests.push(request);
        collections.push(collection);
        threads = listed;
    }
    let later_peak = peak_rss(pid).saturating_sub(warm) as f64 / MB;
    std::thread::sleep(Duration::from_secs(2));
    let after = rss(pid);
    let request = median(requests);
    let collection = median(collections);
    eprintln!(
        "T: {threads} threads; request {request:.2} ms (first {:.2} ms), collection \
         {collection:.2} ms; RSS {:.1} MB before; first dump +{first_peak:.2} MB peak \
         (+{first_anon:.2} MB anonymous); later dumps +{later_peak:.2} MB peak; +{:.2} MB \
         2 s after the last",
        first.0,
        before as f64 / MB,
        after.saturating_sub(before) as f64 / MB
    );
    vec![
        Row {
            id: "T",
            figure: format!("thread dump of {threads} threads, request to last byte, median"),
            target: "≤ 20 ms",
            measured: format!(
                "{request:.1} ms (collection alone {collection:.2} ms; first request {:.1} ms)",
                first.0
            ),
            verdict: Verdict::at_most(request, 20.0),
        },
        Row {
            id: "T",
            figure: "thread dump, resident memory added by each later dump (peak)".to_owned(),
            target: "≤ 1 MB",
            measured: format!(
                "+{later_peak:.2} MB (+{:.2} MB 2 s after the last, against before the first)",
                after.saturating_sub(before) as f64 / MB
            ),
            verdict: Verdict::at_most(later_peak, 1.0),
        },
        Row {
            id: "T",
            figure: "thread dump, resident memory added by the first dump (peak)".to_owned(),
            target: "≤ 1 MB",
            measured: format!(
                "+{first_peak:.2} MB, of which +{first_anon:.2} MB anonymous (the rest is \
                 code and tables paged in from the binary)"
            ),
            verdict: Verdict::at_most(first_peak, 1.0),
        },
    ]
}

/// One dump: the request's time and the collection's (ms), and the threads listed.
fn dump(addr: std::net::SocketAddr) -> (f64, f64, i64) {
    let f = fetch(addr, "/debug/pprof/threads");
    assert_eq!(f.status, 200, "{}", String::from_utf8_lossy(&f.body));
    let request = f
        .last_byte
        .duration_since(f.sent)
        .unwrap_or_default()
        .as_secs_f64()
        * 1e3;
    let profile = decode(&f.body);
    let threads = profile.sample.iter().map(|s| s.value[0]).sum::<i64>();
    let comment = profile
        .comment
        .iter()
        .map(|i| profile.string_table[*i as usize].as_str())
        .find(|c| c.starts_with("krabka-pprof thread dump:"))
        .expect("the dump's comment")
        .to_owned();
    // "... answered within 100ms (in N µs); ..."
    let micros: f64 = comment
        .split("(in ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .expect("the collection time");
    (request, micros / 1e3, threads)
}
