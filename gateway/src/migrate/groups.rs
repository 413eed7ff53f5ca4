//! Consumer groups' committed offsets: read from the source (ListGroups on
//! every broker, FindCoordinator, OffsetFetch) and committed on the target
//! (OffsetCommit as a simple, memberless commit: generation -1), with their
//! metadata. The leader epoch is not carried: the two clusters' epochs are
//! unrelated, and -1 tells a client to skip epoch validation.

use std::collections::{BTreeSet, HashMap};

use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
use kafka_protocol::messages::{
    FindCoordinatorRequest, GroupId, ListGroupsRequest, OffsetCommitRequest, OffsetFetchRequest,
    TopicName,
};
use kafka_protocol::protocol::StrBytes;
use regex::Regex;

use super::client::{ClusterView, Conn};
use super::plan::{Committed, GroupOffsets};
use crate::error::MigrateError;

/// The ids of the source's groups that `pattern` matches.
pub async fn list(view: &ClusterView, pattern: &Regex) -> Result<Vec<String>, MigrateError> {
    let mut ids = BTreeSet::new();
    for addr in view.brokers.values() {
        let mut conn = view.connect(addr).await?;
        let response = conn.call(&ListGroupsRequest::default()).await?;
        if response.error_code != 0 {
            return Err(conn.broker_error("ListGroups", response.error_code, None));
        }
        for g in response.groups {
            let id = g.group_id.0.to_string();
            if pattern.is_match(&id) {
                ids.insert(id);
            }
        }
    }
    Ok(ids.into_iter().collect())
}

/// A connection to `group`'s coordinator in the cluster `bootstrap` reaches.
pub async fn coordinator(bootstrap: &mut Conn, group: &str) -> Result<Conn, MigrateError> {
    let mut last = None;
    for _ in 0..20 {
        let request = FindCoordinatorRequest::default()
            .with_key(StrBytes::from_string(group.to_string()))
            .with_key_type(0);
        let response = bootstrap.call(&request).await?;
        if response.error_code == 0 {
            return bootstrap
                .open(&format!("{}:{}", response.host, response.port))
                .await;
        }
        last = Some(bootstrap.broker_error(
            &format!("FindCoordinator {group}"),
            response.error_code,
            response.error_message.as_ref(),
        ));
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    Err(last.expect("at least one attempt"))
}

/// Every committed offset of `group` on the partitions of `topics`.
pub async fn fetch_offsets(
    coordinator: &mut Conn,
    group: &str,
    topics: &HashMap<String, usize>,
) -> Result<GroupOffsets, MigrateError> {
    let mut names: Vec<&String> = topics.keys().collect();
    names.sort();
    let request = OffsetFetchRequest::default()
        .with_group_id(GroupId(StrBytes::from_string(group.to_string())))
        .with_topics(Some(
            names
                .into_iter()
                .map(|t| {
                    OffsetFetchRequestTopic::default()
                        .with_name(TopicName(StrBytes::from_string(t.clone())))
                        .with_partition_indexes((0..topics[t] as i32).collect())
                })
                .collect(),
        ));
    let response = coordinator.call(&request).await?;
    if response.error_code != 0 {
        return Err(coordinator.broker_error(
            &format!("OffsetFetch {group}"),
            response.error_code,
            None,
        ));
    }
    let mut out = GroupOffsets::new();
    for t in &response.topics {
        let name = t.name.0.to_string();
        let Some(&count) = topics.get(&name) else {
            continue;
        };
        for p in &t.partitions {
            if p.error_code != 0 || p.committed_offset < 0 || p.partition_index as usize >= count {
                continue;
            }
            out.insert(
                (name.clone(), p.partition_index),
                Committed {
                    offset: p.committed_offset,
                    metadata: p.metadata.as_ref().map(|m| m.to_string()),
                },
            );
        }
    }
    Ok(out)
}

/// Commits `offsets` for `group` on the target coordinator.
pub async fn commit(
    coordinator: &mut Conn,
    group: &str,
    offsets: &GroupOffsets,
) -> Result<(), MigrateError> {
    if offsets.is_empty() {
        return Ok(());
    }
    let mut topics: Vec<OffsetCommitRequestTopic> = Vec::new();
    for ((topic, partition), c) in offsets {
        let partition = OffsetCommitRequestPartition::default()
            .with_partition_index(*partition)
            .with_committed_offset(c.offset)
            .with_committed_leader_epoch(-1)
            .with_committed_metadata(c.metadata.clone().map(StrBytes::from_string));
        match topics.last_mut() {
            Some(t) if t.name.0.as_str() == topic => t.partitions.push(partition),
            _ => topics.push(
                OffsetCommitRequestTopic::default()
                    .with_name(TopicName(StrBytes::from_string(topic.clone())))
                    .with_partitions(vec![partition]),
            ),
        }
    }
    let request = OffsetCommitRequest::default()
        .with_group_id(GroupId(StrBytes::from_string(group.to_string())))
        .with_generation_id_or_member_epoch(-1)
        .with_member_id(StrBytes::from_static_str(""))
        .with_retention_time_ms(-1)
        .with_topics(topics);
    let response = coordinator.call(&request).await?;
    for t in &response.topics {
        for p in &t.partitions {
            if p.error_code != 0 {
                return Err(coordinator.broker_error(
                    &format!("OffsetCommit {group} {}-{}", t.name.0, p.partition_index),
                    p.error_code,
                    None,
                ));
            }
        }
    }
    Ok(())
}
