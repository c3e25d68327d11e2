//! One partition's log: append, the writer (page cache or direct I/O),
//! group-commit fsync, reads, recovery, roll and retention.
//!
//! This file is the façade: [`PartitionLog`] and every operation the rest
//! of the broker calls on it. The work is done by the parts it owns, each
//! in a module of its own whose doc says what it owns and why it is built
//! that way:
//! - `appender`: the append path and staging. An append is synchronous: the
//!   batch is patched, copied once into page-aligned chunks of the active
//!   segment's `SegWriter`, indexed and cached; chunks that fill up queue
//!   for writing as they are.
//! - `write_step`: the one place where the next I/O step is chosen
//!   (`WriterStep`), from the staging
//!   state alone and without I/O: coalesced direct writes of full chunks,
//!   tail writes, writes through the page cache, growth, pre-zeroing,
//!   seals.
//! - `writer`: the writer task that does those steps with glommio (direct
//!   writes on the shard's direct-write threads, buffered `pwrite`s,
//!   segment files, seals), why small writes go through the page cache,
//!   directory fsyncs, and the stall of a writer out of file descriptors.
//! - `syncer`: group commit (`SYNCS_IN_FLIGHT_MAX` fdatasyncs at once, each
//!   on a file description of its own, and why), and the background syncs
//!   of the segments a page-cache log seals.
//! - `reader`: fetches (the tail cache, catch-up reads with read-ahead or
//!   sendfile), ListOffsets by timestamp, scans.
//! - `retention`: rolls, retention, DeleteRecords, and the spare files that
//!   deleted segments leave for later rolls.
//! - `recovery`: open (the recovery scan, the active segment's partial
//!   page) and close.
//! - `replica`: what a replicated partition adds: appends of the leader's
//!   batches unchanged at the leader's offsets, leader epochs started at
//!   run time (`become_leader`), the HW set from outside.
//! - `truncate`: truncation of the tail (a follower whose log diverged),
//!   and `truncate_fully_and_start_at`; the crash-safety argument.
//!
//! Offsets: log start ≤ `written` ≤ log end, and `durable` ≤ `written`;
//! the HW is `written`, or `durable` under `--fsync-acks` (`log`'s module
//! doc), and for a replicated log no more than the HW set from outside
//! (`replica`). Appends move the log end; the writer moves `written` (and,
//! for a sealed segment it syncs itself, `durable`); the syncer and the
//! background seals move `durable`; retention and DeleteRecords move the
//! log start; only a truncation moves the log end, `written`, `durable`
//! and the HW back.
//!
//! Health: an I/O error fails the log for good (`LogError::Failed`, Kafka's
//! offline log dir; `PartitionLog::fail` wakes every waiter); a writer
//! out of file descriptors stalls it while that lasts
//! (`LogError::Unavailable`, see `writer`); a closed log refuses all work.
//!
//! Owned by one shard; handlers keep `Rc<PartitionLog>` across awaits.
//! All state is `Cell`/`RefCell` (!Send); the staging state is one
//! `RefCell<Appender>`, borrowed once per append and once per writer step
//! or completion, never across an await.

use super::appender::{self, Appender};
use super::cache::TailCache;
use super::changes::{ChangeSignal, Subscribers};
use super::iobuf::IoArena;
use super::leader_epoch::LeaderEpochCache;
use super::reader::TailSlot;
use super::recovery::Recovery;
use super::retention::Spares;
use super::segment::Segment;
use super::syncer::{Seals, Syncer};
use super::watch::OffsetWatch;
use super::writer::{DirSyncs, WriterTask};
use super::{AppendInfo, LogConfig, LogError, ReadResult};
use crate::record::batch::BatchHeader;
use crate::types::{
    HighWatermark, LastStableOffset, LogEndOffset, LogStartOffset, Offset, TopicPartition,
};
use bytes::{Bytes, BytesMut};
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::rc::{Rc, Weak};

