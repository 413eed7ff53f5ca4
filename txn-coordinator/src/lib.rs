//! The transaction coordinator, after Kafka's `TransactionCoordinator`:
//! every transactional id whose `__transaction_state` partition this broker
//! leads, its producer id and epoch, and its open transaction.
//!
//! Each id has an async lock. A request takes it, runs the pure transition
//! ([`state`]) on the metadata, appends the result to the id's
//! `__transaction_state` partition ([`records`], Kafka's TransactionLog
//! format) and waits until it is durable, and only then keeps it in memory.
//! Ending a transaction persists PrepareCommit/PrepareAbort, writes a COMMIT
//! or ABORT control batch to every partition of the transaction (and
//! completes the pending transactional offsets of the group coordinator),
//! then persists CompleteCommit/CompleteAbort, all under the id's lock (a
//! later request for the id waits rather than getting
//! CONCURRENT_TRANSACTIONS).
//!
//! A timer task (every `transaction.abort.timed.out.transaction.cleanup.interval.ms`)
//! aborts transactions past their timeout (bumping the epoch, so the producer
//! is fenced), finishes transactions left in a Prepare state (after a restart
//! or a failed marker write) and expires idle ids
//! (`transactional.id.expiration.ms`). At start, [`TxnCoordinator::load`]
//! replays `__transaction_state`.
//!
//! Produce consults [`TxnCoordinator::check_produce`]: a transactional batch
//! is accepted only for a partition of its producer's ongoing transaction, at
//! the producer's current epoch.

pub mod records;
pub mod state;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use tessera_metadata::TopicImage;

use tessera_server_common::coordinator::{self, store_error, Markers, PartitionWriter, TxnHost};
use tessera_server_common::error::ApiError;
use tessera_server_common::internal_topics::{
    partition_for, CONSUMER_OFFSETS, OFFSETS_TOPIC_PARTITIONS,
};

use state::{EndDecision, InitDecision, TxnError, TxnMetadata, TxnState};

pub use tessera_server_common::internal_topics::{TRANSACTION_STATE, TXN_TOPIC_PARTITIONS};

/// How long an append to `__transaction_state` may take before the request
/// fails with COORDINATOR_NOT_AVAILABLE (retriable): Kafka's transaction
/// coordinator bounds it by `request.timeout.ms`, 30 s by default.
const TRANSACTION_STATE_APPEND_TIMEOUT: Duration = Duration::from_secs(30);

/// The broker settings the transaction coordinator follows (Kafka's
/// `TransactionStateManagerConfig` and `TransactionConfig`).
#[derive(Clone, Debug)]
pub struct TxnConfig {
    /// `transaction.max.timeout.ms`: the largest `transaction.timeout.ms` a
    /// producer may ask for.
    pub max_timeout_ms: i32,
    /// `transaction.abort.timed.out.transaction.cleanup.interval.ms`.
    pub abort_timed_out_interval_ms: u64,
    /// `transactional.id.expiration.ms`.
    pub transactional_id_expiration_ms: i64,
}

impl From<TxnError> for ApiError {
    fn from(e: TxnError) -> Self {
        match e {
            TxnError::InvalidProducerIdMapping => ApiError::InvalidProducerIdMapping,
            TxnError::ProducerFenced => ApiError::ProducerFenced,
            TxnError::ConcurrentTransactions => ApiError::ConcurrentTransactions,
            TxnError::InvalidTxnState => {
                ApiError::InvalidTxnState("not allowed in the transaction's state".into())
            }
        }
    }
}

/// Old request versions know INVALID_PRODUCER_EPOCH, not PRODUCER_FENCED.
pub fn fenced_for_version(e: ApiError, version: i16, first_with_fenced: i16) -> ApiError {
    match e {
        ApiError::ProducerFenced if version < first_with_fenced => ApiError::InvalidProducerEpoch(
            "there is a newer producer with the same transactional id".into(),
        ),
        other => other,
    }
}

/// What produce needs to know about a transactional producer.
#[derive(Clone, Debug, Default)]
struct ProducerView {
    epoch: i16,
    ongoing: bool,
    partitions: HashSet<(String, i32)>,
}

type Slot = Arc<tokio::sync::Mutex<Option<TxnMetadata>>>;

/// A transaction as DescribeTransactions / ListTransactions show it.
#[derive(Clone, Debug)]
pub struct TxnDescription {
    pub transactional_id: String,
    pub state: TxnState,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub timeout_ms: i32,
    pub start_ms: i64,
    pub partitions: Vec<(String, i32)>,
}

