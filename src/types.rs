//! Newtypes for the identifiers and offsets that flow through every layer.
//!
//! Offsets of different meaning (log start, high watermark, last stable
//! offset, log end) are distinct types so that one can never be passed where
//! another is meant; converting between them is always an explicit call.

use std::fmt;

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

impl fmt::Display for TopicPartition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.topic, self.partition.0)
    }
}
