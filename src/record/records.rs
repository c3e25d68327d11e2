//! The records inside a v2 batch: varints, record decoding, control records.
//!
//! A record is: length (zigzag varint), attributes i8, timestampDelta
//! (zigzag varlong), offsetDelta (zigzag varint), key length + key (-1 =
//! null), value length + value, header count, then per header a key
//! (non-null) and a value (-1 = null). Decoding follows Kafka's
//! `DefaultRecord.readFrom`: each record must consume exactly its declared
//! length, the batch must hold exactly `recordsCount` records and nothing
//! after them (`"Incorrect declared batch size"`).
//!
//! Used by dump-log (`--deep-iteration --print-data-log`), recompression
//! and transaction markers, and by the append path only for compacted
//! topics ([`keyless_records`]); otherwise the append path never opens a
//! batch. Keys, values and header values are `Bytes` slices of the
//! (decompressed) records buffer, not copies. No state; any shard.

use super::batch::{BatchHeader, BATCH_HEADER_BYTES};
use super::compression::{decompress, DECOMPRESSED_RECORDS_MAX_BYTES};
use super::{BatchError, Compression, RecordsError};
use bytes::Bytes;

/// Longest zigzag varint (i32) in bytes.
const VARINT_MAX_BYTES: usize = 5;
/// Longest zigzag varlong (i64) in bytes.
const VARLONG_MAX_BYTES: usize = 10;
/// Bytes of a control record key: version i16 + type i16.
const CONTROL_KEY_BYTES: usize = 4;
/// Bytes of an end-transaction marker value: version i16 + coordinatorEpoch i32.
const CONTROL_VALUE_BYTES: usize = 6;
/// The control key / marker value version Kafka writes.
pub const CONTROL_RECORD_VERSION: i16 = 0;

/// Appends a zigzag varint (Kafka's `ByteUtils.writeVarint`).
pub fn put_varint(out: &mut Vec<u8>, v: i32) {
    put_uvarint64(out, ((v << 1) ^ (v >> 31)) as u32 as u64);
}

/// Appends a zigzag varlong (Kafka's `ByteUtils.writeVarlong`).
pub fn put_varlong(out: &mut Vec<u8>, v: i64) {
    put_uvarint64(out, ((v << 1) ^ (v >> 63)) as u64);
}

fn put_uvarint64(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Bytes the zigzag varint of `v` takes.
pub fn varint_len(v: i32) -> usize {
    let mut u = ((v << 1) ^ (v >> 31)) as u32;
    let mut n = 1;
    while u >= 0x80 {
        u >>= 7;
        n += 1;
    }
    n
}

/// A bounds-checked cursor over a records buffer.
struct Cursor<'a> {
    buf: &'a Bytes,
    pos: usize,
}

impl Cursor<'_> {
    fn uvarint(&mut self, max_bytes: usize) -> Result<u64, RecordsError> {
        let mut v: u64 = 0;
        for i in 0..max_bytes {
            let Some(&b) = self.buf.get(self.pos) else {
                return Err(RecordsError::Malformed("truncated varint"));
            };
            self.pos += 1;
            v |= ((b & 0x7f) as u64) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(RecordsError::Malformed("varint too long"))
    }

    fn varint(&mut self) -> Result<i32, RecordsError> {
        let u = self.uvarint(VARINT_MAX_BYTES)?;
        if u > u32::MAX as u64 {
            return Err(RecordsError::Malformed("varint overflows i32"));
        }
        let u = u as u32;
        Ok(((u >> 1) as i32) ^ -((u & 1) as i32))
    }

    fn varlong(&mut self) -> Result<i64, RecordsError> {
        let u = self.uvarint(VARLONG_MAX_BYTES)?;
        Ok(((u >> 1) as i64) ^ -((u & 1) as i64))
    }

    fn i8(&mut self) -> Result<i8, RecordsError> {
        let Some(&b) = self.buf.get(self.pos) else {
            return Err(RecordsError::Malformed("truncated attributes"));
        };
        self.pos += 1;
        Ok(b as i8)
    }

    /// A varint-length-prefixed byte field; -1 = null.
    fn bytes(&mut self, what: &'static str) -> Result<Option<Bytes>, RecordsError> {
        let len = self.varint()?;
        if len == -1 {
            return Ok(None);
        }
        let Ok(len) = usize::try_from(len) else {
            return Err(RecordsError::Malformed(what));
        };
        if self.buf.len() - self.pos < len {
            return Err(RecordsError::Malformed(what));
        }
        let b = self.buf.slice(self.pos..self.pos + len);
        self.pos += len;
        Ok(Some(b))
    }
}

