//! The partition log: Kafka's on-disk layout written with direct I/O (and,
//! for small writes of logs that never fdatasync, through the page cache).
//!
//! What this module owns: every partition log of one shard
//! ([`LogManager`]), each one a [`PartitionLog`] made of segments
//! (`<data-dir>/<topic>-<partition>/<base-offset:020>.log|.index|.timeindex`,
//! byte-compatible with Kafka), the per-shard [`TailCache`], and the shard's
//! checkpoint files (`checkpoint.rs` says why they are per shard).
//!
//! Offsets, per log: log start ≤ high watermark ≤ log end, with
//! `written ≤ log end` (bytes handed to the device or the page cache,
//! survive kill -9) and `durable ≤ written` (covered by fdatasync). The HW is `written`, or
//! `durable` under `--fsync-acks`, so consumers never see data a crash could
//! take back; a replicated partition's log bounds it further by the HW set
//! from outside (the ISR's, or the leader's for a follower: `replica`).
//! A follower appends the leader's batches unchanged (`replica`) and
//! truncates a diverged tail (`truncate`). The last stable offset equals the HW until transactions land.
//!
//! Durability corners (details in `writer`, `syncer`, `partition_meta` and
//! `checkpoint`): a log that fdatasyncs fsyncs the partition directory
//! after creating or renaming a segment file, before anything in it can be
//! acknowledged; a writer out of file descriptors at a roll retries instead
//! of failing the log (appends answer a retriable error meanwhile); every
//! partition directory names its topic id in `partition.metadata`, so a
//! deleted topic's directory left by a crash is never read as the data of
//! a new topic of the same name; checkpoint files are renamed into place
//! and their directory fsynced, an error if that fails.
//!
//! Threading: a log lives on exactly one shard; all state is `Cell`/
//! `RefCell` behind `Rc` (!Send). Writes are staged synchronously by
//! `append` and issued by a per-log writer task; fsyncs by a per-log syncer
//! task (group commit). Background work (retention, flush.ms, checkpoints)
//! runs in a separate task queue given to [`LogManager::start_background`].

pub(crate) mod ahead;
mod appender;
pub mod cache;
pub mod changes;
pub mod checkpoint;
pub mod cleaner;
pub mod compact;
mod copy;
mod direct;
pub mod dump;
pub mod index;
mod iobuf;
pub mod leader_epoch;
mod manager;
mod partition;
pub mod partition_meta;
mod reader;
pub mod records;
mod recovery;
mod replica;
mod retention;
pub(crate) mod segment;
pub mod storage;
mod syncer;
mod truncate;
pub(crate) mod watch;
mod write_step;
mod writer;

pub use cache::{TailCache, TAIL_CACHE_DEFAULT_BYTES};
pub use manager::{LogManager, HW_CHECKPOINT_INTERVAL_MS, RETENTION_CHECK_INTERVAL_DEFAULT_MS};
pub use partition::{DirSync, PartitionLog};

use crate::record::RecordsChunk;
use crate::types::{LogEndOffset, LogStartOffset, Offset};

