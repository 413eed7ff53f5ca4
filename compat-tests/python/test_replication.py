"""Per-segment replication on a 3-node cluster (issue 9).

* A topic with replication factor 3 and ``min.insync.replicas=2`` under an
  idempotent ``acks=all`` producer and a consumer group: the primary of its
  range is killed with SIGKILL every 10 s (and started again 5 s later, to
  come back as a follower that truncates or repairs its copy). Every
  acknowledged record is consumed at its offset, no offset names two
  records, the producer sees no error; the client-visible unavailability of
  each failover is printed (``TESSERA_FAILOVER_SECONDS`` sets the length of
  the run: 40 s here, 120 s for the acceptance figures).
* ``min.insync.replicas``: with a follower down, acks=all produce gets
  NOT_ENOUGH_REPLICAS while acks=1 still succeeds.
* Healing: on 5 nodes, a broker holding copies of sealed segments dies
  for good; once it has been fenced for ``replica.heal.delay.ms`` its
  copies are re-created on the spare broker (repaired from the
  survivors), every sealed segment has 3 complete copies again, and every
  record is still consumed.
* Fetch from followers (KIP-392): with the rack-aware replica selector, a
  consumer whose ``client.rack`` is a follower's rack reads the sealed
  segments from that follower and the rest from the leader, in order.
* Controlled shutdown: SIGTERM to the primary moves its leadership to
  another replica before the process exits (the session is 60 s there, so
  nothing else could have moved it); the producer barely pauses and every
  acknowledged record is consumed.
"""

from __future__ import annotations

import os
import signal
import statistics
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

import procguard
from helpers import Acks, Worker, admin_ready, read_back
from test_cluster import cluster, eventually, http, node_pid  # noqa: F401 - fixture

RUN_SECONDS = float(os.environ.get("TESSERA_FAILOVER_SECONDS", "40"))
RESTART_AFTER = float(os.environ.get("TESSERA_RESTART_AFTER", "5"))


def create_replicated(boot: str, name: str, partitions: int, rf: int, configs: dict):
    a = AdminClient({"bootstrap.servers": boot})
    a.create_topics([NewTopic(name, partitions, rf, config=configs)], request_timeout=30)[
        name
    ].result(30)
    eventually(
        f"{name} has leaders",
        lambda: (t := a.list_topics(name, timeout=10).topics.get(name)) is not None
        and t.error is None
        and all(p.leader > 0 and len(p.replicas) == rf for p in t.partitions.values()),
    )
    return a


def leader_of(admin: AdminClient, topic: str, partition: int = 0) -> int:
    return admin.list_topics(topic, timeout=10).topics[topic].partitions[partition].leader


class Deliveries:
    """A producer's delivery callback: acknowledged (partition, offset) ->
    value, their times, and the errors reported."""

    def __init__(self):
        self.acked: dict[tuple[int, int], bytes] = {}
        self.errors: list[str] = []
        self.times: list[float] = []
        self.lock = threading.Lock()

    def __call__(self, err, msg):
        with self.lock:
            if err is not None:
                self.errors.append(str(err))
            else:
                self.acked[(msg.partition(), msg.offset())] = msg.value()
                self.times.append(time.monotonic())


def kill_node(workdir: Path, node: int) -> list[str]:
    """SIGKILLs node `node`; returns its command line, to start it again
    with `restart_node`."""
    cmd = node_cmd(workdir, node)
    os.kill(node_pid(workdir, node), signal.SIGKILL)
    return cmd


def kill_and_restart_later(workdir: Path, node: int, delay: float):
    """SIGKILLs node `node` and starts it again with the same command line
    after `delay` seconds (in a thread). Returns the thread."""
    cmd = kill_node(workdir, node)

    def restart():
        time.sleep(delay)
        restart_node(workdir, node, cmd)

    t = threading.Thread(target=restart, daemon=True)
    t.start()
    return t


def test_kill_the_primary_every_10s_loses_no_acknowledged_record(cluster):
    kill_the_primary_every_10s(cluster)


@pytest.mark.cluster_overrides({"log.segment.bytes": "65536"})
def test_kill_the_primary_every_10s_while_segments_roll(cluster):
    """The same with 64 KiB segments: segments roll several times a second
    under the producer, so kills land during rolls, re-placements and the
    repair of short copies (issue 26: the 1 GiB default never rolled while
    the faults happened)."""
    kill_the_primary_every_10s(cluster, rolls=True)


