//! Hand-written codecs for the newest versions Kafka 4.4 serves of four
//! control-plane APIs that `kafka-protocol` 0.18 (the newest release) has
//! no schema for:
//!
//! - OffsetCommit v10 and OffsetFetch v10 (KIP-848 era): topics are named
//!   by topic id, with no name on the wire, in the request and the
//!   response. The Java consumer (4.x, either group protocol) sends them
//!   as soon as the broker advertises them and it knows every topic's id.
//! - WriteTxnMarkers v2: each marker carries the transaction version
//!   (KIP-890) of the transaction it ends; the response is v1's.
//! - DescribeLogDirs v5: each log directory reports `is_cordoned`
//!   (KIP-1066); the request is v4's.
//!
//! Field lists are those Kafka 4.4's `kafka-clients` prints for these
//! schemas (`OffsetCommitRequestData.SCHEMAS[10]` and so on). Everything
//! that did not change between the previous version and this one is left
//! to the crate's types: a request decodes into the crate's struct of the
//! previous version plus the new fields where that struct still fits
//! (OffsetFetch v10's request, whose groups and topics both change, has
//! its own), and a response encodes the crate's sub-structures that did
//! not change at the previous version. That keeps the handlers on one set
//! of types for every version.
//!
//! Requests are read entirely by hand, even DescribeLogDirs v5 whose body
//! is v4's: the crate's decoders size a vector from a count on the wire
//! before reading its elements, which a hostile count turns into a huge
//! allocation; [`Reader::array_len`] bounds every count by the bytes left.
//!
//! The types implement the crate's `Decodable`/`Encodable` at exactly the
//! one version they are for (any other is an error), so
//! `handlers::decode` and `handlers::respond` treat them as any other
//! message. Decoding goes through [`Reader`], so a truncated or hostile
//! body is an error (the connection is closed), never a panic, and no
//! array count can make it allocate beyond what the body holds. Tagged
//! fields in requests are skipped (none is defined at these versions);
//! responses carry none.

use super::hand_versions_more as more;
use super::wire::{
    put_array_len, put_empty_tagged_fields, put_nullable_string, put_string, Reader,
};
use super::ProtocolError;
use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::describe_log_dirs_request::DescribableLogDirTopic;
use kafka_protocol::messages::describe_log_dirs_response::DescribeLogDirsResult;
use kafka_protocol::messages::offset_commit_request::OffsetCommitRequestPartition;
use kafka_protocol::messages::offset_commit_response::OffsetCommitResponsePartition;
use kafka_protocol::messages::offset_fetch_response::OffsetFetchResponsePartitions;
use kafka_protocol::messages::write_txn_markers_request::{
    WritableTxnMarker, WritableTxnMarkerTopic,
};
use kafka_protocol::messages::{
    ApiKey, DescribeLogDirsRequest, DescribeLogDirsResponse, GroupId, OffsetCommitRequest,
    ProducerId, TopicName, WriteTxnMarkersRequest, WriteTxnMarkersResponse,
};
use kafka_protocol::protocol::buf::{ByteBuf, ByteBufMut};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

/// First OffsetCommit version that names topics by id.
pub const OFFSET_COMMIT_TOPIC_ID_VERSION: i16 = 10;
/// First OffsetFetch version that names topics by id.
pub const OFFSET_FETCH_TOPIC_ID_VERSION: i16 = 10;
/// The WriteTxnMarkers version with the transaction version per marker.
pub const WRITE_TXN_MARKERS_TV_VERSION: i16 = 2;
/// The DescribeLogDirs version with `is_cordoned`.
pub const DESCRIBE_LOG_DIRS_CORDONED_VERSION: i16 = 5;

/// The versions served beyond the crate's schemas, one per API (each one
/// above the crate's highest), here and in [`super::hand_versions_more`].
pub const HAND_CODED: &[(ApiKey, i16)] = &[
    (ApiKey::OffsetCommit, OFFSET_COMMIT_TOPIC_ID_VERSION),
    (ApiKey::OffsetFetch, OFFSET_FETCH_TOPIC_ID_VERSION),
    (ApiKey::WriteTxnMarkers, WRITE_TXN_MARKERS_TV_VERSION),
    (ApiKey::DescribeLogDirs, DESCRIBE_LOG_DIRS_CORDONED_VERSION),
    (
        ApiKey::ListOffsets,
        more::LIST_OFFSETS_PENDING_UPLOAD_VERSION,
    ),
    (ApiKey::ApiVersions, more::API_VERSIONS_REBOOTSTRAP_VERSION),
    (
        ApiKey::TxnOffsetCommit,
        more::TXN_OFFSET_COMMIT_TOPIC_ID_VERSION,
    ),
    (ApiKey::DeleteGroups, more::DELETE_GROUPS_MESSAGE_VERSION),
];

