//! Consumer-group helpers shared by the group tests (`server_consumer_groups`,
//! `server_group_upgrade`, `server_groups`, `server_group_limits`):
//! subscribing librdkafka members that commit before they give partitions
//! up, the record of what they consumed (to find a message read twice after
//! a commit, or never), and the raw JoinGroup, ConsumerGroupHeartbeat and
//! OffsetCommit requests the tests build (`cluster_lease` uses the last).
//!
//! Why one copy: these scenarios check the same invariants (nothing lost,
//! nothing read twice after a commit) in the same way; a fix to how members
//! are polled or a request is built must reach every test that relies on it.

use super::client::numbered_id;
use bytes::Bytes;
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::{
    ConsumerGroupHeartbeatRequest, GroupId, JoinGroupRequest, OffsetCommitRequest, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::ClientContext;
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// Longest [`poll_until`] waits for its condition.
pub const GROUP_POLL_TIMEOUT: Duration = Duration::from_secs(120);
/// How long [`poll_until`] polls one member before moving to the next.
pub const MEMBER_POLL_MS: u64 = 20;

/// Commits what the application consumed before giving partitions up, as
/// an application using the rebalance callback does.
#[derive(Default, Clone)]
pub struct CommitOnRevoke;

impl ClientContext for CommitOnRevoke {}
impl ConsumerContext for CommitOnRevoke {
    fn pre_rebalance(&self, c: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(_) = rebalance {
            if let Err(e) = c.commit_consumer_state(CommitMode::Sync) {
                // Nothing consumed yet is not an error worth failing on.
                eprintln!("commit on revoke: {e}");
            }
        }
    }
}

/// A subscribing group member.
pub type Member = BaseConsumer<CommitOnRevoke>;

/// The configuration of a subscribing member of `group` that commits only
/// when told to and reads from the earliest offset; `extra` settings on
/// top.
pub fn member_config(bootstrap: &str, group: &str, extra: &[(&str, &str)]) -> ClientConfig {
    let mut c = super::client::base_config(bootstrap);
    c.set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("fetch.wait.max.ms", "100")
        .set("enable.partition.eof", "false");
    for (k, v) in extra {
        c.set(*k, *v);
    }
    c
}

/// A [`member_config`] member speaking `protocol` (`classic` or
/// `consumer`) that also commits on revocation. Not yet subscribed.
pub fn member(bootstrap: &str, group: &str, protocol: &str, extra: &[(&str, &str)]) -> Member {
    let with_protocol: Vec<(&str, &str)> = [("group.protocol", protocol)]
        .into_iter()
        .chain(extra.iter().copied())
        .collect();
    member_config(bootstrap, group, &with_protocol)
        .create_with_context(CommitOnRevoke)
        .unwrap_or_else(|e| panic!("create a group.protocol={protocol} member: {e}"))
}

/// The (topic, partition)s assigned to `c` now.
pub fn assigned(c: &Member) -> HashSet<(String, i32)> {
    c.assignment()
        .map(|tpl| {
            tpl.elements()
                .iter()
                .map(|e| (e.topic().to_string(), e.partition()))
                .collect()
        })
        .unwrap_or_default()
}

/// Every message consumed (its payload is its id), with who read it.
#[derive(Default)]
pub struct Seen {
    /// Message id → index of the member that read it last.
    pub by_id: HashMap<usize, usize>,
    /// Ids read more than once.
    pub duplicates: Vec<usize>,
}

impl Seen {
    pub fn record(&mut self, member: usize, id: usize) {
        if self.by_id.insert(id, member).is_some() {
            self.duplicates.push(id);
        }
    }

    /// Asserts that no message was read twice (every read came after the
    /// previous owner's commit) and that `n` distinct messages were read.
    pub fn assert_each_read_once(&self, n: usize) {
        assert!(
            self.duplicates.is_empty(),
            "read twice after a commit: {:?}",
            &self.duplicates[..self.duplicates.len().min(20)]
        );
        assert_eq!(self.by_id.len(), n, "nothing lost");
    }
}

/// Polls every member in turn, recording what it reads in `seen`, until
/// `done` holds; panics after [`GROUP_POLL_TIMEOUT`] naming `what`.
pub fn poll_until(
    members: &[&Member],
    seen: &mut Seen,
    what: &str,
    mut done: impl FnMut(&Seen) -> bool,
) {
    let deadline = Instant::now() + GROUP_POLL_TIMEOUT;
    while !done(seen) {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        for (i, c) in members.iter().enumerate() {
            match c.poll(Duration::from_millis(MEMBER_POLL_MS)) {
                None => {}
                Some(Err(e)) => eprintln!("member {i} error: {e}"),
                Some(Ok(m)) => seen.record(i, numbered_id(&m)),
            }
        }
    }
}

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// A classic JoinGroup of `member_id` (empty for a first join) to `group`:
/// protocol type `consumer`, one `range` protocol whose metadata is
/// `metadata`, session and rebalance timeouts of 30 s (callers change them
/// with the request's `with_*` setters).
pub fn classic_join(group: &str, member_id: &str, metadata: Bytes) -> JoinGroupRequest {
    JoinGroupRequest::default()
        .with_group_id(GroupId(s(group)))
        .with_session_timeout_ms(30_000)
        .with_rebalance_timeout_ms(30_000)
        .with_member_id(s(member_id))
        .with_protocol_type(s("consumer"))
        .with_protocols(vec![JoinGroupRequestProtocol::default()
            .with_name(s("range"))
            .with_metadata(metadata)])
}

/// An OffsetCommit (v2 and later) of `offset` on `partition` of `topic`
/// for `group` by a client outside its membership, as a simple consumer
/// commits (generation -1, no member id; no leader epoch).
pub fn simple_commit(group: &str, topic: &str, partition: i32, offset: i64) -> OffsetCommitRequest {
    OffsetCommitRequest::default()
        .with_group_id(GroupId(s(group)))
        .with_generation_id_or_member_epoch(-1)
        .with_member_id(s(""))
        .with_topics(vec![OffsetCommitRequestTopic::default()
            .with_name(TopicName(s(topic)))
            .with_partitions(vec![OffsetCommitRequestPartition::default()
                .with_partition_index(partition)
                .with_committed_offset(offset)
                .with_committed_leader_epoch(-1)])])
}

/// A ConsumerGroupHeartbeat of `member` at `epoch`: epoch 0 is a join (a
/// 30 s rebalance timeout, owning nothing), another epoch a heartbeat that
/// changes neither (the fields null). `topics`: the subscription, or None
/// for unchanged.
pub fn consumer_heartbeat(
    group: &str,
    member: &str,
    epoch: i32,
    topics: Option<Vec<&str>>,
) -> ConsumerGroupHeartbeatRequest {
    ConsumerGroupHeartbeatRequest::default()
        .with_group_id(GroupId(s(group)))
        .with_member_id(s(member))
        .with_member_epoch(epoch)
        .with_rebalance_timeout_ms(if epoch == 0 { 30_000 } else { -1 })
        .with_subscribed_topic_names(
            topics.map(|ts| ts.into_iter().map(|t| TopicName(s(t))).collect()),
        )
        .with_topic_partitions(if epoch == 0 { Some(vec![]) } else { None })
}
