//! Measurement state of one bench phase: HdrHistograms for publish latency,
//! publish delay and end-to-end latency (each as a per-interval and a whole-run
//! histogram), the phases of each transaction (transactional runs), and
//! counters of sent, acknowledged, failed and consumed messages.
//!
//! Shared by the producer threads, librdkafka's delivery-report thread, the
//! consumer threads and the main (reporting) thread; histograms sit behind
//! their own `Mutex` (held only to record one value), counters are atomics.
//! Invariant: a value is recorded only for a message *sent* after the warm-up
//! ended (`measure_start_ns`), so warm-up traffic never leaks into results,
//! whatever time its acknowledgement or consumption arrives.
//!
//! All times are nanoseconds on one process-wide monotonic clock ([`now_ns`]);
//! producer and consumer run in the same process, so end-to-end latency needs
//! no clock synchronisation. Histograms store microseconds.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Largest latency a histogram tracks exactly, in microseconds (values above are clamped).
pub const HISTOGRAM_MAX_US: u64 = 300_000_000;
/// Significant decimal digits kept by every histogram.
pub const HISTOGRAM_SIGFIG: u8 = 3;

/// Percentiles written as the curve of a result (OMB's `aggregated*Quantiles`).
pub const CURVE_PERCENTILES: &[f64] = &[
    50.0, 60.0, 70.0, 75.0, 80.0, 85.0, 90.0, 92.5, 95.0, 96.0, 97.0, 98.0, 99.0, 99.5, 99.7, 99.9,
    99.95, 99.97, 99.99, 99.995, 99.999, 100.0,
];

static CLOCK_BASE: OnceLock<Instant> = OnceLock::new();

/// Nanoseconds since the first call in this process (monotonic).
pub fn now_ns() -> u64 {
    let base = CLOCK_BASE.get_or_init(Instant::now);
    base.elapsed().as_nanos() as u64
}

fn new_histogram() -> Histogram<u64> {
    // Bounds are compile-time constants that hdrhistogram accepts; failing here
    // is a programmer error.
    Histogram::new_with_bounds(1, HISTOGRAM_MAX_US, HISTOGRAM_SIGFIG)
        .expect("constant histogram bounds are valid")
}

/// One metric: the histogram of the current interval and of the whole measured run.
pub struct Metric {
    inner: Mutex<(Histogram<u64>, Histogram<u64>)>,
}

impl Default for Metric {
    fn default() -> Self {
        Metric {
            inner: Mutex::new((new_histogram(), new_histogram())),
        }
    }
}

impl Metric {
    pub fn record_us(&self, us: u64) {
        self.record_us_each(std::slice::from_ref(&us));
    }

    /// Records each of `values_us`, taking the lock once.
    pub fn record_us_each(&self, values_us: &[u64]) {
        if values_us.is_empty() {
            return;
        }
        if let Ok(mut g) = self.inner.lock() {
            for &us in values_us {
                let v = us.clamp(1, HISTOGRAM_MAX_US);
                g.0.saturating_record(v);
                g.1.saturating_record(v);
            }
        }
    }

    /// Takes the interval histogram, leaving an empty one.
    pub fn take_interval(&self) -> Histogram<u64> {
        match self.inner.lock() {
            Ok(mut g) => std::mem::replace(&mut g.0, new_histogram()),
            Err(_) => new_histogram(),
        }
    }

    pub fn total(&self) -> Histogram<u64> {
        match self.inner.lock() {
            Ok(g) => g.1.clone(),
            Err(_) => new_histogram(),
        }
    }
}

/// Everything recorded during one phase.
pub struct Recorder {
    /// Send time (on [`now_ns`]) from which messages count; `u64::MAX` during warm-up.
    pub measure_start_ns: AtomicU64,
    pub publish_latency: Metric,
    pub publish_delay: Metric,
    pub end_to_end: Metric,
    /// Transactional producers only: per transaction, the time
    /// `commit_transaction` spends flushing what is still queued (the
    /// bench flushes first so that this part is timed on its own)...
    pub txn_flush: Metric,
    /// ... the rest of `commit_transaction` once nothing is in flight
    /// (EndTxn's round trip, librdkafka's retries of it)...
    pub txn_end: Metric,
    /// ... and the time from `begin_transaction` to the first delivery
    /// report of the transaction (AddPartitionsToTxn, with any
    /// CONCURRENT_TRANSACTIONS retries, then the first Produce).
    pub txn_first_ack: Metric,
    /// Counters over the whole phase, warm-up included (for backlog).
    pub sent_all: AtomicU64,
    /// Sends librdkafka refused with a full queue (each retried later).
    pub refused_all: AtomicU64,
    pub consumed_all: AtomicU64,
    /// Counters of measured messages only.
    pub sent: AtomicU64,
    pub acked: AtomicU64,
    pub errors: AtomicU64,
    pub consumed: AtomicU64,
    /// Acknowledgements that *arrived* while the measurement window was open,
    /// whenever their message was sent: the throughput numerator, exact even
    /// when librdkafka's queue holds seconds of messages (saturating runs).
    pub acked_in_window: AtomicU64,
    pub window_open: AtomicBool,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder {
            measure_start_ns: AtomicU64::new(u64::MAX),
            publish_latency: Metric::default(),
            publish_delay: Metric::default(),
            end_to_end: Metric::default(),
            txn_flush: Metric::default(),
            txn_end: Metric::default(),
            txn_first_ack: Metric::default(),
            sent_all: AtomicU64::new(0),
            refused_all: AtomicU64::new(0),
            consumed_all: AtomicU64::new(0),
            sent: AtomicU64::new(0),
            acked: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            consumed: AtomicU64::new(0),
            acked_in_window: AtomicU64::new(0),
            window_open: AtomicBool::new(false),
        }
    }
}

