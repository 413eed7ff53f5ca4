//! Transaction markers: a COMMIT or ABORT control batch in every partition
//! of a transaction. The coordinator appends those it leads itself and asks
//! the leaders of the others with WriteTxnMarkers (Kafka's inter-broker
//! API); a broker serving WriteTxnMarkers appends through the same path.

use std::collections::BTreeMap;
use std::time::Duration;

use kafka_protocol::messages::write_txn_markers_request::{
    WritableTxnMarker, WritableTxnMarkerTopic,
};
use kafka_protocol::messages::{ProducerId, TopicName, WriteTxnMarkersRequest};
use kafka_protocol::protocol::StrBytes;
use tessera_metadata::RangeId;

use crate::broker::append::DurabilityWaits;
use crate::broker::Broker;
use crate::error::ApiError;
use crate::internal_topics::CONSUMER_OFFSETS;

/// How long a coordinator waits for another broker to write its markers.
const REMOTE_MARKERS_TIMEOUT: Duration = Duration::from_secs(30);

pub use crate::coordinator::Markers;

impl Broker {
    /// Appends the markers to `partitions` this broker leads and waits until
    /// they are durable; the outcome per partition (a partition led
    /// elsewhere is NOT_LEADER_OR_FOLLOWER). When a `__consumer_offsets`
    /// partition took its marker, the group coordinator completes (or
    /// drops) the producer's pending transactional offsets.
    pub async fn write_local_markers(
        &self,
        m: &Markers,
        partitions: &[(String, i32)],
    ) -> Vec<((String, i32), Result<(), ApiError>)> {
        let image = self.image();
        let now = tessera_log::now_ms();
        let mut waits = DurabilityWaits::default();
        let mut outcomes: Vec<((String, i32), Result<RangeId, ApiError>)> = Vec::new();
        for (topic, partition) in partitions {
            let appended = (|| {
                let t = image
                    .topic_by_name(topic)
                    .ok_or(ApiError::UnknownTopicOrPartition)?;
                let route = self.route(&image, t, *partition)?;
                let mut bytes = tessera_log::records::end_txn_marker(
                    m.producer_id,
                    m.producer_epoch,
                    m.commit,
                    m.coordinator_epoch,
                    now,
                );
                let outcome = self.append_batch(&route, *partition as u32, &mut bytes, None)?;
                waits.add(&route, &outcome);
                Ok(route.range_id)
            })();
            outcomes.push(((topic.clone(), *partition), appended));
        }
        let failed = waits.wait(None).await;
        let results: Vec<_> = outcomes
            .into_iter()
            .map(|(key, r)| {
                let r = r.and_then(|range| failed.get(&range).cloned().map_or(Ok(()), Err));
                (key, r)
            })
            .collect();
        if results
            .iter()
            .any(|((t, _), r)| t == CONSUMER_OFFSETS && r.is_ok())
        {
            self.groups.complete_txn(m.producer_id, m.commit).await;
        }
        results
    }

    /// Coordinator side: the markers in every partition of the transaction,
    /// this broker's own appended directly, the others' through
    /// WriteTxnMarkers to their leaders. Fails if any partition did not take
    /// its marker (the transaction stays in its Prepare state and the
    /// coordinator's timer tries again).
    pub async fn write_markers(
        &self,
        m: &Markers,
        partitions: &[(String, i32)],
    ) -> Result<(), ApiError> {
        let image = self.image();
        let mut local = Vec::new();
        let mut remote: BTreeMap<i32, Vec<(String, i32)>> = BTreeMap::new();
        for (topic, partition) in partitions {
            let Some(t) = image.topic_by_name(topic) else {
                continue; // deleted meanwhile
            };
            if *partition < 0 || *partition as u32 >= t.partitions {
                continue;
            }
            let leader = image
                .active_range_for(t.id, *partition as u32)
                .and_then(|r| image.active_segment(r.id))
                .and_then(|s| s.primary());
            match leader {
                Some(id) if id != self.config.node_id => remote
                    .entry(id)
                    .or_default()
                    .push((topic.clone(), *partition)),
                _ => local.push((topic.clone(), *partition)),
            }
        }
        for (_, r) in self.write_local_markers(m, &local).await {
            r?;
        }
        for (leader, partitions) in remote {
            let b = image
                .brokers
                .get(&leader)
                .ok_or(ApiError::NotLeaderOrFollower)?;
            let request = write_request(m, &partitions);
            let response = crate::peer::call(
                &self.inter_broker,
                &b.registration.host,
                b.registration.port,
                1,
                &request,
                REMOTE_MARKERS_TIMEOUT,
            )
            .await
            .map_err(|e| {
                tracing::warn!(leader, error = %e, "WriteTxnMarkers to a partition leader failed");
                ApiError::CoordinatorNotAvailable
            })?;
            for marker in response.markers {
                for t in marker.topics {
                    for p in t.partitions {
                        if p.error_code != 0 {
                            tracing::warn!(leader, topic = %t.name.0, partition = p.partition_index, code = p.error_code, "a partition leader refused a transaction marker");
                            return Err(ApiError::NotLeaderOrFollower);
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

/// The WriteTxnMarkers request for one leader's partitions.
fn write_request(m: &Markers, partitions: &[(String, i32)]) -> WriteTxnMarkersRequest {
    let mut by_topic: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
    for (t, p) in partitions {
        by_topic.entry(t).or_default().push(*p);
    }
    WriteTxnMarkersRequest::default().with_markers(vec![WritableTxnMarker::default()
        .with_producer_id(ProducerId(m.producer_id))
        .with_producer_epoch(m.producer_epoch)
        .with_transaction_result(m.commit)
        .with_coordinator_epoch(m.coordinator_epoch)
        .with_topics(
            by_topic
                .into_iter()
                .map(|(t, ps)| {
                    WritableTxnMarkerTopic::default()
                        .with_name(TopicName(StrBytes::from_string(t.to_string())))
                        .with_partition_indexes(ps)
                })
                .collect(),
        )])
}

impl crate::coordinator::TxnMarkerWriter for Broker {
    async fn write_markers(
        &self,
        markers: &Markers,
        partitions: &[(String, i32)],
    ) -> Result<(), ApiError> {
        Broker::write_markers(self, markers, partitions).await
    }
}

impl crate::txn::TxnTimerHost for Broker {
    fn txn_coordinator(&self) -> &crate::txn::TxnCoordinator {
        &self.txns
    }
}
