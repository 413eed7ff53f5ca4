//! Broker configuration: Kafka's key names and defaults, read from a TOML
//! file, then `TESSERA_*` environment variables, then command-line overrides.
//!
//! Every source is flattened to `key -> string` first (so TOML may write
//! `log.dirs = ".."` as a dotted key, a quoted key, or a `[log]` table), and
//! one function turns that map into a typed [`BrokerConfig`].

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use crate::error::ConfigError;
use crate::listeners::{is_listener_key, parse_endpoint, parse_listeners, Listener};

/// The typed broker configuration.
#[derive(Clone, Debug)]
pub struct BrokerConfig {
    /// `node.id`
    pub node_id: i32,
    /// `listeners` (with `listener.security.protocol.map`,
    /// `advertised.listeners` and the SASL settings of each).
    pub listeners: Vec<Listener>,
    /// The TLS configuration of SSL and SASL_SSL listeners (None when
    /// there is none), built from the `ssl.*` keys at startup and
    /// replaced when certificates rotate (`tls::ListenerTls`).
    pub tls: Option<std::sync::Arc<crate::tls::ListenerTls>>,
    /// Index in `listeners` of the inter-broker listener.
    pub inter_broker_listener: usize,
    /// How this broker's own connections to the other brokers' inter-broker
    /// listener authenticate (`sasl.mechanism.inter.broker.protocol`, the
    /// listener's JAAS `username`/`password`, the `ssl.*` keystore).
    pub inter_broker_client: crate::inter_broker::ClientSettings,
    /// The KRaft controller listener when it is SSL or SASL_*: how the
    /// metadata quorum transport authenticates, both ways. `None`: PLAINTEXT.
    pub controller_security: Option<crate::inter_broker::ControllerSecurity>,
    /// The inter-broker listener's address (`inter.broker.listener.name`;
    /// by default the first PLAINTEXT listener, else the first one): what
    /// this broker registers, and where peers reach it.
    pub listener: SocketAddr,
    /// The inter-broker listener's advertised host and port.
    pub advertised_host: String,
    pub advertised_port: u16,
    /// `admin.listener`: HTTP address for /metrics, /health, /ready, the
    /// ranges API and the web console.
    pub admin_listener: SocketAddr,
    /// `admin.listener.ssl.enable`: the admin port (console included)
    /// speaks TLS with the keys and client-auth rule of the first SSL or
    /// SASL_SSL Kafka listener (false). Tessera's own key.
    pub admin_listener_ssl_enable: bool,
    /// `console.enable`: the web console at `/` of the admin listener
    /// (true). Tessera's own key, as are the two below.
    pub console_enable: bool,
    /// `console.read.only`: the console shows and changes nothing (false).
    pub console_read_only: bool,
    /// `console.messages.enable`: the console shows message contents (true).
    pub console_messages_enable: bool,
    /// `log.dirs`
    pub data_dir: PathBuf,
    /// `broker.rack`
    pub rack: Option<String>,
    /// `process.roles=controller` (Kafka's isolated controller): a metadata
    /// quorum voter that runs the active controller's duties (fencing,
    /// failover, healing, re-placement) when it leads, and the admin
    /// listener; it registers as no broker and has no Kafka listener
    /// (`listeners` is empty; `listener` and the advertised address are its
    /// own entry in `controller.quorum.voters`).
    pub controller_only: bool,
    /// `controller.quorum.voters` (`1@host:port,2@host:port,...`): the
    /// metadata quorum, each voter's controller listener. Empty: this node
    /// is the only voter and listens for no other.
    pub controller_quorum_voters: String,
    /// `process.roles=broker` (a broker-only node): `Some(address)` where it
    /// listens for the metadata log, which it follows as a learner of the
    /// controller quorum (`metadata.listener`; default: the host of
    /// `listeners`, a free port). `None` for a controller and broker.
    pub metadata_learner_listener: Option<String>,
    /// `broker.heartbeat.interval.ms`: how often this broker tells the
    /// active controller it is alive.
    pub broker_heartbeat_interval_ms: u64,
    /// `broker.session.timeout.ms`: a broker not heard from for this long is
    /// fenced by the active controller.
    pub broker_session_timeout_ms: u64,
    /// `num.partitions`
    pub num_partitions: u32,
    /// `default.replication.factor`
    pub default_replication_factor: i16,
    /// `auto.create.topics.enable`
    pub auto_create_topics: bool,
    /// `migration.append.enable` (tessera only): whether this broker takes
    /// MigrateAppend requests, which write copied batches at their source
    /// offsets (`tessera migrate`). Off by default.
    pub migration_append_enable: bool,
    /// `socket.request.max.bytes`
    pub socket_request_max_bytes: usize,
    /// `sasl.server.max.receive.size`: the largest frame a SASL listener
    /// reads before the client has authenticated.
    pub sasl_server_max_receive_size: usize,
    /// `connections.max.idle.ms`: a connection that completes no request
    /// for this long is closed (a client trickling a frame byte by byte
    /// too).
    pub connections_max_idle_ms: u64,
    /// `max.connections`: connections beyond it wait in the accept queue.
    pub max_connections: usize,
    /// `max.connections.per.ip`: a client address beyond it is closed at once.
    pub max_connections_per_ip: usize,
    /// `max.connections.per.ip.overrides` (`host:count,...`; hostnames
    /// resolved at startup).
    pub max_connections_per_ip_overrides: std::collections::BTreeMap<std::net::IpAddr, usize>,
    /// `connections.max.reauth.ms` (KIP-368): the session lifetime of a
    /// SASL connection, 0 for none; `listener.name.<l>.<mechanism>.`
    /// prefixes are read per listener (see `Listener::reauth_ms`).
    pub connections_max_reauth_ms: i64,
    /// `message.max.bytes`: default for the topic's max.message.bytes.
    pub message_max_bytes: i64,
    /// `log.segment.bytes`
    pub log_segment_bytes: i64,
    /// `log.roll.ms`
    pub log_roll_ms: i64,
    /// `log.retention.ms`
    pub log_retention_ms: i64,
    /// `log.retention.bytes`
    pub log_retention_bytes: i64,
    /// `log.retention.check.interval.ms`: how often the primary of each
    /// range checks whether sealed segments are past retention.
    pub log_retention_check_interval_ms: u64,
    /// `log.cleaner.enable`: run the log cleaner (compaction) on this broker.
    pub log_cleaner_enable: bool,
    /// `log.cleaner.threads`: ranges cleaned at once.
    pub log_cleaner_threads: usize,
    /// `log.cleaner.io.max.bytes.per.second`: the cleaner's read + write
    /// rate, over all its threads.
    pub log_cleaner_io_max_bytes_per_second: f64,
    /// `log.cleaner.backoff.ms`: the pause between cleaning passes.
    pub log_cleaner_backoff_ms: u64,
    /// `min.insync.replicas`
    pub min_insync_replicas: i64,
    /// `replica.lag.time.max.ms`: a follower not caught up for this long
    /// leaves the in-sync replicas.
    pub replica_lag_time_max_ms: u64,
    /// `replica.heal.delay.ms`: how long a broker stays fenced before the
    /// copies of sealed segments it holds are re-created on other brokers
    /// (healing). Tessera's own key: Kafka has no healing.
    pub replica_heal_delay_ms: u64,
    /// `replica.heal.max.bytes.per.sec`: the rate at which this broker
    /// copies segments for healing and repair.
    pub replica_heal_max_bytes_per_sec: u64,
    /// `replica.producer.snapshot.prefetch.enable`: a follower without the
    /// range's older segments fetches the producer snapshot where its
    /// segment starts as soon as it follows it (true). Tessera's own key,
    /// false only in tests: then it is fetched only when the broker is to
    /// lead the range, which it does not until it has it.
    pub replica_producer_snapshot_prefetch_enable: bool,
    /// `replica.placement.rebalance.enable`: the active controller moves
    /// the next segments of existing ranges onto less loaded brokers (a
    /// broker that joined) at a segment boundary. Tessera's own key.
    pub replica_placement_rebalance_enable: bool,
    /// `replica.placement.roll.enable`: a primary's own segment roll places
    /// the next segment (a follower on a fenced broker or out of sync
    /// replaced, one swapped onto a less loaded broker) instead of keeping
    /// the rolled segment's replicas. Tessera's own key.
    pub replica_placement_roll_enable: bool,
    /// `replica.placement.rebalance.interval.ms`: how often it looks.
    pub replica_placement_rebalance_interval_ms: u64,
    /// `replica.placement.rebalance.max.ranges`: the most ranges it
    /// re-places per look (and moves the leadership of per check).
    pub replica_placement_rebalance_max_ranges: usize,
    /// `auto.leader.rebalance.enable`: the active controller evens out the
    /// number of ranges each live broker leads (Kafka's preferred-leader
    /// rebalance; see `tessera_planner::plan_leader_moves`).
    pub auto_leader_rebalance_enable: bool,
    /// `leader.imbalance.check.interval.seconds`: how often it checks.
    pub leader_imbalance_check_interval_seconds: u64,
    /// `leader.imbalance.per.broker.percentage`: a broker whose bytes in
    /// as primary exceed the live brokers' mean by more than this percent
    /// hands ranges to followers at the check (Kafka measures the same
    /// ratio in preferred leaders; see `tessera_planner::plan_balance`).
    pub leader_imbalance_per_broker_percentage: u32,
    /// `leader.load.balance.min.bytes.per.sec`: below this mean bytes in
    /// per broker nothing moves by load (an idle cluster's rates are
    /// noise). Tessera's own key.
    pub leader_load_balance_min_bytes_per_sec: u64,
    /// `quota.window.num`: the samples client quotas are measured over.
    pub quota_window_num: usize,
    /// `quota.window.size.seconds`: the length of one quota sample.
    pub quota_window_size_seconds: u64,
    /// `replica.selector.class`: Kafka's default (empty) serves consumers
    /// from leaders only; `...RackAwareReplicaSelector` sends a consumer
    /// with `client.rack` to a replica in its rack for sealed data (KIP-392).
    pub replica_selector_class: String,
    /// `controlled.shutdown.enable`: on SIGTERM, move the leadership of
    /// this broker's replicated ranges to other replicas before stopping.
    pub controlled_shutdown_enable: bool,
    /// `controlled.shutdown.max.retries`: attempts of that move.
    pub controlled_shutdown_max_retries: u32,
    /// `controlled.shutdown.retry.backoff.ms`: how long one attempt waits
    /// for the moves to be committed before the next.
    pub controlled_shutdown_retry_backoff_ms: u64,
    /// `offsets.topic.replication.factor` (capped at the live brokers, so a
    /// single node works with Kafka's default of 3)
    pub offsets_topic_replication_factor: i16,
    /// `offsets.topic.segment.bytes` / `transaction.state.log.segment.bytes`:
    /// the segment size the internal topics are created with (small
    /// segments let the log cleaner compact them sooner).
    pub offsets_topic_segment_bytes: u64,
    pub transaction_state_log_segment_bytes: u64,
    /// `transaction.state.log.replication.factor` (capped likewise)
    pub transaction_state_log_replication_factor: i16,
    /// `log.cleanup.policy`
    pub log_cleanup_policy: String,
    /// `log.message.timestamp.type`
    pub log_message_timestamp_type: String,
    /// `metadata.snapshot.interval.entries`: raft entries between metadata snapshots.
    pub metadata_snapshot_interval_entries: u64,
    /// `controller.quorum.fetch.timeout.ms`: how long a voter hears nothing
    /// from the quorum's leader before it stands for election (Kafka's key
    /// and default, 2000).
    pub controller_quorum_fetch_timeout_ms: u64,
    /// `group.initial.rebalance.delay.ms`: how long the first rebalance of an
    /// empty classic group waits for more members.
    pub group_initial_rebalance_delay_ms: i64,
    /// `group.min.session.timeout.ms` / `group.max.session.timeout.ms`
    pub group_min_session_timeout_ms: i32,
    pub group_max_session_timeout_ms: i32,
    /// `group.max.size`
    pub group_max_size: usize,
    /// `group.consumer.session.timeout.ms`: KIP-848 consumer group members
    /// are fenced after this long without a heartbeat.
    pub group_consumer_session_timeout_ms: i32,
    /// `group.consumer.heartbeat.interval.ms`: told to consumer group members.
    pub group_consumer_heartbeat_interval_ms: i32,
    /// `group.consumer.max.size`
    pub group_consumer_max_size: usize,
    /// `group.consumer.assignors`: server-side assignor names (`uniform`,
    /// `range`; Kafka's class names are accepted), the first the default.
    pub group_consumer_assignors: Vec<String>,
    /// `offsets.retention.minutes`: how long committed offsets of an empty
    /// group (or of topics a group no longer subscribes to) are kept.
    pub offsets_retention_minutes: i64,
    /// `offsets.retention.check.interval.ms`: how often they are checked.
    pub offsets_retention_check_interval_ms: u64,
    /// `offset.metadata.max.bytes`
    pub offset_metadata_max_bytes: usize,
    /// `transaction.max.timeout.ms`: the largest `transaction.timeout.ms` a
    /// producer may ask for.
    pub transaction_max_timeout_ms: i32,
    /// `transaction.abort.timed.out.transaction.cleanup.interval.ms`: how
    /// often the coordinator looks for timed-out transactions.
    pub transaction_abort_timed_out_interval_ms: u64,
    /// `transactional.id.expiration.ms`: an idle transactional id is forgotten
    /// after this long.
    pub transactional_id_expiration_ms: i64,
    /// The automatic range policy (`range.*` keys; see range_policy.rs).
    pub range_policy: RangePolicyConfig,
    /// `authorizer.class.name` (Kafka's StandardAuthorizer or AclAuthorizer
    /// class names): `Some` turns authorization on, with `super.users` and
    /// `allow.everyone.if.no.acl.found`. `None` (the default): everyone
    /// may do everything.
    pub authorizer: Option<tessera_metadata::acl::AuthorizerSettings>,
    /// The keys set at startup (file, environment, flags) as given: what
    /// DescribeConfigs reports as STATIC_BROKER_CONFIG.
    pub explicit: BTreeMap<String, String>,
    /// Kafka keys given that tessera has no use for (`IGNORED_KAFKA_KEYS`),
    /// logged at startup.
    pub ignored_keys: Vec<String>,
}

