//! Kafka's `__consumer_offsets` record schemas, byte for byte: a key starts
//! with an int16 record type (Kafka calls it the key version: 0 and 1 are
//! offset commits, 2 is group metadata; 3 and up are KIP-848 and share-group
//! records), a value with an int16 value version.
//!
//! Written: `OffsetCommitKey` type 1, `OffsetCommitValue` v3,
//! `GroupMetadataKey` type 2, `GroupMetadataValue` v3; a delete is the key
//! with a null value (tombstone). Read: every value version Kafka defines
//! (0–4; v4 is the first flexible one), so a log written by Kafka replays.
//!
//! KIP-848 consumer groups (all values v0, flexible; unknown tagged fields
//! are skipped): `ConsumerGroupMetadata` type 3 (group epoch),
//! `ConsumerGroupMemberMetadata` type 5, `ConsumerGroupTargetAssignmentMetadata`
//! type 6 (assignment epoch), `ConsumerGroupTargetAssignmentMember` type 7,
//! `ConsumerGroupCurrentMemberAssignment` type 8. Type 4
//! (`ConsumerGroupPartitionMetadata`, the subscribed topics' metadata) is
//! not written: it is derived from the metadata image at load.

use std::collections::{BTreeMap, BTreeSet};

use bytes::{BufMut, Bytes, BytesMut};
use thiserror::Error;
use uuid::Uuid;

/// Record type of an offset commit key (Kafka writes 1; 0 is the legacy form, same layout).
pub const OFFSET_COMMIT_KEY: i16 = 1;
/// Record type of a group metadata key.
pub const GROUP_METADATA_KEY: i16 = 2;
/// Value versions written.
pub const OFFSET_COMMIT_VALUE_VERSION: i16 = 3;
pub const GROUP_METADATA_VALUE_VERSION: i16 = 3;
/// KIP-848 consumer group record types.
pub const CONSUMER_GROUP_METADATA_KEY: i16 = 3;
pub const CONSUMER_GROUP_MEMBER_METADATA_KEY: i16 = 5;
pub const CONSUMER_GROUP_TARGET_ASSIGNMENT_METADATA_KEY: i16 = 6;
pub const CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER_KEY: i16 = 7;
pub const CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT_KEY: i16 = 8;

/// Partitions by topic id, as the KIP-848 records carry them.
pub type TopicPartitions = BTreeMap<Uuid, BTreeSet<i32>>;

/// `ConsumerGroupMemberMetadataValue` v0 (the classic member metadata
/// tagged field is not kept).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ConsumerMemberMetadataValue {
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub subscribed_topic_names: Vec<String>,
    pub subscribed_topic_regex: Option<String>,
    pub rebalance_timeout_ms: i32,
    pub server_assignor: Option<String>,
}

/// `ConsumerGroupCurrentMemberAssignmentValue` v0.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ConsumerCurrentAssignmentValue {
    pub member_epoch: i32,
    pub previous_member_epoch: i32,
    /// Kafka's `MemberState`: 0 stable, 1 unrevoked, 2 unreleased partitions.
    pub state: i8,
    pub assigned: TopicPartitions,
    pub pending_revocation: TopicPartitions,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum RecordError {
    #[error("record ends early")]
    Truncated,
    #[error("invalid length {0}")]
    InvalidLength(i64),
    #[error("string is not UTF-8")]
    InvalidUtf8,
    #[error("{what} version {version} is not known")]
    UnknownVersion { what: &'static str, version: i16 },
    #[error("record has no key")]
    MissingKey,
    #[error("{0} trailing bytes")]
    Trailing(usize),
}

/// One committed offset, as the value of an offset commit record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OffsetCommitValue {
    pub offset: i64,
    /// -1 when unknown (value versions before 3 have none).
    pub leader_epoch: i32,
    pub metadata: String,
    pub commit_timestamp: i64,
    /// Only value version 1 carries it; -1 otherwise.
    pub expire_timestamp: i64,
}

/// A classic group's state as Kafka persists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupMetadataValue {
    pub protocol_type: String,
    pub generation: i32,
    pub protocol: Option<String>,
    pub leader: Option<String>,
    /// -1 when unknown.
    pub current_state_timestamp: i64,
    pub members: Vec<MemberMetadataValue>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberMetadataValue {
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    /// -1 when the value version has none (v0): the session timeout applies.
    pub rebalance_timeout: i32,
    pub session_timeout: i32,
    pub subscription: Bytes,
    pub assignment: Bytes,
}