/// Kafka's `segment.bytes` default: 1 GiB.
pub const SEGMENT_DEFAULT_BYTES: u64 = 1 << 30;
/// Kafka's `segment.ms` and `retention.ms` default: 7 days.
pub const SEVEN_DAYS_MS: i64 = 7 * 24 * 60 * 60 * 1000;
/// Kafka's `index.interval.bytes` default.
pub const INDEX_INTERVAL_DEFAULT_BYTES: u32 = 4096;
/// Kafka's `segment.index.bytes` default: 10 MiB.
pub const SEGMENT_INDEX_DEFAULT_BYTES: u32 = 10 << 20;
/// Staging chunk of the direct-I/O appender: 16 KiB (Redpanda's append_chunk_size).
pub const WRITE_CHUNK_DEFAULT_BYTES: usize = 16 << 10;
/// Largest staging chunk: a batch that fills several `write_chunk_bytes`
/// chunks is staged in chunks of up to this size.
pub const STAGING_CHUNK_MAX_BYTES: usize = 1 << 20;
/// Full chunks that follow on one another go to the device as one direct
/// write (`pwritev`) of up to this many bytes: one request and one virtio
/// doorbell instead of one per chunk.
pub const DIRECT_WRITE_MAX_BYTES: usize = 4 << 20;
/// Chunks one direct write takes at most.
pub const DIRECT_WRITE_MAX_CHUNKS: usize = 64;
/// fallocate step ahead of the writer: 32 MiB.
pub const PREALLOCATE_DEFAULT_BYTES: u64 = 32 << 20;
/// Direct writes of one log issued at once (each a run of full chunks, or
/// of the partially filled last chunk, or both; at most one covers that
/// last chunk); the shard's direct-write threads run
/// `direct::DIRECT_WRITE_THREADS` of them at a time.
pub const WRITES_IN_FLIGHT_MAX: usize = 64;
/// fdatasyncs of one log's group-commit syncer running at once, each on an
/// open file description of its own: an append that arrives while one runs
/// starts its own instead of waiting for that one to end (`syncer`).
pub const SYNCS_IN_FLIGHT_MAX: usize = 2;
/// A log written through the page cache starts the kernel's write-back each
/// time this much more has been written (see `writer`).
pub const WRITEBACK_KICK_BYTES: u64 = 8 << 20;
/// Staging and write buffers one shard maps at most (`iobuf`): 32 MiB.
pub const IO_ARENA_BYTES_MAX: usize = 32 << 20;
/// Logs that fdatasync keep this much space ahead of their data written
/// (zeros or old data), so that data writes convert no extents: 4 MiB.
pub const PREZERO_AHEAD_BYTES: u64 = 4 << 20;
/// One pre-zeroing write: 1 MiB (one extent conversion per MiB).
pub const PREZERO_WRITE_BYTES: u64 = 1 << 20;
/// Files of deleted segments a log keeps for reuse by later rolls.
pub const SPARE_SEGMENT_FILES_MAX: usize = 2;
/// Direct-I/O write granularity; a multiple of every device's logical block.
pub const PAGE_BYTES: u64 = 4096;
/// First pause of a log writer that ran out of file descriptors before it
/// retries (`writer`'s module doc); each retry that fails doubles it...
pub const FD_RETRY_FIRST_MS: u64 = 10;
/// ...up to this.
pub const FD_RETRY_MAX_MS: u64 = 500;

/// How a fetch reads data that is no longer in the tail cache
/// (`fjord serve --catch-up-reads`; the default and why are in
/// `config::CATCH_UP_READS_DEFAULT`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum CatchUpReads {
    /// Direct (O_DIRECT) reads into the shard's I/O memory, with read-ahead,
    /// written to the socket by the connection (`net::file_range`,
    /// `log::ahead`).
    #[default]
    Direct,
    /// `sendfile(2)` from the page cache through a buffered descriptor of
    /// the segment, on the shard's blocking thread (`net::sendfile`); no
    /// read-ahead of fjord's own (the kernel's page-cache read-ahead
    /// applies). Batch headers are still found with direct reads.
    Sendfile,
}

/// Per-topic log configuration; defaults are Kafka's.
#[derive(Clone, Debug, PartialEq)]
pub struct LogConfig {
    pub segment_bytes: u64,
    pub segment_ms: i64,
    /// -1 = keep forever.
    pub retention_ms: i64,
    /// -1 = unlimited.
    pub retention_bytes: i64,
    pub index_interval_bytes: u32,
    /// Largest `.index`/`.timeindex`; the segment rolls when one would exceed it.
    pub segment_index_bytes: u32,
    /// fsync after this many unflushed messages (i64::MAX = never).
    pub flush_messages: i64,
    /// fsync when the oldest unflushed data is this old (i64::MAX = never).
    pub flush_ms: i64,
    /// `--fsync-acks`: the HW only covers fdatasync'ed data.
    pub fsync_acks: bool,
    /// `--direct-writes`: O_DIRECT writes even for a log that never syncs.
    pub direct_writes: bool,
    pub write_chunk_bytes: usize,
    pub preallocate_bytes: u64,
    /// `--catch-up-reads`: how reads past the tail cache reach the socket.
    pub catch_up_reads: CatchUpReads,
    /// The leader epoch this node leads the partition in (the broker's
    /// current one, `types::FIRST_LEADER_EPOCH`): recovery starts it at the
    /// log end and every append stamps it, unless the log holds a newer
    /// epoch (a replica that followed a newer leader), which is then kept
    /// and stamped. Read at open only; a later `set_config` cannot change
    /// the epoch of an open log: `PartitionLog::become_leader` does.
    pub leader_epoch: i32,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            segment_bytes: SEGMENT_DEFAULT_BYTES,
            segment_ms: SEVEN_DAYS_MS,
            retention_ms: SEVEN_DAYS_MS,
            retention_bytes: -1,
            index_interval_bytes: INDEX_INTERVAL_DEFAULT_BYTES,
            segment_index_bytes: SEGMENT_INDEX_DEFAULT_BYTES,
            flush_messages: i64::MAX,
            flush_ms: i64::MAX,
            fsync_acks: false,
            direct_writes: false,
            write_chunk_bytes: WRITE_CHUNK_DEFAULT_BYTES,
            preallocate_bytes: PREALLOCATE_DEFAULT_BYTES,
            catch_up_reads: CatchUpReads::Direct,
            leader_epoch: crate::types::FIRST_LEADER_EPOCH,
        }
    }
}

