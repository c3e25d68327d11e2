//! ACL authorization (`--authorizer standard`) against a real broker: the
//! ACL APIs (raw and through Kafka's own `kafka-acls`), a refusal with
//! Kafka's error code for every API fjord serves, the minimal ACLs Kafka
//! documents for a producer, an idempotent producer, a transactional
//! producer and a consumer group (librdkafka), PREFIXED and DENY, super
//! users, `--allow-everyone-if-no-acl-found`, Metadata hiding topics, the
//! audit log, and ACLs surviving a restart (`kafka-acls` itself is driven
//! in `tests/interop_cli.rs`).
//!
//! Until SASL lands every connection is `User:ANONYMOUS`, so the tests
//! grant and deny ANONYMOUS. The first ACLs are created while ANONYMOUS is
//! a super user (`--super-users`); the broker is then restarted without
//! it, which also shows the ACLs are read back from the metadata log.
//!
//! The codes asserted in `every_api_refuses_a_principal_without_acls` were
//! compared once with stock Kafka 4.4 (StandardAuthorizer, a DENY ALL on
//! `*` topics, groups and transactional ids for ANONYMOUS; see
//! docs/security.md).

mod common;

use common::client::{self, create_topic};
use common::raw::RawClient;
use common::{Broker, BrokerOpts};
use kafka_protocol::messages::create_acls_request::AclCreation;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use rdkafka::consumer::Consumer;
use rdkafka::producer::Producer;
use std::time::Duration;

const SUPER_ANONYMOUS: &str = "--super-users=User:ANONYMOUS";

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

// Kafka's wire codes (auth::acl).
const TOPIC: i8 = 2;
const GROUP: i8 = 3;
const CLUSTER: i8 = 4;
const TXN_ID: i8 = 5;
const LITERAL: i8 = 3;
const PREFIXED: i8 = 4;
const ALL: i8 = 2;
const READ: i8 = 3;
const WRITE: i8 = 4;
const DESCRIBE: i8 = 8;
const CLUSTER_ACTION: i8 = 9;
const DENY: i8 = 2;
const ALLOW: i8 = 3;

fn acl(rt: i8, name: &str, pattern: i8, op: i8, perm: i8) -> AclCreation {
    AclCreation::default()
        .with_resource_type(rt)
        .with_resource_name(s(name))
        .with_resource_pattern_type(pattern)
        .with_principal(s("User:ANONYMOUS"))
        .with_host(s("*"))
        .with_operation(op)
        .with_permission_type(perm)
}

fn allow(rt: i8, name: &str, op: i8) -> AclCreation {
    acl(rt, name, LITERAL, op, ALLOW)
}

/// Creates `acls` through CreateAcls, asserting each succeeded.
fn create_acls(port: u16, acls: Vec<AclCreation>) {
    let resp =
        RawClient::connect(port).request(3, &CreateAclsRequest::default().with_creations(acls));
    for r in &resp.results {
        assert_eq!(r.error_code, 0, "CreateAcls: {:?}", r.error_message);
    }
}

/// A one-shard broker with `--authorizer standard` (and `args`) where
/// `topics` exist and ANONYMOUS has exactly `acls`: set up while ANONYMOUS
/// is a super user, then restarted without that.
fn secured(args: &[&str], topics: &[&str], acls: Vec<AclCreation>) -> Broker {
    let mut opts = BrokerOpts::default()
        .cores(1)
        .arg("--authorizer=standard")
        .arg(SUPER_ANONYMOUS);
    for a in args {
        opts = opts.arg(*a);
    }
    let mut broker = Broker::start(opts);
    for t in topics {
        create_topic(&broker.bootstrap(), t, 1, &[]);
    }
    if !acls.is_empty() {
        create_acls(broker.port, acls);
    }
    broker
        .opts_mut()
        .extra_args
        .retain(|a| a != SUPER_ANONYMOUS);
    broker.restart();
    broker
}

/// Produces `n` records to `topic` with a producer of `extra` settings;
/// the error of each delivery (None: delivered).
fn produce(bootstrap: &str, topic: &str, n: usize, extra: &[(&str, &str)]) -> Vec<Option<String>> {
    let p = client::producer(bootstrap, extra);
    produce_with(&p, topic, n)
}

fn produce_with(p: &client::TestProducer, topic: &str, n: usize) -> Vec<Option<String>> {
    let before = p.context().deliveries.lock().expect("lock").len();
    for id in 0..n {
        client::send(
            p,
            topic,
            &client::TestMessage {
                id,
                key: format!("k{id}").into_bytes(),
                value: id.to_string().into_bytes(),
                headers: vec![],
            },
        );
    }
    client::await_deliveries(p, before + n, Duration::from_secs(60))[before..]
        .iter()
        .map(|d| d.error.clone())
        .collect()
}

/// The first error a subscribed consumer's poll reports (panics if none
/// comes within `timeout`).
fn poll_error(c: &rdkafka::consumer::BaseConsumer, timeout: Duration) -> String {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        assert!(
            std::time::Instant::now() < deadline,
            "no error within {timeout:?}"
        );
        if let Some(Err(e)) = c.poll(Duration::from_millis(100)) {
            return e.to_string();
        }
    }
}

#[test]
fn acl_apis_answer_security_disabled_without_an_authorizer() {
    let broker = Broker::start(BrokerOpts::default().cores(1));
    let mut raw = RawClient::connect(broker.port);
    let security_disabled = ResponseError::SecurityDisabled.code();
    let d = raw.request(
        3,
        &DescribeAclsRequest::default()
            .with_resource_type_filter(1)
            .with_pattern_type_filter(1)
            .with_operation(1)
            .with_permission_type(1),
    );
    assert_eq!(d.error_code, security_disabled);
    let c = raw.request(
        3,
        &CreateAclsRequest::default().with_creations(vec![allow(TOPIC, "t", READ)]),
    );
    assert_eq!(c.results[0].error_code, security_disabled);
    // Everything else is served as before: no checks at all.
    create_topic(&broker.bootstrap(), "open", 1, &[]);
}

