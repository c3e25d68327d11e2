//! KIP-848 consumer groups (`group.protocol=consumer`) as a pure,
//! deterministic state machine: one [`ConsumerGroup`] per group of type
//! `consumer`, driven by ConsumerGroupHeartbeat ([`ConsumerGroup::heartbeat`])
//! and by [`ConsumerGroup::poll`], each taking the current time in
//! milliseconds and a view of the topics ([`Topics`]) as arguments. No
//! clock, no I/O, no timers: the coordinator (`group/mod.rs`) owns those,
//! as it does for the classic machine in [`super::state`].
//!
//! Why it is built this way: in the classic protocol the group stops
//! (every member rejoins, a leader computes the assignment on the client,
//! everyone waits for SyncGroup). KIP-848 moves the assignment to the
//! broker and makes rebalances incremental: every member heartbeats on its
//! own, and the coordinator walks each member from its current assignment
//! to the target one without stopping the others. Three epochs make that
//! safe (Kafka's `ConsumerGroup`, `ConsumerGroupMember` and
//! `CurrentAssignmentBuilder`):
//!
//! - the **group epoch** is bumped whenever something the assignment
//!   depends on changes: a member joins or leaves, a member's subscription
//!   changes, a subscribed topic appears, disappears or gains partitions;
//! - the **target assignment epoch** is the group epoch the current target
//!   assignment was computed for (by the server-side assignor, `uniform` or
//!   `range`); it catches up with the group epoch at the next heartbeat;
//! - each **member epoch** says which target assignment the member has
//!   reconciled to. A member moves to the target epoch only once it revoked
//!   every partition the target takes away from it
//!   ([`MemberState::UnrevokedPartitions`]: it keeps its old epoch and is
//!   told to revoke), and a partition is handed to its new owner only once
//!   the previous owner no longer holds it
//!   ([`MemberState::UnreleasedPartitions`]). So no partition ever has two
//!   owners, and offset commits carry the member epoch
//!   (STALE_MEMBER_EPOCH when it is not the member's current one).
//!
//! Owner of the state: the shard that leads the group's
//! `__consumer_offsets` partition (see `group/mod.rs`).
//!
//! Invariants (checked by [`ConsumerGroup::check_invariants`] in tests):
//! - `owners` maps exactly the partitions held (assigned or pending
//!   revocation) by a member to that member, and no partition is held by
//!   two members;
//! - every static member is in `static_members` under its instance id;
//! - `assignment_epoch <= group_epoch`, and every member epoch is at most
//!   the assignment epoch.
//!
//! Mixed groups (KIP-848's online upgrade): a member may use the classic
//! protocol inside a consumer group ([`ConsumerMember::classic`]). It is
//! assigned by the same machine; its JoinGroup ([`ConsumerGroup::classic_join`])
//! plays the part of a full heartbeat (subscription and owned partitions
//! from its embedded ConsumerProtocolSubscription), its generation is its
//! member epoch, SyncGroup hands it its current assignment, and Heartbeat
//! tells it to rejoin (REBALANCE_IN_PROGRESS) when it must revoke or may
//! get more. [`ConsumerGroup::from_classic`] builds a consumer group from
//! a classic group's members; `state::Group::maybe_become_classic_group`
//! goes back when only classic members are left.
//!
//! Limits: members per group (`group.max.size`, shared with classic
//! groups: GROUP_MAX_SIZE_REACHED), topic names per subscription
//! ([`SUBSCRIBED_TOPIC_NAMES_MAX`]), the length of a subscription regex
//! ([`SUBSCRIBED_TOPIC_REGEX_BYTES_MAX`]) and the size of its compiled form
//! ([`REGEX_COMPILED_BYTES_MAX`]).
//!
//! Regular expressions: Kafka compiles `subscribed_topic_regex` with RE2/J
//! and matches whole topic names. fjord uses the `regex` crate, also an
//! RE2-family engine (no backreferences, no look-around, linear time), and
//! anchors the pattern (`^(?:...)$`) to match whole names. Differences:
//! RE2/J's Java-specific classes (`\p{javaLowerCase}`), possessive
//! quantifiers and `\Q...\E` quoting are refused as invalid
//! (INVALID_REGULAR_EXPRESSION); Unicode classes follow the `regex` crate's
//! tables. Internal topics (`__consumer_offsets`, `__transaction_state`)
//! never match a regex, as in Kafka. Regexes are resolved when the
//! subscription changes and whenever the metadata image changes (Kafka
//! resolves them asynchronously, at most every few seconds; the answer is
//! the same, sooner).
//!
//! Assignors (not byte-for-byte Kafka's algorithms, which the clients do
//! not depend on; the properties are Kafka's):
//! - `uniform` (the default): every partition of a subscribed topic goes
//!   to one subscribed member, counts per member differ by at most one
//!   among members with the same subscription, and a member keeps the
//!   partitions it had when that stays balanced (sticky);
//! - `range`: per topic, the members subscribed to it in member-id order
//!   get contiguous ranges, the first `partitions % members` one more.

use super::consumer_protocol;
use super::error::GroupError;
use bytes::Bytes;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Kafka's `group.consumer.session.timeout.ms` default.
pub const CONSUMER_SESSION_TIMEOUT_MS_DEFAULT: i32 =
    crate::config::GROUP_CONSUMER_SESSION_TIMEOUT_MS_DEFAULT;
/// Kafka's `group.consumer.heartbeat.interval.ms` default.
pub const CONSUMER_HEARTBEAT_INTERVAL_MS_DEFAULT: i32 =
    crate::config::GROUP_CONSUMER_HEARTBEAT_INTERVAL_MS_DEFAULT;
/// Topic names one member may subscribe to by name.
pub const SUBSCRIBED_TOPIC_NAMES_MAX: usize = 10_000;
/// Longest `subscribed_topic_regex`, in bytes.
pub const SUBSCRIBED_TOPIC_REGEX_BYTES_MAX: usize = 4_096;
/// Largest compiled form of one subscription regex (the `regex` crate's
/// size limit): a pattern over it is INVALID_REGULAR_EXPRESSION.
pub const REGEX_COMPILED_BYTES_MAX: usize = 1 << 20;
/// The member epoch of a member leaving the group.
pub const LEAVE_GROUP_MEMBER_EPOCH: i32 = -1;
/// The member epoch of a static member leaving for now (it keeps its
/// assignment for the session timeout).
pub const LEAVE_GROUP_STATIC_MEMBER_EPOCH: i32 = -2;
/// The server-side assignors, the default first (Kafka's
/// `group.consumer.assignors` default).
pub const ASSIGNORS: [&str; 2] = [UNIFORM_ASSIGNOR, RANGE_ASSIGNOR];
pub const UNIFORM_ASSIGNOR: &str = "uniform";
pub const RANGE_ASSIGNOR: &str = "range";

/// Partitions by topic name.
pub type Assignment = BTreeMap<String, BTreeSet<i32>>;

/// Settings of the machine (broker configs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConsumerGroupConfig {
    /// `group.consumer.session.timeout.ms`.
    pub session_timeout_ms: i32,
    /// `group.consumer.heartbeat.interval.ms`.
    pub heartbeat_interval_ms: i32,
    /// `group.max.size`: members a group may have (at least 1).
    pub max_size: usize,
}

impl Default for ConsumerGroupConfig {
    fn default() -> Self {
        ConsumerGroupConfig {
            session_timeout_ms: CONSUMER_SESSION_TIMEOUT_MS_DEFAULT,
            heartbeat_interval_ms: CONSUMER_HEARTBEAT_INTERVAL_MS_DEFAULT,
            max_size: crate::config::GROUP_MAX_SIZE_DEFAULT,
        }
    }
}

/// What the machine needs to know about topics: their partition counts
/// and, for regexes, their names. `version` changes whenever any of that
/// may have changed (the metadata image version).
pub trait Topics {
    fn version(&self) -> u64;
    /// Partitions of a non-internal topic, None if there is no such topic.
    fn partition_count(&self, name: &str) -> Option<i32>;
    /// Every non-internal topic name.
    fn names(&self) -> Vec<String>;
}

/// A plain map of topics, for tests.
impl Topics for BTreeMap<String, i32> {
    fn version(&self) -> u64 {
        // Any change of the map is a change of the view; tests build a new
        // map, so hash its contents.
        self.iter().fold(self.len() as u64, |h, (n, p)| {
            h.wrapping_mul(31)
                .wrapping_add(n.len() as u64 * 7 + *p as u64)
                .wrapping_add(n.bytes().map(u64::from).sum::<u64>())
        })
    }
    fn partition_count(&self, name: &str) -> Option<i32> {
        self.get(name).copied()
    }
    fn names(&self) -> Vec<String> {
        self.keys().cloned().collect()
    }
}

/// The metadata image as the machine's topic view: internal topics are
/// invisible to subscriptions (by name and by regex).
impl Topics for crate::metadata::MetadataImage {
    fn version(&self) -> u64 {
        self.version
    }
    fn partition_count(&self, name: &str) -> Option<i32> {
        self.topic(name)
            .filter(|t| !t.is_internal())
            .map(|t| t.partition_count())
    }
    fn names(&self) -> Vec<String> {
        self.topics
            .values()
            .filter(|t| !t.is_internal())
            .map(|t| t.name.clone())
            .collect()
    }
}

/// A member's reconciliation state (Kafka's `MemberState`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberState {
    /// The member holds its target assignment (for its epoch).
    Stable,
    /// The member must revoke partitions before it may advance.
    UnrevokedPartitions,
    /// The member waits for partitions other members still hold.
    UnreleasedPartitions,
}

impl MemberState {
    pub fn name(self) -> &'static str {
        match self {
            MemberState::Stable => "stable",
            MemberState::UnrevokedPartitions => "unrevoked_partitions",
            MemberState::UnreleasedPartitions => "unreleased_partitions",
        }
    }
}

/// A consumer group's state as Kafka names it (`ConsumerGroupState`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConsumerGroupState {
    Empty,
    /// The group epoch moved past the target assignment's.
    Assigning,
    /// Some member is not at the target assignment yet.
    Reconciling,
    Stable,
}

impl ConsumerGroupState {
    pub fn name(self) -> &'static str {
        match self {
            ConsumerGroupState::Empty => "Empty",
            ConsumerGroupState::Assigning => "Assigning",
            ConsumerGroupState::Reconciling => "Reconciling",
            ConsumerGroupState::Stable => "Stable",
        }
    }
}

