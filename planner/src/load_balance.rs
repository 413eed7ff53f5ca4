//! Leadership balance by load: the bytes appended per second to each range
//! (what its primary writes and ships), as the primaries report them beside
//! their heartbeats.
//!
//! [`plan_leader_moves`](crate::plan_leader_moves) evens out how many
//! ranges each broker leads; that is Kafka's balance, and it is blind to a
//! topic ten times as busy as its neighbours. Here a broker whose load is
//! more than `imbalance` above the mean of the live brokers sheds ranges
//! to followers of their active segments (a leader move: nothing copied,
//! the next segment opens on the follower), each move the one that evens
//! the pair out most. An unreplicated range (one replica) has no follower:
//! it moves whole to the least loaded broker
//! ([`Replacement::primary_move`](crate::Replacement::primary_move), its
//! history read remotely), by the same rule.
//!
//! No churn, and the two balances never undo each other (rates taken as
//! fixed during a pass):
//! - a load move of a range of rate `x` from `a` to `b` needs
//!   `0 < x < load(a) - load(b)`, so it strictly lowers the sum of squared
//!   loads;
//! - a count move keeps the loads' order (`load(b) + x <= load(a) - x`),
//!   so it never raises the sum of squared loads and lowers the squared
//!   counts.
//!
//! Every move lowers `(sum of squared loads, sum of squared counts)`, so a
//! sequence of passes ends and a move is never reversed by the next.
//! Brokers within `imbalance` of the mean, or a cluster whose mean is below
//! `min_bytes_per_sec` (idle: rates are noise there), shed nothing by load;
//! in an idle cluster the count balance ignores the rates (Kafka's), and
//! crossing the floor may then undo a count move by load (the load changed).

use std::collections::BTreeMap;

use tessera_metadata::{MetadataImage, RangeId, SegmentId};

use crate::{leader_load, LeaderMove};

/// When a broker sheds load.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoadBalanceSettings {
    /// A broker whose load exceeds the mean by more than this fraction
    /// sheds ranges (0.1: 10 % above the mean).
    pub imbalance: f64,
    /// Below this mean load (bytes per second per live broker) nothing is
    /// moved by load.
    pub min_bytes_per_sec: u64,
}

/// A planned move and why.
#[derive(Clone, Debug, PartialEq)]
pub struct BalanceMove {
    pub leader_move: LeaderMove,
    /// The range's bytes appended per second.
    pub bytes_per_sec: u64,
    pub reason: String,
}

/// Bytes appended per second to each active range, from the primaries'
/// reports (`reports`: broker -> (range, rate)); a report is taken only
/// from the broker the image shows leading the range (a move makes the old
/// primary's report stale).
pub fn range_rates(
    image: &MetadataImage,
    reports: &BTreeMap<i32, Vec<(RangeId, u64)>>,
) -> BTreeMap<RangeId, u64> {
    let mut rates = BTreeMap::new();
    for (&broker, ranges) in reports {
        for &(range, rate) in ranges {
            let led = image
                .active_segment(range)
                .is_some_and(|s| !s.is_sealed() && s.primary() == Some(broker));
            if led {
                rates.insert(range, rate);
            }
        }
    }
    rates
}

/// Bytes appended per second to the ranges each live broker leads.
pub fn broker_loads(image: &MetadataImage, rates: &BTreeMap<RangeId, u64>) -> BTreeMap<i32, u64> {
    let mut load: BTreeMap<i32, u64> = leader_load(image).keys().map(|b| (*b, 0)).collect();
    for (&range, &rate) in rates {
        if let Some(p) = image.active_segment(range).and_then(|s| s.primary()) {
            if let Some(l) = load.get_mut(&p) {
                *l += rate;
            }
        }
    }
    load
}

