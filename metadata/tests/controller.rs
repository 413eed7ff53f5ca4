//! Controller tests against a real data directory.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use tessera_metadata::*;

fn tid(n: u128) -> TopicId {
    uuid::Uuid::from_u128(n)
}

fn cfg(dir: &Path, snapshot_interval_entries: u64) -> ControllerConfig {
    ControllerConfig {
        snapshot_interval_entries,
        ..ControllerConfig::new(1, dir)
    }
}

fn topic(id: u128, name: &str, partitions: u32) -> MetadataRecord {
    MetadataRecord::CreateTopic(TopicRecord {
        topic_id: tid(id),
        name: name.into(),
        partitions,
        replication_factor: 1,
        configs: BTreeMap::from([("cleanup.policy".to_string(), "delete".to_string())]),
    })
}

fn setup_records() -> Vec<MetadataRecord> {
    vec![
        MetadataRecord::RegisterBroker(BrokerRegistration {
            broker_id: 1,
            incarnation_id: uuid::Uuid::from_u128(42),
            host: "localhost".into(),
            port: 9092,
            rack: Some("r1".into()),
        }),
        MetadataRecord::UnfenceBroker { broker_id: 1 },
        topic(1, "orders", 8),
        MetadataRecord::CreateRange(RangeRecord {
            range_id: 1,
            topic_id: tid(1),
            lo: 0,
            hi: 8,
            parents: vec![],
        }),
        MetadataRecord::OpenSegment(SegmentOpenRecord {
            segment: SegmentId::new(1, 0),
            replicas: vec![1],
            leader_epoch: 0,
        }),
    ]
}

/// Rolls range 1's active segment: seal seq `n`, open `n + 1`.
fn roll(n: u32) -> Vec<MetadataRecord> {
    vec![
        MetadataRecord::SealSegment(SegmentSealRecord {
            segment: SegmentId::new(1, n),
            size_bytes: 1000 + n as u64,
            spans: vec![PartitionSpan {
                partition: n % 8,
                start_offset: n as i64 * 10,
                end_offset: n as i64 * 10 + 10,
            }],
            leader_epoch: Some(0),
        }),
        MetadataRecord::OpenSegment(SegmentOpenRecord {
            segment: SegmentId::new(1, n + 1),
            replicas: vec![1],
            leader_epoch: 0,
        }),
    ]
}

#[tokio::test]
async fn write_then_restart_gives_the_same_image() {
    let dir = tempfile::tempdir().unwrap();
    let c = Controller::start(cfg(dir.path(), 1000)).await.unwrap();
    assert!(c.image().topics.is_empty());

    let off = c.write(setup_records()).await.unwrap();
    let img = c.image();
    assert_eq!(img.offset, off, "write returns after its entry is applied");
    let t = img.topic_by_name("orders").unwrap();
    assert_eq!(t.partitions, 8);
    assert_eq!(img.active_range_for(t.id, 5).unwrap().id, 1);
    assert_eq!(img.active_segment(1).unwrap().primary(), Some(1));
    assert!(!img.brokers[&1].fenced);

    let off2 = c.write(roll(0)).await.unwrap();
    assert_eq!(off2, off + 1);
    let before = c.image();
    c.shutdown().await;

    // The committed index is only a hint: without it the restart still
    // applies the whole committed log before returning.
    std::fs::remove_file(dir.path().join("committed.json")).unwrap();
    let c = Controller::start(cfg(dir.path(), 1000)).await.unwrap();
    assert_eq!(c.image(), before);
    // And it keeps going.
    let off3 = c.write(roll(1)).await.unwrap();
    assert!(off3 > off2);
    assert_eq!(c.image().segments_of(1).len(), 3);
    c.shutdown().await;
}

