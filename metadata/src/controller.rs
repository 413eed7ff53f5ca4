//! The metadata controller: an openraft node whose log carries metadata
//! records and whose state machine is the [`MetadataImage`].
//!
//! The quorum is static, Kafka style (`controller.quorum.voters`): 1, 3 or
//! 5 voters named in [`ControllerConfig::voters`], each listening on its
//! controller address. The voters talk over the TCP transport of
//! [`crate::network`]. On first start every voter initializes the raft
//! membership with the whole voter map (the same membership everywhere, so
//! any of them may do it first); later starts check that the stored voter
//! set is still the configured one (changing it is not supported). With an
//! empty voter map the controller is a single voter with no listener, as
//! Tessera ran before clusters.
//!
//! [`Controller::start`] returns once some leader is confirmed and this node
//! has applied everything committed before (on a follower: the leader's
//! read index, asked over the transport). Writes go to the leader:
//! [`Controller::write`] on a follower forwards the entry to the leader and
//! returns once it is applied here too; [`Controller::write_on_leader`]
//! refuses with [`MetadataError::NotLeader`], naming the leader and its
//! address.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::File;
use std::io::Cursor;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{ClientWriteError, RaftError};
use openraft::metrics::WaitError;
use openraft::{BasicNode, Config, ServerState, SnapshotPolicy};
use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::error::MetadataError;
use crate::heartbeats::Heartbeats;
use crate::image::MetadataImage;
use crate::network::{spawn_server, NetworkFactory, ServiceCallError, Transport, REFUSED};
use crate::records::MetadataRecord;
use crate::storage::{LogStore, Shared, StateMachineStore};

/// The payload of one raft entry: the encoded records of one
/// [`Controller::write`], applied together.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MetadataBatch {
    pub records: Vec<Vec<u8>>,
}

/// What applying one entry did: which of its records (by position) the
/// image skipped (see [`crate::decode_committed_value`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ApplyResponse {
    pub skipped: Vec<u32>,
}

openraft::declare_raft_types!(
    /// openraft type configuration of the metadata quorum.
    pub TypeConfig:
        D = MetadataBatch,
        R = ApplyResponse,
        NodeId = u64,
        Node = BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

/// The openraft node type of the metadata quorum.
pub type MetadataRaft = openraft::Raft<TypeConfig>;

#[derive(Clone, Debug)]
pub struct ControllerConfig {
    pub node_id: u64,
    /// Data directory (log, vote, snapshot). One controller at a time.
    pub dir: PathBuf,
    /// Snapshot (and purge the log) after this many entries since the last
    /// snapshot. Default 1000. With several voters the leader keeps this
    /// many entries behind the snapshot too, for followers that lag a
    /// little; one further behind is sent the snapshot.
    pub snapshot_interval_entries: u64,
    /// The controller quorum, Kafka's `controller.quorum.voters`: node id
    /// -> `host:port` of its controller listener. `node_id` must be in it;
    /// this node listens at its own entry. Empty (the default): a single
    /// voter, this node, with no listener. See
    /// [`ControllerConfig::parse_voters`].
    pub voters: BTreeMap<u64, String>,
    /// How long [`Controller::start`] waits for a leader and catch-up
    /// before failing with [`MetadataError::StartTimeout`]. Default 30 s.
    /// With several voters a start needs a quorum of them running.
    pub start_timeout: Duration,
    /// `Some(address)`: this node is not a voter but a learner (Kafka's
    /// broker-only node, `process.roles=broker`): it listens at `address`
    /// (port 0 picks a free one) for the leader's replication, asks the
    /// leader to add it as a learner on every start (announcing the
    /// address it actually listens on), and follows the metadata log
    /// without voting. Its writes are forwarded to the leader. Needs a
    /// voter map without this node in it.
    pub learner_listener: Option<String>,
    /// Secures the quorum transport's connections, both ways, when the
    /// controller listener is SSL or SASL_* (see
    /// [`crate::network_auth`]). `None`: PLAINTEXT.
    pub security: Option<Arc<dyn crate::network_auth::TransportSecurity>>,
    /// Kafka's `controller.quorum.fetch.timeout.ms`: how long a voter hears
    /// nothing from the leader before it stands for election (openraft's
    /// election timeout, drawn between half of this and this). Default
    /// 2000, Kafka's. Multi-voter quorums only.
    pub fetch_timeout: Duration,
}

impl ControllerConfig {
    /// A single-voter controller (no listener), snapshotting every 1000
    /// entries.
    pub fn new(node_id: u64, dir: impl Into<PathBuf>) -> Self {
        ControllerConfig {
            node_id,
            dir: dir.into(),
            snapshot_interval_entries: 1000,
            voters: BTreeMap::new(),
            start_timeout: DEFAULT_START_TIMEOUT,
            learner_listener: None,
            security: None,
            fetch_timeout: Duration::from_millis(2000),
        }
    }

    /// The same configuration for a learner listening at `address`; see
    /// [`ControllerConfig::learner_listener`].
    pub fn as_learner(mut self, address: impl Into<String>) -> Self {
        self.learner_listener = Some(address.into());
        self
    }

    /// The same configuration with the transport secured by `security`.
    pub fn with_security(
        mut self,
        security: Option<Arc<dyn crate::network_auth::TransportSecurity>>,
    ) -> Self {
        self.security = security;
        self
    }

    /// The same configuration with the voter map `voters`.
    pub fn with_voters(mut self, voters: BTreeMap<u64, String>) -> Self {
        self.voters = voters;
        self
    }

    /// Parses Kafka's `controller.quorum.voters` syntax,
    /// `1@127.0.0.1:9093,2@127.0.0.1:9094,3@host:9095`.
    pub fn parse_voters(spec: &str) -> Result<BTreeMap<u64, String>, MetadataError> {
        let bad = |why: String| MetadataError::Config(format!("controller voters {spec:?}: {why}"));
        let mut voters = BTreeMap::new();
        for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (id, addr) = item
                .split_once('@')
                .ok_or_else(|| bad(format!("{item:?} is not id@host:port")))?;
            let id: u64 = id
                .trim()
                .parse()
                .map_err(|_| bad(format!("{id:?} is not a node id")))?;
            let addr = addr.trim();
            let port_ok = addr
                .rsplit_once(':')
                .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
            if !port_ok {
                return Err(bad(format!("{addr:?} is not host:port")));
            }
            if voters.insert(id, addr.to_string()).is_some() {
                return Err(bad(format!("node {id} is named twice")));
            }
        }
        if voters.is_empty() {
            return Err(bad("no voters".into()));
        }
        Ok(voters)
    }
}

