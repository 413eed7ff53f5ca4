//! KIP-848 consumer groups over the wire: ConsumerGroupHeartbeat and
//! ConsumerGroupDescribe against an in-process broker, with the classic
//! protocol and offsets sharing the group namespace.

use crate::common;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::consumer_group_heartbeat_request::TopicPartitions;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::{
    OffsetFetchRequestGroup, OffsetFetchRequestTopics,
};
use kafka_protocol::messages::{
    ConsumerGroupDescribeRequest, ConsumerGroupHeartbeatRequest, ConsumerGroupHeartbeatResponse,
    CreateTopicsRequest, DescribeGroupsRequest, FindCoordinatorRequest, GroupId, JoinGroupRequest,
    ListGroupsRequest, OffsetCommitRequest, OffsetFetchRequest, SyncGroupRequest, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use tempfile::TempDir;
use tessera_gateway::Running;
use uuid::Uuid;

const TOPIC: &str = "events";
const PARTITIONS: i32 = 6;

const NONE: i16 = 0;
const UNKNOWN_MEMBER_ID: i16 = 25;
const INCONSISTENT_GROUP_PROTOCOL: i16 = 23;
const INVALID_REQUEST: i16 = 42;
const GROUP_ID_NOT_FOUND: i16 = 69;
const MEMBER_ID_REQUIRED: i16 = 79;
const FENCED_MEMBER_EPOCH: i16 = 110;
const UNSUPPORTED_ASSIGNOR: i16 = 112;
const STALE_MEMBER_EPOCH: i16 = 113;

type Client = common::WireClient;

fn join(group: &str, member: &str) -> ConsumerGroupHeartbeatRequest {
    ConsumerGroupHeartbeatRequest::default()
        .with_group_id(GroupId(StrBytes::from_string(group.into())))
        .with_member_id(StrBytes::from_string(member.into()))
        .with_member_epoch(0)
        .with_rebalance_timeout_ms(30_000)
        .with_subscribed_topic_names(Some(vec![TopicName(StrBytes::from_static_str(TOPIC))]))
        .with_topic_partitions(Some(vec![]))
}

fn beat(
    group: &str,
    member: &str,
    epoch: i32,
    owned: Option<&[(Uuid, Vec<i32>)]>,
) -> ConsumerGroupHeartbeatRequest {
    ConsumerGroupHeartbeatRequest::default()
        .with_group_id(GroupId(StrBytes::from_string(group.into())))
        .with_member_id(StrBytes::from_string(member.into()))
        .with_member_epoch(epoch)
        .with_topic_partitions(owned.map(|o| {
            o.iter()
                .map(|(t, ps)| {
                    TopicPartitions::default()
                        .with_topic_id(*t)
                        .with_partitions(ps.clone())
                })
                .collect()
        }))
}

/// A full heartbeat (every field sent, as a client after an error): the
/// answer carries the member's assignment.
fn full_beat(
    group: &str,
    member: &str,
    epoch: i32,
    owned: &[(Uuid, Vec<i32>)],
) -> ConsumerGroupHeartbeatRequest {
    beat(group, member, epoch, Some(owned))
        .with_rebalance_timeout_ms(30_000)
        .with_subscribed_topic_names(Some(vec![TopicName(StrBytes::from_static_str(TOPIC))]))
}

fn assigned(r: &ConsumerGroupHeartbeatResponse) -> Option<Vec<(Uuid, Vec<i32>)>> {
    r.assignment.as_ref().map(|a| {
        a.topic_partitions
            .iter()
            .map(|tp| (tp.topic_id, tp.partitions.clone()))
            .collect()
    })
}

fn count(a: &[(Uuid, Vec<i32>)]) -> usize {
    a.iter().map(|(_, ps)| ps.len()).sum()
}

struct Fixture {
    running: Option<Running>,
    dir: TempDir,
    addr: SocketAddr,
    topic_id: Uuid,
}

impl Fixture {
    async fn new(extra: &[(&str, &str)]) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let running = tessera_gateway::start(common::test_config(dir.path(), extra))
            .await
            .expect("broker starts");
        let addr = running.kafka_addr;
        let mut c = Client::connect(addr).await;
        // FindCoordinator creates __consumer_offsets.
        let fc = c
            .call(
                4,
                &FindCoordinatorRequest::default()
                    .with_key_type(0)
                    .with_coordinator_keys(vec![StrBytes::from_static_str("g")]),
            )
            .await;
        assert_eq!(fc.coordinators[0].error_code, NONE, "{fc:?}");
        let ct = c
            .call(
                7,
                &CreateTopicsRequest::default()
                    .with_timeout_ms(30_000)
                    .with_topics(vec![CreatableTopic::default()
                        .with_name(TopicName(StrBytes::from_static_str(TOPIC)))
                        .with_num_partitions(PARTITIONS)
                        .with_replication_factor(1)]),
            )
            .await;
        assert_eq!(ct.topics[0].error_code, NONE, "{ct:?}");
        let topic_id = running.broker.image().topic_by_name(TOPIC).unwrap().id;
        Fixture {
            running: Some(running),
            dir,
            addr,
            topic_id,
        }
    }

    async fn client(&self) -> Client {
        Client::connect(self.addr).await
    }

    /// Stops the broker and starts it again on the same data directory.
    async fn restart(&mut self, extra: &[(&str, &str)]) {
        self.running.take().unwrap().shutdown().await;
        let running = tessera_gateway::start(common::test_config(self.dir.path(), extra))
            .await
            .expect("restarts");
        self.addr = running.kafka_addr;
        self.running = Some(running);
    }
}

