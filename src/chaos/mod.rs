//! `fjord chaos`: a Jepsen-style checker under `kill -9`. It starts a
//! broker, drives it with real librdkafka clients, SIGKILLs it at random
//! moments and restarts it on the same data directory and ports, and at the
//! end reads everything back and checks what survived against what the
//! broker acknowledged.
//!
//! # A run
//!
//! 1. Start `fjord serve --cores 2 --no-pin` (this executable, or
//!    `--broker-bin`) on a new data directory and free ports
//!    ([`broker`]); `--fsync-acks` is passed through.
//! 2. Create four topics with 1 MiB segments (so that segments roll during
//!    the run; values reach 1 MB): `chaos-idem` and `chaos-retained` for
//!    idempotent producers, `chaos-txn-a` and `chaos-txn-b` for
//!    transactional ones. `chaos-retained` also has `retention.bytes`, and
//!    its log start is moved by DeleteRecords during the run.
//! 3. Start the clients ([`clients`]), each on its own thread: idempotent
//!    producers (acks=all, enable.idempotence) writing self-describing values
//!    ([`value`]: producer, session, sequence number, CRC-32C; 100 B to 1 MB)
//!    at a fixed rate; transactional producers writing transactions of 2-12
//!    messages over 2-3 partitions of both transactional topics, a fraction
//!    aborted on purpose; a consumer group member that consumes
//!    `chaos-idem` and commits its offsets. Every outcome is recorded
//!    ([`history`]).
//! 4. `--cycles` times: let the load run for a random time around
//!    `--cycle-ms` (with a DeleteRecords on `chaos-retained` at a random
//!    moment in half the cycles), SIGKILL the broker, wait a random pause
//!    (every `--long-outage-every`th cycle a long outage instead, past the
//!    clients' message timeouts, so that operations become indeterminate),
//!    restart it, and check right away that the group's committed offsets
//!    and the retained topic's log starts did not go below what was
//!    acknowledged before the kill.
//! 5. Stop the load (producers finish their transaction and flush), stop
//!    the broker cleanly (SIGTERM; it must exit 0 after `fjord: stopped`),
//!    start it again, wait until every partition's last stable offset
//!    reaches its high watermark (bounded by the transaction timeout plus
//!    the broker's abort check interval), and read every partition from its
//!    log start with read_uncommitted and with read_committed ([`readback`]).
//! 6. Check ([`check`]), print a table, write JSON (`--out`), and exit
//!    non-zero if there is any anomaly.
//!
//! The seed (`--seed`, printed at the start) drives every random choice of
//! the orchestrator and the clients: the kill schedule, pauses, partitions,
//! value sizes, transaction shapes and planned aborts. Thread scheduling and
//! the broker's timing are not seeded, so a seed repeats a run's plan, not
//! its exact interleaving.
//!
//! # What is checked
//!
//! What fjord promises (README, Durability): an acknowledged write survives
//! `kill -9` of the broker, in the default mode (written to the segment file
//! through the page cache, which outlives the process) and with
//! `--fsync-acks`; Kafka's transaction and idempotence semantics hold across
//! restarts. The anomalies, with Jepsen's names (details in [`check`]):
//!
//! - `lost-write`: an acknowledged message is not in the log, or an
//!   acknowledged non-transactional one is not visible to read_committed.
//! - `inconsistent-offsets`: an acknowledged message is at another offset
//!   than its acknowledgement said.
//! - `duplicate`: a value is stored twice (idempotence must prevent this
//!   even for retried, indeterminate sends).
//! - `nonmonotonic-send`: one producer session's messages on one partition
//!   are stored out of the order they were sent in.
//! - `G1a`: an aborted transaction (abort returned OK) is visible to
//!   read_committed.
//! - `non-atomic-txn`: read_committed shows some but not all of a
//!   transaction's messages (partitions missing, or messages within one).
//! - `lost-txn`: a transaction whose commit returned OK is not visible.
//! - `stuck-lso`: after all transactions ended and their timeouts passed,
//!   a partition's last stable offset (ListOffsets, read_committed) stays
//!   below its high watermark.
//! - `offset-regression`: the group's committed offset (OffsetFetch after a
//!   restart) is below an acknowledged commit, or acknowledged commits of a
//!   partition go down.
//! - `log-start-regression`: a log start is below an acknowledged
//!   DeleteRecords after a restart (deleted records came back).
//! - `corrupt-value`, `unexpected-value`, `read-stalled`: stored bytes that
//!   fail their checksum or do not match what was sent, values never sent,
//!   partitions that cannot be read to their end.
//!
//! Indeterminate operations (a message without a delivery report, or failed
//! after it may have reached the broker; a transaction whose end call did
//! not answer) may be present or absent, but must still be atomic (a
//! transaction wholly visible or wholly invisible) and not duplicated.
//!
//! # What it cannot see
//!
//! - Power loss or disk faults: `kill -9` leaves the page cache intact, so
//!   the default mode's promise is what is tested. With `--fsync-acks` the
//!   run shows that the fdatasync path loses nothing under `kill -9`; that
//!   the data was on stable storage it cannot show.
//! - Anything transient: reads happen at the end. A read_committed consumer
//!   that saw aborted data for a while, or an LSO stuck for a while, is not
//!   seen (the group consumer only checks what it reads decodes).
//! - Client bugs: the history is what librdkafka reported. A delivery report
//!   or transaction result that librdkafka got wrong shows up as an anomaly
//!   of the broker, or hides one.
//! - Below the retained topic's final log start nothing is checked. Its
//!   `retention.bytes` is effectively never applied during a run: fjord
//!   checks retention every 5 minutes (Kafka's
//!   `log.retention.check.interval.ms`, not a flag of `fjord serve`) and the
//!   broker is killed every few seconds, so the config only has to survive
//!   restarts. DeleteRecords is what moves that log start.
//! - Kills during start-up and recovery (each kill comes after `fjord:
//!   ready`), several nodes, network faults, clock jumps.
//! - Order across a producer's sessions (a recreated idempotent producer is
//!   a new producer id; Kafka orders only within one).
//! - Idempotent messages that time out. librdkafka's idempotent producer
//!   then bumps its epoch locally and re-sends what is still queued from
//!   sequence 0, stored messages included, and any broker must accept that
//!   (confluentinc/librdkafka#4953). The idempotent producers' message
//!   timeout (`--idempotent-message-timeout-ms`, 60 s) is therefore above
//!   every outage; long outages make the transactional producers' messages
//!   and calls time out instead, where an abort or the next client's
//!   InitProducerId settles them. A shorter timeout reproduces the client's
//!   duplicates (`duplicate` and `nonmonotonic-send`), which are not the
//!   broker's.

