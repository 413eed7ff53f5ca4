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

use tessera_metadata::{MetadataImage, MetadataRecord, SegmentId, SegmentImage};
use tessera_replication::{place_replicas, BrokerCandidate};

use crate::dense::{for_each_active, Live};
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
pub(crate) struct Swap {
    pub(crate) rack_gain: i64,
    pub(crate) load_gain: i64,
    pub(crate) from: i32,
    pub(crate) to: i32,
}

impl Swap {
    pub(crate) fn key(&self) -> (i64, i64) {
        (self.rack_gain, self.load_gain)
    }
}

/// The ranges whose next segment should open elsewhere, at most
/// `max_ranges` of them, best improvement first (ties: lowest range id).
///
/// A range qualifies when its active segment is replicated (RF > 1) and
/// every replica is live and unfenced (a failover or controlled shutdown
/// handles the others). See the module docs for when a swap is worth it.
/// The load counts the swaps already planned in this call, so one pass
/// does not pile every range onto the same new broker.
///
/// One walk of the image, then per planned swap: a swap gains at most one
/// rack, and only a set with two replicas in one rack can gain one (those
/// sets, counted once, are looked at every time); any other swap of
/// follower `from` gains at most `load(from) - min load`, so the followers
/// are taken most loaded first and the search stops at the first whose
/// bound is below the best gain found. A set's best swap needs, per
/// follower, only the least loaded broker outside the set in the racks
/// that keep (or add to) its spread: the brokers of each rack sit in
/// ascending load. The chosen range's swap is then picked among all its
/// equal swaps as before (weighted rendezvous). The same plans as a scan of
/// every set against every broker per swap, which
/// `equivalence::fast_planners_are_the_reference_ones` checks.
pub fn plan_replacements(image: &MetadataImage, max_ranges: usize) -> Vec<Replacement> {
    let live = Live::of(image);
    let n = live.len();
    let mut load = vec![0i64; n];
    let (rack, racks) = rack_numbers(image, &live);
    let mut sets: Vec<Set> = Vec::new();
    for_each_active(image, |range, s| {
        for &r in &s.replicas {
            if let Some(x) = live.get(r) {
                load[x] += 1;
            }
        }
        if !image.topics.contains_key(&range.topic_id) || s.replicas.len() < 2 {
            return;
        }
        let replicas: Option<Vec<u32>> = s
            .replicas
            .iter()
            .map(|&r| live.get(r).map(|x| x as u32))
            .collect();
        let Some(replicas) = replicas else {
            return;
        };
        let distinct = replicas
            .iter()
            .enumerate()
            .all(|(i, r)| !replicas[..i].contains(r));
        let mut seen: Vec<u32> = replicas.iter().map(|&r| rack[r as usize]).collect();
        seen.sort_unstable();
        seen.dedup();
        sets.push(Set {
            segment: s.id,
            ids: s.replicas.clone(),
            // Sets with a repeated broker take the exhaustive way.
            exhaustive: !distinct,
            shared_rack: seen.len() < replicas.len(),
            replicas,
        });
    });
    let mut followed: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut always: Vec<usize> = Vec::new();
    for (e, set) in sets.iter().enumerate() {
        if set.exhaustive || set.shared_rack {
            always.push(e);
        } else {
            for &f in &set.replicas[1..] {
                followed[f as usize].push(e);
            }
        }
    }
    let followers: Vec<usize> = (0..n).filter(|&b| !followed[b].is_empty()).collect();
    let mut planned_set = vec![false; sets.len()];
    let mut planned: Vec<Replacement> = Vec::new();
    while planned.len() < max_ranges {
        let view = LoadView::new(&load, &rack, racks);
        let mut best: Option<((i64, i64), usize)> = None;
        let consider =
            |e: usize, key: Option<(i64, i64)>, best: &mut Option<((i64, i64), usize)>| {
                let Some(key) = key else { return };
                let better = match best {
                    None => true,
                    Some((k, b)) => {
                        key > *k || (key == *k && sets[e].segment.range < sets[*b].segment.range)
                    }
                };
                if better {
                    *best = Some((key, e));
                }
            };
        for &e in &always {
            if planned_set[e] {
                continue;
            }
            let key = if sets[e].exhaustive {
                exhaustive_swaps(&sets[e].replicas, &load, &rack)
                    .iter()
                    .map(Swap::key)
                    .max()
            } else {
                view.best_key(&sets[e].replicas)
            };
            consider(e, key, &mut best);
        }
        if best.is_none_or(|(k, _)| k.0 < 1) {
            let mut order = followers.clone();
            order.sort_unstable_by_key(|&b| std::cmp::Reverse(load[b]));
            for from in order {
                let bound = load[from] - view.min;
                if bound < 2 || best.is_some_and(|(k, _)| bound < k.1) {
                    break;
                }
                for &e in &followed[from] {
                    if planned_set[e] {
                        continue;
                    }
                    consider(e, view.best_key(&sets[e].replicas), &mut best);
                }
            }
        }
        let Some((_, e)) = best else {
            break;
        };
        let set = &sets[e];
        let Some(swap) = choose_swap(
            set.segment,
            exhaustive_swaps(&set.replicas, &load, &rack),
            &load,
            &live.ids,
        ) else {
            break;
        };
        let (from, to) = (swap.from as usize, swap.to as usize);
        load[from] -= 1;
        load[to] += 1;
        planned_set[e] = true;
        let (from, to) = (live.ids[from], live.ids[to]);
        let replicas = set
            .ids
            .iter()
            .map(|&r| if r == from { to } else { r })
            .collect();
        planned.push(Replacement {
            segment: set.segment,
            current: set.ids.clone(),
            replicas,
            from,
            to,
        });
    }
    planned
}

