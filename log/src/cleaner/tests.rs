use super::*;
use crate::batch::testing::make_control_batch;
use crate::batch::LOG_OVERHEAD;
use proptest::prelude::*;

/// A header for a test batch at `base` holding `count` offsets.
fn header(base: i64, count: i32, producer_id: i64, transactional: bool) -> BatchHeader {
    BatchHeader {
        base_offset: base,
        batch_length: 0,
        partition_leader_epoch: 3,
        magic: 2,
        crc: 0,
        attributes: if transactional { 0x10 } else { 0 },
        last_offset_delta: count - 1,
        base_timestamp: 1_000,
        max_timestamp: 1_000,
        producer_id,
        producer_epoch: if producer_id >= 0 { 0 } else { -1 },
        base_sequence: if producer_id >= 0 { base as i32 } else { -1 },
        record_count: count,
    }
}

fn record(offset: i64, key: &str, value: Option<&str>) -> Record {
    Record {
        attributes: 0,
        timestamp: 1_000 + offset,
        offset,
        key: Some(Bytes::copy_from_slice(key.as_bytes())),
        value: value.map(|v| Bytes::copy_from_slice(v.as_bytes())),
        headers: Bytes::from_static(&[0]),
    }
}

/// A batch of `(key, value)` records at `base`.
fn batch_of(base: i64, kv: &[(&str, Option<&str>)], producer_id: i64, txn: bool) -> Vec<u8> {
    let records: Vec<Record> = kv
        .iter()
        .enumerate()
        .map(|(i, (k, v))| record(base + i as i64, k, *v))
        .collect();
    encode_batch(
        &header(base, kv.len() as i32, producer_id, txn),
        &records,
        None,
    )
    .unwrap()
}

fn control_at(offset: i64, producer_id: i64, commit: bool) -> Vec<u8> {
    let mut b = make_control_batch(producer_id, 0, commit);
    batch::set_base_offset(&mut b, offset);
    b
}

const PARAMS: CleanParams = CleanParams {
    now_ms: 10_000,
    delete_retention_ms: 1_000,
};

/// Runs a whole pass over one partition's batches; returns the cleaned batches.
fn clean(
    batches: &[Vec<u8>],
    params: CleanParams,
    last: &HashMap<(u32, i64), i64>,
    aborted: &HashMap<u32, Vec<AbortedTxn>>,
) -> Vec<Vec<u8>> {
    let map = OffsetMap::build(batches.iter().map(|b| (0u32, b.as_slice())), aborted).unwrap();
    let mut pass = Pass::new(&map, params, last, aborted);
    let mut out = Vec::new();
    for b in batches {
        match pass.clean_batch(0, b).unwrap() {
            Cleaned::Keep => out.push(b.clone()),
            Cleaned::Drop => {}
            Cleaned::Rewrite(n) => out.push(n),
        }
    }
    out
}

fn kv(batches: &[Vec<u8>]) -> Vec<(i64, String, Option<String>)> {
    batches
        .iter()
        .flat_map(|b| decode_records(b).unwrap())
        .map(|r| {
            (
                r.offset,
                String::from_utf8(r.key.unwrap().to_vec()).unwrap(),
                r.value.map(|v| String::from_utf8(v.to_vec()).unwrap()),
            )
        })
        .collect()
}

#[test]
fn encoded_batches_decode_with_kafka_protocol_and_validate() {
    let b = batch_of(40, &[("a", Some("1")), ("b", None)], 7, false);
    let h = batch::validate(&b).unwrap();
    assert_eq!((h.base_offset, h.last_offset(), h.producer_id), (40, 41, 7));
    let mut buf = Bytes::from(b.clone());
    let set = kafka_protocol::records::RecordBatchDecoder::decode(&mut buf).unwrap();
    assert_eq!(set.records.len(), 2);
    assert_eq!(set.records[1].offset, 41);
    assert_eq!(set.records[1].value, None);
    assert_eq!(set.records[0].timestamp, 1_040);
}

