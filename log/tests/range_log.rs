use std::io::Write;

use tessera_log::batch::{self, testing::make_batch};
use tessera_log::{LogError, RangeLog, RangeLogOptions};

fn options(dir: &std::path::Path, segment_bytes: u64) -> RangeLogOptions {
    RangeLogOptions {
        segment_bytes,
        ..RangeLogOptions::new(dir, 0, 4)
    }
}

fn hw() -> tokio::sync::watch::Sender<u64> {
    tokio::sync::watch::channel(0).0
}

async fn append(log: &RangeLog, p: u32, count: i32) -> (i64, i64) {
    let mut b = make_batch(count, 1000 + count as i64);
    let out = log.append(p, &mut b, None).unwrap();
    log.wait_durable(out.end_position).await.unwrap();
    (out.base_offset, out.last_offset)
}

fn batches(bytes: &[u8]) -> Vec<batch::BatchHeader> {
    batch::split_batches(bytes)
        .unwrap()
        .into_iter()
        .map(|r| batch::validate(&bytes[r]).unwrap())
        .collect()
}

#[tokio::test]
async fn partitions_keep_dense_offsets_in_a_shared_log() {
    let dir = tempfile::tempdir().unwrap();
    let log = RangeLog::open(options(dir.path(), 1 << 20), hw()).unwrap();
    assert_eq!(append(&log, 0, 3).await, (0, 2));
    assert_eq!(append(&log, 1, 2).await, (0, 1));
    assert_eq!(append(&log, 0, 1).await, (3, 3));
    let read = log.read(0, 0, 1 << 20).unwrap();
    let hs = batches(&read.records);
    assert_eq!(
        hs.iter().map(|h| h.base_offset).collect::<Vec<_>>(),
        vec![0, 3]
    );
    assert_eq!(read.offsets.high_watermark, 4);
    // A read in the middle of a batch returns that batch.
    assert_eq!(
        batches(&log.read(0, 1, 1 << 20).unwrap().records)[0].base_offset,
        0
    );
    // At the end: empty; past the end: out of range.
    assert!(log.read(0, 4, 1 << 20).unwrap().records.is_empty());
    assert!(matches!(
        log.read(0, 5, 100),
        Err(LogError::OffsetOutOfRange { .. })
    ));
    assert!(matches!(
        log.read(7, 0, 100),
        Err(LogError::PartitionNotInRange(7))
    ));
}

#[tokio::test]
async fn first_batch_is_returned_even_when_larger_than_max_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let log = RangeLog::open(options(dir.path(), 1 << 20), hw()).unwrap();
    append(&log, 2, 5).await;
    append(&log, 2, 5).await;
    let read = log.read(2, 0, 1).unwrap();
    assert_eq!(batches(&read.records).len(), 1);
}

#[tokio::test]
async fn rolls_segments_and_reads_across_them_after_restart() {
    let dir = tempfile::tempdir().unwrap();
    {
        let log = RangeLog::open(options(dir.path(), 200), hw()).unwrap();
        let mut rolls = 0;
        for _ in 0..10 {
            let mut b = make_batch(2, 1);
            let out = log.append(1, &mut b, None).unwrap();
            rolls += out.rolled.is_some() as usize;
            log.wait_durable(out.end_position).await.unwrap();
        }
        assert!(rolls >= 3, "expected several rolls, got {rolls}");
        assert_eq!(log.segment_count(), rolls + 1);
        log.close();
    }
    let log = RangeLog::open(options(dir.path(), 200), hw()).unwrap();
    let offs = log.offsets(1).unwrap();
    assert_eq!(offs.log_end, 20);
    let all = batches(&log.read(1, 0, 1 << 20).unwrap().records);
    assert_eq!(
        all.iter().map(|h| h.base_offset).collect::<Vec<_>>(),
        (0..10).map(|i| i * 2).collect::<Vec<_>>()
    );
    assert_eq!(append(&log, 1, 1).await.0, 20);
}

