//! One partition's log: append, the writer (page cache or direct I/O),
//! group-commit fsync, reads, recovery, roll and retention.
//!
//! Append path (synchronous, no await): the batch's `baseOffset` and
//! `partitionLeaderEpoch` are patched in place (outside the CRC), its bytes
//! are staged (below), the indexes are updated, and the batch goes into the
//! shard's tail cache: as `Bytes`, no copy, unless it is a small part of the
//! request frame it was cut from (`append_from`; see `cache`), which it
//! would keep alive whole.
//!
//! Staging: `append` copies the batch straight into page-aligned chunks of
//! `write_chunk_bytes`, one copy in all. Chunks come from the shard's
//! `IoArena` (`iobuf`: huge pages, so a direct write of a large chunk pins
//! one folio and sends the device one segment, not one per 4 KiB page).
//! A chunk's buffer may hold another log's old bytes: every write pads
//! what it sends past the staged bytes with zeros. A batch that fills
//! several such chunks is staged in larger ones (up to
//! `STAGING_CHUNK_MAX_BYTES`, each filled whole; `staging_chunk_size`), so
//! it costs a few writes, not one per `write_chunk_bytes`. Batches of
//! `STREAM_COPY_MIN_BYTES` or more are copied with stores that bypass the
//! cache (`copy`). A chunk that fills up is queued for writing as it is (no
//! second copy); the last, partially filled chunk stays open.
//!
//! Two ways to write what is staged:
//! - **Direct (O_DIRECT)**: the writer task below. Every write of every log
//!   under `--direct-writes`; otherwise the full chunks that no page-cache
//!   write began (a batch that fills a chunk: large batches under load),
//!   usually with the open chunk's pages after them in the same write (see
//!   the writer below), without the page cache's copy.
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
//! A buffered and a direct write of one page never race: a buffered write
//! of a chunk waits while a direct tail write of that chunk (its pages
//! joined a direct write of full chunks, or a config change turned
//! `direct_writes` off) or a pre-zeroing write over its pages is in
//! flight, chunks are page aligned, and a direct write over pages written
//! through the page cache is coherent (the kernel writes them back and
//! drops them first).
//!
//! Writer task (one per log, spawned on demand, woken by appends, exits when
//! nothing is staged or in flight) keeps direct writes flowing instead of
//! running in rounds:
//! - full chunks are issued as soon as they exist, in file order, up to
//!   `WRITES_IN_FLIGHT_MAX` writes at once, without waiting for one
//!   another; full chunks that follow on one another go as one write (up
//!   to `DIRECT_WRITE_MAX_BYTES`): on the 2-core VM each device request
//!   costs a virtio doorbell, a VM exit, and a 1 MiB batch is staged in six
//!   or seven chunks (tuning/results/coalesced-direct-writes.md);
//! - when no full chunk is waiting, the unwritten part of the open chunk
//!   (from the page holding its first unwritten byte, zero-padded to a page)
//!   is copied and written: the *tail write*. A write of full chunks takes
//!   the open chunk's staged pages along when they follow the last of them
//!   and none of the open chunk is written yet (the last piece of a large
//!   batch); that write is then the tail write. At most one tail write is
//!   in flight, and the chunk it belongs to is not written again until it
//!   has completed, so two writes of one page are never in flight together
//!   (they could land in either order). Full chunks before it flow freely.
//! - `written` moves to the end of the last whole batch covered by completed
//!   writes with no incomplete write before them (writes can complete out of
//!   order); reads never go past a segment's `written_len`.
//! - a direct write is a blocking `pwritev` on one of the shard's
//!   direct-write threads (`direct`; `DIRECT_WRITE_THREADS` run at once,
//!   the rest wait in their queue), not an io_uring write: an asynchronous
//!   direct write completes through a kernel worker on the CPU that takes
//!   the device's interrupts, and a busy client there starved it for 30 s
//!   (the `direct` module doc has the details).
//!
//! Space: files grow by `fallocate(preallocate_bytes)` ahead of the writer;
//! the logical length is restored with ftruncate when a segment is sealed
//! (roll) or the log is closed. Writes into fallocated space hit unwritten
//! extents, whose conversion each fdatasync must also commit; so segments
//! deleted by retention are not unlinked but kept (up to
//! `SPARE_SEGMENT_FILES_MAX`, as `<base>.spare`) and renamed into place by
//! the next roll: their blocks are already written. A spare holds the old
//! bytes of another segment after the new batches. Recovery treats what
//! follows the last valid batch as space not yet written, whether zeros
//! (preallocated) or old bytes: it cannot continue the log, as every old
//! batch has a lower offset than the segment's base, and it is truncated.
//! A segment is recycled only when nothing holds its descriptors (a fetch
//! sending from it must never see new bytes). Logs that fdatasync
//! (`--fsync-acks`, `flush.messages`, `flush.ms`) also pre-zero: when no
//! other write is in flight, the writer writes zeros in
//! `PREZERO_WRITE_BYTES` pieces to keep `PREZERO_AHEAD_BYTES` of written
//! space ahead of the data (one extent conversion per piece instead of one
//! per data write, outside the appenders' fdatasyncs). A data write that
//! would overlap a zeroing write in flight waits for it, so zeros never land
//! over data. Logs that never sync skip this: it would double their device
//! writes for no latency they wait on.
//!
//! Syncer task (group commit): fdatasyncs the file last written and moves
//! `durable` to the `written` offset it saw before the call, so one
//! fdatasync serves every append staged before it. Up to
//! `SYNCS_IN_FLIGHT_MAX` run at once: appends that arrive while one runs
//! get the next at once instead of waiting for it to end. Invariant that
//! makes one file enough: a segment is sealed (truncated + fdatasync'ed)
//! before the writer touches the next one. A page-cache log is the
//! exception: its sealed segment may still hold dirty pages (up to
//! `WRITEBACK_KICK_BYTES` not yet started, and whatever write-back has not
//! finished), so its fdatasync runs in a task of its own while the writer
//! goes on to the next segment, whose appends need not wait for it;
//! `durable` and the recovery point move past it only when it and the
//! seals before it are done, and the syncer waits for them before its own
//! fdatasync.
//!
//! Write-back errors: Linux reports a failed write-back once to each open
//! file description (errseq: the first fdatasync through a description
//! after the error gets it, later ones on that description do not). Two
//! fdatasyncs running at once on one description could therefore split it:
//! the one that returns success may be the one whose pages failed, and it
//! would move `durable` (the HW under `--fsync-acks`) past lost data. So no
//! two fdatasyncs ever share a description: seals and `close` sync on the
//! write descriptor, and each fdatasync of the syncer runs on a description
//! of its own (`SyncFiles`: `SYNCS_IN_FLIGHT_MAX` read-only `open`s of the
//! segment file, taken and given back). They are opened together with the
//! write descriptor, before anything is written through it, so the error
//! of any write-back of the file's data comes after every description's
//! cursor and each of them reports it, whichever fdatasync's completion is
//! handled first. (Opened later, one could miss an error another
//! description had reported but whose failure the log had not yet seen.)
//! Once one has reported it, the log has failed and `durable` stays where
//! it is.
//!
//! Directory fsyncs: an fdatasync of a file does not make its name durable.
//! A log that fdatasyncs (`LogConfig::syncs`: `--fsync-acks`,
//! `flush.messages`, `flush.ms`) therefore fsyncs the partition directory
//! after creating a file that acknowledged data will live in, before any of
//! that data can count as durable: a new partition's directory (and the
//! data dir's entry for it) and first segment file in `open`, and each
//! segment file a roll creates or renames into place from a spare in
//! `open_segment_file`, before the writer is given the file (so before
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
//! Owned by one shard; handlers keep `Rc<PartitionLog>` across awaits.

use super::cache::TailCache;
use super::copy::{self, STREAM_COPY_MIN_BYTES};
use super::direct;
use super::iobuf::{IoArena, IoBuf};
use super::segment::{log_file_name, write_index_files, Segment};
use super::watch::OffsetWatch;
use super::{now_ms, AppendInfo, CatchUpReads, LogConfig, LogError, ReadResult, PAGE_BYTES};
use super::{
    DIRECT_WRITE_MAX_BYTES, DIRECT_WRITE_MAX_CHUNKS, PREZERO_AHEAD_BYTES, PREZERO_WRITE_BYTES,
    SPARE_SEGMENT_FILES_MAX, STAGING_CHUNK_MAX_BYTES, SYNCS_IN_FLIGHT_MAX, WRITEBACK_KICK_BYTES,
    WRITES_IN_FLIGHT_MAX,
};
use crate::record::batch::{self, BatchHeader};
use crate::record::{FileRange, RecordsChunk};
use crate::types::{
    HighWatermark, LastStableOffset, LogEndOffset, LogStartOffset, Offset, TopicPartition,
};
use bytes::BytesMut;
use futures::stream::{FuturesUnordered, StreamExt};
use glommio::io::{DmaFile, OpenOptions};
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::rc::{Rc, Weak};
use std::sync::Arc;
use std::task::{Poll, Waker};

/// An aligned staging buffer holding the file bytes `[pos, pos + len)`;
/// appends copy batches straight into it (no intermediate `Vec`) and a full
/// chunk is handed to the writer as it is, without another copy.
struct Chunk {
    /// File position of `buf[0]`; page aligned.
    pos: u64,
    buf: IoBuf,
    /// Bytes staged.
    len: usize,
    /// Bytes `[0, issued)` were covered by an earlier (tail) write; the next
    /// write of this chunk starts at the page containing `issued`.
    issued: usize,
    /// Some of it was written through the page cache.
    cached: bool,
}

impl Chunk {
    fn new(pos: u64, chunk_bytes: usize, arena: &Rc<IoArena>) -> Chunk {
        Chunk {
            pos,
            buf: arena.alloc(chunk_bytes),
            len: 0,
            issued: 0,
            cached: false,
        }
    }

