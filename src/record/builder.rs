//! Building v2 batches: [`BatchBuilder`] for data, [`control_batch`] for
//! COMMIT/ABORT markers, and [`recompress`] for topics whose
//! `compression.type` differs from the producer's codec.
//!
//! Built batches have baseOffset 0 (the log assigns offsets),
//! partitionLeaderEpoch -1 unless set, baseTimestamp = the first record's
//! timestamp and maxTimestamp = the largest, as Kafka's
//! `MemoryRecordsBuilder` does, and a CRC-32C over bytes 21..end. Records
//! are encoded once, uncompressed, then the section is compressed as a
//! whole. No state outlives a call; any shard.

use super::batch::{self, BatchHeader, BATCH_HEADER_BYTES, LOG_OVERHEAD_BYTES, MAGIC_V2};
use super::compression::{compress, decompress, DECOMPRESSED_RECORDS_MAX_BYTES};
use super::records::from_batch_error;
use super::records::{control_key, marker_value, put_varint, put_varlong, varint_len, ControlType};
use super::{Compression, RecordsError};
use bytes::{BufMut, Bytes, BytesMut};

const ATTR_COMPRESSION_MASK: i16 = 0x07;
const ATTR_TIMESTAMP_TYPE: i16 = 0x08;
const ATTR_TRANSACTIONAL: i16 = 0x10;
const ATTR_CONTROL: i16 = 0x20;
/// KIP-534: the batch's baseTimestamp is its delete horizon.
const ATTR_DELETE_HORIZON: i16 = 0x40;
const ATTRIBUTES_AT: usize = 21;
const BATCH_LENGTH_AT: usize = 8;
const CRC_AT: usize = 17;

/// A record to put in a batch.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NewRecord {
    pub key: Option<Bytes>,
    pub value: Option<Bytes>,
    /// Header keys are strings in Kafka; bytes are accepted as is.
    pub headers: Vec<(Bytes, Option<Bytes>)>,
    pub timestamp_ms: i64,
}

/// Builds one v2 record batch.
#[derive(Debug, Clone)]
pub struct BatchBuilder {
    compression: Compression,
    base_offset: i64,
    partition_leader_epoch: i32,
    producer_id: i64,
    producer_epoch: i16,
    base_sequence: i32,
    transactional: bool,
    control: bool,
    log_append_time: bool,
    records: Vec<NewRecord>,
}

impl BatchBuilder {
    /// A non-idempotent, non-transactional batch with `compression`.
    pub fn new(compression: Compression) -> Self {
        BatchBuilder {
            compression,
            base_offset: 0,
            partition_leader_epoch: -1,
            producer_id: -1,
            producer_epoch: -1,
            base_sequence: -1,
            transactional: false,
            control: false,
            log_append_time: false,
            records: Vec::new(),
        }
    }

    /// Producer id, epoch and the first record's sequence (idempotence).
    pub fn producer(mut self, producer_id: i64, producer_epoch: i16, base_sequence: i32) -> Self {
        self.producer_id = producer_id;
        self.producer_epoch = producer_epoch;
        self.base_sequence = base_sequence;
        self
    }

    pub fn transactional(mut self, transactional: bool) -> Self {
        self.transactional = transactional;
        self
    }

    /// Marks the batch as a control batch (use [`control_batch`] for markers).
    pub fn control(mut self, control: bool) -> Self {
        self.control = control;
        self
    }

    pub fn base_offset(mut self, base_offset: i64) -> Self {
        self.base_offset = base_offset;
        self
    }

    pub fn partition_leader_epoch(mut self, epoch: i32) -> Self {
        self.partition_leader_epoch = epoch;
        self
    }

    /// Sets the LogAppendTime timestamp type bit.
    pub fn log_append_time(mut self, log_append_time: bool) -> Self {
        self.log_append_time = log_append_time;
        self
    }

    pub fn push(&mut self, record: NewRecord) -> &mut Self {
        self.records.push(record);
        self
    }

