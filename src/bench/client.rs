//! The bench's Kafka clients (librdkafka through `rdkafka`): topic set-up, the
//! open-loop producer threads and the consumer threads.
//!
//! Open loop: producer `k` of `n` sends message `i` at the intended time
//! `start + i / rate_per_producer`, whatever happened to earlier sends. If the
//! client falls behind (librdkafka's queue is full, a transaction commit
//! blocks, the thread was descheduled), the lateness is recorded as *publish
//! delay* instead of silently lowering the offered load (coordinated omission).
//! Publish latency is measured from the actual send to the delivery report.
//!
//! The producer thread serves its own delivery reports: between sends it
//! waits for whichever comes first, the next intended send time or a report
//! (`ReportingProducer`). A separate polling thread (rdkafka's `ThreadedProducer`)
//! would cost one more thread wake-up per acknowledged request on the
//! client's core, and on a machine where client and broker share two cores
//! that core is the bottleneck of the latency workload.
//!
//! Sends go to librdkafka in bursts: everything due by the time of a send,
//! up to `SEND_BURST_MAX` messages, is handed over in one
//! `rd_kafka_produce_batch` call on a topic handle, with one send time.
//! Each message still has its own intended time, publish delay and
//! delivery report. At a fixed rate below the client's limit a burst is one
//! message; a saturating run sends full bursts, and librdkafka looks the
//! topic up, locks it and reads its clocks once per burst instead of once
//! per message (`rd_kafka_producev`, what rdkafka's `send` calls, does all
//! of that for every message).
//!
//! Every payload starts with the send time (8 bytes, little-endian
//! nanoseconds on [`now_ns`]); consumers subtract it from their receipt time
//! for end-to-end latency. Each producer and consumer is one OS thread; they
//! share only the [`Recorder`] and the stop flags.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::{ClientContext, DefaultClientContext};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, DeliveryResult, Producer, ProducerContext};
use rdkafka::{Offset, TopicPartitionList};

use super::config::{BenchConfig, KeyMode};
use super::recorder::{now_ns, Recorder};
use super::BenchError;

/// Timeout of metadata, watermark and admin requests during set-up.
pub const SETUP_TIMEOUT_MS: u64 = 15_000;
/// How long transactional calls (init, commit) may take.
pub const TRANSACTION_TIMEOUT_MS: u64 = 30_000;
/// A producer sleeps until the intended send time only when it is at least
/// this far away; closer sends go out at once (sleep overshoots by tens of µs).
pub const SLEEP_THRESHOLD_US: u64 = 20;
/// Most messages one send hands to librdkafka (`rd_kafka_produce_batch`):
/// a producer behind its schedule sends what is due in bursts of up to this
/// many, then serves the delivery reports that arrived meanwhile.
pub const SEND_BURST_MAX: usize = 64;
/// Pause before retrying a send that librdkafka refused with a full queue.
pub const QUEUE_FULL_BACKOFF_US: u64 = 200;
/// librdkafka's producer queue (`queue.buffering.max.messages`, its default):
/// bounds how far a saturating run queues ahead of the broker.
pub const PRODUCER_QUEUE_MESSAGES_MAX: u64 = 100_000;
/// How long a producer waits for outstanding acknowledgements after the run.
pub const FLUSH_TIMEOUT_MS: u64 = 15_000;
/// Longest single wait while flushing: reports wake the thread, but with
/// events still queued none signals, so this bounds how late they are served.
pub const FLUSH_WAIT_MAX_US: u64 = 1_000;
/// Most events one serving of the producer's queue takes (an event is one
/// partition's delivery reports from one response, a log line or an error):
/// bounds the time serving takes before the thread looks at the clock again.
pub const SERVE_POLLS_MAX: usize = 64;
/// Consumer poll timeout: bounds how long a stop request waits.
pub const CONSUMER_POLL_MS: u64 = 100;

fn kafka(what: &str) -> impl Fn(KafkaError) -> BenchError + '_ {
    move |source| BenchError::Kafka {
        what: what.to_string(),
        source,
    }
}

/// What every client of the run starts from: the bootstrap, then
/// `--client-config` (e.g. the security settings, which the admin client
/// creating the topic needs as much as the producers).
fn base_config(cfg: &BenchConfig) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &cfg.bootstrap)
        .set("log_level", "3");
    for (k, v) in &cfg.client_config {
        c.set(k, v);
    }
    c
}

