//! AddOffsetsToTxn: the group's `__consumer_offsets` partition joins the
//! producer's transaction (so EndTxn writes a marker there too).

use std::sync::Arc;

use kafka_protocol::messages::{AddOffsetsToTxnRequest, AddOffsetsToTxnResponse, RequestHeader};

use crate::broker::Broker;
use crate::txn::fenced_for_version;

pub async fn handle(
    broker: &Arc<Broker>,
    header: &RequestHeader,
    request: AddOffsetsToTxnRequest,
) -> AddOffsetsToTxnResponse {
    let result = broker
        .txns
        .add_offsets(
            broker,
            request.transactional_id.0.as_str(),
            request.producer_id.0,
            request.producer_epoch,
            request.group_id.0.as_str(),
        )
        .await;
    match result {
        Ok(()) => AddOffsetsToTxnResponse::default(),
        Err(e) => AddOffsetsToTxnResponse::default()
            .with_error_code(fenced_for_version(e, header.request_api_version, 2).code()),
    }
}
