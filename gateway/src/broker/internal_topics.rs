//! The internal topics (`__consumer_offsets`, `__transaction_state`) as
//! coordinators use them: created on first use (compacted, replicated as
//! Kafka's `AutoTopicCreationManager` creates them), appended to and read
//! back through the same range logs as any topic. Their names and key
//! hashing are `crate::internal_topics`.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use indexmap::IndexMap;
use kafka_protocol::records::{Compression, Record, RecordBatchDecoder, TimestampType};
use tessera_log::batch::TRANSACTIONAL_BIT;
use tessera_log::now_ms;
use tessera_log::records::{build_batch, KeyValue};
use tessera_metadata::{MetadataImage, TopicImage};

use crate::broker::{Broker, NewTopic};
use crate::coordinator::{PartitionWriter, ProducerIdSource};
use crate::error::ApiError;

impl Broker {
    /// Returns the internal topic, creating it (compacted) if it does not exist.
    pub async fn ensure_internal_topic(
        &self,
        name: &str,
        partitions: u32,
    ) -> Result<Arc<TopicImage>, ApiError> {
        if let Some(t) = self.image().topic_by_name(name) {
            return Ok(t.clone());
        }
        let mut configs = BTreeMap::new();
        configs.insert("cleanup.policy".to_string(), "compact".to_string());
        let segment_bytes = if name == crate::txn::TRANSACTION_STATE {
            self.config.transaction_state_log_segment_bytes
        } else {
            self.config.offsets_topic_segment_bytes
        };
        configs.insert("segment.bytes".to_string(), segment_bytes.to_string());
        // Kafka's keys and default (3), capped at the live brokers so that a
        // single node or a small cluster still gets its coordinators.
        let wanted = if name == crate::txn::TRANSACTION_STATE {
            self.config.transaction_state_log_replication_factor
        } else {
            self.config.offsets_topic_replication_factor
        };
        let live = self.image().brokers.values().filter(|b| !b.fenced).count();
        let topic = NewTopic {
            name: name.to_string(),
            partitions,
            replication_factor: wanted.clamp(1, live.max(1) as i16),
            configs,
        };
        self.create_or_existing(topic).await
    }

    /// Appends key/value records to one partition of a topic as one batch
    /// and waits until it is durable. Returns the batch's base offset.
    pub async fn append_records(
        &self,
        topic: &TopicImage,
        partition: i32,
        records: &[(Option<Bytes>, Option<Bytes>)],
    ) -> Result<i64, ApiError> {
        if records.is_empty() {
            return Err(ApiError::InvalidRequest("no records to append".into()));
        }
        let now = now_ms();
        let records: Vec<Record> = records
            .iter()
            .enumerate()
            .map(|(i, (key, value))| Record {
                transactional: false,
                control: false,
                delete_horizon: false,
                partition_leader_epoch: -1,
                producer_id: -1,
                producer_epoch: -1,
                timestamp_type: TimestampType::Creation,
                offset: i as i64,
                // The encoder starts a new batch whenever `offset - sequence`
                // changes; this keeps every record in one batch whose base
                // sequence is -1 (no idempotent producer).
                sequence: i as i32 - 1,
                timestamp: now,
                key: key.clone(),
                value: value.clone(),
                headers: IndexMap::new(),
            })
            .collect();
        let buf = tessera_log::records::encode_v2(&records, Compression::None)
            .map_err(|e| ApiError::Storage(format!("encoding internal records: {e}")))?;
        let image = self.image();
        let route = self.route(&image, topic, partition)?;
        self.append_durably(&route, partition as u32, buf.to_vec())
            .await
    }

