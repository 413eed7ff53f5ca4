//! InitProducerId for idempotent producers: a fresh producer id at epoch 0,
//! as Kafka's coordinator answers a request without a transactional id.
//! Transactions (a transactional id) are not supported yet.

use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::{
    InitProducerIdRequest, InitProducerIdResponse, ProducerId, RequestHeader,
};

use crate::broker::Broker;

pub async fn handle(
    broker: &Arc<Broker>,
    _header: &RequestHeader,
    request: InitProducerIdRequest,
) -> InitProducerIdResponse {
    if request.transactional_id.is_some() {
        return InitProducerIdResponse::default()
            .with_error_code(ResponseError::UnsupportedVersion.code())
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1);
    }
    match broker
        .producer_ids
        .next_id(&broker.controller, broker.config.node_id)
        .await
    {
        Ok(id) => InitProducerIdResponse::default()
            .with_producer_id(ProducerId(id))
            .with_producer_epoch(0),
        Err(e) => InitProducerIdResponse::default()
            .with_error_code(e.code())
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1),
    }
}
