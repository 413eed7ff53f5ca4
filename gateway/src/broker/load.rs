//! Load as the balance sees it: each primary measures the bytes appended
//! per second to the ranges it leads and reports them beside its
//! heartbeats (`Controller::report_load`); the active controller plans
//! leader moves from the reports (`tessera_planner::plan_balance`) and
//! keeps its recent decisions, with their reasons, for `GET /balance`.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::Serialize;
use tessera_metadata::RangeId;

use super::Broker;

/// How long a rate takes to follow a change (the smoothing's time
/// constant): a few heartbeats, so one burst does not move a range.
const SMOOTHING: Duration = Duration::from_secs(10);

/// Decisions `GET /balance` shows, newest last.
const DECISIONS_KEPT: usize = 100;

/// Smoothed bytes-per-second rates from cumulative byte counters.
#[derive(Default, Debug)]
pub(crate) struct LoadMeter {
    last: HashMap<RangeId, (u64, Instant)>,
    rates: BTreeMap<RangeId, f64>,
}

impl LoadMeter {
    /// Takes each range's bytes appended so far at `now` and returns the
    /// smoothed rates (bytes per second) of the ranges given. A range seen
    /// for the first time has no rate until the next observation; one
    /// whose counter went back (its log was opened again, as every leader
    /// move or re-placement does) keeps its rate and counts from there. A
    /// range missing from the observations for longer than the smoothing
    /// is forgotten (not at once: a range briefly between two logs must
    /// not read as idle, or the count balance would take it for one).
    pub(crate) fn observe(
        &mut self,
        now: Instant,
        totals: impl IntoIterator<Item = (RangeId, u64)>,
    ) -> BTreeMap<RangeId, u64> {
        let mut given = Vec::new();
        for (range, total) in totals {
            given.push(range);
            let previous = self.last.insert(range, (total, now));
            let Some((before, at)) = previous else {
                continue;
            };
            let dt = now.saturating_duration_since(at).as_secs_f64();
            if total < before || dt <= 0.0 {
                continue;
            }
            let instant = (total - before) as f64 / dt;
            let weight = 1.0 - (-dt / SMOOTHING.as_secs_f64()).exp();
            let rate = self.rates.entry(range).or_insert(instant);
            *rate += weight * (instant - *rate);
        }
        self.last
            .retain(|_, (_, at)| now.saturating_duration_since(*at) < SMOOTHING);
        self.rates.retain(|r, _| self.last.contains_key(r));
        given
            .into_iter()
            .filter_map(|r| self.rates.get(&r).map(|v| (r, v.round() as u64)))
            .collect()
    }
}

/// One leader move the balance planned, as `GET /balance` shows it.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct BalanceDecision {
    /// Milliseconds since the Unix epoch.
    pub at_ms: i64,
    pub range: RangeId,
    pub segment: u32,
    pub from: i32,
    pub to: i32,
    pub bytes_per_sec: u64,
    pub reason: String,
}

/// The balance's view for `GET /balance`: bytes in per second per broker
/// and per range (as reported to this node), and the last decisions this
/// node made as the active controller.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct BalanceView {
    pub broker_bytes_in_per_sec: BTreeMap<i32, u64>,
    pub range_bytes_in_per_sec: BTreeMap<RangeId, u64>,
    pub leaders: BTreeMap<i32, i64>,
    pub decisions: Vec<BalanceDecision>,
}

#[derive(Default, Debug)]
pub(crate) struct LoadState {
    meter: Mutex<LoadMeter>,
    /// This broker's own ranges' rates, as last measured.
    own: Mutex<BTreeMap<RangeId, u64>>,
    decisions: Mutex<VecDeque<BalanceDecision>>,
}

