//! ListTransactions (v0-1): the transactional ids this coordinator holds,
//! filtered by state, producer id and (v1) how long they have been running.

use std::sync::Arc;

use kafka_protocol::messages::list_transactions_response::TransactionState;
use kafka_protocol::messages::{ListTransactionsRequest, ListTransactionsResponse, ProducerId};
use kafka_protocol::protocol::StrBytes;

use crate::authz::{Authz, Op, Resource};
use crate::broker::Broker;
use crate::request_context::RequestContext;
use crate::txn::state::TxnState;

pub async fn handle(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    request: ListTransactionsRequest,
) -> ListTransactionsResponse {
    let mut unknown = Vec::new();
    let mut states = Vec::new();
    for f in &request.state_filters {
        match TxnState::from_name(f.as_str()) {
            Some(s) => states.push(s),
            None => unknown.push(f.clone()),
        }
    }
    let duration = if ctx.version() >= 1 {
        request.duration_filter
    } else {
        -1
    };
    let now = tessera_log::now_ms();
    // Kafka lists the transactional ids the client may DESCRIBE.
    let authz = Authz::of(broker, ctx);
    let listed = broker
        .txns()
        .list()
        .await
        .into_iter()
        .filter(|d| authz.may(Op::Describe, Resource::TransactionalId, &d.transactional_id))
        .filter(|d| states.is_empty() || states.contains(&d.state))
        .filter(|d| {
            request.producer_id_filters.is_empty()
                || request
                    .producer_id_filters
                    .iter()
                    .any(|p| p.0 == d.producer_id)
        })
        .filter(|d| {
            duration < 0 || (d.start_ms >= 0 && !d.state.is_idle() && now - d.start_ms >= duration)
        })
        .map(|d| {
            TransactionState::default()
                .with_transactional_id(StrBytes::from_string(d.transactional_id).into())
                .with_producer_id(ProducerId(d.producer_id))
                .with_transaction_state(StrBytes::from_static_str(d.state.name()))
        })
        .collect();
    ListTransactionsResponse::default()
        .with_unknown_state_filters(unknown)
        .with_transaction_states(listed)
}
