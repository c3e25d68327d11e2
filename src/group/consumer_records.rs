//! Kafka's `__consumer_offsets` records of KIP-848 consumer groups (the
//! group-coordinator module's `ConsumerGroup*Key` / `ConsumerGroup*Value`
//! schemas), encoded and decoded by hand like [`super::records`]: they
//! are not in kafka-protocol's generated messages.
//!
//! A key starts with an i16 that names the record type, followed by the
//! key's fields in the non-flexible encoding (i16-length strings). A value
//! starts with its i16 schema version (0 for all of these), followed by
//! the fields in the flexible encoding (compact strings and arrays, tagged
//! fields). A null value is a tombstone. The types fjord writes and reads:
//!
//! | type | key fields | value |
//! |---|---|---|
//! | 3 ConsumerGroupMetadata | group | Epoch, tag 0 MetadataHash |
//! | 5 ConsumerGroupMemberMetadata | group, member | instance, rack, client id/host, topic names, regex, rebalance timeout, assignor, tag 0 ClassicMemberMetadata (session timeout, protocols) for a classic member of a mixed group |
//! | 6 ConsumerGroupTargetAssignmentMetadata | group | AssignmentEpoch |
//! | 7 ConsumerGroupTargetAssignmentMember | group, member | TopicPartitions (topic ids) |
//! | 8 ConsumerGroupCurrentMemberAssignment | group, member | MemberEpoch, PreviousMemberEpoch, State, AssignedPartitions, PartitionsPendingRevocation |
//!
//! Type 4 (ConsumerGroupPartitionMetadata, which Kafka stopped writing in
//! 4.1 for the MetadataHash) is read and ignored. Assignments are stored
//! by topic id, as Kafka does; replay maps them back to names with the
//! metadata image, dropping topics that no longer exist.
//!
//! Which records a change writes ([`take_dirty_records`]): the group's two
//! epoch records when an epoch moved, and the three member records of
//! every member that changed (tombstones for a member that left). The
//! write happens before the heartbeat that caused it is answered.

use super::consumer::{
    Assignment, ClassicMemberMetadata, ConsumerGroup, ConsumerMember, MemberState,
};
use super::cursor::Cursor;
use super::records::RecordFormatError;
use crate::metadata::MetadataImage;
use bytes::{BufMut, Bytes, BytesMut};
use std::collections::BTreeSet;

pub const CONSUMER_GROUP_METADATA_KEY: i16 = 3;
pub const CONSUMER_GROUP_PARTITION_METADATA_KEY: i16 = 4;
pub const CONSUMER_GROUP_MEMBER_METADATA_KEY: i16 = 5;
pub const CONSUMER_GROUP_TARGET_METADATA_KEY: i16 = 6;
pub const CONSUMER_GROUP_TARGET_MEMBER_KEY: i16 = 7;
pub const CONSUMER_GROUP_CURRENT_ASSIGNMENT_KEY: i16 = 8;
/// The value version of every record here.
const VALUE_VERSION: i16 = 0;
/// Most elements an array of a record may announce (a corrupt length must
/// not make the replay allocate gigabytes).
const RECORD_ARRAY_LEN_MAX: usize = 1 << 20;

/// Whether a key of `version` is a consumer-group record of this module.
pub fn is_consumer_key_version(version: i16) -> bool {
    (CONSUMER_GROUP_METADATA_KEY..=CONSUMER_GROUP_CURRENT_ASSIGNMENT_KEY).contains(&version)
}

/// A parsed consumer-group record key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConsumerKey {
    GroupMetadata { group: String },
    PartitionMetadata { group: String },
    MemberMetadata { group: String, member: String },
    TargetMetadata { group: String },
    TargetMember { group: String, member: String },
    CurrentAssignment { group: String, member: String },
}