/// The crate's last version of each message, which the unchanged parts
/// are read and written at.
const OFFSET_COMMIT_CRATE_VERSION: i16 = 9;
const OFFSET_FETCH_CRATE_VERSION: i16 = 9;
const WRITE_TXN_MARKERS_CRATE_VERSION: i16 = 1;
const DESCRIBE_LOG_DIRS_CRATE_VERSION: i16 = 4;

/// A Kafka topic id (a UUID), as the metadata image keys topics.
pub type TopicId = [u8; 16];

/// Smallest encodings, which bound array counts by the bytes left: an
/// OffsetCommit v10 topic (id, empty partitions, no tags) and partition
/// (index, offset, epoch, null metadata, no tags); an OffsetFetch v10 group
/// (empty group id, null member id, epoch, null topics, no tags) and topic;
/// a WriteTxnMarkers v2 marker and topic; a DescribeLogDirs v5 topic.
const COMMIT_TOPIC_MIN_BYTES: usize = 16 + 1 + 1;
const COMMIT_PARTITION_MIN_BYTES: usize = 4 + 8 + 4 + 1 + 1;
const FETCH_GROUP_MIN_BYTES: usize = 1 + 1 + 4 + 1 + 1;
const FETCH_TOPIC_MIN_BYTES: usize = 16 + 1 + 1;
const MARKER_MIN_BYTES: usize = 8 + 2 + 1 + 1 + 4 + 1 + 1;
const MARKER_TOPIC_MIN_BYTES: usize = 1 + 1 + 1;
const LOG_DIR_TOPIC_MIN_BYTES: usize = 1 + 1 + 1;
const INT32_BYTES: usize = 4;

pub(super) fn wrong_version(name: &str, version: i16) -> anyhow::Error {
    anyhow::anyhow!("{name} is hand-coded for one version only, not v{version}")
}

/// Runs `read` over the rest of `buf` (whole: the body is the end of the
/// frame) and leaves `buf` empty.
pub(super) fn read_all<B: ByteBuf, T>(
    buf: &mut B,
    read: impl FnOnce(&mut Reader) -> Result<T, ProtocolError>,
) -> anyhow::Result<T> {
    let bytes: Bytes = buf.copy_to_bytes(buf.remaining());
    let mut r = Reader::new(&bytes);
    Ok(read(&mut r)?)
}

/// Writes what `write` appends into `buf`.
pub(super) fn write_all<B: ByteBufMut>(
    buf: &mut B,
    write: impl FnOnce(&mut BytesMut) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let mut out = BytesMut::new();
    write(&mut out)?;
    buf.put_slice(&out);
    Ok(())
}

/// The size of `value` encoded at `version`, by encoding it (these
/// messages are small and rare, and one encoder cannot disagree with
/// itself).
pub(super) fn encoded_size(value: &impl Encodable, version: i16) -> anyhow::Result<usize> {
    let mut out = BytesMut::new();
    value.encode(&mut out, version)?;
    Ok(out.len())
}

/// A v10 response's topics, named by id: the compact array of (topic id,
/// compact array of partitions as the crate encodes them at
/// `crate_version`, tagged fields).
pub(super) fn put_topics_by_id<P: Encodable>(
    out: &mut BytesMut,
    topics: &[(TopicId, Vec<P>)],
    crate_version: i16,
) -> anyhow::Result<()> {
    put_array_len(out, topics.len(), true);
    for (id, partitions) in topics {
        out.put_slice(id);
        put_array_len(out, partitions.len(), true);
        for p in partitions {
            p.encode(out, crate_version)?;
        }
        put_empty_tagged_fields(out);
    }
    Ok(())
}

pub(super) fn str_bytes(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_string())
}

pub(super) fn topic_id(r: &mut Reader) -> Result<TopicId, ProtocolError> {
    let mut id = [0u8; 16];
    id.copy_from_slice(r.take(16, "topic_id")?);
    Ok(id)
}

/// A non-null compact array's count, bounded by the bytes left.
pub(super) fn count(
    r: &mut Reader,
    min_element_bytes: usize,
    field: &'static str,
) -> Result<usize, ProtocolError> {
    r.array_len(true, min_element_bytes, field)?
        .ok_or(ProtocolError::UnexpectedNull { field })
}

/// The topics of a commit named by id, as OffsetCommit v10 and
/// TxnOffsetCommit v6 both carry them: per topic its id and partitions
/// (index, committed offset, leader epoch, metadata, tagged fields), each
/// partition turned into the caller's type by `partition`.
pub(super) fn committed_topics_by_id<P>(
    r: &mut Reader,
    topic_min_bytes: usize,
    partition_min_bytes: usize,
    mut partition: impl FnMut(i32, i64, i32, Option<&str>) -> P,
) -> Result<Vec<(TopicId, Vec<P>)>, ProtocolError> {
    let n = count(r, topic_min_bytes, "topics")?;
    let mut topics = Vec::with_capacity(n);
    for _ in 0..n {
        let id = topic_id(r)?;
        let np = count(r, partition_min_bytes, "partitions")?;
        let mut partitions = Vec::with_capacity(np);
        for _ in 0..np {
            let index = r.i32("partition_index")?;
            let offset = r.i64("committed_offset")?;
            let epoch = r.i32("committed_leader_epoch")?;
            let metadata = r.nullable_string(true, "committed_metadata")?;
            r.skip_tagged_fields("partition tagged fields")?;
            partitions.push(partition(index, offset, epoch, metadata));
        }
        r.skip_tagged_fields("topic tagged fields")?;
        topics.push((id, partitions));
    }
    Ok(topics)
}

