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

use crate::records::{GroupMetadataValue, MemberMetadataValue};
use tessera_server_common::error::ApiError;

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

#[cfg(test)]
mod tests {
    use super::*;

    const SESSION: i32 = 10_000;
    const REBALANCE: i32 = 30_000;
    const DELAY: i64 = 3_000;

    fn config() -> ClassicConfig {
        ClassicConfig {
            initial_rebalance_delay_ms: DELAY,
            new_member_join_timeout_ms: 300_000,
            max_size: 100,
            min_session_timeout_ms: 1_000,
            max_session_timeout_ms: 60_000,
        }
    }

    fn protos(list: &[(&str, &[u8])]) -> Vec<Protocol> {
        list.iter()
            .map(|(n, m)| Protocol {
                name: n.to_string(),
                metadata: Bytes::copy_from_slice(m),
            })
            .collect()
    }

    /// A consumer protocol subscription (v0) to `topics`.
    fn subscription(topics: &[&str]) -> Vec<u8> {
        let mut b = vec![0, 0];
        b.extend_from_slice(&(topics.len() as i32).to_be_bytes());
        for t in topics {
            b.extend_from_slice(&(t.len() as i16).to_be_bytes());
            b.extend_from_slice(t.as_bytes());
        }
        b.extend_from_slice(&(-1i32).to_be_bytes()); // null user data
        b
    }

    struct H {
        g: ClassicGroup,
        now: i64,
        next: WaiterId,
        ids: u32,
    }

    impl H {
        fn new() -> H {
            H::with(config())
        }

        fn with(config: ClassicConfig) -> H {
            H {
                g: ClassicGroup::new("g", config, 1_000_000),
                now: 1_000_000,
                next: 1,
                ids: 0,
            }
        }

        fn request(&mut self, member_id: &str, instance: Option<&str>) -> JoinRequest {
            self.ids += 1;
            JoinRequest {
                member_id: member_id.to_string(),
                group_instance_id: instance.map(str::to_string),
                client_id: "client".into(),
                client_host: "/127.0.0.1".into(),
                session_timeout_ms: SESSION,
                rebalance_timeout_ms: REBALANCE,
                protocol_type: "consumer".into(),
                protocols: protos(&[("range", b"r")]),
                requires_known_member_id: true,
                supports_skip_assignment: false,
                new_member_id: format!("{}-{}", instance.unwrap_or("client"), self.ids),
            }
        }

        fn join_with(&mut self, req: JoinRequest) -> (WaiterId, Effects) {
            let w = self.next;
            self.next += 1;
            let fx = self.g.join(req, w, self.now);
            (w, fx)
        }

        fn join(&mut self, member_id: &str) -> (WaiterId, Effects) {
            let req = self.request(member_id, None);
            self.join_with(req)
        }

        /// A dynamic member joining from scratch (MEMBER_ID_REQUIRED, then parked).
        fn new_member(&mut self) -> (String, WaiterId) {
            let (w, fx) = self.join("");
            let r = join_reply(&fx, w).expect("answered at once");
            assert_eq!(r.code(), ApiError::MemberIdRequired.code());
            let id = r.member_id.clone();
            let (w, fx) = self.join(&id);
            assert!(join_reply(&fx, w).is_none(), "parked");
            (id, w)
        }

        fn sync(&mut self, member_id: &str, assignments: &[(&str, &[u8])]) -> (WaiterId, Effects) {
            self.sync_as(member_id, None, assignments)
        }

        fn sync_as(
            &mut self,
            member_id: &str,
            instance: Option<&str>,
            assignments: &[(&str, &[u8])],
        ) -> (WaiterId, Effects) {
            let w = self.next;
            self.next += 1;
            let req = SyncRequest {
                member_id: member_id.into(),
                group_instance_id: instance.map(str::to_string),
                generation_id: self.g.generation_id(),
                protocol_type: Some("consumer".into()),
                protocol_name: self.g.protocol_name().map(str::to_string),
                assignments: assignments
                    .iter()
                    .map(|(m, a)| (m.to_string(), Bytes::copy_from_slice(a)))
                    .collect(),
            };
            let fx = self.g.sync(req, w, self.now);
            (w, fx)
        }

        fn advance(&mut self, ms: i64) -> Effects {
            self.now += ms;
            self.g.tick(self.now)
        }

