//! Truncating a log's tail ([`PartitionLog::truncate_to`]): what a follower
//! does when its log diverged from the leader's (docs/replication.md §4.1,
//! Kafka's `UnifiedLog.truncateTo`).
//!
//! Where the log ends after it: at the start of the batch that contains
//! `offset` (or, when `offset` falls in a gap a compaction left, at the end
//! of the last batch before it), never above `offset`; the new log end is
//! returned. A batch is never cut in two: Kafka cuts its segment at the
//! position of the batch holding the offset too. Truncation offsets a
//! follower uses (the end offset of an epoch, the leader's HW) are batch
//! boundaries, so the log then ends exactly at `offset`. An `offset` at or
//! past the log end cuts no batch, but drops the leader epochs that start
//! at the log end (an epoch a node began as leader and appended nothing
//! in, as Kafka's `truncateTo` does); one below the log start is refused
//! (`OffsetOutOfRange`).
//!
//! Steps, in this order:
//! 1. appends are refused (`LogError::Truncating`) until the end, and every
//!    write, seal and fdatasync in flight completes (the writer drains
//!    what is staged: a truncation never races a write into the range it
//!    cuts, and no write lands after the cut);
//! 2. whole segments after the one holding the cut are deleted, newest
//!    first, and the directory fsynced;
//! 3. the segment holding the cut is truncated at the batch's position and
//!    fsynced (these deletes, the cut and the fsyncs run on the blocking
//!    thread); its indexes are rebuilt by a recovery scan of what is kept,
//!    on the shard (it re-reads that segment up to the cut, up to
//!    `segment.bytes`: a truncation happens at a leader change, rarely;
//!    cutting the in-memory indexes instead is not built), and it becomes
//!    the active segment, opened as recovery opens the last segment;
//! 4. the leader-epoch cache drops the epochs that start at or after the
//!    new end (`truncate_from_end`) and its checkpoint is rewritten;
//! 5. in memory: log end, `written`, `durable`, the HW bound of a
//!    replicated log (`replica`) and the syncer's targets are lowered to
//!    the new end, the max timestamp recomputed, the tail cache's entries
//!    at or past it dropped; then every waiter is woken. A waiter for an
//!    offset the truncation cut away (an `acks` wait of a batch that was
//!    appended, or a sync it asked for) ends with `LogError::Truncated`,
//!    never with success, even once new batches fill that offset again
//!    (`Truncations`);
//! 6. the shard's recovery-point and log-start checkpoints are rewritten
//!    (through the `LogManager` that opened the log) before appends
//!    resume: the recovery point on disk may lie past the new end, and a
//!    segment below it that takes new batches would be trusted without a
//!    scan after a power loss (Kafka's `LogManager.truncateTo` checkpoints
//!    for the same reason).
//!
//! A fetch that read before the truncation may still answer with batches
//! it cut (a read is not stopped halfway); a fetch bounded by the HW, which
//! the truncation lowers, reads none of them afterwards. Kafka's reads race
//! a truncation the same way.
//!
//! Any I/O error after step 1 fails the log (Kafka takes the log directory
//! offline on an I/O error in a truncation); the directory then recovers at
//! the next open as below.
//!
//! **Crash safety** (kill -9 or power loss at any point): every state the
//! directory can be left in is one recovery turns into a consistent log,
//! which is a prefix of the log before the truncation at least as long as
//! the one asked for:
//! - before or during step 2: later segments are deleted newest first, so
//!   the files left are the old log minus some of its newest segments,
//!   still contiguous: recovery opens it as a longer log than the target
//!   (the truncated tail, or part of it, still present). A follower fetches
//!   from that log end with its last epoch and the leader's
//!   `diverging_epoch` makes it truncate again.
//! - after step 2, before step 3 is durable: the cut segment is whole or
//!   cut (ftruncate is atomic for the file size); either is a prefix.
//! - after step 3, before step 4: the checkpoint still names epochs
//!   starting at or past the new end; recovery drops every epoch that
//!   starts at or past the recovered log end (`leader_epoch`'s module doc),
//!   so the cache matches the log. Had step 4 come first, a crash before
//!   the data was cut would have left batches of an epoch the checkpoint
//!   no longer names; this order cannot.
//! - the indexes of the cut segment are not rewritten: it is the last
//!   segment, which recovery scans and re-indexes after any crash (only a
//!   clean stop, whose close writes fresh indexes, lets it be trusted).
//! - producer snapshots past the new end, and `.txnindex` entries whose
//!   markers were cut away, are the partition's (`partition::Partition::
//!   truncate_to`); recovery deletes such snapshots and drops such entries
//!   itself when it finds them past the recovered log end.
//!
//! [`PartitionLog::truncate_fully_and_start_at`] (Kafka's
//! `truncateFullyAndStartAt`, for a follower whose fetch offset is below the
//! leader's log start) falls out of the same steps; see its doc.

