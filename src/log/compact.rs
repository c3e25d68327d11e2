//! The log cleaner's file work and its crash-safe swap (issue 26): what
//! `cleaner` decides, done to a log's sealed segments.
//!
//! Where the work runs: reading segments, building the key → offset map,
//! rewriting batches and writing the cleaned files is CPU and I/O that
//! takes seconds for a large log, so it never runs on a shard's reactor.
//! It runs on the process's cleaner threads (`--log-cleaner-threads`,
//! Kafka's `log.cleaner.threads`, 1 by default), shared by every shard,
//! in the kernel's `SCHED_IDLE` class (`nice` 10 where that is refused): a
//! cleaner thread runs only on CPU time no shard wants, and a shard that
//! wakes up takes its core back at once; its reads and writes are capped
//! by `log.cleaner.io.max.bytes.per.second`. A shard hands it a
//! [`CleanJob`] (plain data: paths, offsets, the aborted transactions and
//! the producers' last offsets, all taken from the partition on the shard)
//! and awaits the [`CleanOutcome`]; the segment map is touched only on the
//! shard, by [`PartitionLog::swap_cleaned`].
//!
//! The job (Kafka's `Cleaner.doClean`): map the dirty section
//! `[first_dirty, first_uncleanable)` (several passes if the map fills: the
//! pass ends at the map's latest offset, which becomes the next first
//! dirty offset), then rewrite every sealed segment from the log start
//! that overlaps `[0, end)` in groups (`cleaner::group_segments`), each
//! group into one file `<base>.log.cleaned` with its `.index.cleaned`,
//! `.timeindex.cleaned` and `.txnindex.cleaned` (the group's aborted
//! transaction entries, merged), all fdatasynced.
//!
//! The swap, crash-safe (Kafka's `.cleaned` → `.swap` → rename):
//! 1. (cleaner thread) the `.cleaned` files are written and synced. A
//!    crash now leaves the old segments; recovery deletes `*.cleaned`.
//! 2. (shard) the group's old segments must still be in the log (retention
//!    or a deletion may have removed them meanwhile: then the cleaned files
//!    are dropped). Their read descriptors are opened, so a fetch holding
//!    an old segment keeps reading the old bytes after the rename; the new
//!    file's are opened from its `.cleaned` name. The segment map then
//!    takes the new segment in place of the group, and the tail cache
//!    drops what it held of the group's offsets.
//! 3. (blocking thread) the index files are renamed `.cleaned` → `.swap`,
//!    then the log to `<base>-<end>.swap` — the commit point: `end` is
//!    where the group ended, so recovery knows which old segments it
//!    replaces even when the cleaned file's last batch ends far below it —
//!    and the directory fsynced. Then [`finish_swap`]: the group's old
//!    files are deleted, the `.swap` files renamed to their final names,
//!    the directory fsynced. A crash anywhere in 3 leaves either no
//!    `<base>-<end>.swap` (recovery deletes stray index `.swap` files: the
//!    old segments are intact) or one (recovery runs `finish_swap` again,
//!    which is idempotent). Never both and never neither.
//!    While 3 runs, the new segment is not `sealed`, so retention and
//!    DeleteRecords, which delete only sealed segments, leave it alone.
//!
//! Offsets: every kept record keeps its offset; the cleaned segment keeps
//! the group's first base offset and ends where the group ended (its
//! `next_offset`), so the chain of segments is unchanged. The log start,
//! the HW, the LSO and the log end never move: only sealed segments below
//! the first uncleanable offset (≤ LSO ≤ HW) are rewritten.

use super::cleaner::{self, Mapped, OffsetMap, SegmentCleaning, SegmentSize, TxnTracker};
use super::partition::PartitionLog;
use super::segment::{Segment, SegmentIndexes};
use super::LogError;
use crate::record::batch::BatchHeader;
use crate::record::BatchIter;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::mpsc;

