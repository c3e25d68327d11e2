//! Broker configuration: `fjord serve` flags, the optional TOML file with the
//! same keys, and the broker-wide defaults for topic configs.
//!
//! Every flag is optional on the command line so that a value given there
//! overrides the file, and a value in neither takes the default listed here
//! (Kafka's default where Kafka has the setting). The resolved, immutable
//! [`BrokerConfig`] is copied to every shard at start-up.

use crate::log::CatchUpReads;
use serde::Deserialize;
use std::net::IpAddr;
use std::path::PathBuf;

/// Kafka's `message.max.bytes` default: 1 MiB plus the record-batch overhead.
pub const MESSAGE_MAX_BYTES_DEFAULT: i32 = 1024 * 1024 + 12;
/// Kafka's `log.segment.bytes` default (1 GiB).
pub const LOG_SEGMENT_BYTES_DEFAULT: i64 = 1 << 30;
/// Kafka's `log.retention.ms` default (7 days).
pub const LOG_RETENTION_MS_DEFAULT: i64 = 7 * 24 * 60 * 60 * 1000;
/// Size of each shard's cache of recently appended batches.
pub const TAIL_CACHE_BYTES_DEFAULT: usize = 64 * 1024 * 1024;
/// glommio's registered I/O memory per shard when memlock allows it.
/// Where the metrics endpoint listens by default: loopback only, since it
/// has no authentication (Redpanda's admin port is 9644 too).
pub const METRICS_LISTEN_DEFAULT: &str = "127.0.0.1:9644";
pub const IO_MEMORY_BYTES_MAX: usize = 8 * 1024 * 1024;
/// Kafka's `producer.id.expiration.ms` default: one day.
pub const PRODUCER_ID_EXPIRATION_MS_DEFAULT: i64 = 24 * 60 * 60 * 1000;
/// Producers tracked per partition before the least recently used is evicted.
pub const PRODUCERS_PER_PARTITION_MAX_DEFAULT: usize = 10_000;
/// Kafka's `group.initial.rebalance.delay.ms` default.
pub const GROUP_INITIAL_REBALANCE_DELAY_MS_DEFAULT: i64 = 3_000;
/// Kafka's `offsets.retention.minutes` default (7 days).
pub const OFFSETS_RETENTION_MINUTES_DEFAULT: i64 = 7 * 24 * 60;
/// Kafka's `log.cleaner.delete.retention.ms` default (1 day).
pub const LOG_CLEANER_DELETE_RETENTION_MS_DEFAULT: i64 = 24 * 60 * 60 * 1000;
/// Kafka's `log.cleaner.min.compaction.lag.ms` default.
pub const LOG_CLEANER_MIN_COMPACTION_LAG_MS_DEFAULT: i64 = 0;
/// Kafka's `log.cleaner.max.compaction.lag.ms` default (Long.MAX_VALUE).
pub const LOG_CLEANER_MAX_COMPACTION_LAG_MS_DEFAULT: i64 = i64::MAX;
/// Kafka's `log.cleaner.min.cleanable.ratio` default.
pub const LOG_CLEANER_MIN_CLEANABLE_RATIO_DEFAULT: f64 = 0.5;
/// Kafka's lower bound for `segment.bytes` (1 MiB since Kafka 4.0).
pub const SEGMENT_BYTES_MIN: i64 = 1024 * 1024;
/// Kafka's `offsets.topic.segment.bytes` and
/// `transaction.state.log.segment.bytes` defaults (100 MiB).
pub const INTERNAL_TOPIC_SEGMENT_BYTES_DEFAULT: u64 = 100 * 1024 * 1024;
/// Kafka's `offsets.topic.replication.factor` and
/// `transaction.state.log.replication.factor` defaults (several nodes only).
pub const INTERNAL_REPLICATION_FACTOR_DEFAULT: i16 = 3;
/// Kafka's `log.cleaner.backoff.ms` default: how long the cleaner sleeps
/// when no log needs cleaning.
pub const LOG_CLEANER_BACKOFF_MS_DEFAULT: u64 = 15_000;
/// Most `--log-cleaner-threads` taken (more are clamped to it).
pub const LOG_CLEANER_THREADS_MAX: usize = 64;
/// Kafka's `log.cleaner.dedupe.buffer.size` default (128 MiB): the memory
/// of the cleaner's key → offset map.
pub const LOG_CLEANER_DEDUPE_BUFFER_SIZE_DEFAULT: usize = 128 << 20;
/// Requests read from one connection before the first is answered.
pub const INFLIGHT_REQUESTS_MAX_DEFAULT: usize = 64;