/// Creates the topic when missing, waits until every partition has a leader,
/// and returns each partition's high watermark (where consumers start).
pub fn prepare_topic(cfg: &BenchConfig) -> Result<Vec<i64>, BenchError> {
    let admin: AdminClient<DefaultClientContext> = base_config(cfg)
        .create()
        .map_err(kafka("creating admin client"))?;
    let topic = NewTopic::new(&cfg.topic, cfg.partitions, TopicReplication::Fixed(1));
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_millis(SETUP_TIMEOUT_MS)));
    let results = futures::executor::block_on(admin.create_topics([&topic], &opts))
        .map_err(kafka("CreateTopics"))?;
    for r in results {
        match r {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((t, code)) => {
                return Err(BenchError::Broker(format!("creating topic {t}: {code}")));
            }
        }
    }
    let consumer: BaseConsumer = base_config(cfg)
        .create()
        .map_err(kafka("creating set-up consumer"))?;
    let deadline = Instant::now() + Duration::from_millis(SETUP_TIMEOUT_MS);
    let partitions = loop {
        let md = consumer
            .fetch_metadata(Some(&cfg.topic), Duration::from_millis(SETUP_TIMEOUT_MS))
            .map_err(kafka("Metadata"))?;
        let n = md
            .topics()
            .iter()
            .find(|t| t.name() == cfg.topic && t.error().is_none())
            .map(|t| t.partitions().iter().filter(|p| p.leader() >= 0).count())
            .unwrap_or(0);
        if n > 0 && n >= cfg.partitions as usize {
            break n;
        }
        if Instant::now() > deadline {
            return Err(BenchError::Broker(format!(
                "topic {} has {n} partitions with a leader, want {}",
                cfg.topic, cfg.partitions
            )));
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    // A broker may name a leader in its metadata before that leader serves
    // the partition (stock Kafka right after CreateTopics of 16
    // partitions): retriable errors are retried until the set-up deadline.
    let mut starts = Vec::with_capacity(partitions);
    for p in 0..partitions as i32 {
        let high = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match consumer.fetch_watermarks(&cfg.topic, p, left.max(Duration::from_millis(100))) {
                Ok((_, high)) => break high,
                Err(KafkaError::MetadataFetch(
                    RDKafkaErrorCode::NotLeaderForPartition
                    | RDKafkaErrorCode::LeaderNotAvailable
                    | RDKafkaErrorCode::UnknownTopicOrPartition,
                )) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(100)),
                Err(e) => return Err(kafka("ListOffsets")(e)),
            }
        };
        starts.push(high);
    }
    Ok(starts)
}

/// Delivery reports: publish latency and acknowledgement counts.
struct BenchProducerContext {
    recorder: Arc<Recorder>,
    /// When the producer's current transaction began (on [`now_ns`], at
    /// least 1) while its first delivery report is awaited; 0 otherwise.
    txn_begin_ns: Arc<AtomicU64>,
    /// The handling time of delivery reports.
    clock: ReportClock,
}

/// The time delivery reports are handled at, read from the clock once per
/// `REPORT_CLOCK_READS_EVERY` reports of one librdkafka event.
///
/// One event carries the reports of a whole produce request (about a
/// thousand at 1 KiB messages and 1 MiB batches), handled one after another
/// in a few hundred nanoseconds each. Reading the clock for every one was 7 %
/// of the client core's time in a saturating run, with librdkafka's own
/// clock reads another 10 %, and that core is what limits the throughput
/// measured. A report's time is at most `REPORT_CLOCK_READS_EVERY - 1`
/// reports old (about a microsecond, the histograms' resolution), and the
/// first report of every event reads the clock afresh
/// ([`ReportClock::next_event`]), so time between events is never lost.
/// (A report waiting on the histogram's lock, or a preempted thread, can
/// make the group's later reports look that much faster; the error is
/// always toward lower latency.) When the producer is dropped, librdkafka
/// may serve the last reports outside [`ReportingProducer::serve`]; from
/// then on every report reads the clock ([`ReportClock::read_always`]).
struct ReportClock {
    ns: AtomicU64,
    /// Reports timed with `ns` so far; `u32::MAX` when the next report
    /// must read the clock.
    uses: std::sync::atomic::AtomicU32,
    always: AtomicBool,
}

impl Default for ReportClock {
    fn default() -> Self {
        ReportClock {
            ns: AtomicU64::new(0),
            uses: std::sync::atomic::AtomicU32::new(u32::MAX),
            always: AtomicBool::new(false),
        }
    }
}

