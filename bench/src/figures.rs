//! The figures of the README's Performance table, one file each, named after its id; M1
//! and M4 come from the same rounds, so they share `m1_m4.rs`. Each starts its own
//! services through the harness and returns its rows of the table.

pub mod h;
pub mod k;
pub mod l;
pub mod m1_m4;
pub mod m2;
pub mod m3;
pub mod m5;
pub mod m6;
pub mod s;
pub mod t;
pub mod v;

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

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Verdict {
    /// A figure reported for context, without a target.
    NoTarget,
    Met,
    Missed,
}

impl Verdict {
    pub fn at_most(value: f64, limit: f64) -> Verdict {
        if value <= limit {
            Verdict::Met
        } else {
            Verdict::Missed
        }
    }

    pub fn at_least(value: f64, limit: f64) -> Verdict {
        if value >= limit {
            Verdict::Met
        } else {
            Verdict::Missed
        }
    }
}

/// A ratio figure with a lower target (M2, M3, H): its median against the target, and a
/// sentence when the target lies inside the median's own noise (`stats::Ratios::noise`).
/// A miss is a median below the target by more than that noise: a median a hair under
/// the target says nothing the next run could not reverse, and the row says so.
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
        verdict: Verdict::at_least(ratios.median + noise, limit),
    }
}
