//! The KIP-848 consumer group protocol (`ConsumerGroupHeartbeat`), as
//! Kafka's group coordinator runs it: pure decision logic, no I/O, the clock
//! passed in. The handler layer owns the groups, the locking and the timer.
//!
//! A group has a **group epoch**, bumped whenever membership or the
//! subscribed topics change, and a **target assignment** computed by a
//! server-side assignor (`uniform` or `range`, see [`super::assignors`]) at
//! the **assignment epoch**. Each member converges to its target one
//! heartbeat at a time, as Kafka's `CurrentAssignmentBuilder` does:
//!
//! * partitions the member must give up are revoked first: they move to
//!   "pending revocation", the member keeps its epoch (state
//!   `UnrevokedPartitions`) until it heartbeats without them;
//! * a partition is only handed to its new owner once no other member holds
//!   it, assigned or pending revocation (state `UnreleasedPartitions` while
//!   some are still held elsewhere): the group revokes before it reassigns;
//! * then the member moves to the assignment epoch.
//!
//! Member epoch 0 joins (a new member id is generated in version 0 when the
//! client sends none; from version 1 the client supplies it, KIP-1082), -1
//! leaves, -2 is a static member leaving temporarily (it keeps its
//! partitions until its session expires or it rejoins with the same
//! instance id). A member that stops heartbeating for the session timeout,
//! or stays in `UnrevokedPartitions` longer than its rebalance timeout, is
//! fenced (removed) by [`ConsumerGroup::expire_members`].
//!
//! The coordinator persists every change of a group as Kafka's KIP-848
//! records (see `consumer_groups::change_records`) before it keeps it, and
//! rebuilds the group from them at start with the `replay_*` methods and
//! [`ConsumerGroup::finish_load`]: members, epochs, target and current
//! assignments come back, and session timers restart from the load time.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use kafka_protocol::error::ResponseError;
use thiserror::Error;

pub use super::assignors::{Assignment, Assignor, MemberSpec, TopicId};

/// `memberEpoch` of a join request.
pub const JOIN_GROUP_MEMBER_EPOCH: i32 = 0;
/// `memberEpoch` of a leave request.
pub const LEAVE_GROUP_MEMBER_EPOCH: i32 = -1;
/// `memberEpoch` of a static member leaving temporarily.
pub const LEAVE_GROUP_STATIC_MEMBER_EPOCH: i32 = -2;
/// From this ConsumerGroupHeartbeat version the client generates its member
/// id (KIP-1082), so an empty one is invalid.
pub const CONSUMER_GENERATED_MEMBER_ID_REQUIRED_VERSION: i16 = 1;
/// Members of a consumer group commit offsets with OffsetCommit v9+.
pub const MIN_OFFSET_COMMIT_VERSION: i16 = 9;
/// The protocol type ListGroups/DescribeGroups report for consumer groups.
pub const PROTOCOL_TYPE: &str = "consumer";
/// The group type ListGroups (v5+) reports.
pub const GROUP_TYPE: &str = "consumer";

/// Broker settings of the consumer group protocol.
#[derive(Clone, Debug)]
pub struct ConsumerGroupConfig {
    /// `group.consumer.session.timeout.ms`
    pub session_timeout_ms: i32,
    /// `group.consumer.heartbeat.interval.ms`
    pub heartbeat_interval_ms: i32,
    /// `group.consumer.max.size`
    pub max_size: usize,
    /// `group.consumer.assignors`: the first is the default.
    pub assignors: Vec<Assignor>,
}

impl Default for ConsumerGroupConfig {
    fn default() -> Self {
        ConsumerGroupConfig {
            session_timeout_ms: 45_000,
            heartbeat_interval_ms: 5_000,
            max_size: i32::MAX as usize,
            assignors: vec![Assignor::Uniform, Assignor::Range],
        }
    }
}

impl ConsumerGroupConfig {
    pub fn default_assignor(&self) -> Assignor {
        self.assignors.first().copied().unwrap_or(Assignor::Uniform)
    }
}

/// The topics the group can see: resolves subscribed names to ids and
/// partition counts, and ids back to names for DescribeGroup answers.
pub trait TopicsView {
    fn topic(&self, name: &str) -> Option<(TopicId, u32)>;
    fn topic_name(&self, id: TopicId) -> Option<String>;
}

impl TopicsView for tessera_metadata::MetadataImage {
    fn topic(&self, name: &str) -> Option<(TopicId, u32)> {
        self.topic_by_name(name).map(|t| (t.id, t.partitions))
    }
    fn topic_name(&self, id: TopicId) -> Option<String> {
        self.topics.get(&id).map(|t| t.name.clone())
    }
}

/// A plain name -> (id, partitions) table (tests, tools).
impl TopicsView for BTreeMap<String, (TopicId, u32)> {
    fn topic(&self, name: &str) -> Option<(TopicId, u32)> {
        self.get(name).copied()
    }
    fn topic_name(&self, id: TopicId) -> Option<String> {
        self.iter()
            .find(|(_, (t, _))| *t == id)
            .map(|(n, _)| n.clone())
    }
}

