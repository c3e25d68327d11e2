//! Hand-written codecs for four more versions Kafka 4.4 serves that
//! `kafka-protocol` 0.18 has no schema for, written the way
//! [`super::hand_versions`] writes its own (read that module's doc: bounded
//! [`Reader`], the crate's types reused for what did not change, the
//! crate's `Decodable`/`Encodable` implemented at exactly one version):
//!
//! - ListOffsets v11 (KIP-1023): the request and response are v10's field
//!   for field; the version only tells the broker the client may ask for
//!   timestamp -6 (earliest pending upload offset).
//! - ApiVersions v5 (KIP-1242): the request adds the cluster id and node
//!   id the client means to reach, so that a broker which is not that node
//!   answers REBOOTSTRAP_REQUIRED; the response is v4's (encoded by
//!   `protocol::apis`).
//! - TxnOffsetCommit v6 (KIP-1319): topics are named by id, as OffsetCommit
//!   v10 names them, in the request and the response.
//! - DeleteGroups v3: the request is v2's; each result of the response
//!   carries an error message.
//!
//! (Produce v13 and Fetch v17-18, the other versions Kafka 4.4 added, are
//! in the crate's schemas: Produce requests are decoded by
//! `protocol::produce` anyway, Fetch requests by the crate.)
//!
//! Field lists are those of Kafka 4.4's message schemas
//! (`clients/src/main/resources/common/message/*.json`); the tests hold
//! the bytes Kafka 4.4's `kafka-clients` serializes for each message.
//! Requests are read entirely by hand, even where the previous version's
//! decoder would read the same bytes: the crate sizes vectors from a count
//! on the wire before reading the elements, and a hostile count must not
//! allocate beyond the body. Tagged fields in requests are skipped (none is
//! defined at these versions); responses carry none.

use super::hand_versions::{
    committed_topics_by_id, count, encoded_size, put_topics_by_id, read_all, str_bytes, write_all,
    wrong_version, TopicId,
};
use super::wire::{put_array_len, put_empty_tagged_fields, put_nullable_string, put_string};
use bytes::BufMut;
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::txn_offset_commit_request::TxnOffsetCommitRequestPartition;
use kafka_protocol::messages::txn_offset_commit_response::TxnOffsetCommitResponsePartition;
use kafka_protocol::messages::{
    BrokerId, DeleteGroupsRequest, DeleteGroupsResponse, GroupId, ListOffsetsRequest,
    ListOffsetsResponse, ProducerId, TopicName, TransactionalId, TxnOffsetCommitRequest,
};
use kafka_protocol::protocol::buf::{ByteBuf, ByteBufMut};
use kafka_protocol::protocol::{Decodable, Encodable};

/// The ListOffsets version that may ask for timestamp -6.
pub const LIST_OFFSETS_PENDING_UPLOAD_VERSION: i16 = 11;
/// The ApiVersions version with the cluster id and node id checks.
pub const API_VERSIONS_REBOOTSTRAP_VERSION: i16 = 5;
/// The TxnOffsetCommit version naming topics by id.
pub const TXN_OFFSET_COMMIT_TOPIC_ID_VERSION: i16 = 6;
/// The DeleteGroups version with a message per result.
pub const DELETE_GROUPS_MESSAGE_VERSION: i16 = 3;

/// The crate's last version of each message, which the unchanged parts
/// are read and written at.
const LIST_OFFSETS_CRATE_VERSION: i16 = 10;
const TXN_OFFSET_COMMIT_CRATE_VERSION: i16 = 5;

/// Smallest encodings, which bound array counts by the bytes left: a
/// ListOffsets topic (empty name, no partitions, no tags) and partition
/// (index, epoch, timestamp, no tags); a TxnOffsetCommit v6 topic (id, no
/// partitions, no tags) and partition (index, offset, epoch, null
/// metadata, no tags); a DeleteGroups group name (empty).
const LIST_TOPIC_MIN_BYTES: usize = 1 + 1 + 1;
const LIST_PARTITION_MIN_BYTES: usize = 4 + 4 + 8 + 1;
const TXN_TOPIC_MIN_BYTES: usize = 16 + 1 + 1;
const TXN_PARTITION_MIN_BYTES: usize = 4 + 8 + 4 + 1 + 1;
const GROUP_NAME_MIN_BYTES: usize = 1;

/// ListOffsets v11's request, which is v10's field for field.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ListOffsetsRequestV11(pub ListOffsetsRequest);