def try_http(url: str):
    """`http(url)`, or None when that node does not answer (restarting)."""
    try:
        return http(url)
    except Exception:  # noqa: BLE001 - a node coming back
        return None


def kill_the_primary_every_10s(cluster, rolls: bool = False):
    boot = ",".join(cluster["bootstrap"])
    topic = "replicated"
    admin = create_replicated(boot, topic, 6, 3, {"min.insync.replicas": "2"})

    delivered = Deliveries()
    acked, errors, ack_times, lock = delivered.acked, delivered.errors, delivered.times, delivered.lock

    producer = Producer(
        {
            "bootstrap.servers": boot,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "message.timeout.ms": 120000,
        }
    )
    consumed: dict[tuple[int, int], bytes] = {}
    conflicts: list[tuple[int, int]] = []
    stop_consuming = threading.Event()

    def consume():
        c = Consumer(
            {
                "bootstrap.servers": boot,
                "group.id": "replication-check",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": True,
            }
        )
        c.subscribe([topic])
        idle_since = None
        while True:
            m = c.poll(0.5)
            if m is None or m.error():
                if stop_consuming.is_set():
                    with lock:
                        done = all(k in consumed for k in acked)
                    idle_since = idle_since or time.monotonic()
                    if done or time.monotonic() - idle_since > 60:
                        break
                continue
            idle_since = None
            k = (m.partition(), m.offset())
            with lock:
                if k in consumed and consumed[k] != m.value():
                    conflicts.append(k)
                consumed[k] = m.value()
        c.close()

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()

    kills: list[float] = []
    restarts = []
    start = time.monotonic()
    next_kill = start + 10
    i = 0
    while time.monotonic() - start < RUN_SECONDS:
        try:
            producer.produce(topic, key=str(i).encode(), value=f"v{i}".encode(), on_delivery=delivered)
        except BufferError:  # the local queue is full during a failover
            producer.poll(0.05)
            continue
        i += 1
        if i % 100 == 0:
            producer.poll(0)
            time.sleep(0.01)
        if time.monotonic() >= next_kill:
            victim = leader_of(admin, topic)
            kills.append(time.monotonic())
            # Restarted once its session (3 s) has expired: the controller
            # fails the range over, and the node comes back as a follower.
            restarts.append(kill_and_restart_later(cluster["workdir"], victim, RESTART_AFTER))
            next_kill += 10
    assert producer.flush(180) == 0, "records still unacknowledged"
    for t in restarts:
        t.join()
    stop_consuming.set()
    consumer.join(240)

    with lock:
        lost = [k for k, v in acked.items() if consumed.get(k) != v]
        # A failover's unavailability: the longest pause between two
        # acknowledgements in the 10 s after the kill.
        times = sorted(ack_times)
        outages = []
        for k in kills:
            end = min(k + 10, times[-1]) if times else k + 10
            window = [k] + [t for t in times if k < t <= end] + [end]
            outages.append(max(b - a for a, b in zip(window, window[1:])))
    print(
        f"\nproduced {i}, acknowledged {len(acked)}, consumed {len(consumed)}, "
        f"kills {len(kills)}, unavailability per failover (s): "
        f"p50 {statistics.median(outages):.2f}, p99 {sorted(outages)[int(0.99 * (len(outages) - 1))]:.2f}, max {max(outages):.2f}, all {[round(o, 2) for o in outages]}"
    )
    assert len(kills) >= 2
    if rolls:
        segments = eventually("a node's segment list", lambda: next(
            (got for url in cluster["admin"] if (got := try_http(url + "/segments")) is not None),
            None))
        sealed = [seg for seg in segments
                  if seg["topic"] == topic and seg["sealed_bytes"] is not None]
        print(f"sealed segments of {topic}: {len(sealed)}")
        assert len(sealed) > 3 * len(kills), "segments did not roll during the faults"
    assert errors == [], errors[:5]
    assert len(acked) == i
    assert conflicts == [], conflicts[:5]
    assert lost == [], f"{len(lost)} acknowledged records not consumed: {lost[:5]}"
    # Offsets stay dense per partition: nothing skipped, nothing reused.
    for p in range(6):
        offsets = sorted(o for (q, o) in acked if q == p)
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets))), p


