//! The broker's state: the metadata controller, the published metadata
//! image, and the open range logs. Topic administration turns into metadata
//! records here; the range logs follow the image (`reconcile`).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;
use tessera_log::{RangeLog, RangeLogOptions, RangeSeed, SealedSegment};
use tessera_metadata::{
    BrokerRegistration, Controller, ControllerConfig, MetadataImage, MetadataRecord, PartitionSpan,
    RangeId, RangeImage, RangeRecord, SegmentId, SegmentOpenRecord, SegmentSealRecord, TopicId,
    TopicImage, TopicRecord,
};
use tessera_replication::{place_replicas, BrokerCandidate};
use tokio::sync::{mpsc, watch};

use crate::config::BrokerConfig;
use crate::error::ApiError;
use crate::groups::GroupCoordinator;
use crate::metrics::Metrics;
use crate::producer_ids::ProducerIdManager;
use crate::topic_config::{validate_topic_name, EffectiveTopicConfig};

/// Where a partition's data lives right now.
#[derive(Clone)]
pub struct PartitionRoute {
    pub range_id: RangeId,
    pub log: Arc<RangeLog>,
    pub leader_epoch: i32,
    pub config: EffectiveTopicConfig,
}

/// A topic creation request, already decoded.
pub struct NewTopic {
    pub name: String,
    pub partitions: u32,
    pub replication_factor: i16,
    pub configs: BTreeMap<String, String>,
}

pub struct Broker {
    pub config: BrokerConfig,
    pub cluster_id: String,
    pub controller: Arc<Controller>,
    pub metrics: Metrics,
    pub producer_ids: ProducerIdManager,
    /// Consumer groups and committed offsets (`__consumer_offsets`).
    pub groups: GroupCoordinator,
    /// Transactions (`__transaction_state`).
    pub txns: crate::txn::TxnCoordinator,
    logs: RwLock<HashMap<RangeId, Arc<RangeLog>>>,
    /// Bumped whenever any high watermark moves: long-polling fetches wait on it.
    pub hw_events: watch::Sender<u64>,
    /// Serializes topic administration and reconciliation.
    pub(crate) admin: tokio::sync::Mutex<()>,
    rolls: mpsc::UnboundedSender<(RangeId, SealedSegment)>,
    ready: AtomicBool,
}

/// Reads or creates `meta.properties` (Kafka's name for it) with the cluster id.
fn load_cluster_id(data_dir: &Path, node_id: i32) -> std::io::Result<String> {
    let path = data_dir.join("meta.properties");
    if let Ok(text) = std::fs::read_to_string(&path) {
        if let Some(id) = text.lines().find_map(|l| l.strip_prefix("cluster.id=")) {
            return Ok(id.trim().to_string());
        }
    }
    let id = kafka_style_uuid(uuid::Uuid::new_v4());
    let text = format!("version=1\ncluster.id={id}\nnode.id={node_id}\n");
    tessera_fs::write_atomic(&path, text.as_bytes())?;
    Ok(id)
}

/// Kafka prints ids as 22 characters of URL-safe base64 without padding.
pub fn kafka_style_uuid(id: uuid::Uuid) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let bytes = id.as_bytes();
    let mut out = String::with_capacity(22);
    let mut acc: u32 = 0;
    let mut bits = 0;
    for &b in bytes {
        acc = (acc << 8) | b as u32;
        bits += 8;
        while bits >= 6 {
            bits -= 6;
            out.push(ALPHABET[((acc >> bits) & 63) as usize] as char);
        }
    }
    if bits > 0 {
        out.push(ALPHABET[((acc << (6 - bits)) & 63) as usize] as char);
    }
    out
}