/// One member of a consumer group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerMember {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub subscribed_topic_names: Vec<String>,
    pub subscribed_topic_regex: Option<String>,
    pub server_assignor: Option<String>,
    pub rebalance_timeout_ms: i32,
    pub member_epoch: i32,
    pub previous_member_epoch: i32,
    pub state: MemberState,
    /// What the member holds (was told it may consume).
    pub assigned: Assignment,
    /// What the member still holds but must give up.
    pub pending_revocation: Assignment,
    /// For every partition the member holds (assigned or pending
    /// revocation), the member epoch at which it was assigned to the
    /// member (KIP-1251's assignment epoch): an OffsetCommit with an
    /// older member epoch than the member's may still commit a partition
    /// held since that epoch ([`ConsumerGroup::committable`]). Not
    /// persisted: a replay sets it to the member epoch (see
    /// `consumer_records::finish_replay`).
    pub assignment_epochs: BTreeMap<(String, i32), i32>,
    pub last_heartbeat_ms: i64,
    /// When a member that must revoke is fenced if it has not.
    pub revocation_deadline_ms: Option<i64>,
    /// Set for a member that uses the classic protocol (JoinGroup,
    /// SyncGroup, Heartbeat) in this consumer group: a mixed group.
    pub classic: Option<ClassicMemberMetadata>,
    /// A classic member told to rejoin must rejoin, and one that joined
    /// must sync, before this time, else it is fenced (Kafka's join and
    /// sync timeouts, both the member's rebalance timeout).
    pub classic_deadline_ms: Option<i64>,
}

/// What a member using the classic protocol keeps (Kafka's
/// `ClassicMemberMetadata` of the member record).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClassicMemberMetadata {
    /// The member's JoinGroup session timeout (it replaces the broker's
    /// `group.consumer.session.timeout.ms` for this member).
    pub session_timeout_ms: i32,
    /// (protocol name, metadata) in the member's order of preference.
    pub protocols: Vec<(String, Bytes)>,
}

impl ClassicMemberMetadata {
    /// The protocol the member is answered with: its first one, as Kafka.
    pub fn protocol_name(&self) -> &str {
        self.protocols.first().map_or("", |(n, _)| n.as_str())
    }
}

/// A JoinGroup from a classic member to a consumer group.
#[derive(Debug, Clone)]
pub struct ClassicJoin {
    /// The member id: the request's, or one the coordinator generated for
    /// a request without one (`unknown_member`).
    pub member_id: String,
    pub unknown_member: bool,
    /// JoinGroup v4+: a dynamic member without id is sent its id first
    /// (MEMBER_ID_REQUIRED).
    pub require_known_member_id: bool,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout_ms: i32,
    pub rebalance_timeout_ms: i32,
    pub protocol_type: String,
    pub protocols: Vec<(String, Bytes)>,
}

/// The answer to a classic member's JoinGroup in a consumer group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClassicJoinAnswer {
    pub member_id: String,
    /// The member epoch (the classic generation of this member).
    pub generation_id: i32,
    pub protocol_name: String,
}

impl ConsumerMember {
    pub fn new(member_id: &str, now_ms: i64) -> ConsumerMember {
        ConsumerMember {
            member_id: member_id.to_string(),
            instance_id: None,
            rack_id: None,
            client_id: String::new(),
            client_host: String::new(),
            subscribed_topic_names: Vec::new(),
            subscribed_topic_regex: None,
            server_assignor: None,
            rebalance_timeout_ms: 0,
            member_epoch: 0,
            previous_member_epoch: -1,
            state: MemberState::Stable,
            assigned: Assignment::new(),
            pending_revocation: Assignment::new(),
            assignment_epochs: BTreeMap::new(),
            last_heartbeat_ms: now_ms,
            revocation_deadline_ms: None,
            classic: None,
            classic_deadline_ms: None,
        }
    }

    /// The member's session timeout: its own when it uses the classic
    /// protocol, else the broker's.
    pub fn session_timeout_ms(&self, cfg: &ConsumerGroupConfig) -> i32 {
        self.classic
            .as_ref()
            .map_or(cfg.session_timeout_ms, |c| c.session_timeout_ms)
    }

    /// Sets every held partition's assignment epoch to the member epoch
    /// (after a replay, which does not keep them: commits with an older
    /// epoch are then refused, Kafka's rule before KIP-1251).
    pub fn reset_assignment_epochs(&mut self) {
        let epoch = self.member_epoch;
        self.assignment_epochs = held(self).map(|tp| (tp, epoch)).collect();
    }

    fn set_epoch(&mut self, epoch: i32) {
        if epoch != self.member_epoch {
            self.previous_member_epoch = self.member_epoch;
            self.member_epoch = epoch;
        }
    }
}

/// A ConsumerGroupHeartbeat, as the machine sees it (validated for shape
/// by the caller: [`validate_heartbeat`]).
#[derive(Debug, Clone, Default)]
pub struct HeartbeatRequest {
    pub member_id: String,
    pub member_epoch: i32,
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    /// -1 = unchanged.
    pub rebalance_timeout_ms: i32,
    /// None = unchanged.
    pub subscribed_topic_names: Option<Vec<String>>,
    /// None = unchanged; Some("") = no regex.
    pub subscribed_topic_regex: Option<String>,
    /// None = unchanged.
    pub server_assignor: Option<String>,
    /// What the client holds; None = unchanged since the last heartbeat.
    pub owned: Option<Assignment>,
    pub client_id: String,
    pub client_host: String,
}

/// The answer to a heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeartbeatAnswer {
    pub member_id: String,
    pub member_epoch: i32,
    pub heartbeat_interval_ms: i32,
    /// The member's assignment, when it must be (re)sent.
    pub assignment: Option<Assignment>,
}

/// Checks what Kafka's `throwIfConsumerGroupHeartbeatRequestIsInvalid`
/// checks, before the group is looked at: INVALID_REQUEST,
/// UNSUPPORTED_ASSIGNOR or INVALID_REGULAR_EXPRESSION. `version` is the
/// request version (v1 requires a client-generated member id).
pub fn validate_heartbeat(req: &HeartbeatRequest, version: i16) -> Result<(), GroupError> {
    if req.instance_id.as_deref() == Some("") {
        return Err(GroupError::InvalidRequest("InstanceId can't be empty."));
    }
    if req.rack_id.as_deref() == Some("") {
        return Err(GroupError::InvalidRequest("RackId can't be empty."));
    }
    if (version >= 1 || req.member_epoch != 0) && req.member_id.is_empty() {
        return Err(GroupError::InvalidRequest("MemberId can't be empty."));
    }
    match req.member_epoch {
        0 => {
            if req.rebalance_timeout_ms == -1 {
                return Err(GroupError::InvalidRequest(
                    "RebalanceTimeoutMs must be provided in first request.",
                ));
            }
            if req.owned.as_ref().is_some_and(|o| !o.is_empty()) {
                return Err(GroupError::InvalidRequest(
                    "TopicPartitions must be empty when (re-)joining.",
                ));
            }
            if req.subscribed_topic_names.is_none() && req.subscribed_topic_regex.is_none() {
                return Err(GroupError::InvalidRequest(
                    "SubscribedTopicNames or SubscribedTopicRegex must be set in first request.",
                ));
            }
        }
        e if e > 0 || e == LEAVE_GROUP_MEMBER_EPOCH => {}
        LEAVE_GROUP_STATIC_MEMBER_EPOCH => {
            if req.instance_id.is_none() {
                return Err(GroupError::InvalidRequest(
                    "InstanceId can't be null when leaving as a static member.",
                ));
            }
        }
        _ => return Err(GroupError::InvalidRequest("MemberEpoch is invalid.")),
    }
    if req
        .subscribed_topic_names
        .as_ref()
        .is_some_and(|n| n.len() > SUBSCRIBED_TOPIC_NAMES_MAX)
    {
        return Err(GroupError::InvalidRequest(
            "SubscribedTopicNames has too many topics.",
        ));
    }
    if let Some(a) = &req.server_assignor {
        if !ASSIGNORS.contains(&a.as_str()) {
            return Err(GroupError::UnsupportedAssignor(a.clone()));
        }
    }
    if let Some(re) = req.subscribed_topic_regex.as_deref() {
        if !re.is_empty() {
            compile_regex(re)?;
        }
    }
    Ok(())
}

/// Compiles a subscription regex to match whole topic names.
pub fn compile_regex(re: &str) -> Result<regex::Regex, GroupError> {
    if re.len() > SUBSCRIBED_TOPIC_REGEX_BYTES_MAX {
        return Err(GroupError::InvalidRegularExpression(
            "the regular expression is too long".to_string(),
        ));
    }
    regex::RegexBuilder::new(&format!("^(?:{re})$"))
        .size_limit(REGEX_COMPILED_BYTES_MAX)
        .build()
        .map_err(|e| GroupError::InvalidRegularExpression(e.to_string()))
}

/// A classic group's member as an online upgrade takes it over.
#[derive(Debug, Clone)]
pub struct ClassicMemberSnapshot {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub rebalance_timeout_ms: i32,
    pub session_timeout_ms: i32,
    pub protocols: Vec<(String, Bytes)>,
}

/// One consumer group.
#[derive(Debug, Clone, Default)]
pub struct ConsumerGroup {
    pub group_epoch: i32,
    pub assignment_epoch: i32,
    pub members: BTreeMap<String, ConsumerMember>,
    /// instance id → member id.
    pub static_members: HashMap<String, String>,
    /// The target assignment of each member (for `assignment_epoch`).
    pub target: BTreeMap<String, Assignment>,
    /// The subscribed topics and their partition counts, as of the last
    /// group epoch (Kafka's subscription metadata).
    pub subscribed: BTreeMap<String, i32>,
    /// The assignor the target assignment was computed with.
    pub assignor: String,
    /// Which member holds each partition (assigned or pending revocation).
    owners: HashMap<(String, i32), String>,
    /// Regex → matching topics, as of `topics_version`.
    resolved_regexes: BTreeMap<String, BTreeSet<String>>,
    topics_version: Option<u64>,
    /// The hash of `subscribed` ([`subscription_hash`]), persisted as the
    /// group record's MetadataHash: after a restart the subscription is
    /// recomputed, and only a different hash means a new group epoch.
    pub metadata_hash: i64,
    /// Set when the group-level records (epochs) must be written.
    pub dirty: bool,
    /// Members whose records must be written (or tombstoned, when gone).
    pub changed_members: BTreeSet<String>,
}

