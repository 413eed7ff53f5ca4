//! The console's ACLs and SCRAM users: listed from the metadata image
//! (DESCRIBE on the cluster, as DescribeAcls and DescribeUserScramCredentials
//! ask), changed through Kafka's own CreateAcls, DeleteAcls and
//! AlterUserScramCredentials (ALTER on the cluster, checked for the console
//! user first; the request then runs as this broker, so its validation and
//! error messages are Kafka's). No secret is ever sent back: users are
//! listed with their mechanisms and iterations only.

use std::sync::Arc;

use kafka_protocol::messages::alter_client_quotas_request::{EntityData, EntryData, OpData};
use kafka_protocol::messages::alter_user_scram_credentials_request::{
    ScramCredentialDeletion, ScramCredentialUpsertion,
};
use kafka_protocol::messages::create_acls_request::AclCreation;
use kafka_protocol::messages::delete_acls_request::DeleteAclsFilter;
use kafka_protocol::messages::{
    AlterClientQuotasRequest, AlterUserScramCredentialsRequest, CreateAclsRequest,
    DeleteAclsRequest,
};
use kafka_protocol::protocol::{Request, StrBytes};
use serde::{Deserialize, Serialize};
use tessera_metadata::acl::{AclOperation, AclPermissionType, PatternType, ResourceType};
use tessera_metadata::{MetadataImage, QuotaEntityName};

use super::api::{ask, Node};
use super::Reply;
use crate::authz::{Authz, Op};
use crate::broker::Broker;
use crate::sasl::scram::ScramMechanism;

/// SCRAM iterations of a credential the console makes (Kafka's tools'
/// default for SCRAM-SHA-256/512 is 4096).
const ITERATIONS: i32 = 4096;

/// One ACL as the page shows it and as a write names it (Kafka's names).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct AclRow {
    pub resource_type: String,
    pub resource_name: String,
    pub pattern_type: String,
    pub principal: String,
    pub host: String,
    pub operation: String,
    pub permission: String,
}

#[derive(Serialize, Debug, PartialEq)]
pub struct UserRow {
    pub name: String,
    pub mechanism: String,
    pub iterations: u32,
}

/// One client quota: its entity (a user, a client id or both; `<default>`
/// is Kafka's default entity, null a part the entity does not have), key
/// and value.
#[derive(Serialize, Deserialize, Debug, PartialEq)]
pub struct QuotaRow {
    pub user: Option<String>,
    pub client_id: Option<String>,
    pub key: String,
    #[serde(default)]
    pub value: Option<f64>,
}

/// Kafka's tools' name of the default entity.
const DEFAULT_ENTITY: &str = "<default>";

fn entity_name(name: &QuotaEntityName) -> String {
    name.as_option().unwrap_or(DEFAULT_ENTITY).to_string()
}

/// Every client quota of the image.
pub fn quotas(image: &MetadataImage) -> Vec<QuotaRow> {
    image
        .client_quotas
        .iter()
        .flat_map(|(entity, values)| {
            values.iter().map(move |(key, value)| QuotaRow {
                user: entity.user.as_ref().map(entity_name),
                client_id: entity.client_id.as_ref().map(entity_name),
                key: key.clone(),
                value: Some(*value),
            })
        })
        .collect()
}

/// POST `quotas` (set) and `quotas/delete` (remove), as AlterClientQuotas.
pub async fn write_quota(
    broker: &Arc<Broker>,
    authz: &Authz<'_>,
    q: QuotaRow,
    remove: bool,
) -> Result<Reply, Reply> {
    need_cluster(authz, Op::AlterConfigs)?;
    let part = |kind: &'static str, name: &Option<String>| {
        name.as_ref().map(|n| {
            EntityData::default()
                .with_entity_type(StrBytes::from_static_str(kind))
                .with_entity_name((n != DEFAULT_ENTITY).then(|| StrBytes::from_string(n.clone())))
        })
    };
    let entity: Vec<EntityData> = [part("user", &q.user), part("client-id", &q.client_id)]
        .into_iter()
        .flatten()
        .collect();
    let value = match (remove, q.value) {
        (true, _) => 0.0,
        (false, Some(v)) => v,
        (false, None) => return Err(Reply::error("400 Bad Request", "a value is required")),
    };
    let answer = ask_self(
        broker,
        1,
        &AlterClientQuotasRequest::default().with_entries(vec![EntryData::default()
            .with_entity(entity)
            .with_ops(vec![OpData::default()
                .with_key(StrBytes::from_string(q.key.clone()))
                .with_value(value)
                .with_remove(remove)])]),
    )
    .await?;
    let result = answer.entries.into_iter().next().unwrap_or_default();
    tracing::info!(
        ?q,
        remove,
        code = result.error_code,
        "console: client quota changed"
    );
    outcome(
        result.error_code,
        result.error_message.as_ref(),
        serde_json::json!({ "quota": q, "removed": remove }),
    )
}