fn int32_array(r: &mut Reader, field: &'static str) -> Result<Vec<i32>, ProtocolError> {
    let n = count(r, INT32_BYTES, field)?;
    (0..n).map(|_| r.i32(field)).collect()
}

/// OffsetCommit v10: v9's request with topics named by id.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct OffsetCommitRequestV10 {
    /// Every field but the topics, as at v9 (its `topics` is empty).
    pub request: OffsetCommitRequest,
    /// The topics, by id, with their partitions as at v9.
    pub topics: Vec<(TopicId, Vec<OffsetCommitRequestPartition>)>,
}

impl Decodable for OffsetCommitRequestV10 {
    fn decode<B: ByteBuf>(buf: &mut B, version: i16) -> anyhow::Result<Self> {
        if version != OFFSET_COMMIT_TOPIC_ID_VERSION {
            return Err(wrong_version("OffsetCommitRequestV10", version));
        }
        read_all(buf, |r| {
            let group_id = r.string(true, "group_id")?;
            let generation = r.i32("generation_id_or_member_epoch")?;
            let member_id = r.string(true, "member_id")?;
            let instance = r.nullable_string(true, "group_instance_id")?;
            let request = OffsetCommitRequest::default()
                .with_group_id(GroupId(str_bytes(group_id)))
                .with_generation_id_or_member_epoch(generation)
                .with_member_id(str_bytes(member_id))
                .with_group_instance_id(instance.map(str_bytes));
            let topics = committed_topics_by_id(
                r,
                COMMIT_TOPIC_MIN_BYTES,
                COMMIT_PARTITION_MIN_BYTES,
                |index, offset, epoch, metadata| {
                    OffsetCommitRequestPartition::default()
                        .with_partition_index(index)
                        .with_committed_offset(offset)
                        .with_committed_leader_epoch(epoch)
                        .with_committed_metadata(metadata.map(str_bytes))
                },
            )?;
            r.skip_tagged_fields("tagged fields")?;
            Ok(OffsetCommitRequestV10 { request, topics })
        })
    }
}

/// OffsetCommit v10's response: v9's with topics named by id.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct OffsetCommitResponseV10 {
    pub throttle_time_ms: i32,
    /// The topics, by id, with their partitions as at v9.
    pub topics: Vec<(TopicId, Vec<OffsetCommitResponsePartition>)>,
}

impl Encodable for OffsetCommitResponseV10 {
    fn encode<B: ByteBufMut>(&self, buf: &mut B, version: i16) -> anyhow::Result<()> {
        if version != OFFSET_COMMIT_TOPIC_ID_VERSION {
            return Err(wrong_version("OffsetCommitResponseV10", version));
        }
        write_all(buf, |out| {
            out.put_i32(self.throttle_time_ms);
            put_topics_by_id(out, &self.topics, OFFSET_COMMIT_CRATE_VERSION)?;
            put_empty_tagged_fields(out);
            Ok(())
        })
    }

    fn compute_size(&self, version: i16) -> anyhow::Result<usize> {
        encoded_size(self, version)
    }
}

/// One group of an OffsetFetch v10 request.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct OffsetFetchGroupV10 {
    pub group_id: String,
    /// The member (KIP-848 consumer groups); None for others.
    pub member_id: Option<String>,
    pub member_epoch: i32,
    /// The topics by id and their partitions; None: every topic the group
    /// has offsets for.
    pub topics: Option<Vec<(TopicId, Vec<i32>)>>,
}

/// OffsetFetch v10: v9's request with topics named by id.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct OffsetFetchRequestV10 {
    pub groups: Vec<OffsetFetchGroupV10>,
    pub require_stable: bool,
}

