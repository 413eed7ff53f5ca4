//! CreateTopics: validate each topic as Kafka does, then commit it (a topic
//! record, its first range and that range's first segment) to the metadata log.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use kafka_protocol::messages::create_topics_response::{
    CreatableTopicConfigs, CreatableTopicResult,
};
use kafka_protocol::messages::{CreateTopicsRequest, CreateTopicsResponse};
use kafka_protocol::protocol::StrBytes;

use crate::authz::Authz;
use crate::broker::{Broker, NewTopic};
use crate::error::ApiError;
use crate::request_context::RequestContext;
use crate::topic_config::{describe_topic_configs, validate_topic_configs};

pub async fn handle(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    request: CreateTopicsRequest,
) -> CreateTopicsResponse {
    let version = ctx.version();
    let mut seen = HashSet::new();
    let duplicates: HashSet<String> = request
        .topics
        .iter()
        .filter(|t| !seen.insert(t.name.0.to_string()))
        .map(|t| t.name.0.to_string())
        .collect();
    let mut results = Vec::with_capacity(request.topics.len());
    // Kafka: CREATE on the cluster or on the topic.
    let authz = Authz::of(broker, ctx);
    for topic in request.topics {
        let name = topic.name.0.to_string();
        let mut result = CreatableTopicResult::default().with_name(topic.name.clone());
        let outcome = if duplicates.contains(&name) {
            Err(ApiError::InvalidRequest(format!(
                "create topics request had topic {name:?} more than once"
            )))
        } else if !authz.may_create_topic(&name) {
            Err(ApiError::TopicAuthorizationFailed)
        } else {
            create_one(broker, &topic, request.validate_only).await
        };
        match outcome {
            Ok(created) => {
                result = result
                    .with_topic_id(if request.validate_only {
                        uuid::Uuid::nil()
                    } else {
                        created.id
                    })
                    .with_num_partitions(created.partitions as i32)
                    .with_replication_factor(created.replication_factor);
                if version >= 5 {
                    result = result.with_configs(Some(describe_configs(broker, &created.configs)));
                }
            }
            Err(e) => {
                result = result
                    .with_error_code(e.code())
                    .with_error_message(e.message().map(StrBytes::from_string))
                    .with_num_partitions(-1)
                    .with_replication_factor(-1);
            }
        }
        results.push(result);
    }
    CreateTopicsResponse::default().with_topics(results)
}

async fn create_one(
    broker: &Arc<Broker>,
    topic: &kafka_protocol::messages::create_topics_request::CreatableTopic,
    validate_only: bool,
) -> Result<Arc<tessera_metadata::TopicImage>, ApiError> {
    let configs = validate_topic_configs(
        topic
            .configs
            .iter()
            .map(|c| (c.name.to_string(), c.value.as_ref().map(|v| v.to_string()))),
    )?;
    let (partitions, replication_factor) = if topic.assignments.is_empty() {
        let partitions = if topic.num_partitions == -1 {
            broker.config().num_partitions as i32
        } else {
            topic.num_partitions
        };
        let rf = if topic.replication_factor == -1 {
            broker.config().default_replication_factor
        } else {
            topic.replication_factor
        };
        (partitions, rf)
    } else {
        // Manual assignment: Kafka requires -1 for both counts, and every
        // partition listed once with the same replica count on known brokers.
        if topic.num_partitions != -1 || topic.replication_factor != -1 {
            return Err(ApiError::InvalidRequest(
                "both numPartitions and replicationFactor must be -1 when replica assignments are given".into(),
            ));
        }
        let image = broker.image();
        let rf = topic.assignments[0].broker_ids.len();
        for (i, a) in topic.assignments.iter().enumerate() {
            if a.partition_index != i as i32 {
                return Err(ApiError::InvalidReplicaAssignment(
                    "partitions must be consecutive from 0".into(),
                ));
            }
            if a.broker_ids.len() != rf || rf == 0 {
                return Err(ApiError::InvalidReplicaAssignment(
                    "all partitions need the same number of replicas".into(),
                ));
            }
            if let Some(unknown) = a
                .broker_ids
                .iter()
                .find(|b| !image.brokers.contains_key(&b.0))
            {
                return Err(ApiError::InvalidReplicaAssignment(format!(
                    "unknown broker {}",
                    unknown.0
                )));
            }
        }
        (topic.assignments.len() as i32, rf as i16)
    };
    if partitions <= 0 {
        return Err(ApiError::InvalidPartitions(
            "number of partitions must be larger than 0".into(),
        ));
    }
    let assignments = (!topic.assignments.is_empty()).then(|| {
        topic
            .assignments
            .iter()
            .map(|a| a.broker_ids.iter().map(|b| b.0).collect())
            .collect()
    });
    broker
        .create_topic_assigned(
            NewTopic {
                name: topic.name.0.to_string(),
                partitions: partitions as u32,
                replication_factor,
                configs,
            },
            assignments,
            validate_only,
        )
        .await
}

/// The topic's configs as CreateTopics v5+ reports them.
fn describe_configs(
    broker: &Broker,
    topic: &BTreeMap<String, String>,
) -> Vec<CreatableTopicConfigs> {
    let image = broker.image();
    describe_topic_configs(
        topic,
        &crate::dynamic_config::BrokerView::new(broker.config(), &image),
    )
    .into_iter()
    .map(|c| {
        CreatableTopicConfigs::default()
            .with_name(super::config_name(c.name))
            .with_value(Some(StrBytes::from_string(c.value)))
            .with_config_source(c.source)
    })
    .collect()
}