/// Each live broker's rack, numbered, and how many racks there are. A
/// broker without a rack counts as a rack of its own (as `racks`).
fn rack_numbers(image: &MetadataImage, live: &Live) -> (Vec<u32>, usize) {
    let mut names: BTreeMap<String, u32> = BTreeMap::new();
    let rack = live
        .ids
        .iter()
        .map(|&b| {
            let name = image
                .brokers
                .get(&b)
                .and_then(|x| x.registration.rack.clone())
                .unwrap_or_else(|| format!("\0broker-{b}"));
            let next = names.len() as u32;
            *names.entry(name).or_insert(next)
        })
        .collect();
    (rack, names.len())
}

/// An eligible active segment's replica set.
struct Set {
    segment: SegmentId,
    ids: Vec<i32>,
    /// By live number.
    replicas: Vec<u32>,
    /// A broker listed twice: every swap is enumerated.
    exhaustive: bool,
    /// Two replicas in one rack: a swap may gain a rack.
    shared_rack: bool,
}

/// The live brokers by rack in ascending load, for one planned swap.
struct LoadView<'a> {
    load: &'a [i64],
    rack: &'a [u32],
    /// Each rack's brokers, least loaded first.
    by_rack: Vec<Vec<u32>>,
    /// Racks by the load of their least loaded broker.
    rack_order: Vec<u32>,
    /// The least load of all.
    min: i64,
}

impl<'a> LoadView<'a> {
    fn new(load: &'a [i64], rack: &'a [u32], racks: usize) -> Self {
        let mut by_rack: Vec<Vec<u32>> = vec![Vec::new(); racks];
        for (b, &r) in rack.iter().enumerate() {
            by_rack[r as usize].push(b as u32);
        }
        for brokers in &mut by_rack {
            brokers.sort_unstable_by_key(|&b| load[b as usize]);
        }
        let mut rack_order: Vec<u32> = (0..racks as u32)
            .filter(|&r| !by_rack[r as usize].is_empty())
            .collect();
        rack_order.sort_unstable_by_key(|&r| load[by_rack[r as usize][0] as usize]);
        let min = load.iter().copied().min().unwrap_or(0);
        LoadView {
            load,
            rack,
            by_rack,
            rack_order,
            min,
        }
    }

    /// The least load of a broker of rack `r` outside `set`.
    fn least_in(&self, r: u32, set: &[u32]) -> Option<i64> {
        self.by_rack[r as usize]
            .iter()
            .find(|b| !set.contains(b))
            .map(|&b| self.load[b as usize])
    }

    /// The least load of a broker outside `set` whose rack is not in
    /// `taken`.
    fn least_elsewhere(&self, taken: &[u32], set: &[u32]) -> Option<i64> {
        let mut least: Option<i64> = None;
        for &r in &self.rack_order {
            let floor = self.load[self.by_rack[r as usize][0] as usize];
            if least.is_some_and(|l| floor >= l) {
                break;
            }
            if taken.contains(&r) {
                continue;
            }
            if let Some(l) = self.least_in(r, set) {
                least = Some(least.map_or(l, |x| x.min(l)));
            }
        }
        least
    }

