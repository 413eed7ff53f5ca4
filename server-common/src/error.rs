//! The error every Kafka API handler and coordinator reports
//! ([`ApiError`]), and the one place it maps to Kafka error codes.

use kafka_protocol::error::ResponseError;
use thiserror::Error;

/// An error a request handler reports to the client as a Kafka error code.
#[derive(Debug, Error, Clone)]
pub enum ApiError {
    #[error("unknown topic or partition")]
    UnknownTopicOrPartition,
    #[error("unknown topic id")]
    UnknownTopicId,
    #[error("invalid topic: {0}")]
    InvalidTopic(String),
    #[error("topic {0:?} already exists")]
    TopicAlreadyExists(String),
    #[error("invalid partitions: {0}")]
    InvalidPartitions(String),
    #[error("invalid replication factor: {0}")]
    InvalidReplicationFactor(String),
    #[error("invalid replica assignment: {0}")]
    InvalidReplicaAssignment(String),
    #[error("invalid config: {0}")]
    InvalidConfig(String),
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// UnregisterBroker of a broker id the image does not hold.
    #[error("{0}")]
    BrokerIdNotRegistered(String),
    #[error("unsupported version: {0}")]
    UnsupportedVersion(String),
    #[error("corrupt message: {0}")]
    CorruptMessage(String),
    #[error("unsupported message format: {0}")]
    UnsupportedForMessageFormat(String),
    #[error("message too large: {0}")]
    MessageTooLarge(String),
    #[error("invalid required acks {0}")]
    InvalidRequiredAcks(i16),
    #[error("offset out of range")]
    OffsetOutOfRange,
    #[error("{0}")]
    PolicyViolation(String),
    #[error("leader election not needed for topic partition")]
    ElectionNotNeeded,
    #[error("{0}")]
    EligibleLeadersNotAvailable(String),
    #[error("{0}")]
    PreferredLeaderNotAvailable(String),
    #[error("{0}")]
    NoReassignmentInProgress(String),
    #[error("not leader or follower")]
    NotLeaderOrFollower,
    #[error("the client's leader epoch is newer than the broker's")]
    UnknownLeaderEpoch,
    #[error("the client's leader epoch is older than the broker's")]
    FencedLeaderEpoch,
    #[error("out of order sequence number: {0}")]
    OutOfOrderSequence(String),
    #[error("invalid producer epoch: {0}")]
    InvalidProducerEpoch(String),
    #[error("request timed out")]
    RequestTimedOut,
    #[error("storage error: {0}")]
    Storage(String),
    #[error("metadata: {0}")]
    Metadata(String),
    #[error("unknown server error: {0}")]
    UnknownServerError(String),
    #[error("the coordinator is not available")]
    CoordinatorNotAvailable,
    #[error("the coordinator is loading and cannot serve requests yet")]
    CoordinatorLoadInProgress,
    #[error("this is not the correct coordinator")]
    NotCoordinator,
    #[error("invalid group id")]
    InvalidGroupId,
    #[error("the coordinator is not aware of this member")]
    UnknownMemberId,
    #[error("illegal generation")]
    IllegalGeneration,
    #[error("the group is rebalancing, so a rejoin is needed")]
    RebalanceInProgress,
    #[error("the member's protocols are incompatible with the group's")]
    InconsistentGroupProtocol,
    #[error("the session timeout is not within the range the broker allows")]
    InvalidSessionTimeout,
    #[error("the member needs a member id: join again with the one given")]
    MemberIdRequired,
    #[error("another consumer with the same group.instance.id has registered with a different member.id")]
    FencedInstanceId,
    #[error("the group id does not exist")]
    GroupIdNotFound,
    #[error("the group is not empty")]
    NonEmptyGroup,
    #[error("the group is subscribed to the topic")]
    GroupSubscribedToTopic,
    #[error("the offset metadata is too large")]
    OffsetMetadataTooLarge,
    #[error("the group has reached its max size")]
    GroupMaxSizeReached,
    #[error("there is a newer producer with the same transactional id")]
    ProducerFenced,
    #[error("the producer attempted a transactional operation in an invalid state: {0}")]
    InvalidTxnState(String),
    #[error("the producer id is not assigned to this transactional id")]
    InvalidProducerIdMapping,
    #[error("the transaction timeout is larger than transaction.max.timeout.ms")]
    InvalidTransactionTimeout,
    #[error("another operation on the same transaction is in progress")]
    ConcurrentTransactions,
    #[error("invalid record: {0}")]
    InvalidRecord(String),
    /// Records of a batch that broke a per-record rule (Kafka's
    /// `RecordValidationException`): INVALID_TIMESTAMP if any is a
    /// timestamp error, else INVALID_RECORD; Produce v8+ lists them.
    #[error("{}", tessera_log::validator::batch_message(.0))]
    RecordErrors(Vec<tessera_log::validator::RecordError>),
    #[error("the transactional id could not be found")]
    TransactionalIdNotFound,
    #[error("{in_sync} in-sync replica(s), fewer than min.insync.replicas {required}")]
    NotEnoughReplicas { in_sync: usize, required: usize },
    #[error("written on the leader, but the in-sync replicas fell below min.insync.replicas before a quorum had it")]
    NotEnoughReplicasAfterAppend,
    #[error("{0}")]
    IllegalSaslState(String),
    #[error("{0}")]
    UnsupportedSaslMechanism(String),
    #[error("{0}")]
    ResourceNotFound(String),
    #[error("{0}")]
    DuplicateResource(String),
    #[error("{0}")]
    UnacceptableCredential(String),
    #[error("topic authorization failed")]
    TopicAuthorizationFailed,
    #[error("group authorization failed")]
    GroupAuthorizationFailed,
    #[error("cluster authorization failed")]
    ClusterAuthorizationFailed,
    #[error("transactional id authorization failed")]
    TransactionalIdAuthorizationFailed,
    #[error("no authorizer is configured on the broker (authorizer.class.name)")]
    SecurityDisabled,
    #[error("the broker did not attempt this operation: another in the request failed")]
    OperationNotAttempted,
    /// A coordinator's state machine refused the request with a code of
    /// its choosing and Kafka's message (a KIP-848 group's
    /// FENCED_MEMBER_EPOCH, say). Coded here so that this, the lowest
    /// module, names no coordinator's own error type.
    #[error("{message}")]
    Coded {
        code: ResponseError,
        message: String,
    },
}