        /// Advances through the initial delay (and its extensions) until the
        /// join phase completes; returns every reply on the way.
        fn settle(&mut self) -> Effects {
            let mut all = Effects::default();
            for _ in 0..20 {
                let fx = self.advance(DELAY);
                all.replies.extend(fx.replies);
                all.store |= fx.store;
                if self.g.state() != ClassicState::PreparingRebalance {
                    break;
                }
            }
            all
        }

        fn heartbeat(&mut self, member_id: &str) -> i16 {
            let generation = self.g.generation_id();
            match self.g.heartbeat(member_id, None, generation, self.now) {
                Ok(()) => 0,
                Err(e) => e.code(),
            }
        }

        /// Two dynamic members through a full first rebalance: Stable, generation 1.
        fn stable_pair(&mut self) -> (String, String) {
            let (a, wa) = self.new_member();
            let (b, wb) = self.new_member();
            // b joined during a's initial delay: it is extended once.
            assert!(self.advance(DELAY).replies.is_empty());
            let fx = self.advance(DELAY);
            let ra = join_reply(&fx, wa).expect("a answered");
            let rb = join_reply(&fx, wb).expect("b answered");
            assert_eq!((ra.code(), rb.code()), (0, 0));
            let (s1, fx1) = self.sync(&b, &[]);
            assert!(sync_reply(&fx1, s1).is_none());
            let (s0, fx0) = self.sync(&a, &[(&a, b"A"), (&b, b"B")]);
            assert!(fx0.store);
            assert_eq!(sync_reply(&fx0, s0).unwrap().assignment.as_ref(), b"A");
            assert_eq!(sync_reply(&fx0, s1).unwrap().assignment.as_ref(), b"B");
            assert_eq!(self.g.state(), ClassicState::Stable);
            (a, b)
        }
    }

    fn join_reply(fx: &Effects, w: WaiterId) -> Option<&JoinResult> {
        fx.replies.iter().find_map(|r| match r {
            Reply::Join(id, res) if *id == w => Some(res),
            _ => None,
        })
    }

    fn sync_reply(fx: &Effects, w: WaiterId) -> Option<&SyncResult> {
        fx.replies.iter().find_map(|r| match r {
            Reply::Sync(id, res) if *id == w => Some(res),
            _ => None,
        })
    }

    #[test]
    fn first_join_gets_member_id_then_waits_the_initial_delay() {
        let mut h = H::new();
        let (id, w) = h.new_member();
        assert!(id.starts_with("client-"));
        assert_eq!(h.g.state(), ClassicState::PreparingRebalance);
        // Everyone has joined, but the initial delay is never cut short.
        assert!(h.advance(DELAY - 1).replies.is_empty());
        let fx = h.advance(1);
        let r = join_reply(&fx, w).unwrap();
        assert_eq!(r.code(), 0);
        assert_eq!(r.generation_id, 1);
        assert_eq!(r.leader, id);
        assert_eq!(r.members.len(), 1);
        assert_eq!(r.protocol_name.as_deref(), Some("range"));
        assert_eq!(h.g.state(), ClassicState::CompletingRebalance);
    }

    #[test]
    fn old_clients_join_without_member_id_required() {
        let mut h = H::new();
        let mut req = h.request("", None);
        req.requires_known_member_id = false;
        let (w, fx) = h.join_with(req);
        assert!(fx.replies.is_empty());
        let fx = h.settle();
        assert_eq!(join_reply(&fx, w).unwrap().generation_id, 1);
    }

    #[test]
    fn pending_member_that_never_rejoins_expires() {
        let mut h = H::new();
        let (w, fx) = h.join("");
        assert_eq!(join_reply(&fx, w).unwrap().code(), 79);
        assert_eq!(h.g.pending_join.len(), 1);
        h.advance(SESSION as i64);
        assert!(h.g.pending_join.is_empty());
    }

    #[test]
    fn initial_delay_extends_for_new_members_up_to_rebalance_timeout() {
        let mut h = H::new();
        let (_, w1) = h.new_member();
        h.now += 2_000;
        let (_, w2) = h.new_member();
        // At the first deadline a member was added: wait another delay.
        let fx = h.advance(1_000);
        assert!(fx.replies.is_empty());
        let fx = h.settle();
        assert!(join_reply(&fx, w1).is_some() && join_reply(&fx, w2).is_some());
        assert_eq!(h.g.num_members(), 2);

        // A stream of joiners cannot hold the group forever: rebalance timeout caps it.
        let mut h = H::new();
        let start = h.now;
        let (_, first) = h.new_member();
        let mut done_at = None;
        for _ in 0..40 {
            h.now += 1_000;
            h.new_member();
            let fx = h.g.tick(h.now);
            if join_reply(&fx, first).is_some() {
                done_at = Some(h.now - start);
                break;
            }
        }
        let done = done_at.expect("completed");
        assert!(
            done <= REBALANCE as i64 + DELAY,
            "completed after {done} ms"
        );
    }

