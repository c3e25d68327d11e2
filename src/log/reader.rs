//! Reads of a log: fetches, ListOffsets by timestamp, and scans of whole
//! batches (replays of internal topics).
//!
//! A fetch is served from the shard's tail cache when it holds the batch
//! containing the offset asked for ([`TailSlot`]: this log's part of the
//! per-shard `TailCache`; O_DIRECT writes leave nothing in the page
//! cache). Older data is a catch-up read from the segment files, never
//! past a segment's `written_len` nor past the `written` offset:
//! - the first batch at or after the offset is found by walking batch
//!   headers from the nearest `.index` entry before it, or from where the
//!   log's last read of that segment ended (`Segment::read_cursor`): a
//!   read that starts there is sequential;
//! - whole batches follow while they fit in `max_bytes`: up to the last
//!   index entry in reach without reading their headers (a catch-up read of
//!   large batches would otherwise read one header per batch, one after
//!   another), and from there by walking;
//! - the range goes to the connection as it is chosen by
//!   `--catch-up-reads` (`CatchUpReads`): with `direct`, what the segment's
//!   read-ahead (`log::ahead`) already holds goes from memory and the rest
//!   is a `FileRange` the connection reads with direct I/O
//!   (`net::file_range`), and a sequential read starts the read-ahead of
//!   what follows it; with `sendfile`, the whole range from the page cache
//!   through a buffered descriptor (`net::sendfile`), and no read-ahead of
//!   the log's own.
//!
//! Owned by the log's shard; reads hold `Rc<Segment>`s (and their file
//! descriptors, which keeps retention from recycling a file still read)
//! across awaits, never a borrow of the log's state.

use super::cache::TailCache;
use super::partition::PartitionLog;
use super::segment::Segment;
use super::{CatchUpReads, LogError, ReadResult};
use crate::record::batch::BatchHeader;
use crate::record::{FileRange, RecordsChunk};
use crate::types::{LogEndOffset, LogStartOffset, Offset};
use bytes::Bytes;
use glommio::io::DmaFile;
use std::rc::Rc;

/// This log's entries in the shard's tail cache.
pub(super) struct TailSlot {
    cache: Rc<TailCache>,
    id: u64,
}

impl TailSlot {
    /// Registers a new log with `cache`.
    pub(super) fn new(cache: Rc<TailCache>) -> TailSlot {
        let id = cache.register();
        TailSlot { cache, id }
    }

    /// Caches appended batch `batch` (offsets `base..=last`), a slice of an
    /// allocation of `allocation_bytes` (`cache`).
    pub(super) fn insert(&self, base: i64, last: i64, batch: Bytes, allocation_bytes: usize) {
        self.cache
            .insert(self.id, base, last, batch, allocation_bytes);
    }

    /// The batches from the one containing `from`, if the cache holds it.
    fn read(&self, from: i64, max_bytes: usize, upper: i64) -> Option<ReadResult> {
        let (chunks, bytes) = self.cache.read(self.id, from, max_bytes, upper)?;
        Some(ReadResult {
            chunks: chunks.into_iter().map(RecordsChunk::Memory).collect(),
            bytes,
        })
    }

    /// Drops the cached batches that end below `offset`.
    pub(super) fn remove_below(&self, offset: i64) {
        self.cache.remove_below(self.id, offset);
    }

    /// Drops the cached batches that end at or after `offset`.
    pub(super) fn remove_from(&self, offset: i64) {
        self.cache.remove_from(self.id, offset);
    }

    /// Drops every cached batch of the log.
    pub(super) fn remove(&self) {
        self.cache.remove_log(self.id);
    }
}

impl PartitionLog {
    /// `PartitionLog::read`: whole batches from the one containing `from`,
    /// all with offsets < `upper`, up to `max_bytes` but at least one batch
    /// if any is readable.
    pub(super) async fn read_batches(
        &self,
        from: Offset,
        max_bytes: usize,
        upper: Offset,
    ) -> Result<ReadResult, LogError> {
        self.health.check_usable()?;
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
        if let Some(r) = self.tail.read(from.0, max_bytes, upper.0) {
            crate::metrics::record_cache_read(Some(r.bytes));
            return Ok(r);
        }
        crate::metrics::record_cache_read(None);
        let upper = upper.0.min(self.written.get());
        let sendfile = self.config.borrow().catch_up_reads == CatchUpReads::Sendfile;
        for seg in self.segments_from(from.0) {
            if seg.base_offset >= upper {
                break;
            }
            if let Some(r) = read_segment(&seg, from.0, upper, max_bytes, sendfile).await? {
                return Ok(r);
            }
        }
        Ok(ReadResult::default())
    }

    /// `PartitionLog::offset_for_timestamp`: the first offset whose
    /// timestamp is >= `ts_ms`, and that record's timestamp.
    pub(super) async fn find_timestamp(
        &self,
        ts_ms: i64,
    ) -> Result<Option<(Offset, i64)>, LogError> {
        self.health.check_usable()?;
        let upper = self.written.get();
        let segs: Vec<Rc<Segment>> = self.segments.borrow().values().cloned().collect();
        for seg in segs {
            if seg.max_ts.get().is_none_or(|(t, _)| t < ts_ms) || seg.base_offset >= upper {
                continue;
            }
            let log_start = self.log_start.get();
            if let Some(r) = timestamp_in_segment(&seg, ts_ms, upper, log_start).await? {
                return Ok(r.map(|(o, t)| (Offset(o.max(log_start)), t)));
            }
        }
        Ok(None)
    }