impl ConsumerGroup {
    pub fn new() -> ConsumerGroup {
        ConsumerGroup {
            assignor: UNIFORM_ASSIGNOR.to_string(),
            ..ConsumerGroup::default()
        }
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Kafka's consumer group state.
    pub fn state(&self) -> ConsumerGroupState {
        if self.members.is_empty() {
            ConsumerGroupState::Empty
        } else if self.group_epoch > self.assignment_epoch {
            ConsumerGroupState::Assigning
        } else if self
            .members
            .values()
            .any(|m| m.state != MemberState::Stable || m.member_epoch != self.assignment_epoch)
        {
            ConsumerGroupState::Reconciling
        } else {
            ConsumerGroupState::Stable
        }
    }

    fn bump_group_epoch(&mut self) {
        self.group_epoch += 1;
        self.dirty = true;
    }

    /// Marks a member's records for writing.
    fn touch(&mut self, member_id: &str) {
        self.changed_members.insert(member_id.to_string());
    }

    /// Whether any record must be written.
    pub fn needs_write(&self) -> bool {
        self.dirty || !self.changed_members.is_empty()
    }

    /// Handles one heartbeat.
    pub fn heartbeat(
        &mut self,
        req: HeartbeatRequest,
        cfg: &ConsumerGroupConfig,
        topics: &dyn Topics,
        now_ms: i64,
    ) -> Result<HeartbeatAnswer, GroupError> {
        let answer = |member_id: &str, epoch: i32| HeartbeatAnswer {
            member_id: member_id.to_string(),
            member_epoch: epoch,
            heartbeat_interval_ms: cfg.heartbeat_interval_ms,
            assignment: None,
        };
        match req.member_epoch {
            LEAVE_GROUP_MEMBER_EPOCH => {
                self.validate_known_member(&req.member_id, req.instance_id.as_deref())?;
                self.remove_member(&req.member_id);
                return Ok(answer(&req.member_id, LEAVE_GROUP_MEMBER_EPOCH));
            }
            LEAVE_GROUP_STATIC_MEMBER_EPOCH => {
                let instance = req.instance_id.as_deref().unwrap_or_default();
                match self.static_members.get(instance) {
                    None => return Err(GroupError::UnknownMemberId),
                    Some(id) if *id != req.member_id => return Err(GroupError::FencedInstanceId),
                    Some(_) => {}
                }
                if let Some(m) = self.members.get_mut(&req.member_id) {
                    m.set_epoch(LEAVE_GROUP_STATIC_MEMBER_EPOCH);
                    m.last_heartbeat_ms = now_ms;
                    m.revocation_deadline_ms = None;
                    self.touch(&req.member_id);
                }
                return Ok(answer(&req.member_id, LEAVE_GROUP_STATIC_MEMBER_EPOCH));
            }
            _ => {}
        }

        let mut subscription_changed = false;
        let joining = req.member_epoch == 0;
        let req_epoch = req.member_epoch;
        if joining {
            subscription_changed |= self.join_member(&req, cfg, now_ms)?;
        } else {
            self.validate_known_member(&req.member_id, req.instance_id.as_deref())?;
            let m = &self.members[&req.member_id];
            if req.member_epoch > m.member_epoch || m.member_epoch < 0 {
                return Err(GroupError::FencedMemberEpoch);
            }
            if req.member_epoch < m.member_epoch {
                let owned_subset = req
                    .owned
                    .as_ref()
                    .is_some_and(|o| is_subset(o, &m.assigned));
                if req.member_epoch != m.previous_member_epoch || !owned_subset {
                    return Err(GroupError::FencedMemberEpoch);
                }
            }
        }

        // The member's (new) subscription and details.
        {
            let m = self
                .members
                .get_mut(&req.member_id)
                .expect("the member was found or created above");
            m.last_heartbeat_ms = now_ms;
            if req.rebalance_timeout_ms != -1 {
                m.rebalance_timeout_ms = req.rebalance_timeout_ms;
            }
            if let Some(names) = &req.subscribed_topic_names {
                let mut names = names.clone();
                names.sort();
                names.dedup();
                if names != m.subscribed_topic_names {
                    m.subscribed_topic_names = names;
                    subscription_changed = true;
                }
            }
            if let Some(re) = &req.subscribed_topic_regex {
                let re = (!re.is_empty()).then(|| re.clone());
                if re != m.subscribed_topic_regex {
                    m.subscribed_topic_regex = re;
                    subscription_changed = true;
                }
            }
            if let Some(a) = &req.server_assignor {
                if m.server_assignor.as_ref() != Some(a) {
                    m.server_assignor = Some(a.clone());
                    subscription_changed = true;
                }
            }
            let mut details_changed = false;
            if req.rack_id.is_some() && req.rack_id != m.rack_id {
                m.rack_id = req.rack_id.clone();
                details_changed = true;
            }
            if !req.client_id.is_empty() && req.client_id != m.client_id {
                m.client_id = req.client_id.clone();
                details_changed = true;
            }
            if !req.client_host.is_empty() && req.client_host != m.client_host {
                m.client_host = req.client_host.clone();
                details_changed = true;
            }
            if details_changed || subscription_changed || joining {
                self.touch(&req.member_id);
            }
        }
        if subscription_changed {
            self.bump_group_epoch();
        }
        self.refresh_subscriptions(topics, subscription_changed);
        self.maybe_compute_target();

        let before = self.members[&req.member_id].clone();
        self.reconcile(&req.member_id, req.owned.as_ref(), now_ms);
        let m = &self.members[&req.member_id];
        let full = req.rebalance_timeout_ms != -1
            && (req.subscribed_topic_names.is_some() || req.subscribed_topic_regex.is_some())
            && req.owned.is_some();
        tracing::debug!(
            member_id = %m.member_id,
            received = req_epoch,
            epoch = m.member_epoch,
            state = ?m.state,
            group_epoch = self.group_epoch,
            assignment_epoch = self.assignment_epoch,
            "consumer group heartbeat"
        );
        let mut a = answer(&m.member_id, m.member_epoch);
        if joining
            || full
            || before.assigned != m.assigned
            || before.member_epoch != m.member_epoch
            || req_epoch != m.member_epoch
        {
            a.assignment = Some(m.assigned.clone());
        }
        Ok(a)
    }

    /// A static member must present the member id its instance maps to; a
    /// dynamic member must be known.
    fn validate_known_member(
        &self,
        member_id: &str,
        instance_id: Option<&str>,
    ) -> Result<(), GroupError> {
        if let Some(instance) = instance_id {
            match self.static_members.get(instance) {
                None => return Err(GroupError::UnknownMemberId),
                Some(id) if id != member_id => return Err(GroupError::FencedInstanceId),
                Some(_) => {}
            }
        }
        if !self.members.contains_key(member_id) {
            return Err(GroupError::UnknownMemberId);
        }
        Ok(())
    }

    /// A heartbeat with epoch 0: a new member, a known member rejoining, or
    /// a static member replacing its previous incarnation. Returns whether
    /// the group changed in a way that needs a new group epoch.
    fn join_member(
        &mut self,
        req: &HeartbeatRequest,
        cfg: &ConsumerGroupConfig,
        now_ms: i64,
    ) -> Result<bool, GroupError> {
        if let Some(instance) = &req.instance_id {
            if let Some(old_id) = self.static_members.get(instance).cloned() {
                if old_id == req.member_id {
                    // The same incarnation rejoining: treated as a known member.
                    return Ok(false);
                }
                let old = self.members.get(&old_id).cloned();
                if old
                    .as_ref()
                    .is_some_and(|o| o.member_epoch != LEAVE_GROUP_STATIC_MEMBER_EPOCH)
                {
                    return Err(GroupError::UnreleasedInstanceId);
                }
                if self.members.contains_key(&req.member_id) {
                    return Err(GroupError::InvalidRequest(
                        "MemberId is already used by another member.",
                    ));
                }
                // The new incarnation takes over the old one's assignment
                // and target: no rebalance (KIP-345's point).
                let mut m = old.unwrap_or_else(|| ConsumerMember::new(&req.member_id, now_ms));
                self.members.remove(&old_id);
                m.member_id = req.member_id.clone();
                m.member_epoch = 0;
                m.previous_member_epoch = -1;
                m.state = MemberState::Stable;
                m.instance_id = Some(instance.clone());
                // The new incarnation starts at epoch 0 and may commit
                // what it took over (Kafka resets the assignment epochs
                // of a static member that leaves).
                for e in m.assignment_epochs.values_mut() {
                    *e = 0;
                }
                for tp in held(&m) {
                    self.owners.insert(tp, req.member_id.clone());
                }
                if let Some(t) = self.target.remove(&old_id) {
                    self.target.insert(req.member_id.clone(), t);
                }
                self.members.insert(req.member_id.clone(), m);
                self.static_members
                    .insert(instance.clone(), req.member_id.clone());
                self.touch(&old_id);
                self.touch(&req.member_id);
                return Ok(false);
            }
        }
        if self.members.contains_key(&req.member_id) {
            return Ok(false);
        }
        if self.members.len() >= cfg.max_size {
            return Err(GroupError::GroupMaxSizeReached);
        }
        let mut m = ConsumerMember::new(&req.member_id, now_ms);
        m.instance_id = req.instance_id.clone();
        if let Some(instance) = &req.instance_id {
            self.static_members
                .insert(instance.clone(), req.member_id.clone());
        }
        self.members.insert(req.member_id.clone(), m);
        Ok(true)
    }

    /// Removes a member (left, expired or fenced): its partitions are
    /// free at once, and the group needs a new assignment.
    pub fn remove_member(&mut self, member_id: &str) {
        let Some(m) = self.members.remove(member_id) else {
            return;
        };
        for tp in held(&m) {
            if self.owners.get(&tp).map(String::as_str) == Some(member_id) {
                self.owners.remove(&tp);
            }
        }
        if let Some(instance) = &m.instance_id {
            if self.static_members.get(instance).map(String::as_str) == Some(member_id) {
                self.static_members.remove(instance);
            }
        }
        self.target.remove(member_id);
        self.touch(member_id);
        self.bump_group_epoch();
    }

    /// Re-resolves regexes and the subscription metadata when a member's
    /// subscription or the topics changed; a changed subscription
    /// metadata bumps the group epoch.
    pub fn refresh_subscriptions(&mut self, topics: &dyn Topics, force: bool) {
        let version = topics.version();
        if !force && self.topics_version == Some(version) {
            return;
        }
        self.topics_version = Some(version);
        let regexes: BTreeSet<&String> = self
            .members
            .values()
            .filter_map(|m| m.subscribed_topic_regex.as_ref())
            .collect();
        let mut resolved = BTreeMap::new();
        if !regexes.is_empty() {
            let names = topics.names();
            for re in regexes {
                // Regexes were validated when they came in; one that no
                // longer compiles (a replayed record) matches nothing.
                let matched = compile_regex(re)
                    .map(|r| names.iter().filter(|n| r.is_match(n)).cloned().collect())
                    .unwrap_or_default();
                resolved.insert(re.clone(), matched);
            }
        }
        self.resolved_regexes = resolved;
        let mut subscribed = BTreeMap::new();
        for m in self.members.values() {
            for t in self.member_topics(m) {
                if let Some(n) = topics.partition_count(&t) {
                    subscribed.insert(t, n);
                }
            }
        }
        let hash = subscription_hash(&subscribed);
        self.subscribed = subscribed;
        if hash != self.metadata_hash {
            self.metadata_hash = hash;
            self.bump_group_epoch();
        }
    }

    /// The topics a member subscribes to (names and regex matches).
    fn member_topics(&self, m: &ConsumerMember) -> BTreeSet<String> {
        let mut out: BTreeSet<String> = m.subscribed_topic_names.iter().cloned().collect();
        if let Some(re) = &m.subscribed_topic_regex {
            if let Some(matched) = self.resolved_regexes.get(re) {
                out.extend(matched.iter().cloned());
            }
        }
        out
    }

    /// The assignor the group uses: the one most members ask for (ties:
    /// the default order), else the default.
    fn preferred_assignor(&self) -> &'static str {
        let mut best = ASSIGNORS[0];
        let mut best_votes = 0;
        for a in ASSIGNORS {
            let votes = self
                .members
                .values()
                .filter(|m| m.server_assignor.as_deref() == Some(a))
                .count();
            if votes > best_votes {
                best = a;
                best_votes = votes;
            }
        }
        best
    }