/// Result of [`Controller::write_detailed`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriteOutcome {
    /// Raft log index of the entry; the published image includes it.
    pub offset: i64,
    /// Positions (in the written `Vec`) of records the image skipped
    /// because they named something it did not hold or conflicted with it.
    pub skipped: Vec<usize>,
}

/// The leader of the controller quorum as this node knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControllerLeader {
    pub node_id: u64,
    /// Its controller address (`host:port`, from the voter map); `None` for
    /// a single voter configured without one.
    pub address: Option<String>,
}

impl std::fmt::Display for ControllerLeader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.address {
            Some(a) => write!(f, "controller {} at {a}", self.node_id),
            None => write!(f, "controller {}", self.node_id),
        }
    }
}

/// Default of [`ControllerConfig::start_timeout`].
const DEFAULT_START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long [`Controller::catch_up`] waits.
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a write waits for a leader (elections included).
const WRITE_TIMEOUT: Duration = Duration::from_secs(20);
/// At least this long a forwarded write that committed waits to apply here.
const MIN_APPLY_WAIT: Duration = Duration::from_secs(5);
/// One read-index request to the leader.
const READ_INDEX_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause before asking again after a leader change or a failed request.
const RETRY_PAUSE: Duration = Duration::from_millis(50);
/// How long a heartbeat waits for the leader's answer.
const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(2);

/// A running metadata controller. Share it as `Arc<Controller>`.
pub struct Controller {
    node_id: u64,
    raft: MetadataRaft,
    shared: Arc<Shared>,
    /// The configured voter map (empty: single voter, no listener).
    voters: BTreeMap<u64, String>,
    /// `Some(address it listens on)` when this node is a learner.
    learner_address: Option<String>,
    /// Client side of the transport (forwarded writes, read index).
    transport: Arc<Transport>,
    /// Brokers' heartbeats heard by this voter (leader or not).
    heartbeats: Arc<Heartbeats>,
    /// The controller listener's task, if this node listens.
    server: Mutex<Option<JoinHandle<()>>>,
    /// Holds an exclusive lock on `dir/LOCK` until shutdown (the log store
    /// holds a second handle while raft runs), so two controllers never
    /// write the same log.
    lock: Mutex<Option<File>>,
    shut_down: AtomicBool,
    /// Writes still to fail on purpose (fault-injection tests only).
    failing_writes: std::sync::atomic::AtomicU32,
    /// When the last confirmed read point that this node's image caught up
    /// to was asked for (see [`Controller::renew_read_lease`]).
    read_lease_from: Mutex<Option<Instant>>,
}

impl std::fmt::Debug for Controller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller")
            .field("node_id", &self.node_id)
            .field("dir", &self.shared.dir)
            .field("voters", &self.voters)
            .field("offset", &self.image().offset)
            .finish()
    }
}