#[test]
fn acl_apis_validate_filter_and_bindings_and_delete_what_matches() {
    let broker = Broker::start(
        BrokerOpts::default()
            .cores(1)
            .arg("--authorizer=standard")
            .arg(SUPER_ANONYMOUS),
    );
    let mut raw = RawClient::connect(broker.port);
    let invalid = ResponseError::InvalidRequest.code();
    let c = raw.request(
        3,
        &CreateAclsRequest::default().with_creations(vec![
            allow(TOPIC, "orders", READ),
            allow(CLUSTER, "not-the-cluster", DESCRIBE),
            allow(TOPIC, "", READ),
            acl(TOPIC, "x", 2, READ, ALLOW), // pattern MATCH
            allow(TOPIC, "orders", 1),       // operation ANY
            acl(TOPIC, "orders-", PREFIXED, WRITE, ALLOW),
        ]),
    );
    let codes: Vec<i16> = c.results.iter().map(|r| r.error_code).collect();
    assert_eq!(codes, [0, invalid, invalid, invalid, invalid, 0]);
    // A filter with an UNKNOWN element is INVALID_REQUEST.
    let d = raw.request(
        3,
        &DescribeAclsRequest::default()
            .with_resource_type_filter(1)
            .with_pattern_type_filter(0)
            .with_operation(1)
            .with_permission_type(1),
    );
    assert_eq!(d.error_code, invalid);
    // MATCH on a name finds the literal and the prefix that apply to it.
    let d = raw.request(
        3,
        &DescribeAclsRequest::default()
            .with_resource_type_filter(TOPIC)
            .with_resource_name_filter(Some(s("orders-eu")))
            .with_pattern_type_filter(2)
            .with_principal_filter(None)
            .with_host_filter(None)
            .with_operation(1)
            .with_permission_type(1),
    );
    assert_eq!(d.error_code, 0);
    let names: Vec<(String, i8)> = d
        .resources
        .iter()
        .map(|r| (r.resource_name.to_string(), r.pattern_type))
        .collect();
    assert_eq!(names, [("orders-".to_string(), PREFIXED)]);
    // Delete by a filter; a second filter matching the same binding
    // reports nothing more.
    let filter = delete_acls_request::DeleteAclsFilter::default()
        .with_resource_name_filter(None)
        .with_principal_filter(None)
        .with_host_filter(None)
        .with_resource_type_filter(TOPIC)
        .with_pattern_type_filter(1)
        .with_operation(1)
        .with_permission_type(1);
    let del = raw.request(
        3,
        &DeleteAclsRequest::default().with_filters(vec![filter.clone(), filter]),
    );
    assert_eq!(del.filter_results[0].error_code, 0);
    assert_eq!(del.filter_results[0].matching_acls.len(), 2);
    assert_eq!(del.filter_results[1].matching_acls.len(), 0);
    // A super user is allowed whatever the ACLs say, a DENY included.
    create_acls(
        broker.port,
        vec![acl(CLUSTER, "kafka-cluster", LITERAL, ALL, DENY)],
    );
    let d = raw.request(
        3,
        &DescribeAclsRequest::default()
            .with_resource_type_filter(CLUSTER)
            .with_resource_name_filter(None)
            .with_pattern_type_filter(1)
            .with_principal_filter(None)
            .with_host_filter(None)
            .with_operation(1)
            .with_permission_type(1),
    );
    assert_eq!((d.error_code, d.resources.len()), (0, 1), "super user");
}

/// Every API fjord serves, sent by ANONYMOUS with no ACL at all (and
/// `--allow-everyone-if-no-acl-found` off): Kafka's refusal, by API.
#[test]
fn every_api_refuses_a_principal_without_acls() {
    let broker = secured(&[], &["t"], Vec::new());
    let stderr_from = broker.stderr_len();
    assert_refusals(broker.port, Cluster::Denied);
    let audit = broker.stderr_since(stderr_from);
    assert!(
        audit.contains("authorization denied")
            && audit.contains("User:ANONYMOUS")
            && audit.contains("127.0.0.1:"),
        "denials are audited with principal and client address:\n{audit}"
    );
}

/// The same requests against stock Kafka (run by hand): a peer started
/// with `scripts/kafka-peer.sh start --conf
/// authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
/// --conf allow.everyone.if.no.acl.found=true`, a topic `t`, and DENY ALL
/// for `User:ANONYMOUS` on the `*` topic, group and transactional id; the
/// cluster checks are skipped, or, with `FJORD_ACL_PEER_CLUSTER=denied`
/// after an ALLOW CLUSTER_ACTION on the cluster for ANONYMOUS (its
/// controller connects as ANONYMOUS too and needs it; the ACL makes every
/// other cluster operation denied), all but the CLUSTER_ACTION ones run.
/// `FJORD_ACL_PEER_PORT=19092 cargo test --test server_acls -- --ignored`.
#[test]
#[ignore]
fn stock_kafka_answers_the_same_codes() {
    let port: u16 = std::env::var("FJORD_ACL_PEER_PORT")
        .expect("FJORD_ACL_PEER_PORT")
        .parse()
        .expect("a port");
    let cluster = match std::env::var("FJORD_ACL_PEER_CLUSTER").as_deref() {
        Ok("denied") => Cluster::DeniedButClusterAction,
        _ => Cluster::Allowed,
    };
    assert_refusals(port, cluster);
}

/// What the principal of [`assert_refusals`] may do on the cluster.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Cluster {
    /// Nothing (fjord, no ACLs).
    Denied,
    /// Everything: the cluster checks are skipped.
    Allowed,
    /// Only CLUSTER_ACTION is allowed (a stock Kafka peer, whose
    /// controller connects as the same principal and needs it).
    DeniedButClusterAction,
}