pub mod broker;
pub mod check;
pub mod clients;
pub mod history;
pub mod readback;
pub mod summary;
pub mod value;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rdkafka::error::KafkaError;

use broker::{BrokerSpec, ChaosBroker};
use clients::{lock, ClientLog, ClientSettings, GroupJob, ProducerJob, ProducerOutput, Shared};
use history::{ChaosTopic, DeleteAck, History, LogStartCheck, OffsetCheck, Tp};
use readback::{Isolation, TopicSpec};

/// Errors of a chaos run.
#[derive(Debug, thiserror::Error)]
pub enum ChaosError {
    #[error("chaos configuration: {0}")]
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
    #[error("{anomalies} anomalies and {run_errors} run errors found; see {report}")]
    Failed {
        anomalies: u64,
        run_errors: usize,
        report: String,
    },
}

/// `segment.bytes` of every workload topic: small, so that segments roll
/// many times in a run.
pub const SEGMENT_BYTES: u64 = 1 << 20;
/// `retention.bytes` of the retained topic.
pub const RETENTION_BYTES: u64 = 8 << 20;
/// Partitions of the retained topic and of each transactional topic.
pub const RETAINED_PARTITIONS: i32 = 2;
pub const TXN_PARTITIONS: i32 = 2;
/// Share of cycles with a DeleteRecords on the retained topic.
pub const DELETE_RECORDS_SHARE: f64 = 0.5;
/// Pause between kill and restart in a long outage (`--long-outage-every`):
/// longer than both producers' `message.timeout.ms`, so that messages time
/// out in flight, transactions fail and are aborted or left indeterminate,
/// and idempotent producers bump their epoch or are recreated.
pub const LONG_OUTAGE_MS: u64 = 17_000;
/// How often the orchestrator looks at its threads and the broker while
/// the load runs.
pub const WATCH_INTERVAL_MS: u64 = 50;
/// How long OffsetFetch and ListOffsets may take after a restart (the
/// coordinators load their logs first).
pub const CHECK_TIMEOUT_MS: u64 = 30_000;
/// How long client threads may take to finish after the stop (a final
/// flush, and a transaction's end call with its retries).
pub const JOIN_TIMEOUT_MS: u64 = 180_000;
/// Beyond the transaction timeout and the broker's abort check interval,
/// how long the last stable offsets may take to reach the high watermarks.
pub const LSO_WAIT_MARGIN_MS: u64 = 10_000;
/// Client events kept in the JSON result.
pub const EVENTS_KEPT_MAX: usize = 500;