#[test]
fn a_rewritten_batch_keeps_base_and_last_offset_producer_fields_and_checks_out() {
    let b = batch_of(
        10,
        &[("a", Some("1")), ("b", Some("2")), ("a", Some("3"))],
        5,
        false,
    );
    let out = clean(
        std::slice::from_ref(&b),
        PARAMS,
        &HashMap::new(),
        &HashMap::new(),
    );
    assert_eq!(out.len(), 1);
    let h = batch::validate(&out[0]).unwrap();
    let orig = batch::parse_header(&b).unwrap();
    assert_eq!(h.base_offset, 10);
    assert_eq!(h.last_offset(), 12);
    assert_eq!(
        (
            h.producer_id,
            h.producer_epoch,
            h.base_sequence,
            h.partition_leader_epoch
        ),
        (
            orig.producer_id,
            orig.producer_epoch,
            orig.base_sequence,
            orig.partition_leader_epoch
        )
    );
    assert_eq!(h.record_count, 2);
    assert_eq!(
        kv(&out),
        vec![
            (11, "b".into(), Some("2".into())),
            (12, "a".into(), Some("3".into()))
        ]
    );
}

#[test]
fn compressed_batches_are_cleaned_and_recompressed_with_their_codec() {
    for codec in 1..=4i16 {
        let mut h = header(0, 3, -1, false);
        h.attributes |= codec;
        let records = vec![
            record(0, "k", Some("old")),
            record(1, "j", Some("x")),
            record(2, "k", Some("new")),
        ];
        let b = encode_batch(&h, &records, None).unwrap();
        assert_eq!(batch::validate(&b).unwrap().compression_codec(), codec);
        let out = clean(&[b], PARAMS, &HashMap::new(), &HashMap::new());
        assert_eq!(batch::validate(&out[0]).unwrap().compression_codec(), codec);
        assert_eq!(
            kv(&out),
            vec![
                (1, "j".into(), Some("x".into())),
                (2, "k".into(), Some("new".into()))
            ]
        );
    }
}

#[test]
fn an_untouched_batch_stays_byte_for_byte() {
    let b = batch_of(0, &[("a", Some("1")), ("b", Some("2"))], -1, false);
    let out = clean(
        std::slice::from_ref(&b),
        PARAMS,
        &HashMap::new(),
        &HashMap::new(),
    );
    assert_eq!(out, vec![b]);
}

#[test]
fn tombstones_get_a_horizon_then_go_after_it() {
    let batches = vec![
        batch_of(0, &[("a", Some("1")), ("b", Some("1"))], -1, false),
        batch_of(2, &[("a", None)], -1, false),
    ];
    let once = clean(&batches, PARAMS, &HashMap::new(), &HashMap::new());
    assert_eq!(
        kv(&once),
        vec![(1, "b".into(), Some("1".into())), (2, "a".into(), None)]
    );
    let h = batch::validate(&once[1]).unwrap();
    assert_eq!(delete_horizon(&h), Some(11_000));
    // Records keep their timestamps under the new base timestamp.
    assert_eq!(decode_records(&once[1]).unwrap()[0].timestamp, 1_002);
    // Before the horizon the tombstone stays, the batch untouched.
    let early = CleanParams {
        now_ms: 10_999,
        ..PARAMS
    };
    assert_eq!(clean(&once, early, &HashMap::new(), &HashMap::new()), once);
    let late = CleanParams {
        now_ms: 11_000,
        ..PARAMS
    };
    let twice = clean(&once, late, &HashMap::new(), &HashMap::new());
    assert_eq!(kv(&twice), vec![(1, "b".into(), Some("1".into()))]);
}

#[test]
fn records_without_a_key_go() {
    let mut r = record(0, "x", Some("v"));
    r.key = None;
    let b = encode_batch(
        &header(0, 2, -1, false),
        &[r, record(1, "a", Some("1"))],
        None,
    )
    .unwrap();
    let out = clean(&[b], PARAMS, &HashMap::new(), &HashMap::new());
    assert_eq!(kv(&out), vec![(1, "a".into(), Some("1".into()))]);
}

