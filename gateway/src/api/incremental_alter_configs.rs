//! IncrementalAlterConfigs (v0-1): SET, DELETE, APPEND and SUBTRACT on a
//! topic's configs or on a broker's (or the cluster default's) dynamic
//! configs. See `alter_config.rs` and `broker/configs.rs`.

use std::sync::Arc;

use kafka_protocol::messages::incremental_alter_configs_response::AlterConfigsResourceResponse;
use kafka_protocol::messages::{IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse};
use kafka_protocol::protocol::StrBytes;

use crate::alter_config::ConfigChange;
use crate::authz::{Authz, Op};
use crate::broker::Broker;
use crate::request_context::RequestContext;

pub async fn handle(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    request: IncrementalAlterConfigsRequest,
) -> IncrementalAlterConfigsResponse {
    // Kafka: ALTER_CONFIGS on the topic, or on the cluster for a broker.
    let authz = Authz::of(broker, ctx);
    let denied: Vec<Option<crate::error::ApiError>> = request
        .resources
        .iter()
        .map(|r| {
            authz
                .config_resource(Op::AlterConfigs, r.resource_type, &r.resource_name)
                .err()
        })
        .collect();
    let changes = request
        .resources
        .iter()
        .zip(&denied)
        .filter(|(_, d)| d.is_none())
        .map(|(r, _)| {
            let change = ConfigChange::Incremental(
                r.configs
                    .iter()
                    .map(|c| {
                        (
                            c.name.to_string(),
                            c.config_operation,
                            c.value.as_ref().map(|v| v.to_string()),
                        )
                    })
                    .collect(),
            );
            (r.resource_type, r.resource_name.as_str(), change)
        })
        .collect();
    let mut allowed = broker
        .alter_resources(changes, request.validate_only)
        .await
        .into_iter();
    let outcomes: Vec<(i16, Option<String>)> = denied
        .into_iter()
        .map(|d| match d {
            Some(e) => (e.code(), e.message()),
            None => allowed.next().unwrap_or((0, None)),
        })
        .collect();
    let responses = request
        .resources
        .iter()
        .zip(outcomes)
        .map(|(r, (code, message))| {
            AlterConfigsResourceResponse::default()
                .with_resource_type(r.resource_type)
                .with_resource_name(r.resource_name.clone())
                .with_error_code(code)
                .with_error_message(message.map(StrBytes::from_string))
        })
        .collect();
    IncrementalAlterConfigsResponse::default().with_responses(responses)
}
