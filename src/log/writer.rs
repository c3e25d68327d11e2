//! The writer task: does the steps `write_step` chooses, with glommio.
//!
//! Writer task (one per log, spawned on demand, woken by appends, exits when
//! nothing is staged or in flight): it asks [`write_step::next_step`] what
//! to do next for the oldest segment with work, does it (issues a direct
//! write and goes on without waiting for it, writes through the page
//! cache, opens a new segment's file, fallocates, seals), and otherwise
//! waits for a write to complete or for new appends.
//!
//! Two ways to write what is staged:
//! - **Direct (O_DIRECT)**: [`WriterStep::Write`]. Every write of every log
//!   under `--direct-writes`; otherwise the full chunks that no page-cache
//!   write began (a batch that fills a chunk: large batches under load),
//!   usually with the open chunk's pages after them in the same write (see
//!   `write_step`), without the page cache's copy.
//! - **Through the page cache** (`LogConfig::page_cache_writes`, every log
//!   unless `--direct-writes`): any other tail write (a batch that filled
//!   no chunk, or whose pages could not join a direct write), and the rest
//!   of a chunk that such a write began (`Chunk::cached`), is a buffered
//!   `pwrite` of the unwritten pages
//!   (zero-padded past the staged bytes, as a direct tail write is: a
//!   partial-page write over a recycled spare's written blocks would first
//!   read the old page), done when it returns. A log that never syncs
//!   (Kafka's default durability) answers an acks=all produce as soon as
//!   the kernel holds its bytes: they outlive a kill -9 of the broker, not
//!   a power loss, which is Kafka's promise without flush settings. Under
//!   `--fsync-acks` an acks=all produce is still answered only after the
//!   fdatasync that covers the batch; that fdatasync writes the dirty pages
//!   back.
//!   Why: on the 2-core VM a direct write took 130-145 us from issue to
//!   completion (one virtio doorbell, a VM exit, per write) where a buffered
//!   one takes a few us; the broker's own acks=all latency for 100 B
//!   produces fell from p50 0.16 ms to 0.03 ms
//!   (tuning/results/page-cache-writes.md). Under `--fsync-acks` the
//!   device then gets one write-back per fdatasync instead of one direct
//!   write per produce: publish p50 0.89-1.20 ms against 1.14-1.46, p95
//!   2.8-4.7 against 5.8-6.4 (tuning/results/steal-and-client-core.md).
//!   The writer starts the kernel's write-back every `WRITEBACK_KICK_BYTES`
//!   (sync_file_range on glommio's blocking thread), so dirty pages do not
//!   pile up for the next fdatasync.
//!
//! Completions and offsets:
//! - `written` moves to the end of the last whole batch covered by completed
//!   writes with no incomplete write before them (writes can complete out of
//!   order; `SegWriter::complete`); reads never go past a segment's
//!   `written_len`.
//! - a direct write is a blocking `pwritev` on one of the shard's
//!   direct-write threads (`direct`; `DIRECT_WRITE_THREADS` run at once,
//!   the rest wait in their queue), not an io_uring write: an asynchronous
//!   direct write completes through a kernel worker on the CPU that takes
//!   the device's interrupts, and a busy client there starved it for 30 s
//!   (the `direct` module doc has the details).
//! - a sealed segment's file is truncated to its logical length, its
//!   indexes written off the shard, and, unless the log writes through the
//!   page cache, fdatasynced before the writer moves on to the next segment
//!   (a page-cache log's seal is synced in the background: `syncer`).
//!
//! Directory fsyncs: an fdatasync of a file does not make its name durable.
//! A log that fdatasyncs (`LogConfig::syncs`: `--fsync-acks`,
//! `flush.messages`, `flush.ms`) therefore fsyncs the partition directory
//! after creating a file that acknowledged data will live in, before any of
//! that data can count as durable: a new partition's directory (and the
//! data dir's entry for it) and first segment file in `open` (`recovery`),
//! and each segment file a roll creates or renames into place from a spare
//! in `open_segment_file`, before the writer is given the file (so before
//! anything is written to it, and `durable`, the HW under `--fsync-acks`,
//! cannot pass the segment's base offset until it is done). Index files,
//! `.txnindex` entries and spare renames are not covered: recovery rebuilds
//! or ignores them. `dir_sync_count` and `last_dir_sync` show it.
//!
//! Out of file descriptors: opening a new segment's files at a roll, writing
//! a sealed segment's index files and opening the buffered write descriptor
//! need descriptors. When one of them fails with EMFILE or ENFILE (a
//! shortage that passes: connections close, other files are closed) the log
//! is not failed for good, as an I/O error fails it (Kafka takes the log
//! dir offline on any IOException). The writer *stalls*: it retries the
//! step after a pause (`FD_RETRY_FIRST_MS`, doubling up to
//! `FD_RETRY_MAX_MS`), nothing staged is dropped, and while it lasts
//! appends are refused before anything is staged and waits for writes end
//! at once, both with `LogError::Unavailable`, answered KAFKA_STORAGE_ERROR:
//! retriable for Kafka clients (`handlers::errors::log` says why not
//! REQUEST_TIMED_OUT). A batch staged before the stall (the one whose
//! append rolled) is still written once the retry succeeds, so like a
//! timed-out produce its outcome is unknown to its producer: a retry is
//! deduplicated for idempotent producers, and may duplicate for others,
//! exactly as after REQUEST_TIMED_OUT. The first retry that succeeds ends
//! the stall. Opening a partition's log (`open`) out of descriptors fails
//! that open with `Unavailable`; the caller may try again.
//!
//! What this module owns: the task's [`WriterTask`] flags and waker, and
//! the log's [`DirSyncs`]. The task runs on the log's shard and holds an
//! `Rc<PartitionLog>`; it borrows the `Appender` once per step and once per
//! completion, never across an await.

