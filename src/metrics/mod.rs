//! Metrics recording: what each shard counts on its own, in plain `Cell`s,
//! for the Prometheus endpoint (`net::metrics_http`) to merge when scraped.
//!
//! Every probe here is a thread-local, and a shard is a thread: a shard
//! records only into its own cells, so recording is a load and a store in
//! memory no other core touches (no atomics, no locks, no allocation). The
//! values leave the shard only when a scrape asks for them: the endpoint's
//! shard sends every shard a message over the channel mesh, and each shard
//! answers with a [`ShardSample`] — plain owned data — built from its own
//! cells and state (`shard::metrics`). The merge and the text encoding
//! ([`encode`]) run on the endpoint's shard, at scrape time only.
//!
//! The probes live in a low layer (above only `alloc` and `clock`, whose
//! monotonic time `remote_wait` reads) so that `log` (below `shard`) can
//! count appends, fdatasyncs and cache hits without reaching up; the
//! per-API request probes are used by `net`, which sees every request.
//!
//! Recording can be switched off per shard (`--metrics-recording false`),
//! which makes every `record_*` function return after one thread-local
//! read: the baseline for measuring what metrics cost
//! (`tuning/results/metrics-cost.md`). Gauges read from state at scrape
//! time (offsets, sizes, groups) are not affected.
//!
//! Why not the `prometheus-client` crate: its counters and histograms are
//! atomics behind `Arc`s in a shared registry, made to be recorded from any
//! thread. Here each value is recorded by one thread and read by that same
//! thread when it builds its sample, so atomics would buy nothing and cost
//! a locked instruction per update; and the registry's metric families
//! would have to be rebuilt from the merged samples on every scrape anyway.
//! What is left — writing `# HELP`/`# TYPE` lines, label escaping,
//! cumulative histogram buckets and the OpenMetrics `# EOF` — is a small,
//! unit-tested text encoder ([`encode`]), checked by `promtool check
//! metrics` in `tests/server_metrics.rs`.

pub mod encode;
pub mod histogram;
pub mod sample;

pub use histogram::{Histogram, HistogramSample};
pub use sample::*;

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

/// API keys counted per key (Kafka's keys are below 100; larger ones go to
/// the last slot, which is not exported).
pub const API_KEYS_MAX: usize = 100;

/// Error codes counted per API key: slot `code + 1` holds codes -1
/// (UNKNOWN_SERVER_ERROR) to `ERROR_CODES_MAX - 3`; a code outside that
/// range (none that Kafka 4.x defines: its highest is 133) goes to the
/// last slot, exported as `error="OTHER"`.
pub const ERROR_CODES_MAX: usize = 137;

thread_local! {
    /// Nanoseconds the request being polled has waited in
    /// [`remote_wait`]s, while [`RequestTimed`] polls it (see there).
    static REMOTE_NS: Cell<u64> = const { Cell::new(0) };
}

thread_local! {
    static ENABLED: Cell<bool> = const { Cell::new(true) };
    static REQUESTS: RequestProbe = const { RequestProbe::new() };
    static LOG: LogProbe = const { LogProbe::new() };
    static COORD: CoordinatorProbe = const { CoordinatorProbe::new() };
}

/// Turns recording on or off for this thread (shard); see the module doc.
pub fn set_recording(on: bool) {
    ENABLED.set(on);
}

/// Whether this thread records.
pub fn recording() -> bool {
    ENABLED.get()
}

fn bump(c: &Cell<u64>, by: u64) {
    c.set(c.get().wrapping_add(by));
}

/// One API key's request counters and latency histograms.
pub struct ApiProbe {
    pub requests: Cell<u64>,
    /// Requests that closed the connection instead of being answered.
    pub closed: Cell<u64>,
    pub bytes_in: Cell<u64>,
    pub bytes_out: Cell<u64>,
    /// From the whole frame read to the response handed to the socket.
    pub total: Histogram,
    /// From the frame read until the handler starts (waiting behind the
    /// ordered stage of earlier requests on the connection).
    pub queue: Histogram,
    /// From the handler's start to its answer being ready, less the
    /// remote time: Kafka's LocalTimeMs.
    pub local: Histogram,
    /// The handler's waits in [`remote_wait`] (acks=-1 produce waiting for
    /// its write and fdatasync, a long-poll fetch parked): Kafka's
    /// RemoteTimeMs (the time in a purgatory).
    pub remote: Histogram,
    /// From the answer being ready to its bytes handed to the socket:
    /// Kafka's ResponseQueueTimeMs + ResponseSendTimeMs (waiting behind
    /// earlier responses of the connection, then the write).
    pub send: Histogram,
}