/// Sends every API as a principal with no ACL on topic `t`, group `g`,
/// transactional id `tx` (and, with `cluster`, on the cluster) and asserts
/// Kafka's refusal of each.
fn assert_refusals(port: u16, mode: Cluster) {
    let cluster = mode != Cluster::Allowed;
    let cluster_action = mode == Cluster::Denied;
    let mut raw = RawClient::connect(port);
    let topic_denied = ResponseError::TopicAuthorizationFailed.code();
    let group_denied = ResponseError::GroupAuthorizationFailed.code();
    let cluster_denied = ResponseError::ClusterAuthorizationFailed.code();
    let txn_denied = ResponseError::TransactionalIdAuthorizationFailed.code();
    let tn = || TopicName(s("t"));

    // Produce: WRITE on the topic.
    let batch = fjord::record::BatchBuilder::new(fjord::record::Compression::None)
        .record(None, Some(b"v"), &[], 1_700_000_000_000)
        .build()
        .freeze();
    let r = raw.request(9, &common::raw::produce_request("t", 0, 1, batch.clone()));
    assert_eq!(
        common::raw::only_partition(&r).error_code,
        topic_denied,
        "Produce"
    );
    // ... checked before existence: no disclosure of what exists.
    let r = raw.request(9, &common::raw::produce_request("nope", 0, 1, batch));
    assert_eq!(
        common::raw::only_partition(&r).error_code,
        topic_denied,
        "Produce, missing topic"
    );

    // Fetch: READ on the topic.
    let fetch = FetchRequest::default()
        .with_max_wait_ms(0)
        .with_topics(vec![fetch_request::FetchTopic::default()
            .with_topic(tn())
            .with_partitions(vec![fetch_request::FetchPartition::default()
                .with_partition(0)
                .with_partition_max_bytes(1 << 20)])]);
    let r = raw.request(12, &fetch);
    assert_eq!(
        r.responses[0].partitions[0].error_code, topic_denied,
        "Fetch"
    );

    // ListOffsets: DESCRIBE on the topic.
    let r = raw.request(
        7,
        &ListOffsetsRequest::default().with_topics(vec![
            list_offsets_request::ListOffsetsTopic::default()
                .with_name(tn())
                .with_partitions(vec![list_offsets_request::ListOffsetsPartition::default()
                    .with_partition_index(0)
                    .with_timestamp(-1)]),
        ]),
    );
    assert_eq!(
        r.topics[0].partitions[0].error_code, topic_denied,
        "ListOffsets"
    );

    if cluster_action {
        // OffsetForLeaderEpoch: CLUSTER_ACTION on the cluster, else DESCRIBE on
        // the topic.
        let r = raw.request(
            4,
            &OffsetForLeaderEpochRequest::default().with_topics(vec![
                offset_for_leader_epoch_request::OffsetForLeaderTopic::default()
                    .with_topic(tn())
                    .with_partitions(vec![
                        offset_for_leader_epoch_request::OffsetForLeaderPartition::default()
                            .with_partition(0)
                            .with_leader_epoch(0),
                    ]),
            ]),
        );
        assert_eq!(
            r.topics[0].partitions[0].error_code, topic_denied,
            "OffsetForLeaderEpoch"
        );
    }

    // Metadata: all topics hides `t`; named, it is refused; a missing one
    // is not auto-created without CREATE.
    let r = raw.request(12, &MetadataRequest::default().with_topics(None));
    assert!(
        r.topics.is_empty(),
        "Metadata lists no topic: {:?}",
        r.topics
    );
    let r = raw.request(
        12,
        &MetadataRequest::default()
            .with_topics(Some(vec![
                metadata_request::MetadataRequestTopic::default().with_name(Some(tn())),
                metadata_request::MetadataRequestTopic::default()
                    .with_name(Some(TopicName(s("auto")))),
            ]))
            .with_allow_auto_topic_creation(true),
    );
    assert_eq!(r.topics[0].error_code, topic_denied, "Metadata, named");
    assert_eq!(
        r.topics[1].error_code, topic_denied,
        "Metadata, auto-create"
    );

    // DescribeTopicPartitions: DESCRIBE on the topic.
    let r = raw.request(
        0,
        &DescribeTopicPartitionsRequest::default()
            .with_topics(vec![
                describe_topic_partitions_request::TopicRequest::default().with_name(tn()),
            ])
            .with_response_partition_limit(100),
    );
    assert_eq!(
        r.topics[0].error_code, topic_denied,
        "DescribeTopicPartitions"
    );

    if cluster {
        // CreateTopics: CREATE on the cluster or the topic.
        let r = raw.request(
            7,
            &CreateTopicsRequest::default()
                .with_topics(vec![create_topics_request::CreatableTopic::default()
                    .with_name(TopicName(s("new")))
                    .with_num_partitions(1)
                    .with_replication_factor(1)])
                .with_timeout_ms(10_000),
        );
        assert_eq!(r.topics[0].error_code, topic_denied, "CreateTopics");
    }

    if cluster {
        // DeleteTopics: DELETE on the cluster or the topic.
        let r = raw.request(
            5,
            &DeleteTopicsRequest::default()
                .with_topic_names(vec![tn()])
                .with_timeout_ms(10_000),
        );
        assert_eq!(r.responses[0].error_code, topic_denied, "DeleteTopics");
    }

    // CreatePartitions: ALTER on the topic.
    let r = raw.request(
        3,
        &CreatePartitionsRequest::default()
            .with_topics(vec![
                create_partitions_request::CreatePartitionsTopic::default()
                    .with_name(tn())
                    .with_count(2),
            ])
            .with_timeout_ms(10_000),
    );
    assert_eq!(r.results[0].error_code, topic_denied, "CreatePartitions");

    // DeleteRecords: DELETE on the topic.
    let r = raw.request(
        2,
        &DeleteRecordsRequest::default()
            .with_topics(vec![delete_records_request::DeleteRecordsTopic::default()
                .with_name(tn())
                .with_partitions(vec![
                    delete_records_request::DeleteRecordsPartition::default()
                        .with_partition_index(0)
                        .with_offset(0),
                ])])
            .with_timeout_ms(10_000),
    );
    assert_eq!(
        r.topics[0].partitions[0].error_code, topic_denied,
        "DeleteRecords"
    );

    // DescribeConfigs: DESCRIBE_CONFIGS on the topic / the cluster.
    let r = raw.request(
        4,
        &DescribeConfigsRequest::default().with_resources(vec![
            describe_configs_request::DescribeConfigsResource::default()
                .with_resource_type(2)
                .with_resource_name(s("t")),
            describe_configs_request::DescribeConfigsResource::default()
                .with_resource_type(4)
                .with_resource_name(s("0")),
        ]),
    );
    // (Kafka lists the authorized resources first: find each by type.)
    let of_type = |t: i8| {
        r.results
            .iter()
            .find(|x| x.resource_type == t)
            .expect("a result per resource")
            .error_code
    };
    assert_eq!(of_type(2), topic_denied, "DescribeConfigs, topic");
    if cluster {
        assert_eq!(of_type(4), cluster_denied, "DescribeConfigs, broker");
    }

    // AlterConfigs / IncrementalAlterConfigs: ALTER_CONFIGS on the topic.
    let r = raw.request(
        2,
        &AlterConfigsRequest::default().with_resources(vec![
            alter_configs_request::AlterConfigsResource::default()
                .with_resource_type(2)
                .with_resource_name(s("t")),
        ]),
    );
    assert_eq!(r.responses[0].error_code, topic_denied, "AlterConfigs");
    let r = raw.request(
        1,
        &IncrementalAlterConfigsRequest::default().with_resources(vec![
            incremental_alter_configs_request::AlterConfigsResource::default()
                .with_resource_type(2)
                .with_resource_name(s("t")),
        ]),
    );
    assert_eq!(
        r.responses[0].error_code, topic_denied,
        "IncrementalAlterConfigs"
    );

    if cluster {
        // DescribeLogDirs: DESCRIBE on the cluster.
        let r = raw.request(4, &DescribeLogDirsRequest::default().with_topics(None));
        assert_eq!(r.error_code, cluster_denied, "DescribeLogDirs");
        assert!(r.results.is_empty());
    }

    // InitProducerId: IDEMPOTENT_WRITE on the cluster or WRITE on a topic;
    // with a transactional id, WRITE on it.
    if cluster {
        let r = raw.request(
            4,
            &InitProducerIdRequest::default()
                .with_transactional_id(None)
                .with_producer_id(ProducerId(-1))
                .with_producer_epoch(-1),
        );
        assert_eq!(r.error_code, cluster_denied, "InitProducerId, idempotent");
    }
    assert_eq!(
        common::raw::init_transactional(&mut raw, "tx"),
        Err(txn_denied),
        "InitProducerId, transactional"
    );

    // AddPartitionsToTxn (client versions), AddOffsetsToTxn, EndTxn:
    // WRITE on the transactional id.
    assert_eq!(
        common::raw::add_partition_to_txn_v3(&mut raw, "tx", 1, 0, "t", 0),
        txn_denied,
        "AddPartitionsToTxn v3"
    );
    if cluster_action {
        let r = raw.request(
            5,
            &AddPartitionsToTxnRequest::default().with_transactions(vec![
                add_partitions_to_txn_request::AddPartitionsToTxnTransaction::default()
                    .with_transactional_id(TransactionalId(s("tx"))),
            ]),
        );
        assert_eq!(
            r.error_code, cluster_denied,
            "AddPartitionsToTxn v5 (brokers)"
        );
    }
    let r = raw.request(
        4,
        &AddOffsetsToTxnRequest::default()
            .with_transactional_id(TransactionalId(s("tx")))
            .with_group_id(GroupId(s("g"))),
    );
    assert_eq!(r.error_code, txn_denied, "AddOffsetsToTxn");
    let (code, _) = common::raw::end_txn_v5(&mut raw, "tx", 1, 0, true);
    assert_eq!(code, txn_denied, "EndTxn");
    let r = raw.request(
        5,
        &TxnOffsetCommitRequest::default()
            .with_transactional_id(TransactionalId(s("tx")))
            .with_group_id(GroupId(s("g")))
            .with_topics(vec![
                txn_offset_commit_request::TxnOffsetCommitRequestTopic::default()
                    .with_name(tn())
                    .with_partitions(vec![
                        txn_offset_commit_request::TxnOffsetCommitRequestPartition::default()
                            .with_partition_index(0),
                    ]),
            ]),
    );
    assert_eq!(
        r.topics[0].partitions[0].error_code, txn_denied,
        "TxnOffsetCommit"
    );
    let r = raw.request(
        0,
        &DescribeTransactionsRequest::default()
            .with_transactional_ids(vec![TransactionalId(s("tx"))]),
    );
    assert_eq!(
        r.transaction_states[0].error_code, txn_denied,
        "DescribeTransactions"
    );
    let r = raw.request(1, &ListTransactionsRequest::default());
    assert_eq!(
        r.error_code, 0,
        "ListTransactions filters, it does not refuse"
    );

    // DescribeProducers: READ on the topic.
    let r = raw.request(
        0,
        &DescribeProducersRequest::default().with_topics(vec![
            describe_producers_request::TopicRequest::default()
                .with_name(tn())
                .with_partition_indexes(vec![0]),
        ]),
    );
    assert_eq!(
        r.topics[0].partitions[0].error_code, topic_denied,
        "DescribeProducers"
    );

    // FindCoordinator: DESCRIBE on the group / transactional id.
    for (key_type, denied) in [(0, group_denied), (1, txn_denied)] {
        let r = raw.request(
            4,
            &FindCoordinatorRequest::default()
                .with_key_type(key_type)
                .with_coordinator_keys(vec![s("g")]),
        );
        assert_eq!(
            r.coordinators[0].error_code, denied,
            "FindCoordinator {key_type}"
        );
    }

    // The group APIs: READ (DESCRIBE, DELETE) on the group.
    let r = raw.request(
        9,
        &JoinGroupRequest::default()
            .with_group_id(GroupId(s("g")))
            .with_session_timeout_ms(10_000)
            .with_rebalance_timeout_ms(10_000)
            .with_protocol_type(s("consumer")),
    );
    assert_eq!(r.error_code, group_denied, "JoinGroup");
    let r = raw.request(
        5,
        &SyncGroupRequest::default()
            .with_group_id(GroupId(s("g")))
            .with_protocol_type(Some(s("consumer")))
            .with_protocol_name(Some(s("range"))),
    );
    assert_eq!(r.error_code, group_denied, "SyncGroup");
    // From v5 the protocol type and name are mandatory, checked before
    // the ACL.
    let r = raw.request(
        5,
        &SyncGroupRequest::default().with_group_id(GroupId(s("g"))),
    );
    assert_eq!(
        r.error_code,
        ResponseError::InconsistentGroupProtocol.code(),
        "SyncGroup v5 without protocol type and name"
    );
    let r = raw.request(
        4,
        &HeartbeatRequest::default().with_group_id(GroupId(s("g"))),
    );
    assert_eq!(r.error_code, group_denied, "Heartbeat");
    let r = raw.request(
        5,
        &LeaveGroupRequest::default().with_group_id(GroupId(s("g"))),
    );
    assert_eq!(r.error_code, group_denied, "LeaveGroup");
    let r = raw.request(
        9,
        &OffsetCommitRequest::default()
            .with_group_id(GroupId(s("g")))
            .with_topics(vec![
                offset_commit_request::OffsetCommitRequestTopic::default()
                    .with_name(tn())
                    .with_partitions(vec![
                        offset_commit_request::OffsetCommitRequestPartition::default()
                            .with_partition_index(0),
                    ]),
            ]),
    );
    assert_eq!(
        r.topics[0].partitions[0].error_code, group_denied,
        "OffsetCommit"
    );
    let r = raw.request(
        8,
        &OffsetFetchRequest::default().with_groups(vec![
            offset_fetch_request::OffsetFetchRequestGroup::default()
                .with_group_id(GroupId(s("g")))
                .with_topics(None),
        ]),
    );
    assert_eq!(r.groups[0].error_code, group_denied, "OffsetFetch");
    let r = raw.request(
        0,
        &OffsetDeleteRequest::default().with_group_id(GroupId(s("g"))),
    );
    assert_eq!(r.error_code, group_denied, "OffsetDelete");
    let r = raw.request(
        5,
        &DescribeGroupsRequest::default().with_groups(vec![GroupId(s("g"))]),
    );
    assert_eq!(r.groups[0].error_code, group_denied, "DescribeGroups");
    let r = raw.request(
        2,
        &DeleteGroupsRequest::default().with_groups_names(vec![GroupId(s("g"))]),
    );
    assert_eq!(r.results[0].error_code, group_denied, "DeleteGroups");
    let r = raw.request(4, &ListGroupsRequest::default());
    assert_eq!((r.error_code, r.groups.len()), (0, 0), "ListGroups filters");
    let r = raw.request(
        0,
        &ConsumerGroupHeartbeatRequest::default()
            .with_group_id(GroupId(s("g")))
            .with_member_epoch(0)
            .with_rebalance_timeout_ms(10_000)
            .with_subscribed_topic_names(Some(vec![tn()]))
            .with_topic_partitions(Some(Vec::new())),
    );
    assert_eq!(r.error_code, group_denied, "ConsumerGroupHeartbeat");
    let r = raw.request(
        0,
        &ConsumerGroupDescribeRequest::default().with_group_ids(vec![GroupId(s("g"))]),
    );
    assert_eq!(
        r.groups[0].error_code, group_denied,
        "ConsumerGroupDescribe"
    );

    if cluster {
        // The ACL APIs: DESCRIBE / ALTER on the cluster.
        let r = raw.request(
            3,
            &DescribeAclsRequest::default()
                .with_resource_type_filter(1)
                .with_pattern_type_filter(1)
                .with_operation(1)
                .with_permission_type(1),
        );
        assert_eq!(r.error_code, cluster_denied, "DescribeAcls");
        let r = raw.request(
            3,
            &CreateAclsRequest::default().with_creations(vec![allow(TOPIC, "t", READ)]),
        );
        assert_eq!(r.results[0].error_code, cluster_denied, "CreateAcls");
        let r = raw.request(
            3,
            &DeleteAclsRequest::default().with_filters(vec![
                delete_acls_request::DeleteAclsFilter::default()
                    .with_resource_type_filter(1)
                    .with_pattern_type_filter(1)
                    .with_operation(1)
                    .with_permission_type(1),
            ]),
        );
        assert_eq!(r.filter_results[0].error_code, cluster_denied, "DeleteAcls");

        // SCRAM users and client quotas: DESCRIBE, ALTER and
        // DESCRIBE_CONFIGS on the cluster (Kafka's KafkaApis / controller).
        let r = raw.request(
            0,
            &DescribeUserScramCredentialsRequest::default().with_users(None),
        );
        assert_eq!(r.error_code, cluster_denied, "DescribeUserScramCredentials");
        let r = raw.request(
            0,
            &AlterUserScramCredentialsRequest::default().with_deletions(vec![
                alter_user_scram_credentials_request::ScramCredentialDeletion::default()
                    .with_name(s("alice"))
                    .with_mechanism(1),
            ]),
        );
        assert_eq!(r.results.len(), 1, "AlterUserScramCredentials");
        assert_eq!(
            r.results[0].error_code, cluster_denied,
            "AlterUserScramCredentials"
        );
        let r = raw.request(1, &DescribeClientQuotasRequest::default());
        assert_eq!(r.error_code, cluster_denied, "DescribeClientQuotas");
    }
}

