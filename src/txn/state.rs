//! The transaction state machine, pure: Kafka's `TransactionState` and its
//! table of valid transitions, one id's [`TxnMetadata`], and every
//! transition the coordinator makes as a function of the current state, the
//! request and the time, returning the next state (or the refusal) without
//! touching a log, a clock or a shard — `group/state.rs` is the model. The
//! coordinator (`coordinator`) locates the id, asks these functions, writes
//! what they return and applies it once written; producer ids it allocates
//! itself where a transition says one is needed.

use super::TRANSACTION_MAX_TIMEOUT_MS;
use crate::types::TopicPartition;
use std::collections::BTreeSet;

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

/// Kafka's `TransactionState`, with its on-disk ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TxnState {
    Empty = 0,
    Ongoing = 1,
    PrepareCommit = 2,
    PrepareAbort = 3,
    CompleteCommit = 4,
    CompleteAbort = 5,
    Dead = 6,
    PrepareEpochFence = 7,
}

impl TxnState {
    pub fn from_id(id: i8) -> Option<TxnState> {
        use TxnState::*;
        Some(match id {
            0 => Empty,
            1 => Ongoing,
            2 => PrepareCommit,
            3 => PrepareAbort,
            4 => CompleteCommit,
            5 => CompleteAbort,
            6 => Dead,
            7 => PrepareEpochFence,
            _ => return None,
        })
    }

    /// Kafka's state names, as ListTransactions / DescribeTransactions report them.
    pub fn name(self) -> &'static str {
        use TxnState::*;
        match self {
            Empty => "Empty",
            Ongoing => "Ongoing",
            PrepareCommit => "PrepareCommit",
            PrepareAbort => "PrepareAbort",
            CompleteCommit => "CompleteCommit",
            CompleteAbort => "CompleteAbort",
            Dead => "Dead",
            PrepareEpochFence => "PrepareEpochFence",
        }
    }

    /// The states a transition into `self` may start from (KAFKA_BEHAVIOUR.md §5).
    pub fn valid_previous(self) -> &'static [TxnState] {
        use TxnState::*;
        match self {
            Empty => &[Empty, CompleteCommit, CompleteAbort],
            Ongoing => &[Ongoing, Empty, CompleteCommit, CompleteAbort],
            PrepareCommit => &[Ongoing, Empty, CompleteCommit, CompleteAbort],
            PrepareAbort => &[
                Ongoing,
                PrepareEpochFence,
                Empty,
                CompleteCommit,
                CompleteAbort,
            ],
            CompleteCommit => &[PrepareCommit],
            CompleteAbort => &[PrepareAbort],
            Dead => &[Empty, CompleteAbort, CompleteCommit],
            PrepareEpochFence => &[Ongoing],
        }
    }

    pub fn can_transition_to(self, to: TxnState) -> bool {
        to.valid_previous().contains(&self)
    }

    /// Markers are being written: the transaction cannot change until done.
    pub fn is_preparing(self) -> bool {
        matches!(
            self,
            TxnState::PrepareCommit | TxnState::PrepareAbort | TxnState::PrepareEpochFence
        )
    }
}

/// One transactional id's state, as the coordinator keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxnMetadata {
    pub transactional_id: String,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub timeout_ms: i32,
    pub state: TxnState,
    pub partitions: BTreeSet<TopicPartition>,
    /// When the current transaction began (first partition added); -1 if none.
    pub start_ms: i64,
    pub last_update_ms: i64,
    /// 2 when the client follows transaction version 2 (EndTxn v5+), else 0.
    pub client_txn_version: i16,
    /// The producer id the client continues with once this transaction is
    /// complete, when its epoch ran out (version 2).
    pub next_producer_id: Option<i64>,
    /// A transition is being written to the log (not persisted).
    pub pending: bool,
}

