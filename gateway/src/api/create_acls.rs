//! CreateAcls (v1-v3): needs ALTER on the cluster (Kafka's check);
//! SECURITY_DISABLED without an authorizer. Each creation is validated
//! (INVALID_REQUEST), an ACL that exists already succeeds without a
//! record, the rest are written in one metadata entry as `CreateAcl`
//! records under fresh ids.

use std::sync::Arc;

use kafka_protocol::messages::create_acls_response::AclCreationResult;
use kafka_protocol::messages::{CreateAclsRequest, CreateAclsResponse};
use kafka_protocol::protocol::StrBytes;
use tessera_metadata::acl::{
    AclBinding, AclOperation, AclPermissionType, PatternType, ResourceType,
};
use tessera_metadata::MetadataRecord;

use crate::authz::{Authz, Op};
use crate::broker::Broker;
use crate::error::ApiError;
use crate::request_context::RequestContext;

/// An ACL of the wire, validated as Kafka validates a new one.
pub fn binding(
    resource_type: i8,
    resource_name: &str,
    pattern_type: i8,
    principal: &str,
    host: &str,
    operation: i8,
    permission: i8,
) -> Result<AclBinding, ApiError> {
    let invalid = |what: &str, code: i8| ApiError::InvalidRequest(format!("unknown {what} {code}"));
    let acl = AclBinding {
        resource_type: ResourceType::from_code(resource_type)
            .ok_or_else(|| invalid("resource type", resource_type))?,
        resource_name: resource_name.to_string(),
        pattern_type: PatternType::from_code(pattern_type)
            .ok_or_else(|| invalid("pattern type", pattern_type))?,
        principal: principal.to_string(),
        host: host.to_string(),
        operation: AclOperation::from_code(operation)
            .ok_or_else(|| invalid("operation", operation))?,
        permission: AclPermissionType::from_code(permission)
            .ok_or_else(|| invalid("permission type", permission))?,
    };
    acl.validate()
        .map_err(|e| ApiError::InvalidRequest(e.to_string()))?;
    Ok(acl)
}

pub async fn handle(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    request: CreateAclsRequest,
) -> CreateAclsResponse {
    let n = request.creations.len();
    let refuse = |e: ApiError| vec![Err(e); n];
    let mut results: Vec<Result<(), ApiError>> = if !Authz::enabled(broker) {
        refuse(ApiError::SecurityDisabled)
    } else if !Authz::of(broker, ctx).allows_cluster(Op::Alter) {
        refuse(ApiError::ClusterAuthorizationFailed)
    } else {
        let image = broker.image();
        let mut records = Vec::new();
        let mut written: Vec<usize> = Vec::new();
        let mut batch: Vec<AclBinding> = Vec::new();
        let mut results = Vec::with_capacity(n);
        for (i, c) in request.creations.iter().enumerate() {
            match binding(
                c.resource_type,
                &c.resource_name,
                c.resource_pattern_type,
                &c.principal,
                &c.host,
                c.operation,
                c.permission_type,
            ) {
                Err(e) => results.push(Err(e)),
                Ok(acl) => {
                    results.push(Ok(()));
                    if image.acls.values().any(|a| *a == acl) || batch.contains(&acl) {
                        continue;
                    }
                    batch.push(acl.clone());
                    written.push(i);
                    records.push(MetadataRecord::CreateAcl {
                        id: uuid::Uuid::new_v4(),
                        acl,
                    });
                }
            }
        }
        if !records.is_empty() {
            if let Err(e) = broker.controller().write(records).await {
                let error = ApiError::from(e);
                for i in written {
                    results[i] = Err(error.clone());
                }
            }
        }
        results
    };
    CreateAclsResponse::default().with_results(
        results
            .drain(..)
            .map(|r| {
                let (code, message) = match r {
                    Ok(()) => (0, None),
                    Err(e) => (e.code(), e.message().map(StrBytes::from_string)),
                };
                AclCreationResult::default()
                    .with_error_code(code)
                    .with_error_message(message)
            })
            .collect(),
    )
}