#[tokio::test]
async fn torn_tail_is_cut_on_recovery() {
    let dir = tempfile::tempdir().unwrap();
    {
        let log = RangeLog::open(options(dir.path(), 1 << 20), hw()).unwrap();
        append(&log, 0, 2).await;
        append(&log, 0, 2).await;
        log.close();
    }
    // Simulate a crash mid-write: half a frame at the end of the active segment.
    let path = dir.path().join(format!("{:010}.log", 0));
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    f.write_all(&[0, 0, 0, 80, 0, 0, 0, 0, 1, 2, 3]).unwrap();
    drop(f);
    let log = RangeLog::open(options(dir.path(), 1 << 20), hw()).unwrap();
    assert_eq!(log.offsets(0).unwrap().log_end, 4);
    assert_eq!(append(&log, 0, 1).await.0, 4);
    assert_eq!(batches(&log.read(0, 0, 1 << 20).unwrap().records).len(), 3);
}

#[tokio::test]
async fn corrupt_frame_in_the_middle_cuts_everything_after_it() {
    let dir = tempfile::tempdir().unwrap();
    {
        let log = RangeLog::open(options(dir.path(), 1 << 20), hw()).unwrap();
        for _ in 0..3 {
            append(&log, 3, 1).await;
        }
        log.close();
    }
    let path = dir.path().join(format!("{:010}.log", 0));
    let mut bytes = std::fs::read(&path).unwrap();
    let frame = bytes.len() / 3;
    bytes[frame + 40] ^= 0xff; // inside the second frame
    std::fs::write(&path, bytes).unwrap();
    let log = RangeLog::open(options(dir.path(), 1 << 20), hw()).unwrap();
    assert_eq!(log.offsets(3).unwrap().log_end, 1);
}

#[tokio::test]
async fn missing_sealed_index_is_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    {
        let log = RangeLog::open(options(dir.path(), 100), hw()).unwrap();
        for _ in 0..4 {
            append(&log, 0, 1).await;
        }
        log.close();
    }
    std::fs::remove_file(dir.path().join(format!("{:010}.idx", 0))).unwrap();
    let log = RangeLog::open(options(dir.path(), 100), hw()).unwrap();
    assert_eq!(batches(&log.read(0, 0, 1 << 20).unwrap().records).len(), 4);
    assert!(dir.path().join(format!("{:010}.idx", 0)).exists());
}

#[tokio::test]
async fn log_append_time_and_timestamp_lookup() {
    let dir = tempfile::tempdir().unwrap();
    let log = RangeLog::open(options(dir.path(), 1 << 20), hw()).unwrap();
    for ts in [10, 20, 30] {
        let mut b = make_batch(1, ts);
        let out = log.append(0, &mut b, None).unwrap();
        log.wait_durable(out.end_position).await.unwrap();
    }
    let found = log.batch_at_timestamp(0, 15, 0).unwrap().unwrap();
    assert_eq!(batch::parse_header(&found).unwrap().base_offset, 1);
    assert!(log.batch_at_timestamp(0, 31, 0).unwrap().is_none());
    // Batches below the log start offset do not count.
    let found = log.batch_at_timestamp(0, 5, 2).unwrap().unwrap();
    assert_eq!(batch::parse_header(&found).unwrap().base_offset, 2);
    let max = log.batch_with_max_timestamp(0).unwrap().unwrap();
    assert_eq!(batch::parse_header(&max).unwrap().base_offset, 2);
    let mut b = make_batch(1, 5);
    let out = log.append(1, &mut b, Some(12345)).unwrap();
    log.wait_durable(out.end_position).await.unwrap();
    let h = batches(&log.read(1, 0, 1 << 20).unwrap().records)[0];
    assert!(h.is_log_append_time());
    assert_eq!(h.max_timestamp, 12345);
}

