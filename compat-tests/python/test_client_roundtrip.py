"""confluent-kafka (librdkafka) and kafka-python each produce 100,000 keyed
records with headers and explicit timestamps, per compression codec, and
consume them back identical, in order, at the offsets the producer's delivery
reports gave."""

from __future__ import annotations

import json
import time
from collections import defaultdict

import pytest

from helpers import create_topic, unique_topic

N_RECORDS = 100_000
PARTITIONS = 3
BASE_TS = 1_700_000_000_000  # ms, fixed so timestamps are explicit, not "now"
CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]


def make_record(i: int):
    key = f"key-{i:06d}".encode()
    # values vary in length and content, and compress (as real payloads do)
    value = (f"value-{i:06d}|" + "abcdefghij" * (i % 13) + f"|{i * 7919 % 100003}").encode()
    headers = [("idx", str(i).encode()), ("kind", b"compat"), ("empty", b"")]
    if i % 10 == 0:
        headers.append(("dup", b"1"))
        headers.append(("dup", b"2"))  # repeated header keys are legal and ordered
    ts = BASE_TS + i
    return key, value, headers, ts


def check_roundtrip(sent: dict, delivered: list, consumed: dict, client_info: str = ""):
    """sent: i -> (key, value, headers, ts); delivered: list of (i, partition,
    offset) in send order; consumed: partition -> list of (offset, key, value,
    headers, ts, ts_type_is_create). client_info is appended to ordering
    failures (e.g. the producer's retry counters)."""
    assert len(delivered) == N_RECORDS, f"{len(delivered)} delivery reports, expected {N_RECORDS}"
    by_part: dict[int, list] = defaultdict(list)
    for i, p, o in delivered:
        by_part[p].append((o, i))
    assert set(by_part) <= set(range(PARTITIONS))
    for p, lst in by_part.items():
        lst.sort()
        offsets = [o for o, _ in lst]
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets))), (
            f"partition {p}: delivery-report offsets are not dense"
        )
        assert offsets[0] == 0, f"partition {p}: first offset {offsets[0]} (fresh topic)"
        # in order: within a partition, offsets follow send order
        inversions = [(lst[k], lst[k + 1]) for k in range(len(lst) - 1) if lst[k + 1][1] < lst[k][1]]
        assert not inversions, (
            f"partition {p}: offsets do not follow send order: {len(inversions)} inversions, first: "
            + ", ".join(f"record {a[1]} at offset {a[0]} but record {b[1]} at offset {b[0]}"
                        for a, b in inversions[:3])
            + (f" [{client_info}]" if client_info else "")
        )

        got = consumed.get(p, [])
        assert len(got) == len(lst), f"partition {p}: consumed {len(got)}, delivered {len(lst)}"
        for (o_exp, i), (o, key, value, headers, ts, create_time) in zip(lst, got):
            k_exp, v_exp, h_exp, ts_exp = sent[i]
            assert o == o_exp, f"partition {p}: record {i} at offset {o}, delivered at {o_exp}"
            assert key == k_exp, f"p{p}@{o}: key {key!r} != {k_exp!r}"
            assert value == v_exp, f"p{p}@{o}: value {value!r} != {v_exp!r}"
            assert headers == h_exp, f"p{p}@{o}: headers {headers!r} != {h_exp!r}"
            assert ts == ts_exp, f"p{p}@{o}: timestamp {ts} != {ts_exp}"
            assert create_time, f"p{p}@{o}: timestamp type is not CreateTime"


# --------------------------------------------------------------------------
# confluent-kafka
# --------------------------------------------------------------------------

def confluent_produce(bootstrap: str, topic: str, codec: str):
    from confluent_kafka import Producer

    stats: dict = {}
    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "compression.type": codec,
            "acks": "all",
            "linger.ms": 20,
            "batch.num.messages": 5000,
            "queue.buffering.max.messages": 200_000,
            "statistics.interval.ms": 500,
            "stats_cb": lambda js: stats.update(json.loads(js)),
        }
    )
    sent, delivered, errors = {}, [], []

    def make_cb(i):
        def cb(err, msg):
            if err is not None:
                errors.append((i, err))
            else:
                delivered.append((i, msg.partition(), msg.offset()))
        return cb

    for i in range(N_RECORDS):
        key, value, headers, ts = make_record(i)
        sent[i] = (key, value, headers, ts)
        while True:
            try:
                p.produce(topic, value=value, key=key, headers=headers, timestamp=ts,
                          on_delivery=make_cb(i))
                break
            except BufferError:
                p.poll(0.05)
        if i % 1000 == 0:
            p.poll(0)
    remaining = p.flush(120)
    assert remaining == 0, f"{remaining} records not delivered after 120 s"
    p.poll(0.6)  # one more statistics callback after the last delivery
    brokers = [b for b in stats.get("brokers", {}).values() if b.get("nodeid", -1) >= 0]
    info = "librdkafka producer stats: " + ", ".join(
        f"{k}={sum(b.get(k, 0) for b in brokers)}"
        for k in ("txretries", "txerrs", "req_timeouts", "connects", "disconnects")
    )
    assert not errors, f"{len(errors)} delivery errors, first: {errors[:5]}; {info}"
    return sent, sorted(delivered), info


