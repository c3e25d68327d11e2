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
//! The low watermark (Kafka's `lowWatermarkIfLeader`, the least log start
//! of the live replicas as their fetches report it) is what DeleteRecords
//! waits for; [`Leading::low_watermark_moved`] wakes it when a follower
//! reports another log start or an image is applied.
//!
//! `min.insync.replicas` counts at most the partition's replicas (Kafka's
//! effective minimum: a topic of 2 replicas with `min.insync.replicas=3`
//! takes acks=all with both in sync).

use super::leader::{AcksAll, FetchRecordError, LeaderState};
use crate::log::watch::OffsetWatch;
use crate::log::PartitionLog;
use crate::metadata::PartitionState;
use crate::partition::{MarkerError, Partition};
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
    /// Each member's broker epoch as this leader last saw it in its
    /// fetches (its own: its registration's), Kafka's `NewIsrWithEpochs`:
    /// the controller refuses a new member whose epoch is not its node's
    /// current registration's (KIP-903).
    pub broker_epochs: Vec<(i32, i64)>,
}

/// The replicated partitions a shard leads (module doc).
pub struct Leading {
    led: RefCell<HashMap<TopicPartition, Led>>,
    lag_max_ms: Cell<i64>,
    /// A count that moves whenever a low watermark may have moved: a
    /// follower reported another log start, or an image changed who leads,
    /// the ISRs or which brokers are live. DeleteRecords waits on it.
    low_watermark_moves: OffsetWatch,
}

