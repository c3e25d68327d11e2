//! The embedded consumer protocol of classic groups (protocol type
//! `consumer`): Kafka's `ConsumerProtocolSubscription` (JoinGroup member
//! metadata) and `ConsumerProtocolAssignment` (SyncGroup assignment), the
//! non-flexible encodings versions 0-3 with a leading i16 version.
//!
//! Why the broker reads them: a classic group is otherwise opaque to the
//! coordinator (its leader assigns on the client), but a classic member
//! inside a KIP-848 consumer group (a mixed group, during an online
//! upgrade) is assigned by the broker. The coordinator then needs the
//! member's subscribed topics, the partitions it still owns and its rack
//! from the JoinGroup metadata, and it answers SyncGroup with the target
//! assignment encoded as the client expects. Converting a classic group
//! into a consumer group decodes every member's current assignment.
//!
//! Pure functions over byte slices; malformed input is an error value
//! ([`ProtocolFormatError`]), never a panic. Arrays are bounded by the
//! input's length (each element takes at least one byte).
//!
//! | field | versions |
//! |---|---|
//! | Subscription: Topics []string, UserData nullable bytes | 0+ |
//! | Subscription: OwnedPartitions [](Topic, []int32) | 1+ |
//! | Subscription: GenerationId int32 | 2+ |
//! | Subscription: RackId nullable string | 3+ |
//! | Assignment: AssignedPartitions [](Topic, []int32), UserData | 0+ |

use super::consumer::Assignment;
use super::cursor::Cursor;
use bytes::{BufMut, Bytes, BytesMut};

/// The highest version of both messages Kafka 4.x knows; a newer version
/// is read as this one (Kafka's rule: later versions only add fields).
pub const CONSUMER_PROTOCOL_VERSION_MAX: i16 = 3;

/// Malformed embedded consumer-protocol bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProtocolFormatError(pub &'static str);

/// A decoded ConsumerProtocolSubscription.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Subscription {
    pub version: i16,
    pub topics: Vec<String>,
    /// None before version 1 (the member does not say what it owns).
    pub owned: Option<Assignment>,
    pub rack_id: Option<String>,
}

impl From<&'static str> for ProtocolFormatError {
    fn from(what: &'static str) -> Self {
        ProtocolFormatError(what)
    }
}

type Reader<'a> = Cursor<'a, ProtocolFormatError>;

/// `[]TopicPartition` (name, partitions), empty topics dropped.
fn topic_partitions(r: &mut Reader) -> Result<Assignment, ProtocolFormatError> {
    let mut out = Assignment::new();
    for _ in 0..r.array_len(6)? {
        let topic = r.string()?;
        let ps = out.entry(topic).or_default();
        for _ in 0..r.array_len(4)? {
            ps.insert(r.i32()?);
        }
    }
    out.retain(|_, ps| !ps.is_empty());
    Ok(out)
}

/// The version of an embedded subscription or assignment (its first two
/// bytes), clamped to what this module writes.
pub fn version(bytes: &[u8]) -> Result<i16, ProtocolFormatError> {
    let v = Reader::new(bytes).i16()?;
    if v < 0 {
        return Err(ProtocolFormatError("negative version"));
    }
    Ok(v.min(CONSUMER_PROTOCOL_VERSION_MAX))
}

/// Decodes a ConsumerProtocolSubscription.
pub fn decode_subscription(bytes: &[u8]) -> Result<Subscription, ProtocolFormatError> {
    let v = version(bytes)?;
    let mut r = Reader::new(&bytes[2..]);
    let mut topics = Vec::new();
    for _ in 0..r.array_len(2)? {
        topics.push(r.string()?);
    }
    r.nullable_bytes()?; // user data, not kept
    let mut sub = Subscription {
        version: v,
        topics,
        owned: None,
        rack_id: None,
    };
    if v >= 1 {
        sub.owned = Some(topic_partitions(&mut r)?);
    }
    if v >= 2 {
        r.i32()?;
    }
    if v >= 3 {
        sub.rack_id = r.nullable_string()?;
    }
    Ok(sub)
}

