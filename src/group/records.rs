//! Kafka's `__consumer_offsets` record formats (the group-coordinator
//! module's `OffsetCommitKey/Value` and `GroupMetadataKey/Value` schemas),
//! encoded and decoded by hand: they are not in kafka-protocol's generated
//! messages. Every key and value starts with an i16 schema version; the
//! key's version says what the record is (0/1 offset commit, 2 group
//! metadata). A null value is a tombstone.
//!
//! fjord writes OffsetCommitValue v3 (v1 when the commit carries an expire
//! timestamp) and GroupMetadataValue v3, the non-flexible versions Kafka
//! writes; it reads v0-v3 of both. Pure functions, no shard state.
//!
//! Every string of these schemas has an i16 length, so none may be longer
//! than [`RECORD_STRING_BYTES_MAX`]. The coordinator refuses such ids where
//! they come in (JoinGroup, OffsetCommit, TxnOffsetCommit); the encoders
//! refuse them too ([`RecordFormatError`]) rather than write a length that
//! wraps, which would corrupt the record and every replay after it.

use super::cursor::Cursor;
use super::state::{CommittedOffset, Member};
use bytes::{BufMut, Bytes, BytesMut};

/// The key version of an offset commit record.
pub const OFFSET_COMMIT_KEY_VERSION: i16 = 1;
/// The key version of a group metadata record.
pub const GROUP_METADATA_KEY_VERSION: i16 = 2;
/// Longest string (in bytes) the records can hold: their lengths are i16.
pub const RECORD_STRING_BYTES_MAX: usize = i16::MAX as usize;

/// Whether `s` fits a record string.
pub fn fits(s: &str) -> bool {
    s.len() <= RECORD_STRING_BYTES_MAX
}

/// Whether a key of `version` is one of this module's records. Kafka skips
/// records of other types when it loads a partition (a left-over of an
/// aborted upgrade); it fails the load on a known record that does not
/// decode.
pub fn is_known_key_version(version: i16) -> bool {
    (0..=GROUP_METADATA_KEY_VERSION).contains(&version)
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordKey {
    OffsetCommit {
        group: String,
        topic: String,
        partition: i32,
    },
    GroupMetadata {
        group: String,
    },
}

impl RecordKey {
    pub fn group(&self) -> &str {
        match self {
            RecordKey::OffsetCommit { group, .. } | RecordKey::GroupMetadata { group } => group,
        }
    }
}

/// A group's membership as stored (GroupMetadataValue).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupMetadataValue {
    pub protocol_type: String,
    pub generation_id: i32,
    pub protocol_name: Option<String>,
    pub leader: Option<String>,
    pub current_state_timestamp_ms: i64,
    pub members: Vec<Member>,
}

