//! [`tessera_replication::place_replicas_led_by`] for many segments over
//! one set of candidates, each broker's score computed once per segment.
//!
//! The replication crate's sort computes both scores in its comparator
//! (twice per comparison: `n log n` hashes and logarithms per segment),
//! and a creation at 1,000 brokers places every one of its ranges against
//! every live broker. This computes the same scores (same hash, same
//! weight, same order: score descending, then broker id) once per broker;
//! `equivalence::fast_placement_is_place_replicas` checks it against the
//! replication crate's function on random candidates.

use std::collections::BTreeMap;

use tessera_replication::{BrokerCandidate, PlacementError};

/// The candidates of one planning call, their racks interned.
pub(crate) struct Placer<'a> {
    brokers: &'a [BrokerCandidate],
    /// Indices of the live (unfenced) candidates.
    live: Vec<usize>,
    /// Rack of each candidate as a small number; `None`: no rack.
    rack: Vec<Option<u32>>,
    racks: usize,
}

/// One segment's scores: `score[i]` of candidate `live[i]`.
pub(crate) struct Ranking {
    score: Vec<f64>,
}

impl<'a> Placer<'a> {
    pub(crate) fn new(brokers: &'a [BrokerCandidate]) -> Self {
        let mut names: std::collections::BTreeMap<&str, u32> = Default::default();
        let rack = brokers
            .iter()
            .map(|b| {
                b.rack.as_deref().map(|r| {
                    let next = names.len() as u32;
                    *names.entry(r).or_insert(next)
                })
            })
            .collect();
        let live = (0..brokers.len()).filter(|&i| !brokers[i].fenced).collect();
        Placer {
            brokers,
            live,
            rack,
            racks: names.len(),
        }
    }

    pub(crate) fn live_count(&self) -> usize {
        self.live.len()
    }

    /// Followers for `replicas` (the primary first, the rest as placed):
    /// each in turn the live broker outside the set in a rack the set does
    /// not use yet (a broker without one counts as a rack of its own),
    /// then holding the fewest active segments (`held`), ties to the one
    /// that comes first in [`Placer::full_order`]; `held` counts them.
    /// Re-placement evens out that same count, so a new topic leaves it
    /// next to nothing to move.
    pub(crate) fn followers_by_load(
        &self,
        ranking: &Ranking,
        replicas: Vec<i32>,
        held: &mut BTreeMap<i32, u64>,
    ) -> Vec<i32> {
        let mut set: Vec<usize> = Vec::with_capacity(replicas.len());
        let candidate = |id: i32| {
            self.live
                .iter()
                .copied()
                .find(|&c| self.brokers[c].broker_id == id)
        };
        match replicas.first().and_then(|&p| candidate(p)) {
            Some(p) => set.push(p),
            None => return replicas,
        }
        while set.len() < replicas.len() {
            let picked = self.first_by(
                ranking,
                (0..self.live.len())
                    .filter(|&x| !set.contains(&self.live[x]))
                    .map(|x| {
                        let c = self.live[x];
                        let rack_used = self.rack[c]
                            .is_some_and(|r| set.iter().any(|&m| self.rack[m] == Some(r)));
                        let id = self.brokers[c].broker_id;
                        (x, (rack_used, held.get(&id).copied().unwrap_or(0)))
                    }),
            );
            match picked {
                Some(c) => set.push(c),
                None => return replicas,
            }
        }
        let chosen: Vec<i32> = set.iter().map(|&c| self.brokers[c].broker_id).collect();
        for id in &chosen {
            *held.entry(*id).or_default() += 1;
        }
        chosen
    }

    /// Every live candidate's score for `segment_key`.
    pub(crate) fn rank(&self, segment_key: &str) -> Ranking {
        let prefix = hash_prefix(segment_key);
        Ranking {
            score: self
                .live
                .iter()
                .map(|&i| score(prefix, self.brokers[i].broker_id, self.brokers[i].load))
                .collect(),
        }
    }

    /// Whether live candidate `a` (a position in `live`) comes before `b`
    /// in the replication crate's order: higher score, then lower id.
    fn before(&self, ranking: &Ranking, a: usize, b: usize) -> bool {
        let id = |x: usize| self.brokers[self.live[x]].broker_id;
        match ranking.score[a].total_cmp(&ranking.score[b]) {
            std::cmp::Ordering::Greater => true,
            std::cmp::Ordering::Less => false,
            std::cmp::Ordering::Equal => id(a) < id(b),
        }
    }

    fn order(&self, ranking: &Ranking, a: usize, b: usize) -> std::cmp::Ordering {
        if a == b {
            std::cmp::Ordering::Equal
        } else if self.before(ranking, a, b) {
            std::cmp::Ordering::Less
        } else {
            std::cmp::Ordering::Greater
        }
    }

    /// The first `k` of `from` (positions in `live`) in order, best first.
    fn top(&self, ranking: &Ranking, mut from: Vec<usize>, k: usize) -> Vec<usize> {
        if from.len() > k && k > 0 {
            from.select_nth_unstable_by(k - 1, |&a, &b| self.order(ranking, a, b));
        }
        from.truncate(k);
        from.sort_unstable_by(|&a, &b| self.order(ranking, a, b));
        from
    }

