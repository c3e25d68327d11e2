//! Read-ahead for consumers catching up from the segment files.
//!
//! A consumer that has fallen behind the tail cache fetches the log in
//! order, one fetch after another, and each fetch waits for direct reads:
//! the batch headers that bound its range, then the data (`net::file_range`).
//! On the session-12 machine that put ~1.4 ms into every 1 MiB fetch, and
//! one librdkafka consumer keeps only one fetch in flight per broker. Kafka
//! gets read-ahead from the kernel's page cache; fjord's direct reads get
//! none, so the log does its own:
//!
//! - each segment remembers where the last read from its file ended (the
//!   next offset and its position, `Segment::read_cursor`). A read that
//!   starts there is sequential: it starts walking at that position instead
//!   of looking the offset up in the index;
//! - after a sequential read, the segment reads what follows it in the
//!   background: as many bytes as `READ_AHEAD_READS` (2) reads like it
//!   could take, plus a header window, in the pieces of `read_pieces`, all
//!   at once. The next read takes its headers and as much of its data as
//!   the read-ahead holds from memory, and then moves the read-ahead on
//!   (`ReadAhead::advance`): the pieces behind it are dropped, the ones
//!   ahead kept, and the window is read further. So the disk reads the
//!   fetch after next while the consumer takes the next one.
//!
//! Figures (`tuning/results/catch-up-reads.md`), a 1 KiB backlog drained
//! by one librdkafka consumer. Session 12: 393–548 k msg/s without
//! read-ahead, 639–730 k with one read's worth. Session 13, on a machine
//! whose disk reads 0.55–1.4 GB/s: 309–327 k msg/s (medians) with one
//! read's worth, 429–486 k with two that move on.
//!
//! A read-ahead only covers bytes that were written when its reads were
//! started, so it never holds bytes that can still change. One per
//! segment; a reader elsewhere in the log replaces it. The shard holds at
//! most `READ_AHEAD_SHARD_MAX_BYTES` in read-ahead buffers: past that,
//! reads go without (they come from glommio's I/O memory, which the
//! connections' direct reads share).

use futures::future::{FutureExt, LocalBoxFuture, Shared};
use glommio::io::{DmaFile, ReadResult};
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;

/// Most bytes one shard holds in read-ahead buffers at once.
pub const READ_AHEAD_SHARD_MAX_BYTES: u64 = 8 << 20;
/// A read-ahead reaches as far past the last read as this many reads like
/// it could take (their `max_bytes`, within the bounds below), so the disk
/// reads the one after next while the reader takes the next.
pub const READ_AHEAD_READS: u64 = 2;
pub const READ_AHEAD_MIN_BYTES: u64 = 64 << 10;
pub const READ_AHEAD_MAX_BYTES: u64 = 2 << 20;

thread_local! {
    /// Bytes of this shard's live read-ahead buffers.
    static HELD_BYTES: Cell<u64> = const { Cell::new(0) };
}

/// A share of `READ_AHEAD_SHARD_MAX_BYTES`, given back when dropped.
struct Budget(u64);

impl Budget {
    fn take(bytes: u64) -> Option<Budget> {
        HELD_BYTES.with(|held| {
            let now = held.get() + bytes;
            (now <= READ_AHEAD_SHARD_MAX_BYTES).then(|| {
                held.set(now);
                Budget(bytes)
            })
        })
    }
}

impl Drop for Budget {
    fn drop(&mut self) {
        HELD_BYTES.with(|held| held.set(held.get() - self.0));
    }
}

/// Bytes of one direct read of a range (read-ahead, or a connection's
/// `net::file_range`). Reads end at multiples of this in the file, so
/// neighbouring reads share no page.
pub(crate) const READ_PIECE_BYTES: u64 = 256 << 10;
/// The first read of a range ends at a multiple of this instead: a small
/// read comes back sooner (on the session-12 machine's virtio disk a 64 KiB
/// read takes ~0.12 ms, a 256 KiB one ~0.26 ms).
pub(crate) const FIRST_READ_PIECE_BYTES: u64 = 64 << 10;
/// Direct I/O alignment of the reads (the logical block size is at most this).
pub(crate) const READ_ALIGN_BYTES: u64 = 4096;

