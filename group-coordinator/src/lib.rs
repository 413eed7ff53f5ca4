//! The group coordinator: every group whose `__consumer_offsets` partition
//! this broker leads, their committed offsets, and the timers that drive
//! them.
//!
//! Groups of every protocol share one group-id namespace and one offsets
//! store ([`GroupState`]: a [`Group`] plus its [`GroupOffsets`]). A group's
//! protocol lives behind the [`Group`] enum (the classic protocol,
//! [`classic::ClassicGroup`], or KIP-848, [`consumer_protocol::ConsumerGroup`]);
//! what offsets and admin requests need from any kind of group is the
//! [`GroupKind`] trait (commit fencing, fetch checks,
//! delete rules, subscriptions, state names).
//!
//! Each group has an async lock. A request takes it, runs the pure
//! transition on a copy of the state, appends the records the transition
//! asks for (GroupMetadata, OffsetCommit, tombstones) to the group's
//! `__consumer_offsets` partition and waits until they are durable, and only
//! then keeps the new state and answers. Parked JoinGroup / SyncGroup
//! requests wait on oneshot channels outside the lock. One timer task runs
//! each group's `tick` when its earliest deadline passes.
//!
//! At start, [`GroupCoordinator::load`] replays every partition of
//! `__consumer_offsets` to rebuild groups (classic and KIP-848) and offsets,
//! as Kafka does when a broker becomes a coordinator.

pub mod assignors;
pub mod classic;
pub mod consumer_groups;
pub mod consumer_protocol;
pub mod expiry;
pub mod offsets;
pub mod records;
pub mod txn_offsets;

/// The broker settings the group coordinator follows (Kafka's
/// `GroupCoordinatorConfig`), from the broker's config keys.
#[derive(Clone, Debug)]
pub struct GroupConfig {
    /// `group.initial.rebalance.delay.ms`
    pub initial_rebalance_delay_ms: i64,
    /// `group.min.session.timeout.ms` / `group.max.session.timeout.ms`
    pub min_session_timeout_ms: i32,
    pub max_session_timeout_ms: i32,
    /// `group.max.size`
    pub max_size: usize,
    /// `group.consumer.session.timeout.ms` (KIP-848 groups)
    pub consumer_session_timeout_ms: i32,
    /// `group.consumer.heartbeat.interval.ms`
    pub consumer_heartbeat_interval_ms: i32,
    /// `group.consumer.max.size`
    pub consumer_max_size: usize,
    /// `group.consumer.assignors`: server-side assignor names, the first the
    /// default.
    pub consumer_assignors: Vec<String>,
    /// `offset.metadata.max.bytes`
    pub offset_metadata_max_bytes: usize,
    /// `offsets.retention.minutes`
    pub offsets_retention_minutes: i64,
    /// `offsets.retention.check.interval.ms`
    pub offsets_retention_check_interval_ms: u64,
}

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tessera_metadata::TopicImage;
use tokio::sync::{oneshot, Notify, OwnedMutexGuard};

use tessera_server_common::coordinator::{self, store_error, PartitionWriter};
use tessera_server_common::error::ApiError;
use tessera_server_common::internal_topics::{
    partition_for, CONSUMER_OFFSETS, OFFSETS_TOPIC_PARTITIONS,
};

use classic::{
    ClassicConfig, ClassicGroup, DescribedMember, JoinRequest, JoinResult, Reply, SyncRequest,
    SyncResult, WaiterId,
};
pub use offsets::{CommittedOffset, GroupOffsets};
use records::CoordinatorRecord;

/// A group of one of the group protocols.
#[derive(Clone, Debug)]
pub enum Group {
    /// JoinGroup / SyncGroup / Heartbeat (and simple groups that only commit offsets).
    Classic(ClassicGroup),
    /// KIP-848 ConsumerGroupHeartbeat (persisted as Kafka's records, see [`consumer_groups`]).
    Consumer(consumer_protocol::ConsumerGroup),
}

/// What offsets and group administration need from a group, whatever its
/// protocol.
pub trait GroupKind {
    /// ListGroups' group type: "classic" or "consumer".
    fn group_type(&self) -> &'static str;
    /// The state name DescribeGroups and ListGroups report.
    fn state_name(&self) -> &'static str;
    fn protocol_type(&self) -> String;
    /// May this member commit offsets? (generation for classic members, member epoch for KIP-848 ones)
    fn validate_offset_commit(
        &self,
        member_id: &str,
        instance_id: Option<&str>,
        generation_or_epoch: i32,
    ) -> Result<(), ApiError>;
    /// May offsets be fetched? `GroupIdNotFound` means "as if no group".
    fn validate_offset_fetch(
        &self,
        member_id: Option<&str>,
        member_epoch: i32,
    ) -> Result<(), ApiError>;
    fn validate_offset_delete(&self) -> Result<(), ApiError>;
    fn validate_delete(&self) -> Result<(), ApiError>;
    fn is_subscribed_to_topic(&self, topic: &str) -> bool;
    /// When the group's timers next need a tick.
    fn next_deadline(&self) -> Option<i64>;
    fn describe(&self) -> GroupDescription;
}

/// A group as DescribeGroups shows it.
#[derive(Clone, Debug)]
pub struct GroupDescription {
    pub state: &'static str,
    pub protocol_type: String,
    /// The selected protocol (empty unless Stable, as Kafka reports it).
    pub protocol: String,
    pub members: Vec<DescribedMember>,
}

/// A group as ListGroups shows it.
#[derive(Clone, Debug)]
pub struct ListedGroup {
    pub group_id: String,
    pub protocol_type: String,
    pub state: &'static str,
    pub group_type: &'static str,
}

