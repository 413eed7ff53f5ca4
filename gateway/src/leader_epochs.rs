//! A partition's leader epoch history, derived from the metadata image, and
//! the answer to OffsetForLeaderEpoch (pure).
//!
//! Kafka keeps a leader epoch cache per partition (`LeaderEpochFileCache`):
//! `epoch -> start offset`, one entry per epoch that holds data, plus the
//! current epoch, assigned at the log end when leadership began. Tessera
//! writes no such file: the same history is in the image. A partition's
//! data lives in the ranges of its lineage (the active range covering it,
//! its parent covering it, and so on), each a chain of segments carrying a
//! leader epoch, and every sealed segment records the span of offsets it
//! holds per partition. So, walking the lineage oldest first, every
//! segment in order:
//!
//! - an epoch starts at the first offset the partition has in the first
//!   segment carrying that epoch (segments without data for it add nothing);
//! - the current epoch (the active segment's of the active range) starts
//!   where the data before it ends, if no sealed segment holds data of it
//!   yet (a split or merge child, or a failover, before any record).
//!
//! Entries go in through Kafka's own `assign` rules (an epoch whose start
//! offset a later epoch shares is dropped: it holds no data), and the log
//! start offset truncates the front as Kafka's `truncateFromStart` does.
//! Segments a primary rolled but has not recorded yet hold the current
//! epoch (a plain roll keeps it), so the image is enough.

use std::sync::Arc;

use tessera_metadata::{MetadataImage, RangeImage, TopicId};

use crate::error::ApiError;

/// Kafka's `RecordBatch.NO_PARTITION_LEADER_EPOCH` / `UNDEFINED_EPOCH`.
pub const UNDEFINED_EPOCH: i32 = -1;
/// Kafka's `OffsetsForLeaderEpochResponse.UNDEFINED_EPOCH_OFFSET`.
pub const UNDEFINED_EPOCH_OFFSET: i64 = -1;

/// One leader epoch and the first offset written in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EpochEntry {
    pub epoch: i32,
    pub start_offset: i64,
}

/// The leader epochs of one partition, oldest first: epochs and start
/// offsets both strictly increase.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EpochHistory {
    entries: Vec<EpochEntry>,
}

impl EpochHistory {
    /// A history from entries as they were assigned, in order.
    pub fn from_assigned(entries: impl IntoIterator<Item = (i32, i64)>) -> Self {
        let mut history = EpochHistory::default();
        for (epoch, start) in entries {
            history.assign(epoch, start);
        }
        history
    }

    pub fn entries(&self) -> &[EpochEntry] {
        &self.entries
    }

    /// The newest epoch: the partition's current leader epoch.
    pub fn latest_epoch(&self) -> Option<i32> {
        self.entries.last().map(|e| e.epoch)
    }

    /// Kafka's `LeaderEpochFileCache.assign`: nothing if `epoch` is the
    /// latest and does not start earlier; otherwise every entry from the end
    /// with an epoch at or above `epoch`, or a start offset at or above
    /// `start_offset`, is dropped first, so both stay monotonic.
    fn assign(&mut self, epoch: i32, start_offset: i64) {
        if epoch < 0 || start_offset < 0 {
            return; // Kafka refuses these outright.
        }
        if let Some(latest) = self.entries.last() {
            if latest.epoch == epoch && latest.start_offset <= start_offset {
                return;
            }
        }
        while self
            .entries
            .last()
            .is_some_and(|e| e.epoch >= epoch || e.start_offset >= start_offset)
        {
            self.entries.pop();
        }
        self.entries.push(EpochEntry {
            epoch,
            start_offset,
        });
    }

    /// Kafka's `truncateFromStart`: entries starting at or below the log
    /// start offset are dropped, and the newest of them comes back starting
    /// at the log start offset.
    fn truncate_from_start(&mut self, log_start: i64) {
        let below = self
            .entries
            .iter()
            .take_while(|e| e.start_offset <= log_start)
            .count();
        if below == 0 {
            return;
        }
        let kept = EpochEntry {
            epoch: self.entries[below - 1].epoch,
            start_offset: log_start,
        };
        self.entries.drain(..below);
        self.entries.insert(0, kept);
    }

