//! LeaveGroup: one member (v0–v2) or a batch (v3+, KIP-345, where an
//! instance id without member id removes that static member).

use std::sync::Arc;

use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::{LeaveGroupRequest, LeaveGroupResponse};
use kafka_protocol::protocol::StrBytes;

use crate::authz::{Authz, Op};
use crate::broker::Broker;
use crate::request_context::RequestContext;

pub async fn handle(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    request: LeaveGroupRequest,
) -> LeaveGroupResponse {
    let version = ctx.version();
    // Kafka: READ on the group.
    if let Err(e) = Authz::of(broker, ctx).group(Op::Read, &request.group_id) {
        return LeaveGroupResponse::default().with_error_code(e.code());
    }
    let members: Vec<(String, Option<String>)> = if version >= 3 {
        request
            .members
            .iter()
            .map(|m| {
                (
                    m.member_id.to_string(),
                    m.group_instance_id.as_ref().map(|s| s.to_string()),
                )
            })
            .collect()
    } else {
        vec![(request.member_id.to_string(), None)]
    };
    let result = broker
        .groups()
        .leave_group(&**broker, &request.group_id, members.clone())
        .await;
    match result {
        Err(e) => LeaveGroupResponse::default().with_error_code(e.code()),
        Ok(results) if version >= 3 => LeaveGroupResponse::default().with_members(
            members
                .into_iter()
                .zip(results)
                .map(|((member_id, instance), r)| {
                    MemberResponse::default()
                        .with_member_id(StrBytes::from_string(member_id))
                        .with_group_instance_id(instance.map(StrBytes::from_string))
                        .with_error_code(r.err().map_or(0, |e| e.code()))
                })
                .collect(),
        ),
        Ok(results) => LeaveGroupResponse::default().with_error_code(
            results
                .into_iter()
                .find_map(|r| r.err())
                .map_or(0, |e| e.code()),
        ),
    }
}