pub struct TxnCoordinator {
    max_timeout_ms: i32,
    cleanup_interval_ms: u64,
    expiration_ms: i64,
    txns: parking_lot::Mutex<HashMap<String, Slot>>,
    views: parking_lot::RwLock<HashMap<i64, ProducerView>>,
    /// The `__transaction_state` partitions loaded here (they load and
    /// unload with this broker's leadership of them).
    loaded: coordinator::LoadedPartitions,
}

/// The broker as the transaction coordinator's timer sees it: what the
/// coordinator needs ([`TxnHost`]) and the coordinator it holds.
/// Implemented by `Broker` (`broker/txn_markers.rs`).
pub trait TxnTimerHost: TxnHost + 'static {
    fn txn_coordinator(&self) -> &TxnCoordinator;
}

impl TxnCoordinator {
    pub fn new(config: &TxnConfig) -> Self {
        TxnCoordinator {
            max_timeout_ms: config.max_timeout_ms,
            cleanup_interval_ms: config.abort_timed_out_interval_ms,
            expiration_ms: config.transactional_id_expiration_ms,
            txns: parking_lot::Mutex::new(HashMap::new()),
            views: parking_lot::RwLock::new(HashMap::new()),
            loaded: Default::default(),
        }
    }

    /// Makes sure `__transaction_state` exists (FindCoordinator does this).
    pub async fn ensure_topic<W: PartitionWriter + ?Sized>(
        writer: &W,
    ) -> Result<Arc<TopicImage>, ApiError> {
        writer
            .ensure_internal_topic(TRANSACTION_STATE, TXN_TOPIC_PARTITIONS)
            .await
    }

    /// The `__transaction_state` partition of an id, if this broker leads it.
    pub fn coordinator_partition<H: TxnHost + ?Sized>(
        &self,
        host: &H,
        transactional_id: &str,
    ) -> Result<(Arc<TopicImage>, i32, i32), ApiError> {
        let image = host.image();
        let topic = image
            .topic_by_name(TRANSACTION_STATE)
            .cloned()
            .ok_or(ApiError::CoordinatorNotAvailable)?;
        let partition = partition_for(transactional_id, topic.partitions);
        let leader_epoch = host
            .check_leader(&image, &topic, partition)
            .map_err(|_| ApiError::NotCoordinator)?;
        self.loaded.check(partition)?;
        Ok((topic, partition, leader_epoch))
    }

    fn slot(&self, transactional_id: &str, create: bool) -> Option<Slot> {
        let mut txns = self.txns.lock();
        match txns.get(transactional_id) {
            Some(s) => Some(s.clone()),
            None if create => {
                let s: Slot = Arc::new(tokio::sync::Mutex::new(None));
                txns.insert(transactional_id.to_string(), s.clone());
                Some(s)
            }
            None => None,
        }
    }

    /// Appends the metadata (a tombstone for Dead) and waits until durable.
    async fn persist<H: TxnHost + ?Sized>(
        &self,
        host: &H,
        m: &TxnMetadata,
    ) -> Result<(), ApiError> {
        let (topic, partition, _) = self.coordinator_partition(host, &m.transactional_id)?;
        let key = records::encode_key(&m.transactional_id);
        let value = (m.state != TxnState::Dead).then(|| records::encode_value(m));
        coordinator::append_within(
            TRANSACTION_STATE_APPEND_TIMEOUT,
            host.append_records(&topic, partition, &[(Some(key), value)]),
        )
        .await
        .map_err(store_error)?;
        Ok(())
    }

    /// Keeps persisted metadata in memory and updates the produce view.
    fn apply(&self, slot: &mut Option<TxnMetadata>, m: TxnMetadata) {
        let mut views = self.views.write();
        if let Some(old) = slot.as_ref() {
            if old.producer_id != m.producer_id {
                views.remove(&old.producer_id);
            }
        }
        if m.state == TxnState::Dead {
            views.remove(&m.producer_id);
            *slot = None;
            return;
        }
        views.insert(
            m.producer_id,
            ProducerView {
                epoch: m.producer_epoch,
                ongoing: m.state == TxnState::Ongoing,
                partitions: m.partitions.iter().cloned().collect(),
            },
        );
        *slot = Some(m);
    }

    async fn persist_and_apply<H: TxnHost + ?Sized>(
        &self,
        host: &H,
        slot: &mut Option<TxnMetadata>,
        m: TxnMetadata,
    ) -> Result<(), ApiError> {
        self.persist(host, &m).await?;
        self.apply(slot, m);
        Ok(())
    }

