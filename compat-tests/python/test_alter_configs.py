"""AlterConfigs and IncrementalAlterConfigs through real clients: confluent-kafka's
AdminClient (alter_configs, incremental_alter_configs) and kafka-python's
KafkaAdminClient (alter_configs, legacy and incremental), on topics and on
dynamic broker configs, checked with DescribeConfigs and with what the broker
then does (a lowered message.max.bytes refuses a batch)."""

from __future__ import annotations

import re

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
)

from helpers import admin, create_topic, unique_topic

TOPIC = ConfigResource.Type.TOPIC
BROKER = ConfigResource.Type.BROKER


def describe(broker, rtype, name) -> dict:
    a = admin(broker)
    res = ConfigResource(rtype, name)
    return a.describe_configs([res])[res].result(timeout=30)


def legacy_alter(broker, rtype, name, configs: dict, validate_only=False) -> KafkaError | None:
    a = admin(broker)
    res = ConfigResource(rtype, name, set_config=configs)
    try:
        a.alter_configs([res], validate_only=validate_only, request_timeout=30)[res].result(timeout=30)
        return None
    except KafkaException as e:
        return e.args[0]


def incremental(broker, rtype, name, ops, validate_only=False) -> KafkaError | None:
    """`ops`: [(key, AlterConfigOpType, value)]."""
    a = admin(broker)
    res = ConfigResource(
        rtype,
        name,
        incremental_configs=[
            ConfigEntry(k, v, incremental_operation=op) for k, op, v in ops
        ],
    )
    try:
        fs = a.incremental_alter_configs([res], validate_only=validate_only, request_timeout=30)
        fs[res].result(timeout=30)
        return None
    except KafkaException as e:
        return e.args[0]


def assert_error(err: KafkaError | None, code: int):
    assert err is not None, f"expected {KafkaError(code).name()}, the request succeeded"
    assert err.code() == code, f"expected {KafkaError(code).name()}, got {err.name()}: {err.str()}"


def value_and_source(entries: dict, key: str):
    e = entries[key]
    return e.value, ConfigSource(e.source)


SET, DELETE, APPEND, SUBTRACT = (
    AlterConfigOpType.SET,
    AlterConfigOpType.DELETE,
    AlterConfigOpType.APPEND,
    AlterConfigOpType.SUBTRACT,
)


# ---- topics: confluent-kafka --------------------------------------------


def test_legacy_alter_configs_replaces_the_topic_set(broker):
    topic = unique_topic("alt")
    create_topic(broker, topic, 1, config={"retention.ms": "3600000", "segment.bytes": "1048576"})
    assert legacy_alter(broker, TOPIC, topic, {"retention.ms": "1000", "cleanup.policy": "compact"}) is None
    entries = describe(broker, TOPIC, topic)
    assert value_and_source(entries, "retention.ms") == ("1000", ConfigSource.DYNAMIC_TOPIC_CONFIG)
    assert value_and_source(entries, "cleanup.policy") == ("compact", ConfigSource.DYNAMIC_TOPIC_CONFIG)
    # Not given: deleted, back to the default.
    assert value_and_source(entries, "segment.bytes") == ("1073741824", ConfigSource.DEFAULT_CONFIG)


def test_incremental_set_delete_append_subtract(broker):
    topic = unique_topic("inc")
    create_topic(broker, topic, 1, config={"segment.bytes": "1048576"})
    assert incremental(broker, TOPIC, topic, [("retention.ms", SET, "5000")]) is None
    entries = describe(broker, TOPIC, topic)
    assert value_and_source(entries, "retention.ms") == ("5000", ConfigSource.DYNAMIC_TOPIC_CONFIG)
    # Untouched keys stay.
    assert entries["segment.bytes"].value == "1048576"

    # APPEND starts from the default (delete).
    assert incremental(broker, TOPIC, topic, [("cleanup.policy", APPEND, "compact")]) is None
    assert describe(broker, TOPIC, topic)["cleanup.policy"].value == "delete,compact"
    assert incremental(broker, TOPIC, topic, [("cleanup.policy", SUBTRACT, "delete")]) is None
    assert describe(broker, TOPIC, topic)["cleanup.policy"].value == "compact"

    assert incremental(
        broker, TOPIC, topic, [("retention.ms", DELETE, None), ("segment.ms", DELETE, None)]
    ) is None
    entries = describe(broker, TOPIC, topic)
    assert value_and_source(entries, "retention.ms") == ("604800000", ConfigSource.DEFAULT_CONFIG)
    assert entries["cleanup.policy"].value == "compact"


