//! Log compaction over the wire, against an in-process broker: a topic
//! with `cleanup.policy=compact` ends with the last record of every key
//! per partition at its original offset (Fetch from any offset returns the
//! next batch at or after it, ListOffsets unchanged), tombstones go after
//! `delete.retention.ms`, a `delete` topic is left alone, and all of it
//! survives a restart.

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    BrokerId, FetchRequest, ListOffsetsRequest, ProduceRequest, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use tessera_gateway::broker::NewTopic;
use tessera_gateway::Running;
use tessera_log::batch;
use tessera_log::cleaner::{decode_records, testing::keyed_batch};

use common::WireClient;

const NONE: i16 = 0;
const PARTITIONS: i32 = 2;
const KEYS: usize = 20;

fn name(topic: &str) -> TopicName {
    TopicName(StrBytes::from_string(topic.to_string()))
}

async fn start(dir: &Path) -> Running {
    tessera_gateway::start(common::test_config(
        dir,
        &[("log.cleaner.backoff.ms", "100")],
    ))
    .await
    .unwrap()
}

async fn create_topic(running: &Running, topic: &str, configs: &[(&str, &str)]) {
    running
        .broker
        .create_topic(
            NewTopic {
                name: topic.into(),
                partitions: PARTITIONS as u32,
                replication_factor: 1,
                configs: configs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            },
            false,
        )
        .await
        .unwrap();
}

/// Produces one batch of `(key, value)` records to `partition`.
async fn produce(
    client: &mut WireClient,
    topic: &str,
    partition: i32,
    kv: &[(String, Option<String>)],
) {
    let refs: Vec<(&[u8], Option<&[u8]>)> = kv
        .iter()
        .map(|(k, v)| (k.as_bytes(), v.as_deref().map(str::as_bytes)))
        .collect();
    let request = ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(30_000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(name(topic))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(partition)
                .with_records(Some(Bytes::from(keyed_batch(
                    &refs,
                    tessera_log::now_ms(),
                ))))])]);
    let response = client.call(9, &request).await;
    assert_eq!(
        response.responses[0].partition_responses[0].error_code,
        NONE
    );
}

type Records = Vec<(i64, String, Option<String>)>;

/// Every record of `partition` from `from` on, fetched batch by batch.
async fn read_all(client: &mut WireClient, topic: &str, partition: i32, from: i64) -> Records {
    let mut out = Vec::new();
    let mut offset = from;
    loop {
        let request = FetchRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_max_wait_ms(0)
            .with_min_bytes(0)
            .with_max_bytes(1 << 20)
            .with_session_epoch(-1)
            .with_topics(vec![FetchTopic::default()
                .with_topic(name(topic))
                .with_partitions(vec![FetchPartition::default()
                    .with_partition(partition)
                    .with_current_leader_epoch(-1)
                    .with_fetch_offset(offset)
                    .with_log_start_offset(-1)
                    .with_partition_max_bytes(64 << 10)])]);
        let response = client.call(12, &request).await;
        let p = &response.responses[0].partitions[0];
        assert_eq!(p.error_code, NONE, "fetch {topic}/{partition} at {offset}");
        let records = p.records.clone().unwrap_or_default();
        if records.is_empty() {
            return out;
        }
        for r in batch::split_batches(&records).unwrap() {
            let bytes = &records[r];
            let h = batch::parse_header(bytes).unwrap();
            assert_eq!(batch::compute_crc(bytes), h.crc, "CRC of a served batch");
            for rec in decode_records(bytes).unwrap() {
                if rec.offset >= offset {
                    out.push((
                        rec.offset,
                        String::from_utf8(rec.key.unwrap().to_vec()).unwrap(),
                        rec.value.map(|v| String::from_utf8(v.to_vec()).unwrap()),
                    ));
                }
            }
            offset = h.last_offset() + 1;
        }
    }
}

