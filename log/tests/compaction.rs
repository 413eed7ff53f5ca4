//! `RangeLog::clean`: a range's sealed segments compacted in place, offsets
//! kept, reads across the gaps, and every crash point of the swap.

use std::collections::BTreeMap;

use tessera_log::batch;
use tessera_log::cleaner::{self, testing::keyed_batch, CleanParams};
use tessera_log::{segment, RangeLog, RangeLogOptions};

fn options(dir: &std::path::Path) -> RangeLogOptions {
    RangeLogOptions {
        segment_bytes: 1 << 30,
        ..RangeLogOptions::new(dir, 0, 2)
    }
}

fn hw() -> tokio::sync::watch::Sender<u64> {
    tokio::sync::watch::channel(0).0
}

const PARAMS: CleanParams = CleanParams {
    now_ms: 1_000_000,
    delete_retention_ms: 1_000,
};

/// Writes `rounds` rounds of updates to keys k0..k9 in both partitions,
/// each round in its own sealed segment, then a tombstone for k0 in p0.
async fn fill(log: &RangeLog, rounds: usize) {
    for round in 0..rounds {
        for p in 0..2u32 {
            let values: Vec<(Vec<u8>, Vec<u8>)> = (0..10)
                .map(|k| {
                    (
                        format!("k{k}").into_bytes(),
                        format!("p{p}r{round}").into_bytes(),
                    )
                })
                .collect();
            let refs: Vec<(&[u8], Option<&[u8]>)> = values
                .iter()
                .map(|(k, v)| (k.as_slice(), Some(v.as_slice())))
                .collect();
            // Two batches a round, so whole batches go as well as records.
            for half in refs.chunks(5) {
                let mut b = keyed_batch(half, 1_000 + round as i64);
                let out = log.append(p, &mut b, None).unwrap();
                log.wait_durable(out.end_position).await.unwrap();
            }
        }
        log.roll().unwrap();
    }
    let mut b = keyed_batch(&[(b"k0", None)], 5_000);
    let out = log.append(0, &mut b, None).unwrap();
    log.wait_durable(out.end_position).await.unwrap();
    log.roll().unwrap();
}