use super::appender::{whole_pages, Appender, Chunk, InFlight, SegWriter};
use super::iobuf::IoBuf;
use super::partition::{io_err, DirSync, PartitionLog};
use super::segment::{write_index_files, Segment};
use super::storage;
use super::syncer::SyncFiles;
use super::write_step::{self, BufferedWrite, WriteMode, WriterStep, PREZERO_SEQ};
use super::{LogError, WRITEBACK_KICK_BYTES};
use futures::stream::{FuturesUnordered, StreamExt};
use glommio::io::{DmaFile, OpenOptions};
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Poll, Waker};

type WriteFuture = std::pin::Pin<Box<dyn std::future::Future<Output = (u64, WriteResult)>>>;
type WriteResult = std::io::Result<usize>;

/// The writer task's state, shared with the appends that wake it.
pub(super) struct WriterTask {
    running: Cell<bool>,
    /// Set by appends while the writer runs: there is new work to issue.
    kicked: Cell<bool>,
    waker: RefCell<Option<Waker>>,
}

impl WriterTask {
    pub(super) fn new() -> WriterTask {
        WriterTask {
            running: Cell::new(false),
            kicked: Cell::new(false),
            waker: RefCell::new(None),
        }
    }

    /// The task runs.
    pub(super) fn running(&self) -> bool {
        self.running.get()
    }

    /// Tells the running task there is new work (false: none runs).
    fn kick(&self) -> bool {
        if !self.running.get() {
            return false;
        }
        self.kicked.set(true);
        if let Some(w) = self.waker.borrow_mut().take() {
            w.wake();
        }
        true
    }

    /// The next completion of a write `in_flight`, or `None` once new
    /// appends kicked the task.
    async fn next_event(
        &self,
        in_flight: &mut FuturesUnordered<WriteFuture>,
    ) -> Option<(u64, WriteResult)> {
        std::future::poll_fn(|cx| {
            if let Poll::Ready(Some(x)) = in_flight.poll_next_unpin(cx) {
                return Poll::Ready(Some(x));
            }
            if self.kicked.get() {
                return Poll::Ready(None);
            }
            *self.waker.borrow_mut() = Some(cx.waker().clone());
            Poll::Pending
        })
        .await
    }

    fn stopped(&self) {
        *self.waker.borrow_mut() = None;
        self.running.set(false);
    }

