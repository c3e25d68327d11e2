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
//! # Several nodes (`--nodes N`)
//!
//! With N > 1 the run is the same workload against a cluster ([`cluster`]):
//!
//! - N `fjord serve` nodes (`--broker-cores` shards each), all voters of
//!   one metadata quorum, with `--broker-session-timeout-ms` (3 s) and
//!   `--replica-lag-time-max-ms` (2 s) short, so that a dead node is fenced
//!   and a dead follower leaves the ISR within seconds. On loopback each
//!   node has its own client ports and controller port; with `--netns`
//!   (root) each runs in its own network namespace on a bridge the run makes
//!   ([`netns`], the same code the several-node tests use), and everything
//!   is removed at the end, after an error too. Clients run in the root
//!   namespace and bootstrap at every node; the orchestrator's checks ask
//!   any live node.
//! - The workload topics have replication factor N (`--replication-factor`)
//!   and `min.insync.replicas` from `--min-insync-replicas` (2); the
//!   internal topics have N replicas too (coordinator failover).
//! - Each cycle applies one fault, in an order the seed shuffles and then
//!   repeats: SIGKILL the leader of a random workload partition (found with
//!   Metadata), SIGKILL one of its followers, or (with `--netns`) cut that
//!   leader off the network (its link down at both ends: a zombie leader).
//!   Odd cycles and every cut last past the session timeout (the node is
//!   fenced and leaders move), even cycles are short restarts; every
//!   `--long-outage-every`th cycle is a long outage. When replication
//!   factor minus `min.insync.replicas` is 2 or more, half the cycles also
//!   SIGKILL a second node; never more nodes than that are down at once,
//!   and after each repair the run waits (bounded) until every ISR is whole
//!   again, so that `acks=all` writes can always be acknowledged. After
//!   each restart the group's offsets and the log starts are checked as
//!   with one broker.
//! - At the end every cut is healed, every node stopped with SIGTERM (each
//!   must exit 0) and started again; the run waits until every partition
//!   has a leader and a whole ISR and every LSO reaches its high watermark,
//!   and reads everything back through the leaders. The summary and the
//!   JSON count, per node, kills as leader and as follower, cuts and
//!   restarts, and give each cycle's fault, target and partition.
//! - An ISR monitor thread polls Metadata every 200 ms and keeps, per
//!   partition, the stretches of polls with the same leader and ISR
//!   (`isrSpans` in the JSON). With `--min-insync-replicas 1` an
//!   acknowledged write that is missing is counted apart, as allowed by
//!   that setting (Kafka documents the loss: an `acks=all` write
//!   acknowledged by a leader alone in its ISR, then that leader's copy
//!   lost), only when the monitor saw the ISR at the leader alone from a
//!   poll before the acknowledgement to one at most 100 ms before it came;
//!   every other missing write is a `lost-write`. That is evidence, not a
//!   proof: the ISR can change and change back between two polls, and a
//!   node's Metadata can lag the controller's.
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
//!   ready`), clock jumps, power loss of several nodes at once, slow or
//!   lossy links (only whole cuts), partitions that split the nodes among
//!   themselves (a cut isolates one node from everyone), and a second fault
//!   while an ISR is still short (the run waits for whole ISRs between
//!   cycles, at most 30 s).
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
//! - Idempotent producers with more than one request in flight. librdkafka
//!   also bumps its epoch when a request behind a refused one fails with
//!   OUT_OF_ORDER_SEQUENCE_NUMBER (the refused one, e.g.
//!   NOT_LEADER_OR_FOLLOWER from a new leader, was not written, so every
//!   broker answers the next one so), and then re-sends from sequence 0
//!   the messages still queued on every partition, those of requests lost
//!   with a killed leader and stored by the new one included
//!   (confluentinc/librdkafka#4953). The idempotent producers therefore
//!   keep one request in flight (`--idempotent-max-in-flight`, 1); more
//!   reproduces those duplicates (seed 45114587 found one,
//!   docs/replication.md §8.1).

pub mod broker;
pub mod check;
pub mod clients;
pub mod cluster;
pub mod history;
pub mod netns;
pub mod readback;
pub mod summary;
pub mod value;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rdkafka::error::KafkaError;

