//! AlterConfigs (v0-2) and IncrementalAlterConfigs (v0-1) over the wire
//! against an in-process broker: validate_only writes nothing, Kafka's
//! errors for bad keys, values, topics and broker resources, dynamic broker
//! configs (per broker and the cluster-wide default, which the clients'
//! admin APIs cannot address) changing what Produce accepts, and configs
//! that survive a restart.

use crate::common;

use std::path::Path;

use bytes::Bytes;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    alter_configs_request, describe_configs_request, incremental_alter_configs_request,
    AlterConfigsRequest, DescribeConfigsRequest, DescribeConfigsResponse,
    IncrementalAlterConfigsRequest, ProduceRequest, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use tessera_gateway::broker::NewTopic;
use tessera_gateway::Running;
use tessera_log::batch::testing::make_batch;

use common::WireClient;

const TOPIC: i8 = 2;
const BROKER: i8 = 4;

const NONE: i16 = 0;
const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
const MESSAGE_TOO_LARGE: i16 = 10;
const INVALID_CONFIG: i16 = 40;
const INVALID_REQUEST: i16 = 42;

const SET: i8 = 0;
const DELETE: i8 = 1;
const APPEND: i8 = 2;
const SUBTRACT: i8 = 3;

// Kafka's config sources.
const TOPIC_CONFIG: i8 = 1;
const DYNAMIC_BROKER_CONFIG: i8 = 2;
const DYNAMIC_DEFAULT_BROKER_CONFIG: i8 = 3;
const DEFAULT_CONFIG: i8 = 5;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

async fn start(dir: &Path) -> Running {
    tessera_gateway::start(common::test_config(dir, &[]))
        .await
        .unwrap()
}

async fn create(running: &Running, name: &str, configs: &[(&str, &str)]) {
    running
        .broker
        .create_topic(
            NewTopic {
                name: name.into(),
                partitions: 1,
                replication_factor: 1,
                configs: configs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            },
            false,
        )
        .await
        .unwrap();
}

/// Legacy AlterConfigs of one resource; `(error code, message)`.
async fn alter(
    client: &mut WireClient,
    version: i16,
    rtype: i8,
    name: &str,
    configs: &[(&str, Option<&str>)],
    validate_only: bool,
) -> (i16, Option<String>) {
    let request = AlterConfigsRequest::default()
        .with_validate_only(validate_only)
        .with_resources(vec![alter_configs_request::AlterConfigsResource::default()
            .with_resource_type(rtype)
            .with_resource_name(s(name))
            .with_configs(
                configs
                    .iter()
                    .map(|(k, v)| {
                        alter_configs_request::AlterableConfig::default()
                            .with_name(s(k))
                            .with_value(v.map(s))
                    })
                    .collect(),
            )]);
    let response = client.call(version, &request).await;
    assert_eq!(response.responses.len(), 1);
    let r = &response.responses[0];
    assert_eq!((r.resource_type, r.resource_name.as_str()), (rtype, name));
    (
        r.error_code,
        r.error_message.as_ref().map(|m| m.to_string()),
    )
}

/// IncrementalAlterConfigs of one resource; `(error code, message)`.
async fn incremental(
    client: &mut WireClient,
    version: i16,
    rtype: i8,
    name: &str,
    ops: &[(&str, i8, Option<&str>)],
    validate_only: bool,
) -> (i16, Option<String>) {
    let request = IncrementalAlterConfigsRequest::default()
        .with_validate_only(validate_only)
        .with_resources(vec![
            incremental_alter_configs_request::AlterConfigsResource::default()
                .with_resource_type(rtype)
                .with_resource_name(s(name))
                .with_configs(
                    ops.iter()
                        .map(|(k, op, v)| {
                            incremental_alter_configs_request::AlterableConfig::default()
                                .with_name(s(k))
                                .with_config_operation(*op)
                                .with_value(v.map(s))
                        })
                        .collect(),
                ),
        ]);
    let response = client.call(version, &request).await;
    assert_eq!(response.responses.len(), 1);
    let r = &response.responses[0];
    assert_eq!((r.resource_type, r.resource_name.as_str()), (rtype, name));
    (
        r.error_code,
        r.error_message.as_ref().map(|m| m.to_string()),
    )
}

