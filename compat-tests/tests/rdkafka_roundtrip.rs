//! librdkafka (through the `rdkafka` crate) against an in-process tessera:
//! an AdminClient creates 3-partition topics, a FutureProducer (acks=all)
//! sends keyed records with headers and explicit timestamps, once
//! uncompressed and once per codec, and a consumer assigned to every
//! partition from the beginning reads them all back. Every record must come
//! back with its key, value, headers and timestamp at the very offset its
//! delivery report gave.
//!
//! A raw Fetch then checks that the stored batches really carry each codec
//! (so the variants are not all uncompressed underneath). LZ4 is the
//! exception while the broker does not advertise FindCoordinator: librdkafka
//! then refuses to compress with LZ4 (see `advertises_find_coordinator`).
//!
//! `TESSERA_RDKAFKA_RECORDS` overrides the records per variant.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, BrokerId, FetchRequest, FetchResponse, RequestHeader,
    ResponseHeader, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Request, StrBytes};
use kafka_protocol::records::{Compression, RecordBatchDecoder};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders, Timestamp};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use tessera_gateway::BrokerConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const PARTITIONS: i32 = 3;
const DEFAULT_RECORDS: usize = 100_000;
const CODECS: [&str; 5] = ["none", "gzip", "snappy", "lz4", "zstd"];
const BASE_TIMESTAMP: i64 = 1_600_000_000_000;
/// The variant whose LZ4 batches are encoded by kafka-protocol, not librdkafka.
const RAW_LZ4: &str = "lz4-raw";

