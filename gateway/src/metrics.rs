//! Prometheus metrics, rendered in the text exposition format.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

/// Request counters per API key (indexed by key), plus data-path totals.
pub struct Metrics {
    requests: Vec<AtomicU64>,
    request_errors: Vec<AtomicU64>,
    pub produced_batches: AtomicU64,
    pub produced_bytes: AtomicU64,
    /// Batches and bytes written at their source offsets (MigrateAppend).
    pub migrated_batches: AtomicU64,
    pub migrated_bytes: AtomicU64,
    pub fetched_bytes: AtomicU64,
    /// Of those, served by this broker as a follower (KIP-392).
    pub follower_fetched_bytes: AtomicU64,
    /// Bytes a leader read from another replica's sealed copy for a fetch.
    pub remote_read_bytes: AtomicU64,
    pub connections_opened: AtomicU64,
    pub connections_closed: AtomicU64,
    pub rejected_frames: AtomicU64,
    pub range_splits: AtomicU64,
    pub range_merges: AtomicU64,
    /// Ranges whose next segment opened on a new replica set (re-placement).
    pub segments_replaced: AtomicU64,
    /// Times a range this broker is to lead waited for the producer
    /// snapshot of the history it does not hold.
    pub producer_snapshot_waits: AtomicU64,
    /// Ranges this broker handed to another replica because no replica
    /// served the producer snapshot it needed to lead them.
    pub producer_snapshot_resignations: AtomicU64,
    /// Times a range this broker is to lead waited for copies of its
    /// sealed segments to be repaired here first.
    pub history_repair_waits: AtomicU64,
    /// Followers of an active segment replaced at a segment boundary
    /// because they were fenced or out of sync.
    pub follower_replacements: AtomicU64,
    /// Re-placements planned by the active controller.
    pub replacements_planned: AtomicU64,
    /// Segment rolls this node recorded with the next segment on other
    /// replicas than the rolled one (placement at a roll).
    pub roll_placements: AtomicU64,
    /// Leadership moves planned by the active controller, and those that
    /// ended with the planned follower leading.
    pub leader_moves_planned: AtomicU64,
    pub leader_moves_done: AtomicU64,
    /// SASL authentications that succeeded / failed.
    pub authentications_succeeded: AtomicU64,
    pub authentications_failed: AtomicU64,
    /// TLS handshakes that failed or timed out (plaintext on a TLS port,
    /// a refused client certificate).
    pub tls_handshake_failures: AtomicU64,
    /// Admin HTTP requests refused (401 or 403).
    pub admin_requests_refused: AtomicU64,
    /// KIP-368: re-authentications that succeeded / failed, and
    /// connections closed because their session expired un-renewed.
    pub reauthentications_succeeded: AtomicU64,
    pub reauthentications_failed: AtomicU64,
    pub expired_sessions_killed: AtomicU64,
    /// Connections closed by `connections.max.idle.ms` (idle, or trickling
    /// a request), and refused at accept by `max.connections.per.ip`.
    pub connections_idle_closed: AtomicU64,
    pub connections_rejected: AtomicU64,
    /// Operations the authorizer denied (`authorizer.class.name` set).
    pub authorization_denied: AtomicU64,
    /// Replication upgrades refused: not the inter-broker listener, not
    /// authenticated, or a principal without CLUSTER_ACTION.
    pub replication_upgrades_refused: AtomicU64,
    /// Log cleaner: segment bytes read and written by cleaning passes (as
    /// they go), and the bytes the rewritten segments held before and after.
    pub cleaner_io_bytes: AtomicU64,
    pub cleaner_bytes_before: AtomicU64,
    pub cleaner_bytes_after: AtomicU64,
    pub cleaner_passes: AtomicU64,
}

const API_SLOTS: usize = 128;

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            requests: (0..API_SLOTS).map(|_| AtomicU64::new(0)).collect(),
            request_errors: (0..API_SLOTS).map(|_| AtomicU64::new(0)).collect(),
            produced_batches: AtomicU64::new(0),
            produced_bytes: AtomicU64::new(0),
            migrated_batches: AtomicU64::new(0),
            migrated_bytes: AtomicU64::new(0),
            fetched_bytes: AtomicU64::new(0),
            follower_fetched_bytes: AtomicU64::new(0),
            remote_read_bytes: AtomicU64::new(0),
            connections_opened: AtomicU64::new(0),
            connections_closed: AtomicU64::new(0),
            rejected_frames: AtomicU64::new(0),
            range_splits: AtomicU64::new(0),
            range_merges: AtomicU64::new(0),
            segments_replaced: AtomicU64::new(0),
            producer_snapshot_waits: AtomicU64::new(0),
            producer_snapshot_resignations: AtomicU64::new(0),
            history_repair_waits: AtomicU64::new(0),
            follower_replacements: AtomicU64::new(0),
            replacements_planned: AtomicU64::new(0),
            roll_placements: AtomicU64::new(0),
            leader_moves_planned: AtomicU64::new(0),
            leader_moves_done: AtomicU64::new(0),
            authentications_succeeded: AtomicU64::new(0),
            authentications_failed: AtomicU64::new(0),
            tls_handshake_failures: AtomicU64::new(0),
            admin_requests_refused: AtomicU64::new(0),
            reauthentications_succeeded: AtomicU64::new(0),
            reauthentications_failed: AtomicU64::new(0),
            expired_sessions_killed: AtomicU64::new(0),
            connections_idle_closed: AtomicU64::new(0),
            connections_rejected: AtomicU64::new(0),
            authorization_denied: AtomicU64::new(0),
            replication_upgrades_refused: AtomicU64::new(0),
            cleaner_io_bytes: AtomicU64::new(0),
            cleaner_bytes_before: AtomicU64::new(0),
            cleaner_bytes_after: AtomicU64::new(0),
            cleaner_passes: AtomicU64::new(0),
        }
    }
}

