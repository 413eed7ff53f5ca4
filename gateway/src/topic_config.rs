//! Topic names and topic-level configs, validated as Kafka validates them.
//! Pure functions: no I/O, tested exhaustively below.

use std::borrow::Cow;
use std::collections::BTreeMap;

use crate::config::BrokerConfig;
use crate::error::ApiError;

/// What a topic's configs fall back to: the broker's values (Kafka's
/// `LogConfig` defaults taken from `KafkaConfig`). Implemented by
/// `dynamic_config::BrokerView`; a trait so that this module, below the
/// broker's dynamic configs, does not import them.
pub trait BrokerDefaults {
    /// The broker's static config.
    fn config(&self) -> &BrokerConfig;
    /// The dynamic value of broker key `key` (this broker's, else the
    /// cluster-wide default).
    fn dynamic(&self, key: &str) -> Option<&str>;
    /// Every source with a value for broker key `key`, highest precedence
    /// first.
    fn sources(&self, key: &str) -> Vec<ConfigSynonym>;
}

/// Kafka's limit on a topic name's length.
pub const MAX_TOPIC_NAME_LEN: usize = 249;

/// Kafka's `Topic.validate`: 1..=249 chars of `[a-zA-Z0-9._-]`, not "." or "..".
pub fn validate_topic_name(name: &str) -> Result<(), ApiError> {
    if name.is_empty() {
        return Err(ApiError::InvalidTopic(
            "topic name is illegal, it can't be empty".into(),
        ));
    }
    if name == "." || name == ".." {
        return Err(ApiError::InvalidTopic(
            "topic name cannot be \".\" or \"..\"".into(),
        ));
    }
    if name.len() > MAX_TOPIC_NAME_LEN {
        return Err(ApiError::InvalidTopic(format!(
            "topic name is illegal, it can't be longer than {MAX_TOPIC_NAME_LEN} characters"
        )));
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '_' || c == '-')
    {
        return Err(ApiError::InvalidTopic(format!(
            "topic name {name:?} is illegal, it contains a character other than ASCII alphanumerics, '.', '_' and '-'"
        )));
    }
    Ok(())
}

/// A config's type, with what its values may be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A long with a lower bound.
    Long(i64),
    /// An int with a lower bound.
    Int(i64),
    Bool,
    Double,
    OneOf(&'static [&'static str]),
    /// A comma-separated list of allowed items (possibly empty).
    List(&'static [&'static str]),
    /// Kafka's throttled-replica list: `*`, or `partition:broker` pairs.
    ThrottledReplicas,
    /// Free text (versions).
    Text,
    /// A comma-separated list of any items (class names, cipher suites).
    AnyList,
    /// A double of at least 0 (a rate, a factor).
    AnyDouble,
    /// A secret (Kafka's PASSWORD type): never shown by DescribeConfigs.
    Password,
}

impl Kind {
    /// Kafka's ConfigType code (BOOLEAN 1, STRING 2, INT 3, LONG 5, DOUBLE 6, LIST 7).
    pub(crate) fn config_type(self) -> i8 {
        match self {
            Kind::Bool => 1,
            Kind::OneOf(_) | Kind::Text => 2,
            Kind::Int(_) => 3,
            Kind::Long(_) => 5,
            Kind::Double | Kind::AnyDouble => 6,
            Kind::List(_) | Kind::ThrottledReplicas | Kind::AnyList => 7,
            Kind::Password => 9,
        }
    }

    /// Whether IncrementalAlterConfigs may APPEND to / SUBTRACT from it.
    pub(crate) fn is_list(self) -> bool {
        matches!(
            self,
            Kind::List(_) | Kind::ThrottledReplicas | Kind::AnyList
        )
    }
}

