//! Opening a log (recovery) and closing it.
//!
//! Open: the partition directory is created if missing (with a first
//! segment at the checkpointed log start), leftovers of interrupted deletes
//! and temporary files are removed, and spare files are listed for reuse
//! (`retention`). Segments wholly below the recovery point are trusted:
//! their indexes are loaded and sanity-checked. The segment holding it,
//! every later one, and the last one are scanned and their CRCs verified
//! (`Segment::recover_scan`), except after a clean shutdown (the server's
//! marker): the recovery point is then the log end, and the last segment
//! is trusted once its indexes and last batch headers agree with it
//! (`trust_active`); a scanned segment's indexes are
//! rebuilt, and everything after its last valid batch is truncated.
//! Recovery treats what follows the last valid batch as space not yet
//! written, whether zeros (preallocated) or old bytes: it cannot continue
//! the log, as every old batch has a lower offset than the segment's base,
//! and it is truncated. A segment that ends in a corrupt batch (not zeros)
//! ends the log: every later segment is deleted. The last segment becomes
//! the active one: its file is opened for direct writes and its partial
//! last page staged, so the next write rewrites it whole. A new log that
//! fdatasyncs fsyncs its directory before anything in it can count as
//! durable (`writer`'s module doc, directory fsyncs). Opening a partition's
//! log out of file descriptors fails that open with `Unavailable`; the
//! caller may try again.
//!
//! Close: everything appended is written and fdatasynced, the writer
//! drains the sealed segments, and the active segment's file is sealed
//! (ftruncate to its logical length, fdatasync, indexes); the log then
//! refuses further work. A writer out of file descriptors would not drain:
//! the close fails, and recovery at the next start scans what it did not
//! seal.
//!
//! Runs on the shard that owns the log; what it builds is the log's state
//! (`partition`), handed over whole.

use super::appender::{whole_pages, Appender, SegWriter};
use super::cache::TailCache;
use super::changes::Subscribers;
use super::iobuf::IoArena;
use super::leader_epoch::LeaderEpochCache;
use super::partition::{io_err, DirSync, Health, PartitionLog};
use super::reader::TailSlot;
use super::retention::{remove_segment_files, Spares, SPARE_FILE_SUFFIX};
use super::segment::{log_file_name, ScanOutcome, Segment};
use super::storage;
use super::syncer::{Seals, SyncFiles, Syncer};
use super::watch::OffsetWatch;
use super::writer::{write_indexes_off_shard, DirSyncs, WriterTask};
use super::{now_ms, LogConfig, LogError, SPARE_SEGMENT_FILES_MAX};
use crate::record::batch::{BatchHeader, BATCH_HEADER_BYTES};
use crate::types::TopicPartition;
use glommio::io::OpenOptions;
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;

/// `PartitionLog::open`: opens (creating if missing) and recovers the log
/// in `dir`.
pub(super) async fn open(
    dir: PathBuf,
    tp: TopicPartition,
    config: LogConfig,
    cache: Rc<TailCache>,
    arena: Rc<IoArena>,
    recovery: Recovery,
    log_start_checkpoint: Option<i64>,
) -> Result<Rc<PartitionLog>, LogError> {
    let now = now_ms();
    let (bases, spare_files, dir_syncs) =
        list_or_create(&dir, &config, log_start_checkpoint).await?;
    let (segments, segments_scanned) = recover_segments(&dir, &tp, bases, recovery, &config, now)?;
    let Some(last) = segments.values().next_back().cloned() else {
        return Err(LogError::Corrupt("no segment after recovery".into()));
    };
    let (writer, last_written) = open_active(&last, &config, &arena).await?;
    let log_end = last.next_offset.get();
    let first_base = *segments.keys().next().unwrap_or(&0);
    let log_start = log_start_checkpoint
        .unwrap_or(first_base)
        .max(first_base)
        .min(log_end);
    let max_ts = max_timestamp(&segments);
    let (epochs, leader_epoch) = recover_epochs(
        &dir,
        &tp,
        &segments,
        log_start,
        log_end,
        config.leader_epoch,
    )?;
    Ok(Rc::new_cyclic(|w| PartitionLog {
        tp,
        dir,
        tail: TailSlot::new(cache),
        arena,
        config: RefCell::new(config),
        segments: RefCell::new(segments),
        log_start: Cell::new(log_start),
        log_end: Cell::new(log_end),
        max_ts: Cell::new(max_ts),
        written: OffsetWatch::new(log_end),
        durable: OffsetWatch::new(log_end),
        health: Health::new(),
        changes: Subscribers::default(),
        appender: RefCell::new(Appender::new(writer)),
        writer: WriterTask::new(),
        syncer: Syncer::new(log_end, last_written, now),
        seals: Seals::new(),
        spares: Spares::new(spare_files),
        dir_syncs,
        segments_scanned,
        leader_epoch: Cell::new(leader_epoch),
        epochs: RefCell::new(epochs),
        hw_bound: RefCell::new(None),
        truncating: Cell::new(false),
        truncations: Default::default(),
        checkpointer: RefCell::new(None),
        self_weak: w.clone(),
    }))
}

