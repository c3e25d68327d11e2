//! Kafka's internal topics and coordinator placement.
//!
//! `__consumer_offsets` holds group metadata and committed offsets;
//! `__transaction_state` holds transaction coordinator state. Each has
//! [`INTERNAL_TOPIC_PARTITIONS`] partitions, and the coordinator of a group or
//! transactional id is the leader of partition
//! `abs(javaStringHashCode(key)) % partitions` (Kafka's `Utils.abs`, which
//! maps `i32::MIN` to 0). Both topics are created on first use, as Kafka does,
//! so a broker that never sees a group does not pay for 50 partition logs.

use std::collections::BTreeMap;

pub const CONSUMER_OFFSETS: &str = "__consumer_offsets";
pub const TRANSACTION_STATE: &str = "__transaction_state";
/// Kafka's `offsets.topic.num.partitions` and
/// `transaction.state.log.num.partitions` defaults.
pub const INTERNAL_TOPIC_PARTITIONS: i32 = 50;

/// Whether `name` is one of Kafka's internal topics.
pub fn is_internal(name: &str) -> bool {
    name == CONSUMER_OFFSETS || name == TRANSACTION_STATE
}

/// Topic config overrides of an internal topic, as Kafka creates them:
/// compacted (the log cleaner bounds them by their live state), with
/// `segment_bytes` segments (`offsets.topic.segment.bytes` /
/// `transaction.state.log.segment.bytes`).
pub fn internal_topic_configs(segment_bytes: u64) -> BTreeMap<String, String> {
    [
        ("cleanup.policy", "compact".to_string()),
        ("segment.bytes", segment_bytes.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// Java's `String.hashCode`: `s[0]*31^(n-1) + … + s[n-1]` over UTF-16 code
/// units, with wrapping 32-bit arithmetic.
pub fn java_string_hash(s: &str) -> i32 {
    s.encode_utf16()
        .fold(0i32, |h, unit| h.wrapping_mul(31).wrapping_add(unit as i32))
}

/// Kafka's `Utils.abs`: `i32::MIN` maps to 0, not to itself.
pub fn kafka_abs(n: i32) -> i32 {
    if n == i32::MIN {
        0
    } else {
        n.abs()
    }
}

/// The internal-topic partition that owns `key` (a group id or a
/// transactional id).
pub fn coordinator_partition(key: &str, partitions: i32) -> i32 {
    kafka_abs(java_string_hash(key)) % partitions.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn java_hash_matches_java() {
        // Values computed with java.lang.String.hashCode.
        assert_eq!(java_string_hash(""), 0);
        assert_eq!(java_string_hash("a"), 97);
        assert_eq!(java_string_hash("hello"), 99162322);
        assert_eq!(java_string_hash("my-group"), -1_906_497_762);
        // Non-ASCII: UTF-16 units, not bytes ("é" is one unit, 0xE9).
        assert_eq!(java_string_hash("é"), 0xE9);
        // A surrogate pair counts as two units.
        assert_eq!(java_string_hash("😀"), 0xD83D * 31 + 0xDE00);
    }

    #[test]
    fn placement_uses_kafka_abs() {
        assert_eq!(kafka_abs(i32::MIN), 0);
        assert_eq!(kafka_abs(-5), 5);
        assert_eq!(coordinator_partition("hello", 50), 99162322 % 50);
        for key in ["a", "group-1", "txn-7", "é"] {
            let p = coordinator_partition(key, 50);
            assert!((0..50).contains(&p));
        }
    }
}
