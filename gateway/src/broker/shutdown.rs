//! Controlled shutdown (Kafka's `controlled.shutdown.enable`): before a
//! broker stops on SIGTERM, the leadership of every replicated range it
//! leads moves to another replica, so clients follow the new leaders at
//! once instead of waiting a session timeout for the controller to notice.
//!
//! As in KRaft, the broker stops heartbeating and asks the active
//! controller to fence it (a heartbeat with `wantShutDown`); the controller
//! then fails over the ranges it leads, as for a broker whose session
//! expired, but at once, and fenced brokers never lead the next segments,
//! so brokers stopping together do not hand leadership to each other. The
//! broker also runs those seals-by-quorum itself, preferring any other
//! replica as the next primary (whichever write lands first wins; replay
//! skips the other). New appends are refused first (NOT_LEADER_OR_FOLLOWER,
//! which clients retry) and the followers catch up, so every replica ends
//! at the same place: the seal loses nothing and the next segment opens on
//! a follower. A range with one replica cannot move; it keeps serving
//! until the broker stops.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tessera_metadata::{MetadataImage, SegmentId};

use super::Broker;

/// How long the followers get to catch up before the seal.
const CATCH_UP: Duration = Duration::from_secs(2);

/// The active replicated segments `me` leads that could move: another of
/// their replicas is live.
pub(super) fn movable_segments(image: &MetadataImage, me: i32) -> BTreeSet<SegmentId> {
    image
        .segments
        .values()
        .filter(|s| !s.is_sealed() && s.primary() == Some(me) && s.replicas.len() > 1)
        .filter(|s| {
            s.replicas[1..]
                .iter()
                .any(|r| image.brokers.get(r).is_some_and(|b| !b.fenced))
        })
        .map(|s| s.id)
        .collect()
}

impl Broker {
    /// True once a controlled shutdown began: replicated ranges take no
    /// new requests here.
    pub(crate) fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Acquire)
    }

    /// Moves the leadership of the replicated ranges this broker leads to
    /// other replicas (see the module docs). Gives up after
    /// `controlled.shutdown.max.retries` attempts of
    /// `controlled.shutdown.retry.backoff.ms` each; what did not move then
    /// fails over the usual way once the broker's session expires.
    pub async fn controlled_shutdown(&self) {
        if !self.config.controlled_shutdown_enable {
            return;
        }
        let me = self.config.node_id;
        if movable_segments(&self.image(), me).is_empty() {
            return;
        }
        self.shutting_down.store(true, Ordering::Release);
        tracing::info!("controlled shutdown: moving leadership to other replicas");
        // The followers catch up with what was appended before the refusal.
        for (range, log) in self.shipped_logs() {
            let written = *log.subscribe_written().borrow();
            if tokio::time::timeout(CATCH_UP, log.wait_durable(written))
                .await
                .is_err()
            {
                tracing::warn!(range, "controlled shutdown: followers did not catch up");
            }
        }
        let backoff = Duration::from_millis(self.config.controlled_shutdown_retry_backoff_ms);
        for attempt in 1..=self.config.controlled_shutdown_max_retries.max(1) {
            let pending = movable_segments(&self.image(), me);
            if pending.is_empty() {
                break;
            }
            if let Err(e) = self.controller.request_shutdown(me).await {
                tracing::warn!(error = %e, "controlled shutdown: the controller was not reached");
            }
            tracing::info!(
                attempt,
                segments = pending.len(),
                "controlled shutdown: sealing"
            );
            for &segment in &pending {
                self.seal_by_quorum_avoiding(segment, Some(me));
            }
            let deadline = tokio::time::Instant::now() + backoff;
            while tokio::time::Instant::now() < deadline
                && !movable_segments(&self.image(), me).is_empty()
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        let left = movable_segments(&self.image(), me);
        if left.is_empty() {
            tracing::info!("controlled shutdown: leadership moved");
        } else {
            tracing::warn!(
                segments = left.len(),
                "controlled shutdown: some ranges still led here; they fail over after the session expires"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_metadata::{BrokerRegistration, MetadataRecord, SegmentOpenRecord};

    fn image(records: Vec<MetadataRecord>) -> MetadataImage {
        let mut image = MetadataImage::empty();
        for (offset, r) in records.iter().enumerate() {
            image.apply(r, offset as i64);
        }
        image
    }

    fn broker(id: i32) -> MetadataRecord {
        MetadataRecord::RegisterBroker(BrokerRegistration {
            broker_id: id,
            incarnation_id: uuid::Uuid::new_v4(),
            host: "h".into(),
            port: 1,
            rack: None,
        })
    }

    fn open(range: u64, replicas: Vec<i32>) -> MetadataRecord {
        MetadataRecord::OpenSegment(SegmentOpenRecord {
            segment: SegmentId::new(range, 0),
            replicas,
            leader_epoch: 0,
        })
    }

    #[test]
    fn only_replicated_segments_with_a_live_follower_move() {
        let image = image(vec![
            broker(1),
            broker(2),
            broker(3),
            MetadataRecord::UnfenceBroker { broker_id: 1 },
            MetadataRecord::UnfenceBroker { broker_id: 2 },
            open(1, vec![1, 2, 3]), // moves
            open(2, vec![1]),       // one replica: stays
            open(3, vec![2, 1, 3]), // led elsewhere
            open(4, vec![1, 3]),    // the only follower is fenced
        ]);
        assert_eq!(
            movable_segments(&image, 1),
            BTreeSet::from([SegmentId::new(1, 0)])
        );
        assert!(movable_segments(&image, 3).is_empty());
    }
}