impl Default for Leading {
    fn default() -> Leading {
        Leading {
            led: RefCell::default(),
            lag_max_ms: Cell::new(super::leader::REPLICA_LAG_TIME_MAX_MS),
            low_watermark_moves: OffsetWatch::new(0),
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
    /// follower eligible to join (Kafka's `maybeExpandIsr`). `live_epoch`
    /// is the image's broker epoch of a broker of a live node
    /// (`MetadataImage::live_broker_epoch`): a follower joins only with a
    /// fetch that named it ([`LeaderState::expand_candidates`]).
    pub fn record_fetch(
        &self,
        p: &Partition,
        ps: &PartitionState,
        me: i32,
        fetch: FollowerFetch,
        live_epoch: impl Fn(i32) -> Option<i64>,
    ) -> Result<Option<IsrProposal>, FetchRecordError> {
        let (tp, log) = (&p.tp, &p.log);
        let leader_end = log.written_offset().0;
        let now = crate::clock::now_ms();
        let (hw, expand, log_start_moved) = self.with(p, ps, me, |s| {
            let before = s.follower(fetch.replica).map(|f| f.log_start);
            s.record_fetch(
                fetch.replica,
                fetch.fetch_offset,
                fetch.log_start,
                leader_end,
                now,
                fetch.broker_epoch,
            )?;
            let hw = s.advance_high_watermark(leader_end, now);
            let expand = s.expand_candidates(&live_epoch).map(|isr| {
                s.propose(isr.clone());
                let epochs = s.broker_epochs(&isr, live_epoch(me).unwrap_or(-1));
                (isr, epochs)
            });
            let moved = before != Some(fetch.log_start);
            Ok::<_, FetchRecordError>((hw, expand, moved))
        })?;
        if log_start_moved {
            self.low_watermark_may_have_moved();
        }
        let now_hw = log.set_high_watermark(Offset(hw));
        tracing::trace!(partition = %tp, replica = fetch.replica, fetch_offset = fetch.fetch_offset, leader_end, state_hw = hw, log_hw = now_hw.0, "follower fetch recorded");
        Ok(expand.map(|(isr, broker_epochs)| IsrProposal {
            tp: tp.clone(),
            topic_id: p.topic_id,
            leader_epoch: ps.leader_epoch,
            partition_epoch: ps.partition_epoch,
            isr,
            broker_epochs,
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
        self.low_watermark_may_have_moved();
    }

    /// The ISR shrinks to propose (Kafka's `maybeShrinkIsr`, run every
    /// half `replica.lag.time.max.ms`): members that have not caught up
    /// for that long, one proposal per partition at a time. Every HW is
    /// moved first (the ISR may have changed since the last fetch).
    /// `own_epoch` is this leader's broker epoch (-1: not registered), sent
    /// with the members' (the controller checks only members a change
    /// adds, so a shrink's are not checked).
    pub fn shrink_proposals(&self, own_epoch: i64) -> Vec<IsrProposal> {
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
                    broker_epochs: l.state.broker_epochs(&isr, own_epoch),
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

    /// Whether `p` is still the AlterPartition in flight of the partition
    /// this shard leads (same leader and partition epochs): an answer that
    /// did not settle it may still be followed by its commit.
    pub fn still_proposed(&self, p: &IsrProposal) -> bool {
        self.led.borrow().get(&p.tp).is_some_and(|l| {
            l.leader_epoch == p.leader_epoch
                && l.partition_epoch == p.partition_epoch
                && l.state.proposed() == Some(p.isr.as_slice())
        })
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

    /// [`Self::acks_all`] for a batch appended to `log` while this shard
    /// led `tp` in `leader_epoch`: None unless it still leads `tp` in that
    /// epoch, on that log. A leader deposed in between may have been
    /// truncated (and have led again since): the offset may hold another
    /// leader's batch now.
    pub fn acks_all_in(
        &self,
        tp: &TopicPartition,
        log: &Rc<PartitionLog>,
        leader_epoch: i32,
        last_offset: i64,
    ) -> Option<AcksAll> {
        self.led
            .borrow()
            .get(tp)
            .filter(|l| l.leader_epoch == leader_epoch && Rc::ptr_eq(&l.log, log))
            .map(|l| l.state.acks_all(last_offset))
    }

    /// Waits until the batch of `tp` ending at `last`, appended to `log`
    /// while this shard led `tp` in `leader_epoch`, is acknowledged as an
    /// acks=all produce is: written (durable when `durable`), below the
    /// HW, and this shard still its leader in that epoch. The HW alone
    /// does not say it: a leader deposed before its followers fetched the
    /// batch truncates it away as the new leader's follower, whose HW then
    /// passes the offset, which holds another batch now (Kafka ends such
    /// a wait with NOT_LEADER_OR_FOLLOWER when the leadership moves).
    /// `Err` when the log failed.
    pub async fn wait_acks_all_in(
        &self,
        tp: &TopicPartition,
        log: &Rc<PartitionLog>,
        leader_epoch: i32,
        last: Offset,
        durable: bool,
    ) -> Result<Option<AcksAll>, crate::log::LogError> {
        log.wait_acked(last, durable).await?;
        // A leader alone in the ISR moves the HW itself.
        self.advance(tp);
        log.wait_for_hw_above(last).await;
        Ok(self.acks_all_in(tp, log, leader_epoch, last.0))
    }

    /// Waits until a COMMIT/ABORT marker, appended at `offset` to `log`
    /// while this shard led `tp` (in `leader_epoch`, for a replicated
    /// partition; None for one of a single replica), counts as written
    /// for the coordinator that sent it: as Kafka's acks=-1 marker
    /// append, written (durable when `durable`) and, replicated, below
    /// the HW with this shard still the leader of that epoch
    /// ([`Self::wait_acks_all_in`]); an ISR that shrank below
    /// `min.insync.replicas` after the append is
    /// [`MarkerError::NotEnoughReplicasAfterAppend`], as for a produce
    /// (the coordinator sends the marker again). Until `deadline`, else
    /// [`MarkerError::TimedOut`]; a lost leadership is
    /// [`MarkerError::NotLeader`] and the coordinator asks the new
    /// leader.
    pub async fn wait_marker(
        &self,
        tp: &TopicPartition,
        log: &Rc<PartitionLog>,
        leader_epoch: Option<i32>,
        offset: Offset,
        durable: bool,
        deadline: std::time::Instant,
    ) -> Result<(), MarkerError> {
        let wait = async {
            match leader_epoch {
                None => log.wait_acked(offset, durable).await.map(|()| None),
                Some(epoch) => self
                    .wait_acks_all_in(tp, log, epoch, offset, durable)
                    .await
                    .map(Some),
            }
        };
        match crate::runtime::within(deadline, wait).await {
            None => {
                tracing::warn!(%tp, "a transaction marker was not replicated in time");
                Err(MarkerError::TimedOut)
            }
            Some(Err(e)) => {
                tracing::error!(%tp, error = %e, "writing a transaction marker failed");
                Err(MarkerError::Storage)
            }
            Some(Ok(None | Some(Some(AcksAll::Done)))) => Ok(()),
            // As an acks=all produce: the ISR shrank under the minimum
            // after the append (Kafka's NOT_ENOUGH_REPLICAS_AFTER_APPEND;
            // the coordinator sends the marker again).
            Some(Ok(Some(Some(AcksAll::DoneUnderMinIsr)))) => {
                Err(MarkerError::NotEnoughReplicasAfterAppend)
            }
            Some(Ok(Some(None))) => {
                tracing::info!(%tp, offset = offset.0, "lost the leadership before a transaction marker was replicated; the coordinator asks the new leader");
                Err(MarkerError::NotLeader)
            }
            // The HW wait ends early only when the log failed.
            Some(Ok(Some(Some(AcksAll::Waiting)))) => Err(MarkerError::Storage),
        }
    }

    /// Drops the state of every partition `keep` refuses (no longer led).
    /// Called with every image applied, before it is stored: DeleteRecords
    /// waiting on a low watermark look again (under the new image) once
    /// it is, since leaders, ISRs and live brokers may have changed.
    pub fn retain(&self, mut keep: impl FnMut(&TopicPartition) -> bool) {
        self.led.borrow_mut().retain(|tp, _| keep(tp));
        self.low_watermark_may_have_moved();
    }

    /// Kafka's `lowWatermarkIfLeader` for `p` (led by this shard under the
    /// image's `ps`): the smallest log start of the leader and of every
    /// follower whose broker is `live` (`LeaderState::low_watermark`).
    pub fn low_watermark(
        &self,
        p: &Partition,
        ps: &PartitionState,
        me: i32,
        live: impl Fn(i32) -> bool,
    ) -> i64 {
        let start = p.log.log_start_offset().0;
        self.with(p, ps, me, |s| s.low_watermark(start, live))
    }

    /// Where the count of possible low watermark moves stands, for
    /// [`Self::low_watermark_moved`].
    pub fn low_watermark_moves(&self) -> i64 {
        self.low_watermark_moves.get()
    }

    /// Resolves once a low watermark may have moved since the count was
    /// `seen` (DeleteRecords then looks again; Kafka's
    /// DelayedDeleteRecords is checked on the same events).
    pub async fn low_watermark_moved(&self, seen: i64) {
        self.low_watermark_moves.wait_above(seen, || false).await;
    }

    fn low_watermark_may_have_moved(&self) {
        self.low_watermark_moves
            .advance(self.low_watermark_moves.get() + 1);
    }

    /// Partitions with a state.
    pub fn len(&self) -> usize {
        self.led.borrow().len()
    }

    pub fn is_empty(&self) -> bool {
        self.led.borrow().is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition::TxnMarker;
    use crate::record::{BatchBuilder, BatchHeader, Compression};
    use std::time::Duration;

    const ME: i32 = 0;
    const FOLLOWER: i32 = 1000;
    const PRODUCER: i64 = 10;

    use super::super::test_partition as partition;

    /// This shard leading in `leader_epoch`, every replica in sync.
    fn state(leader_epoch: i32, replicas: &[i32]) -> PartitionState {
        PartitionState {
            leader: ME,
            leader_epoch,
            ..PartitionState::new(replicas.to_vec())
        }
    }

    /// Leads `p` in `epoch` with `replicas`, as the shard does on the
    /// image that makes it leader.
    fn lead(leading: &Leading, p: &Partition, epoch: i32, replicas: &[i32]) {
        if p.log.latest_epoch().is_none_or(|l| l < epoch) {
            p.log.become_leader(epoch).expect("leader");
        }
        leading.refresh(p, &state(epoch, replicas), ME);
    }

    /// A transactional batch of [`PRODUCER`] (version 1: epoch 0), then
    /// its COMMIT marker from the coordinator; returns the marker's offset.
    async fn transaction_then_marker(p: &Partition) -> Offset {
        let data = BatchBuilder::new(Compression::None)
            .producer(PRODUCER, 0, 0)
            .transactional(true)
            .record(Some(b"k"), Some(b"v"), &[], 1)
            .build();
        let h = BatchHeader::parse(&data).expect("a batch");
        let cap = data.capacity();
        p.append_data(&h, data, cap, None, 1 << 20)
            .expect("data appended");
        let marker = TxnMarker {
            tp: p.tp.clone(),
            producer_id: PRODUCER,
            producer_epoch: 0,
            coordinator_epoch: 0,
            commit: true,
            tv2: false,
        };
        let at = p.append_control(&marker).expect("marker appended");
        p.log.wait_acked(at, false).await.expect("written");
        at
    }

    /// The new leader's batches from `from`, in `epoch`, as this replica
    /// appends them once it follows: a plain batch of `records` records.
    fn follow_new_leader(p: &Partition, from: i64, epoch: i32, records: usize) -> i64 {
        let mut b = BatchBuilder::new(Compression::None)
            .base_offset(from)
            .partition_leader_epoch(epoch);
        for i in 0..records {
            b = b.record(Some(b"other"), Some(format!("{i}").as_bytes()), &[], 2);
        }
        let bytes = b.build();
        let cap = bytes.capacity();
        let info = p
            .append_replica(bytes.freeze(), cap)
            .expect("replica append");
        info.last_offset.0 + 1
    }

    fn run(
        f: impl FnOnce(std::path::PathBuf) -> futures::future::LocalBoxFuture<'static, ()>
            + Send
            + 'static,
    ) {
        let dir = tempfile::tempdir().expect("a temporary dir");
        let path = dir.path().to_path_buf();
        crate::runtime::run_test_executor(move || async move {
            crate::runtime::probe_dma(&path).await.expect("dma probe");
            f(path).await
        });
    }

    fn deadline() -> std::time::Instant {
        crate::clock::monotonic() + Duration::from_secs(10)
    }

    /// Partition `t-0` led by this shard in epoch 3 with one follower in
    /// sync, a transaction and its marker appended (at the returned
    /// offset), and the coordinator's wait for that marker running.
    async fn marker_waiting(
        path: &std::path::Path,
    ) -> (
        Rc<Partition>,
        Rc<Leading>,
        Offset,
        glommio::Task<Result<(), MarkerError>>,
    ) {
        let tp = TopicPartition::new("t", 0);
        let p = partition(path, &tp).await;
        let leading = Rc::new(Leading::default());
        lead(&leading, &p, 3, &[ME, FOLLOWER]);
        let at = transaction_then_marker(&p).await;
        let wait = {
            let (leading, tp, log) = (leading.clone(), tp.clone(), p.log.clone());
            glommio::spawn_local(async move {
                leading
                    .wait_marker(&tp, &log, Some(3), at, false, deadline())
                    .await
            })
        };
        (p, leading, at, wait)
    }

    /// A marker the follower fetched past while this shard still leads in
    /// the epoch it was appended in is written.
    #[test]
    fn a_marker_below_the_hw_of_its_leader_epoch_is_written() {
        use futures::FutureExt;
        run(|path| {
            async move {
                let (p, leading, at, wait) = marker_waiting(&path).await;
                let ps = state(3, &[ME, FOLLOWER]);
                let fetch = FollowerFetch {
                    replica: FOLLOWER,
                    broker_epoch: 0,
                    fetch_offset: p.log.log_end_offset().0,
                    log_start: 0,
                };
                leading
                    .record_fetch(&p, &ps, ME, fetch, |_| Some(0))
                    .expect("the follower's fetch");
                assert!(p.log.high_watermark().0 > at.0);
                assert_eq!(wait.await, Ok(()));
            }
            .boxed_local()
        });
    }

    /// KIP-903 at the fetch: a caught-up follower outside the ISR whose
    /// fetch names a stale broker epoch (an older process of its node) is
    /// not proposed; its next fetch with the current epoch is, and the
    /// proposal carries each member's epoch for the controller.
    #[test]
    fn a_follower_is_proposed_only_with_its_current_broker_epoch() {
        use futures::FutureExt;
        run(|path| {
            async move {
                let tp = TopicPartition::new("t", 0);
                let p = partition(&path, &tp).await;
                let leading = Leading::default();
                let ps = PartitionState {
                    isr: vec![ME],
                    ..state(3, &[ME, FOLLOWER])
                };
                p.log.become_leader(3).expect("leader");
                leading.refresh(&p, &ps, ME);
                let image = |b: i32| Some(if b == ME { 4 } else { 9 });
                let fetch = |broker_epoch: i64| FollowerFetch {
                    replica: FOLLOWER,
                    broker_epoch,
                    fetch_offset: p.log.log_end_offset().0,
                    log_start: 0,
                };
                let proposed = leading
                    .record_fetch(&p, &ps, ME, fetch(8), image)
                    .expect("recorded");
                assert_eq!(proposed, None, "a stale epoch");
                let proposed = leading
                    .record_fetch(&p, &ps, ME, fetch(9), image)
                    .expect("recorded")
                    .expect("proposed with the current epoch");
                assert_eq!(proposed.isr, vec![ME, FOLLOWER]);
                assert_eq!(proposed.broker_epochs, vec![(ME, 4), (FOLLOWER, 9)]);
            }
            .boxed_local()
        });
    }

    /// Found by the cluster chaos run (seed 45114587: `stuck-lso`,
    /// `non-atomic-txn`, `G1a`): a leader appends a marker and is deposed
    /// before its followers fetch it; as the new leader's follower it
    /// truncates the marker away and takes the new leader's batches, and
    /// its HW (the new leader's) passes the marker's offset. The marker
    /// must not count as written: the coordinator would complete the
    /// transaction with this partition's part of it open (its LSO stuck;
    /// under transaction version 1 the producer's next COMMIT here then
    /// commits it too, aborted or not).
    #[test]
    fn a_marker_truncated_away_after_a_leader_change_is_not_written() {
        marker_truncated_away(false);
    }

    /// The same, with this shard elected again (epoch 5, the only
    /// replica after a reassignment, so its HW passes the offset at once): it leads, but not in the
    /// epoch the marker was appended in, and the offset holds the other
    /// leader's batch.
    #[test]
    fn a_marker_truncated_away_is_not_written_when_its_leader_leads_again() {
        marker_truncated_away(true);
    }

    /// A marker appended in epoch 3, the shard deposed (epoch 4 for the
    /// follower) and truncated to the marker's offset, then the new
    /// leader's batches replicated past it; the HW set past the marker
    /// from the new leader's (or, `leads_again`, this shard the only
    /// replica in epoch 5): the wait answers NOT_LEADER either way.
    fn marker_truncated_away(leads_again: bool) {
        use futures::FutureExt;
        run(move |path| {
            async move {
                let (p, leading, at, wait) = marker_waiting(&path).await;
                // Deposed (the image names the follower, in epoch 4): the
                // shard drops its leader state and truncates to where the
                // new leader's epoch 4 starts, the marker's offset.
                leading.retain(|_| false);
                p.truncate_to(at).await.expect("truncated");
                assert_eq!(p.producers().open_transaction(PRODUCER), Some(at.0 - 1));
                let end = follow_new_leader(&p, at.0, 4, 3);
                p.log
                    .wait_acked(Offset(end - 1), false)
                    .await
                    .expect("written");
                if leads_again {
                    lead(&leading, &p, 5, &[ME]);
                } else {
                    p.log.set_high_watermark(Offset(end));
                }
                assert!(p.log.high_watermark().0 > at.0);
                assert_eq!(wait.await, Err(MarkerError::NotLeader));
            }
            .boxed_local()
        });
    }
}
