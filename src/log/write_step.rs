//! The writer's next step: what to do next for the oldest segment with
//! work, chosen from its staging state alone.
//!
//! This is the one place where the next I/O step of a log is computed.
//! [`next_step`] is synchronous and does no I/O: it reads the front
//! [`SegWriter`] and takes what the step it chooses needs (the chunks a
//! write sends, the write's sequence number, the space it grows into); the
//! writer task (`writer`) then does the step with glommio and reports the
//! completion back (`SegWriter::complete`). A [`WriterStep`] is therefore
//! the boundary between the log's logic and its storage: everything it
//! names is a file operation (open a segment file, fallocate, a direct
//! write of given buffers, a buffered write of given pages of a chunk,
//! seal).
//!
//! The rules, in the order they apply, keep direct writes flowing instead
//! of running in rounds:
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
//! - a page-cache log (`LogConfig::page_cache_writes`) writes through the
//!   page cache instead of directly: its tail writes, and the rest of a
//!   chunk that such a write began (`Chunk::cached`), whose pages are
//!   cached and dirty (a direct write over them would first have to write
//!   them back); `writer`'s module doc says when and why.
//! - then, with nothing else in flight, pre-zeroing (below);
//! - a sealed segment with everything written and nothing in flight is
//!   sealed.
//!
//! A buffered and a direct write of one page never race: a buffered write
//! of a chunk waits while a direct tail write of that chunk (its pages
//! joined a direct write of full chunks, or a config change turned
//! `direct_writes` off) or a pre-zeroing write over its pages is in
//! flight, chunks are page aligned, and a direct write over pages written
//! through the page cache is coherent (the kernel writes them back and
//! drops them first).
//!
//! Space: files grow by `fallocate(preallocate_bytes)` ahead of the writer
//! ([`WriterStep::Grow`]); the logical length is restored with ftruncate
//! when a segment is sealed (roll) or the log is closed. Writes into
//! fallocated space hit unwritten extents, whose conversion each fdatasync
//! must also commit (which is why retention keeps spare files, see
//! `retention`). Logs that fdatasync (`--fsync-acks`, `flush.messages`,
//! `flush.ms`) also pre-zero: when no other write is in flight, the writer
//! writes zeros in `PREZERO_WRITE_BYTES` pieces to keep
//! `PREZERO_AHEAD_BYTES` of written space ahead of the data (one extent
//! conversion per piece instead of one per data write, outside the
//! appenders' fdatasyncs). A data write that would overlap a zeroing write
//! in flight waits for it, so zeros never land over data. Logs that never
//! sync skip this: it would double their device writes for no latency they
//! wait on.
//!
//! Runs on the log's shard, inside the writer's one borrow of the
//! `Appender` per step.

use super::appender::{InFlight, SegWriter, WriteSeq};
use super::iobuf::IoBuf;
use super::segment::Segment;
use super::{LogConfig, PAGE_BYTES, PREZERO_AHEAD_BYTES, PREZERO_WRITE_BYTES};
use super::{DIRECT_WRITE_MAX_BYTES, DIRECT_WRITE_MAX_CHUNKS, WRITES_IN_FLIGHT_MAX};
use glommio::io::DmaFile;
use std::rc::Rc;

/// Sequence number marking a pre-zeroing write (data writes count from 0).
pub(super) const PREZERO_SEQ: u64 = u64::MAX;

/// What the writer does next for the front segment.
pub(super) enum WriterStep {
    /// Nothing to issue now (idle, or waiting for writes in flight).
    Wait,
    /// Open the segment's file (a new segment of a roll).
    Open(Rc<Segment>),
    /// fallocate the file to `len`.
    Grow { file: Rc<DmaFile>, len: u64 },
    /// A direct write of `bufs`, one after another, from `pos`.
    Write {
        file: Rc<DmaFile>,
        seq: u64,
        pos: u64,
        bufs: Vec<IoBuf>,
    },
    /// A write of a chunk's unwritten pages through the page cache: a
    /// synchronous `pwrite` from the chunk's own buffer, which the writer
    /// does at once, before anything else can change the chunk.
    Buffered(BufferedWrite),
    /// Truncate the drained sealed segment's file to its logical length,
    /// fdatasync it (or have it synced in the background) and write its
    /// indexes.
    Seal { file: Rc<DmaFile>, seg: Rc<Segment> },
}

/// The pages of a buffered write: `[from, to)` (page aligned, as offsets
/// into the chunk) of the first full chunk (`full`) or of the open chunk.
pub(super) struct BufferedWrite {
    pub(super) full: bool,
    pub(super) from: usize,
    pub(super) to: usize,
}

/// How the log's configuration has the writer write, read once per step.
#[derive(Clone, Copy)]
pub(super) struct WriteMode {
    /// The log fdatasyncs (`LogConfig::syncs`): it pre-zeroes.
    pub(super) syncs: bool,
    /// Tail writes go through the page cache
    /// (`LogConfig::page_cache_writes`).
    pub(super) buffered: bool,
}

