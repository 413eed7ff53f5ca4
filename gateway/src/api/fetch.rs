//! Fetch: resolve each partition to its range log, return stored batches as
//! they are, honour max_bytes / partition_max_bytes (the first batch of the
//! response always, even when larger) and long-poll for min_bytes up to
//! max_wait, woken by high-watermark moves.
//!
//! Fetch sessions (KIP-227) are refused exactly as a Kafka broker with no
//! session cache slots refuses them: full requests get session id 0 and are
//! served sessionless, incremental ones get FETCH_SESSION_ID_NOT_FOUND.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::fetch_request::FetchPartition;
use kafka_protocol::messages::fetch_response::{
    AbortedTransaction, FetchableTopicResponse, PartitionData,
};
use kafka_protocol::messages::{
    BrokerId, FetchRequest, FetchResponse, ProducerId, RequestHeader, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use tessera_metadata::TopicImage;

use crate::broker::Broker;
use crate::error::ApiError;
use crate::metrics::Metrics;

/// Session epochs with a meaning of their own (Kafka's FetchMetadata).
const INITIAL_EPOCH: i32 = 0;
const FINAL_EPOCH: i32 = -1;

pub async fn handle(
    broker: &Arc<Broker>,
    header: &RequestHeader,
    request: FetchRequest,
) -> FetchResponse {
    let version = header.request_api_version;
    if version >= 7
        && request.session_epoch != INITIAL_EPOCH
        && request.session_epoch != FINAL_EPOCH
    {
        return FetchResponse::default()
            .with_error_code(ResponseError::FetchSessionIdNotFound.code())
            .with_session_id(0);
    }
    let max_wait = Duration::from_millis(request.max_wait_ms.max(0) as u64);
    let deadline = tokio::time::Instant::now() + max_wait;
    let min_bytes = request.min_bytes.max(0) as usize;
    let mut hw_events = broker.hw_events.subscribe();
    loop {
        hw_events.borrow_and_update();
        let (response, bytes, has_error) = gather(broker, version, &request);
        if bytes >= min_bytes || has_error || tokio::time::Instant::now() >= deadline {
            Metrics::add(&broker.metrics.fetched_bytes, bytes as u64);
            return response;
        }
        tokio::select! {
            changed = hw_events.changed() => if changed.is_err() { return response },
            _ = tokio::time::sleep_until(deadline) => {}
        }
    }
}

/// One pass over the requested partitions: `(response, record bytes, any error)`.
fn gather(broker: &Broker, version: i16, request: &FetchRequest) -> (FetchResponse, usize, bool) {
    let image = broker.image();
    let mut remaining = request.max_bytes.max(0) as usize;
    let read_committed = request.isolation_level == 1;
    let mut total = 0usize;
    let mut has_error = false;
    let mut topics = Vec::with_capacity(request.topics.len());
    for topic in &request.topics {
        // v13+ names topics by id only.
        let resolved: Result<Arc<TopicImage>, ApiError> = if version >= 13 {
            image
                .topics
                .get(&topic.topic_id)
                .cloned()
                .ok_or(ApiError::UnknownTopicId)
        } else {
            image
                .topic_by_name(topic.topic.0.as_str())
                .cloned()
                .ok_or(ApiError::UnknownTopicOrPartition)
        };
        let mut partitions = Vec::with_capacity(topic.partitions.len());
        for p in &topic.partitions {
            let data = match &resolved {
                Err(e) => Err(e.clone()),
                Ok(t) => read_partition(
                    broker,
                    &image,
                    t,
                    p,
                    Reader {
                        read_committed,
                        rack: request.rack_id.as_str(),
                        first_in_response: total == 0,
                    },
                    &mut remaining,
                ),
            };
            let data = match data {
                Ok(d) => {
                    total += d.records.as_ref().map_or(0, Bytes::len);
                    d
                }
                Err(e) => {
                    has_error = true;
                    // Kafka answers an errored partition with -1 for the high
                    // watermark, last stable offset and log start offset.
                    PartitionData::default()
                        .with_partition_index(p.partition)
                        .with_error_code(e.code())
                        .with_high_watermark(-1)
                        .with_last_stable_offset(-1)
                        .with_log_start_offset(-1)
                        .with_preferred_read_replica(BrokerId(-1))
                        .with_records(Some(Bytes::new()))
                }
            };
            partitions.push(data);
        }
        topics.push(
            FetchableTopicResponse::default()
                .with_topic(if version >= 13 {
                    TopicName(StrBytes::default())
                } else {
                    topic.topic.clone()
                })
                .with_topic_id(topic.topic_id)
                .with_partitions(partitions),
        );
    }
    (
        FetchResponse::default()
            .with_session_id(0)
            .with_responses(topics),
        total,
        has_error,
    )
}

/// Who asks, as far as one partition's read is concerned.
struct Reader<'a> {
    read_committed: bool,
    /// The consumer's `client.rack` (v11+), for fetches from followers.
    rack: &'a str,
    first_in_response: bool,
}

