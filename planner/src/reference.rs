//! The straightforward planners the fast ones replaced, kept as the
//! reference the tests compare them with (identical plans): a scan of
//! every eligible segment per planned move, and a creation that lists
//! every live broker's rendezvous position per block.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

use tessera_metadata::{MetadataImage, MetadataRecord, RangeId, RangeRecord, SegmentId, TopicId};
use tessera_replication::{place_replicas, place_replicas_led_by, BrokerCandidate};

use crate::leader_balance::{leader_load, replicated_active_segments, MoveKey};
use crate::replacement::{replica_load, Swap};
use crate::{
    candidates, open_segment, partitions_led, placement_error, LeaderMove, PlanError, Replacement,
};

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

pub(crate) fn spread_ranges(
    image: &MetadataImage,
    topic_id: TopicId,
    blocks: &[(u32, u32)],
    replication_factor: usize,
) -> Result<Vec<MetadataRecord>, PlanError> {
    let brokers = candidates(image);
    let mut led = partitions_led(image);
    let mut held = crate::replicas_held(image);
    let mut leading_this_topic = Vec::new();
    let mut records = Vec::with_capacity(blocks.len() * 2);
    for (i, &(lo, hi)) in blocks.iter().enumerate() {
        let range_id = image.next_range_id() + i as RangeId;
        let segment = SegmentId::new(range_id, 0);
        let key = segment.to_string();
        // The rendezvous order of live brokers for this segment breaks ties.
        let order = place_replicas(&key, &brokers, led.len().max(1)).unwrap_or_default();
        let primary = led
            .iter()
            .filter(|(b, _)| {
                !leading_this_topic.contains(*b) || leading_this_topic.len() >= led.len()
            })
            .min_by_key(|(b, n)| {
                (
                    **n,
                    order.iter().position(|o| o == *b).unwrap_or(usize::MAX),
                )
            })
            .map(|(b, _)| *b);
        let mut replicas = place_replicas_led_by(&key, &brokers, primary, replication_factor)
            .map_err(placement_error)?;
        if let Some(&p) = replicas.first() {
            *led.entry(p).or_default() += u64::from(hi - lo);
            leading_this_topic.push(p);
            // Followers: in a rack the set does not use yet, then holding
            // the fewest active segments, then in rendezvous order.
            let rack = |b: i32| {
                image
                    .brokers
                    .get(&b)
                    .and_then(|x| x.registration.rack.clone())
            };
            let full = place_replicas(&key, &brokers, held.len()).unwrap_or_default();
            let mut set = vec![p];
            while set.len() < replicas.len() {
                let next = full
                    .iter()
                    .enumerate()
                    .filter(|(_, b)| !set.contains(b))
                    .min_by_key(|(at, b)| {
                        let used = rack(**b)
                            .is_some_and(|r| set.iter().any(|m| rack(*m) == Some(r.clone())));
                        (used, held.get(b).copied().unwrap_or(0), *at)
                    })
                    .map(|(_, b)| *b);
                match next {
                    Some(b) => set.push(b),
                    None => break,
                }
            }
            if set.len() == replicas.len() {
                replicas = set;
                for r in &replicas {
                    *held.entry(*r).or_default() += 1;
                }
            }
        }
        records.push(MetadataRecord::CreateRange(RangeRecord {
            range_id,
            topic_id,
            lo,
            hi,
            parents: vec![],
        }));
        records.push(open_segment(segment, replicas, 0));
    }
    Ok(records)
}
