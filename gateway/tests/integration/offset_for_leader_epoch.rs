//! OffsetForLeaderEpoch over the wire, against an in-process broker whose
//! partitions go through segment rolls, splits and a merge (each move bumps
//! the leader epoch), and a restart. Every answer is checked against the
//! epochs actually stamped into the stored batches, read back with Fetch.

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;

use bytes::Bytes;
use kafka_protocol::messages::offset_for_leader_epoch_request::{
    OffsetForLeaderPartition, OffsetForLeaderTopic,
};
use kafka_protocol::messages::offset_for_leader_epoch_response::EpochEndOffset;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{BrokerId, OffsetForLeaderEpochRequest, ProduceRequest};
use tessera_gateway::broker::NewTopic;
use tessera_gateway::Running;
use tessera_log::batch::{self, testing::make_batch};
use tessera_metadata::RangeId;

use common::WireClient;

const TOPIC: &str = "epochs";
const PARTITIONS: u32 = 8;
const VERSIONS: std::ops::RangeInclusive<i16> = 2..=4;

const NONE: i16 = 0;
const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
const FENCED_LEADER_EPOCH: i16 = 74;
const UNKNOWN_LEADER_EPOCH: i16 = 75;

async fn start(dir: &Path) -> Running {
    tessera_gateway::start(common::test_config(dir, &[common::NO_TIME_RETENTION]))
        .await
        .unwrap()
}

/// Produces `batches` batches of 3 records to `partition` (acks=-1).
async fn produce(client: &mut WireClient, partition: i32, batches: usize) {
    for i in 0..batches {
        let request = ProduceRequest::default()
            .with_acks(-1)
            .with_timeout_ms(30_000)
            .with_topic_data(vec![TopicProduceData::default()
                .with_name(common::topic_name(TOPIC))
                .with_partition_data(vec![PartitionProduceData::default()
                    .with_index(partition)
                    .with_records(Some(Bytes::from(make_batch(3, 1_000 + i as i64))))])]);
        let response = client.call(9, &request).await;
        let p = &response.responses[0].partition_responses[0];
        assert_eq!(p.error_code, NONE, "produce to partition {partition}");
    }
}

/// One OffsetForLeaderEpoch for one partition.
async fn ask(
    client: &mut WireClient,
    version: i16,
    topic: &str,
    partition: i32,
    current_leader_epoch: i32,
    leader_epoch: i32,
) -> EpochEndOffset {
    let request = OffsetForLeaderEpochRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_topics(vec![OffsetForLeaderTopic::default()
            .with_topic(common::topic_name(topic))
            .with_partitions(vec![OffsetForLeaderPartition::default()
                .with_partition(partition)
                .with_current_leader_epoch(current_leader_epoch)
                .with_leader_epoch(leader_epoch)])]);
    let response = client.call(version, &request).await;
    assert_eq!(response.topics.len(), 1);
    assert_eq!(response.topics[0].topic.0.as_str(), topic);
    assert_eq!(response.topics[0].partitions.len(), 1);
    let answer = response.topics[0].partitions[0].clone();
    assert_eq!(answer.partition, partition);
    answer
}

/// `(leader epoch, end offset)`, which must come without an error.
async fn end_offset(
    client: &mut WireClient,
    version: i16,
    partition: i32,
    current_leader_epoch: i32,
    leader_epoch: i32,
) -> (i32, i64) {
    let a = ask(
        client,
        version,
        TOPIC,
        partition,
        current_leader_epoch,
        leader_epoch,
    )
    .await;
    assert_eq!(
        a.error_code, NONE,
        "v{version} partition {partition} epoch {leader_epoch}"
    );
    (a.leader_epoch, a.end_offset)
}