/// Broker-wide settings of the automatic range split/merge policy. The
/// thresholds can be overridden per topic with the same keys.
#[derive(Clone, Debug, PartialEq)]
pub struct RangePolicyConfig {
    /// `range.policy.enable`
    pub enabled: bool,
    /// `range.policy.interval.ms`: how often load is measured and decided on.
    pub interval_ms: u64,
    /// `range.split.bytes.per.sec`
    pub split_bytes_per_sec: u64,
    /// `range.merge.bytes.per.sec`
    pub merge_bytes_per_sec: u64,
    /// `range.min.count`
    pub min_count: usize,
    /// `range.max.count`
    pub max_count: usize,
    /// `range.policy.sustain.intervals`
    pub sustain_intervals: u32,
}

/// Every broker key this build understands, with its default.
const DEFAULTS: &[(&str, &str)] = &[
    ("node.id", "1"),
    ("listeners", "PLAINTEXT://127.0.0.1:9092"),
    ("advertised.listeners", ""),
    (
        "listener.security.protocol.map",
        crate::listeners::DEFAULT_PROTOCOL_MAP,
    ),
    ("inter.broker.listener.name", ""),
    ("security.inter.broker.protocol", "PLAINTEXT"),
    ("sasl.mechanism.inter.broker.protocol", "GSSAPI"),
    ("sasl.mechanism.controller.protocol", "GSSAPI"),
    ("ssl.endpoint.identification.algorithm", "https"),
    ("sasl.enabled.mechanisms", "GSSAPI"),
    ("ssl.keystore.type", "JKS"),
    ("ssl.keystore.location", ""),
    ("ssl.key.password", ""),
    ("ssl.keystore.certificate.chain", ""),
    ("ssl.keystore.key", ""),
    ("ssl.truststore.type", "JKS"),
    ("ssl.truststore.location", ""),
    ("ssl.truststore.certificates", ""),
    ("ssl.client.auth", "none"),
    ("authorizer.class.name", ""),
    ("super.users", ""),
    ("allow.everyone.if.no.acl.found", "false"),
    ("admin.listener", "127.0.0.1:9644"),
    ("admin.listener.ssl.enable", "false"),
    ("console.enable", "true"),
    ("console.read.only", "false"),
    ("console.messages.enable", "true"),
    ("log.dirs", "./tessera-data"),
    ("broker.rack", ""),
    ("process.roles", "broker,controller"),
    ("controller.quorum.voters", ""),
    ("controller.listener.names", ""),
    ("metadata.listener", ""),
    ("broker.heartbeat.interval.ms", "2000"),
    ("broker.session.timeout.ms", "9000"),
    ("num.partitions", "1"),
    ("default.replication.factor", "1"),
    ("auto.create.topics.enable", "true"),
    ("migration.append.enable", "false"),
    ("socket.request.max.bytes", "104857600"),
    ("sasl.server.max.receive.size", "524288"),
    ("connections.max.idle.ms", "600000"),
    ("max.connections", "2147483647"),
    ("max.connections.per.ip", "2147483647"),
    ("max.connections.per.ip.overrides", ""),
    ("connections.max.reauth.ms", "0"),
    ("message.max.bytes", "1048588"),
    ("log.segment.bytes", "1073741824"),
    ("log.roll.ms", "604800000"),
    ("log.roll.hours", "168"),
    ("log.retention.ms", "604800000"),
    ("log.retention.minutes", ""),
    ("log.retention.hours", "168"),
    ("log.retention.bytes", "-1"),
    ("log.retention.check.interval.ms", "300000"),
    ("log.cleaner.enable", "true"),
    ("log.cleaner.threads", "1"),
    (
        "log.cleaner.io.max.bytes.per.second",
        "1.7976931348623157E308",
    ),
    ("log.cleaner.backoff.ms", "15000"),
    ("min.insync.replicas", "1"),
    ("replica.lag.time.max.ms", "30000"),
    ("replica.heal.delay.ms", "300000"),
    ("replica.heal.max.bytes.per.sec", "52428800"),
    ("replica.producer.snapshot.prefetch.enable", "true"),
    ("replica.placement.rebalance.enable", "true"),
    ("replica.placement.roll.enable", "true"),
    ("replica.placement.rebalance.interval.ms", "10000"),
    ("replica.placement.rebalance.max.ranges", "4"),
    ("auto.leader.rebalance.enable", "true"),
    ("leader.imbalance.check.interval.seconds", "300"),
    ("leader.imbalance.per.broker.percentage", "10"),
    ("leader.load.balance.min.bytes.per.sec", "1048576"),
    ("quota.window.num", "11"),
    ("quota.window.size.seconds", "1"),
    ("replica.selector.class", ""),
    ("controlled.shutdown.enable", "true"),
    ("controlled.shutdown.max.retries", "3"),
    ("controlled.shutdown.retry.backoff.ms", "5000"),
    ("offsets.topic.replication.factor", "3"),
    ("offsets.topic.segment.bytes", "104857600"),
    ("transaction.state.log.segment.bytes", "104857600"),
    ("transaction.state.log.replication.factor", "3"),
    ("log.cleanup.policy", "delete"),
    ("compression.type", "producer"),
    ("log.message.timestamp.type", "CreateTime"),
    ("metadata.snapshot.interval.entries", "1000"),
    ("controller.quorum.fetch.timeout.ms", "2000"),
    ("group.initial.rebalance.delay.ms", "3000"),
    ("group.min.session.timeout.ms", "6000"),
    ("group.max.session.timeout.ms", "1800000"),
    ("group.max.size", "2147483647"),
    ("group.consumer.session.timeout.ms", "45000"),
    ("group.consumer.heartbeat.interval.ms", "5000"),
    ("group.consumer.max.size", "2147483647"),
    ("group.consumer.assignors", "uniform,range"),
    ("offset.metadata.max.bytes", "4096"),
    ("offsets.retention.minutes", "10080"),
    ("offsets.retention.check.interval.ms", "600000"),
    ("transaction.max.timeout.ms", "900000"),
    (
        "transaction.abort.timed.out.transaction.cleanup.interval.ms",
        "10000",
    ),
    ("transactional.id.expiration.ms", "604800000"),
    ("range.policy.enable", "true"),
    ("range.policy.interval.ms", "10000"),
    ("range.split.bytes.per.sec", "67108864"),
    ("range.merge.bytes.per.sec", "8388608"),
    ("range.min.count", "1"),
    ("range.max.count", "64"),
    ("range.policy.sustain.intervals", "3"),
];

