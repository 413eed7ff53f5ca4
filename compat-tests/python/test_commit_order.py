"""Committed offsets follow the order a member sent its commits (issue 12).

Kafka handles the requests of one connection one at a time, in order, so
an OffsetCommit is applied before the next one from the same client, and an
OffsetFetch sees every commit sent before it. Reported: with librdkafka,
auto offset store on and asynchronous manual commits while consuming 50
messages, committed() returned 49 where 50 was expected.

* confluent-kafka, classic and KIP-848 groups: consume 50 messages (auto
  offset store on, auto commit off), commit asynchronously once at the end,
  or after every message; committed() right away must say 50.
* confluent-kafka: bursts of asynchronous commits of explicit offsets
  (500 per partition on 4 partitions, interleaved, not waiting in between),
  alternately ascending and descending; after every commit callback fired,
  committed() must be the last offset sent for each partition.
* kafka-python: the same burst with KafkaConsumer.commit_async (at most
  KP_DEPTH outstanding: kafka-python refuses requests beyond its in-flight
  limit instead of queueing them).
"""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from helpers import create_topic, unique_topic

FAST = {"group.initial.rebalance.delay.ms": "300", "group.min.session.timeout.ms": "1000"}
PARTITIONS = 4
BURST = 500
ROUNDS = 3
REPEATS_50 = 5  # fresh groups per case of the 50-message scenario
KP_DEPTH = 24  # kafka-python: commits outstanding at a time


def produce(broker, topic: str, per_partition: int, partitions: int):
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    for i in range(per_partition):
        for q in range(partitions):
            p.produce(topic, value=b"%d" % i, partition=q)
        if i % 1000 == 0:
            p.poll(0)
    assert p.flush(60) == 0