fn api_name(key: usize) -> String {
    kafka_protocol::messages::ApiKey::try_from(key as i16)
        .map(|k| format!("{k:?}"))
        .unwrap_or_else(|_| key.to_string())
}

impl Metrics {
    pub fn count_request(&self, api_key: i16) {
        if let Some(c) = self.requests.get(api_key as usize) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn count_error(&self, api_key: i16) {
        if let Some(c) = self.request_errors.get(api_key as usize) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// Renders every metric; `extra` gauges come from the broker's state.
    pub fn render(&self, gauges: &[(&str, &str, u64)]) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# HELP tessera_requests_total Kafka requests received, by API."
        );
        let _ = writeln!(out, "# TYPE tessera_requests_total counter");
        for (key, c) in self.requests.iter().enumerate() {
            let n = c.load(Ordering::Relaxed);
            if n > 0 {
                let _ = writeln!(
                    out,
                    "tessera_requests_total{{api=\"{}\"}} {n}",
                    api_name(key)
                );
            }
        }
        let _ = writeln!(out, "# HELP tessera_request_errors_total Requests answered with an error or refused, by API.");
        let _ = writeln!(out, "# TYPE tessera_request_errors_total counter");
        for (key, c) in self.request_errors.iter().enumerate() {
            let n = c.load(Ordering::Relaxed);
            if n > 0 {
                let _ = writeln!(
                    out,
                    "tessera_request_errors_total{{api=\"{}\"}} {n}",
                    api_name(key)
                );
            }
        }
        let counters = [
            (
                "tessera_produced_batches_total",
                "Record batches appended.",
                &self.produced_batches,
            ),
            (
                "tessera_produced_bytes_total",
                "Record batch bytes appended.",
                &self.produced_bytes,
            ),
            (
                "tessera_migrated_batches_total",
                "Record batches written at their source offsets by tessera migrate (MigrateAppend).",
                &self.migrated_batches,
            ),
            (
                "tessera_migrated_bytes_total",
                "Record batch bytes written at their source offsets by tessera migrate.",
                &self.migrated_bytes,
            ),
            (
                "tessera_fetched_bytes_total",
                "Record bytes returned by Fetch.",
                &self.fetched_bytes,
            ),
            (
                "tessera_follower_fetched_bytes_total",
                "Record bytes returned by Fetch from sealed copies this broker follows (KIP-392).",
                &self.follower_fetched_bytes,
            ),
            (
                "tessera_remote_read_bytes_total",
                "Record bytes a leader read from another replica's sealed copy (a segment of its partition it holds no copy of).",
                &self.remote_read_bytes,
            ),
            (
                "tessera_successful_authentication_total",
                "SASL authentications that succeeded (Kafka's successful-authentication-total).",
                &self.authentications_succeeded,
            ),
            (
                "tessera_failed_authentication_total",
                "SASL authentications refused: wrong credentials, a disabled mechanism, a request before authentication (Kafka's failed-authentication-total).",
                &self.authentications_failed,
            ),
            (
                "tessera_admin_requests_refused_total",
                "Admin HTTP requests answered 401 (no or wrong credentials) or 403 (the ACLs deny the principal).",
                &self.admin_requests_refused,
            ),
            (
                "tessera_tls_handshake_failures_total",
                "TLS handshakes that failed or timed out (a plaintext client on a TLS port, a refused client certificate).",
                &self.tls_handshake_failures,
            ),
            (
                "tessera_successful_reauthentication_total",
                "SASL re-authentications (KIP-368) that succeeded (Kafka's successful-reauthentication-total).",
                &self.reauthentications_succeeded,
            ),
            (
                "tessera_failed_reauthentication_total",
                "SASL re-authentications refused (Kafka's failed-reauthentication-total).",
                &self.reauthentications_failed,
            ),
            (
                "tessera_expired_connections_killed_total",
                "Connections closed because a request came after their SASL session expired (Kafka's expired-connections-killed-count).",
                &self.expired_sessions_killed,
            ),
            (
                "tessera_connections_idle_closed_total",
                "Connections closed by connections.max.idle.ms: idle, or sending a request slower than that (slowloris).",
                &self.connections_idle_closed,
            ),
            (
                "tessera_connections_rejected_total",
                "Connections closed at accept because their address was at max.connections.per.ip.",
                &self.connections_rejected,
            ),
            (
                "tessera_authorization_denied_total",
                "Operations on a resource the authorizer denied (one per resource checked).",
                &self.authorization_denied,
            ),
            (
                "tessera_replication_upgrades_refused_total",
                "Connections that asked to become a replication stream and were closed: not on the inter-broker listener, not authenticated, or without CLUSTER_ACTION on the cluster.",
                &self.replication_upgrades_refused,
            ),
            (
                "tessera_connections_opened_total",
                "Client connections accepted.",
                &self.connections_opened,
            ),
            (
                "tessera_connections_closed_total",
                "Client connections closed.",
                &self.connections_closed,
            ),
            (
                "tessera_rejected_frames_total",
                "Frames refused before decoding (size cap, bad header).",
                &self.rejected_frames,
            ),
            (
                "tessera_range_splits_total",
                "Ranges split by the automatic policy.",
                &self.range_splits,
            ),
            (
                "tessera_range_merges_total",
                "Range pairs merged by the automatic policy.",
                &self.range_merges,
            ),
            (
                "tessera_segments_replaced_total",
                "Ranges whose next segment this node opened on a new replica set (re-placement at a segment boundary: a follower moved to a less loaded broker).",
                &self.segments_replaced,
            ),
            (
                "tessera_producer_snapshot_waits_total",
                "Times a range this node is primary of was not served (NOT_LEADER_OR_FOLLOWER) because the producer snapshot of the history it does not hold was not here yet and no replica served it at once.",
                &self.producer_snapshot_waits,
            ),
            (
                "tessera_producer_snapshot_resignations_total",
                "Ranges this node was to lead and handed to another replica (a seal by quorum avoiding it) because no replica served the producer snapshot it needed.",
                &self.producer_snapshot_resignations,
            ),
            (
                "tessera_history_repair_waits_total",
                "Times a range this node is primary of was not served (NOT_LEADER_OR_FOLLOWER) because its copies of the range's sealed segments were still being repaired here.",
                &self.history_repair_waits,
            ),
            (
                "tessera_follower_replacements_total",
                "Followers of an active segment this node replaced at a segment boundary because their broker was fenced or they stayed out of sync longer than replica.lag.time.max.ms.",
                &self.follower_replacements,
            ),
            (
                "tessera_segment_replacements_planned_total",
                "Re-placements this node planned as the active controller (some end as plain seals when the image moved on).",
                &self.replacements_planned,
            ),
            (
                "tessera_segment_roll_placements_total",
                "Segment rolls this node recorded with the next segment on other replicas than the rolled one (replica.placement.roll.enable).",
                &self.roll_placements,
            ),
            (
                "tessera_leader_moves_planned_total",
                "Leadership moves this node planned as the active controller (auto.leader.rebalance.enable).",
                &self.leader_moves_planned,
            ),
            (
                "tessera_leader_moves_total",
                "Leadership moves this node carried out that ended with the planned follower leading the range's next segment (the others end as plain seals).",
                &self.leader_moves_done,
            ),
            (
                "tessera_cleaner_passes_total",
                "Log cleaner passes that rewrote at least one segment.",
                &self.cleaner_passes,
            ),
            (
                "tessera_cleaner_io_bytes_total",
                "Segment bytes the log cleaner read and wrote (what log.cleaner.io.max.bytes.per.second paces).",
                &self.cleaner_io_bytes,
            ),
            (
                "tessera_cleaner_cleaned_bytes_total",
                "Bytes of the segments the log cleaner rewrote, before cleaning.",
                &self.cleaner_bytes_before,
            ),
            (
                "tessera_cleaner_kept_bytes_total",
                "Bytes of the segments the log cleaner rewrote, after cleaning.",
                &self.cleaner_bytes_after,
            ),
        ];
        for (name, help, c) in counters {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
                c.load(Ordering::Relaxed)
            );
        }
        for (name, help, v) in gauges {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_prometheus_text() {
        let m = Metrics::default();
        m.count_request(0);
        m.count_request(0);
        Metrics::add(&m.produced_bytes, 10);
        let text = m.render(&[("tessera_range_logs", "Open range logs.", 3)]);
        assert!(text.contains("tessera_requests_total{api=\"Produce\"} 2"));
        assert!(text.contains("tessera_produced_bytes_total 10"));
        assert!(text.contains("tessera_range_logs 3"));
    }
}
