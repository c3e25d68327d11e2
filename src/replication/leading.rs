//! The leader's side of the replicated partitions one shard leads
//! (`docs/replication.md` §4.1, §4.3): a [`LeaderState`] per partition,
//! fed by the followers' fetches, whose high watermark becomes the log's
//! (`PartitionLog::set_high_watermark`), and which answers whether an
//! acks=all produce may be appended and when it is done.
//!
//! A partition's state is made when the first fetch or produce after a
//! change of its leader epoch or partition epoch in the image needs it:
//! from the image's replicas and ISR, the log's HW, and where the log's
//! current epoch starts. A new leader epoch or partition epoch (an ISR
//! change) starts it again; followers then count as caught up for
//! `replica.lag.time.max.ms`, as Kafka resets them on a leader change.
//! What the shard no longer leads is dropped ([`Leading::retain`]), so the
//! map is bounded by the partitions the shard leads.
//!
//! `min.insync.replicas` counts at most the partition's replicas (Kafka's
//! effective minimum: a topic of 2 replicas with `min.insync.replicas=3`
//! takes acks=all with both in sync).

use super::leader::{AcksAll, FetchRecordError, LeaderState};
use crate::log::PartitionLog;
use crate::metadata::PartitionState;
use crate::partition::Partition;
use crate::types::{Offset, TopicPartition};
use kafka_protocol::ResponseError;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

/// FENCED_LEADER_EPOCH when a client's `current_leader_epoch` is older
/// than the log's, UNKNOWN_LEADER_EPOCH when newer (KIP-320); none when
/// they agree or the client sent none (-1).
pub fn check_leader_epoch(current_leader_epoch: i32, leader_epoch: i32) -> Option<ResponseError> {
    match current_leader_epoch {
        e if e < 0 || e == leader_epoch => None,
        e if e < leader_epoch => Some(ResponseError::FencedLeaderEpoch),
        _ => Some(ResponseError::UnknownLeaderEpoch),
    }
}

/// KIP-320's check of a fetcher that says which epoch its last batch
/// was in (Kafka's `Partition.fetchRecords` with `lastFetchedEpoch`):
/// `Ok(Some((epoch, end)))` when its log diverges from `log` at or
/// before its fetch offset (this log's last epoch at or below it ends at
/// `end`, which is below the fetch offset, or is an older epoch), so it
/// must truncate to `end` before fetching again; OFFSET_OUT_OF_RANGE when
/// this log knows no end for that epoch or the fetch offset is below the
/// log start; `Ok(None)` otherwise, including when no epoch was sent.
pub fn diverging(
    last_fetched_epoch: i32,
    fetch_offset: i64,
    log: &PartitionLog,
) -> Result<Option<(i32, i64)>, ResponseError> {
    if last_fetched_epoch < 0 {
        return Ok(None);
    }
    let (epoch, end) = log.end_offset_for_epoch(last_fetched_epoch);
    if epoch < 0 || end < 0 || fetch_offset < log.log_start_offset().0 {
        return Err(ResponseError::OffsetOutOfRange);
    }
    if epoch < last_fetched_epoch || end < fetch_offset {
        return Ok(Some((epoch, end)));
    }
    Ok(None)
}

/// One led partition's state, and the image epochs it was made under.
struct Led {
    leader_epoch: i32,
    partition_epoch: i32,
    topic_id: [u8; 16],
    log: Rc<PartitionLog>,
    state: LeaderState,
}

impl Led {
    /// Moves the HW as far as the rules allow with the log as written now,
    /// into the log.
    fn advance(&mut self, now_ms: i64) -> i64 {
        let hw = self
            .state
            .advance_high_watermark(self.log.written_offset().0, now_ms);
        self.log.set_high_watermark(Offset(hw));
        hw
    }
}

/// An ISR change to ask the controller for (Kafka's AlterPartition),
/// fenced by the epochs the leader leads in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IsrProposal {
    pub tp: TopicPartition,
    pub topic_id: [u8; 16],
    pub leader_epoch: i32,
    pub partition_epoch: i32,
    pub isr: Vec<i32>,
}

/// The replicated partitions a shard leads (module doc).
pub struct Leading {
    led: RefCell<HashMap<TopicPartition, Led>>,
    lag_max_ms: Cell<i64>,
}

