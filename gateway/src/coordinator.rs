//! What the group and transaction coordinators share about leadership: a
//! coordinator serves the ids that hash to the internal partitions this
//! broker leads, and only once their state is loaded from the log. The
//! broker's reconcile pass loads a partition when this broker starts to lead
//! it and unloads it when it stops (see `broker/reconcile.rs`).

use std::collections::BTreeSet;

use parking_lot::RwLock;

use crate::error::ApiError;

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
