//! Fetch from followers (KIP-392), for sealed data.
//!
//! With `replica.selector.class` set to Kafka's `RackAwareReplicaSelector`,
//! a leader answers a consumer that sent its `client.rack` with a
//! `preferred_read_replica` when the offset it asks for lies in a sealed
//! segment that a live replica in the client's rack holds (and this broker
//! is not in that rack). The consumer then fetches from that replica, which
//! serves it from its complete sealed copy. Past the sealed data it holds a
//! follower answers OFFSET_OUT_OF_RANGE, as a Kafka follower does past its
//! log end, and the client goes back to the leader (librdkafka and the Java
//! client both do) for the active segment. A follower knows only what is
//! sealed, so read_committed consumers (librdkafka's default isolation
//! level) stay on the leader: the last stable offset and the aborted
//! transactions list come from the leader's range log.

use std::sync::Arc;

use bytes::Bytes;
use tessera_log::segment::Segment;
use tessera_metadata::{MetadataImage, SegmentImage, TopicImage};

use super::Broker;
use crate::error::ApiError;

/// Bound on the sealed copies kept open for follower fetches.
const MAX_OPEN_COPIES: usize = 256;

/// The sealed segment of `partition` (across its range lineage) that holds
/// `offset`.
fn sealed_segment_holding(
    image: &MetadataImage,
    topic: &TopicImage,
    partition: u32,
    offset: i64,
) -> Option<Arc<SegmentImage>> {
    image
        .all_ranges(topic.id)
        .into_iter()
        .filter(|r| r.contains(partition))
        .flat_map(|r| image.segments_of(r.id))
        .find(|s| {
            s.span_of(partition)
                .is_some_and(|sp| sp.start_offset <= offset && offset < sp.end_offset)
        })
}

/// What a follower serves for one partition.
pub(crate) struct FollowerRead {
    pub records: Bytes,
    /// The end of the partition's sealed data: committed for sure (the
    /// follower does not know the leader's high watermark).
    pub high_watermark: i64,
    /// Set when `records` is empty because the cleaner left no batch of the
    /// partition from the asked offset to the end of the sealed segments
    /// read here: the offset a read goes on at (the first of the next
    /// segment, which this broker does not hold).
    pub continue_at: Option<i64>,
}

/// Where a read of `partition` goes on when the sealed `segment` holds no
/// batch of it at or after `offset`: past the segment, if the cleaner made
/// it so (an uncleaned segment holds every offset of its span, so an empty
/// read there is no reason to skip it).
pub(crate) fn past_cleaned_segment(
    segment: &SegmentImage,
    partition: u32,
    offset: i64,
) -> Option<i64> {
    if segment.clean_pass() == 0 {
        return None;
    }
    segment
        .span_of(partition)
        .map(|span| span.end_offset)
        .filter(|&end| end > offset)
}

/// [`past_cleaned_segment`] of the sealed segment holding `offset`.
pub(crate) fn past_cleaned_segment_at(
    image: &MetadataImage,
    topic: &TopicImage,
    partition: u32,
    offset: i64,
) -> Option<i64> {
    let segment = sealed_segment_holding(image, topic, partition, offset)?;
    past_cleaned_segment(&segment, partition, offset)
}

impl Broker {
    pub(crate) fn follower_fetch_enabled(&self) -> bool {
        self.config
            .replica_selector_class
            .ends_with("RackAwareReplicaSelector")
    }

    /// KIP-392 on the leader: a live replica in `client_rack` that holds the
    /// sealed segment of `offset`, unless this broker is in that rack.
    pub(crate) fn preferred_read_replica(
        &self,
        image: &MetadataImage,
        topic: &TopicImage,
        partition: u32,
        offset: i64,
        client_rack: &str,
    ) -> Option<i32> {
        if !self.follower_fetch_enabled()
            || client_rack.is_empty()
            || self.config.rack.as_deref() == Some(client_rack)
        {
            return None;
        }
        let segment = sealed_segment_holding(image, topic, partition, offset)?;
        segment.replicas.iter().copied().find(|r| {
            *r != self.config.node_id
                && image.brokers.get(r).is_some_and(|b| {
                    !b.fenced && b.registration.rack.as_deref() == Some(client_rack)
                })
        })
    }

