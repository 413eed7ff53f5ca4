//! KIP-848 consumer groups in the coordinator: ConsumerGroupHeartbeat and
//! ConsumerGroupDescribe over the shared group namespace and offsets store.
//!
//! The protocol itself is [`super::consumer_protocol`] (pure); this module
//! locks the group, runs it through the coordinator's transaction (nothing
//! is appended: consumer-protocol membership is kept in memory only, so
//! after a restart members rejoin with epoch 0; committed offsets are
//! persisted as for every group), and ties classic and consumer groups
//! together the way Kafka does:
//!
//! * a ConsumerGroupHeartbeat joining a group id held by an empty classic
//!   group (for instance one that only holds offsets) turns it into a
//!   consumer group, keeping its offsets; a non-empty classic group is
//!   GROUP_ID_NOT_FOUND ("not a consumer group");
//! * a JoinGroup for an empty consumer group turns it back into a classic
//!   group; for a non-empty one it is INCONSISTENT_GROUP_PROTOCOL, and the
//!   other classic requests are UNKNOWN_MEMBER_ID for it (mixed groups,
//!   Kafka's online migration, are not supported);
//! * OffsetCommit / OffsetFetch from a consumer-protocol member are fenced
//!   by its member epoch (STALE_MEMBER_EPOCH, UNKNOWN_MEMBER_ID);
//! * a heartbeat (epoch > 0) for a group this broker does not hold as a
//!   consumer group, or holds as an empty classic one (what a restart leaves
//!   of a consumer group), is UNKNOWN_MEMBER_ID, so the member rejoins.

use std::sync::Arc;

use super::classic::{
    self, ClassicConfig, ClassicGroup, JoinRequest, JoinResult, Reply, SyncResult,
};
use super::consumer_protocol::{
    validate_heartbeat, Assignor, ConsumerGroup, ConsumerGroupConfig, ConsumerGroupError,
    DescribedGroup, GroupState as ConsumerState, HeartbeatInput, HeartbeatOutput,
    JOIN_GROUP_MEMBER_EPOCH, LEAVE_GROUP_STATIC_MEMBER_EPOCH, PROTOCOL_TYPE,
};
use super::records::CoordinatorRecord;
use super::{
    Group, GroupCoordinator, GroupDescription, GroupEntry, GroupKind, GroupSlot, GroupState,
    Outcome,
};
use crate::broker::Broker;
use crate::config::BrokerConfig;
use crate::error::ApiError;

/// The consumer group protocol's settings from the broker's.
pub fn consumer_config(config: &BrokerConfig) -> ConsumerGroupConfig {
    ConsumerGroupConfig {
        session_timeout_ms: config.group_consumer_session_timeout_ms,
        heartbeat_interval_ms: config.group_consumer_heartbeat_interval_ms,
        max_size: config.group_consumer_max_size,
        assignors: config
            .group_consumer_assignors
            .iter()
            .filter_map(|n| Assignor::from_name(n))
            .collect(),
    }
}

impl From<ConsumerGroupError> for ApiError {
    fn from(e: ConsumerGroupError) -> ApiError {
        match e {
            ConsumerGroupError::UnknownMemberId(_) => ApiError::UnknownMemberId,
            ConsumerGroupError::GroupIdNotFound(_) => ApiError::GroupIdNotFound,
            ConsumerGroupError::FencedInstanceId(_) => ApiError::FencedInstanceId,
            ConsumerGroupError::GroupMaxSizeReached(_) => ApiError::GroupMaxSizeReached,
            other => ApiError::ConsumerGroup(other),
        }
    }
}

/// An error a ConsumerGroupHeartbeat / ConsumerGroupDescribe answers with:
/// the group's own (with Kafka's message) or the coordinator's.
#[derive(Debug, Clone)]
pub enum ConsumerRequestError {
    Group(ConsumerGroupError),
    Coordinator(ApiError),
}

impl ConsumerRequestError {
    pub fn code(&self) -> i16 {
        match self {
            ConsumerRequestError::Group(e) => e.code(),
            ConsumerRequestError::Coordinator(e) => e.code(),
        }
    }

    pub fn message(&self) -> String {
        match self {
            ConsumerRequestError::Group(e) => e.to_string(),
            ConsumerRequestError::Coordinator(e) => e.to_string(),
        }
    }
}

impl From<ApiError> for ConsumerRequestError {
    fn from(e: ApiError) -> Self {
        ConsumerRequestError::Coordinator(e)
    }
}

impl From<ConsumerGroupError> for ConsumerRequestError {
    fn from(e: ConsumerGroupError) -> Self {
        ConsumerRequestError::Group(e)
    }
}