    /// `PartitionLog::scan`: visits every written batch from `from` to the
    /// log end.
    pub(super) async fn scan_batches(
        &self,
        from: Offset,
        f: &mut dyn FnMut(&BatchHeader, &[u8]),
    ) -> Result<(), LogError> {
        self.health.check_usable()?;
        let upper = self.written.get();
        for seg in self.segments_from(from.0) {
            if seg.base_offset >= upper {
                break;
            }
            let start_pos = index_position(&seg, from.0);
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

    /// The segment holding `offset` (or the first one, if none does) and
    /// every later one.
    fn segments_from(&self, offset: i64) -> Vec<Rc<Segment>> {
        let segs = self.segments.borrow();
        let first = segs
            .range(..=offset)
            .next_back()
            .map(|(b, _)| *b)
            .unwrap_or(i64::MIN);
        segs.range(first..).map(|(_, s)| s.clone()).collect()
    }
}

/// The read of `seg` for a fetch from `from` below `upper`; `None` when
/// `seg` has no batch there.
async fn read_segment(
    seg: &Segment,
    from: i64,
    upper: i64,
    max_bytes: usize,
    sendfile: bool,
) -> Result<Option<ReadResult>, LogError> {
    // A read that starts where the last one ended is sequential: it
    // walks from there, and what follows it is read ahead
    // (`log::ahead`).
    let cursor = seg.read_cursor.get().filter(|(next, _)| *next == from);
    let start_pos = match cursor {
        Some((_, pos)) => pos,
        None => index_position(seg, from),
    };
    let Some((position, first_len, first_last)) = first_batch(seg, start_pos, from, upper).await?
    else {
        return Ok(None);
    };
    let (len, next_offset) =
        batches_within(seg, position, first_len, first_last, upper, max_bytes).await?;
    let end = position + len;
    crate::metrics::record_catch_up_read(len as usize);
    seg.read_cursor.set(Some((next_offset, end)));
    let file = seg.dma().await?;
    if sendfile {
        // `--catch-up-reads sendfile`: the whole range from the page
        // cache, and no read-ahead of the log's own.
        return Ok(Some(ReadResult {
            chunks: vec![RecordsChunk::File(FileRange {
                file,
                buffered: Some(seg.read_file()?),
                position,
                len: len as usize,
            })],
            bytes: len as usize,
        }));
    }
    let chunks = ahead_then_file(seg, &file, position, end).await;
    if cursor.is_some() {
        seg.read_ahead(file, end, max_bytes as u64);
    }
    Ok(Some(ReadResult {
        chunks,
        bytes: len as usize,
    }))
}

/// Where a walk of `seg` for `offset` starts without a read cursor: the
/// position of the index entry at or before it.
pub(super) fn index_position(seg: &Segment, offset: i64) -> u64 {
    if offset > seg.base_offset {
        seg.index.borrow().lookup((offset - seg.base_offset) as u32) as u64
    } else {
        0
    }
}

/// (position, length, last offset) of the first batch of `seg` with
/// offsets at or past `from`, by walking from `start_pos`; `None` if there
/// is none below `upper`.
async fn first_batch(
    seg: &Segment,
    start_pos: u64,
    from: i64,
    upper: i64,
) -> Result<Option<(u64, u64, i64)>, LogError> {
    let mut first: Option<(u64, u64, i64)> = None;
    seg.walk(start_pos, seg.written_len.get(), false, &mut |pos, h, _| {
        if h.last_offset() < from {
            return true;
        }
        if h.last_offset() < upper {
            first = Some((pos, h.total_size() as u64, h.last_offset()));
        }
        false
    })
    .await?;
    Ok(first)
}

/// The length of the whole batches from `position` (the first one
/// `first_len` long, ending at offset `first_last`) that fit in
/// `max_bytes` below `upper`, and the offset after them: up to the last
/// index entry in reach without reading their headers (a catch-up read of
/// large batches would otherwise read one header per batch, one after
/// another), and from there by walking.
async fn batches_within(
    seg: &Segment,
    position: u64,
    first_len: u64,
    first_last: i64,
    upper: i64,
    max_bytes: usize,
) -> Result<(u64, i64), LogError> {
    let limit = position + max_bytes as u64;
    let mut len = first_len;
    let mut next_offset = first_last + 1;
    if len >= max_bytes as u64 {
        return Ok((len, next_offset));
    }
    let relative_upper = (upper - seg.base_offset).max(0) as u64;
    if let Some(p) =
        seg.index
            .borrow()
            .last_position_within(position + len - 1, limit, relative_upper)
    {
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
    Ok((len, next_offset))
}

/// The chunks of file range `[position, end)` of `seg` for a direct
/// catch-up read: what the read-ahead already holds of it goes from
/// memory, the rest is read as the connection sends it.
async fn ahead_then_file(
    seg: &Segment,
    file: &Rc<DmaFile>,
    position: u64,
    end: u64,
) -> Vec<RecordsChunk> {
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
    chunks
}

/// The first record of `seg` at or after `ts_ms` in a batch below `upper`
/// that is not wholly below `log_start`, as (offset, timestamp) (record
/// exact for uncompressed batches; for compressed ones the records are
/// decompressed); `Some(None)` if that batch holds none, `None` if no batch
/// of the segment qualifies.
async fn timestamp_in_segment(
    seg: &Segment,
    ts_ms: i64,
    upper: i64,
    log_start: i64,
) -> Result<Option<Option<(i64, i64)>>, LogError> {
    let rel = seg.time_index.borrow().lookup(ts_ms);
    let pos = seg.index.borrow().lookup(rel) as u64;
    let mut found: Option<Result<Option<(i64, i64)>, LogError>> = None;
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
    found.transpose()
}
