//! Broker sessions, as in KRaft: every broker heartbeats to the active
//! controller every `broker.heartbeat.interval.ms`; the active controller
//! fences a broker it has not heard from for `broker.session.timeout.ms`
//! (it then takes no new segments and leads nothing in Metadata) and
//! unfences it when it is heard from again. Decisions are
//! `tessera_planner::broker_liveness`; this module is the clock and the I/O.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::Broker;
use crate::error::ApiError;

/// Sealed segments given a new replica per liveness tick (the copying
/// itself is rate-limited by `replica.heal.max.bytes.per.sec`).
const HEAL_SEGMENTS_PER_TICK: usize = 16;

/// Heartbeats this broker to the active controller until the broker is gone.
pub(super) async fn heartbeat(broker: Weak<Broker>) {
    let reporting = Arc::new(AtomicBool::new(false));
    // How much later than asked the last sleep ended: this node did not
    // run meanwhile (paused, starved).
    let mut stall = Duration::ZERO;
    loop {
        let Some(b) = broker.upgrade() else { return };
        if b.is_shutting_down() {
            return; // a controlled shutdown sends its own (want-shutdown) heartbeats
        }
        let interval = Duration::from_millis(b.config.broker_heartbeat_interval_ms.max(1));
        // Unregistered while running (UnregisterBroker of a live broker):
        // as a Kafka broker does on its next heartbeat, register again (a
        // new incarnation, fenced until its heartbeats unfence it).
        if !b.image().brokers.contains_key(&b.config.node_id) {
            match b.register().await {
                Ok(()) => tracing::info!("registered again after being unregistered"),
                Err(e) => tracing::warn!(error = %e, "could not register again"),
            }
        }
        if let Err(e) = b.controller.heartbeat(b.config.node_id).await {
            tracing::debug!(error = %e, "broker heartbeat not delivered");
        }
        // What it writes as primary, for the controller's balance.
        b.report_load();
        // As a primary: a live follower that stays out of sync (its stream
        // keeps failing, its disk refuses, it is too slow) is replaced at
        // the next segment boundary, as the controller replaces fenced ones.
        let image = b.image();
        // After this node did not run for a while its followers look out
        // of sync by its own clock only (their acks are queued, not
        // missing): judged on the next tick, not replaced now.
        let stalled = stall > Duration::from_millis(b.config.replica_lag_time_max_ms) / 2;
        let lagging = b.out_of_sync_followers(&image);
        if !lagging.is_empty() && !stalled {
            replace_followers(&b, &image, &lagging);
        }
        // Its in-sync replicas, as Metadata shows them on every broker
        // (Kafka's leader shrinks and expands the ISR with AlterPartition).
        let reports = if stalled {
            Vec::new()
        } else {
            tessera_planner::in_sync_reports(
                &image,
                b.config.node_id,
                &b.shipped_segments(&image),
                &lagging,
            )
        };
        // Written beside the heartbeats, never in their way (a quorum
        // that is away must not cost this broker its session), one write
        // at a time; a report lost is made again on a later tick.
        if !reports.is_empty() && !reporting.swap(true, Ordering::AcqRel) {
            tracing::info!(?reports, "in-sync replicas changed");
            let (weak, reporting) = (broker.clone(), reporting.clone());
            tokio::spawn(async move {
                if let Some(b) = weak.upgrade() {
                    if let Err(e) = b.controller.write(reports).await {
                        tracing::debug!(error = %e, "in-sync replicas not recorded");
                    }
                }
                reporting.store(false, Ordering::Release);
            });
        }
        drop(b);
        stall = sleep_measuring_stall(interval).await;
    }
}

/// Sleeps `interval`; how much later than that it woke (the process did
/// not run meanwhile: a SIGSTOP, a VM pause, a starved runtime).
async fn sleep_measuring_stall(interval: Duration) -> Duration {
    let asleep = Instant::now();
    tokio::time::sleep(interval).await;
    asleep.elapsed().saturating_sub(interval)
}

