//! The transaction coordinator of one shard: the transactional ids whose
//! `__transaction_state` partition this shard leads.
//!
//! Each request follows the same steps: locate the id's partition (this
//! shard must lead it and have loaded it: NOT_COORDINATOR /
//! COORDINATOR_LOAD_IN_PROGRESS otherwise), check the request against the
//! id's state, mark the id pending, write the new state to the partition,
//! wait until it is written (durable under `--fsync-acks`), then apply it and
//! answer. EndTxn answers once Prepare* is written; the markers are then
//! written by [`TxnCoordinator::complete`] in the background — to local
//! partitions directly, to other shards' partitions over the router — and
//! Complete* is written last. A coordinator that loads a partition finishes
//! every transaction it finds in Prepare* the same way.
//!
//! A request that finds its id busy (a transition being written, or markers
//! being written) would get CONCURRENT_TRANSACTIONS, and the client would
//! retry after its backoff (librdkafka: 20 ms for AddPartitionsToTxn). The
//! common case is a producer that begins its next transaction as soon as
//! EndTxn is answered, while the markers and Complete* are still being
//! written; so such a request first waits, at most
//! [`SETTLE_WAIT_MS_MAX`], for the id to settle and is then checked against
//! the settled state — the answer a retry at that moment would get. Only
//! when the id is still busy after that is CONCURRENT_TRANSACTIONS sent.
//!
//! Loading: a partition's ids are installed only from a replay that read
//! the whole log. A replay that fails (the log cannot be read, or a
//! transaction record does not decode) installs nothing: the partition's
//! ids answer COORDINATOR_LOAD_IN_PROGRESS, and the load is tried again in
//! the background after [`LOAD_RETRY_BACKOFF_MS_MIN`], doubling up to
//! [`LOAD_RETRY_BACKOFF_MS_MAX`]. Serving a partial replay would hand out
//! stale epochs (a fenced producer let back in) or forget open
//! transactions, and the next write would make that permanent. Records
//! whose key has an unknown version are skipped, as Kafka skips them.
//!
//! Expiration ([`TxnCoordinator::remove_expired_ids`], see [`super`]): a
//! timer started with the first load looks for expired ids, marks them
//! pending, writes their tombstones and then drops them.

use super::log::{decode_key, decode_value, encode_value, is_known_key_version, try_encode_key};
use super::{
    id_expiration_check_interval_ms, TxnMarker, TxnMetadata, TxnState, TRANSACTION_MAX_TIMEOUT_MS,
};
use crate::metadata::internal::{coordinator_partition, TRANSACTION_STATE};
use crate::record::{BatchBuilder, Compression};
use crate::shard::messages::ShardMessage;
use crate::shard::router::CallError;
use crate::shard::{now_ms, PartitionState, ShardCtx};
use crate::types::TopicPartition;
use futures::channel::oneshot;
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::rc::Rc;
use std::time::Duration;

/// Coordinator epoch written in markers: leadership of a
/// `__transaction_state` partition never moves on one node.
pub const COORDINATOR_EPOCH: i32 = 0;
/// Attempts to deliver a transaction's markers before giving up until the
/// next load of the partition.
const MARKER_ATTEMPTS_MAX: u32 = 50;
const MARKER_RETRY_BACKOFF_MS: u64 = 100;
/// How long a request that finds its transactional id busy waits for it to
/// settle before answering CONCURRENT_TRANSACTIONS: a few marker and
/// state writes on a slow disk; past that the client's own retry takes over.
pub const SETTLE_WAIT_MS_MAX: u64 = 50;
/// First pause before a failed load of a `__transaction_state` partition is
/// tried again (an I/O error may pass; a corrupt record is logged again).
pub const LOAD_RETRY_BACKOFF_MS_MIN: u64 = 1_000;
/// Longest pause between two load attempts of one partition.
pub const LOAD_RETRY_BACKOFF_MS_MAX: u64 = 60_000;
/// Tombstones per batch when expired ids are removed.
pub const TOMBSTONES_PER_BATCH_MAX: usize = 500;

