//! The classic group protocol (JoinGroup / SyncGroup / Heartbeat /
//! LeaveGroup) as a pure state machine, following Kafka's `ClassicGroup` and
//! its group metadata manager.
//!
//! Inputs are requests and clock ticks, each with `now` (milliseconds);
//! outputs are [`Effects`]: replies to parked JoinGroup / SyncGroup requests
//! (identified by [`WaiterId`]s the caller hands in) and whether the group's
//! state must be persisted. The machine holds no channels, timers or I/O, so
//! the caller can run a transition on a clone, persist, and only then keep it.
//!
//! States: Empty → PreparingRebalance → CompletingRebalance → Stable, and Dead
//! (deleted). A rebalance parks every member's JoinGroup until all members
//! rejoined or the rebalance timeout passed (the first rebalance of an empty
//! group waits `group.initial.rebalance.delay.ms`, extended by further joins
//! up to the rebalance timeout); the leader gets every member's metadata, and
//! its SyncGroup assignment is handed to every member's parked SyncGroup.

use std::collections::{BTreeSet, HashMap, HashSet};

use bytes::Bytes;
use indexmap::IndexMap;

use crate::error::ApiError;
use crate::groups::records::{GroupMetadataValue, MemberMetadataValue};

/// Identifies a parked request; the caller maps it to its response channel.
pub type WaiterId = u64;

/// Kafka's `ConsumerProtocol.PROTOCOL_TYPE`.
pub const CONSUMER_PROTOCOL_TYPE: &str = "consumer";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClassicState {
    Empty,
    PreparingRebalance,
    CompletingRebalance,
    Stable,
    Dead,
}

impl ClassicState {
    /// Kafka's state names, as DescribeGroups and ListGroups report them.
    pub fn name(self) -> &'static str {
        match self {
            ClassicState::Empty => "Empty",
            ClassicState::PreparingRebalance => "PreparingRebalance",
            ClassicState::CompletingRebalance => "CompletingRebalance",
            ClassicState::Stable => "Stable",
            ClassicState::Dead => "Dead",
        }
    }
}

#[derive(Clone, Debug)]
pub struct ClassicConfig {
    /// `group.initial.rebalance.delay.ms`
    pub initial_rebalance_delay_ms: i64,
    /// Kafka's fixed 5 minutes after which a new member's parked JoinGroup expires.
    pub new_member_join_timeout_ms: i64,
    /// `group.max.size`
    pub max_size: usize,
    /// `group.min.session.timeout.ms` / `group.max.session.timeout.ms`
    pub min_session_timeout_ms: i32,
    pub max_session_timeout_ms: i32,
}