#[test]
fn the_last_batch_of_a_producer_is_kept_empty() {
    let batches = vec![
        batch_of(0, &[("a", Some("1"))], 9, false),
        batch_of(1, &[("a", Some("2"))], -1, false),
    ];
    let last: HashMap<(u32, i64), i64> = [((0, 9), 0)].into();
    let out = clean(&batches, PARAMS, &last, &HashMap::new());
    assert_eq!(out.len(), 2);
    // validate() refuses an empty data batch from a producer; stored ones
    // pass the frame checks (header and CRC).
    let h = batch::parse_header(&out[0]).unwrap();
    assert_eq!(batch::compute_crc(&out[0]), h.crc);
    assert_eq!(
        (
            h.record_count,
            h.base_offset,
            h.last_offset(),
            h.producer_id
        ),
        (0, 0, 0, 9)
    );
    assert_eq!(h.base_sequence, 0);
    // Not the producer's last batch: dropped.
    let out = clean(&batches, PARAMS, &HashMap::new(), &HashMap::new());
    assert_eq!(out.len(), 1);
}

#[test]
fn aborted_data_goes_and_its_marker_after_the_horizon() {
    // Producer 4: transaction [0, 1] aborted by the marker at 2; key a's
    // committed value at 3 stays, and the aborted "a" never hides it.
    let batches = vec![
        batch_of(
            0,
            &[("a", Some("aborted")), ("b", Some("aborted"))],
            4,
            true,
        ),
        control_at(2, 4, false),
        batch_of(3, &[("a", Some("committed"))], -1, false),
    ];
    let aborted: HashMap<u32, Vec<AbortedTxn>> = [(
        0,
        vec![AbortedTxn {
            producer_id: 4,
            first_offset: 0,
            last_offset: 2,
        }],
    )]
    .into();
    let once = clean(&batches, PARAMS, &HashMap::new(), &aborted);
    // The data goes; the marker stays (its data was seen in this pass).
    assert_eq!(once.len(), 2);
    assert!(batch::parse_header(&once[0]).unwrap().is_control());
    assert_eq!(
        kv(&once[1..]),
        vec![(3, "a".into(), Some("committed".into()))]
    );
    // Next pass: no data left, the marker gets its horizon; then it goes.
    let twice = clean(&once, PARAMS, &HashMap::new(), &aborted);
    let h = batch::validate(&twice[0]).unwrap();
    assert_eq!(delete_horizon(&h), Some(11_000));
    assert_eq!(batch::control_marker_is_commit(&twice[0]), Some(false));
    let late = CleanParams {
        now_ms: 20_000,
        ..PARAMS
    };
    let thrice = clean(&twice, late, &HashMap::new(), &aborted);
    assert_eq!(kv(&thrice), vec![(3, "a".into(), Some("committed".into()))]);
    assert_eq!(thrice.len(), 1);
}

#[test]
fn a_commit_marker_stays_while_its_data_does() {
    let batches = vec![
        batch_of(0, &[("a", Some("1"))], 4, true),
        control_at(1, 4, true),
    ];
    let late = CleanParams {
        now_ms: 1 << 40,
        ..PARAMS
    };
    let out = clean(&batches, late, &HashMap::new(), &HashMap::new());
    assert_eq!(out, batches);
}

#[test]
fn partitions_are_cleaned_apart() {
    let a = batch_of(0, &[("k", Some("p0"))], -1, false);
    let b = batch_of(0, &[("k", Some("p1"))], -1, false);
    let map = OffsetMap::build(
        [(0u32, a.as_slice()), (1u32, b.as_slice())],
        &HashMap::new(),
    )
    .unwrap();
    assert_eq!(map.len(), 2);
    let (last, aborted) = (HashMap::new(), HashMap::new());
    let mut pass = Pass::new(&map, PARAMS, &last, &aborted);
    assert_eq!(pass.clean_batch(0, &a).unwrap(), Cleaned::Keep);
    assert_eq!(pass.clean_batch(1, &b).unwrap(), Cleaned::Keep);
}

#[test]
fn garbage_is_an_error_not_a_panic() {
    let mut b = batch_of(0, &[("a", Some("1"))], -1, false);
    let n = b.len();
    b[n - 3] = 0xff; // a key length varint that runs past the end
    b.truncate(n - 1);
    let len = (b.len() - LOG_OVERHEAD) as i32;
    b[8..12].copy_from_slice(&len.to_be_bytes());
    assert!(decode_records(&b).is_err());
    assert!(decode_records(&[1, 2, 3]).is_err());
}