    /// Computes a new target assignment when the group epoch moved.
    pub fn maybe_compute_target(&mut self) {
        if self.assignment_epoch >= self.group_epoch {
            return;
        }
        let assignor = self.preferred_assignor();
        let subscriptions: BTreeMap<String, BTreeSet<String>> = self
            .members
            .values()
            .map(|m| {
                let topics = self
                    .member_topics(m)
                    .into_iter()
                    .filter(|t| self.subscribed.contains_key(t))
                    .collect();
                (m.member_id.clone(), topics)
            })
            .collect();
        self.target = match assignor {
            RANGE_ASSIGNOR => assign_range(&subscriptions, &self.subscribed),
            _ => assign_uniform(&subscriptions, &self.subscribed, &self.target),
        };
        self.assignor = assignor.to_string();
        self.assignment_epoch = self.group_epoch;
        self.dirty = true;
        let ids: Vec<String> = self.members.keys().cloned().collect();
        for id in ids {
            self.touch(&id);
        }
    }

    /// Walks a member towards its target assignment (Kafka's
    /// `CurrentAssignmentBuilder`). `owned`: what the client reported it
    /// holds (None: not reported, assume it still holds what it had).
    fn reconcile(&mut self, member_id: &str, owned: Option<&Assignment>, now_ms: i64) {
        let Some(m) = self.members.get(member_id) else {
            return;
        };
        let target_epoch = self.assignment_epoch;
        let owns_any = |revoking: &Assignment| match owned {
            None => !revoking.is_empty(),
            Some(o) => revoking
                .iter()
                .any(|(t, ps)| o.get(t).is_some_and(|op| !op.is_disjoint(ps))),
        };
        let next = match m.state {
            MemberState::Stable if m.member_epoch == target_epoch => None,
            MemberState::Stable | MemberState::UnreleasedPartitions => {
                Some(self.next_assignment(m, m.member_epoch, &owns_any))
            }
            MemberState::UnrevokedPartitions => {
                if owns_any(&m.pending_revocation) {
                    None
                } else {
                    let epoch = (m.member_epoch + 1).min(target_epoch);
                    Some(self.next_assignment(m, epoch, &owns_any))
                }
            }
        };
        let Some((state, epoch, assigned, revoking)) = next else {
            return;
        };
        let m = self.members.get_mut(member_id).expect("looked up above");
        let old_held: BTreeSet<(String, i32)> = held(m).collect();
        if state == MemberState::UnrevokedPartitions {
            if m.state != MemberState::UnrevokedPartitions || m.revocation_deadline_ms.is_none() {
                m.revocation_deadline_ms = Some(now_ms + i64::from(m.rebalance_timeout_ms.max(0)));
            }
        } else {
            m.revocation_deadline_ms = None;
        }
        let changed = m.state != state
            || m.member_epoch != epoch
            || m.assigned != assigned
            || m.pending_revocation != revoking;
        m.state = state;
        m.set_epoch(epoch);
        m.assigned = assigned;
        m.pending_revocation = revoking;
        let new_held: BTreeSet<(String, i32)> = held(m).collect();
        m.assignment_epochs.retain(|tp, _| new_held.contains(tp));
        for tp in new_held.difference(&old_held) {
            m.assignment_epochs.insert(tp.clone(), epoch);
        }
        for tp in old_held.difference(&new_held) {
            if self.owners.get(tp).map(String::as_str) == Some(member_id) {
                self.owners.remove(tp);
            }
        }
        for tp in new_held {
            self.owners.insert(tp, member_id.to_string());
        }
        if changed {
            self.touch(member_id);
        }
    }

    /// Kafka's `computeNextAssignment`: (state, epoch, assigned, pending
    /// revocation) for a member at `member_epoch`.
    fn next_assignment(
        &self,
        m: &ConsumerMember,
        member_epoch: i32,
        owns_any: &dyn Fn(&Assignment) -> bool,
    ) -> (MemberState, i32, Assignment, Assignment) {
        let empty = Assignment::new();
        let target = self.target.get(&m.member_id).unwrap_or(&empty);
        let topics: BTreeSet<&String> = target.keys().chain(m.assigned.keys()).collect();
        let mut assigned = Assignment::new();
        let mut revoking = Assignment::new();
        let mut to_assign = Assignment::new();
        let mut unreleased = false;
        let none = BTreeSet::new();
        for t in topics {
            let tgt = target.get(t).unwrap_or(&none);
            let cur = m.assigned.get(t).unwrap_or(&none);
            let keep: BTreeSet<i32> = cur.intersection(tgt).copied().collect();
            let revoke: BTreeSet<i32> = cur.difference(tgt).copied().collect();
            let mut add = BTreeSet::new();
            for p in tgt.difference(cur) {
                match self.owners.get(&(t.clone(), *p)) {
                    Some(owner) if *owner != m.member_id => unreleased = true,
                    _ => {
                        add.insert(*p);
                    }
                }
            }
            if !keep.is_empty() {
                assigned.insert(t.clone(), keep);
            }
            if !revoke.is_empty() {
                revoking.insert(t.clone(), revoke);
            }
            if !add.is_empty() {
                to_assign.insert(t.clone(), add);
            }
        }
        let target_epoch = self.assignment_epoch;
        if !revoking.is_empty() && owns_any(&revoking) {
            (
                MemberState::UnrevokedPartitions,
                member_epoch,
                assigned,
                revoking,
            )
        } else {
            for (t, ps) in to_assign {
                assigned.entry(t).or_default().extend(ps);
            }
            let state = if unreleased {
                MemberState::UnreleasedPartitions
            } else {
                MemberState::Stable
            };
            (state, target_epoch, assigned, Assignment::new())
        }
    }

    /// Expires members whose session timed out and fences members that
    /// did not revoke within their rebalance timeout; re-resolves
    /// subscriptions when the topics changed, and moves members waiting
    /// for released partitions along. Returns the ids removed.
    pub fn poll(
        &mut self,
        cfg: &ConsumerGroupConfig,
        topics: &dyn Topics,
        now_ms: i64,
    ) -> Vec<String> {
        let gone: Vec<String> = self
            .members
            .values()
            .filter(|m| {
                now_ms >= m.last_heartbeat_ms + i64::from(m.session_timeout_ms(cfg))
                    || m.revocation_deadline_ms.is_some_and(|d| now_ms >= d)
                    || m.classic_deadline_ms.is_some_and(|d| now_ms >= d)
            })
            .map(|m| m.member_id.clone())
            .collect();
        for id in &gone {
            self.remove_member(id);
        }
        self.refresh_subscriptions(topics, false);
        self.maybe_compute_target();
        gone
    }

    /// Builds the consumer group of an online upgrade from a classic
    /// group's generation and members (Kafka's
    /// `ConsumerGroup.fromClassicGroup`): every member keeps its classic
    /// assignment as both its current and its target assignment, at
    /// member epoch = group epoch = assignment epoch = the generation, so
    /// nothing moves until the member that triggered the upgrade joins.
    /// Members are (snapshot, metadata of the group's protocol, current
    /// assignment bytes). A member whose metadata or assignment does not
    /// decode makes the upgrade fail (the caller answers
    /// GROUP_ID_NOT_FOUND, as Kafka does). Partitions of topics that no
    /// longer exist, and a partition claimed twice, are dropped.
    pub fn from_classic(
        generation_id: i32,
        members: Vec<(ClassicMemberSnapshot, Bytes, Bytes)>,
        topics: &dyn Topics,
        now_ms: i64,
    ) -> Result<ConsumerGroup, GroupError> {
        let mut c = ConsumerGroup::new();
        c.group_epoch = generation_id;
        c.assignment_epoch = generation_id;
        for (snap, metadata, assignment) in members {
            let sub = consumer_protocol::decode_subscription(&metadata)
                .map_err(|_| GroupError::GroupIdNotFound)?;
            if sub.topics.len() > SUBSCRIBED_TOPIC_NAMES_MAX {
                return Err(GroupError::GroupIdNotFound);
            }
            let mut assigned = consumer_protocol::decode_assignment(&assignment)
                .map_err(|_| GroupError::GroupIdNotFound)?;
            for (t, ps) in assigned.iter_mut() {
                let count = topics.partition_count(t).unwrap_or(0);
                ps.retain(|p| (0..count).contains(p) && !c.owners.contains_key(&(t.clone(), *p)));
            }
            assigned.retain(|_, ps| !ps.is_empty());
            let mut m = ConsumerMember::new(&snap.member_id, now_ms);
            m.instance_id = snap.instance_id;
            m.rack_id = sub.rack_id;
            m.client_id = snap.client_id;
            m.client_host = snap.client_host;
            let mut names = sub.topics;
            names.sort();
            names.dedup();
            m.subscribed_topic_names = names;
            m.rebalance_timeout_ms = snap.rebalance_timeout_ms;
            m.member_epoch = generation_id;
            m.previous_member_epoch = generation_id;
            m.classic = Some(ClassicMemberMetadata {
                session_timeout_ms: snap.session_timeout_ms,
                protocols: snap.protocols,
            });
            for tp in assigned
                .iter()
                .flat_map(|(t, ps)| ps.iter().map(move |p| (t.clone(), *p)))
            {
                c.owners.insert(tp.clone(), m.member_id.clone());
                m.assignment_epochs.insert(tp, generation_id);
            }
            m.assigned = assigned.clone();
            c.target.insert(m.member_id.clone(), assigned);
            if let Some(i) = &m.instance_id {
                c.static_members.insert(i.clone(), m.member_id.clone());
            }
            c.touch(&m.member_id);
            c.members.insert(m.member_id.clone(), m);
        }
        // The subscription as of the conversion, without a new epoch: the
        // joining member's heartbeat bumps it.
        c.refresh_subscriptions(topics, true);
        c.group_epoch = generation_id;
        c.dirty = true;
        Ok(c)
    }

    /// Whether every member uses the classic protocol except `except`
    /// (Kafka's `allMembersUseClassicProtocolExcept`).
    pub fn all_classic_except(&self, except: &str) -> bool {
        self.members
            .values()
            .all(|m| m.member_id == except || m.classic.is_some())
    }

    /// Whether a classic member with these protocols may join (Kafka's
    /// `supportsClassicProtocols`): protocol type `consumer`, and, when
    /// classic members are present, a protocol all of them support.
    fn supports_classic_protocols(
        &self,
        protocol_type: &str,
        protocols: &[(String, Bytes)],
    ) -> bool {
        if protocol_type != "consumer" || protocols.is_empty() {
            return false;
        }
        let classic: Vec<&ClassicMemberMetadata> = self
            .members
            .values()
            .filter_map(|m| m.classic.as_ref())
            .collect();
        classic.is_empty()
            || protocols.iter().any(|(name, _)| {
                classic
                    .iter()
                    .all(|c| c.protocols.iter().any(|(n, _)| n == name))
            })
    }

