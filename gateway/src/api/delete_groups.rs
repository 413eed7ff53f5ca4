//! DeleteGroups: an empty group's offsets and metadata get tombstones in
//! `__consumer_offsets`, then the group is gone (NON_EMPTY_GROUP while it
//! has members, GROUP_ID_NOT_FOUND when there is none).

use std::sync::Arc;

use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use kafka_protocol::messages::{DeleteGroupsRequest, DeleteGroupsResponse};

use crate::authz::{Authz, Op};
use crate::broker::Broker;
use crate::request_context::RequestContext;

pub async fn handle(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    request: DeleteGroupsRequest,
) -> DeleteGroupsResponse {
    let mut results = Vec::with_capacity(request.groups_names.len());
    // Kafka: DELETE on each group.
    let authz = Authz::of(broker, ctx);
    for group_id in request.groups_names {
        let r = match authz.group(Op::Delete, &group_id) {
            Err(e) => Err(e),
            Ok(()) => broker.groups().delete_group(&**broker, &group_id).await,
        };
        results.push(
            DeletableGroupResult::default()
                .with_group_id(group_id)
                .with_error_code(r.err().map_or(0, |e| e.code())),
        );
    }
    DeleteGroupsResponse::default().with_results(results)
}
