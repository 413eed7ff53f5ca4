//! ConsumerGroupDescribe (KIP-848): consumer groups with their members,
//! assignments and target assignments. A classic group id is
//! GROUP_ID_NOT_FOUND ("not a consumer group"), as in Kafka.

use std::sync::Arc;

use kafka_protocol::messages::consumer_group_describe_response::{
    Assignment, DescribedGroup, Member, TopicPartitions,
};
use kafka_protocol::messages::{
    ConsumerGroupDescribeRequest, ConsumerGroupDescribeResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;

use crate::authz::{Authz, Op, Resource};
use crate::broker::Broker;
use crate::groups::consumer_protocol::DescribedMember;
use crate::request_context::RequestContext;

/// `memberType` (v1+): the member uses the consumer protocol.
const CONSUMER_MEMBER_TYPE: i8 = 1;

fn assignment(topics: Vec<(uuid::Uuid, String, Vec<i32>)>) -> Assignment {
    Assignment::default().with_topic_partitions(
        topics
            .into_iter()
            .map(|(id, name, partitions)| {
                TopicPartitions::default()
                    .with_topic_id(id)
                    .with_topic_name(TopicName(StrBytes::from_string(name)))
                    .with_partitions(partitions)
            })
            .collect(),
    )
}

fn member(m: DescribedMember, version: i16) -> Member {
    let member = Member::default()
        .with_member_id(StrBytes::from_string(m.member_id))
        .with_instance_id(m.instance_id.map(StrBytes::from_string))
        .with_rack_id(m.rack_id.map(StrBytes::from_string))
        .with_member_epoch(m.member_epoch)
        .with_client_id(StrBytes::from_string(m.client_id))
        .with_client_host(StrBytes::from_string(m.client_host))
        .with_subscribed_topic_names(
            m.subscribed_topic_names
                .into_iter()
                .map(|n| TopicName(StrBytes::from_string(n)))
                .collect(),
        )
        .with_assignment(assignment(m.assignment))
        .with_target_assignment(assignment(m.target_assignment));
    if version >= 1 {
        member.with_member_type(CONSUMER_MEMBER_TYPE)
    } else {
        member
    }
}

pub async fn handle(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    request: ConsumerGroupDescribeRequest,
) -> ConsumerGroupDescribeResponse {
    let version = ctx.version();
    let mut groups = Vec::with_capacity(request.group_ids.len());
    // Kafka: DESCRIBE on each group.
    let authz = Authz::of(broker, ctx);
    for group_id in request.group_ids {
        if let Err(e) = authz.group(Op::Describe, &group_id) {
            groups.push(
                DescribedGroup::default()
                    .with_group_id(group_id)
                    .with_error_code(e.code())
                    .with_error_message(e.message().map(StrBytes::from_string)),
            );
            continue;
        }
        let operations = if request.include_authorized_operations {
            authz.operations(Resource::Group, &group_id)
        } else {
            i32::MIN
        };
        let described = match broker
            .groups()
            .consumer_group_describe(&**broker, &group_id)
            .await
        {
            Ok(d) => DescribedGroup::default()
                .with_group_id(group_id)
                .with_group_state(StrBytes::from_static_str(d.state.as_str()))
                .with_group_epoch(d.group_epoch)
                .with_assignment_epoch(d.assignment_epoch)
                .with_assignor_name(StrBytes::from_string(d.assignor_name))
                .with_members(d.members.into_iter().map(|m| member(m, version)).collect())
                .with_authorized_operations(operations),
            Err(e) => DescribedGroup::default()
                .with_group_id(group_id)
                .with_error_code(e.code())
                .with_error_message(Some(StrBytes::from_string(e.message()))),
        };
        groups.push(described);
    }
    ConsumerGroupDescribeResponse::default().with_groups(groups)
}