impl Decodable for ListOffsetsRequestV11 {
    fn decode<B: ByteBuf>(buf: &mut B, version: i16) -> anyhow::Result<Self> {
        if version != LIST_OFFSETS_PENDING_UPLOAD_VERSION {
            return Err(wrong_version("ListOffsetsRequestV11", version));
        }
        read_all(buf, |r| {
            let replica_id = r.i32("replica_id")?;
            let isolation_level = r.i8("isolation_level")?;
            let n = count(r, LIST_TOPIC_MIN_BYTES, "topics")?;
            let mut topics = Vec::with_capacity(n);
            for _ in 0..n {
                let name = r.string(true, "name")?;
                let np = count(r, LIST_PARTITION_MIN_BYTES, "partitions")?;
                let mut partitions = Vec::with_capacity(np);
                for _ in 0..np {
                    let index = r.i32("partition_index")?;
                    let epoch = r.i32("current_leader_epoch")?;
                    let timestamp = r.i64("timestamp")?;
                    r.skip_tagged_fields("partition tagged fields")?;
                    partitions.push(
                        ListOffsetsPartition::default()
                            .with_partition_index(index)
                            .with_current_leader_epoch(epoch)
                            .with_timestamp(timestamp),
                    );
                }
                r.skip_tagged_fields("topic tagged fields")?;
                topics.push(
                    ListOffsetsTopic::default()
                        .with_name(TopicName(str_bytes(name)))
                        .with_partitions(partitions),
                );
            }
            let timeout_ms = r.i32("timeout_ms")?;
            r.skip_tagged_fields("tagged fields")?;
            Ok(Self(
                ListOffsetsRequest::default()
                    .with_replica_id(BrokerId(replica_id))
                    .with_isolation_level(isolation_level)
                    .with_topics(topics)
                    .with_timeout_ms(timeout_ms),
            ))
        })
    }
}

/// ListOffsets v11's response, which is v10's field for field.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ListOffsetsResponseV11(pub ListOffsetsResponse);

impl Encodable for ListOffsetsResponseV11 {
    fn encode<B: ByteBufMut>(&self, buf: &mut B, version: i16) -> anyhow::Result<()> {
        if version != LIST_OFFSETS_PENDING_UPLOAD_VERSION {
            return Err(wrong_version("ListOffsetsResponseV11", version));
        }
        self.0.encode(buf, LIST_OFFSETS_CRATE_VERSION)
    }

    fn compute_size(&self, version: i16) -> anyhow::Result<usize> {
        if version != LIST_OFFSETS_PENDING_UPLOAD_VERSION {
            return Err(wrong_version("ListOffsetsResponseV11", version));
        }
        self.0.compute_size(LIST_OFFSETS_CRATE_VERSION)
    }
}

/// ApiVersions v5's request: v4's and the node the client means to reach.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ApiVersionsRequestV5 {
    pub client_software_name: String,
    pub client_software_version: String,
    /// The cluster the client means to reach; None if it does not know.
    pub cluster_id: Option<String>,
    /// The node the client means to reach; -1 if it does not know.
    pub node_id: i32,
}

impl Decodable for ApiVersionsRequestV5 {
    fn decode<B: ByteBuf>(buf: &mut B, version: i16) -> anyhow::Result<Self> {
        if version != API_VERSIONS_REBOOTSTRAP_VERSION {
            return Err(wrong_version("ApiVersionsRequestV5", version));
        }
        read_all(buf, |r| {
            let client_software_name = r.string(true, "client_software_name")?.to_string();
            let client_software_version = r.string(true, "client_software_version")?.to_string();
            let cluster_id = r.nullable_string(true, "cluster_id")?.map(String::from);
            let node_id = r.i32("node_id")?;
            r.skip_tagged_fields("tagged fields")?;
            Ok(ApiVersionsRequestV5 {
                client_software_name,
                client_software_version,
                cluster_id,
                node_id,
            })
        })
    }
}

/// TxnOffsetCommit v6: v5's request with topics named by id.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TxnOffsetCommitRequestV6 {
    /// Every field but the topics, as at v5 (its `topics` is empty).
    pub request: TxnOffsetCommitRequest,
    /// The topics, by id, with their partitions as at v5.
    pub topics: Vec<(TopicId, Vec<TxnOffsetCommitRequestPartition>)>,
}