impl Recorder {
    /// True when a message sent at `send_ns` is part of the measurement.
    pub fn measured(&self, send_ns: u64) -> bool {
        send_ns >= self.measure_start_ns.load(Ordering::Relaxed)
    }

    /// True when something that started at `ns` started inside the open
    /// measurement window (for per-transaction metrics).
    pub fn in_window(&self, ns: u64) -> bool {
        self.measured(ns) && self.window_open.load(Ordering::Relaxed)
    }

    pub fn start_measuring(&self) {
        // Whatever the interval histograms hold is warm-up: drop it.
        self.publish_latency.take_interval();
        self.publish_delay.take_interval();
        self.end_to_end.take_interval();
        self.txn_flush.take_interval();
        self.txn_end.take_interval();
        self.txn_first_ack.take_interval();
        self.measure_start_ns.store(now_ns(), Ordering::Relaxed);
        self.window_open.store(true, Ordering::Relaxed);
    }

    /// Closes the measurement window: later acknowledgements no longer count as throughput.
    pub fn stop_measuring(&self) {
        self.window_open.store(false, Ordering::Relaxed);
    }

    pub fn counters(&self) -> Counters {
        Counters {
            sent_all: self.sent_all.load(Ordering::Relaxed),
            refused_all: self.refused_all.load(Ordering::Relaxed),
            consumed_all: self.consumed_all.load(Ordering::Relaxed),
            sent: self.sent.load(Ordering::Relaxed),
            acked: self.acked.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            consumed: self.consumed.load(Ordering::Relaxed),
            acked_in_window: self.acked_in_window.load(Ordering::Relaxed),
        }
    }
}

#[derive(Debug, Clone, Copy, Default)]
pub struct Counters {
    pub sent_all: u64,
    pub refused_all: u64,
    pub consumed_all: u64,
    pub sent: u64,
    pub acked: u64,
    pub errors: u64,
    pub consumed: u64,
    pub acked_in_window: u64,
}

/// Summary quantiles of one histogram, in milliseconds (or microseconds for publish delay, as OMB).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct Quantiles {
    pub count: u64,
    pub avg: f64,
    pub p50: f64,
    pub p75: f64,
    pub p95: f64,
    pub p99: f64,
    pub p999: f64,
    pub p9999: f64,
    pub max: f64,
}

impl Quantiles {
    /// Quantiles of a microsecond histogram, divided by `unit_us` (1000 for ms, 1 for µs).
    pub fn of(h: &Histogram<u64>, unit_us: f64) -> Self {
        if h.is_empty() {
            return Quantiles::default();
        }
        let q = |p: f64| h.value_at_quantile(p) as f64 / unit_us;
        Quantiles {
            count: h.len(),
            avg: h.mean() / unit_us,
            p50: q(0.50),
            p75: q(0.75),
            p95: q(0.95),
            p99: q(0.99),
            p999: q(0.999),
            p9999: q(0.9999),
            max: h.max() as f64 / unit_us,
        }
    }
}

/// The percentile curve of a histogram: `(percentile, value / unit_us)`.
pub fn curve(h: &Histogram<u64>, unit_us: f64) -> Vec<(f64, f64)> {
    if h.is_empty() {
        return Vec::new();
    }
    CURVE_PERCENTILES
        .iter()
        .map(|&p| (p, h.value_at_quantile(p / 100.0) as f64 / unit_us))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warmup_values_are_not_measured() {
        let r = Recorder::default();
        assert!(!r.measured(now_ns()));
        r.start_measuring();
        assert!(r.measured(now_ns() + 1));
        assert!(!r.measured(0));
    }

    #[test]
    fn quantiles_in_milliseconds() {
        let m = Metric::default();
        for us in 1..=1000 {
            m.record_us(us);
        }
        let q = Quantiles::of(&m.total(), 1000.0);
        assert_eq!(q.count, 1000);
        assert!((q.p50 - 0.5).abs() < 0.01, "{q:?}");
        assert!((q.max - 1.0).abs() < 0.01, "{q:?}");
        let i = m.take_interval();
        assert_eq!(i.len(), 1000);
        assert!(m.take_interval().is_empty());
        assert_eq!(m.total().len(), 1000);
    }
}