impl ConsumerKey {
    pub fn group(&self) -> &str {
        match self {
            ConsumerKey::GroupMetadata { group }
            | ConsumerKey::PartitionMetadata { group }
            | ConsumerKey::MemberMetadata { group, .. }
            | ConsumerKey::TargetMetadata { group }
            | ConsumerKey::TargetMember { group, .. }
            | ConsumerKey::CurrentAssignment { group, .. } => group,
        }
    }
}

fn put_string(out: &mut BytesMut, s: &str) -> Result<(), RecordFormatError> {
    let len = i16::try_from(s.len()).map_err(|_| RecordFormatError("string too long"))?;
    out.put_i16(len);
    out.put_slice(s.as_bytes());
    Ok(())
}

fn key(kind: i16, group: &str, member: Option<&str>) -> Result<Bytes, RecordFormatError> {
    let mut out = BytesMut::with_capacity(8 + group.len() + member.map_or(0, str::len));
    out.put_i16(kind);
    put_string(&mut out, group)?;
    if let Some(m) = member {
        put_string(&mut out, m)?;
    }
    Ok(out.freeze())
}

fn put_uvarint(out: &mut BytesMut, mut v: u64) {
    while v >= 0x80 {
        out.put_u8((v as u8) | 0x80);
        v >>= 7;
    }
    out.put_u8(v as u8);
}

fn put_compact_string(out: &mut BytesMut, s: &str) {
    put_uvarint(out, s.len() as u64 + 1);
    out.put_slice(s.as_bytes());
}

fn put_compact_nullable_string(out: &mut BytesMut, s: Option<&str>) {
    match s {
        Some(s) => put_compact_string(out, s),
        None => put_uvarint(out, 0),
    }
}

/// No tagged fields.
fn put_no_tags(out: &mut BytesMut) {
    put_uvarint(out, 0);
}

/// An assignment as `[]TopicPartitions` (topic id, partitions, no tags);
/// topics the image does not know are left out.
fn put_assignment(out: &mut BytesMut, a: &Assignment, image: &MetadataImage) {
    let known: Vec<(&[u8; 16], &BTreeSet<i32>)> = a
        .iter()
        .filter(|(_, ps)| !ps.is_empty())
        .filter_map(|(t, ps)| image.topic(t).map(|m| (&m.id, ps)))
        .collect();
    put_uvarint(out, known.len() as u64 + 1);
    for (id, ps) in known {
        out.put_slice(id);
        put_uvarint(out, ps.len() as u64 + 1);
        for p in ps {
            out.put_i32(*p);
        }
        put_no_tags(out);
    }
}

fn group_metadata_value(c: &ConsumerGroup) -> Bytes {
    let mut out = BytesMut::with_capacity(24);
    out.put_i16(VALUE_VERSION);
    out.put_i32(c.group_epoch);
    // One tagged field: 0 = MetadataHash (int64, 8 bytes).
    put_uvarint(&mut out, 1);
    put_uvarint(&mut out, 0);
    put_uvarint(&mut out, 8);
    out.put_i64(c.metadata_hash);
    out.freeze()
}

fn target_metadata_value(c: &ConsumerGroup) -> Bytes {
    let mut out = BytesMut::with_capacity(8);
    out.put_i16(VALUE_VERSION);
    out.put_i32(c.assignment_epoch);
    put_no_tags(&mut out);
    out.freeze()
}