/// A record that does not follow the schemas.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed __consumer_offsets record: {0}")]
pub struct RecordFormatError(pub &'static str);

fn put_string(out: &mut BytesMut, s: &str) -> Result<(), RecordFormatError> {
    let len = i16::try_from(s.len()).map_err(|_| RecordFormatError("string too long"))?;
    out.put_i16(len);
    out.put_slice(s.as_bytes());
    Ok(())
}

fn put_nullable_string(out: &mut BytesMut, s: Option<&str>) -> Result<(), RecordFormatError> {
    match s {
        Some(s) => put_string(out, s),
        None => {
            out.put_i16(-1);
            Ok(())
        }
    }
}

fn put_bytes(out: &mut BytesMut, b: &[u8]) {
    out.put_i32(b.len() as i32);
    out.put_slice(b);
}

pub fn offset_commit_key(
    group: &str,
    topic: &str,
    partition: i32,
) -> Result<Bytes, RecordFormatError> {
    let mut out = BytesMut::with_capacity(2 + 2 + group.len() + 2 + topic.len() + 4);
    out.put_i16(OFFSET_COMMIT_KEY_VERSION);
    put_string(&mut out, group)?;
    put_string(&mut out, topic)?;
    out.put_i32(partition);
    Ok(out.freeze())
}

pub fn group_metadata_key(group: &str) -> Result<Bytes, RecordFormatError> {
    let mut out = BytesMut::with_capacity(4 + group.len());
    out.put_i16(GROUP_METADATA_KEY_VERSION);
    put_string(&mut out, group)?;
    Ok(out.freeze())
}

pub fn offset_commit_value(o: &CommittedOffset) -> Result<Bytes, RecordFormatError> {
    let mut out = BytesMut::with_capacity(32 + o.metadata.len());
    match o.expire_timestamp_ms {
        Some(expire) => {
            out.put_i16(1);
            out.put_i64(o.offset);
            put_string(&mut out, &o.metadata)?;
            out.put_i64(o.commit_timestamp_ms);
            out.put_i64(expire);
        }
        None => {
            out.put_i16(3);
            out.put_i64(o.offset);
            out.put_i32(o.leader_epoch);
            put_string(&mut out, &o.metadata)?;
            out.put_i64(o.commit_timestamp_ms);
        }
    }
    Ok(out.freeze())
}

pub fn group_metadata_value(v: &GroupMetadataValue) -> Result<Bytes, RecordFormatError> {
    let mut out = BytesMut::with_capacity(128);
    out.put_i16(3);
    put_string(&mut out, &v.protocol_type)?;
    out.put_i32(v.generation_id);
    put_nullable_string(&mut out, v.protocol_name.as_deref())?;
    put_nullable_string(&mut out, v.leader.as_deref())?;
    out.put_i64(v.current_state_timestamp_ms);
    out.put_i32(v.members.len() as i32);
    for m in &v.members {
        put_string(&mut out, &m.member_id)?;
        put_nullable_string(&mut out, m.group_instance_id.as_deref())?;
        put_string(&mut out, &m.client_id)?;
        put_string(&mut out, &m.client_host)?;
        out.put_i32(m.rebalance_timeout_ms);
        out.put_i32(m.session_timeout_ms);
        let protocol = v.protocol_name.as_deref().unwrap_or_default();
        let subscription = m
            .protocols
            .iter()
            .find(|(n, _)| n == protocol)
            .map(|(_, b)| b.clone())
            .unwrap_or_default();
        put_bytes(&mut out, &subscription);
        put_bytes(&mut out, &m.assignment);
    }
    Ok(out.freeze())
}

/// A cursor over a record's bytes.
type Reader<'a> = Cursor<'a, RecordFormatError>;

impl From<&'static str> for RecordFormatError {
    fn from(what: &'static str) -> Self {
        RecordFormatError(what)
    }
}

/// i32-length bytes, a null (negative length) read as empty.
fn bytes_or_empty(r: &mut Reader) -> Result<Bytes, RecordFormatError> {
    Ok(Bytes::copy_from_slice(
        r.nullable_bytes()?.unwrap_or_default(),
    ))
}

pub fn parse_key(key: &[u8]) -> Result<RecordKey, RecordFormatError> {
    let mut r = Reader::new(key);
    match r.i16()? {
        0 | 1 => Ok(RecordKey::OffsetCommit {
            group: r.string()?,
            topic: r.string()?,
            partition: r.i32()?,
        }),
        2 => Ok(RecordKey::GroupMetadata { group: r.string()? }),
        _ => Err(RecordFormatError("unknown key version")),
    }
}

pub fn parse_offset_commit_value(value: &[u8]) -> Result<CommittedOffset, RecordFormatError> {
    let mut r = Reader::new(value);
    let version = r.i16()?;
    let offset = r.i64()?;
    let leader_epoch = if version >= 3 { r.i32()? } else { -1 };
    let metadata = r.string()?;
    let commit_timestamp_ms = r.i64()?;
    let expire_timestamp_ms = if version == 1 { Some(r.i64()?) } else { None };
    if version > 3 {
        return Err(RecordFormatError("unsupported OffsetCommitValue version"));
    }
    Ok(CommittedOffset {
        offset,
        leader_epoch,
        metadata,
        commit_timestamp_ms,
        expire_timestamp_ms,
    })
}

