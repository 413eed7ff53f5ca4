//! Transactional offset commits (TxnOffsetCommit), as Kafka's group
//! coordinator keeps them: the offsets are appended to the group's
//! `__consumer_offsets` partition as a transactional batch of the producer
//! (its id and epoch), held as pending per producer id, and become the
//! group's committed offsets only when the transaction's COMMIT marker is
//! written to that partition ([`GroupCoordinator::complete_txn`]); an ABORT
//! drops them. At load, transactional records wait for their marker the
//! same way; those still open stay pending.

use std::collections::HashMap;

use bytes::Bytes;

use crate::offsets::{CommittedOffset, PartitionCommit, PartitionResults};
use crate::records::CoordinatorRecord;
use crate::{Create, GroupCoordinator, GroupState, OFFSETS_COMMIT_TIMEOUT};
use tessera_server_common::coordinator::{append_within, store_error, PartitionWriter};
use tessera_server_common::error::ApiError;

/// One offset waiting for its transaction to end.
#[derive(Clone, Debug)]
pub struct PendingOffset {
    pub group: String,
    pub topic: String,
    pub partition: i32,
    pub offset: CommittedOffset,
}

/// Pending transactional offsets by producer id.
#[derive(Default)]
pub struct TxnPending {
    by_producer: parking_lot::Mutex<HashMap<i64, Vec<PendingOffset>>>,
}

impl TxnPending {
    pub fn add(&self, producer_id: i64, offsets: Vec<PendingOffset>) {
        self.by_producer
            .lock()
            .entry(producer_id)
            .or_default()
            .extend(offsets);
    }

    pub fn take(&self, producer_id: i64) -> Vec<PendingOffset> {
        self.by_producer
            .lock()
            .remove(&producer_id)
            .unwrap_or_default()
    }

    /// Is an offset of this group and partition waiting for a transaction?
    pub fn is_pending(&self, group: &str, topic: &str, partition: i32) -> bool {
        self.by_producer.lock().values().any(|v| {
            v.iter()
                .any(|o| o.group == group && o.topic == topic && o.partition == partition)
        })
    }
}

/// A TxnOffsetCommit, already decoded.
#[derive(Clone, Debug)]
pub struct TxnCommitRequest {
    pub group_id: String,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub generation_id: i32,
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub topics: Vec<(String, Vec<PartitionCommit>)>,
}

/// Transactional records of one producer, read at load before their marker.
#[derive(Default)]
pub(crate) struct LoadPending {
    by_producer: HashMap<i64, Vec<CoordinatorRecord>>,
}

impl LoadPending {
    pub(crate) fn push(&mut self, producer_id: i64, record: CoordinatorRecord) {
        self.by_producer
            .entry(producer_id)
            .or_default()
            .push(record);
    }

    /// A marker: the records to replay now (commit) or none (abort).
    pub(crate) fn end(&mut self, producer_id: i64, commit: bool) -> Vec<CoordinatorRecord> {
        let records = self.by_producer.remove(&producer_id).unwrap_or_default();
        if commit {
            records
        } else {
            Vec::new()
        }
    }
}

impl GroupCoordinator {
    /// TxnOffsetCommit: validate against the group, append the offsets as
    /// the producer's transactional batch, then hold them as pending.
    pub async fn txn_offset_commit<W: PartitionWriter + ?Sized>(
        &self,
        writer: &W,
        req: TxnCommitRequest,
    ) -> PartitionResults {
        let fail = |e: ApiError| -> PartitionResults {
            req.topics
                .iter()
                .map(|(t, ps)| {
                    (
                        t.clone(),
                        ps.iter().map(|p| (p.partition, Err(e.clone()))).collect(),
                    )
                })
                .collect()
        };
        if req.group_id.is_empty() {
            return fail(ApiError::InvalidGroupId);
        }
        let (topic, partition) = match self.coordinator_partition(writer, &req.group_id) {
            Ok(tp) => tp,
            Err(e) => return fail(e),
        };
        let Some((slot, mut entry)) = self.lock(&req.group_id, Create::Simple).await else {
            return fail(ApiError::CoordinatorNotAvailable);
        };
        // Kafka's validateOffsetCommit: a transactional commit without
        // member information is accepted whatever the group's state.
        if req.generation_id >= 0 || !req.member_id.is_empty() || req.group_instance_id.is_some() {
            if let Err(e) = entry.state.group.kind().validate_offset_commit(
                &req.member_id,
                req.group_instance_id.as_deref(),
                req.generation_id,
            ) {
                return fail(e);
            }
        }
        let image = writer.image();
        let now = self.now();
        let (mut results, accepted) = self.check_commits(&image, &req.topics, now);
        let accepted: Vec<PendingOffset> = accepted
            .into_iter()
            .map(|(topic, partition, offset)| PendingOffset {
                group: req.group_id.clone(),
                topic,
                partition,
                offset,
            })
            .collect();
        if accepted.is_empty() {
            return results;
        }
        let encoded: Vec<(Option<Bytes>, Option<Bytes>)> = accepted
            .iter()
            .map(|o| {
                CoordinatorRecord::OffsetCommit {
                    group: o.group.clone(),
                    topic: o.topic.clone(),
                    partition: o.partition,
                    value: Some(o.offset.to_value()),
                }
                .encode()
            })
            .collect();
        let appended = append_within(
            OFFSETS_COMMIT_TIMEOUT,
            writer.append_transactional(
                &topic,
                partition,
                req.producer_id,
                req.producer_epoch,
                &encoded,
            ),
        )
        .await;
        if let Err(e) = appended {
            let e = store_error(e);
            for (_, partitions) in &mut results {
                for (_, r) in partitions.iter_mut() {
                    if r.is_ok() {
                        *r = Err(e.clone());
                    }
                }
            }
            return results;
        }
        entry.persisted = true;
        drop(entry);
        drop(slot);
        self.txn_pending.add(req.producer_id, accepted);
        results
    }

    /// The transaction of `producer_id` ended (its marker is durable in the
    /// offsets partitions): commit makes its pending offsets the committed
    /// ones, abort drops them.
    pub async fn complete_txn(&self, producer_id: i64, commit: bool) {
        let pending = self.txn_pending.take(producer_id);
        if !commit {
            return;
        }
        let mut by_group: HashMap<String, Vec<PendingOffset>> = HashMap::new();
        for o in pending {
            by_group.entry(o.group.clone()).or_default().push(o);
        }
        for (group, offsets) in by_group {
            let Some((_slot, mut entry)) = self.lock(&group, Create::Simple).await else {
                continue;
            };
            entry.persisted = true;
            for o in offsets {
                entry.state.offsets.insert(o.topic, o.partition, o.offset);
            }
        }
    }

    /// At the end of a load: transactions still open keep their offsets pending.
    pub(crate) fn keep_open_txn_offsets(&self, open: LoadPending) {
        for (producer_id, records) in open.by_producer {
            let offsets = records
                .into_iter()
                .filter_map(|r| match r {
                    CoordinatorRecord::OffsetCommit {
                        group,
                        topic,
                        partition,
                        value: Some(v),
                    } => Some(PendingOffset {
                        group,
                        topic,
                        partition,
                        offset: CommittedOffset::from_value(&v),
                    }),
                    _ => None,
                })
                .collect();
            self.txn_pending.add(producer_id, offsets);
        }
    }

    /// Used by load: replays committed transactional records into `states`.
    pub(crate) fn replay_committed(
        &self,
        states: &mut HashMap<String, GroupState>,
        records: Vec<CoordinatorRecord>,
        now: i64,
    ) {
        for r in records {
            self.replay(states, r, now);
        }
    }
}