    /// The key (rack gain, load gain) of the best swap worth making for a
    /// set of distinct live brokers, if any (as [`exhaustive_swaps`]).
    fn best_key(&self, set: &[u32]) -> Option<(i64, i64)> {
        let racks: Vec<u32> = set.iter().map(|&b| self.rack[b as usize]).collect();
        let mut best: Option<(i64, i64)> = None;
        let mut offer = |key: (i64, i64)| {
            if best.is_none_or(|b| key > b) {
                best = Some(key);
            }
        };
        for (j, &from) in set.iter().enumerate().skip(1) {
            let own = racks[j];
            let from_load = self.load[from as usize];
            let shared = racks.iter().filter(|&&r| r == own).count() > 1;
            if shared {
                // Leaving keeps every rack: a broker of a new rack adds
                // one, a broker of a rack the set has keeps the spread.
                if let Some(m) = self.least_elsewhere(&racks, set) {
                    if from_load - m >= 0 {
                        offer((1, from_load - m));
                    }
                }
                let mut distinct = racks.clone();
                distinct.sort_unstable();
                distinct.dedup();
                for r in distinct {
                    if let Some(m) = self.least_in(r, set) {
                        if from_load - m >= 2 {
                            offer((0, from_load - m));
                        }
                    }
                }
            } else {
                // Leaving loses its rack: only a broker of a rack the rest
                // does not use (its own included) keeps the spread.
                let rest: Vec<u32> = racks
                    .iter()
                    .enumerate()
                    .filter(|&(i, _)| i != j)
                    .map(|(_, &r)| r)
                    .collect();
                if let Some(m) = self.least_elsewhere(&rest, set) {
                    if from_load - m >= 2 {
                        offer((0, from_load - m));
                    }
                }
            }
        }
        best
    }
}

/// Every swap worth making for `set` (by live number) under `load`, as
/// the module docs define them: each follower against each live broker
/// outside the set, the racks counted after the swap.
fn exhaustive_swaps(set: &[u32], load: &[i64], rack: &[u32]) -> Vec<Swap> {
    let spread = |members: &mut dyn Iterator<Item = u32>| {
        let mut r: Vec<u32> = members.map(|b| rack[b as usize]).collect();
        r.sort_unstable();
        r.dedup();
        r.len() as i64
    };
    let before = spread(&mut set.iter().copied());
    let mut swaps = Vec::new();
    for &from in &set[1..] {
        for to in 0..load.len() as u32 {
            if set.contains(&to) {
                continue;
            }
            let after = spread(&mut set.iter().map(|&r| if r == from { to } else { r }));
            let rack_gain = after - before;
            let load_gain = load[from as usize] - load[to as usize];
            let worth = rack_gain >= 0 && (load_gain >= 2 || (rack_gain > 0 && load_gain >= 0));
            if worth {
                swaps.push(Swap {
                    rack_gain,
                    load_gain,
                    from: from as i32,
                    to: to as i32,
                });
            }
        }
    }
    swaps
}

/// The swap made among `swaps` (by live number): the best key; the most
/// loaded follower leaves (the highest id on a tie: numbers are in id
/// order), and the broker that takes its place is the one weighted
/// rendezvous hashing picks for the next segment.
fn choose_swap(
    segment: SegmentId,
    mut swaps: Vec<Swap>,
    load: &[i64],
    ids: &[i32],
) -> Option<Swap> {
    let best = swaps.iter().map(Swap::key).max()?;
    swaps.retain(|s| s.key() == best);
    let from = swaps
        .iter()
        .map(|s| (load[s.from as usize], s.from))
        .max()
        .map(|(_, f)| f)?;
    swaps.retain(|s| s.from == from);
    let candidates: Vec<BrokerCandidate> = swaps
        .iter()
        .map(|s| BrokerCandidate {
            broker_id: ids[s.to as usize],
            rack: None,
            fenced: false,
            load: load[s.to as usize].max(0) as u64,
        })
        .collect();
    let next = SegmentId::new(segment.range, segment.seq + 1);
    let to = place_replicas(&next.to_string(), &candidates, 1).ok()?[0];
    swaps.into_iter().find(|s| ids[s.to as usize] == to)
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
/// An unreplicated range's move ([`Replacement::moves_primary`]) opens the
/// next segment on the new broker, its only replica sealing it.
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
        && (plan.replicas.first() == Some(&seal.holder)
            || (plan.moves_primary() && plan.from == seal.holder))
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
    let mut planned = Vec::new();
    for range in image.ranges.values().filter(|r| r.active) {
        if planned.len() >= max_ranges {
            break;
        }
        let Some(seg) = image.active_segment(range.id) else {
            continue;
        };
        let Some(plan) = follower_replacement(image, &seg, out_of_sync, &load) else {
            continue;
        };
        for r in plan.replicas.iter().filter(|r| !plan.current.contains(r)) {
            if let Some(n) = load.get_mut(r) {
                *n += 1;
            }
        }
        planned.push(plan);
    }
    planned
}

