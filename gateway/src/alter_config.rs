//! AlterConfigs and IncrementalAlterConfigs as pure functions: a resource's
//! current configs and the request's change in, the resource's whole new
//! set of configs (validated) out. `broker/configs.rs` plans and writes it.
//!
//! Errors follow Kafka (KRaft): malformed requests (a key twice, a null
//! value where one is needed, an unknown operation) are INVALID_REQUEST;
//! topic configs that do not validate are INVALID_CONFIG; broker configs
//! that do not validate are INVALID_REQUEST (Kafka's `ConfigAdminManager`,
//! KAFKA-13609).

use std::collections::{BTreeMap, BTreeSet};

use crate::dynamic_config::{self, broker_default};
use crate::error::ApiError;
use crate::topic_config::{list_items, topic_key, validate_topic_configs};

/// Kafka's ConfigResource types.
pub const RESOURCE_TOPIC: i8 = 2;
pub const RESOURCE_BROKER: i8 = 4;

/// IncrementalAlterConfigs operations (Kafka's `AlterConfigOp.OpType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpType {
    Set,
    Delete,
    Append,
    Subtract,
}

impl OpType {
    pub fn from_code(code: i8) -> Option<OpType> {
        Some(match code {
            0 => OpType::Set,
            1 => OpType::Delete,
            2 => OpType::Append,
            3 => OpType::Subtract,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            OpType::Set => "SET",
            OpType::Delete => "DELETE",
            OpType::Append => "APPEND",
            OpType::Subtract => "SUBTRACT",
        }
    }
}

/// What a request asks of one resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigChange {
    /// AlterConfigs: the resource's whole new set (keys not named are deleted).
    Replace(Vec<(String, Option<String>)>),
    /// IncrementalAlterConfigs: `(key, operation code, value)` in order.
    Incremental(Vec<(String, i8, Option<String>)>),
}

impl ConfigChange {
    /// The keys the change names.
    pub fn keys(&self) -> Vec<&str> {
        match self {
            ConfigChange::Replace(pairs) => pairs.iter().map(|(k, _)| k.as_str()).collect(),
            ConfigChange::Incremental(ops) => ops.iter().map(|(k, _, _)| k.as_str()).collect(),
        }
    }
}

/// The checks Kafka's `ConfigAdminManager.preprocess` makes before anything
/// else: each key once, a value unless deleting, known operations.
fn preprocess(change: &ConfigChange) -> Result<(), ApiError> {
    let mut seen = BTreeSet::new();
    let mut nulls = Vec::new();
    let mut entries: Vec<(&str, Option<i8>, bool)> = Vec::new();
    match change {
        ConfigChange::Replace(pairs) => {
            entries.extend(pairs.iter().map(|(k, v)| (k.as_str(), None, v.is_some())))
        }
        ConfigChange::Incremental(ops) => entries.extend(
            ops.iter()
                .map(|(k, op, v)| (k.as_str(), Some(*op), v.is_some())),
        ),
    }
    for (key, op, has_value) in &entries {
        if !seen.insert(*key) {
            return Err(ApiError::InvalidRequest(
                "Error due to duplicate config keys".into(),
            ));
        }
        if let Some(op) = op {
            if OpType::from_code(*op).is_none() {
                return Err(ApiError::InvalidRequest(format!(
                    "Unknown operations type {op}"
                )));
            }
        }
        let deleting = *op == Some(1);
        if !has_value && !deleting {
            nulls.push(*key);
        }
    }
    if !nulls.is_empty() {
        return Err(ApiError::InvalidRequest(format!(
            "Null value not supported for : {}",
            nulls.join(", ")
        )));
    }
    Ok(())
}

/// Applies incremental operations to `current`. APPEND and SUBTRACT work
/// on list keys only, starting from the current value or else `default`:
/// APPEND adds the items not there yet, SUBTRACT removes the items given.
fn apply_ops(
    current: &BTreeMap<String, String>,
    ops: &[(String, i8, Option<String>)],
    is_list: impl Fn(&str) -> bool,
    default: impl Fn(&str) -> Option<&'static str>,
    not_a_list: impl Fn(OpType, &str) -> ApiError,
) -> Result<BTreeMap<String, String>, ApiError> {
    let mut out = current.clone();
    for (key, op, value) in ops {
        let op = OpType::from_code(*op).expect("checked by preprocess");
        let value = value.as_deref().unwrap_or("");
        match op {
            OpType::Set => {
                out.insert(key.clone(), value.to_string());
            }
            OpType::Delete => {
                out.remove(key);
            }
            OpType::Append | OpType::Subtract => {
                if !is_list(key) {
                    return Err(not_a_list(op, key));
                }
                let old = out
                    .get(key)
                    .map(String::as_str)
                    .or_else(|| default(key))
                    .unwrap_or("");
                let mut items: Vec<&str> = list_items(old).collect();
                for item in list_items(value) {
                    if op == OpType::Append {
                        if !items.contains(&item) {
                            items.push(item);
                        }
                    } else {
                        items.retain(|i| *i != item);
                    }
                }
                let joined = items.join(",");
                out.insert(key.clone(), joined);
            }
        }
    }
    Ok(out)
}

