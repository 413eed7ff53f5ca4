//! Committed offsets: the per-group store (shared by every kind of group),
//! and OffsetCommit / OffsetFetch / OffsetDelete on the coordinator.
//!
//! A commit is validated against the group (through [`GroupKind`], so each
//! group protocol fences its own members), appended to `__consumer_offsets`
//! as Kafka's OffsetCommit records, and only then applied in memory and
//! acknowledged.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::records::{CoordinatorRecord, OffsetCommitValue};
use crate::{Create, GroupCoordinator};
use tessera_server_common::coordinator::{store_error, PartitionWriter};
use tessera_server_common::error::ApiError;

/// One committed offset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommittedOffset {
    pub offset: i64,
    /// -1 when the client did not send one.
    pub leader_epoch: i32,
    pub metadata: String,
    pub commit_timestamp: i64,
}

impl CommittedOffset {
    pub fn to_value(&self) -> OffsetCommitValue {
        OffsetCommitValue {
            offset: self.offset,
            leader_epoch: self.leader_epoch,
            metadata: self.metadata.clone(),
            commit_timestamp: self.commit_timestamp,
            expire_timestamp: -1,
        }
    }

    pub fn from_value(v: &OffsetCommitValue) -> Self {
        CommittedOffset {
            offset: v.offset,
            leader_epoch: v.leader_epoch,
            metadata: v.metadata.clone(),
            commit_timestamp: v.commit_timestamp,
        }
    }
}

/// A group's committed offsets, by (topic, partition). Cloning is cheap (a
/// transition works on a copy of the group's state); a write copies the map
/// only while a copy is alive.
#[derive(Clone, Debug, Default)]
pub struct GroupOffsets {
    map: Arc<BTreeMap<(String, i32), CommittedOffset>>,
}

impl GroupOffsets {
    pub fn get(&self, topic: &str, partition: i32) -> Option<&CommittedOffset> {
        self.map.get(&(topic.to_string(), partition))
    }

    pub fn insert(&mut self, topic: String, partition: i32, offset: CommittedOffset) {
        Arc::make_mut(&mut self.map).insert((topic, partition), offset);
    }

    pub fn remove(&mut self, topic: &str, partition: i32) -> Option<CommittedOffset> {
        let key = (topic.to_string(), partition);
        if !self.map.contains_key(&key) {
            return None;
        }
        Arc::make_mut(&mut self.map).remove(&key)
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Every offset, by topic then partition.
    pub fn iter(&self) -> impl Iterator<Item = (&str, i32, &CommittedOffset)> {
        self.map.iter().map(|((t, p), o)| (t.as_str(), *p, o))
    }

    pub fn topics(&self) -> Vec<String> {
        let mut topics: Vec<String> = self.map.keys().map(|(t, _)| t.clone()).collect();
        topics.dedup();
        topics
    }
}

/// One partition of an OffsetCommit.
#[derive(Clone, Debug)]
pub struct PartitionCommit {
    pub partition: i32,
    pub offset: i64,
    pub leader_epoch: i32,
    pub metadata: Option<String>,
}

/// An OffsetCommit, already decoded.
#[derive(Clone, Debug)]
pub struct CommitRequest {
    pub group_id: String,
    pub generation_or_epoch: i32,
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub api_version: i16,
    pub topics: Vec<(String, Vec<PartitionCommit>)>,
}

/// Per topic, per partition: the outcome.
pub type PartitionResults = Vec<(String, Vec<(i32, Result<(), ApiError>)>)>;

/// Per topic, per partition: the committed offset, if any.
pub type FetchedOffsets = Vec<(String, Vec<(i32, Option<CommittedOffset>)>)>;

fn all_partitions<T>(
    topics: &[(String, Vec<T>)],
    partition: impl Fn(&T) -> i32,
    error: &ApiError,
) -> PartitionResults {
    topics
        .iter()
        .map(|(t, ps)| {
            (
                t.clone(),
                ps.iter()
                    .map(|p| (partition(p), Err(error.clone())))
                    .collect(),
            )
        })
        .collect()
}

impl GroupCoordinator {
    /// Checks each partition of an offset commit against the image (a known
    /// topic and partition) and `offset.metadata.max.bytes`: the outcome per
    /// partition, and the offsets accepted, stamped `now`. Shared by plain
    /// and transactional commits.
    pub(crate) fn check_commits(
        &self,
        image: &tessera_metadata::MetadataImage,
        topics: &[(String, Vec<PartitionCommit>)],
        now: i64,
    ) -> (PartitionResults, Vec<(String, i32, CommittedOffset)>) {
        let mut results: PartitionResults = Vec::with_capacity(topics.len());
        let mut accepted: Vec<(String, i32, CommittedOffset)> = Vec::new();
        for (topic, partitions) in topics {
            let known = image.topic_by_name(topic);
            let mut out = Vec::with_capacity(partitions.len());
            for p in partitions {
                let metadata = p.metadata.clone().unwrap_or_default();
                let result = if !known
                    .is_some_and(|t| p.partition >= 0 && (p.partition as u32) < t.partitions)
                {
                    Err(ApiError::UnknownTopicOrPartition)
                } else if metadata.len() > self.offset_metadata_max_bytes {
                    Err(ApiError::OffsetMetadataTooLarge)
                } else {
                    accepted.push((
                        topic.clone(),
                        p.partition,
                        CommittedOffset {
                            offset: p.offset,
                            leader_epoch: p.leader_epoch,
                            metadata,
                            commit_timestamp: now,
                        },
                    ));
                    Ok(())
                };
                out.push((p.partition, result));
            }
            results.push((topic.clone(), out));
        }
        (results, accepted)
    }