impl TxnMetadata {
    /// A transition of this id is being written, or its markers are: a
    /// request for it gets CONCURRENT_TRANSACTIONS (after the coordinator's
    /// bounded wait for it to settle).
    pub fn busy(&self) -> bool {
        self.pending || self.state.is_preparing()
    }

    pub fn new(id: &str, producer_id: i64, timeout_ms: i32, now_ms: i64) -> TxnMetadata {
        TxnMetadata {
            transactional_id: id.to_owned(),
            producer_id,
            producer_epoch: 0,
            timeout_ms,
            state: TxnState::Empty,
            partitions: BTreeSet::new(),
            start_ms: -1,
            last_update_ms: now_ms,
            client_txn_version: 0,
            next_producer_id: None,
            pending: false,
        }
    }

    /// Whether the id may be removed at `now_ms` under
    /// `transactional.id.expiration.ms` = `expiration_ms`: no transaction
    /// open or ending, nothing being written, and no update for that long
    /// (Kafka's `shouldExpire`).
    pub fn id_expired(&self, now_ms: i64, expiration_ms: i64) -> bool {
        !self.pending
            && matches!(
                self.state,
                TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort
            )
            && self.last_update_ms <= now_ms.saturating_sub(expiration_ms)
    }

    /// Whether the open transaction has outlived its timeout at `now_ms`.
    pub fn expired(&self, now_ms: i64) -> bool {
        self.state == TxnState::Ongoing
            && self.start_ms >= 0
            && now_ms.saturating_sub(self.start_ms) > self.timeout_ms as i64
    }
}

/// What InitProducerId does to an existing id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Init {
    /// The id has an open transaction: write `0` (PrepareAbort under a
    /// bumped epoch), finish it, and answer CONCURRENT_TRANSACTIONS (the
    /// client retries and then gets the epoch after that).
    FenceOngoing(TxnMetadata),
    /// Write `next` (Empty, the epoch bumped) and answer its producer id and
    /// epoch; when `new_producer_id`, the epoch ran out and the caller puts
    /// a freshly allocated producer id into `next` first (epoch 0).
    Reset {
        next: TxnMetadata,
        new_producer_id: bool,
    },
}

/// What EndTxn does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum End {
    /// A retry of an EndTxn that completed already: the same answer.
    AlreadyDone { producer_id: i64, epoch: i16 },
    /// Write `next` (Prepare*), answer, then write the markers. When
    /// `rotate` (transaction version 2, the epoch about to run out), the
    /// caller sets `next.next_producer_id` to a fresh producer id, which the
    /// client continues with at epoch 0.
    Prepare { next: TxnMetadata, rotate: bool },
}

/// INVALID_TRANSACTION_TIMEOUT for a timeout not in 1..=`transaction.max.timeout.ms`.
pub fn check_timeout(timeout_ms: i32) -> Result<(), TxnError> {
    if timeout_ms <= 0 || timeout_ms > TRANSACTION_MAX_TIMEOUT_MS {
        return Err(TxnError::InvalidTransactionTimeout);
    }
    Ok(())
}

/// Checks that `pid`/`epoch` are the id's current producer.
pub fn check_producer(m: &TxnMetadata, pid: i64, epoch: i16) -> Result<(), TxnError> {
    if m.producer_id != pid {
        return Err(TxnError::InvalidProducerIdMapping);
    }
    if m.producer_epoch != epoch {
        return Err(TxnError::ProducerFenced);
    }
    Ok(())
}

