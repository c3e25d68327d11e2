//! The record batch v2 header: parse, validate, patch in place.

use std::fmt;

/// Bytes before `batchLength`'s payload: baseOffset (8) + batchLength (4).
pub const LOG_OVERHEAD_BYTES: usize = 12;
/// Size of the fixed v2 batch header, up to and including `recordsCount`.
pub const BATCH_HEADER_BYTES: usize = 61;
/// The only record format fjord accepts.
pub const MAGIC_V2: i8 = 2;

const BASE_OFFSET_AT: usize = 0;
const BATCH_LENGTH_AT: usize = 8;
const PARTITION_LEADER_EPOCH_AT: usize = 12;
const MAGIC_AT: usize = 16;
const CRC_AT: usize = 17;
/// The CRC covers the batch from the attributes field to its end.
pub const CRC_COVERED_FROM: usize = 21;
const ATTRIBUTES_AT: usize = 21;
const LAST_OFFSET_DELTA_AT: usize = 23;
const BASE_TIMESTAMP_AT: usize = 27;
const MAX_TIMESTAMP_AT: usize = 35;
const PRODUCER_ID_AT: usize = 43;
const PRODUCER_EPOCH_AT: usize = 51;
const BASE_SEQUENCE_AT: usize = 53;
const RECORDS_COUNT_AT: usize = 57;

const ATTR_COMPRESSION_MASK: i16 = 0x07;
const ATTR_TIMESTAMP_TYPE: i16 = 0x08;
const ATTR_TRANSACTIONAL: i16 = 0x10;
const ATTR_CONTROL: i16 = 0x20;
const ATTR_DELETE_HORIZON: i16 = 0x40;

/// The compression codec named in a batch's attributes (bits 0-2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Compression {
    None = 0,
    Gzip = 1,
    Snappy = 2,
    Lz4 = 3,
    Zstd = 4,
}

impl Compression {
    pub fn from_id(id: i16) -> Option<Compression> {
        Some(match id {
            0 => Compression::None,
            1 => Compression::Gzip,
            2 => Compression::Snappy,
            3 => Compression::Lz4,
            4 => Compression::Zstd,
            _ => return None,
        })
    }

    /// The name Kafka uses in `compression.type` and in kafka-dump-log.
    pub fn name(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Gzip => "gzip",
            Compression::Snappy => "snappy",
            Compression::Lz4 => "lz4",
            Compression::Zstd => "zstd",
        }
    }

    pub fn from_name(name: &str) -> Option<Compression> {
        Some(match name {
            "none" | "uncompressed" => Compression::None,
            "gzip" => Compression::Gzip,
            "snappy" => Compression::Snappy,
            "lz4" => Compression::Lz4,
            "zstd" => Compression::Zstd,
            _ => return None,
        })
    }
}

/// Whether timestamps were set by the client or by the broker on append.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimestampType {
    CreateTime,
    LogAppendTime,
}

/// Why a byte range is not a valid v2 batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BatchError {
    /// Fewer bytes than a header, or than the header's `batchLength` claims.
    Truncated { needed: usize, available: usize },
    /// `batchLength` is smaller than a header can be.
    InvalidLength(i32),
    /// Magic byte other than 2.
    UnsupportedMagic(i8),
    /// Attributes name a codec Kafka does not define.
    UnknownCompression(i16),
    /// The stored CRC does not match the bytes.
    CrcMismatch { stored: u32, computed: u32 },
    /// `recordsCount` is negative or inconsistent with `lastOffsetDelta`.
    InvalidRecordCount(i32),
}

impl fmt::Display for BatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BatchError::Truncated { needed, available } => {
                write!(f, "truncated batch: need {needed} bytes, have {available}")
            }
            BatchError::InvalidLength(l) => write!(f, "invalid batch length {l}"),
            BatchError::UnsupportedMagic(m) => write!(f, "unsupported magic {m}"),
            BatchError::UnknownCompression(c) => write!(f, "unknown compression codec {c}"),
            BatchError::CrcMismatch { stored, computed } => {
                write!(f, "crc mismatch: stored {stored}, computed {computed}")
            }
            BatchError::InvalidRecordCount(c) => write!(f, "invalid record count {c}"),
        }
    }
}

