//! `fjord serve`: start one shard per core, each a Kafka node on its own port.
//!
//! Start-up, in order: resolve the config; create the data dir and its
//! `meta.properties` (cluster id); check that glommio's pinned I/O memory fits
//! RLIMIT_MEMLOCK; start one executor per shard (pinned unless `--no-pin`).
//! Each shard joins the channel mesh, probes DMA support on the data dir,
//! waits for the controller (shard 0) to replay the metadata log and send the
//! first image — opening and recovering the logs of the partitions it leads —
//! and only then listens (waiting a bounded time for a port still held by a
//! process that just died). The main thread prints each listener and then
//! `fjord: ready` once every shard listens.
//!
//! Under systemd (`Type=notify`, `packaging/systemd/fjord.service`) the
//! main thread also sends `READY=1` over `$NOTIFY_SOCKET` at that moment
//! ([`sd_notify`]): only then does `systemctl start` return, so units
//! ordered after fjord find every shard listening and every log recovered.
//!
//! SIGINT/SIGTERM: every shard stops accepting, waits (bounded,
//! `SHUTDOWN_DRAIN_MS_MAX`) for the requests in flight to be answered, then
//! writes producer snapshots and flushes, fdatasyncs and checkpoints its
//! logs. A watchdog ends the process if all that takes longer than
//! `SHUTDOWN_MS_MAX` (a disk that no longer answers), and a second signal
//! ends it at once (exit status `EXIT_SECOND_SIGNAL`): an operator pressing
//! Ctrl-C twice means it. Either way the next start recovers as after a
//! kill -9.
//!
//! SIGHUP re-reads the TLS files of SSL and SASL_SSL listeners
//! ([`spawn_tls_reloader`], `net::tls`); a failed reload keeps the old ones.
//!
//! A panic on any thread aborts the process ([`abort_on_panic`]): a broker
//! with a dead shard would keep advertising a node that never answers.

use crate::config::{BrokerConfig, LogFormat, ServeArgs, IO_MEMORY_BYTES_MAX};
use crate::log::{LogManager, TailCache};
use crate::metadata::lease::NodeLease;
use crate::runtime;
use crate::shard::messages::ShardMessage;
use crate::shard::router::Router;
use crate::shard::ShardCtx;
use futures::StreamExt;
use glommio::channels::channel_mesh::MeshBuilder;
use glommio::{Latency, Shares};
use std::cell::Cell;
use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Messages queued between two shards before a sender waits.
const MESH_CHANNEL_CAPACITY: usize = 1024;
/// How often a shard checks for a stop signal.
const SHUTDOWN_POLL_MS: u64 = 50;
/// Longest a stopping shard waits for requests in flight.
const SHUTDOWN_DRAIN_MS_MAX: u64 = 5_000;
/// Longest a stop may take from the signal to the exit: the drain, then
/// closing the logs (writing staged data, fdatasyncs, checkpoints). Past
/// it the watchdog exits with `EXIT_SHUTDOWN_TIMEOUT`. systemd's
/// `TimeoutStopSec` in the shipped unit is longer (45 s), so the broker
/// ends itself before systemd resorts to SIGKILL.
pub const SHUTDOWN_MS_MAX: u64 = 30_000;
/// Exit status when a second SIGINT/SIGTERM cuts a stop short.
pub const EXIT_SECOND_SIGNAL: i32 = 130;
/// Exit status when a stop outlives `SHUTDOWN_MS_MAX`.
pub const EXIT_SHUTDOWN_TIMEOUT: i32 = 124;
/// Longest a shard waits for its port to be released at start-up.
const BIND_BUSY_WAIT_MS_MAX: u64 = 10_000;
/// Pause between attempts to bind a port that is in use.
const BIND_RETRY_PAUSE_MS: u64 = 20;
/// Shares of the background task queue (flush, retention); requests run in
/// the default queue with glommio's default 1000 shares.
const BACKGROUND_SHARES: usize = 100;
/// How often idle producers expire, producer snapshots are written and
/// timed-out transactions are aborted (Kafka checks timeouts every 10 s).
const PRODUCER_MAINTENANCE_MS: u64 = crate::txn::ABORT_TIMED_OUT_CHECK_INTERVAL_MS;

/// How long after it listens a shard named by `--debug-panic-shard` panics.
pub const DEBUG_PANIC_DELAY_MS: u64 = 2_000;