/// Every record of `p` from `from` as (offset, key, value).
fn records(log: &RangeLog, p: u32, from: i64) -> Vec<(i64, String, Option<String>)> {
    let mut out = Vec::new();
    let mut offset = from;
    loop {
        let read = log.read(p, offset, 1 << 20).unwrap();
        if read.records.is_empty() {
            return out;
        }
        for r in batch::split_batches(&read.records).unwrap() {
            let bytes = &read.records[r];
            let h = batch::parse_header(bytes).unwrap();
            assert_eq!(batch::compute_crc(bytes), h.crc);
            for rec in cleaner::decode_records(bytes).unwrap() {
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

fn latest(rs: &[(i64, String, Option<String>)]) -> BTreeMap<String, (i64, Option<String>)> {
    rs.iter()
        .map(|(o, k, v)| (k.clone(), (*o, v.clone())))
        .collect()
}

#[tokio::test]
async fn cleaning_keeps_the_last_value_of_every_key_at_its_offset() {
    let dir = tempfile::tempdir().unwrap();
    let log = RangeLog::open(options(dir.path()), hw()).unwrap();
    fill(&log, 5).await;
    let before: Vec<_> = (0..2).map(|p| records(&log, p, 0)).collect();
    let offsets_before: Vec<_> = (0..2).map(|p| log.offsets(p).unwrap()).collect();
    let view = log.cleaning_view();
    assert_eq!(view.first_dirty_seq, 0);
    let last = view.segments.last().unwrap().seq;
    let stats = log.clean(last, PARAMS, &mut |_| {}).unwrap();
    assert!(stats.bytes_after < stats.bytes_before);
    assert_eq!(stats.keys, 20);
    assert_eq!(log.cleaning_view().first_dirty_seq, last + 1);
    for p in 0..2u32 {
        let after = records(&log, p, 0);
        assert_eq!(latest(&after), latest(&before[p as usize]), "partition {p}");
        // One record per key, strictly increasing offsets.
        assert_eq!(after.len(), 10);
        assert!(after.windows(2).all(|w| w[0].0 < w[1].0));
        assert_eq!(log.offsets(p).unwrap(), offsets_before[p as usize]);
    }
    // The tombstone stays (first pass stamps its horizon), at offset 50.
    assert_eq!(
        records(&log, 0, 0).last().unwrap(),
        &(50, "k0".into(), None)
    );
    // A fetch inside a removed stretch gets the next batch after it.
    assert_eq!(records(&log, 1, 3)[0].0, 40);
    // Past the horizon the tombstone goes; offsets do not move back.
    let later = CleanParams {
        now_ms: PARAMS.now_ms + PARAMS.delete_retention_ms,
        ..PARAMS
    };
    log.clean(last, later, &mut |_| {}).unwrap();
    let p0 = records(&log, 0, 0);
    assert_eq!(p0.len(), 9);
    assert!(p0.iter().all(|(_, k, _)| k != "k0"));
    assert_eq!(log.offsets(0).unwrap().log_end, 51);
    // The cleaned segments are what a reopen finds.
    let now: Vec<_> = (0..2).map(|p| records(&log, p, 0)).collect();
    log.close();
    drop(log);
    // The broker reopens with each partition's end as the metadata's
    // sealed spans record it: cleaning may remove a partition's last batch
    // (a tombstone past its horizon), never its end.
    let log = RangeLog::open(
        RangeLogOptions {
            min_next_offsets: vec![51, 50],
            remote_history: None,
            ..options(dir.path())
        },
        hw(),
    )
    .unwrap();
    for p in 0..2u32 {
        assert_eq!(records(&log, p, 0), now[p as usize]);
    }
    // Appends go on at the old end.
    let mut b = keyed_batch(&[(b"k1", Some(b"new"))], 9_000);
    assert_eq!(log.append(0, &mut b, None).unwrap().base_offset, 51);
}

#[tokio::test]
async fn a_crash_at_any_point_of_the_swap_loses_and_duplicates_nothing() {
    // Crash states, built from a clean run: (a) a cleaned copy written but
    // not swapped in, (b) the index removed but the copy not renamed yet,
    // (c) renamed but no new index. Each reopens to the records of either
    // the original or the cleaned segment, never a mix or a loss.
    for state in ["copy-written", "index-removed", "renamed"] {
        let dir = tempfile::tempdir().unwrap();
        let log = RangeLog::open(options(dir.path()), hw()).unwrap();
        fill(&log, 3).await;
        let original: Vec<_> = (0..2).map(|p| records(&log, p, 0)).collect();
        log.close();
        drop(log);
        let backup = tempfile::tempdir().unwrap();
        for e in std::fs::read_dir(dir.path()).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), backup.path().join(e.file_name())).unwrap();
        }
        let log = RangeLog::open(options(dir.path()), hw()).unwrap();
        let last = log.cleaning_view().segments.last().unwrap().seq;
        log.clean(last, PARAMS, &mut |_| {}).unwrap();
        let cleaned: Vec<_> = (0..2).map(|p| records(&log, p, 0)).collect();
        log.close();
        drop(log);
        // Rebuild the crash state of segment 0 from the backup.
        let seg0 = segment::log_path(dir.path(), 0);
        let idx0 = segment::index_path(dir.path(), 0);
        let copy0 = tessera_log::range_log::cleaned_path(dir.path(), 0);
        let orig_log = backup.path().join(seg0.file_name().unwrap());
        let orig_idx = backup.path().join(idx0.file_name().unwrap());
        // Later segments: back to their originals too (the swap is oldest first).
        for seq in 1..=last {
            for p in [
                segment::log_path(dir.path(), seq),
                segment::index_path(dir.path(), seq),
            ] {
                std::fs::copy(backup.path().join(p.file_name().unwrap()), &p).unwrap();
            }
        }
        match state {
            "copy-written" => {
                std::fs::rename(&seg0, &copy0).unwrap();
                std::fs::copy(&orig_log, &seg0).unwrap();
                std::fs::copy(&orig_idx, &idx0).unwrap();
            }
            "index-removed" => {
                std::fs::rename(&seg0, &copy0).unwrap();
                std::fs::copy(&orig_log, &seg0).unwrap();
                let _ = std::fs::remove_file(&idx0);
            }
            "renamed" => {
                let _ = std::fs::remove_file(&idx0);
            }
            _ => unreachable!(),
        }
        let log = RangeLog::open(options(dir.path()), hw()).unwrap();
        assert!(!copy0.exists(), "{state}: stray copy removed");
        for p in 0..2u32 {
            let got = records(&log, p, 0);
            // Latest value of every key is there once; nothing invented.
            assert_eq!(latest(&got), latest(&original[p as usize]), "{state}");
            let all: BTreeMap<i64, _> = original[p as usize]
                .iter()
                .map(|(o, k, v)| (*o, (k.clone(), v.clone())))
                .collect();
            assert!(got
                .iter()
                .all(|(o, k, v)| all.get(o) == Some(&(k.clone(), v.clone()))));
            assert!(
                got.windows(2).all(|w| w[0].0 < w[1].0),
                "{state}: no duplicate"
            );
        }
        // And a new pass ends where the clean run ended.
        let last = log.cleaning_view().segments.last().unwrap().seq;
        log.clean(last, PARAMS, &mut |_| {}).unwrap();
        for p in 0..2u32 {
            assert_eq!(records(&log, p, 0), cleaned[p as usize], "{state}");
        }
    }
}

#[tokio::test]
async fn retention_and_cleaning_do_not_trip_over_each_other() {
    let dir = tempfile::tempdir().unwrap();
    let log = RangeLog::open(options(dir.path()), hw()).unwrap();
    fill(&log, 3).await;
    log.delete_segments_below(1).unwrap();
    let last = log.cleaning_view().segments.last().unwrap().seq;
    assert_eq!(log.cleaning_view().segments[0].seq, 1);
    log.clean(last, PARAMS, &mut |_| {}).unwrap();
    let start = log.offsets(1).unwrap().log_start;
    assert_eq!(start, 10);
    assert_eq!(latest(&records(&log, 1, start)).len(), 10);
    // The active segment was never touched: appends and reads go on.
    let mut b = keyed_batch(&[(b"x", Some(b"y"))], 9_000);
    let out = log.append(1, &mut b, None).unwrap();
    log.wait_durable(out.end_position).await.unwrap();
    assert_eq!(records(&log, 1, out.base_offset).len(), 1);
}