    /// A fetch this broker serves as a follower: sealed data of which it
    /// holds a complete copy; OFFSET_OUT_OF_RANGE past it. A segment the
    /// cleaner left without a batch of the partition at or after the offset
    /// is passed over, as Kafka's log read passes over compacted-away
    /// offsets to the next batch (else a consumer or a coordinator's load
    /// reading it would see an empty answer below the high watermark
    /// forever, or take it for the end).
    pub(crate) fn follower_read(
        &self,
        image: &MetadataImage,
        topic: &TopicImage,
        partition: u32,
        offset: i64,
        max_bytes: usize,
    ) -> Result<FollowerRead, ApiError> {
        let mut at = offset;
        let mut continue_at = None;
        let records = loop {
            let held = sealed_segment_holding(image, topic, partition, at)
                .filter(|s| s.replicas.contains(&self.config.node_id))
                .and_then(|s| self.sealed_copy(image, &s).map(|copy| (s, copy)));
            let Some((segment, copy)) = held else {
                if continue_at.is_some() {
                    break Bytes::new();
                }
                return Err(ApiError::OffsetOutOfRange);
            };
            let records =
                tessera_log::range_log::read_sealed_segment(&copy, partition, at, max_bytes)?;
            match past_cleaned_segment(&segment, partition, at) {
                Some(next) if records.is_empty() => {
                    at = next;
                    continue_at = Some(next);
                }
                _ => {
                    continue_at = None;
                    break records;
                }
            }
        };
        let high_watermark = image
            .all_ranges(topic.id)
            .into_iter()
            .filter(|r| r.contains(partition))
            .flat_map(|r| image.segments_of(r.id))
            .filter_map(|s| s.span_of(partition).map(|sp| sp.end_offset))
            .max()
            .unwrap_or(offset);
        crate::metrics::Metrics::add(&self.metrics.follower_fetched_bytes, records.len() as u64);
        Ok(FollowerRead {
            records,
            high_watermark,
            continue_at,
        })
    }

    /// True when this broker's copy of a sealed segment is all there (not
    /// missing, not being repaired or healed).
    fn has_complete_copy(&self, image: &MetadataImage, segment: &SegmentImage) -> bool {
        let Some(sealed) = segment.sealed.as_ref() else {
            return false;
        };
        self.range_dir_of(image, segment.id.range)
            .and_then(|dir| {
                std::fs::metadata(tessera_log::segment::log_path(&dir, segment.id.seq)).ok()
            })
            .is_some_and(|m| m.len() == sealed.size_bytes)
    }

    /// This broker's complete copy of a sealed segment, opened once.
    fn sealed_copy(&self, image: &MetadataImage, segment: &SegmentImage) -> Option<Arc<Segment>> {
        let size = segment.sealed.as_ref()?.size_bytes;
        if let Some(copy) = self.replicas.read_copies.lock().get(&segment.id) {
            return Some(copy.clone());
        }
        let dir = self.range_dir_of(image, segment.id.range)?;
        let path = tessera_log::segment::log_path(&dir, segment.id.seq);
        // A copy still being repaired, or not truncated yet, is not served.
        if std::fs::metadata(&path).ok()?.len() != size {
            return None;
        }
        let copy = Segment::open(&dir, segment.id.seq, true, tessera_log::now_ms()).ok()?;
        if copy.size != size {
            return None;
        }
        let copy = Arc::new(copy);
        let mut open = self.replicas.read_copies.lock();
        if open.len() >= MAX_OPEN_COPIES {
            open.clear();
        }
        open.insert(segment.id, copy.clone());
        Some(copy)
    }
}

/// Where a leader reads the sealed segment of a partition's offset from.
pub(crate) enum SealedSource {
    /// The offset is not in a sealed segment, or one of this broker's open
    /// range logs holds that segment.
    Log,
    /// The open log does not hold the segment but this broker has a
    /// complete copy of it (a healing copy made while it led the range, a
    /// copy of an ancestor range's segment): served from the copy.
    Copy,
    /// Held elsewhere only: these live brokers have it.
    Remote(Vec<i32>),
}

/// A leader may lack a sealed segment of its own partition in its open
/// log: it joined the replica set of a later segment (a spare after a
/// failover), the segment belongs to an ancestor range placed elsewhere,
/// or a healing copy was made here after the log opened. It then reads
/// the segment from its copy or from a replica that holds one (see
/// `api::fetch`) instead of skipping to the data it holds.
impl Broker {
    pub(crate) fn sealed_source(
        &self,
        image: &MetadataImage,
        topic: &TopicImage,
        partition: u32,
        offset: i64,
    ) -> SealedSource {
        let Some(segment) = sealed_segment_holding(image, topic, partition, offset) else {
            return SealedSource::Log;
        };
        let me = self.config.node_id;
        // Held by an open range log (compaction may have made it smaller
        // than its seal says).
        if self
            .log_of(segment.id.range)
            .is_some_and(|log| log.holds_segment(segment.id.seq))
        {
            return SealedSource::Log;
        }
        if segment.replicas.contains(&me) && self.has_complete_copy(image, &segment) {
            return SealedSource::Copy;
        }
        SealedSource::Remote(
            segment
                .replicas
                .iter()
                .copied()
                .filter(|r| *r != me && image.brokers.get(r).is_some_and(|b| !b.fenced))
                .collect(),
        )
    }

    /// The end (exclusive) of `partition`'s span in the sealed segment
    /// holding `offset`, if a sealed, never compacted segment holds it: a
    /// read from a log that returns a batch starting there or later
    /// skipped the segment.
    pub(crate) fn sealed_span_end(
        &self,
        image: &MetadataImage,
        topic: &TopicImage,
        partition: u32,
        offset: i64,
    ) -> Option<i64> {
        let segment = sealed_segment_holding(image, topic, partition, offset)?;
        // A compacted segment may legitimately hold no batch at or after
        // the offset (the cleaner removed them): no check there.
        if segment.clean_pass() > 0 {
            return None;
        }
        segment.span_of(partition).map(|sp| sp.end_offset)
    }
}
