//! DescribeGroups: state (Kafka's names), protocol type, the selected
//! protocol and members with their metadata and assignment (when Stable).
//! An unknown group is Dead (v6+: with GROUP_ID_NOT_FOUND, as Kafka 4).

use std::sync::Arc;

use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::{DescribeGroupsRequest, DescribeGroupsResponse};
use kafka_protocol::protocol::StrBytes;

use crate::authz::{Authz, Op, Resource};
use crate::broker::Broker;
use crate::error::ApiError;
use crate::request_context::RequestContext;

pub async fn handle(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    request: DescribeGroupsRequest,
) -> DescribeGroupsResponse {
    let version = ctx.version();
    let mut groups = Vec::with_capacity(request.groups.len());
    // Kafka: DESCRIBE on each group.
    let authz = Authz::of(broker, ctx);
    for group_id in request.groups {
        let described = DescribedGroup::default().with_group_id(group_id.clone());
        if let Err(e) = authz.group(Op::Describe, &group_id) {
            groups.push(
                described
                    .with_error_code(e.code())
                    .with_authorized_operations(i32::MIN),
            );
            continue;
        }
        let described = match broker.groups().describe_group(&**broker, &group_id).await {
            Err(e) => described.with_error_code(e.code()),
            Ok(None) => {
                let d = described.with_group_state(StrBytes::from_static_str("Dead"));
                if version >= 6 {
                    let e = ApiError::GroupIdNotFound;
                    d.with_error_code(e.code())
                        .with_error_message(e.message().map(StrBytes::from_string))
                } else {
                    d
                }
            }
            Ok(Some(g)) => described
                .with_group_state(StrBytes::from_static_str(g.state))
                .with_protocol_type(StrBytes::from_string(g.protocol_type))
                .with_protocol_data(StrBytes::from_string(g.protocol))
                .with_members(
                    g.members
                        .into_iter()
                        .map(|m| {
                            DescribedGroupMember::default()
                                .with_member_id(StrBytes::from_string(m.member_id))
                                .with_group_instance_id(if version >= 4 {
                                    m.group_instance_id.map(StrBytes::from_string)
                                } else {
                                    None
                                })
                                .with_client_id(StrBytes::from_string(m.client_id))
                                .with_client_host(StrBytes::from_string(m.client_host))
                                .with_member_metadata(m.metadata)
                                .with_member_assignment(m.assignment)
                        })
                        .collect(),
                ),
        };
        let described = if version >= 3 && request.include_authorized_operations {
            described.with_authorized_operations(authz.operations(Resource::Group, &group_id))
        } else {
            described.with_authorized_operations(i32::MIN)
        };
        groups.push(described);
    }
    DescribeGroupsResponse::default().with_groups(groups)
}
