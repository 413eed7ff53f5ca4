//! KIP-848 consumer groups in the coordinator: ConsumerGroupHeartbeat and
//! ConsumerGroupDescribe over the shared group namespace and offsets store.
//!
//! The protocol itself is [`super::consumer_protocol`] (pure); this module
//! locks the group, runs it through the coordinator's transaction, and
//! makes every change durable first, as Kafka's records in
//! `__consumer_offsets` ([`change_records`]: group epoch, member metadata,
//! target assignment, current member assignments; tombstones for removed
//! members and groups). The coordinator replays them at start
//! ([`GroupCoordinator::replay_consumer`]), so after a restart the group is
//! back with its members, epochs and assignments and members that keep
//! heartbeating carry on (session timers restart at load). It also ties
//! classic and consumer groups together the way Kafka does:
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
//!   consumer group, or holds as an empty classic one (a deleted or
//!   converted group), is UNKNOWN_MEMBER_ID, so the member rejoins.

use std::sync::Arc;

use super::classic::{
    self, ClassicConfig, ClassicGroup, JoinRequest, JoinResult, Reply, SyncResult,
};
use super::consumer_protocol::{
    validate_heartbeat, Assignor, ConsumerGroup, ConsumerGroupConfig, ConsumerGroupError,
    DescribedGroup, GroupState as ConsumerState, HeartbeatInput, HeartbeatOutput,
    JOIN_GROUP_MEMBER_EPOCH, LEAVE_GROUP_STATIC_MEMBER_EPOCH, PROTOCOL_TYPE,
};
use super::consumer_protocol::{Member, MemberState};
use super::records::{
    ConsumerCurrentAssignmentValue, ConsumerMemberMetadataValue, CoordinatorRecord,
};
use super::{
    Group, GroupCoordinator, GroupDescription, GroupEntry, GroupKind, GroupSlot, GroupState,
    Outcome,
};
use crate::GroupConfig;
use tessera_server_common::coordinator::PartitionWriter;
use tessera_server_common::error::ApiError;

