use super::*;
use proptest::prelude::*;
use uuid::Uuid;

type Topics = BTreeMap<String, (TopicId, u32)>;

fn tid(n: u8) -> TopicId {
    Uuid::from_bytes([n; 16])
}

fn topics(list: &[(&str, u8, u32)]) -> Topics {
    list.iter()
        .map(|&(name, id, n)| (name.to_string(), (tid(id), n)))
        .collect()
}

fn asg(list: &[(u8, &[i32])]) -> Assignment {
    let mut a = Assignment::new();
    for &(t, ps) in list {
        if !ps.is_empty() {
            a.insert(tid(t), ps.iter().copied().collect());
        }
    }
    a
}

fn owned(a: &Assignment) -> Vec<(TopicId, Vec<i32>)> {
    a.iter()
        .map(|(t, ps)| (*t, ps.iter().copied().collect()))
        .collect()
}

fn size(a: &Assignment) -> usize {
    a.values().map(BTreeSet::len).sum()
}

fn join_req(member_id: &str, subs: &[&str]) -> HeartbeatInput {
    HeartbeatInput {
        api_version: 1,
        group_id: "g".into(),
        member_id: member_id.into(),
        member_epoch: 0,
        rebalance_timeout_ms: 30_000,
        subscribed_topic_names: Some(subs.iter().map(|s| s.to_string()).collect()),
        owned_partitions: Some(vec![]),
        client_id: "client".into(),
        client_host: "/127.0.0.1".into(),
        ..Default::default()
    }
}

fn hb_req(member_id: &str, epoch: i32, owned_now: Option<&Assignment>) -> HeartbeatInput {
    HeartbeatInput {
        api_version: 1,
        group_id: "g".into(),
        member_id: member_id.into(),
        member_epoch: epoch,
        rebalance_timeout_ms: -1,
        owned_partitions: owned_now.map(owned),
        ..Default::default()
    }
}

fn group() -> ConsumerGroup {
    ConsumerGroup::new("g", ConsumerGroupConfig::default())
}

fn join(g: &mut ConsumerGroup, t: &Topics, id: &str, subs: &[&str]) -> HeartbeatOutput {
    let out = g.heartbeat(&join_req(id, subs), t, 0).expect("join");
    g.check_invariants();
    out
}

fn hb(
    g: &mut ConsumerGroup,
    t: &Topics,
    id: &str,
    epoch: i32,
    owned_now: Option<&Assignment>,
    now: i64,
) -> Result<HeartbeatOutput, ConsumerGroupError> {
    let r = g.heartbeat(&hb_req(id, epoch, owned_now), t, now);
    g.check_invariants();
    r
}

fn err_code(r: Result<HeartbeatOutput, ConsumerGroupError>) -> ResponseError {
    r.expect_err("expected an error").kafka()
}

// ---- joining -------------------------------------------------------------

#[test]
fn first_member_gets_everything_at_epoch_1() {
    let t = topics(&[("a", 1, 4)]);
    let mut g = group();
    let out = join(&mut g, &t, "m1", &["a"]);
    assert_eq!(out.member_id, "m1");
    assert_eq!(out.member_epoch, 1);
    assert_eq!(out.heartbeat_interval_ms, 5_000);
    assert_eq!(out.assignment, Some(asg(&[(1, &[0, 1, 2, 3])])));
    assert_eq!(g.group_epoch(), 1);
    assert_eq!(g.assignment_epoch(), 1);
    assert_eq!(g.state(), GroupState::Stable);
    let m = g.member("m1").unwrap();
    assert_eq!(m.state, MemberState::Stable);
    assert_eq!(m.previous_member_epoch, 0);
    assert_eq!(m.rebalance_timeout_ms, 30_000);
    assert_eq!(m.client_id, "client");
}

#[test]
fn version_0_generates_a_member_id_version_1_requires_one() {
    let t = topics(&[("a", 1, 1)]);
    let mut g = group();
    let mut req = join_req("", &["a"]);
    req.api_version = 0;
    let out = g.heartbeat(&req, &t, 0).unwrap();
    assert_eq!(
        out.member_id.len(),
        22,
        "Kafka-style uuid: {}",
        out.member_id
    );
    assert!(g.member(&out.member_id).is_some());

    req.api_version = 1;
    let e = g.heartbeat(&req, &t, 0).unwrap_err();
    assert_eq!(e.kafka(), ResponseError::InvalidRequest);
    assert_eq!(e.to_string(), "MemberId can't be empty.");

    // Version 0 still needs the id once the member has an epoch.
    let mut req = hb_req("", 1, None);
    req.api_version = 0;
    assert_eq!(
        err_code(g.heartbeat(&req, &t, 0)),
        ResponseError::InvalidRequest
    );
}

#[test]
fn joining_with_empty_subscription_is_allowed_and_gets_nothing() {
    let t = topics(&[("a", 1, 2)]);
    let mut g = group();
    let out = join(&mut g, &t, "m1", &[]);
    assert_eq!(out.member_epoch, 1);
    assert_eq!(out.assignment, Some(Assignment::new()));
}

#[test]
fn subscription_to_a_missing_topic_waits_for_it() {
    let mut t = topics(&[]);
    let mut g = group();
    let out = join(&mut g, &t, "m1", &["later"]);
    assert_eq!(out.assignment, Some(Assignment::new()));
    let e1 = out.member_epoch;
    // The topic appears: the next heartbeat bumps the epoch and assigns it.
    t.insert("later".into(), (tid(9), 3));
    let out = hb(&mut g, &t, "m1", e1, Some(&Assignment::new()), 1).unwrap();
    assert!(out.member_epoch > e1);
    assert_eq!(out.assignment, Some(asg(&[(9, &[0, 1, 2])])));
}

#[test]
fn added_partitions_are_assigned() {
    let mut t = topics(&[("a", 1, 2)]);
    let mut g = group();
    let out = join(&mut g, &t, "m1", &["a"]);
    t.insert("a".into(), (tid(1), 4));
    let out = hb(&mut g, &t, "m1", out.member_epoch, None, 1).unwrap();
    assert_eq!(out.member_epoch, 2);
    assert_eq!(out.assignment, Some(asg(&[(1, &[0, 1, 2, 3])])));
}