def test_validate_only_writes_nothing(broker):
    topic = unique_topic("vo")
    create_topic(broker, topic, 1)
    assert incremental(broker, TOPIC, topic, [("retention.ms", SET, "1234")], validate_only=True) is None
    assert legacy_alter(broker, TOPIC, topic, {"retention.ms": "4321"}, validate_only=True) is None
    assert value_and_source(describe(broker, TOPIC, topic), "retention.ms") == (
        "604800000",
        ConfigSource.DEFAULT_CONFIG,
    )
    # Errors are still reported.
    err = incremental(broker, TOPIC, topic, [("retention.ms", SET, "soon")], validate_only=True)
    assert_error(err, KafkaError.INVALID_CONFIG)


def test_topic_errors(broker):
    topic = unique_topic("err")
    create_topic(broker, topic, 1, config={"retention.ms": "1000"})
    assert_error(incremental(broker, TOPIC, topic, [("no.such.config", SET, "1")]), KafkaError.INVALID_CONFIG)
    err = incremental(broker, TOPIC, topic, [("retention.ms", SET, "not-a-number")])
    assert_error(err, KafkaError.INVALID_CONFIG)
    assert "retention.ms" in err.str()
    assert_error(incremental(broker, TOPIC, topic, [("retention.ms", APPEND, "5")]), KafkaError.INVALID_CONFIG)
    assert_error(incremental(broker, TOPIC, topic, [("cleanup.policy", APPEND, "shred")]), KafkaError.INVALID_CONFIG)
    assert_error(legacy_alter(broker, TOPIC, topic, {"segment.bytes": "1"}), KafkaError.INVALID_CONFIG)
    missing = unique_topic("missing")
    assert_error(incremental(broker, TOPIC, missing, [("retention.ms", SET, "1")]), KafkaError.UNKNOWN_TOPIC_OR_PART)
    assert_error(legacy_alter(broker, TOPIC, missing, {"retention.ms": "1"}), KafkaError.UNKNOWN_TOPIC_OR_PART)
    # Nothing of the failed requests was applied.
    assert describe(broker, TOPIC, topic)["retention.ms"].value == "1000"


# ---- brokers: confluent-kafka -------------------------------------------


def produce_error(broker, topic: str, size: int) -> KafkaError | None:
    p = Producer({"bootstrap.servers": broker.bootstrap, "message.max.bytes": 10_000_000,
                  "linger.ms": 0, "message.send.max.retries": 0})
    errors = []
    p.produce(topic, b"x" * size, on_delivery=lambda err, msg: errors.append(err))
    p.flush(30)
    assert len(errors) == 1
    return errors[0]


def test_dynamic_broker_config_changes_what_the_broker_accepts(broker):
    # Neither client sends the cluster-wide resource (name ""): the Rust wire
    # test (gateway/tests/integration/alter_configs.rs) covers it.
    topic = unique_topic("mmb")
    create_topic(broker, topic, 1)
    assert produce_error(broker, topic, 20_000) is None
    assert incremental(broker, BROKER, "1", [("message.max.bytes", SET, "10000")]) is None
    err = produce_error(broker, topic, 20_000)
    assert err is not None and err.code() == KafkaError.MSG_SIZE_TOO_LARGE, err
    topic_entries = describe(broker, TOPIC, topic)
    assert value_and_source(topic_entries, "max.message.bytes") == (
        "10000",
        ConfigSource.DYNAMIC_BROKER_CONFIG,
    )
    # confluent-kafka keys synonyms by name (the last of a name is kept).
    assert "message.max.bytes" in topic_entries["max.message.bytes"].synonyms
    entries = describe(broker, BROKER, "1")
    mmb = entries["message.max.bytes"]
    assert (mmb.value, ConfigSource(mmb.source)) == ("10000", ConfigSource.DYNAMIC_BROKER_CONFIG)
    assert not mmb.is_read_only
    assert entries["node.id"].is_read_only
    # The topic's own value wins over the broker's.
    assert incremental(broker, TOPIC, topic, [("max.message.bytes", SET, "50000")]) is None
    assert produce_error(broker, topic, 20_000) is None
    assert incremental(broker, TOPIC, topic, [("max.message.bytes", DELETE, None)]) is None
    err = produce_error(broker, topic, 20_000)
    assert err is not None and err.code() == KafkaError.MSG_SIZE_TOO_LARGE, err
    # Deleting the dynamic value falls back on the static default again.
    assert incremental(broker, BROKER, "1", [("message.max.bytes", DELETE, None)]) is None
    assert produce_error(broker, topic, 20_000) is None
    assert value_and_source(describe(broker, BROKER, "1"), "message.max.bytes") == (
        "1048588",
        ConfigSource.DEFAULT_CONFIG,
    )


