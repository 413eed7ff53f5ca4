"""Retention with a real client (confluent-kafka / librdkafka): sealed
segments past retention.ms are deleted, and a consumer reading from the
earliest offset sees only the retained records, at their original offsets,
also after a restart."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import OffsetSpec

from helpers import admin, create_topic, unique_topic

TIMEOUT = 30
OLD = 5
NEW = 3


def produce_one_by_one(broker, topic: str, values: list[tuple[str, int]]) -> list[int]:
    """One batch per record (flushed each time), so with a tiny
    segment.bytes each record sits in its own segment. Their offsets."""
    p = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 0})
    offsets: list[int] = []

    def done(err, msg):
        assert err is None, err
        offsets.append(msg.offset())

    for value, timestamp in values:
        p.produce(topic, value=value.encode(), partition=0, timestamp=timestamp, on_delivery=done)
        assert p.flush(TIMEOUT) == 0
    return offsets


def earliest(broker, topic: str) -> int:
    tp = TopicPartition(topic, 0)
    a = admin(broker)  # kept alive until the result is in
    return a.list_offsets({tp: OffsetSpec.earliest()}, request_timeout=TIMEOUT)[tp].result(TIMEOUT).offset


def consume_all(broker, topic: str, start: int | None) -> list[tuple[int, bytes]]:
    """Everything from `start` (None: a new group from the earliest offset)
    to the end of the partition."""
    c = Consumer({
        "bootstrap.servers": broker.bootstrap,
        "group.id": unique_topic("retention-group"),
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
    })
    try:
        if start is None:
            c.subscribe([topic])
        else:
            c.assign([TopicPartition(topic, 0, start)])
        got: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    if got:
                        return got
                    continue
                raise AssertionError(m.error())
            got.append((m.offset(), m.value()))
        raise AssertionError(f"timed out; got {got}")
    finally:
        c.close()


def segment_files(broker, topic: str) -> list[str]:
    return sorted(p.name for p in broker.data_files() if topic in str(p) and p.suffix == ".log")


@pytest.mark.broker_overrides({"log.retention.check.interval.ms": "200"})
def test_consumer_from_earliest_sees_only_retained_records(broker):
    if getattr(broker, "kind", "tessera") != "tessera":
        pytest.skip("tessera's data directory is inspected")
    topic = unique_topic("retention")
    create_topic(broker, topic, 1, config={"segment.bytes": "14", "retention.ms": "60000"})
    now = int(time.time() * 1000)
    old = [(f"old-{i}", now - 3_600_000) for i in range(OLD)]
    new = [(f"new-{i}", now) for i in range(NEW)]
    assert produce_one_by_one(broker, topic, old + new) == list(range(OLD + NEW))

    # The old records' segments go; the new ones (the last in the active
    # segment) stay.
    deadline = time.monotonic() + TIMEOUT
    while earliest(broker, topic) != OLD and time.monotonic() < deadline:
        time.sleep(0.2)
    assert earliest(broker, topic) == OLD
    retained = [(OLD + i, f"new-{i}".encode()) for i in range(NEW)]
    deadline = time.monotonic() + TIMEOUT
    while len(segment_files(broker, topic)) != NEW and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(segment_files(broker, topic)) == NEW, segment_files(broker, topic)

    assert consume_all(broker, topic, None) == retained
    # An assignment at offset 0 is out of range: reset to the earliest.
    assert consume_all(broker, topic, 0) == retained

    broker.restart()
    assert earliest(broker, topic) == OLD
    assert consume_all(broker, topic, None) == retained
    assert len(segment_files(broker, topic)) == NEW
