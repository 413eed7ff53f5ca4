//! AlterUserScramCredentials (v0): upsertions (salt, iterations and the
//! salted password; the broker stores salt, iterations, stored key and
//! server key) and deletions, written to the metadata log in one entry.
//! Decided by `sasl::credentials::plan_alter`.

use std::sync::Arc;

use kafka_protocol::messages::alter_user_scram_credentials_response::AlterUserScramCredentialsResult;
use kafka_protocol::messages::{
    AlterUserScramCredentialsRequest, AlterUserScramCredentialsResponse,
};
use kafka_protocol::protocol::StrBytes;

use crate::authz::{Authz, Op};
use crate::broker::Broker;
use crate::error::ApiError;
use crate::request_context::RequestContext;
use crate::sasl::credentials::{plan_alter, Alteration};

pub async fn handle(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    request: AlterUserScramCredentialsRequest,
) -> AlterUserScramCredentialsResponse {
    let mut alterations: Vec<Alteration> = request
        .deletions
        .iter()
        .map(|d| Alteration::Delete {
            user: d.name.to_string(),
            mechanism: d.mechanism,
        })
        .collect();
    alterations.extend(request.upsertions.iter().map(|u| Alteration::Upsert {
        user: u.name.to_string(),
        mechanism: u.mechanism,
        iterations: u.iterations,
        salt: u.salt.to_vec(),
        salted_password: u.salted_password.to_vec(),
    }));
    let (mut results, records) = plan_alter(&broker.image(), &alterations);
    // Kafka: ALTER on the cluster; every user fails, nothing is written.
    if let Err(e) = Authz::of(broker, ctx).cluster(Op::Alter) {
        for (_, r) in results.iter_mut() {
            *r = Err(e.clone());
        }
        return response(results);
    }
    if !records.is_empty() {
        if let Err(e) = broker.controller().write(records).await {
            let error = ApiError::from(e);
            for (_, r) in results.iter_mut().filter(|(_, r)| r.is_ok()) {
                *r = Err(error.clone());
            }
        }
    }
    response(results)
}

fn response(results: crate::sasl::credentials::UserResults) -> AlterUserScramCredentialsResponse {
    AlterUserScramCredentialsResponse::default().with_results(
        results
            .into_iter()
            .map(|(user, r)| {
                let (code, message) = match r {
                    Ok(()) => (0, None),
                    Err(e) => (e.code(), e.message().map(StrBytes::from_string)),
                };
                AlterUserScramCredentialsResult::default()
                    .with_user(StrBytes::from_string(user))
                    .with_error_code(code)
                    .with_error_message(message)
            })
            .collect(),
    )
}
