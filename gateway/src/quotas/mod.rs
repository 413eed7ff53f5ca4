//! Client quotas (Kafka's ClientQuotaManager / ClientRequestQuotaManager):
//! byte-rate quotas on Produce (request bytes) and Fetch (response bytes)
//! and a request-time quota (`request_percentage`), configured per user
//! and/or client id in the metadata image (`ClientQuota` records, written by
//! AlterClientQuotas), resolved in Kafka's precedence order
//! ([`resolve`]), measured over Kafka's sampled windows ([`sensor`]).
//!
//! A violation yields a throttle time: it goes back in the response's
//! `throttle_time_ms` (Produce, Fetch) and, as KIP-219 says, the broker
//! sends the response at once and then mutes the connection (reads no
//! further request from it) for that time ([`ConnectionThrottle`]).

pub mod admin;
pub mod resolve;
pub mod sensor;

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use resolve::{resolve, Quotas};
use sensor::{RateSensor, WindowConfig};

/// What a quota limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum QuotaKind {
    /// `producer_byte_rate`: request bytes of Produce.
    Produce,
    /// `consumer_byte_rate`: response bytes of Fetch.
    Fetch,
    /// `request_percentage`: request handling time, in percent of one
    /// thread per second.
    Request,
}

impl QuotaKind {
    pub fn key(self) -> &'static str {
        match self {
            QuotaKind::Produce => "producer_byte_rate",
            QuotaKind::Fetch => "consumer_byte_rate",
            QuotaKind::Request => "request_percentage",
        }
    }
    pub fn label(self) -> &'static str {
        match self {
            QuotaKind::Produce => "produce",
            QuotaKind::Fetch => "fetch",
            QuotaKind::Request => "request",
        }
    }
}

/// Kafka's user of a principal: the name after the type (`User:alice` is
/// `alice`), `ANONYMOUS` when none.
pub fn user_of(principal: Option<&str>) -> &str {
    match principal {
        None => "ANONYMOUS",
        Some(p) => p.split_once(':').map_or(p, |(_, name)| name),
    }
}

/// Converts handling time to Kafka's request quota unit (percent of one
/// thread's second).
pub fn nanos_to_percentage(nanos: u128) -> f64 {
    nanos as f64 * 100.0 / 1e9
}

type SensorKey = (QuotaKind, String, String);

#[derive(Default, Clone, Copy)]
struct Stats {
    value: f64,
    throttled: u64,
    throttle_ms: u64,
}

/// A sensor not recorded on for this long is dropped (Kafka expires quota
/// sensors after an hour of inactivity).
const SENSOR_EXPIRY_MS: u64 = 3_600_000;

#[derive(Default)]
struct State {
    sensors: HashMap<SensorKey, RateSensor>,
    stats: BTreeMap<SensorKey, Stats>,
    last_sweep_ms: u64,
}

/// The broker's quota sensors and their metrics.
pub struct QuotaManager {
    window: WindowConfig,
    epoch: Instant,
    state: Mutex<State>,
}

impl Default for QuotaManager {
    fn default() -> Self {
        QuotaManager::new(WindowConfig::default())
    }
}

impl QuotaManager {
    pub fn new(window: WindowConfig) -> Self {
        QuotaManager {
            window,
            epoch: Instant::now(),
            state: Mutex::new(State::default()),
        }
    }