/// The broker config a topic config falls back on (Kafka's
/// `ServerTopicConfigSynonyms`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Synonym {
    /// No broker-level value: the topic default applies.
    None,
    /// A broker config that can also be set dynamically (per broker or
    /// cluster-wide) with AlterConfigs, as Kafka's `DynamicLogConfig` allows.
    Dynamic(&'static str),
    /// A broker config set only at startup.
    Static(&'static str),
}

/// One topic-level config key Kafka accepts.
pub(crate) struct TopicKey {
    pub name: &'static str,
    pub kind: Kind,
    /// Kafka's default, used where no broker synonym has a value.
    pub default: &'static str,
    pub synonym: Synonym,
    pub doc: &'static str,
}

const fn key(
    name: &'static str,
    kind: Kind,
    default: &'static str,
    synonym: Synonym,
    doc: &'static str,
) -> TopicKey {
    TopicKey {
        name,
        kind,
        default,
        synonym,
        doc,
    }
}

use Synonym::{Dynamic, Static};

const MAX_LONG: &str = "9223372036854775807";

/// Every topic-level config key Kafka accepts (and tessera's range policy
/// keys), with its type, default, broker synonym and documentation.
pub(crate) const TOPIC_CONFIGS: &[TopicKey] = &[
    key(
        "cleanup.policy",
        Kind::List(&["delete", "compact"]),
        "delete",
        Dynamic("log.cleanup.policy"),
        "How old log segments are retired: \"delete\" removes them past the retention limits, \"compact\" keeps the latest value of each key; both may be listed.",
    ),
    key(
        "compression.type",
        Kind::OneOf(&["uncompressed", "zstd", "lz4", "snappy", "gzip", "producer"]),
        "producer",
        Dynamic("compression.type"),
        "The compression the topic stores batches with; \"producer\" keeps the producer's codec.",
    ),
    key(
        "compression.gzip.level",
        Kind::Int(i64::MIN),
        "-1",
        Dynamic("compression.gzip.level"),
        "The level used when compression.type is gzip.",
    ),
    key(
        "compression.lz4.level",
        Kind::Int(i64::MIN),
        "9",
        Dynamic("compression.lz4.level"),
        "The level used when compression.type is lz4.",
    ),
    key(
        "compression.zstd.level",
        Kind::Int(i64::MIN),
        "3",
        Dynamic("compression.zstd.level"),
        "The level used when compression.type is zstd.",
    ),
    key(
        "delete.retention.ms",
        Kind::Long(0),
        "86400000",
        Dynamic("log.cleaner.delete.retention.ms"),
        "How long delete tombstones are kept in a compacted topic.",
    ),
    key(
        "file.delete.delay.ms",
        Kind::Long(0),
        "60000",
        Dynamic("log.segment.delete.delay.ms"),
        "How long to wait before deleting a file from the filesystem.",
    ),
    key(
        "flush.messages",
        Kind::Long(1),
        MAX_LONG,
        Dynamic("log.flush.interval.messages"),
        "Force an fsync after this many messages.",
    ),
    key(
        "flush.ms",
        Kind::Long(0),
        MAX_LONG,
        Dynamic("log.flush.interval.ms"),
        "Force an fsync after this much time.",
    ),
    key(
        "follower.replication.throttled.replicas",
        Kind::ThrottledReplicas,
        "",
        Synonym::None,
        "Replicas whose follower-side replication is throttled: \"partition:broker\" pairs, or \"*\".",
    ),
    key(
        "index.interval.bytes",
        Kind::Int(0),
        "4096",
        Dynamic("log.index.interval.bytes"),
        "How often an offset index entry is added.",
    ),
    key(
        "leader.replication.throttled.replicas",
        Kind::ThrottledReplicas,
        "",
        Synonym::None,
        "Replicas whose leader-side replication is throttled: \"partition:broker\" pairs, or \"*\".",
    ),
    key(
        "local.retention.bytes",
        Kind::Long(-2),
        "-2",
        Dynamic("log.local.retention.bytes"),
        "The most bytes of a partition kept locally with tiered storage (-2: retention.bytes).",
    ),
    key(
        "local.retention.ms",
        Kind::Long(-2),
        "-2",
        Dynamic("log.local.retention.ms"),
        "How long segments are kept locally with tiered storage (-2: retention.ms).",
    ),
    key(
        "max.compaction.lag.ms",
        Kind::Long(1),
        MAX_LONG,
        Dynamic("log.cleaner.max.compaction.lag.ms"),
        "The longest a message stays uncompacted.",
    ),
    key(
        "max.message.bytes",
        Kind::Int(0),
        "1048588",
        Dynamic("message.max.bytes"),
        "The largest record batch the topic accepts, in bytes.",
    ),
    key(
        "message.downconversion.enable",
        Kind::Bool,
        "true",
        Dynamic("log.message.downconversion.enable"),
        "Whether old fetch versions get down-converted batches.",
    ),
    key(
        "message.format.version",
        Kind::Text,
        "3.0-IV1",
        Static("log.message.format.version"),
        "Deprecated: the message format version (tessera stores magic 2 only).",
    ),
    key(
        "message.timestamp.after.max.ms",
        Kind::Long(0),
        MAX_LONG,
        Dynamic("log.message.timestamp.after.max.ms"),
        "How far a record's timestamp may be ahead of the broker's clock.",
    ),
    key(
        "message.timestamp.before.max.ms",
        Kind::Long(0),
        MAX_LONG,
        Dynamic("log.message.timestamp.before.max.ms"),
        "How far a record's timestamp may be behind the broker's clock.",
    ),
    key(
        "message.timestamp.difference.max.ms",
        Kind::Long(0),
        MAX_LONG,
        Dynamic("log.message.timestamp.difference.max.ms"),
        "Deprecated: the largest difference between a record's timestamp and the broker's clock.",
    ),
    key(
        "message.timestamp.type",
        Kind::OneOf(&["CreateTime", "LogAppendTime"]),
        "CreateTime",
        Dynamic("log.message.timestamp.type"),
        "Whether stored timestamps are the producer's (CreateTime) or the broker's (LogAppendTime).",
    ),
    key(
        "min.cleanable.dirty.ratio",
        Kind::Double,
        "0.5",
        Dynamic("log.cleaner.min.cleanable.ratio"),
        "The share of uncompacted log above which the cleaner compacts.",
    ),
    key(
        "min.compaction.lag.ms",
        Kind::Long(0),
        "0",
        Dynamic("log.cleaner.min.compaction.lag.ms"),
        "The shortest time a message stays uncompacted.",
    ),
    key(
        "min.insync.replicas",
        Kind::Int(1),
        "1",
        Dynamic("min.insync.replicas"),
        "With acks=all, the fewest in-sync replicas that must have a write; fewer is NOT_ENOUGH_REPLICAS.",
    ),
    key(
        "preallocate",
        Kind::Bool,
        "false",
        Dynamic("log.preallocate"),
        "Whether segment files are preallocated.",
    ),
    key(
        "remote.storage.enable",
        Kind::Bool,
        "false",
        Synonym::None,
        "Whether tiered storage is on for the topic.",
    ),
    key(
        "retention.bytes",
        Kind::Long(i64::MIN),
        "-1",
        Dynamic("log.retention.bytes"),
        "The most bytes a partition keeps before old segments are deleted (-1: no limit).",
    ),
    key(
        "retention.ms",
        Kind::Long(-1),
        "604800000",
        Dynamic("log.retention.ms"),
        "How long a segment is kept before it is deleted (-1: no limit).",
    ),
    key(
        "segment.bytes",
        Kind::Int(14),
        "1073741824",
        Dynamic("log.segment.bytes"),
        "The size at which a segment rolls.",
    ),
    key(
        "segment.index.bytes",
        Kind::Int(4),
        "10485760",
        Dynamic("log.index.size.max.bytes"),
        "The size of a segment's offset index.",
    ),
    key(
        "segment.jitter.ms",
        Kind::Long(0),
        "0",
        Dynamic("log.roll.jitter.ms"),
        "The most random jitter subtracted from segment.ms.",
    ),
    key(
        "segment.ms",
        Kind::Long(1),
        "604800000",
        Dynamic("log.roll.ms"),
        "The age at which a non-empty segment rolls.",
    ),
    key(
        "unclean.leader.election.enable",
        Kind::Bool,
        "false",
        Dynamic("unclean.leader.election.enable"),
        "Whether a replica that is not in sync may become leader.",
    ),
    // Tessera's range policy, overridable per topic (broker defaults apply otherwise).
    key(
        "range.split.bytes.per.sec",
        Kind::Long(1),
        "67108864",
        Static("range.split.bytes.per.sec"),
        "Tessera: a range producing above this rate for range.policy.sustain.intervals splits.",
    ),
    key(
        "range.merge.bytes.per.sec",
        Kind::Long(0),
        "8388608",
        Static("range.merge.bytes.per.sec"),
        "Tessera: two adjacent ranges both below this rate merge.",
    ),
    key(
        "range.min.count",
        Kind::Int(1),
        "1",
        Static("range.min.count"),
        "Tessera: the fewest active ranges the policy merges down to.",
    ),
    key(
        "range.max.count",
        Kind::Int(1),
        "64",
        Static("range.max.count"),
        "Tessera: the most active ranges the policy splits up to.",
    ),
];

/// The topic config `name`, if Kafka (or tessera) has it.
pub(crate) fn topic_key(name: &str) -> Option<&'static TopicKey> {
    TOPIC_CONFIGS.iter().find(|k| k.name == name)
}