    #[test]
    fn leader_assignment_is_stored_and_handed_to_every_member() {
        let mut h = H::new();
        let (a, b) = h.stable_pair();
        assert_eq!(h.g.leader_id(), Some(a.as_str()));
        // A late SyncGroup in Stable gets its assignment at once.
        let (w, fx) = h.sync(&b, &[]);
        assert_eq!(sync_reply(&fx, w).unwrap().assignment.as_ref(), b"B");
        assert!(!fx.store);
        let rec = h.g.to_record();
        assert_eq!(rec.generation, 1);
        assert_eq!(rec.members.len(), 2);
        assert_eq!(rec.members[1].assignment.as_ref(), b"B");
        assert_eq!(rec.members[0].subscription.as_ref(), b"r");
    }

    #[test]
    fn member_missing_from_leader_assignment_gets_empty() {
        let mut h = H::new();
        let (a, wa) = h.new_member();
        let (b, _) = h.new_member();
        let fx = h.settle();
        assert!(join_reply(&fx, wa).is_some());
        h.sync(&a, &[(&a, b"A")]);
        let (w, fx) = h.sync(&b, &[]);
        assert!(sync_reply(&fx, w).unwrap().assignment.is_empty());
    }

    #[test]
    fn heartbeat_errors() {
        let mut h = H::new();
        let (a, _) = h.stable_pair();
        assert_eq!(h.heartbeat(&a), 0);
        assert_eq!(h.heartbeat("nobody"), ApiError::UnknownMemberId.code());
        assert_eq!(
            h.g.heartbeat(&a, None, 7, h.now).unwrap_err().code(),
            ApiError::IllegalGeneration.code()
        );
        // A new member starts a rebalance: the others learn it from heartbeats.
        h.new_member();
        assert_eq!(h.g.state(), ClassicState::PreparingRebalance);
        assert_eq!(h.heartbeat(&a), ApiError::RebalanceInProgress.code());
        // Static fencing applies to heartbeats too.
        assert_eq!(
            h.g.heartbeat(&a, Some("i"), 1, h.now).unwrap_err().code(),
            ApiError::UnknownMemberId.code()
        );
    }

    #[test]
    fn rebalance_completes_as_soon_as_everyone_rejoined() {
        let mut h = H::new();
        let (a, b) = h.stable_pair();
        let (c, wc) = h.new_member();
        assert!(h.advance(1).replies.is_empty());
        let (wa, fx) = h.join(&a);
        assert!(fx.replies.is_empty());
        let (wb, fx) = h.join(&b);
        // No initial delay: the group was not empty.
        let ra = join_reply(&fx, wa).unwrap();
        assert_eq!(ra.generation_id, 2);
        assert_eq!(ra.members.len(), 3, "the leader gets every member");
        assert!(join_reply(&fx, wb).unwrap().members.is_empty());
        assert!(join_reply(&fx, wc).is_some());
        assert_eq!(h.g.state(), ClassicState::CompletingRebalance);
        // A member that syncs with the old generation is refused.
        let w = 999;
        let fx = h.g.sync(
            SyncRequest {
                member_id: c.clone(),
                group_instance_id: None,
                generation_id: 1,
                protocol_type: None,
                protocol_name: None,
                assignments: vec![],
            },
            w,
            h.now,
        );
        assert_eq!(
            sync_reply(&fx, w).unwrap().code(),
            ApiError::IllegalGeneration.code()
        );
    }

    #[test]
    fn follower_rejoining_a_stable_group_with_same_metadata_does_not_rebalance() {
        let mut h = H::new();
        let (a, b) = h.stable_pair();
        let (w, fx) = h.join(&b);
        let r = join_reply(&fx, w).unwrap();
        assert_eq!((r.code(), r.generation_id), (0, 1));
        assert_eq!(r.leader, a);
        assert_eq!(h.g.state(), ClassicState::Stable);
        // The leader rejoining forces one (topic metadata may have changed).
        let (_, fx) = h.join(&a);
        assert!(fx.replies.is_empty());
        assert_eq!(h.g.state(), ClassicState::PreparingRebalance);
    }