impl ApiError {
    /// The Kafka error this maps to.
    pub fn kafka(&self) -> ResponseError {
        use ResponseError as K;
        match self {
            ApiError::UnknownTopicOrPartition => K::UnknownTopicOrPartition,
            ApiError::UnknownTopicId => K::UnknownTopicId,
            ApiError::InvalidTopic(_) => K::InvalidTopicException,
            ApiError::TopicAlreadyExists(_) => K::TopicAlreadyExists,
            ApiError::InvalidPartitions(_) => K::InvalidPartitions,
            ApiError::InvalidReplicationFactor(_) => K::InvalidReplicationFactor,
            ApiError::InvalidReplicaAssignment(_) => K::InvalidReplicaAssignment,
            ApiError::InvalidConfig(_) => K::InvalidConfig,
            ApiError::InvalidRequest(_) => K::InvalidRequest,
            ApiError::BrokerIdNotRegistered(_) => K::BrokerIdNotRegistered,
            ApiError::UnsupportedVersion(_) => K::UnsupportedVersion,
            ApiError::CorruptMessage(_) => K::CorruptMessage,
            ApiError::UnsupportedForMessageFormat(_) => K::UnsupportedForMessageFormat,
            ApiError::MessageTooLarge(_) => K::MessageTooLarge,
            ApiError::InvalidRequiredAcks(_) => K::InvalidRequiredAcks,
            ApiError::OffsetOutOfRange => K::OffsetOutOfRange,
            ApiError::PolicyViolation(_) => K::PolicyViolation,
            ApiError::ElectionNotNeeded => K::ElectionNotNeeded,
            ApiError::EligibleLeadersNotAvailable(_) => K::EligibleLeadersNotAvailable,
            ApiError::PreferredLeaderNotAvailable(_) => K::PreferredLeaderNotAvailable,
            ApiError::NoReassignmentInProgress(_) => K::NoReassignmentInProgress,
            ApiError::NotLeaderOrFollower => K::NotLeaderOrFollower,
            ApiError::UnknownLeaderEpoch => K::UnknownLeaderEpoch,
            ApiError::FencedLeaderEpoch => K::FencedLeaderEpoch,
            ApiError::OutOfOrderSequence(_) => K::OutOfOrderSequenceNumber,
            ApiError::InvalidProducerEpoch(_) => K::InvalidProducerEpoch,
            ApiError::RequestTimedOut => K::RequestTimedOut,
            ApiError::Storage(_) => K::KafkaStorageError,
            ApiError::Metadata(_) => K::UnknownServerError,
            ApiError::UnknownServerError(_) => K::UnknownServerError,
            ApiError::CoordinatorNotAvailable => K::CoordinatorNotAvailable,
            ApiError::CoordinatorLoadInProgress => K::CoordinatorLoadInProgress,
            ApiError::NotCoordinator => K::NotCoordinator,
            ApiError::InvalidGroupId => K::InvalidGroupId,
            ApiError::UnknownMemberId => K::UnknownMemberId,
            ApiError::IllegalGeneration => K::IllegalGeneration,
            ApiError::RebalanceInProgress => K::RebalanceInProgress,
            ApiError::InconsistentGroupProtocol => K::InconsistentGroupProtocol,
            ApiError::InvalidSessionTimeout => K::InvalidSessionTimeout,
            ApiError::MemberIdRequired => K::MemberIdRequired,
            ApiError::FencedInstanceId => K::FencedInstanceId,
            ApiError::GroupIdNotFound => K::GroupIdNotFound,
            ApiError::NonEmptyGroup => K::NonEmptyGroup,
            ApiError::GroupSubscribedToTopic => K::GroupSubscribedToTopic,
            ApiError::OffsetMetadataTooLarge => K::OffsetMetadataTooLarge,
            ApiError::GroupMaxSizeReached => K::GroupMaxSizeReached,
            ApiError::ProducerFenced => K::ProducerFenced,
            ApiError::InvalidTxnState(_) => K::InvalidTxnState,
            ApiError::InvalidProducerIdMapping => K::InvalidProducerIdMapping,
            ApiError::InvalidTransactionTimeout => K::InvalidTransactionTimeout,
            ApiError::ConcurrentTransactions => K::ConcurrentTransactions,
            ApiError::InvalidRecord(_) => K::InvalidRecord,
            ApiError::RecordErrors(errors) if errors.iter().any(|e| e.invalid_timestamp) => {
                K::InvalidTimestamp
            }
            ApiError::RecordErrors(_) => K::InvalidRecord,
            ApiError::TransactionalIdNotFound => K::TransactionalIdNotFound,
            ApiError::NotEnoughReplicas { .. } => K::NotEnoughReplicas,
            ApiError::NotEnoughReplicasAfterAppend => K::NotEnoughReplicasAfterAppend,
            ApiError::IllegalSaslState(_) => K::IllegalSaslState,
            ApiError::UnsupportedSaslMechanism(_) => K::UnsupportedSaslMechanism,
            ApiError::ResourceNotFound(_) => K::ResourceNotFound,
            ApiError::DuplicateResource(_) => K::DuplicateResource,
            ApiError::UnacceptableCredential(_) => K::UnacceptableCredential,
            ApiError::TopicAuthorizationFailed => K::TopicAuthorizationFailed,
            ApiError::GroupAuthorizationFailed => K::GroupAuthorizationFailed,
            ApiError::ClusterAuthorizationFailed => K::ClusterAuthorizationFailed,
            ApiError::TransactionalIdAuthorizationFailed => K::TransactionalIdAuthorizationFailed,
            ApiError::SecurityDisabled => K::SecurityDisabled,
            ApiError::OperationNotAttempted => K::OperationNotAttempted,
            ApiError::Coded { code, .. } => *code,
        }
    }

