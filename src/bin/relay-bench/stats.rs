//! Order statistics over latency samples, and how durations are printed.

use std::time::Duration;

use serde::Serialize;

/// min / median / p99 / max of a set of samples, in milliseconds.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub n: usize,
    pub min_ms: f64,
    pub median_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl Summary {
    /// `None` for no samples: a figure without samples is "n/a", never zero.
    pub fn of(samples: &[Duration]) -> Option<Summary> {
        let mut sorted = samples.to_vec();
        sorted.sort_unstable();
        let (first, last) = (sorted.first()?, sorted.last()?);
        Some(Summary {
            n: sorted.len(),
            min_ms: ms(*first),
            median_ms: ms(percentile(&sorted, 50.0)),
            p99_ms: ms(percentile(&sorted, 99.0)),
            max_ms: ms(*last),
        })
    }

    /// Samples in milliseconds, which may be below zero (a difference of
    /// two measurements); `None` for none.
    pub fn of_ms(samples: &[f64]) -> Option<Summary> {
        let mut sorted = samples.to_vec();
        sorted.sort_unstable_by(f64::total_cmp);
        let (first, last) = (sorted.first()?, sorted.last()?);
        Some(Summary {
            n: sorted.len(),
            min_ms: *first,
            median_ms: percentile(&sorted, 50.0),
            p99_ms: percentile(&sorted, 99.0),
            max_ms: *last,
        })
    }

    /// The same distribution with every sample multiplied by `factor`.
    pub fn scaled(&self, factor: f64) -> Summary {
        Summary {
            n: self.n,
            min_ms: self.min_ms * factor,
            median_ms: self.median_ms * factor,
            p99_ms: self.p99_ms * factor,
            max_ms: self.max_ms * factor,
        }
    }
}

/// Nearest-rank percentile of sorted, non-empty samples: with 20 trials
/// p99 is the worst one, which is the honest reading of so few samples.
fn percentile<T: Copy>(sorted: &[T], p: f64) -> T {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// A duration in milliseconds with a unit and a sensible precision (a
/// difference may be below zero).
pub fn fmt_ms(ms: f64) -> String {
    let size = ms.abs();
    if size >= 1000.0 {
        format!("{:.2} s", ms / 1000.0)
    } else if size >= 10.0 {
        format!("{ms:.1} ms")
    } else if size >= 1.0 {
        format!("{ms:.2} ms")
    } else {
        format!("{:.0} µs", ms * 1000.0)
    }
}

/// Messages per second with a unit.
pub fn fmt_rate(per_s: f64) -> String {
    if per_s >= 10_000.0 {
        format!("{:.0}k msgs/s", per_s / 1000.0)
    } else {
        format!("{per_s:.0} msgs/s")
    }
}

pub fn fmt_kib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}
