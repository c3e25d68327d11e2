//! When and what the log cleaner cleans on a shard (issue 26): the choice
//! of a log (Kafka's `LogCleanerManager.grabFilthiestCompactedLog`), the
//! bounds of its cleanable section, and the job handed to the cleaner
//! thread (`log::compact`), whose cleaned segments are then swapped in.
//!
//! Bounds of a partition's cleanable section (Kafka's
//! `cleanableOffsets`): from the first dirty offset (where the last
//! cleaning's map ended; the log start at first) to the first uncleanable
//! offset, the lowest of: the base of the first segment not sealed (the
//! active segment, always), the last stable offset (never past an open
//! transaction, so `read_committed` readers see the same committed data
//! before and after), the HW, and the base of the first dirty segment
//! whose newest record is younger than `min.compaction.lag.ms`. Dirt is
//! counted in whole segments, as Kafka does.
//!
//! The first dirty offset lives in memory: after a restart every compacted
//! log counts as wholly dirty and is cleaned once more (correct, only
//! work; Kafka keeps `cleaner-offset-checkpoint` for this — not built).
//!
//! A shard runs [`clean_filthiest`] in its background task queue (lower
//! shares than requests): one log per call, the one with the highest
//! dirty ratio above its `min.cleanable.dirty.ratio`, or any with a dirty
//! record older than `max.compaction.lag.ms`.

use super::Partition;
use crate::log::cleaner::{self, LogDirt};
use crate::log::compact::{self, CleanJob, SealedSegment, SegmentFile};
use crate::log::LogError;
use std::collections::HashMap;
use std::rc::Rc;

/// The broker's cleaner settings (`log.cleaner.*`).
#[derive(Clone, Copy, Debug)]
pub struct CleanerSettings {
    pub dedupe_buffer_bytes: usize,
    pub io_max_bytes_per_second: f64,
}

/// What one cleaning did, for the log line and the tests.
#[derive(Clone, Debug)]
pub struct CleanReport {
    pub partition: String,
    pub dirty_ratio_before: f64,
    pub first_dirty: i64,
    pub end_offset: i64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub segments_before: usize,
    pub groups_swapped: usize,
    pub seconds: f64,
}

impl Partition {
    /// The cleaner's first dirty offset.
    pub fn first_dirty_offset(&self) -> i64 {
        self.first_dirty.get().max(self.log.log_start_offset().0)
    }

    /// The sealed segments, the first uncleanable offset and the log's
    /// dirt, when the topic is compacted.
    fn dirt(&self, now_ms: i64) -> Option<(Vec<SealedSegment>, i64, LogDirt)> {
        let (compact, min_lag, ratio, max_lag) = {
            let c = self.config();
            (
                c.cleanup_compact,
                c.min_compaction_lag_ms,
                c.min_cleanable_dirty_ratio,
                c.max_compaction_lag_ms,
            )
        };
        if !compact {
            return None;
        }
        let segments = self.log.sealed_segments();
        let first_dirty = self.first_dirty_offset();
        let mut uncleanable = segments
            .last()
            .map_or(self.log.log_start_offset().0, |s| s.next_offset)
            .min(self.last_stable_offset())
            .min(self.log.high_watermark().0);
        if let Some(young) = segments.iter().find(|s| {
            s.next_offset > first_dirty && now_ms.saturating_sub(s.max_timestamp_ms) < min_lag
        }) {
            uncleanable = uncleanable.min(young.base_offset);
        }
        let mut dirt = LogDirt {
            clean_bytes: 0,
            dirty_bytes: 0,
            first_dirty_ms: None,
            min_cleanable_dirty_ratio: ratio,
            max_compaction_lag_ms: max_lag,
        };
        for s in &segments {
            if s.next_offset <= first_dirty {
                dirt.clean_bytes += s.bytes;
            } else if s.next_offset <= uncleanable {
                dirt.dirty_bytes += s.bytes;
                dirt.first_dirty_ms.get_or_insert(s.first_timestamp_ms);
            }
        }
        Some((segments, uncleanable, dirt))
    }

    /// Cleans this partition's log once (module doc); `None` when there was
    /// nothing to clean.
    pub async fn clean(
        &self,
        settings: CleanerSettings,
        now_ms: i64,
    ) -> Result<Option<CleanReport>, LogError> {
        let Some(dirt) = self.dirt(now_ms) else {
            return Ok(None);
        };
        self.clean_dirt(dirt, settings, now_ms).await
    }

