//! Newtypes for the identifiers and offsets that flow through every layer.
//!
//! Offsets of different meaning (log start, high watermark, last stable
//! offset, log end) are distinct types so that one can never be passed where
//! another is meant; converting between them is always an explicit call.

use std::fmt;

/// The leader epoch of every partition on a broker's first start. Each
/// later start of the broker begins a new epoch (`metadata`'s
/// `MetadataRecord::LeaderEpoch`): a restart is when a single node
/// re-establishes the leadership of all its partitions, as a Kafka broker's
/// re-registration makes the controller elect it leader again with a higher
/// epoch. The current epoch is stamped as `partitionLeaderEpoch` in every
/// batch the log appends, recorded in the `leader-epoch-checkpoint`,
/// reported by Metadata, Produce, Fetch and ListOffsets, and checked against
/// `current_leader_epoch` (FENCED_LEADER_EPOCH below it,
/// UNKNOWN_LEADER_EPOCH above it).
pub const FIRST_LEADER_EPOCH: i32 = 0;

macro_rules! newtype {
    ($(#[$m:meta])* $name:ident($inner:ty)) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
        pub struct $name(pub $inner);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }
    };
}

newtype!(
    /// An absolute offset of a record in a partition.
    Offset(i64)
);
newtype!(
    /// The first offset still present in a partition (moves with retention).
    LogStartOffset(i64)
);
newtype!(
    /// The offset one past the last record consumers may read (read_uncommitted).
    HighWatermark(i64)
);
newtype!(
    /// The first offset of the oldest open transaction, or the high watermark.
    LastStableOffset(i64)
);
newtype!(
    /// The offset the next appended record will get.
    LogEndOffset(i64)
);
newtype!(
    /// A producer id handed out by InitProducerId (-1 = not idempotent).
    ProducerId(i64)
);
newtype!(
    /// A producer epoch (-1 = none).
    ProducerEpoch(i16)
);
newtype!(
    /// A producer sequence number.
    Sequence(i32)
);
newtype!(
    /// The index of a shard (one glommio executor pinned to one core).
    ShardId(usize)
);
newtype!(
    /// A Kafka node id as advertised to clients (`node_id * 1000 + shard`).
    NodeId(i32)
);
newtype!(
    /// A partition index within a topic.
    PartitionId(i32)
);

impl Offset {
    pub const NONE: Offset = Offset(-1);
}

impl ProducerId {
    pub const NONE: ProducerId = ProducerId(-1);
    pub fn is_idempotent(self) -> bool {
        self.0 >= 0
    }
}

/// A topic and partition, the key of every partition-scoped structure.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TopicPartition {
    pub topic: String,
    pub partition: PartitionId,
}

impl TopicPartition {
    pub fn new(topic: impl Into<String>, partition: i32) -> Self {
        TopicPartition {
            topic: topic.into(),
            partition: PartitionId(partition),
        }
    }

    /// The directory name Kafka uses for this partition: `<topic>-<partition>`.
    pub fn dir_name(&self) -> String {
        format!("{}-{}", self.topic, self.partition.0)
    }
}

/// A topic and partition as a map key, owned ([`TopicPartition`]) or
/// borrowed (`(&str, PartitionId)`), so that a
/// `HashMap<TopicPartition, _>` can be searched without allocating the
/// topic: `map.get(&(topic, partition) as &dyn TopicPartitionKey)`. Hashes
/// and compares exactly as `TopicPartition`'s derived `Hash` and `Eq` do.
pub trait TopicPartitionKey {
    fn topic(&self) -> &str;
    fn partition(&self) -> PartitionId;
}

impl TopicPartitionKey for TopicPartition {
    fn topic(&self) -> &str {
        &self.topic
    }
    fn partition(&self) -> PartitionId {
        self.partition
    }
}

impl TopicPartitionKey for (&str, PartitionId) {
    fn topic(&self) -> &str {
        self.0
    }
    fn partition(&self) -> PartitionId {
        self.1
    }
}

impl<'a> std::borrow::Borrow<dyn TopicPartitionKey + 'a> for TopicPartition {
    fn borrow(&self) -> &(dyn TopicPartitionKey + 'a) {
        self
    }
}

impl std::hash::Hash for dyn TopicPartitionKey + '_ {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        // The field order and types of `TopicPartition`'s derived Hash.
        self.topic().hash(state);
        self.partition().hash(state);
    }
}

impl PartialEq for dyn TopicPartitionKey + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.topic() == other.topic() && self.partition() == other.partition()
    }
}

impl Eq for dyn TopicPartitionKey + '_ {}

impl fmt::Display for TopicPartition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.topic, self.partition.0)
    }
}

/// Base64 (URL alphabet, no padding), as Kafka prints cluster ids and
/// topic ids.
pub fn base64url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::with_capacity(bytes.len() * 4 / 3 + 2);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | (b as u32) << (16 - 8 * i));
        let chars = chunk.len() + 1;
        for i in 0..chars {
            out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}

/// The bytes of a [`base64url`] string; `None` if it is not one.
pub fn base64url_decode(text: &str) -> Option<Vec<u8>> {
    let value = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'-' => 62,
            b'_' => 63,
            _ => return None,
        } as u32)
    };
    if text.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    for chunk in text.as_bytes().chunks(4) {
        let mut n = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            n |= value(c)? << (18 - 6 * i);
        }
        for i in 0..chunk.len() - 1 {
            out.push((n >> (16 - 8 * i)) as u8);
        }
    }
    // Canonical only: the unused low bits of the last character are zero.
    (base64url(&out) == text).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::{base64url, base64url_decode, PartitionId, TopicPartition, TopicPartitionKey};

    #[test]
    fn a_borrowed_key_finds_what_the_owned_key_stored() {
        let mut map = std::collections::HashMap::new();
        for topic in ["a", "orders", "orders-1", ""] {
            for p in 0..3 {
                map.insert(TopicPartition::new(topic, p), (topic, p));
            }
        }
        for topic in ["a", "orders", "orders-1", ""] {
            for p in 0..3 {
                let key = (topic, PartitionId(p));
                assert_eq!(map.get(&key as &dyn TopicPartitionKey), Some(&(topic, p)));
            }
        }
        let missing = ("orders", PartitionId(3));
        assert_eq!(map.get(&missing as &dyn TopicPartitionKey), None);
        let missing = ("order", PartitionId(0));
        assert_eq!(map.get(&missing as &dyn TopicPartitionKey), None);
    }

    #[test]
    fn base64url_matches_rfc4648() {
        assert_eq!(base64url(b"f"), "Zg");
        assert_eq!(base64url(b"fo"), "Zm8");
        assert_eq!(base64url(b"foo"), "Zm9v");
        assert_eq!(base64url(&[0xfb, 0xff]), "-_8");
        assert_eq!(base64url(&[0u8; 16]).len(), 22);
    }

    #[test]
    fn base64url_decodes_what_it_encodes_and_nothing_else() {
        for len in 0..20 {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 37 + 11) as u8).collect();
            assert_eq!(base64url_decode(&base64url(&bytes)), Some(bytes));
        }
        assert_eq!(base64url_decode("Zg=="), None);
        assert_eq!(base64url_decode("Zh"), None); // non-canonical last character
        assert_eq!(base64url_decode("Z"), None);
    }
}
