//! The figures of the Performance table in bench/README.md. Each file is named for what it
//! measures, starts its own services through the harness and returns its rows of the
//! table, each row keeping its id (the `--only` names):
//!
//! - `cpu_profile_cost.rs`: M1 (resident memory around a profile) and M4 (window end to
//!   last byte), which come from the same rounds;
//! - `throughput_while_profiling.rs`: M2;
//! - `throughput_idle_attribute.rs`: M3;
//! - `current_thread_latency.rs`: M5;
//! - `build_time.rs`: M6, the attribute's build and expansion time;
//! - `views.rs`: V, each view of a CPU profile;
//! - `heap.rs`: H, heap dumps and jemalloc's sampling cost;
//! - `handler_cost.rs`: S, the signal handler's cost per sample, by its own clock and
//!   from outside;
//! - `hang_up.rs`: F, how soon a hung-up profile frees the profiler;
//! - `thread_dump.rs`: T;
//! - `lines.rs`: L, a CPU profile read with line tables;
//! - `labels_cost.rs`: labels, what setting labels and sampling them cost;
//! - `soak.rs`: K, the soak;
//! - `long_session.rs`: LS, one session held ten minutes on a churning service;
//! - `recorder.rs`: R, what the recorder (`recent`) costs, and RM, its memory over ten
//!   minutes and `/recent?seconds=600`.

pub mod build_time;
pub mod cpu_profile_cost;
pub mod current_thread_latency;
pub mod handler_cost;
pub mod hang_up;
pub mod heap;
pub mod labels_cost;
pub mod lines;
pub mod long_session;
pub mod recorder;
pub mod soak;
pub mod thread_dump;
pub mod throughput_idle_attribute;
pub mod throughput_while_profiling;
pub mod views;

pub const MB: f64 = 1024.0 * 1024.0;

/// One line of the final table.
pub struct Row {
    pub id: &'static str,
    pub figure: String,
    pub target: &'static str,
    pub measured: String,
    /// Whether `measured` meets `target`; the benchmark exits non-zero if any row missed.
    pub verdict: Verdict,
}

#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Verdict {
    /// A figure reported for context, without a target.
    NoTarget,
    Met,
    Missed,
    /// The run cannot tell: the target lies within the figure's own noise (the half-width
    /// of its median's 95 % interval), so it shows neither that the target is met nor
    /// that it is missed. Not a pass.
    Inconclusive {
        noise: f64,
    },
}

impl Verdict {
    pub fn at_most(value: f64, limit: f64) -> Verdict {
        if value <= limit {
            Verdict::Met
        } else {
            Verdict::Missed
        }
    }

    /// A lower target against a median and its noise (the half-width of its 95 %
    /// interval): met only where the whole interval is at or above it, missed where the
    /// whole interval is below it, else inconclusive. A median a hair over the target
    /// in a noisy run is no evidence of meeting it.
    pub fn at_least_within(median: f64, noise: f64, limit: f64) -> Verdict {
        if median - noise >= limit {
            Verdict::Met
        } else if median + noise < limit {
            Verdict::Missed
        } else {
            Verdict::Inconclusive { noise }
        }
    }
}

/// A ratio figure with a lower target (M2, M3): its median and the median's own noise
/// (`stats::Ratios::noise`) against the target (`Verdict::at_least_within`); the row says
/// when even no cost at all (1.0) would lie inside that noise, so that the method cannot
/// resolve the target.
pub fn ratio_row(
    id: &'static str,
    figure: String,
    target: &'static str,
    limit: f64,
    ratios: &crate::stats::Ratios,
) -> Row {
    let mut measured = ratios.summary();
    let noise = ratios.noise();
    if (1.0 - limit).abs() < noise {
        measured.push_str(&format!(
            "; the target is inside this run's noise floor (median ± {noise:.3})"
        ));
    }
    Row {
        id,
        figure,
        target,
        measured,
        verdict: Verdict::at_least_within(ratios.median, noise, limit),
    }
}