impl GroupKind for ClassicGroup {
    fn group_type(&self) -> &'static str {
        "classic"
    }

    fn state_name(&self) -> &'static str {
        self.state().name()
    }

    fn protocol_type(&self) -> String {
        ClassicGroup::protocol_type(self)
            .unwrap_or_default()
            .to_string()
    }

    fn validate_offset_commit(
        &self,
        member_id: &str,
        instance_id: Option<&str>,
        generation_or_epoch: i32,
    ) -> Result<(), ApiError> {
        ClassicGroup::validate_offset_commit(self, member_id, instance_id, generation_or_epoch)
    }

    fn validate_offset_fetch(&self, _: Option<&str>, _: i32) -> Result<(), ApiError> {
        match self.state() {
            classic::ClassicState::Dead => Err(ApiError::GroupIdNotFound),
            _ => Ok(()),
        }
    }

    fn validate_offset_delete(&self) -> Result<(), ApiError> {
        ClassicGroup::validate_offset_delete(self)
    }

    fn validate_delete(&self) -> Result<(), ApiError> {
        ClassicGroup::validate_delete(self)
    }

    fn is_subscribed_to_topic(&self, topic: &str) -> bool {
        ClassicGroup::is_subscribed_to_topic(self, topic)
    }

    fn next_deadline(&self) -> Option<i64> {
        ClassicGroup::next_deadline(self)
    }

    fn describe(&self) -> GroupDescription {
        let (protocol, members) = ClassicGroup::describe(self);
        GroupDescription {
            state: self.state().name(),
            protocol_type: GroupKind::protocol_type(self),
            protocol: protocol.unwrap_or_default(),
            members,
        }
    }
}

impl Group {
    pub fn kind(&self) -> &dyn GroupKind {
        match self {
            Group::Classic(g) => g,
            Group::Consumer(g) => g,
        }
    }

    /// Runs the group's due timers.
    fn tick(&mut self, group_id: &str, now: i64) -> Outcome {
        match self {
            Group::Classic(g) => {
                let fx = g.tick(now);
                Outcome::classic(group_id, g, fx)
            }
            Group::Consumer(g) => consumer_groups::tick(group_id, g, now),
        }
    }

    /// The records that delete the group (offsets are tombstoned separately).
    fn tombstones(&self, group_id: &str) -> Vec<CoordinatorRecord> {
        let classic = CoordinatorRecord::GroupMetadata {
            group: group_id.to_string(),
            value: None,
        };
        match self {
            Group::Classic(_) => vec![classic],
            // A consumer group may have replaced a classic one that was persisted.
            Group::Consumer(g) => {
                let mut records = consumer_groups::deletion_records(group_id, g);
                records.push(classic);
                records
            }
        }
    }

    /// The records that make a new group durable.
    fn creation_records(&self, group_id: &str) -> Vec<CoordinatorRecord> {
        match self {
            Group::Classic(g) => vec![CoordinatorRecord::GroupMetadata {
                group: group_id.to_string(),
                value: Some(g.to_record()),
            }],
            Group::Consumer(_) => vec![],
        }
    }
}

/// A group and its committed offsets: what a transition works on (a copy).
#[derive(Clone, Debug)]
pub struct GroupState {
    pub group: Group,
    pub offsets: GroupOffsets,
}

/// What a transition produced: answers for parked requests, and the records
/// to make durable before the new state is kept.
#[derive(Debug, Default)]
pub struct Outcome {
    pub replies: Vec<Reply>,
    pub records: Vec<CoordinatorRecord>,
}

impl Outcome {
    /// A classic transition: `store` persists the group's state after it.
    pub fn classic(group_id: &str, group: &ClassicGroup, fx: classic::Effects) -> Self {
        let records = if fx.store {
            vec![CoordinatorRecord::GroupMetadata {
                group: group_id.to_string(),
                value: Some(group.to_record()),
            }]
        } else {
            vec![]
        };
        Outcome {
            replies: fx.replies,
            records,
        }
    }
}

/// Kafka's `offsets.commit.timeout.ms` default: how long a group's append
/// to `__consumer_offsets` may take before the request fails
/// (COORDINATOR_NOT_AVAILABLE, retriable).
pub(crate) const OFFSETS_COMMIT_TIMEOUT: Duration = Duration::from_millis(5000);

enum Waiter {
    Join(oneshot::Sender<JoinResult>),
    Sync(oneshot::Sender<SyncResult>),
}

/// One group id's slot: its lock-protected state, and its next timer deadline.
pub struct GroupSlot {
    pub group_id: String,
    entry: Arc<tokio::sync::Mutex<GroupEntry>>,
    /// `i64::MAX` when no timer is due.
    next_deadline: AtomicI64,
    ticking: AtomicBool,
    /// Set once the slot leaves the coordinator (its partition unloaded or
    /// reloaded, the group removed): nothing will ever answer its waiters,
    /// whose requests hold the slot alive while they wait.
    gone: AtomicBool,
    gone_notify: Notify,
}

impl GroupSlot {
    fn mark_gone(&self) {
        self.gone.store(true, Ordering::Release);
        self.gone_notify.notify_waiters();
    }

    /// A JoinGroup's or SyncGroup's answer, or NOT_COORDINATOR when the
    /// slot leaves the coordinator first: Kafka answers the requests
    /// waiting in a group whose partition moves away so, and the client
    /// finds the new coordinator (a waiter left here waited for ever).
    async fn reply<T>(&self, mut rx: oneshot::Receiver<T>) -> Result<T, ApiError> {
        let gone = self.gone_notify.notified();
        tokio::pin!(gone);
        gone.as_mut().enable();
        if !self.gone.load(Ordering::Acquire) {
            tokio::select! {
                biased;
                reply = &mut rx => return reply.map_err(|_| ApiError::RebalanceInProgress),
                _ = gone => {}
            }
        }
        // Gone: an answer sent before it still counts.
        rx.try_recv().map_err(|_| ApiError::NotCoordinator)
    }
}

pub struct GroupEntry {
    pub state: GroupState,
    /// Deleted: whoever still holds the slot must look the group up again.
    removed: bool,
    /// Whether the group's existence is durable (a new group writes its
    /// empty metadata with its first transition).
    persisted: bool,
    waiters: HashMap<WaiterId, Waiter>,
}