fn records_per_variant() -> usize {
    std::env::var("TESSERA_RDKAFKA_RECORDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_RECORDS)
}

fn key(i: usize) -> String {
    format!("key-{i:08}")
}

/// Somewhat compressible, varying in length.
fn value(codec: &str, i: usize) -> Vec<u8> {
    let mut v = format!("{codec} record {i} ").into_bytes();
    v.extend(std::iter::repeat_n(b'a' + (i % 26) as u8, i % 200));
    v.extend_from_slice(&(i as u64).to_le_bytes());
    v
}

fn headers(codec: &str, i: usize) -> Vec<(String, Option<Vec<u8>>)> {
    vec![
        ("index".to_string(), Some((i as u64).to_be_bytes().to_vec())),
        ("codec".to_string(), Some(codec.as_bytes().to_vec())),
        ("empty".to_string(), Some(Vec::new())),
        ("null".to_string(), None),
    ]
}

fn timestamp(i: usize) -> i64 {
    // Not monotonic across partitions, and never "now".
    BASE_TIMESTAMP + ((i * 7919) % 1_000_000) as i64
}

/// What the consumer read for one record.
struct Consumed {
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    headers: Vec<(String, Option<Vec<u8>>)>,
    timestamp: Timestamp,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdkafka_produce_consume_every_codec() {
    let n = records_per_variant();
    let dir = tempfile::tempdir().unwrap();
    let mut map = BTreeMap::new();
    map.insert("listeners".to_string(), "127.0.0.1:0".to_string());
    map.insert("admin.listener".to_string(), "127.0.0.1:0".to_string());
    map.insert("log.dirs".to_string(), dir.path().display().to_string());
    map.insert("auto.create.topics.enable".to_string(), "false".to_string());
    let running = tessera_gateway::start(BrokerConfig::from_map(&map).unwrap())
        .await
        .expect("broker starts");
    let bootstrap = running.kafka_addr.to_string();

    // One topic per codec, created by librdkafka's admin API.
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()
        .expect("admin client");
    let mut names: Vec<String> = CODECS.iter().map(|c| format!("roundtrip-{c}")).collect();
    names.push(format!("roundtrip-{RAW_LZ4}"));
    let new_topics: Vec<NewTopic> = names
        .iter()
        .map(|t| NewTopic::new(t, PARTITIONS, TopicReplication::Fixed(1)))
        .collect();
    let results = admin
        .create_topics(
            &new_topics,
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
        )
        .await
        .expect("CreateTopics");
    for r in results {
        r.unwrap_or_else(|(topic, e)| panic!("creating {topic}: {e}"));
    }

    let mut timings = Vec::new();
    for (codec, topic) in CODECS.iter().zip(&names) {
        let started = Instant::now();
        let delivered = produce(&bootstrap, topic, codec, n).await;
        let produced_in = started.elapsed();
        let consumed = consume(&bootstrap, topic, n).await;
        check(codec, n, &delivered, &consumed);
        check_stored_codec(running.kafka_addr, topic, codec).await;
        timings.push((codec, produced_in, started.elapsed()));
    }
    // librdkafka will not produce LZ4 to this broker (see
    // `advertises_find_coordinator`), so LZ4 batches encoded by
    // kafka-protocol go in over a raw socket, and librdkafka reads them.
    let raw_n = n.min(20_000);
    let started = Instant::now();
    let delivered = produce_raw_lz4(running.kafka_addr, &names[CODECS.len()], raw_n).await;
    let produced_in = started.elapsed();
    let consumed = consume(&bootstrap, &names[CODECS.len()], raw_n).await;
    check(RAW_LZ4, raw_n, &delivered, &consumed);
    check_stored_codec(running.kafka_addr, &names[CODECS.len()], RAW_LZ4).await;
    eprintln!(
        "{RAW_LZ4}: {raw_n} records produced in {:.2}s, produced and consumed in {:.2}s",
        produced_in.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    for (codec, produced, total) in &timings {
        eprintln!(
            "{codec:>7}: {n} records produced in {:.2}s, produced and consumed in {:.2}s",
            produced.as_secs_f64(),
            total.as_secs_f64()
        );
    }
    drop(admin);
    running.shutdown().await;
}

/// Produces `n` records; returns the `(partition, offset)` of each, by index.
async fn produce(bootstrap: &str, topic: &str, codec: &str, n: usize) -> Vec<(i32, i64)> {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("acks", "all")
        .set("enable.idempotence", "false")
        .set("compression.type", codec)
        .set("linger.ms", "5")
        .set("batch.num.messages", "10000")
        .set("queue.buffering.max.messages", "1000000")
        .set("queue.buffering.max.kbytes", "1048576")
        .set("message.timeout.ms", "120000")
        .create()
        .expect("producer");
    let mut futures = Vec::with_capacity(n);
    for i in 0..n {
        let k = key(i);
        let v = value(codec, i);
        let mut hs = OwnedHeaders::new();
        for (name, val) in headers(codec, i) {
            hs = hs.insert(Header {
                key: &name,
                value: val.as_deref(),
            });
        }
        let mut record = FutureRecord::to(topic)
            .key(&k)
            .payload(&v)
            .headers(hs)
            .timestamp(timestamp(i));
        loop {
            match producer.send_result(record) {
                Ok(f) => {
                    futures.push(f);
                    break;
                }
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    record = r;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err((e, _)) => panic!("{codec}: enqueueing record {i}: {e}"),
            }
        }
    }
    let mut delivered = Vec::with_capacity(n);
    for (i, f) in futures.into_iter().enumerate() {
        let d = f
            .await
            .expect("delivery future dropped")
            .unwrap_or_else(|(e, _)| panic!("{codec}: record {i} not delivered: {e}"));
        delivered.push((d.partition, d.offset));
    }
    producer
        .flush(Duration::from_secs(30))
        .expect("producer flush");
    delivered
}

/// Reads every partition of `topic` from the beginning until `n` records.
async fn consume(bootstrap: &str, topic: &str, n: usize) -> HashMap<(i32, i64), Consumed> {
    let bootstrap = bootstrap.to_string();
    let topic = topic.to_string();
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            // rdkafka requires a group id; partitions are assigned directly,
            // so no group is joined and nothing is committed.
            .set("group.id", "tessera-rdkafka-roundtrip")
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "error")
            .set("enable.partition.eof", "false")
            .set("fetch.max.bytes", "52428800")
            .create()
            .expect("consumer");
        let mut tpl = TopicPartitionList::new();
        for p in 0..PARTITIONS {
            tpl.add_partition_offset(&topic, p, Offset::Beginning)
                .unwrap();
        }
        consumer.assign(&tpl).expect("assign");
        let mut out = HashMap::with_capacity(n);
        let deadline = Instant::now() + Duration::from_secs(120);
        while out.len() < n {
            assert!(
                Instant::now() < deadline,
                "{topic}: consumed only {} of {n} records in 120 s",
                out.len()
            );
            let Some(message) = consumer.poll(Duration::from_millis(500)) else {
                continue;
            };
            let m = message.unwrap_or_else(|e| panic!("{topic}: consume error: {e}"));
            assert_eq!(m.topic(), topic);
            let headers = m
                .headers()
                .map(|hs| {
                    hs.iter()
                        .map(|h| (h.key.to_string(), h.value.map(<[u8]>::to_vec)))
                        .collect()
                })
                .unwrap_or_default();
            let previous = out.insert(
                (m.partition(), m.offset()),
                Consumed {
                    key: m.key().map(<[u8]>::to_vec),
                    value: m.payload().map(<[u8]>::to_vec),
                    headers,
                    timestamp: m.timestamp(),
                },
            );
            assert!(
                previous.is_none(),
                "{topic}: partition {} offset {} consumed twice",
                m.partition(),
                m.offset()
            );
        }
        // Nothing beyond what was produced.
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(500)) {
            panic!(
                "{topic}: unexpected extra record at partition {} offset {}",
                m.partition(),
                m.offset()
            );
        }
        out
    })
    .await
    .expect("consumer thread")
}