/// `fjord chaos`'s flags.
#[derive(Debug, Clone, clap::Args)]
pub struct ChaosArgs {
    /// Kill -9 / restart cycles.
    #[arg(long, default_value_t = 10)]
    pub cycles: u32,
    /// Mean milliseconds of load between kills (each cycle draws from half to 1.5 times this).
    #[arg(long, default_value_t = 4_000)]
    pub cycle_ms: u64,
    /// Seed of every random choice [default: from the clock; printed at the start].
    #[arg(long)]
    pub seed: Option<u64>,
    /// Start the broker with --fsync-acks.
    #[arg(long)]
    pub fsync_acks: bool,
    /// The fjord executable to run as the broker [default: this one].
    #[arg(long)]
    pub broker_bin: Option<PathBuf>,
    /// Directory of the run, created (absent or empty): the broker's data in
    /// `data/`, logs in `broker.log` and `clients.log` [default: a new
    /// temporary directory, removed after a run without anomalies].
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Keep the temporary run directory even after a run without anomalies.
    #[arg(long)]
    pub keep_data: bool,
    /// Write the result as JSON to this file.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Shards of the broker (`--cores`).
    #[arg(long, default_value_t = 2)]
    pub broker_cores: usize,
    /// Idempotent producers (one thread each).
    #[arg(long, default_value_t = 3)]
    pub idempotent_producers: usize,
    /// Transactional producers (one thread each).
    #[arg(long, default_value_t = 2)]
    pub transactional_producers: usize,
    /// Members of the consumer group (0 = no group checks).
    #[arg(long, default_value_t = 1)]
    pub group_consumers: usize,
    /// Messages per second per idempotent producer.
    #[arg(long, default_value_t = 100.0)]
    pub rate: f64,
    /// Share of transactions aborted on purpose.
    #[arg(long, default_value_t = 0.2)]
    pub abort_fraction: f64,
    /// Largest value in bytes (values range from 100 B to this).
    #[arg(long, default_value_t = clients::VALUE_MAX_BYTES)]
    pub value_max_bytes: u32,
    /// Partitions of the idempotent topic (the group consumer's).
    #[arg(long, default_value_t = 4)]
    pub partitions: i32,
    /// Longest pause between a kill and the restart, in milliseconds.
    #[arg(long, default_value_t = 500)]
    pub restart_pause_ms_max: u64,
    /// Every Nth cycle the broker stays down for a long outage (17 s, longer
    /// than the clients' message timeouts) instead; 0 = never.
    #[arg(long, default_value_t = 20)]
    pub long_outage_every: u32,
    /// `message.timeout.ms` of the idempotent producers. Keep it above the
    /// longest outage: a shorter one lets librdkafka re-send stored messages
    /// under a bumped epoch, duplicates no broker can prevent (see the
    /// module doc).
    #[arg(long, default_value_t = clients::IDEM_MESSAGE_TIMEOUT_MS)]
    pub idempotent_message_timeout_ms: u64,
    /// librdkafka debug contexts for every client (e.g. `eos,msg`), logged to clients.log.
    #[arg(long)]
    pub client_debug: Option<String>,
}

/// One kill and restart.
#[derive(Clone, Debug, serde::Serialize)]
pub struct CycleRecord {
    pub cycle: u32,
    pub load_ms: u64,
    /// Seconds since the run started.
    pub killed_at_s: f64,
    pub restart_pause_ms: u64,
    pub long_outage: bool,
    pub restart_ready_ms: u64,
    pub deletes: usize,
}

/// What a client thread returns.
enum ThreadOutput {
    Producer(ProducerOutput),
    Consumer,
}

type ClientThread = (String, JoinHandle<Result<ThreadOutput, ChaosError>>);

