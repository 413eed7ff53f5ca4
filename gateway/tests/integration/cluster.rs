//! Three in-process brokers of one metadata quorum on free loopback ports:
//! for faults a test must place exactly, through the controller's fault
//! injection, where processes and a network (compat-tests) cannot.

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tessera_gateway::broker::{Broker, NewTopic};
use tessera_gateway::Running;
use tessera_log::batch::testing::make_batch;

const TOPIC: &str = "replicated";

/// A loopback port free at the time of asking (the controller listens on
/// the port `controller.quorum.voters` names, so it is chosen up front).
/// A free port for a node's controller listener, bound later by the node.
/// Taken below the kernel's ephemeral range (32768 and up), which every
/// listener on port 0 of the tests running beside this one draws from: a
/// port from there was once handed to another test's listener between
/// this check and the node's bind ("Address already in use", CI). Each
/// port is handed out once per process.
fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_000;
    let start = std::process::id().wrapping_mul(7919) % SPAN;
    loop {
        let k = NEXT.fetch_add(1, Ordering::Relaxed);
        assert!(k < SPAN, "no free port below the ephemeral range");
        let port = (LOW + (start + k) % SPAN) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// Starts `n` controller+broker nodes, timed as the compat tests' clusters
/// (failures noticed in seconds).
async fn start_cluster(dir: &Path, n: usize) -> Vec<Running> {
    start_cluster_with(dir, n, &[]).await
}

/// [`start_cluster`] with more configs for every node.
async fn start_cluster_with(dir: &Path, n: usize, extra: &[(&str, &str)]) -> Vec<Running> {
    let ports: Vec<u16> = (0..n).map(|_| free_port()).collect();
    let voters = ports
        .iter()
        .enumerate()
        .map(|(i, p)| format!("{}@127.0.0.1:{p}", i + 1))
        .collect::<Vec<_>>()
        .join(",");
    let starts = (0..n).map(|i| {
        let node_dir = dir.join(format!("node-{}", i + 1));
        std::fs::create_dir_all(&node_dir).unwrap();
        let id = (i + 1).to_string();
        let mut configs = vec![
            ("node.id", id.as_str()),
            ("controller.quorum.voters", voters.as_str()),
            ("broker.heartbeat.interval.ms", "500"),
            ("broker.session.timeout.ms", "3000"),
            ("replica.lag.time.max.ms", "2000"),
            common::NO_TIME_RETENTION,
        ];
        configs.extend_from_slice(extra);
        let config = common::test_config(&node_dir, &configs);
        // Together: each start waits for a quorum of the others.
        tokio::spawn(async move { tessera_gateway::start(config).await.unwrap() })
    });
    let mut nodes = Vec::new();
    for start in starts.collect::<Vec<_>>() {
        nodes.push(start.await.unwrap());
    }
    common::eventually(
        "every node sees every broker registered and unfenced",
        || {
            nodes.iter().all(|r| {
                let image = r.broker.image();
                image.brokers.len() == n && image.brokers.values().all(|b| !b.fenced)
            })
        },
    )
    .await;
    nodes
}

/// The node that is primary of the topic's only range, once every node's
/// image shows the topic.
async fn primary(nodes: &[Running]) -> Arc<Broker> {
    let mut found = None;
    common::eventually("the topic's range has a primary with an open log", || {
        found = nodes.iter().map(|r| r.broker.clone()).find(|b| {
            let image = b.image();
            let Some(topic) = image.topic_by_name(TOPIC) else {
                return false;
            };
            let range = image.active_ranges(topic.id)[0].id;
            image.active_segment(range).and_then(|s| s.primary()) == Some(b.config().node_id)
                && b.log_of(range).is_some_and(|l| !l.is_sealed())
        });
        found.is_some()
    })
    .await;
    found.unwrap()
}

/// One record (id `id`) to partition 0 through the broker's own append
/// path (rolls included), waiting for a quorum; its offset.
async fn produce(broker: &Broker, id: i64) -> i64 {
    let image = broker.image();
    let topic = image.topic_by_name(TOPIC).unwrap().clone();
    let route = broker.route(&image, &topic, 0).unwrap();
    broker
        .append_durably(&route, 0, make_batch(1, id))
        .await
        .unwrap()
}

/// A segment roll whose metadata record fails to commit (the controller
/// write failed, as one forwarded to a controller that failed over does)
/// is recorded by a retry: the range commits past the roll. Before, the
/// roll was recorded only at the next restart, and until then nothing the
/// primary appended after it was ever acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_roll_whose_record_failed_is_recorded_again() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = start_cluster(dir.path(), 3).await;
    let configs = BTreeMap::from([
        ("segment.bytes".to_string(), "14".to_string()),
        ("min.insync.replicas".to_string(), "2".to_string()),
    ]);
    nodes[0]
        .broker
        .create_topic(
            NewTopic {
                name: TOPIC.into(),
                partitions: 1,
                replication_factor: 3,
                configs,
            },
            false,
        )
        .await
        .unwrap();
    let primary = primary(&nodes).await;
    let range = {
        let image = primary.image();
        image.active_ranges(image.topic_by_name(TOPIC).unwrap().id)[0].id
    };
    assert_eq!(produce(&primary, 1).await, 0);
    let active_before = primary.image().active_segment(range).unwrap().id.seq;

    // The next append rolls (segment.bytes is tiny); the roll's record is
    // the primary's next metadata write, and it fails.
    primary.controller().fail_next_writes(1);
    let acknowledged = tokio::time::timeout(Duration::from_secs(60), produce(&primary, 2)).await;
    assert_eq!(
        acknowledged.expect("an append after the unrecorded roll was never acknowledged"),
        1
    );
    let active_after = primary.image().active_segment(range).unwrap().id.seq;
    assert!(
        active_after > active_before,
        "the roll is recorded: active segment {active_before} -> {active_after}"
    );
    for r in nodes {
        r.shutdown().await;
    }
}

