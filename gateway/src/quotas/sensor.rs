//! Kafka's windowed rate (`SampledStat` + `Rate` with a `WindowedSum`), as
//! a pure value: every call takes the time, so tests drive the clock.
//!
//! `samples` windows of `window_ms` each are kept; a window is complete
//! once `window_ms` passed since it started; a sample older than
//! `samples * window_ms` is reset before a measure. The rate is the sum of
//! the samples over the elapsed time since the oldest sample started, that
//! time being at least `samples - 1` full windows (so a client that just
//! started is not measured over a tiny interval).

/// `quota.window.num` and `quota.window.size.seconds` (in ms).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowConfig {
    pub samples: usize,
    pub window_ms: u64,
}

impl Default for WindowConfig {
    /// Kafka's defaults: 11 windows of 1 s.
    fn default() -> Self {
        WindowConfig {
            samples: 11,
            window_ms: 1000,
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Sample {
    value: f64,
    start_ms: u64,
}

/// One sensor's samples.
#[derive(Clone, Debug)]
pub struct RateSensor {
    config: WindowConfig,
    samples: Vec<Sample>,
    current: usize,
    /// The last time anything was recorded (for expiring idle sensors).
    pub last_record_ms: u64,
}

impl RateSensor {
    pub fn new(config: WindowConfig) -> Self {
        RateSensor {
            config: WindowConfig {
                samples: config.samples.max(2),
                window_ms: config.window_ms.max(1),
            },
            samples: Vec::new(),
            current: 0,
            last_record_ms: 0,
        }
    }

    /// Adds `value` at `now_ms` (a negative value "unrecords", as Kafka's
    /// fetch path does for a throttled, emptied response).
    pub fn record(&mut self, value: f64, now_ms: u64) {
        if self.samples.is_empty() {
            self.samples.push(Sample {
                value: 0.0,
                start_ms: now_ms,
            });
            self.current = 0;
        }
        let cur = self.samples[self.current];
        if now_ms.saturating_sub(cur.start_ms) >= self.config.window_ms {
            // Advance to the next sample (a new one until there are
            // `samples` of them, then the oldest slot, reset).
            self.current = (self.current + 1) % self.config.samples;
            let fresh = Sample {
                value: 0.0,
                start_ms: now_ms,
            };
            if self.current >= self.samples.len() {
                self.samples.push(fresh);
            } else {
                self.samples[self.current] = fresh;
            }
        }
        self.samples[self.current].value += value;
        self.last_record_ms = now_ms;
    }

    /// Resets the samples no longer in the window (Kafka's
    /// `purgeObsoleteSamples`).
    fn purge(&mut self, now_ms: u64) {
        let expire = self.config.samples as u64 * self.config.window_ms;
        for s in &mut self.samples {
            if now_ms.saturating_sub(s.start_ms) >= expire {
                *s = Sample {
                    value: 0.0,
                    start_ms: now_ms,
                };
            }
        }
    }

    /// The time (ms) the rate is measured over at `now_ms` (Kafka's
    /// `Rate.windowSize`): since the oldest sample started, at least
    /// `samples - 1` full windows, and at least 1 ms.
    pub fn window_size_ms(&mut self, now_ms: u64) -> u64 {
        self.purge(now_ms);
        let oldest = self
            .samples
            .iter()
            .map(|s| s.start_ms)
            .min()
            .unwrap_or(now_ms);
        let mut elapsed = now_ms.saturating_sub(oldest);
        let full = elapsed / self.config.window_ms;
        let min_full = self.config.samples as u64 - 1;
        if full < min_full {
            elapsed += (min_full - full) * self.config.window_ms;
        }
        elapsed.max(1)
    }

    /// The rate per second at `now_ms`.
    pub fn rate(&mut self, now_ms: u64) -> f64 {
        self.purge(now_ms);
        let total: f64 = self.samples.iter().map(|s| s.value).sum();
        total / (self.window_size_ms(now_ms) as f64 / 1000.0)
    }

    /// Records `value` and checks the rate against `bound` (per second):
    /// the throttle time in ms Kafka computes for a violation
    /// (`QuotaUtils.throttleTime`: `(rate - bound) / bound * window`), 0 when
    /// the rate is within the bound.
    pub fn record_and_throttle_ms(&mut self, value: f64, bound: f64, now_ms: u64) -> u64 {
        self.record(value, now_ms);
        let rate = self.rate(now_ms);
        throttle_ms(rate, bound, self.window_size_ms(now_ms))
    }
}

/// Kafka's throttle for a measured `rate` over `window_ms` against
/// `bound`: 0 within the bound, else `round((rate - bound) / bound * window)`.
/// A zero bound throttles by a whole quota window's worth per unit.
pub fn throttle_ms(rate: f64, bound: f64, window_ms: u64) -> u64 {
    if rate <= bound {
        return 0;
    }
    let t = (rate - bound) / bound.max(f64::MIN_POSITIVE) * window_ms as f64;
    if !t.is_finite() || t >= u64::MAX as f64 {
        return u64::MAX;
    }
    t.round() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cfg() -> WindowConfig {
        WindowConfig::default()
    }

    #[test]
    fn new_sensor_measures_over_min_windows() {
        let mut s = RateSensor::new(cfg());
        s.record(1000.0, 0);
        // 10 full windows minimum: 1000 / 10 s.
        assert_eq!(s.window_size_ms(0), 10_000);
        assert!((s.rate(0) - 100.0).abs() < 1e-9);
        // Half a second later: still 10 s (0 full windows + 10).
        assert_eq!(s.window_size_ms(500), 10_500);
    }

    #[test]
    fn throttle_matches_kafka_formula() {
        let mut s = RateSensor::new(cfg());
        // 3000 bytes at t=0 against 100/s: rate 300/s over 10 s, so
        // (300 - 100) / 100 * 10000 = 20000 ms.
        assert_eq!(s.record_and_throttle_ms(3000.0, 100.0, 0), 20_000);
        // Within the bound: nothing.
        let mut s = RateSensor::new(cfg());
        assert_eq!(s.record_and_throttle_ms(999.0, 100.0, 0), 0);
        assert_eq!(s.record_and_throttle_ms(1.0, 100.0, 0), 0);
        // 1001 over 10 s: (100.1 - 100) / 100 * 10000 = 10 ms.
        assert_eq!(s.record_and_throttle_ms(1.0, 100.0, 0), 10);
    }

    #[test]
    fn old_samples_expire() {
        let mut s = RateSensor::new(cfg());
        s.record(1_000_000.0, 0);
        assert!(s.rate(1000) > 0.0);
        // 11 windows later everything recorded at 0 is gone.
        assert_eq!(s.rate(11_000), 0.0);
        assert_eq!(s.record_and_throttle_ms(10.0, 100.0, 11_000), 0);
    }

    #[test]
    fn windows_rotate() {
        let mut s = RateSensor::new(cfg());
        for t in 0..30u64 {
            s.record(100.0, t * 1000);
        }
        // 11 samples of 100 each over 10 s + the current one's elapsed 0.
        assert_eq!(s.samples.len(), 11);
        let r = s.rate(29_000);
        assert!((r - 110.0).abs() < 1e-9, "{r}");
    }

    #[test]
    fn unrecord_cancels() {
        let mut s = RateSensor::new(cfg());
        s.record(500.0, 0);
        s.record(-500.0, 0);
        assert_eq!(s.rate(0), 0.0);
    }

    #[test]
    fn zero_bound_throttles() {
        assert_eq!(throttle_ms(0.0, 0.0, 1000), 0);
        assert!(throttle_ms(1.0, 0.0, 1000) > 1_000_000);
    }

    proptest! {
        /// Whatever the traffic, the rate never exceeds what was recorded
        /// in the retained windows over the minimal window, and a steady
        /// client held to its throttle gets about its bound.
        #[test]
        fn rate_is_bounded_by_recorded(
            events in proptest::collection::vec((0u64..3000, 0.0f64..1e6), 1..200)
        ) {
            let mut s = RateSensor::new(cfg());
            let mut now = 0u64;
            let mut total = 0.0;
            for (dt, v) in events {
                now += dt;
                s.record(v, now);
                total += v;
                let r = s.rate(now);
                prop_assert!(r >= 0.0);
                prop_assert!(r <= total / 10.0 + 1e-6, "rate {} total {}", r, total);
                prop_assert!(s.window_size_ms(now) >= 10_000);
                prop_assert!(s.window_size_ms(now) <= 11_000);
            }
        }

        /// A client that sends `size` bytes, then waits the throttle time
        /// it is given (or a little when none), achieves at most about the
        /// bound over a long run.
        ///
        /// (Requests are at most a second's worth of the quota: one request
        /// bigger than the retained windows can hold is, in Kafka too,
        /// throttled only for what the windows measure.)
        #[test]
        fn throttled_client_is_held_to_bound(
            bound in 1_000.0f64..1e6,
            fraction in 0.001f64..1.0,
        ) {
            let size = bound * fraction;
            let mut s = RateSensor::new(cfg());
            let mut now = 0u64;
            let mut sent = 0.0;
            while now < 120_000 {
                let t = s.record_and_throttle_ms(size, bound, now);
                sent += size;
                now += t.max(10);
            }
            let achieved = sent / (now as f64 / 1000.0);
            // One request may overshoot before the first throttle; allow it.
            prop_assert!(achieved <= bound * 1.15 + size / (now as f64 / 1000.0),
                "achieved {} bound {}", achieved, bound);
        }
    }
}
