"""OffsetForLeaderEpoch (KIP-320) with real consumers.

A consumer that has read records of leader epoch 0 sees the epoch grow
when the topic's range splits (and splits again); before fetching on it
validates its position with OffsetForLeaderEpoch, and a wrong end offset
(below the position) would be reported as log truncation. Both consumers
run with no reset policy (librdkafka ``auto.offset.reset=error``,
kafka-python ``auto_offset_reset='none'``), so a truncation they detect is
an error, not a silent reset. Every record must be read once, at dense
offsets, and the broker must have been asked (its request counter)."""

from __future__ import annotations

import re
import time
import urllib.request

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from helpers import create_topic, unique_topic
from test_elastic_ranges import active_ranges, admin_call

PARTITIONS = 4
PER_ROUND = 300


def ofle_requests(broker) -> int:
    with urllib.request.urlopen(broker.admin_url("/metrics"), timeout=10) as resp:
        text = resp.read().decode()
    m = re.search(r'tessera_requests_total\{api="OffsetForLeaderEpoch"\} (\d+)', text)
    return int(m.group(1)) if m else 0


def produce_round(broker, topic: str, round_no: int) -> None:
    p = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 2})
    errors = []
    for part in range(PARTITIONS):
        for i in range(PER_ROUND):
            p.produce(topic, value=b"%d:%d:%d" % (round_no, part, i), partition=part,
                      on_delivery=lambda err, _m: err and errors.append(err))
    assert p.flush(60) == 0
    assert not errors, errors[:5]


def move_ranges(broker, topic: str) -> None:
    """Split the topic's range, then split the widest child: epochs 1 and 2."""
    (root,) = active_ranges(broker, topic)
    admin_call(broker, "POST", f"/ranges/split?range={root['id']}")
    widest = max(active_ranges(broker, topic), key=lambda r: r["hi"] - r["lo"])
    admin_call(broker, "POST", f"/ranges/split?range={widest['id']}")


def check_dense(seen: dict[int, list[tuple[int, bytes]]], rounds: int) -> None:
    """Every partition read once, in order: offset o holds the value
    produce_round wrote there."""
    for part in range(PARTITIONS):
        want = [(o, b"%d:%d:%d" % (o // PER_ROUND, part, o % PER_ROUND)) for o in range(rounds * PER_ROUND)]
        assert seen[part] == want, f"partition {part}"


def test_confluent_kafka_validates_positions_across_splits(broker):
    topic = unique_topic("epochs-ck")
    create_topic(broker, topic, PARTITIONS)
    produce_round(broker, topic, 0)
    errors: list = []
    c = Consumer({
        "bootstrap.servers": broker.bootstrap,
        "group.id": f"g-{topic}",
        "enable.auto.commit": False,
        "auto.offset.reset": "error",
        "topic.metadata.refresh.interval.ms": 500,
        "error_cb": lambda err: errors.append(err),
    })
    c.assign([TopicPartition(topic, part, 0) for part in range(PARTITIONS)])
    seen: dict[int, list[tuple[int, bytes]]] = {part: [] for part in range(PARTITIONS)}

    def consume_until(total: int, timeout: float = 60) -> None:
        deadline = time.time() + timeout
        while sum(map(len, seen.values())) < total and time.time() < deadline:
            for m in c.consume(num_messages=1000, timeout=0.5):
                if m.error():
                    if m.error().code() != KafkaError._PARTITION_EOF:
                        errors.append(m.error())
                    continue
                seen[m.partition()].append((m.offset(), m.value()))

    consume_until(PARTITIONS * PER_ROUND)
    before = ofle_requests(broker)
    move_ranges(broker, topic)
    produce_round(broker, topic, 1)
    consume_until(2 * PARTITIONS * PER_ROUND)
    c.close()

    assert not errors, errors[:5]
    check_dense(seen, 2)
    assert ofle_requests(broker) > before, "librdkafka never asked OffsetForLeaderEpoch"


def test_kafka_python_validates_positions_across_splits(broker):
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTopicPartition

    topic = unique_topic("epochs-kp")
    create_topic(broker, topic, PARTITIONS)
    produce_round(broker, topic, 0)
    c = KafkaConsumer(
        bootstrap_servers=broker.bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="none",
        metadata_max_age_ms=500,
    )
    tps = [KTopicPartition(topic, part) for part in range(PARTITIONS)]
    c.assign(tps)
    for tp in tps:
        c.seek(tp, 0)
    seen: dict[int, list[tuple[int, bytes]]] = {part: [] for part in range(PARTITIONS)}

    def consume_until(total: int, timeout: float = 60) -> None:
        deadline = time.time() + timeout
        while sum(map(len, seen.values())) < total and time.time() < deadline:
            # A LogTruncationError (a wrong end offset) raises here.
            for tp, records in c.poll(timeout_ms=500).items():
                seen[tp.partition].extend((r.offset, r.value) for r in records)

    consume_until(PARTITIONS * PER_ROUND)
    before = ofle_requests(broker)
    move_ranges(broker, topic)
    produce_round(broker, topic, 1)
    consume_until(2 * PARTITIONS * PER_ROUND)
    # position() validates too: every partition is at its end, validated.
    for tp in tps:
        assert c.position(tp) == 2 * PER_ROUND
    c.close()

    check_dense(seen, 2)
    assert ofle_requests(broker) > before, "kafka-python never asked OffsetForLeaderEpoch"
