//! The classic group protocol as a pure, deterministic state machine: one
//! [`Group`] per group id, driven by requests and by [`Group::poll`], each
//! taking the current time in milliseconds as an argument (no clock, no
//! I/O, no timers here), so every transition is unit-testable.
//!
//! States follow Kafka's `ClassicGroup`: Empty → PreparingRebalance (a
//! member joins, leaves or expires) → CompletingRebalance (every member
//! rejoined or the rebalance timeout passed; the generation is bumped and
//! the leader got the member list) → Stable (the leader's assignment was
//! persisted) → back to PreparingRebalance on the next change; Dead once
//! deleted.
//!
//! Invariants:
//! - `leader` is a member whenever the group has members and is not Empty.
//! - every static member (`group.instance.id`) appears in `static_members`
//!   under its instance id, and nothing else does.
//! - a member awaiting a join or sync answer has a parked request at the
//!   coordinator; the machine reports the answer as a [`Completion`], which
//!   the coordinator routes to the parked request.
//!
//! Requests that must wait (JoinGroup, a follower's SyncGroup) return
//! `Pending`; their answers come out of a later call as completions.
//!
//! Size limit (`group.max.size`, [`GroupConfig::max_size`]), as Kafka 4.x's
//! `GroupMetadataManager.acceptJoiningMember`: an Empty group accepts every
//! JoinGroup; during PreparingRebalance a member already awaiting its join
//! answer is accepted, anyone else only while fewer than `max_size` members
//! await one; in CompletingRebalance and Stable a member of the group is
//! accepted, a new one only while the group has fewer than `max_size`
//! members. A refused JoinGroup gets GROUP_MAX_SIZE_REACHED and its member,
//! if it was one, is removed: over capacity (the limit was lowered), the
//! members that rejoin last are shed. A group found over capacity when its
//! partition is loaded rebalances ([`Group::rebalance_if_over_capacity`]).

use super::consumer::{ClassicMemberSnapshot, ConsumerGroup};
use super::error::GroupError;
use crate::config::GROUP_MAX_SIZE_DEFAULT;
use bytes::Bytes;
use std::collections::{BTreeMap, HashMap};

/// Kafka's `group.min.session.timeout.ms` default.
pub const GROUP_MIN_SESSION_TIMEOUT_MS: i32 = 6_000;
/// Kafka's `group.max.session.timeout.ms` default.
pub const GROUP_MAX_SESSION_TIMEOUT_MS: i32 = 1_800_000;
/// Kafka's `offset.metadata.max.bytes` default.
pub const OFFSET_METADATA_MAX_BYTES: usize = 4096;

/// Settings of the state machine (broker configs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupConfig {
    /// `group.initial.rebalance.delay.ms`: how long the first rebalance of
    /// an empty group waits for more members (extended per new member, up
    /// to the rebalance timeout).
    pub initial_rebalance_delay_ms: i64,
    pub min_session_timeout_ms: i32,
    pub max_session_timeout_ms: i32,
    /// `offsets.retention.minutes` in milliseconds.
    pub offsets_retention_ms: i64,
    /// `group.max.size`: members a group may have (at least 1).
    pub max_size: usize,
}

impl Default for GroupConfig {
    fn default() -> Self {
        GroupConfig {
            initial_rebalance_delay_ms: 3_000,
            min_session_timeout_ms: GROUP_MIN_SESSION_TIMEOUT_MS,
            max_session_timeout_ms: GROUP_MAX_SESSION_TIMEOUT_MS,
            offsets_retention_ms: 7 * 24 * 60 * 60 * 1000,
            max_size: GROUP_MAX_SIZE_DEFAULT,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupState {
    Empty,
    PreparingRebalance,
    CompletingRebalance,
    Stable,
    Dead,
}

impl GroupState {
    /// The name Kafka uses in ListGroups / DescribeGroups.
    pub fn name(self) -> &'static str {
        match self {
            GroupState::Empty => "Empty",
            GroupState::PreparingRebalance => "PreparingRebalance",
            GroupState::CompletingRebalance => "CompletingRebalance",
            GroupState::Stable => "Stable",
            GroupState::Dead => "Dead",
        }
    }
}

/// One member of a group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub rebalance_timeout_ms: i32,
    pub session_timeout_ms: i32,
    /// (protocol name, metadata) in the member's order of preference.
    pub protocols: Vec<(String, Bytes)>,
    pub assignment: Bytes,
    pub awaiting_join: bool,
    pub awaiting_sync: bool,
    pub last_heartbeat_ms: i64,
}

impl Member {
    /// Answers the member's parked JoinGroup and SyncGroup, if any, with `err`.
    fn fail_parked(&self, member_id: &str, err: GroupError, out: &mut Vec<Completion>) {
        if self.awaiting_join {
            out.push(Completion::Join {
                member_id: member_id.to_string(),
                result: Err(err.clone()),
            });
        }
        if self.awaiting_sync {
            out.push(Completion::Sync {
                member_id: member_id.to_string(),
                result: Err(err),
            });
        }
    }
}

impl Member {
    fn metadata_for(&self, protocol: &str) -> Bytes {
        self.protocols
            .iter()
            .find(|(n, _)| n == protocol)
            .map(|(_, m)| m.clone())
            .unwrap_or_default()
    }
}

/// A committed offset (OffsetCommitValue).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommittedOffset {
    pub offset: i64,
    pub leader_epoch: i32,
    pub metadata: String,
    pub commit_timestamp_ms: i64,
    /// Only OffsetCommit v2-v4 with a retention time set one.
    pub expire_timestamp_ms: Option<i64>,
}

/// The JoinGroup fields the machine needs.
#[derive(Debug, Clone)]
pub struct JoinRequest {
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout_ms: i32,
    pub rebalance_timeout_ms: i32,
    pub protocol_type: String,
    pub protocols: Vec<(String, Bytes)>,
    /// JoinGroup v4+: a new dynamic member first gets MEMBER_ID_REQUIRED.
    pub require_known_member_id: bool,
    /// The id to give a new member (the coordinator makes it unique).
    pub new_member_id: String,
}

/// A successful JoinGroup answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinResult {
    pub generation_id: i32,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub leader: String,
    pub member_id: String,
    pub skip_assignment: bool,
    /// Filled for the leader only: (member id, instance id, metadata).
    pub members: Vec<(String, Option<String>, Bytes)>,
}

