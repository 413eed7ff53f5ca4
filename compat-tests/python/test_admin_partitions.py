"""CreatePartitions, DeleteRecords and the other admin APIs of issue 8 with
real admin clients: confluent-kafka's AdminClient (librdkafka) and
kafka-python's KafkaAdminClient, plus consumers subscribed by topic and by
regular expression that must pick up new partitions on a metadata refresh."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import (
    Consumer,
    ElectionType,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import NewPartitions, OffsetSpec

from helpers import admin, create_topic, unique_topic, wait_topic
from test_cluster import cluster  # noqa: F401 - the 3-node cluster fixture

TIMEOUT = 30


def produce(broker, topic: str, partition: int, n: int, prefix: str = "m") -> list[int]:
    """Produces n records to one partition; their offsets."""
    p = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 5})
    offsets: list[int] = []
    errors: list = []

    def done(err, msg):
        if err is not None:
            errors.append(err)
        else:
            offsets.append(msg.offset())

    for i in range(n):
        p.produce(topic, value=f"{prefix}-{partition}-{i}".encode(), partition=partition, on_delivery=done)
    assert p.flush(TIMEOUT) == 0
    assert not errors, errors
    return sorted(offsets)


def offsets(broker, topic: str, partition: int) -> tuple[int, int]:
    """(earliest, latest) through ListOffsets."""
    a = admin(broker)
    tp = TopicPartition(topic, partition)
    earliest = a.list_offsets({tp: OffsetSpec.earliest()}, request_timeout=TIMEOUT)[tp].result(TIMEOUT)
    latest = a.list_offsets({tp: OffsetSpec.latest()}, request_timeout=TIMEOUT)[tp].result(TIMEOUT)
    return earliest.offset, latest.offset


def create_partitions_error(broker, topic: str, count: int, **kwargs) -> KafkaError | None:
    a = admin(broker)
    fs = a.create_partitions([NewPartitions(topic, count)], operation_timeout=TIMEOUT,
                             request_timeout=TIMEOUT, **kwargs)
    try:
        fs[topic].result(timeout=TIMEOUT)
        return None
    except KafkaException as e:
        return e.args[0]


def partition_count(broker, topic: str) -> int:
    md = admin(broker).list_topics(topic=topic, timeout=10)
    return len(md.topics[topic].partitions)


def consume_values(consumer: Consumer, wanted: int, timeout: float = 60) -> dict[int, list[tuple[int, bytes]]]:
    got: dict[int, list[tuple[int, bytes]]] = {}
    n = 0
    deadline = time.monotonic() + timeout
    while n < wanted and time.monotonic() < deadline:
        m = consumer.poll(0.5)
        if m is None:
            continue
        if m.error():
            if m.error().code() == KafkaError._PARTITION_EOF:
                continue
            raise AssertionError(f"consumer error: {m.error()}")
        got.setdefault(m.partition(), []).append((m.offset(), m.value()))
        n += 1
    return got


# ---- confluent-kafka (librdkafka) -------------------------------------------


def test_confluent_create_partitions(broker):
    topic = unique_topic("grow")
    create_topic(broker, topic, 2)
    for p in range(2):
        assert produce(broker, topic, p, 3) == [0, 1, 2]

    # validate_only: accepted, nothing changes.
    assert create_partitions_error(broker, topic, 5, validate_only=True) is None
    time.sleep(0.5)
    assert partition_count(broker, topic) == 2

    # Kafka's refusals.
    err = create_partitions_error(broker, topic, 2)
    assert err is not None and err.code() == KafkaError.INVALID_PARTITIONS, err
    assert "already has 2 partition(s)" in err.str()
    err = create_partitions_error(broker, topic, 1)
    assert err is not None and err.code() == KafkaError.INVALID_PARTITIONS, err
    assert "would not be an increase" in err.str()
    err = create_partitions_error(broker, unique_topic("missing"), 3)
    assert err is not None and err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART, err

    # Grow to 5: new partitions from offset 0, old ones untouched.
    assert create_partitions_error(broker, topic, 5) is None
    wait_topic(admin(broker), topic, 5)
    for p in range(2, 5):
        assert offsets(broker, topic, p) == (0, 0)
        assert produce(broker, topic, p, 2, prefix="new") == [0, 1]
    for p in range(2):
        assert offsets(broker, topic, p) == (0, 3)
        assert produce(broker, topic, p, 1, prefix="after") == [3]

    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": unique_topic("g"),
                  "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(5)])
        got = consume_values(c, 2 * 4 + 2 * 3)
    finally:
        c.close()
    for p in range(2, 5):
        assert got[p] == [(0, f"new-{p}-0".encode()), (1, f"new-{p}-1".encode())]
    for p in range(2):
        assert [o for o, _ in got[p]] == [0, 1, 2, 3]
        assert got[p][0][1] == f"m-{p}-0".encode()

    # Both survive a restart.
    broker.restart()
    wait_topic(admin(broker), topic, 5)
    assert offsets(broker, topic, 4) == (0, 2)
    assert produce(broker, topic, 4, 1) == [2]


def test_confluent_delete_records(broker):
    topic = unique_topic("del")
    create_topic(broker, topic, 2)
    assert produce(broker, topic, 0, 10) == list(range(10))
    produce(broker, topic, 1, 4)
    a = admin(broker)

    fs = a.delete_records([TopicPartition(topic, 0, 4)], request_timeout=TIMEOUT, operation_timeout=TIMEOUT)
    [(tp, f)] = fs.items()
    result = f.result(TIMEOUT)
    assert result.low_watermark == 4, result
    assert offsets(broker, topic, 0) == (4, 10)

    # OFFSET_END (-1) means the high watermark.
    fs = a.delete_records([TopicPartition(topic, 1, -1)], request_timeout=TIMEOUT, operation_timeout=TIMEOUT)
    assert next(iter(fs.values())).result(TIMEOUT).low_watermark == 4
    assert offsets(broker, topic, 1) == (4, 4)

    # Above the high watermark.
    fs = a.delete_records([TopicPartition(topic, 0, 11)], request_timeout=TIMEOUT, operation_timeout=TIMEOUT)
    with pytest.raises(KafkaException) as e:
        next(iter(fs.values())).result(TIMEOUT)
    assert e.value.args[0].code() == KafkaError.OFFSET_OUT_OF_RANGE

    # A consumer positioned below the start is reset to it (earliest).
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": unique_topic("g"),
                  "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        c.assign([TopicPartition(topic, 0, 1)])
        got = consume_values(c, 6)
    finally:
        c.close()
    assert [o for o, _ in got[0]] == list(range(4, 10))

    broker.restart()
    assert offsets(broker, topic, 0) == (4, 10)
    assert offsets(broker, topic, 1) == (4, 4)


def test_confluent_elect_leaders_is_not_needed(broker):
    topic = unique_topic("elect")
    create_topic(broker, topic, 2)
    a = admin(broker)
    # (this binding refuses the timeout keyword arguments)
    f = a.elect_leaders(ElectionType.PREFERRED, [TopicPartition(topic, 0), TopicPartition(topic, 1)])
    results = f.result(TIMEOUT)
    assert len(results) == 2
    for tp, err in results.items():
        assert err is not None and err.code() == KafkaError.ELECTION_NOT_NEEDED, (tp, err)


@pytest.mark.parametrize("by", ["topic", "regex", "topic-kip848"])
def test_confluent_subscriber_sees_new_partitions(broker, by):
    prefix = unique_topic("sub")
    topic = f"{prefix}-t"
    create_topic(broker, topic, 1)
    conf = {"bootstrap.servers": broker.bootstrap, "group.id": unique_topic("g"),
            "enable.auto.commit": False, "auto.offset.reset": "earliest",
            "topic.metadata.refresh.interval.ms": 1000}
    if by == "topic-kip848":
        # The coordinator's assignor sees the new count in its subscription
        # metadata and bumps the group epoch.
        conf["group.protocol"] = "consumer"
    c = Consumer(conf)
    try:
        c.subscribe([f"^{prefix}-.*" if by == "regex" else topic])
        produce(broker, topic, 0, 1)
        assert consume_values(c, 1)[0] == [(0, b"m-0-0")]
        # The rebalance the new partitions cause restarts from committed offsets.
        c.commit(asynchronous=False)
        assert create_partitions_error(broker, topic, 3) is None
        wait_topic(admin(broker), topic, 3)
        for p in (1, 2):
            produce(broker, topic, p, 2)
        got = consume_values(c, 4)
        assert sorted(got) == [1, 2], got
        assert all([o for o, _ in v] == [0, 1] for v in got.values()), got
        assert {tp.partition for tp in c.assignment()} == {0, 1, 2}
    finally:
        c.close()


# ---- kafka-python ------------------------------------------------------------


def kafka_python_admin(broker):
    from kafka.admin import KafkaAdminClient

    return KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=TIMEOUT * 1000)


def test_kafka_python_create_partitions_and_delete_records(broker):
    from kafka import TopicPartition as KTopicPartition
    from kafka.admin import NewPartitions as KNewPartitions
    from kafka.errors import InvalidPartitionsError, OffsetOutOfRangeError

    topic = unique_topic("kp")
    create_topic(broker, topic, 1)
    produce(broker, topic, 0, 6)
    a = kafka_python_admin(broker)
    try:
        a.create_partitions({topic: KNewPartitions(3)}, validate_only=True)
        assert partition_count(broker, topic) == 1
        a.create_partitions({topic: KNewPartitions(3)})
        wait_topic(admin(broker), topic, 3)
        with pytest.raises(InvalidPartitionsError):
            a.create_partitions({topic: KNewPartitions(2)})
        assert produce(broker, topic, 2, 2) == [0, 1]

        result = a.delete_records({KTopicPartition(topic, 0): 3})
        [(tp, info)] = list(result.items())
        assert tp.partition == 0
        low = info["low_watermark"] if isinstance(info, dict) else getattr(info, "low_watermark", info)
        assert low == 3, info
        assert offsets(broker, topic, 0) == (3, 6)
        with pytest.raises(OffsetOutOfRangeError):
            a.delete_records({KTopicPartition(topic, 2): 5})

        dirs = a.describe_log_dirs()
        text = repr(dirs)
        assert topic in text, text

        reassignments = a.list_partition_reassignments()
        assert not reassignments, reassignments
    finally:
        a.close()


def test_kafka_python_pattern_subscriber_sees_new_partitions(broker):
    from kafka import KafkaConsumer

    prefix = unique_topic("kpsub")
    topic = f"{prefix}-t"
    create_topic(broker, topic, 1)
    produce(broker, topic, 0, 1)
    c = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=unique_topic("g"),
                      enable_auto_commit=False, auto_offset_reset="earliest",
                      metadata_max_age_ms=1000)
    try:
        c.subscribe(pattern=f"^{prefix}-.*")
        seen: dict[int, list[int]] = {}

        def poll_until(n: int):
            deadline = time.monotonic() + 60
            while sum(len(v) for v in seen.values()) < n and time.monotonic() < deadline:
                for tp, recs in c.poll(timeout_ms=500).items():
                    seen.setdefault(tp.partition, []).extend(r.offset for r in recs)

        poll_until(1)
        assert seen == {0: [0]}
        assert create_partitions_error(broker, topic, 3) is None
        for p in (1, 2):
            produce(broker, topic, p, 2)
        poll_until(5)
        assert seen == {0: [0], 1: [0, 1], 2: [0, 1]}, seen
    finally:
        c.close()


# ---- a 3-node cluster ---------------------------------------------------------


def test_cluster_create_partitions_and_delete_records_off_the_leader(cluster):
    """CreatePartitions sent to any node grows the topic on every node; the
    new range is placed on a live broker and serves from offset 0. A
    DeleteRecords sent to a node that does not lead the partition is
    NOT_LEADER_OR_FOLLOWER; sent to the leader it moves the start, and every
    node's ListOffsets agrees."""
    from kafka import TopicPartition as KTopicPartition
    from kafka.admin import KafkaAdminClient
    from kafka.errors import NotLeaderForPartitionError

    from test_cluster import create, eventually  # noqa: F811

    boot = cluster["bootstrap"]
    topic = unique_topic("cl")
    create(boot[0], topic, 2)
    a = admin(type("B", (), {"bootstrap": boot[2]})())
    fs = a.create_partitions([NewPartitions(topic, 4)], request_timeout=TIMEOUT, operation_timeout=TIMEOUT)
    fs[topic].result(TIMEOUT)
    for b in boot:
        eventually(
            f"4 led partitions seen from {b}",
            lambda b=b: (t := admin(type("B", (), {"bootstrap": b})()).list_topics(topic, timeout=10).topics[topic])
            and len(t.partitions) == 4
            and all(p.leader > 0 for p in t.partitions.values()),
        )
    md = a.list_topics(topic, timeout=10).topics[topic]
    leaders = {p: md.partitions[p].leader for p in range(4)}

    any_node = type("B", (), {"bootstrap": ",".join(boot)})()
    for p in range(4):
        assert produce(any_node, topic, p, 5) == [0, 1, 2, 3, 4]

    p = 3
    other = next(n for n in (1, 2, 3) if n != leaders[p])
    k = KafkaAdminClient(bootstrap_servers=",".join(boot), request_timeout_ms=TIMEOUT * 1000)
    try:
        with pytest.raises(NotLeaderForPartitionError):
            k.delete_records({KTopicPartition(topic, p): 2}, partition_leader_id=other)
        k.delete_records({KTopicPartition(topic, p): 2}, partition_leader_id=leaders[p])
    finally:
        k.close()
    for b in boot:
        assert offsets(type("B", (), {"bootstrap": b})(), topic, p) == (2, 5)


