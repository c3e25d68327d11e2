//! Decoding the records inside a v2 batch (for `dump-log --deep-iteration`
//! and record-exact ListOffsets by timestamp). No I/O; compressed batches are
//! decompressed with the codec named in the attributes (gzip, Kafka's
//! xerial-framed or raw snappy, LZ4 frame, zstd).

use crate::record::batch::{BatchHeader, Compression, TimestampType, BATCH_HEADER_BYTES};

/// Largest decompressed records section accepted: 64 MiB.
pub const DECOMPRESSED_MAX_BYTES: usize = 64 << 20;

#[derive(Debug, thiserror::Error)]
pub enum RecordsError {
    #[error("batch header: {0}")]
    Header(#[from] crate::record::BatchError),
    #[error("malformed record at byte {0}")]
    Malformed(usize),
    #[error("decompression failed: {0}")]
    Decompress(String),
}

/// One decoded record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub offset: i64,
    pub timestamp: i64,
    pub attributes: i8,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: Vec<(Vec<u8>, Option<Vec<u8>>)>,
}

struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

impl Cursor<'_> {
    fn varlong(&mut self) -> Result<i64, RecordsError> {
        let mut v: u64 = 0;
        let mut shift = 0;
        loop {
            let byte = *self
                .b
                .get(self.at)
                .ok_or(RecordsError::Malformed(self.at))?;
            self.at += 1;
            v |= ((byte & 0x7f) as u64) << shift;
            if byte & 0x80 == 0 {
                break;
            }
            shift += 7;
            if shift > 63 {
                return Err(RecordsError::Malformed(self.at));
            }
        }
        Ok(((v >> 1) as i64) ^ -((v & 1) as i64))
    }

    fn bytes(&mut self, n: usize) -> Result<&[u8], RecordsError> {
        let end = self
            .at
            .checked_add(n)
            .ok_or(RecordsError::Malformed(self.at))?;
        let s = self
            .b
            .get(self.at..end)
            .ok_or(RecordsError::Malformed(self.at))?;
        self.at = end;
        Ok(s)
    }

    fn nullable(&mut self) -> Result<Option<Vec<u8>>, RecordsError> {
        let n = self.varlong()?;
        if n < 0 {
            return Ok(None);
        }
        Ok(Some(self.bytes(n as usize)?.to_vec()))
    }
}

/// Decompresses a records section with `codec`, bounded by
/// [`DECOMPRESSED_MAX_BYTES`] (the produce path's decoder, whose snappy
/// reads the declared length before it allocates).
pub fn decompress(codec: Compression, data: &[u8]) -> Result<Vec<u8>, RecordsError> {
    crate::record::compression::decompress(codec, data, DECOMPRESSED_MAX_BYTES)
        .map_err(|e| RecordsError::Decompress(e.to_string()))
}

/// Decodes every record of a complete batch.
pub fn decode_records(batch: &[u8]) -> Result<Vec<Record>, RecordsError> {
    let h = BatchHeader::parse(batch)?;
    let body = batch
        .get(BATCH_HEADER_BYTES..h.total_size())
        .ok_or(RecordsError::Malformed(BATCH_HEADER_BYTES))?;
    let data = decompress(h.compression()?, body)?;
    let mut c = Cursor { b: &data, at: 0 };
    let mut out = Vec::new();
    for _ in 0..h.records_count.max(0) {
        let len = c.varlong()?;
        if len < 0 {
            return Err(RecordsError::Malformed(c.at));
        }
        let end = c.at + len as usize;
        let attributes = c.bytes(1)?[0] as i8;
        let ts_delta = c.varlong()?;
        let off_delta = c.varlong()?;
        let key = c.nullable()?;
        let value = c.nullable()?;
        let n_headers = c.varlong()?;
        let mut headers = Vec::new();
        for _ in 0..n_headers.max(0) {
            let kl = c.varlong()?;
            let k = c.bytes(kl.max(0) as usize)?.to_vec();
            headers.push((k, c.nullable()?));
        }
        if c.at != end {
            return Err(RecordsError::Malformed(c.at));
        }
        let timestamp = match h.timestamp_type() {
            TimestampType::LogAppendTime => h.max_timestamp,
            TimestampType::CreateTime => h.base_timestamp + ts_delta,
        };
        out.push(Record {
            offset: h.base_offset + off_delta,
            timestamp,
            attributes,
            key,
            value,
            headers,
        });
    }
    Ok(out)
}

/// (offset, timestamp) of the first record with timestamp >= `ts_ms`.
pub fn first_record_at_or_after(
    batch: &[u8],
    ts_ms: i64,
) -> Result<Option<(i64, i64)>, RecordsError> {
    Ok(decode_records(batch)?
        .into_iter()
        .find(|r| r.timestamp >= ts_ms)
        .map(|r| (r.offset, r.timestamp)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snappy_block_declaring_gigabytes_is_refused_before_it_is_allocated() {
        // Found by the `segment_recovery` fuzz target: a raw snappy block
        // whose length varint says 2.5 GB made the decoder allocate that
        // much for a few input bytes.
        let block = [0xbb, 0xbb, 0xbb, 0xbb, 0x09, 0x00, 0x44];
        let e = decompress(Compression::Snappy, &block).unwrap_err();
        assert!(e.to_string().contains("exceed"), "{e}");
        // Kafka's xerial framing around the same block.
        let mut xerial = vec![
            0x82, b'S', b'N', b'A', b'P', b'P', b'Y', 0, 0, 0, 0, 1, 0, 0, 0, 1,
        ];
        xerial.extend_from_slice(&(block.len() as u32).to_be_bytes());
        xerial.extend_from_slice(&block);
        let e = decompress(Compression::Snappy, &xerial).unwrap_err();
        assert!(e.to_string().contains("exceed"), "{e}");
    }
}