// ---- validation ----------------------------------------------------------

#[test]
fn invalid_requests() {
    let t = topics(&[("a", 1, 1)]);
    let cases: Vec<(HeartbeatInput, &str)> = vec![
        (
            HeartbeatInput {
                group_id: " ".into(),
                ..join_req("m", &["a"])
            },
            "GroupId can't be empty.",
        ),
        (
            HeartbeatInput {
                instance_id: Some("".into()),
                ..join_req("m", &["a"])
            },
            "InstanceId can't be empty.",
        ),
        (
            HeartbeatInput {
                rack_id: Some("  ".into()),
                ..join_req("m", &["a"])
            },
            "RackId can't be empty.",
        ),
        (
            HeartbeatInput {
                rebalance_timeout_ms: -1,
                ..join_req("m", &["a"])
            },
            "RebalanceTimeoutMs must be provided in first request.",
        ),
        (
            HeartbeatInput {
                owned_partitions: None,
                ..join_req("m", &["a"])
            },
            "TopicPartitions must be empty when (re-)joining.",
        ),
        (
            HeartbeatInput {
                owned_partitions: Some(vec![(tid(1), vec![0])]),
                ..join_req("m", &["a"])
            },
            "TopicPartitions must be empty when (re-)joining.",
        ),
        (
            HeartbeatInput {
                subscribed_topic_names: None,
                ..join_req("m", &["a"])
            },
            "Either SubscribedTopicNames or SubscribedTopicRegex must be non-null when (re-)joining.",
        ),
        (
            HeartbeatInput {
                member_epoch: -2,
                ..hb_req("m", 0, None)
            },
            "InstanceId can't be null.",
        ),
        (
            HeartbeatInput {
                member_epoch: -3,
                ..hb_req("m", 0, None)
            },
            "MemberEpoch is invalid.",
        ),
        (
            HeartbeatInput {
                subscribed_topic_regex: Some("a.*".into()),
                ..join_req("m", &["a"])
            },
            "SubscribedTopicRegex is not supported by this broker.",
        ),
        (
            HeartbeatInput {
                member_id: "".into(),
                api_version: 0,
                ..hb_req("", -1, None)
            },
            "MemberId can't be empty.",
        ),
    ];
    for (req, message) in cases {
        let mut g = group();
        let e = g.heartbeat(&req, &t, 0).unwrap_err();
        assert_eq!(e.kafka(), ResponseError::InvalidRequest, "{message}");
        assert_eq!(e.to_string(), message);
        assert!(g.is_empty());
    }
    // An empty regex is "no regex".
    let mut g = group();
    let req = HeartbeatInput {
        subscribed_topic_regex: Some(String::new()),
        ..join_req("m", &["a"])
    };
    g.heartbeat(&req, &t, 0).unwrap();
}

#[test]
fn unsupported_assignor() {
    let t = topics(&[("a", 1, 1)]);
    let mut g = group();
    let req = HeartbeatInput {
        server_assignor: Some("sticky".into()),
        ..join_req("m", &["a"])
    };
    let e = g.heartbeat(&req, &t, 0).unwrap_err();
    assert_eq!(e.kafka(), ResponseError::UnsupportedAssignor);
    assert_eq!(e.code(), 112);
    // An assignor this build has but the config does not offer.
    let mut g = ConsumerGroup::new(
        "g",
        ConsumerGroupConfig {
            assignors: vec![Assignor::Uniform],
            ..Default::default()
        },
    );
    let req = HeartbeatInput {
        server_assignor: Some("range".into()),
        ..join_req("m", &["a"])
    };
    assert_eq!(
        err_code(g.heartbeat(&req, &t, 0)),
        ResponseError::UnsupportedAssignor
    );
}

// ---- reconciliation ------------------------------------------------------

/// The core rule: a partition moves only after its previous owner released
/// it. m1 revokes (keeping its epoch) before m2 gets anything of it.
#[test]
fn revokes_before_it_reassigns() {
    let t = topics(&[("a", 1, 4)]);
    let mut g = group();
    let o1 = join(&mut g, &t, "m1", &["a"]);
    let all = asg(&[(1, &[0, 1, 2, 3])]);
    assert_eq!(o1.assignment.as_ref(), Some(&all));

    // m2 joins: epoch 2, target splits 2/2, but m1 still holds everything.
    let o2 = join(&mut g, &t, "m2", &["a"]);
    assert_eq!(g.group_epoch(), 2);
    assert_eq!(o2.member_epoch, 2);
    assert_eq!(o2.assignment, Some(Assignment::new()));
    assert_eq!(
        g.member("m2").unwrap().state,
        MemberState::UnreleasedPartitions
    );
    assert_eq!(g.state(), GroupState::Reconciling);
    let m2_target = g.target_assignment("m2").unwrap().clone();
    assert_eq!(size(&m2_target), 2);

    // m1 heartbeats still owning everything: told to revoke m2's half,
    // stays at epoch 1.
    let o = hb(&mut g, &t, "m1", 1, Some(&all), 1).unwrap();
    assert_eq!(o.member_epoch, 1);
    let m1_keep = g.target_assignment("m1").unwrap().clone();
    assert_eq!(o.assignment.as_ref(), Some(&m1_keep));
    let m1 = g.member("m1").unwrap();
    assert_eq!(m1.state, MemberState::UnrevokedPartitions);
    assert_eq!(m1.pending_revocation, m2_target);

    // m2 still cannot have them.
    let o = hb(&mut g, &t, "m2", 2, Some(&Assignment::new()), 2).unwrap();
    assert_eq!(o.assignment, None);
    assert_eq!(
        g.member("m2").unwrap().state,
        MemberState::UnreleasedPartitions
    );

    // m1 heartbeats without reporting (null owned): still assumed to hold them.
    let o = hb(&mut g, &t, "m1", 1, None, 3).unwrap();
    assert_eq!(o.member_epoch, 1);
    assert_eq!(
        g.member("m1").unwrap().state,
        MemberState::UnrevokedPartitions
    );

    // m1 acknowledges: moves to epoch 2, stable.
    let o = hb(&mut g, &t, "m1", 1, Some(&m1_keep), 4).unwrap();
    assert_eq!(o.member_epoch, 2);
    assert_eq!(
        o.assignment, None,
        "assignment unchanged since the revocation"
    );
    let m1 = g.member("m1").unwrap();
    assert_eq!(m1.state, MemberState::Stable);
    assert_eq!(m1.previous_member_epoch, 1);
    assert!(m1.pending_revocation.is_empty());

    // Now m2 gets them.
    let o = hb(&mut g, &t, "m2", 2, Some(&Assignment::new()), 5).unwrap();
    assert_eq!(o.assignment, Some(m2_target));
    assert_eq!(g.state(), GroupState::Stable);
}

