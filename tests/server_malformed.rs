//! Malformed input never crashes the broker and never disturbs other
//! connections: negative length, 2^31-1 length then close, random garbage,
//! impossible array lengths, unknown API key, unknown versions, truncated
//! frames. Well-formed frames split at every byte or several to a write are
//! answered in order. After each, a connection opened before it still
//! answers, and fresh librdkafka clients produce and consume.

mod common;

use common::client::{self, await_deliveries, create_topic, send, TestMessage};
use common::raw::{RawClient, ReadOutcome};
use common::{Broker, BrokerOpts};
use kafka_protocol::messages::{ApiKey, ApiVersionsRequest, ApiVersionsResponse, MetadataRequest};
use kafka_protocol::protocol::{Decodable, Encodable};
use kafka_protocol::ResponseError;
use std::net::Shutdown;
use std::time::Duration;

const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);
const CLIENT_TIMEOUT: Duration = Duration::from_secs(30);

/// A broker, a topic and a bystander connection opened before the abuse.
struct Fixture {
    broker: Broker,
    bystander: RawClient,
    produced: usize,
}

fn fixture() -> Fixture {
    let broker = Broker::start(BrokerOpts::default().cores(2));
    create_topic(&broker.bootstrap(), "malformed", 2, &[]);
    let bystander = RawClient::connect(broker.port);
    Fixture {
        broker,
        bystander,
        produced: 0,
    }
}

impl Fixture {
    /// The broker is alive, the bystander connection answers, and a fresh
    /// rdkafka producer and consumer work.
    fn assert_still_serving(&mut self) {
        self.broker.assert_alive();
        let md = self
            .bystander
            .request::<MetadataRequest>(9, &MetadataRequest::default().with_topics(Some(vec![])));
        assert_eq!(
            md.brokers.len(),
            2,
            "the bystander connection still answers"
        );

        let producer = client::producer(&self.broker.bootstrap(), &[("acks", "all")]);
        let m = TestMessage {
            id: self.produced,
            key: format!("k{}", self.produced).into_bytes(),
            value: format!("still-serving-{}", self.produced).into_bytes(),
            headers: vec![],
        };
        send(&producer, "malformed", &m);
        let d = await_deliveries(&producer, 1, CLIENT_TIMEOUT);
        assert!(
            d[0].error.is_none(),
            "produce after malformed input: {:?}",
            d[0].error
        );
        self.produced += 1;
        let consumed = client::consume(
            &self.broker.bootstrap(),
            "malformed",
            2,
            self.produced,
            Duration::from_millis(200),
            CLIENT_TIMEOUT,
        );
        assert_eq!(
            consumed.len(),
            self.produced,
            "every message so far is consumed once"
        );
        self.broker.assert_alive();
    }
}

/// A request header v1 (api key, version, correlation id, client id) + body.
fn header_v1(api_key: i16, version: i16, correlation_id: i32) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&api_key.to_be_bytes());
    b.extend_from_slice(&version.to_be_bytes());
    b.extend_from_slice(&correlation_id.to_be_bytes());
    b.extend_from_slice(&(-1i16).to_be_bytes()); // null client id
    b
}

#[test]
fn negative_length_closes_only_that_connection() {
    let mut f = fixture();
    let mut c = RawClient::connect(f.broker.port);
    c.send_bytes(&(-1i32).to_be_bytes());
    c.assert_closed(CLOSE_TIMEOUT, "negative frame length");
    let mut c = RawClient::connect(f.broker.port_of(1));
    c.send_bytes(&i32::MIN.to_be_bytes());
    c.assert_closed(CLOSE_TIMEOUT, "i32::MIN frame length");
    f.assert_still_serving();
}

#[test]
fn huge_length_then_close_is_survived() {
    let mut f = fixture();
    let mut c = RawClient::connect(f.broker.port);
    c.send_bytes(&i32::MAX.to_be_bytes());
    // Above socket.request.max.bytes: the broker closes without waiting for
    // the body (it must not try to allocate 2 GiB either).
    c.assert_closed(CLOSE_TIMEOUT, "2^31-1 frame length");
    // And the same prefix from a client that hangs up at once.
    let mut c = RawClient::connect(f.broker.port_of(1));
    c.send_bytes(&i32::MAX.to_be_bytes());
    drop(c);
    f.assert_still_serving();
}