fn member_metadata_value(m: &ConsumerMember) -> Bytes {
    let mut out = BytesMut::with_capacity(64);
    out.put_i16(VALUE_VERSION);
    put_compact_nullable_string(&mut out, m.instance_id.as_deref());
    put_compact_nullable_string(&mut out, m.rack_id.as_deref());
    put_compact_string(&mut out, &m.client_id);
    put_compact_string(&mut out, &m.client_host);
    put_uvarint(&mut out, m.subscribed_topic_names.len() as u64 + 1);
    for t in &m.subscribed_topic_names {
        put_compact_string(&mut out, t);
    }
    put_compact_nullable_string(&mut out, m.subscribed_topic_regex.as_deref());
    out.put_i32(m.rebalance_timeout_ms);
    put_compact_nullable_string(&mut out, m.server_assignor.as_deref());
    match &m.classic {
        None => put_no_tags(&mut out),
        Some(c) => {
            // Tag 0: ClassicMemberMetadata, a nullable struct (a leading
            // 1 byte for present): SessionTimeoutMs, then
            // SupportedProtocols as a compact array of (Name, Metadata).
            let mut v = BytesMut::new();
            v.put_i8(1);
            v.put_i32(c.session_timeout_ms);
            put_uvarint(&mut v, c.protocols.len() as u64 + 1);
            for (name, metadata) in &c.protocols {
                put_compact_string(&mut v, name);
                put_uvarint(&mut v, metadata.len() as u64 + 1);
                v.put_slice(metadata);
                put_no_tags(&mut v);
            }
            put_no_tags(&mut v);
            put_uvarint(&mut out, 1);
            put_uvarint(&mut out, 0);
            put_uvarint(&mut out, v.len() as u64);
            out.put_slice(&v);
        }
    }
    out.freeze()
}

/// Decodes the ClassicMemberMetadata tagged field (None: null).
fn classic_member_metadata(
    bytes: &[u8],
) -> Result<Option<ClassicMemberMetadata>, RecordFormatError> {
    let mut r = Reader::new(bytes);
    if r.i8()? < 0 {
        return Ok(None);
    }
    let session_timeout_ms = r.i32()?;
    let mut protocols = Vec::new();
    for _ in 0..r.compact_array_len(RECORD_ARRAY_LEN_MAX)?.unwrap_or(0) {
        let name = r.compact_string()?;
        let len = r.compact_array_len(RECORD_ARRAY_LEN_MAX)?.unwrap_or(0);
        let metadata = Bytes::copy_from_slice(r.take(len)?);
        r.skip_tags()?;
        protocols.push((name, metadata));
    }
    r.skip_tags()?;
    Ok(Some(ClassicMemberMetadata {
        session_timeout_ms,
        protocols,
    }))
}

fn target_member_value(a: &Assignment, image: &MetadataImage) -> Bytes {
    let mut out = BytesMut::with_capacity(32);
    out.put_i16(VALUE_VERSION);
    put_assignment(&mut out, a, image);
    put_no_tags(&mut out);
    out.freeze()
}

fn state_byte(s: MemberState) -> i8 {
    match s {
        MemberState::Stable => 0,
        MemberState::UnrevokedPartitions => 1,
        MemberState::UnreleasedPartitions => 2,
    }
}

fn current_assignment_value(m: &ConsumerMember, image: &MetadataImage) -> Bytes {
    let mut out = BytesMut::with_capacity(32);
    out.put_i16(VALUE_VERSION);
    out.put_i32(m.member_epoch);
    out.put_i32(m.previous_member_epoch);
    out.put_i8(state_byte(m.state));
    put_assignment(&mut out, &m.assigned, image);
    put_assignment(&mut out, &m.pending_revocation, image);
    put_no_tags(&mut out);
    out.freeze()
}

/// Every record of the group's live state (for a compaction rewrite).
pub fn all_records(
    group: &str,
    c: &ConsumerGroup,
    image: &MetadataImage,
) -> Result<Vec<(Bytes, Option<Bytes>)>, RecordFormatError> {
    let mut out = Vec::new();
    for m in c.members.values() {
        member_records(group, c, m, image, &mut out)?;
    }
    group_records(group, c, &mut out)?;
    Ok(out)
}

fn group_records(
    group: &str,
    c: &ConsumerGroup,
    out: &mut Vec<(Bytes, Option<Bytes>)>,
) -> Result<(), RecordFormatError> {
    out.push((
        key(CONSUMER_GROUP_METADATA_KEY, group, None)?,
        Some(group_metadata_value(c)),
    ));
    out.push((
        key(CONSUMER_GROUP_TARGET_METADATA_KEY, group, None)?,
        Some(target_metadata_value(c)),
    ));
    Ok(())
}