/// InitProducerId for an id known as `current`; `expected` is the producer
/// id and epoch the client names (KIP-360: a stale instance must not abort
/// the live producer's work).
pub fn init_producer_id(
    current: &TxnMetadata,
    expected: Option<(i64, i16)>,
    timeout_ms: i32,
    now_ms: i64,
) -> Result<Init, TxnError> {
    if current.busy() {
        return Err(TxnError::ConcurrentTransactions);
    }
    if let Some((pid, epoch)) = expected {
        if pid >= 0 && (pid != current.producer_id || epoch != current.producer_epoch) {
            return Err(TxnError::ProducerFenced);
        }
    }
    let mut next = current.clone();
    next.last_update_ms = now_ms;
    if current.state == TxnState::Ongoing {
        next.state = TxnState::PrepareAbort;
        next.producer_epoch = next.producer_epoch.saturating_add(1);
        return Ok(Init::FenceOngoing(next));
    }
    let new_producer_id = next.producer_epoch >= i16::MAX - 1;
    next.producer_epoch = if new_producer_id {
        0
    } else {
        next.producer_epoch + 1
    };
    next.state = TxnState::Empty;
    next.partitions.clear();
    next.timeout_ms = timeout_ms;
    next.start_ms = -1;
    Ok(Init::Reset {
        next,
        new_producer_id,
    })
}

/// AddPartitionsToTxn (and AddOffsetsToTxn): the partitions join the open
/// transaction, which starts now if none is open. None: they are all in it
/// already, nothing to write.
pub fn add_partitions(
    current: &TxnMetadata,
    pid: i64,
    epoch: i16,
    partitions: &[TopicPartition],
    now_ms: i64,
) -> Result<Option<TxnMetadata>, TxnError> {
    check_producer(current, pid, epoch)?;
    if current.busy() {
        return Err(TxnError::ConcurrentTransactions);
    }
    if !current.state.can_transition_to(TxnState::Ongoing) {
        return Err(TxnError::InvalidTxnState);
    }
    if current.state == TxnState::Ongoing
        && partitions.iter().all(|tp| current.partitions.contains(tp))
    {
        return Ok(None);
    }
    let mut next = current.clone();
    if next.state != TxnState::Ongoing {
        next.start_ms = now_ms;
        next.partitions.clear();
    }
    next.state = TxnState::Ongoing;
    next.partitions.extend(partitions.iter().cloned());
    next.last_update_ms = now_ms;
    Ok(Some(next))
}

/// Whether `tp` is part of the id's open transaction (the verify-only form
/// of AddPartitionsToTxn, KIP-890 part 1).
pub fn verify_partition(
    current: &TxnMetadata,
    pid: i64,
    epoch: i16,
    tp: &TopicPartition,
) -> Result<(), TxnError> {
    check_producer(current, pid, epoch)?;
    if current.state == TxnState::Ongoing && current.partitions.contains(tp) {
        Ok(())
    } else {
        Err(TxnError::InvalidTxnState)
    }
}

/// EndTxn. `tv2` for clients on transaction version 2 (EndTxn v5+), whose
/// epoch every EndTxn bumps.
pub fn end_txn(
    current: &TxnMetadata,
    pid: i64,
    epoch: i16,
    commit: bool,
    tv2: bool,
    now_ms: i64,
) -> Result<End, TxnError> {
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
        return Ok(End::AlreadyDone {
            producer_id: current.producer_id,
            epoch: current.producer_epoch,
        });
    }
    // A version-2 retry while the markers are still being written: the
    // epoch was bumped by the first attempt, so it is not a fenced producer
    // but one that must wait.
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
    // Version 2 may end a transaction that never began (Empty, Complete*).
    let empty_allowed = tv2 && current.state != TxnState::Ongoing;
    if current.state != TxnState::Ongoing && !empty_allowed {
        return Err(TxnError::InvalidTxnState);
    }
    if !current.state.can_transition_to(target) {
        return Err(TxnError::InvalidTxnState);
    }
    // When the epoch would run out, the markers still use the old id at the
    // bumped epoch and the client continues with a new id at epoch 0
    // (Kafka's NextProducerId).
    let rotate = tv2 && current.producer_epoch >= i16::MAX - 2;
    let mut next = current.clone();
    if tv2 {
        next.producer_epoch = next.producer_epoch.saturating_add(1);
        next.client_txn_version = 2;
    }
    next.next_producer_id = None;
    if next.state != TxnState::Ongoing {
        next.partitions.clear();
    }
    next.state = target;
    next.last_update_ms = now_ms;
    Ok(End::Prepare { next, rotate })
}