/// Why a request was refused, as Kafka's error codes.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ConsumerGroupError {
    #[error("{0}")]
    InvalidRequest(String),
    #[error("{0}")]
    UnsupportedAssignor(String),
    #[error("{0}")]
    FencedMemberEpoch(String),
    #[error("{0}")]
    StaleMemberEpoch(String),
    #[error("{0}")]
    UnknownMemberId(String),
    #[error("{0}")]
    UnreleasedInstanceId(String),
    #[error("{0}")]
    FencedInstanceId(String),
    #[error("{0}")]
    GroupMaxSizeReached(String),
    #[error("{0}")]
    GroupIdNotFound(String),
    #[error("{0}")]
    UnsupportedVersion(String),
}

impl ConsumerGroupError {
    pub fn kafka(&self) -> ResponseError {
        use ConsumerGroupError as E;
        use ResponseError as K;
        match self {
            E::InvalidRequest(_) => K::InvalidRequest,
            E::UnsupportedAssignor(_) => K::UnsupportedAssignor,
            E::FencedMemberEpoch(_) => K::FencedMemberEpoch,
            E::StaleMemberEpoch(_) => K::StaleMemberEpoch,
            E::UnknownMemberId(_) => K::UnknownMemberId,
            E::UnreleasedInstanceId(_) => K::UnreleasedInstanceId,
            E::FencedInstanceId(_) => K::FencedInstanceId,
            E::GroupMaxSizeReached(_) => K::GroupMaxSizeReached,
            E::GroupIdNotFound(_) => K::GroupIdNotFound,
            E::UnsupportedVersion(_) => K::UnsupportedVersion,
        }
    }

    pub fn code(&self) -> i16 {
        self.kafka().code()
    }
}

use ConsumerGroupError as Error;

/// One ConsumerGroupHeartbeat request, decoded (null fields are `None`,
/// "unchanged" sentinels as Kafka sends them: `rebalance_timeout_ms` -1).
#[derive(Clone, Debug, Default)]
pub struct HeartbeatInput {
    pub api_version: i16,
    pub group_id: String,
    pub member_id: String,
    pub member_epoch: i32,
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    pub rebalance_timeout_ms: i32,
    pub subscribed_topic_names: Option<Vec<String>>,
    pub subscribed_topic_regex: Option<String>,
    pub server_assignor: Option<String>,
    /// The partitions the member owns, `None` if unchanged since the last
    /// heartbeat.
    pub owned_partitions: Option<Vec<(TopicId, Vec<i32>)>>,
    pub client_id: String,
    pub client_host: String,
}

/// A successful answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeartbeatOutput {
    pub member_id: String,
    pub member_epoch: i32,
    pub heartbeat_interval_ms: i32,
    /// The member's assigned partitions, when the request was a full one or
    /// they changed.
    pub assignment: Option<Assignment>,
}

/// Where a member is in converging to its target assignment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemberState {
    Stable,
    UnrevokedPartitions,
    UnreleasedPartitions,
}

impl MemberState {
    pub fn as_str(self) -> &'static str {
        match self {
            MemberState::Stable => "stable",
            MemberState::UnrevokedPartitions => "unrevoked_partitions",
            MemberState::UnreleasedPartitions => "unreleased_partitions",
        }
    }
}

/// The group's state, as Kafka names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupState {
    Empty,
    Assigning,
    Reconciling,
    Stable,
}

impl GroupState {
    pub fn as_str(self) -> &'static str {
        match self {
            GroupState::Empty => "Empty",
            GroupState::Assigning => "Assigning",
            GroupState::Reconciling => "Reconciling",
            GroupState::Stable => "Stable",
        }
    }
}

/// One member of a consumer group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub member_epoch: i32,
    pub previous_member_epoch: i32,
    pub state: MemberState,
    pub rebalance_timeout_ms: i32,
    pub subscribed_topic_names: BTreeSet<String>,
    pub server_assignor: Option<Assignor>,
    /// Partitions the member may use.
    pub assigned: Assignment,
    /// Partitions the member must give up and still holds.
    pub pending_revocation: Assignment,
}

impl Member {
    fn new(member_id: &str) -> Member {
        Member {
            member_id: member_id.to_string(),
            instance_id: None,
            rack_id: None,
            client_id: String::new(),
            client_host: String::new(),
            member_epoch: 0,
            previous_member_epoch: 0,
            state: MemberState::Stable,
            rebalance_timeout_ms: -1,
            subscribed_topic_names: BTreeSet::new(),
            server_assignor: None,
            assigned: Assignment::new(),
            pending_revocation: Assignment::new(),
        }
    }

    pub fn is_reconciled_to(&self, epoch: i32) -> bool {
        self.member_epoch == epoch && self.state == MemberState::Stable
    }

    /// Kafka's `updateMemberEpoch`: the current epoch becomes the previous.
    fn update_epoch(&mut self, epoch: i32) {
        self.previous_member_epoch = self.member_epoch;
        self.member_epoch = epoch;
    }

    fn partitions(&self) -> impl Iterator<Item = (TopicId, i32)> + '_ {
        self.assigned
            .iter()
            .chain(self.pending_revocation.iter())
            .flat_map(|(t, ps)| ps.iter().map(move |p| (*t, *p)))
    }
}

/// A member as ConsumerGroupDescribe reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DescribedMember {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    pub member_epoch: i32,
    pub client_id: String,
    pub client_host: String,
    pub subscribed_topic_names: Vec<String>,
    /// `(topic id, topic name, partitions)`; topics no longer in the
    /// metadata are left out, as Kafka does.
    pub assignment: Vec<(TopicId, String, Vec<i32>)>,
    pub target_assignment: Vec<(TopicId, String, Vec<i32>)>,
}

