//! The appender: a log's staged bytes, segment by segment, from the append
//! that copies a batch in to the write that covers it.
//!
//! Append path (synchronous, no await): the batch's `baseOffset` and
//! `partitionLeaderEpoch` are patched in place (outside the CRC;
//! [`prepare_batch`]), its bytes are staged (below), the indexes are
//! updated, and the batch goes into the shard's tail cache: as `Bytes`, no
//! copy, unless it is a small part of the request frame it was cut from
//! (`PartitionLog::append_from`; see `cache`), which it would keep alive
//! whole.
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
//! What this module owns: the [`Appender`], the queue of [`SegWriter`]s
//! (one per segment that still has bytes to write or to seal, oldest
//! first: appends stage into the back one, the writer works on the front
//! one), each with its [`Chunk`]s, the writes of it in flight
//! ([`InFlight`]) and the batches not yet known written. Which write to
//! issue next is `write_step`'s to decide; issuing it is `writer`'s. When a
//! write completes, [`SegWriter::complete`] moves the segment's
//! `written_len` and says how far the log's `written` offset moves (the
//! rule is in `writer`'s module doc).
//!
//! Invariants: chunks are page aligned and follow one another in file order
//! (`next_chunk_pos`); at most one chunk, the last, is open; a batch's
//! length counts in the arena's `unwritten_bytes` from its staging until
//! a completed write covers it (or its `SegWriter` is dropped).
//!
//! Owned by the log's shard, inside the log's one `RefCell<Appender>`:
//! appends and the writer each borrow it once per batch or step, never
//! across an await.

use super::copy::{self, STREAM_COPY_MIN_BYTES};
use super::iobuf::{IoArena, IoBuf};
use super::segment::Segment;
use super::syncer::SyncFiles;
use super::{LogConfig, LogError, PAGE_BYTES, STAGING_CHUNK_MAX_BYTES};
use crate::record::batch::{self, BatchHeader};
use bytes::BytesMut;
use glommio::io::DmaFile;
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::Arc;

/// An aligned staging buffer holding the file bytes `[pos, pos + len)`;
/// appends copy batches straight into it (no intermediate `Vec`) and a full
/// chunk is handed to the writer as it is, without another copy.
pub(super) struct Chunk {
    /// File position of `buf[0]`; page aligned.
    pub(super) pos: u64,
    pub(super) buf: IoBuf,
    /// Bytes staged.
    pub(super) len: usize,
    /// Bytes `[0, issued)` were covered by an earlier (tail) write; the next
    /// write of this chunk starts at the page containing `issued`.
    pub(super) issued: usize,
    /// Some of it was written through the page cache.
    pub(super) cached: bool,
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

    /// File position just past the staged bytes.
    pub(super) fn end(&self) -> u64 {
        self.pos + self.len as u64
    }

    /// The page-aligned file range still to write: `[from, to)` as offsets
    /// into the chunk (`to` rounds `len` up to a page).
    pub(super) fn unwritten_range(&self) -> (usize, usize) {
        let page = PAGE_BYTES as usize;
        (self.issued / page * page, self.len.div_ceil(page) * page)
    }

    /// The write of a full chunk: its own buffer when no part of it was
    /// written before, else a copy of the pages from the first unwritten one.
    pub(super) fn into_write(mut self, arena: &Rc<IoArena>) -> (u64, IoBuf) {
        let (from, to) = self.unwritten_range();
        if from == 0 {
            return (self.pos, self.buf);
        }
        self.copy_range(from, to, arena)
    }