    /// Kafka's `LeaderEpochFileCache.endOffsetFor` as the leader answers
    /// OffsetForLeaderEpoch (`UnifiedLog.endOffsetForEpoch`): `(epoch, end
    /// offset)`, the largest epoch at or below `requested` and the start
    /// offset of the next epoch after it, or `log_end` when `requested` is
    /// the latest epoch. Kafka's edge cases:
    /// - `requested` undefined (-1), above the latest epoch, or no history:
    ///   `(-1, -1)`;
    /// - `requested` below the first epoch: `(requested, start of the first
    ///   epoch)` (the data before it is gone).
    pub fn end_offset_for(&self, requested: i32, log_end: i64) -> (i32, i64) {
        let undefined = (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET);
        if requested == UNDEFINED_EPOCH {
            return undefined;
        }
        if self.latest_epoch() == Some(requested) {
            return (requested, log_end);
        }
        let Some(higher) = self.entries.iter().find(|e| e.epoch > requested) else {
            return undefined;
        };
        match self.entries.iter().rev().find(|e| e.epoch <= requested) {
            Some(floor) => (floor.epoch, higher.start_offset),
            None => (requested, higher.start_offset),
        }
    }
}

/// The ranges holding `partition`'s history, oldest first; the last is the
/// active range covering it. Empty if no active range covers it.
fn lineage(image: &MetadataImage, topic: TopicId, partition: u32) -> Vec<Arc<RangeImage>> {
    let mut out = Vec::new();
    let mut next = image.active_range_for(topic, partition);
    while let Some(range) = next {
        if out.len() > image.ranges.len() {
            break; // a cycle: parents always have smaller ids, so never
        }
        next = range
            .parents
            .iter()
            .filter_map(|id| image.ranges.get(id))
            .find(|r| r.contains(partition))
            .cloned();
        out.push(range);
    }
    out.reverse();
    out
}

/// The leader epoch history of `partition` of `topic`, from the image.
/// `None` if no active range with an active segment covers it (nobody
/// leads it).
pub fn epoch_history(
    image: &MetadataImage,
    topic: TopicId,
    partition: u32,
) -> Option<EpochHistory> {
    let ranges = lineage(image, topic, partition);
    let current = image.active_segment(ranges.last()?.id)?;
    let log_start = image.log_start_offset(topic, partition);
    let mut history = EpochHistory::default();
    let mut data_end = log_start;
    for range in &ranges {
        for segment in image.segments_of(range.id) {
            let Some(span) = segment.span_of(partition) else {
                continue; // active, or no data of this partition
            };
            if span.end_offset > span.start_offset {
                history.assign(segment.leader_epoch, span.start_offset);
                data_end = data_end.max(span.end_offset);
            }
        }
    }
    history.assign(current.leader_epoch, data_end);
    history.truncate_from_start(log_start);
    Some(history)
}

/// OffsetForLeaderEpoch for one partition, from the image and the
/// partition's log end offset: `(leader epoch, end offset)`, see
/// [`EpochHistory::end_offset_for`].
pub fn end_offset_for_epoch(
    image: &MetadataImage,
    topic: TopicId,
    partition: u32,
    requested: i32,
    log_end: i64,
) -> (i32, i64) {
    epoch_history(image, topic, partition)
        .map_or((UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET), |history| {
            history.end_offset_for(requested, log_end)
        })
}

