//! T: a thread dump of a service with 100 parked threads.

use std::collections::HashMap;
use std::time::Duration;

use crate::Options;
use crate::figures::{MB, Row, Verdict};
use crate::harness::{Server, decode, fetch};
use crate::stats::median;
use crate::system::{peak_rss, reset_peak, rss, rss_anon};

/// Parked threads besides the service's own (main, one tokio worker).
const PARKED: usize = 100;

/// T: `GET /debug/pprof/threads` (the pprof form: every thread read or asked, unwound,
/// symbolized, gzipped) against a service with 100 threads asleep 4 to 23 frames deep.
/// Each round's time is from the request to the last byte; the collection alone (first
/// thread read to last answer) is what the dump's comment reports, with how many threads
/// were read asleep and how many signalled. Memory: the first dump's peak against before
/// it (it pages in code, and touches each signalled thread's stack once), then the later
/// dumps' peak against after the first, and 2 s after the last. Interruptions: the parked
/// threads whose context switches (`/proc/PID/task/TID/status`) went up during the
/// dumps: a sleeping thread woken by a signal switches in and out again once per signal
/// (and its `poll` or `nanosleep` fails with `EINTR`), one left asleep never does.
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
    let switched_before = switches(pid);
    let first = dump(server.addr);
    let woken_by_first = woken(&switched_before, &switches(pid));
    let first_peak = peak_rss(pid).saturating_sub(before) as f64 / MB;
    let first_anon = rss_anon(pid).saturating_sub(anon_before) as f64 / MB;
    let warm = rss(pid);
    reset_peak(pid);
    let (mut requests, mut collections) = (Vec::new(), Vec::new());
    let mut threads = 0;
    let mut how = String::new();
    let rounds = options.rounds(30).max(3);
    let switched_before = switches(pid);
    for _ in 0..rounds {
        let (request, collection, listed, read) = dump(server.addr);
        requests.push(request);
        collections.push(collection);
        threads = listed;
        how = read;
    }
    let woken_later = woken(&switched_before, &switches(pid));
    let later_peak = peak_rss(pid).saturating_sub(warm) as f64 / MB;
    std::thread::sleep(Duration::from_secs(2));
    let after = rss(pid);
    let request = median(requests);
    let collection = median(collections);
    eprintln!(
        "T: {threads} threads ({how}); request {request:.2} ms (first {:.2} ms), collection \
         {collection:.2} ms; RSS {:.1} MB before; first dump +{first_peak:.2} MB peak \
         (+{first_anon:.2} MB anonymous); later dumps +{later_peak:.2} MB peak; +{:.2} MB \
         2 s after the last; parked threads woken: {woken_by_first} by the first dump, \
         {woken_later} by the {rounds} later ones",
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
                "{request:.1} ms (collection alone {collection:.2} ms; first request {:.1} ms; \
                 {how})",
                first.0
            ),
            verdict: Verdict::at_most(request, 20.0),
        },
        Row {
            id: "T",
            figure: format!(
                "thread dump: sleeping threads interrupted, of the {PARKED} parked (first dump; \
                 the {rounds} later ones)"
            ),
            target: "0",
            measured: format!("{woken_by_first}; {woken_later}"),
            verdict: Verdict::at_most((woken_by_first + woken_later) as f64, 0.0),
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

/// Context switches so far of each parked thread (named `parked-N`) of process `pid`.
pub(crate) fn switches(pid: u32) -> HashMap<u32, u64> {
    let mut found = HashMap::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let dir = entry.path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        let Some(tid) = entry.file_name().to_str().and_then(|t| t.parse().ok()) else {
            continue;
        };
        if !comm.starts_with("parked-") {
            continue;
        }
        let status = std::fs::read_to_string(dir.join("status")).unwrap_or_default();
        let switched: u64 = status
            .lines()
            .filter(|line| line.contains("ctxt_switches:"))
            .filter_map(|line| line.split_ascii_whitespace().nth(1)?.parse::<u64>().ok())
            .sum();
        found.insert(tid, switched);
    }
    found
}

/// How many threads switched between `before` and `after`.
pub(crate) fn woken(before: &HashMap<u32, u64>, after: &HashMap<u32, u64>) -> usize {
    before
        .iter()
        .filter(|(tid, then)| after.get(tid).is_some_and(|now| now > then))
        .count()
}

/// One dump: the request's time and the collection's (ms), the threads listed, and how
/// their stacks were read (from the dump's comment, where it says).
fn dump(addr: std::net::SocketAddr) -> (f64, f64, i64, String) {
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
    // "...; N read asleep without a signal, M signalled"
    let how = comment
        .rsplit("; ")
        .next()
        .filter(|how| how.ends_with(" signalled"))
        .map_or_else(|| "every thread signalled".to_owned(), str::to_owned);
    (request, micros / 1e3, threads, how)
}