/// A group as ConsumerGroupDescribe reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DescribedGroup {
    pub group_id: String,
    pub state: GroupState,
    pub group_epoch: i32,
    pub assignment_epoch: i32,
    pub assignor_name: String,
    pub members: Vec<DescribedMember>,
}

/// A member removed by [`ConsumerGroup::expire_members`], and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expired {
    pub member_id: String,
    pub reason: &'static str,
}

/// Kafka's `throwIfEmptyString`: present but blank.
fn blank(s: &Option<String>) -> bool {
    s.as_deref().is_some_and(|s| s.trim().is_empty())
}

/// Checks a heartbeat's fields (Kafka's
/// `throwIfConsumerGroupHeartbeatRequestIsInvalid`). Regular-expression
/// subscriptions are not supported: a non-empty regex is INVALID_REQUEST.
pub fn validate_heartbeat(req: &HeartbeatInput, config: &ConsumerGroupConfig) -> Result<(), Error> {
    let invalid = |m: &str| Err(Error::InvalidRequest(m.to_string()));
    if (req.api_version >= CONSUMER_GENERATED_MEMBER_ID_REQUIRED_VERSION
        || req.member_epoch > 0
        || req.member_epoch == LEAVE_GROUP_MEMBER_EPOCH)
        && req.member_id.trim().is_empty()
    {
        return invalid("MemberId can't be empty.");
    }
    if req.group_id.trim().is_empty() {
        return invalid("GroupId can't be empty.");
    }
    if blank(&req.instance_id) {
        return invalid("InstanceId can't be empty.");
    }
    if blank(&req.rack_id) {
        return invalid("RackId can't be empty.");
    }
    if req
        .subscribed_topic_regex
        .as_deref()
        .is_some_and(|r| !r.is_empty())
    {
        return invalid("SubscribedTopicRegex is not supported by this broker.");
    }
    if req.member_epoch == JOIN_GROUP_MEMBER_EPOCH {
        if req.rebalance_timeout_ms == -1 {
            return invalid("RebalanceTimeoutMs must be provided in first request.");
        }
        if req.owned_partitions.as_ref().is_none_or(|o| !o.is_empty()) {
            return invalid("TopicPartitions must be empty when (re-)joining.");
        }
        if req.subscribed_topic_names.is_none() && req.subscribed_topic_regex.is_none() {
            return invalid(
                "Either SubscribedTopicNames or SubscribedTopicRegex must be non-null when (re-)joining.",
            );
        }
    } else if req.member_epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH {
        if req.instance_id.is_none() {
            return invalid("InstanceId can't be null.");
        }
    } else if req.member_epoch < LEAVE_GROUP_STATIC_MEMBER_EPOCH {
        return invalid("MemberEpoch is invalid.");
    }
    if let Some(name) = &req.server_assignor {
        if !Assignor::from_name(name).is_some_and(|a| config.assignors.contains(&a)) {
            let names: Vec<&str> = config.assignors.iter().map(|a| a.name()).collect();
            return Err(Error::UnsupportedAssignor(format!(
                "ServerAssignor {name} is not supported. Supported assignors: {}.",
                names.join(", ")
            )));
        }
    }
    Ok(())
}

fn owned_is_subset(owned: Option<&[(TopicId, Vec<i32>)]>, target: &Assignment) -> bool {
    let Some(owned) = owned else { return false };
    owned.iter().all(|(t, ps)| match target.get(t) {
        Some(have) => ps.iter().all(|p| have.contains(p)),
        None => false,
    })
}

/// Does the member (by what it reported) still hold any of `revoking`?
/// Not reporting counts as still holding them.
fn owns_any(owned: Option<&[(TopicId, Vec<i32>)]>, revoking: &Assignment) -> bool {
    let Some(owned) = owned else { return true };
    owned.iter().any(|(t, ps)| {
        revoking
            .get(t)
            .is_some_and(|r| ps.iter().any(|p| r.contains(p)))
    })
}

/// Kafka's `throwIfConsumerGroupMemberEpochIsInvalid`.
fn check_member_epoch(
    member: &Member,
    received: i32,
    owned: Option<&[(TopicId, Vec<i32>)]>,
) -> Result<(), Error> {
    if received > member.member_epoch {
        return Err(Error::FencedMemberEpoch(format!(
            "The consumer group member has a greater member epoch ({received}) than the one known by \
             the group coordinator ({}). The member must abandon all its partitions and rejoin.",
            member.member_epoch
        )));
    }
    // The previous epoch is accepted with a subset of the current
    // assignment: the response that bumped the epoch may have been lost.
    if received < member.member_epoch
        && (received != member.previous_member_epoch || !owned_is_subset(owned, &member.assigned))
    {
        return Err(Error::FencedMemberEpoch(format!(
            "The consumer group member has a smaller member epoch ({received}) than the one known by \
             the group coordinator ({}). The member must abandon all its partitions and rejoin.",
            member.member_epoch
        )));
    }
    Ok(())
}

/// Kafka's `CurrentAssignmentBuilder.build`: the member's next state
/// towards `target` at `target_epoch`. `owner` tells who holds a partition
/// (assigned or pending revocation) right now.
pub fn reconcile(
    member: &Member,
    target_epoch: i32,
    target: &Assignment,
    owned: Option<&[(TopicId, Vec<i32>)]>,
    owner: &dyn Fn(TopicId, i32) -> Option<String>,
) -> Member {
    match member.state {
        MemberState::Stable if member.member_epoch == target_epoch => member.clone(),
        MemberState::UnrevokedPartitions if owns_any(owned, &member.pending_revocation) => {
            member.clone()
        }
        _ => next_assignment(member, target_epoch, target, owned, owner),
    }
}