    #[test]
    fn changed_metadata_in_stable_rebalances() {
        // Cooperative consumers rejoin with their owned partitions in the
        // metadata: a follow-up rebalance is just another join round.
        let mut h = H::new();
        let (a, b) = h.stable_pair();
        let mut req = h.request(&b, None);
        req.protocols = protos(&[("range", b"owned:1")]);
        let (wb, fx) = h.join_with(req);
        assert!(fx.replies.is_empty());
        assert_eq!(h.g.state(), ClassicState::PreparingRebalance);
        let (wa, fx) = h.join(&a);
        assert_eq!(join_reply(&fx, wa).unwrap().generation_id, 2);
        let leader_view = &join_reply(&fx, wa).unwrap().members;
        let b_meta = leader_view.iter().find(|m| m.member_id == b).unwrap();
        assert_eq!(b_meta.metadata.as_ref(), b"owned:1");
        assert!(join_reply(&fx, wb).is_some());
    }

    #[test]
    fn protocol_selection_needs_every_member() {
        let mut h = H::new();
        let mut r1 = h.request("", None);
        r1.requires_known_member_id = false;
        r1.protocols = protos(&[("cooperative-sticky", b"c"), ("range", b"r")]);
        let (w1, _) = h.join_with(r1);
        let mut r2 = h.request("", None);
        r2.requires_known_member_id = false;
        r2.protocols = protos(&[("range", b"r"), ("cooperative-sticky", b"c")]);
        h.join_with(r2);
        let mut r3 = h.request("", None);
        r3.requires_known_member_id = false;
        r3.protocols = protos(&[("cooperative-sticky", b"c")]);
        h.join_with(r3);
        let fx = h.settle();
        let r = join_reply(&fx, w1).unwrap();
        assert_eq!(r.protocol_name.as_deref(), Some("cooperative-sticky"));
        // The leader gets each member's metadata for the chosen protocol.
        assert!(r.members.iter().all(|m| m.metadata.as_ref() == b"c"));

        // A member with no protocol in common is refused.
        let mut r4 = h.request("", None);
        r4.requires_known_member_id = false;
        r4.protocols = protos(&[("roundrobin", b"x")]);
        let (w4, fx) = h.join_with(r4);
        assert_eq!(
            join_reply(&fx, w4).unwrap().code(),
            ApiError::InconsistentGroupProtocol.code()
        );
        let mut r5 = h.request("", None);
        r5.protocol_type = "connect".into();
        let (w5, fx) = h.join_with(r5);
        assert_eq!(
            join_reply(&fx, w5).unwrap().code(),
            ApiError::InconsistentGroupProtocol.code()
        );
    }

    #[test]
    fn first_member_needs_protocol_type_and_protocols() {
        let mut h = H::new();
        let mut req = h.request("", None);
        req.protocol_type = String::new();
        let (w, fx) = h.join_with(req);
        assert_eq!(
            join_reply(&fx, w).unwrap().code(),
            ApiError::InconsistentGroupProtocol.code()
        );
        let mut req = h.request("", None);
        req.protocols.clear();
        let (w, fx) = h.join_with(req);
        assert_eq!(
            join_reply(&fx, w).unwrap().code(),
            ApiError::InconsistentGroupProtocol.code()
        );
    }

    #[test]
    fn session_timeout_must_be_in_range() {
        let mut h = H::new();
        for t in [999, 60_001] {
            let mut req = h.request("", None);
            req.session_timeout_ms = t;
            let (w, fx) = h.join_with(req);
            assert_eq!(
                join_reply(&fx, w).unwrap().code(),
                ApiError::InvalidSessionTimeout.code()
            );
        }
    }

    #[test]
    fn unknown_member_join_is_refused() {
        let mut h = H::new();
        let (w, fx) = h.join("ghost");
        assert_eq!(
            join_reply(&fx, w).unwrap().code(),
            ApiError::UnknownMemberId.code()
        );
    }

    #[test]
    fn leaving_members_rebalance_and_the_last_one_empties_the_group() {
        let mut h = H::new();
        let (a, b) = h.stable_pair();
        let (results, fx) = h.g.leave(&[(b.clone(), None)], h.now);
        assert!(results.unwrap()[0].is_ok());
        assert!(!fx.store);
        assert_eq!(h.g.state(), ClassicState::PreparingRebalance);
        let (w, fx) = h.join(&a);
        let r = join_reply(&fx, w).unwrap();
        assert_eq!((r.generation_id, r.members.len()), (2, 1));
        let (results, fx) =
            h.g.leave(&[(a.clone(), None), ("ghost".into(), None)], h.now);
        let results = results.unwrap();
        assert!(results[0].is_ok());
        assert_eq!(results[1].as_ref().unwrap_err().code(), 25);
        assert!(fx.store, "an empty group is persisted");
        assert_eq!(h.g.state(), ClassicState::Empty);
        assert_eq!(h.g.generation_id(), 3);
        assert!(h.g.to_record().members.is_empty());
        assert_eq!(h.g.protocol_type(), Some("consumer"));
    }