def test_broker_errors(broker):
    assert_error(incremental(broker, BROKER, "1", [("node.id", SET, "7")]), KafkaError.INVALID_REQUEST)
    assert_error(incremental(broker, BROKER, "1", [("log.retention.ms", SET, "soon")]), KafkaError.INVALID_REQUEST)
    assert_error(incremental(broker, BROKER, "1", [("log.retention.ms", APPEND, "1")]), KafkaError.INVALID_REQUEST)
    assert_error(legacy_alter(broker, BROKER, "1", {"num.partitions": "3"}), KafkaError.INVALID_REQUEST)
    assert incremental(broker, BROKER, "1", [("log.retention.ms", SET, "1000")], validate_only=True) is None
    entries = describe(broker, BROKER, "1")
    assert value_and_source(entries, "log.retention.ms") == ("604800000", ConfigSource.DEFAULT_CONFIG)


def test_configs_survive_a_restart(broker):
    broker.require_persistence()
    topic = unique_topic("keep")
    create_topic(broker, topic, 1)
    assert incremental(broker, TOPIC, topic, [("retention.ms", SET, "777")]) is None
    assert incremental(broker, BROKER, "1", [("log.retention.bytes", SET, "123456")]) is None
    broker.restart()
    entries = describe(broker, TOPIC, topic)
    assert value_and_source(entries, "retention.ms") == ("777", ConfigSource.DYNAMIC_TOPIC_CONFIG)
    assert value_and_source(entries, "retention.bytes") == (
        "123456",
        ConfigSource.DYNAMIC_BROKER_CONFIG,
    )
    assert value_and_source(describe(broker, BROKER, "1"), "log.retention.bytes") == (
        "123456",
        ConfigSource.DYNAMIC_BROKER_CONFIG,
    )


# ---- kafka-python ---------------------------------------------------------


@pytest.fixture
def kp_admin(broker):
    from kafka import KafkaAdminClient

    a = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=30000)
    yield a
    a.close()


def kp_errors(result) -> list[int]:
    """Error codes of a kafka-python alter_configs answer:
    {resource type: {name: error}}, an error printing as "[Error N] ..." (or
    nothing / NoError for success)."""
    codes = []
    for by_name in result.values():
        for err in by_name.values():
            m = re.search(r"\[Error (-?\d+)\]", str(err)) if err is not None else None
            codes.append(int(m.group(1)) if m else getattr(err, "errno", 0) or 0)
    return codes