/// Connections one shard serves at once (Kafka's `max.connections` is per broker, unbounded by default).
pub const MAX_CONNECTIONS_PER_SHARD_DEFAULT: usize = 10_000;
/// Kafka's `connections.max.idle.ms` default (10 minutes).
pub const CONNECTIONS_MAX_IDLE_MS_DEFAULT: u64 = 10 * 60 * 1000;
/// Bytes of requests a shard holds read but unanswered (Kafka's `queued.max.request.bytes` is unbounded by default).
pub const QUEUED_MAX_REQUEST_BYTES_DEFAULT: usize = 256 << 20;
/// Bytes of requests one connection holds read but unanswered.
pub const CONNECTION_QUEUED_MAX_REQUEST_BYTES_DEFAULT: usize = 64 << 20;
/// Bytes a shard holds appended but not yet written.
pub const STAGED_BYTES_MAX_DEFAULT: usize = 256 << 20;
/// Largest a batch may decompress to.
pub const BATCH_DECOMPRESSED_BYTES_MAX_DEFAULT: usize = 64 << 20;
/// Partitions one CreateTopics/CreatePartitions request may create.
pub const CREATE_TOPICS_PARTITIONS_MAX_DEFAULT: i64 = 10_000;
/// Partitions the broker holds in all.
pub const PARTITIONS_MAX_DEFAULT: i64 = 100_000;
/// Members of one group (Kafka's `group.max.size` is unbounded by default).
pub const GROUP_MAX_SIZE_DEFAULT: usize = 10_000;
/// Kafka's `group.consumer.session.timeout.ms` default.
pub const GROUP_CONSUMER_SESSION_TIMEOUT_MS_DEFAULT: i32 = 45_000;
/// Kafka's `group.consumer.heartbeat.interval.ms` default.
pub const GROUP_CONSUMER_HEARTBEAT_INTERVAL_MS_DEFAULT: i32 = 5_000;
/// Kafka's `max.incremental.fetch.session.cache.slots` default: fetch
/// sessions one shard keeps (each shard is its own broker).
pub const FETCH_SESSION_CACHE_SLOTS_DEFAULT: usize = 1000;
/// Kafka's `transactional.id.expiration.ms` default (7 days).
pub const TRANSACTIONAL_ID_EXPIRATION_MS_DEFAULT: i64 = 7 * 24 * 60 * 60 * 1000;
/// Longest a shard waits for another shard's answer (Kafka's
/// `request.timeout.ms` default, which bounds a broker's wait for its
/// controller too).
pub const CROSS_SHARD_TIMEOUT_MS_DEFAULT: u64 = 30_000;
/// Kafka's `broker.session.timeout.ms` default.
pub const BROKER_SESSION_TIMEOUT_MS_DEFAULT: u64 = 9_000;
/// Kafka's `replica.lag.time.max.ms` default.
pub const REPLICA_LAG_TIME_MAX_MS_DEFAULT: u64 = 30_000;
/// Kafka's `broker.heartbeat.interval.ms` default; a node heartbeats at
/// most a quarter of the session timeout apart (see
/// [`BrokerConfig::broker_heartbeat_interval`]).
pub const BROKER_HEARTBEAT_INTERVAL_MS: u64 = 2_000;
/// How fetches read data older than the tail cache: direct reads. Why not
/// sendfile (`tuning/results/catch-up-reads.md`, 2-vCPU VM, 1 KiB backlog
/// drained by one librdkafka consumer): the pages a sendfile fills from the
/// disk are fresh pages, and the first CPU touch of such a page (the
/// consumer's receive copy) cost 1.7–2 s/GB there, against 0.30–0.34 s/GB
/// for the broker's copy out of reused O_DIRECT buffers; raw fetches ran at
/// 364–382 MB/s against 240–279, and the drain at 406–449 k msg/s against
/// 188–274 k (before the read-ahead, which only the direct path has, took
/// it to 639–730 k). `sendfile` stays selectable to re-measure that on
/// other machines (bare metal, no free-page reporting) and against Kafka,
/// which serves catch-up reads with sendfile. Against stock Kafka 4.4 on
/// the same VM (`tuning/results/fjord-vs-kafka/2026-12-02-campaign`, a
/// 750k-message backlog at 50k msg/s): with direct reads fjord drained it
/// within the consumer's first 10 s as Kafka did, both at the consumer's
/// ~100k msg/s, at 1/4.2 of Kafka's CPU per GB; with sendfile fjord peaked
/// at 77–80k msg/s and had 275k messages left after those 10 s.
pub const CATCH_UP_READS_DEFAULT: CatchUpReads = CatchUpReads::Direct;
/// How `fjord serve` writes its log (to standard error).
#[derive(clap::ValueEnum, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "kebab-case")]
pub enum LogFormat {
    /// One human-readable line per event (tracing's default format).
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`,
    /// `threadName` (`shard-N-…` on shard N's thread, glommio adding its executor id) and the event's `fields`
    /// (`message` among them), for journald, Loki, Elasticsearch and the like.
    Json,
}

/// Kafka's `ssl.client.auth`: whether a TLS listener asks clients for a
/// certificate.
#[derive(clap::ValueEnum, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "kebab-case")]
pub enum TlsClientAuth {
    /// A client without a valid certificate is refused in the handshake.
    Required,
    /// A certificate is asked for; a client without one is `User:ANONYMOUS`.
    Requested,
    /// No certificate is asked for.
    #[default]
    None,
}

/// The TLS settings of SSL and SASL_SSL listeners (files re-read on
/// SIGHUP; `net::tls` loads them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsSettings {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
    pub client_auth: TlsClientAuth,
}

/// Which authorizer checks requests (Kafka's `authorizer.class.name`).
#[derive(clap::ValueEnum, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "kebab-case")]
pub enum AuthorizerKind {
    /// No authorization: every request is allowed (Kafka with an empty
    /// `authorizer.class.name`); the ACL APIs answer SECURITY_DISABLED.
    #[default]
    None,
    /// ACLs with Kafka's `StandardAuthorizer` semantics (docs/security.md).
    Standard,
}

/// Flags of `fjord serve`. The TOML file named by `--config` takes the same
/// keys, spelled as the long flags (`data-dir = "./data"`).
#[derive(clap::Args, Deserialize, Debug, Clone, Default)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct ServeArgs {
    /// A TOML file with any of these settings; flags given here override it.
    #[arg(long)]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Log format on standard error: `text` or `json` (one object per line)
    /// [default: text]. `RUST_LOG` sets the level (default `info`).
    #[arg(long, value_enum)]
    pub log_format: Option<LogFormat>,
    /// Directory holding all partition logs and the metadata log [default: ./data].
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Port of shard 0 of the PLAINTEXT listener that `--port`/`--listen`
    /// make; shard k listens on port + k [default: 9092].
    #[arg(long)]
    pub port: Option<u16>,
    /// Address of the PLAINTEXT listener that `--port`/`--listen` make
    /// [default: 127.0.0.1 when no `--listener` is given, so that a broker
    /// without authentication is reachable from this machine only].
    #[arg(long)]
    pub listen: Option<IpAddr>,
    /// A listener, Kafka's `listeners` spelling: `PROTOCOL://HOST:PORT`
    /// with PROTOCOL `PLAINTEXT`, `SSL`, `SASL_PLAINTEXT` or `SASL_SSL`
    /// (the TLS ones need `--tls-cert` and `--tls-key`); repeat for several
    /// (a list in the file). Shard k listens on PORT + k of each. An empty
    /// HOST is every interface.
    /// With `--listener`, `--port`/`--listen` add a PLAINTEXT listener only
    /// when given.
    #[arg(long = "listener")]
    pub listener: Option<Vec<String>>,
    /// Host name advertised to clients, for every listener [default: the
    /// listener's address, or the machine's host name when it listens on
    /// all interfaces].
    #[arg(long)]
    pub advertised_host: Option<String>,
    /// Kafka `sasl.enabled.mechanisms`, comma-separated: `PLAIN`,
    /// `SCRAM-SHA-256`, `SCRAM-SHA-512` [default: SCRAM-SHA-256,SCRAM-SHA-512].
    #[arg(long)]
    pub sasl_enabled_mechanisms: Option<String>,
    /// Kafka `connections.max.reauth.ms`: an authenticated SASL session
    /// expires this long after it authenticated; the client must
    /// re-authenticate (KIP-368) or is disconnected. 0: never [default: 0].
    #[arg(long)]
    pub connections_max_reauth_ms: Option<u64>,
    /// The TLS certificate chain of SSL and SASL_SSL listeners (PEM, the
    /// server's certificate first); re-read on SIGHUP.
    #[arg(long)]
    pub tls_cert: Option<PathBuf>,
    /// The private key of `--tls-cert` (PEM: PKCS#8, RSA or SEC1); re-read
    /// on SIGHUP.
    #[arg(long)]
    pub tls_key: Option<PathBuf>,
    /// CA certificates (PEM bundle) that client certificates must chain
    /// to; needed by `--tls-client-auth required|requested`; re-read on
    /// SIGHUP.
    #[arg(long)]
    pub tls_client_ca: Option<PathBuf>,
    /// Kafka `ssl.client.auth`: `required` (a client without a certificate
    /// signed by `--tls-client-ca` is refused), `requested` (asked for, not
    /// required) or `none`. On SSL the principal is the certificate's
    /// subject, `User:CN=...` [default: none].
    #[arg(long, value_enum)]
    pub tls_client_auth: Option<TlsClientAuth>,
    /// Number of shards (one per core) [default: all online cores].
    #[arg(long)]
    pub cores: Option<usize>,
    /// This server's node id; shard k is advertised as node_id * 1000 + k [default: 0].
    #[arg(long)]
    pub node_id: Option<i32>,
    /// Kafka `controller.quorum.voters`: the metadata quorum's voters as
    /// `ID@HOST:PORT,...`, each node's controller address (Raft traffic and
    /// forwarding). Without it the node is a quorum of one. Several voters
    /// run one metadata log; a write at any node is forwarded to its
    /// leader, nodes register and are fenced when their heartbeats stop,
    /// and a topic's partitions live on the node that led when it was
    /// created (no replication yet); a learner is refused at start
    /// (docs/replication.md §3.2) [default: none].
    #[arg(long)]
    pub controller_quorum: Option<String>,
    /// Kafka `broker.session.timeout.ms` (several nodes): a node whose
    /// heartbeats stop reaching the quorum's leader for this long is fenced,
    /// its brokers leave Metadata and DescribeCluster and its partitions go
    /// offline until it heartbeats again; nodes heartbeat every 2 s
    /// (`broker.heartbeat.interval.ms`), or a quarter of this if less
    /// [default: 9000].
    #[arg(long)]
    pub broker_session_timeout_ms: Option<u64>,
    /// Kafka `replica.lag.time.max.ms` (replicated partitions): a follower
    /// that has not caught up to its leader's log end for this long leaves
    /// the ISR (through the controller), so acks=all stops waiting for it;
    /// it rejoins once it holds the high watermark [default: 30000].
    #[arg(long)]
    pub replica_lag_time_max_ms: Option<u64>,
    /// The controller address this node listens on, HOST:PORT: required for
    /// a node outside `--controller-quorum` (a learner); a voter listens on
    /// its own entry and may repeat it here [default: its quorum entry].
    #[arg(long)]
    pub controller_listen: Option<String>,
    /// Answer acks=all only after an fdatasync covering the batch (group commit).
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub fsync_acks: Option<bool>,
    /// Write every log with O_DIRECT and answer acks=all after the device
    /// write, even without --fsync-acks (by default small writes go through
    /// the page cache, as Kafka's do).
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub direct_writes: Option<bool>,
    /// Per-shard memory for recently appended batches: what the cached batches keep alive, a zero-copy batch being charged for the request frame it holds [default: 64 MiB].
    #[arg(long)]
    pub tail_cache_bytes: Option<usize>,
    /// How fetches read data older than the tail cache: `direct` (O_DIRECT
    /// reads into the shard's memory, with read-ahead) or `sendfile` (from
    /// the page cache, as Kafka does) [default: direct].
    #[arg(long, value_enum)]
    pub catch_up_reads: Option<CatchUpReads>,
    /// Do not pin shards to cores (tests, shared machines).
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub no_pin: Option<bool>,
    /// glommio registered I/O memory per shard [default: what memlock allows, at most 8 MiB].
    #[arg(long)]
    pub io_memory_bytes: Option<usize>,
    /// Requests read ahead on one connection before responses are written.
    #[arg(long)]
    pub inflight_requests_max: Option<usize>,
    /// Kafka `num.partitions` [default: 1].
    #[arg(long)]
    pub num_partitions: Option<i32>,
    /// Kafka `auto.create.topics.enable` [default: true].
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub auto_create_topics_enable: Option<bool>,
    /// Kafka `log.retention.ms` [default: 7 days].
    #[arg(long)]
    pub log_retention_ms: Option<i64>,
    /// Kafka `log.segment.bytes` [default: 1 GiB].
    #[arg(long)]
    pub log_segment_bytes: Option<i64>,
    /// Kafka `message.max.bytes` [default: 1048588].
    #[arg(long)]
    pub message_max_bytes: Option<i32>,
    /// Kafka `log.cleaner.delete.retention.ms`, default of a topic's `delete.retention.ms` [default: 1 day].
    #[arg(long)]
    pub log_cleaner_delete_retention_ms: Option<i64>,
    /// Kafka `log.cleaner.min.compaction.lag.ms`, default of a topic's `min.compaction.lag.ms` [default: 0].
    #[arg(long)]
    pub log_cleaner_min_compaction_lag_ms: Option<i64>,
    /// Kafka `log.cleaner.max.compaction.lag.ms`, default of a topic's `max.compaction.lag.ms` [default: 9223372036854775807].
    #[arg(long)]
    pub log_cleaner_max_compaction_lag_ms: Option<i64>,
    /// Kafka `log.cleaner.min.cleanable.ratio`, default of a topic's `min.cleanable.dirty.ratio` [default: 0.5].
    #[arg(long)]
    pub log_cleaner_min_cleanable_ratio: Option<f64>,
    /// Kafka `offsets.topic.segment.bytes`: segment size of `__consumer_offsets`, set when it is created [default: 104857600].
    #[arg(long)]
    pub offsets_topic_segment_bytes: Option<u64>,
    /// Kafka `transaction.state.log.segment.bytes`: segment size of `__transaction_state`, set when it is created [default: 104857600].
    #[arg(long)]
    pub transaction_state_log_segment_bytes: Option<u64>,
    /// Kafka `offsets.topic.replication.factor`: replicas of each `__consumer_offsets` partition on several nodes, set when it is created; fewer live nodes than this and it is not created (COORDINATOR_NOT_AVAILABLE), as in Kafka. A single node keeps one replica [default: 3].
    #[arg(long)]
    pub offsets_topic_replication_factor: Option<i16>,
    /// Kafka `transaction.state.log.replication.factor`: as `--offsets-topic-replication-factor`, for `__transaction_state` [default: 3].
    #[arg(long)]
    pub transaction_state_log_replication_factor: Option<i16>,
    /// Kafka `log.cleaner.enable`: run the log cleaner of compacted topics [default: true].
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub log_cleaner_enable: Option<bool>,
    /// Kafka `log.cleaner.threads`: threads cleaning compacted logs, shared by every shard [default: 1].
    #[arg(long)]
    pub log_cleaner_threads: Option<usize>,
    /// Kafka `log.cleaner.backoff.ms`: the cleaner's sleep when no log needs cleaning [default: 15000].
    #[arg(long)]
    pub log_cleaner_backoff_ms: Option<u64>,
    /// Kafka `log.cleaner.dedupe.buffer.size`: memory of the cleaner's key → offset map [default: 134217728].
    #[arg(long)]
    pub log_cleaner_dedupe_buffer_size: Option<usize>,
    /// Kafka `log.cleaner.io.max.bytes.per.second`: the cleaner's read + write rate cap [default: unlimited].
    #[arg(long)]
    pub log_cleaner_io_max_bytes_per_second: Option<f64>,
    /// Kafka `producer.id.expiration.ms`: idle producers' state is dropped [default: 1 day].
    #[arg(long)]
    pub producer_id_expiration_ms: Option<i64>,
    /// Producers tracked per partition; the least recently used is evicted beyond it [default: 10000].
    #[arg(long)]
    pub producers_per_partition_max: Option<usize>,
    /// Kafka `group.initial.rebalance.delay.ms`: the first rebalance of an
    /// empty group waits this long for more members [default: 3000].
    #[arg(long)]
    pub group_initial_rebalance_delay_ms: Option<i64>,
    /// Kafka `offsets.retention.minutes`: committed offsets of an empty
    /// group are dropped this long after it became empty [default: 10080].
    #[arg(long)]
    pub offsets_retention_minutes: Option<i64>,
    /// Connections one shard serves at once (Kafka `max.connections`, per shard); a connection over it is closed at accept [default: 10000].
    #[arg(long)]
    pub max_connections_per_shard: Option<usize>,
    /// Kafka `connections.max.idle.ms`: a connection with no request for this long is closed [default: 600000].
    #[arg(long)]
    pub connections_max_idle_ms: Option<u64>,
    /// Kafka `queued.max.request.bytes`, per shard: bytes of requests read and not yet answered; at the limit the shard stops reading sockets [default: 256 MiB].
    #[arg(long)]
    pub queued_max_request_bytes: Option<usize>,
    /// Bytes of requests one connection holds read and not yet answered; at the limit it is not read until answers go out (one request is always read) [default: 64 MiB].
    #[arg(long)]
    pub connection_queued_max_request_bytes: Option<usize>,
    /// Bytes a shard holds appended but not yet written to its segment files; produce requests wait while it is over (acks=0 producers faster than the disk are slowed, not buffered) [default: 256 MiB].
    #[arg(long)]
    pub staged_bytes_max: Option<usize>,
    /// Largest a compressed batch may grow when the broker decompresses it (validation, recompression); a larger one is refused with INVALID_RECORD [default: 64 MiB].
    #[arg(long)]
    pub batch_decompressed_bytes_max: Option<usize>,
    /// Partitions one CreateTopics or CreatePartitions request may create, all its topics together [default: 10000].
    #[arg(long)]
    pub create_topics_partitions_max: Option<i64>,
    /// Partitions the broker holds in all, internal topics included; creations past it are refused [default: 100000].
    #[arg(long)]
    pub partitions_max: Option<i64>,
    /// Kafka `group.max.size`: members one consumer group may have; a join beyond it gets GROUP_MAX_SIZE_REACHED [default: 10000].
    #[arg(long)]
    pub group_max_size: Option<usize>,
    /// Kafka `group.consumer.session.timeout.ms`: a member of a consumer-protocol (KIP-848) group that sends no heartbeat for this long is removed [default: 45000].
    #[arg(long)]
    pub group_consumer_session_timeout_ms: Option<i32>,
    /// Kafka `group.consumer.heartbeat.interval.ms`: how often members of a consumer-protocol (KIP-848) group are told to heartbeat [default: 5000].
    #[arg(long)]
    pub group_consumer_heartbeat_interval_ms: Option<i32>,
    /// Kafka `max.incremental.fetch.session.cache.slots`: incremental fetch sessions (KIP-227) each shard keeps; 0 turns them off, so every fetch is a full one [default: 1000].
    #[arg(long)]
    pub max_incremental_fetch_session_cache_slots: Option<usize>,
    /// Kafka `transactional.id.expiration.ms`: a transactional id with no transaction for this long is forgotten [default: 7 days].
    #[arg(long)]
    pub transactional_id_expiration_ms: Option<i64>,
    /// Longest a shard waits for another shard's answer (a metadata change applied by every shard, a producer-id block, transaction markers, a partition added to a transaction); the request then gets Kafka's timeout answer (REQUEST_TIMED_OUT, COORDINATOR_NOT_AVAILABLE, ...) [default: 30000].
    #[arg(long)]
    pub cross_shard_timeout_ms: Option<u64>,
    /// Address of the metrics endpoint (`/metrics`, `/healthz`, `/readyz`,
    /// served by shard 0), or `none` to serve none [default: 127.0.0.1:9644].
    #[arg(long)]
    pub metrics_listen: Option<String>,
    /// Record request, log and coordinator counters (`false` leaves only
    /// the gauges read at scrape time; for measuring what recording costs)
    /// [default: true].
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub metrics_recording: Option<bool>,
    /// Export per-partition series (offsets, sizes, per-group-partition
    /// lag); off by default, since a broker may lead 100000 partitions.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub metrics_partition_labels: Option<bool>,
    /// Kafka `authorizer.class.name`: `standard` checks every request
    /// against the ACLs (Kafka's StandardAuthorizer); `none` checks nothing
    /// [default: none].
    #[arg(long, value_enum)]
    pub authorizer: Option<AuthorizerKind>,
    /// Kafka `super.users`: principals allowed everything whatever the
    /// ACLs say, `User:a;User:b` [default: none].
    #[arg(long)]
    pub super_users: Option<String>,
    /// Kafka `allow.everyone.if.no.acl.found`: a resource no ACL names is
    /// open to everyone (otherwise only to super users) [default: false].
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub allow_everyone_if_no_acl_found: Option<bool>,
    /// TESTING ONLY: after appending every Nth produce request on a shard, close
    /// the connection instead of answering, as if the response were lost.
    #[arg(long, hide = true)]
    pub debug_drop_produce_response_every: Option<u64>,
    /// TESTING ONLY: wait this long before writing a transaction's markers
    /// (after EndTxn was answered), so a test can kill the broker in between.
    #[arg(long, hide = true)]
    pub debug_delay_txn_markers_ms: Option<u64>,
    /// TESTING ONLY: shard K panics `DEBUG_PANIC_DELAY_MS` after it starts
    /// listening, to test that a panic in a shard ends the process.
    #[arg(long, hide = true)]
    pub debug_panic_shard: Option<usize>,
    /// TESTING ONLY: once it listens, shard K stops handling messages from
    /// other shards (it still serves its own clients), for
    /// `--debug-stall-shard-ms` or for good, to test the cross-shard timeouts.
    #[arg(long, hide = true)]
    pub debug_stall_shard: Option<usize>,
    /// TESTING ONLY: how long `--debug-stall-shard` stalls [default: for good].
    #[arg(long, hide = true)]
    pub debug_stall_shard_ms: Option<u64>,
    /// TESTING ONLY: every segment write waits this long first (a slow
    /// disk), to test that producers faster than the disk are held back.
    #[arg(long, hide = true)]
    pub debug_write_delay_ms: Option<u64>,
}

