//! A raw Kafka client over a blocking `std::net::TcpStream`: requests are
//! encoded with the `kafka-protocol` crate (request header + body, 4-byte
//! length prefix), responses are read frame by frame and decoded with the
//! same crate. It can also send arbitrary bytes, to test framing errors.
//!
//! Every read has a timeout ([`RAW_READ_TIMEOUT_MS`] unless told), so a
//! missing response fails a test instead of hanging it.

use bytes::{Buf, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable, Request, StrBytes};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Default bound on waiting for one response.
pub const RAW_READ_TIMEOUT_MS: u64 = 15_000;
/// Largest response frame the raw client accepts.
pub const RAW_FRAME_MAX_BYTES: usize = 256 << 20;

/// What a read from the connection found.
#[derive(Debug)]
pub enum ReadOutcome {
    /// One complete response frame (without the length prefix).
    Frame(Bytes),
    /// The broker closed the connection (EOF or reset).
    Closed,
    /// Nothing arrived before the timeout.
    TimedOut,
}

pub struct RawClient {
    stream: TcpStream,
    next_correlation_id: i32,
    /// Bytes read but not yet returned as a frame.
    pending: BytesMut,
}

impl RawClient {
    /// Connects to `127.0.0.1:port`.
    pub fn connect(port: u16) -> RawClient {
        let stream = TcpStream::connect(("127.0.0.1", port))
            .unwrap_or_else(|e| panic!("connect to 127.0.0.1:{port}: {e}"));
        stream.set_nodelay(true).expect("set TCP_NODELAY");
        RawClient {
            stream,
            next_correlation_id: 1,
            pending: BytesMut::new(),
        }
    }

    /// Connects to `addr` (a broker in a network namespace, `netns`).
    pub fn connect_to(addr: std::net::SocketAddr) -> RawClient {
        let stream = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
        stream.set_nodelay(true).expect("set TCP_NODELAY");
        RawClient {
            stream,
            next_correlation_id: 1,
            pending: BytesMut::new(),
        }
    }

    /// Encodes and sends `req` at `version`; returns its correlation id.
    pub fn send<R: Request>(&mut self, version: i16, req: &R) -> i32 {
        let (framed, correlation_id) = self.encode_frame(version, req);
        self.send_bytes(&framed);
        correlation_id
    }

    /// Encodes `req` at `version` as a whole frame (length prefix included)
    /// without sending it; returns the bytes and the correlation id.
    #[allow(dead_code)] // not every test binary sends frames by hand
    pub fn encode_frame<R: Request>(&mut self, version: i16, req: &R) -> (Vec<u8>, i32) {
        let key = ApiKey::try_from(R::KEY).expect("a known api key");
        let correlation_id = self.next_correlation_id;
        self.next_correlation_id += 1;
        let header = RequestHeader::default()
            .with_request_api_key(R::KEY)
            .with_request_api_version(version)
            .with_correlation_id(correlation_id)
            .with_client_id(Some(StrBytes::from_static_str("fjord-itest-raw")));
        let mut body = BytesMut::new();
        header
            .encode(&mut body, key.request_header_version(version))
            .expect("encode request header");
        req.encode(&mut body, version).expect("encode request body");
        (framed(&body), correlation_id)
    }

    /// Sends `body` with its 4-byte length prefix.
    pub fn send_frame(&mut self, body: &[u8]) {
        self.send_bytes(&framed(body));
    }

    /// Sends bytes exactly as given (no framing).
    pub fn send_bytes(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("write to the broker");
    }