    fn is_full(&self) -> bool {
        self.len == self.buf.len()
    }

    /// The page-aligned file range still to write: `[from, to)` as offsets
    /// into the chunk (`to` rounds `len` up to a page).
    fn unwritten_range(&self) -> (usize, usize) {
        let page = PAGE_BYTES as usize;
        (self.issued / page * page, self.len.div_ceil(page) * page)
    }

    /// The write of a full chunk: its own buffer when no part of it was
    /// written before, else a copy of the pages from the first unwritten one.
    fn into_write(mut self, arena: &Rc<IoArena>) -> (u64, IoBuf) {
        let (from, to) = self.unwritten_range();
        if from == 0 {
            return (self.pos, self.buf);
        }
        self.copy_range(from, to, arena)
    }

    /// A copy of `[from, to)` (page aligned) for a write, zero-padded after
    /// `len`; the chunk stays (it is still being filled).
    fn copy_range(&mut self, from: usize, to: usize, arena: &Rc<IoArena>) -> (u64, IoBuf) {
        let mut out = arena.alloc(to - from);
        let dst = out.as_bytes_mut();
        let avail = self.len.min(to) - from;
        dst[..avail].copy_from_slice(&self.buf.as_bytes()[from..from + avail]);
        dst[avail..].fill(0);
        self.issued = self.len;
        (self.pos + from as u64, out)
    }
}

/// A write issued and not yet completed, in issue order.
struct InFlight {
    seq: u64,
    /// Every logical byte before this is covered by this write or an
    /// earlier-issued one.
    end_len: u64,
    done: bool,
}

/// Write state of a segment that still has bytes to write or to seal.
struct SegWriter {
    seg: Rc<Segment>,
    file: Option<Rc<DmaFile>>,
    chunk_bytes: usize,
    preallocate_bytes: u64,
    arena: Rc<IoArena>,
    /// Full chunks not yet issued, in file order.
    full: VecDeque<Chunk>,
    /// The chunk being filled; `None` when the staged size is chunk-aligned.
    open: Option<Chunk>,
    /// File position where the next chunk starts (end of the last one).
    next_chunk_pos: u64,
    /// File position of the chunk whose tail write is in flight: no other
    /// write of its pages may be issued until that one completes.
    tail_busy: Option<(u64, u64)>,
    /// The file holds written blocks (data, zeros, a spare's old bytes) up
    /// to here; page aligned, as the pre-zeroing writes that start here.
    zeroed_len: u64,
    /// A pre-zeroing write of `[start, end)` is in flight: no data write
    /// into that range may be issued until it completes.
    zeroing: Option<(u64, u64)>,
    /// File size after the last fallocate (or of the recycled file).
    allocated_len: u64,
    /// (end position, next offset, length) of staged batches not yet known
    /// written; their lengths are counted in the arena's `unwritten_bytes`
    /// until then (or until the writer is dropped).
    batch_ends: VecDeque<(u64, i64, u64)>,
    inflight: VecDeque<InFlight>,
    /// No more appends; truncate, fdatasync and write indexes when drained.
    sealed: bool,
    /// Buffered (page cache) write descriptor, opened on first use.
    buffered: Option<Arc<std::fs::File>>,
    /// The syncer's descriptions of this segment's file, opened with `file`.
    sync_files: Option<Rc<SyncFiles>>,
    /// Write-back of the file before this position has been started.
    kicked_len: u64,
}

impl Drop for SegWriter {
    fn drop(&mut self) {
        let left: u64 = self.batch_ends.iter().map(|&(_, _, len)| len).sum();
        self.arena.remove_unwritten(left);
    }
}

impl SegWriter {
    fn new(
        seg: Rc<Segment>,
        file: Option<Rc<DmaFile>>,
        cfg: &LogConfig,
        arena: Rc<IoArena>,
    ) -> SegWriter {
        SegWriter {
            sync_files: None,
            seg,
            file,
            chunk_bytes: chunk_bytes(cfg),
            preallocate_bytes: cfg.preallocate_bytes,
            arena,
            full: VecDeque::new(),
            open: None,
            next_chunk_pos: 0,
            tail_busy: None,
            zeroed_len: 0,
            zeroing: None,
            allocated_len: 0,
            batch_ends: VecDeque::new(),
            inflight: VecDeque::new(),
            sealed: false,
            buffered: None,
            kicked_len: 0,
        }
    }

    /// Copies `data` (the bytes of the batch at file position `pos` =
    /// `seg.size`) into chunks; chunks that fill up queue for writing.
    fn stage(&mut self, mut pos: u64, mut data: &[u8]) {
        let stream = data.len() >= STREAM_COPY_MIN_BYTES;
        while !data.is_empty() {
            let chunk = match &mut self.open {
                Some(c) => c,
                None => {
                    // A new chunk starts where the previous (full) one ended.
                    let at = self.next_chunk_pos;
                    assert!(
                        at % PAGE_BYTES == 0 && at <= pos,
                        "chunk start {at} vs {pos}"
                    );
                    let size = staging_chunk_size(self.chunk_bytes, data.len());
                    self.open.insert(Chunk::new(at, size, &self.arena))
                }
            };
            debug_assert_eq!(chunk.pos + chunk.len as u64, pos);
            let n = (chunk.buf.len() - chunk.len).min(data.len());
            // Only whole fresh chunks stream: a piece in the open chunk is
            // read again by its tail write.
            let whole = chunk.len == 0 && n == chunk.buf.len();
            copy::copy(
                &mut chunk.buf.as_bytes_mut()[chunk.len..chunk.len + n],
                &data[..n],
                stream && whole,
            );
            chunk.len += n;
            data = &data[n..];
            pos += n as u64;
            if chunk.is_full() {
                self.next_chunk_pos = chunk.pos + chunk.len as u64;
                if let Some(c) = self.open.take() {
                    self.full.push_back(c);
                }
            }
        }
    }

    /// A pre-zeroing write in flight overlaps file range `[start, end)`:
    /// a data write there must wait, or zeros could land over the data.
    fn zeroing_overlaps(&self, start: u64, end: u64) -> bool {
        self.zeroing.is_some_and(|(zs, ze)| start < ze && end > zs)
    }

    /// What can join the direct write of the first full chunk, which ends
    /// at file position `end`: the full chunks after it, then the open
    /// chunk's staged pages. Each must start where the one before it ends,
    /// be wholly unwritten, and have no tail or pre-zeroing write over it in
    /// flight; the write stays within `DIRECT_WRITE_MAX_BYTES` and
    /// `DIRECT_WRITE_MAX_CHUNKS`.
    fn coalesced_run(&self, mut end: u64) -> Run {
        let first = self.full.front().map_or(0, |c| c.buf.len());
        let (mut more, mut bytes) = (0, first);
        // A piece at `pos` of `len` bytes joins a write ending at `at`.
        let joins = |at: u64, pos: u64, len: usize, issued: usize, more: usize, bytes: usize| {
            pos == at
                && issued == 0
                && more + 1 < DIRECT_WRITE_MAX_CHUNKS
                && bytes + len <= DIRECT_WRITE_MAX_BYTES
                && self.tail_busy.is_none_or(|(p, _)| p != pos)
                && !self.zeroing_overlaps(pos, pos + len as u64)
        };
        for c in self.full.iter().skip(1) {
            if !joins(end, c.pos, c.buf.len(), c.issued, more, bytes) {
                break;
            }
            more += 1;
            bytes += c.buf.len();
            end = c.pos + c.buf.len() as u64;
        }
        // The open chunk's pages, the last piece of a large batch: written
        // with the rest of it instead of in a tail write of their own. Only
        // when no tail write is in flight (at most one is).
        let mut open = None;
        if more + 1 == self.full.len() && self.tail_busy.is_none() {
            if let Some(c) = self.open.as_ref().filter(|c| c.len > 0) {
                let (_, to) = c.unwritten_range();
                if joins(end, c.pos, to, c.issued, more, bytes) {
                    end = c.pos + to as u64;
                    open = Some(to);
                }
            }
        }
        Run {
            more_full: more,
            open_pages_to: open,
            file_end: end,
        }
    }

    /// Nothing staged is left unissued.
    fn all_issued(&self) -> bool {
        self.full.is_empty() && self.open.as_ref().is_none_or(|c| c.issued == c.len)
    }
}

/// One direct write of several staged chunks (`SegWriter::coalesced_run`).
struct Run {
    /// Full chunks that join the first one.
    more_full: usize,
    /// The open chunk's pages up to this offset in it join too.
    open_pages_to: Option<usize>,
    /// File position where the write ends.
    file_end: u64,
}

enum WriterStep {
    /// Nothing to issue now (idle, or waiting for writes in flight).
    Wait,
    Open(Rc<Segment>),
    Grow {
        file: Rc<DmaFile>,
        len: u64,
    },
    /// A direct write of `bufs`, one after another, from `pos`.
    Write {
        file: Rc<DmaFile>,
        seq: u64,
        pos: u64,
        bufs: Vec<IoBuf>,
    },
    Seal {
        file: Rc<DmaFile>,
        seg: Rc<Segment>,
    },
    /// A buffered write completed at once (its `seq`), or failed.
    Wrote(u64),
    Failed(std::io::Error),
}

/// A sealed segment being fdatasynced in the background (page-cache logs).
struct SealSync {
    /// Numbers the background seals of a log from 1, in seal order.
    seq: i64,
    base: i64,
    /// Its next offset: `durable` moves here once it (and every segment
    /// sealed before it) is synced.
    end: i64,
    done: bool,
}

/// The open file descriptions of one segment file that the group-commit
/// syncer fdatasyncs, one for each of its fdatasyncs that may run at once
/// on that file; no other code syncs on them (see the module doc, write-back
/// errors). Opened with the segment's write descriptor, before anything is
/// written to the file through it, so every write-back error of the
/// file's data is still unseen by them when it happens. Read-only: nothing
/// is ever written through them.
struct SyncFiles {
    /// Descriptions no fdatasync is running on.
    idle: RefCell<Vec<Rc<DmaFile>>>,
}

