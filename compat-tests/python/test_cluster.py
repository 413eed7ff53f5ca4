"""`tessera cluster --nodes 3`: three processes, each controller and broker of
one metadata quorum, on consecutive loopback ports (issue 9, first step: no
segment replication yet, every range has one replica).

Real clients see one cluster: every node reports the same cluster id and
the three brokers; topics are spread over the brokers by placement; an
idempotent producer bootstrapped on one node and a consumer on another move
every record; a consumer group commits through the coordinator on whichever
node leads its ``__consumer_offsets`` partition. Killing the controller
leader with SIGKILL elects another: topic creation and range splits go on.
SIGTERM to the `tessera cluster` process stops every node."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

import procguard
from conftest import tessera_bin
from helpers import Acks, read_back

NODES = 3


# Ports free_block handed out in this test process: a cluster asks for
# three blocks before any node binds one, and a block free when asked for
# is still free when the next is chosen, so the blocks could overlap (node
# 2's Kafka port node 1's admin port: that node never starts).
_handed_out: set[int] = set()


def free_block(count: int) -> int:
    """A base port with `count` consecutive free loopback ports, none of
    them handed out before by this process."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + count >= 65000 or _handed_out.intersection(range(base, base + count)):
            continue
        ok = True
        for p in range(base, base + count):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            _handed_out.update(range(base, base + count))
            return base
    raise RuntimeError("no block of free ports")


def http(url: str, method: str = "GET"):
    req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read() or b"null")