    /// Writes as much of `bytes` as the broker takes within `timeout`
    /// (it may stop reading its socket, or close it: a broken pipe or a
    /// reset ends the write); returns how many were written.
    #[allow(dead_code)]
    pub fn send_bytes_within(&mut self, bytes: &[u8], timeout: Duration) -> usize {
        let deadline = Instant::now() + timeout;
        let mut sent = 0;
        while sent < bytes.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            self.stream
                .set_write_timeout(Some(left.max(Duration::from_millis(1))))
                .expect("set write timeout");
            match self.stream.write(&bytes[sent..]) {
                Ok(0) => break,
                Ok(n) => sent += n,
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::WouldBlock
                            | ErrorKind::TimedOut
                            | ErrorKind::BrokenPipe
                            | ErrorKind::ConnectionReset
                    ) =>
                {
                    break
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => panic!("write to the broker: {e}"),
            }
        }
        self.stream
            .set_write_timeout(None)
            .expect("clear write timeout");
        sent
    }

    /// Reads the response to `correlation_id` (the next frame) and decodes it.
    pub fn receive<R: Request>(&mut self, version: i16, correlation_id: i32) -> R::Response {
        let key = ApiKey::try_from(R::KEY).expect("a known api key");
        let mut frame = match self.read_frame(Duration::from_millis(RAW_READ_TIMEOUT_MS)) {
            ReadOutcome::Frame(f) => f,
            other => panic!("expected a {key:?} v{version} response, got {other:?}"),
        };
        let header = ResponseHeader::decode(&mut frame, key.response_header_version(version))
            .expect("decode response header");
        assert_eq!(
            header.correlation_id, correlation_id,
            "responses come back in order"
        );
        let resp = R::Response::decode(&mut frame, version).expect("decode response body");
        assert_eq!(
            frame.remaining(),
            0,
            "the {key:?} v{version} response has trailing bytes"
        );
        resp
    }

    /// Sends `req` and waits for its response.
    pub fn request<R: Request>(&mut self, version: i16, req: &R) -> R::Response {
        let id = self.send(version, req);
        self.receive::<R>(version, id)
    }

    /// Reads one response frame, or tells that the connection closed or
    /// nothing came within `timeout`.
    pub fn read_frame(&mut self, timeout: Duration) -> ReadOutcome {
        let deadline = Instant::now() + timeout;
        loop {
            if self.pending.len() >= 4 {
                let len = i32::from_be_bytes([
                    self.pending[0],
                    self.pending[1],
                    self.pending[2],
                    self.pending[3],
                ]);
                assert!(
                    (0..RAW_FRAME_MAX_BYTES as i32).contains(&len),
                    "the broker sent a frame of length {len}"
                );
                if self.pending.len() >= 4 + len as usize {
                    self.pending.advance(4);
                    return ReadOutcome::Frame(self.pending.split_to(len as usize).freeze());
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return ReadOutcome::TimedOut;
            }
            self.stream
                .set_read_timeout(Some(left.max(Duration::from_millis(1))))
                .expect("set read timeout");
            let mut chunk = [0u8; 64 * 1024];
            match self.stream.read(&mut chunk) {
                Ok(0) => return ReadOutcome::Closed,
                Ok(n) => self.pending.extend_from_slice(&chunk[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return ReadOutcome::Closed,
            }
        }
    }

    /// Asserts the broker closes this connection within `timeout` (any
    /// frame that arrives first is a failure).
    pub fn assert_closed(&mut self, timeout: Duration, what: &str) {
        match self.read_frame(timeout) {
            ReadOutcome::Closed => {}
            other => panic!("{what}: expected the broker to close the connection, got {other:?}"),
        }
    }
}

/// `body` behind its 4-byte big-endian length prefix: one Kafka frame.
fn framed(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + body.len());
    out.extend_from_slice(&(body.len() as i32).to_be_bytes());
    out.extend_from_slice(body);
    out
}

/// A Produce request for one partition of `topic` carrying `records` as is.
pub fn produce_request(
    topic: &str,
    partition: i32,
    acks: i16,
    records: Bytes,
) -> kafka_protocol::messages::ProduceRequest {
    use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
    use kafka_protocol::messages::TopicName;
    kafka_protocol::messages::ProduceRequest::default()
        .with_acks(acks)
        .with_timeout_ms(30_000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(TopicName(StrBytes::from_string(topic.to_string())))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(partition)
                .with_records(Some(records))])])
}

/// Produces `n` records of values `v0`, `v1`, ... to `partition` of `topic`
/// through `raw`, one batch each (Produce v9, acks=1), asserting each is
/// accepted.
pub fn produce_values(raw: &mut RawClient, topic: &str, partition: i32, n: usize) {
    use fjord::record::{BatchBuilder, Compression};
    for i in 0..n {
        let batch = BatchBuilder::new(Compression::None)
            .record(
                None,
                Some(format!("v{i}").as_bytes()),
                &[],
                1_700_000_000_000,
            )
            .build()
            .freeze();
        let resp = raw.request(9, &produce_request(topic, partition, 1, batch));
        assert_eq!(only_partition(&resp).error_code, 0);
    }
}