/// One voter of `--controller-quorum`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuorumVoter {
    /// Its `--node-id`.
    pub node_id: i32,
    /// Its controller address, `HOST:PORT` as written.
    pub host: String,
    pub port: u16,
}

/// The metadata quorum this node belongs to (`--controller-quorum`,
/// `--controller-listen`), checked at start: every voter's id and address
/// unique, this node's id in the list or a learner's own address given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuorumSettings {
    /// This node's `--node-id`.
    pub node_id: i32,
    /// The voters, in the order given.
    pub voters: Vec<QuorumVoter>,
    /// Where this node's controller listens: its own voter entry, or
    /// `--controller-listen` for a learner.
    pub listen: (String, u16),
}

impl QuorumSettings {
    /// Most voters accepted (Kafka runs 3 or 5; more only slows commits).
    pub const VOTERS_MAX: usize = 9;

    /// Whether this node votes (else it is a learner, Kafka's observer).
    pub fn is_voter(&self) -> bool {
        self.voters.iter().any(|v| v.node_id == self.node_id)
    }

    /// Whether the quorum is this node alone.
    pub fn is_single_node(&self) -> bool {
        self.voters.len() == 1 && self.is_voter()
    }

    fn resolve(
        node_id: Option<i32>,
        quorum: Option<&str>,
        listen: Option<&str>,
    ) -> anyhow::Result<Option<QuorumSettings>> {
        let Some(quorum) = quorum else {
            anyhow::ensure!(
                listen.is_none(),
                "--controller-listen is only meaningful with --controller-quorum"
            );
            return Ok(None);
        };
        let Some(node_id) = node_id else {
            anyhow::bail!(
                "--controller-quorum needs --node-id: each node of a quorum names itself"
            );
        };
        anyhow::ensure!(
            node_id >= 0,
            "--node-id must be at least 0 with --controller-quorum (got {node_id})"
        );
        let mut voters: Vec<QuorumVoter> = Vec::new();
        for entry in quorum.split(',').map(str::trim) {
            let bad = |why: &str| {
                anyhow::anyhow!(
                    "--controller-quorum: `{entry}` {why}; expected ID@HOST:PORT entries separated by commas, e.g. 1@10.0.0.1:9093,2@10.0.0.2:9093,3@10.0.0.3:9093"
                )
            };
            let (id, addr) = entry.split_once('@').ok_or_else(|| bad("has no `@`"))?;
            let id: i32 = id
                .parse()
                .ok()
                .filter(|id| *id >= 0)
                .ok_or_else(|| bad("does not start with a node id (0 or more)"))?;
            let (host, port) = split_host_port(addr).map_err(|why| bad(&why))?;
            let voter = QuorumVoter {
                node_id: id,
                host,
                port,
            };
            if voters.iter().any(|v| v.node_id == id) {
                anyhow::bail!("--controller-quorum: node id {id} is listed twice");
            }
            if let Some(v) = voters
                .iter()
                .find(|v| v.host == voter.host && v.port == voter.port)
            {
                anyhow::bail!(
                    "--controller-quorum: nodes {} and {id} have the same address {addr}",
                    v.node_id
                );
            }
            voters.push(voter);
        }
        anyhow::ensure!(
            voters.len() <= Self::VOTERS_MAX,
            "--controller-quorum lists {} voters; at most {} are accepted",
            voters.len(),
            Self::VOTERS_MAX
        );
        let own = voters.iter().find(|v| v.node_id == node_id);
        let listen = match (own, listen) {
            (Some(v), None) => (v.host.clone(), v.port),
            (Some(v), Some(l)) => {
                let l = split_host_port(l)
                    .map_err(|why| anyhow::anyhow!("--controller-listen `{l}` {why}"))?;
                anyhow::ensure!(
                    l == (v.host.clone(), v.port),
                    "--controller-listen {}:{} does not match node {node_id}'s entry {}:{} in --controller-quorum",
                    l.0,
                    l.1,
                    v.host,
                    v.port
                );
                l
            }
            (None, Some(l)) => {
                let l = split_host_port(l)
                    .map_err(|why| anyhow::anyhow!("--controller-listen `{l}` {why}"))?;
                if let Some(v) = voters.iter().find(|v| (v.host.clone(), v.port) == l) {
                    anyhow::bail!(
                        "--controller-listen {}:{} is node {}'s address in --controller-quorum, but this is node {node_id}",
                        l.0,
                        l.1,
                        v.node_id
                    );
                }
                l
            }
            (None, None) => anyhow::bail!(
                "node {node_id} is not in --controller-quorum: a learner needs --controller-listen HOST:PORT"
            ),
        };
        Ok(Some(QuorumSettings {
            node_id,
            voters,
            listen,
        }))
    }
}