def node_pid(workdir: Path, node: int) -> int | None:
    """The pid of node `node` of the cluster running under `workdir`."""
    marker = str(workdir / "cluster" / f"node-{node}")
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = (Path("/proc") / pid / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker.encode() in cmd and b"--node-id" in cmd:
            return int(pid)
    return None


def eventually(what: str, check, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            result = check()
            if result:
                return result
        except Exception as e:  # noqa: BLE001 - retried until the deadline
            last = e
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what} (last error: {last!r})")


CLUSTER_DEFAULTS = {
    "group.initial.rebalance.delay.ms": "0",
    "range.policy.enable": "false",
    "broker.heartbeat.interval.ms": "500",
    "broker.session.timeout.ms": "3000",
    "replica.lag.time.max.ms": "2000",
}


def controller_voters_for(nodes: int) -> int:
    """How many of `tessera cluster --nodes N` are controller voters (the
    rest are broker-only nodes), as `tessera cluster` decides."""
    return 1 if nodes <= 2 else 3 if nodes <= 4 else 5


@pytest.fixture
def cluster(request):
    """A 3-node `tessera cluster`; ``@pytest.mark.cluster_overrides({...})``
    changes or adds ``-o`` overrides for every node, and
    ``@pytest.mark.cluster_nodes(n)`` runs n nodes;
    ``@pytest.mark.cluster_args([...])`` adds arguments to `tessera cluster`."""
    args = request.node.get_closest_marker("cluster_args")
    sized = request.node.get_closest_marker("cluster_nodes")
    nodes = sized.args[0] if sized else NODES
    marker = request.node.get_closest_marker("cluster_overrides")
    overrides = {**CLUSTER_DEFAULTS, **(marker.args[0] if marker else {})}
    workdir = Path(tempfile.mkdtemp(prefix="tessera-cluster-"))
    kafka, admin, controller = free_block(nodes), free_block(nodes), free_block(nodes)
    log = open(workdir / "cluster.log", "wb")
    proc = procguard.spawn(
        [
            str(tessera_bin()),
            *[a for k, v in overrides.items() for a in ("-o", f"{k}={v}")],
            "cluster",
            "--nodes", str(nodes),
            "--base-port", str(kafka),
            "--admin-base-port", str(admin),
            "--controller-base-port", str(controller),
            "--dir", str(workdir / "cluster"),
            *(args.args[0] if args else []),
        ],
        cwd=workdir,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    info = {
        "proc": proc,
        "workdir": workdir,
        "bootstrap": [f"127.0.0.1:{kafka + i}" for i in range(nodes)],
        "admin": [f"http://127.0.0.1:{admin + i}" for i in range(nodes)],
        "voters": ",".join(
            f"{i + 1}@127.0.0.1:{controller + i}" for i in range(controller_voters_for(nodes))
        ),
        "overrides": overrides,
    }

    def ready(i):
        try:
            with urllib.request.urlopen(info["admin"][i] + "/ready", timeout=2) as r:
                return r.status == 200
        except (OSError, urllib.error.HTTPError):
            return False

    try:
        # Five nodes starting on two busy cores can take over a minute.
        try:
            eventually("every node ready", lambda: all(ready(i) for i in range(nodes)),
                       timeout=60.0 + 20.0 * max(0, nodes - 3))
        except AssertionError as e:
            log.flush()
            tail = (workdir / "cluster.log").read_bytes()[-4000:].decode(errors="replace")
            raise AssertionError(f"{e}\n--- cluster.log (tail) ---\n{tail}") from None
        yield info
    finally:
        procguard.kill(proc)
        for i in range(1, nodes + 1):
            pid = node_pid(workdir, i)
            if pid:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def admin_client(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap})


def create(bootstrap: str, name: str, partitions: int):
    a = admin_client(bootstrap)
    a.create_topics([NewTopic(name, partitions, 1)], request_timeout=30)[name].result(30)
    return eventually(
        f"{name} has leaders",
        lambda: (t := a.list_topics(name, timeout=10).topics.get(name)) is not None
        and t.error is None
        and all(p.leader > 0 for p in t.partitions.values())
        and t,
    )


def test_three_nodes_serve_one_cluster(cluster):
    boot = cluster["bootstrap"]
    metas = [admin_client(b).list_topics(timeout=20) for b in boot]
    assert len({m.cluster_id for m in metas}) == 1, [m.cluster_id for m in metas]
    assert all(sorted(m.brokers) == [1, 2, 3] for m in metas)

    # Each topic's partitions spread over the brokers as Kafka spreads
    # partition leaders: three partitions, one per broker (one range each).
    topics = [f"spread-{i}" for i in range(6)]
    leaders = {}
    for i, t in enumerate(topics):
        md = create(boot[i % NODES], t, 3)
        leaders[t] = sorted(p.leader for p in md.partitions.values())
    assert all(l == [1, 2, 3] for l in leaders.values()), leaders

    # An idempotent producer on node 1, a consumer on node 2: every record,
    # at its acknowledged offset.
    acked = {}
    errors = []

    def on_delivery(err, msg):
        if err:
            errors.append(err)
        else:
            acked[(msg.topic(), msg.partition(), msg.offset())] = msg.value()

    p = Producer({"bootstrap.servers": boot[0], "enable.idempotence": True, "acks": "all"})
    for t in topics:
        for i in range(300):
            p.produce(t, value=f"{t}:{i}".encode(), partition=i % 3, on_delivery=on_delivery)
    assert p.flush(60) == 0
    assert not errors, errors[:3]
    assert len(acked) == 6 * 300

    c = Consumer({
        "bootstrap.servers": boot[1],
        "group.id": "cluster-group",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    })
    c.subscribe(topics)
    seen = {}
    deadline = time.monotonic() + 90
    while len(seen) < len(acked) and time.monotonic() < deadline:
        for m in c.consume(500, timeout=1):
            if m.error() is None:
                seen[(m.topic(), m.partition(), m.offset())] = m.value()
    assert seen == acked
    # The group's coordinator is on whichever node leads its partition.
    c.commit(asynchronous=False)
    committed = c.committed([TopicPartition(t, p) for t in topics for p in range(3)], timeout=20)
    assert all(tp.offset == 100 for tp in committed), committed
    c.close()


def test_the_controller_leader_dies_and_creation_and_splits_go_on(cluster):
    boot = cluster["bootstrap"]
    md = admin_client(boot[0]).list_topics(timeout=20)
    leader = md.controller_id
    assert leader in (1, 2, 3)
    os.kill(node_pid(cluster["workdir"], leader), signal.SIGKILL)
    survivors = [i for i in range(1, NODES + 1) if i != leader]
    survivor_boot = boot[survivors[0] - 1]

    # A new controller is elected among the survivors.
    eventually(
        "a new controller",
        lambda: admin_client(survivor_boot).list_topics(timeout=10).controller_id in survivors,
    )
    # The dead node's session expires: it is fenced, Metadata stops listing
    # it, and what it led has no leader (LEADER_NOT_AVAILABLE) until it is back.
    eventually(
        "the dead broker fenced",
        lambda: sorted(admin_client(survivor_boot).list_topics(timeout=10).brokers) == survivors,
    )
    # Topic creation goes on, and only on live brokers.
    names = [f"after-{i}" for i in range(4)]
    leads = {}
    for n in names:
        t = eventually(f"{n} created", lambda n=n: create(survivor_boot, n, 4), 60)
        leads[n] = {p.leader for p in t.partitions.values()}
    # Spread over the live brokers only: both survivors lead some of each.
    assert all(lead == set(survivors) for lead in leads.values()), leads
    name = names[0]
    lead = t_leader = eventually(f"{name} partition 0 led", lambda: next(
        p.leader for i, p in admin_client(survivor_boot).list_topics(name, timeout=10)
        .topics[name].partitions.items() if i == 0))
    # And so do splits, on the broker that leads the range.
    admin = cluster["admin"][lead - 1]
    before = [r for r in http(admin + "/ranges") if r["topic"] == name and r["active"]]
    (rng,) = [r for r in before if r["lo"] == 0]
    assert rng["hi"] - rng["lo"] >= 2, before
    http(admin + f"/ranges/split?range={rng['id']}", "POST")
    ranges = [r for r in http(admin + "/ranges") if r["topic"] == name and r["active"]]
    assert len(ranges) == len(before) + 1, (t_leader, ranges)
    # Records flow through the new layout: each read back at its offset.
    acks = Acks()
    p = Producer({"bootstrap.servers": survivor_boot, "acks": "all"})
    for i in range(40):
        p.produce(name, value=b"%d" % i, partition=i % 4, on_delivery=acks)
    assert p.flush(30) == 0
    assert acks.errors == [], acks.errors[:3]
    assert len(acks.acked) == 40
    assert read_back({"bootstrap.servers": survivor_boot}, name, 4) == acks.of(name)


def test_sigterm_stops_every_node(cluster):
    proc = cluster["proc"]
    pids = [node_pid(cluster["workdir"], i) for i in range(1, NODES + 1)]
    assert all(pids)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or b"zombie" in Path(f"/proc/{pid}/status").read_bytes().lower()


@pytest.mark.cluster_overrides({"num.partitions": "4"})
def test_a_topic_auto_created_through_any_node_has_its_partition_count_at_once(cluster):
    """librdkafka's 0002_unkpart on a cluster (issue 24 item 2): a producer
    asks Metadata for a topic that does not exist (auto-creation on), then
    produces to partition 99. The first answer carries the topic's
    partitions, so the client fails that record at once with
    _UNKNOWN_PARTITION instead of queueing it until it times out. Through
    every node (the creation is forwarded to the controller from two of
    them), two topics at a time as the suite runs them."""
    import concurrent.futures

    def create_and_probe(node: int, n: int) -> tuple[int, int]:
        topic = f"unkpart-{node}-{n}"
        p = Producer({"bootstrap.servers": cluster["bootstrap"][node], "acks": "all"})
        md = p.list_topics(topic, timeout=15).topics[topic]
        assert md.error is None or md.error.code() == KafkaError.LEADER_NOT_AVAILABLE, md.error
        with pytest.raises(KafkaException) as refused:
            p.produce(topic, value=b"x", partition=99)
        acks = Acks()
        p.produce(topic, value=b"y", partition=1, on_delivery=acks)
        assert p.flush(30) == 0 and acks.errors == [], acks.errors
        return refused.value.args[0].code(), len(md.partitions)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda job: create_and_probe(*job),
                                [(node, n) for node in range(NODES) for n in range(2)]))
    assert answers == [(KafkaError._UNKNOWN_PARTITION, 4)] * (2 * NODES), answers