/// splitmix64: independent seeds for each client from the run's seed.
fn derive_seed(seed: u64, k: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15u64.wrapping_mul(k + 1));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The run's directory: given (must be absent or empty) or a new temporary one.
fn run_dir(args: &ChaosArgs) -> Result<(PathBuf, bool), ChaosError> {
    let io = |what: String| move |source| ChaosError::Io { what, source };
    match &args.data_dir {
        Some(d) => {
            if d.exists() {
                let mut entries =
                    std::fs::read_dir(d).map_err(io(format!("reading {}", d.display())))?;
                if entries.next().is_some() {
                    return Err(ChaosError::Config(format!(
                        "{} is not empty: a chaos run needs a fresh directory (its history starts empty)",
                        d.display()
                    )));
                }
            }
            std::fs::create_dir_all(d).map_err(io(format!("creating {}", d.display())))?;
            Ok((d.clone(), false))
        }
        None => {
            let ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis())
                .unwrap_or(0);
            let d = std::env::temp_dir().join(format!("fjord-chaos-{}-{ms}", std::process::id()));
            std::fs::create_dir_all(&d).map_err(io(format!("creating {}", d.display())))?;
            Ok((d, true))
        }
    }
}

fn validate(args: &ChaosArgs) -> Result<(), ChaosError> {
    let bad = |m: &str| Err(ChaosError::Config(m.to_string()));
    if args.idempotent_producers + args.transactional_producers == 0 {
        return bad("at least one producer is needed");
    }
    if args.idempotent_producers + args.transactional_producers > usize::from(u16::MAX) {
        return bad("too many producers");
    }
    if args.rate.is_nan() || args.rate <= 0.0 {
        return bad("--rate must be positive");
    }
    if !(0.0..=1.0).contains(&args.abort_fraction) {
        return bad("--abort-fraction must be within 0..1");
    }
    if (args.value_max_bytes as usize)
        < value::VALUE_MIN_BYTES.max(clients::VALUE_SMALL_MIN_BYTES as usize)
        || args.value_max_bytes > clients::VALUE_MAX_BYTES
    {
        return bad("--value-max-bytes must be within 100..=1000000");
    }
    if args.long_outage_every > 0
        && args.idempotent_message_timeout_ms <= LONG_OUTAGE_MS + broker::READY_TIMEOUT_MS / 10
    {
        eprintln!(
            "fjord chaos: warning: --idempotent-message-timeout-ms {} is not above the long outages ({LONG_OUTAGE_MS} ms and the restart): librdkafka may then store messages twice by itself",
            args.idempotent_message_timeout_ms
        );
    }
    if args.partitions < 1 || args.broker_cores < 1 || args.cycle_ms < 2 {
        return bad("--partitions, --broker-cores and --cycle-ms must be positive");
    }
    Ok(())
}

/// Runs `fjord chaos`; Err(Failed) when the check found anomalies.
pub fn run(args: ChaosArgs) -> Result<(), ChaosError> {
    validate(&args)?;
    let seed = args.seed.unwrap_or_else(|| {
        let ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        derive_seed(ns, u64::from(std::process::id()))
    });
    println!("fjord chaos: seed {seed} (repeat with --seed {seed})");
    let (dir, temporary) = run_dir(&args)?;
    let started = Instant::now();
    let bin = match &args.broker_bin {
        Some(b) => b.clone(),
        None => std::env::current_exe().map_err(|source| ChaosError::Io {
            what: "finding this executable".to_string(),
            source,
        })?,
    };
    let spec = BrokerSpec {
        bin,
        data_dir: dir.join("data"),
        log: dir.join("broker.log"),
        cores: args.broker_cores,
        fsync_acks: args.fsync_acks,
    };
    println!(
        "fjord chaos: run directory {} ({} cycles of ~{} ms, {})",
        dir.display(),
        args.cycles,
        args.cycle_ms,
        if args.fsync_acks {
            "--fsync-acks"
        } else {
            "default durability"
        }
    );
    let shared = Arc::new(Shared {
        stop: AtomicBool::new(false),
        generation: AtomicU32::new(0),
        log: ClientLog::open(&dir.join("clients.log"), started)?,
        group: Mutex::new(Default::default()),
        events: Mutex::new(Vec::new()),
    });
    let broker = ChaosBroker::start(spec.clone())?;
    shared.generation.store(broker.starts, Ordering::Relaxed);
    broker.mark(&format!("started (seed {seed})"));
    let mut r = Run {
        args,
        seed,
        rng: StdRng::seed_from_u64(derive_seed(seed, u64::MAX - 1)),
        broker,
        shared,
        started,
        history: History::default(),
        cycles: Vec::new(),
        run_errors: Vec::new(),
        threads: Vec::new(),
    };
    let outcome = r.execute();
    let failed = !matches!(&outcome, Ok((a, _)) if a.total() == 0 && r.run_errors.is_empty());
    // Whatever happened, no broker stays behind.
    if r.broker.is_running() {
        let _ = r.broker.stop();
    }
    drop(r.broker);
    let (analysis, report_path) = outcome?;
    if temporary && !failed && !r.args.keep_data {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        println!("fjord chaos: run directory kept: {}", dir.display());
    }
    if failed {
        return Err(ChaosError::Failed {
            anomalies: analysis.total(),
            run_errors: r.run_errors.len(),
            report: report_path,
        });
    }
    Ok(())
}