/// On the active controller: fences brokers whose session expired or who
/// asked to shut down, and unfences those heard from again. Every voter
/// hears the heartbeats (see `Controller::heartbeat`), so a new leader
/// judges by them at once; only in the first session after this process
/// started has it not heard from everyone yet (the grace).
pub(super) async fn fence_expired_sessions(broker: Weak<Broker>) {
    let mut started = Instant::now();
    let mut stall = Duration::ZERO;
    // When this controller first saw each broker fenced (for healing).
    let mut fenced_since: HashMap<i32, Instant> = HashMap::new();
    // When this controller last looked for ranges to re-place, and last
    // checked the leadership balance.
    let mut last_rebalance: Option<Instant> = None;
    let mut last_leader_check: Option<Instant> = None;
    loop {
        let Some(b) = broker.upgrade() else { return };
        let interval = Duration::from_millis(b.config.broker_heartbeat_interval_ms.max(1));
        let session = Duration::from_millis(b.config.broker_session_timeout_ms);
        // A controller that did not run for half a session (paused,
        // starved) heard no heartbeat meanwhile either, and its raft role
        // may be all that is left of its leadership: it judges sessions
        // again only after a whole one, the grace it has after starting.
        // Judging at once fenced every broker, itself included, and failed
        // over every range of the cluster the moment it resumed (a 3 s
        // SIGSTOP in the fault runs). Kafka's controller, likewise, fences
        // at most one stale broker at a time.
        if stall > session / 2 {
            tracing::warn!(
                stalled_ms = stall.as_millis() as u64,
                "this node did not run for half a broker session; judging sessions again after a whole one"
            );
            started = Instant::now();
        }
        if b.controller.is_leader() {
            let image = b.image();
            let alive: BTreeSet<i32> = image
                .brokers
                .keys()
                .copied()
                .filter(|id| {
                    b.controller
                        .last_heartbeat(*id)
                        .is_some_and(|t| t.elapsed() < session)
                })
                .collect();
            let stopping: BTreeSet<i32> = image
                .brokers
                .keys()
                .copied()
                .filter(|id| b.controller.wants_shutdown(*id))
                .collect();
            let records = tessera_planner::broker_liveness(
                &image,
                &alive,
                &stopping,
                started.elapsed() >= session,
            );
            if !records.is_empty() {
                tracing::info!(?records, "broker sessions: fencing/unfencing");
                if let Err(e) = b.controller.write_on_leader(records).await {
                    tracing::warn!(error = %e, "could not record broker fencing");
                }
            }
            // Failover: every replicated active segment whose primary is
            // fenced is sealed by a quorum of its replicas and reopened on
            // one of them.
            for seg in image.segments.values() {
                let orphaned = !seg.is_sealed()
                    && seg.replicas.len() > 1
                    && seg
                        .primary()
                        .is_some_and(|p| image.brokers.get(&p).is_none_or(|b| b.fenced));
                if orphaned {
                    b.seal_by_quorum(seg.id);
                }
            }
            // A split or merge whose children lost their ids to a
            // concurrent move sealed its parents alone: their partitions
            // get the children they are owed.
            let owed = tessera_planner::complete_moves(&image);
            if !owed.is_empty() {
                tracing::warn!(
                    ?owed,
                    "completing range moves whose children a concurrent move's ids displaced"
                );
                if let Err(e) = b.controller.write_on_leader(owed).await {
                    tracing::warn!(error = %e, "could not complete range moves");
                }
            }
            // A fenced (or unregistered) follower of an active segment
            // leaves it at once: the next segment opens without it, on a
            // spare if there is one, and a set that shrank grows back.
            replace_followers(&b, &image, &std::collections::BTreeSet::new());
            // Healing: the sealed copies of a broker fenced for longer than
            // the heal delay are re-created elsewhere, a few segments a tick.
            let heal_delay = Duration::from_millis(b.config.replica_heal_delay_ms);
            fenced_since.retain(|id, _| image.brokers.get(id).is_some_and(|b| b.fenced));
            for broker in image.brokers.values().filter(|b| b.fenced) {
                fenced_since
                    .entry(broker.registration.broker_id)
                    .or_insert_with(Instant::now);
            }
            let gone: BTreeSet<i32> = fenced_since
                .iter()
                .filter(|(_, since)| since.elapsed() >= heal_delay)
                .map(|(id, _)| *id)
                .collect();
            let heal = tessera_planner::heal_segments(&image, &gone, HEAL_SEGMENTS_PER_TICK);
            if !heal.is_empty() {
                tracing::info!(
                    segments = heal.len(),
                    ?gone,
                    "healing: re-creating copies of sealed segments"
                );
                if let Err(e) = b.controller.write_on_leader(heal).await {
                    tracing::warn!(error = %e, "could not record healing");
                }
            }
            // Re-placement: ranges whose active segment sits on brokers
            // holding clearly more than another live broker (one that just
            // joined) open their next segment there, a few a look.
            let every = Duration::from_millis(b.config.replica_placement_rebalance_interval_ms);
            if b.config.replica_placement_rebalance_enable
                && started.elapsed() >= session
                && last_rebalance.is_none_or(|t| t.elapsed() >= every)
                && b.seals_in_flight() == 0
            {
                last_rebalance = Some(Instant::now());
                rebalance(&b, &image);
            }
            // Leadership balance (Kafka's auto.leader.rebalance.enable):
            // after failovers, or once re-placement made a joined broker a
            // follower, ranges hand their leadership to a follower on a
            // broker that leads fewer.
            // As in Kafka, the first check comes one interval after this
            // node became the active controller.
            let every = Duration::from_secs(b.config.leader_imbalance_check_interval_seconds);
            let since = *last_leader_check.get_or_insert_with(Instant::now);
            if b.config.auto_leader_rebalance_enable
                && started.elapsed() >= session
                && since.elapsed() >= every
                && b.seals_in_flight() == 0
            {
                last_leader_check = Some(Instant::now());
                balance_leaders(&b, &image);
            }
        } else {
            fenced_since.clear();
            last_rebalance = None;
            last_leader_check = None;
        }
        drop(b);
        stall = sleep_measuring_stall(interval).await;
    }
}

