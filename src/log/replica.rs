//! What a replicated partition's log adds to a leader's: appends of the
//! leader's batches as the leader wrote them, leader epochs started at run
//! time, and a high watermark set from outside (docs/replication.md §4.1).
//!
//! - **Replica append** ([`PartitionLog::append_replica`]): a follower
//!   appends the batches its fetch returned at the leader's offsets,
//!   unchanged: no `baseOffset` or `partitionLeaderEpoch` is patched, so
//!   the CRC, the timestamps and every byte stay the leader's (the follower's
//!   segment files are byte-identical to the leader's). The batch's CRC is
//!   checked (it crossed the network, as Kafka's follower checks it). Its
//!   base offset must not lie below the log end (`OffsetBelowLogEnd`,
//!   nothing written); it may lie above it, because a compacted leader log
//!   has gaps between batches and Kafka's follower accepts them. After a
//!   truncation the fetcher asks from the new log end, so a normal fetch
//!   answer starts exactly there. A batch in an epoch newer than the epoch
//!   cache's latest starts that epoch at its base offset, in the cache and
//!   in `leader-epoch-checkpoint`, written (and fsynced) *before* the batch
//!   is staged, as Kafka's follower assigns it: a crash after the
//!   checkpoint and before the batch leaves an epoch starting at or past
//!   the recovered log end, which recovery drops (`leader_epoch`). A batch
//!   in an older epoch than the latest is refused (`StaleLeaderEpoch`): a
//!   leader never sends one, a deposed leader's late answer might. The rest
//!   of the path is the leader append's (`PartitionLog::stage_appended`):
//!   the same staging, group commit, direct or page-cache writes, tail
//!   cache (zero copy when the batch is most of its frame) and
//!   `--fsync-acks` durability signals.
//! - **Leader epochs at run time** ([`PartitionLog::become_leader`]):
//!   becoming leader in epoch E starts E at the log end (cache and
//!   checkpoint) and every later leader append stamps E. An E not above the
//!   latest epoch is refused. A leader append in a log whose cache holds a
//!   newer epoch than the one it stamps (the log followed a newer leader
//!   since) is refused (`StaleLeaderEpoch`). An epoch that holds no batch
//!   yet (it starts at the log end) does not survive a restart: recovery
//!   drops epochs starting at or past the log end, as Kafka's does, and the
//!   log then stamps its configured epoch or the newest it holds, whichever
//!   is newer; whoever makes the node leader again calls `become_leader`.
//! - **High watermark from outside** ([`PartitionLog::set_high_watermark`]):
//!   the first call switches the log to replicated mode for as long as it
//!   is open: the HW is then `min(bound, acked)`, `bound` being the highest
//!   HW set from outside (the leader's minimum ISR LEO, or a follower's
//!   fetch answer) and `acked` what is locally acknowledged (`written`, or
//!   `durable` under `--fsync-acks`). So the HW never passes what this node
//!   holds, and never moves back (both only rise) except through a
//!   truncation, which lowers the bound to the new log end. The bound starts
//!   at the HW of the moment, so switching moves nothing back either.
//!   Consumers' reads, `wait_for_hw_above`, the LSO (the partition's, from
//!   `high_watermark`), retention and DeleteRecords all read the HW through
//!   `high_watermark` and so use it unchanged. A log never switched (the
//!   single-node broker) derives its HW exactly as before.
//! - **Log start from the leader** ([`PartitionLog::follow_leader_log_start`]):
//!   every fetch answer carries the leader's log start; the follower moves
//!   its own up to it (never past its own HW), deletes the sealed segments
//!   wholly below it, and checkpoints it before it fetches again, so the
//!   log start its next fetch reports (what the leader's DeleteRecords
//!   waits for, Kafka's low watermark) is on its disk.
//! - **High watermark after a restart** ([`PartitionLog::start_replicated_at`]):
//!   a reopened log's HW is everything it has written, batches the ISR
//!   never had included. A replicated log reopened is switched with the HW
//!   its manager checkpointed (`replication-offset-checkpoint`,
//!   `LogManager::checkpointed_high_watermark`; 0 when there is none), capped
//!   by the log end, as Kafka's `Partition` starts from its checkpoint.

use super::partition::PartitionLog;
use super::watch::OffsetWatch;
use super::{AppendInfo, LogError};
use crate::record::batch;
use crate::types::{HighWatermark, LogStartOffset, Offset};
use bytes::Bytes;
use std::rc::Rc;

impl PartitionLog {
    /// Appends ONE batch as the leader wrote it, at its own offsets; see the
    /// module doc. `batch` is typically a slice of a fetch answer's frame
    /// (`allocation_bytes` long, as in [`Self::append_from`]): the tail
    /// cache keeps that slice without a copy when it is most of the frame.
    pub fn append_replica(
        &self,
        batch: Bytes,
        allocation_bytes: usize,
    ) -> Result<AppendInfo, LogError> {
        self.check_appendable()?;
        let h = batch::validate(&batch)?;
        if h.total_size() != batch.len() {
            return Err(LogError::InvalidBatch(batch::BatchError::Truncated {
                needed: h.total_size(),
                available: batch.len(),
            }));
        }
        h.check_counts()?;
        let log_end = self.log_end.get();
        if h.base_offset < log_end {
            return Err(LogError::OffsetBelowLogEnd {
                base: h.base_offset,
                log_end,
            });
        }
        // A gap this large could not be indexed relative to any segment
        // base the log can open (`maybe_roll` starts one at the log end).
        if h.last_offset() - log_end > i32::MAX as i64 {
            return Err(LogError::Corrupt(format!(
                "replica batch at {} is too far past the log end {log_end}",
                h.base_offset
            )));
        }
        self.start_epoch(h.partition_leader_epoch, h.base_offset)?;
        Ok(self.stage_appended(batch, &h, allocation_bytes))
    }

