//! The benchmark's verdicts: a row of the final table, whether its figure met its target,
//! and whether the run as a whole passes. Kept apart from the figures (and from anything
//! that starts a service) so that `tests/verdicts.rs` can hold the rules to their word:
//! a figure with a lower target is met only where its whole noise interval clears it.

/// One line of the final table.
pub struct Row {
    pub id: &'static str,
    pub figure: String,
    pub target: &'static str,
    pub measured: String,
    /// Whether `measured` meets `target`; the benchmark exits non-zero if any row missed
    /// or could not tell ([`fails`]).
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

/// Whether a run with these rows fails: any figure missed or inconclusive. A
/// `--quick` run prints its verdicts and enforces none (one short round is no
/// measurement).
pub fn fails(rows: &[Row], quick: bool) -> bool {
    !quick
        && rows
            .iter()
            .any(|row| matches!(row.verdict, Verdict::Missed | Verdict::Inconclusive { .. }))
}
