//! The automatic range policy: split a range that stays hotter than its
//! target, merge adjacent ranges that stay cold. Pure decision logic (the
//! broker feeds it measured rates and carries out what it returns).
//!
//! Hysteresis keeps it from flapping: a decision needs `sustain_intervals`
//! consecutive intervals over (or under) its threshold, the merge threshold
//! sits well below the split threshold, and two ranges only merge when their
//! combined rate stays under half the split target, so the merged range is
//! not immediately hot again.

use std::collections::HashMap;

use tessera_metadata::RangeId;

/// Thresholds for one topic (broker defaults, overridable per topic).
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyConfig {
    /// Split a range whose produce rate stays above this (bytes/s).
    pub split_bytes_per_sec: f64,
    /// Merge adjacent ranges whose rates both stay below this (bytes/s).
    pub merge_bytes_per_sec: f64,
    pub min_ranges: usize,
    pub max_ranges: usize,
    /// Consecutive intervals a condition must hold before acting.
    pub sustain_intervals: u32,
}

/// One active range's load over the last interval.
#[derive(Clone, Debug, PartialEq)]
pub struct RangeLoad {
    pub id: RangeId,
    pub lo: u32,
    pub hi: u32,
    /// `None` in the first interval a range is seen (a new topic, or a
    /// split or merge child): it has no rate yet and builds no streak, so a
    /// pair just split is not judged cold and merged straight back.
    pub bytes_per_sec: Option<f64>,
}

impl RangeLoad {
    fn rate(&self) -> f64 {
        self.bytes_per_sec.unwrap_or(0.0)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    Split { range: RangeId },
    Merge { left: RangeId, right: RangeId },
}

/// Streaks per range across intervals.
#[derive(Default, Debug)]
pub struct PolicyState {
    hot: HashMap<RangeId, u32>,
    cold: HashMap<RangeId, u32>,
}

impl PolicyState {
    /// Feeds one interval of one topic's active ranges (any order) and
    /// returns at most one decision for the topic.
    pub fn decide(&mut self, ranges: &[RangeLoad], config: &PolicyConfig) -> Option<Decision> {
        let mut ranges: Vec<&RangeLoad> = ranges.iter().collect();
        ranges.sort_by_key(|r| r.lo);
        for r in &ranges {
            let Some(rate) = r.bytes_per_sec else {
                continue;
            };
            let hot = self.hot.entry(r.id).or_default();
            *hot = if rate > config.split_bytes_per_sec {
                *hot + 1
            } else {
                0
            };
            let cold = self.cold.entry(r.id).or_default();
            *cold = if rate < config.merge_bytes_per_sec {
                *cold + 1
            } else {
                0
            };
        }
        let sustained =
            |streak: Option<&u32>| streak.is_some_and(|s| *s >= config.sustain_intervals.max(1));
        if ranges.len() < config.max_ranges {
            let hottest = ranges
                .iter()
                .filter(|r| r.hi - r.lo >= 2 && sustained(self.hot.get(&r.id)))
                .max_by(|a, b| a.rate().total_cmp(&b.rate()));
            if let Some(r) = hottest {
                self.hot.remove(&r.id);
                return Some(Decision::Split { range: r.id });
            }
        }
        if ranges.len() > config.min_ranges.max(1) {
            let coldest_pair = ranges
                .windows(2)
                .filter(|w| w[0].hi == w[1].lo)
                .filter(|w| {
                    sustained(self.cold.get(&w[0].id)) && sustained(self.cold.get(&w[1].id))
                })
                .filter(|w| w[0].rate() + w[1].rate() < config.split_bytes_per_sec / 2.0)
                .min_by(|a, b| (a[0].rate() + a[1].rate()).total_cmp(&(b[0].rate() + b[1].rate())));
            if let Some(w) = coldest_pair {
                self.cold.remove(&w[0].id);
                self.cold.remove(&w[1].id);
                return Some(Decision::Merge {
                    left: w[0].id,
                    right: w[1].id,
                });
            }
        }
        None
    }

