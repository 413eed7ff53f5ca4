"""A controller-only node (`process.roles=controller`, Kafka KRaft's isolated
controller; issue 9).

Node 1 is the only metadata voter and no broker: it is started from a Kafka
`controller.properties` (only a CONTROLLER listener, Kafka's ignored keys).
Nodes 2, 3 and 4 are broker-only nodes (`process.roles=broker`) following the
metadata log as learners. Clients see brokers 2, 3 and 4 only. A topic with
replication factor 3 takes an idempotent acks=all producer while the leader
of its partition 0 is killed with SIGKILL and restarted: since no broker is a
voter, the fencing and the seal-by-quorum failover can only be the
controller-only node's, and every acknowledged record is read back once, in
order, at the offset it was acknowledged with."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

import procguard
from conftest import READY_TIMEOUT_S, tessera_bin
from test_cluster import CLUSTER_DEFAULTS, eventually
from test_cluster_membership import free_port
from test_replication import Deliveries, create_replicated, leader_of

BROKERS = (2, 3, 4)

# Kafka 3.x config/kraft/controller.properties, with free ports and a
# temporary log directory.
CONTROLLER_PROPERTIES = """\
process.roles=controller
node.id=1
controller.quorum.voters={voters}
listeners=CONTROLLER://127.0.0.1:{port}
controller.listener.names=CONTROLLER
num.network.threads=3
num.io.threads=8
socket.send.buffer.bytes=102400
socket.receive.buffer.bytes=102400
socket.request.max.bytes=104857600
log.dirs={log_dirs}
num.partitions=1
num.recovery.threads.per.data.dir=1
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
log.retention.hours=168
log.segment.bytes=1073741824
log.retention.check.interval.ms=300000
"""


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, ""


def ready(admin: str) -> bool:
    try:
        return get(admin + "/ready")[0] == 200
    except OSError:
        return False


def start(workdir: Path, node: int, args: list[str]):
    log = open(workdir / f"node-{node}.log", "ab")
    return procguard.spawn([str(tessera_bin()), *args], cwd=workdir, stdout=log,
                           stderr=subprocess.STDOUT)


def test_a_controller_only_node_fails_over_brokers_it_is_not_one_of():
    workdir = Path(tempfile.mkdtemp(prefix="tessera-ctl-only-"))
    controller_port = free_port()
    voters = f"1@127.0.0.1:{controller_port}"
    admin = {n: f"http://127.0.0.1:{free_port()}" for n in (1, *BROKERS)}
    kafka = {n: f"127.0.0.1:{free_port()}" for n in BROKERS}
    overrides = [a for k, v in CLUSTER_DEFAULTS.items() for a in ("-o", f"{k}={v}")]
    props = workdir / "controller.properties"
    props.write_text(CONTROLLER_PROPERTIES.format(
        voters=voters, port=controller_port, log_dirs=workdir / "node-1"))
    procs = {1: start(workdir, 1, ["--config", str(props),
                                   "--admin-listener", admin[1].removeprefix("http://"),
                                   *overrides])}
    cmds: dict[int, list[str]] = {}
    for n in BROKERS:
        cmds[n] = ["--node-id", str(n), "--data-dir", str(workdir / f"node-{n}"),
                   "--listeners", f"PLAINTEXT://{kafka[n]}",
                   "--admin-listener", admin[n].removeprefix("http://"),
                   "-o", "process.roles=broker", "-o", f"controller.quorum.voters={voters}",
                   *overrides]
        procs[n] = start(workdir, n, cmds[n])
    try:
        eventually("every node ready", lambda: all(ready(a) for a in admin.values()))
        boot = ",".join(kafka.values())

        # Clients see the three brokers only; the controller they are told
        # of is one of them (they cannot reach node 1).
        for b in kafka.values():
            md = AdminClient({"bootstrap.servers": b}).list_topics(timeout=10)
            assert sorted(md.brokers) == list(BROKERS)
            assert md.controller_id in BROKERS
        status, metrics = get(admin[1] + "/metrics")
        assert status == 200 and "tessera_metadata_offset" in metrics
        assert "tessera_range_logs 0" in metrics

        topic = "ctl-only"
        a = create_replicated(boot, topic, 2, 3, {"min.insync.replicas": "2"})
        assert all(set(p.replicas) == set(BROKERS)
                   for p in a.list_topics(topic, timeout=10).topics[topic].partitions.values())

        delivered = Deliveries()
        producer = Producer({"bootstrap.servers": boot, "enable.idempotence": True,
                             "acks": "all", "linger.ms": 5, "message.timeout.ms": 60000})
        victim = leader_of(a, topic, 0)
        restarted = threading.Event()
        new_leader: list[int] = []

        def kill_and_restart():
            os.kill(procs[victim].pid, signal.SIGKILL)
            procs[victim].wait()
            # Its session (3 s) expires, the controller fences it and seals
            # its segment by quorum: another broker leads. Then it restarts.
            new_leader.append(eventually(
                "a failover", lambda: (l := leader_of(a, topic, 0)) not in (victim, -1) and l,
                timeout=30))
            procs[victim] = start(workdir, victim, cmds[victim])
            restarted.set()

        killer = None
        sent = 0
        started = time.monotonic()
        # Produce for 3 s, kill the leader, keep producing until it is back
        # and ready, then 2 s more. The killer runs as a future so that a
        # failure in it (no failover) fails the test at once.
        back_at = restarted_at = None
        pool = concurrent.futures.ThreadPoolExecutor(1)
        while back_at is None or time.monotonic() < back_at + 2:
            if killer is not None and killer.done():
                killer.result()
            try:
                producer.produce(topic, key=str(sent).encode(), value=f"v{sent}".encode(),
                                 partition=sent % 2, on_delivery=delivered)
            except BufferError:
                producer.poll(0.05)
                continue
            sent += 1
            if sent % 100 == 0:
                producer.poll(0)
                time.sleep(0.01)
            if killer is None and time.monotonic() - started > 3:
                killer = pool.submit(kill_and_restart)
            if back_at is None and restarted.is_set():
                restarted_at = restarted_at or time.monotonic()
                if ready(admin[victim]):
                    back_at = time.monotonic()
                else:
                    # A liveness bound, not a figure: the restarted node
                    # never served.
                    assert time.monotonic() - restarted_at < READY_TIMEOUT_S, \
                        f"node {victim} restarted but never became ready"
        assert producer.flush(60) == 0, "records still unacknowledged"
        killer.result()
        assert delivered.errors == [], delivered.errors[:5]
        acked = delivered.acked
        assert len(acked) == sent and all(o >= 0 for _, o in acked)

        # The leadership moved off the killed broker: a failover, and only
        # the controller-only node (the sole voter) can have done it.
        assert new_leader and new_leader[0] in BROKERS and new_leader[0] != victim
        log1 = (workdir / "node-1.log").read_text(errors="replace")
        assert "sealing by quorum" in log1

        # Every acknowledged record, once, in order, at its offset.
        c = Consumer({"bootstrap.servers": boot, "group.id": "ctl-only-check",
                      "auto.offset.reset": "earliest", "enable.auto.commit": False})
        c.assign([TopicPartition(topic, p, 0) for p in range(2)])
        consumed: dict[tuple[int, int], bytes] = {}
        duplicates = []
        deadline = time.monotonic() + 30
        missing = set(acked)
        while missing and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None or m.error():
                continue
            k = (m.partition(), m.offset())
            if k in consumed:
                duplicates.append(k)
            consumed[k] = m.value()
            missing.discard(k)
        c.close()
        assert duplicates == []
        lost = [k for k, v in acked.items() if consumed.get(k) != v]
        if lost:
            for p in range(2):
                offs = sorted(o for q, o in consumed if q == p)
                print(f"partition {p}: consumed {len(offs)}, max {offs[-1] if offs else None}, "
                      f"acked {sum(1 for q, _ in acked if q == p)}")
            for n in BROKERS:
                try:
                    print(n, get(admin[n] + "/segments")[1][:3000])
                except OSError as e:
                    print(n, e)
            print("workdir", workdir)
        assert lost == [], lost[:5]
        for p in range(2):
            values = [int(v[1:]) for (q, _), v in sorted(consumed.items()) if q == p]
            assert values == sorted(values), f"partition {p} out of order"
            assert len(values) == len(set(values)), f"partition {p} has a record twice"

        # The controller hosts nothing.
        topics_dir = workdir / "node-1" / "topics"
        assert not topics_dir.exists() or not any(topics_dir.iterdir())
        status, metrics = get(admin[1] + "/metrics")
        assert status == 200 and "tessera_range_logs 0" in metrics
        print(f"\nproduced {sent}, acknowledged {len(acked)}, killed broker {victim}, "
              f"took {time.monotonic() - started:.1f} s")
    finally:
        for p in procs.values():
            procguard.kill(p)
