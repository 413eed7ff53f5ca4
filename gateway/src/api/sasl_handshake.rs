//! SaslHandshake (v0-1). On a SASL listener the handshake is answered by
//! the connection's authenticator (`sasl::Authenticator`) before anything
//! else is served; a handshake that reaches this handler came on a
//! listener without SASL or after authentication, and gets Kafka's answer
//! from `KafkaApis`: ILLEGAL_SASL_STATE.

use std::sync::Arc;

use kafka_protocol::messages::{SaslHandshakeRequest, SaslHandshakeResponse};

use crate::broker::Broker;
use crate::error::ApiError;
use crate::request_context::RequestContext;

pub async fn handle(
    _broker: &Arc<Broker>,
    _ctx: &RequestContext,
    _request: SaslHandshakeRequest,
) -> SaslHandshakeResponse {
    SaslHandshakeResponse::default().with_error_code(
        ApiError::IllegalSaslState("SaslHandshake request is not expected now".into()).code(),
    )
}
