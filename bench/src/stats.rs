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

/// The per-pair ratios of alternating load windows (a ÷ b).
pub struct Ratios {
    pub median: f64,
    q1: f64,
    q3: f64,
    count: usize,
}

/// The median of some values, with its spread (for [`Ratios::noise`]'s interval).
pub type Spread = Ratios;

impl Ratios {
    pub fn of(pairs: &[(f64, f64)]) -> Ratios {
        Ratios::of_values(pairs.iter().map(|(a, b)| a / b).collect())
    }

    pub fn of_values(mut values: Vec<f64>) -> Ratios {
        assert!(!values.is_empty(), "nothing measured");
        values.sort_by(f64::total_cmp);
        let q = |f: f64| values[((values.len() - 1) as f64 * f).round() as usize];
        Ratios {
            median: median(values.clone()),
            q1: q(0.25),
            q3: q(0.75),
            count: values.len(),
        }
    }

    /// How many values the median is of.
    pub fn count(&self) -> usize {
        self.count
    }

    /// Half-width of a 95 % confidence interval of the median: the sample median's
    /// standard error is about 1.2533 σ / √n, with σ estimated as IQR / 1.349 (both for
    /// normal data; the ratios here are close to it). A target closer to 1 than this
    /// cannot be told apart from "no cost at all" by this run.
    /// Fewer than 4 values give no interval at all (infinite noise).
    pub fn noise(&self) -> f64 {
        if self.count < 4 {
            return f64::INFINITY;
        }
        let sigma = (self.q3 - self.q1) / 1.349;
        1.96 * 1.2533 * sigma / (self.count as f64).sqrt()
    }

    /// `median (IQR q1–q3, n pairs)`.
    pub fn summary(&self) -> String {
        format!(
            "{:.4} (IQR {:.3}–{:.3}, {} pairs)",
            self.median, self.q1, self.q3, self.count
        )
    }
}
