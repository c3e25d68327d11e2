//! The transaction coordinator of one shard: the transactional ids whose
//! `__transaction_state` partition this shard leads. It reaches its shard
//! only through the environment it is handed ([`super::env::TxnEnv`]:
//! partitions, producer ids, marker delivery), and decides every transition
//! with the pure functions of [`super::state`].
//!
//! Each request follows the same steps: locate the id's partition (this
//! shard must lead it and have loaded it: NOT_COORDINATOR /
//! COORDINATOR_LOAD_IN_PROGRESS otherwise), ask `state` for the transition
//! the request makes from the id's state, mark the id pending, write the new
//! state to the partition (`Partition::append_internal`), wait until it is
//! written (durable under `--fsync-acks`), then apply it and answer. EndTxn answers once Prepare* is written; the markers are then
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

use super::env::TxnEnv;
use super::log::{decode_key, decode_value, encode_value, is_known_key_version, try_encode_key};
use super::state;
use super::{id_expiration_check_interval_ms, TxnMarker, TxnMetadata, TxnState};
use crate::clock::{monotonic, now_ms};
use crate::log::LogError;
use crate::metadata::internal::{coordinator_partition, TRANSACTION_STATE};
use crate::partition::coordinator_log::CoordinatorWriteError;
use crate::partition::{AppendError, MarkerError, Partition};
use crate::record::{BatchBuilder, Compression};
use crate::types::TopicPartition;
use futures::channel::oneshot;
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::rc::Rc;
use std::time::Duration;

/// Markers are retried until written or until the coordinator loses the
/// transaction (Kafka's marker channel); every this many attempts the
/// wait is logged.
const MARKER_ATTEMPTS_LOGGED: u32 = 50;
/// First pause between two attempts, doubling up to the longest.
const MARKER_RETRY_BACKOFF_MS: u64 = 100;
const MARKER_RETRY_BACKOFF_MS_MAX: u64 = 1_000;
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

pub use super::state::TxnError;

#[derive(Default)]
pub struct TxnCoordinator {
    txns: RefCell<HashMap<String, TxnMetadata>>,
    /// `__transaction_state` partitions this shard took over, with the
    /// leader epoch it took each over in (-1 for a partition of one
    /// replica, which never moves): loading or loaded.
    held: RefCell<HashMap<i32, i32>>,
    /// Those of them whose state has been replayed.
    loaded: RefCell<HashSet<i32>>,
    /// Ids whose markers a task is writing now.
    completing: RefCell<HashSet<String>>,
    /// Requests waiting for an id to settle ([`Self::settle`]), woken when
    /// its pending write ends.
    settle_waiters: RefCell<HashMap<String, Vec<oneshot::Sender<()>>>>,
    /// Whether the expiration timer runs.
    expiration_started: Cell<bool>,
    /// Partitions of `__transaction_state` (as of the last one loaded).
    partition_count: Cell<i32>,
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
    fn locate<E: TxnEnv>(&self, env: &Rc<E>, id: &str) -> Result<Rc<Partition>, TxnError> {
        let image = env.image();
        let Some(topic) = image.topic(TRANSACTION_STATE) else {
            return Err(TxnError::CoordinatorNotAvailable);
        };
        let p = coordinator_partition(id, topic.partition_count());
        let Some(partition) = env.partition(&TopicPartition::new(TRANSACTION_STATE, p)) else {
            return Err(TxnError::NotCoordinator);
        };
        if !self.held.borrow().contains_key(&p) {
            return Err(TxnError::NotCoordinator);
        }
        if !self.loaded.borrow().contains(&p) {
            return Err(TxnError::CoordinatorLoadInProgress);
        }
        Ok(partition)
    }

    /// Whether a transition of the id is being written or its markers are.
    fn busy(&self, id: &str) -> bool {
        self.txns.borrow().get(id).is_some_and(TxnMetadata::busy)
    }