/// The orchestrator's state.
struct Run {
    args: ChaosArgs,
    seed: u64,
    rng: StdRng,
    broker: ChaosBroker,
    shared: Arc<Shared>,
    started: Instant,
    history: History,
    cycles: Vec<CycleRecord>,
    /// Things that went wrong without being anomalies of the data (a broker
    /// that exited by itself, a failed clean stop): they fail the run too.
    run_errors: Vec<String>,
    threads: Vec<ClientThread>,
}

impl Run {
    fn settings(&self) -> ClientSettings {
        ClientSettings {
            bootstrap: self.broker.bootstrap(),
            idem_partitions: self.args.partitions,
            retained_partitions: RETAINED_PARTITIONS,
            txn_partitions: TXN_PARTITIONS,
            idem_rate: self.args.rate,
            value_max_bytes: self.args.value_max_bytes,
            abort_fraction: self.args.abort_fraction,
            idem_message_timeout_ms: self.args.idempotent_message_timeout_ms,
            debug: self.args.client_debug.clone(),
        }
    }

    fn producer_names(&self) -> Vec<String> {
        (0..self.args.idempotent_producers)
            .map(|k| format!("idem-{k}"))
            .chain((0..self.args.transactional_producers).map(|k| format!("txn-{k}")))
            .collect()
    }

    fn topic_specs(&self) -> Vec<TopicSpec> {
        let seg = ("segment.bytes", SEGMENT_BYTES.to_string());
        vec![
            TopicSpec {
                topic: ChaosTopic::Idem,
                partitions: self.args.partitions,
                configs: vec![seg.clone()],
            },
            TopicSpec {
                topic: ChaosTopic::Retained,
                partitions: RETAINED_PARTITIONS,
                configs: vec![
                    seg.clone(),
                    ("retention.bytes", RETENTION_BYTES.to_string()),
                ],
            },
            TopicSpec {
                topic: ChaosTopic::TxnA,
                partitions: TXN_PARTITIONS,
                configs: vec![seg.clone()],
            },
            TopicSpec {
                topic: ChaosTopic::TxnB,
                partitions: TXN_PARTITIONS,
                configs: vec![seg],
            },
        ]
    }

    fn all_tps(&self) -> Vec<Tp> {
        self.topic_specs()
            .iter()
            .flat_map(|s| {
                let topic = s.topic;
                (0..s.partitions).map(move |partition| Tp { topic, partition })
            })
            .collect()
    }

    fn generation(&self) -> u32 {
        self.broker.starts
    }

    /// The whole run after the broker's first start; returns the analysis
    /// and where the report went.
    fn execute(&mut self) -> Result<(check::Analysis, String), ChaosError> {
        readback::create_topics(&self.broker.bootstrap(), &self.topic_specs())?;
        self.spawn_clients()?;
        for cycle in 1..=self.args.cycles {
            self.cycle(cycle)?;
        }
        if self.args.cycles == 0 {
            let load = self.args.cycle_ms;
            self.watch(load, None)?;
        }
        self.finish()
    }

