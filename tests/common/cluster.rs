//! Several fjord nodes, each in its own network namespace (`netns`) with
//! one shard, all voters of one metadata quorum (`docs/replication.md`
//! §3.2): what the several-node tests start.

use super::netns::Net;
use super::raw::RawClient;
use super::{Broker, BrokerOpts};
use std::time::Duration;

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