#[tokio::test]
async fn snapshot_plus_tail_restart_gives_the_same_image() {
    let dir = tempfile::tempdir().unwrap();
    let c = Controller::start(cfg(dir.path(), 20)).await.unwrap();
    c.write(setup_records()).await.unwrap();
    for n in 0..75 {
        c.write(roll(n)).await.unwrap();
    }
    // Wait for the snapshot/purge that the last writes may have triggered.
    let m = c
        .raft()
        .wait(Some(std::time::Duration::from_secs(10)))
        .metrics(
            |m| m.snapshot.is_some() && m.purged.is_some(),
            "snapshot and purge",
        )
        .await
        .unwrap();
    let snap_index = m.snapshot.unwrap().index;
    assert!(snap_index >= 20, "{snap_index}");
    let before = c.image();
    assert_eq!(before.segments_of(1).len(), 76);
    c.shutdown().await;
    assert!(dir.path().join("snapshot").exists());

    let c = Controller::start(cfg(dir.path(), 20)).await.unwrap();
    assert_eq!(c.image(), before);
    let m = c.raft().metrics().borrow().clone();
    let restored_from = m.snapshot.unwrap().index;
    assert!(restored_from >= snap_index);
    assert!(
        (restored_from as i64) < before.offset,
        "the restart replayed a tail after the snapshot"
    );
    c.write(roll(75)).await.unwrap();
    c.shutdown().await;
}

/// A snapshot and the log it replaces decode to the same image: the same
/// writes with and without snapshots end in equal images, also after a
/// restart (snapshot + tail vs. full log replay).
#[tokio::test]
async fn snapshot_and_log_decode_to_the_same_image() {
    let with_snap = tempfile::tempdir().unwrap();
    let log_only = tempfile::tempdir().unwrap();
    let a = Controller::start(cfg(with_snap.path(), 7)).await.unwrap();
    let b = Controller::start(cfg(log_only.path(), 1_000_000))
        .await
        .unwrap();
    let mut batches = vec![setup_records(), vec![topic(2, "payments", 3)]];
    for n in 0..30 {
        batches.push(roll(n));
        if n % 10 == 9 {
            batches.push(vec![MetadataRecord::SetLogStartOffset {
                topic_id: tid(1),
                partition: 0,
                offset: n as i64,
            }]);
            batches.push(vec![MetadataRecord::DeleteSegment {
                segment: SegmentId::new(1, n - 5),
            }]);
        }
    }
    batches.push(vec![MetadataRecord::DeleteTopic { topic_id: tid(2) }]);
    for batch in batches {
        let x = a.write(batch.clone()).await.unwrap();
        let y = b.write(batch).await.unwrap();
        assert_eq!(x, y);
    }
    assert_eq!(a.image(), b.image());
    let image = a.image();
    a.shutdown().await;
    b.shutdown().await;

    let a = Controller::start(cfg(with_snap.path(), 7)).await.unwrap();
    let b = Controller::start(cfg(log_only.path(), 1_000_000))
        .await
        .unwrap();
    assert!(a.raft().metrics().borrow().snapshot.is_some());
    assert!(b.raft().metrics().borrow().snapshot.is_none());
    assert_eq!(a.image(), image);
    assert_eq!(b.image(), image);
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test]
async fn skipped_records_are_reported_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let c = Controller::start(cfg(dir.path(), 1000)).await.unwrap();
    c.write(vec![topic(1, "orders", 1)]).await.unwrap();
    let before = c.image();
    let out = c
        .write_detailed(vec![topic(2, "orders", 1), topic(3, "other", 1)])
        .await
        .unwrap();
    assert_eq!(out.skipped, vec![0]);
    let after = c.image();
    assert_eq!(after.offset, out.offset);
    assert_eq!(after.topic_by_name("orders").unwrap().id, tid(1));
    assert!(after.topic_by_name("other").is_some());
    assert_eq!(before.topics.len() + 1, after.topics.len());
    c.shutdown().await;
}

#[tokio::test]
async fn invalid_records_are_refused_before_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let c = Controller::start(cfg(dir.path(), 1000)).await.unwrap();
    let before = c.image();
    let err = c
        .write(vec![MetadataRecord::NoOp, topic(1, "orders", 0)])
        .await
        .unwrap_err();
    assert!(
        matches!(err, MetadataError::InvalidRecord { index: 1, .. }),
        "{err}"
    );
    assert!(!c.is_failed());
    assert_eq!(c.image(), before);
    // Still healthy.
    c.write(vec![topic(1, "orders", 1)]).await.unwrap();
    c.shutdown().await;
}