proptest! {
    /// Any sequence of updates (tombstones included) over a few keys and
    /// partitions, cut into batches: after a pass, every key's last record
    /// is there with its value, nothing else of it, offsets strictly
    /// increase, and every record kept was in the input at that offset.
    #[test]
    fn latest_value_per_key_survives(
        updates in prop::collection::vec((0u32..3, 0u8..6, prop::option::weighted(0.8, 0u8..50)), 1..200),
        cut in 1usize..8,
        past_horizon in any::<bool>(),
    ) {
        let mut next = [0i64; 3];
        let mut input: Vec<(u32, Vec<u8>)> = Vec::new();
        let mut truth: HashMap<(u32, String), (i64, Option<String>)> = HashMap::new();
        let mut all: HashMap<(u32, i64), (String, Option<String>)> = HashMap::new();
        for chunk in updates.chunks(cut) {
            for p in 0..3u32 {
                let kvs: Vec<(String, Option<String>)> = chunk
                    .iter()
                    .filter(|u| u.0 == p)
                    .map(|u| (format!("k{}", u.1), u.2.map(|v| format!("v{v}"))))
                    .collect();
                if kvs.is_empty() {
                    continue;
                }
                let base = next[p as usize];
                let refs: Vec<(&str, Option<&str>)> =
                    kvs.iter().map(|(k, v)| (k.as_str(), v.as_deref())).collect();
                input.push((p, batch_of(base, &refs, -1, false)));
                for (i, (k, v)) in kvs.iter().enumerate() {
                    truth.insert((p, k.clone()), (base + i as i64, v.clone()));
                    all.insert((p, base + i as i64), (k.clone(), v.clone()));
                }
                next[p as usize] += kvs.len() as i64;
            }
        }
        let (last, aborted) = (HashMap::new(), HashMap::new());
        let run = |batches: &[(u32, Vec<u8>)], params: CleanParams| {
            let map = OffsetMap::build(batches.iter().map(|(p, b)| (*p, b.as_slice())), &aborted).unwrap();
            let mut pass = Pass::new(&map, params, &last, &aborted);
            let mut out = Vec::new();
            for (p, b) in batches {
                match pass.clean_batch(*p, b).unwrap() {
                    Cleaned::Keep => out.push((*p, b.clone())),
                    Cleaned::Drop => {}
                    Cleaned::Rewrite(n) => out.push((*p, n)),
                }
            }
            out
        };
        let mut out = run(&input, PARAMS);
        if past_horizon {
            out = run(&out, CleanParams { now_ms: PARAMS.now_ms + PARAMS.delete_retention_ms, ..PARAMS });
        }
        let mut seen: HashMap<(u32, String), (i64, Option<String>)> = HashMap::new();
        let mut last_offset = [-1i64; 3];
        for (p, b) in &out {
            let h = batch::validate(b).unwrap();
            prop_assert!(h.base_offset > last_offset[*p as usize]);
            for r in decode_records(b).unwrap() {
                prop_assert!(r.offset > last_offset[*p as usize]);
                prop_assert!(r.offset >= h.base_offset && r.offset <= h.last_offset());
                last_offset[*p as usize] = r.offset;
                let k = String::from_utf8(r.key.unwrap().to_vec()).unwrap();
                let v = r.value.map(|v| String::from_utf8(v.to_vec()).unwrap());
                prop_assert_eq!(all.get(&(*p, r.offset)), Some(&(k.clone(), v.clone())));
                prop_assert!(seen.insert((*p, k), (r.offset, v)).is_none());
            }
            last_offset[*p as usize] = h.last_offset();
        }
        for (key, (offset, value)) in &truth {
            match (value, past_horizon) {
                (None, true) => prop_assert!(!seen.contains_key(key)),
                _ => prop_assert_eq!(seen.get(key), Some(&(*offset, value.clone()))),
            }
        }
        prop_assert_eq!(seen.len(), truth.iter().filter(|(_, (_, v))| v.is_some() || !past_horizon).count());
        // Cleaning is idempotent: a second pass with the same inputs changes nothing.
        let again = run(&out, CleanParams { now_ms: if past_horizon { PARAMS.now_ms + PARAMS.delete_retention_ms } else { PARAMS.now_ms }, ..PARAMS });
        prop_assert_eq!(again, out);
    }
}