/// Kafka's coarser spellings of a time key, each with its unit in ms, in
/// Kafka's precedence after the key itself (`log.retention.ms`, then
/// `.minutes`, then `.hours`: `KafkaConfig.logRetentionTimeMillis`).
pub const TIME_SYNONYMS: &[(&str, &[(&str, i64)])] = &[
    (
        "log.retention.ms",
        &[
            ("log.retention.minutes", 60_000),
            ("log.retention.hours", 3_600_000),
        ],
    ),
    ("log.roll.ms", &[("log.roll.hours", 3_600_000)]),
];

/// The coarser spellings of `key` (empty for most keys).
pub fn time_synonyms(key: &str) -> &'static [(&'static str, i64)] {
    TIME_SYNONYMS
        .iter()
        .find(|(k, _)| *k == key)
        .map_or(&[], |(_, s)| s)
}

/// `value` of `key` in milliseconds when `key` is a coarser spelling of a
/// time key (`log.retention.hours=24` is 86400000); any other as it is.
/// Negative means unlimited, as in Kafka.
pub fn in_millis(key: &str, value: &str) -> String {
    let unit = TIME_SYNONYMS
        .iter()
        .flat_map(|(_, s)| s.iter())
        .find(|(k, _)| *k == key)
        .map(|(_, unit)| *unit);
    match (unit, value.trim().parse::<i64>()) {
        (Some(unit), Ok(v)) => scaled_millis(v, unit).to_string(),
        _ => value.to_string(),
    }
}

/// `v` units of `unit` ms; any negative value is -1 (unlimited).
fn scaled_millis(v: i64, unit: i64) -> i64 {
    if v < 0 {
        -1
    } else {
        v.saturating_mul(unit)
    }
}

/// A time key with Kafka's precedence over its coarser spellings: the key
/// itself if set, else the first synonym set (converted), else the key's
/// default.
fn parse_millis(map: &BTreeMap<String, String>, key: &str) -> Result<i64, ConfigError> {
    if map.contains_key(key) {
        return parse(map, key);
    }
    for (synonym, unit) in time_synonyms(key) {
        if map.contains_key(*synonym) {
            return Ok(scaled_millis(parse(map, synonym)?, *unit));
        }
    }
    parse(map, key)
}

/// Kafka broker keys that mean nothing to tessera (thread pools, socket
/// buffers, flush policies it sizes itself, the KRaft controller listener
/// it does not have): accepted so that a Kafka `server.properties` carries
/// over, and logged at startup as ignored. Any other unknown key is refused.
/// (`controller.listener.names` is read: those listeners are the metadata
/// quorum's, bound from `controller.quorum.voters`.)
pub const IGNORED_KAFKA_KEYS: &[&str] = &[
    "num.network.threads",
    "num.io.threads",
    "num.replica.fetchers",
    "num.recovery.threads.per.data.dir",
    "background.threads",
    "queued.max.requests",
    "socket.send.buffer.bytes",
    "socket.receive.buffer.bytes",
    "log.flush.interval.messages",
    "log.flush.interval.ms",
    "log.flush.scheduler.interval.ms",
    "log.flush.offset.checkpoint.interval.ms",
    "transaction.state.log.min.isr",
    "offsets.topic.num.partitions",
    "transaction.state.log.num.partitions",
    "group.coordinator.rebalance.protocols",
    "log.cleaner.dedupe.buffer.size",
    "log.cleaner.io.buffer.size",
    "replica.fetch.max.bytes",
    "replica.socket.timeout.ms",
    "metadata.log.dir",
];

