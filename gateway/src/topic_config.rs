//! Topic names and topic-level configs, validated as Kafka validates them.
//! Pure functions: no I/O, tested exhaustively below.

use std::collections::BTreeMap;

use crate::config::BrokerConfig;
use crate::error::ApiError;

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

#[derive(Clone, Copy)]
enum Kind {
    /// A long with a lower bound.
    Long(i64),
    /// An int with a lower bound.
    Int(i64),
    Bool,
    Double,
    OneOf(&'static [&'static str]),
    List(&'static [&'static str]),
    /// Free text (throttled replica lists, versions).
    Text,
}

/// Every topic-level config key Kafka accepts, with its type.
/// `(key, type, Kafka's default)`.
const TOPIC_CONFIGS: &[(&str, Kind, &str)] = &[
    (
        "cleanup.policy",
        Kind::List(&["delete", "compact"]),
        "delete",
    ),
    (
        "compression.type",
        Kind::OneOf(&["uncompressed", "zstd", "lz4", "snappy", "gzip", "producer"]),
        "producer",
    ),
    ("compression.gzip.level", Kind::Int(i64::MIN), "-1"),
    ("compression.lz4.level", Kind::Int(i64::MIN), "9"),
    ("compression.zstd.level", Kind::Int(i64::MIN), "3"),
    ("delete.retention.ms", Kind::Long(0), "86400000"),
    ("file.delete.delay.ms", Kind::Long(0), "60000"),
    ("flush.messages", Kind::Long(1), "9223372036854775807"),
    ("flush.ms", Kind::Long(0), "9223372036854775807"),
    ("follower.replication.throttled.replicas", Kind::Text, ""),
    ("index.interval.bytes", Kind::Int(0), "4096"),
    ("leader.replication.throttled.replicas", Kind::Text, ""),
    ("local.retention.bytes", Kind::Long(-2), "-2"),
    ("local.retention.ms", Kind::Long(-2), "-2"),
    (
        "max.compaction.lag.ms",
        Kind::Long(1),
        "9223372036854775807",
    ),
    ("max.message.bytes", Kind::Int(0), "1048588"),
    ("message.downconversion.enable", Kind::Bool, "true"),
    ("message.format.version", Kind::Text, "3.0-IV1"),
    (
        "message.timestamp.after.max.ms",
        Kind::Long(0),
        "9223372036854775807",
    ),
    (
        "message.timestamp.before.max.ms",
        Kind::Long(0),
        "9223372036854775807",
    ),
    (
        "message.timestamp.difference.max.ms",
        Kind::Long(0),
        "9223372036854775807",
    ),
    (
        "message.timestamp.type",
        Kind::OneOf(&["CreateTime", "LogAppendTime"]),
        "CreateTime",
    ),
    ("min.cleanable.dirty.ratio", Kind::Double, "0.5"),
    ("min.compaction.lag.ms", Kind::Long(0), "0"),
    ("min.insync.replicas", Kind::Int(1), "1"),
    ("preallocate", Kind::Bool, "false"),
    ("remote.storage.enable", Kind::Bool, "false"),
    ("retention.bytes", Kind::Long(i64::MIN), "-1"),
    ("retention.ms", Kind::Long(-1), "604800000"),
    ("segment.bytes", Kind::Int(14), "1073741824"),
    ("segment.index.bytes", Kind::Int(4), "10485760"),
    ("segment.jitter.ms", Kind::Long(0), "0"),
    ("segment.ms", Kind::Long(1), "604800000"),
    ("unclean.leader.election.enable", Kind::Bool, "false"),
    // Tessera's range policy, overridable per topic (broker defaults apply otherwise).
    ("range.split.bytes.per.sec", Kind::Long(1), "67108864"),
    ("range.merge.bytes.per.sec", Kind::Long(0), "8388608"),
    ("range.min.count", Kind::Int(1), "1"),
    ("range.max.count", Kind::Int(1), "64"),
];

fn check_value(key: &str, kind: Kind, value: &str) -> Result<(), ApiError> {
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
            v.parse::<f64>().map_err(|_| bad("expected a double"))?;
        }
        Kind::OneOf(allowed) => {
            if !allowed.contains(&v) {
                return Err(bad(&format!("must be one of {allowed:?}")));
            }
        }
        Kind::List(allowed) => {
            let items: Vec<&str> = v.split(',').map(str::trim).collect();
            if items.iter().any(|i| !allowed.contains(i)) {
                return Err(bad(&format!("each item must be one of {allowed:?}")));
            }
        }
        Kind::Text => {}
    }
    Ok(())
}

/// Validates a CreateTopics config list; returns the configs to store.
pub fn validate_topic_configs(
    configs: impl IntoIterator<Item = (String, Option<String>)>,
) -> Result<BTreeMap<String, String>, ApiError> {
    let mut out = BTreeMap::new();
    for (key, value) in configs {
        let Some((_, kind, _)) = TOPIC_CONFIGS.iter().find(|(k, _, _)| *k == key) else {
            return Err(ApiError::InvalidConfig(format!(
                "unknown topic config name: {key}"
            )));
        };
        let Some(value) = value else {
            return Err(ApiError::InvalidConfig(format!(
                "null value not supported for topic config {key}"
            )));
        };
        check_value(&key, *kind, &value)?;
        out.insert(key, value.trim().to_string());
    }
    Ok(out)
}