    pub fn window(&self) -> WindowConfig {
        self.window
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Records `value` for the client and returns its throttle time (ms),
    /// 0 when no quota applies or it is not violated.
    pub fn record(
        &self,
        quotas: &Quotas,
        kind: QuotaKind,
        user: &str,
        client_id: &str,
        value: f64,
    ) -> u64 {
        self.record_at(quotas, kind, user, client_id, value, self.now_ms())
    }

    /// [`QuotaManager::record`] at a given time (ms since the manager's start).
    pub fn record_at(
        &self,
        quotas: &Quotas,
        kind: QuotaKind,
        user: &str,
        client_id: &str,
        value: f64,
        now_ms: u64,
    ) -> u64 {
        let Some(r) = resolve(quotas, kind.key(), user, client_id) else {
            return 0;
        };
        let key = (kind, r.user_tag, r.client_tag);
        let mut state = self.state.lock();
        if now_ms.saturating_sub(state.last_sweep_ms) >= 60_000 {
            state.last_sweep_ms = now_ms;
            let State { sensors, stats, .. } = &mut *state;
            sensors.retain(|_, s| now_ms.saturating_sub(s.last_record_ms) < SENSOR_EXPIRY_MS);
            // Their metrics go with them, as Kafka removes an expired
            // sensor's metrics: client ids come and go.
            stats.retain(|key, _| sensors.contains_key(key));
        }
        let window = self.window;
        let sensor = state
            .sensors
            .entry(key.clone())
            .or_insert_with(|| RateSensor::new(window));
        let mut throttle = sensor.record_and_throttle_ms(value, r.bound, now_ms);
        if kind == QuotaKind::Request {
            // Kafka bounds request-quota throttles by one quota window.
            throttle = throttle.min(window.window_ms);
        }
        let stats = state.stats.entry(key).or_default();
        stats.value += value;
        if throttle > 0 {
            stats.throttled += 1;
            stats.throttle_ms = stats.throttle_ms.saturating_add(throttle);
        }
        throttle
    }

    /// Takes back a recorded value (Kafka unrecords the bytes of a fetch
    /// it answers empty because it is throttled).
    pub fn unrecord(
        &self,
        quotas: &Quotas,
        kind: QuotaKind,
        user: &str,
        client_id: &str,
        value: f64,
    ) {
        let Some(r) = resolve(quotas, kind.key(), user, client_id) else {
            return;
        };
        let now = self.now_ms();
        let key = (kind, r.user_tag, r.client_tag);
        let mut state = self.state.lock();
        if let Some(s) = state.sensors.get_mut(&key) {
            s.record(-value, now);
        }
        if let Some(stats) = state.stats.get_mut(&key) {
            stats.value -= value;
        }
    }

    /// The most a client may take in one quota window (Kafka's
    /// `getMaxValueInQuotaWindow`: bound * (samples - 1) * window seconds);
    /// None when unlimited. Fetch caps its max_bytes to it.
    pub fn max_value_in_window(
        &self,
        quotas: &Quotas,
        kind: QuotaKind,
        user: &str,
        client_id: &str,
    ) -> Option<f64> {
        let r = resolve(quotas, kind.key(), user, client_id)?;
        Some(
            r.bound * (self.window.samples.saturating_sub(1)) as f64 * self.window.window_ms as f64
                / 1000.0,
        )
    }

    /// Prometheus text for the quota metrics, per kind and entity (Kafka's
    /// user / client-id tags).
    pub fn render(&self) -> String {
        let state = self.state.lock();
        let mut out = String::new();
        let esc = |s: &str| s.replace('\\', "\\\\").replace('"', "\\\"");
        let series = [
            (
                "tessera_quota_bytes_total",
                "Bytes counted against byte-rate quotas (produce: request bytes; fetch: response bytes), by quota entity.",
                0usize,
            ),
            (
                "tessera_quota_request_time_percent_total",
                "Request handling time counted against request_percentage quotas (percent of one thread-second), by quota entity.",
                1,
            ),
            (
                "tessera_quota_throttled_total",
                "Responses throttled by a quota, by kind and quota entity.",
                2,
            ),
            (
                "tessera_quota_throttle_time_ms_total",
                "Throttle time handed out by quotas (ms), by kind and quota entity.",
                3,
            ),
        ];
        for (name, help, which) in series {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} counter");
            for ((kind, user, client), s) in &state.stats {
                let v = match which {
                    0 if *kind != QuotaKind::Request => s.value.max(0.0).round() as u64,
                    1 if *kind == QuotaKind::Request => s.value.max(0.0).round() as u64,
                    2 => s.throttled,
                    3 => s.throttle_ms,
                    _ => continue,
                };
                let _ = writeln!(
                    out,
                    "{name}{{kind=\"{}\",user=\"{}\",client_id=\"{}\"}} {v}",
                    kind.label(),
                    esc(user),
                    esc(client)
                );
            }
        }
        out
    }
}

pub use crate::request_context::ConnectionThrottle;
use crate::request_context::RequestContext;

