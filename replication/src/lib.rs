//! Per-segment replication: placement of a new segment's replicas, the
//! quorum arithmetic of commits and seals, and the follower's rules (all
//! pure, so the simulation in `tests/` drives the same code the broker does);
//! `protocol` is the wire form of the stream between primary and followers.

pub mod follower;
pub mod placement;
pub mod protocol;
pub mod quorum;

pub use follower::{FollowerSegment, Offer, SealAction};
pub use placement::{place_replicas, BrokerCandidate, PlacementError};
pub use quorum::{committed_end, quorum_size, seal_point, FenceReport};
