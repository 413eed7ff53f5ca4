//! Metadata records and their explicit, versioned binary codec.
//!
//! The codec is hand written (not serde) so the bytes in the log are a
//! stable contract: a record is `u16 BE type`, `u16 BE version`, then the
//! payload with big-endian integers, length-prefixed UTF-8 strings (u16 for
//! names/keys, u32 for config values), u32-count-prefixed arrays, 16-byte
//! UUIDs and `Option` as a 0/1 tag byte. Records are version 0 except
//! `SealSegment` (version 1 adds the leader epoch of the segment it seals);
//! a new version gets a new number and the decoder keeps reading the old.
//!
//! [`MetadataRecord::decode`] also rejects values out of range for their
//! field (decided by the bytes alone, never by the image), because the
//! design treats those as undecodable, not as skippable.

use std::collections::{BTreeMap, BTreeSet};

use crate::acl::{AclBinding, AclOperation, AclPermissionType, PatternType, ResourceType};
use crate::error::RecordDecodeError;
use crate::{RangeId, SegmentId, TopicId};

/// Largest partition count of a topic (and bound on partition indices).
pub const MAX_PARTITIONS: u32 = 1_000_000;
/// Kafka's limit on topic name length.
pub const MAX_TOPIC_NAME_LEN: usize = 249;
/// Bound on broker host names (DNS names are at most 253 bytes).
pub const MAX_HOST_LEN: usize = 255;
/// Bound on `broker.rack`.
pub const MAX_RACK_LEN: usize = 255;
/// Bound on a topic config key.
pub const MAX_CONFIG_KEY_LEN: usize = 255;
/// Bound on a topic config value.
pub const MAX_CONFIG_VALUE_LEN: usize = 1 << 20;
/// Bound on a dynamic broker config key (and its value: [`MAX_CONFIG_VALUE_LEN`]).
pub const MAX_BROKER_CONFIG_KEY_LEN: usize = MAX_CONFIG_KEY_LEN;
/// Bound on the number of configs carried by one CreateTopic.
pub const MAX_TOPIC_CONFIGS: usize = 1024;
/// Bound on replica set size and on a topic's replication factor.
pub const MAX_REPLICAS: usize = 128;
/// Bound on the parents of one range (a split has one, a merge two).
pub const MAX_RANGE_PARENTS: usize = 16;
/// Bound on a SCRAM user name.
pub const MAX_USER_NAME_LEN: usize = 1024;
/// Bound on a SCRAM salt.
pub const MAX_SCRAM_SALT_LEN: usize = 1024;
/// Kafka's bounds on SCRAM iterations (`ScramMechanism`'s min, and
/// AlterUserScramCredentials' max).
pub const MIN_SCRAM_ITERATIONS: u32 = 4096;
pub const MAX_SCRAM_ITERATIONS: u32 = 16384;

/// A SCRAM credential as Kafka stores it (UserScramCredentialRecord): salt,
/// iterations, stored key and server key, never the password.
/// `mechanism` is Kafka's type byte: 1 = SCRAM-SHA-256, 2 = SCRAM-SHA-512;
/// the keys are as long as the mechanism's hash (32 or 64 bytes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScramCredentialRecord {
    pub user: String,
    pub mechanism: u8,
    pub salt: Vec<u8>,
    pub stored_key: Vec<u8>,
    pub server_key: Vec<u8>,
    pub iterations: u32,
}

/// The key length of a SCRAM mechanism type byte (None: unknown type).
pub fn scram_key_len(mechanism: u8) -> Option<usize> {
    match mechanism {
        1 => Some(32),
        2 => Some(64),
        _ => None,
    }
}

/// One part (user or client id) of a client quota entity: a name, or
/// Kafka's default entity (`<default>`, a null name in the protocol).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum QuotaEntityName {
    Default,
    Named(String),
}

impl QuotaEntityName {
    /// Kafka's null name for the default entity.
    pub fn from_option(name: Option<String>) -> Self {
        match name {
            None => QuotaEntityName::Default,
            Some(n) => QuotaEntityName::Named(n),
        }
    }
    pub fn as_option(&self) -> Option<&str> {
        match self {
            QuotaEntityName::Default => None,
            QuotaEntityName::Named(n) => Some(n),
        }
    }
}

/// A client quota entity (Kafka's ClientQuotaEntity without `ip`): a user,
/// a client id, or both; at least one is present in a valid record.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClientQuotaEntity {
    pub user: Option<QuotaEntityName>,
    pub client_id: Option<QuotaEntityName>,
}

/// The client quota keys Kafka knows for user and client-id entities
/// (`QuotaConfigs`). The byte rates are LONG configs, the rest DOUBLE.
pub const CLIENT_QUOTA_KEYS: &[&str] = &[
    "producer_byte_rate",
    "consumer_byte_rate",
    "request_percentage",
    "controller_mutation_rate",
];

/// A quota value (Kafka stores a double). Compared by its bits, so records
/// stay `Eq`; validation keeps it finite and non-negative.
#[derive(Clone, Copy, Debug)]
pub struct QuotaValue(pub f64);

impl PartialEq for QuotaValue {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}
impl Eq for QuotaValue {}

/// A registered broker: who it is and where clients reach it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BrokerRegistration {
    pub broker_id: i32,
    /// Changes on every broker process start, so a restart is told apart
    /// from a stale duplicate registration.
    pub incarnation_id: uuid::Uuid,
    pub host: String,
    pub port: u16,
    pub rack: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicRecord {
    pub topic_id: TopicId,
    pub name: String,
    pub partitions: u32,
    pub replication_factor: i16,
    pub configs: BTreeMap<String, String>,
}

/// A new active range covering partitions `[lo, hi)` of a topic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RangeRecord {
    pub range_id: RangeId,
    pub topic_id: TopicId,
    pub lo: u32,
    pub hi: u32,
    /// Lineage: the range(s) this one was split or merged from.
    pub parents: Vec<RangeId>,
}

/// A new active segment of a range.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentOpenRecord {
    pub segment: SegmentId,
    /// `replicas[0]` is the primary (the leader of the range's partitions).
    pub replicas: Vec<i32>,
    pub leader_epoch: i32,
}

/// The seal of a segment: its final size and, per partition with data in
/// it, the offsets it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentSealRecord {
    pub segment: SegmentId,
    pub size_bytes: u64,
    pub spans: Vec<PartitionSpan>,
    /// The leader epoch of the segment this seal is for. Replay skips the
    /// seal when the image's segment of that number is at another epoch: a
    /// closed log's roll recorded after a failover reused its number would
    /// otherwise seal the new segment at the old one's size (found by the
    /// 64 KiB kill test). `None` in version-0 records (applied as before).
    pub leader_epoch: Option<i32>,
}

/// One log-cleaning pass over a range's oldest sealed segments, decided
/// by the range's primary (type 21). Every replica of those segments
/// applies the same pass (`now_ms`, `delete_retention_ms`) to its own copy
/// of the same bytes and gets the same cleaned bytes, which `segments`
/// describes: a copy whose size and CRC-32C differ is refetched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CleanPassRecord {
    pub range_id: RangeId,
    /// Numbers the range's passes; replay skips a pass not above the
    /// range's last one (a stale plan that lost a race).
    pub pass: u64,
    pub now_ms: i64,
    pub delete_retention_ms: i64,
    /// The segments cleaned, oldest first and consecutive from the range's
    /// oldest one when planned.
    pub segments: Vec<CleanedSegment>,
}

/// One segment of a [`CleanPassRecord`]: its size before the pass, and
/// its size and CRC-32C (of the whole file) after.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CleanedSegment {
    pub seq: u32,
    pub size_before: u64,
    pub size_after: u64,
    pub crc32c: u32,
}

/// Offsets `[start_offset, end_offset)` of one partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartitionSpan {
    pub partition: u32,
    pub start_offset: i64,
    pub end_offset: i64,
}

/// One metadata change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MetadataRecord {
    NoOp,
    /// Upsert. A new broker, or a new incarnation of a known one, starts
    /// fenced (as in Kafka); `UnfenceBroker` lets it lead segments.
    RegisterBroker(BrokerRegistration),
    FenceBroker {
        broker_id: i32,
    },
    UnfenceBroker {
        broker_id: i32,
    },
    /// Kafka's UnregisterBrokerRecord (`Admin.unregisterBroker`): the
    /// broker leaves the image (registration and fenced state). Placement,
    /// failover and healing then treat its copies as gone. Replay skips an
    /// unknown broker. A broker that runs again registers anew (as in
    /// Kafka, where it re-registers on its next heartbeat).
    UnregisterBroker {
        broker_id: i32,
    },
    CreateTopic(TopicRecord),
    /// Removes the topic and its ranges, segments and log start offsets.
    DeleteTopic {
        topic_id: TopicId,
    },
    /// `value: None` deletes the key.
    SetTopicConfig {
        topic_id: TopicId,
        key: String,
        value: Option<String>,
    },
    CreateRange(RangeRecord),
    /// The range becomes inactive (a split or merge parent).
    SealRange {
        range_id: RangeId,
    },
    OpenSegment(SegmentOpenRecord),
    SealSegment(SegmentSealRecord),
    DeleteSegment {
        segment: SegmentId,
    },
    SetLogStartOffset {
        topic_id: TopicId,
        partition: u32,
        offset: i64,
    },
    /// Hands the block of producer ids `[first_producer_id,
    /// first_producer_id + count)` to `broker_id` (KRaft's
    /// ProducerIdsRecord). Blocks are consecutive: replay skips a block
    /// whose `first_producer_id` is not the image's `next_producer_id` (it
    /// lost a race to another allocation), so no id is handed out twice,
    /// across restarts included.
    AllocateProducerIds {
        broker_id: i32,
        first_producer_id: i64,
        count: i32,
    },
    /// A dynamic broker config (Kafka's ConfigRecord for a BROKER resource):
    /// `broker_id: None` is the cluster-wide default (Kafka's resource name
    /// ""), `Some(id)` one broker's own value. `value: None` deletes the
    /// key. The broker need not be registered (Kafka stores configs of
    /// brokers that have not joined yet).
    SetBrokerConfig {
        broker_id: Option<i32>,
        key: String,
        value: Option<String>,
    },
    /// CreatePartitions: the topic's partition count grows to `partitions`
    /// (Kafka's counts only grow; replay skips a record that is not an
    /// increase, which is how a lost race between two CreatePartitions
    /// shows). Existing ranges are untouched: the entry that carries it
    /// also carries the `CreateRange`/`OpenSegment` of the range that
    /// serves the new partitions.
    IncreasePartitions {
        topic_id: TopicId,
        partitions: u32,
    },
    /// The replica set of a sealed segment changes (healing: a copy on a
    /// broker that is gone is replaced by a copy elsewhere).
    SetSegmentReplicas {
        segment: SegmentId,
        replicas: Vec<i32>,
    },
    /// The replicas of an active segment its primary has in sync (Kafka's
    /// ISR, which a leader changes with AlterPartition): written by the
    /// primary when a follower falls out of sync for longer than
    /// `replica.lag.time.max.ms` or catches up again. Replay skips it for
    /// a sealed segment or another leader epoch, and refuses replicas the
    /// segment does not have or a set without its primary.
    SetSegmentInSync {
        segment: SegmentId,
        leader_epoch: i32,
        in_sync: Vec<i32>,
    },
    /// Upsert of a user's SCRAM credential for one mechanism.
    SetScramCredential(ScramCredentialRecord),
    /// Removes a user's SCRAM credential for one mechanism (replay skips it
    /// when the image holds none).
    RemoveScramCredential {
        user: String,
        mechanism: u8,
    },
    /// A new ACL (Kafka's AccessControlEntryRecord) under a fresh id.
    /// Replay skips it when the id is taken or the same binding exists
    /// (Kafka's CreateAcls of an existing ACL changes nothing).
    CreateAcl {
        id: uuid::Uuid,
        acl: AclBinding,
    },
    /// Removes the ACL with this id (Kafka's RemoveAccessControlEntryRecord;
    /// replay skips an unknown id).
    RemoveAcl {
        id: uuid::Uuid,
    },
    /// A log-cleaning pass every replica of the segments applies (see
    /// [`CleanPassRecord`]); replay sets the segments' sealed sizes to
    /// their cleaned ones.
    CleanSegments(CleanPassRecord),
    /// A client quota (Kafka's QuotaRecord): `value: None` removes the key
    /// from the entity (replay of a removal of an unset key changes
    /// nothing); an entity whose last key is removed disappears.
    ClientQuota {
        entity: ClientQuotaEntity,
        key: String,
        value: Option<QuotaValue>,
    },
    /// No new range takes an id below `below` (a deleted topic's ranges
    /// had them). `DeleteTopic` retires its ranges' ids by itself; this
    /// record carries the mark through a snapshot, where the deleted
    /// ranges are not. Replay raises the mark, never lowers it.
    RetireRangeIds {
        below: RangeId,
    },
}