/// Why a transactional request was refused; mapped to Kafka's error codes
/// in `handlers::errors`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TxnError {
    #[error("this shard is not the coordinator of the transactional id")]
    NotCoordinator,
    #[error("the transaction state topic does not exist yet")]
    CoordinatorNotAvailable,
    #[error("the coordinator is loading its state")]
    CoordinatorLoadInProgress,
    #[error("another operation on this transactional id is in progress")]
    ConcurrentTransactions,
    #[error("the producer id does not match the transactional id")]
    InvalidProducerIdMapping,
    #[error("the producer has been fenced by a newer epoch")]
    ProducerFenced,
    #[error("the request is not valid in the transaction's state")]
    InvalidTxnState,
    #[error("the transaction timeout is larger than transaction.max.timeout.ms")]
    InvalidTransactionTimeout,
    #[error("writing the transaction state failed")]
    Storage,
}

#[derive(Default)]
pub struct TxnCoordinator {
    txns: RefCell<HashMap<String, TxnMetadata>>,
    /// `__transaction_state` partitions whose state has been replayed.
    loaded: RefCell<HashSet<i32>>,
    /// Ids whose markers a task is writing now.
    completing: RefCell<HashSet<String>>,
    /// Requests waiting for an id to settle ([`Self::settle`]), woken when
    /// its pending write ends.
    settle_waiters: RefCell<HashMap<String, Vec<oneshot::Sender<()>>>>,
    /// Whether the expiration timer runs.
    expiration_started: Cell<bool>,
}

impl TxnCoordinator {
    /// A copy of the id's state, for DescribeTransactions and tests.
    pub fn get(&self, id: &str) -> Option<TxnMetadata> {
        self.txns.borrow().get(id).cloned()
    }

    /// Every transactional id this shard coordinates.
    pub fn all(&self) -> Vec<TxnMetadata> {
        self.txns.borrow().values().cloned().collect()
    }

    /// The id's `__transaction_state` partition, if this shard leads it and
    /// has loaded it.
    fn locate(&self, ctx: &ShardCtx, id: &str) -> Result<Rc<PartitionState>, TxnError> {
        let image = ctx.image();
        let Some(topic) = image.topic(TRANSACTION_STATE) else {
            return Err(TxnError::CoordinatorNotAvailable);
        };
        let p = coordinator_partition(id, topic.partition_count());
        let Some(state) = ctx.partition(&TopicPartition::new(TRANSACTION_STATE, p)) else {
            return Err(TxnError::NotCoordinator);
        };
        if !self.loaded.borrow().contains(&p) {
            return Err(TxnError::CoordinatorLoadInProgress);
        }
        Ok(state)
    }

    /// Whether a transition of the id is being written or its markers are.
    fn busy(&self, id: &str) -> bool {
        self.txns.borrow().get(id).is_some_and(TxnMetadata::busy)
    }