/// A JoinGroup or SyncGroup answer that was waiting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Completion {
    Join {
        member_id: String,
        result: Result<JoinResult, GroupError>,
    },
    Sync {
        member_id: String,
        result: Result<Bytes, GroupError>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JoinReply {
    Now(JoinResult),
    Pending,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SyncReply {
    Now(Bytes),
    Pending,
    /// The leader's assignment must be written before anyone is answered:
    /// the coordinator writes the group record, then calls
    /// [`Group::assignment_persisted`] with this generation.
    Persist {
        generation: i32,
    },
}

/// One consumer group.
#[derive(Debug, Clone)]
pub struct Group {
    pub group_id: String,
    pub state: GroupState,
    pub state_timestamp_ms: i64,
    pub generation_id: i32,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub leader: Option<String>,
    pub members: BTreeMap<String, Member>,
    /// instance id → member id.
    pub static_members: HashMap<String, String>,
    /// Member ids handed out with MEMBER_ID_REQUIRED → expiry time.
    pub pending_members: HashMap<String, i64>,
    /// When the current join phase completes at the latest.
    join_deadline_ms: i64,
    /// During the initial delayed join: the latest the delay may reach.
    initial_join_cap_ms: Option<i64>,
    /// Generation whose assignment is being written, if any.
    persisting: Option<i32>,
    pub offsets: BTreeMap<(String, i32), CommittedOffset>,
    /// Transactional commits not yet committed or aborted, per producer id.
    pub pending_txn_offsets: HashMap<i64, BTreeMap<(String, i32), CommittedOffset>>,
    /// Set when the group's membership record must be (re)written.
    pub metadata_dirty: bool,
    /// Present when the group is a KIP-848 `consumer` group: its
    /// membership lives there and the classic fields above stay empty
    /// (the classic state stays Empty); offsets stay here for both types.
    pub consumer: Option<Box<ConsumerGroup>>,
}

impl Group {
    pub fn new(group_id: impl Into<String>, now_ms: i64) -> Group {
        Group {
            group_id: group_id.into(),
            state: GroupState::Empty,
            state_timestamp_ms: now_ms,
            generation_id: 0,
            protocol_type: None,
            protocol_name: None,
            leader: None,
            members: BTreeMap::new(),
            static_members: HashMap::new(),
            pending_members: HashMap::new(),
            join_deadline_ms: 0,
            initial_join_cap_ms: None,
            persisting: None,
            offsets: BTreeMap::new(),
            pending_txn_offsets: HashMap::new(),
            metadata_dirty: false,
            consumer: None,
        }
    }

    /// Whether the group is a KIP-848 `consumer` group.
    pub fn is_consumer_group(&self) -> bool {
        self.consumer.is_some()
    }

    /// Whether the group has no member of either protocol.
    pub fn has_no_members(&self) -> bool {
        self.members.is_empty()
            && self.pending_members.is_empty()
            && self.consumer.as_ref().is_none_or(|c| c.is_empty())
    }

    /// Whether a ConsumerGroupHeartbeat joining this classic group with
    /// members may upgrade it online to a consumer group (Kafka's
    /// `validateOnlineUpgrade`, with the migration policy
    /// `bidirectional`): its members use the `consumer` embedded protocol
    /// and there are at most `max_size` of them.
    pub fn upgradable(&self, max_size: usize) -> bool {
        self.consumer.is_none()
            && !self.is(GroupState::Dead)
            && self.protocol_type.as_deref() == Some("consumer")
            && self.members.len() <= max_size
    }

    /// The members an online upgrade takes over: each with its metadata for
    /// the group's protocol (its first protocol when none was selected
    /// yet) and its current assignment.
    pub fn classic_snapshots(&self) -> Vec<(ClassicMemberSnapshot, Bytes, Bytes)> {
        self.members
            .values()
            .map(|m| {
                let metadata = match &self.protocol_name {
                    Some(p) => m.metadata_for(p),
                    None => m
                        .protocols
                        .first()
                        .map(|(_, md)| md.clone())
                        .unwrap_or_default(),
                };
                let snap = ClassicMemberSnapshot {
                    member_id: m.member_id.clone(),
                    instance_id: m.group_instance_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    rebalance_timeout_ms: m.rebalance_timeout_ms,
                    session_timeout_ms: m.session_timeout_ms,
                    protocols: m.protocols.clone(),
                };
                (snap, metadata, m.assignment.clone())
            })
            .collect()
    }

    /// Hands the classic membership over to `consumer` (an online
    /// upgrade): parked JoinGroup and SyncGroup requests are answered
    /// REBALANCE_IN_PROGRESS (their members rejoin the consumer group),
    /// and the classic part is reset to an empty group. Offsets stay.
    pub fn become_consumer_group(
        &mut self,
        consumer: ConsumerGroup,
        now_ms: i64,
        out: &mut Vec<Completion>,
    ) {
        for (id, m) in &self.members {
            m.fail_parked(id, GroupError::RebalanceInProgress, out);
        }
        self.members.clear();
        self.static_members.clear();
        self.pending_members.clear();
        self.leader = None;
        self.protocol_type = None;
        self.protocol_name = None;
        self.persisting = None;
        self.initial_join_cap_ms = None;
        self.metadata_dirty = false;
        self.transition(GroupState::Empty, now_ms);
        self.consumer = Some(Box::new(consumer));
    }

    /// An online downgrade (Kafka's `ClassicGroup.fromConsumerGroup`,
    /// migration policy `bidirectional`): when a consumer group with
    /// members has only classic members left (the last consumer-protocol
    /// member left or was fenced) and at most `group.max.size` of them, it
    /// becomes a classic group again. The members keep their ids and
    /// sessions; each gets its target assignment as its classic
    /// assignment, the generation is the group epoch, and a rebalance
    /// starts (the members learn it from their next Heartbeat). Returns
    /// the ids whose consumer-group member records must be tombstoned
    /// (current members and members removed since the last write), or
    /// None when the group stays a consumer group. Offsets stay.
    /// `generation_id` is the group epoch before the member left (Kafka
    /// checks the downgrade before removing it): the classic members'
    /// epoch, so that their commits with it are still accepted while they
    /// rejoin.
    pub fn maybe_become_classic_group(
        &mut self,
        cfg: &GroupConfig,
        generation_id: i32,
        now_ms: i64,
        out: &mut Vec<Completion>,
    ) -> Option<Vec<String>> {
        let c = self.consumer.as_ref()?;
        if c.is_empty()
            || c.members.values().any(|m| m.classic.is_none())
            || c.members.len() > cfg.max_size
        {
            return None;
        }
        let c = self.consumer.take().expect("checked above");
        let mut tombstoned: Vec<String> = c.changed_members.iter().cloned().collect();
        self.members.clear();
        self.static_members.clear();
        self.pending_members.clear();
        for m in c.members.values() {
            let classic = m.classic.clone().expect("every member is classic");
            tombstoned.push(m.member_id.clone());
            let target = c.target.get(&m.member_id).cloned().unwrap_or_default();
            let version = classic
                .protocols
                .first()
                .and_then(|(_, md)| super::consumer_protocol::version(md).ok())
                .unwrap_or(0);
            if let Some(i) = &m.instance_id {
                self.static_members.insert(i.clone(), m.member_id.clone());
            }
            self.members.insert(
                m.member_id.clone(),
                Member {
                    member_id: m.member_id.clone(),
                    group_instance_id: m.instance_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    rebalance_timeout_ms: m.rebalance_timeout_ms,
                    session_timeout_ms: classic.session_timeout_ms,
                    protocols: classic.protocols,
                    assignment: super::consumer_protocol::encode_assignment(&target, version),
                    awaiting_join: false,
                    awaiting_sync: false,
                    last_heartbeat_ms: m.last_heartbeat_ms,
                },
            );
        }
        tombstoned.sort();
        tombstoned.dedup();
        self.generation_id = generation_id;
        self.protocol_type = Some("consumer".to_string());
        self.leader = self.members.keys().next().cloned();
        self.transition(GroupState::Stable, now_ms);
        self.protocol_name = self.select_protocol();
        self.prepare_rebalance(cfg, now_ms, out);
        Some(tombstoned)
    }

    /// ListGroups' (protocol type, state, group type) of the group.
    pub fn listing(&self) -> (String, &'static str, &'static str) {
        match &self.consumer {
            Some(c) => ("consumer".to_string(), c.state().name(), "consumer"),
            None => (
                self.protocol_type.clone().unwrap_or_default(),
                self.state.name(),
                "classic",
            ),
        }
    }

    fn transition(&mut self, state: GroupState, now_ms: i64) {
        self.state = state;
        self.state_timestamp_ms = now_ms;
    }

    pub fn is(&self, state: GroupState) -> bool {
        self.state == state
    }

    /// Kafka's `validateMember`: a static member must present the member id
    /// its instance id maps to; a dynamic one must be known.
    fn validate_member(
        &self,
        member_id: &str,
        instance_id: Option<&str>,
    ) -> Result<(), GroupError> {
        match instance_id {
            Some(instance) => match self.static_members.get(instance) {
                None => Err(GroupError::UnknownMemberId),
                Some(existing) if existing != member_id => Err(GroupError::FencedInstanceId),
                Some(_) => Ok(()),
            },
            None if self.members.contains_key(member_id) => Ok(()),
            None => Err(GroupError::UnknownMemberId),
        }
    }

    /// Whether a member offering `protocols` of `protocol_type` can join.
    fn supports(&self, protocol_type: &str, protocols: &[(String, Bytes)]) -> bool {
        if protocol_type.is_empty() || protocols.is_empty() {
            return false;
        }
        if self.members.is_empty() {
            return true;
        }
        if self.protocol_type.as_deref() != Some(protocol_type) {
            return false;
        }
        protocols.iter().any(|(name, _)| {
            self.members
                .values()
                .all(|m| m.protocols.iter().any(|(n, _)| n == name))
        })
    }

    /// Kafka's protocol vote: among the protocols every member supports,
    /// each member votes for its most preferred one; most votes wins (ties:
    /// the first candidate in the leader's order).
    pub fn select_protocol(&self) -> Option<String> {
        let first = self.members.values().next()?;
        let candidates: Vec<&String> = first
            .protocols
            .iter()
            .map(|(n, _)| n)
            .filter(|name| {
                self.members
                    .values()
                    .all(|m| m.protocols.iter().any(|(n, _)| n == *name))
            })
            .collect();
        let mut votes: Vec<(usize, &String)> = candidates.iter().map(|c| (0, *c)).collect();
        for m in self.members.values() {
            if let Some((n, _)) = m.protocols.iter().find(|(n, _)| candidates.contains(&n)) {
                if let Some(v) = votes.iter_mut().find(|(_, c)| *c == n) {
                    v.0 += 1;
                }
            }
        }
        let best = votes.iter().map(|(v, _)| *v).max()?;
        votes
            .into_iter()
            .find(|(v, _)| *v == best)
            .map(|(_, c)| c.clone())
    }

    fn is_leader(&self, member_id: &str) -> bool {
        self.leader.as_deref() == Some(member_id)
    }

    /// The answer a member gets for the current generation.
    fn current_join_result(&self, member_id: &str, skip_assignment_if_leader: bool) -> JoinResult {
        let leader = self.leader.clone().unwrap_or_default();
        let is_leader = leader == member_id;
        let protocol = self.protocol_name.clone().unwrap_or_default();
        JoinResult {
            generation_id: self.generation_id,
            protocol_type: self.protocol_type.clone(),
            protocol_name: self.protocol_name.clone(),
            leader,
            member_id: member_id.to_string(),
            skip_assignment: is_leader && skip_assignment_if_leader,
            members: if is_leader {
                self.members
                    .values()
                    .map(|m| {
                        (
                            m.member_id.clone(),
                            m.group_instance_id.clone(),
                            m.metadata_for(&protocol),
                        )
                    })
                    .collect()
            } else {
                Vec::new()
            },
        }
    }

    /// Handles a JoinGroup.
    pub fn join(
        &mut self,
        req: JoinRequest,
        cfg: &GroupConfig,
        now_ms: i64,
        out: &mut Vec<Completion>,
    ) -> Result<JoinReply, GroupError> {
        if req.session_timeout_ms < cfg.min_session_timeout_ms
            || req.session_timeout_ms > cfg.max_session_timeout_ms
        {
            return Err(GroupError::InvalidSessionTimeout);
        }
        if !self.accepts_joining_member(&req.member_id, cfg.max_size) {
            // Kafka removes the member it refuses: one that had not rejoined
            // a join phase that is already full.
            self.remove_member(&req.member_id, out);
            return Err(GroupError::GroupMaxSizeReached);
        }
        if self.is(GroupState::Dead) {
            return Err(if req.member_id.is_empty() {
                GroupError::CoordinatorNotAvailable
            } else {
                GroupError::UnknownMemberId
            });
        }
        if !self.supports(&req.protocol_type, &req.protocols) {
            return Err(GroupError::InconsistentGroupProtocol);
        }
        if req.member_id.is_empty() {
            self.join_unknown_member(req, cfg, now_ms, out)
        } else {
            self.join_known_member(req, cfg, now_ms, out)
        }
    }

    /// Members awaiting their JoinGroup answer.
    fn awaiting_join_count(&self) -> usize {
        self.members.values().filter(|m| m.awaiting_join).count()
    }

    /// Kafka's `acceptJoiningMember` (see the module doc).
    fn accepts_joining_member(&self, member_id: &str, max_size: usize) -> bool {
        match self.state {
            GroupState::Empty | GroupState::Dead => true,
            GroupState::PreparingRebalance => {
                self.members.get(member_id).is_some_and(|m| m.awaiting_join)
                    || self.awaiting_join_count() < max_size
            }
            GroupState::CompletingRebalance | GroupState::Stable => {
                self.members.contains_key(member_id) || self.members.len() < max_size
            }
        }
    }

    /// A group loaded with more members than `max_size` (the limit was
    /// lowered since) rebalances, so that its members can commit before
    /// the ones over the limit are refused when they rejoin (Kafka's
    /// "freshly-loaded group is over capacity").
    pub fn rebalance_if_over_capacity(
        &mut self,
        cfg: &GroupConfig,
        now_ms: i64,
        out: &mut Vec<Completion>,
    ) -> bool {
        let over = self.members.len() > cfg.max_size
            && (self.is(GroupState::Stable) || self.is(GroupState::Empty));
        if over {
            self.prepare_rebalance(cfg, now_ms, out);
        }
        over
    }

    fn join_unknown_member(
        &mut self,
        req: JoinRequest,
        cfg: &GroupConfig,
        now_ms: i64,
        out: &mut Vec<Completion>,
    ) -> Result<JoinReply, GroupError> {
        let new_id = req.new_member_id.clone();
        if let Some(instance) = req.group_instance_id.clone() {
            if let Some(old_id) = self.static_members.get(&instance).cloned() {
                return self.replace_static_member(&old_id, req, cfg, now_ms, out);
            }
            self.add_member(&new_id, req, now_ms);
            self.static_members.insert(instance, new_id);
            self.after_member_added(cfg, now_ms, out);
            return Ok(JoinReply::Pending);
        }
        if req.require_known_member_id {
            self.pending_members
                .insert(new_id.clone(), now_ms + req.session_timeout_ms as i64);
            return Err(GroupError::MemberIdRequired(new_id));
        }
        self.add_member(&new_id, req, now_ms);
        self.after_member_added(cfg, now_ms, out);
        Ok(JoinReply::Pending)
    }

    /// A static member rejoining with an empty member id: it takes over
    /// the old member's place (and assignment) under a new member id; the
    /// old id is fenced. A stable group whose protocols did not change
    /// answers at once, without a rebalance (KIP-345).
    fn replace_static_member(
        &mut self,
        old_id: &str,
        req: JoinRequest,
        cfg: &GroupConfig,
        now_ms: i64,
        out: &mut Vec<Completion>,
    ) -> Result<JoinReply, GroupError> {
        let Some(mut old) = self.members.remove(old_id) else {
            return Err(GroupError::UnknownMemberId);
        };
        old.fail_parked(old_id, GroupError::FencedInstanceId, out);
        let new_id = req.new_member_id.clone();
        let protocols_changed = old.protocols != req.protocols;
        old.member_id = new_id.clone();
        old.client_id = req.client_id;
        old.client_host = req.client_host;
        old.session_timeout_ms = req.session_timeout_ms;
        old.rebalance_timeout_ms = req.rebalance_timeout_ms;
        old.protocols = req.protocols;
        old.last_heartbeat_ms = now_ms;
        old.awaiting_join = false;
        old.awaiting_sync = false;
        self.members.insert(new_id.clone(), old);
        if let Some(instance) = &req.group_instance_id {
            self.static_members.insert(instance.clone(), new_id.clone());
        }
        if self.is_leader(old_id) {
            self.leader = Some(new_id.clone());
        }
        match self.state {
            GroupState::Stable if !protocols_changed => {
                self.metadata_dirty = true;
                Ok(JoinReply::Now(self.current_join_result(&new_id, true)))
            }
            GroupState::PreparingRebalance => {
                if let Some(m) = self.members.get_mut(&new_id) {
                    m.awaiting_join = true;
                }
                Ok(JoinReply::Pending)
            }
            _ => {
                if let Some(m) = self.members.get_mut(&new_id) {
                    m.awaiting_join = true;
                }
                self.prepare_rebalance(cfg, now_ms, out);
                Ok(JoinReply::Pending)
            }
        }
    }

    fn join_known_member(
        &mut self,
        req: JoinRequest,
        cfg: &GroupConfig,
        now_ms: i64,
        out: &mut Vec<Completion>,
    ) -> Result<JoinReply, GroupError> {
        let member_id = req.member_id.clone();
        if self.pending_members.remove(&member_id).is_some() {
            self.add_member(&member_id, req, now_ms);
            self.after_member_added(cfg, now_ms, out);
            return Ok(JoinReply::Pending);
        }
        self.validate_member(&member_id, req.group_instance_id.as_deref())?;
        let Some(member) = self.members.get(&member_id) else {
            return Err(GroupError::UnknownMemberId);
        };
        let same_protocols = member.protocols == req.protocols;
        match self.state {
            GroupState::Empty | GroupState::Dead => Err(GroupError::UnknownMemberId),
            GroupState::PreparingRebalance => {
                self.update_member(&member_id, req, now_ms);
                Ok(JoinReply::Pending)
            }
            GroupState::CompletingRebalance if same_protocols => {
                // The member missed its join answer: give it again.
                Ok(JoinReply::Now(self.current_join_result(&member_id, false)))
            }
            GroupState::Stable if same_protocols && !self.is_leader(&member_id) => {
                Ok(JoinReply::Now(self.current_join_result(&member_id, false)))
            }
            GroupState::CompletingRebalance | GroupState::Stable => {
                self.update_member(&member_id, req, now_ms);
                self.prepare_rebalance(cfg, now_ms, out);
                Ok(JoinReply::Pending)
            }
        }
    }

    fn add_member(&mut self, member_id: &str, req: JoinRequest, now_ms: i64) {
        if self.members.is_empty() {
            self.protocol_type = Some(req.protocol_type.clone());
        }
        if self.leader.is_none() {
            self.leader = Some(member_id.to_string());
        }
        self.members.insert(
            member_id.to_string(),
            Member {
                member_id: member_id.to_string(),
                group_instance_id: req.group_instance_id,
                client_id: req.client_id,
                client_host: req.client_host,
                rebalance_timeout_ms: req.rebalance_timeout_ms,
                session_timeout_ms: req.session_timeout_ms,
                protocols: req.protocols,
                assignment: Bytes::new(),
                awaiting_join: true,
                awaiting_sync: false,
                last_heartbeat_ms: now_ms,
            },
        );
    }

    fn update_member(&mut self, member_id: &str, req: JoinRequest, now_ms: i64) {
        if let Some(m) = self.members.get_mut(member_id) {
            m.protocols = req.protocols;
            m.session_timeout_ms = req.session_timeout_ms;
            m.rebalance_timeout_ms = req.rebalance_timeout_ms;
            m.awaiting_join = true;
            m.last_heartbeat_ms = now_ms;
        }
    }

    /// A new member joined: start a rebalance, or extend the initial delay.
    fn after_member_added(&mut self, cfg: &GroupConfig, now_ms: i64, out: &mut Vec<Completion>) {
        if self.is(GroupState::PreparingRebalance) {
            if let Some(cap) = self.initial_join_cap_ms {
                self.join_deadline_ms = (now_ms + cfg.initial_rebalance_delay_ms).min(cap);
            }
        } else {
            self.prepare_rebalance(cfg, now_ms, out);
        }
    }

    fn max_rebalance_timeout_ms(&self) -> i64 {
        self.members
            .values()
            .map(|m| m.rebalance_timeout_ms as i64)
            .max()
            .unwrap_or(0)
    }

    /// Moves to PreparingRebalance. Members waiting for a sync answer get
    /// REBALANCE_IN_PROGRESS; an empty group waits the initial delay.
    pub fn prepare_rebalance(&mut self, cfg: &GroupConfig, now_ms: i64, out: &mut Vec<Completion>) {
        if self.is(GroupState::CompletingRebalance) {
            self.fail_awaiting_sync(GroupError::RebalanceInProgress, out);
        }
        self.persisting = None;
        let rebalance_timeout = self.max_rebalance_timeout_ms();
        if self.is(GroupState::Empty) {
            self.initial_join_cap_ms = Some(now_ms + rebalance_timeout);
            self.join_deadline_ms = now_ms + cfg.initial_rebalance_delay_ms.min(rebalance_timeout);
        } else {
            self.initial_join_cap_ms = None;
            self.join_deadline_ms = now_ms + rebalance_timeout;
        }
        self.transition(GroupState::PreparingRebalance, now_ms);
    }

    fn fail_awaiting_sync(&mut self, error: GroupError, out: &mut Vec<Completion>) {
        for m in self.members.values_mut() {
            m.assignment = Bytes::new();
            if m.awaiting_sync {
                m.awaiting_sync = false;
                out.push(Completion::Sync {
                    member_id: m.member_id.clone(),
                    result: Err(error.clone()),
                });
            }
        }
    }

    fn remove_member(&mut self, member_id: &str, out: &mut Vec<Completion>) {
        let Some(m) = self.members.remove(member_id) else {
            return;
        };
        if let Some(instance) = &m.group_instance_id {
            if self.static_members.get(instance).map(String::as_str) == Some(member_id) {
                self.static_members.remove(instance);
            }
        }
        m.fail_parked(member_id, GroupError::UnknownMemberId, out);
        if self.is_leader(member_id) {
            self.leader = self.members.keys().next().cloned();
        }
    }

    /// A member left or expired: rebalance (or let a running join finish
    /// without it).
    fn after_member_removed(&mut self, cfg: &GroupConfig, now_ms: i64, out: &mut Vec<Completion>) {
        match self.state {
            GroupState::Stable | GroupState::CompletingRebalance => {
                self.prepare_rebalance(cfg, now_ms, out)
            }
            GroupState::PreparingRebalance => {}
            GroupState::Empty | GroupState::Dead => {}
        }
    }

    /// Ends the join phase: members that did not rejoin are dropped (static
    /// ones stay until their session expires), the generation is bumped,
    /// every rejoined member gets its answer.
    fn complete_join(&mut self, now_ms: i64, out: &mut Vec<Completion>) {
        let gone: Vec<String> = self
            .members
            .values()
            .filter(|m| !m.awaiting_join && m.group_instance_id.is_none())
            .map(|m| m.member_id.clone())
            .collect();
        for id in gone {
            self.remove_member(&id, out);
        }
        self.initial_join_cap_ms = None;
        self.generation_id += 1;
        crate::metrics::record_rebalance();
        if self.members.is_empty() {
            self.protocol_name = None;
            self.leader = None;
            self.transition(GroupState::Empty, now_ms);
            self.metadata_dirty = true;
            return;
        }
        self.protocol_name = self.select_protocol();
        if self
            .leader
            .as_ref()
            .is_none_or(|l| !self.members.contains_key(l))
        {
            self.leader = self.members.keys().next().cloned();
        }
        self.transition(GroupState::CompletingRebalance, now_ms);
        let ids: Vec<String> = self
            .members
            .values()
            .filter(|m| m.awaiting_join)
            .map(|m| m.member_id.clone())
            .collect();
        for id in ids {
            let result = self.current_join_result(&id, false);
            if let Some(m) = self.members.get_mut(&id) {
                m.awaiting_join = false;
                m.last_heartbeat_ms = now_ms;
            }
            out.push(Completion::Join {
                member_id: id,
                result: Ok(result),
            });
        }
    }

    /// Time-driven transitions: expire pending and silent members, end the
    /// join phase when everyone rejoined or the deadline passed.
    pub fn poll(&mut self, cfg: &GroupConfig, now_ms: i64, out: &mut Vec<Completion>) {
        if self.is(GroupState::Dead) {
            return;
        }
        self.pending_members
            .retain(|_, deadline| *deadline > now_ms);
        let expired: Vec<String> = self
            .members
            .values()
            .filter(|m| {
                !m.awaiting_join
                    && !m.awaiting_sync
                    && now_ms >= m.last_heartbeat_ms + m.session_timeout_ms as i64
            })
            .map(|m| m.member_id.clone())
            .collect();
        if !expired.is_empty() {
            for id in &expired {
                tracing::info!(group = %self.group_id, member = %id, "member session expired");
                self.remove_member(id, out);
            }
            self.after_member_removed(cfg, now_ms, out);
        }
        if self.is(GroupState::PreparingRebalance) {
            let all_joined =
                self.members.values().all(|m| m.awaiting_join) && self.pending_members.is_empty();
            let initial = self.initial_join_cap_ms.is_some();
            if now_ms >= self.join_deadline_ms || (all_joined && !initial) {
                self.complete_join(now_ms, out);
            }
        }
    }

    /// The earliest time [`Group::poll`] may have something to do.
    pub fn next_deadline_ms(&self) -> Option<i64> {
        let mut next = self.pending_members.values().copied().min();
        let mut consider = |t: i64| next = Some(next.map_or(t, |n: i64| n.min(t)));
        for m in self.members.values() {
            if !m.awaiting_join && !m.awaiting_sync {
                consider(m.last_heartbeat_ms + m.session_timeout_ms as i64);
            }
        }
        if self.is(GroupState::PreparingRebalance) {
            consider(self.join_deadline_ms);
        }
        next
    }

    /// Handles a SyncGroup.
    #[allow(clippy::too_many_arguments)]
    pub fn sync(
        &mut self,
        member_id: &str,
        instance_id: Option<&str>,
        generation_id: i32,
        protocol_type: Option<&str>,
        protocol_name: Option<&str>,
        assignments: Vec<(String, Bytes)>,
        now_ms: i64,
    ) -> Result<SyncReply, GroupError> {
        if self.is(GroupState::Dead) {
            return Err(GroupError::CoordinatorNotAvailable);
        }
        self.validate_member(member_id, instance_id)?;
        if generation_id != self.generation_id {
            return Err(GroupError::IllegalGeneration);
        }
        if protocol_type.is_some_and(|t| Some(t) != self.protocol_type.as_deref())
            || protocol_name.is_some_and(|n| Some(n) != self.protocol_name.as_deref())
        {
            return Err(GroupError::InconsistentGroupProtocol);
        }
        match self.state {
            GroupState::Empty | GroupState::Dead => Err(GroupError::UnknownMemberId),
            GroupState::PreparingRebalance => Err(GroupError::RebalanceInProgress),
            GroupState::Stable => {
                let m = self
                    .members
                    .get_mut(member_id)
                    .ok_or(GroupError::UnknownMemberId)?;
                m.last_heartbeat_ms = now_ms;
                Ok(SyncReply::Now(m.assignment.clone()))
            }
            GroupState::CompletingRebalance => {
                let is_leader = self.is_leader(member_id);
                let m = self
                    .members
                    .get_mut(member_id)
                    .ok_or(GroupError::UnknownMemberId)?;
                m.awaiting_sync = true;
                m.last_heartbeat_ms = now_ms;
                if !is_leader || self.persisting.is_some() {
                    return Ok(SyncReply::Pending);
                }
                let mut given: HashMap<String, Bytes> = assignments.into_iter().collect();
                for m in self.members.values_mut() {
                    m.assignment = given.remove(&m.member_id).unwrap_or_default();
                }
                self.persisting = Some(self.generation_id);
                Ok(SyncReply::Persist {
                    generation: self.generation_id,
                })
            }
        }
    }

    /// The leader's assignment for `generation` was written (`ok`) or not.
    pub fn assignment_persisted(
        &mut self,
        generation: i32,
        ok: Result<(), GroupError>,
        cfg: &GroupConfig,
        now_ms: i64,
        out: &mut Vec<Completion>,
    ) {
        if self.persisting != Some(generation)
            || generation != self.generation_id
            || !self.is(GroupState::CompletingRebalance)
        {
            return;
        }
        self.persisting = None;
        match ok {
            Ok(()) => {
                self.transition(GroupState::Stable, now_ms);
                for m in self.members.values_mut() {
                    if m.awaiting_sync {
                        m.awaiting_sync = false;
                        m.last_heartbeat_ms = now_ms;
                        out.push(Completion::Sync {
                            member_id: m.member_id.clone(),
                            result: Ok(m.assignment.clone()),
                        });
                    }
                }
            }
            Err(e) => {
                self.fail_awaiting_sync(e, out);
                self.prepare_rebalance(cfg, now_ms, out);
            }
        }
    }

    /// Handles a Heartbeat.
    pub fn heartbeat(
        &mut self,
        member_id: &str,
        instance_id: Option<&str>,
        generation_id: i32,
        now_ms: i64,
    ) -> Result<(), GroupError> {
        if self.is(GroupState::Dead) {
            return Err(GroupError::CoordinatorNotAvailable);
        }
        self.validate_member(member_id, instance_id)?;
        if generation_id != self.generation_id {
            return Err(GroupError::IllegalGeneration);
        }
        match self.state {
            GroupState::Empty | GroupState::Dead => Err(GroupError::UnknownMemberId),
            GroupState::PreparingRebalance => {
                self.touch(member_id, now_ms);
                Err(GroupError::RebalanceInProgress)
            }
            GroupState::CompletingRebalance | GroupState::Stable => {
                self.touch(member_id, now_ms);
                Ok(())
            }
        }
    }

    /// An offset commit in Stable or PreparingRebalance counts as a
    /// heartbeat of its member.
    pub fn touch_if_active(&mut self, member_id: &str, now_ms: i64) {
        if self.is(GroupState::Stable) || self.is(GroupState::PreparingRebalance) {
            self.touch(member_id, now_ms);
        }
    }

    fn touch(&mut self, member_id: &str, now_ms: i64) {
        if let Some(m) = self.members.get_mut(member_id) {
            m.last_heartbeat_ms = now_ms;
        }
    }

    /// Handles a LeaveGroup of `members` (member id, instance id); one
    /// result per member, in order.
    pub fn leave(
        &mut self,
        members: &[(String, Option<String>)],
        cfg: &GroupConfig,
        now_ms: i64,
        out: &mut Vec<Completion>,
    ) -> Result<Vec<Result<(), GroupError>>, GroupError> {
        if self.is(GroupState::Dead) {
            return Err(GroupError::CoordinatorNotAvailable);
        }
        let mut results = Vec::with_capacity(members.len());
        let mut removed = false;
        for (member_id, instance_id) in members {
            let result = match instance_id {
                Some(instance) => match self.static_members.get(instance).cloned() {
                    None => Err(GroupError::UnknownMemberId),
                    Some(existing) if !member_id.is_empty() && existing != *member_id => {
                        Err(GroupError::FencedInstanceId)
                    }
                    Some(existing) => {
                        self.remove_member(&existing, out);
                        removed = true;
                        Ok(())
                    }
                },
                None if self.pending_members.remove(member_id).is_some() => Ok(()),
                None if self.members.contains_key(member_id) => {
                    self.remove_member(member_id, out);
                    removed = true;
                    Ok(())
                }
                None => Err(GroupError::UnknownMemberId),
            };
            results.push(result);
        }
        if removed {
            self.after_member_removed(cfg, now_ms, out);
            self.poll(cfg, now_ms, out);
        }
        Ok(results)
    }

    /// Checks an OffsetCommit (or TxnOffsetCommit) against the group, as
    /// Kafka's `ClassicGroup.validateOffsetCommit` (a consumer group's:
    /// [`ConsumerGroup::validate_offset_commit`]). `Ok(Some(epoch))`: a
    /// consumer-group member committing with an older member epoch; each
    /// partition is then checked with [`Self::committable`].
    pub fn validate_offset_commit(
        &self,
        member_id: &str,
        instance_id: Option<&str>,
        generation_id: i32,
        transactional: bool,
    ) -> Result<Option<i32>, GroupError> {
        if self.is(GroupState::Dead) {
            return Err(GroupError::CoordinatorNotAvailable);
        }
        if let Some(c) = &self.consumer {
            // The generation of a consumer-group commit is the member epoch.
            return c.validate_offset_commit(member_id, generation_id, transactional);
        }
        if generation_id < 0 && self.is(GroupState::Empty) {
            // An admin or simple-consumer commit.
            return Ok(None);
        }
        if generation_id >= 0 || !member_id.is_empty() || instance_id.is_some() {
            self.validate_member(member_id, instance_id)?;
            if generation_id != self.generation_id {
                return Err(GroupError::IllegalGeneration);
            }
        } else if !transactional && !self.is(GroupState::Empty) {
            return Err(GroupError::UnknownMemberId);
        }
        if self.is(GroupState::CompletingRebalance) {
            return Err(GroupError::RebalanceInProgress);
        }
        Ok(None)
    }

    /// Whether a consumer-group commit with the older member epoch `epoch`
    /// (what [`Self::validate_offset_commit`] returned) may commit
    /// `topic`-`partition` (KIP-1251).
    pub fn committable(&self, member_id: &str, epoch: i32, topic: &str, partition: i32) -> bool {
        self.consumer
            .as_ref()
            .is_some_and(|c| c.committable(member_id, epoch, topic, partition))
    }

    /// Records a (written) commit.
    pub fn commit_offset(&mut self, topic: &str, partition: i32, offset: CommittedOffset) {
        self.offsets.insert((topic.to_string(), partition), offset);
    }

    /// Records a (written) transactional commit, pending until its marker.
    pub fn add_pending_txn_offset(
        &mut self,
        producer_id: i64,
        topic: &str,
        partition: i32,
        offset: CommittedOffset,
    ) {
        self.pending_txn_offsets
            .entry(producer_id)
            .or_default()
            .insert((topic.to_string(), partition), offset);
    }

    /// A COMMIT (`commit`) or ABORT marker for `producer_id` was written.
    pub fn complete_transaction(&mut self, producer_id: i64, commit: bool) {
        if let Some(pending) = self.pending_txn_offsets.remove(&producer_id) {
            if commit {
                self.offsets.extend(pending);
            }
        }
    }

    /// Whether a transactional commit for the partition is pending.
    pub fn has_pending_txn_offset(&self, topic: &str, partition: i32) -> bool {
        let key = (topic.to_string(), partition);
        self.pending_txn_offsets
            .values()
            .any(|p| p.contains_key(&key))
    }

    /// Offsets past `offsets.retention`: for an empty group counted from
    /// when it became empty (or the commit, if later), for a group without
    /// a protocol (simple consumers) from the commit; never while the group
    /// has members. Kafka's `OffsetExpirationCondition`.
    pub fn expired_offsets(&self, cfg: &GroupConfig, now_ms: i64) -> Vec<(String, i32)> {
        if !self.is(GroupState::Empty) || !self.has_no_members() {
            return Vec::new();
        }
        self.offsets
            .iter()
            .filter(|(_, o)| match o.expire_timestamp_ms {
                Some(t) => now_ms >= t,
                None => {
                    let base = if self.protocol_type.is_some() {
                        self.state_timestamp_ms.max(o.commit_timestamp_ms)
                    } else {
                        o.commit_timestamp_ms
                    };
                    now_ms >= base + cfg.offsets_retention_ms
                }
            })
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Whether DeleteGroups may delete the group.
    pub fn validate_delete(&self) -> Result<(), GroupError> {
        if !self.has_no_members() && !self.is(GroupState::Dead) {
            return Err(GroupError::NonEmptyGroup);
        }
        match self.state {
            GroupState::Dead => Err(GroupError::GroupIdNotFound),
            GroupState::Empty => Ok(()),
            _ => Err(GroupError::NonEmptyGroup),
        }
    }

    /// Marks the group deleted.
    pub fn mark_dead(&mut self, now_ms: i64) {
        self.offsets.clear();
        self.transition(GroupState::Dead, now_ms);
    }

    /// Topics the group's consumers subscribe to (consumer protocol only;
    /// `None` when the group does not use it).
    pub fn subscribed_topics(&self) -> Option<Vec<String>> {
        if let Some(c) = &self.consumer {
            return Some(c.subscribed_topic_names());
        }
        if self.protocol_type.as_deref() != Some("consumer") || self.is(GroupState::Empty) {
            return None;
        }
        let protocol = self.protocol_name.clone()?;
        let mut topics = Vec::new();
        for m in self.members.values() {
            topics.extend(parse_subscription_topics(&m.metadata_for(&protocol))?);
        }
        Some(topics)
    }

    /// The (member id, instance id, client id, host, metadata, assignment)
    /// rows DescribeGroups reports; metadata and assignment only when
    /// Stable, as Kafka does.
    pub fn describe_members(&self) -> Vec<(Member, Bytes, Bytes)> {
        let protocol = self.protocol_name.clone().unwrap_or_default();
        let stable = self.is(GroupState::Stable);
        self.members
            .values()
            .map(|m| {
                if stable {
                    (m.clone(), m.metadata_for(&protocol), m.assignment.clone())
                } else {
                    (m.clone(), Bytes::new(), Bytes::new())
                }
            })
            .collect()
    }

    /// Restores membership from a replayed GroupMetadataValue: a group
    /// with members comes back Stable (their sessions restart now), one
    /// without comes back Empty.
    #[allow(clippy::too_many_arguments)]
    pub fn restore(
        &mut self,
        protocol_type: String,
        generation_id: i32,
        protocol_name: Option<String>,
        leader: Option<String>,
        state_timestamp_ms: i64,
        members: Vec<Member>,
        now_ms: i64,
    ) {
        self.protocol_type = (!protocol_type.is_empty()).then_some(protocol_type);
        self.generation_id = generation_id;
        self.protocol_name = protocol_name;
        self.leader = leader;
        self.members.clear();
        self.static_members.clear();
        for mut m in members {
            m.last_heartbeat_ms = now_ms;
            m.awaiting_join = false;
            m.awaiting_sync = false;
            if let Some(i) = &m.group_instance_id {
                self.static_members.insert(i.clone(), m.member_id.clone());
            }
            self.members.insert(m.member_id.clone(), m);
        }
        if self.members.is_empty() {
            self.leader = None;
            self.state = GroupState::Empty;
        } else {
            self.state = GroupState::Stable;
        }
        self.state_timestamp_ms = if state_timestamp_ms >= 0 {
            state_timestamp_ms
        } else {
            now_ms
        };
    }
}

/// Topics of a consumer-protocol subscription (ConsumerProtocolSubscription:
/// version i16, then an array of topic names). `None` if malformed.
pub fn parse_subscription_topics(metadata: &[u8]) -> Option<Vec<String>> {
    let mut b = metadata;
    let take = |b: &mut &[u8], n: usize| -> Option<Vec<u8>> {
        if b.len() < n {
            return None;
        }
        let (head, rest) = b.split_at(n);
        *b = rest;
        Some(head.to_vec())
    };
    let _version = i16::from_be_bytes(take(&mut b, 2)?.try_into().ok()?);
    let count = i32::from_be_bytes(take(&mut b, 4)?.try_into().ok()?);
    let mut topics = Vec::new();
    for _ in 0..count.max(0) {
        let len = i16::from_be_bytes(take(&mut b, 2)?.try_into().ok()?);
        let name = take(&mut b, usize::try_from(len).ok()?)?;
        topics.push(String::from_utf8(name).ok()?);
    }
    Some(topics)
}

#[cfg(test)]
mod tests {
    //! Every transition and error of the machine, on a fake clock (plain
    //! millisecond values).
    use super::*;

    const SESSION_MS: i32 = 10_000;
    const REBALANCE_MS: i32 = 20_000;

    fn cfg(delay_ms: i64) -> GroupConfig {
        GroupConfig {
            initial_rebalance_delay_ms: delay_ms,
            ..GroupConfig::default()
        }
    }

    fn req(member_id: &str, new_id: &str) -> JoinRequest {
        JoinRequest {
            member_id: member_id.into(),
            group_instance_id: None,
            client_id: "client".into(),
            client_host: "/127.0.0.1".into(),
            session_timeout_ms: SESSION_MS,
            rebalance_timeout_ms: REBALANCE_MS,
            protocol_type: "consumer".into(),
            protocols: vec![("range".into(), Bytes::from_static(b"r"))],
            require_known_member_id: false,
            new_member_id: new_id.into(),
        }
    }

    fn static_req(member_id: &str, new_id: &str, instance: &str) -> JoinRequest {
        JoinRequest {
            group_instance_id: Some(instance.into()),
            ..req(member_id, new_id)
        }
    }

    fn joins(out: &[Completion]) -> Vec<(String, Result<JoinResult, GroupError>)> {
        out.iter()
            .filter_map(|c| match c {
                Completion::Join { member_id, result } => Some((member_id.clone(), result.clone())),
                _ => None,
            })
            .collect()
    }

    fn syncs(out: &[Completion]) -> Vec<(String, Result<Bytes, GroupError>)> {
        out.iter()
            .filter_map(|c| match c {
                Completion::Sync { member_id, result } => Some((member_id.clone(), result.clone())),
                _ => None,
            })
            .collect()
    }

    /// A Stable group with members m1 (leader) and m2 at generation 1.
    fn stable_pair(c: &GroupConfig) -> Group {
        let mut g = Group::new("g", 0);
        let mut out = Vec::new();
        assert_eq!(
            g.join(req("", "m1"), c, 0, &mut out),
            Ok(JoinReply::Pending)
        );
        assert_eq!(
            g.join(req("", "m2"), c, 0, &mut out),
            Ok(JoinReply::Pending)
        );
        g.poll(c, 0, &mut out);
        assert_eq!(g.state, GroupState::CompletingRebalance);
        assert_eq!(joins(&out).len(), 2);
        out.clear();
        assert_eq!(
            g.sync("m2", None, 1, None, None, vec![], 1),
            Ok(SyncReply::Pending)
        );
        let assignments = vec![
            ("m1".to_string(), Bytes::from_static(b"a1")),
            ("m2".to_string(), Bytes::from_static(b"a2")),
        ];
        assert_eq!(
            g.sync(
                "m1",
                None,
                1,
                Some("consumer"),
                Some("range"),
                assignments,
                1
            ),
            Ok(SyncReply::Persist { generation: 1 })
        );
        g.assignment_persisted(1, Ok(()), c, 2, &mut out);
        assert_eq!(g.state, GroupState::Stable);
        let mut s = syncs(&out);
        s.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            s,
            vec![
                ("m1".into(), Ok(Bytes::from_static(b"a1"))),
                ("m2".into(), Ok(Bytes::from_static(b"a2")))
            ]
        );
        g
    }

    #[test]
    fn new_dynamic_member_needs_a_member_id_from_v4() {
        let c = cfg(0);
        let mut g = Group::new("g", 0);
        let mut out = Vec::new();
        let r = JoinRequest {
            require_known_member_id: true,
            ..req("", "m1")
        };
        assert_eq!(
            g.join(r.clone(), &c, 0, &mut out),
            Err(GroupError::MemberIdRequired("m1".into()))
        );
        assert!(g.members.is_empty() && g.pending_members.contains_key("m1"));
        let again = JoinRequest {
            member_id: "m1".into(),
            ..r
        };
        assert_eq!(g.join(again, &c, 1, &mut out), Ok(JoinReply::Pending));
        g.poll(&c, 1, &mut out);
        let j = joins(&out);
        assert_eq!(j.len(), 1);
        let result = j[0].1.clone().unwrap();
        assert_eq!(result.generation_id, 1);
        assert_eq!(result.leader, "m1");
        assert_eq!(result.protocol_name.as_deref(), Some("range"));
        assert_eq!(result.members.len(), 1, "the leader gets the member list");
    }

    #[test]
    fn pending_member_ids_expire_after_the_session_timeout() {
        let c = cfg(0);
        let mut g = Group::new("g", 0);
        let mut out = Vec::new();
        let r = JoinRequest {
            require_known_member_id: true,
            ..req("", "m1")
        };
        let _ = g.join(r, &c, 0, &mut out);
        g.poll(&c, SESSION_MS as i64, &mut out);
        assert!(g.pending_members.is_empty());
        assert_eq!(
            g.join(req("m1", ""), &c, SESSION_MS as i64 + 1, &mut out),
            Err(GroupError::UnknownMemberId)
        );
    }

    #[test]
    fn initial_rebalance_delay_waits_and_extends_per_new_member() {
        let c = cfg(3_000);
        let mut g = Group::new("g", 0);
        let mut out = Vec::new();
        g.join(req("", "m1"), &c, 0, &mut out).unwrap();
        g.poll(&c, 2_999, &mut out);
        assert_eq!(g.state, GroupState::PreparingRebalance);
        assert!(out.is_empty(), "everyone joined, but the delay holds");
        g.join(req("", "m2"), &c, 2_000, &mut out).unwrap();
        g.poll(&c, 4_999, &mut out);
        assert!(out.is_empty(), "a new member extends the delay to 5000");
        g.poll(&c, 5_000, &mut out);
        assert_eq!(g.state, GroupState::CompletingRebalance);
        assert_eq!(joins(&out).len(), 2);
        assert_eq!(g.generation_id, 1);
    }

    #[test]
    fn initial_delay_never_exceeds_the_rebalance_timeout() {
        let c = cfg(15_000);
        let mut g = Group::new("g", 0);
        let mut out = Vec::new();
        g.join(req("", "m1"), &c, 0, &mut out).unwrap();
        for (i, t) in [10_000i64, 19_000].iter().enumerate() {
            g.join(req("", &format!("n{i}")), &c, *t, &mut out).unwrap();
        }
        g.poll(&c, REBALANCE_MS as i64 - 1, &mut out);
        assert!(out.is_empty());
        g.poll(&c, REBALANCE_MS as i64, &mut out);
        assert_eq!(joins(&out).len(), 3, "capped at the rebalance timeout");
    }

    #[test]
    fn join_errors() {
        let c = cfg(0);
        let mut g = Group::new("g", 0);
        let mut out = Vec::new();
        let short = JoinRequest {
            session_timeout_ms: GROUP_MIN_SESSION_TIMEOUT_MS - 1,
            ..req("", "m1")
        };
        assert_eq!(
            g.join(short, &c, 0, &mut out),
            Err(GroupError::InvalidSessionTimeout)
        );
        let long = JoinRequest {
            session_timeout_ms: GROUP_MAX_SESSION_TIMEOUT_MS + 1,
            ..req("", "m1")
        };
        assert_eq!(
            g.join(long, &c, 0, &mut out),
            Err(GroupError::InvalidSessionTimeout)
        );
        let no_protocols = JoinRequest {
            protocols: vec![],
            ..req("", "m1")
        };
        assert_eq!(
            g.join(no_protocols, &c, 0, &mut out),
            Err(GroupError::InconsistentGroupProtocol)
        );
        assert_eq!(
            g.join(req("ghost", ""), &c, 0, &mut out),
            Err(GroupError::UnknownMemberId)
        );
        g.join(req("", "m1"), &c, 0, &mut out).unwrap();
        let other_type = JoinRequest {
            protocol_type: "connect".into(),
            ..req("", "m2")
        };
        assert_eq!(
            g.join(other_type, &c, 0, &mut out),
            Err(GroupError::InconsistentGroupProtocol)
        );
        let no_common = JoinRequest {
            protocols: vec![("roundrobin".into(), Bytes::new())],
            ..req("", "m2")
        };
        assert_eq!(
            g.join(no_common, &c, 0, &mut out),
            Err(GroupError::InconsistentGroupProtocol)
        );
        g.mark_dead(1);
        assert_eq!(
            g.join(req("", "m3"), &c, 1, &mut out),
            Err(GroupError::CoordinatorNotAvailable)
        );
    }

    fn capped(max_size: usize, delay_ms: i64) -> GroupConfig {
        GroupConfig {
            max_size,
            ..cfg(delay_ms)
        }
    }

    #[test]
    fn a_full_join_phase_refuses_new_members_but_not_awaiting_ones() {
        let c = capped(2, 1_000);
        let mut g = Group::new("g", 0);
        let mut out = Vec::new();
        g.join(req("", "m1"), &c, 0, &mut out).unwrap();
        g.join(req("", "m2"), &c, 0, &mut out).unwrap();
        assert_eq!(
            g.join(req("", "m3"), &c, 0, &mut out),
            Err(GroupError::GroupMaxSizeReached)
        );
        assert_eq!(g.members.len(), 2);
        // A member already awaiting its answer may send JoinGroup again.
        assert_eq!(
            g.join(req("m1", ""), &c, 1, &mut out),
            Ok(JoinReply::Pending)
        );
        // JoinGroup v4+: refused before MEMBER_ID_REQUIRED hands out an id.
        let v4 = JoinRequest {
            require_known_member_id: true,
            ..req("", "m4")
        };
        assert_eq!(
            g.join(v4, &c, 1, &mut out),
            Err(GroupError::GroupMaxSizeReached)
        );
        assert!(g.pending_members.is_empty());
        g.poll(&c, 1_000, &mut out);
        assert_eq!(g.state, GroupState::CompletingRebalance);
        assert_eq!(joins(&out).len(), 2);
        // CompletingRebalance: members are accepted, new members are not.
        assert_eq!(
            g.join(req("", "m5"), &c, 1_001, &mut out),
            Err(GroupError::GroupMaxSizeReached)
        );
        match g.join(req("m2", ""), &c, 1_001, &mut out) {
            Ok(JoinReply::Now(r)) => assert_eq!(r.generation_id, 1),
            other => panic!("a member rejoining is accepted, got {other:?}"),
        }
    }

    #[test]
    fn a_full_stable_group_refuses_new_members_and_lets_members_rejoin() {
        let c = capped(2, 0);
        let mut g = stable_pair(&c);
        let mut out = Vec::new();
        assert_eq!(
            g.join(req("", "m3"), &c, 5, &mut out),
            Err(GroupError::GroupMaxSizeReached)
        );
        assert_eq!(
            g.join(static_req("", "s1", "inst"), &c, 5, &mut out),
            Err(GroupError::GroupMaxSizeReached)
        );
        assert_eq!(g.state, GroupState::Stable, "a refusal starts no rebalance");
        assert_eq!(g.members.len(), 2);
        assert_eq!(
            g.join(req("m1", ""), &c, 6, &mut out),
            Ok(JoinReply::Pending),
            "the leader rejoining starts a rebalance"
        );
        // A member leaving makes room again.
        g.leave(&[("m2".into(), None)], &c, 7, &mut out).unwrap();
        assert_eq!(
            g.join(req("", "m3"), &c, 7, &mut out),
            Ok(JoinReply::Pending)
        );
    }

    #[test]
    fn members_over_a_lowered_limit_are_shed_when_they_rejoin() {
        // A Stable pair, loaded by a broker whose group.max.size is now 1.
        let mut g = stable_pair(&cfg(0));
        let c = capped(1, 0);
        let mut out = Vec::new();
        assert!(g.rebalance_if_over_capacity(&c, 10, &mut out));
        assert_eq!(g.state, GroupState::PreparingRebalance);
        // The first member to rejoin takes the one place; the next one is
        // refused and removed from the group.
        assert_eq!(
            g.join(req("m2", ""), &c, 11, &mut out),
            Ok(JoinReply::Pending)
        );
        assert_eq!(
            g.join(req("m1", ""), &c, 12, &mut out),
            Err(GroupError::GroupMaxSizeReached)
        );
        assert!(!g.members.contains_key("m1"));
        assert_eq!(g.leader.as_deref(), Some("m2"));
        g.poll(&c, 12, &mut out);
        assert_eq!(g.state, GroupState::CompletingRebalance);
        assert_eq!(g.generation_id, 2);
        assert_eq!(g.members.len(), 1);
        assert!(!g.rebalance_if_over_capacity(&c, 13, &mut out));
    }

    #[test]
    fn sync_hands_out_the_leaders_assignment_after_it_is_persisted() {
        let g = stable_pair(&cfg(0));
        assert_eq!(g.members["m2"].assignment, Bytes::from_static(b"a2"));
    }

    #[test]
    fn failed_persist_fails_the_syncs_and_rebalances() {
        let c = cfg(0);
        let mut g = Group::new("g", 0);
        let mut out = Vec::new();
        g.join(req("", "m1"), &c, 0, &mut out).unwrap();
        g.poll(&c, 0, &mut out);
        out.clear();
        assert_eq!(
            g.sync("m1", None, 1, None, None, vec![], 1),
            Ok(SyncReply::Persist { generation: 1 })
        );
        let e = GroupError::Storage("disk".into());
        g.assignment_persisted(1, Err(e.clone()), &c, 2, &mut out);
        assert_eq!(syncs(&out), vec![("m1".into(), Err(e))]);
        assert_eq!(g.state, GroupState::PreparingRebalance);
    }

    #[test]
    fn sync_errors() {
        let c = cfg(0);
        let mut g = stable_pair(&c);
        assert_eq!(
            g.sync("ghost", None, 1, None, None, vec![], 3),
            Err(GroupError::UnknownMemberId)
        );
        assert_eq!(
            g.sync("m1", None, 0, None, None, vec![], 3),
            Err(GroupError::IllegalGeneration)
        );
        assert_eq!(
            g.sync("m1", None, 1, Some("connect"), None, vec![], 3),
            Err(GroupError::InconsistentGroupProtocol)
        );
        assert_eq!(
            g.sync("m1", None, 1, None, Some("roundrobin"), vec![], 3),
            Err(GroupError::InconsistentGroupProtocol)
        );
        // Stable: a sync returns the stored assignment at once.
        assert_eq!(
            g.sync("m2", None, 1, None, None, vec![], 3),
            Ok(SyncReply::Now(Bytes::from_static(b"a2")))
        );
        let mut out = Vec::new();
        g.prepare_rebalance(&c, 4, &mut out);
        assert_eq!(
            g.sync("m2", None, 1, None, None, vec![], 5),
            Err(GroupError::RebalanceInProgress)
        );
    }

    #[test]
    fn heartbeat_transitions_and_errors() {
        let c = cfg(0);
        let mut g = stable_pair(&c);
        assert_eq!(g.heartbeat("m1", None, 1, 10), Ok(()));
        assert_eq!(
            g.heartbeat("ghost", None, 1, 10),
            Err(GroupError::UnknownMemberId)
        );
        assert_eq!(
            g.heartbeat("m1", None, 7, 10),
            Err(GroupError::IllegalGeneration)
        );
        let mut out = Vec::new();
        // The leader rejoining starts a rebalance; m2's heartbeat learns it.
        assert_eq!(
            g.join(req("m1", ""), &c, 11, &mut out),
            Ok(JoinReply::Pending)
        );
        assert_eq!(
            g.heartbeat("m2", None, 1, 12),
            Err(GroupError::RebalanceInProgress)
        );
    }

    #[test]
    fn a_follower_rejoining_a_stable_group_with_same_protocols_gets_the_current_generation() {
        let c = cfg(0);
        let mut g = stable_pair(&c);
        let mut out = Vec::new();
        match g.join(req("m2", ""), &c, 5, &mut out) {
            Ok(JoinReply::Now(r)) => {
                assert_eq!(r.generation_id, 1);
                assert!(r.members.is_empty());
            }
            other => panic!("expected an immediate answer, got {other:?}"),
        }
        assert_eq!(g.state, GroupState::Stable);
    }

    #[test]
    fn session_expiry_removes_the_member_and_rebalances() {
        let c = cfg(0);
        let mut g = stable_pair(&c);
        let mut out = Vec::new();
        // m1 keeps heartbeating, m2 goes silent after t=2.
        g.heartbeat("m1", None, 1, 9_000).unwrap();
        g.poll(&c, 2 + SESSION_MS as i64 - 1, &mut out);
        assert_eq!(g.members.len(), 2);
        g.poll(&c, 2 + SESSION_MS as i64, &mut out);
        assert!(!g.members.contains_key("m2"));
        assert_eq!(g.state, GroupState::PreparingRebalance);
        // m1 rejoins; the join completes without m2 at generation 2.
        g.join(req("m1", ""), &c, 10_003, &mut out).unwrap();
        g.poll(&c, 10_003, &mut out);
        assert_eq!(g.generation_id, 2);
        assert_eq!(g.state, GroupState::CompletingRebalance);
        assert_eq!(joins(&out).len(), 1);
    }

    #[test]
    fn members_that_do_not_rejoin_are_dropped_at_the_rebalance_timeout() {
        let c = cfg(0);
        let mut g = stable_pair(&c);
        let mut out = Vec::new();
        g.join(req("m1", ""), &c, 10, &mut out).unwrap();
        // m2 keeps heartbeating but never rejoins.
        for t in (1_000..REBALANCE_MS as i64).step_by(1_000) {
            let _ = g.heartbeat("m2", None, 1, t);
            g.poll(&c, t, &mut out);
        }
        assert_eq!(g.state, GroupState::PreparingRebalance);
        g.poll(&c, 10 + REBALANCE_MS as i64, &mut out);
        assert_eq!(g.state, GroupState::CompletingRebalance);
        assert!(!g.members.contains_key("m2"));
        assert_eq!(g.leader.as_deref(), Some("m1"));
    }

    #[test]
    fn leave_rebalances_and_moves_leadership() {
        let c = cfg(0);
        let mut g = stable_pair(&c);
        let mut out = Vec::new();
        let r = g
            .leave(
                &[("m1".into(), None), ("ghost".into(), None)],
                &c,
                5,
                &mut out,
            )
            .unwrap();
        assert_eq!(r, vec![Ok(()), Err(GroupError::UnknownMemberId)]);
        assert_eq!(g.leader.as_deref(), Some("m2"));
        assert_eq!(g.state, GroupState::PreparingRebalance);
        // The last member leaving empties the group at the next generation.
        g.leave(&[("m2".into(), None)], &c, 6, &mut out).unwrap();
        assert_eq!(g.state, GroupState::Empty);
        assert_eq!(g.generation_id, 2);
        assert!(g.metadata_dirty);
    }

    #[test]
    fn static_member_rejoins_without_a_rebalance_and_fences_its_old_id() {
        let c = cfg(0);
        let mut g = Group::new("g", 0);
        let mut out = Vec::new();
        g.join(static_req("", "s1", "inst"), &c, 0, &mut out)
            .unwrap();
        g.join(req("", "m2"), &c, 0, &mut out).unwrap();
        g.poll(&c, 0, &mut out);
        g.sync("m2", None, 1, None, None, vec![], 1).unwrap();
        g.sync(
            "s1",
            Some("inst"),
            1,
            None,
            None,
            vec![("s1".into(), Bytes::from_static(b"x"))],
            1,
        )
        .unwrap();
        g.assignment_persisted(1, Ok(()), &c, 1, &mut out);
        assert_eq!(g.state, GroupState::Stable);
        // Restart: same instance id, no member id.
        match g.join(static_req("", "s2", "inst"), &c, 5, &mut out) {
            Ok(JoinReply::Now(r)) => {
                assert_eq!(r.generation_id, 1, "no new generation");
                assert_eq!(r.member_id, "s2");
            }
            other => panic!("expected an immediate answer, got {other:?}"),
        }
        assert_eq!(g.state, GroupState::Stable);
        assert_eq!(g.members["s2"].assignment, Bytes::from_static(b"x"));
        assert!(g.metadata_dirty, "the new member id is persisted");
        assert_eq!(
            g.heartbeat("s1", Some("inst"), 1, 6),
            Err(GroupError::FencedInstanceId)
        );
        assert_eq!(g.heartbeat("s2", Some("inst"), 1, 6), Ok(()));
        assert_eq!(
            g.leave(&[("s1".into(), Some("inst".into()))], &c, 7, &mut out)
                .unwrap(),
            vec![Err(GroupError::FencedInstanceId)]
        );
        assert_eq!(
            g.leave(&[("".into(), Some("other".into()))], &c, 7, &mut out)
                .unwrap(),
            vec![Err(GroupError::UnknownMemberId)]
        );
    }

    #[test]
    fn offset_commit_validation() {
        let c = cfg(0);
        let mut g = Group::new("g", 0);
        assert_eq!(g.validate_offset_commit("", None, -1, false), Ok(None));
        g = stable_pair(&c);
        assert_eq!(g.validate_offset_commit("m1", None, 1, false), Ok(None));
        assert_eq!(
            g.validate_offset_commit("m1", None, 0, false),
            Err(GroupError::IllegalGeneration)
        );
        assert_eq!(
            g.validate_offset_commit("ghost", None, 1, false),
            Err(GroupError::UnknownMemberId)
        );
        assert_eq!(
            g.validate_offset_commit("", None, -1, false),
            Err(GroupError::UnknownMemberId)
        );
        let mut out = Vec::new();
        g.join(req("m1", ""), &c, 3, &mut out).unwrap();
        g.join(req("m2", ""), &c, 3, &mut out).unwrap();
        g.poll(&c, 3, &mut out);
        assert_eq!(g.state, GroupState::CompletingRebalance);
        assert_eq!(
            g.validate_offset_commit("m1", None, 2, false),
            Err(GroupError::RebalanceInProgress)
        );
    }

    fn offset(o: i64, ts: i64) -> CommittedOffset {
        CommittedOffset {
            offset: o,
            leader_epoch: -1,
            metadata: String::new(),
            commit_timestamp_ms: ts,
            expire_timestamp_ms: None,
        }
    }

    #[test]
    fn transactional_offsets_wait_for_their_marker() {
        let mut g = Group::new("g", 0);
        g.add_pending_txn_offset(7, "t", 0, offset(10, 0));
        g.add_pending_txn_offset(8, "t", 1, offset(20, 0));
        assert!(g.has_pending_txn_offset("t", 0));
        assert!(g.offsets.is_empty());
        g.complete_transaction(7, true);
        assert_eq!(g.offsets[&("t".to_string(), 0)].offset, 10);
        g.complete_transaction(8, false);
        assert!(!g.offsets.contains_key(&("t".to_string(), 1)));
        assert!(g.pending_txn_offsets.is_empty());
    }

    #[test]
    fn offsets_expire_only_when_the_group_is_empty() {
        let c = GroupConfig {
            offsets_retention_ms: 1_000,
            ..cfg(0)
        };
        let mut g = stable_pair(&c);
        g.commit_offset("t", 0, offset(5, 0));
        assert!(
            g.expired_offsets(&c, 1_000_000).is_empty(),
            "group has members"
        );
        let mut out = Vec::new();
        g.leave(
            &[("m1".into(), None), ("m2".into(), None)],
            &c,
            100,
            &mut out,
        )
        .unwrap();
        assert_eq!(g.state, GroupState::Empty);
        assert!(g.expired_offsets(&c, 1_099).is_empty());
        assert_eq!(g.expired_offsets(&c, 1_100), vec![("t".to_string(), 0)]);
    }

    #[test]
    fn delete_requires_an_empty_group() {
        let c = cfg(0);
        let mut g = stable_pair(&c);
        assert_eq!(g.validate_delete(), Err(GroupError::NonEmptyGroup));
        let mut out = Vec::new();
        g.leave(&[("m1".into(), None), ("m2".into(), None)], &c, 1, &mut out)
            .unwrap();
        assert_eq!(g.validate_delete(), Ok(()));
        g.mark_dead(2);
        assert_eq!(g.validate_delete(), Err(GroupError::GroupIdNotFound));
        assert_eq!(
            g.heartbeat("m1", None, 1, 3),
            Err(GroupError::CoordinatorNotAvailable)
        );
    }

    #[test]
    fn protocol_vote_picks_the_most_preferred_common_protocol() {
        let c = cfg(0);
        let mut g = Group::new("g", 0);
        let mut out = Vec::new();
        let p = |names: &[&str]| -> Vec<(String, Bytes)> {
            names
                .iter()
                .map(|n| (n.to_string(), Bytes::new()))
                .collect()
        };
        for (id, prefs) in [
            ("a", p(&["range", "roundrobin"])),
            ("b", p(&["roundrobin", "range"])),
            ("c", p(&["roundrobin", "range", "sticky"])),
        ] {
            let r = JoinRequest {
                protocols: prefs,
                ..req("", id)
            };
            g.join(r, &c, 0, &mut out).unwrap();
        }
        assert_eq!(g.select_protocol().as_deref(), Some("roundrobin"));
    }

    #[test]
    fn subscription_topics_are_parsed_from_consumer_metadata() {
        let mut m = vec![0u8, 1, 0, 0, 0, 2];
        for t in ["a", "bb"] {
            m.extend_from_slice(&(t.len() as i16).to_be_bytes());
            m.extend_from_slice(t.as_bytes());
        }
        assert_eq!(
            parse_subscription_topics(&m),
            Some(vec!["a".to_string(), "bb".to_string()])
        );
        assert_eq!(parse_subscription_topics(&m[..5]), None);
    }

    /// Upgrade and downgrade of the classic part: a stable classic group
    /// of consumer-protocol members becomes a consumer group (parked
    /// requests answered, offsets kept), and becomes classic again when
    /// the consumer-protocol member that joined leaves.
    #[test]
    fn a_group_is_upgraded_and_downgraded_online_keeping_its_offsets() {
        use super::super::consumer::{ConsumerGroupConfig, HeartbeatRequest};
        use super::super::consumer_protocol::{self as cp, Subscription};
        let c = cfg(0);
        let topics: BTreeMap<String, i32> = [("t".to_string(), 4)].into_iter().collect();
        let metadata = cp::encode_subscription(&Subscription {
            version: 1,
            topics: vec!["t".into()],
            owned: Some(Default::default()),
            rack_id: None,
        });
        let with_md = |id: &str| JoinRequest {
            protocols: vec![("range".into(), metadata.clone())],
            ..req("", id)
        };
        let mut g = Group::new("g", 0);
        let mut out = Vec::new();
        g.join(with_md("m1"), &c, 0, &mut out).unwrap();
        g.join(with_md("m2"), &c, 0, &mut out).unwrap();
        g.poll(&c, 0, &mut out);
        let mut a1 = super::super::consumer::Assignment::new();
        a1.insert("t".into(), [0, 1].into_iter().collect());
        let mut a2 = super::super::consumer::Assignment::new();
        a2.insert("t".into(), [2, 3].into_iter().collect());
        g.sync("m2", None, 1, None, None, vec![], 1).unwrap();
        g.sync(
            "m1",
            None,
            1,
            Some("consumer"),
            Some("range"),
            vec![
                ("m1".into(), cp::encode_assignment(&a1, 1)),
                ("m2".into(), cp::encode_assignment(&a2, 1)),
            ],
            1,
        )
        .unwrap();
        g.assignment_persisted(1, Ok(()), &c, 1, &mut out);
        assert!(g.is(GroupState::Stable));
        g.commit_offset(
            "t",
            0,
            CommittedOffset {
                offset: 42,
                leader_epoch: 0,
                metadata: String::new(),
                commit_timestamp_ms: 1,
                expire_timestamp_ms: None,
            },
        );
        assert!(g.upgradable(c.max_size));

        let mut consumer =
            ConsumerGroup::from_classic(g.generation_id, g.classic_snapshots(), &topics, 2)
                .unwrap();
        let ccfg = ConsumerGroupConfig::default();
        let join = HeartbeatRequest {
            member_id: "k1".into(),
            member_epoch: 0,
            rebalance_timeout_ms: 30_000,
            subscribed_topic_names: Some(vec!["t".into()]),
            owned: Some(Default::default()),
            ..HeartbeatRequest::default()
        };
        let answer = consumer.heartbeat(join, &ccfg, &topics, 2).unwrap();
        assert_eq!(answer.member_epoch, 2);
        out.clear();
        g.become_consumer_group(consumer, 2, &mut out);
        assert!(g.is_consumer_group() && g.members.is_empty());
        assert_eq!(g.offsets.len(), 1, "offsets are kept");
        assert!(!g.upgradable(c.max_size));
        // While a consumer-protocol member is in, the group stays.
        assert_eq!(g.maybe_become_classic_group(&c, 2, 3, &mut out), None);

        // k1 leaves: only classic members remain, at generation 2.
        let cg = g.consumer.as_mut().unwrap();
        let before = cg.group_epoch;
        let targets = cg.target.clone();
        cg.remove_member("k1");
        let ids = g
            .maybe_become_classic_group(&c, before, 4, &mut out)
            .unwrap();
        assert_eq!(
            ids,
            vec!["k1".to_string(), "m1".to_string(), "m2".to_string()]
        );
        assert!(!g.is_consumer_group());
        assert_eq!(g.generation_id, before);
        assert_eq!(g.protocol_name.as_deref(), Some("range"));
        assert!(g.is(GroupState::PreparingRebalance));
        assert_eq!(g.offsets.len(), 1, "offsets are kept");
        for (id, m) in &g.members {
            assert_eq!(
                cp::decode_assignment(&m.assignment).unwrap(),
                targets[id],
                "{id} has its target as its classic assignment"
            );
        }
        // The classic members rejoin the classic group.
        assert_eq!(
            g.heartbeat("m1", None, before, 5),
            Err(GroupError::RebalanceInProgress)
        );
    }
}
