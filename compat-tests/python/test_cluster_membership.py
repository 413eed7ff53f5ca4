"""Brokers that join and leave a running cluster (issue 9).

A broker-only node (`process.roles=broker`) follows the metadata log as a
learner of the controller quorum: it registers, heartbeats, serves clients
and takes new segments at once (placement prefers the least loaded broker),
including the next segments of existing ranges (re-placement moves followers
to it at a segment boundary), while nothing already stored is copied to it. When it dies, the sealed
segments it held heal back to three copies on the others."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

import procguard
from helpers import Worker, flexible_request, uvarint
from conftest import tessera_bin
from test_cluster import cluster, eventually, http, node_pid  # noqa: F401 - fixture
from test_replication import create_replicated


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def brokers_seen(bootstrap: str) -> list[int]:
    return sorted(AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).brokers)


def consume_all(bootstrap: str, topic: str, partitions: int, want: int) -> dict[tuple[int, int], bytes]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{topic}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got = {}
    deadline = time.monotonic() + 90
    while len(got) < want and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            got[(m.partition(), m.offset())] = m.value()
    c.close()
    return got


def produce(bootstrap: str, topic: str, partitions: int, count: int) -> dict[tuple[int, int], bytes]:
    acked = {}

    def on_delivery(err, msg):
        assert err is None, err
        acked[(msg.partition(), msg.offset())] = msg.value()

    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                  "linger.ms": 5, "batch.size": 16384})
    for i in range(count):
        p.produce(topic, value=b"v" * 100 + str(i).encode(), partition=i % partitions,
                  on_delivery=on_delivery)
        if i % 1000 == 0:
            p.poll(0)
    assert p.flush(60) == 0
    assert len(acked) == count
    return acked


def start_fourth_broker(cluster, node: int = 4) -> tuple[int, str]:
    """Starts node `node` (4 by default) by hand as a broker-only node of
    the running cluster; its Kafka port and admin URL."""
    port, admin_port = free_port(), free_port()
    workdir = cluster["workdir"]
    cmd = [
        str(tessera_bin()),
        "--data-dir", str(workdir / "cluster" / f"node-{node}"),
        "--node-id", str(node),
        "--listeners", f"PLAINTEXT://127.0.0.1:{port}",
        "--admin-listener", f"127.0.0.1:{admin_port}",
        "-o", f"controller.quorum.voters={cluster['voters']}",
        "-o", "process.roles=broker",
        *[a for k, v in cluster["overrides"].items() for a in ("-o", f"{k}={v}")],
    ]
    log = open(workdir / f"node-{node}.log", "ab")
    procguard.spawn(cmd, cwd=workdir, stdout=log, stderr=subprocess.STDOUT)
    return port, f"http://127.0.0.1:{admin_port}"


@pytest.mark.cluster_nodes(4)
def test_a_broker_only_node_serves_clients_and_survives_kill_9(cluster):
    boot = cluster["bootstrap"]
    # `--nodes 4`: three controllers+brokers, node 4 a broker only.
    for b in boot:
        assert brokers_seen(b) == [1, 2, 3, 4]
    a = AdminClient({"bootstrap.servers": boot[3]})
    assert a.describe_cluster(request_timeout=10).result(10).controller.id in (1, 2, 3)

    # A topic created through the broker-only node, replicated on three.
    create_replicated(boot[3], "learner-topic", 2, 3, {"min.insync.replicas": "2"})
    acked = produce(boot[3], "learner-topic", 2, 5000)

    # kill -9 and restart node 4: it rejoins and catches up with a topic
    # created while it was down.
    pid = node_pid(cluster["workdir"], 4)
    cmd = [c.decode() for c in open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0") if c]
    os.kill(pid, signal.SIGKILL)
    create_replicated(boot[0], "while-away", 1, 2, {})
    log = open(cluster["workdir"] / "node-4-restart.log", "ab")
    procguard.spawn(cmd, cwd=cluster["workdir"], stdout=log, stderr=log)
    eventually("node 4 ready again", lambda: http_ready(cluster["admin"][3]), timeout=60)
    md = AdminClient({"bootstrap.servers": boot[3]}).list_topics(timeout=10)
    assert "while-away" in md.topics
    got = consume_all(boot[3], "learner-topic", 2, len(acked))
    assert got == acked


def http_ready(admin_url: str) -> bool:
    import urllib.request
    try:
        with urllib.request.urlopen(admin_url + "/ready", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.mark.cluster_overrides({"replica.heal.delay.ms": "2000", "log.segment.bytes": "65536"})
def test_a_fourth_broker_joins_takes_new_segments_and_heals_away_when_removed(cluster):
    boot = ",".join(cluster["bootstrap"])
    # Data stored before the join stays where it is.
    create_replicated(boot, "before-join", 1, 3, {})
    before = produce(boot, "before-join", 1, 2000)

    started = time.monotonic()
    port, admin4 = start_fourth_broker(cluster)
    # Within a minute: registered, seen by every client, ready.
    eventually("broker 4 joined", lambda: http_ready(admin4)
               and brokers_seen(boot) == [1, 2, 3, 4], timeout=60)
    print(f"broker 4 joined and ready after {time.monotonic() - started:.2f} s")
    # Nothing copied to it.
    assert [s for s in http(admin4 + "/segments")
            if s["topic"] == "before-join" and s["local_bytes"] is not None] == []

    # New segments land on it at once: placement prefers the least loaded.
    def new_topic_on_4():
        for i in range(6):
            name = f"after-join-{i}"
            create_replicated(boot, name, 2, 3, {"min.insync.replicas": "2"})
            md = AdminClient({"bootstrap.servers": boot}).list_topics(name, timeout=10)
            if any(4 in p.replicas for p in md.topics[name].partitions.values()):
                print(f"new topic #{i} placed on broker 4")
                return name
        return None

    topic = new_topic_on_4()
    assert topic, "no new topic was placed on the new broker"
    acked = produce(boot, topic, 2, 20000)
    local = [s for s in http(admin4 + "/segments") if s["topic"] == topic and 4 in s["replicas"]]
    assert local and all(s["local_bytes"] for s in local)
    sealed = [s for s in local if s["sealed_bytes"] is not None]
    assert sealed, "expected rolled (sealed) segments on broker 4"

    # Remove it (kill -9): its sealed copies heal back to three on 1, 2, 3.
    os.kill(node_pid(cluster["workdir"], 4), signal.SIGKILL)

    def healed():
        now = [s for s in http(cluster["admin"][0] + "/segments")
               if s["topic"] == topic and s["sealed_bytes"] is not None]
        return now and all(4 not in s["replicas"] and len(s["replicas"]) == 3 for s in now)

    eventually("sealed segments of broker 4 healed to three copies", healed, timeout=90)
    assert consume_all(boot, topic, 2, len(acked)) == acked
    assert consume_all(boot, "before-join", 1, len(before)) == before


def read_to_end(bootstrap: str, topic: str, partitions: int) -> dict[int, list[tuple[int, bytes]]]:
    """Every record of every partition up to its high watermark, in order."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"exact-{topic}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    def end(p):
        for _ in range(20):
            w = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            if w is not None:
                return w[1]
            time.sleep(0.5)
        raise AssertionError(f"no high watermark for {topic}/{p}")

    ends = {p: end(p) for p in range(partitions)}
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(partitions)}
    deadline = time.monotonic() + 90
    while any((got[p][-1][0] + 1 if got[p] else 0) < ends[p] for p in got) \
            and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            got[m.partition()].append((m.offset(), m.value()))
    c.close()
    return got