/// How [`GroupCoordinator::lock`] treats a missing group.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Create {
    No,
    /// A JoinGroup: a new classic group, persisted with its first transition.
    Joining,
    /// An offset commit from outside group management: a simple group that
    /// its offsets make durable.
    Simple,
}

pub struct GroupCoordinator {
    classic: ClassicConfig,
    /// KIP-848 consumer groups' settings (for groups rebuilt at load).
    consumer: consumer_protocol::ConsumerGroupConfig,
    offset_metadata_max_bytes: usize,
    groups: parking_lot::Mutex<HashMap<String, Arc<GroupSlot>>>,
    next_waiter: AtomicU64,
    wake: Notify,
    started: Instant,
    started_wall: i64,
    /// Transactional offsets waiting for their transaction to end.
    pub(crate) txn_pending: txn_offsets::TxnPending,
    /// The `__consumer_offsets` partitions whose groups are loaded here
    /// (they load and unload with this broker's leadership of them).
    loaded: coordinator::LoadedPartitions,
    /// `offsets.retention.minutes`, `offsets.retention.check.interval.ms`.
    offsets_retention_minutes: i64,
    offsets_retention_check_interval_ms: u64,
}

/// The broker as the group coordinator's background tasks see it (group
/// timers, offset expiry): the partitions, whether it serves requests now,
/// and the coordinator it holds. Implemented by `Broker`
/// (`broker/internal_topics.rs`).
pub trait GroupHost: PartitionWriter + 'static {
    fn group_coordinator(&self) -> &GroupCoordinator;
    fn serving(&self) -> bool;
}

impl GroupCoordinator {
    pub fn new(config: &GroupConfig) -> Self {
        GroupCoordinator {
            classic: ClassicConfig {
                initial_rebalance_delay_ms: config.initial_rebalance_delay_ms,
                new_member_join_timeout_ms: 300_000,
                max_size: config.max_size,
                min_session_timeout_ms: config.min_session_timeout_ms,
                max_session_timeout_ms: config.max_session_timeout_ms,
            },
            consumer: consumer_groups::consumer_config(config),
            offset_metadata_max_bytes: config.offset_metadata_max_bytes,
            offsets_retention_minutes: config.offsets_retention_minutes,
            offsets_retention_check_interval_ms: config.offsets_retention_check_interval_ms,
            groups: parking_lot::Mutex::new(HashMap::new()),
            next_waiter: AtomicU64::new(1),
            wake: Notify::new(),
            started: Instant::now(),
            started_wall: tessera_log::now_ms(),
            txn_pending: Default::default(),
            loaded: Default::default(),
        }
    }

    /// Whether an open transaction holds a pending offset commit of
    /// `group` for this partition (OffsetFetch's UNSTABLE_OFFSET_COMMIT).
    pub fn has_pending_txn_offset(&self, group: &str, topic: &str, partition: i32) -> bool {
        self.txn_pending.is_pending(group, topic, partition)
    }

    /// Milliseconds: wall-clock at start plus a monotonic clock since.
    pub fn now(&self) -> i64 {
        self.started_wall + self.started.elapsed().as_millis() as i64
    }

    fn wall_now(&self) -> i64 {
        self.now()
    }

    fn waiter(&self) -> WaiterId {
        self.next_waiter.fetch_add(1, Ordering::Relaxed)
    }

    /// The `__consumer_offsets` partition of a group, if this broker leads it.
    pub fn coordinator_partition<W: PartitionWriter + ?Sized>(
        &self,
        writer: &W,
        group_id: &str,
    ) -> Result<(Arc<TopicImage>, i32), ApiError> {
        let image = writer.image();
        let topic = image
            .topic_by_name(CONSUMER_OFFSETS)
            .cloned()
            .ok_or(ApiError::CoordinatorNotAvailable)?;
        let partition = partition_for(group_id, topic.partitions);
        writer
            .check_leader(&image, &topic, partition)
            .map_err(|_| ApiError::NotCoordinator)?;
        self.loaded.check(partition)?;
        Ok((topic, partition))
    }

    /// Appends records to the group's partition and waits until they are durable.
    async fn append<W: PartitionWriter + ?Sized>(
        &self,
        writer: &W,
        group_id: &str,
        records: Vec<CoordinatorRecord>,
    ) -> Result<(), ApiError> {
        let (topic, partition) = self.coordinator_partition(writer, group_id)?;
        let kv: Vec<(Option<Bytes>, Option<Bytes>)> = records.iter().map(|r| r.encode()).collect();
        coordinator::append_within(
            OFFSETS_COMMIT_TIMEOUT,
            writer.append_records(&topic, partition, &kv),
        )
        .await
        .map(|_| ())
    }

    fn new_slot(&self, group_id: &str, state: GroupState, persisted: bool) -> Arc<GroupSlot> {
        let deadline = state.group.kind().next_deadline().unwrap_or(i64::MAX);
        Arc::new(GroupSlot {
            group_id: group_id.to_string(),
            entry: Arc::new(tokio::sync::Mutex::new(GroupEntry {
                state,
                removed: false,
                persisted,
                waiters: HashMap::new(),
            })),
            next_deadline: AtomicI64::new(deadline),
            ticking: AtomicBool::new(false),
            gone: AtomicBool::new(false),
            gone_notify: Notify::new(),
        })
    }

    fn new_classic(&self, group_id: &str) -> GroupState {
        GroupState {
            group: Group::Classic(ClassicGroup::new(
                group_id,
                self.classic.clone(),
                self.now(),
            )),
            offsets: GroupOffsets::default(),
        }
    }