    /// Waits, at most [`SETTLE_WAIT_MS_MAX`], until the id is not busy; the
    /// caller then checks the request against the state it finds.
    async fn settle(&self, id: &str) {
        let deadline = std::time::Instant::now() + Duration::from_millis(SETTLE_WAIT_MS_MAX);
        while self.busy(id) {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return;
            }
            let (tx, rx) = oneshot::channel();
            {
                let mut waiters = self.settle_waiters.borrow_mut();
                let list = waiters.entry(id.to_owned()).or_default();
                // Waiters that timed out are dropped here, so a list stays
                // as short as the number of requests waiting now.
                list.retain(|w| !w.is_canceled());
                list.push(tx);
            }
            let timer = Box::pin(glommio::timer::sleep(left));
            let _ = futures::future::select(rx, timer).await;
        }
    }

    /// Wakes the requests waiting for the id to settle: its pending write
    /// ended (they re-check whether it is still busy).
    fn wake_settled(&self, id: &str) {
        let woken = self.settle_waiters.borrow_mut().remove(id);
        for w in woken.into_iter().flatten() {
            let _ = w.send(());
        }
    }

    /// Replays a `__transaction_state` partition this shard just opened,
    /// then finishes the transactions it left half-ended. A failed replay
    /// leaves the partition loading and is retried in the background.
    pub async fn load_partition(&self, ctx: &Rc<ShardCtx>, state: &Rc<PartitionState>) {
        self.start_id_expiration(ctx);
        let Err(e) = self.try_load(ctx, state).await else {
            return;
        };
        tracing::error!(
            tp = %state.tp,
            error = %e,
            retry_in_ms = LOAD_RETRY_BACKOFF_MS_MIN,
            "loading transaction state failed; its transactional ids stay loading"
        );
        let (weak, state) = (Rc::downgrade(ctx), state.clone());
        glommio::spawn_local(async move {
            let mut backoff_ms = LOAD_RETRY_BACKOFF_MS_MIN;
            loop {
                glommio::timer::sleep(Duration::from_millis(backoff_ms)).await;
                let Some(ctx) = weak.upgrade() else {
                    return;
                };
                // Only while this shard still leads the partition, on the
                // same log, and nothing loaded it meanwhile.
                let same_log = ctx
                    .partition(&state.tp)
                    .is_some_and(|p| Rc::ptr_eq(&p.log, &state.log));
                if !same_log || ctx.txn.loaded.borrow().contains(&state.tp.partition.0) {
                    return;
                }
                backoff_ms = (backoff_ms * 2).min(LOAD_RETRY_BACKOFF_MS_MAX);
                match ctx.txn.try_load(&ctx, &state).await {
                    Ok(()) => return,
                    Err(e) => tracing::error!(
                        tp = %state.tp,
                        error = %e,
                        retry_in_ms = backoff_ms,
                        "loading transaction state failed; its transactional ids stay loading"
                    ),
                }
            }
        })
        .detach();
    }

    /// One load attempt: replays the whole partition, and only if every
    /// record replayed installs its ids and marks the partition loaded.
    async fn try_load(&self, ctx: &Rc<ShardCtx>, state: &Rc<PartitionState>) -> Result<(), String> {
        let p = state.tp.partition.0;
        let mut found: BTreeMap<String, Option<TxnMetadata>> = BTreeMap::new();
        let mut failed: Option<String> = None;
        let scan = state
            .log
            .scan(
                crate::types::Offset(state.log.log_start_offset().0),
                &mut |h, bytes| {
                    if failed.is_some() || h.is_control() {
                        return;
                    }
                    if let Err(reason) = replay_batch(bytes, &mut found) {
                        failed = Some(format!("batch at offset {}: {reason}", h.base_offset));
                    }
                },
            )
            .await;
        scan.map_err(|e| format!("reading the log failed: {e}"))?;
        if let Some(reason) = failed {
            return Err(reason);
        }
        let mut unfinished = Vec::new();
        {
            let mut txns = self.txns.borrow_mut();
            for (id, meta) in found {
                match meta {
                    Some(m) => {
                        if m.state.is_preparing() {
                            unfinished.push(id.clone());
                        }
                        txns.insert(id, m);
                    }
                    None => {
                        txns.remove(&id);
                    }
                }
            }
        }
        self.loaded.borrow_mut().insert(p);
        tracing::info!(tp = %state.tp, unfinished = unfinished.len(), "transaction state loaded");
        for id in unfinished {
            spawn_complete(ctx, id);
        }
        Ok(())
    }

    /// Starts, once, the timer that removes expired transactional ids.
    fn start_id_expiration(&self, ctx: &Rc<ShardCtx>) {
        if self.expiration_started.replace(true) {
            return;
        }
        let interval_ms =
            id_expiration_check_interval_ms(ctx.config.transactional_id_expiration_ms);
        let weak = Rc::downgrade(ctx);
        glommio::spawn_local(async move {
            loop {
                glommio::timer::sleep(Duration::from_millis(interval_ms)).await;
                let Some(ctx) = weak.upgrade() else {
                    return;
                };
                ctx.txn.remove_expired_ids(&ctx).await;
            }
        })
        .detach();
    }

    /// Removes the transactional ids idle for `transactional.id.expiration.ms`
    /// (Kafka's `removeExpiredTransactionalIds`): each is marked pending (a
    /// request for it waits or gets CONCURRENT_TRANSACTIONS), a tombstone
    /// for its key is written to its partition, and once that is written
    /// the id is dropped; if the write fails the id stays as it was.
    pub async fn remove_expired_ids(&self, ctx: &Rc<ShardCtx>) {
        let image = ctx.image();
        let Some(topic) = image.topic(TRANSACTION_STATE) else {
            return;
        };
        let partitions = topic.partition_count();
        let now = now_ms();
        let expiration_ms = ctx.config.transactional_id_expiration_ms;
        let mut by_partition: BTreeMap<i32, Vec<String>> = BTreeMap::new();
        for m in self.txns.borrow_mut().values_mut() {
            if m.id_expired(now, expiration_ms) {
                m.pending = true;
                let p = coordinator_partition(&m.transactional_id, partitions);
                by_partition
                    .entry(p)
                    .or_default()
                    .push(m.transactional_id.clone());
            }
        }
        for (p, ids) in by_partition {
            let state = ctx.partition(&TopicPartition::new(TRANSACTION_STATE, p));
            for chunk in ids.chunks(TOMBSTONES_PER_BATCH_MAX) {
                let written = match &state {
                    Some(state) => self.write_tombstones(ctx, state, chunk).await,
                    None => Err(TxnError::NotCoordinator),
                };
                {
                    let mut txns = self.txns.borrow_mut();
                    for id in chunk {
                        if written.is_ok() {
                            txns.remove(id);
                        } else if let Some(m) = txns.get_mut(id) {
                            m.pending = false;
                        }
                    }
                }
                for id in chunk {
                    self.wake_settled(id);
                }
                match written {
                    Ok(()) => tracing::info!(
                        partition = p,
                        ids = chunk.len(),
                        "removed expired transactional ids"
                    ),
                    Err(e) => tracing::warn!(
                        partition = p,
                        error = %e,
                        "expired transactional ids not removed; retried at the next check"
                    ),
                }
            }
        }
    }

    /// Writes one batch of tombstones (null values) for `ids` and waits
    /// until it is written (durable under `--fsync-acks`).
    async fn write_tombstones(
        &self,
        ctx: &ShardCtx,
        state: &PartitionState,
        ids: &[String],
    ) -> Result<(), TxnError> {
        let now = now_ms();
        let mut builder = BatchBuilder::new(Compression::None);
        for id in ids {
            let key = try_encode_key(id).map_err(|_| TxnError::Storage)?;
            builder = builder.record(Some(&key), None, &[], now);
        }
        append_acked(ctx, state, builder.build()).await.map_err(|e| {
            tracing::error!(tp = %state.tp, error = %e, "writing transactional id tombstones failed");
            TxnError::Storage
        })
    }

    /// Writes `next` as the id's new state, then applies it. The id must
    /// have been marked pending by the caller.
    async fn persist(
        &self,
        ctx: &ShardCtx,
        state: &PartitionState,
        next: TxnMetadata,
    ) -> Result<(), TxnError> {
        // InitProducerId refuses ids too long for the key; one that got
        // past it is not written.
        let written = match try_encode_key(&next.transactional_id) {
            Err(e) => Err(crate::log::LogError::Corrupt(e.to_string())),
            Ok(key) => {
                let batch = BatchBuilder::new(Compression::None)
                    .record(Some(&key), Some(&encode_value(&next)), &[], now_ms())
                    .build();
                append_acked(ctx, state, batch).await
            }
        };
        let id = next.transactional_id.clone();
        let result = {
            let mut txns = self.txns.borrow_mut();
            match written {
                Ok(()) => {
                    let mut next = next;
                    next.pending = false;
                    txns.insert(id.clone(), next);
                    Ok(())
                }
                Err(e) => {
                    tracing::error!(tp = %state.tp, error = %e, "writing transaction state failed");
                    if let Some(m) = txns.get_mut(&id) {
                        m.pending = false;
                    }
                    Err(TxnError::Storage)
                }
            }
        };
        self.wake_settled(&id);
        result
    }

    /// Marks the id pending (it must exist and not be pending already).
    fn begin(&self, id: &str) -> Result<TxnMetadata, TxnError> {
        let mut txns = self.txns.borrow_mut();
        let Some(m) = txns.get_mut(id) else {
            return Err(TxnError::InvalidProducerIdMapping);
        };
        if m.pending {
            return Err(TxnError::ConcurrentTransactions);
        }
        m.pending = true;
        Ok(m.clone())
    }

    fn end_pending(&self, id: &str) {
        if let Some(m) = self.txns.borrow_mut().get_mut(id) {
            m.pending = false;
        }
        self.wake_settled(id);
    }

    /// InitProducerId with a transactional id.
    pub async fn init_producer_id(
        &self,
        ctx: &Rc<ShardCtx>,
        id: &str,
        timeout_ms: i32,
        expected: Option<(i64, i16)>,
    ) -> Result<(i64, i16), TxnError> {
        if timeout_ms <= 0 || timeout_ms > TRANSACTION_MAX_TIMEOUT_MS {
            return Err(TxnError::InvalidTransactionTimeout);
        }
        if ctx.image().topic(TRANSACTION_STATE).is_none() {
            // Clients find their coordinator first, which creates the topic;
            // a client that did not is told to, once it exists.
            ctx.ensure_internal_topic(TRANSACTION_STATE)
                .await
                .map_err(|_| TxnError::CoordinatorNotAvailable)?;
        }
        let state = self.locate(ctx, id)?;
        self.settle(id).await;
        let now = now_ms();
        let existing = self.txns.borrow().get(id).cloned();
        let Some(current) = existing else {
            ctx.maybe_request_producer_ids();
            let Some(pid) = ctx.producer_ids.take() else {
                return Err(TxnError::CoordinatorLoadInProgress);
            };
            let mut m = TxnMetadata::new(id, pid, timeout_ms, now);
            m.pending = true;
            self.txns.borrow_mut().insert(id.to_owned(), m.clone());
            if let Err(e) = self.persist(ctx, &state, m).await {
                self.txns.borrow_mut().remove(id);
                return Err(e);
            }
            return Ok((pid, 0));
        };
        if current.busy() {
            return Err(TxnError::ConcurrentTransactions);
        }
        // KIP-360: a producer that names its (id, epoch) must be the current
        // one; a stale instance must not abort the live producer's work.
        if let Some((pid, epoch)) = expected {
            if pid >= 0 && (pid != current.producer_id || epoch != current.producer_epoch) {
                return Err(TxnError::ProducerFenced);
            }
        }
        if current.state == TxnState::Ongoing {
            // Fence the open transaction: abort it under a bumped epoch; the
            // client retries and then gets the epoch after that.
            let m = self.begin(id)?;
            let mut next = m;
            next.state = TxnState::PrepareAbort;
            next.producer_epoch = next.producer_epoch.saturating_add(1);
            next.last_update_ms = now;
            self.persist(ctx, &state, next).await?;
            spawn_complete(ctx, id.to_owned());
            return Err(TxnError::ConcurrentTransactions);
        }
        let m = self.begin(id)?;
        let mut next = m;
        if next.producer_epoch >= i16::MAX - 1 {
            ctx.maybe_request_producer_ids();
            let Some(pid) = ctx.producer_ids.take() else {
                self.end_pending(id);
                return Err(TxnError::CoordinatorLoadInProgress);
            };
            next.producer_id = pid;
            next.producer_epoch = 0;
        } else {
            next.producer_epoch += 1;
        }
        next.state = TxnState::Empty;
        next.partitions.clear();
        next.timeout_ms = timeout_ms;
        next.start_ms = -1;
        next.last_update_ms = now;
        let answer = (next.producer_id, next.producer_epoch);
        self.persist(ctx, &state, next).await?;
        Ok(answer)
    }

    /// Checks that `pid`/`epoch` are the id's current producer.
    fn check_producer(m: &TxnMetadata, pid: i64, epoch: i16) -> Result<(), TxnError> {
        if m.producer_id != pid {
            return Err(TxnError::InvalidProducerIdMapping);
        }
        if m.producer_epoch != epoch {
            return Err(TxnError::ProducerFenced);
        }
        Ok(())
    }

    /// AddPartitionsToTxn (and AddOffsetsToTxn, with the group's offsets
    /// partition): the partitions join the open transaction.
    pub async fn add_partitions(
        &self,
        ctx: &Rc<ShardCtx>,
        id: &str,
        pid: i64,
        epoch: i16,
        partitions: &[TopicPartition],
    ) -> Result<(), TxnError> {
        let state = self.locate(ctx, id)?;
        self.settle(id).await;
        let Some(current) = self.get(id) else {
            return Err(TxnError::InvalidProducerIdMapping);
        };
        Self::check_producer(&current, pid, epoch)?;
        if current.busy() {
            return Err(TxnError::ConcurrentTransactions);
        }
        if !current.state.can_transition_to(TxnState::Ongoing) {
            return Err(TxnError::InvalidTxnState);
        }
        if current.state == TxnState::Ongoing
            && partitions.iter().all(|tp| current.partitions.contains(tp))
        {
            return Ok(());
        }
        let mut next = self.begin(id)?;
        let now = now_ms();
        if next.state != TxnState::Ongoing {
            next.start_ms = now;
            next.partitions.clear();
        }
        next.state = TxnState::Ongoing;
        next.partitions.extend(partitions.iter().cloned());
        next.last_update_ms = now;
        self.persist(ctx, &state, next).await
    }

    /// A partition leader's request: add `partitions` (transaction version
    /// 2) or verify that they are in the open transaction (version 1).
    pub async fn add_or_verify(
        &self,
        ctx: &Rc<ShardCtx>,
        id: &str,
        pid: i64,
        epoch: i16,
        partitions: &[TopicPartition],
        verify_only: bool,
    ) -> Result<(), TxnError> {
        if verify_only {
            partitions
                .iter()
                .try_for_each(|tp| self.verify_partition(ctx, id, pid, epoch, tp))
        } else {
            self.add_partitions(ctx, id, pid, epoch, partitions).await
        }
    }

    /// Whether `tp` is part of the id's open transaction (the verify-only
    /// form of AddPartitionsToTxn).
    pub fn verify_partition(
        &self,
        ctx: &ShardCtx,
        id: &str,
        pid: i64,
        epoch: i16,
        tp: &TopicPartition,
    ) -> Result<(), TxnError> {
        self.locate(ctx, id)?;
        let Some(m) = self.get(id) else {
            return Err(TxnError::InvalidProducerIdMapping);
        };
        Self::check_producer(&m, pid, epoch)?;
        if m.state == TxnState::Ongoing && m.partitions.contains(tp) {
            Ok(())
        } else {
            Err(TxnError::InvalidTxnState)
        }
    }

    /// EndTxn. `tv2` for clients on transaction version 2 (EndTxn v5+),
    /// whose epoch is bumped by every EndTxn. Returns the producer id and
    /// epoch the client continues with.
    pub async fn end_txn(
        &self,
        ctx: &Rc<ShardCtx>,
        id: &str,
        pid: i64,
        epoch: i16,
        commit: bool,
        tv2: bool,
    ) -> Result<(i64, i16), TxnError> {
        let state = self.locate(ctx, id)?;
        self.settle(id).await;
        let Some(current) = self.get(id) else {
            return Err(TxnError::InvalidProducerIdMapping);
        };
        if current.producer_id != pid {
            return Err(TxnError::InvalidProducerIdMapping);
        }
        // A retry of an EndTxn that already completed: same answer.
        let retried = match current.state {
            TxnState::CompleteCommit => commit,
            TxnState::CompleteAbort => !commit,
            _ => false,
        };
        let epoch_ok = current.producer_epoch == epoch
            || (tv2 && current.producer_epoch == epoch.saturating_add(1));
        if retried && epoch_ok && !current.pending {
            return Ok((current.producer_id, current.producer_epoch));
        }
        // A version-2 retry while the markers are still being written: the
        // epoch was bumped by the first attempt, so it is not a fenced
        // producer but one that must wait.
        let preparing_same = match current.state {
            TxnState::PrepareCommit => commit,
            TxnState::PrepareAbort => !commit,
            _ => false,
        };
        if tv2 && preparing_same && current.producer_epoch == epoch.saturating_add(1) {
            return Err(TxnError::ConcurrentTransactions);
        }
        if current.producer_epoch != epoch {
            return Err(TxnError::ProducerFenced);
        }
        if current.busy() {
            return Err(TxnError::ConcurrentTransactions);
        }
        let target = if commit {
            TxnState::PrepareCommit
        } else {
            TxnState::PrepareAbort
        };
        let empty_allowed = tv2 && current.state != TxnState::Ongoing;
        if current.state != TxnState::Ongoing && !empty_allowed {
            return Err(TxnError::InvalidTxnState);
        }
        if !current.state.can_transition_to(target) {
            return Err(TxnError::InvalidTxnState);
        }
        // Version 2 bumps the epoch per transaction. When it would run out,
        // the markers still use the old id at the bumped epoch and the
        // client continues with a new id at epoch 0 (Kafka's NextProducerId).
        let rotate = tv2 && current.producer_epoch >= i16::MAX - 2;
        let next_pid = if rotate {
            ctx.maybe_request_producer_ids();
            match ctx.producer_ids.take() {
                Some(pid) => Some(pid),
                None => return Err(TxnError::CoordinatorLoadInProgress),
            }
        } else {
            None
        };
        let mut next = self.begin(id)?;
        if tv2 {
            next.producer_epoch = next.producer_epoch.saturating_add(1);
            next.client_txn_version = 2;
        }
        next.next_producer_id = next_pid;
        if next.state != TxnState::Ongoing {
            next.partitions.clear();
        }
        next.state = target;
        next.last_update_ms = now_ms();
        let answer = match next.next_producer_id {
            Some(pid) => (pid, 0),
            None => (next.producer_id, next.producer_epoch),
        };
        self.persist(ctx, &state, next).await?;
        spawn_complete(ctx, id.to_owned());
        Ok(answer)
    }

    /// Writes the markers of a transaction in Prepare*, then Complete*.
    pub async fn complete(&self, ctx: &Rc<ShardCtx>, id: &str) {
        let delay_ms = ctx.config.debug_delay_txn_markers_ms;
        if delay_ms > 0 {
            glommio::timer::sleep(Duration::from_millis(delay_ms)).await;
        }
        let Ok(state) = self.locate(ctx, id) else {
            return;
        };
        let Some(m) = self.get(id) else { return };
        if !m.state.is_preparing() {
            return;
        }
        let commit = m.state == TxnState::PrepareCommit;
        let mut todo: Vec<TxnMarker> = m
            .partitions
            .iter()
            .map(|tp| TxnMarker {
                tp: tp.clone(),
                producer_id: m.producer_id,
                producer_epoch: m.producer_epoch,
                coordinator_epoch: COORDINATOR_EPOCH,
                commit,
                tv2: m.client_txn_version >= 2,
            })
            .collect();
        let mut attempts = 0;
        while !todo.is_empty() {
            attempts += 1;
            let results = send_markers(ctx, std::mem::take(&mut todo)).await;
            for (marker, code) in results {
                // A partition is skipped only when this shard's own image no
                // longer has it (its topic was deleted), as Kafka's marker
                // channel does; a leader that does not know it yet (it is
                // still applying the image, at start-up) is asked again.
                let deleted = code == kafka_protocol::ResponseError::UnknownTopicOrPartition.code()
                    && !partition_exists(ctx, &marker.tp);
                let retriable = code != 0
                    && !deleted
                    && code != kafka_protocol::ResponseError::InvalidProducerEpoch.code();
                if retriable {
                    todo.push(marker);
                } else if code != 0 {
                    tracing::warn!(tp = %marker.tp, code, "transaction marker not written; skipping the partition");
                }
            }
            if !todo.is_empty() {
                if attempts >= MARKER_ATTEMPTS_MAX {
                    tracing::error!(
                        transactional_id = id,
                        "giving up on transaction markers until the coordinator reloads"
                    );
                    return;
                }
                glommio::timer::sleep(Duration::from_millis(MARKER_RETRY_BACKOFF_MS)).await;
            }
        }
        let Ok(mut next) = self.begin(id) else { return };
        next.state = if commit {
            TxnState::CompleteCommit
        } else {
            TxnState::CompleteAbort
        };
        next.partitions.clear();
        next.last_update_ms = now_ms();
        if let Some(pid) = next.next_producer_id.take() {
            next.producer_id = pid;
            next.producer_epoch = 0;
        }
        if let Err(e) = self.persist(ctx, &state, next).await {
            tracing::error!(transactional_id = id, error = %e, "writing Complete* failed; retried by the next sweep");
        }
    }

    /// Aborts open transactions that outlived their timeout, bumping the
    /// epoch so the late producer is fenced.
    pub async fn abort_expired(&self, ctx: &Rc<ShardCtx>) {
        let now = now_ms();
        let expired: Vec<String> = self
            .txns
            .borrow()
            .values()
            .filter(|m| !m.pending && m.expired(now))
            .map(|m| m.transactional_id.clone())
            .collect();
        for id in expired {
            let Ok(state) = self.locate(ctx, &id) else {
                continue;
            };
            let Ok(mut next) = self.begin(&id) else {
                continue;
            };
            // Re-check after the awaits of earlier ids: the client may have
            // ended this transaction meanwhile.
            if !next.expired(now_ms()) {
                self.end_pending(&id);
                continue;
            }
            tracing::info!(transactional_id = %id, "aborting a timed-out transaction");
            next.state = TxnState::PrepareAbort;
            next.producer_epoch = next.producer_epoch.saturating_add(1);
            next.last_update_ms = now;
            if self.persist(ctx, &state, next).await.is_ok() {
                spawn_complete(ctx, id);
            }
        }
        // Transactions left in Prepare* (markers gave up, or Complete* could
        // not be written) are finished by a new attempt.
        let stuck: Vec<String> = self
            .txns
            .borrow()
            .values()
            .filter(|m| !m.pending && m.state.is_preparing())
            .map(|m| m.transactional_id.clone())
            .filter(|id| !self.completing.borrow().contains(id))
            .collect();
        for id in stuck {
            spawn_complete(ctx, id);
        }
    }
}

