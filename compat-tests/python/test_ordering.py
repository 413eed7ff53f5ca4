"""Kafka processes the requests of one connection strictly in order: with many
pipelined produce requests in flight for one partition (and no retries), the
offsets follow send order. Clients rely on this for per-key ordering."""

from __future__ import annotations

from confluent_kafka import Producer

from helpers import create_topic, unique_topic

N = 50_000


def test_pipelined_produce_keeps_send_order(broker):
    topic = unique_topic("order")
    create_topic(broker, topic, partitions=1)
    p = Producer({
        "bootstrap.servers": broker.bootstrap,
        "acks": "all",
        "linger.ms": 0,
        "batch.num.messages": 20,  # many small requests in flight at once
        "max.in.flight.requests.per.connection": 1000,
        "retries": 0,  # nothing may be resent: any reordering is the broker's
    })
    got = []
    errors = []

    def cb(err, msg):
        if err is not None:
            errors.append(err)
        else:
            got.append((msg.offset(), int(msg.value())))

    for i in range(N):
        while True:
            try:
                p.produce(topic, value=str(i).encode(), partition=0, on_delivery=cb)
                break
            except BufferError:
                p.poll(0.01)
        if i % 500 == 0:
            p.poll(0)
    assert p.flush(60) == 0
    assert not errors, f"{len(errors)} errors, first {errors[:3]}"
    got.sort()
    assert [o for o, _ in got] == list(range(N))
    inversions = [(a, b) for a, b in zip(got, got[1:]) if b[1] < a[1]]
    assert not inversions, (
        f"{len(inversions)} inversions; first: record {inversions[0][0][1]} at offset "
        f"{inversions[0][0][0]} but record {inversions[0][1][1]} at offset {inversions[0][1][0]}"
    )