use clients::{lock, ClientLog, ClientSettings, GroupJob, ProducerJob, ProducerOutput, Shared};
use cluster::{NodeSetup, Nodes};
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
/// A cluster cycle's outage past the session timeout lasts the timeout
/// plus this many milliseconds.
pub const CLUSTER_OUTAGE_PAST_SESSION_MS: std::ops::RangeInclusive<u64> = 500..=2_500;
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
    /// `max.in.flight.requests.per.connection` of the idempotent producers
    /// (1..=5). Above 1, librdkafka re-sends stored messages under a
    /// bumped epoch after a refused request (see the module doc).
    #[arg(long, default_value_t = clients::IDEM_MAX_IN_FLIGHT)]
    pub idempotent_max_in_flight: u32,
    /// librdkafka debug contexts for every client (e.g. `eos,msg`), logged to clients.log.
    #[arg(long)]
    pub client_debug: Option<String>,
    /// Nodes: 1 is a single broker (every cycle kills it); with more, a
    /// cluster of voters of one metadata quorum whose cycles kill a
    /// partition's leader or a follower, or cut a node off (`--netns`).
    #[arg(long, default_value_t = 1)]
    pub nodes: usize,
    /// Run each node in its own network namespace (needs root), on a bridge
    /// made by the run; cutting a node off the network becomes a fault.
    #[arg(long)]
    pub netns: bool,
    /// Replication factor of the workload topics [default: --nodes].
    #[arg(long)]
    pub replication_factor: Option<i32>,
    /// `min.insync.replicas` of the workload topics (several nodes). At most
    /// replication factor minus this many nodes are down or cut at once.
    #[arg(long, default_value_t = 2)]
    pub min_insync_replicas: i32,
    /// `--broker-session-timeout-ms` of every node (several nodes).
    #[arg(long, default_value_t = 3_000)]
    pub broker_session_timeout_ms: u64,
    /// `--replica-lag-time-max-ms` of every node (several nodes): a dead
    /// follower leaves the ISR after this long.
    #[arg(long, default_value_t = 2_000)]
    pub replica_lag_time_max_ms: u64,
    /// Share of cycles with a DeleteRecords on the retained topic (0 turns
    /// DeleteRecords and the log start checks off).
    #[arg(long, default_value_t = DELETE_RECORDS_SHARE)]
    pub delete_records_share: f64,
}

impl ChaosArgs {
    /// Replicas of each workload partition.
    pub fn replication_factor(&self) -> i32 {
        self.replication_factor.unwrap_or(self.nodes as i32)
    }

    /// Nodes that may be down or cut at once in a cluster run.
    pub fn faults_at_once(&self) -> usize {
        (self.replication_factor() - self.min_insync_replicas).max(0) as usize
    }
}

/// What a cycle of a cluster run does to its node(s).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Fault {
    /// SIGKILL of the single broker.
    Kill,
    /// SIGKILL of the leader of the cycle's partition.
    KillLeader,
    /// SIGKILL of a follower of the cycle's partition.
    KillFollower,
    /// The leader of the cycle's partition cut off the network (`--netns`).
    CutLeader,
}

impl Fault {
    pub fn name(self) -> &'static str {
        match self {
            Fault::Kill => "kill -9",
            Fault::KillLeader => "kill -9 the leader",
            Fault::KillFollower => "kill -9 a follower",
            Fault::CutLeader => "cut the leader off",
        }
    }
}

