//! Zero-copy decoding of ProduceRequest v3–v12, and the per-partition
//! record checks the produce handler runs before appending.
//!
//! The frame body arrives as one `BytesMut`. The decoder first walks it
//! with a bounds-checked [`Reader`], noting where each partition's records
//! lie, and only then splits the buffer at those ranges: every
//! `ProducePartition::records` is a `BytesMut` cut out of the frame itself
//! (same allocation, no copy), uniquely owned and mutable, so the log can
//! patch `baseOffset` and `partitionLeaderEpoch` in place.
//!
//! Layout: `transactional_id` (nullable string), `acks` i16, `timeout_ms`
//! i32, then topics (name, partitions (index i32, records nullable bytes)).
//! From v9 the request is flexible: compact strings, arrays and bytes and a
//! tagged-field section after every struct. v13 (KIP-516) names each topic
//! by its 16-byte id instead of its name; the decoder only reads the id
//! ([`ProduceTopic::topic_id`]), and the handler resolves it against the
//! metadata image once per topic. Any malformed input is an `Err`, never a
//! panic, and bytes left over after the body are an error too.

use super::wire::Reader;
use super::ProtocolError;
use crate::record::batch::{self, BatchHeader, BATCH_HEADER_BYTES, LOG_OVERHEAD_BYTES, MAGIC_V2};
use crate::record::{Compression, RecordsError};
use bytes::{Buf, BytesMut};
use kafka_protocol::messages::ApiKey;
use std::ops::Range;

/// Oldest ProduceRequest version decoded (Kafka 4 removed v0–v2).
pub const PRODUCE_MIN_VERSION: i16 = 3;
/// Newest ProduceRequest version decoded.
pub const PRODUCE_MAX_VERSION: i16 = 13;
/// First version naming topics by id (KIP-516), not by name.
pub const PRODUCE_FIRST_TOPIC_ID_VERSION: i16 = 13;
/// First flexible (compact, tagged-field) version.
const PRODUCE_FIRST_FLEXIBLE_VERSION: i16 = 9;
/// First version allowed to carry zstd batches (KIP-110).
const PRODUCE_FIRST_ZSTD_VERSION: i16 = 7;

/// Kafka's `LegacyRecord.RECORD_OVERHEAD_V0`: the smallest size field any
/// message set entry may declare before the batch is called corrupt.
const RECORD_OVERHEAD_V0_BYTES: i32 = 14;
/// Bytes up to and including the magic byte.
const HEADER_BYTES_UP_TO_MAGIC: usize = 17;
/// Position of the magic byte in every message format.
const MAGIC_AT: usize = 16;

