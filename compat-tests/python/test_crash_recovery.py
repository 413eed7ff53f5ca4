"""kill -9 during a sustained acks=all load, restart on the same data dir and
port: every acknowledged record is at its original offset with its value, no
value appears twice, and producing again appends at the next offset. Also
with a topic that recompresses on append (`compression.type=zstd` under an
lz4 producer), so the broker-side rewrite is under the same promise."""

from __future__ import annotations

import threading
import time
from collections import defaultdict

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from helpers import admin, create_topic, unique_topic, wait_topic

PARTITIONS = 4
LOAD_BEFORE_KILL_S = 4.0
MIN_ACKED_BEFORE_KILL = 2_000


class Load:
    """A confluent-kafka acks=all producer writing unique values round-robin
    over the partitions from a background thread, recording every
    delivery-reported (partition, offset, value)."""

    def __init__(self, bootstrap: str, topic: str, codec: str = "none"):
        self.topic = topic
        self.p = Producer(
            {
                "compression.type": codec,
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "linger.ms": 2,
                "batch.num.messages": 200,
                # Fail (not retry) everything still unacknowledged well before
                # the broker is restarted, so no retry can cross the restart:
                # a value seen twice is then the broker's doing.
                "message.timeout.ms": 5000,
                "request.timeout.ms": 4000,
                "reconnect.backoff.max.ms": 500,
            }
        )
        self.acked: list[tuple[int, int, bytes]] = []
        self.failed: list[tuple[bytes, KafkaError]] = []
        self.sent = 0
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _cb(self, err, msg):
        with self.lock:
            if err is None:
                self.acked.append((msg.partition(), msg.offset(), msg.value()))
            else:
                self.failed.append((msg.value(), err))

    def _run(self):
        n = 0
        while not self.stop.is_set():
            value = f"v-{n:08d}".encode() + b"." * 100
            try:
                self.p.produce(self.topic, value=value, partition=n % PARTITIONS, on_delivery=self._cb)
                n += 1
                self.sent = n
            except BufferError:
                pass
            self.p.poll(0 if n % 100 else 0.001)
        self.p.flush(30)

    def n_acked(self):
        with self.lock:
            return len(self.acked)


def read_all(bootstrap: str, topic: str, ends: dict[int, int]):
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{topic}",
                  "enable.auto.commit": False, "auto.offset.reset": "error"})
    c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    out: dict[int, list[tuple[int, bytes]]] = defaultdict(list)
    total = sum(ends.values())
    n = 0
    deadline = time.monotonic() + 60
    try:
        while n < total and time.monotonic() < deadline:
            for m in c.consume(num_messages=5000, timeout=1.0):
                if m.error():
                    raise AssertionError(f"consumer error: {m.error()}")
                out[m.partition()].append((m.offset(), m.value()))
                n += 1
    finally:
        c.close()
    return out


def watermarks(bootstrap: str, topic: str) -> dict[int, tuple[int, int]]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"wm-{topic}"})
    try:
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)
                for p in range(PARTITIONS)}
    finally:
        c.close()


@pytest.mark.parametrize(
    "topic_codec,producer_codec",
    [(None, "none"), ("zstd", "lz4")],
    ids=["stored-as-sent", "recompressed-zstd"],
)
def test_kill9_under_acks_all_load(broker, topic_codec, producer_codec):
    broker.require_persistence()
    topic = unique_topic("crash")
    config = {"compression.type": topic_codec} if topic_codec else None
    create_topic(broker, topic, partitions=PARTITIONS, config=config)

    load = Load(broker.bootstrap, topic, producer_codec)
    load.thread.start()
    t0 = time.monotonic()
    while (time.monotonic() - t0 < LOAD_BEFORE_KILL_S or load.n_acked() < MIN_ACKED_BEFORE_KILL) \
            and time.monotonic() - t0 < 60:
        time.sleep(0.1)
    acked_at_kill = load.n_acked()
    sent_at_kill = load.sent
    broker.kill()  # kill -9 while the producer is still sending
    time.sleep(0.5)
    load.stop.set()
    load.thread.join(60)
    assert not load.thread.is_alive(), "producer did not drain"
    print(f"sent {load.sent} ({sent_at_kill} at kill), acked {len(load.acked)} "
          f"({acked_at_kill} when kill was issued), failed {len(load.failed)}")
    assert acked_at_kill >= MIN_ACKED_BEFORE_KILL, "load never got going"
    assert len(load.acked) + len(load.failed) == load.sent, "every record must be acked or failed"
    # The producer kept sending through the kill, so some records must have failed.
    assert load.failed, "no record failed although the broker was killed mid-load"

    broker.start()  # same data dir, same ports
    wait_topic(admin(broker), topic, PARTITIONS)

    wm = watermarks(broker.bootstrap, topic)
    print(f"watermarks after restart: {wm}")
    acked_by_part: dict[int, dict[int, bytes]] = defaultdict(dict)
    for p, o, v in load.acked:
        assert o not in acked_by_part[p], f"two acks for partition {p} offset {o}"
        acked_by_part[p][o] = v
    for p in range(PARTITIONS):
        lo, hi = wm[p]
        assert lo == 0, f"partition {p}: log start {lo} after restart"
        if acked_by_part[p]:
            assert hi > max(acked_by_part[p]), (
                f"partition {p}: high watermark {hi} after restart, but offset "
                f"{max(acked_by_part[p])} was acknowledged"
            )

    records = read_all(broker.bootstrap, topic, {p: wm[p][1] for p in range(PARTITIONS)})
    seen_values: dict[bytes, tuple[int, int]] = {}
    for p in range(PARTITIONS):
        got = records.get(p, [])
        offsets = [o for o, _ in got]
        assert offsets == list(range(wm[p][1])), (
            f"partition {p}: offsets read back are not 0..{wm[p][1] - 1} "
            f"(got {len(offsets)} records, first gap near "
            f"{next((i for i, o in enumerate(offsets) if o != i), None)})"
        )
        by_off = dict(got)
        for o, v in acked_by_part[p].items():
            assert o in by_off, f"acknowledged record lost: partition {p} offset {o}"
            assert by_off[o] == v, f"partition {p} offset {o}: {by_off[o][:12]!r} != acked {v[:12]!r}"
        for o, v in got:
            assert v not in seen_values, (
                f"value {v[:12]!r} appears twice: {seen_values[v]} and {(p, o)}"
            )
            seen_values[v] = (p, o)
            n = int(v[2:10])
            assert n % PARTITIONS == p, f"value {v[:12]!r} in partition {p}"

    # Producing again appends at the next offset of each partition.
    p2 = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
    after = {}

    def cb(err, msg):
        assert err is None, err
        after[msg.partition()] = msg.offset()

    for p in range(PARTITIONS):
        p2.produce(topic, value=f"after-restart-{p}".encode(), partition=p, on_delivery=cb)
    assert p2.flush(30) == 0
    assert after == {p: wm[p][1] for p in range(PARTITIONS)}, (
        f"post-restart appends at {after}, expected the high watermarks {wm}"
    )

    # And a second crash with no load in between loses nothing either.
    broker.restart(kill=True)
    wm2 = watermarks(broker.bootstrap, topic)
    assert {p: wm2[p][1] for p in range(PARTITIONS)} == {p: wm[p][1] + 1 for p in range(PARTITIONS)}


