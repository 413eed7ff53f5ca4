//! JoinGroup: the classic protocol's join phase. The response waits (without
//! holding anything but its own channel) until the group's join phase
//! completes.

use std::sync::Arc;

use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::{JoinGroupRequest, JoinGroupResponse};
use kafka_protocol::protocol::StrBytes;

use crate::authz::{Authz, Op};
use crate::broker::Broker;
use crate::groups::classic::{JoinRequest, JoinResult, Protocol};
use crate::request_context::RequestContext;

pub async fn handle(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    request: JoinGroupRequest,
) -> JoinGroupResponse {
    let version = ctx.version();
    // Kafka: READ on the group.
    if let Err(e) = Authz::of(broker, ctx).group(Op::Read, &request.group_id) {
        return JoinGroupResponse::default()
            .with_error_code(e.code())
            .with_generation_id(-1)
            .with_member_id(request.member_id.clone());
    }
    let req = JoinRequest {
        member_id: request.member_id.to_string(),
        group_instance_id: request.group_instance_id.map(|s| s.to_string()),
        client_id: ctx.client_id(),
        client_host: ctx.client_host(),
        session_timeout_ms: request.session_timeout_ms,
        // v0 has no rebalance timeout: the session timeout serves.
        rebalance_timeout_ms: if version >= 1 {
            request.rebalance_timeout_ms
        } else {
            request.session_timeout_ms
        },
        protocol_type: request.protocol_type.to_string(),
        protocols: request
            .protocols
            .into_iter()
            .map(|p| Protocol {
                name: p.name.to_string(),
                metadata: p.metadata,
            })
            .collect(),
        requires_known_member_id: version >= 4,
        supports_skip_assignment: version >= 9,
        new_member_id: String::new(),
    };
    let result = broker
        .groups()
        .join_group(&**broker, &request.group_id, req)
        .await;
    response(version, result)
}

pub fn response(version: i16, result: JoinResult) -> JoinGroupResponse {
    let code = result.code();
    let protocol_name = if version >= 7 {
        result.protocol_name.map(StrBytes::from_string)
    } else {
        // Not nullable before v7.
        Some(StrBytes::from_string(
            result.protocol_name.unwrap_or_default(),
        ))
    };
    JoinGroupResponse::default()
        .with_error_code(code)
        .with_generation_id(result.generation_id)
        .with_protocol_type(if version >= 7 {
            result.protocol_type.map(StrBytes::from_string)
        } else {
            None
        })
        .with_protocol_name(protocol_name)
        .with_leader(StrBytes::from_string(result.leader))
        .with_skip_assignment(version >= 9 && result.skip_assignment)
        .with_member_id(StrBytes::from_string(result.member_id))
        .with_members(
            result
                .members
                .into_iter()
                .map(|m| {
                    JoinGroupResponseMember::default()
                        .with_member_id(StrBytes::from_string(m.member_id))
                        .with_group_instance_id(if version >= 5 {
                            m.group_instance_id.map(StrBytes::from_string)
                        } else {
                            None
                        })
                        .with_metadata(m.metadata)
                })
                .collect(),
        )
}