/// Followers leave active segments (`tessera_planner::plan_follower_replacements`):
/// fenced ones, or `out_of_sync` ones a primary reports; each carried out
/// by a seal-by-quorum onto the planned replicas.
pub(super) fn replace_followers(
    b: &Broker,
    image: &tessera_metadata::MetadataImage,
    out_of_sync: &std::collections::BTreeSet<(tessera_metadata::SegmentId, i32)>,
) {
    let plans = tessera_planner::plan_follower_replacements(
        image,
        out_of_sync,
        FOLLOWER_REPLACEMENTS_PER_TICK,
    );
    for plan in plans {
        // A primary plans only its own lagging followers' segments; fenced
        // followers are the active controller's.
        if !out_of_sync.is_empty() && !out_of_sync.iter().any(|(s, _)| *s == plan.segment) {
            continue;
        }
        if b.replace_segment(plan.clone()) {
            crate::metrics::Metrics::add(&b.metrics.follower_replacements, 1);
            tracing::info!(
                segment = %plan.segment,
                leaving = plan.from,
                joining = plan.to,
                replicas = ?plan.replicas,
                "replacing a fenced or out-of-sync follower at the next segment boundary"
            );
        }
    }
}

/// Active segments whose followers are replaced per tick, at most.
const FOLLOWER_REPLACEMENTS_PER_TICK: usize = 64;

/// One look for ranges to re-place (`tessera_planner::plan_boundary_moves`:
/// followers swapped, unreplicated ranges moved whole), each carried out by
/// a seal-by-quorum onto its planned replicas.
fn rebalance(b: &Broker, image: &tessera_metadata::MetadataImage) {
    let plans = tessera_planner::plan_boundary_moves(
        image,
        b.config.replica_placement_rebalance_max_ranges,
    );
    if plans.is_empty() {
        return;
    }
    tracing::info!(
        ranges = plans.len(),
        load = ?tessera_planner::replica_load(image),
        "re-placement: moving the next segments of ranges to less loaded brokers"
    );
    for plan in plans {
        tracing::info!(
            segment = %plan.segment,
            from = plan.from,
            to = plan.to,
            replicas = ?plan.replicas,
            "re-placement planned"
        );
        if b.replace_segment(plan) {
            crate::metrics::Metrics::add(&b.metrics.replacements_planned, 1);
        }
    }
}

