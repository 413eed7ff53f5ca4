"""Replica sets that heal themselves at segment boundaries (issue 26).

* A follower of an active segment killed with kill -9 leaves the replica
  set at the next boundary, within a session timeout, for the broker that
  was free: Metadata's replicas and ISR show the new set, the producer
  (idempotent, acks=all, 1 MiB segments rolling during the fault) sees no
  error, and every acknowledged record is read back once, at its offset.
  Before, the dead follower stayed in every next segment's set and the
  free broker got nothing (ISR {1,4} for all of the 85 s observed).
* A primary whose active segment was fenced by a seal that never got
  recorded (its sealer died right after the fence, as a leader move or a
  re-placement on a controller that crashed would leave it) serves again:
  it notices from its state, not from a metadata event that never comes.
* A merged range whose primary dies fails over to a follower of the merge
  child, which holds none of its parents' logs: it leads from the child's
  own producer snapshot and the image's offsets. Before, its reconcile
  pass failed ("parent range .. is not open") and sealed the child's
  empty active segment again on every retry, hundreds of segments, while
  the partitions stayed unwritable.
* Under-replicated partitions (Kafka's UnderReplicatedPartitions) are
  counted by the leader while a follower is out of sync, and drop back to
  0 once the set is healthy again.
"""

from __future__ import annotations

import socket
import struct
import threading
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from test_cluster import cluster, eventually, http  # noqa: F401 - fixture
from test_replication import Deliveries, create_replicated, kill_node, leader_of, metric, restart_node