impl Default for Leading {
    fn default() -> Leading {
        Leading {
            led: RefCell::default(),
            lag_max_ms: Cell::new(super::leader::REPLICA_LAG_TIME_MAX_MS),
        }
    }
}

/// A follower's fetch, as the leader records it.
#[derive(Clone, Copy, Debug)]
pub struct FollowerFetch {
    pub replica: i32,
    pub broker_epoch: i64,
    pub fetch_offset: i64,
    pub log_start: i64,
}

impl Leading {
    /// Runs `f` on partition `p`'s state under the image's `ps`, made anew
    /// when its epochs changed. `me` is this shard's broker id.
    fn with<R>(
        &self,
        p: &Partition,
        ps: &PartitionState,
        me: i32,
        f: impl FnOnce(&mut LeaderState) -> R,
    ) -> R {
        let (tp, log) = (&p.tp, &p.log);
        let mut led = self.led.borrow_mut();
        // The same leadership with a new ISR (an AlterPartition committed):
        // the followers' positions stay, the proposal is settled.
        let min_isr = usize::try_from(p.config().min_insync_replicas)
            .unwrap_or(1)
            .min(ps.replicas.len());
        if let Some(l) = led.get_mut(tp).filter(|l| {
            l.leader_epoch == ps.leader_epoch
                && l.partition_epoch != ps.partition_epoch
                && Rc::ptr_eq(&l.log, log)
        }) {
            // A reassignment may have changed the replicas too.
            l.state.set_replicas(&ps.replicas, min_isr);
            l.state.set_isr(&ps.isr);
            l.partition_epoch = ps.partition_epoch;
        }
        let current = led.get(tp).is_some_and(|l| {
            l.leader_epoch == ps.leader_epoch
                && l.partition_epoch == ps.partition_epoch
                && Rc::ptr_eq(&l.log, log)
        });
        if !current {
            let epoch_start = log
                .epoch_entries()
                .iter()
                .rev()
                .find(|(e, _)| *e == ps.leader_epoch)
                .map_or(log.log_end_offset().0, |(_, start)| *start);
            let state = LeaderState::new(
                me,
                &ps.replicas,
                &ps.isr,
                epoch_start,
                log.high_watermark().0,
                min_isr,
                crate::clock::now_ms(),
            );
            led.insert(
                tp.clone(),
                Led {
                    leader_epoch: ps.leader_epoch,
                    partition_epoch: ps.partition_epoch,
                    topic_id: p.topic_id,
                    log: log.clone(),
                    state: state.with_lag_max_ms(self.lag_max_ms.get()),
                },
            );
        }
        let l = led.get_mut(tp).expect("made above");
        f(&mut l.state)
    }

    /// A follower fetched: its position is recorded (Kafka's
    /// `updateFollowerFetchState`) and the HW moved as far as the rules
    /// allow, into the log. A replica not assigned the partition is
    /// refused.
    /// Returns the ISR expansion to propose, when the fetch made a
    /// follower eligible to join (Kafka's `maybeExpandIsr`).
    pub fn record_fetch(
        &self,
        p: &Partition,
        ps: &PartitionState,
        me: i32,
        fetch: FollowerFetch,
    ) -> Result<Option<IsrProposal>, FetchRecordError> {
        let (tp, log) = (&p.tp, &p.log);
        let leader_end = log.written_offset().0;
        let now = crate::clock::now_ms();
        let (hw, expand) = self.with(p, ps, me, |s| {
            s.record_fetch(
                fetch.replica,
                fetch.fetch_offset,
                fetch.log_start,
                leader_end,
                now,
                fetch.broker_epoch,
            )?;
            let hw = s.advance_high_watermark(leader_end, now);
            let expand = s.expand_candidates();
            if let Some(isr) = &expand {
                s.propose(isr.clone());
            }
            Ok::<_, FetchRecordError>((hw, expand))
        })?;
        let now_hw = log.set_high_watermark(Offset(hw));
        tracing::trace!(partition = %tp, replica = fetch.replica, fetch_offset = fetch.fetch_offset, leader_end, state_hw = hw, log_hw = now_hw.0, "follower fetch recorded");
        Ok(expand.map(|isr| IsrProposal {
            tp: tp.clone(),
            topic_id: p.topic_id,
            leader_epoch: ps.leader_epoch,
            partition_epoch: ps.partition_epoch,
            isr,
        }))
    }

