//! AlterClientQuotas (v0-v1): set and remove quotas of user / client-id
//! entities, written to the metadata log (`ClientQuota` records) in one
//! entry; `validate_only` writes nothing. Decided by
//! `quotas::admin::plan_alter`.

use std::sync::Arc;

use kafka_protocol::messages::alter_client_quotas_response::{EntityData, EntryData};
use kafka_protocol::messages::{AlterClientQuotasRequest, AlterClientQuotasResponse};
use kafka_protocol::protocol::StrBytes;

use crate::broker::Broker;
use crate::error::ApiError;
use crate::quotas::admin::{plan_alter, Alteration};
use crate::request_context::RequestContext;

pub async fn handle(
    broker: &Arc<Broker>,
    _ctx: &RequestContext,
    request: AlterClientQuotasRequest,
) -> AlterClientQuotasResponse {
    let alterations: Vec<Alteration> = request
        .entries
        .iter()
        .map(|e| Alteration {
            entity: e
                .entity
                .iter()
                .map(|d| {
                    (
                        d.entity_type.to_string(),
                        d.entity_name.as_ref().map(|n| n.to_string()),
                    )
                })
                .collect(),
            ops: e
                .ops
                .iter()
                .map(|o| (o.key.to_string(), (!o.remove).then_some(o.value)))
                .collect(),
        })
        .collect();
    // Plan and write under the admin lock, so two alterations of one
    // entity do not both plan against the same image.
    let results = {
        let _admin = broker.admin_lock().await;
        let (mut results, records) = plan_alter(&broker.image().client_quotas, &alterations);
        if !request.validate_only && !records.is_empty() {
            if let Err(e) = broker.controller().write(records).await {
                let error = ApiError::from(e);
                for r in results.iter_mut().filter(|r| r.is_ok()) {
                    *r = Err(error.clone());
                }
            }
        }
        results
    };
    AlterClientQuotasResponse::default().with_entries(
        request
            .entries
            .iter()
            .zip(results)
            .map(|(entry, result)| {
                let (code, message) = match result {
                    Ok(()) => (0, None),
                    Err(e) => {
                        broker.metrics().count_error(49);
                        (e.code(), e.message().map(StrBytes::from_string))
                    }
                };
                EntryData::default()
                    .with_error_code(code)
                    .with_error_message(message)
                    .with_entity(
                        entry
                            .entity
                            .iter()
                            .map(|d| {
                                EntityData::default()
                                    .with_entity_type(d.entity_type.clone())
                                    .with_entity_name(d.entity_name.clone())
                            })
                            .collect(),
                    )
            })
            .collect(),
    )
}
