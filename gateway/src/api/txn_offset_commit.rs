//! TxnOffsetCommit: offsets committed as part of the producer's transaction
//! (visible to OffsetFetch only once the transaction commits).

use std::sync::Arc;

use kafka_protocol::messages::txn_offset_commit_response::{
    TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
};
use kafka_protocol::messages::{RequestHeader, TxnOffsetCommitRequest, TxnOffsetCommitResponse};
use kafka_protocol::protocol::StrBytes;

use crate::broker::Broker;
use crate::groups::offsets::PartitionCommit;
use crate::groups::txn_offsets::TxnCommitRequest;
use crate::txn::fenced_for_version;

pub async fn handle(
    broker: &Arc<Broker>,
    header: &RequestHeader,
    request: TxnOffsetCommitRequest,
) -> TxnOffsetCommitResponse {
    let version = header.request_api_version;
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
            .map(|t| {
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
    let results = broker.groups.txn_offset_commit(broker, req).await;
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