/// What the cleaner reads of a segment at a time: 1 MiB (more for a
/// larger batch).
pub const CLEANER_READ_WINDOW_BYTES: usize = 1 << 20;
/// Bound on one batch's decompressed records while cleaning (a batch that
/// inflates further fails the cleaning of its log, logged; nothing else).
pub const CLEANER_DECOMPRESSED_BATCH_MAX_BYTES: usize = 256 << 20;
/// The cleaner threads' nice value where `SCHED_IDLE` is refused.
const CLEANER_NICE: i32 = 10;
/// Suffix of a file the cleaner is writing.
pub const CLEANED_SUFFIX: &str = ".cleaned";
/// Suffix of a committed, not yet finished swap.
pub const SWAP_SUFFIX: &str = ".swap";
/// Bytes per `.txnindex` entry (Kafka's layout; `producer::txn_index`
/// reads and writes them, this module only carries whole entries over).
pub const TXN_INDEX_ENTRY_BYTES: usize = 34;
/// Index files a cleaned segment comes with.
const INDEX_EXTS: [&str; 3] = ["index", "timeindex", "txnindex"];

/// A sealed segment as the cleaner thread reads it.
#[derive(Clone, Debug)]
pub struct SegmentFile {
    pub base_offset: i64,
    /// Where the next segment begins.
    pub next_offset: i64,
    pub bytes: u64,
    pub path: PathBuf,
}

/// One cleaning of one log, as the shard hands it to the cleaner thread.
#[derive(Debug)]
pub struct CleanJob {
    pub dir: PathBuf,
    /// Every sealed segment from the log start up to the first uncleanable
    /// offset, in order.
    pub segments: Vec<SegmentFile>,
    pub first_dirty: i64,
    pub first_uncleanable: i64,
    /// Aborted transactions (producer id, first offset) overlapping the
    /// segments.
    pub aborted: Vec<(i64, i64)>,
    /// Producer id → last offset of its last batch (kept, if only empty).
    pub last_of_producers: HashMap<i64, i64>,
    pub now_ms: i64,
    pub delete_retention_ms: i64,
    pub segment_bytes: u64,
    pub index_interval_bytes: u32,
    pub map_bytes: usize,
    /// `f64::INFINITY`: no cap.
    pub io_max_bytes_per_second: f64,
}

/// One group of old segments rewritten into one file, not yet swapped in.
#[derive(Debug)]
pub struct CleanedGroup {
    pub base_offset: i64,
    /// Where the group (and so the cleaned segment) ends.
    pub end_offset: i64,
    pub old_bases: Vec<i64>,
    pub bytes: u64,
    pub indexes: SegmentIndexes,
}

/// What a cleaning did.
#[derive(Debug, Default)]
pub struct CleanOutcome {
    pub groups: Vec<CleanedGroup>,
    /// The next cleaning's first dirty offset.
    pub end_offset: i64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub keys: usize,
    pub batches_removed: u64,
    pub batches_rewritten: u64,
}

type Task = Box<dyn FnOnce() + Send>;

thread_local! {
    static CLEANER: std::cell::OnceCell<mpsc::Sender<Task>> = const { std::cell::OnceCell::new() };
}

static CLEANER_QUEUE: std::sync::OnceLock<std::sync::Mutex<mpsc::Sender<Task>>> =
    std::sync::OnceLock::new();

/// Starts the process's `threads` cleaner threads (`--log-cleaner-threads`),
/// each in `SCHED_IDLE`, all taking jobs from one queue. A second call, or a
/// job queued before any call (a test of the log alone), finds them
/// started (one thread in the latter case).
pub fn start_cleaner_threads(threads: usize) {
    CLEANER_QUEUE.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Task>();
        let rx = std::sync::Arc::new(std::sync::Mutex::new(rx));
        for i in 0..threads.max(1) {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("log-cleaner-{i}"))
                .spawn(move || {
                    lower_priority();
                    loop {
                        let task = rx.lock().unwrap_or_else(|e| e.into_inner()).recv();
                        match task {
                            Ok(task) => task(),
                            Err(_) => return,
                        }
                    }
                })
                .expect("a log cleaner thread starts");
        }
        std::sync::Mutex::new(tx)
    });
}

