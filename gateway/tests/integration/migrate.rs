//! `tessera migrate` with tessera as source and target (both in-process):
//! records at their offsets with gaps, control batches and transactions,
//! batches byte for byte, topic configs, group offsets with metadata; a
//! second run copies nothing; a target holding other data is refused with
//! nothing written; a tampered record is caught by verification; and
//! MigrateAppend itself: refused unless enabled, never below the log end,
//! bad input answered with Kafka's errors while the broker survives.

use crate::common;

use std::path::Path;

use bytes::Bytes;
use indexmap::IndexMap;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{ApiVersionsRequest, ProduceRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{Compression, Record, TimestampType};
use tessera_gateway::broker::NewTopic;
use tessera_gateway::error::MigrateError;
use tessera_gateway::migrate::client::Conn;
use tessera_gateway::migrate::{self, partition, plan, MigrateArgs};
use tessera_gateway::Running;
use tessera_log::batch;

const INVALID_REQUEST: i16 = 42;
const INVALID_RECORD: i16 = 87;
const CORRUPT_MESSAGE: i16 = 2;

async fn start(dir: &Path, migration: bool) -> Running {
    let enable = if migration { "true" } else { "false" };
    tessera_gateway::start(common::test_config(
        dir,
        &[("migration.append.enable", enable)],
    ))
    .await
    .unwrap()
}

async fn create_topic(running: &Running, topic: &str, partitions: u32, configs: &[(&str, &str)]) {
    running
        .broker
        .create_topic(
            NewTopic {
                name: topic.into(),
                partitions,
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

fn record(offset: i64, value: &str, producer: (i64, i16, i32), transactional: bool) -> Record {
    let mut headers = IndexMap::new();
    headers.insert(
        StrBytes::from_static_str("trace"),
        Some(Bytes::from(format!("h{offset}"))),
    );
    Record {
        transactional,
        control: false,
        partition_leader_epoch: 0,
        producer_id: producer.0,
        producer_epoch: producer.1,
        timestamp_type: TimestampType::Creation,
        offset,
        sequence: producer.2,
        timestamp: 1_600_000_000_000 + offset,
        key: Some(Bytes::from(format!("k{offset}"))),
        value: Some(Bytes::from(value.to_string())),
        headers,
        delete_horizon: false,
    }
}

fn encode(records: &[Record], compression: Compression) -> Vec<u8> {
    tessera_log::records::encode_v2(records, compression)
        .unwrap()
        .to_vec()
}

/// A source partition with gaps, compression, an idempotent producer and
/// an aborted transaction (data, then its ABORT marker).
fn source_batches(partition: i32) -> Vec<Vec<u8>> {
    let p = partition as i64 * 100;
    let plain: Vec<Record> = (0..3)
        .map(|o| {
            record(
                o,
                &format!("plain-{partition}-{o}"),
                (-1, -1, o as i32 - 1),
                false,
            )
        })
        .collect();
    let gzip: Vec<Record> = (10..12)
        .map(|o| {
            record(
                o,
                &format!("gzip-{partition}-{o}"),
                (7 + p, 0, (o - 10) as i32),
                false,
            )
        })
        .collect();
    let txn: Vec<Record> = (20..22)
        .map(|o| {
            record(
                o,
                &format!("txn-{partition}-{o}"),
                (9 + p, 2, (o - 20) as i32),
                true,
            )
        })
        .collect();
    let mut marker = batch::testing::make_control_batch(9 + p, 2, false);
    batch::set_base_offset(&mut marker, 22);
    vec![
        encode(&plain, Compression::None),
        encode(&gzip, Compression::Gzip),
        encode(&txn, Compression::None),
        marker,
    ]
}

fn produce_request(topic: &str, partition: i32, records: Vec<u8>) -> ProduceRequest {
    ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(10_000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(TopicName(StrBytes::from_string(topic.to_string())))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(partition)
                .with_records(Some(Bytes::from(records)))])])
}

/// The error code of a MigrateAppend of `records` to `topic`/`partition`.
async fn migrate_append(conn: &mut Conn, topic: &str, partition: i32, records: Vec<u8>) -> i16 {
    let response = conn
        .migrate_append(&produce_request(topic, partition, records))
        .await
        .unwrap();
    let p = &response.responses[0].partition_responses[0];
    if p.error_code != 0 {
        eprintln!("MigrateAppend {topic}-{partition}: {:?}", p.error_message);
    }
    p.error_code
}

/// Produces one plain batch through Produce; returns its base offset.
async fn produce(conn: &mut Conn, topic: &str, partition: i32, value: &str) -> i64 {
    let records = encode(&[record(0, value, (-1, -1, -1), false)], Compression::None);
    let response = conn
        .call_at(&produce_request(topic, partition, records), 9)
        .await
        .unwrap();
    let p = &response.responses[0].partition_responses[0];
    assert_eq!(p.error_code, 0);
    p.base_offset
}

/// Every stored batch of a partition with the partition leader epoch
/// zeroed (the one field a broker rewrites outside the CRC).
async fn stored_batches(conn: &mut Conn, topic: &str, partition: i32) -> Vec<(i64, Vec<u8>)> {
    let (records, _) = partition::fetch(conn, topic, partition, 0, 0)
        .await
        .unwrap();
    plan::source_batches(&records)
        .unwrap()
        .into_iter()
        .map(|sb| {
            let mut b = sb.bytes.to_vec();
            batch::set_partition_leader_epoch(&mut b, 0);
            (sb.header.base_offset, b)
        })
        .collect()
}

fn args(source: &Running, target: &Running, topics: &str) -> MigrateArgs {
    MigrateArgs {
        source: Some(source.kafka_addr.to_string()),
        target: target.kafka_addr.to_string(),
        source_config: Vec::new(),
        target_config: Vec::new(),
        topics: topics.into(),
        groups: "g.*".into(),
        continuous: false,
        verify_only: false,
        cutover_file: "unused.cutover".into(),
        admin_listener: None,
        replication_factor: -1,
        parallelism: 4,
        group_sync_ms: 100,
    }
}

async fn commit(
    bootstrap: &mut Conn,
    group: &str,
    topic: &str,
    offsets: &[(i32, i64, Option<&str>)],
) {
    let mut coordinator = migrate::groups::coordinator(bootstrap, group)
        .await
        .unwrap();
    let offsets = offsets
        .iter()
        .map(|(p, o, m)| {
            (
                (topic.to_string(), *p),
                plan::Committed {
                    offset: *o,
                    metadata: m.map(str::to_string),
                },
            )
        })
        .collect();
    migrate::groups::commit(&mut coordinator, group, &offsets)
        .await
        .unwrap();
}

async fn committed(bootstrap: &mut Conn, group: &str, topic: &str) -> plan::GroupOffsets {
    let mut coordinator = migrate::groups::coordinator(bootstrap, group)
        .await
        .unwrap();
    let topics = [(topic.to_string(), 100usize)].into_iter().collect();
    migrate::groups::fetch_offsets(&mut coordinator, group, &topics)
        .await
        .unwrap()
}

/// A source with two 2-partition topics written at chosen offsets, a
/// normal produce after them, and group offsets.
async fn filled_source(dir: &Path) -> Running {
    let source = start(dir, true).await;
    let mut conn = Conn::connect(&source.kafka_addr.to_string()).await.unwrap();
    for topic in ["orders", "payments"] {
        create_topic(&source, topic, 2, &[("retention.ms", "86400000")]).await;
        for partition in 0..2 {
            for b in source_batches(partition) {
                assert_eq!(migrate_append(&mut conn, topic, partition, b).await, 0);
            }
            // Produce continues after the copied offsets.
            assert_eq!(
                produce(
                    &mut conn,
                    topic,
                    partition,
                    &format!("tamper-me-{topic}-{partition}")
                )
                .await,
                23
            );
        }
    }
    commit(
        &mut conn,
        "g1",
        "orders",
        &[(0, 21, Some("meta-0")), (1, 3, None)],
    )
    .await;
    commit(&mut conn, "other", "orders", &[(0, 1, None)]).await;
    source
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn migrates_every_record_at_its_offset_then_a_second_run_copies_nothing() {
    let dirs = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let source = filled_source(dirs.0.path()).await;
    let target = start(dirs.1.path(), true).await;

    let report = migrate::run(&args(&source, &target, "orders|payments"))
        .await
        .unwrap();
    assert_eq!(report.topics, vec!["orders", "payments"]);
    assert_eq!(report.partitions, 4);
    // 3 + 2 + 2 + 1 (marker) + 1 produced, per partition.
    assert_eq!(report.records, 4 * 9);
    assert!(
        report.verdicts.iter().all(|v| v.mismatch.is_none()),
        "{:?}",
        report.verdicts
    );
    assert_eq!(report.groups, vec!["g1"]);
    assert_eq!(migrate::print_report(&report), 0);

    let mut s = Conn::connect(&source.kafka_addr.to_string()).await.unwrap();
    let mut t = Conn::connect(&target.kafka_addr.to_string()).await.unwrap();
    for topic in ["orders", "payments"] {
        for partition in 0..2 {
            let on_source = stored_batches(&mut s, topic, partition).await;
            let on_target = stored_batches(&mut t, topic, partition).await;
            let bases: Vec<i64> = on_target.iter().map(|(b, _)| *b).collect();
            assert_eq!(bases, vec![0, 10, 20, 22, 23]);
            assert_eq!(on_source, on_target, "{topic}-{partition} byte for byte");
            let span = partition::span(&mut t, topic, partition).await.unwrap();
            assert_eq!((span.start, span.end), (0, 24));
        }
    }
    // Group offsets with their metadata, only for the groups selected.
    assert_eq!(
        committed(&mut t, "g1", "orders").await,
        committed(&mut s, "g1", "orders").await
    );
    assert_eq!(
        committed(&mut t, "g1", "orders").await[&("orders".to_string(), 0)]
            .metadata
            .as_deref(),
        Some("meta-0")
    );
    assert!(committed(&mut t, "other", "orders").await.is_empty());
    // The topic config came along.
    let image = target.broker.image();
    let orders = image.topic_by_name("orders").unwrap();
    assert_eq!(
        orders.configs.get("retention.ms").map(String::as_str),
        Some("86400000")
    );

    // The source's producer ids (up to 109) are never handed out here.
    assert!(target.broker.image().next_producer_id > 109);
    let fresh = target
        .broker
        .producer_ids()
        .next_id(target.broker.controller(), 1)
        .await
        .unwrap();
    assert!(fresh > 109, "{fresh}");

    // New data on the source; the second run copies only that.
    assert_eq!(produce(&mut s, "orders", 1, "late").await, 24);
    let again = migrate::run(&args(&source, &target, "orders|payments"))
        .await
        .unwrap();
    assert_eq!(again.records, 1);
    assert!(again.verdicts.iter().all(|v| v.mismatch.is_none()));
    let third = migrate::run(&args(&source, &target, "orders|payments"))
        .await
        .unwrap();
    assert_eq!(third.records, 0);
    assert_eq!(
        third.verdicts.iter().map(|v| v.source.records).sum::<u64>(),
        4 * 9 + 1
    );
    source.shutdown().await;
    target.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_target_holding_other_data_is_refused_and_nothing_is_written() {
    let dirs = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let source = filled_source(dirs.0.path()).await;
    let target = start(dirs.1.path(), true).await;
    create_topic(&target, "payments", 2, &[]).await;
    let mut t = Conn::connect(&target.kafka_addr.to_string()).await.unwrap();
    produce(&mut t, "payments", 1, "something else").await;

    let err = migrate::run(&args(&source, &target, "orders|payments"))
        .await
        .unwrap_err();
    match &err {
        MigrateError::TargetConflict { topic, reason } => {
            assert_eq!(topic, "payments");
            assert!(
                reason.contains("partition 1") && reason.contains("differs"),
                "{reason}"
            );
        }
        other => panic!("expected a conflict, got {other}"),
    }
    // Nothing written: "orders" (checked first) was not created, no group offsets.
    assert!(target.broker.image().topic_by_name("orders").is_none());
    let span = partition::span(&mut t, "payments", 1).await.unwrap();
    assert_eq!(span.end, 1);
    // Different partition counts are refused the same way.
    let target2_dir = tempfile::tempdir().unwrap();
    let target2 = start(target2_dir.path(), true).await;
    create_topic(&target2, "orders", 3, &[]).await;
    let err = migrate::run(&args(&source, &target2, "orders"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("3 partitions"), "{err}");
    // A source reached with SASL it does not speak, or a key the migrator
    // does not know: refused before anything is written.
    let mut sasl = args(&source, &target2, "orders");
    sasl.source_config = vec![
        "security.protocol=SASL_PLAINTEXT".into(),
        "sasl.username=u".into(),
    ];
    let err = migrate::run(&sasl).await.unwrap_err();
    assert!(err.to_string().contains("SaslHandshake"), "{err}");
    sasl.source_config = vec!["bootstrap.servers=x".into()];
    let err = migrate::run(&sasl).await.unwrap_err();
    assert!(matches!(err, MigrateError::Argument(_)), "{err}");
    assert_eq!(
        partition::span(&mut t, "payments", 1).await.unwrap().end,
        1,
        "nothing written"
    );
    source.shutdown().await;
    target.shutdown().await;
    target2.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn verification_catches_a_tampered_record() {
    let dirs = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let source = filled_source(dirs.0.path()).await;
    let target = start(dirs.1.path(), true).await;
    let report = migrate::run(&args(&source, &target, "orders"))
        .await
        .unwrap();
    assert!(report.verdicts.iter().all(|v| v.mismatch.is_none()));

    // Flip one byte of one record's value in the target's segment file.
    let needle = b"tamper-me-orders-1";
    let mut tampered = 0;
    for entry in walk(dirs.1.path()) {
        if entry.extension().is_some_and(|e| e == "log") {
            let mut bytes = std::fs::read(&entry).unwrap();
            if let Some(at) = bytes.windows(needle.len()).position(|w| w == needle) {
                bytes[at] = b'T';
                std::fs::write(&entry, &bytes).unwrap();
                tampered += 1;
            }
        }
    }
    assert_eq!(tampered, 1);
    let mut verify = args(&source, &target, "orders");
    verify.verify_only = true;
    let report = migrate::run(&verify).await.unwrap();
    let bad: Vec<_> = report
        .verdicts
        .iter()
        .filter(|v| v.mismatch.is_some())
        .collect();
    assert_eq!(bad.len(), 1, "{:?}", report.verdicts);
    assert_eq!((bad[0].topic.as_str(), bad[0].partition), ("orders", 1));
    assert_eq!(report.records, 0, "verify-only writes nothing");
    assert_eq!(migrate::print_report(&report), 1);
    source.shutdown().await;
    target.shutdown().await;
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let path = e.path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn migrate_append_is_privileged_and_never_reuses_an_offset() {
    let dirs = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let disabled = start(dirs.0.path(), false).await;
    create_topic(&disabled, "t", 1, &[]).await;
    let mut conn = Conn::connect(&disabled.kafka_addr.to_string())
        .await
        .unwrap();
    let batch = source_batches(0).remove(0);
    assert_eq!(
        migrate_append(&mut conn, "t", 0, batch.clone()).await,
        INVALID_REQUEST
    );
    assert_eq!(partition::span(&mut conn, "t", 0).await.unwrap().end, 0);

    let enabled = start(dirs.1.path(), true).await;
    create_topic(&enabled, "t", 1, &[]).await;
    let mut conn = Conn::connect(&enabled.kafka_addr.to_string())
        .await
        .unwrap();
    let mut at_five = batch.clone();
    batch::set_base_offset(&mut at_five, 5);
    assert_eq!(migrate_append(&mut conn, "t", 0, at_five.clone()).await, 0);
    // The same offsets again, or below the end: refused.
    assert_eq!(
        migrate_append(&mut conn, "t", 0, at_five).await,
        INVALID_RECORD
    );
    assert_eq!(
        migrate_append(&mut conn, "t", 0, batch.clone()).await,
        INVALID_RECORD
    );
    // A corrupt batch (CRC) and a truncated one.
    let mut corrupt = batch.clone();
    batch::set_base_offset(&mut corrupt, 100);
    let last = corrupt.len() - 1;
    corrupt[last] ^= 0xff;
    assert_eq!(
        migrate_append(&mut conn, "t", 0, corrupt).await,
        CORRUPT_MESSAGE
    );
    let mut truncated = batch.clone();
    truncated.truncate(40);
    assert_ne!(migrate_append(&mut conn, "t", 0, truncated).await, 0);
    assert_eq!(partition::span(&mut conn, "t", 0).await.unwrap().end, 8);
    // A malformed body closes only that connection; the broker answers on.
    let mut raw = tokio::net::TcpStream::connect(enabled.kafka_addr)
        .await
        .unwrap();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut frame = vec![0, 0, 0, 12];
    frame.extend_from_slice(&0x7e02i16.to_be_bytes());
    frame.extend_from_slice(&[0, 0, 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff]);
    raw.write_all(&frame).await.unwrap();
    let mut buf = [0u8; 4];
    assert!(raw.read_exact(&mut buf).await.is_err(), "connection closed");
    let mut conn = Conn::connect(&enabled.kafka_addr.to_string())
        .await
        .unwrap();
    conn.call(&ApiVersionsRequest::default()).await.unwrap();
    disabled.shutdown().await;
    enabled.shutdown().await;
}