/// Every stored batch of `partition` as `(partition leader epoch, base
/// offset, last offset)`, fetched over the wire; and the high watermark.
async fn stored_batches(client: &mut WireClient, partition: i32) -> (Vec<(i32, i64, i64)>, i64) {
    let mut out = Vec::new();
    let mut offset = 0;
    loop {
        let request = common::fetch_request(TOPIC, partition, offset);
        let response = client.call(12, &request).await;
        let p = &response.responses[0].partitions[0];
        assert_eq!(
            p.error_code, NONE,
            "fetch partition {partition} at {offset}"
        );
        let records = p.records.clone().unwrap_or_default();
        if offset >= p.high_watermark {
            return (out, p.high_watermark);
        }
        assert!(!records.is_empty(), "no data at {offset}");
        for range in batch::split_batches(&records).unwrap() {
            let h = batch::validate(&records[range]).unwrap();
            out.push((h.partition_leader_epoch, h.base_offset, h.last_offset()));
            offset = h.last_offset() + 1;
        }
    }
}

/// What Kafka's leader answers for `requested`, worked out from the stored
/// batches themselves: an epoch's end is the first offset of the next
/// larger epoch holding data, or the log end for the current epoch.
fn expected(batches: &[(i32, i64, i64)], current: i32, log_end: i64, requested: i32) -> (i32, i64) {
    let mut starts: BTreeMap<i32, i64> = BTreeMap::new();
    for &(epoch, base, _) in batches {
        starts.entry(epoch).or_insert(base);
    }
    starts.entry(current).or_insert(log_end);
    if requested == -1 {
        return (-1, -1);
    }
    if requested == current {
        return (current, log_end);
    }
    let Some((_, &end)) = starts.range(requested + 1..).next() else {
        return (-1, -1);
    };
    match starts.range(..=requested).next_back() {
        Some((&floor, _)) => (floor, end),
        None => (requested, end),
    }
}

/// Checks every epoch from -1 to two past the current one, at every
/// version, for every partition, against the stored batches.
async fn check_against_stored(client: &mut WireClient, current: &BTreeMap<i32, i32>) {
    for p in 0..PARTITIONS as i32 {
        let (batches, log_end) = stored_batches(client, p).await;
        let now = current[&p];
        for requested in -1..=now + 2 {
            let want = expected(&batches, now, log_end, requested);
            for v in VERSIONS {
                assert_eq!(
                    end_offset(client, v, p, now, requested).await,
                    want,
                    "v{v} partition {p} epoch {requested} (current {now}); batches {batches:?}"
                );
            }
        }
        // Every stored batch lies inside the epoch it carries.
        for &(epoch, _, last) in &batches {
            let (e, end) = end_offset(client, 4, p, -1, epoch).await;
            assert_eq!(e, epoch, "partition {p}");
            assert!(
                last < end,
                "partition {p}: batch at {last} of epoch {epoch} ends past {end}"
            );
        }
    }
}

fn current_epochs(running: &Running) -> BTreeMap<i32, i32> {
    let image = running.broker.image();
    let topic = image.topic_by_name(TOPIC).unwrap().clone();
    (0..PARTITIONS as i32)
        .map(|p| {
            (
                p,
                running
                    .broker
                    .route(&image, &topic, p)
                    .unwrap()
                    .leader_epoch,
            )
        })
        .collect()
}

