//! The shard as the transaction coordinator's environment
//! ([`crate::txn::env::TxnEnv`]): its partitions, its producer-id block,
//! the controller (to create `__transaction_state`) and the delivery of
//! markers to the shards that lead their partitions.

use super::messages::ShardMessage;
use super::router::CallError;
use super::ShardCtx;
use crate::config::BrokerConfig;
use crate::metadata::{internal, LeaderAt, MetadataImage};
use crate::partition::{MarkerError, Partition, TxnMarker};
use crate::protocol::hand_versions::{WriteTxnMarkersRequestV2, WRITE_TXN_MARKERS_TV_VERSION};
use crate::replication::peers::PeerError;
use crate::txn::coordinator::TxnCoordinator;
use crate::txn::env::TxnEnv;
use crate::types::TopicPartition;
use kafka_protocol::messages::write_txn_markers_request::{
    WritableTxnMarker, WritableTxnMarkerTopic,
};
use kafka_protocol::messages::{ApiKey, ProducerId, TopicName, WriteTxnMarkersRequest};
use kafka_protocol::protocol::StrBytes;
use std::collections::{BTreeMap, HashMap};
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

    /// Each marker goes to its partition's leader
    /// ([`MetadataImage::leader_at`]): a shard of this node (directly, or
    /// over the router), or another node's broker (WriteTxnMarkers over
    /// [`crate::replication::peers`]), all concurrently and until one
    /// deadline. A marker that timed out is `TimedOut` and the coordinator
    /// sends it again; one the slow leader writes after all is then refused
    /// as stale or written twice, both harmless.
    async fn send_markers(
        self: &Rc<Self>,
        markers: Vec<TxnMarker>,
    ) -> Vec<(TxnMarker, Result<(), MarkerError>)> {
        let image = ShardCtx::image(self);
        let mut by_shard: BTreeMap<usize, Vec<TxnMarker>> = BTreeMap::new();
        let mut by_broker: BTreeMap<i32, Vec<TxnMarker>> = BTreeMap::new();
        let mut out = Vec::new();
        for m in markers {
            let at = image.leader_at(
                &m.tp.topic,
                m.tp.partition.0,
                self.config.node_id,
                self.cores(),
            );
            match at {
                LeaderAt::Local(shard) => by_shard.entry(shard).or_default().push(m),
                LeaderAt::Remote(broker) => by_broker.entry(broker).or_default().push(m),
                LeaderAt::NoLeader => out.push((m, Err(MarkerError::NotLeader))),
                LeaderAt::Unknown => out.push((m, Err(MarkerError::UnknownPartition))),
            }
        }
        let deadline = self.router.deadline();
        let local = self.write_markers_on_shards(by_shard, deadline);
        let remote =
            futures::future::join_all(by_broker.into_iter().map(|(broker, batch)| {
                self.send_markers_to_broker(&image, broker, batch, deadline)
            }));
        let (local, remote) = futures::future::join(local, remote).await;
        out.extend(local);
        out.extend(remote.into_iter().flatten());
        out
    }
}

impl ShardCtx {
    /// Writes markers on the shards of this node that lead their
    /// partitions (this one directly, others over the router), each shard's
    /// batch concurrently, until `deadline`. Each shard checks that it
    /// leads the partition (`write_txn_markers`).
    pub async fn write_markers_on_shards(
        self: &Rc<Self>,
        by_shard: BTreeMap<usize, Vec<TxnMarker>>,
        deadline: std::time::Instant,
    ) -> Vec<(TxnMarker, Result<(), MarkerError>)> {
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
        futures::future::join_all(writes)
            .await
            .into_iter()
            .flatten()
            .collect()
    }