/// How long `--debug-stall-shard` stalls without `--debug-stall-shard-ms`:
/// a year, for good as far as a test can tell.
const DEBUG_STALL_FOR_GOOD_MS: u64 = 365 * 24 * 3600 * 1000;

/// Makes every panic, on any thread, end the process (after the default
/// hook has printed it), as `panic = "abort"` would. A shard is a thread:
/// without this a panicking shard dies alone and the process lives on,
/// still advertising the dead shard as a Kafka node that never answers. An
/// abort lets a supervisor (systemd's `Restart=on-failure`) restart the
/// broker, whose recovery then runs as after a kill -9.
pub fn abort_on_panic() {
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default_hook(info);
        eprintln!("fjord: a thread panicked; aborting the process");
        std::process::abort();
    }));
}

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    abort_on_panic();
    let mut config = args.resolve()?;
    init_tracing(config.log_format);
    std::fs::create_dir_all(&config.data_dir).map_err(|e| {
        anyhow::anyhow!("cannot create data dir {}: {e}", config.data_dir.display())
    })?;
    // Held until the process ends: `fjord scram add` refuses to append to
    // the metadata log while a broker runs on it.
    let _data_dir_lock = crate::metadata::store::lock_data_dir(&config.data_dir).map_err(|e| {
        if e.kind() == std::io::ErrorKind::WouldBlock {
            anyhow::anyhow!(
                "data dir {} is in use by another process (a running broker or `fjord scram add`)",
                config.data_dir.display()
            )
        } else {
            anyhow::anyhow!("cannot lock data dir {}: {e}", config.data_dir.display())
        }
    })?;
    config.cluster_id =
        crate::metadata::meta_properties::read_or_create(&config.data_dir, config.node_id)?;
    let io_memory = config
        .io_memory_bytes
        .unwrap_or_else(|| runtime::io_memory_for_budget(config.cores, IO_MEMORY_BYTES_MAX));
    runtime::check_memlock(config.cores, io_memory).map_err(|e| anyhow::anyhow!(e))?;
    // The amount given to every shard, as the metrics report it.
    config.io_memory_bytes = Some(io_memory);
    if let Some(files) = runtime::raise_nofile_limit() {
        tracing::info!(files, "open file limit");
    }

    // A TLS listener with a missing or bad certificate, key or CA file
    // does not start (the error names the file).
    let tls = match &config.tls {
        Some(settings) => Some(Arc::new(crate::net::tls::TlsStore::load(settings.clone())?)),
        None => None,
    };
    let clean_start = take_clean_shutdown_marker(&config.data_dir)?;
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        // Registered first, so it sees the flag as it was before this
        // signal: set means a stop is already under way.
        signal_hook::flag::register_conditional_shutdown(signal, EXIT_SECOND_SIGNAL, stop.clone())?;
        signal_hook::flag::register(signal, stop.clone())?;
    }
    spawn_stop_watchdog(stop.clone())?;
    // SIGHUP: reload the TLS files (and nothing else); registered even
    // without TLS, so that a SIGHUP never ends the broker.
    let reload = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGHUP, reload.clone())?;
    spawn_tls_reloader(reload, stop.clone(), tls.clone())?;
    if config.log_cleaner_enable {
        // From this (unpinned) thread, so the cleaner threads run on any core.
        crate::log::compact::start_cleaner_threads(config.log_cleaner_threads);
    }
    let cpus = allowed_cpus();
    let config = Arc::new(config);
    let mesh = MeshBuilder::<ShardMessage, _>::full(config.cores, MESH_CHANNEL_CAPACITY);
    log_listeners(&config);
    let (ready_tx, ready_rx) =
        std::sync::mpsc::channel::<(usize, Result<Vec<SocketAddr>, String>)>();
    let mut handles = Vec::with_capacity(config.cores);
    // One lease for the node's shards (`metadata::lease`).
    let lease = Arc::new(if config.several_nodes() {
        NodeLease::cluster()
    } else {
        NodeLease::single()
    });
    for shard in 0..config.cores {
        let cpu = config
            .pin
            .then(|| cpus.get(shard % cpus.len().max(1)).copied())
            .flatten();
        let builder = runtime::executor_builder(shard, cpu, io_memory);
        let (config, mesh, ready_tx, stop, tls, lease) = (
            config.clone(),
            mesh.clone(),
            ready_tx.clone(),
            stop.clone(),
            tls.clone(),
            lease.clone(),
        );
        // Executors are made one after the other, in shard order: their
        // ids, given as they are made, order the shard mesh's peers.
        let (made_tx, made_rx) = std::sync::mpsc::channel::<()>();
        let handle = std::thread::Builder::new()
            // Named as glommio names its executors' threads (`shard-<k>-<id>`).
            .name(format!("shard-{shard}-{}", shard + 1))
            .spawn(move || {
                let made = builder.make();
                drop(made_tx);
                let executor = match made {
                    Ok(executor) => executor,
                    Err(e) => {
                        let e = anyhow::anyhow!("cannot start shard {shard}: {e}");
                        let _ = ready_tx.send((shard, Err(e.to_string())));
                        return Err(e);
                    }
                };
                let outcome = executor.run(async {
                    shard_main(
                        shard,
                        config,
                        mesh,
                        &ready_tx,
                        stop,
                        clean_start,
                        tls,
                        lease,
                    )
                    .await
                });
                if let Err(e) = &outcome {
                    let _ = ready_tx.send((shard, Err(e.to_string())));
                }
                // Never dropped: a task the shard left behind (a detached
                // connection, a cancelled background step) may still have a
                // file operation on glommio's blocking thread, and that
                // thread panics (so the process aborts) when it answers an
                // executor that is gone. The process exits right after the
                // shards, which frees it all.
                std::mem::forget(executor);
                outcome
            })
            .map_err(|e| anyhow::anyhow!("cannot start shard {shard}: {e}"))?;
        // Disconnected once the executor is made (or its thread ended).
        let _ = made_rx.recv();
        handles.push(handle);
    }
    drop(ready_tx);

    let mut failed = None;
    for _ in 0..config.cores {
        match ready_rx.recv() {
            Ok((shard, Ok(addrs))) => {
                for (i, addr) in addrs.iter().enumerate() {
                    let l = &config.listeners[i];
                    println!(
                        "fjord: shard {shard} listening on {addr} as node {} (advertised {}:{}, {})",
                        config.node_id_of(shard),
                        l.advertised_host,
                        l.port_of(shard),
                        l.protocol.name()
                    );
                }
            }
            Ok((shard, Err(e))) => {
                failed = Some(format!("shard {shard}: {e}"));
                break;
            }
            Err(_) => {
                failed = Some("a shard exited during start-up".into());
                break;
            }
        }
    }
    if let Some(e) = &failed {
        stop.store(true, Ordering::SeqCst);
        eprintln!("fjord: start-up failed: {e}");
    } else {
        println!("fjord: ready");
        sd_notify(&format!(
            "READY=1\nSTATUS={} shards listening from port {}",
            config.cores,
            config.port_of(0)
        ));
    }
    let _ = std::io::stdout().flush();
    let mut clean = failed.is_none();
    for h in handles {
        match h.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                clean = false;
                tracing::error!(error = %e, "shard stopped with an error");
            }
            Err(_) => {
                clean = false;
                tracing::error!("shard thread failed");
            }
        }
    }
    if clean {
        if let Err(e) = write_clean_shutdown_marker(&config.data_dir) {
            tracing::warn!(error = %e, "could not write the clean-shutdown marker; the next start scans the active segments");
        }
    }
    match failed {
        Some(e) => Err(anyhow::anyhow!(e)),
        None => {
            println!("fjord: stopped");
            Ok(())
        }
    }
}