pub fn parse_group_metadata_value(value: &[u8]) -> Result<GroupMetadataValue, RecordFormatError> {
    let mut r = Reader::new(value);
    let version = r.i16()?;
    if version > 3 {
        return Err(RecordFormatError("unsupported GroupMetadataValue version"));
    }
    let protocol_type = r.string()?;
    let generation_id = r.i32()?;
    let protocol_name = r.nullable_string()?;
    let leader = r.nullable_string()?;
    let current_state_timestamp_ms = if version >= 2 { r.i64()? } else { -1 };
    let count = r.i32()?;
    let mut members = Vec::new();
    for _ in 0..count.max(0) {
        let member_id = r.string()?;
        let group_instance_id = if version >= 3 {
            r.nullable_string()?
        } else {
            None
        };
        let client_id = r.string()?;
        let client_host = r.string()?;
        let session_or_rebalance = r.i32()?;
        let (rebalance_timeout_ms, session_timeout_ms) = if version >= 1 {
            (session_or_rebalance, r.i32()?)
        } else {
            (session_or_rebalance, session_or_rebalance)
        };
        let subscription = bytes_or_empty(&mut r)?;
        let assignment = bytes_or_empty(&mut r)?;
        members.push(Member {
            member_id,
            group_instance_id,
            client_id,
            client_host,
            rebalance_timeout_ms,
            session_timeout_ms,
            protocols: protocol_name
                .clone()
                .map(|p| vec![(p, subscription)])
                .unwrap_or_default(),
            assignment,
            awaiting_join: false,
            awaiting_sync: false,
            last_heartbeat_ms: 0,
        });
    }
    Ok(GroupMetadataValue {
        protocol_type,
        generation_id,
        protocol_name,
        leader,
        current_state_timestamp_ms,
        members,
    })
}

/// One record as `kafka-dump-log.sh --offsets-decoder` prints it:
/// `key: ... payload: ...` (Kafka prints JSON of the schema fields).
pub fn describe(key: Option<&[u8]>, value: Option<&[u8]>) -> String {
    let Some(key) = key else {
        return "key: null payload: null".to_string();
    };
    let version = key.get(..2).map(|v| i16::from_be_bytes([v[0], v[1]]));
    if version.is_some_and(super::consumer_records::is_consumer_key_version) {
        return match super::consumer_records::parse_key(key) {
            Ok(k) => format!("key: {}", super::consumer_records::describe(&k, value)),
            Err(e) => format!("key: <{e}> payload: <not decoded>"),
        };
    }
    let parsed = match parse_key(key) {
        Ok(k) => k,
        Err(e) => return format!("key: <{e}> payload: <not decoded>"),
    };
    match parsed {
        RecordKey::OffsetCommit {
            group,
            topic,
            partition,
        } => {
            let k = format!(
                "{{\"type\":\"1\",\"data\":{{\"group\":\"{group}\",\"topic\":\"{topic}\",\"partition\":{partition}}}}}"
            );
            let v = match value.map(parse_offset_commit_value) {
                None => "<DELETE>".to_string(),
                Some(Err(e)) => format!("<{e}>"),
                Some(Ok(o)) => format!(
                    "{{\"offset\":{},\"leaderEpoch\":{},\"metadata\":\"{}\",\"commitTimestamp\":{}{}}}",
                    o.offset,
                    o.leader_epoch,
                    o.metadata,
                    o.commit_timestamp_ms,
                    o.expire_timestamp_ms
                        .map(|t| format!(",\"expireTimestamp\":{t}"))
                        .unwrap_or_default()
                ),
            };
            format!("key: {k} payload: {v}")
        }
        RecordKey::GroupMetadata { group } => {
            let k = format!("{{\"type\":\"2\",\"data\":{{\"group\":\"{group}\"}}}}");
            let v = match value.map(parse_group_metadata_value) {
                None => "<DELETE>".to_string(),
                Some(Err(e)) => format!("<{e}>"),
                Some(Ok(g)) => {
                    let members: Vec<String> = g
                        .members
                        .iter()
                        .map(|m| {
                            format!(
                                "{{\"memberId\":\"{}\",\"groupInstanceId\":{},\"clientId\":\"{}\",\"clientHost\":\"{}\",\"rebalanceTimeout\":{},\"sessionTimeout\":{},\"subscription\":{},\"assignment\":{}}}",
                                m.member_id,
                                json_opt(m.group_instance_id.as_deref()),
                                m.client_id,
                                m.client_host,
                                m.rebalance_timeout_ms,
                                m.session_timeout_ms,
                                m.protocols.first().map_or(0, |(_, b)| b.len()),
                                m.assignment.len()
                            )
                        })
                        .collect();
                    format!(
                        "{{\"protocolType\":\"{}\",\"generation\":{},\"protocol\":{},\"leader\":{},\"currentStateTimestamp\":{},\"members\":[{}]}}",
                        g.protocol_type,
                        g.generation_id,
                        json_opt(g.protocol_name.as_deref()),
                        json_opt(g.leader.as_deref()),
                        g.current_state_timestamp_ms,
                        members.join(",")
                    )
                }
            };
            format!("key: {k} payload: {v}")
        }
    }
}

