//! fjord's own encoding of the raft-rs messages the metadata quorum sends
//! between nodes and of the entries and states it keeps on disk.
//!
//! raft-rs's types are protobuf messages (`eraftpb`), and its default codec
//! is `protobuf` 2.x, which recurses without a bound on crafted input
//! (RUSTSEC-2024-0437). Nothing read from the network or the disk goes
//! through it: this module writes the fields fjord uses in a fixed order,
//! big-endian, and reads them back with [`Reader`], which bounds every
//! count and length by the bytes left, so a truncated or hostile frame is an
//! error and never a panic, a recursion or an allocation beyond the frame.
//!
//! Layouts (all integers big-endian; `bytes` = i32 length + bytes):
//! - entry: type i8, term u64, index u64, data bytes, context bytes
//! - hard state: term u64, vote u64, commit u64
//! - conf state: voters, learners, voters_outgoing, learners_next (each an
//!   i32 count of u64), auto_leave i8
//! - snapshot: data bytes, conf state, index u64, term u64
//! - message: version i8 (= [`MESSAGE_VERSION`]), type i8, to, from, term,
//!   log_term, index u64, entries (i32 count of entry), commit, commit_term
//!   u64, snapshot flag i8 (+ snapshot), request_snapshot u64, reject i8,
//!   reject_hint u64, context bytes, priority i64
//!
//! One protobuf message is read here by hand: a membership change's entry
//! data is raft-rs's `ConfChangeV2` encoded by raft-rs itself
//! (`RawNode::propose_conf_change`, on the leader), and every member must
//! read it back when the entry commits. [`conf_change`] reads exactly that
//! fixed, flat schema (no nesting beyond its one repeated field, no
//! recursion, every length bounded by the bytes left) and refuses
//! anything else.

use crate::protocol::wire::Reader;
use crate::protocol::ProtocolError;
use bytes::{BufMut, Bytes, BytesMut};
use raft::eraftpb::{ConfState, Entry, EntryType, HardState, Message, MessageType, Snapshot};

/// The message layout's version, first byte of every message.
pub const MESSAGE_VERSION: i8 = 0;

/// Fewest bytes an encoded entry takes (type, term, index, two lengths).
const ENTRY_BYTES_MIN: usize = 1 + 8 + 8 + 4 + 4;

fn put_bytes(out: &mut BytesMut, b: &[u8]) {
    out.put_i32(b.len() as i32);
    out.put_slice(b);
}

fn put_u64s(out: &mut BytesMut, v: &[u64]) {
    out.put_i32(v.len() as i32);
    for x in v {
        out.put_u64(*x);
    }
}

fn u64(r: &mut Reader, field: &'static str) -> Result<u64, ProtocolError> {
    Ok(r.i64(field)? as u64)
}

fn bytes(r: &mut Reader, field: &'static str) -> Result<Bytes, ProtocolError> {
    let n = r.i32(field)?;
    let n = usize::try_from(n).map_err(|_| ProtocolError::InvalidLength {
        field,
        len: n.into(),
    })?;
    Ok(Bytes::copy_from_slice(r.take(n, field)?))
}

fn u64s(r: &mut Reader, field: &'static str) -> Result<Vec<u64>, ProtocolError> {
    let n = r.array_len(false, 8, field)?.unwrap_or(0);
    (0..n).map(|_| u64(r, field)).collect()
}

fn flag(r: &mut Reader, field: &'static str) -> Result<bool, ProtocolError> {
    match r.i8(field)? {
        0 => Ok(false),
        1 => Ok(true),
        v => Err(ProtocolError::InvalidLength {
            field,
            len: v.into(),
        }),
    }
}

pub fn put_entry(out: &mut BytesMut, e: &Entry) {
    out.put_i8(e.get_entry_type() as i8);
    out.put_u64(e.term);
    out.put_u64(e.index);
    put_bytes(out, &e.data);
    put_bytes(out, &e.context);
}

pub fn entry(r: &mut Reader) -> Result<Entry, ProtocolError> {
    let entry_type = match r.i8("entry type")? {
        0 => EntryType::EntryNormal,
        1 => EntryType::EntryConfChange,
        2 => EntryType::EntryConfChangeV2,
        v => {
            return Err(ProtocolError::InvalidLength {
                field: "entry type",
                len: v.into(),
            })
        }
    };
    let mut e = Entry::default();
    e.set_entry_type(entry_type);
    e.term = u64(r, "entry term")?;
    e.index = u64(r, "entry index")?;
    e.data = bytes(r, "entry data")?;
    e.context = bytes(r, "entry context")?;
    Ok(e)
}

