//! The group APIs over the wire, at every version the broker advertises:
//! each request is encoded by `kafka-protocol` exactly as a client of that
//! version would, and each response must decode in that version with the
//! fields Kafka would send. A response field set outside its version makes
//! the broker close the connection, which these tests catch.

use crate::common;

use bytes::Bytes;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::leave_group_request::MemberIdentity;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_delete_request::{
    OffsetDeleteRequestPartition, OffsetDeleteRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::{
    OffsetFetchRequestGroup, OffsetFetchRequestTopic, OffsetFetchRequestTopics,
};
use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

const TOPIC: &str = "t";

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn group(v: &str) -> GroupId {
    GroupId(s(v))
}

fn topic(v: &str) -> TopicName {
    TopicName(s(v))
}

type Client = common::WireClient;

async fn start(dir: &std::path::Path) -> tessera_gateway::Running {
    let config = common::test_config(
        dir,
        &[
            ("group.initial.rebalance.delay.ms", "0"),
            ("group.min.session.timeout.ms", "1000"),
        ],
    );
    tessera_gateway::start(config).await.expect("broker starts")
}

async fn create_topic(c: &mut Client) {
    let r = c
        .call(
            7,
            &CreateTopicsRequest::default()
                .with_topics(vec![CreatableTopic::default()
                    .with_name(topic(TOPIC))
                    .with_num_partitions(2)
                    .with_replication_factor(1)])
                .with_timeout_ms(10_000),
        )
        .await;
    assert_eq!(r.topics[0].error_code, 0);
}

fn commit_request(group_id: &str, generation: i32, member: &str) -> OffsetCommitRequest {
    OffsetCommitRequest::default()
        .with_group_id(group(group_id))
        .with_generation_id_or_member_epoch(generation)
        .with_member_id(s(member))
        .with_topics(vec![
            OffsetCommitRequestTopic::default()
                .with_name(topic(TOPIC))
                .with_partitions(vec![
                    OffsetCommitRequestPartition::default()
                        .with_partition_index(0)
                        .with_committed_offset(42)
                        .with_committed_leader_epoch(3)
                        .with_committed_metadata(Some(s("m"))),
                    OffsetCommitRequestPartition::default()
                        .with_partition_index(9)
                        .with_committed_offset(1),
                ]),
            OffsetCommitRequestTopic::default()
                .with_name(topic("nope"))
                .with_partitions(vec![OffsetCommitRequestPartition::default()
                    .with_partition_index(0)
                    .with_committed_offset(1)]),
        ])
}

/// Fetches partitions 0 and 1 of TOPIC: `(offset, metadata, epoch)` each.
async fn fetch_offsets(c: &mut Client, version: i16, group_id: &str) -> Vec<(i64, String, i32)> {
    if version >= 8 {
        let r = c
            .call(
                version,
                &OffsetFetchRequest::default()
                    .with_groups(vec![OffsetFetchRequestGroup::default()
                        .with_group_id(group(group_id))
                        .with_topics(Some(vec![OffsetFetchRequestTopics::default()
                            .with_name(topic(TOPIC))
                            .with_partition_indexes(vec![0, 1])]))])
                    .with_require_stable(true),
            )
            .await;
        assert_eq!(r.groups[0].error_code, 0);
        r.groups[0].topics[0]
            .partitions
            .iter()
            .map(|p| {
                assert_eq!(p.error_code, 0);
                (
                    p.committed_offset,
                    p.metadata
                        .as_ref()
                        .map(|m| m.to_string())
                        .unwrap_or_default(),
                    p.committed_leader_epoch,
                )
            })
            .collect()
    } else {
        let r = c
            .call(
                version,
                &OffsetFetchRequest::default()
                    .with_group_id(group(group_id))
                    .with_topics(Some(vec![OffsetFetchRequestTopic::default()
                        .with_name(topic(TOPIC))
                        .with_partition_indexes(vec![0, 1])]))
                    .with_require_stable(version >= 7),
            )
            .await;
        assert_eq!(r.error_code, 0);
        r.topics[0]
            .partitions
            .iter()
            .map(|p| {
                assert_eq!(p.error_code, 0);
                (
                    p.committed_offset,
                    p.metadata
                        .as_ref()
                        .map(|m| m.to_string())
                        .unwrap_or_default(),
                    p.committed_leader_epoch,
                )
            })
            .collect()
    }
}

fn protocols() -> Vec<JoinGroupRequestProtocol> {
    vec![JoinGroupRequestProtocol::default()
        .with_name(s("range"))
        .with_metadata(Bytes::from_static(
            b"\x00\x00\x00\x00\x00\x01\x00\x01t\xff\xff\xff\xff",
        ))]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_version_of_every_group_api() {
    let dir = tempfile::tempdir().unwrap();
    let running = start(dir.path()).await;
    let mut c = Client::connect(running.kafka_addr).await;
    create_topic(&mut c).await;

    for v in 0..=6i16 {
        let req = if v >= 4 {
            FindCoordinatorRequest::default().with_coordinator_keys(vec![s("a"), s("b")])
        } else {
            FindCoordinatorRequest::default().with_key(s("a"))
        };
        let r = c.call(v, &req).await;
        if v >= 4 {
            assert_eq!(r.coordinators.len(), 2);
            for co in &r.coordinators {
                assert_eq!((co.error_code, co.node_id.0), (0, 1), "v{v}");
                assert_eq!(co.port, running.kafka_addr.port() as i32);
            }
        } else {
            assert_eq!((r.error_code, r.node_id.0), (0, 1), "v{v}");
            assert_eq!(r.port, running.kafka_addr.port() as i32);
        }
        if v >= 1 {
            let req = if v >= 4 {
                FindCoordinatorRequest::default()
                    .with_key_type(1)
                    .with_coordinator_keys(vec![s("txn")])
            } else {
                FindCoordinatorRequest::default()
                    .with_key_type(1)
                    .with_key(s("txn"))
            };
            let r = c.call(v, &req).await;
            let code = if v >= 4 {
                r.coordinators[0].error_code
            } else {
                r.error_code
            };
            assert_eq!(code, 0, "v{v}: the transaction coordinator is this broker");
        }
    }

    for jv in 0..=9i16 {
        let g = format!("g-v{jv}");
        let join = |member: &str| {
            JoinGroupRequest::default()
                .with_group_id(group(&g))
                .with_session_timeout_ms(10_000)
                .with_rebalance_timeout_ms(10_000)
                .with_member_id(s(member))
                .with_protocol_type(s("consumer"))
                .with_protocols(protocols())
        };
        let mut r = c.call(jv, &join("")).await;
        if jv >= 4 {
            assert_eq!(r.error_code, 79, "v{jv}: MEMBER_ID_REQUIRED");
            let id = r.member_id.to_string();
            assert!(id.starts_with("wire-test-"));
            r = c.call(jv, &join(&id)).await;
        }
        assert_eq!(r.error_code, 0, "join v{jv}");
        assert_eq!(r.generation_id, 1);
        assert_eq!(r.leader, r.member_id);
        assert_eq!(r.members.len(), 1);
        assert_eq!(r.protocol_name.as_deref(), Some("range"));
        if jv >= 7 {
            assert_eq!(r.protocol_type.as_deref(), Some("consumer"));
        }
        let member = r.member_id.to_string();

        let sv = jv.min(5);
        let sync = c
            .call(
                sv,
                &SyncGroupRequest::default()
                    .with_group_id(group(&g))
                    .with_generation_id(1)
                    .with_member_id(s(&member))
                    .with_protocol_type(if sv >= 5 { Some(s("consumer")) } else { None })
                    .with_protocol_name(if sv >= 5 { Some(s("range")) } else { None })
                    .with_assignments(vec![SyncGroupRequestAssignment::default()
                        .with_member_id(s(&member))
                        .with_assignment(Bytes::from_static(b"asg"))]),
            )
            .await;
        assert_eq!(sync.error_code, 0, "sync v{sv}");
        assert_eq!(sync.assignment.as_ref(), b"asg");
        if sv >= 5 {
            assert_eq!(sync.protocol_name.as_deref(), Some("range"));
        }

        let hv = jv.min(4);
        let hb = c
            .call(
                hv,
                &HeartbeatRequest::default()
                    .with_group_id(group(&g))
                    .with_generation_id(1)
                    .with_member_id(s(&member)),
            )
            .await;
        assert_eq!(hb.error_code, 0, "heartbeat v{hv}");
        let hb = c
            .call(
                hv,
                &HeartbeatRequest::default()
                    .with_group_id(group(&g))
                    .with_generation_id(0)
                    .with_member_id(s(&member)),
            )
            .await;
        assert_eq!(hb.error_code, 22, "ILLEGAL_GENERATION v{hv}");

        let ov = jv.clamp(2, 9);
        let commit = c.call(ov, &commit_request(&g, 1, &member)).await;
        let codes: Vec<Vec<i16>> = commit
            .topics
            .iter()
            .map(|t| t.partitions.iter().map(|p| p.error_code).collect())
            .collect();
        assert_eq!(codes, vec![vec![0, 3], vec![3]], "commit v{ov}");
        let stale = c.call(ov, &commit_request(&g, 0, &member)).await;
        assert_eq!(stale.topics[0].partitions[0].error_code, 22);
        let stranger = c.call(ov, &commit_request(&g, 1, "stranger")).await;
        assert_eq!(stranger.topics[0].partitions[0].error_code, 25);

        let fv = jv.clamp(1, 9);
        let fetched = fetch_offsets(&mut c, fv, &g).await;
        // The leader epoch is committed from v6 and fetched from v5.
        let epoch = if ov >= 6 && fv >= 5 { 3 } else { -1 };
        assert_eq!(
            fetched,
            vec![(42, "m".to_string(), epoch), (-1, String::new(), -1)],
            "fetch v{fv}"
        );

        let dv = jv.min(6);
        let d = c
            .call(
                dv,
                &DescribeGroupsRequest::default()
                    .with_groups(vec![group(&g)])
                    .with_include_authorized_operations(dv >= 3),
            )
            .await;
        let dg = &d.groups[0];
        assert_eq!(dg.error_code, 0);
        assert_eq!(dg.group_state.as_str(), "Stable");
        assert_eq!(dg.protocol_type.as_str(), "consumer");
        assert_eq!(dg.protocol_data.as_str(), "range");
        assert_eq!(dg.members.len(), 1);
        assert_eq!(dg.members[0].member_assignment.as_ref(), b"asg");
        assert_eq!(dg.members[0].client_id.as_str(), "wire-test");
        assert_eq!(dg.members[0].client_host.as_str(), "/127.0.0.1");
        if dv >= 3 {
            assert_eq!(dg.authorized_operations, (1 << 3) | (1 << 6) | (1 << 8));
        }

        let lv = jv.min(5);
        let mut list = ListGroupsRequest::default();
        if lv >= 4 {
            list = list.with_states_filter(vec![s("stable")]);
        }
        if lv >= 5 {
            list = list.with_types_filter(vec![s("classic")]);
        }
        let l = c.call(lv, &list).await;
        let listed = l
            .groups
            .iter()
            .find(|x| x.group_id.as_str() == g)
            .unwrap_or_else(|| panic!("list v{lv} shows {g}"));
        assert_eq!(listed.protocol_type.as_str(), "consumer");
        if lv >= 4 {
            assert_eq!(listed.group_state.as_str(), "Stable");
        }
        if lv >= 5 {
            assert_eq!(listed.group_type.as_str(), "Classic");
            let none = c
                .call(
                    lv,
                    &ListGroupsRequest::default().with_types_filter(vec![s("consumer")]),
                )
                .await;
            assert!(none.groups.iter().all(|x| x.group_id.as_str() != g));
        }

        // Not empty yet.
        let gv = jv.min(2);
        let del = c
            .call(
                gv,
                &DeleteGroupsRequest::default().with_groups_names(vec![group(&g)]),
            )
            .await;
        assert_eq!(del.results[0].error_code, 68, "NON_EMPTY_GROUP v{gv}");

        let leave_v = jv.min(5);
        let leave = if leave_v >= 3 {
            LeaveGroupRequest::default()
                .with_group_id(group(&g))
                .with_members(vec![MemberIdentity::default().with_member_id(s(&member))])
        } else {
            LeaveGroupRequest::default()
                .with_group_id(group(&g))
                .with_member_id(s(&member))
        };
        let left = c.call(leave_v, &leave).await;
        assert_eq!(left.error_code, 0, "leave v{leave_v}");
        if leave_v >= 3 {
            assert_eq!(left.members[0].error_code, 0);
        }
        let again = c.call(leave_v, &leave).await;
        let code = if leave_v >= 3 {
            again.members[0].error_code
        } else {
            again.error_code
        };
        assert_eq!(code, 25, "leaving twice: UNKNOWN_MEMBER_ID v{leave_v}");

        let d = c
            .call(
                dv,
                &DescribeGroupsRequest::default().with_groups(vec![group(&g)]),
            )
            .await;
        assert_eq!(d.groups[0].group_state.as_str(), "Empty");
        assert_eq!(d.groups[0].authorized_operations, i32::MIN);

        let del = c
            .call(
                gv,
                &DeleteGroupsRequest::default().with_groups_names(vec![group(&g)]),
            )
            .await;
        assert_eq!(del.results[0].error_code, 0, "delete v{gv}");
        let del = c
            .call(
                gv,
                &DeleteGroupsRequest::default().with_groups_names(vec![group(&g)]),
            )
            .await;
        assert_eq!(del.results[0].error_code, 69, "GROUP_ID_NOT_FOUND v{gv}");
        let d = c
            .call(
                dv,
                &DescribeGroupsRequest::default().with_groups(vec![group(&g)]),
            )
            .await;
        assert_eq!(d.groups[0].group_state.as_str(), "Dead");
        assert_eq!(d.groups[0].error_code, if dv >= 6 { 69 } else { 0 });
        // Its offsets went with it.
        assert_eq!(fetch_offsets(&mut c, fv, &g).await[0].0, -1);
    }
    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simple_commits_offset_delete_and_restart() {
    let dir = tempfile::tempdir().unwrap();
    let running = start(dir.path()).await;
    let mut c = Client::connect(running.kafka_addr).await;
    create_topic(&mut c).await;
    let _ = c
        .call(3, &FindCoordinatorRequest::default().with_key(s("simple")))
        .await;

    // A consumer outside group management commits with generation -1.
    let r = c.call(9, &commit_request("simple", -1, "")).await;
    assert_eq!(r.topics[0].partitions[0].error_code, 0);
    // A generation for a group that does not exist: v9 says so, older ILLEGAL_GENERATION.
    let r = c.call(9, &commit_request("ghost", 1, "m")).await;
    assert_eq!(r.topics[0].partitions[0].error_code, 69);
    let r = c.call(8, &commit_request("ghost", 1, "m")).await;
    assert_eq!(r.topics[0].partitions[0].error_code, 22);

    // Several groups in one fetch (v8+), one of them unknown.
    let r = c
        .call(
            8,
            &OffsetFetchRequest::default().with_groups(vec![
                OffsetFetchRequestGroup::default()
                    .with_group_id(group("simple"))
                    .with_topics(None),
                OffsetFetchRequestGroup::default()
                    .with_group_id(group("ghost"))
                    .with_topics(None),
            ]),
        )
        .await;
    assert_eq!(r.groups.len(), 2);
    assert_eq!(r.groups[0].topics[0].partitions[0].committed_offset, 42);
    assert!(r.groups[1].topics.is_empty());

    // OffsetDelete: unknown group, unknown partition, then a real delete.
    let delete = |g: &str, partition: i32| {
        OffsetDeleteRequest::default()
            .with_group_id(group(g))
            .with_topics(vec![OffsetDeleteRequestTopic::default()
                .with_name(topic(TOPIC))
                .with_partitions(vec![
                    OffsetDeleteRequestPartition::default().with_partition_index(partition)
                ])])
    };
    assert_eq!(c.call(0, &delete("ghost", 0)).await.error_code, 69);
    let r = c.call(0, &delete("simple", 7)).await;
    assert_eq!(r.topics[0].partitions[0].error_code, 3);

    // Restart: the committed offset comes back.
    running.shutdown().await;
    let running = start(dir.path()).await;
    let mut c = Client::connect(running.kafka_addr).await;
    assert_eq!(
        fetch_offsets(&mut c, 7, "simple").await,
        vec![(42, "m".into(), 3), (-1, String::new(), -1)]
    );
    let r = c.call(0, &delete("simple", 0)).await;
    assert_eq!((r.error_code, r.topics[0].partitions[0].error_code), (0, 0));
    assert_eq!(fetch_offsets(&mut c, 7, "simple").await[0].0, -1);
    // ... and the delete survives a restart too.
    running.shutdown().await;
    let running = start(dir.path()).await;
    let mut c = Client::connect(running.kafka_addr).await;
    assert_eq!(fetch_offsets(&mut c, 7, "simple").await[0].0, -1);
    let l = c.call(4, &ListGroupsRequest::default()).await;
    let simple = l
        .groups
        .iter()
        .find(|g| g.group_id.as_str() == "simple")
        .unwrap();
    assert_eq!(simple.group_state.as_str(), "Empty");
    assert_eq!(simple.protocol_type.as_str(), "");
    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_subscribed_to_topic_keeps_its_offsets() {
    let dir = tempfile::tempdir().unwrap();
    let running = start(dir.path()).await;
    let mut c = Client::connect(running.kafka_addr).await;
    create_topic(&mut c).await;
    let _ = c
        .call(3, &FindCoordinatorRequest::default().with_key(s("sub")))
        .await;
    let join = |member: &str| {
        JoinGroupRequest::default()
            .with_group_id(group("sub"))
            .with_session_timeout_ms(10_000)
            .with_rebalance_timeout_ms(10_000)
            .with_member_id(s(member))
            .with_protocol_type(s("consumer"))
            .with_protocols(protocols())
    };
    let r = c.call(5, &join("")).await;
    let r = c.call(5, &join(&r.member_id)).await;
    assert_eq!(r.error_code, 0);
    let member = r.member_id.to_string();
    let sync = c
        .call(
            3,
            &SyncGroupRequest::default()
                .with_group_id(group("sub"))
                .with_generation_id(1)
                .with_member_id(s(&member)),
        )
        .await;
    assert_eq!(sync.error_code, 0);
    assert_eq!(
        c.call(7, &commit_request("sub", 1, &member)).await.topics[0].partitions[0].error_code,
        0
    );
    let r = c
        .call(
            0,
            &OffsetDeleteRequest::default()
                .with_group_id(group("sub"))
                .with_topics(vec![OffsetDeleteRequestTopic::default()
                    .with_name(topic(TOPIC))
                    .with_partitions(vec![
                        OffsetDeleteRequestPartition::default().with_partition_index(0)
                    ])]),
        )
        .await;
    assert_eq!(r.error_code, 0);
    assert_eq!(
        r.topics[0].partitions[0].error_code, 86,
        "GROUP_SUBSCRIBED_TO_TOPIC"
    );
    running.shutdown().await;
}

/// Many commits of one member pipelined on one connection, then a fetch on
/// the same connection, without waiting in between: the commits apply in
/// the order sent (the last one wins) and the fetch sees the last one, as a
/// Kafka broker, which runs a connection's requests one at a time, answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_commits_apply_in_order_and_the_last_one_wins() {
    let dir = tempfile::tempdir().unwrap();
    let running = start(dir.path()).await;
    let mut c = Client::connect(running.kafka_addr).await;
    create_topic(&mut c).await;
    let _ = c
        .call(3, &FindCoordinatorRequest::default().with_key(s("burst")))
        .await;
    let commit = |offset: i64| {
        OffsetCommitRequest::default()
            .with_group_id(group("burst"))
            .with_generation_id_or_member_epoch(-1)
            .with_topics(vec![OffsetCommitRequestTopic::default()
                .with_name(topic(TOPIC))
                .with_partitions(
                    (0..2)
                        .map(|p| {
                            OffsetCommitRequestPartition::default()
                                .with_partition_index(p)
                                .with_committed_offset(offset + p as i64)
                        })
                        .collect(),
                )])
    };
    let fetch = OffsetFetchRequest::default()
        .with_group_id(group("burst"))
        .with_topics(Some(vec![OffsetFetchRequestTopic::default()
            .with_name(topic(TOPIC))
            .with_partition_indexes(vec![0, 1])]));
    for round in 0..5i64 {
        let mut ids = Vec::new();
        for i in 1..=200 {
            ids.push(c.send(8, &commit(round * 1000 + i)).await);
        }
        let fetch_id = c.send(7, &fetch).await;
        for id in ids {
            let r = c.receive::<OffsetCommitRequest>(8, id).await;
            assert!(r.topics[0].partitions.iter().all(|p| p.error_code == 0));
        }
        let r = c.receive::<OffsetFetchRequest>(7, fetch_id).await;
        let got: Vec<i64> = r.topics[0]
            .partitions
            .iter()
            .map(|p| p.committed_offset)
            .collect();
        let last = round * 1000 + 200;
        assert_eq!(got, vec![last, last + 1], "round {round}");
        // A fetch on another connection agrees.
        let mut other = Client::connect(running.kafka_addr).await;
        let r = other.call(7, &fetch).await;
        assert_eq!(r.topics[0].partitions[0].committed_offset, last);
    }
    running.shutdown().await;
}

/// A member that does not rejoin within its rebalance timeout (a consumer's
/// `max.poll.interval.ms`, stuck in the application) is removed: the
/// rebalance completes without it, its partitions go to the members that
/// did rejoin, and its late heartbeat and commit are refused with
/// UNKNOWN_MEMBER_ID, leaving the committed offsets untouched. Its session
/// is long and it keeps heartbeating, so only the rebalance timeout can
/// remove it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_past_its_rebalance_timeout_is_removed_and_its_late_commit_refused() {
    const UNKNOWN_MEMBER_ID: i16 = 25;
    const REBALANCE_IN_PROGRESS: i16 = 27;
    let dir = tempfile::tempdir().unwrap();
    let running = start(dir.path()).await;
    let mut a = Client::connect(running.kafka_addr).await;
    create_topic(&mut a).await;
    let _ = a
        .call(3, &FindCoordinatorRequest::default().with_key(s("stuck")))
        .await;
    let join = |member: &str, rebalance_timeout_ms: i32| {
        JoinGroupRequest::default()
            .with_group_id(group("stuck"))
            .with_session_timeout_ms(30_000)
            .with_rebalance_timeout_ms(rebalance_timeout_ms)
            .with_member_id(s(member))
            .with_protocol_type(s("consumer"))
            .with_protocols(protocols())
    };
    let heartbeat = |member: &str, generation: i32| {
        HeartbeatRequest::default()
            .with_group_id(group("stuck"))
            .with_generation_id(generation)
            .with_member_id(s(member))
    };
    // A joins alone (generation 1) and commits.
    let r = a.call(5, &join("", 1_500)).await;
    let r = a.call(5, &join(&r.member_id, 1_500)).await;
    assert_eq!((r.error_code, r.generation_id), (0, 1));
    let member_a = r.member_id.to_string();
    let sync = SyncGroupRequest::default()
        .with_group_id(group("stuck"))
        .with_generation_id(1)
        .with_member_id(s(&member_a));
    assert_eq!(a.call(3, &sync).await.error_code, 0);
    let committed = a.call(7, &commit_request("stuck", 1, &member_a)).await;
    assert_eq!(committed.topics[0].partitions[0].error_code, 0);

    // B joins: a rebalance. B's JoinGroup waits for A, which only heartbeats
    // (told REBALANCE_IN_PROGRESS) and never rejoins. (The group waits for
    // the longest rebalance timeout of its members, as Kafka's does.)
    let mut b = Client::connect(running.kafka_addr).await;
    let r = b.call(5, &join("", 1_500)).await;
    let member_b = r.member_id.to_string();
    let joining = b.send(5, &join(&member_b, 1_500)).await;
    let mut told = false;
    for round in 0.. {
        assert!(round < 300, "A was never removed");
        let code = a.call(3, &heartbeat(&member_a, 1)).await.error_code;
        match code {
            REBALANCE_IN_PROGRESS => told = true,
            UNKNOWN_MEMBER_ID => break,
            0 => {}
            other => panic!("heartbeat answered {other}"),
        }
        // Without this the loop would spin; the order of events is what is
        // checked, not how long they take.
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert!(told, "A was told of the rebalance before it was removed");

    // The rebalance completed with B alone; B leads generation 2.
    let r = b.receive::<JoinGroupRequest>(5, joining).await;
    assert_eq!(r.error_code, 0);
    assert_eq!(r.generation_id, 2);
    assert_eq!(r.leader.to_string(), member_b);
    let members: Vec<String> = r.members.iter().map(|m| m.member_id.to_string()).collect();
    assert_eq!(members, vec![member_b.clone()]);

    // A's late commit, with its old generation, is refused and changes
    // nothing; B's commit in generation 2 is taken.
    let late = a.call(7, &commit_request("stuck", 1, &member_a)).await;
    assert!(late.topics[0]
        .partitions
        .iter()
        .all(|p| p.error_code == UNKNOWN_MEMBER_ID));
    let before = fetch_offsets(&mut b, 8, "stuck").await;
    assert_eq!(before[0].0, 42);
    let mut late_other = commit_request("stuck", 1, &member_a);
    late_other.topics[0].partitions[0].committed_offset = 7;
    let late = a.call(7, &late_other).await;
    assert_eq!(late.topics[0].partitions[0].error_code, UNKNOWN_MEMBER_ID);
    assert_eq!(fetch_offsets(&mut b, 8, "stuck").await, before);
    let sync = SyncGroupRequest::default()
        .with_group_id(group("stuck"))
        .with_generation_id(2)
        .with_member_id(s(&member_b));
    assert_eq!(b.call(3, &sync).await.error_code, 0);
    let mut fresh = commit_request("stuck", 2, &member_b);
    fresh.topics[0].partitions[0].committed_offset = 50;
    assert_eq!(
        b.call(7, &fresh).await.topics[0].partitions[0].error_code,
        0
    );
    assert_eq!(fetch_offsets(&mut b, 8, "stuck").await[0].0, 50);
    running.shutdown().await;
}
