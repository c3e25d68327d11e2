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
pub mod env;
pub mod log;
pub mod state;

pub use crate::partition::TxnMarker;
pub use state::{TxnError, TxnMetadata, TxnState};

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_expiration_check_interval_is_a_tenth_within_bounds() {
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
}
