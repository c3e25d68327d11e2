//! Several fjord nodes, each in its own network namespace (`netns`) with
//! one shard, all voters of one metadata quorum (`docs/replication.md`
//! §3.2): what the several-node tests start.

use super::netns::Net;
use super::raw::RawClient;
use super::{Broker, BrokerOpts};
use kafka_protocol::messages::create_topics_request::{
    CreatableReplicaAssignment, CreatableTopic, CreatableTopicConfig,
};
use kafka_protocol::messages::{
    BrokerId, CreateTopicsRequest, FindCoordinatorRequest, MetadataRequest, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use std::time::Duration;

/// How long [`create_topic`] retries until some node takes the topic.
pub const CREATE_TOPIC_WAIT: Duration = Duration::from_secs(60);

/// The controller port on every host (each has its own address).
pub const CONTROLLER_PORT: u16 = 9093;

/// Node `i` of the `nodes` hosts of `net`, with
/// `--broker-session-timeout-ms=session_timeout_ms` and `extra` arguments.
pub fn start_node(
    net: &Net,
    i: usize,
    nodes: usize,
    session_timeout_ms: u64,
    extra: &[String],
) -> Broker {
    let mut opts = BrokerOpts::default()
        .cores(1)
        .in_host(net.host(i))
        .arg(format!("--node-id={i}"))
        .arg(format!("--controller-quorum={}", voters(net, nodes)))
        .arg(format!("--broker-session-timeout-ms={session_timeout_ms}"));
    for a in extra {
        opts = opts.arg(a.clone());
    }
    Broker::start(opts)
}

/// Every node of `net` (one shard each, node `i` with `extra(i)`), once
/// each lists all of them (registered and unfenced), within `settle`.
pub fn start_all<'a>(
    net: &Net,
    nodes: usize,
    session_timeout_ms: u64,
    settle: Duration,
    extra: impl Fn(usize) -> &'a [String],
) -> Vec<Broker> {
    let brokers: Vec<Broker> = (0..nodes)
        .map(|i| start_node(net, i, nodes, session_timeout_ms, extra(i)))
        .collect();
    for b in &brokers {
        wait_brokers(b, nodes, settle);
    }
    brokers
}

/// The node that leads the metadata quorum among `brokers` (the live
/// ones): the one that logged its leadership in the highest term.
pub fn quorum_leader(brokers: &[Option<&Broker>], settle: Duration) -> usize {
    super::wait_for(settle, "a quorum leader among the live nodes", || {
        let mut best: Option<(u64, usize)> = None;
        for (i, b) in brokers.iter().enumerate() {
            let Some(b) = b else { continue };
            for term in leadership_terms(&b.stderr_since(0)) {
                if best.is_none_or(|(t, _)| term > t) {
                    best = Some((term, i));
                }
            }
        }
        best.map(|(_, i)| i)
    })
}

/// The terms of every "this node leads the metadata quorum" line of a
/// node's log.
fn leadership_terms(log: &str) -> Vec<u64> {
    log.lines()
        .filter(|l| l.contains("this node leads the metadata quorum"))
        .filter_map(|l| {
            let plain: String = super::strip_ansi(l);
            let at = plain.find("term=")? + "term=".len();
            plain[at..]
                .split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        })
        .collect()
}

/// The address of `broker`'s (first) shard.
pub fn addr(broker: &Broker) -> std::net::SocketAddr {
    broker.bootstrap().parse().expect("an address")
}

/// The node (one shard each: broker id / 1000) and address of the
/// coordinator of `key` (key type 0: a group, 1: a transactional id), as
/// `broker` answers FindCoordinator (v4); None while it has none.
pub fn coordinator(
    broker: &Broker,
    key_type: i8,
    key: &str,
) -> Option<(usize, std::net::SocketAddr)> {
    let resp = RawClient::connect_to(addr(broker)).request(
        4,
        &FindCoordinatorRequest::default()
            .with_key_type(key_type)
            .with_coordinator_keys(vec![s(key)]),
    );
    let c = &resp.coordinators[0];
    if c.error_code != 0 || c.node_id.0 < 0 {
        return None;
    }
    let addr = format!("{}:{}", c.host.as_str(), c.port).parse().ok()?;
    Some((usize::try_from(c.node_id.0 / 1000).ok()?, addr))
}

/// The coordinator of `key` ([`coordinator`]) if every one of `asked`
/// names the same one; None while one has none or they differ.
pub fn agreed_coordinator(
    asked: &[&Broker],
    key_type: i8,
    key: &str,
) -> Option<(usize, std::net::SocketAddr)> {
    let found = asked
        .iter()
        .map(|b| coordinator(b, key_type, key))
        .collect::<Option<Vec<_>>>()?;
    let first = *found.first()?;
    found.iter().all(|f| *f == first).then_some(first)
}