impl Broker {
    /// Opens the data directory, starts the controller, registers this
    /// broker and opens every range log the image says it serves.
    pub async fn start(config: BrokerConfig) -> anyhow::Result<Arc<Broker>> {
        std::fs::create_dir_all(&config.data_dir)?;
        let cluster_id = load_cluster_id(&config.data_dir, config.node_id)?;
        let controller = Controller::start(ControllerConfig {
            node_id: config.node_id as u64,
            dir: config.data_dir.join("meta"),
            snapshot_interval_entries: config.metadata_snapshot_interval_entries,
        })
        .await?;
        let (rolls, roll_rx) = mpsc::unbounded_channel();
        let broker = Arc::new(Broker {
            cluster_id,
            controller: Arc::new(controller),
            metrics: Metrics::default(),
            producer_ids: ProducerIdManager::default(),
            groups: GroupCoordinator::new(&config),
            txns: crate::txn::TxnCoordinator::new(&config),
            logs: RwLock::new(HashMap::new()),
            hw_events: watch::channel(0).0,
            admin: tokio::sync::Mutex::new(()),
            rolls,
            ready: AtomicBool::new(false),
            config,
        });
        broker.register().await?;
        {
            let _guard = broker.admin.lock().await;
            broker.reconcile().await?;
        }
        tokio::spawn(record_rolls(broker.clone(), roll_rx));
        // Rebuild groups and offsets before serving (Kafka's coordinator load).
        broker.groups.load(&broker).await?;
        GroupCoordinator::start_timers(&broker);
        // Then transactions: those left mid-way complete from the timer
        // (their pending offsets are loaded with the groups above).
        broker.txns.load(&broker).await?;
        crate::txn::TxnCoordinator::start_timers(&broker);
        broker.ready.store(true, Ordering::Release);
        Ok(broker)
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire) && !self.controller.is_failed()
    }

    pub fn image(&self) -> Arc<MetadataImage> {
        self.controller.image()
    }

    fn topics_dir(&self) -> PathBuf {
        self.config.data_dir.join("topics")
    }

    fn range_dir(&self, topic: &TopicImage, range: RangeId) -> PathBuf {
        self.topics_dir()
            .join(format!("{}-{}", topic.name, topic.id.simple()))
            .join(range.to_string())
    }

    async fn register(&self) -> anyhow::Result<()> {
        let registration = BrokerRegistration {
            broker_id: self.config.node_id,
            incarnation_id: uuid::Uuid::new_v4(),
            host: self.config.advertised_host.clone(),
            port: self.config.advertised_port,
            rack: self.config.rack.clone(),
        };
        // A new incarnation registers fenced (Kafka's rule); this single
        // node is its own controller, so it unfences itself at once.
        let records = vec![
            MetadataRecord::RegisterBroker(registration),
            MetadataRecord::UnfenceBroker {
                broker_id: self.config.node_id,
            },
        ];
        self.controller.write(records).await?;
        Ok(())
    }

    /// Live brokers as placement candidates, loaded by their active segments.
    fn candidates(image: &MetadataImage) -> Vec<BrokerCandidate> {
        image
            .brokers
            .values()
            .map(|b| BrokerCandidate {
                broker_id: b.registration.broker_id,
                rack: b.registration.rack.clone(),
                fenced: b.fenced,
                load: image
                    .segments
                    .values()
                    .filter(|s| !s.is_sealed() && s.primary() == Some(b.registration.broker_id))
                    .count() as u64,
            })
            .collect()
    }

    /// Opens logs for active ranges this broker is primary of, closes and
    /// deletes logs of ranges that are gone, and records in metadata any
    /// segment roll the log made that the image does not show yet (a crash
    /// between a local roll and its metadata write).
    pub(crate) async fn reconcile(&self) -> anyhow::Result<()> {
        let image = self.image();
        let mut missing_records = Vec::new();
        let gone: Vec<RangeId> = self
            .logs
            .read()
            .keys()
            .filter(|id| !image.ranges.contains_key(id))
            .copied()
            .collect();
        for id in gone {
            if let Some(log) = self.logs.write().remove(&id) {
                log.delete()?;
            }
        }
        // Topic directories no longer in the image (deleted while we were down).
        if let Ok(entries) = std::fs::read_dir(self.topics_dir()) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().to_string();
                let known = image
                    .topics
                    .values()
                    .any(|t| name == format!("{}-{}", t.name, t.id.simple()));
                if !known {
                    tracing::info!(dir = %entry.path().display(), "removing data of deleted topic");
                    std::fs::remove_dir_all(entry.path())?;
                }
            }
        }
        // Ranges in id order: a split or merge child always has a larger id
        // than its parents, so parents are open before their children seed
        // from them. Sealed ranges stay open read-only: they hold history.
        for range in image.ranges.values() {
            if let Some(log) = self.logs.read().get(&range.id) {
                if !range.active && !log.is_sealed() {
                    log.seal()?;
                }
                continue;
            }
            let Some(topic) = image.topics.get(&range.topic_id) else {
                continue;
            };
            let segments = image.segments_of(range.id);
            let Some(last) = segments.last() else {
                continue;
            };
            if last.primary() != Some(self.config.node_id) {
                continue;
            }
            let effective = EffectiveTopicConfig::resolve(&topic.configs, &self.config);
            let seed = if range.parents.is_empty() {
                None
            } else {
                Some(self.seed_from_parents(&image, range)?)
            };
            let log = RangeLog::open(
                RangeLogOptions {
                    dir: self.range_dir(topic, range.id),
                    lo: range.lo,
                    hi: range.hi,
                    segment_bytes: effective.segment_bytes,
                    segment_ms: effective.segment_ms,
                    leader_epoch: last.leader_epoch,
                    log_start_offsets: (range.lo..range.hi)
                        .map(|p| image.log_start_offset(topic.id, p))
                        .collect(),
                    seed,
                    sealed: !range.active,
                },
                self.hw_events.clone(),
            )?;
            if range.active {
                missing_records.extend(self.unrecorded_rolls(
                    &image,
                    range,
                    &log,
                    last.leader_epoch,
                ));
            }
            self.logs.write().insert(range.id, log);
        }
        if !missing_records.is_empty() {
            self.controller.write(missing_records).await?;
        }
        Ok(())
    }

    /// What a split or merge child inherits: for each of its partitions, the
    /// next offset and producer state of the parent that held it.
    fn seed_from_parents(
        &self,
        image: &MetadataImage,
        range: &RangeImage,
    ) -> anyhow::Result<RangeSeed> {
        let width = (range.hi - range.lo) as usize;
        let mut seed = RangeSeed {
            next_offsets: vec![0; width],
            producers: vec![Default::default(); width],
            txns: vec![Default::default(); width],
        };
        for parent_id in &range.parents {
            let Some(parent) = image.ranges.get(parent_id) else {
                continue;
            };
            let (lo, hi) = (parent.lo.max(range.lo), parent.hi.min(range.hi));
            if lo >= hi {
                continue;
            }
            let log = self.logs.read().get(parent_id).cloned().ok_or_else(|| {
                anyhow::anyhow!("parent range {parent_id} of range {} is not open", range.id)
            })?;
            let part = log.seed_for(lo, hi)?;
            let at = (lo - range.lo) as usize;
            seed.next_offsets[at..at + part.next_offsets.len()].copy_from_slice(&part.next_offsets);
            for (i, p) in part.producers.into_iter().enumerate() {
                seed.producers[at + i] = p;
            }
            for (i, t) in part.txns.into_iter().enumerate() {
                seed.txns[at + i] = t;
            }
        }
        Ok(seed)
    }

    /// The open log of a range, if this broker holds it.
    pub fn log_of(&self, range: RangeId) -> Option<Arc<RangeLog>> {
        self.logs.read().get(&range).cloned()
    }

    pub(crate) fn unrecorded_rolls(
        &self,
        image: &MetadataImage,
        range: &RangeImage,
        log: &RangeLog,
        leader_epoch: i32,
    ) -> Vec<MetadataRecord> {
        let (sealed, active_seq) = log.local_segments();
        let mut records = Vec::new();
        let open = |seq| {
            MetadataRecord::OpenSegment(SegmentOpenRecord {
                segment: SegmentId {
                    range: range.id,
                    seq,
                },
                replicas: vec![self.config.node_id],
                leader_epoch,
            })
        };
        for s in sealed {
            let id = SegmentId {
                range: range.id,
                seq: s.seq,
            };
            match image.segments.get(&id) {
                Some(seg) if seg.is_sealed() => continue,
                Some(_) => {}
                None => records.push(open(s.seq)),
            }
            records.push(seal_record(range.id, &s));
        }
        let active_is_sealed = log.is_sealed();
        if !active_is_sealed
            && !image.segments.contains_key(&SegmentId {
                range: range.id,
                seq: active_seq,
            })
        {
            records.push(open(active_seq));
        }
        records
    }

    /// Resolves a partition to the log that holds its active range.
    pub fn route(
        &self,
        image: &MetadataImage,
        topic: &TopicImage,
        partition: i32,
    ) -> Result<PartitionRoute, ApiError> {
        if partition < 0 || partition as u32 >= topic.partitions {
            return Err(ApiError::UnknownTopicOrPartition);
        }
        let range = image
            .active_range_for(topic.id, partition as u32)
            .ok_or(ApiError::NotLeaderOrFollower)?;
        let segment = image
            .active_segment(range.id)
            .ok_or(ApiError::NotLeaderOrFollower)?;
        let log = self
            .logs
            .read()
            .get(&range.id)
            .cloned()
            .ok_or(ApiError::NotLeaderOrFollower)?;
        Ok(PartitionRoute {
            range_id: range.id,
            log,
            leader_epoch: segment.leader_epoch,
            config: EffectiveTopicConfig::resolve(&topic.configs, &self.config),
        })
    }

    /// Validates a new topic against the committed image; with `validate_only`
    /// nothing is written.
    pub async fn create_topic(
        &self,
        topic: NewTopic,
        validate_only: bool,
    ) -> Result<Arc<TopicImage>, ApiError> {
        validate_topic_name(&topic.name)?;
        if topic.partitions == 0 {
            return Err(ApiError::InvalidPartitions(
                "number of partitions must be larger than 0".into(),
            ));
        }
        if topic.partitions > 1_000_000 {
            return Err(ApiError::InvalidPartitions(
                "number of partitions is above 1000000".into(),
            ));
        }
        if topic.replication_factor < 1 {
            return Err(ApiError::InvalidReplicationFactor(
                "replication factor must be larger than 0".into(),
            ));
        }
        let _guard = self.admin.lock().await;
        let image = self.image();
        if image.topic_by_name(&topic.name).is_some() {
            return Err(ApiError::TopicAlreadyExists(topic.name));
        }
        let live = image.brokers.values().filter(|b| !b.fenced).count();
        if topic.replication_factor as usize > live {
            return Err(ApiError::InvalidReplicationFactor(format!(
                "unable to replicate the partition {} time(s): the number of brokers is {live}",
                topic.replication_factor
            )));
        }
        if colliding_name(&image, &topic.name) {
            return Err(ApiError::InvalidTopic(format!(
                "topic {:?} collides with an existing topic ('.' and '_' are interchangeable in metric names)",
                topic.name
            )));
        }
        let topic_id = uuid::Uuid::new_v4();
        let range_id = image.next_range_id();
        let replicas = place_replicas(&format!("{range_id}/0"), &Self::candidates(&image), 1)
            .map_err(|e| ApiError::InvalidReplicationFactor(e.to_string()))?;
        let record = TopicRecord {
            topic_id,
            name: topic.name.clone(),
            partitions: topic.partitions,
            replication_factor: topic.replication_factor,
            configs: topic.configs,
        };
        if validate_only {
            return Ok(Arc::new(TopicImage {
                id: topic_id,
                name: record.name,
                partitions: record.partitions,
                replication_factor: record.replication_factor,
                configs: record.configs,
            }));
        }
        // One range covers the whole topic to start with: a topic's files
        // follow its ranges, not its partition count.
        self.controller
            .write(vec![
                MetadataRecord::CreateTopic(record),
                MetadataRecord::CreateRange(RangeRecord {
                    range_id,
                    topic_id,
                    lo: 0,
                    hi: topic.partitions,
                    parents: vec![],
                }),
                MetadataRecord::OpenSegment(SegmentOpenRecord {
                    segment: SegmentId {
                        range: range_id,
                        seq: 0,
                    },
                    replicas,
                    leader_epoch: 0,
                }),
            ])
            .await?;
        self.reconcile()
            .await
            .map_err(|e| ApiError::Storage(e.to_string()))?;
        self.image()
            .topics
            .get(&topic_id)
            .cloned()
            .ok_or(ApiError::UnknownTopicOrPartition)
    }

    /// Creates a topic with the broker's defaults, for auto-creation.
    pub async fn auto_create_topic(&self, name: &str) -> Result<Arc<TopicImage>, ApiError> {
        let new = NewTopic {
            name: name.to_string(),
            partitions: self.config.num_partitions,
            replication_factor: self.config.default_replication_factor,
            configs: BTreeMap::new(),
        };
        match self.create_topic(new, false).await {
            // Lost a race with another creator: use theirs.
            Err(ApiError::TopicAlreadyExists(_)) => self
                .image()
                .topic_by_name(name)
                .cloned()
                .ok_or(ApiError::UnknownTopicOrPartition),
            other => other,
        }
    }

    /// Deletes a topic: its metadata goes first, then its files.
    pub async fn delete_topic(&self, topic_id: TopicId) -> Result<(), ApiError> {
        let _guard = self.admin.lock().await;
        if !self.image().topics.contains_key(&topic_id) {
            return Err(ApiError::UnknownTopicOrPartition);
        }
        self.controller
            .write(vec![MetadataRecord::DeleteTopic { topic_id }])
            .await?;
        self.reconcile()
            .await
            .map_err(|e| ApiError::Storage(e.to_string()))
    }

    /// Files under the data directory's topics folder (for tests and metrics).
    pub fn range_log_count(&self) -> usize {
        self.logs.read().len()
    }

    pub fn segment_count(&self) -> usize {
        self.logs.read().values().map(|l| l.segment_count()).sum()
    }

    /// Graceful shutdown: stop the flushers (each flushes what it has first)
    /// and the controller.
    pub async fn shutdown(&self) {
        self.ready.store(false, Ordering::Release);
        let logs: Vec<_> = self.logs.read().values().cloned().collect();
        for log in logs {
            log.close();
        }
        self.controller.shutdown().await;
    }

    pub(crate) fn notify_roll(&self, range: RangeId, sealed: SealedSegment) {
        let _ = self.rolls.send((range, sealed));
    }
}

