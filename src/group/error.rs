//! Errors of the group coordinator, one variant per Kafka error it can
//! answer. They become Kafka error codes in `handlers::errors::group` and
//! nowhere else.

/// A refusal from the group coordinator.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GroupError {
    #[error("this shard does not coordinate the group")]
    NotCoordinator,
    #[error("the group's offsets partition is still being loaded")]
    LoadInProgress,
    #[error("the coordinator is not available")]
    CoordinatorNotAvailable,
    #[error("invalid group id")]
    InvalidGroupId,
    #[error("unknown member id")]
    UnknownMemberId,
    #[error("the member must rejoin with the member id {0}")]
    MemberIdRequired(String),
    #[error("illegal generation")]
    IllegalGeneration,
    #[error("a rebalance is in progress")]
    RebalanceInProgress,
    #[error("the static member was fenced by a newer instance")]
    FencedInstanceId,
    #[error("inconsistent group protocol")]
    InconsistentGroupProtocol,
    #[error("session timeout out of the broker's range")]
    InvalidSessionTimeout,
    #[error("the group already has group.max.size members")]
    GroupMaxSizeReached,
    #[error("invalid request: {0}")]
    InvalidRequest(&'static str),
    #[error("the group does not exist")]
    GroupIdNotFound,
    #[error("the group is not empty")]
    NonEmptyGroup,
    #[error("the group is subscribed to the topic")]
    GroupSubscribedToTopic,
    #[error("the topic or partition does not exist")]
    UnknownTopicOrPartition,
    /// The principal may not use the group (ACLs; checked by the handlers).
    #[error("group authorization failed")]
    GroupAuthorizationFailed,
    #[error("offset metadata too large")]
    OffsetMetadataTooLarge,
    #[error("an unstable (transactional) offset commit is pending")]
    UnstableOffsetCommit,
    #[error("the transactional producer was fenced by a newer epoch")]
    InvalidProducerEpoch,
    #[error("the member epoch is fenced")]
    FencedMemberEpoch,
    #[error("the member epoch is stale")]
    StaleMemberEpoch,
    #[error("the instance id is still used by another member")]
    UnreleasedInstanceId,
    #[error("unsupported assignor {0}")]
    UnsupportedAssignor(String),
    #[error("invalid regular expression: {0}")]
    InvalidRegularExpression(String),
    #[error("writing to the offsets partition failed: {0}")]
    Storage(String),
}