/// Active segments whose replicas are all live: the ranges a leader move
/// (or, unreplicated, a move of the whole range) may hand over (failover
/// handles the others).
fn movable(image: &MetadataImage, live: &BTreeMap<i32, u64>) -> Vec<(SegmentId, Vec<i32>)> {
    image
        .ranges
        .values()
        .filter(|r| r.active && image.topics.contains_key(&r.topic_id))
        .filter_map(|r| image.active_segment(r.id))
        .filter(|s| {
            !s.is_sealed()
                && !s.replicas.is_empty()
                && s.replicas.iter().all(|b| live.contains_key(b))
        })
        .map(|s| (s.id, s.replicas.clone()))
        .collect()
}

/// Up to `max_moves` leader moves: first by load (module docs), then the
/// count balance's moves that keep the loads' order. A range no report
/// covers counts 0 for the loads but is not moved by count while other
/// ranges have reports (its rate is not known yet); with no reports at
/// all (the brokers do not report), the count balance is Kafka's.
pub fn plan_balance(
    image: &MetadataImage,
    rates: &BTreeMap<RangeId, u64>,
    settings: LoadBalanceSettings,
    max_moves: usize,
) -> Vec<BalanceMove> {
    let mut load = broker_loads(image, rates);
    // An idle cluster's rates are noise: the count balance is Kafka's
    // there, blind to them. Before, a restarted broker leading one range
    // that happened to report a little more than each of the three ranges
    // of the busiest broker was refused every count move, for good.
    let idle = is_idle(&load, settings);
    let mut planned = plan_load_moves(image, rates, &mut load, settings, max_moves);
    if planned.len() >= max_moves {
        return planned;
    }
    let no_rates = BTreeMap::new();
    let rates = if idle { &no_rates } else { rates };
    let mut counts = leader_load(image);
    for m in &planned {
        *counts.get_mut(&m.leader_move.from).expect("live") -= 1;
        *counts.get_mut(&m.leader_move.to).expect("live") += 1;
    }
    // The count balance's moves, minus those that would upset the loads or
    // move a range whose rate is not known yet. Each such refusal pins its
    // range and asks the count balance again: its moves are planned one
    // after the other, so refusing its best one without asking again left
    // nothing (a broker leading 3 ranges, one of them hot, and a restarted
    // one leading 1 never evened out).
    let mut pinned = std::collections::BTreeSet::new();
    'ask: for _ in 0..MAX_COUNT_REPLANS {
        let (mut load, mut counts, mut moves) = (load.clone(), counts.clone(), Vec::new());
        for m in crate::plan_leader_moves_except(image, max_moves, &pinned) {
            if planned.len() + moves.len() >= max_moves {
                break;
            }
            if planned.iter().any(|p| p.leader_move.segment == m.segment) {
                continue;
            }
            let (from, to) = (m.from, m.to);
            // With reports at all, a range without one is one whose rate is
            // not known yet (it just moved): not moved by count meanwhile.
            let Some(x) = rates
                .get(&m.segment.range)
                .copied()
                .or(rates.is_empty().then_some(0))
            else {
                pinned.insert(m.segment);
                continue 'ask;
            };
            if counts[&from] - counts[&to] < 2 {
                continue;
            }
            let keeps_order = load[&to] + x <= load[&from].saturating_sub(x) && x <= load[&from];
            if !keeps_order {
                pinned.insert(m.segment);
                continue 'ask;
            }
            *load.get_mut(&from).expect("live") -= x;
            *load.get_mut(&to).expect("live") += x;
            *counts.get_mut(&from).expect("live") -= 1;
            *counts.get_mut(&to).expect("live") += 1;
            moves.push(BalanceMove {
                reason: format!(
                    "leader count: broker {from} leads {} ranges, broker {to} {}",
                    counts[&from] + 1,
                    counts[&to] - 1
                ),
                leader_move: m,
                bytes_per_sec: x,
            });
        }
        planned.extend(moves);
        break;
    }
    planned
}

/// How many times [`plan_balance`] asks the count balance again after
/// refusing one of its moves, at most (each time one more range pinned).
const MAX_COUNT_REPLANS: usize = 16;

