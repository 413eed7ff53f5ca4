//! The broker's state: the metadata controller, the published metadata
//! image, and the open range logs, with routing from a partition to the log
//! of its active range. The rest of the broker lives beside it:
//! `broker/topics.rs` turns topic administration into plans
//! (`tessera_planner`) written to the metadata log, and `broker/reconcile.rs`
//! makes the open logs and the coordinators follow every image the
//! controller publishes.

pub mod append;
mod clean_passes;
mod cleaner;
mod configs;
mod follower_fetch;
mod internal_topics;
mod liveness;
pub mod load;
mod lost_log;
pub mod ranges;
mod reconcile;
mod replicas;
mod retention;
mod shutdown;
mod topics;
pub mod txn_markers;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::RwLock;
use tessera_log::{RangeLog, SealedSegment};
use tessera_metadata::{
    BrokerRegistration, Controller, ControllerConfig, MetadataImage, RangeId, TopicImage,
};
use tokio::sync::{mpsc, watch};

use crate::config::BrokerConfig;
use crate::error::ApiError;
use crate::groups::GroupCoordinator;
use crate::metrics::Metrics;
use crate::producer_ids::ProducerIdManager;
use crate::topic_config::EffectiveTopicConfig;

pub(crate) use follower_fetch::{past_cleaned_segment_at, SealedSource};
pub(crate) use reconcile::local_segment_records;
pub use topics::NewTopic;

/// Where a partition's data lives right now.
#[derive(Clone)]
pub struct PartitionRoute {
    pub range_id: RangeId,
    pub log: Arc<RangeLog>,
    pub leader_epoch: i32,
    pub config: EffectiveTopicConfig,
}

pub struct Broker {
    config: BrokerConfig,
    cluster_id: String,
    controller: Arc<Controller>,
    metrics: Metrics,
    /// Client quota sensors (`quotas`).
    quotas: crate::quotas::QuotaManager,
    producer_ids: ProducerIdManager,
    /// Consumer groups and committed offsets (`__consumer_offsets`).
    groups: GroupCoordinator,
    /// Transactions (`__transaction_state`).
    txns: crate::txn::TxnCoordinator,
    logs: RwLock<HashMap<RangeId, Arc<RangeLog>>>,
    /// Bumped whenever any high watermark moves: long-polling fetches wait on it.
    hw_events: watch::Sender<u64>,
    /// Serializes topic administration and range moves (plan, then write).
    admin: tokio::sync::Mutex<()>,
    /// How far the open logs and coordinators follow the image.
    reconciler: reconcile::Reconciler,
    rolls: mpsc::UnboundedSender<(RangeId, SealedSegment)>,
    ready: AtomicBool,
    /// Per-segment replication: shipping, follower copies, seals.
    replicas: replicas::Replicas,
    /// Set by a controlled shutdown (`broker/shutdown.rs`).
    shutting_down: AtomicBool,
    /// Lets shutdown wait for a cleaning pass in flight.
    cleaner: cleaner::CleanerGate,
    /// This broker's connections to other brokers, authenticated as their
    /// inter-broker listener asks.
    inter_broker: Arc<crate::inter_broker::InterBrokerClient>,
    /// Ranges' produce rates and the balance's decisions (`broker/load.rs`).
    load: load::LoadState,
}

/// Reads or creates `meta.properties` (Kafka's name for it) with the cluster id.
///
/// A new single node makes up a random id. The nodes of a quorum must agree
/// on it without talking first (Kafka formats every node's storage with the
/// same id), so a new node that is one of `controller.quorum.voters` derives
/// it from the voter list, which every node of the cluster is given alike.
fn load_cluster_id(data_dir: &Path, node_id: i32, voters: &str) -> std::io::Result<String> {
    let path = data_dir.join("meta.properties");
    if let Ok(text) = std::fs::read_to_string(&path) {
        if let Some(id) = text.lines().find_map(|l| l.strip_prefix("cluster.id=")) {
            return Ok(id.trim().to_string());
        }
    }
    let id = if voters.trim().is_empty() {
        uuid::Uuid::new_v4()
    } else {
        cluster_id_for_voters(voters)
    };
    let id = crate::wire::kafka_style_uuid(id);
    let text = format!("version=1\ncluster.id={id}\nnode.id={node_id}\n");
    tessera_fs::write_atomic(&path, text.as_bytes())?;
    Ok(id)
}

