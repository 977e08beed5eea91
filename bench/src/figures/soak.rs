//! K: the soak. A thousand sequential 1 s CPU profiles and a thousand heap dumps on one
//! service under load: every response must be a valid profile, and resident memory
//! after the last must be within 1 MB of what it was after the first 50. Resident memory
//! moves by a megabyte or so from one moment to the next under the allocating load, so
//! each side is the median of 50 readings, one after each round: rounds 51 to 100, and
//! the last 50.

use std::time::{Duration, Instant};

use crate::Options;
use crate::figures::{MB, Row, Verdict};
use crate::harness::{Load, Server, decode, fetch};
use crate::stats::median;
use crate::system;

/// Load runs in bounded pieces of this length, restarted until the soak ends.
const LOAD_PIECE: Duration = Duration::from_secs(30);

/// K: `rounds` × (one 1 s CPU profile, one heap dump) on the jemalloc service, with the
/// allocating route under load; RSS after round 50 against after the last round.
pub fn soak(options: &Options) -> Vec<Row> {
    let rounds: usize = if options.quick { 60 } else { 1000 };
    let settle = 50;
    let server = Server::start_heap(None);
    let pid = server.pid();
    let started = Instant::now();
    let (mut cpu_samples, mut heap_bytes) = (0u64, 0u64);
    let mut rss = Vec::with_capacity(rounds);
    let mut round = 0;
    while round < rounds {
        let piece = Instant::now();
        let load = Load::start_on(server.addr, "/alloc", 2, LOAD_PIECE.as_secs_f64());
        // Stop a second short of the load's end, so every round runs under load.
        while round < rounds && piece.elapsed() + Duration::from_millis(2500) < LOAD_PIECE {
            let cpu = fetch(server.addr, "/debug/pprof/profile?seconds=1");
            assert_eq!(
                cpu.status,
                200,
                "CPU profile {round}: {}",
                String::from_utf8_lossy(&cpu.body)
            );
            let profile = decode(&cpu.body);
            assert!(
                profile.duration_nanos >= 1_000_000_000 && !profile.sample_type.is_empty(),
                "CPU profile {round} is not a 1 s profile"
            );
            cpu_samples += profile.sample.len() as u64;
            let heap = fetch(server.addr, "/debug/pprof/heap");
            assert_eq!(
                heap.status,
                200,
                "heap dump {round}: {}",
                String::from_utf8_lossy(&heap.body)
            );
            let dump = decode(&heap.body);
            assert!(
                !dump.sample.is_empty(),
                "heap dump {round} holds no samples"
            );
            heap_bytes += heap.body.len() as u64;
            round += 1;
            // Read right after each round, with the load running, so the load's own
            // connections and buffers are in every reading.
            rss.push(system::rss(pid) as f64);
        }
        let load = load.finish();
        eprintln!(
            "K: {round}/{rounds} rounds in {:.0} s, RSS {:.1} MB, load {:.0} req/s",
            started.elapsed().as_secs_f64(),
            system::rss(pid) as f64 / MB,
            load.per_second()
        );
    }
    // Rounds 51 to 100 and the last 50 (a quarter each in a --quick run).
    let window = settle.min(rounds / 4);
    let after_settle = median(rss[window..2 * window].to_vec());
    let end = median(rss[rounds - window..].to_vec());
    let growth = end - after_settle;
    eprintln!(
        "K: {rounds} CPU profiles ({cpu_samples} stacks) and {rounds} heap dumps ({} KiB) valid",
        heap_bytes / 1024
    );
    vec![Row {
        id: "K",
        figure: format!(
            "soak: {rounds} × (1 s CPU profile, heap dump) under load; RSS over the last {window} rounds − over rounds {} to {} (medians)",
            window + 1,
            2 * window
        ),
        target: "≤ 1 MB",
        measured: format!(
            "{:+.2} MB ({:.1} → {:.1} MB), every response valid",
            growth / MB,
            after_settle / MB,
            end / MB
        ),
        verdict: Verdict::at_most(growth.abs(), MB),
    }]
}