#[test]
fn acknowledging_in_the_same_heartbeat_skips_the_revoking_state() {
    // A member that already dropped the partitions (it reports owning only
    // what it keeps) goes straight to the new epoch.
    let t = topics(&[("a", 1, 2)]);
    let mut g = group();
    join(&mut g, &t, "m1", &["a"]);
    join(&mut g, &t, "m2", &["a"]);
    let keep = g.target_assignment("m1").unwrap().clone();
    let o = hb(&mut g, &t, "m1", 1, Some(&keep), 1).unwrap();
    assert_eq!(o.member_epoch, 2);
    assert_eq!(g.member("m1").unwrap().state, MemberState::Stable);
}

#[test]
fn full_request_always_carries_the_assignment() {
    let t = topics(&[("a", 1, 2)]);
    let mut g = group();
    let o = join(&mut g, &t, "m1", &["a"]);
    let mine = o.assignment.clone().unwrap();
    // Unchanged, partial heartbeat: no assignment.
    let o = hb(&mut g, &t, "m1", 1, None, 1).unwrap();
    assert_eq!(o.assignment, None);
    // Full heartbeat (rebalance timeout, subscription and owned all set).
    let req = HeartbeatInput {
        rebalance_timeout_ms: 30_000,
        subscribed_topic_names: Some(vec!["a".into()]),
        ..hb_req("m1", 1, Some(&mine))
    };
    let o = g.heartbeat(&req, &t, 2).unwrap();
    assert_eq!(o.assignment, Some(mine));
}

#[test]
fn subscription_change_revokes_the_dropped_topic() {
    let t = topics(&[("a", 1, 2), ("b", 2, 2)]);
    let mut g = group();
    let o = join(&mut g, &t, "m1", &["a", "b"]);
    let all = o.assignment.unwrap();
    assert_eq!(size(&all), 4);
    let req = HeartbeatInput {
        subscribed_topic_names: Some(vec!["a".into()]),
        ..hb_req("m1", 1, Some(&all))
    };
    let o = g.heartbeat(&req, &t, 1).unwrap();
    assert_eq!(g.group_epoch(), 2);
    assert_eq!(o.member_epoch, 1, "revoking first");
    assert_eq!(o.assignment, Some(asg(&[(1, &[0, 1])])));
    assert_eq!(
        g.member("m1").unwrap().pending_revocation,
        asg(&[(2, &[0, 1])])
    );
    let o = hb(&mut g, &t, "m1", 1, Some(&asg(&[(1, &[0, 1])])), 2).unwrap();
    assert_eq!(o.member_epoch, 2);
    assert_eq!(g.owner(tid(2), 0), None);
}

#[test]
fn lost_response_previous_epoch_is_accepted_with_a_subset() {
    let t = topics(&[("a", 1, 4)]);
    let mut g = group();
    join(&mut g, &t, "m1", &["a"]);
    let o2 = join(&mut g, &t, "m2", &["a"]);
    let keep = g.target_assignment("m1").unwrap().clone();
    // m1 acks and moves to epoch 2, but the response is lost.
    hb(&mut g, &t, "m1", 1, Some(&keep), 1).unwrap();
    assert_eq!(g.member("m1").unwrap().member_epoch, 2);
    // It heartbeats again with epoch 1 and a subset of its assignment.
    let o = hb(&mut g, &t, "m1", 1, Some(&keep), 2).unwrap();
    assert_eq!(o.member_epoch, 2);
    // ...but not with partitions outside its assignment.
    let all = asg(&[(1, &[0, 1, 2, 3])]);
    assert_eq!(
        err_code(hb(&mut g, &t, "m1", 1, Some(&all), 3)),
        ResponseError::FencedMemberEpoch
    );
    // ...nor without saying what it owns.
    assert_eq!(
        err_code(hb(&mut g, &t, "m1", 1, None, 3)),
        ResponseError::FencedMemberEpoch
    );
    let _ = o2;
}

#[test]
fn fenced_member_epoch() {
    let t = topics(&[("a", 1, 2)]);
    let mut g = group();
    join(&mut g, &t, "m1", &["a"]);
    let e = hb(&mut g, &t, "m1", 7, None, 1).unwrap_err();
    assert_eq!(e.kafka(), ResponseError::FencedMemberEpoch);
    assert_eq!(e.code(), 110);
    // Epoch 0 with a known member id is a smaller epoch that is not the
    // previous one: fenced, as Kafka does (the member is dropped when its
    // session expires).
    join(&mut g, &t, "m2", &["a"]);
    let keep = g.target_assignment("m1").unwrap().clone();
    hb(&mut g, &t, "m1", 1, Some(&keep), 2).unwrap();
    hb(&mut g, &t, "m1", 2, Some(&keep), 2).unwrap();
    let e = g.heartbeat(&join_req("m1", &["a"]), &t, 3).unwrap_err();
    assert_eq!(e.kafka(), ResponseError::FencedMemberEpoch);
    // A fenced request changes nothing.
    assert_eq!(g.member("m1").unwrap().member_epoch, 2);
}

#[test]
fn unknown_member() {
    let t = topics(&[("a", 1, 2)]);
    let mut g = group();
    let e = hb(&mut g, &t, "ghost", 3, None, 0).unwrap_err();
    assert_eq!(e.kafka(), ResponseError::UnknownMemberId);
    assert_eq!(e.code(), 25);
    assert_eq!(
        err_code(g.heartbeat(
            &HeartbeatInput {
                member_epoch: -1,
                ..hb_req("ghost", 0, None)
            },
            &t,
            0
        )),
        ResponseError::UnknownMemberId
    );
}

// ---- leaving and expiry --------------------------------------------------