/// Record type numbers. Never reuse or renumber: they are in the log.
pub mod record_type {
    pub const NO_OP: u16 = 0;
    pub const REGISTER_BROKER: u16 = 1;
    pub const FENCE_BROKER: u16 = 2;
    pub const UNFENCE_BROKER: u16 = 3;
    pub const CREATE_TOPIC: u16 = 4;
    pub const DELETE_TOPIC: u16 = 5;
    pub const SET_TOPIC_CONFIG: u16 = 6;
    pub const CREATE_RANGE: u16 = 7;
    pub const SEAL_RANGE: u16 = 8;
    pub const OPEN_SEGMENT: u16 = 9;
    pub const SEAL_SEGMENT: u16 = 10;
    pub const DELETE_SEGMENT: u16 = 11;
    pub const SET_LOG_START_OFFSET: u16 = 12;
    pub const ALLOCATE_PRODUCER_IDS: u16 = 13;
    pub const SET_BROKER_CONFIG: u16 = 14;
    pub const INCREASE_PARTITIONS: u16 = 15;
    pub const SET_SEGMENT_REPLICAS: u16 = 16;
    pub const SET_SCRAM_CREDENTIAL: u16 = 17;
    pub const REMOVE_SCRAM_CREDENTIAL: u16 = 18;
    pub const CREATE_ACL: u16 = 19;
    pub const REMOVE_ACL: u16 = 20;
    pub const CLEAN_SEGMENTS: u16 = 21;
    pub const CLIENT_QUOTA: u16 = 22;
    pub const UNREGISTER_BROKER: u16 = 23;
    pub const SET_SEGMENT_IN_SYNC: u16 = 24;
    pub const RETIRE_RANGE_IDS: u16 = 25;
    /// The largest type number this build reads.
    pub const MAX: u16 = RETIRE_RANGE_IDS;
}

impl MetadataRecord {
    /// The record's type number in the codec.
    pub fn record_type(&self) -> u16 {
        use record_type::*;
        match self {
            MetadataRecord::NoOp => NO_OP,
            MetadataRecord::RegisterBroker(_) => REGISTER_BROKER,
            MetadataRecord::FenceBroker { .. } => FENCE_BROKER,
            MetadataRecord::UnfenceBroker { .. } => UNFENCE_BROKER,
            MetadataRecord::UnregisterBroker { .. } => UNREGISTER_BROKER,
            MetadataRecord::CreateTopic(_) => CREATE_TOPIC,
            MetadataRecord::DeleteTopic { .. } => DELETE_TOPIC,
            MetadataRecord::SetTopicConfig { .. } => SET_TOPIC_CONFIG,
            MetadataRecord::CreateRange(_) => CREATE_RANGE,
            MetadataRecord::SealRange { .. } => SEAL_RANGE,
            MetadataRecord::OpenSegment(_) => OPEN_SEGMENT,
            MetadataRecord::SealSegment(_) => SEAL_SEGMENT,
            MetadataRecord::DeleteSegment { .. } => DELETE_SEGMENT,
            MetadataRecord::SetLogStartOffset { .. } => SET_LOG_START_OFFSET,
            MetadataRecord::AllocateProducerIds { .. } => ALLOCATE_PRODUCER_IDS,
            MetadataRecord::SetBrokerConfig { .. } => SET_BROKER_CONFIG,
            MetadataRecord::IncreasePartitions { .. } => INCREASE_PARTITIONS,
            MetadataRecord::SetSegmentReplicas { .. } => SET_SEGMENT_REPLICAS,
            MetadataRecord::SetSegmentInSync { .. } => SET_SEGMENT_IN_SYNC,
            MetadataRecord::SetScramCredential(_) => SET_SCRAM_CREDENTIAL,
            MetadataRecord::RemoveScramCredential { .. } => REMOVE_SCRAM_CREDENTIAL,
            MetadataRecord::CreateAcl { .. } => CREATE_ACL,
            MetadataRecord::RemoveAcl { .. } => REMOVE_ACL,
            MetadataRecord::CleanSegments(_) => CLEAN_SEGMENTS,
            MetadataRecord::ClientQuota { .. } => CLIENT_QUOTA,
            MetadataRecord::RetireRangeIds { .. } => RETIRE_RANGE_IDS,
        }
    }

    /// The version [`MetadataRecord::encode`] writes: 1 for a
    /// `SealSegment` that names its leader epoch, else 0 (readable by
    /// builds from before version 1).
    fn version(&self) -> u16 {
        match self {
            MetadataRecord::SealSegment(s) if s.leader_epoch.is_some() => 1,
            _ => 0,
        }
    }