/// See [`ReportClock`].
const REPORT_CLOCK_READS_EVERY: u32 = 8;

impl ReportClock {
    /// The next event's first report reads the clock.
    fn next_event(&self) {
        self.uses.store(u32::MAX, Ordering::Relaxed);
    }

    /// Every report reads the clock from now on.
    fn read_always(&self) {
        self.always.store(true, Ordering::Relaxed);
    }

    fn now_ns(&self) -> u64 {
        let uses = self.uses.load(Ordering::Relaxed);
        if uses < REPORT_CLOCK_READS_EVERY - 1 && !self.always.load(Ordering::Relaxed) {
            self.uses.store(uses + 1, Ordering::Relaxed);
            return self.ns.load(Ordering::Relaxed);
        }
        let ns = now_ns();
        self.ns.store(ns, Ordering::Relaxed);
        self.uses.store(0, Ordering::Relaxed);
        ns
    }
}

impl ClientContext for BenchProducerContext {
    /// librdkafka's own log lines (their level is set by `log_level`, 3 =
    /// errors by default; raise it with `--producer-config log_level=7
    /// --producer-config debug=eos,msg`) go to stderr, stamped with
    /// milliseconds on [`now_ns`]'s clock to time protocol steps.
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, log_message: &str) {
        let ms = now_ns() as f64 / 1e6;
        eprintln!("librdkafka {ms:.3} {level:?} {fac}: {log_message}");
    }

    /// Error events (e.g. a fatal idempotence error) go to stderr too: the
    /// default sends them to the `log` crate, which the bench does not set up.
    fn error(&self, error: KafkaError, reason: &str) {
        let ms = now_ns() as f64 / 1e6;
        eprintln!("librdkafka {ms:.3} error: {error}: {reason}");
    }
}