#[tokio::test]
async fn undecodable_record_stops_the_controller() {
    let dir = tempfile::tempdir().unwrap();
    let c = Controller::start(cfg(dir.path(), 1000)).await.unwrap();
    c.write(vec![topic(1, "orders", 1)]).await.unwrap();
    let before = c.image();
    assert!(!c.is_failed());

    let err = c
        .write_raw(vec![MetadataRecord::NoOp.encode(), vec![0, 99, 0, 0]])
        .await
        .unwrap_err();
    assert!(
        matches!(err, MetadataError::Failed | MetadataError::Replay(_)),
        "{err}"
    );
    assert!(c.is_failed());
    assert!(matches!(
        c.failure(),
        Some(MetadataReplayError::UndecodableRecord {
            reason: RecordDecodeError::UnknownType(99),
            ..
        })
    ));
    // The bad entry applied nothing.
    assert_eq!(c.image(), before);
    assert!(c.write(vec![topic(2, "x", 1)]).await.is_err());
    c.shutdown().await;

    // The record is committed: a restart replays it and stops again.
    let err = Controller::start(cfg(dir.path(), 1000)).await.unwrap_err();
    assert!(
        matches!(
            err,
            MetadataError::Replay(MetadataReplayError::UndecodableRecord { .. })
        ),
        "{err}"
    );
}

#[tokio::test]
async fn subscribers_see_each_applied_write() {
    let dir = tempfile::tempdir().unwrap();
    let c = Arc::new(Controller::start(cfg(dir.path(), 1000)).await.unwrap());
    let mut rx = c.subscribe();
    let off = c.write(vec![topic(1, "orders", 1)]).await.unwrap();
    rx.changed().await.unwrap();
    let img = rx.borrow_and_update().clone();
    assert_eq!(img.offset, off);
    assert!(img.topic_by_name("orders").is_some());
    c.shutdown().await;
}

#[tokio::test]
async fn a_directory_serves_one_controller_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let c = Controller::start(cfg(dir.path(), 1000)).await.unwrap();
    let err = Controller::start(cfg(dir.path(), 1000)).await.unwrap_err();
    assert!(matches!(err, MetadataError::Locked(_)), "{err}");
    c.shutdown().await;
    c.shutdown().await; // idempotent
    let c = Controller::start(cfg(dir.path(), 1000)).await.unwrap();
    c.shutdown().await;

    // Dropped without shutdown: raft still runs, so the directory stays locked.
    let c = Controller::start(cfg(dir.path(), 1000)).await.unwrap();
    drop(c);
    let err = Controller::start(cfg(dir.path(), 1000)).await.unwrap_err();
    assert!(matches!(err, MetadataError::Locked(_)), "{err}");
}

#[tokio::test]
async fn torn_log_tail_is_cut_off_on_restart() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let c = Controller::start(cfg(dir.path(), 1000)).await.unwrap();
    c.write(setup_records()).await.unwrap();
    let before = c.image();
    c.shutdown().await;

    // Simulate a crash in the middle of an append: half a frame at the end.
    let mut logs: Vec<_> = std::fs::read_dir(dir.path().join("log"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    logs.sort();
    let newest = logs.last().unwrap();
    let len = std::fs::metadata(newest).unwrap().len();
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(newest)
        .unwrap();
    f.write_all(&[0, 0, 0, 50, 1, 2, 3, 4, 5]).unwrap();
    drop(f);

    let c = Controller::start(cfg(dir.path(), 1000)).await.unwrap();
    assert_eq!(c.image(), before);
    assert_eq!(
        std::fs::metadata(newest).unwrap().len(),
        len,
        "the torn frame was cut off"
    );
    c.write(roll(0)).await.unwrap();
    let after = c.image();
    c.shutdown().await;
    assert!(std::fs::metadata(newest).unwrap().len() > len);
    let c = Controller::start(cfg(dir.path(), 1000)).await.unwrap();
    assert_eq!(c.image(), after);
    c.shutdown().await;
}