fn next_assignment(
    member: &Member,
    target_epoch: i32,
    target: &Assignment,
    owned: Option<&[(TopicId, Vec<i32>)]>,
    owner: &dyn Fn(TopicId, i32) -> Option<String>,
) -> Member {
    let empty = BTreeSet::new();
    let topics: BTreeSet<TopicId> = target
        .keys()
        .chain(member.assigned.keys())
        .copied()
        .collect();
    let mut assigned = Assignment::new();
    let mut revoking = Assignment::new();
    let mut to_assign = Assignment::new();
    let mut unreleased = false;
    for t in topics {
        let want = target.get(&t).unwrap_or(&empty);
        let have = member.assigned.get(&t).unwrap_or(&empty);
        // Assigned = have ∩ want; revoking = have - want;
        // to assign = want - have, minus partitions someone else still holds.
        let keep: BTreeSet<i32> = have.intersection(want).copied().collect();
        let give_up: BTreeSet<i32> = have.difference(want).copied().collect();
        let mut take = BTreeSet::new();
        for &p in want.difference(have) {
            let held_elsewhere = owner(t, p).is_some_and(|o| o != member.member_id)
                && !member
                    .pending_revocation
                    .get(&t)
                    .is_some_and(|r| r.contains(&p));
            if held_elsewhere {
                unreleased = true;
            } else {
                take.insert(p);
            }
        }
        if !keep.is_empty() {
            assigned.insert(t, keep);
        }
        if !give_up.is_empty() {
            revoking.insert(t, give_up);
        }
        if !take.is_empty() {
            to_assign.insert(t, take);
        }
    }
    let mut next = member.clone();
    if !revoking.is_empty() && owns_any(owned, &revoking) {
        // Revoke first: the member keeps its epoch until it acknowledges.
        next.state = MemberState::UnrevokedPartitions;
        next.update_epoch(member.member_epoch);
        next.assigned = assigned;
        next.pending_revocation = revoking;
        return next;
    }
    for (t, ps) in to_assign {
        assigned.entry(t).or_default().extend(ps);
    }
    next.state = if unreleased {
        MemberState::UnreleasedPartitions
    } else {
        MemberState::Stable
    };
    next.update_epoch(target_epoch);
    next.assigned = assigned;
    next.pending_revocation = Assignment::new();
    next
}

/// Per-member timers, in the caller's clock (ms).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Timers {
    session_deadline: i64,
    /// `(deadline, epoch)`: fence if still at `epoch` (revoking) by then.
    rebalance: Option<(i64, i32)>,
}

/// One KIP-848 consumer group.
#[derive(Clone, Debug)]
pub struct ConsumerGroup {
    group_id: String,
    config: ConsumerGroupConfig,
    group_epoch: i32,
    assignment_epoch: i32,
    members: BTreeMap<String, Member>,
    /// instance id -> member id
    static_members: HashMap<String, String>,
    target: BTreeMap<String, Assignment>,
    /// Who holds each partition (assigned or pending revocation).
    owners: HashMap<(TopicId, i32), String>,
    /// The subscribed topics that exist: name -> (id, partitions).
    subscription_metadata: BTreeMap<String, (TopicId, u32)>,
    timers: HashMap<String, Timers>,
}

impl ConsumerGroup {
    pub fn new(group_id: impl Into<String>, config: ConsumerGroupConfig) -> ConsumerGroup {
        ConsumerGroup {
            group_id: group_id.into(),
            config,
            group_epoch: 0,
            assignment_epoch: 0,
            members: BTreeMap::new(),
            static_members: HashMap::new(),
            target: BTreeMap::new(),
            owners: HashMap::new(),
            subscription_metadata: BTreeMap::new(),
            timers: HashMap::new(),
        }
    }