/// Replays one (data) batch of `__transaction_state` into `found`: the
/// newest state of each id, `None` after a tombstone. A record without a
/// key, a transaction record that does not decode or a batch that does not
/// decode is an error; a key of an unknown version is skipped with a
/// warning, as Kafka does.
fn replay_batch(
    bytes: &[u8],
    found: &mut BTreeMap<String, Option<TxnMetadata>>,
) -> Result<(), String> {
    let (_, records) =
        crate::record::decode_batch(bytes).map_err(|e| format!("undecodable batch: {e}"))?;
    for r in records {
        let key = r.key.as_deref().ok_or("a record without a key")?;
        let version = key
            .get(..2)
            .map(|v| i16::from_be_bytes([v[0], v[1]]))
            .ok_or("a key shorter than its version")?;
        if !is_known_key_version(version) {
            tracing::warn!(version, "unknown __transaction_state record type skipped");
            continue;
        }
        let id = decode_key(key).map_err(|e| e.to_string())?;
        let meta = match r.value.as_deref() {
            None => None,
            Some(v) => Some(decode_value(&id, v).map_err(|e| e.to_string())?),
        };
        found.insert(id, meta);
    }
    Ok(())
}

/// Appends `batch` to the coordinator's partition and waits as an acks=-1
/// write does (durable under `--fsync-acks`).
async fn append_acked(
    ctx: &ShardCtx,
    state: &PartitionState,
    batch: bytes::BytesMut,
) -> Result<(), crate::log::LogError> {
    let info = state.log.append(batch)?;
    state
        .log
        .wait_acked(info.last_offset, ctx.config.fsync_acks)
        .await
}