impl Decodable for TxnOffsetCommitRequestV6 {
    fn decode<B: ByteBuf>(buf: &mut B, version: i16) -> anyhow::Result<Self> {
        if version != TXN_OFFSET_COMMIT_TOPIC_ID_VERSION {
            return Err(wrong_version("TxnOffsetCommitRequestV6", version));
        }
        read_all(buf, |r| {
            let transactional_id = r.string(true, "transactional_id")?;
            let group_id = r.string(true, "group_id")?;
            let producer_id = r.i64("producer_id")?;
            let producer_epoch = r.i16("producer_epoch")?;
            let generation = r.i32("generation_id_or_member_epoch")?;
            let member_id = r.string(true, "member_id")?;
            let instance = r.nullable_string(true, "group_instance_id")?;
            let request = TxnOffsetCommitRequest::default()
                .with_transactional_id(TransactionalId(str_bytes(transactional_id)))
                .with_group_id(GroupId(str_bytes(group_id)))
                .with_producer_id(ProducerId(producer_id))
                .with_producer_epoch(producer_epoch)
                .with_generation_id(generation)
                .with_member_id(str_bytes(member_id))
                .with_group_instance_id(instance.map(str_bytes));
            let topics = committed_topics_by_id(
                r,
                TXN_TOPIC_MIN_BYTES,
                TXN_PARTITION_MIN_BYTES,
                |index, offset, epoch, metadata| {
                    TxnOffsetCommitRequestPartition::default()
                        .with_partition_index(index)
                        .with_committed_offset(offset)
                        .with_committed_leader_epoch(epoch)
                        .with_committed_metadata(metadata.map(str_bytes))
                },
            )?;
            r.skip_tagged_fields("tagged fields")?;
            Ok(TxnOffsetCommitRequestV6 { request, topics })
        })
    }
}

/// TxnOffsetCommit v6's response: v5's with topics named by id.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TxnOffsetCommitResponseV6 {
    pub throttle_time_ms: i32,
    /// The topics, by id, with their partitions as at v5.
    pub topics: Vec<(TopicId, Vec<TxnOffsetCommitResponsePartition>)>,
}

impl Encodable for TxnOffsetCommitResponseV6 {
    fn encode<B: ByteBufMut>(&self, buf: &mut B, version: i16) -> anyhow::Result<()> {
        if version != TXN_OFFSET_COMMIT_TOPIC_ID_VERSION {
            return Err(wrong_version("TxnOffsetCommitResponseV6", version));
        }
        write_all(buf, |out| {
            out.put_i32(self.throttle_time_ms);
            put_topics_by_id(out, &self.topics, TXN_OFFSET_COMMIT_CRATE_VERSION)?;
            put_empty_tagged_fields(out);
            Ok(())
        })
    }

    fn compute_size(&self, version: i16) -> anyhow::Result<usize> {
        encoded_size(self, version)
    }
}

/// DeleteGroups v3's request, which is v2's field for field.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DeleteGroupsRequestV3(pub DeleteGroupsRequest);

impl Decodable for DeleteGroupsRequestV3 {
    fn decode<B: ByteBuf>(buf: &mut B, version: i16) -> anyhow::Result<Self> {
        if version != DELETE_GROUPS_MESSAGE_VERSION {
            return Err(wrong_version("DeleteGroupsRequestV3", version));
        }
        read_all(buf, |r| {
            let n = count(r, GROUP_NAME_MIN_BYTES, "groups_names")?;
            let mut names = Vec::with_capacity(n);
            for _ in 0..n {
                names.push(GroupId(str_bytes(r.string(true, "groups_names")?)));
            }
            r.skip_tagged_fields("tagged fields")?;
            Ok(Self(
                DeleteGroupsRequest::default().with_groups_names(names),
            ))
        })
    }
}

/// DeleteGroups v3's response: v2's and an error message per result.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DeleteGroupsResponseV3 {
    /// Every field as at v2.
    pub response: DeleteGroupsResponse,
    /// The message of each of `response.results`, in order; a result
    /// without an entry has none (null).
    pub error_messages: Vec<Option<String>>,
}

