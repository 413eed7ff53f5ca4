//! OffsetFetch: committed offsets of one group (v1–v7) or several (v8+).
//! A partition without a committed offset answers -1 with no error, as
//! Kafka does; `topics` null means every committed offset of the group.
//! With `require_stable` (v7+) a partition whose offset a still-open
//! transaction has committed answers UNSTABLE_OFFSET_COMMIT (retriable), as
//! Kafka does, so an exactly-once consumer never starts from a stale offset.

use std::sync::Arc;

use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions,
    OffsetFetchResponseTopic, OffsetFetchResponseTopics,
};
use kafka_protocol::messages::{GroupId, OffsetFetchRequest, OffsetFetchResponse, TopicName};
use kafka_protocol::protocol::StrBytes;

use crate::authz::{Authz, Op, Resource};
use crate::broker::Broker;
use crate::error::ApiError;
use crate::groups::offsets::FetchedOffsets;
use crate::request_context::RequestContext;

pub async fn handle(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    request: OffsetFetchRequest,
) -> OffsetFetchResponse {
    let version = ctx.version();
    // Kafka: DESCRIBE on the group, and on each topic (a topic asked for
    // answers TOPIC_AUTHORIZATION_FAILED, one not asked for is left out).
    let authz = Authz::of(broker, ctx);
    if version >= 8 {
        let mut groups = Vec::with_capacity(request.groups.len());
        for g in request.groups {
            if let Err(e) = authz.group(Op::Describe, &g.group_id) {
                groups.push(
                    OffsetFetchResponseGroup::default()
                        .with_group_id(g.group_id)
                        .with_error_code(e.code()),
                );
                continue;
            }
            let explicit = g.topics.is_some();
            let topics = g.topics.map(|ts| {
                ts.into_iter()
                    .map(|t| (t.name.to_string(), t.partition_indexes))
                    .collect()
            });
            let member = g.member_id.as_ref().map(|m| (m.as_str(), g.member_epoch));
            let fetched = broker
                .groups()
                .fetch_offsets(&**broker, &g.group_id, member, topics)
                .await;
            let mut group = group_response(broker, g.group_id, fetched, request.require_stable);
            group.topics.retain_mut(|t| {
                if authz.may(Op::Describe, Resource::Topic, &t.name) {
                    return true;
                }
                for p in &mut t.partitions {
                    p.error_code = ApiError::TopicAuthorizationFailed.code();
                    p.committed_offset = -1;
                    p.metadata = None;
                }
                explicit
            });
            groups.push(group);
        }
        return OffsetFetchResponse::default().with_groups(groups);
    }
    let topics: Option<Vec<(String, Vec<i32>)>> = request.topics.map(|ts| {
        ts.into_iter()
            .map(|t| (t.name.to_string(), t.partition_indexes))
            .collect()
    });
    let explicit = topics.is_some();
    let fetched = match authz.group(Op::Describe, &request.group_id) {
        Err(e) => Err(e),
        Ok(()) => {
            broker
                .groups()
                .fetch_offsets(&**broker, &request.group_id, None, topics.clone())
                .await
        }
    };
    let (fetched, error) = match fetched {
        Ok(f) => (f, None),
        // Before v2 there is no group-level error: every partition carries it.
        Err(e) => (
            topics
                .unwrap_or_default()
                .into_iter()
                .map(|(t, ps)| (t, ps.into_iter().map(|p| (p, None)).collect()))
                .collect(),
            Some(e),
        ),
    };
    let group_id = request.group_id.to_string();
    let require_stable = request.require_stable;
    let partition_error = if version < 2 {
        error.as_ref().map_or(0, ApiError::code)
    } else {
        0
    };
    let mut response = OffsetFetchResponse::default().with_topics(
        fetched
            .into_iter()
            .map(|(name, partitions)| {
                OffsetFetchResponseTopic::default()
                    .with_name(TopicName(StrBytes::from_string(name.clone())))
                    .with_partitions(
                        partitions
                            .into_iter()
                            .map(|(p, o)| {
                                let mut r = OffsetFetchResponsePartition::default()
                                    .with_partition_index(p)
                                    .with_error_code(partition_error);
                                if require_stable && unstable(broker, &group_id, &name, p) {
                                    return r
                                        .with_error_code(UNSTABLE_OFFSET_COMMIT)
                                        .with_committed_offset(-1);
                                }
                                match o {
                                    Some(o) => {
                                        r = r
                                            .with_committed_offset(o.offset)
                                            .with_metadata(Some(StrBytes::from_string(o.metadata)));
                                        if version >= 5 {
                                            r = r.with_committed_leader_epoch(o.leader_epoch);
                                        }
                                    }
                                    None => r = r.with_committed_offset(-1),
                                }
                                r
                            })
                            .collect(),
                    )
            })
            .collect(),
    );
    response.topics.retain_mut(|t| {
        if authz.may(Op::Describe, Resource::Topic, &t.name) {
            return true;
        }
        for p in &mut t.partitions {
            p.error_code = ApiError::TopicAuthorizationFailed.code();
            p.committed_offset = -1;
            p.metadata = None;
        }
        explicit
    });
    if version >= 2 {
        response.with_error_code(error.map_or(0, |e| e.code()))
    } else {
        response
    }
}

/// Kafka's UNSTABLE_OFFSET_COMMIT.
const UNSTABLE_OFFSET_COMMIT: i16 = 88;

/// Whether an open transaction holds a pending offset for this partition.
fn unstable(broker: &Broker, group: &str, topic: &str, partition: i32) -> bool {
    broker
        .groups()
        .has_pending_txn_offset(group, topic, partition)
}

fn group_response(
    broker: &Broker,
    group_id: GroupId,
    fetched: Result<FetchedOffsets, ApiError>,
    require_stable: bool,
) -> OffsetFetchResponseGroup {
    let group_name = group_id.to_string();
    let group = OffsetFetchResponseGroup::default().with_group_id(group_id);
    let fetched = match fetched {
        Ok(f) => f,
        // A group-level error lists no partitions.
        Err(e) => return group.with_error_code(e.code()),
    };
    group.with_topics(
        fetched
            .into_iter()
            .map(|(name, partitions)| {
                OffsetFetchResponseTopics::default()
                    .with_name(TopicName(StrBytes::from_string(name.clone())))
                    .with_partitions(
                        partitions
                            .into_iter()
                            .map(|(p, o)| {
                                let r = OffsetFetchResponsePartitions::default()
                                    .with_partition_index(p);
                                if require_stable && unstable(broker, &group_name, &name, p) {
                                    return r
                                        .with_error_code(UNSTABLE_OFFSET_COMMIT)
                                        .with_committed_offset(-1);
                                }
                                match o {
                                    Some(o) => r
                                        .with_committed_offset(o.offset)
                                        .with_committed_leader_epoch(o.leader_epoch)
                                        .with_metadata(Some(StrBytes::from_string(o.metadata))),
                                    None => r.with_committed_offset(-1),
                                }
                            })
                            .collect(),
                    )
            })
            .collect(),
    )
}
