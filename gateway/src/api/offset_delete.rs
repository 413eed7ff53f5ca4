//! OffsetDelete: removes committed offsets of topics the group no longer
//! consumes (GROUP_SUBSCRIBED_TO_TOPIC while it still does).

use std::sync::Arc;

use kafka_protocol::messages::offset_delete_response::{
    OffsetDeleteResponsePartition, OffsetDeleteResponseTopic,
};
use kafka_protocol::messages::{OffsetDeleteRequest, OffsetDeleteResponse};

use crate::authz::{Authz, Op};
use crate::broker::Broker;
use crate::request_context::RequestContext;

pub async fn handle(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    request: OffsetDeleteRequest,
) -> OffsetDeleteResponse {
    // Kafka: DELETE on the group, READ on each topic (its partitions fail).
    let authz = Authz::of(broker, ctx);
    if let Err(e) = authz.group(Op::Delete, &request.group_id) {
        return OffsetDeleteResponse::default().with_error_code(e.code());
    }
    let (denied, request_topics): (Vec<_>, Vec<_>) = request
        .topics
        .into_iter()
        .partition(|t| authz.topic(Op::Read, &t.name).is_err());
    let denied_topics: Vec<OffsetDeleteResponseTopic> = denied
        .into_iter()
        .map(|t| {
            OffsetDeleteResponseTopic::default()
                .with_name(t.name)
                .with_partitions(
                    t.partitions
                        .iter()
                        .map(|p| {
                            OffsetDeleteResponsePartition::default()
                                .with_partition_index(p.partition_index)
                                .with_error_code(
                                    crate::error::ApiError::TopicAuthorizationFailed.code(),
                                )
                        })
                        .collect(),
                )
        })
        .collect();
    let names: Vec<_> = request_topics.iter().map(|t| t.name.clone()).collect();
    let topics = request_topics
        .into_iter()
        .map(|t| {
            (
                t.name.to_string(),
                t.partitions
                    .into_iter()
                    .map(|p| p.partition_index)
                    .collect(),
            )
        })
        .collect();
    match broker
        .groups()
        .delete_offsets(&**broker, &request.group_id, topics)
        .await
    {
        Err(e) => OffsetDeleteResponse::default().with_error_code(e.code()),
        Ok(results) => OffsetDeleteResponse::default().with_topics(
            denied_topics
                .into_iter()
                .chain(
                    names
                        .into_iter()
                        .zip(results)
                        .map(|(name, (_, partitions))| {
                            OffsetDeleteResponseTopic::default()
                                .with_name(name)
                                .with_partitions(
                                    partitions
                                        .into_iter()
                                        .map(|(p, r)| {
                                            OffsetDeleteResponsePartition::default()
                                                .with_partition_index(p)
                                                .with_error_code(r.err().map_or(0, |e| e.code()))
                                        })
                                        .collect(),
                                )
                        }),
                )
                .collect(),
        ),
    }
}
