//! ConsumerGroupHeartbeat (KIP-848): joins, heartbeats and leaves of the
//! consumer group protocol; the decisions are in
//! [`crate::groups::consumer_protocol`].

use std::sync::Arc;

use kafka_protocol::messages::consumer_group_heartbeat_response::{Assignment, TopicPartitions};
use kafka_protocol::messages::{ConsumerGroupHeartbeatRequest, ConsumerGroupHeartbeatResponse};
use kafka_protocol::protocol::StrBytes;

use crate::authz::{Authz, Op};
use crate::broker::Broker;
use crate::groups::consumer_protocol::HeartbeatInput;
use crate::request_context::RequestContext;

pub async fn handle(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    request: ConsumerGroupHeartbeatRequest,
) -> ConsumerGroupHeartbeatResponse {
    // Kafka: READ on the group, DESCRIBE on each subscribed topic.
    let authz = Authz::of(broker, ctx);
    let denied = authz.group(Op::Read, &request.group_id).err().or_else(|| {
        request
            .subscribed_topic_names
            .iter()
            .flatten()
            .find_map(|t| authz.topic(Op::Describe, t).err())
    });
    if let Some(e) = denied {
        return ConsumerGroupHeartbeatResponse::default()
            .with_error_code(e.code())
            .with_error_message(e.message().map(StrBytes::from_string));
    }
    let input = HeartbeatInput {
        api_version: ctx.version(),
        group_id: request.group_id.to_string(),
        member_id: request.member_id.to_string(),
        member_epoch: request.member_epoch,
        instance_id: request.instance_id.map(|s| s.to_string()),
        rack_id: request.rack_id.map(|s| s.to_string()),
        rebalance_timeout_ms: request.rebalance_timeout_ms,
        subscribed_topic_names: request
            .subscribed_topic_names
            .map(|names| names.into_iter().map(|n| n.to_string()).collect()),
        subscribed_topic_regex: request.subscribed_topic_regex.map(|s| s.to_string()),
        server_assignor: request.server_assignor.map(|s| s.to_string()),
        owned_partitions: request.topic_partitions.map(|tps| {
            tps.into_iter()
                .map(|tp| (tp.topic_id, tp.partitions))
                .collect()
        }),
        client_id: ctx.client_id(),
        client_host: ctx.client_host(),
    };
    match broker
        .groups()
        .consumer_group_heartbeat(&**broker, input)
        .await
    {
        Ok(out) => ConsumerGroupHeartbeatResponse::default()
            .with_member_id(Some(StrBytes::from_string(out.member_id)))
            .with_member_epoch(out.member_epoch)
            .with_heartbeat_interval_ms(out.heartbeat_interval_ms)
            .with_assignment(out.assignment.map(|a| {
                Assignment::default().with_topic_partitions(
                    a.into_iter()
                        .map(|(topic, partitions)| {
                            TopicPartitions::default()
                                .with_topic_id(topic)
                                .with_partitions(partitions.into_iter().collect())
                        })
                        .collect(),
                )
            })),
        Err(e) => ConsumerGroupHeartbeatResponse::default()
            .with_error_code(e.code())
            .with_error_message(Some(StrBytes::from_string(e.message()))),
    }
}