    #[test]
    fn session_expiry_removes_the_silent_member() {
        let mut h = H::new();
        let (a, b) = h.stable_pair();
        // a heartbeats, b does not.
        for _ in 0..3 {
            h.now += 3_000;
            assert_eq!(h.heartbeat(&a), 0);
            assert!(h.g.tick(h.now).replies.is_empty());
        }
        h.now += 1_000;
        h.g.tick(h.now);
        assert!(h.g.member(&b).is_none(), "b expired");
        assert_eq!(h.g.state(), ClassicState::PreparingRebalance);
        assert_eq!(h.heartbeat(&a), ApiError::RebalanceInProgress.code());
        let (w, fx) = h.join(&a);
        assert_eq!(join_reply(&fx, w).unwrap().members.len(), 1);
    }

    #[test]
    fn rebalance_timeout_drops_members_that_did_not_rejoin() {
        let mut h = H::new();
        let (a, b) = h.stable_pair();
        let (wa, _) = {
            // b keeps heartbeating but never rejoins.
            h.new_member()
        };
        let _ = wa;
        let (w, _) = h.join(&a);
        let mut answered = None;
        for _ in 0..(REBALANCE / 1000) {
            h.now += 1_000;
            let _ = h.heartbeat(&b);
            let fx = h.g.tick(h.now);
            if let Some(r) = join_reply(&fx, w) {
                answered = Some(r.clone());
                break;
            }
        }
        let r = answered.expect("join completed at the rebalance timeout");
        assert_eq!(r.members.len(), 2);
        assert!(h.g.member(&b).is_none());
    }

    #[test]
    fn member_that_never_syncs_is_removed_after_rebalance_timeout() {
        let mut h = H::new();
        let (a, wa) = h.new_member();
        let (b, _) = h.new_member();
        let fx = h.settle();
        assert!(join_reply(&fx, wa).is_some());
        h.sync(&a, &[(&a, b"A"), (&b, b"B")]);
        assert_eq!(h.g.state(), ClassicState::Stable);
        // b never sends SyncGroup (but heartbeats).
        for _ in 0..(REBALANCE / 5000) {
            h.now += 5_000;
            let _ = h.heartbeat(&a);
            let _ = h.heartbeat(&b);
            h.g.tick(h.now);
        }
        assert!(h.g.member(&b).is_none());
        assert_eq!(h.g.state(), ClassicState::PreparingRebalance);
    }

    #[test]
    fn new_member_parked_too_long_expires() {
        let mut cfg = config();
        cfg.new_member_join_timeout_ms = 7_000;
        let mut h = H::with(cfg);
        let (a, b) = h.stable_pair();
        let (c, wc) = h.new_member();
        // a and b keep heartbeating and never rejoin; the join phase lasts
        // the rebalance timeout, but c's parked join expires first.
        let mut c_answer = None;
        for _ in 0..10 {
            h.now += 1_000;
            let _ = h.heartbeat(&a);
            let _ = h.heartbeat(&b);
            let fx = h.g.tick(h.now);
            if let Some(r) = join_reply(&fx, wc) {
                c_answer = Some(r.code());
                break;
            }
        }
        assert_eq!(c_answer, Some(ApiError::UnknownMemberId.code()));
        assert!(h.g.member(&c).is_none());
    }

    #[test]
    fn newer_join_supersedes_a_parked_one() {
        let mut h = H::new();
        let (id, w1) = h.new_member();
        let (w2, fx) = h.join(&id);
        assert_eq!(
            join_reply(&fx, w1).unwrap().code(),
            ApiError::RebalanceInProgress.code()
        );
        let fx = h.settle();
        assert!(join_reply(&fx, w2).is_some());
    }

    fn static_pair(h: &mut H) -> (String, String) {
        let ra = h.request("", Some("ia"));
        let (wa, fx) = h.join_with(ra);
        assert!(
            fx.replies.is_empty(),
            "static members skip MEMBER_ID_REQUIRED"
        );
        let rb = h.request("", Some("ib"));
        let (wb, _) = h.join_with(rb);
        let fx = h.settle();
        let a = join_reply(&fx, wa).unwrap().member_id.clone();
        let b = join_reply(&fx, wb).unwrap().member_id.clone();
        assert!(a.starts_with("ia-"));
        h.sync_as(&b, Some("ib"), &[]);
        let (_, fx) = h.sync_as(&a, Some("ia"), &[(&a, b"A"), (&b, b"B")]);
        assert!(fx.store);
        (a, b)
    }

