//! The replication I/O end to end in one process: a primary's range log
//! shipped over real TCP to a follower service, commits only with the
//! follower's ack, identical bytes on both sides, fence and repair reads.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tessera_log::batch::testing::make_batch;
use tessera_log::{RangeLog, RangeLogOptions};
use tessera_replication::auth::Plaintext;
use tessera_replication::primary::{FollowerSet, PeerAddresses, Replication};
use tessera_replication::protocol::{Message, SegmentKey};
use tessera_replication::replica_store::ReplicaStore;
use tessera_replication::service::{self, Directory, Refusal};
use tokio::io::AsyncReadExt;

/// This broker's directory: a follower of broker 1 keeping copies under
/// `path`, and the primary of the range with `leads`, if set.
struct FollowerDir {
    path: PathBuf,
    leads: Option<Arc<RangeLog>>,
}

impl Directory for FollowerDir {
    fn follower_dir(&self, _: SegmentKey, primary: i32, _: i32) -> Result<PathBuf, Refusal> {
        if primary == 1 {
            Ok(self.path.clone())
        } else {
            Err(Refusal {
                retry: false,
                reason: "not my primary".into(),
            })
        }
    }
    fn range_dir(&self, _: SegmentKey) -> Option<PathBuf> {
        Some(self.path.clone())
    }
    fn primary_log(&self, _: u64) -> Option<Arc<RangeLog>> {
        self.leads.clone()
    }
    fn copy_clean_pass(&self, _: SegmentKey) -> Option<u64> {
        Some(0)
    }
    fn segment_sealed(&self, _: SegmentKey) -> Option<bool> {
        None
    }
    fn segment_epoch(&self, _: SegmentKey) -> Option<i32> {
        None
    }
    fn is_registered_broker(&self, broker: i32) -> bool {
        broker == 1
    }
}

struct Peers(String);
impl PeerAddresses for Peers {
    fn address_of(&self, _: i32) -> Option<String> {
        Some(self.0.clone())
    }
    fn connector(&self) -> Arc<dyn tessera_replication::auth::Connector> {
        Arc::new(Plaintext)
    }
}

/// A follower listening on a loopback port: strips the upgrade request and
/// serves the stream.
async fn follower(dir: PathBuf) -> (String, Arc<ReplicaStore>, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let store = Arc::new(ReplicaStore::default());
    let s = store.clone();
    let task = tokio::spawn(async move {
        loop {
            let (conn, _) = listener.accept().await.unwrap();
            let (mut r, w) = conn.into_split();
            let mut upgrade = [0u8; 14];
            r.read_exact(&mut upgrade).await.unwrap();
            let dir: Arc<dyn Directory> = Arc::new(FollowerDir {
                path: dir.clone(),
                leads: None,
            });
            tokio::spawn(service::serve(r, w, s.clone(), dir));
        }
    });
    (addr, store, task)
}

fn primary_log(dir: &std::path::Path) -> Arc<RangeLog> {
    RangeLog::open(
        RangeLogOptions {
            segment_bytes: 1 << 30,
            replicated: true,
            ..RangeLogOptions::new(dir, 0, 2)
        },
        tokio::sync::watch::channel(0).0,
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_wait_for_the_follower_and_both_copies_are_identical() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let log = primary_log(a.path());
    // No follower listening yet: nothing commits (RF=2 needs both).
    let dead = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead_addr = dead.local_addr().unwrap().to_string();
    drop(dead);
    let r = Replication::start(
        log.clone(),
        7,
        1,
        FollowerSet::new(vec![2], 0),
        Arc::new(Peers(dead_addr)),
        1,
        Duration::from_secs(30),
    );
    let mut batch = make_batch(3, 1000);
    let out = log.append(0, &mut batch, None).unwrap();
    log.wait_local_durable(out.end_position).await.unwrap();
    let waited = tokio::time::timeout(
        Duration::from_millis(500),
        log.wait_durable(out.end_position),
    )
    .await;
    assert!(waited.is_err(), "committed without the follower");
    assert_eq!(log.offsets(0).unwrap().high_watermark, 0);
    r.stop();

    // With the follower: the earlier append and new ones commit.
    let (addr, store, task) = follower(b.path().to_path_buf()).await;
    let r = Replication::start(
        log.clone(),
        7,
        1,
        FollowerSet::new(vec![2], 0),
        Arc::new(Peers(addr.clone())),
        1,
        Duration::from_secs(30),
    );
    let mut last = out.end_position;
    for i in 0..50 {
        let mut batch = make_batch(1 + i % 4, 2000 + i as i64);
        last = log
            .append((i % 2) as u32, &mut batch, None)
            .unwrap()
            .end_position;
    }
    tokio::time::timeout(Duration::from_secs(10), log.wait_durable(last))
        .await
        .expect("commit with the follower's ack")
        .unwrap();
    assert!(log.offsets(0).unwrap().high_watermark > 0);
    assert_eq!(r.in_sync().len(), 2);
    let key = SegmentKey { range: 7, seq: 0 };
    let primary_bytes = std::fs::read(tessera_log::segment::log_path(a.path(), 0)).unwrap();
    let follower_bytes = std::fs::read(tessera_log::segment::log_path(b.path(), 0)).unwrap();
    assert_eq!(primary_bytes, follower_bytes);
    assert_eq!(
        store.get(key).unwrap().lock().state().durable,
        primary_bytes.len() as u64
    );

    // Fence: the follower reports its durable end and refuses more appends.
    match service::call(
        &Plaintext,
        &addr,
        &Message::Fence {
            segment: key,
            epoch: 0,
        },
        Duration::from_secs(5),
    )
    .await
    .unwrap()
    {
        Message::Fenced { end, spans, .. } => {
            assert_eq!(end, primary_bytes.len() as u64);
            assert_eq!(spans.len(), 2);
        }
        other => panic!("{other:?}"),
    }
    let mut batch = make_batch(1, 3000);
    let after = log.append(0, &mut batch, None).unwrap().end_position;
    let waited = tokio::time::timeout(Duration::from_millis(500), log.wait_durable(after)).await;
    assert!(waited.is_err(), "committed after the follower was fenced");

    // A repair read serves whole frames from the copy.
    match service::call(
        &Plaintext,
        &addr,
        &Message::Read {
            segment: key,
            from: 0,
            max: 100,
            pass: 0,
            epoch: 0,
        },
        Duration::from_secs(5),
    )
    .await
    .unwrap()
    {
        Message::Data { frames, .. } => {
            assert!(!frames.is_empty());
            tessera_log::segment::parse_frames(&frames, 0).unwrap();
        }
        other => panic!("{other:?}"),
    }
    // A read naming another cleaning pass than the copy's is refused (its
    // bytes at the same positions differ).
    let other_pass = Message::Read {
        segment: key,
        from: 0,
        max: 100,
        pass: 1,
        epoch: 0,
    };
    match service::call(&Plaintext, &addr, &other_pass, Duration::from_secs(5))
        .await
        .unwrap()
    {
        Message::Refused { retry: true, .. } => {}
        other => panic!("{other:?}"),
    }
    r.stop();
    task.abort();
}

#[tokio::test]
async fn a_copy_truncates_past_the_seal_and_repairs_up_to_it() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let log = primary_log(a.path());
    let mut ends = vec![];
    for i in 0..6 {
        let mut batch = make_batch(2, 100 + i);
        ends.push(log.append(0, &mut batch, None).unwrap().end_position);
    }
    let all = log.frames(0, 0, 1 << 20).unwrap().unwrap().bytes;
    let key = SegmentKey { range: 1, seq: 0 };
    let store = ReplicaStore::default();
    let copy = store.copy(key, b.path()).unwrap();
    // Only at its end.
    assert_eq!(
        copy.lock().append(5, &all).unwrap(),
        tessera_replication::Offer::Mismatch { end: 0 }
    );
    assert_eq!(
        copy.lock().append(0, &all).unwrap(),
        tessera_replication::Offer::Accept
    );
    // Sealed shorter (a quorum had less): cut to the seal.
    let seal = ends[3];
    assert_eq!(
        copy.lock().seal(seal).unwrap(),
        tessera_replication::SealAction::Truncate { size: seal }
    );
    assert_eq!(
        std::fs::metadata(tessera_log::segment::log_path(b.path(), 0))
            .unwrap()
            .len(),
        seal
    );
    // Reopened after a restart: still sealed and fenced, refuses appends.
    let store = ReplicaStore::default();
    let copy = store.copy(key, b.path()).unwrap();
    assert_eq!(
        copy.lock().append(seal, &all[..10]).unwrap(),
        tessera_replication::Offer::Refused
    );

    // A short copy repairs up to the seal from a peer's bytes.
    let c = tempfile::tempdir().unwrap();
    let store = ReplicaStore::default();
    let short = store.copy(key, c.path()).unwrap();
    let first = log.frames(0, 0, 1).unwrap().unwrap().bytes;
    short.lock().append(0, &first).unwrap();
    assert_eq!(
        short.lock().seal(seal).unwrap(),
        tessera_replication::SealAction::Repair {
            from: first.len() as u64,
            size: seal
        }
    );
    let rest = &all[first.len()..seal as usize];
    assert!(short.lock().repair(first.len() as u64, rest).unwrap());
    assert_eq!(short.lock().state().written, seal);
    assert_eq!(
        std::fs::read(tessera_log::segment::log_path(c.path(), 0)).unwrap(),
        all[..seal as usize].to_vec()
    );
}

