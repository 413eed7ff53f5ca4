//! InitProducerId. Without a transactional id: a fresh producer id at epoch
//! 0, as Kafka's coordinator answers idempotent producers. With one: the
//! transaction coordinator's producer id and (bumped) epoch, fencing older
//! producers of the id (see `txn`).

use std::sync::Arc;

use kafka_protocol::messages::{InitProducerIdRequest, InitProducerIdResponse, ProducerId};

use crate::authz::{Authz, Op, Resource};
use crate::broker::Broker;
use crate::error::ApiError;
use crate::request_context::RequestContext;
use crate::txn::fenced_for_version;

pub async fn handle(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    request: InitProducerIdRequest,
) -> InitProducerIdResponse {
    // Kafka: WRITE on the transactional id; an idempotent producer needs
    // IDEMPOTENT_WRITE on the cluster or WRITE on some topic (KIP-679).
    let authz = Authz::of(broker, ctx);
    let denied = match request.transactional_id.as_ref() {
        Some(id) => authz.transactional_id(Op::Write, id).err(),
        None => (!authz.may(
            Op::IdempotentWrite,
            Resource::Cluster,
            crate::authz::CLUSTER_NAME,
        ) && !authz.allows_any(Op::Write, Resource::Topic))
        .then_some(ApiError::ClusterAuthorizationFailed),
    };
    let result = match request.transactional_id.as_ref() {
        _ if denied.is_some() => Err(denied.unwrap_or(ApiError::ClusterAuthorizationFailed)),
        Some(id) => {
            let expected = match (request.producer_id.0, request.producer_epoch) {
                (-1, -1) => Ok(None),
                (pid, epoch) if pid >= 0 && epoch >= 0 => Ok(Some((pid, epoch))),
                _ => Err(ApiError::InvalidRequest(
                    "producer id and epoch must both be set or both be -1".into(),
                )),
            };
            match expected {
                Ok(expected) => broker
                    .txns()
                    .init_producer_id(
                        &**broker,
                        id.0.as_str(),
                        request.transaction_timeout_ms,
                        expected,
                    )
                    .await
                    .map_err(|e| fenced_for_version(e, ctx.version(), 4)),
                Err(e) => Err(e),
            }
        }
        None => broker
            .producer_ids()
            .next_id(broker.controller(), broker.config().node_id)
            .await
            .map(|id| (id, 0)),
    };
    match result {
        Ok((id, epoch)) => InitProducerIdResponse::default()
            .with_producer_id(ProducerId(id))
            .with_producer_epoch(epoch),
        Err(e) => InitProducerIdResponse::default()
            .with_error_code(e.code())
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1),
    }
}