impl std::error::Error for BatchError {}

fn be_i16(b: &[u8], at: usize) -> i16 {
    i16::from_be_bytes([b[at], b[at + 1]])
}
fn be_i32(b: &[u8], at: usize) -> i32 {
    i32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn be_u32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn be_i64(b: &[u8], at: usize) -> i64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    i64::from_be_bytes(a)
}

/// The decoded fixed header of one v2 batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchHeader {
    pub base_offset: i64,
    pub batch_length: i32,
    pub partition_leader_epoch: i32,
    pub magic: i8,
    pub crc: u32,
    pub attributes: i16,
    pub last_offset_delta: i32,
    pub base_timestamp: i64,
    pub max_timestamp: i64,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub records_count: i32,
}

impl BatchHeader {
    /// Parses the header at the start of `buf`. Checks that the header is
    /// complete, the magic is 2 and `batchLength` is plausible; it does not
    /// require the whole batch to be present nor check the CRC.
    pub fn parse(buf: &[u8]) -> Result<BatchHeader, BatchError> {
        if buf.len() < LOG_OVERHEAD_BYTES + 5 {
            return Err(BatchError::Truncated {
                needed: BATCH_HEADER_BYTES,
                available: buf.len(),
            });
        }
        let batch_length = be_i32(buf, BATCH_LENGTH_AT);
        let magic = buf[MAGIC_AT] as i8;
        if magic != MAGIC_V2 {
            return Err(BatchError::UnsupportedMagic(magic));
        }
        if (batch_length as i64) < (BATCH_HEADER_BYTES - LOG_OVERHEAD_BYTES) as i64 {
            return Err(BatchError::InvalidLength(batch_length));
        }
        if buf.len() < BATCH_HEADER_BYTES {
            return Err(BatchError::Truncated {
                needed: BATCH_HEADER_BYTES,
                available: buf.len(),
            });
        }
        Ok(BatchHeader {
            base_offset: be_i64(buf, BASE_OFFSET_AT),
            batch_length,
            partition_leader_epoch: be_i32(buf, PARTITION_LEADER_EPOCH_AT),
            magic,
            crc: be_u32(buf, CRC_AT),
            attributes: be_i16(buf, ATTRIBUTES_AT),
            last_offset_delta: be_i32(buf, LAST_OFFSET_DELTA_AT),
            base_timestamp: be_i64(buf, BASE_TIMESTAMP_AT),
            max_timestamp: be_i64(buf, MAX_TIMESTAMP_AT),
            producer_id: be_i64(buf, PRODUCER_ID_AT),
            producer_epoch: be_i16(buf, PRODUCER_EPOCH_AT),
            base_sequence: be_i32(buf, BASE_SEQUENCE_AT),
            records_count: be_i32(buf, RECORDS_COUNT_AT),
        })
    }

    /// Total bytes of the batch including baseOffset and batchLength.
    pub fn total_size(&self) -> usize {
        self.batch_length as usize + LOG_OVERHEAD_BYTES
    }

    pub fn last_offset(&self) -> i64 {
        self.base_offset + self.last_offset_delta as i64
    }

    /// Records in the batch as the offsets span them (`lastOffsetDelta + 1`).
    pub fn offset_count(&self) -> i64 {
        self.last_offset_delta as i64 + 1
    }

    pub fn compression_id(&self) -> i16 {
        self.attributes & ATTR_COMPRESSION_MASK
    }

    pub fn compression(&self) -> Result<Compression, BatchError> {
        Compression::from_id(self.compression_id())
            .ok_or(BatchError::UnknownCompression(self.compression_id()))
    }

    pub fn timestamp_type(&self) -> TimestampType {
        if self.attributes & ATTR_TIMESTAMP_TYPE != 0 {
            TimestampType::LogAppendTime
        } else {
            TimestampType::CreateTime
        }
    }

    pub fn is_transactional(&self) -> bool {
        self.attributes & ATTR_TRANSACTIONAL != 0
    }

    pub fn is_control(&self) -> bool {
        self.attributes & ATTR_CONTROL != 0
    }