    /// Moves every led partition's HW as far as the rules allow after a
    /// local append or an ISR change (a leader alone in the ISR has no
    /// follower fetch to move it).
    pub fn advance(&self, tp: &TopicPartition) {
        let mut led = self.led.borrow_mut();
        if let Some(l) = led.get_mut(tp) {
            l.advance(crate::clock::now_ms());
        }
    }

    /// The image changed `p`'s state (`ps`; this shard leads it): its
    /// leader state follows and its HW moves as far as the rules allow, as
    /// Kafka's leader does on becoming leader and on every ISR change
    /// (`maybeIncrementLeaderHW`). A new leader alone in its ISR, or one
    /// whose ISR lost the member that held the HW back, answers the
    /// acks=all produces waiting on it now, not at its next fetch.
    pub fn refresh(&self, p: &Partition, ps: &PartitionState, me: i32) {
        let leader_end = p.log.written_offset().0;
        let now = crate::clock::now_ms();
        let hw = self.with(p, ps, me, |s| s.advance_high_watermark(leader_end, now));
        p.log.set_high_watermark(Offset(hw));
    }

    /// The ISR shrinks to propose (Kafka's `maybeShrinkIsr`, run every
    /// half `replica.lag.time.max.ms`): members that have not caught up
    /// for that long, one proposal per partition at a time. Every HW is
    /// moved first (the ISR may have changed since the last fetch).
    pub fn shrink_proposals(&self) -> Vec<IsrProposal> {
        let now = crate::clock::now_ms();
        let mut out = Vec::new();
        for (tp, l) in self.led.borrow_mut().iter_mut() {
            l.advance(now);
            let end = l.log.written_offset().0;
            if let Some(isr) = l.state.shrink_candidates(end, now) {
                l.state.propose(isr.clone());
                out.push(IsrProposal {
                    tp: tp.clone(),
                    topic_id: l.topic_id,
                    leader_epoch: l.leader_epoch,
                    partition_epoch: l.partition_epoch,
                    isr,
                });
            }
        }
        out
    }

    /// An AlterPartition of `p` failed or was refused: the proposal is
    /// dropped (the committed ISR stands; the next check may propose
    /// again). One answered with the new state is settled by the image.
    pub fn proposal_failed(&self, p: &IsrProposal) {
        if let Some(l) =
            self.led.borrow_mut().get_mut(&p.tp).filter(|l| {
                l.leader_epoch == p.leader_epoch && l.partition_epoch == p.partition_epoch
            })
        {
            let isr = l.state.isr().to_vec();
            l.state.set_isr(&isr);
        }
    }

    /// `replica.lag.time.max.ms` for the states made from now on.
    pub fn set_lag_max_ms(&self, ms: i64) {
        self.lag_max_ms.set(ms);
    }

    /// Whether an acks=all produce may be appended: the ISR has at least
    /// the effective `min.insync.replicas` (else NOT_ENOUGH_REPLICAS).
    pub fn enough_replicas(&self, p: &Partition, ps: &PartitionState, me: i32) -> bool {
        self.with(p, ps, me, |s| s.enough_replicas_for_acks_all())
    }

    /// The fate of an acks=all produce ending at `last_offset`, once the
    /// HW passed it or the wait ended (None: `tp` is no longer led).
    pub fn acks_all(&self, tp: &TopicPartition, last_offset: i64) -> Option<AcksAll> {
        self.led
            .borrow()
            .get(tp)
            .map(|l| l.state.acks_all(last_offset))
    }

    /// Drops the state of every partition `keep` refuses (no longer led).
    pub fn retain(&self, mut keep: impl FnMut(&TopicPartition) -> bool) {
        self.led.borrow_mut().retain(|tp, _| keep(tp));
    }

    /// Partitions with a state.
    pub fn len(&self) -> usize {
        self.led.borrow().len()
    }

    pub fn is_empty(&self) -> bool {
        self.led.borrow().is_empty()
    }
}