    /// A JoinGroup from a classic member (Kafka's
    /// `classicGroupJoinToConsumerGroup`): the member joins or updates its
    /// subscription from its JoinGroup metadata like a heartbeat would,
    /// and is reconciled with the partitions its metadata says it owns.
    /// Its generation is its member epoch, which stays at the old epoch
    /// while it still must revoke partitions: it gets (through SyncGroup)
    /// what it may keep, revokes the rest and rejoins.
    pub fn classic_join(
        &mut self,
        req: ClassicJoin,
        cfg: &ConsumerGroupConfig,
        topics: &dyn Topics,
        now_ms: i64,
    ) -> Result<ClassicJoinAnswer, GroupError> {
        // A static member coming back under a new member id (a restarted
        // client: JoinGroup without member id) replaces its previous
        // incarnation and takes its assignment over (Kafka's
        // `getOrMaybeSubscribeStaticConsumerGroupMember`); with a member id,
        // its instance id must map to it.
        let replaced = match &req.instance_id {
            None => None,
            Some(instance) => match self.static_members.get(instance) {
                Some(old) if *old == req.member_id => None,
                Some(_) if !req.unknown_member => return Err(GroupError::FencedInstanceId),
                Some(old) => Some(old.clone()),
                None if !req.unknown_member => return Err(GroupError::UnknownMemberId),
                None => None,
            },
        };
        let known = self.members.contains_key(&req.member_id) || replaced.is_some();
        if !known && self.members.len() >= cfg.max_size {
            return Err(GroupError::GroupMaxSizeReached);
        }
        if !self.supports_classic_protocols(&req.protocol_type, &req.protocols) {
            return Err(GroupError::InconsistentGroupProtocol);
        }
        if req.unknown_member && req.require_known_member_id && req.instance_id.is_none() {
            return Err(GroupError::MemberIdRequired(req.member_id));
        }
        if let Some(m) = self.members.get(&req.member_id) {
            if m.classic.is_none() {
                return Err(GroupError::UnknownMemberId);
            }
        }
        let (_, metadata) = &req.protocols[0];
        let sub = consumer_protocol::decode_subscription(metadata)
            .map_err(|_| GroupError::InconsistentGroupProtocol)?;
        if sub.topics.len() > SUBSCRIBED_TOPIC_NAMES_MAX {
            return Err(GroupError::InvalidRequest(
                "SubscribedTopicNames has too many topics.",
            ));
        }
        if let Some(old) = &replaced {
            // The join below hands the old incarnation's assignment to the
            // new member id, as for a static member that left with -2.
            if let Some(m) = self.members.get_mut(old) {
                m.member_epoch = LEAVE_GROUP_STATIC_MEMBER_EPOCH;
            }
        }
        let member_epoch = self
            .members
            .get(&req.member_id)
            .map_or(0, |m| m.member_epoch);
        let hb = HeartbeatRequest {
            member_id: req.member_id.clone(),
            member_epoch,
            instance_id: req.instance_id.clone(),
            rack_id: sub.rack_id.clone(),
            rebalance_timeout_ms: req.rebalance_timeout_ms,
            subscribed_topic_names: Some(sub.topics.clone()),
            subscribed_topic_regex: None,
            server_assignor: None,
            // Kafka reads a subscription without owned partitions (v0) as
            // owning none: an eager member revoked everything before it
            // rejoined.
            owned: Some(sub.owned.clone().unwrap_or_default()),
            client_id: req.client_id.clone(),
            client_host: req.client_host.clone(),
        };
        self.heartbeat(hb, cfg, topics, now_ms)?;
        let classic = ClassicMemberMetadata {
            session_timeout_ms: req.session_timeout_ms,
            protocols: req.protocols,
        };
        let m = self
            .members
            .get_mut(&req.member_id)
            .expect("the heartbeat added the member");
        if m.classic.as_ref() != Some(&classic) {
            m.classic = Some(classic);
            self.touch(&req.member_id);
        }
        let m = &mut self.members.get_mut(&req.member_id).expect("present");
        // The member must now send SyncGroup within its rebalance timeout.
        m.classic_deadline_ms = Some(now_ms + i64::from(m.rebalance_timeout_ms.max(0)));
        Ok(ClassicJoinAnswer {
            member_id: m.member_id.clone(),
            generation_id: m.member_epoch,
            protocol_name: m
                .classic
                .as_ref()
                .map(|c| c.protocol_name().to_string())
                .unwrap_or_default(),
        })
    }

    /// The member a classic request names: validated as Kafka's
    /// `validateConsumerGroupMember`, then it must use the classic
    /// protocol (else UNKNOWN_MEMBER_ID) and present its epoch as
    /// generation (else ILLEGAL_GENERATION).
    fn classic_member(
        &self,
        member_id: &str,
        instance_id: Option<&str>,
        generation_id: i32,
    ) -> Result<&ConsumerMember, GroupError> {
        self.validate_known_member(member_id, instance_id)?;
        let m = &self.members[member_id];
        if m.classic.is_none() {
            return Err(GroupError::UnknownMemberId);
        }
        if m.member_epoch != generation_id {
            return Err(GroupError::IllegalGeneration);
        }
        Ok(m)
    }

    /// Tells a classic member to rejoin: REBALANCE_IN_PROGRESS, and it is
    /// fenced if it does not rejoin within its rebalance timeout.
    fn classic_rejoin(&mut self, member_id: &str, now_ms: i64) -> GroupError {
        if let Some(m) = self.members.get_mut(member_id) {
            if m.classic_deadline_ms.is_none() {
                m.classic_deadline_ms = Some(now_ms + i64::from(m.rebalance_timeout_ms.max(0)));
            }
        }
        GroupError::RebalanceInProgress
    }

    /// A SyncGroup from a classic member (Kafka's
    /// `classicGroupSyncToConsumerGroup`): the member's current assignment
    /// (what it may own now, without what it must revoke), encoded in the
    /// ConsumerProtocolAssignment version of its metadata.
    pub fn classic_sync(
        &mut self,
        member_id: &str,
        instance_id: Option<&str>,
        generation_id: i32,
        protocol_type: Option<&str>,
        protocol_name: Option<&str>,
        now_ms: i64,
    ) -> Result<Bytes, GroupError> {
        let m = self.classic_member(member_id, instance_id, generation_id)?;
        let classic = m.classic.as_ref().expect("checked by classic_member");
        if protocol_type.is_some_and(|t| t != "consumer")
            || protocol_name.is_some_and(|n| n != classic.protocol_name())
        {
            return Err(GroupError::InconsistentGroupProtocol);
        }
        if self.group_epoch > m.member_epoch && m.state != MemberState::UnrevokedPartitions {
            return Err(self.classic_rejoin(member_id, now_ms));
        }
        let version = classic
            .protocols
            .first()
            .and_then(|(_, md)| consumer_protocol::version(md).ok())
            .unwrap_or(0);
        let assignment = consumer_protocol::encode_assignment(&m.assigned, version);
        let m = self.members.get_mut(member_id).expect("present");
        m.classic_deadline_ms = None;
        m.last_heartbeat_ms = now_ms;
        Ok(assignment)
    }

    /// A Heartbeat from a classic member (Kafka's
    /// `classicGroupHeartbeatToConsumerGroup`): REBALANCE_IN_PROGRESS
    /// when the member must rejoin, because the group epoch moved past
    /// its epoch, it must revoke partitions, or partitions it waits for
    /// were released.
    pub fn classic_heartbeat(
        &mut self,
        member_id: &str,
        instance_id: Option<&str>,
        generation_id: i32,
        now_ms: i64,
    ) -> Result<(), GroupError> {
        let m = self.classic_member(member_id, instance_id, generation_id)?;
        let rejoin = m.member_epoch < self.group_epoch
            || m.state == MemberState::UnrevokedPartitions
            || (m.state == MemberState::UnreleasedPartitions
                && !self.waiting_on_unreleased_partition(m));
        self.members
            .get_mut(member_id)
            .expect("present")
            .last_heartbeat_ms = now_ms;
        if rejoin {
            return Err(self.classic_rejoin(member_id, now_ms));
        }
        Ok(())
    }

    /// Whether a partition of the member's target is still held by
    /// another member (Kafka's `waitingOnUnreleasedPartition`).
    fn waiting_on_unreleased_partition(&self, m: &ConsumerMember) -> bool {
        self.target.get(&m.member_id).is_some_and(|t| {
            t.iter().any(|(topic, ps)| {
                ps.iter().any(|p| {
                    self.owners
                        .get(&(topic.clone(), *p))
                        .is_some_and(|o| *o != m.member_id)
                })
            })
        })
    }

    /// A LeaveGroup entry (member id, instance id) for this group (Kafka
    /// 4.4's `classicGroupLeaveToConsumerGroup`): removes the member,
    /// whichever protocol it uses (an admin removal may name a
    /// consumer-protocol member); an instance id alone names a static
    /// member. Returns the id of the member removed.
    pub fn classic_leave(
        &mut self,
        member_id: &str,
        instance_id: Option<&str>,
    ) -> Result<String, GroupError> {
        let id = match instance_id {
            None => member_id.to_string(),
            Some(instance) => {
                let Some(id) = self.static_members.get(instance).cloned() else {
                    return Err(GroupError::UnknownMemberId);
                };
                if !member_id.is_empty() && id != member_id {
                    return Err(GroupError::FencedInstanceId);
                }
                id
            }
        };
        if !self.members.contains_key(&id) {
            return Err(GroupError::UnknownMemberId);
        }
        self.remove_member(&id);
        Ok(id)
    }

    /// Every partition of every member's current assignment, for
    /// OffsetDelete's "subscribed" check.
    pub fn subscribed_topic_names(&self) -> Vec<String> {
        self.subscribed.keys().cloned().collect()
    }

    /// Checks an OffsetCommit against the group (Kafka's
    /// `ConsumerGroup.validateOffsetCommit` with KIP-1251's assignment
    /// epochs, Kafka 4.3+): `member_epoch` < 0 with an empty member id is
    /// an admin commit, allowed only when the group is empty. An epoch
    /// above the member's is stale; the member's own epoch may commit
    /// anything. An older epoch (a heartbeat moved the member on and the
    /// client has not read the answer yet) returns `Some(epoch)`: each
    /// partition is then checked with [`Self::committable`].
    pub fn validate_offset_commit(
        &self,
        member_id: &str,
        member_epoch: i32,
        transactional: bool,
    ) -> Result<Option<i32>, GroupError> {
        if member_epoch < 0 && self.members.is_empty() {
            return Ok(None);
        }
        let Some(m) = self.members.get(member_id) else {
            return Err(GroupError::UnknownMemberId);
        };
        if member_epoch == m.member_epoch {
            return Ok(None);
        }
        if m.classic.is_some() {
            // A classic member commits with its generation, which must be
            // its member epoch exactly (Kafka's `validateMemberEpoch`).
            return Err(GroupError::IllegalGeneration);
        }
        if member_epoch > m.member_epoch {
            tracing::debug!(
                member_id,
                received = member_epoch,
                expected = m.member_epoch,
                "offset commit with a member epoch above the member's"
            );
            return Err(stale_commit_error(transactional));
        }
        Ok(Some(member_epoch))
    }

