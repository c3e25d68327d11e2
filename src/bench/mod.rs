//! `fjord bench`: an open-loop load generator for any Kafka-compatible broker,
//! modelled on the OpenMessaging Benchmark (OMB) and Kafka's perf tools.
//!
//! A run is: resolve the settings ([`config`]), optionally start the broker
//! ([`broker`]), create the topic and note each partition's end offset, then
//! one measured *phase*: consumer and producer threads ([`client`]) run for the
//! warm-up (not recorded) and the duration (recorded in [`recorder`]), with a
//! status line every interval; producers stop, consumers drain what was sent,
//! and the result is printed and written as OMB-shaped JSON ([`result`]).
//!
//! `--rate 0` first searches the maximum sustainable rate with short probe
//! phases ([`find_max_rate`]) and then measures at that rate.
//!
//! Threads: the main thread orchestrates and reports; every producer and
//! consumer is its own OS thread; librdkafka adds its own. With
//! `--client-cores` the process's CPU mask is narrowed before any client
//! exists, so librdkafka's threads inherit it, and the bench's threads are
//! pinned one by one (round-robin over the list) with `core_affinity`.

pub mod broker;
pub mod client;
pub mod config;
pub mod env;
pub mod recorder;
pub mod result;

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rdkafka::error::KafkaError;

pub use config::{BenchArgs, BenchConfig};
use recorder::{Counters, Quantiles, Recorder};
use result::{IntervalPoint, PhaseOutcome, RateProbe};

/// Errors of a bench run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("bench configuration: {0}")]
    Config(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}: {source}")]
    Kafka {
        what: String,
        #[source]
        source: KafkaError,
    },
    #[error("broker: {0}")]
    Broker(String),
    #[error("client thread: {0}")]
    Thread(String),
}

/// How long consumers may take, after the producers stopped, to receive
/// everything that was sent (at least; a backlog-drain run gets its duration).
pub const DRAIN_TIMEOUT_MIN_MS: u64 = 10_000;
/// Max-rate search: length of one probe (after its own warm-up).
pub const PROBE_DURATION_MS: u64 = 3_000;
/// Max-rate search: warm-up of one probe.
pub const PROBE_WARMUP_MS: u64 = 1_000;
/// Max-rate search: a probe is sustainable only if the acknowledged rate is at
/// least this fraction of the offered rate.
pub const PROBE_ACKED_FRACTION_MIN: f64 = 0.95;
/// Max-rate search: ... and the publish delay p99 stays under this (µs),
/// i.e. the producers are not falling behind their schedule.
pub const PROBE_DELAY_P99_MAX_US: f64 = 100_000.0;
/// Max-rate search: ... and the consumers' backlog at the end is under this
/// many seconds' worth of messages.
pub const PROBE_BACKLOG_MAX_S: f64 = 1.0;
/// Max-rate search: the first offered load, in bytes per second.
pub const PROBE_START_BYTES_PER_S: f64 = 8.0 * 1024.0 * 1024.0;
/// Max-rate search: doublings at most, then bisections between the last
/// sustainable and the first unsustainable rate.
pub const PROBE_DOUBLINGS_MAX: usize = 12;
pub const PROBE_BISECTIONS: usize = 3;

/// Largest allocation glibc serves from its heaps in the bench process
/// (larger ones are mappings of their own; glibc refuses more than 32 MiB):
/// see [`keep_freed_memory`].
#[cfg(target_env = "gnu")]
const CLIENT_MMAP_THRESHOLD_BYTES: libc::c_int = 16 << 20;
/// Free memory at the top of a glibc heap it keeps rather than returns.
#[cfg(target_env = "gnu")]
const CLIENT_TRIM_THRESHOLD_BYTES: libc::c_int = 512 << 20;