    fn spawn_clients(&mut self) -> Result<(), ChaosError> {
        let settings = Arc::new(self.settings());
        let spawn = |name: String,
                     f: Box<dyn FnOnce() -> Result<ThreadOutput, ChaosError> + Send>|
         -> Result<ClientThread, ChaosError> {
            let h = std::thread::Builder::new()
                .name(format!("chaos-{name}"))
                .spawn(f)
                .map_err(|source| ChaosError::Io {
                    what: format!("spawning {name}"),
                    source,
                })?;
            Ok((name, h))
        };
        let idem = self.args.idempotent_producers;
        for k in 0..idem {
            let job = ProducerJob {
                index: k,
                id: k as u16,
                seed: derive_seed(self.seed, k as u64),
                settings: settings.clone(),
                shared: self.shared.clone(),
            };
            self.threads.push(spawn(
                format!("idem-{k}"),
                Box::new(move || clients::run_idempotent(job).map(ThreadOutput::Producer)),
            )?);
        }
        for k in 0..self.args.transactional_producers {
            let job = ProducerJob {
                index: k,
                id: (idem + k) as u16,
                seed: derive_seed(self.seed, (idem + k) as u64),
                settings: settings.clone(),
                shared: self.shared.clone(),
            };
            self.threads.push(spawn(
                format!("txn-{k}"),
                Box::new(move || clients::run_transactional(job).map(ThreadOutput::Producer)),
            )?);
        }
        for k in 0..self.args.group_consumers {
            let job = GroupJob {
                settings: settings.clone(),
                shared: self.shared.clone(),
            };
            self.threads.push(spawn(
                format!("group-{k}"),
                Box::new(move || clients::run_group_consumer(job).map(|()| ThreadOutput::Consumer)),
            )?);
        }
        Ok(())
    }

    /// Lets the load run for `ms`, doing a DeleteRecords at `delete_at_ms`;
    /// a client thread that ends early ends the run, a broker that exits by
    /// itself is a run error (and is restarted). Returns the deletes made.
    fn watch(&mut self, ms: u64, delete_at_ms: Option<u64>) -> Result<usize, ChaosError> {
        let start = Instant::now();
        let end = start + Duration::from_millis(ms);
        let mut delete_at = delete_at_ms.map(|d| start + Duration::from_millis(d));
        let mut deletes = 0;
        while Instant::now() < end {
            std::thread::sleep(
                Duration::from_millis(WATCH_INTERVAL_MS).min(end - Instant::now().min(end)),
            );
            if let Some(i) = self.threads.iter().position(|(_, h)| h.is_finished()) {
                let (name, h) = self.threads.remove(i);
                let why = match h.join() {
                    Ok(Ok(_)) => "ended before the stop".to_string(),
                    Ok(Err(e)) => e.to_string(),
                    Err(_) => "panicked".to_string(),
                };
                return Err(ChaosError::Thread(format!("{name}: {why}")));
            }
            if !self.broker.is_running() {
                let what = format!(
                    "the broker exited by itself during the load of broker generation {}",
                    self.generation()
                );
                eprintln!("fjord chaos: {what}");
                self.run_errors.push(what);
                self.broker.kill9()?;
                self.restart_and_check(0)?;
            }
            if delete_at.is_some_and(|t| Instant::now() >= t) {
                delete_at = None;
                deletes += self.delete_some_records();
            }
        }
        Ok(deletes)
    }

    /// DeleteRecords on one retained partition, up to a random offset in the
    /// first half of what it holds; returns 1 when acknowledged.
    fn delete_some_records(&mut self) -> usize {
        let tp = Tp {
            topic: ChaosTopic::Retained,
            partition: self.rng.random_range(0..RETAINED_PARTITIONS),
        };
        let bootstrap = self.broker.bootstrap();
        let marks = readback::watermarks(
            &bootstrap,
            Isolation::ReadUncommitted,
            &[tp],
            Duration::from_millis(readback::REQUEST_TIMEOUT_MS),
        );
        let (low, high) = match marks {
            Ok(m) => m[&tp],
            Err(e) => {
                self.shared.log.line(
                    "orchestrator",
                    &format!("watermarks for DeleteRecords: {e}"),
                );
                return 0;
            }
        };
        if high <= low {
            return 0;
        }
        let target = low + self.rng.random_range(0..=(high - low) / 2);
        match readback::delete_records(&bootstrap, tp, target) {
            Ok(log_start) => {
                self.broker.mark(&format!(
                    "DeleteRecords {tp} below {target}: log start {log_start}"
                ));
                self.history.deletes.push(DeleteAck {
                    partition: tp.partition,
                    log_start,
                    generation: self.generation(),
                });
                1
            }
            Err(e) => {
                self.shared
                    .log
                    .line("orchestrator", &format!("DeleteRecords {tp}: {e}"));
                0
            }
        }
    }

