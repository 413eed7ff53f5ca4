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

/// One segment's ranking: the live candidates (indices into the
/// candidates) by score, best first, ties to the lowest broker id.
pub(crate) struct Ranking {
    pub(crate) sorted: Vec<usize>,
}

impl<'a> Placer<'a> {
    pub(crate) fn new(brokers: &'a [BrokerCandidate]) -> Self {
        let mut names: Vec<&str> = Vec::new();
        let rack = brokers
            .iter()
            .map(|b| {
                b.rack
                    .as_deref()
                    .map(|r| match names.iter().position(|n| *n == r) {
                        Some(i) => i as u32,
                        None => {
                            names.push(r);
                            (names.len() - 1) as u32
                        }
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

    /// The live candidates in score order for `segment_key`.
    pub(crate) fn rank(&self, segment_key: &str) -> Ranking {
        let prefix = hash_prefix(segment_key);
        let mut scored: Vec<(f64, i32, usize)> = self
            .live
            .iter()
            .map(|&i| {
                let b = &self.brokers[i];
                (score(prefix, b.broker_id, b.load), b.broker_id, i)
            })
            .collect();
        scored.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        Ranking {
            sorted: scored.into_iter().map(|(_, _, i)| i).collect(),
        }
    }

    /// Every live candidate in the order `place_replicas` lists them when
    /// asked for all of them: the best of each rack (and every broker
    /// without one) by score, then the others by score.
    pub(crate) fn full_order(&self, ranking: &Ranking) -> Vec<usize> {
        let mut used = vec![false; self.racks];
        let mut first = Vec::with_capacity(ranking.sorted.len());
        let mut rest = Vec::new();
        for &i in &ranking.sorted {
            match self.rack[i] {
                Some(r) if used[r as usize] => rest.push(i),
                Some(r) => {
                    used[r as usize] = true;
                    first.push(i);
                }
                None => first.push(i),
            }
        }
        first.extend(rest);
        first
    }

    /// `place_replicas_led_by(segment_key, brokers, primary, rf)` for the
    /// segment `ranking` ranks.
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
        let lead = primary.and_then(|p| {
            ranking
                .sorted
                .iter()
                .copied()
                .find(|&i| self.brokers[i].broker_id == p)
        });
        let order = lead
            .into_iter()
            .chain(ranking.sorted.iter().copied().filter(|&i| Some(i) != lead));
        let mut chosen: Vec<usize> = Vec::with_capacity(replication_factor);
        let mut used = vec![false; self.racks];
        for i in order.clone() {
            if chosen.len() == replication_factor {
                break;
            }
            if let Some(r) = self.rack[i] {
                if used[r as usize] {
                    continue;
                }
                used[r as usize] = true;
            }
            chosen.push(i);
        }
        for i in order {
            if chosen.len() == replication_factor {
                break;
            }
            let id = self.brokers[i].broker_id;
            if !chosen.iter().any(|&c| self.brokers[c].broker_id == id) {
                chosen.push(i);
            }
        }
        Ok(chosen
            .into_iter()
            .map(|i| self.brokers[i].broker_id)
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