use super::appender::Appender;
use super::partition::PartitionLog;
use super::reader::index_position;
use super::recovery::{max_timestamp, open_active};
use super::retention::remove_segment_files;
use super::segment::Segment;
use super::LogError;
use crate::record::batch::{BatchHeader, BATCH_HEADER_BYTES};
use crate::types::{LogEndOffset, Offset};
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;

/// Truncations remembered for waiters: a waiter that started before more
/// than this many truncations is treated as cut (it can only have waited
/// through a long series of leader changes, and may retry).
const TRUNCATIONS_KEPT: usize = 16;

/// The recent truncations of a log: (generation after it, new log end).
#[derive(Default)]
pub(super) struct Truncations {
    generation: Cell<u64>,
    recent: RefCell<VecDeque<(u64, i64)>>,
}

impl Truncations {
    /// Counts the truncations so far; a waiter notes it when it starts.
    pub(super) fn generation(&self) -> u64 {
        self.generation.get()
    }

    fn record(&self, end: i64) {
        let g = self.generation.get() + 1;
        self.generation.set(g);
        let mut recent = self.recent.borrow_mut();
        recent.push_back((g, end));
        if recent.len() > TRUNCATIONS_KEPT {
            recent.pop_front();
        }
    }

    /// The lowest log end a truncation after generation `since` left, if
    /// any ran; `i64::MIN` if some of them are no longer remembered.
    fn lowest_end_since(&self, since: u64) -> Option<i64> {
        if self.generation.get() == since {
            return None;
        }
        let recent = self.recent.borrow();
        let remembered = recent.front().is_some_and(|&(g, _)| g <= since + 1);
        if !remembered {
            return Some(i64::MIN);
        }
        recent
            .iter()
            .filter(|&&(g, _)| g > since)
            .map(|&(_, end)| end)
            .min()
    }
}

impl PartitionLog {
    /// `Err(Truncated)` if a truncation since generation `since` cut
    /// `offset` away.
    pub(super) fn check_not_truncated(&self, since: u64, offset: i64) -> Result<(), LogError> {
        match self.truncations.lowest_end_since(since) {
            Some(end) if offset >= end => Err(LogError::Truncated {
                offset,
                log_end: self.log_end.get(),
            }),
            _ => Ok(()),
        }
    }

    /// Truncates the log to end at the start of the batch holding `offset`
    /// (see the module doc); returns the new log end.
    pub async fn truncate_to(&self, offset: Offset) -> Result<LogEndOffset, LogError> {
        self.health.check_usable()?;
        if self.truncating.get() {
            return Err(LogError::Truncating);
        }
        if offset.0 >= self.log_end.get() {
            self.truncating.set(true);
            let r = self.cut_empty_epochs().await;
            self.truncating.set(false);
            r?;
            return Ok(self.log_end_offset());
        }
        if offset.0 < self.log_start.get() {
            return Err(LogError::OffsetOutOfRange {
                log_start: self.log_start_offset(),
                log_end: self.log_end_offset(),
            });
        }
        self.truncating.set(true);
        let r = self.truncate_tail(offset.0).await;
        let r = self.checkpoint_after(r).await;
        self.truncating.set(false);
        r
    }