/// Says where the broker listens and, when that is unauthenticated, how
/// exposed it is (issue 28's safe default): the loopback default is
/// logged with the way to listen elsewhere, and a PLAINTEXT listener on
/// another address gets a warning.
fn log_listeners(config: &BrokerConfig) {
    if config.listen_is_safe_default {
        tracing::info!(
            listener = %config.listeners[0].describe(),
            "no listener configured and no authentication: listening on loopback only; \
             use --listen ADDR (or --listener PLAINTEXT://ADDR:PORT) to accept other hosts, \
             and a SASL_PLAINTEXT listener to authenticate them"
        );
    }
    for l in &config.listeners {
        if l.protocol == crate::config::SecurityProtocol::Plaintext && !l.host.is_loopback() {
            tracing::warn!(
                listener = %l.describe(),
                "PLAINTEXT listener on a non-loopback address: any client that reaches it may \
                 read, write and delete every topic; use a SASL_PLAINTEXT listener to authenticate clients"
            );
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn shard_main(
    shard: usize,
    config: Arc<BrokerConfig>,
    mesh: MeshBuilder<ShardMessage, glommio::channels::channel_mesh::Full>,
    ready_tx: &std::sync::mpsc::Sender<(usize, Result<Vec<SocketAddr>, String>)>,
    stop: Arc<AtomicBool>,
    clean_start: bool,
    tls: Option<Arc<crate::net::tls::TlsStore>>,
    lease: Arc<NodeLease>,
) -> anyhow::Result<()> {
    let (senders, mut receivers) = mesh
        .join()
        .await
        .map_err(|_| anyhow::anyhow!("joining the shard mesh failed"))?;
    // The mesh numbers its peers in the order of their executors' ids, and
    // the router addresses shard k as peer k: `run` makes the executors in
    // shard order.
    if senders.peer_id() != shard {
        return Err(anyhow::anyhow!(
            "shard {shard} joined the shard mesh as peer {}",
            senders.peer_id()
        ));
    }
    runtime::probe_dma(&config.data_dir)
        .await
        .map_err(|e| anyhow::anyhow!("DMA probe in {} failed: {e}", config.data_dir.display()))?;
    let started = crate::clock::monotonic();
    crate::metrics::set_recording(config.metrics_recording);
    let cache = TailCache::new(config.tail_cache_bytes);
    let logs = LogManager::new_for_shard(config.data_dir.clone(), cache, shard);
    logs.set_clean_shutdown(clean_start);
    let background = glommio::executor().create_task_queue(
        Shares::Static(BACKGROUND_SHARES),
        Latency::NotImportant,
        "background",
    );
    logs.start_background(background);
    let (first_tx, first_rx) = futures::channel::oneshot::channel();
    let router = Router::new(
        shard,
        config.cores,
        senders,
        Duration::from_millis(config.cross_shard_timeout_ms),
    );
    let ctx = ShardCtx::new(shard, config.clone(), logs.clone(), router, lease, first_tx);

    // TESTING ONLY (--debug-stall-shard): until when this shard leaves
    // messages from other shards unhandled; set once it listens.
    let stalled_until: Rc<Cell<Option<Instant>>> = Rc::new(Cell::new(None));
    for (_peer, mut stream) in receivers.streams() {
        let ctx = ctx.clone();
        let stalled_until = stalled_until.clone();
        glommio::spawn_local(async move {
            while let Some(message) = stream.next().await {
                if let Some(until) = stalled_until.get() {
                    let left = until.saturating_duration_since(crate::clock::monotonic());
                    glommio::timer::sleep(left).await;
                }
                ctx.on_message(message).await;
            }
        })
        .detach();
    }
    if let Some(controller) = &ctx.controller {
        controller.set_clean_start(clean_start);
        controller
            .load(&ctx)
            .await
            .map_err(|e| anyhow::anyhow!("metadata log replay failed: {e}"))?;
    }
    first_rx
        .await
        .map_err(|_| anyhow::anyhow!("no metadata from the controller"))?;
    let recovery_seconds = crate::clock::monotonic()
        .saturating_duration_since(started)
        .as_secs_f64();
    crate::shard::metrics::set_recovery_seconds(recovery_seconds);
    tracing::info!(
        shard,
        partitions = ctx.partitions().len(),
        segments_scanned = logs.segments_scanned(),
        clean_shutdown = clean_start,
        recovery_seconds,
        "logs recovered"
    );

    ctx.maybe_request_producer_ids();
    let maintenance = glommio::spawn_local_into(
        {
            let ctx = ctx.clone();
            async move {
                loop {
                    glommio::timer::sleep(Duration::from_millis(PRODUCER_MAINTENANCE_MS)).await;
                    ctx.maintain_producer_state().await;
                    ctx.txn.abort_expired(&ctx).await;
                }
            }
        },
        background,
    )
    .map_err(|e| anyhow::anyhow!("cannot spawn producer maintenance: {e}"))?;
    // The ISR of the replicated partitions this shard leads: followers
    // behind for `replica.lag.time.max.ms` leave it, checked every half of
    // it as Kafka's `isr-expiration` task (`replication::leading`).
    let lag_max_ms = config.replica_lag_time_max_ms;
    ctx.leading.set_lag_max_ms(lag_max_ms as i64);
    let isr_expiration = glommio::spawn_local_into(
        {
            let ctx = ctx.clone();
            async move {
                loop {
                    glommio::timer::sleep(Duration::from_millis((lag_max_ms / 2).max(50))).await;
                    let own_epoch = ctx.broker_epoch_in(&ctx.image());
                    for p in ctx.leading.shrink_proposals(own_epoch) {
                        ctx.alter_isr(p);
                    }
                }
            }
        },
        background,
    )
    .map_err(|e| anyhow::anyhow!("cannot spawn the ISR expiration: {e}"))?;
    // The log cleaner of compacted topics (`partition::compaction`): one
    // log per round, the filthiest; a pause of `log.cleaner.backoff.ms`
    // when none needs cleaning. Dropped at stop like the maintenance task
    // (an interrupted cleaning leaves `.cleaned` files or a committed swap,
    // which the next open deletes or finishes).
    let cleaner = if config.log_cleaner_enable {
        let ctx = ctx.clone();
        let settings = crate::partition::compaction::CleanerSettings {
            // Kafka's dedupe buffer is shared by the cleaner threads.
            dedupe_buffer_bytes: (config.log_cleaner_dedupe_buffer_size
                / config.log_cleaner_threads)
                .max(crate::log::cleaner::DEDUPE_BUFFER_MIN_BYTES),
            io_max_bytes_per_second: config.log_cleaner_io_max_bytes_per_second,
        };
        let backoff = Duration::from_millis(config.log_cleaner_backoff_ms);
        Some(
            glommio::spawn_local_into(
                async move {
                    loop {
                        let partitions = ctx.partitions();
                        let cleaned = crate::partition::compaction::clean_filthiest(
                            &partitions,
                            settings,
                            crate::clock::now_ms(),
                        )
                        .await;
                        drop(partitions);
                        if !cleaned {
                            glommio::timer::sleep(backoff).await;
                        }
                    }
                },
                background,
            )
            .map_err(|e| anyhow::anyhow!("cannot spawn the log cleaner: {e}"))?,
        )
    } else {
        None
    };

    // One socket per listener: shard k on each listener's port + k.
    let mut sockets = Vec::with_capacity(config.listeners.len());
    let mut bound = Vec::with_capacity(config.listeners.len());
    for l in &config.listeners {
        let addr = SocketAddr::new(l.host, l.port_of(shard));
        let socket = bind_when_free(addr)
            .await
            .map_err(|e| anyhow::anyhow!("cannot listen on {addr} ({}): {e}", l.protocol.name()))?;
        bound.push(socket.local_addr().unwrap_or(addr));
        sockets.push(socket);
    }
    // Shard 0 serves the metrics endpoint, in a task queue that yields to
    // requests (see `net::metrics_http`).
    // An address given with --metrics-listen that cannot be bound fails the
    // start; the default one only warns (a second broker on the host, or a
    // benchmark beside a running broker, still starts).
    let metrics_listener = match config.metrics_listen.filter(|_| shard == 0) {
        None => None,
        Some(maddr) => match crate::net::metrics_http::bind(maddr) {
            Ok(l) => Some((maddr, l)),
            Err(e) if config.metrics_listen_is_default => {
                tracing::warn!(%maddr, error = %e, "no metrics endpoint: the default address is in use (choose one with --metrics-listen)");
                None
            }
            Err(e) => {
                return Err(anyhow::anyhow!(
                    "cannot listen on {maddr} for metrics: {e} (choose another --metrics-listen, or none)"
                ))
            }
        },
    };
    let metrics_endpoint = match metrics_listener {
        Some((maddr, mlistener)) => {
            let queue = glommio::executor().create_task_queue(
                Shares::Static(crate::net::metrics_http::METRICS_SHARES),
                Latency::NotImportant,
                "metrics",
            );
            let start_time_seconds = crate::clock::now_ms() as f64 / 1000.0
                - crate::clock::monotonic()
                    .saturating_duration_since(started)
                    .as_secs_f64();
            println!(
                "fjord: metrics on http://{}/metrics",
                mlistener.local_addr().unwrap_or(maddr)
            );
            Some(
                glommio::spawn_local_into(
                    crate::net::metrics_http::serve(ctx.clone(), mlistener, start_time_seconds),
                    queue,
                )
                .map_err(|e| anyhow::anyhow!("cannot spawn the metrics endpoint: {e}"))?,
            )
        }
        None => None,
    };
    let tls = tls.map(|store| Rc::new(crate::net::tls::ShardTls::new(store)));
    let accept: Vec<_> = sockets
        .into_iter()
        .enumerate()
        .map(|(index, socket)| {
            glommio::spawn_local(crate::net::accept_loop(
                ctx.clone(),
                index,
                socket,
                tls.clone(),
            ))
        })
        .collect();
    let _ = ready_tx.send((shard, Ok(bound)));
    if config.debug_stall_shard == Some(shard) {
        let ms = config
            .debug_stall_shard_ms
            .unwrap_or(DEBUG_STALL_FOR_GOOD_MS);
        tracing::warn!(
            shard,
            ms,
            "--debug-stall-shard: messages from other shards are left unhandled"
        );
        stalled_until.set(Some(crate::clock::monotonic() + Duration::from_millis(ms)));
    }
    crate::log::set_debug_write_delay_ms(config.debug_write_delay_ms);
    if config.debug_panic_shard == Some(shard) {
        glommio::spawn_local(async move {
            glommio::timer::sleep(Duration::from_millis(DEBUG_PANIC_DELAY_MS)).await;
            panic!("shard {shard}: panic injected by --debug-panic-shard");
        })
        .detach();
    }

    while !stop.load(Ordering::SeqCst) {
        glommio::timer::sleep(Duration::from_millis(SHUTDOWN_POLL_MS)).await;
    }
    if shard == 0 {
        // Shard 0 says so (the process cannot exit before shard 0 is done).
        sd_notify("STOPPING=1");
        tracing::info!(
            timeout_ms = SHUTDOWN_MS_MAX,
            "stopping: no new connections, finishing requests in flight, closing logs"
        );
    }
    drop(accept); // stops accepting
    drop(metrics_endpoint);
    let deadline = crate::clock::monotonic() + Duration::from_millis(SHUTDOWN_DRAIN_MS_MAX);
    // The replica fetchers end their request in flight (a truncation
    // completes) before the logs close.
    ctx.replicas.stop_all(deadline).await;
    while ctx.inflight_requests() > 0 && crate::clock::monotonic() < deadline {
        glommio::timer::sleep(Duration::from_millis(10)).await;
    }
    drop(maintenance);
    drop(isr_expiration);
    drop(cleaner);
    ctx.snapshot_producers_at_stop().await;
    let closed = logs.shutdown().await;
    ctx.router.close();
    closed.map_err(|e| anyhow::anyhow!("shard {shard}: closing its logs failed: {e}"))
}

/// The clean-shutdown marker in the data dir (Kafka's
/// `.kafka_cleanshutdown`): written after every shard closed all its logs
/// (each sealed, fdatasynced, with its recovery point checkpointed at its
/// log end), removed at start before any log is opened, so that it speaks
/// only of the files as that stop left them. Its presence lets recovery
/// trust the active segments instead of scanning them
/// (`log::recovery`).
const CLEAN_SHUTDOWN_MARKER: &str = "clean-shutdown";

/// Whether the last stop was clean; removes the marker (durably) either way.
fn take_clean_shutdown_marker(data_dir: &std::path::Path) -> anyhow::Result<bool> {
    match std::fs::remove_file(data_dir.join(CLEAN_SHUTDOWN_MARKER)) {
        Ok(()) => {
            crate::log::sync_dir(data_dir).map_err(|e| {
                anyhow::anyhow!(
                    "cannot sync {} after removing the clean-shutdown marker: {e}",
                    data_dir.display()
                )
            })?;
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(anyhow::anyhow!(
            "cannot remove the clean-shutdown marker in {}: {e}",
            data_dir.display()
        )),
    }
}

fn write_clean_shutdown_marker(data_dir: &std::path::Path) -> std::io::Result<()> {
    std::fs::File::create(data_dir.join(CLEAN_SHUTDOWN_MARKER))?.sync_all()?;
    crate::log::sync_dir(data_dir)
}

/// Binds `addr`, waiting up to `BIND_BUSY_WAIT_MS_MAX` while it is in use.
/// A broker restarted right after a crash needs this: the kernel tears down
/// a killed process's io_uring asynchronously, and its listening socket (held
/// by a pending accept) stays bound for a moment after the process is gone —
/// about 15 ms on an idle machine, longer on a busy one. A port still in use
/// after the wait is a real conflict, reported as the error.
async fn bind_when_free(addr: SocketAddr) -> std::io::Result<glommio::net::TcpListener> {
    let deadline = crate::clock::monotonic() + Duration::from_millis(BIND_BUSY_WAIT_MS_MAX);
    let mut warned = false;
    loop {
        match crate::net::bind(addr) {
            Err(e)
                if e.kind() == std::io::ErrorKind::AddrInUse
                    && crate::clock::monotonic() < deadline =>
            {
                if !warned {
                    tracing::warn!(%addr, "address in use; waiting for it to be released");
                    warned = true;
                }
                glommio::timer::sleep(Duration::from_millis(BIND_RETRY_PAUSE_MS)).await;
            }
            other => return other,
        }
    }
}

fn init_tracing(format: LogFormat) {
    // The filter can be changed at run time: `crate::logging`.
    crate::logging::init(matches!(format, LogFormat::Json));
}

/// Once `stop` is set (SIGINT/SIGTERM): ends the process if the stop has
/// not finished within `SHUTDOWN_MS_MAX`. A thread of its own, so that a shard stuck in a
/// system call cannot hold it up.
fn spawn_stop_watchdog(stop: Arc<AtomicBool>) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("stop-watchdog".into())
        .spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(SHUTDOWN_POLL_MS));
            }
            std::thread::sleep(Duration::from_millis(SHUTDOWN_MS_MAX));
            eprintln!(
                "fjord: stop took longer than {SHUTDOWN_MS_MAX} ms; exiting without finishing it"
            );
            std::process::exit(EXIT_SHUTDOWN_TIMEOUT);
        })
        .map(|_| ())
}