    /// Encodes the record (current version of its type).
    ///
    /// Infallible; a record whose fields are out of range still encodes,
    /// but [`MetadataRecord::decode`] rejects the result. Check
    /// [`MetadataRecord::validate`] before writing (the controller does).
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer(Vec::with_capacity(32));
        w.u16(self.record_type());
        w.u16(self.version());
        match self {
            MetadataRecord::NoOp => {}
            MetadataRecord::RegisterBroker(b) => {
                w.i32(b.broker_id);
                w.uuid(&b.incarnation_id);
                w.str16(&b.host);
                w.u16(b.port);
                match &b.rack {
                    None => w.u8(0),
                    Some(r) => {
                        w.u8(1);
                        w.str16(r);
                    }
                }
            }
            MetadataRecord::FenceBroker { broker_id }
            | MetadataRecord::UnfenceBroker { broker_id }
            | MetadataRecord::UnregisterBroker { broker_id } => w.i32(*broker_id),
            MetadataRecord::CreateTopic(t) => {
                w.uuid(&t.topic_id);
                w.str16(&t.name);
                w.u32(t.partitions);
                w.i16(t.replication_factor);
                w.count(t.configs.len());
                for (k, v) in &t.configs {
                    w.str16(k);
                    w.str32(v);
                }
            }
            MetadataRecord::DeleteTopic { topic_id } => w.uuid(topic_id),
            MetadataRecord::SetTopicConfig {
                topic_id,
                key,
                value,
            } => {
                w.uuid(topic_id);
                w.str16(key);
                match value {
                    None => w.u8(0),
                    Some(v) => {
                        w.u8(1);
                        w.str32(v);
                    }
                }
            }
            MetadataRecord::CreateRange(r) => {
                w.u64(r.range_id);
                w.uuid(&r.topic_id);
                w.u32(r.lo);
                w.u32(r.hi);
                w.count(r.parents.len());
                for p in &r.parents {
                    w.u64(*p);
                }
            }
            MetadataRecord::SealRange { range_id } => w.u64(*range_id),
            MetadataRecord::RetireRangeIds { below } => w.u64(*below),
            MetadataRecord::OpenSegment(s) => {
                w.segment(&s.segment);
                w.replicas(&s.replicas);
                w.i32(s.leader_epoch);
            }
            MetadataRecord::SealSegment(s) => {
                w.segment(&s.segment);
                w.u64(s.size_bytes);
                w.count(s.spans.len());
                for sp in &s.spans {
                    w.u32(sp.partition);
                    w.i64(sp.start_offset);
                    w.i64(sp.end_offset);
                }
                if let Some(epoch) = s.leader_epoch {
                    w.i32(epoch);
                }
            }
            MetadataRecord::DeleteSegment { segment } => w.segment(segment),
            MetadataRecord::SetLogStartOffset {
                topic_id,
                partition,
                offset,
            } => {
                w.uuid(topic_id);
                w.u32(*partition);
                w.i64(*offset);
            }
            MetadataRecord::AllocateProducerIds {
                broker_id,
                first_producer_id,
                count,
            } => {
                w.i32(*broker_id);
                w.i64(*first_producer_id);
                w.i32(*count);
            }
            MetadataRecord::SetBrokerConfig {
                broker_id,
                key,
                value,
            } => {
                match broker_id {
                    None => w.u8(0),
                    Some(id) => {
                        w.u8(1);
                        w.i32(*id);
                    }
                }
                w.str16(key);
                match value {
                    None => w.u8(0),
                    Some(v) => {
                        w.u8(1);
                        w.str32(v);
                    }
                }
            }
            MetadataRecord::IncreasePartitions {
                topic_id,
                partitions,
            } => {
                w.uuid(topic_id);
                w.u32(*partitions);
            }
            MetadataRecord::SetSegmentReplicas { segment, replicas } => {
                w.segment(segment);
                w.replicas(replicas);
            }
            MetadataRecord::SetSegmentInSync {
                segment,
                leader_epoch,
                in_sync,
            } => {
                w.segment(segment);
                w.i32(*leader_epoch);
                w.replicas(in_sync);
            }
            MetadataRecord::SetScramCredential(c) => {
                w.str16(&c.user);
                w.u8(c.mechanism);
                w.bytes16(&c.salt);
                w.bytes16(&c.stored_key);
                w.bytes16(&c.server_key);
                w.u32(c.iterations);
            }
            MetadataRecord::RemoveScramCredential { user, mechanism } => {
                w.str16(user);
                w.u8(*mechanism);
            }
            MetadataRecord::CreateAcl { id, acl } => {
                w.uuid(id);
                w.u8(acl.resource_type.code() as u8);
                w.str16(&acl.resource_name);
                w.u8(acl.pattern_type.code() as u8);
                w.str16(&acl.principal);
                w.str16(&acl.host);
                w.u8(acl.operation.code() as u8);
                w.u8(acl.permission.code() as u8);
            }
            MetadataRecord::RemoveAcl { id } => w.uuid(id),
            MetadataRecord::CleanSegments(c) => {
                w.u64(c.range_id);
                w.u64(c.pass);
                w.i64(c.now_ms);
                w.i64(c.delete_retention_ms);
                w.count(c.segments.len());
                for s in &c.segments {
                    w.u32(s.seq);
                    w.u64(s.size_before);
                    w.u64(s.size_after);
                    w.u32(s.crc32c);
                }
            }
            MetadataRecord::ClientQuota { entity, key, value } => {
                w.quota_entity_name(entity.user.as_ref());
                w.quota_entity_name(entity.client_id.as_ref());
                w.str16(key);
                match value {
                    None => w.u8(0),
                    Some(v) => {
                        w.u8(1);
                        w.u64(v.0.to_bits());
                    }
                }
            }
        }
        w.0
    }

    /// Decodes one record, rejecting anything this build does not read:
    /// unknown type or version, truncation, trailing bytes, invalid UTF-8,
    /// a bad option tag, and values out of range for their field.
    pub fn decode(bytes: &[u8]) -> Result<MetadataRecord, RecordDecodeError> {
        use record_type::*;
        let mut r = Reader { buf: bytes, pos: 0 };
        let ty = r.u16("record type")?;
        let version = r.u16("record version")?;
        if ty > record_type::MAX {
            return Err(RecordDecodeError::UnknownType(ty));
        }
        let known = version == 0 || (ty == SEAL_SEGMENT && version == 1);
        if !known {
            return Err(RecordDecodeError::UnknownVersion {
                record_type: ty,
                version,
            });
        }
        let rec = match ty {
            NO_OP => MetadataRecord::NoOp,
            REGISTER_BROKER => {
                let broker_id = r.i32("broker_id")?;
                let incarnation_id = r.uuid("incarnation_id")?;
                let host = r.str16("host")?;
                let port = r.u16("port")?;
                let rack = if r.option("rack")? {
                    Some(r.str16("rack")?)
                } else {
                    None
                };
                MetadataRecord::RegisterBroker(BrokerRegistration {
                    broker_id,
                    incarnation_id,
                    host,
                    port,
                    rack,
                })
            }
            FENCE_BROKER => MetadataRecord::FenceBroker {
                broker_id: r.i32("broker_id")?,
            },
            UNFENCE_BROKER => MetadataRecord::UnfenceBroker {
                broker_id: r.i32("broker_id")?,
            },
            UNREGISTER_BROKER => MetadataRecord::UnregisterBroker {
                broker_id: r.i32("broker_id")?,
            },
            CREATE_TOPIC => {
                let topic_id = r.uuid("topic_id")?;
                let name = r.str16("topic name")?;
                let partitions = r.u32("partitions")?;
                let replication_factor = r.i16("replication_factor")?;
                // Each entry takes at least 2 + 4 bytes.
                let n = r.count("configs", 6)?;
                let mut configs = BTreeMap::new();
                for _ in 0..n {
                    let k = r.str16("config key")?;
                    let v = r.str32("config value")?;
                    // Strictly increasing keys keep the encoding canonical
                    // (one byte string per record) and rule out duplicates.
                    if configs.last_key_value().is_some_and(|(last, _)| *last >= k) {
                        return Err(RecordDecodeError::invalid(
                            "configs",
                            "keys not in strictly increasing order",
                        ));
                    }
                    configs.insert(k, v);
                }
                MetadataRecord::CreateTopic(TopicRecord {
                    topic_id,
                    name,
                    partitions,
                    replication_factor,
                    configs,
                })
            }
            DELETE_TOPIC => MetadataRecord::DeleteTopic {
                topic_id: r.uuid("topic_id")?,
            },
            SET_TOPIC_CONFIG => {
                let topic_id = r.uuid("topic_id")?;
                let key = r.str16("config key")?;
                let value = if r.option("config value")? {
                    Some(r.str32("config value")?)
                } else {
                    None
                };
                MetadataRecord::SetTopicConfig {
                    topic_id,
                    key,
                    value,
                }
            }
            CREATE_RANGE => {
                let range_id = r.u64("range_id")?;
                let topic_id = r.uuid("topic_id")?;
                let lo = r.u32("lo")?;
                let hi = r.u32("hi")?;
                let n = r.count("parents", 8)?;
                let mut parents = Vec::with_capacity(n);
                for _ in 0..n {
                    parents.push(r.u64("parent")?);
                }
                MetadataRecord::CreateRange(RangeRecord {
                    range_id,
                    topic_id,
                    lo,
                    hi,
                    parents,
                })
            }
            SEAL_RANGE => MetadataRecord::SealRange {
                range_id: r.u64("range_id")?,
            },
            RETIRE_RANGE_IDS => MetadataRecord::RetireRangeIds {
                below: r.u64("below")?,
            },
            OPEN_SEGMENT => {
                let segment = r.segment()?;
                let replicas = r.replicas()?;
                let leader_epoch = r.i32("leader_epoch")?;
                MetadataRecord::OpenSegment(SegmentOpenRecord {
                    segment,
                    replicas,
                    leader_epoch,
                })
            }
            SEAL_SEGMENT => {
                let segment = r.segment()?;
                let size_bytes = r.u64("size_bytes")?;
                let n = r.count("spans", 20)?;
                let mut spans = Vec::with_capacity(n);
                for _ in 0..n {
                    spans.push(PartitionSpan {
                        partition: r.u32("span partition")?,
                        start_offset: r.i64("span start_offset")?,
                        end_offset: r.i64("span end_offset")?,
                    });
                }
                let leader_epoch = if version >= 1 {
                    Some(r.i32("leader_epoch")?)
                } else {
                    None
                };
                MetadataRecord::SealSegment(SegmentSealRecord {
                    segment,
                    size_bytes,
                    spans,
                    leader_epoch,
                })
            }
            DELETE_SEGMENT => MetadataRecord::DeleteSegment {
                segment: r.segment()?,
            },
            SET_LOG_START_OFFSET => MetadataRecord::SetLogStartOffset {
                topic_id: r.uuid("topic_id")?,
                partition: r.u32("partition")?,
                offset: r.i64("offset")?,
            },
            ALLOCATE_PRODUCER_IDS => MetadataRecord::AllocateProducerIds {
                broker_id: r.i32("broker_id")?,
                first_producer_id: r.i64("first_producer_id")?,
                count: r.i32("count")?,
            },
            SET_BROKER_CONFIG => {
                let broker_id = if r.option("broker_id")? {
                    Some(r.i32("broker_id")?)
                } else {
                    None
                };
                let key = r.str16("config key")?;
                let value = if r.option("config value")? {
                    Some(r.str32("config value")?)
                } else {
                    None
                };
                MetadataRecord::SetBrokerConfig {
                    broker_id,
                    key,
                    value,
                }
            }
            INCREASE_PARTITIONS => MetadataRecord::IncreasePartitions {
                topic_id: r.uuid("topic_id")?,
                partitions: r.u32("partitions")?,
            },
            SET_SEGMENT_REPLICAS => {
                let segment = r.segment()?;
                let replicas = r.replicas()?;
                MetadataRecord::SetSegmentReplicas { segment, replicas }
            }
            SET_SEGMENT_IN_SYNC => {
                let segment = r.segment()?;
                let leader_epoch = r.i32("leader_epoch")?;
                let in_sync = r.replicas()?;
                MetadataRecord::SetSegmentInSync {
                    segment,
                    leader_epoch,
                    in_sync,
                }
            }
            SET_SCRAM_CREDENTIAL => MetadataRecord::SetScramCredential(ScramCredentialRecord {
                user: r.str16("user")?,
                mechanism: r.u8("mechanism")?,
                salt: r.bytes16("salt")?,
                stored_key: r.bytes16("stored_key")?,
                server_key: r.bytes16("server_key")?,
                iterations: r.u32("iterations")?,
            }),
            REMOVE_SCRAM_CREDENTIAL => MetadataRecord::RemoveScramCredential {
                user: r.str16("user")?,
                mechanism: r.u8("mechanism")?,
            },
            CREATE_ACL => {
                let id = r.uuid("acl id")?;
                let resource_type = r.acl_enum("resource_type", ResourceType::from_code)?;
                let resource_name = r.str16("resource_name")?;
                let pattern_type = r.acl_enum("pattern_type", PatternType::from_code)?;
                let principal = r.str16("principal")?;
                let host = r.str16("host")?;
                let operation = r.acl_enum("operation", AclOperation::from_code)?;
                let permission = r.acl_enum("permission", AclPermissionType::from_code)?;
                MetadataRecord::CreateAcl {
                    id,
                    acl: AclBinding {
                        resource_type,
                        resource_name,
                        pattern_type,
                        principal,
                        host,
                        operation,
                        permission,
                    },
                }
            }
            REMOVE_ACL => MetadataRecord::RemoveAcl {
                id: r.uuid("acl id")?,
            },
            CLEAN_SEGMENTS => {
                let range_id = r.u64("range_id")?;
                let pass = r.u64("pass")?;
                let now_ms = r.i64("now_ms")?;
                let delete_retention_ms = r.i64("delete_retention_ms")?;
                let n = r.count("cleaned segments", 24)?;
                let mut segments = Vec::with_capacity(n);
                for _ in 0..n {
                    segments.push(CleanedSegment {
                        seq: r.u32("cleaned seq")?,
                        size_before: r.u64("size_before")?,
                        size_after: r.u64("size_after")?,
                        crc32c: r.u32("crc32c")?,
                    });
                }
                MetadataRecord::CleanSegments(CleanPassRecord {
                    range_id,
                    pass,
                    now_ms,
                    delete_retention_ms,
                    segments,
                })
            }
            CLIENT_QUOTA => {
                let user = r.quota_entity_name("quota user")?;
                let client_id = r.quota_entity_name("quota client id")?;
                let key = r.str16("quota key")?;
                let value = if r.option("quota value")? {
                    Some(QuotaValue(f64::from_bits(r.u64("quota value")?)))
                } else {
                    None
                };
                MetadataRecord::ClientQuota {
                    entity: ClientQuotaEntity { user, client_id },
                    key,
                    value,
                }
            }
            // Numbers not (or no longer) in use.
            _ => return Err(RecordDecodeError::UnknownType(ty)),
        };
        if r.pos != bytes.len() {
            return Err(RecordDecodeError::TrailingBytes(bytes.len() - r.pos));
        }
        rec.validate()?;
        Ok(rec)
    }

    /// Checks that every field is in range for its type, using the record
    /// alone (never the image). [`MetadataRecord::decode`] applies the same
    /// checks, so a record that passes this encodes to bytes that decode.
    pub fn validate(&self) -> Result<(), RecordDecodeError> {
        use RecordDecodeError as E;
        match self {
            MetadataRecord::NoOp => Ok(()),
            MetadataRecord::RegisterBroker(b) => {
                check_broker_id("broker_id", b.broker_id)?;
                check_len("host", &b.host, 1, MAX_HOST_LEN)?;
                if b.port == 0 {
                    return Err(E::invalid("port", "0"));
                }
                if let Some(rack) = &b.rack {
                    check_len("rack", rack, 1, MAX_RACK_LEN)?;
                }
                Ok(())
            }
            MetadataRecord::FenceBroker { broker_id }
            | MetadataRecord::UnfenceBroker { broker_id }
            | MetadataRecord::UnregisterBroker { broker_id } => {
                check_broker_id("broker_id", *broker_id)
            }
            MetadataRecord::CreateTopic(t) => {
                check_topic_id(&t.topic_id)?;
                check_topic_name(&t.name)?;
                if t.partitions == 0 || t.partitions > MAX_PARTITIONS {
                    return Err(E::invalid(
                        "partitions",
                        format!("{} not in 1..={MAX_PARTITIONS}", t.partitions),
                    ));
                }
                if t.replication_factor < 1 || t.replication_factor as usize > MAX_REPLICAS {
                    return Err(E::invalid(
                        "replication_factor",
                        format!("{} not in 1..={MAX_REPLICAS}", t.replication_factor),
                    ));
                }
                if t.configs.len() > MAX_TOPIC_CONFIGS {
                    return Err(E::invalid(
                        "configs",
                        format!("more than {MAX_TOPIC_CONFIGS}"),
                    ));
                }
                for (k, v) in &t.configs {
                    check_len("config key", k, 1, MAX_CONFIG_KEY_LEN)?;
                    check_len("config value", v, 0, MAX_CONFIG_VALUE_LEN)?;
                }
                Ok(())
            }
            MetadataRecord::DeleteTopic { topic_id } => check_topic_id(topic_id),
            MetadataRecord::SetTopicConfig {
                topic_id,
                key,
                value,
            } => {
                check_topic_id(topic_id)?;
                check_len("config key", key, 1, MAX_CONFIG_KEY_LEN)?;
                if let Some(v) = value {
                    check_len("config value", v, 0, MAX_CONFIG_VALUE_LEN)?;
                }
                Ok(())
            }
            MetadataRecord::CreateRange(r) => {
                check_range_id("range_id", r.range_id)?;
                check_topic_id(&r.topic_id)?;
                if r.lo >= r.hi || r.hi > MAX_PARTITIONS {
                    return Err(E::invalid(
                        "range bounds",
                        format!("[{}, {}) is empty or beyond {MAX_PARTITIONS}", r.lo, r.hi),
                    ));
                }
                if r.parents.len() > MAX_RANGE_PARENTS {
                    return Err(E::invalid(
                        "parents",
                        format!("more than {MAX_RANGE_PARENTS}"),
                    ));
                }
                let mut seen = BTreeSet::new();
                for p in &r.parents {
                    check_range_id("parent", *p)?;
                    if *p == r.range_id {
                        return Err(E::invalid("parents", "a range cannot be its own parent"));
                    }
                    if !seen.insert(*p) {
                        return Err(E::invalid("parents", format!("duplicate parent {p}")));
                    }
                }
                Ok(())
            }
            MetadataRecord::SealRange { range_id } => check_range_id("range_id", *range_id),
            MetadataRecord::RetireRangeIds { below } => check_range_id("below", *below),
            MetadataRecord::OpenSegment(s) => {
                check_range_id("segment range", s.segment.range)?;
                check_replicas(&s.replicas)?;
                if s.leader_epoch < 0 {
                    return Err(E::invalid("leader_epoch", s.leader_epoch.to_string()));
                }
                Ok(())
            }
            MetadataRecord::SealSegment(s) => {
                check_range_id("segment range", s.segment.range)?;
                if s.leader_epoch.is_some_and(|e| e < 0) {
                    return Err(E::invalid("leader_epoch", format!("{:?}", s.leader_epoch)));
                }
                if s.size_bytes > i64::MAX as u64 {
                    return Err(E::invalid("size_bytes", s.size_bytes.to_string()));
                }
                let mut seen = BTreeSet::new();
                for sp in &s.spans {
                    check_partition("span partition", sp.partition)?;
                    if sp.start_offset < 0 || sp.end_offset < sp.start_offset {
                        return Err(E::invalid(
                            "span",
                            format!(
                                "partition {}: [{}, {}) is not a valid offset span",
                                sp.partition, sp.start_offset, sp.end_offset
                            ),
                        ));
                    }
                    if !seen.insert(sp.partition) {
                        return Err(E::invalid(
                            "spans",
                            format!("duplicate partition {}", sp.partition),
                        ));
                    }
                }
                Ok(())
            }
            MetadataRecord::DeleteSegment { segment } => {
                check_range_id("segment range", segment.range)
            }
            MetadataRecord::CleanSegments(c) => {
                check_range_id("range_id", c.range_id)?;
                if c.pass == 0 || c.pass > i64::MAX as u64 {
                    return Err(E::invalid("pass", c.pass.to_string()));
                }
                if c.delete_retention_ms < 0 {
                    return Err(E::invalid(
                        "delete_retention_ms",
                        c.delete_retention_ms.to_string(),
                    ));
                }
                for pair in c.segments.windows(2) {
                    if pair[1].seq <= pair[0].seq {
                        return Err(E::invalid(
                            "cleaned segments",
                            "seqs not strictly increasing",
                        ));
                    }
                }
                for s in &c.segments {
                    // A re-encoded batch may come out larger (recompressed).
                    if s.size_before > i64::MAX as u64 || s.size_after > i64::MAX as u64 {
                        return Err(E::invalid(
                            "cleaned segment size",
                            format!("segment {}: {} -> {}", s.seq, s.size_before, s.size_after),
                        ));
                    }
                }
                Ok(())
            }
            MetadataRecord::SetLogStartOffset {
                topic_id,
                partition,
                offset,
            } => {
                check_topic_id(topic_id)?;
                check_partition("partition", *partition)?;
                if *offset < 0 {
                    return Err(E::invalid("offset", offset.to_string()));
                }
                Ok(())
            }
            MetadataRecord::AllocateProducerIds {
                broker_id,
                first_producer_id,
                count,
            } => {
                check_broker_id("broker_id", *broker_id)?;
                if *first_producer_id < 0 {
                    return Err(E::invalid(
                        "first_producer_id",
                        first_producer_id.to_string(),
                    ));
                }
                if *count <= 0 {
                    return Err(E::invalid("count", count.to_string()));
                }
                if first_producer_id.checked_add(i64::from(*count)).is_none() {
                    return Err(E::invalid(
                        "count",
                        format!("block {first_producer_id} + {count} overflows i64"),
                    ));
                }
                Ok(())
            }
            MetadataRecord::SetBrokerConfig {
                broker_id,
                key,
                value,
            } => {
                if let Some(id) = broker_id {
                    check_broker_id("broker_id", *id)?;
                }
                check_len("config key", key, 1, MAX_BROKER_CONFIG_KEY_LEN)?;
                if let Some(v) = value {
                    check_len("config value", v, 0, MAX_CONFIG_VALUE_LEN)?;
                }
                Ok(())
            }
            MetadataRecord::IncreasePartitions {
                topic_id,
                partitions,
            } => {
                check_topic_id(topic_id)?;
                // A topic has at least one partition, so an increase makes 2+.
                if *partitions < 2 || *partitions > MAX_PARTITIONS {
                    return Err(E::invalid(
                        "partitions",
                        format!("{partitions} not in 2..={MAX_PARTITIONS}"),
                    ));
                }
                Ok(())
            }
            MetadataRecord::SetSegmentReplicas { segment, replicas } => {
                check_range_id("segment range", segment.range)?;
                check_replicas(replicas)
            }
            MetadataRecord::SetSegmentInSync {
                segment,
                leader_epoch,
                in_sync,
            } => {
                check_range_id("segment range", segment.range)?;
                if *leader_epoch < 0 {
                    return Err(E::invalid("leader_epoch", "negative".to_string()));
                }
                check_replicas(in_sync)
            }
            MetadataRecord::SetScramCredential(c) => {
                check_len("user", &c.user, 1, MAX_USER_NAME_LEN)?;
                let key_len = check_scram_mechanism(c.mechanism)?;
                if c.salt.is_empty() || c.salt.len() > MAX_SCRAM_SALT_LEN {
                    return Err(E::invalid(
                        "salt",
                        format!("length {} not in 1..={MAX_SCRAM_SALT_LEN}", c.salt.len()),
                    ));
                }
                if c.stored_key.len() != key_len || c.server_key.len() != key_len {
                    return Err(E::invalid(
                        "stored_key/server_key",
                        format!("not {key_len} bytes"),
                    ));
                }
                if !(MIN_SCRAM_ITERATIONS..=MAX_SCRAM_ITERATIONS).contains(&c.iterations) {
                    return Err(E::invalid(
                        "iterations",
                        format!(
                            "{} not in {MIN_SCRAM_ITERATIONS}..={MAX_SCRAM_ITERATIONS}",
                            c.iterations
                        ),
                    ));
                }
                Ok(())
            }
            MetadataRecord::RemoveScramCredential { user, mechanism } => {
                check_len("user", user, 1, MAX_USER_NAME_LEN)?;
                check_scram_mechanism(*mechanism).map(|_| ())
            }
            MetadataRecord::CreateAcl { id, acl } => {
                check_acl_id(id)?;
                acl.validate().map_err(|e| E::invalid("acl", e.0))
            }
            MetadataRecord::RemoveAcl { id } => check_acl_id(id),
            MetadataRecord::ClientQuota { entity, key, value } => {
                if entity.user.is_none() && entity.client_id.is_none() {
                    return Err(E::invalid("quota entity", "neither user nor client id"));
                }
                for (field, part) in [
                    ("quota user", &entity.user),
                    ("quota client id", &entity.client_id),
                ] {
                    if let Some(QuotaEntityName::Named(name)) = part {
                        check_len(field, name, 1, MAX_USER_NAME_LEN)?;
                    }
                }
                if !CLIENT_QUOTA_KEYS.contains(&key.as_str()) {
                    return Err(E::invalid("quota key", key.clone()));
                }
                if let Some(QuotaValue(v)) = value {
                    if !v.is_finite() || *v < 0.0 {
                        return Err(E::invalid("quota value", v.to_string()));
                    }
                }
                Ok(())
            }
        }
    }
}

