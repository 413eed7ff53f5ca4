//! The one path from an appended batch to its acknowledgement.
//!
//! Produce, the group and transaction coordinators' records and transaction
//! markers all append through [`Broker::append_batch`] and wait through
//! [`DurabilityWaits`]. "Durable" means fsynced on a quorum of the active
//! segment's replicas (the range log's committed position, which also moves
//! the high watermark); acks=1 waits for this broker's fsync only.
//!
//! A wait is kept per range the batch was appended to, never looked up again
//! through the metadata image: after a split or merge the partition belongs
//! to another range, and a failure must still be reported on the partitions
//! whose appends it covered.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tessera_log::{AppendOutcome, RangeLog};
use tessera_metadata::RangeId;

use crate::broker::{Broker, PartitionRoute};
use crate::error::ApiError;

impl Broker {
    /// Appends one validated batch of `partition` to the range `route`
    /// resolved (rewriting its offsets in place) and records a segment roll
    /// the append made. The batch is acknowledged only once
    /// [`DurabilityWaits`] says so.
    pub fn append_batch(
        &self,
        route: &PartitionRoute,
        partition: u32,
        bytes: &mut [u8],
        log_append_time: Option<i64>,
    ) -> Result<AppendOutcome, ApiError> {
        let outcome = route.log.append(partition, bytes, log_append_time)?;
        if let Some(sealed) = &outcome.rolled {
            self.notify_roll(route.range_id, sealed.clone());
        }
        Ok(outcome)
    }

    /// Migration only (`api/migrate_append.rs`): appends one validated
    /// batch copied from another cluster at its own base offset, through
    /// the same roll recording and durability waits as any append.
    pub fn append_batch_at_source_offset(
        &self,
        route: &PartitionRoute,
        partition: u32,
        bytes: &mut [u8],
    ) -> Result<AppendOutcome, ApiError> {
        let outcome = route.log.append_at_source_offset(partition, bytes)?;
        if let Some(sealed) = &outcome.rolled {
            self.notify_roll(route.range_id, sealed.clone());
        }
        Ok(outcome)
    }

    /// Appends one batch broker-side (coordinator records, markers) and
    /// waits until it is durable. Returns its base offset.
    pub async fn append_durably(
        &self,
        route: &PartitionRoute,
        partition: u32,
        mut bytes: Vec<u8>,
    ) -> Result<i64, ApiError> {
        tessera_log::batch::validate(&bytes)?;
        let outcome = self.append_batch(route, partition, &mut bytes, None)?;
        let mut waits = DurabilityWaits::default();
        waits.add(route, &outcome);
        waits.wait_all().await?;
        Ok(outcome.base_offset)
    }
}

/// What a request must wait for before it acknowledges: per range appended
/// to, the furthest position its appends end at; and whether a quorum of the
/// segment's replicas must have it (acks=-1, and every broker-side append)
/// or this broker's disk is enough (acks=1).
#[derive(Default)]
pub struct DurabilityWaits {
    ranges: HashMap<RangeId, (Arc<RangeLog>, u64)>,
    leader_only: bool,
}

impl DurabilityWaits {
    /// The waits of a produce request with `acks` (1: the leader's fsync;
    /// -1: a quorum of the replicas).
    pub fn for_acks(acks: i16) -> DurabilityWaits {
        DurabilityWaits {
            ranges: HashMap::new(),
            leader_only: acks == 1,
        }
    }

    /// Adds an append (a duplicate too: its original must be durable before
    /// the retry is acknowledged, and it is once the log reached this position).
    pub fn add(&mut self, route: &PartitionRoute, outcome: &AppendOutcome) {
        let entry = self
            .ranges
            .entry(route.range_id)
            .or_insert_with(|| (route.log.clone(), 0));
        entry.1 = entry.1.max(outcome.end_position);
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Waits for every range, each for at most `timeout` (None: until it is
    /// durable or fails). Returns the ranges that did not become durable and why.
    pub async fn wait(self, timeout: Option<Duration>) -> HashMap<RangeId, ApiError> {
        let mut failed = HashMap::new();
        for (range, (log, position)) in self.ranges {
            let leader_only = self.leader_only;
            let durable = async move {
                if leader_only {
                    log.wait_local_durable(position).await
                } else {
                    log.wait_durable(position).await
                }
            };
            let result = match timeout {
                Some(t) => match tokio::time::timeout(t, durable).await {
                    Ok(r) => r.map_err(ApiError::from),
                    Err(_) => Err(ApiError::RequestTimedOut),
                },
                None => durable.await.map_err(ApiError::from),
            };
            if let Err(e) = result {
                failed.insert(range, e);
            }
        }
        failed
    }

    /// Waits for every range; the first failure, if any.
    pub async fn wait_all(self) -> Result<(), ApiError> {
        match self.wait(None).await.into_values().next() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}
