//! The log crate's error types.

use thiserror::Error;

/// A record batch that cannot be accepted as produced.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum BatchError {
    #[error("corrupt record batch: {0}")]
    Corrupt(&'static str),
    #[error("record batch CRC-32C mismatch")]
    CrcMismatch,
    #[error("unsupported record batch magic {0}")]
    UnsupportedMagic(i8),
    #[error("encoding a record batch: {0}")]
    Encode(String),
}

/// Errors of the range log.
#[derive(Debug, Error)]
pub enum LogError {
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    #[error("partition {0} is not in this range")]
    PartitionNotInRange(u32),
    #[error("offset {offset} is outside [{log_start}, {log_end}]")]
    OffsetOutOfRange {
        offset: i64,
        log_start: i64,
        log_end: i64,
    },
    #[error("a migrated batch at offset {offset} is below the partition's log end {log_end}")]
    OffsetBelowLogEnd { offset: i64, log_end: i64 },
    #[error("the log's storage failed earlier and refuses further writes")]
    StorageFailed,
    #[error("the range log is closed")]
    Closed,
    #[error("the segment is sealed and takes no appends")]
    SegmentSealed,
    /// Appended, but fewer replicas than the commit needs are in sync now
    /// (Kafka's NOT_ENOUGH_REPLICAS_AFTER_APPEND): it may or may not commit.
    #[error("appended, but too few replicas are in sync to commit it")]
    NotEnoughReplicasAfterAppend,
    #[error("sealed segment {0} is not held here")]
    SegmentNotFound(u32),
    #[error(transparent)]
    Batch(#[from] BatchError),
    #[error(transparent)]
    Sequence(#[from] crate::producer_state::SequenceError),
}