/// Kafka's documented minimal producer ACLs: WRITE (and DESCRIBE, implied)
/// on the topic; idempotence needs nothing more (KIP-679).
#[test]
fn a_producer_works_with_write_on_its_topic_and_is_refused_without() {
    let broker = secured(
        &[],
        &["orders", "other"],
        vec![allow(TOPIC, "orders", WRITE)],
    );
    let b = broker.bootstrap();
    for idempotence in ["false", "true"] {
        let errors = produce(&b, "orders", 5, &[("enable.idempotence", idempotence)]);
        assert!(
            errors.iter().all(Option::is_none),
            "idempotence={idempotence}: {errors:?}"
        );
    }
    // On a topic it may not write, the delivery fails with
    // TOPIC_AUTHORIZATION_FAILED.
    let errors = produce(&b, "other", 1, &[("message.timeout.ms", "10000")]);
    let err = errors[0].clone().expect("refused");
    assert!(err.contains("authorization"), "{err}");
}

/// Kafka's documented minimal consumer-group ACLs: READ on the topic and
/// on the group.
#[test]
fn a_consumer_group_works_with_read_on_topic_and_group_and_is_refused_without() {
    let broker = secured(
        &[],
        &["events"],
        vec![
            allow(TOPIC, "events", WRITE),
            allow(TOPIC, "events", READ),
            allow(GROUP, "readers", READ),
        ],
    );
    let b = broker.bootstrap();
    assert!(produce(&b, "events", 10, &[]).iter().all(Option::is_none));
    let c = client::consumer(
        &b,
        &[("group.id", "readers"), ("auto.offset.reset", "earliest")],
    );
    c.subscribe(&["events"]).expect("subscribe");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut got = 0;
    while got < 10 {
        assert!(
            std::time::Instant::now() < deadline,
            "consumed only {got} of 10"
        );
        match c.poll(Duration::from_millis(100)) {
            Some(Ok(_)) => got += 1,
            Some(Err(e)) => panic!("consumer error: {e}"),
            None => {}
        }
    }
    let mut done = rdkafka::TopicPartitionList::new();
    done.add_partition_offset("events", 0, rdkafka::Offset::Offset(10))
        .expect("offset");
    c.commit(&done, rdkafka::consumer::CommitMode::Sync)
        .expect("commit with READ on the group");

    // Another group: GROUP_AUTHORIZATION_FAILED.
    let c = client::consumer(
        &b,
        &[("group.id", "strangers"), ("auto.offset.reset", "earliest")],
    );
    c.subscribe(&["events"]).expect("subscribe");
    let err = poll_error(&c, Duration::from_secs(30));
    assert!(
        err.contains("GroupAuthorization") || err.contains("Group authorization"),
        "{err}"
    );
}

