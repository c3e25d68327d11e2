//! The partition side of transaction markers on a replicated partition
//! (`docs/replication.md` §4.6, §4.7), three nodes in network namespaces
//! (`common::netns`), one shard each, a topic of three replicas with
//! `min.insync.replicas=3`, markers sent to its leader as WriteTxnMarkers
//! (as a coordinator on another node sends them):
//! - a marker of a coordinator epoch older than the last one the
//!   partition took for the producer is refused with
//!   TRANSACTION_COORDINATOR_FENCED (Kafka's `checkCoordinatorEpoch`); the
//!   same or a newer epoch is taken;
//! - with a follower's node killed and out of the ISR (two members, below
//!   the minimum), a marker is refused with NOT_ENOUGH_REPLICAS, as Kafka's
//!   acks=-1 marker append is (a coordinator retries it); the node back in
//!   the ISR, the same marker is taken.

mod common;

use common::cluster::{addr, create_assigned};
use common::netns::Net;
use common::raw::RawClient;
use common::Broker;
use kafka_protocol::messages::write_txn_markers_request::{
    WritableTxnMarker, WritableTxnMarkerTopic,
};
use kafka_protocol::messages::{ProducerId, TopicName, WriteTxnMarkersRequest};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use std::time::Duration;

const NODES: usize = 3;
/// `--broker-session-timeout-ms`, shortened from Kafka's 9 s.
const SESSION_TIMEOUT_MS: u64 = 3000;
const SETTLE: Duration = Duration::from_secs(60);
const TOPIC: &str = "markers";
const PRODUCER: i64 = 7;

/// A WriteTxnMarkers (v1) COMMIT for [`PRODUCER`] at epoch 0, written by a
/// coordinator in `coordinator_epoch`, on partition 0 of [`TOPIC`] at
/// `broker`: the partition's error code.
fn commit(broker: &Broker, coordinator_epoch: i32) -> i16 {
    let req = WriteTxnMarkersRequest::default().with_markers(vec![WritableTxnMarker::default()
        .with_producer_id(ProducerId(PRODUCER))
        .with_producer_epoch(0)
        .with_transaction_result(true)
        .with_coordinator_epoch(coordinator_epoch)
        .with_topics(vec![WritableTxnMarkerTopic::default()
            .with_name(TopicName(StrBytes::from_string(TOPIC.to_string())))
            .with_partition_indexes(vec![0])])]);
    let resp = RawClient::connect_to(addr(broker)).request::<WriteTxnMarkersRequest>(1, &req);
    resp.markers[0].topics[0].partitions[0].error_code
}

/// Partition 0 of [`TOPIC`] in `broker`'s Metadata: (leader, ISR sorted).
fn listed(broker: &Broker) -> Option<(i32, Vec<i32>)> {
    let p = common::cluster::partition(broker, TOPIC, 0)?.sorted();
    Some((p.leader, p.isr))
}

fn wait_listed(broker: &Broker, want: (i32, &[i32])) {
    common::wait_for(SETTLE, &format!("{TOPIC} listed as {want:?}"), || {
        let (leader, isr) = listed(broker)?;
        (leader == want.0 && isr == want.1).then_some(())
    });
}

#[test]
fn markers_are_fenced_by_coordinator_epoch_and_need_the_minimum_isr() {
    let net = Net::new(NODES);
    let mut brokers = common::cluster::start_all(&net, NODES, SESSION_TIMEOUT_MS, SETTLE, |_| &[]);
    create_assigned(
        &brokers,
        TOPIC,
        &[0, 1000, 2000],
        &[("min.insync.replicas", "3")],
    );
    wait_listed(&brokers[0], (0, &[0, 1000, 2000]));

    // A coordinator in epoch 3 writes a marker; a zombie in epoch 2 is
    // refused; epoch 3 again and a newer one are taken.
    assert_eq!(commit(&brokers[0], 3), 0);
    assert_eq!(
        commit(&brokers[0], 2),
        ResponseError::TransactionCoordinatorFenced.code(),
        "a marker of an older coordinator epoch"
    );
    assert_eq!(commit(&brokers[0], 3), 0);
    assert_eq!(commit(&brokers[0], 4), 0);
    assert_eq!(
        commit(&brokers[0], 3),
        ResponseError::TransactionCoordinatorFenced.code(),
        "fenced by the newest epoch taken"
    );

    // A follower's node dies: the ISR shrinks below the minimum, and a
    // marker is refused before it is appended.
    brokers[2].kill9();
    wait_listed(&brokers[0], (0, &[0, 1000]));
    assert_eq!(
        commit(&brokers[0], 4),
        ResponseError::NotEnoughReplicas.code(),
        "a marker while the ISR is below min.insync.replicas"
    );
    brokers[2].restart();
    wait_listed(&brokers[0], (0, &[0, 1000, 2000]));
    assert_eq!(commit(&brokers[0], 4), 0);
}