/// The log's leader-epoch cache after recovery (`leader_epoch`'s module
/// doc): the checkpoint file, or the batches' epochs if it is missing or
/// malformed, cut to [`log_start`, `log_end`], with this node's epoch
/// (`leader_epoch`) starting at the log end unless it already started;
/// written back if that changed it. Returns it with the epoch leader
/// appends stamp: `leader_epoch`, or the newest epoch of the log if that
/// is newer (a replica's log that followed a newer leader: its epochs are
/// kept, never dropped for an older one, and a leader append stamps no
/// epoch older than its batches').
fn recover_epochs(
    dir: &Path,
    tp: &TopicPartition,
    segments: &BTreeMap<i64, Rc<Segment>>,
    log_start: i64,
    log_end: i64,
    leader_epoch: i32,
) -> Result<(LeaderEpochCache, i32), LogError> {
    let loaded = LeaderEpochCache::read(dir);
    let mut epochs = match &loaded {
        Some(c) => c.clone(),
        None => epochs_of_batches(tp, segments)?,
    };
    if epochs.truncate_from_end(log_end) {
        tracing::info!(partition = %tp, log_end,
            "recovery dropped leader epochs starting after the log end");
    }
    epochs.truncate_from_start(log_start);
    let leader_epoch = match epochs.latest_epoch() {
        Some(latest) if latest > leader_epoch => latest,
        _ => {
            epochs.assign(leader_epoch, log_end);
            leader_epoch
        }
    };
    if loaded.as_ref() != Some(&epochs) {
        epochs.write(dir)?;
    }
    Ok((epochs, leader_epoch))
}

/// The leader epochs the batches of `segments` (recovered: whole batches
/// up to each segment's size) were stamped with, read header by header.
fn epochs_of_batches(
    tp: &TopicPartition,
    segments: &BTreeMap<i64, Rc<Segment>>,
) -> Result<LeaderEpochCache, LogError> {
    use std::os::unix::fs::FileExt;
    let mut epochs = LeaderEpochCache::default();
    let mut header = [0u8; BATCH_HEADER_BYTES];
    let mut batches = 0u64;
    for seg in segments.values() {
        let len = seg.size.get();
        if len == 0 {
            continue;
        }
        let file = std::fs::File::open(&seg.log_path)?;
        let mut pos = 0u64;
        while pos + BATCH_HEADER_BYTES as u64 <= len {
            file.read_exact_at(&mut header, pos)?;
            let h = BatchHeader::parse(&header).map_err(LogError::InvalidBatch)?;
            epochs.assign(h.partition_leader_epoch, h.base_offset);
            batches += 1;
            pos += h.total_size() as u64;
        }
    }
    // A new partition has no checkpoint yet and nothing to rebuild from.
    if batches > 0 {
        tracing::info!(partition = %tp, batches, epochs = ?epochs.entries(),
            "rebuilt the leader-epoch checkpoint from the batches");
    }
    Ok(epochs)
}