/// Kafka refuses a name that differs from an existing one only by '.' vs '_'.
fn colliding_name(image: &MetadataImage, name: &str) -> bool {
    let normal = name.replace('.', "_");
    image
        .topic_names
        .keys()
        .any(|n| n != name && n.replace('.', "_") == normal)
}

pub(crate) fn seal_record(range: RangeId, s: &SealedSegment) -> MetadataRecord {
    MetadataRecord::SealSegment(SegmentSealRecord {
        segment: SegmentId { range, seq: s.seq },
        size_bytes: s.size_bytes,
        spans: s
            .spans
            .iter()
            .map(|&(partition, start_offset, end_offset)| PartitionSpan {
                partition,
                start_offset,
                end_offset,
            })
            .collect(),
    })
}

/// Records local segment rolls in the metadata log, in the order they happened.
async fn record_rolls(
    broker: Arc<Broker>,
    mut rx: mpsc::UnboundedReceiver<(RangeId, SealedSegment)>,
) {
    while let Some((range, sealed)) = rx.recv().await {
        let image = broker.image();
        let epoch = image
            .segments
            .get(&SegmentId {
                range,
                seq: sealed.seq,
            })
            .map(|s| s.leader_epoch)
            .unwrap_or(0);
        let records = vec![
            seal_record(range, &sealed),
            MetadataRecord::OpenSegment(SegmentOpenRecord {
                segment: SegmentId {
                    range,
                    seq: sealed.next_seq,
                },
                replicas: vec![broker.config.node_id],
                leader_epoch: epoch,
            }),
        ];
        if let Err(e) = broker.controller.write(records).await {
            tracing::error!(range, seq = sealed.seq, error = %e, "could not record segment roll in the metadata log; it is retried at restart");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kafka_uuid_is_22_chars() {
        let s = kafka_style_uuid(uuid::Uuid::nil());
        assert_eq!(s, "AAAAAAAAAAAAAAAAAAAAAA");
        assert_eq!(kafka_style_uuid(uuid::Uuid::new_v4()).len(), 22);
    }
}
