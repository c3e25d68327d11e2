//! Record batches, format v2 (magic 2), exactly as Kafka lays them out.
//!
//! This module owns the byte layout of a batch (KAFKA_BEHAVIOUR.md §1) and
//! nothing else: it does no I/O. The broker fills only `baseOffset` and
//! `partitionLeaderEpoch`, both of which lie before the CRC-covered region
//! (bytes 21..end), so appending never recomputes a client's CRC.
//!
//! `batch` holds the fixed 61-byte header view, validation and in-place
//! patching; everything that reads a log file or a produce request walks
//! batches with [`batch::BatchIter`]. `records` decodes the records inside
//! a batch (varints, headers, control records), `compression` holds the
//! four codecs in Kafka's wire formats, and `builder` builds batches,
//! transaction markers and recompressed copies.

pub mod batch;
pub mod builder;
pub mod compression;
pub mod error;
pub mod records;

pub use batch::{BatchError, BatchHeader, BatchIter, Compression, TimestampType};
pub use builder::{control_batch, recompress, recompress_bounded, BatchBuilder, NewRecord};
pub use error::RecordsError;
pub use records::{decode_batch, ControlType, Record, RecordHeader};

use bytes::Bytes;
use std::rc::Rc;

/// A byte range of an open segment file, read as the connection sends it.
/// `file` is the segment's O_DIRECT descriptor, shared by every reader of
/// that segment: the connection reads the range with direct reads
/// (`net::file_range`). Under `--catch-up-reads sendfile` the log also
/// hands out the segment's buffered descriptor in `buffered`, and the
/// connection sends the range from the page cache with `sendfile(2)`
/// instead (`net::sendfile`).
#[derive(Clone, Debug)]
pub struct FileRange {
    pub file: Rc<glommio::io::DmaFile>,
    pub buffered: Option<Rc<std::fs::File>>,
    pub position: u64,
    pub len: usize,
}

/// One piece of a records field on its way to a client: bytes already in
/// memory (the tail cache), bytes a direct read brought in (a segment's
/// read-ahead), or a range of a segment file still to be read. A read
/// returns a sequence of these that together hold whole batches.
#[derive(Clone, Debug)]
pub enum RecordsChunk {
    Memory(Bytes),
    Loaded(glommio::io::ReadResult),
    File(FileRange),
}

impl RecordsChunk {
    pub fn len(&self) -> usize {
        match self {
            RecordsChunk::Memory(b) => b.len(),
            RecordsChunk::Loaded(r) => r.len(),
            RecordsChunk::File(r) => r.len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