fn member_records(
    group: &str,
    c: &ConsumerGroup,
    m: &ConsumerMember,
    image: &MetadataImage,
    out: &mut Vec<(Bytes, Option<Bytes>)>,
) -> Result<(), RecordFormatError> {
    let id = Some(m.member_id.as_str());
    let empty = Assignment::new();
    out.push((
        key(CONSUMER_GROUP_MEMBER_METADATA_KEY, group, id)?,
        Some(member_metadata_value(m)),
    ));
    out.push((
        key(CONSUMER_GROUP_TARGET_MEMBER_KEY, group, id)?,
        Some(target_member_value(
            c.target.get(&m.member_id).unwrap_or(&empty),
            image,
        )),
    ));
    out.push((
        key(CONSUMER_GROUP_CURRENT_ASSIGNMENT_KEY, group, id)?,
        Some(current_assignment_value(m, image)),
    ));
    Ok(())
}

/// The records of what changed since the last call (members first, then
/// the group's epochs, as Kafka orders them), and clears the marks.
pub fn take_dirty_records(
    group: &str,
    c: &mut ConsumerGroup,
    image: &MetadataImage,
) -> Result<Vec<(Bytes, Option<Bytes>)>, RecordFormatError> {
    let mut out = Vec::new();
    for id in &c.changed_members {
        match c.members.get(id) {
            Some(m) => member_records(group, c, m, image, &mut out)?,
            None => {
                for kind in [
                    CONSUMER_GROUP_CURRENT_ASSIGNMENT_KEY,
                    CONSUMER_GROUP_TARGET_MEMBER_KEY,
                    CONSUMER_GROUP_MEMBER_METADATA_KEY,
                ] {
                    out.push((key(kind, group, Some(id))?, None));
                }
            }
        }
    }
    if c.dirty {
        group_records(group, c, &mut out)?;
    }
    c.changed_members.clear();
    c.dirty = false;
    Ok(out)
}

/// Tombstones of one member's three records.
pub fn member_tombstones(
    group: &str,
    member: &str,
) -> Result<Vec<(Bytes, Option<Bytes>)>, RecordFormatError> {
    [
        CONSUMER_GROUP_CURRENT_ASSIGNMENT_KEY,
        CONSUMER_GROUP_TARGET_MEMBER_KEY,
        CONSUMER_GROUP_MEMBER_METADATA_KEY,
    ]
    .into_iter()
    .map(|kind| Ok((key(kind, group, Some(member))?, None)))
    .collect()
}

/// Tombstones of a consumer group without members (deleted, expired, or
/// converted to a classic group).
pub fn group_tombstones(group: &str) -> Result<Vec<(Bytes, Option<Bytes>)>, RecordFormatError> {
    Ok(vec![
        (key(CONSUMER_GROUP_TARGET_METADATA_KEY, group, None)?, None),
        (key(CONSUMER_GROUP_METADATA_KEY, group, None)?, None),
    ])
}

type Reader<'a> = Cursor<'a, RecordFormatError>;

/// A value's version, which must be the one this module writes.
fn value_version(r: &mut Reader) -> Result<(), RecordFormatError> {
    if r.i16()? != VALUE_VERSION {
        return Err(RecordFormatError("unknown consumer group value version"));
    }
    Ok(())
}

/// `[]TopicPartitions` mapped to topic names (unknown ids dropped).
fn assignment(r: &mut Reader, image: &MetadataImage) -> Result<Assignment, RecordFormatError> {
    let mut out = Assignment::new();
    for _ in 0..r.compact_array_len(RECORD_ARRAY_LEN_MAX)?.unwrap_or(0) {
        let mut id = [0u8; 16];
        id.copy_from_slice(r.take(16)?);
        let mut ps = BTreeSet::new();
        for _ in 0..r.compact_array_len(RECORD_ARRAY_LEN_MAX)?.unwrap_or(0) {
            ps.insert(r.i32()?);
        }
        r.skip_tags()?;
        if let Some(t) = image.topic_by_id(&id) {
            if !ps.is_empty() {
                out.insert(t.name.clone(), ps);
            }
        }
    }
    Ok(out)
}

