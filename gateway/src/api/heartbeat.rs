//! Heartbeat: keeps a classic member's session alive and tells it when the
//! group is rebalancing.

use std::sync::Arc;

use kafka_protocol::messages::{HeartbeatRequest, HeartbeatResponse};

use crate::authz::{Authz, Op};
use crate::broker::Broker;
use crate::request_context::RequestContext;

pub async fn handle(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    request: HeartbeatRequest,
) -> HeartbeatResponse {
    // Kafka: READ on the group.
    if let Err(e) = Authz::of(broker, ctx).group(Op::Read, &request.group_id) {
        return HeartbeatResponse::default().with_error_code(e.code());
    }
    let result = broker
        .groups()
        .heartbeat(
            &**broker,
            &request.group_id,
            &request.member_id,
            request.group_instance_id.as_deref(),
            request.generation_id,
        )
        .await;
    HeartbeatResponse::default().with_error_code(result.err().map_or(0, |e| e.code()))
}