    /// Sends markers to broker `broker` of another node in one
    /// WriteTxnMarkers (v2 where it speaks it, else v1 for markers of
    /// transaction version 1), and maps each partition's answer.
    async fn send_markers_to_broker(
        self: &Rc<Self>,
        image: &MetadataImage,
        broker: i32,
        markers: Vec<TxnMarker>,
        deadline: std::time::Instant,
    ) -> Vec<(TxnMarker, Result<(), MarkerError>)> {
        let answered = self
            .exchange_markers(image, broker, &markers, deadline)
            .await;
        match answered {
            Ok(codes) => markers
                .into_iter()
                .map(|m| {
                    let code = codes
                        .get(&(m.producer_id, m.tp.topic.clone(), m.tp.partition.0))
                        .copied();
                    // A partition the answer leaves out: asked again.
                    let outcome = code.map_or(Err(MarkerError::Unreachable), marker_outcome);
                    (m, outcome)
                })
                .collect(),
            Err(e) => {
                tracing::warn!(broker, error = %e, "transaction markers not delivered to another node; retrying");
                let e = match e {
                    PeerError::NoAddress(_) => MarkerError::NotLeader,
                    PeerError::TimedOut => MarkerError::TimedOut,
                    PeerError::Client(_) => MarkerError::Unreachable,
                };
                markers.into_iter().map(|m| (m, Err(e))).collect()
            }
        }
    }

    /// One WriteTxnMarkers exchange: the error code of each (producer id,
    /// topic, partition) the answer names.
    async fn exchange_markers(
        self: &Rc<Self>,
        image: &MetadataImage,
        broker: i32,
        markers: &[TxnMarker],
        deadline: std::time::Instant,
    ) -> Result<HashMap<(i64, String, i32), i16>, PeerError> {
        let mut conn = self.peers.checkout(image, broker, deadline).await?;
        let need = if markers.iter().any(|m| m.tv2) {
            WRITE_TXN_MARKERS_TV_VERSION
        } else {
            1
        };
        let version = conn.version(ApiKey::WriteTxnMarkers, need, WRITE_TXN_MARKERS_TV_VERSION)?;
        let (request, transaction_versions) = markers_request(markers);
        let response = if version >= WRITE_TXN_MARKERS_TV_VERSION {
            let req = WriteTxnMarkersRequestV2 {
                request,
                transaction_versions,
            };
            conn.request(version, &req, deadline).await?.0
        } else {
            conn.request(version, &request, deadline).await?
        };
        conn.release();
        let mut codes = HashMap::new();
        for m in response.markers {
            for t in m.topics {
                for p in t.partitions {
                    codes.insert(
                        (m.producer_id.0, t.name.0.to_string(), p.partition_index),
                        p.error_code,
                    );
                }
            }
        }
        Ok(codes)
    }
}

/// The WriteTxnMarkers request for `markers`: one entry per transaction
/// (producer id and epoch, result, coordinator epoch, transaction
/// version), its partitions grouped by topic; with each entry's
/// transaction version (2 or 1), for v2.
pub fn markers_request(markers: &[TxnMarker]) -> (WriteTxnMarkersRequest, Vec<i8>) {
    type Key = (i64, i16, bool, i32, bool);
    let mut grouped: BTreeMap<Key, BTreeMap<&str, Vec<i32>>> = BTreeMap::new();
    for m in markers {
        let key = (
            m.producer_id,
            m.producer_epoch,
            m.commit,
            m.coordinator_epoch,
            m.tv2,
        );
        grouped
            .entry(key)
            .or_default()
            .entry(&m.tp.topic)
            .or_default()
            .push(m.tp.partition.0);
    }
    let mut versions = Vec::with_capacity(grouped.len());
    let entries = grouped
        .into_iter()
        .map(|((pid, epoch, commit, coordinator_epoch, tv2), topics)| {
            versions.push(if tv2 { 2 } else { 1 });
            WritableTxnMarker::default()
                .with_producer_id(ProducerId(pid))
                .with_producer_epoch(epoch)
                .with_transaction_result(commit)
                .with_coordinator_epoch(coordinator_epoch)
                .with_topics(
                    topics
                        .into_iter()
                        .map(|(t, ps)| {
                            WritableTxnMarkerTopic::default()
                                .with_name(TopicName(StrBytes::from_string(t.to_owned())))
                                .with_partition_indexes(ps)
                        })
                        .collect(),
                )
        })
        .collect();
    (
        WriteTxnMarkersRequest::default().with_markers(entries),
        versions,
    )
}