/// One record header; Kafka header keys are strings, kept as bytes here
/// (dump-log prints them lossily) so that decoding never fails on UTF-8.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordHeader {
    pub key: Bytes,
    pub value: Option<Bytes>,
}

/// One decoded record, with deltas relative to its batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub attributes: i8,
    pub timestamp_delta: i64,
    pub offset_delta: i32,
    pub key: Option<Bytes>,
    pub value: Option<Bytes>,
    pub headers: Vec<RecordHeader>,
}

impl Record {
    /// The record's absolute offset within `batch`.
    pub fn offset(&self, batch: &BatchHeader) -> i64 {
        batch.base_offset + self.offset_delta as i64
    }

    /// The record's timestamp (CreateTime; LogAppendTime batches use the
    /// batch's maxTimestamp instead).
    pub fn timestamp(&self, batch: &BatchHeader) -> i64 {
        batch.base_timestamp.wrapping_add(self.timestamp_delta)
    }
}

/// Decodes exactly `count` records from an uncompressed records section.
pub fn decode_records(records: &Bytes, count: i32) -> Result<Vec<Record>, RecordsError> {
    let Ok(count) = usize::try_from(count) else {
        return Err(RecordsError::InvalidCount(count));
    };
    let mut c = Cursor {
        buf: records,
        pos: 0,
    };
    // Each record takes at least 7 bytes; bound the allocation by that.
    let mut out = Vec::with_capacity(count.min(records.len() / 7));
    for _ in 0..count {
        let size = c.varint()?;
        let Ok(size) = usize::try_from(size) else {
            return Err(RecordsError::Malformed("negative record size"));
        };
        let start = c.pos;
        if records.len() - start < size {
            return Err(RecordsError::Malformed("record size beyond the batch"));
        }
        let attributes = c.i8()?;
        let timestamp_delta = c.varlong()?;
        let offset_delta = c.varint()?;
        let key = c.bytes("key length")?;
        let value = c.bytes("value length")?;
        let header_count = c.varint()?;
        let Ok(header_count) = usize::try_from(header_count) else {
            return Err(RecordsError::Malformed("negative header count"));
        };
        let mut headers = Vec::with_capacity(header_count.min(size / 2));
        for _ in 0..header_count {
            let Some(key) = c.bytes("header key length")? else {
                return Err(RecordsError::Malformed("null header key"));
            };
            let value = c.bytes("header value length")?;
            headers.push(RecordHeader { key, value });
        }
        if c.pos - start != size {
            return Err(RecordsError::Malformed(
                "record size does not match its fields",
            ));
        }
        out.push(Record {
            attributes,
            timestamp_delta,
            offset_delta,
            key,
            value,
            headers,
        });
    }
    if c.pos != records.len() {
        return Err(RecordsError::Malformed(
            "bytes left after the declared records",
        ));
    }
    Ok(out)
}

/// The records section of a complete batch, decompressed (bounded by
/// [`DECOMPRESSED_RECORDS_MAX_BYTES`]).
pub fn records_section(batch: &[u8]) -> Result<(BatchHeader, Bytes), RecordsError> {
    let header = BatchHeader::parse(batch).map_err(from_batch_error)?;
    let Some(body) = batch.get(BATCH_HEADER_BYTES..header.total_size()) else {
        return Err(RecordsError::NoBatch {
            available: batch.len(),
        });
    };
    let codec = header
        .compression()
        .map_err(|_| RecordsError::UnknownCompression(header.compression_id()))?;
    let raw = match codec {
        Compression::None => Bytes::copy_from_slice(body),
        _ => Bytes::from(decompress(codec, body, DECOMPRESSED_RECORDS_MAX_BYTES)?),
    };
    Ok((header, raw))
}