/// A topic's new configs.
pub fn new_topic_configs(
    current: &BTreeMap<String, String>,
    change: &ConfigChange,
) -> Result<BTreeMap<String, String>, ApiError> {
    preprocess(change)?;
    match change {
        ConfigChange::Replace(pairs) => validate_topic_configs(pairs.iter().cloned()),
        ConfigChange::Incremental(ops) => {
            let next = apply_ops(
                current,
                ops,
                |k| topic_key(k).is_some_and(|k| k.kind.is_list()),
                |k| topic_key(k).map(|k| k.default),
                |op, key| {
                    ApiError::InvalidConfig(format!(
                        "Can't {} to key {key} because its type is not LIST.",
                        op.name()
                    ))
                },
            )?;
            validate_topic_configs(next.into_iter().map(|(k, v)| (k, Some(v))))
        }
    }
}

/// A broker's (or the cluster default's) new dynamic configs.
pub fn new_broker_configs(
    current: &BTreeMap<String, String>,
    change: &ConfigChange,
) -> Result<BTreeMap<String, String>, ApiError> {
    preprocess(change)?;
    let next: BTreeMap<String, String> = match change {
        ConfigChange::Replace(pairs) => pairs
            .iter()
            .map(|(k, v)| (k.clone(), v.clone().unwrap_or_default()))
            .collect(),
        ConfigChange::Incremental(ops) => apply_ops(
            current,
            ops,
            dynamic_config::is_list,
            broker_default,
            |op, key| {
                ApiError::InvalidRequest(format!(
                    "Config value {} is not allowed for config key: {key}",
                    op.name().to_lowercase()
                ))
            },
        )?,
    };
    dynamic_config::validate_dynamic(&next)?;
    Ok(next
        .into_iter()
        .map(|(k, v)| (k, v.trim().to_string()))
        .collect())
}

/// The broker a BROKER resource names: `None` for "" (the cluster-wide
/// default), else it must be this node's id (Kafka's
/// `validateResourceNameIsCurrentNodeId`).
pub fn broker_resource(name: &str, node_id: i32) -> Result<Option<i32>, ApiError> {
    if name.is_empty() {
        return Ok(None);
    }
    let id: i32 = name.parse().map_err(|_| {
        ApiError::InvalidRequest(format!("Node id must be an integer, but it is: {name}"))
    })?;
    if id != node_id {
        return Err(ApiError::InvalidRequest(format!(
            "Unexpected broker id, expected {node_id}, but received {name}"
        )));
    }
    Ok(Some(id))
}