/// Checks `value` against `kind`; the error is INVALID_CONFIG with Kafka's
/// kind of message.
pub(crate) fn check_value(key: &str, kind: Kind, value: &str) -> Result<(), ApiError> {
    let bad = |why: &str| {
        ApiError::InvalidConfig(format!(
            "invalid value {value:?} for configuration {key}: {why}"
        ))
    };
    let v = value.trim();
    match kind {
        Kind::Long(min) => {
            let n: i64 = v.parse().map_err(|_| bad("expected a long"))?;
            if n < min {
                return Err(bad(&format!("value must be at least {min}")));
            }
        }
        Kind::Int(min) => {
            let n: i32 = v.parse().map_err(|_| bad("expected an int"))?;
            if (n as i64) < min {
                return Err(bad(&format!("value must be at least {min}")));
            }
        }
        Kind::Bool => {
            if !v.eq_ignore_ascii_case("true") && !v.eq_ignore_ascii_case("false") {
                return Err(bad("expected true or false"));
            }
        }
        Kind::Double => {
            // The one double key, min.cleanable.dirty.ratio, is Kafka's between(0, 1).
            let x = v.parse::<f64>().map_err(|_| bad("expected a double"))?;
            if !(0.0..=1.0).contains(&x) {
                return Err(bad("value must be between 0 and 1"));
            }
        }
        Kind::OneOf(allowed) => {
            if !allowed.contains(&v) {
                return Err(bad(&format!("must be one of {allowed:?}")));
            }
        }
        Kind::List(allowed) => {
            if list_items(v).any(|i| !allowed.contains(&i)) {
                return Err(bad(&format!("each item must be one of {allowed:?}")));
            }
        }
        Kind::ThrottledReplicas => {
            let pair = |i: &str| {
                i.split_once(':').is_some_and(|(p, b)| {
                    !p.is_empty()
                        && !b.is_empty()
                        && p.bytes().all(|c| c.is_ascii_digit())
                        && b.bytes().all(|c| c.is_ascii_digit())
                })
            };
            if v != "*" && !list_items(v).all(pair) {
                return Err(bad("must be \"*\" or a list of \"partition:broker\" pairs"));
            }
        }
        Kind::AnyDouble => {
            let x = v.parse::<f64>().map_err(|_| bad("expected a double"))?;
            if !x.is_finite() || x < 0.0 {
                return Err(bad("value must be at least 0"));
            }
        }
        Kind::Text | Kind::AnyList | Kind::Password => {}
    }
    Ok(())
}