    /// Whether a commit with the older member epoch `epoch` may commit
    /// `topic`-`partition`: the member holds it and has held it since
    /// `epoch` or before (assignment epoch <= `epoch`).
    pub fn committable(&self, member_id: &str, epoch: i32, topic: &str, partition: i32) -> bool {
        self.members
            .get(member_id)
            .and_then(|m| m.assignment_epochs.get(&(topic.to_string(), partition)))
            .is_some_and(|&assigned_at| assigned_at <= epoch)
    }

    /// Checks an OffsetFetch by a member (Kafka's
    /// `ConsumerGroup.validateOffsetFetch`).
    pub fn validate_offset_fetch(
        &self,
        member_id: &str,
        member_epoch: i32,
    ) -> Result<(), GroupError> {
        let Some(m) = self.members.get(member_id) else {
            return Err(GroupError::UnknownMemberId);
        };
        if member_epoch != m.member_epoch {
            return Err(GroupError::StaleMemberEpoch);
        }
        Ok(())
    }

    /// Installs a member rebuilt from records (replay).
    pub fn restore_member(&mut self, m: ConsumerMember) {
        self.members.insert(m.member_id.clone(), m);
    }

    /// Restores the owners index after a replay.
    pub fn rebuild_owners(&mut self) {
        self.owners.clear();
        let mut owners = HashMap::new();
        for m in self.members.values() {
            for tp in held(m) {
                owners.insert(tp, m.member_id.clone());
            }
        }
        self.owners = owners;
        self.static_members = self
            .members
            .values()
            .filter_map(|m| m.instance_id.clone().map(|i| (i, m.member_id.clone())))
            .collect();
    }

    /// The invariants of the module doc; panics when one is broken (tests).
    pub fn check_invariants(&self) {
        let mut seen: HashMap<(String, i32), &str> = HashMap::new();
        for m in self.members.values() {
            for tp in held(m) {
                if let Some(other) = seen.insert(tp.clone(), &m.member_id) {
                    panic!("{tp:?} held by {other} and {}", m.member_id);
                }
                assert_eq!(
                    self.owners.get(&tp).map(String::as_str),
                    Some(m.member_id.as_str()),
                    "owner index of {tp:?}"
                );
            }
            assert!(m.member_epoch <= self.assignment_epoch);
            if let Some(i) = &m.instance_id {
                assert_eq!(self.static_members.get(i), Some(&m.member_id));
            }
        }
        assert_eq!(seen.len(), self.owners.len(), "stale owner entries");
        assert!(self.assignment_epoch <= self.group_epoch);
    }
}

/// A stable hash (FNV-1a, 64 bits) of the subscribed topics and their
/// partition counts. 0 is kept for "nothing subscribed".
pub fn subscription_hash(subscribed: &BTreeMap<String, i32>) -> i64 {
    if subscribed.is_empty() {
        return 0;
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    };
    for (t, n) in subscribed {
        eat(t.as_bytes());
        eat(&[0]);
        eat(&n.to_be_bytes());
    }
    h as i64
}

/// The error of a commit refused for its member epoch: STALE_MEMBER_EPOCH,
/// or ILLEGAL_GENERATION for TxnOffsetCommit (as Kafka answers both).
pub fn stale_commit_error(transactional: bool) -> GroupError {
    if transactional {
        GroupError::IllegalGeneration
    } else {
        GroupError::StaleMemberEpoch
    }
}

/// Every (topic, partition) a member holds: assigned or pending revocation.
fn held(m: &ConsumerMember) -> impl Iterator<Item = (String, i32)> + '_ {
    m.assigned
        .iter()
        .chain(m.pending_revocation.iter())
        .flat_map(|(t, ps)| ps.iter().map(move |p| (t.clone(), *p)))
}

/// Whether every partition of `a` is in `b`.
fn is_subset(a: &Assignment, b: &Assignment) -> bool {
    a.iter()
        .all(|(t, ps)| ps.is_empty() || b.get(t).is_some_and(|bp| ps.is_subset(bp)))
}

/// The `range` assignor: per topic, contiguous ranges over the members
/// subscribed to it, in member-id order.
pub fn assign_range(
    subscriptions: &BTreeMap<String, BTreeSet<String>>,
    topics: &BTreeMap<String, i32>,
) -> BTreeMap<String, Assignment> {
    let mut out: BTreeMap<String, Assignment> = subscriptions
        .keys()
        .map(|m| (m.clone(), Assignment::new()))
        .collect();
    for (topic, &count) in topics {
        let members: Vec<&String> = subscriptions
            .iter()
            .filter(|(_, ts)| ts.contains(topic))
            .map(|(m, _)| m)
            .collect();
        if members.is_empty() || count <= 0 {
            continue;
        }
        let n = members.len() as i32;
        let (per, extra) = (count / n, count % n);
        let mut next = 0;
        for (i, m) in members.into_iter().enumerate() {
            let take = per + i32::from((i as i32) < extra);
            if take > 0 {
                out.get_mut(m)
                    .expect("every subscriber has an entry")
                    .insert(topic.clone(), (next..next + take).collect());
            }
            next += take;
        }
    }
    out
}

