//! ListGroups: every group this coordinator holds, filtered by state (v4+,
//! case-insensitive as Kafka) and type (v5+: "classic", "consumer").

use std::sync::Arc;

use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::{GroupId, ListGroupsRequest, ListGroupsResponse};
use kafka_protocol::protocol::StrBytes;

use crate::authz::{Authz, Op, Resource};
use crate::broker::Broker;
use crate::request_context::RequestContext;

pub async fn handle(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    request: ListGroupsRequest,
) -> ListGroupsResponse {
    let version = ctx.version();
    let states: Vec<String> = request
        .states_filter
        .iter()
        .map(|s| s.to_lowercase())
        .collect();
    let types: Vec<String> = request
        .types_filter
        .iter()
        .map(|s| s.to_lowercase())
        .collect();
    // Kafka: DESCRIBE on the cluster lists every group, else the groups
    // the client may DESCRIBE.
    let authz = Authz::of(broker, ctx);
    let all = authz.may(Op::Describe, Resource::Cluster, crate::authz::CLUSTER_NAME);
    let groups = broker
        .groups()
        .list_groups()
        .await
        .into_iter()
        .filter(|g| all || authz.may(Op::Describe, Resource::Group, &g.group_id))
        .filter(|g| states.is_empty() || states.contains(&g.state.to_lowercase()))
        .filter(|g| types.is_empty() || types.iter().any(|t| t == g.group_type))
        .map(|g| {
            let mut listed = ListedGroup::default()
                .with_group_id(GroupId(StrBytes::from_string(g.group_id)))
                .with_protocol_type(StrBytes::from_string(g.protocol_type));
            if version >= 4 {
                listed = listed.with_group_state(StrBytes::from_static_str(g.state));
            }
            if version >= 5 {
                listed = listed.with_group_type(StrBytes::from_static_str(match g.group_type {
                    "consumer" => "Consumer",
                    _ => "Classic",
                }));
            }
            listed
        })
        .collect();
    ListGroupsResponse::default().with_groups(groups)
}
