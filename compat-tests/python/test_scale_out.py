"""Issue 23's acceptance on real processes: a topic's partitions, the group
coordinators and the writes spread over every node of a 5-node cluster (3
controller voters, 2 broker-only nodes), and a 6th broker started by hand
takes primaries of the busy topic with nothing copied to it.

How the 6th broker gets there, without an operator: re-placement makes it a
follower of the next segments of existing ranges (it holds no replicas);
the range policy splits the ranges the producer keeps hot and hands each
second child to the follower leading the fewest ranges; the leader balance
moves ranges off brokers above the mean bytes in. Every acknowledged
record is then read back once, at its offset.

Heavy for CI's two cores (six processes, a flat-out producer for about a
minute): it runs when TESSERA_SCALE_ACCEPTANCE=1 (docs/SCALE.md has its
figures)."""

from __future__ import annotations

import os
import threading
import time
from collections import Counter

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from test_cluster import cluster, eventually, http  # noqa: F401 - fixture
from test_cluster_membership import http_ready, start_fourth_broker
from test_replica_sets import Load, check_read_back, read_back
from test_replication import create_replicated

pytestmark = pytest.mark.skipif(
    os.environ.get("TESSERA_SCALE_ACCEPTANCE") != "1",
    reason="six processes and a minute of flat-out produce: run by hand (TESSERA_SCALE_ACCEPTANCE=1)",
)

TOPIC = "wide"
PARTITIONS = 20


def leaders(admin, topic: str) -> Counter:
    md = admin.list_topics(topic, timeout=10).topics[topic]
    return Counter(p.leader for p in md.partitions.values())


def bytes_as_primary(cluster, topic: str, seconds: float) -> dict[int, int]:
    """Bytes each node appended as primary of `topic`'s active ranges over
    `seconds`, from its own /ranges sampled four times a second. A range's
    counter starts again when its log reopens (a re-placement seals the
    active segment and the same primary opens the next one): a value below
    the last sample is counted from zero. (The bytes of a log's last
    quarter second before it closed are not seen.)"""
    totals = Counter()
    last: dict[tuple[int, int], int] = {}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for i, url in enumerate(cluster["admin"], start=1):
            for r in http(url + "/ranges"):
                if r["topic"] != topic or not r["active"] or r.get("primary") != i:
                    continue
                key, now = (i, r["id"]), r["bytes_appended"]
                if key in last:
                    totals[i] += now - last[key] if now >= last[key] else now
                last[key] = now
        time.sleep(0.25)
    return {i: totals[i] for i in range(1, len(cluster["admin"]) + 1)}


class FlatOut:
    """An idempotent acks=all producer writing 1 KiB records round-robin
    over the topic's partitions as fast as it is acknowledged."""

    def __init__(self, boot: str):
        self.acked: dict[tuple[int, int], bytes] = {}
        self.errors: list = []
        self._stop = threading.Event()
        self._p = Producer({"bootstrap.servers": boot, "acks": "all", "enable.idempotence": True,
                            "linger.ms": 5, "message.timeout.ms": 120000})
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _deliver(self, err, msg):
        if err is not None:
            self.errors.append(err)
        elif msg.offset() is not None and msg.offset() >= 0:
            self.acked[(msg.partition(), msg.offset())] = msg.value()

    def _run(self):
        i = 0
        while not self._stop.is_set():
            value = f"{i:012d}".encode() + b"x" * 1012
            try:
                self._p.produce(TOPIC, value, partition=i % PARTITIONS, on_delivery=self._deliver)
                i += 1
            except BufferError:
                self._p.poll(0.05)
            if i % 500 == 0:
                self._p.poll(0)

    def stop(self):
        self._stop.set()
        self._t.join(30)
        assert self._p.flush(180) == 0, "records never acknowledged nor failed"


