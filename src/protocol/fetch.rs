//! Zero-copy encoding of FetchResponse v4–v18.
//!
//! A fetch response is mostly record bytes. They are never copied here:
//! the fixed fields and per-partition headers are written into one small
//! buffer, which is cut into `Bytes` pieces at each records field, and the
//! records chunks (tail-cache `Bytes`, read-ahead bytes, or segment-file
//! ranges, which the connection reads as it sends them) are placed between
//! those pieces untouched. The caller writes the frame length and response
//! header, then sends the parts in order.
//!
//! Versions: v7 adds the top-level error code and session id; v11 the
//! preferred read replica; v12 makes the response flexible (compact types,
//! tagged fields; `current_leader` is partition tag 1); v13 names topics by
//! id instead of name; v16 adds the top-level `node_endpoints` (tag 0).
//! v17 and v18 change only the request (a follower's `ReplicaDirectoryId`,
//! KIP-853, and `HighWatermark`, KIP-1166, both tagged partition fields a
//! consumer leaves unset): their responses are v16's.
//! Tagged fields are written only when they hold a value, as Kafka does.
//! Requests are decoded with `kafka-protocol`'s `FetchRequest` (they carry
//! no records). Pure functions; any shard may call them.

use super::wire::{
    put_array_len, put_empty_tagged_fields, put_null_array, put_nullable_string, put_string,
    put_uvarint, uvarint_len,
};
use crate::record::RecordsChunk;
use bytes::{BufMut, BytesMut};

/// Oldest FetchResponse version encoded.
pub const FETCH_MIN_VERSION: i16 = 4;
/// Newest FetchResponse version encoded.
pub const FETCH_MAX_VERSION: i16 = 18;
const FETCH_FIRST_SESSION_VERSION: i16 = 7;
const FETCH_FIRST_LOG_START_VERSION: i16 = 5;
const FETCH_FIRST_PREFERRED_REPLICA_VERSION: i16 = 11;
const FETCH_FIRST_FLEXIBLE_VERSION: i16 = 12;
const FETCH_FIRST_TOPIC_ID_VERSION: i16 = 13;
const FETCH_FIRST_NODE_ENDPOINTS_VERSION: i16 = 16;
/// Partition-level tag of `diverging_epoch`.
const TAG_DIVERGING_EPOCH: u32 = 0;
/// Partition-level tag of `current_leader`.
const TAG_CURRENT_LEADER: u32 = 1;
/// Response-level tag of `node_endpoints`.
const TAG_NODE_ENDPOINTS: u32 = 0;
/// Estimated header bytes per partition, to size the header buffer once.
const PARTITION_HEADER_BYTES_ESTIMATE: usize = 64;

#[derive(Debug, Clone)]
pub struct FetchResponse {
    pub throttle_time_ms: i32,
    pub error_code: i16,
    pub session_id: i32,
    pub topics: Vec<FetchTopicResponse>,
    /// Sent on v16+ (tagged); lets clients reach a new leader directly.
    pub node_endpoints: Vec<NodeEndpoint>,
}

#[derive(Debug, Clone)]
pub struct FetchTopicResponse {
    /// Used up to v12.
    pub name: String,
    /// Used from v13.
    pub topic_id: [u8; 16],
    pub partitions: Vec<FetchPartitionResponse>,
}