/// Parses a consumer-group record key (its type is checked by the caller
/// with [`is_consumer_key_version`]).
pub fn parse_key(key: &[u8]) -> Result<ConsumerKey, RecordFormatError> {
    let mut r = Reader::new(key);
    let kind = r.i16()?;
    let group = r.string()?;
    Ok(match kind {
        CONSUMER_GROUP_METADATA_KEY => ConsumerKey::GroupMetadata { group },
        CONSUMER_GROUP_PARTITION_METADATA_KEY => ConsumerKey::PartitionMetadata { group },
        CONSUMER_GROUP_TARGET_METADATA_KEY => ConsumerKey::TargetMetadata { group },
        CONSUMER_GROUP_MEMBER_METADATA_KEY => ConsumerKey::MemberMetadata {
            group,
            member: r.string()?,
        },
        CONSUMER_GROUP_TARGET_MEMBER_KEY => ConsumerKey::TargetMember {
            group,
            member: r.string()?,
        },
        CONSUMER_GROUP_CURRENT_ASSIGNMENT_KEY => ConsumerKey::CurrentAssignment {
            group,
            member: r.string()?,
        },
        _ => return Err(RecordFormatError("not a consumer group record key")),
    })
}

/// Applies one consumer-group record (`value` None = tombstone) to the
/// group's consumer state, creating it if needed. Returns false when the
/// group's consumer state must be dropped (its metadata tombstone).
pub fn apply(
    c: &mut ConsumerGroup,
    key: &ConsumerKey,
    value: Option<&[u8]>,
    image: &MetadataImage,
    now_ms: i64,
) -> Result<bool, RecordFormatError> {
    match (key, value) {
        (ConsumerKey::GroupMetadata { .. }, None) => return Ok(false),
        (ConsumerKey::GroupMetadata { .. }, Some(v)) => {
            let mut r = Reader::new(v);
            value_version(&mut r)?;
            c.group_epoch = r.i32()?;
            let mut hash = 0;
            r.tags(|tag, bytes| {
                if tag == 0 && bytes.len() == 8 {
                    let mut a = [0u8; 8];
                    a.copy_from_slice(bytes);
                    hash = i64::from_be_bytes(a);
                }
            })?;
            c.metadata_hash = hash;
        }
        (ConsumerKey::PartitionMetadata { .. }, _) => {}
        (ConsumerKey::TargetMetadata { .. }, None) => c.assignment_epoch = 0,
        (ConsumerKey::TargetMetadata { .. }, Some(v)) => {
            let mut r = Reader::new(v);
            value_version(&mut r)?;
            c.assignment_epoch = r.i32()?;
        }
        (ConsumerKey::MemberMetadata { member, .. }, None) => {
            c.members.remove(member);
        }
        (ConsumerKey::MemberMetadata { member, .. }, Some(v)) => {
            let mut r = Reader::new(v);
            value_version(&mut r)?;
            let instance_id = r.compact_nullable_string()?;
            let rack_id = r.compact_nullable_string()?;
            let client_id = r.compact_string()?;
            let client_host = r.compact_string()?;
            let mut names = Vec::new();
            for _ in 0..r.compact_array_len(RECORD_ARRAY_LEN_MAX)?.unwrap_or(0) {
                names.push(r.compact_string()?);
            }
            let regex = r.compact_nullable_string()?;
            let rebalance_timeout_ms = r.i32()?;
            let assignor = r.compact_nullable_string()?;
            let mut classic = Ok(None);
            r.tags(|tag, bytes| {
                if tag == 0 {
                    classic = classic_member_metadata(bytes);
                }
            })?;
            let classic = classic?;
            let m = c
                .members
                .entry(member.clone())
                .or_insert_with(|| ConsumerMember::new(member, now_ms));
            m.instance_id = instance_id;
            m.rack_id = rack_id;
            m.client_id = client_id;
            m.client_host = client_host;
            m.subscribed_topic_names = names;
            m.subscribed_topic_regex = regex;
            m.rebalance_timeout_ms = rebalance_timeout_ms;
            m.server_assignor = assignor;
            m.classic = classic;
        }
        (ConsumerKey::TargetMember { member, .. }, None) => {
            c.target.remove(member);
        }
        (ConsumerKey::TargetMember { member, .. }, Some(v)) => {
            let mut r = Reader::new(v);
            value_version(&mut r)?;
            let a = assignment(&mut r, image)?;
            c.target.insert(member.clone(), a);
        }
        (ConsumerKey::CurrentAssignment { member, .. }, None) => {
            if let Some(m) = c.members.get_mut(member) {
                m.assigned.clear();
                m.pending_revocation.clear();
            }
        }
        (ConsumerKey::CurrentAssignment { member, .. }, Some(v)) => {
            let mut r = Reader::new(v);
            value_version(&mut r)?;
            let epoch = r.i32()?;
            let previous = r.i32()?;
            let state = match r.i8()? {
                0 => MemberState::Stable,
                1 => MemberState::UnrevokedPartitions,
                2 => MemberState::UnreleasedPartitions,
                _ => return Err(RecordFormatError("unknown member state")),
            };
            let assigned = assignment(&mut r, image)?;
            let revoking = assignment(&mut r, image)?;
            let m = c
                .members
                .entry(member.clone())
                .or_insert_with(|| ConsumerMember::new(member, now_ms));
            m.member_epoch = epoch;
            m.previous_member_epoch = previous;
            m.state = state;
            m.assigned = assigned;
            m.pending_revocation = revoking;
        }
    }
    Ok(true)
}