    /// Locks a group, creating it as `create` says when it does not exist.
    pub(crate) async fn lock(
        &self,
        group_id: &str,
        create: Create,
    ) -> Option<(Arc<GroupSlot>, OwnedMutexGuard<GroupEntry>)> {
        loop {
            let slot = {
                let mut groups = self.groups.lock();
                match groups.get(group_id) {
                    Some(s) => s.clone(),
                    None if create == Create::No => return None,
                    None => {
                        let slot = self.new_slot(
                            group_id,
                            self.new_classic(group_id),
                            create == Create::Simple,
                        );
                        groups.insert(group_id.to_string(), slot.clone());
                        slot
                    }
                }
            };
            let entry = slot.entry.clone().lock_owned().await;
            if !entry.removed {
                return Some((slot, entry));
            }
        }
    }

    /// Removes a group's slot (its entry is marked so holders look again).
    fn remove_slot(&self, slot: &Arc<GroupSlot>, entry: &mut GroupEntry) {
        entry.removed = true;
        slot.mark_gone();
        let mut groups = self.groups.lock();
        if groups
            .get(&slot.group_id)
            .is_some_and(|s| Arc::ptr_eq(s, slot))
        {
            groups.remove(&slot.group_id);
        }
    }

    /// Runs a transition on a copy of the group's state; appends what it
    /// asks to persist (plus the group's creation record if it is new) and
    /// keeps the copy only once that is durable. Replies go out after.
    async fn transact<W: PartitionWriter + ?Sized, F>(
        &self,
        writer: &W,
        slot: &Arc<GroupSlot>,
        entry: &mut GroupEntry,
        transition: F,
    ) -> Result<(), ApiError>
    where
        F: FnOnce(&mut GroupState, i64) -> Outcome,
    {
        let now = self.now();
        let mut next = entry.state.clone();
        let mut outcome = transition(&mut next, now);
        if !entry.persisted && outcome.records.is_empty() {
            outcome.records = next.group.creation_records(&slot.group_id);
        }
        if !outcome.records.is_empty() {
            if let Err(e) = self.append(writer, &slot.group_id, outcome.records).await {
                tracing::warn!(group = %slot.group_id, error = %e, "could not persist group state");
                if !entry.persisted {
                    self.remove_slot(slot, entry);
                }
                return Err(store_error(e));
            }
            entry.persisted = true;
        }
        entry.state = next;
        for reply in outcome.replies {
            match reply {
                Reply::Join(w, result) => {
                    if let Some(Waiter::Join(tx)) = entry.waiters.remove(&w) {
                        let _ = tx.send(result);
                    }
                }
                Reply::Sync(w, result) => {
                    if let Some(Waiter::Sync(tx)) = entry.waiters.remove(&w) {
                        let _ = tx.send(result);
                    }
                }
            }
        }
        self.rearm(slot, entry);
        Ok(())
    }

    fn rearm(&self, slot: &GroupSlot, entry: &GroupEntry) {
        let deadline = entry.state.group.kind().next_deadline().unwrap_or(i64::MAX);
        let old = slot.next_deadline.swap(deadline, Ordering::AcqRel);
        if deadline < old {
            self.wake.notify_one();
        }
    }

    // ---- classic protocol ------------------------------------------------

    /// JoinGroup: answers when the join phase completes (or at once).
    pub async fn join_group<W: PartitionWriter + ?Sized>(
        &self,
        writer: &W,
        group_id: &str,
        mut req: JoinRequest,
    ) -> JoinResult {
        let member_id = req.member_id.clone();
        if group_id.is_empty() {
            return JoinResult::error(member_id, ApiError::InvalidGroupId);
        }
        if let Err(e) = self.coordinator_partition(writer, group_id) {
            return JoinResult::error(member_id, e);
        }
        let create = if member_id.is_empty() {
            Create::Joining
        } else {
            Create::No
        };
        let Some((slot, mut entry)) = self.lock(group_id, create).await else {
            return JoinResult::error(member_id, ApiError::UnknownMemberId);
        };
        req.new_member_id = format!(
            "{}-{}",
            req.group_instance_id.as_deref().unwrap_or(&req.client_id),
            uuid::Uuid::new_v4()
        );
        let waiter = self.waiter();
        let (tx, rx) = oneshot::channel();
        entry.waiters.insert(waiter, Waiter::Join(tx));
        let group_name = slot.group_id.clone();
        let result = self
            .transact(writer, &slot, &mut entry, |s, now| match &mut s.group {
                Group::Classic(g) => {
                    let fx = g.join(req, waiter, now);
                    Outcome::classic(&group_name, g, fx)
                }
                Group::Consumer(_) => {
                    consumer_groups::classic_join(s, &group_name, &self.classic, req, waiter, now)
                }
            })
            .await;
        if let Err(e) = result {
            entry.waiters.remove(&waiter);
            return JoinResult::error(member_id, e);
        }
        drop(entry);
        slot.reply(rx)
            .await
            .unwrap_or_else(|e| JoinResult::error(member_id, e))
    }

    /// SyncGroup: answers when the leader's assignment is persisted (or at once).
    pub async fn sync_group<W: PartitionWriter + ?Sized>(
        &self,
        writer: &W,
        group_id: &str,
        req: SyncRequest,
    ) -> SyncResult {
        if group_id.is_empty() {
            return SyncResult::error(ApiError::InvalidGroupId);
        }
        if let Err(e) = self.coordinator_partition(writer, group_id) {
            return SyncResult::error(e);
        }
        let Some((slot, mut entry)) = self.lock(group_id, Create::No).await else {
            return SyncResult::error(ApiError::UnknownMemberId);
        };
        let waiter = self.waiter();
        let (tx, rx) = oneshot::channel();
        entry.waiters.insert(waiter, Waiter::Sync(tx));
        let generation = req.generation_id;
        let group_name = slot.group_id.clone();
        let result = self
            .transact(writer, &slot, &mut entry, |s, now| match &mut s.group {
                Group::Classic(g) => {
                    let fx = g.sync(req, waiter, now);
                    Outcome::classic(&group_name, g, fx)
                }
                Group::Consumer(_) => consumer_groups::classic_sync(waiter),
            })
            .await;
        if let Err(e) = result {
            entry.waiters.remove(&waiter);
            // Only the leader's assignment is persisted here: the members
            // waiting for it get the error and the group rebalances.
            let error = e.clone();
            let _ = self
                .transact(writer, &slot, &mut entry, |s, now| match &mut s.group {
                    Group::Classic(g) => {
                        let fx = g.assignment_store_failed(generation, error, now);
                        Outcome::classic(&group_name, g, fx)
                    }
                    Group::Consumer(_) => Outcome::default(),
                })
                .await;
            return SyncResult::error(e);
        }
        drop(entry);
        slot.reply(rx).await.unwrap_or_else(SyncResult::error)
    }