async fn describe_full(client: &mut WireClient, rtype: i8, name: &str) -> DescribeConfigsResponse {
    let request = DescribeConfigsRequest::default()
        .with_include_synonyms(true)
        .with_include_documentation(true)
        .with_resources(vec![
            describe_configs_request::DescribeConfigsResource::default()
                .with_resource_type(rtype)
                .with_resource_name(s(name))
                .with_configuration_keys(None),
        ]);
    client.call(4, &request).await
}

/// `key -> (value, source)` of a resource, which must describe without error.
async fn describe(
    client: &mut WireClient,
    rtype: i8,
    name: &str,
) -> std::collections::BTreeMap<String, (String, i8)> {
    let response = describe_full(client, rtype, name).await;
    let r = &response.results[0];
    assert_eq!(r.error_code, NONE, "describe {name}: {:?}", r.error_message);
    r.configs
        .iter()
        .map(|c| {
            (
                c.name.to_string(),
                (
                    c.value.as_ref().map(|v| v.to_string()).unwrap_or_default(),
                    c.config_source,
                ),
            )
        })
        .collect()
}

fn value(v: &str, source: i8) -> (String, i8) {
    (v.to_string(), source)
}

/// Produces one batch of `records` one-byte records; the partition's error code.
async fn produce(client: &mut WireClient, topic: &str, records: i32) -> i16 {
    let request = ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(30_000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(TopicName(s(topic)))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(0)
                .with_records(Some(Bytes::from(make_batch(records, 1_000))))])]);
    let response = client.call(9, &request).await;
    response.responses[0].partition_responses[0].error_code
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topic_configs_in_every_version() {
    let dir = tempfile::tempdir().unwrap();
    let running = start(dir.path()).await;
    create(&running, "t", &[("segment.bytes", "1048576")]).await;
    let mut client = WireClient::connect(running.kafka_addr).await;

    for v in 0..=2 {
        // validate_only: answered, nothing written (not even a metadata entry).
        let offset = running.broker.image().offset;
        let r = alter(
            &mut client,
            v,
            TOPIC,
            "t",
            &[("retention.ms", Some("1000"))],
            true,
        )
        .await;
        assert_eq!(r, (NONE, None));
        assert_eq!(running.broker.image().offset, offset);
        assert_eq!(
            describe(&mut client, TOPIC, "t").await["segment.bytes"],
            value("1048576", TOPIC_CONFIG)
        );
        // Errors, with nothing applied.
        let (code, message) = alter(
            &mut client,
            v,
            TOPIC,
            "t",
            &[("retention.ms", Some("soon"))],
            false,
        )
        .await;
        assert_eq!(code, INVALID_CONFIG);
        assert!(message.unwrap().contains("retention.ms"));
        let r = alter(&mut client, v, TOPIC, "t", &[("no.such", Some("1"))], false).await;
        assert_eq!(r.0, INVALID_CONFIG);
        let r = alter(&mut client, v, TOPIC, "t", &[("retention.ms", None)], false).await;
        assert_eq!(r.0, INVALID_REQUEST);
        let r = alter(&mut client, v, TOPIC, "nope", &[], false).await;
        assert_eq!(r.0, UNKNOWN_TOPIC_OR_PARTITION);
        assert_eq!(running.broker.image().offset, offset);
        // The whole set is replaced: segment.bytes goes back to its default.
        let r = alter(
            &mut client,
            v,
            TOPIC,
            "t",
            &[("retention.ms", Some("1000"))],
            false,
        )
        .await;
        assert_eq!(r, (NONE, None));
        let d = describe(&mut client, TOPIC, "t").await;
        assert_eq!(d["retention.ms"], value("1000", TOPIC_CONFIG));
        assert_eq!(d["segment.bytes"], value("1073741824", DEFAULT_CONFIG));
        // Back to the start for the next version.
        let r = alter(
            &mut client,
            v,
            TOPIC,
            "t",
            &[("segment.bytes", Some("1048576"))],
            false,
        )
        .await;
        assert_eq!(r, (NONE, None));
    }

    for v in 0..=1 {
        let offset = running.broker.image().offset;
        let r = incremental(
            &mut client,
            v,
            TOPIC,
            "t",
            &[("retention.ms", SET, Some("7"))],
            true,
        )
        .await;
        assert_eq!(r, (NONE, None));
        assert_eq!(running.broker.image().offset, offset);
        for (ops, want) in [
            (vec![("no.such", SET, Some("1"))], INVALID_CONFIG),
            (vec![("retention.ms", SET, Some("x"))], INVALID_CONFIG),
            (vec![("retention.ms", APPEND, Some("1"))], INVALID_CONFIG),
            (vec![("retention.ms", SET, None)], INVALID_REQUEST),
            (vec![("retention.ms", 7, Some("1"))], INVALID_REQUEST),
            (
                vec![
                    ("retention.ms", SET, Some("1")),
                    ("retention.ms", DELETE, None),
                ],
                INVALID_REQUEST,
            ),
        ] {
            let r = incremental(&mut client, v, TOPIC, "t", &ops, false).await;
            assert_eq!(r.0, want, "{ops:?}: {r:?}");
        }
        let r = incremental(&mut client, v, TOPIC, "gone", &[], false).await;
        assert_eq!(r.0, UNKNOWN_TOPIC_OR_PARTITION);
        assert_eq!(running.broker.image().offset, offset);

        let r = incremental(
            &mut client,
            v,
            TOPIC,
            "t",
            &[
                ("retention.ms", SET, Some("7")),
                ("cleanup.policy", APPEND, Some("compact")),
                ("segment.ms", DELETE, None),
            ],
            false,
        )
        .await;
        assert_eq!(r, (NONE, None));
        let d = describe(&mut client, TOPIC, "t").await;
        assert_eq!(d["retention.ms"], value("7", TOPIC_CONFIG));
        assert_eq!(d["cleanup.policy"], value("delete,compact", TOPIC_CONFIG));
        assert_eq!(d["segment.bytes"], value("1048576", TOPIC_CONFIG));
        let r = incremental(
            &mut client,
            v,
            TOPIC,
            "t",
            &[
                ("retention.ms", DELETE, None),
                ("cleanup.policy", SUBTRACT, Some("delete,compact")),
            ],
            false,
        )
        .await;
        assert_eq!(r, (NONE, None));
        let d = describe(&mut client, TOPIC, "t").await;
        assert_eq!(d["retention.ms"], value("604800000", DEFAULT_CONFIG));
        assert_eq!(d["cleanup.policy"], value("", TOPIC_CONFIG));
        // An empty list is a value; deleting it brings the default back.
        let r = incremental(
            &mut client,
            v,
            TOPIC,
            "t",
            &[("cleanup.policy", DELETE, None)],
            false,
        )
        .await;
        assert_eq!(r, (NONE, None));
        let d = describe(&mut client, TOPIC, "t").await;
        assert_eq!(d["cleanup.policy"], value("delete", DEFAULT_CONFIG));
    }

    // DescribeConfigs reports synonyms, documentation and types.
    let response = describe_full(&mut client, TOPIC, "t").await;
    let configs = &response.results[0].configs;
    let sb = configs
        .iter()
        .find(|c| c.name.as_str() == "segment.bytes")
        .unwrap();
    let synonyms: Vec<(&str, i8)> = sb
        .synonyms
        .iter()
        .map(|s| (s.name.as_str(), s.source))
        .collect();
    assert_eq!(
        synonyms,
        vec![
            ("segment.bytes", TOPIC_CONFIG),
            ("log.segment.bytes", DEFAULT_CONFIG)
        ]
    );
    assert_eq!(sb.config_type, 3);
    assert!(configs
        .iter()
        .all(|c| c.documentation.as_ref().is_some_and(|d| !d.is_empty())
            && !c.read_only
            && !c.is_sensitive));

    // A resource named twice: both refused.
    let resource = incremental_alter_configs_request::AlterConfigsResource::default()
        .with_resource_type(TOPIC)
        .with_resource_name(s("t"));
    let request =
        IncrementalAlterConfigsRequest::default().with_resources(vec![resource.clone(), resource]);
    let response = client.call(1, &request).await;
    let codes: Vec<i16> = response.responses.iter().map(|r| r.error_code).collect();
    assert_eq!(codes, vec![INVALID_REQUEST, INVALID_REQUEST]);
    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamic_broker_configs_apply_and_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut running = start(dir.path()).await;
    create(&running, "t", &[]).await;
    create(&running, "own", &[("max.message.bytes", "100000")]).await;
    let mut client = WireClient::connect(running.kafka_addr).await;
    // A batch of 50 one-byte records is ~460 bytes, one of 3 under 100.
    assert_eq!(produce(&mut client, "t", 50).await, NONE);

    // Broker resource errors: another broker, a read-only key, a bad value,
    // APPEND on a non-list; all INVALID_REQUEST as in Kafka, nothing written.
    let offset = running.broker.image().offset;
    for (name, ops) in [
        ("7", vec![("message.max.bytes", SET, Some("200"))]),
        ("x", vec![("message.max.bytes", SET, Some("200"))]),
        ("1", vec![("num.partitions", SET, Some("3"))]),
        ("", vec![("message.max.bytes", SET, Some("big"))]),
        ("", vec![("log.retention.ms", APPEND, Some("1"))]),
        ("", vec![("no.such.key", SET, Some("1"))]),
    ] {
        let r = incremental(&mut client, 1, BROKER, name, &ops, false).await;
        assert_eq!(r.0, INVALID_REQUEST, "{name:?} {ops:?}: {r:?}");
    }
    // Certificates: per broker only, and only where a TLS listener is.
    for (name, expected) in [
        ("", "default cluster level"),
        ("1", "no SSL or SASL_SSL listener"),
    ] {
        let ops = [(
            "listener.name.ssl.ssl.keystore.location",
            SET,
            Some("/k.pem"),
        )];
        let r = incremental(&mut client, 1, BROKER, name, &ops, false).await;
        assert_eq!(r.0, INVALID_REQUEST, "{name:?}: {r:?}");
        assert!(r.1.as_deref().unwrap_or("").contains(expected), "{r:?}");
    }
    let r = alter(
        &mut client,
        2,
        BROKER,
        "1",
        &[("node.id", Some("2"))],
        false,
    )
    .await;
    assert_eq!(r.0, INVALID_REQUEST);
    let r = incremental(
        &mut client,
        1,
        BROKER,
        "",
        &[("message.max.bytes", SET, Some("200"))],
        true,
    )
    .await;
    assert_eq!(r, (NONE, None));
    assert_eq!(running.broker.image().offset, offset);
    assert_eq!(produce(&mut client, "t", 50).await, NONE);

    // The cluster-wide default lowers message.max.bytes for topics that do
    // not set max.message.bytes.
    let r = incremental(
        &mut client,
        0,
        BROKER,
        "",
        &[
            ("message.max.bytes", SET, Some("200")),
            ("log.retention.ms", SET, Some("3600000")),
        ],
        false,
    )
    .await;
    assert_eq!(r, (NONE, None));
    assert_eq!(produce(&mut client, "t", 50).await, MESSAGE_TOO_LARGE);
    assert_eq!(produce(&mut client, "t", 3).await, NONE);
    assert_eq!(produce(&mut client, "own", 50).await, NONE);
    let d = describe(&mut client, TOPIC, "t").await;
    assert_eq!(
        d["max.message.bytes"],
        value("200", DYNAMIC_DEFAULT_BROKER_CONFIG)
    );
    assert_eq!(
        d["retention.ms"],
        value("3600000", DYNAMIC_DEFAULT_BROKER_CONFIG)
    );
    // This broker's own value wins over the default (legacy AlterConfigs
    // sets the broker's whole set).
    let r = alter(
        &mut client,
        1,
        BROKER,
        "1",
        &[("message.max.bytes", Some("100000"))],
        false,
    )
    .await;
    assert_eq!(r, (NONE, None));
    assert_eq!(produce(&mut client, "t", 50).await, NONE);
    let d = describe(&mut client, BROKER, "1").await;
    assert_eq!(
        d["message.max.bytes"],
        value("100000", DYNAMIC_BROKER_CONFIG)
    );
    assert_eq!(
        d["log.retention.ms"],
        value("3600000", DYNAMIC_DEFAULT_BROKER_CONFIG)
    );
    // The cluster-wide resource lists only its own values.
    let d = describe(&mut client, BROKER, "").await;
    assert_eq!(
        d.into_iter().collect::<Vec<_>>(),
        vec![
            (
                "log.retention.ms".to_string(),
                value("3600000", DYNAMIC_DEFAULT_BROKER_CONFIG)
            ),
            (
                "message.max.bytes".to_string(),
                value("200", DYNAMIC_DEFAULT_BROKER_CONFIG)
            ),
        ]
    );
    let r = incremental(
        &mut client,
        1,
        TOPIC,
        "t",
        &[("retention.ms", SET, Some("5"))],
        false,
    )
    .await;
    assert_eq!(r, (NONE, None));

    // segment.bytes reaches the range log already open: it rolls at the
    // next append, and stops rolling once the key is deleted again.
    let before = running.broker.segment_count();
    let r = incremental(
        &mut client,
        1,
        TOPIC,
        "t",
        &[("segment.bytes", SET, Some("14"))],
        false,
    )
    .await;
    assert_eq!(r, (NONE, None));
    assert_eq!(produce(&mut client, "t", 3).await, NONE);
    assert_eq!(produce(&mut client, "t", 3).await, NONE);
    let rolled = running.broker.segment_count();
    assert_eq!(rolled, before + 2);
    let r = incremental(
        &mut client,
        1,
        TOPIC,
        "t",
        &[("segment.bytes", DELETE, None)],
        false,
    )
    .await;
    assert_eq!(r, (NONE, None));
    assert_eq!(produce(&mut client, "t", 3).await, NONE);
    assert_eq!(produce(&mut client, "t", 3).await, NONE);
    assert_eq!(running.broker.segment_count(), rolled);

    // Everything is in the metadata log: a restart keeps it.
    drop(client);
    running.shutdown().await;
    running = start(dir.path()).await;
    let mut client = WireClient::connect(running.kafka_addr).await;
    let d = describe(&mut client, TOPIC, "t").await;
    assert_eq!(d["retention.ms"], value("5", TOPIC_CONFIG));
    assert_eq!(
        d["max.message.bytes"],
        value("100000", DYNAMIC_BROKER_CONFIG)
    );
    // Deleting this broker's value brings the default's back.
    let r = incremental(
        &mut client,
        1,
        BROKER,
        "1",
        &[("message.max.bytes", DELETE, None)],
        false,
    )
    .await;
    assert_eq!(r, (NONE, None));
    assert_eq!(produce(&mut client, "t", 50).await, MESSAGE_TOO_LARGE);
    drop(client);
    running.shutdown().await;
    running = start(dir.path()).await;
    let mut client = WireClient::connect(running.kafka_addr).await;
    assert_eq!(produce(&mut client, "t", 50).await, MESSAGE_TOO_LARGE);
    let d = describe(&mut client, BROKER, "1").await;
    assert_eq!(
        d["message.max.bytes"],
        value("200", DYNAMIC_DEFAULT_BROKER_CONFIG)
    );
    running.shutdown().await;
}

