//! Broker-side `compression.type`: a topic that names a codec stores its
//! batches in it whatever the producer sent (Kafka's LogValidator
//! recompresses), `producer` keeps the producer's batch as it came, and a
//! topic without the key takes the broker's value.

use crate::common;

use bytes::Bytes;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::ProduceRequest;
use kafka_protocol::records::{Compression, Record, TimestampType};
use tessera_gateway::broker::NewTopic;
use tessera_log::batch;
use tessera_log::records::{codec, decode_records};

use common::WireClient;

/// Five keyed records of an idempotent producer, compressed with `compression`.
fn batch_of(compression: Compression) -> Vec<u8> {
    let records: Vec<Record> = (0..5)
        .map(|i| Record {
            transactional: false,
            control: false,
            partition_leader_epoch: 0,
            producer_id: 42,
            producer_epoch: 0,
            timestamp_type: TimestampType::Creation,
            offset: i,
            sequence: i as i32,
            timestamp: 1_700_000_000_000 + i,
            key: Some(Bytes::from(format!("key-{i}"))),
            value: Some(Bytes::from(format!("value-{i}-").repeat(20))),
            headers: Default::default(),
            delete_horizon: false,
        })
        .collect();
    tessera_log::records::encode_v2(&records, compression)
        .unwrap()
        .to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topics_store_batches_in_their_codec() {
    let dir = tempfile::tempdir().unwrap();
    let running = tessera_gateway::start(common::test_config(
        dir.path(),
        &[("compression.type", "snappy")],
    ))
    .await
    .unwrap();
    let topics = [
        ("t-zstd", Some("zstd"), codec::ZSTD),
        ("t-uncompressed", Some("uncompressed"), codec::NONE),
        ("t-producer", Some("producer"), codec::GZIP),
        // No topic value: the broker's compression.type (snappy).
        ("t-default", None, codec::SNAPPY),
    ];
    for (name, value, _) in topics {
        running
            .broker
            .create_topic(
                NewTopic {
                    name: name.into(),
                    partitions: 1,
                    replication_factor: 1,
                    configs: value
                        .map(|v| [("compression.type".to_string(), v.to_string())].into())
                        .unwrap_or_default(),
                },
                false,
            )
            .await
            .unwrap();
    }
    let sent = batch_of(Compression::Gzip);
    let mut client = WireClient::connect(running.kafka_addr).await;
    for (name, _, want_codec) in topics {
        let request = ProduceRequest::default()
            .with_acks(-1)
            .with_timeout_ms(30_000)
            .with_topic_data(vec![TopicProduceData::default()
                .with_name(common::topic_name(name))
                .with_partition_data(vec![PartitionProduceData::default()
                    .with_index(0)
                    .with_records(Some(Bytes::from(sent.clone())))])]);
        let response = client.call(9, &request).await;
        let p = &response.responses[0].partition_responses[0];
        assert_eq!((p.error_code, p.base_offset), (0, 0), "produce to {name}");
        // The same idempotent batch again is a duplicate, recompressed or not.
        let response = client.call(9, &request).await;
        let p = &response.responses[0].partition_responses[0];
        assert_eq!((p.error_code, p.base_offset), (0, 0), "retry to {name}");

        let response = client.call(12, &common::fetch_request(name, 0, 0)).await;
        let p = &response.responses[0].partitions[0];
        assert_eq!(p.error_code, 0);
        let stored = p.records.clone().unwrap();
        let header = batch::validate(&stored).expect("a valid batch with its CRC");
        assert_eq!(header.total_len(), stored.len(), "{name}: one batch");
        assert_eq!(header.compression_codec(), want_codec, "{name}");
        assert_eq!(
            decode_records(&stored).unwrap(),
            decode_records(&sent).unwrap(),
            "{name}: the same records"
        );
        let sent_header = batch::parse_header(&sent).unwrap();
        assert_eq!(
            (
                header.producer_id,
                header.base_sequence,
                header.max_timestamp
            ),
            (
                sent_header.producer_id,
                sent_header.base_sequence,
                sent_header.max_timestamp
            )
        );
        if name == "t-producer" {
            // Kept as produced: everything the CRC covers is the producer's.
            assert_eq!(stored[21..], sent[21..]);
        }
    }
    running.shutdown().await;
}