/// Once `reload` is set (SIGHUP): re-reads the TLS certificate, key and
/// client CA, off the shards; each shard takes the new config for the
/// connections it accepts from then on (`net::tls`). Polled as the shards
/// poll the stop flag; ends when the broker stops.
fn spawn_tls_reloader(
    reload: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    tls: Option<Arc<crate::net::tls::TlsStore>>,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("tls-reload".into())
        .spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(SHUTDOWN_POLL_MS));
                if !reload.swap(false, Ordering::SeqCst) {
                    continue;
                }
                match &tls {
                    None => tracing::info!("SIGHUP: no TLS listener, nothing to reload"),
                    Some(store) => match store.reload() {
                        Ok(()) => tracing::info!(
                            "SIGHUP: TLS certificate, key and client CA reloaded; new connections use them"
                        ),
                        Err(e) => tracing::error!(
                            error = %e,
                            "SIGHUP: TLS reload failed; keeping the previous certificate and key"
                        ),
                    },
                }
            }
        })
        .map(|_| ())
}

/// Sends `state` to systemd's notification socket (sd_notify(3)): a
/// datagram of `KEY=value` lines to the Unix socket named by
/// `$NOTIFY_SOCKET`, a path or, starting with `@`, an abstract name. Does
/// nothing outside systemd (no `$NOTIFY_SOCKET`); a failed send is logged,
/// not fatal: systemd then times the start out, which says more than a
/// broker that refuses to run.
fn sd_notify(state: &str) {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::net::{SocketAddr as UnixAddr, UnixDatagram};
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let bytes = path.as_bytes();
    let sent = UnixDatagram::unbound().and_then(|socket| {
        let addr = match bytes.strip_prefix(b"@") {
            Some(name) => UnixAddr::from_abstract_name(name)?,
            None => UnixAddr::from_pathname(Path::new(&path))?,
        };
        socket.send_to_addr(state.as_bytes(), &addr)
    });
    if let Err(e) = sent {
        tracing::warn!(socket = ?path, error = %e, "sd_notify failed");
    }
}

/// The CPUs this process may run on, in order (pinning uses them).
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity fills it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return (0..std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1))
            .collect();
    }
    (0..libc::CPU_SETSIZE as usize)
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect()
}