impl ApiProbe {
    const fn new() -> ApiProbe {
        ApiProbe {
            requests: Cell::new(0),
            closed: Cell::new(0),
            bytes_in: Cell::new(0),
            bytes_out: Cell::new(0),
            total: Histogram::new(),
            queue: Histogram::new(),
            local: Histogram::new(),
            remote: Histogram::new(),
            send: Histogram::new(),
        }
    }
}

/// A shard's request and connection counters.
pub struct RequestProbe {
    pub apis: [ApiProbe; API_KEYS_MAX],
    /// Error codes in responses, per API key (Kafka's ErrorsPerSec): see
    /// [`ErrorCounts`].
    pub errors: [ErrorCounts; API_KEYS_MAX],
    pub connections_accepted: Cell<u64>,
    pub connections_closed: Cell<u64>,
    pub connections_refused: Cell<u64>,
}

impl RequestProbe {
    const fn new() -> RequestProbe {
        RequestProbe {
            apis: [const { ApiProbe::new() }; API_KEYS_MAX],
            errors: [const { ErrorCounts::new() }; API_KEYS_MAX],
            connections_accepted: Cell::new(0),
            connections_closed: Cell::new(0),
            connections_refused: Cell::new(0),
        }
    }
}

fn api_slot(api_key: i16) -> usize {
    (api_key.max(0) as usize).min(API_KEYS_MAX - 1)
}

/// The parts of one request's latency (see [`ApiProbe`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct RequestTimes {
    pub queue: Duration,
    /// Handler start to answer ready, remote time included.
    pub handle: Duration,
    /// The part of `handle` spent in [`remote_wait`]s.
    pub remote: Duration,
    pub send: Duration,
}

/// One request answered (or closed): its frame bytes, response bytes and
/// the parts of its latency.
pub fn record_request(
    api_key: i16,
    bytes_in: usize,
    bytes_out: usize,
    times: RequestTimes,
    closed: bool,
) {
    if !recording() {
        return;
    }
    REQUESTS.with(|r| {
        let a = &r.apis[api_slot(api_key)];
        bump(&a.requests, 1);
        bump(&a.closed, closed as u64);
        bump(&a.bytes_in, bytes_in as u64);
        bump(&a.bytes_out, bytes_out as u64);
        // Waits overlap when a handler joins several: remote time is at
        // most the handler's time.
        let remote = times.remote.min(times.handle);
        a.queue.record(times.queue);
        a.local.record(times.handle - remote);
        a.remote.record(remote);
        a.send.record(times.send);
        a.total.record(times.queue + times.handle + times.send);
    });
}

/// One API key's error-code counters: slot `code + 1` (see
/// [`ERROR_CODES_MAX`]).
pub struct ErrorCounts {
    pub codes: [Cell<u64>; ERROR_CODES_MAX],
}

impl ErrorCounts {
    const fn new() -> ErrorCounts {
        ErrorCounts {
            codes: [const { Cell::new(0) }; ERROR_CODES_MAX],
        }
    }

    /// Counts one occurrence of `code` (0 = NONE counts too, as in Kafka).
    #[inline]
    pub fn count(&self, code: i16) {
        let slot = if (-1..=ERROR_CODES_MAX as i16 - 3).contains(&code) {
            (code + 1) as usize
        } else {
            ERROR_CODES_MAX - 1
        };
        bump(&self.codes[slot], 1);
    }

    /// The error code of a slot, `None` for the last (out-of-range) one.
    pub fn code_of_slot(slot: usize) -> Option<i16> {
        (slot < ERROR_CODES_MAX - 1).then(|| slot as i16 - 1)
    }
}

/// Counts the error codes of one response of `api_key`, as Kafka's
/// `RequestChannel.updateErrorMetrics` counts a response's `errorCounts()`:
/// `each` calls the counter once per error code the response carries
/// (top-level, per topic, per partition — whatever Kafka's response type
/// counts), NONE included. One thread-local access per response; nothing
/// is called when recording is off.
pub fn record_errors(api_key: i16, each: impl FnOnce(&ErrorCounts)) {
    if !recording() {
        return;
    }
    REQUESTS.with(|r| each(&r.errors[api_slot(api_key)]));
}

/// A request's future, timed: its output comes with the time it spent in
/// [`remote_wait`]s while polled. Requests of one shard interleave on its
/// thread, so the wait time cannot be kept in one thread-local for all:
/// each poll swaps this request's running total into [`REMOTE_NS`] and
/// back out, which makes it a task-local (two thread-local accesses per
/// poll, no allocation).
pub struct RequestTimed<F> {
    inner: F,
    remote_ns: u64,
}

impl<F: Future + Unpin> RequestTimed<F> {
    pub fn new(inner: F) -> RequestTimed<F> {
        RequestTimed {
            inner,
            remote_ns: 0,
        }
    }
}