#[test]
fn random_garbage_is_survived() {
    // GARBAGE_SEED=<seed> replays a run.
    let seed: u64 = std::env::var("GARBAGE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    println!("garbage seed {seed}");
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(seed);
    let mut f = fixture();
    for round in 0..20 {
        let len = rand::Rng::random_range(&mut rng, 1..8192usize);
        let garbage: Vec<u8> = (0..len).map(|_| rand::Rng::random(&mut rng)).collect();
        let port = f.broker.port_of(round % 2);
        let mut c = RawClient::connect(port);
        c.send_bytes(&garbage);
        // Whatever the broker makes of it (close, error, or waiting for the
        // rest of a plausible frame), hang up and move on.
        let _ = c.read_frame(Duration::from_millis(50));
        drop(c);
    }
    // Garbage that looks like a well-framed request with a random body.
    for round in 0..20 {
        let len = rand::Rng::random_range(&mut rng, 0..512usize);
        let mut body = header_v1(ApiKey::Metadata as i16, 9, round);
        body.extend((0..len).map(|_| rand::Rng::random::<u8>(&mut rng)));
        let mut c = RawClient::connect(f.broker.port);
        c.send_frame(&body);
        let _ = c.read_frame(Duration::from_millis(50));
    }
    f.assert_still_serving();
}

/// A few bytes that declare an array no frame could hold: Metadata v0 with
/// 2^31-1 topics, and v9 (flexible) with a compact array of 2^32-2. The
/// decoder sizes its `Vec` from the count before it reads an element; the
/// broker must close the connection, not abort on the allocation.
#[test]
fn impossible_array_lengths_close_only_that_connection() {
    let mut f = fixture();
    let mut body = header_v1(ApiKey::Metadata as i16, 0, 1);
    body.extend_from_slice(&i32::MAX.to_be_bytes());
    let mut c = RawClient::connect(f.broker.port);
    c.send_frame(&body);
    c.assert_closed(CLOSE_TIMEOUT, "Metadata v0 with 2^31-1 topics");
    let mut body = header_v1(ApiKey::Metadata as i16, 9, 2);
    body.push(0); // request header v2: no tagged fields
    body.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0x0f]); // u32::MAX = 2^32-2 topics
    let mut c = RawClient::connect(f.broker.port_of(1));
    c.send_frame(&body);
    c.assert_closed(CLOSE_TIMEOUT, "Metadata v9 with 2^32-2 topics");
    f.assert_still_serving();
}

#[test]
fn unknown_api_key_closes_the_connection() {
    let mut f = fixture();
    let mut c = RawClient::connect(f.broker.port);
    c.send_frame(&header_v1(999, 0, 7));
    c.assert_closed(CLOSE_TIMEOUT, "api key 999");
    let mut c = RawClient::connect(f.broker.port);
    c.send_frame(&header_v1(-5, 0, 7));
    c.assert_closed(CLOSE_TIMEOUT, "api key -5");
    f.assert_still_serving();
}

/// ApiVersions at an unknown version is answered with UNSUPPORTED_VERSION in
/// the v0 format, listing ApiVersions' own range, so the client can retry.
#[test]
fn api_versions_v99_gets_unsupported_version_in_v0_format() {
    let mut f = fixture();
    let mut c = RawClient::connect(f.broker.port);
    let mut body = Vec::new();
    let header = kafka_protocol::messages::RequestHeader::default()
        .with_request_api_key(ApiKey::ApiVersions as i16)
        .with_request_api_version(99)
        .with_correlation_id(42);
    header.encode(&mut body, 2).expect("encode header v2");
    ApiVersionsRequest::default()
        .encode(&mut body, 3)
        .expect("encode body as v3");
    c.send_frame(&body);
    let mut frame = match c.read_frame(CLOSE_TIMEOUT) {
        ReadOutcome::Frame(f) => f,
        other => panic!("expected an ApiVersions answer, got {other:?}"),
    };
    let correlation = i32::from_be_bytes([frame[0], frame[1], frame[2], frame[3]]);
    assert_eq!(
        correlation, 42,
        "response header v0: just the correlation id"
    );
    let _ = bytes::Buf::get_i32(&mut frame);
    let resp = ApiVersionsResponse::decode(&mut frame, 0).expect("a v0 body");
    assert_eq!(resp.error_code, ResponseError::UnsupportedVersion.code());
    let own = resp
        .api_keys
        .iter()
        .find(|k| k.api_key == ApiKey::ApiVersions as i16)
        .expect("ApiVersions' own range is listed");
    assert_eq!(own.min_version, 0);
    assert!(own.max_version >= 3);
    // The connection stays usable: a supported version is then answered.
    let resp = c.request(3, &ApiVersionsRequest::default());
    assert_eq!(resp.error_code, 0);
    assert!(resp
        .api_keys
        .iter()
        .any(|k| k.api_key == ApiKey::Produce as i16));
    f.assert_still_serving();
}