/// Every broker key this build reads at startup.
pub fn static_keys() -> impl Iterator<Item = &'static str> {
    DEFAULTS.iter().map(|(k, _)| *k)
}

/// The default of a broker key this build reads at startup.
pub fn static_default(key: &str) -> Option<&'static str> {
    DEFAULTS.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
}

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig::from_map(&BTreeMap::new()).expect("defaults are valid")
    }
}

/// Flattens a TOML document to dotted keys.
pub fn flatten_toml(text: &str) -> Result<BTreeMap<String, String>, ConfigError> {
    let value: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| ConfigError::Toml(e.to_string()))?;
    let mut out = BTreeMap::new();
    fn walk(prefix: &str, table: &toml::Table, out: &mut BTreeMap<String, String>) {
        for (k, v) in table {
            let key = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            match v {
                toml::Value::Table(t) => walk(&key, t, out),
                toml::Value::String(s) => {
                    out.insert(key, s.clone());
                }
                toml::Value::Array(items) => {
                    let joined: Vec<String> = items
                        .iter()
                        .map(|i| {
                            i.as_str()
                                .map(str::to_string)
                                .unwrap_or_else(|| i.to_string())
                        })
                        .collect();
                    out.insert(key, joined.join(","));
                }
                other => {
                    out.insert(key, other.to_string());
                }
            }
        }
    }
    walk("", &value, &mut out);
    Ok(out)
}

/// Reads a Java properties file (Kafka's `server.properties`): `key=value`
/// or `key: value` or `key value` lines, `#` and `!` comments, a trailing
/// backslash continuing a value on the next line, and the escapes `\t`,
/// `\n`, `\=`, `\:`, `\\`, `\uXXXX`.
pub fn parse_properties(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let mut logical = line.trim_start().to_string();
        if logical.is_empty() || logical.starts_with('#') || logical.starts_with('!') {
            continue;
        }
        // An odd number of trailing backslashes continues the line.
        while logical.chars().rev().take_while(|c| *c == '\\').count() % 2 == 1 {
            logical.pop();
            match lines.next() {
                Some(next) => logical.push_str(next.trim_start()),
                None => break,
            }
        }
        let (key, value) = split_property(&logical);
        out.insert(unescape_property(key), unescape_property(value));
    }
    out
}

/// Splits a logical properties line at the first unescaped `=`, `:` or
/// whitespace (with the whitespace around the separator dropped).
fn split_property(line: &str) -> (&str, &str) {
    let bytes = line.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'=' | b':' | b' ' | b'\t' => break,
            _ => i += 1,
        }
    }
    let i = i.min(bytes.len());
    let key = &line[..i];
    let mut rest = line[i..].trim_start_matches([' ', '\t']);
    if let Some(r) = rest.strip_prefix(['=', ':']) {
        rest = r.trim_start_matches([' ', '\t']);
    }
    (key, rest)
}

fn unescape_property(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('t') => out.push('\t'),
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some('f') => out.push('\u{c}'),
            Some('u') => {
                let hex: String = chars.by_ref().take(4).collect();
                match u32::from_str_radix(&hex, 16).ok().and_then(char::from_u32) {
                    Some(ch) => out.push(ch),
                    None => out.push_str(&hex),
                }
            }
            Some(other) => out.push(other),
            None => {}
        }
    }
    out
}

/// Reads `TESSERA_LOG_DIRS`-style variables: the key upper-cased, dots as underscores.
pub fn from_env(vars: impl Iterator<Item = (String, String)>) -> BTreeMap<String, String> {
    let by_env_name: BTreeMap<String, &str> = DEFAULTS
        .iter()
        .map(|(k, _)| {
            (
                format!("TESSERA_{}", k.to_uppercase().replace(['.', '-'], "_")),
                *k,
            )
        })
        .collect();
    vars.filter_map(|(name, value)| by_env_name.get(&name).map(|k| (k.to_string(), value)))
        .collect()
}

fn parse<T: std::str::FromStr>(
    map: &BTreeMap<String, String>,
    key: &str,
) -> Result<T, ConfigError> {
    let raw = map
        .get(key)
        .map(String::as_str)
        .or_else(|| DEFAULTS.iter().find(|(k, _)| *k == key).map(|(_, v)| *v))
        .unwrap_or("");
    raw.trim().parse().map_err(|_| ConfigError::InvalidValue {
        key: key.to_string(),
        value: raw.to_string(),
    })
}

/// `group.consumer.assignors`: a comma-separated list of `uniform` and
/// `range` (or Kafka's `...UniformAssignor` / `...RangeAssignor` class
/// names), at least one.
fn parse_assignors(raw: &str) -> Result<Vec<String>, ConfigError> {
    let invalid = || ConfigError::InvalidValue {
        key: "group.consumer.assignors".into(),
        value: raw.to_string(),
    };
    let mut out: Vec<String> = Vec::new();
    for name in raw.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let short = match name {
            "uniform" | "range" => name,
            n if n.ends_with(".UniformAssignor") => "uniform",
            n if n.ends_with(".RangeAssignor") => "range",
            _ => return Err(invalid()),
        };
        if !out.iter().any(|o| o == short) {
            out.push(short.to_string());
        }
    }
    if out.is_empty() {
        return Err(invalid());
    }
    Ok(out)
}

/// Kafka's authorizer class names this broker implements (one ACL model:
/// StandardAuthorizer's).
pub const AUTHORIZER_CLASS_NAMES: &[&str] = &[
    "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    "kafka.security.authorizer.AclAuthorizer",
];

/// `authorizer.class.name`, `super.users`, `allow.everyone.if.no.acl.found`.
fn parse_authorizer(
    map: &BTreeMap<String, String>,
    get: &dyn Fn(&str) -> String,
) -> Result<Option<tessera_metadata::acl::AuthorizerSettings>, ConfigError> {
    let class = get("authorizer.class.name");
    let class = class.trim();
    if class.is_empty() {
        return Ok(None);
    }
    if !AUTHORIZER_CLASS_NAMES.contains(&class) {
        return Err(ConfigError::InvalidValue {
            key: "authorizer.class.name".into(),
            value: format!("{class} (supported: {})", AUTHORIZER_CLASS_NAMES.join(", ")),
        });
    }
    Ok(Some(tessera_metadata::acl::AuthorizerSettings {
        super_users: tessera_metadata::acl::AuthorizerSettings::parse_super_users(&get(
            "super.users",
        )),
        allow_everyone_if_no_acl_found: parse(map, "allow.everyone.if.no.acl.found")?,
    }))
}

/// `max.connections.per.ip.overrides`: `host:count` pairs, comma-separated
/// (Kafka's form; a host is an IP address or a name resolved now).
fn parse_ip_overrides(
    raw: &str,
) -> Result<std::collections::BTreeMap<std::net::IpAddr, usize>, ConfigError> {
    use std::net::ToSocketAddrs;
    let key = "max.connections.per.ip.overrides";
    let mut out = std::collections::BTreeMap::new();
    for entry in raw.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let bad = || ConfigError::InvalidValue {
            key: key.into(),
            value: entry.to_string(),
        };
        let (host, count) = entry.rsplit_once(':').ok_or_else(bad)?;
        let count: usize = count.trim().parse().map_err(|_| bad())?;
        let host = host.trim().trim_start_matches('[').trim_end_matches(']');
        let ips: Vec<std::net::IpAddr> = match host.parse() {
            Ok(ip) => vec![ip],
            Err(_) => (host, 0)
                .to_socket_addrs()
                .map_err(|_| bad())?
                .map(|a| a.ip())
                .collect(),
        };
        for ip in ips {
            out.insert(ip, count);
        }
    }
    Ok(out)
}