/// Makes glibc's allocator keep the memory librdkafka frees, for the bench
/// process only (the broker is not affected: it is another process, or the
/// bench does not start one).
///
/// librdkafka builds each produce request in freshly allocated buffers of up
/// to `batch.size` (1 MiB in the saturating workload) and frees them when the
/// request is acknowledged. glibc served such a buffer from a new mapping or
/// returned it to the kernel at free, so every batch paid page faults and the
/// kernel zeroing the pages: about 5 % of the client core in a saturating
/// run, the core that limits the throughput measured. Fixed thresholds keep
/// the buffers in glibc's heaps for reuse (and turn off glibc's dynamic
/// threshold). Memory is bounded by what librdkafka holds at once
/// (`queue.buffering.max.kbytes`).
fn keep_freed_memory() {
    // SAFETY: mallopt only changes glibc's allocator parameters; it is
    // called before any client thread exists.
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, CLIENT_MMAP_THRESHOLD_BYTES);
        libc::mallopt(libc::M_TRIM_THRESHOLD, CLIENT_TRIM_THRESHOLD_BYTES);
    }
}

/// Runs `fjord bench` and returns the JSON result (also written to `--output`).
pub fn run(args: BenchArgs) -> Result<serde_json::Value, BenchError> {
    let mut cfg = BenchConfig::resolve(&args)?;
    keep_freed_memory();
    if !cfg.client_cores.is_empty() {
        restrict_process_cpus(&cfg.client_cores)?;
    }
    if let Some(dir) = &cfg.output {
        std::fs::create_dir_all(dir).map_err(|source| BenchError::Io {
            what: format!("creating {}", dir.display()),
            source,
        })?;
    }
    let mut started = None;
    let broker_pid = match (&cfg.broker_cmd, cfg.broker_pid) {
        (Some(cmd), _) => {
            let log = match &cfg.output {
                Some(d) => d.join(format!("broker-{}-{}.log", cfg.name, cfg.label)),
                None => std::env::temp_dir().join("fjord-bench-broker.log"),
            };
            eprintln!(
                "fjord bench: starting broker: {cmd} (log: {})",
                log.display()
            );
            let b =
                broker::BrokerProcess::start(cmd, &cfg.bootstrap, &log, cfg.broker_start_timeout)?;
            let pid = b.pid();
            started = Some(b);
            Some(pid)
        }
        (None, pid) => pid,
    };
    let starts = client::prepare_topic(&cfg)?;
    eprintln!(
        "fjord bench: workload {} against {} ({}), topic {} with {} partitions",
        cfg.name,
        cfg.label,
        cfg.bootstrap,
        cfg.topic,
        starts.len()
    );
    let mut probes = Vec::new();
    if cfg.rate == 0.0 {
        let (rate, p) = find_max_rate(&cfg, &starts)?;
        eprintln!("fjord bench: maximum sustainable rate found: {rate:.0} msg/s");
        probes = p;
        cfg.rate = rate;
    }
    let cfg = Arc::new(cfg);
    // Probes moved the end offsets: start consumers at the current end.
    let starts = if probes.is_empty() {
        starts
    } else {
        client::prepare_topic(&cfg)?
    };
    let outcome = run_phase(
        &cfg,
        &starts,
        cfg.rate,
        cfg.warmup,
        cfg.duration,
        false,
        broker_pid,
    )?;
    let environment = env::Environment::detect();
    let json = result::build(&cfg, &environment, &outcome, &probes, broker_pid);
    print_final(&cfg, &outcome);
    if let Some(dir) = &cfg.output {
        let path = dir.join(format!(
            "{}-{}-{}.json",
            cfg.name, cfg.label, environment.timestamp_s
        ));
        let text = serde_json::to_string_pretty(&json).unwrap_or_default();
        std::fs::write(&path, text).map_err(|source| BenchError::Io {
            what: format!("writing {}", path.display()),
            source,
        })?;
        eprintln!("fjord bench: result written to {}", path.display());
    }
    drop(started);
    Ok(json)
}