    /// Produce: may this transactional batch be appended?
    pub fn check_produce(
        &self,
        producer_id: i64,
        epoch: i16,
        topic: &str,
        partition: i32,
    ) -> Result<(), ApiError> {
        let views = self.views.read();
        let Some(view) = views.get(&producer_id) else {
            // Its coordinator is another broker's: a Kafka 3.x partition
            // leader accepts the batch without asking it (KIP-890 adds the
            // check); the marker the coordinator sends ends it.
            return Ok(());
        };
        if epoch < view.epoch {
            return Err(ApiError::InvalidProducerEpoch(format!(
                "producer epoch {epoch} is older than the current epoch {}",
                view.epoch
            )));
        }
        if epoch > view.epoch
            || !view.ongoing
            || !view.partitions.contains(&(topic.to_string(), partition))
        {
            return Err(ApiError::InvalidTxnState(format!(
                "{topic}-{partition} is not part of producer {producer_id}'s ongoing transaction"
            )));
        }
        Ok(())
    }

    fn now() -> i64 {
        tessera_log::now_ms()
    }

    // ---- client requests ---------------------------------------------------

    /// InitProducerId with a transactional id: the producer id and epoch.
    pub async fn init_producer_id<H: TxnHost + ?Sized>(
        &self,
        host: &H,
        transactional_id: &str,
        timeout_ms: i32,
        expected: Option<(i64, i16)>,
    ) -> Result<(i64, i16), ApiError> {
        if transactional_id.is_empty() {
            return Err(ApiError::InvalidRequest("empty transactional id".into()));
        }
        if timeout_ms <= 0 || timeout_ms > self.max_timeout_ms {
            return Err(ApiError::InvalidTransactionTimeout);
        }
        self.coordinator_partition(host, transactional_id)?;
        let slot = self.slot(transactional_id, true).expect("created");
        let mut guard = slot.lock().await;
        let now = Self::now();
        let current = match guard.as_ref() {
            Some(m) => m.clone(),
            None => {
                let id = host.next_producer_id().await?;
                TxnMetadata::new(transactional_id, id, timeout_ms, now)
            }
        };
        let fresh = if current.needs_new_producer_id() {
            Some(host.next_producer_id().await?)
        } else {
            None
        };
        match current.init_producer_id(timeout_ms, expected, fresh, now)? {
            InitDecision::Ready(next) => {
                let answer = (next.producer_id, next.producer_epoch);
                self.persist_and_apply(host, &mut guard, next).await?;
                Ok(answer)
            }
            InitDecision::AbortFirst(prepared) => {
                tracing::info!(
                    transactional_id,
                    producer_id = prepared.producer_id,
                    epoch = prepared.producer_epoch,
                    "fencing the previous producer: aborting its open transaction"
                );
                self.finish(host, &mut guard, prepared).await?;
                Err(ApiError::ConcurrentTransactions)
            }
        }
    }

    async fn locked<H: TxnHost + ?Sized>(
        &self,
        transactional_id: &str,
        host: &H,
    ) -> Result<Slot, ApiError> {
        if transactional_id.is_empty() {
            return Err(ApiError::InvalidRequest("empty transactional id".into()));
        }
        self.coordinator_partition(host, transactional_id)?;
        self.slot(transactional_id, false)
            .ok_or(ApiError::InvalidProducerIdMapping)
    }

    /// AddPartitionsToTxn (v0-3 form).
    pub async fn add_partitions<H: TxnHost + ?Sized>(
        &self,
        host: &H,
        transactional_id: &str,
        producer_id: i64,
        epoch: i16,
        partitions: &[(String, i32)],
    ) -> Result<(), ApiError> {
        let slot = self.locked(transactional_id, host).await?;
        let mut guard = slot.lock().await;
        let current = guard.clone().ok_or(ApiError::InvalidProducerIdMapping)?;
        if let Some(next) = current.add_partitions(producer_id, epoch, partitions, Self::now())? {
            self.persist_and_apply(host, &mut guard, next).await?;
        }
        Ok(())
    }

    /// AddOffsetsToTxn: the group's `__consumer_offsets` partition joins the transaction.
    pub async fn add_offsets<H: TxnHost + ?Sized>(
        &self,
        host: &H,
        transactional_id: &str,
        producer_id: i64,
        epoch: i16,
        group_id: &str,
    ) -> Result<(), ApiError> {
        let topic = host
            .ensure_internal_topic(CONSUMER_OFFSETS, OFFSETS_TOPIC_PARTITIONS)
            .await
            .map_err(|_| ApiError::CoordinatorNotAvailable)?;
        let partition = partition_for(group_id, topic.partitions);
        self.add_partitions(
            host,
            transactional_id,
            producer_id,
            epoch,
            &[(CONSUMER_OFFSETS.to_string(), partition)],
        )
        .await
    }

