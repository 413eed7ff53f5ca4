//! ListOffsets: earliest, latest, max timestamp, and the first offset at or
//! after a timestamp (found through the time index, then inside the batch).

use std::sync::Arc;

use bytes::Bytes;
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::{ListOffsetsRequest, ListOffsetsResponse};
use kafka_protocol::records::RecordBatchDecoder;
use tessera_log::batch;

use crate::authz::{Authz, Op};
use crate::broker::Broker;
use crate::error::ApiError;
use crate::request_context::RequestContext;

/// Kafka's special timestamps.
const LATEST: i64 = -1;
const EARLIEST: i64 = -2;
const MAX_TIMESTAMP: i64 = -3;
const EARLIEST_LOCAL: i64 = -4;
const LATEST_TIERED: i64 = -5;

pub async fn handle(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    request: ListOffsetsRequest,
) -> ListOffsetsResponse {
    let image = broker.image();
    // A broker whose image may be stale (paused, or cut off from the
    // metadata quorum) may have lost the lead: its log's start and end are
    // not the partition's, and a consumer resetting its position to them
    // would read again or skip. It sends the client to the leader instead.
    let fresh = broker.image_is_fresh();
    // leader_epoch exists from v4 on.
    let with_epoch = ctx.version() >= 4;
    let read_committed = request.isolation_level == 1;
    // Kafka answers INVALID_REQUEST for a partition named twice in one request.
    let mut seen = std::collections::HashSet::new();
    let duplicates: std::collections::HashSet<(String, i32)> = request
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions
                .iter()
                .map(move |p| (t.name.0.to_string(), p.partition_index))
        })
        .filter(|key| !seen.insert(key.clone()))
        .collect();
    // Kafka: DESCRIBE on each topic.
    let authz = Authz::of(broker, ctx);
    let topics = request
        .topics
        .iter()
        .map(|topic| {
            let denied = authz.topic(Op::Describe, &topic.name).err();
            let resolved = image.topic_by_name(topic.name.0.as_str()).cloned();
            let partitions = topic
                .partitions
                .iter()
                .map(|p| {
                    let duplicate =
                        duplicates.contains(&(topic.name.0.to_string(), p.partition_index));
                    let result = match &resolved {
                        _ if denied.is_some() => Err(ApiError::TopicAuthorizationFailed),
                        _ if duplicate => Err(ApiError::InvalidRequest(
                            "partition listed more than once".into(),
                        )),
                        None => Err(ApiError::UnknownTopicOrPartition),
                        Some(_) if !fresh => Err(ApiError::NotLeaderOrFollower),
                        Some(t) => broker
                            .route(&image, t, p.partition_index)
                            .and_then(|route| {
                                lookup(
                                    broker,
                                    &image,
                                    t,
                                    &route.log,
                                    p.partition_index as u32,
                                    p.timestamp,
                                    read_committed,
                                )
                                .map(|(offset, ts)| (offset, ts, route.leader_epoch))
                            }),
                    };
                    match result {
                        Ok((offset, timestamp, epoch)) => ListOffsetsPartitionResponse::default()
                            .with_partition_index(p.partition_index)
                            .with_offset(offset)
                            .with_timestamp(timestamp)
                            .with_leader_epoch(if offset >= 0 && with_epoch { epoch } else { -1 }),
                        Err(e) => ListOffsetsPartitionResponse::default()
                            .with_partition_index(p.partition_index)
                            .with_error_code(e.code())
                            .with_offset(-1)
                            .with_timestamp(-1)
                            .with_leader_epoch(-1),
                    }
                })
                .collect();
            ListOffsetsTopicResponse::default()
                .with_name(topic.name.clone())
                .with_partitions(partitions)
        })
        .collect();
    ListOffsetsResponse::default().with_topics(topics)
}

/// `(offset, timestamp)` for one partition; `(-1, -1)` when no record
/// qualifies. Timestamp searches walk the partition's lineage oldest first.
fn lookup(
    broker: &Broker,
    image: &tessera_metadata::MetadataImage,
    topic: &tessera_metadata::TopicImage,
    active: &tessera_log::RangeLog,
    partition: u32,
    timestamp: i64,
    read_committed: bool,
) -> Result<(i64, i64), ApiError> {
    let offsets = active.offsets(partition)?;
    // The metadata log is the authority on the log start (DeleteRecords);
    // nothing below it is listed.
    let log_start = offsets
        .log_start
        .max(image.log_start_offset(topic.id, partition));
    match timestamp {
        // read_committed consumers' "latest" is the last stable offset.
        LATEST | LATEST_TIERED if read_committed => Ok((offsets.last_stable, -1)),
        LATEST | LATEST_TIERED => Ok((offsets.high_watermark, -1)),
        EARLIEST | EARLIEST_LOCAL => Ok((log_start, -1)),
        MAX_TIMESTAMP => {
            let mut best: Option<(i64, i64)> = None;
            for log in broker.lineage(image, topic, partition) {
                if let Some(bytes) = log.batch_with_max_timestamp(partition)? {
                    let found = record_at(bytes, 0, |ts, max| ts == max)?.ok_or_else(|| {
                        ApiError::CorruptMessage(
                            "time index points at a batch without its max timestamp".into(),
                        )
                    })?;
                    if best.is_none_or(|(_, ts)| found.1 > ts) {
                        best = Some(found);
                    }
                }
            }
            Ok(best.unwrap_or((-1, -1)))
        }
        ts if ts >= 0 => {
            // Kafka searches from the log start offset on. A batch that
            // straddles the start may match only below it: search on after it.
            for log in broker.lineage(image, topic, partition) {
                let mut from = log_start;
                while let Some(bytes) = log.batch_at_timestamp(partition, ts, from)? {
                    let next = batch::parse_header(&bytes)?.last_offset() + 1;
                    if let Some(found) = record_at(bytes, from, |record_ts, _| record_ts >= ts)? {
                        return Ok(found);
                    }
                    from = next;
                }
            }
            Ok((-1, -1))
        }
        _ => Err(ApiError::InvalidRequest(format!(
            "invalid ListOffsets timestamp {timestamp}"
        ))),
    }
}

/// The first record of a stored batch at or after `from` (the log start
/// offset) matching `wanted(record ts, batch max ts)`, if any.
fn record_at(
    bytes: Bytes,
    from: i64,
    wanted: impl Fn(i64, i64) -> bool,
) -> Result<Option<(i64, i64)>, ApiError> {
    let header = batch::parse_header(&bytes)?;
    if header.is_log_append_time() {
        // Every record carries the batch's append time.
        let first = header.base_offset.max(from);
        return Ok((first <= header.last_offset()
            && wanted(header.max_timestamp, header.max_timestamp))
        .then_some((first, header.max_timestamp)));
    }
    let mut buf = bytes;
    let set = RecordBatchDecoder::decode(&mut buf)
        .map_err(|e| ApiError::CorruptMessage(format!("stored batch does not decode: {e}")))?;
    Ok(set
        .records
        .iter()
        .find(|r| r.offset >= from && wanted(r.timestamp, header.max_timestamp))
        .map(|r| (r.offset, r.timestamp)))
}