impl Decodable for OffsetFetchRequestV10 {
    fn decode<B: ByteBuf>(buf: &mut B, version: i16) -> anyhow::Result<Self> {
        if version != OFFSET_FETCH_TOPIC_ID_VERSION {
            return Err(wrong_version("OffsetFetchRequestV10", version));
        }
        read_all(buf, |r| {
            let n = count(r, FETCH_GROUP_MIN_BYTES, "groups")?;
            let mut groups = Vec::with_capacity(n);
            for _ in 0..n {
                let group_id = r.string(true, "group_id")?.to_string();
                let member_id = r.nullable_string(true, "member_id")?.map(String::from);
                let member_epoch = r.i32("member_epoch")?;
                let topics = match r.array_len(true, FETCH_TOPIC_MIN_BYTES, "topics")? {
                    None => None,
                    Some(nt) => {
                        let mut topics = Vec::with_capacity(nt);
                        for _ in 0..nt {
                            let id = topic_id(r)?;
                            let partitions = int32_array(r, "partition_indexes")?;
                            r.skip_tagged_fields("topic tagged fields")?;
                            topics.push((id, partitions));
                        }
                        Some(topics)
                    }
                };
                r.skip_tagged_fields("group tagged fields")?;
                groups.push(OffsetFetchGroupV10 {
                    group_id,
                    member_id,
                    member_epoch,
                    topics,
                });
            }
            let require_stable = r.i8("require_stable")? != 0;
            r.skip_tagged_fields("tagged fields")?;
            Ok(OffsetFetchRequestV10 {
                groups,
                require_stable,
            })
        })
    }
}

/// One group of an OffsetFetch v10 response.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct OffsetFetchGroupResponseV10 {
    pub group_id: String,
    /// The topics, by id, with their partitions as at v9.
    pub topics: Vec<(TopicId, Vec<OffsetFetchResponsePartitions>)>,
    pub error_code: i16,
}

/// OffsetFetch v10's response: v9's with topics named by id.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct OffsetFetchResponseV10 {
    pub throttle_time_ms: i32,
    pub groups: Vec<OffsetFetchGroupResponseV10>,
}

impl Encodable for OffsetFetchResponseV10 {
    fn encode<B: ByteBufMut>(&self, buf: &mut B, version: i16) -> anyhow::Result<()> {
        if version != OFFSET_FETCH_TOPIC_ID_VERSION {
            return Err(wrong_version("OffsetFetchResponseV10", version));
        }
        write_all(buf, |out| {
            out.put_i32(self.throttle_time_ms);
            put_array_len(out, self.groups.len(), true);
            for g in &self.groups {
                put_string(out, &g.group_id, true);
                put_topics_by_id(out, &g.topics, OFFSET_FETCH_CRATE_VERSION)?;
                out.put_i16(g.error_code);
                put_empty_tagged_fields(out);
            }
            put_empty_tagged_fields(out);
            Ok(())
        })
    }

    fn compute_size(&self, version: i16) -> anyhow::Result<usize> {
        encoded_size(self, version)
    }
}

/// WriteTxnMarkers v2: v1's request and, per marker, its transaction
/// version.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct WriteTxnMarkersRequestV2 {
    /// The markers as at v1.
    pub request: WriteTxnMarkersRequest,
    /// The transaction version of each marker, in `request.markers` order.
    pub transaction_versions: Vec<i8>,
}

impl Decodable for WriteTxnMarkersRequestV2 {
    fn decode<B: ByteBuf>(buf: &mut B, version: i16) -> anyhow::Result<Self> {
        if version != WRITE_TXN_MARKERS_TV_VERSION {
            return Err(wrong_version("WriteTxnMarkersRequestV2", version));
        }
        read_all(buf, |r| {
            let n = count(r, MARKER_MIN_BYTES, "markers")?;
            let mut markers = Vec::with_capacity(n);
            let mut transaction_versions = Vec::with_capacity(n);
            for _ in 0..n {
                let producer_id = r.i64("producer_id")?;
                let producer_epoch = r.i16("producer_epoch")?;
                let result = r.i8("transaction_result")? != 0;
                let nt = count(r, MARKER_TOPIC_MIN_BYTES, "topics")?;
                let mut topics = Vec::with_capacity(nt);
                for _ in 0..nt {
                    let name = r.string(true, "name")?;
                    let partitions = int32_array(r, "partition_indexes")?;
                    r.skip_tagged_fields("topic tagged fields")?;
                    topics.push(
                        WritableTxnMarkerTopic::default()
                            .with_name(TopicName(str_bytes(name)))
                            .with_partition_indexes(partitions),
                    );
                }
                let coordinator_epoch = r.i32("coordinator_epoch")?;
                transaction_versions.push(r.i8("transaction_version")?);
                r.skip_tagged_fields("marker tagged fields")?;
                markers.push(
                    WritableTxnMarker::default()
                        .with_producer_id(ProducerId(producer_id))
                        .with_producer_epoch(producer_epoch)
                        .with_transaction_result(result)
                        .with_topics(topics)
                        .with_coordinator_epoch(coordinator_epoch),
                );
            }
            r.skip_tagged_fields("tagged fields")?;
            Ok(WriteTxnMarkersRequestV2 {
                request: WriteTxnMarkersRequest::default().with_markers(markers),
                transaction_versions,
            })
        })
    }
}

