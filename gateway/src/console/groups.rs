//! The console's consumer groups: listed from every broker's coordinator,
//! described by the group's coordinator, with each committed partition's
//! lag behind its leader's log end. All of it through the Kafka APIs a
//! Kafka tool would call (ListGroups, FindCoordinator, DescribeGroups,
//! OffsetFetch, ListOffsets), sent over the broker's own client.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Buf;
use kafka_protocol::messages::{
    ConsumerProtocolAssignment, DescribeGroupsRequest, FindCoordinatorRequest, GroupId,
    ListGroupsRequest, OffsetFetchRequest,
};
use kafka_protocol::protocol::{Decodable, StrBytes};
use serde::Serialize;

use super::api::{ask, leaders, list_offsets, Node};
use super::Reply;
use crate::authz::{Authz, Op, Resource};
use crate::broker::Broker;

const LIST_GROUPS_VERSION: i16 = 4;
const FIND_COORDINATOR_VERSION: i16 = 3;
const DESCRIBE_GROUPS_VERSION: i16 = 5;
const OFFSET_FETCH_VERSION: i16 = 7;

#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct GroupRow {
    pub group_id: String,
    pub state: String,
    pub protocol_type: String,
    pub coordinator: i32,
}

#[derive(Serialize, Debug)]
pub struct MemberRow {
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    /// Topic and partitions, decoded from the consumer protocol.
    pub assignment: Vec<(String, Vec<i32>)>,
}

#[derive(Serialize, Debug, PartialEq)]
pub struct OffsetRow {
    pub topic: String,
    pub partition: i32,
    pub committed: i64,
    pub log_end: Option<i64>,
    /// `log_end - committed`, never below 0; `None` without a log end.
    pub lag: Option<i64>,
}

#[derive(Serialize)]
struct GroupPage {
    group_id: String,
    state: String,
    protocol_type: String,
    protocol: String,
    coordinator: i32,
    members: Vec<MemberRow>,
    offsets: Vec<OffsetRow>,
    total_lag: i64,
}

/// Every group the caller may describe, from every live broker.
pub async fn list(broker: &Arc<Broker>, authz: &Authz<'_>) -> Reply {
    let image = broker.image();
    let mut asks = tokio::task::JoinSet::new();
    for b in image.brokers.values().filter(|b| !b.fenced) {
        let broker = broker.clone();
        let id = b.registration.broker_id;
        asks.spawn(async move {
            let answer = match Node::of(&broker, id) {
                Ok(node) => {
                    ask(
                        &broker,
                        &node,
                        LIST_GROUPS_VERSION,
                        &ListGroupsRequest::default(),
                    )
                    .await
                }
                Err(e) => Err(e),
            };
            match answer {
                Ok(r) => r
                    .groups
                    .into_iter()
                    .map(|g| GroupRow {
                        group_id: g.group_id.to_string(),
                        state: g.group_state.to_string(),
                        protocol_type: g.protocol_type.to_string(),
                        coordinator: id,
                    })
                    .collect(),
                Err(e) => {
                    tracing::debug!(broker = id, error = %e.body, "console: ListGroups failed");
                    Vec::new()
                }
            }
        });
    }
    let mut rows: Vec<GroupRow> = Vec::new();
    while let Some(done) = asks.join_next().await {
        rows.extend(done.unwrap_or_default());
    }
    rows.retain(|g| authz.may(Op::Describe, Resource::Group, &g.group_id));
    rows.sort_by(|a, b| a.group_id.cmp(&b.group_id));
    Reply::json(&rows)
}

