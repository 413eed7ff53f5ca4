//! The transaction coordinator against an in-process broker: a transaction
//! left in PrepareCommit by a crash is completed at restart (markers written,
//! its transactional offsets committed), a timed-out transaction is aborted
//! with an epoch bump that fences the producer, and produce only accepts
//! transactional batches for partitions of the ongoing transaction.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use tessera_gateway::broker::{Broker, NewTopic};
use tessera_gateway::error::ApiError;
use tessera_gateway::groups::offsets::PartitionCommit;
use tessera_gateway::groups::txn_offsets::TxnCommitRequest;
use tessera_gateway::groups::GroupCoordinator;
use tessera_gateway::internal_topics::partition_for;
use tessera_gateway::txn::state::{TxnMetadata, TxnState};
use tessera_gateway::txn::{records, TxnCoordinator, TRANSACTION_STATE};
use tessera_log::batch::testing::make_transactional_batch;

async fn setup(broker: &Broker) {
    broker
        .create_topic(
            NewTopic {
                name: "t".into(),
                partitions: 2,
                replication_factor: 1,
                configs: BTreeMap::new(),
            },
            false,
        )
        .await
        .unwrap();
    TxnCoordinator::ensure_topic(broker).await.unwrap();
    GroupCoordinator::ensure_offsets_topic(broker)
        .await
        .unwrap();
}

async fn produce_txn(broker: &Broker, partition: i32, pid: i64, epoch: i16, seq: i32) {
    let image = broker.image();
    let topic = image.topic_by_name("t").unwrap().clone();
    let route = broker.route(&image, &topic, partition).unwrap();
    broker
        .txns()
        .check_produce(pid, epoch, "t", partition)
        .unwrap();
    let mut b = make_transactional_batch(2, 1000, pid, epoch, seq);
    let out = route.log.append(partition as u32, &mut b, None).unwrap();
    route.log.wait_durable(out.end_position).await.unwrap();
}