fn stat(seq: u32, size: u64, ts: i64) -> SegmentStat {
    SegmentStat {
        seq,
        size,
        max_timestamp: ts,
        first_batch_timestamp: ts,
        stable: true,
    }
}

const POLICY: CleanPolicy = CleanPolicy {
    now_ms: 10_000,
    min_compaction_lag_ms: 0,
    min_cleanable_dirty_ratio: 0.5,
    max_compaction_lag_ms: i64::MAX,
};

#[test]
fn a_pass_cleans_the_stable_old_enough_prefix_when_dirty_enough() {
    let segs = [stat(0, 100, 1), stat(1, 100, 2), stat(2, 100, 9_500)];
    assert_eq!(plan_pass(&segs, 0, &POLICY), Some(2));
    // Everything cleaned already: nothing to do.
    assert_eq!(plan_pass(&segs, 3, &POLICY), None);
    // 100 dirty of 300: below 0.5.
    assert_eq!(plan_pass(&segs, 2, &POLICY), None);
    let low = CleanPolicy {
        min_cleanable_dirty_ratio: 0.3,
        ..POLICY
    };
    assert_eq!(plan_pass(&segs, 2, &low), Some(2));
    // min.compaction.lag.ms keeps the young segment (and what follows) out.
    let lag = CleanPolicy {
        min_compaction_lag_ms: 1_000,
        min_cleanable_dirty_ratio: 0.1,
        ..POLICY
    };
    assert_eq!(plan_pass(&segs, 0, &lag), Some(1));
    // An open transaction stops the run.
    let mut unstable = segs;
    unstable[1].stable = false;
    assert_eq!(plan_pass(&unstable, 0, &POLICY), Some(0));
    assert_eq!(plan_pass(&[], 0, &POLICY), None);
}

#[test]
fn max_compaction_lag_cleans_an_overdue_dirty_segment_below_the_ratio() {
    // 100 dirty bytes of 300: below 0.5, but the dirty segment's first
    // batch (9_000) is older than now (10_000) - max lag.
    let segs = [stat(0, 100, 1), stat(1, 100, 2), stat(2, 100, 9_000)];
    let lag = |max| CleanPolicy {
        max_compaction_lag_ms: max,
        ..POLICY
    };
    assert_eq!(plan_pass(&segs, 2, &lag(i64::MAX)), None);
    assert_eq!(plan_pass(&segs, 2, &lag(2_000)), None, "not overdue yet");
    assert_eq!(plan_pass(&segs, 2, &lag(500)), Some(2));
    // Overdue clean segments do not count: nothing dirty, nothing to do.
    assert_eq!(plan_pass(&segs, 3, &lag(0)), None);
    // A segment without timestamps is never overdue.
    let mut untimed = segs;
    untimed[2].first_batch_timestamp = -1;
    assert_eq!(plan_pass(&untimed, 2, &lag(0)), None);
    // Still only the stable, old-enough prefix (min.compaction.lag.ms wins).
    let both = CleanPolicy {
        min_compaction_lag_ms: 5_000,
        ..lag(500)
    };
    assert_eq!(plan_pass(&segs, 2, &both), None);
}

#[test]
fn the_throttle_waits_for_the_bytes_due() {
    use std::time::Duration;
    assert_eq!(
        throttle_delay(1_000, Duration::from_secs(1), 1_000.0),
        Duration::ZERO
    );
    assert_eq!(
        throttle_delay(2_000, Duration::from_secs(1), 1_000.0),
        Duration::from_secs(1)
    );
    assert_eq!(
        throttle_delay(2_000, Duration::ZERO, f64::MAX),
        Duration::ZERO
    );
    assert_eq!(
        throttle_delay(2_000, Duration::ZERO, f64::INFINITY),
        Duration::ZERO
    );
}
