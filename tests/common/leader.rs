//! A fjord broker as the leader a replica fetcher copies from
//! (`tests/replica_fetcher.rs`, `tests/replica_partition.rs`): what to
//! write into its partition 0 and how to name the topic to the fetcher.

use super::client::producer;
use super::raw::{only_partition, produce_request, RawClient};
use super::Broker;
use bytes::Bytes;
use fjord::record::{BatchBuilder, Compression};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{MetadataRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use rdkafka::producer::{BaseRecord, Producer};
use std::time::Duration;

/// How long a client call of these helpers may take.
const CLIENT_WAIT: Duration = Duration::from_secs(30);

/// The topic's id, from Metadata (a fetcher names topics by id, v13+).
pub fn topic_id(broker: &Broker, topic: &str) -> [u8; 16] {
    let mut raw = RawClient::connect(broker.port_of(0));
    let md = raw.request(
        12,
        &MetadataRequest::default().with_topics(Some(vec![MetadataRequestTopic::default()
            .with_name(Some(TopicName(StrBytes::from_string(topic.to_string()))))])),
    );
    *md.topics[0].topic_id.as_bytes()
}

/// A batch of one record with `value`.
pub fn one_batch(value: &str) -> Bytes {
    BatchBuilder::new(Compression::None)
        .record(None, Some(value.as_bytes()), &[], 1_700_000_000_000)
        .build()
        .freeze()
}

/// `n` plain batches of one record each into partition 0 (acks=1).
pub fn produce_plain(broker: &Broker, topic: &str, n: usize) {
    let mut raw = RawClient::connect(broker.port_of(0));
    for i in 0..n {
        let resp = raw.request(
            9,
            &produce_request(topic, 0, 1, one_batch(&format!("p{i}"))),
        );
        assert_eq!(only_partition(&resp).error_code, 0);
    }
}

/// Into partition 0: `idempotent` records of an idempotent producer, then
/// a committed and an aborted transaction of `per_txn` records each, by
/// the transactional id `txn_id`.
pub fn produce_idempotent_and_transactions(
    broker: &Broker,
    topic: &str,
    idempotent: usize,
    per_txn: usize,
    txn_id: &str,
) {
    let p = producer(&broker.bootstrap(), &[("enable.idempotence", "true")]);
    for i in 0..idempotent {
        p.send(BaseRecord::<(), _, usize>::with_opaque_to(topic, 0).payload(&format!("i{i}")))
            .expect("enqueue");
    }
    p.flush(CLIENT_WAIT).expect("idempotent records delivered");
    let t = producer(&broker.bootstrap(), &[("transactional.id", txn_id)]);
    t.init_transactions(CLIENT_WAIT).expect("init");
    for commit in [true, false] {
        t.begin_transaction().expect("begin");
        for i in 0..per_txn {
            t.send(BaseRecord::<(), _, usize>::with_opaque_to(topic, 0).payload(&format!("t{i}")))
                .expect("enqueue");
        }
        t.flush(CLIENT_WAIT).expect("flush");
        if commit {
            t.commit_transaction(CLIENT_WAIT).expect("commit");
        } else {
            t.abort_transaction(CLIENT_WAIT).expect("abort");
        }
    }
}
