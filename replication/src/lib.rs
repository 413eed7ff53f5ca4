//! Per-segment replication.