    /// A record with key, value, headers and timestamp.
    pub fn record(
        mut self,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: &[(&[u8], Option<&[u8]>)],
        timestamp_ms: i64,
    ) -> Self {
        self.records.push(NewRecord {
            key: key.map(Bytes::copy_from_slice),
            value: value.map(Bytes::copy_from_slice),
            headers: headers
                .iter()
                .map(|(k, v)| (Bytes::copy_from_slice(k), v.map(Bytes::copy_from_slice)))
                .collect(),
            timestamp_ms,
        });
        self
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    fn attributes(&self) -> i16 {
        let mut a = self.compression as i16;
        if self.log_append_time {
            a |= ATTR_TIMESTAMP_TYPE;
        }
        if self.transactional {
            a |= ATTR_TRANSACTIONAL;
        }
        if self.control {
            a |= ATTR_CONTROL;
        }
        a
    }

    /// Encodes the batch. Panics on an empty builder: a batch has at least
    /// one record, and building none is a programmer error.
    pub fn build(&self) -> BytesMut {
        assert!(
            !self.records.is_empty(),
            "a batch needs at least one record"
        );
        let base_ts = self.records[0].timestamp_ms;
        let max_ts = self
            .records
            .iter()
            .map(|r| r.timestamp_ms)
            .max()
            .unwrap_or(base_ts);
        let mut raw = Vec::new();
        for (i, r) in self.records.iter().enumerate() {
            encode_record(&mut raw, r, i as i32, r.timestamp_ms.wrapping_sub(base_ts));
        }
        let mut section = Vec::with_capacity(raw.len() / 2 + 64);
        compress(self.compression, &raw, &mut section);
        let mut out = BytesMut::with_capacity(BATCH_HEADER_BYTES + section.len());
        out.put_i64(self.base_offset);
        out.put_i32((BATCH_HEADER_BYTES - LOG_OVERHEAD_BYTES + section.len()) as i32);
        out.put_i32(self.partition_leader_epoch);
        out.put_i8(MAGIC_V2);
        out.put_u32(0); // CRC, filled below
        out.put_i16(self.attributes());
        out.put_i32(self.records.len() as i32 - 1);
        out.put_i64(base_ts);
        out.put_i64(max_ts);
        out.put_i64(self.producer_id);
        out.put_i16(self.producer_epoch);
        out.put_i32(self.base_sequence);
        out.put_i32(self.records.len() as i32);
        debug_assert_eq!(out.len(), BATCH_HEADER_BYTES);
        out.put_slice(&section);
        write_crc(&mut out);
        out
    }
}

fn write_crc(batch: &mut [u8]) {
    let crc = batch::compute_crc(batch);
    batch[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_be_bytes());
}

fn put_nullable(out: &mut Vec<u8>, b: Option<&[u8]>) {
    match b {
        None => put_varint(out, -1),
        Some(b) => {
            put_varint(out, b.len() as i32);
            out.extend_from_slice(b);
        }
    }
}

fn nullable_len(b: Option<&[u8]>) -> usize {
    match b {
        None => 1,
        Some(b) => varint_len(b.len() as i32) + b.len(),
    }
}

/// Appends one record (Kafka's `DefaultRecord.writeTo`).
fn encode_record(out: &mut Vec<u8>, r: &NewRecord, offset_delta: i32, timestamp_delta: i64) {
    let mut ts = Vec::with_capacity(10);
    put_varlong(&mut ts, timestamp_delta);
    let mut body_len = 1 + ts.len() + varint_len(offset_delta);
    body_len += nullable_len(r.key.as_deref()) + nullable_len(r.value.as_deref());
    body_len += varint_len(r.headers.len() as i32);
    for (k, v) in &r.headers {
        body_len += nullable_len(Some(k)) + nullable_len(v.as_deref());
    }
    put_varint(out, body_len as i32);
    let start = out.len();
    out.push(0); // record attributes: unused in v2
    out.extend_from_slice(&ts);
    put_varint(out, offset_delta);
    put_nullable(out, r.key.as_deref());
    put_nullable(out, r.value.as_deref());
    put_varint(out, r.headers.len() as i32);
    for (k, v) in &r.headers {
        put_nullable(out, Some(k));
        put_nullable(out, v.as_deref());
    }
    debug_assert_eq!(out.len() - start, body_len);
}

/// An end-transaction marker: a transactional control batch holding one
/// record whose key is (version 0, `kind`) and value (version 0,
/// `coordinator_epoch`), baseSequence -1, uncompressed, as Kafka's
/// `MemoryRecords.withEndTransactionMarker` writes it.
pub fn control_batch(
    kind: ControlType,
    producer_id: i64,
    producer_epoch: i16,
    coordinator_epoch: i32,
    timestamp_ms: i64,
) -> BytesMut {
    BatchBuilder::new(Compression::None)
        .producer(producer_id, producer_epoch, -1)
        .transactional(true)
        .control(true)
        .record(
            Some(&control_key(kind)),
            Some(&marker_value(coordinator_epoch)),
            &[],
            timestamp_ms,
        )
        .build()
}

/// Re-encodes a complete batch with `target`'s codec, keeping every
/// header field (offsets, timestamps, producer fields, attributes other
/// than the codec) and the records' bytes; batchLength and the CRC are
/// recomputed. The input CRC is not checked (the append path already
/// did). Control batches are never recompressed: they come back unchanged.
pub fn recompress(batch: &[u8], target: Compression) -> Result<BytesMut, RecordsError> {
    recompress_bounded(batch, target, DECOMPRESSED_RECORDS_MAX_BYTES)
}

/// [`recompress`], refusing a batch whose records decompress to more than
/// `limit_bytes` (`RecordsError::DecompressedTooLarge`).
pub fn recompress_bounded(
    batch: &[u8],
    target: Compression,
    limit_bytes: usize,
) -> Result<BytesMut, RecordsError> {
    let header: BatchHeader = BatchHeader::parse(batch).map_err(from_batch_error)?;
    let size = header.total_size();
    let Some(batch) = batch.get(..size) else {
        return Err(RecordsError::NoBatch {
            available: batch.len(),
        });
    };
    let source = header
        .compression()
        .map_err(|_| RecordsError::UnknownCompression(header.compression_id()))?;
    if header.is_control() || source == target {
        return Ok(BytesMut::from(batch));
    }
    let raw = decompress(source, &batch[BATCH_HEADER_BYTES..], limit_bytes)?;
    let mut section = Vec::with_capacity(raw.len() / 2 + 64);
    compress(target, &raw, &mut section);
    let mut out = BytesMut::with_capacity(BATCH_HEADER_BYTES + section.len());
    out.put_slice(&batch[..BATCH_HEADER_BYTES]);
    out.put_slice(&section);
    let len = (out.len() - LOG_OVERHEAD_BYTES) as i32;
    out[BATCH_LENGTH_AT..BATCH_LENGTH_AT + 4].copy_from_slice(&len.to_be_bytes());
    let attrs = (header.attributes & !ATTR_COMPRESSION_MASK) | target as i16;
    out[ATTRIBUTES_AT..ATTRIBUTES_AT + 2].copy_from_slice(&attrs.to_be_bytes());
    write_crc(&mut out);
    Ok(out)
}

/// A batch holding only `retained`, some of the records of the batch that
/// `original` heads, as Kafka's cleaner rewrites a batch
/// (`MemoryRecords.filterTo`): the same base offset, attributes, producer
/// id, epoch, base sequence and partition leader epoch; every record at its
/// original offset and timestamp; the original `lastOffsetDelta`
/// (`overrideLastOffset`), so the producer's last sequence stays what it
/// was; compressed with the original codec. With `delete_horizon_ms`, the
/// KIP-534 attribute bit is set and baseTimestamp is the horizon (record
/// timestamp deltas are taken from it). Panics when `retained` is empty
/// ([`empty_batch`] is for that) or holds an offset outside the original's
/// range: both are programmer errors.
pub fn retained_batch(
    original: &BatchHeader,
    retained: &[super::Record],
    delete_horizon_ms: Option<i64>,
) -> Result<BytesMut, RecordsError> {
    assert!(!retained.is_empty(), "a retained batch has records");
    let codec = original
        .compression()
        .map_err(|_| RecordsError::UnknownCompression(original.compression_id()))?;
    let log_append_time = original.timestamp_type() == batch::TimestampType::LogAppendTime;
    let timestamp = |r: &super::Record| original.base_timestamp.wrapping_add(r.timestamp_delta);
    let first_ts = timestamp(&retained[0]);
    let base_ts = delete_horizon_ms.unwrap_or(first_ts);
    // LogAppendTime batches carry the append time as their max timestamp
    // (Kafka's builder is given it); CreateTime ones the retained maximum.
    let max_ts = if log_append_time {
        original.max_timestamp
    } else {
        retained.iter().map(timestamp).max().unwrap_or(first_ts)
    };
    let mut raw = Vec::new();
    for r in retained {
        assert!(
            r.offset_delta >= 0 && r.offset_delta <= original.last_offset_delta,
            "retained record outside its batch"
        );
        let record = NewRecord {
            key: r.key.clone(),
            value: r.value.clone(),
            headers: r
                .headers
                .iter()
                .map(|h| (h.key.clone(), h.value.clone()))
                .collect(),
            timestamp_ms: timestamp(r),
        };
        encode_record(
            &mut raw,
            &record,
            r.offset_delta,
            timestamp(r).wrapping_sub(base_ts),
        );
    }
    let mut section = Vec::with_capacity(raw.len() / 2 + 64);
    compress(codec, &raw, &mut section);
    let mut attributes = original.attributes;
    if delete_horizon_ms.is_some() {
        attributes |= ATTR_DELETE_HORIZON;
    }
    let mut out = BytesMut::with_capacity(BATCH_HEADER_BYTES + section.len());
    out.put_i64(original.base_offset);
    out.put_i32((BATCH_HEADER_BYTES - LOG_OVERHEAD_BYTES + section.len()) as i32);
    out.put_i32(original.partition_leader_epoch);
    out.put_i8(MAGIC_V2);
    out.put_u32(0); // CRC, filled below
    out.put_i16(attributes);
    out.put_i32(original.last_offset_delta);
    out.put_i64(base_ts);
    out.put_i64(max_ts);
    out.put_i64(original.producer_id);
    out.put_i16(original.producer_epoch);
    out.put_i32(original.base_sequence);
    out.put_i32(retained.len() as i32);
    debug_assert_eq!(out.len(), BATCH_HEADER_BYTES);
    out.put_slice(&section);
    write_crc(&mut out);
    Ok(out)
}

/// The header of a batch whose records were all removed but which is kept
/// because it is its producer's last (Kafka's `writeEmptyHeader`): no
/// records, uncompressed, the original base and last offsets, producer id,
/// epoch and base sequence, baseTimestamp = maxTimestamp = the original's
/// max timestamp. An idempotent producer's sequence state survives in it.
pub fn empty_batch(original: &BatchHeader) -> BytesMut {
    let attributes = original.attributes & !ATTR_COMPRESSION_MASK & !ATTR_DELETE_HORIZON;
    let mut out = BytesMut::with_capacity(BATCH_HEADER_BYTES);
    out.put_i64(original.base_offset);
    out.put_i32((BATCH_HEADER_BYTES - LOG_OVERHEAD_BYTES) as i32);
    out.put_i32(original.partition_leader_epoch);
    out.put_i8(MAGIC_V2);
    out.put_u32(0); // CRC, filled below
    out.put_i16(attributes);
    out.put_i32(original.last_offset_delta);
    out.put_i64(original.max_timestamp);
    out.put_i64(original.max_timestamp);
    out.put_i64(original.producer_id);
    out.put_i16(original.producer_epoch);
    out.put_i32(original.base_sequence);
    out.put_i32(0);
    write_crc(&mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::records::{decode_batch, parse_control_key, parse_marker_value};
    use kafka_protocol::records::RecordBatchDecoder;

    const CODECS: [Compression; 5] = [
        Compression::None,
        Compression::Gzip,
        Compression::Snappy,
        Compression::Lz4,
        Compression::Zstd,
    ];

    fn sample(codec: Compression) -> BytesMut {
        let mut b = BatchBuilder::new(codec).producer(7, 2, 40);
        for i in 0..50 {
            let key = format!("key-{i}");
            let value = format!("value-{i}-").repeat(i + 1);
            b = b.record(
                Some(key.as_bytes()),
                if i == 3 { None } else { Some(value.as_bytes()) },
                &[(b"h1", Some(b"x")), (b"h2", None)],
                1_700_000_000_000 + (i as i64 * 7) % 11,
            );
        }
        b.build()
    }

    #[test]
    fn built_batches_validate_and_decode_with_kafka_protocol() {
        for codec in CODECS {
            let b = sample(codec);
            let h = batch::validate(&b).unwrap();
            assert_eq!(h.compression().unwrap(), codec);
            assert_eq!((h.records_count, h.last_offset_delta), (50, 49));
            assert_eq!(
                (h.producer_id, h.producer_epoch, h.base_sequence),
                (7, 2, 40)
            );
            assert_eq!(h.base_timestamp, 1_700_000_000_000);
            assert_eq!(h.max_timestamp, 1_700_000_000_010);
            // An independent decoder agrees on every field.
            let mut bytes = b.clone().freeze();
            let set = RecordBatchDecoder::decode(&mut bytes).unwrap();
            assert_eq!(set.records.len(), 50);
            let r = &set.records[5];
            assert_eq!(r.key.as_deref(), Some(&b"key-5"[..]));
            assert_eq!(r.value.as_deref(), Some("value-5-".repeat(6).as_bytes()));
            assert_eq!(r.offset, 5);
            assert_eq!(r.sequence, 45);
            assert_eq!(r.timestamp, 1_700_000_000_000 + 35 % 11);
            assert_eq!(r.headers.len(), 2);
            assert!(set.records[3].value.is_none());
            // And so does ours.
            let (_, recs) = decode_batch(&b).unwrap();
            assert_eq!(recs.len(), 50);
            assert_eq!(recs[5].key.as_deref(), Some(&b"key-5"[..]));
            assert_eq!(recs[5].headers[1].value, None);
            assert_eq!(recs[5].timestamp(&h), r.timestamp);
        }
    }

    #[test]
    fn control_batch_is_a_commit_marker() {
        let b = control_batch(ControlType::Commit, 0, 3, 11, 1_000);
        let h = batch::validate(&b).unwrap();
        assert!(h.is_control() && h.is_transactional());
        assert_eq!(
            (h.producer_id, h.producer_epoch, h.base_sequence),
            (0, 3, -1)
        );
        let (_, recs) = decode_batch(&b).unwrap();
        assert_eq!(recs.len(), 1);
        assert_eq!(
            parse_control_key(recs[0].key.as_deref().unwrap()).unwrap(),
            (0, ControlType::Commit)
        );
        assert_eq!(
            parse_marker_value(recs[0].value.as_deref().unwrap()).unwrap(),
            (0, 11)
        );
    }

    #[test]
    fn recompress_changes_only_codec_size_and_crc() {
        for from in CODECS {
            for to in CODECS {
                let mut src = sample(from);
                batch::set_base_offset(&mut src, 1000);
                batch::set_partition_leader_epoch(&mut src, 4);
                let out = recompress(&src, to).unwrap();
                let a = batch::validate(&src).unwrap();
                let b = batch::validate(&out).unwrap();
                assert_eq!(b.compression().unwrap(), to);
                assert_eq!(b.total_size(), out.len());
                assert_eq!(
                    (
                        b.base_offset,
                        b.partition_leader_epoch,
                        b.last_offset_delta,
                        b.base_timestamp,
                        b.max_timestamp
                    ),
                    (
                        a.base_offset,
                        a.partition_leader_epoch,
                        a.last_offset_delta,
                        a.base_timestamp,
                        a.max_timestamp
                    )
                );
                assert_eq!(
                    (
                        b.producer_id,
                        b.producer_epoch,
                        b.base_sequence,
                        b.records_count
                    ),
                    (
                        a.producer_id,
                        a.producer_epoch,
                        a.base_sequence,
                        a.records_count
                    )
                );
                assert_eq!(b.attributes & !0x07, a.attributes & !0x07);
                if from != to {
                    assert_ne!(a.crc, b.crc);
                }
                assert_eq!(decode_batch(&src).unwrap().1, decode_batch(&out).unwrap().1);
            }
        }
    }

    #[test]
    fn gzip_to_lz4_as_in_kafka_behaviour() {
        let gz = sample(Compression::Gzip);
        let lz = recompress(&gz, Compression::Lz4).unwrap();
        let h = batch::validate(&lz).unwrap();
        assert_eq!(h.compression().unwrap(), Compression::Lz4);
        assert_ne!(lz.len(), gz.len());
    }

    #[test]
    fn control_batches_are_never_recompressed() {
        let b = control_batch(ControlType::Abort, 1, 1, 0, 5);
        assert_eq!(recompress(&b, Compression::Zstd).unwrap(), b);
    }
}