/// The items of a comma-separated list value (empty items dropped).
pub(crate) fn list_items(value: &str) -> impl Iterator<Item = &str> {
    value.split(',').map(str::trim).filter(|i| !i.is_empty())
}

/// Validates a CreateTopics config list; returns the configs to store.
pub fn validate_topic_configs(
    configs: impl IntoIterator<Item = (String, Option<String>)>,
) -> Result<BTreeMap<String, String>, ApiError> {
    let mut out = BTreeMap::new();
    for (key, value) in configs {
        let Some(k) = topic_key(&key) else {
            return Err(ApiError::InvalidConfig(format!(
                "unknown topic config name: {key}"
            )));
        };
        let Some(value) = value else {
            return Err(ApiError::InvalidConfig(format!(
                "null value not supported for topic config {key}"
            )));
        };
        check_value(&key, k.kind, &value)?;
        out.insert(key, value.trim().to_string());
    }
    Ok(out)
}

/// Kafka's config sources (DescribeConfigs `config_source`).
pub const SOURCE_TOPIC: i8 = 1;
pub const SOURCE_DYNAMIC_BROKER: i8 = 2;
pub const SOURCE_DYNAMIC_DEFAULT_BROKER: i8 = 3;
pub const SOURCE_STATIC_BROKER: i8 = 4;
pub const SOURCE_DEFAULT: i8 = 5;

/// One place a config's value comes from (DescribeConfigs synonyms).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigSynonym {
    pub name: Cow<'static, str>,
    pub value: String,
    pub source: i8,
}

/// One config as DescribeConfigs and CreateTopics (v5+) report it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DescribedConfig {
    /// A fixed key's name, or a stored listener override's.
    pub name: Cow<'static, str>,
    pub value: String,
    pub source: i8,
    /// Kafka's ConfigType code (BOOLEAN 1, STRING 2, INT 3, SHORT 4, LONG 5, DOUBLE 6, LIST 7).
    pub config_type: i8,
    pub read_only: bool,
    pub sensitive: bool,
    /// Every source with a value, highest precedence first (the first is
    /// where `value` comes from).
    pub synonyms: Vec<ConfigSynonym>,
    pub doc: &'static str,
}

/// Every topic config with its value and where it comes from, as Kafka's
/// `ConfigHelper` reports it: the topic's own (TOPIC_CONFIG), else the
/// broker synonym's (DYNAMIC_BROKER_CONFIG, DYNAMIC_DEFAULT_BROKER_CONFIG,
/// STATIC_BROKER_CONFIG, DEFAULT_CONFIG), else Kafka's default.
pub fn describe_topic_configs(
    topic: &BTreeMap<String, String>,
    broker: &dyn BrokerDefaults,
) -> Vec<DescribedConfig> {
    TOPIC_CONFIGS
        .iter()
        .map(|k| {
            let mut synonyms = Vec::new();
            if let Some(v) = topic.get(k.name) {
                synonyms.push(ConfigSynonym {
                    name: k.name.into(),
                    value: v.clone(),
                    source: SOURCE_TOPIC,
                });
            }
            match k.synonym {
                Synonym::Dynamic(s) | Synonym::Static(s) => synonyms.extend(broker.sources(s)),
                Synonym::None => {}
            }
            let (value, source) = synonyms
                .first()
                .map(|s| (crate::config::in_millis(&s.name, &s.value), s.source))
                .unwrap_or_else(|| (k.default.to_string(), SOURCE_DEFAULT));
            DescribedConfig {
                name: k.name.into(),
                value,
                source,
                config_type: k.kind.config_type(),
                read_only: false,
                sensitive: false,
                synonyms,
                doc: k.doc,
            }
        })
        .collect()
}

