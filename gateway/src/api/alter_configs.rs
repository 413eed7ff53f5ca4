//! AlterConfigs (v0-2): replaces the whole set of a topic's configs, or of
//! a broker's (or the cluster default's) dynamic configs; keys not given
//! are deleted, as in Kafka. See `broker/configs.rs`.

use std::sync::Arc;

use kafka_protocol::messages::alter_configs_response::AlterConfigsResourceResponse;
use kafka_protocol::messages::{AlterConfigsRequest, AlterConfigsResponse, RequestHeader};
use kafka_protocol::protocol::StrBytes;

use crate::alter_config::{duplicate_resources, ConfigChange};
use crate::broker::Broker;
use crate::error::ApiError;

pub async fn handle(
    broker: &Arc<Broker>,
    _header: &RequestHeader,
    request: AlterConfigsRequest,
) -> AlterConfigsResponse {
    let duplicates = duplicate_resources(
        request
            .resources
            .iter()
            .map(|r| (r.resource_type, r.resource_name.as_str())),
    );
    let mut responses = Vec::with_capacity(request.resources.len());
    for (i, resource) in request.resources.iter().enumerate() {
        let outcome = if duplicates.contains(&i) {
            Err(ApiError::InvalidRequest(
                "Each resource must appear at most once.".into(),
            ))
        } else {
            let change = ConfigChange::Replace(
                resource
                    .configs
                    .iter()
                    .map(|c| (c.name.to_string(), c.value.as_ref().map(|v| v.to_string())))
                    .collect(),
            );
            broker
                .alter_configs(
                    resource.resource_type,
                    resource.resource_name.as_str(),
                    &change,
                    request.validate_only,
                )
                .await
        };
        let (code, message) = match outcome {
            Ok(()) => (crate::error::NONE, None),
            Err(e) => (e.code(), e.message().map(StrBytes::from_string)),
        };
        responses.push(
            AlterConfigsResourceResponse::default()
                .with_resource_type(resource.resource_type)
                .with_resource_name(resource.resource_name.clone())
                .with_error_code(code)
                .with_error_message(message),
        );
    }
    AlterConfigsResponse::default().with_responses(responses)
}