/// One leadership balance check (`tessera_planner::plan_balance`: by the
/// bytes in the primaries report, then by leader counts), each move
/// carried out by a seal-by-quorum that prefers the follower.
fn balance_leaders(b: &Broker, image: &tessera_metadata::MetadataImage) {
    let rates = b.reported_range_rates(image);
    let settings = tessera_planner::LoadBalanceSettings {
        imbalance: f64::from(b.config.leader_imbalance_per_broker_percentage) / 100.0,
        min_bytes_per_sec: b.config.leader_load_balance_min_bytes_per_sec,
    };
    let moves = tessera_planner::plan_balance(
        image,
        &rates,
        settings,
        b.config.replica_placement_rebalance_max_ranges,
    );
    if moves.is_empty() {
        return;
    }
    tracing::info!(
        ranges = moves.len(),
        leaders = ?tessera_planner::leader_load(image),
        bytes_in = ?tessera_planner::broker_loads(image, &rates),
        "leader balance: handing ranges to followers"
    );
    for m in moves {
        tracing::info!(segment = %m.leader_move.segment, from = m.leader_move.from, to = m.leader_move.to, bytes_per_sec = m.bytes_per_sec, reason = %m.reason, "leader move planned");
        if b.move_leader(m.leader_move.clone()) {
            b.record_balance_decision(&m);
            crate::metrics::Metrics::add(&b.metrics.leader_moves_planned, 1);
        }
    }
}

/// Renews the metadata read lease every heartbeat interval (see
/// [`Broker::image_is_fresh`]): asks the metadata leader for a read point
/// and waits for this node's image to reach it.
pub(super) async fn renew_read_lease(broker: Weak<Broker>) {
    loop {
        let Some(b) = broker.upgrade() else { return };
        let interval = Duration::from_millis(b.config.broker_heartbeat_interval_ms.max(1));
        let controller = b.controller.clone();
        drop(b);
        if let Err(e) = controller.renew_read_lease(interval).await {
            tracing::debug!(error = %e, "metadata read lease not renewed");
        }
        tokio::time::sleep(interval).await;
    }
}

impl Broker {
    /// How long a confirmed-current image vouches for this broker's
    /// leadership of coordinator partitions: less than a broker session,
    /// so a broker that has not renewed stops coordinating before the
    /// controller can have fenced it and moved its partitions (a failover),
    /// and at least one heartbeat interval.
    fn read_lease(&self) -> Duration {
        let interval = self.config.broker_heartbeat_interval_ms.max(1);
        let session = self.config.broker_session_timeout_ms;
        Duration::from_millis(session.saturating_sub(interval).max(interval))
    }

    /// False while this broker's image may be stale: its last confirmed
    /// read point is older than the lease (it was paused, or is cut off
    /// from the metadata quorum). Coordinators then answer NOT_COORDINATOR
    /// until the image is confirmed again, instead of answering from state
    /// another broker may have taken over.
    pub(crate) fn image_is_fresh(&self) -> bool {
        self.controller.image_is_fresh(self.read_lease())
    }

    /// What a read past this broker's log answers. OFFSET_OUT_OF_RANGE
    /// makes a consumer reset its position (to the beginning with
    /// `auto.offset.reset=earliest`: everything read again). From a broker
    /// whose image may be stale (a paused or cut-off primary that another
    /// broker has replaced) it may only mean that this log stopped where
    /// the lead moved on: NOT_LEADER_OR_FOLLOWER sends the client to look
    /// the leader up again instead.
    pub(crate) fn offset_out_of_range(&self) -> ApiError {
        if self.image_is_fresh() {
            ApiError::OffsetOutOfRange
        } else {
            ApiError::NotLeaderOrFollower
        }
    }
}

/// Starts both loops and the read lease's renewal.
pub(super) fn start(broker: &Arc<Broker>) {
    tokio::spawn(renew_read_lease(Arc::downgrade(broker)));
    tokio::spawn(heartbeat(Arc::downgrade(broker)));
    tokio::spawn(fence_expired_sessions(Arc::downgrade(broker)));
}

/// A controller-only node (`process.roles=controller`) is no broker: it
/// does not heartbeat, it only fences, fails over, heals and re-places
/// when it leads the quorum.
pub(super) fn start_controller(broker: &Arc<Broker>) {
    tokio::spawn(fence_expired_sessions(Arc::downgrade(broker)));
}
