//! What the group and transaction coordinators share: the
//! [`PartitionWriter`] they see the broker through (Kafka's
//! `coordinator-common` seam), and leadership: a coordinator serves the ids
//! that hash to the internal partitions this broker leads, and only once
//! their state is loaded from the log. The broker's reconcile pass loads a
//! partition when this broker starts to lead it and unloads it when it
//! stops (see `broker/reconcile.rs`).

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use kafka_protocol::records::Record;
use parking_lot::RwLock;
use tessera_metadata::{MetadataImage, TopicImage};

use crate::error::ApiError;

/// What a coordinator needs of the partitions it keeps its state in
/// (Kafka's `PartitionWriter`, "the minimum required for coordinators"):
/// implemented over the broker's range logs in `broker/internal_topics.rs`,
/// and in memory by the coordinators' tests.
pub trait PartitionWriter: Send + Sync {
    /// The committed metadata image.
    fn image(&self) -> Arc<MetadataImage>;

    /// The leader epoch of `partition` of `topic` when this broker leads
    /// it (and so may coordinate what hashes to it); NOT_LEADER_OR_FOLLOWER
    /// otherwise.
    fn check_leader(
        &self,
        image: &MetadataImage,
        topic: &TopicImage,
        partition: i32,
    ) -> Result<i32, ApiError>;

    /// The internal topic `name`, created (compacted) if it does not exist.
    fn ensure_internal_topic(
        &self,
        name: &str,
        partitions: u32,
    ) -> impl Future<Output = Result<Arc<TopicImage>, ApiError>> + Send;

    /// Appends `records` as one batch and waits until it is durable as the
    /// topic's `acks=all` requires; the batch's base offset.
    fn append_records(
        &self,
        topic: &TopicImage,
        partition: i32,
        records: &[(Option<Bytes>, Option<Bytes>)],
    ) -> impl Future<Output = Result<i64, ApiError>> + Send;

    /// Appends `records` as one transactional batch of `producer_id` at
    /// `producer_epoch` (at its next sequence in the partition) and waits
    /// until it is durable; its base offset. Transactional offset commits.
    fn append_transactional(
        &self,
        topic: &TopicImage,
        partition: i32,
        producer_id: i64,
        producer_epoch: i16,
        records: &[(Option<Bytes>, Option<Bytes>)],
    ) -> impl Future<Output = Result<i64, ApiError>> + Send;

    /// Every record of a partition this broker leads, in offset order
    /// (what a coordinator replays when it starts to lead it), its history
    /// in ancestor ranges and on other replicas included.
    fn read_records(
        &self,
        topic: &TopicImage,
        partition: i32,
    ) -> impl Future<Output = Result<Vec<Record>, ApiError>> + Send;
}

/// Where the transaction coordinator gets new producer ids (Kafka's
/// `ProducerIdManager`: blocks allocated through the metadata log).
pub trait ProducerIdSource: Send + Sync {
    fn next_producer_id(&self) -> impl Future<Output = Result<i64, ApiError>> + Send;
}

/// One transaction's end, as markers must record it.
#[derive(Clone, Debug)]
pub struct Markers {
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub commit: bool,
    pub coordinator_epoch: i32,
}

/// Who writes a transaction's COMMIT/ABORT markers into its partitions
/// (Kafka's `TransactionMarkerChannelManager`): this broker for the ones it
/// leads, WriteTxnMarkers to the others.
pub trait TxnMarkerWriter: Send + Sync {
    /// Writes `markers` to every partition and waits until each is durable.
    fn write_markers(
        &self,
        markers: &Markers,
        partitions: &[(String, i32)],
    ) -> impl Future<Output = Result<(), ApiError>> + Send;
}

/// All the transaction coordinator needs of the broker.
pub trait TxnHost: PartitionWriter + ProducerIdSource + TxnMarkerWriter {}

impl<T: PartitionWriter + ProducerIdSource + TxnMarkerWriter + ?Sized> TxnHost for T {}

/// The internal partitions whose coordinator state is loaded.
#[derive(Default)]
pub struct LoadedPartitions {
    loaded: RwLock<BTreeSet<i32>>,
}

impl LoadedPartitions {
    /// A partition this broker leads but has not loaded yet answers
    /// COORDINATOR_LOAD_IN_PROGRESS, as Kafka's coordinators do: the client
    /// retries until the load is done.
    pub fn check(&self, partition: i32) -> Result<(), ApiError> {
        if self.loaded.read().contains(&partition) {
            Ok(())
        } else {
            Err(ApiError::CoordinatorLoadInProgress)
        }
    }

    pub fn add(&self, partitions: &[i32]) {
        self.loaded.write().extend(partitions.iter().copied());
    }

    pub fn remove(&self, partitions: &[i32]) {
        let mut loaded = self.loaded.write();
        for p in partitions {
            loaded.remove(p);
        }
    }
}

/// Waits for a coordinator's append to its internal partition for at most
/// `timeout`, then gives up with REQUEST_TIMED_OUT (which [`store_error`]
/// reports as COORDINATOR_NOT_AVAILABLE), as Kafka bounds these appends. A
/// coordinator holds a group's or a transaction's lock, and its client's
/// connection waits, while the append does: one that cannot complete (its
/// log closed under it, a commit that never comes) must not stall them.
pub async fn append_within<T>(
    timeout: std::time::Duration,
    append: impl Future<Output = Result<T, ApiError>>,
) -> Result<T, ApiError> {
    tokio::time::timeout(timeout, append)
        .await
        .unwrap_or(Err(ApiError::RequestTimedOut))
}

/// Maps a coordinator's failed append to what its request reports (Kafka's
/// `appendGroupMetadataErrorToResponseError`; the transaction coordinator
/// maps the same way).
pub fn store_error(e: ApiError) -> ApiError {
    match e {
        ApiError::UnknownTopicOrPartition | ApiError::RequestTimedOut => {
            ApiError::CoordinatorNotAvailable
        }
        ApiError::NotLeaderOrFollower | ApiError::Storage(_) => ApiError::NotCoordinator,
        ApiError::MessageTooLarge(m) => ApiError::UnknownServerError(m),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_append_that_never_completes_is_a_retriable_coordinator_error() {
        let never = std::future::pending::<Result<i64, ApiError>>();
        let r = append_within(std::time::Duration::from_millis(10), never).await;
        assert!(matches!(r, Err(ApiError::RequestTimedOut)), "{r:?}");
        assert!(matches!(
            store_error(r.unwrap_err()),
            ApiError::CoordinatorNotAvailable
        ));
        let done = append_within(std::time::Duration::from_secs(60), async { Ok(3) }).await;
        assert!(matches!(done, Ok(3)));
    }

    #[test]
    fn a_partition_serves_only_while_loaded() {
        let l = LoadedPartitions::default();
        assert!(matches!(
            l.check(3),
            Err(ApiError::CoordinatorLoadInProgress)
        ));
        l.add(&[3, 4]);
        assert!(l.check(3).is_ok());
        l.remove(&[3]);
        assert!(matches!(
            l.check(3),
            Err(ApiError::CoordinatorLoadInProgress)
        ));
        assert!(l.check(4).is_ok());
    }
}