    /// Per position in `live`: whether `place_replicas` takes it in its
    /// first pass (no rack, or the best of its rack).
    fn first_pass(&self, ranking: &Ranking) -> Vec<bool> {
        let mut best: Vec<Option<usize>> = vec![None; self.racks];
        for x in 0..self.live.len() {
            if let Some(r) = self.rack[self.live[x]] {
                let b = &mut best[r as usize];
                if b.is_none_or(|b| self.before(ranking, x, b)) {
                    *b = Some(x);
                }
            }
        }
        (0..self.live.len())
            .map(|x| match self.rack[self.live[x]] {
                None => true,
                Some(r) => best[r as usize] == Some(x),
            })
            .collect()
    }

    /// Every live candidate in the order `place_replicas` lists them when
    /// asked for all of them (indices into the candidates): the best of
    /// each rack (and every broker without one) by score, then the others
    /// by score.
    pub(crate) fn full_order(&self, ranking: &Ranking) -> Vec<usize> {
        let first = self.first_pass(ranking);
        let mut all: Vec<usize> = (0..self.live.len()).collect();
        all.sort_unstable_by(|&a, &b| {
            first[b]
                .cmp(&first[a])
                .then_with(|| self.order(ranking, a, b))
        });
        all.into_iter().map(|x| self.live[x]).collect()
    }

    /// The position in `live` of candidate `i`, if it is live.
    pub(crate) fn live_position(&self, i: usize) -> Option<usize> {
        self.live.binary_search(&i).ok()
    }

    /// Among `candidates` (positions in `live`, each with a key), the one
    /// with the lowest key, ties to the one that comes first in
    /// [`Placer::full_order`]; as an index into the candidates.
    pub(crate) fn first_by<K: Ord>(
        &self,
        ranking: &Ranking,
        candidates: impl Iterator<Item = (usize, K)>,
    ) -> Option<usize> {
        let first = self.first_pass(ranking);
        let mut best: Option<(usize, K)> = None;
        for (x, k) in candidates {
            let better = match &best {
                None => true,
                Some((b, bk)) => match k.cmp(bk) {
                    std::cmp::Ordering::Less => true,
                    std::cmp::Ordering::Greater => false,
                    // The first pass's brokers come first, then by score.
                    std::cmp::Ordering::Equal => match (first[x], first[*b]) {
                        (true, false) => true,
                        (false, true) => false,
                        _ => self.before(ranking, x, *b),
                    },
                },
            };
            if better {
                best = Some((x, k));
            }
        }
        best.map(|(x, _)| self.live[x])
    }

    /// `place_replicas_led_by(segment_key, brokers, primary, rf)` for the
    /// segment `ranking` scores, without sorting every broker: the first
    /// pass takes the best of each rack (and the brokers without one) in
    /// score order, the second the best of the others.
    pub(crate) fn place_led_by(
        &self,
        ranking: &Ranking,
        primary: Option<i32>,
        replication_factor: usize,
    ) -> Result<Vec<i32>, PlacementError> {
        if replication_factor == 0 {
            return Err(PlacementError::InvalidReplicationFactor);
        }
        if self.live.len() < replication_factor {
            return Err(PlacementError::NotEnoughBrokers {
                wanted: replication_factor,
                available: self.live.len(),
            });
        }
        // The primary: the first live candidate with that id in score order.
        let lead = primary.and_then(|p| {
            (0..self.live.len())
                .filter(|&x| self.brokers[self.live[x]].broker_id == p)
                .reduce(|a, b| if self.before(ranking, b, a) { b } else { a })
        });
        let mut chosen: Vec<usize> = lead.into_iter().collect();
        let lead_rack = lead.and_then(|x| self.rack[self.live[x]]);
        // First pass: per rack (not the primary's) its best, and every
        // broker without a rack.
        let mut best: Vec<Option<usize>> = vec![None; self.racks];
        let mut first: Vec<usize> = Vec::new();
        for x in (0..self.live.len()).filter(|&x| Some(x) != lead) {
            match self.rack[self.live[x]] {
                None => first.push(x),
                Some(r) if Some(r) == lead_rack => {}
                Some(r) => {
                    let b = &mut best[r as usize];
                    if b.is_none_or(|b| self.before(ranking, x, b)) {
                        *b = Some(x);
                    }
                }
            }
        }
        first.extend(best.into_iter().flatten());
        let wanted = replication_factor - chosen.len();
        chosen.extend(self.top(ranking, first, wanted));
        if chosen.len() < replication_factor {
            // Second pass: the best of the others (by id, as the crate).
            let ids: Vec<i32> = chosen
                .iter()
                .map(|&x| self.brokers[self.live[x]].broker_id)
                .collect();
            let rest: Vec<usize> = (0..self.live.len())
                .filter(|&x| !ids.contains(&self.brokers[self.live[x]].broker_id))
                .collect();
            let wanted = replication_factor - chosen.len();
            chosen.extend(self.top(ranking, rest, wanted));
        }
        Ok(chosen
            .into_iter()
            .map(|x| self.brokers[self.live[x]].broker_id)
            .collect())
    }
}

/// The replication crate's hash (64-bit FNV-1a over the key's bytes then
/// the broker id's big-endian bytes, a splitmix finaliser), the key's part
/// computed once.
fn hash_prefix(key: &str) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in key.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

fn hash(prefix: u64, broker_id: i32) -> u64 {
    let mut h = prefix;
    for b in broker_id.to_be_bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58476d1ce4e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d049bb133111eb);
    h ^ (h >> 31)
}

/// The replication crate's weighted rendezvous score.
fn score(prefix: u64, broker_id: i32, load: u64) -> f64 {
    let u = (hash(prefix, broker_id) as f64 + 1.0) / (u64::MAX as f64 + 2.0);
    let weight = 1.0 / (1.0 + load as f64);
    -weight / u.ln()
}