/// One partition's log. See the module doc.
pub struct PartitionLog {
    pub(super) tp: TopicPartition,
    pub(super) dir: PathBuf,
    pub(super) arena: Rc<IoArena>,
    pub(super) config: RefCell<LogConfig>,
    /// Every segment, by base offset; the last one is the active segment.
    pub(super) segments: RefCell<BTreeMap<i64, Rc<Segment>>>,
    pub(super) log_start: Cell<i64>,
    pub(super) log_end: Cell<i64>,
    /// (max timestamp, last offset) of the batch with the largest max
    /// timestamp.
    pub(super) max_ts: Cell<Option<(i64, i64)>>,
    /// The offset after the last batch written to the file, and after the
    /// last one covered by an fdatasync.
    pub(super) written: OffsetWatch,
    pub(super) durable: OffsetWatch,
    pub(super) health: Health,
    /// Who to tell when the HW, LSO, log start or health change
    /// (`changes`).
    pub(super) changes: Subscribers,
    /// Staged bytes and the writes of them (`appender`).
    pub(super) appender: RefCell<Appender>,
    /// The writer task's flags (`writer`).
    pub(super) writer: WriterTask,
    /// Group commit (`syncer`).
    pub(super) syncer: Syncer,
    /// Background seals of a page-cache log (`syncer`).
    pub(super) seals: Seals,
    /// This log's part of the shard's tail cache (`reader`).
    pub(super) tail: TailSlot,
    /// Files of deleted segments kept for reuse by the next roll
    /// (`retention`).
    pub(super) spares: Spares,
    /// Directory fsyncs done for this log's files (`writer`).
    pub(super) dir_syncs: DirSyncs,
    /// Segments recovery scanned when the log was opened.
    pub(super) segments_scanned: u32,
    /// Where each leader epoch starts (`leader_epoch`), kept on disk in
    /// `leader-epoch-checkpoint`.
    pub(super) epochs: RefCell<LeaderEpochCache>,
    /// The epoch leader appends stamp: the one this log was opened in
    /// (`LogConfig::leader_epoch`, or the newest of `epochs` if that is
    /// newer), or the one [`Self::become_leader`] set since (`replica`).
    pub(super) leader_epoch: Cell<i32>,
    /// The high watermark as set from outside, for a replicated partition
    /// (`replica`): `None` while the HW is derived locally.
    pub(super) hw_bound: RefCell<Option<Rc<OffsetWatch>>>,
    /// A truncation runs (`truncate`): appends are refused.
    pub(super) truncating: Cell<bool>,
    /// The recent truncations, so that a waiter for an offset they cut
    /// away is not told it is written or durable (`truncate`).
    pub(super) truncations: super::truncate::Truncations,
    /// The manager that opened the log: a truncation rewrites the shard's
    /// checkpoints through it before it returns (`truncate`).
    pub(super) checkpointer: RefCell<Option<Weak<super::LogManager>>>,
    pub(super) self_weak: Weak<PartitionLog>,
}

/// Whether a log can still work: failed for good after an I/O error,
/// stalled while its writer is out of file descriptors, or closed.
pub(super) struct Health {
    failed: RefCell<Option<String>>,
    /// The writer is out of file descriptors and retries (see `writer`'s
    /// module doc); why, while it lasts.
    stalled: RefCell<Option<String>>,
    closed: Cell<bool>,
}

impl Health {
    pub(super) fn new() -> Health {
        Health {
            failed: RefCell::new(None),
            stalled: RefCell::new(None),
            closed: Cell::new(false),
        }
    }

    pub(super) fn failed(&self) -> bool {
        self.failed.borrow().is_some()
    }

    pub(super) fn stalled(&self) -> bool {
        self.stalled.borrow().is_some()
    }

    pub(super) fn closed(&self) -> bool {
        self.closed.get()
    }

    /// The log failed, or its writer is out of file descriptors: a waiter
    /// for a write stops waiting.
    fn write_blocked(&self) -> bool {
        self.failed() || self.stalled()
    }

    pub(super) fn check_usable(&self) -> Result<(), LogError> {
        if let Some(e) = &*self.failed.borrow() {
            return Err(LogError::Failed(e.clone()));
        }
        if self.closed.get() {
            return Err(LogError::Closed);
        }
        Ok(())
    }

