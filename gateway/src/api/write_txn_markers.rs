//! WriteTxnMarkers: a transaction coordinator (another broker's, or an
//! admin's abort of a hanging transaction) asks this broker to append
//! COMMIT/ABORT markers to partitions it leads. Answered per partition once
//! the markers are durable.

use std::sync::Arc;

use kafka_protocol::messages::write_txn_markers_response::{
    WritableTxnMarkerPartitionResult, WritableTxnMarkerResult, WritableTxnMarkerTopicResult,
};
use kafka_protocol::messages::{WriteTxnMarkersRequest, WriteTxnMarkersResponse};

use crate::authz::{Authz, Op};
use crate::broker::txn_markers::Markers;
use crate::broker::Broker;
use crate::request_context::RequestContext;

pub async fn handle(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    request: WriteTxnMarkersRequest,
) -> WriteTxnMarkersResponse {
    let mut results = Vec::with_capacity(request.markers.len());
    // Kafka: CLUSTER_ACTION on the cluster (brokers' own requests, which
    // come on the inter-broker listener and pass).
    let denied = Authz::of(broker, ctx).cluster(Op::ClusterAction).err();
    for marker in request.markers {
        let m = Markers {
            producer_id: marker.producer_id.0,
            producer_epoch: marker.producer_epoch,
            commit: marker.transaction_result,
            coordinator_epoch: marker.coordinator_epoch,
        };
        let partitions: Vec<(String, i32)> = marker
            .topics
            .iter()
            .flat_map(|t| {
                t.partition_indexes
                    .iter()
                    .map(|p| (t.name.0.to_string(), *p))
            })
            .collect();
        let outcomes = match &denied {
            Some(e) => partitions
                .into_iter()
                .map(|p| (p, Err(e.clone())))
                .collect(),
            None => broker.write_local_markers(&m, &partitions).await,
        };
        let topics = marker
            .topics
            .iter()
            .map(|t| {
                WritableTxnMarkerTopicResult::default()
                    .with_name(t.name.clone())
                    .with_partitions(
                        t.partition_indexes
                            .iter()
                            .map(|p| {
                                let code = outcomes
                                    .iter()
                                    .find(|((name, q), _)| name == t.name.0.as_str() && q == p)
                                    .map_or(0, |(_, r)| r.as_ref().err().map_or(0, |e| e.code()));
                                WritableTxnMarkerPartitionResult::default()
                                    .with_partition_index(*p)
                                    .with_error_code(code)
                            })
                            .collect(),
                    )
            })
            .collect();
        results.push(
            WritableTxnMarkerResult::default()
                .with_producer_id(marker.producer_id)
                .with_topics(topics),
        );
    }
    WriteTxnMarkersResponse::default().with_markers(results)
}
