//! Replay of committed metadata values into a [`MetadataImage`].
//!
//! Every replay path (live apply, restart recovery, snapshot load) reads
//! values through [`decode_committed_value`], so all of them agree on which
//! bytes stop the controller, which change nothing and which are skipped.

use std::sync::Arc;

use crate::error::MetadataReplayError;
use crate::image::{BrokerImage, MetadataImage, RangeImage, SealInfo, SegmentImage, TopicImage};
use crate::records::MetadataRecord;
use crate::{RangeId, SegmentId};

/// Decodes the committed metadata value at `offset` against `image`.
///
/// - Bytes that are not a record this build reads (including a field value
///   out of range, decided by the bytes alone) are
///   [`MetadataReplayError::UndecodableRecord`]; the caller stops the
///   controller, as Kafka's controller does on a record it cannot replay.
/// - An empty NoOp is `Ok(None)`: it changes nothing.
/// - A record that decodes but names a broker, topic, range or segment the
///   image does not hold, or conflicts with it (a CreateTopic whose name or
///   id exists, a second active segment for a range, ...), is `Ok(None)`.
///   A leader validates a write against its committed image, so a write can
///   lose a race to an earlier one still in flight; every replica decodes
///   the same bytes against the same image and skips the same record, so
///   they agree. Stopping instead would let a client race stop the quorum.
/// - Otherwise `Ok(Some(record))`, to be passed to [`MetadataImage::apply`].
pub fn decode_committed_value(
    value: &[u8],
    image: &MetadataImage,
    offset: i64,
) -> Result<Option<MetadataRecord>, MetadataReplayError> {
    let record = MetadataRecord::decode(value)
        .map_err(|reason| MetadataReplayError::UndecodableRecord { offset, reason })?;
    if record == MetadataRecord::NoOp {
        return Ok(None);
    }
    if let Some(why) = image.skip_reason(&record) {
        tracing::debug!(offset, ?record, why, "skipping metadata record");
        return Ok(None);
    }
    Ok(Some(record))
}