/// The configs the log of a topic runs with: the topic's own, else the
/// broker's dynamic value (its own, then the cluster default), else its
/// static one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EffectiveTopicConfig {
    pub segment_bytes: u64,
    pub segment_ms: i64,
    pub max_message_bytes: usize,
    pub log_append_time: bool,
    pub retention_ms: i64,
    pub retention_bytes: i64,
    /// `min.insync.replicas`: acks=-1 appends need this many in-sync replicas.
    pub min_insync_replicas: usize,
    /// `cleanup.policy` includes `compact`: every record needs a key.
    pub compacted: bool,
    /// `compression.type` as a batch codec id; `None` for `producer` (the
    /// producer's codec is kept).
    pub compression_codec: Option<i16>,
    /// `message.timestamp.before.max.ms` / `after.max.ms`: how far a
    /// CreateTime record's timestamp may be behind / ahead of the clock.
    pub timestamp_before_max_ms: i64,
    pub timestamp_after_max_ms: i64,
}

impl EffectiveTopicConfig {
    /// What each record of a batch produced to the topic must satisfy.
    pub fn record_rules(&self) -> tessera_log::validator::RecordRules {
        tessera_log::validator::RecordRules {
            require_key: self.compacted,
            timestamp_bounds: (!self.log_append_time)
                .then_some((self.timestamp_before_max_ms, self.timestamp_after_max_ms)),
        }
    }
}

/// The codec id of a `compression.type` value (`None`: `producer`).
pub fn compression_codec(value: &str) -> Option<i16> {
    use tessera_log::records::codec;
    match value.trim().to_ascii_lowercase().as_str() {
        "uncompressed" | "none" => Some(codec::NONE),
        "gzip" => Some(codec::GZIP),
        "snappy" => Some(codec::SNAPPY),
        "lz4" => Some(codec::LZ4),
        "zstd" => Some(codec::ZSTD),
        _ => None,
    }
}

impl EffectiveTopicConfig {
    pub fn resolve(
        topic: &BTreeMap<String, String>,
        broker: &dyn BrokerDefaults,
    ) -> EffectiveTopicConfig {
        let num = |key: &str, broker_key: &str, fallback: i64| {
            topic
                .get(key)
                .and_then(|v| v.trim().parse::<i64>().ok())
                .or_else(|| broker.dynamic(broker_key)?.trim().parse().ok())
                .unwrap_or(fallback)
        };
        let c = broker.config();
        // Keys tessera has no field for: the static value, else Kafka's default.
        let static_num = |key: &str, fallback: i64| {
            c.explicit
                .get(key)
                .and_then(|v| v.trim().parse::<i64>().ok())
                .unwrap_or(fallback)
        };
        let ts_type = topic
            .get("message.timestamp.type")
            .map(String::as_str)
            .or_else(|| broker.dynamic("log.message.timestamp.type"))
            .unwrap_or(&c.log_message_timestamp_type);
        let compacted = topic
            .get("cleanup.policy")
            .map(String::as_str)
            .or_else(|| broker.dynamic("log.cleanup.policy"))
            .unwrap_or(&c.log_cleanup_policy)
            .split(',')
            .any(|p| p.trim() == "compact");
        // Kafka's LogConfig.maxSegmentMs: a compacted topic rolls by
        // max.compaction.lag.ms too, so the cleaner can reach a late record.
        let segment_ms = num("segment.ms", "log.roll.ms", c.log_roll_ms).max(1);
        let max_compaction_lag_ms = num(
            "max.compaction.lag.ms",
            "log.cleaner.max.compaction.lag.ms",
            i64::MAX,
        );
        EffectiveTopicConfig {
            segment_bytes: num("segment.bytes", "log.segment.bytes", c.log_segment_bytes).max(14)
                as u64,
            segment_ms: if compacted && max_compaction_lag_ms > 0 {
                segment_ms.min(max_compaction_lag_ms)
            } else {
                segment_ms
            },
            max_message_bytes: num(
                "max.message.bytes",
                "message.max.bytes",
                c.message_max_bytes,
            )
            .max(0) as usize,
            log_append_time: ts_type.trim() == "LogAppendTime",
            retention_ms: num("retention.ms", "log.retention.ms", c.log_retention_ms),
            retention_bytes: num(
                "retention.bytes",
                "log.retention.bytes",
                c.log_retention_bytes,
            ),
            min_insync_replicas: num(
                "min.insync.replicas",
                "min.insync.replicas",
                c.min_insync_replicas,
            )
            .max(1) as usize,
            compacted,
            compression_codec: compression_codec(
                topic
                    .get("compression.type")
                    .map(String::as_str)
                    .or_else(|| broker.dynamic("compression.type"))
                    .or_else(|| c.explicit.get("compression.type").map(String::as_str))
                    .unwrap_or("producer"),
            ),
            timestamp_before_max_ms: num(
                "message.timestamp.before.max.ms",
                "log.message.timestamp.before.max.ms",
                static_num("log.message.timestamp.before.max.ms", i64::MAX),
            )
            .max(0),
            timestamp_after_max_ms: num(
                "message.timestamp.after.max.ms",
                "log.message.timestamp.after.max.ms",
                static_num("log.message.timestamp.after.max.ms", i64::MAX),
            )
            .max(0),
        }
    }
}