    /// A truncation at or past the log end cuts no batch but drops the
    /// epochs that start at the log end, as Kafka's `truncateTo` does: a
    /// node that became leader and appended nothing before another node
    /// led holds such an empty epoch, which the new leader's log does not
    /// have. A follower names its newest epoch in its fetches
    /// (`replication::manager::follower_position`), so the leader answers
    /// it with a diverging epoch and the follower truncates here; with the
    /// empty epoch kept, the leader's batches of older epochs past it could
    /// never be appended.
    async fn cut_empty_epochs(&self) -> Result<(), LogError> {
        let end = self.log_end.get();
        let mut epochs = self.epochs.borrow().clone();
        if !epochs.truncate_from_end(end) {
            return Ok(());
        }
        *self.epochs.borrow_mut() = epochs.clone();
        tracing::info!(partition = %self.tp, log_end = end,
            "dropped leader epochs starting at the log end");
        let r = self.write_epochs(epochs).await;
        if let Err(e) = &r {
            self.fail(e);
        }
        r
    }

    /// After a truncation that succeeded: the shard's checkpoints are
    /// rewritten before appends resume (Kafka's `LogManager.truncateTo`
    /// checkpoints too). The recovery point on disk may lie past the new
    /// log end; new batches written below it before the next periodic
    /// checkpoint would count as trusted (synced) at a recovery after a
    /// power loss, which they need not be.
    async fn checkpoint_after(
        &self,
        r: Result<LogEndOffset, LogError>,
    ) -> Result<LogEndOffset, LogError> {
        let end = r?;
        self.write_shard_checkpoints().await?;
        Ok(end)
    }

    /// Rewrites the checkpoints of the shard whose manager opened this log
    /// (recovery points, log starts, HWs); nothing for a log opened
    /// without one.
    pub(super) async fn write_shard_checkpoints(&self) -> Result<(), LogError> {
        let manager = self
            .checkpointer
            .borrow()
            .as_ref()
            .and_then(std::rc::Weak::upgrade);
        if let Some(m) = manager {
            m.checkpoint().await?;
        }
        Ok(())
    }

    /// Kafka's `truncateFullyAndStartAt`: every segment is deleted and the
    /// log starts again, empty, at `offset` (log start = log end =
    /// `offset`), with no leader epoch. For a follower whose fetch offset
    /// is below the leader's log start, or above its log end. The new log
    /// start reaches the shard's log-start checkpoint with the next
    /// checkpoint (`LogManager`); until then recovery takes the first
    /// segment's base, `offset`, as the log start anyway. Crash
    /// safety: the new segment file is created (and the directory
    /// fsynced) before the old ones are deleted, oldest first, so a crash
    /// leaves either the old log (or a suffix of its segments) followed by
    /// the empty one at `offset`: a log recovery opens, which the next
    /// fetch truncates fully again.
    pub async fn truncate_fully_and_start_at(
        &self,
        offset: Offset,
    ) -> Result<LogEndOffset, LogError> {
        self.health.check_usable()?;
        if self.truncating.get() {
            return Err(LogError::Truncating);
        }
        if offset.0 < 0 {
            return Err(LogError::OffsetOutOfRange {
                log_start: self.log_start_offset(),
                log_end: self.log_end_offset(),
            });
        }
        self.truncating.set(true);
        let r = self.restart_at(offset.0).await;
        let r = self.checkpoint_after(r).await;
        self.truncating.set(false);
        r
    }

    /// Waits until nothing staged is unwritten and no write, seal or
    /// fdatasync runs (appends are refused meanwhile).
    async fn drain_writes(&self) -> Result<(), LogError> {
        loop {
            self.health.check_writable()?;
            let drained = self.written.get() == self.log_end.get()
                && self.appender.borrow().writers.len() == 1
                && self.appender.borrow().idle()
                && !self.io_running()
                && !self.syncer.running();
            if drained {
                return Ok(());
            }
            if !self.writer.running() && !self.appender.borrow().idle() {
                self.kick_writer();
            }
            glommio::timer::sleep(std::time::Duration::from_millis(1)).await;
        }
    }

