//! TxnOffsetCommit: offsets committed as part of the producer's transaction
//! (visible to OffsetFetch only once the transaction commits).

use std::sync::Arc;

use kafka_protocol::messages::txn_offset_commit_response::{
    TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
};
use kafka_protocol::messages::{TxnOffsetCommitRequest, TxnOffsetCommitResponse};
use kafka_protocol::protocol::StrBytes;

use crate::authz::{Authz, Op};
use crate::broker::Broker;
use crate::groups::offsets::PartitionCommit;
use crate::groups::txn_offsets::TxnCommitRequest;
use crate::request_context::RequestContext;
use crate::txn::fenced_for_version;

pub async fn handle(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    request: TxnOffsetCommitRequest,
) -> TxnOffsetCommitResponse {
    let version = ctx.version();
    // Kafka: WRITE on the transactional id and READ on the group (every
    // partition fails), then READ on each topic (its partitions fail).
    let authz = Authz::of(broker, ctx);
    let denied = authz
        .transactional_id(Op::Write, &request.transactional_id)
        .and_then(|()| authz.group(Op::Read, &request.group_id))
        .err();
    let topic_denied: Vec<Option<crate::error::ApiError>> = request
        .topics
        .iter()
        .map(|t| match &denied {
            Some(e) => Some(e.clone()),
            None => authz.topic(Op::Read, &t.name).err(),
        })
        .collect();
    let req = TxnCommitRequest {
        group_id: request.group_id.0.to_string(),
        producer_id: request.producer_id.0,
        producer_epoch: request.producer_epoch,
        generation_id: if version >= 3 {
            request.generation_id
        } else {
            -1
        },
        member_id: if version >= 3 {
            request.member_id.to_string()
        } else {
            String::new()
        },
        group_instance_id: request.group_instance_id.as_ref().map(|s| s.to_string()),
        topics: request
            .topics
            .iter()
            .zip(&topic_denied)
            .filter(|(_, d)| d.is_none())
            .map(|(t, _)| {
                (
                    t.name.0.to_string(),
                    t.partitions
                        .iter()
                        .map(|p| PartitionCommit {
                            partition: p.partition_index,
                            offset: p.committed_offset,
                            leader_epoch: if version >= 2 {
                                p.committed_leader_epoch
                            } else {
                                -1
                            },
                            metadata: p.committed_metadata.as_ref().map(|m| m.to_string()),
                        })
                        .collect(),
                )
            })
            .collect(),
    };
    let mut allowed = if req.topics.is_empty() {
        Vec::new()
    } else {
        broker.groups().txn_offset_commit(&**broker, req).await
    }
    .into_iter();
    let results: Vec<_> = request
        .topics
        .iter()
        .zip(topic_denied)
        .filter_map(|(t, d)| match d {
            Some(e) => Some((
                t.name.0.to_string(),
                t.partitions
                    .iter()
                    .map(|p| (p.partition_index, Err(e.clone())))
                    .collect::<Vec<_>>(),
            )),
            None => allowed.next(),
        })
        .collect();
    TxnOffsetCommitResponse::default().with_topics(
        results
            .into_iter()
            .map(|(t, ps)| {
                TxnOffsetCommitResponseTopic::default()
                    .with_name(StrBytes::from_string(t).into())
                    .with_partitions(
                        ps.into_iter()
                            .map(|(p, r)| {
                                TxnOffsetCommitResponsePartition::default()
                                    .with_partition_index(p)
                                    .with_error_code(match r {
                                        Ok(()) => 0,
                                        Err(e) => fenced_for_version(e, version, 2).code(),
                                    })
                            })
                            .collect(),
                    )
            })
            .collect(),
    )
}