impl Encodable for DeleteGroupsResponseV3 {
    fn encode<B: ByteBufMut>(&self, buf: &mut B, version: i16) -> anyhow::Result<()> {
        if version != DELETE_GROUPS_MESSAGE_VERSION {
            return Err(wrong_version("DeleteGroupsResponseV3", version));
        }
        let resp = &self.response;
        write_all(buf, |out| {
            out.put_i32(resp.throttle_time_ms);
            put_array_len(out, resp.results.len(), true);
            for (i, result) in resp.results.iter().enumerate() {
                put_string(out, result.group_id.as_str(), true);
                out.put_i16(result.error_code);
                let message = self.error_messages.get(i).and_then(|m| m.as_deref());
                put_nullable_string(out, message, true);
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
    //! each test names.
    use super::*;
    use bytes::BytesMut;
    use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
    use kafka_protocol::messages::list_offsets_response::{
        ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
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

    /// Replica -1, read_committed; "t" partition 0, current leader epoch
    /// 3, timestamp -6; timeout 5000 ms.
    const LIST_REQUEST: &str = "ffffffff01020274020000000000000003fffffffffffffffa00000000138800";
    /// "t" partition 0: no error, timestamp -1, offset -1, leader epoch -1.
    const LIST_RESPONSE: &str =
        "0000000002027402000000000000ffffffffffffffffffffffffffffffffffffffff000000";
    /// Software "apache-kafka-java" "4.4.0", cluster "abc", node 1001.
    const VERSIONS_REQUEST: &str =
        "126170616368652d6b61666b612d6a61766106342e342e3004616263000003e900";
    /// Software "c" "1", no cluster id, node -1.
    const VERSIONS_REQUEST_NULL: &str = "0263023100ffffffff00";
    /// Transactional id "x", group "g", producer 7 epoch 1, generation 3,
    /// member "m", no instance; topic ID partition 1 at offset 42, leader
    /// epoch 5, metadata "md".
    const TXN_REQUEST: &str = "027802670000000000000007000100000003026d00020102030405060708090a0b0c0d0e0f100200000001000000000000002a00000005036d64000000";
    /// Topic ID: partition 1 NONE, partition 2 UNKNOWN_TOPIC_ID.
    const TXN_RESPONSE: &str =
        "00000000020102030405060708090a0b0c0d0e0f100300000001000000000000020064000000";
    /// Groups "g" and "h".
    const DELETE_REQUEST: &str = "030267026800";
    /// "g" NONE (no message), "h" GROUP_ID_NOT_FOUND with message "gone".
    const DELETE_RESPONSE: &str = "00000000030267000000000268004505676f6e650000";

    #[test]
    fn list_offsets_v11_matches_kafka_bytes() {
        let req: ListOffsetsRequestV11 = decode(&hex(LIST_REQUEST), 11).unwrap();
        assert_eq!(
            req.0,
            ListOffsetsRequest::default()
                .with_replica_id(BrokerId(-1))
                .with_isolation_level(1)
                .with_timeout_ms(5000)
                .with_topics(vec![ListOffsetsTopic::default()
                    .with_name(TopicName(str_bytes("t")))
                    .with_partitions(vec![ListOffsetsPartition::default()
                        .with_partition_index(0)
                        .with_current_leader_epoch(3)
                        .with_timestamp(-6)])])
        );
        let resp = ListOffsetsResponseV11(ListOffsetsResponse::default().with_topics(vec![
            ListOffsetsTopicResponse::default()
                .with_name(TopicName(str_bytes("t")))
                .with_partitions(vec![ListOffsetsPartitionResponse::default()
                    .with_partition_index(0)
                    .with_timestamp(-1)
                    .with_offset(-1)
                    .with_leader_epoch(-1)]),
        ]));
        assert_eq!(encode(&resp, 11), hex(LIST_RESPONSE));
    }

    #[test]
    fn api_versions_v5_request_matches_kafka_bytes() {
        let req: ApiVersionsRequestV5 = decode(&hex(VERSIONS_REQUEST), 5).unwrap();
        assert_eq!(
            req,
            ApiVersionsRequestV5 {
                client_software_name: "apache-kafka-java".into(),
                client_software_version: "4.4.0".into(),
                cluster_id: Some("abc".into()),
                node_id: 1001,
            }
        );
        let req: ApiVersionsRequestV5 = decode(&hex(VERSIONS_REQUEST_NULL), 5).unwrap();
        assert_eq!((req.cluster_id, req.node_id), (None, -1));
    }

    #[test]
    fn txn_offset_commit_v6_matches_kafka_bytes() {
        let req: TxnOffsetCommitRequestV6 = decode(&hex(TXN_REQUEST), 6).unwrap();
        assert_eq!(req.request.transactional_id.as_str(), "x");
        assert_eq!(req.request.group_id.as_str(), "g");
        assert_eq!(req.request.producer_id, ProducerId(7));
        assert_eq!(req.request.producer_epoch, 1);
        assert_eq!(req.request.generation_id, 3);
        assert_eq!(req.request.member_id.as_str(), "m");
        assert_eq!(req.request.group_instance_id, None);
        assert!(req.request.topics.is_empty());
        assert_eq!(
            req.topics,
            vec![(
                ID,
                vec![TxnOffsetCommitRequestPartition::default()
                    .with_partition_index(1)
                    .with_committed_offset(42)
                    .with_committed_leader_epoch(5)
                    .with_committed_metadata(Some(str_bytes("md")))]
            )]
        );
        let resp = TxnOffsetCommitResponseV6 {
            throttle_time_ms: 0,
            topics: vec![(
                ID,
                vec![
                    TxnOffsetCommitResponsePartition::default().with_partition_index(1),
                    TxnOffsetCommitResponsePartition::default()
                        .with_partition_index(2)
                        .with_error_code(100),
                ],
            )],
        };
        assert_eq!(encode(&resp, 6), hex(TXN_RESPONSE));
    }

    #[test]
    fn delete_groups_v3_matches_kafka_bytes() {
        let req: DeleteGroupsRequestV3 = decode(&hex(DELETE_REQUEST), 3).unwrap();
        let names: Vec<&str> = req.0.groups_names.iter().map(|g| g.as_str()).collect();
        assert_eq!(names, ["g", "h"]);
        let resp = DeleteGroupsResponseV3 {
            response: DeleteGroupsResponse::default().with_results(vec![
                DeletableGroupResult::default().with_group_id(GroupId(str_bytes("g"))),
                DeletableGroupResult::default()
                    .with_group_id(GroupId(str_bytes("h")))
                    .with_error_code(69),
            ]),
            error_messages: vec![None, Some("gone".into())],
        };
        assert_eq!(encode(&resp, 3), hex(DELETE_RESPONSE));
    }

    /// Decodes `bytes` as the request type of `which` (0-3); the result
    /// only tells whether it decoded.
    fn decodes(which: usize, bytes: &[u8]) -> bool {
        match which {
            0 => decode::<ListOffsetsRequestV11>(bytes, 11).is_ok(),
            1 => decode::<ApiVersionsRequestV5>(bytes, 5).is_ok(),
            2 => decode::<TxnOffsetCommitRequestV6>(bytes, 6).is_ok(),
            _ => decode::<DeleteGroupsRequestV3>(bytes, 3).is_ok(),
        }
    }

    const REQUESTS: [&str; 4] = [LIST_REQUEST, VERSIONS_REQUEST, TXN_REQUEST, DELETE_REQUEST];

    #[test]
    fn every_truncation_is_an_error() {
        for (which, full) in REQUESTS.into_iter().enumerate() {
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
        assert!(decode::<ListOffsetsRequestV11>(&hex(LIST_REQUEST), 10).is_err());
        assert!(decode::<ApiVersionsRequestV5>(&hex(VERSIONS_REQUEST), 4).is_err());
        assert!(decode::<TxnOffsetCommitRequestV6>(&hex(TXN_REQUEST), 5).is_err());
        assert!(decode::<DeleteGroupsRequestV3>(&hex(DELETE_REQUEST), 2).is_err());
        let mut out = BytesMut::new();
        assert!(ListOffsetsResponseV11::default()
            .encode(&mut out, 10)
            .is_err());
        assert!(TxnOffsetCommitResponseV6::default()
            .encode(&mut out, 5)
            .is_err());
        assert!(DeleteGroupsResponseV3::default()
            .encode(&mut out, 2)
            .is_err());
    }

    #[test]
    fn a_hostile_array_count_is_an_error_before_allocating() {
        // 2^31 topics (ListOffsets, after replica id and isolation level),
        // 2^31 topics (TxnOffsetCommit, after its fixed fields), 2^31
        // groups (DeleteGroups).
        let huge = [0x80, 0x80, 0x80, 0x80, 0x08];
        let mut list = hex("ffffffff00");
        list.extend_from_slice(&huge);
        assert!(!decodes(0, &list));
        let mut txn = hex("027802670000000000000007000100000003026d00");
        txn.extend_from_slice(&huge);
        assert!(!decodes(2, &txn));
        assert!(!decodes(3, &huge));
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
            let mut bytes = hex(REQUESTS[which]);
            let i = at % bytes.len();
            bytes[i] = byte;
            let _ = decodes(which, &bytes);
        }
    }
}