/// Kafka's config sources (DescribeConfigs `config_source`).
pub const SOURCE_TOPIC: i8 = 1;
pub const SOURCE_DEFAULT: i8 = 5;

/// One topic config as DescribeConfigs and CreateTopics (v5+) report it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DescribedConfig {
    pub name: &'static str,
    pub value: String,
    pub source: i8,
    /// Kafka's ConfigType code (BOOLEAN 1, STRING 2, INT 3, LONG 5, DOUBLE 6, LIST 7).
    pub config_type: i8,
}

/// Every topic config with its value: the topic's own, else the broker's
/// default where the broker has one, else Kafka's default.
pub fn describe_topic_configs(
    topic: &BTreeMap<String, String>,
    broker: &BrokerConfig,
) -> Vec<DescribedConfig> {
    let broker_default = |key: &str| -> Option<String> {
        Some(match key {
            "cleanup.policy" => broker.log_cleanup_policy.clone(),
            "max.message.bytes" => broker.message_max_bytes.to_string(),
            "message.timestamp.type" => broker.log_message_timestamp_type.clone(),
            "retention.bytes" => broker.log_retention_bytes.to_string(),
            "retention.ms" => broker.log_retention_ms.to_string(),
            "segment.bytes" => broker.log_segment_bytes.to_string(),
            "segment.ms" => broker.log_roll_ms.to_string(),
            "range.split.bytes.per.sec" => broker.range_policy.split_bytes_per_sec.to_string(),
            "range.merge.bytes.per.sec" => broker.range_policy.merge_bytes_per_sec.to_string(),
            "range.min.count" => broker.range_policy.min_count.to_string(),
            "range.max.count" => broker.range_policy.max_count.to_string(),
            _ => return None,
        })
    };
    TOPIC_CONFIGS
        .iter()
        .map(|(name, kind, default)| {
            let (value, source) = match topic.get(*name) {
                Some(v) => (v.clone(), SOURCE_TOPIC),
                None => (
                    broker_default(name).unwrap_or_else(|| default.to_string()),
                    SOURCE_DEFAULT,
                ),
            };
            let config_type = match kind {
                Kind::Bool => 1,
                Kind::OneOf(_) | Kind::Text => 2,
                Kind::Int(_) => 3,
                Kind::Long(_) => 5,
                Kind::Double => 6,
                Kind::List(_) => 7,
            };
            DescribedConfig {
                name,
                value,
                source,
                config_type,
            }
        })
        .collect()
}

/// The configs the log of a topic runs with: the topic's own, else the broker's defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EffectiveTopicConfig {
    pub segment_bytes: u64,
    pub segment_ms: i64,
    pub max_message_bytes: usize,
    pub log_append_time: bool,
    pub retention_ms: i64,
    pub retention_bytes: i64,
    /// `min.insync.replicas`: acks=-1 appends need this many in-sync replicas.
    pub min_insync_replicas: usize,
}

impl EffectiveTopicConfig {
    pub fn resolve(
        topic: &BTreeMap<String, String>,
        broker: &BrokerConfig,
    ) -> EffectiveTopicConfig {
        let num = |key: &str, default: i64| {
            topic
                .get(key)
                .and_then(|v| v.parse::<i64>().ok())
                .unwrap_or(default)
        };
        let ts_type = topic
            .get("message.timestamp.type")
            .unwrap_or(&broker.log_message_timestamp_type);
        EffectiveTopicConfig {
            segment_bytes: num("segment.bytes", broker.log_segment_bytes).max(14) as u64,
            segment_ms: num("segment.ms", broker.log_roll_ms).max(1),
            max_message_bytes: num("max.message.bytes", broker.message_max_bytes).max(0) as usize,
            log_append_time: ts_type == "LogAppendTime",
            retention_ms: num("retention.ms", broker.log_retention_ms),
            retention_bytes: num("retention.bytes", broker.log_retention_bytes),
            min_insync_replicas: num("min.insync.replicas", broker.min_insync_replicas).max(1)
                as usize,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn described_configs_cover_every_key_and_mark_sources() {
        let broker = BrokerConfig::default();
        let mut t = BTreeMap::new();
        t.insert("retention.ms".to_string(), "1000".to_string());
        let d = describe_topic_configs(&t, &broker);
        assert_eq!(d.len(), TOPIC_CONFIGS.len());
        let r = d.iter().find(|c| c.name == "retention.ms").unwrap();
        assert_eq!((r.value.as_str(), r.source), ("1000", SOURCE_TOPIC));
        let s = d.iter().find(|c| c.name == "segment.bytes").unwrap();
        assert_eq!((s.value.as_str(), s.source), ("1073741824", SOURCE_DEFAULT));
    }

    #[test]
    fn effective_config_prefers_topic_values() {
        let broker = BrokerConfig::default();
        let mut t = BTreeMap::new();
        let e = EffectiveTopicConfig::resolve(&t, &broker);
        assert_eq!(e.segment_bytes, 1 << 30);
        assert!(!e.log_append_time);
        t.insert("segment.bytes".into(), "2048".into());
        t.insert("message.timestamp.type".into(), "LogAppendTime".into());
        let e = EffectiveTopicConfig::resolve(&t, &broker);
        assert_eq!(e.segment_bytes, 2048);
        assert!(e.log_append_time);
    }
}
