//! Statistics: percentiles of per-iteration samples and the summary of a
//! figure over repetitions.
//!
//! Every reported figure is measured once per repetition; a ratio is taken
//! *within* a repetition (subject and peer ran back to back), and the report
//! gives the median over repetitions with the min and max beside it, so the
//! spread caused by a noisy machine is visible.

use serde::{Deserialize, Serialize};

/// A figure over the repetitions of a run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Median over repetitions.
    pub median: f64,
    /// Smallest repetition.
    pub min: f64,
    /// Largest repetition.
    pub max: f64,
    /// Every repetition, in run order.
    pub reps: Vec<f64>,
}

impl Summary {
    /// Summarizes `values` (NaN values are kept in `reps` but ignored by
    /// median/min/max; an empty or all-NaN set gives NaN).
    pub fn of(values: &[f64]) -> Summary {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
        v.sort_by(f64::total_cmp);
        let (median, min, max) = if v.is_empty() {
            (f64::NAN, f64::NAN, f64::NAN)
        } else {
            (median_sorted(&v), v[0], v[v.len() - 1])
        };
        Summary {
            median,
            min,
            max,
            reps: values.to_vec(),
        }
    }
}

/// Median of a sorted slice (mean of the two middle values for even sizes).
pub fn median_sorted(v: &[f64]) -> f64 {
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The `p`-th percentile (0..=100) of sorted samples, nearest-rank method.
pub fn percentile_sorted(v: &[u64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1] as f64
}

/// Mean of samples.
pub fn mean(v: &[u64]) -> f64 {
    if v.is_empty() {
        f64::NAN
    } else {
        v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64
    }
}

/// `a / b`, NaN when `b` is zero or either is NaN.
pub fn ratio(a: f64, b: f64) -> f64 {
    if b == 0.0 || a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a / b
    }
}

/// Per repetition `r < reps`: `ratio(subject[r], peer[r])`.
pub fn rep_ratios(subject: &[f64], peer: &[f64], reps: usize) -> Vec<f64> {
    (0..reps).map(|r| ratio(subject[r], peer[r])).collect()
}

/// Pairs each key with its pool of samples, sorted ascending.
pub fn sorted_pools<K: Copy>(keys: &[K], pools: Vec<Vec<u64>>) -> Vec<(K, Vec<u64>)> {
    keys.iter()
        .zip(pools)
        .map(|(k, mut v)| {
            v.sort_unstable();
            (*k, v)
        })
        .collect()
}

/// Down-samples sorted samples to at most `points` (value, cumulative
/// fraction) pairs for a CDF plot; always keeps the first and last sample.
pub fn cdf_points(sorted: &[u64], points: usize) -> Vec<(f64, f64)> {
    let n = sorted.len();
    if n == 0 || points == 0 {
        return Vec::new();
    }
    let step = (n / points).max(1);
    let mut out: Vec<(f64, f64)> = (0..n)
        .step_by(step)
        .map(|i| (sorted[i] as f64, (i + 1) as f64 / n as f64))
        .collect();
    if out.last().map(|p| p.1) != Some(1.0) {
        out.push((sorted[n - 1] as f64, 1.0));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_and_percentiles() {
        let s = Summary::of(&[3.0, 1.0, 2.0, f64::NAN]);
        assert_eq!((s.median, s.min, s.max), (2.0, 1.0, 3.0));
        assert_eq!(s.reps.len(), 4);
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile_sorted(&v, 50.0), 50.0);
        assert_eq!(percentile_sorted(&v, 99.0), 99.0);
        assert_eq!(percentile_sorted(&v, 100.0), 100.0);
        assert!(ratio(1.0, 0.0).is_nan());
        let c = cdf_points(&v, 10);
        assert_eq!(c.first(), Some(&(1.0, 0.01)));
        assert_eq!(c.last(), Some(&(100.0, 1.0)));
    }
}
