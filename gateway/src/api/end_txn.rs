//! EndTxn: commit or abort the producer's transaction. Answered once the
//! COMMIT/ABORT markers are durable in every partition of the transaction.

use std::sync::Arc;

use kafka_protocol::messages::{EndTxnRequest, EndTxnResponse};

use crate::authz::{Authz, Op};
use crate::broker::Broker;
use crate::request_context::RequestContext;
use crate::txn::fenced_for_version;

pub async fn handle(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    request: EndTxnRequest,
) -> EndTxnResponse {
    // Kafka: WRITE on the transactional id.
    if let Err(e) = Authz::of(broker, ctx).transactional_id(Op::Write, &request.transactional_id) {
        return EndTxnResponse::default().with_error_code(e.code());
    }
    let result = broker
        .txns()
        .end_txn(
            &**broker,
            request.transactional_id.0.as_str(),
            request.producer_id.0,
            request.producer_epoch,
            request.committed,
        )
        .await;
    match result {
        Ok(()) => EndTxnResponse::default(),
        Err(e) => EndTxnResponse::default()
            .with_error_code(fenced_for_version(e, ctx.version(), 2).code()),
    }
}
