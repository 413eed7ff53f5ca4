//! OffsetForLeaderEpoch (KIP-101, KIP-320): the end offset of a leader
//! epoch, which consumers use after a leader change to check that the
//! records they consumed were not truncated away (and followers to find
//! where to truncate).
//!
//! The partition's epoch history comes from the metadata image
//! ([`crate::leader_epochs`]), its log end offset from the range log that
//! holds it. As in Kafka, only the leader answers (NOT_LEADER_OR_FOLLOWER
//! elsewhere), `current_leader_epoch` fences (FENCED_LEADER_EPOCH when the
//! client's is older, UNKNOWN_LEADER_EPOCH when newer), and `replica_id`
//! (v3+: -1 for consumers, -2 for debugging, a broker id for followers)
//! changes nothing: every replica answers from the leader's log.

use std::sync::Arc;

use kafka_protocol::messages::offset_for_leader_epoch_request::OffsetForLeaderPartition;
use kafka_protocol::messages::offset_for_leader_epoch_response::{
    EpochEndOffset, OffsetForLeaderTopicResult,
};
use kafka_protocol::messages::{OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse};
use tessera_metadata::{MetadataImage, TopicImage};

use crate::authz::{Authz, Op};
use crate::broker::Broker;
use crate::error::ApiError;
use crate::leader_epochs::{self, UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET};
use crate::request_context::RequestContext;

pub async fn handle(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    request: OffsetForLeaderEpochRequest,
) -> OffsetForLeaderEpochResponse {
    let image = broker.image();
    // Kafka: DESCRIBE on each topic (a follower's request, replica id set,
    // CLUSTER_ACTION on the cluster).
    let authz = Authz::of(broker, ctx);
    let follower = request.replica_id.0 >= 0;
    let cluster_denied = follower && authz.cluster(Op::ClusterAction).is_err();
    let topics = request
        .topics
        .iter()
        .map(|topic| {
            let denied =
                cluster_denied || (!follower && authz.topic(Op::Describe, &topic.topic).is_err());
            let resolved = image.topic_by_name(topic.topic.0.as_str());
            let partitions = topic
                .partitions
                .iter()
                .map(|p| {
                    let answer = match resolved {
                        _ if denied => Err(ApiError::TopicAuthorizationFailed),
                        None => Err(ApiError::UnknownTopicOrPartition),
                        Some(t) => end_offset(broker, &image, t, p),
                    };
                    match answer {
                        Ok((epoch, end_offset)) => EpochEndOffset::default()
                            .with_partition(p.partition)
                            .with_leader_epoch(epoch)
                            .with_end_offset(end_offset),
                        Err(e) => EpochEndOffset::default()
                            .with_partition(p.partition)
                            .with_error_code(e.code())
                            .with_leader_epoch(UNDEFINED_EPOCH)
                            .with_end_offset(UNDEFINED_EPOCH_OFFSET),
                    }
                })
                .collect();
            OffsetForLeaderTopicResult::default()
                .with_topic(topic.topic.clone())
                .with_partitions(partitions)
        })
        .collect();
    OffsetForLeaderEpochResponse::default().with_topics(topics)
}

/// `(leader epoch, end offset)` of one partition this broker leads.
fn end_offset(
    broker: &Broker,
    image: &MetadataImage,
    topic: &TopicImage,
    p: &OffsetForLeaderPartition,
) -> Result<(i32, i64), ApiError> {
    let route = broker.route(image, topic, p.partition)?;
    leader_epochs::check_current_leader_epoch(p.current_leader_epoch, route.leader_epoch)?;
    let partition = p.partition as u32;
    let log_end = route.log.offsets(partition)?.log_end;
    Ok(leader_epochs::end_offset_for_epoch(
        image,
        topic.id,
        partition,
        p.leader_epoch,
        log_end,
    ))
}
