//! The one place where fjord's domain errors become Kafka error codes.

use crate::log::LogError;
use crate::partition::AppendError;
use crate::producer::ProducerError;
use crate::record::RecordsError;
use crate::shard::messages::ControllerError;
use kafka_protocol::ResponseError;

pub const NONE: i16 = 0;

/// Kafka's message for CLUSTER_AUTHORIZATION_FAILED (the `Errors` default),
/// which the cluster-level refusals carry.
pub const CLUSTER_AUTHORIZATION_FAILED_MESSAGE: &str = "Cluster authorization failed.";

pub fn code(e: ResponseError) -> i16 {
    e.code()
}

/// Controller refusals, as Kafka's controller reports them.
pub fn controller(e: &ControllerError) -> i16 {
    match e {
        ControllerError::TopicAlreadyExists(_) => ResponseError::TopicAlreadyExists.code(),
        ControllerError::InvalidTopic(_) => ResponseError::InvalidTopicException.code(),
        ControllerError::UnknownTopic(_) => ResponseError::UnknownTopicOrPartition.code(),
        ControllerError::InvalidPartitions(_) => ResponseError::InvalidPartitions.code(),
        ControllerError::InvalidReplicationFactor(_) => {
            ResponseError::InvalidReplicationFactor.code()
        }
        ControllerError::InvalidReplicaAssignment(_) => {
            ResponseError::InvalidReplicaAssignment.code()
        }
        ControllerError::InvalidConfig(_) => ResponseError::InvalidConfig.code(),
        ControllerError::Storage(_) => ResponseError::KafkaStorageError.code(),
        ControllerError::ResourceNotFound(_) => ResponseError::ResourceNotFound.code(),
        ControllerError::InvalidRequest(_) => ResponseError::InvalidRequest.code(),
        ControllerError::NotController(_) => ResponseError::NotController.code(),
        ControllerError::Unavailable | ControllerError::TimedOut(_) => {
            ResponseError::RequestTimedOut.code()
        }
        ControllerError::FencedLeaderEpoch(_) => ResponseError::FencedLeaderEpoch.code(),
        ControllerError::InvalidUpdateVersion(_) => ResponseError::InvalidUpdateVersion.code(),
        ControllerError::NotLeader(_) => ResponseError::NotLeaderOrFollower.code(),
        ControllerError::IneligibleReplica(_) => ResponseError::IneligibleReplica.code(),
        ControllerError::UnknownTopicId(_) => ResponseError::UnknownTopicId.code(),
        ControllerError::UnknownPartition(_) => ResponseError::UnknownTopicOrPartition.code(),
        ControllerError::ElectionNotNeeded => ResponseError::ElectionNotNeeded.code(),
        ControllerError::PreferredLeaderNotAvailable => {
            ResponseError::PreferredLeaderNotAvailable.code()
        }
        ControllerError::EligibleLeadersNotAvailable => {
            ResponseError::EligibleLeadersNotAvailable.code()
        }
        ControllerError::NoReassignmentInProgress => ResponseError::NoReassignmentInProgress.code(),
        ControllerError::BrokerIdNotRegistered(_) => ResponseError::BrokerIdNotRegistered.code(),
    }
}

/// Partition log failures. A log whose writer is out of file descriptors
/// (`Unavailable`, it retries) answers KAFKA_STORAGE_ERROR as a failed one
/// does: Kafka's error for a log file it cannot access, and retriable for
/// clients (the Java client's `KafkaStorageException` is an
/// `InvalidMetadataException`; librdkafka refreshes metadata and retries),
/// so a producer retries it until the log works again or its delivery
/// timeout ends. REQUEST_TIMED_OUT would claim a wait that did not happen.
pub fn log(e: &LogError) -> i16 {
    match e {
        LogError::OffsetOutOfRange { .. } => ResponseError::OffsetOutOfRange.code(),
        LogError::Unavailable(_) => ResponseError::KafkaStorageError.code(),
        // A leader change under way (a replica truncating, or a follower's
        // log that a newer leader epoch reached): the client retries
        // after a metadata refresh.
        LogError::Truncating | LogError::Truncated { .. } | LogError::StaleLeaderEpoch { .. } => {
            ResponseError::NotLeaderOrFollower.code()
        }
        _ => ResponseError::KafkaStorageError.code(),
    }
}