def wait_assigned(c: Consumer, n: int, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        c.poll(0.1)
        if len(c.assignment()) == n:
            return
    raise AssertionError(f"no assignment of {n} partitions after {timeout:.0f}s: {c.assignment()}")


def group_consumer(broker, group: str, protocol: str, on_commit=None) -> Consumer:
    conf = {
        "bootstrap.servers": broker.bootstrap,
        "group.id": group,
        "group.protocol": protocol,
        "enable.auto.commit": False,
        "enable.auto.offset.store": True,
        "auto.offset.reset": "earliest",
    }
    if protocol == "classic":
        conf["session.timeout.ms"] = 10000
    if on_commit is not None:
        conf["on_commit"] = on_commit
    return Consumer(conf)


def consume_50_and_commit(broker, topic: str, protocol: str, how: str):
    """One member of a fresh group reads the 50 messages with auto offset store,
    commits asynchronously (once at the end, or after every message), and asks
    committed() at once, then again after every commit callback fired.
    Returns (first answer, second answer, callbacks, callback errors)."""
    results = []
    c = group_consumer(broker, unique_topic("g50"), protocol,
                       on_commit=lambda err, tps: results.append((err, [(t.partition, t.offset, t.error) for t in tps])))
    c.subscribe([topic])
    got = 0
    deadline = time.monotonic() + 60
    while got < 50 and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is None or m.error():
            continue
        assert m.offset() == got
        got += 1
        if how == "each":
            c.commit(asynchronous=True)
    assert got == 50
    if how == "once":
        c.commit(asynchronous=True)
    # No waiting for the commit callbacks: the OffsetFetch goes to the
    # coordinator after the commits, on the same connection.
    [tp] = c.committed([TopicPartition(topic, 0)], timeout=30)
    first = tp.offset
    want = 50 if how == "each" else 1
    deadline = time.monotonic() + 30
    while len(results) < want and time.monotonic() < deadline:
        c.poll(0.1)
    [tp] = c.committed([TopicPartition(topic, 0)], timeout=30)
    c.close()
    errors = [r for r in results if r[0] is not None and r[0].code() != KafkaError._NO_OFFSET]
    return first, tp.offset, len(results), errors


@pytest.mark.broker_overrides(FAST)
@pytest.mark.parametrize("protocol", ["classic", "consumer"])
@pytest.mark.parametrize("how", ["once", "each"])
def test_async_commit_of_50_messages_then_committed(broker, protocol, how):
    topic = unique_topic("commit50")
    create_topic(broker, topic, 1)
    produce(broker, topic, 50, 1)
    wrong = []
    for attempt in range(REPEATS_50):
        first, after, callbacks, errors = consume_50_and_commit(broker, topic, protocol, how)
        assert not errors, errors[:5]
        want = 50 if how == "each" else 1
        assert callbacks == want, f"{callbacks} of {want} commit callbacks"
        if (first, after) != (50, 50):
            wrong.append((attempt, first, after))
    assert not wrong, ("committed() returned other than 50 (attempt, right after the async commit(s), "
                       f"after every commit callback): {wrong}")


def burst_offsets(round_no: int) -> list[int]:
    """Round 0: 1..500; round 1: 1000 down to 501; round 2: 1001..1500; ..."""
    offsets = list(range(round_no * BURST + 1, (round_no + 1) * BURST + 1))
    return offsets[::-1] if round_no % 2 else offsets


@pytest.mark.timeout(300)
@pytest.mark.broker_overrides(FAST)
@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_burst_of_async_commits_confluent(broker, protocol):
    topic = unique_topic("commitburst")
    create_topic(broker, topic, PARTITIONS)
    produce(broker, topic, ROUNDS * BURST + 1, PARTITIONS)
    callbacks = []

    def on_commit(err, tps):
        callbacks.append((err, [(t.partition, t.offset, t.error) for t in tps]))

    c = group_consumer(broker, unique_topic("gburst"), protocol, on_commit=on_commit)
    c.subscribe([topic])
    wait_assigned(c, PARTITIONS)
    sent = 0
    wrong = []
    for round_no in range(ROUNDS):
        for off in burst_offsets(round_no):
            for q in range(PARTITIONS):
                c.commit(offsets=[TopicPartition(topic, q, off)], asynchronous=True)
                sent += 1
        deadline = time.monotonic() + 120
        while len(callbacks) < sent and time.monotonic() < deadline:
            c.poll(0.05)
        assert len(callbacks) == sent, f"round {round_no}: {len(callbacks)} of {sent} commit callbacks"
        errors = [cb for cb in callbacks if cb[0] is not None or any(e is not None for _, _, e in cb[1])]
        assert not errors, errors[:5]
        want = burst_offsets(round_no)[-1]
        got = {tp.partition: tp.offset
               for tp in c.committed([TopicPartition(topic, q) for q in range(PARTITIONS)], timeout=30)}
        if got != {q: want for q in range(PARTITIONS)}:
            wrong.append((round_no, want, got))
    c.close()
    assert not wrong, f"committed offsets differ from the last commit sent (round, want, got): {wrong}"


@pytest.mark.timeout(300)
@pytest.mark.broker_overrides(FAST)
def test_burst_of_async_commits_kafka_python(broker):
    """kafka-python fails a request outright (NodeNotReadyError) when its
    connection already has max_in_flight_requests_per_connection requests
    out, so the burst keeps KP_DEPTH commits outstanding at a time, on a
    connection that allows a few more (heartbeats share it)."""
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP
    from kafka.structs import OffsetAndMetadata

    topic = unique_topic("commitburst-kp")
    create_topic(broker, topic, PARTITIONS)
    produce(broker, topic, ROUNDS * BURST + 1, PARTITIONS)
    kc = KafkaConsumer(topic, bootstrap_servers=broker.bootstrap, group_id=unique_topic("gkp"),
                       enable_auto_commit=False, auto_offset_reset="earliest",
                       max_in_flight_requests_per_connection=KP_DEPTH + 8)
    deadline = time.monotonic() + 30
    while len(kc.assignment()) < PARTITIONS and time.monotonic() < deadline:
        kc.poll(timeout_ms=100)
    assert len(kc.assignment()) == PARTITIONS

    tps = [KTP(topic, q) for q in range(PARTITIONS)]
    wrong = []
    for round_no in range(ROUNDS):
        futures = []
        deadline = time.monotonic() + 120
        for off in burst_offsets(round_no):
            for tp in tps:
                while sum(not f.is_done for f in futures[-KP_DEPTH:]) >= KP_DEPTH:
                    assert time.monotonic() < deadline, "commits do not complete"
                    kc.poll(timeout_ms=5, max_records=1)
                futures.append(kc.commit_async({tp: OffsetAndMetadata(off, "", -1)}))
        while not all(f.is_done for f in futures) and time.monotonic() < deadline:
            kc.poll(timeout_ms=20, max_records=1)
        done = sum(f.is_done for f in futures)
        assert done == len(futures), f"round {round_no}: {done} of {len(futures)} commits completed"
        errors = [f.exception for f in futures if f.failed()]
        assert not errors, errors[:5]
        want = burst_offsets(round_no)[-1]
        got = {tp.partition: kc.committed(tp) for tp in tps}
        if got != {q: want for q in range(PARTITIONS)}:
            wrong.append((round_no, want, got))
    kc.close()
    assert not wrong, f"committed offsets differ from the last commit sent (round, want, got): {wrong}"
