//! Leadership balance (Kafka's `auto.leader.rebalance.enable`).
//!
//! Failovers move a range's leadership to a surviving replica and nothing
//! moves it back: after a broker restarts, or after re-placement made a
//! joined broker a follower, some brokers lead many ranges and others none.
//! Kafka's controller elects each partition's preferred replica again every
//! `leader.imbalance.check.interval.seconds`; tessera has no preferred
//! replica (a segment's replica set is for its life), so the active
//! controller instead evens out the number of ranges each live broker leads.
//!
//! A move hands a range's next segment to one of its active segment's
//! followers: the segment is sealed by quorum, the primary fenced first so
//! that the follower catches up and holds the end too, and the follower
//! (preferred among equal ends) opens the next segment, leader epoch + 1,
//! with the same replicas. Nothing is copied.
//!
//! No churn: a move from `from` to follower `to` is planned only when
//! `leaders(from) - leaders(to) >= 2`, so each move strictly lowers the sum
//! of squared leader counts, a sequence of passes ends, and a move is never
//! undone by the next one.

use std::cmp::Reverse;
use std::collections::BTreeMap;

use tessera_metadata::{MetadataImage, SegmentId};

use crate::dense::{for_each_active, Live};

/// How good a move is: the imbalance it removes, then the lowest range,
/// the least loaded follower, the lowest broker id.
pub(crate) type MoveKey = (
    i64,
    Reverse<tessera_metadata::RangeId>,
    Reverse<i64>,
    Reverse<i32>,
);

/// One range's leadership handed to a follower of its active segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderMove {
    pub segment: SegmentId,
    /// The primary when the move was planned.
    pub from: i32,
    /// The follower to lead the next segment.
    pub to: i32,
}

/// Ranges each live, unfenced broker leads (the primaries of replicated
/// active segments; a broker leading none counts 0).
pub fn leader_load(image: &MetadataImage) -> BTreeMap<i32, i64> {
    let primaries = replicated_active_segments(image).filter_map(|s| s.primary());
    crate::replacement::live_broker_counts(image, primaries)
}

pub(crate) fn replicated_active_segments(
    image: &MetadataImage,
) -> impl Iterator<Item = std::sync::Arc<tessera_metadata::SegmentImage>> + '_ {
    image
        .ranges
        .values()
        .filter(|r| r.active && image.topics.contains_key(&r.topic_id))
        .filter_map(|r| image.active_segment(r.id))
        .filter(|s| !s.is_sealed() && s.replicas.len() > 1)
}

/// Up to `max_moves` leadership moves, the largest imbalance first (ties:
/// lowest range id, then the least loaded follower, then the lowest id).
/// Only ranges whose replicas are all live and unfenced qualify (failover
/// and controlled shutdown handle the others). The counts include the
/// moves already planned in this call.
///
/// One walk of the image, then per move only the segments that can still
/// give the best move: the primaries are taken most loaded first and the
/// followers least loaded first, each one's segments looked at, until the
/// gain of any move not seen (at most the next primary's load minus the
/// next follower's) is below the best found. The same moves as a scan of
/// every segment per move, which
/// `equivalence::fast_planners_are_the_reference_ones` checks.
pub fn plan_leader_moves(image: &MetadataImage, max_moves: usize) -> Vec<LeaderMove> {
    plan_leader_moves_except(image, max_moves, &std::collections::BTreeSet::new())
}

/// [`plan_leader_moves`] with the segments in `pinned` kept where they are
/// (they count for their primary's load, they are never moved): a caller
/// that refuses one of the moves asks again without it, and gets the next
/// best moves instead of none.
pub fn plan_leader_moves_except(
    image: &MetadataImage,
    max_moves: usize,
    pinned: &std::collections::BTreeSet<SegmentId>,
) -> Vec<LeaderMove> {
    let live = Live::of(image);
    let n = live.len();
    let mut load = vec![0i64; n];
    // Eligible segments: id, and replicas by live number.
    let mut segments: Vec<(SegmentId, Vec<u32>)> = Vec::new();
    for_each_active(image, |range, s| {
        if !image.topics.contains_key(&range.topic_id) || s.replicas.len() < 2 {
            return;
        }
        if let Some(p) = live.get(s.replicas[0]) {
            load[p] += 1;
        }
        let replicas: Option<Vec<u32>> = s
            .replicas
            .iter()
            .map(|&r| live.get(r).map(|x| x as u32))
            .collect();
        if let Some(replicas) = replicas {
            segments.push((s.id, replicas));
        }
    });
    // By primary and by follower, in range order.
    let mut led: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut followed: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (e, (id, replicas)) in segments.iter().enumerate() {
        if pinned.contains(id) {
            continue;
        }
        led[replicas[0] as usize].push(e);
        for &t in &replicas[1..] {
            followed[t as usize].push(e);
        }
    }
    let primaries: Vec<usize> = (0..n).filter(|&b| !led[b].is_empty()).collect();
    let followers: Vec<usize> = (0..n).filter(|&b| !followed[b].is_empty()).collect();
    let mut planned_segment = vec![false; segments.len()];
    let mut planned: Vec<LeaderMove> = Vec::new();
    while planned.len() < max_moves {
        let mut froms = primaries.clone();
        froms.sort_unstable_by_key(|&b| Reverse(load[b]));
        let mut tos = followers.clone();
        tos.sort_unstable_by_key(|&b| load[b]);
        let mut best: Option<(MoveKey, usize, usize)> = None;
        let offer = |e: usize, to: usize, best: &mut Option<(MoveKey, usize, usize)>| {
            let (segment, replicas) = &segments[e];
            let gain = load[replicas[0] as usize] - load[to];
            if gain < 2 {
                return;
            }
            let key = (
                gain,
                Reverse(segment.range),
                Reverse(load[to]),
                Reverse(live.ids[to]),
            );
            if best.as_ref().is_none_or(|(k, _, _)| key > *k) {
                *best = Some((key, e, to));
            }
        };
        // Both ways at once: the k-th most loaded primary's segments, and
        // the segments the k-th least loaded follower follows. A move not
        // seen yet is from a primary no more loaded than the next one to a
        // follower no less loaded than the next one: once that bound is
        // below the best gain, no move left can match it.
        for (&from, &to) in froms.iter().zip(&tos) {
            let bound = load[from] - load[to];
            if bound < 2 || best.as_ref().is_some_and(|(k, _, _)| bound < k.0) {
                break;
            }
            for &e in &led[from] {
                if !planned_segment[e] {
                    for &t in &segments[e].1[1..] {
                        offer(e, t as usize, &mut best);
                    }
                }
            }
            for &e in &followed[to] {
                if !planned_segment[e] {
                    offer(e, to, &mut best);
                }
            }
        }
        let Some((_, e, to)) = best else {
            break;
        };
        let from = segments[e].1[0] as usize;
        load[from] -= 1;
        load[to] += 1;
        planned_segment[e] = true;
        planned.push(LeaderMove {
            segment: segments[e].0,
            from: live.ids[from],
            to: live.ids[to],
        });
    }
    planned
}