    /// EndTxn: commit or abort, markers written, before answering.
    pub async fn end_txn<H: TxnHost + ?Sized>(
        &self,
        host: &H,
        transactional_id: &str,
        producer_id: i64,
        epoch: i16,
        commit: bool,
    ) -> Result<(), ApiError> {
        let slot = self.locked(transactional_id, host).await?;
        let mut guard = slot.lock().await;
        let current = guard.clone().ok_or(ApiError::InvalidProducerIdMapping)?;
        match current.end_txn(producer_id, epoch, commit, true, Self::now())? {
            EndDecision::AlreadyDone => Ok(()),
            EndDecision::Prepare(prepared) => self.finish(host, &mut guard, prepared).await,
        }
    }

    /// Persists a Prepare state, writes the markers, completes.
    async fn finish<H: TxnHost + ?Sized>(
        &self,
        host: &H,
        slot: &mut Option<TxnMetadata>,
        prepared: TxnMetadata,
    ) -> Result<(), ApiError> {
        self.persist_and_apply(host, slot, prepared.clone()).await?;
        self.complete(host, slot).await
    }

    /// Writes the markers of a transaction in a Prepare state and completes it.
    async fn complete<H: TxnHost + ?Sized>(
        &self,
        host: &H,
        slot: &mut Option<TxnMetadata>,
    ) -> Result<(), ApiError> {
        let Some(prepared) = slot.clone() else {
            return Ok(());
        };
        let commit = prepared.state == TxnState::PrepareCommit;
        // Completes the group coordinator's pending offsets where a
        // `__consumer_offsets` partition takes its marker (here or on the
        // broker that leads it).
        self.write_markers(host, &prepared, commit).await?;
        let done = prepared.complete(Self::now())?;
        self.persist_and_apply(host, slot, done).await
    }

    async fn write_markers<H: TxnHost + ?Sized>(
        &self,
        host: &H,
        m: &TxnMetadata,
        commit: bool,
    ) -> Result<(), ApiError> {
        let (_, _, coordinator_epoch) = self.coordinator_partition(host, &m.transactional_id)?;
        let markers = Markers {
            producer_id: m.producer_id,
            producer_epoch: m.producer_epoch,
            commit,
            coordinator_epoch,
        };
        let partitions: Vec<(String, i32)> = m.partitions.iter().cloned().collect();
        host.write_markers(&markers, &partitions).await
    }

    // ---- admin -------------------------------------------------------------

    /// DescribeTransactions for one id.
    pub async fn describe<H: TxnHost + ?Sized>(
        &self,
        host: &H,
        transactional_id: &str,
    ) -> Result<TxnDescription, ApiError> {
        self.coordinator_partition(host, transactional_id)?;
        let slot = self
            .slot(transactional_id, false)
            .ok_or(ApiError::TransactionalIdNotFound)?;
        let guard = slot.lock().await;
        guard
            .as_ref()
            .map(describe)
            .ok_or(ApiError::TransactionalIdNotFound)
    }

    /// Every transactional id this coordinator holds.
    pub async fn list(&self) -> Vec<TxnDescription> {
        let slots: Vec<Slot> = self.txns.lock().values().cloned().collect();
        let mut out = Vec::new();
        for s in slots {
            if let Some(m) = s.lock().await.as_ref() {
                out.push(describe(m));
            }
        }
        out.sort_by(|a, b| a.transactional_id.cmp(&b.transactional_id));
        out
    }

    // ---- load and timers ---------------------------------------------------