#[test]
fn leave_frees_partitions_and_bumps_the_epoch() {
    let t = topics(&[("a", 1, 4)]);
    let mut g = group();
    join(&mut g, &t, "m1", &["a"]);
    join(&mut g, &t, "m2", &["a"]);
    let keep = g.target_assignment("m1").unwrap().clone();
    hb(&mut g, &t, "m1", 1, Some(&keep), 1).unwrap();
    let o = hb(&mut g, &t, "m2", 2, Some(&Assignment::new()), 1).unwrap();
    let m2 = o.assignment.unwrap();
    assert_eq!(g.state(), GroupState::Stable);

    let o = g
        .heartbeat(
            &HeartbeatInput {
                member_epoch: -1,
                ..hb_req("m2", 0, None)
            },
            &t,
            2,
        )
        .unwrap();
    assert_eq!(o.member_id, "m2");
    assert_eq!(o.member_epoch, -1);
    assert_eq!(o.assignment, None);
    g.check_invariants();
    assert!(g.member("m2").is_none());
    assert_eq!(g.group_epoch(), 3);
    assert_eq!(g.state(), GroupState::Assigning);
    for (t_, ps) in &m2 {
        for p in ps {
            assert_eq!(g.owner(*t_, *p), None);
        }
    }
    // m1's next heartbeat computes the new target and takes everything.
    let o = hb(&mut g, &t, "m1", 2, Some(&keep), 3).unwrap();
    assert_eq!(o.member_epoch, 3);
    assert_eq!(o.assignment, Some(asg(&[(1, &[0, 1, 2, 3])])));
    assert_eq!(g.state(), GroupState::Stable);
}

#[test]
fn session_expiry_removes_the_member() {
    let t = topics(&[("a", 1, 2)]);
    let mut g = group();
    g.heartbeat(&join_req("m1", &["a"]), &t, 1_000).unwrap();
    g.heartbeat(&join_req("m2", &["a"]), &t, 2_000).unwrap();
    assert_eq!(g.next_deadline(), Some(46_000));
    assert!(g.expire_members(45_999).is_empty());
    let gone = g.expire_members(46_000);
    assert_eq!(
        gone,
        vec![Expired {
            member_id: "m1".into(),
            reason: "the member session expired"
        }]
    );
    g.check_invariants();
    assert!(g.member("m1").is_none());
    assert_eq!(g.group_epoch(), 3);
    // A heartbeat extends the session.
    hb(&mut g, &t, "m2", 2, Some(&Assignment::new()), 40_000).unwrap();
    assert!(g.expire_members(47_000).is_empty());
    assert_eq!(g.next_deadline(), Some(85_000));
    // The expired member learns on its next heartbeat.
    assert_eq!(
        err_code(hb(&mut g, &t, "m1", 1, None, 40_001)),
        ResponseError::UnknownMemberId
    );
    // Everyone gone: the group is empty.
    assert_eq!(g.expire_members(85_000).len(), 1);
    assert!(g.is_empty());
    assert_eq!(g.state(), GroupState::Empty);
    assert_eq!(g.next_deadline(), None);
}

#[test]
fn rebalance_timeout_fences_a_member_that_does_not_revoke() {
    let t = topics(&[("a", 1, 2)]);
    let mut g = group();
    let o = join(&mut g, &t, "m1", &["a"]);
    let all = o.assignment.unwrap();
    join(&mut g, &t, "m2", &["a"]);
    // m1 is told to revoke at t=1000, rebalance timeout 30 s.
    hb(&mut g, &t, "m1", 1, Some(&all), 1_000).unwrap();
    assert_eq!(
        g.member("m1").unwrap().state,
        MemberState::UnrevokedPartitions
    );
    assert_eq!(g.next_deadline(), Some(31_000));
    // It keeps heartbeating without revoking: the deadline does not move.
    hb(&mut g, &t, "m1", 1, Some(&all), 20_000).unwrap();
    hb(&mut g, &t, "m2", 2, Some(&Assignment::new()), 20_000).unwrap();
    assert!(g.expire_members(30_999).is_empty());
    let gone = g.expire_members(31_000);
    assert_eq!(gone.len(), 1);
    assert_eq!(gone[0].member_id, "m1");
    assert!(gone[0].reason.contains("rebalance timeout"));
    g.check_invariants();
}

#[test]
fn rebalance_timeout_does_not_fence_a_member_that_revoked() {
    let t = topics(&[("a", 1, 2)]);
    let mut g = group();
    let o = join(&mut g, &t, "m1", &["a"]);
    let all = o.assignment.unwrap();
    join(&mut g, &t, "m2", &["a"]);
    hb(&mut g, &t, "m1", 1, Some(&all), 1_000).unwrap();
    let keep = g.target_assignment("m1").unwrap().clone();
    hb(&mut g, &t, "m1", 1, Some(&keep), 2_000).unwrap();
    assert!(g.expire_members(31_000).is_empty());
}

// ---- static membership ---------------------------------------------------

fn static_join(id: &str, instance: &str, subs: &[&str]) -> HeartbeatInput {
    HeartbeatInput {
        instance_id: Some(instance.into()),
        ..join_req(id, subs)
    }
}