    /// Forgets ranges that no longer exist.
    pub fn retain(&mut self, alive: impl Fn(RangeId) -> bool) {
        self.hot.retain(|id, _| alive(*id));
        self.cold.retain(|id, _| alive(*id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn config() -> PolicyConfig {
        PolicyConfig {
            split_bytes_per_sec: 1000.0,
            merge_bytes_per_sec: 100.0,
            min_ranges: 1,
            max_ranges: 4,
            sustain_intervals: 3,
        }
    }

    fn load(id: RangeId, lo: u32, hi: u32, rate: f64) -> RangeLoad {
        RangeLoad {
            id,
            lo,
            hi,
            bytes_per_sec: Some(rate),
        }
    }

    #[test]
    fn a_pair_just_split_is_not_merged_back_before_it_is_measured() {
        let config = PolicyConfig {
            sustain_intervals: 1,
            ..config()
        };
        let mut state = PolicyState::default();
        let hot = config.split_bytes_per_sec * 2.0;
        assert_eq!(
            state.decide(&[load(1, 0, 8, hot)], &config),
            Some(Decision::Split { range: 1 })
        );
        // The children's first interval: no rate yet, no decision.
        let unmeasured = |id, lo, hi| RangeLoad {
            id,
            lo,
            hi,
            bytes_per_sec: None,
        };
        assert_eq!(
            state.decide(&[unmeasured(2, 0, 4), unmeasured(3, 4, 8)], &config),
            None
        );
        // Measured hot, they split further rather than merge.
        assert_eq!(
            state.decide(&[load(2, 0, 4, hot), load(3, 4, 8, hot / 2.0)], &config),
            Some(Decision::Split { range: 2 })
        );
    }

    #[test]
    fn splits_only_after_sustained_heat() {
        let mut s = PolicyState::default();
        let hot = [load(1, 0, 8, 5000.0)];
        assert_eq!(s.decide(&hot, &config()), None);
        assert_eq!(s.decide(&hot, &config()), None);
        assert_eq!(
            s.decide(&hot, &config()),
            Some(Decision::Split { range: 1 })
        );
    }

    #[test]
    fn a_dip_resets_the_streak() {
        let mut s = PolicyState::default();
        s.decide(&[load(1, 0, 8, 5000.0)], &config());
        s.decide(&[load(1, 0, 8, 5000.0)], &config());
        assert_eq!(s.decide(&[load(1, 0, 8, 10.0)], &config()), None);
        assert_eq!(s.decide(&[load(1, 0, 8, 5000.0)], &config()), None);
    }

    #[test]
    fn never_splits_a_single_partition_or_past_max() {
        let mut s = PolicyState::default();
        for _ in 0..5 {
            assert_eq!(s.decide(&[load(1, 0, 1, 1e9)], &config()), None);
        }
        let four = [
            load(1, 0, 2, 1e9),
            load(2, 2, 4, 1e9),
            load(3, 4, 6, 1e9),
            load(4, 6, 8, 1e9),
        ];
        for _ in 0..5 {
            assert_eq!(s.decide(&four, &config()), None);
        }
    }

    #[test]
    fn merges_cold_adjacent_pairs_but_not_below_min() {
        let mut s = PolicyState::default();
        let cold = [load(1, 0, 4, 1.0), load(2, 4, 8, 2.0)];
        assert_eq!(s.decide(&cold, &config()), None);
        assert_eq!(s.decide(&cold, &config()), None);
        assert_eq!(
            s.decide(&cold, &config()),
            Some(Decision::Merge { left: 1, right: 2 })
        );
        let mut s = PolicyState::default();
        let one = [load(3, 0, 8, 0.0)];
        for _ in 0..5 {
            assert_eq!(s.decide(&one, &config()), None);
        }
    }

    #[test]
    fn does_not_merge_non_adjacent_ranges() {
        let mut s = PolicyState::default();
        let gap = [load(1, 0, 4, 1.0), load(2, 5, 8, 1.0)];
        for _ in 0..5 {
            assert_eq!(s.decide(&gap, &config()), None);
        }
    }

    proptest! {
        /// A steady load never makes the policy flap: once it has split to
        /// fit or reached its bounds, it takes no further decisions, and it
        /// never splits and merges the same topic back and forth.
        #[test]
        fn steady_load_settles(rate in 0.0f64..10_000.0, intervals in 20usize..60) {
            let cfg = config();
            let mut s = PolicyState::default();
            let mut ranges = vec![load(1, 0, 64, rate)];
            let mut next_id = 2;
            let mut history = Vec::new();
            for _ in 0..intervals {
                // The same total rate spread evenly over the current ranges.
                let per = rate / ranges.len() as f64;
                for r in &mut ranges { r.bytes_per_sec = Some(per); }
                match s.decide(&ranges, &cfg) {
                    Some(Decision::Split { range }) => {
                        let i = ranges.iter().position(|r| r.id == range).unwrap();
                        let r = ranges.remove(i);
                        let mid = r.lo + (r.hi - r.lo) / 2;
                        ranges.push(load(next_id, r.lo, mid, 0.0));
                        ranges.push(load(next_id + 1, mid, r.hi, 0.0));
                        next_id += 2;
                        history.push('s');
                    }
                    Some(Decision::Merge { left, right }) => {
                        let l = ranges.iter().find(|r| r.id == left).unwrap().clone();
                        let r = ranges.iter().find(|r| r.id == right).unwrap().clone();
                        ranges.retain(|x| x.id != left && x.id != right);
                        ranges.push(load(next_id, l.lo, r.hi, 0.0));
                        next_id += 1;
                        history.push('m');
                    }
                    None => {}
                }
                ranges.sort_by_key(|r| r.lo);
            }
            let flips = history.windows(2).filter(|w| w[0] != w[1]).count();
            prop_assert_eq!(flips, 0, "history {:?}", history);
            prop_assert!(ranges.len() >= cfg.min_ranges && ranges.len() <= cfg.max_ranges);
        }
    }
}