    /// Reads every record of one partition from its log start to its high
    /// watermark, decoded, with their offsets (for coordinator replay):
    /// through the same path as a consumer's Fetch, so history in ancestor
    /// ranges (splits and merges) and in sealed segments held by other
    /// replicas is read too.
    pub async fn read_records(
        &self,
        topic: &TopicImage,
        partition: i32,
    ) -> Result<Vec<Record>, ApiError> {
        let broker = self.weak().upgrade().ok_or(ApiError::NotLeaderOrFollower)?;
        let image = self.image();
        let route = self.route(&image, topic, partition)?;
        let p = partition as u32;
        let mut offset = route
            .log
            .offsets(p)?
            .log_start
            .max(image.log_start_offset(topic.id, p));
        let mut out = Vec::new();
        loop {
            let (records, high_watermark) =
                crate::api::fetch::read_internal(&broker, &topic.name, partition, offset, 1 << 20)
                    .await?;
            if records.is_empty() {
                // An empty read below the high watermark is no end: a
                // coordinator loaded from it would lose every record past
                // it (its transactions and committed offsets as of an
                // older record). The load fails and is retried.
                // (The Fetch path already passed over sealed segments the
                // cleaner emptied for the partition: past them is the end.)
                let mut at = offset;
                while let Some(next) = super::past_cleaned_segment_at(&image, topic, p, at) {
                    at = next;
                }
                if at < high_watermark {
                    return Err(ApiError::Storage(format!(
                        "reading {}-{partition}: nothing read at offset {offset}, below the high watermark {high_watermark}",
                        topic.name
                    )));
                }
                return Ok(out);
            }
            // The next read starts past the last batch's last offset, not its
            // last record's: a compacted batch keeps its lastOffsetDelta
            // while records at its end are gone, and a retained empty batch
            // has none.
            let mut next = offset;
            for range in tessera_log::batch::split_batches(&records)
                .map_err(|e| ApiError::CorruptMessage(format!("stored batch: {e}")))?
            {
                let header = tessera_log::batch::parse_header(&records[range])
                    .map_err(|e| ApiError::CorruptMessage(format!("stored batch: {e}")))?;
                next = next.max(header.last_offset() + 1);
            }
            let mut buf: Bytes = records;
            let sets = RecordBatchDecoder::decode_all(&mut buf).map_err(|e| {
                ApiError::CorruptMessage(format!("stored batch does not decode: {e}"))
            })?;
            for set in sets {
                for r in set.records {
                    next = next.max(r.offset + 1);
                    if r.offset >= offset {
                        out.push(r);
                    }
                }
            }
            if next <= offset {
                return Ok(out);
            }
            offset = next;
        }
    }
}

/// The coordinators' view of the broker: its internal topics, through the
/// same range logs as any topic.
impl PartitionWriter for Broker {
    fn image(&self) -> Arc<MetadataImage> {
        Broker::image(self)
    }

    fn check_leader(
        &self,
        image: &MetadataImage,
        topic: &TopicImage,
        partition: i32,
    ) -> Result<i32, ApiError> {
        // A zombie (paused, or cut off from the quorum) may lead here only
        // in its stale image: it coordinates nothing until confirmed.
        if !self.image_is_fresh() {
            return Err(ApiError::NotLeaderOrFollower);
        }
        self.route(image, topic, partition).map(|r| r.leader_epoch)
    }

    async fn ensure_internal_topic(
        &self,
        name: &str,
        partitions: u32,
    ) -> Result<Arc<TopicImage>, ApiError> {
        Broker::ensure_internal_topic(self, name, partitions).await
    }

    async fn append_records(
        &self,
        topic: &TopicImage,
        partition: i32,
        records: &[(Option<Bytes>, Option<Bytes>)],
    ) -> Result<i64, ApiError> {
        Broker::append_records(self, topic, partition, records).await
    }

    async fn append_transactional(
        &self,
        topic: &TopicImage,
        partition: i32,
        producer_id: i64,
        producer_epoch: i16,
        records: &[(Option<Bytes>, Option<Bytes>)],
    ) -> Result<i64, ApiError> {
        let route = self.route(&self.image(), topic, partition)?;
        // The producer's next sequence in this partition (a new epoch starts at 0).
        let sequence = route
            .log
            .producers(partition as u32)?
            .into_iter()
            .find(|(id, _)| *id == producer_id)
            .and_then(|(_, e)| {
                (e.epoch == producer_epoch)
                    .then(|| e.batches.back().map(|b| b.last_seq.wrapping_add(1)))
                    .flatten()
            })
            .unwrap_or(0);
        let kv: Vec<KeyValue<'_>> = records
            .iter()
            .map(|(k, v)| (k.as_deref(), v.as_deref()))
            .collect();
        let batch = build_batch(
            producer_id,
            producer_epoch,
            sequence,
            TRANSACTIONAL_BIT,
            now_ms(),
            &kv,
        );
        self.append_durably(&route, partition as u32, batch).await
    }

    async fn read_records(
        &self,
        topic: &TopicImage,
        partition: i32,
    ) -> Result<Vec<Record>, ApiError> {
        Broker::read_records(self, topic, partition).await
    }
}

impl ProducerIdSource for Broker {
    async fn next_producer_id(&self) -> Result<i64, ApiError> {
        self.producer_ids
            .next_id(&self.controller, self.config.node_id)
            .await
    }
}

impl crate::groups::GroupHost for Broker {
    fn group_coordinator(&self) -> &crate::groups::GroupCoordinator {
        &self.groups
    }

    fn serving(&self) -> bool {
        self.is_ready() && !self.is_shutting_down()
    }
}