/// The cleaning configs of a topic, resolved as [`EffectiveTopicConfig`]
/// is (the topic's value, else its dynamic broker synonym, else the default).
#[derive(Clone, Debug, PartialEq)]
pub struct CompactionConfig {
    /// `cleanup.policy` includes `compact`.
    pub compact: bool,
    pub delete_retention_ms: i64,
    pub min_compaction_lag_ms: i64,
    pub min_cleanable_dirty_ratio: f64,
    /// `max.compaction.lag.ms` (Kafka's default: never forces a pass).
    pub max_compaction_lag_ms: i64,
}

impl CompactionConfig {
    pub fn resolve(
        topic: &BTreeMap<String, String>,
        broker: &dyn BrokerDefaults,
    ) -> CompactionConfig {
        let value = |key: &str, broker_key: &str| -> String {
            topic
                .get(key)
                .map(String::as_str)
                .or_else(|| broker.dynamic(broker_key))
                .or_else(|| topic_key(key).map(|k| k.default))
                .unwrap_or_default()
                .trim()
                .to_string()
        };
        let policy = topic
            .get("cleanup.policy")
            .map(String::as_str)
            .or_else(|| broker.dynamic("log.cleanup.policy"))
            .unwrap_or(&broker.config().log_cleanup_policy)
            .to_string();
        CompactionConfig {
            compact: policy.split(',').any(|p| p.trim() == "compact"),
            delete_retention_ms: value("delete.retention.ms", "log.cleaner.delete.retention.ms")
                .parse()
                .unwrap_or(86_400_000),
            min_compaction_lag_ms: value(
                "min.compaction.lag.ms",
                "log.cleaner.min.compaction.lag.ms",
            )
            .parse()
            .unwrap_or(0),
            min_cleanable_dirty_ratio: value(
                "min.cleanable.dirty.ratio",
                "log.cleaner.min.cleanable.ratio",
            )
            .parse()
            .unwrap_or(0.5),
            max_compaction_lag_ms: value(
                "max.compaction.lag.ms",
                "log.cleaner.max.compaction.lag.ms",
            )
            .parse()
            .unwrap_or(i64::MAX),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::BrokerConfig;
    use crate::dynamic_config::BrokerView;
    use tessera_metadata::{MetadataImage, MetadataRecord};

    #[test]
    fn topic_names_follow_kafka() {
        for ok in ["a", "A-b_c.d", "x".repeat(249).as_str(), "..."] {
            assert!(validate_topic_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", ".", "..", "a b", "a/b", "ü", &"x".repeat(250)] {
            assert!(validate_topic_name(bad).is_err(), "{bad}");
        }
    }

    fn one(k: &str, v: &str) -> Result<BTreeMap<String, String>, ApiError> {
        validate_topic_configs([(k.to_string(), Some(v.to_string()))])
    }

    #[test]
    fn topic_configs_are_typed() {
        assert!(one("retention.ms", "-1").is_ok());
        assert!(one("retention.ms", "-2").is_err());
        assert!(one("retention.bytes", "1000").is_ok());
        assert!(one("segment.bytes", "13").is_err());
        assert!(one("segment.bytes", "1048576").is_ok());
        assert!(one("segment.ms", "0").is_err());
        assert!(one("max.message.bytes", "abc").is_err());
        assert!(one("cleanup.policy", "compact,delete").is_ok());
        assert!(one("cleanup.policy", "shred").is_err());
        assert!(one("message.timestamp.type", "LogAppendTime").is_ok());
        assert!(one("message.timestamp.type", "Now").is_err());
        assert!(matches!(
            one("no.such.config", "1"),
            Err(ApiError::InvalidConfig(_))
        ));
        assert!(validate_topic_configs([("retention.ms".into(), None)]).is_err());
    }

    fn image_with(dynamic: &[(Option<i32>, &str, &str)]) -> MetadataImage {
        let mut image = MetadataImage::default();
        for (i, (broker_id, key, value)) in dynamic.iter().enumerate() {
            image.apply(
                &MetadataRecord::SetBrokerConfig {
                    broker_id: *broker_id,
                    key: key.to_string(),
                    value: Some(value.to_string()),
                },
                i as i64,
            );
        }
        image
    }

    fn find<'a>(d: &'a [DescribedConfig], name: &str) -> &'a DescribedConfig {
        d.iter().find(|c| c.name == name).unwrap()
    }

    #[test]
    fn the_dirty_ratio_is_between_0_and_1() {
        assert!(one("min.cleanable.dirty.ratio", "0").is_ok());
        assert!(one("min.cleanable.dirty.ratio", "1").is_ok());
        assert!(one("min.cleanable.dirty.ratio", "0.25").is_ok());
        assert!(one("min.cleanable.dirty.ratio", "1.5").is_err());
        assert!(one("min.cleanable.dirty.ratio", "-0.1").is_err());
        assert!(one("min.cleanable.dirty.ratio", "NaN").is_err());
    }

    #[test]
    fn compaction_configs_resolve_topic_then_broker_then_default() {
        let broker = BrokerConfig::default();
        let image = image_with(&[
            (None, "log.cleaner.delete.retention.ms", "99"),
            (
                Some(broker.node_id),
                "log.cleaner.min.compaction.lag.ms",
                "7",
            ),
        ]);
        let view = BrokerView::new(&broker, &image);
        let none = CompactionConfig::resolve(&BTreeMap::new(), &view);
        assert_eq!(
            none,
            CompactionConfig {
                compact: false,
                delete_retention_ms: 99,
                min_compaction_lag_ms: 7,
                min_cleanable_dirty_ratio: 0.5,
                max_compaction_lag_ms: i64::MAX,
            }
        );
        let mut t = BTreeMap::new();
        t.insert("cleanup.policy".to_string(), "delete, compact".to_string());
        t.insert("min.cleanable.dirty.ratio".to_string(), "0.25".to_string());
        t.insert("delete.retention.ms".to_string(), "5".to_string());
        let c = CompactionConfig::resolve(&t, &view);
        assert!(c.compact);
        assert_eq!(
            (c.delete_retention_ms, c.min_cleanable_dirty_ratio),
            (5, 0.25)
        );
    }

    #[test]
    fn retention_hours_describe_in_ms_with_their_own_synonym() {
        let map = [("log.retention.hours".to_string(), "24".to_string())].into();
        let broker = BrokerConfig::from_map(&map).unwrap();
        let image = image_with(&[]);
        let view = BrokerView::new(&broker, &image);
        let d = describe_topic_configs(&BTreeMap::new(), &view);
        let r = find(&d, "retention.ms");
        assert_eq!(
            (r.value.as_str(), r.source),
            ("86400000", SOURCE_STATIC_BROKER)
        );
        let names: Vec<(&str, &str)> = r
            .synonyms
            .iter()
            .map(|s| (s.name.as_ref(), s.value.as_str()))
            .collect();
        assert_eq!(
            names,
            [
                ("log.retention.hours", "24"),
                ("log.retention.ms", "604800000")
            ]
        );
        assert_eq!(
            EffectiveTopicConfig::resolve(&BTreeMap::new(), &view).retention_ms,
            86_400_000
        );
        // A dynamic log.retention.ms still wins over the static hours.
        let image = image_with(&[(None, "log.retention.ms", "1000")]);
        let view = BrokerView::new(&broker, &image);
        let d = describe_topic_configs(&BTreeMap::new(), &view);
        assert_eq!(find(&d, "retention.ms").value, "1000");
        assert_eq!(
            EffectiveTopicConfig::resolve(&BTreeMap::new(), &view).retention_ms,
            1000
        );
    }

    #[test]
    fn described_configs_cover_every_key_and_mark_sources() {
        let mut map = BTreeMap::new();
        map.insert("log.segment.bytes".to_string(), "2097152".to_string());
        let broker = BrokerConfig::from_map(&map).unwrap();
        let image = image_with(&[
            (None, "log.retention.bytes", "100"),
            (None, "message.max.bytes", "2000"),
            (Some(1), "message.max.bytes", "3000"),
        ]);
        let view = BrokerView::new(&broker, &image);
        let mut t = BTreeMap::new();
        t.insert("retention.ms".to_string(), "1000".to_string());
        let d = describe_topic_configs(&t, &view);
        assert_eq!(d.len(), TOPIC_CONFIGS.len());
        let r = find(&d, "retention.ms");
        assert_eq!((r.value.as_str(), r.source), ("1000", SOURCE_TOPIC));
        assert_eq!(
            r.synonyms,
            vec![
                ConfigSynonym {
                    name: "retention.ms".into(),
                    value: "1000".into(),
                    source: SOURCE_TOPIC
                },
                ConfigSynonym {
                    name: "log.retention.ms".into(),
                    value: "604800000".into(),
                    source: SOURCE_DEFAULT
                },
            ]
        );
        let s = find(&d, "segment.bytes");
        assert_eq!(
            (s.value.as_str(), s.source),
            ("2097152", SOURCE_STATIC_BROKER)
        );
        let s = find(&d, "segment.ms");
        assert_eq!((s.value.as_str(), s.source), ("604800000", SOURCE_DEFAULT));
        let s = find(&d, "retention.bytes");
        assert_eq!(
            (s.value.as_str(), s.source),
            ("100", SOURCE_DYNAMIC_DEFAULT_BROKER)
        );
        let s = find(&d, "max.message.bytes");
        assert_eq!(
            (s.value.as_str(), s.source),
            ("3000", SOURCE_DYNAMIC_BROKER)
        );
        let sources: Vec<(&str, i8)> = s
            .synonyms
            .iter()
            .map(|s| (s.name.as_ref(), s.source))
            .collect();
        assert_eq!(
            sources,
            vec![
                ("message.max.bytes", SOURCE_DYNAMIC_BROKER),
                ("message.max.bytes", SOURCE_DYNAMIC_DEFAULT_BROKER),
                ("message.max.bytes", SOURCE_DEFAULT),
            ]
        );
        // No broker synonym: Kafka's default, no synonyms.
        let s = find(&d, "remote.storage.enable");
        assert_eq!((s.value.as_str(), s.source), ("false", SOURCE_DEFAULT));
        assert!(s.synonyms.is_empty());
        assert_eq!(find(&d, "cleanup.policy").config_type, 7);
        assert_eq!(
            find(&d, "leader.replication.throttled.replicas").config_type,
            7
        );
        assert!(d
            .iter()
            .all(|c| !c.read_only && !c.sensitive && !c.doc.is_empty()));
    }

    #[test]
    fn effective_config_prefers_topic_then_dynamic_then_static_values() {
        let broker = BrokerConfig::default();
        let empty = MetadataImage::default();
        let view = BrokerView::new(&broker, &empty);
        let mut t = BTreeMap::new();
        let e = EffectiveTopicConfig::resolve(&t, &view);
        assert_eq!(e.segment_bytes, 1 << 30);
        assert_eq!(e.max_message_bytes, 1048588);
        assert_eq!(e.min_insync_replicas, 1);
        assert!(!e.log_append_time);
        let image = image_with(&[
            (None, "min.insync.replicas", "2"),
            (None, "message.max.bytes", "1000"),
            (Some(1), "message.max.bytes", "2000"),
            (Some(2), "message.max.bytes", "3000"),
            (None, "log.message.timestamp.type", "LogAppendTime"),
        ]);
        let view = BrokerView::new(&broker, &image);
        let e = EffectiveTopicConfig::resolve(&t, &view);
        assert_eq!(e.min_insync_replicas, 2);
        assert_eq!(e.max_message_bytes, 2000, "this broker's own value wins");
        assert!(e.log_append_time);
        t.insert("segment.bytes".into(), "2048".into());
        t.insert("max.message.bytes".into(), "100".into());
        t.insert("message.timestamp.type".into(), "CreateTime".into());
        let e = EffectiveTopicConfig::resolve(&t, &view);
        assert_eq!(e.segment_bytes, 2048);
        assert_eq!(e.max_message_bytes, 100);
        assert!(!e.log_append_time);
        assert_eq!(e.compression_codec, None, "producer by default");
        t.insert("compression.type".into(), "zstd".into());
        let e = EffectiveTopicConfig::resolve(&t, &view);
        assert_eq!(e.compression_codec, Some(tessera_log::records::codec::ZSTD));
    }

    #[test]
    fn max_compaction_lag_caps_the_roll_of_compacted_topics_only() {
        let broker = BrokerConfig::default();
        let empty = MetadataImage::default();
        let view = BrokerView::new(&broker, &empty);
        let t: BTreeMap<String, String> = [
            ("segment.ms".to_string(), "60000".to_string()),
            ("max.compaction.lag.ms".to_string(), "5000".to_string()),
        ]
        .into();
        assert_eq!(EffectiveTopicConfig::resolve(&t, &view).segment_ms, 60_000);
        let mut compacted = t.clone();
        compacted.insert("cleanup.policy".into(), "compact".into());
        assert_eq!(
            EffectiveTopicConfig::resolve(&compacted, &view).segment_ms,
            5_000
        );
        assert_eq!(
            CompactionConfig::resolve(&compacted, &view).max_compaction_lag_ms,
            5_000
        );
        compacted.remove("max.compaction.lag.ms");
        assert_eq!(
            EffectiveTopicConfig::resolve(&compacted, &view).segment_ms,
            60_000
        );
        assert_eq!(
            CompactionConfig::resolve(&compacted, &view).max_compaction_lag_ms,
            i64::MAX
        );
    }

    #[test]
    fn list_kinds_and_throttled_replicas() {
        assert!(one("cleanup.policy", "").is_ok());
        assert!(one("cleanup.policy", "compact, delete").is_ok());
        assert!(one("leader.replication.throttled.replicas", "*").is_ok());
        assert!(one("leader.replication.throttled.replicas", "0:1,1:2").is_ok());
        assert!(one("leader.replication.throttled.replicas", "").is_ok());
        assert!(one("follower.replication.throttled.replicas", "0-1").is_err());
        assert!(one("follower.replication.throttled.replicas", "a:1").is_err());
        assert!(topic_key("cleanup.policy").unwrap().kind.is_list());
        assert!(!topic_key("retention.ms").unwrap().kind.is_list());
    }
}