impl MetadataImage {
    /// Why `record` cannot apply to this image, if it cannot.
    fn skip_reason(&self, record: &MetadataRecord) -> Option<&'static str> {
        use MetadataRecord as R;
        let fail = |cond: bool, why: &'static str| if cond { Some(why) } else { None };
        match record {
            R::NoOp | R::RegisterBroker(_) => None,
            R::FenceBroker { broker_id } | R::UnfenceBroker { broker_id } => {
                fail(!self.brokers.contains_key(broker_id), "unknown broker")
            }
            R::CreateTopic(t) => fail(self.topics.contains_key(&t.topic_id), "topic id exists")
                .or_else(|| fail(self.topic_names.contains_key(&t.name), "topic name exists")),
            R::DeleteTopic { topic_id } | R::SetTopicConfig { topic_id, .. } => {
                fail(!self.topics.contains_key(topic_id), "unknown topic")
            }
            R::CreateRange(r) => {
                let Some(topic) = self.topics.get(&r.topic_id) else {
                    return Some("unknown topic");
                };
                if self.ranges.contains_key(&r.range_id) {
                    return Some("range id exists");
                }
                if r.hi > topic.partitions {
                    return Some("range beyond the topic's partitions");
                }
                let parents_ok = r.parents.iter().all(|p| {
                    self.ranges
                        .get(p)
                        .is_some_and(|parent| parent.topic_id == r.topic_id)
                });
                fail(
                    !parents_ok,
                    "unknown parent range or parent of another topic",
                )
            }
            R::SealRange { range_id } => match self.ranges.get(range_id) {
                None => Some("unknown range"),
                Some(r) => fail(!r.active, "range already sealed"),
            },
            R::OpenSegment(s) => {
                let Some(range) = self.ranges.get(&s.segment.range) else {
                    return Some("unknown range");
                };
                if !range.active {
                    return Some("range is sealed");
                }
                if self.active_segment(range.id).is_some() {
                    return Some("range already has an active segment");
                }
                // Segments form a chain: a new one comes after every existing one.
                fail(
                    s.segment.seq < self.next_segment_seq(range.id)
                        || self.segments.contains_key(&s.segment),
                    "segment seq not after the range's last segment",
                )
            }
            R::SealSegment(s) => {
                let Some(seg) = self.segments.get(&s.segment) else {
                    return Some("unknown segment");
                };
                if seg.sealed.is_some() {
                    return Some("segment already sealed");
                }
                let range = self.ranges.get(&s.segment.range);
                let spans_ok =
                    range.is_some_and(|r| s.spans.iter().all(|sp| r.contains(sp.partition)));
                fail(!spans_ok, "span of a partition outside the segment's range")
            }
            R::DeleteSegment { segment } => match self.segments.get(segment) {
                None => Some("unknown segment"),
                Some(s) => fail(s.sealed.is_none(), "segment is active"),
            },
            R::SetLogStartOffset {
                topic_id,
                partition,
                offset,
            } => {
                let Some(topic) = self.topics.get(topic_id) else {
                    return Some("unknown topic");
                };
                if *partition >= topic.partitions {
                    return Some("unknown partition");
                }
                // Offsets never move back (design: "never reset or move back").
                fail(
                    *offset < self.log_start_offset(*topic_id, *partition),
                    "log start offset would move back",
                )
            }
        }
    }

    /// Applies a record returned by [`decode_committed_value`] for this
    /// image, and advances `offset`.
    ///
    /// Infallible by contract: the checks live in `decode_committed_value`,
    /// so there is one place that decides what applies. Called with a record
    /// that was not checked, it still does not panic; it applies what it can.
    pub fn apply(&mut self, record: &MetadataRecord, offset: i64) {
        use MetadataRecord as R;
        self.offset = offset;
        match record {
            R::NoOp => {}
            R::RegisterBroker(reg) => {
                // Kafka semantics: a new broker or a new incarnation of one
                // (a restart) is fenced until it unfences; re-registering the
                // same incarnation keeps its state.
                let fenced = match self.brokers.get(&reg.broker_id) {
                    Some(b) if b.registration.incarnation_id == reg.incarnation_id => b.fenced,
                    _ => true,
                };
                self.brokers.insert(
                    reg.broker_id,
                    BrokerImage {
                        registration: reg.clone(),
                        fenced,
                    },
                );
            }
            R::FenceBroker { broker_id } => {
                if let Some(b) = self.brokers.get_mut(broker_id) {
                    b.fenced = true;
                }
            }
            R::UnfenceBroker { broker_id } => {
                if let Some(b) = self.brokers.get_mut(broker_id) {
                    b.fenced = false;
                }
            }
            R::CreateTopic(t) => {
                self.topic_names.insert(t.name.clone(), t.topic_id);
                self.topics.insert(
                    t.topic_id,
                    Arc::new(TopicImage {
                        id: t.topic_id,
                        name: t.name.clone(),
                        partitions: t.partitions,
                        replication_factor: t.replication_factor,
                        configs: t.configs.clone(),
                    }),
                );
            }
            R::DeleteTopic { topic_id } => self.delete_topic(*topic_id),
            R::SetTopicConfig {
                topic_id,
                key,
                value,
            } => {
                if let Some(t) = self.topics.get_mut(topic_id) {
                    let t = Arc::make_mut(t);
                    match value {
                        Some(v) => {
                            t.configs.insert(key.clone(), v.clone());
                        }
                        None => {
                            t.configs.remove(key);
                        }
                    }
                }
            }
            R::CreateRange(r) => {
                self.topic_ranges.insert((r.topic_id, r.range_id));
                self.ranges.insert(
                    r.range_id,
                    Arc::new(RangeImage {
                        id: r.range_id,
                        topic_id: r.topic_id,
                        lo: r.lo,
                        hi: r.hi,
                        parents: r.parents.clone(),
                        active: true,
                    }),
                );
            }
            R::SealRange { range_id } => {
                if let Some(r) = self.ranges.get_mut(range_id) {
                    Arc::make_mut(r).active = false;
                }
            }
            R::OpenSegment(s) => {
                self.segments.insert(
                    s.segment,
                    Arc::new(SegmentImage {
                        id: s.segment,
                        replicas: s.replicas.clone(),
                        leader_epoch: s.leader_epoch,
                        sealed: None,
                    }),
                );
            }
            R::SealSegment(s) => {
                if let Some(seg) = self.segments.get_mut(&s.segment) {
                    Arc::make_mut(seg).sealed = Some(SealInfo {
                        size_bytes: s.size_bytes,
                        spans: s.spans.clone(),
                    });
                }
            }
            R::DeleteSegment { segment } => {
                self.segments.remove(segment);
            }
            R::SetLogStartOffset {
                topic_id,
                partition,
                offset,
            } => {
                self.log_start_offsets
                    .insert((*topic_id, *partition), *offset);
            }
        }
    }

    fn delete_topic(&mut self, topic_id: crate::TopicId) {
        if let Some(t) = self.topics.remove(&topic_id) {
            if self.topic_names.get(&t.name) == Some(&topic_id) {
                self.topic_names.remove(&t.name);
            }
        }
        let ranges: Vec<RangeId> = self
            .topic_ranges
            .range((topic_id, RangeId::MIN)..=(topic_id, RangeId::MAX))
            .map(|(_, r)| *r)
            .collect();
        for r in ranges {
            self.topic_ranges.remove(&(topic_id, r));
            self.ranges.remove(&r);
            let segs: Vec<SegmentId> = self
                .segments
                .range(
                    SegmentId { range: r, seq: 0 }..=SegmentId {
                        range: r,
                        seq: u32::MAX,
                    },
                )
                .map(|(id, _)| *id)
                .collect();
            for s in segs {
                self.segments.remove(&s);
            }
        }
        let starts: Vec<(crate::TopicId, u32)> = self
            .log_start_offsets
            .range((topic_id, 0)..=(topic_id, u32::MAX))
            .map(|(k, _)| *k)
            .collect();
        for k in starts {
            self.log_start_offsets.remove(&k);
        }
    }
}