/// The partitions a classic consumer member was assigned (the consumer
/// protocol's bytes: a version, then the assignment).
pub fn decode_assignment(bytes: &[u8]) -> Vec<(String, Vec<i32>)> {
    let mut buf = bytes;
    if buf.len() < 2 {
        return Vec::new();
    }
    let version = buf.get_i16().clamp(0, 3);
    match ConsumerProtocolAssignment::decode(&mut buf, version) {
        Ok(a) => a
            .assigned_partitions
            .into_iter()
            .map(|tp| (tp.topic.to_string(), tp.partitions))
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// Whether the caller may describe `group`: one who may not is answered
/// as about an unknown group (Kafka does not tell them apart either).
pub(super) fn visible(authz: &Authz<'_>, group: &str) -> Result<(), Reply> {
    if authz.may(Op::Describe, Resource::Group, group) {
        Ok(())
    } else {
        Err(Reply::error(
            "404 Not Found",
            &format!("unknown group {group}"),
        ))
    }
}

/// The coordinator of `group`, by FindCoordinator to this node.
pub(super) async fn coordinator_of(broker: &Broker, group: &str) -> Result<Node, Reply> {
    let found = ask(
        broker,
        &Node::this(broker)?,
        FIND_COORDINATOR_VERSION,
        &FindCoordinatorRequest::default()
            .with_key(StrBytes::from_string(group.to_string()))
            .with_key_type(0),
    )
    .await?;
    if found.error_code != 0 {
        return Err(Reply::error(
            "503 Service Unavailable",
            &format!(
                "no coordinator for {group} now (error {})",
                found.error_code
            ),
        ));
    }
    Ok(Node {
        id: found.node_id.0,
        host: found.host.to_string(),
        port: u16::try_from(found.port).unwrap_or(0),
    })
}

/// A group's page: members and their assignments, committed offsets and lag.
pub async fn describe(
    broker: &Arc<Broker>,
    authz: &Authz<'_>,
    group: &str,
) -> Result<Reply, Reply> {
    visible(authz, group)?;
    let image = broker.image();
    let found = coordinator_of(broker, group).await?;
    let described = ask(
        broker,
        &found,
        DESCRIBE_GROUPS_VERSION,
        &DescribeGroupsRequest::default()
            .with_groups(vec![GroupId(StrBytes::from_string(group.to_string()))]),
    )
    .await?;
    let Some(g) = described.groups.into_iter().next() else {
        return Err(Reply::error(
            "502 Bad Gateway",
            "DescribeGroups answered no group",
        ));
    };
    let fetched = ask(
        broker,
        &found,
        OFFSET_FETCH_VERSION,
        &OffsetFetchRequest::default()
            .with_group_id(GroupId(StrBytes::from_string(group.to_string())))
            .with_topics(None),
    )
    .await?;
    let mut committed: BTreeMap<String, Vec<(i32, i64)>> = BTreeMap::new();
    for t in fetched.topics {
        let name = t.name.to_string();
        if !authz.may(Op::Describe, Resource::Topic, &name) {
            continue;
        }
        for p in t.partitions {
            if p.error_code == 0 && p.committed_offset >= 0 {
                committed
                    .entry(name.clone())
                    .or_default()
                    .push((p.partition_index, p.committed_offset));
            }
        }
    }
    // Kafka describes a group it does not know as Dead, with no error (its
    // tools then say the group does not exist).
    let dead = g.error_code != 0 || g.group_state.as_str() == "Dead";
    if dead && committed.is_empty() {
        return Err(Reply::error(
            "404 Not Found",
            &format!("unknown group {group}"),
        ));
    }
    let mut offsets = Vec::new();
    for (topic, partitions) in committed {
        let ends = match image.topic_by_name(&topic) {
            Some(t) => {
                let mut ends = BTreeMap::new();
                for (leader, led) in leaders(&image, t) {
                    let wanted: Vec<i32> = led
                        .into_iter()
                        .filter(|p| partitions.iter().any(|(q, _)| q == p))
                        .collect();
                    if !wanted.is_empty() {
                        ends.extend(list_offsets(broker, leader, &topic, &wanted, -1).await);
                    }
                }
                ends
            }
            None => BTreeMap::new(),
        };
        for (partition, offset) in partitions {
            let log_end = ends.get(&partition).copied();
            offsets.push(OffsetRow {
                topic: topic.clone(),
                partition,
                committed: offset,
                log_end,
                lag: log_end.map(|e| (e - offset).max(0)),
            });
        }
    }
    let total_lag = offsets.iter().filter_map(|o| o.lag).sum();
    let consumer = g.protocol_type.as_str() == "consumer";
    Ok(Reply::json(&GroupPage {
        group_id: group.to_string(),
        state: g.group_state.to_string(),
        protocol_type: g.protocol_type.to_string(),
        protocol: g.protocol_data.to_string(),
        coordinator: found.id,
        members: g
            .members
            .into_iter()
            .map(|m| MemberRow {
                member_id: m.member_id.to_string(),
                group_instance_id: m.group_instance_id.map(|s| s.to_string()),
                client_id: m.client_id.to_string(),
                client_host: m.client_host.to_string(),
                assignment: if consumer {
                    decode_assignment(&m.member_assignment)
                } else {
                    Vec::new()
                },
            })
            .collect(),
        offsets,
        total_lag,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BufMut;
    use kafka_protocol::messages::consumer_protocol_assignment::TopicPartition;
    use kafka_protocol::messages::TopicName;
    use kafka_protocol::protocol::Encodable;

    #[test]
    fn a_consumer_assignment_decodes_and_garbage_decodes_to_nothing() {
        let assignment = ConsumerProtocolAssignment::default().with_assigned_partitions(vec![
            TopicPartition::default()
                .with_topic(TopicName(StrBytes::from_static_str("orders")))
                .with_partitions(vec![0, 2]),
        ]);
        let mut buf = bytes::BytesMut::new();
        buf.put_i16(1);
        assignment.encode(&mut buf, 1).unwrap();
        assert_eq!(
            decode_assignment(&buf),
            vec![("orders".to_string(), vec![0, 2])]
        );
        assert!(decode_assignment(&[]).is_empty());
        assert!(decode_assignment(&[0, 1, 0xff, 0xff, 0xff, 0x7f]).is_empty());
    }
}
