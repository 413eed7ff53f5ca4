//! Re-placement of existing ranges at a segment boundary.
//!
//! A segment keeps its replica set for life, and a roll opens the next one
//! on the same set, so without this a broker that joins a cluster with
//! steady topics would only ever get new topics, failovers' next segments
//! and healing copies. The active controller therefore looks, every
//! `replica.placement.rebalance.interval.ms`, for ranges whose active
//! segment sits on brokers that hold clearly more of the cluster's active
//! segments than a live broker outside its set (a broker that just joined
//! holds none), and re-places a bounded number of them: the active segment
//! is sealed by quorum, as a failover does, and the next segment opens on
//! the same primary with one follower swapped. Nothing written is copied:
//! sealed segments stay on their replicas and are read from there.
//!
//! Only followers move. The primary of a range holds its history and
//! rebuilds the idempotent producers' state from it when it reopens the
//! range on the next segment (as after a restart); a broker that has none
//! of the range's data would not know those producers.
//!
//! No churn. A swap of follower `from` for broker `to` is planned only
//! when it keeps the set's rack spread and
//! - `load(from) - load(to) >= 2` (load: replicas of active segments), or
//! - it spreads the set over one more rack and `load(from) >= load(to)`.
//!
//! Each swap strictly improves `(racks spread over, -sum of load²)`, so a
//! sequence of passes ends, and the reverse swap is never planned right
//! after (a placement that is good stays put, nothing ping-pongs). A
//! cluster of one broker, or one where every range is on every live broker
//! (RF = N of N), has no broker outside any set and never re-places.

use std::collections::{BTreeMap, BTreeSet};

use tessera_metadata::{MetadataImage, MetadataRecord, SegmentId};
use tessera_replication::{place_replicas, BrokerCandidate};

use crate::{seal_by_quorum, PlanError, QuorumSeal};

/// One range's next segment re-placed: its active `segment` is sealed by
/// quorum and the next one opens on `replicas` (the same primary, follower
/// `from` swapped for broker `to`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replacement {
    pub segment: SegmentId,
    /// The active segment's replica set when the move was planned.
    pub current: Vec<i32>,
    /// The next segment's replica set.
    pub replicas: Vec<i32>,
    pub from: i32,
    pub to: i32,
}

/// Replicas of active segments (primary or follower) held by each live,
/// unfenced broker: what re-placement balances.
pub fn replica_load(image: &MetadataImage) -> BTreeMap<i32, i64> {
    let held = image
        .ranges
        .values()
        .filter(|r| r.active)
        .filter_map(|r| image.active_segment(r.id))
        .flat_map(|seg| seg.replicas.clone());
    live_broker_counts(image, held)
}

/// How often each live, unfenced broker appears in `brokers` (0 for one
/// that does not; others are not counted).
pub(crate) fn live_broker_counts(
    image: &MetadataImage,
    brokers: impl Iterator<Item = i32>,
) -> BTreeMap<i32, i64> {
    let mut load: BTreeMap<i32, i64> = image
        .brokers
        .values()
        .filter(|b| !b.fenced)
        .map(|b| (b.registration.broker_id, 0))
        .collect();
    for b in brokers {
        if let Some(n) = load.get_mut(&b) {
            *n += 1;
        }
    }
    load
}

/// A swap that may be planned, and how much it gains.
#[derive(Clone, Debug)]
struct Swap {
    rack_gain: i64,
    load_gain: i64,
    from: i32,
    to: i32,
}

impl Swap {
    fn key(&self) -> (i64, i64) {
        (self.rack_gain, self.load_gain)
    }
}

fn racks(image: &MetadataImage, set: impl Iterator<Item = i32>) -> i64 {
    // A broker without a rack counts as a rack of its own.
    let mut seen = BTreeSet::new();
    for b in set {
        let rack = image
            .brokers
            .get(&b)
            .and_then(|x| x.registration.rack.clone());
        seen.insert(rack.unwrap_or_else(|| format!("\0broker-{b}")));
    }
    seen.len() as i64
}

/// The best swap for one active segment under `load`, if any.
fn best_swap(
    image: &MetadataImage,
    segment: SegmentId,
    replicas: &[i32],
    load: &BTreeMap<i32, i64>,
) -> Option<Swap> {
    let before = racks(image, replicas.iter().copied());
    let mut swaps = Vec::new();
    for &from in &replicas[1..] {
        for (&to, &to_load) in load {
            if replicas.contains(&to) {
                continue;
            }
            let after = racks(
                image,
                replicas.iter().map(|&r| if r == from { to } else { r }),
            );
            let rack_gain = after - before;
            let load_gain = load[&from] - to_load;
            let worth = rack_gain >= 0 && (load_gain >= 2 || (rack_gain > 0 && load_gain >= 0));
            if worth {
                swaps.push(Swap {
                    rack_gain,
                    load_gain,
                    from,
                    to,
                });
            }
        }
    }
    let best = swaps.iter().map(Swap::key).max()?;
    swaps.retain(|s| s.key() == best);
    // Among equally good swaps: the most loaded follower leaves (the
    // highest id on a tie), and the broker that takes its place is the one
    // weighted rendezvous hashing picks for the next segment.
    let from = swaps
        .iter()
        .map(|s| (load[&s.from], s.from))
        .max()
        .map(|(_, f)| f)?;
    swaps.retain(|s| s.from == from);
    let candidates: Vec<BrokerCandidate> = swaps
        .iter()
        .map(|s| BrokerCandidate {
            broker_id: s.to,
            rack: None,
            fenced: false,
            load: load[&s.to].max(0) as u64,
        })
        .collect();
    let next = SegmentId::new(segment.range, segment.seq + 1);
    let to = place_replicas(&next.to_string(), &candidates, 1).ok()?[0];
    swaps.into_iter().find(|s| s.to == to)
}