/// One kill and restart (or cut and heal).
#[derive(Clone, Debug, serde::Serialize)]
pub struct CycleRecord {
    pub cycle: u32,
    pub load_ms: u64,
    /// Seconds since the run started.
    pub killed_at_s: f64,
    pub restart_pause_ms: u64,
    pub long_outage: bool,
    /// The slowest restart of the cycle (0 for a cut only).
    pub restart_ready_ms: u64,
    pub deletes: usize,
    pub fault: Fault,
    /// The nodes taken down or cut (the first is the fault's target; a
    /// second one is killed too when more may be down at once).
    pub nodes: Vec<usize>,
    /// The partition whose leader or follower was chosen, and its leader's
    /// node as Metadata said (None: no leader known; a node was drawn).
    pub partition: Option<String>,
    pub leader_node: Option<usize>,
    /// The outage outlasted `--broker-session-timeout-ms` (leaders move).
    pub past_session_timeout: bool,
    /// How long after the repair every ISR was whole again (None: not
    /// within the wait).
    pub isr_full_after_ms: Option<u64>,
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
    if !(0.0..=1.0).contains(&args.delete_records_share) {
        return bad("--delete-records-share must be within 0..1");
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
    if !(1..=5).contains(&args.idempotent_max_in_flight) {
        // librdkafka's idempotent producer takes at most 5.
        return bad("--idempotent-max-in-flight must be within 1..=5");
    }
    if args.idempotent_max_in_flight > 1 {
        eprintln!(
            "fjord chaos: warning: --idempotent-max-in-flight {} is above 1: librdkafka may then store messages twice by itself after a leader change",
            args.idempotent_max_in_flight
        );
    }
    if args.broker_cores > 999 {
        return bad("--broker-cores must be below 1000");
    }
    if args.partitions < 1 || args.broker_cores < 1 || args.cycle_ms < 2 {
        return bad("--partitions, --broker-cores and --cycle-ms must be positive");
    }
    if args.nodes < 1 || args.nodes > netns::HOSTS_MAX {
        return bad("--nodes must be within 1..=200");
    }
    if args.nodes > 1 {
        let rf = args.replication_factor();
        if rf < 1 || rf as usize > args.nodes {
            return bad("--replication-factor must be within 1..=--nodes");
        }
        if args.min_insync_replicas < 1 || args.min_insync_replicas > rf {
            return bad("--min-insync-replicas must be within 1..=the replication factor");
        }
        if args.faults_at_once() == 0 {
            return bad("the replication factor must exceed --min-insync-replicas: no node could be taken down without stopping acks=all writes");
        }
        if args.broker_session_timeout_ms < 100 || args.replica_lag_time_max_ms < 100 {
            return bad(
                "--broker-session-timeout-ms and --replica-lag-time-max-ms must be at least 100",
            );
        }
    }
    Ok(())
}

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
    println!(
        "fjord chaos: run directory {} ({} cycles of ~{} ms, {}{})",
        dir.display(),
        args.cycles,
        args.cycle_ms,
        if args.fsync_acks {
            "--fsync-acks"
        } else {
            "default durability"
        },
        if args.nodes > 1 {
            format!(
                ", {} nodes{}, replication factor {}, min.insync.replicas {}",
                args.nodes,
                if args.netns {
                    " in network namespaces"
                } else {
                    " on loopback"
                },
                args.replication_factor(),
                args.min_insync_replicas
            )
        } else {
            String::new()
        }
    );
    let shared = Arc::new(Shared {
        stop: AtomicBool::new(false),
        generation: AtomicU32::new(0),
        log: ClientLog::open(&dir.join("clients.log"), started)?,
        group: Mutex::new(Default::default()),
        events: Mutex::new(Vec::new()),
    });
    let nodes = Nodes::start(NodeSetup {
        args: &args,
        bin: &bin,
        dir: &dir,
    })?;
    shared
        .generation
        .store(nodes.generation(), Ordering::Relaxed);
    nodes.mark(&format!("started (seed {seed})"));
    let mut rng = StdRng::seed_from_u64(derive_seed(seed, u64::MAX - 1));
    let mut faults = vec![Fault::KillLeader, Fault::KillFollower];
    if args.netns {
        faults.push(Fault::CutLeader);
    }
    rand::seq::SliceRandom::shuffle(faults.as_mut_slice(), &mut rng);
    let mut r = Run {
        args,
        seed,
        rng,
        nodes,
        faults,
        down: BTreeSet::new(),
        shared,
        started,
        history: History::default(),
        cycles: Vec::new(),
        run_errors: Vec::new(),
        threads: Vec::new(),
        isr_monitor: None,
    };
    let outcome = r.execute();
    let failed = !matches!(&outcome, Ok((a, _)) if a.total() == 0 && r.run_errors.is_empty());
    // Whatever happened, no node stays behind and no namespace, bridge or
    // cut link either: heal, stop, then drop (kills what still runs, then
    // removes the network).
    r.shared.stop.store(true, Ordering::Relaxed);
    let _ = r.nodes.heal_all();
    for b in &r.nodes.nodes {
        b.term();
    }
    for b in &mut r.nodes.nodes {
        if b.is_running() {
            let _ = b.wait_stopped();
        }
    }
    if let Some(h) = r.isr_monitor.take() {
        let _ = h.join();
    }
    drop(r.nodes);
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
    nodes: Nodes,
    /// The cluster faults, in the order the cycles take them (shuffled by
    /// the seed, then repeated).
    faults: Vec<Fault>,
    /// Nodes killed and not yet restarted.
    down: BTreeSet<usize>,
    shared: Arc<Shared>,
    started: Instant,
    history: History,
    cycles: Vec<CycleRecord>,
    /// Things that went wrong without being anomalies of the data (a broker
    /// that exited by itself, a failed clean stop): they fail the run too.
    run_errors: Vec<String>,
    threads: Vec<ClientThread>,
    isr_monitor: Option<JoinHandle<BTreeMap<Tp, Vec<history::IsrSpan>>>>,
}