def test_a_fenced_producer_cannot_write_into_its_successors_transaction(cluster):
    """Zombie fencing across brokers: p1 writes in a transaction, p2 with
    the same transactional id calls InitProducerId (its coordinator aborts
    p1's transaction under a bumped epoch), then p1 writes again. When the
    coordinator and the partition's leader were different brokers, the
    leader took the abort marker without raising the producer's epoch,
    accepted p1's late batch, and p2's commit committed it:
    read_committed saw ['from-p1-again', 'from-p2'] (5 of 6 runs of
    test_transactions.py's fencing test under COMPAT_BROKER=cluster). One
    topic led by each broker, so at least two of them are remote from the
    coordinator."""
    boot = ",".join(cluster["bootstrap"])
    a = admin_client(boot)
    txn_id = "fence-across-brokers"
    for leader in (1, 2, 3):
        topic = f"fenced-{leader}"
        a.create_topics([NewTopic(topic, 1, replica_assignment=[[leader]])],
                        request_timeout=30)[topic].result(30)
        eventually(f"{topic} led by {leader}",
                   lambda: a.list_topics(topic, timeout=10).topics[topic].partitions[0].leader
                   == leader)
        conf = {"bootstrap.servers": boot, "transactional.id": txn_id}
        p1 = Producer(conf)
        p1.init_transactions(30)
        p1.begin_transaction()
        p1.produce(topic, value=b"from-p1", partition=0)
        assert p1.flush(30) == 0
        p2 = Producer(conf)
        p2.init_transactions(30)  # aborts p1's transaction, fences p1
        with pytest.raises(KafkaException) as fenced:
            p1.produce(topic, value=b"from-p1-again", partition=0)
            p1.commit_transaction(30)
        assert fenced.value.args[0].code() in (
            KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH,
        ), fenced.value
        p2.begin_transaction()
        p2.produce(topic, value=b"from-p2", partition=0)
        p2.commit_transaction(30)
        read = read_back({"bootstrap.servers": boot}, topic, 1, **{"isolation.level": "read_committed"})
        assert sorted(read.values()) == [b"from-p2"], (leader, read)


