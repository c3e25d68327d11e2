//! A latency histogram of one shard: fixed power-of-two buckets in
//! microseconds, plain `Cell`s, recorded by the shard that owns it.
//!
//! Bucket `i` counts durations of at most `2^(i + 2)` µs (4 µs … 2^24 µs ≈
//! 16.8 s, then +Inf): 24 buckets cover everything from a cached fetch to a
//! long poll with a factor of two between bounds, which is finer than the
//! spread of any latency this VM measures, and the bucket of a value is a
//! `leading_zeros`, not a search. Buckets are the same on every shard, so
//! merging shards is adding counts.

use std::cell::Cell;
use std::time::Duration;

/// Buckets of a [`Histogram`], the last one +Inf.
pub const LATENCY_BUCKETS: usize = 24;
/// `log2` of the first bucket's upper bound in microseconds (4 µs).
const FIRST_BOUND_LOG2_US: u32 = 2;

pub struct Histogram {
    buckets: [Cell<u64>; LATENCY_BUCKETS],
    sum_ns: Cell<u64>,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram::new()
    }
}

impl Histogram {
    pub const fn new() -> Histogram {
        Histogram {
            buckets: [const { Cell::new(0) }; LATENCY_BUCKETS],
            sum_ns: Cell::new(0),
        }
    }

    /// The bucket of a duration of `us` microseconds.
    fn bucket(us: u64) -> usize {
        if us <= 1 << FIRST_BOUND_LOG2_US {
            return 0;
        }
        // ceil(log2(us)) - FIRST_BOUND_LOG2_US
        let ceil_log2 = 64 - (us - 1).leading_zeros();
        ((ceil_log2 - FIRST_BOUND_LOG2_US) as usize).min(LATENCY_BUCKETS - 1)
    }

    pub fn record(&self, d: Duration) {
        let ns = d.as_nanos().min(u64::MAX as u128) as u64;
        let b = &self.buckets[Self::bucket(ns.div_ceil(1000))];
        b.set(b.get() + 1);
        self.sum_ns.set(self.sum_ns.get().wrapping_add(ns));
    }

    /// Upper bounds in seconds, without +Inf.
    pub fn bounds_seconds() -> Vec<f64> {
        (0..LATENCY_BUCKETS - 1)
            .map(|i| (1u64 << (i as u32 + FIRST_BOUND_LOG2_US)) as f64 / 1e6)
            .collect()
    }

    pub fn sample(&self) -> HistogramSample {
        HistogramSample {
            bounds: Self::bounds_seconds(),
            counts: self.buckets.iter().map(Cell::get).collect(),
            sum: self.sum_ns.get() as f64 / 1e9,
        }
    }

    pub fn count(&self) -> u64 {
        self.buckets.iter().map(Cell::get).sum()
    }
}

/// A histogram's values, owned and `Send`: per-bucket (not cumulative)
/// counts, `counts.len() == bounds.len() + 1` (the last is +Inf).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HistogramSample {
    pub bounds: Vec<f64>,
    pub counts: Vec<u64>,
    pub sum: f64,
}

impl HistogramSample {
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Adds `other` (same bounds) into `self`; an empty `self` takes its bounds.
    pub fn merge(&mut self, other: &HistogramSample) {
        if self.counts.is_empty() {
            *self = other.clone();
            return;
        }
        debug_assert_eq!(self.bounds, other.bounds, "merging unlike histograms");
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.sum += other.sum;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_lands_in_the_first_bucket_whose_bound_holds_it() {
        assert_eq!(Histogram::bucket(0), 0);
        assert_eq!(Histogram::bucket(4), 0);
        assert_eq!(Histogram::bucket(5), 1);
        assert_eq!(Histogram::bucket(8), 1);
        assert_eq!(Histogram::bucket(9), 2);
        assert_eq!(Histogram::bucket(1 << 24), LATENCY_BUCKETS - 2);
        assert_eq!(Histogram::bucket(u64::MAX / 2), LATENCY_BUCKETS - 1);
        let bounds = Histogram::bounds_seconds();
        for us in [1u64, 3, 4, 5, 100, 1000, 65_537, 1 << 24] {
            let b = Histogram::bucket(us);
            assert!(us as f64 / 1e6 <= bounds[b], "{us} µs above its bound");
            if b > 0 {
                assert!(
                    us as f64 / 1e6 > bounds[b - 1],
                    "{us} µs fits a lower bound"
                );
            }
        }
    }

    #[test]
    fn samples_merge_by_adding_counts_and_sums() {
        let (a, b) = (Histogram::new(), Histogram::new());
        a.record(Duration::from_micros(3));
        b.record(Duration::from_micros(3));
        b.record(Duration::from_millis(2));
        let mut m = a.sample();
        m.merge(&b.sample());
        assert_eq!(m.count(), 3);
        assert_eq!(m.counts[0], 2);
        assert!((m.sum - 0.002006).abs() < 1e-9);
    }
}
