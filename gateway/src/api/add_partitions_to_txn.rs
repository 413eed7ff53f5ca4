//! AddPartitionsToTxn, the client form (v0-3): the partitions join the
//! producer's transaction. An unknown partition fails the request
//! (UNKNOWN_TOPIC_OR_PARTITION for it, OPERATION_NOT_ATTEMPTED for the rest),
//! as Kafka.

use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::add_partitions_to_txn_response::{
    AddPartitionsToTxnPartitionResult, AddPartitionsToTxnTopicResult,
};
use kafka_protocol::messages::{AddPartitionsToTxnRequest, AddPartitionsToTxnResponse};

use crate::authz::{Authz, Op};
use crate::broker::Broker;
use crate::request_context::RequestContext;
use crate::txn::fenced_for_version;

pub async fn handle(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    request: AddPartitionsToTxnRequest,
) -> AddPartitionsToTxnResponse {
    let image = broker.image();
    // Kafka: WRITE on the transactional id (every partition fails), then
    // WRITE on each topic (its partitions fail, the rest are not attempted).
    let authz = Authz::of(broker, ctx);
    let txn_denied = authz
        .transactional_id(Op::Write, &request.v3_and_below_transactional_id)
        .err();
    let denied_topics: std::collections::HashSet<String> = request
        .v3_and_below_topics
        .iter()
        .filter(|t| txn_denied.is_none() && authz.topic(Op::Write, &t.name).is_err())
        .map(|t| t.name.0.to_string())
        .collect();
    let mut unknown = false;
    let mut partitions = Vec::new();
    for t in &request.v3_and_below_topics {
        let topic = image.topic_by_name(t.name.0.as_str());
        for &p in &t.partitions {
            if denied_topics.contains(t.name.0.as_str()) {
                unknown = true;
            } else if topic.is_some_and(|k| p >= 0 && (p as u32) < k.partitions) {
                partitions.push((t.name.0.to_string(), p));
            } else {
                unknown = true;
            }
        }
    }
    let outcome: Result<(), i16> = if let Some(e) = &txn_denied {
        Err(e.code())
    } else if unknown {
        Err(-1)
    } else {
        broker
            .txns()
            .add_partitions(
                &**broker,
                request.v3_and_below_transactional_id.0.as_str(),
                request.v3_and_below_producer_id.0,
                request.v3_and_below_producer_epoch,
                &partitions,
            )
            .await
            .map_err(|e| fenced_for_version(e, ctx.version(), 2).code())
    };
    let results = request
        .v3_and_below_topics
        .iter()
        .map(|t| {
            let topic = image.topic_by_name(t.name.0.as_str());
            AddPartitionsToTxnTopicResult::default()
                .with_name(t.name.clone())
                .with_results_by_partition(
                    t.partitions
                        .iter()
                        .map(|&p| {
                            let known = topic.is_some_and(|k| p >= 0 && (p as u32) < k.partitions);
                            let code = match outcome {
                                Err(-1) if denied_topics.contains(t.name.0.as_str()) => {
                                    crate::error::ApiError::TopicAuthorizationFailed.code()
                                }
                                Ok(()) => 0,
                                Err(-1) if known => ResponseError::OperationNotAttempted.code(),
                                Err(-1) => ResponseError::UnknownTopicOrPartition.code(),
                                Err(code) => code,
                            };
                            AddPartitionsToTxnPartitionResult::default()
                                .with_partition_index(p)
                                .with_partition_error_code(code)
                        })
                        .collect(),
                )
        })
        .collect();
    AddPartitionsToTxnResponse::default().with_results_by_topic_v3_and_below(results)
}