    /// The task's flags in one line (`PartitionLog::writer_state`).
    pub(super) fn describe(&self) -> String {
        format!(
            "writer_running {} kicked {} waker {}",
            self.running.get(),
            self.kicked.get(),
            self.waker.borrow().is_some(),
        )
    }
}

/// Directory fsyncs done for a log's files, and the last one.
pub(super) struct DirSyncs {
    count: Cell<u64>,
    last: Cell<Option<DirSync>>,
}

impl DirSyncs {
    pub(super) fn new(count: u64, last: Option<DirSync>) -> DirSyncs {
        DirSyncs {
            count: Cell::new(count),
            last: Cell::new(last),
        }
    }

    fn record(&self, sync: DirSync) {
        self.count.set(self.count.get() + 1);
        self.last.set(Some(sync));
    }

    pub(super) fn count(&self) -> u64 {
        self.count.get()
    }

    pub(super) fn last(&self) -> Option<DirSync> {
        self.last.get()
    }
}

/// How the writer loop goes on after a step.
enum Flow {
    /// Choose the next step at once.
    Next,
    /// Nothing to issue: wait for a completion or for appends.
    Wait,
    /// The log failed or closed: the writer ends.
    Stop,
}

impl PartitionLog {
    /// Wakes the writer, or starts it when none runs.
    pub(super) fn kick_writer(&self) {
        if self.writer.kick() {
            return;
        }
        let Some(me) = self.self_weak.upgrade() else {
            return;
        };
        self.writer.running.set(true);
        glommio::spawn_local(async move { me.writer_loop().await }).detach();
    }

    /// The writer task: issues every write it can (full chunks as soon as
    /// they exist, up to `WRITES_IN_FLIGHT_MAX`), then waits for either a
    /// completion or new appends; exits when nothing is staged or in flight.
    async fn writer_loop(self: Rc<Self>) {
        let mut in_flight: FuturesUnordered<WriteFuture> = FuturesUnordered::new();
        // Retries since the writer ran out of file descriptors.
        let mut fd_retries = 0u32;
        loop {
            if self.health.failed() {
                break;
            }
            self.writer.kicked.set(false);
            let step = self.next_writer_step(in_flight.len());
            match self.run_step(step, &mut in_flight, &mut fd_retries).await {
                Flow::Next => continue,
                Flow::Stop => break,
                Flow::Wait => {}
            }
            if in_flight.is_empty() {
                if self.writer.kicked.get() {
                    continue;
                }
                if !self.appender.borrow().idle() {
                    // Work remains that only a completion could unblock, yet
                    // nothing is in flight: a bug. Fail loudly rather than
                    // leave appenders waiting forever.
                    debug_assert!(false, "writer has staged work but cannot issue it");
                    self.fail(&"log writer stalled with staged data");
                }
                break;
            }
            // Wait for a write to complete or for new appends.
            if let Some((seq, r)) = self.writer.next_event(&mut in_flight).await {
                if !self.on_completion(seq, r) {
                    break;
                }
            }
        }
        // A log that failed leaves with writes still queued or running: wait
        // for them, so that their buffers and file are freed, not leaked
        // (`direct::write`), and none lands after the log is reopened.
        while in_flight.next().await.is_some() {}
        self.writer.stopped();
    }

    /// The next step for the oldest segment with work (`write_step`): one
    /// borrow of the appender, one read of the config.
    fn next_writer_step(&self, in_flight: usize) -> WriterStep {
        let mode = WriteMode::of(&self.config.borrow());
        let mut appender = self.appender.borrow_mut();
        let Appender { writers, write_seq } = &mut *appender;
        let Some(w) = writers.front_mut() else {
            return WriterStep::Wait;
        };
        write_step::next_step(w, write_seq, in_flight, mode)
    }