    #[test]
    fn static_member_restart_gets_its_assignment_back_without_rebalance() {
        let mut h = H::new();
        let (a, b) = static_pair(&mut h);
        let req = h.request("", Some("ib"));
        let (w, fx) = h.join_with(req);
        assert!(fx.store, "the new member id is persisted");
        let r = join_reply(&fx, w).unwrap();
        assert_eq!((r.code(), r.generation_id), (0, 1));
        assert_eq!(r.leader, a);
        let new_b = r.member_id.clone();
        assert_ne!(new_b, b);
        assert_eq!(h.g.state(), ClassicState::Stable);
        let (sw, fx) = h.sync_as(&new_b, Some("ib"), &[]);
        assert_eq!(sync_reply(&fx, sw).unwrap().assignment.as_ref(), b"B");
        // The old instance is fenced everywhere.
        assert_eq!(
            h.g.heartbeat(&b, Some("ib"), 1, h.now).unwrap_err().code(),
            ApiError::FencedInstanceId.code()
        );
        let (w, fx) = {
            let req = h.request(&b, Some("ib"));
            h.join_with(req)
        };
        assert_eq!(
            join_reply(&fx, w).unwrap().code(),
            ApiError::FencedInstanceId.code()
        );
        assert_eq!(
            h.g.validate_offset_commit(&b, Some("ib"), 1)
                .unwrap_err()
                .code(),
            ApiError::FencedInstanceId.code()
        );
        assert!(h.g.validate_offset_commit(&new_b, Some("ib"), 1).is_ok());
        assert_eq!(h.g.static_member_id("ib"), Some(new_b.as_str()));
    }

    #[test]
    fn static_leader_restart_does_not_recompute_the_assignment() {
        let mut h = H::new();
        let (a, _) = static_pair(&mut h);
        // Before v9 the old leader id comes back, so the client acts as a follower.
        let req = h.request("", Some("ia"));
        let (w, fx) = h.join_with(req);
        let r = join_reply(&fx, w).unwrap();
        assert_eq!(r.leader, a);
        assert!(!r.skip_assignment && r.members.is_empty());
        let new_a = r.member_id.clone();
        assert_eq!(h.g.leader_id(), Some(new_a.as_str()));
        // v9+: it is told it leads, with the members, and to skip assigning.
        let mut req = h.request("", Some("ia"));
        req.supports_skip_assignment = true;
        let (w, fx) = h.join_with(req);
        let r = join_reply(&fx, w).unwrap();
        assert_eq!(r.leader, r.member_id);
        assert!(r.skip_assignment);
        assert_eq!(r.members.len(), 2);
    }

    #[test]
    fn static_member_with_new_protocols_triggers_rebalance() {
        let mut h = H::new();
        static_pair(&mut h);
        let mut req = h.request("", Some("ib"));
        req.protocols = protos(&[("roundrobin", b"x"), ("range", b"r")]);
        let (w, fx) = h.join_with(req);
        // Same selected protocol (range): no rebalance.
        assert!(join_reply(&fx, w).is_some());
        assert_eq!(h.g.state(), ClassicState::Stable);

        let mut h = H::new();
        let mut ra = h.request("", Some("ia"));
        ra.protocols = protos(&[("range", b"r"), ("roundrobin", b"x")]);
        let (wa, _) = h.join_with(ra);
        let mut rb = h.request("", Some("ib"));
        rb.protocols = protos(&[("range", b"r"), ("roundrobin", b"x")]);
        h.join_with(rb);
        let fx = h.settle();
        let a = join_reply(&fx, wa).unwrap().member_id.clone();
        h.sync_as(&a, Some("ia"), &[]);
        assert_eq!(h.g.state(), ClassicState::Stable);
        // b now prefers roundrobin: the vote is tied 1-1, a (first) wins... so
        // make b support only roundrobin: the selection must change.
        let mut rb = h.request("", Some("ib"));
        rb.protocols = protos(&[("roundrobin", b"x")]);
        let (w, fx) = h.join_with(rb);
        assert!(join_reply(&fx, w).is_none(), "parked in a rebalance");
        assert_eq!(h.g.state(), ClassicState::PreparingRebalance);
    }