/// The port of `group`'s coordinator, asked with FindCoordinator v4 of the
/// broker at `port`.
pub fn group_coordinator_port(port: u16, group: &str) -> u16 {
    let (error, coordinator) = find_group_coordinator(&mut RawClient::connect(port), group);
    assert_eq!(error, 0, "FindCoordinator failed");
    coordinator
}

/// FindCoordinator v4 of `group` through `raw`: (error code, port).
fn find_group_coordinator(raw: &mut RawClient, group: &str) -> (i16, u16) {
    use kafka_protocol::messages::FindCoordinatorRequest;
    let found = raw.request(
        4,
        &FindCoordinatorRequest::default()
            .with_key_type(0)
            .with_coordinator_keys(vec![StrBytes::from_string(group.to_string())]),
    );
    let c = &found.coordinators[0];
    (c.error_code, c.port as u16)
}

/// How long [`wait_group_coordinator_port`] waits between look-ups.
pub const COORDINATOR_RETRY_MS: u64 = 200;

/// [`group_coordinator_port`], asked again while the broker has no
/// coordinator for `group` yet (a fresh broker, like stock Kafka, creates
/// `__consumer_offsets` on the first look-up and answers
/// COORDINATOR_NOT_AVAILABLE until it is ready); panics after `timeout`.
pub fn wait_group_coordinator_port(port: u16, group: &str, timeout: Duration) -> u16 {
    // (Not `common::wait_for`: the benchmarks include this file alone.)
    let deadline = Instant::now() + timeout;
    let mut raw = RawClient::connect(port);
    loop {
        let (error, coordinator) = find_group_coordinator(&mut raw, group);
        if error == 0 {
            return coordinator;
        }
        assert!(
            Instant::now() < deadline,
            "no coordinator for {group} after {timeout:?} (error {error})"
        );
        std::thread::sleep(Duration::from_millis(COORDINATOR_RETRY_MS));
    }
}

/// The single partition answer of a one-partition Produce response.
pub fn only_partition(
    resp: &kafka_protocol::messages::ProduceResponse,
) -> &kafka_protocol::messages::produce_response::PartitionProduceResponse {
    assert_eq!(resp.responses.len(), 1, "one topic in the response");
    assert_eq!(
        resp.responses[0].partition_responses.len(),
        1,
        "one partition in the response"
    );
    &resp.responses[0].partition_responses[0]
}

/// One AddPartitionsToTxn v3 (a version-1 client's) of `partition` of
/// `topic` for transactional id `id` at `producer_id`/`epoch`: the
/// partition's error code.
pub fn add_partition_to_txn_v3(
    raw: &mut RawClient,
    id: &str,
    producer_id: i64,
    epoch: i16,
    topic: &str,
    partition: i32,
) -> i16 {
    use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
    use kafka_protocol::messages::{
        AddPartitionsToTxnRequest, ProducerId, TopicName, TransactionalId,
    };
    let s = |v: &str| StrBytes::from_string(v.to_string());
    let req = AddPartitionsToTxnRequest::default()
        .with_v3_and_below_transactional_id(TransactionalId(s(id)))
        .with_v3_and_below_producer_id(ProducerId(producer_id))
        .with_v3_and_below_producer_epoch(epoch)
        .with_v3_and_below_topics(vec![AddPartitionsToTxnTopic::default()
            .with_name(TopicName(s(topic)))
            .with_partitions(vec![partition])]);
    let r = raw.request(3, &req);
    r.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code
}

/// InitProducerId for transactional id `id` (transaction timeout 60 s),
/// retried while the coordinator loads: (producer id, epoch) or the error.
pub fn init_transactional(raw: &mut RawClient, id: &str) -> Result<(i64, i16), i16> {
    use kafka_protocol::messages::{InitProducerIdRequest, ProducerId, TransactionalId};
    use kafka_protocol::ResponseError;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let req = InitProducerIdRequest::default()
            .with_transactional_id(Some(TransactionalId(StrBytes::from_string(id.to_string()))))
            .with_transaction_timeout_ms(60_000)
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1);
        let r = raw.request(4, &req);
        // Retriable while the coordinator loads (and, on stock Kafka, while
        // `__transaction_state` is being created and its leaders elected).
        let retriable = [
            ResponseError::CoordinatorLoadInProgress,
            ResponseError::NotCoordinator,
            ResponseError::CoordinatorNotAvailable,
        ]
        .iter()
        .any(|e| e.code() == r.error_code);
        if retriable && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(50));
            continue;
        }
        return if r.error_code == 0 {
            Ok((r.producer_id.0, r.producer_epoch))
        } else {
            Err(r.error_code)
        };
    }
}