/// `PLAINTEXT://host:port` or `host:port` -> (host, port), for the admin
/// HTTP listener.
fn parse_listener(key: &str, raw: &str) -> Result<(String, u16), ConfigError> {
    let first = raw.split(',').next().unwrap_or("").trim();
    match parse_endpoint(key, first)? {
        (name, host, port) if name == "PLAINTEXT" => Ok((host, port)),
        _ => Err(ConfigError::InvalidValue {
            key: key.to_string(),
            value: raw.to_string(),
        }),
    }
}

/// This node's own entry of `controller.quorum.voters` (`host`, `port`):
/// a controller-only node's controller listener. As in Kafka, a node whose
/// only role is controller must be one of the voters.
fn own_voter_address(node_id: i32, voters: &str) -> Result<(String, u16), ConfigError> {
    let key = "controller.quorum.voters";
    let parsed = if voters.trim().is_empty() {
        Default::default()
    } else {
        tessera_metadata::ControllerConfig::parse_voters(voters).map_err(|e| {
            ConfigError::InvalidValue {
                key: key.into(),
                value: e.to_string(),
            }
        })?
    };
    let own = u64::try_from(node_id).ok().and_then(|id| parsed.get(&id));
    let Some(address) = own else {
        return Err(ConfigError::InvalidValue {
            key: key.into(),
            value: format!(
                "{voters} (if process.roles contains just the 'controller' role, the node id \
                 {node_id} must be included in the set of voters {key})"
            ),
        });
    };
    let (host, port) = address
        .rsplit_once(':')
        .expect("parse_voters checked host:port");
    let host = host.trim_start_matches('[').trim_end_matches(']');
    Ok((
        host.to_string(),
        port.parse().expect("parse_voters checked the port"),
    ))
}

/// Checks a controller-only node's listeners: as in Kafka, `listeners` may
/// name only controller listeners (`controller.listener.names`); they are
/// the metadata quorum's, bound from the node's own voter entry. Kafka's
/// default `listeners` (not set at all) is not held against it.
fn controller_only_listeners(
    map: &BTreeMap<String, String>,
    get: &impl Fn(&str) -> String,
    node_id: i32,
    voters: &str,
) -> Result<(), ConfigError> {
    own_voter_address(node_id, voters)?;
    if !map.contains_key("listeners") {
        return Ok(());
    }
    let clients = crate::listeners::client_listener_names(get)?;
    if !clients.is_empty() {
        return Err(ConfigError::InvalidValue {
            key: "listeners".into(),
            value: format!(
                "{} (the controller.listener.names config must only contain KRaft controller \
                 listeners from listeners when process.roles=controller; not: {})",
                get("listeners"),
                clients.join(", ")
            ),
        });
    }
    Ok(())
}

/// The address a listener binds.
pub fn resolve_listener(l: &Listener) -> Result<SocketAddr, ConfigError> {
    resolve("listeners", &l.host, l.port)
}

fn resolve(key: &str, host: &str, port: u16) -> Result<SocketAddr, ConfigError> {
    use std::net::ToSocketAddrs;
    (host, port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| ConfigError::InvalidValue {
            key: key.to_string(),
            value: format!("{host}:{port}"),
        })
}

impl BrokerConfig {
    /// What the group coordinator follows of this config.
    pub fn group_config(&self) -> tessera_group_coordinator::GroupConfig {
        tessera_group_coordinator::GroupConfig {
            initial_rebalance_delay_ms: self.group_initial_rebalance_delay_ms,
            min_session_timeout_ms: self.group_min_session_timeout_ms,
            max_session_timeout_ms: self.group_max_session_timeout_ms,
            max_size: self.group_max_size,
            consumer_session_timeout_ms: self.group_consumer_session_timeout_ms,
            consumer_heartbeat_interval_ms: self.group_consumer_heartbeat_interval_ms,
            consumer_max_size: self.group_consumer_max_size,
            consumer_assignors: self.group_consumer_assignors.clone(),
            offset_metadata_max_bytes: self.offset_metadata_max_bytes,
            offsets_retention_minutes: self.offsets_retention_minutes,
            offsets_retention_check_interval_ms: self.offsets_retention_check_interval_ms,
        }
    }

    /// What the transaction coordinator follows of this config.
    pub fn txn_config(&self) -> tessera_txn_coordinator::TxnConfig {
        tessera_txn_coordinator::TxnConfig {
            max_timeout_ms: self.transaction_max_timeout_ms,
            abort_timed_out_interval_ms: self.transaction_abort_timed_out_interval_ms,
            transactional_id_expiration_ms: self.transactional_id_expiration_ms,
        }
    }

