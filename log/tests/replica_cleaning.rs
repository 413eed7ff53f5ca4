//! A cleaning pass applied by every replica of the same sealed segments
//! (`clean_pass::clean_files` on a follower's copies, `RangeLog` on the
//! primary's) gives the same bytes, transactions and aborted data included:
//! their inputs come from the segments, not from a log's memory.

use std::collections::BTreeMap;
use std::path::Path;

use bytes::Bytes;
use proptest::prelude::*;
use tessera_log::batch::{self, testing::make_control_batch, BatchHeader};
use tessera_log::clean_pass::{self, PreparedPass};
use tessera_log::cleaner::{self, CleanParams, Record};
use tessera_log::{segment, RangeLog, RangeLogOptions};

const PARAMS: CleanParams = CleanParams {
    now_ms: 1_000_000,
    delete_retention_ms: 1_000,
};

/// One stored batch: `(partition, bytes)`.
type Frame = (u32, Vec<u8>);

/// A batch of `(key, value)` records at `base` (producer -1: none).
fn data(base: i64, kv: &[(&str, Option<&str>)], producer_id: i64, txn: bool) -> Vec<u8> {
    let header = BatchHeader {
        base_offset: base,
        batch_length: 0,
        partition_leader_epoch: 0,
        magic: 2,
        crc: 0,
        attributes: if txn { 0x10 } else { 0 },
        last_offset_delta: kv.len() as i32 - 1,
        base_timestamp: 1_000,
        max_timestamp: 1_000,
        producer_id,
        producer_epoch: if producer_id >= 0 { 0 } else { -1 },
        base_sequence: if producer_id >= 0 { base as i32 } else { -1 },
        record_count: kv.len() as i32,
    };
    let records: Vec<Record> = kv
        .iter()
        .enumerate()
        .map(|(i, (k, v))| Record {
            attributes: 0,
            timestamp: 1_000,
            offset: base + i as i64,
            key: Some(Bytes::copy_from_slice(k.as_bytes())),
            value: v.map(|v| Bytes::copy_from_slice(v.as_bytes())),
            headers: Bytes::from_static(&[0]),
        })
        .collect();
    cleaner::encode_batch(&header, &records, None).unwrap()
}

fn marker(offset: i64, producer_id: i64, commit: bool) -> Vec<u8> {
    let mut b = make_control_batch(producer_id, 0, commit);
    batch::set_base_offset(&mut b, offset);
    b
}

/// Writes sealed segment `seq` of `dir` from `frames` (and its index).
fn write_segment(dir: &Path, seq: u32, frames: &[Frame]) {
    let mut bytes = Vec::new();
    for (p, b) in frames {
        let crc = crc32c::crc32c_append(crc32c::crc32c(&p.to_be_bytes()), b);
        bytes.extend_from_slice(&(b.len() as u32).to_be_bytes());
        bytes.extend_from_slice(&p.to_be_bytes());
        bytes.extend_from_slice(&crc.to_be_bytes());
        bytes.extend_from_slice(b);
    }
    std::fs::write(segment::log_path(dir, seq), bytes).unwrap();
    segment::Segment::open(dir, seq, true, 0).unwrap();
}

fn read_log(dir: &Path, seq: u32) -> Vec<u8> {
    std::fs::read(segment::log_path(dir, seq)).unwrap()
}

/// `(partition, offset, key, value)` of every record in the segments.
fn contents(dir: &Path, seqs: &[u32]) -> Vec<(u32, i64, String, Option<String>)> {
    let mut out = Vec::new();
    for &seq in seqs {
        let s = segment::Segment::open(dir, seq, true, 0).unwrap();
        let mut batches: Vec<_> = s
            .index
            .partitions
            .iter()
            .flat_map(|(p, e)| e.iter().map(move |e| (*p, *e)))
            .collect();
        batches.sort_by_key(|(_, e)| e.position);
        for (p, e) in batches {
            let b = segment::Segment::read_at(&s.file, e.position, e.length as usize).unwrap();
            for r in cleaner::decode_records(&b).unwrap() {
                let text = |b: Bytes| String::from_utf8(b.to_vec()).unwrap();
                if let Some(k) = r.key {
                    out.push((p, r.offset, text(k), r.value.map(text)));
                }
            }
        }
    }
    out
}

/// Three sealed segments over two partitions: updates and a tombstone, a
/// committed transaction, an aborted one whose data is in segment 1 and
/// marker in segment 2, an idempotent producer.
fn scenario() -> Vec<Vec<Frame>> {
    vec![
        vec![
            (
                0,
                data(0, &[("a", Some("a0")), ("b", Some("b0"))], -1, false),
            ),
            (1, data(0, &[("x", Some("x0"))], 9, false)),
            (0, data(2, &[("c", Some("c0"))], 7, true)),
            (0, marker(3, 7, true)),
        ],
        vec![
            (0, data(4, &[("a", Some("a1")), ("c", Some("c1"))], 8, true)),
            (1, data(1, &[("x", Some("x1"))], 9, false)),
            (0, data(6, &[("b", None)], -1, false)),
        ],
        vec![
            (0, data(7, &[("a", Some("ABORTED"))], 8, true)),
            (0, marker(8, 8, false)),
            (1, data(2, &[("y", Some("y0"))], -1, false)),
            (0, data(9, &[("c", Some("c2"))], -1, false)),
        ],
    ]
}