impl Run {
    fn cluster(&self) -> bool {
        self.nodes.len() > 1
    }

    fn settings(&self) -> ClientSettings {
        ClientSettings {
            bootstrap: self.nodes.bootstrap(),
            idem_partitions: self.args.partitions,
            retained_partitions: RETAINED_PARTITIONS,
            txn_partitions: TXN_PARTITIONS,
            idem_rate: self.args.rate,
            value_max_bytes: self.args.value_max_bytes,
            abort_fraction: self.args.abort_fraction,
            idem_message_timeout_ms: self.args.idempotent_message_timeout_ms,
            idem_max_in_flight: self.args.idempotent_max_in_flight,
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
        let mut common = vec![seg];
        if self.cluster() {
            common.push((
                "min.insync.replicas",
                self.args.min_insync_replicas.to_string(),
            ));
        }
        let with = |extra: Vec<(&'static str, String)>| {
            let mut c = common.clone();
            c.extend(extra);
            c
        };
        vec![
            TopicSpec {
                topic: ChaosTopic::Idem,
                partitions: self.args.partitions,
                configs: with(vec![]),
            },
            TopicSpec {
                topic: ChaosTopic::Retained,
                partitions: RETAINED_PARTITIONS,
                configs: with(vec![("retention.bytes", RETENTION_BYTES.to_string())]),
            },
            TopicSpec {
                topic: ChaosTopic::TxnA,
                partitions: TXN_PARTITIONS,
                configs: with(vec![]),
            },
            TopicSpec {
                topic: ChaosTopic::TxnB,
                partitions: TXN_PARTITIONS,
                configs: with(vec![]),
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
        self.nodes.generation()
    }

    /// The whole run after the nodes' first start; returns the analysis
    /// and where the report went.
    fn execute(&mut self) -> Result<(check::Analysis, String), ChaosError> {
        let rf = if self.cluster() {
            self.args.replication_factor()
        } else {
            1
        };
        readback::create_topics(&self.nodes.bootstrap(), &self.topic_specs(), rf)?;
        if self.cluster() {
            // Every replica in the ISR before the first fault.
            let tps = self.all_tps();
            if self
                .nodes
                .wait_isr_full(&tps, Duration::from_millis(cluster::ISR_FULL_TIMEOUT_MS))
                .is_none()
            {
                return Err(ChaosError::Broker(format!(
                    "the workload partitions' ISRs were not whole within {} ms of their creation",
                    cluster::ISR_FULL_TIMEOUT_MS
                )));
            }
            self.isr_monitor = Some(cluster::spawn_isr_monitor(
                self.nodes.bootstrap(),
                self.shared.clone(),
            )?);
        }
        self.spawn_clients()?;
        for cycle in 1..=self.args.cycles {
            if self.cluster() {
                self.cluster_cycle(cycle)?;
            } else {
                self.cycle(cycle)?;
            }
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
    /// a client thread that ends early ends the run, a node that exits by
    /// itself (not one the run killed) is a run error (and is restarted).
    /// Returns the deletes made.
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
            for i in 0..self.nodes.len() {
                if self.down.contains(&i) || self.nodes.nodes[i].is_running() {
                    continue;
                }
                let what = format!(
                    "{} exited by itself during the load of generation {}",
                    if self.cluster() {
                        format!("node {i}")
                    } else {
                        "the broker".to_string()
                    },
                    self.generation()
                );
                eprintln!("fjord chaos: {what}");
                self.run_errors.push(what);
                self.nodes.stats[i].exits_unasked += 1;
                self.nodes.nodes[i].kill9()?;
                if self.cluster() {
                    self.nodes.nodes[i].restart()?;
                    self.nodes.stats[i].restarts += 1;
                    self.after_restart(i, Duration::ZERO);
                } else {
                    self.restart_and_check(0)?;
                }
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
        let bootstrap = self.nodes.bootstrap();
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
                self.nodes.mark(&format!(
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

    /// A cycle's load time (around `--cycle-ms`) and, in a share of the
    /// cycles, when in it a DeleteRecords is made.
    fn draw_load(&mut self) -> (u64, Option<u64>) {
        let cms = self.args.cycle_ms;
        let load = self.rng.random_range(cms / 2..=cms + cms / 2);
        let delete_at = self
            .rng
            .random_bool(self.args.delete_records_share)
            .then(|| self.rng.random_range(0..load));
        (load, delete_at)
    }

    /// A cycle of the single broker: load, SIGKILL, pause, restart, checks.
    fn cycle(&mut self, cycle: u32) -> Result<(), ChaosError> {
        let (load, delete_at) = self.draw_load();
        let pause = self.rng.random_range(0..=self.args.restart_pause_ms_max);
        let every = self.args.long_outage_every;
        let long_outage = every > 0 && cycle % every == 0;
        let pause = if long_outage { LONG_OUTAGE_MS } else { pause };
        let deletes = self.watch(load, delete_at)?;
        let killed_at_s = self.started.elapsed().as_secs_f64();
        self.nodes.mark(&format!(
            "SIGKILL, cycle {cycle}, after {load} ms of load, at {killed_at_s:.3} s"
        ));
        self.nodes.nodes[0].kill9()?;
        self.nodes.stats[0].kills_other += 1;
        let ready = self.restart_and_check(pause)?;
        self.nodes.stats[0].restarts += 1;
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
            fault: Fault::Kill,
            nodes: vec![0],
            partition: None,
            leader_node: None,
            past_session_timeout: false,
            isr_full_after_ms: None,
        });
        Ok(())
    }

    /// A cycle of a cluster: load; then the cycle's fault on the leader or
    /// a follower of a random workload partition (and, when more nodes may
    /// be down at once, half the time a SIGKILL of a second node); an
    /// outage short, past the session timeout (every other cycle and every
    /// cut, so that leaders move) or long (`--long-outage-every`); restart
    /// and heal; the
    /// checks; and a bounded wait until every ISR is whole again.
    fn cluster_cycle(&mut self, cycle: u32) -> Result<(), ChaosError> {
        let (load, delete_at) = self.draw_load();
        let fault = self.faults[(cycle as usize - 1) % self.faults.len()];
        let every = self.args.long_outage_every;
        let long_outage = every > 0 && cycle % every == 0;
        let session = self.args.broker_session_timeout_ms;
        let pause = if long_outage {
            LONG_OUTAGE_MS.max(session * 2)
        } else if cycle % 2 == 1 || fault == Fault::CutLeader {
            session + self.rng.random_range(CLUSTER_OUTAGE_PAST_SESSION_MS)
        } else {
            self.rng.random_range(0..=self.args.restart_pause_ms_max)
        };
        let tps = self.all_tps();
        let tp = tps[self.rng.random_range(0..tps.len())];
        let second_draw = self.rng.random_bool(0.5);
        let node_draw = self.rng.random_range(0..self.nodes.len());
        let deletes = self.watch(load, delete_at)?;

        // The target: from Metadata right now.
        let state = self
            .nodes
            .partition_states(&[])
            .ok()
            .and_then(|m| m.get(&tp).cloned());
        let leader_node = state
            .as_ref()
            .filter(|s| s.leader >= 0)
            .map(|s| cluster::node_of(s.leader));
        let n = self.nodes.len();
        let target = match (fault, &state, leader_node) {
            (Fault::KillFollower, Some(s), Some(l)) => {
                let followers: Vec<usize> = s
                    .replicas
                    .iter()
                    .map(|&r| cluster::node_of(r))
                    .filter(|&f| f != l && f < n)
                    .collect();
                if followers.is_empty() {
                    node_draw
                } else {
                    followers[node_draw % followers.len()]
                }
            }
            (_, _, Some(l)) if l < n => l,
            _ => node_draw,
        };
        let mut targets = vec![target];
        if self.args.faults_at_once() >= 2 && second_draw {
            targets.push((target + 1 + node_draw % (n - 1)) % n);
        }
        let killed_at_s = self.started.elapsed().as_secs_f64();
        self.nodes.mark(&format!(
            "cycle {cycle}: {} (node {target}, {tp} led by {leader_node:?}){}, after {load} ms of load, at {killed_at_s:.3} s, outage {pause} ms",
            fault.name(),
            if targets.len() > 1 {
                format!(" and SIGKILL of node {}", targets[1])
            } else {
                String::new()
            }
        ));
        for (k, &i) in targets.iter().enumerate() {
            if k == 0 && fault == Fault::CutLeader {
                self.nodes.cut(i)?;
                continue;
            }
            self.nodes.nodes[i].kill9()?;
            self.down.insert(i);
            let st = &mut self.nodes.stats[i];
            match (k, fault) {
                (0, Fault::KillLeader) if leader_node == Some(i) => st.kills_as_leader += 1,
                (0, Fault::KillFollower) if leader_node.is_some() => st.kills_as_follower += 1,
                _ => st.kills_other += 1,
            }
        }
        // The outage, with the load running on.
        self.watch(pause, None)?;
        let mut ready_max = Duration::ZERO;
        for &i in &targets {
            if self.down.remove(&i) {
                let ready = self.nodes.nodes[i].restart()?;
                self.nodes.stats[i].restarts += 1;
                ready_max = ready_max.max(ready);
                self.after_restart(i, ready);
            } else {
                self.nodes.heal(i)?;
                self.nodes.mark(&format!("node {i} healed"));
            }
        }
        self.check_offsets();
        self.check_log_starts();
        let isr_full = self
            .nodes
            .wait_isr_full(&tps, Duration::from_millis(cluster::ISR_FULL_TIMEOUT_MS));
        if isr_full.is_none() {
            self.shared.log.line(
                "orchestrator",
                &format!(
                    "cycle {cycle}: the ISRs were not whole within {} ms",
                    cluster::ISR_FULL_TIMEOUT_MS
                ),
            );
        }
        println!(
            "fjord chaos: cycle {cycle}/{}: {load} ms of load, {} node {target}{} ({tp} led by node {}), back after {pause} ms{}, ISRs whole after {}",
            self.args.cycles,
            fault.name(),
            if targets.len() > 1 {
                format!(" and kill -9 node {}", targets[1])
            } else {
                String::new()
            },
            leader_node.map_or("?".to_string(), |l| l.to_string()),
            if long_outage {
                " (long outage)"
            } else if pause > session {
                " (past the session timeout)"
            } else {
                ""
            },
            isr_full.map_or("(not within the wait)".to_string(), |d| format!(
                "{} ms",
                d.as_millis()
            ))
        );
        self.cycles.push(CycleRecord {
            cycle,
            load_ms: load,
            killed_at_s,
            restart_pause_ms: pause,
            long_outage,
            restart_ready_ms: ready_max.as_millis() as u64,
            deletes,
            fault,
            nodes: targets,
            partition: Some(tp.to_string()),
            leader_node,
            past_session_timeout: pause > session,
            isr_full_after_ms: isr_full.map(|d| d.as_millis() as u64),
        });
        Ok(())
    }

    /// Bookkeeping after node `i` restarted.
    fn after_restart(&mut self, i: usize, ready: Duration) {
        self.shared
            .generation
            .store(self.generation(), Ordering::Relaxed);
        self.nodes.nodes[i].mark(&format!(
            "ready, generation {}, in {} ms",
            self.generation(),
            ready.as_millis()
        ));
    }

    /// Restarts the single broker after `pause_ms` and checks the group's
    /// offsets and the log starts against what was acknowledged before.
    fn restart_and_check(&mut self, pause_ms: u64) -> Result<Duration, ChaosError> {
        std::thread::sleep(Duration::from_millis(pause_ms));
        let ready = self.nodes.nodes[0].restart()?;
        self.after_restart(0, ready);
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
            &self.nodes.bootstrap(),
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
            &self.nodes.bootstrap(),
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

        if let Some(h) = self.isr_monitor.take() {
            self.history.isr = h
                .join()
                .map_err(|_| ChaosError::Thread("the ISR monitor panicked".to_string()))?;
        }
        self.history.min_insync_one = self.cluster() && self.args.min_insync_replicas == 1;

        println!("fjord chaos: clean stop and restart");
        self.nodes.heal_all()?;
        self.nodes.mark("clean stop (SIGTERM)");
        self.stop_all();
        for i in 0..self.nodes.len() {
            if self.nodes.nodes[i].is_running() {
                self.nodes.nodes[i].kill9()?;
            }
            let ready = self.nodes.nodes[i].restart()?;
            self.nodes.stats[i].restarts += 1;
            self.down.remove(&i);
            self.after_restart(i, ready);
        }
        self.check_offsets();
        self.check_log_starts();
        if self.cluster() {
            let tps = self.all_tps();
            match self
                .nodes
                .wait_isr_full(&tps, Duration::from_millis(cluster::ISR_FULL_TIMEOUT_MS))
            {
                Some(d) => println!(
                    "fjord chaos: every partition led, its ISR whole, {} ms after the restart",
                    d.as_millis()
                ),
                None => println!(
                    "fjord chaos: not every ISR was whole {} ms after the restart (reading back anyway)",
                    cluster::ISR_FULL_TIMEOUT_MS
                ),
            }
        }

        let bootstrap = self.nodes.bootstrap();
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
        self.nodes.mark("final stop");
        self.stop_all();
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
            nodes: &self.nodes.stats,
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

    /// SIGTERM to every node at once, then each must exit 0 after `fjord:
    /// stopped`; a failure is a run error.
    fn stop_all(&mut self) {
        for b in &self.nodes.nodes {
            b.term();
        }
        for (i, b) in self.nodes.nodes.iter_mut().enumerate() {
            if let Err(e) = b.wait_stopped() {
                let what = if self.nodes.stats.len() > 1 {
                    format!("node {i}: {e}")
                } else {
                    e.to_string()
                };
                eprintln!("fjord chaos: {what}");
                self.run_errors.push(what);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `fjord chaos` with no flags: its idempotent producers keep one
    /// request in flight and a message timeout above every outage, the two
    /// settings without which librdkafka stores messages twice by itself
    /// (module doc, confluentinc/librdkafka#4953); more in flight is refused
    /// above librdkafka's idempotence limit.
    #[test]
    fn idempotent_producers_cannot_store_twice_by_themselves() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: ChaosArgs,
        }
        let args = <Cli as clap::Parser>::parse_from(["chaos"]).args;
        assert_eq!(args.idempotent_max_in_flight, 1);
        assert!(
            args.idempotent_message_timeout_ms > LONG_OUTAGE_MS + broker::READY_TIMEOUT_MS / 10
        );
        assert!(validate(&args).is_ok());
        let mut six = args.clone();
        six.idempotent_max_in_flight = 6;
        assert!(validate(&six).is_err());
    }

    #[test]
    fn derived_seeds_differ_and_repeat() {
        assert_eq!(derive_seed(1, 0), derive_seed(1, 0));
        assert_ne!(derive_seed(1, 0), derive_seed(1, 1));
        assert_ne!(derive_seed(1, 0), derive_seed(2, 0));
    }
}
