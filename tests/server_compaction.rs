//! Compacted topics (issue 26), what the broker does today: the
//! `cleanup.policy` values and the cleaner's topic configs with Kafka's
//! defaults, validation and DescribeConfigs answers; records without a key
//! refused on a compacted topic with Kafka's exact answer; the policy
//! changed on a live topic both ways; DeleteRecords refused on a
//! compact-only topic. The cleaner itself: `server_log_cleaner.rs`.
//!
//! Every test here runs against stock Kafka too, with
//! `FJORD_TEST_BROKER=kafka:HOST:PORT` (`scripts/kafka-peer.sh start`):
//! that is how the expected answers were checked.

mod common;

use common::client::{self, admin, admin_opts, block_on, create_topic};
use common::raw::{only_partition, produce_request, RawClient};
use common::target::Target;
use common::{wait_for, BrokerOpts};
use fjord::record::{BatchBuilder, Compression};
use kafka_protocol::messages::delete_records_request::{
    DeleteRecordsPartition, DeleteRecordsTopic,
};
use kafka_protocol::messages::produce_response::PartitionProduceResponse;
use kafka_protocol::messages::{DeleteRecordsRequest, ProduceRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use rdkafka::admin::{AlterConfig, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::types::RDKafkaErrorCode;
use std::collections::HashMap;
use std::time::Duration;

/// Longest a config change may take to reach the partition's leader (on
/// stock Kafka it travels through the metadata log).
const CONFIG_PROPAGATION_TIMEOUT: Duration = Duration::from_secs(30);
const TIMESTAMP_MS: i64 = 1_700_000_000_000;

fn configs(bootstrap: &str, topic: &str) -> HashMap<String, Option<String>> {
    let a = admin(bootstrap);
    let results = block_on(a.describe_configs([&ResourceSpecifier::Topic(topic)], &admin_opts()))
        .expect("describe_configs");
    let resource = results[0].as_ref().expect("describe succeeded");
    resource
        .entries
        .iter()
        .map(|e| (e.name.clone(), e.value.clone()))
        .collect()
}

fn value(bootstrap: &str, topic: &str, name: &str) -> Option<String> {
    configs(bootstrap, topic).get(name).cloned().flatten()
}

fn create(bootstrap: &str, topic: &str, config: &[(&str, &str)]) -> Result<(), RDKafkaErrorCode> {
    let a = admin(bootstrap);
    let mut nt = NewTopic::new(topic, 1, TopicReplication::Fixed(1));
    for (k, v) in config {
        nt = nt.set(k, v);
    }
    let mut results = block_on(a.create_topics([&nt], &admin_opts())).expect("create_topics");
    results.remove(0).map(|_| ()).map_err(|(_, code)| code)
}

fn set_policy(bootstrap: &str, topic: &str, policy: &str) {
    let a = admin(bootstrap);
    let alter = AlterConfig::new(ResourceSpecifier::Topic(topic)).set("cleanup.policy", policy);
    let results = block_on(a.alter_configs([&alter], &admin_opts())).expect("alter_configs");
    assert!(results[0].is_ok(), "alter_configs: {:?}", results[0]);
}

/// One batch with these keys (None = no key), compressed with `codec`.
fn batch(keys: &[Option<&str>], codec: Compression) -> bytes::Bytes {
    let mut b = BatchBuilder::new(codec);
    for (i, key) in keys.iter().enumerate() {
        b = b.record(
            key.map(str::as_bytes),
            Some(format!("v{i}").as_bytes()),
            &[],
            TIMESTAMP_MS,
        );
    }
    b.build().freeze()
}

/// One Produce of `records`, sent again while the partition has no leader
/// yet (stock Kafka answers a just-created topic so for a moment; nothing
/// is written then).
fn produce(port: u16, topic: &str, records: bytes::Bytes) -> PartitionProduceResponse {
    let mut c = RawClient::connect(port);
    wait_for(CONFIG_PROPAGATION_TIMEOUT, "a partition leader", || {
        let resp = c.request::<ProduceRequest>(9, &produce_request(topic, 0, -1, records.clone()));
        let p = only_partition(&resp).clone();
        let no_leader = [
            ResponseError::UnknownTopicOrPartition.code(),
            ResponseError::NotLeaderOrFollower.code(),
        ];
        (!no_leader.contains(&p.error_code)).then_some(p)
    })
}

/// Creates `topic` and waits until DescribeConfigs knows it (on stock Kafka
/// the answer to CreateTopics comes before every broker has the topic).
fn create_ready(target: &Target, topic: &str, config: &[(&str, &str)]) {
    let b = target.bootstrap();
    create_topic(&b, topic, 1, config);
    wait_for(CONFIG_PROPAGATION_TIMEOUT, "the topic's configs", || {
        let a = admin(&b);
        let results =
            block_on(a.describe_configs([&ResourceSpecifier::Topic(topic)], &admin_opts())).ok()?;
        results.first()?.as_ref().ok().map(|_| ())
    });
}

fn key_error(topic: &str) -> String {
    format!("Compacted topic cannot accept message without key in topic partition {topic}-0")
}

#[test]
fn compact_policies_are_accepted_and_described_with_kafkas_defaults() {
    let target = Target::start(BrokerOpts::default().cores(1));
    let b = target.bootstrap();
    // Kafka stores a list without the spaces around its items.
    for (base, policy, described) in [
        ("compaction-compact", "compact", "compact"),
        ("compaction-both", "compact,delete", "compact,delete"),
        (
            "compaction-both-spaced",
            "delete, compact",
            "delete,compact",
        ),
    ] {
        let topic = target.name(base);
        create_ready(&target, &topic, &[("cleanup.policy", policy)]);
        assert_eq!(
            value(&b, &topic, "cleanup.policy").as_deref(),
            Some(described),
            "{policy}"
        );
    }
    let topic = target.name("compaction-defaults");
    create_ready(&target, &topic, &[]);
    let c = configs(&b, &topic);
    for (name, default) in [
        ("cleanup.policy", "delete"),
        ("delete.retention.ms", "86400000"),
        ("min.compaction.lag.ms", "0"),
        ("max.compaction.lag.ms", "9223372036854775807"),
        ("min.cleanable.dirty.ratio", "0.5"),
    ] {
        assert_eq!(c[name].as_deref(), Some(default), "{name}");
    }
    let topic = target.name("compaction-overrides");
    create_ready(
        &target,
        &topic,
        &[
            ("cleanup.policy", "compact"),
            ("delete.retention.ms", "1000"),
            ("min.compaction.lag.ms", "10"),
            ("max.compaction.lag.ms", "20"),
            ("min.cleanable.dirty.ratio", "0.01"),
        ],
    );
    let c = configs(&b, &topic);
    assert_eq!(c["delete.retention.ms"].as_deref(), Some("1000"));
    assert_eq!(c["min.compaction.lag.ms"].as_deref(), Some("10"));
    assert_eq!(c["max.compaction.lag.ms"].as_deref(), Some("20"));
    assert_eq!(c["min.cleanable.dirty.ratio"].as_deref(), Some("0.01"));
}

#[test]
fn bad_compaction_configs_get_invalid_config() {
    let target = Target::start(BrokerOpts::default().cores(1));
    let b = target.bootstrap();
    for (i, config) in [
        &[("cleanup.policy", "compacted")][..],
        &[("cleanup.policy", "compact;delete")],
        &[("min.cleanable.dirty.ratio", "1.5")],
        &[("min.cleanable.dirty.ratio", "-1")],
        &[("delete.retention.ms", "-1")],
        &[("min.compaction.lag.ms", "-1")],
        &[("max.compaction.lag.ms", "0")],
        // Each valid alone; Kafka refuses the pair.
        &[
            ("min.compaction.lag.ms", "10"),
            ("max.compaction.lag.ms", "5"),
        ],
    ]
    .into_iter()
    .enumerate()
    {
        let topic = target.name(&format!("compaction-bad-{i}"));
        assert_eq!(
            create(&b, &topic, config),
            Err(RDKafkaErrorCode::InvalidConfig),
            "{config:?}"
        );
    }
}

/// A batch of a keyed and two keyless records is refused whole with
/// Kafka's answer: INVALID_RECORD, base offset -1, the log start offset,
/// one record error per keyless record and `processRecordErrors`' summary.
fn assert_keyless_refused(target: &Target, topic: &str, codec: Compression) {
    let p = produce(target.port(), topic, batch(&[Some("k"), None, None], codec));
    assert_eq!(
        p.error_code,
        ResponseError::InvalidRecord.code(),
        "{codec:?}"
    );
    assert_eq!(p.base_offset, -1);
    assert_eq!(p.log_start_offset, 0);
    let msg = key_error(topic);
    let errors: Vec<(i32, Option<String>)> = p
        .record_errors
        .iter()
        .map(|e| {
            (
                e.batch_index,
                e.batch_index_error_message.as_ref().map(|m| m.to_string()),
            )
        })
        .collect();
    assert_eq!(
        errors,
        vec![(1, Some(msg.clone())), (2, Some(msg.clone()))],
        "{codec:?}"
    );
    assert_eq!(
        p.error_message.as_deref(),
        Some(
            format!(
                "One or more records have been rejected due to 2 record errors in total, and only showing the first three errors at most: [RecordError(batchIndex=1, message='{msg}'), RecordError(batchIndex=2, message='{msg}')]"
            )
            .as_str()
        )
    );
}

#[test]
fn records_without_a_key_are_refused_on_a_compacted_topic() {
    let target = Target::start(BrokerOpts::default().cores(1));
    let topic = target.name("compaction-keyless");
    create_ready(&target, &topic, &[("cleanup.policy", "compact,delete")]);
    assert_keyless_refused(&target, &topic, Compression::None);
    assert_keyless_refused(&target, &topic, Compression::Gzip);
    // Nothing of the refused batches was written: keyed records start at 0.
    let p = produce(
        target.port(),
        &topic,
        batch(&[Some("a"), Some("b")], Compression::Lz4),
    );
    assert_eq!(p.error_code, 0, "{:?}", p.error_message);
    assert_eq!(p.base_offset, 0);
}

#[test]
fn cleanup_policy_changes_on_a_live_topic_both_ways() {
    let target = Target::start(BrokerOpts::default().cores(1));
    let b = target.bootstrap();
    let topic = target.name("compaction-live");
    create_ready(&target, &topic, &[]);
    let keyless = || batch(&[None], Compression::None);
    let p = produce(target.port(), &topic, keyless());
    assert_eq!(
        (p.error_code, p.base_offset),
        (0, 0),
        "delete takes keyless records"
    );

    set_policy(&b, &topic, "compact");
    assert_eq!(
        value(&b, &topic, "cleanup.policy").as_deref(),
        Some("compact")
    );
    // On stock Kafka the change reaches the partition's log a little
    // later than the answer, so wait for the refusal.
    wait_for(
        CONFIG_PROPAGATION_TIMEOUT,
        "keyless refused after compact",
        || {
            let p = produce(target.port(), &topic, keyless());
            assert!(
                p.error_code == 0 || p.error_code == ResponseError::InvalidRecord.code(),
                "{p:?}"
            );
            (p.error_code != 0).then_some(())
        },
    );
    assert_keyless_refused(&target, &topic, Compression::None);

    set_policy(&b, &topic, "delete");
    assert_eq!(
        value(&b, &topic, "cleanup.policy").as_deref(),
        Some("delete")
    );
    wait_for(
        CONFIG_PROPAGATION_TIMEOUT,
        "keyless taken after delete",
        || {
            let p = produce(target.port(), &topic, keyless());
            (p.error_code == 0).then_some(())
        },
    );
    // Every accepted record is readable from the start.
    let got = client::consume(
        &b,
        &topic,
        1,
        1,
        Duration::from_millis(300),
        Duration::from_secs(30),
    );
    assert_eq!(got[0].offset, 0);
    assert_eq!(got[0].key, None);
}

#[test]
fn delete_records_on_a_compact_only_topic_is_a_policy_violation() {
    let target = Target::start(BrokerOpts::default().cores(1));
    let delete_records = |topic: &str| {
        let mut c = RawClient::connect(target.port());
        let req = DeleteRecordsRequest::default()
            .with_timeout_ms(30_000)
            .with_topics(vec![DeleteRecordsTopic::default()
                .with_name(TopicName(StrBytes::from_string(topic.to_string())))
                .with_partitions(vec![DeleteRecordsPartition::default()
                    .with_partition_index(0)
                    .with_offset(-1)])]);
        let resp = c.request(2, &req);
        let p = &resp.topics[0].partitions[0];
        (p.error_code, p.low_watermark)
    };
    let compact = target.name("compaction-delete-records");
    create_ready(&target, &compact, &[("cleanup.policy", "compact")]);
    let p = produce(
        target.port(),
        &compact,
        batch(&[Some("k")], Compression::None),
    );
    assert_eq!(p.error_code, 0);
    assert_eq!(
        delete_records(&compact),
        (ResponseError::PolicyViolation.code(), -1)
    );
    // With `delete` in the policy the records can be deleted.
    let both = target.name("compaction-delete-records-both");
    create_ready(&target, &both, &[("cleanup.policy", "compact,delete")]);
    let p = produce(target.port(), &both, batch(&[Some("k")], Compression::None));
    assert_eq!(p.error_code, 0);
    assert_eq!(delete_records(&both), (0, 1));
}
