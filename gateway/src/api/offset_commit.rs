//! OffsetCommit: fenced by the group (generation and member id for classic
//! members; generation -1 with no member id only while the group is empty),
//! persisted to `__consumer_offsets` before it is acknowledged.

use std::sync::Arc;

use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::{OffsetCommitRequest, OffsetCommitResponse, RequestHeader};

use crate::broker::Broker;
use crate::groups::offsets::{CommitRequest, PartitionCommit};

pub async fn handle(
    broker: &Arc<Broker>,
    header: &RequestHeader,
    request: OffsetCommitRequest,
) -> OffsetCommitResponse {
    let version = header.request_api_version;
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
    let results = broker.groups.commit_offsets(broker, req).await;
    OffsetCommitResponse::default().with_topics(
        names
            .into_iter()
            .zip(results)
            .map(|(name, (_, partitions))| {
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