#[test]
fn static_member_leaves_temporarily_and_comes_back() {
    let t = topics(&[("a", 1, 4)]);
    let mut g = group();
    g.heartbeat(&static_join("s1", "i1", &["a"]), &t, 0)
        .unwrap();
    g.heartbeat(&join_req("d1", &["a"]), &t, 0).unwrap();
    let all = asg(&[(1, &[0, 1, 2, 3])]);
    let keep = g.target_assignment("s1").unwrap().clone();
    let req = |epoch, owned: &Assignment| HeartbeatInput {
        instance_id: Some("i1".into()),
        ..hb_req("s1", epoch, Some(owned))
    };
    g.heartbeat(&req(1, &all), &t, 1).unwrap();
    g.heartbeat(&req(1, &keep), &t, 2).unwrap();
    hb(&mut g, &t, "d1", 2, Some(&Assignment::new()), 3).unwrap();
    assert_eq!(g.state(), GroupState::Stable);
    let epoch_before = g.group_epoch();

    // Another process with the same instance id cannot join meanwhile.
    let e = g
        .heartbeat(&static_join("s2", "i1", &["a"]), &t, 4)
        .unwrap_err();
    assert_eq!(e.kafka(), ResponseError::UnreleasedInstanceId);

    // s1 leaves temporarily (-2): keeps its partitions, no rebalance.
    let o = g
        .heartbeat(
            &HeartbeatInput {
                member_epoch: -2,
                ..req(0, &keep)
            },
            &t,
            5,
        )
        .unwrap();
    assert_eq!(o.member_epoch, -2);
    g.check_invariants();
    assert_eq!(g.group_epoch(), epoch_before);
    assert_eq!(g.member("s1").unwrap().assigned, keep);
    for (t_, ps) in &keep {
        for p in ps {
            assert_eq!(g.owner(*t_, *p), Some("s1"));
        }
    }

    // It comes back as a new process (new member id, same instance id) and
    // gets its partitions back without a rebalance.
    let o = g
        .heartbeat(&static_join("s2", "i1", &["a"]), &t, 6)
        .unwrap();
    g.check_invariants();
    assert_eq!(o.member_id, "s2");
    assert_eq!(o.assignment, Some(keep.clone()));
    assert_eq!(o.member_epoch, epoch_before);
    assert_eq!(g.group_epoch(), epoch_before);
    assert!(g.member("s1").is_none());
    assert_eq!(g.target_assignment("s2"), Some(&keep));

    // The old member id is now fenced for that instance id.
    let e = g
        .heartbeat(
            &HeartbeatInput {
                instance_id: Some("i1".into()),
                ..hb_req("s1", epoch_before, None)
            },
            &t,
            7,
        )
        .unwrap_err();
    assert_eq!(e.kafka(), ResponseError::FencedInstanceId);

    // Leaving for good (-1) removes it.
    g.heartbeat(
        &HeartbeatInput {
            instance_id: Some("i1".into()),
            member_epoch: -1,
            ..hb_req("s2", 0, None)
        },
        &t,
        8,
    )
    .unwrap();
    g.check_invariants();
    assert!(g.member("s2").is_none());
    assert_eq!(g.group_epoch(), epoch_before + 1);
}

#[test]
fn static_member_unknown_instance() {
    let t = topics(&[("a", 1, 1)]);
    let mut g = group();
    let e = g
        .heartbeat(
            &HeartbeatInput {
                instance_id: Some("nope".into()),
                ..hb_req("x", 3, None)
            },
            &t,
            0,
        )
        .unwrap_err();
    assert_eq!(e.kafka(), ResponseError::UnknownMemberId);
    let e = g
        .heartbeat(
            &HeartbeatInput {
                instance_id: Some("nope".into()),
                member_epoch: -2,
                ..hb_req("x", 0, None)
            },
            &t,
            0,
        )
        .unwrap_err();
    assert_eq!(e.kafka(), ResponseError::UnknownMemberId);
}

#[test]
fn static_member_that_left_expires_with_its_session() {
    let t = topics(&[("a", 1, 2)]);
    let mut g = group();
    g.heartbeat(&static_join("s1", "i1", &["a"]), &t, 0)
        .unwrap();
    g.heartbeat(
        &HeartbeatInput {
            instance_id: Some("i1".into()),
            member_epoch: -2,
            ..hb_req("s1", 0, None)
        },
        &t,
        1,
    )
    .unwrap();
    assert_eq!(g.state(), GroupState::Reconciling);
    assert_eq!(g.expire_members(45_000).len(), 1);
    assert!(g.is_empty());
    // The instance id is free again.
    g.heartbeat(&static_join("s3", "i1", &["a"]), &t, 50_000)
        .unwrap();
    g.check_invariants();
}

// ---- group size, assignors ------------------------------------------------

#[test]
fn group_max_size() {
    let t = topics(&[("a", 1, 2)]);
    let mut g = ConsumerGroup::new(
        "g",
        ConsumerGroupConfig {
            max_size: 1,
            ..Default::default()
        },
    );
    join(&mut g, &t, "m1", &["a"]);
    let e = g.heartbeat(&join_req("m2", &["a"]), &t, 0).unwrap_err();
    assert_eq!(e.kafka(), ResponseError::GroupMaxSizeReached);
    // Existing members carry on.
    hb(&mut g, &t, "m1", 1, None, 1).unwrap();
}

#[test]
fn members_choose_the_assignor_by_majority() {
    let t = topics(&[("a", 1, 4), ("b", 2, 4)]);
    let mut g = group();
    assert_eq!(g.assignor(), Assignor::Uniform);
    for id in ["m1", "m2"] {
        let req = HeartbeatInput {
            server_assignor: Some("range".into()),
            ..join_req(id, &["a", "b"])
        };
        g.heartbeat(&req, &t, 0).unwrap();
    }
    assert_eq!(g.assignor(), Assignor::Range);
    // Range: co-partitioned by member id order.
    assert_eq!(
        g.target_assignment("m1"),
        Some(&asg(&[(1, &[0, 1]), (2, &[0, 1])]))
    );
    assert_eq!(
        g.target_assignment("m2"),
        Some(&asg(&[(1, &[2, 3]), (2, &[2, 3])]))
    );
    let d = g.describe(&t);
    assert_eq!(d.assignor_name, "range");
}

// ---- offsets ----------------------------------------------------------------