/// Lists the segments and spare files of `dir`, creating the directory and
/// a first segment (at the checkpointed log start) if there is none. A log
/// that fdatasyncs acknowledges its first batches only once the new file
/// (and a new directory) survive a power loss: it fsyncs them here.
async fn list_or_create(
    dir: &Path,
    config: &LogConfig,
    log_start_checkpoint: Option<i64>,
) -> Result<(Vec<i64>, Vec<PathBuf>, DirSyncs), LogError> {
    let dir_created = !dir.exists();
    std::fs::create_dir_all(dir)?;
    super::compact::recover_swaps(dir)?;
    let (mut bases, spare_files) = list_segments(dir)?;
    if !bases.is_empty() {
        return Ok((bases, spare_files, DirSyncs::new(0, None)));
    }
    let base = log_start_checkpoint.unwrap_or(0).max(0);
    std::fs::File::create(dir.join(log_file_name(base)))?;
    bases.push(base);
    if !config.syncs() {
        return Ok((bases, spare_files, DirSyncs::new(0, None)));
    }
    let (d, parent) = (dir.to_path_buf(), dir.parent().map(Path::to_path_buf));
    glommio::executor()
        .spawn_blocking(move || {
            super::sync_dir(&d)?;
            match parent {
                Some(p) if dir_created => super::sync_dir(&p),
                _ => Ok(()),
            }
        })
        .await
        .map_err(LogError::from_io)?;
    let synced = DirSync {
        segment_base: base,
        durable_at: base,
    };
    let dir_syncs = DirSyncs::new(1 + u64::from(dir_created), Some(synced));
    Ok((bases, spare_files, dir_syncs))
}

/// Where recovery may start trusting a log (`open`).
#[derive(Clone, Copy)]
pub(crate) struct Recovery {
    /// The checkpointed recovery point: every offset below it was durable.
    pub(crate) point: Option<i64>,
    /// The broker stopped cleanly last time (`server`'s clean-shutdown
    /// marker): the recovery point is this log's end, its active segment
    /// was sealed (truncated, synced, indexes written) and nothing was
    /// written after it.
    pub(crate) clean_shutdown: bool,
}

/// The segments of `bases` (sorted, not empty), recovered: those wholly
/// below the recovery point trusted, the others scanned ([`scan_segment`]);
/// a corrupt segment ends the log, and the segments after it are deleted.
/// After a clean shutdown the last segment is trusted too when its indexes
/// agree with the recovery point (Kafka skips recovery after a clean
/// shutdown the same way). Returns the segments and how many were scanned.
fn recover_segments(
    dir: &Path,
    tp: &TopicPartition,
    mut bases: Vec<i64>,
    recovery: Recovery,
    config: &LogConfig,
    now: i64,
) -> Result<(BTreeMap<i64, Rc<Segment>>, u32), LogError> {
    let rp = recovery.point.unwrap_or(0);
    // First segment to scan: the one containing the recovery point.
    let first_scan = bases
        .iter()
        .rposition(|&b| b <= rp)
        .unwrap_or(0)
        .min(bases.len() - 1);
    let mut segments: BTreeMap<i64, Rc<Segment>> = BTreeMap::new();
    let mut scanned = 0u32;
    let mut expected = bases[0];
    let mut i = 0;
    while i < bases.len() {
        let base = bases[i];
        let mut seg = Rc::new(Segment::new(dir, base, now));
        let is_last = i + 1 == bases.len();
        let trusted = if is_last {
            let trusted = trust_active(&seg, tp, recovery, expected)?;
            if !trusted {
                // Whatever a partial load set is scanned again from scratch.
                seg = Rc::new(Segment::new(dir, base, now));
            }
            trusted
        } else {
            i < first_scan && seg.load_indexes(bases[i + 1])?
        };
        if !trusted {
            scanned += 1;
            let corrupt = scan_segment(&seg, tp, expected, is_last, config)?;
            if corrupt && !is_last {
                for &later in &bases[i + 1..] {
                    tracing::warn!(partition = %tp, segment = later,
                        "recovery deleted a segment after a corrupt one");
                    remove_segment_files(dir, later);
                }
                bases.truncate(i + 1);
                seg.sealed.set(false);
            }
        }
        expected = seg.next_offset.get();
        segments.insert(base, seg);
        i += 1;
    }
    Ok((segments, scanned))
}