fn active_range(running: &Running, partition: u32) -> RangeId {
    let image = running.broker.image();
    let topic = image.topic_by_name(TOPIC).unwrap();
    image.active_range_for(topic.id, partition).unwrap().id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn end_offsets_follow_epochs_across_rolls_splits_merges_and_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let mut running = start(dir.path()).await;
    running
        .broker
        .create_topic(
            NewTopic {
                name: TOPIC.into(),
                partitions: PARTITIONS,
                replication_factor: 1,
                // Small segments: every partition's data spans many rolls.
                configs: [("segment.bytes".to_string(), "300".to_string())].into(),
            },
            false,
        )
        .await
        .unwrap();
    let mut client = WireClient::connect(running.kafka_addr).await;

    // Epoch 0: one range.
    produce(&mut client, 0, 4).await;
    produce(&mut client, 5, 2).await;
    assert!(running.broker.segment_count() > 1, "the segments rolled");
    for v in VERSIONS {
        assert_eq!(end_offset(&mut client, v, 0, 0, 0).await, (0, 12));
        assert_eq!(end_offset(&mut client, v, 5, 0, 0).await, (0, 6));
        assert_eq!(end_offset(&mut client, v, 3, 0, 0).await, (0, 0));
    }

    // Split [0, 8) at 4: both children at epoch 1, no data in it yet.
    let root = active_range(&running, 0);
    running.broker.split_range(root, Some(4)).await.unwrap();
    for v in VERSIONS {
        assert_eq!(end_offset(&mut client, v, 0, 1, 0).await, (0, 12));
        assert_eq!(end_offset(&mut client, v, 0, 1, 1).await, (1, 12));
    }
    produce(&mut client, 0, 2).await;
    produce(&mut client, 5, 3).await;
    for v in VERSIONS {
        assert_eq!(end_offset(&mut client, v, 0, 1, 0).await, (0, 12));
        assert_eq!(end_offset(&mut client, v, 0, 1, 1).await, (1, 18));
        assert_eq!(end_offset(&mut client, v, 5, 1, 0).await, (0, 6));
        assert_eq!(end_offset(&mut client, v, 5, 1, 1).await, (1, 15));
        // No current_leader_epoch: no fencing.
        assert_eq!(end_offset(&mut client, v, 0, -1, 1).await, (1, 18));
    }

    // Split [4, 8) at 6 (epoch 2), then merge [0, 4) (epoch 1) with
    // [4, 6) (epoch 2): the merged range is at epoch 3.
    let right = active_range(&running, 5);
    running.broker.split_range(right, Some(6)).await.unwrap();
    produce(&mut client, 5, 1).await;
    produce(&mut client, 7, 2).await;
    let (left, mid) = (active_range(&running, 0), active_range(&running, 4));
    running.broker.merge_ranges(left, mid).await.unwrap();
    produce(&mut client, 0, 1).await;
    produce(&mut client, 5, 2).await;
    let current = current_epochs(&running);
    assert_eq!(current[&0], 3);
    assert_eq!(current[&5], 3);
    assert_eq!(current[&7], 2);
    for v in VERSIONS {
        // Partition 0 never had epoch 2: its epoch 1 ends where 3 starts.
        assert_eq!(end_offset(&mut client, v, 0, 3, 1).await, (1, 18));
        assert_eq!(end_offset(&mut client, v, 0, 3, 2).await, (1, 18));
        assert_eq!(end_offset(&mut client, v, 0, 3, 3).await, (3, 21));
        assert_eq!(end_offset(&mut client, v, 5, 3, 1).await, (1, 15));
        assert_eq!(end_offset(&mut client, v, 5, 3, 2).await, (2, 18));
        assert_eq!(end_offset(&mut client, v, 5, 3, 3).await, (3, 24));
        // Partition 7: no data before epoch 2. Below the first epoch Kafka
        // answers the requested epoch with the first epoch's start.
        assert_eq!(end_offset(&mut client, v, 7, 2, 0).await, (0, 0));
        assert_eq!(end_offset(&mut client, v, 7, 2, 2).await, (2, 6));
        // Above the current epoch: undefined, without an error.
        assert_eq!(end_offset(&mut client, v, 0, -1, 4).await, (-1, -1));
    }
    check_against_stored(&mut client, &current).await;

    // The answers come from the image and the logs: a restart keeps them.
    drop(client);
    running.shutdown().await;
    running = start(dir.path()).await;
    let mut client = WireClient::connect(running.kafka_addr).await;
    assert_eq!(current_epochs(&running), current);
    check_against_stored(&mut client, &current).await;
    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_kafkas() {
    let dir = tempfile::tempdir().unwrap();
    let running = start(dir.path()).await;
    running
        .broker
        .create_topic(
            NewTopic {
                name: TOPIC.into(),
                partitions: PARTITIONS,
                replication_factor: 1,
                configs: Default::default(),
            },
            false,
        )
        .await
        .unwrap();
    let mut client = WireClient::connect(running.kafka_addr).await;
    produce(&mut client, 1, 2).await;
    let root = active_range(&running, 0);
    running.broker.split_range(root, None).await.unwrap();
    produce(&mut client, 1, 1).await;

    for v in VERSIONS {
        let undefined = |a: &EpochEndOffset| (a.leader_epoch, a.end_offset) == (-1, -1);
        let a = ask(&mut client, v, "no-such-topic", 0, -1, 0).await;
        assert_eq!(a.error_code, UNKNOWN_TOPIC_OR_PARTITION);
        assert!(undefined(&a));
        let a = ask(&mut client, v, TOPIC, PARTITIONS as i32, -1, 0).await;
        assert_eq!(a.error_code, UNKNOWN_TOPIC_OR_PARTITION);
        let a = ask(&mut client, v, TOPIC, -1, -1, 0).await;
        assert_eq!(a.error_code, UNKNOWN_TOPIC_OR_PARTITION);
        // The client's current leader epoch is older than the split's.
        let a = ask(&mut client, v, TOPIC, 1, 0, 0).await;
        assert_eq!(a.error_code, FENCED_LEADER_EPOCH);
        assert!(undefined(&a));
        // ... or newer than any the broker knows.
        let a = ask(&mut client, v, TOPIC, 1, 2, 0).await;
        assert_eq!(a.error_code, UNKNOWN_LEADER_EPOCH);
        assert!(undefined(&a));
        // At the current epoch it is answered.
        let a = ask(&mut client, v, TOPIC, 1, 1, 0).await;
        assert_eq!((a.error_code, a.leader_epoch, a.end_offset), (NONE, 0, 6));
        // An undefined requested epoch: undefined, no error.
        let a = ask(&mut client, v, TOPIC, 1, 1, -1).await;
        assert_eq!(a.error_code, NONE);
        assert!(undefined(&a));
    }

    // Several topics and partitions in one request: answered in order, each
    // on its own.
    let request = OffsetForLeaderEpochRequest::default()
        .with_replica_id(BrokerId(-2))
        .with_topics(vec![
            OffsetForLeaderTopic::default()
                .with_topic(common::topic_name(TOPIC))
                .with_partitions(vec![
                    OffsetForLeaderPartition::default()
                        .with_partition(1)
                        .with_current_leader_epoch(1)
                        .with_leader_epoch(1),
                    OffsetForLeaderPartition::default()
                        .with_partition(1)
                        .with_current_leader_epoch(0)
                        .with_leader_epoch(0),
                    OffsetForLeaderPartition::default()
                        .with_partition(6)
                        .with_current_leader_epoch(1)
                        .with_leader_epoch(0),
                ]),
            OffsetForLeaderTopic::default()
                .with_topic(common::topic_name("missing"))
                .with_partitions(vec![OffsetForLeaderPartition::default()
                    .with_partition(3)
                    .with_leader_epoch(0)]),
        ]);
    let response = client.call(4, &request).await;
    let got: Vec<Vec<(i32, i16, i32, i64)>> = response
        .topics
        .iter()
        .map(|t| {
            t.partitions
                .iter()
                .map(|p| (p.partition, p.error_code, p.leader_epoch, p.end_offset))
                .collect()
        })
        .collect();
    assert_eq!(
        got,
        vec![
            vec![
                (1, NONE, 1, 9),
                (1, FENCED_LEADER_EPOCH, -1, -1),
                (6, NONE, 0, 0),
            ],
            vec![(3, UNKNOWN_TOPIC_OR_PARTITION, -1, -1)],
        ]
    );
    assert_eq!(response.topics[1].topic.0.as_str(), "missing");
    running.shutdown().await;
}