#[test]
fn offset_commit_rules() {
    let t = topics(&[("a", 1, 2)]);
    let mut g = group();
    // Empty group: anyone with epoch -1 may commit (admin, manual assignment).
    assert_eq!(g.validate_offset_commit("", -1, 9), Ok(()));
    assert_eq!(g.validate_offset_commit("", -1, 2), Ok(()));
    join(&mut g, &t, "m1", &["a"]);
    // Not once it has members.
    assert_eq!(
        g.validate_offset_commit("", -1, 9).unwrap_err().kafka(),
        ResponseError::UnknownMemberId
    );
    assert_eq!(
        g.validate_offset_commit("ghost", 1, 9).unwrap_err().kafka(),
        ResponseError::UnknownMemberId
    );
    assert_eq!(
        g.validate_offset_commit("m1", 1, 8).unwrap_err().kafka(),
        ResponseError::UnsupportedVersion
    );
    let e = g.validate_offset_commit("m1", 0, 9).unwrap_err();
    assert_eq!(e.kafka(), ResponseError::StaleMemberEpoch);
    assert_eq!(e.code(), 113);
    assert_eq!(g.validate_offset_commit("m1", 1, 9), Ok(()));
    // Transactional commits have no version rule.
    assert_eq!(g.validate_txn_offset_commit("m1", 1), Ok(()));
    assert_eq!(
        g.validate_txn_offset_commit("m1", 2).unwrap_err().kafka(),
        ResponseError::StaleMemberEpoch
    );
    // A member mid-revocation commits with the epoch it still has.
    join(&mut g, &t, "m2", &["a"]);
    hb(&mut g, &t, "m1", 1, Some(&asg(&[(1, &[0, 1])])), 1).unwrap();
    assert_eq!(g.member("m1").unwrap().member_epoch, 1);
    assert_eq!(g.validate_offset_commit("m1", 1, 9), Ok(()));
    assert_eq!(
        g.validate_offset_commit("m1", 2, 9).unwrap_err().kafka(),
        ResponseError::StaleMemberEpoch
    );
}

#[test]
fn offset_fetch_rules() {
    let t = topics(&[("a", 1, 2)]);
    let mut g = group();
    join(&mut g, &t, "m1", &["a"]);
    assert_eq!(g.validate_offset_fetch(None, -1), Ok(()));
    assert_eq!(g.validate_offset_fetch(Some("m1"), 1), Ok(()));
    assert_eq!(
        g.validate_offset_fetch(Some("m1"), 3).unwrap_err().kafka(),
        ResponseError::StaleMemberEpoch
    );
    assert_eq!(
        g.validate_offset_fetch(Some("x"), 1).unwrap_err().kafka(),
        ResponseError::UnknownMemberId
    );
}

// ---- describe --------------------------------------------------------------

#[test]
fn describe_reports_members_assignments_and_targets() {
    let t = topics(&[("a", 1, 2)]);
    let mut g = group();
    join(&mut g, &t, "m1", &["a"]);
    let req = HeartbeatInput {
        rack_id: Some("r1".into()),
        ..join_req("m2", &["a"])
    };
    g.heartbeat(&req, &t, 0).unwrap();
    let d = g.describe(&t);
    assert_eq!(d.group_id, "g");
    assert_eq!(d.state, GroupState::Reconciling);
    assert_eq!(d.state.as_str(), "Reconciling");
    assert_eq!(d.group_epoch, 2);
    assert_eq!(d.assignment_epoch, 2);
    assert_eq!(d.assignor_name, "uniform");
    assert_eq!(d.members.len(), 2);
    let m1 = &d.members[0];
    assert_eq!(m1.member_id, "m1");
    assert_eq!(m1.member_epoch, 1);
    assert_eq!(m1.subscribed_topic_names, vec!["a".to_string()]);
    assert_eq!(m1.assignment, vec![(tid(1), "a".to_string(), vec![0, 1])]);
    assert_eq!(m1.target_assignment.len(), 1);
    assert_eq!(m1.target_assignment[0].2.len(), 1);
    let m2 = &d.members[1];
    assert_eq!(m2.rack_id.as_deref(), Some("r1"));
    assert!(m2.assignment.is_empty());
    assert_eq!(m2.client_host, "/127.0.0.1");
}

#[test]
fn error_codes_are_kafkas() {
    use ConsumerGroupError as E;
    let s = String::new;
    assert_eq!(E::InvalidRequest(s()).code(), 42);
    assert_eq!(E::UnsupportedAssignor(s()).code(), 112);
    assert_eq!(E::FencedMemberEpoch(s()).code(), 110);
    assert_eq!(E::StaleMemberEpoch(s()).code(), 113);
    assert_eq!(E::UnknownMemberId(s()).code(), 25);
    assert_eq!(E::UnreleasedInstanceId(s()).code(), 111);
    assert_eq!(E::FencedInstanceId(s()).code(), 82);
    assert_eq!(E::GroupMaxSizeReached(s()).code(), 81);
    assert_eq!(E::GroupIdNotFound(s()).code(), 69);
    assert_eq!(E::UnsupportedVersion(s()).code(), 35);
}

// ---- the reconciliation state machine on its own ---------------------------

#[test]
fn reconcile_waits_for_unreleased_partitions() {
    let mut m = Member::new("m");
    m.member_epoch = 3;
    m.previous_member_epoch = 2;
    let target = asg(&[(1, &[0, 1])]);
    let held_by_other = |t: TopicId, p: i32| (t == tid(1) && p == 1).then(|| "other".to_string());
    let next = reconcile(&m, 4, &target, Some(&[]), &held_by_other);
    assert_eq!(next.state, MemberState::UnreleasedPartitions);
    assert_eq!(next.member_epoch, 4);
    assert_eq!(next.previous_member_epoch, 3);
    assert_eq!(next.assigned, asg(&[(1, &[0])]));
    // Released: assigned on the next pass, still at epoch 4.
    let free = |_: TopicId, _: i32| None;
    let next = reconcile(&next, 4, &target, Some(&[]), &free);
    assert_eq!(next.state, MemberState::Stable);
    assert_eq!(next.assigned, target);
}

#[test]
fn reconcile_revoked_partition_coming_back_is_free() {
    // A member that acked a revocation may be given the same partition back
    // when the target changed meanwhile: it is "held" only by itself.
    let mut m = Member::new("m");
    m.member_epoch = 2;
    m.state = MemberState::UnrevokedPartitions;
    m.assigned = asg(&[(1, &[0])]);
    m.pending_revocation = asg(&[(1, &[1])]);
    let target = asg(&[(1, &[0, 1])]);
    let held_by_self = |_: TopicId, _: i32| Some("m".to_string());
    let next = reconcile(
        &m,
        3,
        &target,
        Some(&owned(&asg(&[(1, &[0])]))),
        &held_by_self,
    );
    assert_eq!(next.state, MemberState::Stable);
    assert_eq!(next.member_epoch, 3);
    assert_eq!(next.assigned, target);
}

// ---- property tests ----------------------------------------------------------

