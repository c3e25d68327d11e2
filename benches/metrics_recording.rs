//! What metrics recording costs per event, in nanoseconds: the work a
//! shard does for metrics per request answered (four monotonic clock reads
//! and `record_request`), per batch appended (`record_append`) and per
//! fdatasync (two clock reads and `record_fsync`), each with recording on
//! (the default) and off (`--metrics-recording false`: one thread-local
//! read). Multiplied by the events per GB of a workload, this bounds the
//! share of broker CPU that metrics take far below what a side-by-side
//! run of the broker can resolve on a noisy machine
//! (`tuning/results/metrics-cost.md`).
//!
//! Run: `cargo bench --bench metrics_recording`.

use criterion::{criterion_group, criterion_main, Criterion};
use fjord::clock::monotonic;
use fjord::metrics;
use std::hint::black_box;

/// What `net` does for one request: a clock read when the frame is read,
/// when the handler starts, when the answer is ready and when it is sent,
/// then one `record_request` (each read only while recording).
fn one_request(api_key: i16) {
    let at = || metrics::recording().then(monotonic);
    let (read, dispatched, ready) = (at(), at(), at());
    if let (Some(read), Some(dispatched), Some(ready)) = (read, dispatched, ready) {
        let sent = monotonic();
        metrics::record_request(
            black_box(api_key),
            black_box(1_048_576),
            black_box(120),
            dispatched.saturating_duration_since(read),
            ready.saturating_duration_since(dispatched),
            sent.saturating_duration_since(ready),
            false,
        );
    }
}

/// What the log's syncer does for one fdatasync.
fn one_fsync() {
    if let Some(start) = metrics::recording().then(monotonic) {
        metrics::record_fsync(monotonic().saturating_duration_since(start), black_box(16));
    }
}

fn recording(c: &mut Criterion) {
    for on in [true, false] {
        metrics::set_recording(on);
        let side = if on { "on" } else { "off" };
        c.bench_function(&format!("per request, recording {side}"), |b| {
            b.iter(|| one_request(0))
        });
        c.bench_function(&format!("per append, recording {side}"), |b| {
            b.iter(|| metrics::record_append(black_box(1_048_576)))
        });
        c.bench_function(&format!("per fdatasync, recording {side}"), |b| {
            b.iter(one_fsync)
        });
    }
    metrics::set_recording(true);
}

criterion_group!(benches, recording);
criterion_main!(benches);