/// Narrows the whole process to `cpus` so that threads librdkafka creates later inherit it.
fn restrict_process_cpus(cpus: &[usize]) -> Result<(), BenchError> {
    // SAFETY: cpu_set_t is plain data; CPU_ZERO/CPU_SET only write into it, and
    // sched_setaffinity reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_ZERO(&mut set);
        for &c in cpus {
            libc::CPU_SET(c, &mut set);
        }
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(BenchError::Io {
                what: format!("restricting the bench to CPUs {cpus:?}"),
                source: std::io::Error::last_os_error(),
            });
        }
    }
    Ok(())
}

fn cpu_for(cfg: &BenchConfig, thread_index: usize) -> Option<usize> {
    if cfg.client_cores.is_empty() {
        None
    } else {
        Some(cfg.client_cores[thread_index % cfg.client_cores.len()])
    }
}

/// Searches the highest offered rate the broker sustains (see the `PROBE_*`
/// constants): start at [`PROBE_START_BYTES_PER_S`], double while sustainable,
/// then bisect between the last sustainable and the first unsustainable rate.
pub fn find_max_rate(
    cfg: &BenchConfig,
    starts: &[i64],
) -> Result<(f64, Vec<RateProbe>), BenchError> {
    let cfg = Arc::new(cfg.clone());
    let mut probes = Vec::new();
    let mut probe = |rate: f64, starts: &[i64]| -> Result<bool, BenchError> {
        let o = run_phase(
            &cfg,
            starts,
            rate,
            Duration::from_millis(PROBE_WARMUP_MS),
            Duration::from_millis(PROBE_DURATION_MS),
            true,
            None,
        )?;
        let acked_rate = o.counters.acked_in_window as f64 / o.measured_s.max(1e-9);
        let delay_p99_us = Quantiles::of(&o.publish_delay, 1.0).p99;
        let backlog = o.backlog_at_stop as f64;
        let ok = acked_rate >= PROBE_ACKED_FRACTION_MIN * rate
            && delay_p99_us <= PROBE_DELAY_P99_MAX_US
            && (cfg.consumers == 0 || backlog <= rate * PROBE_BACKLOG_MAX_S)
            && o.counters.errors == 0;
        eprintln!(
            "fjord bench: probe {rate:.0} msg/s: acked {acked_rate:.0} msg/s, delay p99 {delay_p99_us:.0} us, backlog {backlog:.0} -> {}",
            if ok { "sustainable" } else { "not sustainable" }
        );
        probes.push(RateProbe {
            rate,
            acked_rate,
            delay_p99_us,
            backlog_at_stop: o.backlog_at_stop,
            sustainable: ok,
        });
        Ok(ok)
    };
    let mut starts = starts.to_vec();
    let mut good = 0.0;
    let mut rate = (PROBE_START_BYTES_PER_S / cfg.message_size as f64).max(100.0);
    let mut bad = None;
    for _ in 0..PROBE_DOUBLINGS_MAX {
        let ok = probe(rate, &starts)?;
        starts = client::prepare_topic(&cfg)?;
        if ok {
            good = rate;
            rate *= 2.0;
        } else {
            bad = Some(rate);
            break;
        }
    }
    if let Some(mut hi) = bad {
        let mut lo = good;
        for _ in 0..PROBE_BISECTIONS {
            let mid = (lo + hi) / 2.0;
            if probe(mid, &starts)? {
                lo = mid;
            } else {
                hi = mid;
            }
            starts = client::prepare_topic(&cfg)?;
        }
        good = lo;
    }
    if good == 0.0 {
        return Err(BenchError::Broker(
            "no probed rate was sustainable; give --rate explicitly".to_string(),
        ));
    }
    Ok((good, probes))
}