    /// Replays `partitions` of `__transaction_state` (which this broker now
    /// leads); requests for their ids are served from then on.
    pub async fn load_partitions<H: TxnHost + ?Sized>(
        &self,
        host: &H,
        partitions: &[i32],
    ) -> anyhow::Result<()> {
        let started = Instant::now();
        let image = host.image();
        let Some(topic) = image.topic_by_name(TRANSACTION_STATE).cloned() else {
            return Ok(());
        };
        let mut loaded: HashMap<String, Option<TxnMetadata>> = HashMap::new();
        let mut skipped = 0usize;
        for &partition in partitions {
            let stored = match host.read_records(&topic, partition).await {
                Ok(r) => r,
                // Leadership moved away too: the load fails all the same
                // (a partition it skipped would be served as empty).
                Err(e) => {
                    return Err(anyhow::anyhow!(
                        "reading {TRANSACTION_STATE}-{partition}: {e}"
                    ))
                }
            };
            for r in stored {
                if r.control {
                    continue;
                }
                let decoded = r
                    .key
                    .as_deref()
                    .ok_or(records::CodecError::Truncated("key"))
                    .and_then(records::decode_key)
                    .and_then(|id| match r.value.as_deref() {
                        None => Ok((id, None)),
                        Some(v) => records::decode_value(&id, v).map(|m| (id, Some(m))),
                    });
                match decoded {
                    Ok((id, m)) => {
                        loaded.insert(id, m);
                    }
                    Err(e) => {
                        skipped += 1;
                        tracing::warn!(partition, offset = r.offset, error = %e, "skipping undecodable {TRANSACTION_STATE} record");
                    }
                }
            }
        }
        let mut count = 0;
        let mut open = 0;
        for (id, m) in loaded {
            let Some(m) = m else { continue };
            count += 1;
            if !m.state.is_idle() {
                open += 1;
            }
            let slot = self.slot(&id, true).expect("created");
            let mut guard = slot.lock().await;
            self.apply(&mut guard, m);
        }
        self.loaded.add(partitions);
        tracing::info!(
            partitions = partitions.len(),
            transactional_ids = count,
            open,
            skipped,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "loaded transactions from {TRANSACTION_STATE}"
        );
        Ok(())
    }

    /// Drops the transactional ids of `partitions` (this broker no longer
    /// leads them): their requests get NOT_COORDINATOR.
    pub fn unload_partitions(&self, partitions: &[i32]) {
        self.loaded.remove(partitions);
        let mut txns = self.txns.lock();
        let before = txns.len();
        txns.retain(|id, _| !partitions.contains(&partition_for(id, TXN_TOPIC_PARTITIONS)));
        tracing::info!(
            partitions = partitions.len(),
            transactional_ids = before - txns.len(),
            "unloaded transactions"
        );
    }

    /// Starts the task that aborts timed-out transactions, finishes
    /// transactions left in a Prepare state and expires idle ids.
    pub fn start_timers<H: TxnTimerHost>(host: &Arc<H>) {
        tokio::spawn(run_timer(Arc::downgrade(host)));
    }

    /// One pass of the timer.
    pub async fn tick<H: TxnHost + ?Sized>(&self, host: &H) {
        let slots: Vec<(String, Slot)> = self
            .txns
            .lock()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (id, slot) in slots {
            let Ok(mut guard) = slot.try_lock() else {
                continue; // a request holds it
            };
            let Some(m) = guard.clone() else { continue };
            let now = Self::now();
            let result = if m.state.is_prepare() {
                tracing::info!(transactional_id = %id, state = m.state.name(), "completing a transaction left in a prepare state");
                self.complete(host, &mut guard).await
            } else if m.is_timed_out(now) {
                tracing::info!(transactional_id = %id, producer_id = m.producer_id, epoch = m.producer_epoch, "aborting a timed-out transaction");
                match m.abort_timed_out(now) {
                    Ok(prepared) => self.finish(host, &mut guard, prepared).await,
                    Err(e) => Err(e.into()),
                }
            } else if m.state.is_idle() && now - m.last_update_ms > self.expiration_ms {
                match m.expire(now) {
                    Ok(dead) => self.persist_and_apply(host, &mut guard, dead).await,
                    Err(e) => Err(e.into()),
                }
            } else {
                Ok(())
            };
            if let Err(e) = result {
                tracing::warn!(transactional_id = %id, error = %e, "transaction timer: will retry");
            }
            if guard.is_none() {
                drop(guard);
                let mut txns = self.txns.lock();
                if txns.get(&id).is_some_and(|s| Arc::ptr_eq(s, &slot))
                    && Arc::strong_count(&slot) <= 2
                {
                    txns.remove(&id);
                }
            }
        }
    }
}

fn describe(m: &TxnMetadata) -> TxnDescription {
    TxnDescription {
        transactional_id: m.transactional_id.clone(),
        state: m.state,
        producer_id: m.producer_id,
        producer_epoch: m.producer_epoch,
        timeout_ms: m.timeout_ms,
        start_ms: m.start_ms,
        partitions: m.partitions.iter().cloned().collect(),
    }
}

async fn run_timer<H: TxnTimerHost>(host: Weak<H>) {
    // The first pass right away: finish what a restart left in a Prepare state.
    loop {
        let interval = {
            let Some(h) = host.upgrade() else { return };
            let txns = h.txn_coordinator();
            txns.tick(&*h).await;
            txns.cleanup_interval_ms
        };
        tokio::time::sleep(Duration::from_millis(interval)).await;
    }
}