/// A stable id from the voter list (64-bit FNV-1a twice, as a UUID).
fn cluster_id_for_voters(voters: &str) -> uuid::Uuid {
    let fnv = |seed: u64| {
        voters.bytes().fold(seed, |h, b| {
            (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
        })
    };
    uuid::Uuid::from_u64_pair(fnv(0xcbf2_9ce4_8422_2325), fnv(0x84222325_cbf29ce4))
}

/// The metadata controller's configuration for a broker's config.
pub fn controller_config(config: &BrokerConfig) -> anyhow::Result<ControllerConfig> {
    let voters = if config.controller_quorum_voters.is_empty() {
        Default::default()
    } else {
        ControllerConfig::parse_voters(&config.controller_quorum_voters)?
    };
    let security = config.controller_security.clone().map(|s| {
        if let Err(why) = &s.client.login {
            tracing::warn!(listener = %s.listener.name, %why, "this node cannot authenticate to the controllers");
        }
        Arc::new(crate::inter_broker::quorum::QuorumSecurity::new(
            s,
            config.authorizer.clone(),
            config.sasl_server_max_receive_size,
        )) as Arc<dyn tessera_metadata::network_auth::TransportSecurity>
    });
    let controller = ControllerConfig {
        snapshot_interval_entries: config.metadata_snapshot_interval_entries,
        fetch_timeout: Duration::from_millis(config.controller_quorum_fetch_timeout_ms),
        ..ControllerConfig::new(config.node_id as u64, config.data_dir.join("meta"))
    }
    .with_voters(voters)
    .with_security(security);
    Ok(match &config.metadata_learner_listener {
        // A broker-only node follows the metadata log as a learner.
        Some(address) => controller.as_learner(address.clone()),
        None => controller,
    })
}

/// What the rest of the gateway reaches of a broker: its parts, read
/// through these methods only (the fields stay private to `broker/`).
impl Broker {
    pub fn config(&self) -> &BrokerConfig {
        &self.config
    }

    pub fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    /// The metadata controller (the quorum member and its image).
    pub fn controller(&self) -> &Arc<Controller> {
        &self.controller
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Client quota sensors (`quotas`).
    pub fn quotas(&self) -> &crate::quotas::QuotaManager {
        &self.quotas
    }

    pub fn producer_ids(&self) -> &ProducerIdManager {
        &self.producer_ids
    }

    /// Consumer groups and committed offsets (`__consumer_offsets`).
    pub fn groups(&self) -> &GroupCoordinator {
        &self.groups
    }

    /// Transactions (`__transaction_state`).
    pub fn txns(&self) -> &crate::txn::TxnCoordinator {
        &self.txns
    }

    /// Bumped whenever any high watermark moves: long-polling fetches wait on it.
    pub fn hw_events(&self) -> &watch::Sender<u64> {
        &self.hw_events
    }

    /// This broker's authenticated connections to other brokers.
    pub fn inter_broker(&self) -> &Arc<crate::inter_broker::InterBrokerClient> {
        &self.inter_broker
    }

    /// Holds off other topic administration and range moves while the
    /// caller plans against the image and writes its records.
    pub(crate) async fn admin_lock(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.admin.lock().await
    }
}

impl Broker {
    /// Opens the data directory, starts the controller, registers this
    /// broker and opens every range log the image says it serves.
    pub async fn start(config: BrokerConfig) -> anyhow::Result<Arc<Broker>> {
        std::fs::create_dir_all(&config.data_dir)?;
        let cluster_id = load_cluster_id(
            &config.data_dir,
            config.node_id,
            &config.controller_quorum_voters,
        )?;
        let controller = Controller::start(controller_config(&config)?).await?;
        let (rolls, roll_rx) = mpsc::unbounded_channel();
        let broker = Arc::new(Broker {
            cluster_id,
            controller: Arc::new(controller),
            metrics: Metrics::default(),
            quotas: crate::quotas::QuotaManager::new(crate::quotas::sensor::WindowConfig {
                samples: config.quota_window_num,
                window_ms: config.quota_window_size_seconds * 1000,
            }),
            producer_ids: ProducerIdManager::default(),
            groups: GroupCoordinator::new(&config.group_config()),
            txns: crate::txn::TxnCoordinator::new(&config.txn_config()),
            logs: RwLock::new(HashMap::new()),
            hw_events: watch::channel(0).0,
            admin: tokio::sync::Mutex::new(()),
            reconciler: reconcile::Reconciler::default(),
            rolls,
            ready: AtomicBool::new(false),
            replicas: replicas::Replicas::default(),
            shutting_down: AtomicBool::new(false),
            cleaner: cleaner::CleanerGate::default(),
            load: Default::default(),
            inter_broker: Arc::new(crate::inter_broker::InterBrokerClient::new(
                config.inter_broker_client.clone(),
            )),
            config,
        });
        if let Err(why) = &broker.config.inter_broker_client.login {
            tracing::warn!(listener = %broker.config.inter_broker_client.listener, %why, "this broker cannot authenticate to other brokers' inter-broker listener: replication to and from peers will fail");
        }
        broker.init_replicas();
        if broker.config.controller_only {
            // Kafka's isolated controller: a voter that is no broker. It
            // never registers (so nothing is placed on it and Metadata
            // never lists it) nor heartbeats, hosts no range and no
            // coordinator, and runs the active controller's duties when it
            // leads. Reconciling still follows the image (it finds nothing
            // to open), so that writes made through its admin port (a
            // split) complete. Ready once `Controller::start` has joined
            // the quorum and caught up.
            tracing::info!(
                node_id = broker.config.node_id,
                "process.roles=controller: a metadata quorum voter, not a broker"
            );
            broker.reconcile().await?;
            tokio::spawn(reconcile::follow_images(broker.clone()));
            liveness::start_controller(&broker);
            broker.ready.store(true, Ordering::Release);
            return Ok(broker);
        }
        broker.register().await?;
        // The first pass opens every log this broker serves and loads the
        // coordinators of the internal partitions it leads (Kafka's
        // coordinator load) before anything is served; later passes follow
        // each new image.
        broker.reconcile().await?;
        tokio::spawn(reconcile::follow_images(broker.clone()));
        tokio::spawn(reconcile::record_rolls(broker.clone(), roll_rx));
        // Coordinators answer only with a confirmed-current image: confirm
        // it once before serving (the loop renews it from here on).
        let interval = Duration::from_millis(broker.config.broker_heartbeat_interval_ms.max(1));
        if let Err(e) = broker.controller.renew_read_lease(interval).await {
            tracing::debug!(error = %e, "metadata read lease not confirmed at start");
        }
        liveness::start(&broker);
        tokio::spawn(retention::enforce(Arc::downgrade(&broker)));
        tokio::spawn(cleaner::run(Arc::downgrade(&broker)));
        GroupCoordinator::start_timers(&broker);
        // Transactions left mid-way complete from the timer (their pending
        // offsets are loaded with the groups).
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
        // As a Kafka broker's lifecycle manager does, registration is
        // retried while the quorum is between leaders (a restart can
        // forward it to a controller that is stopping), for up to two
        // session timeouts; any other error stops the start.
        let give_up = Instant::now()
            + Duration::from_millis(2 * self.config.broker_session_timeout_ms.max(5_000));
        let mut backoff = Duration::from_millis(100);
        loop {
            match self
                .controller
                .write(tessera_planner::register_broker(registration.clone()))
                .await
            {
                Ok(_) => return Ok(()),
                Err(e) if e.is_retriable() && Instant::now() + backoff < give_up => {
                    tracing::warn!(error = %e, "broker registration not written yet; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Where a client on `listener` reaches broker `registration`: this
    /// broker's own advertised address on that listener; another broker's
    /// registered (inter-broker) address.
    pub fn endpoint(
        &self,
        listener: Option<&Arc<crate::listeners::Listener>>,
        registration: &tessera_metadata::BrokerRegistration,
    ) -> (String, i32) {
        if registration.broker_id == self.config.node_id {
            if let Some(l) = listener {
                return (l.advertised_host.clone(), i32::from(l.advertised_port));
            }
        }
        (registration.host.clone(), i32::from(registration.port))
    }

    /// The node id Metadata and DescribeCluster report as the controller:
    /// the metadata quorum's leader when it is a registered broker (a
    /// combined node), else this broker (while no leader is known, or when
    /// the leader is a controller-only node, which clients cannot reach:
    /// as a KRaft broker reports some live broker, since any broker takes
    /// the admin requests clients send to "the controller").
    pub fn controller_id(&self) -> i32 {
        let leader = self.controller.leader().map(|l| l.node_id as i32);
        match leader {
            Some(id) if self.image().brokers.contains_key(&id) => id,
            _ => self.config.node_id,
        }
    }

    /// The open log of a range, if this broker holds it.
    pub fn log_of(&self, range: RangeId) -> Option<Arc<RangeLog>> {
        self.logs.read().get(&range).cloned()
    }

    /// Resolves a partition to the log that holds its active range.
    pub fn route(
        &self,
        image: &MetadataImage,
        topic: &TopicImage,
        partition: i32,
    ) -> Result<PartitionRoute, ApiError> {
        self.route_with(image, topic, partition, self.topic_config(image, topic))
    }

    /// The configs `topic`'s logs run with (its own, else the broker's
    /// dynamic value, else its static one). A request that routes many
    /// partitions of a topic resolves them once and calls
    /// [`Broker::route_with`]: resolving per partition was a tenth of a
    /// broker's CPU in a fetch of 10,000 partitions.
    pub fn topic_config(&self, image: &MetadataImage, topic: &TopicImage) -> EffectiveTopicConfig {
        EffectiveTopicConfig::resolve(
            &topic.configs,
            &crate::dynamic_config::BrokerView::new(&self.config, image),
        )
    }

    /// `topic` with its configs ([`Broker::topic_config`]), for routing
    /// its partitions with [`Broker::route_with`].
    pub fn with_config(
        &self,
        image: &MetadataImage,
        topic: Arc<TopicImage>,
    ) -> (Arc<TopicImage>, EffectiveTopicConfig) {
        let config = self.topic_config(image, &topic);
        (topic, config)
    }

    /// [`Broker::route`] with `topic`'s configs resolved by the caller
    /// ([`Broker::topic_config`]).
    pub fn route_with(
        &self,
        image: &MetadataImage,
        topic: &TopicImage,
        partition: i32,
        config: EffectiveTopicConfig,
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
        if segment.primary() != Some(self.config.node_id) {
            return Err(ApiError::NotLeaderOrFollower);
        }
        if segment.replicas.len() > 1 && self.is_shutting_down() {
            // Leadership is moving to another replica.
            return Err(ApiError::NotLeaderOrFollower);
        }
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
            config,
        })
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
        // No more heartbeats: the controller fences this broker after its
        // session (a process that exits stops them anyway; one that stops
        // a broker in process, as the tests do, must too).
        self.shutting_down.store(true, Ordering::Release);
        self.stop_reconciling().await;
        self.stop_cleaning().await;
        let logs: Vec<_> = self.logs.read().keys().copied().collect();
        for range in logs {
            self.stop_shipping(range);
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nodes_of_a_quorum_agree_on_the_cluster_id() {
        let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
        let voters = "1@127.0.0.1:19092,2@127.0.0.1:19093,3@127.0.0.1:19094";
        let ids: Vec<String> = dirs
            .iter()
            .enumerate()
            .map(|(i, d)| load_cluster_id(d.path(), i as i32 + 1, voters).unwrap())
            .collect();
        assert!(ids.iter().all(|id| *id == ids[0] && id.len() == 22));
        // Read back, not made up again.
        assert_eq!(load_cluster_id(dirs[0].path(), 1, "").unwrap(), ids[0]);
        // Single nodes each make up their own.
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        assert_ne!(
            load_cluster_id(a.path(), 1, "").unwrap(),
            load_cluster_id(b.path(), 1, "").unwrap()
        );
    }
}
