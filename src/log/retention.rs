//! Where a log's segments begin and end: rolls, retention, DeleteRecords,
//! and the spare files deleted segments leave for later rolls.
//!
//! Roll: an append rolls the active segment before staging a batch that
//! would take it past `segment.bytes`, when it is older than `segment.ms`,
//! when one of its indexes would pass `segment.index.bytes`, or when the
//! batch's offsets no longer fit 32 bits relative to the segment's base
//! ([`roll_due`]). The old segment's `SegWriter` is marked sealed (the
//! writer seals it once it is written) and the new segment starts at the
//! log end, its file opened by the writer (`writer::open_segment_file`).
//!
//! Retention deletes whole sealed segments from the oldest, never the
//! active one and never any with data at or above the HW, by `retention.ms`
//! and `retention.bytes`; coordinators bound their internal topics with
//! [`PartitionLog::delete_segments_below`], and DeleteRecords moves the
//! log start (Kafka's `maybeIncrementLogStartOffset`) and deletes the
//! segments wholly below it at once.
//!
//! Spare files: writes into fallocated space hit unwritten extents, whose
//! conversion each fdatasync must also commit; so segments deleted by
//! retention are not unlinked but kept (up to `SPARE_SEGMENT_FILES_MAX`, as
//! `<base>.spare`) and renamed into place by the next roll: their blocks
//! are already written. A spare holds the old bytes of another segment
//! after the new batches (`recovery` says why that is safe). A segment is
//! recycled only when nothing holds its descriptors (a fetch sending from
//! it must never see new bytes).
//!
//! Owned by the log's shard: [`Spares`] is the log's list of spare files;
//! the rest works on the log's segment map and appender, each borrowed
//! once at a time, with no await.

use super::appender::SegWriter;
use super::partition::PartitionLog;
use super::segment::Segment;
use super::{now_ms, LogConfig, LogError, SPARE_SEGMENT_FILES_MAX};
use crate::types::{LogEndOffset, LogStartOffset, Offset, TopicPartition};
use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::rc::Rc;

/// Suffix of spare segment files (deleted segments kept for reuse); not
/// `.log`, so Kafka's tools and recovery ignore them.
pub(super) const SPARE_FILE_SUFFIX: &str = ".spare";

fn spare_file_name(base: i64) -> String {
    format!("{base:020}{SPARE_FILE_SUFFIX}")
}

/// Files of deleted segments kept for reuse by the next roll.
pub(super) struct Spares {
    files: RefCell<Vec<PathBuf>>,
}

impl Spares {
    pub(super) fn new(files: Vec<PathBuf>) -> Spares {
        Spares {
            files: RefCell::new(files),
        }
    }

    /// Renames a spare file, if there is one, to `path` (a new segment's
    /// file); one that cannot be renamed is deleted.
    pub(super) fn reuse_as(&self, path: &Path, tp: &TopicPartition) {
        let spare = self.files.borrow_mut().pop();
        if let Some(spare) = spare {
            if let Err(e) = std::fs::rename(&spare, path) {
                tracing::warn!(partition = %tp, file = %spare.display(), error = %e,
                    "could not reuse a spare segment file");
                let _ = std::fs::remove_file(&spare);
            }
        }
    }
}

impl PartitionLog {
    /// Rolls the active segment if a batch of `len` bytes ending at offset
    /// `last` is due to start a new one under `cfg` ([`roll_due`]): the new
    /// segment starts at the log end.
    pub(super) fn maybe_roll(&self, cfg: &LogConfig, len: u64, last: i64) {
        let new_base = self.log_end.get();
        let mut appender = self.appender.borrow_mut();
        let Some(w) = appender.writers.back_mut() else {
            return;
        };
        if !roll_due(&w.seg, cfg, len, last) {
            return;
        }
        w.sealed = true;
        let seg = Rc::new(Segment::new(&self.dir, new_base, now_ms()));
        self.segments.borrow_mut().insert(new_base, seg.clone());
        appender
            .writers
            .push_back(SegWriter::new(seg, None, cfg, self.arena.clone()));
    }

    /// `PartitionLog::apply_retention`: deletes the oldest sealed segments
    /// wholly below the HW while retention.ms or retention.bytes says so.
    pub(super) fn delete_by_retention(&self, now_ms: i64) -> usize {
        let cfg = self.config.borrow().clone();
        let hw = self.high_watermark().0;
        let mut deleted = 0;
        while let Some((seg, next_base)) = self.oldest_but_active() {
            if !seg.sealed.get() || seg.next_offset.get() > hw {
                break;
            }
            let total = self.size_bytes();
            let ts = seg.max_ts.get().map(|(t, _)| t).unwrap_or(seg.created_ms);
            let by_time = cfg.retention_ms >= 0 && now_ms - ts > cfg.retention_ms;
            let by_size =
                cfg.retention_bytes >= 0 && total - seg.size.get() >= cfg.retention_bytes as u64;
            if !(by_time || by_size) {
                break;
            }
            let base = seg.base_offset;
            self.delete_oldest(seg, next_base);
            tracing::info!(partition = %self.tp, segment = base,
                by_time, by_size, "retention deleted a segment");
            deleted += 1;
        }
        deleted
    }

    /// `PartitionLog::delete_segments_below`: deletes the oldest sealed
    /// segments whose every offset is below `offset`.
    pub(super) fn delete_sealed_below(&self, offset: i64) -> usize {
        let mut deleted = 0;
        while let Some((seg, next_base)) = self.oldest_but_active() {
            if !seg.sealed.get() || next_base > offset {
                break;
            }
            self.delete_oldest(seg, next_base);
            deleted += 1;
        }
        deleted
    }