    /// A copy of `[from, to)` (page aligned) for a write, zero-padded after
    /// `len`; the chunk stays (it is still being filled).
    pub(super) fn copy_range(
        &mut self,
        from: usize,
        to: usize,
        arena: &Rc<IoArena>,
    ) -> (u64, IoBuf) {
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
pub(super) struct InFlight {
    pub(super) seq: u64,
    /// Every logical byte before this is covered by this write or an
    /// earlier-issued one.
    pub(super) end_len: u64,
    pub(super) done: bool,
}

/// Write state of a segment that still has bytes to write or to seal.
pub(super) struct SegWriter {
    pub(super) seg: Rc<Segment>,
    pub(super) file: Option<Rc<DmaFile>>,
    chunk_bytes: usize,
    pub(super) preallocate_bytes: u64,
    pub(super) arena: Rc<IoArena>,
    /// Full chunks not yet issued, in file order.
    pub(super) full: VecDeque<Chunk>,
    /// The chunk being filled; `None` when the staged size is chunk-aligned.
    pub(super) open: Option<Chunk>,
    /// File position where the next chunk starts (end of the last one).
    pub(super) next_chunk_pos: u64,
    /// File position of the chunk whose tail write is in flight: no other
    /// write of its pages may be issued until that one completes.
    pub(super) tail_busy: Option<(u64, u64)>,
    /// The file holds written blocks (data, zeros, a spare's old bytes) up
    /// to here; page aligned, as the pre-zeroing writes that start here.
    pub(super) zeroed_len: u64,
    /// A pre-zeroing write of `[start, end)` is in flight: no data write
    /// into that range may be issued until it completes.
    pub(super) zeroing: Option<(u64, u64)>,
    /// File size after the last fallocate (or of the recycled file).
    pub(super) allocated_len: u64,
    /// (end position, next offset, length) of staged batches not yet known
    /// written; their lengths are counted in the arena's `unwritten_bytes`
    /// until then (or until the writer is dropped).
    batch_ends: VecDeque<(u64, i64, u64)>,
    pub(super) inflight: VecDeque<InFlight>,
    /// No more appends; truncate, fdatasync and write indexes when drained.
    pub(super) sealed: bool,
    /// Buffered (page cache) write descriptor, opened on first use.
    pub(super) buffered: Option<Arc<std::fs::File>>,
    /// The syncer's descriptions of this segment's file, opened with `file`.
    pub(super) sync_files: Option<Rc<SyncFiles>>,
    /// Write-back of the file before this position has been started.
    pub(super) kicked_len: u64,
}

impl Drop for SegWriter {
    fn drop(&mut self) {
        let left: u64 = self.batch_ends.iter().map(|&(_, _, len)| len).sum();
        self.arena.remove_unwritten(left);
    }
}

impl SegWriter {
    pub(super) fn new(
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
    pub(super) fn stage(&mut self, mut pos: u64, mut data: &[u8]) {
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
            debug_assert_eq!(chunk.end(), pos);
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
                self.next_chunk_pos = chunk.end();
                if let Some(c) = self.open.take() {
                    self.full.push_back(c);
                }
            }
        }
    }

    /// Stages the batch `bytes` (header `h`, already patched) at the end of
    /// the segment: its bytes into chunks, its index entries, and its end,
    /// counted unwritten until a write covers it.
    fn stage_batch(&mut self, bytes: &[u8], h: &BatchHeader, index_interval_bytes: u32) {
        let pos = self.seg.size.get();
        let len = bytes.len() as u64;
        self.stage(pos, bytes);
        self.seg.on_append(pos, h, len, index_interval_bytes);
        self.batch_ends
            .push_back((pos + len, h.last_offset() + 1, len));
        self.arena.add_unwritten(len);
    }

    /// A pre-zeroing write in flight overlaps file range `[start, end)`:
    /// a data write there must wait, or zeros could land over the data.
    pub(super) fn zeroing_overlaps(&self, start: u64, end: u64) -> bool {
        self.zeroing.is_some_and(|(zs, ze)| start < ze && end > zs)
    }

    /// Nothing staged is left unissued.
    pub(super) fn all_issued(&self) -> bool {
        self.full.is_empty() && self.open.as_ref().is_none_or(|c| c.issued == c.len)
    }

    /// Records that write `seq` of this segment completed. Returns the
    /// offset after the last whole batch now covered by completed writes
    /// with nothing unwritten before them, if that moved.
    pub(super) fn complete(&mut self, seq: u64) -> Option<i64> {
        if self.tail_busy.is_some_and(|(_, s)| s == seq) {
            self.tail_busy = None;
        }
        if let Some(f) = self.inflight.iter_mut().find(|f| f.seq == seq) {
            f.done = true;
        }
        let mut covered = None;
        while self.inflight.front().is_some_and(|f| f.done) {
            covered = self.inflight.pop_front().map(|f| f.end_len);
        }
        let end_len = covered?;
        if end_len > self.seg.written_len.get() {
            self.seg.written_len.set(end_len);
        }
        let mut next = None;
        while let Some(&(end, off, len)) = self.batch_ends.front() {
            if end > end_len {
                break;
            }
            next = Some(off);
            self.batch_ends.pop_front();
            self.arena.remove_unwritten(len);
        }
        next
    }

    /// The pre-zeroing write in flight completed: the file holds written
    /// blocks up to its end.
    fn zeroing_done(&mut self) {
        if let Some((_, end)) = self.zeroing.take() {
            self.zeroed_len = self.zeroed_len.max(end);
        }
    }

    /// This segment's write state in one line (`PartitionLog::writer_state`).
    fn describe(&self) -> String {
        format!(
            "segment {} file {} full {} open {:?} inflight {:?} tail_busy {:?} zeroing {:?} sealed {} batch_ends {} allocated {} size {}",
            self.seg.base_offset,
            self.file.is_some(),
            self.full.len(),
            self.open.as_ref().map(|c| (c.pos, c.issued, c.len)),
            self.inflight.iter().map(|f| (f.seq, f.end_len, f.done)).collect::<Vec<_>>(),
            self.tail_busy,
            self.zeroing,
            self.sealed,
            self.batch_ends.len(),
            self.allocated_len,
            self.seg.size.get(),
        )
    }
}

/// The segments of a log with bytes to write or to seal, oldest first, and
/// the numbering of their writes.
pub(super) struct Appender {
    /// Never empty while the log is open: the back one is the active
    /// segment's.
    pub(super) writers: VecDeque<SegWriter>,
    pub(super) write_seq: WriteSeq,
}

/// Numbers a log's writes in issue order, from 0 (pre-zeroing writes have
/// a number of their own, `write_step::PREZERO_SEQ`).
pub(super) struct WriteSeq {
    /// Sequence number of the next write issued.
    next: u64,
}

impl WriteSeq {
    /// The next write's sequence number, taken.
    pub(super) fn take(&mut self) -> u64 {
        let seq = self.next;
        self.next = seq + 1;
        seq
    }
}

impl Appender {
    /// An appender whose only segment is the active one.
    pub(super) fn new(active: SegWriter) -> Appender {
        Appender {
            writers: VecDeque::from([active]),
            write_seq: WriteSeq { next: 0 },
        }
    }