fn json_opt(s: Option<&str>) -> String {
    s.map_or("null".to_string(), |s| format!("\"{s}\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offset_commit_round_trips_in_v3_and_v1() {
        let key = offset_commit_key("g", "t", 3).unwrap();
        assert_eq!(&key[..2], &[0, 1]);
        assert_eq!(
            parse_key(&key).unwrap(),
            RecordKey::OffsetCommit {
                group: "g".into(),
                topic: "t".into(),
                partition: 3
            }
        );
        let mut o = CommittedOffset {
            offset: 42,
            leader_epoch: 7,
            metadata: "m".into(),
            commit_timestamp_ms: 1000,
            expire_timestamp_ms: None,
        };
        let v = offset_commit_value(&o).unwrap();
        // version 3: i16 + i64 + i32 + (i16 + 1) + i64
        assert_eq!(v.len(), 2 + 8 + 4 + 3 + 8);
        assert_eq!(parse_offset_commit_value(&v).unwrap(), o);
        o.expire_timestamp_ms = Some(5000);
        o.leader_epoch = -1;
        let v = offset_commit_value(&o).unwrap();
        assert_eq!(&v[..2], &[0, 1]);
        assert_eq!(parse_offset_commit_value(&v).unwrap(), o);
    }

    #[test]
    fn group_metadata_round_trips() {
        let key = group_metadata_key("grp").unwrap();
        assert_eq!(
            parse_key(&key).unwrap(),
            RecordKey::GroupMetadata {
                group: "grp".into()
            }
        );
        let v = GroupMetadataValue {
            protocol_type: "consumer".into(),
            generation_id: 4,
            protocol_name: Some("range".into()),
            leader: Some("m1".into()),
            current_state_timestamp_ms: 99,
            members: vec![Member {
                member_id: "m1".into(),
                group_instance_id: Some("i1".into()),
                client_id: "c".into(),
                client_host: "/127.0.0.1".into(),
                rebalance_timeout_ms: 300_000,
                session_timeout_ms: 45_000,
                protocols: vec![("range".into(), Bytes::from_static(b"sub"))],
                assignment: Bytes::from_static(b"asg"),
                awaiting_join: false,
                awaiting_sync: false,
                last_heartbeat_ms: 0,
            }],
        };
        let bytes = group_metadata_value(&v).unwrap();
        assert_eq!(parse_group_metadata_value(&bytes).unwrap(), v);
        let text = describe(Some(&key), Some(&bytes));
        assert!(text.contains("\"generation\":4") && text.contains("\"memberId\":\"m1\""));
        assert!(describe(Some(&key), None).ends_with("payload: <DELETE>"));
    }

    #[test]
    fn truncated_records_are_errors_not_panics() {
        let key = offset_commit_key("g", "t", 3).unwrap();
        for n in 0..key.len() {
            assert!(parse_key(&key[..n]).is_err());
        }
        assert!(parse_offset_commit_value(&[0, 3, 1]).is_err());
        assert!(parse_group_metadata_value(&[0, 3]).is_err());
    }

    #[test]
    fn strings_longer_than_an_i16_length_are_refused_not_wrapped() {
        let fits_exactly = "g".repeat(RECORD_STRING_BYTES_MAX);
        let too_long = "g".repeat(RECORD_STRING_BYTES_MAX + 1);
        assert!(fits(&fits_exactly) && !fits(&too_long));
        let key = group_metadata_key(&fits_exactly).unwrap();
        assert_eq!(
            parse_key(&key).unwrap(),
            RecordKey::GroupMetadata {
                group: fits_exactly.clone()
            }
        );
        assert!(group_metadata_key(&too_long).is_err());
        assert!(offset_commit_key(&too_long, "t", 0).is_err());
        let mut v = GroupMetadataValue {
            protocol_type: "consumer".into(),
            generation_id: 1,
            protocol_name: Some("range".into()),
            leader: Some(too_long.clone()),
            current_state_timestamp_ms: 0,
            members: Vec::new(),
        };
        assert!(group_metadata_value(&v).is_err());
        v.leader = None;
        v.protocol_type = too_long;
        assert!(group_metadata_value(&v).is_err());
    }
}