/// The ranges whose next segment should open elsewhere, at most
/// `max_ranges` of them, best improvement first (ties: lowest range id).
///
/// A range qualifies when its active segment is replicated (RF > 1) and
/// every replica is live and unfenced (a failover or controlled shutdown
/// handles the others). See the module docs for when a swap is worth it.
/// The load counts the swaps already planned in this call, so one pass
/// does not pile every range onto the same new broker.
pub fn plan_replacements(image: &MetadataImage, max_ranges: usize) -> Vec<Replacement> {
    let mut load = replica_load(image);
    let live = |b: &i32| load.contains_key(b);
    let eligible: Vec<(SegmentId, Vec<i32>)> = image
        .ranges
        .values()
        .filter(|r| r.active && image.topics.contains_key(&r.topic_id))
        .filter_map(|r| image.active_segment(r.id))
        .filter(|s| !s.is_sealed() && s.replicas.len() > 1 && s.replicas.iter().all(live))
        .map(|s| (s.id, s.replicas.clone()))
        .collect();
    let mut planned: Vec<Replacement> = Vec::new();
    while planned.len() < max_ranges {
        let mut best: Option<(SegmentId, Vec<i32>, Swap)> = None;
        for (segment, replicas) in &eligible {
            if planned.iter().any(|p| p.segment == *segment) {
                continue;
            }
            let Some(swap) = best_swap(image, *segment, replicas, &load) else {
                continue;
            };
            if best.as_ref().is_none_or(|(_, _, b)| swap.key() > b.key()) {
                best = Some((*segment, replicas.clone(), swap));
            }
        }
        let Some((segment, current, swap)) = best else {
            break;
        };
        *load.get_mut(&swap.from).expect("live") -= 1;
        *load.get_mut(&swap.to).expect("live") += 1;
        let replicas = current
            .iter()
            .map(|&r| if r == swap.from { swap.to } else { r })
            .collect();
        planned.push(Replacement {
            segment,
            current,
            replicas,
            from: swap.from,
            to: swap.to,
        });
    }
    planned
}

/// The entry that carries out a [`Replacement`] once its active segment's
/// replicas are fenced and a quorum reported (`seal`): `SealSegment` at
/// the quorum's end and `OpenSegment(seq + 1)` on the planned replicas,
/// one leader epoch up although leadership does not move: the primary's
/// log may have rolled to `seq + 1` on its own before the fence (its
/// unrecorded roll, discarded as the log closes), and followers tell that
/// incarnation of the number from the new one only by the epoch. With the
/// same epoch, the closing log's stream of its own `seq + 1` was taken by
/// followers as the new segment's first bytes (a 25-minute fault run:
/// three copies of one segment with different histories, unrepairable).
///
/// The replicas are fenced already, so the segment must be sealed whatever
/// happened since the plan: if the image moved on (the set changed, a
/// replica or the new broker was fenced) or the end is held by another
/// replica than the primary, this is an ordinary [`seal_by_quorum`] (the
/// holder leads the next segment, one epoch up, fenced replicas replaced).
pub fn seal_and_replace(
    image: &MetadataImage,
    seal: &QuorumSeal,
    plan: &Replacement,
) -> Result<Vec<MetadataRecord>, PlanError> {
    let Some(segment) = image.segments.get(&seal.segment) else {
        return seal_by_quorum(image, seal);
    };
    let live = |id: &i32| image.brokers.get(id).is_some_and(|b| !b.fenced);
    let still_valid = seal.segment == plan.segment
        && !segment.is_sealed()
        && segment.replicas == plan.current
        && plan.replicas.first() == Some(&seal.holder)
        && segment.primary() == Some(seal.holder)
        && plan.replicas.iter().all(live)
        && crate::active_range(image, seal.segment.range).is_ok()
        && !image
            .segments
            .contains_key(&SegmentId::new(seal.segment.range, seal.segment.seq + 1));
    if !still_valid {
        return seal_by_quorum(image, seal);
    }
    let range = crate::active_range(image, seal.segment.range)?;
    if seal.spans.iter().any(|s| !range.contains(s.partition)) {
        return Err(PlanError::InvalidMove(
            "a span of a partition outside the range".into(),
        ));
    }
    Ok(crate::seal_and_open_next(
        seal,
        plan.replicas.clone(),
        segment.leader_epoch,
    ))
}