#[tokio::test]
async fn idempotent_retries_are_deduplicated_across_restart() {
    use tessera_log::batch::testing::make_idempotent_batch;
    let dir = tempfile::tempdir().unwrap();
    {
        let log = RangeLog::open(options(dir.path(), 1 << 20), hw()).unwrap();
        let mut b = make_idempotent_batch(3, 1, 42, 0, 0);
        let first = log.append(0, &mut b, None).unwrap();
        log.wait_durable(first.end_position).await.unwrap();
        let mut retry = make_idempotent_batch(3, 1, 42, 0, 0);
        let again = log.append(0, &mut retry, None).unwrap();
        assert!(again.duplicate);
        assert_eq!(again.base_offset, first.base_offset);
        let mut gap = make_idempotent_batch(1, 1, 42, 0, 7);
        assert!(matches!(
            log.append(0, &mut gap, None),
            Err(LogError::Sequence(_))
        ));
        log.close();
    }
    let log = RangeLog::open(options(dir.path(), 1 << 20), hw()).unwrap();
    let mut retry = make_idempotent_batch(3, 1, 42, 0, 0);
    let again = log.append(0, &mut retry, None).unwrap();
    assert!(again.duplicate, "producer state is rebuilt on restart");
    let mut next = make_idempotent_batch(2, 1, 42, 0, 3);
    let out = log.append(0, &mut next, None).unwrap();
    assert_eq!((out.base_offset, out.duplicate), (3, false));
    let mut stale = make_idempotent_batch(1, 1, 42, -1, 5);
    assert!(matches!(
        log.append(0, &mut stale, None),
        Err(LogError::Sequence(_))
    ));
}

#[tokio::test]
async fn a_child_range_continues_offsets_and_producer_state_after_a_seal() {
    use tessera_log::batch::testing::make_idempotent_batch;
    let parent_dir = tempfile::tempdir().unwrap();
    let parent = RangeLog::open(options(parent_dir.path(), 1 << 20), hw()).unwrap();
    append(&parent, 1, 3).await;
    append(&parent, 2, 2).await;
    let mut b = make_idempotent_batch(2, 1, 7, 0, 0);
    let out = parent.append(2, &mut b, None).unwrap();
    parent.wait_durable(out.end_position).await.unwrap();
    let sealed = parent.seal().unwrap();
    assert_eq!(sealed.spans, vec![(1, 0, 3), (2, 0, 4)]);
    let mut late = make_batch(1, 1);
    assert!(matches!(
        parent.append(1, &mut late, None),
        Err(LogError::Closed)
    ));

    // Child [2, 4) takes over partitions 2 and 3.
    let seed = parent.seed_for(2, 4).unwrap();
    assert_eq!(seed.next_offsets, vec![4, 0]);
    let child_dir = tempfile::tempdir().unwrap();
    let child_options = RangeLogOptions {
        lo: 2,
        hi: 4,
        seed: Some(seed.clone()),
        ..options(child_dir.path(), 1 << 20)
    };
    let child = RangeLog::open(child_options.clone(), hw()).unwrap();
    assert_eq!(child.base_offset(2).unwrap(), 4);
    assert_eq!(append(&child, 2, 1).await.0, 4);
    // A retry of the batch stored in the parent is still a duplicate.
    let mut retry = make_idempotent_batch(2, 1, 7, 0, 0);
    let again = child.append(2, &mut retry, None).unwrap();
    assert!(again.duplicate);
    assert_eq!(again.base_offset, 2);
    // Reads below the child's base belong to the parent.
    assert!(matches!(
        child.read(2, 3, 100),
        Err(LogError::OffsetOutOfRange { .. })
    ));
    assert_eq!(
        batches(&parent.read(2, 0, 1 << 20).unwrap().records).len(),
        2
    );
    child.close();

    // Reopened (a restart) with the same seed: same state.
    let child = RangeLog::open(child_options, hw()).unwrap();
    assert_eq!(child.offsets(2).unwrap().log_end, 5);
    // The parent reopens read-only.
    let parent = RangeLog::open(
        RangeLogOptions {
            sealed: true,
            ..options(parent_dir.path(), 1 << 20)
        },
        hw(),
    )
    .unwrap();
    assert_eq!(parent.offsets(2).unwrap().log_end, 4);
    assert!(parent.is_sealed());
}