    /// Becomes the partition's leader in `epoch`: the epoch starts at the
    /// log end (cache and checkpoint, written before this returns) and every
    /// later append stamps it. Refused (`StaleLeaderEpoch`) unless `epoch`
    /// is above every epoch the log holds.
    pub fn become_leader(&self, epoch: i32) -> Result<(), LogError> {
        self.check_appendable()?;
        if let Some(latest) = self.epochs.borrow().latest_epoch() {
            if epoch <= latest {
                return Err(LogError::StaleLeaderEpoch { epoch, latest });
            }
        }
        self.start_epoch(epoch, self.log_end.get())?;
        self.leader_epoch.set(epoch);
        Ok(())
    }

    /// Makes `epoch` the newest of the epoch cache, starting at `start`, if
    /// it is not already: written to `leader-epoch-checkpoint` first (the
    /// cache changes only once the file did). An epoch older than the
    /// newest is refused. The write (a small file, its fsync and the
    /// directory's) runs on the shard, as appends are synchronous: once
    /// per leader change, not per batch.
    pub(super) fn start_epoch(&self, epoch: i32, start: i64) -> Result<(), LogError> {
        let latest = self.epochs.borrow().latest_epoch();
        if epoch < 0 {
            let latest = latest.unwrap_or(super::leader_epoch::UNDEFINED_EPOCH);
            return Err(LogError::StaleLeaderEpoch { epoch, latest });
        }
        match latest {
            Some(l) if l == epoch => Ok(()),
            Some(l) if l > epoch => Err(LogError::StaleLeaderEpoch { epoch, latest: l }),
            _ => {
                let mut next = self.epochs.borrow().clone();
                next.assign(epoch, start);
                next.write(&self.dir)?;
                *self.epochs.borrow_mut() = next;
                Ok(())
            }
        }
    }

    /// Raises the high watermark set from outside to `hw` (see the module
    /// doc), switching the log to replicated mode on the first call. A
    /// lower `hw` than the bound changes nothing. Returns the HW now.
    pub fn set_high_watermark(&self, hw: Offset) -> HighWatermark {
        let bound = self.hw_bound.borrow().clone();
        let bound = match bound {
            Some(b) => b,
            None => {
                let b = Rc::new(OffsetWatch::new(self.high_watermark().0));
                *self.hw_bound.borrow_mut() = Some(b.clone());
                b
            }
        };
        let before = self.high_watermark();
        bound.advance(hw.0);
        let after = self.high_watermark();
        if after != before {
            self.changes.notify();
        }
        after
    }

    /// Switches the log to replicated mode with the bound starting at `hw`
    /// (the checkpointed HW of a reopened log; see the module doc), kept
    /// within the log's start and end. A log already replicated keeps its
    /// bound. Returns the HW now.
    pub fn start_replicated_at(&self, hw: Offset) -> HighWatermark {
        if self.hw_bound.borrow().is_none() {
            let before = self.high_watermark();
            let start = hw.0.max(self.log_start.get()).min(self.log_end.get());
            *self.hw_bound.borrow_mut() = Some(Rc::new(OffsetWatch::new(start)));
            if self.high_watermark() != before {
                self.changes.notify();
            }
        }
        self.high_watermark()
    }

    /// A follower's log start follows its leader's (Kafka's
    /// `maybeIncrementLogStartOffset` with reason `LeaderOffsetIncremented`,
    /// which a follower runs on every fetch answer; see the module doc):
    /// the log start moves up to `leader_log_start`, bounded by this log's
    /// HW (the rest follows with a later answer, once the HW is there), and
    /// the sealed segments wholly below it are deleted, as DeleteRecords
    /// does on the leader. The shard's checkpoints (the log start's among
    /// them) are rewritten before this returns, so the log start the
    /// follower reports in its next fetch, which the leader's DeleteRecords
    /// waits for, survives a kill -9 of this node. Never moves the log start
    /// back; returns it after the call.
    pub async fn follow_leader_log_start(
        &self,
        leader_log_start: Offset,
    ) -> Result<LogStartOffset, LogError> {
        let to = leader_log_start.0.min(self.high_watermark().0);
        if to <= self.log_start.get() {
            return Ok(self.log_start_offset());
        }
        if self.truncating.get() {
            return Err(LogError::Truncating);
        }
        let start = self.move_log_start(Offset(to), "the leader's log start")?;
        self.write_shard_checkpoints().await?;
        Ok(start)
    }

    /// The HW is set from outside (`set_high_watermark` or
    /// `start_replicated_at` was called).
    pub fn is_replicated(&self) -> bool {
        self.hw_bound.borrow().is_some()
    }

    /// The HW bound set from outside, if the log is replicated.
    pub fn high_watermark_bound(&self) -> Option<Offset> {
        self.hw_bound.borrow().as_ref().map(|b| Offset(b.get()))
    }

    /// The newest epoch the log holds (its epoch cache's), if any.
    pub fn latest_epoch(&self) -> Option<i32> {
        self.epochs.borrow().latest_epoch()
    }

    /// The epoch cache's entries as (epoch, start offset), oldest first.
    pub fn epoch_entries(&self) -> Vec<(i32, i64)> {
        self.epochs
            .borrow()
            .entries()
            .iter()
            .map(|e| (e.epoch, e.start_offset))
            .collect()
    }
}
