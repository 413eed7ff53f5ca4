//! AlterPartitionReassignments (v0-1), answered as Kafka's controller
//! would for a cluster that cannot move a single partition's replicas: a
//! partition's replicas are its range's active segment's replica set,
//! shared by every partition of the range and chosen by the controller's
//! placement. Per partition:
//!
//! - unknown topic or partition: UNKNOWN_TOPIC_OR_PARTITION;
//! - cancel (replicas null): NO_REASSIGNMENT_IN_PROGRESS (none ever is);
//! - a target list is validated as Kafka validates it (INVALID_REPLICA_
//!   ASSIGNMENT for an empty list, unknown or repeated brokers; v1's
//!   `allow_replication_factor_change=false` with another size:
//!   INVALID_REPLICATION_FACTOR); the current replicas are a no-op
//!   success; any other target is INVALID_REPLICA_ASSIGNMENT.

use std::collections::BTreeSet;
use std::sync::Arc;

use kafka_protocol::messages::alter_partition_reassignments_response::{
    ReassignablePartitionResponse, ReassignableTopicResponse,
};
use kafka_protocol::messages::{
    AlterPartitionReassignmentsRequest, AlterPartitionReassignmentsResponse,
};
use kafka_protocol::protocol::StrBytes;
use tessera_metadata::{MetadataImage, TopicImage};

use crate::authz::{Authz, Op};
use crate::broker::Broker;
use crate::error::ApiError;
use crate::request_context::RequestContext;

pub async fn handle(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    request: AlterPartitionReassignmentsRequest,
) -> AlterPartitionReassignmentsResponse {
    // Kafka: ALTER on the cluster.
    if let Err(e) = Authz::of(broker, ctx).cluster(Op::Alter) {
        return AlterPartitionReassignmentsResponse::default()
            .with_error_code(e.code())
            .with_error_message(e.message().map(StrBytes::from_string));
    }
    let image = broker.image();
    // v0 has no flag: the replication factor may change (Kafka's default).
    let allow_rf_change = ctx.version() == 0 || request.allow_replication_factor_change;
    let responses = request
        .topics
        .iter()
        .map(|t| {
            let topic = image.topic_by_name(t.name.0.as_str());
            let partitions = t
                .partitions
                .iter()
                .map(|p| {
                    let target = p
                        .replicas
                        .as_ref()
                        .map(|r| r.iter().map(|b| b.0).collect::<Vec<_>>());
                    let result =
                        reassign(&image, topic, p.partition_index, target, allow_rf_change);
                    let r = ReassignablePartitionResponse::default()
                        .with_partition_index(p.partition_index);
                    match result {
                        Ok(()) => r.with_error_message(None),
                        Err(e) => r
                            .with_error_code(e.code())
                            .with_error_message(message(&e).map(StrBytes::from_string)),
                    }
                })
                .collect();
            ReassignableTopicResponse::default()
                .with_name(t.name.clone())
                .with_partitions(partitions)
        })
        .collect();
    let mut response = AlterPartitionReassignmentsResponse::default().with_responses(responses);
    if ctx.version() >= 1 {
        response = response.with_allow_replication_factor_change(allow_rf_change);
    }
    response
}

fn reassign(
    image: &MetadataImage,
    topic: Option<&Arc<TopicImage>>,
    partition: i32,
    target: Option<Vec<i32>>,
    allow_rf_change: bool,
) -> Result<(), ApiError> {
    let topic = topic.ok_or(ApiError::UnknownTopicOrPartition)?;
    if partition < 0 || partition as u32 >= topic.partitions {
        return Err(ApiError::UnknownTopicOrPartition);
    }
    let Some(target) = target else {
        return Err(ApiError::NoReassignmentInProgress(format!(
            "No ongoing reassignment for partition {}-{partition}.",
            topic.name
        )));
    };
    let current: Vec<i32> = image
        .active_range_for(topic.id, partition as u32)
        .and_then(|r| image.active_segment(r.id))
        .map(|s| s.replicas.clone())
        .unwrap_or_default();
    if target.is_empty() {
        return Err(ApiError::InvalidReplicaAssignment(
            "The manual partition assignment includes an empty replica list.".into(),
        ));
    }
    let mut seen = BTreeSet::new();
    for &b in &target {
        if !image.brokers.contains_key(&b) {
            return Err(ApiError::InvalidReplicaAssignment(format!(
                "The manual partition assignment includes broker {b}, but no such broker is registered."
            )));
        }
        if !seen.insert(b) {
            return Err(ApiError::InvalidReplicaAssignment(format!(
                "The manual partition assignment includes the broker {b} more than once."
            )));
        }
    }
    if !allow_rf_change && target.len() != current.len() {
        return Err(ApiError::InvalidReplicationFactor(format!(
            "The replication factor is changed from {} to {} but allowReplicationFactorChange is false",
            current.len(),
            target.len()
        )));
    }
    if target == current {
        return Ok(());
    }
    Err(ApiError::InvalidReplicaAssignment(format!(
        "Partition {}-{partition} is served by its range's segment on brokers {current:?}; replicas follow ranges, not single partitions, and cannot be reassigned.",
        topic.name
    )))
}

fn message(e: &ApiError) -> Option<String> {
    match e {
        ApiError::UnknownTopicOrPartition => None,
        ApiError::InvalidReplicaAssignment(m)
        | ApiError::InvalidReplicationFactor(m)
        | ApiError::NoReassignmentInProgress(m) => Some(m.clone()),
        other => other.message(),
    }
}