/// The sending side (a coordinator's marker to another node's leader):
/// v2's body, each marker with its transaction version (0 when
/// `transaction_versions` is shorter than the markers).
impl Encodable for WriteTxnMarkersRequestV2 {
    fn encode<B: ByteBufMut>(&self, buf: &mut B, version: i16) -> anyhow::Result<()> {
        if version != WRITE_TXN_MARKERS_TV_VERSION {
            return Err(wrong_version("WriteTxnMarkersRequestV2", version));
        }
        write_all(buf, |out| {
            put_array_len(out, self.request.markers.len(), true);
            for (i, m) in self.request.markers.iter().enumerate() {
                out.put_i64(m.producer_id.0);
                out.put_i16(m.producer_epoch);
                out.put_i8(i8::from(m.transaction_result));
                put_array_len(out, m.topics.len(), true);
                for t in &m.topics {
                    put_string(out, t.name.0.as_str(), true);
                    put_array_len(out, t.partition_indexes.len(), true);
                    for &p in &t.partition_indexes {
                        out.put_i32(p);
                    }
                    put_empty_tagged_fields(out);
                }
                out.put_i32(m.coordinator_epoch);
                out.put_i8(self.transaction_versions.get(i).copied().unwrap_or(0));
                put_empty_tagged_fields(out);
            }
            put_empty_tagged_fields(out);
            Ok(())
        })
    }

    fn compute_size(&self, version: i16) -> anyhow::Result<usize> {
        encoded_size(self, version)
    }
}

impl kafka_protocol::protocol::Message for WriteTxnMarkersRequestV2 {
    const VERSIONS: kafka_protocol::protocol::VersionRange =
        kafka_protocol::protocol::VersionRange {
            min: WRITE_TXN_MARKERS_TV_VERSION,
            max: WRITE_TXN_MARKERS_TV_VERSION,
        };
    const DEPRECATED_VERSIONS: Option<kafka_protocol::protocol::VersionRange> = None;
}

impl kafka_protocol::protocol::HeaderVersion for WriteTxnMarkersRequestV2 {
    fn header_version(_version: i16) -> i16 {
        2
    }
}

/// So a broker's client ([`kafka_protocol::protocol::Request`]) can send
/// v2 and read its answer.
impl kafka_protocol::protocol::Request for WriteTxnMarkersRequestV2 {
    const KEY: i16 = ApiKey::WriteTxnMarkers as i16;
    type Response = WriteTxnMarkersResponseV2;
}

/// WriteTxnMarkers v2's response, which is v1's field for field.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct WriteTxnMarkersResponseV2(pub WriteTxnMarkersResponse);

impl Encodable for WriteTxnMarkersResponseV2 {
    fn encode<B: ByteBufMut>(&self, buf: &mut B, version: i16) -> anyhow::Result<()> {
        if version != WRITE_TXN_MARKERS_TV_VERSION {
            return Err(wrong_version("WriteTxnMarkersResponseV2", version));
        }
        self.0.encode(buf, WRITE_TXN_MARKERS_CRATE_VERSION)
    }

    fn compute_size(&self, version: i16) -> anyhow::Result<usize> {
        if version != WRITE_TXN_MARKERS_TV_VERSION {
            return Err(wrong_version("WriteTxnMarkersResponseV2", version));
        }
        self.0.compute_size(WRITE_TXN_MARKERS_CRATE_VERSION)
    }
}

/// The receiving side of a coordinator: v2's answer read as v1's.
impl Decodable for WriteTxnMarkersResponseV2 {
    fn decode<B: ByteBuf>(buf: &mut B, version: i16) -> anyhow::Result<Self> {
        if version != WRITE_TXN_MARKERS_TV_VERSION {
            return Err(wrong_version("WriteTxnMarkersResponseV2", version));
        }
        Ok(WriteTxnMarkersResponseV2(WriteTxnMarkersResponse::decode(
            buf,
            WRITE_TXN_MARKERS_CRATE_VERSION,
        )?))
    }
}

impl kafka_protocol::protocol::Message for WriteTxnMarkersResponseV2 {
    const VERSIONS: kafka_protocol::protocol::VersionRange =
        kafka_protocol::protocol::VersionRange {
            min: WRITE_TXN_MARKERS_TV_VERSION,
            max: WRITE_TXN_MARKERS_TV_VERSION,
        };
    const DEPRECATED_VERSIONS: Option<kafka_protocol::protocol::VersionRange> = None;
}

impl kafka_protocol::protocol::HeaderVersion for WriteTxnMarkersResponseV2 {
    fn header_version(_version: i16) -> i16 {
        1
    }
}

/// DescribeLogDirs v5's request, which is v4's field for field.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DescribeLogDirsRequestV5(pub DescribeLogDirsRequest);

