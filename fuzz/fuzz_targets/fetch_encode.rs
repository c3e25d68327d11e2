//! The Fetch response encoder on structured inputs, decoded again with
//! kafka-protocol: `fjord::fuzzing::fetch_encode`.
#![no_main]

use arbitrary::Arbitrary;
use bytes::Bytes;
use fjord::protocol::fetch::{
    FetchPartitionResponse, FetchResponse, FetchTopicResponse, NodeEndpoint,
};
use fjord::record::RecordsChunk;
use libfuzzer_sys::fuzz_target;

/// Longest string put in a response: Kafka's topic name limit. The encoder
/// writes only names of existing topics and the broker's own host names.
const STRING_BYTES_MAX: usize = 249;

#[derive(Arbitrary, Debug)]
struct Input {
    version: i16,
    throttle_time_ms: i32,
    error_code: i16,
    session_id: i32,
    topics: Vec<Topic>,
    node_endpoints: Vec<Endpoint>,
}

#[derive(Arbitrary, Debug)]
struct Topic {
    name: String,
    topic_id: [u8; 16],
    partitions: Vec<Partition>,
}

#[derive(Arbitrary, Debug)]
struct Partition {
    index: i32,
    error_code: i16,
    high_watermark: i64,
    last_stable_offset: i64,
    log_start_offset: i64,
    aborted_transactions: Option<Vec<(i64, i64)>>,
    preferred_read_replica: i32,
    records: Vec<Vec<u8>>,
    current_leader: Option<(i32, i32)>,
}

#[derive(Arbitrary, Debug)]
struct Endpoint {
    node_id: i32,
    host: String,
    port: i32,
    rack: Option<String>,
}

fn bounded(mut s: String) -> String {
    if s.len() > STRING_BYTES_MAX {
        let mut at = STRING_BYTES_MAX;
        while !s.is_char_boundary(at) {
            at -= 1;
        }
        s.truncate(at);
    }
    s
}

fuzz_target!(|input: Input| {
    let resp = FetchResponse {
        throttle_time_ms: input.throttle_time_ms,
        error_code: input.error_code,
        session_id: input.session_id,
        topics: input
            .topics
            .into_iter()
            .map(|t| FetchTopicResponse {
                name: bounded(t.name),
                topic_id: t.topic_id,
                partitions: t
                    .partitions
                    .into_iter()
                    .map(|p| FetchPartitionResponse {
                        index: p.index,
                        error_code: p.error_code,
                        high_watermark: p.high_watermark,
                        last_stable_offset: p.last_stable_offset,
                        log_start_offset: p.log_start_offset,
                        aborted_transactions: p.aborted_transactions,
                        preferred_read_replica: p.preferred_read_replica,
                        records: p
                            .records
                            .into_iter()
                            .map(|r| RecordsChunk::Memory(Bytes::from(r)))
                            .collect(),
                        current_leader: p.current_leader,
                    })
                    .collect(),
            })
            .collect(),
        node_endpoints: input
            .node_endpoints
            .into_iter()
            .map(|e| NodeEndpoint {
                node_id: e.node_id,
                host: bounded(e.host),
                port: e.port,
                rack: e.rack.map(bounded),
            })
            .collect(),
    };
    fjord::fuzzing::fetch_encode(resp, input.version);
});
