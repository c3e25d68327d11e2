//! `__consumer_offsets` keys and values: the parsers on arbitrary bytes, and
//! decode(encode(x)) == x for structured offsets and group metadata
//! (`fjord::fuzzing::group_records`, `offset_commit_round_trip`,
//! `group_metadata_round_trip`).
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use bytes::Bytes;
use fjord::group::records::GroupMetadataValue;
use fjord::group::state::{CommittedOffset, Member};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Offset {
    offset: i64,
    leader_epoch: i32,
    metadata: String,
    /// Repeats `metadata` this many times, so that strings past a classic
    /// string's 32767 bytes (which the encoder must refuse) are reached.
    repeat: u8,
    commit_timestamp_ms: i64,
    expire_timestamp_ms: Option<i64>,
}

#[derive(Arbitrary, Debug)]
struct GroupMember {
    member_id: String,
    group_instance_id: Option<String>,
    client_id: String,
    client_host: String,
    rebalance_timeout_ms: i32,
    session_timeout_ms: i32,
    protocols: Vec<(String, Vec<u8>)>,
    assignment: Vec<u8>,
    awaiting_join: bool,
    awaiting_sync: bool,
    last_heartbeat_ms: i64,
}

#[derive(Arbitrary, Debug)]
struct Group {
    protocol_type: String,
    generation_id: i32,
    protocol_name: Option<String>,
    leader: Option<String>,
    current_state_timestamp_ms: i64,
    members: Vec<GroupMember>,
}

fuzz_target!(|data: &[u8]| {
    fjord::fuzzing::group_records(data);
    let mut u = Unstructured::new(data);
    if let Ok(o) = Offset::arbitrary(&mut u) {
        fjord::fuzzing::offset_commit_round_trip(&CommittedOffset {
            offset: o.offset,
            leader_epoch: o.leader_epoch,
            metadata: o.metadata.repeat(usize::from(o.repeat).max(1)),
            commit_timestamp_ms: o.commit_timestamp_ms,
            expire_timestamp_ms: o.expire_timestamp_ms,
        });
    }
    if let Ok(g) = Group::arbitrary(&mut u) {
        fjord::fuzzing::group_metadata_round_trip(&GroupMetadataValue {
            protocol_type: g.protocol_type,
            generation_id: g.generation_id,
            protocol_name: g.protocol_name,
            leader: g.leader,
            current_state_timestamp_ms: g.current_state_timestamp_ms,
            members: g
                .members
                .into_iter()
                .map(|m| Member {
                    member_id: m.member_id,
                    group_instance_id: m.group_instance_id,
                    client_id: m.client_id,
                    client_host: m.client_host,
                    rebalance_timeout_ms: m.rebalance_timeout_ms,
                    session_timeout_ms: m.session_timeout_ms,
                    protocols: m
                        .protocols
                        .into_iter()
                        .map(|(n, b)| (n, Bytes::from(b)))
                        .collect(),
                    assignment: Bytes::from(m.assignment),
                    awaiting_join: m.awaiting_join,
                    awaiting_sync: m.awaiting_sync,
                    last_heartbeat_ms: m.last_heartbeat_ms,
                })
                .collect(),
        });
    }
});