/// Kafka's documented minimal transactional-producer ACLs: WRITE on the
/// transactional id and the topic (DESCRIBE implied).
#[test]
fn a_transactional_producer_works_with_write_on_its_id_and_is_refused_without() {
    let broker = secured(
        &[],
        &["ledger"],
        vec![allow(TOPIC, "ledger", WRITE), allow(TXN_ID, "tx-", WRITE)],
    );
    let b = broker.bootstrap();
    let p = client::producer(&b, &[("transactional.id", "tx-")]);
    p.init_transactions(Duration::from_secs(30))
        .expect("init_transactions");
    p.begin_transaction().expect("begin");
    assert!(produce_with(&p, "ledger", 3).iter().all(Option::is_none));
    p.commit_transaction(Duration::from_secs(30))
        .expect("commit");

    let p = client::producer(&b, &[("transactional.id", "tx-other")]);
    let err = p
        .init_transactions(Duration::from_secs(30))
        .expect_err("no WRITE on tx-other");
    assert!(err.to_string().contains("uthoriz"), "{err}");
}

#[test]
fn prefixed_allow_deny_wins_and_metadata_hides_unauthorized_topics() {
    let broker = secured(
        &[],
        &["app-a", "app-b", "secret"],
        vec![
            acl(TOPIC, "app-", PREFIXED, ALL, ALLOW),
            acl(TOPIC, "app-b", LITERAL, WRITE, DENY),
        ],
    );
    let mut raw = RawClient::connect(broker.port);
    let r = raw.request(12, &MetadataRequest::default().with_topics(None));
    let mut names: Vec<String> = r
        .topics
        .iter()
        .filter_map(|t| t.name.as_ref().map(|n| n.0.to_string()))
        .collect();
    names.sort();
    assert_eq!(names, ["app-a", "app-b"], "`secret` is hidden");
    let batch = || {
        fjord::record::BatchBuilder::new(fjord::record::Compression::None)
            .record(None, Some(b"v"), &[], 1_700_000_000_000)
            .build()
            .freeze()
    };
    let code = |raw: &mut RawClient, topic: &str| {
        let r = raw.request(9, &common::raw::produce_request(topic, 0, 1, batch()));
        common::raw::only_partition(&r).error_code
    };
    assert_eq!(code(&mut raw, "app-a"), 0, "PREFIXED ALL allows");
    assert_eq!(
        code(&mut raw, "app-b"),
        ResponseError::TopicAuthorizationFailed.code(),
        "DENY WRITE wins"
    );
    // DENY WRITE does not deny DESCRIBE: app-b is still listed above.
}