def test_graceful_restart_keeps_everything(broker):
    broker.require_persistence()
    topic = unique_topic("restart")
    create_topic(broker, topic, partitions=PARTITIONS)
    p = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 5})
    for i in range(20_000):
        p.produce(topic, value=f"r{i}".encode(), partition=i % PARTITIONS)
        if i % 1000 == 0:
            p.poll(0)
    assert p.flush(60) == 0
    before = watermarks(broker.bootstrap, topic)
    assert broker.stop() == 0, "SIGTERM shutdown should exit 0"
    broker.start()
    after = watermarks(broker.bootstrap, topic)
    assert after == before == {q: (0, 5_000) for q in range(PARTITIONS)}
    records = read_all(broker.bootstrap, topic, {q: 5_000 for q in range(PARTITIONS)})
    for q in range(PARTITIONS):
        assert [v for _, v in records[q]] == [f"r{i}".encode() for i in range(q, 20_000, PARTITIONS)]


def test_idempotent_producer_writes_through_kill9_and_restart(broker):
    """An idempotent confluent-kafka producer keeps writing while the broker
    is killed with -9 and restarted: every record lands exactly once, in
    send order, in every partition (checked by sequence number)."""
    broker.require_persistence()
    topic = unique_topic("idem-crash")
    create_topic(broker, topic, partitions=PARTITIONS)
    errors: list = []
    acked = 0

    def on_delivery(err, msg):
        nonlocal acked
        if err is not None:
            errors.append(err)
        else:
            acked += 1

    p = Producer({
        "bootstrap.servers": broker.bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 2,
        # Long enough to ride out the restart: nothing may fail or be dropped.
        "message.timeout.ms": 120_000,
        "reconnect.backoff.max.ms": 200,
    })
    sent = defaultdict(int)
    stop = threading.Event()

    def produce():
        n = 0
        while not stop.is_set():
            part = n % PARTITIONS
            try:
                p.produce(topic, value=b"%d:%08d" % (part, sent[part]), partition=part, on_delivery=on_delivery)
                sent[part] += 1
                n += 1
            except BufferError:
                p.poll(0.01)
            if n % 100 == 0:
                p.poll(0)
                time.sleep(0.001)

    t = threading.Thread(target=produce, daemon=True)
    t.start()
    time.sleep(2.0)
    broker.kill()
    time.sleep(1.0)
    broker.start()
    time.sleep(2.0)
    stop.set()
    t.join(30)
    assert p.flush(120) == 0, "records still queued"
    assert not errors, errors[:5]
    total = sum(sent.values())
    assert acked == total
    print(f"sent and acknowledged {total} records across a kill -9")

    ends = {part: watermarks(broker.bootstrap, topic)[part][1] for part in range(PARTITIONS)}
    got = read_all(broker.bootstrap, topic, ends)
    for part in range(PARTITIONS):
        values = got[part]
        offsets = [o for o, _ in values]
        assert offsets == list(range(len(values))), f"partition {part}: offsets not dense"
        seqs = [int(v.split(b":")[1]) for _, v in values]
        assert seqs == list(range(sent[part])), (
            f"partition {part}: {len(seqs)} records for {sent[part]} sent; "
            f"first mismatch at {next((i for i, s in enumerate(seqs) if s != i), None)}"
        )
