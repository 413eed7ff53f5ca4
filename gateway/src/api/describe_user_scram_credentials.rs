//! DescribeUserScramCredentials (v0): each user's mechanisms and
//! iterations (never salts or keys). Decided by
//! `sasl::credentials::describe`.

use std::sync::Arc;

use kafka_protocol::messages::describe_user_scram_credentials_response::{
    CredentialInfo, DescribeUserScramCredentialsResult,
};
use kafka_protocol::messages::{
    DescribeUserScramCredentialsRequest, DescribeUserScramCredentialsResponse,
};
use kafka_protocol::protocol::StrBytes;

use crate::authz::{Authz, Op};
use crate::broker::Broker;
use crate::request_context::RequestContext;
use crate::sasl::credentials::describe;

pub async fn handle(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    request: DescribeUserScramCredentialsRequest,
) -> DescribeUserScramCredentialsResponse {
    // Kafka: DESCRIBE on the cluster.
    if let Err(e) = Authz::of(broker, ctx).cluster(Op::Describe) {
        return DescribeUserScramCredentialsResponse::default()
            .with_error_code(e.code())
            .with_error_message(e.message().map(StrBytes::from_string));
    }
    let users: Option<Vec<String>> = request
        .users
        .map(|users| users.iter().map(|u| u.name.to_string()).collect());
    let results = describe(&broker.image(), users.as_deref())
        .into_iter()
        .map(|(user, r)| {
            let result = DescribeUserScramCredentialsResult::default()
                .with_user(StrBytes::from_string(user));
            match r {
                Ok(infos) => result.with_credential_infos(
                    infos
                        .into_iter()
                        .map(|(mechanism, iterations)| {
                            CredentialInfo::default()
                                .with_mechanism(mechanism)
                                .with_iterations(iterations)
                        })
                        .collect(),
                ),
                Err(e) => result
                    .with_error_code(e.code())
                    .with_error_message(e.message().map(StrBytes::from_string)),
            }
        })
        .collect();
    DescribeUserScramCredentialsResponse::default().with_results(results)
}
