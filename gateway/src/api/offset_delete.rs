//! OffsetDelete: removes committed offsets of topics the group no longer
//! consumes (GROUP_SUBSCRIBED_TO_TOPIC while it still does).

use std::sync::Arc;

use kafka_protocol::messages::offset_delete_response::{
    OffsetDeleteResponsePartition, OffsetDeleteResponseTopic,
};
use kafka_protocol::messages::{OffsetDeleteRequest, OffsetDeleteResponse, RequestHeader};

use crate::broker::Broker;

pub async fn handle(
    broker: &Arc<Broker>,
    _header: &RequestHeader,
    request: OffsetDeleteRequest,
) -> OffsetDeleteResponse {
    let names: Vec<_> = request.topics.iter().map(|t| t.name.clone()).collect();
    let topics = request
        .topics
        .into_iter()
        .map(|t| {
            (
                t.name.to_string(),
                t.partitions
                    .into_iter()
                    .map(|p| p.partition_index)
                    .collect(),
            )
        })
        .collect();
    match broker
        .groups
        .delete_offsets(broker, &request.group_id, topics)
        .await
    {
        Err(e) => OffsetDeleteResponse::default().with_error_code(e.code()),
        Ok(results) => OffsetDeleteResponse::default().with_topics(
            names
                .into_iter()
                .zip(results)
                .map(|(name, (_, partitions))| {
                    OffsetDeleteResponseTopic::default()
                        .with_name(name)
                        .with_partitions(
                            partitions
                                .into_iter()
                                .map(|(p, r)| {
                                    OffsetDeleteResponsePartition::default()
                                        .with_partition_index(p)
                                        .with_error_code(r.err().map_or(0, |e| e.code()))
                                })
                                .collect(),
                        )
                })
                .collect(),
        ),
    }
}