/// Whether the active (last) segment `seg`, whose first batch is expected
/// at `expected`, can be trusted without a scan: only after a clean
/// shutdown, with a recovery point in it, indexes that agree with it and
/// batch headers after the last index entry that end the file exactly at
/// it ([`Segment::tail_ends_at`]). A trusted active segment is left
/// unsealed, to be appended to.
fn trust_active(
    seg: &Segment,
    tp: &TopicPartition,
    recovery: Recovery,
    expected: i64,
) -> Result<bool, LogError> {
    // A log with no checkpointed recovery point is new since the clean
    // stop (or was never checkpointed): nothing to trust.
    let (true, Some(end)) = (recovery.clean_shutdown, recovery.point) else {
        return Ok(false);
    };
    let why = if end < seg.base_offset || seg.base_offset != expected {
        "the recovery point is not in the active segment"
    } else if !seg.load_indexes(end)? {
        "its indexes do not match the recovery point"
    } else if !seg.tail_ends_at(end)? {
        "its last batches do not end at the recovery point"
    } else {
        seg.sealed.set(false);
        return Ok(true);
    };
    // After a clean stop this is unexpected (a checkpoint or index file
    // from elsewhere, or damage since): say why the segment is scanned.
    tracing::warn!(partition = %tp, segment = seg.base_offset, recovery_point = ?recovery.point,
        reason = why, "after a clean shutdown the active segment is scanned anyway");
    Ok(false)
}

/// Scans `seg` from its start, its first batch expected at offset
/// `expected`: truncates what follows its last valid batch and, unless it
/// is the last segment, rebuilds and writes its indexes and marks it
/// sealed. Returns whether it ends in a corrupt batch (not zeros).
fn scan_segment(
    seg: &Segment,
    tp: &TopicPartition,
    expected: i64,
    is_last: bool,
    config: &LogConfig,
) -> Result<bool, LogError> {
    let out = seg.recover_scan(expected, config.index_interval_bytes)?;
    if out.valid_len < out.file_len {
        truncate_after_valid(seg, tp, &out)?;
    }
    let corrupt = out.stop_reason.is_some() && !out.tail_is_zeros;
    if !is_last {
        seg.final_time_entry();
        seg.write_indexes()?;
        seg.sealed.set(true);
    }
    Ok(corrupt)
}

/// Truncates `seg`'s file after its last valid batch (`out`), saying why.
fn truncate_after_valid(
    seg: &Segment,
    tp: &TopicPartition,
    out: &ScanOutcome,
) -> Result<(), LogError> {
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&seg.log_path)?;
    f.set_len(out.valid_len)?;
    f.sync_all()?;
    if out.stop_reason.is_some() && !out.tail_is_padding {
        tracing::warn!(
            partition = %tp, segment = %seg.log_path.display(),
            position = out.valid_len, bytes = out.file_len - out.valid_len,
            reason = ?out.stop_reason,
            "recovery truncated the log at an invalid batch"
        );
    } else {
        tracing::info!(
            partition = %tp, segment = %seg.log_path.display(),
            position = out.valid_len, bytes = out.file_len - out.valid_len,
            "recovery removed preallocated or recycled space after the last batch"
        );
    }
    Ok(())
}