/// `HOST:PORT` (a bracketed IPv6 host allowed), or why not.
fn split_host_port(addr: &str) -> Result<(String, u16), String> {
    let (host, port) = addr
        .rsplit_once(':')
        .ok_or_else(|| "has no :PORT".to_string())?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if host.is_empty() {
        return Err("has no host".into());
    }
    let port: u16 = port
        .parse()
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| format!("has no valid port (`{port}`)"))?;
    Ok((host.to_string(), port))
}

/// The resolved broker configuration, identical on every shard.
#[derive(Debug, Clone)]
pub struct BrokerConfig {
    /// The cluster id from `<data-dir>/meta.properties` (set by the server at start).
    pub cluster_id: String,
    pub log_format: LogFormat,
    pub data_dir: PathBuf,
    /// Every listener, in the order given; a connection knows its own
    /// (`auth::Session::listener`) and is told that listener's endpoints.
    pub listeners: Vec<Listener>,
    /// `--advertised-host` for every listener, or the first listener's.
    pub advertised_host: String,
    /// Certificate, key and client authentication of the TLS listeners
    /// (None when no listener is SSL or SASL_SSL).
    pub tls: Option<TlsSettings>,
    /// Mechanisms and session lifetime of SASL listeners.
    pub sasl_mechanisms: Vec<String>,
    pub connections_max_reauth_ms: u64,
    /// Whether the bind address was chosen by the safe default (loopback,
    /// no listener given), for the start-up log.
    pub listen_is_safe_default: bool,
    pub cores: usize,
    pub node_id: i32,
    /// `--controller-quorum` and `--controller-listen`, validated; None: a
    /// quorum of one (this node alone, as before those flags existed).
    pub quorum: Option<QuorumSettings>,
    /// `--broker-session-timeout-ms`.
    pub broker_session_timeout_ms: u64,
    /// `--replica-lag-time-max-ms`.
    pub replica_lag_time_max_ms: u64,
    pub fsync_acks: bool,
    pub direct_writes: bool,
    pub tail_cache_bytes: usize,
    pub catch_up_reads: CatchUpReads,
    pub pin: bool,
    pub io_memory_bytes: Option<usize>,
    pub inflight_requests_max: usize,
    pub num_partitions: i32,
    pub auto_create_topics_enable: bool,
    pub log_retention_ms: i64,
    pub log_segment_bytes: i64,
    pub message_max_bytes: i32,
    pub log_cleaner_delete_retention_ms: i64,
    pub log_cleaner_min_compaction_lag_ms: i64,
    pub log_cleaner_max_compaction_lag_ms: i64,
    pub log_cleaner_min_cleanable_ratio: f64,
    pub log_cleaner_enable: bool,
    pub offsets_topic_segment_bytes: u64,
    pub transaction_state_log_segment_bytes: u64,
    /// Several nodes only: see `ServeArgs::offsets_topic_replication_factor`.
    pub offsets_topic_replication_factor: i16,
    pub transaction_state_log_replication_factor: i16,
    pub log_cleaner_backoff_ms: u64,
    pub log_cleaner_threads: usize,
    pub log_cleaner_dedupe_buffer_size: usize,
    /// `f64::INFINITY` when unlimited.
    pub log_cleaner_io_max_bytes_per_second: f64,
    pub producer_id_expiration_ms: i64,
    pub producers_per_partition_max: usize,
    pub group_initial_rebalance_delay_ms: i64,
    pub offsets_retention_minutes: i64,
    pub max_connections_per_shard: usize,
    pub connections_max_idle_ms: u64,
    pub queued_max_request_bytes: usize,
    pub connection_queued_max_request_bytes: usize,
    pub staged_bytes_max: usize,
    pub batch_decompressed_bytes_max: usize,
    pub create_topics_partitions_max: i64,
    pub partitions_max: i64,
    pub group_max_size: usize,
    pub group_consumer_session_timeout_ms: i32,
    pub group_consumer_heartbeat_interval_ms: i32,
    pub fetch_session_cache_slots: usize,
    pub transactional_id_expiration_ms: i64,
    pub cross_shard_timeout_ms: u64,
    /// The metrics endpoint's address (None = `--metrics-listen none`).
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// `metrics_listen` is the default, not asked for: a busy port is then
    /// a warning, not a failed start (see `server`).
    pub metrics_listen_is_default: bool,
    pub metrics_recording: bool,
    pub metrics_partition_labels: bool,
    /// See `ServeArgs::authorizer`.
    pub authorizer: AuthorizerKind,
    /// Principals (`User:name`) of `--super-users`.
    pub super_users: Vec<String>,
    pub allow_everyone_if_no_acl_found: bool,
    /// 0 = off. See `ServeArgs::debug_drop_produce_response_every`.
    pub debug_drop_produce_response_every: u64,
    /// 0 = off. See `ServeArgs::debug_delay_txn_markers_ms`.
    pub debug_delay_txn_markers_ms: u64,
    /// See `ServeArgs::debug_panic_shard`.
    pub debug_panic_shard: Option<usize>,
    /// See `ServeArgs::debug_stall_shard`.
    pub debug_stall_shard: Option<usize>,
    /// None = for good. See `ServeArgs::debug_stall_shard_ms`.
    pub debug_stall_shard_ms: Option<u64>,
    /// 0 = off. See `ServeArgs::debug_write_delay_ms`.
    pub debug_write_delay_ms: u64,
}