    /// Stages batch `bytes` (header `h`) in the active segment.
    pub(super) fn stage_batch(
        &mut self,
        bytes: &[u8],
        h: &BatchHeader,
        index_interval_bytes: u32,
    ) -> Result<(), LogError> {
        let Some(w) = self.writers.back_mut() else {
            return Err(LogError::Corrupt("no active segment".into()));
        };
        w.stage_batch(bytes, h, index_interval_bytes);
        Ok(())
    }

    /// The pre-zeroing write of the front segment completed.
    pub(super) fn zeroing_done(&mut self) {
        if let Some(w) = self.writers.front_mut() {
            w.zeroing_done();
        }
    }

    /// The writer has nothing to do: no segment, or the front one is open,
    /// wholly issued and not sealed.
    pub(super) fn idle(&self) -> bool {
        self.writers
            .front()
            .is_none_or(|w| w.file.is_some() && w.all_issued() && !w.sealed)
    }

    /// Base offset of the oldest segment not yet sealed.
    pub(super) fn front_base(&self) -> Option<i64> {
        self.writers.front().map(|w| w.seg.base_offset)
    }

    /// Staged bytes not yet known written.
    pub(super) fn pending_bytes(&self) -> usize {
        self.writers
            .iter()
            .map(|w| (w.seg.size.get() - w.seg.written_len.get()) as usize)
            .sum()
    }

    /// The front segment's write state in one line, or "none".
    pub(super) fn describe_front(&self) -> String {
        self.writers
            .front()
            .map(SegWriter::describe)
            .unwrap_or_else(|| "none".into())
    }
}

/// Checks ONE v2 batch (its header, its size, its counts) and patches its
/// `baseOffset` to `base` and its `partitionLeaderEpoch` to
/// `leader_epoch`, both outside the CRC; returns its header as patched.
pub(super) fn prepare_batch(
    batch: &mut BytesMut,
    base: i64,
    leader_epoch: i32,
) -> Result<BatchHeader, LogError> {
    let h = BatchHeader::parse(batch)?;
    if h.total_size() != batch.len() {
        return Err(LogError::InvalidBatch(batch::BatchError::Truncated {
            needed: h.total_size(),
            available: batch.len(),
        }));
    }
    h.check_counts()?;
    batch::set_base_offset(batch, base);
    batch::set_partition_leader_epoch(batch, leader_epoch);
    Ok(BatchHeader {
        base_offset: base,
        partition_leader_epoch: leader_epoch,
        ..h
    })
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

/// The part of a file of `size` bytes that pre-zeroing can continue from:
/// its whole pages (a spare's or a recovered segment's size is rarely page
/// aligned, and direct writes must be).
pub(super) fn whole_pages(size: u64) -> u64 {
    size / PAGE_BYTES * PAGE_BYTES
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
