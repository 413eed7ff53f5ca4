//! The metadata controller: an openraft node whose log carries metadata
//! records and whose state machine is the [`MetadataImage`].
//!
//! Today the quorum is a single voter (this node). The raft types, the
//! storage and the network factory are the pieces a multi-voter quorum
//! needs; only the transport ([`NetworkFactory`]) and cluster formation in
//! [`Controller::start`] would change.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Cursor;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{ClientWriteError, InstallSnapshotError, RPCError, RaftError, Unreachable};
use openraft::network::RPCOption;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{BasicNode, Config, RaftNetwork, RaftNetworkFactory, ServerState, SnapshotPolicy};
use parking_lot::Mutex;
use tokio::sync::watch;

use crate::error::MetadataError;
use crate::image::MetadataImage;
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
    /// snapshot. Default 1000.
    pub snapshot_interval_entries: u64,
}

impl ControllerConfig {
    pub fn new(node_id: u64, dir: impl Into<PathBuf>) -> Self {
        ControllerConfig {
            node_id,
            dir: dir.into(),
            snapshot_interval_entries: 1000,
        }
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

/// How long [`Controller::start`] waits for leadership and catch-up.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A running metadata controller. Share it as `Arc<Controller>`.
pub struct Controller {
    node_id: u64,
    raft: MetadataRaft,
    shared: Arc<Shared>,
    /// Holds an exclusive lock on `dir/LOCK` until shutdown (the log store
    /// holds a second handle while raft runs), so two controllers never
    /// write the same log.
    lock: Mutex<Option<File>>,
    shut_down: AtomicBool,
    /// Writes still to fail on purpose (fault-injection tests only).
    failing_writes: std::sync::atomic::AtomicU32,
}

impl std::fmt::Debug for Controller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller")
            .field("node_id", &self.node_id)
            .field("dir", &self.shared.dir)
            .field("offset", &self.image().offset)
            .finish()
    }
}

impl Controller {
    /// Opens (or creates) the controller in `cfg.dir` with the single voter
    /// `{cfg.node_id}`: initializes the cluster on first start; on restart
    /// loads the newest snapshot and replays the committed tail (all through
    /// [`crate::decode_committed_value`]). Returns once this node is leader
    /// and everything committed before is applied to [`Controller::image`].
    pub async fn start(cfg: ControllerConfig) -> Result<Controller, MetadataError> {
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

        let shared = Shared::new(dir.clone());
        let lock_dup = lock
            .try_clone()
            .map_err(|e| MetadataError::io(format!("dup {}", lock_path.display()), e))?;
        let log_store = LogStore::open(&dir, lock_dup)?;
        let state_machine = StateMachineStore::open(shared.clone())?;

        let config = Config {
            cluster_name: "tessera-metadata".into(),
            heartbeat_interval: 50,
            election_timeout_min: 150,
            election_timeout_max: 300,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(cfg.snapshot_interval_entries.max(1)),
            // Single voter: no follower needs the log behind a snapshot.
            max_in_snapshot_log_to_keep: 0,
            ..Default::default()
        }
        .validate()
        .map_err(|e| MetadataError::Raft(e.to_string()))?;

        // Raft::new replays the committed tail into the state machine.
        let raft = openraft::Raft::new(
            cfg.node_id,
            Arc::new(config),
            NetworkFactory,
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
            lock: Mutex::new(Some(lock)),
            shut_down: AtomicBool::new(false),
            failing_writes: std::sync::atomic::AtomicU32::new(0),
        };
        if let Err(e) = controller.join_quorum().await {
            controller.shutdown().await;
            return Err(e);
        }
        Ok(controller)
    }

