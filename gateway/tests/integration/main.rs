//! The gateway's integration tests: in-process brokers on free loopback
//! ports, driven over the Kafka wire. One module per concern, one test
//! binary (a binary per file cost a link of the whole gateway each: most
//! of `cargo test`'s time in CI). Run one with
//! `cargo test -p tessera-gateway --test integration quotas::`.

mod common;

mod acl;
mod admin_partitions;
mod alter_configs;
mod bad_input;
mod cluster;
mod compaction;
mod compression;
mod connections;
mod consumer_groups;
mod groups_wire;
mod migrate;
mod offset_for_leader_epoch;
mod quotas;
mod ranges;
mod retention;
mod sasl;
mod transactions;