def test_kafka_python_alter_configs(broker, kp_admin):
    from kafka.admin import ConfigResource as KConfigResource
    from kafka.admin import ConfigResourceType

    topic = unique_topic("kp")
    create_topic(broker, topic, 1, config={"segment.bytes": "1048576"})
    res = KConfigResource(ConfigResourceType.TOPIC, topic, configs={"retention.ms": "2000"})
    result = kp_admin.alter_configs([res], incremental=False)
    assert set(kp_errors(result)) == {0}, result
    entries = describe(broker, TOPIC, topic)
    assert value_and_source(entries, "retention.ms") == ("2000", ConfigSource.DYNAMIC_TOPIC_CONFIG)
    # kafka-python re-sends the other keys the topic sets (read-modify-write),
    # so legacy AlterConfigs keeps them.
    assert entries["segment.bytes"].value == "1048576"

    res = KConfigResource(ConfigResourceType.TOPIC, topic, configs={"cleanup.policy": ("APPEND", "compact")})
    result = kp_admin.alter_configs([res], incremental=True)
    assert set(kp_errors(result)) == {0}, result
    assert describe(broker, TOPIC, topic)["cleanup.policy"].value == "delete,compact"
    assert describe(broker, TOPIC, topic)["retention.ms"].value == "2000"

    res = KConfigResource(ConfigResourceType.TOPIC, topic, configs={"retention.ms": "later"})
    result = kp_admin.alter_configs([res], incremental=False, raise_on_unknown=False)
    assert kp_errors(result) == [KafkaError.INVALID_CONFIG], result


# ---- Kafka's other dynamic broker keys, on a 3-node cluster ---------------

from types import SimpleNamespace  # noqa: E402

from test_cluster import cluster, eventually  # noqa: E402,F401 - the 3-node cluster fixture


def test_kafkas_dynamic_broker_keys_are_accepted_stored_and_described_on_a_cluster(cluster):
    """librdkafka's admin test sets `sasl.kerberos.min.time.before.relogin` on
    a broker; Kafka accepts every key of its dynamic broker set
    (`DynamicBrokerConfig`), checked by type, and describes it with its
    source. Tessera stores them (inert where it has no use for them, as the
    documentation field says); secrets are described as sensitive, with no
    value. Before: INVALID_REQUEST "Unknown broker config"."""
    b = SimpleNamespace(bootstrap=",".join(cluster["bootstrap"]))
    assert incremental(b, BROKER, "2", [("sasl.kerberos.min.time.before.relogin", SET, "70000")]) is None
    assert legacy_alter(b, BROKER, "3", {
        "num.io.threads": "4",
        "listener.name.plaintext.sasl.jaas.config": "org.example.Login required;",
    }) is None

    def described(node, key, value):
        entry = describe(b, BROKER, node).get(key)
        return entry is not None and entry.value == value and entry

    relogin = eventually("node 2 describes the relogin key",
                         lambda: described("2", "sasl.kerberos.min.time.before.relogin", "70000"))
    assert ConfigSource(relogin.source) == ConfigSource.DYNAMIC_BROKER_CONFIG
    assert not relogin.is_read_only and not relogin.is_sensitive
    io = eventually("node 3 describes num.io.threads", lambda: described("3", "num.io.threads", "4"))
    assert ConfigSource(io.source) == ConfigSource.DYNAMIC_BROKER_CONFIG
    jaas = describe(b, BROKER, "3")["listener.name.plaintext.sasl.jaas.config"]
    assert jaas.is_sensitive and jaas.value is None, "a secret is never shown"
    # Node 2's own value; node 1 still has the default.
    assert value_and_source(describe(b, BROKER, "1"), "sasl.kerberos.min.time.before.relogin") == (
        "60000",
        ConfigSource.DEFAULT_CONFIG,
    )
    # Checked by type, as Kafka does: INVALID_REQUEST for broker configs.
    assert_error(incremental(b, BROKER, "2", [("sasl.kerberos.min.time.before.relogin", SET, "soon")]),
                 KafkaError.INVALID_REQUEST)
    assert_error(incremental(b, BROKER, "2", [("num.io.threads", SET, "0")]), KafkaError.INVALID_REQUEST)

    # kafka-python, incremental, on node 1.
    from kafka import KafkaAdminClient
    from kafka.admin import ConfigResource as KConfigResource
    from kafka.admin import ConfigResourceType

    kp = KafkaAdminClient(bootstrap_servers=b.bootstrap, request_timeout_ms=30000)
    try:
        res = KConfigResource(ConfigResourceType.BROKER, "1",
                              configs={"transaction.partition.verification.enable": ("SET", "false")})
        result = kp.alter_configs([res], incremental=True)
        assert set(kp_errors(result)) == {0}, result
    finally:
        kp.close()
    eventually("node 1 describes the verification key",
               lambda: described("1", "transaction.partition.verification.enable", "false"))
