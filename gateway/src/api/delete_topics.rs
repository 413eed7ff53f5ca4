//! DeleteTopics: by name (v1-v5) or by id (v6). The topic leaves the
//! metadata log first; its range logs are then closed and their files removed.

use std::sync::Arc;

use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::{DeleteTopicsRequest, DeleteTopicsResponse, TopicName};
use kafka_protocol::protocol::StrBytes;

use crate::authz::{Authz, Op};
use crate::broker::Broker;
use crate::error::ApiError;
use crate::request_context::RequestContext;

pub async fn handle(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    request: DeleteTopicsRequest,
) -> DeleteTopicsResponse {
    // v6 names topics in `topics` (by name or id); earlier versions in `topic_names`.
    let wanted: Vec<(Option<TopicName>, uuid::Uuid)> = if ctx.version() >= 6 {
        request
            .topics
            .iter()
            .map(|t| (t.name.clone(), t.topic_id))
            .collect()
    } else {
        request
            .topic_names
            .iter()
            .map(|n| (Some(n.clone()), uuid::Uuid::nil()))
            .collect()
    };
    let mut responses = Vec::with_capacity(wanted.len());
    // Kafka: DELETE on each topic.
    let authz = Authz::of(broker, ctx);
    for (name, id) in wanted {
        let image = broker.image();
        let found = match &name {
            Some(n) => image
                .topic_by_name(n)
                .cloned()
                .ok_or(ApiError::UnknownTopicOrPartition),
            None => image
                .topics
                .get(&id)
                .cloned()
                .ok_or(ApiError::UnknownTopicId),
        };
        let found = match (found, &name) {
            (Err(_), Some(n)) if authz.topic(Op::Delete, n).is_err() => {
                Err(ApiError::TopicAuthorizationFailed)
            }
            (Ok(t), _) if authz.topic(Op::Delete, &t.name).is_err() => {
                Err(ApiError::TopicAuthorizationFailed)
            }
            (found, _) => found,
        };
        let outcome = match found {
            Ok(topic) => broker.delete_topic(topic.id).await.map(|_| topic),
            Err(e) => Err(e),
        };
        let result = match outcome {
            Ok(topic) => DeletableTopicResult::default()
                .with_name(Some(TopicName(StrBytes::from_string(topic.name.clone()))))
                .with_topic_id(topic.id),
            Err(e) => DeletableTopicResult::default()
                .with_name(name)
                .with_topic_id(id)
                .with_error_code(e.code())
                .with_error_message(e.message().map(StrBytes::from_string)),
        };
        responses.push(result);
    }
    DeleteTopicsResponse::default().with_responses(responses)
}