/// A decoded `__consumer_offsets` record. `None` values are tombstones.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CoordinatorRecord {
    OffsetCommit {
        group: String,
        topic: String,
        partition: i32,
        value: Option<OffsetCommitValue>,
    },
    GroupMetadata {
        group: String,
        value: Option<GroupMetadataValue>,
    },
    /// Type 3: a consumer group's epoch.
    ConsumerGroupMetadata { group: String, epoch: Option<i32> },
    /// Type 5: a consumer group member's metadata.
    ConsumerMemberMetadata {
        group: String,
        member: String,
        value: Option<ConsumerMemberMetadataValue>,
    },
    /// Type 6: a consumer group's target assignment epoch.
    ConsumerTargetAssignmentMetadata { group: String, epoch: Option<i32> },
    /// Type 7: a member's target assignment.
    ConsumerTargetAssignmentMember {
        group: String,
        member: String,
        value: Option<TopicPartitions>,
    },
    /// Type 8: a member's current assignment and epochs.
    ConsumerCurrentMemberAssignment {
        group: String,
        member: String,
        value: Option<ConsumerCurrentAssignmentValue>,
    },
    /// A record type this build does not read (type 4, share and streams
    /// groups): skipped at replay.
    Other { record_type: i16 },
}

impl CoordinatorRecord {
    /// The record's key and value bytes (value `None` for a tombstone).
    pub fn encode(&self) -> (Option<Bytes>, Option<Bytes>) {
        let mut key = BytesMut::new();
        match self {
            CoordinatorRecord::OffsetCommit {
                group,
                topic,
                partition,
                value,
            } => {
                key.put_i16(OFFSET_COMMIT_KEY);
                put_string(&mut key, group);
                put_string(&mut key, topic);
                key.put_i32(*partition);
                (
                    Some(key.freeze()),
                    value.as_ref().map(encode_offset_commit_value),
                )
            }
            CoordinatorRecord::GroupMetadata { group, value } => {
                key.put_i16(GROUP_METADATA_KEY);
                put_string(&mut key, group);
                (
                    Some(key.freeze()),
                    value.as_ref().map(encode_group_metadata_value),
                )
            }
            CoordinatorRecord::ConsumerGroupMetadata { group, epoch } => {
                key.put_i16(CONSUMER_GROUP_METADATA_KEY);
                put_string(&mut key, group);
                (Some(key.freeze()), epoch.map(encode_epoch_value))
            }
            CoordinatorRecord::ConsumerMemberMetadata {
                group,
                member,
                value,
            } => {
                key.put_i16(CONSUMER_GROUP_MEMBER_METADATA_KEY);
                put_string(&mut key, group);
                put_string(&mut key, member);
                (
                    Some(key.freeze()),
                    value.as_ref().map(encode_member_metadata_value),
                )
            }
            CoordinatorRecord::ConsumerTargetAssignmentMetadata { group, epoch } => {
                key.put_i16(CONSUMER_GROUP_TARGET_ASSIGNMENT_METADATA_KEY);
                put_string(&mut key, group);
                (Some(key.freeze()), epoch.map(encode_epoch_value))
            }
            CoordinatorRecord::ConsumerTargetAssignmentMember {
                group,
                member,
                value,
            } => {
                key.put_i16(CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER_KEY);
                put_string(&mut key, group);
                put_string(&mut key, member);
                (
                    Some(key.freeze()),
                    value.as_ref().map(|tp| {
                        let mut b = BytesMut::new();
                        b.put_i16(0);
                        put_topic_partitions(&mut b, tp);
                        b.put_u8(0);
                        b.freeze()
                    }),
                )
            }
            CoordinatorRecord::ConsumerCurrentMemberAssignment {
                group,
                member,
                value,
            } => {
                key.put_i16(CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT_KEY);
                put_string(&mut key, group);
                put_string(&mut key, member);
                (
                    Some(key.freeze()),
                    value.as_ref().map(encode_current_assignment_value),
                )
            }
            CoordinatorRecord::Other { record_type } => {
                key.put_i16(*record_type);
                (Some(key.freeze()), None)
            }
        }
    }

    /// The group the record belongs to (`None` for unknown types).
    pub fn group(&self) -> Option<&str> {
        match self {
            CoordinatorRecord::OffsetCommit { group, .. }
            | CoordinatorRecord::GroupMetadata { group, .. }
            | CoordinatorRecord::ConsumerGroupMetadata { group, .. }
            | CoordinatorRecord::ConsumerMemberMetadata { group, .. }
            | CoordinatorRecord::ConsumerTargetAssignmentMetadata { group, .. }
            | CoordinatorRecord::ConsumerTargetAssignmentMember { group, .. }
            | CoordinatorRecord::ConsumerCurrentMemberAssignment { group, .. } => Some(group),
            CoordinatorRecord::Other { .. } => None,
        }
    }

