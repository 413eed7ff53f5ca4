//! DescribeProducers: the active idempotent/transactional producers of each
//! partition, from the log's producer state (and the first offset of each
//! producer's open transaction).

use std::sync::Arc;

use kafka_protocol::messages::describe_producers_response::{
    PartitionResponse, ProducerState, TopicResponse,
};
use kafka_protocol::messages::{DescribeProducersRequest, DescribeProducersResponse, ProducerId};
use kafka_protocol::protocol::StrBytes;

use crate::authz::{Authz, Op};
use crate::broker::Broker;
use crate::error::ApiError;
use crate::request_context::RequestContext;

pub async fn handle(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    request: DescribeProducersRequest,
) -> DescribeProducersResponse {
    let image = broker.image();
    // Kafka: READ on each topic.
    let authz = Authz::of(broker, ctx);
    let topics = request
        .topics
        .iter()
        .map(|t| {
            let denied = authz.topic(Op::Read, &t.name).err();
            let topic = image.topic_by_name(t.name.0.as_str());
            let partitions = t
                .partition_indexes
                .iter()
                .map(|&p| {
                    let described = topic
                        .ok_or(ApiError::UnknownTopicOrPartition)
                        .and_then(|t| match &denied {
                            Some(e) => Err(e.clone()),
                            None => Ok(t),
                        })
                        .and_then(|topic| broker.route(&image, topic, p))
                        .and_then(|route| {
                            let producers = route.log.producers(p as u32)?;
                            let open = route.log.ongoing_transactions(p as u32)?;
                            Ok(producers
                                .into_iter()
                                .filter_map(|(id, e)| {
                                    let last = e.batches.back()?;
                                    let txn_start = open
                                        .iter()
                                        .find(|(pid, _)| *pid == id)
                                        .map_or(-1, |(_, first)| *first);
                                    Some(
                                        ProducerState::default()
                                            .with_producer_id(ProducerId(id))
                                            .with_producer_epoch(e.epoch as i32)
                                            .with_last_sequence(last.last_seq)
                                            .with_last_timestamp(last.timestamp)
                                            .with_coordinator_epoch(-1)
                                            .with_current_txn_start_offset(txn_start),
                                    )
                                })
                                .collect::<Vec<_>>())
                        });
                    let r = PartitionResponse::default().with_partition_index(p);
                    match described {
                        Ok(active) => r.with_active_producers(active),
                        Err(e) => r
                            .with_error_code(e.code())
                            .with_error_message(e.message().map(StrBytes::from_string)),
                    }
                })
                .collect();
            TopicResponse::default()
                .with_name(t.name.clone())
                .with_partitions(partitions)
        })
        .collect();
    DescribeProducersResponse::default().with_topics(topics)
}