/// Puts the calling thread in the `SCHED_IDLE` class (it runs only when
/// no normal thread wants the core, and a shard waking up preempts it at
/// once), or, where that is refused, at `nice` 10.
fn lower_priority() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: both calls change only the calling thread's scheduling, with
    // a parameter that outlives them.
    let idle = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } == 0;
    if idle {
        return;
    }
    // SAFETY: as above.
    let niced = unsafe {
        libc::setpriority(
            libc::PRIO_PROCESS,
            libc::gettid() as libc::id_t,
            CLEANER_NICE,
        )
    } == 0;
    if !niced {
        tracing::warn!("a log cleaner thread runs at the shards' priority");
    }
}

/// The cleaner threads' queue, as this thread's own sender.
fn cleaner_queue() -> mpsc::Sender<Task> {
    CLEANER.with(|c| {
        c.get_or_init(|| {
            start_cleaner_threads(1);
            CLEANER_QUEUE
                .get()
                .expect("started")
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone()
        })
        .clone()
    })
}

/// Runs `job` on the cleaner thread; resolves with its outcome.
pub async fn run_on_cleaner(job: CleanJob) -> Result<CleanOutcome, LogError> {
    let (tx, rx) = futures::channel::oneshot::channel();
    cleaner_queue()
        .send(Box::new(move || {
            let _ = tx.send(clean(&job));
        }))
        .map_err(|_| LogError::Corrupt("the log cleaner thread is gone".into()))?;
    rx.await
        .map_err(|_| LogError::Corrupt("the log cleaner dropped a job".into()))?
}

/// Paces the cleaner's I/O to `io.max.bytes.per.second`.
struct Throttle {
    rate: f64,
    started: std::time::Instant,
    bytes: std::cell::Cell<f64>,
}

impl Throttle {
    fn new(rate: f64) -> Throttle {
        Throttle {
            rate,
            started: std::time::Instant::now(),
            bytes: std::cell::Cell::new(0.0),
        }
    }

    fn account(&self, bytes: u64) {
        if !self.rate.is_finite() {
            return;
        }
        self.bytes.set(self.bytes.get() + bytes as f64);
        let due = std::time::Duration::from_secs_f64(self.bytes.get() / self.rate);
        let elapsed = self.started.elapsed();
        if due > elapsed {
            std::thread::sleep(due - elapsed);
        }
    }
}

/// Calls `f` with runs of whole batches of `seg`, in order, each run at most
/// a read window (or one batch, if larger). An unreadable or corrupt batch
/// ends the walk with an error.
fn for_each_run(
    seg: &SegmentFile,
    throttle: &Throttle,
    f: &mut dyn FnMut(&[u8]) -> Result<bool, LogError>,
) -> Result<(), LogError> {
    let file = std::fs::File::open(&seg.path)?;
    let mut pos = 0u64;
    let mut window = CLEANER_READ_WINDOW_BYTES;
    let mut buf = Vec::new();
    while pos < seg.bytes {
        let n = (window as u64).min(seg.bytes - pos) as usize;
        buf.resize(n, 0);
        file.read_exact_at(&mut buf, pos)?;
        throttle.account(n as u64);
        let mut iter = BatchIter::new(&buf);
        let whole = iter
            .by_ref()
            .last()
            .map_or(0, |(at, h)| at + h.total_size());
        if whole == 0 {
            let corrupt = || {
                LogError::Corrupt(format!(
                    "{}: no whole batch at position {pos}",
                    seg.path.display()
                ))
            };
            // The first batch is larger than the window: read it whole.
            let need = BatchHeader::parse(&buf)
                .map_err(|_| corrupt())?
                .total_size();
            if need <= n || pos + need as u64 > seg.bytes {
                return Err(corrupt());
            }
            window = need;
            continue;
        }
        window = CLEANER_READ_WINDOW_BYTES;
        if !f(&buf[..whole])? {
            return Ok(());
        }
        pos += whole as u64;
    }
    Ok(())
}