/// The active segment `last`'s write state: its file opened for direct
/// writes (and the syncer's descriptions of it, opened with it), and its
/// partial last page staged so the next write rewrites it whole.
pub(super) async fn open_active(
    last: &Rc<Segment>,
    config: &LogConfig,
    arena: &Rc<IoArena>,
) -> Result<(SegWriter, Rc<SyncFiles>), LogError> {
    last.sealed.set(false);
    let file = Rc::new(
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .dma_open(&last.log_path)
            .await
            .map_err(io_err)?,
    );
    storage::fdatasync(&file).await?;
    let size = last.size.get();
    let last_written = SyncFiles::open(&last.log_path).await?;
    let mut writer = SegWriter::new(last.clone(), Some(file.clone()), config, arena.clone());
    writer.sync_files = Some(last_written.clone());
    writer.allocated_len = size;
    let tail_pos = whole_pages(size);
    writer.zeroed_len = tail_pos;
    writer.next_chunk_pos = tail_pos;
    if tail_pos < size {
        // Keep the partial last page staged so the next write rewrites it whole.
        let mut tail = vec![0u8; (size - tail_pos) as usize];
        let f = std::fs::File::open(&last.log_path)?;
        use std::os::unix::fs::FileExt;
        f.read_exact_at(&mut tail, tail_pos)?;
        writer.stage(tail_pos, &tail);
        if let Some(c) = &mut writer.open {
            c.issued = c.len;
        }
    }
    *last.dma.borrow_mut() = Some(file);
    Ok((writer, last_written))
}

/// (timestamp, offset) of the batch with the largest max timestamp among
/// `segments`, the earliest such segment's on a tie.
pub(super) fn max_timestamp(segments: &BTreeMap<i64, Rc<Segment>>) -> Option<(i64, i64)> {
    segments
        .values()
        .filter_map(|s| s.max_ts.get())
        .fold(None, |acc: Option<(i64, i64)>, x| match acc {
            Some(a) if a.0 >= x.0 => Some(a),
            _ => Some(x),
        })
}

/// Base offsets of the `.log` files in `dir`, sorted, and the spare files
/// (up to `SPARE_SEGMENT_FILES_MAX`, more are deleted); removes leftovers of
/// interrupted deletes (`*.deleted`) and temporary files.
fn list_segments(dir: &Path) -> Result<(Vec<i64>, Vec<PathBuf>), LogError> {
    let mut bases = Vec::new();
    let mut spares = Vec::new();
    for ent in std::fs::read_dir(dir)? {
        let ent = ent?;
        let name = ent.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.ends_with(".deleted") || name.ends_with(".tmp") || name.ends_with(".cleaned") {
            let _ = std::fs::remove_file(ent.path());
            continue;
        }
        if name.ends_with(SPARE_FILE_SUFFIX) {
            if spares.len() < SPARE_SEGMENT_FILES_MAX {
                spares.push(ent.path());
            } else {
                let _ = std::fs::remove_file(ent.path());
            }
            continue;
        }
        if let Some(stem) = name.strip_suffix(".log") {
            if stem.len() == 20 {
                if let Ok(b) = stem.parse::<i64>() {
                    bases.push(b);
                }
            }
        }
    }
    bases.sort_unstable();
    Ok((bases, spares))
}

impl PartitionLog {
    /// `PartitionLog::close`'s work before the log is marked closed.
    pub(super) async fn close_inner(&self) -> Result<(), LogError> {
        self.health.check_usable()?;
        self.flush().await?;
        // Wait for the writer to drain sealed segments too (a writer out of
        // file descriptors would not: the close fails, and recovery at the
        // next start scans what it did not seal).
        while self.appender.borrow().writers.len() > 1 || self.io_running() {
            glommio::timer::sleep(std::time::Duration::from_millis(1)).await;
            self.health.check_writable()?;
        }
        let active = self
            .appender
            .borrow()
            .writers
            .front()
            .map(|w| (w.seg.clone(), w.file.clone()));
        if let Some((seg, Some(file))) = active {
            file.truncate(seg.size.get()).await.map_err(io_err)?;
            storage::fdatasync(&file).await?;
            // The time index ends with the segment's largest timestamp, as
            // Kafka's `LogSegment.close` leaves it: without it a segment of
            // less than `index.interval.bytes` has no entry, and the next
            // start after a clean stop could not trust it (`trust_active`).
            seg.final_time_entry();
            write_indexes_off_shard(&seg).await?;
        }
        Ok(())
    }

    /// The writer, a background seal or an fdatasync of the syncer runs.
    pub(super) fn io_running(&self) -> bool {
        self.writer.running() || self.seals.running() || self.syncer.in_flight() > 0
    }
}
