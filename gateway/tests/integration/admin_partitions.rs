//! CreatePartitions, DeleteRecords and the other admin APIs of issue 8
//! over the wire, against an in-process broker, and across a restart.

use crate::common;

use std::path::Path;

use bytes::Bytes;
use kafka_protocol::messages::alter_partition_reassignments_request::{
    ReassignablePartition, ReassignableTopic,
};
use kafka_protocol::messages::create_partitions_request::{
    CreatePartitionsAssignment, CreatePartitionsTopic,
};
use kafka_protocol::messages::delete_records_request::{
    DeleteRecordsPartition, DeleteRecordsTopic,
};
use kafka_protocol::messages::describe_log_dirs_request::DescribableLogDirTopic;
use kafka_protocol::messages::elect_leaders_request::TopicPartitions;
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    AlterPartitionReassignmentsRequest, ApiKey, ApiVersionsRequest, BrokerId,
    CreatePartitionsRequest, DeleteRecordsRequest, DescribeLogDirsRequest, ElectLeadersRequest,
    ListOffsetsRequest, ListPartitionReassignmentsRequest, MetadataRequest, ProduceRequest,
};
use tessera_gateway::broker::NewTopic;
use tessera_gateway::Running;
use tessera_log::batch::testing::make_batch;

use common::WireClient;

const TOPIC: &str = "grow";

const NONE: i16 = 0;
const OFFSET_OUT_OF_RANGE: i16 = 1;
const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
const INVALID_PARTITIONS: i16 = 37;
const INVALID_REPLICA_ASSIGNMENT: i16 = 39;
const POLICY_VIOLATION: i16 = 44;
const ELECTION_NOT_NEEDED: i16 = 84;
const NO_REASSIGNMENT_IN_PROGRESS: i16 = 85;

async fn start(dir: &Path) -> Running {
    tessera_gateway::start(common::test_config(dir, &[]))
        .await
        .unwrap()
}

async fn create_topic(running: &Running, topic: &str, partitions: u32, compact: bool) {
    let configs = if compact {
        [("cleanup.policy".to_string(), "compact".to_string())].into()
    } else {
        Default::default()
    };
    running
        .broker
        .create_topic(
            NewTopic {
                name: topic.into(),
                partitions,
                replication_factor: 1,
                configs,
            },
            false,
        )
        .await
        .unwrap();
}

/// Produces one batch of `count` records; its base offset.
async fn produce(client: &mut WireClient, topic: &str, partition: i32, count: i32) -> i64 {
    let request = ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(30_000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(common::topic_name(topic))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(partition)
                .with_records(Some(Bytes::from(make_batch(count, 1_000))))])]);
    let response = client.call(9, &request).await;
    let p = &response.responses[0].partition_responses[0];
    assert_eq!(p.error_code, NONE, "produce to {topic}-{partition}");
    p.base_offset
}

/// `(error, high watermark, log start, base offsets of the batches)`.
async fn fetch(client: &mut WireClient, partition: i32, offset: i64) -> (i16, i64, i64, Vec<i64>) {
    let response = client
        .call(12, &common::fetch_request(TOPIC, partition, offset))
        .await;
    let p = &response.responses[0].partitions[0];
    let bases = common::batch_bases(&p.records.clone().unwrap_or_default());
    (p.error_code, p.high_watermark, p.log_start_offset, bases)
}

/// ListOffsets of one partition at `timestamp`: `(error, offset)`.
async fn list_offset(client: &mut WireClient, partition: i32, timestamp: i64) -> (i16, i64) {
    let request = ListOffsetsRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_topics(vec![ListOffsetsTopic::default()
            .with_name(common::topic_name(TOPIC))
            .with_partitions(vec![ListOffsetsPartition::default()
                .with_partition_index(partition)
                .with_current_leader_epoch(-1)
                .with_timestamp(timestamp)])]);
    let response = client.call(7, &request).await;
    let p = &response.topics[0].partitions[0];
    (p.error_code, p.offset)
}

async fn partition_count(client: &mut WireClient) -> usize {
    let request = MetadataRequest::default().with_topics(Some(vec![
        MetadataRequestTopic::default().with_name(Some(common::topic_name(TOPIC))),
    ]));
    let response = client.call(12, &request).await;
    assert_eq!(response.topics[0].error_code, NONE);
    response.topics[0].partitions.len()
}