    /// Builds the typed config; unknown keys are refused so a typo is not silently ignored.
    pub fn from_map(map: &BTreeMap<String, String>) -> Result<BrokerConfig, ConfigError> {
        for key in map.keys() {
            if !DEFAULTS.iter().any(|(k, _)| k == key)
                && !is_listener_key(key)
                && !IGNORED_KAFKA_KEYS.contains(&key.as_str())
            {
                return Err(ConfigError::UnknownKey(key.clone()));
            }
        }
        let get = |key: &str| -> String {
            map.get(key).cloned().unwrap_or_else(|| {
                DEFAULTS
                    .iter()
                    .find(|(k, _)| *k == key)
                    .unwrap()
                    .1
                    .to_string()
            })
        };
        // A node is controller and broker at once (Kafka's combined mode),
        // a broker only, following the metadata log as a learner, or a
        // controller only (a metadata voter serving no Kafka client).
        let roles = get("process.roles");
        let mut role_list: Vec<&str> = roles.split(',').map(str::trim).collect();
        role_list.sort_unstable();
        role_list.dedup();
        let controller_only = role_list == ["controller"];
        let node_id: i32 = parse(map, "node.id")?;
        let voters = get("controller.quorum.voters");
        let listeners = if controller_only {
            controller_only_listeners(map, &get, node_id, &voters)?;
            Vec::new()
        } else {
            parse_listeners(map, get)?
        };
        let inter_broker = get("inter.broker.listener.name")
            .trim()
            .to_ascii_uppercase();
        // Kafka's rule: one of the two names the inter-broker listener; the
        // protocol names the listener called after it.
        let inter_broker = match (inter_broker.is_empty(), map.get("security.inter.broker.protocol")) {
            (false, Some(_)) => {
                return Err(ConfigError::InvalidValue {
                    key: "security.inter.broker.protocol".into(),
                    value: "(only one of inter.broker.listener.name and security.inter.broker.protocol may be set)".into(),
                })
            }
            (true, Some(protocol)) => {
                let name = protocol.trim().to_ascii_uppercase();
                if crate::listeners::SecurityProtocol::parse(&name).is_none() {
                    return Err(ConfigError::InvalidValue {
                        key: "security.inter.broker.protocol".into(),
                        value: protocol.clone(),
                    });
                }
                name
            }
            _ => inter_broker,
        };
        let inter_broker_listener = if inter_broker.is_empty() || controller_only {
            listeners
                .iter()
                .position(|l| l.protocol == crate::listeners::SecurityProtocol::Plaintext)
                .unwrap_or(0)
        } else {
            listeners
                .iter()
                .position(|l| l.name == inter_broker)
                .ok_or_else(|| ConfigError::InvalidValue {
                    key: "inter.broker.listener.name".into(),
                    value: format!("{inter_broker} is not in listeners"),
                })?
        };
        // A controller-only node has no Kafka listener: its address is its
        // controller listener, its own entry in controller.quorum.voters.
        let (inter_host, inter_port, advertised_host, advertised_port) =
            match listeners.get(inter_broker_listener) {
                Some(l) => (
                    l.host.clone(),
                    l.port,
                    l.advertised_host.clone(),
                    l.advertised_port,
                ),
                None => {
                    let (h, p) = own_voter_address(node_id, &voters)?;
                    (h.clone(), p, h, p)
                }
            };
        let listener = if controller_only {
            resolve("controller.quorum.voters", &inter_host, inter_port)?
        } else {
            resolve("listeners", &inter_host, inter_port)?
        };
        for l in &listeners {
            resolve_listener(l)?;
        }
        let tls = if listeners.iter().any(|l| l.protocol.is_tls()) {
            let names: Vec<&str> = listeners
                .iter()
                .filter(|l| l.protocol.is_tls())
                .map(|l| l.name.as_str())
                .collect();
            Some(std::sync::Arc::new(crate::tls::ListenerTls::new(
                crate::tls::TlsSettings::from_map(get),
                &names,
            )?))
        } else {
            None
        };
        let metadata_learner_listener = match role_list.as_slice() {
            ["broker", "controller"] | ["controller"] => None,
            ["broker"] if voters.trim().is_empty() => {
                return Err(ConfigError::InvalidValue {
                    key: "process.roles".into(),
                    value: format!("{roles} (a broker-only node needs controller.quorum.voters)"),
                })
            }
            ["broker"] => Some(match get("metadata.listener").trim() {
                "" => format!("{inter_host}:0"),
                given => {
                    let (h, p) = parse_listener("metadata.listener", given)?;
                    format!("{h}:{p}")
                }
            }),
            _ => {
                return Err(ConfigError::InvalidValue {
                    key: "process.roles".into(),
                    value: format!(
                    "{roles} (\"broker,controller\", \"broker\" or \"controller\" are supported)"
                ),
                })
            }
        };
        let inter_broker_client = match listeners.get(inter_broker_listener) {
            Some(l) => crate::inter_broker::ClientSettings::parse(
                map,
                &get,
                &l.name,
                l.protocol,
                "sasl.mechanism.inter.broker.protocol",
            )?,
            // A controller-only node has no Kafka listener but fences the
            // brokers' segments: it connects as their inter-broker listener
            // (named by the keys above) asks.
            None => match crate::listeners::listener_protocol(get, &inter_broker)? {
                Some(protocol) if !inter_broker.is_empty() => {
                    crate::inter_broker::ClientSettings::parse(
                        map,
                        &get,
                        &inter_broker,
                        protocol,
                        "sasl.mechanism.inter.broker.protocol",
                    )?
                }
                _ => crate::inter_broker::ClientSettings::plaintext(&inter_broker),
            },
        };
        let controller_security = crate::inter_broker::ControllerSecurity::parse(map, &get)?;
        let admin = get("admin.listener");
        let (admin_host, admin_port) = parse_listener("admin.listener", &admin)?;
        let rack = get("broker.rack");
        let config = BrokerConfig {
            node_id,
            controller_only,
            listeners,
            tls,
            inter_broker_listener,
            inter_broker_client,
            controller_security,
            listener,
            advertised_host,
            advertised_port,
            admin_listener: resolve("admin.listener", &admin_host, admin_port)?,
            admin_listener_ssl_enable: parse(map, "admin.listener.ssl.enable")?,
            console_enable: parse(map, "console.enable")?,
            console_read_only: parse(map, "console.read.only")?,
            console_messages_enable: parse(map, "console.messages.enable")?,
            data_dir: PathBuf::from(
                get("log.dirs")
                    .split(',')
                    .next()
                    .unwrap_or("./tessera-data")
                    .trim(),
            ),
            rack: (!rack.trim().is_empty()).then(|| rack.trim().to_string()),
            controller_quorum_voters: voters.trim().to_string(),
            metadata_learner_listener,
            broker_heartbeat_interval_ms: parse(map, "broker.heartbeat.interval.ms")?,
            broker_session_timeout_ms: parse(map, "broker.session.timeout.ms")?,
            num_partitions: parse(map, "num.partitions")?,
            default_replication_factor: parse(map, "default.replication.factor")?,
            auto_create_topics: parse(map, "auto.create.topics.enable")?,
            migration_append_enable: parse(map, "migration.append.enable")?,
            socket_request_max_bytes: parse(map, "socket.request.max.bytes")?,
            sasl_server_max_receive_size: parse(map, "sasl.server.max.receive.size")?,
            connections_max_idle_ms: parse::<u64>(map, "connections.max.idle.ms")?.max(1),
            max_connections: parse::<usize>(map, "max.connections")?.max(1),
            max_connections_per_ip: parse::<usize>(map, "max.connections.per.ip")?.max(1),
            max_connections_per_ip_overrides: parse_ip_overrides(&get(
                "max.connections.per.ip.overrides",
            ))?,
            connections_max_reauth_ms: parse(map, "connections.max.reauth.ms")?,
            message_max_bytes: parse(map, "message.max.bytes")?,
            log_segment_bytes: parse(map, "log.segment.bytes")?,
            log_roll_ms: parse_millis(map, "log.roll.ms")?,
            log_retention_ms: parse_millis(map, "log.retention.ms")?,
            log_retention_bytes: parse(map, "log.retention.bytes")?,
            log_retention_check_interval_ms: parse(map, "log.retention.check.interval.ms")?,
            log_cleaner_enable: parse(map, "log.cleaner.enable")?,
            log_cleaner_threads: parse::<usize>(map, "log.cleaner.threads")?.max(1),
            log_cleaner_io_max_bytes_per_second: parse(map, "log.cleaner.io.max.bytes.per.second")?,
            log_cleaner_backoff_ms: parse::<u64>(map, "log.cleaner.backoff.ms")?.max(1),
            min_insync_replicas: parse(map, "min.insync.replicas")?,
            replica_lag_time_max_ms: parse(map, "replica.lag.time.max.ms")?,
            replica_heal_delay_ms: parse(map, "replica.heal.delay.ms")?,
            replica_heal_max_bytes_per_sec: parse(map, "replica.heal.max.bytes.per.sec")?,
            replica_producer_snapshot_prefetch_enable: parse(
                map,
                "replica.producer.snapshot.prefetch.enable",
            )?,
            replica_placement_rebalance_enable: parse(map, "replica.placement.rebalance.enable")?,
            replica_placement_roll_enable: parse(map, "replica.placement.roll.enable")?,
            replica_placement_rebalance_interval_ms: parse::<u64>(
                map,
                "replica.placement.rebalance.interval.ms",
            )?
            .max(1),
            replica_placement_rebalance_max_ranges: parse(
                map,
                "replica.placement.rebalance.max.ranges",
            )?,
            auto_leader_rebalance_enable: parse(map, "auto.leader.rebalance.enable")?,
            // Kafka's minimum (`atLeast(1)`).
            leader_imbalance_check_interval_seconds: parse::<u64>(
                map,
                "leader.imbalance.check.interval.seconds",
            )?
            .max(1),
            leader_imbalance_per_broker_percentage: parse(
                map,
                "leader.imbalance.per.broker.percentage",
            )?,
            leader_load_balance_min_bytes_per_sec: parse(
                map,
                "leader.load.balance.min.bytes.per.sec",
            )?,
            // Kafka's minimums (`atLeast(1)`).
            quota_window_num: parse::<usize>(map, "quota.window.num")?.max(1),
            quota_window_size_seconds: parse::<u64>(map, "quota.window.size.seconds")?.max(1),
            replica_selector_class: get("replica.selector.class"),
            controlled_shutdown_enable: parse(map, "controlled.shutdown.enable")?,
            controlled_shutdown_max_retries: parse(map, "controlled.shutdown.max.retries")?,
            controlled_shutdown_retry_backoff_ms: parse(
                map,
                "controlled.shutdown.retry.backoff.ms",
            )?,
            offsets_topic_replication_factor: parse(map, "offsets.topic.replication.factor")?,
            offsets_topic_segment_bytes: parse::<u64>(map, "offsets.topic.segment.bytes")?.max(14),
            transaction_state_log_segment_bytes: parse::<u64>(
                map,
                "transaction.state.log.segment.bytes",
            )?
            .max(14),
            transaction_state_log_replication_factor: parse(
                map,
                "transaction.state.log.replication.factor",
            )?,
            log_cleanup_policy: get("log.cleanup.policy"),
            log_message_timestamp_type: get("log.message.timestamp.type"),
            metadata_snapshot_interval_entries: parse(map, "metadata.snapshot.interval.entries")?,
            controller_quorum_fetch_timeout_ms: parse(map, "controller.quorum.fetch.timeout.ms")?,
            group_initial_rebalance_delay_ms: parse(map, "group.initial.rebalance.delay.ms")?,
            group_min_session_timeout_ms: parse(map, "group.min.session.timeout.ms")?,
            group_max_session_timeout_ms: parse(map, "group.max.session.timeout.ms")?,
            group_max_size: parse(map, "group.max.size")?,
            group_consumer_session_timeout_ms: parse(map, "group.consumer.session.timeout.ms")?,
            group_consumer_heartbeat_interval_ms: parse(
                map,
                "group.consumer.heartbeat.interval.ms",
            )?,
            group_consumer_max_size: parse(map, "group.consumer.max.size")?,
            group_consumer_assignors: parse_assignors(&get("group.consumer.assignors"))?,
            offsets_retention_minutes: parse::<i64>(map, "offsets.retention.minutes")?.max(1),
            offsets_retention_check_interval_ms: parse::<u64>(
                map,
                "offsets.retention.check.interval.ms",
            )?
            .max(1),
            offset_metadata_max_bytes: parse(map, "offset.metadata.max.bytes")?,
            transaction_max_timeout_ms: parse(map, "transaction.max.timeout.ms")?,
            transaction_abort_timed_out_interval_ms: parse::<u64>(
                map,
                "transaction.abort.timed.out.transaction.cleanup.interval.ms",
            )?
            .max(10),
            transactional_id_expiration_ms: parse(map, "transactional.id.expiration.ms")?,
            range_policy: RangePolicyConfig {
                enabled: parse(map, "range.policy.enable")?,
                interval_ms: parse::<u64>(map, "range.policy.interval.ms")?.max(100),
                split_bytes_per_sec: parse(map, "range.split.bytes.per.sec")?,
                merge_bytes_per_sec: parse(map, "range.merge.bytes.per.sec")?,
                min_count: parse::<usize>(map, "range.min.count")?.max(1),
                max_count: parse(map, "range.max.count")?,
                sustain_intervals: parse::<u32>(map, "range.policy.sustain.intervals")?.max(1),
            },
            authorizer: parse_authorizer(map, &get)?,
            // JAAS entries and private keys are secrets: never reported.
            ignored_keys: map
                .keys()
                .filter(|k| IGNORED_KAFKA_KEYS.contains(&k.as_str()))
                .cloned()
                .collect(),
            explicit: map
                .iter()
                .filter(|(k, _)| {
                    !crate::tls::is_secret(k) && !IGNORED_KAFKA_KEYS.contains(&k.as_str())
                })
                .map(|(k, v)| (k.clone(), v.trim().to_string()))
                .collect(),
        };
        if config.num_partitions == 0 {
            return Err(ConfigError::InvalidValue {
                key: "num.partitions".into(),
                value: "0".into(),
            });
        }
        if config.node_id < 0 {
            return Err(ConfigError::InvalidValue {
                key: "node.id".into(),
                value: config.node_id.to_string(),
            });
        }
        Ok(config)
    }