    /// Waits, at most [`SETTLE_WAIT_MS_MAX`], until the id is not busy; the
    /// caller then checks the request against the state it finds.
    async fn settle(&self, id: &str) {
        let deadline = monotonic() + Duration::from_millis(SETTLE_WAIT_MS_MAX);
        while self.busy(id) {
            let left = deadline.saturating_duration_since(monotonic());
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
            let _ = crate::metrics::remote_wait(futures::future::select(rx, timer)).await;
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

    /// The leader epoch this shard took `partition` over in, if it holds
    /// it (loading or loaded).
    pub fn held_epoch(&self, partition: i32) -> Option<i32> {
        self.held.borrow().get(&partition).copied()
    }

    /// The coordinator epoch markers of `partition`'s transactions carry:
    /// the leader epoch the partition was taken over in (Kafka's), 0 for
    /// a partition of one replica.
    fn coordinator_epoch(&self, partition: i32) -> i32 {
        self.held_epoch(partition).unwrap_or(0).max(0)
    }

    /// Gives up a `__transaction_state` partition this shard no longer
    /// leads (its leadership moved, `docs/replication.md` §4.6): its ids
    /// go; requests for them answer NOT_COORDINATOR and the new leader
    /// replays the log (and finishes what was half-ended). Marker tasks
    /// for them stop at their next step.
    pub fn unload_partition(&self, partition: i32) {
        if self.held.borrow_mut().remove(&partition).is_none() {
            return;
        }
        self.loaded.borrow_mut().remove(&partition);
        let count = self.txns.borrow().len();
        self.txns
            .borrow_mut()
            .retain(|id, _| coordinator_partition(id, self.partition_count.get()) != partition);
        let dropped = count - self.txns.borrow().len();
        tracing::info!(
            partition,
            transactional_ids = dropped,
            "transaction state partition unloaded"
        );
    }

    /// Replays a `__transaction_state` partition this shard just took
    /// over in leader epoch `epoch` (-1: a partition of one replica),
    /// then finishes the transactions it left half-ended. A failed replay
    /// leaves the partition loading and is retried in the background.
    pub async fn load_partition<E: TxnEnv>(
        &self,
        env: &Rc<E>,
        partition: &Rc<Partition>,
        partition_count: i32,
        epoch: i32,
    ) {
        self.partition_count.set(partition_count);
        self.held
            .borrow_mut()
            .insert(partition.tp.partition.0, epoch);
        self.loaded.borrow_mut().remove(&partition.tp.partition.0);
        self.start_id_expiration(env);
        let Err(e) = self.try_load(env, partition, epoch).await else {
            return;
        };
        tracing::error!(
            tp = %partition.tp,
            error = %e,
            retry_in_ms = LOAD_RETRY_BACKOFF_MS_MIN,
            "loading transaction state failed; its transactional ids stay loading"
        );
        let (weak, partition) = (Rc::downgrade(env), partition.clone());
        glommio::spawn_local(async move {
            let mut backoff_ms = LOAD_RETRY_BACKOFF_MS_MIN;
            loop {
                glommio::timer::sleep(Duration::from_millis(backoff_ms)).await;
                let Some(env) = weak.upgrade() else {
                    return;
                };
                // Only while this shard still leads the partition, on the
                // same log, and nothing loaded it meanwhile.
                if !env.coordinator().still_loading(&*env, &partition, epoch) {
                    return;
                }
                backoff_ms = (backoff_ms * 2).min(LOAD_RETRY_BACKOFF_MS_MAX);
                match env.coordinator().try_load(&env, &partition, epoch).await {
                    Ok(()) => return,
                    Err(e) => tracing::error!(
                        tp = %partition.tp,
                        error = %e,
                        retry_in_ms = backoff_ms,
                        "loading transaction state failed; its transactional ids stay loading"
                    ),
                }
            }
        })
        .detach();
    }

    /// Whether a load of `partition` taken over in `epoch` is still
    /// wanted: this shard leads it on the same log, holds it in that
    /// epoch, and has not loaded it.
    fn still_loading<E: TxnEnv>(&self, env: &E, partition: &Rc<Partition>, epoch: i32) -> bool {
        let p = partition.tp.partition.0;
        env.partition(&partition.tp)
            .is_some_and(|open| Rc::ptr_eq(&open.log, &partition.log))
            && self.held_epoch(p) == Some(epoch)
            && !self.loaded.borrow().contains(&p)
    }

    /// One load attempt: replays the whole partition, and only if every
    /// record replayed, and the partition is still held in `epoch`,
    /// installs its ids and marks the partition loaded.
    async fn try_load<E: TxnEnv>(
        &self,
        env: &Rc<E>,
        partition: &Rc<Partition>,
        epoch: i32,
    ) -> Result<(), String> {
        let p = partition.tp.partition.0;
        let mut found: BTreeMap<String, Option<TxnMetadata>> = BTreeMap::new();
        let mut failed: Option<String> = None;
        let scan = partition
            .log
            .scan(
                crate::types::Offset(partition.log.log_start_offset().0),
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
        if !self.still_loading(&**env, partition, epoch) {
            return Ok(()); // given up, or taken over again, meanwhile
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
        tracing::info!(tp = %partition.tp, unfinished = unfinished.len(), "transaction state loaded");
        for id in unfinished {
            spawn_complete(env, id);
        }
        Ok(())
    }

    /// Starts, once, the timer that removes expired transactional ids.
    fn start_id_expiration<E: TxnEnv>(&self, env: &Rc<E>) {
        if self.expiration_started.replace(true) {
            return;
        }
        let interval_ms =
            id_expiration_check_interval_ms(env.config().transactional_id_expiration_ms);
        let weak = Rc::downgrade(env);
        glommio::spawn_local(async move {
            loop {
                glommio::timer::sleep(Duration::from_millis(interval_ms)).await;
                let Some(env) = weak.upgrade() else {
                    return;
                };
                env.coordinator().remove_expired_ids(&env).await;
            }
        })
        .detach();
    }

    /// Removes the transactional ids idle for `transactional.id.expiration.ms`
    /// (Kafka's `removeExpiredTransactionalIds`): each is marked pending (a
    /// request for it waits or gets CONCURRENT_TRANSACTIONS), a tombstone
    /// for its key is written to its partition, and once that is written
    /// the id is dropped; if the write fails the id stays as it was.
    pub async fn remove_expired_ids<E: TxnEnv>(&self, env: &Rc<E>) {
        let image = env.image();
        let Some(topic) = image.topic(TRANSACTION_STATE) else {
            return;
        };
        let partitions = topic.partition_count();
        let now = now_ms();
        let expiration_ms = env.config().transactional_id_expiration_ms;
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
            let partition = env.partition(&TopicPartition::new(TRANSACTION_STATE, p));
            for chunk in ids.chunks(TOMBSTONES_PER_BATCH_MAX) {
                let written = match &partition {
                    Some(partition) => self.write_tombstones(env, partition, chunk).await,
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
    async fn write_tombstones<E: TxnEnv>(
        &self,
        env: &Rc<E>,
        partition: &Partition,
        ids: &[String],
    ) -> Result<(), TxnError> {
        let now = now_ms();
        let mut builder = BatchBuilder::new(Compression::None);
        for id in ids {
            let key = try_encode_key(id).map_err(|_| TxnError::Storage)?;
            builder = builder.record(Some(&key), None, &[], now);
        }
        append_acked(env, partition, builder.build()).await.map_err(|e| {
            tracing::error!(tp = %partition.tp, error = %e, "writing transactional id tombstones failed");
            e.answer()
        })
    }

    /// Writes `next` as the id's new state, then applies it. The id must
    /// have been marked pending by the caller.
    async fn persist<E: TxnEnv>(
        &self,
        env: &Rc<E>,
        partition: &Partition,
        next: TxnMetadata,
    ) -> Result<(), TxnError> {
        // InitProducerId refuses ids too long for the key; one that got
        // past it is not written.
        let written = match try_encode_key(&next.transactional_id) {
            Err(e) => Err(AppendError::Log(LogError::Corrupt(e.to_string())).into()),
            Ok(key) => {
                let batch = BatchBuilder::new(Compression::None)
                    .record(Some(&key), Some(&encode_value(&next)), &[], now_ms())
                    .build();
                append_acked(env, partition, batch).await
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
                    tracing::error!(tp = %partition.tp, error = %e, "writing transaction state failed");
                    if let Some(m) = txns.get_mut(&id) {
                        m.pending = false;
                    }
                    Err(e.answer())
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
    pub async fn init_producer_id<E: TxnEnv>(
        &self,
        env: &Rc<E>,
        id: &str,
        timeout_ms: i32,
        expected: Option<(i64, i16)>,
    ) -> Result<(i64, i16), TxnError> {
        state::check_timeout(timeout_ms)?;
        if env.image().topic(TRANSACTION_STATE).is_none() {
            // Clients find their coordinator first, which creates the topic;
            // a client that did not is told to, once it exists.
            env.ensure_transaction_topic()
                .await
                .map_err(|_| TxnError::CoordinatorNotAvailable)?;
        }
        let partition = self.locate(env, id)?;
        self.settle(id).await;
        let now = now_ms();
        let existing = self.txns.borrow().get(id).cloned();
        let Some(current) = existing else {
            let Some(pid) = env.allocate_producer_id() else {
                return Err(TxnError::CoordinatorLoadInProgress);
            };
            let mut m = TxnMetadata::new(id, pid, timeout_ms, now);
            m.pending = true;
            self.txns.borrow_mut().insert(id.to_owned(), m.clone());
            if let Err(e) = self.persist(env, &partition, m).await {
                self.txns.borrow_mut().remove(id);
                return Err(e);
            }
            return Ok((pid, 0));
        };
        match state::init_producer_id(&current, expected, timeout_ms, now)? {
            state::Init::FenceOngoing(next) => {
                self.begin(id)?;
                self.persist(env, &partition, next).await?;
                spawn_complete(env, id.to_owned());
                Err(TxnError::ConcurrentTransactions)
            }
            state::Init::Reset {
                mut next,
                new_producer_id,
            } => {
                self.begin(id)?;
                if new_producer_id {
                    let Some(pid) = env.allocate_producer_id() else {
                        self.end_pending(id);
                        return Err(TxnError::CoordinatorLoadInProgress);
                    };
                    next.producer_id = pid;
                }
                let answer = (next.producer_id, next.producer_epoch);
                self.persist(env, &partition, next).await?;
                Ok(answer)
            }
        }
    }

    /// AddPartitionsToTxn (and AddOffsetsToTxn, with the group's offsets
    /// partition): the partitions join the open transaction.
    pub async fn add_partitions<E: TxnEnv>(
        &self,
        env: &Rc<E>,
        id: &str,
        pid: i64,
        epoch: i16,
        partitions: &[TopicPartition],
    ) -> Result<(), TxnError> {
        let partition = self.locate(env, id)?;
        self.settle(id).await;
        let Some(current) = self.get(id) else {
            return Err(TxnError::InvalidProducerIdMapping);
        };
        let Some(next) = state::add_partitions(&current, pid, epoch, partitions, now_ms())? else {
            return Ok(());
        };
        self.begin(id)?;
        self.persist(env, &partition, next).await
    }

    /// A partition leader's request: add `partitions` (transaction version
    /// 2) or verify that they are in the open transaction (version 1).
    pub async fn add_or_verify<E: TxnEnv>(
        &self,
        env: &Rc<E>,
        id: &str,
        pid: i64,
        epoch: i16,
        partitions: &[TopicPartition],
        verify_only: bool,
    ) -> Result<(), TxnError> {
        if verify_only {
            partitions
                .iter()
                .try_for_each(|tp| self.verify_partition(env, id, pid, epoch, tp))
        } else {
            self.add_partitions(env, id, pid, epoch, partitions).await
        }
    }

    /// Whether `tp` is part of the id's open transaction (the verify-only
    /// form of AddPartitionsToTxn).
    pub fn verify_partition<E: TxnEnv>(
        &self,
        env: &Rc<E>,
        id: &str,
        pid: i64,
        epoch: i16,
        tp: &TopicPartition,
    ) -> Result<(), TxnError> {
        self.locate(env, id)?;
        let Some(m) = self.get(id) else {
            return Err(TxnError::InvalidProducerIdMapping);
        };
        state::verify_partition(&m, pid, epoch, tp)
    }

    /// EndTxn. `tv2` for clients on transaction version 2 (EndTxn v5+),
    /// whose epoch is bumped by every EndTxn. Returns the producer id and
    /// epoch the client continues with.
    pub async fn end_txn<E: TxnEnv>(
        &self,
        env: &Rc<E>,
        id: &str,
        pid: i64,
        epoch: i16,
        commit: bool,
        tv2: bool,
    ) -> Result<(i64, i16), TxnError> {
        let partition = self.locate(env, id)?;
        self.settle(id).await;
        let Some(current) = self.get(id) else {
            return Err(TxnError::InvalidProducerIdMapping);
        };
        let (mut next, rotate) = match state::end_txn(&current, pid, epoch, commit, tv2, now_ms())?
        {
            state::End::AlreadyDone { producer_id, epoch } => return Ok((producer_id, epoch)),
            state::End::Prepare { next, rotate } => (next, rotate),
        };
        if rotate {
            let Some(pid) = env.allocate_producer_id() else {
                return Err(TxnError::CoordinatorLoadInProgress);
            };
            next.next_producer_id = Some(pid);
        }
        self.begin(id)?;
        let answer = state::end_answer(&next);
        self.persist(env, &partition, next).await?;
        spawn_complete(env, id.to_owned());
        Ok(answer)
    }

    /// Writes the markers of a transaction in Prepare*, then Complete*.
    pub async fn complete<E: TxnEnv>(&self, env: &Rc<E>, id: &str) {
        let delay_ms = env.config().debug_delay_txn_markers_ms;
        if delay_ms > 0 {
            glommio::timer::sleep(Duration::from_millis(delay_ms)).await;
        }
        let Ok(partition) = self.locate(env, id) else {
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
                coordinator_epoch: self.coordinator_epoch(partition.tp.partition.0),
                commit,
                tv2: m.client_txn_version >= 2,
            })
            .collect();
        let mut attempts = 0;
        while !todo.is_empty() {
            attempts += 1;
            let results = env.send_markers(std::mem::take(&mut todo)).await;
            if let Some((marker, _)) = results
                .iter()
                .find(|(_, outcome)| *outcome == Err(MarkerError::CoordinatorFenced))
            {
                // A partition saw a marker of a newer coordinator of this
                // producer: that one finishes the transaction (Kafka's
                // marker channel cancels the rest of its markers too).
                tracing::warn!(
                    transactional_id = id,
                    tp = %marker.tp,
                    "a newer transaction coordinator wrote markers; this one stops"
                );
                return;
            }
            for (marker, outcome) in results {
                let Err(e) = outcome else { continue };
                // A partition is skipped only when this shard's own image no
                // longer has it (its topic was deleted), as Kafka's marker
                // channel does; a leader that does not know it yet (it is
                // still applying the image, at start-up) is asked again.
                let deleted = e == MarkerError::UnknownPartition
                    && !env
                        .image()
                        .has_partition(&marker.tp.topic, marker.tp.partition.0);
                if e.retriable() && !deleted {
                    todo.push(marker);
                } else {
                    tracing::warn!(tp = %marker.tp, error = %e, "transaction marker not written; skipping the partition");
                }
            }
            if !todo.is_empty() {
                if attempts % MARKER_ATTEMPTS_LOGGED == 0 {
                    tracing::warn!(
                        transactional_id = id,
                        attempts,
                        left = todo.len(),
                        "transaction markers still not written; retrying"
                    );
                }
                let backoff =
                    (MARKER_RETRY_BACKOFF_MS << attempts.min(4)).min(MARKER_RETRY_BACKOFF_MS_MAX);
                glommio::timer::sleep(Duration::from_millis(backoff)).await;
                // Retried until written, as Kafka's marker channel does, or
                // until this coordinator loses the transaction (it no longer
                // leads or has loaded the partition, or the id moved on).
                let still = self.locate(env, id).is_ok()
                    && self.get(id).is_some_and(|now| {
                        now.state == m.state
                            && now.producer_id == m.producer_id
                            && now.producer_epoch == m.producer_epoch
                    });
                if !still {
                    tracing::info!(
                        transactional_id = id,
                        "transaction markers left to the transaction's new coordinator or state"
                    );
                    return;
                }
                // This shard may have given the partition up and taken it
                // over again meanwhile: its markers carry the epoch it
                // holds it in now.
                let epoch = self.coordinator_epoch(partition.tp.partition.0);
                for marker in &mut todo {
                    marker.coordinator_epoch = epoch;
                }
            }
        }
        // Every marker is written: the transaction's duration, from its
        // start (first partition or offsets added) to here. Counted once
        // Complete* is written, so a retry by the sweep counts it once.
        let took = (m.start_ms >= 0)
            .then(|| Duration::from_millis(now_ms().saturating_sub(m.start_ms).max(0) as u64));
        let Ok(current) = self.begin(id) else { return };
        let Some(next) = state::complete(&current, now_ms()) else {
            self.end_pending(id);
            return;
        };
        match self.persist(env, &partition, next).await {
            Ok(_) => {
                if let Some(took) = took {
                    crate::metrics::record_transaction(commit, took);
                }
            }
            Err(e) => {
                tracing::error!(transactional_id = id, error = %e, "writing Complete* failed; retried by the next sweep");
            }
        }
    }

    /// Aborts open transactions that outlived their timeout, bumping the
    /// epoch so the late producer is fenced.
    pub async fn abort_expired<E: TxnEnv>(&self, env: &Rc<E>) {
        let now = now_ms();
        let expired: Vec<String> = self
            .txns
            .borrow()
            .values()
            .filter(|m| !m.pending && m.expired(now))
            .map(|m| m.transactional_id.clone())
            .collect();
        for id in expired {
            let Ok(partition) = self.locate(env, &id) else {
                continue;
            };
            let Ok(current) = self.begin(&id) else {
                continue;
            };
            // Re-checked after the awaits of earlier ids: the client may have
            // ended this transaction meanwhile.
            let Some(next) = state::abort_timed_out(&current, now_ms()) else {
                self.end_pending(&id);
                continue;
            };
            tracing::info!(transactional_id = %id, "aborting a timed-out transaction");
            if self.persist(env, &partition, next).await.is_ok() {
                spawn_complete(env, id);
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
            spawn_complete(env, id);
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

/// Appends `batch` to the coordinator's partition, if this shard leads it
/// (with its ISR at `min.insync.replicas` when replicated), and waits until
/// it is acknowledged as an acks=-1 write is (`partition::coordinator_log`).
async fn append_acked<E: TxnEnv>(
    env: &Rc<E>,
    partition: &Partition,
    batch: bytes::BytesMut,
) -> Result<(), AppendFailed> {
    env.writable(&partition.tp)?;
    let info = partition.append_internal(batch)?;
    Ok(env
        .acked(&partition.tp, &partition.log, info.last_offset)
        .await?)
}

/// Why a coordinator write failed.
#[derive(Debug, thiserror::Error)]
enum AppendFailed {
    #[error(transparent)]
    Append(#[from] AppendError),
    #[error(transparent)]
    Write(#[from] CoordinatorWriteError),
}

impl AppendFailed {
    /// What the request that made the write answers, as Kafka maps a
    /// failed write of transaction state.
    fn answer(&self) -> TxnError {
        match self {
            AppendFailed::Write(CoordinatorWriteError::NotLeader) => TxnError::NotCoordinator,
            AppendFailed::Write(
                CoordinatorWriteError::NotEnoughReplicas | CoordinatorWriteError::TimedOut,
            ) => TxnError::CoordinatorNotAvailable,
            _ => TxnError::Storage,
        }
    }
}

/// Starts writing a transaction's markers unless a task already is.
fn spawn_complete<E: TxnEnv>(env: &Rc<E>, id: String) {
    if !env.coordinator().completing.borrow_mut().insert(id.clone()) {
        return;
    }
    let env = env.clone();
    glommio::spawn_local(async move {
        env.coordinator().complete(&env, &id).await;
        env.coordinator().completing.borrow_mut().remove(&id);
    })
    .detach();
}