/// Waits until `broker`'s Metadata lists `count` brokers (every node
/// registered and unfenced).
pub fn wait_brokers(broker: &Broker, count: usize, timeout: Duration) {
    let addr = addr(broker);
    super::wait_for(timeout, &format!("{count} brokers listed"), || {
        let resp = RawClient::connect_to(addr).request(
            12,
            &MetadataRequest::default()
                .with_topics(Some(Vec::new()))
                .with_allow_auto_topic_creation(false),
        );
        (resp.brokers.len() == count).then_some(())
    });
}

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// CreateTopics of `name` with `partitions`, replication factor `rf` and
/// `configs`, through the first node of `brokers` that takes it; see
/// [`create_topic_as`].
pub fn create_topic(
    brokers: &[Broker],
    name: &str,
    partitions: i32,
    rf: i16,
    configs: &[(&str, &str)],
) {
    let topic = CreatableTopic::default()
        .with_name(TopicName(s(name)))
        .with_num_partitions(partitions)
        .with_replication_factor(rf)
        .with_configs(topic_configs(configs));
    create_topic_as(brokers, topic);
}

/// CreateTopics of `name`, one partition on `replicas` (the first its
/// preferred leader), with `configs`; see [`create_topic_as`].
pub fn create_assigned(brokers: &[Broker], name: &str, replicas: &[i32], configs: &[(&str, &str)]) {
    let topic = CreatableTopic::default()
        .with_name(TopicName(s(name)))
        .with_num_partitions(-1)
        .with_replication_factor(-1)
        .with_assignments(vec![CreatableReplicaAssignment::default()
            .with_partition_index(0)
            .with_broker_ids(replicas.iter().map(|&b| BrokerId(b)).collect())])
        .with_configs(topic_configs(configs));
    create_topic_as(brokers, topic);
}

/// `configs` as CreateTopics carries them.
pub fn topic_configs(configs: &[(&str, &str)]) -> Vec<CreatableTopicConfig> {
    configs
        .iter()
        .map(|(k, v)| {
            CreatableTopicConfig::default()
                .with_name(s(k))
                .with_value(Some(s(v)))
        })
        .collect()
}

/// CreateTopics of `topic` through the first node of `brokers` that takes
/// it (any node forwards once a quorum leader is known), tried again every
/// 200 ms for up to [`CREATE_TOPIC_WAIT`]. TOPIC_ALREADY_EXISTS counts as
/// made (an earlier try was). While the quorum settles a node answers
/// NOT_CONTROLLER (no leader yet) or REQUEST_TIMED_OUT (a leader lost
/// mid-way), and INVALID_REPLICATION_FACTOR or INVALID_REPLICA_ASSIGNMENT
/// while too few nodes have registered; any other answer fails the test.
pub fn create_topic_as(brokers: &[Broker], topic: CreatableTopic) {
    let retried = [
        ResponseError::NotController.code(),
        ResponseError::RequestTimedOut.code(),
        ResponseError::InvalidReplicationFactor.code(),
        ResponseError::InvalidReplicaAssignment.code(),
    ];
    super::wait_for(CREATE_TOPIC_WAIT, "a node that takes CreateTopics", || {
        for (i, b) in brokers.iter().enumerate() {
            let resp = RawClient::connect_to(addr(b)).request(
                5,
                &CreateTopicsRequest::default()
                    .with_topics(vec![topic.clone()])
                    .with_timeout_ms(10_000),
            );
            let code = resp.topics[0].error_code;
            if code == 0 || code == ResponseError::TopicAlreadyExists.code() {
                return Some(());
            }
            assert!(
                retried.contains(&code),
                "node {i} answered {code} to CreateTopics: {:?}",
                resp.topics[0].error_message
            );
        }
        std::thread::sleep(Duration::from_millis(200));
        None
    });
}

/// One partition as a node's Metadata (v12) lists it, broker ids in the
/// order listed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionView {
    pub index: i32,
    pub leader: i32,
    pub leader_epoch: i32,
    pub error: i16,
    pub replicas: Vec<i32>,
    pub isr: Vec<i32>,
    pub offline: Vec<i32>,
}

impl PartitionView {
    /// The same view with replicas, ISR and offline replicas sorted (for
    /// comparing sets).
    pub fn sorted(mut self) -> Self {
        self.replicas.sort();
        self.isr.sort();
        self.offline.sort();
        self
    }
}

/// `topic`'s partitions in `broker`'s Metadata (v12), by index; None if
/// the topic is not listed.
pub fn partitions(broker: &Broker, topic: &str) -> Option<Vec<PartitionView>> {
    partitions_at(broker, topic, 12)
}

