//! OffsetCommit: fenced by the group (generation and member id for classic
//! members; generation -1 with no member id only while the group is empty),
//! persisted to `__consumer_offsets` before it is acknowledged.

use std::sync::Arc;

use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::{OffsetCommitRequest, OffsetCommitResponse};

use crate::authz::{Authz, Op};
use crate::broker::Broker;
use crate::error::ApiError;
use crate::groups::offsets::{CommitRequest, PartitionCommit};
use crate::request_context::RequestContext;

pub async fn handle(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    request: OffsetCommitRequest,
) -> OffsetCommitResponse {
    let version = ctx.version();
    // Kafka: READ on the group (every partition fails), then READ on each
    // topic (its partitions fail, the others are committed).
    let authz = Authz::of(broker, ctx);
    let group_denied = authz.group(Op::Read, &request.group_id).err();
    let mut request = request;
    let mut refused: Vec<(usize, ApiError)> = Vec::new();
    for (i, t) in request.topics.iter().enumerate() {
        let denied = match &group_denied {
            Some(e) => Some(e.clone()),
            None => authz.topic(Op::Read, &t.name).err(),
        };
        if let Some(e) = denied {
            refused.push((i, e));
        }
    }
    let all_topics = std::mem::take(&mut request.topics);
    let mut denied_topics = Vec::new();
    for (i, t) in all_topics.into_iter().enumerate() {
        match refused.iter().find(|(j, _)| *j == i) {
            Some((_, e)) => denied_topics.push((
                i,
                t.name.clone(),
                t.partitions
                    .iter()
                    .map(|p| (p.partition_index, Err(e.clone())))
                    .collect::<Vec<(i32, Result<(), ApiError>)>>(),
            )),
            None => request.topics.push(t),
        }
    }
    let names: Vec<_> = request.topics.iter().map(|t| t.name.clone()).collect();
    let req = CommitRequest {
        group_id: request.group_id.to_string(),
        generation_or_epoch: request.generation_id_or_member_epoch,
        member_id: request.member_id.to_string(),
        group_instance_id: request.group_instance_id.map(|s| s.to_string()),
        api_version: version,
        topics: request
            .topics
            .into_iter()
            .map(|t| {
                (
                    t.name.to_string(),
                    t.partitions
                        .into_iter()
                        .map(|p| PartitionCommit {
                            partition: p.partition_index,
                            offset: p.committed_offset,
                            leader_epoch: if version >= 6 {
                                p.committed_leader_epoch
                            } else {
                                -1
                            },
                            metadata: p.committed_metadata.map(|m| m.to_string()),
                        })
                        .collect(),
                )
            })
            .collect(),
    };
    let results = if names.is_empty() {
        Vec::new()
    } else {
        broker.groups().commit_offsets(&**broker, req).await
    };
    let mut answered: Vec<_> = names
        .into_iter()
        .zip(results)
        .map(|(name, (_, partitions))| (name, partitions))
        .collect();
    // The refused topics back in their places.
    for (i, name, partitions) in denied_topics {
        answered.insert(i.min(answered.len()), (name, partitions));
    }
    OffsetCommitResponse::default().with_topics(
        answered
            .into_iter()
            .map(|(name, partitions)| {
                OffsetCommitResponseTopic::default()
                    .with_name(name)
                    .with_partitions(
                        partitions
                            .into_iter()
                            .map(|(p, r)| {
                                OffsetCommitResponsePartition::default()
                                    .with_partition_index(p)
                                    .with_error_code(r.err().map_or(0, |e| e.code()))
                            })
                            .collect(),
                    )
            })
            .collect(),
    )
}
