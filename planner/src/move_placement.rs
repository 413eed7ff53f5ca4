//! Where the children of a split lead, and how a merge gathers its parents.
//!
//! A split opens both children on the parent's replicas, led by the
//! parent's primary: their next offsets and producer state seed from the
//! parent's log, which is open there. Left there, a hot range split to
//! spread its load would stay on one broker. So right after the split
//! commits, every child but the first hands its leadership to a follower
//! of its first segment (a leader move: a seal by quorum that prefers the
//! follower; nothing is copied, the follower holds the child's segment and
//! its producer snapshot), the one leading the fewest ranges, so that the
//! children land on different brokers.
//!
//! A merge seeds its child from both parents' logs, so both must be led by
//! the broker that merges. A parent led elsewhere is first handed to that
//! broker by a leader move, which needs the broker among the replicas of
//! the parent's active segment (no history is copied for a merge).

use std::collections::BTreeSet;

use tessera_metadata::{MetadataImage, RangeId};

use crate::{LeaderMove, PlanError};

/// The leader moves that put split `children` (in range order, as the
/// split created them) on different brokers: the first stays with the
/// parent's primary, each next one goes to the live follower of its active
/// segment leading the fewest ranges that leads no sibling yet (ties: the
/// lowest id). A child with no such follower (every follower fenced or
/// leading a sibling) stays where it is. An unreplicated child (one
/// replica) has no follower: it moves whole to the live broker holding the
/// fewest active segments that leads no sibling (the gateway carries such
/// a move out as a [`crate::Replacement::primary_move`]).
pub fn spread_split_children(image: &MetadataImage, children: &[RangeId]) -> Vec<LeaderMove> {
    let mut load = crate::leader_load(image);
    let mut held = crate::replica_load(image);
    let mut leading: BTreeSet<i32> = BTreeSet::new();
    let mut moves = Vec::new();
    for (i, &child) in children.iter().enumerate() {
        let Some(seg) = image.active_segment(child).filter(|s| !s.is_sealed()) else {
            continue;
        };
        let Some(primary) = seg.primary() else {
            continue;
        };
        if i == 0 || !leading.contains(&primary) {
            leading.insert(primary);
            continue;
        }
        let to = if seg.replicas.len() == 1 {
            held.keys()
                .copied()
                .filter(|b| !leading.contains(b))
                .min_by_key(|b| (held[b], *b))
        } else {
            seg.replicas[1..]
                .iter()
                .copied()
                .filter(|f| load.contains_key(f) && !leading.contains(f))
                .min_by_key(|f| (load[f], *f))
        };
        match to {
            Some(to) => {
                for counts in [&mut load, &mut held] {
                    if let Some(n) = counts.get_mut(&primary) {
                        *n -= 1;
                    }
                    if let Some(n) = counts.get_mut(&to) {
                        *n += 1;
                    }
                }
                leading.insert(to);
                moves.push(LeaderMove {
                    segment: seg.id,
                    from: primary,
                    to,
                });
            }
            None => {
                leading.insert(primary);
            }
        }
    }
    moves
}

/// The leader moves that make `at` lead both parents of a merge: none
/// when it leads them already. Refused when a parent is not active or,
/// replicated, its active segment is not also on `at` (a merge reads both
/// parents' state where it runs, and their history is not copied for it);
/// an unreplicated parent moves whole to `at` (a primary move).
pub fn gather_for_merge(
    image: &MetadataImage,
    parents: &[RangeId],
    at: i32,
) -> Result<Vec<LeaderMove>, PlanError> {
    let mut moves = Vec::new();
    for &parent in parents {
        crate::active_range(image, parent)?;
        let seg = image
            .active_segment(parent)
            .filter(|s| !s.is_sealed())
            .ok_or_else(|| {
                PlanError::InvalidMove(format!("range {parent} has no active segment"))
            })?;
        let Some(primary) = seg.primary() else {
            continue;
        };
        if primary == at {
            continue;
        }
        // An unreplicated parent moves whole to `at` (nothing of it is
        // there, nor anywhere else but its primary).
        if seg.replicas.len() > 1 && !seg.replicas.contains(&at) {
            return Err(PlanError::InvalidMove(format!(
                "range {parent} is led by broker {primary} and not replicated on broker {at}: \
                 merge it where both ranges are led"
            )));
        }
        if image.brokers.get(&at).is_none_or(|b| b.fenced) {
            return Err(PlanError::InvalidMove(format!(
                "broker {at} is fenced and cannot lead range {parent}"
            )));
        }
        moves.push(LeaderMove {
            segment: seg.id,
            from: primary,
            to: at,
        });
    }
    Ok(moves)
}

/// The children a lost move owes: partitions of a topic that no active
/// range covers, because a split or merge entry sealed its parents while
/// its `CreateRange` records lost their ids to a concurrent move (each
/// planner takes the image's next range id; replay skips the later
/// records, not the whole entry). For each such run of partitions, the
/// newest sealed range that held them gets one child over the run, opened
/// where the parent's last segment was (its primary holds the parent's
/// log, which seeds the child) one leader epoch up. Partitions no range
/// ever held (a topic creation's gap) are `cover_partitions`' concern.
pub fn complete_moves(image: &MetadataImage) -> Vec<tessera_metadata::MetadataRecord> {
    use tessera_metadata::{MetadataRecord, RangeRecord, SegmentId};
    let mut records = Vec::new();
    let mut next_id = image.next_range_id();
    for topic in image.topics.values() {
        let gaps = uncovered(image, topic.id, topic.partitions);
        if gaps.is_empty() {
            continue;
        }
        let ranges = image.all_ranges(topic.id);
        // The newest sealed range holding `p`: one no range holding `p`
        // names as a parent.
        let last_holder = |p: u32| {
            ranges
                .iter()
                .filter(|r| !r.active && r.contains(p))
                .find(|r| {
                    !ranges
                        .iter()
                        .any(|c| c.contains(p) && c.parents.contains(&r.id))
                })
                .map(|r| r.id)
        };
        let mut runs: Vec<(RangeId, u32, u32)> = Vec::new();
        for p in gaps.into_iter().flat_map(|(lo, hi)| lo..hi) {
            let Some(parent) = last_holder(p) else {
                continue;
            };
            match runs.last_mut() {
                Some((id, _, hi)) if *id == parent && *hi == p => *hi = p + 1,
                _ => runs.push((parent, p, p + 1)),
            }
        }
        for (parent, lo, hi) in runs {
            let Some(last) = image.segments_of(parent).last().cloned() else {
                continue;
            };
            records.push(MetadataRecord::CreateRange(RangeRecord {
                range_id: next_id,
                topic_id: topic.id,
                lo,
                hi,
                parents: vec![parent],
            }));
            records.push(crate::open_segment(
                SegmentId::new(next_id, 0),
                last.replicas.clone(),
                crate::next_epoch(image, &[parent]),
            ));
            next_id += 1;
        }
    }
    records
}

/// The runs of `topic`'s partitions no active range covers.
pub(crate) fn uncovered(
    image: &MetadataImage,
    topic: tessera_metadata::TopicId,
    partitions: u32,
) -> Vec<(u32, u32)> {
    let mut covered: Vec<(u32, u32)> = image
        .active_ranges(topic)
        .iter()
        .map(|r| (r.lo, r.hi))
        .collect();
    covered.sort_unstable();
    let mut gaps = Vec::new();
    let mut at = 0;
    for (lo, hi) in covered {
        if lo > at {
            gaps.push((at, lo));
        }
        at = at.max(hi);
    }
    if at < partitions {
        gaps.push((at, partitions));
    }
    gaps
}