impl WriteMode {
    pub(super) fn of(cfg: &LogConfig) -> WriteMode {
        WriteMode {
            syncs: cfg.syncs(),
            buffered: cfg.page_cache_writes(),
        }
    }
}

/// The next thing the writer should do for `w`, the oldest segment with
/// work; `in_flight` writes are outstanding, `write_seq` numbers the writes
/// issued. Synchronous and without I/O: chooses and takes.
pub(super) fn next_step(
    w: &mut SegWriter,
    write_seq: &mut WriteSeq,
    in_flight: usize,
    mode: WriteMode,
) -> WriterStep {
    if w.file.is_none() {
        if in_flight > 0 {
            return WriterStep::Wait;
        }
        return WriterStep::Open(w.seg.clone());
    }
    if in_flight >= WRITES_IN_FLIGHT_MAX {
        return WriterStep::Wait;
    }
    // Full chunks first, in file order.
    if let Some(step) = full_chunk_step(w, write_seq, mode) {
        return step;
    }
    // Then the partially filled last chunk, if the writer has nothing
    // else to do and no write of it is in flight already.
    if let Some(step) = tail_step(w, write_seq, mode) {
        return step;
    }
    // Then, with nothing else in flight, pre-zero the space ahead of the
    // data (logs that fdatasync only; see the module doc).
    if let Some(step) = prezero_step(w, in_flight, mode) {
        return step;
    }
    if w.sealed && w.all_issued() && w.inflight.is_empty() && in_flight == 0 {
        return WriterStep::Seal {
            file: file_of(w),
            seg: w.seg.clone(),
        };
    }
    WriterStep::Wait
}

/// The step for the first full chunk; `None` when there is none. One whose
/// tail write is in flight waits for it (two writes of a page are never in
/// flight).
fn full_chunk_step(
    w: &mut SegWriter,
    write_seq: &mut WriteSeq,
    mode: WriteMode,
) -> Option<WriterStep> {
    let (pos, issued, cached, end) = w
        .full
        .front()
        .map(|c| (c.pos, c.issued, c.cached, c.pos + c.buf.len() as u64))?;
    if w.tail_busy.is_some_and(|(p, _)| p == pos) {
        return Some(WriterStep::Wait);
    }
    // A page-cache log finishes through the page cache a chunk it began
    // there: its pages are cached and dirty, and a direct write over them
    // would first have to write them back.
    if mode.buffered && issued > 0 && cached {
        if let Some(step) = buffered_step(w, true) {
            return Some(step);
        }
    }
    if w.zeroing_overlaps(pos, end) {
        return Some(WriterStep::Wait);
    }
    // The chunks after it join its write (see `direct`).
    let run = coalesced_run(w, end);
    if let Some(step) = grow_step(w, run.file_end) {
        return Some(step);
    }
    let Some(c) = w.full.pop_front() else {
        return Some(WriterStep::Wait);
    };
    let (pos, buf) = c.into_write(&w.arena);
    let mut bufs = Vec::with_capacity(2 + run.more_full);
    bufs.push(buf);
    bufs.extend(w.full.drain(..run.more_full).map(|c| c.buf));
    // With the open chunk's pages it is that chunk's tail write.
    let (end_len, tail) = match (run.open_pages_to, w.open.as_mut()) {
        (Some(to), Some(c)) => {
            bufs.push(c.copy_range(0, to, &w.arena).1);
            (c.end(), true)
        }
        _ => (run.file_end, false),
    };
    Some(issue(w, write_seq, pos, bufs, end_len, tail))
}

/// The tail write of the open chunk, when no tail write is in flight and
/// some of it is unwritten; `None` otherwise. A page-cache log's tail write
/// goes through the page cache (no direct write of this chunk is in
/// flight: they never race).
fn tail_step(w: &mut SegWriter, write_seq: &mut WriteSeq, mode: WriteMode) -> Option<WriterStep> {
    if w.tail_busy.is_some() {
        return None;
    }
    if mode.buffered {
        if let Some(step) = buffered_step(w, false) {
            return Some(step);
        }
    }
    let (from, to, start_file, end_file) =
        w.open.as_ref().filter(|c| c.issued < c.len).map(|c| {
            let (from, to) = c.unwritten_range();
            (from, to, c.pos + from as u64, c.pos + to as u64)
        })?;
    if w.zeroing_overlaps(start_file, end_file) {
        return Some(WriterStep::Wait);
    }
    if let Some(step) = grow_step(w, end_file) {
        return Some(step);
    }
    let Some(c) = &mut w.open else {
        return Some(WriterStep::Wait);
    };
    let end = c.end();
    let (pos, buf) = c.copy_range(from, to, &w.arena);
    Some(issue(w, write_seq, pos, vec![buf], end, true))
}

