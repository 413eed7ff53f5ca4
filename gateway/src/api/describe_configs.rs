//! DescribeConfigs: topic configs (the topic's own values and where the
//! others come from: dynamic or static broker configs, defaults) and this
//! broker's configs (static and dynamic), with synonyms and documentation
//! when asked, as Kafka's `ConfigHelper` reports them.

use std::sync::Arc;

use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult, DescribeConfigsSynonym,
};
use kafka_protocol::messages::{DescribeConfigsRequest, DescribeConfigsResponse};
use kafka_protocol::protocol::StrBytes;

use crate::alter_config::{broker_resource, RESOURCE_BROKER, RESOURCE_TOPIC};
use crate::authz::{Authz, Op};
use crate::broker::Broker;
use crate::dynamic_config::{describe_broker_configs, BrokerView};
use crate::error::ApiError;
use crate::request_context::RequestContext;
use crate::topic_config::{describe_topic_configs, DescribedConfig};

pub async fn handle(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    request: DescribeConfigsRequest,
) -> DescribeConfigsResponse {
    let version = ctx.version();
    let image = broker.image();
    let view = BrokerView::new(broker.config(), &image);
    // Kafka: DESCRIBE_CONFIGS on the topic, or on the cluster for a broker.
    let authz = Authz::of(broker, ctx);
    let results = request
        .resources
        .iter()
        .map(|resource| {
            let name = resource.resource_name.as_str();
            let denied = authz.config_resource(Op::DescribeConfigs, resource.resource_type, name);
            let described: Result<Vec<DescribedConfig>, ApiError> = match resource.resource_type {
                _ if denied.is_err() => denied.map(|_| Vec::new()),
                RESOURCE_TOPIC => image
                    .topic_by_name(name)
                    .map(|t| describe_topic_configs(&t.configs, &view))
                    .ok_or(ApiError::UnknownTopicOrPartition),
                RESOURCE_BROKER => broker_resource(name, broker.config().node_id)
                    .map(|id| describe_broker_configs(&view, id.is_some())),
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
                        .map(|c| entry(c, version, &request))
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

fn entry(
    c: DescribedConfig,
    version: i16,
    request: &DescribeConfigsRequest,
) -> DescribeConfigsResourceResult {
    let mut r = DescribeConfigsResourceResult::default()
        .with_name(super::config_name(c.name))
        .with_value((!c.sensitive).then(|| StrBytes::from_string(c.value)))
        .with_read_only(c.read_only)
        .with_config_source(c.source)
        .with_is_sensitive(c.sensitive);
    if request.include_synonyms {
        r = r.with_synonyms(
            c.synonyms
                .into_iter()
                .map(|s| {
                    DescribeConfigsSynonym::default()
                        .with_name(super::config_name(s.name))
                        .with_value((!c.sensitive).then(|| StrBytes::from_string(s.value)))
                        .with_source(s.source)
                })
                .collect(),
        );
    }
    if version >= 3 {
        r = r.with_config_type(c.config_type);
        if request.include_documentation {
            r = r.with_documentation(Some(StrBytes::from_static_str(c.doc)));
        }
    }
    r
}
