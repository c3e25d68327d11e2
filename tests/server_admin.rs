//! The admin API through librdkafka's AdminClient (and a raw
//! IncrementalAlterConfigs, which rdkafka does not expose): create topics
//! (and Kafka's errors), delete, describe configs, alter configs,
//! incremental alter, create partitions.

mod common;

use common::client::{self, admin, admin_opts, block_on, create_topic, partition_leaders};
use common::raw::RawClient;
use common::{wait_for, Broker, BrokerOpts};
use kafka_protocol::messages::incremental_alter_configs_request::{
    AlterConfigsResource, AlterableConfig,
};
use kafka_protocol::messages::{
    alter_configs_request, AlterConfigsRequest, IncrementalAlterConfigsRequest,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use rdkafka::admin::{
    AlterConfig, ConfigSource, NewPartitions, NewTopic, ResourceSpecifier, TopicReplication,
};
use rdkafka::consumer::Consumer;
use rdkafka::types::RDKafkaErrorCode;
use std::collections::HashMap;
use std::time::Duration;

const TOPIC_RESOURCE_TYPE: i8 = 2;

/// Topic config name → (value, source), from DescribeConfigs.
fn describe(broker: &Broker, topic: &str) -> HashMap<String, (Option<String>, &'static str)> {
    let a = admin(&broker.bootstrap());
    let results = block_on(a.describe_configs([&ResourceSpecifier::Topic(topic)], &admin_opts()))
        .expect("describe_configs");
    assert_eq!(results.len(), 1);
    let resource = results[0].as_ref().expect("describe succeeded");
    resource
        .entries
        .iter()
        .map(|e| (e.name.clone(), (e.value.clone(), source_name(&e.source))))
        .collect()
}

/// A config source by name (rdkafka's `ConfigSource` is not `Clone`).
fn source_name(s: &ConfigSource) -> &'static str {
    match s {
        ConfigSource::Unknown => "unknown",
        ConfigSource::DynamicTopic => "dynamic-topic",
        ConfigSource::DynamicBroker => "dynamic-broker",
        ConfigSource::DynamicDefaultBroker => "dynamic-default-broker",
        ConfigSource::StaticBroker => "static-broker",
        ConfigSource::Default => "default",
    }
}

