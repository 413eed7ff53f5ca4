//! DeleteAcls (v1-v3): needs ALTER on the cluster; SECURITY_DISABLED
//! without an authorizer; INVALID_REQUEST for a bad filter. Every ACL a
//! filter matches is removed (`RemoveAcl` records, one metadata entry) and
//! reported under each filter that matched it.

use std::collections::BTreeSet;
use std::sync::Arc;

use kafka_protocol::messages::delete_acls_response::{
    DeleteAclsFilterResult, DeleteAclsMatchingAcl,
};
use kafka_protocol::messages::{DeleteAclsRequest, DeleteAclsResponse};
use kafka_protocol::protocol::StrBytes;
use tessera_metadata::acl::AclBinding;
use tessera_metadata::MetadataRecord;

use super::describe_acls::filter;
use crate::authz::{Authz, Op};
use crate::broker::Broker;
use crate::error::ApiError;
use crate::request_context::RequestContext;

fn failed(e: &ApiError) -> DeleteAclsFilterResult {
    DeleteAclsFilterResult::default()
        .with_error_code(e.code())
        .with_error_message(e.message().map(StrBytes::from_string))
}

fn matching(acl: &AclBinding) -> DeleteAclsMatchingAcl {
    DeleteAclsMatchingAcl::default()
        .with_resource_type(acl.resource_type.code())
        .with_resource_name(StrBytes::from_string(acl.resource_name.clone()))
        .with_pattern_type(acl.pattern_type.code())
        .with_principal(StrBytes::from_string(acl.principal.clone()))
        .with_host(StrBytes::from_string(acl.host.clone()))
        .with_operation(acl.operation.code())
        .with_permission_type(acl.permission.code())
}

pub async fn handle(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    request: DeleteAclsRequest,
) -> DeleteAclsResponse {
    let refuse = |e: ApiError| {
        DeleteAclsResponse::default()
            .with_filter_results(request.filters.iter().map(|_| failed(&e)).collect())
    };
    if !Authz::enabled(broker) {
        return refuse(ApiError::SecurityDisabled);
    }
    if !Authz::of(broker, ctx).allows_cluster(Op::Alter) {
        return refuse(ApiError::ClusterAuthorizationFailed);
    }
    let image = broker.image();
    let mut ids = BTreeSet::new();
    let mut results: Vec<Result<Vec<&AclBinding>, ApiError>> = Vec::new();
    for f in &request.filters {
        let parsed = filter(
            f.resource_type_filter,
            f.resource_name_filter.as_deref(),
            f.pattern_type_filter,
            f.principal_filter.as_deref(),
            f.host_filter.as_deref(),
            f.operation,
            f.permission_type,
        );
        results.push(parsed.map(|f| {
            image
                .acls
                .iter()
                .filter(|(_, a)| f.matches(a))
                .map(|(id, a)| {
                    ids.insert(*id);
                    a
                })
                .collect()
        }));
    }
    let mut write_error = None;
    if !ids.is_empty() {
        let records = ids
            .into_iter()
            .map(|id| MetadataRecord::RemoveAcl { id })
            .collect();
        if let Err(e) = broker.controller().write(records).await {
            write_error = Some(ApiError::from(e));
        }
    }
    DeleteAclsResponse::default().with_filter_results(
        results
            .into_iter()
            .map(|r| match (r, &write_error) {
                (Err(e), _) => failed(&e),
                (Ok(acls), Some(e)) if !acls.is_empty() => failed(e),
                (Ok(acls), _) => DeleteAclsFilterResult::default()
                    .with_matching_acls(acls.into_iter().map(matching).collect()),
            })
            .collect(),
    )
}