fn check(
    codec: &str,
    n: usize,
    delivered: &[(i32, i64)],
    consumed: &HashMap<(i32, i64), Consumed>,
) {
    assert_eq!(delivered.len(), n);
    assert_eq!(consumed.len(), n, "{codec}: records consumed");

    // Offsets of each partition are dense from 0, and each delivery report
    // names a distinct position.
    let mut per_partition: BTreeMap<i32, Vec<i64>> = BTreeMap::new();
    for &(p, o) in delivered {
        assert!((0..PARTITIONS).contains(&p), "{codec}: partition {p}");
        per_partition.entry(p).or_default().push(o);
    }
    for (p, offsets) in &mut per_partition {
        offsets.sort_unstable();
        let expected: Vec<i64> = (0..offsets.len() as i64).collect();
        assert!(
            *offsets == expected,
            "{codec}: delivered offsets of partition {p} are not 0..{}",
            offsets.len()
        );
    }
    assert!(
        per_partition.len() as i32 == PARTITIONS,
        "{codec}: keys should spread over all {PARTITIONS} partitions, got {:?}",
        per_partition.keys().collect::<Vec<_>>()
    );

    for (i, &(p, o)) in delivered.iter().enumerate() {
        let c = consumed.get(&(p, o)).unwrap_or_else(|| {
            panic!("{codec}: record {i} (partition {p} offset {o}) not consumed")
        });
        assert_eq!(
            c.key.as_deref(),
            Some(key(i).as_bytes()),
            "{codec}: key at {p}/{o}"
        );
        assert_eq!(
            c.value.as_deref(),
            Some(value(codec, i).as_slice()),
            "{codec}: value at {p}/{o}"
        );
        assert_eq!(c.headers, headers(codec, i), "{codec}: headers at {p}/{o}");
        assert_eq!(
            c.timestamp,
            Timestamp::CreateTime(timestamp(i)),
            "{codec}: timestamp at {p}/{o}"
        );
    }
}