@pytest.mark.cluster_overrides({"auto.create.topics.enable": "false"})
def test_a_topic_deleted_and_created_again_replicates_from_its_first_record(cluster):
    """librdkafka's 0107_topic_recreate (its auto-create-off scenario) on 3
    nodes: a topic with replication factor 3, written to all along, deleted
    and created again under its name with fewer partitions. The new topic
    got the deleted one's range ids (the largest in the image) while
    frames of the old ranges were still in flight; their followers refused
    every frame of the new ones and acks=all produce timed out. Every
    record produced to the new topic must be acknowledged and read back
    at its offset."""
    import threading

    boot = ",".join(cluster["bootstrap"])
    a = admin_client(boot)
    name = "recreated"

    def leaders_of(partitions: int):
        return eventually(
            f"{name} with {partitions} partitions led on every node",
            lambda: all(
                (t := admin_client(b).list_topics(timeout=10).topics.get(name)) is not None
                and t.error is None
                and len(t.partitions) == partitions
                and all(p.leader > 0 for p in t.partitions.values())
                for b in cluster["bootstrap"]
            ),
        )

    # As 0107 does: a producer keeps writing through each deletion (its
    # errors then are expected; librdkafka keeps retrying) and a consumer
    # stays subscribed. The old ids met their leftovers in about half of
    # 0107's recreations: three rounds here.
    stop = threading.Event()

    def keep_producing():
        p = Producer({"bootstrap.servers": boot, "acks": "all", "message.timeout.ms": 8000})
        while not stop.is_set():
            try:
                p.produce(name, value=b"during")
            except (KafkaException, BufferError):
                pass
            p.poll(0.1)
        p.flush(10)

    consumer = Consumer({"bootstrap.servers": boot, "group.id": "recreated-g",
                         "auto.offset.reset": "earliest"})
    consumer.subscribe([name])
    writer = threading.Thread(target=keep_producing)
    partitions = 10
    a.create_topics([NewTopic(name, partitions, 3)], request_timeout=30)[name].result(30)
    leaders_of(partitions)
    writer.start()
    try:
        for round_, after in enumerate([3, 6, 3]):
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:
                consumer.poll(0.2)
            a.delete_topics([name], request_timeout=30)[name].result(30)
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:
                consumer.poll(0.2)
            a.create_topics([NewTopic(name, after, 3)], request_timeout=30)[name].result(30)
            leaders_of(after)
            acks = Acks()
            p = Producer({"bootstrap.servers": boot, "acks": "all", "message.timeout.ms": 30000})
            for i in range(30):
                p.produce(name, value=b"after-%d-%d" % (round_, i), partition=i % after,
                          on_delivery=acks)
            assert p.flush(60) == 0 and acks.errors == [], (round_, acks.errors)
            assert len(acks.of(name)) == 30
            partitions = after
    finally:
        stop.set()
        writer.join()
        consumer.close()
    acked = acks.of(name)
    read = read_back({"bootstrap.servers": boot}, name, partitions)
    assert {k: v for k, v in read.items() if v != b"during"} == acked


@pytest.mark.cluster_overrides({"num.partitions": "4"})
def test_partition_leaders_and_coordinators_spread_over_the_brokers(cluster):
    """Kafka spreads a new topic's partition leaders over the brokers; so
    does tessera, by starting a topic with one range per live broker (issue
    23). A 4-partition topic auto-created by a producer has leaders on all
    three nodes (one or two partitions each); `__consumer_offsets` and
    `__transaction_state` are spread the same way, so the group and
    transaction coordinators of many ids are on every node."""
    boot = ",".join(cluster["bootstrap"])
    topic = "auto-spread"
    acks = Acks()
    p = Producer({"bootstrap.servers": boot, "acks": "all", "enable.idempotence": True})
    for i in range(40):
        p.produce(topic, value=b"%d" % i, partition=i % 4, on_delivery=acks)
    assert p.flush(60) == 0
    assert acks.errors == [], acks.errors[:3]
    md = admin_client(boot).list_topics(topic, timeout=10).topics[topic]
    led = {}
    for part in md.partitions.values():
        led[part.leader] = led.get(part.leader, 0) + 1
    assert sorted(led) == [1, 2, 3] and sorted(led.values()) == [1, 1, 2], led
    assert read_back({"bootstrap.servers": boot}, topic, 4) == acks.of(topic)

    # Group and transaction coordinators of many ids, on every node.
    groups = [f"spread-group-{i}" for i in range(30)]
    for g in groups[:3]:
        c = Consumer({"bootstrap.servers": boot, "group.id": g, "enable.auto.commit": False})
        eventually(f"{g} committed", lambda c=c: c.commit(
            offsets=[TopicPartition(topic, 0, 1)], asynchronous=False) is not None)
        c.close()
    txp = Producer({"bootstrap.servers": boot, "transactional.id": "spread-txn"})
    txp.init_transactions(60)
    internal = admin_client(boot).list_topics(timeout=10).topics
    for name, partitions in (("__consumer_offsets", 50), ("__transaction_state", 50)):
        leaders = {}
        for part in internal[name].partitions.values():
            leaders[part.leader] = leaders.get(part.leader, 0) + 1
        assert sorted(leaders) == [1, 2, 3], (name, leaders)
        assert sorted(leaders.values()) == [16, 17, 17], (name, leaders)
    a = admin_client(boot)
    coordinators = set()
    for g in groups:
        described = a.describe_consumer_groups([g])[g].result(30)
        coordinators.add(described.coordinator.id)
    assert coordinators == {1, 2, 3}, coordinators