#[derive(Deserialize)]
struct UserChange {
    name: String,
    mechanism: String,
    password: Option<String>,
}

/// Every ACL of the image, sorted as Kafka's tools print them.
pub fn acls(image: &MetadataImage) -> Vec<AclRow> {
    let mut rows: Vec<AclRow> = image
        .acls
        .values()
        .map(|a| AclRow {
            resource_type: a.resource_type.name().into(),
            resource_name: a.resource_name.clone(),
            pattern_type: a.pattern_type.name().into(),
            principal: a.principal.clone(),
            host: a.host.clone(),
            operation: a.operation.name().into(),
            permission: a.permission.name().into(),
        })
        .collect();
    rows.sort_by(|a, b| {
        (
            &a.resource_type,
            &a.resource_name,
            &a.principal,
            &a.operation,
        )
            .cmp(&(
                &b.resource_type,
                &b.resource_name,
                &b.principal,
                &b.operation,
            ))
    });
    rows
}

/// Every SCRAM user and mechanism of the image (never a key or a salt).
pub fn users(image: &MetadataImage) -> Vec<UserRow> {
    image
        .scram_credentials
        .iter()
        .map(|((name, mechanism), record)| UserRow {
            name: name.clone(),
            mechanism: ScramMechanism::from_kafka_type(*mechanism as i8)
                .map_or("UNKNOWN", |m| m.name())
                .into(),
            iterations: record.iterations,
        })
        .collect()
}

/// The wire code of a Kafka enum value named `name` (`TOPIC`, `READ`, ...).
fn code_of<T: Copy>(
    all: &[T],
    name_of: fn(T) -> &'static str,
    code: fn(T) -> i8,
    name: &str,
    what: &str,
) -> Result<i8, Reply> {
    all.iter()
        .find(|v| name_of(**v).eq_ignore_ascii_case(name))
        .map(|v| code(*v))
        .ok_or_else(|| Reply::error("400 Bad Request", &format!("unknown {what} {name}")))
}

fn need_cluster(authz: &Authz<'_>, op: Op) -> Result<(), Reply> {
    if authz.allows_cluster(op) {
        Ok(())
    } else {
        Err(Reply::error(
            "403 Forbidden",
            &format!("not allowed to {op} the cluster"),
        ))
    }
}

/// GET `acls`, `users` (DESCRIBE on the cluster) and `quotas`
/// (DESCRIBE_CONFIGS, as DescribeClientQuotas).
pub fn read(broker: &Broker, authz: &Authz<'_>, what: &str) -> Result<Reply, Reply> {
    let image = broker.image();
    Ok(match what {
        "acls" => {
            need_cluster(authz, Op::Describe)?;
            Reply::json(&acls(&image))
        }
        "users" => {
            need_cluster(authz, Op::Describe)?;
            Reply::json(&users(&image))
        }
        _ => {
            need_cluster(authz, Op::DescribeConfigs)?;
            Reply::json(&quotas(&image))
        }
    })
}

/// Sends `request` to this broker's own Kafka listener.
async fn ask_self<R: Request>(
    broker: &Broker,
    version: i16,
    request: &R,
) -> Result<R::Response, Reply> {
    ask(broker, &Node::this(broker)?, version, request).await
}

fn outcome(code: i16, message: Option<&StrBytes>, done: serde_json::Value) -> Result<Reply, Reply> {
    if code == 0 {
        return Ok(Reply::json(&done));
    }
    let message = message.map_or_else(
        || format!("{:?}", kafka_protocol::ResponseError::try_from_code(code)),
        |m| m.to_string(),
    );
    Err(Reply::kafka(&message, code))
}

struct Codes {
    resource_type: i8,
    pattern_type: i8,
    operation: i8,
    permission: i8,
}

fn codes(acl: &AclRow) -> Result<Codes, Reply> {
    Ok(Codes {
        resource_type: code_of(
            ResourceType::ALL_VALUES,
            ResourceType::name,
            ResourceType::code,
            &acl.resource_type,
            "resource type",
        )?,
        pattern_type: code_of(
            PatternType::ALL_VALUES,
            PatternType::name,
            PatternType::code,
            &acl.pattern_type,
            "pattern type",
        )?,
        operation: code_of(
            AclOperation::ALL_VALUES,
            AclOperation::name,
            AclOperation::code,
            &acl.operation,
            "operation",
        )?,
        permission: code_of(
            AclPermissionType::ALL_VALUES,
            AclPermissionType::name,
            AclPermissionType::code,
            &acl.permission,
            "permission",
        )?,
    })
}

