"""Elastic ranges under live traffic (issue 5): while idempotent
confluent-kafka producers (acks=all) write keyed records to a 64-partition
topic and a consumer group reads them, the topic is split from 1 range to 16
and merged back to 2 through the admin HTTP API. At the end every record was
read exactly once, each partition's offsets are dense from 0, per-key order
held, and no client saw a non-retriable error."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections import defaultdict

import pytest
from confluent_kafka import Consumer, KafkaError, Producer

from helpers import create_topic, unique_topic

PARTITIONS = 64
RECORDS = 1_000_000
KEYS = 4096


def admin_call(broker, method: str, path: str):
    req = urllib.request.Request(f"http://127.0.0.1:{broker.admin_port}{path}", method=method, data=b"" if method == "POST" else None)
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read() or b"null")


def active_ranges(broker, topic: str):
    return sorted((r for r in admin_call(broker, "GET", "/ranges") if r["topic"] == topic and r["active"]), key=lambda r: r["lo"])


def reshape(broker, topic: str, log: list, stop: threading.Event):
    """Split 1 -> 16 (halving the widest range each time), then merge to 2."""
    while len(active_ranges(broker, topic)) < 16 and not stop.is_set():
        widest = max(active_ranges(broker, topic), key=lambda r: r["hi"] - r["lo"])
        log.append(("split", widest["id"], admin_call(broker, "POST", f"/ranges/split?range={widest['id']}")))
        time.sleep(0.05)
    while len(active_ranges(broker, topic)) > 2 and not stop.is_set():
        ranges = active_ranges(broker, topic)
        # Merge the narrowest adjacent pair, so the layout ends balanced.
        i = min(range(len(ranges) - 1), key=lambda i: ranges[i + 1]["hi"] - ranges[i]["lo"])
        left, right = ranges[i]["id"], ranges[i + 1]["id"]
        log.append(("merge", (left, right), admin_call(broker, "POST", f"/ranges/merge?left={left}&right={right}")))
        time.sleep(0.05)


@pytest.mark.timeout(600)
def test_split_to_16_and_merge_to_2_under_load(broker):
    topic = unique_topic("elastic")
    create_topic(broker, topic, PARTITIONS)
    assert len(active_ranges(broker, topic)) == 1

    fatal_errors: list = []

    def on_error(err):
        if err.fatal() or not err.retriable():
            # Transport hiccups are reported as non-retriable local errors by
            # librdkafka even when it reconnects by itself; only fatal ones and
            # broker errors count.
            if err.fatal() or err.code() not in (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN):
                fatal_errors.append(err)

    producer = Producer({
        "bootstrap.servers": broker.bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "error_cb": on_error,
    })
    delivered: dict[tuple[int, int], bytes] = {}
    delivery_errors: list = []

    def on_delivery(err, msg):
        if err is not None:
            delivery_errors.append(err)
        else:
            delivered[(msg.partition(), msg.offset())] = msg.value()

    consumed: dict[tuple[int, int], bytes] = {}
    duplicates = 0
    per_key_last: dict[bytes, int] = {}
    order_violations = []
    done_producing = threading.Event()

    def consume():
        nonlocal duplicates
        c = Consumer({
            "bootstrap.servers": broker.bootstrap,
            "group.id": f"g-{topic}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": True,
            "error_cb": on_error,
        })
        c.subscribe([topic])
        deadline = time.time() + 400
        while time.time() < deadline:
            msgs = c.consume(num_messages=10_000, timeout=0.5)
            for m in msgs:
                if m.error():
                    if m.error().code() != KafkaError._PARTITION_EOF:
                        fatal_errors.append(m.error())
                    continue
                key = (m.partition(), m.offset())
                if key in consumed:
                    duplicates += 1
                consumed[key] = m.value()
                seq = int(m.value().split(b":")[1])
                last = per_key_last.get(m.key(), -1)
                if seq <= last:
                    order_violations.append((m.key(), last, seq))
                per_key_last[m.key()] = seq
            if done_producing.is_set() and len(consumed) >= RECORDS:
                break
        c.close()

    consumer_thread = threading.Thread(target=consume)
    consumer_thread.start()

    moves: list = []
    stop = threading.Event()
    reshaper = threading.Thread(target=reshape, args=(broker, topic, moves, stop))
    next_seq = defaultdict(int)
    for i in range(RECORDS):
        if i == RECORDS // 10:
            reshaper.start()
        key = f"k{i % KEYS}".encode()
        seq = next_seq[key]
        next_seq[key] += 1
        while True:
            try:
                producer.produce(topic, key=key, value=b"%d:%d" % (i, seq), on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 1000 == 0:
            producer.poll(0)
    assert producer.flush(120) == 0
    reshaper.join(timeout=300)
    stop.set()
    done_producing.set()
    consumer_thread.join(timeout=420)

    ranges = active_ranges(broker, topic)
    splits = sum(1 for m in moves if m[0] == "split")
    merges = sum(1 for m in moves if m[0] == "merge")
    print(f"moves: {splits} splits, {merges} merges; final ranges: {[(r['lo'], r['hi']) for r in ranges]}")
    assert splits == 15 and merges == 14, moves
    assert len(ranges) == 2

    assert not delivery_errors, delivery_errors[:5]
    assert not fatal_errors, fatal_errors[:5]
    assert len(delivered) == RECORDS
    # Dense offsets from 0 in every partition.
    by_partition = defaultdict(list)
    for (p, o) in delivered:
        by_partition[p].append(o)
    for p, offsets in by_partition.items():
        offsets.sort()
        assert offsets == list(range(len(offsets))), f"partition {p}: offsets not dense"
    # Every record read exactly once, identical to what was acknowledged.
    assert duplicates == 0
    assert consumed == delivered
    assert not order_violations, order_violations[:5]


def test_open_transactions_survive_a_split_and_a_merge(broker):
    """A transaction open across a split (then aborted) and one open across a
    merge (then committed): markers land where the partitions live now, a
    read_committed consumer sees exactly the committed records, a
    read_uncommitted one sees all of them."""
    from test_transactions import read_all, txn_producer

    topic = unique_topic("elastic-txn")
    partitions = 8
    create_topic(broker, topic, partitions)
    p = txn_producer(broker, f"tx-{topic}")
    p.init_transactions(30)

    def write(tag, n=40):
        for i in range(n):
            p.produce(topic, value=f"{tag}-{i}".encode(), partition=i % partitions)
        p.flush(30)

    # Transaction 1 spans a split, then aborts.
    p.begin_transaction()
    write("a1")
    (root,) = active_ranges(broker, topic)
    admin_call(broker, "POST", f"/ranges/split?range={root['id']}")
    write("a2")
    p.abort_transaction(30)
    # Transaction 2 spans a merge, then commits.
    p.begin_transaction()
    write("c1")
    left, right = active_ranges(broker, topic)
    admin_call(broker, "POST", f"/ranges/merge?left={left['id']}&right={right['id']}")
    write("c2")
    p.commit_transaction(30)
    assert len(active_ranges(broker, topic)) == 1

    committed, _ = read_all(broker, topic, partitions, "read_committed")
    everything, _ = read_all(broker, topic, partitions, "read_uncommitted")
    want_committed = sorted(f"{t}-{i}" for t in ("c1", "c2") for i in range(40))
    want_all = sorted(f"{t}-{i}" for t in ("a1", "a2", "c1", "c2") for i in range(40))
    assert sorted(committed) == want_committed
    assert sorted(everything) == want_all
