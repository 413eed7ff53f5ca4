//! Retention over the wire, against an in-process broker: sealed segments
//! past `retention.ms` or over `retention.bytes` are deleted from the data
//! directory, the log start moves to a segment boundary (ListOffsets
//! EARLIEST, Fetch below it OFFSET_OUT_OF_RANGE), the rest stays readable,
//! and all of it survives a restart.

use crate::common;

use std::path::{Path, PathBuf};

use bytes::Bytes;
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{BrokerId, ListOffsetsRequest, ProduceRequest};
use tessera_gateway::broker::NewTopic;
use tessera_gateway::Running;
use tessera_log::batch::testing::make_batch;

use common::WireClient;

const NONE: i16 = 0;
const OFFSET_OUT_OF_RANGE: i16 = 1;
/// Records per batch; every batch is alone in its segment (segment.bytes 14).
const COUNT: i32 = 2;

async fn start(dir: &Path) -> Running {
    tessera_gateway::start(common::test_config(
        dir,
        &[("log.retention.check.interval.ms", "200")],
    ))
    .await
    .unwrap()
}

async fn create_topic(running: &Running, topic: &str, configs: &[(&str, String)]) {
    running
        .broker
        .create_topic(
            NewTopic {
                name: topic.into(),
                partitions: 1,
                replication_factor: 1,
                configs: configs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.clone()))
                    .collect(),
            },
            false,
        )
        .await
        .unwrap();
}

fn now_ms() -> i64 {
    tessera_log::range_log::now_ms()
}

/// Produces one batch of [`COUNT`] records stamped `timestamp`; its base offset.
async fn produce(client: &mut WireClient, topic: &str, timestamp: i64) -> i64 {
    let request = ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(30_000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(common::topic_name(topic))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(0)
                .with_records(Some(Bytes::from(make_batch(COUNT, timestamp))))])]);
    let response = client.call(9, &request).await;
    let p = &response.responses[0].partition_responses[0];
    assert_eq!(p.error_code, NONE, "produce to {topic}");
    p.base_offset
}

/// `(error, log start, base offsets of the batches)`.
async fn fetch(client: &mut WireClient, topic: &str, offset: i64) -> (i16, i64, Vec<i64>) {
    let response = client
        .call(12, &common::fetch_request(topic, 0, offset))
        .await;
    let p = &response.responses[0].partitions[0];
    let bases = common::batch_bases(&p.records.clone().unwrap_or_default());
    (p.error_code, p.log_start_offset, bases)
}

/// ListOffsets EARLIEST of partition 0.
async fn earliest(client: &mut WireClient, topic: &str) -> i64 {
    let request = ListOffsetsRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_topics(vec![ListOffsetsTopic::default()
            .with_name(common::topic_name(topic))
            .with_partitions(vec![ListOffsetsPartition::default()
                .with_partition_index(0)
                .with_current_leader_epoch(-1)
                .with_timestamp(-2)])]);
    let response = client.call(7, &request).await;
    let p = &response.topics[0].partitions[0];
    assert_eq!(p.error_code, NONE);
    p.offset
}

/// The range directory of `topic` (its only range).
fn range_dir(running: &Running, dir: &Path, topic: &str) -> PathBuf {
    let image = running.broker.image();
    let t = image.topic_by_name(topic).unwrap();
    range_dir_of(running, dir, topic, image.active_ranges(t.id)[0].id)
}

/// The segment sequences whose `.log` file is in `dir`.
fn segment_files(dir: &Path) -> Vec<u32> {
    let mut seqs: Vec<u32> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().to_string();
            name.strip_suffix(".log")?.parse().ok()
        })
        .collect();
    seqs.sort_unstable();
    seqs
}