def test_a_transaction_across_nodes(cluster):
    """One confluent-kafka transaction writing to topics led by different
    nodes, with a consumer group's offsets sent to it: the coordinator
    writes the markers it leads and asks the other leaders with
    WriteTxnMarkers. read_committed sees exactly the committed records and
    the group sees the offsets only once committed."""
    boot = cluster["bootstrap"]
    topics = [f"tx-{i}" for i in range(6)]
    leaders = {}
    for i, t in enumerate(topics):
        md = create(boot[i % NODES], t, 2)
        leaders[t] = {p.leader for p in md.partitions.values()}
    assert len(set().union(*leaders.values())) >= 2, leaders
    source = "tx-source"
    create(boot[0], source, 1)

    p = Producer({
        "bootstrap.servers": boot[0],
        "transactional.id": "cluster-tx",
        "transaction.timeout.ms": 30000,
    })
    p.init_transactions(30)
    acks = {"a": Acks(), "c": Acks()}

    def run(tag: str, commit: bool, offset: int):
        p.begin_transaction()
        for t in topics:
            for i in range(10):
                p.produce(t, value=f"{tag}-{t}-{i}".encode(), partition=i % 2, on_delivery=acks[tag])
        # Written before the end (abort_transaction purges what is still
        # queued): the aborted records are in the log for read_committed to skip.
        assert p.flush(30) == 0
        p.send_offsets_to_transaction(
            [TopicPartition(source, 0, offset)],
            Consumer({"bootstrap.servers": boot[1], "group.id": "tx-group"}).consumer_group_metadata(),
            30,
        )
        if commit:
            p.commit_transaction(30)
        else:
            p.abort_transaction(30)

    run("a", commit=False, offset=7)
    run("c", commit=True, offset=11)

    def read(isolation: str) -> list[str]:
        c = Consumer({
            "bootstrap.servers": boot[2],
            "group.id": f"reader-{isolation}",
            "isolation.level": isolation,
            "auto.offset.reset": "earliest",
            "enable.partition.eof": True,
        })
        c.assign([TopicPartition(t, q, 0) for t in topics for q in range(2)])
        out, eof = [], set()
        deadline = time.monotonic() + 60
        while len(eof) < len(topics) * 2 and time.monotonic() < deadline:
            for m in c.consume(200, timeout=1):
                if m.error() is None:
                    out.append(m.value().decode())
                elif m.error().code() == KafkaError._PARTITION_EOF:
                    eof.add((m.topic(), m.partition()))
        c.close()
        return sorted(out)

    committed = read("read_committed")
    assert committed == sorted(f"c-{t}-{i}" for t in topics for i in range(10))
    # read_uncommitted: the aborted and the committed records, each at its
    # acknowledged offset.
    assert all(len(a.acked) == len(topics) * 10 and not a.errors for a in acks.values())
    for t in topics:
        got = read_back({"bootstrap.servers": boot[2]}, t, 2, **{"isolation.level": "read_uncommitted"})
        assert got == {**acks["a"].of(t), **acks["c"].of(t)}, t
    g = Consumer({"bootstrap.servers": boot[2], "group.id": "tx-group"})
    (tp,) = g.committed([TopicPartition(source, 0)], timeout=20)
    assert tp.offset == 11
    g.close()


def java_string_hash(s: str) -> int:
    h = 0
    for ch in s:
        h = (31 * h + ord(ch)) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def offset_fetch_v1(group: str, topic: str, partition: int) -> bytes:
    """An OffsetFetch v1 request frame (header v1, correlation id 9)."""
    def string(s: str) -> bytes:
        return struct.pack(">h", len(s)) + s.encode()

    body = string(group) + struct.pack(">i", 1) + string(topic) + struct.pack(">ii", 1, partition)
    msg = struct.pack(">hhi", 9, 1, 9) + string("zombie-test") + body
    return struct.pack(">i", len(msg)) + msg