    pub async fn heartbeat<W: PartitionWriter + ?Sized>(
        &self,
        writer: &W,
        group_id: &str,
        member_id: &str,
        instance_id: Option<&str>,
        generation_id: i32,
    ) -> Result<(), ApiError> {
        if group_id.is_empty() {
            return Err(ApiError::InvalidGroupId);
        }
        self.coordinator_partition(writer, group_id)?;
        let (slot, mut entry) = self
            .lock(group_id, Create::No)
            .await
            .ok_or(ApiError::UnknownMemberId)?;
        let mut result = Ok(());
        self.transact(writer, &slot, &mut entry, |s, now| {
            match &mut s.group {
                Group::Classic(g) => {
                    result = g.heartbeat(member_id, instance_id, generation_id, now)
                }
                Group::Consumer(_) => result = Err(ApiError::UnknownMemberId),
            }
            Outcome::default()
        })
        .await?;
        result
    }

    /// LeaveGroup: `(member id, group instance id)` pairs; `Err` is the
    /// group-level error, otherwise one result per member.
    pub async fn leave_group<W: PartitionWriter + ?Sized>(
        &self,
        writer: &W,
        group_id: &str,
        members: Vec<(String, Option<String>)>,
    ) -> Result<Vec<Result<(), ApiError>>, ApiError> {
        if group_id.is_empty() {
            return Err(ApiError::InvalidGroupId);
        }
        self.coordinator_partition(writer, group_id)?;
        let Some((slot, mut entry)) = self.lock(group_id, Create::No).await else {
            return Ok(members
                .iter()
                .map(|_| Err(ApiError::UnknownMemberId))
                .collect());
        };
        let mut results = Err(ApiError::UnknownMemberId);
        let group_name = slot.group_id.clone();
        self.transact(writer, &slot, &mut entry, |s, now| match &mut s.group {
            Group::Classic(g) => {
                let (r, fx) = g.leave(&members, now);
                results = r;
                Outcome::classic(&group_name, g, fx)
            }
            Group::Consumer(_) => {
                results = Ok(members
                    .iter()
                    .map(|_| Err(ApiError::UnknownMemberId))
                    .collect());
                Outcome::default()
            }
        })
        .await?;
        results
    }

    // ---- administration ----------------------------------------------------

    pub async fn list_groups(&self) -> Vec<ListedGroup> {
        let slots: Vec<Arc<GroupSlot>> = self.groups.lock().values().cloned().collect();
        let mut out = Vec::with_capacity(slots.len());
        for slot in slots {
            let entry = slot.entry.lock().await;
            if entry.removed {
                continue;
            }
            let kind = entry.state.group.kind();
            out.push(ListedGroup {
                group_id: slot.group_id.clone(),
                protocol_type: kind.protocol_type(),
                state: kind.state_name(),
                group_type: kind.group_type(),
            });
        }
        out.sort_by(|a, b| a.group_id.cmp(&b.group_id));
        out
    }

    /// `Ok(None)`: no such group.
    pub async fn describe_group<W: PartitionWriter + ?Sized>(
        &self,
        writer: &W,
        group_id: &str,
    ) -> Result<Option<GroupDescription>, ApiError> {
        self.coordinator_partition(writer, group_id)?;
        Ok(match self.lock(group_id, Create::No).await {
            // Only classic groups are described here; a consumer group is
            // "not a classic group": Dead (v6+: GROUP_ID_NOT_FOUND), as Kafka.
            Some((_slot, entry)) if !matches!(entry.state.group, Group::Consumer(_)) => {
                Some(entry.state.group.kind().describe())
            }
            _ => None,
        })
    }

    /// DeleteGroups for one group: tombstones for its offsets and its
    /// metadata, then it is gone.
    pub async fn delete_group<W: PartitionWriter + ?Sized>(
        &self,
        writer: &W,
        group_id: &str,
    ) -> Result<(), ApiError> {
        if group_id.is_empty() {
            return Err(ApiError::InvalidGroupId);
        }
        self.coordinator_partition(writer, group_id)?;
        let (slot, mut entry) = self
            .lock(group_id, Create::No)
            .await
            .ok_or(ApiError::GroupIdNotFound)?;
        entry.state.group.kind().validate_delete()?;
        let mut records: Vec<CoordinatorRecord> = entry
            .state
            .offsets
            .iter()
            .map(|(t, p, _)| CoordinatorRecord::OffsetCommit {
                group: group_id.to_string(),
                topic: t.to_string(),
                partition: p,
                value: None,
            })
            .collect();
        records.extend(entry.state.group.tombstones(group_id));
        self.append(writer, group_id, records)
            .await
            .map_err(store_error)?;
        let now = self.now();
        match &mut entry.state.group {
            Group::Classic(g) => {
                let _ = g.mark_dead(now);
            }
            Group::Consumer(_) => {}
        }
        self.remove_slot(&slot, &mut entry);
        Ok(())
    }

    /// Reads a group's committed offsets (tests, metrics).
    pub async fn committed(&self, group_id: &str) -> Option<GroupOffsets> {
        let (_slot, entry) = self.lock(group_id, Create::No).await?;
        Some(entry.state.offsets.clone())
    }