def test_cluster_manual_replica_assignments_are_followed(cluster):
    """CreateTopics and CreatePartitions with a replica list per partition
    (librdkafka's admin test does both, alternating [1,2,3] and [3,2,1]):
    Metadata on every node reports each partition on its list in the
    client's order, led by its first broker (Kafka's preferred leader), and
    every partition takes records."""
    from confluent_kafka.admin import NewTopic

    from test_cluster import eventually  # noqa: F811

    boot = cluster["bootstrap"]
    topic = unique_topic("assigned")
    forward, backward = [1, 2, 3], [3, 2, 1]
    lists = [forward if p % 2 == 0 else backward for p in range(5)]
    a = admin(type("B", (), {"bootstrap": boot[1]})())
    a.create_topics([NewTopic(topic, 3, replica_assignment=lists[:3])],
                    request_timeout=TIMEOUT)[topic].result(TIMEOUT)
    a.create_partitions([NewPartitions(topic, 5, replica_assignment=lists[3:])],
                        request_timeout=TIMEOUT)[topic].result(TIMEOUT)

    def as_asked(b):
        md = admin(type("B", (), {"bootstrap": b})()).list_topics(topic, timeout=10).topics[topic]
        got = {p: (list(m.replicas), m.leader) for p, m in md.partitions.items()}
        return got == {p: (lists[p], lists[p][0]) for p in range(5)} or got

    for b in boot:
        eventually(f"the assignments as asked, seen from {b}", lambda b=b: as_asked(b) is True)
    any_node = type("B", (), {"bootstrap": ",".join(boot)})()
    for p in range(5):
        assert produce(any_node, topic, p, 3) == [0, 1, 2]