/// The `uniform` assignor: balanced and sticky (see the module doc).
pub fn assign_uniform(
    subscriptions: &BTreeMap<String, BTreeSet<String>>,
    topics: &BTreeMap<String, i32>,
    previous: &BTreeMap<String, Assignment>,
) -> BTreeMap<String, Assignment> {
    let mut out: BTreeMap<String, Assignment> = subscriptions
        .keys()
        .map(|m| (m.clone(), Assignment::new()))
        .collect();
    let mut counts: BTreeMap<&String, usize> = subscriptions.keys().map(|m| (m, 0)).collect();
    // Every partition to place, and which members may take it.
    let all: Vec<(String, i32)> = topics
        .iter()
        .filter(|(t, _)| subscriptions.values().any(|s| s.contains(*t)))
        .flat_map(|(t, &n)| (0..n.max(0)).map(move |p| (t.clone(), p)))
        .collect();
    if subscriptions.is_empty() || all.is_empty() {
        return out;
    }
    // Sticky pass: keep previous partitions up to a fair share of the
    // partitions the member may take.
    let mut placed: BTreeSet<(String, i32)> = BTreeSet::new();
    for (m, subs) in subscriptions {
        let eligible = all.iter().filter(|(t, _)| subs.contains(t)).count();
        let sharing = subscriptions
            .values()
            .filter(|s| s.iter().any(|t| subs.contains(t)))
            .count()
            .max(1);
        let quota = eligible.div_ceil(sharing);
        let Some(prev) = previous.get(m) else {
            continue;
        };
        for (t, ps) in prev {
            if !subs.contains(t) {
                continue;
            }
            let Some(&n) = topics.get(t) else {
                continue;
            };
            for &p in ps {
                if p >= n || counts[m] >= quota || !placed.insert((t.clone(), p)) {
                    continue;
                }
                out.get_mut(m)
                    .expect("entry")
                    .entry(t.clone())
                    .or_default()
                    .insert(p);
                *counts.get_mut(m).expect("entry") += 1;
            }
        }
    }
    // Placement pass: each remaining partition to the eligible member with
    // the fewest partitions.
    for (t, p) in &all {
        if placed.contains(&(t.clone(), *p)) {
            continue;
        }
        let Some(m) = subscriptions
            .iter()
            .filter(|(_, s)| s.contains(t))
            .map(|(m, _)| m)
            .min_by_key(|m| (counts[*m], *m))
        else {
            continue;
        };
        out.get_mut(m)
            .expect("entry")
            .entry(t.clone())
            .or_default()
            .insert(*p);
        *counts.get_mut(m).expect("entry") += 1;
    }
    // Balance pass: move partitions from the fullest member to the
    // emptiest one that may take them while they differ by more than one.
    // Each move lowers the spread; bounded by the partition count.
    for _ in 0..all.len() {
        let mut moved = false;
        let by_count: Vec<&String> = {
            let mut v: Vec<&String> = subscriptions.keys().collect();
            v.sort_by_key(|m| (counts[*m], *m));
            v
        };
        'outer: for hi in by_count.iter().rev() {
            for lo in by_count.iter() {
                if counts[*lo] + 1 >= counts[*hi] {
                    break;
                }
                let lo_subs = &subscriptions[*lo];
                let candidate = out[*hi]
                    .iter()
                    .filter(|(t, _)| lo_subs.contains(*t))
                    .find_map(|(t, ps)| ps.iter().next_back().map(|p| (t.clone(), *p)));
                if let Some((t, p)) = candidate {
                    let from = out.get_mut(*hi).expect("entry");
                    let set = from.get_mut(&t).expect("found above");
                    set.remove(&p);
                    if set.is_empty() {
                        from.remove(&t);
                    }
                    out.get_mut(*lo)
                        .expect("entry")
                        .entry(t)
                        .or_default()
                        .insert(p);
                    *counts.get_mut(*hi).expect("entry") -= 1;
                    *counts.get_mut(*lo).expect("entry") += 1;
                    moved = true;
                    break 'outer;
                }
            }
        }
        if !moved {
            break;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topics(list: &[(&str, i32)]) -> BTreeMap<String, i32> {
        list.iter().map(|(t, n)| (t.to_string(), *n)).collect()
    }

    fn join(member: &str, names: &[&str]) -> HeartbeatRequest {
        HeartbeatRequest {
            member_id: member.to_string(),
            member_epoch: 0,
            rebalance_timeout_ms: 30_000,
            subscribed_topic_names: Some(names.iter().map(|s| s.to_string()).collect()),
            owned: Some(Assignment::new()),
            ..HeartbeatRequest::default()
        }
    }

    fn beat(member: &str, epoch: i32, owned: &Assignment) -> HeartbeatRequest {
        HeartbeatRequest {
            member_id: member.to_string(),
            member_epoch: epoch,
            rebalance_timeout_ms: -1,
            owned: Some(owned.clone()),
            ..HeartbeatRequest::default()
        }
    }

    fn count(a: &Assignment) -> usize {
        a.values().map(BTreeSet::len).sum()
    }

    /// Runs heartbeats for every member (each reporting what it was last
    /// told) until nothing changes; returns each member's assignment.
    fn settle(
        g: &mut ConsumerGroup,
        t: &BTreeMap<String, i32>,
        held: &mut BTreeMap<String, (i32, Assignment)>,
    ) {
        let cfg = ConsumerGroupConfig::default();
        for _ in 0..10 {
            let ids: Vec<String> = held.keys().cloned().collect();
            for id in ids {
                let (epoch, owned) = held[&id].clone();
                let a = g.heartbeat(beat(&id, epoch, &owned), &cfg, t, 1).unwrap();
                let owned = a.assignment.unwrap_or(owned);
                held.insert(id, (a.member_epoch, owned));
                g.check_invariants();
            }
        }
    }

    #[test]
    fn two_members_share_partitions_disjointly_after_reconciliation() {
        let cfg = ConsumerGroupConfig::default();
        let t = topics(&[("t", 12)]);
        let mut g = ConsumerGroup::new();
        let a = g.heartbeat(join("a", &["t"]), &cfg, &t, 0).unwrap();
        assert_eq!(a.member_epoch, 2); // join + subscription metadata
        assert_eq!(count(a.assignment.as_ref().unwrap()), 12);
        let mut held = BTreeMap::new();
        held.insert("a".to_string(), (a.member_epoch, a.assignment.unwrap()));
        let b = g.heartbeat(join("b", &["t"]), &cfg, &t, 0).unwrap();
        // b must wait: a still holds every partition.
        assert_eq!(count(b.assignment.as_ref().unwrap()), 0);
        assert_eq!(g.members["b"].state, MemberState::UnreleasedPartitions);
        held.insert("b".to_string(), (b.member_epoch, Assignment::new()));
        // a is told to revoke half, keeping its epoch until it does.
        let (ea, oa) = held["a"].clone();
        let r = g.heartbeat(beat("a", ea, &oa), &cfg, &t, 1).unwrap();
        assert_eq!(r.member_epoch, ea);
        assert_eq!(count(r.assignment.as_ref().unwrap()), 6);
        assert_eq!(g.members["a"].state, MemberState::UnrevokedPartitions);
        g.check_invariants();
        // a revokes what it was told to.
        held.insert("a".to_string(), (r.member_epoch, r.assignment.unwrap()));
        settle(&mut g, &t, &mut held);
        assert_eq!(g.state(), ConsumerGroupState::Stable);
        let (a, b) = (&held["a"].1, &held["b"].1);
        assert_eq!(count(a), 6);
        assert_eq!(count(b), 6);
        assert!(a["t"].is_disjoint(&b["t"]));
    }

    #[test]
    fn leaving_frees_partitions_and_the_others_take_them() {
        let cfg = ConsumerGroupConfig::default();
        let t = topics(&[("t", 12)]);
        let mut g = ConsumerGroup::new();
        let mut held = BTreeMap::new();
        for id in ["a", "b", "c"] {
            let r = g.heartbeat(join(id, &["t"]), &cfg, &t, 0).unwrap();
            held.insert(id.to_string(), (r.member_epoch, r.assignment.unwrap()));
            settle(&mut g, &t, &mut held);
        }
        assert!(held.values().all(|(_, a)| count(a) == 4));
        let (e, _) = held["b"].clone();
        let mut leave = beat("b", e, &Assignment::new());
        leave.member_epoch = LEAVE_GROUP_MEMBER_EPOCH;
        assert_eq!(g.heartbeat(leave, &cfg, &t, 2).unwrap().member_epoch, -1);
        held.remove("b");
        settle(&mut g, &t, &mut held);
        assert!(held.values().all(|(_, a)| count(a) == 6));
        assert_eq!(g.state(), ConsumerGroupState::Stable);
    }

    #[test]
    fn epochs_are_fenced_as_kafka_does() {
        let cfg = ConsumerGroupConfig::default();
        let t = topics(&[("t", 2)]);
        let mut g = ConsumerGroup::new();
        let r = g.heartbeat(join("a", &["t"]), &cfg, &t, 0).unwrap();
        let owned = r.assignment.unwrap();
        let e = r.member_epoch;
        assert_eq!(
            g.heartbeat(beat("a", e + 1, &owned), &cfg, &t, 1),
            Err(GroupError::FencedMemberEpoch)
        );
        assert_eq!(
            g.heartbeat(beat("zz", 1, &owned), &cfg, &t, 1),
            Err(GroupError::UnknownMemberId)
        );
        assert_eq!(g.members["a"].previous_member_epoch, 0);
        assert_eq!(g.validate_offset_commit("a", e, false), Ok(None));
        // An older epoch is checked partition by partition (KIP-1251).
        assert_eq!(g.validate_offset_commit("a", e - 1, false), Ok(Some(e - 1)));
        assert!(!g.committable("a", e - 1, "t", 0), "assigned at epoch {e}");
        assert_eq!(
            g.validate_offset_commit("a", e + 1, false),
            Err(GroupError::StaleMemberEpoch)
        );
        assert_eq!(
            g.validate_offset_commit("a", e + 1, true),
            Err(GroupError::IllegalGeneration)
        );
        assert_eq!(
            g.validate_offset_commit("b", e, false),
            Err(GroupError::UnknownMemberId)
        );
        assert_eq!(
            g.validate_offset_commit("", -1, false),
            Err(GroupError::UnknownMemberId)
        );
    }

    /// KIP-1251: a member that acknowledged a revocation moves to a new
    /// epoch; a commit it built before reading that answer carries the
    /// old epoch and may still commit the partitions it kept, not those
    /// it gave up.
    #[test]
    fn a_commit_with_the_epoch_before_a_bump_commits_what_was_held_since() {
        let cfg = ConsumerGroupConfig::default();
        let t = topics(&[("t", 4)]);
        let mut g = ConsumerGroup::new();
        let r = g.heartbeat(join("a", &["t"]), &cfg, &t, 0).unwrap();
        let all = r.assignment.unwrap();
        let ea = r.member_epoch;
        assert_eq!(all["t"].len(), 4);
        g.heartbeat(join("b", &["t"]), &cfg, &t, 1).unwrap();
        let revoking = g.heartbeat(beat("a", ea, &all), &cfg, &t, 2).unwrap();
        assert_eq!(
            revoking.member_epoch, ea,
            "a keeps its epoch until it revokes"
        );
        let kept = revoking.assignment.unwrap();
        assert_eq!(kept["t"].len(), 2);
        let acked = g.heartbeat(beat("a", ea, &kept), &cfg, &t, 3).unwrap();
        assert!(acked.member_epoch > ea);
        assert_eq!(g.validate_offset_commit("a", ea, false), Ok(Some(ea)));
        for p in &kept["t"] {
            assert!(g.committable("a", ea, "t", *p), "kept partition {p}");
        }
        for p in all["t"].difference(&kept["t"]) {
            assert!(!g.committable("a", ea, "t", *p), "revoked partition {p}");
        }
        // The current epoch may commit; one above it may not.
        assert_eq!(
            g.validate_offset_commit("a", acked.member_epoch, false),
            Ok(None)
        );
        assert_eq!(
            g.validate_offset_commit("a", acked.member_epoch + 1, false),
            Err(GroupError::StaleMemberEpoch)
        );
    }

    #[test]
    fn sessions_expire_and_revocations_time_out() {
        let cfg = ConsumerGroupConfig::default();
        let t = topics(&[("t", 4)]);
        let mut g = ConsumerGroup::new();
        let r = g.heartbeat(join("a", &["t"]), &cfg, &t, 0).unwrap();
        let (ea, oa) = (r.member_epoch, r.assignment.unwrap());
        g.heartbeat(join("b", &["t"]), &cfg, &t, 0).unwrap();
        // a must revoke; it never does, so it is fenced after 30 s.
        g.heartbeat(beat("a", ea, &oa), &cfg, &t, 1_000).unwrap();
        assert_eq!(g.members["a"].state, MemberState::UnrevokedPartitions);
        assert!(g.poll(&cfg, &t, 30_999).is_empty());
        g.heartbeat(
            beat("b", g.members["b"].member_epoch, &Assignment::new()),
            &cfg,
            &t,
            30_000,
        )
        .unwrap();
        assert_eq!(g.poll(&cfg, &t, 31_000), vec!["a".to_string()]);
        g.check_invariants();
        // b's session then ends 45 s after its last heartbeat.
        assert!(g.poll(&cfg, &t, 74_999).is_empty());
        assert_eq!(g.poll(&cfg, &t, 75_000), vec!["b".to_string()]);
        assert_eq!(g.state(), ConsumerGroupState::Empty);
    }

    #[test]
    fn regex_subscription_picks_up_new_topics() {
        let cfg = ConsumerGroupConfig::default();
        let mut g = ConsumerGroup::new();
        let t1 = topics(&[("orders-1", 2), ("other", 3)]);
        let mut req = join("a", &[]);
        req.subscribed_topic_names = None;
        req.subscribed_topic_regex = Some("orders-.*".to_string());
        let r = g.heartbeat(req, &cfg, &t1, 0).unwrap();
        assert_eq!(count(r.assignment.as_ref().unwrap()), 2);
        let t2 = topics(&[("orders-1", 2), ("orders-2", 5), ("other", 3)]);
        let before = g.group_epoch;
        g.poll(&cfg, &t2, 1);
        assert!(g.group_epoch > before);
        let r = g
            .heartbeat(
                beat("a", r.member_epoch, r.assignment.as_ref().unwrap()),
                &cfg,
                &t2,
                2,
            )
            .unwrap();
        assert_eq!(count(r.assignment.as_ref().unwrap()), 7);
    }

    #[test]
    fn static_member_rejoins_with_its_assignment() {
        let cfg = ConsumerGroupConfig::default();
        let t = topics(&[("t", 3)]);
        let mut g = ConsumerGroup::new();
        let mut req = join("a1", &["t"]);
        req.instance_id = Some("i".to_string());
        let r = g.heartbeat(req.clone(), &cfg, &t, 0).unwrap();
        let epoch = g.group_epoch;
        let mut second = join("a2", &["t"]);
        second.instance_id = Some("i".to_string());
        assert_eq!(
            g.heartbeat(second.clone(), &cfg, &t, 1),
            Err(GroupError::UnreleasedInstanceId)
        );
        let mut leave = beat("a1", r.member_epoch, &Assignment::new());
        leave.member_epoch = LEAVE_GROUP_STATIC_MEMBER_EPOCH;
        leave.instance_id = Some("i".to_string());
        assert_eq!(g.heartbeat(leave, &cfg, &t, 2).unwrap().member_epoch, -2);
        let r2 = g.heartbeat(second, &cfg, &t, 3).unwrap();
        assert_eq!(count(r2.assignment.as_ref().unwrap()), 3);
        assert_eq!(g.group_epoch, epoch, "no rebalance for a static rejoin");
        g.check_invariants();
    }

    #[test]
    fn range_assigns_contiguous_ranges() {
        let subs: BTreeMap<String, BTreeSet<String>> = ["a", "b", "c"]
            .iter()
            .map(|m| (m.to_string(), ["t".to_string()].into_iter().collect()))
            .collect();
        let out = assign_range(&subs, &topics(&[("t", 8)]));
        assert_eq!(out["a"]["t"], (0..3).collect());
        assert_eq!(out["b"]["t"], (3..6).collect());
        assert_eq!(out["c"]["t"], (6..8).collect());
    }

    #[test]
    fn uniform_is_balanced_and_sticky() {
        let subs = |ms: &[&str]| -> BTreeMap<String, BTreeSet<String>> {
            ms.iter()
                .map(|m| (m.to_string(), ["t".to_string(), "u".to_string()].into()))
                .collect()
        };
        let t = topics(&[("t", 7), ("u", 5)]);
        let first = assign_uniform(&subs(&["a", "b"]), &t, &BTreeMap::new());
        assert_eq!(count(&first["a"]) + count(&first["b"]), 12);
        let second = assign_uniform(&subs(&["a", "b", "c"]), &t, &first);
        let counts: Vec<usize> = second.values().map(count).collect();
        assert_eq!(counts, vec![4, 4, 4]);
        // a and b only gave partitions away.
        for m in ["a", "b"] {
            assert!(is_subset(&second[m], &first[m]));
        }
        let mut all = BTreeSet::new();
        for a in second.values() {
            for (t, ps) in a {
                for p in ps {
                    assert!(all.insert((t.clone(), *p)));
                }
            }
        }
        assert_eq!(all.len(), 12);
    }

    #[test]
    fn requests_are_validated_as_kafka_does() {
        let mut r = join("", &["t"]);
        assert!(validate_heartbeat(&r, 0).is_ok());
        assert!(matches!(
            validate_heartbeat(&r, 1),
            Err(GroupError::InvalidRequest(_))
        ));
        r.member_id = "m".into();
        r.server_assignor = Some("sticky".into());
        assert!(matches!(
            validate_heartbeat(&r, 1),
            Err(GroupError::UnsupportedAssignor(_))
        ));
        r.server_assignor = None;
        r.subscribed_topic_regex = Some("(".into());
        assert!(matches!(
            validate_heartbeat(&r, 1),
            Err(GroupError::InvalidRegularExpression(_))
        ));
        r.subscribed_topic_regex = None;
        r.member_epoch = -3;
        assert!(matches!(
            validate_heartbeat(&r, 1),
            Err(GroupError::InvalidRequest(_))
        ));
    }

    // ---- mixed groups (classic members in a consumer group) ----

    fn snapshot(
        id: &str,
        topics: &[&str],
        partitions: &[i32],
    ) -> (ClassicMemberSnapshot, Bytes, Bytes) {
        let sub = consumer_protocol::Subscription {
            version: 1,
            topics: topics.iter().map(|t| t.to_string()).collect(),
            owned: Some(Assignment::new()),
            rack_id: None,
        };
        let metadata = consumer_protocol::encode_subscription(&sub);
        let mut a = Assignment::new();
        a.insert("t".to_string(), partitions.iter().copied().collect());
        let snap = ClassicMemberSnapshot {
            member_id: id.to_string(),
            instance_id: None,
            client_id: "c".into(),
            client_host: "h".into(),
            rebalance_timeout_ms: 30_000,
            session_timeout_ms: 10_000,
            protocols: vec![("range".into(), metadata.clone())],
        };
        (snap, metadata, consumer_protocol::encode_assignment(&a, 1))
    }

    fn classic_join(id: &str, owned: Assignment) -> ClassicJoin {
        let sub = consumer_protocol::Subscription {
            version: 1,
            topics: vec!["t".into()],
            owned: Some(owned),
            rack_id: None,
        };
        ClassicJoin {
            member_id: id.to_string(),
            unknown_member: false,
            require_known_member_id: true,
            instance_id: None,
            client_id: "c".into(),
            client_host: "h".into(),
            session_timeout_ms: 10_000,
            rebalance_timeout_ms: 30_000,
            protocol_type: "consumer".into(),
            protocols: vec![("range".into(), consumer_protocol::encode_subscription(&sub))],
        }
    }

    #[test]
    fn an_upgraded_group_walks_its_classic_members_through_rejoins() {
        let t = topics(&[("t", 4)]);
        let cfg = ConsumerGroupConfig::default();
        let mut g = ConsumerGroup::from_classic(
            5,
            vec![
                snapshot("c1", &["t"], &[0, 1]),
                snapshot("c2", &["t"], &[2, 3]),
            ],
            &t,
            0,
        )
        .unwrap();
        g.check_invariants();
        assert_eq!((g.group_epoch, g.assignment_epoch), (5, 5));
        assert_eq!(g.members["c1"].member_epoch, 5);
        assert!(g.members["c1"].classic.is_some());
        // Nothing moves before a new member joins.
        assert_eq!(g.classic_heartbeat("c1", None, 5, 1), Ok(()));
        assert_eq!(
            g.classic_heartbeat("c1", None, 4, 1),
            Err(GroupError::IllegalGeneration)
        );

        // A consumer member joins: a new epoch; the classic members must
        // rejoin, and the new member waits for what they hold.
        let a = g.heartbeat(join("k1", &["t"]), &cfg, &t, 2).unwrap();
        assert_eq!(a.member_epoch, 6);
        g.check_invariants();
        assert_eq!(
            g.classic_heartbeat("c1", None, 5, 3),
            Err(GroupError::RebalanceInProgress)
        );
        assert!(g.members["c1"].classic_deadline_ms.is_some());

        // c1 rejoins still owning its partitions (cooperative): it keeps
        // its epoch until it revokes, and SyncGroup gives it what it keeps.
        let owned = g.members["c1"].assigned.clone();
        let j = g
            .classic_join(classic_join("c1", owned), &cfg, &t, 4)
            .unwrap();
        let kept = g.members["c1"].assigned.clone();
        g.check_invariants();
        let synced = g.classic_sync(
            "c1",
            None,
            j.generation_id,
            Some("consumer"),
            Some("range"),
            5,
        );
        let synced = synced.unwrap();
        assert_eq!(consumer_protocol::decode_assignment(&synced).unwrap(), kept);
        assert_eq!(j.protocol_name, "range");
        // A wrong protocol name is refused.
        assert_eq!(
            g.classic_sync("c1", None, j.generation_id, None, Some("roundrobin"), 5),
            Err(GroupError::InconsistentGroupProtocol)
        );
        // Rejoining after revoking moves it to the new epoch.
        let j = g
            .classic_join(classic_join("c1", kept.clone()), &cfg, &t, 6)
            .unwrap();
        assert_eq!(j.generation_id, 6);
        g.check_invariants();
        let owned = g.members["c2"].assigned.clone();
        g.classic_join(classic_join("c2", owned), &cfg, &t, 7)
            .unwrap();
        let kept = g.members["c2"].assigned.clone();
        g.classic_join(classic_join("c2", kept), &cfg, &t, 8)
            .unwrap();
        g.check_invariants();
        // The consumer member now gets the released partitions.
        let held = g.members["k1"].assigned.clone();
        let a = g.heartbeat(beat("k1", 6, &held), &cfg, &t, 9).unwrap();
        assert_eq!(a.member_epoch, 6);
        let total: usize = g.members.values().map(|m| count(&m.assigned)).sum();
        assert_eq!(total, 4);
        assert_eq!(count(&g.members["k1"].assigned), 1);
        g.check_invariants();

        // LeaveGroup removes members of either protocol (Kafka 4.4).
        assert_eq!(g.classic_leave("c1", None), Ok("c1".to_string()));
        assert!(!g.members.contains_key("c1"));
        assert_eq!(
            g.classic_leave("c1", None),
            Err(GroupError::UnknownMemberId)
        );
        assert!(!g.all_classic_except("c2"));
        assert!(g.all_classic_except("k1"));
        assert_eq!(g.classic_leave("k1", None), Ok("k1".to_string()));
        g.check_invariants();
    }

    #[test]
    fn a_classic_member_that_does_not_rejoin_in_time_is_fenced() {
        let t = topics(&[("t", 2)]);
        let cfg = ConsumerGroupConfig::default();
        let mut g =
            ConsumerGroup::from_classic(1, vec![snapshot("c1", &["t"], &[0, 1])], &t, 0).unwrap();
        g.heartbeat(join("k1", &["t"]), &cfg, &t, 0).unwrap();
        assert_eq!(
            g.classic_heartbeat("c1", None, 1, 100),
            Err(GroupError::RebalanceInProgress)
        );
        // Heartbeats keep its session, not its place: it must rejoin.
        for now in (5_000..30_000).step_by(5_000) {
            let r = g.classic_heartbeat("c1", None, 1, now);
            assert_eq!(r, Err(GroupError::RebalanceInProgress));
            assert!(g.poll(&cfg, &t, now).is_empty());
        }
        assert!(g.poll(&cfg, &t, 100 + 29_999).is_empty());
        assert_eq!(g.poll(&cfg, &t, 100 + 30_000), vec!["c1".to_string()]);
        g.check_invariants();
    }

    #[test]
    fn a_malformed_classic_assignment_refuses_the_upgrade() {
        let t = topics(&[("t", 2)]);
        let (snap, metadata, _) = snapshot("c1", &["t"], &[0]);
        let r = ConsumerGroup::from_classic(
            1,
            vec![(snap, metadata, Bytes::from_static(&[0, 0, 0x7f]))],
            &t,
            0,
        );
        assert_eq!(r.err(), Some(GroupError::GroupIdNotFound));
    }

    #[test]
    fn a_restarted_static_classic_member_takes_its_assignment_over() {
        let t = topics(&[("t", 4)]);
        let cfg = ConsumerGroupConfig::default();
        let (mut snap, md, a) = snapshot("c1", &["t"], &[0, 1]);
        snap.instance_id = Some("i1".into());
        let mut g = ConsumerGroup::from_classic(
            3,
            vec![(snap, md, a), snapshot("c2", &["t"], &[2, 3])],
            &t,
            0,
        )
        .unwrap();
        g.heartbeat(join("k1", &["t"]), &cfg, &t, 1).unwrap();
        let epoch = g.group_epoch;
        // Another id with the instance id, without being a new incarnation.
        let mut j = classic_join("c9", Assignment::new());
        j.instance_id = Some("i1".into());
        assert_eq!(
            g.classic_join(j.clone(), &cfg, &t, 2).err(),
            Some(GroupError::FencedInstanceId)
        );
        // A restarted client (no member id) replaces c1 and keeps what c1
        // held and was targeted, without a new group epoch.
        j.unknown_member = true;
        let answer = g.classic_join(j, &cfg, &t, 3).unwrap();
        assert_eq!(answer.member_id, "c9");
        assert!(!g.members.contains_key("c1"));
        assert_eq!(g.static_members["i1"], "c9");
        assert_eq!(g.group_epoch, epoch);
        assert!(count(&g.members["c9"].assigned) > 0);
        assert!(g.members["c9"].classic.is_some());
        g.check_invariants();
        // An unknown instance id with a member id is an unknown member.
        let mut j = classic_join("c8", Assignment::new());
        j.instance_id = Some("i8".into());
        assert_eq!(
            g.classic_join(j, &cfg, &t, 4).err(),
            Some(GroupError::UnknownMemberId)
        );
    }
}