fn offsets(broker: &Broker, partition: i32) -> tessera_log::PartitionOffsets {
    let image = broker.image();
    let topic = image.topic_by_name("t").unwrap().clone();
    broker
        .route(&image, &topic, partition)
        .unwrap()
        .log
        .offsets(partition as u32)
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepare_commit_left_by_a_crash_completes_at_restart() {
    let dir = tempfile::tempdir().unwrap();
    let running = tessera_gateway::start(common::test_config(dir.path(), &[]))
        .await
        .unwrap();
    let broker = running.broker.clone();
    setup(&broker).await;
    let (pid, epoch) = broker
        .txns()
        .init_producer_id(&*broker, "tx", 60_000, None)
        .await
        .unwrap();
    assert_eq!(epoch, 0);
    broker
        .txns()
        .add_partitions(&*broker, "tx", pid, epoch, &[("t".into(), 0)])
        .await
        .unwrap();
    broker
        .txns()
        .add_offsets(&*broker, "tx", pid, epoch, "g")
        .await
        .unwrap();
    produce_txn(&broker, 0, pid, epoch, 0).await;
    let results = broker
        .groups()
        .txn_offset_commit(
            &*broker,
            TxnCommitRequest {
                group_id: "g".into(),
                producer_id: pid,
                producer_epoch: epoch,
                generation_id: -1,
                member_id: String::new(),
                group_instance_id: None,
                topics: vec![(
                    "t".into(),
                    vec![PartitionCommit {
                        partition: 0,
                        offset: 2,
                        leader_epoch: -1,
                        metadata: None,
                    }],
                )],
            },
        )
        .await;
    assert!(results[0].1[0].1.is_ok());
    // Not visible before the commit.
    assert!(broker
        .groups()
        .committed("g")
        .await
        .is_none_or(|o| o.get("t", 0).is_none()));
    assert_eq!(offsets(&broker, 0).last_stable, 0);

    // The coordinator wrote PrepareCommit and crashed before the markers.
    let d = broker.txns().describe(&*broker, "tx").await.unwrap();
    let mut prepared = TxnMetadata::new("tx", pid, d.timeout_ms, tessera_log::now_ms());
    prepared.producer_epoch = epoch;
    prepared.state = TxnState::PrepareCommit;
    prepared.partitions = d.partitions.iter().cloned().collect();
    prepared.start_ms = d.start_ms;
    let image = broker.image();
    let txn_topic = image.topic_by_name(TRANSACTION_STATE).unwrap().clone();
    broker
        .append_records(
            &txn_topic,
            partition_for("tx", txn_topic.partitions),
            &[(
                Some(records::encode_key("tx")),
                Some(records::encode_value(&prepared)),
            )],
        )
        .await
        .unwrap();
    drop(broker);
    running.shutdown().await;

    let running = tessera_gateway::start(common::test_config(dir.path(), &[]))
        .await
        .unwrap();
    let broker = running.broker.clone();
    let mut done = false;
    for _ in 0..100 {
        if broker.txns().describe(&*broker, "tx").await.unwrap().state == TxnState::CompleteCommit {
            done = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(done, "the prepared commit was not completed");
    let o = offsets(&broker, 0);
    assert_eq!(o.last_stable, o.high_watermark);
    assert_eq!(o.high_watermark, 3); // two records and the COMMIT marker
    let image = broker.image();
    let topic = image.topic_by_name("t").unwrap().clone();
    let log = broker.route(&image, &topic, 0).unwrap().log;
    assert!(log.aborted_transactions(0, 0, 10).unwrap().is_empty());
    let committed = broker.groups().committed("g").await.expect("group loaded");
    assert_eq!(committed.get("t", 0).map(|o| o.offset), Some(2));
    drop(broker);
    running.shutdown().await;

    // And the committed offset survives another restart (replayed through the marker).
    let running = tessera_gateway::start(common::test_config(dir.path(), &[]))
        .await
        .unwrap();
    let committed = running.broker.groups().committed("g").await.expect("group");
    assert_eq!(committed.get("t", 0).map(|o| o.offset), Some(2));
    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timed_out_transaction_is_aborted_and_the_producer_fenced() {
    let dir = tempfile::tempdir().unwrap();
    let running = tessera_gateway::start(common::test_config(
        dir.path(),
        &[(
            "transaction.abort.timed.out.transaction.cleanup.interval.ms",
            "50",
        )],
    ))
    .await
    .unwrap();
    let broker = running.broker.clone();
    setup(&broker).await;
    let (pid, epoch) = broker
        .txns()
        .init_producer_id(&*broker, "slow", 300, None)
        .await
        .unwrap();
    broker
        .txns()
        .add_partitions(&*broker, "slow", pid, epoch, &[("t".into(), 1)])
        .await
        .unwrap();
    // Partition 0 is not in the transaction.
    assert!(matches!(
        broker.txns().check_produce(pid, epoch, "t", 0),
        Err(ApiError::InvalidTxnState(_))
    ));
    produce_txn(&broker, 1, pid, epoch, 0).await;
    assert_eq!(offsets(&broker, 1).last_stable, 0);
    common::eventually("the abort marker", || {
        let o = offsets(&broker, 1);
        o.last_stable == 3 && o.high_watermark == 3
    })
    .await;
    let d = broker.txns().describe(&*broker, "slow").await.unwrap();
    assert_eq!(d.state, TxnState::CompleteAbort);
    assert_eq!(d.producer_epoch, epoch + 1);
    let image = broker.image();
    let topic = image.topic_by_name("t").unwrap().clone();
    let log = broker.route(&image, &topic, 1).unwrap().log;
    assert_eq!(log.aborted_transactions(1, 0, 10).unwrap().len(), 1);
    // The old epoch is fenced everywhere.
    assert!(matches!(
        broker.txns().check_produce(pid, epoch, "t", 1),
        Err(ApiError::InvalidProducerEpoch(_))
    ));
    assert!(matches!(
        broker
            .txns()
            .end_txn(&*broker, "slow", pid, epoch, true)
            .await,
        Err(ApiError::ProducerFenced)
    ));
    assert!(matches!(
        broker
            .txns()
            .add_partitions(&*broker, "slow", pid, epoch, &[("t".into(), 1)])
            .await,
        Err(ApiError::ProducerFenced)
    ));
    // KIP-360: naming the fenced epoch is refused; a fresh init bumps again.
    assert!(matches!(
        broker
            .txns()
            .init_producer_id(&*broker, "slow", 300, Some((pid, epoch)))
            .await,
        Err(ApiError::ProducerFenced)
    ));
    let (pid2, epoch2) = broker
        .txns()
        .init_producer_id(&*broker, "slow", 300, None)
        .await
        .unwrap();
    assert_eq!((pid2, epoch2), (pid, epoch + 2));
    // Too long a timeout.
    assert!(matches!(
        broker
            .txns()
            .init_producer_id(&*broker, "other", 900_001, None)
            .await,
        Err(ApiError::InvalidTransactionTimeout)
    ));
    drop(broker);
    running.shutdown().await;
}

/// OffsetFetch with `require_stable` answers UNSTABLE_OFFSET_COMMIT while an
/// open transaction holds a pending offset for the partition, and the
/// committed offset once the transaction commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_stable_waits_for_the_transaction() {
    use kafka_protocol::messages::find_coordinator_request::FindCoordinatorRequest;
    use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
    use kafka_protocol::messages::txn_offset_commit_request::{
        TxnOffsetCommitRequestPartition, TxnOffsetCommitRequestTopic,
    };
    use kafka_protocol::messages::{
        AddOffsetsToTxnRequest, EndTxnRequest, GroupId, InitProducerIdRequest, OffsetFetchRequest,
        TopicName, TransactionalId, TxnOffsetCommitRequest,
    };
    use kafka_protocol::protocol::StrBytes;

    let dir = tempfile::tempdir().unwrap();
    let running = tessera_gateway::start(common::test_config(dir.path(), &[]))
        .await
        .unwrap();
    setup(&running.broker).await;
    let mut c = common::WireClient::connect(running.kafka_addr).await;
    let txn_id = TransactionalId(StrBytes::from_static_str("stable-txn"));
    let group = GroupId(StrBytes::from_static_str("stable-group"));
    for key_type in [0, 1] {
        let key = if key_type == 0 {
            "stable-group"
        } else {
            "stable-txn"
        };
        let fc = c
            .call(
                4,
                &FindCoordinatorRequest::default()
                    .with_key_type(key_type)
                    .with_coordinator_keys(vec![StrBytes::from_static_str(key)]),
            )
            .await;
        assert_eq!(fc.coordinators[0].error_code, 0, "{fc:?}");
    }
    let init = c
        .call(
            3,
            &InitProducerIdRequest::default()
                .with_transactional_id(Some(txn_id.clone()))
                .with_transaction_timeout_ms(60_000),
        )
        .await;
    assert_eq!(init.error_code, 0, "{init:?}");
    let (pid, epoch) = (init.producer_id, init.producer_epoch);
    let add = c
        .call(
            3,
            &AddOffsetsToTxnRequest::default()
                .with_transactional_id(txn_id.clone())
                .with_producer_id(pid)
                .with_producer_epoch(epoch)
                .with_group_id(group.clone()),
        )
        .await;
    assert_eq!(add.error_code, 0, "{add:?}");
    let commit = c
        .call(
            3,
            &TxnOffsetCommitRequest::default()
                .with_transactional_id(txn_id.clone())
                .with_group_id(group.clone())
                .with_producer_id(pid)
                .with_producer_epoch(epoch)
                .with_generation_id(-1)
                .with_topics(vec![TxnOffsetCommitRequestTopic::default()
                    .with_name(TopicName(StrBytes::from_static_str("t")))
                    .with_partitions(vec![TxnOffsetCommitRequestPartition::default()
                        .with_partition_index(0)
                        .with_committed_offset(42)])]),
        )
        .await;
    assert_eq!(commit.topics[0].partitions[0].error_code, 0, "{commit:?}");
    let fetch = |require_stable: bool| {
        OffsetFetchRequest::default()
            .with_group_id(group.clone())
            .with_require_stable(require_stable)
            .with_topics(Some(vec![OffsetFetchRequestTopic::default()
                .with_name(TopicName(StrBytes::from_static_str("t")))
                .with_partition_indexes(vec![0])]))
    };
    let unstable = c.call(7, &fetch(true)).await;
    assert_eq!(
        unstable.topics[0].partitions[0].error_code, 88,
        "{unstable:?}"
    );
    let plain = c.call(7, &fetch(false)).await;
    assert_eq!(plain.topics[0].partitions[0].error_code, 0);
    assert_eq!(plain.topics[0].partitions[0].committed_offset, -1);
    let end = c
        .call(
            3,
            &EndTxnRequest::default()
                .with_transactional_id(txn_id)
                .with_producer_id(pid)
                .with_producer_epoch(epoch)
                .with_committed(true),
        )
        .await;
    assert_eq!(end.error_code, 0, "{end:?}");
    let stable = c.call(7, &fetch(true)).await;
    assert_eq!(stable.topics[0].partitions[0].error_code, 0, "{stable:?}");
    assert_eq!(stable.topics[0].partitions[0].committed_offset, 42);
    running.shutdown().await;
}

/// WriteTxnMarkers over the wire (what another broker's coordinator, or an
/// admin aborting a hanging transaction, sends): a producer's open
/// transaction on a partition is ended by the marker, the last stable
/// offset moves past it, and a partition this broker does not have is
/// answered per partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_txn_markers_ends_a_transaction_on_this_broker() {
    use kafka_protocol::messages::write_txn_markers_request::{
        WritableTxnMarker, WritableTxnMarkerTopic,
    };
    use kafka_protocol::messages::{ProducerId, TopicName, WriteTxnMarkersRequest};
    use kafka_protocol::protocol::StrBytes;

    let dir = tempfile::tempdir().unwrap();
    let running = tessera_gateway::start(common::test_config(dir.path(), &[]))
        .await
        .unwrap();
    let broker = running.broker.clone();
    setup(&broker).await;
    // A transactional batch of a producer this broker coordinates nothing
    // for (its coordinator would be another broker): accepted, as Kafka 3.x
    // leaders accept it, and it holds the last stable offset back.
    produce_txn(&broker, 0, 4242, 3, 0).await;
    assert_eq!(offsets(&broker, 0).last_stable, 0);

    let topic = |name: &str, partitions: Vec<i32>| {
        WritableTxnMarkerTopic::default()
            .with_name(TopicName(StrBytes::from_string(name.into())))
            .with_partition_indexes(partitions)
    };
    let request =
        WriteTxnMarkersRequest::default().with_markers(vec![WritableTxnMarker::default()
            .with_producer_id(ProducerId(4242))
            .with_producer_epoch(3)
            .with_transaction_result(true)
            .with_coordinator_epoch(0)
            .with_topics(vec![topic("t", vec![0, 7]), topic("nope", vec![0])])]);
    // Kafka 4 serves v1 only (KIP-896 removed v0), as does this broker.
    for version in [1] {
        let mut c = common::WireClient::connect(running.kafka_addr).await;
        let r = c.call(version, &request).await;
        let codes: Vec<(String, i32, i16)> = r.markers[0]
            .topics
            .iter()
            .flat_map(|t| {
                t.partitions
                    .iter()
                    .map(|p| (t.name.0.to_string(), p.partition_index, p.error_code))
            })
            .collect();
        assert_eq!(
            codes,
            vec![
                ("t".to_string(), 0, 0),
                ("t".to_string(), 7, 3),
                ("nope".to_string(), 0, 3)
            ],
            "v{version}"
        );
    }
    // Committed: the two records and the marker are below the last stable offset.
    let o = offsets(&broker, 0);
    assert_eq!((o.last_stable, o.high_watermark), (3, 3));
    running.shutdown().await;
}