impl ServeArgs {
    /// Overlays `self` (command line) on `file`: a flag wins over the file.
    fn overlay(self, file: ServeArgs) -> ServeArgs {
        ServeArgs {
            config: self.config,
            log_format: self.log_format.or(file.log_format),
            data_dir: self.data_dir.or(file.data_dir),
            port: self.port.or(file.port),
            listen: self.listen.or(file.listen),
            listener: self.listener.or(file.listener),
            advertised_host: self.advertised_host.or(file.advertised_host),
            sasl_enabled_mechanisms: self
                .sasl_enabled_mechanisms
                .or(file.sasl_enabled_mechanisms),
            connections_max_reauth_ms: self
                .connections_max_reauth_ms
                .or(file.connections_max_reauth_ms),
            tls_cert: self.tls_cert.or(file.tls_cert),
            tls_key: self.tls_key.or(file.tls_key),
            tls_client_ca: self.tls_client_ca.or(file.tls_client_ca),
            tls_client_auth: self.tls_client_auth.or(file.tls_client_auth),
            cores: self.cores.or(file.cores),
            node_id: self.node_id.or(file.node_id),
            controller_quorum: self.controller_quorum.or(file.controller_quorum),
            controller_listen: self.controller_listen.or(file.controller_listen),
            broker_session_timeout_ms: self
                .broker_session_timeout_ms
                .or(file.broker_session_timeout_ms),
            replica_lag_time_max_ms: self
                .replica_lag_time_max_ms
                .or(file.replica_lag_time_max_ms),
            fsync_acks: self.fsync_acks.or(file.fsync_acks),
            direct_writes: self.direct_writes.or(file.direct_writes),
            tail_cache_bytes: self.tail_cache_bytes.or(file.tail_cache_bytes),
            catch_up_reads: self.catch_up_reads.or(file.catch_up_reads),
            no_pin: self.no_pin.or(file.no_pin),
            io_memory_bytes: self.io_memory_bytes.or(file.io_memory_bytes),
            inflight_requests_max: self.inflight_requests_max.or(file.inflight_requests_max),
            num_partitions: self.num_partitions.or(file.num_partitions),
            auto_create_topics_enable: self
                .auto_create_topics_enable
                .or(file.auto_create_topics_enable),
            log_retention_ms: self.log_retention_ms.or(file.log_retention_ms),
            log_segment_bytes: self.log_segment_bytes.or(file.log_segment_bytes),
            message_max_bytes: self.message_max_bytes.or(file.message_max_bytes),
            log_cleaner_delete_retention_ms: self
                .log_cleaner_delete_retention_ms
                .or(file.log_cleaner_delete_retention_ms),
            log_cleaner_min_compaction_lag_ms: self
                .log_cleaner_min_compaction_lag_ms
                .or(file.log_cleaner_min_compaction_lag_ms),
            log_cleaner_max_compaction_lag_ms: self
                .log_cleaner_max_compaction_lag_ms
                .or(file.log_cleaner_max_compaction_lag_ms),
            log_cleaner_min_cleanable_ratio: self
                .log_cleaner_min_cleanable_ratio
                .or(file.log_cleaner_min_cleanable_ratio),
            log_cleaner_enable: self.log_cleaner_enable.or(file.log_cleaner_enable),
            offsets_topic_segment_bytes: self
                .offsets_topic_segment_bytes
                .or(file.offsets_topic_segment_bytes),
            transaction_state_log_segment_bytes: self
                .transaction_state_log_segment_bytes
                .or(file.transaction_state_log_segment_bytes),
            offsets_topic_replication_factor: self
                .offsets_topic_replication_factor
                .or(file.offsets_topic_replication_factor),
            transaction_state_log_replication_factor: self
                .transaction_state_log_replication_factor
                .or(file.transaction_state_log_replication_factor),
            log_cleaner_backoff_ms: self.log_cleaner_backoff_ms.or(file.log_cleaner_backoff_ms),
            log_cleaner_threads: self.log_cleaner_threads.or(file.log_cleaner_threads),
            log_cleaner_dedupe_buffer_size: self
                .log_cleaner_dedupe_buffer_size
                .or(file.log_cleaner_dedupe_buffer_size),
            log_cleaner_io_max_bytes_per_second: self
                .log_cleaner_io_max_bytes_per_second
                .or(file.log_cleaner_io_max_bytes_per_second),
            producer_id_expiration_ms: self
                .producer_id_expiration_ms
                .or(file.producer_id_expiration_ms),
            producers_per_partition_max: self
                .producers_per_partition_max
                .or(file.producers_per_partition_max),
            group_initial_rebalance_delay_ms: self
                .group_initial_rebalance_delay_ms
                .or(file.group_initial_rebalance_delay_ms),
            offsets_retention_minutes: self
                .offsets_retention_minutes
                .or(file.offsets_retention_minutes),
            max_connections_per_shard: self
                .max_connections_per_shard
                .or(file.max_connections_per_shard),
            connections_max_idle_ms: self
                .connections_max_idle_ms
                .or(file.connections_max_idle_ms),
            queued_max_request_bytes: self
                .queued_max_request_bytes
                .or(file.queued_max_request_bytes),
            connection_queued_max_request_bytes: self
                .connection_queued_max_request_bytes
                .or(file.connection_queued_max_request_bytes),
            staged_bytes_max: self.staged_bytes_max.or(file.staged_bytes_max),
            batch_decompressed_bytes_max: self
                .batch_decompressed_bytes_max
                .or(file.batch_decompressed_bytes_max),
            create_topics_partitions_max: self
                .create_topics_partitions_max
                .or(file.create_topics_partitions_max),
            partitions_max: self.partitions_max.or(file.partitions_max),
            group_max_size: self.group_max_size.or(file.group_max_size),
            group_consumer_session_timeout_ms: self
                .group_consumer_session_timeout_ms
                .or(file.group_consumer_session_timeout_ms),
            group_consumer_heartbeat_interval_ms: self
                .group_consumer_heartbeat_interval_ms
                .or(file.group_consumer_heartbeat_interval_ms),
            max_incremental_fetch_session_cache_slots: self
                .max_incremental_fetch_session_cache_slots
                .or(file.max_incremental_fetch_session_cache_slots),
            transactional_id_expiration_ms: self
                .transactional_id_expiration_ms
                .or(file.transactional_id_expiration_ms),
            cross_shard_timeout_ms: self.cross_shard_timeout_ms.or(file.cross_shard_timeout_ms),
            debug_drop_produce_response_every: self
                .debug_drop_produce_response_every
                .or(file.debug_drop_produce_response_every),
            debug_delay_txn_markers_ms: self
                .debug_delay_txn_markers_ms
                .or(file.debug_delay_txn_markers_ms),
            debug_panic_shard: self.debug_panic_shard.or(file.debug_panic_shard),
            debug_stall_shard: self.debug_stall_shard.or(file.debug_stall_shard),
            debug_stall_shard_ms: self.debug_stall_shard_ms.or(file.debug_stall_shard_ms),
            debug_write_delay_ms: self.debug_write_delay_ms.or(file.debug_write_delay_ms),
            metrics_listen: self.metrics_listen.or(file.metrics_listen),
            metrics_recording: self.metrics_recording.or(file.metrics_recording),
            metrics_partition_labels: self
                .metrics_partition_labels
                .or(file.metrics_partition_labels),
            authorizer: self.authorizer.or(file.authorizer),
            super_users: self.super_users.or(file.super_users),
            allow_everyone_if_no_acl_found: self
                .allow_everyone_if_no_acl_found
                .or(file.allow_everyone_if_no_acl_found),
        }
    }

