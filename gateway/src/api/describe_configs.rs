//! DescribeConfigs: topic configs (the topic's own values and the defaults
//! behind the others) and this broker's configs.

use std::sync::Arc;

use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult,
};
use kafka_protocol::messages::{DescribeConfigsRequest, DescribeConfigsResponse, RequestHeader};
use kafka_protocol::protocol::StrBytes;

use crate::broker::Broker;
use crate::error::ApiError;
use crate::topic_config::{describe_topic_configs, DescribedConfig, SOURCE_DEFAULT};

/// Kafka's ConfigResource types.
const RESOURCE_TOPIC: i8 = 2;
const RESOURCE_BROKER: i8 = 4;

pub async fn handle(
    broker: &Arc<Broker>,
    header: &RequestHeader,
    request: DescribeConfigsRequest,
) -> DescribeConfigsResponse {
    let version = header.request_api_version;
    let image = broker.image();
    let results = request
        .resources
        .iter()
        .map(|resource| {
            let name = resource.resource_name.as_str();
            let described: Result<Vec<DescribedConfig>, ApiError> = match resource.resource_type {
                RESOURCE_TOPIC => image
                    .topic_by_name(name)
                    .map(|t| describe_topic_configs(&t.configs, &broker.config))
                    .ok_or(ApiError::UnknownTopicOrPartition),
                RESOURCE_BROKER if name.is_empty() || name == broker.config.node_id.to_string() => {
                    Ok(broker_configs(broker))
                }
                RESOURCE_BROKER => Err(ApiError::InvalidRequest(format!(
                    "unexpected broker id {name:?}"
                ))),
                other => Err(ApiError::InvalidRequest(format!(
                    "unsupported resource type {other}"
                ))),
            };
            let result = DescribeConfigsResult::default()
                .with_resource_type(resource.resource_type)
                .with_resource_name(resource.resource_name.clone());
            match described {
                Ok(configs) => result.with_configs(
                    configs
                        .into_iter()
                        .filter(|c| {
                            resource
                                .configuration_keys
                                .as_ref()
                                .is_none_or(|keys| keys.iter().any(|k| k.as_str() == c.name))
                        })
                        .map(|c| {
                            let mut r = DescribeConfigsResourceResult::default()
                                .with_name(StrBytes::from_static_str(c.name))
                                .with_value(Some(StrBytes::from_string(c.value)))
                                .with_config_source(c.source);
                            if version >= 3 {
                                r = r.with_config_type(c.config_type);
                            }
                            r
                        })
                        .collect(),
                ),
                Err(e) => result
                    .with_error_code(e.code())
                    .with_error_message(e.message().map(StrBytes::from_string)),
            }
        })
        .collect();
    DescribeConfigsResponse::default().with_results(results)
}

fn broker_configs(broker: &Broker) -> Vec<DescribedConfig> {
    let c = &broker.config;
    let entries: [(&'static str, String, i8); 8] = [
        ("node.id", c.node_id.to_string(), 3),
        ("num.partitions", c.num_partitions.to_string(), 3),
        (
            "default.replication.factor",
            c.default_replication_factor.to_string(),
            3,
        ),
        (
            "auto.create.topics.enable",
            c.auto_create_topics.to_string(),
            1,
        ),
        (
            "socket.request.max.bytes",
            c.socket_request_max_bytes.to_string(),
            3,
        ),
        ("message.max.bytes", c.message_max_bytes.to_string(), 3),
        ("log.segment.bytes", c.log_segment_bytes.to_string(), 3),
        ("log.retention.ms", c.log_retention_ms.to_string(), 5),
    ];
    entries
        .into_iter()
        .map(|(name, value, config_type)| DescribedConfig {
            name,
            value,
            source: SOURCE_DEFAULT,
            config_type,
        })
        .collect()
}