/// The followers of active segments that leave at the next segment
/// boundary, now: a follower whose broker is fenced or unregistered (the
/// controller's view) or that the primary reports out of sync for longer
/// than `replica.lag.time.max.ms` (`out_of_sync`: segment and follower).
/// Kafka keeps a dead replica in the assignment until an operator
/// reassigns it; here the range's next segment opens without it, so a
/// replica set never carries a dead member past the next boundary and
/// RF=2 does not stall on one failure.
///
/// Each leaving follower is replaced by a live broker outside the set
/// (least loaded first, new racks first, weighted rendezvous among
/// equals). A fenced follower with no broker to replace it is dropped (the
/// set shrinks, as Kafka's ISR does); a live one out of sync is replaced
/// only when a broker can take its place (dropping it would only add it
/// back). A set smaller than the topic's replication factor whose members
/// are all live grows back when a broker is free. The primary stays
/// (only followers change; the primary holds the range's history), and
/// only segments whose primary is live are planned (failover handles the
/// others). At most `max_ranges` plans; the load counts those planned.
pub fn plan_follower_replacements(
    image: &MetadataImage,
    out_of_sync: &BTreeSet<(SegmentId, i32)>,
    max_ranges: usize,
) -> Vec<Replacement> {
    let mut load = replica_load(image);
    let live = |b: &i32| image.brokers.get(b).is_some_and(|x| !x.fenced);
    let mut planned = Vec::new();
    for range in image.ranges.values().filter(|r| r.active) {
        if planned.len() >= max_ranges {
            break;
        }
        let Some(topic) = image.topics.get(&range.topic_id) else {
            continue;
        };
        let Some(seg) = image.active_segment(range.id) else {
            continue;
        };
        let Some(primary) = seg.primary() else {
            continue;
        };
        if seg.is_sealed() || !live(&primary) {
            continue;
        }
        let want = (topic.replication_factor.max(1) as usize).max(seg.replicas.len());
        let dead: Vec<i32> = seg.replicas[1..]
            .iter()
            .copied()
            .filter(|f| !live(f))
            .collect();
        let lagging: Vec<i32> = seg.replicas[1..]
            .iter()
            .copied()
            .filter(|f| live(f) && out_of_sync.contains(&(seg.id, *f)))
            .collect();
        let keep: Vec<i32> = seg
            .replicas
            .iter()
            .copied()
            .filter(|r| !dead.contains(r) && !lagging.contains(r))
            .collect();
        let spares = ranked_spares(image, seg.id, &seg.replicas, &keep, &load);
        let mut replicas = keep.clone();
        let mut added = Vec::new();
        for s in spares {
            if replicas.len() >= want {
                break;
            }
            replicas.push(s);
            added.push(s);
        }
        // A lagging follower no broker can replace stays where it is.
        for &f in &lagging {
            if replicas.len() < want && !replicas.contains(&f) {
                replicas.push(f);
            }
        }
        if replicas == seg.replicas
            || replicas.iter().collect::<BTreeSet<_>>() == seg.replicas.iter().collect()
        {
            continue;
        }
        for r in &added {
            if let Some(n) = load.get_mut(r) {
                *n += 1;
            }
        }
        let from = dead
            .iter()
            .chain(&lagging)
            .copied()
            .find(|r| !replicas.contains(r))
            .unwrap_or(-1);
        planned.push(Replacement {
            segment: seg.id,
            current: seg.replicas.clone(),
            replicas,
            from,
            to: added.first().copied().unwrap_or(-1),
        });
    }
    planned
}

/// Live brokers outside `current`, in the order they should join a set
/// that keeps `keep`: brokers in racks `keep` does not use first, then by
/// load, then as weighted rendezvous hashing places the next segment.
pub(crate) fn ranked_spares(
    image: &MetadataImage,
    segment: SegmentId,
    current: &[i32],
    keep: &[i32],
    load: &BTreeMap<i32, i64>,
) -> Vec<i32> {
    let rack_of = |b: &i32| {
        image
            .brokers
            .get(b)
            .and_then(|x| x.registration.rack.clone())
    };
    let used: BTreeSet<Option<String>> = keep.iter().map(rack_of).filter(Option::is_some).collect();
    let candidates: Vec<BrokerCandidate> = load
        .iter()
        .filter(|(b, _)| !current.contains(b))
        .map(|(&b, &l)| BrokerCandidate {
            broker_id: b,
            rack: None,
            fenced: false,
            load: l.max(0) as u64,
        })
        .collect();
    if candidates.is_empty() {
        return Vec::new();
    }
    let next = SegmentId::new(segment.range, segment.seq + 1);
    let hashed =
        place_replicas(&next.to_string(), &candidates, candidates.len()).unwrap_or_default();
    let mut ranked: Vec<(bool, i64, usize, i32)> = hashed
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let rack = rack_of(b);
            let new_rack = rack.is_none() || !used.contains(&rack);
            (!new_rack, load[b], i, *b)
        })
        .collect();
    ranked.sort();
    ranked.into_iter().map(|(_, _, _, b)| b).collect()
}