impl GroupKind for ConsumerGroup {
    fn group_type(&self) -> &'static str {
        super::consumer_protocol::GROUP_TYPE
    }

    fn state_name(&self) -> &'static str {
        self.state().as_str()
    }

    fn protocol_type(&self) -> String {
        PROTOCOL_TYPE.to_string()
    }

    fn validate_offset_commit(
        &self,
        member_id: &str,
        _instance_id: Option<&str>,
        generation_or_epoch: i32,
    ) -> Result<(), ApiError> {
        // The version rule (v9+ for consumer-protocol members) needs the
        // request version, which this hook does not get; KIP-848 clients
        // send v9+ anyway.
        ConsumerGroup::validate_offset_commit(
            self,
            member_id,
            generation_or_epoch,
            super::consumer_protocol::MIN_OFFSET_COMMIT_VERSION,
        )
        .map_err(ApiError::from)
    }

    fn validate_offset_fetch(
        &self,
        member_id: Option<&str>,
        member_epoch: i32,
    ) -> Result<(), ApiError> {
        ConsumerGroup::validate_offset_fetch(self, member_id, member_epoch).map_err(ApiError::from)
    }

    fn validate_offset_delete(&self) -> Result<(), ApiError> {
        Ok(())
    }

    fn validate_delete(&self) -> Result<(), ApiError> {
        if self.state() == ConsumerState::Empty {
            Ok(())
        } else {
            Err(ApiError::NonEmptyGroup)
        }
    }

    fn is_subscribed_to_topic(&self, topic: &str) -> bool {
        self.members()
            .any(|m| m.subscribed_topic_names.contains(topic))
    }

    fn next_deadline(&self) -> Option<i64> {
        ConsumerGroup::next_deadline(self)
    }

    /// DescribeGroups is the classic groups' describe (the coordinator
    /// answers as for a missing group); should it be asked, a consumer group
    /// shows as Dead with no members, as Kafka's before v6.
    fn describe(&self) -> GroupDescription {
        GroupDescription {
            state: "Dead",
            protocol_type: String::new(),
            protocol: String::new(),
            members: vec![],
        }
    }
}

/// The group's due timers: members whose session or rebalance timeout
/// passed are fenced. Nothing is persisted.
pub(super) fn tick(group_id: &str, group: &mut ConsumerGroup, now: i64) -> Outcome {
    for e in group.expire_members(now) {
        tracing::info!(group = group_id, member = %e.member_id, "consumer group member fenced: {}", e.reason);
    }
    Outcome::default()
}

/// Kafka's info logs for joins, leaves and new target assignments.
fn log_change(
    group_id: &str,
    input: &HeartbeatInput,
    result: &Result<HeartbeatOutput, ConsumerGroupError>,
    (epoch_before, members_before): (i32, usize),
    group: &ConsumerGroup,
) {
    match result {
        Ok(out) if input.member_epoch == JOIN_GROUP_MEMBER_EPOCH => tracing::info!(
            group = group_id,
            member = %out.member_id,
            instance = input.instance_id.as_deref().unwrap_or(""),
            client = %input.client_id,
            epoch = out.member_epoch,
            "member joins the consumer group using the consumer protocol"
        ),
        Ok(out) if input.member_epoch < 0 => tracing::info!(
            group = group_id,
            member = %out.member_id,
            temporarily = input.member_epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH,
            "member left the consumer group"
        ),
        Ok(_) => {}
        Err(e) => tracing::debug!(
            group = group_id,
            member = %input.member_id,
            epoch = input.member_epoch,
            error = %e,
            "consumer group heartbeat refused"
        ),
    }
    if group.group_epoch() != epoch_before || group.members().count() != members_before {
        tracing::info!(
            group = group_id,
            group_epoch = group.group_epoch(),
            assignment_epoch = group.assignment_epoch(),
            members = group.members().count(),
            assignor = group.assignor().name(),
            "consumer group changed"
        );
    }
}

/// A JoinGroup (classic protocol) for a group id held by a consumer group:
/// an empty one becomes a classic group and the join proceeds; otherwise
/// INCONSISTENT_GROUP_PROTOCOL.
pub(super) fn classic_join(
    state: &mut GroupState,
    group_id: &str,
    config: &ClassicConfig,
    req: JoinRequest,
    waiter: classic::WaiterId,
    now: i64,
) -> Outcome {
    let empty = matches!(&state.group, Group::Consumer(g) if g.is_empty());
    if !empty {
        return Outcome {
            replies: vec![Reply::Join(
                waiter,
                JoinResult::error(req.member_id.clone(), ApiError::InconsistentGroupProtocol),
            )],
            records: vec![],
        };
    }
    let mut g = ClassicGroup::new(group_id, config.clone(), now);
    let fx = g.join(req, waiter, now);
    let mut outcome = Outcome::classic(group_id, &g, fx);
    if outcome.records.is_empty() {
        // The classic group must exist durably (its first record).
        outcome.records = vec![CoordinatorRecord::GroupMetadata {
            group: group_id.to_string(),
            value: Some(g.to_record()),
        }];
    }
    state.group = Group::Classic(g);
    outcome
}