/// The answer EndTxn gives for a Prepare* state `next`: the producer id and
/// epoch the client continues with.
pub fn end_answer(next: &TxnMetadata) -> (i64, i16) {
    match next.next_producer_id {
        Some(pid) => (pid, 0),
        None => (next.producer_id, next.producer_epoch),
    }
}

/// Complete* once every marker of the Prepare* transaction `current` is
/// written; a producer id rotated by EndTxn takes over at epoch 0.
pub fn complete(current: &TxnMetadata, now_ms: i64) -> Option<TxnMetadata> {
    let state = match current.state {
        TxnState::PrepareCommit => TxnState::CompleteCommit,
        TxnState::PrepareAbort => TxnState::CompleteAbort,
        _ => return None,
    };
    let mut next = current.clone();
    next.state = state;
    next.partitions.clear();
    next.last_update_ms = now_ms;
    if let Some(pid) = next.next_producer_id.take() {
        next.producer_id = pid;
        next.producer_epoch = 0;
    }
    Some(next)
}

/// PrepareAbort under a bumped epoch for an open transaction that outlived
/// its timeout at `now_ms` (the late producer is fenced); None otherwise.
pub fn abort_timed_out(current: &TxnMetadata, now_ms: i64) -> Option<TxnMetadata> {
    if !current.expired(now_ms) {
        return None;
    }
    let mut next = current.clone();
    next.state = TxnState::PrepareAbort;
    next.producer_epoch = next.producer_epoch.saturating_add(1);
    next.last_update_ms = now_ms;
    Some(next)
}

#[cfg(test)]
mod tests {
    use super::TxnState::*;
    use super::*;

    #[test]
    fn transitions_are_kafkas() {
        let all = [
            Empty,
            Ongoing,
            PrepareCommit,
            PrepareAbort,
            CompleteCommit,
            CompleteAbort,
            Dead,
            PrepareEpochFence,
        ];
        let allowed: Vec<(TxnState, TxnState)> = all
            .iter()
            .flat_map(|&a| all.iter().map(move |&b| (a, b)))
            .filter(|(a, b)| a.can_transition_to(*b))
            .collect();
        assert!(Ongoing.can_transition_to(PrepareEpochFence));
        assert!(PrepareEpochFence.can_transition_to(PrepareAbort));
        assert!(!PrepareEpochFence.can_transition_to(PrepareCommit));
        assert!(!Ongoing.can_transition_to(CompleteCommit));
        assert!(!PrepareCommit.can_transition_to(CompleteAbort));
        assert!(!Dead.can_transition_to(Empty));
        // 3 + 4 + 4 + 5 + 1 + 1 + 3 + 1 edges, as listed in KAFKA_BEHAVIOUR.md §5.
        assert_eq!(allowed.len(), 22);
        for s in all {
            assert_eq!(TxnState::from_id(s as i8), Some(s));
        }
    }

    #[test]
    fn ids_expire_only_when_idle_and_settled() {
        let mut m = TxnMetadata::new("t", 1, 60_000, 1_000);
        assert!(!m.id_expired(2_999, 2_000));
        assert!(m.id_expired(3_000, 2_000), "Empty, idle for the expiration");
        for state in [CompleteCommit, CompleteAbort] {
            m.state = state;
            assert!(m.id_expired(3_000, 2_000));
        }
        for state in [
            Ongoing,
            PrepareCommit,
            PrepareAbort,
            PrepareEpochFence,
            Dead,
        ] {
            m.state = state;
            assert!(!m.id_expired(1_000_000, 2_000), "{state:?} never expires");
        }
        m.state = CompleteCommit;
        m.pending = true;
        assert!(!m.id_expired(1_000_000, 2_000), "a write in flight");
    }

    #[test]
    fn expiry_follows_the_timeout() {
        let mut m = TxnMetadata::new("t", 1, 1000, 0);
        assert!(!m.expired(5000), "an empty transaction never expires");
        m.state = Ongoing;
        m.start_ms = 100;
        assert!(!m.expired(1100));
        assert!(m.expired(1101));
    }