impl<F: Future + Unpin> Future for RequestTimed<F> {
    type Output = (F::Output, Duration);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let outer = REMOTE_NS.replace(this.remote_ns);
        let polled = Pin::new(&mut this.inner).poll(cx);
        this.remote_ns = REMOTE_NS.replace(outer);
        polled.map(|out| (out, Duration::from_nanos(this.remote_ns)))
    }
}

/// Awaits `wait`, a handler's wait for something outside it (the log's
/// write or fdatasync for acks=-1, a long poll for new data), and adds how
/// long it took to the remote time of the request polling it (Kafka's
/// RemoteTimeMs: the time in a purgatory). Two clock reads; none with
/// recording off.
pub async fn remote_wait<F: Future>(wait: F) -> F::Output {
    let start = recording().then(crate::clock::monotonic);
    let out = wait.await;
    if let Some(start) = start {
        let took = crate::clock::monotonic().saturating_duration_since(start);
        let ns = took.as_nanos().min(u64::MAX as u128) as u64;
        REMOTE_NS.set(REMOTE_NS.get().saturating_add(ns));
    }
    out
}

/// A connection accepted, closed, or refused at `--max-connections-per-shard`.
pub fn record_connection(event: ConnectionEvent) {
    if !recording() {
        return;
    }
    REQUESTS.with(|r| match event {
        ConnectionEvent::Accepted => bump(&r.connections_accepted, 1),
        ConnectionEvent::Closed => bump(&r.connections_closed, 1),
        ConnectionEvent::Refused => bump(&r.connections_refused, 1),
    });
}

#[derive(Debug, Clone, Copy)]
pub enum ConnectionEvent {
    Accepted,
    Closed,
    Refused,
}

/// A shard's log counters (all of its partitions, internal ones too).
pub struct LogProbe {
    pub appends: Cell<u64>,
    pub append_bytes: Cell<u64>,
    pub fsyncs: Cell<u64>,
    pub fsync: Histogram,
    /// Appends covered by one fdatasync (group commit), per fdatasync.
    pub fsync_batch_appends: CountHistogram,
    pub cache_hits: Cell<u64>,
    pub cache_hit_bytes: Cell<u64>,
    pub cache_misses: Cell<u64>,
    pub catch_up_read_bytes: Cell<u64>,
    /// Log cleanings (compacted logs) this shard ran, what they read and
    /// wrote, and their time in µs.
    pub cleanings: Cell<u64>,
    pub cleaner_read_bytes: Cell<u64>,
    pub cleaner_written_bytes: Cell<u64>,
    pub cleaner_micros: Cell<u64>,
    /// The dirty ratio of the log the last cleaning took, in millionths.
    pub cleaner_last_dirty_ppm: Cell<u64>,
}

impl LogProbe {
    const fn new() -> LogProbe {
        LogProbe {
            appends: Cell::new(0),
            append_bytes: Cell::new(0),
            fsyncs: Cell::new(0),
            fsync: Histogram::new(),
            fsync_batch_appends: CountHistogram::new(),
            cache_hits: Cell::new(0),
            cache_hit_bytes: Cell::new(0),
            cache_misses: Cell::new(0),
            catch_up_read_bytes: Cell::new(0),
            cleanings: Cell::new(0),
            cleaner_read_bytes: Cell::new(0),
            cleaner_written_bytes: Cell::new(0),
            cleaner_micros: Cell::new(0),
            cleaner_last_dirty_ppm: Cell::new(0),
        }
    }
}

/// One batch appended to a partition log.
pub fn record_append(bytes: usize) {
    if !recording() {
        return;
    }
    LOG.with(|l| {
        bump(&l.appends, 1);
        bump(&l.append_bytes, bytes as u64);
    });
}

/// One fdatasync of a log's segment, how long it took and how many
/// appends (offsets) it made durable.
pub fn record_fsync(took: Duration, offsets_covered: u64) {
    if !recording() {
        return;
    }
    LOG.with(|l| {
        bump(&l.fsyncs, 1);
        l.fsync.record(took);
        l.fsync_batch_appends.record(offsets_covered);
    });
}

/// A fetch read answered from the tail cache (`Some(bytes)`) or not.
pub fn record_cache_read(hit: Option<usize>) {
    if !recording() {
        return;
    }
    LOG.with(|l| match hit {
        Some(bytes) => {
            bump(&l.cache_hits, 1);
            bump(&l.cache_hit_bytes, bytes as u64);
        }
        None => bump(&l.cache_misses, 1),
    });
}

/// Bytes a fetch reads from segment files (older than the tail cache).
pub fn record_catch_up_read(bytes: usize) {
    if !recording() {
        return;
    }
    LOG.with(|l| bump(&l.catch_up_read_bytes, bytes as u64));
}