def test_a_joined_broker_takes_the_next_segments_of_existing_ranges(cluster):
    """Issue 9: a broker that joins gets new segments of ranges that existed
    before it (not only new topics), within a minute, with nothing copied to
    it; idempotent acks=all producers keep every record exactly once."""
    import threading

    boot = ",".join(cluster["bootstrap"])
    admin1 = cluster["admin"][0]
    topics = [f"steady-{i}" for i in range(4)]
    for t in topics:
        create_replicated(boot, t, 2, 3, {"min.insync.replicas": "2"})

    # Steady produce to every existing topic, before, during and after the join.
    acked: dict[str, dict[int, list[tuple[int, bytes]]]] = {t: {0: [], 1: []} for t in topics}
    # Acknowledged without an offset: librdkafka reports a batch as
    # delivered, offset unknown, when its request's outcome was lost (timed
    # out, connection closed: "possibly persisted") and a later batch of the
    # producer succeeded (an implicit ack). Such records must be in the log
    # once, in order; their offsets are just not reported.
    no_offset: dict[str, dict[int, list[bytes]]] = {t: {0: [], 1: []} for t in topics}
    errors: list = []
    stop = threading.Event()

    def producer():
        p = Producer({"bootstrap.servers": boot, "acks": "all", "enable.idempotence": True,
                      "linger.ms": 5, "message.timeout.ms": 120000})

        def on_delivery(err, msg):
            if err is not None:
                errors.append(err)
            elif msg.offset() is None:
                no_offset[msg.topic()][msg.partition()].append(msg.value())
            else:
                acked[msg.topic()][msg.partition()].append((msg.offset(), msg.value()))

        i = 0
        while not stop.is_set():
            for t in topics:
                p.produce(t, value=f"{t}-{i}".encode(), partition=i % 2, on_delivery=on_delivery)
            i += 1
            p.poll(0.005)
        return p.flush(120)  # records never acknowledged

    thread = Worker(producer, "producer")
    thread.start()
    time.sleep(3)

    # The segments as they are before the join: their replicas never change.
    before = {(s["range"], s["seq"]): s for s in http(admin1 + "/segments") if s["topic"] in topics}
    newest_before = {}
    for (rng, seq) in before:
        newest_before[rng] = max(seq, newest_before.get(rng, -1))
    assert all(4 not in s["replicas"] for s in before.values())

    started = time.monotonic()
    port, admin4 = start_fourth_broker(cluster)
    eventually("broker 4 joined", lambda: http_ready(admin4), timeout=60)
    ready = time.monotonic()

    def existing_on_4():
        return [s for s in http(admin1 + "/segments")
                if s["topic"] in topics and 4 in s["replicas"]]

    try:
        eventually("a new segment of an existing range on broker 4", existing_on_4, timeout=60)
    finally:
        landed = time.monotonic()
        print(f"broker 4 ready {ready - started:.2f} s after start; first new segment of an "
              f"existing range on it {landed - started:.2f} s after start "
              f"({landed - ready:.2f} s after ready)")
    # Metadata shows it too: broker 4 is a replica of an existing partition.
    md = AdminClient({"bootstrap.servers": boot}).list_topics(timeout=10)
    assert any(4 in p.replicas for t in topics for p in md.topics[t].partitions.values())

    time.sleep(5)  # keep producing into the re-placed segments
    stop.set()
    unflushed = thread.result(180)
    assert unflushed == 0, f"{unflushed} records never acknowledged"
    assert errors == []

    # Only segments opened after the join are on broker 4; history stayed
    # where it was and nothing of it was copied to broker 4.
    now = {(s["range"], s["seq"]): s for s in http(admin1 + "/segments") if s["topic"] in topics}
    on_4 = [k for k, s in now.items() if 4 in s["replicas"]]
    assert on_4
    for (rng, seq) in on_4:
        assert seq > newest_before[rng], f"segment {rng}/{seq} existed before the join"
    for key, s in before.items():
        if key in now:
            assert now[key]["replicas"] == s["replicas"], f"segment {key} changed replicas"
    for s in http(admin4 + "/segments"):
        if s["topic"] in topics and 4 not in s["replicas"]:
            assert s["local_bytes"] is None, f"history copied to broker 4: {s}"
    assert any(s["local_bytes"] for s in http(admin4 + "/segments")
               if s["topic"] in topics and 4 in s["replicas"]), "nothing written to broker 4"

    # Every acknowledged record exactly once, in order, at its offset (the
    # ones acknowledged without an offset: exactly once, in order).
    for t in topics:
        got = read_to_end(boot, t, 2)
        for p in (0, 1):
            unplaced = set(no_offset[t][p])
            if unplaced:
                print(f"{t}/{p}: {len(unplaced)} record(s) acknowledged without an offset")
            values = [v for _, v in got[p]]
            assert all(values.count(v) == 1 for v in unplaced), f"{t}/{p}: an offset-less ack not read once"
            # Produce order = offset order (one producer, idempotent).
            seq = [int(v.rsplit(b"-", 1)[1]) for v in values]
            assert seq == sorted(seq) and len(set(seq)) == len(seq)
            got[p] = [(o, v) for o, v in got[p] if v not in unplaced]
            want = sorted(acked[t][p])
            assert want, f"nothing acknowledged on {t}/{p}"
            if got[p] != want:
                gv = [v for _, v in got[p]]
                dups = sorted({v for v in gv if gv.count(v) > 1})
                for d in dups[:4]:
                    print("dup", t, p, d, [o for o, v in got[p] if v == d], [o for o, v in want if v == d])
                print("workdir", cluster["workdir"])
            assert got[p] == want, f"{t}/{p}: {len(got[p])} read, {len(want)} acknowledged"