/// POST `acls` (create) and `acls/delete` (delete exactly that ACL).
pub async fn write_acl(
    broker: &Arc<Broker>,
    authz: &Authz<'_>,
    acl: AclRow,
    delete: bool,
) -> Result<Reply, Reply> {
    need_cluster(authz, Op::Alter)?;
    let c = codes(&acl)?;
    let s = |v: &str| StrBytes::from_string(v.to_string());
    if delete {
        let answer = ask_self(
            broker,
            3,
            &DeleteAclsRequest::default().with_filters(vec![DeleteAclsFilter::default()
                .with_resource_type_filter(c.resource_type)
                .with_resource_name_filter(Some(s(&acl.resource_name)))
                .with_pattern_type_filter(c.pattern_type)
                .with_principal_filter(Some(s(&acl.principal)))
                .with_host_filter(Some(s(&acl.host)))
                .with_operation(c.operation)
                .with_permission_type(c.permission)]),
        )
        .await?;
        let result = answer.filter_results.into_iter().next().unwrap_or_default();
        let deleted = result.matching_acls.len();
        tracing::info!(?acl, deleted, "console: ACL deleted");
        return outcome(
            result.error_code,
            result.error_message.as_ref(),
            serde_json::json!({ "deleted": deleted }),
        );
    }
    let answer = ask_self(
        broker,
        3,
        &CreateAclsRequest::default().with_creations(vec![AclCreation::default()
            .with_resource_type(c.resource_type)
            .with_resource_name(s(&acl.resource_name))
            .with_resource_pattern_type(c.pattern_type)
            .with_principal(s(&acl.principal))
            .with_host(s(&acl.host))
            .with_operation(c.operation)
            .with_permission_type(c.permission)]),
    )
    .await?;
    let result = answer.results.into_iter().next().unwrap_or_default();
    tracing::info!(?acl, code = result.error_code, "console: ACL created");
    outcome(
        result.error_code,
        result.error_message.as_ref(),
        serde_json::json!({ "created": acl }),
    )
}

/// POST `users` (set a user's password for a mechanism) and `users/delete`.
pub async fn write_user(
    broker: &Arc<Broker>,
    authz: &Authz<'_>,
    bytes: &[u8],
    delete: bool,
) -> Result<Reply, Reply> {
    need_cluster(authz, Op::Alter)?;
    let change: UserChange = serde_json::from_slice(bytes)
        .map_err(|e| Reply::error("400 Bad Request", &format!("request body: {e}")))?;
    let mechanism = ScramMechanism::from_name(&change.mechanism).ok_or_else(|| {
        Reply::error(
            "400 Bad Request",
            &format!(
                "unknown mechanism {} (SCRAM-SHA-256 or SCRAM-SHA-512)",
                change.mechanism
            ),
        )
    })?;
    let name = StrBytes::from_string(change.name.clone());
    let request = if delete {
        AlterUserScramCredentialsRequest::default().with_deletions(vec![
            ScramCredentialDeletion::default()
                .with_name(name)
                .with_mechanism(mechanism.kafka_type()),
        ])
    } else {
        let password = change
            .password
            .filter(|p| !p.is_empty())
            .ok_or_else(|| Reply::error("400 Bad Request", "a password is required"))?;
        let salt: [u8; 32] = rand::random();
        let salted = mechanism.salted_password(password.as_bytes(), &salt, ITERATIONS as u32);
        AlterUserScramCredentialsRequest::default().with_upsertions(vec![
            ScramCredentialUpsertion::default()
                .with_name(name)
                .with_mechanism(mechanism.kafka_type())
                .with_iterations(ITERATIONS)
                .with_salt(salt.to_vec().into())
                .with_salted_password(salted.into()),
        ])
    };
    let answer = ask_self(broker, 0, &request).await?;
    let result = answer.results.into_iter().next().unwrap_or_default();
    tracing::info!(user = %change.name, mechanism = mechanism.name(), delete, code = result.error_code, "console: SCRAM user changed");
    outcome(
        result.error_code,
        result.error_message.as_ref(),
        serde_json::json!({ "user": change.name, "mechanism": mechanism.name(), "deleted": delete }),
    )
}
