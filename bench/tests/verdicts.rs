//! The benchmark's verdict rules (issue 26, point 7), on numbers worked out by hand: a
//! lower target is met only where the median's whole 95 % interval clears it, missed only
//! where the whole interval falls short, and inconclusive (a failure, not a pass) in
//! between; a run fails on any missed or inconclusive figure, unless it is `--quick`.
//!
//! The two modules are compiled in by path: the benchmark is a binary whose other modules
//! start services and compile the attribute's own modules in.

#![allow(dead_code, unreachable_pub)]

#[path = "../src/stats.rs"]
mod stats;
#[path = "../src/verdict.rs"]
mod verdict;

use stats::{Ratios, mean, median};
use verdict::{Row, Verdict, fails, ratio_row};

/// Eight ratios 0.90, 0.92, … 1.04: median 0.97, quartiles 0.94 and 1.00 (the values at
/// ranks 2 and 5 of 0..=7), so σ ≈ 0.06 / 1.349 and the interval's half-width is
/// 1.96 × 1.2533 × σ / √8 ≈ 0.03863.
fn eight() -> Ratios {
    Ratios::of_values((0..8).map(|i| 0.90 + 0.02 * f64::from(i)).collect())
}

fn row(verdict: Verdict) -> Row {
    Row {
        id: "X",
        figure: "a figure".to_owned(),
        target: "a target",
        measured: "a value".to_owned(),
        verdict,
    }
}

#[test]
fn a_lower_target_is_met_only_when_the_whole_interval_clears_it() {
    // Binary fractions, so that the edges are exact.
    assert_eq!(Verdict::at_least_within(1.0, 0.125, 0.75), Verdict::Met);
    assert_eq!(Verdict::at_least_within(1.0, 0.25, 0.75), Verdict::Met);
    // The median over the target, its interval not: no evidence of meeting it.
    assert_eq!(
        Verdict::at_least_within(0.875, 0.25, 0.75),
        Verdict::Inconclusive { noise: 0.25 }
    );
    // The median under the target, its interval reaching it (the rule this replaced,
    // `median + noise >= target`, called this met).
    assert_eq!(
        Verdict::at_least_within(0.625, 0.25, 0.75),
        Verdict::Inconclusive { noise: 0.25 }
    );
    assert_eq!(
        Verdict::at_least_within(0.5, 0.25, 0.75),
        Verdict::Inconclusive { noise: 0.25 }
    );
    // The whole interval under the target: missed.
    assert_eq!(Verdict::at_least_within(0.25, 0.25, 0.75), Verdict::Missed);
    assert_eq!(Verdict::at_least_within(0.375, 0.25, 0.75), Verdict::Missed);
    // Too few rounds for an interval: never met, never missed.
    assert_eq!(
        Verdict::at_least_within(2.0, f64::INFINITY, 0.75),
        Verdict::Inconclusive {
            noise: f64::INFINITY
        }
    );
}

#[test]
fn an_upper_target_is_met_at_or_under_it() {
    assert_eq!(Verdict::at_most(0.5, 1.0), Verdict::Met);
    assert_eq!(Verdict::at_most(1.0, 1.0), Verdict::Met);
    assert_eq!(Verdict::at_most(1.5, 1.0), Verdict::Missed);
}

#[test]
fn medians_and_means_of_rounds() {
    // An odd count: the middle value; an even one: the mean of the middle two.
    assert_eq!(median(vec![5.0, 1.0, 4.0, 2.0, 3.0]), 3.0);
    assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 2.5);
    assert_eq!(median(vec![7.0]), 7.0);
    // The mean of one side of each pair.
    let pairs = [(1.0, 10.0), (3.0, 30.0), (8.0, 80.0)];
    assert_eq!(mean(&pairs, |p| p.0), 4.0);
    assert_eq!(mean(&pairs, |p| p.1), 40.0);
}

#[test]
fn noise_is_the_half_width_of_the_medians_95_percent_interval() {
    let ratios = eight();
    assert_eq!(ratios.count(), 8);
    assert!((ratios.median - 0.97).abs() < 1e-12, "{}", ratios.median);
    assert!(
        (ratios.noise() - 0.038_628).abs() < 1e-5,
        "{}",
        ratios.noise()
    );
    assert!(
        ratios
            .summary()
            .starts_with("0.9700 (IQR 0.940–1.000, 8 pairs)")
    );
    // 1, 2, 3, 4: quartiles 2 and 3 (ranks 1 and 2 of 0..=3), median 2.5,
    // 1.96 × 1.2533 × (1 / 1.349) / 2 ≈ 0.91048.
    let four = Ratios::of_values(vec![4.0, 1.0, 3.0, 2.0]);
    assert_eq!(four.median, 2.5);
    assert!((four.noise() - 0.910_477).abs() < 1e-5, "{}", four.noise());
    // Three values give no interval.
    let three = Ratios::of_values(vec![1.0, 1.0, 1.0]);
    assert_eq!(three.noise(), f64::INFINITY);
    // Pairs are divided a ÷ b.
    let pairs = Ratios::of(&[(1.0, 2.0), (3.0, 4.0), (1.0, 1.0)]);
    assert_eq!(pairs.median, 0.75);
}

#[test]
fn a_ratio_row_judges_by_the_median_and_its_noise_and_says_when_the_target_is_in_it() {
    // 0.97 ± 0.0386 against 0.90: the whole interval clears it; 0.10 from "no cost" is
    // outside the noise, so no note.
    let met = ratio_row("M2", "throughput".to_owned(), "≥ 0.90", 0.90, &eight());
    assert_eq!(met.verdict, Verdict::Met);
    assert!(!met.measured.contains("noise floor"), "{}", met.measured);
    assert!(met.measured.starts_with("0.9700"), "{}", met.measured);
    // Against 0.98: the interval straddles it, and 0.02 from "no cost" is inside the
    // noise, which the row says.
    let straddled = ratio_row("M2", "throughput".to_owned(), "≥ 0.98", 0.98, &eight());
    assert!(
        matches!(straddled.verdict, Verdict::Inconclusive { noise } if (noise - 0.038_628).abs() < 1e-5),
        "{:?}",
        straddled.verdict
    );
    assert!(
        straddled
            .measured
            .ends_with("; the target is inside this run's noise floor (median ± 0.039)"),
        "{}",
        straddled.measured
    );
    // Against 1.02: the whole interval falls short.
    let missed = ratio_row("M2", "throughput".to_owned(), "≥ 1.02", 1.02, &eight());
    assert_eq!(missed.verdict, Verdict::Missed);
    assert!(
        missed.measured.contains("noise floor"),
        "{}",
        missed.measured
    );
}

#[test]
fn a_run_fails_on_a_missed_or_inconclusive_figure_unless_it_is_quick() {
    let passing = vec![row(Verdict::NoTarget), row(Verdict::Met)];
    assert!(!fails(&passing, false));
    assert!(!fails(&[], false));
    for bad in [Verdict::Missed, Verdict::Inconclusive { noise: 0.1 }] {
        let mut rows = vec![row(Verdict::Met), row(bad), row(Verdict::NoTarget)];
        assert!(fails(&rows, false), "{bad:?}");
        assert!(!fails(&rows, true), "--quick enforces nothing: {bad:?}");
        rows.reverse();
        assert!(fails(&rows, false), "{bad:?}");
    }
}