def read_offset_fetch_v1(s: socket.socket) -> tuple[int, int]:
    """(committed offset, error code) of the one partition answered."""
    from helpers import recv_exact

    body = recv_exact(s, struct.unpack(">i", recv_exact(s, 4))[0])
    assert struct.unpack(">i", body[:4])[0] == 9
    at = 4
    assert struct.unpack(">i", body[at:at + 4])[0] == 1
    at += 4
    (name_len,) = struct.unpack(">h", body[at:at + 2])
    at += 2 + name_len
    assert struct.unpack(">i", body[at:at + 4])[0] == 1
    at += 4
    _, offset = struct.unpack(">iq", body[at:at + 12])
    at += 12
    (meta_len,) = struct.unpack(">h", body[at:at + 2])
    at += 2 + max(meta_len, 0)
    (error,) = struct.unpack(">h", body[at:at + 2])
    return offset, error


def test_a_paused_coordinator_does_not_answer_from_its_stale_cache(cluster):
    """A group coordinator paused (SIGSTOP) past its broker session is
    fenced and its `__consumer_offsets` partition fails over; the group
    commits newer offsets at the new coordinator. An OffsetFetch that
    reached the paused node is answered when it wakes, before its metadata
    image has caught up: it must not be the stale offset from its cache
    (the fault harness saw consumers rewind that way, seed 9). Kafka's
    answer is NOT_COORDINATOR (the client finds the new coordinator) or the
    current offset."""
    boot = cluster["bootstrap"]
    topic, group = "zombie-coordinator", "zombie-coordinator-group"
    create(",".join(boot), topic, 1)
    c = Consumer({"bootstrap.servers": ",".join(boot), "group.id": group,
                  "enable.auto.commit": False})
    eventually("first commit", lambda: c.commit(
        offsets=[TopicPartition(topic, 0, 10)], asynchronous=False) is not None)
    c.close()
    a = admin_client(",".join(boot))
    coordinator = a.describe_consumer_groups([group])[group].result(30).coordinator.id
    partition = abs(java_string_hash(group)) % 50
    others = [b for i, b in enumerate(boot) if i + 1 != coordinator]
    pid = node_pid(cluster["workdir"], coordinator)
    zombie = socket.create_connection(tuple(boot[coordinator - 1].rsplit(":", 1)), timeout=60)
    # Warm the connection (and check the stale value is what it serves).
    zombie.sendall(offset_fetch_v1(group, topic, 0))
    assert read_offset_fetch_v1(zombie) == (10, 0)
    os.kill(pid, signal.SIGSTOP)
    try:
        rest = admin_client(",".join(others))
        eventually(
            "the coordinator partition failed over",
            lambda: rest.list_topics("__consumer_offsets", timeout=5)
            .topics["__consumer_offsets"].partitions[partition].leader not in (coordinator, -1),
            timeout=60,
        )
        c = Consumer({"bootstrap.servers": ",".join(others), "group.id": group,
                      "enable.auto.commit": False})
        eventually("a commit at the new coordinator", lambda: c.commit(
            offsets=[TopicPartition(topic, 0, 20)], asynchronous=False) is not None)
        c.close()
        # Queued in the paused node's socket: served as soon as it wakes.
        zombie.sendall(offset_fetch_v1(group, topic, 0))
    finally:
        os.kill(pid, signal.SIGCONT)
    offset, error = read_offset_fetch_v1(zombie)
    zombie.close()
    assert (offset, error) in ((20, 0), (-1, 16)), (offset, error)
    # Once caught up, every node agrees on the new offset.
    for b in boot:
        g = Consumer({"bootstrap.servers": b, "group.id": group})
        eventually(f"the new offset through {b}", lambda g=g: g.committed(
            [TopicPartition(topic, 0)], timeout=10)[0].offset == 20)
        g.close()


def fetch_v4(topic: str, partition: int, offset: int, correlation: int) -> bytes:
    """A Fetch v4 request frame (header v1) for one partition, no wait."""
    def string(s: str) -> bytes:
        return struct.pack(">h", len(s)) + s.encode()

    body = (struct.pack(">iiiib", -1, 0, 1, 1 << 20, 0) + struct.pack(">i", 1) + string(topic)
            + struct.pack(">iiqi", 1, partition, offset, 1 << 20))
    msg = struct.pack(">hhi", 1, 4, correlation) + string("zombie-test") + body
    return struct.pack(">i", len(msg)) + msg


def list_offsets_v1_latest(topic: str, partition: int, correlation: int) -> bytes:
    """A ListOffsets v1 request frame (header v1) for the latest offset."""
    def string(s: str) -> bytes:
        return struct.pack(">h", len(s)) + s.encode()

    body = struct.pack(">i", -1) + struct.pack(">i", 1) + string(topic) + struct.pack(">iiq", 1, partition, -1)
    msg = struct.pack(">hhi", 2, 1, correlation) + string("zombie-test") + body
    return struct.pack(">i", len(msg)) + msg