/// A count of entries followed by them.
pub fn entries(r: &mut Reader) -> Result<Vec<Entry>, ProtocolError> {
    let n = r.array_len(false, ENTRY_BYTES_MIN, "entries")?.unwrap_or(0);
    (0..n).map(|_| entry(r)).collect()
}

pub fn put_entries(out: &mut BytesMut, es: &[Entry]) {
    out.put_i32(es.len() as i32);
    for e in es {
        put_entry(out, e);
    }
}

pub fn put_hard_state(out: &mut BytesMut, hs: &HardState) {
    out.put_u64(hs.term);
    out.put_u64(hs.vote);
    out.put_u64(hs.commit);
}

pub fn hard_state(r: &mut Reader) -> Result<HardState, ProtocolError> {
    Ok(HardState {
        term: u64(r, "hard state term")?,
        vote: u64(r, "hard state vote")?,
        commit: u64(r, "hard state commit")?,
        ..Default::default()
    })
}

pub fn put_conf_state(out: &mut BytesMut, cs: &ConfState) {
    put_u64s(out, &cs.voters);
    put_u64s(out, &cs.learners);
    put_u64s(out, &cs.voters_outgoing);
    put_u64s(out, &cs.learners_next);
    out.put_i8(cs.auto_leave as i8);
}

pub fn conf_state(r: &mut Reader) -> Result<ConfState, ProtocolError> {
    Ok(ConfState {
        voters: u64s(r, "voters")?,
        learners: u64s(r, "learners")?,
        voters_outgoing: u64s(r, "voters outgoing")?,
        learners_next: u64s(r, "learners next")?,
        auto_leave: flag(r, "auto leave")?,
        ..Default::default()
    })
}

fn put_snapshot(out: &mut BytesMut, s: &Snapshot) {
    put_bytes(out, &s.data);
    let m = s.get_metadata();
    put_conf_state(out, m.get_conf_state());
    out.put_u64(m.index);
    out.put_u64(m.term);
}

fn snapshot(r: &mut Reader) -> Result<Snapshot, ProtocolError> {
    let mut s = Snapshot {
        data: bytes(r, "snapshot data")?,
        ..Default::default()
    };
    let m = s.mut_metadata();
    m.set_conf_state(conf_state(r)?);
    m.index = u64(r, "snapshot index")?;
    m.term = u64(r, "snapshot term")?;
    Ok(s)
}

fn message_type(v: i8) -> Option<MessageType> {
    use MessageType::*;
    Some(match v {
        0 => MsgHup,
        1 => MsgBeat,
        2 => MsgPropose,
        3 => MsgAppend,
        4 => MsgAppendResponse,
        5 => MsgRequestVote,
        6 => MsgRequestVoteResponse,
        7 => MsgSnapshot,
        8 => MsgHeartbeat,
        9 => MsgHeartbeatResponse,
        10 => MsgUnreachable,
        11 => MsgSnapStatus,
        12 => MsgCheckQuorum,
        13 => MsgTransferLeader,
        14 => MsgTimeoutNow,
        15 => MsgReadIndex,
        16 => MsgReadIndexResp,
        17 => MsgRequestPreVote,
        18 => MsgRequestPreVoteResponse,
        _ => return None,
    })
}

/// A membership change as committed: raft-rs's `ConfChangeV2` fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfChange {
    /// `ConfChangeTransition` (0: auto).
    pub transition: u64,
    /// (`ConfChangeType`, node id): 0 add a voter, 1 remove, 2 add a learner.
    pub changes: Vec<(u64, u64)>,
    pub context: Vec<u8>,
}

/// `ConfChangeType::RemoveNode`.
pub const REMOVE_NODE: u64 = 1;
/// `ConfChangeType::AddLearnerNode`.
pub const ADD_LEARNER_NODE: u64 = 2;

/// Why a protobuf `ConfChangeV2` did not decode.
fn bad_conf_change(field: &'static str) -> ProtocolError {
    ProtocolError::InvalidLength { field, len: -1 }
}

/// One protobuf varint (at most 10 bytes).
fn varint(b: &mut &[u8]) -> Result<u64, ProtocolError> {
    let mut v = 0u64;
    for i in 0..10 {
        let (&byte, rest) = b
            .split_first()
            .ok_or_else(|| bad_conf_change("conf change varint"))?;
        *b = rest;
        v |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(bad_conf_change("conf change varint"))
}

/// One length-delimited protobuf field's bytes.
fn delimited<'a>(b: &mut &'a [u8]) -> Result<&'a [u8], ProtocolError> {
    let n = varint(b)?;
    let n = usize::try_from(n)
        .ok()
        .filter(|&n| n <= b.len())
        .ok_or_else(|| bad_conf_change("conf change length"))?;
    let (head, rest) = b.split_at(n);
    *b = rest;
    Ok(head)
}