impl Controller {
    /// Opens (or creates) the controller in `cfg.dir`. On first start it
    /// initializes the quorum with the configured voters (or the single
    /// voter `{cfg.node_id}`); on restart it loads the newest snapshot and
    /// replays the committed tail (all through
    /// [`crate::decode_committed_value`]). With a voter map it listens on
    /// its own address. Returns once a leader is confirmed and everything
    /// committed before is applied to [`Controller::image`] (catching up
    /// from the leader, by log or snapshot, if this node is behind).
    pub async fn start(cfg: ControllerConfig) -> Result<Controller, MetadataError> {
        match &cfg.learner_listener {
            None if !cfg.voters.is_empty() && !cfg.voters.contains_key(&cfg.node_id) => {
                return Err(MetadataError::Config(format!(
                    "node {} is not one of the controller voters {:?}",
                    cfg.node_id, cfg.voters
                )));
            }
            Some(_) if cfg.voters.is_empty() => {
                return Err(MetadataError::Config(
                    "a broker-only node (learner) needs the controller voters".into(),
                ));
            }
            Some(_) if cfg.voters.contains_key(&cfg.node_id) => {
                return Err(MetadataError::Config(format!(
                    "node {} is a controller voter, so it cannot be a broker-only node",
                    cfg.node_id
                )));
            }
            _ => {}
        }
        let dir = cfg.dir.clone();
        std::fs::create_dir_all(&dir)
            .map_err(|e| MetadataError::io(format!("create {}", dir.display()), e))?;
        let lock_path = dir.join("LOCK");
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| MetadataError::io(format!("open {}", lock_path.display()), e))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => return Err(MetadataError::Locked(dir)),
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(MetadataError::io(
                    format!("lock {}", lock_path.display()),
                    e,
                ))
            }
        }

        // Listen before raft runs: a taken port fails the start cleanly.
        let listen_at = cfg
            .learner_listener
            .as_ref()
            .or_else(|| cfg.voters.get(&cfg.node_id));
        let listener = match listen_at {
            Some(addr) => Some(TcpListener::bind(addr.as_str()).await.map_err(|e| {
                MetadataError::io(format!("listen on controller address {addr}"), e)
            })?),
            None => None,
        };
        // What a learner announces: the address it actually listens on.
        let learner_address = match (&cfg.learner_listener, &listener) {
            (Some(_), Some(l)) => Some(
                l.local_addr()
                    .map_err(|e| MetadataError::io("controller listener address", e))?
                    .to_string(),
            ),
            _ => None,
        };

        let shared = Shared::new(dir.clone());
        let lock_dup = lock
            .try_clone()
            .map_err(|e| MetadataError::io(format!("dup {}", lock_path.display()), e))?;
        let log_store = LogStore::open(&dir, lock_dup)?;
        let state_machine = StateMachineStore::open(shared.clone())?;

        let interval = cfg.snapshot_interval_entries.max(1);
        // A node of a multi-process quorum (a voter map, even of one voter
        // replicating to learners) gets network timing; only a single node
        // without one gets the tight in-process timing.
        let config = if !cfg.voters.is_empty() || learner_address.is_some() {
            Config {
                cluster_name: "tessera-metadata".into(),
                // The heartbeat interval is also openraft's deadline for one
                // AppendEntries round trip (the follower's fsync included).
                heartbeat_interval: 250,
                // Above the heartbeat interval whatever was configured.
                election_timeout_min: (cfg.fetch_timeout.as_millis() as u64 / 2).max(500),
                election_timeout_max: (cfg.fetch_timeout.as_millis() as u64).max(1000),
                install_snapshot_timeout: 10_000,
                snapshot_max_chunk_size: 1 << 20,
                snapshot_policy: SnapshotPolicy::LogsSinceLast(interval),
                // Followers a little behind catch up from the log; further
                // behind, from the snapshot.
                max_in_snapshot_log_to_keep: interval,
                ..Default::default()
            }
        } else {
            Config {
                cluster_name: "tessera-metadata".into(),
                heartbeat_interval: 50,
                election_timeout_min: 150,
                election_timeout_max: 300,
                snapshot_policy: SnapshotPolicy::LogsSinceLast(interval),
                // Single voter: no follower needs the log behind a snapshot.
                max_in_snapshot_log_to_keep: 0,
                ..Default::default()
            }
        }
        .validate()
        .map_err(|e| MetadataError::Raft(e.to_string()))?;

        let transport = Arc::new(Transport::new(
            cfg.node_id,
            cfg.voters.clone(),
            cfg.security.clone(),
        ));
        // Raft::new replays the committed tail into the state machine.
        let raft = openraft::Raft::new(
            cfg.node_id,
            Arc::new(config),
            NetworkFactory::new(transport.clone()),
            log_store,
            state_machine,
        )
        .await
        .map_err(|e| match shared.failure.lock().clone() {
            Some(r) => MetadataError::Replay(r),
            None => MetadataError::Raft(e.to_string()),
        })?;

        let controller = Controller {
            node_id: cfg.node_id,
            raft,
            shared,
            voters: cfg.voters,
            learner_address,
            transport,
            heartbeats: Arc::default(),
            server: Mutex::new(None),
            lock: Mutex::new(Some(lock)),
            shut_down: AtomicBool::new(false),
            failing_writes: std::sync::atomic::AtomicU32::new(0),
            read_lease_from: Mutex::new(None),
        };
        if let Err(e) = controller.join_quorum(listener, cfg.start_timeout).await {
            controller.shutdown().await;
            return Err(e);
        }
        Ok(controller)
    }

    fn voter_ids(&self) -> BTreeSet<u64> {
        if self.voters.is_empty() {
            BTreeSet::from([self.node_id])
        } else {
            self.voters.keys().copied().collect()
        }
    }

    async fn join_quorum(
        &self,
        listener: Option<TcpListener>,
        start_timeout: Duration,
    ) -> Result<(), MetadataError> {
        let initialized = self
            .raft
            .is_initialized()
            .await
            .map_err(|e| self.raft_err(e))?;
        if !initialized && self.learner_address.is_none() {
            // Every voter initializes with the same membership; whichever
            // does it first, the logs agree (openraft allows this).
            let members: BTreeMap<u64, BasicNode> = if self.voters.is_empty() {
                BTreeMap::from([(self.node_id, BasicNode::default())])
            } else {
                self.voters
                    .iter()
                    .map(|(id, addr)| (*id, BasicNode::new(addr)))
                    .collect()
            };
            match self.raft.initialize(members).await {
                Ok(()) | Err(RaftError::APIError(_)) => {}
                Err(RaftError::Fatal(f)) => return Err(self.raft_err(f)),
            }
        }
        let stored: BTreeSet<u64> = self
            .raft
            .with_raft_state(|s| s.membership_state.effective().voter_ids().collect())
            .await
            .map_err(|e| self.raft_err(e))?;
        let configured = self.voter_ids();
        if !stored.is_empty() && stored != configured {
            return Err(MetadataError::Config(format!(
                "the metadata log in {} has controller voters {stored:?} but the \
                 configuration names {configured:?}; changing the voter set is not supported",
                self.shared.dir.display()
            )));
        }
        if let Some(listener) = listener {
            *self.server.lock() = Some(spawn_server(
                listener,
                self.node_id,
                self.raft.clone(),
                self.heartbeats.clone(),
                self.transport.security(),
                self.shared.images.subscribe(),
            ));
        }
        if let Some(address) = self.learner_address.clone() {
            self.join_as_learner(&address, start_timeout).await?;
        }
        self.catch_up_within(start_timeout, true)
            .await
            .map_err(|e| match e {
                MetadataError::Timeout(_) => MetadataError::StartTimeout,
                e => e,
            })
    }

    /// A learner asks the voters, in turn, until the leader answers, to add
    /// it (or update its address) in the raft membership; the leader then
    /// replicates the metadata log to it.
    async fn join_as_learner(&self, address: &str, limit: Duration) -> Result<(), MetadataError> {
        let deadline = Instant::now() + limit;
        let mut target: Option<u64> = None;
        let mut round = self.voters.keys().copied().cycle();
        loop {
            if self.shut_down.load(Ordering::SeqCst) {
                return Err(MetadataError::Shutdown);
            }
            let voter = match target.take() {
                Some(v) => v,
                None => round.next().expect("a learner has voters"),
            };
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(MetadataError::StartTimeout);
            }
            match self
                .transport
                .join_as_learner(voter, self.node_id, address, left.min(READ_INDEX_TIMEOUT))
                .await
            {
                Ok(()) => {
                    tracing::info!(
                        "joined the metadata quorum as a learner at {address} (leader {voter})"
                    );
                    return Ok(());
                }
                Err(ServiceCallError::NotLeader(Some(l))) if l != voter => target = Some(l),
                Err(ServiceCallError::Failed(m)) if m.starts_with(REFUSED) => {
                    return Err(MetadataError::Config(m));
                }
                Err(e) => {
                    tracing::debug!("joining the metadata quorum through {voter}: {e}");
                    tokio::time::sleep(Duration::from_millis(200).min(left)).await;
                }
            }
        }
    }

    /// True when `node_id` is a raft voter (a controller). With no voter
    /// map (a single voter) only this node is one.
    pub fn is_voter(&self, node_id: u64) -> bool {
        if self.voters.is_empty() {
            node_id == self.node_id
        } else {
            self.voters.contains_key(&node_id)
        }
    }

    /// The reverse of a broker-only node's join: the leader removes learner
    /// `node_id` from the raft membership (openraft's
    /// `ChangeMembers::RemoveNodes`), so it stops replicating to a node
    /// that left for good (after its `UnregisterBroker` committed). Done
    /// here when this node leads, else asked of the leader. `Ok(false)`:
    /// it was not a member. A voter's id is refused
    /// ([`MetadataError::Config`]): the voter set is static.
    pub async fn remove_learner(&self, node_id: u64) -> Result<bool, MetadataError> {
        let deadline = Instant::now() + WRITE_TIMEOUT;
        loop {
            if self.shut_down.load(Ordering::SeqCst) {
                return Err(MetadataError::Shutdown);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(MetadataError::Timeout("removing a learner".into()));
            }
            let leader = self.raft.metrics().borrow().current_leader;
            let result = match leader {
                None => Err(ServiceCallError::NotLeader(None)),
                Some(l) if l == self.node_id => crate::network::remove_learner(&self.raft, node_id)
                    .await
                    .map_err(|e| match e {
                        crate::network::ServiceError::NotLeader { leader } => {
                            ServiceCallError::NotLeader(leader)
                        }
                        crate::network::ServiceError::Failed(m) => ServiceCallError::Failed(m),
                    }),
                Some(l) => {
                    self.transport
                        .remove_learner(l, node_id, left.min(READ_INDEX_TIMEOUT))
                        .await
                }
            };
            match result {
                Ok(removed) => return Ok(removed),
                Err(ServiceCallError::Failed(m)) if m.starts_with(REFUSED) => {
                    return Err(MetadataError::Config(m));
                }
                Err(ServiceCallError::Failed(m)) => return Err(MetadataError::Raft(m)),
                Err(e) => {
                    tracing::debug!("removing learner {node_id}: {e}");
                    tokio::time::sleep(RETRY_PAUSE.max(Duration::from_millis(200)).min(left)).await;
                }
            }
        }
    }

    /// Waits until a leader is confirmed and this node has applied
    /// everything committed before the call: the leader confirms its
    /// leadership with a quorum and reports its read index (asked over the
    /// transport when it is another node), then this node waits to apply
    /// up to it. With `whole_leader_log`, a leader also waits for its whole
    /// log (a restarted single voter may have committed entries after its
    /// stale committed index).
    async fn catch_up_within(
        &self,
        limit: Duration,
        whole_leader_log: bool,
    ) -> Result<(), MetadataError> {
        let deadline = Instant::now() + limit;
        let timeout = || MetadataError::Timeout("no leader confirmed, or not caught up".into());
        let mut metrics = self.raft.metrics();
        loop {
            if self.shut_down.load(Ordering::SeqCst) {
                return Err(self.failure_or(MetadataError::Shutdown));
            }
            let (leader, state) = {
                let m = metrics.borrow_and_update();
                if let Err(f) = &m.running_state {
                    return Err(self.raft_err(f.clone()));
                }
                (m.current_leader, m.state)
            };
            // `Some(index)`: apply up to `index` and done. `None`: ask again.
            let target: Option<Option<u64>> = match leader {
                Some(l) if l == self.node_id && state == ServerState::Leader => {
                    match tokio::time::timeout_at(deadline, self.raft.ensure_linearizable()).await {
                        Err(_) => return Err(timeout()),
                        Ok(Ok(read)) => {
                            let mut index = read.map(|l| l.index);
                            if whole_leader_log {
                                index = index.max(self.raft.metrics().borrow().last_log_index);
                            }
                            Some(index)
                        }
                        Ok(Err(RaftError::APIError(e))) => {
                            tracing::debug!("metadata leadership not confirmed: {e}");
                            None
                        }
                        Ok(Err(RaftError::Fatal(f))) => return Err(self.raft_err(f)),
                    }
                }
                Some(l) if l != self.node_id => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    match self
                        .transport
                        .read_index(l, left.min(READ_INDEX_TIMEOUT))
                        .await
                    {
                        Ok(index) => Some(index),
                        Err(e) => {
                            tracing::debug!("read index from metadata leader {l}: {e}");
                            None
                        }
                    }
                }
                _ => None,
            };
            match target {
                Some(None) => return Ok(()),
                Some(Some(index)) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    return match self
                        .raft
                        .wait(Some(left))
                        .applied_index_at_least(Some(index), "catch up")
                        .await
                    {
                        Ok(_) => Ok(()),
                        Err(WaitError::Timeout(..)) => Err(timeout()),
                        Err(WaitError::ShuttingDown) => {
                            Err(self.failure_or(MetadataError::Shutdown))
                        }
                    };
                }
                None => {}
            }
            // No leader yet, or it could not be asked: wait for news (or a
            // short while), then ask again.
            let now = Instant::now();
            if now >= deadline {
                return Err(timeout());
            }
            if leader.is_some() {
                tokio::time::sleep(RETRY_PAUSE.min(deadline - now)).await;
            } else {
                let pause = (now + Duration::from_millis(200)).min(deadline);
                if let Ok(Err(_)) = tokio::time::timeout_at(pause, metrics.changed()).await {
                    return Err(self.failure_or(MetadataError::Shutdown));
                }
            }
        }
    }

    fn failure_or(&self, other: MetadataError) -> MetadataError {
        match self.shared.failure.lock().clone() {
            Some(r) => MetadataError::Replay(r),
            None => other,
        }
    }

    fn raft_err(&self, e: impl std::fmt::Display) -> MetadataError {
        self.failure_or(MetadataError::Raft(e.to_string()))
    }

    /// This node's id.
    pub fn node_id(&self) -> u64 {
        self.node_id
    }

    /// The configured voter map (empty for a single voter without one).
    pub fn voters(&self) -> &BTreeMap<u64, String> {
        &self.voters
    }

    fn leader_info(&self, node_id: u64) -> ControllerLeader {
        let address = self.voters.get(&node_id).cloned().or_else(|| {
            let m = self.raft.metrics();
            let m = m.borrow();
            m.membership_config
                .membership()
                .get_node(&node_id)
                .map(|n| n.addr.clone())
                .filter(|a| !a.is_empty())
        });
        ControllerLeader { node_id, address }
    }

    /// The current leader as this node last heard (`None` during an
    /// election or before one), with its controller address.
    pub fn leader(&self) -> Option<ControllerLeader> {
        let id = self.raft.metrics().borrow().current_leader?;
        Some(self.leader_info(id))
    }

    /// True while this node is the leader (as far as it knows: a leader cut
    /// off from the quorum learns it lost leadership only later).
    pub fn is_leader(&self) -> bool {
        let m = self.raft.metrics();
        let m = m.borrow();
        m.state == ServerState::Leader && m.current_leader == Some(self.node_id)
    }

    /// Kafka's BrokerHeartbeat: tells the active controller that broker
    /// `broker_id` is alive (recorded here if this node leads, else sent to
    /// the leader). Fails when no leader is known or it cannot be reached.
    pub async fn heartbeat(&self, broker_id: i32) -> Result<(), MetadataError> {
        self.send_heartbeat(broker_id, false).await
    }

    /// A heartbeat asking to be fenced now (Kafka's `wantShutDown`): the
    /// active controller then moves the leadership of the broker's
    /// replicated ranges elsewhere (a controlled shutdown).
    pub async fn request_shutdown(&self, broker_id: i32) -> Result<(), MetadataError> {
        self.send_heartbeat(broker_id, true).await
    }

    /// True when broker `broker_id` asked this voter to shut down.
    pub fn wants_shutdown(&self, broker_id: i32) -> bool {
        self.heartbeats.wants_shutdown(broker_id)
    }

    /// Every voter keeps the heartbeats it hears, not only the leader: a
    /// newly elected leader then knows who is alive and fences a broker
    /// that died with the old leader one session after its last heartbeat,
    /// not one session after the election. Succeeds when the leader (this
    /// node or another) heard it.
    async fn send_heartbeat(
        &self,
        broker_id: i32,
        want_shutdown: bool,
    ) -> Result<(), MetadataError> {
        // Recorded here too when this node is a voter (a single node is).
        if self.voters.is_empty() || self.voters.contains_key(&self.node_id) {
            self.heartbeats.record(broker_id, want_shutdown);
        }
        let leader = self.raft.metrics().borrow().current_leader;
        let mut to_leader = None;
        for voter in self.voters.keys().copied().filter(|v| *v != self.node_id) {
            let transport = self.transport.clone();
            let send = tokio::spawn(async move {
                transport
                    .send_heartbeat(voter, broker_id, want_shutdown, HEARTBEAT_TIMEOUT)
                    .await
            });
            // Only the leader's answer is awaited: a slow follower voter
            // must not delay the next heartbeat.
            if leader == Some(voter) {
                to_leader = Some((voter, send));
            }
        }
        if leader == Some(self.node_id) {
            return Ok(());
        }
        match to_leader {
            Some((voter, send)) => match send.await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(MetadataError::Raft(format!(
                    "heartbeat to controller {voter}: {e}"
                ))),
                Err(e) => Err(MetadataError::Raft(e.to_string())),
            },
            None => Err(MetadataError::NotLeader { leader: None }),
        }
    }

    /// Reports the produce rate of each range this broker leads to every
    /// voter (a new leader has it at once), beside the heartbeats. Best
    /// effort: nothing waits for it, and a report lost is made again a
    /// heartbeat later.
    pub fn report_load(&self, broker_id: i32, ranges: Vec<(u64, u64)>) {
        if self.voters.is_empty() || self.voters.contains_key(&self.node_id) {
            self.heartbeats.record_load(broker_id, ranges.clone());
        }
        for voter in self.voters.keys().copied().filter(|v| *v != self.node_id) {
            let transport = self.transport.clone();
            let ranges = ranges.clone();
            tokio::spawn(async move {
                if let Err(e) = transport
                    .send_load(voter, broker_id, ranges, HEARTBEAT_TIMEOUT)
                    .await
                {
                    tracing::debug!(voter, error = %e, "load report not delivered");
                }
            });
        }
    }

    /// The range loads brokers reported to this voter within `max_age`:
    /// broker -> (range, bytes appended per second).
    pub fn reported_loads(&self, max_age: Duration) -> HashMap<i32, Vec<(u64, u64)>> {
        self.heartbeats.loads(max_age)
    }

    /// When this voter last heard from broker `broker_id`.
    pub fn last_heartbeat(&self, broker_id: i32) -> Option<std::time::Instant> {
        self.heartbeats.last_seen(broker_id)
    }

    /// Waits until this node's image holds every entry committed before
    /// the call (a linearizable read point: the leader confirms it still
    /// leads and reports its commit index) and returns that image. Fails
    /// with [`MetadataError::Timeout`] when no leader answers in 30 s.
    pub async fn catch_up(&self) -> Result<Arc<MetadataImage>, MetadataError> {
        self.catch_up_within(CATCH_UP_TIMEOUT, false).await?;
        Ok(self.image())
    }

    /// Asks the leader for a read point and waits (at most `limit`) until
    /// this node's image holds it; on success the image is known to have
    /// been current at the moment of the ask, which [`Controller::image_is_fresh`]
    /// then vouches for during a lease. A node woken from a pause (SIGSTOP,
    /// a stalled VM) or cut off from the quorum cannot renew, so it stops
    /// acting on leadership its image may no longer give it (a zombie
    /// coordinator answering from its stale cache).
    pub async fn renew_read_lease(&self, limit: Duration) -> Result<(), MetadataError> {
        let asked = Instant::now();
        self.catch_up_within(limit, false).await?;
        let mut from = self.read_lease_from.lock();
        if from.is_none_or(|t| t < asked) {
            *from = Some(asked);
        }
        Ok(())
    }

    /// True when this node's image was confirmed current less than `lease`
    /// ago, or when this node is the only voter (its image is the quorum's).
    pub fn image_is_fresh(&self, lease: Duration) -> bool {
        if self.voter_ids() == BTreeSet::from([self.node_id]) && self.learner_address.is_none() {
            return true;
        }
        self.read_lease_from
            .lock()
            .is_some_and(|t| t.elapsed() < lease)
    }

    /// Appends one raft entry carrying `records` and returns its offset
    /// (raft log index) once it is committed and applied to the published
    /// image. Records that the image skips (they lost a race to an earlier
    /// write) do not fail the write; see [`Controller::write_detailed`].
    ///
    /// Works on every voter: a follower forwards the entry to the leader
    /// and returns once the entry is applied to its own image as well
    /// (during an election it waits up to 20 s for a leader, then fails with
    /// [`MetadataError::NotLeader`]). If the connection to the leader fails
    /// after the entry was sent, the write fails with
    /// [`MetadataError::Raft`] and may or may not have been committed.
    ///
    /// Each record is checked first with [`MetadataRecord::validate`] and an
    /// encode/decode round trip, because a committed record that does not
    /// decode stops the controller.
    pub async fn write(&self, records: Vec<MetadataRecord>) -> Result<i64, MetadataError> {
        Ok(self.write_detailed(records).await?.offset)
    }

    /// [`Controller::write`], also reporting which records were skipped.
    pub async fn write_detailed(
        &self,
        records: Vec<MetadataRecord>,
    ) -> Result<WriteOutcome, MetadataError> {
        let values = Self::encode_checked(&records)?;
        self.submit(values, true).await
    }

    /// [`Controller::write_detailed`] without forwarding: on a node that is
    /// not the leader it fails with [`MetadataError::NotLeader`], naming the
    /// leader and its address when known.
    pub async fn write_on_leader(
        &self,
        records: Vec<MetadataRecord>,
    ) -> Result<WriteOutcome, MetadataError> {
        let values = Self::encode_checked(&records)?;
        self.submit(values, false).await
    }

    fn encode_checked(records: &[MetadataRecord]) -> Result<Vec<Vec<u8>>, MetadataError> {
        let mut values = Vec::with_capacity(records.len());
        for (index, r) in records.iter().enumerate() {
            r.validate()
                .map_err(|reason| MetadataError::InvalidRecord { index, reason })?;
            let v = r.encode();
            match MetadataRecord::decode(&v) {
                Ok(back) if back == *r => values.push(v),
                Ok(_) => {
                    return Err(MetadataError::InvalidRecord {
                        index,
                        reason: crate::RecordDecodeError::invalid("record", "does not round-trip"),
                    })
                }
                Err(reason) => return Err(MetadataError::InvalidRecord { index, reason }),
            }
        }
        Ok(values)
    }

    /// Appends raw values without any check, on the leader only. Only for
    /// tests of the undecodable-record path.
    #[doc(hidden)]
    pub async fn write_raw(&self, values: Vec<Vec<u8>>) -> Result<i64, MetadataError> {
        Ok(self.submit(values, false).await?.offset)
    }

    /// Fault injection for tests: the next `count` writes fail before they
    /// reach the log, as a write that lost its quorum would.
    #[doc(hidden)]
    pub fn fail_next_writes(&self, count: u32) {
        self.failing_writes.store(count, Ordering::SeqCst);
    }

    async fn submit(
        &self,
        values: Vec<Vec<u8>>,
        forward: bool,
    ) -> Result<WriteOutcome, MetadataError> {
        let injected = self
            .failing_writes
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        if injected.is_ok() {
            return Err(MetadataError::Raft("injected write failure".into()));
        }
        let deadline = Instant::now() + WRITE_TIMEOUT;
        loop {
            if self.is_failed() {
                return Err(self.failure_or(MetadataError::Failed));
            }
            if self.shut_down.load(Ordering::SeqCst) {
                return Err(MetadataError::Shutdown);
            }
            let batch = MetadataBatch {
                records: values.clone(),
            };
            let leader = match self.raft.client_write(batch).await {
                Ok(resp) => {
                    return Ok(WriteOutcome {
                        offset: resp.log_id.index as i64,
                        skipped: resp.data.skipped.iter().map(|i| *i as usize).collect(),
                    })
                }
                // Not appended here (or appended and then truncated by a new
                // leader): nothing of it will commit.
                Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => f.leader_id,
                Err(RaftError::APIError(e)) => return Err(MetadataError::Raft(e.to_string())),
                Err(RaftError::Fatal(f)) => {
                    return Err(if self.is_failed() {
                        MetadataError::Failed
                    } else if self.shut_down.load(Ordering::SeqCst) {
                        MetadataError::Shutdown
                    } else {
                        MetadataError::Raft(f.to_string())
                    })
                }
            };
            // A lone voter has no one to forward to; a learner always has
            // (also when the quorum is a single voter, a controller-only node).
            if !forward || (self.voters.len() <= 1 && self.learner_address.is_none()) {
                return Err(MetadataError::NotLeader {
                    leader: leader.map(|l| self.leader_info(l)),
                });
            }
            if let Some(l) = leader.filter(|l| *l != self.node_id) {
                let left = deadline.saturating_duration_since(Instant::now());
                match self.transport.forward_write(l, &values, left).await {
                    Ok(reply) => {
                        self.wait_applied(reply.offset, deadline).await?;
                        return Ok(WriteOutcome {
                            offset: reply.offset as i64,
                            skipped: reply.skipped.iter().map(|i| *i as usize).collect(),
                        });
                    }
                    // Nothing was appended: ask again once the leader is known.
                    Err(e @ (ServiceCallError::NotLeader(_) | ServiceCallError::NotSent(_))) => {
                        tracing::debug!("forwarding a metadata write to {l}: {e}");
                    }
                    Err(e) => {
                        return Err(MetadataError::Raft(format!(
                            "metadata write forwarded to {}: {e}",
                            self.leader_info(l)
                        )))
                    }
                }
            }
            let now = Instant::now();
            if now + RETRY_PAUSE >= deadline {
                return Err(MetadataError::NotLeader {
                    leader: self.leader(),
                });
            }
            tokio::time::sleep(RETRY_PAUSE).await;
        }
    }

    /// Waits until the entry at `index` (committed by the leader) is
    /// applied here.
    async fn wait_applied(&self, index: u64, deadline: Instant) -> Result<(), MetadataError> {
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(MIN_APPLY_WAIT);
        match self
            .raft
            .wait(Some(left))
            .applied_index_at_least(Some(index), "forwarded write")
            .await
        {
            Ok(_) => Ok(()),
            Err(WaitError::Timeout(..)) => Err(MetadataError::Timeout(format!(
                "the write committed at offset {index} but is not applied on this node yet"
            ))),
            Err(WaitError::ShuttingDown) => Err(self.failure_or(MetadataError::Shutdown)),
        }
    }

    /// The current image (cheap: an `Arc` clone).
    pub fn image(&self) -> Arc<MetadataImage> {
        self.shared.images.borrow().clone()
    }

    /// A receiver that sees every image published from now on.
    pub fn subscribe(&self) -> watch::Receiver<Arc<MetadataImage>> {
        self.shared.images.subscribe()
    }

    /// True once an undecodable committed record stopped the controller.
    pub fn is_failed(&self) -> bool {
        self.shared.failure.lock().is_some()
    }

    /// The replay error that stopped the controller, if one did.
    pub fn failure(&self) -> Option<crate::MetadataReplayError> {
        self.shared.failure.lock().clone()
    }

    /// The underlying raft node (metrics, future membership changes).
    pub fn raft(&self) -> &MetadataRaft {
        &self.raft
    }

    /// Stops listening, stops the raft node and releases the data
    /// directory. Idempotent.
    pub async fn shutdown(&self) {
        if self.shut_down.swap(true, Ordering::SeqCst) {
            return;
        }
        // Close the listener and every served connection first (peers see
        // this node as unreachable), and wait so the port is free again.
        let server = self.server.lock().take();
        if let Some(server) = server {
            server.abort();
            let _ = server.await;
        }
        self.transport.close();
        if let Err(e) = self.raft.shutdown().await {
            tracing::warn!("metadata raft shutdown: {e}");
        }
        // A snapshot build runs in its own task; let a write in flight finish
        // and refuse later ones before the directory is handed over.
        self.shared.close();
        // The raft core has stopped and dropped its handle on the lock file;
        // closing ours releases the directory.
        drop(self.lock.lock().take());
    }
}