    pub fn group_id(&self) -> &str {
        &self.group_id
    }
    pub fn config(&self) -> &ConsumerGroupConfig {
        &self.config
    }
    pub fn group_epoch(&self) -> i32 {
        self.group_epoch
    }
    pub fn assignment_epoch(&self) -> i32 {
        self.assignment_epoch
    }
    pub fn members(&self) -> impl Iterator<Item = &Member> {
        self.members.values()
    }
    pub fn member(&self, member_id: &str) -> Option<&Member> {
        self.members.get(member_id)
    }
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }
    pub fn target_assignment(&self, member_id: &str) -> Option<&Assignment> {
        self.target.get(member_id)
    }
    /// Every member's target assignment.
    pub fn targets(&self) -> impl Iterator<Item = (&String, &Assignment)> {
        self.target.iter()
    }

    // ---- replay: rebuilding the group from its records ---------------------

    pub fn replay_group_epoch(&mut self, epoch: i32) {
        self.group_epoch = epoch;
    }

    pub fn replay_assignment_epoch(&mut self, epoch: i32) {
        self.assignment_epoch = epoch;
    }

    /// A member's target assignment (`None`: removed).
    pub fn replay_target(&mut self, member_id: &str, target: Option<Assignment>) {
        match target {
            Some(t) => {
                self.target.insert(member_id.to_string(), t);
            }
            None => {
                self.target.remove(member_id);
            }
        }
    }

    /// The member to update from a record, created when `create`. The
    /// indexes are rebuilt by [`ConsumerGroup::finish_load`].
    pub fn replay_member(&mut self, member_id: &str, create: bool) -> Option<&mut Member> {
        if create && !self.members.contains_key(member_id) {
            self.members
                .insert(member_id.to_string(), Member::new(member_id));
        }
        self.members.get_mut(member_id)
    }

    pub fn replay_remove_member(&mut self, member_id: &str) {
        self.members.remove(member_id);
    }

    /// Ends a load: rebuilds the owners and static member indexes and the
    /// subscribed topics' metadata (from `topics`, as Kafka derives it), and
    /// starts every member's session timer (and the rebalance timer of
    /// members still revoking) at `now_ms`.
    pub fn finish_load(&mut self, topics: &dyn TopicsView, now_ms: i64) {
        self.owners.clear();
        self.static_members.clear();
        self.timers.clear();
        for m in self.members.values() {
            for tp in m.partitions() {
                self.owners.insert(tp, m.member_id.clone());
            }
            if let Some(i) = &m.instance_id {
                self.static_members.insert(i.clone(), m.member_id.clone());
            }
            let rebalance = (m.state == MemberState::UnrevokedPartitions).then(|| {
                (
                    now_ms + m.rebalance_timeout_ms.max(0) as i64,
                    m.member_epoch,
                )
            });
            self.timers.insert(
                m.member_id.clone(),
                Timers {
                    session_deadline: now_ms + self.config.session_timeout_ms as i64,
                    rebalance,
                },
            );
        }
        let names: BTreeSet<&String> = self
            .members
            .values()
            .flat_map(|m| m.subscribed_topic_names.iter())
            .collect();
        self.subscription_metadata = names
            .into_iter()
            .filter_map(|n| topics.topic(n).map(|t| (n.clone(), t)))
            .collect();
    }

    /// Who holds `(topic, partition)` now (assigned or pending revocation).
    pub fn owner(&self, topic: TopicId, partition: i32) -> Option<&str> {
        self.owners.get(&(topic, partition)).map(String::as_str)
    }

    /// Kafka's consumer group state.
    pub fn state(&self) -> GroupState {
        if self.members.is_empty() {
            GroupState::Empty
        } else if self.group_epoch > self.assignment_epoch {
            GroupState::Assigning
        } else if self
            .members
            .values()
            .any(|m| !m.is_reconciled_to(self.assignment_epoch))
        {
            GroupState::Reconciling
        } else {
            GroupState::Stable
        }
    }

    /// The assignor most members asked for, else the default.
    fn preferred_assignor(&self, members: &[&Member]) -> Assignor {
        let mut counts: BTreeMap<Assignor, usize> = BTreeMap::new();
        for m in members {
            if let Some(a) = m.server_assignor {
                *counts.entry(a).or_default() += 1;
            }
        }
        let rank = |a: &Assignor| {
            self.config
                .assignors
                .iter()
                .position(|x| x == a)
                .unwrap_or(usize::MAX)
        };
        counts
            .into_iter()
            .max_by(|(a, ca), (b, cb)| ca.cmp(cb).then_with(|| rank(b).cmp(&rank(a))))
            .map(|(a, _)| a)
            .unwrap_or_else(|| self.config.default_assignor())
    }

    /// The assignor the group uses now (ConsumerGroupDescribe).
    pub fn assignor(&self) -> Assignor {
        let members: Vec<&Member> = self.members.values().collect();
        self.preferred_assignor(&members)
    }

    /// Handles one heartbeat (join, regular heartbeat or leave).
    pub fn heartbeat(
        &mut self,
        req: &HeartbeatInput,
        topics: &dyn TopicsView,
        now_ms: i64,
    ) -> Result<HeartbeatOutput, Error> {
        validate_heartbeat(req, &self.config)?;
        if req.member_epoch == LEAVE_GROUP_MEMBER_EPOCH
            || req.member_epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH
        {
            return self.leave(req);
        }
        let join = req.member_epoch == JOIN_GROUP_MEMBER_EPOCH;
        let owned = req.owned_partitions.as_deref();
        if self.members.len() >= self.config.max_size
            && (req.member_id.is_empty() || !self.members.contains_key(&req.member_id))
        {
            return Err(Error::GroupMaxSizeReached(format!(
                "The consumer group has reached its maximum capacity of {} members.",
                self.config.max_size
            )));
        }
        let member_id = if req.member_id.is_empty() {
            tessera_server_common::ids::kafka_style_uuid(uuid::Uuid::new_v4())
        } else {
            req.member_id.clone()
        };

        // The member as it is now (a fresh one when joining), and the static
        // member it replaces, if any.
        let mut replaced: Option<String> = None;
        let member = match &req.instance_id {
            None => match self.members.get(&member_id) {
                Some(m) => {
                    check_member_epoch(m, req.member_epoch, owned)?;
                    m.clone()
                }
                None if join => Member::new(&member_id),
                None => {
                    return Err(Error::UnknownMemberId(format!(
                        "Member {member_id} is not a member of group {}.",
                        self.group_id
                    )))
                }
            },
            Some(instance) => {
                let existing = self
                    .static_members
                    .get(instance)
                    .and_then(|id| self.members.get(id));
                match existing {
                    None if join => self
                        .members
                        .get(&member_id)
                        .cloned()
                        .unwrap_or_else(|| Member::new(&member_id)),
                    None => {
                        return Err(Error::UnknownMemberId(format!(
                            "Instance id {instance} is unknown."
                        )))
                    }
                    Some(old) if join => {
                        if old.member_epoch != LEAVE_GROUP_STATIC_MEMBER_EPOCH {
                            return Err(Error::UnreleasedInstanceId(format!(
                                "Static member {member_id} with instance id {instance} cannot join \
                                 the group because the instance id is owned by {} member.",
                                old.member_id
                            )));
                        }
                        // The new incarnation takes over the old one's
                        // partitions and target under its new member id.
                        let mut m = old.clone();
                        m.member_id = member_id.clone();
                        m.member_epoch = 0;
                        m.previous_member_epoch = 0;
                        replaced = Some(old.member_id.clone());
                        m
                    }
                    Some(old) => {
                        if old.member_id != member_id {
                            return Err(Error::FencedInstanceId(format!(
                                "Static member {member_id} with instance id {instance} was fenced by \
                                 member {}.",
                                old.member_id
                            )));
                        }
                        check_member_epoch(old, req.member_epoch, owned)?;
                        old.clone()
                    }
                }
            }
        };

        // 1. Update the member's fields; bump the group epoch when the
        // subscriptions or the subscribed topics' metadata change.
        let mut updated = member.clone();
        if let Some(i) = &req.instance_id {
            updated.instance_id = Some(i.clone());
        }
        if let Some(r) = &req.rack_id {
            updated.rack_id = Some(r.clone());
        }
        if req.rebalance_timeout_ms != -1 {
            updated.rebalance_timeout_ms = req.rebalance_timeout_ms;
        }
        if let Some(a) = &req.server_assignor {
            updated.server_assignor = Assignor::from_name(a);
        }
        if let Some(names) = &req.subscribed_topic_names {
            updated.subscribed_topic_names = names.iter().cloned().collect();
        }
        updated.client_id = req.client_id.clone();
        updated.client_host = req.client_host.clone();

        let mut bump = self.group_epoch == 0;
        bump |= updated.subscribed_topic_names != member.subscribed_topic_names;
        let metadata = {
            let names: BTreeSet<&String> = self
                .members
                .values()
                .filter(|m| {
                    m.member_id != updated.member_id && Some(&m.member_id) != replaced.as_ref()
                })
                .flat_map(|m| m.subscribed_topic_names.iter())
                .chain(updated.subscribed_topic_names.iter())
                .collect();
            names
                .into_iter()
                .filter_map(|n| topics.topic(n).map(|t| (n.clone(), t)))
                .collect::<BTreeMap<_, _>>()
        };
        bump |= metadata != self.subscription_metadata;
        if bump {
            self.group_epoch += 1;
            self.subscription_metadata = metadata;
        }

        // A replacing static member inherits the old one's target.
        if let Some(old) = &replaced {
            if let Some(t) = self.target.remove(old) {
                self.target.insert(updated.member_id.clone(), t);
            }
        }

        // 2. A new target assignment when the group epoch moved past it.
        if self.group_epoch > self.assignment_epoch {
            self.compute_target(Some(&updated), replaced.as_deref());
            self.assignment_epoch = self.group_epoch;
        }

        // 3. Reconcile the member towards its target.
        let target = self
            .target
            .get(&updated.member_id)
            .cloned()
            .unwrap_or_default();
        let before = updated.clone();
        if !updated.is_reconciled_to(self.assignment_epoch) {
            let owners = &self.owners;
            let owner = |t: TopicId, p: i32| owners.get(&(t, p)).cloned();
            updated = reconcile(&updated, self.assignment_epoch, &target, owned, &owner);
        }

        // Commit the member.
        let mut timers = replaced
            .as_ref()
            .and_then(|old| self.timers.get(old).copied())
            .or_else(|| self.timers.get(&updated.member_id).copied())
            .unwrap_or(Timers {
                session_deadline: 0,
                rebalance: None,
            });
        if let Some(old) = &replaced {
            if *old != updated.member_id {
                self.remove_member(old);
            }
        }
        if updated != before {
            timers.rebalance = if updated.state == MemberState::UnrevokedPartitions {
                Some((
                    now_ms + updated.rebalance_timeout_ms.max(0) as i64,
                    updated.member_epoch,
                ))
            } else {
                None
            };
        }
        timers.session_deadline = now_ms + self.config.session_timeout_ms as i64;
        self.timers.insert(updated.member_id.clone(), timers);
        self.put_member(updated.clone());

        let full = join
            || (req.rebalance_timeout_ms != -1
                && req.subscribed_topic_names.is_some()
                && req.owned_partitions.is_some());
        let assignment =
            (full || updated.assigned != member.assigned).then(|| updated.assigned.clone());
        Ok(HeartbeatOutput {
            member_id: updated.member_id,
            member_epoch: updated.member_epoch,
            heartbeat_interval_ms: self.config.heartbeat_interval_ms,
            assignment,
        })
    }

    fn leave(&mut self, req: &HeartbeatInput) -> Result<HeartbeatOutput, Error> {
        let out = |member_id: &str, epoch: i32| HeartbeatOutput {
            member_id: member_id.to_string(),
            member_epoch: epoch,
            heartbeat_interval_ms: 0,
            assignment: None,
        };
        match &req.instance_id {
            None => {
                if !self.members.contains_key(&req.member_id) {
                    return Err(Error::UnknownMemberId(format!(
                        "Member {} is not a member of group {}.",
                        req.member_id, self.group_id
                    )));
                }
                self.fence(&req.member_id);
                Ok(out(&req.member_id, req.member_epoch))
            }
            Some(instance) => {
                let member = self
                    .static_members
                    .get(instance)
                    .and_then(|id| self.members.get(id))
                    .cloned()
                    .ok_or_else(|| {
                        Error::UnknownMemberId(format!("Instance id {instance} is unknown."))
                    })?;
                if member.member_id != req.member_id {
                    return Err(Error::FencedInstanceId(format!(
                        "Static member {} with instance id {instance} was fenced by member {}.",
                        req.member_id, member.member_id
                    )));
                }
                if req.member_epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH {
                    // Gone for now: keeps its assigned partitions until its
                    // session expires or it rejoins.
                    let mut m = member;
                    m.member_epoch = LEAVE_GROUP_STATIC_MEMBER_EPOCH;
                    m.pending_revocation = Assignment::new();
                    let id = m.member_id.clone();
                    self.put_member(m);
                    if let Some(t) = self.timers.get_mut(&id) {
                        t.rebalance = None;
                    }
                    Ok(out(&id, LEAVE_GROUP_STATIC_MEMBER_EPOCH))
                } else {
                    self.fence(&member.member_id);
                    Ok(out(&req.member_id, req.member_epoch))
                }
            }
        }
    }

    /// Computes the target assignment of every member, with `updated`
    /// replacing (or joining as) its member and `removed` left out.
    fn compute_target(&mut self, updated: Option<&Member>, removed: Option<&str>) {
        let mut members: Vec<&Member> = self
            .members
            .values()
            .filter(|m| Some(m.member_id.as_str()) != removed)
            .filter(|m| updated.is_none_or(|u| u.member_id != m.member_id))
            .collect();
        if let Some(u) = updated {
            members.push(u);
        }
        let assignor = self.preferred_assignor(&members);
        let partitions: BTreeMap<TopicId, u32> =
            self.subscription_metadata.values().copied().collect();
        let empty = Assignment::new();
        let specs: Vec<MemberSpec<'_>> = members
            .iter()
            .map(|m| MemberSpec {
                member_id: &m.member_id,
                instance_id: m.instance_id.as_deref(),
                subscribed: m
                    .subscribed_topic_names
                    .iter()
                    .filter_map(|n| self.subscription_metadata.get(n).map(|(id, _)| *id))
                    .collect(),
                current: self.target.get(&m.member_id).unwrap_or(&empty),
            })
            .collect();
        let target = assignor.assign(&specs, &partitions);
        self.target = target;
    }

    /// Stores a member, keeping the owners and static member indexes.
    fn put_member(&mut self, member: Member) {
        if let Some(old) = self.members.get(&member.member_id) {
            let gone: Vec<(TopicId, i32)> = old.partitions().collect();
            for tp in gone {
                if self.owners.get(&tp) == Some(&member.member_id) {
                    self.owners.remove(&tp);
                }
            }
        }
        for tp in member.partitions() {
            let previous = self.owners.insert(tp, member.member_id.clone());
            debug_assert!(
                previous.is_none() || previous.as_deref() == Some(member.member_id.as_str()),
                "partition {tp:?} of {} still held by {previous:?}",
                member.member_id
            );
        }
        if let Some(i) = &member.instance_id {
            self.static_members
                .insert(i.clone(), member.member_id.clone());
        }
        self.members.insert(member.member_id.clone(), member);
    }

    /// Drops a member and what it holds (no epoch bump).
    fn remove_member(&mut self, member_id: &str) {
        let Some(old) = self.members.remove(member_id) else {
            return;
        };
        for tp in old.partitions() {
            if self.owners.get(&tp).map(String::as_str) == Some(member_id) {
                self.owners.remove(&tp);
            }
        }
        if let Some(i) = &old.instance_id {
            if self.static_members.get(i).map(String::as_str) == Some(member_id) {
                self.static_members.remove(i);
            }
        }
        self.timers.remove(member_id);
    }

    /// Removes a member (leave, session or rebalance timeout) and bumps the
    /// group epoch so the others get a new target assignment.
    fn fence(&mut self, member_id: &str) {
        self.remove_member(member_id);
        self.target.remove(member_id);
        let still: BTreeSet<&String> = self
            .members
            .values()
            .flat_map(|m| m.subscribed_topic_names.iter())
            .collect();
        self.subscription_metadata.retain(|n, _| still.contains(n));
        self.group_epoch += 1;
    }

    /// Fences members whose session expired, and members still revoking at
    /// the same epoch when their rebalance timeout passed.
    pub fn expire_members(&mut self, now_ms: i64) -> Vec<Expired> {
        let mut out = Vec::new();
        let due: Vec<(String, &'static str)> = self
            .timers
            .iter()
            .filter_map(|(id, t)| {
                let member = self.members.get(id)?;
                if now_ms >= t.session_deadline {
                    Some((id.clone(), "the member session expired"))
                } else if t
                    .rebalance
                    .is_some_and(|(d, e)| now_ms >= d && member.member_epoch == e)
                {
                    Some((
                        id.clone(),
                        "it failed to revoke its partitions within the rebalance timeout",
                    ))
                } else {
                    None
                }
            })
            .collect();
        for (id, reason) in due {
            self.fence(&id);
            out.push(Expired {
                member_id: id,
                reason,
            });
        }
        out.sort_by(|a, b| a.member_id.cmp(&b.member_id));
        out
    }

    /// The earliest time a member may expire (for the caller's timer).
    pub fn next_deadline(&self) -> Option<i64> {
        self.timers
            .values()
            .flat_map(|t| std::iter::once(t.session_deadline).chain(t.rebalance.map(|(d, _)| d)))
            .min()
    }

    /// Kafka's `ConsumerGroup.validateOffsetCommit` for OffsetCommit: an
    /// empty group takes commits from anyone with epoch -1 (admin clients,
    /// manual assignment); otherwise the member must exist, use v9+, and
    /// send its current epoch.
    pub fn validate_offset_commit(
        &self,
        member_id: &str,
        member_epoch: i32,
        api_version: i16,
    ) -> Result<(), Error> {
        if member_epoch < 0 && self.members.is_empty() {
            return Ok(());
        }
        let member = self.members.get(member_id).ok_or_else(|| {
            Error::UnknownMemberId(format!(
                "Member {member_id} is not a member of group {}.",
                self.group_id
            ))
        })?;
        if api_version < MIN_OFFSET_COMMIT_VERSION {
            return Err(Error::UnsupportedVersion(
                "OffsetCommit version 9 or above must be used by members using the modern group protocol"
                    .into(),
            ));
        }
        Self::check_commit_epoch(member, member_epoch)
    }

    /// The TxnOffsetCommit variant: no version rule.
    pub fn validate_txn_offset_commit(
        &self,
        member_id: &str,
        member_epoch: i32,
    ) -> Result<(), Error> {
        if member_epoch < 0 && self.members.is_empty() {
            return Ok(());
        }
        let member = self.members.get(member_id).ok_or_else(|| {
            Error::UnknownMemberId(format!(
                "Member {member_id} is not a member of group {}.",
                self.group_id
            ))
        })?;
        Self::check_commit_epoch(member, member_epoch)
    }

    /// OffsetFetch v9+: a request without member id and epoch -1 is
    /// accepted; otherwise the member must exist at that epoch.
    pub fn validate_offset_fetch(
        &self,
        member_id: Option<&str>,
        member_epoch: i32,
    ) -> Result<(), Error> {
        let Some(member_id) = member_id else {
            if member_epoch < 0 {
                return Ok(());
            }
            return Err(Error::UnknownMemberId(format!(
                "No member id given for member epoch {member_epoch}."
            )));
        };
        let member = self.members.get(member_id).ok_or_else(|| {
            Error::UnknownMemberId(format!(
                "Member {member_id} is not a member of group {}.",
                self.group_id
            ))
        })?;
        Self::check_commit_epoch(member, member_epoch)
    }

    fn check_commit_epoch(member: &Member, received: i32) -> Result<(), Error> {
        if received != member.member_epoch {
            return Err(Error::StaleMemberEpoch(format!(
                "The received member epoch {received} does not match the expected member epoch {}.",
                member.member_epoch
            )));
        }
        Ok(())
    }

    /// ConsumerGroupDescribe's view of the group.
    pub fn describe(&self, topics: &dyn TopicsView) -> DescribedGroup {
        let named = |a: &Assignment| -> Vec<(TopicId, String, Vec<i32>)> {
            a.iter()
                .filter_map(|(t, ps)| {
                    topics
                        .topic_name(*t)
                        .map(|n| (*t, n, ps.iter().copied().collect()))
                })
                .collect()
        };
        let empty = Assignment::new();
        DescribedGroup {
            group_id: self.group_id.clone(),
            state: self.state(),
            group_epoch: self.group_epoch,
            assignment_epoch: self.assignment_epoch,
            assignor_name: self.assignor().name().to_string(),
            members: self
                .members
                .values()
                .map(|m| DescribedMember {
                    member_id: m.member_id.clone(),
                    instance_id: m.instance_id.clone(),
                    rack_id: m.rack_id.clone(),
                    member_epoch: m.member_epoch,
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    subscribed_topic_names: m.subscribed_topic_names.iter().cloned().collect(),
                    assignment: named(&m.assigned),
                    target_assignment: named(self.target.get(&m.member_id).unwrap_or(&empty)),
                })
                .collect(),
        }
    }

    /// Checks the internal indexes against the members (tests).
    #[cfg(test)]
    fn check_invariants(&self) {
        let mut held: HashMap<(TopicId, i32), &str> = HashMap::new();
        for m in self.members.values() {
            for tp in m.partitions() {
                if let Some(other) = held.insert(tp, &m.member_id) {
                    panic!("{tp:?} held by {other} and {}", m.member_id);
                }
            }
        }
        let owners: HashMap<(TopicId, i32), &str> =
            self.owners.iter().map(|(k, v)| (*k, v.as_str())).collect();
        assert_eq!(owners, held, "owners index out of date");
        for (i, id) in &self.static_members {
            assert_eq!(self.members[id].instance_id.as_deref(), Some(i.as_str()));
        }
        assert!(self.assignment_epoch <= self.group_epoch);
        for m in self.members.values() {
            assert!(self.timers.contains_key(&m.member_id));
            assert!(m.assigned.values().all(|s| !s.is_empty()));
            assert!(m.pending_revocation.values().all(|s| !s.is_empty()));
            if m.state != MemberState::UnrevokedPartitions {
                assert!(m.pending_revocation.is_empty(), "{m:?}");
            }
        }
    }
}

#[cfg(test)]
mod tests;