    /// Decodes a stored record's key and value.
    pub fn decode(key: Option<&[u8]>, value: Option<&[u8]>) -> Result<Self, RecordError> {
        let key = key.ok_or(RecordError::MissingKey)?;
        let mut r = Reader::new(key);
        let record_type = r.i16()?;
        match record_type {
            0 | 1 => {
                let group = r.string()?;
                let topic = r.string()?;
                let partition = r.i32()?;
                r.finish()?;
                Ok(CoordinatorRecord::OffsetCommit {
                    group,
                    topic,
                    partition,
                    value: value.map(decode_offset_commit_value).transpose()?,
                })
            }
            2 => {
                let group = r.string()?;
                r.finish()?;
                Ok(CoordinatorRecord::GroupMetadata {
                    group,
                    value: value.map(decode_group_metadata_value).transpose()?,
                })
            }
            CONSUMER_GROUP_METADATA_KEY | CONSUMER_GROUP_TARGET_ASSIGNMENT_METADATA_KEY => {
                let group = r.string()?;
                r.finish()?;
                let epoch = value
                    .map(|v| decode_epoch_value(v, record_type))
                    .transpose()?;
                Ok(if record_type == CONSUMER_GROUP_METADATA_KEY {
                    CoordinatorRecord::ConsumerGroupMetadata { group, epoch }
                } else {
                    CoordinatorRecord::ConsumerTargetAssignmentMetadata { group, epoch }
                })
            }
            CONSUMER_GROUP_MEMBER_METADATA_KEY => {
                let group = r.string()?;
                let member = r.string()?;
                r.finish()?;
                Ok(CoordinatorRecord::ConsumerMemberMetadata {
                    group,
                    member,
                    value: value.map(decode_member_metadata_value).transpose()?,
                })
            }
            CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER_KEY => {
                let group = r.string()?;
                let member = r.string()?;
                r.finish()?;
                let value = value
                    .map(|v| {
                        let mut r =
                            Reader::flexible_value(v, "ConsumerGroupTargetAssignmentMemberValue")?;
                        let tp = r.topic_partitions()?;
                        r.tagged_fields()?;
                        Ok::<_, RecordError>(tp)
                    })
                    .transpose()?;
                Ok(CoordinatorRecord::ConsumerTargetAssignmentMember {
                    group,
                    member,
                    value,
                })
            }
            CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT_KEY => {
                let group = r.string()?;
                let member = r.string()?;
                r.finish()?;
                Ok(CoordinatorRecord::ConsumerCurrentMemberAssignment {
                    group,
                    member,
                    value: value.map(decode_current_assignment_value).transpose()?,
                })
            }
            other => Ok(CoordinatorRecord::Other { record_type: other }),
        }
    }
}

/// `ConsumerGroupMetadataValue` / `ConsumerGroupTargetAssignmentMetadataValue`
/// v0: one int32 epoch (their tagged fields are left out).
fn encode_epoch_value(epoch: i32) -> Bytes {
    let mut b = BytesMut::with_capacity(7);
    b.put_i16(0);
    b.put_i32(epoch);
    b.put_u8(0);
    b.freeze()
}

fn decode_epoch_value(bytes: &[u8], record_type: i16) -> Result<i32, RecordError> {
    let what = if record_type == CONSUMER_GROUP_METADATA_KEY {
        "ConsumerGroupMetadataValue"
    } else {
        "ConsumerGroupTargetAssignmentMetadataValue"
    };
    let mut r = Reader::flexible_value(bytes, what)?;
    let epoch = r.i32()?;
    r.tagged_fields()?;
    Ok(epoch)
}

pub fn encode_member_metadata_value(v: &ConsumerMemberMetadataValue) -> Bytes {
    let mut b = BytesMut::new();
    b.put_i16(0);
    put_compact_nullable_string(&mut b, v.instance_id.as_deref());
    put_compact_nullable_string(&mut b, v.rack_id.as_deref());
    put_compact_nullable_string(&mut b, Some(&v.client_id));
    put_compact_nullable_string(&mut b, Some(&v.client_host));
    put_uvarint(&mut b, v.subscribed_topic_names.len() as u64 + 1);
    for n in &v.subscribed_topic_names {
        put_compact_nullable_string(&mut b, Some(n));
    }
    put_compact_nullable_string(&mut b, v.subscribed_topic_regex.as_deref());
    b.put_i32(v.rebalance_timeout_ms);
    put_compact_nullable_string(&mut b, v.server_assignor.as_deref());
    b.put_u8(0);
    b.freeze()
}