/// ListOffsets of `partition` at `timestamp` (-2 earliest, -1 latest).
async fn list_offset(client: &mut WireClient, topic: &str, partition: i32, timestamp: i64) -> i64 {
    let request = ListOffsetsRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_topics(vec![ListOffsetsTopic::default()
            .with_name(name(topic))
            .with_partitions(vec![ListOffsetsPartition::default()
                .with_partition_index(partition)
                .with_current_leader_epoch(-1)
                .with_timestamp(timestamp)])]);
    let response = client.call(7, &request).await;
    let p = &response.topics[0].partitions[0];
    assert_eq!(p.error_code, NONE);
    p.offset
}

/// Writes `rounds` rounds of every key to every partition, 5 keys a batch;
/// returns the last value of each `(partition, key)`.
async fn write_rounds(
    client: &mut WireClient,
    topic: &str,
    rounds: usize,
    truth: &mut BTreeMap<(i32, String), Option<String>>,
) {
    for round in 0..rounds {
        for p in 0..PARTITIONS {
            let kv: Vec<(String, Option<String>)> = (0..KEYS)
                .map(|k| {
                    (
                        format!("key-{k}"),
                        Some(format!("{topic}-p{p}-r{round}-k{k}")),
                    )
                })
                .collect();
            for chunk in kv.chunks(5) {
                produce(client, topic, p, chunk).await;
                for (k, v) in chunk {
                    truth.insert((p, k.clone()), v.clone());
                }
            }
        }
    }
}

fn latest(records: &Records) -> BTreeMap<String, Option<String>> {
    records
        .iter()
        .map(|(_, k, v)| (k.clone(), v.clone()))
        .collect()
}