/// A topic created through the broker itself (not the CreateTopics
/// handler: the console, auto-creation) has its configs checked as
/// CreateTopics checks them; nothing is created when one is bad.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_created_by_the_broker_itself_has_its_configs_checked() {
    let dir = tempfile::tempdir().unwrap();
    let running = start(dir.path()).await;
    for (key, value) in [
        ("retention.ms", "soon"),
        ("cleanup.policy", "sometimes"),
        ("no.such.config", "1"),
    ] {
        let refused = running
            .broker
            .create_topic(
                NewTopic {
                    name: "checked".into(),
                    partitions: 1,
                    replication_factor: 1,
                    configs: [(key.to_string(), value.to_string())].into(),
                },
                false,
            )
            .await
            .expect_err(key);
        assert_eq!(refused.code(), INVALID_CONFIG, "{key}={value}: {refused:?}");
    }
    assert!(running.broker.image().topic_by_name("checked").is_none());
    // A valid value is stored as given, trimmed as CreateTopics trims it.
    create(&running, "checked", &[("retention.ms", " 60000 ")]).await;
    let image = running.broker.image();
    let topic = image.topic_by_name("checked").unwrap();
    assert_eq!(
        topic.configs.get("retention.ms").map(String::as_str),
        Some("60000")
    );
    running.shutdown().await;
}