impl ProducerContext for BenchProducerContext {
    /// The send time on [`now_ns`].
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, send_ns: usize) {
        let send_ns = send_ns as u64;
        if result.is_ok() && self.txn_begin_ns.load(Ordering::Relaxed) != 0 {
            let begin_ns = self.txn_begin_ns.swap(0, Ordering::Relaxed);
            if begin_ns != 0 && self.recorder.in_window(begin_ns) {
                let us = now_ns().saturating_sub(begin_ns) / 1_000;
                self.recorder.txn_first_ack.record_us(us);
            }
        }
        if result.is_ok() && self.recorder.window_open.load(Ordering::Relaxed) {
            self.recorder
                .acked_in_window
                .fetch_add(1, Ordering::Relaxed);
        }
        if !self.recorder.measured(send_ns) {
            return;
        }
        match result {
            Ok(_) => {
                let us = self.clock.now_ns().saturating_sub(send_ns) / 1_000;
                self.recorder.publish_latency.record_us(us);
                self.recorder.acked.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {
                self.recorder.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// A `BaseProducer` whose delivery reports the producer thread serves itself.
///
/// librdkafka queues reports on its main queue; `wake` is an eventfd it
/// writes to when that queue was empty and an event arrives, so the thread
/// can wait with microsecond timeouts (librdkafka's own poll timeouts are
/// whole milliseconds) and still wake for a report at once.
struct ReportingProducer {
    // Fields drop in this order: the topic handle, the queue handle (which
    // first stops the writes to the eventfd), the client, then the eventfd.
    topic: TopicHandle,
    queue: MainQueue,
    producer: BaseProducer<BenchProducerContext>,
    wake: std::os::fd::OwnedFd,
}

/// A counted reference to librdkafka's main queue of one client, with IO
/// events enabled.
struct MainQueue(*mut rdkafka::bindings::rd_kafka_queue_t);

impl Drop for MainQueue {
    fn drop(&mut self) {
        // SAFETY: the handle came from rd_kafka_queue_get_main and is
        // released once, here; fd -1 disables the IO events.
        unsafe {
            rdkafka::bindings::rd_kafka_queue_io_event_enable(self.0, -1, std::ptr::null(), 0);
            rdkafka::bindings::rd_kafka_queue_destroy(self.0);
        }
    }
}

/// An application reference to one librdkafka topic of one client.
struct TopicHandle(*mut rdkafka::bindings::rd_kafka_topic_t);

impl Drop for TopicHandle {
    fn drop(&mut self) {
        // SAFETY: the handle came from rd_kafka_topic_new and is released
        // once, here, before its client is destroyed (`ReportingProducer`'s
        // field order).
        unsafe { rdkafka::bindings::rd_kafka_topic_destroy(self.0) };
    }
}

/// The messages of one send (`ReportingProducer::send_burst`): payload,
/// keys and librdkafka's per-message slots, reused from send to send.
struct Burst {
    /// Every message of a send has the same bytes (the send time, then the
    /// template), and librdkafka copies each (F_COPY): one buffer serves all.
    payload: Vec<u8>,
    keys: Vec<[u8; 8]>,
    /// Filled by `send_burst`; `err` holds each message's outcome.
    messages: Vec<rdkafka::bindings::rd_kafka_message_t>,
}

impl Burst {
    fn new(template: &[u8]) -> Burst {
        Burst {
            payload: template.to_vec(),
            keys: vec![[0; 8]; SEND_BURST_MAX],
            messages: Vec::with_capacity(SEND_BURST_MAX),
        }
    }
}

impl Drop for ReportingProducer {
    /// Dropping the producer purges and flushes it, and that flush polls
    /// librdkafka's queue itself, outside `serve`.
    fn drop(&mut self) {
        self.producer.context().clock.read_always();
    }
}

impl ReportingProducer {
    fn new(c: &ClientConfig, ctx: BenchProducerContext, topic: &str) -> Result<Self, BenchError> {
        use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
        let producer: BaseProducer<BenchProducerContext> = c
            .create_with_context(ctx)
            .map_err(kafka("creating producer"))?;
        let name = std::ffi::CString::new(topic)
            .map_err(|_| BenchError::Config(format!("topic name {topic:?} has a NUL byte")))?;
        // SAFETY: the client is live; the name is copied by librdkafka; a
        // null configuration takes the client's defaults.
        let rkt = unsafe {
            rdkafka::bindings::rd_kafka_topic_new(
                producer.client().native_ptr(),
                name.as_ptr(),
                std::ptr::null_mut(),
            )
        };
        if rkt.is_null() {
            return Err(BenchError::Config(format!(
                "librdkafka refused a handle for topic {topic:?}"
            )));
        }
        let topic = TopicHandle(rkt);
        // SAFETY: eventfd has no memory arguments; a valid fd is owned below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(BenchError::Io {
                what: "creating the delivery-report eventfd".to_string(),
                source: std::io::Error::last_os_error(),
            });
        }
        // SAFETY: `fd` is a fresh descriptor nothing else owns.
        let wake = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: the client pointer is live (we own the producer); the queue
        // reference is released by `MainQueue`'s drop, before the client and
        // the eventfd go. librdkafka copies the payload: an eventfd takes an
        // 8-byte counter.
        let queue = unsafe {
            let q = rdkafka::bindings::rd_kafka_queue_get_main(producer.client().native_ptr());
            let one = 1u64.to_ne_bytes();
            rdkafka::bindings::rd_kafka_queue_io_event_enable(
                q,
                wake.as_raw_fd(),
                one.as_ptr().cast(),
                one.len(),
            );
            MainQueue(q)
        };
        Ok(ReportingProducer {
            topic,
            queue,
            producer,
            wake,
        })
    }

    /// Hands the first `n` messages of `burst` to librdkafka in one call.
    /// Each carries `send_ns` as its delivery opaque and in the first 8
    /// bytes of its payload, and `burst.keys[j]` as its key when `keyed`;
    /// the partitioner picks the partition unless `partition` names one. Each
    /// message's outcome is left in `burst.messages[j].err`. A message
    /// refused with a full queue is followed only by others refused the
    /// same way (librdkafka stops taking messages at the first).
    fn send_burst(&self, burst: &mut Burst, n: usize, send_ns: u64, keyed: bool, partition: i32) {
        use rdkafka::bindings as rd;
        debug_assert!(n > 0 && n <= SEND_BURST_MAX);
        burst.payload[..8].copy_from_slice(&send_ns.to_le_bytes());
        let (payload, len) = (burst.payload.as_mut_ptr(), burst.payload.len());
        burst.messages.clear();
        for j in 0..n {
            let (key, key_len) = if keyed {
                (burst.keys[j].as_mut_ptr().cast(), burst.keys[j].len())
            } else {
                (std::ptr::null_mut(), 0)
            };
            burst.messages.push(rd::rd_kafka_message_t {
                err: rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR,
                rkt: std::ptr::null_mut(),
                partition,
                payload: payload.cast(),
                len,
                key,
                key_len,
                offset: 0,
                _private: (send_ns as usize) as *mut std::ffi::c_void,
            });
        }
        // SAFETY: the topic handle is live; `messages` holds `n` slots whose
        // payload and key pointers point into `burst` for the whole call
        // (all slots share the one payload), and librdkafka copies them
        // (F_COPY). It writes only the slots' `err` fields. The opaque is a
        // plain integer (`DeliveryOpaque` is `usize`), handed back in the
        // delivery report.
        unsafe {
            rd::rd_kafka_produce_batch(
                self.topic.0,
                -1,
                rd::RD_KAFKA_MSG_F_COPY | rd::RD_KAFKA_MSG_F_PARTITION,
                burst.messages.as_mut_ptr(),
                n as i32,
            );
        }
    }

    /// Events queued on the main queue.
    fn queued(&self) -> usize {
        // SAFETY: the queue handle is live while `self` is.
        unsafe { rdkafka::bindings::rd_kafka_queue_length(self.queue.0) }
    }

    /// Handles the events librdkafka has queued (delivery reports, log
    /// lines, errors), at most `SERVE_POLLS_MAX` of them, and returns
    /// whether the queue is empty now.
    fn serve(&self) -> bool {
        for _ in 0..SERVE_POLLS_MAX {
            if self.queued() == 0 {
                return true;
            }
            self.producer.context().clock.next_event();
            self.producer.poll(Duration::ZERO);
        }
        self.queued() == 0
    }

    /// Waits until an event is queued or `timeout` passes, then serves.
    /// Returns at once when events are still queued: librdkafka signals only
    /// an event that lands on an empty queue, so none would come.
    fn wait_and_serve(&self, timeout: Duration) {
        if !self.serve() {
            return;
        }
        self.wait(timeout);
        self.serve();
    }

    /// Waits until librdkafka signals an event or `timeout` passes.
    fn wait(&self, timeout: Duration) {
        use std::os::fd::AsRawFd;
        let mut pfd = libc::pollfd {
            fd: self.wake.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: one valid pollfd, a valid timespec, no signal mask.
        let ready = unsafe { libc::ppoll(&mut pfd, 1, &ts, std::ptr::null()) };
        if ready > 0 {
            let mut counter = [0u8; 8];
            // SAFETY: reads at most 8 bytes into an 8-byte buffer. The fd is
            // non-blocking; a failed read (already reset) is harmless.
            unsafe { libc::read(pfd.fd, counter.as_mut_ptr().cast(), counter.len()) };
        }
    }

    /// Waits until everything sent is acknowledged or failed, serving the
    /// reports meanwhile. `rd_kafka_flush` with no timeout (what
    /// `flush(ZERO)` is) answers whether librdkafka still holds a message,
    /// and a message is held until its report has been served. It also
    /// wakes librdkafka's broker threads to send what lingers, though only
    /// for the instant of the call: a flush can still wait up to `linger.ms`.
    fn flush(&self, timeout: Duration) -> Result<(), KafkaError> {
        let deadline = Instant::now() + timeout;
        loop {
            self.serve();
            match self.producer.flush(Duration::ZERO) {
                Ok(()) => return Ok(()),
                Err(KafkaError::Flush(RDKafkaErrorCode::OperationTimedOut)) => {}
                Err(e) => return Err(e),
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(KafkaError::Flush(RDKafkaErrorCode::OperationTimedOut));
            }
            // A plain wait, even with events queued: with librdkafka's debug
            // logging each `rd_kafka_flush` call queues a log line, and
            // returning at once would spin. The loop serves them.
            self.wait((deadline - now).min(Duration::from_micros(FLUSH_WAIT_MAX_US)));
        }
    }
}

/// What one producer thread needs.
pub struct ProducerJob {
    pub index: usize,
    pub cfg: Arc<BenchConfig>,
    pub recorder: Arc<Recorder>,
    pub stop: Arc<AtomicBool>,
    /// Messages per second for this producer (> 0).
    pub rate: f64,
    /// Partitions the topic has (those with a leader, as `prepare_topic`
    /// found them).
    pub partitions: usize,
    pub cpu: Option<usize>,
}

/// Runs one open-loop producer until `stop` is set, then flushes.
pub fn run_producer(job: ProducerJob) -> Result<(), BenchError> {
    if let Some(cpu) = job.cpu {
        core_affinity::set_for_current(core_affinity::CoreId { id: cpu });
    }
    // Sleep as precisely as the kernel allows: the default 50 µs timer slack
    // would show up as publish delay at 10,000 msg/s.
    // SAFETY: prctl(PR_SET_TIMERSLACK) only changes this thread's timer slack.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0) };
    let cfg = &job.cfg;
    let mut c = base_config(cfg);
    c.set("acks", &cfg.acks)
        .set("linger.ms", cfg.linger_ms.to_string())
        .set("batch.size", cfg.batch_size.to_string())
        .set("compression.type", &cfg.compression)
        .set("enable.idempotence", cfg.idempotence.to_string())
        .set("queue.buffering.max.kbytes", "1048576")
        .set(
            "queue.buffering.max.messages",
            PRODUCER_QUEUE_MESSAGES_MAX.to_string(),
        );
    let transactional = cfg.transaction_duration_ms > 0;
    if transactional {
        c.set(
            "transactional.id",
            format!("fjord-bench-{}-{}", cfg.topic, job.index),
        );
    }
    for (k, v) in &cfg.producer_config {
        c.set(k, v);
    }
    // rdkafka applies the `log` crate's level after creating the client,
    // overriding `log_level` in the config: apply an explicit one instead.
    if let Some(level) = cfg
        .producer_config
        .iter()
        .find(|(k, _)| k == "log_level")
        .and_then(|(_, v)| v.parse::<u8>().ok())
    {
        c.set_log_level(rdkafka_log_level(level));
    }
    let txn_begin_ns = Arc::new(AtomicU64::new(0));
    let reporting = ReportingProducer::new(
        &c,
        BenchProducerContext {
            recorder: job.recorder.clone(),
            txn_begin_ns: txn_begin_ns.clone(),
            clock: ReportClock::default(),
        },
        &cfg.topic,
    )?;
    let reporting = &reporting;
    let producer = &reporting.producer;
    let txn_timeout = Duration::from_millis(TRANSACTION_TIMEOUT_MS);
    let txn_every = Duration::from_millis(cfg.transaction_duration_ms);
    let begin = || -> Result<(), BenchError> {
        producer
            .begin_transaction()
            .map_err(kafka("beginning transaction"))?;
        txn_begin_ns.store(now_ns().max(1), Ordering::Relaxed);
        Ok(())
    };
    if transactional {
        producer
            .init_transactions(txn_timeout)
            .map_err(kafka("InitProducerId (transactional)"))?;
        begin()?;
    }
    let mut txn_start = Instant::now();
    let mut payload = vec![0u8; cfg.message_size];
    for (i, b) in payload.iter_mut().enumerate().skip(8) {
        *b = (i % 251) as u8;
    }
    let mut burst = Burst::new(&payload);
    let interval_ns = 1e9 / job.rate;
    let start = now_ns();
    let intended = |i: u64| start + (i as f64 * interval_ns) as u64;
    let keyed = cfg.keys != KeyMode::None;
    // The partitioner's only choice, named: librdkafka then skips it, and
    // with it two clock reads per message. Not in a transaction: for a
    // named partition whose metadata has not arrived yet, librdkafka's
    // batch call would add the unassigned partition (-1) to the
    // transaction, which no broker accepts; the partitioner waits.
    let partition = if job.partitions == 1 && !transactional {
        0
    } else {
        -1
    };
    // Messages handed to librdkafka and accepted, or refused for good:
    // together always `i` (a refused-when-full message is sent again).
    let (mut accepted_total, mut failed_total) = (0u64, 0u64);
    let rec = &job.recorder;
    let mut delays_us = Vec::with_capacity(SEND_BURST_MAX);
    let mut i: u64 = 0;
    let mut rng_state: u64 = 0x9E37_79B9_7F4A_7C15 ^ (job.index as u64 + 1);
    while !job.stop.load(Ordering::Relaxed) {
        let mut now = now_ns();
        if intended(i) > now + SLEEP_THRESHOLD_US * 1_000 {
            reporting.wait_and_serve(Duration::from_nanos(intended(i) - now));
            continue;
        }
        if transactional && txn_start.elapsed() >= txn_every {
            commit(reporting, &job.recorder, txn_timeout)?;
            begin()?;
            txn_start = Instant::now();
            now = now_ns();
        }
        // Message `i` and every later one due by now go in one send; the
        // send time is `now`, read just above (or after a commit).
        let mut n = 1;
        while n < SEND_BURST_MAX && intended(i + n as u64) <= now {
            n += 1;
        }
        for (j, key) in burst.keys[..n].iter_mut().enumerate() {
            *key = match cfg.keys {
                KeyMode::None => continue,
                KeyMode::RoundRobin => ((i + j as u64) % cfg.partitions as u64).to_be_bytes(),
                KeyMode::Random => {
                    // xorshift64: cheap, good enough to spread keys.
                    rng_state ^= rng_state << 13;
                    rng_state ^= rng_state >> 7;
                    rng_state ^= rng_state << 17;
                    rng_state.to_be_bytes()
                }
            };
        }
        let send_ns = now;
        reporting.send_burst(&mut burst, n, send_ns, keyed, partition);
        // Reports that arrived while this thread was busy: their latency
        // should not wait for the next idle moment.
        reporting.serve();
        let measured = rec.measured(send_ns);
        let mut queue_full = false;
        let mut taken = 0;
        let mut accepted = 0u64;
        let mut fatal = None;
        delays_us.clear();
        for m in &burst.messages {
            match m.err {
                rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR => {
                    accepted += 1;
                    if measured {
                        let late_ns = send_ns.saturating_sub(intended(i + taken as u64));
                        delays_us.push(late_ns / 1_000);
                    }
                }
                rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR__QUEUE_FULL => {
                    // This and every later message of the burst were
                    // refused: they are sent again, later.
                    queue_full = true;
                    break;
                }
                err => {
                    failed_total += 1;
                    if measured {
                        rec.errors.fetch_add(1, Ordering::Relaxed);
                    }
                    if transactional {
                        fatal = Some(KafkaError::MessageProduction(err.into()));
                        break;
                    }
                }
            }
            taken += 1;
        }
        accepted_total += accepted;
        rec.sent_all.fetch_add(accepted, Ordering::Relaxed);
        if queue_full {
            rec.refused_all.fetch_add(1, Ordering::Relaxed);
        }
        if measured {
            rec.sent.fetch_add(accepted, Ordering::Relaxed);
            rec.publish_delay.record_us_each(&delays_us);
        }
        // Counted first: the reports of what this send did hand over still
        // come.
        if let Some(e) = fatal {
            return Err(kafka("producing in a transaction")(e));
        }
        i += taken as u64;
        debug_assert_eq!(accepted_total + failed_total, i, "a message was skipped");
        if queue_full && !job.stop.load(Ordering::Relaxed) {
            // Reports free queue space: wait for one, or the backoff.
            reporting.wait_and_serve(Duration::from_micros(QUEUE_FULL_BACKOFF_US));
        }
    }
    if transactional {
        commit(reporting, &job.recorder, txn_timeout)?;
    }
    // A broker that fell far behind may not acknowledge the whole queue in
    // time: that is a result (the messages count as not acknowledged), not a
    // reason to lose the run.
    if let Err(e) = reporting.flush(Duration::from_millis(FLUSH_TIMEOUT_MS)) {
        eprintln!(
            "fjord bench: producer {}: {} messages not acknowledged {FLUSH_TIMEOUT_MS} ms after the run: {e}",
            job.index,
            producer.in_flight_count()
        );
    }
    Ok(())
}

/// Commits the open transaction in two timed steps: a flush of everything
/// still queued or in flight, then `commit_transaction` (which would flush
/// first itself; here it finds nothing left and only ends the transaction).
fn commit(
    reporting: &ReportingProducer,
    rec: &Recorder,
    timeout: Duration,
) -> Result<(), BenchError> {
    let start_ns = now_ns();
    reporting
        .flush(timeout)
        .map_err(kafka("flushing the transaction"))?;
    let flushed_ns = now_ns();
    reporting
        .producer
        .commit_transaction(timeout)
        .map_err(kafka("committing transaction"))?;
    if rec.in_window(start_ns) {
        rec.txn_flush
            .record_us(flushed_ns.saturating_sub(start_ns) / 1_000);
        rec.txn_end
            .record_us(now_ns().saturating_sub(flushed_ns) / 1_000);
    }
    Ok(())
}

/// librdkafka's syslog-style level (0–7; above 7 counts as 7).
fn rdkafka_log_level(level: u8) -> rdkafka::config::RDKafkaLogLevel {
    use rdkafka::config::RDKafkaLogLevel as L;
    match level {
        0 => L::Emerg,
        1 => L::Alert,
        2 => L::Critical,
        3 => L::Error,
        4 => L::Warning,
        5 => L::Notice,
        6 => L::Info,
        _ => L::Debug,
    }
}

/// What one consumer thread needs.
pub struct ConsumerJob {
    pub cfg: Arc<BenchConfig>,
    pub recorder: Arc<Recorder>,
    /// Set when the consumer should stop.
    pub stop: Arc<AtomicBool>,
    /// `(partition, start offset)` assigned to this consumer.
    pub partitions: Vec<(i32, i64)>,
    /// Sleep this long before consuming (backlog drain).
    pub delay: Duration,
    pub cpu: Option<usize>,
}

/// Consumes the assigned partitions from their start offsets until `stop`.
pub fn run_consumer(job: ConsumerJob) -> Result<(), BenchError> {
    if let Some(cpu) = job.cpu {
        core_affinity::set_for_current(core_affinity::CoreId { id: cpu });
    }
    let cfg = &job.cfg;
    // librdkafka refuses assign() without a group id; no group protocol is
    // used (no subscribe, no commits), so the group is never joined.
    let mut config = base_config(cfg);
    config
        .set("group.id", format!("fjord-bench-{}", cfg.topic))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .set("fetch.wait.max.ms", "100")
        .set(
            "isolation.level",
            if cfg.transaction_duration_ms > 0 {
                "read_committed"
            } else {
                "read_uncommitted"
            },
        );
    for (k, v) in &cfg.consumer_config {
        config.set(k, v);
    }
    let consumer: BaseConsumer = config.create().map_err(kafka("creating consumer"))?;
    let deadline = Instant::now() + job.delay;
    while Instant::now() < deadline && !job.stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut tpl = TopicPartitionList::new();
    for &(p, off) in &job.partitions {
        tpl.add_partition_offset(&cfg.topic, p, Offset::Offset(off))
            .map_err(kafka("building assignment"))?;
    }
    consumer
        .assign(&tpl)
        .map_err(kafka("assigning partitions"))?;
    let rec = &job.recorder;
    while !job.stop.load(Ordering::Relaxed) {
        match consumer.poll(Duration::from_millis(CONSUMER_POLL_MS)) {
            None => {}
            Some(Ok(m)) => {
                let now = now_ns();
                rec.consumed_all.fetch_add(1, Ordering::Relaxed);
                let Some(p) = m.payload() else { continue };
                if p.len() < 8 {
                    continue;
                }
                let mut ts = [0u8; 8];
                ts.copy_from_slice(&p[..8]);
                let send_ns = u64::from_le_bytes(ts);
                if rec.measured(send_ns) {
                    rec.consumed.fetch_add(1, Ordering::Relaxed);
                    rec.end_to_end
                        .record_us(now.saturating_sub(send_ns) / 1_000);
                }
            }
            Some(Err(KafkaError::PartitionEOF(_))) => {}
            Some(Err(e)) => {
                // Transient fetch errors are retried by librdkafka; count them.
                rec.errors.fetch_add(1, Ordering::Relaxed);
                tracing::debug!("consumer error: {e}");
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Within one event the clock is read for the first report and then once
    /// per `REPORT_CLOCK_READS_EVERY`; a new event always reads it afresh.
    #[test]
    fn report_clock_reads_once_per_group_and_at_every_event() {
        let clock = ReportClock::default();
        let before = now_ns();
        std::thread::sleep(Duration::from_millis(1));
        assert!(
            clock.now_ns() >= before + 1_000_000,
            "the first report reads the clock"
        );
        clock.next_event();
        let first = clock.now_ns();
        for _ in 1..REPORT_CLOCK_READS_EVERY {
            assert_eq!(clock.now_ns(), first, "reused within a group");
        }
        std::thread::sleep(Duration::from_millis(2));
        let next = clock.now_ns();
        assert!(next >= first + 2_000_000, "a new group reads the clock");
        clock.now_ns();
        std::thread::sleep(Duration::from_millis(2));
        clock.next_event();
        let third = clock.now_ns();
        assert!(third >= next + 2_000_000, "a new event reads the clock");
        clock.read_always();
        std::thread::sleep(Duration::from_millis(2));
        assert!(
            clock.now_ns() >= third + 2_000_000,
            "read_always: every report reads the clock"
        );
    }
}