/// Decodes every record of a complete batch (any codec).
pub fn decode_batch(batch: &[u8]) -> Result<(BatchHeader, Vec<Record>), RecordsError> {
    let (header, raw) = records_section(batch)?;
    let records = decode_records(&raw, header.records_count)?;
    Ok((header, records))
}

/// The indexes, within the batch, of its records that have no key (Kafka's
/// `LogValidator.validateKey` for compacted topics), decompressing at most
/// `limit_bytes`. Control batches are the broker's own and are not checked.
pub fn keyless_records(batch: &[u8], limit_bytes: usize) -> Result<Vec<i32>, RecordsError> {
    let header = BatchHeader::parse(batch).map_err(from_batch_error)?;
    if header.is_control() {
        return Ok(Vec::new());
    }
    let Some(body) = batch.get(BATCH_HEADER_BYTES..header.total_size()) else {
        return Err(RecordsError::NoBatch {
            available: batch.len(),
        });
    };
    let codec = header
        .compression()
        .map_err(|_| RecordsError::UnknownCompression(header.compression_id()))?;
    let raw = match codec {
        Compression::None => Bytes::copy_from_slice(body),
        _ => Bytes::from(decompress(codec, body, limit_bytes)?),
    };
    let records = decode_records(&raw, header.records_count)?;
    Ok(records
        .iter()
        .enumerate()
        .filter(|(_, r)| r.key.is_none())
        .map(|(i, _)| i as i32)
        .collect())
}

pub(crate) fn from_batch_error(e: BatchError) -> RecordsError {
    match e {
        BatchError::Truncated { available, .. } => RecordsError::NoBatch { available },
        BatchError::InvalidLength(l) => RecordsError::CorruptSize(l),
        BatchError::UnsupportedMagic(m) if (0..2).contains(&m) => RecordsError::WrongMagic(m),
        BatchError::UnsupportedMagic(m) => RecordsError::InvalidMagic(m),
        BatchError::UnknownCompression(c) => RecordsError::UnknownCompression(c),
        BatchError::CrcMismatch { stored, computed } => {
            RecordsError::CrcMismatch { stored, computed }
        }
        BatchError::InvalidRecordCount(c) => RecordsError::InvalidCount(c),
    }
}

/// The type in a control record's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlType {
    Abort,
    Commit,
    /// A type this broker does not know (Kafka defines more for KRaft).
    Unknown(i16),
}

impl ControlType {
    pub fn id(self) -> i16 {
        match self {
            ControlType::Abort => 0,
            ControlType::Commit => 1,
            ControlType::Unknown(t) => t,
        }
    }

    pub fn from_id(id: i16) -> ControlType {
        match id {
            0 => ControlType::Abort,
            1 => ControlType::Commit,
            t => ControlType::Unknown(t),
        }
    }
}

/// A parsed control record key: `(version, type)`.
pub fn parse_control_key(key: &[u8]) -> Result<(i16, ControlType), RecordsError> {
    if key.len() < CONTROL_KEY_BYTES {
        return Err(RecordsError::Malformed("control key shorter than 4 bytes"));
    }
    let version = i16::from_be_bytes([key[0], key[1]]);
    let kind = i16::from_be_bytes([key[2], key[3]]);
    Ok((version, ControlType::from_id(kind)))
}

/// A parsed end-transaction marker value: `(version, coordinator epoch)`.
pub fn parse_marker_value(value: &[u8]) -> Result<(i16, i32), RecordsError> {
    if value.len() < CONTROL_VALUE_BYTES {
        return Err(RecordsError::Malformed("marker value shorter than 6 bytes"));
    }
    let version = i16::from_be_bytes([value[0], value[1]]);
    let epoch = i32::from_be_bytes([value[2], value[3], value[4], value[5]]);
    Ok((version, epoch))
}

