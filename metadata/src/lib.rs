//! Metadata.