/// A decoded produce request; records are zero-copy slices of the frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProduceRequest {
    pub transactional_id: Option<String>,
    pub acks: i16,
    pub timeout_ms: i32,
    pub topics: Vec<ProduceTopic>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProduceTopic {
    /// The topic's name: from the wire before v13; from v13 empty as
    /// decoded, and the name `topic_id` has in the metadata image once the
    /// handler resolved it (still empty for an id no topic has).
    pub name: String,
    /// The topic's id on v13+; all zeros before.
    pub topic_id: [u8; 16],
    pub partitions: Vec<ProducePartition>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducePartition {
    pub index: i32,
    /// The partition's records exactly as sent; `None` when the client sent
    /// null (the handler answers INVALID_RECORD, see [`single_batch`]).
    pub records: Option<BytesMut>,
}

/// Decodes a ProduceRequest body (after the request header) of `version`.
pub fn decode_produce_request(
    mut body: BytesMut,
    version: i16,
) -> Result<ProduceRequest, ProtocolError> {
    if !(PRODUCE_MIN_VERSION..=PRODUCE_MAX_VERSION).contains(&version) {
        return Err(ProtocolError::UnsupportedVersion {
            api_key: ApiKey::Produce as i16,
            version,
        });
    }
    let flexible = version >= PRODUCE_FIRST_FLEXIBLE_VERSION;
    let by_id = version >= PRODUCE_FIRST_TOPIC_ID_VERSION;
    // Minimum encoded sizes, used to bound array counts by the bytes left.
    let (topic_min_bytes, partition_min_bytes) = match (flexible, by_id) {
        (_, true) => (16 + 2, 6),
        (true, false) => (3, 6),
        (false, false) => (6, 8),
    };

    // Pass 1: parse everything, remembering record byte ranges.
    let mut ranges: Vec<Range<usize>> = Vec::new();
    // (topic index, partition index, records slot in `ranges`)
    let mut topics: Vec<ProduceTopic> = Vec::new();
    let mut slots: Vec<Option<usize>> = Vec::new();
    let (transactional_id, acks, timeout_ms) = {
        let mut r = Reader::new(&body);
        let transactional_id = r
            .nullable_string(flexible, "transactional_id")?
            .map(str::to_owned);
        let acks = r.i16("acks")?;
        let timeout_ms = r.i32("timeout_ms")?;
        let topic_count = r
            .array_len(flexible, topic_min_bytes, "topic_data")?
            .ok_or(ProtocolError::UnexpectedNull {
                field: "topic_data",
            })?;
        topics.reserve(topic_count);
        for _ in 0..topic_count {
            let (name, topic_id) = if by_id {
                let mut id = [0u8; 16];
                id.copy_from_slice(r.take(16, "topic id")?);
                (String::new(), id)
            } else {
                (r.string(flexible, "topic name")?.to_owned(), [0u8; 16])
            };
            let partition_count = r
                .array_len(flexible, partition_min_bytes, "partition_data")?
                .ok_or(ProtocolError::UnexpectedNull {
                    field: "partition_data",
                })?;
            let mut partitions = Vec::with_capacity(partition_count);
            for _ in 0..partition_count {
                let index = r.i32("partition index")?;
                let range = r.nullable_bytes_range(flexible, "records")?;
                slots.push(range.map(|range| {
                    ranges.push(range);
                    ranges.len() - 1
                }));
                partitions.push(ProducePartition {
                    index,
                    records: None,
                });
                if flexible {
                    r.skip_tagged_fields("partition tagged fields")?;
                }
            }
            if flexible {
                r.skip_tagged_fields("topic tagged fields")?;
            }
            topics.push(ProduceTopic {
                name,
                topic_id,
                partitions,
            });
        }
        if flexible {
            r.skip_tagged_fields("request tagged fields")?;
        }
        if r.remaining() != 0 {
            return Err(ProtocolError::TrailingBytes(r.remaining()));
        }
        (transactional_id, acks, timeout_ms)
    };

    // Pass 2: cut the records out of the frame, in order, without copying.
    let mut cut: Vec<Option<BytesMut>> = Vec::with_capacity(ranges.len());
    let mut consumed = 0usize;
    for range in &ranges {
        // Ranges come from a sequential parse, so they are ordered and
        // disjoint; this is an invariant of pass 1, not of the input.
        debug_assert!(range.start >= consumed);
        body.advance(range.start - consumed);
        cut.push(Some(body.split_to(range.len())));
        consumed = range.end;
    }
    let mut slot_iter = slots.into_iter();
    for topic in &mut topics {
        for partition in &mut topic.partitions {
            if let Some(Some(i)) = slot_iter.next() {
                partition.records = cut[i].take();
            }
        }
    }
    Ok(ProduceRequest {
        transactional_id,
        acks,
        timeout_ms,
        topics,
    })
}

/// Checks that `records` hold exactly one complete v2 batch, as Kafka's
/// `ProduceRequest.validateRecords` does (KAFKA_BEHAVIOUR.md §2 step 2),
/// and returns its header. Error codes: see [`RecordsError`]'s table.
///
/// Like Kafka's batch iterator, a second *partial* batch or fewer than 12
/// trailing bytes do not count as a second batch: Kafka accepts the first
/// batch and later trims the trailing bytes (`UnifiedLog.trimInvalidBytes`).
/// So does this: on `Ok(h)`, bytes past `h.total_size()` are to be dropped.
/// The CRC is not checked here (it is step 5: [`validate_for_append`]).
pub fn single_batch(records: &[u8]) -> Result<BatchHeader, RecordsError> {
    let first = next_batch_size(records)?.ok_or(RecordsError::NoBatch {
        available: records.len(),
    })?;
    let magic = records[MAGIC_AT] as i8;
    if magic != MAGIC_V2 {
        return Err(RecordsError::WrongMagic(magic));
    }
    if first < BATCH_HEADER_BYTES {
        // A v2 batch shorter than its own header: Kafka's `isValid` fails
        // on the size before the CRC, a CorruptRecordException.
        return Err(RecordsError::CorruptSize(
            (first - LOG_OVERHEAD_BYTES) as i32,
        ));
    }
    if next_batch_size(&records[first..])?.is_some() {
        return Err(RecordsError::MoreThanOneBatch);
    }
    BatchHeader::parse(records).map_err(|e| match e {
        batch::BatchError::InvalidLength(l) => RecordsError::CorruptSize(l),
        batch::BatchError::UnsupportedMagic(m) => RecordsError::WrongMagic(m),
        _ => RecordsError::NoBatch {
            available: records.len(),
        },
    })
}

/// [`single_batch`] plus Kafka's version rule: zstd batches need Produce v7+.
pub fn single_batch_for_version(records: &[u8], version: i16) -> Result<BatchHeader, RecordsError> {
    let header = single_batch(records)?;
    if version < PRODUCE_FIRST_ZSTD_VERSION && header.compression_id() == Compression::Zstd as i16 {
        return Err(RecordsError::ZstdBeforeV7 { version });
    }
    Ok(header)
}

/// Kafka's `ByteBufferLogInputStream.nextBatchSize` plus its completeness
/// check: `Ok(None)` when no complete batch starts at `buf`, the batch's
/// total size otherwise; corrupt sizes and magics are errors.
fn next_batch_size(buf: &[u8]) -> Result<Option<usize>, RecordsError> {
    if buf.len() < LOG_OVERHEAD_BYTES {
        return Ok(None);
    }
    let size = i32::from_be_bytes([buf[8], buf[9], buf[10], buf[11]]);
    if size < RECORD_OVERHEAD_V0_BYTES {
        return Err(RecordsError::CorruptSize(size));
    }
    if buf.len() < HEADER_BYTES_UP_TO_MAGIC {
        return Ok(None);
    }
    let magic = buf[MAGIC_AT] as i8;
    if !(0..=MAGIC_V2).contains(&magic) {
        return Err(RecordsError::InvalidMagic(magic));
    }
    let total = size as usize + LOG_OVERHEAD_BYTES;
    if buf.len() < total {
        return Ok(None);
    }
    Ok(Some(total))
}

/// Step 5 of KAFKA_BEHAVIOUR.md §2 for a client batch already accepted by
/// [`single_batch`], in Kafka's order (`UnifiedLog.analyzeAndValidateRecords`
/// then `LogValidator.validateBatch`): baseOffset 0, size within
/// `max_message_bytes`, CRC, codec id, then offset range, count, no control batch,
/// and a sequence for idempotent batches. `batch` must be exactly the batch
/// (`header.total_size()` bytes, trailing bytes already trimmed).
pub fn validate_for_append(
    batch: &[u8],
    header: &BatchHeader,
    max_message_bytes: usize,
) -> Result<(), RecordsError> {
    if header.base_offset != 0 {
        return Err(RecordsError::BaseOffsetNotZero(header.base_offset));
    }
    let size = header.total_size();
    if size > max_message_bytes {
        return Err(RecordsError::TooLarge {
            size,
            max_bytes: max_message_bytes,
        });
    }
    let Some(bytes) = batch.get(..size) else {
        return Err(RecordsError::NoBatch {
            available: batch.len(),
        });
    };
    let computed = batch::compute_crc(bytes);
    if computed != header.crc {
        return Err(RecordsError::CrcMismatch {
            stored: header.crc,
            computed,
        });
    }
    if header.compression().is_err() {
        return Err(RecordsError::UnknownCompression(header.compression_id()));
    }
    if header.last_offset_delta < 0 {
        return Err(RecordsError::InvalidOffsetRange(header.last_offset_delta));
    }
    if header.records_count <= 0 {
        return Err(RecordsError::InvalidCount(header.records_count));
    }
    if header.offset_count() != header.records_count as i64 {
        return Err(RecordsError::InconsistentCount {
            count: header.records_count,
            from_offsets: header.offset_count(),
        });
    }
    if header.is_control() {
        return Err(RecordsError::ControlFromClient);
    }
    if header.producer_id >= 0 && header.base_sequence < 0 {
        return Err(RecordsError::InvalidSequence(header.base_sequence));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::{BufMut, Bytes};
    use kafka_protocol::messages::produce_request::{
        PartitionProduceData, ProduceRequest as KpProduce, TopicProduceData,
    };
    use kafka_protocol::messages::TopicName;
    use kafka_protocol::protocol::{Encodable, StrBytes};
    use kafka_protocol::records::{
        Compression as KpCompression, Record, RecordBatchEncoder, RecordEncodeOptions,
        TimestampType as KpTs,
    };
    use uuid::Uuid;

    /// A v2 batch of `n` records built by kafka-protocol's encoder, an
    /// implementation independent of ours.
    fn kp_batch(n: i64, compression: KpCompression) -> Bytes {
        let records: Vec<Record> = (0..n)
            .map(|i| Record {
                transactional: false,
                control: false,
                delete_horizon: false,
                partition_leader_epoch: -1,
                producer_id: -1,
                producer_epoch: -1,
                timestamp_type: KpTs::Creation,
                offset: i,
                // kafka-protocol starts a new batch when offset - sequence changes.
                sequence: i as i32,
                timestamp: 1_700_000_000_000 + i,
                key: Some(Bytes::from(format!("k{i}"))),
                value: Some(Bytes::from(format!("value-{i}"))),
                headers: Default::default(),
            })
            .collect();
        let mut out = BytesMut::new();
        RecordBatchEncoder::encode(
            &mut out,
            &records,
            &RecordEncodeOptions {
                version: 2,
                compression,
            },
        )
        .unwrap();
        out.freeze()
    }

    fn kp_request(version: i16) -> KpProduce {
        let topic = |name: &str, parts: Vec<(i32, Option<Bytes>)>| {
            let t = if version >= PRODUCE_FIRST_TOPIC_ID_VERSION {
                TopicProduceData::default().with_topic_id(kp_id(name))
            } else {
                TopicProduceData::default()
                    .with_name(TopicName(StrBytes::from_string(name.to_owned())))
            };
            t.with_partition_data(
                parts
                    .into_iter()
                    .map(|(i, r)| {
                        PartitionProduceData::default()
                            .with_index(i)
                            .with_records(r)
                    })
                    .collect(),
            )
        };
        KpProduce::default()
            .with_transactional_id(if version >= 3 {
                Some(StrBytes::from_static_str("tx-1").into())
            } else {
                None
            })
            .with_acks(-1)
            .with_timeout_ms(30_000)
            .with_topic_data(vec![
                topic(
                    "alpha",
                    vec![
                        (0, Some(kp_batch(3, KpCompression::None))),
                        (1, Some(kp_batch(1, KpCompression::Gzip))),
                    ],
                ),
                topic(
                    "beta",
                    vec![(7, None), (2, Some(kp_batch(5, KpCompression::None)))],
                ),
            ])
    }

    /// The id the v13 test requests give topic `name`.
    fn kp_id(name: &str) -> Uuid {
        let mut id = [0u8; 16];
        id[..name.len()].copy_from_slice(name.as_bytes());
        Uuid::from_bytes(id)
    }

    fn encode_kp(req: &KpProduce, version: i16) -> BytesMut {
        let mut out = BytesMut::new();
        req.encode(&mut out, version).unwrap();
        out
    }

    #[test]
    fn decodes_every_version_zero_copy() {
        for version in PRODUCE_MIN_VERSION..=PRODUCE_MAX_VERSION {
            let kp = kp_request(version);
            let body = encode_kp(&kp, version);
            let frame_start = body.as_ptr() as usize;
            let frame_end = frame_start + body.len();
            let req = decode_produce_request(body, version).unwrap();
            assert_eq!(req.acks, -1);
            assert_eq!(req.timeout_ms, 30_000);
            assert_eq!(req.transactional_id.as_deref(), Some("tx-1"));
            assert_eq!(req.topics.len(), kp.topic_data.len());
            for (ours, theirs) in req.topics.iter().zip(&kp.topic_data) {
                assert_eq!(ours.name, theirs.name.0.as_str());
                assert_eq!(&ours.topic_id, theirs.topic_id.as_bytes());
                for (p, q) in ours.partitions.iter().zip(&theirs.partition_data) {
                    assert_eq!(p.index, q.index);
                    assert_eq!(p.records.as_deref(), q.records.as_deref(), "v{version}");
                    if let Some(r) = &p.records {
                        // The records are a slice of the frame, not a copy.
                        let at = r.as_ptr() as usize;
                        assert!(at >= frame_start && at + r.len() <= frame_end, "v{version}");
                    }
                }
            }
        }
    }

    #[test]
    fn records_are_mutable_in_place() {
        let body = encode_kp(&kp_request(9), 9);
        let mut req = decode_produce_request(body, 9).unwrap();
        let records = req.topics[0].partitions[0].records.as_mut().unwrap();
        batch::set_base_offset(records, 1234);
        let h = batch::validate(records).unwrap();
        assert_eq!(h.base_offset, 1234);
        // The neighbouring partition's bytes are untouched.
        let next = req.topics[0].partitions[1].records.as_ref().unwrap();
        assert_eq!(BatchHeader::parse(next).unwrap().base_offset, 0);
    }

    /// What Kafka 4.4's `kafka-clients` serializes for Produce v13 (acks
    /// -1, timeout 1000 ms, no transactional id; topic id 0102..10,
    /// partition 0 with the three bytes 01 02 03 as records).
    const KAFKA_V13_REQUEST: &str =
        "00ffff000003e8020102030405060708090a0b0c0d0e0f10020000000004010203000000";

    #[test]
    fn v13_matches_kafka_bytes() {
        let hex = KAFKA_V13_REQUEST;
        let bytes: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        let req = decode_produce_request(BytesMut::from(&bytes[..]), 13).unwrap();
        assert_eq!(
            (req.transactional_id, req.acks, req.timeout_ms),
            (None, -1, 1000)
        );
        assert_eq!(req.topics.len(), 1);
        assert_eq!(req.topics[0].name, "");
        assert_eq!(
            req.topics[0].topic_id,
            [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]
        );
        assert_eq!(req.topics[0].partitions[0].index, 0);
        assert_eq!(
            req.topics[0].partitions[0].records.as_deref(),
            Some(&[1u8, 2, 3][..])
        );
        // Cut anywhere, it is an error.
        for cut in 0..bytes.len() {
            assert!(decode_produce_request(BytesMut::from(&bytes[..cut]), 13).is_err());
        }
    }

    #[test]
    fn rejects_versions_outside_3_to_13_and_trailing_bytes() {
        let body = encode_kp(&kp_request(8), 8);
        assert!(decode_produce_request(body.clone(), 2).is_err());
        assert!(decode_produce_request(body.clone(), 14).is_err());
        let mut longer = body.clone();
        longer.put_u8(0);
        assert_eq!(
            decode_produce_request(longer, 8),
            Err(ProtocolError::TrailingBytes(1))
        );
        for cut in 0..body.len() {
            assert!(decode_produce_request(body.clone().split_to(cut), 8).is_err());
        }
    }

    fn one_batch() -> Vec<u8> {
        kp_batch(3, KpCompression::None).to_vec()
    }

    #[test]
    fn single_batch_accepts_one_v2_batch() {
        let b = one_batch();
        let h = single_batch(&b).unwrap();
        assert_eq!(h.records_count, 3);
        assert_eq!(h.total_size(), b.len());
        validate_for_append(&b, &h, 1 << 20).unwrap();
    }

    #[test]
    fn single_batch_reports_each_failure_distinctly() {
        let b = one_batch();
        assert_eq!(
            single_batch(&[]),
            Err(RecordsError::NoBatch { available: 0 })
        );
        assert_eq!(
            single_batch(&b[..b.len() - 1]),
            Err(RecordsError::NoBatch {
                available: b.len() - 1
            })
        );
        let mut two = b.clone();
        two.extend_from_slice(&b);
        assert_eq!(single_batch(&two), Err(RecordsError::MoreThanOneBatch));
        // A partial second batch is trailing junk, as in Kafka.
        let mut partial = b.clone();
        partial.extend_from_slice(&b[..20]);
        assert_eq!(single_batch(&partial).unwrap().total_size(), b.len());
        let mut m1 = b.clone();
        m1[16] = 1;
        assert_eq!(single_batch(&m1), Err(RecordsError::WrongMagic(1)));
        let mut m9 = b.clone();
        m9[16] = 9;
        assert_eq!(single_batch(&m9), Err(RecordsError::InvalidMagic(9)));
        let mut tiny = b.clone();
        tiny[8..12].copy_from_slice(&13i32.to_be_bytes());
        assert_eq!(single_batch(&tiny), Err(RecordsError::CorruptSize(13)));
        let mut short_v2 = b.clone();
        short_v2[8..12].copy_from_slice(&20i32.to_be_bytes());
        assert_eq!(single_batch(&short_v2), Err(RecordsError::CorruptSize(20)));
    }

    #[test]
    fn zstd_needs_v7() {
        let b = kp_batch(2, KpCompression::Zstd);
        assert_eq!(
            single_batch_for_version(&b, 6),
            Err(RecordsError::ZstdBeforeV7 { version: 6 })
        );
        assert!(single_batch_for_version(&b, 7).is_ok());
    }

    #[test]
    fn append_checks_in_kafka_order() {
        let b = one_batch();
        let h = single_batch(&b).unwrap();
        let mut moved = b.clone();
        batch::set_base_offset(&mut moved, 5);
        let hm = single_batch(&moved).unwrap();
        assert_eq!(
            validate_for_append(&moved, &hm, 1 << 20),
            Err(RecordsError::BaseOffsetNotZero(5))
        );
        assert_eq!(
            validate_for_append(&b, &h, 10),
            Err(RecordsError::TooLarge {
                size: b.len(),
                max_bytes: 10
            })
        );
        let mut flipped = b.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        assert!(matches!(
            validate_for_append(&flipped, &h, 1 << 20),
            Err(RecordsError::CrcMismatch { .. })
        ));
    }

    proptest::proptest! {
        #[test]
        fn random_bodies_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..256), version in 0i16..15) {
            let _ = decode_produce_request(BytesMut::from(&bytes[..]), version);
            let _ = single_batch(&bytes);
        }

        #[test]
        fn mutated_valid_requests_never_panic(version in 3i16..=13, at in 0usize..4096, byte in proptest::num::u8::ANY) {
            let mut body = encode_kp(&kp_request(version), version);
            let at = at % body.len();
            body[at] = byte;
            if let Ok(req) = decode_produce_request(body, version) {
                for t in &req.topics {
                    for p in &t.partitions {
                        if let Some(r) = &p.records {
                            if let Ok(h) = single_batch(r) {
                                let _ = validate_for_append(r, &h, 1 << 20);
                            }
                        }
                    }
                }
            }
        }
    }
}
