//! DescribeCluster: the brokers, the cluster id and the controller.

use std::sync::Arc;

use kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use kafka_protocol::messages::{BrokerId, DescribeClusterRequest, DescribeClusterResponse};
use kafka_protocol::protocol::StrBytes;

use crate::authz::{Authz, Resource, CLUSTER_NAME};
use crate::broker::Broker;
use crate::request_context::RequestContext;

/// Kafka's "authorized operations not requested" marker.
pub const AUTHORIZED_OPERATIONS_OMITTED: i32 = i32::MIN;

pub async fn handle(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    request: DescribeClusterRequest,
) -> DescribeClusterResponse {
    // Kafka's broker answers everyone; the authorized operations are 0
    // without DESCRIBE on the cluster.
    let authz = Authz::of(broker, ctx);
    let image = broker.image();
    let brokers = image
        .brokers
        .values()
        .filter(|b| request.include_fenced_brokers || !b.fenced)
        .map(|b| {
            let (host, port) = broker.endpoint(ctx.listener(), &b.registration);
            DescribeClusterBroker::default()
                .with_broker_id(BrokerId(b.registration.broker_id))
                .with_host(StrBytes::from_string(host))
                .with_port(port)
                .with_rack(b.registration.rack.clone().map(StrBytes::from_string))
                .with_is_fenced(b.fenced)
        })
        .collect();
    DescribeClusterResponse::default()
        .with_endpoint_type(1)
        .with_cluster_id(StrBytes::from_string(broker.cluster_id().to_string()))
        .with_controller_id(BrokerId(broker.controller_id()))
        .with_brokers(brokers)
        .with_cluster_authorized_operations(if request.include_cluster_authorized_operations {
            authz.operations(Resource::Cluster, CLUSTER_NAME)
        } else {
            AUTHORIZED_OPERATIONS_OMITTED
        })
}