/// The partition holds each key once, at increasing offsets, with the last value written.
async fn check_compacted(
    client: &mut WireClient,
    topic: &str,
    truth: &BTreeMap<(i32, String), Option<String>>,
) {
    for p in 0..PARTITIONS {
        let records = read_all(client, topic, p, 0).await;
        assert!(
            records.windows(2).all(|w| w[0].0 < w[1].0),
            "{topic}/{p}: offsets increase"
        );
        let want: BTreeMap<String, Option<String>> = truth
            .iter()
            .filter(|((tp, _), _)| *tp == p)
            .map(|((_, k), v)| (k.clone(), v.clone()))
            .collect();
        assert_eq!(
            latest(&records),
            want,
            "{topic}/{p}: last value of every key"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compacted_topics_keep_the_last_record_of_every_key() {
    let dir = tempfile::tempdir().unwrap();
    let mut running = start(dir.path()).await;
    let compact = [
        ("cleanup.policy", "compact"),
        ("segment.bytes", "2048"),
        ("min.cleanable.dirty.ratio", "0.01"),
    ];
    create_topic(&running, "compacted", &compact).await;
    create_topic(
        &running,
        "both",
        &[
            ("cleanup.policy", "compact,delete"),
            ("segment.bytes", "2048"),
            ("min.cleanable.dirty.ratio", "0.01"),
            ("delete.retention.ms", "0"),
        ],
    )
    .await;
    create_topic(&running, "plain", &[("segment.bytes", "2048")]).await;
    let mut client = WireClient::connect(running.kafka_addr).await;
    let mut truth = BTreeMap::new();
    let mut both = BTreeMap::new();
    let mut plain = BTreeMap::new();
    write_rounds(&mut client, "compacted", 10, &mut truth).await;
    write_rounds(&mut client, "both", 10, &mut both).await;
    write_rounds(&mut client, "plain", 3, &mut plain).await;
    // Tombstones: key-0 in every partition of "compacted" (kept, default
    // delete.retention.ms of a day) and of "both" (delete.retention.ms 0).
    for (topic, t) in [("compacted", &mut truth), ("both", &mut both)] {
        for p in 0..PARTITIONS {
            produce(&mut client, topic, p, &[("key-0".into(), None)]).await;
            t.insert((p, "key-0".into()), None);
        }
    }
    let ends: Vec<i64> = {
        let mut v = Vec::new();
        for p in 0..PARTITIONS {
            v.push(list_offset(&mut client, "compacted", p, -1).await);
        }
        v
    };
    // One more round rolls every older record into sealed segments; its
    // records are the last values too.
    write_rounds(&mut client, "compacted", 1, &mut truth).await;
    for p in 0..PARTITIONS {
        produce(&mut client, "compacted", p, &[("key-0".into(), None)]).await;
        truth.insert((p, "key-0".into()), None);
    }
    let broker = running.broker.clone();
    common::eventually("the cleaner compacted the topics", || {
        broker.metrics().cleaner_passes.load(Ordering::Relaxed) >= 2
    })
    .await;
    // Wait until at most one batch of duplicates is left outside the active segment.
    let mut done = false;
    for _ in 0..300 {
        let mut total = 0;
        for p in 0..PARTITIONS {
            total += read_all(&mut client, "compacted", p, 0).await.len();
        }
        if total <= PARTITIONS as usize * KEYS * 2 {
            done = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(done, "compaction removed the old values");
    check_compacted(&mut client, "compacted", &truth).await;
    for p in 0..PARTITIONS {
        // Offsets are kept: the log start stays 0 and the end where it was.
        assert_eq!(list_offset(&mut client, "compacted", p, -2).await, 0);
        assert!(list_offset(&mut client, "compacted", p, -1).await > ends[p as usize]);
        // A fetch inside a removed stretch gets the next record after it.
        let from_one = read_all(&mut client, "compacted", p, 1).await;
        assert!(from_one[0].0 > 1);
    }
    // "plain" (cleanup.policy delete) keeps every record.
    for p in 0..PARTITIONS {
        assert_eq!(read_all(&mut client, "plain", p, 0).await.len(), 3 * KEYS);
    }
    // "both": the tombstones go once past their horizon (0 ms) on a later
    // pass, which new data triggers.
    let mut gone = false;
    for _ in 0..100 {
        write_rounds(&mut client, "both", 1, &mut both).await;
        let mut tombstones = 0;
        for p in 0..PARTITIONS {
            let records = read_all(&mut client, "both", p, 0).await;
            tombstones += records
                .iter()
                .filter(|(_, k, v)| k == "key-0" && v.is_none())
                .count();
        }
        if tombstones == 0 {
            gone = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert!(gone, "tombstones past delete.retention.ms are removed");
    check_compacted(&mut client, "both", &both).await;
    // Each pass is recorded in the metadata log: the image's sealed sizes
    // are the cleaned files' sizes.
    common::eventually("the image records the cleaned sizes", || {
        let sealed: Vec<_> = broker
            .list_segments()
            .into_iter()
            .filter(|s| s.topic == "compacted" && s.sealed_bytes.is_some())
            .collect();
        sealed.iter().any(|s| s.clean_pass > 0)
            && sealed.iter().all(|s| s.sealed_bytes == s.local_bytes)
    })
    .await;

    // Bad input: a record without a key is refused with INVALID_RECORD
    // (Kafka's "Compacted topic cannot accept message without key"), and the
    // broker goes on serving.
    let keyless = ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(30_000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(name("compacted"))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(0)
                .with_records(Some(Bytes::from(batch::testing::make_batch(2, 0))))])]);
    let response = client.call(9, &keyless).await;
    let p = &response.responses[0].partition_responses[0];
    assert_eq!(p.error_code, 87, "INVALID_RECORD");
    assert!(p.error_message.as_ref().unwrap().contains("without key"));
    // Both records are listed, with Kafka's LogValidator messages.
    let listed: Vec<i32> = p.record_errors.iter().map(|e| e.batch_index).collect();
    assert_eq!(listed, vec![0, 1]);
    assert_eq!(
        p.record_errors[0].batch_index_error_message.as_deref(),
        Some("Compacted topic cannot accept message without key in topic partition compacted-0.")
    );
    assert!(p
        .error_message
        .as_deref()
        .unwrap()
        .starts_with("One or more records have been rejected due to 2 record errors in total"));
    produce(
        &mut client,
        "compacted",
        0,
        &[("key-1".into(), Some("still serving".into()))],
    )
    .await;
    truth.insert((0, "key-1".into()), Some("still serving".into()));

    // A restart serves the cleaned segments, and appends continue at the end.
    drop(client);
    running.shutdown().await;
    running = start(dir.path()).await;
    let mut client = WireClient::connect(running.kafka_addr).await;
    check_compacted(&mut client, "compacted", &truth).await;
    let end = list_offset(&mut client, "compacted", 0, -1).await;
    produce(
        &mut client,
        "compacted",
        0,
        &[("key-1".into(), Some("after".into()))],
    )
    .await;
    assert_eq!(list_offset(&mut client, "compacted", 0, -1).await, end + 1);
    running.shutdown().await;
}

/// Records held by every partition of `topic`.
async fn total(client: &mut WireClient, topic: &str) -> usize {
    let mut n = 0;
    for p in 0..PARTITIONS {
        n += read_all(client, topic, p, 0).await.len();
    }
    n
}

/// `max.compaction.lag.ms` (KIP-354): dirty data below
/// `min.cleanable.dirty.ratio` is cleaned anyway once its first batch is
/// older than the lag; without the key it waits for the ratio.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_compaction_lag_cleans_below_the_dirty_ratio() {
    let dir = tempfile::tempdir().unwrap();
    let running = start(dir.path()).await;
    // 0.99: once a pass has cleaned anything (a cleaned segment keeps the
    // last value of each key), the ratio is never reached again.
    let base = [
        ("cleanup.policy", "compact"),
        ("segment.bytes", "2048"),
        ("min.cleanable.dirty.ratio", "0.99"),
    ];
    create_topic(&running, "waits", &base).await;
    let mut lagged = base.to_vec();
    lagged.push(("max.compaction.lag.ms", "1000"));
    create_topic(&running, "lagged", &lagged).await;
    let mut client = WireClient::connect(running.kafka_addr).await;
    let mut truth = BTreeMap::new();
    // Phase 1: a first pass (everything dirty: ratio 1.0) on both topics.
    let written = PARTITIONS as usize * KEYS * 6;
    for topic in ["waits", "lagged"] {
        write_rounds(&mut client, topic, 6, &mut truth).await;
    }
    for topic in ["waits", "lagged"] {
        let mut passed = false;
        for _ in 0..300 {
            if total(&mut client, topic).await < written {
                passed = true;
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        assert!(passed, "a first pass on {topic}");
    }
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    // Phase 2: more rounds leave the dirty share below 0.99 for good.
    for topic in ["waits", "lagged"] {
        write_rounds(&mut client, topic, 2, &mut truth).await;
    }
    let waits_before = total(&mut client, "waits").await;
    let lagged_before = total(&mut client, "lagged").await;
    // Past the lag, records keep coming (each partition's key-0): the
    // lagged topic rolls (segment.ms is capped at the lag) and its overdue
    // dirty segments are cleaned whatever the ratio.
    let mut trickled = 0;
    let mut cleaned = false;
    for _ in 0..150 {
        for topic in ["waits", "lagged"] {
            for p in 0..PARTITIONS {
                produce(&mut client, topic, p, &[("key-0".into(), Some("x".into()))]).await;
            }
        }
        trickled += PARTITIONS as usize;
        if total(&mut client, "lagged").await < lagged_before {
            cleaned = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert!(cleaned, "max.compaction.lag.ms forced a pass on \"lagged\"");
    assert_eq!(
        total(&mut client, "waits").await,
        waits_before + trickled,
        "\"waits\" is below its dirty ratio and has no lag: not cleaned"
    );
    running.shutdown().await;
}