/// A known SCRAM mechanism type byte; its key length.
fn check_scram_mechanism(mechanism: u8) -> Result<usize, RecordDecodeError> {
    scram_key_len(mechanism)
        .ok_or_else(|| RecordDecodeError::invalid("mechanism", mechanism.to_string()))
}

fn check_acl_id(id: &uuid::Uuid) -> Result<(), RecordDecodeError> {
    if id.is_nil() {
        return Err(RecordDecodeError::invalid("acl id", "nil uuid"));
    }
    Ok(())
}

/// A replica set: 1..=MAX_REPLICAS valid, distinct broker ids.
fn check_replicas(replicas: &[i32]) -> Result<(), RecordDecodeError> {
    use RecordDecodeError as E;
    if replicas.is_empty() || replicas.len() > MAX_REPLICAS {
        return Err(E::invalid(
            "replicas",
            format!("{} replicas, need 1..={MAX_REPLICAS}", replicas.len()),
        ));
    }
    let mut seen = BTreeSet::new();
    for r in replicas {
        check_broker_id("replica", *r)?;
        if !seen.insert(*r) {
            return Err(E::invalid("replicas", format!("duplicate broker {r}")));
        }
    }
    Ok(())
}

fn check_broker_id(field: &'static str, id: i32) -> Result<(), RecordDecodeError> {
    if id < 0 {
        return Err(RecordDecodeError::invalid(
            field,
            format!("negative broker id {id}"),
        ));
    }
    Ok(())
}