/// A write of a page-cache log: the unwritten pages of the open chunk
/// (`full` false) or of the first full chunk, done with a buffered `pwrite`
/// (`writer`); `None` when there is nothing to write. A pre-zeroing write
/// still in flight must not land over these pages after them: then it
/// waits.
fn buffered_step(w: &SegWriter, full: bool) -> Option<WriterStep> {
    let chunk = if full {
        w.full.front()
    } else {
        w.open.as_ref()
    };
    let (pos, (from, to)) = chunk
        .filter(|c| c.issued < c.len)
        .map(|c| (c.pos, c.unwritten_range()))?;
    if w.zeroing_overlaps(pos + from as u64, pos + to as u64) {
        return Some(WriterStep::Wait);
    }
    Some(WriterStep::Buffered(BufferedWrite { full, from, to }))
}

/// A pre-zeroing write of the next `PREZERO_WRITE_BYTES` ahead of the data,
/// for a log that fdatasyncs, when nothing else is in flight and less than
/// `PREZERO_AHEAD_BYTES` are written ahead; `None` otherwise.
fn prezero_step(w: &mut SegWriter, in_flight: usize, mode: WriteMode) -> Option<WriterStep> {
    if !mode.syncs || w.sealed || in_flight > 0 || w.zeroing.is_some() {
        return None;
    }
    let data_end = w.seg.size.get().div_ceil(PAGE_BYTES) * PAGE_BYTES;
    let start = w.zeroed_len.max(data_end);
    if start >= data_end + PREZERO_AHEAD_BYTES {
        return None;
    }
    let end = start + PREZERO_WRITE_BYTES;
    if let Some(step) = grow_step(w, end) {
        return Some(step);
    }
    w.zeroing = Some((start, end));
    let mut buf = w.arena.alloc(PREZERO_WRITE_BYTES as usize);
    buf.as_bytes_mut().fill(0);
    Some(WriterStep::Write {
        file: file_of(w),
        seq: PREZERO_SEQ,
        pos: start,
        bufs: vec![buf],
    })
}

/// One direct write of several staged chunks ([`coalesced_run`]).
struct Run {
    /// Full chunks that join the first one.
    more_full: usize,
    /// The open chunk's pages up to this offset in it join too.
    open_pages_to: Option<usize>,
    /// File position where the write ends.
    file_end: u64,
}

/// What can join the direct write of `w`'s first full chunk, which ends at
/// file position `end`: the full chunks after it, then the open chunk's
/// staged pages. Each must start where the one before it ends, be wholly
/// unwritten, and have no tail or pre-zeroing write over it in flight; the
/// write stays within `DIRECT_WRITE_MAX_BYTES` and
/// `DIRECT_WRITE_MAX_CHUNKS`.
fn coalesced_run(w: &SegWriter, mut end: u64) -> Run {
    let first = w.full.front().map_or(0, |c| c.buf.len());
    let (mut more, mut bytes) = (0, first);
    // A piece at `pos` of `len` bytes joins a write ending at `at`.
    let joins = |at: u64, pos: u64, len: usize, issued: usize, more: usize, bytes: usize| {
        pos == at
            && issued == 0
            && more + 1 < DIRECT_WRITE_MAX_CHUNKS
            && bytes + len <= DIRECT_WRITE_MAX_BYTES
            && w.tail_busy.is_none_or(|(p, _)| p != pos)
            && !w.zeroing_overlaps(pos, pos + len as u64)
    };
    for c in w.full.iter().skip(1) {
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
    if more + 1 == w.full.len() && w.tail_busy.is_none() {
        if let Some(c) = w.open.as_ref().filter(|c| c.len > 0) {
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

/// A direct write of `bufs` from `pos`, numbered and recorded in flight;
/// `end_len` is the logical end it covers, `tail` that it writes (some of)
/// the open chunk.
fn issue(
    w: &mut SegWriter,
    write_seq: &mut WriteSeq,
    pos: u64,
    bufs: Vec<IoBuf>,
    end_len: u64,
    tail: bool,
) -> WriterStep {
    let seq = write_seq.take();
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
        file: file_of(w),
        seq,
        pos,
        bufs,
    }
}

/// A fallocate step if a write ending at file position `end` would go past
/// the space allocated so far (grown in `preallocate_bytes` steps).
fn grow_step(w: &mut SegWriter, end: u64) -> Option<WriterStep> {
    if end <= w.allocated_len {
        return None;
    }
    let step = w.preallocate_bytes.max(PAGE_BYTES);
    let target = end.div_ceil(step) * step;
    w.allocated_len = target;
    Some(WriterStep::Grow {
        file: file_of(w),
        len: target,
    })
}

/// The segment's file, for a step that uses it: [`next_step`] returns
/// `Open` before any rule runs on a segment without one.
fn file_of(w: &SegWriter) -> Rc<DmaFile> {
    match &w.file {
        Some(f) => f.clone(),
        None => unreachable!("a writer rule ran before its segment's file was open"),
    }
}