#[tokio::test]
async fn transactions_hold_the_lso_and_aborts_are_indexed_across_restart() {
    use tessera_log::batch::testing::{make_control_batch, make_transactional_batch};
    let dir = tempfile::tempdir().unwrap();
    let durable = |log: &RangeLog, mut b: Vec<u8>, p: u32| {
        let out = log.append(p, &mut b, None).unwrap();
        (out.base_offset, out.end_position)
    };
    {
        let log = RangeLog::open(options(dir.path(), 1 << 20), hw()).unwrap();
        append(&log, 0, 2).await; // offsets 0-1, plain
        let (first, _) = durable(&log, make_transactional_batch(3, 1, 9, 0, 0), 0); // 2-4, txn of producer 9
        append(&log, 0, 1).await; // 5, plain
        let (_, end) = durable(&log, make_transactional_batch(1, 1, 8, 0, 0), 0); // 6, txn of producer 8
        log.wait_durable(end).await.unwrap();
        let o = log.offsets(0).unwrap();
        assert_eq!((first, o.high_watermark, o.last_stable), (2, 7, 2));
        // read_committed stops at the LSO.
        let below = log.read_below(0, 0, 1 << 20, o.last_stable).unwrap();
        assert_eq!(batches(&below.records).len(), 1);
        let (_, end) = durable(&log, make_control_batch(9, 0, false), 0); // ABORT at 7
        log.wait_durable(end).await.unwrap();
        assert_eq!(log.offsets(0).unwrap().last_stable, 6);
        let (_, end) = durable(&log, make_control_batch(8, 0, true), 0); // COMMIT at 8
        log.wait_durable(end).await.unwrap();
        assert_eq!(log.offsets(0).unwrap().last_stable, 9);
        log.close();
    }
    let log = RangeLog::open(options(dir.path(), 1 << 20), hw()).unwrap();
    assert_eq!(log.offsets(0).unwrap().last_stable, 9);
    let aborted = log.aborted_transactions(0, 0, 9).unwrap();
    assert_eq!(aborted.len(), 1);
    assert_eq!(
        (
            aborted[0].producer_id,
            aborted[0].first_offset,
            aborted[0].last_offset
        ),
        (9, 2, 7)
    );
    assert!(log.ongoing_transactions(0).unwrap().is_empty());
}

fn snapshot_files(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".snapshot"))
        .collect();
    names.sort();
    names
}

type States = Vec<(
    tessera_log::producer_state::ProducerStates,
    tessera_log::txn_state::TxnState,
)>;

fn states(log: &RangeLog) -> States {
    (0..4)
        .map(|p| (log.producer_states(p).unwrap(), log.txn_state(p).unwrap()))
        .collect()
}

/// Idempotent and transactional traffic over four partitions with rolls:
/// producers 1..=3 idempotent, 9 transactional (aborted, committed, then
/// left open on partition 3).
async fn producer_traffic(log: &RangeLog) {
    use tessera_log::batch::testing::{
        make_control_batch, make_idempotent_batch, make_transactional_batch,
    };
    let mut seqs = [[0i32; 4]; 4];
    let mut txn_seqs = [0i32; 4];
    for round in 0..12 {
        for p in 0..4u32 {
            let pid = 1 + (round + p as i32) % 3;
            let seq = &mut seqs[p as usize][pid as usize];
            let mut b = make_idempotent_batch(2, 1, pid as i64, 0, *seq);
            *seq += 2;
            let out = log.append(p, &mut b, None).unwrap();
            log.wait_durable(out.end_position).await.unwrap();
        }
        let p = (round % 4) as u32;
        let mut t = make_transactional_batch(1, 1, 9, 0, txn_seqs[p as usize]);
        txn_seqs[p as usize] += 1;
        log.append(p, &mut t, None).unwrap();
        if round != 11 {
            let mut m = make_control_batch(9, 0, round % 2 == 0);
            let out = log.append(p, &mut m, None).unwrap();
            log.wait_durable(out.end_position).await.unwrap();
        }
        append(log, 3 - p, 1).await;
    }
}

#[tokio::test]
async fn producer_snapshots_reload_to_the_state_of_a_full_replay() {
    let dir = tempfile::tempdir().unwrap();
    let before;
    {
        let log = RangeLog::open(options(dir.path(), 400), hw()).unwrap();
        producer_traffic(&log).await;
        assert!(log.segment_count() > 3);
        before = states(&log);
        log.close();
    }
    // One snapshot per roll, plus the clean shutdown one.
    let files = snapshot_files(dir.path());
    assert!(files.len() >= 3, "{files:?}");
    let reopened = RangeLog::open(options(dir.path(), 400), hw()).unwrap();
    assert_eq!(states(&reopened), before);
    assert_eq!(reopened.offsets(3).unwrap().last_stable, {
        let o = reopened.ongoing_transactions(3).unwrap();
        assert_eq!(o.len(), 1);
        o[0].1
    });
    // Aborts land on partitions 1 and 3 (odd rounds).
    assert_eq!(reopened.aborted_transactions(1, 0, 1000).unwrap().len(), 3);
    reopened.close();
    // Without any snapshot: a full replay, the same state.
    for f in snapshot_files(dir.path()) {
        std::fs::remove_file(dir.path().join(f)).unwrap();
    }
    let replayed = RangeLog::open(options(dir.path(), 400), hw()).unwrap();
    assert_eq!(states(&replayed), before);
}