fn check_range_id(field: &'static str, id: RangeId) -> Result<(), RecordDecodeError> {
    if id == 0 {
        return Err(RecordDecodeError::invalid(field, "range id 0 is reserved"));
    }
    Ok(())
}

fn check_partition(field: &'static str, p: u32) -> Result<(), RecordDecodeError> {
    if p >= MAX_PARTITIONS {
        return Err(RecordDecodeError::invalid(
            field,
            format!("{p} >= {MAX_PARTITIONS}"),
        ));
    }
    Ok(())
}

fn check_topic_id(id: &TopicId) -> Result<(), RecordDecodeError> {
    // Kafka reserves the zero UUID ("no topic id").
    if id.is_nil() {
        return Err(RecordDecodeError::invalid("topic_id", "nil uuid"));
    }
    Ok(())
}

fn check_len(
    field: &'static str,
    s: &str,
    min: usize,
    max: usize,
) -> Result<(), RecordDecodeError> {
    if s.len() < min || s.len() > max {
        return Err(RecordDecodeError::invalid(
            field,
            format!("length {} not in {min}..={max}", s.len()),
        ));
    }
    Ok(())
}

/// Kafka's topic name rule: 1..=249 of `[a-zA-Z0-9._-]`, not "." or "..".
fn check_topic_name(name: &str) -> Result<(), RecordDecodeError> {
    check_len("topic name", name, 1, MAX_TOPIC_NAME_LEN)?;
    if name == "." || name == ".." {
        return Err(RecordDecodeError::invalid(
            "topic name",
            "'.' and '..' are not allowed",
        ));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
    {
        return Err(RecordDecodeError::invalid(
            "topic name",
            format!("illegal character in {name:?}"),
        ));
    }
    Ok(())
}

struct Writer(Vec<u8>);

impl Writer {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    fn i16(&mut self, v: i16) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    fn i32(&mut self, v: i32) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    fn i64(&mut self, v: i64) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    fn uuid(&mut self, v: &uuid::Uuid) {
        self.0.extend_from_slice(v.as_bytes());
    }
    fn segment(&mut self, s: &SegmentId) {
        self.u64(s.range);
        self.u32(s.seq);
    }
    fn count(&mut self, n: usize) {
        self.u32(u32::try_from(n).unwrap_or(u32::MAX));
    }
    /// A replica set: count, then the broker ids.
    fn replicas(&mut self, replicas: &[i32]) {
        self.count(replicas.len());
        for r in replicas {
            self.i32(*r);
        }
    }
    /// A string longer than the prefix allows is cut to the prefix's
    /// maximum; every u16-prefixed field has a limit below that, so the
    /// decoder rejects the result rather than misreading it.
    fn str16(&mut self, s: &str) {
        let b = s.as_bytes();
        let n = b.len().min(u16::MAX as usize);
        self.u16(n as u16);
        self.0.extend_from_slice(&b[..n]);
    }
    fn str32(&mut self, s: &str) {
        let b = s.as_bytes();
        let n = b.len().min(u32::MAX as usize);
        self.u32(n as u32);
        self.0.extend_from_slice(&b[..n]);
    }
    /// Bytes with a u16 length (cut like `str16`).
    fn bytes16(&mut self, b: &[u8]) {
        let n = b.len().min(u16::MAX as usize);
        self.u16(n as u16);
        self.0.extend_from_slice(&b[..n]);
    }
    /// A quota entity part: 0 absent, 1 the default entity, 2 a name.
    fn quota_entity_name(&mut self, name: Option<&QuotaEntityName>) {
        match name {
            None => self.u8(0),
            Some(QuotaEntityName::Default) => self.u8(1),
            Some(QuotaEntityName::Named(n)) => {
                self.u8(2);
                self.str16(n);
            }
        }
    }
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], RecordDecodeError> {
        let rest = self.buf.len() - self.pos;
        if rest < n {
            return Err(RecordDecodeError::Truncated {
                field,
                needed: n - rest,
            });
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], RecordDecodeError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N, field)?);
        Ok(a)
    }
    fn u8(&mut self, field: &'static str) -> Result<u8, RecordDecodeError> {
        Ok(self.array::<1>(field)?[0])
    }
    fn u16(&mut self, field: &'static str) -> Result<u16, RecordDecodeError> {
        Ok(u16::from_be_bytes(self.array(field)?))
    }
    fn i16(&mut self, field: &'static str) -> Result<i16, RecordDecodeError> {
        Ok(i16::from_be_bytes(self.array(field)?))
    }
    fn u32(&mut self, field: &'static str) -> Result<u32, RecordDecodeError> {
        Ok(u32::from_be_bytes(self.array(field)?))
    }
    fn i32(&mut self, field: &'static str) -> Result<i32, RecordDecodeError> {
        Ok(i32::from_be_bytes(self.array(field)?))
    }
    fn u64(&mut self, field: &'static str) -> Result<u64, RecordDecodeError> {
        Ok(u64::from_be_bytes(self.array(field)?))
    }
    fn i64(&mut self, field: &'static str) -> Result<i64, RecordDecodeError> {
        Ok(i64::from_be_bytes(self.array(field)?))
    }
    fn uuid(&mut self, field: &'static str) -> Result<uuid::Uuid, RecordDecodeError> {
        Ok(uuid::Uuid::from_bytes(self.array(field)?))
    }
    fn segment(&mut self) -> Result<SegmentId, RecordDecodeError> {
        Ok(SegmentId {
            range: self.u64("segment range")?,
            seq: self.u32("segment seq")?,
        })
    }
    /// A replica set as `Writer::replicas` wrote it.
    fn replicas(&mut self) -> Result<Vec<i32>, RecordDecodeError> {
        let n = self.count("replicas", 4)?;
        let mut replicas = Vec::with_capacity(n);
        for _ in 0..n {
            replicas.push(self.i32("replica")?);
        }
        Ok(replicas)
    }
    fn option(&mut self, field: &'static str) -> Result<bool, RecordDecodeError> {
        match self.u8(field)? {
            0 => Ok(false),
            1 => Ok(true),
            t => Err(RecordDecodeError::invalid(field, format!("option tag {t}"))),
        }
    }
    /// Reads an array count and checks it against the bytes left (each
    /// element takes at least `min_elem` bytes), so a corrupt count cannot
    /// make the decoder allocate without bound.
    fn count(&mut self, field: &'static str, min_elem: usize) -> Result<usize, RecordDecodeError> {
        let n = self.u32(field)? as usize;
        let rest = self.buf.len() - self.pos;
        if n.saturating_mul(min_elem) > rest {
            return Err(RecordDecodeError::Truncated {
                field,
                needed: n.saturating_mul(min_elem) - rest,
            });
        }
        Ok(n)
    }
    fn utf8(&mut self, n: usize, field: &'static str) -> Result<String, RecordDecodeError> {
        let b = self.take(n, field)?;
        std::str::from_utf8(b)
            .map(str::to_owned)
            .map_err(|_| RecordDecodeError::InvalidUtf8(field))
    }
    fn str16(&mut self, field: &'static str) -> Result<String, RecordDecodeError> {
        let n = self.u16(field)? as usize;
        self.utf8(n, field)
    }
    fn str32(&mut self, field: &'static str) -> Result<String, RecordDecodeError> {
        let n = self.u32(field)? as usize;
        self.utf8(n, field)
    }
    /// An ACL enum byte Kafka defines (UNKNOWN and ANY decode; validation
    /// refuses them).
    fn acl_enum<T>(
        &mut self,
        field: &'static str,
        from_code: fn(i8) -> Option<T>,
    ) -> Result<T, RecordDecodeError> {
        let b = self.u8(field)?;
        i8::try_from(b)
            .ok()
            .and_then(from_code)
            .ok_or_else(|| RecordDecodeError::invalid(field, b.to_string()))
    }

    fn quota_entity_name(
        &mut self,
        field: &'static str,
    ) -> Result<Option<QuotaEntityName>, RecordDecodeError> {
        match self.u8(field)? {
            0 => Ok(None),
            1 => Ok(Some(QuotaEntityName::Default)),
            2 => Ok(Some(QuotaEntityName::Named(self.str16(field)?))),
            t => Err(RecordDecodeError::invalid(field, format!("entity tag {t}"))),
        }
    }
    fn bytes16(&mut self, field: &'static str) -> Result<Vec<u8>, RecordDecodeError> {
        let n = self.u16(field)? as usize;
        Ok(self.take(n, field)?.to_vec())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    pub fn arb_uuid() -> impl Strategy<Value = uuid::Uuid> {
        any::<u128>().prop_map(|v| uuid::Uuid::from_u128(v.max(1)))
    }

    fn arb_name() -> impl Strategy<Value = String> {
        "[a-zA-Z0-9_-][a-zA-Z0-9._-]{0,40}"
    }

    fn arb_text(max: usize) -> impl Strategy<Value = String> {
        proptest::collection::vec(any::<char>(), 0..max).prop_map(|v| v.into_iter().collect())
    }

    fn arb_nonempty_text(max: usize) -> impl Strategy<Value = String> {
        proptest::collection::vec(any::<char>(), 1..max).prop_map(|v| v.into_iter().collect())
    }

    fn arb_quota_entity_name() -> impl Strategy<Value = QuotaEntityName> {
        prop_oneof![
            Just(QuotaEntityName::Default),
            arb_nonempty_text(20).prop_map(QuotaEntityName::Named),
        ]
    }

    fn arb_segment() -> impl Strategy<Value = SegmentId> {
        (1u64.., any::<u32>()).prop_map(|(range, seq)| SegmentId { range, seq })
    }

    /// Arbitrary records whose fields are all in range.
    pub fn arb_record() -> impl Strategy<Value = MetadataRecord> {
        prop_oneof![
            Just(MetadataRecord::NoOp),
            (
                0i32..,
                arb_uuid(),
                arb_nonempty_text(60),
                1u16..,
                proptest::option::of(arb_nonempty_text(20))
            )
                .prop_map(|(broker_id, incarnation_id, host, port, rack)| {
                    MetadataRecord::RegisterBroker(BrokerRegistration {
                        broker_id,
                        incarnation_id,
                        host,
                        port,
                        rack,
                    })
                }),
            (0i32..).prop_map(|broker_id| MetadataRecord::FenceBroker { broker_id }),
            (0i32..).prop_map(|broker_id| MetadataRecord::UnfenceBroker { broker_id }),
            (0i32..).prop_map(|broker_id| MetadataRecord::UnregisterBroker { broker_id }),
            (
                arb_uuid(),
                arb_name(),
                1u32..=MAX_PARTITIONS,
                1i16..=MAX_REPLICAS as i16,
                proptest::collection::btree_map(arb_nonempty_text(20), arb_text(30), 0..5)
            )
                .prop_map(
                    |(topic_id, name, partitions, replication_factor, configs)| {
                        MetadataRecord::CreateTopic(TopicRecord {
                            topic_id,
                            name,
                            partitions,
                            replication_factor,
                            configs,
                        })
                    }
                ),
            arb_uuid().prop_map(|topic_id| MetadataRecord::DeleteTopic { topic_id }),
            (
                arb_uuid(),
                arb_nonempty_text(20),
                proptest::option::of(arb_text(30))
            )
                .prop_map(|(topic_id, key, value)| MetadataRecord::SetTopicConfig {
                    topic_id,
                    key,
                    value
                }),
            (
                1u64..,
                arb_uuid(),
                0u32..MAX_PARTITIONS,
                1u32..1000,
                proptest::collection::btree_set(1u64.., 0..3)
            )
                .prop_map(|(range_id, topic_id, lo, width, parents)| {
                    MetadataRecord::CreateRange(RangeRecord {
                        range_id,
                        topic_id,
                        lo,
                        hi: (lo + width).min(MAX_PARTITIONS).max(lo + 1),
                        parents: parents.into_iter().filter(|p| *p != range_id).collect(),
                    })
                }),
            (1u64..).prop_map(|range_id| MetadataRecord::SealRange { range_id }),
            (1u64..).prop_map(|below| MetadataRecord::RetireRangeIds { below }),
            (
                arb_segment(),
                proptest::collection::btree_set(0i32.., 1..5),
                0i32..
            )
                .prop_map(|(segment, replicas, leader_epoch)| {
                    MetadataRecord::OpenSegment(SegmentOpenRecord {
                        segment,
                        replicas: replicas.into_iter().collect(),
                        leader_epoch,
                    })
                }),
            (
                arb_segment(),
                0u64..=i64::MAX as u64,
                proptest::collection::btree_map(
                    0u32..MAX_PARTITIONS,
                    (0i64..i64::MAX / 2, 0i64..1 << 40),
                    0..5
                ),
                proptest::option::of(0i32..)
            )
                .prop_map(|(segment, size_bytes, spans, leader_epoch)| {
                    MetadataRecord::SealSegment(SegmentSealRecord {
                        segment,
                        size_bytes,
                        leader_epoch,
                        spans: spans
                            .into_iter()
                            .map(|(partition, (start, len))| PartitionSpan {
                                partition,
                                start_offset: start,
                                end_offset: start + len,
                            })
                            .collect(),
                    })
                }),
            arb_segment().prop_map(|segment| MetadataRecord::DeleteSegment { segment }),
            (
                1u64..,
                1u64..=i64::MAX as u64,
                any::<i64>(),
                0i64..,
                proptest::collection::btree_map(
                    any::<u32>(),
                    (0u64..1 << 40, 0u64..1 << 40, any::<u32>()),
                    0..4
                )
            )
                .prop_map(|(range_id, pass, now_ms, delete_retention_ms, segs)| {
                    MetadataRecord::CleanSegments(CleanPassRecord {
                        range_id,
                        pass,
                        now_ms,
                        delete_retention_ms,
                        segments: segs
                            .into_iter()
                            .map(|(seq, (size_before, size_after, crc32c))| CleanedSegment {
                                seq,
                                size_before,
                                size_after,
                                crc32c,
                            })
                            .collect(),
                    })
                }),
            (arb_uuid(), 0u32..MAX_PARTITIONS, 0i64..).prop_map(|(topic_id, partition, offset)| {
                MetadataRecord::SetLogStartOffset {
                    topic_id,
                    partition,
                    offset,
                }
            }),
            (0i32.., prop_oneof![0i64..1 << 40, 0i64..i64::MAX], 1i32..).prop_map(
                |(broker_id, first_producer_id, count)| {
                    // Keep the block inside i64.
                    let room = i64::MAX - first_producer_id;
                    MetadataRecord::AllocateProducerIds {
                        broker_id,
                        first_producer_id,
                        count: i64::from(count).min(room) as i32,
                    }
                }
            ),
            (
                proptest::option::of(0i32..),
                arb_nonempty_text(20),
                proptest::option::of(arb_text(30))
            )
                .prop_map(|(broker_id, key, value)| MetadataRecord::SetBrokerConfig {
                    broker_id,
                    key,
                    value
                }),
            (arb_uuid(), 2u32..=MAX_PARTITIONS).prop_map(|(topic_id, partitions)| {
                MetadataRecord::IncreasePartitions {
                    topic_id,
                    partitions,
                }
            }),
            (
                arb_segment(),
                proptest::collection::btree_set(0i32..1000, 1..5)
            )
                .prop_map(|(segment, replicas)| MetadataRecord::SetSegmentReplicas {
                    segment,
                    replicas: replicas.into_iter().collect(),
                }),
            (
                arb_segment(),
                0i32..1000,
                proptest::collection::btree_set(0i32..1000, 1..5)
            )
                .prop_map(|(segment, leader_epoch, in_sync)| {
                    MetadataRecord::SetSegmentInSync {
                        segment,
                        leader_epoch,
                        in_sync: in_sync.into_iter().collect(),
                    }
                }),
            (
                arb_nonempty_text(20),
                1u8..=2,
                proptest::collection::vec(any::<u8>(), 1..40),
                any::<u8>(),
                MIN_SCRAM_ITERATIONS..=MAX_SCRAM_ITERATIONS
            )
                .prop_map(|(user, mechanism, salt, fill, iterations)| {
                    let n = scram_key_len(mechanism).unwrap();
                    MetadataRecord::SetScramCredential(ScramCredentialRecord {
                        user,
                        mechanism,
                        salt,
                        stored_key: vec![fill; n],
                        server_key: vec![fill.wrapping_add(1); n],
                        iterations,
                    })
                }),
            (arb_nonempty_text(20), 1u8..=2).prop_map(|(user, mechanism)| {
                MetadataRecord::RemoveScramCredential { user, mechanism }
            }),
            (
                arb_uuid(),
                2i8..=7,
                arb_nonempty_text(20),
                3i8..=4,
                arb_nonempty_text(10),
                arb_nonempty_text(10),
                2i8..=14,
                2i8..=3,
            )
                .prop_map(|(id, rt, name, pt, user, host, op, perm)| {
                    let resource_type = crate::acl::ResourceType::from_code(rt).unwrap();
                    MetadataRecord::CreateAcl {
                        id,
                        acl: AclBinding {
                            resource_type,
                            resource_name: if resource_type == crate::acl::ResourceType::Cluster {
                                crate::acl::CLUSTER_NAME.into()
                            } else {
                                name
                            },
                            pattern_type: crate::acl::PatternType::from_code(pt).unwrap(),
                            principal: format!("User:{user}"),
                            host,
                            operation: crate::acl::AclOperation::from_code(op).unwrap(),
                            permission: crate::acl::AclPermissionType::from_code(perm).unwrap(),
                        },
                    }
                }),
            arb_uuid().prop_map(|id| MetadataRecord::RemoveAcl { id }),
            (
                proptest::option::of(arb_quota_entity_name()),
                proptest::option::of(arb_quota_entity_name()),
                0..CLIENT_QUOTA_KEYS.len(),
                proptest::option::of(0.0f64..1e12)
            )
                .prop_filter("an entity has a part", |(u, c, _, _)| u.is_some()
                    || c.is_some())
                .prop_map(|(user, client_id, key, value)| {
                    MetadataRecord::ClientQuota {
                        entity: ClientQuotaEntity { user, client_id },
                        key: CLIENT_QUOTA_KEYS[key].to_string(),
                        value: value.map(QuotaValue),
                    }
                }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn encode_decode_round_trips(rec in arb_record()) {
            prop_assert_eq!(rec.validate(), Ok(()));
            let bytes = rec.encode();
            prop_assert_eq!(MetadataRecord::decode(&bytes), Ok(rec));
        }

        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = MetadataRecord::decode(&bytes);
        }

        /// Random bytes behind a valid type/version header reach the payload
        /// parsers, which plain random bytes rarely do.
        #[test]
        fn random_payloads_never_panic(ty in 0u16..=record_type::MAX + 1, bytes in proptest::collection::vec(any::<u8>(), 0..120)) {
            let mut v = ty.to_be_bytes().to_vec();
            v.extend_from_slice(&[0, 0]);
            v.extend_from_slice(&bytes);
            if let Ok(rec) = MetadataRecord::decode(&v) {
                // Whatever decodes re-encodes to the same bytes: the codec is canonical.
                prop_assert_eq!(rec.encode(), v);
            }
        }

        #[test]
        fn truncation_is_rejected(rec in arb_record(), cut in any::<prop::sample::Index>()) {
            let bytes = rec.encode();
            let at = cut.index(bytes.len());
            prop_assert!(MetadataRecord::decode(&bytes[..at]).is_err());
        }
    }

    fn topic(name: &str) -> TopicRecord {
        TopicRecord {
            topic_id: uuid::Uuid::from_u128(7),
            name: name.into(),
            partitions: 3,
            replication_factor: 1,
            configs: BTreeMap::new(),
        }
    }

    fn rejects(rec: MetadataRecord) -> RecordDecodeError {
        assert!(rec.validate().is_err(), "validate accepted {rec:?}");
        MetadataRecord::decode(&rec.encode()).expect_err("decode accepted an out-of-range record")
    }

    #[test]
    fn empty_noop_is_valid() {
        assert_eq!(MetadataRecord::NoOp.encode(), vec![0, 0, 0, 0]);
        assert_eq!(
            MetadataRecord::decode(&[0, 0, 0, 0]),
            Ok(MetadataRecord::NoOp)
        );
    }

    #[test]
    fn a_version_0_seal_decodes_without_a_leader_epoch_and_version_1_with_it() {
        let seal = |leader_epoch| {
            MetadataRecord::SealSegment(SegmentSealRecord {
                segment: SegmentId::new(3, 7),
                size_bytes: 100,
                spans: vec![],
                leader_epoch,
            })
        };
        let v0 = seal(None).encode();
        assert_eq!(&v0[..4], &[0, record_type::SEAL_SEGMENT as u8, 0, 0]);
        assert_eq!(MetadataRecord::decode(&v0), Ok(seal(None)));
        let v1 = seal(Some(9)).encode();
        assert_eq!(&v1[..4], &[0, record_type::SEAL_SEGMENT as u8, 0, 1]);
        assert_eq!(v1.len(), v0.len() + 4);
        assert_eq!(MetadataRecord::decode(&v1), Ok(seal(Some(9))));
        // Version 1 is the seal's only: other types still refuse it.
        let mut open = MetadataRecord::SealRange { range_id: 1 }.encode();
        open[3] = 1;
        assert!(MetadataRecord::decode(&open).is_err());
    }

    #[test]
    fn header_errors() {
        assert_eq!(
            MetadataRecord::decode(&[0, 99, 0, 0]),
            Err(RecordDecodeError::UnknownType(99))
        );
        assert_eq!(
            MetadataRecord::decode(&[0, 0, 0, 1]),
            Err(RecordDecodeError::UnknownVersion {
                record_type: 0,
                version: 1
            })
        );
        assert!(matches!(
            MetadataRecord::decode(&[0]),
            Err(RecordDecodeError::Truncated { .. })
        ));
        assert!(matches!(
            MetadataRecord::decode(&[]),
            Err(RecordDecodeError::Truncated { .. })
        ));
        assert_eq!(
            MetadataRecord::decode(&[0, 0, 0, 0, 5]),
            Err(RecordDecodeError::TrailingBytes(1))
        );
    }

    #[test]
    fn invalid_utf8_rejected() {
        let mut b = MetadataRecord::CreateTopic(topic("ab")).encode();
        // name bytes follow type(2) version(2) uuid(16) len(2)
        b[22] = 0xff;
        assert_eq!(
            MetadataRecord::decode(&b),
            Err(RecordDecodeError::InvalidUtf8("topic name"))
        );
    }

    #[test]
    fn bad_option_tag_rejected() {
        let mut b = MetadataRecord::SetTopicConfig {
            topic_id: uuid::Uuid::from_u128(1),
            key: "k".into(),
            value: None,
        }
        .encode();
        *b.last_mut().unwrap() = 2;
        assert!(matches!(
            MetadataRecord::decode(&b),
            Err(RecordDecodeError::InvalidValue {
                field: "config value",
                ..
            })
        ));
    }

    #[test]
    fn huge_count_does_not_allocate() {
        let mut b = MetadataRecord::OpenSegment(SegmentOpenRecord {
            segment: SegmentId::new(1, 0),
            replicas: vec![1],
            leader_epoch: 0,
        })
        .encode();
        // count follows header(4) + range(8) + seq(4)
        b[16..20].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(
            MetadataRecord::decode(&b),
            Err(RecordDecodeError::Truncated { .. })
        ));
    }

    #[test]
    fn out_of_range_values_rejected() {
        let mut t = topic("t");
        t.partitions = 0;
        rejects(MetadataRecord::CreateTopic(t));
        let mut t = topic("t");
        t.partitions = MAX_PARTITIONS + 1;
        rejects(MetadataRecord::CreateTopic(t));
        let mut t = topic("t");
        t.replication_factor = 0;
        rejects(MetadataRecord::CreateTopic(t));
        rejects(MetadataRecord::CreateTopic(topic("")));
        rejects(MetadataRecord::CreateTopic(topic("..")));
        rejects(MetadataRecord::CreateTopic(topic("a/b")));
        rejects(MetadataRecord::CreateTopic(topic(&"x".repeat(250))));
        let mut t = topic("t");
        t.topic_id = uuid::Uuid::nil();
        rejects(MetadataRecord::CreateTopic(t));

        let range = |lo, hi, parents: Vec<u64>| {
            MetadataRecord::CreateRange(RangeRecord {
                range_id: 5,
                topic_id: uuid::Uuid::from_u128(1),
                lo,
                hi,
                parents,
            })
        };
        rejects(range(3, 3, vec![]));
        rejects(range(4, 3, vec![]));
        rejects(range(0, MAX_PARTITIONS + 1, vec![]));
        rejects(range(0, 1, vec![5]));
        rejects(range(0, 1, vec![2, 2]));
        rejects(range(0, 1, vec![0]));
        rejects(MetadataRecord::SealRange { range_id: 0 });

        let open = |replicas: Vec<i32>, leader_epoch| {
            MetadataRecord::OpenSegment(SegmentOpenRecord {
                segment: SegmentId::new(1, 0),
                replicas,
                leader_epoch,
            })
        };
        rejects(open(vec![], 0));
        rejects(open(vec![1, 1], 0));
        rejects(open(vec![-1], 0));
        rejects(open(vec![1], -1));

        let seal = |start, end| {
            MetadataRecord::SealSegment(SegmentSealRecord {
                segment: SegmentId::new(1, 0),
                size_bytes: 10,
                leader_epoch: Some(0),
                spans: vec![PartitionSpan {
                    partition: 0,
                    start_offset: start,
                    end_offset: end,
                }],
            })
        };
        rejects(seal(-1, 3));
        rejects(MetadataRecord::SealSegment(SegmentSealRecord {
            segment: SegmentId::new(1, 0),
            size_bytes: 10,
            spans: vec![],
            leader_epoch: Some(-1),
        }));
        rejects(seal(5, 4));
        seal(5, 5).validate().unwrap();

        rejects(MetadataRecord::SetLogStartOffset {
            topic_id: uuid::Uuid::from_u128(1),
            partition: 0,
            offset: -1,
        });
        rejects(MetadataRecord::FenceBroker { broker_id: -1 });
        rejects(MetadataRecord::UnregisterBroker { broker_id: -1 });
        rejects(MetadataRecord::RegisterBroker(BrokerRegistration {
            broker_id: 1,
            incarnation_id: uuid::Uuid::from_u128(1),
            host: "h".into(),
            port: 0,
            rack: None,
        }));
        rejects(MetadataRecord::RegisterBroker(BrokerRegistration {
            broker_id: 1,
            incarnation_id: uuid::Uuid::from_u128(1),
            host: "h".repeat(70_000),
            port: 1,
            rack: None,
        }));
        rejects(MetadataRecord::SetTopicConfig {
            topic_id: uuid::Uuid::from_u128(1),
            key: String::new(),
            value: None,
        });
    }

    fn alloc(broker_id: i32, first_producer_id: i64, count: i32) -> MetadataRecord {
        MetadataRecord::AllocateProducerIds {
            broker_id,
            first_producer_id,
            count,
        }
    }

    #[test]
    fn allocate_producer_ids_codec() {
        let rec = alloc(3, 1000, 1000);
        let bytes = rec.encode();
        assert_eq!(
            bytes,
            [
                &[0u8, 13, 0, 0][..],
                &3i32.to_be_bytes(),
                &1000i64.to_be_bytes(),
                &1000i32.to_be_bytes()
            ]
            .concat()
        );
        assert_eq!(MetadataRecord::decode(&bytes), Ok(rec));
        // The largest block that ends exactly at i64::MAX is valid.
        alloc(0, i64::MAX - 1, 1).validate().unwrap();
        alloc(0, i64::MAX - 5, 5).validate().unwrap();
        alloc(0, 0, i32::MAX).validate().unwrap();
    }

    #[test]
    fn increase_partitions_codec() {
        let rec = MetadataRecord::IncreasePartitions {
            topic_id: uuid::Uuid::from_u128(9),
            partitions: 12,
        };
        let bytes = rec.encode();
        assert_eq!(
            bytes,
            [
                &[0u8, 15, 0, 0][..],
                uuid::Uuid::from_u128(9).as_bytes(),
                &12u32.to_be_bytes()
            ]
            .concat()
        );
        assert_eq!(MetadataRecord::decode(&bytes), Ok(rec));
        let increase = |topic_id: u128, partitions| MetadataRecord::IncreasePartitions {
            topic_id: uuid::Uuid::from_u128(topic_id),
            partitions,
        };
        rejects(increase(9, 0));
        rejects(increase(9, 1));
        rejects(increase(9, MAX_PARTITIONS + 1));
        rejects(increase(0, 5));
        increase(9, MAX_PARTITIONS).validate().unwrap();
        assert_eq!(
            MetadataRecord::decode(&[0, 26, 0, 0]),
            Err(RecordDecodeError::UnknownType(26))
        );
    }

    #[test]
    fn retire_range_ids_codec() {
        let rec = MetadataRecord::RetireRangeIds { below: 7 };
        assert_eq!(record_type::RETIRE_RANGE_IDS, 25);
        let bytes = rec.encode();
        assert_eq!(bytes, [0u8, 25, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7]);
        assert_eq!(MetadataRecord::decode(&bytes), Ok(rec));
        rejects(MetadataRecord::RetireRangeIds { below: 0 });
        assert!(MetadataRecord::decode(&[0, 25, 0, 0, 0, 0, 0, 0, 0, 0, 7]).is_err());
    }

    #[test]
    fn set_segment_in_sync_codec() {
        let rec = MetadataRecord::SetSegmentInSync {
            segment: SegmentId::new(7, 3),
            leader_epoch: 5,
            in_sync: vec![1, 3],
        };
        rec.validate().unwrap();
        assert_eq!(MetadataRecord::decode(&rec.encode()), Ok(rec));
        rejects(MetadataRecord::SetSegmentInSync {
            segment: SegmentId::new(7, 3),
            leader_epoch: -1,
            in_sync: vec![1],
        });
        rejects(MetadataRecord::SetSegmentInSync {
            segment: SegmentId::new(7, 3),
            leader_epoch: 1,
            in_sync: vec![],
        });
    }

    #[test]
    fn unregister_broker_codec() {
        let rec = MetadataRecord::UnregisterBroker { broker_id: 4 };
        assert_eq!(rec.record_type(), record_type::UNREGISTER_BROKER);
        assert_eq!(record_type::UNREGISTER_BROKER, 23);
        let bytes = rec.encode();
        assert_eq!(bytes, [0u8, 23, 0, 0, 0, 0, 0, 4]);
        assert_eq!(MetadataRecord::decode(&bytes), Ok(rec));
        rejects(MetadataRecord::UnregisterBroker { broker_id: -1 });
        // Truncated, trailing bytes, an unknown version.
        assert!(MetadataRecord::decode(&[0, 23, 0, 0, 0, 0, 4]).is_err());
        assert!(MetadataRecord::decode(&[0, 23, 0, 0, 0, 0, 0, 4, 0]).is_err());
        assert!(MetadataRecord::decode(&[0, 23, 0, 1, 0, 0, 0, 4]).is_err());
    }

    #[test]
    fn client_quota_codec() {
        let rec = MetadataRecord::ClientQuota {
            entity: ClientQuotaEntity {
                user: Some(QuotaEntityName::Named("al".into())),
                client_id: Some(QuotaEntityName::Default),
            },
            key: "producer_byte_rate".into(),
            value: Some(QuotaValue(1024.0)),
        };
        let bytes = rec.encode();
        let mut want = vec![0u8, 22, 0, 0, 2, 0, 2, b'a', b'l', 1, 0, 18];
        want.extend_from_slice(b"producer_byte_rate");
        want.push(1);
        want.extend_from_slice(&1024f64.to_bits().to_be_bytes());
        assert_eq!(bytes, want);
        assert_eq!(MetadataRecord::decode(&bytes), Ok(rec.clone()));
        // A removal of a client-id-only entity.
        let remove = MetadataRecord::ClientQuota {
            entity: ClientQuotaEntity {
                user: None,
                client_id: Some(QuotaEntityName::Named("c".into())),
            },
            key: "request_percentage".into(),
            value: None,
        };
        let mut want = vec![0u8, 22, 0, 0, 0, 2, 0, 1, b'c', 0, 18];
        want.extend_from_slice(b"request_percentage");
        want.push(0);
        assert_eq!(remove.encode(), want);
        assert_eq!(MetadataRecord::decode(&want), Ok(remove));
        let with = |f: &dyn Fn(&mut ClientQuotaEntity, &mut String, &mut Option<QuotaValue>)| {
            let MetadataRecord::ClientQuota {
                mut entity,
                mut key,
                mut value,
            } = rec.clone()
            else {
                unreachable!()
            };
            f(&mut entity, &mut key, &mut value);
            MetadataRecord::ClientQuota { entity, key, value }
        };
        rejects(with(&|e, _, _| *e = ClientQuotaEntity::default()));
        rejects(with(&|e, _, _| {
            e.user = Some(QuotaEntityName::Named(String::new()))
        }));
        rejects(with(&|_, k, _| *k = "ip_connection_rate".into()));
        rejects(with(&|_, _, v| *v = Some(QuotaValue(f64::NAN))));
        rejects(with(&|_, _, v| *v = Some(QuotaValue(f64::INFINITY))));
        rejects(with(&|_, _, v| *v = Some(QuotaValue(-1.0))));
        // A bad entity tag.
        let mut bad = bytes.clone();
        bad[4] = 3;
        assert!(MetadataRecord::decode(&bad).is_err());
        for key in CLIENT_QUOTA_KEYS {
            with(&|_, k, _| *k = key.to_string()).validate().unwrap();
        }
    }

    #[test]
    fn scram_credential_codec() {
        let rec = MetadataRecord::SetScramCredential(ScramCredentialRecord {
            user: "al".into(),
            mechanism: 1,
            salt: vec![7],
            stored_key: vec![1; 32],
            server_key: vec![2; 32],
            iterations: 4096,
        });
        let bytes = rec.encode();
        assert_eq!(
            bytes,
            [
                &[0u8, 17, 0, 0, 0, 2, b'a', b'l', 1, 0, 1, 7, 0, 32][..],
                &[1; 32],
                &[0, 32],
                &[2; 32],
                &4096u32.to_be_bytes(),
            ]
            .concat()
        );
        assert_eq!(MetadataRecord::decode(&bytes), Ok(rec.clone()));
        let with = |f: &dyn Fn(&mut ScramCredentialRecord)| {
            let MetadataRecord::SetScramCredential(mut c) = rec.clone() else {
                unreachable!()
            };
            f(&mut c);
            MetadataRecord::SetScramCredential(c)
        };
        rejects(with(&|c| c.mechanism = 3));
        rejects(with(&|c| c.user.clear()));
        rejects(with(&|c| c.salt.clear()));
        rejects(with(&|c| c.stored_key.pop().map(|_| ()).unwrap_or(())));
        rejects(with(&|c| c.mechanism = 2));
        rejects(with(&|c| c.iterations = 4095));
        rejects(with(&|c| c.iterations = 16385));
        let remove = MetadataRecord::RemoveScramCredential {
            user: "al".into(),
            mechanism: 2,
        };
        assert_eq!(remove.encode(), vec![0u8, 18, 0, 0, 0, 2, b'a', b'l', 2]);
        assert_eq!(MetadataRecord::decode(&remove.encode()), Ok(remove));
        rejects(MetadataRecord::RemoveScramCredential {
            user: "al".into(),
            mechanism: 0,
        });
    }

    #[test]
    fn acl_codec() {
        let acl = AclBinding {
            resource_type: ResourceType::Topic,
            resource_name: "a-".into(),
            pattern_type: PatternType::Prefixed,
            principal: "User:al".into(),
            host: "*".into(),
            operation: AclOperation::Read,
            permission: AclPermissionType::Allow,
        };
        let id = uuid::Uuid::from_u128(1);
        let rec = MetadataRecord::CreateAcl {
            id,
            acl: acl.clone(),
        };
        let bytes = rec.encode();
        assert_eq!(
            bytes,
            [
                &[0u8, 19, 0, 0][..],
                id.as_bytes(),
                &[2, 0, 2, b'a', b'-', 4, 0, 7],
                b"User:al",
                &[0, 1, b'*', 3, 3],
            ]
            .concat()
        );
        assert_eq!(MetadataRecord::decode(&bytes), Ok(rec.clone()));
        let with = |f: &dyn Fn(&mut AclBinding)| {
            let mut a = acl.clone();
            f(&mut a);
            MetadataRecord::CreateAcl { id, acl: a }
        };
        rejects(MetadataRecord::CreateAcl {
            id: uuid::Uuid::nil(),
            acl: acl.clone(),
        });
        rejects(with(&|a| a.resource_type = ResourceType::Any));
        rejects(with(&|a| a.pattern_type = PatternType::Match));
        rejects(with(&|a| a.operation = AclOperation::Unknown));
        rejects(with(&|a| a.permission = AclPermissionType::Any));
        rejects(with(&|a| a.principal = "al".into()));
        rejects(with(&|a| a.resource_name.clear()));
        rejects(with(&|a| a.host.clear()));
        rejects(with(&|a| a.resource_type = ResourceType::Cluster));
        // An enum byte Kafka does not define.
        let mut bad = bytes.clone();
        bad[20] = 9;
        assert!(MetadataRecord::decode(&bad).is_err());
        let remove = MetadataRecord::RemoveAcl { id };
        assert_eq!(
            remove.encode(),
            [&[0u8, 20, 0, 0][..], id.as_bytes()].concat()
        );
        assert_eq!(MetadataRecord::decode(&remove.encode()), Ok(remove));
        rejects(MetadataRecord::RemoveAcl {
            id: uuid::Uuid::nil(),
        });
    }

    #[test]
    fn allocate_producer_ids_out_of_range_rejected() {
        let field = |e: RecordDecodeError| match e {
            RecordDecodeError::InvalidValue { field, .. } => field,
            other => panic!("unexpected {other:?}"),
        };
        assert_eq!(field(rejects(alloc(1, -1, 10))), "first_producer_id");
        assert_eq!(field(rejects(alloc(1, i64::MIN, 10))), "first_producer_id");
        assert_eq!(field(rejects(alloc(1, 0, 0))), "count");
        assert_eq!(field(rejects(alloc(1, 0, -5))), "count");
        assert_eq!(field(rejects(alloc(-1, 0, 10))), "broker_id");
        assert_eq!(field(rejects(alloc(1, i64::MAX, 1))), "count");
        assert_eq!(field(rejects(alloc(1, i64::MAX - 4, 5))), "count");
        assert_eq!(field(rejects(alloc(1, i64::MAX - 9, i32::MAX))), "count");
    }

    fn broker_config(broker_id: Option<i32>, key: &str, value: Option<&str>) -> MetadataRecord {
        MetadataRecord::SetBrokerConfig {
            broker_id,
            key: key.into(),
            value: value.map(Into::into),
        }
    }

    #[test]
    fn set_broker_config_codec() {
        // The cluster default, set: type 14, version 0, no broker id, key, value.
        let rec = broker_config(None, "log.retention.ms", Some("1000"));
        let bytes = rec.encode();
        let mut want = vec![0u8, 14, 0, 0, 0];
        want.extend_from_slice(&16u16.to_be_bytes());
        want.extend_from_slice(b"log.retention.ms");
        want.push(1);
        want.extend_from_slice(&4u32.to_be_bytes());
        want.extend_from_slice(b"1000");
        assert_eq!(bytes, want);
        assert_eq!(MetadataRecord::decode(&bytes), Ok(rec));
        // One broker's value, deleted.
        let rec = broker_config(Some(3), "message.max.bytes", None);
        let bytes = rec.encode();
        let mut want = vec![0u8, 14, 0, 0, 1, 0, 0, 0, 3];
        want.extend_from_slice(&17u16.to_be_bytes());
        want.extend_from_slice(b"message.max.bytes");
        want.push(0);
        assert_eq!(bytes, want);
        assert_eq!(MetadataRecord::decode(&bytes), Ok(rec));
        // An empty value is a value (not a delete).
        let rec = broker_config(Some(0), "log.cleanup.policy", Some(""));
        assert_eq!(MetadataRecord::decode(&rec.encode()), Ok(rec));
    }

    #[test]
    fn set_broker_config_out_of_range_rejected() {
        let field = |e: RecordDecodeError| match e {
            RecordDecodeError::InvalidValue { field, .. } => field,
            other => panic!("unexpected {other:?}"),
        };
        assert_eq!(
            field(rejects(broker_config(Some(-1), "k", None))),
            "broker_id"
        );
        assert_eq!(
            field(rejects(broker_config(None, "", Some("v")))),
            "config key"
        );
        assert_eq!(
            field(rejects(broker_config(None, &"k".repeat(256), None))),
            "config key"
        );
        // Bad option tags for the broker id and the value.
        let mut b = broker_config(Some(1), "k", None).encode();
        b[4] = 2;
        assert_eq!(field(MetadataRecord::decode(&b).unwrap_err()), "broker_id");
        let mut b = broker_config(None, "k", None).encode();
        *b.last_mut().unwrap() = 7;
        assert_eq!(
            field(MetadataRecord::decode(&b).unwrap_err()),
            "config value"
        );
    }
}