/// The consumer group protocol's settings from the broker's.
pub fn consumer_config(config: &GroupConfig) -> ConsumerGroupConfig {
    ConsumerGroupConfig {
        session_timeout_ms: config.consumer_session_timeout_ms,
        heartbeat_interval_ms: config.consumer_heartbeat_interval_ms,
        max_size: config.consumer_max_size,
        assignors: config
            .consumer_assignors
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
            other => ApiError::Coded {
                code: other.kafka(),
                message: other.to_string(),
            },
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
/// passed are fenced (and that is persisted).
pub(super) fn tick(group_id: &str, group: &mut ConsumerGroup, now: i64) -> Outcome {
    let before = group.clone();
    let expired = group.expire_members(now);
    if expired.is_empty() {
        return Outcome::default();
    }
    for e in expired {
        tracing::info!(group = group_id, member = %e.member_id, "consumer group member fenced: {}", e.reason);
    }
    Outcome {
        replies: vec![],
        records: change_records(group_id, &before, group),
    }
}

/// `ConsumerGroupMemberMetadataValue` of a member.
pub fn member_metadata(m: &Member) -> ConsumerMemberMetadataValue {
    ConsumerMemberMetadataValue {
        instance_id: m.instance_id.clone(),
        rack_id: m.rack_id.clone(),
        client_id: m.client_id.clone(),
        client_host: m.client_host.clone(),
        subscribed_topic_names: m.subscribed_topic_names.iter().cloned().collect(),
        subscribed_topic_regex: None,
        rebalance_timeout_ms: m.rebalance_timeout_ms,
        server_assignor: m.server_assignor.map(|a| a.name().to_string()),
    }
}

/// `ConsumerGroupCurrentMemberAssignmentValue` of a member.
pub fn current_assignment(m: &Member) -> ConsumerCurrentAssignmentValue {
    ConsumerCurrentAssignmentValue {
        member_epoch: m.member_epoch,
        previous_member_epoch: m.previous_member_epoch,
        state: match m.state {
            MemberState::Stable => 0,
            MemberState::UnrevokedPartitions => 1,
            MemberState::UnreleasedPartitions => 2,
        },
        assigned: m.assigned.clone(),
        pending_revocation: m.pending_revocation.clone(),
    }
}

/// The records that take a consumer group from `before` to `after`, in
/// Kafka's order: removed members' tombstones (current assignment, target,
/// metadata), then new or changed member metadata, the group epoch, target
/// assignments and their epoch, and members' current assignments.
pub fn change_records(
    group_id: &str,
    before: &ConsumerGroup,
    after: &ConsumerGroup,
) -> Vec<CoordinatorRecord> {
    let group = || group_id.to_string();
    let mut out = Vec::new();
    for m in before.members() {
        if after.member(&m.member_id).is_none() {
            out.push(CoordinatorRecord::ConsumerCurrentMemberAssignment {
                group: group(),
                member: m.member_id.clone(),
                value: None,
            });
            if before.target_assignment(&m.member_id).is_some()
                && after.target_assignment(&m.member_id).is_none()
            {
                out.push(CoordinatorRecord::ConsumerTargetAssignmentMember {
                    group: group(),
                    member: m.member_id.clone(),
                    value: None,
                });
            }
            out.push(CoordinatorRecord::ConsumerMemberMetadata {
                group: group(),
                member: m.member_id.clone(),
                value: None,
            });
        }
    }
    // Targets of ids that were not members (a replaced static member's).
    for (id, _) in before.targets() {
        if after.target_assignment(id).is_none() && before.member(id).is_none() {
            out.push(CoordinatorRecord::ConsumerTargetAssignmentMember {
                group: group(),
                member: id.clone(),
                value: None,
            });
        }
    }
    for m in after.members() {
        let value = member_metadata(m);
        if before.member(&m.member_id).map(member_metadata).as_ref() != Some(&value) {
            out.push(CoordinatorRecord::ConsumerMemberMetadata {
                group: group(),
                member: m.member_id.clone(),
                value: Some(value),
            });
        }
    }
    if after.group_epoch() != before.group_epoch() {
        out.push(CoordinatorRecord::ConsumerGroupMetadata {
            group: group(),
            epoch: Some(after.group_epoch()),
        });
    }
    for (id, target) in after.targets() {
        if before.target_assignment(id) != Some(target) {
            out.push(CoordinatorRecord::ConsumerTargetAssignmentMember {
                group: group(),
                member: id.clone(),
                value: Some(target.clone()),
            });
        }
    }
    for (id, _) in before.targets() {
        if after.target_assignment(id).is_none() && after.member(id).is_some() {
            out.push(CoordinatorRecord::ConsumerTargetAssignmentMember {
                group: group(),
                member: id.clone(),
                value: None,
            });
        }
    }
    if after.assignment_epoch() != before.assignment_epoch() {
        out.push(CoordinatorRecord::ConsumerTargetAssignmentMetadata {
            group: group(),
            epoch: Some(after.assignment_epoch()),
        });
    }
    for m in after.members() {
        let value = current_assignment(m);
        if before.member(&m.member_id).map(current_assignment).as_ref() != Some(&value) {
            out.push(CoordinatorRecord::ConsumerCurrentMemberAssignment {
                group: group(),
                member: m.member_id.clone(),
                value: Some(value),
            });
        }
    }
    out
}

/// The tombstones that delete a consumer group (Kafka's
/// `createGroupTombstoneRecords`): every member's records, the targets,
/// the target assignment epoch and the group epoch.
pub fn deletion_records(group_id: &str, g: &ConsumerGroup) -> Vec<CoordinatorRecord> {
    let group = || group_id.to_string();
    let mut out = Vec::new();
    for m in g.members() {
        out.push(CoordinatorRecord::ConsumerCurrentMemberAssignment {
            group: group(),
            member: m.member_id.clone(),
            value: None,
        });
    }
    for (id, _) in g.targets() {
        out.push(CoordinatorRecord::ConsumerTargetAssignmentMember {
            group: group(),
            member: id.clone(),
            value: None,
        });
    }
    out.push(CoordinatorRecord::ConsumerTargetAssignmentMetadata {
        group: group(),
        epoch: None,
    });
    for m in g.members() {
        out.push(CoordinatorRecord::ConsumerMemberMetadata {
            group: group(),
            member: m.member_id.clone(),
            value: None,
        });
    }
    out.push(CoordinatorRecord::ConsumerGroupMetadata {
        group: group(),
        epoch: None,
    });
    out
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
    let tombstones = match &state.group {
        Group::Consumer(g) if g.is_empty() => deletion_records(group_id, g),
        _ => vec![],
    };
    if tombstones.is_empty() {
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
    // The consumer group's records go first (Kafka's conversion).
    outcome.records.splice(0..0, tombstones);
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

/// Applies one consumer group record to the group it belongs to.
pub fn replay_into(g: &mut ConsumerGroup, rec: CoordinatorRecord) {
    use CoordinatorRecord as R;
    match rec {
        R::ConsumerGroupMetadata { epoch: Some(e), .. } => g.replay_group_epoch(e),
        R::ConsumerTargetAssignmentMetadata { epoch, .. } => {
            g.replay_assignment_epoch(epoch.unwrap_or(0))
        }
        R::ConsumerTargetAssignmentMember { member, value, .. } => g.replay_target(&member, value),
        R::ConsumerMemberMetadata {
            member,
            value: Some(v),
            ..
        } => {
            let m = g.replay_member(&member, true).expect("created");
            m.instance_id = v.instance_id;
            m.rack_id = v.rack_id;
            m.client_id = v.client_id;
            m.client_host = v.client_host;
            m.subscribed_topic_names = v.subscribed_topic_names.into_iter().collect();
            m.rebalance_timeout_ms = v.rebalance_timeout_ms;
            m.server_assignor = v.server_assignor.as_deref().and_then(Assignor::from_name);
        }
        R::ConsumerMemberMetadata {
            member,
            value: None,
            ..
        } => g.replay_remove_member(&member),
        R::ConsumerCurrentMemberAssignment { member, value, .. } => {
            let create = value.is_some();
            let Some(m) = g.replay_member(&member, create) else {
                return;
            };
            // A tombstone leaves the member with nothing, at epoch -1
            // (its metadata tombstone removes it).
            let v = value.unwrap_or(ConsumerCurrentAssignmentValue {
                member_epoch: super::consumer_protocol::LEAVE_GROUP_MEMBER_EPOCH,
                previous_member_epoch: super::consumer_protocol::LEAVE_GROUP_MEMBER_EPOCH,
                ..Default::default()
            });
            m.member_epoch = v.member_epoch;
            m.previous_member_epoch = v.previous_member_epoch;
            m.state = match v.state {
                1 => MemberState::UnrevokedPartitions,
                2 => MemberState::UnreleasedPartitions,
                _ => MemberState::Stable,
            };
            m.assigned = v.assigned;
            m.pending_revocation = v.pending_revocation;
        }
        R::ConsumerGroupMetadata { epoch: None, .. }
        | R::OffsetCommit { .. }
        | R::GroupMetadata { .. }
        | R::Other { .. } => {}
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
    pub async fn consumer_group_heartbeat<W: PartitionWriter + ?Sized>(
        &self,
        writer: &W,
        input: HeartbeatInput,
    ) -> Result<HeartbeatOutput, ConsumerRequestError> {
        validate_heartbeat(&input, &self.consumer)?;
        self.coordinator_partition(writer, &input.group_id)?;
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
        let Some((slot, mut entry)) = self
            .lock_consumer(&group_id, join.then_some(&self.consumer))
            .await
        else {
            return Err(gone());
        };
        let mut convert = false;
        if let Group::Classic(g) = &entry.state.group {
            let empty = g.state() == classic::ClassicState::Empty;
            if join && empty {
                convert = true;
            } else if empty {
                return Err(gone());
            } else {
                return Err(ConsumerGroupError::GroupIdNotFound(format!(
                    "Group {group_id} is not a consumer group."
                ))
                .into());
            }
        }
        let image = writer.image();
        let mut result = None;
        let applied = self
            .transact(writer, &slot, &mut entry, |s, now| {
                let original = convert.then(|| s.group.clone());
                let mut records = Vec::new();
                if convert {
                    // The classic group's metadata is deleted first.
                    s.group = Group::Consumer(ConsumerGroup::new(&group_id, self.consumer.clone()));
                    records.push(CoordinatorRecord::GroupMetadata {
                        group: group_id.clone(),
                        value: None,
                    });
                }
                let Group::Consumer(g) = &mut s.group else {
                    return Outcome::default();
                };
                let before = g.clone();
                let counts = (g.group_epoch(), g.members().count());
                let r = g.heartbeat(&input, &*image, now);
                log_change(&group_id, &input, &r, counts, g);
                if r.is_ok() {
                    if convert {
                        tracing::info!(group = %group_id, "converted the empty classic group to a consumer group");
                    }
                    records.extend(change_records(&group_id, &before, g));
                } else {
                    // A refused heartbeat changes nothing.
                    records.clear();
                    match original {
                        Some(o) => s.group = o,
                        None => *g = before,
                    }
                }
                result = Some(r);
                Outcome {
                    replies: vec![],
                    records,
                }
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

    /// Replays one KIP-848 record at load (Kafka's `GroupMetadataManager.replay`
    /// for consumer group records): a value creates the consumer group (it
    /// replaces what the id held before, keeping its offsets), the group's
    /// tombstone deletes it. [`ConsumerGroup::finish_load`] runs once all
    /// records are in.
    pub(super) fn replay_consumer(
        &self,
        states: &mut std::collections::HashMap<String, GroupState>,
        rec: CoordinatorRecord,
    ) {
        use CoordinatorRecord as R;
        let Some(group_id) = rec.group().map(str::to_string) else {
            return;
        };
        if let R::ConsumerGroupMetadata { epoch: None, .. } = &rec {
            let keep = states.get(&group_id).is_some_and(|s| !s.offsets.is_empty());
            if keep {
                let fresh = self.new_classic(&group_id).group;
                states.get_mut(&group_id).expect("present").group = fresh;
            } else {
                states.remove(&group_id);
            }
            return;
        }
        let create = matches!(
            &rec,
            R::ConsumerGroupMetadata { epoch: Some(_), .. }
                | R::ConsumerTargetAssignmentMetadata { epoch: Some(_), .. }
                | R::ConsumerMemberMetadata { value: Some(_), .. }
                | R::ConsumerTargetAssignmentMember { value: Some(_), .. }
                | R::ConsumerCurrentMemberAssignment { value: Some(_), .. }
        );
        let fresh = || Group::Consumer(ConsumerGroup::new(&group_id, self.consumer.clone()));
        let state = match states.get_mut(&group_id) {
            Some(s) => s,
            None if create => states.entry(group_id.clone()).or_insert(GroupState {
                group: fresh(),
                offsets: Default::default(),
            }),
            None => return,
        };
        if !matches!(state.group, Group::Consumer(_)) {
            if !create {
                return;
            }
            state.group = fresh();
        }
        let Group::Consumer(g) = &mut state.group else {
            return;
        };
        replay_into(g, rec);
    }

    /// ConsumerGroupDescribe for one group.
    pub async fn consumer_group_describe<W: PartitionWriter + ?Sized>(
        &self,
        writer: &W,
        group_id: &str,
    ) -> Result<DescribedGroup, ConsumerRequestError> {
        if group_id.is_empty() {
            return Err(ApiError::InvalidGroupId.into());
        }
        self.coordinator_partition(writer, group_id)?;
        let Some((_slot, entry)) = self.lock(group_id, super::Create::No).await else {
            return Err(ConsumerGroupError::GroupIdNotFound(format!(
                "Group {group_id} not found."
            ))
            .into());
        };
        match &entry.state.group {
            Group::Consumer(g) => Ok(g.describe(&*writer.image())),
            _ => Err(ConsumerGroupError::GroupIdNotFound(format!(
                "Group {group_id} is not a consumer group."
            ))
            .into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::consumer_protocol::{Assignment, TopicId};

    fn topics() -> BTreeMap<String, (TopicId, u32)> {
        BTreeMap::from([
            ("t".to_string(), (uuid::Uuid::from_u128(1), 6)),
            ("u".to_string(), (uuid::Uuid::from_u128(2), 2)),
        ])
    }

    fn hb(member: &str, epoch: i32, owned: Option<&Assignment>) -> HeartbeatInput {
        HeartbeatInput {
            api_version: 1,
            group_id: "g".into(),
            member_id: member.into(),
            member_epoch: epoch,
            rebalance_timeout_ms: if epoch == 0 { 5_000 } else { -1 },
            subscribed_topic_names: (epoch == 0).then(|| vec!["t".into(), "u".into()]),
            owned_partitions: if epoch == 0 {
                Some(vec![])
            } else {
                owned.map(|o| {
                    o.iter()
                        .map(|(t, ps)| (*t, ps.iter().copied().collect()))
                        .collect()
                })
            },
            client_id: "c".into(),
            client_host: "/127.0.0.1".into(),
            ..Default::default()
        }
    }

    /// Replays every record written so far into a fresh group.
    fn reload(records: &[CoordinatorRecord], now: i64) -> ConsumerGroup {
        let mut g = ConsumerGroup::new("g", ConsumerGroupConfig::default());
        for r in records {
            let (k, v) = r.encode();
            replay_into(
                &mut g,
                CoordinatorRecord::decode(k.as_deref(), v.as_deref()).unwrap(),
            );
        }
        g.finish_load(&topics(), now);
        g
    }

    fn same(a: &ConsumerGroup, b: &ConsumerGroup) {
        let t = topics();
        assert_eq!(a.describe(&t), b.describe(&t));
        let ma: Vec<&Member> = a.members().collect();
        let mb: Vec<&Member> = b.members().collect();
        assert_eq!(ma, mb);
        let ta: Vec<_> = a.targets().collect();
        let tb: Vec<_> = b.targets().collect();
        assert_eq!(ta, tb);
        for m in a.members() {
            for (t, ps) in m.assigned.iter().chain(m.pending_revocation.iter()) {
                for p in ps {
                    assert_eq!(b.owner(*t, *p), Some(m.member_id.as_str()));
                }
            }
        }
    }

    /// Every step's records, replayed, give back the group as it was; a
    /// reloaded group goes on exactly like the original.
    #[test]
    fn replaying_the_change_records_rebuilds_the_group() {
        let t = topics();
        let mut g = ConsumerGroup::new("g", ConsumerGroupConfig::default());
        let mut log: Vec<CoordinatorRecord> = Vec::new();
        let mut step = |g: &mut ConsumerGroup, input: HeartbeatInput, now: i64| {
            let before = g.clone();
            let out = g.heartbeat(&input, &t, now).unwrap();
            log.extend(change_records("g", &before, g));
            let loaded = reload(&log, now);
            same(g, &loaded);
            out
        };
        let a = step(&mut g, hb("a", 0, None), 0);
        let a_all = a.assignment.unwrap();
        let mut static_b = hb("b", 0, None);
        static_b.instance_id = Some("i-b".into());
        static_b.server_assignor = Some("range".into());
        step(&mut g, static_b.clone(), 1);
        // a is asked to revoke (UnrevokedPartitions), then acknowledges.
        let r = step(&mut g, hb("a", 1, Some(&a_all)), 2);
        let a_keep = r.assignment.unwrap();
        assert_eq!(
            g.member("a").unwrap().state,
            MemberState::UnrevokedPartitions
        );
        step(&mut g, hb("a", 1, Some(&a_keep)), 3);
        step(&mut g, hb("b", 2, Some(&Assignment::new())), 4);
        // b leaves temporarily, then a new incarnation replaces it.
        let mut leave = hb("b", -2, None);
        leave.instance_id = Some("i-b".into());
        step(&mut g, leave, 5);
        static_b.member_id = "b2".into();
        step(&mut g, static_b, 6);
        assert!(g.member("b").is_none() && g.member("b2").is_some());
        // a leaves for good; the group goes on from the reloaded state.
        step(&mut g, hb("a", -1, None), 7);
        let mut loaded = reload(&log, 8);
        let r1 = g.heartbeat(&hb("b2", 3, None), &t, 8);
        let r2 = loaded.heartbeat(&hb("b2", 3, None), &t, 8);
        assert_eq!(r1, r2);
        same(&g, &loaded);
        // Session timers start at load.
        assert_eq!(reload(&log, 100).next_deadline(), Some(100 + 45_000));

        // Expiry and deletion: only tombstones are left.
        let before = g.clone();
        assert_eq!(g.expire_members(i64::MAX / 2).len(), 1);
        log.extend(change_records("g", &before, &g));
        let loaded = reload(&log, 9);
        same(&g, &loaded);
        assert!(loaded.is_empty());
        let deletion = deletion_records("g", &g);
        assert!(deletion.iter().any(|r| matches!(
            r,
            CoordinatorRecord::ConsumerGroupMetadata { epoch: None, .. }
        )));
    }
}