fn records_err(seg: &SegmentFile, e: crate::record::RecordsError) -> LogError {
    LogError::Corrupt(format!("{}: {e}", seg.path.display()))
}

/// The whole job (runs on the cleaner thread).
fn clean(job: &CleanJob) -> Result<CleanOutcome, LogError> {
    let throttle = Throttle::new(job.io_max_bytes_per_second);
    let limit = CLEANER_DECOMPRESSED_BATCH_MAX_BYTES;
    // 1. The map over the dirty section.
    let mut map = OffsetMap::new(job.map_bytes);
    let mut tracker = TxnTracker::new(job.aborted.clone());
    let mut full = false;
    for seg in &job.segments {
        if full || seg.base_offset >= job.first_uncleanable {
            break;
        }
        let mut run = |bytes: &[u8]| {
            let mapped =
                cleaner::map_segment(&mut map, bytes, job.first_dirty, &mut tracker, limit)
                    .map_err(|e| records_err(seg, e))?;
            full = mapped == Mapped::Full;
            Ok(!full)
        };
        for_each_run(seg, &throttle, &mut run)?;
    }
    let end_offset = if full {
        map.latest_offset() + 1
    } else {
        job.first_uncleanable
    };
    let mut out = CleanOutcome {
        end_offset,
        keys: map.len(),
        ..CleanOutcome::default()
    };
    // 2. The groups, from the log start.
    let cleanable: Vec<&SegmentFile> = job
        .segments
        .iter()
        .filter(|s| s.base_offset < end_offset)
        .collect();
    let sizes: Vec<SegmentSize> = cleanable
        .iter()
        .map(|s| SegmentSize {
            base_offset: s.base_offset,
            next_offset: s.next_offset,
            bytes: s.bytes,
        })
        .collect();
    let by_base: HashMap<i64, &SegmentFile> =
        cleanable.iter().map(|s| (s.base_offset, *s)).collect();
    let mut tracker = TxnTracker::new(job.aborted.clone());
    let ctx = SegmentCleaning {
        map: &map,
        last_of_producers: &job.last_of_producers,
        now_ms: job.now_ms,
        delete_retention_ms: job.delete_retention_ms,
        limit_bytes: limit,
    };
    for group in cleaner::group_segments(&sizes, job.segment_bytes) {
        let segs: Vec<&SegmentFile> = group.iter().map(|g| by_base[&g.base_offset]).collect();
        let cleaned = clean_group(job, &segs, &ctx, &mut tracker, &throttle, &mut out)?;
        out.groups.push(cleaned);
    }
    Ok(out)
}

