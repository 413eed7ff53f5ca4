//! Elastic ranges against an in-process broker: a property test over random
//! sequences of produce, split, merge and restart (every partition's offsets
//! stay dense and every record stays readable at its offset), and the
//! automatic policy splitting under load and merging after it.

use crate::common;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use tessera_gateway::broker::{Broker, NewTopic};
use tessera_gateway::Running;
use tessera_log::batch::{self, testing::make_batch};

const TOPIC: &str = "elastic";
const PARTITIONS: u32 = 8;

async fn produce(broker: &Broker, partition: i32, id: i64) -> i64 {
    let image = broker.image();
    let topic = image.topic_by_name(TOPIC).unwrap().clone();
    let route = broker.route(&image, &topic, partition).unwrap();
    let mut b = make_batch(1, id);
    let out = route.log.append(partition as u32, &mut b, None).unwrap();
    route.log.wait_durable(out.end_position).await.unwrap();
    out.base_offset
}

/// Every `(offset, id)` of a partition, read through its lineage.
fn read_all(broker: &Broker, partition: u32) -> Vec<(i64, i64)> {
    let image = broker.image();
    let topic = image.topic_by_name(TOPIC).unwrap().clone();
    let active = broker.route(&image, &topic, partition as i32).unwrap();
    let end = active.log.offsets(partition).unwrap().high_watermark;
    let mut out = Vec::new();
    let mut offset = 0;
    while offset < end {
        let log = broker
            .read_route(&image, &topic, partition, offset)
            .unwrap();
        let read = log.read(partition, offset, 1 << 20).unwrap();
        assert!(
            !read.records.is_empty(),
            "no data at offset {offset} below the high watermark {end}"
        );
        for r in batch::split_batches(&read.records).unwrap() {
            let h = batch::validate(&read.records[r]).unwrap();
            out.push((h.base_offset, h.max_timestamp));
            offset = h.last_offset() + 1;
        }
    }
    out
}

#[derive(Clone, Debug)]
enum Op {
    Produce { partition: u32 },
    Split { pick: usize, at: u32 },
    Merge { pick: usize },
    Restart,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..PARTITIONS).prop_map(|partition| Op::Produce { partition }),
        2 => (any::<usize>(), 1..PARTITIONS).prop_map(|(pick, at)| Op::Split { pick, at }),
        2 => any::<usize>().prop_map(|pick| Op::Merge { pick }),
        1 => Just(Op::Restart),
    ]
}

async fn start(dir: &Path) -> Running {
    tessera_gateway::start(common::test_config(dir, &[common::NO_TIME_RETENTION]))
        .await
        .unwrap()
}

/// Per partition, the leader epoch of the active segment of its range.
fn leader_epochs(broker: &Broker) -> Vec<i32> {
    let image = broker.image();
    let topic = image.topic_by_name(TOPIC).unwrap();
    (0..PARTITIONS)
        .map(|p| {
            let range = image
                .active_ranges(topic.id)
                .into_iter()
                .find(|r| r.lo <= p && p < r.hi)
                .expect("a range covers every partition");
            image.active_segment(range.id).unwrap().leader_epoch
        })
        .collect()
}

