//! Metadata: brokers, and per topic the leader of every partition (the
//! primary of the active segment of the range that covers it).

use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{BrokerId, MetadataRequest, MetadataResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use tessera_metadata::{MetadataImage, TopicImage};

use super::describe_cluster::AUTHORIZED_OPERATIONS_OMITTED;
use crate::authz::{Authz, Op, Resource};
use crate::broker::Broker;
use crate::error::ApiError;
use crate::request_context::RequestContext;
use crate::topic_config::validate_topic_name;

pub async fn handle(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    request: MetadataRequest,
) -> MetadataResponse {
    let version = ctx.version();
    // v0: an empty list means all topics; v1+: null means all, empty means none.
    let all_topics = request.topics.is_none()
        || (version == 0 && request.topics.as_ref().is_some_and(Vec::is_empty));
    // Before v4 there is no flag and Kafka auto-creates when the broker allows it.
    let allow_auto_create =
        broker.config().auto_create_topics && (version < 4 || request.allow_auto_topic_creation);
    // Authorized operations exist for topics from v8, for the cluster in v8-v10.
    let authz = Authz::of(broker, ctx);
    let with_topic_ops = request.include_topic_authorized_operations && version >= 8;
    let topic_ops = |name: &str| {
        if with_topic_ops {
            authz.operations(Resource::Topic, name)
        } else {
            AUTHORIZED_OPERATIONS_OMITTED
        }
    };

    let mut topics = Vec::new();
    if all_topics {
        // Kafka leaves out the topics the client may not DESCRIBE.
        let image = broker.image();
        for topic in image.topics.values() {
            if authz.may(Op::Describe, Resource::Topic, &topic.name) {
                topics.push(describe_topic(&image, topic, topic_ops(&topic.name)));
            }
        }
    } else {
        for wanted in request.topics.unwrap_or_default() {
            let image = broker.image();
            let found = match &wanted.name {
                Some(name) => image.topic_by_name(name).cloned(),
                None => image.topics.get(&wanted.topic_id).cloned(),
            };
            // Kafka: DESCRIBE on a named topic (TOPIC_AUTHORIZATION_FAILED),
            // and to auto-create it CREATE on the cluster or the topic (by
            // id too: Kafka deems ids not sensitive).
            let described = |name: &str| authz.allows(Op::Describe, Resource::Topic, name);
            let topic = match (found, &wanted.name) {
                (Some(t), _) if !described(&t.name) => Err(ApiError::TopicAuthorizationFailed),
                (Some(t), _) => Ok(t),
                (None, Some(name)) if !described(name) => Err(ApiError::TopicAuthorizationFailed),
                (None, Some(name)) => match validate_topic_name(name) {
                    Err(e) => Err(e),
                    Ok(()) if allow_auto_create && !authz.may_create_topic(name) => {
                        Err(ApiError::TopicAuthorizationFailed)
                    }
                    Ok(()) if allow_auto_create => broker.auto_create_topic(name).await,
                    Ok(()) => Err(ApiError::UnknownTopicOrPartition),
                },
                (None, None) => Err(ApiError::UnknownTopicId),
            };
            match topic {
                Ok(t) => topics.push(describe_topic(&broker.image(), &t, topic_ops(&t.name))),
                Err(e) => topics.push(
                    MetadataResponseTopic::default()
                        .with_error_code(e.code())
                        .with_name(wanted.name.clone())
                        .with_topic_id(wanted.topic_id)
                        .with_topic_authorized_operations(
                            wanted
                                .name
                                .as_deref()
                                .map(|n| topic_ops(n))
                                .unwrap_or(AUTHORIZED_OPERATIONS_OMITTED),
                        ),
                ),
            }
        }
    }

    let image = broker.image();
    let brokers = image
        .brokers
        .values()
        .filter(|b| !b.fenced)
        .map(|b| {
            let (host, port) = broker.endpoint(ctx.listener(), &b.registration);
            MetadataResponseBroker::default()
                .with_node_id(BrokerId(b.registration.broker_id))
                .with_host(StrBytes::from_string(host))
                .with_port(port)
                .with_rack(b.registration.rack.clone().map(StrBytes::from_string))
        })
        .collect();
    MetadataResponse::default()
        .with_brokers(brokers)
        .with_cluster_id(Some(StrBytes::from_string(broker.cluster_id().to_string())))
        .with_controller_id(BrokerId(broker.controller_id()))
        .with_topics(topics)
        .with_cluster_authorized_operations(
            if request.include_cluster_authorized_operations && (8..=10).contains(&version) {
                authz.operations(Resource::Cluster, crate::authz::CLUSTER_NAME)
            } else {
                AUTHORIZED_OPERATIONS_OMITTED
            },
        )
}

/// One topic's partitions, walking its active ranges rather than its
/// partitions one by one against the image.
pub fn describe_topic(
    image: &MetadataImage,
    topic: &TopicImage,
    topic_ops: i32,
) -> MetadataResponseTopic {
    let mut partitions = Vec::with_capacity(topic.partitions as usize);
    for range in image.active_ranges(topic.id) {
        let segment = image.active_segment(range.id);
        for p in range.lo..range.hi {
            let partition = match &segment {
                Some(seg) => {
                    // A fenced broker (its session expired) leads nothing:
                    // Kafka answers LEADER_NOT_AVAILABLE with leader -1 and
                    // lists it among the offline replicas.
                    let live = |id: &i32| image.brokers.get(id).is_some_and(|b| !b.fenced);
                    let replicas: Vec<BrokerId> =
                        seg.replicas.iter().map(|r| BrokerId(*r)).collect();
                    // The replicas its primary reports in sync (all until
                    // one falls behind for `replica.lag.time.max.ms`),
                    // live ones only.
                    let isr: Vec<BrokerId> = seg
                        .in_sync
                        .as_ref()
                        .unwrap_or(&seg.replicas)
                        .iter()
                        .filter(|r| live(r))
                        .map(|r| BrokerId(*r))
                        .collect();
                    let offline: Vec<BrokerId> = seg
                        .replicas
                        .iter()
                        .filter(|r| !live(r))
                        .map(|r| BrokerId(*r))
                        .collect();
                    let leader = seg.primary().filter(live);
                    MetadataResponsePartition::default()
                        .with_partition_index(p as i32)
                        .with_error_code(if leader.is_some() {
                            0
                        } else {
                            ResponseError::LeaderNotAvailable.code()
                        })
                        .with_leader_id(BrokerId(leader.unwrap_or(-1)))
                        .with_leader_epoch(seg.leader_epoch)
                        .with_isr_nodes(isr)
                        .with_replica_nodes(replicas)
                        .with_offline_replicas(offline)
                }
                None => MetadataResponsePartition::default()
                    .with_partition_index(p as i32)
                    .with_error_code(ResponseError::LeaderNotAvailable.code())
                    .with_leader_id(BrokerId(-1)),
            };
            partitions.push(partition);
        }
    }
    // A partition no active range covers yet (a concurrent creation whose
    // range ids another plan took, covered moments later) is still listed,
    // LEADER_NOT_AVAILABLE as Kafka lists a partition without a leader:
    // the client learns the partition count from the first answer.
    let covered: std::collections::BTreeSet<i32> =
        partitions.iter().map(|p| p.partition_index).collect();
    for p in 0..topic.partitions as i32 {
        if !covered.contains(&p) {
            partitions.push(
                MetadataResponsePartition::default()
                    .with_partition_index(p)
                    .with_error_code(ResponseError::LeaderNotAvailable.code())
                    .with_leader_id(BrokerId(-1)),
            );
        }
    }
    partitions.sort_by_key(|p| p.partition_index);
    MetadataResponseTopic::default()
        .with_name(Some(TopicName(StrBytes::from_string(topic.name.clone()))))
        .with_topic_id(topic.id)
        .with_is_internal(crate::internal_topics::is_internal(&topic.name))
        .with_partitions(partitions)
        .with_topic_authorized_operations(topic_ops)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_metadata::{
        BrokerRegistration, MetadataRecord, RangeRecord, SegmentId, SegmentOpenRecord, TopicRecord,
    };

    #[test]
    fn partitions_no_range_covers_yet_are_listed_without_a_leader() {
        let topic_id = uuid::Uuid::from_u128(7);
        let mut image = MetadataImage::default();
        let records = [
            MetadataRecord::RegisterBroker(BrokerRegistration {
                broker_id: 1,
                incarnation_id: uuid::Uuid::from_u128(1),
                host: "h".into(),
                port: 1,
                rack: None,
            }),
            MetadataRecord::UnfenceBroker { broker_id: 1 },
            MetadataRecord::CreateTopic(TopicRecord {
                topic_id,
                name: "t".into(),
                partitions: 4,
                replication_factor: 1,
                configs: Default::default(),
            }),
            // Only [0, 2) has a range: [2, 4)'s was taken by another plan.
            MetadataRecord::CreateRange(RangeRecord {
                range_id: 1,
                topic_id,
                lo: 0,
                hi: 2,
                parents: vec![],
            }),
            MetadataRecord::OpenSegment(SegmentOpenRecord {
                segment: SegmentId::new(1, 0),
                replicas: vec![1],
                leader_epoch: 0,
            }),
        ];
        for (i, r) in records.iter().enumerate() {
            image.apply(r, i as i64 + 1);
        }
        let topic = image.topics[&topic_id].clone();
        let described = describe_topic(&image, &topic, 0);
        let listed: Vec<(i32, i16)> = described
            .partitions
            .iter()
            .map(|p| (p.partition_index, p.error_code))
            .collect();
        let lna = ResponseError::LeaderNotAvailable.code();
        assert_eq!(listed, vec![(0, 0), (1, 0), (2, lna), (3, lna)]);
        assert!(described.partitions[2..]
            .iter()
            .all(|p| p.leader_id.0 == -1));
    }
}