/// The load moves of [`plan_balance`], `load` updated with each.
fn plan_load_moves(
    image: &MetadataImage,
    rates: &BTreeMap<RangeId, u64>,
    load: &mut BTreeMap<i32, u64>,
    settings: LoadBalanceSettings,
    max_moves: usize,
) -> Vec<BalanceMove> {
    let mut planned: Vec<BalanceMove> = Vec::new();
    if is_idle(load, settings) {
        return planned;
    }
    let mean = mean_load(load);
    let over = mean * (1.0 + settings.imbalance.max(0.0));
    let candidates = movable(image, load);
    // Each broker's ranges, so that a hot broker's are looked at alone (a
    // scan of every range per move was minutes a pass at 2.4 million).
    let mut led_by: BTreeMap<i32, Vec<usize>> = BTreeMap::new();
    for (i, (_, replicas)) in candidates.iter().enumerate() {
        led_by.entry(replicas[0]).or_default().push(i);
    }
    while planned.len() < max_moves {
        // The most loaded broker above the threshold that has a move.
        let mut hot: Vec<(u64, i32)> = load
            .iter()
            .filter(|(_, l)| **l as f64 > over)
            .map(|(b, l)| (*l, *b))
            .collect();
        hot.sort_by(|a, b| b.cmp(a));
        let mut best: Option<(u128, usize, i32)> = None;
        for &(from_load, from) in &hot {
            for &i in led_by.get(&from).map(Vec::as_slice).unwrap_or_default() {
                let (segment, replicas) = &candidates[i];
                if planned.iter().any(|p| p.leader_move.segment == *segment) {
                    continue;
                }
                let x = rates.get(&segment.range).copied().unwrap_or(0);
                if x == 0 {
                    continue;
                }
                // An unreplicated range moves whole, to any broker: the
                // least loaded one gains the most.
                let least = [least_loaded(load, from)];
                let targets: &[i32] = if replicas.len() == 1 {
                    match &least {
                        [Some(b)] => std::slice::from_ref(b),
                        _ => &[],
                    }
                } else {
                    &replicas[1..]
                };
                for &to in targets {
                    let to_load = load[&to];
                    if x >= from_load.saturating_sub(to_load) {
                        continue;
                    }
                    // The drop in the sum of squared loads: 2x(d - x).
                    let gain = 2 * x as u128 * (from_load - to_load - x) as u128;
                    let better = best.is_none_or(|(g, bi, bt)| {
                        gain > g
                            || (gain == g
                                && (candidates[i].0.range, to) < (candidates[bi].0.range, bt))
                    });
                    if better {
                        best = Some((gain, i, to));
                    }
                }
            }
            if best.is_some() {
                break;
            }
        }
        let Some((_, i, to)) = best else {
            break;
        };
        let (segment, replicas) = &candidates[i];
        let from = replicas[0];
        let x = rates[&segment.range];
        let reason = format!(
            "bytes in: broker {from} at {} B/s (mean {} B/s, over {} B/s) hands range {} ({x} B/s) to broker {to} at {} B/s",
            load[&from], mean as u64, over as u64, segment.range, load[&to]
        );
        *load.get_mut(&from).expect("live") -= x;
        *load.get_mut(&to).expect("live") += x;
        planned.push(BalanceMove {
            leader_move: LeaderMove {
                segment: *segment,
                from,
                to,
            },
            bytes_per_sec: x,
            reason,
        });
    }
    planned
}

/// The mean bytes in per second of the live brokers (`load` is not empty).
fn mean_load(load: &BTreeMap<i32, u64>) -> f64 {
    load.values().sum::<u64>() as f64 / load.len() as f64
}

/// True when the live brokers' mean load is below the floor under which
/// rates are noise (nothing moves by load, and counts ignore loads).
fn is_idle(load: &BTreeMap<i32, u64>, settings: LoadBalanceSettings) -> bool {
    load.is_empty() || mean_load(load) < settings.min_bytes_per_sec.max(1) as f64
}

/// The live broker other than `but` with the least load (ties: lowest id).
fn least_loaded(load: &BTreeMap<i32, u64>, but: i32) -> Option<i32> {
    load.iter()
        .filter(|(b, _)| **b != but)
        .min_by_key(|(b, l)| (**l, **b))
        .map(|(b, _)| *b)
}
