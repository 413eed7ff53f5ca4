//! Per-segment replication: placement of a new segment's replicas, the
//! quorum arithmetic of commits and seals and the follower's rules (pure, so
//! the simulation in `tests/` drives the same code the broker does), when
//! a broker may lead a range (`leading`), the
//! wire protocol between primary and followers, and its I/O: the primary's
//! shipping tasks (`primary`), the follower's copies (`replica_store`) and
//! the follower side of the stream, fences and repairs (`service`), and
//! the producer snapshot a follower without the older segments fetches
//! (`snapshot_transfer`), and how connections to peers authenticate
//! (`auth`).

pub mod auth;
pub mod follower;
pub mod leading;
pub mod placement;
pub mod primary;
pub mod protocol;
pub mod quorum;
pub mod replica_store;
pub mod service;
pub mod snapshot_transfer;

pub use follower::{FollowerSegment, Offer, SealAction};
pub use leading::short_copies;
pub use placement::{place_replicas, place_replicas_led_by, BrokerCandidate, PlacementError};
pub use quorum::{
    commit_quorum, committed_across, committed_end, fence_quorum, quorum_size, seal_point,
    FenceReport,
};