class Load:
    """An idempotent acks=all producer writing `rate` records of 1 KiB a
    second to `partitions` partitions until stopped; a failure in its
    thread is kept and raised by `stop`."""

    def __init__(self, boot: str, topic: str, partitions: int, rate: int = 2000):
        self.acks = Deliveries()
        self.sent = 0
        self.failure: BaseException | None = None
        self._stop = threading.Event()
        self._producer = Producer(
            {
                "bootstrap.servers": boot,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 5,
                "message.timeout.ms": 120000,
            }
        )
        self._thread = threading.Thread(
            target=self._run, args=(topic, partitions, rate), daemon=True
        )
        self._thread.start()

    def _run(self, topic, partitions, rate):
        try:
            i = 0
            while not self._stop.is_set():
                t0 = time.monotonic()
                for _ in range(rate // 10):
                    value = f"{i:09d}".encode() + b"x" * 1015
                    while True:
                        try:
                            self._producer.produce(
                                topic, value, partition=i % partitions, on_delivery=self.acks
                            )
                            break
                        except BufferError:
                            self._producer.poll(0.05)
                    i += 1
                self.sent = i
                self._producer.poll(0)
                time.sleep(max(0.0, 0.1 - (time.monotonic() - t0)))
        except BaseException as e:  # noqa: BLE001 - raised by stop()
            self.failure = e

    def stop(self) -> Deliveries:
        self._stop.set()
        self._thread.join(60)
        assert not self._thread.is_alive(), "producer thread did not stop"
        if self.failure is not None:
            raise self.failure
        left = self._producer.flush(120)
        assert left == 0, f"{left} records never acknowledged nor failed"
        return self.acks


def read_back(boot: str, topic: str, partitions: int, acked: dict) -> dict:
    """Every record of `topic` from offset 0 up to the highest acknowledged
    offset of each partition: (partition, offset) -> value."""
    want = {p: max((o for (q, o) in acked if q == p), default=-1) for p in range(partitions)}
    c = Consumer(
        {
            "bootstrap.servers": boot,
            "group.id": f"read-back-{time.monotonic_ns()}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_uncommitted",
        }
    )
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got: dict[tuple[int, int], bytes] = {}
    # The highest offset read per partition, kept as it goes (a scan of
    # `got` per poll made a read of 500,000 records take hours).
    top = {p: -1 for p in range(partitions)}
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and any(top[p] < want[p] for p in range(partitions)):
        m = c.poll(0.5)
        if m is None:
            continue
        assert not m.error(), m.error()
        key = (m.partition(), m.offset())
        assert key not in got, f"offset {key} delivered twice"
        got[key] = m.value()
        top[key[0]] = max(top[key[0]], key[1])
    c.close()
    return got


def check_read_back(acked: dict, got: dict, partitions: int):
    """Every acknowledged record at its offset; offsets dense from 0 and
    every value once (nothing stored twice)."""
    missing = [k for k, v in acked.items() if got.get(k) != v]
    assert not missing, f"{len(missing)} acknowledged records not read at their offset, e.g. {sorted(missing)[:5]}"
    for p in range(partitions):
        offsets = sorted(o for (q, o) in got if q == p)
        assert offsets == list(range(len(offsets))), f"partition {p}: offsets not dense"
    values = list(got.values())
    assert len(values) == len(set(values)), "a record was stored twice"


@pytest.mark.cluster_nodes(4)
@pytest.mark.cluster_overrides({"log.segment.bytes": "1048576"})
def test_a_dead_follower_leaves_the_active_set_for_the_free_broker(cluster):
    boot = ",".join(cluster["bootstrap"])
    topic = "heal-active"
    admin = create_replicated(boot, topic, 2, 3, {"min.insync.replicas": "2"})
    meta = admin.list_topics(topic, timeout=10).topics[topic].partitions[0]
    leader, replicas = meta.leader, list(meta.replicas)
    follower = next(r for r in replicas if r != leader)
    free = next(b for b in range(1, 5) if b not in replicas)
    load = Load(boot, topic, 2)
    eventually("segments rolling", lambda: len([
        s for s in http(cluster["admin"][leader - 1] + "/segments")
        if s["topic"] == topic and s["sealed_bytes"] is not None]) >= 2)
    kill_node(cluster["workdir"], follower)

    def healed():
        parts = admin.list_topics(topic, timeout=10).topics[topic].partitions.values()
        return all(
            follower not in p.replicas and free in p.replicas and len(p.isrs) == 3 for p in parts
        )

    # Fenced after broker.session.timeout.ms (3 s here), replaced at once.
    eventually("the free broker replacing the dead follower", healed, timeout=60)
    time.sleep(3)  # more records on the new set, across rolls
    acks = load.stop()
    assert not acks.errors, acks.errors[:5]
    assert len(acks.acked) > 1000
    check_read_back(acks.acked, read_back(boot, topic, 2, acks.acked), 2)


def fence_frame(range_id: int, seq: int, epoch: int) -> bytes:
    """The replication upgrade request, then a Fence of segment (range, seq)
    at its leader epoch."""
    upgrade = struct.pack(">Ihhih", 10, 0x7E01, 0, 0, -1)
    body = struct.pack(">BQIi", 6, range_id, seq, epoch)
    return upgrade + struct.pack(">I", len(body)) + body


def test_a_primary_fenced_by_a_seal_that_never_got_recorded_serves_again(cluster):
    boot = ",".join(cluster["bootstrap"])
    topic = "orphan-fence"
    admin = create_replicated(boot, topic, 1, 3, {"min.insync.replicas": "2"})
    leader = leader_of(admin, topic)
    p = Producer({"bootstrap.servers": boot, "acks": "all", "enable.idempotence": True,
                  "message.timeout.ms": 120000})
    acks = Deliveries()
    for i in range(100):
        p.produce(topic, f"before-{i}".encode(), partition=0, on_delivery=acks)
    assert p.flush(60) == 0
    active = [s for s in http(cluster["admin"][leader - 1] + "/segments")
              if s["topic"] == topic and s["sealed_bytes"] is None]
    assert len(active) == 1
    seg = active[0]
    # What a sealer does first, and then nothing: it died.
    host, port = cluster["bootstrap"][leader - 1].split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(fence_frame(seg["range"], seg["seq"], seg["leader_epoch"]))
        (length,) = struct.unpack(">I", s.recv(4))
        reply = b""
        while len(reply) < length:
            reply += s.recv(length - len(reply))
    assert reply[0] == 7, f"not Fenced: {reply[:1]!r}"
    # The primary's log is fenced and no entry records it: it must notice
    # and seal it itself, then serve the next segment.
    for i in range(100):
        p.produce(topic, f"after-{i}".encode(), partition=0, on_delivery=acks)
    assert p.flush(120) == 0
    assert not acks.errors, acks.errors[:5]
    segments = [s for s in http(cluster["admin"][leader - 1] + "/segments") if s["topic"] == topic]
    assert any(s["seq"] > seg["seq"] for s in segments), "the fenced segment was never sealed"
    check_read_back(acks.acked, read_back(boot, topic, 1, acks.acked), 1)


@pytest.mark.cluster_overrides({"broker.session.timeout.ms": "60000"})
def test_under_replicated_partitions_while_a_follower_is_down(cluster):
    boot = ",".join(cluster["bootstrap"])
    topic = "urp"
    admin = create_replicated(boot, topic, 4, 3, {"min.insync.replicas": "1"})
    leader = leader_of(admin, topic)
    url = cluster["admin"][leader - 1]
    p = Producer({"bootstrap.servers": boot, "acks": "1"})
    for i in range(100):
        p.produce(topic, b"x", partition=0)
    assert p.flush(30) == 0
    eventually("no under-replicated partition",
               lambda: metric(url, "tessera_under_replicated_partitions") == 0)
    follower = next(r for r in admin.list_topics(topic, timeout=10).topics[topic].partitions[0].replicas
                    if r != leader)
    # The partitions this leader leads (Kafka's UnderReplicatedPartitions is
    # per broker): the range of partition 0, two of the four here (the
    # topic's ranges are spread, one per broker).
    led_here = sum(1 for p in admin.list_topics(topic, timeout=10).topics[topic].partitions.values()
                   if p.leader == leader)
    assert led_here == 2
    cmd = kill_node(cluster["workdir"], follower)
    # The session is long: nothing replaces the follower, it is out of
    # sync after replica.lag.time.max.ms (2 s here) and counted.
    for i in range(100):
        p.produce(topic, b"y", partition=0)
    assert p.flush(30) == 0
    eventually(f"{led_here} under-replicated partitions",
               lambda: metric(url, "tessera_under_replicated_partitions") == led_here)
    # Metadata's ISR, on every live broker, leaves the follower out while
    # it is still registered and unfenced (Kafka's leader shrinks the ISR
    # after replica.lag.time.max.ms, whatever the session); before, the
    # ISR was every unfenced replica, so it stayed in for the session.
    live = [b for i, b in enumerate(cluster["bootstrap"], start=1) if i != follower]

    def isr_seen(b: str) -> tuple[list[int], list[int]]:
        md = AdminClient({"bootstrap.servers": b}).list_topics(topic, timeout=10)
        part = md.topics[topic].partitions[0]
        return sorted(part.replicas), sorted(part.isrs)

    for b in live:
        eventually(f"ISR without {follower} seen from {b}",
                   lambda b=b: follower not in isr_seen(b)[1] and follower in isr_seen(b)[0])
    restart_node(cluster["workdir"], follower, cmd)
    eventually("in sync again", lambda: metric(url, "tessera_under_replicated_partitions") == 0,
               timeout=90)
    for b in cluster["bootstrap"]:
        eventually(f"ISR with {follower} again seen from {b}",
                   lambda b=b: isr_seen(b)[1] == isr_seen(b)[0], timeout=60)


@pytest.mark.cluster_overrides({"log.segment.bytes": "1048576"})
def test_a_merged_range_fails_over_to_a_follower_without_its_parents(cluster):
    boot = ",".join(cluster["bootstrap"])
    topic = "merge-failover"
    # Six partitions in three ranges of two (one per broker); the load goes
    # to the first range's two partitions, which are split and merged again.
    admin = create_replicated(boot, topic, 6, 3, {"min.insync.replicas": "2"})
    leader = leader_of(admin, topic)
    url = cluster["admin"][leader - 1]
    load = Load(boot, topic, 2, rate=500)

    def ranges():
        return [r for r in http(url + "/ranges") if r["topic"] == topic and r["active"]]

    def first_two():
        return sorted((r for r in ranges() if r["hi"] <= 2), key=lambda r: r["lo"])

    eventually("records flowing", lambda: len(load.acks.acked) > 200)
    (root,) = first_two()
    assert (root["lo"], root["hi"]) == (0, 2), ranges()
    http(url + f"/ranges/split?range={root['id']}", "POST")
    eventually("split", lambda: len(first_two()) == 2)
    left, right = first_two()
    eventually("both children led", lambda: all(
        p.leader > 0 for p in admin.list_topics(topic, timeout=10).topics[topic].partitions.values()))
    merge_url = cluster["admin"][leader_of(admin, topic) - 1]
    http(merge_url + f"/ranges/merge?left={left['id']}&right={right['id']}", "POST")
    eventually("merged", lambda: len(first_two()) == 1 and first_two()[0]["parents"])
    child = first_two()[0]
    primary = leader_of(admin, topic)
    eventually("the merge child taking records", lambda: len(load.acks.acked) > 1200)
    kill_node(cluster["workdir"], primary)
    survivors = [i for i in range(1, len(cluster["bootstrap"]) + 1) if i != primary]
    boot_alive = ",".join(cluster["bootstrap"][i - 1] for i in survivors)
    alive = AdminClient({"bootstrap.servers": boot_alive})

    def failed_over():
        parts = alive.list_topics(topic, timeout=10).topics[topic].partitions.values()
        return all(p.leader in survivors for p in parts)

    eventually("a follower of the merge child leading it", failed_over, timeout=60)
    before = len(load.acks.acked)
    eventually("records acknowledged after the failover",
               lambda: len(load.acks.acked) > before + 500, timeout=60)
    acks = load.stop()
    assert not acks.errors, acks.errors[:5]
    # The failover sealed the dead primary's segment once, not the new
    # primary's empty one on every reconcile retry.
    empty = [s["seq"] for s in http(cluster["admin"][survivors[0] - 1] + "/segments")
             if s["range"] == child["id"] and s["sealed_bytes"] == 0]
    assert len(empty) <= 2, f"the merge child's empty segments sealed again and again: {empty}"
    check_read_back(acks.acked, read_back(boot_alive, topic, 2, acks.acked), 2)


def kafka_partition_for(key: str, partitions: int) -> int:
    """Kafka's `Utils.abs(key.hashCode()) % partitions` (the coordinator's
    partition of a group id or transactional id)."""
    h = 0
    for ch in key:  # ASCII here: one UTF-16 unit per character
        h = (31 * h + ord(ch)) & 0xFFFFFFFF
    if h >= 1 << 31:
        h -= 1 << 32
    return (h & 0x7FFFFFFF) % partitions


def test_a_group_coordinator_on_a_split_offsets_range_fails_over_with_its_offsets(cluster):
    """`__consumer_offsets` split while a group commits, then the child
    holding the group's partition loses its primary: the follower that
    takes over holds none of the parent range's log, and must load the
    group's offsets from the parent's sealed segments too (its copies, or
    the replicas that hold them), as a consumer's Fetch reads them.
    Before, the load read only the child's log from the partition's log
    start and failed ("offset out of range"), and that failure failed the
    broker's whole reconcile pass, every second: the group stayed without
    a coordinator (the 25-minute fault run that found it lost the whole
    `queue` topic after healing)."""
    boot = ",".join(cluster["bootstrap"])
    topic, group = "split-coordinator", "split-coordinator-g"
    admin = create_replicated(boot, topic, 1, 3, {})
    partition = kafka_partition_for(group, 50)

    def commit(offset: int):
        c = Consumer({"bootstrap.servers": boot, "group.id": group, "enable.auto.commit": False})
        try:
            eventually(f"offset {offset} committed", lambda: c.commit(
                offsets=[TopicPartition(topic, 0, offset)], asynchronous=False) is not None, timeout=60)
        finally:
            c.close()

    def committed(bootstrap: str) -> int:
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
        try:
            return c.committed([TopicPartition(topic, 0)], timeout=10)[0].offset
        finally:
            c.close()

    def offsets_ranges(url: str):
        return [r for r in http(url + "/ranges")
                if r["topic"] == "__consumer_offsets" and r["active"]]

    commit(5)
    url = cluster["admin"][0]
    # The offsets topic starts as one range per broker (three here).
    eventually("the offsets topic", lambda: len(offsets_ranges(url)) == 3)
    (root,) = [r for r in offsets_ranges(url) if r["lo"] <= partition < r["hi"]]
    n = len(offsets_ranges(url))
    segments = http(url + "/segments")
    primary = next(s["replicas"][0] for s in segments
                   if s["range"] == root["id"] and s["sealed_bytes"] is None)
    http(cluster["admin"][primary - 1] + f"/ranges/split?range={root['id']}", "POST")
    eventually("split", lambda: len(offsets_ranges(url)) == n + 1)
    commit(9)  # into the child, after the parent's history
    child = next(r for r in offsets_ranges(url) if r["lo"] <= partition < r["hi"])
    child_primary = lambda: next(  # noqa: E731
        (s["replicas"][0] for s in http(url + "/segments")
         if s["range"] == child["id"] and s["sealed_bytes"] is None), None)
    eventually("the child led", lambda: child_primary() is not None)
    dead = child_primary()
    # The followers hold the producer snapshot where the child starts (they
    # lack the parent's log): either can lead it once its primary is gone.
    followers = [i for i in range(1, len(cluster["bootstrap"]) + 1) if i != dead]
    eventually("the child's producer snapshot on its followers", lambda: all(
        any((cluster["workdir"] / "cluster" / f"node-{n}").glob(
            f"topics/__consumer_offsets-*/{child['id']}/{0:010}.snapshot"))
        for n in followers), timeout=60)
    kill_node(cluster["workdir"], dead)
    survivors = [i for i in range(1, len(cluster["bootstrap"]) + 1) if i != dead]
    alive_boot = ",".join(cluster["bootstrap"][i - 1] for i in survivors)
    url = cluster["admin"][survivors[0] - 1]
    eventually("the child failed over", lambda: child_primary() in survivors, timeout=60)
    assert eventually("the group's offset from its new coordinator",
                      lambda: committed(alive_boot) == 9, timeout=90)
    # The new coordinator's broker reconciles everything else too.
    assert leader_of(AdminClient({"bootstrap.servers": alive_boot}), topic) in survivors


def test_offline_partitions_while_an_rf1_leader_is_down(cluster):
    """Kafka's OfflinePartitionsCount: an RF=1 partition whose only broker
    is down has no leader (nothing can fail it over); every other broker's
    /metrics counts it until the broker is back."""
    boot = ",".join(cluster["bootstrap"])
    topic = "offline"
    admin = create_replicated(boot, topic, 3, 1, {})
    parts = admin.list_topics(topic, timeout=10).topics[topic].partitions
    victim = parts[0].leader
    down = sum(1 for p in parts.values() if p.leader == victim)
    others = [i for i in range(1, len(cluster["bootstrap"]) + 1) if i != victim]
    urls = [cluster["admin"][i - 1] for i in others]
    for url in urls:
        eventually("no offline partition", lambda url=url: metric(url, "tessera_offline_partitions") == 0
                   and "tessera_offline_partitions " in http_text(url + "/metrics"))
    cmd = kill_node(cluster["workdir"], victim)
    for url in urls:
        eventually(f"{down} offline partitions at {url}",
                   lambda url=url: metric(url, "tessera_offline_partitions") >= down)
    restart_node(cluster["workdir"], victim, cmd)
    for url in urls:
        eventually(f"no offline partition again at {url}",
                   lambda url=url: metric(url, "tessera_offline_partitions") == 0, timeout=90)


def http_text(url: str) -> str:
    import urllib.request
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()