/// The same from Metadata at `version` (fields a version lacks are empty
/// or -1).
pub fn partitions_at(broker: &Broker, topic: &str, version: i16) -> Option<Vec<PartitionView>> {
    let resp = RawClient::connect_to(addr(broker)).request(
        version,
        &MetadataRequest::default()
            .with_topics(None)
            .with_allow_auto_topic_creation(false),
    );
    let t = resp
        .topics
        .iter()
        .find(|t| t.name.as_ref().is_some_and(|n| n.0.as_str() == topic))?;
    let ids = |v: &[BrokerId]| v.iter().map(|b| b.0).collect::<Vec<i32>>();
    let mut out: Vec<PartitionView> = t
        .partitions
        .iter()
        .map(|p| PartitionView {
            index: p.partition_index,
            leader: p.leader_id.0,
            leader_epoch: p.leader_epoch,
            error: p.error_code,
            replicas: ids(&p.replica_nodes),
            isr: ids(&p.isr_nodes),
            offline: ids(&p.offline_replicas),
        })
        .collect();
    out.sort_by_key(|p| p.index);
    Some(out)
}

/// Partition `index` of `topic` in `broker`'s Metadata (v12); None if it is
/// not listed.
pub fn partition(broker: &Broker, topic: &str, index: i32) -> Option<PartitionView> {
    partitions(broker, topic)?
        .into_iter()
        .find(|p| p.index == index)
}

/// Partition `partition` of `topic`'s ListOffsets LATEST at `broker`, its
/// leader: the HW. A node just restarted answers NOT_LEADER_OR_FOLLOWER
/// until the quorum has its new registration (`ShardCtx::registered_in`):
/// asked again until `timeout`.
pub fn latest(broker: &Broker, topic: &str, partition: i32, timeout: Duration) -> i64 {
    use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
    use kafka_protocol::messages::ListOffsetsRequest;
    let req = ListOffsetsRequest::default()
        .with_replica_id((-1).into())
        .with_topics(vec![ListOffsetsTopic::default()
            .with_name(TopicName(s(topic)))
            .with_partitions(vec![ListOffsetsPartition::default()
                .with_partition_index(partition)
                .with_current_leader_epoch(-1)
                .with_timestamp(-1)])]);
    super::wait_for(timeout, "ListOffsets at the leader", || {
        let resp = RawClient::connect_to(addr(broker)).request(7, &req);
        let answer = &resp.topics[0].partitions[0];
        if answer.error_code == ResponseError::NotLeaderOrFollower.code() {
            std::thread::sleep(Duration::from_millis(100));
            return None;
        }
        assert_eq!(answer.error_code, 0, "ListOffsets of {topic}-{partition}");
        Some(answer.offset)
    })
}

/// Runs Kafka's tool `tool` with `args` through `scripts/kafka-cli`
/// (resolving Kafka's jars first, once per test binary), bounded, and
/// prints what it said.
pub fn kafka_tool(tool: &str, args: &[&str]) -> super::child::ChildRun {
    use super::child::{run_bounded, Streams};
    use std::process::Command;
    static RESOLVED: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    RESOLVED.get_or_init(|| {
        let mut cmd = Command::new("bash");
        cmd.arg(root.join("scripts/kafka-peer.sh")).arg("resolve");
        let run = run_bounded(
            &mut cmd,
            "scripts/kafka-peer.sh resolve".into(),
            None,
            Streams::Separate,
            Duration::from_secs(900),
        );
        assert!(
            run.success(),
            "resolving Kafka's jars: {}{}",
            run.stdout,
            run.stderr
        );
    });
    let mut cmd = Command::new("bash");
    cmd.arg(root.join("scripts/kafka-cli")).arg(tool).args(args);
    if std::env::var_os("KAFKA_CLI_OPTS").is_none() {
        cmd.env("KAFKA_CLI_OPTS", "-XX:+UseSerialGC -XX:TieredStopAtLevel=1");
    }
    let run = run_bounded(
        &mut cmd,
        format!("scripts/kafka-cli {tool} {}", args.join(" ")),
        None,
        Streams::Separate,
        Duration::from_secs(120),
    );
    println!(
        "$ {}\n--- stdout ---\n{}--- stderr ---\n{}",
        run.command, run.stdout, run.stderr
    );
    run
}

/// `--controller-quorum`'s value naming the first `nodes` hosts of `net`
/// as the voters.
pub fn voters(net: &Net, nodes: usize) -> String {
    let quorum: Vec<String> = (0..nodes)
        .map(|n| format!("{n}@{}:{CONTROLLER_PORT}", net.host(n).addr))
        .collect();
    quorum.join(",")
}

/// Every value of `topic`'s partition 0, read with librdkafka bootstrapped
/// at `broker` until `count` arrived (bounded by `settle`), sorted.
pub fn sorted_values(broker: &Broker, topic: &str, count: usize, settle: Duration) -> Vec<String> {
    let got = super::client::consume(
        &broker.bootstrap(),
        topic,
        1,
        count,
        Duration::from_millis(500),
        settle,
    );
    let mut v: Vec<String> = got
        .iter()
        .map(|m| String::from_utf8_lossy(m.value.as_deref().unwrap_or_default()).into_owned())
        .collect();
    v.sort();
    v
}