fn value(configs: &HashMap<String, (Option<String>, &'static str)>, name: &str) -> Option<String> {
    configs.get(name).and_then(|(v, _)| v.clone())
}

fn create_one(broker: &Broker, topic: &NewTopic) -> Result<String, (String, RDKafkaErrorCode)> {
    let a = admin(&broker.bootstrap());
    let mut results = block_on(a.create_topics([topic], &admin_opts())).expect("create_topics");
    assert_eq!(results.len(), 1);
    results.remove(0)
}

#[test]
fn create_topic_and_its_errors() {
    let broker = Broker::start(BrokerOpts::default());
    let ok = NewTopic::new("admin-created", 3, TopicReplication::Fixed(1));
    assert_eq!(create_one(&broker, &ok), Ok("admin-created".to_string()));
    assert_eq!(
        partition_leaders(&broker.bootstrap(), "admin-created").len(),
        3
    );

    let again = NewTopic::new("admin-created", 3, TopicReplication::Fixed(1));
    assert_eq!(
        create_one(&broker, &again),
        Err((
            "admin-created".to_string(),
            RDKafkaErrorCode::TopicAlreadyExists
        ))
    );

    let bad_name = NewTopic::new("bad/name!", 1, TopicReplication::Fixed(1));
    assert_eq!(
        create_one(&broker, &bad_name),
        Err(("bad/name!".to_string(), RDKafkaErrorCode::InvalidTopic))
    );

    // A replication factor up to the brokers advertised (the two shards)
    // is accepted, as Kafka accepts it, and the topic has one replica per
    // partition (docs/replication-factor.md); above it is refused.
    let rf2 = NewTopic::new("admin-rf2", 2, TopicReplication::Fixed(2));
    assert_eq!(create_one(&broker, &rf2), Ok("admin-rf2".to_string()));
    let c = client::consumer(&broker.bootstrap(), &[]);
    let md = c
        .fetch_metadata(Some("admin-rf2"), Duration::from_secs(10))
        .expect("metadata");
    for p in md.topics()[0].partitions() {
        assert_eq!(p.replicas(), &[p.leader()], "one replica, the leader");
    }
    let rf3 = NewTopic::new("admin-rf3", 1, TopicReplication::Fixed(3));
    assert_eq!(
        create_one(&broker, &rf3),
        Err((
            "admin-rf3".to_string(),
            RDKafkaErrorCode::InvalidReplicationFactor
        ))
    );

    let zero_partitions = NewTopic::new("admin-zero", 0, TopicReplication::Fixed(1));
    assert_eq!(
        create_one(&broker, &zero_partitions),
        Err((
            "admin-zero".to_string(),
            RDKafkaErrorCode::InvalidPartitions
        ))
    );

    // The failed creations left nothing behind.
    let c = client::consumer(&broker.bootstrap(), &[]);
    let md = c
        .fetch_metadata(None, Duration::from_secs(10))
        .expect("metadata");
    // Internal topics aside: the consumer's group machinery (FindCoordinator)
    // creates `__consumer_offsets`, which Kafka lists too.
    let mut names: Vec<&str> = md
        .topics()
        .iter()
        .map(|t| t.name())
        .filter(|n| !fjord::metadata::internal::is_internal(n))
        .collect();
    names.sort_unstable();
    assert_eq!(names, vec!["admin-created", "admin-rf2"]);
}

#[test]
fn delete_topic() {
    let broker = Broker::start(
        BrokerOpts::default()
            .arg("--auto-create-topics-enable")
            .arg("false"),
    );
    create_topic(&broker.bootstrap(), "admin-doomed", 2, &[]);
    let data_dir = broker.data_dir();
    assert!(data_dir.join("admin-doomed-0").exists());
    let a = admin(&broker.bootstrap());
    let results =
        block_on(a.delete_topics(&["admin-doomed"], &admin_opts())).expect("delete_topics");
    assert_eq!(results, vec![Ok("admin-doomed".to_string())]);

    let c = client::consumer(&broker.bootstrap(), &[]);
    let md = c
        .fetch_metadata(Some("admin-doomed"), Duration::from_secs(10))
        .expect("metadata");
    let t = &md.topics()[0];
    assert_eq!(
        t.error().map(RDKafkaErrorCode::from),
        Some(RDKafkaErrorCode::UnknownTopicOrPartition),
        "the deleted topic is gone"
    );
    wait_for(
        Duration::from_secs(10),
        "partition directories removed",
        || {
            (!data_dir.join("admin-doomed-0").exists() && !data_dir.join("admin-doomed-1").exists())
                .then_some(())
        },
    );

    let results =
        block_on(a.delete_topics(&["admin-never"], &admin_opts())).expect("delete_topics");
    assert_eq!(
        results,
        vec![Err((
            "admin-never".to_string(),
            RDKafkaErrorCode::UnknownTopicOrPartition
        ))]
    );

    // The name can be used again, and the new topic starts empty.
    create_topic(&broker.bootstrap(), "admin-doomed", 1, &[]);
    assert_eq!(
        partition_leaders(&broker.bootstrap(), "admin-doomed").len(),
        1
    );
}

#[test]
fn describe_alter_and_incrementally_alter_configs() {
    let broker = Broker::start(BrokerOpts::default());
    let topic = "admin-configs";
    create_topic(
        &broker.bootstrap(),
        topic,
        1,
        &[("retention.ms", "3600000")],
    );

    let configs = describe(&broker, topic);
    assert_eq!(
        value(&configs, "compression.type").as_deref(),
        Some("producer")
    );
    assert_eq!(configs["compression.type"].1, "default");
    assert_eq!(value(&configs, "retention.ms").as_deref(), Some("3600000"));
    assert_eq!(configs["retention.ms"].1, "dynamic-topic");
    assert!(configs.contains_key("segment.bytes"));
    assert!(configs.contains_key("cleanup.policy"));

    // AlterConfigs replaces the topic's whole set of overrides.
    let a = admin(&broker.bootstrap());
    let alter = AlterConfig::new(ResourceSpecifier::Topic(topic)).set("compression.type", "gzip");
    let results = block_on(a.alter_configs([&alter], &admin_opts())).expect("alter_configs");
    assert_eq!(results.len(), 1);
    assert!(results[0].is_ok(), "alter_configs: {:?}", results[0]);
    let configs = describe(&broker, topic);
    assert_eq!(value(&configs, "compression.type").as_deref(), Some("gzip"));
    assert_eq!(configs["compression.type"].1, "dynamic-topic");
    assert_eq!(
        configs["retention.ms"].1, "default",
        "retention.ms override dropped"
    );

    // IncrementalAlterConfigs sets one key and keeps the others.
    let mut raw = RawClient::connect(broker.port);
    let req = IncrementalAlterConfigsRequest::default().with_resources(vec![
        AlterConfigsResource::default()
            .with_resource_type(TOPIC_RESOURCE_TYPE)
            .with_resource_name(StrBytes::from_static_str("admin-configs"))
            .with_configs(vec![AlterableConfig::default()
                .with_name(StrBytes::from_static_str("retention.ms"))
                .with_config_operation(0)
                .with_value(Some(StrBytes::from_static_str("7200000")))]),
    ]);
    let resp = raw.request(1, &req);
    assert_eq!(resp.responses.len(), 1);
    assert_eq!(
        resp.responses[0].error_code, 0,
        "{:?}",
        resp.responses[0].error_message
    );
    let configs = describe(&broker, topic);
    assert_eq!(value(&configs, "retention.ms").as_deref(), Some("7200000"));
    assert_eq!(
        value(&configs, "compression.type").as_deref(),
        Some("gzip"),
        "kept"
    );

    // An unknown config is rejected with INVALID_CONFIG and changes nothing,
    // by both APIs (raw requests: rdkafka's AlterConfigs future drops the
    // per-resource error codes).
    let req = AlterConfigsRequest::default().with_resources(vec![
        alter_configs_request::AlterConfigsResource::default()
            .with_resource_type(TOPIC_RESOURCE_TYPE)
            .with_resource_name(StrBytes::from_static_str("admin-configs"))
            .with_configs(vec![alter_configs_request::AlterableConfig::default()
                .with_name(StrBytes::from_static_str("no.such.config"))
                .with_value(Some(StrBytes::from_static_str("1")))]),
    ]);
    let resp = raw.request(1, &req);
    assert_eq!(
        resp.responses[0].error_code,
        ResponseError::InvalidConfig.code()
    );
    let req = IncrementalAlterConfigsRequest::default().with_resources(vec![
        AlterConfigsResource::default()
            .with_resource_type(TOPIC_RESOURCE_TYPE)
            .with_resource_name(StrBytes::from_static_str("admin-configs"))
            .with_configs(vec![AlterableConfig::default()
                .with_name(StrBytes::from_static_str("no.such.config"))
                .with_config_operation(0)
                .with_value(Some(StrBytes::from_static_str("1")))]),
    ]);
    let resp = raw.request(1, &req);
    assert_eq!(
        resp.responses[0].error_code,
        ResponseError::InvalidConfig.code()
    );
    let configs = describe(&broker, topic);
    assert_eq!(value(&configs, "compression.type").as_deref(), Some("gzip"));
    assert_eq!(value(&configs, "retention.ms").as_deref(), Some("7200000"));

    // The altered config takes effect: an uncompressed batch is stored as gzip.
    let producer = client::producer(&broker.bootstrap(), &[("acks", "1")]);
    let m = client::TestMessage {
        id: 0,
        key: b"k".to_vec(),
        value: b"v".to_vec(),
        headers: vec![],
    };
    client::send(&producer, topic, &m);
    let d = client::await_deliveries(&producer, 1, Duration::from_secs(30));
    assert!(d[0].error.is_none());
    let stored = common::disk::batches(&broker.first_segment(topic, 0));
    assert_eq!(stored.len(), 1);
    assert_eq!(
        stored[0].header.compression().ok(),
        Some(fjord::record::Compression::Gzip)
    );
}

/// Every Kafka 4.4 topic config fjord accepts (all but the compaction
/// ones), each set to a value other than its default: accepted by
/// CreateTopics, described back as the topic's own with the same value,
/// then removed again by an empty AlterConfigs and described as defaults.
/// Values Kafka refuses are refused with its message; the broker reports
/// the broker configs clients look up.
#[test]
fn every_kafka_topic_config_is_accepted_stored_and_described() {
    let broker = Broker::start(BrokerOpts::default());
    let topic = "admin-all-configs";
    let set: &[(&str, &str)] = &[
        ("compression.gzip.level", "5"),
        ("compression.lz4.level", "3"),
        ("compression.zstd.level", "-5"),
        ("errors.deadletterqueue.group.enable", "true"),
        ("file.delete.delay.ms", "1000"),
        ("follower.replication.throttled.replicas", "0:0,1:1"),
        ("leader.replication.throttled.replicas", "*"),
        ("local.retention.bytes", "1000000"),
        ("local.retention.ms", "60000"),
        ("max.decompressed.message.bytes", "1048576"),
        ("message.timestamp.after.max.ms", "7200000"),
        ("message.timestamp.before.max.ms", "86400000"),
        ("min.insync.replicas", "2"),
        ("preallocate", "true"),
        ("remote.copy.lag.bytes", "100"),
        ("remote.copy.lag.ms", "100"),
        ("remote.log.copy.disable", "true"),
        ("remote.log.delete.on.disable", "true"),
        ("remote.storage.enable", "false"),
        ("segment.jitter.ms", "1000"),
        ("unclean.leader.election.enable", "true"),
    ];
    create_topic(&broker.bootstrap(), topic, 1, set);
    let configs = describe(&broker, topic);
    for (key, v) in set {
        assert_eq!(value(&configs, key).as_deref(), Some(*v), "{key}");
        assert_eq!(configs[*key].1, "dynamic-topic", "{key}");
    }
    // AlterConfigs with no entry drops every override.
    let a = admin(&broker.bootstrap());
    let alter = AlterConfig::new(ResourceSpecifier::Topic(topic));
    let results = block_on(a.alter_configs([&alter], &admin_opts())).expect("alter_configs");
    assert!(results[0].is_ok(), "alter_configs: {:?}", results[0]);
    let configs = describe(&broker, topic);
    for (key, default) in [
        ("unclean.leader.election.enable", "false"),
        ("follower.replication.throttled.replicas", ""),
        ("local.retention.ms", "-2"),
        ("message.timestamp.after.max.ms", "3600000"),
        ("max.decompressed.message.bytes", "2147483639"),
    ] {
        assert_eq!(value(&configs, key).as_deref(), Some(default), "{key}");
        assert_eq!(configs[key].1, "default", "{key}");
    }

    // Refused as stock Kafka 4.4 refuses them, by IncrementalAlterConfigs.
    let mut raw = RawClient::connect(broker.port);
    for (key, v, message) in [
        (
            "unclean.leader.election.enable",
            "yes",
            "Invalid value yes for configuration unclean.leader.election.enable: Expected value to be either true or false",
        ),
        (
            "remote.storage.enable",
            "true",
            "Tiered Storage functionality is disabled in the broker. Topic cannot be configured with remote log storage.",
        ),
        (
            "message.downconversion.enable",
            "true",
            "Unknown topic config name: message.downconversion.enable",
        ),
    ] {
        let req = IncrementalAlterConfigsRequest::default().with_resources(vec![
            AlterConfigsResource::default()
                .with_resource_type(TOPIC_RESOURCE_TYPE)
                .with_resource_name(StrBytes::from_static_str(topic))
                .with_configs(vec![AlterableConfig::default()
                    .with_name(StrBytes::from_static_str(key))
                    .with_config_operation(0)
                    .with_value(Some(StrBytes::from_static_str(v)))]),
        ]);
        let resp = raw.request(1, &req);
        assert_eq!(
            resp.responses[0].error_code,
            ResponseError::InvalidConfig.code(),
            "{key}={v}"
        );
        assert_eq!(
            resp.responses[0].error_message.as_deref(),
            Some(message),
            "{key}={v}"
        );
    }

    // The broker configs clients look up, with their values.
    let results = block_on(a.describe_configs([&ResourceSpecifier::Broker(0)], &admin_opts()))
        .expect("describe_configs");
    let resource = results[0].as_ref().expect("describe succeeded");
    let broker_configs: HashMap<&str, Option<&str>> = resource
        .entries
        .iter()
        .map(|e| (e.name.as_str(), e.value.as_deref()))
        .collect();
    for (key, v) in [
        ("default.replication.factor", "1"),
        ("num.partitions", "1"),
        ("min.insync.replicas", "1"),
        ("log.retention.ms", "604800000"),
        ("offsets.topic.replication.factor", "1"),
        ("transaction.state.log.replication.factor", "1"),
        ("unclean.leader.election.enable", "false"),
    ] {
        assert_eq!(broker_configs.get(key), Some(&Some(v)), "{key}");
    }
}

#[test]
fn create_partitions() {
    let broker = Broker::start(BrokerOpts::default());
    let topic = "admin-grow";
    create_topic(&broker.bootstrap(), topic, 2, &[]);
    let a = admin(&broker.bootstrap());
    let grow = NewPartitions::new(topic, 5);
    let results = block_on(a.create_partitions([&grow], &admin_opts())).expect("create_partitions");
    assert_eq!(results, vec![Ok(topic.to_string())]);
    let leaders = partition_leaders(&broker.bootstrap(), topic);
    assert_eq!(leaders.len(), 5);
    let mut nodes: Vec<i32> = leaders.values().copied().collect();
    nodes.sort_unstable();
    nodes.dedup();
    assert_eq!(nodes, vec![0, 1], "new partitions spread over both shards");

    let shrink = NewPartitions::new(topic, 3);
    let results =
        block_on(a.create_partitions([&shrink], &admin_opts())).expect("create_partitions");
    assert_eq!(
        results,
        vec![Err((
            topic.to_string(),
            RDKafkaErrorCode::InvalidPartitions
        ))]
    );

    // The new partitions may be placed by hand: one replica list per new
    // partition (a broker of this node each); a count of lists other than
    // the partitions added is Kafka's INVALID_REPLICA_ASSIGNMENT.
    let placed = NewPartitions::new(topic, 7).assign(&[&[1], &[0]]);
    let results =
        block_on(a.create_partitions([&placed], &admin_opts())).expect("create_partitions");
    assert_eq!(results, vec![Ok(topic.to_string())]);
    let leaders = partition_leaders(&broker.bootstrap(), topic);
    assert_eq!((leaders.get(&5), leaders.get(&6)), (Some(&1), Some(&0)));
    let short = NewPartitions::new(topic, 9).assign(&[&[1]]);
    let results =
        block_on(a.create_partitions([&short], &admin_opts())).expect("create_partitions");
    assert_eq!(
        results,
        vec![Err((
            topic.to_string(),
            RDKafkaErrorCode::InvalidReplicaAssignment
        ))]
    );
    assert_eq!(partition_leaders(&broker.bootstrap(), topic).len(), 7);

    // The new partitions accept messages.
    let producer = client::producer(&broker.bootstrap(), &[("acks", "1")]);
    let rec = rdkafka::producer::BaseRecord::with_opaque_to(topic, 0usize)
        .partition(4)
        .payload("to-partition-4")
        .key("k");
    producer.send(rec).map_err(|(e, _)| e).expect("enqueue");
    let d = client::await_deliveries(&producer, 1, Duration::from_secs(30));
    assert_eq!(
        (d[0].partition, d[0].offset, d[0].error.clone()),
        (4, 0, None)
    );
}