    /// Cleans with the sealed segments, first uncleanable offset and dirt
    /// [`Self::dirt`] just computed (so the cleaner's choice of log and the
    /// cleaning use the same walk of the segment list).
    async fn clean_dirt(
        &self,
        (segments, uncleanable, dirt): (Vec<SealedSegment>, i64, LogDirt),
        settings: CleanerSettings,
        now_ms: i64,
    ) -> Result<Option<CleanReport>, LogError> {
        let first_dirty = self.first_dirty_offset();
        if dirt.dirty_bytes == 0 || first_dirty >= uncleanable {
            return Ok(None);
        }
        let started = crate::clock::monotonic();
        let segments_before = segments.len();
        let files: Vec<SegmentFile> = segments
            .iter()
            .filter(|s| s.next_offset <= uncleanable)
            .map(|s| SegmentFile {
                base_offset: s.base_offset,
                next_offset: s.next_offset,
                bytes: s.bytes,
                path: s.path.clone(),
            })
            .collect();
        let last_of_producers: HashMap<i64, i64> = self
            .producers()
            .entries()
            .filter_map(|(&id, e)| e.batches.back().map(|b| (id, b.last_offset)))
            .collect();
        let (delete_retention_ms, segment_bytes, index_interval_bytes) = {
            let c = self.config();
            (
                c.delete_retention_ms,
                c.segment_bytes,
                c.index_interval_bytes,
            )
        };
        let log_start = self.log.log_start_offset().0;
        let job = CleanJob {
            dir: self.log.dir().to_path_buf(),
            segments: files,
            first_dirty,
            first_uncleanable: uncleanable,
            aborted: self.aborted_overlapping(log_start, uncleanable),
            last_of_producers,
            now_ms,
            delete_retention_ms,
            segment_bytes,
            index_interval_bytes,
            map_bytes: settings.dedupe_buffer_bytes,
            io_max_bytes_per_second: settings.io_max_bytes_per_second,
        };
        let outcome = match compact::run_on_cleaner(job).await {
            Ok(o) => o,
            Err(e) => {
                // Whatever the cleaner wrote is `.cleaned`: deleted here (and
                // at the next open, if that fails); the log is untouched.
                let dir = self.log.dir().to_path_buf();
                let bases: Vec<i64> = segments.iter().map(|s| s.base_offset).collect();
                glommio::executor()
                    .spawn_blocking(move || compact::discard_cleaned(&dir, &bases))
                    .await;
                return Err(e);
            }
        };
        let mut swapped = 0;
        let total_groups = outcome.groups.len();
        let mut groups = outcome.groups.into_iter();
        for group in groups.by_ref() {
            let base = group.base_offset;
            match self.log.swap_cleaned(group).await {
                Ok(true) => swapped += 1,
                Ok(false) => {
                    tracing::info!(partition = %self.tp, segment = base,
                        "cleaned segments changed meanwhile; cleaning dropped");
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        let rest: Vec<i64> = groups.map(|g| g.base_offset).collect();
        if !rest.is_empty() {
            let dir = self.log.dir().to_path_buf();
            glommio::executor()
                .spawn_blocking(move || compact::discard_cleaned(&dir, &rest))
                .await;
        }
        // Only a cleaning swapped in whole moves the first dirty offset: a
        // group left uncleaned must be mapped again next time.
        if swapped == total_groups && swapped > 0 {
            self.first_dirty.set(outcome.end_offset);
        }
        let report = CleanReport {
            partition: self.tp.to_string(),
            dirty_ratio_before: dirt.dirty_ratio(),
            first_dirty,
            end_offset: outcome.end_offset,
            bytes_read: outcome.bytes_read,
            bytes_written: outcome.bytes_written,
            segments_before,
            groups_swapped: swapped,
            seconds: crate::clock::monotonic()
                .saturating_duration_since(started)
                .as_secs_f64(),
        };
        crate::metrics::record_cleaning(
            report.bytes_read,
            report.bytes_written,
            std::time::Duration::from_secs_f64(report.seconds),
            report.dirty_ratio_before,
        );
        tracing::info!(
            partition = %report.partition,
            dirty_ratio = report.dirty_ratio_before,
            first_dirty = report.first_dirty,
            end_offset = report.end_offset,
            bytes_read = report.bytes_read,
            bytes_written = report.bytes_written,
            keys = outcome.keys,
            batches_removed = outcome.batches_removed,
            segments_before = report.segments_before,
            segments_after = self.log.segment_count(),
            seconds = report.seconds,
            "log cleaned"
        );
        Ok(Some(report))
    }
}

/// Cleans the filthiest compacted log among `partitions` (module doc).
/// Returns whether a log was cleaned.
pub async fn clean_filthiest(
    partitions: &[Rc<Partition>],
    settings: CleanerSettings,
    now_ms: i64,
) -> bool {
    let mut candidates: Vec<(Rc<Partition>, _)> = partitions
        .iter()
        .filter_map(|p| p.dirt(now_ms).map(|d| (p.clone(), d)))
        .collect();
    let dirts: Vec<LogDirt> = candidates.iter().map(|(_, d)| d.2).collect();
    let Some(i) = cleaner::filthiest(&dirts, now_ms) else {
        return false;
    };
    let (p, dirt) = candidates.swap_remove(i);
    match p.clean_dirt(dirt, settings, now_ms).await {
        Ok(r) => r.is_some_and(|r| r.groups_swapped > 0),
        Err(e) => {
            tracing::error!(partition = %p.tp, error = %e, "log cleaning failed");
            false
        }
    }
}