    /// Reads the `--config` file if any, overlays the flags and fills defaults.
    pub fn resolve(self) -> anyhow::Result<BrokerConfig> {
        let file = match &self.config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
                toml::from_str::<ServeArgs>(&text)
                    .map_err(|e| anyhow::anyhow!("bad config file {}: {e}", path.display()))?
            }
            None => ServeArgs::default(),
        };
        let a = self.overlay(file);
        let online = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        let cores = a.cores.unwrap_or(online);
        let (listeners, listen_is_safe_default) = resolve_listeners(
            a.listener.as_deref().unwrap_or(&[]),
            a.port,
            a.listen,
            a.advertised_host.as_deref(),
            cores,
        )?;
        let advertised_host = listeners[0].advertised_host.clone();
        let sasl_mechanisms: Vec<String> = a
            .sasl_enabled_mechanisms
            .as_deref()
            .unwrap_or(SASL_ENABLED_MECHANISMS_DEFAULT)
            .split(',')
            .map(|m| m.trim().to_string())
            .filter(|m| !m.is_empty())
            .collect();
        for m in &sasl_mechanisms {
            anyhow::ensure!(
                SASL_MECHANISMS_SUPPORTED.contains(&m.as_str()),
                "--sasl-enabled-mechanisms: {m} is not supported (fjord serves {})",
                SASL_MECHANISMS_SUPPORTED.join(", ")
            );
        }
        anyhow::ensure!(
            !sasl_mechanisms.is_empty() || !listeners.iter().any(|l| l.protocol.is_sasl()),
            "--sasl-enabled-mechanisms is empty but a SASL listener is configured"
        );
        anyhow::ensure!(cores >= 1, "--cores must be at least 1");
        anyhow::ensure!(
            cores < 1000,
            "--cores must be below 1000 (node ids are node_id * 1000 + shard)"
        );
        let quorum = QuorumSettings::resolve(
            a.node_id,
            a.controller_quorum.as_deref(),
            a.controller_listen.as_deref(),
        )?;
        let num_partitions = a.num_partitions.unwrap_or(1);
        anyhow::ensure!(num_partitions >= 1, "--num-partitions must be at least 1");
        // Kafka's ranges for these broker settings (`CleanerConfig` /
        // `ServerLogConfigs`): a topic that does not override them takes
        // them as its own, so they must be valid topic values too.
        let log_cleaner_delete_retention_ms = a
            .log_cleaner_delete_retention_ms
            .unwrap_or(LOG_CLEANER_DELETE_RETENTION_MS_DEFAULT);
        anyhow::ensure!(
            log_cleaner_delete_retention_ms >= 0,
            "--log-cleaner-delete-retention-ms must be at least 0"
        );
        let log_cleaner_min_compaction_lag_ms = a
            .log_cleaner_min_compaction_lag_ms
            .unwrap_or(LOG_CLEANER_MIN_COMPACTION_LAG_MS_DEFAULT);
        anyhow::ensure!(
            log_cleaner_min_compaction_lag_ms >= 0,
            "--log-cleaner-min-compaction-lag-ms must be at least 0"
        );
        let log_cleaner_max_compaction_lag_ms = a
            .log_cleaner_max_compaction_lag_ms
            .unwrap_or(LOG_CLEANER_MAX_COMPACTION_LAG_MS_DEFAULT);
        anyhow::ensure!(
            log_cleaner_max_compaction_lag_ms >= 1,
            "--log-cleaner-max-compaction-lag-ms must be at least 1"
        );
        let log_cleaner_min_cleanable_ratio = a
            .log_cleaner_min_cleanable_ratio
            .unwrap_or(LOG_CLEANER_MIN_CLEANABLE_RATIO_DEFAULT);
        anyhow::ensure!(
            (0.0..=1.0).contains(&log_cleaner_min_cleanable_ratio),
            "--log-cleaner-min-cleanable-ratio must be between 0 and 1"
        );
        let internal_segment_bytes = |v: Option<u64>, flag: &str| {
            let bytes = v.unwrap_or(INTERNAL_TOPIC_SEGMENT_BYTES_DEFAULT);
            anyhow::ensure!(
                bytes >= SEGMENT_BYTES_MIN as u64 && bytes <= i32::MAX as u64,
                "--{flag} must be between {} and {}",
                SEGMENT_BYTES_MIN,
                i32::MAX
            );
            Ok(bytes)
        };
        let offsets_topic_segment_bytes =
            internal_segment_bytes(a.offsets_topic_segment_bytes, "offsets-topic-segment-bytes")?;
        let transaction_state_log_segment_bytes = internal_segment_bytes(
            a.transaction_state_log_segment_bytes,
            "transaction-state-log-segment-bytes",
        )?;
        let internal_replication_factor = |factor: Option<i16>, flag: &str| {
            let factor = factor.unwrap_or(INTERNAL_REPLICATION_FACTOR_DEFAULT);
            anyhow::ensure!(factor >= 1, "--{flag} must be at least 1");
            Ok(factor)
        };
        let offsets_topic_replication_factor = internal_replication_factor(
            a.offsets_topic_replication_factor,
            "offsets-topic-replication-factor",
        )?;
        let transaction_state_log_replication_factor = internal_replication_factor(
            a.transaction_state_log_replication_factor,
            "transaction-state-log-replication-factor",
        )?;
        let log_cleaner_dedupe_buffer_size = a
            .log_cleaner_dedupe_buffer_size
            .unwrap_or(LOG_CLEANER_DEDUPE_BUFFER_SIZE_DEFAULT);
        anyhow::ensure!(
            log_cleaner_dedupe_buffer_size >= crate::log::cleaner::DEDUPE_BUFFER_MIN_BYTES,
            "--log-cleaner-dedupe-buffer-size must be at least {} bytes",
            crate::log::cleaner::DEDUPE_BUFFER_MIN_BYTES
        );
        let log_cleaner_io_max_bytes_per_second = a
            .log_cleaner_io_max_bytes_per_second
            .unwrap_or(f64::INFINITY);
        anyhow::ensure!(
            log_cleaner_io_max_bytes_per_second > 0.0,
            "--log-cleaner-io-max-bytes-per-second must be above 0"
        );
        let metrics_listen = match a.metrics_listen.as_deref() {
            Some("none") => None,
            Some(addr) => Some(addr.parse().map_err(|e| {
                anyhow::anyhow!("--metrics-listen {addr}: expected ADDR:PORT or none ({e})")
            })?),
            None => Some(METRICS_LISTEN_DEFAULT.parse().expect("valid default")),
        };
        let tls = resolve_tls(&listeners, &a)?;
        let mut super_users = Vec::new();
        for p in a
            .super_users
            .as_deref()
            .unwrap_or("")
            .split(';')
            .map(str::trim)
            .filter(|p| !p.is_empty())
        {
            anyhow::ensure!(
                p.split_once(':').is_some_and(|(t, n)| !t.is_empty() && !n.is_empty()),
                "--super-users: `{p}` is not a principal `type:name` (e.g. User:admin); separate principals with `;`"
            );
            super_users.push(p.to_string());
        }
        Ok(BrokerConfig {
            authorizer: a.authorizer.unwrap_or_default(),
            super_users,
            allow_everyone_if_no_acl_found: a.allow_everyone_if_no_acl_found.unwrap_or(false),
            metrics_listen,
            metrics_listen_is_default: a.metrics_listen.is_none(),
            metrics_recording: a.metrics_recording.unwrap_or(true),
            metrics_partition_labels: a.metrics_partition_labels.unwrap_or(false),
            cluster_id: String::new(),
            log_format: a.log_format.unwrap_or_default(),
            data_dir: a.data_dir.unwrap_or_else(|| PathBuf::from("./data")),
            listeners,
            advertised_host,
            tls,
            sasl_mechanisms,
            connections_max_reauth_ms: a.connections_max_reauth_ms.unwrap_or(0),
            listen_is_safe_default,
            cores,
            node_id: a.node_id.unwrap_or(0),
            quorum,
            fsync_acks: a.fsync_acks.unwrap_or(false),
            direct_writes: a.direct_writes.unwrap_or(false),
            tail_cache_bytes: a.tail_cache_bytes.unwrap_or(TAIL_CACHE_BYTES_DEFAULT),
            catch_up_reads: a.catch_up_reads.unwrap_or(CATCH_UP_READS_DEFAULT),
            pin: !a.no_pin.unwrap_or(false),
            io_memory_bytes: a.io_memory_bytes,
            inflight_requests_max: a
                .inflight_requests_max
                .unwrap_or(INFLIGHT_REQUESTS_MAX_DEFAULT)
                .max(1),
            num_partitions,
            auto_create_topics_enable: a.auto_create_topics_enable.unwrap_or(true),
            log_retention_ms: a.log_retention_ms.unwrap_or(LOG_RETENTION_MS_DEFAULT),
            log_segment_bytes: a.log_segment_bytes.unwrap_or(LOG_SEGMENT_BYTES_DEFAULT),
            message_max_bytes: a.message_max_bytes.unwrap_or(MESSAGE_MAX_BYTES_DEFAULT),
            log_cleaner_delete_retention_ms,
            log_cleaner_min_compaction_lag_ms,
            log_cleaner_max_compaction_lag_ms,
            log_cleaner_min_cleanable_ratio,
            log_cleaner_enable: a.log_cleaner_enable.unwrap_or(true),
            offsets_topic_segment_bytes,
            transaction_state_log_segment_bytes,
            offsets_topic_replication_factor,
            transaction_state_log_replication_factor,
            log_cleaner_backoff_ms: a
                .log_cleaner_backoff_ms
                .unwrap_or(LOG_CLEANER_BACKOFF_MS_DEFAULT)
                .max(1),
            log_cleaner_threads: a
                .log_cleaner_threads
                .unwrap_or(1)
                .clamp(1, LOG_CLEANER_THREADS_MAX),
            log_cleaner_dedupe_buffer_size,
            log_cleaner_io_max_bytes_per_second,
            producer_id_expiration_ms: a
                .producer_id_expiration_ms
                .unwrap_or(PRODUCER_ID_EXPIRATION_MS_DEFAULT),
            producers_per_partition_max: a
                .producers_per_partition_max
                .unwrap_or(PRODUCERS_PER_PARTITION_MAX_DEFAULT)
                .max(1),
            group_initial_rebalance_delay_ms: a
                .group_initial_rebalance_delay_ms
                .unwrap_or(GROUP_INITIAL_REBALANCE_DELAY_MS_DEFAULT)
                .max(0),
            offsets_retention_minutes: a
                .offsets_retention_minutes
                .unwrap_or(OFFSETS_RETENTION_MINUTES_DEFAULT)
                .max(1),
            max_connections_per_shard: a
                .max_connections_per_shard
                .unwrap_or(MAX_CONNECTIONS_PER_SHARD_DEFAULT)
                .max(1),
            connections_max_idle_ms: a
                .connections_max_idle_ms
                .unwrap_or(CONNECTIONS_MAX_IDLE_MS_DEFAULT)
                .max(1),
            queued_max_request_bytes: a
                .queued_max_request_bytes
                .unwrap_or(QUEUED_MAX_REQUEST_BYTES_DEFAULT)
                .max(1),
            connection_queued_max_request_bytes: a
                .connection_queued_max_request_bytes
                .unwrap_or(CONNECTION_QUEUED_MAX_REQUEST_BYTES_DEFAULT)
                .max(1),
            staged_bytes_max: a
                .staged_bytes_max
                .unwrap_or(STAGED_BYTES_MAX_DEFAULT)
                .max(1),
            batch_decompressed_bytes_max: a
                .batch_decompressed_bytes_max
                .unwrap_or(BATCH_DECOMPRESSED_BYTES_MAX_DEFAULT)
                .max(1),
            create_topics_partitions_max: a
                .create_topics_partitions_max
                .unwrap_or(CREATE_TOPICS_PARTITIONS_MAX_DEFAULT)
                .max(1),
            partitions_max: a.partitions_max.unwrap_or(PARTITIONS_MAX_DEFAULT).max(1),
            group_max_size: a.group_max_size.unwrap_or(GROUP_MAX_SIZE_DEFAULT).max(1),
            group_consumer_session_timeout_ms: a
                .group_consumer_session_timeout_ms
                .unwrap_or(GROUP_CONSUMER_SESSION_TIMEOUT_MS_DEFAULT)
                .max(1),
            group_consumer_heartbeat_interval_ms: a
                .group_consumer_heartbeat_interval_ms
                .unwrap_or(GROUP_CONSUMER_HEARTBEAT_INTERVAL_MS_DEFAULT)
                .max(1),
            fetch_session_cache_slots: a
                .max_incremental_fetch_session_cache_slots
                .unwrap_or(FETCH_SESSION_CACHE_SLOTS_DEFAULT),
            transactional_id_expiration_ms: a
                .transactional_id_expiration_ms
                .unwrap_or(TRANSACTIONAL_ID_EXPIRATION_MS_DEFAULT)
                .max(1),
            cross_shard_timeout_ms: a
                .cross_shard_timeout_ms
                .unwrap_or(CROSS_SHARD_TIMEOUT_MS_DEFAULT)
                .max(1),
            broker_session_timeout_ms: a
                .broker_session_timeout_ms
                .unwrap_or(BROKER_SESSION_TIMEOUT_MS_DEFAULT)
                .max(100),
            replica_lag_time_max_ms: a
                .replica_lag_time_max_ms
                .unwrap_or(REPLICA_LAG_TIME_MAX_MS_DEFAULT)
                .clamp(100, i64::MAX as u64),
            debug_drop_produce_response_every: a.debug_drop_produce_response_every.unwrap_or(0),
            debug_delay_txn_markers_ms: a.debug_delay_txn_markers_ms.unwrap_or(0),
            debug_panic_shard: a.debug_panic_shard,
            debug_stall_shard: a.debug_stall_shard,
            debug_stall_shard_ms: a.debug_stall_shard_ms,
            debug_write_delay_ms: a.debug_write_delay_ms.unwrap_or(0),
        })
    }
}

impl BrokerConfig {
    /// How often a node of several heartbeats the quorum's leader:
    /// [`BROKER_HEARTBEAT_INTERVAL_MS`], or a quarter of the session
    /// timeout if that is shorter (a shortened timeout in tests).
    pub fn broker_heartbeat_interval(&self) -> std::time::Duration {
        std::time::Duration::from_millis(
            BROKER_HEARTBEAT_INTERVAL_MS.min(self.broker_session_timeout_ms / 4),
        )
    }

    /// Whether this node is one of a cluster: its `--controller-quorum`
    /// names other nodes (else it is a quorum of one, a single node).
    pub fn several_nodes(&self) -> bool {
        self.quorum.as_ref().is_some_and(|q| !q.is_single_node())
    }