def read_partition_answer(s: socket.socket, correlation: int, throttle: bool) -> tuple[int, bytes]:
    """(error code, the bytes after it) of the one partition a Fetch v4
    (`throttle`) or ListOffsets v1 response answers."""
    from helpers import recv_exact

    body = recv_exact(s, struct.unpack(">i", recv_exact(s, 4))[0])
    assert struct.unpack(">i", body[:4])[0] == correlation
    at = 8 if throttle else 4
    assert struct.unpack(">i", body[at:at + 4])[0] == 1
    at += 4
    (name_len,) = struct.unpack(">h", body[at:at + 2])
    at += 2 + name_len
    assert struct.unpack(">i", body[at:at + 4])[0] == 1
    at += 8  # count, partition index
    (error,) = struct.unpack(">h", body[at:at + 2])
    return error, body[at + 2:]


def test_a_paused_primary_does_not_send_consumers_back_to_the_beginning(cluster):
    """A partition's primary is paused (SIGSTOP) past its broker session;
    another broker leads and the log grows past where the paused one
    stopped. A Fetch (at an offset the log now has) and a ListOffsets that
    reached the paused node are answered when it wakes, before its image has
    caught up. Its log ends where it stopped: OFFSET_OUT_OF_RANGE there
    made the fault harness's consumer reset to the beginning and read
    everything again (seed 4), and its latest offset is stale. Kafka's
    answer from a broker that no longer leads is NOT_LEADER_OR_FOLLOWER:
    the client refreshes its metadata and goes to the leader."""
    boot = cluster["bootstrap"]
    topic = "zombie-leader"
    a = admin_client(",".join(boot))
    a.create_topics([NewTopic(topic, 1, 3)], request_timeout=30)[topic].result(30)
    meta = eventually("a leader", lambda: (t := a.list_topics(topic, timeout=10).topics.get(topic))
                      is not None and t.error is None and t.partitions[0].leader > 0 and t)
    leader = meta.partitions[0].leader
    p = Producer({"bootstrap.servers": ",".join(boot), "acks": "all"})
    for i in range(100):
        p.produce(topic, value=f"{i}".encode(), partition=0)
    assert p.flush(30) == 0
    pid = node_pid(cluster["workdir"], leader)
    others = [b for i, b in enumerate(boot) if i + 1 != leader]
    zombie = socket.create_connection(tuple(boot[leader - 1].rsplit(":", 1)), timeout=60)
    zombie.sendall(fetch_v4(topic, 0, 0, 1))
    assert read_partition_answer(zombie, 1, throttle=True)[0] == 0
    os.kill(pid, signal.SIGSTOP)
    try:
        rest = admin_client(",".join(others))
        eventually("the partition failed over", lambda: rest.list_topics(topic, timeout=5)
                   .topics[topic].partitions[0].leader not in (leader, -1), timeout=60)
        p = Producer({"bootstrap.servers": ",".join(others), "acks": "all"})
        for i in range(100, 200):
            p.produce(topic, value=f"{i}".encode(), partition=0)
        assert p.flush(60) == 0
        # Queued in the paused node's socket: served as soon as it wakes.
        zombie.sendall(fetch_v4(topic, 0, 150, 2) + list_offsets_v1_latest(topic, 0, 3))
    finally:
        os.kill(pid, signal.SIGCONT)
    fetch_error, _ = read_partition_answer(zombie, 2, throttle=True)
    list_error, rest_of = read_partition_answer(zombie, 3, throttle=False)
    zombie.close()
    _, latest = struct.unpack(">qq", rest_of[:16])
    assert fetch_error == 6, f"Fetch past the paused node's log: error {fetch_error}"
    assert (list_error, latest) in ((6, -1), (0, 200)), (list_error, latest)
    # Every record is still there, in order, from the new leader.
    c = Consumer({"bootstrap.servers": ",".join(boot), "group.id": "zombie-leader-check",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    seen = []
    deadline = time.monotonic() + 60
    while len(seen) < 200 and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            seen.append((m.offset(), m.value().decode()))
    c.close()
    assert seen == [(i, f"{i}") for i in range(200)], seen[:5]


@pytest.mark.cluster_overrides({"replica.placement.rebalance.interval.ms": "1000",
                                "auto.leader.rebalance.enable": "false"})
def test_unreplicated_topics_piled_on_one_broker_spread_under_load(cluster):
    """Replication factor 1 topics an operator put all on broker 1 spread
    over the cluster at their next segment boundaries (issue 23: RF=1
    ranges move whole; the new primary reads the older history from the
    old one). Real producers (idempotent and plain) write before, during
    and after the moves; a real consumer reads every acknowledged record
    back once, at its offset, through the new leaders."""
    boot = ",".join(cluster["bootstrap"])
    a = admin_client(boot)
    topics = [f"piled-{i}" for i in range(4)]
    futures = a.create_topics([NewTopic(t, 2, replica_assignment=[[1], [1]],
                                        config={"segment.bytes": "16384"}) for t in topics],
                              request_timeout=30)
    for f in futures.values():
        f.result(30)

    def leaders(t):
        md = a.list_topics(t, timeout=10).topics[t]
        return {p.id: p.leader for p in md.partitions.values()}

    assert all(set(leaders(t).values()) == {1} for t in topics)
    acks = Acks()
    idempotent = Producer({"bootstrap.servers": boot, "acks": "all", "enable.idempotence": True,
                           "linger.ms": 5})
    plain = Producer({"bootstrap.servers": boot, "acks": "1", "linger.ms": 5})

    def write(n: int, tag: str):
        for i in range(n):
            for k, t in enumerate(topics):
                (plain if k == 0 else idempotent).produce(
                    t, value=b"%s-%d" % (tag.encode(), i), partition=i % 2, on_delivery=acks)
            if i % 500 == 0:
                idempotent.poll(0)
                plain.poll(0)
        assert idempotent.flush(60) == 0 and plain.flush(60) == 0

    write(3000, "before")
    # A transaction aborted and one committed in every topic before the
    # moves: a read_committed consumer must still skip the aborted records
    # held by the old primary (the new one fetched `<seq>.aborted`).
    txp = Producer({"bootstrap.servers": boot, "transactional.id": "piled-txn"})
    txp.init_transactions(60)
    for outcome in ("aborted", "committed"):
        txp.begin_transaction()
        for t in topics:
            for i in range(50):
                txp.produce(t, value=b"%s-%d" % (outcome.encode(), i), partition=i % 2,
                            on_delivery=acks)
        txp.flush(60)
        (txp.abort_transaction if outcome == "aborted" else txp.commit_transaction)(60)

    def spread():
        write(200, "during")
        led = {b for t in topics for b in leaders(t).values()}
        return led == {1, 2, 3}

    eventually("the piled topics led by every broker", spread, timeout=90)
    write(3000, "after")
    assert acks.errors == [], acks.errors[:3]
    for t in topics:
        committed = {k: v for k, v in acks.of(t).items() if not v.startswith(b"aborted")}
        assert read_back({"bootstrap.servers": boot}, t, 2,
                         **{"isolation.level": "read_committed"}) == committed, t


@pytest.mark.cluster_overrides({"controller.quorum.fetch.timeout.ms": "20000",
                                "replica.lag.time.max.ms": "30000"})
def test_a_paused_controller_leader_resumes_without_fencing_anyone(cluster):
    """The active controller (the metadata quorum's leader) is paused
    (SIGSTOP) for longer than a broker session (3 s) but shorter than the
    voters wait before an election (`controller.quorum.fetch.timeout.ms`,
    Kafka's key, raised to 20 s here): it resumes still the leader, having
    heard no heartbeat while stopped. Every broker was alive throughout, so
    no range may fail over. Before, the resumed leader judged the sessions
    at once by its stale heartbeats: it fenced every broker, itself
    included, and sealed every range by quorum onto itself (the fault
    harness, seed 17: a 3 s pause). Now it judges sessions again only after
    a whole one."""
    boot = cluster["bootstrap"]
    create(",".join(boot), "paused-controller", 6)
    a = admin_client(",".join(boot))
    leader = a.describe_cluster(request_timeout=10).result(10).controller.id

    def active_segments():
        return {s["range"]: (s["seq"], s["leader_epoch"], tuple(s["replicas"]))
                for s in http(cluster["admin"][leader % len(boot)] + "/segments")
                if s["sealed_bytes"] is None}

    before = eventually("every node's image agrees",
                        lambda: (s := active_segments()) and len(s) >= 3 and s)
    time.sleep(2)
    before = active_segments()

    def fences():
        # What the active controller logs as it fences (broker_liveness).
        return (cluster["workdir"] / "cluster.log").read_text(errors="replace").count("FenceBroker {")

    fenced_before = fences()
    pid = node_pid(cluster["workdir"], leader)
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(4.5)
    finally:
        os.kill(pid, signal.SIGCONT)
    # Two sessions after it resumed.
    time.sleep(6)
    assert a.describe_cluster(request_timeout=10).result(10).controller.id == leader, \
        "the paused node lost its leadership: the pause did not test what it is for"
    assert fences() == fenced_before, "live brokers were fenced after the pause"
    after = active_segments()
    moved = {r: (before[r], after.get(r)) for r in before if after.get(r) != before[r]}
    assert not moved, f"ranges failed over though every broker was alive: {moved}"