/// Kafka's error code for a records check.
pub fn records(e: &RecordsError) -> i16 {
    use RecordsError as E;
    match e {
        E::CorruptSize(_) | E::InvalidMagic(_) | E::CrcMismatch { .. } => {
            ResponseError::CorruptMessage.code()
        }
        E::ZstdBeforeV7 { .. } => ResponseError::UnsupportedCompressionType.code(),
        E::TooLarge { .. } => ResponseError::MessageTooLarge.code(),
        E::UnknownCompression(_) => ResponseError::UnknownServerError.code(),
        _ => ResponseError::InvalidRecord.code(),
    }
}

/// A refused or failed append to a partition.
pub fn append(e: &AppendError) -> i16 {
    match e {
        AppendError::Producer(ProducerError::InvalidProducerEpoch { .. }) => {
            ResponseError::InvalidProducerEpoch.code()
        }
        AppendError::Producer(ProducerError::OutOfOrderSequence { .. }) => {
            ResponseError::OutOfOrderSequenceNumber.code()
        }
        AppendError::Records(e) => records(e),
        AppendError::Log(e) => log(e),
    }
}

/// Transaction coordinator refusals. `ProducerFenced` is PRODUCER_FENCED
/// for request versions that know it (`fenced_known`), INVALID_PRODUCER_EPOCH
/// before, as Kafka answers older clients.
pub fn txn(e: crate::txn::coordinator::TxnError, fenced_known: bool) -> i16 {
    use crate::txn::coordinator::TxnError as T;
    match e {
        T::NotCoordinator => ResponseError::NotCoordinator.code(),
        T::CoordinatorNotAvailable | T::Storage => ResponseError::CoordinatorNotAvailable.code(),
        T::CoordinatorLoadInProgress => ResponseError::CoordinatorLoadInProgress.code(),
        T::ConcurrentTransactions => ResponseError::ConcurrentTransactions.code(),
        T::InvalidProducerIdMapping => ResponseError::InvalidProducerIdMapping.code(),
        T::ProducerFenced if fenced_known => ResponseError::ProducerFenced.code(),
        T::ProducerFenced => ResponseError::InvalidProducerEpoch.code(),
        T::InvalidTxnState => ResponseError::InvalidTxnState.code(),
        T::InvalidTransactionTimeout => ResponseError::InvalidTransactionTimeout.code(),
    }
}

/// A coordinator's per-partition AddPartitionsToTxn answer (v4+, from
/// another node) read back as the error the local path would have had:
/// the inverse of [`txn`], as Kafka's AddPartitionsToTxnManager reads it
/// (PRODUCER_FENCED and INVALID_PRODUCER_EPOCH are a fenced producer;
/// anything else unexpected is retriable coordinator trouble).
pub fn txn_from_code(code: i16) -> Result<(), crate::txn::TxnError> {
    use crate::txn::TxnError as T;
    if code == NONE {
        return Ok(());
    }
    Err(match ResponseError::try_from_code(code) {
        Some(ResponseError::NotCoordinator) => T::NotCoordinator,
        Some(ResponseError::CoordinatorLoadInProgress) => T::CoordinatorLoadInProgress,
        Some(ResponseError::ConcurrentTransactions) => T::ConcurrentTransactions,
        Some(ResponseError::InvalidProducerIdMapping) => T::InvalidProducerIdMapping,
        Some(ResponseError::ProducerFenced | ResponseError::InvalidProducerEpoch) => {
            T::ProducerFenced
        }
        Some(ResponseError::InvalidTxnState) => T::InvalidTxnState,
        Some(ResponseError::InvalidTransactionTimeout) => T::InvalidTransactionTimeout,
        _ => T::CoordinatorNotAvailable,
    })
}

/// What a produce partition answers when adding it to the transaction
/// failed: retriable coordinator trouble is NOT_ENOUGH_REPLICAS, which every
/// client retries (KIP-890), a fenced producer INVALID_PRODUCER_EPOCH.
pub fn txn_on_produce(e: crate::txn::TxnError) -> i16 {
    use crate::txn::TxnError as T;
    match e {
        T::ProducerFenced => ResponseError::InvalidProducerEpoch.code(),
        T::InvalidProducerIdMapping | T::InvalidTxnState => ResponseError::InvalidTxnState.code(),
        _ => ResponseError::NotEnoughReplicas.code(),
    }
}

