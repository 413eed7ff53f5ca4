//! Ranges without followers (replication factor 1) move whole at a
//! segment boundary.
//!
//! A replicated range changes primary by handing its next segment to a
//! follower that already holds the current one. An unreplicated range has
//! no follower, so its primary `from` moves by a boundary made on purpose:
//! the active segment is sealed (fenced on `from`, which writes the
//! producer snapshot where the next segment starts) and the next segment
//! opens on broker `to`, one leader epoch up. Nothing is copied: `to`
//! fetches that snapshot from `from` and reads the sealed history from it
//! remotely, as a replicated range's new primary reads segments placed
//! elsewhere. (Reads of that history need `from` up, as every read of an
//! unreplicated range does.)
//!
//! No churn: a move is planned only when `load(from) - load(to) >= 2`
//! (load: replicas of active segments, as re-placement counts them), so
//! each move lowers the sum of squared loads and a sequence of passes ends;
//! the reverse move is never worth it right after.

use std::collections::BTreeMap;

use tessera_metadata::{MetadataImage, SegmentId};

use crate::dense::for_each_active;
use crate::replacement::{replica_load, Replacement};

impl Replacement {
    /// The unreplicated range of `segment` moved from its only replica
    /// `from` to broker `to` at the boundary.
    pub fn primary_move(segment: SegmentId, from: i32, to: i32) -> Self {
        Replacement {
            segment,
            current: vec![from],
            replicas: vec![to],
            from,
            to,
        }
    }

    /// Whether this re-placement moves an unreplicated range's primary
    /// (the next segment opens on a broker that holds none of it).
    pub fn moves_primary(&self) -> bool {
        self.current == [self.from] && self.replicas == [self.to] && self.from != self.to
    }
}

impl crate::LeaderMove {
    /// This leader move as the re-placement that carries it out when its
    /// range is unreplicated (its segment's only replica is `from`): the
    /// range moves whole. `None`: a replicated range, handed to a follower.
    pub fn as_primary_move(&self, image: &MetadataImage) -> Option<Replacement> {
        image
            .segments
            .get(&self.segment)
            .is_some_and(|s| s.replicas == [self.from])
            .then(|| Replacement::primary_move(self.segment, self.from, self.to))
    }
}

/// The unreplicated active segments (one replica, live) of existing
/// topics, by their primary.
fn unreplicated_by_primary(
    image: &MetadataImage,
    load: &BTreeMap<i32, i64>,
) -> BTreeMap<i32, Vec<SegmentId>> {
    let mut by_primary: BTreeMap<i32, Vec<SegmentId>> = BTreeMap::new();
    for_each_active(image, |range, s| {
        if s.replicas.len() == 1
            && image.topics.contains_key(&range.topic_id)
            && load.contains_key(&s.replicas[0])
        {
            by_primary.entry(s.replicas[0]).or_default().push(s.id);
        }
    });
    by_primary
}

/// Up to `max_ranges` moves of unreplicated ranges from the brokers
/// holding the most active segments to those holding the fewest, while
/// the difference is at least two. `load` (replicas of active segments per
/// live, unfenced broker) is updated with the moves planned. Among the
/// ranges of the broker moved from, the lowest range id goes first.
pub fn plan_unreplicated_moves(
    image: &MetadataImage,
    load: &mut BTreeMap<i32, i64>,
    max_ranges: usize,
) -> Vec<Replacement> {
    let mut by_primary = unreplicated_by_primary(image, load);
    let mut planned = Vec::new();
    while planned.len() < max_ranges {
        let from = by_primary
            .iter()
            .filter(|(_, segs)| !segs.is_empty())
            .map(|(b, _)| *b)
            .max_by_key(|b| (load[b], std::cmp::Reverse(*b)));
        let Some(from) = from else { break };
        let to = load
            .iter()
            .filter(|(b, _)| **b != from)
            .min_by_key(|(b, l)| (**l, **b))
            .map(|(b, _)| *b);
        let Some(to) = to else { break };
        if load[&from] - load[&to] < 2 {
            break;
        }
        let segs = by_primary.get_mut(&from).expect("chosen from the map");
        let segment = segs.remove(0);
        *load.get_mut(&from).expect("live") -= 1;
        *load.get_mut(&to).expect("live") += 1;
        planned.push(Replacement::primary_move(segment, from, to));
    }
    planned
}

/// Every re-placement of one look: replicated ranges' follower swaps
/// ([`crate::plan_replacements`]) first, then unreplicated ranges' moves
/// against the load those swaps leave; at most `max_ranges` in all.
pub fn plan_boundary_moves(image: &MetadataImage, max_ranges: usize) -> Vec<Replacement> {
    let mut planned = crate::plan_replacements(image, max_ranges);
    let mut load = replica_load(image);
    for p in &planned {
        if let Some(l) = load.get_mut(&p.from) {
            *l -= 1;
        }
        if let Some(l) = load.get_mut(&p.to) {
            *l += 1;
        }
    }
    let left = max_ranges.saturating_sub(planned.len());
    planned.extend(plan_unreplicated_moves(image, &mut load, left));
    planned
}
