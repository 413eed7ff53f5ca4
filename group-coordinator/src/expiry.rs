//! Committed offsets expire as Kafka's group coordinator expires them
//! (KIP-211, KIP-496; `OffsetMetadataManager.cleanupExpiredOffsets`):
//! every `offsets.retention.check.interval.ms`, each loaded group drops the
//! offsets of topics it is not subscribed to once they are
//! `offsets.retention.minutes` old, counted from the moment a classic
//! group with a protocol became Empty, else from the commit itself; the
//! offsets of topics that no longer exist go at once. Each is tombstoned in
//! `__consumer_offsets` (the log cleaner then removes them), and a group
//! that can be deleted (Empty) and has no offset left is deleted.

use std::sync::Weak;
use std::time::Duration;

use super::classic::ClassicState;
use super::records::CoordinatorRecord;
use super::{Group, GroupCoordinator, GroupOffsets};
use crate::GroupHost;
use tessera_server_common::coordinator::PartitionWriter;

/// The offsets of `group` that expire at `now` (pure): `(topic, partition)`.
pub fn expired_offsets(
    group: &Group,
    offsets: &GroupOffsets,
    now: i64,
    retention_ms: i64,
    topic_exists: impl Fn(&str) -> bool,
) -> Vec<(String, i32)> {
    // Kafka's ClassicGroup: an Empty group with a protocol counts from the
    // time it became Empty; a simple group (no protocol) and a KIP-848
    // group from each offset's commit.
    let empty_since = match group {
        Group::Classic(g)
            if g.state() == ClassicState::Empty
                && g.protocol_type().is_some_and(|p| !p.is_empty())
                && g.state_timestamp() >= 0 =>
        {
            Some(g.state_timestamp())
        }
        _ => None,
    };
    let kind = group.kind();
    offsets
        .iter()
        .filter(|(topic, _, o)| {
            !topic_exists(topic)
                || (!kind.is_subscribed_to_topic(topic)
                    && empty_since
                        .unwrap_or(o.commit_timestamp)
                        .saturating_add(retention_ms)
                        <= now)
        })
        .map(|(t, p, _)| (t.to_string(), p))
        .collect()
}

impl GroupCoordinator {
    /// One expiry pass over the groups loaded here; the offsets removed.
    pub async fn expire_offsets<W: PartitionWriter + ?Sized>(&self, writer: &W) -> usize {
        let retention_ms = self.offsets_retention_minutes.saturating_mul(60_000);
        let slots: Vec<_> = self.groups.lock().values().cloned().collect();
        let mut removed = 0;
        for slot in slots {
            let mut entry = slot.entry.clone().lock_owned().await;
            if entry.removed {
                continue;
            }
            let image = writer.image();
            let now = self.now();
            let expired = expired_offsets(
                &entry.state.group,
                &entry.state.offsets,
                now,
                retention_ms,
                |t| image.topic_by_name(t).is_some(),
            );
            if expired.is_empty() {
                continue;
            }
            let group_id = slot.group_id.clone();
            let mut records: Vec<CoordinatorRecord> = expired
                .iter()
                .map(|(t, p)| CoordinatorRecord::OffsetCommit {
                    group: group_id.clone(),
                    topic: t.clone(),
                    partition: *p,
                    value: None,
                })
                .collect();
            let delete_group = expired.len() == entry.state.offsets.len()
                && entry.state.group.kind().validate_delete().is_ok();
            if delete_group {
                records.extend(entry.state.group.tombstones(&group_id));
            }
            if let Err(e) = self.append(writer, &group_id, records).await {
                tracing::warn!(group = %group_id, error = %e, "could not expire offsets");
                continue;
            }
            for (t, p) in &expired {
                entry.state.offsets.remove(t, *p);
            }
            removed += expired.len();
            tracing::info!(group = %group_id, offsets = expired.len(), deleted = delete_group, "expired committed offsets");
            if delete_group {
                if let Group::Classic(g) = &mut entry.state.group {
                    let _ = g.mark_dead(now);
                }
                self.remove_slot(&slot, &mut entry);
            }
        }
        removed
    }
}

/// Runs expiry passes until the broker is gone.
pub(super) async fn run<H: GroupHost>(host: Weak<H>) {
    loop {
        let Some(h) = host.upgrade() else { return };
        let coordinator = h.group_coordinator();
        let interval =
            Duration::from_millis(coordinator.offsets_retention_check_interval_ms.max(1));
        if h.serving() {
            coordinator.expire_offsets(&*h).await;
        }
        drop(h);
        tokio::time::sleep(interval).await;
    }
}

#[cfg(test)]
mod tests;
