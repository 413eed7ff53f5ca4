"""Admin basics through confluent-kafka's AdminClient and consumer offset APIs."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import ConfigResource, NewTopic, OffsetSpec

from helpers import admin, create_topic, topic_names, unique_topic

TOPIC_CONFIGS = {
    "retention.ms": "3600000",
    "segment.bytes": "1048576",
    "cleanup.policy": "delete",
    "max.message.bytes": "2097152",
    "message.timestamp.type": "CreateTime",
}


def create_error(broker, topic: NewTopic, **kwargs) -> KafkaError | None:
    a = admin(broker)  # keep the client alive until the future resolves
    fs = a.create_topics([topic], operation_timeout=30, request_timeout=30, **kwargs)
    try:
        fs[topic.topic].result(timeout=30)
        return None
    except KafkaException as e:
        return e.args[0]


def assert_error(err: KafkaError | None, code: int):
    assert err is not None, f"expected {KafkaError(code).name()}, the request succeeded"
    assert err.code() == code, f"expected {KafkaError(code).name()}, got {err.name()}: {err.str()}"


def test_create_topic_with_configs(broker):
    topic = unique_topic("cfg")
    assert create_error(broker, NewTopic(topic, 2, 1, config=TOPIC_CONFIGS)) is None
    assert topic in topic_names(admin(broker))


def test_created_configs_are_described(broker):
    topic = unique_topic("cfgd")
    create_topic(broker, topic, 1, config=TOPIC_CONFIGS)
    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    a = admin(broker)
    entries = a.describe_configs([res])[res].result(timeout=30)
    for k, v in TOPIC_CONFIGS.items():
        assert k in entries, f"{k} missing from DescribeConfigs"
        assert entries[k].value == v, f"{k}: {entries[k].value} != {v}"


def test_create_topic_unknown_config_is_invalid_config(broker):
    topic = unique_topic("badcfg")
    err = create_error(broker, NewTopic(topic, 1, 1, config={"no.such.config.key": "1"}))
    assert_error(err, KafkaError.INVALID_CONFIG)
    assert topic not in topic_names(admin(broker))


def test_create_topic_invalid_config_value_is_invalid_config(broker):
    topic = unique_topic("badval")
    err = create_error(broker, NewTopic(topic, 1, 1, config={"retention.ms": "not-a-number"}))
    assert_error(err, KafkaError.INVALID_CONFIG)


def above_broker_count(broker) -> int:
    """A replication factor one above the brokers this test runs against."""
    return len(broker.bootstrap.split(",")) + 1


def test_replication_factor_above_broker_count(broker):
    topic = unique_topic("rf3")
    err = create_error(broker, NewTopic(topic, 1, above_broker_count(broker)))
    assert_error(err, KafkaError.INVALID_REPLICATION_FACTOR)
    assert topic not in topic_names(admin(broker))


@pytest.mark.parametrize("name", ["bad topic", "bad/topic", "..", "x" * 250], ids=["space", "slash", "dotdot", "250-chars"])
def test_invalid_topic_name(broker, name):
    err = create_error(broker, NewTopic(name, 1, 1))
    assert_error(err, KafkaError.TOPIC_EXCEPTION)  # INVALID_TOPIC_EXCEPTION (17)


def test_create_existing_topic(broker):
    topic = unique_topic("dup")
    create_topic(broker, topic, 1)
    assert_error(create_error(broker, NewTopic(topic, 1, 1)), KafkaError.TOPIC_ALREADY_EXISTS)


def test_validate_only_creates_nothing(broker):
    topic = unique_topic("validate")
    assert create_error(broker, NewTopic(topic, 3, 1, config=TOPIC_CONFIGS), validate_only=True) is None
    time.sleep(1)
    assert topic not in topic_names(admin(broker))
    # and validation still reports errors
    err = create_error(broker, NewTopic(topic, 1, above_broker_count(broker)), validate_only=True)
    assert_error(err, KafkaError.INVALID_REPLICATION_FACTOR)
    # the name is still free
    create_topic(broker, topic, 1)


def test_delete_topic(broker):
    topic = unique_topic("del")
    a = admin(broker)
    bytes_before = broker.data_bytes() if broker.persistent else 0
    create_topic(broker, topic, 3)
    payload = bytes(range(256)) * 16  # 4 KiB, incompressible enough
    p = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 5})
    for i in range(2000):  # ~8 MiB
        p.produce(topic, value=payload, key=str(i).encode())
        if i % 200 == 0:
            p.poll(0)
    assert p.flush(60) == 0
    bytes_full = broker.data_bytes() if broker.persistent else 0
    if broker.persistent:
        assert bytes_full - bytes_before > 6 * 2**20, (
            f"data dir grew by only {bytes_full - bytes_before} bytes after ~8 MiB produced"
        )

    a.delete_topics([topic], operation_timeout=30, request_timeout=30)[topic].result(timeout=30)
    deadline = time.monotonic() + 30
    while topic in topic_names(a) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert topic not in topic_names(a), "topic still listed after delete"
    # (no list_topics(topic=...) here: librdkafka may ask for auto-creation,
    # which is on by default and would legitimately bring the topic back)

    # deleting again: UNKNOWN_TOPIC_OR_PART
    with pytest.raises(KafkaException) as ei:
        a.delete_topics([topic], operation_timeout=30)[topic].result(timeout=30)
    assert ei.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART

    if broker.persistent:
        # Its data goes away (Kafka deletes asynchronously: allow some time).
        deadline = time.monotonic() + 75
        while broker.data_bytes() - bytes_before > 2 * 2**20 and time.monotonic() < deadline:
            time.sleep(1)
        left = broker.data_bytes() - bytes_before
        print(f"data dir: {bytes_before} B before, {bytes_full} B full, {bytes_before + left} B after delete")
        assert left <= 2 * 2**20, f"{left} bytes of the deleted topic's data still on disk"

    # the name can be reused, and the new topic is empty
    create_topic(broker, topic, 1)
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "x"})
    try:
        assert c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10, cached=False) == (0, 0)
    finally:
        c.close()


@pytest.mark.broker_overrides({"auto.create.topics.enable": "false"})
def test_produce_to_missing_topic_without_autocreate(broker):
    if not broker.persistent:
        pytest.skip("tansu takes no broker config overrides")
    topic = unique_topic("missing")
    a = admin(broker)
    md = a.list_topics(topic=topic, timeout=10).topics[topic]
    assert md.error is not None and md.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART, md.error

    p = Producer({"bootstrap.servers": broker.bootstrap, "message.timeout.ms": 5000,
                  "topic.metadata.propagation.max.ms": 1000})
    errs = []
    p.produce(topic, value=b"x", on_delivery=lambda err, msg: errs.append(err))
    p.flush(20)
    assert len(errs) == 1 and errs[0] is not None, f"produce to a missing topic succeeded: {errs}"
    # librdkafka reports the broker's UNKNOWN_TOPIC_OR_PART as its local _UNKNOWN_TOPIC
    assert errs[0].code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC), errs[0]
    assert topic not in topic_names(a), "topic was auto-created although auto.create.topics.enable=false"


def test_list_offsets(broker):
    topic = unique_topic("offsets")
    create_topic(broker, topic, 2)
    base = 1_700_000_000_000
    n = 100
    p = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 0})
    for i in range(n):
        # partition 0: timestamps base, base+1000, ...; each produce its own batch
        p.produce(topic, value=f"m{i}".encode(), partition=0, timestamp=base + i * 1000)
        p.flush(10)
    assert p.flush(10) == 0

    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"g-{topic}"})
    try:
        assert c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10, cached=False) == (0, n)
        assert c.get_watermark_offsets(TopicPartition(topic, 1), timeout=10, cached=False) == (0, 0)

        queries = [
            (base - 5, 0),  # before the first record -> first offset
            (base, 0),
            (base + 1, 1),  # first record with timestamp >= query
            (base + 42_000, 42),
            (base + 41_500, 42),
            (base + (n - 1) * 1000, n - 1),
            (base + n * 1000, -1),  # past the last: OFFSET_END (-1)
        ]
        # One query per request: Kafka answers a ListOffsets that names the same
        # partition twice with INVALID_REQUEST.
        for ts, want in queries:
            [tp] = c.offsets_for_times([TopicPartition(topic, 0, ts)], timeout=10)
            assert tp.error is None, f"timestamp {ts}: {tp.error}"
            assert tp.offset == want, f"timestamp {ts}: offset {tp.offset}, expected {want}"
        # both partitions in one request
        res = c.offsets_for_times([TopicPartition(topic, 0, base + 42_000),
                                   TopicPartition(topic, 1, base)], timeout=10)
        assert [(tp.partition, tp.offset) for tp in res] == [(0, 42), (1, -1)]
        # -2 / -1 as "timestamps" are ListOffsets' EARLIEST / LATEST
        for ts, want in [(-2, 0), (-1, n)]:
            [tp] = c.offsets_for_times([TopicPartition(topic, 0, ts)], timeout=10)
            assert tp.offset == want, f"special timestamp {ts}: {tp.offset} != {want}"
    finally:
        c.close()

    # AdminClient.list_offsets (ListOffsets through the admin API)
    a = admin(broker)
    tp = TopicPartition(topic, 0)
    for spec, want in [
        (OffsetSpec.earliest(), 0),
        (OffsetSpec.latest(), n),
        (OffsetSpec.for_timestamp(base + 10_000), 10),
        (OffsetSpec.max_timestamp(), n - 1),
    ]:
        r = a.list_offsets({tp: spec}, request_timeout=10)[tp].result(timeout=10)
        assert r.offset == want, f"{spec}: {r.offset} != {want}"
