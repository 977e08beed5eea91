//! M3: throughput with the attribute mounted and idle, against the same app without it,
//! and the method's A/A noise floor.

use crate::Options;
use crate::figures::{Row, Verdict, ratio_row};
use crate::harness::{CONNECTIONS, Load, Server, alternate};
use crate::stats::{Ratios, mean};

/// M3: req/s with the attribute mounted and idle against the same app without it; fresh
/// processes every other round. Also the method's noise floor: two identical services.
pub fn idle_overhead(options: &Options) -> Vec<Row> {
    // Short rounds of fresh processes: a process's memory layout alone moves its
    // throughput by a percent or two here, so many processes average it out.
    let pairs_per_round = if options.quick { 8 } else { 30 };
    let (mut pairs, mut floor) = (Vec::new(), Vec::new());
    for round in 0..options.rounds(8) {
        let with = Server::start(true, false);
        let without = Server::start(false, false);
        for server in [&with, &without] {
            Load::start(server.addr, CONNECTIONS, 1.0, false).finish();
        }
        pairs.extend(alternate(with.addr, without.addr, pairs_per_round, "M3"));
        if round % 2 == 0 {
            let twin = Server::start(false, false);
            Load::start(twin.addr, CONNECTIONS, 1.0, false).finish();
            floor.extend(alternate(twin.addr, without.addr, pairs_per_round, "A/A"));
        }
    }
    let floor = Ratios::of(&floor);
    vec![
        ratio_row(
            "M3",
            format!(
                "req/s with the attribute idle ÷ without ({:.0} req/s without)",
                mean(&pairs, |p| p.1)
            ),
            "≥ 0.995",
            0.995,
            &Ratios::of(&pairs),
        ),
        Row {
            id: "—",
            figure: "noise floor: two identical services, same method (A/A)".into(),
            target: "1",
            measured: format!("{}; median ± {:.3}", floor.summary(), floor.noise()),
            verdict: Verdict::NoTarget,
        },
    ]
}
