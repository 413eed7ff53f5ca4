//! Error types of the metadata crate.
//!
//! Three layers, because callers react differently to each:
//! [`RecordDecodeError`] says why bytes are not a record this build reads,
//! [`MetadataReplayError`] is what replay reports (always fatal to the
//! controller), and [`MetadataError`] is what the controller API returns.

use std::path::PathBuf;

/// Why a byte string is not a metadata record this build can read.
///
/// Decided by the bytes alone (never by the image), so every replica reaches
/// the same verdict on the same bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordDecodeError {
    #[error("unknown record type {0}")]
    UnknownType(u16),
    #[error("unknown version {version} of record type {record_type}")]
    UnknownVersion { record_type: u16, version: u16 },
    #[error("truncated record: needed {needed} more bytes reading {field}")]
    Truncated { field: &'static str, needed: usize },
    #[error("{0} trailing bytes after record")]
    TrailingBytes(usize),
    #[error("invalid UTF-8 in {0}")]
    InvalidUtf8(&'static str),
    #[error("invalid value for {field}: {detail}")]
    InvalidValue { field: &'static str, detail: String },
}

impl RecordDecodeError {
    pub fn invalid(field: &'static str, detail: impl Into<String>) -> Self {
        RecordDecodeError::InvalidValue {
            field,
            detail: detail.into(),
        }
    }
}

/// A committed value that replay cannot go past.
///
/// Always fatal: skipping an undecodable record on one replica and not on
/// another (say, a newer build) would make the images diverge, so the
/// controller stops, as Kafka's does.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetadataReplayError {
    #[error("undecodable metadata record at offset {offset}: {reason}")]
    UndecodableRecord {
        offset: i64,
        #[source]
        reason: RecordDecodeError,
    },
}

/// Errors of the controller API.
#[derive(Debug, thiserror::Error)]
pub enum MetadataError {
    #[error("I/O error ({context}): {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// On-disk state (log, snapshot, vote) is damaged beyond a torn tail.
    #[error("corrupt metadata storage: {0}")]
    Corrupt(String),
    #[error(transparent)]
    Replay(#[from] MetadataReplayError),
    /// A write was refused before it reached the log, because the record
    /// would not decode on replay (an undecodable committed record is fatal).
    #[error("record {index} of the write is invalid: {reason}")]
    InvalidRecord {
        index: usize,
        #[source]
        reason: RecordDecodeError,
    },
    /// The controller stopped on an undecodable committed record.
    #[error("metadata controller failed: an undecodable record stopped it")]
    Failed,
    /// This node is not the leader of the controller quorum. `leader` is
    /// the leader it knows of (id and controller address), if any.
    #[error("not the metadata leader ({})", match leader {
        Some(l) => format!("the leader is {l}"),
        None => "no leader known".to_string(),
    })]
    NotLeader {
        leader: Option<crate::controller::ControllerLeader>,
    },
    /// Another controller holds the data directory.
    #[error("metadata directory {0} is locked by another controller")]
    Locked(PathBuf),
    #[error("timed out waiting for a metadata leader and for this controller to catch up")]
    StartTimeout,
    /// A wait on the quorum (catch-up, applying a forwarded write) timed
    /// out.
    #[error("metadata controller timed out: {0}")]
    Timeout(String),
    /// The controller configuration is invalid, or does not match the
    /// metadata log (another voter set).
    #[error("invalid metadata controller configuration: {0}")]
    Config(String),
    #[error("metadata controller is shut down")]
    Shutdown,
    /// Any other error reported by openraft.
    #[error("raft: {0}")]
    Raft(String),
}

impl MetadataError {
    /// Whether the same write may succeed if tried again: the quorum was
    /// between leaders, or the leader it was forwarded to was stopping.
    /// The rest (invalid records, damaged or locked storage, a failed or
    /// stopped controller, bad configuration) will fail the same way.
    pub fn is_retriable(&self) -> bool {
        matches!(
            self,
            MetadataError::NotLeader { .. }
                | MetadataError::Timeout(_)
                | MetadataError::StartTimeout
                | MetadataError::Raft(_)
        )
    }

    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        MetadataError::Io {
            context: context.into(),
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_quorum_between_leaders_is_worth_a_retry() {
        assert!(MetadataError::NotLeader { leader: None }.is_retriable());
        assert!(MetadataError::Timeout("forwarded write".into()).is_retriable());
        assert!(MetadataError::Raft("leader changed".into()).is_retriable());
        assert!(!MetadataError::Shutdown.is_retriable());
        assert!(!MetadataError::Failed.is_retriable());
        assert!(!MetadataError::Config("voters".into()).is_retriable());
        assert!(!MetadataError::Corrupt("log".into()).is_retriable());
    }
}