    async fn truncate_tail(&self, target: i64) -> Result<LogEndOffset, LogError> {
        self.drain_writes().await?;
        let r = self.cut(target).await;
        if let Err(e) = &r {
            self.fail(e);
        }
        r
    }

    /// Steps 2 to 5 of the module doc, once nothing is in flight.
    async fn cut(&self, target: i64) -> Result<LogEndOffset, LogError> {
        let (seg, later) = {
            let segments = self.segments.borrow();
            let Some((_, seg)) = segments
                .range(..=target)
                .next_back()
                .or_else(|| segments.iter().next())
            else {
                return Err(LogError::Corrupt("no segment to truncate".into()));
            };
            let later: Vec<i64> = segments
                .range(seg.base_offset + 1..)
                .map(|(&b, _)| b)
                .collect();
            (seg.clone(), later)
        };
        let (pos, cut_base) = cut_position(&seg, target)?;
        self.lower_visible(cut_base, cut_base);
        for base in later.iter().rev() {
            self.segments.borrow_mut().remove(base);
        }
        // The deletes, the cut and their fsyncs off the reactor, in the
        // order of the module doc.
        let (dir, log_path) = (self.dir.clone(), seg.log_path.clone());
        glommio::executor()
            .spawn_blocking(move || -> std::io::Result<()> {
                for base in later.iter().rev() {
                    remove_segment_files(&dir, *base);
                }
                let f = std::fs::OpenOptions::new().write(true).open(&log_path)?;
                f.set_len(pos)?;
                f.sync_all()?;
                if !later.is_empty() {
                    super::sync_dir(&dir)?;
                }
                Ok(())
            })
            .await?;
        let fresh = Rc::new(Segment::new(&self.dir, seg.base_offset, seg.created_ms));
        let cfg = self.config.borrow().clone();
        let out = fresh.recover_scan(seg.base_offset, cfg.index_interval_bytes)?;
        if out.valid_len != pos {
            return Err(LogError::Corrupt(format!(
                "truncation of segment {} at position {pos} kept {} valid bytes",
                seg.base_offset, out.valid_len
            )));
        }
        let new_end = fresh.next_offset.get();
        self.reopen_active(fresh, &cfg, new_end).await
    }

    /// `fresh` (recovered) becomes the last and active segment; steps 4 and
    /// 5 of the module doc; waiters for offsets at or past `cut_from` end
    /// with `Truncated`. Returns the new log end.
    async fn reopen_active(
        &self,
        fresh: Rc<Segment>,
        cfg: &super::LogConfig,
        cut_from: i64,
    ) -> Result<LogEndOffset, LogError> {
        let (writer, sync_files) = open_active(&fresh, cfg, &self.arena).await?;
        let new_end = fresh.next_offset.get();
        self.segments
            .borrow_mut()
            .insert(fresh.base_offset, fresh.clone());
        *self.appender.borrow_mut() = Appender::new(writer);
        self.syncer.truncate_to(new_end, sync_files);
        let mut epochs = self.epochs.borrow().clone();
        let epochs_cut = epochs.truncate_from_end(new_end);
        *self.epochs.borrow_mut() = epochs.clone();
        self.lower_visible(new_end, cut_from);
        self.max_ts.set(max_timestamp(&self.segments.borrow()));
        if epochs_cut {
            self.write_epochs(epochs).await?;
        }
        tracing::info!(partition = %self.tp, log_end = new_end, "log truncated");
        Ok(LogEndOffset(new_end))
    }

    /// Lowers what readers and waiters see to `end`, before the files are
    /// touched (so no fetch bounded by the HW reads what is being cut) and
    /// again once the log is reopened: log end, `written`, `durable`, the
    /// HW bound, the tail cache; waiters of offsets at or past `cut_from`
    /// end with `Truncated`.
    fn lower_visible(&self, end: i64, cut_from: i64) {
        if end < self.log_end.get() {
            self.log_end.set(end);
        }
        if self.log_start.get() > end {
            self.log_start.set(end);
        }
        self.tail.remove_from(end);
        self.truncations.record(cut_from);
        self.written.lower_to(end);
        self.durable.lower_to(end);
        if let Some(bound) = &*self.hw_bound.borrow() {
            bound.lower_to(end);
        }
        self.changes.notify();
    }