pub fn decode_member_metadata_value(
    bytes: &[u8],
) -> Result<ConsumerMemberMetadataValue, RecordError> {
    let mut r = Reader::flexible_value(bytes, "ConsumerGroupMemberMetadataValue")?;
    let instance_id = r.nullable_string()?;
    let rack_id = r.nullable_string()?;
    let client_id = r.string()?;
    let client_host = r.string()?;
    let n = r.array_len()?;
    let mut subscribed_topic_names = Vec::with_capacity(n.min(1024));
    for _ in 0..n {
        subscribed_topic_names.push(r.string()?);
    }
    let subscribed_topic_regex = r.nullable_string()?;
    let rebalance_timeout_ms = r.i32()?;
    let server_assignor = r.nullable_string()?;
    r.tagged_fields()?;
    Ok(ConsumerMemberMetadataValue {
        instance_id,
        rack_id,
        client_id,
        client_host,
        subscribed_topic_names,
        subscribed_topic_regex,
        rebalance_timeout_ms,
        server_assignor,
    })
}

pub fn encode_current_assignment_value(v: &ConsumerCurrentAssignmentValue) -> Bytes {
    let mut b = BytesMut::new();
    b.put_i16(0);
    b.put_i32(v.member_epoch);
    b.put_i32(v.previous_member_epoch);
    b.put_i8(v.state);
    put_topic_partitions(&mut b, &v.assigned);
    put_topic_partitions(&mut b, &v.pending_revocation);
    b.put_u8(0);
    b.freeze()
}

pub fn decode_current_assignment_value(
    bytes: &[u8],
) -> Result<ConsumerCurrentAssignmentValue, RecordError> {
    let mut r = Reader::flexible_value(bytes, "ConsumerGroupCurrentMemberAssignmentValue")?;
    let member_epoch = r.i32()?;
    let previous_member_epoch = r.i32()?;
    let state = r.take(1)?[0] as i8;
    let assigned = r.topic_partitions()?;
    let pending_revocation = r.topic_partitions()?;
    r.tagged_fields()?;
    Ok(ConsumerCurrentAssignmentValue {
        member_epoch,
        previous_member_epoch,
        state,
        assigned,
        pending_revocation,
    })
}

fn put_uvarint(b: &mut BytesMut, mut v: u64) {
    while v >= 0x80 {
        b.put_u8((v as u8) | 0x80);
        v >>= 7;
    }
    b.put_u8(v as u8);
}

fn put_compact_nullable_string(b: &mut BytesMut, s: Option<&str>) {
    match s {
        Some(s) => {
            put_uvarint(b, s.len() as u64 + 1);
            b.put_slice(s.as_bytes());
        }
        None => put_uvarint(b, 0),
    }
}

/// A compact `[]TopicPartitions` (topic id, compact `[]int32`, tagged fields).
fn put_topic_partitions(b: &mut BytesMut, tp: &TopicPartitions) {
    put_uvarint(b, tp.len() as u64 + 1);
    for (topic, partitions) in tp {
        b.put_slice(topic.as_bytes());
        put_uvarint(b, partitions.len() as u64 + 1);
        for p in partitions {
            b.put_i32(*p);
        }
        b.put_u8(0);
    }
}

pub fn encode_offset_commit_value(v: &OffsetCommitValue) -> Bytes {
    let mut b = BytesMut::with_capacity(32 + v.metadata.len());
    b.put_i16(OFFSET_COMMIT_VALUE_VERSION);
    b.put_i64(v.offset);
    b.put_i32(v.leader_epoch);
    put_string(&mut b, &v.metadata);
    b.put_i64(v.commit_timestamp);
    b.freeze()
}

pub fn decode_offset_commit_value(bytes: &[u8]) -> Result<OffsetCommitValue, RecordError> {
    let mut r = Reader::new(bytes);
    let version = r.i16()?;
    if !(0..=4).contains(&version) {
        return Err(RecordError::UnknownVersion {
            what: "OffsetCommitValue",
            version,
        });
    }
    r.flexible = version >= 4;
    let offset = r.i64()?;
    let leader_epoch = if version >= 3 { r.i32()? } else { -1 };
    let metadata = r.string()?;
    let commit_timestamp = r.i64()?;
    let expire_timestamp = if version == 1 { r.i64()? } else { -1 };
    r.tagged_fields()?;
    // Values may grow ignorable fields at the end; Kafka ignores them too.
    Ok(OffsetCommitValue {
        offset,
        leader_epoch,
        metadata,
        commit_timestamp,
        expire_timestamp,
    })
}