/// SyncGroup for a consumer group: it has no classic members.
pub(super) fn classic_sync(waiter: classic::WaiterId) -> Outcome {
    Outcome {
        replies: vec![Reply::Sync(
            waiter,
            SyncResult::error(ApiError::UnknownMemberId),
        )],
        records: vec![],
    }
}

impl GroupCoordinator {
    /// Locks a group; a join (`create`) makes a new consumer group when the
    /// id is free. (Like [`GroupCoordinator::lock`], for consumer groups.)
    async fn lock_consumer(
        &self,
        group_id: &str,
        create: Option<&ConsumerGroupConfig>,
    ) -> Option<(Arc<GroupSlot>, tokio::sync::OwnedMutexGuard<GroupEntry>)> {
        loop {
            let slot = {
                let mut groups = self.groups.lock();
                match groups.get(group_id) {
                    Some(s) => s.clone(),
                    None => {
                        let config = create?;
                        let state = GroupState {
                            group: Group::Consumer(ConsumerGroup::new(group_id, config.clone())),
                            offsets: Default::default(),
                        };
                        let slot = self.new_slot(group_id, state, false);
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

    /// ConsumerGroupHeartbeat: join, heartbeat or leave a consumer group.
    pub async fn consumer_group_heartbeat(
        &self,
        broker: &Broker,
        input: HeartbeatInput,
    ) -> Result<HeartbeatOutput, ConsumerRequestError> {
        let config = consumer_config(&broker.config);
        validate_heartbeat(&input, &config)?;
        self.coordinator_partition(broker, &input.group_id)?;
        let group_id = input.group_id.clone();
        let join = input.member_epoch == JOIN_GROUP_MEMBER_EPOCH;
        // Kafka answers GROUP_ID_NOT_FOUND to a member of a group it does
        // not have; here that is what a restart leaves of a consumer group
        // (nothing, or the simple group its offsets rebuild), so the member
        // is told UNKNOWN_MEMBER_ID and rejoins with epoch 0 (Kafka's clients
        // give up on GROUP_ID_NOT_FOUND).
        let gone = || {
            ConsumerRequestError::Group(ConsumerGroupError::UnknownMemberId(format!(
                "Member {} is not a member of group {group_id}.",
                input.member_id
            )))
        };
        let Some((slot, mut entry)) = self.lock_consumer(&group_id, join.then_some(&config)).await
        else {
            return Err(gone());
        };
        if let Group::Classic(g) = &entry.state.group {
            let empty = g.state() == classic::ClassicState::Empty;
            if join && empty {
                tracing::info!(group = %group_id, "converting the empty classic group to a consumer group");
                entry.state.group = Group::Consumer(ConsumerGroup::new(&group_id, config.clone()));
            } else if empty {
                return Err(gone());
            } else {
                return Err(ConsumerGroupError::GroupIdNotFound(format!(
                    "Group {group_id} is not a consumer group."
                ))
                .into());
            }
        }
        let image = broker.image();
        let mut result = None;
        let applied = self
            .transact(broker, &slot, &mut entry, |s, now| {
                if let Group::Consumer(g) = &mut s.group {
                    let before = (g.group_epoch(), g.members().count());
                    let r = g.heartbeat(&input, &*image, now);
                    log_change(&group_id, &input, &r, before, g);
                    result = Some(r);
                }
                Outcome::default()
            })
            .await;
        if let Err(e) = applied {
            return Err(e.into());
        }
        let result = result.expect("the group is a consumer group");
        // A join that failed leaves no trace of a group it would have made.
        if result.is_err() {
            let never_existed = matches!(&entry.state.group, Group::Consumer(g) if g.is_empty() && g.group_epoch() == 0)
                && entry.state.offsets.is_empty();
            if never_existed {
                self.remove_slot(&slot, &mut entry);
            }
        }
        Ok(result?)
    }

    /// ConsumerGroupDescribe for one group.
    pub async fn consumer_group_describe(
        &self,
        broker: &Broker,
        group_id: &str,
    ) -> Result<DescribedGroup, ConsumerRequestError> {
        if group_id.is_empty() {
            return Err(ApiError::InvalidGroupId.into());
        }
        self.coordinator_partition(broker, group_id)?;
        let Some((_slot, entry)) = self.lock(group_id, super::Create::No).await else {
            return Err(ConsumerGroupError::GroupIdNotFound(format!(
                "Group {group_id} not found."
            ))
            .into());
        };
        match &entry.state.group {
            Group::Consumer(g) => Ok(g.describe(&*broker.image())),
            _ => Err(ConsumerGroupError::GroupIdNotFound(format!(
                "Group {group_id} is not a consumer group."
            ))
            .into()),
        }
    }
}
