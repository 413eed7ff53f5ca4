"""Where a consumer starts and what it subscribes to, as a Kafka user relies
on it, with real clients (confluent-kafka / librdkafka):

- `auto.offset.reset=latest`: a new group starts at the log end (only what
  is produced after it joined is read), and a position past the log end
  (out of range) is reset to the log end, not to the beginning;
- a regex subscription (`^prefix-.*`) picks up a topic created after the
  consumer subscribed, once its metadata refresh sees it.
"""

from __future__ import annotations

import time

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from helpers import create_topic, unique_topic


def produce(bootstrap: str, topic: str, values: list[bytes]) -> list[int]:
    """Produces `values` to partition 0; returns their offsets."""
    offsets: list[int] = []
    errors: list = []
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0})

    def cb(err, msg):
        if err is not None:
            errors.append(err)
        else:
            offsets.append(msg.offset())

    for v in values:
        p.produce(topic, value=v, partition=0, on_delivery=cb)
    assert p.flush(30) == 0
    assert errors == [], errors
    return sorted(offsets)


def poll_values(c: Consumer, want: int, timeout: float = 30.0) -> list[tuple[str, int, bytes]]:
    """Polls until `want` records came (a message error fails the test)."""
    got: list[tuple[str, int, bytes]] = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is None:
            continue
        if m.error():
            assert m.error().code() == KafkaError._PARTITION_EOF, m.error()
            continue
        got.append((m.topic(), m.offset(), m.value()))
    return got


def wait_eof(c: Consumer, timeout: float = 30.0) -> None:
    """Polls until the consumer reports reaching the partition's end (its
    position is resolved and fetched up to the log end); no record may come
    before."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = c.poll(0.2)
        if m is None:
            continue
        assert m.error(), f"read offset {m.offset()} ({m.value()!r}) before anything new was produced"
        if m.error().code() == KafkaError._PARTITION_EOF:
            return
        raise AssertionError(m.error())
    raise AssertionError("never reached the partition's end")


def latest_consumer(broker, group: str) -> Consumer:
    """A consumer of a new group with `auto.offset.reset=latest` that reports
    reaching a partition's end."""
    return Consumer({"bootstrap.servers": broker.bootstrap, "group.id": unique_topic(group),
                     "auto.offset.reset": "latest", "enable.auto.commit": False,
                     "enable.partition.eof": True})


def test_latest_reset_starts_a_new_group_at_the_log_end(broker):
    topic = unique_topic("latest")
    create_topic(broker, topic, partitions=1)
    produce(broker.bootstrap, topic, [f"old-{i}".encode() for i in range(20)])
    c = latest_consumer(broker, "g-latest")
    try:
        c.subscribe([topic])
        # The position resolves to the log end and the fetch reaches it
        # without a record: what follows is "after joining".
        wait_eof(c)
        offsets = produce(broker.bootstrap, topic, [f"new-{i}".encode() for i in range(5)])
        got = poll_values(c, 5)
        assert [(o, v) for _, o, v in got] == list(zip(offsets, [f"new-{i}".encode() for i in range(5)]))
        assert offsets == list(range(20, 25))
    finally:
        c.close()


def test_latest_reset_moves_an_out_of_range_position_to_the_log_end(broker):
    topic = unique_topic("oor")
    create_topic(broker, topic, partitions=1)
    produce(broker.bootstrap, topic, [f"old-{i}".encode() for i in range(10)])
    c = latest_consumer(broker, "g-oor")
    try:
        # Offset 1000 is past the log end (10): the fetch gets
        # OFFSET_OUT_OF_RANGE and the reset policy moves the position to
        # the log end (no old record is read: not earliest).
        c.assign([TopicPartition(topic, 0, 1000)])
        wait_eof(c)
        offsets = produce(broker.bootstrap, topic, [b"after-reset"])
        got = poll_values(c, 1)
        assert [(o, v) for _, o, v in got] == [(offsets[0], b"after-reset")]
        assert offsets == [10]
    finally:
        c.close()


def test_regex_subscription_picks_up_a_topic_created_later(broker):
    prefix = unique_topic("rx")
    first = f"{prefix}-a"
    create_topic(broker, first, partitions=1)
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": unique_topic("g-rx"),
                  "auto.offset.reset": "earliest", "enable.auto.commit": False,
                  "topic.metadata.refresh.interval.ms": 1000})
    try:
        c.subscribe([f"^{prefix}-.*"])
        produce(broker.bootstrap, first, [b"in-a"])
        assert [(t, v) for t, _, v in poll_values(c, 1)] == [(first, b"in-a")]
        # Committed, so the rebalance the new topic causes resumes after it.
        c.commit(asynchronous=False)
        # A topic created after the subscription, matching it; and one
        # that does not match, which must never be read.
        later = f"{prefix}-b"
        other = unique_topic("rx-other")
        create_topic(broker, later, partitions=1)
        create_topic(broker, other, partitions=1)
        produce(broker.bootstrap, other, [b"not-for-this-consumer"])
        produce(broker.bootstrap, later, [b"in-b"])
        got = poll_values(c, 1, timeout=60)
        assert [(t, o, v) for t, o, v in got] == [(later, 0, b"in-b")], got
        assert {tp.topic for tp in c.assignment()} == {first, later}
        # Nothing else arrives (the non-matching topic stays unread).
        assert poll_values(c, 1, timeout=3) == []
    finally:
        c.close()