/// [`add_partition_to_txn_v3`], retried while the previous transaction's
/// markers are still being completed (CONCURRENT_TRANSACTIONS), as
/// clients do.
pub fn add_partition_to_txn_retrying(
    raw: &mut RawClient,
    id: &str,
    producer_id: i64,
    epoch: i16,
    topic: &str,
    partition: i32,
) -> i16 {
    let concurrent = kafka_protocol::ResponseError::ConcurrentTransactions.code();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let code = add_partition_to_txn_v3(raw, id, producer_id, epoch, topic, partition);
        if code != concurrent || std::time::Instant::now() >= deadline {
            return code;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// EndTxn v5 (transaction version 2): returns (error, new epoch).
pub fn end_txn_v5(
    raw: &mut RawClient,
    id: &str,
    producer_id: i64,
    epoch: i16,
    commit: bool,
) -> (i16, i16) {
    use kafka_protocol::messages::{EndTxnRequest, ProducerId, TransactionalId};
    let req = EndTxnRequest::default()
        .with_transactional_id(TransactionalId(StrBytes::from_string(id.to_string())))
        .with_producer_id(ProducerId(producer_id))
        .with_producer_epoch(epoch)
        .with_committed(commit);
    let r = raw.request(5, &req);
    (r.error_code, r.producer_epoch)
}

/// Sends `body` as request `api_key` v`version` with a v2 (flexible)
/// request header, and returns the response body after its header (v0
/// for ApiVersions, v1 otherwise): for versions the `kafka-protocol`
/// crate has no schema for, whose bodies a test writes and reads by hand.
pub fn call_flexible(raw: &mut RawClient, api_key: ApiKey, version: i16, body: &[u8]) -> Bytes {
    use bytes::BufMut;
    use fjord::protocol::wire::{put_empty_tagged_fields, put_nullable_string, Reader};
    let correlation_id = 4343;
    let mut frame = BytesMut::new();
    frame.put_i16(api_key as i16);
    frame.put_i16(version);
    frame.put_i32(correlation_id);
    put_nullable_string(&mut frame, Some("fjord-itest-flexible"), false);
    put_empty_tagged_fields(&mut frame);
    frame.put_slice(body);
    raw.send_frame(&frame);
    let resp = match raw.read_frame(Duration::from_secs(15)) {
        ReadOutcome::Frame(f) => f,
        other => panic!("expected a {api_key:?} v{version} response, got {other:?}"),
    };
    let mut r = Reader::new(&resp);
    assert_eq!(r.i32("correlation id").unwrap(), correlation_id);
    if api_key != ApiKey::ApiVersions {
        r.skip_tagged_fields("response header").unwrap();
    }
    resp.slice(r.position()..)
}

/// A WriteTxnMarkers (v1) COMMIT for producer 7 at epoch 0 on `partitions`
/// of `topic` through `raw`: each partition's error code.
pub fn commit_markers_v1(raw: &mut RawClient, topic: &str, partitions: &[i32]) -> Vec<i16> {
    use kafka_protocol::messages::write_txn_markers_request::{
        WritableTxnMarker, WritableTxnMarkerTopic,
    };
    use kafka_protocol::messages::{ProducerId, TopicName, WriteTxnMarkersRequest};
    let req = WriteTxnMarkersRequest::default().with_markers(vec![WritableTxnMarker::default()
        .with_producer_id(ProducerId(7))
        .with_producer_epoch(0)
        .with_transaction_result(true)
        .with_coordinator_epoch(0)
        .with_topics(vec![WritableTxnMarkerTopic::default()
            .with_name(TopicName(StrBytes::from_string(topic.to_string())))
            .with_partition_indexes(partitions.to_vec())])]);
    let resp = raw.request::<WriteTxnMarkersRequest>(1, &req);
    resp.markers[0].topics[0]
        .partitions
        .iter()
        .map(|p| p.error_code)
        .collect()
}