/// The control key bytes for `kind`.
pub fn control_key(kind: ControlType) -> [u8; CONTROL_KEY_BYTES] {
    let mut k = [0u8; CONTROL_KEY_BYTES];
    k[..2].copy_from_slice(&CONTROL_RECORD_VERSION.to_be_bytes());
    k[2..].copy_from_slice(&kind.id().to_be_bytes());
    k
}

/// The end-transaction marker value bytes.
pub fn marker_value(coordinator_epoch: i32) -> [u8; CONTROL_VALUE_BYTES] {
    let mut v = [0u8; CONTROL_VALUE_BYTES];
    v[..2].copy_from_slice(&CONTROL_RECORD_VERSION.to_be_bytes());
    v[2..].copy_from_slice(&coordinator_epoch.to_be_bytes());
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zigzag_matches_kafka() {
        // Kafka's ByteUtils: 0 -> 00, -1 -> 01, 1 -> 02, 63 -> 7e, -64 -> 7f, 64 -> 80 01.
        for (v, enc) in [
            (0, vec![0x00]),
            (-1, vec![0x01]),
            (1, vec![0x02]),
            (63, vec![0x7e]),
            (-64, vec![0x7f]),
            (64, vec![0x80, 0x01]),
            (i32::MAX, vec![0xfe, 0xff, 0xff, 0xff, 0x0f]),
            (i32::MIN, vec![0xff, 0xff, 0xff, 0xff, 0x0f]),
        ] {
            let mut out = Vec::new();
            put_varint(&mut out, v);
            assert_eq!(out, enc, "{v}");
            assert_eq!(varint_len(v), enc.len());
            let b = Bytes::from(out);
            assert_eq!(Cursor { buf: &b, pos: 0 }.varint().unwrap(), v);
        }
        for v in [0i64, -1, i64::MAX, i64::MIN, 1 << 40] {
            let mut out = Vec::new();
            put_varlong(&mut out, v);
            let b = Bytes::from(out);
            assert_eq!(Cursor { buf: &b, pos: 0 }.varlong().unwrap(), v);
        }
    }

    #[test]
    fn decodes_a_hand_written_record() {
        // size 11: attrs 0, tsDelta 5, offDelta 0, key "k", value null,
        // one header "h" -> "v".
        let rec = vec![
            0x16, 0, 0x0a, 0, 0x02, b'k', 0x01, 0x02, 0x02, b'h', 0x02, b'v',
        ];
        let b = Bytes::from(rec);
        let r = decode_records(&b, 1).unwrap();
        assert_eq!(r[0].timestamp_delta, 5);
        assert_eq!(r[0].key.as_deref(), Some(&b"k"[..]));
        assert_eq!(r[0].value, None);
        assert_eq!(r[0].headers[0].key, Bytes::from_static(b"h"));
        assert_eq!(r[0].headers[0].value.as_deref(), Some(&b"v"[..]));
        // A wrong count or trailing bytes are errors.
        assert!(decode_records(&b, 2).is_err());
        let mut longer = b.to_vec();
        longer.push(0);
        assert!(decode_records(&Bytes::from(longer), 1).is_err());
    }

    #[test]
    fn control_records_round_trip() {
        assert_eq!(
            parse_control_key(&control_key(ControlType::Commit)).unwrap(),
            (0, ControlType::Commit)
        );
        assert_eq!(
            parse_control_key(&control_key(ControlType::Abort)).unwrap(),
            (0, ControlType::Abort)
        );
        assert_eq!(parse_marker_value(&marker_value(7)).unwrap(), (0, 7));
        assert!(parse_control_key(&[0, 0, 0]).is_err());
    }

    proptest::proptest! {
        #[test]
        fn random_records_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..256), count in -2i32..20) {
            let _ = decode_records(&Bytes::from(bytes.clone()), count);
            let _ = decode_batch(&bytes);
        }
    }
}