async fn commit(
    c: &mut Client,
    group: &str,
    member: &str,
    epoch: i32,
    partition: i32,
    offset: i64,
) -> i16 {
    let r = c
        .call(
            9,
            &OffsetCommitRequest::default()
                .with_group_id(GroupId(StrBytes::from_string(group.into())))
                .with_generation_id_or_member_epoch(epoch)
                .with_member_id(StrBytes::from_string(member.into()))
                .with_topics(vec![OffsetCommitRequestTopic::default()
                    .with_name(TopicName(StrBytes::from_static_str(TOPIC)))
                    .with_partitions(vec![OffsetCommitRequestPartition::default()
                        .with_partition_index(partition)
                        .with_committed_offset(offset)])]),
        )
        .await;
    r.topics[0].partitions[0].error_code
}

async fn fetch_committed(
    c: &mut Client,
    group: &str,
    member: Option<(&str, i32)>,
    partition: i32,
) -> (i16, i64) {
    let r = c
        .call(
            9,
            &OffsetFetchRequest::default().with_groups(vec![OffsetFetchRequestGroup::default()
                .with_group_id(GroupId(StrBytes::from_string(group.into())))
                .with_member_id(member.map(|m| StrBytes::from_string(m.0.into())))
                .with_member_epoch(member.map_or(-1, |m| m.1))
                .with_topics(Some(vec![OffsetFetchRequestTopics::default()
                    .with_name(TopicName(StrBytes::from_static_str(TOPIC)))
                    .with_partition_indexes(vec![partition])]))]),
        )
        .await;
    let g = &r.groups[0];
    if g.error_code != NONE {
        return (g.error_code, -1);
    }
    (NONE, g.topics[0].partitions[0].committed_offset)
}

