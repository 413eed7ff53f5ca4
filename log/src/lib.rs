//! Tessera's storage: range logs made of segment files, their per-partition
//! and time indexes, crash recovery and group commit.

pub mod aborted_index_file;
pub mod batch;
pub mod clean_pass;
pub mod cleaner;
pub mod error;
pub mod producer_snapshot;
pub mod producer_snapshot_file;
pub mod producer_state;
pub mod range_log;
pub mod records;
pub mod segment;
pub mod txn_state;
pub mod validator;

pub use error::{BatchError, LogError};
pub use range_log::{
    now_ms, AppendOutcome, FrameChunk, PartitionOffsets, RangeLog, RangeLogOptions, RangeSeed,
    ReadOutcome, SealedSegment,
};