/// [`plan_follower_replacements`] for one active segment `seg` under
/// `load`: `None` when none of its followers leaves (or none can be
/// replaced and none is dead).
fn follower_replacement(
    image: &MetadataImage,
    seg: &SegmentImage,
    out_of_sync: &BTreeSet<(SegmentId, i32)>,
    load: &BTreeMap<i32, i64>,
) -> Option<Replacement> {
    let live = |b: &i32| image.brokers.get(b).is_some_and(|x| !x.fenced);
    let range = image.ranges.get(&seg.id.range).filter(|r| r.active)?;
    let topic = image.topics.get(&range.topic_id)?;
    let primary = seg.primary()?;
    if seg.is_sealed() || !live(&primary) {
        return None;
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
    let spares = ranked_spares(image, seg.id, &seg.replicas, &keep, load);
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
        return None;
    }
    let from = dead
        .iter()
        .chain(&lagging)
        .copied()
        .find(|r| !replicas.contains(r))
        .unwrap_or(-1);
    Some(Replacement {
        segment: seg.id,
        current: seg.replicas.clone(),
        replicas,
        from,
        to: added.first().copied().unwrap_or(-1),
    })
}

/// The replica set of the segment a primary's own roll opens after
/// `rolled` (the range's active segment in `image`, which the roll seals):
/// every segment boundary is a placement decision, not only the ones the
/// active controller makes by sealing. `None` keeps the set.
///
/// The same two rules as the controller's, for this one set and with
/// nothing sealed early: a follower whose broker is fenced (a controlled
/// shutdown drains it) or unregistered, or that the primary has seen out of
/// sync longer than `replica.lag.time.max.ms` (`out_of_sync`, keyed by
/// `rolled`), is replaced as [`plan_follower_replacements`] would; else one
/// follower is swapped for a less loaded broker when
/// [`plan_replacements`]' no-churn rule holds (two active segments fewer,
/// or one more rack). The primary stays: it holds the range's history and
/// its producers' state (leadership moves are the load balance's), and a
/// set never shrinks below two at a roll (the log is replicated; only a
/// seal opens an unreplicated one). Unreplicated ranges are left to the
/// controller, which moves them whole.
pub fn place_at_roll(
    image: &MetadataImage,
    rolled: SegmentId,
    out_of_sync: &BTreeSet<(SegmentId, i32)>,
) -> Option<Vec<i32>> {
    place_at_roll_with(image, rolled, out_of_sync, &replica_load(image))
}

/// [`place_at_roll`] with the replicas of active segments each live broker
/// holds (`load`, [`replica_load`] of `image`) counted already, as a
/// controller keeping [`crate::PlacementLoad`] has them: no walk of the
/// image per roll.
pub fn place_at_roll_with(
    image: &MetadataImage,
    rolled: SegmentId,
    out_of_sync: &BTreeSet<(SegmentId, i32)>,
    load: &BTreeMap<i32, i64>,
) -> Option<Vec<i32>> {
    let seg = image.segments.get(&rolled)?;
    if seg.is_sealed()
        || seg.replicas.len() < 2
        || image
            .segments
            .contains_key(&SegmentId::new(rolled.range, rolled.seq + 1))
    {
        return None;
    }
    if let Some(plan) = follower_replacement(image, seg, out_of_sync, load) {
        return (plan.replicas.len() >= 2).then_some(plan.replicas);
    }
    let live = Live::of(image);
    let set: Vec<u32> = seg
        .replicas
        .iter()
        .map(|&r| live.get(r).map(|x| x as u32))
        .collect::<Option<_>>()?;
    let (rack, _) = rack_numbers(image, &live);
    let counts: Vec<i64> = live
        .ids
        .iter()
        .map(|b| load.get(b).copied().unwrap_or(0))
        .collect();
    let swap = choose_swap(
        seg.id,
        exhaustive_swaps(&set, &counts, &rack),
        &counts,
        &live.ids,
    )?;
    let (from, to) = (live.ids[swap.from as usize], live.ids[swap.to as usize]);
    Some(
        seg.replicas
            .iter()
            .map(|&r| if r == from { to } else { r })
            .collect(),
    )
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
