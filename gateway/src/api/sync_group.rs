//! SyncGroup: the leader hands in the assignment; every member's response
//! waits until it is persisted and then carries that member's share.

use std::sync::Arc;

use kafka_protocol::messages::{SyncGroupRequest, SyncGroupResponse};
use kafka_protocol::protocol::StrBytes;

use crate::authz::{Authz, Op};
use crate::broker::Broker;
use crate::groups::classic::{SyncRequest, SyncResult};
use crate::request_context::RequestContext;

pub async fn handle(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    request: SyncGroupRequest,
) -> SyncGroupResponse {
    let version = ctx.version();
    // Kafka: READ on the group.
    if let Err(e) = Authz::of(broker, ctx).group(Op::Read, &request.group_id) {
        return SyncGroupResponse::default().with_error_code(e.code());
    }
    let req = SyncRequest {
        member_id: request.member_id.to_string(),
        group_instance_id: request.group_instance_id.map(|s| s.to_string()),
        generation_id: request.generation_id,
        protocol_type: request.protocol_type.map(|s| s.to_string()),
        protocol_name: request.protocol_name.map(|s| s.to_string()),
        assignments: request
            .assignments
            .into_iter()
            .map(|a| (a.member_id.to_string(), a.assignment))
            .collect(),
    };
    let result = broker
        .groups()
        .sync_group(&**broker, &request.group_id, req)
        .await;
    response(version, result)
}

pub fn response(version: i16, result: SyncResult) -> SyncGroupResponse {
    let mut r = SyncGroupResponse::default()
        .with_error_code(result.code())
        .with_assignment(result.assignment);
    if version >= 5 {
        r = r
            .with_protocol_type(result.protocol_type.map(StrBytes::from_string))
            .with_protocol_name(result.protocol_name.map(StrBytes::from_string));
    }
    r
}
