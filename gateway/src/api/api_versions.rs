//! ApiVersions: advertise exactly what `SUPPORTED_APIS` lists.

use std::sync::Arc;

use bytes::Bytes;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::{ApiKey, ApiVersionsRequest, ApiVersionsResponse};

use super::SUPPORTED_APIS;
use crate::broker::Broker;
use crate::request_context::RequestContext;
use crate::wire::encode_response;

fn api_list() -> Vec<ApiVersion> {
    SUPPORTED_APIS
        .iter()
        .map(|(k, lo, hi)| {
            ApiVersion::default()
                .with_api_key(*k as i16)
                .with_min_version(*lo)
                .with_max_version(*hi)
        })
        .collect()
}

pub async fn handle(
    _broker: &Arc<Broker>,
    _ctx: &RequestContext,
    _request: ApiVersionsRequest,
) -> ApiVersionsResponse {
    // Supported/finalized features are left empty: they are tagged fields that
    // old librdkafka (2.0.x, Debian's kcat) mis-parses, and we gate nothing on them.
    ApiVersionsResponse::default().with_api_keys(api_list())
}

/// The v0 answer to an ApiVersions request in a version we do not support.
pub fn unsupported_version_response(correlation_id: i32) -> Bytes {
    let body = ApiVersionsResponse::default()
        .with_error_code(ResponseError::UnsupportedVersion.code())
        .with_api_keys(api_list());
    encode_response(ApiKey::ApiVersions, 0, correlation_id, &body)
}