    pub fn has_delete_horizon(&self) -> bool {
        self.attributes & ATTR_DELETE_HORIZON != 0
    }

    /// The last sequence number in the batch; wraps past `i32::MAX` as Kafka does.
    pub fn last_sequence(&self) -> i32 {
        if self.base_sequence < 0 {
            return -1;
        }
        let last = self.base_sequence as i64 + self.last_offset_delta as i64;
        if last > i32::MAX as i64 {
            (last - i32::MAX as i64 - 1) as i32
        } else {
            last as i32
        }
    }

    /// Checks that the header is internally consistent (count vs delta).
    pub fn check_counts(&self) -> Result<(), BatchError> {
        if self.records_count < 0 || self.last_offset_delta < 0 {
            return Err(BatchError::InvalidRecordCount(self.records_count));
        }
        Ok(())
    }
}

/// CRC-32C over the CRC-covered part of a complete batch.
pub fn compute_crc(batch: &[u8]) -> u32 {
    crc32c::crc32c(&batch[CRC_COVERED_FROM..])
}

/// Parses the header and checks that the whole batch is present, its counts
/// are sane and its CRC matches. Returns the header of a valid batch.
pub fn validate(batch: &[u8]) -> Result<BatchHeader, BatchError> {
    let header = BatchHeader::parse(batch)?;
    let size = header.total_size();
    if batch.len() < size {
        return Err(BatchError::Truncated {
            needed: size,
            available: batch.len(),
        });
    }
    header.check_counts()?;
    let computed = compute_crc(&batch[..size]);
    if computed != header.crc {
        return Err(BatchError::CrcMismatch {
            stored: header.crc,
            computed,
        });
    }
    Ok(header)
}

/// Writes `baseOffset` in place; outside the CRC, so the CRC stays valid.
pub fn set_base_offset(batch: &mut [u8], base_offset: i64) {
    batch[BASE_OFFSET_AT..BASE_OFFSET_AT + 8].copy_from_slice(&base_offset.to_be_bytes());
}

/// Writes `partitionLeaderEpoch` in place; outside the CRC.
pub fn set_partition_leader_epoch(batch: &mut [u8], epoch: i32) {
    batch[PARTITION_LEADER_EPOCH_AT..PARTITION_LEADER_EPOCH_AT + 4]
        .copy_from_slice(&epoch.to_be_bytes());
}

/// Sets maxTimestamp and the LogAppendTime attribute bit, then recomputes the
/// CRC (both are CRC-covered). Used for topics with LogAppendTime.
pub fn set_log_append_time(batch: &mut [u8], timestamp_ms: i64) {
    let attrs = be_i16(batch, ATTRIBUTES_AT) | ATTR_TIMESTAMP_TYPE;
    batch[ATTRIBUTES_AT..ATTRIBUTES_AT + 2].copy_from_slice(&attrs.to_be_bytes());
    batch[MAX_TIMESTAMP_AT..MAX_TIMESTAMP_AT + 8].copy_from_slice(&timestamp_ms.to_be_bytes());
    let crc = compute_crc(batch);
    batch[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_be_bytes());
}

/// Walks consecutive batches in a buffer (a log segment or a records field),
/// yielding `(position, header)` for each complete batch whose header parses.
/// Stops at the first incomplete or unparsable batch; `position()` then tells
/// where the valid prefix ends. CRCs are not checked here (see [`validate`]).
pub struct BatchIter<'a> {
    buf: &'a [u8],
    pos: usize,
    error: Option<BatchError>,
}

impl<'a> BatchIter<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        BatchIter {
            buf,
            pos: 0,
            error: None,
        }
    }

    /// Byte position after the last batch yielded.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Why iteration stopped early, if it did (None at a clean end).
    pub fn error(&self) -> Option<&BatchError> {
        self.error.as_ref()
    }
}

impl<'a> Iterator for BatchIter<'a> {
    type Item = (usize, BatchHeader);

