"""A topic with 10,000 partitions: created by the AdminClient, one record
produced to every partition and read back; the number of files on disk must
follow ranges and segments, not partitions."""

from __future__ import annotations

import time

from confluent_kafka import Consumer, Producer, TopicPartition

from helpers import create_topic, unique_topic

PARTITIONS = 10_000


def test_ten_thousand_partitions(broker):
    topic = unique_topic("wide")
    files_before = len(broker.data_files()) if broker.persistent else None
    t0 = time.monotonic()
    create_topic(broker, topic, partitions=PARTITIONS, timeout=90)
    t_create = time.monotonic() - t0

    p = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 50})
    delivered, errors = {}, []

    def cb(err, msg):
        if err is not None:
            errors.append((msg.partition(), err))
        else:
            delivered[msg.partition()] = (msg.offset(), msg.value())

    for part in range(PARTITIONS):
        p.produce(topic, value=f"record-for-{part}".encode(), key=str(part).encode(),
                  partition=part, on_delivery=cb)
        if part % 500 == 0:
            p.poll(0)
    remaining = p.flush(90)
    t_produce = time.monotonic() - t0 - t_create
    assert remaining == 0, f"{remaining} records undelivered"
    assert not errors, f"{len(errors)} delivery errors, first: {errors[:5]}"
    assert len(delivered) == PARTITIONS
    assert all(off == 0 for off, _ in delivered.values()), "every partition's first record is offset 0"

    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"g-{topic}",
                  "enable.auto.commit": False, "auto.offset.reset": "error",
                  "queued.min.messages": 10, "fetch.wait.max.ms": 100})
    c.assign([TopicPartition(topic, part, 0) for part in range(PARTITIONS)])
    got = {}
    deadline = time.monotonic() + 90
    try:
        while len(got) < PARTITIONS and time.monotonic() < deadline:
            for m in c.consume(num_messages=10_000, timeout=1.0):
                if m.error():
                    raise AssertionError(f"consumer error: {m.error()}")
                assert m.partition() not in got, f"partition {m.partition()} returned twice"
                got[m.partition()] = (m.offset(), m.value())
    finally:
        c.close()
    t_consume = time.monotonic() - t0 - t_create - t_produce
    missing = sorted(set(range(PARTITIONS)) - set(got))
    assert not missing, f"{len(missing)} partitions not read back, e.g. {missing[:10]}"
    for part in range(PARTITIONS):
        assert got[part] == (0, f"record-for-{part}".encode()), f"partition {part}: {got[part]}"

    print(f"create {t_create:.1f}s, produce {t_produce:.1f}s, consume {t_consume:.1f}s")
    if broker.persistent:
        files = broker.data_files()
        print(f"files under data dir: {len(files)} (before topic: {files_before}) "
              f"for {PARTITIONS} partitions")
        # Ranges, not partitions, own files: a cold 10k-partition topic lives in a
        # handful of ranges. Anything near one file (or one dir) per partition fails.
        assert len(files) < PARTITIONS // 20, (
            f"{len(files)} files for {PARTITIONS} partitions: storage looks per-partition"
        )