/// One phase: consumers and producers run `warmup + duration` at `rate`.
pub fn run_phase(
    cfg: &Arc<BenchConfig>,
    starts: &[i64],
    rate: f64,
    warmup: Duration,
    duration: Duration,
    quiet: bool,
    broker_pid: Option<u32>,
) -> Result<PhaseOutcome, BenchError> {
    let recorder = Arc::new(Recorder::default());
    let stop_producers = Arc::new(AtomicBool::new(false));
    let stop_consumers = Arc::new(AtomicBool::new(false));
    let mut thread_index = 0;
    let consumers = cfg.consumers.min(starts.len());
    let mut consumer_threads: Vec<JoinHandle<Result<(), BenchError>>> = Vec::new();
    for c in 0..consumers {
        let partitions: Vec<(i32, i64)> = starts
            .iter()
            .enumerate()
            .filter(|(p, _)| p % consumers == c)
            .map(|(p, &o)| (p as i32, o))
            .collect();
        let job = client::ConsumerJob {
            cfg: cfg.clone(),
            recorder: recorder.clone(),
            stop: stop_consumers.clone(),
            partitions,
            delay: cfg.consumer_delay,
            cpu: cpu_for(cfg, thread_index),
        };
        thread_index += 1;
        consumer_threads.push(spawn(format!("bench-consumer-{c}"), move || {
            client::run_consumer(job)
        })?);
    }
    let mut producer_threads: Vec<JoinHandle<Result<(), BenchError>>> = Vec::new();
    for p in 0..cfg.producers {
        let job = client::ProducerJob {
            index: p,
            cfg: cfg.clone(),
            recorder: recorder.clone(),
            stop: stop_producers.clone(),
            rate: rate / cfg.producers as f64,
            partitions: starts.len(),
            cpu: cpu_for(cfg, thread_index),
        };
        thread_index += 1;
        producer_threads.push(spawn(format!("bench-producer-{p}"), move || {
            client::run_producer(job)
        })?);
    }
    let abort = |producers: Vec<JoinHandle<Result<(), BenchError>>>,
                 consumers: Vec<JoinHandle<Result<(), BenchError>>>,
                 stop_p: &AtomicBool,
                 stop_c: &AtomicBool|
     -> BenchError {
        stop_p.store(true, Ordering::Relaxed);
        stop_c.store(true, Ordering::Relaxed);
        let mut first = None;
        for h in producers.into_iter().chain(consumers) {
            let r = join(h);
            if first.is_none() {
                first = r.err();
            }
        }
        first.unwrap_or_else(|| BenchError::Thread("a client thread stopped early".to_string()))
    };
    let any_finished = |p: &[JoinHandle<Result<(), BenchError>>],
                        c: &[JoinHandle<Result<(), BenchError>>]| {
        p.iter().chain(c.iter()).any(|h| h.is_finished())
    };

    // Warm-up.
    let warm_end = Instant::now() + warmup;
    while Instant::now() < warm_end {
        std::thread::sleep(Duration::from_millis(50));
        if any_finished(&producer_threads, &consumer_threads) {
            return Err(abort(
                producer_threads,
                consumer_threads,
                &stop_producers,
                &stop_consumers,
            ));
        }
    }
    recorder.start_measuring();
    let cpu0 = broker_pid.and_then(broker::sample).map(|s| s.cpu_s);
    let t0 = Instant::now();
    let end = t0 + duration;
    let mut series = Vec::new();
    let mut last_tick = t0;
    let mut last = recorder.counters();
    let live = !quiet && std::io::stderr().is_terminal();
    let mut peak_rss = 0u64;
    loop {
        let now = Instant::now();
        if now >= end {
            break;
        }
        let next_tick = (last_tick + cfg.status_interval).min(end);
        std::thread::sleep(Duration::from_secs(1).min(next_tick.saturating_duration_since(now)));
        if any_finished(&producer_threads, &consumer_threads) {
            return Err(abort(
                producer_threads,
                consumer_threads,
                &stop_producers,
                &stop_consumers,
            ));
        }
        if let Some(s) = broker_pid.and_then(broker::sample) {
            peak_rss = peak_rss.max(s.rss_bytes);
        }
        let now = Instant::now();
        let c = recorder.counters();
        if live {
            eprint!(
                "\r  {:>5.0}s sent {} acked {} consumed {} errors {} backlog {}   ",
                now.duration_since(t0).as_secs_f64(),
                c.sent,
                c.acked,
                c.consumed,
                c.errors,
                c.sent_all.saturating_sub(c.consumed_all)
            );
        }
        if now >= next_tick {
            let point = interval_point(
                &recorder,
                &last,
                &c,
                now - last_tick,
                now - t0,
                cfg,
                consumers > 0,
            );
            if !quiet {
                if live {
                    eprint!("\r");
                }
                print_status(&point, cfg);
            }
            series.push(point);
            last = c;
            last_tick = now;
        }
    }
    stop_producers.store(true, Ordering::Relaxed);
    recorder.stop_measuring();
    let measured_s = t0.elapsed().as_secs_f64();
    let cpu1 = broker_pid.and_then(broker::sample);
    let at_stop = recorder.counters();
    let backlog_at_stop = if consumers > 0 {
        at_stop.sent_all.saturating_sub(at_stop.consumed_all)
    } else {
        0
    };
    let mut first_err = None;
    for h in producer_threads {
        if let Err(e) = join(h) {
            first_err.get_or_insert(e);
        }
    }
    // Let consumers receive everything that was acknowledged.
    let drain_limit =
        Duration::from_millis(DRAIN_TIMEOUT_MIN_MS).max(if cfg.consumer_delay.is_zero() {
            Duration::ZERO
        } else {
            duration
        });
    let drain_deadline = Instant::now() + drain_limit;
    let mut drained = consumers == 0;
    while consumers > 0 && Instant::now() < drain_deadline {
        let c = recorder.counters();
        if c.consumed_all >= c.sent_all {
            drained = true;
            break;
        }
        if consumer_threads.iter().any(|h| h.is_finished()) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    stop_consumers.store(true, Ordering::Relaxed);
    for h in consumer_threads {
        if let Err(e) = join(h) {
            first_err.get_or_insert(e);
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    if !quiet && live {
        eprintln!();
    }
    let broker_cpu_s = match (cpu0, cpu1) {
        (Some(a), Some(b)) => Some(b.cpu_s - a),
        _ => None,
    };
    let broker_peak_rss = cpu1.map(|s| s.peak_rss_bytes.max(peak_rss));
    Ok(PhaseOutcome {
        rate,
        measured_s,
        counters: recorder.counters(),
        backlog_at_stop,
        drained,
        series,
        publish_latency: recorder.publish_latency.total(),
        publish_delay: recorder.publish_delay.total(),
        end_to_end: recorder.end_to_end.total(),
        txn_flush: recorder.txn_flush.total(),
        txn_end: recorder.txn_end.total(),
        txn_first_ack: recorder.txn_first_ack.total(),
        broker_cpu_s,
        broker_peak_rss_bytes: broker_peak_rss,
    })
}

fn spawn(
    name: String,
    f: impl FnOnce() -> Result<(), BenchError> + Send + 'static,
) -> Result<JoinHandle<Result<(), BenchError>>, BenchError> {
    std::thread::Builder::new()
        .name(name.clone())
        .spawn(f)
        .map_err(|source| BenchError::Io {
            what: format!("spawning {name}"),
            source,
        })
}

fn join(h: JoinHandle<Result<(), BenchError>>) -> Result<(), BenchError> {
    h.join()
        .map_err(|_| BenchError::Thread("a client thread panicked".to_string()))?
}

fn interval_point(
    rec: &Recorder,
    before: &Counters,
    now: &Counters,
    dt: Duration,
    elapsed: Duration,
    cfg: &BenchConfig,
    has_consumers: bool,
) -> IntervalPoint {
    let dt_s = dt.as_secs_f64().max(1e-9);
    let pub_rate = (now.acked_in_window - before.acked_in_window) as f64 / dt_s;
    IntervalPoint {
        elapsed_s: elapsed.as_secs_f64(),
        publish_rate: pub_rate,
        publish_mb_s: pub_rate * cfg.mb_per_msg(),
        consume_rate: (now.consumed - before.consumed) as f64 / dt_s,
        error_rate: (now.errors - before.errors) as f64 / dt_s,
        backlog: if has_consumers {
            now.sent_all.saturating_sub(now.consumed_all)
        } else {
            0
        },
        publish_latency_ms: Quantiles::of(&rec.publish_latency.take_interval(), 1000.0),
        publish_delay_us: Quantiles::of(&rec.publish_delay.take_interval(), 1.0),
        end_to_end_ms: Quantiles::of(&rec.end_to_end.take_interval(), 1000.0),
    }
}

fn print_status(p: &IntervalPoint, _cfg: &BenchConfig) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "[{:>5.0}s] pub {:>9.1} msg/s {:>7.2} MB/s | cons {:>9.1} msg/s | err {:.1}/s | backlog {} | pub lat p50 {:.3} p99 {:.3} ms | e2e p50 {:.3} p99 {:.3} ms | delay p99 {:.0} us",
        p.elapsed_s,
        p.publish_rate,
        p.publish_mb_s,
        p.consume_rate,
        p.error_rate,
        p.backlog,
        p.publish_latency_ms.p50,
        p.publish_latency_ms.p99,
        p.end_to_end_ms.p50,
        p.end_to_end_ms.p99,
        p.publish_delay_us.p99,
    );
}

/// The final lines: kafka-producer-perf-test's format, then the full quantiles.
fn print_final(cfg: &BenchConfig, o: &PhaseOutcome) {
    let q = Quantiles::of(&o.publish_latency, 1000.0);
    // Throughput counts acknowledgements that arrived inside the window.
    let n = o.counters.acked_in_window;
    let rate = n as f64 / o.measured_s.max(1e-9);
    println!(
        "{} records sent, {:.1} records/sec ({:.2} MB/sec), {:.2} ms avg latency, {:.2} ms max latency, {} ms 50th, {} ms 95th, {} ms 99th, {} ms 99.9th.",
        n,
        rate,
        rate * cfg.mb_per_msg(),
        q.avg,
        q.max,
        q.p50 as u64,
        q.p95 as u64,
        q.p99 as u64,
        q.p999 as u64,
    );
    let line = |name: &str, q: Quantiles, unit: &str| {
        println!(
            "{name}: p50 {:.3} p75 {:.3} p95 {:.3} p99 {:.3} p99.9 {:.3} p99.99 {:.3} max {:.3} {unit} (n={})",
            q.p50, q.p75, q.p95, q.p99, q.p999, q.p9999, q.max, q.count
        );
    };
    line("publish latency", q, "ms");
    line("publish delay", Quantiles::of(&o.publish_delay, 1.0), "us");
    line(
        "end-to-end latency",
        Quantiles::of(&o.end_to_end, 1000.0),
        "ms",
    );
    if cfg.transaction_duration_ms > 0 {
        line(
            "transaction flush",
            Quantiles::of(&o.txn_flush, 1000.0),
            "ms",
        );
        line(
            "transaction EndTxn",
            Quantiles::of(&o.txn_end, 1000.0),
            "ms",
        );
        line(
            "transaction begin to first ack",
            Quantiles::of(&o.txn_first_ack, 1000.0),
            "ms",
        );
    }
    if let (Some(cpu), Some(rss)) = (o.broker_cpu_s, o.broker_peak_rss_bytes) {
        let gb = o.counters.acked_in_window as f64 * cfg.message_size as f64 / 1e9;
        println!(
            "broker: {cpu:.2} CPU s ({:.3} s/GB produced), peak RSS {:.1} MiB",
            if gb > 0.0 { cpu / gb } else { 0.0 },
            rss as f64 / (1024.0 * 1024.0)
        );
    }
}