# --- UnregisterBroker (API key 64, KIP-631) -------------------------------
# No Python client has this API, so its frames (and DescribeCluster v2's, to
# see fenced brokers) are hand-built: both are flexible versions (request
# header v2, compact strings, tagged fields; response header v1).

NONE, INVALID_REQUEST, BROKER_ID_NOT_REGISTERED = 0, 42, 102


def unregister_broker(bootstrap: str, broker_id: int) -> tuple[int, str | None]:
    """UnregisterBroker v0: (error code, error message)."""
    import struct
    r = flexible_request(bootstrap, 64, 0, struct.pack(">i", broker_id) + uvarint(0))
    _throttle, error = r.take(">ih")
    return error, r.compact_string()


def described_brokers(bootstrap: str) -> dict[int, bool]:
    """DescribeCluster v2 with include_fenced_brokers: broker id -> fenced."""
    import struct
    body = struct.pack(">?b?", False, 1, True) + uvarint(0)
    r = flexible_request(bootstrap, 60, 2, body)
    _throttle, error = r.take(">ih")
    assert error == NONE, error
    r.compact_string()  # error message
    r.take(">b")  # endpoint type
    r.compact_string()  # cluster id
    r.take(">i")  # controller id
    brokers = {}
    for _ in range(r.uvarint() - 1):
        broker_id = r.take(">i")
        r.compact_string()  # host
        r.take(">i")  # port
        r.compact_string()  # rack
        brokers[broker_id] = r.take(">?")
        r.tagged_fields()
    return brokers