fn replica(segments: &[Vec<Frame>]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (seq, frames) in segments.iter().enumerate() {
        write_segment(dir.path(), seq as u32, frames);
    }
    dir
}

fn assert_same_files(a: &Path, b: &Path, seqs: &[u32]) {
    for &seq in seqs {
        assert_eq!(read_log(a, seq), read_log(b, seq), "segment {seq}");
    }
}

/// The pass's report matches the files it left.
fn assert_report_matches(dir: &Path, prepared: &PreparedPass) {
    for c in &prepared.copies {
        let digest = clean_pass::file_digest(&segment::log_path(dir, c.seq)).unwrap();
        assert_eq!(digest, (c.size_after, c.crc32c), "segment {}", c.seq);
    }
}

#[test]
fn two_replicas_clean_the_same_bytes_to_the_same_bytes() {
    let seqs = [0, 1, 2];
    let (a, b) = (replica(&scenario()), replica(&scenario()));
    let pa = clean_pass::clean_files(a.path(), &seqs, PARAMS, &mut |_| {}).unwrap();
    let pb = clean_pass::clean_files(b.path(), &seqs, PARAMS, &mut |_| {}).unwrap();
    assert_eq!(pa, pb);
    assert!(pa.copies.iter().any(|c| c.changed));
    assert_same_files(a.path(), b.path(), &seqs);
    assert_report_matches(a.path(), &pa);
    // Aborted data went (read from the segments: the ABORT marker is in
    // segment 2, the data in 1 and 2), the latest of every key stayed.
    let got = contents(a.path(), &seqs);
    let latest: BTreeMap<(u32, String), (i64, Option<String>)> = got
        .iter()
        .map(|(p, o, k, v)| ((*p, k.clone()), (*o, v.clone())))
        .collect();
    assert!(got
        .iter()
        .all(|(_, _, _, v)| v.as_deref() != Some("ABORTED")));
    assert!(got.iter().all(|(_, _, _, v)| v.as_deref() != Some("a1")));
    assert_eq!(latest[&(0, "a".into())], (0, Some("a0".into())));
    assert_eq!(latest[&(0, "b".into())], (6, None));
    assert_eq!(latest[&(0, "c".into())], (9, Some("c2".into())));
    assert_eq!(latest[&(1, "x".into())], (1, Some("x1".into())));
    // A second pass past the tombstone's horizon: same again on both.
    let later = CleanParams {
        now_ms: PARAMS.now_ms + PARAMS.delete_retention_ms,
        ..PARAMS
    };
    let pa = clean_pass::clean_files(a.path(), &seqs, later, &mut |_| {}).unwrap();
    let pb = clean_pass::clean_files(b.path(), &seqs, later, &mut |_| {}).unwrap();
    assert_eq!(pa, pb);
    assert_same_files(a.path(), b.path(), &seqs);
    assert_report_matches(a.path(), &pa);
    assert!(contents(a.path(), &seqs)
        .iter()
        .all(|(_, _, k, _)| k != "b"));
}

fn options(dir: &Path) -> RangeLogOptions {
    RangeLogOptions {
        segment_bytes: 1 << 30,
        ..RangeLogOptions::new(dir, 0, 2)
    }
}

/// The primary's log knows more than its sealed segments say (producer 9
/// wrote again in the active segment, so in its memory the batches of the
/// pass are not 9's last), yet its pass gives the follower's bytes.
#[tokio::test]
async fn the_primary_log_and_a_follower_copy_give_the_same_bytes() {
    let seqs = [0, 1, 2];
    let (primary, follower) = (replica(&scenario()), replica(&scenario()));
    std::fs::File::create(segment::log_path(primary.path(), 3)).unwrap();
    let log = RangeLog::open(options(primary.path()), tokio::sync::watch::channel(0).0).unwrap();
    // Sequence 2 (the helper takes it from the base offset; the log assigns offset 3).
    let mut later = data(2, &[("x", Some("x2"))], 9, false);
    log.append(1, &mut later, None).unwrap();
    let prepared = log.prepare_pass(&seqs, PARAMS, &mut |_| {}).unwrap();
    log.swap_prepared(&prepared).unwrap();
    let copied = clean_pass::clean_files(follower.path(), &seqs, PARAMS, &mut |_| {}).unwrap();
    assert_eq!(prepared, copied);
    assert_same_files(primary.path(), follower.path(), &seqs);
    assert_report_matches(primary.path(), &prepared);
}