    /// Does `step`: a direct write joins `in_flight`, everything else is
    /// done before this returns.
    async fn run_step(
        &self,
        step: WriterStep,
        in_flight: &mut FuturesUnordered<WriteFuture>,
        fd_retries: &mut u32,
    ) -> Flow {
        match step {
            WriterStep::Wait => Flow::Wait,
            WriterStep::Write {
                file,
                seq,
                pos,
                bufs,
            } => {
                in_flight.push(direct_write(file, seq, pos, bufs));
                Flow::Next
            }
            WriterStep::Open(seg) => {
                let r = self.open_segment_file(&seg).await;
                match self.settle(r, fd_retries).await {
                    Ok(()) => Flow::Next,
                    Err(flow) => flow,
                }
            }
            WriterStep::Grow { file, len } => {
                // Best effort: a filesystem without fallocate still works.
                let _ = file.pre_allocate(len, false).await;
                Flow::Next
            }
            WriterStep::Seal { file, seg } => self.seal(file, seg, fd_retries).await,
            WriterStep::Buffered(b) => {
                // Opening the buffered descriptor can run out of them:
                // nothing was taken from the chunks, retry later.
                let r = self.write_buffered(&b).map_err(LogError::from_io);
                match self.settle(r, fd_retries).await {
                    Ok(written) => {
                        if let Some(off) = written {
                            self.written.advance(off);
                            self.changes.notify();
                        }
                        Flow::Next
                    }
                    Err(flow) => flow,
                }
            }
        }
    }

    /// After a step that may run out of file descriptors: success ends a
    /// stall; `Unavailable` stalls the writer, which then retries the step
    /// (`Err(Flow::Next)`) unless the log closed or failed meanwhile; any
    /// other error fails the log.
    async fn settle<T>(&self, r: Result<T, LogError>, fd_retries: &mut u32) -> Result<T, Flow> {
        match r {
            Ok(v) => {
                self.unstall(fd_retries);
                Ok(v)
            }
            Err(e) if e.is_temporary() => {
                if self.stall(&e, fd_retries).await {
                    Err(Flow::Next)
                } else {
                    Err(Flow::Stop)
                }
            }
            Err(e) => {
                self.fail(&e);
                Err(Flow::Stop)
            }
        }
    }

    /// A completed write (or pre-zeroing write); false if it failed (the
    /// log has failed then).
    fn on_completion(&self, seq: u64, r: WriteResult) -> bool {
        match r {
            Ok(_) if seq == PREZERO_SEQ => self.appender.borrow_mut().zeroing_done(),
            Ok(_) => self.on_write_done(seq),
            Err(e) => {
                self.fail(&e);
                return false;
            }
        }
        true
    }

    /// Records a completed write; moves `written` over the whole batches
    /// now covered by completed writes with nothing unwritten before them.
    fn on_write_done(&self, seq: u64) {
        let next = {
            let mut appender = self.appender.borrow_mut();
            // The write was issued on the front segment's file.
            let Some(w) = appender.writers.front_mut() else {
                return;
            };
            self.record_write_done(w, seq)
        };
        if let Some(off) = next {
            self.written.advance(off);
            self.changes.notify();
        }
    }

    /// Records completed write `seq` of the front segment `w`, whose file
    /// is then the last one written (the one the syncer fdatasyncs); returns
    /// how far `written` moves.
    fn record_write_done(&self, w: &mut SegWriter, seq: u64) -> Option<i64> {
        let files = w.sync_files.clone()?;
        self.syncer.set_last_written(files);
        w.complete(seq)
    }

    /// Does buffered write `b` of the front segment (`WriterStep::Buffered`,
    /// chosen just before: nothing ran since): a `pwrite` of the chunk's
    /// unwritten pages, done when it returns. Starts the kernel's
    /// write-back every `WRITEBACK_KICK_BYTES` of file. Returns how far
    /// `written` moves.
    fn write_buffered(&self, b: &BufferedWrite) -> std::io::Result<Option<i64>> {
        let mut appender = self.appender.borrow_mut();
        let Appender { writers, write_seq } = &mut *appender;
        let Some(w) = writers.front_mut() else {
            return Err(lost_chunk());
        };
        let file = buffered_file(w)?;
        let end = if b.full {
            let Some(mut c) = w.full.pop_front() else {
                return Err(lost_chunk());
            };
            pwrite_pages(&file, &mut c, b)?
        } else {
            let Some(c) = w.open.as_mut() else {
                return Err(lost_chunk());
            };
            pwrite_pages(&file, c, b)?
        };
        if end >= w.kicked_len + WRITEBACK_KICK_BYTES {
            start_writeback(file, w.kicked_len, end);
            w.kicked_len = end;
        }
        let seq = write_seq.take();
        w.inflight.push_back(InFlight {
            seq,
            end_len: end,
            done: true,
        });
        Ok(self.record_write_done(w, seq))
    }