/// The quota identity of a request: (user, client id).
pub fn identity(ctx: &RequestContext) -> (String, String) {
    let user = user_of(ctx.principal().map(|p| &**p)).to_string();
    (user, ctx.client_id())
}

/// Records a Produce request's bytes against `producer_byte_rate` and
/// mutes the connection when throttled; the throttle time (ms) for the
/// response.
pub fn record_produce(broker: &crate::Broker, ctx: &RequestContext, request_size: usize) -> i32 {
    let image = broker.image();
    if image.client_quotas.is_empty() {
        return 0;
    }
    let (user, client) = identity(ctx);
    let throttle = broker.quotas().record(
        &image.client_quotas,
        QuotaKind::Produce,
        &user,
        &client,
        request_size as f64,
    );
    ctx.mute_for(throttle);
    throttle.min(i32::MAX as u64) as i32
}

/// Fetch under `consumer_byte_rate` (Kafka's handleFetchRequest): max_bytes
/// is capped to what the quota allows in one window, the response's size
/// is recorded, and a throttled fetch is answered empty (its bytes taken
/// back off the sensor) with the throttle time, the connection muted.
/// Fetches of other brokers (replication) are exempt.
/// `handle` is the Fetch handler itself (passed in: the dispatch layer
/// wraps its handler in the quota, the quota does not call up into it).
pub async fn fetch_with_quota<Handle, Handled>(
    broker: &crate::Broker,
    ctx: &RequestContext,
    mut request: kafka_protocol::messages::FetchRequest,
    handle: Handle,
) -> kafka_protocol::messages::FetchResponse
where
    Handle: FnOnce(kafka_protocol::messages::FetchRequest) -> Handled,
    Handled: std::future::Future<Output = kafka_protocol::messages::FetchResponse>,
{
    use kafka_protocol::protocol::Encodable;
    let from_broker = request.replica_id.0 >= 0 || request.replica_state.replica_id.0 >= 0;
    let image = broker.image();
    if from_broker || image.client_quotas.is_empty() {
        return handle(request).await;
    }
    let (user, client) = identity(ctx);
    let quotas = &image.client_quotas;
    if let Some(max) = broker
        .quotas()
        .max_value_in_window(quotas, QuotaKind::Fetch, &user, &client)
    {
        let max = max.clamp(1.0, i32::MAX as f64) as i32;
        request.max_bytes = request.max_bytes.min(max);
    }
    let response = handle(request).await;
    let size = response.compute_size(ctx.version()).unwrap_or(0) as f64;
    let throttle = broker
        .quotas()
        .record(quotas, QuotaKind::Fetch, &user, &client, size);
    if throttle == 0 {
        return response;
    }
    broker
        .quotas()
        .unrecord(quotas, QuotaKind::Fetch, &user, &client, size);
    ctx.mute_for(throttle);
    kafka_protocol::messages::FetchResponse::default()
        .with_throttle_time_ms(throttle.min(i32::MAX as u64) as i32)
        .with_error_code(response.error_code)
        .with_session_id(response.session_id)
}

/// Measures a request's handling time (the part before the connection
/// reads on, plus the time spent polling the rest: waits are not handling)
/// against `request_percentage`; a violation mutes the connection (the
/// response is not changed: only Produce and Fetch report throttle_time_ms).
pub async fn time_request<Rest>(
    broker: std::sync::Arc<crate::Broker>,
    user: String,
    client: String,
    throttled: Option<std::sync::Arc<ConnectionThrottle>>,
    before: Duration,
    in_flight: Rest,
) -> Rest::Output
where
    Rest: std::future::Future + Unpin + Send,
{
    let (reply, busy) = Timed {
        inner: in_flight,
        busy: before,
    }
    .await;
    let image = broker.image();
    let throttle = broker.quotas().record(
        &image.client_quotas,
        QuotaKind::Request,
        &user,
        &client,
        nanos_to_percentage(busy.as_nanos()),
    );
    if let Some(connection) = throttled {
        connection.mute_for(throttle);
    }
    reply
}

/// A future and the time spent polling it.
struct Timed<Inner> {
    inner: Inner,
    busy: Duration,
}