/// The node leading `partition` of `topic` with its log open, once one does.
async fn leader_of(nodes: &[Running], topic: &str, partition: u32) -> Arc<Broker> {
    let mut found = None;
    common::eventually(&format!("{topic}-{partition} led with an open log"), || {
        found = nodes.iter().map(|r| r.broker.clone()).find(|b| {
            let image = b.image();
            let Some(t) = image.topic_by_name(topic) else {
                return false;
            };
            let Some(range) = image.active_range_for(t.id, partition) else {
                return false;
            };
            image.active_segment(range.id).and_then(|s| s.primary()) == Some(b.config().node_id)
                && b.log_of(range.id).is_some_and(|l| !l.is_sealed())
        });
        found.is_some()
    })
    .await;
    found.unwrap()
}

/// One record (id `id`) to `partition` of `topic` through its leader,
/// acknowledged by a quorum; its offset.
async fn produce_to(nodes: &[Running], topic: &str, partition: u32, id: i64) -> i64 {
    let leader = leader_of(nodes, topic, partition).await;
    let image = leader.image();
    let t = image.topic_by_name(topic).unwrap().clone();
    let route = leader.route(&image, &t, partition as i32).unwrap();
    leader
        .append_durably(&route, partition, make_batch(1, id))
        .await
        .unwrap()
}

/// The active range holding `partition` of `topic`, in node 1's image.
fn range_of(nodes: &[Running], topic: &str, partition: u32) -> u64 {
    let image = nodes[0].broker.image();
    let t = image.topic_by_name(topic).unwrap();
    image.active_range_for(t.id, partition).unwrap().id
}

/// The primary of `range`'s active segment, in node 1's image.
fn primary_of(nodes: &[Running], range: u64) -> Option<i32> {
    nodes[0]
        .broker
        .image()
        .active_segment(range)
        .and_then(|s| s.primary())
}