impl LogConfig {
    /// The log fdatasyncs by itself: `--fsync-acks`, `flush.messages` or
    /// `flush.ms`.
    pub fn syncs(&self) -> bool {
        self.fsync_acks || self.flush_messages != i64::MAX || self.flush_ms != i64::MAX
    }

    /// Small writes go through the page cache rather than O_DIRECT (see
    /// `writer`'s module doc): every log unless `direct_writes`, also
    /// logs that fdatasync (their fdatasync covers the page cache).
    pub fn page_cache_writes(&self) -> bool {
        !self.direct_writes
    }
}

/// Where an appended batch landed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AppendInfo {
    pub base_offset: Offset,
    pub last_offset: Offset,
    pub log_start_offset: LogStartOffset,
}

/// Whole batches for a fetch, in offset order.
#[derive(Clone, Debug, Default)]
pub struct ReadResult {
    pub chunks: Vec<RecordsChunk>,
    pub bytes: usize,
}

/// Errors of the log layer (mapped to Kafka error codes by the handlers).
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("offset out of range: log start {log_start}, log end {log_end}")]
    OffsetOutOfRange {
        log_start: LogStartOffset,
        log_end: LogEndOffset,
    },
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    #[error("corrupt log: {0}")]
    Corrupt(String),
    #[error("invalid batch: {0}")]
    InvalidBatch(#[from] crate::record::BatchError),
    /// An earlier write or fsync failed; the log refuses further work
    /// (Kafka marks the log directory offline: KAFKA_STORAGE_ERROR).
    #[error("log failed after an earlier i/o error: {0}")]
    Failed(String),
    /// The log's writer is out of file descriptors (EMFILE, ENFILE) and
    /// retries (`writer`'s module doc): nothing is lost and the log
    /// works again once descriptors are free, so unlike `Failed` this
    /// lasts only as long as the shortage.
    #[error("log temporarily unavailable: {0}")]
    Unavailable(String),
    #[error("log is closed")]
    Closed,
    /// A replica append (`PartitionLog::append_replica`) of a batch whose
    /// base offset lies below the log end: it would overwrite or overlap
    /// what the log holds. Nothing was written.
    #[error("replica batch at offset {base} is below the log end {log_end}")]
    OffsetBelowLogEnd { base: i64, log_end: i64 },
    /// A batch or a new leadership in a leader epoch older than the
    /// newest the log holds (`latest`); nothing was written.
    #[error("leader epoch {epoch} is older than the log's latest epoch {latest}")]
    StaleLeaderEpoch { epoch: i32, latest: i32 },
    /// The offset waited for was truncated away (`PartitionLog::truncate_to`)
    /// before it was written or synced: it must not be acknowledged.
    #[error("offset {offset} was truncated from the log (log end now {log_end})")]
    Truncated { offset: i64, log_end: i64 },
    /// A truncation of the log runs; appends are refused until it ends.
    #[error("the log is being truncated")]
    Truncating,
}

impl LogError {
    /// `e`, as `Unavailable` when it says the process or the system is out
    /// of file descriptors (a shortage that passes), else as `Io`.
    pub(crate) fn from_io(e: std::io::Error) -> LogError {
        if out_of_fds(e.raw_os_error()) {
            LogError::Unavailable(format!("out of file descriptors: {e}"))
        } else {
            LogError::Io(e)
        }
    }

    /// The error is a shortage of file descriptors (see `Unavailable`).
    pub fn is_temporary(&self) -> bool {
        matches!(self, LogError::Unavailable(_))
    }
}

/// EMFILE (the process's RLIMIT_NOFILE) or ENFILE (the system's file table).
pub(crate) fn out_of_fds(errno: Option<i32>) -> bool {
    matches!(errno, Some(libc::EMFILE) | Some(libc::ENFILE))
}

/// fsyncs directory `dir`, so that the entries created, renamed or removed
/// in it survive a power loss (blocking: run it off the reactor).
pub fn sync_dir(dir: &std::path::Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

pub(crate) use crate::clock::now_ms;

/// `--debug-write-delay-ms` (testing only; 0 = off): every segment write
/// waits this long first. Process-wide, set by each shard at start.
static DEBUG_WRITE_DELAY_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

pub fn set_debug_write_delay_ms(ms: u64) {
    DEBUG_WRITE_DELAY_MS.store(ms, std::sync::atomic::Ordering::Relaxed);
}

pub(crate) fn debug_write_delay_ms() -> u64 {
    DEBUG_WRITE_DELAY_MS.load(std::sync::atomic::Ordering::Relaxed)
}