    fn cycle(&mut self, cycle: u32) -> Result<(), ChaosError> {
        let cms = self.args.cycle_ms;
        let load = self.rng.random_range(cms / 2..=cms + cms / 2);
        let delete_at = self
            .rng
            .random_bool(DELETE_RECORDS_SHARE)
            .then(|| self.rng.random_range(0..load));
        let pause = self.rng.random_range(0..=self.args.restart_pause_ms_max);
        let every = self.args.long_outage_every;
        let long_outage = every > 0 && cycle % every == 0;
        let pause = if long_outage { LONG_OUTAGE_MS } else { pause };
        let deletes = self.watch(load, delete_at)?;
        let killed_at_s = self.started.elapsed().as_secs_f64();
        self.broker.mark(&format!(
            "SIGKILL, cycle {cycle}, after {load} ms of load, at {killed_at_s:.3} s"
        ));
        self.broker.kill9()?;
        let ready = self.restart_and_check(pause)?;
        println!(
            "fjord chaos: cycle {cycle}/{}: {load} ms of load, SIGKILL, restart after {pause} ms{}, ready in {} ms",
            self.args.cycles,
            if long_outage { " (long outage)" } else { "" },
            ready.as_millis()
        );
        self.cycles.push(CycleRecord {
            cycle,
            load_ms: load,
            killed_at_s,
            restart_pause_ms: pause,
            long_outage,
            restart_ready_ms: ready.as_millis() as u64,
            deletes,
        });
        Ok(())
    }

    /// Restarts the broker after `pause_ms` and checks the group's offsets
    /// and the log starts against what was acknowledged before.
    fn restart_and_check(&mut self, pause_ms: u64) -> Result<Duration, ChaosError> {
        std::thread::sleep(Duration::from_millis(pause_ms));
        let ready = self.broker.restart()?;
        self.shared
            .generation
            .store(self.broker.starts, Ordering::Relaxed);
        self.broker.mark(&format!(
            "ready, broker generation {}, in {} ms",
            self.broker.starts,
            ready.as_millis()
        ));
        self.check_offsets();
        self.check_log_starts();
        Ok(ready)
    }

    fn check_offsets(&mut self) {
        if self.args.group_consumers == 0 {
            return;
        }
        let before = lock(&self.shared.group).acked_max();
        if before.is_empty() {
            return;
        }
        let fetched = readback::committed_offsets(
            &self.broker.bootstrap(),
            clients::GROUP_ID,
            self.args.partitions,
            Duration::from_millis(CHECK_TIMEOUT_MS),
        );
        match fetched {
            Ok(f) => {
                for (&partition, &acked_max_before) in &before {
                    self.history.offset_checks.push(OffsetCheck {
                        generation: self.generation(),
                        partition,
                        fetched: f.get(&partition).copied().flatten(),
                        acked_max_before,
                    });
                }
            }
            Err(e) => {
                let what = format!("OffsetFetch after broker start {}: {e}", self.generation());
                self.shared.log.line("orchestrator", &what);
            }
        }
    }

    fn check_log_starts(&mut self) {
        let mut before: BTreeMap<i32, i64> = BTreeMap::new();
        for d in &self.history.deletes {
            let e = before.entry(d.partition).or_insert(d.log_start);
            *e = (*e).max(d.log_start);
        }
        if before.is_empty() {
            return;
        }
        let tps: Vec<Tp> = before
            .keys()
            .map(|&partition| Tp {
                topic: ChaosTopic::Retained,
                partition,
            })
            .collect();
        match readback::watermarks(
            &self.broker.bootstrap(),
            Isolation::ReadUncommitted,
            &tps,
            Duration::from_millis(CHECK_TIMEOUT_MS),
        ) {
            Ok(m) => {
                for (tp, (log_start, _)) in m {
                    self.history.log_start_checks.push(LogStartCheck {
                        generation: self.generation(),
                        partition: tp.partition,
                        log_start,
                        acked_max_before: before[&tp.partition],
                    });
                }
            }
            Err(e) => self
                .shared
                .log
                .line("orchestrator", &format!("log starts after a restart: {e}")),
        }
    }