impl Broker {
    /// Measures the ranges this broker leads and reports their rates to
    /// the controllers (every heartbeat).
    pub(super) fn report_load(&self) {
        let image = self.image();
        let me = self.config.node_id;
        let totals: Vec<(RangeId, u64)> = self
            .logs
            .read()
            .iter()
            .filter(|(id, log)| {
                !log.is_sealed()
                    && image
                        .active_segment(**id)
                        .is_some_and(|s| !s.is_sealed() && s.primary() == Some(me))
            })
            .map(|(id, log)| (*id, log.bytes_appended()))
            .collect();
        let rates = self.load.meter.lock().observe(Instant::now(), totals);
        *self.load.own.lock() = rates.clone();
        self.controller.report_load(me, rates.into_iter().collect());
    }

    /// The bytes appended per second to `range` here, if this broker leads
    /// it and has measured it.
    pub(crate) fn range_rate(&self, range: RangeId) -> Option<u64> {
        self.load.own.lock().get(&range).copied()
    }

    /// Rates of active ranges from their primaries' reports, current
    /// within a broker session.
    pub(crate) fn reported_range_rates(
        &self,
        image: &tessera_metadata::MetadataImage,
    ) -> BTreeMap<RangeId, u64> {
        let session = Duration::from_millis(self.config.broker_session_timeout_ms);
        let reports: BTreeMap<i32, Vec<(RangeId, u64)>> = self
            .controller
            .reported_loads(session)
            .into_iter()
            .collect();
        tessera_planner::range_rates(image, &reports)
    }

    pub(super) fn record_balance_decision(&self, m: &tessera_planner::BalanceMove) {
        let mut decisions = self.load.decisions.lock();
        if decisions.len() >= DECISIONS_KEPT {
            decisions.pop_front();
        }
        decisions.push_back(BalanceDecision {
            at_ms: tessera_log::now_ms(),
            range: m.leader_move.segment.range,
            segment: m.leader_move.segment.seq,
            from: m.leader_move.from,
            to: m.leader_move.to,
            bytes_per_sec: m.bytes_per_sec,
            reason: m.reason.clone(),
        });
    }

    /// What `GET /balance` shows.
    pub fn balance_view(&self) -> BalanceView {
        let image = self.image();
        let rates = self.reported_range_rates(&image);
        BalanceView {
            broker_bytes_in_per_sec: tessera_planner::broker_loads(&image, &rates),
            range_bytes_in_per_sec: rates,
            leaders: tessera_planner::leader_load(&image),
            decisions: self.load.decisions.lock().iter().cloned().collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_follows_the_counter_smoothly_and_forgets_gone_ranges() {
        let mut meter = LoadMeter::default();
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        assert!(
            meter.observe(t0, [(1, 0), (2, 500)]).is_empty(),
            "no rate from one look"
        );
        // 1,000 B/s for range 1, nothing for range 2.
        let rates = meter.observe(t0 + s, [(1, 1_000), (2, 500)]);
        assert_eq!(rates, BTreeMap::from([(1, 1_000), (2, 0)]));
        // A burst moves the rate only part of the way.
        let rates = meter.observe(t0 + 2 * s, [(1, 11_000), (2, 500)]);
        assert!(rates[&1] > 1_000 && rates[&1] < 5_000, "{rates:?}");
        // Steady again: it converges back.
        let mut total = 11_000;
        let mut rates = BTreeMap::new();
        for i in 3..60 {
            total += 1_000;
            rates = meter.observe(t0 + i * s, [(1, total)]);
        }
        assert!(rates[&1].abs_diff(1_000) < 50, "{rates:?}");
        assert!(!rates.contains_key(&2), "a range not given is not reported");
        assert!(
            !meter.rates.contains_key(&2),
            "and forgotten after the smoothing"
        );
        // A counter that went back (the log opened again) keeps the rate.
        let rates = meter.observe(t0 + 61 * s, [(1, 10)]);
        assert!(rates[&1].abs_diff(1_000) < 50);
        // Missing from one look (between two logs): the rate is kept.
        assert!(meter.observe(t0 + 62 * s, []).is_empty());
        let rates = meter.observe(t0 + 63 * s, [(1, 2_010)]);
        assert!(rates[&1].abs_diff(1_000) < 50, "{rates:?}");
    }
}