    fn tp(p: i32) -> TopicPartition {
        TopicPartition::new("t", p)
    }

    /// An id of producer 7 at `epoch` in `state`, last updated at 1000.
    fn at(state: TxnState, epoch: i16) -> TxnMetadata {
        let mut m = TxnMetadata::new("id", 7, 60_000, 1_000);
        m.producer_epoch = epoch;
        m.state = state;
        if state != Empty {
            m.partitions.insert(tp(0));
            m.start_ms = 500;
        }
        if matches!(state, CompleteCommit | CompleteAbort) {
            m.partitions.clear();
        }
        m
    }

    #[test]
    fn add_partitions_starts_a_transaction_from_every_settled_state() {
        for from in [Empty, CompleteCommit, CompleteAbort] {
            let next = add_partitions(&at(from, 3), 7, 3, &[tp(1)], 2_000)
                .expect("valid")
                .expect("written");
            assert_eq!(next.state, Ongoing, "{from:?} → Ongoing");
            assert_eq!(next.partitions, [tp(1)].into());
            assert_eq!((next.start_ms, next.last_update_ms), (2_000, 2_000));
            assert_eq!(next.producer_epoch, 3);
        }
    }

    #[test]
    fn add_partitions_to_an_open_transaction_extends_it_or_writes_nothing() {
        let open = at(Ongoing, 3);
        let next = add_partitions(&open, 7, 3, &[tp(1)], 2_000)
            .expect("valid")
            .expect("written");
        assert_eq!(next.partitions, [tp(0), tp(1)].into());
        assert_eq!(next.start_ms, 500, "the transaction's start stays");
        assert_eq!(add_partitions(&open, 7, 3, &[tp(0)], 2_000), Ok(None));
    }

    #[test]
    fn add_partitions_refuses_other_producers_and_busy_ids() {
        let open = at(Ongoing, 3);
        assert_eq!(
            add_partitions(&open, 8, 3, &[tp(1)], 0),
            Err(TxnError::InvalidProducerIdMapping)
        );
        assert_eq!(
            add_partitions(&open, 7, 2, &[tp(1)], 0),
            Err(TxnError::ProducerFenced)
        );
        for busy in [PrepareCommit, PrepareAbort, PrepareEpochFence] {
            assert_eq!(
                add_partitions(&at(busy, 3), 7, 3, &[tp(1)], 0),
                Err(TxnError::ConcurrentTransactions),
                "{busy:?}"
            );
        }
        let mut pending = at(Empty, 3);
        pending.pending = true;
        assert_eq!(
            add_partitions(&pending, 7, 3, &[tp(1)], 0),
            Err(TxnError::ConcurrentTransactions)
        );
        assert_eq!(
            add_partitions(&at(Dead, 3), 7, 3, &[tp(1)], 0),
            Err(TxnError::InvalidTxnState)
        );
    }

    #[test]
    fn verify_partition_accepts_only_partitions_of_the_open_transaction() {
        let open = at(Ongoing, 3);
        assert_eq!(verify_partition(&open, 7, 3, &tp(0)), Ok(()));
        assert_eq!(
            verify_partition(&open, 7, 3, &tp(1)),
            Err(TxnError::InvalidTxnState)
        );
        assert_eq!(
            verify_partition(&at(Empty, 3), 7, 3, &tp(0)),
            Err(TxnError::InvalidTxnState)
        );
        assert_eq!(
            verify_partition(&open, 7, 2, &tp(0)),
            Err(TxnError::ProducerFenced)
        );
    }

