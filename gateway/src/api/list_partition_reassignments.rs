//! ListPartitionReassignments (v0): no reassignment is ever in progress
//! (a partition's replicas are its range's active segment's replica set,
//! which only the controller's placement changes), so the answer lists no
//! topics, for every topic as for named ones (Kafka leaves out topics and
//! partitions without an ongoing reassignment, unknown ones included).

use std::sync::Arc;

use kafka_protocol::messages::{
    ListPartitionReassignmentsRequest, ListPartitionReassignmentsResponse,
};

use crate::authz::{Authz, Op};
use crate::broker::Broker;
use crate::request_context::RequestContext;

pub async fn handle(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    _request: ListPartitionReassignmentsRequest,
) -> ListPartitionReassignmentsResponse {
    // Kafka: DESCRIBE on the cluster.
    if let Err(e) = Authz::of(broker, ctx).cluster(Op::Describe) {
        return ListPartitionReassignmentsResponse::default()
            .with_error_code(e.code())
            .with_error_message(
                e.message()
                    .map(kafka_protocol::protocol::StrBytes::from_string),
            );
    }
    ListPartitionReassignmentsResponse::default().with_topics(Vec::new())
}