    /// `--broker-session-timeout-ms`.
    pub fn broker_session_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.broker_session_timeout_ms)
    }

    /// The Kafka node id clients see for shard `shard`.
    pub fn node_id_of(&self, shard: usize) -> i32 {
        self.node_id * 1000 + shard as i32
    }

    /// The shard behind a node id of this server, if it is one.
    pub fn shard_of_node(&self, node_id: i32) -> Option<usize> {
        let shard = node_id - self.node_id * 1000;
        (0..self.cores as i32)
            .contains(&shard)
            .then_some(shard as usize)
    }

    /// The port of `shard` on the first listener.
    pub fn port_of(&self, shard: usize) -> u16 {
        self.listeners[0].port_of(shard)
    }

    /// The host and port clients of listener `listener` reach `shard` at.
    pub fn endpoint(&self, listener: usize, shard: usize) -> (String, i32) {
        let l = self.listener(listener);
        (l.advertised_host.clone(), l.port_of(shard) as i32)
    }

    /// Listener `index`, or the first if there is no such listener.
    pub fn listener(&self, index: usize) -> &Listener {
        self.listeners.get(index).unwrap_or(&self.listeners[0])
    }

    /// Whether any listener authenticates its clients (SASL, or TLS
    /// client certificates required).
    pub fn authentication_configured(&self) -> bool {
        let certificates_required = self
            .tls
            .as_ref()
            .is_some_and(|t| t.client_auth == TlsClientAuth::Required);
        self.listeners
            .iter()
            .any(|l| l.protocol.is_sasl() || (l.protocol.is_tls() && certificates_required))
    }
}

/// Kafka's `sasl.enabled.mechanisms` default is GSSAPI, which fjord does
/// not serve; PLAIN is left out by default because on a SASL_PLAINTEXT
/// listener it sends the password in the clear.
pub const SASL_ENABLED_MECHANISMS_DEFAULT: &str = "SCRAM-SHA-256,SCRAM-SHA-512";
/// The SASL mechanisms fjord serves.
pub const SASL_MECHANISMS_SUPPORTED: [&str; 3] = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"];
/// The port of `--port` when neither it nor a listener is given.
pub const PORT_DEFAULT: u16 = 9092;

/// Kafka's security protocols (`SecurityProtocol`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SecurityProtocol {
    Plaintext,
    SaslPlaintext,
    Ssl,
    SaslSsl,
}

impl SecurityProtocol {
    pub fn name(self) -> &'static str {
        match self {
            SecurityProtocol::Plaintext => "PLAINTEXT",
            SecurityProtocol::SaslPlaintext => "SASL_PLAINTEXT",
            SecurityProtocol::Ssl => "SSL",
            SecurityProtocol::SaslSsl => "SASL_SSL",
        }
    }

    pub fn is_sasl(self) -> bool {
        matches!(
            self,
            SecurityProtocol::SaslPlaintext | SecurityProtocol::SaslSsl
        )
    }

    pub fn is_tls(self) -> bool {
        matches!(self, SecurityProtocol::Ssl | SecurityProtocol::SaslSsl)
    }

    fn parse(name: &str) -> Option<Self> {
        [
            SecurityProtocol::Plaintext,
            SecurityProtocol::SaslPlaintext,
            SecurityProtocol::Ssl,
            SecurityProtocol::SaslSsl,
        ]
        .into_iter()
        .find(|p| p.name() == name)
    }
}

/// One listener: a security protocol on an address; shard k listens on
/// `port + k`. Its name is its protocol (Kafka's default
/// `listener.security.protocol.map`), so there is at most one per protocol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listener {
    pub protocol: SecurityProtocol,
    pub host: IpAddr,
    pub port: u16,
    /// The host clients are told to connect to.
    pub advertised_host: String,
}

impl Listener {
    pub fn port_of(&self, shard: usize) -> u16 {
        self.port + shard as u16
    }

    /// `PROTOCOL://HOST:PORT` as Kafka prints it.
    pub fn describe(&self) -> String {
        format!("{}://{}:{}", self.protocol.name(), self.host, self.port)
    }
}