#[tokio::test]
async fn corrupt_and_stray_snapshots_are_skipped_and_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let before;
    {
        let log = RangeLog::open(options(dir.path(), 400), hw()).unwrap();
        producer_traffic(&log).await;
        before = states(&log);
        log.close();
    }
    let files = snapshot_files(dir.path());
    // Corrupt the newest (the clean shutdown one) and tear the one before.
    let newest = dir.path().join(&files[files.len() - 1]);
    let mut bytes = std::fs::read(&newest).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&newest, bytes).unwrap();
    let torn = dir.path().join(&files[files.len() - 2]);
    let bytes = std::fs::read(&torn).unwrap();
    std::fs::write(&torn, &bytes[..bytes.len() / 2]).unwrap();
    // A stray: partition 0 at offset 1, no segment's base and not the newest.
    tessera_log::producer_snapshot_file::write_snapshot(
        dir.path(),
        999,
        &[tessera_log::producer_snapshot_file::SnapshotSection {
            partition: 0,
            offset: 1,
            rows: vec![],
        }],
    )
    .unwrap();
    let log = RangeLog::open(options(dir.path(), 400), hw()).unwrap();
    assert_eq!(states(&log), before);
    let left = snapshot_files(dir.path());
    assert!(
        !left.contains(&files[files.len() - 1]),
        "corrupt snapshot deleted"
    );
    assert!(
        !left.contains(&files[files.len() - 2]),
        "torn snapshot deleted"
    );
    assert!(
        !left.contains(&"0000000999.snapshot".to_string()),
        "stray deleted"
    );
    assert_eq!(left.len(), files.len() - 2);
}

#[tokio::test]
async fn after_a_crash_roll_snapshots_and_the_tail_rebuild_the_state() {
    let dir = tempfile::tempdir().unwrap();
    let before;
    {
        let log = RangeLog::open(options(dir.path(), 400), hw()).unwrap();
        producer_traffic(&log).await;
        before = states(&log);
        // No close: the flusher's reference keeps it alive, as after a crash.
    }
    let log = RangeLog::open(options(dir.path(), 400), hw()).unwrap();
    assert_eq!(states(&log), before);
    // Idempotence still holds after the reload.
    use tessera_log::batch::testing::make_idempotent_batch;
    // Producer 3's last batch on partition 0 (rounds 2, 5, 8, 11): sequence 6.
    let mut retry = make_idempotent_batch(2, 1, 3, 0, 6);
    assert!(log.append(0, &mut retry, None).unwrap().duplicate);
}

#[tokio::test]
async fn a_child_reloads_its_seed_and_own_snapshots() {
    let parent_dir = tempfile::tempdir().unwrap();
    let parent = RangeLog::open(options(parent_dir.path(), 400), hw()).unwrap();
    producer_traffic(&parent).await;
    parent.seal().unwrap();
    assert!(!snapshot_files(parent_dir.path()).is_empty());
    let seed = parent.seed_for(0, 4).unwrap();
    let child_dir = tempfile::tempdir().unwrap();
    let child_options = RangeLogOptions {
        seed: Some(seed),
        ..options(child_dir.path(), 300)
    };
    let before;
    {
        let child = RangeLog::open(child_options.clone(), hw()).unwrap();
        producer_traffic(&child).await;
        before = states(&child);
        child.close();
    }
    let child = RangeLog::open(child_options.clone(), hw()).unwrap();
    assert_eq!(states(&child), before);
    child.close();
    for f in snapshot_files(child_dir.path()) {
        std::fs::remove_file(child_dir.path().join(f)).unwrap();
    }
    let child = RangeLog::open(child_options, hw()).unwrap();
    assert_eq!(states(&child), before);
}