impl Default for ClassicConfig {
    fn default() -> Self {
        ClassicConfig {
            initial_rebalance_delay_ms: 3000,
            new_member_join_timeout_ms: 300_000,
            max_size: i32::MAX as usize,
            min_session_timeout_ms: 6000,
            max_session_timeout_ms: 1_800_000,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Protocol {
    pub name: String,
    pub metadata: Bytes,
}

#[derive(Clone, Debug)]
pub struct Member {
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub rebalance_timeout_ms: i32,
    pub session_timeout_ms: i32,
    pub protocol_type: String,
    pub protocols: Vec<Protocol>,
    pub assignment: Bytes,
    join_waiter: Option<WaiterId>,
    sync_waiter: Option<WaiterId>,
    /// Joined but not yet through a completed join phase: its parked
    /// JoinGroup does not keep it alive past the new-member timeout.
    is_new: bool,
    heartbeat_deadline: i64,
}

impl Member {
    pub fn metadata(&self, protocol: &str) -> Bytes {
        self.protocols
            .iter()
            .find(|p| p.name == protocol)
            .map(|p| p.metadata.clone())
            .unwrap_or_default()
    }

    fn supports(&self, protocol: &str) -> bool {
        self.protocols.iter().any(|p| p.name == protocol)
    }

    fn matches(&self, protocols: &[Protocol]) -> bool {
        self.protocols == protocols
    }

    /// Kafka's `hasSatisfiedHeartbeat`: a member parked in a rebalance is alive.
    fn satisfied_heartbeat(&self) -> bool {
        !self.is_new && (self.join_waiter.is_some() || self.sync_waiter.is_some())
    }

    pub fn is_awaiting_join(&self) -> bool {
        self.join_waiter.is_some()
    }
}

/// A JoinGroup, already decoded.
#[derive(Clone, Debug)]
pub struct JoinRequest {
    /// Empty for a member that has no id yet.
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout_ms: i32,
    pub rebalance_timeout_ms: i32,
    pub protocol_type: String,
    pub protocols: Vec<Protocol>,
    /// KIP-394 (v4+): a dynamic member without an id gets MEMBER_ID_REQUIRED.
    pub requires_known_member_id: bool,
    /// KIP-814 (v9+): the rejoining static leader may skip the assignment.
    pub supports_skip_assignment: bool,
    /// The id a new member gets (`<instance id or client id>-<uuid>`), made by the caller.
    pub new_member_id: String,
}

#[derive(Clone, Debug)]
pub struct JoinedMember {
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub metadata: Bytes,
}

#[derive(Clone, Debug)]
pub struct JoinResult {
    pub error: Option<ApiError>,
    pub member_id: String,
    pub generation_id: i32,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub leader: String,
    pub skip_assignment: bool,
    pub members: Vec<JoinedMember>,
}

impl JoinResult {
    pub fn error(member_id: impl Into<String>, error: ApiError) -> Self {
        JoinResult {
            error: Some(error),
            member_id: member_id.into(),
            generation_id: -1,
            protocol_type: None,
            protocol_name: None,
            leader: String::new(),
            skip_assignment: false,
            members: vec![],
        }
    }

    pub fn code(&self) -> i16 {
        self.error.as_ref().map_or(0, ApiError::code)
    }
}

/// A SyncGroup, already decoded.
#[derive(Clone, Debug)]
pub struct SyncRequest {
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub generation_id: i32,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub assignments: Vec<(String, Bytes)>,
}

#[derive(Clone, Debug)]
pub struct SyncResult {
    pub error: Option<ApiError>,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub assignment: Bytes,
}

impl SyncResult {
    pub fn error(error: ApiError) -> Self {
        SyncResult {
            error: Some(error),
            protocol_type: None,
            protocol_name: None,
            assignment: Bytes::new(),
        }
    }

    pub fn code(&self) -> i16 {
        self.error.as_ref().map_or(0, ApiError::code)
    }
}

#[derive(Clone, Debug)]
pub enum Reply {
    Join(WaiterId, JoinResult),
    Sync(WaiterId, SyncResult),
}

/// What a transition asks of its caller.
#[derive(Debug, Default)]
pub struct Effects {
    /// Responses for parked (or just arrived) JoinGroup / SyncGroup requests.
    pub replies: Vec<Reply>,
    /// The group's state (`to_record`) must be persisted before the
    /// transition is kept and the replies are sent.
    pub store: bool,
}

impl Effects {
    fn join(&mut self, waiter: WaiterId, result: JoinResult) {
        self.replies.push(Reply::Join(waiter, result));
    }

    fn sync(&mut self, waiter: WaiterId, result: SyncResult) {
        self.replies.push(Reply::Sync(waiter, result));
    }
}

#[derive(Clone, Debug)]
enum JoinTimer {
    /// Kafka's InitialDelayedJoin: the first rebalance of an empty group.
    Initial {
        deadline: i64,
        delay: i64,
        remaining: i64,
    },
    /// Kafka's DelayedJoin: the rebalance timeout.
    Normal { deadline: i64 },
}

impl JoinTimer {
    fn deadline(&self) -> i64 {
        match self {
            JoinTimer::Initial { deadline, .. } | JoinTimer::Normal { deadline } => *deadline,
        }
    }
}

/// A member as DescribeGroups reports it.
#[derive(Clone, Debug)]
pub struct DescribedMember {
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub metadata: Bytes,
    pub assignment: Bytes,
}

#[derive(Clone, Debug)]
pub struct ClassicGroup {
    group_id: String,
    config: ClassicConfig,
    state: ClassicState,
    previous_state: ClassicState,
    /// Wall-clock milliseconds of the last state change (-1 unknown).
    state_timestamp: i64,
    generation_id: i32,
    protocol_type: Option<String>,
    protocol_name: Option<String>,
    leader_id: Option<String>,
    /// In join order (the next leader is the first one left).
    members: IndexMap<String, Member>,
    /// group.instance.id -> member id
    static_members: HashMap<String, String>,
    /// Members that got MEMBER_ID_REQUIRED and have until the deadline to rejoin.
    pending_join: IndexMap<String, i64>,
    /// Members that have not sent SyncGroup in this generation yet.
    pending_sync: HashSet<String>,
    new_member_added: bool,
    join_timer: Option<JoinTimer>,
    /// (deadline, generation) by which every member must have synced.
    sync_timer: Option<(i64, i32)>,
    subscribed_topics: Option<BTreeSet<String>>,
}

impl ClassicGroup {
    pub fn new(group_id: impl Into<String>, config: ClassicConfig, now: i64) -> Self {
        ClassicGroup {
            group_id: group_id.into(),
            config,
            state: ClassicState::Empty,
            previous_state: ClassicState::Empty,
            state_timestamp: now,
            generation_id: 0,
            protocol_type: None,
            protocol_name: None,
            leader_id: None,
            members: IndexMap::new(),
            static_members: HashMap::new(),
            pending_join: IndexMap::new(),
            pending_sync: HashSet::new(),
            new_member_added: false,
            join_timer: None,
            sync_timer: None,
            subscribed_topics: None,
        }
    }

    /// Rebuilds a group from its persisted record, as Kafka loads a
    /// coordinator partition: with members it is Stable (their sessions
    /// start now), without it is Empty.
    pub fn from_record(
        group_id: impl Into<String>,
        config: ClassicConfig,
        value: &GroupMetadataValue,
        now: i64,
    ) -> Self {
        let mut group = ClassicGroup::new(group_id, config, now);
        group.generation_id = value.generation;
        group.protocol_type =
            (!value.protocol_type.is_empty()).then(|| value.protocol_type.clone());
        group.protocol_name = value.protocol.clone();
        group.state_timestamp = value.current_state_timestamp;
        if let Some(protocol) = &value.protocol {
            for m in &value.members {
                let member = Member {
                    member_id: m.member_id.clone(),
                    group_instance_id: m.group_instance_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    rebalance_timeout_ms: if m.rebalance_timeout == -1 {
                        m.session_timeout
                    } else {
                        m.rebalance_timeout
                    },
                    session_timeout_ms: m.session_timeout,
                    protocol_type: value.protocol_type.clone(),
                    protocols: vec![Protocol {
                        name: protocol.clone(),
                        metadata: m.subscription.clone(),
                    }],
                    assignment: m.assignment.clone(),
                    join_waiter: None,
                    sync_waiter: None,
                    is_new: false,
                    heartbeat_deadline: now + m.session_timeout as i64,
                };
                group.add(member);
            }
        }
        if !group.members.is_empty() {
            group.state = ClassicState::Stable;
            group.leader_id = value
                .leader
                .clone()
                .filter(|l| group.members.contains_key(l))
                .or_else(|| group.members.keys().next().cloned());
        }
        group.subscribed_topics = group.compute_subscribed_topics();
        group
    }

    /// The group as Kafka's GroupMetadataValue (members with the selected
    /// protocol's metadata and their assignment).
    pub fn to_record(&self) -> GroupMetadataValue {
        GroupMetadataValue {
            protocol_type: self.protocol_type.clone().unwrap_or_default(),
            generation: self.generation_id,
            protocol: self.protocol_name.clone(),
            leader: self.leader_id.clone(),
            current_state_timestamp: self.state_timestamp,
            members: self
                .members
                .values()
                .map(|m| MemberMetadataValue {
                    member_id: m.member_id.clone(),
                    group_instance_id: m.group_instance_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    rebalance_timeout: m.rebalance_timeout_ms,
                    session_timeout: m.session_timeout_ms,
                    subscription: self
                        .protocol_name
                        .as_deref()
                        .map(|p| m.metadata(p))
                        .unwrap_or_default(),
                    assignment: m.assignment.clone(),
                })
                .collect(),
        }
    }

    // ---- accessors ---------------------------------------------------

    pub fn group_id(&self) -> &str {
        &self.group_id
    }

    pub fn state(&self) -> ClassicState {
        self.state
    }

    pub fn generation_id(&self) -> i32 {
        self.generation_id
    }

    pub fn protocol_type(&self) -> Option<&str> {
        self.protocol_type.as_deref()
    }

    pub fn protocol_name(&self) -> Option<&str> {
        self.protocol_name.as_deref()
    }

    pub fn leader_id(&self) -> Option<&str> {
        self.leader_id.as_deref()
    }

    pub fn members(&self) -> impl Iterator<Item = &Member> {
        self.members.values()
    }

    pub fn member(&self, member_id: &str) -> Option<&Member> {
        self.members.get(member_id)
    }

    pub fn num_members(&self) -> usize {
        self.members.len()
    }

    pub fn static_member_id(&self, instance_id: &str) -> Option<&str> {
        self.static_members.get(instance_id).map(String::as_str)
    }

    pub fn is_pending_member(&self, member_id: &str) -> bool {
        self.pending_join.contains_key(member_id)
    }

    pub fn subscribed_topics(&self) -> Option<&BTreeSet<String>> {
        self.subscribed_topics.as_ref()
    }

    /// Wall-clock milliseconds of the last state change.
    pub fn state_timestamp(&self) -> i64 {
        self.state_timestamp
    }

    /// Kafka's `isSubscribedToTopic`: when the subscriptions are unknown, a
    /// group using the consumer protocol counts as subscribed.
    pub fn is_subscribed_to_topic(&self, topic: &str) -> bool {
        match &self.subscribed_topics {
            Some(topics) => topics.contains(topic),
            None => self.uses_consumer_protocol(),
        }
    }

    fn uses_consumer_protocol(&self) -> bool {
        self.protocol_type.as_deref() == Some(CONSUMER_PROTOCOL_TYPE)
    }

    /// The earliest time a [`ClassicGroup::tick`] has something to do.
    pub fn next_deadline(&self) -> Option<i64> {
        if self.state == ClassicState::Dead {
            return None;
        }
        let members = self.members.values().map(|m| m.heartbeat_deadline);
        let pending = self.pending_join.values().copied();
        let join = self.join_timer.as_ref().map(JoinTimer::deadline);
        let sync = self.sync_timer.map(|(d, _)| d);
        members.chain(pending).chain(join).chain(sync).min()
    }

    /// DescribeGroups: members with metadata and assignment only when Stable.
    pub fn describe(&self) -> (Option<String>, Vec<DescribedMember>) {
        let stable = self.state == ClassicState::Stable;
        let protocol = if stable {
            self.protocol_name.clone()
        } else {
            None
        };
        let members = self
            .members
            .values()
            .map(|m| DescribedMember {
                member_id: m.member_id.clone(),
                group_instance_id: m.group_instance_id.clone(),
                client_id: m.client_id.clone(),
                client_host: m.client_host.clone(),
                metadata: protocol
                    .as_deref()
                    .map(|p| m.metadata(p))
                    .unwrap_or_default(),
                assignment: if stable {
                    m.assignment.clone()
                } else {
                    Bytes::new()
                },
            })
            .collect();
        (protocol, members)
    }

    // ---- validation shared with offsets ---------------------------------

    /// Kafka's `validateMember`.
    pub fn validate_member(
        &self,
        member_id: &str,
        instance_id: Option<&str>,
    ) -> Result<(), ApiError> {
        if let Some(instance) = instance_id {
            match self.static_members.get(instance) {
                None => return Err(ApiError::UnknownMemberId),
                Some(existing) if existing != member_id => return Err(ApiError::FencedInstanceId),
                Some(_) => {}
            }
        }
        if !self.members.contains_key(member_id) {
            return Err(ApiError::UnknownMemberId);
        }
        Ok(())
    }

    /// Kafka's `ClassicGroup.validateOffsetCommit` (non-transactional).
    pub fn validate_offset_commit(
        &self,
        member_id: &str,
        instance_id: Option<&str>,
        generation_id: i32,
    ) -> Result<(), ApiError> {
        if self.state == ClassicState::Dead {
            return Err(ApiError::CoordinatorNotAvailable);
        }
        if generation_id < 0 && self.state == ClassicState::Empty {
            // A commit from outside group management (admin client, assign()).
            return Ok(());
        }
        if generation_id >= 0 || !member_id.is_empty() || instance_id.is_some() {
            self.validate_member(member_id, instance_id)?;
            if generation_id != self.generation_id {
                return Err(ApiError::IllegalGeneration);
            }
        } else if self.state != ClassicState::Empty {
            return Err(ApiError::UnknownMemberId);
        }
        if self.state == ClassicState::CompletingRebalance {
            return Err(ApiError::RebalanceInProgress);
        }
        Ok(())
    }

    /// Kafka's `validateOffsetDelete`.
    pub fn validate_offset_delete(&self) -> Result<(), ApiError> {
        match self.state {
            ClassicState::Dead => Err(ApiError::GroupIdNotFound),
            ClassicState::Empty => Ok(()),
            _ if !self.uses_consumer_protocol() => Err(ApiError::NonEmptyGroup),
            _ => Ok(()),
        }
    }

    /// Kafka's `validateDeleteGroup`.
    pub fn validate_delete(&self) -> Result<(), ApiError> {
        match self.state {
            ClassicState::Dead => Err(ApiError::GroupIdNotFound),
            ClassicState::Empty => Ok(()),
            _ => Err(ApiError::NonEmptyGroup),
        }
    }

    /// The group was deleted: nothing may use it any more.
    pub fn mark_dead(&mut self, now: i64) -> Effects {
        let mut fx = Effects::default();
        for m in self.members.values_mut() {
            if let Some(w) = m.join_waiter.take() {
                fx.join(
                    w,
                    JoinResult::error(m.member_id.clone(), ApiError::CoordinatorNotAvailable),
                );
            }
            if let Some(w) = m.sync_waiter.take() {
                fx.sync(w, SyncResult::error(ApiError::CoordinatorNotAvailable));
            }
        }
        self.join_timer = None;
        self.sync_timer = None;
        self.transition(ClassicState::Dead, now);
        fx
    }

    // ---- JoinGroup -----------------------------------------------------

    pub fn join(&mut self, req: JoinRequest, waiter: WaiterId, now: i64) -> Effects {
        let mut fx = Effects::default();
        let reply_error = |fx: &mut Effects, member_id: &str, e: ApiError| {
            fx.join(waiter, JoinResult::error(member_id, e));
        };
        if req.session_timeout_ms < self.config.min_session_timeout_ms
            || req.session_timeout_ms > self.config.max_session_timeout_ms
        {
            reply_error(&mut fx, &req.member_id, ApiError::InvalidSessionTimeout);
            return fx;
        }
        if self.state == ClassicState::Dead {
            reply_error(&mut fx, &req.member_id, ApiError::CoordinatorNotAvailable);
            return fx;
        }
        if !self.accepts_joining_member(&req.member_id) {
            if self.members.contains_key(&req.member_id) {
                self.remove_member(&req.member_id, &mut fx);
                self.maybe_complete_join_phase(now, &mut fx);
            }
            self.pending_join.shift_remove(&req.member_id);
            reply_error(&mut fx, "", ApiError::GroupMaxSizeReached);
            return fx;
        }
        let names: Vec<&str> = req.protocols.iter().map(|p| p.name.as_str()).collect();
        if !self.supports_protocols(&req.protocol_type, &names) {
            let id = if req.member_id.is_empty() {
                ""
            } else {
                &req.member_id
            };
            reply_error(&mut fx, id, ApiError::InconsistentGroupProtocol);
            return fx;
        }
        if req.member_id.is_empty() {
            self.join_new_member(req, waiter, now, &mut fx);
        } else {
            self.join_existing_member(req, waiter, now, &mut fx);
        }
        fx
    }

    fn accepts_joining_member(&self, member_id: &str) -> bool {
        let max = self.config.max_size;
        match self.state {
            ClassicState::Empty | ClassicState::Dead => true,
            ClassicState::PreparingRebalance => {
                self.members
                    .get(member_id)
                    .is_some_and(Member::is_awaiting_join)
                    || self.num_awaiting_join() < max
            }
            ClassicState::CompletingRebalance | ClassicState::Stable => {
                self.members.contains_key(member_id) || self.members.len() < max
            }
        }
    }

    fn num_awaiting_join(&self) -> usize {
        self.members
            .values()
            .filter(|m| m.is_awaiting_join())
            .count()
    }

    fn join_new_member(&mut self, req: JoinRequest, waiter: WaiterId, now: i64, fx: &mut Effects) {
        let new_id = req.new_member_id.clone();
        match req.group_instance_id.clone() {
            Some(instance) => match self.static_members.get(&instance).cloned() {
                Some(existing) => {
                    self.replace_static_member_and_rebalance(
                        &instance, &existing, &new_id, req, waiter, now, fx,
                    );
                }
                None => self.add_member_and_rebalance(new_id, req, waiter, now, fx),
            },
            None if req.requires_known_member_id => {
                self.pending_join
                    .insert(new_id.clone(), now + req.session_timeout_ms as i64);
                fx.join(
                    waiter,
                    JoinResult::error(new_id, ApiError::MemberIdRequired),
                );
            }
            None => self.add_member_and_rebalance(new_id, req, waiter, now, fx),
        }
    }

    fn join_existing_member(
        &mut self,
        req: JoinRequest,
        waiter: WaiterId,
        now: i64,
        fx: &mut Effects,
    ) {
        let member_id = req.member_id.clone();
        if self.pending_join.contains_key(&member_id) {
            if req.group_instance_id.is_some() {
                // Pending ids are handed to dynamic members only.
                fx.join(
                    waiter,
                    JoinResult::error(member_id, ApiError::UnknownMemberId),
                );
                return;
            }
            self.add_member_and_rebalance(member_id, req, waiter, now, fx);
            return;
        }
        if let Err(e) = self.validate_member(&member_id, req.group_instance_id.as_deref()) {
            fx.join(waiter, JoinResult::error(member_id, e));
            return;
        }
        let matches = self.members[&member_id].matches(&req.protocols);
        let is_leader = self.leader_id.as_deref() == Some(member_id.as_str());
        match self.state {
            ClassicState::PreparingRebalance => {
                self.update_member_and_rebalance(&member_id, req, waiter, now, fx);
            }
            ClassicState::CompletingRebalance if matches => {
                // It probably lost the JoinGroup response: answer again.
                self.touch(&member_id, now);
                let result = self.current_generation_result(&member_id, is_leader);
                fx.join(waiter, result);
            }
            ClassicState::Stable if !is_leader && matches => {
                // A follower rejoining with the same metadata just gets the
                // current generation and syncs again.
                self.touch(&member_id, now);
                let result = self.current_generation_result(&member_id, false);
                fx.join(waiter, result);
            }
            ClassicState::CompletingRebalance | ClassicState::Stable => {
                // Changed metadata, or the leader asking for a rebalance.
                self.update_member_and_rebalance(&member_id, req, waiter, now, fx);
            }
            ClassicState::Empty | ClassicState::Dead => {
                fx.join(
                    waiter,
                    JoinResult::error(member_id, ApiError::UnknownMemberId),
                );
            }
        }
    }

    fn add_member_and_rebalance(
        &mut self,
        member_id: String,
        req: JoinRequest,
        waiter: WaiterId,
        now: i64,
        fx: &mut Effects,
    ) {
        let member = Member {
            member_id: member_id.clone(),
            group_instance_id: req.group_instance_id,
            client_id: req.client_id,
            client_host: req.client_host,
            rebalance_timeout_ms: req.rebalance_timeout_ms,
            session_timeout_ms: req.session_timeout_ms,
            protocol_type: req.protocol_type,
            protocols: req.protocols,
            assignment: Bytes::new(),
            join_waiter: Some(waiter),
            sync_waiter: None,
            is_new: true,
            heartbeat_deadline: now + self.config.new_member_join_timeout_ms,
        };
        if self.state == ClassicState::PreparingRebalance
            && self.previous_state == ClassicState::Empty
        {
            // Lets the initial rebalance wait a little longer for others.
            self.new_member_added = true;
        }
        self.add(member);
        self.maybe_prepare_rebalance_or_complete_join(now, fx);
    }

    fn add(&mut self, member: Member) {
        if self.members.is_empty() {
            self.protocol_type = Some(member.protocol_type.clone());
        }
        if self.leader_id.is_none() {
            self.leader_id = Some(member.member_id.clone());
        }
        if let Some(instance) = &member.group_instance_id {
            self.static_members
                .insert(instance.clone(), member.member_id.clone());
        }
        self.pending_join.shift_remove(&member.member_id);
        self.members.insert(member.member_id.clone(), member);
    }

    fn update_member_and_rebalance(
        &mut self,
        member_id: &str,
        req: JoinRequest,
        waiter: WaiterId,
        now: i64,
        fx: &mut Effects,
    ) {
        self.update_member(
            member_id,
            req.protocols,
            req.rebalance_timeout_ms,
            req.session_timeout_ms,
            waiter,
            fx,
        );
        self.maybe_prepare_rebalance_or_complete_join(now, fx);
    }

    fn update_member(
        &mut self,
        member_id: &str,
        protocols: Vec<Protocol>,
        rebalance_timeout_ms: i32,
        session_timeout_ms: i32,
        waiter: WaiterId,
        fx: &mut Effects,
    ) {
        let m = self.members.get_mut(member_id).expect("member exists");
        m.protocols = protocols;
        m.rebalance_timeout_ms = rebalance_timeout_ms;
        m.session_timeout_ms = session_timeout_ms;
        if let Some(old) = m.join_waiter.replace(waiter) {
            if old != waiter {
                // A newer JoinGroup of the same member supersedes the parked one.
                fx.join(
                    old,
                    JoinResult::error(member_id, ApiError::RebalanceInProgress),
                );
            }
        }
    }

    /// KIP-345: a static member rejoining without its member id takes over
    /// the old id's place; the old id is fenced.
    #[allow(clippy::too_many_arguments)]
    fn replace_static_member_and_rebalance(
        &mut self,
        instance: &str,
        old_id: &str,
        new_id: &str,
        req: JoinRequest,
        waiter: WaiterId,
        now: i64,
        fx: &mut Effects,
    ) {
        let current_leader = self.leader_id.clone().unwrap_or_default();
        let Some(mut member) = self.members.shift_remove(old_id) else {
            return;
        };
        if let Some(w) = member.join_waiter.take() {
            fx.join(w, JoinResult::error(old_id, ApiError::FencedInstanceId));
        }
        if let Some(w) = member.sync_waiter.take() {
            fx.sync(w, SyncResult::error(ApiError::FencedInstanceId));
        }
        member.member_id = new_id.to_string();
        member.heartbeat_deadline = now + member.session_timeout_ms as i64;
        self.members.insert(new_id.to_string(), member);
        if self.leader_id.as_deref() == Some(old_id) {
            self.leader_id = Some(new_id.to_string());
        }
        if self.pending_sync.remove(old_id) {
            self.pending_sync.insert(new_id.to_string());
        }
        self.static_members
            .insert(instance.to_string(), new_id.to_string());
        let supports_skip = req.supports_skip_assignment;
        self.update_member(
            new_id,
            req.protocols,
            req.rebalance_timeout_ms,
            req.session_timeout_ms,
            waiter,
            fx,
        );
        match self.state {
            ClassicState::Stable => {
                if self.protocol_name.as_deref() == Some(self.select_protocol().as_str()) {
                    // Same protocol: no rebalance; persist the new member id
                    // and hand back the current generation.
                    fx.store = true;
                    let is_leader = self.leader_id.as_deref() == Some(new_id);
                    let mut result = self.current_generation_result(new_id, false);
                    if supports_skip && is_leader {
                        result.members = self.current_members();
                        result.skip_assignment = true;
                    } else {
                        // The old leader id: a rejoining leader does not
                        // compute an assignment a Stable group would not send.
                        result.leader = current_leader;
                    }
                    let m = self.members.get_mut(new_id).expect("just inserted");
                    m.join_waiter = None;
                    fx.join(waiter, result);
                } else {
                    self.maybe_prepare_rebalance_or_complete_join(now, fx);
                }
            }
            ClassicState::CompletingRebalance => {
                // The leader may already have assigned to the old id.
                self.prepare_rebalance(now, fx);
            }
            _ => self.maybe_complete_join_phase(now, fx),
        }
    }

    fn current_members(&self) -> Vec<JoinedMember> {
        let protocol = self.protocol_name.clone().unwrap_or_default();
        self.members
            .values()
            .map(|m| JoinedMember {
                member_id: m.member_id.clone(),
                group_instance_id: m.group_instance_id.clone(),
                metadata: m.metadata(&protocol),
            })
            .collect()
    }

    fn current_generation_result(&self, member_id: &str, with_members: bool) -> JoinResult {
        JoinResult {
            error: None,
            member_id: member_id.to_string(),
            generation_id: self.generation_id,
            protocol_type: self.protocol_type.clone(),
            protocol_name: self.protocol_name.clone(),
            leader: self.leader_id.clone().unwrap_or_default(),
            skip_assignment: false,
            members: if with_members {
                self.current_members()
            } else {
                vec![]
            },
        }
    }

    fn supports_protocols(&self, protocol_type: &str, protocols: &[&str]) -> bool {
        if self.state == ClassicState::Empty {
            return !protocol_type.is_empty() && !protocols.is_empty();
        }
        self.protocol_type.as_deref() == Some(protocol_type)
            && protocols.iter().any(|p| {
                self.members.values().filter(|m| m.supports(p)).count() == self.members.len()
            })
    }

    /// The protocol every member supports that most members prefer (ties:
    /// the earlier-joined members' preference).
    fn select_protocol(&self) -> String {
        let Some(first) = self.members.values().next() else {
            return String::new();
        };
        let candidates: Vec<&str> = first
            .protocols
            .iter()
            .map(|p| p.name.as_str())
            .filter(|name| self.members.values().all(|m| m.supports(name)))
            .collect();
        let mut votes: IndexMap<&str, usize> = IndexMap::new();
        for m in self.members.values() {
            if let Some(p) = m
                .protocols
                .iter()
                .find(|p| candidates.contains(&p.name.as_str()))
            {
                *votes.entry(p.name.as_str()).or_default() += 1;
            }
        }
        let mut best: Option<(&str, usize)> = None;
        for (name, count) in votes {
            if best.is_none_or(|(_, c)| count > c) {
                best = Some((name, count));
            }
        }
        best.map(|(n, _)| n.to_string()).unwrap_or_default()
    }

    fn rebalance_timeout_ms(&self) -> i64 {
        self.members
            .values()
            .map(|m| m.rebalance_timeout_ms as i64)
            .max()
            .unwrap_or(0)
    }

    fn can_rebalance(&self) -> bool {
        matches!(
            self.state,
            ClassicState::Stable | ClassicState::CompletingRebalance | ClassicState::Empty
        )
    }

    fn transition(&mut self, to: ClassicState, now: i64) {
        self.previous_state = self.state;
        self.state = to;
        self.state_timestamp = now;
    }

    fn maybe_prepare_rebalance_or_complete_join(&mut self, now: i64, fx: &mut Effects) {
        if self.can_rebalance() {
            self.prepare_rebalance(now, fx);
        } else {
            self.maybe_complete_join_phase(now, fx);
        }
    }

    fn prepare_rebalance(&mut self, now: i64, fx: &mut Effects) {
        if self.state == ClassicState::CompletingRebalance {
            self.reset_and_propagate_assignment_error(ApiError::RebalanceInProgress, now, fx);
        }
        self.sync_timer = None;
        let initial = self.state == ClassicState::Empty;
        self.transition(ClassicState::PreparingRebalance, now);
        if initial {
            let delay = self.config.initial_rebalance_delay_ms;
            self.new_member_added = false;
            self.join_timer = Some(JoinTimer::Initial {
                deadline: now + delay,
                delay,
                remaining: (self.rebalance_timeout_ms() - delay).max(0),
            });
        } else if self.has_all_members_joined() {
            self.complete_join(now, fx);
        } else {
            self.join_timer = Some(JoinTimer::Normal {
                deadline: now + self.rebalance_timeout_ms(),
            });
        }
    }

    fn has_all_members_joined(&self) -> bool {
        self.pending_join.is_empty() && self.members.values().all(Member::is_awaiting_join)
    }

    /// Completes the join phase early when everyone is in (never during the
    /// initial delay of a group that was empty).
    fn maybe_complete_join_phase(&mut self, now: i64, fx: &mut Effects) {
        if self.state == ClassicState::PreparingRebalance
            && self.has_all_members_joined()
            && self.previous_state != ClassicState::Empty
        {
            self.complete_join(now, fx);
        }
    }

    fn complete_join(&mut self, now: i64, fx: &mut Effects) {
        if self.state != ClassicState::PreparingRebalance {
            return;
        }
        self.join_timer = None;
        // Dynamic members that did not rejoin in time are out; static ones
        // keep their place until their session expires.
        let gone: Vec<String> = self
            .members
            .values()
            .filter(|m| !m.is_awaiting_join() && m.group_instance_id.is_none())
            .map(|m| m.member_id.clone())
            .collect();
        for id in gone {
            self.remove_member(&id, fx);
        }
        if !self.maybe_elect_new_joined_leader() && !self.members.is_empty() {
            // Nobody rejoined: wait another rebalance timeout.
            self.join_timer = Some(JoinTimer::Normal {
                deadline: now + self.rebalance_timeout_ms(),
            });
            return;
        }
        self.init_next_generation(now);
        if self.state == ClassicState::Empty {
            fx.store = true;
            return;
        }
        let leader = self.leader_id.clone().unwrap_or_default();
        let all = self.current_members();
        let generation = self.generation_id;
        let protocol_type = self.protocol_type.clone();
        let protocol_name = self.protocol_name.clone();
        for m in self.members.values_mut() {
            if let Some(w) = m.join_waiter.take() {
                fx.join(
                    w,
                    JoinResult {
                        error: None,
                        member_id: m.member_id.clone(),
                        generation_id: generation,
                        protocol_type: protocol_type.clone(),
                        protocol_name: protocol_name.clone(),
                        leader: leader.clone(),
                        skip_assignment: false,
                        members: if m.member_id == leader {
                            all.clone()
                        } else {
                            vec![]
                        },
                    },
                );
            }
            m.heartbeat_deadline = now + m.session_timeout_ms as i64;
            m.is_new = false;
            self.pending_sync.insert(m.member_id.clone());
        }
        self.sync_timer = Some((now + self.rebalance_timeout_ms(), generation));
    }

    fn maybe_elect_new_joined_leader(&mut self) -> bool {
        let Some(leader) = self.leader_id.clone() else {
            return false;
        };
        if self
            .members
            .get(&leader)
            .is_some_and(Member::is_awaiting_join)
        {
            return true;
        }
        match self.members.values().find(|m| m.is_awaiting_join()) {
            Some(m) => {
                self.leader_id = Some(m.member_id.clone());
                true
            }
            None => false,
        }
    }

    fn init_next_generation(&mut self, now: i64) {
        self.generation_id += 1;
        if self.members.is_empty() {
            self.protocol_name = None;
            self.transition(ClassicState::Empty, now);
        } else {
            self.protocol_name = Some(self.select_protocol());
            self.transition(ClassicState::CompletingRebalance, now);
        }
        self.subscribed_topics = self.compute_subscribed_topics();
        self.pending_sync.clear();
    }

    /// The topics the members subscribe to, read from their consumer
    /// protocol metadata (the version-0 prefix every version shares).
    fn compute_subscribed_topics(&self) -> Option<BTreeSet<String>> {
        if !self.uses_consumer_protocol() {
            return None;
        }
        if self.members.is_empty() {
            return Some(BTreeSet::new());
        }
        let protocol = self.protocol_name.as_deref()?;
        let mut topics = BTreeSet::new();
        for m in self.members.values() {
            topics.extend(parse_subscription_topics(&m.metadata(protocol))?);
        }
        Some(topics)
    }

    fn reset_and_propagate_assignment_error(
        &mut self,
        error: ApiError,
        now: i64,
        fx: &mut Effects,
    ) {
        for m in self.members.values_mut() {
            m.assignment = Bytes::new();
            if let Some(w) = m.sync_waiter.take() {
                fx.sync(w, SyncResult::error(error.clone()));
                m.heartbeat_deadline = now + m.session_timeout_ms as i64;
            }
        }
    }

    fn remove_member(&mut self, member_id: &str, fx: &mut Effects) {
        if let Some(m) = self.members.shift_remove(member_id) {
            if let Some(w) = m.join_waiter {
                fx.join(w, JoinResult::error(member_id, ApiError::UnknownMemberId));
            }
            if let Some(w) = m.sync_waiter {
                fx.sync(w, SyncResult::error(ApiError::UnknownMemberId));
            }
            if let Some(instance) = &m.group_instance_id {
                if self.static_members.get(instance).map(String::as_str) == Some(member_id) {
                    self.static_members.remove(instance);
                }
            }
        }
        if self.leader_id.as_deref() == Some(member_id) {
            self.leader_id = self.members.keys().next().cloned();
        }
        self.pending_join.shift_remove(member_id);
        self.pending_sync.remove(member_id);
    }

    /// Kafka's `removeMemberAndUpdateGroup`.
    fn remove_member_and_update_group(&mut self, member_id: &str, now: i64, fx: &mut Effects) {
        self.remove_member(member_id, fx);
        match self.state {
            ClassicState::Dead | ClassicState::Empty => {}
            ClassicState::Stable | ClassicState::CompletingRebalance => {
                self.prepare_rebalance(now, fx)
            }
            ClassicState::PreparingRebalance => self.maybe_complete_join_phase(now, fx),
        }
    }

    fn touch(&mut self, member_id: &str, now: i64) {
        if let Some(m) = self.members.get_mut(member_id) {
            m.heartbeat_deadline = now + m.session_timeout_ms as i64;
        }
    }

    // ---- SyncGroup -----------------------------------------------------

    pub fn sync(&mut self, req: SyncRequest, waiter: WaiterId, now: i64) -> Effects {
        let mut fx = Effects::default();
        if let Err(e) = self.validate_sync(&req) {
            fx.sync(waiter, SyncResult::error(e));
            return fx;
        }
        let member_id = req.member_id.clone();
        match self.state {
            ClassicState::PreparingRebalance => {
                fx.sync(waiter, SyncResult::error(ApiError::RebalanceInProgress));
            }
            ClassicState::CompletingRebalance => {
                let m = self.members.get_mut(&member_id).expect("validated");
                if let Some(old) = m.sync_waiter.replace(waiter) {
                    if old != waiter {
                        fx.sync(old, SyncResult::error(ApiError::RebalanceInProgress));
                    }
                }
                m.heartbeat_deadline = now + m.session_timeout_ms as i64;
                self.remove_pending_sync(&member_id);
                if self.leader_id.as_deref() == Some(member_id.as_str()) {
                    let mut assignment: HashMap<String, Bytes> =
                        req.assignments.into_iter().collect();
                    for m in self.members.values_mut() {
                        m.assignment = assignment.remove(&m.member_id).unwrap_or_default();
                    }
                    // Persisted before it is kept (the caller runs this on a copy).
                    fx.store = true;
                    self.transition(ClassicState::Stable, now);
                    self.propagate_assignment(now, &mut fx);
                }
            }
            ClassicState::Stable => {
                self.remove_pending_sync(&member_id);
                self.touch(&member_id, now);
                let m = &self.members[&member_id];
                fx.sync(
                    waiter,
                    SyncResult {
                        error: None,
                        protocol_type: self.protocol_type.clone(),
                        protocol_name: self.protocol_name.clone(),
                        assignment: m.assignment.clone(),
                    },
                );
            }
            ClassicState::Empty | ClassicState::Dead => {
                fx.sync(waiter, SyncResult::error(ApiError::UnknownMemberId));
            }
        }
        fx
    }

    fn validate_sync(&self, req: &SyncRequest) -> Result<(), ApiError> {
        match self.state {
            ClassicState::Empty => return Err(ApiError::UnknownMemberId),
            ClassicState::Dead => return Err(ApiError::CoordinatorNotAvailable),
            _ => {}
        }
        self.validate_member(&req.member_id, req.group_instance_id.as_deref())?;
        if req.generation_id != self.generation_id {
            return Err(ApiError::IllegalGeneration);
        }
        let inconsistent = |asked: &Option<String>, ours: &Option<String>| matches!((asked, ours), (Some(a), Some(o)) if a != o);
        if inconsistent(&req.protocol_type, &self.protocol_type)
            || inconsistent(&req.protocol_name, &self.protocol_name)
        {
            return Err(ApiError::InconsistentGroupProtocol);
        }
        Ok(())
    }

    fn propagate_assignment(&mut self, now: i64, fx: &mut Effects) {
        let protocol_type = self.protocol_type.clone();
        let protocol_name = self.protocol_name.clone();
        for m in self.members.values_mut() {
            if let Some(w) = m.sync_waiter.take() {
                fx.sync(
                    w,
                    SyncResult {
                        error: None,
                        protocol_type: protocol_type.clone(),
                        protocol_name: protocol_name.clone(),
                        assignment: m.assignment.clone(),
                    },
                );
                m.heartbeat_deadline = now + m.session_timeout_ms as i64;
            }
        }
    }

    fn remove_pending_sync(&mut self, member_id: &str) {
        self.pending_sync.remove(member_id);
        let keep = matches!(
            self.state,
            ClassicState::CompletingRebalance | ClassicState::Stable
        ) && !self.pending_sync.is_empty();
        if !keep {
            self.sync_timer = None;
        }
    }

    /// The leader's assignment could not be persisted: the members waiting
    /// in SyncGroup get the error and the group rebalances.
    pub fn assignment_store_failed(
        &mut self,
        generation: i32,
        error: ApiError,
        now: i64,
    ) -> Effects {
        let mut fx = Effects::default();
        if self.state == ClassicState::CompletingRebalance && self.generation_id == generation {
            self.reset_and_propagate_assignment_error(error, now, &mut fx);
            self.maybe_prepare_rebalance_or_complete_join(now, &mut fx);
        }
        fx
    }

    // ---- Heartbeat -----------------------------------------------------

    pub fn heartbeat(
        &mut self,
        member_id: &str,
        instance_id: Option<&str>,
        generation_id: i32,
        now: i64,
    ) -> Result<(), ApiError> {
        if self.state == ClassicState::Dead {
            return Err(ApiError::CoordinatorNotAvailable);
        }
        self.validate_member(member_id, instance_id)?;
        if generation_id != self.generation_id {
            return Err(ApiError::IllegalGeneration);
        }
        match self.state {
            ClassicState::Empty | ClassicState::Dead => Err(ApiError::UnknownMemberId),
            ClassicState::PreparingRebalance => {
                self.touch(member_id, now);
                Err(ApiError::RebalanceInProgress)
            }
            ClassicState::CompletingRebalance | ClassicState::Stable => {
                self.touch(member_id, now);
                Ok(())
            }
        }
    }

    // ---- LeaveGroup ----------------------------------------------------

    /// Removes members `(member id, group instance id)`; an empty member id
    /// with an instance id removes that static member (admin removal).
    /// `Err` is a group-level error; otherwise one result per member.
    #[allow(clippy::type_complexity)]
    pub fn leave(
        &mut self,
        leaving: &[(String, Option<String>)],
        now: i64,
    ) -> (Result<Vec<Result<(), ApiError>>, ApiError>, Effects) {
        let mut fx = Effects::default();
        if self.state == ClassicState::Dead {
            return (Err(ApiError::CoordinatorNotAvailable), fx);
        }
        let mut results = Vec::with_capacity(leaving.len());
        for (member_id, instance) in leaving {
            let result = if member_id.is_empty() {
                match instance
                    .as_deref()
                    .and_then(|i| self.static_members.get(i).cloned())
                {
                    Some(id) => {
                        self.remove_member_and_update_group(&id, now, &mut fx);
                        Ok(())
                    }
                    None => Err(ApiError::UnknownMemberId),
                }
            } else if self.pending_join.contains_key(member_id) {
                self.pending_join.shift_remove(member_id);
                self.maybe_complete_join_phase(now, &mut fx);
                Ok(())
            } else {
                match self.validate_member(member_id, instance.as_deref()) {
                    Ok(()) => {
                        self.remove_member_and_update_group(member_id, now, &mut fx);
                        Ok(())
                    }
                    Err(e) => Err(e),
                }
            };
            results.push(result);
        }
        (Ok(results), fx)
    }

    // ---- timers --------------------------------------------------------

    /// Runs every timer due at `now`: expired pending members, member
    /// sessions, the join phase deadline and the sync deadline.
    pub fn tick(&mut self, now: i64) -> Effects {
        let mut fx = Effects::default();
        if self.state == ClassicState::Dead {
            return fx;
        }
        let expired_pending: Vec<String> = self
            .pending_join
            .iter()
            .filter(|(_, d)| **d <= now)
            .map(|(id, _)| id.clone())
            .collect();
        for id in expired_pending {
            self.pending_join.shift_remove(&id);
            self.maybe_complete_join_phase(now, &mut fx);
        }
        let due: Vec<String> = self
            .members
            .values()
            .filter(|m| m.heartbeat_deadline <= now)
            .map(|m| m.member_id.clone())
            .collect();
        for id in due {
            let Some(m) = self.members.get_mut(&id) else {
                continue;
            };
            if m.heartbeat_deadline > now {
                continue;
            }
            if m.satisfied_heartbeat() {
                m.heartbeat_deadline = now + m.session_timeout_ms as i64;
            } else {
                tracing::info!(group = %self.group_id, member = %id, "member session expired; removing it from the group");
                self.remove_member_and_update_group(&id, now, &mut fx);
            }
        }
        if let Some(timer) = self.join_timer.clone() {
            if timer.deadline() <= now && self.state == ClassicState::PreparingRebalance {
                match timer {
                    JoinTimer::Initial {
                        delay, remaining, ..
                    } if self.new_member_added && remaining != 0 => {
                        self.new_member_added = false;
                        let next_delay = self.config.initial_rebalance_delay_ms.min(remaining);
                        self.join_timer = Some(JoinTimer::Initial {
                            deadline: now + next_delay,
                            delay: next_delay,
                            remaining: (remaining - delay).max(0),
                        });
                    }
                    _ => self.complete_join(now, &mut fx),
                }
            } else if self.state != ClassicState::PreparingRebalance {
                self.join_timer = None;
            }
        }
        if let Some((deadline, generation)) = self.sync_timer {
            if deadline <= now {
                self.sync_timer = None;
                let syncing = matches!(
                    self.state,
                    ClassicState::CompletingRebalance | ClassicState::Stable
                );
                if generation == self.generation_id && syncing && !self.pending_sync.is_empty() {
                    let late: Vec<String> = self.pending_sync.iter().cloned().collect();
                    tracing::info!(group = %self.group_id, members = ?late, "members did not send SyncGroup within the rebalance timeout; removing them");
                    for id in late {
                        self.remove_member(&id, &mut fx);
                    }
                    self.prepare_rebalance(now, &mut fx);
                }
            }
        }
        fx
    }
}

/// The topics of a ConsumerProtocolSubscription (int16 version, then an
/// array of strings); `None` if it does not parse.
pub fn parse_subscription_topics(metadata: &[u8]) -> Option<Vec<String>> {
    let mut pos = 0usize;
    let mut take = |n: usize| -> Option<&[u8]> {
        let s = metadata.get(pos..pos + n)?;
        pos += n;
        Some(s)
    };
    let _version = i16::from_be_bytes(take(2)?.try_into().ok()?);
    let count = i32::from_be_bytes(take(4)?.try_into().ok()?);
    if count < 0 {
        return None;
    }
    let mut topics = Vec::with_capacity((count as usize).min(1024));
    for _ in 0..count {
        let len = i16::from_be_bytes(take(2)?.try_into().ok()?);
        if len < 0 {
            return None;
        }
        topics.push(String::from_utf8(take(len as usize)?.to_vec()).ok()?);
    }
    Some(topics)
}