    pub fn group_count(&self) -> usize {
        self.groups.lock().len()
    }

    // ---- load and timers ---------------------------------------------------

    /// Replays `partitions` of `__consumer_offsets` (which this broker
    /// now leads) to rebuild their groups and committed offsets; requests
    /// for their groups are served from then on.
    pub async fn load_partitions<W: PartitionWriter + ?Sized>(
        &self,
        writer: &W,
        partitions: &[i32],
    ) -> anyhow::Result<()> {
        let started = Instant::now();
        let image = writer.image();
        let Some(topic) = image.topic_by_name(CONSUMER_OFFSETS).cloned() else {
            return Ok(());
        };
        let now = self.now();
        let mut states: HashMap<String, GroupState> = HashMap::new();
        let (mut records, mut skipped) = (0usize, 0usize);
        // Transactional offset commits wait for their marker.
        let mut open_txns = txn_offsets::LoadPending::default();
        for &partition in partitions {
            let stored = match writer.read_records(&topic, partition).await {
                Ok(r) => r,
                // Leadership moved away too: the load fails all the same
                // (a partition it skipped would be served as empty).
                Err(e) => {
                    return Err(anyhow::anyhow!(
                        "reading {CONSUMER_OFFSETS}-{partition}: {e}"
                    ))
                }
            };
            for r in stored {
                if r.control {
                    if let Some(commit) = r
                        .key
                        .as_deref()
                        .and_then(tessera_log::records::marker_is_commit)
                    {
                        let committed = open_txns.end(r.producer_id, commit);
                        self.replay_committed(&mut states, committed, now);
                    }
                    continue;
                }
                records += 1;
                match CoordinatorRecord::decode(r.key.as_deref(), r.value.as_deref()) {
                    Ok(rec) if r.transactional => open_txns.push(r.producer_id, rec),
                    Ok(rec) => self.replay(&mut states, rec, now),
                    Err(e) => {
                        skipped += 1;
                        tracing::warn!(partition, offset = r.offset, error = %e, "skipping undecodable {CONSUMER_OFFSETS} record");
                    }
                }
            }
        }
        let offsets: usize = states.values().map(|s| s.offsets.len()).sum();
        let mut consumer_groups = 0usize;
        for state in states.values_mut() {
            if let Group::Consumer(g) = &mut state.group {
                g.finish_load(&*image, now);
                consumer_groups += 1;
            }
        }
        self.keep_open_txn_offsets(open_txns);
        let mut groups = self.groups.lock();
        let loaded = states.len();
        // What was loaded here before is replaced by what the log says.
        drop_groups_of(&mut groups, partitions);
        for (id, state) in states {
            groups.insert(id.clone(), self.new_slot(&id, state, true));
        }
        self.loaded.add(partitions);
        tracing::info!(
            partitions = partitions.len(),
            groups = loaded,
            consumer_groups,
            offsets,
            records,
            skipped,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "loaded consumer groups from {CONSUMER_OFFSETS}"
        );
        drop(groups);
        self.wake.notify_one();
        Ok(())
    }

    /// Drops the groups of `partitions` (this broker no longer leads them):
    /// requests for them get NOT_COORDINATOR and clients find the new one.
    pub fn unload_partitions(&self, partitions: &[i32]) {
        self.loaded.remove(partitions);
        let mut groups = self.groups.lock();
        let before = groups.len();
        drop_groups_of(&mut groups, partitions);
        tracing::info!(
            partitions = partitions.len(),
            groups = before - groups.len(),
            "unloaded consumer groups"
        );
    }

    fn replay(&self, states: &mut HashMap<String, GroupState>, rec: CoordinatorRecord, now: i64) {
        match rec {
            CoordinatorRecord::OffsetCommit {
                group,
                topic,
                partition,
                value,
            } => match value {
                Some(v) => {
                    let state = states
                        .entry(group.clone())
                        .or_insert_with(|| self.new_classic(&group));
                    state
                        .offsets
                        .insert(topic, partition, CommittedOffset::from_value(&v));
                }
                None => {
                    if let Some(state) = states.get_mut(&group) {
                        state.offsets.remove(&topic, partition);
                    }
                }
            },
            CoordinatorRecord::GroupMetadata { group, value } => match value {
                Some(v) => {
                    let loaded = Group::Classic(ClassicGroup::from_record(
                        &group,
                        self.classic.clone(),
                        &v,
                        now,
                    ));
                    match states.get_mut(&group) {
                        Some(state) => state.group = loaded,
                        None => {
                            states.insert(
                                group,
                                GroupState {
                                    group: loaded,
                                    offsets: GroupOffsets::default(),
                                },
                            );
                        }
                    }
                }
                None => {
                    let keep = states.get(&group).is_some_and(|s| !s.offsets.is_empty());
                    if keep {
                        let fresh = self.new_classic(&group).group;
                        states.get_mut(&group).expect("present").group = fresh;
                    } else {
                        states.remove(&group);
                    }
                }
            },
            CoordinatorRecord::Other { .. } => {}
            rec => self.replay_consumer(states, rec),
        }
    }

    /// Starts the task that runs each group's timers when they are due,
    /// and the offset expiry task.
    pub fn start_timers<H: GroupHost>(host: &Arc<H>) {
        tokio::spawn(run_timers(Arc::downgrade(host)));
        tokio::spawn(expiry::run(Arc::downgrade(host)));
    }

    /// Makes sure `__consumer_offsets` exists (FindCoordinator does this).
    pub async fn ensure_offsets_topic<W: PartitionWriter + ?Sized>(
        writer: &W,
    ) -> Result<Arc<TopicImage>, ApiError> {
        writer
            .ensure_internal_topic(CONSUMER_OFFSETS, OFFSETS_TOPIC_PARTITIONS)
            .await
    }
}

