//! The shard's side of the coordinators' writes
//! ([`crate::partition::coordinator_log`]): only the leader appends, and a
//! write is answered once it is acknowledged as an `acks=all` produce is
//! (the wait of `handlers::produce`'s, [`ShardCtx::wait_acks_all`]), and
//! only if this shard still leads the partition in the leader epoch it
//! appended in (`Leading::wait_acks_all_in`): a leader deposed and
//! truncated meanwhile sees its HW pass an offset that holds another
//! leader's batch.

use super::ShardCtx;
use crate::log::{LogError, PartitionLog};
use crate::partition::coordinator_log::{
    CoordinatorLog, CoordinatorWriteError, COORDINATOR_WRITE_TIMEOUT_MS,
};
use crate::partition::Partition;
use crate::replication::leader::AcksAll;
use crate::types::{Offset, TopicPartition};
use futures::future::{self, Either, FutureExt, LocalBoxFuture};
use std::rc::Rc;
use std::time::Duration;

impl ShardCtx {
    /// What an acknowledgement of the batch ending at `last` waits for:
    /// its write (its fdatasync when `durable`), and for a `replicated`
    /// partition this shard leads, the HW passing it (a leader alone in
    /// the ISR moves the HW itself, here).
    pub async fn wait_acks_all(
        &self,
        log: &PartitionLog,
        last: Offset,
        durable: bool,
        replicated: Option<&TopicPartition>,
    ) -> Result<(), LogError> {
        log.wait_acked(last, durable).await?;
        if let Some(tp) = replicated {
            self.leading.advance(tp);
            log.wait_for_hw_above(last).await;
        }
        Ok(())
    }

    /// `tp`'s leader epoch in the current image, if it is a replicated
    /// partition.
    fn leader_epoch(&self, tp: &TopicPartition) -> Option<i32> {
        self.image()
            .topic(&tp.topic)
            .and_then(|t| t.replica_state(tp.partition.0))
            .map(|s| s.leader_epoch)
    }
}

impl CoordinatorLog for ShardCtx {
    fn leads(&self, tp: &TopicPartition) -> bool {
        self.led_partition(tp).is_some()
    }

    fn writable(&self, tp: &TopicPartition) -> Result<Rc<Partition>, CoordinatorWriteError> {
        let p = self
            .led_partition(tp)
            .ok_or(CoordinatorWriteError::NotLeader)?;
        let image = self.image();
        if let Some(ps) = image
            .topic(&tp.topic)
            .and_then(|t| t.replica_state(tp.partition.0))
        {
            if !self.leading.enough_replicas(&p, ps, self.node_id()) {
                return Err(CoordinatorWriteError::NotEnoughReplicas);
            }
        }
        Ok(p)
    }

    fn acked<'a>(
        &'a self,
        tp: &'a TopicPartition,
        log: &'a Rc<PartitionLog>,
        last: Offset,
    ) -> LocalBoxFuture<'a, Result<(), CoordinatorWriteError>> {
        // The leader epoch the batch was appended in (no await since the
        // append): it counts only if replicated in that epoch.
        let epoch = self.leader_epoch(tp);
        async move {
            let durable = self.config.fsync_acks;
            let wait = async {
                match epoch {
                    None => log.wait_acked(last, durable).await.map(|()| None),
                    Some(epoch) => self
                        .leading
                        .wait_acks_all_in(tp, log, epoch, last, durable)
                        .await
                        .map(Some),
                }
            };
            let timer = Box::pin(glommio::timer::sleep(Duration::from_millis(
                COORDINATOR_WRITE_TIMEOUT_MS,
            )));
            let fate =
                match crate::metrics::remote_wait(future::select(Box::pin(wait), timer)).await {
                    Either::Left((Ok(fate), _)) => fate,
                    Either::Left((Err(e), _)) => {
                        return Err(CoordinatorWriteError::Storage(e.to_string()))
                    }
                    Either::Right(_) => return Err(CoordinatorWriteError::TimedOut),
                };
            match fate {
                None => Ok(()),
                // Leadership lost meanwhile (the state went; and if this
                // shard leads again, in a later epoch, its log may have
                // been truncated under the batch), or the ISR shrank under
                // the minimum: as an acks=all produce.
                Some(None) => Err(CoordinatorWriteError::NotLeader),
                Some(Some(AcksAll::DoneUnderMinIsr)) => {
                    Err(CoordinatorWriteError::NotEnoughReplicas)
                }
                // The wait ends early only when the log failed.
                Some(Some(AcksAll::Waiting)) => Err(CoordinatorWriteError::Storage(
                    "the log failed before the write was replicated".into(),
                )),
                Some(Some(AcksAll::Done)) => Ok(()),
            }
        }
        .boxed_local()
    }
}