/// After a replay: drops targets of members that are gone, restarts
/// every member's session and rebuilds the indexes.
pub fn finish_replay(c: &mut ConsumerGroup, now_ms: i64) {
    let members = &c.members;
    c.target.retain(|id, _| members.contains_key(id));
    for m in c.members.values_mut() {
        m.last_heartbeat_ms = now_ms;
        m.revocation_deadline_ms = None;
        m.reset_assignment_epochs();
        if m.state == MemberState::UnrevokedPartitions {
            m.revocation_deadline_ms = Some(now_ms + i64::from(m.rebalance_timeout_ms.max(0)));
        }
    }
    c.rebuild_owners();
    c.dirty = false;
    c.changed_members.clear();
}

/// One line describing a consumer-group record, for `fjord dump-log`.
pub fn describe(key: &ConsumerKey, value: Option<&[u8]>) -> String {
    let what = match key {
        ConsumerKey::GroupMetadata { group } => format!("ConsumerGroupMetadata group={group}"),
        ConsumerKey::PartitionMetadata { group } => {
            format!("ConsumerGroupPartitionMetadata group={group}")
        }
        ConsumerKey::MemberMetadata { group, member } => {
            let classic = value
                .filter(|v| {
                    let mut c = ConsumerGroup::new();
                    apply(&mut c, key, Some(v), &MetadataImage::default(), 0).is_ok()
                        && c.members.get(member).is_some_and(|m| m.classic.is_some())
                })
                .map_or("", |_| " classic-protocol");
            format!("ConsumerGroupMemberMetadata group={group} member={member}{classic}")
        }
        ConsumerKey::TargetMetadata { group } => {
            format!("ConsumerGroupTargetAssignmentMetadata group={group}")
        }
        ConsumerKey::TargetMember { group, member } => {
            format!("ConsumerGroupTargetAssignmentMember group={group} member={member}")
        }
        ConsumerKey::CurrentAssignment { group, member } => {
            format!("ConsumerGroupCurrentMemberAssignment group={group} member={member}")
        }
    };
    match value {
        None => format!("{what} (tombstone)"),
        Some(v) => format!("{what} ({} value bytes)", v.len()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::group::consumer::{ConsumerGroupConfig, ConsumerGroupState, HeartbeatRequest};
    use crate::metadata::{MetadataImage, MetadataRecord};

    fn image_with(topic: &str, partitions: usize) -> MetadataImage {
        MetadataImage::default().apply(&MetadataRecord::CreateTopic {
            name: topic.into(),
            id: crate::metadata::new_topic_id(),
            shards: vec![0; partitions],
            configs: Default::default(),
            node: None,
            replicated: Vec::new(),
        })
    }

    fn join(member: &str) -> HeartbeatRequest {
        HeartbeatRequest {
            member_id: member.into(),
            member_epoch: 0,
            rebalance_timeout_ms: 30_000,
            subscribed_topic_names: Some(vec!["t".into()]),
            owned: Some(Assignment::new()),
            ..HeartbeatRequest::default()
        }
    }

    fn beat(member: &str, epoch: i32, owned: Assignment) -> HeartbeatRequest {
        HeartbeatRequest {
            member_id: member.into(),
            member_epoch: epoch,
            rebalance_timeout_ms: -1,
            owned: Some(owned),
            ..HeartbeatRequest::default()
        }
    }

    /// A restart while a member still has to revoke: the replayed group
    /// carries on from the same epochs and reaches a disjoint, complete
    /// assignment.
    #[test]
    fn a_restart_during_a_rebalance_converges() {
        let image = image_with("t", 4);
        let cfg = ConsumerGroupConfig::default();
        let mut c = ConsumerGroup::new();
        let mut log = Vec::new();
        let a = c.heartbeat(join("a"), &cfg, &image, 0).unwrap();
        log.extend(take_dirty_records("g", &mut c, &image).unwrap());
        let b = c.heartbeat(join("b"), &cfg, &image, 1).unwrap();
        log.extend(take_dirty_records("g", &mut c, &image).unwrap());
        let r = c
            .heartbeat(
                beat("a", a.member_epoch, a.assignment.clone().unwrap()),
                &cfg,
                &image,
                2,
            )
            .unwrap();
        assert_eq!(c.members["a"].state, MemberState::UnrevokedPartitions);
        log.extend(take_dirty_records("g", &mut c, &image).unwrap());

        let mut back = ConsumerGroup::new();
        for (k, v) in &log {
            let key = parse_key(k).unwrap();
            assert!(apply(&mut back, &key, v.as_deref(), &image, 10).unwrap());
        }
        finish_replay(&mut back, 10);
        back.check_invariants();
        assert_eq!(back.members["a"].state, MemberState::UnrevokedPartitions);
        assert_eq!(back.group_epoch, c.group_epoch);

        let mut held_a = (r.member_epoch, r.assignment.unwrap());
        let mut held_b = (b.member_epoch, b.assignment.unwrap());
        for now in 11..20 {
            let ra = back
                .heartbeat(beat("a", held_a.0, held_a.1.clone()), &cfg, &image, now)
                .unwrap();
            held_a = (ra.member_epoch, ra.assignment.unwrap_or(held_a.1));
            let rb = back
                .heartbeat(beat("b", held_b.0, held_b.1.clone()), &cfg, &image, now)
                .unwrap();
            held_b = (rb.member_epoch, rb.assignment.unwrap_or(held_b.1));
            back.check_invariants();
        }
        assert_eq!(
            back.group_epoch, c.group_epoch,
            "no rebalance for the restart"
        );
        assert_eq!(back.state(), ConsumerGroupState::Stable);
        assert_eq!(held_a.1["t"].len() + held_b.1["t"].len(), 4);
        assert!(held_a.1["t"].is_disjoint(&held_b.1["t"]));
    }

    #[test]
    fn a_group_round_trips_through_its_records() {
        let image = image_with("t", 4);
        let cfg = ConsumerGroupConfig::default();
        let mut c = ConsumerGroup::new();
        let req = HeartbeatRequest {
            member_id: "m1".into(),
            member_epoch: 0,
            instance_id: Some("i1".into()),
            rack_id: Some("r".into()),
            rebalance_timeout_ms: 30_000,
            subscribed_topic_names: Some(vec!["t".into()]),
            subscribed_topic_regex: Some("x.*".into()),
            owned: Some(Assignment::new()),
            client_id: "c".into(),
            client_host: "/127.0.0.1".into(),
            ..HeartbeatRequest::default()
        };
        let answer = c.heartbeat(req, &cfg, &image, 0).unwrap();
        assert_eq!(answer.assignment.unwrap()["t"].len(), 4);
        let recs = take_dirty_records("g", &mut c, &image).unwrap();
        assert!(!c.needs_write());
        let mut back = ConsumerGroup::new();
        for (k, v) in &recs {
            let key = parse_key(k).unwrap();
            assert_eq!(key.group(), "g");
            assert!(apply(&mut back, &key, v.as_deref(), &image, 5).unwrap());
        }
        finish_replay(&mut back, 5);
        assert_eq!(back.group_epoch, c.group_epoch);
        assert_eq!(back.assignment_epoch, c.assignment_epoch);
        assert_eq!(back.metadata_hash, c.metadata_hash);
        assert_eq!(back.target, c.target);
        let (a, b) = (&c.members["m1"], &back.members["m1"]);
        assert_eq!(b.member_epoch, a.member_epoch);
        assert_eq!(b.assigned, a.assigned);
        assert_eq!(b.instance_id, a.instance_id);
        assert_eq!(b.subscribed_topic_regex, a.subscribed_topic_regex);
        back.check_invariants();
    }

    /// A classic member of a mixed group keeps its ClassicMemberMetadata
    /// (session timeout, protocols) through its records.
    #[test]
    fn a_classic_member_round_trips_through_its_records() {
        use crate::group::consumer::ClassicMemberMetadata;
        let image = image_with("t", 4);
        let cfg = ConsumerGroupConfig::default();
        let mut c = ConsumerGroup::new();
        c.heartbeat(join("m1"), &cfg, &image, 0).unwrap();
        let classic = ClassicMemberMetadata {
            session_timeout_ms: 12_345,
            protocols: vec![
                ("range".into(), Bytes::from_static(&[0, 3, 0, 0, 0, 0])),
                ("roundrobin".into(), Bytes::new()),
            ],
        };
        c.members.get_mut("m1").unwrap().classic = Some(classic.clone());
        let mut back = ConsumerGroup::new();
        for (k, v) in all_records("g", &c, &image).unwrap() {
            let key = parse_key(&k).unwrap();
            assert!(apply(&mut back, &key, v.as_deref(), &image, 5).unwrap());
        }
        finish_replay(&mut back, 5);
        assert_eq!(back.members["m1"].classic, Some(classic));
        // Every prefix of the value is an error, not a panic.
        let v = member_metadata_value(&c.members["m1"]);
        let key = ConsumerKey::MemberMetadata {
            group: "g".into(),
            member: "m1".into(),
        };
        for n in 0..v.len() {
            let _ = apply(&mut ConsumerGroup::new(), &key, Some(&v[..n]), &image, 0);
        }
    }

    #[test]
    fn truncated_values_are_errors_not_panics() {
        let image = MetadataImage::default();
        let key = ConsumerKey::CurrentAssignment {
            group: "g".into(),
            member: "m".into(),
        };
        let mut c = ConsumerGroup::new();
        for v in [
            &[][..],
            &[0, 0, 0][..],
            &[0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 200][..],
        ] {
            assert!(apply(&mut c, &key, Some(v), &image, 0).is_err());
        }
    }
}