pub fn encode_group_metadata_value(v: &GroupMetadataValue) -> Bytes {
    let mut b = BytesMut::new();
    b.put_i16(GROUP_METADATA_VALUE_VERSION);
    put_string(&mut b, &v.protocol_type);
    b.put_i32(v.generation);
    put_nullable_string(&mut b, v.protocol.as_deref());
    put_nullable_string(&mut b, v.leader.as_deref());
    b.put_i64(v.current_state_timestamp);
    b.put_i32(v.members.len() as i32);
    for m in &v.members {
        put_string(&mut b, &m.member_id);
        put_nullable_string(&mut b, m.group_instance_id.as_deref());
        put_string(&mut b, &m.client_id);
        put_string(&mut b, &m.client_host);
        b.put_i32(m.rebalance_timeout);
        b.put_i32(m.session_timeout);
        b.put_i32(m.subscription.len() as i32);
        b.put_slice(&m.subscription);
        b.put_i32(m.assignment.len() as i32);
        b.put_slice(&m.assignment);
    }
    b.freeze()
}

pub fn decode_group_metadata_value(bytes: &[u8]) -> Result<GroupMetadataValue, RecordError> {
    let mut r = Reader::new(bytes);
    let version = r.i16()?;
    if !(0..=4).contains(&version) {
        return Err(RecordError::UnknownVersion {
            what: "GroupMetadataValue",
            version,
        });
    }
    r.flexible = version >= 4;
    let protocol_type = r.string()?;
    let generation = r.i32()?;
    let protocol = r.nullable_string()?;
    let leader = r.nullable_string()?;
    let current_state_timestamp = if version >= 2 { r.i64()? } else { -1 };
    let count = r.array_len()?;
    let mut members = Vec::with_capacity(count.min(1024));
    for _ in 0..count {
        let member_id = r.string()?;
        let group_instance_id = if version >= 3 {
            r.nullable_string()?
        } else {
            None
        };
        let client_id = r.string()?;
        let client_host = r.string()?;
        let rebalance_timeout = if version >= 1 { r.i32()? } else { -1 };
        let session_timeout = r.i32()?;
        let subscription = r.bytes()?;
        let assignment = r.bytes()?;
        r.tagged_fields()?;
        members.push(MemberMetadataValue {
            member_id,
            group_instance_id,
            client_id,
            client_host,
            rebalance_timeout,
            session_timeout,
            subscription,
            assignment,
        });
    }
    r.tagged_fields()?;
    Ok(GroupMetadataValue {
        protocol_type,
        generation,
        protocol,
        leader,
        current_state_timestamp,
        members,
    })
}

fn put_string(b: &mut BytesMut, s: &str) {
    b.put_i16(s.len() as i16);
    b.put_slice(s.as_bytes());
}

fn put_nullable_string(b: &mut BytesMut, s: Option<&str>) {
    match s {
        Some(s) => put_string(b, s),
        None => b.put_i16(-1),
    }
}