/// Reads raft-rs's protobuf `ConfChangeV2` (`transition` = 1, varint;
/// `changes` = 2, each a `ConfChangeSingle` of `change_type` = 1 and
/// `node_id` = 2, varints; `context` = 3, bytes). Any other field or wire
/// type is an error (raft-rs writes none).
pub fn conf_change(data: &[u8]) -> Result<ConfChange, ProtocolError> {
    let mut b = data;
    let mut cc = ConfChange {
        transition: 0,
        changes: Vec::new(),
        context: Vec::new(),
    };
    while !b.is_empty() {
        match varint(&mut b)? {
            // field 1, varint
            0x08 => cc.transition = varint(&mut b)?,
            // field 2, length-delimited
            0x12 => {
                let mut single = delimited(&mut b)?;
                let (mut kind, mut id) = (0, 0);
                while !single.is_empty() {
                    match varint(&mut single)? {
                        0x08 => kind = varint(&mut single)?,
                        0x10 => id = varint(&mut single)?,
                        _ => return Err(bad_conf_change("conf change single field")),
                    }
                }
                cc.changes.push((kind, id));
            }
            // field 3, length-delimited
            0x1a => cc.context = delimited(&mut b)?.to_vec(),
            _ => return Err(bad_conf_change("conf change field")),
        }
    }
    Ok(cc)
}

/// Encodes a message for the controller listener.
pub fn encode_message(m: &Message) -> BytesMut {
    let mut out = BytesMut::with_capacity(
        128 + m
            .entries
            .iter()
            .map(|e| ENTRY_BYTES_MIN + e.data.len() + e.context.len())
            .sum::<usize>(),
    );
    out.put_i8(MESSAGE_VERSION);
    out.put_i8(m.get_msg_type() as i8);
    for v in [m.to, m.from, m.term, m.log_term, m.index] {
        out.put_u64(v);
    }
    put_entries(&mut out, &m.entries);
    out.put_u64(m.commit);
    out.put_u64(m.commit_term);
    if m.has_snapshot() {
        out.put_i8(1);
        put_snapshot(&mut out, m.get_snapshot());
    } else {
        out.put_i8(0);
    }
    out.put_u64(m.request_snapshot);
    out.put_i8(m.reject as i8);
    out.put_u64(m.reject_hint);
    put_bytes(&mut out, &m.context);
    out.put_i64(m.priority);
    out
}

/// Decodes a message; every byte of `frame` must belong to it.
pub fn decode_message(frame: &[u8]) -> Result<Message, ProtocolError> {
    let mut r = Reader::new(frame);
    let version = r.i8("message version")?;
    if version != MESSAGE_VERSION {
        return Err(ProtocolError::InvalidLength {
            field: "message version",
            len: version.into(),
        });
    }
    let t = r.i8("message type")?;
    let msg_type = message_type(t).ok_or(ProtocolError::InvalidLength {
        field: "message type",
        len: t.into(),
    })?;
    let mut m = Message::default();
    m.set_msg_type(msg_type);
    m.to = u64(&mut r, "to")?;
    m.from = u64(&mut r, "from")?;
    m.term = u64(&mut r, "term")?;
    m.log_term = u64(&mut r, "log term")?;
    m.index = u64(&mut r, "index")?;
    m.set_entries(entries(&mut r)?.into());
    m.commit = u64(&mut r, "commit")?;
    m.commit_term = u64(&mut r, "commit term")?;
    if flag(&mut r, "has snapshot")? {
        m.set_snapshot(snapshot(&mut r)?);
    }
    m.request_snapshot = u64(&mut r, "request snapshot")?;
    m.reject = flag(&mut r, "reject")?;
    m.reject_hint = u64(&mut r, "reject hint")?;
    m.context = bytes(&mut r, "context")?;
    m.priority = r.i64("priority")?;
    if r.remaining() != 0 {
        return Err(ProtocolError::InvalidLength {
            field: "bytes after the message",
            len: r.remaining() as i64,
        });
    }
    Ok(m)
}

