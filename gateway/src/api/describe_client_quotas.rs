//! DescribeClientQuotas (v0-v1, KIP-546): the quotas of the entities a
//! filter selects. Decided by `quotas::admin::describe`.

use std::sync::Arc;

use kafka_protocol::messages::describe_client_quotas_response::{EntityData, EntryData, ValueData};
use kafka_protocol::messages::{DescribeClientQuotasRequest, DescribeClientQuotasResponse};
use kafka_protocol::protocol::StrBytes;

use crate::broker::Broker;
use crate::quotas::admin::{describe, entity_parts, Component};
use crate::request_context::RequestContext;

pub async fn handle(
    broker: &Arc<Broker>,
    _ctx: &RequestContext,
    request: DescribeClientQuotasRequest,
) -> DescribeClientQuotasResponse {
    let components: Vec<Component> = request
        .components
        .iter()
        .map(|c| Component {
            entity_type: c.entity_type.to_string(),
            match_type: c.match_type,
            matched: c._match.as_ref().map(|m| m.to_string()),
        })
        .collect();
    let image = broker.image();
    match describe(&image.client_quotas, &components, request.strict) {
        Ok(found) => DescribeClientQuotasResponse::default().with_entries(Some(
            found
                .into_iter()
                .map(|(entity, values)| {
                    EntryData::default()
                        .with_entity(
                            entity_parts(entity)
                                .into_iter()
                                .map(|(t, name)| {
                                    EntityData::default()
                                        .with_entity_type(StrBytes::from_static_str(t))
                                        .with_entity_name(name.map(StrBytes::from_string))
                                })
                                .collect(),
                        )
                        .with_values(
                            values
                                .iter()
                                .map(|(k, v)| {
                                    ValueData::default()
                                        .with_key(StrBytes::from_string(k.clone()))
                                        .with_value(*v)
                                })
                                .collect(),
                        )
                })
                .collect(),
        )),
        Err(e) => {
            broker.metrics().count_error(48);
            DescribeClientQuotasResponse::default()
                .with_error_code(e.code())
                .with_error_message(e.message().map(StrBytes::from_string))
                .with_entries(None)
        }
    }
}