    pub fn code(&self) -> i16 {
        self.kafka().code()
    }

    /// The message to send where the response has an error_message field.
    pub fn message(&self) -> Option<String> {
        Some(self.to_string())
    }
}

impl From<tessera_log::BatchError> for ApiError {
    fn from(e: tessera_log::BatchError) -> Self {
        match e {
            tessera_log::BatchError::UnsupportedMagic(m) => ApiError::UnsupportedForMessageFormat(
                format!("record batch magic {m}, only 2 is accepted"),
            ),
            other => ApiError::CorruptMessage(other.to_string()),
        }
    }
}

impl From<tessera_log::LogError> for ApiError {
    fn from(e: tessera_log::LogError) -> Self {
        use tessera_log::LogError as L;
        match e {
            L::OffsetOutOfRange { .. } => ApiError::OffsetOutOfRange,
            e @ L::OffsetBelowLogEnd { .. } => ApiError::InvalidRecord(e.to_string()),
            // A range that moved or closed under the request: the client refreshes metadata.
            L::PartitionNotInRange(_) | L::Closed | L::SegmentSealed => {
                ApiError::NotLeaderOrFollower
            }
            L::Batch(b) => b.into(),
            L::Sequence(
                e @ tessera_log::producer_state::SequenceError::InvalidProducerEpoch { .. },
            ) => ApiError::InvalidProducerEpoch(e.to_string()),
            L::Sequence(e) => ApiError::OutOfOrderSequence(e.to_string()),
            L::Io(e) => ApiError::Storage(e.to_string()),
            L::StorageFailed => ApiError::Storage("log storage failed".into()),
            L::NotEnoughReplicasAfterAppend => ApiError::NotEnoughReplicasAfterAppend,
            e @ L::SegmentNotFound(_) => ApiError::Storage(e.to_string()),
        }
    }
}

