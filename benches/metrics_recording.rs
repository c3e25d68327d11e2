//! What metrics recording costs per event, in nanoseconds: the work a
//! shard does for metrics per request answered (four monotonic clock reads,
//! the response's error code counted with `record_errors`, its future
//! polled once through `RequestTimed`, and `record_request`), per batch
//! appended (`record_append`) and per
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
use std::future::Future;
use std::hint::black_box;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

/// What `net` and a handler do for one request of one partition: a clock
/// read when the frame is read, when the handler starts, when the answer
/// is ready and when it is sent; the answer's future polled (once, ready)
/// through `RequestTimed`; the partition's error code counted; then one
/// `record_request` (each read only while recording).
fn one_request(api_key: i16) {
    let at = || metrics::recording().then(monotonic);
    let (read, dispatched) = (at(), at());
    let mut answered = metrics::RequestTimed::new(std::future::ready(black_box(0i16)));
    let mut cx = Context::from_waker(Waker::noop());
    let Poll::Ready((code, remote)) = Pin::new(&mut answered).poll(&mut cx) else {
        unreachable!("a ready future answers at its first poll");
    };
    metrics::record_errors(api_key, |counts| counts.count(code));
    let ready = at();
    if let (Some(read), Some(dispatched), Some(ready)) = (read, dispatched, ready) {
        let sent = monotonic();
        metrics::record_request(
            black_box(api_key),
            black_box(1_048_576),
            black_box(120),
            metrics::RequestTimes {
                queue: dispatched.saturating_duration_since(read),
                handle: ready.saturating_duration_since(dispatched),
                remote,
                send: sent.saturating_duration_since(ready),
            },
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