    /// Writes `epochs` (already the log's cache: the data it describes is
    /// cut) to `leader-epoch-checkpoint`, on the blocking thread.
    async fn write_epochs(
        &self,
        epochs: super::leader_epoch::LeaderEpochCache,
    ) -> Result<(), LogError> {
        let dir = self.dir.clone();
        glommio::executor()
            .spawn_blocking(move || epochs.write(&dir))
            .await?;
        Ok(())
    }

    /// `truncate_fully_and_start_at` once appends are refused.
    async fn restart_at(&self, offset: i64) -> Result<LogEndOffset, LogError> {
        self.drain_writes().await?;
        let r = self.replace_all(offset).await;
        if let Err(e) = &r {
            self.fail(e);
        }
        r
    }

    async fn replace_all(&self, offset: i64) -> Result<LogEndOffset, LogError> {
        // Nothing of the old log is readable from here on.
        self.lower_visible(self.log_start.get().min(offset), i64::MIN);
        let old: Vec<i64> = self.segments.borrow().keys().copied().collect();
        let fresh = Rc::new(Segment::new(&self.dir, offset, super::now_ms()));
        if old.contains(&offset) {
            // The segment at `offset` is emptied in place: it is the one
            // kept, and the only one whose name the new log needs. Its
            // other files go (indexes, `.txnindex`).
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(&fresh.log_path)?;
            f.set_len(0)?;
            f.sync_all()?;
            for ext in ["index", "timeindex", "txnindex"] {
                let _ = std::fs::remove_file(self.dir.join(format!("{offset:020}.{ext}")));
            }
        } else {
            std::fs::File::create(&fresh.log_path)?.sync_all()?;
            super::sync_dir(&self.dir)?;
        }
        for base in old.iter().filter(|&&b| b != offset) {
            self.segments.borrow_mut().remove(base);
            remove_segment_files(&self.dir, *base);
        }
        super::sync_dir(&self.dir)?;
        // Every epoch goes: the log holds no batch (Kafka's `clearAndFlush`).
        *self.epochs.borrow_mut() = Default::default();
        self.write_epochs(Default::default()).await?;
        self.segments.borrow_mut().clear();
        self.tail.remove();
        // The tail cache slot is reused: removing the log's entries keeps it
        // registered (`TailCache::remove_log`).
        let cfg = self.config.borrow().clone();
        fresh.recover_scan(offset, cfg.index_interval_bytes)?;
        // `reopen_active` lowers the offsets; here they may rise too.
        // Every old offset is gone: no waiter of one may succeed.
        let r = self.reopen_active(fresh, &cfg, i64::MIN).await?;
        // Start and end move together, after the last await: a reader in
        // between sees the empty log at the old start, never a start past
        // the end.
        self.log_start.set(offset);
        self.log_end.set(offset);
        self.written.advance(offset);
        self.durable.advance(offset);
        if let Some(bound) = &*self.hw_bound.borrow() {
            bound.advance(offset);
        }
        self.changes.notify();
        Ok(r)
    }
}

/// The file position in `seg` of the first batch with an offset at or
/// past `target` (its size when there is none): where the segment is cut;
/// and that batch's base offset (the segment's next offset when there is
/// none), at or above the end of what is kept (equal unless a compaction
/// left a gap before it).
fn cut_position(seg: &Segment, target: i64) -> Result<(u64, i64), LogError> {
    use std::os::unix::fs::FileExt;
    let file = std::fs::File::open(&seg.log_path)?;
    let size = seg.size.get();
    let mut pos = index_position(seg, target);
    let mut header = [0u8; BATCH_HEADER_BYTES];
    while pos + BATCH_HEADER_BYTES as u64 <= size {
        file.read_exact_at(&mut header, pos)?;
        let h = BatchHeader::parse(&header).map_err(LogError::InvalidBatch)?;
        if h.last_offset() >= target {
            return Ok((pos, h.base_offset));
        }
        pos += h.total_size() as u64;
    }
    Ok((pos.min(size), seg.next_offset.get()))
}
