//! The shard's side of the coordinators' writes
//! ([`crate::partition::coordinator_log`]): only the leader appends, and a
//! write is answered once it is acknowledged as an `acks=all` produce is
//! (the same wait as `handlers::produce`'s, [`ShardCtx::wait_acks_all`]).

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

    /// Whether `tp` is a replicated partition in the current image.
    fn is_replicated(&self, tp: &TopicPartition) -> bool {
        self.image()
            .topic(&tp.topic)
            .and_then(|t| t.replica_state(tp.partition.0))
            .is_some()
    }
}

impl CoordinatorLog for ShardCtx {
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
        async move {
            let replicated = self.is_replicated(tp).then_some(tp);
            let wait = Box::pin(self.wait_acks_all(log, last, self.config.fsync_acks, replicated));
            let timer = Box::pin(glommio::timer::sleep(Duration::from_millis(
                COORDINATOR_WRITE_TIMEOUT_MS,
            )));
            match crate::metrics::remote_wait(future::select(wait, timer)).await {
                Either::Left((Ok(()), _)) => {}
                Either::Left((Err(e), _)) => {
                    return Err(CoordinatorWriteError::Storage(e.to_string()))
                }
                Either::Right(_) => return Err(CoordinatorWriteError::TimedOut),
            }
            if replicated.is_some() {
                // Leadership lost meanwhile (the state went), or the ISR
                // shrank under the minimum: as an acks=all produce.
                match self.leading.acks_all(tp, last.0) {
                    None => return Err(CoordinatorWriteError::NotLeader),
                    Some(AcksAll::DoneUnderMinIsr) => {
                        return Err(CoordinatorWriteError::NotEnoughReplicas)
                    }
                    // The wait ends early only when the log failed.
                    Some(AcksAll::Waiting) => {
                        return Err(CoordinatorWriteError::Storage(
                            "the log failed before the write was replicated".into(),
                        ))
                    }
                    Some(AcksAll::Done) => {}
                }
            }
            Ok(())
        }
        .boxed_local()
    }
}