/// What a TxnOffsetCommit (v5+) answers when adding the group's offsets
/// partition to the transaction failed: trouble at the transaction
/// coordinator is COORDINATOR_LOAD_IN_PROGRESS, which the client retries.
pub fn txn_on_offset_commit(e: crate::txn::TxnError) -> i16 {
    use crate::txn::TxnError as T;
    match e {
        T::NotCoordinator | T::CoordinatorNotAvailable | T::Storage => {
            ResponseError::CoordinatorLoadInProgress.code()
        }
        e => txn(e, true),
    }
}

/// Group coordinator refusals.
pub fn group(e: &crate::group::error::GroupError) -> i16 {
    use crate::group::error::GroupError as G;
    let r = match e {
        G::NotCoordinator => ResponseError::NotCoordinator,
        G::LoadInProgress => ResponseError::CoordinatorLoadInProgress,
        G::CoordinatorNotAvailable => ResponseError::CoordinatorNotAvailable,
        G::InvalidGroupId => ResponseError::InvalidGroupId,
        G::UnknownMemberId => ResponseError::UnknownMemberId,
        G::MemberIdRequired(_) => ResponseError::MemberIdRequired,
        G::IllegalGeneration => ResponseError::IllegalGeneration,
        G::RebalanceInProgress => ResponseError::RebalanceInProgress,
        G::FencedInstanceId => ResponseError::FencedInstanceId,
        G::InconsistentGroupProtocol => ResponseError::InconsistentGroupProtocol,
        G::InvalidSessionTimeout => ResponseError::InvalidSessionTimeout,
        G::GroupMaxSizeReached => ResponseError::GroupMaxSizeReached,
        G::InvalidRequest(_) => ResponseError::InvalidRequest,
        G::GroupIdNotFound => ResponseError::GroupIdNotFound,
        G::NonEmptyGroup => ResponseError::NonEmptyGroup,
        G::GroupSubscribedToTopic => ResponseError::GroupSubscribedToTopic,
        G::UnknownTopicOrPartition => ResponseError::UnknownTopicOrPartition,
        G::GroupAuthorizationFailed => ResponseError::GroupAuthorizationFailed,
        G::OffsetMetadataTooLarge => ResponseError::OffsetMetadataTooLarge,
        G::UnstableOffsetCommit => ResponseError::UnstableOffsetCommit,
        G::InvalidProducerEpoch => ResponseError::InvalidProducerEpoch,
        G::FencedMemberEpoch => ResponseError::FencedMemberEpoch,
        G::StaleMemberEpoch => ResponseError::StaleMemberEpoch,
        G::UnreleasedInstanceId => ResponseError::UnreleasedInstanceId,
        G::UnsupportedAssignor(_) => ResponseError::UnsupportedAssignor,
        G::InvalidRegularExpression(_) => ResponseError::InvalidRegularExpression,
        // Kafka maps a failed coordinator write to a retriable error.
        G::Storage(_) => ResponseError::CoordinatorNotAvailable,
    };
    r.code()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::txn::TxnError as T;

    /// A coordinator's code read back on another node is the error the
    /// local path had, so the producer is answered alike either way.
    #[test]
    fn coordinator_codes_read_back_as_the_local_errors() {
        assert_eq!(txn_from_code(NONE), Ok(()));
        for e in [
            T::NotCoordinator,
            T::CoordinatorNotAvailable,
            T::CoordinatorLoadInProgress,
            T::ConcurrentTransactions,
            T::InvalidProducerIdMapping,
            T::ProducerFenced,
            T::InvalidTxnState,
            T::InvalidTransactionTimeout,
        ] {
            for fenced_known in [false, true] {
                let back = txn_from_code(txn(e, fenced_known)).unwrap_err();
                assert_eq!(back, e, "{e:?}");
                assert_eq!(txn_on_produce(back), txn_on_produce(e));
            }
        }
        // Storage trouble travels as COORDINATOR_NOT_AVAILABLE, answered alike.
        let back = txn_from_code(txn(T::Storage, true)).unwrap_err();
        assert_eq!(txn_on_produce(back), txn_on_produce(T::Storage));
        // Anything unexpected is retriable: NOT_ENOUGH_REPLICAS.
        let other = txn_from_code(ResponseError::UnknownTopicOrPartition.code()).unwrap_err();
        assert_eq!(
            txn_on_produce(other),
            ResponseError::NotEnoughReplicas.code()
        );
    }
}