    /// `check_usable`, and the writer is not out of file descriptors (then
    /// `Unavailable`: appends are refused and waits for writes end, with a
    /// retriable error, until its retry succeeds).
    pub(super) fn check_writable(&self) -> Result<(), LogError> {
        self.check_usable()?;
        if let Some(e) = &*self.stalled.borrow() {
            return Err(LogError::Unavailable(e.clone()));
        }
        Ok(())
    }

    /// The first failure is the one kept.
    fn set_failed(&self, e: &dyn std::fmt::Display) {
        let mut f = self.failed.borrow_mut();
        if f.is_none() {
            *f = Some(e.to_string());
        }
    }

    pub(super) fn set_stalled(&self, why: String) {
        *self.stalled.borrow_mut() = Some(why);
    }

    /// Ends a stall; true if there was one.
    pub(super) fn end_stall(&self) -> bool {
        self.stalled.borrow_mut().take().is_some()
    }
}

/// A glommio I/O error as a `LogError`; out of file descriptors it is
/// `Unavailable` (the writer retries, see `writer`'s module doc).
pub(super) fn io_err(e: glommio::GlommioError<()>) -> LogError {
    if super::out_of_fds(e.raw_os_error()) {
        return LogError::Unavailable(format!("out of file descriptors: {e}"));
    }
    LogError::Io(e.into())
}

/// One directory fsync of a log ([`PartitionLog::last_dir_sync`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DirSync {
    /// The segment whose file the directory fsync made durable.
    pub segment_base: i64,
    /// The log's `durable` offset when the fsync had completed. At or below
    /// `segment_base` means it came before any offset of that segment was
    /// durable, so before any of them was acknowledged under
    /// `--fsync-acks`.
    pub durable_at: i64,
}

impl PartitionLog {
    /// Opens (creating if missing) and recovers the log in `dir`.
    /// `recovery.point`: segments wholly below it are trusted (indexes
    /// loaded and sanity-checked); the segment holding it and every later
    /// one, and the last one unless `recovery.clean_shutdown` lets it be
    /// trusted too, are scanned and their CRCs verified (`recovery`).
    pub(crate) async fn open(
        dir: PathBuf,
        tp: TopicPartition,
        config: LogConfig,
        cache: Rc<TailCache>,
        arena: Rc<IoArena>,
        recovery: Recovery,
        log_start_checkpoint: Option<i64>,
    ) -> Result<Rc<PartitionLog>, LogError> {
        super::recovery::open(
            dir,
            tp,
            config,
            cache,
            arena,
            recovery,
            log_start_checkpoint,
        )
        .await
    }

    /// Segments the opening of this log scanned (0: every one was trusted).
    pub fn segments_scanned(&self) -> u32 {
        self.segments_scanned
    }

