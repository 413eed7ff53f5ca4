//! Tessera's metadata layer: the KRaft-style metadata log.
//!
//! Every metadata change is a [`MetadataRecord`] encoded with an explicit,
//! versioned binary codec ([`records`]), appended to an openraft log by the
//! [`Controller`] ([`controller`]; a quorum of 1, 3 or 5 voters talking over
//! the TCP transport in [`network`]) and replayed into an immutable
//! [`MetadataImage`] ([`image`]). All replay paths (live apply, restart
//! recovery, snapshot load) go through one function,
//! [`decode_committed_value`] ([`replay`]), so that every replica and every
//! restart reaches the same image from the same bytes.

pub mod acl;
pub mod controller;
pub mod error;
pub mod heartbeats;
pub mod image;
pub mod network;
pub mod network_auth;
pub mod records;
pub mod replay;

mod storage;

pub use controller::*;
pub use error::*;
pub use image::*;
pub use records::*;
pub use replay::*;

/// Id of a topic (Kafka topic id).
pub type TopicId = uuid::Uuid;

/// Id of a range: a half-open interval of one topic's partitions, the unit of
/// storage, replication and leadership. `0` is never a valid range id.
pub type RangeId = u64;

/// Id of one segment of a range's log: the range and the segment's position
/// in that range's chain. Ordering is by range, then seq, so all segments of a
/// range are adjacent in a `BTreeMap<SegmentId, _>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SegmentId {
    pub range: RangeId,
    pub seq: u32,
}

impl SegmentId {
    pub fn new(range: RangeId, seq: u32) -> Self {
        SegmentId { range, seq }
    }
}

impl std::fmt::Display for SegmentId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.range, self.seq)
    }
}
