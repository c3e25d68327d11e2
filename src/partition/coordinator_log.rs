//! How a coordinator writes the state it keeps in an internal partition
//! (`__consumer_offsets` for the group coordinator, `__transaction_state`
//! for the transaction coordinator): as Kafka's coordinators do, an append
//! is made only by the partition's leader, and is answered only once it is
//! acknowledged as an `acks=all` produce would be: written (durable under
//! `--fsync-acks`) and, for a replicated partition, below the high
//! watermark, so a coordinator that takes over after a failover
//! (`docs/replication.md` §4.6) replays every write that was answered.
//!
//! The coordinators sit beside `replication` and cannot reach the shard's
//! leader states; the shard implements this for them.

use super::Partition;
use crate::log::PartitionLog;
use crate::types::{Offset, TopicPartition};
use futures::future::LocalBoxFuture;
use std::rc::Rc;

/// Why a coordinator's write was not made or not acknowledged. The
/// coordinators answer NOT_COORDINATOR for [`Self::NotLeader`] and
/// COORDINATOR_NOT_AVAILABLE for the others, as Kafka maps its append
/// errors (a client then looks the coordinator up again and retries).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CoordinatorWriteError {
    #[error("this broker does not lead the partition")]
    NotLeader,
    #[error("the partition's ISR is below min.insync.replicas")]
    NotEnoughReplicas,
    #[error("the write was not replicated in time")]
    TimedOut,
    #[error("{0}")]
    Storage(String),
}

/// The shard's side of a coordinator's writes.
pub trait CoordinatorLog {
    /// Whether this shard may act as `tp`'s leader, its coordinator
    /// included, now: it leads `tp` in its image and, on a cluster, its
    /// node's lease holds (`metadata::lease`). A coordinator answers
    /// NOT_COORDINATOR otherwise, from state it may still hold.
    fn leads(&self, tp: &TopicPartition) -> bool;

    /// The partition, if this shard may append to it now: it leads it
    /// and, replicated, its ISR holds `min.insync.replicas`. Checked right
    /// before the append, with no await in between.
    fn writable(&self, tp: &TopicPartition) -> Result<Rc<Partition>, CoordinatorWriteError>;

    /// Resolves once the batch of `tp` ending at `last` is acknowledged
    /// as an `acks=all` produce is, or with why it is not (leadership
    /// lost, the ISR below the minimum, not replicated within
    /// [`COORDINATOR_WRITE_TIMEOUT_MS`], the log failed).
    fn acked<'a>(
        &'a self,
        tp: &'a TopicPartition,
        log: &'a Rc<PartitionLog>,
        last: Offset,
    ) -> LocalBoxFuture<'a, Result<(), CoordinatorWriteError>>;
}

/// How long a coordinator's write waits to be replicated: Kafka's
/// `offsets.commit.timeout.ms` default.
pub const COORDINATOR_WRITE_TIMEOUT_MS: u64 = 5_000;