/// Decodes a ConsumerProtocolAssignment; empty bytes (a member that has
/// no assignment yet) are an empty assignment.
pub fn decode_assignment(bytes: &[u8]) -> Result<Assignment, ProtocolFormatError> {
    if bytes.is_empty() {
        return Ok(Assignment::new());
    }
    version(bytes)?;
    topic_partitions(&mut Reader::new(&bytes[2..]))
}

fn put_string(out: &mut BytesMut, s: &str) {
    // Topic names are at most 249 bytes (validated when topics are made).
    out.put_i16(s.len() as i16);
    out.put_slice(s.as_bytes());
}

/// Encodes a ConsumerProtocolAssignment of `version` (clamped to 0-3)
/// without user data.
pub fn encode_assignment(a: &Assignment, version: i16) -> Bytes {
    let mut out = BytesMut::with_capacity(16 + a.len() * 32);
    out.put_i16(version.clamp(0, CONSUMER_PROTOCOL_VERSION_MAX));
    out.put_i32(a.len() as i32);
    for (t, ps) in a {
        put_string(&mut out, t);
        out.put_i32(ps.len() as i32);
        for p in ps {
            out.put_i32(*p);
        }
    }
    out.put_i32(-1);
    out.freeze()
}

/// Encodes a ConsumerProtocolSubscription (tests, and the unit tests of
/// the mixed-group machine).
pub fn encode_subscription(sub: &Subscription) -> Bytes {
    let v = sub.version.clamp(0, CONSUMER_PROTOCOL_VERSION_MAX);
    let mut out = BytesMut::new();
    out.put_i16(v);
    out.put_i32(sub.topics.len() as i32);
    for t in &sub.topics {
        put_string(&mut out, t);
    }
    out.put_i32(-1);
    if v >= 1 {
        let owned = sub.owned.clone().unwrap_or_default();
        out.put_i32(owned.len() as i32);
        for (t, ps) in &owned {
            put_string(&mut out, t);
            out.put_i32(ps.len() as i32);
            for p in ps {
                out.put_i32(*p);
            }
        }
    }
    if v >= 2 {
        out.put_i32(-1);
    }
    if v >= 3 {
        match &sub.rack_id {
            Some(r) => put_string(&mut out, r),
            None => out.put_i16(-1),
        }
    }
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn a(t: &str, ps: &[i32]) -> Assignment {
        let mut out = Assignment::new();
        out.insert(t.to_string(), ps.iter().copied().collect::<BTreeSet<i32>>());
        out
    }

    #[test]
    fn subscriptions_round_trip_in_every_version() {
        for v in 0..=3 {
            let sub = Subscription {
                version: v,
                topics: vec!["a".into(), "b".into()],
                owned: (v >= 1).then(|| a("a", &[0, 2])),
                rack_id: (v >= 3).then(|| "r1".to_string()),
            };
            assert_eq!(decode_subscription(&encode_subscription(&sub)), Ok(sub));
        }
    }

    #[test]
    fn assignments_round_trip_and_empty_bytes_are_empty() {
        let x = a("t", &[1, 5, 7]);
        assert_eq!(decode_assignment(&encode_assignment(&x, 3)), Ok(x));
        assert_eq!(decode_assignment(&[]), Ok(Assignment::new()));
    }

    #[test]
    fn malformed_bytes_are_errors_not_panics() {
        let sub = encode_subscription(&Subscription {
            version: 3,
            topics: vec!["topic".into()],
            owned: Some(a("topic", &[0])),
            rack_id: None,
        });
        for n in 0..sub.len() {
            assert!(decode_subscription(&sub[..n]).is_err(), "prefix {n}");
        }
        // A huge array length in few bytes.
        assert!(decode_assignment(&[0, 0, 0x7f, 0xff, 0xff, 0xff]).is_err());
        assert!(decode_subscription(&[0xff, 0xff]).is_err());
    }
}