impl Decodable for DescribeLogDirsRequestV5 {
    fn decode<B: ByteBuf>(buf: &mut B, version: i16) -> anyhow::Result<Self> {
        if version != DESCRIBE_LOG_DIRS_CORDONED_VERSION {
            return Err(wrong_version("DescribeLogDirsRequestV5", version));
        }
        // Read by hand although v4's decoder would do: the crate sizes its
        // vectors from the counts on the wire before reading the elements.
        read_all(buf, |r| {
            let topics = match r.array_len(true, LOG_DIR_TOPIC_MIN_BYTES, "topics")? {
                None => None,
                Some(n) => {
                    let mut topics = Vec::with_capacity(n);
                    for _ in 0..n {
                        let topic = r.string(true, "topic")?;
                        let partitions = int32_array(r, "partitions")?;
                        r.skip_tagged_fields("topic tagged fields")?;
                        topics.push(
                            DescribableLogDirTopic::default()
                                .with_topic(TopicName(str_bytes(topic)))
                                .with_partitions(partitions),
                        );
                    }
                    Some(topics)
                }
            };
            r.skip_tagged_fields("tagged fields")?;
            Ok(Self(DescribeLogDirsRequest::default().with_topics(topics)))
        })
    }
}

/// DescribeLogDirs v5's response: v4's, and whether each log directory is
/// cordoned (takes no new partitions).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DescribeLogDirsResponseV5 {
    /// Every field as at v4.
    pub response: DescribeLogDirsResponse,
    /// `is_cordoned` of each of `response.results`, in order; a result
    /// without an entry is not cordoned.
    pub cordoned: Vec<bool>,
}

impl Encodable for DescribeLogDirsResponseV5 {
    fn encode<B: ByteBufMut>(&self, buf: &mut B, version: i16) -> anyhow::Result<()> {
        if version != DESCRIBE_LOG_DIRS_CORDONED_VERSION {
            return Err(wrong_version("DescribeLogDirsResponseV5", version));
        }
        let resp = &self.response;
        write_all(buf, |out| {
            out.put_i32(resp.throttle_time_ms);
            out.put_i16(resp.error_code);
            put_array_len(out, resp.results.len(), true);
            for (i, result) in resp.results.iter().enumerate() {
                let DescribeLogDirsResult {
                    error_code,
                    log_dir,
                    topics,
                    total_bytes,
                    usable_bytes,
                    ..
                } = result;
                out.put_i16(*error_code);
                put_nullable_string(out, Some(log_dir.as_str()), true);
                put_array_len(out, topics.len(), true);
                for t in topics {
                    t.encode(out, DESCRIBE_LOG_DIRS_CRATE_VERSION)?;
                }
                out.put_i64(*total_bytes);
                out.put_i64(*usable_bytes);
                out.put_i8(i8::from(self.cordoned.get(i).copied().unwrap_or(false)));
                put_empty_tagged_fields(out);
            }
            put_empty_tagged_fields(out);
            Ok(())
        })
    }

    fn compute_size(&self, version: i16) -> anyhow::Result<usize> {
        encoded_size(self, version)
    }
}

#[cfg(test)]
mod tests {
    //! The bytes here are what Kafka 4.4's `kafka-clients` serializes
    //! (`MessageUtil.toByteBufferAccessor(data, version)`) for the values
    //! each test names: requests as a Java client sends them, responses as
    //! a Java client expects to read them.
    use super::*;
    use kafka_protocol::messages::describe_log_dirs_response::{
        DescribeLogDirsPartition, DescribeLogDirsTopic,
    };
    use kafka_protocol::messages::write_txn_markers_response::{
        WritableTxnMarkerPartitionResult, WritableTxnMarkerResult, WritableTxnMarkerTopicResult,
    };