/// Drops the groups that hash to `partitions`; requests waiting in them
/// are answered NOT_COORDINATOR.
fn drop_groups_of(groups: &mut HashMap<String, Arc<GroupSlot>>, partitions: &[i32]) {
    groups.retain(|id, slot| {
        let keep = !partitions.contains(&partition_for(id, OFFSETS_TOPIC_PARTITIONS));
        if !keep {
            slot.mark_gone();
        }
        keep
    });
}

async fn run_timers<H: GroupHost>(host: Weak<H>) {
    loop {
        let (next, due) = {
            let Some(b) = host.upgrade() else { return };
            let coordinator = b.group_coordinator();
            let now = coordinator.now();
            let mut next = now + 1000;
            let mut due = Vec::new();
            for slot in coordinator.groups.lock().values() {
                let d = slot.next_deadline.load(Ordering::Acquire);
                if d <= now {
                    if !slot.ticking.swap(true, Ordering::AcqRel) {
                        due.push(slot.clone());
                    }
                } else {
                    next = next.min(d);
                }
            }
            (next - now, due)
        };
        for slot in due {
            let host = host.clone();
            tokio::spawn(async move {
                if let Some(b) = host.upgrade() {
                    tick_group(&*b, &slot).await;
                }
                slot.ticking.store(false, Ordering::Release);
            });
        }
        let Some(b) = host.upgrade() else { return };
        let wake = b.group_coordinator().wake.notified();
        let _ = tokio::time::timeout(Duration::from_millis(next.max(1) as u64), wake).await;
    }
}