@pytest.mark.cluster_overrides({"replica.heal.delay.ms": "3600000", "log.segment.bytes": "65536"})
def test_unregister_broker_removes_a_gone_broker_and_heals_its_copies_at_once(cluster):
    """`kafka-cluster.sh unregister`: a broker-only node that left for good
    is unregistered; it disappears from Metadata and DescribeCluster (fenced
    brokers included), leaves the quorum's learners, and its sealed copies
    heal back to three at once (the heal delay here is an hour: only the
    unregistration can start the healing)."""
    boot = ",".join(cluster["bootstrap"])
    first = cluster["bootstrap"][0]
    assert unregister_broker(first, 4)[0] == BROKER_ID_NOT_REGISTERED

    port, admin4 = start_fourth_broker(cluster)
    eventually("broker 4 joined", lambda: http_ready(admin4)
               and brokers_seen(boot) == [1, 2, 3, 4], timeout=60)
    topic = None
    for i in range(8):
        name = f"unreg-{i}"
        create_replicated(boot, name, 2, 3, {"min.insync.replicas": "2"})
        md = AdminClient({"bootstrap.servers": boot}).list_topics(name, timeout=10)
        if any(4 in p.replicas for p in md.topics[name].partitions.values()):
            topic = name
            break
    assert topic, "no new topic was placed on broker 4"
    acked = produce(boot, topic, 2, 20000)
    sealed_on_4 = [s for s in http(admin4 + "/segments")
                   if s["topic"] == topic and 4 in s["replicas"] and s["sealed_bytes"] is not None]
    assert sealed_on_4, "expected rolled (sealed) segments on broker 4"

    # As in Kafka, a live broker may be unregistered: it registers again on
    # its next heartbeat (and stays a learner of the quorum).
    assert unregister_broker(first, 4)[0] == NONE
    eventually("live broker 4 registered again",
               lambda: described_brokers(first).get(4) is False, timeout=30)
    assert http_ready(admin4)

    # It leaves for good: stopped, then fenced when its session expires.
    os.kill(node_pid(cluster["workdir"], 4), signal.SIGKILL)
    eventually("broker 4 fenced", lambda: described_brokers(first).get(4) is True, timeout=30)

    # A controller (raft voter) cannot be unregistered.
    error, message = unregister_broker(first, 1)
    assert error == INVALID_REQUEST and "controller" in message, (error, message)

    error, message = unregister_broker(cluster["bootstrap"][1], 4)
    assert error == NONE, (error, message)
    for b in cluster["bootstrap"][:3]:
        eventually(f"{b} forgot broker 4", lambda b=b: 4 not in described_brokers(b), timeout=10)
        assert brokers_seen(b) == [1, 2, 3]
    # Unknown ids (broker 4 again, an id never seen) are BROKER_ID_NOT_REGISTERED.
    assert unregister_broker(first, 4)[0] == BROKER_ID_NOT_REGISTERED
    assert unregister_broker(first, 99)[0] == BROKER_ID_NOT_REGISTERED

    # It left the raft membership (the leader stops replicating to it).
    log = cluster["workdir"] / "cluster.log"
    eventually("learner 4 removed", lambda: b"metadata learner 4 removed" in log.read_bytes(),
               timeout=20)

    def healed():
        now = [s for s in http(cluster["admin"][0] + "/segments")
               if s["topic"] == topic and s["sealed_bytes"] is not None]
        return now and all(4 not in s["replicas"] and len(s["replicas"]) == 3 for s in now)

    eventually("sealed segments of broker 4 healed to three copies", healed, timeout=60)
    assert consume_all(boot, topic, 2, len(acked)) == acked