/// Positions of resources named more than once in one request: each of
/// them is answered INVALID_REQUEST, as Kafka does.
pub fn duplicate_resources<'a>(resources: impl Iterator<Item = (i8, &'a str)>) -> BTreeSet<usize> {
    let all: Vec<(i8, &str)> = resources.collect();
    (0..all.len())
        .filter(|&i| (0..all.len()).any(|j| j != i && all[j] == all[i]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn ops(list: &[(&str, i8, Option<&str>)]) -> ConfigChange {
        ConfigChange::Incremental(
            list.iter()
                .map(|(k, op, v)| (k.to_string(), *op, v.map(String::from)))
                .collect(),
        )
    }

    fn replace(list: &[(&str, Option<&str>)]) -> ConfigChange {
        ConfigChange::Replace(
            list.iter()
                .map(|(k, v)| (k.to_string(), v.map(String::from)))
                .collect(),
        )
    }

    const SET: i8 = 0;
    const DELETE: i8 = 1;
    const APPEND: i8 = 2;
    const SUBTRACT: i8 = 3;

    #[test]
    fn replace_sets_exactly_the_given_keys() {
        let current = map(&[("retention.ms", "1"), ("segment.bytes", "2048")]);
        let next = new_topic_configs(&current, &replace(&[("retention.ms", Some(" 5 "))])).unwrap();
        assert_eq!(next, map(&[("retention.ms", "5")]));
        assert_eq!(
            new_topic_configs(&current, &replace(&[])).unwrap(),
            BTreeMap::new()
        );
    }

    #[test]
    fn set_and_delete_keep_the_rest() {
        let current = map(&[("retention.ms", "1"), ("segment.bytes", "2048")]);
        let next = new_topic_configs(
            &current,
            &ops(&[
                ("retention.ms", SET, Some("9")),
                ("segment.bytes", DELETE, None),
                // Deleting a key that is not set changes nothing.
                ("segment.ms", DELETE, None),
                ("max.message.bytes", SET, Some("100")),
            ]),
        )
        .unwrap();
        assert_eq!(
            next,
            map(&[("max.message.bytes", "100"), ("retention.ms", "9")])
        );
        // A DELETE may carry no value; the null check is for the others.
        assert!(new_topic_configs(&current, &ops(&[("retention.ms", DELETE, Some("x"))])).is_ok());
    }

    #[test]
    fn append_and_subtract_on_lists() {
        let empty = BTreeMap::new();
        // APPEND starts from the default ("delete") when the topic has none.
        let next = new_topic_configs(&empty, &ops(&[("cleanup.policy", APPEND, Some("compact"))]))
            .unwrap();
        assert_eq!(next["cleanup.policy"], "delete,compact");
        // Appending what is there already changes nothing.
        let next =
            new_topic_configs(&next, &ops(&[("cleanup.policy", APPEND, Some("delete"))])).unwrap();
        assert_eq!(next["cleanup.policy"], "delete,compact");
        let next = new_topic_configs(&next, &ops(&[("cleanup.policy", SUBTRACT, Some("delete"))]))
            .unwrap();
        assert_eq!(next["cleanup.policy"], "compact");
        // Subtracting the last item leaves an empty list.
        let next = new_topic_configs(
            &next,
            &ops(&[("cleanup.policy", SUBTRACT, Some("compact,delete"))]),
        )
        .unwrap();
        assert_eq!(next["cleanup.policy"], "");
        let next = new_topic_configs(
            &empty,
            &ops(&[(
                "leader.replication.throttled.replicas",
                APPEND,
                Some("0:1,1:1"),
            )]),
        )
        .unwrap();
        assert_eq!(next["leader.replication.throttled.replicas"], "0:1,1:1");
        let next = new_topic_configs(
            &next,
            &ops(&[(
                "leader.replication.throttled.replicas",
                SUBTRACT,
                Some("0:1"),
            )]),
        )
        .unwrap();
        assert_eq!(next["leader.replication.throttled.replicas"], "1:1");
        // Appending an item the list does not allow fails validation.
        let e = new_topic_configs(&empty, &ops(&[("cleanup.policy", APPEND, Some("shred"))]))
            .unwrap_err();
        assert_eq!(e.code(), 40);
    }

    #[test]
    fn append_or_subtract_on_a_non_list_is_invalid_config() {
        for op in [APPEND, SUBTRACT] {
            let e = new_topic_configs(&BTreeMap::new(), &ops(&[("retention.ms", op, Some("1"))]))
                .unwrap_err();
            assert_eq!(e.code(), 40, "{e}");
            assert!(e.to_string().contains("not LIST"), "{e}");
        }
    }

    #[test]
    fn topic_validation_errors() {
        let empty = BTreeMap::new();
        let code = |c: ConfigChange| new_topic_configs(&empty, &c).unwrap_err().code();
        assert_eq!(code(ops(&[("no.such.key", SET, Some("1"))])), 40);
        assert_eq!(code(ops(&[("retention.ms", SET, Some("soon"))])), 40);
        assert_eq!(code(replace(&[("segment.bytes", Some("1"))])), 40);
        assert_eq!(code(replace(&[("no.such.key", Some("1"))])), 40);
        // Malformed requests: INVALID_REQUEST.
        assert_eq!(code(ops(&[("retention.ms", SET, None)])), 42);
        assert_eq!(code(replace(&[("retention.ms", None)])), 42);
        assert_eq!(
            code(ops(&[
                ("retention.ms", SET, Some("1")),
                ("retention.ms", DELETE, None)
            ])),
            42
        );
        assert_eq!(code(ops(&[("retention.ms", 9, Some("1"))])), 42);
    }

    #[test]
    fn broker_configs_validate_as_kafka() {
        let current = map(&[("log.retention.ms", "1000")]);
        let next = new_broker_configs(
            &current,
            &ops(&[
                ("message.max.bytes", SET, Some("2048")),
                ("log.cleanup.policy", APPEND, Some("compact")),
                ("log.retention.ms", DELETE, None),
            ]),
        )
        .unwrap();
        assert_eq!(
            next,
            map(&[
                ("log.cleanup.policy", "delete,compact"),
                ("message.max.bytes", "2048")
            ])
        );
        let next =
            new_broker_configs(&current, &replace(&[("min.insync.replicas", Some("2"))])).unwrap();
        assert_eq!(next, map(&[("min.insync.replicas", "2")]));
        let code = |c: ConfigChange| new_broker_configs(&current, &c).unwrap_err().code();
        assert_eq!(code(ops(&[("num.partitions", SET, Some("3"))])), 42);
        assert_eq!(code(ops(&[("log.retention.ms", SET, Some("x"))])), 42);
        assert_eq!(code(ops(&[("log.retention.ms", APPEND, Some("1"))])), 42);
        assert_eq!(code(replace(&[("node.id", Some("4"))])), 42);
        assert_eq!(code(ops(&[("message.max.bytes", SET, None)])), 42);
    }

    #[test]
    fn broker_resource_names() {
        assert_eq!(broker_resource("", 1).unwrap(), None);
        assert_eq!(broker_resource("1", 1).unwrap(), Some(1));
        assert_eq!(broker_resource("2", 1).unwrap_err().code(), 42);
        assert_eq!(broker_resource("one", 1).unwrap_err().code(), 42);
    }

    #[test]
    fn duplicate_resources_are_all_marked() {
        let d = duplicate_resources([(2, "a"), (2, "b"), (4, "a"), (2, "a")].into_iter());
        assert_eq!(d.into_iter().collect::<Vec<_>>(), vec![0, 3]);
    }
}