async fn run_ops(ops: Vec<Op>) {
    let dir = tempfile::tempdir().unwrap();
    let mut running = start(dir.path()).await;
    running
        .broker
        .create_topic(
            NewTopic {
                name: TOPIC.into(),
                partitions: PARTITIONS,
                replication_factor: 1,
                configs: Default::default(),
            },
            false,
        )
        .await
        .unwrap();
    // The model: per partition, the ids in offset order.
    let mut model: HashMap<u32, Vec<i64>> = HashMap::new();
    // Each partition's leader epoch as Metadata reports it (its range's
    // active segment's): a split or merge moves it up for the partitions it
    // covers (clients fence stale leaders by it), never down for any.
    let mut epochs = leader_epochs(&running.broker);
    let mut next_id = 1000;
    for op in ops {
        let broker = running.broker.clone();
        let image = broker.image();
        let topic = image.topic_by_name(TOPIC).unwrap().clone();
        let active = image.active_ranges(topic.id);
        let mut moved: Option<(u32, u32)> = None;
        match op {
            Op::Produce { partition } => {
                next_id += 1;
                let offset = produce(&broker, partition as i32, next_id).await;
                let ids = model.entry(partition).or_default();
                assert_eq!(
                    offset,
                    ids.len() as i64,
                    "partition {partition}: offsets must stay dense"
                );
                ids.push(next_id);
            }
            Op::Split { pick, at } => {
                let range = &active[pick % active.len()];
                if range.hi - range.lo >= 2 {
                    let at = range.lo + 1 + at % (range.hi - range.lo - 1);
                    broker.split_range(range.id, Some(at)).await.unwrap();
                    moved = Some((range.lo, range.hi));
                }
            }
            Op::Merge { pick } => {
                if active.len() >= 2 {
                    let i = pick % (active.len() - 1);
                    broker
                        .merge_ranges(active[i].id, active[i + 1].id)
                        .await
                        .unwrap();
                    moved = Some((active[i].lo, active[i + 1].hi));
                }
            }
            Op::Restart => {
                running.shutdown().await;
                running = start(dir.path()).await;
            }
        }
        let now = leader_epochs(&running.broker);
        for p in 0..PARTITIONS {
            let (before, after) = (epochs[p as usize], now[p as usize]);
            match moved {
                Some((lo, hi)) if (lo..hi).contains(&p) => assert!(
                    after > before,
                    "partition {p}: leader epoch {before} -> {after} across a split or merge"
                ),
                _ => assert!(after >= before, "partition {p}: leader epoch went back"),
            }
        }
        epochs = now;
        // The active ranges always tile the topic.
        let image = running.broker.image();
        let mut covered = 0;
        for r in image.active_ranges(topic.id) {
            assert_eq!(r.lo, covered, "active ranges must tile the partitions");
            covered = r.hi;
        }
        assert_eq!(covered, PARTITIONS);
    }
    for p in 0..PARTITIONS {
        let got = read_all(&running.broker, p);
        let want: Vec<(i64, i64)> = model
            .get(&p)
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .enumerate()
            .map(|(o, id)| (o as i64, id))
            .collect();
        assert_eq!(got, want, "partition {p}");
    }
    running.shutdown().await;
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, .. ProptestConfig::default() })]
    #[test]
    fn offsets_stay_dense_and_readable_across_splits_merges_and_restarts(ops in proptest::collection::vec(op(), 1..40)) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(run_ops(ops));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_then_merge_keeps_every_record_and_bumps_epochs() {
    let ops = (0..PARTITIONS)
        .map(|partition| Op::Produce { partition })
        .chain([Op::Split { pick: 0, at: 3 }])
        .chain((0..PARTITIONS).map(|partition| Op::Produce { partition }))
        .chain([Op::Merge { pick: 0 }, Op::Restart])
        .chain((0..PARTITIONS).map(|partition| Op::Produce { partition }))
        .collect();
    run_ops(ops).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_policy_splits_under_load_and_merges_after() {
    let dir = tempfile::tempdir().unwrap();
    let running = tessera_gateway::start(common::test_config(
        dir.path(),
        &[
            ("range.policy.enable", "true"),
            ("range.policy.interval.ms", "200"),
            ("range.policy.sustain.intervals", "2"),
            ("range.split.bytes.per.sec", "20000"),
            ("range.merge.bytes.per.sec", "2000"),
            ("range.max.count", "4"),
        ],
    ))
    .await
    .unwrap();
    let broker: Arc<Broker> = running.broker.clone();
    broker
        .create_topic(
            NewTopic {
                name: TOPIC.into(),
                partitions: PARTITIONS,
                replication_factor: 1,
                configs: Default::default(),
            },
            false,
        )
        .await
        .unwrap();
    let active_count = |b: &Broker| {
        let image = b.image();
        image
            .active_ranges(image.topic_by_name(TOPIC).unwrap().id)
            .len()
    };
    // Load: ~100 KB/s spread over all partitions, until the policy split.
    let load = {
        let broker = broker.clone();
        tokio::spawn(async move {
            let mut id = 0;
            loop {
                for p in 0..PARTITIONS as i32 {
                    id += 1;
                    // Routing can race a split: a sealed parent refuses, the next try lands in the child.
                    let image = broker.image();
                    let topic = image.topic_by_name(TOPIC).unwrap().clone();
                    if let Ok(route) = broker.route(&image, &topic, p) {
                        let mut b = make_batch(20, id);
                        let _ = route.log.append(p as u32, &mut b, None);
                    }
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    common::eventually("the policy splits the hot range", || {
        active_count(&broker) > 1
    })
    .await;
    load.abort();
    // The counter moves once the split returned (after the image showed it).
    common::eventually("the split is counted", || {
        broker
            .metrics()
            .range_splits
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 1
    })
    .await;
    let peak = active_count(&broker);
    common::eventually("the policy merges the cold ranges back", || {
        active_count(&broker) < peak
    })
    .await;
    // The counter moves once the merge returned (after the image showed it).
    common::eventually("the merge is counted", || {
        broker
            .metrics()
            .range_merges
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 1
    })
    .await;
    let metrics = broker.metrics().render(&[]);
    assert!(metrics.contains("tessera_range_splits_total"), "{metrics}");
    running.shutdown().await;
}

/// A split or merge whose metadata entry fails to commit leaves the parent
/// open and serving, with offsets continuing; a later move succeeds and
/// every record stays readable at its offset, also after a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_that_fails_to_commit_leaves_the_parent_serving() {
    let dir = tempfile::tempdir().unwrap();
    let mut running = start(dir.path()).await;
    let broker = running.broker.clone();
    broker
        .create_topic(
            NewTopic {
                name: TOPIC.into(),
                partitions: PARTITIONS,
                replication_factor: 1,
                configs: Default::default(),
            },
            false,
        )
        .await
        .unwrap();
    let mut model: HashMap<u32, Vec<i64>> = HashMap::new();
    let mut next_id = 0;
    let mut produce_all = |broker: Arc<Broker>| {
        let ids: Vec<(u32, i64)> = (0..PARTITIONS)
            .map(|p| {
                next_id += 1;
                (p, next_id)
            })
            .collect();
        for (p, id) in &ids {
            model.entry(*p).or_default().push(*id);
        }
        async move {
            for (p, id) in ids {
                produce(&broker, p as i32, id).await;
            }
        }
    };
    let active = |b: &Broker| {
        let image = b.image();
        image.active_ranges(image.topic_by_name(TOPIC).unwrap().id)
    };
    produce_all(broker.clone()).await;

    // The split's metadata write fails: an error, and the parent serves on.
    let root = active(&broker)[0].id;
    broker.controller().fail_next_writes(1);
    assert!(broker.split_range(root, None).await.is_err());
    assert_eq!(active(&broker).len(), 1);
    assert_eq!(active(&broker)[0].id, root);
    assert!(!broker.log_of(root).unwrap().is_sealed());
    produce_all(broker.clone()).await;
    // The parent's sealed segment is recorded as a roll.
    common::eventually("the reopened segment is recorded", || {
        broker.image().active_segment(root).map(|s| s.id.seq) == Some(1)
    })
    .await;

    // The same split succeeds once the metadata log takes writes.
    let (left, right) = broker.split_range(root, None).await.unwrap();
    produce_all(broker.clone()).await;

    // A merge whose write fails: both parents serve again.
    broker.controller().fail_next_writes(1);
    assert!(broker.merge_ranges(left, right).await.is_err());
    let ids: Vec<_> = active(&broker).iter().map(|r| r.id).collect();
    assert_eq!(ids, vec![left, right]);
    produce_all(broker.clone()).await;
    broker.merge_ranges(left, right).await.unwrap();
    produce_all(broker.clone()).await;

    let check = |broker: &Broker, model: &HashMap<u32, Vec<i64>>| {
        for p in 0..PARTITIONS {
            let want: Vec<(i64, i64)> = model[&p]
                .iter()
                .enumerate()
                .map(|(o, id)| (o as i64, *id))
                .collect();
            assert_eq!(read_all(broker, p), want, "partition {p}");
        }
    };
    check(&broker, &model);
    running.shutdown().await;
    running = start(dir.path()).await;
    check(&running.broker, &model);
    running.shutdown().await;
}