/// The direct reads that cover `[start, end)`: `(aligned position, aligned
/// length, offset of the first wanted byte in it, wanted bytes)`. The first
/// piece breaks at a multiple of `FIRST_READ_PIECE_BYTES`, the others at
/// multiples of `READ_PIECE_BYTES`.
pub(crate) fn read_pieces(
    start: u64,
    end: u64,
) -> impl Iterator<Item = (u64, usize, usize, usize)> {
    let mut at = start;
    std::iter::from_fn(move || {
        if at >= end {
            return None;
        }
        let step = if at == start {
            FIRST_READ_PIECE_BYTES
        } else {
            READ_PIECE_BYTES
        };
        let next = ((at / step + 1) * step).min(end);
        let aligned = at - at % READ_ALIGN_BYTES;
        let aligned_end = next.div_ceil(READ_ALIGN_BYTES) * READ_ALIGN_BYTES;
        let piece = (
            aligned,
            (aligned_end - aligned) as usize,
            (at - aligned) as usize,
            (next - at) as usize,
        );
        at = next;
        Some(piece)
    })
}

/// One direct read of a read-ahead: bytes `[start, start + len)` of the
/// file, at `skip` in `data`.
struct Piece {
    start: u64,
    len: u64,
    skip: usize,
    /// The read's bytes once it has completed; `None` if it failed.
    data: Shared<LocalBoxFuture<'static, Option<ReadResult>>>,
    _budget: Budget,
}

/// A window of a segment file ahead of its reader: `[pos, end)`, being
/// read or read, in pieces that are read at once (`read_pieces`), so the
/// first bytes are there before the last. As the reader moves on
/// (`advance`), the pieces behind it are dropped and the window is read
/// further, so the disk keeps ahead of a reader that comes back before a
/// whole window could be read.
pub(crate) struct ReadAhead {
    file: Rc<DmaFile>,
    /// `(pos, end)`: the bytes this read-ahead holds.
    span: Cell<(u64, u64)>,
    pieces: RefCell<VecDeque<Piece>>,
}

impl ReadAhead {
    /// Starts direct reads of `[pos, end)` of `file` in the background;
    /// `None` when the shard's read-ahead budget is spent.
    pub fn start(file: Rc<DmaFile>, pos: u64, end: u64) -> Option<ReadAhead> {
        let ahead = ReadAhead {
            file,
            span: Cell::new((pos, pos)),
            pieces: RefCell::new(VecDeque::new()),
        };
        ahead.read_to(end);
        (ahead.span.get().1 > pos).then_some(ahead)
    }

    /// True if the bytes from `pos` on are this read-ahead's to read: it
    /// holds `pos`, or ends there.
    pub fn reaches(&self, pos: u64) -> bool {
        let (start, end) = self.span.get();
        start <= pos && pos <= end
    }

    /// The reader has moved on to `pos` (which this read-ahead `reaches`):
    /// drops what lies wholly before it and reads on up to `end`, as far as
    /// the shard's budget goes.
    pub fn advance(&self, pos: u64, end: u64) {
        let (start, held_end) = self.span.get();
        debug_assert!(start <= pos && pos <= held_end);
        {
            let mut pieces = self.pieces.borrow_mut();
            while pieces.front().is_some_and(|p| p.start + p.len <= pos) {
                pieces.pop_front();
            }
        }
        self.span.set((pos.max(start), held_end));
        self.read_to(end);
    }

    /// Starts the reads from the end of what is held up to `end`.
    fn read_to(&self, end: u64) {
        let (pos, from) = self.span.get();
        let mut held_end = from;
        let mut pieces = self.pieces.borrow_mut();
        for (aligned, aligned_len, skip, want) in read_pieces(from, end) {
            let Some(budget) = Budget::take(aligned_len as u64) else {
                break;
            };
            let file = self.file.clone();
            let read = glommio::spawn_local(async move {
                file.read_at_aligned(aligned, aligned_len).await.ok()
            });
            pieces.push_back(Piece {
                start: aligned + skip as u64,
                len: want as u64,
                skip,
                data: read.boxed_local().shared(),
                _budget: budget,
            });
            held_end += want as u64;
        }
        self.span.set((pos, held_end));
    }