/// CreatePartitions of one topic: `(error, message)`.
async fn create_partitions(
    client: &mut WireClient,
    version: i16,
    topic: &str,
    count: i32,
    assignments: Option<Vec<Vec<i32>>>,
    validate_only: bool,
) -> (i16, Option<String>) {
    let request = CreatePartitionsRequest::default()
        .with_timeout_ms(30_000)
        .with_validate_only(validate_only)
        .with_topics(vec![CreatePartitionsTopic::default()
            .with_name(common::topic_name(topic))
            .with_count(count)
            .with_assignments(assignments.map(|a| {
                a.into_iter()
                    .map(|ids| {
                        CreatePartitionsAssignment::default()
                            .with_broker_ids(ids.into_iter().map(BrokerId).collect())
                    })
                    .collect()
            }))]);
    let response = client.call(version, &request).await;
    assert_eq!(response.results.len(), 1);
    let r = &response.results[0];
    assert_eq!(r.name.0.as_str(), topic);
    (
        r.error_code,
        r.error_message.as_ref().map(|m| m.to_string()),
    )
}

/// DeleteRecords of one topic: per partition `(error, low watermark)`.
async fn delete_records(
    client: &mut WireClient,
    version: i16,
    topic: &str,
    offsets: &[(i32, i64)],
) -> Vec<(i16, i64)> {
    let request = DeleteRecordsRequest::default()
        .with_timeout_ms(30_000)
        .with_topics(vec![DeleteRecordsTopic::default()
            .with_name(common::topic_name(topic))
            .with_partitions(
                offsets
                    .iter()
                    .map(|&(p, o)| {
                        DeleteRecordsPartition::default()
                            .with_partition_index(p)
                            .with_offset(o)
                    })
                    .collect(),
            )]);
    let response = client.call(version, &request).await;
    let t = &response.topics[0];
    assert_eq!(t.name.0.as_str(), topic);
    offsets
        .iter()
        .zip(&t.partitions)
        .map(|(&(p, _), r)| {
            assert_eq!(r.partition_index, p);
            (r.error_code, r.low_watermark)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_partitions_and_delete_records_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut running = start(dir.path()).await;
    create_topic(&running, TOPIC, 3, false).await;
    let mut client = WireClient::connect(running.kafka_addr).await;

    // Advertised, with the versions the crate knows.
    let versions = client.call(3, &ApiVersionsRequest::default()).await;
    for (api, max) in [
        (ApiKey::CreatePartitions, 3),
        (ApiKey::DeleteRecords, 2),
        (ApiKey::DescribeLogDirs, 4),
        (ApiKey::ElectLeaders, 2),
        (ApiKey::AlterPartitionReassignments, 1),
        (ApiKey::ListPartitionReassignments, 0),
    ] {
        let v = versions
            .api_keys
            .iter()
            .find(|k| k.api_key == api as i16)
            .unwrap_or_else(|| panic!("{api:?} advertised"));
        assert_eq!(v.max_version, max, "{api:?}");
    }

    for p in 0..3 {
        assert_eq!(produce(&mut client, TOPIC, p, 2).await, 0);
        assert_eq!(produce(&mut client, TOPIC, p, 3).await, 2);
    }
    let ranges_before = running
        .broker
        .image()
        .active_ranges(topic_id(&running))
        .len();

    // Kafka's refusals, at every version.
    for v in 0..=3 {
        assert_eq!(
            create_partitions(&mut client, v, TOPIC, 3, None, false).await,
            (
                INVALID_PARTITIONS,
                Some("Topic already has 3 partition(s).".into())
            )
        );
        assert_eq!(
            create_partitions(&mut client, v, TOPIC, 2, None, false).await,
            (
                INVALID_PARTITIONS,
                Some(
                    "The topic grow currently has 3 partition(s); 2 would not be an increase."
                        .into()
                )
            )
        );
        assert_eq!(
            create_partitions(&mut client, v, "nope", 4, None, false)
                .await
                .0,
            UNKNOWN_TOPIC_OR_PARTITION
        );
        let (code, message) =
            create_partitions(&mut client, v, TOPIC, 5, Some(vec![vec![1]]), false).await;
        assert_eq!(code, INVALID_REPLICA_ASSIGNMENT);
        assert_eq!(
            message.as_deref(),
            Some("Attempted to add 2 additional partition(s), but only 1 assignment(s) were specified.")
        );
        assert_eq!(
            create_partitions(&mut client, v, TOPIC, 4, Some(vec![vec![42]]), false)
                .await
                .0,
            INVALID_REPLICA_ASSIGNMENT
        );
        // validate_only: accepted, nothing written.
        assert_eq!(
            create_partitions(&mut client, v, TOPIC, 6, None, true).await,
            (NONE, None)
        );
    }
    assert_eq!(partition_count(&mut client).await, 3);
    assert_eq!(
        running
            .broker
            .image()
            .topic_by_name(TOPIC)
            .unwrap()
            .partitions,
        3
    );
    assert_eq!(
        running
            .broker
            .image()
            .active_ranges(topic_id(&running))
            .len(),
        ranges_before
    );

    // Grow to 6 (with a valid assignment: accepted, placement is ours).
    let node = running.broker.config().node_id;
    assert_eq!(
        create_partitions(
            &mut client,
            3,
            TOPIC,
            6,
            Some(vec![vec![node], vec![node], vec![node]]),
            false
        )
        .await,
        (NONE, None)
    );
    assert_eq!(partition_count(&mut client).await, 6);
    // The new partitions start at 0; the old ones continue where they were.
    for p in 3..6 {
        assert_eq!(fetch(&mut client, p, 0).await, (NONE, 0, 0, vec![]));
        assert_eq!(produce(&mut client, TOPIC, p, 4).await, 0);
        assert_eq!(produce(&mut client, TOPIC, p, 1).await, 4);
        assert_eq!(fetch(&mut client, p, 0).await, (NONE, 5, 0, vec![0, 4]));
    }
    for p in 0..3 {
        assert_eq!(fetch(&mut client, p, 0).await, (NONE, 5, 0, vec![0, 2]));
        assert_eq!(produce(&mut client, TOPIC, p, 1).await, 5);
    }

    // DeleteRecords.
    assert_eq!(
        delete_records(
            &mut client,
            2,
            TOPIC,
            &[(0, 3), (1, -1), (2, 7), (4, 4), (9, 1)]
        )
        .await,
        vec![
            (NONE, 3),
            (NONE, 6),
            (OFFSET_OUT_OF_RANGE, -1),
            (NONE, 4),
            (UNKNOWN_TOPIC_OR_PARTITION, -1)
        ]
    );
    // Never back; every version.
    for v in 0..=2 {
        assert_eq!(
            delete_records(&mut client, v, TOPIC, &[(0, 1)]).await,
            vec![(NONE, 3)]
        );
    }
    assert_eq!(
        delete_records(&mut client, 1, "nope", &[(0, 1)]).await,
        vec![(UNKNOWN_TOPIC_OR_PARTITION, -1)]
    );
    create_topic(&running, "compacted", 1, true).await;
    assert_eq!(
        delete_records(&mut client, 1, "compacted", &[(0, 0)]).await,
        vec![(POLICY_VIOLATION, -1)]
    );
    check_log_starts(&mut client).await;

    // DescribeLogDirs: the data directory, sizes per partition.
    let dirs = client
        .call(
            4,
            &DescribeLogDirsRequest::default().with_topics(Some(vec![
                DescribableLogDirTopic::default()
                    .with_topic(common::topic_name(TOPIC))
                    .with_partitions(vec![0, 3, 5, 99]),
            ])),
        )
        .await;
    assert_eq!(dirs.error_code, NONE);
    assert_eq!(dirs.results.len(), 1);
    let described = &dirs.results[0].topics[0];
    assert_eq!(described.name.0.as_str(), TOPIC);
    let sizes: Vec<(i32, i64)> = described
        .partitions
        .iter()
        .map(|p| (p.partition_index, p.partition_size))
        .collect();
    assert_eq!(sizes.iter().map(|s| s.0).collect::<Vec<_>>(), vec![0, 3, 5]);
    assert!(sizes.iter().all(|s| s.1 > 0), "{sizes:?}");
    assert!(dirs.results[0].total_bytes > 0);
    let all = client
        .call(1, &DescribeLogDirsRequest::default().with_topics(None))
        .await;
    assert!(all.results[0]
        .topics
        .iter()
        .any(|t| t.name.0.as_str() == TOPIC));

    // Leadership follows the range's active segment: nothing to elect or move.
    let elect = client
        .call(
            2,
            &ElectLeadersRequest::default()
                .with_election_type(0)
                .with_timeout_ms(30_000)
                .with_topic_partitions(Some(vec![TopicPartitions::default()
                    .with_topic(common::topic_name(TOPIC))
                    .with_partitions(vec![0, 4, 17])])),
        )
        .await;
    let codes: Vec<i16> = elect.replica_election_results[0]
        .partition_result
        .iter()
        .map(|r| r.error_code)
        .collect();
    assert_eq!(
        codes,
        vec![
            ELECTION_NOT_NEEDED,
            ELECTION_NOT_NEEDED,
            UNKNOWN_TOPIC_OR_PARTITION
        ]
    );
    let all = client
        .call(
            1,
            &ElectLeadersRequest::default()
                .with_election_type(1)
                .with_topic_partitions(None),
        )
        .await;
    assert!(all.replica_election_results.is_empty());
    let listed = client
        .call(
            0,
            &ListPartitionReassignmentsRequest::default().with_timeout_ms(30_000),
        )
        .await;
    assert_eq!((listed.error_code, listed.topics.len()), (NONE, 0));
    let alter = client
        .call(
            1,
            &AlterPartitionReassignmentsRequest::default()
                .with_timeout_ms(30_000)
                .with_allow_replication_factor_change(true)
                .with_topics(vec![ReassignableTopic::default()
                    .with_name(common::topic_name(TOPIC))
                    .with_partitions(vec![
                        ReassignablePartition::default().with_partition_index(0),
                        ReassignablePartition::default()
                            .with_partition_index(1)
                            .with_replicas(Some(vec![BrokerId(node)])),
                        ReassignablePartition::default()
                            .with_partition_index(2)
                            .with_replicas(Some(vec![BrokerId(77)])),
                        ReassignablePartition::default()
                            .with_partition_index(50)
                            .with_replicas(Some(vec![BrokerId(node)])),
                    ])]),
        )
        .await;
    let codes: Vec<i16> = alter.responses[0]
        .partitions
        .iter()
        .map(|p| p.error_code)
        .collect();
    assert_eq!(
        codes,
        vec![
            NO_REASSIGNMENT_IN_PROGRESS,
            NONE,
            INVALID_REPLICA_ASSIGNMENT,
            UNKNOWN_TOPIC_OR_PARTITION
        ]
    );

    // Both survive a restart.
    drop(client);
    running.shutdown().await;
    running = start(dir.path()).await;
    let mut client = WireClient::connect(running.kafka_addr).await;
    assert_eq!(partition_count(&mut client).await, 6);
    check_log_starts(&mut client).await;
    for p in 3..6 {
        let (error, hw, _, _) = fetch(&mut client, p, 4).await;
        assert_eq!((error, hw), (NONE, 5));
        assert_eq!(produce(&mut client, TOPIC, p, 1).await, 5);
    }
    assert_eq!(produce(&mut client, TOPIC, 0, 1).await, 6);
    running.shutdown().await;
}

/// What DeleteRecords left: partition 0 starts at 3, 1 at 6, 4 at 4.
async fn check_log_starts(client: &mut WireClient) {
    for (p, start) in [(0, 3), (1, 6), (2, 0), (3, 0), (4, 4), (5, 0)] {
        assert_eq!(
            list_offset(client, p, -2).await,
            (NONE, start),
            "earliest of {p}"
        );
        if start > 0 {
            let (error, _, log_start, _) = fetch(client, p, start - 1).await;
            assert_eq!(
                (error, log_start),
                (OFFSET_OUT_OF_RANGE, -1),
                "fetch below the start of {p}"
            );
        }
        let (error, _, log_start, _) = fetch(client, p, start).await;
        assert_eq!(
            (error, log_start),
            (NONE, start),
            "fetch at the start of {p}"
        );
    }
    // A timestamp search does not return a record below the start.
    let (error, offset) = list_offset(client, 0, 0).await;
    assert_eq!(error, NONE);
    assert!(offset >= 3, "timestamp lookup found {offset}");
}

fn topic_id(running: &Running) -> uuid::Uuid {
    running.broker.image().topic_by_name(TOPIC).unwrap().id
}