@pytest.mark.cluster_nodes(5)
@pytest.mark.cluster_args(["--voters", "3"])
@pytest.mark.cluster_overrides({
    "replica.placement.rebalance.interval.ms": "2000",
    "leader.imbalance.check.interval.seconds": "2",
    "leader.load.balance.min.bytes.per.sec": "100000",
    "range.policy.enable": "true",
    "range.policy.interval.ms": "2000",
    "range.policy.sustain.intervals": "2",
    "range.merge.bytes.per.sec": "1",
    "range.max.count": "12",
})
def test_five_nodes_share_the_load_and_a_sixth_broker_takes_primaries(cluster):
    boot = ",".join(cluster["bootstrap"])
    # No splits until the 6th broker comes (the topic's own threshold).
    admin = create_replicated(boot, TOPIC, PARTITIONS, 3, {
        "min.insync.replicas": "2", "range.split.bytes.per.sec": str(10**12)})

    # Creation spreads: 4 partitions led by each node (plus or minus one).
    led = leaders(admin, TOPIC)
    print("wide leaders at creation:", dict(led))
    assert sorted(led) == [1, 2, 3, 4, 5], led
    assert all(3 <= n <= 5 for n in led.values()), led
    # An RF=1 topic spreads too.
    create_replicated(boot, "wide-rf1", 10, 1, {})
    assert sorted(leaders(admin, "wide-rf1")) == [1, 2, 3, 4, 5]
    # So do the group coordinators.
    c = Consumer({"bootstrap.servers": boot, "group.id": "scale-g", "enable.auto.commit": False})
    eventually("a group commit", lambda: c.commit(
        offsets=[TopicPartition(TOPIC, 0, 0)], asynchronous=False) is not None)
    c.close()
    offsets_led = leaders(admin, "__consumer_offsets")
    print("__consumer_offsets leaders:", dict(offsets_led))
    assert sorted(offsets_led) == [1, 2, 3, 4, 5], offsets_led

    # Flat out: every node writes about as much as primary.
    load = FlatOut(boot)
    try:
        eventually("records flowing", lambda: len(load.acked) > 5000, timeout=120)
        written = bytes_as_primary(cluster, TOPIC, 8)
        mean = sum(written.values()) / len(written)
        print("bytes as primary per node in 8 s:", written, f"mean {mean:.0f}")
        assert mean > 0 and all(abs(b - mean) <= 0.25 * mean for b in written.values()), written

    finally:
        load.stop()
    assert not load.errors, load.errors[:5]

    # A steady producer (about 1 MB/s) for the rest: the volume stays one
    # the read-back can check.
    steady = Load(boot, TOPIC, PARTITIONS, rate=1000)
    try:
        # From now on the producer's ranges split when hot.
        from confluent_kafka.admin import ConfigResource
        res = ConfigResource(ConfigResource.Type.TOPIC, TOPIC,
                             set_config={"range.split.bytes.per.sec": "100000",
                                         "min.insync.replicas": "2"})
        admin.alter_configs([res])[res].result(30)

        # A sixth broker joins and takes primaries of the busy topic.
        before = {(s["range"], s["seq"]) for s in http(cluster["admin"][0] + "/segments")
                  if s["topic"] == TOPIC}
        started = time.monotonic()
        _port, admin6 = start_fourth_broker(cluster, node=6)
        eventually("broker 6 ready", lambda: http_ready(admin6), timeout=90)
        eventually("broker 6 leading partitions of the busy topic",
                   lambda: leaders(admin, TOPIC).get(6, 0) > 0, timeout=180)
        took = time.monotonic() - started
        led = leaders(admin, TOPIC)
        print(f"broker 6 leads {led.get(6)} partitions of {TOPIC} {took:.1f} s after its start;"
              f" leaders now {dict(led)}")
        time.sleep(5)  # it takes records as primary
        # Nothing it leads was copied to it: only segments opened after it
        # started are on it, and the history stays where it was.
        for s in http(admin6 + "/segments"):
            if s["topic"] != TOPIC:
                continue
            if 6 in s["replicas"]:
                assert (s["range"], s["seq"]) not in before, f"a segment from before the join on 6: {s}"
            else:
                assert s["local_bytes"] is None, f"history copied to broker 6: {s}"
        balance = http(cluster["admin"][0] + "/balance")
        print("balance view of node 1:", {k: balance[k] for k in ("broker_bytes_in_per_sec", "leaders")})
    finally:
        acks = steady.stop()
    assert not acks.errors, acks.errors[:5]
    acked = {**load.acked, **acks.acked}
    print(f"{len(acked)} records acknowledged")
    got = read_back(boot, TOPIC, PARTITIONS, acked)
    check_read_back(acked, got, PARTITIONS)
