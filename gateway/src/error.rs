//! The gateway's own errors (configuration, `tessera migrate`). The Kafka
//! API error and its one table of Kafka error codes live in
//! `tessera-server-common` ([`ApiError`]), shared with the coordinators.

use thiserror::Error;

pub use tessera_server_common::error::*;

/// Configuration problems found at startup.
#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("unknown config key {0:?}")]
    UnknownKey(String),
    #[error("invalid value {value:?} for {key}")]
    InvalidValue { key: String, value: String },
    #[error("config file: {0}")]
    Toml(String),
    #[error("reading config: {0}")]
    Io(String),
}

/// Why `tessera migrate` stops (its exit status is non-zero).
#[derive(Debug, Error)]
pub enum MigrateError {
    #[error("invalid argument: {0}")]
    Argument(String),
    #[error("{0}: {1}")]
    Connect(String, String),
    #[error("{broker} does not serve {api}")]
    Unsupported { broker: String, api: String },
    #[error("protocol: {0}")]
    Codec(String),
    #[error("{broker} answered {what} with error {code}: {message}")]
    Broker {
        broker: String,
        what: String,
        code: i16,
        message: String,
    },
    #[error("no leader for {0}-{1}")]
    NoLeader(String, i32),
    /// The target cannot take this topic: nothing was written.
    #[error("target topic {topic}: {reason}")]
    TargetConflict { topic: String, reason: String },
    #[error("{topic}-{partition}: {reason}")]
    Partition {
        topic: String,
        partition: i32,
        reason: String,
    },
    #[error("verification failed for {0} partition(s); see above")]
    VerificationFailed(usize),
}