/// Parses `PROTOCOL://HOST:PORT` (HOST empty for every interface, an IP
/// address, `[v6]`, or a name resolved now).
fn parse_listener(spec: &str) -> anyhow::Result<(SecurityProtocol, IpAddr, u16)> {
    let (proto, rest) = spec
        .split_once("://")
        .ok_or_else(|| anyhow::anyhow!("--listener {spec}: expected PROTOCOL://HOST:PORT"))?;
    let protocol = SecurityProtocol::parse(proto).ok_or_else(|| {
        anyhow::anyhow!(
            "--listener {spec}: unknown security protocol {proto} (PLAINTEXT, SASL_PLAINTEXT, SSL or SASL_SSL)"
        )
    })?;
    let (host, port) = rest
        .rsplit_once(':')
        .ok_or_else(|| anyhow::anyhow!("--listener {spec}: expected PROTOCOL://HOST:PORT"))?;
    let port: u16 = port
        .parse()
        .map_err(|e| anyhow::anyhow!("--listener {spec}: bad port {port}: {e}"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let ip = if host.is_empty() {
        IpAddr::from([0, 0, 0, 0])
    } else if let Ok(ip) = host.parse() {
        ip
    } else {
        use std::net::ToSocketAddrs;
        (host, port)
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .map(|a| a.ip())
            .ok_or_else(|| anyhow::anyhow!("--listener {spec}: cannot resolve {host}"))?
    };
    Ok((protocol, ip, port))
}

/// The listeners from `--listener` and the `--port`/`--listen` shorthand,
/// and whether the address is the safe default (loopback: nothing asked
/// for another). Refuses two listeners of one protocol, and port ranges
/// that overlap or overflow.
fn resolve_listeners(
    specs: &[String],
    port: Option<u16>,
    listen: Option<IpAddr>,
    advertised_host: Option<&str>,
    cores: usize,
) -> anyhow::Result<(Vec<Listener>, bool)> {
    let mut raw = Vec::new();
    let mut safe_default = false;
    if specs.is_empty() || port.is_some() || listen.is_some() {
        safe_default = listen.is_none() && specs.is_empty();
        let host = listen.unwrap_or(IpAddr::from([127, 0, 0, 1]));
        raw.push((
            SecurityProtocol::Plaintext,
            host,
            port.unwrap_or(PORT_DEFAULT),
        ));
    }
    for spec in specs {
        raw.push(parse_listener(spec)?);
    }
    let mut listeners: Vec<Listener> = Vec::new();
    for (protocol, host, port) in raw {
        anyhow::ensure!(
            (port as usize) + cores - 1 <= u16::MAX as usize,
            "ports {port}..{} do not fit",
            port as usize + cores - 1
        );
        if let Some(other) = listeners.iter().find(|l| l.protocol == protocol) {
            anyhow::bail!(
                "two {} listeners ({} and port {port}): a listener is named by its protocol, so there is one of each",
                protocol.name(),
                other.describe()
            );
        }
        let (lo, hi) = (port as usize, port as usize + cores);
        if let Some(other) = listeners
            .iter()
            .find(|l| (l.port as usize) < hi && lo < l.port as usize + cores)
        {
            anyhow::bail!(
                "listener {}://{host}:{port} and {} overlap: each takes {cores} ports (one per shard)",
                protocol.name(),
                other.describe()
            );
        }
        let advertised_host = match advertised_host {
            Some(h) => h.to_string(),
            None if host.is_unspecified() => host_name().unwrap_or_else(|| "localhost".into()),
            None => host.to_string(),
        };
        listeners.push(Listener {
            protocol,
            host,
            port,
            advertised_host,
        });
    }
    Ok((listeners, safe_default))
}

/// The TLS settings when a listener is SSL or SASL_SSL: a certificate and
/// key are then required, and client authentication other than `none`
/// needs the CA to check client certificates against. TLS flags without a
/// TLS listener are refused too (they would silently do nothing).
fn resolve_tls(listeners: &[Listener], a: &ServeArgs) -> anyhow::Result<Option<TlsSettings>> {
    let client_auth = a.tls_client_auth.unwrap_or_default();
    let Some(tls_listener) = listeners.iter().find(|l| l.protocol.is_tls()) else {
        anyhow::ensure!(
            a.tls_cert.is_none()
                && a.tls_key.is_none()
                && a.tls_client_ca.is_none()
                && a.tls_client_auth.is_none(),
            "--tls-cert, --tls-key, --tls-client-ca and --tls-client-auth apply to SSL and SASL_SSL listeners, and none is configured"
        );
        return Ok(None);
    };
    let (Some(cert), Some(key)) = (a.tls_cert.clone(), a.tls_key.clone()) else {
        anyhow::bail!(
            "listener {} needs a certificate and its key: --tls-cert PATH and --tls-key PATH (PEM)",
            tls_listener.describe()
        );
    };
    anyhow::ensure!(
        client_auth == TlsClientAuth::None || a.tls_client_ca.is_some(),
        "--tls-client-auth {}: needs --tls-client-ca PATH (the CA certificates client certificates must chain to)",
        if client_auth == TlsClientAuth::Required { "required" } else { "requested" }
    );
    Ok(Some(TlsSettings {
        cert,
        key,
        client_ca: a.tls_client_ca.clone(),
        client_auth,
    }))
}

fn host_name() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into buf.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len()) };
    if rc != 0 {
        return None;
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let name = String::from_utf8_lossy(&buf[..end]).into_owned();
    (!name.is_empty()).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_override_file_and_defaults_fill_the_rest() {
        let file: ServeArgs =
            toml::from_str("port = 19092\ncores = 2\nnum-partitions = 3\n").unwrap();
        let cli = ServeArgs {
            cores: Some(1),
            listen: Some("127.0.0.1".parse().unwrap()),
            ..Default::default()
        };
        let merged = cli.overlay(file);
        assert_eq!(merged.port, Some(19092));
        assert_eq!(merged.cores, Some(1));
        assert_eq!(merged.num_partitions, Some(3));
        let c = merged.resolve().unwrap();
        assert_eq!(c.advertised_host, "127.0.0.1");
        assert_eq!(c.data_dir, PathBuf::from("./data"));
        assert_eq!(c.node_id_of(1), 1);
        assert_eq!(c.shard_of_node(0), Some(0));
        assert_eq!(c.shard_of_node(1), None);
        assert_eq!(c.message_max_bytes, MESSAGE_MAX_BYTES_DEFAULT);
    }

    /// `fjord serve ARGS` as clap parses it.
    fn serve_args(args: &[&str]) -> ServeArgs {
        #[derive(clap::Parser)]
        struct Serve {
            #[command(flatten)]
            args: ServeArgs,
        }
        let argv = std::iter::once("serve").chain(args.iter().copied());
        <Serve as clap::Parser>::try_parse_from(argv).unwrap().args
    }

    #[test]
    fn controller_quorum_flags_are_validated() {
        let resolve = |args: &[&str]| serve_args(args).overlay(ServeArgs::default()).resolve();
        let err = |args: &[&str]| resolve(args).unwrap_err().to_string();
        assert_eq!(resolve(&[]).unwrap().quorum, None, "a quorum of one");
        let three = "1@h1:9093,2@h2:9093,3@[::1]:9094";
        let c = resolve(&["--node-id", "2", "--controller-quorum", three]).unwrap();
        let q = c.quorum.unwrap();
        assert!(q.is_voter() && !q.is_single_node());
        assert_eq!(q.listen, ("h2".to_string(), 9093));
        assert_eq!(q.voters[2].host, "::1");
        let q = resolve(&[
            "--node-id",
            "7",
            "--controller-quorum",
            three,
            "--controller-listen",
            "h7:9093",
        ])
        .unwrap()
        .quorum
        .unwrap();
        assert!(!q.is_voter(), "a learner");
        assert_eq!(q.listen, ("h7".to_string(), 9093));
        let alone = resolve(&["--node-id", "0", "--controller-quorum", "0@127.0.0.1:9093"])
            .unwrap()
            .quorum
            .unwrap();
        assert!(alone.is_single_node());

        for (args, says) in [
            (vec!["--controller-quorum", three], "needs --node-id"),
            (
                vec!["--node-id", "7", "--controller-quorum", three],
                "a learner needs --controller-listen",
            ),
            (
                vec![
                    "--node-id",
                    "1",
                    "--controller-quorum",
                    "1@h1:9093,1@h2:9093",
                ],
                "node id 1 is listed twice",
            ),
            (
                vec![
                    "--node-id",
                    "1",
                    "--controller-quorum",
                    "1@h1:9093,2@h1:9093",
                ],
                "same address h1:9093",
            ),
            (
                vec!["--node-id", "1", "--controller-quorum", "1@h1"],
                "has no :PORT",
            ),
            (
                vec!["--node-id", "1", "--controller-quorum", "h1:9093"],
                "has no `@`",
            ),
            (
                vec!["--node-id", "1", "--controller-quorum", "x@h1:9093"],
                "node id",
            ),
            (
                vec!["--node-id", "1", "--controller-quorum", "1@h1:0"],
                "valid port",
            ),
            (
                vec![
                    "--node-id",
                    "1",
                    "--controller-quorum",
                    "1@h1:9093",
                    "--controller-listen",
                    "h1:9094",
                ],
                "does not match node 1's entry",
            ),
            (
                vec![
                    "--node-id",
                    "9",
                    "--controller-quorum",
                    "1@h1:9093",
                    "--controller-listen",
                    "h1:9093",
                ],
                "is node 1's address",
            ),
            (
                vec!["--controller-listen", "h1:9093"],
                "only meaningful with --controller-quorum",
            ),
        ] {
            let e = err(&args);
            assert!(e.contains(says), "{args:?}: {e}");
        }
    }

    #[test]
    fn durability_flags_reach_the_broker_config() {
        let resolve = |cli: ServeArgs, file: &str| {
            let file: ServeArgs = toml::from_str(file).unwrap();
            cli.overlay(file).resolve().unwrap()
        };
        let c = resolve(serve_args(&[]), "");
        assert!(
            !c.direct_writes && !c.fsync_acks,
            "Kafka's default: neither"
        );
        let c = resolve(serve_args(&["--direct-writes"]), "");
        assert!(c.direct_writes && !c.fsync_acks);
        let c = resolve(serve_args(&["--fsync-acks"]), "");
        assert!(c.fsync_acks && !c.direct_writes);
        let c = resolve(serve_args(&[]), "direct-writes = true\nfsync-acks = true\n");
        assert!(c.direct_writes && c.fsync_acks, "from the file");
        let c = resolve(
            serve_args(&["--direct-writes=false"]),
            "direct-writes = true\n",
        );
        assert!(!c.direct_writes, "the flag wins over the file");
    }

    #[test]
    fn catch_up_reads_default_to_direct_and_take_sendfile() {
        let resolve = |cli: ServeArgs, file: &str| {
            let file: ServeArgs = toml::from_str(file).unwrap();
            cli.overlay(file).resolve().unwrap()
        };
        let c = resolve(serve_args(&[]), "");
        assert_eq!(c.catch_up_reads, CatchUpReads::Direct);
        let c = resolve(serve_args(&["--catch-up-reads", "sendfile"]), "");
        assert_eq!(c.catch_up_reads, CatchUpReads::Sendfile);
        let c = resolve(serve_args(&[]), "catch-up-reads = \"sendfile\"\n");
        assert_eq!(c.catch_up_reads, CatchUpReads::Sendfile, "from the file");
        let c = resolve(
            serve_args(&["--catch-up-reads", "direct"]),
            "catch-up-reads = \"sendfile\"\n",
        );
        assert_eq!(c.catch_up_reads, CatchUpReads::Direct, "the flag wins");
        assert!(toml::from_str::<ServeArgs>("catch-up-reads = \"mmap\"\n").is_err());
    }

    #[test]
    fn listeners_default_to_loopback_and_take_kafkas_spelling() {
        let resolve = |cli: &[&str], file: &str| {
            let file: ServeArgs = toml::from_str(file).unwrap();
            serve_args(cli).overlay(file).resolve()
        };
        let c = resolve(&["--cores", "2"], "").unwrap();
        assert_eq!(c.listeners.len(), 1);
        assert_eq!(c.listeners[0].describe(), "PLAINTEXT://127.0.0.1:9092");
        assert!(c.listen_is_safe_default && !c.authentication_configured());
        let c = resolve(&["--cores", "2", "--listen", "0.0.0.0"], "").unwrap();
        assert!(!c.listen_is_safe_default);
        let c = resolve(
            &["--cores", "2", "--listener", "SASL_PLAINTEXT://:9192"],
            "",
        )
        .unwrap();
        assert_eq!(c.listeners.len(), 1, "no shorthand listener unless asked");
        assert_eq!(c.listeners[0].protocol, SecurityProtocol::SaslPlaintext);
        assert!(c.listeners[0].host.is_unspecified());
        assert!(c.authentication_configured());
        let c = resolve(
            &["--cores", "2", "--port", "9092"],
            "listener = [\"SASL_PLAINTEXT://127.0.0.1:9192\"]\n",
        )
        .unwrap();
        assert_eq!(
            c.listeners.iter().map(|l| l.describe()).collect::<Vec<_>>(),
            [
                "PLAINTEXT://127.0.0.1:9092",
                "SASL_PLAINTEXT://127.0.0.1:9192"
            ]
        );
        for bad in ["HTTP://:80", "PLAINTEXT//:9093", "PLAINTEXT://:x"] {
            assert!(resolve(&["--listener", bad], "").is_err(), "{bad}");
        }
        let e = resolve(
            &[
                "--cores",
                "2",
                "--port",
                "9092",
                "--listener",
                "SASL_PLAINTEXT://:9093",
            ],
            "",
        )
        .unwrap_err();
        assert!(e.to_string().contains("overlap"), "{e}");
        let e = resolve(&["--listener", "SSL://:9093"], "").unwrap_err();
        assert!(
            e.to_string().contains("--tls-cert PATH and --tls-key PATH"),
            "{e}"
        );
        assert!(resolve(&["--sasl-enabled-mechanisms", "GSSAPI"], "").is_err());
    }

    #[test]
    fn tls_listeners_need_a_certificate_and_client_auth_needs_a_ca() {
        let resolve = |cli: &[&str], file: &str| {
            let file: ServeArgs = toml::from_str(file).unwrap();
            serve_args(cli).overlay(file).resolve()
        };
        let tls = ["--listener", "SASL_SSL://:9093", "--tls-cert", "c.pem"];
        let e = resolve(&tls, "").unwrap_err();
        assert!(
            e.to_string().contains("SASL_SSL://0.0.0.0:9093 needs"),
            "{e}"
        );
        let c = resolve(&[&tls[..], &["--tls-key", "k.pem"]].concat(), "").unwrap();
        let t = c.tls.unwrap();
        assert_eq!(t.client_auth, TlsClientAuth::None);
        assert_eq!(t.key, PathBuf::from("k.pem"));
        let e = resolve(
            &[
                &tls[..],
                &["--tls-key", "k.pem", "--tls-client-auth", "required"],
            ]
            .concat(),
            "",
        )
        .unwrap_err();
        assert!(e.to_string().contains("--tls-client-ca"), "{e}");
        let c = resolve(
            &["--listener", "SSL://:9093", "--tls-client-auth", "required"],
            "tls-cert = \"c.pem\"\ntls-key = \"k.pem\"\ntls-client-ca = \"ca.pem\"\n",
        )
        .unwrap();
        assert_eq!(c.tls.as_ref().unwrap().client_auth, TlsClientAuth::Required);
        assert!(c.authentication_configured());
        let e = resolve(&["--tls-cert", "c.pem"], "").unwrap_err();
        assert!(e.to_string().contains("none is configured"), "{e}");
    }

    #[test]
    fn unknown_file_keys_are_rejected() {
        assert!(toml::from_str::<ServeArgs>("prot = 1\n").is_err());
    }
}
