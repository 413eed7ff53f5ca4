//! DescribeAcls (v1-v3): needs DESCRIBE on the cluster; SECURITY_DISABLED
//! without an authorizer; INVALID_REQUEST for a filter with an UNKNOWN
//! value. The matching ACLs, grouped by resource pattern.

use std::collections::BTreeMap;
use std::sync::Arc;

use kafka_protocol::messages::describe_acls_response::{AclDescription, DescribeAclsResource};
use kafka_protocol::messages::{DescribeAclsRequest, DescribeAclsResponse};
use kafka_protocol::protocol::StrBytes;
use tessera_metadata::acl::{
    AclFilter, AclOperation, AclPermissionType, PatternType, ResourceType,
};

use crate::authz::{Authz, Op};
use crate::broker::Broker;
use crate::error::ApiError;
use crate::request_context::RequestContext;

/// A filter of the wire (DescribeAcls, DeleteAcls); INVALID_REQUEST for a
/// code Kafka does not define or an UNKNOWN value.
#[allow(clippy::too_many_arguments)]
pub fn filter(
    resource_type: i8,
    resource_name: Option<&str>,
    pattern_type: i8,
    principal: Option<&str>,
    host: Option<&str>,
    operation: i8,
    permission: i8,
) -> Result<AclFilter, ApiError> {
    let invalid = |what: &str, code: i8| ApiError::InvalidRequest(format!("unknown {what} {code}"));
    let f = AclFilter {
        resource_type: ResourceType::from_code(resource_type)
            .ok_or_else(|| invalid("resource type", resource_type))?,
        resource_name: resource_name.map(str::to_string),
        pattern_type: PatternType::from_code(pattern_type)
            .ok_or_else(|| invalid("pattern type", pattern_type))?,
        principal: principal.map(str::to_string),
        host: host.map(str::to_string),
        operation: AclOperation::from_code(operation)
            .ok_or_else(|| invalid("operation", operation))?,
        permission: AclPermissionType::from_code(permission)
            .ok_or_else(|| invalid("permission type", permission))?,
    };
    f.validate()
        .map_err(|e| ApiError::InvalidRequest(e.to_string()))?;
    Ok(f)
}

pub async fn handle(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    request: DescribeAclsRequest,
) -> DescribeAclsResponse {
    let error = |e: ApiError| {
        DescribeAclsResponse::default()
            .with_error_code(e.code())
            .with_error_message(e.message().map(StrBytes::from_string))
    };
    if !Authz::enabled(broker) {
        return error(ApiError::SecurityDisabled);
    }
    if !Authz::of(broker, ctx).allows_cluster(Op::Describe) {
        return error(ApiError::ClusterAuthorizationFailed);
    }
    let f = match filter(
        request.resource_type_filter,
        request.resource_name_filter.as_deref(),
        request.pattern_type_filter,
        request.principal_filter.as_deref(),
        request.host_filter.as_deref(),
        request.operation,
        request.permission_type,
    ) {
        Ok(f) => f,
        Err(e) => return error(e),
    };
    let image = broker.image();
    let mut by_resource: BTreeMap<(i8, String, i8), Vec<AclDescription>> = BTreeMap::new();
    for acl in image.acls.values().filter(|a| f.matches(a)) {
        by_resource
            .entry((
                acl.resource_type.code(),
                acl.resource_name.clone(),
                acl.pattern_type.code(),
            ))
            .or_default()
            .push(
                AclDescription::default()
                    .with_principal(StrBytes::from_string(acl.principal.clone()))
                    .with_host(StrBytes::from_string(acl.host.clone()))
                    .with_operation(acl.operation.code())
                    .with_permission_type(acl.permission.code()),
            );
    }
    DescribeAclsResponse::default().with_resources(
        by_resource
            .into_iter()
            .map(|((rt, name, pt), acls)| {
                DescribeAclsResource::default()
                    .with_resource_type(rt)
                    .with_resource_name(StrBytes::from_string(name))
                    .with_pattern_type(pt)
                    .with_acls(acls)
            })
            .collect(),
    )
}