    pub fn topic_partition(&self) -> &TopicPartition {
        &self.tp
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Takes the log offline after an I/O error `e` and wakes every waiter.
    pub(super) fn fail(&self, e: &dyn std::fmt::Display) {
        tracing::error!(partition = %self.tp, error = %e, "log i/o failed; log taken offline");
        self.health.set_failed(e);
        self.written.wake_all();
        self.durable.wake_all();
        self.seals.wake_all();
        self.syncer.wake_all();
        self.changes.notify();
    }

    /// Appends ONE already-validated v2 batch held in an allocation of its
    /// own; see the module doc.
    pub fn append(&self, batch: BytesMut) -> Result<AppendInfo, LogError> {
        let allocation_bytes = batch.capacity();
        self.append_from(batch, allocation_bytes)
    }

    /// [`Self::append`] for a batch that is a slice of a larger allocation
    /// of `allocation_bytes` (a request frame's receive buffer), which a
    /// zero-copy cache entry would keep alive: the tail cache copies the
    /// batch if it is a small part of it (`cache`). See `appender`.
    pub fn append_from(
        &self,
        mut batch: BytesMut,
        allocation_bytes: usize,
    ) -> Result<AppendInfo, LogError> {
        // Refused, not staged, while the writer is out of file descriptors:
        // the producer retries, nothing of this batch is written.
        self.check_appendable()?;
        let base = self.log_end.get();
        // The epoch stamped is the newest of the epoch cache: recovery or
        // `become_leader` assigned it, so this append starts no epoch,
        // except after a truncation took the epoch's only batches away
        // (then it starts again here, `start_epoch`). A log whose cache
        // holds a newer epoch follows a newer leader: refused.
        let epoch = self.leader_epoch.get();
        self.start_epoch(epoch, base)?;
        let h = appender::prepare_batch(&mut batch, base, epoch)?;
        Ok(self.stage_appended(batch.freeze(), &h, allocation_bytes))
    }

    /// Appends refused: closed, failed, writer out of file descriptors
    /// (`Unavailable`), or a truncation running (`Truncating`).
    pub(super) fn check_appendable(&self) -> Result<(), LogError> {
        self.health.check_writable()?;
        if self.truncating.get() {
            return Err(LogError::Truncating);
        }
        Ok(())
    }

    /// The append path after the batch is checked and its header final
    /// (`h`): roll if due, stage its bytes and index entries, move the log
    /// end and max timestamp, cache it, wake the writer and, when
    /// acknowledgements or `flush.messages` want it, the syncer. Shared by
    /// leader appends and replica appends (`replica`).
    pub(super) fn stage_appended(
        &self,
        batch: Bytes,
        h: &BatchHeader,
        allocation_bytes: usize,
    ) -> AppendInfo {
        let base = h.base_offset;
        let last = h.last_offset();
        let cfg = self.config.borrow().clone();
        self.maybe_roll(&cfg, batch.len() as u64, last);
        if let Err(e) = self
            .appender
            .borrow_mut()
            .stage_batch(&batch, h, cfg.index_interval_bytes)
        {
            // No active segment: only a bug gets here; fail loudly.
            self.fail(&e);
        }
        self.log_end.set(last + 1);
        crate::metrics::record_append(batch.len());
        match self.max_ts.get() {
            Some((ts, _)) if ts >= h.max_timestamp => {}
            _ => self.max_ts.set(Some((h.max_timestamp, last))),
        }
        self.tail.insert(base, last, batch, allocation_bytes);
        self.kick_writer();
        if cfg.fsync_acks || (last + 1 - self.durable.get()) >= cfg.flush_messages {
            self.request_sync(last);
        }
        AppendInfo {
            base_offset: Offset(base),
            last_offset: Offset(last),
            log_start_offset: self.log_start_offset(),
        }
    }

    /// Rolls the active segment now if it is not empty (segment.ms checks,
    /// tests). The new segment starts at the log end.
    pub fn roll(&self) {
        if self.health.check_writable().is_err() {
            return;
        }
        let cfg = LogConfig {
            segment_bytes: 0,
            ..self.config.borrow().clone()
        };
        self.maybe_roll(&cfg, 0, self.log_end.get());
        self.kick_writer();
    }

    /// The writer's state in one line, for diagnosing a write that does not
    /// complete (logged when a produce times out waiting for one).
    pub fn writer_state(&self) -> String {
        let appender = self.appender.borrow();
        format!(
            "written {} durable {} log_end {} {} writers {} front: {}",
            self.written.get(),
            self.durable.get(),
            self.log_end.get(),
            self.writer.describe(),
            appender.writers.len(),
            appender.describe_front(),
        )
    }

    /// What an acknowledgement of `offset` waits for: its fdatasync when
    /// `durable` (`--fsync-acks`), else its file write.
    pub async fn wait_acked(&self, offset: Offset, durable: bool) -> Result<(), LogError> {
        if durable {
            self.wait_durable(offset).await
        } else {
            self.wait_written(offset).await
        }
    }

    /// [`Self::wait_acked`] as this log acknowledges: durable under
    /// `--fsync-acks`, else written.
    pub async fn wait_locally_acked(&self, offset: Offset) -> Result<(), LogError> {
        let durable = self.config.borrow().fsync_acks;
        self.wait_acked(offset, durable).await
    }

    /// Resolves when the file write covering `offset` has completed.
    /// Ends with `Unavailable` while the writer is out of file descriptors.
    /// Ends with `Truncated` if a truncation cut `offset` away meanwhile.
    pub async fn wait_written(&self, offset: Offset) -> Result<(), LogError> {
        let since = self.truncations.generation();
        loop {
            self.check_not_truncated(since, offset.0)?;
            if self.written.get() > offset.0 {
                return Ok(());
            }
            self.health.check_writable()?;
            self.written
                .wait_above(offset.0, || self.health.write_blocked())
                .await;
        }
    }

    /// Resolves after an fdatasync covering `offset` (group commit). Ends
    /// with `Unavailable` while the writer is out of file descriptors.
    /// Ends with `Truncated` if a truncation cut `offset` away meanwhile.
    pub async fn wait_durable(&self, offset: Offset) -> Result<(), LogError> {
        let since = self.truncations.generation();
        loop {
            self.check_not_truncated(since, offset.0)?;
            if self.durable.get() > offset.0 {
                return Ok(());
            }
            self.health.check_writable()?;
            self.request_sync(offset.0);
            self.durable
                .wait_above(offset.0, || self.health.write_blocked())
                .await;
        }
    }

    /// Flushes everything appended so far (fdatasync) — flush.ms and shutdown.
    pub async fn flush(&self) -> Result<(), LogError> {
        let end = self.log_end.get();
        if end > 0 && self.durable.get() < end {
            self.wait_durable(Offset(end - 1)).await?;
        }
        Ok(())
    }

    pub fn log_start_offset(&self) -> LogStartOffset {
        LogStartOffset(self.log_start.get())
    }

    /// The high watermark: what is locally acknowledged (`written`, or
    /// `durable` under `--fsync-acks`), and for a replicated partition
    /// no more than the HW set from outside (`replica`).
    pub fn high_watermark(&self) -> HighWatermark {
        let acked = self.acked_offset();
        match &*self.hw_bound.borrow() {
            Some(bound) => HighWatermark(bound.get().min(acked)),
            None => HighWatermark(acked),
        }
    }

    /// The offset after the last batch locally acknowledged: written, or
    /// durable under `--fsync-acks`.
    pub fn acked_offset(&self) -> i64 {
        if self.config.borrow().fsync_acks {
            self.durable.get()
        } else {
            self.written.get()
        }
    }

    /// Equals the HW until transactions land.
    pub fn last_stable_offset(&self) -> LastStableOffset {
        LastStableOffset(self.high_watermark().0)
    }

    /// OffsetForLeaderEpoch's answer for `epoch`: the largest known epoch
    /// ≤ `epoch` and the offset where it ends (the log end for the current
    /// epoch), or (-1, -1); Kafka's rules, `leader_epoch`'s module doc.
    pub fn end_offset_for_epoch(&self, epoch: i32) -> (i32, i64) {
        self.epochs
            .borrow()
            .end_offset_for(epoch, self.log_end.get())
    }

    /// The leader epoch `offset` was appended in, or -1 (Kafka's
    /// `epochForOffset`, what ListOffsets reports with an offset).
    pub fn epoch_for_offset(&self, offset: Offset) -> i32 {
        self.epochs
            .borrow()
            .epoch_for_offset(offset.0)
            .unwrap_or(super::leader_epoch::UNDEFINED_EPOCH)
    }

    /// The leader epoch this node leads the partition in; see
    /// `types::FIRST_LEADER_EPOCH`.
    pub fn leader_epoch(&self) -> i32 {
        self.leader_epoch.get()
    }

    pub fn log_end_offset(&self) -> LogEndOffset {
        LogEndOffset(self.log_end.get())
    }

    /// The offset after the last batch written to the file.
    pub fn written_offset(&self) -> Offset {
        Offset(self.written.get())
    }

    /// The offset after the last batch covered by an fdatasync.
    pub fn durable_offset(&self) -> Offset {
        Offset(self.durable.get())
    }

    /// The recovery point to checkpoint: the base offset of the oldest
    /// segment not yet sealed (every older segment is synced, with its
    /// indexes on disk).
    pub fn recovery_point(&self) -> i64 {
        if let Some(base) = self.seals.oldest_base() {
            return base;
        }
        self.appender
            .borrow()
            .front_base()
            .unwrap_or(self.log_end.get())
    }

    /// Flags `slot` in `signal` whenever what a fetch answer reports of
    /// this log may change (`changes`' module doc), until unsubscribed.
    pub fn subscribe(&self, signal: &Rc<ChangeSignal>, slot: u32) {
        self.changes.subscribe(signal, slot);
    }

    pub fn unsubscribe(&self, signal: &Rc<ChangeSignal>, slot: u32) {
        self.changes.unsubscribe(signal, slot);
    }

    /// Tells the subscribers that something a fetch reports changed which
    /// the log does not see itself (a marker moved the last stable offset).
    pub fn notify_changed(&self) {
        self.changes.notify();
    }

    /// Subscriptions held (live or not yet pruned).
    pub fn subscribers(&self) -> usize {
        self.changes.len()
    }

    /// Resolves once the HW is > `offset`, or the log is closed or failed.
    /// For a replicated partition both the HW set from outside and the
    /// local acknowledgement must pass `offset`.
    pub async fn wait_for_hw_above(&self, offset: Offset) {
        let bound = self.hw_bound.borrow().clone();
        if let Some(bound) = bound {
            if !bound.wait_above(offset.0, || self.health.failed()).await {
                return;
            }
        }
        let fsync = self.config.borrow().fsync_acks;
        let watch = if fsync { &self.durable } else { &self.written };
        watch.wait_above(offset.0, || self.health.failed()).await;
    }

    /// Whole batches from the one containing `from`, all with offsets <
    /// `upper`, up to `max_bytes` but at least one batch if any is readable
    /// (`reader`).
    pub async fn read(
        &self,
        from: Offset,
        max_bytes: usize,
        upper: Offset,
    ) -> Result<ReadResult, LogError> {
        self.read_batches(from, max_bytes, upper).await
    }

    /// ListOffsets by timestamp: the first offset whose timestamp is >=
    /// `ts_ms` and that record's timestamp (record-exact for uncompressed
    /// batches; for compressed ones the records are decompressed).
    pub async fn offset_for_timestamp(
        &self,
        ts_ms: i64,
    ) -> Result<Option<(Offset, i64)>, LogError> {
        self.find_timestamp(ts_ms).await
    }

    /// (timestamp, offset) of the batch with the largest max timestamp; the
    /// offset is that batch's last offset.
    pub fn max_timestamp(&self) -> Option<(i64, Offset)> {
        self.max_ts.get().map(|(t, o)| (t, Offset(o)))
    }

    pub fn config(&self) -> LogConfig {
        self.config.borrow().clone()
    }

    pub fn set_config(&self, config: LogConfig) {
        *self.config.borrow_mut() = config;
        // `fsync_acks` picks which offset is the high watermark.
        self.changes.notify();
    }

    pub fn size_bytes(&self) -> u64 {
        self.segments.borrow().values().map(|s| s.size.get()).sum()
    }

    pub fn segment_count(&self) -> usize {
        self.segments.borrow().len()
    }

    pub fn segment_base_offsets(&self) -> Vec<i64> {
        self.segments.borrow().keys().copied().collect()
    }

    /// Visits every written batch from `from` to the log end.
    pub async fn scan(
        &self,
        from: Offset,
        f: &mut dyn FnMut(&BatchHeader, &[u8]),
    ) -> Result<(), LogError> {
        self.scan_batches(from, f).await
    }

    /// Deletes whole segments (never the active one, never any with data at
    /// or above the HW) by retention.ms / retention.bytes. Returns how many.
    pub fn apply_retention(&self, now_ms: i64) -> Result<usize, LogError> {
        Ok(self.delete_by_retention(now_ms))
    }

    /// Deletes whole sealed segments whose every offset is below `offset`
    /// and moves the log start up to the first kept segment. Used by
    /// coordinators that bound an internal topic by re-writing their live
    /// state (the equivalent of compaction); never touches the active
    /// segment. Returns how many segments were deleted.
    pub fn delete_segments_below(&self, offset: Offset) -> Result<usize, LogError> {
        self.health.check_usable()?;
        Ok(self.delete_sealed_below(offset.0))
    }

    /// DeleteRecords (Kafka's `maybeIncrementLogStartOffset`): moves the log
    /// start up to `offset` and deletes the sealed segments whose every
    /// offset lies below it at once (Kafka leaves that to its next retention
    /// pass). `offset` must lie in `[0, HW]`, else OFFSET_OUT_OF_RANGE; the
    /// log start never moves back, so an offset at or below it changes
    /// nothing. Returns the log start after the call, the partition's low
    /// watermark. Records below it in the first kept batch stay on disk and
    /// are still returned within that batch, as Kafka does; the consumer
    /// skips them. The caller persists the new log start (a checkpoint).
    pub fn delete_records_before(&self, offset: Offset) -> Result<LogStartOffset, LogError> {
        self.delete_records(offset)
    }

    /// Runs the flush.ms policy: fsync if the oldest unsynced data is older.
    pub async fn maybe_flush_by_time(&self, now_ms: i64) -> Result<(), LogError> {
        let flush_ms = self.config.borrow().flush_ms;
        if flush_ms != i64::MAX
            && self.durable.get() < self.log_end.get()
            && now_ms - self.syncer.last_flush_ms() >= flush_ms
        {
            self.flush().await?;
        }
        Ok(())
    }

    /// Rolls the active segment if segment.ms elapsed (checked on append too).
    pub fn maybe_roll_by_time(&self, now_ms: i64) {
        if self.health.check_usable().is_err() {
            return;
        }
        let cfg = self.config.borrow().clone();
        let old =
            self.appender.borrow().writers.back().is_some_and(|w| {
                w.seg.size.get() > 0 && now_ms - w.seg.created_ms > cfg.segment_ms
            });
        if old {
            self.roll();
        }
    }

    /// Writes everything, seals the active segment's file (ftruncate to its
    /// logical length, fdatasync, indexes), and refuses further work
    /// (`recovery`).
    pub async fn close(&self) -> Result<(), LogError> {
        if self.health.closed() {
            return Ok(());
        }
        let r = self.close_inner().await;
        self.mark_closed();
        r
    }

    /// Resolves when no write, seal or fdatasync of this log is running.
    /// Once the log is closed (`mark_closed`) nothing starts another, so a
    /// deleted log's directory gets no file back after it is removed.
    pub(crate) async fn wait_idle(&self) {
        while self.io_running() {
            glommio::timer::sleep(std::time::Duration::from_millis(1)).await;
        }
    }

    /// A kill -9 of the node that holds this log, for the cluster
    /// simulation (`shard::cluster_sim`), which runs several nodes on one
    /// thread: the log fails (its writer issues nothing more; the writes
    /// already issued land, as the kernel completes what it accepted) and
    /// closes; resolves once none of its I/O runs, so that none lands
    /// after the node's restart reopens its files.
    #[cfg(test)]
    pub(crate) async fn simulate_kill(&self) {
        self.fail(&"simulated kill -9 of the node");
        self.mark_closed();
        self.wait_idle().await;
    }

    /// Drops the cache entries of this log (used by delete).
    pub(crate) fn mark_closed(&self) {
        self.health.closed.set(true);
        self.written.close();
        self.durable.close();
        if let Some(bound) = &*self.hw_bound.borrow() {
            bound.close();
        }
        self.seals.close();
        self.syncer.close();
        self.tail.remove();
        self.changes.notify();
    }

    /// Directory fsyncs done for this log's files since open (a new
    /// partition's directory and first file, each segment file a roll
    /// creates or renames into place), by logs that fdatasync only.
    pub fn dir_sync_count(&self) -> u64 {
        self.dir_syncs.count()
    }

    /// The last directory fsync, if any (see [`DirSync`]).
    pub fn last_dir_sync(&self) -> Option<DirSync> {
        self.dir_syncs.last()
    }

    /// The writer is out of file descriptors and retries; why.
    pub fn stalled(&self) -> Option<String> {
        self.health.stalled.borrow().clone()
    }

    /// fdatasyncs issued by the group-commit syncer since open.
    pub fn fsync_count(&self) -> u64 {
        self.syncer.fsyncs()
    }

    /// The most fdatasyncs the group-commit syncer has run at once since
    /// open (at most `SYNCS_IN_FLIGHT_MAX`).
    pub fn fsyncs_in_flight_peak(&self) -> usize {
        self.syncer.in_flight_peak()
    }

    /// Staged bytes not yet known written.
    pub fn pending_bytes(&self) -> usize {
        self.appender.borrow().pending_bytes()
    }
}
