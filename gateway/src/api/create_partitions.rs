//! CreatePartitions (v0-3): grows topics' partition counts with Kafka's
//! checks and messages (KRaft's `ReplicationControlManager.createPartitions`).
//! Each topic is planned against the committed image and written as one
//! metadata entry; the new partitions get a range of their own (see
//! `tessera_planner::create_partitions`), so existing partitions keep
//! their data, leader and epoch, and the new ones start at offset 0.
//! `validate_only` plans and writes nothing.

use std::collections::HashSet;
use std::sync::Arc;

use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::{CreatePartitionsRequest, CreatePartitionsResponse};
use kafka_protocol::protocol::StrBytes;

use crate::authz::{Authz, Op};
use crate::broker::Broker;
use crate::error::ApiError;
use crate::request_context::RequestContext;

pub async fn handle(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    request: CreatePartitionsRequest,
) -> CreatePartitionsResponse {
    let mut seen = HashSet::new();
    let duplicates: HashSet<String> = request
        .topics
        .iter()
        .filter(|t| !seen.insert(t.name.0.to_string()))
        .map(|t| t.name.0.to_string())
        .collect();
    let mut results = Vec::with_capacity(request.topics.len());
    // Kafka: ALTER on each topic.
    let authz = Authz::of(broker, ctx);
    for topic in &request.topics {
        let name = topic.name.0.to_string();
        let outcome = if duplicates.contains(&name) {
            Err(ApiError::InvalidRequest("Duplicate topic name.".into()))
        } else if let Err(e) = authz.topic(Op::Alter, &name) {
            Err(e)
        } else if topic.count <= 0 {
            // Kafka's count is an int; a non-positive one is never an increase.
            Err(ApiError::InvalidPartitions(format!(
                "The topic {name} currently has {} partition(s); {} would not be an increase.",
                broker
                    .image()
                    .topic_by_name(&name)
                    .map_or(0, |t| t.partitions),
                topic.count
            )))
        } else {
            let assignments = topic.assignments.as_ref().map(|a| {
                a.iter()
                    .map(|p| p.broker_ids.iter().map(|b| b.0).collect())
                    .collect()
            });
            broker
                .create_partitions(
                    &name,
                    topic.count as u32,
                    assignments,
                    request.validate_only,
                )
                .await
        };
        let mut result = CreatePartitionsTopicResult::default().with_name(topic.name.clone());
        if let Err(e) = outcome {
            result = result
                .with_error_code(e.code())
                .with_error_message(kafka_message(&e).map(StrBytes::from_string));
        }
        results.push(result);
    }
    CreatePartitionsResponse::default().with_results(results)
}

/// The error message as Kafka's controller words it: the planner's
/// sentences as they are, none for an unknown topic.
fn kafka_message(e: &ApiError) -> Option<String> {
    match e {
        ApiError::UnknownTopicOrPartition => None,
        ApiError::InvalidPartitions(m)
        | ApiError::InvalidReplicaAssignment(m)
        | ApiError::InvalidReplicationFactor(m)
        | ApiError::InvalidRequest(m) => Some(m.clone()),
        other => other.message(),
    }
}