/// Reads Kafka's primitive types; `flexible` switches strings, bytes and
/// arrays to their compact forms and enables tagged fields.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    flexible: bool,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Reader {
            buf,
            pos: 0,
            flexible: false,
        }
    }

    /// A flexible v0 value (the only version of the KIP-848 values).
    fn flexible_value(buf: &'a [u8], what: &'static str) -> Result<Self, RecordError> {
        let mut r = Reader::new(buf);
        let version = r.i16()?;
        if version != 0 {
            return Err(RecordError::UnknownVersion { what, version });
        }
        r.flexible = true;
        Ok(r)
    }

    fn topic_partitions(&mut self) -> Result<TopicPartitions, RecordError> {
        let n = self.array_len()?;
        let mut out = TopicPartitions::new();
        for _ in 0..n {
            let topic = Uuid::from_bytes(self.take(16)?.try_into().unwrap());
            let count = self.array_len()?;
            let mut partitions = BTreeSet::new();
            for _ in 0..count {
                partitions.insert(self.i32()?);
            }
            self.tagged_fields()?;
            if !partitions.is_empty() {
                out.entry(topic).or_default().extend(partitions);
            }
        }
        Ok(out)
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], RecordError> {
        if self.buf.len() - self.pos < n {
            return Err(RecordError::Truncated);
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn i16(&mut self) -> Result<i16, RecordError> {
        Ok(i16::from_be_bytes(self.take(2)?.try_into().unwrap()))
    }

    fn i32(&mut self) -> Result<i32, RecordError> {
        Ok(i32::from_be_bytes(self.take(4)?.try_into().unwrap()))
    }

    fn i64(&mut self) -> Result<i64, RecordError> {
        Ok(i64::from_be_bytes(self.take(8)?.try_into().unwrap()))
    }

    fn uvarint(&mut self) -> Result<u64, RecordError> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.take(1)?[0];
            value |= ((b & 0x7f) as u64) << shift;
            if b & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(RecordError::InvalidLength(-1))
    }

    /// A length: -1 is null.
    fn length(&mut self, wide: bool) -> Result<i64, RecordError> {
        if self.flexible {
            Ok(self.uvarint()? as i64 - 1)
        } else if wide {
            Ok(self.i32()? as i64)
        } else {
            Ok(self.i16()? as i64)
        }
    }

    fn nullable_string(&mut self) -> Result<Option<String>, RecordError> {
        let n = self.length(false)?;
        if n < 0 {
            return Ok(None);
        }
        let raw = self.take(n as usize)?;
        String::from_utf8(raw.to_vec())
            .map(Some)
            .map_err(|_| RecordError::InvalidUtf8)
    }

    fn string(&mut self) -> Result<String, RecordError> {
        self.nullable_string()?
            .ok_or(RecordError::InvalidLength(-1))
    }

    fn bytes(&mut self) -> Result<Bytes, RecordError> {
        let n = self.length(true)?;
        if n < 0 {
            return Err(RecordError::InvalidLength(n));
        }
        Ok(Bytes::copy_from_slice(self.take(n as usize)?))
    }

    fn array_len(&mut self) -> Result<usize, RecordError> {
        let n = self.length(true)?;
        if n < 0 {
            return Err(RecordError::InvalidLength(n));
        }
        Ok(n as usize)
    }

    fn tagged_fields(&mut self) -> Result<(), RecordError> {
        if !self.flexible {
            return Ok(());
        }
        let count = self.uvarint()?;
        for _ in 0..count {
            let _tag = self.uvarint()?;
            let size = self.uvarint()?;
            self.take(size as usize)?;
        }
        Ok(())
    }

    fn finish(&self) -> Result<(), RecordError> {
        match self.buf.len() - self.pos {
            0 => Ok(()),
            n => Err(RecordError::Trailing(n)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offset_value() -> OffsetCommitValue {
        OffsetCommitValue {
            offset: 42,
            leader_epoch: 7,
            metadata: "meta".into(),
            commit_timestamp: 1_700_000_000_000,
            expire_timestamp: -1,
        }
    }

    fn group_value() -> GroupMetadataValue {
        GroupMetadataValue {
            protocol_type: "consumer".into(),
            generation: 3,
            protocol: Some("range".into()),
            leader: Some("m-1".into()),
            current_state_timestamp: 1_700_000_000_123,
            members: vec![
                MemberMetadataValue {
                    member_id: "m-1".into(),
                    group_instance_id: Some("i-1".into()),
                    client_id: "c".into(),
                    client_host: "/127.0.0.1".into(),
                    rebalance_timeout: 300_000,
                    session_timeout: 45_000,
                    subscription: Bytes::from_static(b"\x00\x01sub"),
                    assignment: Bytes::from_static(b"\x00\x01asg"),
                },
                MemberMetadataValue {
                    member_id: "m-2".into(),
                    group_instance_id: None,
                    client_id: "c2".into(),
                    client_host: "/10.0.0.1".into(),
                    rebalance_timeout: 1000,
                    session_timeout: 6000,
                    subscription: Bytes::new(),
                    assignment: Bytes::new(),
                },
            ],
        }
    }

    #[test]
    fn offset_commit_round_trips() {
        let rec = CoordinatorRecord::OffsetCommit {
            group: "g".into(),
            topic: "t".into(),
            partition: 5,
            value: Some(offset_value()),
        };
        let (k, v) = rec.encode();
        let back = CoordinatorRecord::decode(k.as_deref(), v.as_deref()).unwrap();
        assert_eq!(back, rec);
    }

    #[test]
    fn offset_commit_bytes_are_kafkas() {
        let (k, v) = CoordinatorRecord::OffsetCommit {
            group: "g".into(),
            topic: "t".into(),
            partition: 1,
            value: Some(OffsetCommitValue {
                offset: 2,
                leader_epoch: -1,
                metadata: String::new(),
                commit_timestamp: 3,
                expire_timestamp: -1,
            }),
        }
        .encode();
        assert_eq!(
            k.unwrap().as_ref(),
            &[0, 1, 0, 1, b'g', 0, 1, b't', 0, 0, 0, 1]
        );
        assert_eq!(
            v.unwrap().as_ref(),
            &[
                0, 3, // version
                0, 0, 0, 0, 0, 0, 0, 2, // offset
                0xff, 0xff, 0xff, 0xff, // leader epoch
                0, 0, // metadata ""
                0, 0, 0, 0, 0, 0, 0, 3, // commit timestamp
            ]
        );
    }

    #[test]
    fn group_metadata_round_trips_and_tombstones() {
        let rec = CoordinatorRecord::GroupMetadata {
            group: "grp".into(),
            value: Some(group_value()),
        };
        let (k, v) = rec.encode();
        assert_eq!(
            CoordinatorRecord::decode(k.as_deref(), v.as_deref()).unwrap(),
            rec
        );
        let tomb = CoordinatorRecord::GroupMetadata {
            group: "grp".into(),
            value: None,
        };
        let (k, v) = tomb.encode();
        assert!(v.is_none());
        assert_eq!(CoordinatorRecord::decode(k.as_deref(), None).unwrap(), tomb);
        let empty = GroupMetadataValue {
            protocol_type: String::new(),
            generation: 0,
            protocol: None,
            leader: None,
            current_state_timestamp: -1,
            members: vec![],
        };
        let bytes = encode_group_metadata_value(&empty);
        assert_eq!(decode_group_metadata_value(&bytes).unwrap(), empty);
    }

    /// Older and flexible value versions that Kafka may have written.
    #[test]
    fn reads_every_value_version() {
        // OffsetCommitValue v1: offset, metadata, commit ts, expire ts.
        let mut b = BytesMut::new();
        b.put_i16(1);
        b.put_i64(9);
        put_string(&mut b, "m");
        b.put_i64(10);
        b.put_i64(11);
        let v = decode_offset_commit_value(&b).unwrap();
        assert_eq!(
            (
                v.offset,
                v.leader_epoch,
                v.metadata.as_str(),
                v.expire_timestamp
            ),
            (9, -1, "m", 11)
        );
        // OffsetCommitValue v4 (flexible): compact string and tagged fields.
        let mut b = BytesMut::new();
        b.put_i16(4);
        b.put_i64(9);
        b.put_i32(3);
        b.put_u8(2); // compact length 1 + 1
        b.put_u8(b'x');
        b.put_i64(10);
        b.put_u8(1); // one tagged field
        b.put_u8(0); // tag
        b.put_u8(2); // size
        b.put_slice(&[1, 2]);
        let v = decode_offset_commit_value(&b).unwrap();
        assert_eq!((v.offset, v.leader_epoch, v.metadata.as_str()), (9, 3, "x"));
        // GroupMetadataValue v0: no state timestamp, rebalance timeout, instance id.
        let mut b = BytesMut::new();
        b.put_i16(0);
        put_string(&mut b, "consumer");
        b.put_i32(2);
        put_nullable_string(&mut b, Some("range"));
        put_nullable_string(&mut b, Some("m"));
        b.put_i32(1);
        put_string(&mut b, "m");
        put_string(&mut b, "c");
        put_string(&mut b, "h");
        b.put_i32(10_000);
        b.put_i32(1);
        b.put_u8(7);
        b.put_i32(0);
        let g = decode_group_metadata_value(&b).unwrap();
        assert_eq!(g.generation, 2);
        assert_eq!(g.members[0].rebalance_timeout, -1);
        assert_eq!(g.members[0].session_timeout, 10_000);
        assert_eq!(g.members[0].subscription.as_ref(), &[7]);
        assert_eq!(g.current_state_timestamp, -1);
    }

    #[test]
    fn unknown_types_are_skipped_and_garbage_is_refused() {
        assert_eq!(
            CoordinatorRecord::decode(Some(&[0, 4, 1, 2]), Some(&[0, 0])).unwrap(),
            CoordinatorRecord::Other { record_type: 4 }
        );
        assert!(CoordinatorRecord::decode(None, None).is_err());
        assert_eq!(
            CoordinatorRecord::decode(Some(&[0, 1, 0, 9, b'g']), None),
            Err(RecordError::Truncated)
        );
        assert!(decode_offset_commit_value(&[0, 9]).is_err());
        assert!(decode_group_metadata_value(&[0, 3, 0]).is_err());
    }

    fn tps(v: &[(u128, &[i32])]) -> TopicPartitions {
        v.iter()
            .map(|(t, ps)| (Uuid::from_u128(*t), ps.iter().copied().collect()))
            .collect()
    }

    #[test]
    fn consumer_group_records_round_trip_and_tombstone() {
        let records = vec![
            CoordinatorRecord::ConsumerGroupMetadata {
                group: "g".into(),
                epoch: Some(7),
            },
            CoordinatorRecord::ConsumerMemberMetadata {
                group: "g".into(),
                member: "m-1".into(),
                value: Some(ConsumerMemberMetadataValue {
                    instance_id: Some("i".into()),
                    rack_id: None,
                    client_id: "c".into(),
                    client_host: "/127.0.0.1".into(),
                    subscribed_topic_names: vec!["a".into(), "b".into()],
                    subscribed_topic_regex: None,
                    rebalance_timeout_ms: 30_000,
                    server_assignor: Some("uniform".into()),
                }),
            },
            CoordinatorRecord::ConsumerTargetAssignmentMetadata {
                group: "g".into(),
                epoch: Some(6),
            },
            CoordinatorRecord::ConsumerTargetAssignmentMember {
                group: "g".into(),
                member: "m-1".into(),
                value: Some(tps(&[(1, &[0, 2]), (2, &[5])])),
            },
            CoordinatorRecord::ConsumerTargetAssignmentMember {
                group: "g".into(),
                member: "m-2".into(),
                value: Some(TopicPartitions::new()),
            },
            CoordinatorRecord::ConsumerCurrentMemberAssignment {
                group: "g".into(),
                member: "m-1".into(),
                value: Some(ConsumerCurrentAssignmentValue {
                    member_epoch: 6,
                    previous_member_epoch: 5,
                    state: 1,
                    assigned: tps(&[(1, &[0])]),
                    pending_revocation: tps(&[(1, &[1, 3])]),
                }),
            },
        ];
        for rec in records {
            let (k, v) = rec.encode();
            assert!(v.is_some());
            assert_eq!(
                CoordinatorRecord::decode(k.as_deref(), v.as_deref()).unwrap(),
                rec
            );
        }
        let tombstones = vec![
            CoordinatorRecord::ConsumerGroupMetadata {
                group: "g".into(),
                epoch: None,
            },
            CoordinatorRecord::ConsumerMemberMetadata {
                group: "g".into(),
                member: "m".into(),
                value: None,
            },
            CoordinatorRecord::ConsumerTargetAssignmentMetadata {
                group: "g".into(),
                epoch: None,
            },
            CoordinatorRecord::ConsumerTargetAssignmentMember {
                group: "g".into(),
                member: "m".into(),
                value: None,
            },
            CoordinatorRecord::ConsumerCurrentMemberAssignment {
                group: "g".into(),
                member: "m".into(),
                value: None,
            },
        ];
        for rec in tombstones {
            let (k, v) = rec.encode();
            assert!(v.is_none());
            assert_eq!(CoordinatorRecord::decode(k.as_deref(), None).unwrap(), rec);
        }
    }

    #[test]
    fn consumer_group_bytes_are_kafkas() {
        let (k, v) = CoordinatorRecord::ConsumerGroupMetadata {
            group: "g".into(),
            epoch: Some(5),
        }
        .encode();
        assert_eq!(k.unwrap().as_ref(), &[0, 3, 0, 1, b'g']);
        assert_eq!(v.unwrap().as_ref(), &[0, 0, 0, 0, 0, 5, 0]);
        let (k, v) = CoordinatorRecord::ConsumerCurrentMemberAssignment {
            group: "g".into(),
            member: "m".into(),
            value: Some(ConsumerCurrentAssignmentValue {
                member_epoch: 2,
                previous_member_epoch: 1,
                state: 0,
                assigned: tps(&[(0x0102, &[3])]),
                pending_revocation: TopicPartitions::new(),
            }),
        }
        .encode();
        assert_eq!(k.unwrap().as_ref(), &[0, 8, 0, 1, b'g', 0, 1, b'm']);
        let mut want = vec![0, 0, 0, 0, 0, 2, 0, 0, 0, 1, 0, 2];
        want.extend_from_slice(&[0; 14]);
        want.extend_from_slice(&[1, 2, 2, 0, 0, 0, 3, 0, 1, 0]);
        assert_eq!(v.unwrap().as_ref(), want.as_slice());
        // Tagged fields Kafka may add (MetadataHash, AssignmentEpochs) are skipped.
        let with_tags = [0, 0, 0, 0, 0, 9, 1, 0, 8, 0, 0, 0, 0, 0, 0, 0, 1];
        assert_eq!(
            CoordinatorRecord::decode(Some(&[0, 3, 0, 1, b'g']), Some(&with_tags)).unwrap(),
            CoordinatorRecord::ConsumerGroupMetadata {
                group: "g".into(),
                epoch: Some(9)
            }
        );
        assert!(decode_current_assignment_value(&[0, 1, 0]).is_err());
    }
}
