//! Reading what the broker wrote: a partition's segment bytes, walked batch
//! by batch with fjord's own batch parser (the on-disk format is Kafka's).
//!
//! Segment files are preallocated, so the bytes after the last batch are
//! zeros; [`batches`] stops at the first position that is not a complete
//! batch, which is where the log's logical end is.

use fjord::record::{decode_batch, BatchHeader, BatchIter, Record};

/// One stored batch: its position in the file, header and raw bytes.
#[derive(Clone, Debug)]
pub struct StoredBatch {
    pub position: usize,
    pub header: BatchHeader,
    pub bytes: Vec<u8>,
}

impl StoredBatch {
    /// The batch's records, decompressed.
    pub fn records(&self) -> Vec<Record> {
        decode_batch(&self.bytes)
            .map(|(_, records)| records)
            .unwrap_or_else(|e| panic!("stored batch at {} does not decode: {e}", self.position))
    }
}

/// Every complete batch at the start of `segment`.
pub fn batches(segment: &[u8]) -> Vec<StoredBatch> {
    BatchIter::new(segment)
        .map(|(position, header)| StoredBatch {
            position,
            header,
            bytes: segment[position..position + header.total_size()].to_vec(),
        })
        .collect()
}
