//! The shard as the transaction coordinator's environment
//! ([`crate::txn::env::TxnEnv`]): its partitions, its producer-id block,
//! the controller (to create `__transaction_state`) and the delivery of
//! markers to the shards that lead their partitions.

use super::messages::ShardMessage;
use super::router::CallError;
use super::ShardCtx;
use crate::config::BrokerConfig;
use crate::metadata::{internal, MetadataImage};
use crate::partition::{MarkerError, Partition, TxnMarker};
use crate::txn::coordinator::TxnCoordinator;
use crate::txn::env::TxnEnv;
use crate::types::TopicPartition;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;

impl TxnEnv for ShardCtx {
    fn coordinator(&self) -> &TxnCoordinator {
        &self.txn
    }

    fn config(&self) -> &BrokerConfig {
        &self.config
    }

    fn image(&self) -> Arc<MetadataImage> {
        ShardCtx::image(self)
    }

    fn partition(&self, tp: &TopicPartition) -> Option<Rc<Partition>> {
        self.led_partition(tp)
    }

    fn allocate_producer_id(self: &Rc<Self>) -> Option<i64> {
        self.maybe_request_producer_ids();
        self.producer_ids.take()
    }

    async fn ensure_transaction_topic(self: &Rc<Self>) -> Result<(), ()> {
        self.ensure_internal_topic(internal::TRANSACTION_STATE)
            .await
            .map(|_| ())
            .map_err(|_| ())
    }

    /// Local markers directly, remote shards' concurrently over the router,
    /// all until one deadline (see `router`): a marker that timed out is
    /// `TimedOut`, and the coordinator sends it again; one the slow shard
    /// writes after all is then refused as stale or written twice, both
    /// harmless.
    async fn send_markers(
        self: &Rc<Self>,
        markers: Vec<TxnMarker>,
    ) -> Vec<(TxnMarker, Result<(), MarkerError>)> {
        let image = ShardCtx::image(self);
        let mut by_shard: BTreeMap<usize, Vec<TxnMarker>> = BTreeMap::new();
        let mut out = Vec::new();
        for m in markers {
            match image.leader_shard(&m.tp.topic, m.tp.partition.0, self.cores()) {
                Some(shard) => by_shard.entry(shard).or_default().push(m),
                None => out.push((m, Err(MarkerError::UnknownPartition))),
            }
        }
        let deadline = self.router.deadline();
        let writes = by_shard.into_iter().map(|(shard, batch)| async move {
            let call = self.router.invoke(
                shard,
                deadline,
                batch.clone(),
                |markers| self.write_txn_markers(markers),
                |markers, reply| ShardMessage::WriteTxnMarkers { markers, reply },
            );
            match call.await {
                Ok(results) => results,
                Err(e) => {
                    let e = match e {
                        CallError::TimedOut(_) => {
                            tracing::warn!(
                                shard,
                                "transaction markers timed out at another shard; retrying"
                            );
                            MarkerError::TimedOut
                        }
                        CallError::Unreachable(_) => MarkerError::Unreachable,
                    };
                    batch.into_iter().map(|m| (m, Err(e))).collect()
                }
            }
        });
        out.extend(
            futures::future::join_all(writes)
                .await
                .into_iter()
                .flatten(),
        );
        out
    }
}
