//! Decoding the records inside a v2 batch (for `dump-log --deep-iteration`
//! and record-exact ListOffsets by timestamp). No I/O; compressed batches are
//! decompressed with the codec named in the attributes (gzip, Kafka's
//! xerial-framed or raw snappy, LZ4 frame, zstd).

use crate::record::batch::{BatchHeader, Compression, TimestampType, BATCH_HEADER_BYTES};
use std::io::Read;

/// Largest decompressed records section accepted: 64 MiB.
pub const DECOMPRESSED_MAX_BYTES: usize = 64 << 20;
const XERIAL_MAGIC: [u8; 8] = [0x82, b'S', b'N', b'A', b'P', b'P', b'Y', 0];
const XERIAL_HEADER_BYTES: usize = 16;

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

fn read_limited(mut r: impl Read) -> Result<Vec<u8>, RecordsError> {
    let mut out = Vec::new();
    r.by_ref()
        .take(DECOMPRESSED_MAX_BYTES as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| RecordsError::Decompress(e.to_string()))?;
    if out.len() > DECOMPRESSED_MAX_BYTES {
        return Err(RecordsError::Decompress(
            "decompressed size over limit".into(),
        ));
    }
    Ok(out)
}

/// Decompresses a records section with `codec`.
pub fn decompress(codec: Compression, data: &[u8]) -> Result<Vec<u8>, RecordsError> {
    let de = |e: &dyn std::fmt::Display| RecordsError::Decompress(e.to_string());
    match codec {
        Compression::None => Ok(data.to_vec()),
        Compression::Gzip => read_limited(flate2::read::MultiGzDecoder::new(data)),
        Compression::Lz4 => read_limited(lz4_flex::frame::FrameDecoder::new(data)),
        Compression::Zstd => {
            read_limited(zstd::stream::read::Decoder::new(data).map_err(|e| de(&e))?)
        }
        Compression::Snappy => {
            if data.len() >= XERIAL_HEADER_BYTES && data[..8] == XERIAL_MAGIC {
                let mut out = Vec::new();
                let mut at = XERIAL_HEADER_BYTES;
                while at < data.len() {
                    let len_bytes = data.get(at..at + 4).ok_or(RecordsError::Malformed(at))?;
                    let n = u32::from_be_bytes([
                        len_bytes[0],
                        len_bytes[1],
                        len_bytes[2],
                        len_bytes[3],
                    ]) as usize;
                    at += 4;
                    let block = data.get(at..at + n).ok_or(RecordsError::Malformed(at))?;
                    let d = snap::raw::Decoder::new()
                        .decompress_vec(block)
                        .map_err(|e| de(&e))?;
                    out.extend_from_slice(&d);
                    if out.len() > DECOMPRESSED_MAX_BYTES {
                        return Err(RecordsError::Decompress(
                            "decompressed size over limit".into(),
                        ));
                    }
                    at += n;
                }
                Ok(out)
            } else {
                snap::raw::Decoder::new()
                    .decompress_vec(data)
                    .map_err(|e| de(&e))
            }
        }
    }
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