impl From<tessera_planner::PlanError> for ApiError {
    fn from(e: tessera_planner::PlanError) -> Self {
        use tessera_planner::PlanError as P;
        match e {
            P::TopicAlreadyExists(name) => ApiError::TopicAlreadyExists(name),
            e @ P::CollidingTopicName(_) => ApiError::InvalidTopic(e.to_string()),
            P::InvalidPartitions(m) => ApiError::InvalidPartitions(m),
            P::InvalidReplicationFactor(m) => ApiError::InvalidReplicationFactor(m),
            P::InvalidReplicaAssignment(m) => ApiError::InvalidReplicaAssignment(m),
            P::UnknownTopic => ApiError::UnknownTopicOrPartition,
            e @ (P::UnknownRange(_) | P::RangeSealed(_) | P::InvalidMove(_)) => {
                ApiError::InvalidRequest(e.to_string())
            }
        }
    }
}

impl From<tessera_metadata::MetadataError> for ApiError {
    fn from(e: tessera_metadata::MetadataError) -> Self {
        ApiError::Metadata(e.to_string())
    }
}

/// Kafka's code for "no error".
pub const NONE: i16 = 0;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_kafkas() {
        assert_eq!(ApiError::UnknownTopicOrPartition.code(), 3);
        assert_eq!(ApiError::CorruptMessage(String::new()).code(), 2);
        assert_eq!(ApiError::MessageTooLarge(String::new()).code(), 10);
        assert_eq!(ApiError::InvalidTopic(String::new()).code(), 17);
        assert_eq!(ApiError::TopicAlreadyExists(String::new()).code(), 36);
        assert_eq!(ApiError::InvalidReplicationFactor(String::new()).code(), 38);
        assert_eq!(ApiError::InvalidConfig(String::new()).code(), 40);
        assert_eq!(ApiError::OffsetOutOfRange.code(), 1);
        assert_eq!(ApiError::IllegalSaslState(String::new()).code(), 34);
        assert_eq!(ApiError::UnsupportedSaslMechanism(String::new()).code(), 33);
        assert_eq!(ApiError::ResourceNotFound(String::new()).code(), 91);
        assert_eq!(ApiError::DuplicateResource(String::new()).code(), 92);
        assert_eq!(ApiError::UnacceptableCredential(String::new()).code(), 93);
        assert_eq!(ApiError::UnknownTopicId.code(), 100);
        assert_eq!(ApiError::CoordinatorNotAvailable.code(), 15);
        assert_eq!(ApiError::CoordinatorLoadInProgress.code(), 14);
        assert_eq!(ApiError::NotCoordinator.code(), 16);
        assert_eq!(ApiError::IllegalGeneration.code(), 22);
        assert_eq!(ApiError::UnknownMemberId.code(), 25);
        assert_eq!(ApiError::RebalanceInProgress.code(), 27);
        assert_eq!(ApiError::NonEmptyGroup.code(), 68);
        assert_eq!(ApiError::GroupIdNotFound.code(), 69);
        assert_eq!(ApiError::MemberIdRequired.code(), 79);
        assert_eq!(ApiError::FencedInstanceId.code(), 82);
        assert_eq!(ApiError::GroupSubscribedToTopic.code(), 86);
        assert_eq!(ApiError::InvalidTxnState(String::new()).code(), 48);
        assert_eq!(ApiError::InvalidProducerIdMapping.code(), 49);
        assert_eq!(ApiError::InvalidTransactionTimeout.code(), 50);
        assert_eq!(ApiError::ConcurrentTransactions.code(), 51);
        assert_eq!(ApiError::InvalidRecord(String::new()).code(), 87);
        assert_eq!(ApiError::ProducerFenced.code(), 90);
        assert_eq!(ApiError::TransactionalIdNotFound.code(), 105);
        let short = ApiError::NotEnoughReplicas {
            in_sync: 1,
            required: 2,
        };
        assert_eq!(short.code(), 19);
        assert_eq!(ApiError::NotEnoughReplicasAfterAppend.code(), 20);
        assert_eq!(ApiError::InvalidPartitions(String::new()).code(), 37);
        assert_eq!(ApiError::InvalidReplicaAssignment(String::new()).code(), 39);
        assert_eq!(ApiError::PolicyViolation(String::new()).code(), 44);
        assert_eq!(ApiError::ElectionNotNeeded.code(), 84);
        assert_eq!(
            ApiError::EligibleLeadersNotAvailable(String::new()).code(),
            83
        );
        assert_eq!(
            ApiError::PreferredLeaderNotAvailable(String::new()).code(),
            80
        );
        assert_eq!(ApiError::NoReassignmentInProgress(String::new()).code(), 85);
        assert_eq!(ApiError::TopicAuthorizationFailed.code(), 29);
        assert_eq!(ApiError::GroupAuthorizationFailed.code(), 30);
        assert_eq!(ApiError::ClusterAuthorizationFailed.code(), 31);
        assert_eq!(ApiError::TransactionalIdAuthorizationFailed.code(), 53);
        assert_eq!(ApiError::SecurityDisabled.code(), 54);
        assert_eq!(ApiError::OperationNotAttempted.code(), 55);
        assert_eq!(ApiError::BrokerIdNotRegistered(String::new()).code(), 102);
        assert_eq!(ApiError::InvalidRequest(String::new()).code(), 42);
    }
}
