//! Kafka's `__consumer_offsets` record schemas, byte for byte: a key starts
//! with an int16 record type (Kafka calls it the key version: 0 and 1 are
//! offset commits, 2 is group metadata; 3 and up are KIP-848 and share-group
//! records), a value with an int16 value version.
//!
//! Written: `OffsetCommitKey` type 1, `OffsetCommitValue` v3,
//! `GroupMetadataKey` type 2, `GroupMetadataValue` v3; a delete is the key
//! with a null value (tombstone). Read: every value version Kafka defines
//! (0–4; v4 is the first flexible one), so a log written by Kafka replays.

use bytes::{BufMut, Bytes, BytesMut};
use thiserror::Error;

/// Record type of an offset commit key (Kafka writes 1; 0 is the legacy form, same layout).
pub const OFFSET_COMMIT_KEY: i16 = 1;
/// Record type of a group metadata key.
pub const GROUP_METADATA_KEY: i16 = 2;
/// Value versions written.
pub const OFFSET_COMMIT_VALUE_VERSION: i16 = 3;
pub const GROUP_METADATA_VALUE_VERSION: i16 = 3;

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
    /// A record type this build does not read (KIP-848 consumer groups,
    /// share groups): skipped at replay.
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
            CoordinatorRecord::Other { record_type } => {
                key.put_i16(*record_type);
                (Some(key.freeze()), None)
            }
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
            other => Ok(CoordinatorRecord::Other { record_type: other }),
        }
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
            CoordinatorRecord::decode(Some(&[0, 5, 1, 2]), Some(&[0, 0])).unwrap(),
            CoordinatorRecord::Other { record_type: 5 }
        );
        assert!(CoordinatorRecord::decode(None, None).is_err());
        assert_eq!(
            CoordinatorRecord::decode(Some(&[0, 1, 0, 9, b'g']), None),
            Err(RecordError::Truncated)
        );
        assert!(decode_offset_commit_value(&[0, 9]).is_err());
        assert!(decode_group_metadata_value(&[0, 3, 0]).is_err());
    }
}