/// Whether this shard's metadata image has `tp`.
fn partition_exists(ctx: &ShardCtx, tp: &TopicPartition) -> bool {
    ctx.image()
        .topic(&tp.topic)
        .is_some_and(|t| tp.partition.0 >= 0 && tp.partition.0 < t.partition_count())
}

/// Starts writing a transaction's markers unless a task already is.
fn spawn_complete(ctx: &Rc<ShardCtx>, id: String) {
    if !ctx.txn.completing.borrow_mut().insert(id.clone()) {
        return;
    }
    let ctx = ctx.clone();
    glommio::spawn_local(async move {
        ctx.txn.complete(&ctx, &id).await;
        ctx.txn.completing.borrow_mut().remove(&id);
    })
    .detach();
}

/// Delivers markers to the shards leading their partitions; returns an
/// error code per marker (UNKNOWN_TOPIC_OR_PARTITION for deleted ones).
async fn send_markers(ctx: &Rc<ShardCtx>, markers: Vec<TxnMarker>) -> Vec<(TxnMarker, i16)> {
    let image = ctx.image();
    let mut by_shard: BTreeMap<usize, Vec<TxnMarker>> = BTreeMap::new();
    let mut out = Vec::new();
    for m in markers {
        match image.leader_shard(&m.tp.topic, m.tp.partition.0, ctx.cores()) {
            Some(shard) => by_shard.entry(shard).or_default().push(m),
            None => out.push((
                m,
                kafka_protocol::ResponseError::UnknownTopicOrPartition.code(),
            )),
        }
    }
    // Remote shards concurrently, all until one deadline (see `router`): a
    // marker that timed out gets REQUEST_TIMED_OUT, and `complete` retries
    // it; one the slow shard writes after all is then refused as stale or
    // written twice, both harmless.
    let deadline = ctx.router.deadline();
    let local = by_shard.remove(&ctx.shard);
    let mut remote = Vec::new();
    for (shard, batch) in by_shard {
        remote.push(async move {
            let call = ctx
                .router
                .call(shard, deadline, |reply| ShardMessage::WriteTxnMarkers {
                    markers: batch.clone(),
                    reply,
                });
            match call.await {
                Ok(results) => results,
                Err(e) => {
                    let code = match e {
                        CallError::TimedOut(_) => {
                            tracing::warn!(
                                shard,
                                "transaction markers timed out at another shard; retrying"
                            );
                            kafka_protocol::ResponseError::RequestTimedOut.code()
                        }
                        CallError::Unreachable(_) => {
                            kafka_protocol::ResponseError::CoordinatorNotAvailable.code()
                        }
                    };
                    batch.into_iter().map(|m| (m, code)).collect()
                }
            }
        });
    }
    let local = async {
        match local {
            Some(batch) => ctx.write_txn_markers(batch).await,
            None => Vec::new(),
        }
    };
    let (local, remote) = futures::future::join(local, futures::future::join_all(remote)).await;
    out.extend(local);
    for results in remote {
        out.extend(results);
    }
    out
}
