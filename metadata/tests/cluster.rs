//! Controller quorums of 3 and 5 voters over real TCP on 127.0.0.1.
//!
//! Waits are generous (elections take a second or two; the machine may be
//! loaded): every wait polls until its condition holds or a minute passes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tempfile::TempDir;
use tessera_metadata::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

const PATIENCE: Duration = Duration::from_secs(60);

fn tid(n: u128) -> TopicId {
    uuid::Uuid::from_u128(n)
}

fn topic(id: u128, name: &str) -> MetadataRecord {
    MetadataRecord::CreateTopic(TopicRecord {
        topic_id: tid(id),
        name: name.into(),
        partitions: 3,
        replication_factor: 1,
        configs: BTreeMap::new(),
    })
}

/// Polls `f` until it returns `Some` (panics after [`PATIENCE`]).
async fn eventually<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(t) = f() {
            return t;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Free loopback ports (bound once by the OS, then released).
fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<_> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect()
}

async fn start_node(cfg: ControllerConfig) -> Controller {
    let mut attempt = 0;
    loop {
        match Controller::start(cfg.clone()).await {
            Ok(c) => return c,
            // The port may be briefly taken by some other socket: retry.
            Err(MetadataError::Io { context, source }) if attempt < 30 => {
                eprintln!("node {}: {context}: {source}; retrying", cfg.node_id);
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("node {} did not start: {e}", cfg.node_id),
        }
    }
}

struct Cluster {
    dirs: Vec<TempDir>,
    voters: BTreeMap<u64, String>,
    nodes: Vec<Option<Arc<Controller>>>,
    snapshot_interval_entries: u64,
}

impl Cluster {
    fn new(n: usize, snapshot_interval_entries: u64) -> Cluster {
        let voters = free_ports(n)
            .into_iter()
            .enumerate()
            .map(|(i, p)| (i as u64 + 1, format!("127.0.0.1:{p}")))
            .collect();
        Cluster {
            dirs: (0..n).map(|_| tempfile::tempdir().unwrap()).collect(),
            voters,
            nodes: (0..n).map(|_| None).collect(),
            snapshot_interval_entries,
        }
    }

    fn ids(&self) -> Vec<u64> {
        self.voters.keys().copied().collect()
    }

    fn cfg(&self, id: u64) -> ControllerConfig {
        ControllerConfig {
            snapshot_interval_entries: self.snapshot_interval_entries,
            ..ControllerConfig::new(id, self.dirs[id as usize - 1].path())
        }
        .with_voters(self.voters.clone())
    }

    /// Starts every voter at once (a start returns only with a quorum).
    async fn start_all(&mut self) {
        let tasks: Vec<_> = self
            .ids()
            .into_iter()
            .map(|id| (id, tokio::spawn(start_node(self.cfg(id)))))
            .collect();
        for (id, t) in tasks {
            self.nodes[id as usize - 1] = Some(Arc::new(t.await.unwrap()));
        }
    }

    async fn start(&mut self, id: u64) {
        let c = start_node(self.cfg(id)).await;
        self.nodes[id as usize - 1] = Some(Arc::new(c));
    }

    async fn stop(&mut self, id: u64) {
        let c = self.nodes[id as usize - 1].take().expect("running");
        c.shutdown().await;
    }

    async fn stop_all(&mut self) {
        for id in self.ids() {
            if self.nodes[id as usize - 1].is_some() {
                self.stop(id).await;
            }
        }
    }

    fn node(&self, id: u64) -> &Arc<Controller> {
        self.nodes[id as usize - 1].as_ref().expect("running")
    }

    fn running(&self) -> Vec<u64> {
        self.ids()
            .into_iter()
            .filter(|id| self.nodes[*id as usize - 1].is_some())
            .collect()
    }

    /// Waits until every running node names the same leader, which is one
    /// of them and the only one that considers itself leader.
    async fn wait_leader(&self) -> u64 {
        let running = self.running();
        eventually("one agreed leader", || {
            let first = self.node(running[0]).leader()?.node_id;
            let agreed = running
                .iter()
                .all(|id| self.node(*id).leader().map(|l| l.node_id) == Some(first));
            let leaders: Vec<_> = running
                .iter()
                .filter(|id| self.node(**id).is_leader())
                .collect();
            (agreed && leaders == vec![&first]).then_some(first)
        })
        .await
    }

    /// Waits until every running node's image is at `offset` or later and
    /// all are equal; returns that image.
    async fn wait_converged(&self, offset: i64) -> Arc<MetadataImage> {
        let running = self.running();
        eventually("equal images on every running node", || {
            let images: Vec<_> = running.iter().map(|id| self.node(*id).image()).collect();
            (images[0].offset >= offset && images.iter().all(|i| *i == images[0]))
                .then(|| images[0].clone())
        })
        .await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_voters_elect_one_leader_and_replicate() {
    let mut c = Cluster::new(3, 1000);
    c.start_all().await;
    let leader = c.wait_leader().await;
    let off = c
        .node(leader)
        .write(vec![topic(1, "orders")])
        .await
        .unwrap();
    assert_eq!(c.node(leader).image().offset, off);
    let img = c.wait_converged(off).await;
    assert!(img.topic_by_name("orders").is_some());
    for id in c.ids() {
        assert_eq!(c.node(id).image(), img);
        assert!(!c.node(id).is_failed());
    }
    c.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leader_failover_then_the_old_leader_catches_up() {
    let mut c = Cluster::new(3, 1000);
    c.start_all().await;
    let old = c.wait_leader().await;
    let off = c.node(old).write(vec![topic(1, "a")]).await.unwrap();
    c.wait_converged(off).await;

    c.stop(old).await;
    let new = c.wait_leader().await;
    assert_ne!(new, old);
    // Writes continue, on the new leader and (forwarded) on the other voter.
    let other = *c.running().iter().find(|id| **id != new).unwrap();
    c.node(new).write(vec![topic(2, "b")]).await.unwrap();
    let off = c.node(other).write(vec![topic(3, "c")]).await.unwrap();
    let img = c.wait_converged(off).await;
    assert!(img.topic_by_name("b").is_some() && img.topic_by_name("c").is_some());

    // The old leader restarts on its data directory and catches up before
    // start returns.
    c.start(old).await;
    let restarted = c.node(old).image();
    assert!(restarted.offset >= off, "{} < {off}", restarted.offset);
    assert!(restarted.topic_by_name("c").is_some());
    let leader = c.wait_leader().await;
    let off = c.node(old).write(vec![topic(4, "d")]).await.unwrap();
    let img = c.wait_converged(off).await;
    assert_eq!(img.topics.len(), 4);
    assert_eq!(c.node(leader).image(), img);
    c.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_voter_behind_the_purged_log_catches_up_from_a_snapshot() {
    let mut c = Cluster::new(3, 5);
    c.start_all().await;
    let leader = c.wait_leader().await;
    let off = c.node(leader).write(vec![topic(1, "t1")]).await.unwrap();
    c.wait_converged(off).await;
    let lagger = *c.running().iter().find(|id| **id != leader).unwrap();
    let lagger_last = c
        .node(lagger)
        .raft()
        .metrics()
        .borrow()
        .last_log_index
        .unwrap();
    c.stop(lagger).await;

    for n in 2..50u128 {
        c.node(leader)
            .write(vec![topic(n, &format!("t{n}"))])
            .await
            .unwrap();
    }
    // The leader has purged its log well past the lagger's last entry.
    let purged = eventually("the leader to purge past the stopped voter", || {
        let p = c.node(leader).raft().metrics().borrow().purged?.index;
        (p > lagger_last + 5).then_some(p)
    })
    .await;

    c.start(lagger).await;
    let img = c.node(leader).image();
    assert_eq!(c.node(lagger).image(), img, "caught up when start returned");
    assert_eq!(img.topics.len(), 49);
    // The entries it missed were gone from every log: it installed a
    // snapshot (and keeps it on disk).
    let snap = c.node(lagger).raft().metrics().borrow().snapshot.unwrap();
    assert!(snap.index > lagger_last, "snapshot {snap} vs {lagger_last}");
    assert!(purged > lagger_last);
    // It keeps following, and restarts from its own snapshot.
    let off = c.node(leader).write(vec![topic(50, "t50")]).await.unwrap();
    c.wait_converged(off).await;
    c.stop(lagger).await;
    c.start(lagger).await;
    let img = c.wait_converged(off).await;
    assert_eq!(img.topics.len(), 50);
    c.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn follower_writes_are_forwarded_and_write_on_leader_names_the_leader() {
    let mut c = Cluster::new(3, 1000);
    c.start_all().await;
    let leader = c.wait_leader().await;
    let follower = *c.running().iter().find(|id| **id != leader).unwrap();
    let f = c.node(follower).clone();
    let expected = ControllerLeader {
        node_id: leader,
        address: Some(c.voters[&leader].clone()),
    };
    assert!(!f.is_leader());
    assert_eq!(f.leader(), Some(expected.clone()));

    let err = f
        .write_on_leader(vec![topic(1, "orders")])
        .await
        .unwrap_err();
    match &err {
        MetadataError::NotLeader { leader: Some(l) } => assert_eq!(*l, expected),
        other => panic!("{other}"),
    }
    assert!(err.to_string().contains(&c.voters[&leader]), "{err}");
    assert!(f.image().topic_by_name("orders").is_none());

    // `write` forwards, and returns once the entry is applied here too.
    let off = f.write(vec![topic(1, "orders")]).await.unwrap();
    let img = f.image();
    assert!(img.offset >= off);
    assert!(img.topic_by_name("orders").is_some());
    let out = f
        .write_detailed(vec![topic(2, "orders"), topic(3, "other")])
        .await
        .unwrap();
    assert_eq!(out.skipped, vec![0]);
    assert!(f.image().topic_by_name("other").is_some());
    // Invalid records are refused before anything is sent.
    let mut empty = topic(4, "x");
    if let MetadataRecord::CreateTopic(t) = &mut empty {
        t.partitions = 0;
    }
    assert!(matches!(
        f.write(vec![MetadataRecord::NoOp, empty]).await,
        Err(MetadataError::InvalidRecord { index: 1, .. })
    ));
    // A follower can also wait for a linearizable read point.
    let img = f.catch_up().await.unwrap();
    assert!(img.offset >= out.offset);
    c.wait_converged(out.offset).await;
    c.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn five_voters_survive_two_shutdowns() {
    let mut c = Cluster::new(5, 1000);
    c.start_all().await;
    let leader = c.wait_leader().await;
    let off = c.node(leader).write(vec![topic(1, "a")]).await.unwrap();
    c.wait_converged(off).await;

    let follower = *c.running().iter().find(|id| **id != leader).unwrap();
    c.stop(follower).await;
    c.stop(leader).await;
    let new = c.wait_leader().await;
    assert!(new != leader && new != follower);
    let mut last = 0;
    for (i, id) in c.running().into_iter().enumerate() {
        last = c
            .node(id)
            .write(vec![topic(10 + i as u128, &format!("n{id}"))])
            .await
            .unwrap();
    }
    let img = c.wait_converged(last).await;
    assert_eq!(img.topics.len(), 4);
    c.stop_all().await;
}

/// Sends `bytes` on a fresh connection to `addr`, half-closes, and checks
/// that the node closes the connection without answering.
async fn send_garbage(addr: &str, bytes: &[u8]) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    // The node may close before reading everything (e.g. an oversized
    // length): a failed write is fine.
    let _ = s.write_all(bytes).await;
    let _ = s.shutdown().await;
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut buf)).await;
    match read {
        Ok(Ok(_)) => assert!(buf.is_empty(), "answered garbage with {buf:?}"),
        Ok(Err(_)) => {} // reset
        Err(_) => panic!("connection not closed after garbage"),
    }
}

fn frame(payload: &[u8]) -> Vec<u8> {
    let mut f = (payload.len() as u32).to_be_bytes().to_vec();
    f.extend_from_slice(payload);
    f
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn garbage_on_the_controller_port_does_not_crash_the_node() {
    let mut c = Cluster::new(3, 1000);
    c.start_all().await;
    c.wait_leader().await;

    let mut noise = Vec::new();
    let mut x: u32 = 0x1234_5678;
    for _ in 0..4096 {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        noise.push(x as u8);
    }
    let header = |kind: u8, to: u64| {
        let mut p = vec![network::PROTOCOL_VERSION, kind];
        p.extend_from_slice(&9u64.to_be_bytes());
        p.extend_from_slice(&to.to_be_bytes());
        p
    };
    for id in c.ids() {
        let addr = c.voters[&id].clone();
        // An HTTP request: its first bytes read as a ~1 GB length.
        send_garbage(&addr, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
        send_garbage(&addr, &noise).await;
        send_garbage(&addr, &[0xff, 0xff, 0xff, 0xff]).await;
        send_garbage(&addr, &((64u32 << 20) + 1).to_be_bytes()).await;
        send_garbage(&addr, &frame(&[9, 9, 9, 9])).await; // unknown version
        send_garbage(&addr, &frame(&header(77, id))).await; // unknown kind
                                                            // AppendEntries with a truncated body, and with JSON garbage.
        send_garbage(&addr, &frame(&header(1, id))).await;
        let mut p = header(1, id);
        p.extend_from_slice(&5u32.to_be_bytes());
        p.extend_from_slice(b"{{{{{");
        send_garbage(&addr, &frame(&p)).await;
        // A write forwarded with a record count far beyond the frame.
        let mut p = header(4, id);
        p.extend_from_slice(&u32::MAX.to_be_bytes());
        send_garbage(&addr, &frame(&p)).await;
        // A well-formed request for another node id.
        send_garbage(&addr, &frame(&header(5, id + 100))).await;
        // A frame that promises more than it sends.
        send_garbage(&addr, &[0, 0, 3, 232, 1, 2, 3]).await;
        send_garbage(&addr, &[]).await;
    }

    // A forwarded write of bytes that are not a record is refused by the
    // leader (it would stop every controller once committed).
    let leader = c.wait_leader().await;
    let mut p = header(4, leader);
    p.extend_from_slice(&1u32.to_be_bytes());
    p.extend_from_slice(&4u32.to_be_bytes());
    p.extend_from_slice(&[0, 99, 0, 0]);
    let mut s = TcpStream::connect(&c.voters[&leader]).await.unwrap();
    s.write_all(&frame(&p)).await.unwrap();
    let mut len = [0u8; 4];
    s.read_exact(&mut len).await.unwrap();
    let mut reply = vec![0u8; u32::from_be_bytes(len) as usize];
    s.read_exact(&mut reply).await.unwrap();
    assert_eq!(reply[..2], [network::PROTOCOL_VERSION, 1], "an error reply");

    // Every node still serves: writes through each of them apply everywhere.
    let mut last = 0;
    for id in c.ids() {
        assert!(!c.node(id).is_failed());
        last = c
            .node(id)
            .write(vec![topic(id as u128, &format!("t{id}"))])
            .await
            .unwrap();
    }
    let img = c.wait_converged(last).await;
    assert_eq!(img.topics.len(), 3);
    c.stop_all().await;
}

#[tokio::test]
async fn a_different_voter_set_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let single = Controller::start(ControllerConfig::new(1, dir.path()))
        .await
        .unwrap();
    single.write(vec![topic(1, "a")]).await.unwrap();
    single.shutdown().await;

    let ports = free_ports(3);
    let voters: BTreeMap<u64, String> = (1..=3)
        .map(|id| (id, format!("127.0.0.1:{}", ports[id as usize - 1])))
        .collect();
    let err = Controller::start(ControllerConfig::new(1, dir.path()).with_voters(voters.clone()))
        .await
        .unwrap_err();
    assert!(matches!(err, MetadataError::Config(_)), "{err}");
    // The directory was released and is usable as it was configured.
    let single = Controller::start(ControllerConfig::new(1, dir.path()))
        .await
        .unwrap();
    assert!(single.image().topic_by_name("a").is_some());
    assert!(single.is_leader());
    assert_eq!(single.leader().unwrap().node_id, 1);
    single.shutdown().await;

    let other = tempfile::tempdir().unwrap();
    let err = Controller::start(ControllerConfig::new(4, other.path()).with_voters(voters))
        .await
        .unwrap_err();
    assert!(matches!(err, MetadataError::Config(_)), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_voter_without_a_quorum_times_out_and_releases_its_directory() {
    let mut c = Cluster::new(3, 1000);
    let cfg = ControllerConfig {
        start_timeout: Duration::from_secs(3),
        ..c.cfg(1)
    };
    let err = Controller::start(cfg).await.unwrap_err();
    assert!(matches!(err, MetadataError::StartTimeout), "{err}");
    // Directory and port were released: the same node joins a full quorum.
    c.start_all().await;
    let leader = c.wait_leader().await;
    let off = c.node(leader).write(vec![topic(1, "a")]).await.unwrap();
    c.wait_converged(off).await;
    c.stop_all().await;
}

/// The gateway shares the controller across tasks and awaits its calls
/// inside spawned tasks.
#[allow(dead_code)]
fn controller_and_its_futures_are_send(c: &'static Controller) {
    fn send<T: Send + Sync + 'static>(_: &T) {}
    fn send_fut<T: Send>(_: T) {}
    send(c);
    send_fut(c.write(vec![]));
    send_fut(c.write_detailed(vec![]));
    send_fut(c.write_on_leader(vec![]));
    send_fut(c.catch_up());
    send_fut(c.shutdown());
    send_fut(Controller::start(ControllerConfig::new(1, "/nonexistent")));
}

#[test]
fn voters_parse_kafka_syntax() {
    let v =
        ControllerConfig::parse_voters("1@127.0.0.1:9093, 2@localhost:9094,3@[::1]:9095").unwrap();
    assert_eq!(v[&1], "127.0.0.1:9093");
    assert_eq!(v[&2], "localhost:9094");
    assert_eq!(v[&3], "[::1]:9095");
    for bad in [
        "",
        "1@",
        "x@h:1",
        "1@h",
        "1@h:99999",
        "1@h:1,1@h:2",
        "1:h:1",
    ] {
        assert!(
            matches!(
                ControllerConfig::parse_voters(bad),
                Err(MetadataError::Config(_))
            ),
            "{bad:?}"
        );
    }
}

/// A quorum of one voter (a controller-only node with broker-only nodes):
/// a learner's writes are forwarded to it as well.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_learner_of_a_single_voter_forwards_its_writes() {
    let mut c = Cluster::new(1, 1000);
    c.start_all().await;
    let leader = c.wait_leader().await;
    let dir = tempfile::tempdir().unwrap();
    let learner = start_node(
        ControllerConfig::new(2, dir.path())
            .with_voters(c.voters.clone())
            .as_learner("127.0.0.1:0"),
    )
    .await;
    let off = learner.write(vec![topic(1, "from-learner")]).await.unwrap();
    assert!(learner.image().offset >= off);
    let img = c.wait_converged(off).await;
    assert!(img.topic_by_name("from-learner").is_some());
    assert_eq!(c.node(leader).image().offset, img.offset);
}

/// A broker-only node (Kafka's `process.roles=broker`) follows the
/// metadata log as an openraft learner: it is added by the leader when it
/// asks, sees every committed entry, forwards its writes, never votes (the
/// quorum still needs 2 of the 3 voters), comes back on another port after
/// a restart (the leader updates its address), and a learner claiming a
/// voter's id is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_learner_follows_the_log_forwards_writes_and_rejoins_at_a_new_address() {
    let mut c = Cluster::new(3, 1000);
    c.start_all().await;
    let leader = c.wait_leader().await;
    let before = c
        .node(leader)
        .write(vec![topic(1, "before")])
        .await
        .unwrap();

    let dir = tempfile::tempdir().unwrap();
    let learner_cfg = || {
        ControllerConfig::new(4, dir.path())
            .with_voters(c.voters.clone())
            .as_learner("127.0.0.1:0")
    };
    let learner = start_node(learner_cfg()).await;
    // start() returns caught up with everything committed before.
    assert!(learner.image().offset >= before);
    assert!(learner.image().topic_by_name("before").is_some());
    assert!(!learner.is_leader());
    let members = |node: &Controller| {
        let m = node.raft().metrics().borrow().membership_config.clone();
        let voters: Vec<u64> = m.membership().voter_ids().collect();
        let learners: Vec<u64> = m.membership().learner_ids().collect();
        (voters, learners)
    };
    assert_eq!(members(c.node(leader)), (vec![1, 2, 3], vec![4]));

    // A write on the learner is forwarded to the leader.
    let off = learner.write(vec![topic(2, "from-learner")]).await.unwrap();
    let img = c.wait_converged(off).await;
    assert!(img.topic_by_name("from-learner").is_some());
    eventually("the learner applies its own write", || {
        (learner.image().offset >= off).then_some(())
    })
    .await;

    // Restart on a new port: the leader replicates to the new address.
    learner.shutdown().await;
    let off = c
        .node(leader)
        .write(vec![topic(3, "while-away")])
        .await
        .unwrap();
    let learner = start_node(learner_cfg()).await;
    assert!(learner.image().topic_by_name("while-away").is_some());
    let off2 = c.node(leader).write(vec![topic(4, "after")]).await.unwrap();
    assert!(off2 > off);
    eventually("the restarted learner follows new entries", || {
        learner.image().topic_by_name("after").map(|_| ())
    })
    .await;

    // One voter down: 2 of 3 voters still commit (the learner is not a
    // voter, so it neither helps nor hinders the quorum).
    let other = c.ids().into_iter().find(|id| *id != leader).unwrap();
    c.stop(other).await;
    let leader = c.wait_leader().await;
    let off = c
        .node(leader)
        .write(vec![topic(5, "two-voters")])
        .await
        .unwrap();
    eventually("the learner sees the write of two voters", || {
        (learner.image().offset >= off).then_some(())
    })
    .await;
    c.start(other).await;

    // A learner with a voter's id is refused at start.
    let dir2 = tempfile::tempdir().unwrap();
    let bad = ControllerConfig::new(2, dir2.path())
        .with_voters(c.voters.clone())
        .as_learner("127.0.0.1:0");
    assert!(matches!(
        Controller::start(bad).await,
        Err(MetadataError::Config(_))
    ));

    learner.shutdown().await;
    c.stop_all().await;
}

/// UnregisterBroker's second half: a learner that left for good is removed
/// from the raft membership by the leader, asked from a follower (forwarded
/// over the transport, RemoveLearner) or on the leader itself; a second
/// removal finds nothing to do, and a voter's id is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_learner_that_left_is_removed_from_the_membership() {
    let mut c = Cluster::new(3, 1000);
    c.start_all().await;
    let leader = c.wait_leader().await;
    let dir = tempfile::tempdir().unwrap();
    let learner = start_node(
        ControllerConfig::new(4, dir.path())
            .with_voters(c.voters.clone())
            .as_learner("127.0.0.1:0"),
    )
    .await;
    let learners = |node: &Controller| -> Vec<u64> {
        let m = node.raft().metrics().borrow().membership_config.clone();
        m.membership().learner_ids().collect()
    };
    assert_eq!(learners(c.node(leader)), vec![4]);
    learner.shutdown().await;

    let follower = c.ids().into_iter().find(|id| *id != leader).unwrap();
    assert!(c.node(follower).is_voter(leader));
    assert!(!c.node(follower).is_voter(4));
    assert!(c.node(follower).remove_learner(4).await.unwrap());
    eventually("the leader no longer lists learner 4", || {
        learners(c.node(leader)).is_empty().then_some(())
    })
    .await;
    assert!(!c.node(leader).remove_learner(4).await.unwrap());
    assert!(matches!(
        c.node(follower).remove_learner(leader).await,
        Err(MetadataError::Config(_))
    ));
    // The quorum still commits.
    c.node(leader).write(vec![topic(1, "after")]).await.unwrap();
    c.stop_all().await;
}

/// The read lease a broker's coordinators rely on: no node's image is
/// vouched for before it renews; a renewal on the leader and on a follower
/// (through the leader's read index) vouches for the lease's length only; a
/// voter left without a quorum cannot renew, so its lease runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_read_lease_needs_a_quorum_and_runs_out() {
    let mut c = Cluster::new(3, 1000);
    c.start_all().await;
    let leader = c.wait_leader().await;
    let follower = *c.running().iter().find(|id| **id != leader).unwrap();
    let lease = Duration::from_secs(3600);
    for id in [leader, follower] {
        assert!(
            !c.node(id).image_is_fresh(lease),
            "node {id} fresh before renewing"
        );
        c.node(id)
            .renew_read_lease(Duration::from_secs(10))
            .await
            .unwrap();
        assert!(c.node(id).image_is_fresh(lease), "node {id} renewed");
        assert!(
            !c.node(id).image_is_fresh(Duration::ZERO),
            "node {id}: a lease runs out"
        );
    }
    // Alone, the follower cannot confirm a read point.
    let others: Vec<u64> = c
        .running()
        .into_iter()
        .filter(|id| *id != follower)
        .collect();
    for id in others {
        c.stop(id).await;
    }
    assert!(c
        .node(follower)
        .renew_read_lease(Duration::from_secs(2))
        .await
        .is_err());
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!c.node(follower).image_is_fresh(Duration::from_millis(50)));
    c.stop_all().await;
}