    /// OffsetCommit: validate, append, then apply.
    pub async fn commit_offsets<W: PartitionWriter + ?Sized>(
        &self,
        writer: &W,
        req: CommitRequest,
    ) -> PartitionResults {
        let fail = |e: ApiError| all_partitions(&req.topics, |p| p.partition, &e);
        if req.group_id.is_empty() {
            return fail(ApiError::InvalidGroupId);
        }
        if let Err(e) = self.coordinator_partition(writer, &req.group_id) {
            return fail(e);
        }
        // A commit from outside group management may create a (simple) group.
        let create = if req.generation_or_epoch < 0 {
            Create::Simple
        } else {
            Create::No
        };
        let Some((slot, mut entry)) = self.lock(&req.group_id, create).await else {
            return fail(if req.api_version >= 9 {
                ApiError::GroupIdNotFound
            } else {
                ApiError::IllegalGeneration
            });
        };
        if let Err(e) = entry.state.group.kind().validate_offset_commit(
            &req.member_id,
            req.group_instance_id.as_deref(),
            req.generation_or_epoch,
        ) {
            return fail(e);
        }
        let image = writer.image();
        let now = self.wall_now();
        let (mut results, accepted) = self.check_commits(&image, &req.topics, now);
        if accepted.is_empty() {
            return results;
        }
        let records: Vec<CoordinatorRecord> = accepted
            .iter()
            .map(|(t, p, o)| CoordinatorRecord::OffsetCommit {
                group: req.group_id.clone(),
                topic: t.clone(),
                partition: *p,
                value: Some(o.to_value()),
            })
            .collect();
        if let Err(e) = self.append(writer, &req.group_id, records).await {
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
        for (t, p, o) in accepted {
            entry.state.offsets.insert(t, p, o);
        }
        drop(entry);
        drop(slot);
        results
    }

    /// OffsetFetch for one group: `topics` None means every committed offset.
    /// An unknown group has no offsets (Kafka answers -1, not an error).
    pub async fn fetch_offsets<W: PartitionWriter + ?Sized>(
        &self,
        writer: &W,
        group_id: &str,
        member: Option<(&str, i32)>,
        topics: Option<Vec<(String, Vec<i32>)>>,
    ) -> Result<FetchedOffsets, ApiError> {
        self.coordinator_partition(writer, group_id)?;
        let mut known = true;
        let offsets = match self.lock(group_id, Create::No).await {
            Some((_slot, entry)) => {
                match entry
                    .state
                    .group
                    .kind()
                    .validate_offset_fetch(member.map(|m| m.0), member.map_or(-1, |m| m.1))
                {
                    Ok(()) => Some(entry.state.offsets.clone()),
                    Err(ApiError::GroupIdNotFound) => None,
                    Err(e) => return Err(e),
                }
            }
            None => None,
        };
        let offsets = offsets.unwrap_or_else(|| {
            known = false;
            GroupOffsets::default()
        });
        Ok(match topics {
            Some(topics) => topics
                .into_iter()
                .map(|(t, ps)| {
                    let parts = ps
                        .into_iter()
                        .map(|p| (p, offsets.get(&t, p).cloned()))
                        .collect();
                    (t, parts)
                })
                .collect(),
            None if !known => vec![],
            None => {
                let mut out: FetchedOffsets = Vec::new();
                for (t, p, o) in offsets.iter() {
                    match out.last_mut() {
                        Some((last, parts)) if last == t => parts.push((p, Some(o.clone()))),
                        _ => out.push((t.to_string(), vec![(p, Some(o.clone()))])),
                    }
                }
                out
            }
        })
    }

    /// OffsetDelete: `Err` is the group-level error.
    pub async fn delete_offsets<W: PartitionWriter + ?Sized>(
        &self,
        writer: &W,
        group_id: &str,
        topics: Vec<(String, Vec<i32>)>,
    ) -> Result<PartitionResults, ApiError> {
        if group_id.is_empty() {
            return Err(ApiError::InvalidGroupId);
        }
        self.coordinator_partition(writer, group_id)?;
        let (slot, mut entry) = self
            .lock(group_id, Create::No)
            .await
            .ok_or(ApiError::GroupIdNotFound)?;
        let kind = entry.state.group.kind();
        kind.validate_offset_delete()?;
        let image = writer.image();
        let mut results: PartitionResults = Vec::new();
        let mut deleted: Vec<(String, i32)> = Vec::new();
        for (topic, partitions) in &topics {
            let known = image.topic_by_name(topic);
            let subscribed = kind.is_subscribed_to_topic(topic);
            let mut out = Vec::new();
            for &p in partitions {
                let result = if !known.is_some_and(|t| p >= 0 && (p as u32) < t.partitions) {
                    Err(ApiError::UnknownTopicOrPartition)
                } else if subscribed {
                    Err(ApiError::GroupSubscribedToTopic)
                } else {
                    if entry.state.offsets.get(topic, p).is_some() {
                        deleted.push((topic.clone(), p));
                    }
                    Ok(())
                };
                out.push((p, result));
            }
            results.push((topic.clone(), out));
        }
        if !deleted.is_empty() {
            let records = deleted
                .iter()
                .map(|(t, p)| CoordinatorRecord::OffsetCommit {
                    group: group_id.to_string(),
                    topic: t.clone(),
                    partition: *p,
                    value: None,
                })
                .collect();
            self.append(writer, group_id, records)
                .await
                .map_err(store_error)?;
            for (t, p) in deleted {
                entry.state.offsets.remove(&t, p);
            }
        }
        drop(entry);
        drop(slot);
        Ok(results)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_iterate_by_topic_then_partition() {
        let mut o = GroupOffsets::default();
        let c = |offset| CommittedOffset {
            offset,
            leader_epoch: -1,
            metadata: String::new(),
            commit_timestamp: 0,
        };
        o.insert("b".into(), 1, c(3));
        o.insert("a".into(), 2, c(2));
        o.insert("a".into(), 0, c(1));
        let order: Vec<(String, i32)> = o.iter().map(|(t, p, _)| (t.to_string(), p)).collect();
        assert_eq!(
            order,
            vec![("a".into(), 0), ("a".into(), 2), ("b".into(), 1)]
        );
        assert_eq!(o.topics(), vec!["a".to_string(), "b".to_string()]);
        assert_eq!(o.remove("a", 0).unwrap().offset, 1);
        assert_eq!(o.len(), 2);
    }

    /// The coordinator seen through an in-memory [`PartitionWriter`] whose
    /// appends can be made to fail.
    mod through_a_writer {
        use std::sync::atomic::Ordering;

        use crate::tests::{commit, MemoryWriter};
        use crate::GroupCoordinator;
        use tessera_server_common::error::ApiError;
        use tessera_server_common::internal_topics::{partition_for, OFFSETS_TOPIC_PARTITIONS};

        /// The offset group "g" holds for its one partition, if any.
        async fn committed(c: &GroupCoordinator) -> Option<i64> {
            c.committed("g")
                .await
                .and_then(|o| o.iter().map(|(_, _, v)| v.offset).next())
        }

        fn only_result(r: &super::PartitionResults) -> Result<(), ApiError> {
            assert_eq!(r.len(), 1);
            assert_eq!(r[0].1.len(), 1);
            r[0].1[0].1.clone()
        }

        /// A commit whose append fails is refused and changes nothing the
        /// coordinator holds: the offsets stay what the log has.
        #[tokio::test]
        async fn a_commit_whose_append_fails_changes_no_state() {
            let writer = MemoryWriter::new();
            let coordinator = GroupCoordinator::new(&crate::tests::config());
            let partition = partition_for("g", OFFSETS_TOPIC_PARTITIONS);
            coordinator
                .load_partitions(&writer, &[partition])
                .await
                .unwrap();

            writer.fail_appends.store(true, Ordering::SeqCst);
            let r = coordinator.commit_offsets(&writer, commit(5)).await;
            assert!(
                matches!(only_result(&r), Err(ApiError::NotCoordinator)),
                "{r:?}"
            );
            assert_eq!(committed(&coordinator).await, None);

            writer.fail_appends.store(false, Ordering::SeqCst);
            let r = coordinator.commit_offsets(&writer, commit(5)).await;
            assert!(only_result(&r).is_ok(), "{r:?}");
            assert_eq!(committed(&coordinator).await, Some(5));

            writer.fail_appends.store(true, Ordering::SeqCst);
            let r = coordinator.commit_offsets(&writer, commit(9)).await;
            assert!(only_result(&r).is_err(), "{r:?}");
            assert_eq!(committed(&coordinator).await, Some(5));
            assert_eq!(writer.appends.load(Ordering::SeqCst), 1);
        }

        /// Before its partition is loaded, the coordinator answers
        /// COORDINATOR_LOAD_IN_PROGRESS and appends nothing.
        #[tokio::test]
        async fn nothing_is_written_before_the_partition_is_loaded() {
            let writer = MemoryWriter::new();
            let coordinator = GroupCoordinator::new(&crate::tests::config());
            let r = coordinator.commit_offsets(&writer, commit(5)).await;
            assert!(
                matches!(only_result(&r), Err(ApiError::CoordinatorLoadInProgress)),
                "{r:?}"
            );
            assert_eq!(writer.appends.load(Ordering::SeqCst), 0);
        }
    }
}