impl<Inner: std::future::Future + Unpin> std::future::Future for Timed<Inner> {
    type Output = (Inner::Output, Duration);
    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let started = Instant::now();
        let polled = std::pin::Pin::new(&mut self.inner).poll(cx);
        self.busy += started.elapsed();
        polled.map(|reply| (reply, self.busy))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_metadata::{ClientQuotaEntity, QuotaEntityName};

    fn quotas(client: &str, key: &str, v: f64) -> Quotas {
        let mut q = Quotas::new();
        q.entry(ClientQuotaEntity {
            user: None,
            client_id: Some(QuotaEntityName::Named(client.into())),
        })
        .or_default()
        .insert(key.into(), v);
        q
    }

    #[test]
    fn principal_user() {
        assert_eq!(user_of(Some("User:alice")), "alice");
        assert_eq!(user_of(Some("User:CN=x,O=y")), "CN=x,O=y");
        assert_eq!(user_of(None), "ANONYMOUS");
    }

    #[test]
    fn records_only_with_a_quota() {
        let m = QuotaManager::default();
        let q = quotas("c", "producer_byte_rate", 100.0);
        assert_eq!(m.record_at(&q, QuotaKind::Produce, "u", "other", 1e9, 0), 0);
        assert_eq!(m.record_at(&q, QuotaKind::Fetch, "u", "c", 1e9, 0), 0);
        // 3000 B at once over the minimum 10 s window: 300 B/s, 20 s.
        assert_eq!(
            m.record_at(&q, QuotaKind::Produce, "u", "c", 3000.0, 0),
            20_000
        );
        let text = m.render();
        assert!(text.contains(
            "tessera_quota_bytes_total{kind=\"produce\",user=\"\",client_id=\"c\"} 3000"
        ));
        assert!(text.contains(
            "tessera_quota_throttle_time_ms_total{kind=\"produce\",user=\"\",client_id=\"c\"} 20000"
        ));
        assert_eq!(
            m.max_value_in_window(&q, QuotaKind::Produce, "u", "c"),
            Some(1000.0)
        );
    }

    #[test]
    fn idle_sensors_expire_with_their_metrics() {
        let m = QuotaManager::default();
        let mut q = quotas("gone", "producer_byte_rate", 1e9);
        q.extend(quotas("live", "producer_byte_rate", 1e9));
        m.record_at(&q, QuotaKind::Produce, "u", "gone", 10.0, 0);
        m.record_at(&q, QuotaKind::Produce, "u", "live", 10.0, 0);
        m.record_at(
            &q,
            QuotaKind::Produce,
            "u",
            "live",
            10.0,
            SENSOR_EXPIRY_MS - 1,
        );
        assert!(m.render().contains("client_id=\"gone\""));
        m.record_at(
            &q,
            QuotaKind::Produce,
            "u",
            "live",
            10.0,
            SENSOR_EXPIRY_MS + 60_000,
        );
        let text = m.render();
        assert!(!text.contains("client_id=\"gone\""), "{text}");
        assert!(text.contains(
            "tessera_quota_bytes_total{kind=\"produce\",user=\"\",client_id=\"live\"} 30"
        ));
    }

    #[test]
    fn request_throttle_is_bounded_by_a_window() {
        let m = QuotaManager::default();
        let q = quotas("c", "request_percentage", 1.0);
        assert_eq!(m.record_at(&q, QuotaKind::Request, "u", "c", 1e6, 0), 1000);
    }

    #[test]
    fn unrecord_takes_back() {
        let m = QuotaManager::default();
        let q = quotas("c", "consumer_byte_rate", 100.0);
        assert!(m.record(&q, QuotaKind::Fetch, "u", "c", 5000.0) > 0);
        m.unrecord(&q, QuotaKind::Fetch, "u", "c", 5000.0);
        assert_eq!(m.record(&q, QuotaKind::Fetch, "u", "c", 10.0), 0);
    }

    #[test]
    fn mute() {
        let t = ConnectionThrottle::default();
        assert!(t.muted_until().is_none());
        t.mute_for(0);
        assert!(t.muted_until().is_none());
        t.mute_for(10_000);
        let a = t.muted_until().unwrap();
        t.mute_for(1);
        assert_eq!(t.muted_until(), Some(a));
    }
}