/// Two topics of `partitions` partitions in ranges of `width`, one range
/// per broker each: the broker leading partition 0 of the first, the
/// partition of each topic it leads, and their ranges (the pair a test
/// makes busy on one broker).
async fn busy_pair(
    nodes: &[Running],
    topics: [&'static str; 2],
    partitions: u32,
    width: usize,
) -> (i32, Vec<(&'static str, u32)>, Vec<u64>) {
    let busy = leader_of(nodes, topics[0], 0).await.config().node_id;
    let mut targets = vec![(topics[0], 0u32)];
    for p in (0..partitions).step_by(width) {
        if leader_of(nodes, topics[1], p).await.config().node_id == busy {
            targets.push((topics[1], p));
        }
    }
    assert_eq!(
        targets.len(),
        2,
        "each broker leads one range of each topic"
    );
    let ranges = targets
        .iter()
        .map(|(t, p)| range_of(nodes, t, *p))
        .collect();
    (busy, targets, ranges)
}

/// A split on a cluster puts its children on different brokers (the
/// second handed to a follower, nothing copied), each partition's offsets
/// go on densely across it, and a merge of the spread children gathers
/// them back on the broker that merges. Before, both children stayed on
/// the parent's primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_spreads_its_children_and_a_merge_gathers_them() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = start_cluster(dir.path(), 3).await;
    let topic = "spread";
    nodes[0]
        .broker
        .create_topic(
            NewTopic {
                name: topic.into(),
                partitions: 6,
                replication_factor: 3,
                configs: BTreeMap::from([("min.insync.replicas".to_string(), "2".to_string())]),
            },
            false,
        )
        .await
        .unwrap();
    for p in [0, 1] {
        for i in 0..3 {
            assert_eq!(produce_to(&nodes, topic, p, i).await, i);
        }
    }
    let parent_leader = leader_of(&nodes, topic, 0).await;
    let parent = {
        let image = parent_leader.image();
        let t = image.topic_by_name(topic).unwrap();
        image.active_range_for(t.id, 0).unwrap().clone()
    };
    assert_eq!(
        (parent.lo, parent.hi),
        (0, 2),
        "six partitions in ranges of two"
    );
    let (left, right) = parent_leader.split_range(parent.id, Some(1)).await.unwrap();

    let primaries = || {
        let image = nodes[0].broker.image();
        [left, right].map(|r| image.active_segment(r).and_then(|s| s.primary()))
    };
    common::eventually("the split's children led by different brokers", || {
        let [l, r] = primaries();
        l.is_some() && r.is_some() && l != r
    })
    .await;
    assert_eq!(primaries()[0], Some(parent_leader.config().node_id));
    for p in [0, 1] {
        assert_eq!(
            produce_to(&nodes, topic, p, 3).await,
            3,
            "partition {p} goes on at its next offset on its child's leader"
        );
    }
    let right_leader = leader_of(&nodes, topic, 1).await;
    assert_ne!(
        right_leader.config().node_id,
        parent_leader.config().node_id
    );

    let child = parent_leader.merge_ranges(left, right).await.unwrap();
    let image = parent_leader.image();
    assert_eq!(
        image.active_segment(child).and_then(|s| s.primary()),
        Some(parent_leader.config().node_id),
        "the merge child is led where it was merged"
    );
    for p in [0, 1] {
        assert_eq!(
            produce_to(&nodes, topic, p, 4).await,
            4,
            "partition {p} after the merge"
        );
    }
    for r in nodes {
        r.shutdown().await;
    }
}

/// A broker leading two busy ranges while the others lead idle ones hands
/// one of them to a follower (the balance by bytes in; by leader count
/// every broker leads as many ranges and nothing would move), and says why
/// on `GET /balance`. Offsets go on densely through the move.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_leading_the_busy_ranges_hands_one_to_a_follower() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = start_cluster_with(
        dir.path(),
        3,
        &[
            ("leader.imbalance.check.interval.seconds", "1"),
            ("leader.load.balance.min.bytes.per.sec", "1000"),
            // Only leader moves, so that the test sees what balance did.
            ("replica.placement.rebalance.enable", "false"),
        ],
    )
    .await;
    for name in ["hot-a", "hot-b"] {
        nodes[0]
            .broker
            .create_topic(
                NewTopic {
                    name: name.into(),
                    partitions: 3,
                    replication_factor: 3,
                    configs: BTreeMap::new(),
                },
                false,
            )
            .await
            .unwrap();
    }
    // One range of each topic on the same broker: those two are busy.
    let (busy, targets, ranges) = busy_pair(&nodes, ["hot-a", "hot-b"], 3, 1).await;
    let primary_of = |range: u64| primary_of(&nodes, range);

    // ~300 KB/s into each busy range, through whichever broker leads it.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let brokers: Vec<Arc<Broker>> = nodes.iter().map(|r| r.broker.clone()).collect();
    let load = {
        let (stop, targets) = (stop.clone(), targets.clone());
        tokio::spawn(async move {
            let mut offsets: Vec<Vec<i64>> = vec![Vec::new(); targets.len()];
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for (i, (topic, p)) in targets.iter().enumerate() {
                    for b in &brokers {
                        let image = b.image();
                        let t = image.topic_by_name(topic).unwrap().clone();
                        let Ok(route) = b.route(&image, &t, *p as i32) else {
                            continue;
                        };
                        if let Ok(offset) = b.append_durably(&route, *p, make_batch(60, 1)).await {
                            offsets[i].push(offset);
                            break;
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            offsets
        })
    };
    common::eventually("one busy range handed to another broker", || {
        let primaries: Vec<_> = ranges.iter().map(|r| primary_of(*r)).collect();
        primaries.iter().all(Option::is_some) && primaries[0] != primaries[1]
    })
    .await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let offsets = load.await.unwrap();
    for (i, o) in offsets.iter().enumerate() {
        assert!(o.len() > 10, "{:?} took records", targets[i]);
        let dense: Vec<i64> = (0..o.len() as i64).map(|k| k * 60).collect();
        assert_eq!(o, &dense, "{:?}: each batch at the next offset", targets[i]);
    }
    let controller = nodes
        .iter()
        .find(|r| r.broker.controller().is_leader())
        .expect("an active controller");
    let view = controller.broker.balance_view();
    assert!(
        view.decisions
            .iter()
            .any(|d| ranges.contains(&d.range) && d.from == busy && d.reason.contains("bytes in")),
        "the move and its reason: {view:?}"
    );
    for r in nodes {
        r.shutdown().await;
    }
}

/// Two brokers split their ranges at once: both plan from the same image
/// and take the same child ids. The later entry sealed its parent while
/// replay skipped its children, and those partitions had no range at all
/// (produce timed out for good); now the active controller creates the
/// children the lost move owes, and every partition goes on at its next
/// offset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_splits_on_two_brokers_leave_no_partition_without_a_range() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = start_cluster(dir.path(), 3).await;
    let topic = "race";
    nodes[0]
        .broker
        .create_topic(
            NewTopic {
                name: topic.into(),
                partitions: 6,
                replication_factor: 3,
                configs: BTreeMap::from([("min.insync.replicas".to_string(), "2".to_string())]),
            },
            false,
        )
        .await
        .unwrap();
    for p in 0..6 {
        assert_eq!(produce_to(&nodes, topic, p, 0).await, 0);
    }
    let (a, b) = (
        leader_of(&nodes, topic, 0).await,
        leader_of(&nodes, topic, 2).await,
    );
    assert_ne!(a.config().node_id, b.config().node_id);
    let (ra, rb) = (range_of(&nodes, topic, 0), range_of(&nodes, topic, 2));
    let (first, second) = tokio::join!(a.split_range(ra, None), b.split_range(rb, None));
    // One may have lost its child ids (it says so); neither range stays.
    let outcomes = [first, second];
    assert!(outcomes.iter().any(|o| o.is_ok()), "{outcomes:?}");
    common::eventually("every partition in an active range on every node", || {
        nodes.iter().all(|n| {
            let image = n.broker.image();
            let t = image.topic_by_name(topic).unwrap();
            (0..6).all(|p| image.active_range_for(t.id, p).is_some())
        })
    })
    .await;
    for p in 0..6 {
        assert_eq!(
            produce_to(&nodes, topic, p, 1).await,
            1,
            "partition {p} goes on at its next offset"
        );
    }
    for r in nodes {
        r.shutdown().await;
    }
}

/// An unreplicated range (replication factor 1: no follower to hand it to)
/// on a broker leading two busy ranges moves whole to another broker at a
/// boundary: the old primary seals it, the new one opens the next segment,
/// fetches the producer snapshot from the old one and reads the sealed
/// history from it remotely. Offsets go on densely through the move, the
/// idempotent producers go on at their next sequence (a retry of a batch
/// written before the move is answered with its first offsets), every
/// record is read back through the new primary, and a split of the moved
/// range puts its second child on yet another broker. Before, RF=1 ranges
/// never moved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreplicated_range_moves_whole_and_reads_its_history_remotely() {
    use tessera_log::batch::testing::make_idempotent_batch;

    let dir = tempfile::tempdir().unwrap();
    let nodes = start_cluster_with(
        dir.path(),
        3,
        &[
            ("leader.imbalance.check.interval.seconds", "1"),
            ("leader.load.balance.min.bytes.per.sec", "1000"),
            ("replica.placement.rebalance.enable", "false"),
        ],
    )
    .await;
    for name in ["solo-a", "solo-b"] {
        nodes[0]
            .broker
            .create_topic(
                NewTopic {
                    name: name.into(),
                    partitions: 6,
                    replication_factor: 1,
                    // A few rolls before the move: the history it reads
                    // remotely is more than one segment.
                    configs: BTreeMap::from([("segment.bytes".to_string(), "8192".to_string())]),
                },
                false,
            )
            .await
            .unwrap();
    }
    let (busy, targets, ranges) = busy_pair(&nodes, ["solo-a", "solo-b"], 6, 2).await;
    let primary_of = |range: u64| primary_of(&nodes, range);

    // Three one-record batches of another idempotent producer first: a
    // retry of them after the move must be known as a duplicate (a
    // producer's last five batches are).
    for (i, (topic, p)) in targets.iter().enumerate() {
        for k in 0..3 {
            let leader = leader_of(&nodes, topic, *p).await;
            let image = leader.image();
            let t = image.topic_by_name(topic).unwrap().clone();
            let route = leader.route(&image, &t, *p as i32).unwrap();
            let batch = make_idempotent_batch(1, 1, 8000 + i as i64, 0, k);
            assert_eq!(
                leader.append_durably(&route, *p, batch).await.unwrap(),
                k as i64
            );
        }
    }
    // Idempotent batches of 60 records into each busy range, through
    // whichever broker leads it, until told to stop; each target's
    // (first sequence, offset) pairs.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let brokers: Vec<Arc<Broker>> = nodes.iter().map(|r| r.broker.clone()).collect();
    let appended = Arc::new(parking_lot::Mutex::new(vec![Vec::<(i32, i64)>::new(); 2]));
    let load = {
        let (stop, targets, appended) = (stop.clone(), targets.clone(), appended.clone());
        tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for (i, (topic, p)) in targets.iter().enumerate() {
                    let seq = appended.lock()[i].len() as i32 * 60;
                    for b in &brokers {
                        let image = b.image();
                        let t = image.topic_by_name(topic).unwrap().clone();
                        let Ok(route) = b.route(&image, &t, *p as i32) else {
                            continue;
                        };
                        let batch = make_idempotent_batch(60, 1, 7000 + i as i64, 0, seq);
                        if let Ok(offset) = b.append_durably(&route, *p, batch).await {
                            appended.lock()[i].push((seq, offset));
                            break;
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    common::eventually(
        "one busy unreplicated range moved to another broker",
        || {
            let primaries: Vec<_> = ranges.iter().map(|r| primary_of(*r)).collect();
            primaries.iter().all(Option::is_some) && primaries[0] != primaries[1]
        },
    )
    .await;
    let moved = if primary_of(ranges[0]) != Some(busy) {
        0
    } else {
        1
    };
    let new_primary = primary_of(ranges[moved]).unwrap();
    let at_move = appended.lock()[moved].len();
    common::eventually("the moved range takes appends on its new primary", || {
        appended.lock()[moved].len() >= at_move + 10
    })
    .await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    load.await.unwrap();
    let appended = appended.lock().clone();
    for (i, pairs) in appended.iter().enumerate() {
        let dense: Vec<(i32, i64)> = (0..pairs.len())
            .map(|k| (k as i32 * 60, 3 + k as i64 * 60))
            .collect();
        assert_eq!(
            pairs, &dense,
            "{:?}: each batch at the next offset",
            targets[i]
        );
    }
    let segments = nodes[0].broker.image().segments_of(ranges[moved]);
    assert!(
        segments.iter().filter(|s| s.replicas == [busy]).count() >= 2,
        "the history left behind spans segments: {segments:?}"
    );
    assert!(segments.iter().all(|s| s.replicas.len() == 1));

    let (topic, p) = targets[moved];
    let leader = leader_of(&nodes, topic, p).await;
    assert_eq!(leader.config().node_id, new_primary);
    let image = leader.image();
    let t = image.topic_by_name(topic).unwrap().clone();
    // Retries of batches from before the move: their original offsets.
    let route = leader.route(&image, &t, p as i32).unwrap();
    for k in 0..3 {
        let retry = make_idempotent_batch(1, 1, 8000 + moved as i64, 0, k);
        assert_eq!(
            leader.append_durably(&route, p, retry).await.unwrap(),
            k as i64,
            "a duplicate from before the move is known to the new primary"
        );
    }
    // Every record, the history on the old primary included.
    let records = leader.read_records(&t, p as i32).await.unwrap();
    let offsets: Vec<i64> = records.iter().map(|r| r.offset).collect();
    let all: Vec<i64> = (0..3 + appended[moved].len() as i64 * 60).collect();
    assert_eq!(offsets, all, "every record once, at its offset");

    // A split of the moved range spreads its children: the second moves
    // whole to a broker leading neither.
    let (left, right) = leader
        .split_range(ranges[moved], Some(p + 1))
        .await
        .unwrap();
    common::eventually(
        "the split's unreplicated children on different brokers",
        || {
            let image = nodes[0].broker.image();
            let [l, r] = [left, right].map(|r| image.active_segment(r).and_then(|s| s.primary()));
            l.is_some() && r.is_some() && l != r
        },
    )
    .await;
    let next = 3 + appended[moved].len() as i64 * 60;
    for q in [p, p + 1] {
        let expected = if q == p { next } else { 0 };
        assert_eq!(
            produce_to(&nodes, topic, q, 1).await,
            expected,
            "partition {q} goes on at its next offset"
        );
    }
    for r in nodes {
        r.shutdown().await;
    }
}

/// Unreplicated ranges piled on one broker (an operator's assignment)
/// spread at their next boundary by count: the broker holding the most
/// active segments hands whole ranges to those holding the fewest until
/// they are within one. Plain (non-idempotent) producers leave no producer
/// state, and the moved range still opens on its new broker (the seal
/// writes the empty history state it fetches). Offsets go on densely and
/// every record is read back through the new primaries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreplicated_ranges_piled_on_one_broker_spread_at_their_boundaries() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = start_cluster_with(
        dir.path(),
        3,
        &[
            ("replica.placement.rebalance.interval.ms", "500"),
            ("auto.leader.rebalance.enable", "false"),
        ],
    )
    .await;
    let topics = ["piled-0", "piled-1", "piled-2", "piled-3"];
    for name in topics {
        nodes[0]
            .broker
            .create_topic_assigned(
                NewTopic {
                    name: name.into(),
                    partitions: 1,
                    replication_factor: 1,
                    configs: BTreeMap::from([("segment.bytes".to_string(), "300".to_string())]),
                },
                Some(vec![vec![1]]),
                false,
            )
            .await
            .unwrap();
    }
    let ranges: Vec<u64> = topics.iter().map(|t| range_of(&nodes, t, 0)).collect();
    let primaries = || -> Vec<i32> {
        let image = nodes[0].broker.image();
        ranges
            .iter()
            .map(|r| {
                image
                    .active_segment(*r)
                    .and_then(|s| s.primary())
                    .unwrap_or(-1)
            })
            .collect()
    };
    // Records on broker 1 before anything moves (rolls included): the
    // re-placement waits a session before its first look.
    for t in topics {
        for i in 0..10 {
            assert_eq!(produce_to(&nodes, t, 0, i).await, i);
        }
    }
    common::eventually("the piled ranges spread over the three brokers", || {
        let p = primaries();
        (1..=3).all(|b| p.contains(&b))
    })
    .await;
    let p = primaries();
    assert_eq!(
        p.iter().filter(|b| **b == 1).count(),
        2,
        "within one: {p:?}"
    );
    for t in topics {
        for i in 10..15 {
            assert_eq!(produce_to(&nodes, t, 0, i).await, i, "{t}");
        }
        let leader = leader_of(&nodes, t, 0).await;
        let topic = leader.image().topic_by_name(t).unwrap().clone();
        let offsets: Vec<i64> = leader
            .read_records(&topic, 0)
            .await
            .unwrap()
            .iter()
            .map(|r| r.offset)
            .collect();
        assert_eq!(offsets, (0..15).collect::<Vec<i64>>(), "{t}");
    }
    for r in nodes {
        r.shutdown().await;
    }
}

/// A follower that joins a range at segment K (a re-placement after a
/// broker left) keeps the producer snapshot where K starts once K rolled
/// too: its copies start at K, and to lead later it needs `<K>.snapshot`.
/// Before, the prefetch looked at the active segment only: a follower
/// whose pass first saw the range after K rolled held K's copy, asked for
/// nothing, and waited to lead once the primary was gone (fault seed 15,
/// a 65 s stall). Here the fetched `<K>.snapshot` is removed after the
/// roll, which leaves the follower in that state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_keeps_the_producer_snapshot_where_its_copies_start() {
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = start_cluster_with(
        dir.path(),
        3,
        &[
            ("replica.placement.rebalance.interval.ms", "500"),
            ("auto.leader.rebalance.enable", "false"),
        ],
    )
    .await;
    let topic = "joined";
    nodes[0]
        .broker
        .create_topic_assigned(
            NewTopic {
                name: topic.into(),
                partitions: 1,
                replication_factor: 2,
                // Every append past the first of a segment rolls.
                configs: BTreeMap::from([("segment.bytes".to_string(), "14".to_string())]),
            },
            Some(vec![vec![1, 2]]),
            false,
        )
        .await
        .unwrap();
    let range = range_of(&nodes, topic, 0);
    let mut next = 0;
    for _ in 0..3 {
        assert_eq!(produce_to(&nodes, topic, 0, next).await, next);
        next += 1;
    }
    // Broker 2 leaves; broker 3 takes its place at the next boundary.
    nodes.remove(1).shutdown().await;
    let mut joined = None;
    common::eventually("broker 3 follows the range", || {
        let image = nodes[0].broker.image();
        joined = image
            .segments_of(range)
            .iter()
            .find(|s| s.replicas.contains(&3))
            .map(|s| s.id.seq);
        joined.is_some()
    })
    .await;
    let joined = joined.unwrap();
    assert!(
        joined > 0,
        "broker 3 joined after the range's first segment"
    );
    let follower = nodes[1].broker.clone();
    assert_eq!(follower.config().node_id, 3);
    let snapshot = || snapshot_file(dir.path(), 3, topic, range, joined);
    common::eventually("broker 3 prefetched the snapshot where it joined", || {
        snapshot().is_some_and(|p| p.exists())
    })
    .await;
    let snapshot = snapshot().unwrap();
    // The segment it joined at rolls (twice: a pass on broker 3 sees the
    // image after the file is gone whatever the order).
    let active = || {
        nodes[0]
            .broker
            .image()
            .active_segment(range)
            .unwrap()
            .id
            .seq
    };
    while active() <= joined {
        assert_eq!(produce_to(&nodes, topic, 0, next).await, next);
        next += 1;
    }
    std::fs::remove_file(&snapshot).unwrap();
    assert_eq!(produce_to(&nodes, topic, 0, next).await, next);
    common::eventually(
        "broker 3 fetched the snapshot where its copies start again",
        || snapshot.exists(),
    )
    .await;
    assert!(
        nodes[0]
            .broker
            .image()
            .active_segment(range)
            .unwrap()
            .replicas
            .contains(&3),
        "broker 3 still follows the range"
    );
    for r in nodes {
        r.shutdown().await;
    }
}

/// `<seq>.snapshot` of `range` of `topic` in node `node`'s data, once its
/// range directory exists (`.../<topic>-<id>/<range>/`).
fn snapshot_file(
    dir: &Path,
    node: usize,
    topic: &str,
    range: u64,
    seq: u32,
) -> Option<std::path::PathBuf> {
    fn topic_dir(dir: &Path, prefix: &str) -> Option<std::path::PathBuf> {
        for entry in std::fs::read_dir(dir).ok()?.flatten() {
            let path = entry.path();
            if !path.is_dir() {
                continue;
            }
            if entry.file_name().to_string_lossy().starts_with(prefix) {
                return Some(path);
            }
            if let Some(found) = topic_dir(&path, prefix) {
                return Some(found);
            }
        }
        None
    }
    let range_dir =
        topic_dir(&dir.join(format!("node-{node}")), &format!("{topic}-"))?.join(range.to_string());
    range_dir
        .is_dir()
        .then(|| tessera_log::producer_snapshot_file::snapshot_path(&range_dir, seq))
}

/// A primary's own segment roll is a placement decision. With the
/// controller's re-placement off, two RF=2 ranges on brokers 1 and 2 and
/// broker 3 holding none: the busy range's next segment opens at a roll
/// with its follower on broker 3, the same primary and leader epoch
/// (nothing sealed by quorum, nothing copied), appends after it are
/// acknowledged by the new set (a quorum of [1, 3] needs broker 3), and
/// every record is read back once at its offset. Before, a roll kept its
/// replica set for good and only the controller's seals moved followers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_roll_places_the_next_segment_on_the_broker_holding_fewest() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = start_cluster_with(
        dir.path(),
        3,
        &[
            ("replica.placement.rebalance.enable", "false"),
            ("auto.leader.rebalance.enable", "false"),
        ],
    )
    .await;
    // Every append past the first of a segment rolls "rolling".
    for (name, segment_bytes) in [("rolling", "14"), ("idle", "1048576")] {
        nodes[0]
            .broker
            .create_topic_assigned(
                NewTopic {
                    name: name.into(),
                    partitions: 1,
                    replication_factor: 2,
                    configs: BTreeMap::from([(
                        "segment.bytes".to_string(),
                        segment_bytes.to_string(),
                    )]),
                },
                Some(vec![vec![1, 2]]),
                false,
            )
            .await
            .unwrap();
    }
    let range = range_of(&nodes, "rolling", 0);
    let idle = range_of(&nodes, "idle", 0);
    let first = nodes[0].broker.image().active_segment(range).unwrap();
    assert_eq!(first.replicas, vec![1, 2]);
    let on_3 = || {
        nodes[0]
            .broker
            .image()
            .segments_of(range)
            .iter()
            .any(|s| s.replicas.contains(&3))
    };
    let mut next = 0;
    while !on_3() {
        assert!(next < 20, "no roll placed a segment on broker 3");
        assert_eq!(produce_to(&nodes, "rolling", 0, next).await, next);
        next += 1;
    }
    for _ in 0..6 {
        assert_eq!(produce_to(&nodes, "rolling", 0, next).await, next);
        next += 1;
    }
    let image = nodes[0].broker.image();
    let segments = image.segments_of(range);
    let placed = segments.iter().find(|s| s.replicas.contains(&3)).unwrap();
    assert_eq!(placed.replicas, vec![1, 3], "follower 2 swapped for 3");
    for s in &segments {
        assert_eq!(s.primary(), Some(1), "the primary stays");
        assert_eq!(
            s.leader_epoch, first.leader_epoch,
            "placed at a roll, not by a seal: {segments:?}"
        );
        if s.id.seq < placed.id.seq {
            assert_eq!(s.replicas, vec![1, 2], "written segments stay put");
        } else {
            assert_eq!(s.replicas, vec![1, 3], "balanced: no churn after");
        }
    }
    assert_eq!(
        image.active_segment(idle).unwrap().replicas,
        vec![1, 2],
        "a range that does not roll keeps its set"
    );
    assert_eq!(
        nodes[0]
            .broker
            .metrics()
            .roll_placements
            .load(std::sync::atomic::Ordering::Relaxed),
        1,
        "tessera_segment_roll_placements_total counts the one placement"
    );
    let leader = leader_of(&nodes, "rolling", 0).await;
    let t = image.topic_by_name("rolling").unwrap().clone();
    let offsets: Vec<i64> = leader
        .read_records(&t, 0)
        .await
        .unwrap()
        .iter()
        .map(|r| r.offset)
        .collect();
    assert_eq!(offsets, (0..next).collect::<Vec<_>>());
    for r in nodes {
        r.shutdown().await;
    }
}