    async fn join_quorum(&self) -> Result<(), MetadataError> {
        let initialized = self
            .raft
            .is_initialized()
            .await
            .map_err(|e| self.raft_err(e))?;
        if !initialized {
            let members = BTreeMap::from([(self.node_id, BasicNode::default())]);
            match self.raft.initialize(members).await {
                Ok(()) | Err(RaftError::APIError(_)) => {}
                Err(RaftError::Fatal(f)) => return Err(self.raft_err(f)),
            }
        }
        // Wait until this node leads and has applied its whole log. A leader
        // commits everything in its log (with one voter at once: a node that
        // restarts as the leader of its old term appends nothing new), so
        // this covers every entry committed before the restart, even when
        // the persisted committed index was stale.
        let mut metrics = self.raft.metrics();
        let node_id = self.node_id;
        let wait = async {
            loop {
                {
                    let m = metrics.borrow_and_update();
                    if let Err(f) = &m.running_state {
                        return Err(self.raft_err(f.clone()));
                    }
                    let caught_up = m.last_log_index.is_some()
                        && m.last_applied.map(|l| l.index) == m.last_log_index;
                    if m.state == ServerState::Leader
                        && m.current_leader == Some(node_id)
                        && caught_up
                    {
                        return Ok(());
                    }
                }
                if metrics.changed().await.is_err() {
                    return Err(self.failure_or(MetadataError::Shutdown));
                }
            }
        };
        tokio::time::timeout(START_TIMEOUT, wait)
            .await
            .map_err(|_| MetadataError::StartTimeout)?
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

    /// Appends one raft entry carrying `records` and returns its offset
    /// (raft log index) once it is committed and applied to the published
    /// image. Records that the image skips (they lost a race to an earlier
    /// write) do not fail the write; see [`Controller::write_detailed`].
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
        self.submit(values).await
    }

    /// Appends raw values without any check. Only for tests of the
    /// undecodable-record path.
    #[doc(hidden)]
    pub async fn write_raw(&self, values: Vec<Vec<u8>>) -> Result<i64, MetadataError> {
        Ok(self.submit(values).await?.offset)
    }

    /// Fault injection for tests: the next `count` writes fail before they
    /// reach the log, as a write that lost its quorum would.
    #[doc(hidden)]
    pub fn fail_next_writes(&self, count: u32) {
        self.failing_writes.store(count, Ordering::SeqCst);
    }

    async fn submit(&self, values: Vec<Vec<u8>>) -> Result<WriteOutcome, MetadataError> {
        let injected = self
            .failing_writes
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        if injected.is_ok() {
            return Err(MetadataError::Raft("injected write failure".into()));
        }
        if self.is_failed() {
            return Err(self.failure_or(MetadataError::Failed));
        }
        if self.shut_down.load(Ordering::SeqCst) {
            return Err(MetadataError::Shutdown);
        }
        match self
            .raft
            .client_write(MetadataBatch { records: values })
            .await
        {
            Ok(resp) => Ok(WriteOutcome {
                offset: resp.log_id.index as i64,
                skipped: resp.data.skipped.iter().map(|i| *i as usize).collect(),
            }),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
                Err(MetadataError::NotLeader {
                    leader: f.leader_id,
                })
            }
            Err(RaftError::APIError(e)) => Err(MetadataError::Raft(e.to_string())),
            Err(RaftError::Fatal(f)) => {
                if self.is_failed() {
                    Err(MetadataError::Failed)
                } else if self.shut_down.load(Ordering::SeqCst) {
                    Err(MetadataError::Shutdown)
                } else {
                    Err(MetadataError::Raft(f.to_string()))
                }
            }
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

    /// Stops the raft node and releases the data directory. Idempotent.
    pub async fn shutdown(&self) {
        if self.shut_down.swap(true, Ordering::SeqCst) {
            return;
        }
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

/// Network of the metadata quorum. With a single voter nothing is ever
/// sent; every client reports the peer unreachable. A multi-voter quorum
/// replaces this with a real transport.
#[derive(Clone, Debug, Default)]
pub struct NetworkFactory;

/// A client to a peer that cannot be reached (see [`NetworkFactory`]).
#[derive(Clone, Debug)]
pub struct UnreachablePeer {
    target: u64,
}

impl UnreachablePeer {
    fn err(&self) -> Unreachable {
        Unreachable::new(&std::io::Error::new(
            std::io::ErrorKind::NotConnected,
            format!("no transport to metadata node {}", self.target),
        ))
    }
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = UnreachablePeer;

    async fn new_client(&mut self, target: u64, _node: &BasicNode) -> Self::Network {
        UnreachablePeer { target }
    }
}

impl RaftNetwork<TypeConfig> for UnreachablePeer {
    async fn append_entries(
        &mut self,
        _rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        Err(RPCError::Unreachable(self.err()))
    }

    async fn install_snapshot(
        &mut self,
        _rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<u64>,
        RPCError<u64, BasicNode, RaftError<u64, InstallSnapshotError>>,
    > {
        Err(RPCError::Unreachable(self.err()))
    }

    async fn vote(
        &mut self,
        _rpc: VoteRequest<u64>,
        _option: RPCOption,
    ) -> Result<VoteResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        Err(RPCError::Unreachable(self.err()))
    }
}