    /// `PartitionLog::delete_records_before`: moves the log start up to
    /// `offset` (in `[0, HW]`) and deletes the sealed segments below it.
    pub(super) fn delete_records(&self, offset: Offset) -> Result<LogStartOffset, LogError> {
        self.move_log_start(offset, "DeleteRecords")
    }

    /// Moves the log start up to `offset` (in `[0, HW]`), for `why` (the
    /// log line's), and deletes the sealed segments wholly below it:
    /// DeleteRecords on a leader, the leader's log start on a follower
    /// (`replica`).
    pub(super) fn move_log_start(
        &self,
        offset: Offset,
        why: &'static str,
    ) -> Result<LogStartOffset, LogError> {
        self.health.check_usable()?;
        if offset.0 < 0 || offset.0 > self.high_watermark().0 {
            return Err(LogError::OffsetOutOfRange {
                log_start: self.log_start_offset(),
                log_end: LogEndOffset(self.log_end.get()),
            });
        }
        if offset.0 > self.log_start.get() {
            tracing::info!(partition = %self.tp, from = self.log_start.get(), to = offset.0,
                why, "the log start moved");
            self.log_start.set(offset.0);
            self.changes.notify();
            self.epochs.borrow_mut().truncate_from_start(offset.0);
        }
        self.delete_segments_below(Offset(self.log_start.get()))?;
        Ok(self.log_start_offset())
    }

    /// The oldest segment and the base offset of the one after it; `None`
    /// when only the active segment is left.
    fn oldest_but_active(&self) -> Option<(Rc<Segment>, i64)> {
        let segs = self.segments.borrow();
        let mut it = segs.values();
        let (Some(first), Some(second)) = (it.next(), it.next()) else {
            return None;
        };
        Some((first.clone(), second.base_offset))
    }

    /// Deletes `seg`, the oldest segment: the log then starts at
    /// `next_base` at the earliest.
    fn delete_oldest(&self, seg: Rc<Segment>, next_base: i64) {
        self.segments.borrow_mut().remove(&seg.base_offset);
        self.log_start.set(self.log_start.get().max(next_base));
        self.changes.notify();
        self.epochs
            .borrow_mut()
            .truncate_from_start(self.log_start.get());
        self.recycle_or_remove(seg);
    }

    /// Deletes the files of a segment already removed from the map, keeping
    /// its `.log` as a spare for the next roll when nothing else can still
    /// read it (no fetch holds one of its descriptors: a read or sendfile
    /// of the old bytes must never see new ones) and fewer than
    /// `SPARE_SEGMENT_FILES_MAX` spares are kept. A spare's blocks are
    /// written, so a segment that reuses it is written without allocating
    /// or converting extents.
    fn recycle_or_remove(&self, seg: Rc<Segment>) {
        let unshared = Rc::strong_count(&seg) == 1
            && seg
                .dma
                .borrow()
                .as_ref()
                .is_none_or(|f| Rc::strong_count(f) == 1)
            && seg
                .read_file
                .borrow()
                .as_ref()
                .is_none_or(|f| Rc::strong_count(f) == 1);
        let mut spares = self.spares.files.borrow_mut();
        if unshared && spares.len() < SPARE_SEGMENT_FILES_MAX {
            let spare = self.dir.join(spare_file_name(seg.base_offset));
            seg.dma.borrow_mut().take();
            seg.read_file.borrow_mut().take();
            match std::fs::rename(&seg.log_path, &spare) {
                Ok(()) => spares.push(spare),
                Err(e) => tracing::warn!(partition = %self.tp, file = %seg.log_path.display(),
                    error = %e, "could not keep a deleted segment as a spare"),
            }
        }
        drop(spares);
        remove_segment_files(&self.dir, seg.base_offset);
    }
}

/// The active segment `seg` rolls before a batch of `len` bytes ending at
/// offset `last`: it is not empty, and the batch would take it past
/// `segment_bytes`, it is older than `segment_ms`, one of its indexes is
/// full, or `last` no longer fits 32 bits relative to its base.
fn roll_due(seg: &Segment, cfg: &LogConfig, len: u64, last: i64) -> bool {
    let size = seg.size.get();
    if size == 0 {
        return false;
    }
    let full_bytes = size + len > cfg.segment_bytes;
    let old = now_ms() - seg.created_ms > cfg.segment_ms;
    let index_full = seg.index.borrow().size_bytes() + super::index::OFFSET_INDEX_ENTRY_BYTES
        > cfg.segment_index_bytes as usize
        || seg.time_index.borrow().size_bytes() + super::index::TIME_INDEX_ENTRY_BYTES
            > cfg.segment_index_bytes as usize;
    let rel_overflow = last - seg.base_offset > i32::MAX as i64;
    full_bytes || old || index_full || rel_overflow
}

/// Deletes the `.log`, `.index`, `.timeindex` and `.txnindex` of segment
/// `base` in `dir`, those that exist.
pub(crate) fn remove_segment_files(dir: &Path, base: i64) {
    for ext in ["log", "index", "timeindex", "txnindex"] {
        let p = dir.join(format!("{base:020}.{ext}"));
        if let Err(e) = std::fs::remove_file(&p) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(file = %p.display(), error = %e, "could not delete segment file");
            }
        }
    }
}