/// Rewrites one group into `<base>.log.cleaned` and its index files.
fn clean_group(
    job: &CleanJob,
    segs: &[&SegmentFile],
    ctx: &SegmentCleaning<'_>,
    tracker: &mut TxnTracker,
    throttle: &Throttle,
    out: &mut CleanOutcome,
) -> Result<CleanedGroup, LogError> {
    let base = segs[0].base_offset;
    let end_offset = segs[segs.len() - 1].next_offset;
    let path = cleaned_path(&job.dir, base, "log");
    let mut file =
        std::io::BufWriter::with_capacity(CLEANER_READ_WINDOW_BYTES, std::fs::File::create(&path)?);
    let mut indexes = SegmentIndexes::default();
    let mut position = 0u64;
    let mut buf = Vec::new();
    for seg in segs {
        let mut run = |bytes: &[u8]| {
            buf.clear();
            let stats = cleaner::clean_segment(bytes, ctx, tracker, &mut buf)
                .map_err(|e| records_err(seg, e))?;
            out.bytes_read += stats.bytes_read;
            out.bytes_written += stats.bytes_written;
            out.batches_removed += stats.batches_removed;
            out.batches_rewritten += stats.batches_rewritten;
            for (at, h) in BatchIter::new(&buf) {
                let len = h.total_size() as u64;
                indexes.on_append(
                    base,
                    position + at as u64,
                    &h,
                    len,
                    job.index_interval_bytes,
                );
            }
            file.write_all(&buf)?;
            throttle.account(buf.len() as u64);
            position += buf.len() as u64;
            Ok(true)
        };
        for_each_run(seg, throttle, &mut run)?;
    }
    indexes.final_time_entry(base);
    let file = file
        .into_inner()
        .map_err(|e| LogError::Io(e.into_error()))?;
    file.sync_data()?;
    drop(file);
    // The group's aborted-transaction entries go with it: each
    // `.txnindex` is ordered by last offset and the segments are in order,
    // so the files one after another are too (whole entries only).
    let mut txn = Vec::new();
    for seg in segs {
        let p = job.dir.join(format!("{}.txnindex", stem(seg.base_offset)));
        if let Ok(mut f) = std::fs::File::open(&p) {
            let mut bytes = Vec::new();
            f.read_to_end(&mut bytes)?;
            bytes.truncate(bytes.len() / TXN_INDEX_ENTRY_BYTES * TXN_INDEX_ENTRY_BYTES);
            txn.extend_from_slice(&bytes);
        }
    }
    for (ext, bytes) in [
        ("index", indexes.index.encode()),
        ("timeindex", indexes.time_index.encode()),
        ("txnindex", txn),
    ] {
        let mut f = std::fs::File::create(cleaned_path(&job.dir, base, ext))?;
        f.write_all(&bytes)?;
        f.sync_data()?;
    }
    Ok(CleanedGroup {
        base_offset: base,
        end_offset,
        old_bases: segs.iter().map(|s| s.base_offset).collect(),
        bytes: position,
        indexes,
    })
}

fn stem(base: i64) -> String {
    format!("{base:020}")
}

/// `<base>.<ext>.cleaned`.
pub fn cleaned_path(dir: &Path, base: i64, ext: &str) -> PathBuf {
    dir.join(format!("{}.{ext}{CLEANED_SUFFIX}", stem(base)))
}

/// `<base>.<ext>.swap` of an index file.
fn index_swap_path(dir: &Path, base: i64, ext: &str) -> PathBuf {
    dir.join(format!("{}.{ext}{SWAP_SUFFIX}", stem(base)))
}

/// `<base>-<end>.swap`: the cleaned log of a committed swap.
fn log_swap_path(dir: &Path, base: i64, end: i64) -> PathBuf {
    dir.join(format!("{}-{}{SWAP_SUFFIX}", stem(base), stem(end)))
}

/// Parses `<base>-<end>.swap`.
pub fn parse_log_swap(name: &str) -> Option<(i64, i64)> {
    let (base, end) = name.strip_suffix(SWAP_SUFFIX)?.split_once('-')?;
    Some((base.parse().ok()?, end.parse().ok()?))
}

/// Deletes a cleaning's `.cleaned` files of the segments `bases`
/// (blocking; those that do not exist are skipped).
pub fn discard_cleaned(dir: &Path, bases: &[i64]) {
    for &base in bases {
        for ext in ["log", "index", "timeindex", "txnindex"] {
            let _ = std::fs::remove_file(cleaned_path(dir, base, ext));
        }
    }
}

/// Step 3 of the swap (blocking): commits the cleaned files of `group`
/// and finishes the swap.
fn commit_swap(dir: &Path, base: i64, end: i64, old_bases: &[i64]) -> std::io::Result<()> {
    for ext in INDEX_EXTS {
        std::fs::rename(
            cleaned_path(dir, base, ext),
            index_swap_path(dir, base, ext),
        )?;
    }
    crash_point("before-commit");
    std::fs::rename(
        cleaned_path(dir, base, "log"),
        log_swap_path(dir, base, end),
    )?;
    super::sync_dir(dir)?;
    crash_point("after-commit");
    finish_swap(dir, base, end, old_bases)
}