/// Kafka's `Partition.checkCurrentLeaderEpoch`: a client's current leader
/// epoch (negative: not given) older than the partition's is
/// FENCED_LEADER_EPOCH, newer is UNKNOWN_LEADER_EPOCH.
pub fn check_current_leader_epoch(client: i32, current: i32) -> Result<(), ApiError> {
    if client < 0 || client == current {
        Ok(())
    } else if client < current {
        Err(ApiError::FencedLeaderEpoch)
    } else {
        Err(ApiError::UnknownLeaderEpoch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use tessera_metadata::{
        decode_committed_value, BrokerRegistration, MetadataRecord, PartitionSpan, RangeId,
        SegmentId, SegmentSealRecord,
    };
    use tessera_planner::TopicSpec;

    /// An image built through the decoder every replica replays with.
    struct Image {
        image: MetadataImage,
        topic: TopicId,
    }

    impl Image {
        fn commit(&mut self, records: Vec<MetadataRecord>) {
            let offset = self.image.offset + 1;
            for r in records {
                let decoded = decode_committed_value(&r.encode(), &self.image, offset)
                    .unwrap()
                    .unwrap_or_else(|| panic!("record skipped: {r:?}"));
                self.image.apply(&decoded, offset);
            }
        }

        /// A topic of `partitions` partitions on broker 1: one range, its
        /// first segment at epoch 0.
        fn new(partitions: u32) -> Image {
            let mut image = Image {
                image: MetadataImage::empty(),
                topic: uuid::Uuid::new_v4(),
            };
            image.commit(tessera_planner::register_broker(BrokerRegistration {
                broker_id: 1,
                incarnation_id: uuid::Uuid::new_v4(),
                host: "127.0.0.1".into(),
                port: 9092,
                rack: None,
            }));
            let records = tessera_planner::create_topic(
                &image.image,
                TopicSpec {
                    topic_id: image.topic,
                    name: "t".into(),
                    partitions,
                    replication_factor: 1,
                    configs: BTreeMap::new(),
                },
            )
            .unwrap();
            image.commit(records);
            image
        }

        fn active(&self, partition: u32) -> RangeId {
            self.image
                .active_range_for(self.topic, partition)
                .unwrap()
                .id
        }

        fn seal_record(&self, range: RangeId, spans: &[(u32, i64, i64)]) -> SegmentSealRecord {
            SegmentSealRecord {
                segment: self.image.active_segment(range).unwrap().id,
                size_bytes: 100,
                spans: spans
                    .iter()
                    .map(|&(partition, start_offset, end_offset)| PartitionSpan {
                        partition,
                        start_offset,
                        end_offset,
                    })
                    .collect(),
                leader_epoch: Some(self.image.active_segment(range).unwrap().leader_epoch),
            }
        }

        /// The active segment of `range` seals with `spans` and the next one
        /// opens: a plain roll (same epoch) or, with `epoch`, a new leader.
        fn roll(&mut self, range: RangeId, spans: &[(u32, i64, i64)], epoch: Option<i32>) {
            let seal = self.seal_record(range, spans);
            let next = SegmentId::new(range, seal.segment.seq + 1);
            let records = match epoch {
                None => tessera_planner::record_local_segments(
                    &self.image,
                    range,
                    &[seal],
                    Some(next.seq),
                ),
                Some(epoch) => vec![
                    MetadataRecord::SealSegment(seal),
                    tessera_planner::open_segment(next, vec![1], epoch),
                ],
            };
            self.commit(records);
        }

        /// A move as `Broker::commit_move` writes it: the plan is made
        /// against the image, then the parents' active segments seal with
        /// their `spans` and the plan follows, in one entry.
        fn move_ranges(&mut self, plan: tessera_planner::MovePlan, spans: &[(u32, i64, i64)]) {
            let mut records = Vec::new();
            for range in &plan.parents {
                let r = self.image.ranges[range].clone();
                let mine: Vec<_> = spans
                    .iter()
                    .copied()
                    .filter(|(p, _, _)| r.contains(*p))
                    .collect();
                records.push(MetadataRecord::SealSegment(self.seal_record(*range, &mine)));
            }
            records.extend(plan.records);
            self.commit(records);
        }

        fn split(&mut self, range: RangeId, at: u32, spans: &[(u32, i64, i64)]) {
            let plan = tessera_planner::split_range(&self.image, range, Some(at)).unwrap();
            self.move_ranges(plan, spans);
        }

        fn merge(&mut self, left: RangeId, right: RangeId, spans: &[(u32, i64, i64)]) {
            let plan = tessera_planner::merge_ranges(&self.image, left, right).unwrap();
            self.move_ranges(plan, spans);
        }

        fn history(&self, partition: u32) -> Vec<(i32, i64)> {
            epoch_history(&self.image, self.topic, partition)
                .unwrap()
                .entries()
                .iter()
                .map(|e| (e.epoch, e.start_offset))
                .collect()
        }

        fn answer(&self, partition: u32, requested: i32, log_end: i64) -> (i32, i64) {
            end_offset_for_epoch(&self.image, self.topic, partition, requested, log_end)
        }
    }

    #[test]
    fn a_single_segment_answers_its_epoch_with_the_log_end() {
        let t = Image::new(4);
        assert_eq!(t.history(0), vec![(0, 0)]);
        assert_eq!(t.answer(0, 0, 17), (0, 17));
        // Undefined asks get undefined answers.
        assert_eq!(t.answer(0, -1, 17), (-1, -1));
    }

    #[test]
    fn plain_rolls_keep_one_epoch_from_its_first_offset() {
        let mut t = Image::new(4);
        let root = t.active(0);
        t.roll(root, &[(0, 0, 5), (1, 0, 2)], None);
        t.roll(root, &[(0, 5, 9)], None);
        assert_eq!(t.history(0), vec![(0, 0)]);
        assert_eq!(t.history(1), vec![(0, 0)]);
        assert_eq!(t.answer(0, 0, 12), (0, 12));
    }

    #[test]
    fn several_epochs_end_where_the_next_starts() {
        let mut t = Image::new(4);
        let root = t.active(0);
        t.roll(root, &[(0, 0, 5)], Some(3));
        t.roll(root, &[(0, 5, 8)], None);
        t.roll(root, &[(0, 8, 10)], Some(5));
        t.roll(root, &[(0, 10, 14)], Some(7));
        assert_eq!(t.history(0), vec![(0, 0), (3, 5), (5, 10), (7, 14)]);
        assert_eq!(t.answer(0, 0, 20), (0, 5));
        assert_eq!(t.answer(0, 3, 20), (3, 10));
        assert_eq!(t.answer(0, 5, 20), (5, 14));
        assert_eq!(t.answer(0, 7, 20), (7, 20));
        // Between epochs: the largest one below, ending where the next starts.
        assert_eq!(t.answer(0, 1, 20), (0, 5));
        assert_eq!(t.answer(0, 4, 20), (3, 10));
        assert_eq!(t.answer(0, 6, 20), (5, 14));
    }

    #[test]
    fn an_epoch_without_data_is_not_in_the_history() {
        let mut t = Image::new(4);
        let root = t.active(0);
        // Epoch 2 wrote only to partition 1; partition 0 has 0 then 4.
        t.roll(root, &[(0, 0, 5)], Some(2));
        t.roll(root, &[(1, 0, 3)], Some(4));
        t.roll(root, &[(0, 5, 6)], None);
        assert_eq!(t.history(0), vec![(0, 0), (4, 5)]);
        assert_eq!(t.history(1), vec![(2, 0), (4, 3)]);
        // Partition 0 never saw epoch 2: the epoch below it answers.
        assert_eq!(t.answer(0, 2, 9), (0, 5));
        assert_eq!(t.answer(0, 4, 9), (4, 9));
        // Below partition 1's first epoch: Kafka answers the requested
        // epoch with the first epoch's start.
        assert_eq!(t.answer(1, 0, 3), (0, 0));
        assert_eq!(t.answer(1, 1, 3), (1, 0));
    }

    #[test]
    fn a_split_child_starts_its_epoch_where_the_parent_ends() {
        let mut t = Image::new(8);
        let root = t.active(0);
        t.roll(root, &[(0, 0, 4)], None);
        t.split(root, 4, &[(0, 4, 6), (5, 0, 3)]);
        let (left, right) = (t.active(0), t.active(5));
        assert_ne!(left, right);
        assert_eq!(t.history(0), vec![(0, 0), (1, 6)]);
        assert_eq!(t.history(5), vec![(0, 0), (1, 3)]);
        // No data at all: the current epoch from the log start.
        assert_eq!(t.history(2), vec![(1, 0)]);
        assert_eq!(t.answer(0, 0, 10), (0, 6));
        assert_eq!(t.answer(0, 1, 10), (1, 10));
        assert_eq!(t.answer(5, 0, 3), (0, 3));
        assert_eq!(t.answer(2, 1, 0), (1, 0));
        assert_eq!(t.answer(2, 0, 0), (0, 0));
        // The child's data, once sealed, keeps its epoch's start.
        t.roll(left, &[(0, 6, 9)], None);
        assert_eq!(t.history(0), vec![(0, 0), (1, 6)]);
    }

    #[test]
    fn a_merge_child_is_one_above_both_parents() {
        let mut t = Image::new(8);
        let root = t.active(0);
        t.split(root, 4, &[(0, 0, 2), (4, 0, 3)]);
        let right = t.active(4);
        // The right half moves on twice more: [4, 6) and [6, 8) at epoch 2.
        t.split(right, 6, &[(4, 3, 5)]);
        let (left, mid) = (t.active(0), t.active(4));
        t.merge(left, mid, &[(0, 2, 4), (4, 5, 6)]);
        let merged = t.active(0);
        assert_eq!(t.active(4), merged);
        assert_eq!(
            t.image.active_segment(merged).unwrap().leader_epoch,
            3,
            "one above the newest parent"
        );
        // Partition 0: root (0), left (1), merged (3); it never saw epoch 2.
        assert_eq!(t.history(0), vec![(0, 0), (1, 2), (3, 4)]);
        assert_eq!(t.answer(0, 2, 7), (1, 4));
        assert_eq!(t.answer(0, 1, 7), (1, 4));
        assert_eq!(t.answer(0, 3, 7), (3, 7));
        // Partition 4: root (0), right (1), [4, 6) (2), merged (3).
        assert_eq!(t.history(4), vec![(0, 0), (1, 3), (2, 5), (3, 6)]);
        assert_eq!(t.answer(4, 1, 6), (1, 5));
        assert_eq!(t.answer(4, 2, 6), (2, 6));
        // Partition 7 went [4, 8) (1) -> [6, 8) (2), no data anywhere.
        assert_eq!(t.history(7), vec![(2, 0)]);
    }

    #[test]
    fn above_the_current_epoch_is_undefined() {
        let mut t = Image::new(2);
        let root = t.active(0);
        t.roll(root, &[(0, 0, 5)], Some(1));
        // Kafka: a requested epoch above every known one has no answer
        // (fencing is current_leader_epoch's job).
        assert_eq!(t.answer(0, 2, 8), (-1, -1));
        assert_eq!(t.answer(0, 1, 8), (1, 8));
    }

    #[test]
    fn the_log_start_offset_truncates_the_front() {
        let history = {
            let mut h = EpochHistory::from_assigned([(0, 0), (2, 5), (4, 9)]);
            h.truncate_from_start(6);
            h
        };
        assert_eq!(
            history.entries(),
            &[
                EpochEntry {
                    epoch: 2,
                    start_offset: 6
                },
                EpochEntry {
                    epoch: 4,
                    start_offset: 9
                }
            ]
        );
        assert_eq!(history.end_offset_for(0, 12), (0, 6));
        assert_eq!(history.end_offset_for(2, 12), (2, 9));
    }

    #[test]
    fn assign_keeps_both_epochs_and_offsets_monotonic() {
        // A later epoch at the same start replaces one that wrote nothing.
        let h = EpochHistory::from_assigned([(0, 0), (1, 5), (2, 5)]);
        assert_eq!(h.latest_epoch(), Some(2));
        assert_eq!(h.entries().len(), 2);
        // The same epoch again, later: nothing changes.
        let h = EpochHistory::from_assigned([(0, 0), (1, 5), (1, 9)]);
        assert_eq!(h.entries()[1].start_offset, 5);
        // An older epoch truncates what follows it (Kafka's truncation).
        let h = EpochHistory::from_assigned([(0, 0), (3, 5), (2, 7)]);
        assert_eq!(
            h.entries()
                .iter()
                .map(|e| (e.epoch, e.start_offset))
                .collect::<Vec<_>>(),
            vec![(0, 0), (2, 7)]
        );
        // No history at all: undefined.
        assert_eq!(EpochHistory::default().end_offset_for(0, 3), (-1, -1));
    }

    #[test]
    fn an_unknown_or_unled_partition_has_no_history() {
        let t = Image::new(2);
        assert!(epoch_history(&t.image, t.topic, 2).is_none());
        assert!(epoch_history(&t.image, uuid::Uuid::new_v4(), 0).is_none());
        assert_eq!(t.answer(5, 0, 0), (-1, -1));
    }

    #[test]
    fn the_current_leader_epoch_fences() {
        assert!(check_current_leader_epoch(-1, 3).is_ok());
        assert!(check_current_leader_epoch(3, 3).is_ok());
        assert!(matches!(
            check_current_leader_epoch(2, 3),
            Err(ApiError::FencedLeaderEpoch)
        ));
        assert!(matches!(
            check_current_leader_epoch(4, 3),
            Err(ApiError::UnknownLeaderEpoch)
        ));
    }
}
