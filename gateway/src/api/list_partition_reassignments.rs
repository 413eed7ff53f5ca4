//! ListPartitionReassignments (v0): no reassignment is ever in progress
//! (a partition's replicas are its range's active segment's replica set,
//! which only the controller's placement changes), so the answer lists no
//! topics, for every topic as for named ones (Kafka leaves out topics and
//! partitions without an ongoing reassignment, unknown ones included).

use std::sync::Arc;

use kafka_protocol::messages::{
    ListPartitionReassignmentsRequest, ListPartitionReassignmentsResponse, RequestHeader,
};

use crate::broker::Broker;

pub async fn handle(
    _broker: &Arc<Broker>,
    _header: &RequestHeader,
    _request: ListPartitionReassignmentsRequest,
) -> ListPartitionReassignmentsResponse {
    ListPartitionReassignmentsResponse::default().with_topics(Vec::new())
}