fn read_partition(
    broker: &Broker,
    image: &tessera_metadata::MetadataImage,
    topic: &TopicImage,
    p: &FetchPartition,
    reader: Reader<'_>,
    remaining: &mut usize,
) -> Result<PartitionData, ApiError> {
    let Reader {
        read_committed,
        rack,
        first_in_response,
    } = reader;
    let route = match broker.route(image, topic, p.partition) {
        Ok(route) => route,
        // A consumer sent here as the preferred read replica (KIP-392).
        Err(ApiError::NotLeaderOrFollower)
            if broker.follower_fetch_enabled() && !rack.is_empty() && !read_committed =>
        {
            return follower_partition(broker, image, topic, p, remaining, first_in_response);
        }
        Err(e) => return Err(e),
    };
    if p.current_leader_epoch >= 0 && p.current_leader_epoch != route.leader_epoch {
        let e = if p.current_leader_epoch > route.leader_epoch {
            ApiError::UnknownLeaderEpoch
        } else {
            ApiError::FencedLeaderEpoch
        };
        return Err(e);
    }
    let partition = p.partition as u32;
    let limit = (p.partition_max_bytes.max(0) as usize).min(*remaining);
    let mut offsets = route.log.offsets(partition)?;
    // The metadata log is the authority on the log start (DeleteRecords);
    // the log learns it in the reconcile pass that follows the image.
    offsets.log_start = offsets
        .log_start
        .max(image.log_start_offset(topic.id, partition));
    if p.fetch_offset < offsets.log_start || p.fetch_offset > offsets.log_end {
        return Err(ApiError::OffsetOutOfRange);
    }
    // read_committed consumers see nothing at or past the last stable offset.
    let upper = if read_committed {
        offsets.last_stable
    } else {
        offsets.high_watermark
    };
    let mut records = Bytes::new();
    let preferred = if read_committed {
        None
    } else {
        broker.preferred_read_replica(image, topic, partition, p.fetch_offset, rack)
    };
    if let Some(replica) = preferred {
        // No records: the consumer fetches them from that replica.
        return Ok(PartitionData::default()
            .with_partition_index(p.partition)
            .with_high_watermark(offsets.high_watermark)
            .with_last_stable_offset(offsets.last_stable)
            .with_log_start_offset(offsets.log_start)
            .with_preferred_read_replica(BrokerId(replica))
            .with_records(Some(Bytes::new())));
    }
    if p.fetch_offset < upper && (limit > 0 || first_in_response) {
        // Offsets below the active range's base live in an ancestor range.
        let log = if p.fetch_offset >= route.log.base_offset(partition)? {
            route.log.clone()
        } else {
            broker.read_route(image, topic, partition, p.fetch_offset)?
        };
        let read = log.read_below(partition, p.fetch_offset, limit, upper)?;
        // Only the response's first batch may exceed the limit (KIP-74).
        if read.records.len() <= limit || first_in_response {
            records = read.records;
        }
    }
    *remaining = remaining.saturating_sub(records.len());
    let mut data = PartitionData::default()
        .with_partition_index(p.partition)
        .with_high_watermark(offsets.high_watermark)
        .with_last_stable_offset(offsets.last_stable)
        .with_log_start_offset(offsets.log_start)
        .with_preferred_read_replica(BrokerId(-1))
        .with_records(Some(records));
    if read_committed {
        // Aborted transactions overlapping what may be returned, from every
        // range of the partition's lineage (a marker can land in a child).
        let mut aborted = Vec::new();
        for log in broker.lineage(image, topic, partition) {
            for a in log.aborted_transactions(partition, p.fetch_offset, upper)? {
                aborted.push(
                    AbortedTransaction::default()
                        .with_producer_id(ProducerId(a.producer_id))
                        .with_first_offset(a.first_offset),
                );
            }
        }
        data = data.with_aborted_transactions(Some(aborted));
    }
    Ok(data)
}

/// A partition read served by this broker as a follower (sealed data only).
fn follower_partition(
    broker: &Broker,
    image: &tessera_metadata::MetadataImage,
    topic: &TopicImage,
    p: &FetchPartition,
    remaining: &mut usize,
    first_in_response: bool,
) -> Result<PartitionData, ApiError> {
    if p.partition < 0 || p.partition as u32 >= topic.partitions {
        return Err(ApiError::UnknownTopicOrPartition);
    }
    let partition = p.partition as u32;
    let log_start = image.log_start_offset(topic.id, partition);
    if p.fetch_offset < log_start {
        return Err(ApiError::OffsetOutOfRange);
    }
    let limit = (p.partition_max_bytes.max(0) as usize).min(*remaining);
    let read = broker.follower_read(image, topic, partition, p.fetch_offset, limit)?;
    let records = if read.records.len() <= limit || first_in_response {
        read.records
    } else {
        Bytes::new()
    };
    *remaining = remaining.saturating_sub(records.len());
    Ok(PartitionData::default()
        .with_partition_index(p.partition)
        .with_high_watermark(read.high_watermark)
        .with_last_stable_offset(read.high_watermark)
        .with_log_start_offset(log_start)
        .with_preferred_read_replica(BrokerId(-1))
        .with_records(Some(records)))
}