#[tokio::test]
async fn the_log_start_offset_moves_forward_only_and_hides_what_is_below() {
    let dir = tempfile::tempdir().unwrap();
    let log = RangeLog::open(options(dir.path(), 1 << 20), hw()).unwrap();
    append(&log, 0, 3).await;
    append(&log, 0, 2).await;
    append(&log, 1, 1).await;
    let size_before = log.partition_size(0).unwrap();
    assert!(size_before > 0);
    log.advance_log_start(0, 3).unwrap();
    assert_eq!(log.offsets(0).unwrap().log_start, 3);
    assert_eq!(log.offsets(1).unwrap().log_start, 0);
    assert!(matches!(
        log.read(0, 2, 1 << 20),
        Err(LogError::OffsetOutOfRange { log_start: 3, .. })
    ));
    assert_eq!(
        batches(&log.read(0, 3, 1 << 20).unwrap().records)[0].base_offset,
        3
    );
    // Never back.
    log.advance_log_start(0, 1).unwrap();
    assert_eq!(log.offsets(0).unwrap().log_start, 3);
    // Nothing is deleted physically yet.
    assert_eq!(log.partition_size(0).unwrap(), size_before);
    assert!(log.partition_size(1).unwrap() > 0);
    assert_eq!(log.partition_size(2).unwrap(), 0);
    assert!(matches!(
        log.advance_log_start(9, 1),
        Err(LogError::PartitionNotInRange(9))
    ));
    log.close();
    // After a restart the start comes from the metadata (the options).
    let mut o = options(dir.path(), 1 << 20);
    o.log_start_offsets = vec![3, 0, 0, 0];
    let log = RangeLog::open(o, hw()).unwrap();
    let offsets = log.offsets(0).unwrap();
    assert_eq!((offsets.log_start, offsets.high_watermark), (3, 5));
    assert_eq!(append(&log, 0, 1).await, (5, 5));
}

/// Retention deletes the segments holding every batch of an idempotent
/// producer: its state stays in memory and across a clean reopen (the
/// shutdown snapshot). After a crash with only the snapshot at the log
/// start left (every sealed segment deleted, no roll since), the reload
/// drops that snapshot (Kafka's rule: only snapshots above the log start)
/// and the producer is forgotten, as Kafka forgets an expired producer.
#[tokio::test]
async fn producer_state_survives_retention_of_its_segments() {
    use tessera_log::batch::testing::make_idempotent_batch;
    let dir = tempfile::tempdir().unwrap();
    let log = RangeLog::open(options(dir.path(), 14), hw()).unwrap();
    let mut b = make_idempotent_batch(3, 1, 42, 0, 0);
    let out = log.append(0, &mut b, None).unwrap();
    log.wait_durable(out.end_position).await.unwrap();
    // Segment 0: producer 42 at 0..3; segment 1: offset 3; 2 active: 4.
    append(&log, 0, 1).await;
    append(&log, 0, 1).await;
    assert_eq!(log.delete_segments_below(2).unwrap(), [0, 1]);
    assert_eq!(log.offsets(0).unwrap().log_start, 4);
    let mut retry = make_idempotent_batch(3, 1, 42, 0, 0);
    assert!(log.append(0, &mut retry, None).unwrap().duplicate);
    log.close();
    for crash in [false, true] {
        if crash {
            // The shutdown snapshot (at the log end) is gone: only the one
            // where segment 2 starts is left.
            for e in std::fs::read_dir(dir.path()).unwrap().flatten() {
                let name = e.file_name().to_string_lossy().to_string();
                if name.ends_with(".snapshot") && !name.starts_with("0000000002") {
                    std::fs::remove_file(e.path()).unwrap();
                }
            }
        }
        let log = RangeLog::open(
            RangeLogOptions {
                log_start_offsets: vec![4, 0, 0, 0],
                ..options(dir.path(), 1 << 20)
            },
            hw(),
        )
        .unwrap();
        let mut retry = make_idempotent_batch(3, 1, 42, 0, 0);
        let again = log.append(0, &mut retry, None).unwrap();
        assert_eq!(
            again.duplicate, !crash,
            "producer 42 after reopen (crash: {crash})"
        );
        log.close();
    }
}
