//! Per-segment replication. Today: replica placement (pure decision logic).
//! The single-node broker runs every segment with replication factor 1, so
//! the primary is the whole quorum; followers, seal-by-quorum and healing
//! build on this placement (see docs/ARCHITECTURE.md, "Not done yet").

pub mod placement;

pub use placement::{place_replicas, BrokerCandidate, PlacementError};