    #[test]
    fn static_member_rejoining_during_completing_rebalance_restarts_it() {
        let mut h = H::new();
        let ra = h.request("", Some("ia"));
        let (wa, _) = h.join_with(ra);
        let rb = h.request("", Some("ib"));
        let (wb, _) = h.join_with(rb);
        let fx = h.settle();
        let old_b = join_reply(&fx, wb).unwrap().member_id.clone();
        assert!(join_reply(&fx, wa).is_some());
        let (sw, _) = h.sync_as(&old_b, Some("ib"), &[]);
        assert_eq!(h.g.state(), ClassicState::CompletingRebalance);
        let rb = h.request("", Some("ib"));
        let (_, fx) = h.join_with(rb);
        assert_eq!(
            sync_reply(&fx, sw).unwrap().code(),
            ApiError::FencedInstanceId.code()
        );
        assert_eq!(h.g.state(), ClassicState::PreparingRebalance);
    }

    #[test]
    fn static_members_survive_a_rebalance_they_miss_until_their_session_ends() {
        let mut h = H::new();
        let (a, b) = static_pair(&mut h);
        // a rejoins (leader asks for rebalance), b is offline.
        let ra = h.request(&a, Some("ia"));
        let (w, _) = h.join_with(ra);
        let fx = h.advance(SESSION as i64 - 1);
        assert!(join_reply(&fx, w).is_none());
        // b's session expires: it is removed and the join completes.
        let fx = h.advance(1);
        let r = join_reply(&fx, w).expect("completed");
        assert_eq!(r.members.len(), 1);
        assert!(h.g.member(&b).is_none());
        assert_eq!(h.g.static_member_id("ib"), None);
    }

    #[test]
    fn admin_can_remove_a_static_member_by_instance_id() {
        let mut h = H::new();
        let (_, b) = static_pair(&mut h);
        let (r, _) = h.g.leave(&[(String::new(), Some("ib".into()))], h.now);
        assert!(r.unwrap()[0].is_ok());
        assert!(h.g.member(&b).is_none());
        let (r, _) = h.g.leave(&[(String::new(), Some("ib".into()))], h.now);
        assert_eq!(r.unwrap()[0].as_ref().unwrap_err().code(), 25);
        let (r, _) = h.g.leave(&[("wrong".into(), Some("ia".into()))], h.now);
        assert_eq!(r.unwrap()[0].as_ref().unwrap_err().code(), 82);
    }

    #[test]
    fn offset_commit_fencing() {
        let mut h = H::new();
        // Empty group: simple commits only.
        assert!(h.g.validate_offset_commit("", None, -1).is_ok());
        assert_eq!(
            h.g.validate_offset_commit("m", None, 1).unwrap_err().code(),
            25
        );
        let (a, _) = h.stable_pair();
        assert!(h.g.validate_offset_commit(&a, None, 1).is_ok());
        assert_eq!(
            h.g.validate_offset_commit(&a, None, 0).unwrap_err().code(),
            22
        );
        assert_eq!(
            h.g.validate_offset_commit("ghost", None, 1)
                .unwrap_err()
                .code(),
            25
        );
        // A simple commit into a group with members is refused.
        assert_eq!(
            h.g.validate_offset_commit("", None, -1).unwrap_err().code(),
            25
        );
        // While rebalancing, the current generation may still commit (eager
        // consumers commit before revoking).
        h.new_member();
        assert_eq!(h.g.state(), ClassicState::PreparingRebalance);
        assert!(h.g.validate_offset_commit(&a, None, 1).is_ok());
        // In CompletingRebalance the generation moved on: REBALANCE_IN_PROGRESS.
        let mut h = H::new();
        let (a, wa) = h.new_member();
        let fx = h.settle();
        assert!(join_reply(&fx, wa).is_some());
        assert_eq!(
            h.g.validate_offset_commit(&a, None, 1).unwrap_err().code(),
            27
        );
    }

    #[test]
    fn delete_rules() {
        let mut h = H::new();
        assert!(h.g.validate_delete().is_ok());
        assert!(h.g.validate_offset_delete().is_ok());
        h.stable_pair();
        assert_eq!(h.g.validate_delete().unwrap_err().code(), 68);
        assert!(
            h.g.validate_offset_delete().is_ok(),
            "consumer groups: per topic"
        );
        let fx = h.g.mark_dead(h.now);
        assert!(fx.replies.is_empty());
        assert_eq!(h.g.validate_delete().unwrap_err().code(), 69);
        assert!(h.g.next_deadline().is_none());
        let (w, fx) = h.join("");
        assert_eq!(join_reply(&fx, w).unwrap().code(), 15);
    }