async fn tick_group<H: GroupHost>(host: &H, slot: &Arc<GroupSlot>) {
    let coordinator = host.group_coordinator();
    let mut entry = slot.entry.clone().lock_owned().await;
    if entry.removed {
        return;
    }
    let group_name = slot.group_id.clone();
    let result = coordinator
        .transact(host, slot, &mut entry, |s, now| {
            s.group.tick(&group_name, now)
        })
        .await;
    if result.is_err() {
        // State unchanged: try again in a second.
        slot.next_deadline
            .store(coordinator.now() + 1000, Ordering::Release);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;

    use bytes::Bytes;
    use kafka_protocol::records::Record;
    use tessera_metadata::{MetadataImage, MetadataRecord, TopicImage, TopicRecord};
    use tessera_server_common::coordinator::PartitionWriter;
    use tessera_server_common::error::ApiError;
    use tessera_server_common::internal_topics::{CONSUMER_OFFSETS, OFFSETS_TOPIC_PARTITIONS};

    /// An in-memory [`PartitionWriter`] with `__consumer_offsets` and a
    /// 3-partition `orders` topic, whose appends can be made to fail.
    pub(crate) struct MemoryWriter {
        image: Arc<MetadataImage>,
        pub(crate) fail_appends: AtomicBool,
        /// Appends that never complete.
        pub(crate) hang_appends: AtomicBool,
        pub(crate) appends: AtomicUsize,
    }

    impl MemoryWriter {
        pub(crate) fn new() -> MemoryWriter {
            let mut image = MetadataImage::default();
            for (i, (name, partitions)) in
                [(CONSUMER_OFFSETS, OFFSETS_TOPIC_PARTITIONS), ("orders", 3)]
                    .into_iter()
                    .enumerate()
            {
                image.apply(
                    &MetadataRecord::CreateTopic(TopicRecord {
                        topic_id: uuid::Uuid::from_u128(i as u128 + 1),
                        name: name.to_string(),
                        partitions,
                        replication_factor: 1,
                        configs: BTreeMap::new(),
                    }),
                    i as i64,
                );
            }
            MemoryWriter {
                image: Arc::new(image),
                fail_appends: AtomicBool::new(false),
                hang_appends: AtomicBool::new(false),
                appends: AtomicUsize::new(0),
            }
        }

        fn append(&self) -> Result<i64, ApiError> {
            if self.fail_appends.load(Ordering::SeqCst) {
                return Err(ApiError::NotLeaderOrFollower);
            }
            Ok(self.appends.fetch_add(1, Ordering::SeqCst) as i64)
        }
    }

    impl PartitionWriter for MemoryWriter {
        fn image(&self) -> Arc<MetadataImage> {
            self.image.clone()
        }

        fn check_leader(&self, _: &MetadataImage, _: &TopicImage, _: i32) -> Result<i32, ApiError> {
            Ok(0)
        }

        async fn ensure_internal_topic(
            &self,
            name: &str,
            _: u32,
        ) -> Result<Arc<TopicImage>, ApiError> {
            self.image
                .topic_by_name(name)
                .cloned()
                .ok_or(ApiError::CoordinatorNotAvailable)
        }

        async fn append_records(
            &self,
            _: &TopicImage,
            _: i32,
            _: &[(Option<Bytes>, Option<Bytes>)],
        ) -> Result<i64, ApiError> {
            if self.hang_appends.load(Ordering::SeqCst) {
                std::future::pending::<()>().await;
            }
            self.append()
        }

        async fn append_transactional(
            &self,
            _: &TopicImage,
            _: i32,
            _: i64,
            _: i16,
            _: &[(Option<Bytes>, Option<Bytes>)],
        ) -> Result<i64, ApiError> {
            if self.hang_appends.load(Ordering::SeqCst) {
                std::future::pending::<()>().await;
            }
            self.append()
        }

        async fn read_records(&self, _: &TopicImage, _: i32) -> Result<Vec<Record>, ApiError> {
            Ok(Vec::new())
        }
    }

    /// Kafka's defaults for the group keys (the broker's config table is
    /// where production values come from).
    pub(crate) fn config() -> super::GroupConfig {
        super::GroupConfig {
            initial_rebalance_delay_ms: 3000,
            min_session_timeout_ms: 6000,
            max_session_timeout_ms: 1_800_000,
            max_size: i32::MAX as usize,
            consumer_session_timeout_ms: 45_000,
            consumer_heartbeat_interval_ms: 5000,
            consumer_max_size: i32::MAX as usize,
            consumer_assignors: vec!["uniform".into(), "range".into()],
            offset_metadata_max_bytes: 4096,
            offsets_retention_minutes: 10_080,
            offsets_retention_check_interval_ms: 600_000,
        }
    }

    /// A commit of `offset` for group "g", partition 1 of `orders`.
    pub(crate) fn commit(offset: i64) -> crate::offsets::CommitRequest {
        crate::offsets::CommitRequest {
            group_id: "g".into(),
            generation_or_epoch: -1,
            member_id: String::new(),
            group_instance_id: None,
            api_version: 8,
            topics: vec![(
                "orders".into(),
                vec![crate::offsets::PartitionCommit {
                    partition: 1,
                    offset,
                    leader_epoch: -1,
                    metadata: None,
                }],
            )],
        }
    }

    /// A coordinator with group "g"'s `__consumer_offsets` partition
    /// loaded (from `writer`), and that partition.
    async fn coordinator_of_g(writer: &MemoryWriter) -> (super::GroupCoordinator, i32) {
        let coordinator = super::GroupCoordinator::new(&config());
        let partition =
            tessera_server_common::internal_topics::partition_for("g", OFFSETS_TOPIC_PARTITIONS);
        coordinator
            .load_partitions(writer, &[partition])
            .await
            .unwrap();
        (coordinator, partition)
    }

    /// A commit whose append never completes (its log closed under it)
    /// fails after Kafka's `offsets.commit.timeout.ms` with a retriable
    /// error, and the group serves the next request: before, the group's
    /// lock and the client's connection waited for ever (CI's fault run:
    /// both queue consumers stuck in their commits after an fsync hang).
    #[tokio::test]
    async fn a_commit_whose_append_never_completes_times_out() {
        let writer = MemoryWriter::new();
        let (coordinator, _) = coordinator_of_g(&writer).await;
        writer.hang_appends.store(true, Ordering::SeqCst);
        let r = coordinator.commit_offsets(&writer, commit(5)).await;
        assert!(
            matches!(r[0].1[0].1, Err(ApiError::CoordinatorNotAvailable)),
            "{r:?}"
        );
        writer.hang_appends.store(false, Ordering::SeqCst);
        let r = coordinator.commit_offsets(&writer, commit(6)).await;
        assert!(r[0].1[0].1.is_ok(), "{r:?}");
    }

    /// The same for a TxnOffsetCommit: its transactional append is bounded
    /// too, and the producer may retry it.
    #[tokio::test]
    async fn a_txn_offset_commit_whose_append_never_completes_times_out() {
        let writer = MemoryWriter::new();
        let (coordinator, _) = coordinator_of_g(&writer).await;
        let request = |offset| {
            let plain = commit(offset);
            crate::txn_offsets::TxnCommitRequest {
                group_id: plain.group_id,
                producer_id: 7,
                producer_epoch: 0,
                generation_id: -1,
                member_id: String::new(),
                group_instance_id: None,
                topics: plain.topics,
            }
        };
        writer.hang_appends.store(true, Ordering::SeqCst);
        let r = coordinator.txn_offset_commit(&writer, request(5)).await;
        assert!(
            matches!(r[0].1[0].1, Err(ApiError::CoordinatorNotAvailable)),
            "{r:?}"
        );
        writer.hang_appends.store(false, Ordering::SeqCst);
        let r = coordinator.txn_offset_commit(&writer, request(6)).await;
        assert!(r[0].1[0].1.is_ok(), "{r:?}");
    }

    fn join_request() -> crate::classic::JoinRequest {
        crate::classic::JoinRequest {
            member_id: String::new(),
            group_instance_id: None,
            client_id: "client".into(),
            client_host: "/127.0.0.1".into(),
            session_timeout_ms: 10_000,
            rebalance_timeout_ms: 300_000,
            protocol_type: "consumer".into(),
            protocols: vec![crate::classic::Protocol {
                name: "range".into(),
                metadata: Bytes::from_static(b"r"),
            }],
            requires_known_member_id: false,
            supports_skip_assignment: false,
            new_member_id: String::new(),
        }
    }

    /// A JoinGroup waiting for its join phase to end (here the initial
    /// rebalance delay of a new group, whose timer this test never runs)
    /// when the group's `__consumer_offsets` partition is unloaded is
    /// answered NOT_COORDINATOR, and so is one waiting when the partition
    /// is loaded again over it: the client finds the coordinator again.
    /// Before, the waiting request held the unloaded group alive and was
    /// never answered (fault run seed 4: a consumer's JoinGroup, and its
    /// offset commit queued behind it, waited for the rest of the run).
    #[tokio::test]
    async fn a_join_waiting_when_its_partition_moves_away_gets_not_coordinator() {
        let writer = Arc::new(MemoryWriter::new());
        let (coordinator, partition) = coordinator_of_g(&writer).await;
        let coordinator = Arc::new(coordinator);
        for reload in [false, true] {
            let join = tokio::spawn({
                let (coordinator, writer) = (coordinator.clone(), writer.clone());
                async move { coordinator.join_group(&*writer, "g", join_request()).await }
            });
            // The member waits in the join phase.
            loop {
                let groups = coordinator.list_groups().await;
                if groups
                    .iter()
                    .any(|g| g.group_id == "g" && g.state == "PreparingRebalance")
                {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            if reload {
                coordinator
                    .load_partitions(&*writer, &[partition])
                    .await
                    .unwrap();
            } else {
                coordinator.unload_partitions(&[partition]);
            }
            // A guard against a hang, not a timing: the answer is immediate.
            let answer = tokio::time::timeout(std::time::Duration::from_secs(60), join)
                .await
                .expect("the waiting JoinGroup is answered")
                .unwrap();
            assert!(
                matches!(answer.error, Some(ApiError::NotCoordinator)),
                "reload {reload}: {answer:?}"
            );
            if !reload {
                coordinator
                    .load_partitions(&*writer, &[partition])
                    .await
                    .unwrap();
            }
        }
    }
}