/// What retention must have left of each topic, checked over the wire
/// and on disk: `(topic, first kept segment, batches produced)`.
async fn check(running: &Running, dir: &Path, client: &mut WireClient, kept: &[(&str, u32, i64)]) {
    for &(topic, first, batches) in kept {
        let start = i64::from(first) * i64::from(COUNT);
        let files = segment_files(&range_dir(running, dir, topic));
        assert_eq!(
            files,
            (first..batches as u32).collect::<Vec<_>>(),
            "segment files of {topic}"
        );
        assert_eq!(earliest(client, topic).await, start, "earliest of {topic}");
        let (error, log_start, _) = fetch(client, topic, start - 1).await;
        assert_eq!(
            (error, log_start),
            (OFFSET_OUT_OF_RANGE, -1),
            "fetch below the start of {topic}"
        );
        let (error, log_start, bases) = fetch(client, topic, start).await;
        assert_eq!(
            (error, log_start),
            (NONE, start),
            "fetch at the start of {topic}"
        );
        let all: Vec<i64> = (first..batches as u32)
            .map(|s| i64::from(s) * i64::from(COUNT))
            .collect();
        assert_eq!(bases, all, "retained batches of {topic}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_deletes_old_segments_by_time_and_by_size() {
    let dir = tempfile::tempdir().unwrap();
    let mut running = start(dir.path()).await;
    // One frame: the batch and the 12-byte frame header.
    let frame = make_batch(COUNT, 0).len() as i64 + 12;
    create_topic(
        &running,
        "aged",
        &[
            ("segment.bytes", "14".into()),
            ("retention.ms", "60000".into()),
        ],
    )
    .await;
    // 6 one-frame segments (5 sealed, 1 active); keeping 3.5 frames
    // deletes the 2 oldest (deleting a third would leave less than the limit).
    create_topic(
        &running,
        "sized",
        &[
            ("segment.bytes", "14".into()),
            ("retention.bytes", (3 * frame + frame / 2).to_string()),
        ],
    )
    .await;
    // Recent data under the broker's defaults (7 days, unlimited): kept.
    create_topic(&running, "kept", &[("segment.bytes", "14".into())]).await;
    let mut client = WireClient::connect(running.kafka_addr).await;
    // aged: three batches from long ago (segments 0..=2), then two recent
    // ones (segment 3 sealed, 4 active).
    for i in 0..5 {
        let ts = if i < 3 { 1_000 } else { now_ms() };
        assert_eq!(produce(&mut client, "aged", ts).await, i * i64::from(COUNT));
    }
    for i in 0..6 {
        assert_eq!(
            produce(&mut client, "sized", now_ms()).await,
            i * i64::from(COUNT)
        );
    }
    for i in 0..3 {
        assert_eq!(
            produce(&mut client, "kept", now_ms()).await,
            i * i64::from(COUNT)
        );
    }
    let aged = range_dir(&running, dir.path(), "aged");
    let sized = range_dir(&running, dir.path(), "sized");
    common::eventually("retention deleted the old segments", || {
        segment_files(&aged).first() == Some(&3) && segment_files(&sized).first() == Some(&2)
    })
    .await;
    // Another few passes change nothing more.
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    let kept = [("aged", 3, 5), ("sized", 2, 6), ("kept", 0, 3)];
    check(&running, dir.path(), &mut client, &kept).await;

    // Survives a restart, and the logs go on at their offsets.
    drop(client);
    running.shutdown().await;
    running = start(dir.path()).await;
    let mut client = WireClient::connect(running.kafka_addr).await;
    check(&running, dir.path(), &mut client, &kept).await;
    assert_eq!(produce(&mut client, "aged", now_ms()).await, 10);
    assert_eq!(produce(&mut client, "sized", now_ms()).await, 12);
    running.shutdown().await;
}

/// A split leaves the parent range sealed with its history; retention by
/// time trims that ancestor too (all but its last segment, which seeds the
/// children on a restart), the log start moves into it, and the partition
/// reads on from there across the ancestor and its child.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_trims_the_ancestor_a_split_leaves_behind() {
    let dir = tempfile::tempdir().unwrap();
    let mut running = start(dir.path()).await;
    let topic = "elastic";
    running
        .broker
        .create_topic(
            NewTopic {
                name: topic.into(),
                partitions: 2,
                replication_factor: 1,
                configs: [("segment.bytes".to_string(), "14".to_string())].into(),
            },
            false,
        )
        .await
        .unwrap();
    let mut client = WireClient::connect(running.kafka_addr).await;
    // Four batches from long ago: segments 0..=2 sealed, 3 active.
    for i in 0..4 {
        assert_eq!(
            produce(&mut client, topic, 1_000).await,
            i * i64::from(COUNT)
        );
    }
    let image = running.broker.image();
    let parent = image.active_ranges(image.topic_by_name(topic).unwrap().id)[0].id;
    running.broker.split_range(parent, Some(1)).await.unwrap();
    // Recent data in the child.
    for i in 4..6 {
        assert_eq!(
            produce(&mut client, topic, now_ms()).await,
            i * i64::from(COUNT)
        );
    }
    let parent_dir = range_dir_of(&running, dir.path(), topic, parent);
    assert_eq!(segment_files(&parent_dir), [0, 1, 2, 3]);
    // Now a retention that the ancestor's old batches are past.
    running
        .broker
        .alter_configs(
            2,
            topic,
            &tessera_gateway::alter_config::ConfigChange::Incremental(vec![(
                "retention.ms".into(),
                0,
                Some("60000".into()),
            )]),
            false,
        )
        .await
        .unwrap();
    common::eventually("retention trimmed the ancestor", || {
        segment_files(&parent_dir) == [3]
    })
    .await;
    for round in 0..2 {
        // The last ancestor segment (offsets 6..8) and the child's two
        // batches are what the partition holds.
        assert_eq!(earliest(&mut client, topic).await, 6, "round {round}");
        let (error, _, _) = fetch(&mut client, topic, 5).await;
        assert_eq!(error, OFFSET_OUT_OF_RANGE);
        let mut at = 6;
        let mut bases = Vec::new();
        while at < 12 {
            let (error, log_start, got) = fetch(&mut client, topic, at).await;
            assert_eq!((error, log_start), (NONE, 6));
            at = got.last().unwrap() + i64::from(COUNT);
            bases.extend(got);
        }
        assert_eq!(bases, [6, 8, 10]);
        // And after a restart (the children seed from the ancestor's last
        // segment).
        drop(client);
        running.shutdown().await;
        running = start(dir.path()).await;
        client = WireClient::connect(running.kafka_addr).await;
    }
    assert_eq!(produce(&mut client, topic, now_ms()).await, 12);
    running.shutdown().await;
}

/// The directory of range `range` of `topic`.
fn range_dir_of(running: &Running, dir: &Path, topic: &str, range: u64) -> PathBuf {
    let image = running.broker.image();
    let t = image.topic_by_name(topic).unwrap();
    dir.join("topics")
        .join(format!("{}-{}", t.name, t.id.simple()))
        .join(range.to_string())
}
