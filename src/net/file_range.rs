//! Sending a range of a segment file to a socket: direct (O_DIRECT) reads
//! into glommio's pinned I/O memory, each written to the socket as it
//! arrives, with a few reads in flight ahead of the writes.
//!
//! Why not `sendfile` from the page cache, as DESIGN.md §4 first had it
//! (still selectable as `--catch-up-reads sendfile`, `net::sendfile`):
//! fjord writes large batches with O_DIRECT (small appends go through the
//! page cache, which may drop them once written back), so the data a
//! catch-up fetch wants is mostly not in the page cache. Reading it through
//! the page cache fills freshly allocated pages from the disk, and on a VM
//! the first CPU
//! touch of such a page can be very dear: with the balloon's free-page
//! reporting (which these machines have), memory the guest freed was handed
//! back to the host and is mapped again on first access. Whoever touches the
//! page first pays: the consumer's receive copy under sendfile, the broker's
//! copy under a buffered `pread`. Measured on the session-12 machine
//! (`tuning/results/catch-up-reads.md`, 3 rounds), a 1 GiB file sent over
//! loopback:
//!
//! | how the sender reads the file | receiver CPU | sender CPU | MB/s |
//! |---|---|---|---|
//! | sendfile, pages fresh from the disk | 1.75–2.01 s/GB | 0.09–0.11 s/GB | 489–562 |
//! | buffered pread + send, pages fresh from the disk | 0.15–0.17 s/GB | 1.85–2.12 s/GB | 462–536 |
//! | O_DIRECT read into reused memory + send | 0.12–0.16 s/GB | 0.30–0.34 s/GB | 858–939 |
//! | sendfile again (pages now touched) | 0.17–0.22 s/GB | 0.24–0.36 s/GB | 2662–3644 |
//!
//! Direct reads land in memory the shard keeps and reuses (glommio's
//! `io_memory` pool, locked; a read that does not fit there falls back to
//! the heap), and nothing piles up in the page cache. The prices:
//! - one copy into the socket on the broker's core, which the table shows
//!   is far cheaper here than the first touch;
//! - a range read by several consumers is read from the disk for each,
//!   where the page cache would have served the later ones from memory;
//! - a range appended through the page cache and still there is read from
//!   the disk all the same (the kernel first writes back any of its pages
//!   that are dirty).
//!
//! Recent data, which most consumers read, comes from the tail cache and
//! never reaches this path.
//!
//! Reads go through io_uring and never block the reactor (iomap completes
//! direct reads inline; see `log/direct.rs`), so unlike sendfile this needs
//! no helper thread.

use crate::log::ahead::read_pieces;
use crate::record::FileRange;
use futures::StreamExt;
use futures_lite::io::{AsyncWrite, AsyncWriteExt};
use std::io;

/// Direct reads of one range in flight at once (1 MiB ahead of the socket).
const READS_IN_FLIGHT: usize = 4;

/// Reads `range` of its file with direct reads and writes it to `stream`.
pub async fn send_range<S: AsyncWrite + Unpin>(
    stream: &mut S,
    range: &FileRange,
) -> io::Result<()> {
    let file = &range.file;
    let mut reads = futures::stream::iter(read_pieces(
        range.position,
        range.position + range.len as u64,
    ))
    .map(|(pos, len, skip, want)| async move {
        let buf = file
            .read_at_aligned(pos, len)
            .await
            .map_err(io::Error::from)?;
        if buf.len() < skip + want {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "segment file ended before the requested range",
            ));
        }
        Ok((buf, skip, want))
    })
    .buffered(READS_IN_FLIGHT);
    while let Some(read) = reads.next().await {
        let (buf, skip, want) = read?;
        stream.write_all(&buf[skip..skip + want]).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A range over several pieces, starting and ending off the alignment,
    /// arrives whole and in order; a range past the end of the file is an
    /// error, not a short send.
    #[test]
    fn sends_a_range_with_direct_reads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("segment");
        let data: Vec<u8> = (0..3 * crate::log::ahead::READ_PIECE_BYTES as usize + 9_000)
            .map(|i| (i % 251) as u8)
            .collect();
        std::fs::write(&path, &data).unwrap();
        crate::runtime::run_test_executor(move || async move {
            let file = std::rc::Rc::new(glommio::io::DmaFile::open(&path).await.unwrap());
            for (position, len) in [(0, data.len()), (5_000, data.len() - 5_001), (4096, 1)] {
                let mut out = Vec::new();
                let range = FileRange {
                    file: file.clone(),
                    buffered: None,
                    position,
                    len,
                };
                send_range(&mut out, &range).await.unwrap();
                assert!(out == data[position as usize..position as usize + len]);
            }
            let past_end = FileRange {
                file: file.clone(),
                buffered: None,
                position: data.len() as u64 - 10,
                len: 20,
            };
            let err = send_range(&mut Vec::new(), &past_end).await.unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        });
    }
}