    #[test]
    fn subscribed_topics_come_from_consumer_metadata() {
        let mut h = H::new();
        let mut req = h.request("", None);
        req.requires_known_member_id = false;
        req.protocols = vec![Protocol {
            name: "range".into(),
            metadata: Bytes::from(subscription(&["t1", "t2"])),
        }];
        let (w, _) = h.join_with(req);
        let fx = h.settle();
        assert!(join_reply(&fx, w).is_some());
        assert!(h.g.is_subscribed_to_topic("t1"));
        assert!(!h.g.is_subscribed_to_topic("t3"));
        assert_eq!(
            parse_subscription_topics(&subscription(&["x"])),
            Some(vec!["x".to_string()])
        );
        assert_eq!(parse_subscription_topics(&[0, 0, 0]), None);
    }

    #[test]
    fn unparsable_subscriptions_count_as_subscribed_to_everything() {
        let mut h = H::new();
        h.stable_pair();
        assert!(h.g.subscribed_topics().is_none());
        assert!(h.g.is_subscribed_to_topic("anything"));
    }

    #[test]
    fn describe_shows_metadata_only_when_stable() {
        let mut h = H::new();
        let (a, wa) = h.new_member();
        let fx = h.settle();
        assert!(join_reply(&fx, wa).is_some());
        let (protocol, members) = h.g.describe();
        assert!(protocol.is_none() && members[0].metadata.is_empty());
        h.sync(&a, &[(&a, b"A")]);
        let (protocol, members) = h.g.describe();
        assert_eq!(protocol.as_deref(), Some("range"));
        assert_eq!(members[0].metadata.as_ref(), b"r");
        assert_eq!(members[0].assignment.as_ref(), b"A");
        assert_eq!(members[0].client_host, "/127.0.0.1");
    }

    #[test]
    fn group_max_size() {
        let mut cfg = config();
        cfg.max_size = 1;
        let mut h = H::with(cfg);
        h.new_member();
        let mut req = h.request("", None);
        req.requires_known_member_id = false;
        let (w, fx) = h.join_with(req);
        assert_eq!(
            join_reply(&fx, w).unwrap().code(),
            ApiError::GroupMaxSizeReached.code()
        );
    }

    #[test]
    fn loaded_group_keeps_serving_its_members() {
        let mut h = H::new();
        let (a, b) = h.stable_pair();
        let rec = h.g.to_record();
        let mut g = ClassicGroup::from_record("g", config(), &rec, h.now);
        assert_eq!(g.state(), ClassicState::Stable);
        assert_eq!(g.generation_id(), 1);
        assert_eq!(g.leader_id(), Some(a.as_str()));
        assert!(g.heartbeat(&b, None, 1, h.now).is_ok());
        let fx = g.sync(
            SyncRequest {
                member_id: b.clone(),
                group_instance_id: None,
                generation_id: 1,
                protocol_type: None,
                protocol_name: None,
                assignments: vec![],
            },
            5,
            h.now,
        );
        assert_eq!(sync_reply(&fx, 5).unwrap().assignment.as_ref(), b"B");
        // Members that never come back expire after their session.
        let fx = g.tick(h.now + SESSION as i64);
        assert!(fx.replies.is_empty());
        assert_eq!(g.num_members(), 0);
        assert_eq!(g.state(), ClassicState::Empty);
        assert_eq!(g.generation_id(), 2);

        // An empty record loads an empty group.
        let empty = ClassicGroup::new("e", config(), 0).to_record();
        let g = ClassicGroup::from_record("e", config(), &empty, 0);
        assert_eq!(g.state(), ClassicState::Empty);
        assert_eq!(g.protocol_type(), None);
    }

    #[test]
    fn store_failure_of_the_assignment_rebalances() {
        let mut h = H::new();
        let (a, wa) = h.new_member();
        let (b, _) = h.new_member();
        let fx = h.settle();
        assert!(join_reply(&fx, wa).is_some());
        let (sb, _) = h.sync(&b, &[]);
        // The leader's sync ran on a copy that could not be persisted; the
        // original gets the failure.
        let fx =
            h.g.assignment_store_failed(1, ApiError::NotCoordinator, h.now);
        assert_eq!(sync_reply(&fx, sb).unwrap().code(), 16);
        assert_eq!(h.g.state(), ClassicState::PreparingRebalance);
        let _ = a;
    }
}