impl SyncFiles {
    async fn open(path: &Path) -> Result<Rc<SyncFiles>, LogError> {
        let mut idle = Vec::with_capacity(SYNCS_IN_FLIGHT_MAX);
        for _ in 0..SYNCS_IN_FLIGHT_MAX {
            // A new open(2) each: a description of its own, never a dup.
            idle.push(Rc::new(DmaFile::open(path).await.map_err(io_err)?));
        }
        Ok(Rc::new(SyncFiles {
            idle: RefCell::new(idle),
        }))
    }

    /// A description no fdatasync runs on. The syncer runs fewer than
    /// `SYNCS_IN_FLIGHT_MAX` fdatasyncs when it asks, so one is idle.
    fn take(&self) -> Option<Rc<DmaFile>> {
        self.idle.borrow_mut().pop()
    }

    fn give_back(&self, f: Rc<DmaFile>) {
        self.idle.borrow_mut().push(f);
    }
}

/// Sequence number marking a pre-zeroing write (data writes count from 0).
const PREZERO_SEQ: u64 = u64::MAX;

type WriteFuture = std::pin::Pin<Box<dyn std::future::Future<Output = (u64, WriteResult)>>>;
type WriteResult = std::io::Result<usize>;

/// One partition's log. See the module doc.
pub struct PartitionLog {
    tp: TopicPartition,
    dir: PathBuf,
    cache: Rc<TailCache>,
    cache_id: u64,
    arena: Rc<IoArena>,
    config: RefCell<LogConfig>,
    segments: RefCell<BTreeMap<i64, Rc<Segment>>>,
    log_start: Cell<i64>,
    log_end: Cell<i64>,
    written: OffsetWatch,
    durable: OffsetWatch,
    writers: RefCell<VecDeque<SegWriter>>,
    writer_running: Cell<bool>,
    /// Set by appends while the writer runs: there is new work to issue.
    writer_kicked: Cell<bool>,
    writer_waker: RefCell<Option<Waker>>,
    /// Sequence number of the next write issued.
    write_seq: Cell<u64>,
    /// Files of deleted segments kept for reuse by the next roll.
    spares: RefCell<Vec<PathBuf>>,
    sync_wanted: Cell<i64>,
    syncer_running: Cell<bool>,
    /// The highest `written` offset an fdatasync has been started for.
    sync_started_to: Cell<i64>,
    /// The syncer's fdatasyncs still running, and the most that ever ran
    /// at once.
    syncs_in_flight: Cell<usize>,
    syncs_in_flight_peak: Cell<usize>,
    /// Counts what the syncer waits for while it has nothing to start: a
    /// higher `sync_wanted`, or one of its fdatasyncs ending.
    sync_events: OffsetWatch,
    /// The syncer's descriptions of the file last written.
    last_written: RefCell<Rc<SyncFiles>>,
    /// Sealed segments of a page-cache log whose background fdatasync has
    /// not yet counted, oldest first.
    sealing: RefCell<VecDeque<SealSync>>,
    /// `seq` of the last background seal started, and of the last one whose
    /// fdatasync (and every earlier one's) is done.
    seals_started: Cell<i64>,
    seals_synced: OffsetWatch,
    failed: RefCell<Option<String>>,
    /// The writer is out of file descriptors and retries (see the module
    /// doc); why, while it lasts.
    stalled: RefCell<Option<String>>,
    /// Directory fsyncs done for this log's files, and the last one.
    dir_syncs: Cell<u64>,
    last_dir_sync: Cell<Option<DirSync>>,
    closed: Cell<bool>,
    max_ts: Cell<Option<(i64, i64)>>,
    last_flush_ms: Cell<i64>,
    fsyncs: Cell<u64>,
    self_weak: Weak<PartitionLog>,
}