/// Produces `n` records as LZ4 batches of 500 encoded by kafka-protocol,
/// round-robin over the partitions, with Produce v9 (acks=all) over a raw
/// socket; returns the `(partition, offset)` of each, by index.
async fn produce_raw_lz4(addr: SocketAddr, topic: &str, n: usize) -> Vec<(i32, i64)> {
    use kafka_protocol::indexmap::IndexMap;
    use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
    use kafka_protocol::messages::ProduceRequest;
    use kafka_protocol::records::{Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType};

    let mut delivered = vec![(0, -1); n];
    for partition in 0..PARTITIONS {
        let indexes: Vec<usize> = (partition as usize..n)
            .step_by(PARTITIONS as usize)
            .collect();
        for chunk in indexes.chunks(500) {
            let records: Vec<Record> = chunk
                .iter()
                .enumerate()
                .map(|(delta, &i)| {
                    let mut hs = IndexMap::new();
                    for (name, val) in headers(RAW_LZ4, i) {
                        hs.insert(StrBytes::from_string(name), val.map(Bytes::from));
                    }
                    Record {
                        transactional: false,
                        control: false,
                        delete_horizon: false,
                        partition_leader_epoch: -1,
                        producer_id: -1,
                        producer_epoch: -1,
                        timestamp_type: TimestampType::Creation,
                        offset: delta as i64,
                        sequence: -1,
                        timestamp: timestamp(i),
                        key: Some(Bytes::from(key(i))),
                        value: Some(Bytes::from(value(RAW_LZ4, i))),
                        headers: hs,
                    }
                })
                .collect();
            let mut batch = BytesMut::new();
            RecordBatchEncoder::encode(
                &mut batch,
                records.iter(),
                &RecordEncodeOptions {
                    version: 2,
                    compression: Compression::Lz4,
                },
            )
            .unwrap();
            let request = ProduceRequest::default()
                .with_acks(-1)
                .with_timeout_ms(30_000)
                .with_topic_data(vec![TopicProduceData::default()
                    .with_name(TopicName(StrBytes::from_string(topic.to_string())))
                    .with_partition_data(vec![PartitionProduceData::default()
                        .with_index(partition)
                        .with_records(Some(batch.freeze()))])]);
            let response = raw_call(addr, 9, &request).await;
            let p = &response.responses[0].partition_responses[0];
            assert_eq!(
                p.error_code, 0,
                "{RAW_LZ4}: produce to partition {partition}"
            );
            for (delta, &i) in chunk.iter().enumerate() {
                delivered[i] = (partition, p.base_offset + delta as i64);
            }
        }
    }
    delivered
}

/// One request over a fresh raw socket (kafka-protocol codecs, no client).
async fn raw_call<R: Request>(addr: SocketAddr, version: i16, request: &R) -> R::Response {
    let header = RequestHeader::default()
        .with_request_api_key(R::KEY)
        .with_request_api_version(version)
        .with_correlation_id(7)
        .with_client_id(Some(StrBytes::from_static_str("roundtrip-check")));
    let mut buf = BytesMut::new();
    buf.put_i32(0);
    header.encode(&mut buf, R::header_version(version)).unwrap();
    request.encode(&mut buf, version).unwrap();
    let len = (buf.len() - 4) as i32;
    buf[0..4].copy_from_slice(&len.to_be_bytes());
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(&buf).await.unwrap();
    let mut size = [0u8; 4];
    stream.read_exact(&mut size).await.unwrap();
    let mut body = vec![0u8; i32::from_be_bytes(size) as usize];
    stream.read_exact(&mut body).await.unwrap();
    let mut body = Bytes::from(body);
    let header = ResponseHeader::decode(&mut body, R::Response::header_version(version)).unwrap();
    assert_eq!(header.correlation_id, 7);
    R::Response::decode(&mut body, version).unwrap()
}