def confluent_consume(bootstrap: str, topic: str, expected_per_part: dict[int, int]):
    from confluent_kafka import TIMESTAMP_CREATE_TIME, Consumer, TopicPartition

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"compat-{topic}",
            "enable.auto.commit": False,
            "auto.offset.reset": "error",
            "enable.partition.eof": False,
        }
    )
    c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    consumed: dict[int, list] = defaultdict(list)
    total = sum(expected_per_part.values())
    n = 0
    deadline = time.monotonic() + 120
    try:
        while n < total and time.monotonic() < deadline:
            for m in c.consume(num_messages=5000, timeout=1.0):
                if m.error():
                    raise AssertionError(f"consumer error: {m.error()}")
                ts_type, ts = m.timestamp()
                consumed[m.partition()].append(
                    (m.offset(), m.key(), m.value(), m.headers() or [], ts,
                     ts_type == TIMESTAMP_CREATE_TIME)
                )
                n += 1
        # anything beyond what was produced would be a bug too: give it a moment
        for m in c.consume(num_messages=100, timeout=0.5):
            if not m.error():
                consumed[m.partition()].append((m.offset(), m.key(), m.value(), m.headers(), None, None))
    finally:
        c.close()
    return consumed


@pytest.mark.parametrize("codec", CODECS)
def test_confluent_kafka_roundtrip(broker, codec):
    topic = unique_topic(f"ck-{codec}")
    create_topic(broker, topic, partitions=PARTITIONS)
    t0 = time.monotonic()
    sent, delivered, info = confluent_produce(broker.bootstrap, topic, codec)
    t1 = time.monotonic()
    per_part = defaultdict(int)
    for _, p, _ in delivered:
        per_part[p] += 1
    delivered.sort(key=lambda d: d[0])
    consumed = confluent_consume(broker.bootstrap, topic, per_part)
    t2 = time.monotonic()
    print(f"confluent-kafka {codec}: produce {t1 - t0:.1f}s, consume {t2 - t1:.1f}s, "
          f"per partition {dict(per_part)}; {info}")
    check_roundtrip(sent, delivered, consumed, info)


# --------------------------------------------------------------------------
# kafka-python
# --------------------------------------------------------------------------

def kafka_python_produce(bootstrap: str, topic: str, codec: str):
    from kafka import KafkaProducer

    p = KafkaProducer(
        bootstrap_servers=bootstrap,
        compression_type=None if codec == "none" else codec,
        acks="all",
        linger_ms=20,
        batch_size=256 * 1024,
    )
    sent, futures = {}, []
    try:
        for i in range(N_RECORDS):
            key, value, headers, ts = make_record(i)
            sent[i] = (key, value, headers, ts)
            futures.append(p.send(topic, key=key, value=value, headers=headers, timestamp_ms=ts))
        p.flush(timeout=180)
        delivered = []
        for i, f in enumerate(futures):
            md = f.get(timeout=60)  # raises the client's error if delivery failed
            delivered.append((i, md.partition, md.offset))
    finally:
        p.close(timeout=10)
    return sent, delivered


def kafka_python_consume(bootstrap: str, topic: str, expected_per_part: dict[int, int]):
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="none",
        max_poll_records=5000,
        fetch_max_bytes=16 * 1024 * 1024,
    )
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    c.assign(tps)
    for tp in tps:
        c.seek(tp, 0)
    consumed: dict[int, list] = defaultdict(list)
    total = sum(expected_per_part.values())
    n = 0
    deadline = time.monotonic() + 150
    try:
        while n < total and time.monotonic() < deadline:
            for tp, recs in c.poll(timeout_ms=1000).items():
                for r in recs:
                    consumed[tp.partition].append(
                        (r.offset, r.key, r.value, list(r.headers or []), r.timestamp,
                         r.timestamp_type == 0)
                    )
                    n += 1
    finally:
        c.close()
    return consumed


@pytest.mark.parametrize("codec", CODECS)
def test_kafka_python_roundtrip(broker, codec):
    topic = unique_topic(f"kp-{codec}")
    create_topic(broker, topic, partitions=PARTITIONS)
    t0 = time.monotonic()
    sent, delivered = kafka_python_produce(broker.bootstrap, topic, codec)
    t1 = time.monotonic()
    per_part = defaultdict(int)
    for _, p, _ in delivered:
        per_part[p] += 1
    consumed = kafka_python_consume(broker.bootstrap, topic, per_part)
    t2 = time.monotonic()
    print(f"kafka-python {codec}: produce {t1 - t0:.1f}s, consume {t2 - t1:.1f}s, "
          f"per partition {dict(per_part)}")
    check_roundtrip(sent, delivered, consumed)
