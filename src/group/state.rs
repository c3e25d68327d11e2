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

use super::error::GroupError;
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
}

impl Default for GroupConfig {
    fn default() -> Self {
        GroupConfig {
            initial_rebalance_delay_ms: 3_000,
            min_session_timeout_ms: GROUP_MIN_SESSION_TIMEOUT_MS,
            max_session_timeout_ms: GROUP_MAX_SESSION_TIMEOUT_MS,
            offsets_retention_ms: 7 * 24 * 60 * 60 * 1000,
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
        if old.awaiting_join {
            out.push(Completion::Join {
                member_id: old_id.to_string(),
                result: Err(GroupError::FencedInstanceId),
            });
        }
        if old.awaiting_sync {
            out.push(Completion::Sync {
                member_id: old_id.to_string(),
                result: Err(GroupError::FencedInstanceId),
            });
        }
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
        if m.awaiting_join {
            out.push(Completion::Join {
                member_id: member_id.to_string(),
                result: Err(GroupError::UnknownMemberId),
            });
        }
        if m.awaiting_sync {
            out.push(Completion::Sync {
                member_id: member_id.to_string(),
                result: Err(GroupError::UnknownMemberId),
            });
        }
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
    /// Kafka's `ClassicGroup.validateOffsetCommit`.
    pub fn validate_offset_commit(
        &self,
        member_id: &str,
        instance_id: Option<&str>,
        generation_id: i32,
        transactional: bool,
    ) -> Result<(), GroupError> {
        if self.is(GroupState::Dead) {
            return Err(GroupError::CoordinatorNotAvailable);
        }
        if generation_id < 0 && self.is(GroupState::Empty) {
            // An admin or simple-consumer commit.
            return Ok(());
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
        Ok(())
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
        if !self.is(GroupState::Empty) {
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