/// A client as the model runs it: follows the protocol (reports what it
/// owns, drops revoked partitions, takes assigned ones).
#[derive(Clone, Debug)]
struct Client {
    base: String,
    generation: u32,
    member_id: String,
    epoch: i32,
    owned: Assignment,
    subs: Vec<String>,
    subs_dirty: bool,
    last_sent: Option<Assignment>,
    joined: bool,
    crashed: bool,
    /// Lost a response since it last joined (may then be fenced).
    lost_response: bool,
    /// The last request failed: the next one is a full request, as Kafka
    /// clients do after an error.
    needs_full: bool,
}

impl Client {
    fn new(i: usize, subs: Vec<String>) -> Client {
        Client {
            base: format!("c{i}"),
            generation: 0,
            member_id: format!("c{i}-0"),
            epoch: 0,
            owned: Assignment::new(),
            subs,
            subs_dirty: false,
            last_sent: None,
            joined: false,
            crashed: false,
            lost_response: false,
            needs_full: false,
        }
    }

    /// Forget everything and come back as a new member id.
    fn reset(&mut self) {
        self.generation += 1;
        self.member_id = format!("{}-{}", self.base, self.generation);
        self.epoch = 0;
        self.owned.clear();
        self.joined = false;
        self.last_sent = None;
        self.lost_response = false;
        self.needs_full = false;
    }
}

#[derive(Clone, Debug)]
enum Op {
    Heartbeat(usize, bool),
    LoseResponse(usize),
    Leave(usize),
    Subscribe(usize, Vec<usize>),
    Crash(usize),
    Restart(usize),
    Tick(i64),
    AddPartitions(usize, u32),
    UseRange(usize),
}

const TOPIC_NAMES: [&str; 3] = ["t0", "t1", "t2"];

fn arb_op(clients: usize) -> impl Strategy<Value = Op> {
    let c = 0..clients;
    prop_oneof![
        10 => (c.clone(), any::<bool>()).prop_map(|(i, f)| Op::Heartbeat(i, f)),
        1 => c.clone().prop_map(Op::LoseResponse),
        1 => c.clone().prop_map(Op::Leave),
        2 => (c.clone(), prop::collection::vec(0..TOPIC_NAMES.len(), 0..3)).prop_map(|(i, t)| Op::Subscribe(i, t)),
        1 => c.clone().prop_map(Op::Crash),
        1 => c.clone().prop_map(Op::Restart),
        2 => (0i64..20_000).prop_map(Op::Tick),
        1 => (0..TOPIC_NAMES.len(), 1u32..3).prop_map(|(t, n)| Op::AddPartitions(t, n)),
        1 => c.prop_map(Op::UseRange),
    ]
}

struct Sim {
    group: ConsumerGroup,
    topics: Topics,
    clients: Vec<Client>,
    now: i64,
    range: Vec<bool>,
}

impl Sim {
    fn new(n: usize, partitions: &[u32]) -> Sim {
        let mut topics = Topics::new();
        for (i, &p) in partitions.iter().enumerate() {
            if p > 0 {
                topics.insert(TOPIC_NAMES[i].to_string(), (tid(i as u8 + 1), p));
            }
        }
        Sim {
            group: group(),
            topics,
            clients: (0..n).map(|i| Client::new(i, vec!["t0".into()])).collect(),
            now: 0,
            range: vec![false; n],
        }
    }

    /// One heartbeat of client `i` as the client would send it; applies the
    /// response unless `lose`.
    fn heartbeat(&mut self, i: usize, full: bool, lose: bool) {
        let c = &self.clients[i];
        if c.crashed {
            return;
        }
        let req = if !c.joined {
            HeartbeatInput {
                server_assignor: self.range[i].then(|| "range".to_string()),
                ..join_req(
                    &c.member_id,
                    &c.subs.iter().map(String::as_str).collect::<Vec<_>>(),
                )
            }
        } else {
            let full = full || c.needs_full;
            let send_owned = full || c.last_sent.as_ref() != Some(&c.owned);
            HeartbeatInput {
                rebalance_timeout_ms: if full { 30_000 } else { -1 },
                subscribed_topic_names: (full || c.subs_dirty).then(|| c.subs.clone()),
                server_assignor: self.range[i].then(|| "range".to_string()),
                ..hb_req(&c.member_id, c.epoch, send_owned.then_some(&c.owned))
            }
        };
        let result = self.group.heartbeat(&req, &self.topics, self.now);
        self.group.check_invariants();
        let c = &mut self.clients[i];
        match result {
            Ok(out) => {
                if lose {
                    c.lost_response = true;
                    c.needs_full = true;
                    return;
                }
                c.needs_full = false;
                if req.owned_partitions.is_some() {
                    c.last_sent = Some(c.owned.clone());
                }
                if req.subscribed_topic_names.is_some() {
                    c.subs_dirty = false;
                }
                c.joined = true;
                c.member_id = out.member_id;
                c.epoch = out.member_epoch;
                if let Some(a) = out.assignment {
                    c.owned = a;
                }
            }
            Err(e) => {
                match e.kafka() {
                    ResponseError::UnknownMemberId => {}
                    ResponseError::FencedMemberEpoch => assert!(
                        c.lost_response,
                        "{} fenced without a lost response: {e}",
                        c.member_id
                    ),
                    other => panic!("unexpected {other:?}: {e}"),
                }
                c.reset();
            }
        }
    }

    fn apply(&mut self, op: &Op) {
        match op {
            Op::Heartbeat(i, full) => self.heartbeat(*i, *full, false),
            Op::LoseResponse(i) => {
                if self.clients[*i].joined {
                    self.heartbeat(*i, false, true)
                }
            }
            Op::Leave(i) => {
                let c = &self.clients[*i];
                if c.joined && !c.crashed {
                    let req = HeartbeatInput {
                        member_epoch: -1,
                        ..hb_req(&c.member_id, 0, None)
                    };
                    let r = self.group.heartbeat(&req, &self.topics, self.now);
                    self.group.check_invariants();
                    if let Err(e) = r {
                        assert_eq!(e.kafka(), ResponseError::UnknownMemberId);
                    }
                    self.clients[*i].reset();
                }
            }
            Op::Subscribe(i, ts) => {
                let mut subs: Vec<String> =
                    ts.iter().map(|&t| TOPIC_NAMES[t].to_string()).collect();
                subs.sort();
                subs.dedup();
                let c = &mut self.clients[*i];
                c.subs = subs;
                c.subs_dirty = true;
            }
            Op::Crash(i) => self.clients[*i].crashed = true,
            Op::Restart(i) => {
                let c = &mut self.clients[*i];
                if c.crashed {
                    c.crashed = false;
                    c.reset();
                }
            }
            Op::Tick(ms) => {
                self.now += ms;
                self.group.expire_members(self.now);
                self.group.check_invariants();
            }
            Op::AddPartitions(t, n) => {
                let name = TOPIC_NAMES[*t].to_string();
                let entry = self.topics.entry(name).or_insert((tid(*t as u8 + 1), 0));
                entry.1 += n;
            }
            Op::UseRange(i) => self.range[*i] = !self.range[*i],
        }
        self.check_safety();
    }