/// Any other API at a version the broker does not implement: Kafka closes
/// the connection.
#[test]
fn other_api_at_unknown_version_closes_the_connection() {
    let mut f = fixture();
    for (key, version) in [
        (ApiKey::Metadata, 99i16),
        (ApiKey::Produce, 99),
        (ApiKey::Fetch, 2),
        (ApiKey::Produce, 1),
    ] {
        let mut c = RawClient::connect(f.broker.port);
        c.send_frame(&header_v1(key as i16, version, 1));
        c.assert_closed(CLOSE_TIMEOUT, &format!("{key:?} v{version}"));
    }
    f.assert_still_serving();
}

#[test]
fn truncated_frames_are_survived() {
    let mut f = fixture();
    // The length promises more than ever arrives, then the client hangs up.
    let mut c = RawClient::connect(f.broker.port);
    c.send_bytes(&100i32.to_be_bytes());
    c.send_bytes(&header_v1(ApiKey::Metadata as i16, 9, 1));
    let _ = c.read_frame(Duration::from_millis(100));
    drop(c);
    // A large frame (50 MiB, under socket.request.max.bytes) of which only
    // the header ever arrives.
    let mut c = RawClient::connect(f.broker.port);
    c.send_bytes(&(50i32 << 20).to_be_bytes());
    c.send_bytes(&header_v1(ApiKey::Produce as i16, 9, 1));
    let _ = c.read_frame(Duration::from_millis(100));
    drop(c);
    // Half a length prefix, then a half-close.
    let c = std::net::TcpStream::connect(("127.0.0.1", f.broker.port)).expect("connect");
    std::io::Write::write_all(&mut &c, &[0, 0]).expect("write");
    c.shutdown(Shutdown::Write).expect("half-close");
    drop(c);
    // A complete frame whose body stops mid-request: the body does not
    // decode, so the broker closes the connection.
    let mut body = header_v1(ApiKey::Metadata as i16, 4, 1);
    body.extend_from_slice(&5i32.to_be_bytes()); // 5 topics follow ... but none do
    let mut c = RawClient::connect(f.broker.port);
    c.send_frame(&body);
    c.assert_closed(CLOSE_TIMEOUT, "truncated Metadata body");
    // A Produce whose header is cut inside the client id.
    let mut body = Vec::new();
    body.extend_from_slice(&(ApiKey::Produce as i16).to_be_bytes());
    body.extend_from_slice(&9i16.to_be_bytes());
    body.extend_from_slice(&1i32.to_be_bytes());
    body.extend_from_slice(&20i16.to_be_bytes()); // a 20-byte client id ... of 3 bytes
    body.extend_from_slice(b"abc");
    let mut c = RawClient::connect(f.broker.port_of(1));
    c.send_frame(&body);
    c.assert_closed(CLOSE_TIMEOUT, "truncated request header");
    f.assert_still_serving();
}

#[test]
fn frames_split_or_coalesced_are_answered_in_order() {
    let mut f = fixture();
    let mut c = RawClient::connect(f.broker.port);
    let md = MetadataRequest::default().with_topics(None);
    // Three requests in one write.
    let mut bytes = Vec::new();
    let mut ids = Vec::new();
    for _ in 0..3 {
        let (frame, id) = c.encode_frame(9, &md);
        bytes.extend_from_slice(&frame);
        ids.push(id);
    }
    // ... the last one cut in two, its second half sent a moment later.
    let (frame, id) = c.encode_frame(9, &md);
    let cut = frame.len() / 2;
    bytes.extend_from_slice(&frame[..cut]);
    c.send_bytes(&bytes);
    std::thread::sleep(Duration::from_millis(50));
    c.send_bytes(&frame[cut..]);
    ids.push(id);
    for id in ids {
        let r = c.receive::<MetadataRequest>(9, id);
        assert!(
            r.topics
                .iter()
                .any(|t| t.name.as_ref().is_some_and(|n| n.as_str() == "malformed")),
            "a complete Metadata answer"
        );
    }
    // One request a byte at a time.
    let (frame, id) = c.encode_frame(3, &ApiVersionsRequest::default());
    for b in &frame {
        c.send_bytes(std::slice::from_ref(b));
        std::thread::sleep(Duration::from_millis(2));
    }
    let r = c.receive::<ApiVersionsRequest>(3, id);
    assert_eq!(
        r.error_code, 0,
        "ApiVersions answered after a byte-by-byte send"
    );
    f.assert_still_serving();
}
