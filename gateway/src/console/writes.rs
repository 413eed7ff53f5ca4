//! The console's writes (POST `/api/v1/...` with a JSON body): topics
//! created, deleted, grown and configured through the broker's own admin
//! paths (Kafka's validation and error messages), a group's offsets reset
//! and a group deleted through its coordinator. Each is allowed only as
//! the Kafka API doing the same would be for the caller's principal, never
//! under `console.read.only`, and only with the session's CSRF token
//! (`mod.rs` checks it).

use std::collections::BTreeMap;
use std::sync::Arc;

use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::{DeleteGroupsRequest, GroupId, OffsetCommitRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use serde::Deserialize;

use super::api::{ask, leaders, list_offsets};
use super::groups::coordinator_of;
use super::Reply;
use crate::alter_config::ConfigChange;
use crate::alter_config::RESOURCE_TOPIC;
use crate::authz::{Authz, Op, Resource};
use crate::broker::{Broker, NewTopic};
use crate::error::ApiError;

const OFFSET_COMMIT_VERSION: i16 = 8;
const DELETE_GROUPS_VERSION: i16 = 2;
/// IncrementalAlterConfigs' operations.
const SET: i8 = 0;
const DELETE: i8 = 1;

#[derive(Deserialize)]
struct CreateTopic {
    name: String,
    /// Defaults to `num.partitions`.
    partitions: Option<u32>,
    /// Defaults to `default.replication.factor`.
    replication_factor: Option<i16>,
    #[serde(default)]
    configs: BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct AddPartitions {
    /// The new total, as CreatePartitions takes it.
    count: u32,
}

#[derive(Deserialize)]
struct AlterConfigs {
    #[serde(default)]
    set: BTreeMap<String, String>,
    #[serde(default)]
    delete: Vec<String>,
}

#[derive(Deserialize)]
struct Split {
    /// The first partition of the right child (default: the middle).
    at: Option<u32>,
}

#[derive(Deserialize)]
struct Merge {
    left: u64,
    right: u64,
}

#[derive(Deserialize)]
struct ResetOffsets {
    topic: String,
    /// `earliest`, `latest`, `timestamp` (ms in `value`) or `offset` (`value`).
    to: String,
    value: Option<i64>,
}

/// A Kafka error as the console answers it: the message Kafka clients get.
fn refused(e: &ApiError) -> Reply {
    Reply::kafka(&e.message().unwrap_or_else(|| e.to_string()), e.code())
}

fn body<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Result<T, Reply> {
    serde_json::from_slice(bytes)
        .map_err(|e| Reply::error("400 Bad Request", &format!("request body: {e}")))
}

fn forbidden(what: &str) -> Reply {
    Reply::error("403 Forbidden", &format!("not allowed to {what}"))
}

/// Answers one write of `authz`'s principal.
pub async fn handle(
    broker: &Arc<Broker>,
    authz: &Authz<'_>,
    segments: &[&str],
    bytes: &[u8],
) -> Result<Reply, Reply> {
    match segments {
        ["topics"] => create_topic(broker, authz, body(bytes)?).await,
        ["topics", name, "delete"] => delete_topic(broker, authz, name).await,
        ["topics", name, "partitions"] => add_partitions(broker, authz, name, body(bytes)?).await,
        ["topics", name, "configs"] => alter_configs(broker, authz, name, body(bytes)?).await,
        ["groups", group, "offsets"] => reset_offsets(broker, authz, group, body(bytes)?).await,
        ["groups", group, "delete"] => delete_group(broker, authz, group).await,
        ["ranges", id, "split"] => split(broker, authz, id, body(bytes)?).await,
        ["ranges", "merge"] => merge(broker, authz, body(bytes)?).await,
        ["acls"] => super::security::write_acl(broker, authz, body(bytes)?, false).await,
        ["acls", "delete"] => super::security::write_acl(broker, authz, body(bytes)?, true).await,
        ["quotas"] => super::security::write_quota(broker, authz, body(bytes)?, false).await,
        ["quotas", "delete"] => {
            super::security::write_quota(broker, authz, body(bytes)?, true).await
        }
        ["users"] => super::security::write_user(broker, authz, bytes, false).await,
        ["users", "delete"] => super::security::write_user(broker, authz, bytes, true).await,
        _ => Err(Reply::error("404 Not Found", "no such console write")),
    }
}

async fn create_topic(
    broker: &Arc<Broker>,
    authz: &Authz<'_>,
    t: CreateTopic,
) -> Result<Reply, Reply> {
    if !authz.may_create_topic(&t.name) {
        return Err(forbidden(&format!("create topic {}", t.name)));
    }
    let config = broker.config();
    let partitions = t.partitions.unwrap_or(config.num_partitions);
    if partitions == 0 {
        return Err(refused(&ApiError::InvalidPartitions(
            "number of partitions must be larger than 0".into(),
        )));
    }
    let created = broker
        .create_topic(
            NewTopic {
                name: t.name,
                partitions,
                replication_factor: t
                    .replication_factor
                    .unwrap_or(config.default_replication_factor),
                configs: t.configs,
            },
            false,
        )
        .await
        .map_err(|e| refused(&e))?;
    tracing::info!(topic = %created.name, partitions = created.partitions, "console: topic created");
    Ok(Reply::json(&serde_json::json!({
        "name": created.name,
        "partitions": created.partitions,
        "replication_factor": created.replication_factor,
    })))
}

/// The topic's id, if the caller may describe it and do `op` on it.
fn topic_for(broker: &Broker, authz: &Authz<'_>, name: &str, op: Op) -> Result<uuid::Uuid, Reply> {
    super::api::topic_for(broker, authz, name, op).map(|t| t.id)
}

async fn delete_topic(broker: &Arc<Broker>, authz: &Authz<'_>, name: &str) -> Result<Reply, Reply> {
    let id = topic_for(broker, authz, name, Op::Delete)?;
    if crate::internal_topics::is_internal(name) {
        return Err(refused(&ApiError::InvalidRequest(format!(
            "{name} is internal: deleting it would lose every group's or transaction's state"
        ))));
    }
    broker.delete_topic(id).await.map_err(|e| refused(&e))?;
    tracing::info!(topic = name, "console: topic deleted");
    Ok(Reply::json(&serde_json::json!({ "deleted": name })))
}

async fn add_partitions(
    broker: &Arc<Broker>,
    authz: &Authz<'_>,
    name: &str,
    p: AddPartitions,
) -> Result<Reply, Reply> {
    topic_for(broker, authz, name, Op::Alter)?;
    broker
        .create_partitions(name, p.count, None, false)
        .await
        .map_err(|e| refused(&e))?;
    tracing::info!(topic = name, count = p.count, "console: partitions added");
    Ok(Reply::json(&serde_json::json!({ "partitions": p.count })))
}

async fn alter_configs(
    broker: &Arc<Broker>,
    authz: &Authz<'_>,
    name: &str,
    c: AlterConfigs,
) -> Result<Reply, Reply> {
    topic_for(broker, authz, name, Op::AlterConfigs)?;
    let mut ops: Vec<(String, i8, Option<String>)> =
        c.set.into_iter().map(|(k, v)| (k, SET, Some(v))).collect();
    ops.extend(c.delete.into_iter().map(|k| (k, DELETE, None)));
    broker
        .alter_configs(RESOURCE_TOPIC, name, &ConfigChange::Incremental(ops), false)
        .await
        .map_err(|e| refused(&e))?;
    tracing::info!(topic = name, "console: topic configs altered");
    Ok(Reply::json(&serde_json::json!({ "altered": name })))
}

/// Range moves need what the admin port's ranges API needs: ALTER on
/// the cluster.
fn may_move_ranges(authz: &Authz<'_>) -> Result<(), Reply> {
    if authz.allows_cluster(Op::Alter) {
        Ok(())
    } else {
        Err(forbidden("ALTER the cluster (split and merge ranges)"))
    }
}

/// A move refused where it was asked: said with the broker to ask instead
/// when another one leads the range.
fn move_refused(broker: &Broker, range: u64, e: &ApiError) -> Reply {
    let primary = broker
        .image()
        .active_segment(range)
        .and_then(|s| s.primary())
        .filter(|p| *p != broker.config().node_id);
    let message = e.message().unwrap_or_else(|| e.to_string());
    let message = match primary {
        Some(p) => format!("{message} (range {range} is led by broker {p}: ask its console)"),
        None => message,
    };
    Reply::error("409 Conflict", &message)
}

async fn split(
    broker: &Arc<Broker>,
    authz: &Authz<'_>,
    id: &str,
    s: Split,
) -> Result<Reply, Reply> {
    may_move_ranges(authz)?;
    let range: u64 = id
        .parse()
        .map_err(|_| Reply::error("400 Bad Request", "range: not a number"))?;
    let (left, right) = broker
        .split_range(range, s.at)
        .await
        .map_err(|e| move_refused(broker, range, &e))?;
    tracing::info!(range, left, right, "console: range split");
    Ok(Reply::json(
        &serde_json::json!({ "children": [left, right] }),
    ))
}

async fn merge(broker: &Arc<Broker>, authz: &Authz<'_>, m: Merge) -> Result<Reply, Reply> {
    may_move_ranges(authz)?;
    let child = broker
        .merge_ranges(m.left, m.right)
        .await
        .map_err(|e| move_refused(broker, m.left, &e))?;
    tracing::info!(
        left = m.left,
        right = m.right,
        child,
        "console: ranges merged"
    );
    Ok(Reply::json(&serde_json::json!({ "child": child })))
}

/// Commits new offsets for every partition of `topic` in an empty group,
/// as `kafka-consumer-groups --reset-offsets` does (OffsetCommit with no
/// member: the coordinator refuses it while the group has members).
async fn reset_offsets(
    broker: &Arc<Broker>,
    authz: &Authz<'_>,
    group: &str,
    r: ResetOffsets,
) -> Result<Reply, Reply> {
    super::groups::visible(authz, group)?;
    if !authz.allows(Op::Read, Resource::Group, group) {
        return Err(forbidden(&format!("READ group {group}")));
    }
    topic_for(broker, authz, &r.topic, Op::Read)?;
    let timestamp = match (r.to.as_str(), r.value) {
        ("earliest", _) => Some(-2),
        ("latest", _) => Some(-1),
        ("timestamp", Some(ms)) => Some(ms),
        ("offset", Some(_)) => None,
        _ => {
            return Err(Reply::error(
                "400 Bad Request",
                "to: earliest, latest, timestamp (with value) or offset (with value)",
            ))
        }
    };
    let image = broker.image();
    let topic = image
        .topic_by_name(&r.topic)
        .ok_or_else(|| Reply::error("404 Not Found", "unknown topic"))?;
    let mut targets: BTreeMap<i32, i64> = BTreeMap::new();
    for (leader, partitions) in leaders(&image, topic) {
        match timestamp {
            Some(ts) => {
                let found = list_offsets(broker, leader, &r.topic, &partitions, ts).await;
                // No record at or after the time: the log end, as Kafka's tool does.
                let ends = list_offsets(broker, leader, &r.topic, &partitions, -1).await;
                for p in partitions {
                    if let Some(o) = found.get(&p).or(ends.get(&p)) {
                        targets.insert(p, *o);
                    }
                }
            }
            None => targets.extend(partitions.into_iter().map(|p| (p, r.value.unwrap_or(0)))),
        }
    }
    if targets.len() != topic.partitions as usize {
        return Err(Reply::error(
            "503 Service Unavailable",
            "some partitions have no leader to ask; nothing was reset",
        ));
    }
    let coordinator = coordinator_of(broker, group).await?;
    let request = OffsetCommitRequest::default()
        .with_group_id(GroupId(StrBytes::from_string(group.to_string())))
        .with_generation_id_or_member_epoch(-1)
        .with_member_id(StrBytes::from_static_str(""))
        .with_retention_time_ms(-1)
        .with_topics(vec![OffsetCommitRequestTopic::default()
            .with_name(TopicName(StrBytes::from_string(r.topic.clone())))
            .with_partitions(
                targets
                    .iter()
                    .map(|(p, o)| {
                        OffsetCommitRequestPartition::default()
                            .with_partition_index(*p)
                            .with_committed_offset(*o)
                            .with_committed_leader_epoch(-1)
                    })
                    .collect(),
            )]);
    let answer = ask(broker, &coordinator, OFFSET_COMMIT_VERSION, &request).await?;
    let errors: Vec<i16> = answer
        .topics
        .iter()
        .flat_map(|t| &t.partitions)
        .map(|p| p.error_code)
        .filter(|c| *c != 0)
        .collect();
    if let Some(code) = errors.first() {
        let message = match kafka_protocol::ResponseError::try_from_code(*code) {
            Some(kafka_protocol::ResponseError::UnknownMemberId)
            | Some(kafka_protocol::ResponseError::IllegalGeneration)
            | Some(kafka_protocol::ResponseError::RebalanceInProgress) => format!(
                "group {group} has active members: offsets can be reset only while it is empty"
            ),
            other => format!("the coordinator refused the commit: {other:?} ({code})"),
        };
        return Err(Reply::error("409 Conflict", &message));
    }
    tracing::info!(group, topic = %r.topic, to = %r.to, "console: group offsets reset");
    Ok(Reply::json(&serde_json::json!({ "offsets": targets })))
}

async fn delete_group(
    broker: &Arc<Broker>,
    authz: &Authz<'_>,
    group: &str,
) -> Result<Reply, Reply> {
    super::groups::visible(authz, group)?;
    if !authz.allows(Op::Delete, Resource::Group, group) {
        return Err(forbidden(&format!("DELETE group {group}")));
    }
    let coordinator = coordinator_of(broker, group).await?;
    let answer = ask(
        broker,
        &coordinator,
        DELETE_GROUPS_VERSION,
        &DeleteGroupsRequest::default()
            .with_groups_names(vec![GroupId(StrBytes::from_string(group.to_string()))]),
    )
    .await?;
    match answer.results.first().map(|r| r.error_code) {
        Some(0) => {
            tracing::info!(group, "console: group deleted");
            Ok(Reply::json(&serde_json::json!({ "deleted": group })))
        }
        Some(code) => Err(Reply::error(
            "409 Conflict",
            &match kafka_protocol::ResponseError::try_from_code(code) {
                Some(kafka_protocol::ResponseError::NonEmptyGroup) => {
                    format!("group {group} has active members: it can be deleted only while it is empty")
                }
                Some(kafka_protocol::ResponseError::GroupIdNotFound) => {
                    format!("unknown group {group}")
                }
                other => format!("the coordinator refused: {other:?} ({code})"),
            },
        )),
        None => Err(Reply::error(
            "502 Bad Gateway",
            "DeleteGroups answered nothing",
        )),
    }
}
