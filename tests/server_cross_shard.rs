//! Cross-shard waits are bounded (`--cross-shard-timeout-ms`): with one
//! shard not handling messages from the others (`--debug-stall-shard`, a
//! hidden testing flag), requests that need it answer Kafka's timeout error
//! within the bound instead of hanging, the broker keeps serving everything
//! else, and a metadata change the slow shard missed reaches it once it
//! resumes.

mod common;

use common::raw::{only_partition, produce_request, RawClient};
use common::{wait_for, Broker, BrokerOpts};
use fjord::record::{BatchBuilder, Compression};
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::{
    ApiVersionsRequest, CreateTopicsRequest, FindCoordinatorRequest, InitProducerIdRequest,
    MetadataRequest, ProduceRequest, ProducerId, TopicName, TransactionalId,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use std::time::Duration;

/// The broker's cross-shard timeout in these tests.
const CROSS_SHARD_TIMEOUT_MS: u64 = 2_000;
/// How long shard 1 stalls in the convergence test: well past the timeout
/// and shorter than the raw client's read timeout, so that without the
/// timeouts the CreateTopics is answered (wrongly, with success) rather
/// than the test timing out.
const STALL_MS: u64 = 10_000;
/// Bound on waiting for the stalled shard to catch up once it resumes.
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(60);

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn code(e: ResponseError) -> i16 {
    e.code()
}

fn create_topics(port: u16, name: &str, partitions: i32) -> (i16, Option<String>) {
    let mut c = RawClient::connect(port);
    let req = CreateTopicsRequest::default()
        .with_timeout_ms(60_000)
        .with_topics(vec![CreatableTopic::default()
            .with_name(TopicName(s(name)))
            .with_num_partitions(partitions)
            .with_replication_factor(1)]);
    let resp = c.request::<CreateTopicsRequest>(5, &req);
    let t = &resp.topics[0];
    (
        t.error_code,
        t.error_message.as_ref().map(|m| m.to_string()),
    )
}

/// The leader node of each partition of `topic` as shard `port` sees it
/// (empty if it does not know the topic).
fn leaders(port: u16, topic: &str) -> Vec<i32> {
    use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
    let mut c = RawClient::connect(port);
    let req = MetadataRequest::default()
        .with_topics(Some(vec![
            MetadataRequestTopic::default().with_name(Some(TopicName(s(topic))))
        ]))
        .with_allow_auto_topic_creation(false);
    let resp = c.request::<MetadataRequest>(9, &req);
    let t = &resp.topics[0];
    if t.error_code != 0 {
        return Vec::new();
    }
    let mut ps: Vec<_> = t
        .partitions
        .iter()
        .map(|p| (p.partition_index, p.leader_id.0))
        .collect();
    ps.sort();
    ps.into_iter().map(|(_, l)| l).collect()
}

fn produce_to(port: u16, topic: &str, partition: i32) -> i16 {
    let batch = BatchBuilder::new(Compression::None)
        .record(None, Some(b"cross-shard"), &[], 1_700_000_000_000)
        .build()
        .freeze();
    let mut c = RawClient::connect(port);
    let resp = c.request::<ProduceRequest>(9, &produce_request(topic, partition, -1, batch));
    only_partition(&resp).error_code
}

fn api_versions_ok(port: u16) {
    let mut c = RawClient::connect(port);
    let resp = c.request::<ApiVersionsRequest>(0, &ApiVersionsRequest::default());
    assert_eq!(resp.error_code, 0);
}

/// Shard 1 stalls for `STALL_MS`: a CreateTopics at shard 0 (the
/// controller) is persisted and applied by shard 0 but not acked by shard 1
/// in time, so it gets REQUEST_TIMED_OUT after the timeout; shard 0 serves
/// the topic meanwhile, a retry says TOPIC_ALREADY_EXISTS at once, and once
/// shard 1 resumes it catches up and serves its partition of the topic.
#[test]
fn a_metadata_change_times_out_at_a_stalled_shard_and_converges_later() {
    let broker = Broker::start(
        BrokerOpts::default()
            .cores(2)
            .arg("--cross-shard-timeout-ms")
            .arg(CROSS_SHARD_TIMEOUT_MS.to_string())
            .arg("--debug-stall-shard")
            .arg("1")
            .arg("--debug-stall-shard-ms")
            .arg(STALL_MS.to_string()),
    );
    let (shard0, shard1) = (broker.port_of(0), broker.port_of(1));
    let topic = "cross-shard-late";

    let (error, message) = create_topics(shard0, topic, 2);
    assert_eq!(
        error,
        code(ResponseError::RequestTimedOut),
        "CreateTopics while shard 1 stalls: {message:?}"
    );
    // The change is saved and shard 0 serves it: a retry finds the topic,
    // and the partition shard 0 leads takes records.
    assert_eq!(
        create_topics(shard0, topic, 2).0,
        code(ResponseError::TopicAlreadyExists)
    );
    let leaders0 = leaders(shard0, topic);
    assert_eq!(leaders0, vec![0, 1], "shard 0 serves the new topic");
    assert_eq!(produce_to(shard0, topic, 0), 0);
    // Shard 1 still serves its own clients.
    api_versions_ok(shard1);

    // Shard 1 resumes and applies the change it missed.
    wait_for(
        CONVERGE_TIMEOUT,
        "shard 1 serves the topic created while it stalled",
        || (leaders(shard1, topic) == vec![0, 1]).then_some(()),
    );
    wait_for(CONVERGE_TIMEOUT, "shard 1 takes records", || {
        (produce_to(shard1, topic, 1) == 0).then_some(())
    });
    // And later changes are answered in full again.
    assert_eq!(create_topics(shard0, "cross-shard-after", 2).0, 0);
    assert_eq!(leaders(shard1, "cross-shard-after"), vec![0, 1]);
}

/// Shard 0 (the controller) never handles messages from shard 1: at shard
/// 1, a transactional InitProducerId and a FindCoordinator (which create
/// `__transaction_state` through the controller) get COORDINATOR_NOT_AVAILABLE
/// and a CreateTopics REQUEST_TIMED_OUT, each after the timeout instead of
/// never. Shard 0's own clients still change metadata, shard 1 applies the
/// changes and serves produce.
#[test]
fn requests_waiting_for_a_stalled_controller_time_out() {
    let broker = Broker::start(
        BrokerOpts::default()
            .cores(2)
            .arg("--cross-shard-timeout-ms")
            .arg(CROSS_SHARD_TIMEOUT_MS.to_string())
            .arg("--debug-stall-shard")
            .arg("0"),
    );
    let (shard0, shard1) = (broker.port_of(0), broker.port_of(1));

    let mut c = RawClient::connect(shard1);
    let init = InitProducerIdRequest::default()
        .with_transactional_id(Some(TransactionalId(s("cross-shard-txn"))))
        .with_transaction_timeout_ms(60_000)
        .with_producer_id(ProducerId(-1))
        .with_producer_epoch(-1);
    assert_eq!(
        c.request::<InitProducerIdRequest>(4, &init).error_code,
        code(ResponseError::CoordinatorNotAvailable),
        "transactional InitProducerId while the controller stalls"
    );
    let find = FindCoordinatorRequest::default()
        .with_key_type(1)
        .with_coordinator_keys(vec![s("cross-shard-txn")]);
    let found = c.request::<FindCoordinatorRequest>(4, &find);
    assert_eq!(
        found.coordinators[0].error_code,
        code(ResponseError::CoordinatorNotAvailable)
    );
    let (error, message) = create_topics(shard1, "cross-shard-never", 1);
    assert_eq!(
        error,
        code(ResponseError::RequestTimedOut),
        "CreateTopics forwarded to a stalled controller: {message:?}"
    );
    // An idempotent producer's InitProducerId answers at once either way
    // (a producer-id block, or COORDINATOR_LOAD_IN_PROGRESS until one comes).
    let plain = InitProducerIdRequest::default()
        .with_transactional_id(None)
        .with_transaction_timeout_ms(60_000)
        .with_producer_id(ProducerId(-1))
        .with_producer_epoch(-1);
    let e = c.request::<InitProducerIdRequest>(4, &plain).error_code;
    assert!(
        e == 0 || e == code(ResponseError::CoordinatorLoadInProgress),
        "idempotent InitProducerId: {e}"
    );

    // The controller still serves its own shard's clients, and shard 1
    // applies what it broadcasts.
    let topic = "cross-shard-local";
    assert_eq!(create_topics(shard0, topic, 2).0, 0);
    assert_eq!(leaders(shard1, topic), vec![0, 1]);
    assert_eq!(produce_to(shard1, topic, 1), 0);
    assert_eq!(produce_to(shard0, topic, 0), 0);
    api_versions_ok(shard1);
}