    /// Seals the drained front segment (`WriterStep::Seal`) and drops its
    /// write state; `durable` moves past it once it is synced.
    async fn seal(&self, file: Rc<DmaFile>, seg: Rc<Segment>, fd_retries: &mut u32) -> Flow {
        // A page-cache log fdatasyncs the sealed file in the background:
        // its dirty pages can take long to write, and the next segment's
        // appends need not wait for them.
        let background = self.config.borrow().page_cache_writes();
        // Retried whole: truncating, syncing and writing the indexes again
        // changes nothing already done.
        let r = seal_file(&file, &seg, background).await;
        if let Err(flow) = self.settle(r, fd_retries).await {
            return flow;
        }
        seg.sealed.set(true);
        self.appender.borrow_mut().writers.pop_front();
        if background {
            self.sync_sealed_in_background(file, &seg);
        } else {
            // Past this segment only once earlier background seals (before
            // a mode switch) are synced too.
            if !self.sealed_synced().await {
                return Flow::Stop;
            }
            self.durable.advance(seg.next_offset.get());
            self.changes.notify();
        }
        Flow::Next
    }

    /// Opens the file of a new segment, reusing a spare (recycled) file when
    /// there is one: its blocks are already written, so writes into it and
    /// the fdatasyncs after them carry no extent conversions.
    async fn open_segment_file(&self, seg: &Rc<Segment>) -> Result<(), LogError> {
        self.spares.reuse_as(&seg.log_path, &self.tp);
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .dma_open(&seg.log_path)
            .await
            .map_err(io_err)?;
        let size = f.file_size().await.map_err(io_err)?;
        let sync_files = SyncFiles::open(&seg.log_path).await?;
        // A log that fdatasyncs makes the new file's directory entry (created
        // or renamed from a spare) durable before anything is written to it,
        // so before any of its batches can count as durable: an fdatasync of
        // the file does not cover its name, and a power loss could otherwise
        // take back the whole acknowledged segment.
        if self.config.borrow().syncs() {
            let dir = self.dir.clone();
            glommio::executor()
                .spawn_blocking(move || super::sync_dir(&dir))
                .await
                .map_err(LogError::from_io)?;
            self.dir_syncs.record(DirSync {
                segment_base: seg.base_offset,
                durable_at: self.durable.get(),
            });
        }
        let f = Rc::new(f);
        *seg.dma.borrow_mut() = Some(f.clone());
        if let Some(w) = self.appender.borrow_mut().writers.front_mut() {
            w.file = Some(f);
            w.sync_files = Some(sync_files);
            w.allocated_len = size;
            w.zeroed_len = whole_pages(size);
        }
        Ok(())
    }

    /// The writer ran out of file descriptors (`e`, an `Unavailable`) and
    /// will retry what it was doing after a pause: `attempt` of them failed
    /// before this one. Returns false when the log was closed or failed
    /// meanwhile (the writer then stops; nothing staged was acknowledged).
    async fn stall(&self, e: &LogError, attempt: &mut u32) -> bool {
        if !self.health.stalled() {
            tracing::warn!(partition = %self.tp, error = %e,
                "log writer is out of file descriptors; refusing appends and retrying");
            let why = match e {
                LogError::Unavailable(why) => why.clone(),
                other => other.to_string(),
            };
            self.health.set_stalled(why);
            // Waiters for writes answer now (a retriable error) instead of
            // at their timeout.
            self.written.wake_all();
            self.durable.wake_all();
            self.changes.notify();
        }
        let pause = super::FD_RETRY_FIRST_MS
            .saturating_mul(1 << (*attempt).min(16))
            .min(super::FD_RETRY_MAX_MS);
        *attempt += 1;
        glommio::timer::sleep(std::time::Duration::from_millis(pause)).await;
        !self.health.failed() && !self.health.closed()
    }

