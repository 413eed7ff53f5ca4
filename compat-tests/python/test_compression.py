"""Broker-side compression.type with real clients: a topic that names a
codec stores every batch in it (tessera recompresses what the producer
sent), and confluent-kafka and kafka-python consumers read the records
back unchanged. The stored codec itself is checked in
gateway/tests/integration/compression.rs."""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from kafka import KafkaConsumer

from helpers import create_topic, unique_topic

N = 500


def produce(broker, topic: str, producer_codec: str) -> list[tuple[bytes, bytes]]:
    p = Producer({"bootstrap.servers": broker.bootstrap, "compression.type": producer_codec,
                  "enable.idempotence": True, "linger.ms": 20})
    sent = [(f"k{i}".encode(), f"value-{i}-".encode() * 10) for i in range(N)]
    for k, v in sent:
        p.produce(topic, key=k, value=v, headers=[("h", k)])
    assert p.flush(30) == 0
    return sent


def consume(broker, topic: str) -> list[tuple[bytes, bytes]]:
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": unique_topic("g"),
                  "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    got = []
    try:
        for _ in range(200):
            if len(got) >= N:
                break
            for m in c.consume(N, 0.5):
                assert m.error() is None, m.error()
                assert m.headers() == [("h", m.key())]
                got.append((m.key(), m.value()))
    finally:
        c.close()
    return got


@pytest.mark.parametrize("topic_codec,producer_codec", [
    ("zstd", "none"), ("gzip", "lz4"), ("snappy", "zstd"), ("lz4", "gzip"),
    ("uncompressed", "snappy"), ("producer", "zstd"),
])
def test_records_survive_the_topic_codec(broker, topic_codec, producer_codec):
    topic = unique_topic(f"codec-{topic_codec}")
    create_topic(broker, topic, 1, config={"compression.type": topic_codec})
    sent = produce(broker, topic, producer_codec)
    assert consume(broker, topic) == sent


def test_kafka_python_reads_a_gzip_topic(broker):
    topic = unique_topic("codec-kp")
    create_topic(broker, topic, 1, config={"compression.type": "gzip"})
    sent = produce(broker, topic, "none")
    c = KafkaConsumer(topic, bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest",
                      consumer_timeout_ms=10000, enable_auto_commit=False)
    got = [(m.key, m.value) for m in c]
    c.close()
    assert got == sent
