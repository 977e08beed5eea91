//! Statistics over rounds: medians, means, and the ratios of paired load windows that the
//! throughput figures report.

pub fn median(mut values: Vec<f64>) -> f64 {
    assert!(!values.is_empty());
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

pub fn mean(pairs: &[(f64, f64)], side: fn(&(f64, f64)) -> f64) -> f64 {
    pairs.iter().map(side).sum::<f64>() / pairs.len() as f64
}

/// Median and interquartile range of per-pair ratios, formatted.
pub fn ratio_summary(pairs: &[(f64, f64)]) -> (f64, String) {
    let mut ratios: Vec<f64> = pairs.iter().map(|(a, b)| a / b).collect();
    ratios.sort_by(f64::total_cmp);
    let q = |f: f64| ratios[((ratios.len() - 1) as f64 * f).round() as usize];
    let median = median(ratios.clone());
    (
        median,
        format!(
            "{median:.4} (IQR {:.3}–{:.3}, {} pairs)",
            q(0.25),
            q(0.75),
            ratios.len()
        ),
    )
}