/// A glommio I/O error as a `LogError`; out of file descriptors it is
/// `Unavailable` (the writer retries, see the module doc).
fn io_err(e: glommio::GlommioError<()>) -> LogError {
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
    /// `recovery_point`: segments wholly below it are trusted (indexes loaded
    /// and sanity-checked); the segment holding it and every later one, and
    /// always the last one, are scanned and their CRCs verified.
    pub(crate) async fn open(
        dir: PathBuf,
        tp: TopicPartition,
        config: LogConfig,
        cache: Rc<TailCache>,
        arena: Rc<IoArena>,
        recovery_point: Option<i64>,
        log_start_checkpoint: Option<i64>,
    ) -> Result<Rc<PartitionLog>, LogError> {
        let dir_created = !dir.exists();
        std::fs::create_dir_all(&dir)?;
        let now = now_ms();
        let (mut bases, spare_files) = list_segments(&dir)?;
        let mut dir_syncs = 0;
        let mut last_dir_sync = None;
        if bases.is_empty() {
            let base = log_start_checkpoint.unwrap_or(0).max(0);
            std::fs::File::create(dir.join(log_file_name(base)))?;
            bases.push(base);
            // A log that fdatasyncs acknowledges its first batches only
            // once the new file (and a new directory) survive a power loss.
            if config.syncs() {
                let (d, parent) = (dir.clone(), dir.parent().map(Path::to_path_buf));
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
                dir_syncs = 1 + u64::from(dir_created);
                last_dir_sync = Some(DirSync {
                    segment_base: base,
                    durable_at: base,
                });
            }
        }
        let rp = recovery_point.unwrap_or(0);
        // First segment to scan: the one containing the recovery point.
        let first_scan = bases
            .iter()
            .rposition(|&b| b <= rp)
            .unwrap_or(0)
            .min(bases.len() - 1);
        let mut segments: BTreeMap<i64, Rc<Segment>> = BTreeMap::new();
        let mut expected = bases[0];
        let mut i = 0;
        while i < bases.len() {
            let base = bases[i];
            let seg = Rc::new(Segment::new(&dir, base, now));
            let is_last = i + 1 == bases.len();
            let mut trusted = false;
            if i < first_scan && !is_last {
                trusted = seg.load_indexes(bases[i + 1])?;
            }
            if !trusted {
                let out = seg.recover_scan(expected, config.index_interval_bytes)?;
                if out.valid_len < out.file_len {
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
                }
                let corrupt = out.stop_reason.is_some() && !out.tail_is_zeros;
                if !is_last {
                    seg.final_time_entry();
                    seg.write_indexes()?;
                    seg.sealed.set(true);
                }
                if corrupt && !is_last {
                    for &later in &bases[i + 1..] {
                        tracing::warn!(partition = %tp, segment = later,
                            "recovery deleted a segment after a corrupt one");
                        remove_segment_files(&dir, later);
                    }
                    bases.truncate(i + 1);
                    seg.sealed.set(false);
                }
            }
            expected = seg.next_offset.get();
            segments.insert(base, seg);
            i += 1;
        }
        let Some((_, last)) = segments.iter().next_back() else {
            return Err(LogError::Corrupt("no segment after recovery".into()));
        };
        let last = last.clone();
        last.sealed.set(false);
        // The active segment: open it for direct writes and keep its
        // partial last page staged so the next write rewrites it whole.
        let file = Rc::new(
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .dma_open(&last.log_path)
                .await
                .map_err(io_err)?,
        );
        file.fdatasync().await.map_err(io_err)?;
        let size = last.size.get();
        let last_written = SyncFiles::open(&last.log_path).await?;
        let mut writer = SegWriter::new(last.clone(), Some(file.clone()), &config, arena.clone());
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
        *last.dma.borrow_mut() = Some(file.clone());
        let log_end = last.next_offset.get();
        let first_base = *segments.keys().next().unwrap_or(&0);
        let log_start = log_start_checkpoint
            .unwrap_or(first_base)
            .max(first_base)
            .min(log_end);
        let max_ts = segments.values().filter_map(|s| s.max_ts.get()).fold(
            None,
            |acc: Option<(i64, i64)>, x| match acc {
                Some(a) if a.0 >= x.0 => Some(a),
                _ => Some(x),
            },
        );
        let cache_id = cache.register();
        Ok(Rc::new_cyclic(|w| PartitionLog {
            tp,
            dir,
            cache,
            cache_id,
            arena,
            config: RefCell::new(config),
            segments: RefCell::new(segments),
            log_start: Cell::new(log_start),
            log_end: Cell::new(log_end),
            written: OffsetWatch::new(log_end),
            durable: OffsetWatch::new(log_end),
            writers: RefCell::new(VecDeque::from([writer])),
            writer_running: Cell::new(false),
            writer_kicked: Cell::new(false),
            writer_waker: RefCell::new(None),
            write_seq: Cell::new(0),
            spares: RefCell::new(spare_files),
            sync_wanted: Cell::new(log_end),
            syncer_running: Cell::new(false),
            sync_started_to: Cell::new(log_end),
            syncs_in_flight: Cell::new(0),
            syncs_in_flight_peak: Cell::new(0),
            sync_events: OffsetWatch::new(0),
            last_written: RefCell::new(last_written),
            sealing: RefCell::new(VecDeque::new()),
            seals_started: Cell::new(0),
            seals_synced: OffsetWatch::new(0),
            failed: RefCell::new(None),
            stalled: RefCell::new(None),
            dir_syncs: Cell::new(dir_syncs),
            last_dir_sync: Cell::new(last_dir_sync),
            closed: Cell::new(false),
            max_ts: Cell::new(max_ts),
            last_flush_ms: Cell::new(now),
            fsyncs: Cell::new(0),
            self_weak: w.clone(),
        }))
    }

    pub fn topic_partition(&self) -> &TopicPartition {
        &self.tp
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn check_usable(&self) -> Result<(), LogError> {
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
    fn check_writable(&self) -> Result<(), LogError> {
        self.check_usable()?;
        if let Some(e) = &*self.stalled.borrow() {
            return Err(LogError::Unavailable(e.clone()));
        }
        Ok(())
    }

    /// The log failed, or its writer is out of file descriptors: a waiter
    /// for a write stops waiting.
    fn write_blocked(&self) -> bool {
        self.failed.borrow().is_some() || self.stalled.borrow().is_some()
    }

    /// The writer ran out of file descriptors (`e`, an `Unavailable`) and
    /// will retry what it was doing after a pause: `attempt` of them failed
    /// before this one. Returns false when the log was closed or failed
    /// meanwhile (the writer then stops; nothing staged was acknowledged).
    async fn stall(&self, e: &LogError, attempt: &mut u32) -> bool {
        if self.stalled.borrow().is_none() {
            tracing::warn!(partition = %self.tp, error = %e,
                "log writer is out of file descriptors; refusing appends and retrying");
            let why = match e {
                LogError::Unavailable(why) => why.clone(),
                other => other.to_string(),
            };
            *self.stalled.borrow_mut() = Some(why);
            // Waiters for writes answer now (a retriable error) instead of
            // at their timeout.
            self.written.wake_all();
            self.durable.wake_all();
        }
        let pause = super::FD_RETRY_FIRST_MS
            .saturating_mul(1 << (*attempt).min(16))
            .min(super::FD_RETRY_MAX_MS);
        *attempt += 1;
        glommio::timer::sleep(std::time::Duration::from_millis(pause)).await;
        self.failed.borrow().is_none() && !self.closed.get()
    }

    /// What the stalled writer retried succeeded: the log works again.
    fn unstall(&self, attempt: &mut u32) {
        if self.stalled.borrow_mut().take().is_some() {
            tracing::info!(partition = %self.tp, retries = *attempt,
                "log writer has file descriptors again; appends accepted");
        }
        *attempt = 0;
    }

    fn fail(&self, e: &dyn std::fmt::Display) {
        tracing::error!(partition = %self.tp, error = %e, "log i/o failed; log taken offline");
        let mut f = self.failed.borrow_mut();
        if f.is_none() {
            *f = Some(e.to_string());
        }
        drop(f);
        self.written.wake_all();
        self.durable.wake_all();
        self.seals_synced.wake_all();
        self.sync_events.wake_all();
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
    /// batch if it is a small part of it (`cache`).
    pub fn append_from(
        &self,
        mut batch: BytesMut,
        allocation_bytes: usize,
    ) -> Result<AppendInfo, LogError> {
        // Refused, not staged, while the writer is out of file descriptors:
        // the producer retries, nothing of this batch is written.
        self.check_writable()?;
        let h = BatchHeader::parse(&batch)?;
        if h.total_size() != batch.len() {
            return Err(LogError::InvalidBatch(batch::BatchError::Truncated {
                needed: h.total_size(),
                available: batch.len(),
            }));
        }
        h.check_counts()?;
        let base = self.log_end.get();
        batch::set_base_offset(&mut batch, base);
        batch::set_partition_leader_epoch(&mut batch, 0);
        let h = BatchHeader {
            base_offset: base,
            partition_leader_epoch: 0,
            ..h
        };
        let last = h.last_offset();
        let len = batch.len() as u64;
        let cfg = self.config.borrow().clone();
        self.maybe_roll(&cfg, len, last);
        {
            let mut writers = self.writers.borrow_mut();
            let Some(w) = writers.back_mut() else {
                return Err(LogError::Corrupt("no active segment".into()));
            };
            let pos = w.seg.size.get();
            w.stage(pos, &batch);
            w.seg.on_append(pos, &h, len, cfg.index_interval_bytes);
            w.batch_ends.push_back((pos + len, last + 1, len));
            self.arena.add_unwritten(len);
        }
        self.log_end.set(last + 1);
        match self.max_ts.get() {
            Some((ts, _)) if ts >= h.max_timestamp => {}
            _ => self.max_ts.set(Some((h.max_timestamp, last))),
        }
        self.cache
            .insert(self.cache_id, base, last, batch, allocation_bytes);
        self.kick_writer();
        if cfg.fsync_acks || (last + 1 - self.durable.get()) >= cfg.flush_messages {
            self.request_sync(last);
        }
        Ok(AppendInfo {
            base_offset: Offset(base),
            last_offset: Offset(last),
            log_start_offset: self.log_start_offset(),
        })
    }

    fn maybe_roll(&self, cfg: &LogConfig, len: u64, last: i64) {
        let new_base = self.log_end.get();
        let mut writers = self.writers.borrow_mut();
        let Some(w) = writers.back_mut() else { return };
        let seg = &w.seg;
        let size = seg.size.get();
        if size == 0 {
            return;
        }
        let full_bytes = size + len > cfg.segment_bytes;
        let old = now_ms() - seg.created_ms > cfg.segment_ms;
        let index_full = seg.index.borrow().size_bytes() + super::index::OFFSET_INDEX_ENTRY_BYTES
            > cfg.segment_index_bytes as usize
            || seg.time_index.borrow().size_bytes() + super::index::TIME_INDEX_ENTRY_BYTES
                > cfg.segment_index_bytes as usize;
        let rel_overflow = last - seg.base_offset > i32::MAX as i64;
        if !(full_bytes || old || index_full || rel_overflow) {
            return;
        }
        w.sealed = true;
        let seg = Rc::new(Segment::new(&self.dir, new_base, now_ms()));
        self.segments.borrow_mut().insert(new_base, seg.clone());
        writers.push_back(SegWriter::new(seg, None, cfg, self.arena.clone()));
    }

    /// Rolls the active segment now if it is not empty (segment.ms checks,
    /// tests). The new segment starts at the log end.
    pub fn roll(&self) {
        if self.check_writable().is_err() {
            return;
        }
        let cfg = LogConfig {
            segment_bytes: 0,
            ..self.config.borrow().clone()
        };
        self.maybe_roll(&cfg, 0, self.log_end.get());
        self.kick_writer();
    }

    fn kick_writer(&self) {
        if self.writer_running.get() {
            self.writer_kicked.set(true);
            if let Some(w) = self.writer_waker.borrow_mut().take() {
                w.wake();
            }
            return;
        }
        let Some(me) = self.self_weak.upgrade() else {
            return;
        };
        self.writer_running.set(true);
        glommio::spawn_local(async move { me.writer_loop().await }).detach();
    }

    /// The next thing the writer should do for the oldest segment with work;
    /// `in_flight` writes are outstanding. Synchronous: chooses and takes.
    fn next_writer_step(&self, in_flight: usize) -> WriterStep {
        let mut writers = self.writers.borrow_mut();
        let Some(w) = writers.front_mut() else {
            return WriterStep::Wait;
        };
        let Some(file) = w.file.clone() else {
            if in_flight > 0 {
                return WriterStep::Wait;
            }
            return WriterStep::Open(w.seg.clone());
        };
        if in_flight >= WRITES_IN_FLIGHT_MAX {
            return WriterStep::Wait;
        }
        let cfg = self.config.borrow();
        let (syncs, buffered) = (cfg.syncs(), cfg.page_cache_writes());
        drop(cfg);
        // Full chunks first, in file order; one whose tail write is in
        // flight waits for it (two writes of a page are never in flight).
        if let Some((pos, issued, cached, end)) = w
            .full
            .front()
            .map(|c| (c.pos, c.issued, c.cached, c.pos + c.buf.len() as u64))
        {
            if w.tail_busy.is_some_and(|(p, _)| p == pos) {
                return WriterStep::Wait;
            }
            // A page-cache log finishes through the page cache a chunk it
            // began there: its pages are cached and dirty, and a direct
            // write over them would first have to write them back.
            if buffered && issued > 0 && cached {
                if let Some(step) = self.write_buffered(w, true) {
                    return step;
                }
            }
            if w.zeroing_overlaps(pos, end) {
                return WriterStep::Wait;
            }
            // The chunks after it join its write (see `direct`).
            let run = w.coalesced_run(end);
            if let Some(step) = grow_step(w, &file, run.file_end) {
                return step;
            }
            let Some(c) = w.full.pop_front() else {
                return WriterStep::Wait;
            };
            let (pos, buf) = c.into_write(&self.arena);
            let mut bufs = Vec::with_capacity(2 + run.more_full);
            bufs.push(buf);
            bufs.extend(w.full.drain(..run.more_full).map(|c| c.buf));
            // With the open chunk's pages it is that chunk's tail write.
            let (end_len, tail) = match (run.open_pages_to, w.open.as_mut()) {
                (Some(to), Some(c)) => {
                    bufs.push(c.copy_range(0, to, &self.arena).1);
                    (c.pos + c.len as u64, true)
                }
                _ => (run.file_end, false),
            };
            return self.issue(w, file, pos, bufs, end_len, tail);
        }
        // Then the partially filled last chunk, if the writer has nothing
        // else to do and no write of it is in flight already.
        if w.tail_busy.is_none() {
            // A page-cache log's tail write goes through the page cache (no
            // direct write of this chunk is in flight: they never race).
            if buffered {
                if let Some(step) = self.write_buffered(w, false) {
                    return step;
                }
            }
            if let Some(c) = &w.open {
                if c.issued < c.len {
                    let (from, to) = c.unwritten_range();
                    let end_file = c.pos + to as u64;
                    let start_file = c.pos + from as u64;
                    if w.zeroing_overlaps(start_file, end_file) {
                        return WriterStep::Wait;
                    }
                    if let Some(step) = grow_step(w, &file, end_file) {
                        return step;
                    }
                    let Some(c) = &mut w.open else {
                        return WriterStep::Wait;
                    };
                    let end = c.pos + c.len as u64;
                    let (pos, buf) = c.copy_range(from, to, &self.arena);
                    return self.issue(w, file, pos, vec![buf], end, true);
                }
            }
        }
        // Then, with nothing else in flight, pre-zero the space ahead of the
        // data (logs that fdatasync only; see the module doc).
        if syncs && !w.sealed && in_flight == 0 && w.zeroing.is_none() {
            let data_end = w.seg.size.get().div_ceil(PAGE_BYTES) * PAGE_BYTES;
            let start = w.zeroed_len.max(data_end);
            if start < data_end + PREZERO_AHEAD_BYTES {
                let end = start + PREZERO_WRITE_BYTES;
                if let Some(step) = grow_step(w, &file, end) {
                    return step;
                }
                w.zeroing = Some((start, end));
                let mut buf = self.arena.alloc(PREZERO_WRITE_BYTES as usize);
                buf.as_bytes_mut().fill(0);
                return WriterStep::Write {
                    file,
                    seq: PREZERO_SEQ,
                    pos: start,
                    bufs: vec![buf],
                };
            }
        }
        if w.sealed && w.all_issued() && w.inflight.is_empty() && in_flight == 0 {
            return WriterStep::Seal {
                file,
                seg: w.seg.clone(),
            };
        }
        WriterStep::Wait
    }

    /// A write of a page-cache log: the unwritten pages of the open chunk
    /// (`full` false) or of the first full chunk go into the file with a
    /// buffered `pwrite`, done when it returns; `None` when there is nothing
    /// to write. Starts the kernel's write-back every `WRITEBACK_KICK_BYTES`
    /// of file.
    fn write_buffered(&self, w: &mut SegWriter, full: bool) -> Option<WriterStep> {
        let chunk = if full {
            w.full.front()
        } else {
            w.open.as_ref()
        };
        let (pos, (from, to)) = chunk
            .filter(|c| c.issued < c.len)
            .map(|c| (c.pos, c.unwritten_range()))?;
        // A pre-zeroing write still in flight must not land over these
        // pages after them.
        if w.zeroing_overlaps(pos + from as u64, pos + to as u64) {
            return Some(WriterStep::Wait);
        }
        let file = match &w.buffered {
            Some(f) => f.clone(),
            None => match std::fs::OpenOptions::new()
                .write(true)
                .open(&w.seg.log_path)
            {
                Ok(f) => w.buffered.insert(Arc::new(f)).clone(),
                Err(e) => return Some(WriterStep::Failed(e)),
            },
        };
        // Whole pages, zero-padded past the staged bytes (room later appends
        // overwrite): a partial-page buffered write over written blocks
        // (a recycled spare's) would first read the old page from the device.
        // (`from`/`to` are the range checked above: nothing runs between.)
        let pwrite = |c: &mut Chunk| {
            use std::os::unix::fs::FileExt;
            c.buf.as_bytes_mut()[c.len..to].fill(0);
            file.write_all_at(&c.buf.as_bytes()[from..to], c.pos + from as u64)?;
            c.issued = c.len;
            c.cached = true;
            Ok::<u64, std::io::Error>(c.pos + c.len as u64)
        };
        let written = if full {
            let mut c = w.full.pop_front()?;
            pwrite(&mut c)
        } else {
            pwrite(w.open.as_mut()?)
        };
        let end = match written {
            Ok(end) => end,
            Err(e) => return Some(WriterStep::Failed(e)),
        };
        if end >= w.kicked_len + WRITEBACK_KICK_BYTES {
            start_writeback(file, w.kicked_len, end);
            w.kicked_len = end;
        }
        let seq = self.write_seq.get();
        self.write_seq.set(seq + 1);
        w.inflight.push_back(InFlight {
            seq,
            end_len: end,
            done: true,
        });
        Some(WriterStep::Wrote(seq))
    }

    fn issue(
        &self,
        w: &mut SegWriter,
        file: Rc<DmaFile>,
        pos: u64,
        bufs: Vec<IoBuf>,
        end_len: u64,
        tail: bool,
    ) -> WriterStep {
        let seq = self.write_seq.get();
        self.write_seq.set(seq + 1);
        w.inflight.push_back(InFlight {
            seq,
            end_len,
            done: false,
        });
        if tail {
            let chunk_pos = w.open.as_ref().map(|c| c.pos).unwrap_or(pos);
            w.tail_busy = Some((chunk_pos, seq));
        }
        WriterStep::Write {
            file,
            seq,
            pos,
            bufs,
        }
    }

    /// Records a completed write; moves `written` over the whole batches
    /// now covered by completed writes with nothing unwritten before them.
    fn on_write_done(&self, seq: u64) {
        let mut next = None;
        {
            let mut writers = self.writers.borrow_mut();
            let Some(w) = writers.front_mut() else { return };
            // The write was issued on the front segment's file.
            let Some(files) = w.sync_files.clone() else {
                return;
            };
            *self.last_written.borrow_mut() = files;
            if w.tail_busy.is_some_and(|(_, s)| s == seq) {
                w.tail_busy = None;
            }
            if let Some(f) = w.inflight.iter_mut().find(|f| f.seq == seq) {
                f.done = true;
            }
            let mut covered = None;
            while w.inflight.front().is_some_and(|f| f.done) {
                covered = w.inflight.pop_front().map(|f| f.end_len);
            }
            if let Some(end_len) = covered {
                if end_len > w.seg.written_len.get() {
                    w.seg.written_len.set(end_len);
                }
                while let Some(&(end, off, len)) = w.batch_ends.front() {
                    if end > end_len {
                        break;
                    }
                    next = Some(off);
                    w.batch_ends.pop_front();
                    w.arena.remove_unwritten(len);
                }
            }
        }
        if let Some(off) = next {
            self.written.advance(off);
        }
    }

    /// The writer task: issues every write it can (full chunks as soon as
    /// they exist, up to `WRITES_IN_FLIGHT_MAX`), then waits for either a
    /// completion or new appends; exits when nothing is staged or in flight.
    async fn writer_loop(self: Rc<Self>) {
        let mut in_flight: FuturesUnordered<WriteFuture> = FuturesUnordered::new();
        // Retries since the writer ran out of file descriptors.
        let mut fd_retries = 0u32;
        loop {
            if self.failed.borrow().is_some() {
                break;
            }
            self.writer_kicked.set(false);
            match self.next_writer_step(in_flight.len()) {
                WriterStep::Write {
                    file,
                    seq,
                    pos,
                    bufs,
                } => {
                    let delay_ms = super::debug_write_delay_ms();
                    in_flight.push(Box::pin(async move {
                        if delay_ms > 0 {
                            glommio::timer::sleep(std::time::Duration::from_millis(delay_ms)).await;
                        }
                        (seq, direct::write(file, bufs, pos).await)
                    }));
                    continue;
                }
                WriterStep::Open(seg) => {
                    match self.open_segment_file(&seg).await {
                        Ok(()) => self.unstall(&mut fd_retries),
                        Err(e) if e.is_temporary() => {
                            if !self.stall(&e, &mut fd_retries).await {
                                break;
                            }
                        }
                        Err(e) => {
                            self.fail(&e);
                            break;
                        }
                    }
                    continue;
                }
                WriterStep::Grow { file, len } => {
                    // Best effort: a filesystem without fallocate still works.
                    let _ = file.pre_allocate(len, false).await;
                    continue;
                }
                WriterStep::Seal { file, seg } => {
                    // A page-cache log fdatasyncs the sealed file in the
                    // background: its dirty pages can take long to write,
                    // and the next segment's appends need not wait for them.
                    let background = self.config.borrow().page_cache_writes();
                    let r = async {
                        file.truncate(seg.size.get()).await.map_err(io_err)?;
                        if !background {
                            file.fdatasync().await.map_err(io_err)?;
                        }
                        seg.final_time_entry();
                        write_indexes_off_shard(&seg).await?;
                        Ok::<(), LogError>(())
                    }
                    .await;
                    match r {
                        Ok(()) => self.unstall(&mut fd_retries),
                        // Retried whole: truncating, syncing and writing
                        // the indexes again changes nothing already done.
                        Err(e) if e.is_temporary() => {
                            if !self.stall(&e, &mut fd_retries).await {
                                break;
                            }
                            continue;
                        }
                        Err(e) => {
                            self.fail(&e);
                            break;
                        }
                    }
                    seg.sealed.set(true);
                    self.writers.borrow_mut().pop_front();
                    if background {
                        self.sync_sealed_in_background(file, &seg);
                    } else {
                        // Past this segment only once earlier background
                        // seals (before a mode switch) are synced too.
                        if !self.sealed_synced().await {
                            break;
                        }
                        self.durable.advance(seg.next_offset.get());
                    }
                    continue;
                }
                WriterStep::Wrote(seq) => {
                    self.unstall(&mut fd_retries);
                    self.on_write_done(seq);
                    continue;
                }
                WriterStep::Failed(e) => {
                    // Opening the buffered descriptor can run out of them:
                    // nothing was taken from the chunks, retry later.
                    let e = LogError::from_io(e);
                    if e.is_temporary() {
                        if !self.stall(&e, &mut fd_retries).await {
                            break;
                        }
                        continue;
                    }
                    self.fail(&e);
                    break;
                }
                WriterStep::Wait => {}
            }
            if in_flight.is_empty() {
                let idle = self
                    .writers
                    .borrow()
                    .front()
                    .is_none_or(|w| w.file.is_some() && w.all_issued() && !w.sealed);
                if self.writer_kicked.get() {
                    continue;
                }
                if !idle {
                    // Work remains that only a completion could unblock, yet
                    // nothing is in flight: a bug. Fail loudly rather than
                    // leave appenders waiting forever.
                    debug_assert!(false, "writer has staged work but cannot issue it");
                    self.fail(&"log writer stalled with staged data");
                }
                break;
            }
            // Wait for a write to complete or for new appends.
            let ev = std::future::poll_fn(|cx| {
                if let Poll::Ready(Some(x)) = in_flight.poll_next_unpin(cx) {
                    return Poll::Ready(Some(x));
                }
                if self.writer_kicked.get() {
                    return Poll::Ready(None);
                }
                *self.writer_waker.borrow_mut() = Some(cx.waker().clone());
                Poll::Pending
            })
            .await;
            if let Some((seq, r)) = ev {
                match r {
                    Ok(_) if seq == PREZERO_SEQ => {
                        if let Some(w) = self.writers.borrow_mut().front_mut() {
                            if let Some((_, end)) = w.zeroing.take() {
                                w.zeroed_len = w.zeroed_len.max(end);
                            }
                        }
                    }
                    Ok(_) => self.on_write_done(seq),
                    Err(e) => {
                        self.fail(&e);
                        break;
                    }
                }
            }
        }
        // A log that failed leaves with writes still queued or running: wait
        // for them, so that their buffers and file are freed, not leaked
        // (`direct::write`), and none lands after the log is reopened.
        while in_flight.next().await.is_some() {}
        *self.writer_waker.borrow_mut() = None;
        self.writer_running.set(false);
    }

    /// Opens the file of a new segment, reusing a spare (recycled) file when
    /// there is one: its blocks are already written, so writes into it and
    /// the fdatasyncs after them carry no extent conversions.
    async fn open_segment_file(&self, seg: &Rc<Segment>) -> Result<(), LogError> {
        let spare = self.spares.borrow_mut().pop();
        if let Some(spare) = spare {
            if let Err(e) = std::fs::rename(&spare, &seg.log_path) {
                tracing::warn!(partition = %self.tp, file = %spare.display(), error = %e,
                    "could not reuse a spare segment file");
                let _ = std::fs::remove_file(&spare);
            }
        }
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
            self.dir_syncs.set(self.dir_syncs.get() + 1);
            self.last_dir_sync.set(Some(DirSync {
                segment_base: seg.base_offset,
                durable_at: self.durable.get(),
            }));
        }
        let f = Rc::new(f);
        *seg.dma.borrow_mut() = Some(f.clone());
        if let Some(w) = self.writers.borrow_mut().front_mut() {
            w.file = Some(f);
            w.sync_files = Some(sync_files);
            w.allocated_len = size;
            w.zeroed_len = whole_pages(size);
        }
        Ok(())
    }

    /// fdatasyncs a sealed segment's file in a task of its own; `durable`
    /// (and the recovery point) move past it only when it and every segment
    /// sealed before it are synced.
    fn sync_sealed_in_background(&self, file: Rc<DmaFile>, seg: &Rc<Segment>) {
        let base = seg.base_offset;
        let seq = self.seals_started.get() + 1;
        self.seals_started.set(seq);
        self.sealing.borrow_mut().push_back(SealSync {
            seq,
            base,
            end: seg.next_offset.get(),
            done: false,
        });
        let Some(me) = self.self_weak.upgrade() else {
            return;
        };
        glommio::spawn_local(async move {
            if let Err(e) = file.fdatasync().await {
                me.fail(&e);
                return;
            }
            // Another fdatasync (the syncer's, on a description of its own)
            // may have found a failure first: nothing moves `durable` then.
            if me.failed.borrow().is_some() {
                return;
            }
            let mut synced = None;
            {
                let mut sealing = me.sealing.borrow_mut();
                if let Some(s) = sealing.iter_mut().find(|s| s.seq == seq) {
                    s.done = true;
                }
                while sealing.front().is_some_and(|s| s.done) {
                    synced = sealing.pop_front().map(|s| (s.seq, s.end));
                }
            }
            if let Some((seq, end)) = synced {
                me.durable.advance(end);
                me.seals_synced.advance(seq);
            }
        })
        .detach();
    }

    /// Resolves when no sealed segment is still syncing in the background
    /// (false if the log failed first), counting the seals that start while
    /// it waits: the syncer reads `written` right after, and that may already
    /// be in a segment after one sealed meanwhile (a page-cache log's writer
    /// does not wait for its seals). It waits on the seals' own count, not on
    /// `durable`: a direct seal after a mode switch can move `durable` past
    /// one still syncing.
    async fn sealed_synced(&self) -> bool {
        loop {
            let last = self.seals_started.get();
            if self.seals_synced.get() >= last {
                return true;
            }
            let ok = self
                .seals_synced
                .wait_above(last - 1, || self.failed.borrow().is_some())
                .await;
            if !ok {
                return false;
            }
        }
    }

    fn request_sync(&self, offset: i64) {
        if offset + 1 > self.sync_wanted.get() {
            self.sync_wanted.set(offset + 1);
            self.sync_events.advance(self.sync_events.get() + 1);
        }
        if self.syncer_running.get() || self.durable.get() >= self.sync_wanted.get() {
            return;
        }
        let Some(me) = self.self_weak.upgrade() else {
            return;
        };
        self.syncer_running.set(true);
        glommio::spawn_local(async move { me.syncer_loop().await }).detach();
    }

    /// Starts fdatasyncs until everything wanted is covered by one, at most
    /// `SYNCS_IN_FLIGHT_MAX` at a time, each on a description of its own
    /// (`SyncFiles`), and ends when they are done. An append that arrives
    /// while an fdatasync runs gets one of its own at once, instead of
    /// waiting for that one to end first.
    async fn syncer_loop(self: Rc<Self>) {
        loop {
            if self.failed.borrow().is_some() {
                break;
            }
            let want = self.sync_wanted.get();
            let covered = self.durable.get().max(self.sync_started_to.get()) >= want;
            if covered || self.syncs_in_flight.get() >= SYNCS_IN_FLIGHT_MAX {
                if covered && self.syncs_in_flight.get() == 0 {
                    break;
                }
                let seen = self.sync_events.get();
                let ok = self
                    .sync_events
                    .wait_above(seen, || self.failed.borrow().is_some())
                    .await;
                if !ok {
                    break;
                }
                continue;
            }
            if self.written.get() < want {
                let ok = self
                    .written
                    .wait_above(want - 1, || self.failed.borrow().is_some())
                    .await;
                if !ok {
                    break;
                }
            }
            // The one file synced below is the last one written: segments
            // sealed before it must have been synced on their own first.
            if !self.sealed_synced().await {
                break;
            }
            // `written` is in the last file written; every segment before
            // it must be synced on its own (nothing awaited since the check).
            debug_assert!(self.seals_synced.get() >= self.seals_started.get());
            let w = self.written.get();
            let files = self.last_written.borrow().clone();
            self.sync_started_to.set(w);
            let running = self.syncs_in_flight.get() + 1;
            self.syncs_in_flight.set(running);
            self.syncs_in_flight_peak
                .set(self.syncs_in_flight_peak.get().max(running));
            let me = self.clone();
            glommio::spawn_local(async move {
                me.sync_once(&files, w).await;
                me.syncs_in_flight.set(me.syncs_in_flight.get() - 1);
                me.sync_events.advance(me.sync_events.get() + 1);
            })
            .detach();
        }
        self.syncer_running.set(false);
    }

    /// One fdatasync of the syncer on a description of `files` no other
    /// fdatasync runs on; moves `durable` to `w`, the `written` offset seen
    /// before it started. fdatasyncs that run at once can end in any order:
    /// each covers everything written before it started (the kernel's
    /// fdatasync also waits for write-back an earlier one began), and
    /// `durable` only rises.
    async fn sync_once(&self, files: &SyncFiles, w: i64) {
        let Some(file) = files.take() else {
            // The syncer starts fewer fdatasyncs than a file has
            // descriptions: a bug. Failing beats sharing a description.
            debug_assert!(false, "no idle sync description");
            return self.fail(&"no idle sync description");
        };
        let r = file.fdatasync().await;
        files.give_back(file);
        if let Err(e) = r {
            return self.fail(&e);
        }
        // A seal's or another sync's failure stops the log; nothing moves
        // `durable` after that.
        if self.failed.borrow().is_some() {
            return;
        }
        self.fsyncs.set(self.fsyncs.get() + 1);
        self.last_flush_ms.set(now_ms());
        self.durable.advance(w);
    }

    /// The writer's state in one line, for diagnosing a write that does not
    /// complete (logged when a produce times out waiting for one).
    pub fn writer_state(&self) -> String {
        let writers = self.writers.borrow();
        let front = writers.front().map(|w| {
            format!(
                "segment {} file {} full {} open {:?} inflight {:?} tail_busy {:?} zeroing {:?} sealed {} batch_ends {} allocated {} size {}",
                w.seg.base_offset,
                w.file.is_some(),
                w.full.len(),
                w.open.as_ref().map(|c| (c.pos, c.issued, c.len)),
                w.inflight.iter().map(|f| (f.seq, f.end_len, f.done)).collect::<Vec<_>>(),
                w.tail_busy,
                w.zeroing,
                w.sealed,
                w.batch_ends.len(),
                w.allocated_len,
                w.seg.size.get(),
            )
        });
        format!(
            "written {} durable {} log_end {} writer_running {} kicked {} waker {} writers {} front: {}",
            self.written.get(),
            self.durable.get(),
            self.log_end.get(),
            self.writer_running.get(),
            self.writer_kicked.get(),
            self.writer_waker.borrow().is_some(),
            writers.len(),
            front.unwrap_or_else(|| "none".into()),
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

    /// Resolves when the file write covering `offset` has completed.
    /// Ends with `Unavailable` while the writer is out of file descriptors.
    pub async fn wait_written(&self, offset: Offset) -> Result<(), LogError> {
        loop {
            if self.written.get() > offset.0 {
                return Ok(());
            }
            self.check_writable()?;
            self.written
                .wait_above(offset.0, || self.write_blocked())
                .await;
        }
    }

    /// Resolves after an fdatasync covering `offset` (group commit). Ends
    /// with `Unavailable` while the writer is out of file descriptors.
    pub async fn wait_durable(&self, offset: Offset) -> Result<(), LogError> {
        loop {
            if self.durable.get() > offset.0 {
                return Ok(());
            }
            self.check_writable()?;
            self.request_sync(offset.0);
            self.durable
                .wait_above(offset.0, || self.write_blocked())
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

    pub fn high_watermark(&self) -> HighWatermark {
        if self.config.borrow().fsync_acks {
            HighWatermark(self.durable.get())
        } else {
            HighWatermark(self.written.get())
        }
    }

    /// Equals the HW until transactions land.
    pub fn last_stable_offset(&self) -> LastStableOffset {
        LastStableOffset(self.high_watermark().0)
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
        if let Some(s) = self.sealing.borrow().front() {
            return s.base;
        }
        self.writers
            .borrow()
            .front()
            .map(|w| w.seg.base_offset)
            .unwrap_or(self.log_end.get())
    }

    /// Resolves once the HW is > `offset`, or the log is closed or failed.
    pub async fn wait_for_hw_above(&self, offset: Offset) {
        let fsync = self.config.borrow().fsync_acks;
        let watch = if fsync { &self.durable } else { &self.written };
        watch
            .wait_above(offset.0, || self.failed.borrow().is_some())
            .await;
    }

    fn segments_from(&self, offset: i64) -> Vec<Rc<Segment>> {
        let segs = self.segments.borrow();
        let first = segs
            .range(..=offset)
            .next_back()
            .map(|(b, _)| *b)
            .unwrap_or(i64::MIN);
        segs.range(first..).map(|(_, s)| s.clone()).collect()
    }

    /// Whole batches from the one containing `from`, all with offsets <
    /// `upper`, up to `max_bytes` but at least one batch if any is readable.
    pub async fn read(
        &self,
        from: Offset,
        max_bytes: usize,
        upper: Offset,
    ) -> Result<ReadResult, LogError> {
        self.check_usable()?;
        let (start, end) = (self.log_start.get(), self.log_end.get());
        if from.0 < start || from.0 > end {
            return Err(LogError::OffsetOutOfRange {
                log_start: LogStartOffset(start),
                log_end: LogEndOffset(end),
            });
        }
        if from.0 >= upper.0 {
            return Ok(ReadResult::default());
        }
        if let Some((chunks, bytes)) = self.cache.read(self.cache_id, from.0, max_bytes, upper.0) {
            return Ok(ReadResult {
                chunks: chunks.into_iter().map(RecordsChunk::Memory).collect(),
                bytes,
            });
        }
        let upper = upper.0.min(self.written.get());
        let sendfile = self.config.borrow().catch_up_reads == CatchUpReads::Sendfile;
        for seg in self.segments_from(from.0) {
            if seg.base_offset >= upper {
                break;
            }
            // A read that starts where the last one ended is sequential: it
            // walks from there, and what follows it is read ahead
            // (`log::ahead`).
            let cursor = seg.read_cursor.get().filter(|(next, _)| *next == from.0);
            let start_pos = match cursor {
                Some((_, pos)) => pos,
                None if from.0 > seg.base_offset => {
                    seg.index.borrow().lookup((from.0 - seg.base_offset) as u32) as u64
                }
                None => 0,
            };
            // The first batch with offsets at or past `from`, by walking
            // from there or from the index entry before it.
            let mut first: Option<(u64, u64, i64)> = None;
            seg.walk(start_pos, seg.written_len.get(), false, &mut |pos, h, _| {
                if h.last_offset() < from.0 {
                    return true;
                }
                if h.last_offset() < upper {
                    first = Some((pos, h.total_size() as u64, h.last_offset()));
                }
                false
            })
            .await?;
            let Some((position, first_len, first_last)) = first else {
                continue;
            };
            // Then whole batches while they fit in `max_bytes`: up to the
            // last index entry in reach without reading their headers (a
            // catch-up read of large batches would otherwise read one header
            // per batch, one after another), and from there by walking.
            let limit = position + max_bytes as u64;
            let mut len = first_len;
            let mut next_offset = first_last + 1;
            if len < max_bytes as u64 {
                let relative_upper = (upper - seg.base_offset).max(0) as u64;
                if let Some(p) = seg.index.borrow().last_position_within(
                    position + len - 1,
                    limit,
                    relative_upper,
                ) {
                    len = p - position;
                }
                seg.walk(
                    position + len,
                    seg.written_len.get(),
                    false,
                    &mut |_, h, _| {
                        let size = h.total_size() as u64;
                        if h.last_offset() >= upper || len + size > max_bytes as u64 {
                            next_offset = h.base_offset;
                            return false;
                        }
                        len += size;
                        next_offset = h.last_offset() + 1;
                        true
                    },
                )
                .await?;
            }
            let end = position + len;
            seg.read_cursor.set(Some((next_offset, end)));
            let file = seg.dma().await?;
            if sendfile {
                // `--catch-up-reads sendfile`: the whole range from the page
                // cache, and no read-ahead of the log's own.
                return Ok(ReadResult {
                    chunks: vec![RecordsChunk::File(FileRange {
                        file,
                        buffered: Some(seg.read_file()?),
                        position,
                        len: len as usize,
                    })],
                    bytes: len as usize,
                });
            }
            // What the read-ahead already holds of the range goes from
            // memory, the rest is read as the connection sends it.
            let mut chunks = Vec::new();
            let mut from_pos = position;
            let ahead = seg.ahead.borrow().clone();
            if let Some(ahead) = &ahead {
                while from_pos < end {
                    let Some(r) = ahead.bytes_at(from_pos, end - from_pos).await else {
                        break;
                    };
                    from_pos += r.len() as u64;
                    chunks.push(RecordsChunk::Loaded(r));
                }
            }
            if from_pos < end {
                chunks.push(RecordsChunk::File(FileRange {
                    file: file.clone(),
                    buffered: None,
                    position: from_pos,
                    len: (end - from_pos) as usize,
                }));
            }
            if cursor.is_some() {
                seg.read_ahead(file, end, max_bytes as u64);
            }
            return Ok(ReadResult {
                chunks,
                bytes: len as usize,
            });
        }
        Ok(ReadResult::default())
    }

    /// ListOffsets by timestamp: the first offset whose timestamp is >=
    /// `ts_ms` and that record's timestamp (record-exact for uncompressed
    /// batches; for compressed ones the records are decompressed).
    pub async fn offset_for_timestamp(
        &self,
        ts_ms: i64,
    ) -> Result<Option<(Offset, i64)>, LogError> {
        self.check_usable()?;
        let upper = self.written.get();
        let segs: Vec<Rc<Segment>> = self.segments.borrow().values().cloned().collect();
        for seg in segs {
            if seg.max_ts.get().is_none_or(|(t, _)| t < ts_ms) || seg.base_offset >= upper {
                continue;
            }
            let rel = seg.time_index.borrow().lookup(ts_ms);
            let pos = seg.index.borrow().lookup(rel) as u64;
            let mut found: Option<Result<Option<(i64, i64)>, LogError>> = None;
            let log_start = self.log_start.get();
            seg.walk(pos, seg.written_len.get(), true, &mut |_, h, bytes| {
                if h.last_offset() >= upper {
                    return false;
                }
                if h.max_timestamp < ts_ms || h.last_offset() < log_start {
                    return true;
                }
                found = Some(
                    super::records::first_record_at_or_after(bytes, ts_ms)
                        .map_err(|e| LogError::Corrupt(e.to_string()))
                        .map(|r| r.or(Some((h.base_offset, h.max_timestamp)))),
                );
                false
            })
            .await?;
            if let Some(r) = found {
                return Ok(r?.map(|(o, t)| (Offset(o.max(log_start)), t)));
            }
        }
        Ok(None)
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
        self.check_usable()?;
        let upper = self.written.get();
        for seg in self.segments_from(from.0) {
            if seg.base_offset >= upper {
                break;
            }
            let start_pos = if from.0 > seg.base_offset {
                seg.index.borrow().lookup((from.0 - seg.base_offset) as u32) as u64
            } else {
                0
            };
            seg.walk(
                start_pos,
                seg.written_len.get(),
                true,
                &mut |_, h, bytes| {
                    if h.last_offset() >= upper {
                        return false;
                    }
                    if h.last_offset() >= from.0 {
                        f(h, bytes);
                    }
                    true
                },
            )
            .await?;
        }
        Ok(())
    }

    /// Deletes whole segments (never the active one, never any with data at
    /// or above the HW) by retention.ms / retention.bytes. Returns how many.
    pub fn apply_retention(&self, now_ms: i64) -> Result<usize, LogError> {
        let cfg = self.config.borrow().clone();
        let hw = self.high_watermark().0;
        let mut deleted = 0;
        loop {
            let (seg, next_base, total) = {
                let segs = self.segments.borrow();
                let mut it = segs.values();
                let (Some(first), Some(second)) = (it.next(), it.next()) else {
                    break;
                };
                let total: u64 = segs.values().map(|s| s.size.get()).sum();
                (first.clone(), second.base_offset, total)
            };
            if !seg.sealed.get() || seg.next_offset.get() > hw {
                break;
            }
            let ts = seg.max_ts.get().map(|(t, _)| t).unwrap_or(seg.created_ms);
            let by_time = cfg.retention_ms >= 0 && now_ms - ts > cfg.retention_ms;
            let by_size =
                cfg.retention_bytes >= 0 && total - seg.size.get() >= cfg.retention_bytes as u64;
            if !(by_time || by_size) {
                break;
            }
            self.segments.borrow_mut().remove(&seg.base_offset);
            self.log_start.set(self.log_start.get().max(next_base));
            let base = seg.base_offset;
            self.recycle_or_remove(seg);
            tracing::info!(partition = %self.tp, segment = base,
                by_time, by_size, "retention deleted a segment");
            deleted += 1;
        }
        Ok(deleted)
    }

    /// Deletes whole sealed segments whose every offset is below `offset`
    /// and moves the log start up to the first kept segment. Used by
    /// coordinators that bound an internal topic by re-writing their live
    /// state (the equivalent of compaction); never touches the active
    /// segment. Returns how many segments were deleted.
    pub fn delete_segments_below(&self, offset: Offset) -> Result<usize, LogError> {
        self.check_usable()?;
        let mut deleted = 0;
        loop {
            let (seg, next_base) = {
                let segs = self.segments.borrow();
                let mut it = segs.values();
                let (Some(first), Some(second)) = (it.next(), it.next()) else {
                    break;
                };
                (first.clone(), second.base_offset)
            };
            if !seg.sealed.get() || next_base > offset.0 {
                break;
            }
            self.segments.borrow_mut().remove(&seg.base_offset);
            self.log_start.set(self.log_start.get().max(next_base));
            self.recycle_or_remove(seg);
            deleted += 1;
        }
        Ok(deleted)
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
        self.check_usable()?;
        if offset.0 < 0 || offset.0 > self.high_watermark().0 {
            return Err(LogError::OffsetOutOfRange {
                log_start: self.log_start_offset(),
                log_end: LogEndOffset(self.log_end.get()),
            });
        }
        if offset.0 > self.log_start.get() {
            tracing::info!(partition = %self.tp, from = self.log_start.get(), to = offset.0,
                "DeleteRecords moved the log start");
            self.log_start.set(offset.0);
        }
        self.delete_segments_below(Offset(self.log_start.get()))?;
        Ok(self.log_start_offset())
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
        let mut spares = self.spares.borrow_mut();
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

    /// Runs the flush.ms policy: fsync if the oldest unsynced data is older.
    pub async fn maybe_flush_by_time(&self, now_ms: i64) -> Result<(), LogError> {
        let flush_ms = self.config.borrow().flush_ms;
        if flush_ms != i64::MAX
            && self.durable.get() < self.log_end.get()
            && now_ms - self.last_flush_ms.get() >= flush_ms
        {
            self.flush().await?;
        }
        Ok(())
    }

    /// Rolls the active segment if segment.ms elapsed (checked on append too).
    pub fn maybe_roll_by_time(&self, now_ms: i64) {
        if self.check_usable().is_err() {
            return;
        }
        let cfg = self.config.borrow().clone();
        let old =
            self.writers.borrow().back().is_some_and(|w| {
                w.seg.size.get() > 0 && now_ms - w.seg.created_ms > cfg.segment_ms
            });
        if old {
            self.roll();
        }
    }

    /// Writes everything, seals the active segment's file (ftruncate to its
    /// logical length, fdatasync, indexes), and refuses further work.
    pub async fn close(&self) -> Result<(), LogError> {
        if self.closed.get() {
            return Ok(());
        }
        let r = self.close_inner().await;
        self.closed.set(true);
        self.written.close();
        self.durable.close();
        self.seals_synced.close();
        self.sync_events.close();
        self.cache.remove_log(self.cache_id);
        r
    }

    async fn close_inner(&self) -> Result<(), LogError> {
        self.check_usable()?;
        self.flush().await?;
        // Wait for the writer to drain sealed segments too (a writer out of
        // file descriptors would not: the close fails, and recovery at the
        // next start scans what it did not seal).
        while self.writers.borrow().len() > 1 || self.io_running() {
            glommio::timer::sleep(std::time::Duration::from_millis(1)).await;
            self.check_writable()?;
        }
        let active = self
            .writers
            .borrow()
            .front()
            .map(|w| (w.seg.clone(), w.file.clone()));
        if let Some((seg, Some(file))) = active {
            file.truncate(seg.size.get()).await.map_err(io_err)?;
            file.fdatasync().await.map_err(io_err)?;
            write_indexes_off_shard(&seg).await?;
        }
        Ok(())
    }

    /// Resolves when no write, seal or fdatasync of this log is running.
    /// Once the log is closed (`mark_closed`) nothing starts another, so a
    /// deleted log's directory gets no file back after it is removed.
    pub(crate) async fn wait_idle(&self) {
        while self.io_running() {
            glommio::timer::sleep(std::time::Duration::from_millis(1)).await;
        }
    }

    /// The writer, a background seal or an fdatasync of the syncer runs.
    fn io_running(&self) -> bool {
        self.writer_running.get()
            || !self.sealing.borrow().is_empty()
            || self.syncs_in_flight.get() > 0
    }

    /// Drops the cache entries of this log (used by delete).
    pub(crate) fn mark_closed(&self) {
        self.closed.set(true);
        self.written.close();
        self.durable.close();
        self.seals_synced.close();
        self.sync_events.close();
        self.cache.remove_log(self.cache_id);
    }

    /// Directory fsyncs done for this log's files since open (a new
    /// partition's directory and first file, each segment file a roll
    /// creates or renames into place), by logs that fdatasync only.
    pub fn dir_sync_count(&self) -> u64 {
        self.dir_syncs.get()
    }

    /// The last directory fsync, if any (see [`DirSync`]).
    pub fn last_dir_sync(&self) -> Option<DirSync> {
        self.last_dir_sync.get()
    }

    /// The writer is out of file descriptors and retries; why.
    pub fn stalled(&self) -> Option<String> {
        self.stalled.borrow().clone()
    }

    /// fdatasyncs issued by the group-commit syncer since open.
    pub fn fsync_count(&self) -> u64 {
        self.fsyncs.get()
    }

    /// The most fdatasyncs the group-commit syncer has run at once since
    /// open (at most `SYNCS_IN_FLIGHT_MAX`).
    pub fn fsyncs_in_flight_peak(&self) -> usize {
        self.syncs_in_flight_peak.get()
    }

    /// Staged bytes not yet known written.
    pub fn pending_bytes(&self) -> usize {
        self.writers
            .borrow()
            .iter()
            .map(|w| (w.seg.size.get() - w.seg.written_len.get()) as usize)
            .sum()
    }
}

/// Suffix of spare segment files (deleted segments kept for reuse); not
/// `.log`, so Kafka's tools and recovery ignore them.
const SPARE_FILE_SUFFIX: &str = ".spare";

fn spare_file_name(base: i64) -> String {
    format!("{base:020}{SPARE_FILE_SUFFIX}")
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

/// The staging chunk size of `cfg`: `write_chunk_bytes` in whole pages.
fn chunk_bytes(cfg: &LogConfig) -> usize {
    ((cfg.write_chunk_bytes as u64).max(PAGE_BYTES) / PAGE_BYTES * PAGE_BYTES) as usize
}

/// The size of a new staging chunk (of base size `chunk_bytes`) for a batch
/// with `rest` bytes still to stage: `chunk_bytes`, unless the rest fills
/// two of those; then the largest `chunk_bytes << k` that the rest fills
/// entirely (at most [`STAGING_CHUNK_MAX_BYTES`]). A large batch so spans a
/// few large chunks instead of many `chunk_bytes` ones: its direct write
/// (the chunks go as one `pwritev`) stays far below
/// `DIRECT_WRITE_MAX_CHUNKS` pieces, and each piece is one bio segment of a
/// huge page. The chunk left open after it (the one tail writes copy from)
/// is never larger than `chunk_bytes`.
fn staging_chunk_size(chunk_bytes: usize, rest: usize) -> usize {
    let cap = STAGING_CHUNK_MAX_BYTES.max(chunk_bytes);
    let mut size = chunk_bytes;
    while size * 2 <= rest.min(cap) {
        size *= 2;
    }
    size
}

/// Writes a segment's `.index` and `.timeindex` on glommio's blocking
/// thread: creating and fdatasyncing them took the shard 1.5–3.5 ms at
/// every roll of a saturating run (tuning/results/latency-and-throughput.md),
/// time in which it served no request of any partition.
async fn write_indexes_off_shard(seg: &Segment) -> Result<(), LogError> {
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

/// The part of a file of `size` bytes that pre-zeroing can continue from:
/// its whole pages (a spare's or a recovered segment's size is rarely page
/// aligned, and direct writes must be).
fn whole_pages(size: u64) -> u64 {
    size / PAGE_BYTES * PAGE_BYTES
}

/// A fallocate step if a write ending at file position `end` would go past
/// the space allocated so far (grown in `preallocate_bytes` steps).
fn grow_step(w: &mut SegWriter, file: &Rc<DmaFile>, end: u64) -> Option<WriterStep> {
    if end <= w.allocated_len {
        return None;
    }
    let step = w.preallocate_bytes.max(PAGE_BYTES);
    let target = end.div_ceil(step) * step;
    w.allocated_len = target;
    Some(WriterStep::Grow {
        file: file.clone(),
        len: target,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const K16: usize = 16 << 10;

    #[test]
    fn small_rests_get_the_base_chunk() {
        for rest in [0, 1, 100, K16, 2 * K16 - 1] {
            assert_eq!(staging_chunk_size(K16, rest), K16, "rest {rest}");
        }
    }

    #[test]
    fn large_rests_get_the_largest_class_they_fill() {
        assert_eq!(staging_chunk_size(K16, 2 * K16), 2 * K16);
        assert_eq!(staging_chunk_size(K16, 4 * K16 - 1), 2 * K16);
        assert_eq!(staging_chunk_size(K16, 1_000_100), 512 << 10);
        assert_eq!(staging_chunk_size(K16, 1 << 20), 1 << 20);
        assert_eq!(staging_chunk_size(K16, 64 << 20), STAGING_CHUNK_MAX_BYTES);
        // A base above the cap is used as it is.
        assert_eq!(staging_chunk_size(2 << 20, 64 << 20), 2 << 20);
    }

    #[test]
    fn a_large_batch_is_staged_in_full_chunks_and_one_base_chunk_stays_open() {
        // 1,000,100 bytes from an aligned position: 512 + 256 + 128 + 64 +
        // 16 KiB chunks, each filled whole, then 676 bytes in an open 16 KiB one.
        let mut rest = 1_000_100usize;
        let mut sizes = Vec::new();
        while rest > 0 {
            let size = staging_chunk_size(K16, rest);
            sizes.push(size);
            rest -= size.min(rest);
        }
        let kib: Vec<usize> = sizes.iter().map(|s| s >> 10).collect();
        assert_eq!(kib, [512, 256, 128, 64, 16, 16]);
    }
}