    /// No partition is held by two members, and every live client that is
    /// still a member uses only partitions the group counts as its own.
    fn check_safety(&self) {
        for c in &self.clients {
            if c.crashed || !c.joined {
                continue;
            }
            let Some(m) = self.group.member(&c.member_id) else {
                continue;
            };
            for (t, ps) in &c.owned {
                for p in ps {
                    let mine = m.assigned.get(t).is_some_and(|s| s.contains(p))
                        || m.pending_revocation.get(t).is_some_and(|s| s.contains(p));
                    assert!(mine, "{} uses {t}-{p} it does not hold: {m:?}", c.member_id);
                }
            }
        }
        // Across live members, client-side ownership is exclusive.
        let mut seen: HashMap<(TopicId, i32), &str> = HashMap::new();
        for c in &self.clients {
            if c.crashed || !c.joined || self.group.member(&c.member_id).is_none() {
                continue;
            }
            for (t, ps) in &c.owned {
                for p in ps {
                    if let Some(other) = seen.insert((*t, *p), &c.member_id) {
                        panic!("{t}-{p} used by {other} and {}", c.member_id);
                    }
                }
            }
        }
    }

    /// Everyone alive heartbeats until the group is stable; crashed members
    /// expire on the way.
    fn converge(&mut self) {
        for i in 0..self.clients.len() {
            self.clients[i].crashed = false;
            if !self.clients[i].joined {
                self.clients[i].reset();
            }
        }
        for round in 0..40 {
            for i in 0..self.clients.len() {
                self.heartbeat(i, false, false);
                self.check_safety();
            }
            if round < 8 {
                self.now += 10_000;
                self.group.expire_members(self.now);
                self.group.check_invariants();
            }
        }
    }

    fn check_converged(&self) {
        let g = &self.group;
        assert_eq!(g.state(), GroupState::Stable, "{:#?}", g);
        let mut covered: BTreeSet<(TopicId, i32)> = BTreeSet::new();
        for c in &self.clients {
            let m = g.member(&c.member_id).expect("every client is a member");
            assert_eq!(m.member_epoch, g.assignment_epoch());
            assert_eq!(m.state, MemberState::Stable);
            let target = g
                .target_assignment(&c.member_id)
                .cloned()
                .unwrap_or_default();
            assert_eq!(m.assigned, target);
            assert_eq!(c.owned, target, "client {} has not caught up", c.member_id);
            assert_eq!(c.epoch, m.member_epoch);
            for (t, ps) in &target {
                for p in ps {
                    assert!(covered.insert((*t, *p)));
                }
            }
        }
        assert_eq!(g.members().count(), self.clients.len());
        // Every partition of every subscribed topic is assigned.
        let subscribed: BTreeSet<&String> =
            self.clients.iter().flat_map(|c| c.subs.iter()).collect();
        let wanted: usize = subscribed
            .iter()
            .filter_map(|n| self.topics.get(*n))
            .map(|(_, n)| *n as usize)
            .sum();
        assert_eq!(covered.len(), wanted);
        // Uniform over a homogeneous group is balanced.
        let homogeneous = self.clients.iter().all(|c| c.subs == self.clients[0].subs);
        if homogeneous && g.assignor() == Assignor::Uniform {
            let sizes: Vec<usize> = self.clients.iter().map(|c| size(&c.owned)).collect();
            let (lo, hi) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
            assert!(hi - lo <= 1, "unbalanced {sizes:?}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Random joins, leaves, crashes, subscription changes, lost responses,
    /// new partitions and heartbeats never put a partition in two members'
    /// hands (pending revocations count as held), and once everyone
    /// heartbeats the group converges to its target assignment.
    #[test]
    fn never_two_owners_and_converges(
        n in 1usize..6,
        partitions in prop::collection::vec(0u32..13, 3),
        ops in prop::collection::vec(arb_op(5), 0..120),
    ) {
        let mut sim = Sim::new(n, &partitions);
        for op in &ops {
            let op = match op {
                Op::Heartbeat(i, f) if *i >= n => Op::Heartbeat(i % n, *f),
                Op::LoseResponse(i) => Op::LoseResponse(i % n),
                Op::Leave(i) => Op::Leave(i % n),
                Op::Subscribe(i, t) => Op::Subscribe(i % n, t.clone()),
                Op::Crash(i) => Op::Crash(i % n),
                Op::Restart(i) => Op::Restart(i % n),
                Op::UseRange(i) => Op::UseRange(i % n),
                other => other.clone(),
            };
            sim.apply(&op);
        }
        sim.converge();
        sim.check_converged();
    }
}

/// The scenario of the compat test: 3 members on 12 partitions, a fourth
/// joins, one leaves; at every step no partition has two holders.
#[test]
fn three_members_then_a_fourth_then_one_leaves() {
    let mut sim = Sim::new(3, &[12, 0, 0]);
    sim.converge();
    sim.check_converged();
    for c in &sim.clients {
        assert_eq!(size(&c.owned), 4);
    }
    sim.clients.push(Client::new(3, vec!["t0".into()]));
    sim.range.push(false);
    sim.converge();
    sim.check_converged();
    sim.apply(&Op::Leave(0));
    sim.clients.remove(0);
    sim.range.remove(0);
    sim.converge();
    sim.check_converged();
    for c in &sim.clients {
        assert_eq!(size(&c.owned), 4);
    }
}