#[cfg(test)]
#[allow(clippy::field_reassign_with_default)] // protobuf structs
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Message {
        let mut m = Message::default();
        m.set_msg_type(MessageType::MsgAppend);
        m.to = 2;
        m.from = 1;
        m.term = 7;
        m.log_term = 6;
        m.index = 41;
        let mut e = Entry::default();
        e.term = 7;
        e.index = 42;
        e.data = Bytes::from_static(b"{\"type\":\"DeleteTopic\",\"name\":\"t\"}");
        m.set_entries(vec![e].into());
        m.commit = 40;
        m.commit_term = 6;
        m.reject_hint = 3;
        m.context = Bytes::from_static(b"ctx");
        m.priority = -1;
        m
    }

    #[test]
    fn a_message_survives_its_encoding() {
        let m = sample();
        assert_eq!(decode_message(&encode_message(&m)).unwrap(), m);
        let mut s = Message::default();
        s.set_msg_type(MessageType::MsgSnapshot);
        let snap = s.mut_snapshot();
        snap.data = Bytes::from_static(b"image");
        snap.mut_metadata().index = 9;
        snap.mut_metadata().term = 2;
        snap.mut_metadata().mut_conf_state().voters = vec![1, 2, 3];
        snap.mut_metadata().mut_conf_state().learners = vec![4];
        assert_eq!(decode_message(&encode_message(&s)).unwrap(), s);
    }

    #[test]
    fn every_truncation_and_a_trailing_byte_are_errors() {
        let bytes = encode_message(&sample());
        for n in 0..bytes.len() {
            assert!(decode_message(&bytes[..n]).is_err(), "prefix of {n} bytes");
        }
        let mut longer = bytes.to_vec();
        longer.push(0);
        assert!(decode_message(&longer).is_err());
    }

    /// The bytes protobuf gives a learner's addition (raft-rs's own encoder
    /// writes them in the simulation's join test) read back; truncations
    /// and other fields are errors.
    #[test]
    fn a_conf_change_as_protobuf_writes_it_reads_back() {
        let mut bytes = vec![0x12, 0x05, 0x08, 0x02, 0x10, 0xac, 0x02, 0x1a, 13];
        bytes.extend_from_slice(b"10.0.0.4:9093");
        let got = conf_change(&bytes).unwrap();
        assert_eq!(
            got,
            ConfChange {
                transition: 0,
                changes: vec![(ADD_LEARNER_NODE, 300)],
                context: b"10.0.0.4:9093".to_vec(),
            }
        );
        for n in 1..bytes.len() {
            // A prefix either fails or reads fewer fields, never panics.
            if let Ok(short) = conf_change(&bytes[..n]) {
                assert_ne!(short, got, "prefix of {n}");
            }
        }
        // A removal (raft-rs writes no context when it is empty).
        let removal = [0x12, 0x05, 0x08, 0x01, 0x10, 0xac, 0x02];
        assert_eq!(
            conf_change(&removal).unwrap(),
            ConfChange {
                transition: 0,
                changes: vec![(REMOVE_NODE, 300)],
                context: Vec::new(),
            }
        );
        assert!(conf_change(&[0x20, 1]).is_err(), "field 4");
        assert!(conf_change(&[0x12, 0x7f]).is_err(), "a length past the end");
        assert!(conf_change(&[0x08; 11]).is_err());
    }

    /// A protobuf varint, as raft-rs's encoder writes it.
    fn put_varint(out: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            out.push(v as u8 | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }

    proptest! {
        /// A single addition or removal, as protobuf writes it (fields
        /// that hold 0 or nothing left out), reads back.
        #[test]
        fn a_single_change_reads_back(
            kind in 0u64..3,
            id in any::<u64>(),
            context in proptest::collection::vec(any::<u8>(), 0..300),
        ) {
            let mut single = Vec::new();
            if kind != 0 {
                single.push(0x08);
                put_varint(&mut single, kind);
            }
            if id != 0 {
                single.push(0x10);
                put_varint(&mut single, id);
            }
            let mut bytes = vec![0x12];
            put_varint(&mut bytes, single.len() as u64);
            bytes.extend_from_slice(&single);
            if !context.is_empty() {
                bytes.push(0x1a);
                put_varint(&mut bytes, context.len() as u64);
                bytes.extend_from_slice(&context);
            }
            prop_assert_eq!(
                conf_change(&bytes).unwrap(),
                ConfChange { transition: 0, changes: vec![(kind, id)], context }
            );
        }

        #[test]
        fn conf_change_garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = conf_change(&bytes);
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode_message(&bytes);
        }

        #[test]
        fn a_huge_count_is_refused_before_allocating(count in 1_000_000i32..i32::MAX) {
            let mut b = sample_prefix();
            b.put_i32(count);
            prop_assert!(decode_message(&b).is_err());
        }
    }

    /// A valid message up to its entries count.
    fn sample_prefix() -> BytesMut {
        let mut out = BytesMut::new();
        out.put_i8(MESSAGE_VERSION);
        out.put_i8(MessageType::MsgAppend as i8);
        for _ in 0..5 {
            out.put_u64(1);
        }
        out
    }
}