    /// What the stalled writer retried succeeded: the log works again.
    fn unstall(&self, attempt: &mut u32) {
        if self.health.end_stall() {
            tracing::info!(partition = %self.tp, retries = *attempt,
                "log writer has file descriptors again; appends accepted");
        }
        *attempt = 0;
    }
}

/// A direct write of `bufs` from `pos` on the shard's direct-write threads
/// (`direct`), after `--debug-write-delay-ms`.
fn direct_write(file: Rc<DmaFile>, seq: u64, pos: u64, bufs: Vec<IoBuf>) -> WriteFuture {
    let delay_ms = super::debug_write_delay_ms();
    Box::pin(async move {
        if delay_ms > 0 {
            glommio::timer::sleep(std::time::Duration::from_millis(delay_ms)).await;
        }
        (seq, storage::write_direct(file, bufs, pos).await)
    })
}

/// The chunk a buffered write was chosen for is gone, though nothing ran
/// between the choice and the write: a bug, which fails the log loudly
/// rather than choosing the same write forever.
fn lost_chunk() -> std::io::Error {
    debug_assert!(false, "buffered write without its chunk");
    std::io::Error::other("log writer lost the chunk of a buffered write")
}

/// The segment's buffered (page cache) write descriptor, opened on first
/// use.
fn buffered_file(w: &mut SegWriter) -> std::io::Result<Arc<std::fs::File>> {
    if let Some(f) = &w.buffered {
        return Ok(f.clone());
    }
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&w.seg.log_path)?;
    Ok(w.buffered.insert(Arc::new(f)).clone())
}

/// Writes the pages `b` names of chunk `c` through `file`: whole pages,
/// zero-padded past the staged bytes (room later appends overwrite): a
/// partial-page buffered write over written blocks (a recycled spare's)
/// would first read the old page from the device. Returns the file
/// position after the chunk's staged bytes.
fn pwrite_pages(file: &std::fs::File, c: &mut Chunk, b: &BufferedWrite) -> std::io::Result<u64> {
    // `write_step` chose these pages from this chunk, and nothing ran since.
    debug_assert_eq!(c.unwritten_range(), (b.from, b.to));
    c.buf.as_bytes_mut()[c.len..b.to].fill(0);
    storage::write_buffered(file, &c.buf.as_bytes()[b.from..b.to], c.pos + b.from as u64)?;
    c.issued = c.len;
    c.cached = true;
    Ok(c.end())
}

/// Truncates a sealed segment's file to its logical length, fdatasyncs it
/// unless that happens in the background, and writes its indexes.
async fn seal_file(file: &DmaFile, seg: &Segment, background: bool) -> Result<(), LogError> {
    file.truncate(seg.size.get()).await.map_err(io_err)?;
    if !background {
        storage::fdatasync(file).await?;
    }
    seg.final_time_entry();
    write_indexes_off_shard(seg).await
}

/// Writes a segment's `.index` and `.timeindex` on glommio's blocking
/// thread: creating and fdatasyncing them took the shard 1.5–3.5 ms at
/// every roll of a saturating run (tuning/results/latency-and-throughput.md),
/// time in which it served no request of any partition.
pub(super) async fn write_indexes_off_shard(seg: &Segment) -> Result<(), LogError> {
    let files = seg.encoded_indexes();
    glommio::executor()
        .spawn_blocking(move || write_index_files(&files))
        .await
        .map_err(LogError::from_io)
}

/// Starts the kernel's write-back of file range `[from, to)` without waiting
/// for it (`sync_file_range(SYNC_FILE_RANGE_WRITE)`), on glommio's blocking
/// thread: the call can block while the device queue is full.
fn start_writeback(file: Arc<std::fs::File>, from: u64, to: u64) {
    use std::os::fd::AsRawFd;
    let blocking = glommio::executor().spawn_blocking(move || {
        // SAFETY: a plain syscall on the descriptor `file` keeps open.
        unsafe {
            libc::sync_file_range(
                file.as_raw_fd(),
                from as libc::off64_t,
                (to - from) as libc::off64_t,
                libc::SYNC_FILE_RANGE_WRITE,
            )
        }
    });
    // Best effort: write-back runs anyway; this only starts it earlier.
    glommio::spawn_local(async move {
        let _ = blocking.await;
    })
    .detach();
}
