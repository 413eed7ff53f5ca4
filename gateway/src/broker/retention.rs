//! Retention: every `log.retention.check.interval.ms`, the primary of each
//! active range (the broker holding its segment files and their index, so
//! it knows each sealed segment's largest timestamp) plans with
//! [`tessera_planner::plan_retention`] which of the range's oldest sealed
//! segments are past its topic's `retention.ms` / `retention.bytes` (or
//! wholly below the log start) and writes the `DeleteSegment` and
//! `SetLogStartOffset` records through the controller, one entry per range.
//! Every broker holding a copy deletes the files when its reconcile pass
//! sees the segment gone from the image (`reconcile.rs`).
//!
//! Ancestor ranges (sealed by a split or merge, still holding history)
//! are trimmed the same way by time and the log start, by the primary of
//! their last segment, which they keep.
//!
//! Only topics whose `cleanup.policy` includes `delete` are touched (Kafka's
//! rule), and never the internal topics: their coordinators load their state
//! from the whole log (there is no compaction yet).

use std::sync::{Arc, Weak};
use std::time::Duration;

use tessera_metadata::RangeId;

use super::Broker;
use crate::topic_config::EffectiveTopicConfig;

impl Broker {
    /// One retention pass over the ranges this broker is primary of.
    pub(crate) async fn enforce_retention(&self) {
        let image = self.image();
        let me = self.config.node_id;
        let view = crate::dynamic_config::BrokerView::new(&self.config, &image);
        let logs: Vec<(RangeId, Arc<tessera_log::RangeLog>)> = self
            .logs
            .read()
            .iter()
            .map(|(id, log)| (*id, log.clone()))
            .collect();
        for (range_id, log) in logs {
            let Some(range) = image.ranges.get(&range_id) else {
                continue;
            };
            let Some(topic) = image.topics.get(&range.topic_id) else {
                continue;
            };
            // An active range is trimmed by its primary; an ancestor (sealed
            // by a split or merge) by the primary of its last segment, which
            // keeps its log open for the history.
            let steward = if range.active {
                if log.is_sealed() {
                    continue;
                }
                image.active_segment(range_id).and_then(|s| s.primary())
            } else {
                image.segments_of(range_id).last().and_then(|s| s.primary())
            };
            if steward != Some(me) || crate::internal_topics::is_internal(&topic.name) {
                continue;
            }
            let policy = topic
                .configs
                .get("cleanup.policy")
                .map(String::as_str)
                .or_else(|| view.dynamic("log.cleanup.policy"))
                .unwrap_or(&self.config.log_cleanup_policy);
            if !policy.split(',').any(|p| p.trim() == "delete") {
                continue;
            }
            let effective = EffectiveTopicConfig::resolve(&topic.configs, &view);
            let (sealed, active_bytes) = log.retention_view();
            let input = tessera_planner::RetentionInput {
                retention_ms: effective.retention_ms,
                retention_bytes: effective.retention_bytes,
                now_ms: tessera_log::range_log::now_ms(),
                max_timestamps: sealed.iter().map(|&(seq, _, ts)| (seq, ts)).collect(),
                active_bytes,
            };
            let records = tessera_planner::plan_retention(&image, range_id, &input);
            if records.is_empty() {
                continue;
            }
            tracing::info!(
                topic = %topic.name,
                range = range_id,
                records = records.len(),
                "retention: deleting sealed segments"
            );
            if let Err(e) = self.controller.write(records).await {
                tracing::warn!(range = range_id, error = %e, "could not record retention");
            }
        }
    }
}

/// Runs retention passes until the broker is gone.
pub(super) async fn enforce(broker: Weak<Broker>) {
    loop {
        let Some(b) = broker.upgrade() else { return };
        let interval = Duration::from_millis(b.config.log_retention_check_interval_ms.max(1));
        if b.is_ready() && !b.is_shutting_down() {
            b.enforce_retention().await;
        }
        drop(b);
        tokio::time::sleep(interval).await;
    }
}