/// One log cleaning: bytes its cleaning pass read and wrote, how long it
/// took, and the dirty ratio of the log it took.
pub fn record_cleaning(read: u64, written: u64, took: Duration, dirty_ratio: f64) {
    if !recording() {
        return;
    }
    LOG.with(|l| {
        bump(&l.cleanings, 1);
        bump(&l.cleaner_read_bytes, read);
        bump(&l.cleaner_written_bytes, written);
        bump(&l.cleaner_micros, took.as_micros() as u64);
        l.cleaner_last_dirty_ppm
            .set((dirty_ratio.clamp(0.0, 1.0) * 1e6) as u64);
    });
}

/// A shard's coordinator counters.
pub struct CoordinatorProbe {
    pub rebalances: Cell<u64>,
    pub markers: Cell<u64>,
    pub fenced_producers: Cell<u64>,
    /// Transactions this shard's coordinator completed, from their first
    /// partition added to their COMMIT/ABORT markers written, by outcome.
    pub txn_committed: Histogram,
    pub txn_aborted: Histogram,
    /// Producer-id blocks this shard was handed.
    pub producer_id_blocks: Cell<u64>,
}

impl CoordinatorProbe {
    const fn new() -> CoordinatorProbe {
        CoordinatorProbe {
            rebalances: Cell::new(0),
            markers: Cell::new(0),
            fenced_producers: Cell::new(0),
            txn_committed: Histogram::new(),
            txn_aborted: Histogram::new(),
            producer_id_blocks: Cell::new(0),
        }
    }
}

/// A transaction completed at this shard's coordinator: `took` from its
/// start (first partition or offsets added) to every marker written.
pub fn record_transaction(committed: bool, took: Duration) {
    if recording() {
        COORD.with(|c| {
            if committed {
                c.txn_committed.record(took);
            } else {
                c.txn_aborted.record(took);
            }
        });
    }
}

/// This shard was handed a new block of producer ids.
pub fn record_producer_id_block() {
    if recording() {
        COORD.with(|c| bump(&c.producer_id_blocks, 1));
    }
}

/// A group's generation was bumped (a rebalance completed its join phase).
pub fn record_rebalance() {
    if recording() {
        COORD.with(|c| bump(&c.rebalances, 1));
    }
}

/// A transaction marker (COMMIT/ABORT) appended to a partition.
pub fn record_marker() {
    if recording() {
        COORD.with(|c| bump(&c.markers, 1));
    }
}

/// A produce, marker or commit refused for a stale producer epoch.
pub fn record_fenced_producer() {
    if recording() {
        COORD.with(|c| bump(&c.fenced_producers, 1));
    }
}

/// A histogram of small counts (1, 2, 4, … 2^15 and more).
pub struct CountHistogram {
    pub buckets: [Cell<u64>; COUNT_BUCKETS],
    pub sum: Cell<u64>,
}

/// Buckets of [`CountHistogram`]: upper bounds 1, 2, 4, … 2^15, then +Inf.
pub const COUNT_BUCKETS: usize = 17;

impl CountHistogram {
    const fn new() -> CountHistogram {
        CountHistogram {
            buckets: [const { Cell::new(0) }; COUNT_BUCKETS],
            sum: Cell::new(0),
        }
    }

    fn record(&self, n: u64) {
        // Bucket i holds counts <= 2^i.
        let i = if n <= 1 {
            0
        } else {
            (64 - (n - 1).leading_zeros()) as usize
        };
        bump(&self.buckets[i.min(COUNT_BUCKETS - 1)], 1);
        bump(&self.sum, n);
    }

    pub fn sample(&self) -> HistogramSample {
        let bounds = (0..COUNT_BUCKETS - 1).map(|i| (1u64 << i) as f64).collect();
        HistogramSample {
            bounds,
            counts: self.buckets.iter().map(Cell::get).collect(),
            sum: self.sum.get() as f64,
        }
    }
}

/// This thread's request probe, read when a shard builds its sample.
pub fn with_requests<T>(f: impl FnOnce(&RequestProbe) -> T) -> T {
    REQUESTS.with(f)
}

/// This thread's log probe.
pub fn with_log<T>(f: impl FnOnce(&LogProbe) -> T) -> T {
    LOG.with(f)
}

/// This thread's coordinator probe.
pub fn with_coordinators<T>(f: impl FnOnce(&CoordinatorProbe) -> T) -> T {
    COORD.with(f)
}

/// CPU time this thread has used (CLOCK_THREAD_CPUTIME_ID): read on a
/// shard's own thread, it is that shard's CPU time.
pub fn thread_cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec for clock_gettime to fill.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0.0;
    }
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}
