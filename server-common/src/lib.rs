//! What the gateway and the coordinators share (Kafka's `server-common`
//! and `coordinator-common`): the Kafka API error and its error-code
//! table, the internal topics' names and partitioning, and the seam the
//! group and transaction coordinators see the broker through
//! ([`coordinator::PartitionWriter`], [`coordinator::ProducerIdSource`],
//! [`coordinator::TxnMarkerWriter`]) so that they never import it.

pub mod coordinator;
pub mod error;
pub mod ids;
pub mod internal_topics;

pub use error::ApiError;