    fn next(&mut self) -> Option<Self::Item> {
        if self.error.is_some() || self.pos >= self.buf.len() {
            return None;
        }
        let rest = &self.buf[self.pos..];
        match BatchHeader::parse(rest) {
            Ok(h) if h.total_size() <= rest.len() => {
                let at = self.pos;
                self.pos += h.total_size();
                Some((at, h))
            }
            Ok(h) => {
                self.error = Some(BatchError::Truncated {
                    needed: h.total_size(),
                    available: rest.len(),
                });
                None
            }
            Err(e) => {
                self.error = Some(e);
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A one-record uncompressed batch with key "k" and value "v", built by
    /// hand so the test does not depend on the builder it checks.
    fn hand_batch() -> Vec<u8> {
        // record: attributes 0, tsDelta 0, offsetDelta 0, key len 1 "k",
        // value len 1 "v", 0 headers; lengths are zigzag varints.
        let record: Vec<u8> = vec![0, 0, 0, 2, b'k', 2, b'v', 0];
        let mut b = Vec::new();
        b.extend_from_slice(&0i64.to_be_bytes()); // baseOffset
        b.extend_from_slice(&0i32.to_be_bytes()); // batchLength, patched below
        b.extend_from_slice(&(-1i32).to_be_bytes()); // partitionLeaderEpoch
        b.push(2); // magic
        b.extend_from_slice(&0u32.to_be_bytes()); // crc, patched below
        b.extend_from_slice(&0i16.to_be_bytes()); // attributes
        b.extend_from_slice(&0i32.to_be_bytes()); // lastOffsetDelta
        b.extend_from_slice(&1000i64.to_be_bytes()); // baseTimestamp
        b.extend_from_slice(&1000i64.to_be_bytes()); // maxTimestamp
        b.extend_from_slice(&(-1i64).to_be_bytes()); // producerId
        b.extend_from_slice(&(-1i16).to_be_bytes()); // producerEpoch
        b.extend_from_slice(&(-1i32).to_be_bytes()); // baseSequence
        b.extend_from_slice(&1i32.to_be_bytes()); // recordsCount
        b.push((record.len() as u8) << 1); // record length varint (zigzag)
        b.extend_from_slice(&record);
        let len = (b.len() - 12) as i32;
        b[8..12].copy_from_slice(&len.to_be_bytes());
        let crc = crc32c::crc32c(&b[21..]);
        b[17..21].copy_from_slice(&crc.to_be_bytes());
        b
    }

    #[test]
    fn parses_and_validates_hand_built_batch() {
        let b = hand_batch();
        let h = validate(&b).expect("valid");
        assert_eq!(h.total_size(), b.len());
        assert_eq!(h.records_count, 1);
        assert_eq!(h.producer_id, -1);
        assert_eq!(h.compression().unwrap(), Compression::None);
        assert!(!h.is_transactional() && !h.is_control());
    }

    #[test]
    fn patching_offset_and_epoch_keeps_crc() {
        let mut b = hand_batch();
        set_base_offset(&mut b, 42);
        set_partition_leader_epoch(&mut b, 0);
        let h = validate(&b).expect("still valid");
        assert_eq!(h.base_offset, 42);
        assert_eq!(h.partition_leader_epoch, 0);
    }

    #[test]
    fn flipped_byte_fails_crc() {
        let mut b = hand_batch();
        let last = b.len() - 1;
        b[last] ^= 0xff;
        assert!(matches!(validate(&b), Err(BatchError::CrcMismatch { .. })));
    }

    #[test]
    fn wrong_magic_is_rejected() {
        let mut b = hand_batch();
        b[16] = 1;
        assert_eq!(validate(&b), Err(BatchError::UnsupportedMagic(1)));
    }

    #[test]
    fn iterator_stops_at_torn_tail() {
        let one = hand_batch();
        let mut buf = one.clone();
        buf.extend_from_slice(&one);
        buf.extend_from_slice(&one[..30]);
        let mut it = BatchIter::new(&buf);
        assert_eq!(it.by_ref().count(), 2);
        assert_eq!(it.position(), 2 * one.len());
        assert!(it.error().is_some());
    }

    #[test]
    fn last_sequence_wraps() {
        let mut h = BatchHeader::parse(&hand_batch()).unwrap();
        h.base_sequence = i32::MAX;
        h.last_offset_delta = 2;
        assert_eq!(h.last_sequence(), 1);
    }
}