#[derive(Debug, Clone)]
pub struct FetchPartitionResponse {
    pub index: i32,
    pub error_code: i16,
    pub high_watermark: i64,
    pub last_stable_offset: i64,
    pub log_start_offset: i64,
    /// `(producer id, first offset)` of aborted transactions in range, for
    /// read_committed; `None` is sent as a null array.
    pub aborted_transactions: Option<Vec<(i64, i64)>>,
    pub preferred_read_replica: i32,
    /// Whole batches, sent as they are. Empty = a zero-length records field.
    pub records: Vec<RecordsChunk>,
    /// `(leader id, leader epoch)`, sent on v12+ (tagged) when set, e.g.
    /// with NOT_LEADER_OR_FOLLOWER.
    pub current_leader: Option<(i32, i32)>,
    /// `(epoch, end offset)`, sent on v12+ (tagged) when set: the fetcher's
    /// `last_fetched_epoch` is not this log's at its fetch offset, so it
    /// must truncate to that end offset first (KIP-320).
    pub diverging_epoch: Option<(i32, i64)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeEndpoint {
    pub node_id: i32,
    pub host: String,
    pub port: i32,
    pub rack: Option<String>,
}

/// Encodes the response body (everything after the response header) as
/// parts to send in order: header bytes as `RecordsChunk::Memory`,
/// interleaved with the records chunks untouched. Returns the parts and
/// their total length in bytes.
///
/// `version` must be within 4..=18 (the handler only dispatches supported
/// versions; anything else is a programmer error).
pub fn encode_fetch_response(resp: FetchResponse, version: i16) -> (Vec<RecordsChunk>, usize) {
    assert!(
        (FETCH_MIN_VERSION..=FETCH_MAX_VERSION).contains(&version),
        "fetch response version {version} not encodable"
    );
    let flexible = version >= FETCH_FIRST_FLEXIBLE_VERSION;
    let partition_count: usize = resp.topics.iter().map(|t| t.partitions.len()).sum();
    let mut buf = BytesMut::with_capacity(
        32 + resp.topics.iter().map(|t| t.name.len() + 24).sum::<usize>()
            + partition_count * PARTITION_HEADER_BYTES_ESTIMATE,
    );
    let mut parts: Vec<RecordsChunk> = Vec::with_capacity(2 * partition_count + 1);
    let mut total = 0usize;

    buf.put_i32(resp.throttle_time_ms);
    if version >= FETCH_FIRST_SESSION_VERSION {
        buf.put_i16(resp.error_code);
        buf.put_i32(resp.session_id);
    }
    put_array_len(&mut buf, resp.topics.len(), flexible);
    for topic in resp.topics {
        if version >= FETCH_FIRST_TOPIC_ID_VERSION {
            buf.put_slice(&topic.topic_id);
        } else {
            put_string(&mut buf, &topic.name, flexible);
        }
        put_array_len(&mut buf, topic.partitions.len(), flexible);
        for p in topic.partitions {
            buf.put_i32(p.index);
            buf.put_i16(p.error_code);
            buf.put_i64(p.high_watermark);
            buf.put_i64(p.last_stable_offset);
            if version >= FETCH_FIRST_LOG_START_VERSION {
                buf.put_i64(p.log_start_offset);
            }
            match &p.aborted_transactions {
                None => put_null_array(&mut buf, flexible),
                Some(aborted) => {
                    put_array_len(&mut buf, aborted.len(), flexible);
                    for &(producer_id, first_offset) in aborted {
                        buf.put_i64(producer_id);
                        buf.put_i64(first_offset);
                        if flexible {
                            put_empty_tagged_fields(&mut buf);
                        }
                    }
                }
            }
            if version >= FETCH_FIRST_PREFERRED_REPLICA_VERSION {
                buf.put_i32(p.preferred_read_replica);
            }
            let records_len: usize = p.records.iter().map(RecordsChunk::len).sum();
            if flexible {
                put_uvarint(&mut buf, records_len as u32 + 1);
            } else {
                buf.put_i32(records_len as i32);
            }
            if records_len > 0 {
                total += buf.len();
                parts.push(RecordsChunk::Memory(buf.split().freeze()));
                total += records_len;
                parts.extend(p.records.into_iter().filter(|c| !c.is_empty()));
            }
            if flexible {
                // Tagged fields in ascending tag order.
                let tags =
                    u32::from(p.diverging_epoch.is_some()) + u32::from(p.current_leader.is_some());
                put_uvarint(&mut buf, tags);
                if let Some((epoch, end_offset)) = p.diverging_epoch {
                    put_uvarint(&mut buf, TAG_DIVERGING_EPOCH);
                    // epoch, end offset, and the struct's empty tags.
                    put_uvarint(&mut buf, 4 + 8 + 1);
                    buf.put_i32(epoch);
                    buf.put_i64(end_offset);
                    put_empty_tagged_fields(&mut buf);
                }
                if let Some((leader_id, leader_epoch)) = p.current_leader {
                    put_uvarint(&mut buf, TAG_CURRENT_LEADER);
                    // leader id, epoch, and the struct's empty tags.
                    put_uvarint(&mut buf, 4 + 4 + 1);
                    buf.put_i32(leader_id);
                    buf.put_i32(leader_epoch);
                    put_empty_tagged_fields(&mut buf);
                }
            }
        }
        if flexible {
            put_empty_tagged_fields(&mut buf);
        }
    }
    if flexible {
        if version >= FETCH_FIRST_NODE_ENDPOINTS_VERSION && !resp.node_endpoints.is_empty() {
            let mut endpoints = BytesMut::new();
            put_array_len(&mut endpoints, resp.node_endpoints.len(), true);
            for e in &resp.node_endpoints {
                endpoints.put_i32(e.node_id);
                put_string(&mut endpoints, &e.host, true);
                endpoints.put_i32(e.port);
                put_nullable_string(&mut endpoints, e.rack.as_deref(), true);
                put_empty_tagged_fields(&mut endpoints);
            }
            put_uvarint(&mut buf, 1);
            put_uvarint(&mut buf, TAG_NODE_ENDPOINTS);
            put_uvarint(&mut buf, endpoints.len() as u32);
            debug_assert!(uvarint_len(endpoints.len() as u32) <= 5);
            buf.put_slice(&endpoints);
        } else {
            put_empty_tagged_fields(&mut buf);
        }
    }
    total += buf.len();
    parts.push(RecordsChunk::Memory(buf.freeze()));
    (parts, total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::FileRange;
    use bytes::Bytes;
    use glommio::io::DmaFile;
    use kafka_protocol::messages::FetchResponse as KpFetch;
    use kafka_protocol::protocol::Decodable;
    use std::rc::Rc;

    /// Concatenates the parts, reading file ranges with direct reads.
    async fn flatten(parts: &[RecordsChunk]) -> Bytes {
        let mut out = Vec::new();
        for p in parts {
            match p {
                RecordsChunk::Memory(b) => out.extend_from_slice(b),
                RecordsChunk::Loaded(r) => out.extend_from_slice(r),
                RecordsChunk::File(r) => {
                    out.extend_from_slice(&r.file.read_at(r.position, r.len).await.unwrap())
                }
            }
        }
        Bytes::from(out)
    }

    fn sample(file: Rc<DmaFile>) -> FetchResponse {
        let mem = Bytes::from_static(b"MEMORY-BATCH-BYTES");
        FetchResponse {
            throttle_time_ms: 5,
            error_code: 0,
            session_id: 99,
            topics: vec![
                FetchTopicResponse {
                    name: "orders".into(),
                    topic_id: [7; 16],
                    partitions: vec![
                        FetchPartitionResponse {
                            index: 0,
                            error_code: 0,
                            high_watermark: 100,
                            last_stable_offset: 90,
                            log_start_offset: 3,
                            aborted_transactions: Some(vec![(4, 10), (5, 20)]),
                            preferred_read_replica: -1,
                            records: vec![
                                RecordsChunk::File(FileRange {
                                    file: file.clone(),
                                    buffered: None,
                                    position: 4,
                                    len: 6,
                                }),
                                RecordsChunk::Memory(mem.clone()),
                            ],
                            current_leader: None,
                            diverging_epoch: None,
                        },
                        FetchPartitionResponse {
                            index: 1,
                            error_code: 6,
                            high_watermark: -1,
                            last_stable_offset: -1,
                            log_start_offset: -1,
                            aborted_transactions: None,
                            preferred_read_replica: -1,
                            records: vec![],
                            current_leader: Some((1001, 4)),
                            diverging_epoch: Some((2, 77)),
                        },
                    ],
                },
                FetchTopicResponse {
                    name: "empty".into(),
                    topic_id: [9; 16],
                    partitions: vec![],
                },
            ],
            node_endpoints: vec![NodeEndpoint {
                node_id: 1001,
                host: "broker-1".into(),
                port: 9093,
                rack: None,
            }],
        }
    }

    #[test]
    fn every_version_decodes_with_kafka_protocol() {
        crate::runtime::run_test_executor(every_version_decodes);
    }

    async fn every_version_decodes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("segment");
        std::fs::write(&path, b"0123FILE-B!rest").unwrap();
        let file = Rc::new(DmaFile::open(&path).await.unwrap());
        for version in FETCH_MIN_VERSION..=FETCH_MAX_VERSION {
            let resp = sample(file.clone());
            let mem_ptr = match &resp.topics[0].partitions[0].records[1] {
                RecordsChunk::Memory(b) => b.as_ptr(),
                RecordsChunk::Loaded(_) | RecordsChunk::File(_) => unreachable!(),
            };
            let (parts, total) = encode_fetch_response(resp, version);
            // The memory records are passed through, not copied.
            assert!(parts
                .iter()
                .any(|p| matches!(p, RecordsChunk::Memory(b) if b.as_ptr() == mem_ptr)));
            let mut bytes = flatten(&parts).await;
            assert_eq!(bytes.len(), total, "v{version}");
            let d = KpFetch::decode(&mut bytes, version).unwrap();
            assert_eq!(bytes.len(), 0, "v{version}: trailing bytes");
            assert_eq!(d.throttle_time_ms, 5);
            if version >= 7 {
                assert_eq!((d.error_code, d.session_id), (0, 99));
            }
            assert_eq!(d.responses.len(), 2);
            let t = &d.responses[0];
            if version >= 13 {
                assert_eq!(t.topic_id.as_bytes(), &[7u8; 16]);
            } else {
                assert_eq!(t.topic.0.as_str(), "orders");
            }
            let p0 = &t.partitions[0];
            assert_eq!(p0.high_watermark, 100);
            assert_eq!(p0.last_stable_offset, 90);
            if version >= 5 {
                assert_eq!(p0.log_start_offset, 3);
            }
            let aborted = p0.aborted_transactions.as_ref().unwrap();
            assert_eq!(aborted.len(), 2);
            assert_eq!((aborted[1].producer_id.0, aborted[1].first_offset), (5, 20));
            assert_eq!(
                p0.records.as_deref(),
                Some(&b"FILE-BMEMORY-BATCH-BYTES"[..])
            );
            let p1 = &t.partitions[1];
            assert_eq!(p1.error_code, 6);
            assert!(p1.aborted_transactions.is_none());
            assert_eq!(p1.records.as_deref(), Some(&b""[..]));
            if version >= 12 {
                assert_eq!(
                    (
                        p1.current_leader.leader_id.0,
                        p1.current_leader.leader_epoch
                    ),
                    (1001, 4)
                );
                assert_eq!(
                    (p1.diverging_epoch.epoch, p1.diverging_epoch.end_offset),
                    (2, 77)
                );
                assert_eq!(p0.diverging_epoch.epoch, -1, "unset stays unset");
            }
            if version >= 16 {
                assert_eq!(d.node_endpoints.len(), 1);
                assert_eq!(d.node_endpoints[0].host.as_str(), "broker-1");
                assert_eq!(d.node_endpoints[0].port, 9093);
            } else {
                assert!(d.node_endpoints.is_empty());
            }
        }
    }

    #[test]
    fn empty_response_is_one_part() {
        crate::runtime::run_test_executor(empty_response);
    }

    async fn empty_response() {
        let resp = FetchResponse {
            throttle_time_ms: 0,
            error_code: 0,
            session_id: 0,
            topics: vec![],
            node_endpoints: vec![],
        };
        for version in [4, 12, 16] {
            let (parts, total) = encode_fetch_response(resp.clone(), version);
            assert_eq!(parts.len(), 1);
            let mut b = flatten(&parts).await;
            assert_eq!(b.len(), total);
            assert!(KpFetch::decode(&mut b, version).is_ok());
        }
    }
}