    #[test]
    fn end_txn_prepares_commit_or_abort_of_an_open_transaction() {
        for (commit, target) in [(true, PrepareCommit), (false, PrepareAbort)] {
            let End::Prepare { next, rotate } =
                end_txn(&at(Ongoing, 3), 7, 3, commit, false, 2_000).expect("valid")
            else {
                panic!("not prepared");
            };
            assert_eq!(next.state, target);
            assert_eq!(next.producer_epoch, 3, "version 1 keeps the epoch");
            assert_eq!(next.partitions, [tp(0)].into());
            assert_eq!(next.last_update_ms, 2_000);
            assert!(!rotate);
            assert_eq!(end_answer(&next), (7, 3));
        }
    }

    #[test]
    fn end_txn_version_2_bumps_the_epoch_and_may_end_an_empty_transaction() {
        let End::Prepare { next, .. } =
            end_txn(&at(Ongoing, 3), 7, 3, true, true, 0).expect("valid")
        else {
            panic!("not prepared");
        };
        assert_eq!((next.state, next.producer_epoch), (PrepareCommit, 4));
        assert_eq!(next.client_txn_version, 2);
        // (The same end again at the same epoch would be a retry, below.)
        for (from, commit, to) in [
            (Empty, false, PrepareAbort),
            (Empty, true, PrepareCommit),
            (CompleteCommit, false, PrepareAbort),
            (CompleteAbort, true, PrepareCommit),
        ] {
            let End::Prepare { next, .. } =
                end_txn(&at(from, 3), 7, 3, commit, true, 0).expect("valid")
            else {
                panic!("{from:?} not prepared");
            };
            assert_eq!(next.state, to, "{from:?} → {to:?} (v2)");
            assert!(next.partitions.is_empty());
        }
        assert_eq!(
            end_txn(&at(Empty, 3), 7, 3, true, false, 0),
            Err(TxnError::InvalidTxnState),
            "version 1 ends only an open transaction"
        );
    }

    #[test]
    fn end_txn_retries_get_the_same_answer_or_wait() {
        assert_eq!(
            end_txn(&at(CompleteCommit, 3), 7, 3, true, false, 0),
            Ok(End::AlreadyDone {
                producer_id: 7,
                epoch: 3
            })
        );
        assert_eq!(
            end_txn(&at(CompleteAbort, 4), 7, 3, false, true, 0),
            Ok(End::AlreadyDone {
                producer_id: 7,
                epoch: 4
            }),
            "a version-2 retry names the epoch before the bump"
        );
        assert_eq!(
            end_txn(&at(PrepareCommit, 4), 7, 3, true, true, 0),
            Err(TxnError::ConcurrentTransactions),
            "a version-2 retry while the markers are written"
        );
        assert_eq!(
            end_txn(&at(PrepareCommit, 3), 7, 3, true, false, 0),
            Err(TxnError::ConcurrentTransactions)
        );
        assert_eq!(
            end_txn(&at(CompleteCommit, 3), 7, 3, false, false, 0),
            Err(TxnError::InvalidTxnState),
            "an abort after a commit is not a retry"
        );
    }

    #[test]
    fn end_txn_fences_stale_epochs_and_other_producers() {
        assert_eq!(
            end_txn(&at(Ongoing, 3), 7, 2, true, false, 0),
            Err(TxnError::ProducerFenced)
        );
        assert_eq!(
            end_txn(&at(Ongoing, 3), 8, 3, true, false, 0),
            Err(TxnError::InvalidProducerIdMapping)
        );
    }

    #[test]
    fn end_txn_version_2_rotates_the_producer_id_before_the_epoch_runs_out() {
        let End::Prepare { mut next, rotate } =
            end_txn(&at(Ongoing, i16::MAX - 2), 7, i16::MAX - 2, true, true, 0).expect("valid")
        else {
            panic!("not prepared");
        };
        assert!(rotate);
        next.next_producer_id = Some(9);
        assert_eq!(end_answer(&next), (9, 0));
        let done = complete(&next, 5).expect("complete");
        assert_eq!(
            (done.state, done.producer_id, done.producer_epoch),
            (CompleteCommit, 9, 0)
        );
        assert_eq!(done.next_producer_id, None);
    }