    /// Loads: file (if any) < environment < explicit overrides.
    pub fn load(
        file: Option<&Path>,
        env: impl Iterator<Item = (String, String)>,
        overrides: &[(String, String)],
    ) -> Result<BrokerConfig, ConfigError> {
        let mut map = match file {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| ConfigError::Io(format!("{}: {e}", path.display())))?;
                if path.extension().is_some_and(|e| e == "properties") {
                    parse_properties(&text)
                } else {
                    flatten_toml(&text)?
                }
            }
            None => BTreeMap::new(),
        };
        map.extend(from_env(env));
        map.extend(overrides.iter().cloned());
        BrokerConfig::from_map(&map)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_ip_overrides_parse_as_kafka_writes_them() {
        let o = parse_ip_overrides("127.0.0.1:200, 10.0.0.1:0,[::1]:5").unwrap();
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        assert_eq!(o[&ip("127.0.0.1")], 200);
        assert_eq!(o[&ip("10.0.0.1")], 0);
        assert_eq!(o[&ip("::1")], 5);
        assert!(parse_ip_overrides("").unwrap().is_empty());
        assert!(parse_ip_overrides("10.0.0.1").is_err());
        assert!(parse_ip_overrides("10.0.0.1:many").is_err());
    }

    #[test]
    fn defaults_match_kafka() {
        let c = BrokerConfig::default();
        assert_eq!(c.listener.port(), 9092);
        assert_eq!(c.data_dir, PathBuf::from("./tessera-data"));
        assert_eq!(c.socket_request_max_bytes, 100 * 1024 * 1024);
        assert_eq!(c.num_partitions, 1);
        assert!(c.auto_create_topics);
        assert_eq!(c.message_max_bytes, 1048588);
    }

    #[test]
    fn retention_and_roll_times_follow_kafkas_precedence() {
        let with = |pairs: &[(&str, &str)]| {
            let map = pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            let c = BrokerConfig::from_map(&map).unwrap();
            (c.log_retention_ms, c.log_roll_ms)
        };
        let week = 7 * 24 * 3_600_000;
        assert_eq!(with(&[]), (week, week));
        assert_eq!(with(&[("log.retention.hours", "24")]).0, 86_400_000);
        assert_eq!(
            with(&[
                ("log.retention.hours", "24"),
                ("log.retention.minutes", "30")
            ])
            .0,
            1_800_000
        );
        assert_eq!(
            with(&[("log.retention.ms", "5"), ("log.retention.minutes", "30")]).0,
            5
        );
        assert_eq!(with(&[("log.retention.hours", "-1")]).0, -1);
        assert_eq!(with(&[("log.roll.hours", "1")]).1, 3_600_000);
        assert_eq!(
            with(&[("log.roll.ms", "10"), ("log.roll.hours", "1")]).1,
            10
        );
        assert!(BrokerConfig::from_map(
            &[("log.retention.hours".to_string(), "a day".to_string())].into()
        )
        .is_err());
        assert_eq!(in_millis("log.retention.hours", "2"), "7200000");
        assert_eq!(in_millis("log.retention.ms", "2"), "2");
    }

    #[test]
    fn a_kafka_server_properties_file_loads() {
        // The keys of Kafka's own config/kraft/server.properties (ports
        // made free), with a comment, a continued line and escapes.
        let text = r#"
# Licensed to the Apache Software Foundation (ASF)
############################# Server Basics #############################
process.roles=broker,controller
node.id=1
listeners=PLAINTEXT://127.0.0.1:0,CONTROLLER://127.0.0.1:0
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SSL:SSL,\
    SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL
num.network.threads=3
num.io.threads=8
socket.send.buffer.bytes=102400
socket.receive.buffer.bytes=102400
socket.request.max.bytes=104857600
log.dirs=/tmp/kraft-combined-logs
num.partitions=1
num.recovery.threads.per.data.dir=1
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
! log.flush.interval.messages=10000
log.retention.hours=168
log.segment.bytes : 1073741824
log.retention.check.interval.ms 300000
"#;
        let map = parse_properties(text);
        assert_eq!(
            map["listener.security.protocol.map"],
            "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL"
        );
        assert_eq!(map["log.segment.bytes"], "1073741824");
        assert_eq!(map["log.retention.check.interval.ms"], "300000");
        assert!(!map.contains_key("log.flush.interval.messages"));
        let c = BrokerConfig::from_map(&map).unwrap();
        assert_eq!(c.log_retention_ms, 168 * 3_600_000);
        assert_eq!(c.data_dir, PathBuf::from("/tmp/kraft-combined-logs"));
        assert_eq!(
            c.ignored_keys,
            [
                "num.io.threads",
                "num.network.threads",
                "num.recovery.threads.per.data.dir",
                "socket.receive.buffer.bytes",
                "socket.send.buffer.bytes",
                "transaction.state.log.min.isr",
            ]
        );
        assert!(!c.explicit.contains_key("num.io.threads"));
        // The controller listener is the metadata quorum's, not a Kafka one.
        let names: Vec<&str> = c.listeners.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, ["PLAINTEXT"]);
        // A typo is still refused.
        let mut typo = map.clone();
        typo.insert("log.retention.hour".into(), "1".into());
        assert!(matches!(
            BrokerConfig::from_map(&typo),
            Err(ConfigError::UnknownKey(_))
        ));
        let escaped = parse_properties("a\\=b = c\\:d\\u0041\\\\\nkey2\t=\tx y\n");
        assert_eq!(escaped["a=b"], "c:dA\\");
        assert_eq!(escaped["key2"], "x y");
    }

    #[test]
    fn process_roles_combined_or_broker_only() {
        let map = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let combined = BrokerConfig::from_map(&map(&[])).unwrap();
        assert_eq!(combined.metadata_learner_listener, None);
        let voters = ("controller.quorum.voters", "1@127.0.0.1:19092");
        let broker = BrokerConfig::from_map(&map(&[("process.roles", "broker"), voters])).unwrap();
        assert_eq!(
            broker.metadata_learner_listener.as_deref(),
            Some("127.0.0.1:0")
        );
        let placed = BrokerConfig::from_map(&map(&[
            ("process.roles", "broker"),
            voters,
            ("metadata.listener", "127.0.0.1:19099"),
        ]))
        .unwrap();
        assert_eq!(
            placed.metadata_learner_listener.as_deref(),
            Some("127.0.0.1:19099")
        );
        assert!(!broker.controller_only && !combined.controller_only);
        // A broker-only node needs the quorum; unknown roles are refused.
        for bad in [
            map(&[("process.roles", "broker")]),
            map(&[("process.roles", "observer"), voters]),
        ] {
            assert!(matches!(
                BrokerConfig::from_map(&bad),
                Err(ConfigError::InvalidValue { key, .. }) if key == "process.roles"
            ));
        }
    }

    #[test]
    fn a_controller_only_node_is_one_of_the_voters_with_no_kafka_listener() {
        let map = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let voters = "1@127.0.0.1:19092,2@127.0.0.1:19093,3@127.0.0.1:19094";
        let c = BrokerConfig::from_map(&map(&[
            ("process.roles", "controller"),
            ("node.id", "2"),
            ("controller.quorum.voters", voters),
        ]))
        .unwrap();
        assert!(c.controller_only);
        assert_eq!(c.metadata_learner_listener, None);
        // Kafka's default `listeners` is not held against it; its address
        // is its own voter entry.
        assert!(c.listeners.is_empty());
        assert_eq!(c.listener, "127.0.0.1:19093".parse().unwrap());
        assert_eq!(
            (c.advertised_host.as_str(), c.advertised_port),
            ("127.0.0.1", 19093)
        );
        // Kafka's controller-only shape: only the CONTROLLER listener.
        let kafka_shape = map(&[
            ("process.roles", "controller"),
            ("node.id", "1"),
            ("controller.quorum.voters", voters),
            ("listeners", "CONTROLLER://:19092"),
            ("controller.listener.names", "CONTROLLER"),
        ]);
        assert!(BrokerConfig::from_map(&kafka_shape)
            .unwrap()
            .listeners
            .is_empty());
        // As in Kafka, the node must be one of the voters.
        for bad in [
            map(&[("process.roles", "controller")]),
            map(&[
                ("process.roles", "controller"),
                ("node.id", "4"),
                ("controller.quorum.voters", voters),
            ]),
        ] {
            match BrokerConfig::from_map(&bad) {
                Err(ConfigError::InvalidValue { key, value }) => {
                    assert_eq!(key, "controller.quorum.voters");
                    assert!(
                        value.contains("must be included in the set of voters"),
                        "{value}"
                    );
                }
                other => panic!("{other:?}"),
            }
        }
        // As in Kafka, `listeners` may name only controller listeners: a
        // client listener is refused, not ignored.
        let mut with_client = kafka_shape.clone();
        with_client.insert(
            "listeners".into(),
            "PLAINTEXT://127.0.0.1:9092,CONTROLLER://:19092".into(),
        );
        match BrokerConfig::from_map(&with_client) {
            Err(ConfigError::InvalidValue { key, value }) => {
                assert_eq!(key, "listeners");
                assert!(value.contains("PLAINTEXT"), "{value}");
            }
            other => panic!("{other:?}"),
        }
        // A CONTROLLER listener not named in controller.listener.names is a
        // client listener too.
        let mut unnamed = kafka_shape.clone();
        unnamed.remove("controller.listener.names");
        assert!(matches!(
            BrokerConfig::from_map(&unnamed),
            Err(ConfigError::InvalidValue { key, .. }) if key == "listeners"
        ));
    }

    #[test]
    fn a_kafka_controller_properties_file_loads() {
        // Kafka 3.x's config/kraft/controller.properties (port made free).
        let text = r#"
process.roles=controller
node.id=1
controller.quorum.voters=1@localhost:19093
listeners=CONTROLLER://:19093
controller.listener.names=CONTROLLER
num.network.threads=3
num.io.threads=8
socket.send.buffer.bytes=102400
socket.receive.buffer.bytes=102400
socket.request.max.bytes=104857600
log.dirs=/tmp/kraft-controller-logs
num.partitions=1
num.recovery.threads.per.data.dir=1
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
log.retention.hours=168
log.segment.bytes=1073741824
log.retention.check.interval.ms=300000
"#;
        let c = BrokerConfig::from_map(&parse_properties(text)).unwrap();
        assert!(c.controller_only && c.listeners.is_empty());
        assert_eq!(c.listener.port(), 19093);
        assert_eq!(c.data_dir, PathBuf::from("/tmp/kraft-controller-logs"));
        assert!(c.ignored_keys.contains(&"num.io.threads".to_string()));
    }

    #[test]
    fn toml_forms_env_and_overrides_layer() {
        let toml =
            "\"num.partitions\" = 3\nlog.dirs = \"/x\"\n[auto.create.topics]\nenable = false\n";
        let env = vec![("TESSERA_NUM_PARTITIONS".to_string(), "5".to_string())];
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.toml");
        std::fs::write(&path, toml).unwrap();
        let c = BrokerConfig::load(Some(&path), env.clone().into_iter(), &[]).unwrap();
        assert_eq!(c.num_partitions, 5);
        assert_eq!(c.data_dir, PathBuf::from("/x"));
        assert!(!c.auto_create_topics);
        let c = BrokerConfig::load(
            Some(&path),
            env.into_iter(),
            &[("num.partitions".into(), "7".into())],
        )
        .unwrap();
        assert_eq!(c.num_partitions, 7);
    }

    #[test]
    fn unknown_key_and_bad_value_are_refused() {
        let mut m = BTreeMap::new();
        m.insert("no.such.key".to_string(), "1".to_string());
        assert!(matches!(
            BrokerConfig::from_map(&m),
            Err(ConfigError::UnknownKey(_))
        ));
        let mut m = BTreeMap::new();
        m.insert("num.partitions".to_string(), "many".to_string());
        assert!(matches!(
            BrokerConfig::from_map(&m),
            Err(ConfigError::InvalidValue { .. })
        ));
    }

    #[test]
    fn listeners_accept_kafka_form() {
        assert_eq!(
            parse_listener("l", "PLAINTEXT://127.0.0.1:19092").unwrap(),
            ("127.0.0.1".into(), 19092)
        );
        assert_eq!(
            parse_listener("l", "localhost:1").unwrap(),
            ("localhost".into(), 1)
        );
        assert!(parse_listener("l", "SSL://h:1").is_err());
    }
}
