//! SaslAuthenticate (v0-2). During authentication on a SASL listener the
//! connection's authenticator (`sasl::Authenticator`) answers it; one that
//! reaches this handler came without a handshake on a listener without
//! SASL, or after authentication: ILLEGAL_SASL_STATE, as Kafka answers.

use std::sync::Arc;

use kafka_protocol::messages::{SaslAuthenticateRequest, SaslAuthenticateResponse};
use kafka_protocol::protocol::StrBytes;

use crate::broker::Broker;
use crate::error::ApiError;
use crate::request_context::RequestContext;

pub async fn handle(
    _broker: &Arc<Broker>,
    _ctx: &RequestContext,
    _request: SaslAuthenticateRequest,
) -> SaslAuthenticateResponse {
    let error = ApiError::IllegalSaslState(
        "SaslAuthenticate request received after successful authentication or on a listener without SASL".into(),
    );
    SaslAuthenticateResponse::default()
        .with_error_code(error.code())
        .with_error_message(error.message().map(StrBytes::from_string))
}