    /// Stops the load, restarts cleanly, reads everything back and checks.
    fn finish(&mut self) -> Result<(check::Analysis, String), ChaosError> {
        println!("fjord chaos: stopping the load");
        self.shared.stop.store(true, Ordering::Relaxed);
        let deadline = Instant::now() + Duration::from_millis(JOIN_TIMEOUT_MS);
        while self.threads.iter().any(|(_, h)| !h.is_finished()) {
            if Instant::now() >= deadline {
                let stuck: Vec<&str> = self
                    .threads
                    .iter()
                    .filter(|(_, h)| !h.is_finished())
                    .map(|(n, _)| n.as_str())
                    .collect();
                return Err(ChaosError::Thread(format!(
                    "{stuck:?} did not finish within {JOIN_TIMEOUT_MS} ms of the stop"
                )));
            }
            std::thread::sleep(Duration::from_millis(WATCH_INTERVAL_MS));
        }
        for (name, h) in self.threads.drain(..) {
            match h.join() {
                Ok(Ok(ThreadOutput::Producer(p))) => {
                    self.history.messages.extend(p.messages);
                    self.history.txns.extend(p.txns);
                }
                Ok(Ok(ThreadOutput::Consumer)) => {}
                Ok(Err(e)) => return Err(ChaosError::Thread(format!("{name}: {e}"))),
                Err(_) => return Err(ChaosError::Thread(format!("{name} panicked"))),
            }
        }
        self.history.group = lock(&self.shared.group).clone();
        self.history.events = lock(&self.shared.events).clone();

        println!("fjord chaos: clean stop and restart");
        self.broker.mark("clean stop (SIGTERM)");
        if let Err(e) = self.broker.stop() {
            self.run_errors.push(e.to_string());
            eprintln!("fjord chaos: {e}");
            if self.broker.is_running() {
                self.broker.kill9()?;
            }
        }
        self.restart_and_check(0)?;

        let bootstrap = self.broker.bootstrap();
        let lso_wait = Duration::from_millis(
            clients::TXN_TIMEOUT_MS
                + crate::txn::ABORT_TIMED_OUT_CHECK_INTERVAL_MS
                + LSO_WAIT_MARGIN_MS,
        );
        println!(
            "fjord chaos: waiting for every LSO to reach its high watermark (at most {} s)",
            lso_wait.as_secs()
        );
        let lso = readback::wait_lso(&bootstrap, &self.all_tps(), lso_wait)?;
        println!("fjord chaos: reading every partition back");
        let mut reads = check::Reads {
            lso,
            ..check::Reads::default()
        };
        for s in self.topic_specs() {
            reads.uncommitted.extend(readback::read_topic(
                &bootstrap,
                s.topic,
                s.partitions,
                Isolation::ReadUncommitted,
            )?);
            reads.committed.extend(readback::read_topic(
                &bootstrap,
                s.topic,
                s.partitions,
                Isolation::ReadCommitted,
            )?);
        }
        let analysis = check::analyze(&self.history, &self.producer_names(), &reads);
        self.broker.mark("final stop");
        if let Err(e) = self.broker.stop() {
            self.run_errors.push(e.to_string());
        }
        let report = summary::Report {
            args: &self.args,
            seed: self.seed,
            duration_s: self.started.elapsed().as_secs_f64(),
            cycles: &self.cycles,
            analysis: &analysis,
            lso: &reads.lso,
            history: &self.history,
            run_errors: &self.run_errors,
            topics: &self.topic_specs(),
        };
        report.print();
        let json = report.json();
        let path = match &self.args.out {
            Some(p) => {
                let text = serde_json::to_string_pretty(&json).unwrap_or_default();
                std::fs::write(p, text).map_err(|source| ChaosError::Io {
                    what: format!("writing {}", p.display()),
                    source,
                })?;
                println!("fjord chaos: result written to {}", p.display());
                p.display().to_string()
            }
            None => "the table above".to_string(),
        };
        Ok((analysis, path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_seeds_differ_and_repeat() {
        assert_eq!(derive_seed(1, 0), derive_seed(1, 0));
        assert_ne!(derive_seed(1, 0), derive_seed(1, 1));
        assert_ne!(derive_seed(1, 0), derive_seed(2, 0));
    }
}