    #[test]
    fn complete_follows_prepare_and_nothing_else() {
        let commit = complete(&at(PrepareCommit, 3), 9).expect("complete");
        assert_eq!((commit.state, commit.last_update_ms), (CompleteCommit, 9));
        assert!(commit.partitions.is_empty());
        assert_eq!(
            complete(&at(PrepareAbort, 3), 9).map(|m| m.state),
            Some(CompleteAbort)
        );
        for other in [Empty, Ongoing, CompleteCommit, CompleteAbort, Dead] {
            assert_eq!(complete(&at(other, 3), 9), None, "{other:?}");
        }
    }

    #[test]
    fn init_producer_id_bumps_the_epoch_of_a_settled_id() {
        for from in [Empty, CompleteCommit, CompleteAbort] {
            let Init::Reset {
                next,
                new_producer_id,
            } = init_producer_id(&at(from, 3), None, 30_000, 2_000).expect("valid")
            else {
                panic!("not reset");
            };
            assert_eq!((next.state, next.producer_epoch), (Empty, 4), "{from:?}");
            assert_eq!((next.timeout_ms, next.start_ms), (30_000, -1));
            assert!(next.partitions.is_empty());
            assert!(!new_producer_id);
        }
        let Init::Reset {
            next,
            new_producer_id,
        } = init_producer_id(&at(Empty, i16::MAX - 1), None, 30_000, 0).expect("valid")
        else {
            panic!("not reset");
        };
        assert!(new_producer_id, "the epoch ran out");
        assert_eq!(next.producer_epoch, 0);
    }

    #[test]
    fn init_producer_id_fences_an_open_transaction() {
        let Init::FenceOngoing(next) =
            init_producer_id(&at(Ongoing, 3), None, 30_000, 2_000).expect("valid")
        else {
            panic!("not fenced");
        };
        assert_eq!((next.state, next.producer_epoch), (PrepareAbort, 4));
        assert_eq!(next.partitions, [tp(0)].into(), "the markers go to these");
        for busy in [PrepareCommit, PrepareAbort, PrepareEpochFence] {
            assert_eq!(
                init_producer_id(&at(busy, 3), None, 30_000, 0),
                Err(TxnError::ConcurrentTransactions)
            );
        }
    }

    #[test]
    fn init_producer_id_with_a_stale_identity_is_fenced() {
        assert_eq!(
            init_producer_id(&at(Empty, 3), Some((7, 2)), 30_000, 0),
            Err(TxnError::ProducerFenced)
        );
        assert_eq!(
            init_producer_id(&at(Empty, 3), Some((8, 3)), 30_000, 0),
            Err(TxnError::ProducerFenced)
        );
        assert!(init_producer_id(&at(Empty, 3), Some((7, 3)), 30_000, 0).is_ok());
        assert!(init_producer_id(&at(Empty, 3), Some((-1, -1)), 30_000, 0).is_ok());
    }

    #[test]
    fn a_timed_out_transaction_is_aborted_under_a_bumped_epoch() {
        let open = at(Ongoing, 3); // started at 500, 60 s timeout
        assert_eq!(abort_timed_out(&open, 60_500), None);
        let next = abort_timed_out(&open, 60_501).expect("timed out");
        assert_eq!((next.state, next.producer_epoch), (PrepareAbort, 4));
        assert_eq!(abort_timed_out(&at(Empty, 3), i64::MAX), None);
    }

    #[test]
    fn timeouts_are_checked_against_the_maximum() {
        assert_eq!(check_timeout(0), Err(TxnError::InvalidTransactionTimeout));
        assert_eq!(check_timeout(1), Ok(()));
        assert_eq!(check_timeout(TRANSACTION_MAX_TIMEOUT_MS), Ok(()));
        assert_eq!(
            check_timeout(TRANSACTION_MAX_TIMEOUT_MS + 1),
            Err(TxnError::InvalidTransactionTimeout)
        );
    }
}