async fn classic_join(c: &mut Client, group: &str, member: &str) -> (i16, String, i32) {
    let r = c
        .call(
            6,
            &JoinGroupRequest::default()
                .with_group_id(GroupId(StrBytes::from_string(group.into())))
                .with_session_timeout_ms(30_000)
                .with_rebalance_timeout_ms(30_000)
                .with_member_id(StrBytes::from_string(member.into()))
                .with_protocol_type(StrBytes::from_static_str("consumer"))
                .with_protocols(vec![JoinGroupRequestProtocol::default()
                    .with_name(StrBytes::from_static_str("range"))
                    .with_metadata(Bytes::from_static(b"\x00\x00"))]),
        )
        .await;
    (r.error_code, r.member_id.to_string(), r.generation_id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn join_rebalance_describe_list_and_commit() {
    let f = Fixture::new(&[]).await;
    let t = f.topic_id;
    let mut c = f.client().await;

    // Validation happens before anything else.
    let r = c.call(1, &join("g", "")).await;
    assert_eq!(r.error_code, INVALID_REQUEST, "v1 needs a client member id");
    let r = c
        .call(
            1,
            &join("g", "m1").with_server_assignor(Some(StrBytes::from_static_str("sticky"))),
        )
        .await;
    assert_eq!(r.error_code, UNSUPPORTED_ASSIGNOR);
    // A member of a group that does not exist rejoins.
    let r = c.call(1, &beat("g", "m1", 3, None)).await;
    assert_eq!(r.error_code, UNKNOWN_MEMBER_ID);

    // m1 joins: everything, epoch 1.
    let r = c.call(1, &join("g", "m1")).await;
    assert_eq!(r.error_code, NONE, "{r:?}");
    assert_eq!(r.member_id.as_deref(), Some("m1"));
    assert_eq!(r.member_epoch, 1);
    assert_eq!(r.heartbeat_interval_ms, 5_000);
    let m1_all = assigned(&r).unwrap();
    assert_eq!(m1_all, vec![(t, (0..PARTITIONS).collect())]);

    // Version 0: the coordinator names the member.
    let r = c.call(0, &join("g", "")).await;
    assert_eq!(r.error_code, NONE, "{r:?}");
    let m2 = r.member_id.as_deref().unwrap().to_string();
    assert_eq!(r.member_epoch, 2);
    assert_eq!(assigned(&r), Some(vec![]), "m1 still holds everything");

    // m1 is asked to revoke half, keeping epoch 1.
    let r = c.call(1, &beat("g", "m1", 1, Some(&m1_all))).await;
    assert_eq!(r.member_epoch, 1);
    let m1_keep = assigned(&r).unwrap();
    assert_eq!(count(&m1_keep), 3);
    // A stale commit from m1 at epoch 2 is refused; at its epoch it works.
    assert_eq!(
        commit(&mut c, "g", "m1", 2, 0, 10).await,
        STALE_MEMBER_EPOCH
    );
    assert_eq!(commit(&mut c, "g", "m1", 1, 0, 10).await, NONE);
    assert_eq!(
        commit(&mut c, "g", "nobody", 1, 0, 10).await,
        UNKNOWN_MEMBER_ID
    );
    assert_eq!(
        fetch_committed(&mut c, "g", Some(("m1", 1)), 0).await,
        (NONE, 10)
    );
    assert_eq!(
        fetch_committed(&mut c, "g", Some(("m1", 7)), 0).await.0,
        STALE_MEMBER_EPOCH
    );
    assert_eq!(fetch_committed(&mut c, "g", None, 0).await, (NONE, 10));

    // m1 acknowledges, then m2 gets the released partitions.
    let r = c.call(1, &beat("g", "m1", 1, Some(&m1_keep))).await;
    assert_eq!(r.member_epoch, 2);
    let r = c.call(1, &beat("g", &m2, 2, Some(&[]))).await;
    let m2_got = assigned(&r).unwrap();
    assert_eq!(count(&m2_got), 3);
    let all: BTreeSet<i32> = m1_keep
        .iter()
        .chain(m2_got.iter())
        .flat_map(|(_, ps)| ps.iter().copied())
        .collect();
    assert_eq!(all, (0..PARTITIONS).collect());
    // An epoch from the future is fenced.
    let r = c.call(1, &beat("g", "m1", 9, None)).await;
    assert_eq!(r.error_code, FENCED_MEMBER_EPOCH);

    // ConsumerGroupDescribe, both versions.
    for version in [0, 1] {
        let d = c
            .call(
                version,
                &ConsumerGroupDescribeRequest::default().with_group_ids(vec![
                    GroupId(StrBytes::from_static_str("g")),
                    GroupId(StrBytes::from_static_str("missing")),
                ]),
            )
            .await;
        let g = &d.groups[0];
        assert_eq!(g.error_code, NONE, "{g:?}");
        assert_eq!(g.group_state.as_str(), "Stable");
        assert_eq!(g.group_epoch, 2);
        assert_eq!(g.assignment_epoch, 2);
        assert_eq!(g.assignor_name.as_str(), "uniform");
        assert_eq!(g.members.len(), 2);
        for m in &g.members {
            assert_eq!(m.member_epoch, 2);
            assert_eq!(m.client_id.as_str(), "wire-test");
            assert!(m.client_host.starts_with('/'), "{}", m.client_host.as_str());
            assert_eq!(m.assignment.topic_partitions.len(), 1);
            assert_eq!(m.assignment.topic_partitions[0].topic_name.as_str(), TOPIC);
            assert_eq!(m.assignment.topic_partitions[0].partitions.len(), 3);
            assert_eq!(m.assignment, m.target_assignment);
            if version >= 1 {
                assert_eq!(m.member_type, 1);
            }
        }
        assert_eq!(d.groups[1].error_code, GROUP_ID_NOT_FOUND);
    }

    // ListGroups v5: a consumer group.
    let l = c.call(5, &ListGroupsRequest::default()).await;
    let g = l
        .groups
        .iter()
        .find(|g| g.group_id.as_str() == "g")
        .expect("listed");
    assert_eq!(g.protocol_type.as_str(), "consumer");
    assert_eq!(g.group_state.as_str(), "Stable");
    assert_eq!(g.group_type.as_str(), "Consumer");
    let l = c
        .call(
            5,
            &ListGroupsRequest::default()
                .with_types_filter(vec![StrBytes::from_static_str("classic")]),
        )
        .await;
    assert!(l.groups.iter().all(|g| g.group_id.as_str() != "g"));

    // DescribeGroups describes classic groups: this one is "not a classic
    // group" (Dead; v6: GROUP_ID_NOT_FOUND).
    for (version, code) in [(5, NONE), (6, GROUP_ID_NOT_FOUND)] {
        let d = c
            .call(
                version,
                &DescribeGroupsRequest::default()
                    .with_groups(vec![GroupId(StrBytes::from_static_str("g"))]),
            )
            .await;
        assert_eq!(d.groups[0].error_code, code);
        assert_eq!(d.groups[0].group_state.as_str(), "Dead");
        assert!(d.groups[0].members.is_empty());
    }

    // The classic protocol cannot join a live consumer group.
    let (code, _, _) = classic_join(&mut c, "g", "").await;
    assert_eq!(code, INCONSISTENT_GROUP_PROTOCOL);

    // Both leave; the group is empty and keeps its offsets.
    let r = c.call(1, &beat("g", "m1", -1, None)).await;
    assert_eq!((r.error_code, r.member_epoch), (NONE, -1));
    let r = c.call(1, &beat("g", &m2, -1, None)).await;
    assert_eq!(r.error_code, NONE);
    let d = c
        .call(
            1,
            &ConsumerGroupDescribeRequest::default()
                .with_group_ids(vec![GroupId(StrBytes::from_static_str("g"))]),
        )
        .await;
    assert_eq!(d.groups[0].group_state.as_str(), "Empty");
    assert_eq!(fetch_committed(&mut c, "g", None, 0).await, (NONE, 10));
    // An empty consumer group can become a classic one again.
    let (code, _, _) = classic_join(&mut c, "g", "").await;
    assert_eq!(code, MEMBER_ID_REQUIRED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_classic_group_is_not_a_consumer_group() {
    let f = Fixture::new(&[("group.initial.rebalance.delay.ms", "0")]).await;
    let mut c = f.client().await;
    let (code, member, _) = classic_join(&mut c, "cg", "").await;
    assert_eq!(code, MEMBER_ID_REQUIRED);
    let (code, member, generation) = classic_join(&mut c, "cg", &member).await;
    assert_eq!(code, NONE);
    let s = c
        .call(
            5,
            &SyncGroupRequest::default()
                .with_group_id(GroupId(StrBytes::from_static_str("cg")))
                .with_generation_id(generation)
                .with_member_id(StrBytes::from_string(member.clone()))
                .with_protocol_type(Some(StrBytes::from_static_str("consumer")))
                .with_protocol_name(Some(StrBytes::from_static_str("range"))),
        )
        .await;
    assert_eq!(s.error_code, NONE);

    let r = c.call(1, &join("cg", "k1")).await;
    assert_eq!(r.error_code, GROUP_ID_NOT_FOUND, "{r:?}");
    assert!(r.error_message.unwrap().contains("not a consumer group"));
    let d = c
        .call(
            1,
            &ConsumerGroupDescribeRequest::default()
                .with_group_ids(vec![GroupId(StrBytes::from_static_str("cg"))]),
        )
        .await;
    assert_eq!(d.groups[0].error_code, GROUP_ID_NOT_FOUND);
    let l = c.call(5, &ListGroupsRequest::default()).await;
    let g = l
        .groups
        .iter()
        .find(|g| g.group_id.as_str() == "cg")
        .unwrap();
    assert_eq!(g.group_type.as_str(), "Classic");

    // A group that only holds offsets (simple, empty) becomes a consumer group.
    assert_eq!(commit(&mut c, "simple", "", -1, 1, 42).await, NONE);
    let r = c.call(1, &join("simple", "k1")).await;
    assert_eq!(r.error_code, NONE, "{r:?}");
    assert_eq!(
        fetch_committed(&mut c, "simple", Some(("k1", r.member_epoch)), 1).await,
        (NONE, 42)
    );
    // Commits from outside the group are refused while it has members.
    assert_eq!(
        commit(&mut c, "simple", "", -1, 1, 43).await,
        UNKNOWN_MEMBER_ID
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_members_expire_and_a_restart_keeps_the_group() {
    let extra = [
        ("group.consumer.session.timeout.ms", "1500"),
        ("group.consumer.heartbeat.interval.ms", "300"),
    ];
    let mut f = Fixture::new(&extra).await;
    let t = f.topic_id;
    let mut c = f.client().await;
    let r = c.call(1, &join("g", "a")).await;
    assert_eq!(r.heartbeat_interval_ms, 300);
    let a_all = assigned(&r).unwrap();
    let r = c.call(1, &join("g", "b")).await;
    assert_eq!(r.member_epoch, 2);
    // a revokes and acknowledges; b gets its half.
    let r = c.call(1, &beat("g", "a", 1, Some(&a_all))).await;
    let a_keep = assigned(&r).unwrap();
    c.call(1, &beat("g", "a", 1, Some(&a_keep))).await;
    let r = c.call(1, &beat("g", "b", 2, Some(&[]))).await;
    assert_eq!(count(&assigned(&r).unwrap()), 3);
    assert_eq!(commit(&mut c, "g", "a", 2, 0, 5).await, NONE);

    // b goes silent; a keeps heartbeating and takes everything once b's
    // session expires (the coordinator's timer fences it).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut owned = a_keep.clone();
    let mut epoch = 2;
    loop {
        let r = c.call(1, &beat("g", "a", epoch, Some(&owned))).await;
        assert_eq!(r.error_code, NONE, "{r:?}");
        epoch = r.member_epoch;
        if let Some(a) = assigned(&r) {
            owned = a;
        }
        if count(&owned) == PARTITIONS as usize {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "b never expired");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(epoch > 2);
    let r = c.call(1, &beat("g", "b", 2, Some(&[]))).await;
    assert_eq!(r.error_code, UNKNOWN_MEMBER_ID);
    assert_eq!(commit(&mut c, "g", "a", epoch, 1, 7).await, NONE);

    // The group is durable: after a restart the member carries on with its
    // epoch and assignment (no rejoin), offsets are there too.
    drop(c);
    f.restart(&extra).await;
    let mut c = f.client().await;
    let r = c.call(1, &beat("g", "a", epoch, Some(&owned))).await;
    assert_eq!(r.error_code, NONE, "{r:?}");
    assert_eq!(r.member_epoch, epoch);
    let r = c.call(1, &full_beat("g", "a", epoch, &owned)).await;
    assert_eq!(r.error_code, NONE, "{r:?}");
    assert_eq!(r.member_epoch, epoch);
    assert_eq!(assigned(&r).unwrap(), vec![(t, (0..PARTITIONS).collect())]);
    // b was fenced before the restart and stays gone.
    let r = c.call(1, &beat("g", "b", 2, Some(&[]))).await;
    assert_eq!(r.error_code, UNKNOWN_MEMBER_ID);
    assert_eq!(
        fetch_committed(&mut c, "g", Some(("a", epoch)), 0).await,
        (NONE, 5)
    );
    assert_eq!(
        fetch_committed(&mut c, "g", Some(("a", epoch)), 1).await,
        (NONE, 7)
    );
    // Session timers restart at load: a member silent after the restart is
    // fenced as before.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let d = describe(&mut c, "g").await;
        if d.members.is_empty() {
            assert_eq!(d.group_state.as_str(), "Empty");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "a never expired");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

async fn describe(
    c: &mut Client,
    group: &str,
) -> kafka_protocol::messages::consumer_group_describe_response::DescribedGroup {
    let d = c
        .call(
            1,
            &ConsumerGroupDescribeRequest::default()
                .with_group_ids(vec![GroupId(StrBytes::from_string(group.into()))]),
        )
        .await;
    assert_eq!(d.groups[0].error_code, NONE, "{d:?}");
    d.groups.into_iter().next().unwrap()
}

/// `(member id, epoch, assignment)` of a member.
type DescribedMember = (String, i32, Vec<(Uuid, Vec<i32>)>);

/// Every member, sorted.
fn members_of(
    d: &kafka_protocol::messages::consumer_group_describe_response::DescribedGroup,
) -> Vec<DescribedMember> {
    let mut out: Vec<_> = d
        .members
        .iter()
        .map(|m| {
            (
                m.member_id.to_string(),
                m.member_epoch,
                m.assignment
                    .topic_partitions
                    .iter()
                    .map(|tp| (tp.topic_id, tp.partitions.clone()))
                    .collect(),
            )
        })
        .collect();
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_two_member_group_survives_restarts() {
    let mut f = Fixture::new(&[]).await;
    let mut c = f.client().await;
    let r = c.call(1, &join("g2", "a")).await;
    let a_all = assigned(&r).unwrap();
    let r = c.call(1, &join("g2", "b")).await;
    assert_eq!(r.member_epoch, 2);
    let r = c.call(1, &beat("g2", "a", 1, Some(&a_all))).await;
    let a_keep = assigned(&r).unwrap();
    let r = c.call(1, &beat("g2", "a", 1, Some(&a_keep))).await;
    assert_eq!(r.member_epoch, 2);
    let r = c.call(1, &beat("g2", "b", 2, Some(&[]))).await;
    let b_got = assigned(&r).unwrap();
    assert_eq!(count(&b_got), 3);
    assert_eq!(commit(&mut c, "g2", "b", 2, 0, 11).await, NONE);
    let before = describe(&mut c, "g2").await;
    assert_eq!(before.group_state.as_str(), "Stable");
    assert_eq!(before.members.len(), 2);

    drop(c);
    f.restart(&[]).await;
    let mut c = f.client().await;
    let after = describe(&mut c, "g2").await;
    assert_eq!(after.group_state.as_str(), "Stable");
    assert_eq!(after.group_epoch, before.group_epoch);
    assert_eq!(after.assignment_epoch, before.assignment_epoch);
    assert_eq!(after.assignor_name, before.assignor_name);
    assert_eq!(members_of(&after), members_of(&before));

    // Both members carry on where they were: same epoch, same partitions.
    let r = c.call(1, &beat("g2", "a", 2, Some(&a_keep))).await;
    assert_eq!((r.error_code, r.member_epoch), (NONE, 2), "{r:?}");
    assert_eq!(assigned(&r), None);
    let r = c.call(1, &full_beat("g2", "b", 2, &b_got)).await;
    assert_eq!((r.error_code, r.member_epoch), (NONE, 2), "{r:?}");
    assert_eq!(assigned(&r).unwrap(), b_got);
    assert_eq!(
        fetch_committed(&mut c, "g2", Some(("b", 2)), 0).await,
        (NONE, 11)
    );
    assert_eq!(commit(&mut c, "g2", "a", 2, 1, 12).await, NONE);
    // A stale epoch is still fenced.
    let r = c.call(1, &beat("g2", "a", 5, Some(&a_keep))).await;
    assert_eq!(r.error_code, FENCED_MEMBER_EPOCH);

    // The group goes on from its stored epoch: b leaves, a takes it all.
    let r = c.call(1, &beat("g2", "b", -1, None)).await;
    assert_eq!(r.error_code, NONE, "{r:?}");
    let r = c.call(1, &beat("g2", "a", 2, Some(&a_keep))).await;
    assert_eq!(r.member_epoch, 3);
    assert_eq!(count(&assigned(&r).unwrap()), PARTITIONS as usize);
    let a_now = assigned(&r).unwrap();

    // The leave is durable too.
    drop(c);
    f.restart(&[]).await;
    let mut c = f.client().await;
    let d = describe(&mut c, "g2").await;
    assert_eq!(d.group_epoch, 3);
    assert_eq!(members_of(&d), vec![("a".to_string(), 3, a_now.clone())]);
    let r = c.call(1, &beat("g2", "b", 2, Some(&[]))).await;
    assert_eq!(r.error_code, UNKNOWN_MEMBER_ID);
    let r = c.call(1, &beat("g2", "a", 3, Some(&a_now))).await;
    assert_eq!((r.error_code, r.member_epoch), (NONE, 3), "{r:?}");
    assert_eq!(
        fetch_committed(&mut c, "g2", Some(("a", 3)), 1).await,
        (NONE, 12)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_offsets_survive_compaction_of_consumer_offsets() {
    // Small __consumer_offsets segments and a fast cleaner: hundreds of
    // commits of the same keys get compacted, and a restart replays the
    // compacted log to the last committed offsets.
    let extra = [
        ("offsets.topic.segment.bytes", "1024"),
        ("log.cleaner.backoff.ms", "100"),
    ];
    let mut f = Fixture::new(&extra).await;
    let mut c = f.client().await;
    for round in 0..100i64 {
        for p in 0..PARTITIONS {
            assert_eq!(
                commit(&mut c, "compacted-group", "", -1, p, round * 10 + p as i64).await,
                NONE
            );
        }
    }
    let broker = f.running.as_ref().unwrap().broker.clone();
    common::eventually("the cleaner compacted __consumer_offsets", || {
        broker
            .metrics()
            .cleaner_passes
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0
    })
    .await;
    drop(broker);
    drop(c);
    f.restart(&extra).await;
    let mut c = f.client().await;
    for p in 0..PARTITIONS {
        assert_eq!(
            fetch_committed(&mut c, "compacted-group", None, p).await,
            (NONE, 990 + p as i64)
        );
    }
}

async fn commit_to(c: &mut Client, group: &str, topic: &str, partition: i32, offset: i64) -> i16 {
    let r = c
        .call(
            9,
            &OffsetCommitRequest::default()
                .with_group_id(GroupId(StrBytes::from_string(group.into())))
                .with_generation_id_or_member_epoch(-1)
                .with_member_id(StrBytes::from_static_str(""))
                .with_topics(vec![OffsetCommitRequestTopic::default()
                    .with_name(TopicName(StrBytes::from_string(topic.into())))
                    .with_partitions(vec![OffsetCommitRequestPartition::default()
                        .with_partition_index(partition)
                        .with_committed_offset(offset)])]),
        )
        .await;
    r.topics[0].partitions[0].error_code
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offsets_of_deleted_topics_are_removed() {
    let extra = [("offsets.retention.check.interval.ms", "100")];
    let mut f = Fixture::new(&extra).await;
    let broker = f.running.as_ref().unwrap().broker.clone();
    broker
        .create_topic(
            tessera_gateway::broker::NewTopic {
                name: "doomed".into(),
                partitions: 2,
                replication_factor: 1,
                configs: Default::default(),
            },
            false,
        )
        .await
        .unwrap();
    let mut c = f.client().await;
    // "mixed" commits to both topics; "solo" only to the one deleted.
    for p in 0..2 {
        assert_eq!(commit_to(&mut c, "mixed", "doomed", p, 7).await, NONE);
        assert_eq!(commit_to(&mut c, "solo", "doomed", p, 8).await, NONE);
    }
    assert_eq!(commit_to(&mut c, "mixed", TOPIC, 0, 9).await, NONE);
    let id = broker.image().topic_by_name("doomed").unwrap().id;
    broker.delete_topic(id).await.unwrap();
    let mut gone = false;
    for _ in 0..300 {
        let mixed = broker.groups().committed("mixed").await.unwrap();
        if mixed.len() == 1 && broker.groups().committed("solo").await.is_none() {
            gone = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(
        gone,
        "the deleted topic's offsets are removed, and the group left with none"
    );
    assert_eq!(fetch_committed(&mut c, "mixed", None, 0).await, (NONE, 9));
    // The tombstones are durable: a restart replays them.
    drop(broker);
    drop(c);
    f.restart(&extra).await;
    let broker = f.running.as_ref().unwrap().broker.clone();
    let mixed = broker.groups().committed("mixed").await.unwrap();
    assert_eq!(mixed.len(), 1);
    assert!(mixed.get(TOPIC, 0).is_some());
    assert!(broker.groups().committed("solo").await.is_none());
}