/// Without an authorizer the authorized-operations fields, when asked for,
/// hold every operation Kafka supports on the resource type, and the
/// schema's default (i32::MIN) when not. Runs against stock Kafka too
/// (`FJORD_TEST_BROKER=kafka:127.0.0.1:19092`), which answered the same.
#[test]
fn authorized_operations_without_an_authorizer_are_every_supported_operation() {
    const TOPIC_OPS: i32 = 3576; // READ WRITE CREATE DELETE ALTER DESCRIBE DESCRIBE_CONFIGS ALTER_CONFIGS
    const GROUP_OPS: i32 = 3400; // READ DELETE DESCRIBE DESCRIBE_CONFIGS ALTER_CONFIGS
    const CLUSTER_OPS: i32 = 8096; // CREATE ALTER DESCRIBE CLUSTER_ACTION *_CONFIGS IDEMPOTENT_WRITE
    let target = common::target::Target::start(BrokerOpts::default().cores(1));
    let bootstrap = target.bootstrap();
    let port: u16 = bootstrap.rsplit(':').next().unwrap().parse().unwrap();
    let topic = format!("ops-{}", std::process::id());
    create_topic(&bootstrap, &topic, 1, &[]);
    let mut raw = RawClient::connect(port);
    let ops_of = |r: &MetadataResponse| {
        r.topics
            .iter()
            .find(|t| t.name.as_ref().is_some_and(|n| n.0.as_str() == topic))
            .expect("the topic")
            .topic_authorized_operations
    };
    let asked = MetadataRequest::default()
        .with_topics(None)
        .with_include_cluster_authorized_operations(true)
        .with_include_topic_authorized_operations(true);
    let r = raw.request(10, &asked);
    assert_eq!(
        (ops_of(&r), r.cluster_authorized_operations),
        (TOPIC_OPS, CLUSTER_OPS)
    );
    let r = raw.request(12, &MetadataRequest::default().with_topics(None));
    assert_eq!(ops_of(&r), i32::MIN, "not asked for");
    let r = raw.request(
        1,
        &DescribeClusterRequest::default().with_include_cluster_authorized_operations(true),
    );
    assert_eq!(r.cluster_authorized_operations, CLUSTER_OPS);
    let r = raw.request(1, &DescribeClusterRequest::default());
    assert_eq!(r.cluster_authorized_operations, i32::MIN, "not asked for");
    let group = format!("ops-g-{}", std::process::id());
    let coordinator =
        common::raw::wait_group_coordinator_port(port, &group, Duration::from_secs(30));
    // A coordinator that has just been made may still be loading.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let r = loop {
        let r = RawClient::connect(coordinator).request(
            5,
            &DescribeGroupsRequest::default()
                .with_groups(vec![GroupId(s(&group))])
                .with_include_authorized_operations(true),
        );
        let loading = [
            ResponseError::NotCoordinator.code(),
            ResponseError::CoordinatorLoadInProgress.code(),
        ];
        if !loading.contains(&r.groups[0].error_code) || std::time::Instant::now() > deadline {
            break r;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(
        (r.groups[0].error_code, r.groups[0].authorized_operations),
        (0, GROUP_OPS),
        "a group not known is described as Dead, with its operations"
    );
}

/// The authorized-operations fields (Kafka's `authorizedOperations`): a bit
/// per operation the principal may do on the resource, implied ones
/// included; a refused resource keeps the schema's default (i32::MIN) and
/// the cluster's field is 0 without DESCRIBE on it. Without an authorizer
/// every supported operation is set (topic 3576, group 3400, cluster 8096,
/// checked in `tests/server_describe_topic_partitions.rs` and against
/// stock Kafka 4.4 once).
#[test]
fn authorized_operations_report_what_the_acls_allow() {
    // CLUSTER_ACTION as the stock peer needs it for its own connections.
    let broker = secured(
        &[],
        &["ops-t", "secret"],
        vec![
            allow(TOPIC, "ops-t", READ),
            allow(GROUP, "ops-g", READ),
            allow(CLUSTER, "kafka-cluster", CLUSTER_ACTION),
        ],
    );
    assert_authorized_operations(broker.port);
}

/// The same against stock Kafka 4.4 with the StandardAuthorizer, where
/// ANONYMOUS has exactly the ACLs of the test above and the topics exist:
/// `FJORD_ACL_PEER_PORT=19092 cargo test --test server_acls -- --ignored
/// stock_kafka_reports_the_same_authorized_operations`.
#[test]
#[ignore]
fn stock_kafka_reports_the_same_authorized_operations() {
    let port: u16 = std::env::var("FJORD_ACL_PEER_PORT")
        .expect("FJORD_ACL_PEER_PORT")
        .parse()
        .expect("a port");
    assert_authorized_operations(port);
}

fn assert_authorized_operations(port: u16) {
    const NOT_GIVEN: i32 = i32::MIN;
    // READ implies DESCRIBE: bits 3 and 8.
    const READ_AND_DESCRIBE: i32 = (1 << 3) | (1 << 8);
    let refused = ResponseError::TopicAuthorizationFailed.code();
    let mut raw = RawClient::connect(port);

    let r = raw.request(
        10,
        &MetadataRequest::default()
            .with_topics(None)
            .with_include_cluster_authorized_operations(true)
            .with_include_topic_authorized_operations(true),
    );
    let listed: Vec<(String, i32)> = r
        .topics
        .iter()
        .map(|t| {
            (
                t.name.as_ref().expect("name").0.to_string(),
                t.topic_authorized_operations,
            )
        })
        .collect();
    assert_eq!(
        listed,
        [("ops-t".to_string(), READ_AND_DESCRIBE)],
        "Metadata v10, all topics"
    );
    assert_eq!(
        r.cluster_authorized_operations, 0,
        "no DESCRIBE on the cluster"
    );

    let named = |n: &str| {
        metadata_request::MetadataRequestTopic::default().with_name(Some(TopicName(s(n))))
    };
    let r = raw.request(
        12,
        &MetadataRequest::default()
            .with_topics(Some(vec![named("secret"), named("ops-t")]))
            .with_allow_auto_topic_creation(false)
            .with_include_topic_authorized_operations(true),
    );
    let by_name = |name: &str| {
        r.topics
            .iter()
            .find(|t| t.name.as_ref().is_some_and(|n| n.0.as_str() == name))
            .map(|t| (t.error_code, t.topic_authorized_operations))
            .expect("the topic's entry")
    };
    assert_eq!(by_name("secret"), (refused, NOT_GIVEN));
    assert_eq!(by_name("ops-t"), (0, READ_AND_DESCRIBE));
    assert_eq!(r.cluster_authorized_operations, NOT_GIVEN, "v11+ has none");

    let r = raw.request(
        1,
        &DescribeClusterRequest::default().with_include_cluster_authorized_operations(true),
    );
    assert_eq!(r.cluster_authorized_operations, 0);

    let r = raw.request(
        0,
        &DescribeTopicPartitionsRequest::default().with_topics(vec![
            describe_topic_partitions_request::TopicRequest::default()
                .with_name(TopicName(s("secret"))),
            describe_topic_partitions_request::TopicRequest::default()
                .with_name(TopicName(s("ops-t"))),
        ]),
    );
    let got: Vec<(String, i16, i32)> = r
        .topics
        .iter()
        .map(|t| {
            (
                t.name.as_ref().expect("name").0.to_string(),
                t.error_code,
                t.topic_authorized_operations,
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("ops-t".to_string(), 0, READ_AND_DESCRIBE),
            ("secret".to_string(), refused, NOT_GIVEN),
        ],
        "DescribeTopicPartitions lists the refused topic last"
    );

    let coordinator =
        common::raw::wait_group_coordinator_port(port, "ops-g", Duration::from_secs(30));
    let mut raw = RawClient::connect(coordinator);
    let r = raw.request(
        5,
        &DescribeGroupsRequest::default()
            .with_groups(vec![GroupId(s("ops-g")), GroupId(s("other-g"))])
            .with_include_authorized_operations(true),
    );
    let got: Vec<(String, i16, i32)> = r
        .groups
        .iter()
        .map(|g| {
            (
                g.group_id.to_string(),
                g.error_code,
                g.authorized_operations,
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (
                "other-g".to_string(),
                ResponseError::GroupAuthorizationFailed.code(),
                NOT_GIVEN
            ),
            ("ops-g".to_string(), 0, READ_AND_DESCRIBE),
        ],
        "the refused group first, as Kafka lists it"
    );
}

#[test]
fn allow_everyone_if_no_acl_found_opens_resources_no_acl_names() {
    let broker = secured(
        &["--allow-everyone-if-no-acl-found"],
        &["open", "closed"],
        vec![acl(TOPIC, "closed", LITERAL, READ, ALLOW)],
    );
    // The ACL on `closed` grants ANONYMOUS only READ: producing there is
    // refused, while `open` (no ACL) takes anything.
    let b = broker.bootstrap();
    assert!(produce(&b, "open", 3, &[]).iter().all(Option::is_none));
    let errors = produce(&b, "closed", 1, &[("message.timeout.ms", "10000")]);
    let err = errors[0].clone().expect("refused");
    assert!(err.contains("uthoriz"), "{err}");
}

/// ConsumerGroupHeartbeat (KIP-848) by a member that may READ its group:
/// subscribing by name to a topic it may not DESCRIBE is
/// TOPIC_AUTHORIZATION_FAILED, naming the topic, and the member does not
/// join; without that topic it joins. Kafka's KafkaApis checks DESCRIBE on
/// every subscribed name before the group coordinator sees the request.
#[test]
fn consumer_group_heartbeat_refuses_a_subscription_to_a_topic_it_may_not_describe() {
    let broker = secured(
        &[],
        &["hb-visible", "hb-secret"],
        vec![
            allow(GROUP, "hb-group", READ),
            allow(TOPIC, "hb-visible", DESCRIBE),
        ],
    );
    assert_heartbeat_subscription_refusal(broker.port);
}

/// The same against stock Kafka (run by hand): a fresh peer started with
/// `scripts/kafka-peer.sh start --fresh --conf
/// authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
/// --conf allow.everyone.if.no.acl.found=true`; the test creates the topics
/// and a DENY DESCRIBE on `hb-secret` for ANONYMOUS itself (the group and
/// `hb-visible` have no ACL, so they are open).
/// `FJORD_ACL_PEER_PORT=19092 cargo test --test server_acls stock_kafka_refuses -- --ignored`.
#[test]
#[ignore]
fn stock_kafka_refuses_a_heartbeat_subscription_to_a_topic_it_may_not_describe() {
    let port: u16 = std::env::var("FJORD_ACL_PEER_PORT")
        .expect("FJORD_ACL_PEER_PORT")
        .parse()
        .expect("a port");
    let bootstrap = format!("127.0.0.1:{port}");
    for t in ["hb-visible", "hb-secret"] {
        create_topic(&bootstrap, t, 1, &[]);
    }
    create_acls(port, vec![acl(TOPIC, "hb-secret", LITERAL, DESCRIBE, DENY)]);
    std::thread::sleep(Duration::from_secs(2));
    assert_heartbeat_subscription_refusal(port);
}

/// Asserts the refusal of [`consumer_group_heartbeat_refuses_a_subscription_to_a_topic_it_may_not_describe`]
/// on the broker at `port` (group `hb-group`, topics `hb-visible` and `hb-secret`).
fn assert_heartbeat_subscription_refusal(port: u16) {
    let mut raw = RawClient::connect(port);
    // v1 (KIP-1082): the member names itself.
    let heartbeat = |raw: &mut RawClient, version: i16, topics: &[&str]| {
        let member_id = if version >= 1 {
            s("hb-member-0000000001")
        } else {
            s("")
        };
        raw.request(
            version,
            &ConsumerGroupHeartbeatRequest::default()
                .with_group_id(GroupId(s("hb-group")))
                .with_member_id(member_id)
                .with_member_epoch(0)
                .with_rebalance_timeout_ms(10_000)
                .with_subscribed_topic_names(Some(topics.iter().map(|t| TopicName(s(t))).collect()))
                .with_topic_partitions(Some(Vec::new())),
        )
    };
    for version in [0, 1] {
        let r = heartbeat(&mut raw, version, &["hb-visible", "hb-secret"]);
        assert_eq!(
            r.error_code,
            ResponseError::TopicAuthorizationFailed.code(),
            "v{version}: {r:?}"
        );
        assert_eq!(r.error_message, None, "v{version}: Kafka sends no message");
        assert_eq!(r.member_epoch, 0, "v{version}: not joined: {r:?}");
        assert!(r.assignment.is_none(), "v{version}: {r:?}");
    }

    // Without it the member joins (once the coordinator is up and has
    // loaded the group's offsets partition: COORDINATOR_NOT_AVAILABLE,
    // NOT_COORDINATOR and COORDINATOR_LOAD_IN_PROGRESS until then).
    let retriable = [
        ResponseError::CoordinatorNotAvailable.code(),
        ResponseError::NotCoordinator.code(),
        ResponseError::CoordinatorLoadInProgress.code(),
    ];
    common::wait_for(Duration::from_secs(30), "the group coordinator", || {
        let found = raw.request(
            4,
            &FindCoordinatorRequest::default()
                .with_key_type(0)
                .with_coordinator_keys(vec![s("hb-group")]),
        );
        let code = found.coordinators[0].error_code;
        assert!(code == 0 || retriable.contains(&code), "{found:?}");
        (code == 0).then_some(())
    });
    let r = common::wait_for(Duration::from_secs(30), "the member to join", || {
        let r = heartbeat(&mut raw, 1, &["hb-visible"]);
        if retriable.contains(&r.error_code) {
            std::thread::sleep(Duration::from_millis(100));
            None
        } else {
            Some(r)
        }
    });
    assert_eq!(r.error_code, 0, "{r:?}");
    assert!(r.member_epoch >= 1, "joined: {r:?}");
    let described = raw.request(
        0,
        &ConsumerGroupDescribeRequest::default().with_group_ids(vec![GroupId(s("hb-group"))]),
    );
    let members: Vec<String> = described.groups[0]
        .members
        .iter()
        .map(|m| m.member_id.to_string())
        .collect();
    assert_eq!(
        members,
        ["hb-member-0000000001"],
        "only the member that joined: {described:?}"
    );
}

/// A WriteTxnMarkers (v1) COMMIT for producer 7 on partition 0 of `t` as
/// ANONYMOUS: each partition's code.
fn write_markers(port: u16) -> Vec<i16> {
    common::raw::commit_markers_v1(&mut RawClient::connect(port), "t", &[0])
}

/// WriteTxnMarkers is an inter-broker API: Kafka's
/// `handleWriteTxnMarkersRequest` takes CLUSTER_ACTION on the cluster
/// (WRITE on the topic is not enough) and refuses every partition with
/// CLUSTER_AUTHORIZATION_FAILED without it; with it the marker is written.
/// (Without an authorizer everyone has it: `server_hardening.rs`.)
#[test]
fn write_txn_markers_takes_cluster_action() {
    let writer = secured(&[], &["t"], vec![allow(TOPIC, "t", WRITE)]);
    assert_eq!(
        write_markers(writer.port),
        vec![ResponseError::ClusterAuthorizationFailed.code()]
    );
    drop(writer);
    let broker = secured(
        &[],
        &["t"],
        vec![allow(CLUSTER, "kafka-cluster", CLUSTER_ACTION)],
    );
    assert_eq!(write_markers(broker.port), vec![0]);
}
