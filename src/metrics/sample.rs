//! What one shard reports to a scrape: plain owned values (`Send`), built
//! on the shard from its probes and state, merged on the endpoint's shard.

use super::HistogramSample;

/// One shard's values at one scrape.
#[derive(Debug, Clone, Default)]
pub struct ShardSample {
    pub shard: usize,
    /// The shard has applied its first metadata image (its logs are
    /// recovered) and listens.
    pub ready: bool,
    /// No `__consumer_offsets` partition of this shard is still loading.
    pub coordinators_loaded: bool,
    pub apis: Vec<ApiSample>,
    /// Error codes in responses (those counted at least once).
    pub errors: Vec<ErrorSample>,
    pub connections_open: u64,
    pub connections_accepted: u64,
    pub connections_closed: u64,
    pub connections_refused: u64,
    pub inflight_requests: u64,
    pub log: LogSample,
    pub partitions: Vec<PartitionSample>,
    /// Groups this shard coordinates, by state name.
    pub groups_by_state: Vec<(&'static str, u64)>,
    pub group_members: u64,
    pub rebalances: u64,
    pub committed: Vec<CommittedSample>,
    /// Transactions in Ongoing or Prepare* at this shard's coordinator.
    pub open_transactions: u64,
    pub transactional_ids: u64,
    pub markers: u64,
    pub fenced_producers: u64,
    /// Durations of transactions completed at this shard's coordinator.
    pub txn_committed: HistogramSample,
    pub txn_aborted: HistogramSample,
    pub producer_ids_left: u64,
    pub producer_id_blocks: u64,
    /// This shard's thread's CPU time.
    pub cpu_seconds: f64,
    pub executor_tasks: u64,
    pub executor_scheduler_runs: u64,
    /// Time glommio's task queues ran, by queue name.
    pub task_queue_runtime_seconds: Vec<(String, f64)>,
    pub io_memory_bytes: u64,
    pub io: IoSample,
}

/// glommio's file I/O counters of one shard (its `RingIoStats`, all rings
/// summed): (operations, bytes) pairs.
#[derive(Debug, Clone, Default)]
pub struct IoSample {
    pub files_opened: u64,
    pub files_closed: u64,
    /// O_DIRECT reads through io_uring.
    pub direct_reads: (u64, u64),
    /// Reads of files opened buffered (through the page cache).
    pub buffered_reads: (u64, u64),
    /// Reads glommio answered from a read already in flight for the same range.
    pub deduped_reads: (u64, u64),
    pub direct_writes: (u64, u64),
    pub buffered_writes: (u64, u64),
}

/// One API key's counters on one shard.
#[derive(Debug, Clone, Default)]
pub struct ApiSample {
    pub api_key: i16,
    pub requests: u64,
    pub closed: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub total: HistogramSample,
    pub queue: HistogramSample,
    pub local: HistogramSample,
    pub remote: HistogramSample,
    pub send: HistogramSample,
}

/// How often one API's responses carried one error code on one shard.
#[derive(Debug, Clone, Default)]
pub struct ErrorSample {
    pub api_key: i16,
    /// `None`: a code outside the counted range (`ERROR_CODES_MAX`).
    pub code: Option<i16>,
    pub count: u64,
}

/// One shard's log counters and gauges.
#[derive(Debug, Clone, Default)]
pub struct LogSample {
    pub appends: u64,
    pub append_bytes: u64,
    pub fsyncs: u64,
    pub fsync: HistogramSample,
    pub fsync_batch_appends: HistogramSample,
    pub cache_hits: u64,
    pub cache_hit_bytes: u64,
    pub cache_misses: u64,
    pub cache_used_bytes: u64,
    pub cache_capacity_bytes: u64,
    pub catch_up_read_bytes: u64,
    pub cleanings: u64,
    pub cleaner_read_bytes: u64,
    pub cleaner_written_bytes: u64,
    pub cleaner_seconds: f64,
    pub cleaner_last_dirty_ratio: f64,
    /// Bytes appended and not yet written to segment files.
    pub unwritten_bytes: u64,
    /// Seconds from the shard's start to its first metadata image applied
    /// (every partition it leads opened and recovered).
    pub recovery_seconds: f64,
}

/// One partition this shard leads.
#[derive(Debug, Clone, Default)]
pub struct PartitionSample {
    pub topic: String,
    pub partition: i32,
    pub log_start: i64,
    pub high_watermark: i64,
    pub last_stable: i64,
    pub log_end: i64,
    pub size_bytes: u64,
    pub segments: u64,
}

/// A committed offset of a group this shard coordinates.
#[derive(Debug, Clone, Default)]
pub struct CommittedSample {
    pub group: String,
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

/// Process-wide values, read on the endpoint's shard.
#[derive(Debug, Clone, Default)]
pub struct ProcessSample {
    pub resident_bytes: u64,
    pub open_fds: u64,
    pub start_time_seconds: f64,
    /// Shards that did not answer the scrape in time (their series are
    /// left out, not reported as zeros a rate() would read as a reset).
    pub shards_missing: u64,
}

impl ProcessSample {
    /// Reads `/proc/self` (0 for what cannot be read).
    pub fn read(start_time_seconds: f64) -> ProcessSample {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as u64;
        let resident_bytes = std::fs::read_to_string("/proc/self/statm")
            .ok()
            .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
            .map_or(0, |pages| pages * page);
        let open_fds = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64);
        ProcessSample {
            resident_bytes,
            open_fds,
            start_time_seconds,
            shards_missing: 0,
        }
    }
}
