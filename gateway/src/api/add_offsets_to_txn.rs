//! AddOffsetsToTxn: the group's `__consumer_offsets` partition joins the
//! producer's transaction (so EndTxn writes a marker there too).

use std::sync::Arc;

use kafka_protocol::messages::{AddOffsetsToTxnRequest, AddOffsetsToTxnResponse};

use crate::authz::{Authz, Op};
use crate::broker::Broker;
use crate::request_context::RequestContext;
use crate::txn::fenced_for_version;

pub async fn handle(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    request: AddOffsetsToTxnRequest,
) -> AddOffsetsToTxnResponse {
    // Kafka: WRITE on the transactional id, READ on the group.
    let authz = Authz::of(broker, ctx);
    if let Err(e) = authz
        .transactional_id(Op::Write, &request.transactional_id)
        .and_then(|()| authz.group(Op::Read, &request.group_id))
    {
        return AddOffsetsToTxnResponse::default().with_error_code(e.code());
    }
    let result = broker
        .txns()
        .add_offsets(
            &**broker,
            request.transactional_id.0.as_str(),
            request.producer_id.0,
            request.producer_epoch,
            request.group_id.0.as_str(),
        )
        .await;
    match result {
        Ok(()) => AddOffsetsToTxnResponse::default(),
        Err(e) => AddOffsetsToTxnResponse::default()
            .with_error_code(fenced_for_version(e, ctx.version(), 2).code()),
    }
}
