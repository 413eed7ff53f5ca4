//! FindCoordinator: a group's coordinator is the leader of its
//! `__consumer_offsets` partition (Kafka's hashing); the topic is created on
//! the first lookup, as Kafka does. A transactional id's coordinator is the
//! leader of its `__transaction_state` partition (created the same way).
//! v4+ looks up a batch of keys.

use std::sync::Arc;

use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::{BrokerId, FindCoordinatorRequest, FindCoordinatorResponse};
use kafka_protocol::protocol::StrBytes;

use crate::authz::{Authz, Op};
use crate::broker::Broker;
use crate::error::ApiError;
use crate::groups::GroupCoordinator;
use crate::internal_topics::partition_for;
use crate::request_context::RequestContext;

const KEY_TYPE_GROUP: i8 = 0;
const KEY_TYPE_TRANSACTION: i8 = 1;

pub async fn handle(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    request: FindCoordinatorRequest,
) -> FindCoordinatorResponse {
    let version = ctx.version();
    let key_type = if version >= 1 {
        request.key_type
    } else {
        KEY_TYPE_GROUP
    };
    if version >= 4 {
        let mut coordinators = Vec::with_capacity(request.coordinator_keys.len());
        for key in request.coordinator_keys {
            let c = Coordinator::default().with_key(key.clone());
            coordinators.push(match find(broker, ctx, key_type, &key).await {
                Ok((node, host, port)) => c
                    .with_node_id(BrokerId(node))
                    .with_host(StrBytes::from_string(host))
                    .with_port(port)
                    .with_error_message(None),
                Err(e) => c
                    .with_node_id(BrokerId(-1))
                    .with_host(StrBytes::default())
                    .with_port(-1)
                    .with_error_code(e.code())
                    .with_error_message(e.message().map(StrBytes::from_string)),
            });
        }
        return FindCoordinatorResponse::default().with_coordinators(coordinators);
    }
    let response = FindCoordinatorResponse::default();
    match find(broker, ctx, key_type, &request.key).await {
        Ok((node, host, port)) => response
            .with_node_id(BrokerId(node))
            .with_host(StrBytes::from_string(host))
            .with_port(port)
            .with_error_message(None),
        Err(e) => response
            .with_error_code(e.code())
            .with_error_message(e.message().map(StrBytes::from_string))
            .with_node_id(BrokerId(-1))
            .with_host(StrBytes::default())
            .with_port(-1),
    }
}

async fn find(
    broker: &Broker,
    ctx: &RequestContext,
    key_type: i8,
    key: &str,
) -> Result<(i32, String, i32), ApiError> {
    // Kafka: DESCRIBE on the group or the transactional id.
    let authz = Authz::of(broker, ctx);
    match key_type {
        KEY_TYPE_GROUP => authz.group(Op::Describe, key)?,
        KEY_TYPE_TRANSACTION => authz.transactional_id(Op::Describe, key)?,
        _ => {}
    }
    // The coordinator is the leader of the internal partition the key hashes to.
    let topic = match key_type {
        KEY_TYPE_GROUP => GroupCoordinator::ensure_offsets_topic(broker).await,
        KEY_TYPE_TRANSACTION => crate::txn::TxnCoordinator::ensure_topic(broker).await,
        other => {
            return Err(ApiError::InvalidRequest(format!(
                "unknown coordinator key type {other}"
            )))
        }
    }
    .map_err(|_| ApiError::CoordinatorNotAvailable)?;
    // Whichever broker leads it, as the image says (any broker answers).
    let image = broker.image();
    let partition = partition_for(key, topic.partitions) as u32;
    let leader = image
        .active_range_for(topic.id, partition)
        .and_then(|range| image.active_segment(range.id))
        .and_then(|segment| segment.primary())
        .and_then(|id| image.brokers.get(&id))
        .filter(|b| !b.fenced)
        .ok_or(ApiError::CoordinatorNotAvailable)?;
    let (host, port) = broker.endpoint(ctx.listener(), &leader.registration);
    Ok((leader.registration.broker_id, host, port))
}
