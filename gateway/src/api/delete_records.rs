//! DeleteRecords (v0-2): moves partitions' log start offsets forward, as
//! Kafka's `ReplicaManager.deleteRecords` / `Partition.deleteRecordsOnLeader`
//! do: only the leader (the primary of the range's active segment) takes
//! it (NOT_LEADER_OR_FOLLOWER otherwise), offset -1 means the high
//! watermark, an offset above the high watermark (or another negative one)
//! is OFFSET_OUT_OF_RANGE, and a topic whose `cleanup.policy` lacks
//! `delete` is POLICY_VIOLATION. The new starts of the whole request are
//! written to the metadata log as one entry (`SetLogStartOffset`), so every
//! replica and every restart agrees on them; the answer's low watermark is
//! the partition's log start offset once this broker's logs applied it.
//!
//! The records below the log start offset are not physically deleted at
//! once: reads, ListOffsets EARLIEST and fetches stop at the start, the bytes
//! stay until retention (`broker/retention.rs`) removes whole segments.

use std::collections::BTreeMap;
use std::sync::Arc;

use kafka_protocol::messages::delete_records_response::{
    DeleteRecordsPartitionResult, DeleteRecordsTopicResult,
};
use kafka_protocol::messages::{DeleteRecordsRequest, DeleteRecordsResponse};
use tessera_metadata::{MetadataImage, TopicId, TopicImage};

use crate::authz::{Authz, Op};
use crate::broker::Broker;
use crate::error::ApiError;
use crate::request_context::RequestContext;

/// Kafka's `DeleteRecordsRequest.HIGH_WATERMARK`.
const HIGH_WATERMARK: i64 = -1;

pub async fn handle(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    request: DeleteRecordsRequest,
) -> DeleteRecordsResponse {
    let image = broker.image();
    // First pass: each partition checked on the leader; what may move is
    // collected per topic and written in one entry.
    let mut checked: Vec<Vec<Result<i64, ApiError>>> = Vec::with_capacity(request.topics.len());
    let mut targets: BTreeMap<TopicId, Vec<(u32, i64)>> = BTreeMap::new();
    // Kafka: DELETE on each topic.
    let authz = Authz::of(broker, ctx);
    for topic in &request.topics {
        let denied = authz.topic(Op::Delete, &topic.name).err();
        let resolved = image.topic_by_name(topic.name.0.as_str()).cloned();
        let resolved = resolved.filter(|_| denied.is_none());
        let mut results = Vec::with_capacity(topic.partitions.len());
        for p in &topic.partitions {
            let result = match &resolved {
                None if denied.is_some() => Err(ApiError::TopicAuthorizationFailed),
                None => Err(ApiError::UnknownTopicOrPartition),
                Some(t) => target(broker, &image, t, p.partition_index, p.offset),
            };
            if let (Ok(offset), Some(t)) = (&result, &resolved) {
                targets
                    .entry(t.id)
                    .or_default()
                    .push((p.partition_index as u32, *offset));
            }
            results.push(result);
        }
        checked.push(results);
    }
    let targets: Vec<(TopicId, Vec<(u32, i64)>)> = targets.into_iter().collect();
    let written = broker.advance_log_starts(&targets).await;
    let image = broker.image();
    let topics = request
        .topics
        .iter()
        .zip(checked)
        .map(|(topic, results)| {
            let topic_id = image.topic_by_name(topic.name.0.as_str()).map(|t| t.id);
            let partitions = topic
                .partitions
                .iter()
                .zip(results)
                .map(|(p, result)| {
                    let result = result.and_then(|_| written.clone());
                    let low = result.and_then(|_| {
                        let topic_id = topic_id.ok_or(ApiError::UnknownTopicOrPartition)?;
                        Ok(image.log_start_offset(topic_id, p.partition_index as u32))
                    });
                    match low {
                        Ok(low_watermark) => DeleteRecordsPartitionResult::default()
                            .with_partition_index(p.partition_index)
                            .with_low_watermark(low_watermark),
                        Err(e) => DeleteRecordsPartitionResult::default()
                            .with_partition_index(p.partition_index)
                            .with_low_watermark(-1)
                            .with_error_code(e.code()),
                    }
                })
                .collect();
            DeleteRecordsTopicResult::default()
                .with_name(topic.name.clone())
                .with_partitions(partitions)
        })
        .collect();
    DeleteRecordsResponse::default().with_topics(topics)
}

/// The offset `partition`'s log should start at, checked on its leader.
fn target(
    broker: &Broker,
    image: &MetadataImage,
    topic: &TopicImage,
    partition: i32,
    offset: i64,
) -> Result<i64, ApiError> {
    let route = broker.route(image, topic, partition)?;
    let policy = topic
        .configs
        .get("cleanup.policy")
        .unwrap_or(&broker.config().log_cleanup_policy);
    if !policy.split(',').any(|p| p.trim() == "delete") {
        return Err(ApiError::PolicyViolation(format!(
            "Records of partition {}-{partition} can not be deleted due to the configured policy",
            topic.name
        )));
    }
    let high_watermark = route.log.offsets(partition as u32)?.high_watermark;
    let wanted = if offset == HIGH_WATERMARK {
        high_watermark
    } else {
        offset
    };
    if wanted < 0 || wanted > high_watermark {
        return Err(ApiError::OffsetOutOfRange);
    }
    Ok(wanted)
}