def test_min_insync_replicas_refuses_acks_all_with_a_follower_down(cluster):
    """RF=3, ``min.insync.replicas=3`` on 3 nodes; a follower is killed.
    As in Kafka: acks=all gets NOT_ENOUGH_REPLICAS while only 2 replicas
    are in sync, and an acks=1 record is accepted *and readable at once*
    (Kafka's shrunk ISR moves the high watermark; here the dead follower
    leaves the active segment's replica set at the next boundary, which
    Metadata shows). Once the follower is back it rejoins the set, acks=all
    works again, and every acknowledged record is read at its offset."""
    boot = ",".join(cluster["bootstrap"])
    topic = "insync"
    admin = create_replicated(boot, topic, 1, 3, {"min.insync.replicas": "3"})
    leader = leader_of(admin, topic)
    replicas = admin.list_topics(topic, timeout=10).topics[topic].partitions[0].replicas
    follower = next(r for r in replicas if r != leader)
    acked: dict[int, bytes] = {}

    def produce(acks: str, value: bytes):
        out = []
        p = Producer(
            {
                "bootstrap.servers": boot,
                "acks": acks,
                "retries": 0,
                "message.timeout.ms": 20000,
            }
        )
        p.produce(topic, value, partition=0, on_delivery=lambda e, m: out.append((e, m)))
        assert p.flush(30) == 0, "delivery report never came"
        err, msg = out[0]
        if err is None:
            acked[msg.offset()] = value
        return err

    # Right after creation the followers may not have answered the primary
    # yet (tessera counts a follower in sync once it has; Kafka's ISR starts
    # with every live replica): NOT_ENOUGH_REPLICAS until they have, which
    # clients retry (this producer does not).
    eventually("acks=all accepted with every replica up",
               lambda: produce("all", b"before") is None, timeout=30)
    cmd = kill_node(cluster["workdir"], follower)
    err = eventually(
        "NOT_ENOUGH_REPLICAS",
        lambda: (e := produce("all", b"refused")) is not None
        and e.code() == KafkaError.NOT_ENOUGH_REPLICAS
        and e,
        timeout=60,
    )
    assert err.code() == KafkaError.NOT_ENOUGH_REPLICAS
    # The dead follower left the replica set (no spare: the set shrank).
    eventually(
        "the replica set without the dead follower",
        lambda: follower
        not in admin.list_topics(topic, timeout=10).topics[topic].partitions[0].replicas,
    )
    assert produce("1", b"acks-1") is None
    one = max(o for o, v in acked.items() if v == b"acks-1")

    def read_back(upto: int) -> dict[int, bytes]:
        c = Consumer(
            {
                "bootstrap.servers": boot,
                "group.id": f"insync-{time.monotonic_ns()}",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
        c.assign([TopicPartition(topic, 0, 0)])
        got: dict[int, bytes] = {}
        deadline = time.monotonic() + 60
        while max(got, default=-1) < upto and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None:
                assert not m.error(), m.error()
                got[m.offset()] = m.value()
        c.close()
        return got

    # Readable now, with the follower still down.
    got = read_back(one)
    assert got.get(one) == b"acks-1", got
    # Back: it rejoins the active segment's set and acks=all works again.
    restart_node(cluster["workdir"], follower, cmd)
    eventually(
        "the follower back in the replica set",
        lambda: len(admin.list_topics(topic, timeout=10).topics[topic].partitions[0].replicas) == 3,
        timeout=90,
    )
    eventually("acks=all accepted again", lambda: produce("all", b"after") is None, timeout=60)
    last = max(acked)
    got = read_back(last)
    for offset, value in acked.items():
        assert got.get(offset) == value, (offset, value, got.get(offset))
    assert sorted(got) == list(range(min(got), max(got) + 1)), "offsets are dense"


# A session long enough that the controller cannot have failed the range
# over on its own within the test: only a controlled shutdown moves it.
@pytest.mark.cluster_overrides({"broker.session.timeout.ms": "60000"})
def test_sigterm_moves_leadership_before_the_broker_exits(cluster):
    boot = ",".join(cluster["bootstrap"])
    topic = "controlled"
    admin = create_replicated(boot, topic, 3, 3, {"min.insync.replicas": "2"})
    leader = leader_of(admin, topic)
    survivors = ",".join(b for i, b in enumerate(cluster["bootstrap"]) if i + 1 != leader)

    delivered = Deliveries()
    acked, errors, ack_times, lock = delivered.acked, delivered.errors, delivered.times, delivered.lock

    producer = Producer(
        {
            "bootstrap.servers": survivors,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "message.timeout.ms": 60000,
        }
    )
    stop = threading.Event()
    produced = [0]

    def produce():
        i = 0
        while not stop.is_set():
            try:
                producer.produce(topic, key=str(i).encode(), value=f"v{i}".encode(), on_delivery=delivered)
                i += 1
            except BufferError:
                producer.poll(0.05)
                continue
            if i % 50 == 0:
                producer.poll(0)
                time.sleep(0.01)
        produced[0] = i

    t = threading.Thread(target=produce, daemon=True)
    t.start()
    eventually("records acknowledged", lambda: len(acked) > 500, timeout=30)

    pid = node_pid(cluster["workdir"], leader)
    sent = time.monotonic()
    os.kill(pid, signal.SIGTERM)
    eventually(f"node {leader} exits", lambda: not Path(f"/proc/{pid}").exists()
               or b"zombie" in Path(f"/proc/{pid}/status").read_bytes().lower(), timeout=40)
    exited = time.monotonic() - sent
    # Led elsewhere already, with the stopped broker's session still valid.
    moved = leader_of(AdminClient({"bootstrap.servers": survivors}), topic)
    assert moved not in (leader, -1), moved
    # Produce goes on on the new leader well within the stopped broker's
    # session (60 s): a failover that waited for the session could not
    # acknowledge these (the pause is printed as a figure, not bounded).
    def acked_after_exit():
        with lock:
            return sum(1 for x in ack_times if x > sent)
    eventually("records acknowledged by the new leader", lambda: acked_after_exit() >= 200, timeout=45)
    stop.set()
    t.join(30)
    assert producer.flush(60) == 0
    with lock:
        after = [x for x in sorted(ack_times) if x > sent]
        pause = max(b - a for a, b in zip([sent] + after, after)) if after else float("inf")
    print(f"\ncontrolled shutdown: exited after {exited:.2f} s, produce paused {pause:.2f} s, new leader {moved}")
    assert errors == [], errors[:5]
    assert len(acked) == produced[0]

    consumed = {}
    c = Consumer({"bootstrap.servers": survivors, "group.id": "controlled-check", "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not all(k in consumed for k in acked):
        m = c.poll(0.5)
        if m is not None and not m.error():
            consumed[(m.partition(), m.offset())] = m.value()
    c.close()
    lost = [k for k, v in acked.items() if consumed.get(k) != v]
    assert lost == [], f"{len(lost)} acknowledged records not consumed: {lost[:5]}"


# The segments keep their replica set here (no placement at a roll, no
# re-placement): the test kills a follower of every sealed segment and
# watches those copies heal; a boundary placed by load may already have
# moved the follower off some of them (CI on 039db4b: "victim in every
# sealed segment" failed; 0 of 6 local runs).
@pytest.mark.cluster_nodes(5)
@pytest.mark.cluster_overrides({"replica.heal.delay.ms": "2000", "log.segment.bytes": "65536",
                                "replica.placement.roll.enable": "false",
                                "replica.placement.rebalance.enable": "false"})
def test_a_dead_brokers_sealed_copies_heal_back_to_three(cluster):
    boot = ",".join(cluster["bootstrap"])
    topic = "healing"
    create_replicated(boot, topic, 2, 3, {"min.insync.replicas": "2"})
    # Small batches: the segments roll at 64 KiB whatever the machine's pace.
    acks = Acks()
    p = Producer({"bootstrap.servers": boot, "acks": "all", "linger.ms": 5, "batch.size": 16384})
    for i in range(20000):
        p.produce(topic, key=str(i).encode(), value=b"x" * 100 + str(i).encode(), partition=i % 2,
                  on_delivery=acks)
        if i % 1000 == 0:
            p.poll(0)
    assert p.flush(60) == 0
    assert acks.errors == [] and len(acks.acked) == 20000, acks.errors[:5]

    def sealed_on(admin_url: str):
        return [s for s in http(admin_url + "/segments")
                if s["topic"] == topic and s["sealed_bytes"] is not None]

    def sealed(node: int):
        return sealed_on(cluster["admin"][node - 1])

    segments = sealed(1)
    assert len(segments) >= 3, f"expected several rolled segments, got {len(segments)}"
    # The victim: a follower (not the active segment's primary), so the
    # range keeps its leader and only sealed copies need healing.
    active = [s for s in http(cluster["admin"][0] + "/segments")
              if s["topic"] == topic and s["sealed_bytes"] is None][0]
    victim = active["replicas"][1]
    spares = {n for n in range(1, 6) if n not in active["replicas"]}
    assert all(victim in s["replicas"] for s in segments)
    victim_cmd = node_cmd(cluster["workdir"], victim)
    os.kill(node_pid(cluster["workdir"], victim), signal.SIGKILL)
    witness = next(n for n in range(1, 6) if n != victim)

    def healed():
        now = sealed(witness)
        if any(victim in s["replicas"] or len(s["replicas"]) != 3 for s in now):
            return False
        # Every listed copy is complete on its broker.
        for node in {r for s in now for r in s["replicas"]}:
            local = {(s["range"], s["seq"]): s for s in sealed(node)}
            for s in now:
                if node in s["replicas"] and local[(s["range"], s["seq"])]["local_bytes"] != s["sealed_bytes"]:
                    return False
        return True

    eventually("sealed copies healed onto the spare broker", healed, timeout=90)
    assert all(set(s["replicas"]) & spares for s in sealed(witness))

    # The victim comes back: its copies, no longer listed, are deleted once
    # every listed replica answers that it holds the whole segment (they
    # all do by now), not before.
    restart_node(cluster["workdir"], victim, victim_cmd)
    victim_admin = node_admin_url(victim_cmd)

    def victim_copies():
        try:
            mine = sealed_on(victim_admin)
        except OSError:
            return None
        return [s for s in mine if s["local_bytes"] is not None]

    eventually("the victim deleted its replaced copies",
               lambda: victim_copies() == []
               and not list(Path(cluster["workdir"]).rglob("*.replaced")), timeout=60)

    # Every acknowledged record at its offset, nothing else.
    got = read_back({"bootstrap.servers": boot}, topic, 2)
    want = acks.of(topic)
    lost = [k for k, v in want.items() if got.get(k) != v]
    assert lost == [], f"{len(lost)} acknowledged records not read back: {lost[:5]}"
    assert got == want


RACK_AWARE = "org.apache.kafka.common.replica.RackAwareReplicaSelector"


def metric(admin_url: str, name: str) -> float:
    with urllib.request.urlopen(admin_url + "/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.mark.cluster_args(["--racks", "r1,r2,r3"])
@pytest.mark.cluster_overrides({"replica.selector.class": RACK_AWARE, "log.segment.bytes": "65536"})
def test_a_consumer_reads_sealed_data_from_a_replica_in_its_rack(cluster):
    boot = ",".join(cluster["bootstrap"])
    topic = "racks"
    admin = create_replicated(boot, topic, 1, 3, {})
    p = Producer({"bootstrap.servers": boot, "acks": "all", "linger.ms": 5})
    for i in range(20000):
        p.produce(topic, value=b"v%d" % i, partition=0)
        if i % 1000 == 0:
            p.poll(0)
    assert p.flush(60) == 0
    leader = leader_of(admin, topic)
    follower = next(n for n in (1, 2, 3) if n != leader)

    c = Consumer({
        "bootstrap.servers": boot,
        "group.id": "rack-reader",
        "client.rack": f"r{follower}",
        # read_committed (librdkafka's default) stays on the leader.
        "isolation.level": "read_uncommitted",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    })
    c.assign([TopicPartition(topic, 0, 0)])
    got = []
    deadline = time.monotonic() + 60
    while len(got) < 20000 and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            got.append((m.offset(), m.value()))
    c.close()
    assert [o for o, _ in got] == list(range(20000))
    assert all(v == b"v%d" % o for o, v in got)
    from_follower = metric(cluster["admin"][follower - 1], "tessera_follower_fetched_bytes_total")
    from_leader = metric(cluster["admin"][leader - 1], "tessera_follower_fetched_bytes_total")
    print(f"\nfetched from follower {follower}: {from_follower:.0f} bytes (leader {leader} as follower: {from_leader:.0f})")
    assert from_follower > 100_000, from_follower
    assert from_leader == 0


def leaders_of(admin: AdminClient, topics: list[str]) -> dict[str, int]:
    md = admin.list_topics(timeout=10)
    return {t: md.topics[t].partitions[0].leader for t in topics}


@pytest.mark.cluster_overrides({"leader.imbalance.check.interval.seconds": "2"})
def test_leadership_comes_back_to_a_broker_that_restarted(cluster):
    """auto.leader.rebalance.enable: after a failover the restarted broker
    leads nothing; the active controller hands ranges back to it (a
    follower of theirs) until every broker leads two of the six, while an
    idempotent acks=all producer loses nothing and sees no error. Without
    leader balancing the restarted broker never leads again."""
    boot = ",".join(cluster["bootstrap"])
    workdir = cluster["workdir"]
    topics = [f"balanced-{i}" for i in range(6)]
    admin = None
    for t in topics:
        admin = create_replicated(boot, t, 1, 3, {"min.insync.replicas": "2"})
    delivered = Deliveries()
    stop = threading.Event()

    def produce():
        conf = {"bootstrap.servers": boot, "enable.idempotence": True, "acks": "all",
                "linger.ms": 5, "message.timeout.ms": 120000}
        if os.environ.get("DEBUG_RDKAFKA"):
            conf["debug"] = os.environ["DEBUG_RDKAFKA"]
        p = Producer(conf)
        i = 0
        while not stop.is_set():
            for t in topics:
                p.produce(t, value=f"{t}-{i}".encode(), on_delivery=lambda e, m, t=t: delivered(e, m) if e else record(t, m))
            i += 1
            p.poll(0.01)
        return p.flush(120)  # records never acknowledged

    by_topic: dict[str, list[tuple[int, bytes]]] = {t: [] for t in topics}

    # librdkafka acknowledges a batch without an offset when it learns of
    # it only from a later batch's success (its own answer was lost):
    # such records must be read once, in order.
    no_offset: dict[str, list[bytes]] = {t: [] for t in topics}

    def record(topic, msg):
        with delivered.lock:
            if msg.offset() is None:
                no_offset[topic].append(msg.value())
            else:
                by_topic[topic].append((msg.offset(), msg.value()))

    thread = Worker(produce, "producer")
    thread.start()
    time.sleep(2)

    leaders = leaders_of(admin, topics)
    counts = {n: list(leaders.values()).count(n) for n in (1, 2, 3)}
    victim = max(counts, key=lambda n: (counts[n], -n))
    assert counts[victim] >= 1, leaders
    cmd = node_cmd(workdir, victim)
    os.kill(node_pid(workdir, victim), signal.SIGKILL)
    eventually("its ranges failed over",
               lambda: victim not in leaders_of(admin, topics).values(), timeout=60)
    restart_node(workdir, victim, cmd)
    back = time.monotonic()

    def balanced():
        now = leaders_of(admin, topics)
        counts = [list(now.values()).count(n) for n in (1, 2, 3)]
        return victim in now.values() and max(counts) - min(counts) <= 1 and now

    final = eventually("leadership balanced again", balanced, timeout=90)
    print(f"\nleaders balanced {time.monotonic() - back:.1f} s after the restart: {final}")
    time.sleep(2)  # keep producing to the new leaders
    stop.set()
    unflushed = thread.result(180)
    assert unflushed == 0, f"{unflushed} records never acknowledged"
    assert delivered.errors == [], delivered.errors[:5]
    moves = sum(metric(a, "tessera_leader_moves_total") for a in cluster["admin"]
                if node_pid(workdir, cluster["admin"].index(a) + 1))
    assert moves >= 1, "no leader move counted"

    # Every acknowledged record once, at its offset, in produce order.
    c = Consumer({"bootstrap.servers": boot, "group.id": "balanced-check",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    for t in topics:
        want = sorted(by_topic[t])
        assert want, f"nothing acknowledged on {t}"
        c.assign([TopicPartition(t, 0, 0)])
        got = []
        while len(got) < len(want) + len(no_offset[t]):
            m = c.poll(10)
            assert m is not None, f"{t}: {len(got)} of {len(want)} read"
            if m.error():
                continue
            got.append((m.offset(), m.value()))
        values = [v for _, v in got]
        seq = [int(v.rsplit(b"-", 1)[1]) for v in values]
        twice = [(o, v) for o, v in got if values.count(v) > 1][:10]
        assert seq == sorted(set(seq)), f"{t}: not once each, in produce order; stored twice: {twice}"
        assert all(values.count(v) == 1 for v in no_offset[t])
        assert [(o, v) for o, v in got if v not in no_offset[t]] == want, t
    c.close()


def restart_node(workdir: Path, node: int, cmd: list[str]):
    log = open(workdir / f"node-{node}-restart.log", "ab")
    procguard.spawn(cmd, cwd=workdir, stdout=log, stderr=log)


def node_cmd(workdir: Path, node: int) -> list[str]:
    pid = node_pid(workdir, node)
    assert pid, f"node {node} is not running"
    return [c.decode() for c in (Path("/proc") / str(pid) / "cmdline").read_bytes().split(b"\0") if c]


def node_admin_url(cmd: list[str]) -> str:
    """The admin listener's URL of the node started with `cmd`."""
    return "http://" + cmd[cmd.index("--admin-listener") + 1]


def wait_exit(pid: int, timeout: float = 40):
    eventually(f"pid {pid} exits", lambda: not Path(f"/proc/{pid}").exists()
               or b"zombie" in Path(f"/proc/{pid}/status").read_bytes().lower(), timeout=timeout)


def hand_leadership_to(spare: int, workdir: Path, admin: AdminClient, topic: str,
                       holder: int, other: int, alive: set, while_down=None):
    """kill -9 `other`, SIGTERM the leader `holder`: only `spare` answers
    the fence besides the leader itself, so it leads next; then (after
    `while_down()`, if given, while both are still down) both come back and
    every one of the 5 nodes runs again."""
    cmd_other, cmd_holder = node_cmd(workdir, other), node_cmd(workdir, holder)
    os.kill(node_pid(workdir, other), signal.SIGKILL)
    alive.discard(other)
    holder_pid = node_pid(workdir, holder)
    os.kill(holder_pid, signal.SIGTERM)
    wait_exit(holder_pid)
    alive.discard(holder)
    eventually("the spare leads", lambda: leader_of(admin, topic) == spare, timeout=60)
    if while_down is not None:
        while_down()
    restart_node(workdir, other, cmd_other)
    restart_node(workdir, holder, cmd_holder)
    alive.update({other, holder})
    eventually("both nodes serve again",
               lambda: all(admin_ready(node_admin_url(cmd)) for cmd in (cmd_other, cmd_holder)), timeout=60)
    assert all(node_pid(workdir, n) for n in range(1, 6)), "a node is not running"


@pytest.mark.cluster_nodes(5)
@pytest.mark.cluster_overrides({"log.segment.bytes": "65536"})
def test_a_leader_without_the_history_reads_it_from_the_replicas_that_hold_it(cluster):
    """A spare that joined a later segment becomes leader: the sealed
    segments written before it joined are not on it, so it reads them from
    the replicas that hold them; a consumer from the beginning gets every
    record at its offset (before: the leader skipped to what it held)."""
    boot = ",".join(cluster["bootstrap"])
    workdir = cluster["workdir"]
    topic = "history"
    admin = create_replicated(boot, topic, 1, 3, {"min.insync.replicas": "2"})
    delivered = Deliveries()

    def produce(n: int, start: int):
        p = Producer({"bootstrap.servers": boot, "acks": "all", "enable.idempotence": True,
                      "linger.ms": 5, "batch.size": 16384, "message.timeout.ms": 60000})
        for i in range(start, start + n):
            p.produce(topic, value=b"h" * 100 + str(i).encode(), partition=0, on_delivery=delivered)
            if i % 1000 == 0:
                p.poll(0)
        assert p.flush(60) == 0

    def active_replicas():
        return next(s["replicas"] for s in http(cluster["admin"][witness() - 1] + "/segments")
                    if s["topic"] == topic and s["sealed_bytes"] is None)

    alive = set(range(1, 6))

    def witness():
        return min(alive)

    produce(8000, 0)
    first = active_replicas()
    # 1. kill -9 the primary: the controller seals by quorum and opens the
    #    next segment on the two survivors and a spare.
    p0 = first[0]
    cmd_p0 = node_cmd(workdir, p0)
    os.kill(node_pid(workdir, p0), signal.SIGKILL)
    alive.discard(p0)
    eventually("a new leader", lambda: leader_of(admin, topic) not in (p0, -1), timeout=60)
    restart_node(workdir, p0, cmd_p0)
    alive.add(p0)
    produce(4000, 8000)
    second = active_replicas()
    spare = next(r for r in second if r not in first)
    holder, other = second[0], next(r for r in second[1:] if r != spare)
    # 2. kill -9 the other survivor, then SIGTERM the leader: only the spare
    #    answers the fence besides the leader itself, so it leads next.
    hand_leadership_to(spare, workdir, admin, topic, holder, other, alive)
    produce(2000, 12000)
    assert leader_of(admin, topic) == spare
    # The new leader holds none of the first segments.
    local = {(s["range"], s["seq"]): s for s in http(cluster["admin"][spare - 1] + "/segments")
             if s["topic"] == topic}
    missing = [k for k, s in local.items() if s["sealed_bytes"] is not None and spare not in s["replicas"]]
    assert missing, "expected sealed segments the new leader does not hold"

    assert delivered.errors == [], delivered.errors[:5]
    for isolation in ("read_uncommitted", "read_committed"):
        c = Consumer({"bootstrap.servers": boot, "group.id": f"history-{isolation}",
                      "isolation.level": isolation, "enable.auto.commit": False})
        c.assign([TopicPartition(topic, 0, 0)])
        got = {}
        deadline = time.monotonic() + 90
        while len(got) < len(delivered.acked) and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and not m.error():
                got[(m.partition(), m.offset())] = m.value()
        c.close()
        lost = [k for k, v in delivered.acked.items() if got.get(k) != v]
        assert lost == [], f"{isolation}: {len(lost)} of {len(delivered.acked)} records not read: {lost[:5]}"
    assert metric(cluster["admin"][spare - 1], "tessera_remote_read_bytes_total") > 0


@pytest.mark.cluster_overrides({"replica.placement.rebalance.interval.ms": "1000",
                                "auto.leader.rebalance.enable": "false"})
def test_kill_9_during_moves_of_unreplicated_ranges_loses_no_acknowledged_record(cluster):
    """RF=1 topics piled on broker 1 move whole to the other brokers under
    an idempotent acks=all producer (issue 23); then broker 1, which keeps
    the history every moved range reads remotely, and a broker that
    received ranges are killed with SIGKILL and started again, while the
    producer goes on. Every acknowledged record is read back at its
    offset, once."""
    boot = ",".join(cluster["bootstrap"])
    workdir = cluster["workdir"]
    a = AdminClient({"bootstrap.servers": boot})
    topics = [f"moved-{i}" for i in range(4)]
    futures = a.create_topics([NewTopic(t, 2, replica_assignment=[[1], [1]],
                                        config={"segment.bytes": "32768"}) for t in topics],
                              request_timeout=30)
    for f in futures.values():
        f.result(30)
    by_topic: dict[str, dict[tuple[int, int], bytes]] = {t: {} for t in topics}

    class ByTopic(Deliveries):
        def __call__(self, err, msg):
            super().__call__(err, msg)
            if err is None:
                with self.lock:
                    by_topic[msg.topic()][(msg.partition(), msg.offset())] = msg.value()

    delivered = ByTopic()
    stop = threading.Event()

    def produce():
        p = Producer({"bootstrap.servers": boot, "enable.idempotence": True, "acks": "all",
                      "linger.ms": 5, "message.timeout.ms": 120000})
        i = 0
        while not stop.is_set():
            try:
                p.produce(topics[i % 4], value=b"v%d" % i, partition=(i // 4) % 2,
                          on_delivery=delivered)
            except BufferError:
                p.poll(0.05)
                continue
            i += 1
            if i % 100 == 0:
                p.poll(0)
                time.sleep(0.01)
        assert p.flush(150) == 0

    producer = Worker(produce, name="rf1-producer")
    producer.start()

    def leaders() -> set[int]:
        md = a.list_topics(timeout=10).topics
        return {p.leader for t in topics for p in md[t].partitions.values()}

    eventually("the RF=1 topics led by every broker", lambda: leaders() == {1, 2, 3}, timeout=90)
    time.sleep(2)
    for victim in (1, 2):
        cmd = kill_node(workdir, victim)
        time.sleep(4)
        restart_node(workdir, victim, cmd)
        time.sleep(4)
    time.sleep(5)
    stop.set()
    producer.result(200)
    assert delivered.errors == [], delivered.errors[:3]
    total = 0
    for t in topics:
        acked = by_topic[t]
        assert acked, t
        got = read_back({"bootstrap.servers": boot}, t, 2, timeout=120)
        missing = [k for k, v in acked.items() if got.get(k) != v]
        assert missing == [], f"{t}: {len(missing)} acknowledged records not read at their offsets"
        values = list(got.values())
        assert len(values) == len(set(values)), f"{t}: a record stored twice"
        total += len(acked)
    assert total > 1000