/// Finishes a committed swap of `<base>-<end>.swap` (blocking, idempotent;
/// recovery runs it for a swap a crash interrupted): deletes the files of
/// every old segment in `[base, end)` (`old_bases` if known, else every
/// `.log` found in that range), renames the index `.swap` files and then
/// the log into place, and fsyncs the directory.
pub fn finish_swap(dir: &Path, base: i64, end: i64, old_bases: &[i64]) -> std::io::Result<()> {
    let mut olds: Vec<i64> = old_bases.to_vec();
    if olds.is_empty() {
        for ent in std::fs::read_dir(dir)?.flatten() {
            let name = ent.file_name();
            let Some(b) = name
                .to_str()
                .and_then(|n| n.strip_suffix(".log"))
                .and_then(|s| s.parse::<i64>().ok())
            else {
                continue;
            };
            if b > base && b < end {
                olds.push(b);
            }
        }
    }
    for &old in olds.iter().filter(|&&b| b != base) {
        // The log last: a crash before it leaves a `.log` in the range, which
        // the next attempt finds and deletes again.
        for ext in ["index", "timeindex", "txnindex", "log"] {
            let p = dir.join(format!("{}.{ext}", stem(old)));
            match std::fs::remove_file(&p) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
    }
    crash_point("mid-finish");
    for ext in INDEX_EXTS {
        let swap = index_swap_path(dir, base, ext);
        let target = dir.join(format!("{}.{ext}", stem(base)));
        if swap.exists() {
            std::fs::rename(&swap, &target)?;
        } else if ext != "txnindex" {
            // Renamed by an earlier attempt, or lost: a missing index is
            // rebuilt by recovery's scan, a stale one must not stay.
            let _ = std::fs::remove_file(&target);
        }
    }
    std::fs::rename(
        log_swap_path(dir, base, end),
        dir.join(super::segment::log_file_name(base)),
    )?;
    super::sync_dir(dir)
}

/// At open, before the segments are listed (blocking): deletes every
/// `.cleaned` file (an uncommitted cleaning), finishes every committed
/// swap, and deletes index `.swap` files left without their log `.swap`.
pub fn recover_swaps(dir: &Path) -> std::io::Result<()> {
    let mut swaps = Vec::new();
    let mut stray = Vec::new();
    for ent in std::fs::read_dir(dir)?.flatten() {
        let name = ent.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.ends_with(CLEANED_SUFFIX) {
            std::fs::remove_file(ent.path())?;
        } else if let Some(range) = parse_log_swap(name) {
            swaps.push(range);
        } else if name.ends_with(SWAP_SUFFIX) {
            stray.push(ent.path());
        }
    }
    swaps.sort_unstable();
    for &(base, end) in &swaps {
        tracing::info!(dir = %dir.display(), base, end, "finishing an interrupted cleaner swap");
        finish_swap(dir, base, end, &[])?;
    }
    for p in stray {
        match std::fs::remove_file(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    if !swaps.is_empty() {
        super::sync_dir(dir)?;
    }
    Ok(())
}

/// TESTING ONLY: with `FJORD_TEST_CLEANER_CRASH=<point>` in the
/// environment, the process exits at once (as a kill -9 would leave it)
/// when the swap reaches `point`.
fn crash_point(point: &str) {
    if std::env::var("FJORD_TEST_CLEANER_CRASH").is_ok_and(|p| p == point) {
        eprintln!("fjord: test crash at cleaner point {point}");
        // SAFETY: _exit ends the process without unwinding or flushing.
        unsafe { libc::_exit(137) };
    }
}

/// A sealed segment as the shard sees it when it prepares a cleaning.
#[derive(Clone, Debug)]
pub struct SealedSegment {
    pub base_offset: i64,
    pub next_offset: i64,
    pub bytes: u64,
    /// Largest timestamp in it (creation time if it has no batch).
    pub max_timestamp_ms: i64,
    /// Its first time-index timestamp, or its largest: a bound on its
    /// earliest record's time for `max.compaction.lag.ms`.
    pub first_timestamp_ms: i64,
    pub path: PathBuf,
}

impl PartitionLog {
    /// The sealed segments, in order, without the active one (and without
    /// any segment not sealed yet, nor any after it).
    pub fn sealed_segments(&self) -> Vec<SealedSegment> {
        let segs = self.segments.borrow();
        let all: Vec<&Rc<Segment>> = segs.values().collect();
        let mut out = Vec::new();
        for w in all.windows(2) {
            let (s, next) = (w[0], w[1]);
            if !s.sealed.get() {
                break;
            }
            let max_ts = s.max_ts.get().map_or(s.created_ms, |(t, _)| t);
            out.push(SealedSegment {
                base_offset: s.base_offset,
                next_offset: next.base_offset,
                bytes: s.size.get(),
                max_timestamp_ms: max_ts,
                first_timestamp_ms: s
                    .time_index
                    .borrow()
                    .entries
                    .first()
                    .map_or(max_ts, |e| e.timestamp_ms),
                path: s.log_path.clone(),
            });
        }
        out
    }

    /// Steps 2 and 3 of the swap (module doc) for one cleaned group. Returns
    /// false, the cleaned files deleted, when the group's segments are no
    /// longer all in the log.
    pub async fn swap_cleaned(&self, group: CleanedGroup) -> Result<bool, LogError> {
        let dir = self.dir.clone();
        let base = group.base_offset;
        let olds: Option<Vec<Rc<Segment>>> = {
            let segs = self.segments.borrow();
            let olds: Vec<Rc<Segment>> = group
                .old_bases
                .iter()
                .filter_map(|b| segs.get(b).cloned())
                .collect();
            let next_is_end = segs
                .range(base + 1..)
                .map(|(b, _)| *b)
                .find(|b| !group.old_bases.contains(b))
                == Some(group.end_offset);
            (olds.len() == group.old_bases.len()
                && olds.iter().all(|s| s.sealed.get())
                && next_is_end)
                .then_some(olds)
        };
        let usable = self.health.check_usable();
        let Some(olds) = olds.filter(|_| usable.is_ok()) else {
            glommio::executor()
                .spawn_blocking(move || discard_cleaned(&dir, &[base]))
                .await;
            return Ok(false);
        };
        // Readers holding an old segment keep its old bytes after the rename.
        for s in &olds {
            s.dma().await?;
            s.read_file()?;
        }
        let seg = Rc::new(Segment::cleaned(
            &self.dir,
            base,
            group.indexes,
            group.bytes,
            group.end_offset,
            super::now_ms(),
        ));
        let cleaned_log = cleaned_path(&self.dir, base, "log");
        let dma = glommio::io::DmaFile::open(&cleaned_log)
            .await
            .map_err(|e| LogError::Io(e.into()))?;
        *seg.dma.borrow_mut() = Some(Rc::new(dma));
        *seg.read_file.borrow_mut() = Some(Rc::new(std::fs::File::open(&cleaned_log)?));
        // Re-check after the awaits: the group must still be there.
        let still = {
            let segs = self.segments.borrow();
            olds.iter()
                .all(|o| segs.get(&o.base_offset).is_some_and(|s| Rc::ptr_eq(s, o)))
        };
        if !still || self.health.check_usable().is_err() {
            glommio::executor()
                .spawn_blocking(move || discard_cleaned(&dir, &[base]))
                .await;
            return Ok(false);
        }
        {
            let mut segs = self.segments.borrow_mut();
            for o in &olds {
                segs.remove(&o.base_offset);
            }
            segs.insert(base, seg.clone());
        }
        self.tail.remove_below(group.end_offset);
        let old_bases = group.old_bases.clone();
        let end = group.end_offset;
        let committed = glommio::executor()
            .spawn_blocking(move || commit_swap(&dir, base, end, &old_bases))
            .await;
        if let Err(e) = committed {
            // The map already serves the cleaned segment from its open
            // descriptors; what is on disk is either the old segments or
            // a committed swap that recovery finishes. Stop using the log.
            self.fail(&format!("cleaner swap of segment {base}: {e}"));
            return Err(LogError::Io(e));
        }
        seg.sealed.set(true);
        Ok(true)
    }
}
