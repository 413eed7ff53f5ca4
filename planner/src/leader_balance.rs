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

/// How good a move is: the imbalance it removes, then the lowest range,
/// the least loaded follower, the lowest broker id.
type MoveKey = (
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

fn replicated_active_segments(
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
pub fn plan_leader_moves(image: &MetadataImage, max_moves: usize) -> Vec<LeaderMove> {
    let mut load = leader_load(image);
    let eligible: Vec<(SegmentId, Vec<i32>)> = replicated_active_segments(image)
        .filter(|s| s.replicas.iter().all(|r| load.contains_key(r)))
        .map(|s| (s.id, s.replicas.clone()))
        .collect();
    let mut planned: Vec<LeaderMove> = Vec::new();
    while planned.len() < max_moves {
        let mut best: Option<(MoveKey, LeaderMove)> = None;
        for (segment, replicas) in &eligible {
            if planned.iter().any(|m| m.segment == *segment) {
                continue;
            }
            let from = replicas[0];
            for &to in &replicas[1..] {
                let gain = load[&from] - load[&to];
                if gain < 2 {
                    continue;
                }
                let key = (
                    gain,
                    Reverse(segment.range),
                    Reverse(load[&to]),
                    Reverse(to),
                );
                if best.as_ref().is_none_or(|(k, _)| key > *k) {
                    let m = LeaderMove {
                        segment: *segment,
                        from,
                        to,
                    };
                    best = Some((key, m));
                }
            }
        }
        let Some((_, m)) = best else {
            break;
        };
        *load.get_mut(&m.from).expect("live") -= 1;
        *load.get_mut(&m.to).expect("live") += 1;
        planned.push(m);
    }
    planned
}
