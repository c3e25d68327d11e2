//! Transactions: the transaction coordinator and its state machine.
//!
//! The coordinator for a transactional id is the shard that leads partition
//! `abs(javaStringHashCode(id)) % 50` of `__transaction_state`
//! ([`crate::metadata::internal`]); its [`coordinator::TxnCoordinator`] owns
//! the [`TxnMetadata`] of every id that maps to a partition it leads.
//!
//! Every transition is written to that partition first (Kafka's record format,
//! [`log`]) and applied in memory only once the write is durable (written, or
//! fdatasync'ed under `--fsync-acks`): the log is the state, and a restarted
//! coordinator replays it, then finishes any transaction it finds in
//! PrepareCommit/PrepareAbort by writing its markers.
//!
//! While a transition is being written the id is *pending*: another request
//! for it gets CONCURRENT_TRANSACTIONS (retriable), as in Kafka — after
//! waiting a bounded time for the id to settle, so a producer that begins
//! its next transaction while the last one's markers are being written is
//! not sent into its retry backoff ([`coordinator`]).
//!
//! Expiration (Kafka's `transactional.id.expiration.ms`, default 7 days): an
//! id in Empty, CompleteCommit or CompleteAbort whose last update is at
//! least that old is removed, as Kafka's
//! `TransactionStateManager.removeExpiredTransactionalIds` does: a tombstone
//! for its key is written to its partition, then the id leaves the
//! coordinator's map (a replay drops it at the tombstone), so the map holds
//! only ids in use. Kafka looks every
//! `transaction.remove.expired.transaction.cleanup.interval.ms` (1 hour);
//! fjord looks every tenth of the expiration, within
//! [`ID_EXPIRATION_CHECK_INTERVAL_MS_MIN`]..=[`ID_EXPIRATION_CHECK_INTERVAL_MS_MAX`]
//! (1 hour for the default), so a short expiration is honoured closely. A
//! later InitProducerId for the id starts afresh: a new producer id, epoch 0.
//!
//! Transaction versions: a client that ends transactions with EndTxn v5+
//! follows transaction version 2 (KIP-890): each EndTxn bumps the epoch, the
//! markers carry the bumped epoch, and the response returns it. Older clients
//! (librdkafka uses EndTxn v0–1) follow version 1: the epoch moves only on
//! InitProducerId and fencing.

pub mod coordinator;
pub mod log;

use crate::types::TopicPartition;
use std::collections::BTreeSet;

/// Kafka's `transaction.max.timeout.ms` default (15 minutes).
pub const TRANSACTION_MAX_TIMEOUT_MS: i32 = 15 * 60 * 1000;
/// Kafka's `transaction.abort.timed.out.transaction.cleanup.interval.ms`.
pub const ABORT_TIMED_OUT_CHECK_INTERVAL_MS: u64 = 10_000;
/// Kafka's `transaction.remove.expired.transaction.cleanup.interval.ms`
/// default: the longest fjord waits between two looks for expired ids.
pub const ID_EXPIRATION_CHECK_INTERVAL_MS_MAX: u64 = 60 * 60 * 1000;
/// The shortest wait between two looks for expired ids.
pub const ID_EXPIRATION_CHECK_INTERVAL_MS_MIN: u64 = 100;

/// How often to look for transactional ids expired after `expiration_ms`:
/// a tenth of it, within the bounds above.
pub fn id_expiration_check_interval_ms(expiration_ms: i64) -> u64 {
    (expiration_ms.max(0) as u64 / 10).clamp(
        ID_EXPIRATION_CHECK_INTERVAL_MS_MIN,
        ID_EXPIRATION_CHECK_INTERVAL_MS_MAX,
    )
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

/// One marker to write: the end of `producer_id`'s transaction on `tp`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxnMarker {
    pub tp: TopicPartition,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub coordinator_epoch: i32,
    pub commit: bool,
    /// Written for a transaction-version-2 client: its marker carries a
    /// bumped epoch, so one whose epoch is not above the producer's current
    /// epoch on the partition is stale (a duplicate) and is refused.
    pub tv2: bool,
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
        assert_eq!(id_expiration_check_interval_ms(2_000), 200);
        assert_eq!(
            id_expiration_check_interval_ms(1),
            ID_EXPIRATION_CHECK_INTERVAL_MS_MIN
        );
        assert_eq!(
            id_expiration_check_interval_ms(7 * 24 * 60 * 60 * 1000),
            ID_EXPIRATION_CHECK_INTERVAL_MS_MAX
        );
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
}