/// What a partition leader's WriteTxnMarkers answer means for the
/// coordinator, as Kafka's marker channel reads it: written; retried
/// (not the leader, not enough replicas, timed out, storage trouble, an
/// unknown partition unless the coordinator's own image lost it too);
/// never retried (a stale producer epoch or a fenced coordinator: the
/// transaction was ended already).
pub fn marker_outcome(code: i16) -> Result<(), MarkerError> {
    use kafka_protocol::ResponseError as E;
    if code == 0 {
        return Ok(());
    }
    Err(match E::try_from_code(code) {
        Some(E::UnknownTopicOrPartition) => MarkerError::UnknownPartition,
        Some(E::NotLeaderOrFollower | E::LeaderNotAvailable) => MarkerError::NotLeader,
        Some(E::NotEnoughReplicas) => MarkerError::NotEnoughReplicas,
        Some(E::NotEnoughReplicasAfterAppend) => MarkerError::NotEnoughReplicasAfterAppend,
        Some(E::InvalidProducerEpoch) => MarkerError::StaleEpoch,
        Some(E::TransactionCoordinatorFenced) => MarkerError::CoordinatorFenced,
        Some(E::RequestTimedOut) => MarkerError::TimedOut,
        _ => MarkerError::Storage,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::ResponseError as E;

    fn marker(topic: &str, p: i32, pid: i64, commit: bool, tv2: bool) -> TxnMarker {
        TxnMarker {
            tp: TopicPartition::new(topic, p),
            producer_id: pid,
            producer_epoch: 3,
            coordinator_epoch: 0,
            commit,
            tv2,
        }
    }

    /// One entry per transaction, partitions by topic, each entry's
    /// transaction version alongside.
    #[test]
    fn markers_are_grouped_per_transaction_and_topic() {
        let (req, versions) = markers_request(&[
            marker("a", 0, 7, true, true),
            marker("b", 1, 7, true, true),
            marker("a", 2, 7, true, true),
            marker("a", 0, 8, false, false),
        ]);
        assert_eq!(versions, vec![2, 1]);
        assert_eq!(req.markers.len(), 2);
        let first = &req.markers[0];
        assert_eq!((first.producer_id.0, first.producer_epoch), (7, 3));
        assert!(first.transaction_result);
        let topics: Vec<(&str, Vec<i32>)> = first
            .topics
            .iter()
            .map(|t| (t.name.0.as_str(), t.partition_indexes.clone()))
            .collect();
        assert_eq!(topics, vec![("a", vec![0, 2]), ("b", vec![1])]);
        assert!(!req.markers[1].transaction_result);
        assert_eq!(req.markers[1].producer_id.0, 8);
    }

    /// Kafka's marker channel: retried, not retried, written.
    #[test]
    fn leader_answers_map_to_marker_outcomes() {
        assert_eq!(marker_outcome(0), Ok(()));
        let cases = [
            (E::NotLeaderOrFollower, MarkerError::NotLeader),
            (E::NotEnoughReplicas, MarkerError::NotEnoughReplicas),
            (E::UnknownTopicOrPartition, MarkerError::UnknownPartition),
            (E::InvalidProducerEpoch, MarkerError::StaleEpoch),
            (
                E::TransactionCoordinatorFenced,
                MarkerError::CoordinatorFenced,
            ),
            (E::RequestTimedOut, MarkerError::TimedOut),
            (E::KafkaStorageError, MarkerError::Storage),
            (E::ClusterAuthorizationFailed, MarkerError::Storage),
        ];
        for (code, want) in cases {
            assert_eq!(marker_outcome(code.code()), Err(want), "{code:?}");
        }
        assert!(!MarkerError::StaleEpoch.retriable());
        assert!(!MarkerError::CoordinatorFenced.retriable());
        assert!(MarkerError::NotLeader.retriable());
        assert!(MarkerError::NotEnoughReplicas.retriable());
        assert!(MarkerError::NotEnoughReplicasAfterAppend.retriable());
    }
}
