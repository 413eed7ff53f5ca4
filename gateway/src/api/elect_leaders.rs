//! ElectLeaders (v0-2), answered as Kafka's controller answers for a
//! cluster where a partition's leader is the primary of its range's active
//! segment, which is always the first replica Metadata lists: the
//! preferred replica already leads whenever the partition has a leader.
//!
//! - PREFERRED (0): leader present → ELECTION_NOT_NEEDED; the first
//!   replica fenced (no leader) → PREFERRED_LEADER_NOT_AVAILABLE.
//! - UNCLEAN (1): leader present → ELECTION_NOT_NEEDED; no leader →
//!   ELIGIBLE_LEADERS_NOT_AVAILABLE (retriable): the active controller
//!   already seals such a segment by quorum and reopens it on a live
//!   replica on its own, so a retry finds the new leader.
//! - Every partition (`topic_partitions` null): only partitions whose
//!   result is not ELECTION_NOT_NEEDED are listed, as Kafka lists them.
//! - Unknown topics and partitions: UNKNOWN_TOPIC_OR_PARTITION.

use std::sync::Arc;

use kafka_protocol::messages::elect_leaders_response::{PartitionResult, ReplicaElectionResult};
use kafka_protocol::messages::{ElectLeadersRequest, ElectLeadersResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use tessera_metadata::{MetadataImage, TopicImage};

use crate::authz::{Authz, Op};
use crate::broker::Broker;
use crate::error::ApiError;
use crate::request_context::RequestContext;

const PREFERRED: i8 = 0;
const UNCLEAN: i8 = 1;

pub async fn handle(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    request: ElectLeadersRequest,
) -> ElectLeadersResponse {
    let image = broker.image();
    // v0 has no election type: it is a preferred election.
    let election = if ctx.version() == 0 {
        PREFERRED
    } else {
        request.election_type
    };
    if election != PREFERRED && election != UNCLEAN {
        return ElectLeadersResponse::default()
            .with_error_code(ApiError::InvalidRequest(String::new()).code());
    }
    // Kafka: ALTER on the cluster; every partition asked for fails.
    if let Err(e) = Authz::of(broker, ctx).cluster(Op::Alter) {
        let results = request
            .topic_partitions
            .iter()
            .flatten()
            .map(|t| {
                ReplicaElectionResult::default()
                    .with_topic(t.topic.clone())
                    .with_partition_result(
                        t.partitions
                            .iter()
                            .map(|&p| partition_result(p, Err(e.clone())))
                            .collect(),
                    )
            })
            .collect();
        return ElectLeadersResponse::default()
            .with_error_code(e.code())
            .with_replica_election_results(results);
    }
    let mut results = Vec::new();
    match &request.topic_partitions {
        None => {
            for topic in image.topics.values() {
                let partitions: Vec<PartitionResult> = (0..topic.partitions as i32)
                    .map(|p| (p, elect(&image, Some(topic), p, election)))
                    .filter(|(_, r)| !matches!(r, Err(ApiError::ElectionNotNeeded)))
                    .map(|(p, r)| partition_result(p, r))
                    .collect();
                if !partitions.is_empty() {
                    results.push(topic_result(&topic.name, partitions));
                }
            }
        }
        Some(topics) => {
            for t in topics {
                let topic = image.topic_by_name(t.topic.0.as_str());
                let partitions = t
                    .partitions
                    .iter()
                    .map(|&p| partition_result(p, elect(&image, topic, p, election)))
                    .collect();
                results.push(
                    ReplicaElectionResult::default()
                        .with_topic(t.topic.clone())
                        .with_partition_result(partitions),
                );
            }
        }
    }
    ElectLeadersResponse::default().with_replica_election_results(results)
}

/// What an election of `partition` would do. `Ok` never happens: the
/// leader, when there is one, is already the preferred replica.
fn elect(
    image: &MetadataImage,
    topic: Option<&Arc<TopicImage>>,
    partition: i32,
    election: i8,
) -> Result<(), ApiError> {
    let topic = topic.ok_or(ApiError::UnknownTopicOrPartition)?;
    if partition < 0 || partition as u32 >= topic.partitions {
        return Err(ApiError::UnknownTopicOrPartition);
    }
    let segment = image
        .active_range_for(topic.id, partition as u32)
        .and_then(|r| image.active_segment(r.id));
    let leader = segment
        .as_ref()
        .and_then(|s| s.primary())
        .filter(|id| image.brokers.get(id).is_some_and(|b| !b.fenced));
    match (leader, election) {
        (Some(_), _) => Err(ApiError::ElectionNotNeeded),
        (None, PREFERRED) => Err(ApiError::PreferredLeaderNotAvailable(format!(
            "Failed to elect leader for partition {}-{partition} under strategy PREFERRED: the preferred replica is not available",
            topic.name
        ))),
        (None, _) => Err(ApiError::EligibleLeadersNotAvailable(format!(
            "Failed to elect leader for partition {}-{partition} under strategy UNCLEAN: the controller moves the range's segment to a live replica on its own; retry",
            topic.name
        ))),
    }
}

fn partition_result(partition: i32, result: Result<(), ApiError>) -> PartitionResult {
    let r = PartitionResult::default().with_partition_id(partition);
    match result {
        Ok(()) => r,
        Err(e) => r
            .with_error_code(e.code())
            .with_error_message(e.message().map(StrBytes::from_string)),
    }
}

fn topic_result(name: &str, partitions: Vec<PartitionResult>) -> ReplicaElectionResult {
    ReplicaElectionResult::default()
        .with_topic(TopicName(StrBytes::from_string(name.to_string())))
        .with_partition_result(partitions)
}