/// Whether the broker advertises FindCoordinator. librdkafka compresses
/// with LZ4 only for brokers that do: it dates LZ4 support (Kafka 0.8.2) by
/// that API (`RD_KAFKA_FEATURE_LZ4` in rdkafka_feature.c) and otherwise
/// logs "Broker does not support compression type lz4: not compressing
/// batch" and sends the batch uncompressed.
async fn advertises_find_coordinator(addr: SocketAddr) -> bool {
    let response = raw_call(addr, 3, &ApiVersionsRequest::default()).await;
    assert_eq!(response.error_code, 0);
    response
        .api_keys
        .iter()
        .any(|k| k.api_key == ApiKey::FindCoordinator as i16)
}

/// Fetches each partition's first batches over a raw socket and checks the
/// codec in their attributes, so the variants are not all uncompressed
/// underneath; every whole batch must also decode with kafka-protocol.
async fn check_stored_codec(addr: SocketAddr, topic: &str, codec: &str) {
    let mut expected = match codec {
        "none" => Compression::None,
        "gzip" => Compression::Gzip,
        "snappy" => Compression::Snappy,
        "lz4" | RAW_LZ4 => Compression::Lz4,
        "zstd" => Compression::Zstd,
        other => panic!("codec {other}"),
    };
    if codec == "lz4" && !advertises_find_coordinator(addr).await {
        eprintln!(
            "   lz4: the broker does not advertise FindCoordinator, so librdkafka \
             sends lz4 batches uncompressed; expecting uncompressed batches"
        );
        expected = Compression::None;
    }
    // One partition per request: only a response's first batch may exceed
    // the limits (KIP-74), so a big first batch would crowd the others out.
    let mut compressed = 0usize;
    for partition in 0..PARTITIONS {
        let request = FetchRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_max_wait_ms(0)
            .with_max_bytes(1 << 20)
            .with_session_epoch(-1)
            .with_topics(vec![FetchTopic::default()
                .with_topic(TopicName(StrBytes::from_string(topic.to_string())))
                .with_partitions(vec![FetchPartition::default()
                    .with_partition(partition)
                    .with_current_leader_epoch(-1)
                    .with_fetch_offset(0)
                    .with_partition_max_bytes(1 << 20)])]);
        let response: FetchResponse = raw_call(addr, 12, &request).await;
        let p = &response.responses[0].partitions[0];
        assert_eq!(p.partition_index, partition);
        assert_eq!(
            p.error_code, 0,
            "{codec}: raw fetch of partition {partition}"
        );
        let records = p.records.clone().unwrap_or_default();
        // Every whole batch in the response (v2: baseOffset, batchLength,
        // partitionLeaderEpoch, magic, crc, then attributes at byte 21).
        let mut batches = 0;
        let mut at = 0;
        while at + 23 <= records.len() {
            let len = i32::from_be_bytes(records[at + 8..at + 12].try_into().unwrap()) as usize;
            if at + 12 + len > records.len() {
                break;
            }
            let attributes = i16::from_be_bytes(records[at + 21..at + 23].try_into().unwrap());
            // librdkafka sends a batch uncompressed when compressing would
            // not make it smaller (a small first batch, say): each batch is
            // either the codec asked for or uncompressed, stored as sent.
            let stored = attributes & 7;
            assert!(
                stored == expected as i16 || stored == Compression::None as i16,
                "{codec}: codec {stored} of stored batch {batches} of partition {partition}"
            );
            compressed += (stored == expected as i16) as usize;
            let mut one = records.slice(at..at + 12 + len);
            let set = RecordBatchDecoder::decode(&mut one).unwrap_or_else(|e| {
                panic!(
                    "{codec}: stored batch {batches} of partition {partition} does not decode: {e}"
                )
            });
            assert!(!set.records.is_empty());
            batches += 1;
            at += 12 + len;
        }
        assert!(
            batches > 0,
            "{codec}: partition {partition} returned no whole batch"
        );
    }
    assert!(
        compressed > 0,
        "{codec}: no stored batch carries the codec the producer was asked for"
    );
}
