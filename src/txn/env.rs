//! What the transaction coordinator needs from the shard it runs on, and
//! nothing more: the coordinator is handed this environment (as the group
//! coordinator is handed its partitions) instead of reaching into the
//! shard, so `txn` sits below `shard` and imports nothing from it. The
//! shard implements it (`shard::txn_env`); a test can implement it with
//! partitions of its own.

use super::coordinator::TxnCoordinator;
use crate::config::BrokerConfig;
use crate::metadata::MetadataImage;
use crate::partition::coordinator_log::CoordinatorLog;
use crate::partition::{MarkerError, Partition, TxnMarker};
use crate::types::TopicPartition;
use std::rc::Rc;
use std::sync::Arc;

/// The transaction coordinator's view of its shard; its writes go through
/// [`CoordinatorLog`] (only the leader appends, acknowledged as acks=all).
#[allow(async_fn_in_trait)] // used with concrete types only, on one thread
pub trait TxnEnv: CoordinatorLog + 'static {
    /// The coordinator of this shard (owned by the environment).
    fn coordinator(&self) -> &TxnCoordinator;

    /// The broker's settings (`--fsync-acks`, expirations, debug hooks).
    fn config(&self) -> &BrokerConfig;

    /// The current metadata image.
    fn image(&self) -> Arc<MetadataImage>;

    /// The partition if this shard leads it and has opened it.
    fn partition(&self, tp: &TopicPartition) -> Option<Rc<Partition>>;

    /// A producer id from this shard's block (None while the next block is
    /// being fetched); asks for the next block when this one runs low.
    fn allocate_producer_id(self: &Rc<Self>) -> Option<i64>;

    /// Creates `__transaction_state` if it does not exist yet.
    async fn ensure_transaction_topic(self: &Rc<Self>) -> Result<(), ()>;

    /// Delivers markers to the shards that lead their partitions and waits
    /// for each to be written; one outcome per marker.
    async fn send_markers(
        self: &Rc<Self>,
        markers: Vec<TxnMarker>,
    ) -> Vec<(TxnMarker, Result<(), MarkerError>)>;
}
