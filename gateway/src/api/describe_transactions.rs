//! DescribeTransactions: the coordinator's view of each transactional id.

use std::collections::BTreeMap;
use std::sync::Arc;

use kafka_protocol::messages::describe_transactions_response::{TopicData, TransactionState};
use kafka_protocol::messages::{
    DescribeTransactionsRequest, DescribeTransactionsResponse, ProducerId,
};
use kafka_protocol::protocol::StrBytes;

use crate::authz::{Authz, Op};
use crate::broker::Broker;
use crate::request_context::RequestContext;

pub async fn handle(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    request: DescribeTransactionsRequest,
) -> DescribeTransactionsResponse {
    let mut states = Vec::new();
    // Kafka: DESCRIBE on each transactional id.
    let authz = Authz::of(broker, ctx);
    for id in request.transactional_ids {
        let s = TransactionState::default().with_transactional_id(id.clone());
        let described = match authz.transactional_id(Op::Describe, &id) {
            Err(e) => Err(e),
            Ok(()) => broker.txns().describe(&**broker, id.0.as_str()).await,
        };
        states.push(match described {
            Ok(d) => {
                let mut by_topic: BTreeMap<String, Vec<i32>> = BTreeMap::new();
                for (t, p) in d.partitions {
                    by_topic.entry(t).or_default().push(p);
                }
                s.with_transaction_state(StrBytes::from_static_str(d.state.name()))
                    .with_transaction_timeout_ms(d.timeout_ms)
                    .with_transaction_start_time_ms(d.start_ms)
                    .with_producer_id(ProducerId(d.producer_id))
                    .with_producer_epoch(d.producer_epoch)
                    .with_topics(
                        by_topic
                            .into_iter()
                            .map(|(t, ps)| {
                                TopicData::default()
                                    .with_topic(StrBytes::from_string(t).into())
                                    .with_partitions(ps)
                            })
                            .collect(),
                    )
            }
            Err(e) => s
                .with_error_code(e.code())
                .with_producer_id(ProducerId(-1))
                .with_producer_epoch(-1)
                .with_transaction_start_time_ms(-1),
        });
    }
    DescribeTransactionsResponse::default().with_transaction_states(states)
}