    /// Up to `n` bytes from file position `pos`, if this read-ahead holds
    /// `pos` (waiting for the read that holds it if still in flight). They
    /// end where that read ends, so perhaps fewer than `n`; `None` if it
    /// does not hold `pos` or the read failed.
    pub async fn bytes_at(&self, pos: u64, n: u64) -> Option<ReadResult> {
        let (start, len, skip, data) = {
            let pieces = self.pieces.borrow();
            let i = pieces.partition_point(|p| p.start + p.len <= pos);
            let piece = pieces.get(i).filter(|p| p.start <= pos && n > 0)?;
            (piece.start, piece.len, piece.skip, piece.data.clone())
        };
        let all = data.await?;
        let skip = skip + (pos - start) as usize;
        let n = n
            .min(start + len - pos)
            .min(all.len().saturating_sub(skip) as u64) as usize;
        if n == 0 {
            return None;
        }
        ReadResult::slice(&all, skip, n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cover_the_range_once_with_aligned_reads() {
        for (start, end) in [
            (0u64, 1u64),
            (0, READ_PIECE_BYTES),
            (100, 100 + 3 * READ_PIECE_BYTES + 17),
            (READ_PIECE_BYTES - 1, READ_PIECE_BYTES + 1),
            (4095, 4097),
            (12_345, 12_345),
        ] {
            let mut next = start;
            for (pos, len, skip, want) in read_pieces(start, end) {
                assert_eq!(pos % READ_ALIGN_BYTES, 0);
                assert_eq!(len as u64 % READ_ALIGN_BYTES, 0);
                assert_eq!(pos + skip as u64, next, "pieces follow on one another");
                assert!(skip + want <= len);
                assert!(want > 0 && want as u64 <= READ_PIECE_BYTES);
                if pos + skip as u64 == start {
                    assert!(want as u64 <= FIRST_READ_PIECE_BYTES, "a small first read");
                }
                next += want as u64;
            }
            assert_eq!(next, end, "pieces of {start}..{end} end at its end");
        }
    }

    /// The budget caps what a shard holds and comes back when dropped.
    #[test]
    fn budget_is_capped_and_returned() {
        let a = Budget::take(READ_AHEAD_SHARD_MAX_BYTES - 10).unwrap();
        assert!(Budget::take(11).is_none());
        let b = Budget::take(10).unwrap();
        drop(a);
        let c = Budget::take(READ_AHEAD_SHARD_MAX_BYTES - 10).unwrap();
        drop((b, c));
        assert_eq!(HELD_BYTES.with(Cell::get), 0);
    }

    /// Bytes come from the right place, clipped to what the read-ahead
    /// holds; positions outside it get nothing.
    #[test]
    fn serves_bytes_it_holds() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("segment");
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 253) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        crate::runtime::run_test_executor(move || async move {
            let file = Rc::new(DmaFile::open(&path).await.unwrap());
            // Two reads: [5,000, 65,536) and [65,536, 95,000).
            let ahead = ReadAhead::start(file, 5_000, 95_000).unwrap();
            assert!(ahead.reaches(5_000) && ahead.reaches(95_000));
            assert!(!ahead.reaches(4_999) && !ahead.reaches(95_001));
            let r = ahead.bytes_at(10_000, 100).await.unwrap();
            assert_eq!(&r[..], &data[10_000..10_100]);
            let r = ahead.bytes_at(5_000, 100_000).await.unwrap();
            assert_eq!(
                &r[..],
                &data[5_000..65_536],
                "up to the end of the first read"
            );
            let r = ahead.bytes_at(65_536, 100_000).await.unwrap();
            assert_eq!(&r[..], &data[65_536..95_000], "clipped to its end");
            let r = ahead.bytes_at(94_990, 100).await.unwrap();
            assert_eq!(&r[..], &data[94_990..95_000]);
            assert!(ahead.bytes_at(4_999, 10).await.is_none());
            assert!(ahead.bytes_at(95_000, 10).await.is_none());
        });
    }

    /// Moving on drops the reads behind the reader, keeps the one it is in
    /// and reads on from where the read-ahead ended.
    #[test]
    fn advance_drops_what_is_behind_and_reads_on() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("segment");
        let data: Vec<u8> = (0..2_000_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        crate::runtime::run_test_executor(move || async move {
            let file = Rc::new(DmaFile::open(&path).await.unwrap());
            let ahead = ReadAhead::start(file, 1_000, 300_000).unwrap();
            let held = HELD_BYTES.with(Cell::get);
            // Into the second read ([65,536, 262,144)): the first is dropped.
            ahead.advance(70_000, 1_500_000);
            assert!(!ahead.reaches(69_999) && ahead.reaches(1_500_000));
            assert!(ahead.bytes_at(60_000, 10).await.is_none(), "dropped");
            let r = ahead.bytes_at(70_000, 10).await.unwrap();
            assert_eq!(&r[..], &data[70_000..70_010]);
            let r = ahead.bytes_at(299_990, 100).await.unwrap();
            assert_eq!(&r[..], &data[299_990..300_000], "ends where a read ends");
            let r = ahead.bytes_at(300_000, 100).await.unwrap();
            assert_eq!(&r[..], &data[300_000..300_100], "read on from there");
            let r = ahead.bytes_at(1_499_950, 100).await.unwrap();
            assert_eq!(&r[..], &data[1_499_950..1_500_000]);
            assert!(HELD_BYTES.with(Cell::get) > held);
            // At its end, with nothing more to read: all of it is behind.
            ahead.advance(1_500_000, 1_500_000);
            assert!(ahead.reaches(1_500_000) && ahead.bytes_at(1_499_999, 1).await.is_none());
            assert_eq!(HELD_BYTES.with(Cell::get), 0, "budget returned");
        });
    }
}
