use super::*;
use crate::classic::{ClassicConfig, ClassicGroup};
use crate::records::GroupMetadataValue;
use crate::CommittedOffset;

const DAY: i64 = 86_400_000;

fn offsets(entries: &[(&str, i32, i64)]) -> GroupOffsets {
    let mut o = GroupOffsets::default();
    for (t, p, ts) in entries {
        o.insert(
            t.to_string(),
            *p,
            CommittedOffset {
                offset: 1,
                leader_epoch: -1,
                metadata: String::new(),
                commit_timestamp: *ts,
            },
        );
    }
    o
}

fn empty_consumer_group(empty_since: i64) -> Group {
    Group::Classic(ClassicGroup::from_record(
        "g",
        ClassicConfig::default(),
        &GroupMetadataValue {
            protocol_type: "consumer".into(),
            generation: 3,
            protocol: None,
            leader: None,
            current_state_timestamp: empty_since,
            members: vec![],
        },
        empty_since,
    ))
}

#[test]
fn a_simple_group_expires_each_offset_from_its_commit() {
    let group = Group::Classic(ClassicGroup::new("g", ClassicConfig::default(), 0));
    let o = offsets(&[("a", 0, 0), ("a", 1, 5 * DAY)]);
    let all = |_: &str| true;
    assert_eq!(
        expired_offsets(&group, &o, 7 * DAY - 1, 7 * DAY, all),
        vec![]
    );
    assert_eq!(
        expired_offsets(&group, &o, 7 * DAY, 7 * DAY, all),
        vec![("a".to_string(), 0)]
    );
    assert_eq!(expired_offsets(&group, &o, 12 * DAY, 7 * DAY, all).len(), 2);
}

#[test]
fn an_empty_consumer_group_counts_from_when_it_became_empty() {
    // Committed long ago, empty only since day 10: nothing before day 17.
    let group = empty_consumer_group(10 * DAY);
    let o = offsets(&[("a", 0, 0), ("b", 0, DAY)]);
    let all = |_: &str| true;
    assert!(expired_offsets(&group, &o, 17 * DAY - 1, 7 * DAY, all).is_empty());
    assert_eq!(expired_offsets(&group, &o, 17 * DAY, 7 * DAY, all).len(), 2);
    // An unknown empty-since time (-1) falls back to the commit time.
    let group = empty_consumer_group(-1);
    assert_eq!(
        expired_offsets(&group, &o, 7 * DAY, 7 * DAY, all),
        vec![("a".to_string(), 0)]
    );
}

#[test]
fn offsets_of_deleted_topics_go_at_once() {
    let group = empty_consumer_group(10 * DAY);
    let o = offsets(&[("gone", 0, 10 * DAY), ("kept", 0, 10 * DAY)]);
    assert_eq!(
        expired_offsets(&group, &o, 10 * DAY, 7 * DAY, |t| t != "gone"),
        vec![("gone".to_string(), 0)]
    );
}
