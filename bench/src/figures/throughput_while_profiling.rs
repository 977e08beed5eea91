//! M2: throughput while a 99 Hz profile runs, against an idle twin.

use std::time::Duration;

use crate::Options;
use crate::figures::{Row, ratio_row};
use crate::harness::{CONNECTIONS, Load, Server, alternate, fetch};
use crate::stats::{Ratios, mean};

/// M2: req/s of a service while a 99 Hz profile runs on it, against an identical idle
/// service, in alternating 250 ms windows. A profile costs CPU only while the process
/// runs, so the profiled service pays for sampling exactly during its own windows. The
/// two processes swap roles every round, so a difference between them cancels out.
///
/// With `windows` > 1, that many profiles of the round's length share the sampler, each
/// on its own connection.
pub fn profiling_overhead(options: &Options, windows: usize) -> Row {
    let servers = [Server::start(true, false), Server::start(true, false)];
    for server in &servers {
        Load::start(server.addr, CONNECTIONS, 1.0, false).finish();
    }
    let pairs_per_round = if options.quick { 8 } else { 60 };
    let mut pairs = Vec::new();
    for round in 0..options.rounds(4) {
        let (profiled, idle) = (&servers[round % 2], &servers[1 - round % 2]);
        // One profile covering this round's windows (0.5 s per pair), with margin.
        let seconds = (pairs_per_round as u64).div_ceil(2) + 2;
        let addr = profiled.addr;
        let profiles: Vec<_> = (0..windows)
            .map(|_| {
                std::thread::spawn(move || {
                    fetch(addr, &format!("/debug/pprof/profile?seconds={seconds}"))
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(500));
        pairs.extend(alternate(profiled.addr, idle.addr, pairs_per_round, "M2"));
        for profile in profiles {
            let profile = profile.join().unwrap();
            assert_eq!(
                profile.status,
                200,
                "{}",
                String::from_utf8_lossy(&profile.body)
            );
        }
    }
    ratio_row(
        "M2",
        format!(
            "req/s while profiling at 99 Hz{} ÷ idle ({:.0} req/s idle)",
            if windows == 1 {
                String::new()
            } else {
                format!(", {windows} windows")
            },
            mean(&pairs, |p| p.1)
        ),
        "≥ 0.98",
        0.98,
        &Ratios::of(&pairs),
    )
}