    const ID: TopicId = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16];

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn decode<T: Decodable>(bytes: &[u8], version: i16) -> anyhow::Result<T> {
        T::decode(&mut BytesMut::from(bytes), version)
    }

    fn encode<T: Encodable>(value: &T, version: i16) -> Vec<u8> {
        let mut out = BytesMut::new();
        value.encode(&mut out, version).unwrap();
        assert_eq!(value.compute_size(version).unwrap(), out.len());
        out.to_vec()
    }

    /// Group "g", member "m", epoch 3, no instance id; topic ID partition
    /// 1 at offset 42, leader epoch 5, metadata "md".
    const COMMIT_REQUEST: &str = "026700000003026d00020102030405060708090a0b0c0d0e0f100200000001000000000000002a00000005036d64000000";
    /// Topic ID: partition 1 NONE, partition 2 UNKNOWN_TOPIC_OR_PARTITION.
    const COMMIT_RESPONSE: &str =
        "00000000020102030405060708090a0b0c0d0e0f100300000001000000000000020003000000";
    /// Require stable; group "g" (member "m", epoch 4) topic ID partitions
    /// 0 and 1, group "h" (no member, epoch -1) all topics.
    const FETCH_REQUEST: &str = "030267026d00000004020102030405060708090a0b0c0d0e0f100300000000000000010000026800ffffffff00000100";
    /// Group "g": topic ID partition 0 at 42, leader epoch 5, metadata "md".
    const FETCH_RESPONSE: &str = "00000000020267020102030405060708090a0b0c0d0e0f100200000000000000000000002a00000005036d640000000000000000";
    /// Producer 7 epoch 1 COMMIT of "t" partitions 0 and 2, coordinator
    /// epoch 3, transaction version 2.
    const MARKERS_REQUEST: &str =
        "0200000000000000070001010202740300000000000000020000000003020000";
    /// Producer 7: "t" partition 0 CLUSTER_AUTHORIZATION_FAILED.
    const MARKERS_RESPONSE: &str = "0200000000000000070202740200000000001f00000000";
    /// Topic "t" partition 0.
    const DIRS_REQUEST: &str = "02027402000000000000";
    /// Log dir "/d" (1000 bytes, 500 usable, cordoned): "t" partition 0
    /// of 100 bytes.
    const DIRS_RESPONSE: &str = "000000000000020000032f6402027402000000000000000000000064000000000000000000000000000000000003e800000000000001f4010000";

    #[test]
    fn offset_commit_v10_matches_kafka_bytes() {
        let req: OffsetCommitRequestV10 = decode(&hex(COMMIT_REQUEST), 10).unwrap();
        assert_eq!(req.request.group_id.as_str(), "g");
        assert_eq!(req.request.generation_id_or_member_epoch, 3);
        assert_eq!(req.request.member_id.as_str(), "m");
        assert_eq!(req.request.group_instance_id, None);
        assert!(req.request.topics.is_empty());
        assert_eq!(
            req.topics,
            vec![(
                ID,
                vec![OffsetCommitRequestPartition::default()
                    .with_partition_index(1)
                    .with_committed_offset(42)
                    .with_committed_leader_epoch(5)
                    .with_committed_metadata(Some(str_bytes("md")))]
            )]
        );
        let resp = OffsetCommitResponseV10 {
            throttle_time_ms: 0,
            topics: vec![(
                ID,
                vec![
                    OffsetCommitResponsePartition::default().with_partition_index(1),
                    OffsetCommitResponsePartition::default()
                        .with_partition_index(2)
                        .with_error_code(3),
                ],
            )],
        };
        assert_eq!(encode(&resp, 10), hex(COMMIT_RESPONSE));
    }

    #[test]
    fn offset_fetch_v10_matches_kafka_bytes() {
        let req: OffsetFetchRequestV10 = decode(&hex(FETCH_REQUEST), 10).unwrap();
        assert_eq!(
            req,
            OffsetFetchRequestV10 {
                groups: vec![
                    OffsetFetchGroupV10 {
                        group_id: "g".into(),
                        member_id: Some("m".into()),
                        member_epoch: 4,
                        topics: Some(vec![(ID, vec![0, 1])]),
                    },
                    OffsetFetchGroupV10 {
                        group_id: "h".into(),
                        member_id: None,
                        member_epoch: -1,
                        topics: None,
                    },
                ],
                require_stable: true,
            }
        );
        let resp = OffsetFetchResponseV10 {
            throttle_time_ms: 0,
            groups: vec![OffsetFetchGroupResponseV10 {
                group_id: "g".into(),
                topics: vec![(
                    ID,
                    vec![OffsetFetchResponsePartitions::default()
                        .with_partition_index(0)
                        .with_committed_offset(42)
                        .with_committed_leader_epoch(5)
                        .with_metadata(Some(str_bytes("md")))],
                )],
                error_code: 0,
            }],
        };
        assert_eq!(encode(&resp, 10), hex(FETCH_RESPONSE));
    }

    /// What a coordinator sends is Kafka's v2 bytes, and reads back whole.
    #[test]
    fn write_txn_markers_v2_encodes_as_kafka_and_round_trips() {
        let req: WriteTxnMarkersRequestV2 = decode(&hex(MARKERS_REQUEST), 2).unwrap();
        assert_eq!(encode(&req, 2), hex(MARKERS_REQUEST));
        let resp = WriteTxnMarkersResponseV2(WriteTxnMarkersResponse::default().with_markers(
            vec![kafka_protocol::messages::write_txn_markers_response::WritableTxnMarkerResult::default()
                .with_producer_id(ProducerId(7))],
        ));
        let back: WriteTxnMarkersResponseV2 = decode(&encode(&resp, 2), 2).unwrap();
        assert_eq!(back, resp);
        assert!(WriteTxnMarkersRequestV2::default()
            .encode(&mut BytesMut::new(), 1)
            .is_err());
    }

    #[test]
    fn write_txn_markers_v2_matches_kafka_bytes() {
        let req: WriteTxnMarkersRequestV2 = decode(&hex(MARKERS_REQUEST), 2).unwrap();
        assert_eq!(req.transaction_versions, vec![2]);
        assert_eq!(
            req.request.markers,
            vec![WritableTxnMarker::default()
                .with_producer_id(ProducerId(7))
                .with_producer_epoch(1)
                .with_transaction_result(true)
                .with_topics(vec![WritableTxnMarkerTopic::default()
                    .with_name(TopicName(str_bytes("t")))
                    .with_partition_indexes(vec![0, 2])])
                .with_coordinator_epoch(3)]
        );
        let resp = WriteTxnMarkersResponseV2(WriteTxnMarkersResponse::default().with_markers(
            vec![WritableTxnMarkerResult::default()
                .with_producer_id(ProducerId(7))
                .with_topics(vec![WritableTxnMarkerTopicResult::default()
                    .with_name(TopicName(str_bytes("t")))
                    .with_partitions(vec![WritableTxnMarkerPartitionResult::default()
                        .with_partition_index(0)
                        .with_error_code(31)])])],
        ));
        assert_eq!(encode(&resp, 2), hex(MARKERS_RESPONSE));
    }

    #[test]
    fn describe_log_dirs_v5_matches_kafka_bytes() {
        let req: DescribeLogDirsRequestV5 = decode(&hex(DIRS_REQUEST), 5).unwrap();
        let topics = req.0.topics.expect("topics");
        assert_eq!(topics.len(), 1);
        assert_eq!(topics[0].topic.as_str(), "t");
        assert_eq!(topics[0].partitions, vec![0]);
        let resp = DescribeLogDirsResponseV5 {
            response: DescribeLogDirsResponse::default().with_results(vec![
                DescribeLogDirsResult::default()
                    .with_log_dir(str_bytes("/d"))
                    .with_total_bytes(1000)
                    .with_usable_bytes(500)
                    .with_topics(vec![DescribeLogDirsTopic::default()
                        .with_name(TopicName(str_bytes("t")))
                        .with_partitions(vec![
                            DescribeLogDirsPartition::default().with_partition_size(100)
                        ])]),
            ]),
            cordoned: vec![true],
        };
        assert_eq!(encode(&resp, 5), hex(DIRS_RESPONSE));
    }

    /// Decodes `bytes` as the request type of `which` (0-3); the result
    /// only tells whether it decoded.
    fn decodes(which: usize, bytes: &[u8]) -> bool {
        match which {
            0 => decode::<OffsetCommitRequestV10>(bytes, 10).is_ok(),
            1 => decode::<OffsetFetchRequestV10>(bytes, 10).is_ok(),
            2 => decode::<WriteTxnMarkersRequestV2>(bytes, 2).is_ok(),
            _ => decode::<DescribeLogDirsRequestV5>(bytes, 5).is_ok(),
        }
    }

    #[test]
    fn every_truncation_is_an_error() {
        for (which, full) in [COMMIT_REQUEST, FETCH_REQUEST, MARKERS_REQUEST, DIRS_REQUEST]
            .into_iter()
            .enumerate()
        {
            let full = hex(full);
            assert!(decodes(which, &full));
            for len in 0..full.len() {
                assert!(
                    !decodes(which, &full[..len]),
                    "request {which} cut to {len}"
                );
            }
        }
    }

    #[test]
    fn other_versions_are_refused() {
        assert!(decode::<OffsetCommitRequestV10>(&hex(COMMIT_REQUEST), 9).is_err());
        assert!(decode::<OffsetFetchRequestV10>(&hex(FETCH_REQUEST), 9).is_err());
        assert!(decode::<WriteTxnMarkersRequestV2>(&hex(MARKERS_REQUEST), 1).is_err());
        assert!(decode::<DescribeLogDirsRequestV5>(&hex(DIRS_REQUEST), 4).is_err());
        let mut out = BytesMut::new();
        assert!(OffsetCommitResponseV10::default()
            .encode(&mut out, 9)
            .is_err());
        assert!(OffsetFetchResponseV10::default()
            .encode(&mut out, 9)
            .is_err());
        assert!(DescribeLogDirsResponseV5::default()
            .encode(&mut out, 4)
            .is_err());
        assert!(WriteTxnMarkersResponseV2::default()
            .encode(&mut out, 1)
            .is_err());
    }

    #[test]
    fn a_hostile_array_count_is_an_error_before_allocating() {
        // OffsetCommit v10 claiming 2^31 topics, OffsetFetch v10 as many
        // groups, WriteTxnMarkers v2 as many markers.
        let huge = [0x80, 0x80, 0x80, 0x80, 0x08];
        let mut commit = hex("026700000003026d0000");
        commit.truncate(commit.len() - 1);
        commit.extend_from_slice(&huge);
        assert!(!decodes(0, &commit));
        assert!(!decodes(1, &huge));
        assert!(!decodes(2, &huge));
    }

    proptest::proptest! {
        #[test]
        fn random_bodies_never_panic(
            which in 0usize..4,
            bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..96),
        ) {
            let _ = decodes(which, &bytes);
        }

        #[test]
        fn mutated_kafka_bodies_never_panic(
            which in 0usize..4,
            at in 0usize..64,
            byte in proptest::num::u8::ANY,
        ) {
            let mut bytes = hex([COMMIT_REQUEST, FETCH_REQUEST, MARKERS_REQUEST, DIRS_REQUEST][which]);
            let i = at % bytes.len();
            bytes[i] = byte;
            let _ = decodes(which, &bytes);
        }
    }
}