/// A replica that crashed mid-pass (some segments swapped, a `.cleaned`
/// copy left) and runs the pass again ends on the same bytes.
#[test]
fn a_replica_restarting_mid_pass_ends_on_the_same_bytes() {
    let seqs = [0, 1, 2];
    let reference = replica(&scenario());
    let want = clean_pass::clean_files(reference.path(), &seqs, PARAMS, &mut |_| {}).unwrap();
    for swapped in 0..=seqs.len() {
        let dir = replica(&scenario());
        let now = 0;
        // The crash state: the pass prepared, the first `swapped` changed
        // copies swapped in, the rest left as `.cleaned` files.
        let segments: Vec<_> = seqs
            .iter()
            .map(|s| {
                clean_pass::PassSegment::of(
                    &segment::Segment::open(dir.path(), *s, true, now).unwrap(),
                )
            })
            .collect();
        let prepared = clean_pass::prepare(dir.path(), &segments, PARAMS, &mut |_| {}).unwrap();
        drop(segments);
        for c in prepared.copies.iter().filter(|c| c.changed).take(swapped) {
            clean_pass::swap_copy(dir.path(), c.seq, now).unwrap();
        }
        // Restart: stray copies go (as a log's open does), the pass runs again.
        clean_pass::remove_stray_copies(dir.path()).unwrap();
        let again = clean_pass::clean_files(dir.path(), &seqs, PARAMS, &mut |_| {}).unwrap();
        for c in &want.copies {
            let digest = clean_pass::file_digest(&segment::log_path(dir.path(), c.seq)).unwrap();
            assert_eq!(
                digest,
                (c.size_after, c.crc32c),
                "{swapped} swapped, segment {}",
                c.seq
            );
        }
        assert_same_files(reference.path(), dir.path(), &seqs);
        assert_eq!(again.copies.len(), want.copies.len());
    }
}

/// Random histories: keyed updates and tombstones, transactions of two
/// producers committed or aborted, cut into segments; every transaction
/// ends before the last segment does (the planner's rule).
fn arb_history() -> impl Strategy<Value = Vec<Vec<Frame>>> {
    let op = prop_oneof![
        (0u32..2, 0u8..4, proptest::option::of(0u8..50)).prop_map(|(p, k, v)| (0u8, p, k, v)),
        (0u32..2, 0u8..4, proptest::option::of(0u8..50)).prop_map(|(p, k, v)| (1u8, p, k, v)),
        (0u32..2, 0u8..4, any::<bool>()).prop_map(|(p, k, c)| (2u8, p, k, Some(c as u8))),
    ];
    (
        proptest::collection::vec(op, 1..40),
        proptest::collection::vec(0usize..40, 0..4),
    )
        .prop_map(|(ops, cuts)| {
            let mut next = [0i64; 2];
            let mut open: BTreeMap<(u32, i64), ()> = BTreeMap::new();
            let mut frames: Vec<Frame> = Vec::new();
            for (kind, p, k, v) in ops {
                let key = format!("k{k}");
                let value = v.map(|v| format!("v{v}"));
                let base = next[p as usize];
                match kind {
                    // A plain update or tombstone.
                    0 => frames.push((p, data(base, &[(&key, value.as_deref())], -1, false))),
                    // Transactional data of producer 7 or 8 (by key parity).
                    1 => {
                        let pid = 7 + i64::from(k % 2);
                        open.insert((p, pid), ());
                        frames.push((p, data(base, &[(&key, value.as_deref())], pid, true)));
                    }
                    // Its marker (commit or abort), if a transaction is open.
                    _ => {
                        let pid = 7 + i64::from(k % 2);
                        if open.remove(&(p, pid)).is_none() {
                            continue;
                        }
                        frames.push((p, marker(base, pid, v == Some(1))));
                    }
                }
                next[p as usize] += 1;
            }
            for (p, pid) in open.into_keys() {
                let base = next[p as usize];
                frames.push((p, marker(base, pid, false)));
                next[p as usize] += 1;
            }
            let mut cuts: Vec<usize> = cuts.into_iter().filter(|c| *c < frames.len()).collect();
            cuts.sort_unstable();
            cuts.dedup();
            let mut segments = Vec::new();
            let mut from = 0;
            for c in cuts.into_iter().chain([frames.len()]) {
                segments.push(frames[from..c.max(from)].to_vec());
                from = c.max(from);
            }
            segments
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn replicas_of_random_histories_stay_identical(segments in arb_history(), dr in 0i64..3) {
        let seqs: Vec<u32> = (0..segments.len() as u32).collect();
        let (a, b) = (replica(&segments), replica(&segments));
        for (i, now) in [PARAMS.now_ms, PARAMS.now_ms + 1, PARAMS.now_ms + 5].into_iter().enumerate() {
            let params = CleanParams { now_ms: now, delete_retention_ms: dr };
            let pa = clean_pass::clean_files(a.path(), &seqs, params, &mut |_| {}).unwrap();
            let pb = clean_pass::clean_files(b.path(), &seqs, params, &mut |_| {}).unwrap();
            prop_assert_eq!(&pa, &pb, "pass {}", i);
            for &seq in &seqs {
                prop_assert_eq!(read_log(a.path(), seq), read_log(b.path(), seq));
            }
            assert_report_matches(a.path(), &pa);
        }
    }
}