/// A follower copy of `seq` of `log`, sealed, in `dir` (what the stream and
/// the seal leave on a follower).
fn sealed_copy(log: &RangeLog, seq: u32, dir: &std::path::Path) {
    let frames = log.frames(seq, 0, 1 << 20).unwrap().unwrap().bytes;
    let store = ReplicaStore::default();
    let copy = store.copy(SegmentKey { range: 7, seq }, dir).unwrap();
    assert_eq!(
        copy.lock().append(0, &frames).unwrap(),
        tessera_replication::Offer::Accept
    );
    assert_eq!(
        copy.lock().seal(frames.len() as u64).unwrap(),
        tessera_replication::SealAction::Complete
    );
}

/// The range log a broker holding only `dir`'s segments opens when it
/// becomes primary: a new empty active segment after the copies, offsets
/// from the image's sealed spans, the history before the copies elsewhere.
fn new_primary_log(
    dir: &std::path::Path,
    next_seq: u32,
    remote_history: BTreeMap<u32, Vec<i64>>,
) -> Arc<RangeLog> {
    std::fs::File::create(tessera_log::segment::log_path(dir, next_seq)).unwrap();
    RangeLog::open(
        RangeLogOptions {
            segment_bytes: 1 << 30,
            leader_epoch: 1,
            min_next_offsets: remote_history[&next_seq].clone(),
            remote_history: Some(remote_history),
            replicated: true,
            ..RangeLogOptions::new(dir, 0, 2)
        },
        tokio::sync::watch::channel(0).0,
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_without_the_older_segments_fetches_the_producer_snapshot_and_leads_with_it() {
    use tessera_log::aborted_index_file::aborted_path;
    use tessera_log::batch::testing::{
        make_control_batch, make_idempotent_batch, make_transactional_batch,
    };
    use tessera_log::producer_snapshot_file::snapshot_path;
    use tessera_log::txn_state::AbortedTxn;
    use tessera_replication::snapshot_transfer;

    let (a, b, c) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    // Where segments 1 and 2 start per partition, as the image records it.
    let starts = || BTreeMap::from([(1, vec![9, 0]), (2, vec![11, 0])]);
    let log = primary_log(a.path());
    // Segment 0 (partition 0): an idempotent producer at epoch 0, then at
    // epoch 1 (KIP-360 bump), and a transaction still open at the roll.
    let append = |batch: &mut Vec<u8>| log.append(0, batch, None).unwrap();
    assert_eq!(
        append(&mut make_idempotent_batch(3, 10, 7, 0, 0)).base_offset,
        0
    );
    assert_eq!(
        append(&mut make_idempotent_batch(2, 11, 7, 1, 0)).base_offset,
        3
    );
    assert_eq!(
        append(&mut make_transactional_batch(2, 12, 9, 0, 0)).base_offset,
        5
    );
    // ... and one aborted before the roll.
    assert_eq!(
        append(&mut make_transactional_batch(1, 12, 11, 0, 0)).base_offset,
        7
    );
    assert_eq!(append(&mut make_control_batch(11, 0, false)).base_offset, 8);
    assert_eq!(log.roll().unwrap().unwrap().next_seq, 1);
    // Segment 1: the open transaction's abort marker and the producer going on.
    assert_eq!(append(&mut make_control_batch(9, 0, false)).base_offset, 9);
    assert_eq!(
        append(&mut make_idempotent_batch(1, 13, 7, 1, 2)).base_offset,
        10
    );
    assert_eq!(log.roll().unwrap().unwrap().next_seq, 2);

    // The primary serves `<1>.snapshot`; a segment without one is refused.
    let (addr, _store, task) = follower(a.path().to_path_buf()).await;
    let seg1 = SegmentKey { range: 7, seq: 1 };
    // Taken where segment 1 starts (partition 0 at 9), or refused: a
    // snapshot from a longer history is never kept.
    let at = |offset| BTreeMap::from([(0u32, offset)]);
    let wait = Duration::from_secs(5);
    for wrong in [8, 10] {
        let starts = at(wrong);
        let refused = snapshot_transfer::fetch(&Plaintext, &addr, seg1, b.path(), &starts, wait);
        assert!(refused.await.is_err(), "start {wrong}");
        assert!(!snapshot_path(b.path(), 1).exists());
    }
    snapshot_transfer::fetch(&Plaintext, &addr, seg1, b.path(), &at(9), wait)
        .await
        .unwrap();
    for path in [snapshot_path, aborted_path] {
        assert_eq!(
            std::fs::read(path(b.path(), 1)).unwrap(),
            std::fs::read(path(a.path(), 1)).unwrap()
        );
    }
    let seg5 = SegmentKey { range: 7, seq: 5 };
    match service::call(
        &Plaintext,
        &addr,
        &Message::ReadSnapshot { segment: seg5 },
        Duration::from_secs(5),
    )
    .await
    .unwrap()
    {
        Message::Refused { retry: false, .. } => {}
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert!(
        snapshot_transfer::fetch(&Plaintext, &addr, seg5, c.path(), &BTreeMap::new(), wait)
            .await
            .is_err()
    );
    assert!(!snapshot_path(c.path(), 5).exists());
    task.abort();

    // The follower holds segment 1 only (it joined there) and becomes
    // primary of segment 2: the snapshot gives it the history's producers.
    sealed_copy(&log, 1, b.path());
    let led = new_primary_log(b.path(), 2, starts());
    assert_eq!(
        led.producer_states(0).unwrap(),
        log.producer_states(0).unwrap()
    );
    let retry = led
        .append(0, &mut make_idempotent_batch(2, 11, 7, 1, 0), None)
        .unwrap();
    assert!(retry.duplicate && retry.base_offset == 3, "{retry:?}");
    assert!(matches!(
        led.append(0, &mut make_idempotent_batch(1, 14, 7, 0, 3), None),
        Err(tessera_log::LogError::Sequence(
            tessera_log::producer_state::SequenceError::InvalidProducerEpoch { .. }
        ))
    ));
    // read_committed: the abort in segment 0 (held elsewhere only), and
    // the one marked in segment 1 that covers data of segment 0.
    let aborted = led.aborted_transactions(0, 0, 100).unwrap();
    assert_eq!(
        aborted,
        vec![
            AbortedTxn {
                producer_id: 11,
                first_offset: 7,
                last_offset: 8
            },
            AbortedTxn {
                producer_id: 9,
                first_offset: 5,
                last_offset: 9
            }
        ]
    );
    assert_eq!(aborted, log.aborted_transactions(0, 0, 100).unwrap());
    // Its own followers of segment 2 can fetch from it in turn.
    assert!(snapshot_path(b.path(), 2).exists() && aborted_path(b.path(), 2).exists());

    // Without the snapshot, the same copy knows none of it (the bug).
    sealed_copy(&log, 1, c.path());
    let blind = new_primary_log(c.path(), 2, starts());
    assert_ne!(
        blind.producer_states(0).unwrap(),
        log.producer_states(0).unwrap()
    );
    assert!(!matches!(
        blind.append(0, &mut make_idempotent_batch(2, 11, 7, 1, 0), None),
        Ok(o) if o.duplicate
    ));
    assert_eq!(blind.aborted_transactions(0, 0, 100).unwrap(), vec![]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_missed_segments_reloads_from_the_snapshot_after_the_gap() {
    use tessera_log::batch::testing::{
        make_control_batch, make_idempotent_batch, make_transactional_batch,
    };
    use tessera_log::txn_state::AbortedTxn;
    use tessera_replication::snapshot_transfer;

    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let log = primary_log(a.path());
    let append = |batch: &mut Vec<u8>| log.append(0, batch, None).unwrap();
    append(&mut make_idempotent_batch(3, 10, 7, 0, 0));
    log.roll().unwrap();
    // Segment 1, which the replica misses: the epoch bump, a transaction
    // left open and one aborted.
    assert_eq!(
        append(&mut make_idempotent_batch(2, 11, 7, 1, 0)).base_offset,
        3
    );
    assert_eq!(
        append(&mut make_transactional_batch(2, 12, 9, 0, 0)).base_offset,
        5
    );
    assert_eq!(
        append(&mut make_transactional_batch(1, 12, 11, 0, 0)).base_offset,
        7
    );
    assert_eq!(append(&mut make_control_batch(11, 0, false)).base_offset, 8);
    log.roll().unwrap();
    assert_eq!(append(&mut make_control_batch(9, 0, false)).base_offset, 9);
    log.roll().unwrap();

    // The replica holds segments 0 and 2 and fetched `<2>.snapshot`
    // (following 2 without 1); it leads segment 3.
    let (addr, _store, task) = follower(a.path().to_path_buf()).await;
    snapshot_transfer::fetch(
        &Plaintext,
        &addr,
        SegmentKey { range: 7, seq: 2 },
        b.path(),
        &BTreeMap::from([(0, 9)]),
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    task.abort();
    sealed_copy(&log, 0, b.path());
    sealed_copy(&log, 2, b.path());
    let starts = BTreeMap::from([(0, vec![0, 0]), (2, vec![9, 0]), (3, vec![10, 0])]);
    let led = new_primary_log(b.path(), 3, starts);
    assert_eq!(
        led.producer_states(0).unwrap(),
        log.producer_states(0).unwrap()
    );
    let retry = led
        .append(0, &mut make_idempotent_batch(2, 11, 7, 1, 0), None)
        .unwrap();
    assert!(retry.duplicate && retry.base_offset == 3, "{retry:?}");
    assert_eq!(
        led.aborted_transactions(0, 0, 100).unwrap(),
        vec![
            AbortedTxn {
                producer_id: 11,
                first_offset: 7,
                last_offset: 8
            },
            AbortedTxn {
                producer_id: 9,
                first_offset: 5,
                last_offset: 9
            }
        ]
    );
}

/// A broker that joined a range late (it followed segment 3 and fetched
/// `<3>.snapshot` and `<3>.aborted`) and then received copies of older
/// sealed segments, but not of all of them (here not of segment 1, which
/// holds an abort marker), leads with every aborted transaction of the
/// history: the one marked in the segment it lacks included (the fault
/// harness's aborted reads after joins).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_replica_with_repaired_older_copies_keeps_the_aborts_it_does_not_hold() {
    use tessera_log::batch::testing::{
        make_control_batch, make_idempotent_batch, make_transactional_batch,
    };
    use tessera_log::txn_state::AbortedTxn;
    use tessera_replication::snapshot_transfer;

    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let log = primary_log(a.path());
    let append = |batch: &mut Vec<u8>| log.append(0, batch, None).unwrap().base_offset;
    assert_eq!(append(&mut make_idempotent_batch(3, 10, 7, 0, 0)), 0);
    assert_eq!(append(&mut make_idempotent_batch(2, 11, 7, 1, 0)), 3);
    // Producer 9's transaction, open at the roll...
    assert_eq!(append(&mut make_transactional_batch(2, 12, 9, 0, 0)), 5);
    log.roll().unwrap();
    // ... aborted in segment 1, which the late replica never holds.
    assert_eq!(append(&mut make_control_batch(9, 0, false)), 7);
    log.roll().unwrap();
    // Segment 2: producer 9 commits one transaction, aborts the next.
    assert_eq!(append(&mut make_transactional_batch(1, 13, 9, 0, 2)), 8);
    assert_eq!(append(&mut make_control_batch(9, 0, true)), 9);
    assert_eq!(append(&mut make_transactional_batch(1, 14, 9, 0, 3)), 10);
    assert_eq!(append(&mut make_control_batch(9, 0, false)), 11);
    log.roll().unwrap();
    assert_eq!(append(&mut make_idempotent_batch(1, 15, 7, 1, 2)), 12);
    log.roll().unwrap();
    let expected = vec![
        AbortedTxn {
            producer_id: 9,
            first_offset: 5,
            last_offset: 7,
        },
        AbortedTxn {
            producer_id: 9,
            first_offset: 10,
            last_offset: 11,
        },
    ];
    assert_eq!(log.aborted_transactions(0, 0, 100).unwrap(), expected);

    let (addr, _store, task) = follower(a.path().to_path_buf()).await;
    snapshot_transfer::fetch(
        &Plaintext,
        &addr,
        SegmentKey { range: 7, seq: 3 },
        b.path(),
        &BTreeMap::from([(0, 12)]),
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    task.abort();
    for seq in [0, 2, 3] {
        sealed_copy(&log, seq, b.path());
    }
    let starts = BTreeMap::from([
        (0, vec![0, 0]),
        (1, vec![7, 0]),
        (2, vec![8, 0]),
        (3, vec![12, 0]),
        (4, vec![13, 0]),
    ]);
    let led = new_primary_log(b.path(), 4, starts.clone());
    assert_eq!(led.aborted_transactions(0, 0, 100).unwrap(), expected);
    assert_eq!(
        led.producer_states(0).unwrap(),
        log.producer_states(0).unwrap()
    );
    // And again after a restart (the fetched files are kept with their
    // segment).
    led.close();
    drop(led);
    let reopened = new_primary_log(b.path(), 4, starts);
    assert_eq!(reopened.aborted_transactions(0, 0, 100).unwrap(), expected);
}

/// A copy healing dropped from the replica set is set aside (no `.log`
/// file a range log or a copy would open), put back if the set lists the
/// broker again, and deleted only on request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_copy_is_set_aside_restored_or_deleted() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let log = primary_log(a.path());
    log.append(0, &mut make_batch(3, 1), None).unwrap();
    log.roll().unwrap();
    sealed_copy(&log, 0, b.path());
    let seg0 = SegmentKey { range: 7, seq: 0 };
    let path = tessera_log::segment::log_path(b.path(), 0);
    let bytes = std::fs::read(&path).unwrap();
    let store = ReplicaStore::default();
    store.copy(seg0, b.path()).unwrap();
    assert!(store.set_aside(seg0, b.path()).unwrap());
    assert!(!path.exists() && store.get(seg0).is_none());
    assert!(ReplicaStore::has_set_aside(seg0, b.path()));
    assert!(
        !store.set_aside(seg0, b.path()).unwrap(),
        "nothing left to set aside"
    );
    assert!(store.restore(seg0, b.path()).unwrap());
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
    assert!(!ReplicaStore::has_set_aside(seg0, b.path()));
    assert!(store.set_aside(seg0, b.path()).unwrap());
    assert!(ReplicaStore::discard_set_aside(seg0, b.path()).unwrap());
    assert!(!ReplicaStore::has_set_aside(seg0, b.path()) && !path.exists());
    assert!(!store.restore(seg0, b.path()).unwrap());
    assert_eq!(
        std::fs::read_dir(b.path()).unwrap().count(),
        0,
        "no file of the copy left"
    );
}

/// A broker that fetched `<2>.aborted` before leading (segment 2 holds no
/// data of partition 0 and this broker no copy of it: in fault run seed 9
/// it was sealed empty) keeps that file and its entries, the only list of
/// the history's aborts it has ("no aborted-transaction file covers" on a
/// late replica, and aborted records read).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aborted_list_fetched_at_an_empty_segment_it_holds_no_copy_of_is_kept() {
    use tessera_log::aborted_index_file::aborted_path;
    use tessera_log::batch::testing::{make_control_batch, make_transactional_batch};
    use tessera_log::txn_state::AbortedTxn;
    use tessera_replication::snapshot_transfer;

    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let log = primary_log(a.path());
    let append = |batch: &mut Vec<u8>| log.append(0, batch, None).unwrap().base_offset;
    assert_eq!(append(&mut make_transactional_batch(2, 12, 9, 0, 0)), 0);
    assert_eq!(append(&mut make_control_batch(9, 0, false)), 2);
    log.roll().unwrap();
    assert_eq!(append(&mut make_batch(1, 1)), 3);
    assert_eq!(log.roll().unwrap().unwrap().next_seq, 2);
    // Segment 2 holds partition 1 only; segment 3 partition 0 again.
    log.append(1, &mut make_batch(1, 1), None).unwrap();
    assert_eq!(log.roll().unwrap().unwrap().next_seq, 3);
    assert_eq!(append(&mut make_batch(1, 1)), 4);
    assert_eq!(log.roll().unwrap().unwrap().next_seq, 4);
    let aborted = vec![AbortedTxn {
        producer_id: 9,
        first_offset: 0,
        last_offset: 2,
    }];

    let (addr, _store, task) = follower(a.path().to_path_buf()).await;
    snapshot_transfer::fetch(
        &Plaintext,
        &addr,
        SegmentKey { range: 7, seq: 2 },
        b.path(),
        &BTreeMap::from([(0, 4)]),
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    task.abort();
    sealed_copy(&log, 3, b.path());
    let starts = || {
        BTreeMap::from([
            (0, vec![0, 0]),
            (1, vec![3, 0]),
            (2, vec![4, 0]),
            (3, vec![4, 1]),
            (4, vec![5, 1]),
        ])
    };
    let led = new_primary_log(b.path(), 4, starts());
    assert_eq!(led.aborted_transactions(0, 0, 100).unwrap(), aborted);
    assert!(aborted_path(b.path(), 2).exists(), "kept for the next open");
    led.close();
    drop(led);
    let reopened = new_primary_log(b.path(), 4, starts());
    assert_eq!(reopened.aborted_transactions(0, 0, 100).unwrap(), aborted);
}

/// A split child led by a broker without its parent's log (it followed
/// the child and fetched `<0>.snapshot` and `<0>.aborted` from the child's
/// first primary) knows the parent's aborted transactions: the child
/// inherits them, its files list them, and read_committed fetches of the
/// parent's offsets drop them (fault run seed 9's aborted reads after
/// range moves).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_led_without_its_parents_log_knows_their_aborted_transactions() {
    use tessera_log::batch::testing::{make_control_batch, make_transactional_batch};
    use tessera_log::txn_state::AbortedTxn;
    use tessera_replication::snapshot_transfer;

    let (a, b, c) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let parent = primary_log(a.path());
    let append = |log: &RangeLog, batch: &mut Vec<u8>| log.append(0, batch, None).unwrap();
    append(&parent, &mut make_batch(5, 1));
    assert_eq!(
        append(&parent, &mut make_transactional_batch(2, 12, 9, 0, 0)).base_offset,
        5
    );
    assert_eq!(
        append(&parent, &mut make_control_batch(9, 0, false)).base_offset,
        7
    );
    parent.seal().unwrap();
    let aborted = vec![AbortedTxn {
        producer_id: 9,
        first_offset: 5,
        last_offset: 7,
    }];
    assert_eq!(parent.aborted_transactions(0, 0, 100).unwrap(), aborted);

    // The child [0, 2) opens on its first primary with the parent's seed.
    let seed = parent.seed_for(0, 2).unwrap();
    let child = RangeLog::open(
        RangeLogOptions {
            segment_bytes: 1 << 30,
            replicated: true,
            leader_epoch: 1,
            seed: Some(seed),
            ..RangeLogOptions::new(c.path(), 0, 2)
        },
        tokio::sync::watch::channel(0).0,
    )
    .unwrap();
    assert_eq!(child.aborted_transactions(0, 0, 100).unwrap(), aborted);
    assert_eq!(append(&child, &mut make_batch(1, 1)).base_offset, 8);
    child.roll().unwrap();

    // Broker b followed the child from its first segment, fetching what
    // the history before it needs, and now leads the child's segment 1.
    let (addr, _store, task) = follower(c.path().to_path_buf()).await;
    snapshot_transfer::fetch(
        &Plaintext,
        &addr,
        SegmentKey { range: 7, seq: 0 },
        b.path(),
        &BTreeMap::from([(0, 8)]),
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    task.abort();
    sealed_copy(&child, 0, b.path());
    let led = new_primary_log(
        b.path(),
        1,
        BTreeMap::from([(0, vec![8, 0]), (1, vec![9, 0])]),
    );
    assert_eq!(led.aborted_transactions(0, 0, 100).unwrap(), aborted);
    assert_eq!(led.aborted_transactions(0, 8, 100).unwrap(), vec![]);
}

/// What a broker that healing dropped from a segment's replica set asks
/// each listed replica before deleting its own copy: a complete copy, or a
/// sealed segment of its own log at the segment's epoch, says yes; a short
/// copy, another cleaning pass, an active segment or a log of an older
/// epoch say no.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_says_whether_it_holds_a_complete_copy() {
    let (a, b, c) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let log = primary_log(a.path());
    for _ in 0..4 {
        log.append(0, &mut make_batch(2, 1), None).unwrap();
    }
    log.roll().unwrap();
    log.append(0, &mut make_batch(1, 1), None).unwrap();
    let seg0 = SegmentKey { range: 7, seq: 0 };
    let seg1 = SegmentKey { range: 7, seq: 1 };
    let dir = |path: &std::path::Path, leads: Option<Arc<RangeLog>>| FollowerDir {
        path: path.to_path_buf(),
        leads,
    };
    let size0 = log.sealed_size(0).unwrap();
    let holds = |key, pass, epoch, d: &FollowerDir| {
        service::holds_complete_copy(key, pass, epoch, size0, &ReplicaStore::default(), d)
    };
    // The primary's own log.
    let primary = dir(a.path(), Some(log.clone()));
    assert!(holds(seg0, 0, 0, &primary));
    assert!(!holds(seg1, 0, 0, &primary), "active");
    assert!(!holds(seg0, 0, 1, &primary), "a log of an older epoch");
    assert!(!holds(seg0, 1, 0, &primary), "another cleaning pass");
    // A complete sealed copy (read back from disk by a fresh store).
    sealed_copy(&log, 0, b.path());
    assert!(holds(seg0, 0, 0, &dir(b.path(), None)));
    assert!(
        !service::holds_complete_copy(
            seg0,
            0,
            0,
            size0 - 1,
            &ReplicaStore::default(),
            &dir(b.path(), None)
        ),
        "longer than the seal"
    );
    // A copy sealed but short of the seal (still repairing), and none.
    let frames = log.frames(0, 0, 1 << 20).unwrap().unwrap().bytes;
    let first = tessera_log::segment::read_frames(
        &std::fs::File::open(tessera_log::segment::log_path(a.path(), 0)).unwrap(),
        0,
        frames.len() as u64,
        1,
    )
    .unwrap();
    let store = ReplicaStore::default();
    let short = store.copy(seg0, c.path()).unwrap();
    short.lock().append(0, &first).unwrap();
    assert!(matches!(
        short.lock().seal(frames.len() as u64).unwrap(),
        tessera_replication::SealAction::Repair { .. }
    ));
    let short_dir = dir(c.path(), None);
    assert!(!service::holds_complete_copy(
        seg0, 0, 0, size0, &store, &short_dir
    ));
    assert!(!holds(seg1, 0, 0, &short_dir), "no copy at all");
    // Asked over the replication stream.
    let (addr, _store, task) = follower(b.path().to_path_buf()).await;
    let ask = |segment| Message::ReadCopyState {
        segment,
        pass: 0,
        epoch: 0,
        size: size0,
    };
    for (segment, expected) in [(seg0, true), (seg1, false)] {
        match service::call(&Plaintext, &addr, &ask(segment), Duration::from_secs(5))
            .await
            .unwrap()
        {
            Message::CopyState { complete, .. } => assert_eq!(complete, expected),
            other => panic!("expected a copy state, got {other:?}"),
        }
    }
    task.abort();
}

/// Brokers by id: 2 and 3 at the given addresses.
struct PeerMap(BTreeMap<i32, String>);
impl PeerAddresses for PeerMap {
    fn address_of(&self, broker: i32) -> Option<String> {
        self.0.get(&broker).cloned()
    }
    fn connector(&self) -> Arc<dyn tessera_replication::auth::Connector> {
        Arc::new(Plaintext)
    }
}

/// An address nothing listens on.
async fn dead_address() -> String {
    let dead = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = dead.local_addr().unwrap().to_string();
    drop(dead);
    addr
}

async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    for _ in 0..200 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_is_in_sync_once_it_answered_even_on_an_idle_range() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let log = primary_log(a.path());
    let (addr, _store, task) = follower(b.path().to_path_buf()).await;
    let peers = PeerMap(BTreeMap::from([(2, addr), (3, dead_address().await)]));
    let r = Replication::start(
        log.clone(),
        7,
        1,
        FollowerSet::new(vec![2, 3], 0),
        Arc::new(peers),
        1,
        Duration::from_secs(30),
    );
    // Nothing was ever appended: broker 2 answers the probe, broker 3
    // never answers and is not in sync, whatever the lag allows.
    eventually("broker 2 in sync", || r.in_sync() == vec![1, 2]).await;
    assert_eq!(r.in_sync(), vec![1, 2]);
    assert!(
        r.out_of_sync_for().is_empty(),
        "not out of sync for longer than the lag yet"
    );
    r.stop();
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_insync_replicas_is_part_of_the_commit_quorum() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let log = primary_log(a.path());
    let (addr, _store, task) = follower(b.path().to_path_buf()).await;
    let peers: Arc<dyn PeerAddresses> = Arc::new(PeerMap(BTreeMap::from([
        (2, addr),
        (3, dead_address().await),
    ])));
    // RF=3 with min.insync.replicas=3: the primary and broker 2 are a
    // majority, not enough.
    let r = Replication::start(
        log.clone(),
        7,
        1,
        FollowerSet::new(vec![2, 3], 0),
        peers.clone(),
        3,
        Duration::from_secs(30),
    );
    assert_eq!(r.commit_quorum(), 3);
    let mut batch = make_batch(3, 1000);
    let end = log.append(0, &mut batch, None).unwrap().end_position;
    eventually("broker 2 in sync", || r.in_sync().len() == 2).await;
    let waited = tokio::time::timeout(Duration::from_millis(500), log.wait_durable(end)).await;
    assert!(
        waited.is_err(),
        "committed on 2 of 3 copies with min.insync.replicas=3"
    );
    assert_eq!(log.offsets(0).unwrap().high_watermark, 0);
    // Lowered to 2 (a dynamic topic config): the two copies commit it.
    r.set_min_insync(2);
    tokio::time::timeout(Duration::from_secs(10), log.wait_durable(end))
        .await
        .expect("committed with min.insync.replicas=2")
        .unwrap();
    r.stop();
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_all_waits_end_with_not_enough_replicas_once_the_followers_are_out_of_sync() {
    let a = tempfile::tempdir().unwrap();
    let log = primary_log(a.path());
    let peers: Arc<dyn PeerAddresses> = Arc::new(PeerMap(BTreeMap::from([
        (2, dead_address().await),
        (3, dead_address().await),
    ])));
    let r = Replication::start(
        log.clone(),
        7,
        1,
        FollowerSet::new(vec![2, 3], 0),
        peers,
        2,
        Duration::from_millis(300),
    );
    let mut batch = make_batch(1, 1000);
    let end = log.append(0, &mut batch, None).unwrap().end_position;
    // Kafka's NOT_ENOUGH_REPLICAS_AFTER_APPEND, not a wait until the
    // request times out.
    let waited = tokio::time::timeout(Duration::from_secs(20), log.wait_durable(end))
        .await
        .expect("the wait ends");
    assert!(
        matches!(
            waited,
            Err(tessera_log::LogError::NotEnoughReplicasAfterAppend)
        ),
        "{waited:?}"
    );
    assert_eq!(r.out_of_sync_for().len(), 2);
    r.stop();
}

/// A broker that is primary of `log`, whose image records segment 0
/// `sealed` or not.
struct PrimaryDir {
    dir: PathBuf,
    log: Arc<RangeLog>,
    sealed: bool,
    /// The leader epoch the image records per segment number.
    epochs: BTreeMap<u32, i32>,
}
impl Directory for PrimaryDir {
    fn follower_dir(&self, _: SegmentKey, _: i32, _: i32) -> Result<PathBuf, Refusal> {
        Ok(self.dir.clone())
    }
    fn range_dir(&self, _: SegmentKey) -> Option<PathBuf> {
        Some(self.dir.clone())
    }
    fn primary_log(&self, _: u64) -> Option<Arc<RangeLog>> {
        Some(self.log.clone())
    }
    fn copy_clean_pass(&self, _: SegmentKey) -> Option<u64> {
        Some(0)
    }
    fn segment_sealed(&self, key: SegmentKey) -> Option<bool> {
        (key.seq == 0).then_some(self.sealed)
    }
    fn segment_epoch(&self, key: SegmentKey) -> Option<i32> {
        self.epochs.get(&key.seq).copied()
    }
    fn is_registered_broker(&self, _: i32) -> bool {
        true
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_fence_of_a_recorded_segment_does_not_seal_the_next_one() {
    // A broker that held segment 0 (rolled) and now leads segment 1.
    let a = tempfile::tempdir().unwrap();
    let log = primary_log(a.path());
    let mut batch = make_batch(2, 1000);
    log.append(0, &mut batch, None).unwrap();
    log.roll().unwrap().expect("rolled");
    let store = ReplicaStore::default();
    let key = SegmentKey { range: 7, seq: 0 };
    let recorded = PrimaryDir {
        dir: a.path().to_path_buf(),
        log: log.clone(),
        sealed: true,
        epochs: BTreeMap::new(),
    };
    match service::fence(key, 0, &store, &recorded) {
        Message::Fenced { end, .. } => assert!(end > 0),
        other => panic!("{other:?}"),
    }
    assert!(
        !log.is_sealed(),
        "a stale fence of segment 0 sealed segment 1"
    );
    let mut batch = make_batch(1, 2000);
    log.append(0, &mut batch, None)
        .expect("segment 1 still takes appends");
    // Unrecorded, the roll is undone by the fence: the range goes on
    // from segment 0's seal elsewhere, so nothing may land after it.
    let unrecorded = PrimaryDir {
        sealed: false,
        ..recorded
    };
    service::fence(key, 0, &store, &unrecorded);
    assert!(log.is_sealed());
}

/// An unreplicated log (replication factor 1, never moved) acknowledges
/// past its own rolls before the metadata log records them. A move's fence
/// of the segment it rolled away from must not seal it there: what it
/// acknowledged in the next segment would be dropped (the range would go
/// on elsewhere from segment 0's end). The fence is refused, to be retried
/// once the roll is recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_never_drops_what_an_unreplicated_log_acknowledged_past_its_roll() {
    let a = tempfile::tempdir().unwrap();
    let log = RangeLog::open(
        RangeLogOptions {
            segment_bytes: 1 << 30,
            ..RangeLogOptions::new(a.path(), 0, 2)
        },
        tokio::sync::watch::channel(0).0,
    )
    .unwrap();
    let mut batch = make_batch(2, 1000);
    log.append(0, &mut batch, None).unwrap();
    log.roll().unwrap().expect("rolled");
    let mut batch = make_batch(1, 2000);
    let end = log.append(0, &mut batch, None).unwrap().end_position;
    log.wait_durable(end).await.expect("acknowledged");
    let store = ReplicaStore::default();
    let unrecorded = PrimaryDir {
        dir: a.path().to_path_buf(),
        log: log.clone(),
        sealed: false,
        epochs: BTreeMap::new(),
    };
    match service::fence(SegmentKey { range: 7, seq: 0 }, 0, &store, &unrecorded) {
        Message::Refused { retry: true, .. } => {}
        other => panic!("{other:?}"),
    }
    assert!(
        !log.is_sealed(),
        "the acknowledged record after the roll stays"
    );
    let mut batch = make_batch(1, 3000);
    log.append(0, &mut batch, None)
        .expect("the log still takes appends");
}

/// A zombie primary: its log (epoch 0) rolled to segment 1 on its own
/// while a failover sealed segment 0 elsewhere and opened segment 1 at
/// epoch 1 on another broker, with this broker among the followers. A
/// fence of that segment 1 must not seal the zombie's log nor report the
/// zombie's bytes as this broker's copy of it (a seal at the largest end
/// would take them into the range's history); a fence of an epoch the
/// image has moved past changes nothing either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_of_another_epoch_neither_seals_nor_reports_the_zombies_own_segment() {
    let a = tempfile::tempdir().unwrap();
    let log = primary_log(a.path());
    let mut batch = make_batch(2, 1000);
    log.append(0, &mut batch, None).unwrap();
    log.roll().unwrap().expect("rolled");
    let mut batch = make_batch(3, 1000);
    log.append(0, &mut batch, None).unwrap();
    let store = ReplicaStore::default();
    let zombie = PrimaryDir {
        dir: a.path().to_path_buf(),
        log: log.clone(),
        sealed: false,
        epochs: BTreeMap::from([(0, 0)]),
    };
    let next = SegmentKey { range: 7, seq: 1 };
    match service::fence(next, 1, &store, &zombie) {
        Message::Refused { retry: true, .. } => {}
        other => panic!("the zombie's own segment 1 answered as the fenced one: {other:?}"),
    }
    assert!(!log.is_sealed(), "a fence of another epoch sealed the log");
    assert!(
        store.get(next).is_none(),
        "the zombie's file opened as a copy"
    );
    // Once the image knows segment 1 at epoch 1, a fence of it at epoch 0
    // (a fencer that was behind) is stale.
    let caught_up = PrimaryDir {
        epochs: BTreeMap::from([(0, 0), (1, 1)]),
        ..zombie
    };
    match service::fence(next, 0, &store, &caught_up) {
        Message::Refused { retry: false, .. } => {}
        other => panic!("a stale fence was taken: {other:?}"),
    }
    assert!(!log.is_sealed());
    log.append(0, &mut make_batch(1, 3000), None)
        .expect("nothing was fenced");
}

/// A zombie primary (its log at epoch 2) rolled to segment 1 unrecorded
/// while a failover opened segment 1 at epoch 3 elsewhere: a repair read
/// of segment 1 at epoch 3 must not be served its own segment 1, whose
/// bytes are other records under the same number. Segment 0, written at
/// an older epoch than the log's, is still served, and so is segment 1 to
/// a reader of the log's own epoch.
#[tokio::test]
async fn a_zombie_primarys_unrecorded_roll_is_not_served_as_the_images_segment() {
    let a = tempfile::tempdir().unwrap();
    let log = RangeLog::open(
        RangeLogOptions {
            segment_bytes: 1 << 30,
            replicated: false,
            leader_epoch: 2,
            ..RangeLogOptions::new(a.path(), 0, 2)
        },
        tokio::sync::watch::channel(0).0,
    )
    .unwrap();
    log.append(0, &mut make_batch(2, 100), None).unwrap();
    log.roll().unwrap();
    log.append(0, &mut make_batch(2, 200), None).unwrap();
    let store = ReplicaStore::default();
    let dir = FollowerDir {
        path: a.path().to_path_buf(),
        leads: Some(log.clone()),
    };
    let read = |seq, epoch| {
        service::read(
            SegmentKey { range: 0, seq },
            0,
            1 << 20,
            0,
            epoch,
            &store,
            &dir,
        )
    };
    match read(1, 3) {
        Message::Refused { retry: true, .. } => {}
        other => panic!("served another epoch's segment: {other:?}"),
    }
    for (seq, epoch) in [(0, 1), (1, 2)] {
        match read(seq, epoch) {
            Message::Data { frames, .. } => assert!(!frames.is_empty()),
            other => panic!("segment {seq} at epoch {epoch}: {other:?}"),
        }
    }
}

/// A roll that changes the replica set (placement at a primary's own
/// roll): segment 1 is recorded on a new follower while the primary has
/// rolled on to segment 2 already. Shipping to the new set starts at
/// segment 1: nothing in it commits until the new follower holds it, and
/// the follower gets both segments. Before, shipping started at the log's
/// active segment, and the commit of segment 2's start committed all of
/// segment 1 on the primary's copy alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_replica_set_commits_every_segment_from_where_it_starts() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let log = primary_log(a.path());
    let (addr, _store, task) = follower(b.path().to_path_buf()).await;
    let old = Replication::start(
        log.clone(),
        7,
        1,
        FollowerSet::new(vec![3], 0),
        Arc::new(PeerMap(BTreeMap::from([(3, addr.clone())]))),
        1,
        Duration::from_secs(30),
    );
    let mut batch = make_batch(2, 1000);
    let end0 = log.append(0, &mut batch, None).unwrap().end_position;
    tokio::time::timeout(Duration::from_secs(10), log.wait_durable(end0))
        .await
        .expect("segment 0 committed by the old set")
        .unwrap();
    old.stop();
    log.roll().unwrap().expect("segment 0 rolled");
    let mut batch = make_batch(2, 2000);
    let end1 = log.append(0, &mut batch, None).unwrap().end_position;
    log.roll()
        .unwrap()
        .expect("segment 1 rolled ahead of its record");
    let mut batch = make_batch(2, 3000);
    let end2 = log.append(1, &mut batch, None).unwrap().end_position;
    log.wait_local_durable(end2).await.unwrap();
    assert_eq!(log.local_durable_end().0, 2);

    // Segment 1's set is [1, 2]; broker 2 does not answer yet.
    let silent: Arc<dyn PeerAddresses> =
        Arc::new(PeerMap(BTreeMap::from([(2, dead_address().await)])));
    let r = Replication::start(
        log.clone(),
        7,
        1,
        FollowerSet::new(vec![2], 1),
        silent,
        1,
        Duration::from_secs(30),
    );
    let waited = tokio::time::timeout(Duration::from_millis(800), log.wait_durable(end1)).await;
    assert!(
        waited.is_err(),
        "segment 1 committed without its new follower"
    );
    r.stop();

    // Broker 2 answers: both segments are shipped to it and commit.
    let r = Replication::start(
        log.clone(),
        7,
        1,
        FollowerSet::new(vec![2], 1),
        Arc::new(PeerMap(BTreeMap::from([(2, addr)]))),
        1,
        Duration::from_secs(30),
    );
    tokio::time::timeout(Duration::from_secs(10), log.wait_durable(end2))
        .await
        .expect("segments 1 and 2 committed by the new set")
        .unwrap();
    for seq in [1, 2] {
        let primary = std::fs::read(tessera_log::segment::log_path(a.path(), seq)).unwrap();
        let follower = std::fs::read(tessera_log::segment::log_path(b.path(), seq)).unwrap();
        assert_eq!(primary, follower, "segment {seq}");
    }
    r.stop();
    task.abort();
}

/// A follower swap at a roll costs the follower that stays nothing: the
/// shipping continued on the new set still counts it in sync at once (no
/// NOT_ENOUGH_REPLICAS gap for acks=all), and commits with it and the
/// primary while the joining follower never answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_kept_across_a_set_change_stays_in_sync() {
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let log = primary_log(dirs[0].path());
    let (addr2, _s2, t2) = follower(dirs[1].path().to_path_buf()).await;
    let (addr3, _s3, t3) = follower(dirs[2].path().to_path_buf()).await;
    let peers: Arc<dyn PeerAddresses> = Arc::new(PeerMap(BTreeMap::from([
        (2, addr2),
        (3, addr3),
        (4, dead_address().await),
    ])));
    let r = Replication::start(
        log.clone(),
        7,
        1,
        FollowerSet::new(vec![2, 3], 0),
        peers.clone(),
        2,
        Duration::from_secs(30),
    );
    let mut batch = make_batch(2, 1000);
    let end0 = log.append(0, &mut batch, None).unwrap().end_position;
    tokio::time::timeout(Duration::from_secs(10), log.wait_durable(end0))
        .await
        .expect("committed by the first set")
        .unwrap();
    eventually("both followers in sync", || r.in_sync() == vec![1, 2, 3]).await;
    log.roll().unwrap().expect("rolled");
    // Segment 1 is recorded on [1, 2, 4]: broker 3 leaves, 4 joins (and
    // never answers).
    let next = r.continue_on(FollowerSet::new(vec![2, 4], 1), peers);
    assert_eq!(next.in_sync(), vec![1, 2], "broker 2 is still in sync");
    let mut batch = make_batch(2, 2000);
    let end1 = log.append(0, &mut batch, None).unwrap().end_position;
    tokio::time::timeout(Duration::from_secs(10), log.wait_durable(end1))
        .await
        .expect("committed by the primary and broker 2")
        .unwrap();
    let follower = std::fs::read(tessera_log::segment::log_path(dirs[1].path(), 1)).unwrap();
    let primary = std::fs::read(tessera_log::segment::log_path(dirs[0].path(), 1)).unwrap();
    assert_eq!(follower, primary);
    next.stop();
    t2.abort();
    t3.abort();
}

/// A deleted topic's follower copies are closed with it: a copy left open
/// was, while range ids could be reused, the copy a new range of the same
/// id was given (a different directory, a different history).
#[tokio::test]
async fn copies_of_ranges_gone_from_the_image_are_closed() {
    let (old, new) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let store = ReplicaStore::default();
    let gone = store
        .copy(SegmentKey { range: 4, seq: 0 }, old.path())
        .unwrap();
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let log = primary_log(a.path());
    let mut batch = make_batch(2, 100);
    log.append(0, &mut batch, None).unwrap();
    let frames = log.frames(0, 0, 1 << 20).unwrap().unwrap().bytes;
    gone.lock().append(0, &frames).unwrap();
    store
        .copy(SegmentKey { range: 5, seq: 0 }, b.path())
        .unwrap();
    assert_eq!(store.open_copies(), 2);
    store.close_ranges_except(|range| range == 5);
    assert_eq!(store.open_copies(), 1);
    // Range 4 asked for again (under another directory) starts empty.
    let fresh = store
        .copy(SegmentKey { range: 4, seq: 0 }, new.path())
        .unwrap();
    assert_eq!(
        fresh.lock().append(0, &frames).unwrap(),
        tessera_replication::Offer::Accept
    );
}
