//! Several fjord nodes, each in its own network namespace (`netns`) with
//! one shard, all voters of one metadata quorum (`docs/replication.md`
//! §3.2): what the several-node tests start.

use super::netns::Net;
use super::raw::RawClient;
use super::{Broker, BrokerOpts};
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use std::time::Duration;

/// How long a quorum gets to elect, and a node to take a request.
pub const SETTLE: Duration = Duration::from_secs(60);

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

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
    let quorum: Vec<String> = (0..nodes)
        .map(|n| format!("{n}@{}:{CONTROLLER_PORT}", net.host(n).addr))
        .collect();
    let mut opts = BrokerOpts::default()
        .cores(1)
        .in_host(net.host(i))
        .arg(format!("--node-id={i}"))
        .arg(format!("--controller-quorum={}", quorum.join(",")))
        .arg(format!("--broker-session-timeout-ms={session_timeout_ms}"));
    for a in extra {
        opts = opts.arg(a.clone());
    }
    Broker::start(opts)
}

/// The address of `broker`'s (first) shard.
pub fn addr(broker: &Broker) -> std::net::SocketAddr {
    broker.bootstrap().parse().expect("an address")
}

/// Waits until `broker`'s Metadata lists `count` brokers (every node
/// registered and unfenced).
pub fn wait_brokers(broker: &Broker, count: usize, timeout: Duration) {
    use kafka_protocol::messages::MetadataRequest;
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

/// CreateTopics of `name` (`partitions`, replication factor `factor`,
/// `configs`) through the first node that takes it (any node forwards once
/// a quorum leader is known).
pub fn create_topic(
    brokers: &[Broker],
    name: &str,
    partitions: i32,
    factor: i16,
    configs: &[(&str, &str)],
) {
    use kafka_protocol::messages::create_topics_request::CreatableTopicConfig;
    super::wait_for(SETTLE, "a node that takes CreateTopics", || {
        for (i, b) in brokers.iter().enumerate() {
            let topic = CreatableTopic::default()
                .with_name(TopicName(s(name)))
                .with_num_partitions(partitions)
                .with_replication_factor(factor)
                .with_configs(
                    configs
                        .iter()
                        .map(|(k, v)| {
                            CreatableTopicConfig::default()
                                .with_name(s(k))
                                .with_value(Some(s(v)))
                        })
                        .collect(),
                );
            let resp = RawClient::connect_to(addr(b)).request(
                5,
                &CreateTopicsRequest::default()
                    .with_topics(vec![topic])
                    .with_timeout_ms(10_000),
            );
            let code = resp.topics[0].error_code;
            if code == 0 || code == ResponseError::TopicAlreadyExists.code() {
                return Some(());
            }
            // Too few nodes registered yet also answers this.
            assert!(
                code == ResponseError::NotController.code()
                    || code == ResponseError::RequestTimedOut.code()
                    || code == ResponseError::InvalidReplicationFactor.code(),
                "node {i} answered {code} to CreateTopics: {:?}",
                resp.topics[0].error_message
            );
        }
        std::thread::sleep(Duration::from_millis(200));
        None
    });
}

/// One partition as a node's Metadata (v12) lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed {
    pub leader: i32,
    pub leader_epoch: i32,
    pub error: i16,
    pub replicas: Vec<i32>,
    pub isr: Vec<i32>,
}

/// `topic`'s partitions in `broker`'s Metadata, by index; None if it is
/// not listed (or the node does not answer).
pub fn listed_topic(broker: &Broker, topic: &str) -> Option<Vec<Listed>> {
    let resp = RawClient::connect_to(addr(broker)).request(
        12,
        &MetadataRequest::default()
            .with_topics(None)
            .with_allow_auto_topic_creation(false),
    );
    let t = resp
        .topics
        .iter()
        .find(|t| t.name.as_ref().is_some_and(|n| n.0.as_str() == topic))?;
    let ids = |v: &[BrokerId]| {
        let mut v: Vec<i32> = v.iter().map(|b| b.0).collect();
        v.sort();
        v
    };
    let mut out: Vec<(i32, Listed)> = t
        .partitions
        .iter()
        .map(|p| {
            (
                p.partition_index,
                Listed {
                    leader: p.leader_id.0,
                    leader_epoch: p.leader_epoch,
                    error: p.error_code,
                    replicas: ids(&p.replica_nodes),
                    isr: ids(&p.isr_nodes),
                },
            )
        })
        .collect();
    out.sort_by_key(|(i, _)| *i);
    Some(out.into_iter().map(|(_, l)| l).collect())
}
