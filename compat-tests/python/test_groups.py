"""Consumer groups with the classic protocol, driven by real clients.

confluent-kafka (librdkafka 2.16) group consumers under a steady producer
(eager ``range`` and incremental ``cooperative-sticky``), static membership,
session expiry, kill -9 with committed offsets, kafka-python's group
consumer and admin client, kcat's ``-G`` balanced consumer (librdkafka
2.0.2), and the time an ordinary consumer takes to join an empty group.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

import procguard
from helpers import broker_log_lines, create_topic, unique_topic

# Short rebalance delays and a lower session-timeout floor keep the
# scenarios quick; the join-time test runs with the broker's defaults.
FAST = {"group.initial.rebalance.delay.ms": "300", "group.min.session.timeout.ms": "1000"}
KCAT = os.environ.get("KCAT") or shutil.which("kcat") or shutil.which("kafkacat")


def wait_for(predicate, timeout: float, what: str, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def kp_admin(broker):
    from kafka import KafkaAdminClient

    return KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=30000)


# ---------------------------------------------------------------------------
# A steady producer and group consumers that count every record.
# ---------------------------------------------------------------------------


class Ledger:
    """What was produced, delivered and committed, across all consumers."""

    def __init__(self):
        self.lock = threading.Lock()
        self.produced: set[int] = set()
        self.deliveries: dict[tuple[int, int], int] = {}
        self.values: set[int] = set()
        self.committed: dict[int, int] = {}
        self.duplicates = 0
        self.violations: list[str] = []

    def delivered(self, who: str, partition: int, offset: int, value: int):
        with self.lock:
            key = (partition, offset)
            n = self.deliveries.get(key, 0)
            if n:
                self.duplicates += 1
                # Redelivery is allowed only for a record no commit covered.
                if self.committed.get(partition, 0) > offset:
                    self.violations.append(
                        f"{who}: partition {partition} offset {offset} delivered again "
                        f"although offset {self.committed[partition]} was committed"
                    )
            self.deliveries[key] = n + 1
            self.values.add(value)

    def commit_ok(self, partition: int, next_offset: int):
        with self.lock:
            self.committed[partition] = max(self.committed.get(partition, 0), next_offset)


class SteadyProducer(threading.Thread):
    def __init__(self, broker, topic: str, partitions: int, ledger: Ledger, rate: float = 150.0):
        super().__init__(daemon=True)
        self.producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 5})
        self.topic, self.partitions, self.ledger, self.rate = topic, partitions, ledger, rate
        self.stop_event = threading.Event()
        self.errors: list[str] = []
        self.unflushed: int | None = None
        self.failed: BaseException | None = None

    def run(self):
        def acked(err, msg, value):
            if err is None:
                with self.ledger.lock:
                    self.ledger.produced.add(value)
            else:
                self.errors.append(str(err))

        try:
            i = 0
            while not self.stop_event.is_set():
                value = i
                self.producer.produce(
                    self.topic,
                    value=str(value).encode(),
                    partition=i % self.partitions,
                    on_delivery=lambda err, msg, v=value: acked(err, msg, v),
                )
                self.producer.poll(0)
                i += 1
                time.sleep(1.0 / self.rate)
            self.unflushed = self.producer.flush(30)
        except BaseException as e:  # noqa: BLE001 - reported by stop()
            self.failed = e

    def stop(self):
        """Stops producing; fails the test if the thread failed, a record
        was refused, or records were still queued after the flush."""
        self.stop_event.set()
        self.join(60)
        assert not self.is_alive(), "the producer did not stop"
        if self.failed is not None:
            raise AssertionError("the producer thread failed") from self.failed
        assert self.errors == [], self.errors[:5]
        assert self.unflushed == 0, f"{self.unflushed} records never acknowledged"


class GroupMember(threading.Thread):
    """A confluent-kafka group consumer committing after every record."""

    def __init__(self, broker, group: str, topic: str, ledger: Ledger | None, name: str,
                 strategy: str = "range", extra: dict | None = None):
        super().__init__(daemon=True, name=name)
        self.conf = {
            "bootstrap.servers": broker.bootstrap,
            "group.id": group,
            "client.id": name,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "partition.assignment.strategy": strategy,
            "heartbeat.interval.ms": 300,
            "session.timeout.ms": 10000,
        }
        self.conf.update(extra or {})
        self.topic, self.ledger, self.label = topic, ledger, name
        self.cooperative = strategy == "cooperative-sticky"
        self.lock = threading.Lock()
        self.assigned: set[int] = set()
        self.events = 0  # assign/revoke callbacks seen
        self.first_offsets: dict[int, int] = {}
        self.consumed = 0
        self.stop_event = threading.Event()
        self.failed: BaseException | None = None

    def on_assign(self, consumer, partitions):
        with self.lock:
            self.events += 1
            parts = {p.partition for p in partitions}
            self.assigned = self.assigned | parts if self.cooperative else parts

    def on_revoke(self, consumer, partitions):
        with self.lock:
            self.events += 1
            if self.cooperative:
                self.assigned -= {p.partition for p in partitions}
            else:
                self.assigned = set()

    def snapshot(self) -> set[int]:
        with self.lock:
            return set(self.assigned)

    def run(self):
        try:
            c = Consumer(self.conf)
            c.subscribe([self.topic], on_assign=self.on_assign, on_revoke=self.on_revoke,
                        on_lost=self.on_revoke)
            while not self.stop_event.is_set():
                m = c.poll(0.1)
                if m is None:
                    continue
                if m.error():
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        continue
                    raise KafkaException(m.error())  # reported by stop()
                self.first_offsets.setdefault(m.partition(), m.offset())
                self.consumed += 1
                if self.ledger is not None:
                    self.ledger.delivered(self.label, m.partition(), m.offset(), int(m.value()))
                try:
                    c.commit(message=m, asynchronous=False)
                    if self.ledger is not None:
                        self.ledger.commit_ok(m.partition(), m.offset() + 1)
                except KafkaException:
                    pass  # fenced by a rebalance: the next owner may see it again
            c.close()
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.failed = e

    def stop(self):
        self.stop_event.set()
        self.join(30)
        assert not self.is_alive(), f"{self.label} did not close"
        assert self.failed is None, f"{self.label} failed: {self.failed!r}"


def wait_balanced(members: list[GroupMember], partitions: int, timeout: float = 60.0):
    """Every partition owned by exactly one member, every member owning some,
    unchanged for a second."""
    last = None
    stable_since = None

    def balanced():
        nonlocal last, stable_since
        owned = [m.snapshot() for m in members]
        union = set().union(*owned)
        ok = (
            union == set(range(partitions))
            and sum(len(o) for o in owned) == partitions
            and all(owned)
        )
        key = tuple(tuple(sorted(o)) for o in owned)
        if not ok:
            last, stable_since = None, None
            return False
        if key != last:
            last, stable_since = key, time.monotonic()
            return False
        return time.monotonic() - stable_since >= 1.0 and owned

    owned = wait_for(balanced, timeout, f"{len(members)} members to share {partitions} partitions")
    for m in members:
        assert m.failed is None, f"{m.label} failed: {m.failed!r}"
    return owned


def describe(broker, group: str) -> dict:
    return kp_admin(broker).describe_groups([group])[group]


# ---------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------


def test_join_time_with_client_defaults(broker):
    """One consumer with client defaults joins an empty group: the broker's
    initial rebalance delay (3 s by default) dominates."""
    topic = unique_topic("join-time")
    create_topic(broker, topic, partitions=3)
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": unique_topic("jt")})
    assigned = []
    start = time.monotonic()
    c.subscribe([topic], on_assign=lambda _c, parts: assigned.append((time.monotonic(), parts)))
    try:
        while not assigned and time.monotonic() - start < 15:
            c.poll(0.05)
        settle = time.monotonic() + 2.0
        while time.monotonic() < settle:
            c.poll(0.05)
    finally:
        c.close()
    assert assigned, "no assignment within 15 s"
    elapsed = assigned[0][0] - start
    print(f"\njoin time (subscribe -> assignment), client defaults: {elapsed * 1000:.0f} ms")
    assert sorted(p.partition for p in assigned[0][1]) == [0, 1, 2]
    # One join, one generation: the delay is waited once, not per member,
    # and a lone member is never rebalanced again (the time is a figure,
    # printed above; machines here are too noisy to bound it).
    assert len(assigned) == 1, assigned


@pytest.mark.parametrize("strategy", ["range", "cooperative-sticky"])
def test_rebalances_under_load_lose_nothing(broker_factory, strategy):
    broker = broker_factory(overrides=FAST)
    topic = unique_topic(f"grp-{strategy[:4]}")
    partitions = 12
    create_topic(broker, topic, partitions=partitions)
    group = unique_topic("g")
    ledger = Ledger()
    producer = SteadyProducer(broker, topic, partitions, ledger)
    producer.start()
    members = [GroupMember(broker, group, topic, ledger, f"c{i}", strategy) for i in range(3)]
    for m in members:
        m.start()
    try:
        owned = wait_balanced(members, partitions)
        assert sorted(len(o) for o in owned) == [4, 4, 4], owned
        d = describe(broker, group)
        assert d["group_state"] == "Stable" and len(d["members"]) == 3, d
        assert d["protocol_data"] == strategy, "the client's assignor was selected"
        time.sleep(2)

        fourth = GroupMember(broker, group, topic, ledger, "c3", strategy)
        fourth.start()
        members.append(fourth)
        owned = wait_balanced(members, partitions)
        assert sorted(len(o) for o in owned) == [3, 3, 3, 3], owned
        time.sleep(2)

        leaving = members.pop(0)
        leaving.stop()
        owned = wait_balanced(members, partitions)
        assert sorted(len(o) for o in owned) == [4, 4, 4], owned
        time.sleep(2)
    finally:
        producer.stop()

    wait_for(lambda: ledger.produced and ledger.produced <= ledger.values, 60,
             "every produced record to be consumed")
    for m in members:
        m.stop()
    missing = ledger.produced - ledger.values
    print(f"\n{strategy}: produced {len(ledger.produced)}, delivered "
          f"{sum(ledger.deliveries.values())}, duplicates {ledger.duplicates}")
    assert len(ledger.produced) > 500
    assert not missing, f"{len(missing)} records lost"
    assert not ledger.violations, ledger.violations[:5]


def test_kafka_python_group_consumer_and_admin(broker_factory):
    from kafka import KafkaConsumer

    broker = broker_factory(overrides=FAST)
    topic = unique_topic("kp-grp")
    create_topic(broker, topic, partitions=3)
    p = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(30):
        p.produce(topic, value=b"v%d" % i, partition=i % 3)
    p.flush()
    group = unique_topic("kpg")
    kc = KafkaConsumer(topic, bootstrap_servers=broker.bootstrap, group_id=group,
                       auto_offset_reset="earliest", enable_auto_commit=False,
                       client_id="kp-client")
    got = []
    deadline = time.monotonic() + 30
    while len(got) < 30 and time.monotonic() < deadline:
        for records in kc.poll(timeout_ms=500).values():
            got.extend(records)
    assert len(got) == 30
    kc.commit()

    admin = kp_admin(broker)
    listed = {g["group_id"]: g for g in admin.list_groups()}
    assert listed[group]["protocol_type"] == "consumer"
    assert listed[group]["group_state"] == "Stable"
    stable = {g["group_id"] for g in admin.list_groups(states_filter=["Stable"])}
    assert group in stable
    d = admin.describe_groups([group])[group]
    assert d["group_state"] == "Stable", d
    assert d["protocol_type"] == "consumer" and d["protocol_data"], d
    [member] = d["members"]
    assert member["client_id"] == "kp-client"
    assert member["client_host"] == "/127.0.0.1"
    offsets = admin.list_group_offsets(group)[group]
    assert {tp.partition: om.offset for tp, om in offsets.items()} == {0: 10, 1: 10, 2: 10}

    # A group with members cannot be deleted.
    assert admin.delete_groups([group]) == {group: "NonEmptyGroupError"}
    kc.close()
    d = wait_for(lambda: (x := describe(broker, group))["group_state"] == "Empty" and x, 15,
                 "the group to be empty")
    assert d["members"] == []
    assert admin.delete_groups([group]) == {group: "OK"}
    assert group not in {g["group_id"] for g in admin.list_groups()}
    assert admin.delete_groups([group]) == {group: "GroupIdNotFoundError"}
    # Its offsets are gone with it.
    assert admin.list_group_offsets({group: None})[group] == {}


def test_static_member_restart_keeps_its_partitions(broker_factory):
    broker = broker_factory(overrides=FAST)
    topic = unique_topic("static")
    create_topic(broker, topic, partitions=6)
    group = unique_topic("sg")
    conf = lambda instance: {"group.instance.id": instance, "session.timeout.ms": 6000}  # noqa: E731
    a = GroupMember(broker, group, topic, None, "a", extra=conf("inst-a"))
    b = GroupMember(broker, group, topic, None, "b", extra=conf("inst-b"))
    a.start()
    b.start()
    owned_a, owned_b = wait_balanced([a, b], 6)
    members_before = {m["member_id"] for m in describe(broker, group)["members"]}
    b_events = b.events

    # a goes away (a static member sends no LeaveGroup) and comes back at once.
    a.stop()
    a2 = GroupMember(broker, group, topic, None, "a2", extra=conf("inst-a"))
    a2.start()
    wait_for(lambda: a2.snapshot(), 20, "the restarted static member's assignment")
    time.sleep(2)
    assert a2.snapshot() == owned_a, "the static member got its own partitions back"
    assert b.snapshot() == owned_b
    assert b.events == b_events, "the other member did not rebalance"
    d = describe(broker, group)
    assert d["group_state"] == "Stable"
    members_after = {m["member_id"] for m in d["members"]}
    assert len(members_after) == 2 and members_after != members_before
    assert {m["group_instance_id"] for m in d["members"]} == {"inst-a", "inst-b"}
    a2.stop()
    b.stop()


CHILD_CONSUMER = r"""
import sys, time
from confluent_kafka import Consumer
bootstrap, group, topic = sys.argv[1:4]
c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "client.id": "child",
              "session.timeout.ms": 3000, "heartbeat.interval.ms": 300,
              "auto.offset.reset": "earliest"})
c.subscribe([topic], on_assign=lambda _c, p: print("assigned", len(p), flush=True))
while True:
    c.poll(0.1)
"""


def test_silent_member_expires_after_session_timeout(broker_factory):
    broker = broker_factory(overrides=FAST)
    topic = unique_topic("expire")
    create_topic(broker, topic, partitions=6)
    group = unique_topic("eg")
    a = GroupMember(broker, group, topic, None, "a")
    a.start()
    wait_for(lambda: a.snapshot() == set(range(6)), 30, "a to own everything")
    child = procguard.spawn([sys.executable, "-c", CHILD_CONSUMER, broker.bootstrap, group, topic],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert child.stdout.readline().startswith("assigned"), "the child joined"
        wait_for(lambda: len(a.snapshot()) == 3, 30, "a to give up half")
        time.sleep(1)
        assert not [ln for ln in broker_log_lines(broker, "member session expired") if group in ln]
        # kill -9: no LeaveGroup, no more heartbeats.
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        killed = time.monotonic()
        wait_for(lambda: a.snapshot() == set(range(6)), 30, "a to get the silent member's partitions")
        elapsed = time.monotonic() - killed
        print(f"\nsilent member's partitions moved after {elapsed:.1f} s (session.timeout.ms=3000)")
        # The broker removed it for its session (after the kill, not before),
        # the event a LeaveGroup would not log.
        expired = broker_log_lines(broker, "member session expired")
        assert any(group in line for line in expired), expired
        assert len(describe(broker, group)["members"]) == 1
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
        a.stop()


def test_member_past_max_poll_interval_is_removed_and_its_late_commit_refused(broker_factory):
    """A consumer that stops polling for longer than max.poll.interval.ms
    loses its partitions to the rest of the group; when it wakes, its commit
    is refused and the group's offsets are the ones the new owner commits.
    (The broker side, a member that never rejoins within its rebalance
    timeout, is `groups_wire.rs`'s
    a_member_past_its_rebalance_timeout_is_removed_and_its_late_commit_refused.)"""
    broker = broker_factory(overrides=FAST)
    topic = unique_topic("maxpoll")
    create_topic(broker, topic, partitions=4)
    p = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(200):
        p.produce(topic, value=str(i).encode(), partition=i % 4)
    assert p.flush(30) == 0
    group = unique_topic("mp")
    stuck = Consumer({
        "bootstrap.servers": broker.bootstrap, "group.id": group, "client.id": "stuck",
        "auto.offset.reset": "earliest", "enable.auto.commit": False,
        "session.timeout.ms": 3000, "heartbeat.interval.ms": 300, "max.poll.interval.ms": 4000,
    })
    stuck.subscribe([topic])
    seen: dict[int, int] = {}
    try:
        deadline = time.monotonic() + 30
        while len(seen) < 4 and time.monotonic() < deadline:
            m = stuck.poll(0.2)
            if m is not None and not m.error():
                seen[m.partition()] = m.offset()
        assert sorted(seen) == [0, 1, 2, 3], seen
        # Commit a position inside each partition: the new owner starts there.
        mine = [TopicPartition(topic, part, 10) for part in range(4)]
        stuck.commit(offsets=mine, asynchronous=False)

        # Now the application hangs (no poll); a second member joins.
        other = GroupMember(broker, group, topic, None, "other")
        other.start()
        wait_for(lambda: other.snapshot() == {0, 1, 2, 3} and len(other.first_offsets) == 4, 60,
                 "the other member to own and read every partition")
        firsts = dict(other.first_offsets)

        # It wakes up: its commit is refused, and changes nothing.
        with pytest.raises(KafkaException):
            stuck.commit(offsets=[TopicPartition(topic, part, 150) for part in range(4)],
                         asynchronous=False)
        # The poll tells the application it was out of the group.
        errors = []
        wake_deadline = time.monotonic() + 10
        while time.monotonic() < wake_deadline and not errors:
            m = stuck.poll(0.2)
            if m is not None and m.error():
                errors.append(m.error().code())
        assert KafkaError._MAX_POLL_EXCEEDED in errors, errors
        other.stop()
        # The new owner started at the stuck member's last good commit.
        assert firsts == {part: 10 for part in range(4)}, firsts
        probe = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
        try:
            committed = probe.committed([TopicPartition(topic, part) for part in range(4)], timeout=10)
        finally:
            probe.close()
        assert all(tp.offset != 150 for tp in committed), committed
        assert all(tp.offset >= 10 for tp in committed), committed
    finally:
        stuck.close()


def test_committed_offsets_survive_kill9(broker_factory):
    from kafka import KafkaConsumer

    broker = broker_factory(overrides=FAST)
    topic = unique_topic("k9")
    create_topic(broker, topic, partitions=4)
    p = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})

    def produce(n):
        for i in range(n):
            p.produce(topic, value=b"%d" % i, partition=i % 4)
        p.flush()

    produce(400)
    # 1. a confluent group consumer that consumed part of the topic and left.
    g_sub = unique_topic("sub")
    m = GroupMember(broker, g_sub, topic, None, "sub")
    m.start()
    wait_for(lambda: m.consumed >= 150, 30, "150 records")
    m.stop()
    # 2. a simple consumer (assign + commit, no group membership).
    g_simple = unique_topic("simple")
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": g_simple,
                  "enable.auto.commit": False})
    c.commit(offsets=[TopicPartition(topic, i, 11 * (i + 1)) for i in range(4)], asynchronous=False)
    c.close()
    # 3. kafka-python's group consumer.
    g_kp = unique_topic("kp")
    kc = KafkaConsumer(topic, bootstrap_servers=broker.bootstrap, group_id=g_kp,
                       auto_offset_reset="earliest", enable_auto_commit=False)
    n = 0
    deadline = time.monotonic() + 30
    while n < 100 and time.monotonic() < deadline:
        n += sum(len(r) for r in kc.poll(timeout_ms=500, max_records=25).values())
        kc.commit()
    kc.close()
    # 4. a live member, still consuming when the broker dies.
    g_live = unique_topic("live")
    live = GroupMember(broker, g_live, topic, None, "live")
    live.start()
    wait_for(lambda: live.consumed >= 400, 30, "the live member to catch up")

    admin = kp_admin(broker)
    groups = [g_sub, g_simple, g_kp, g_live]

    def live_committed():
        offsets = admin.list_group_offsets(g_live)[g_live]
        return sum(om.offset for om in offsets.values()) == 400

    wait_for(live_committed, 30, "the live member's commits")
    before = {g: admin.list_group_offsets(g)[g] for g in groups}
    admin.close()
    assert all(before.values()), before
    assert {tp.partition: om.offset for tp, om in before[g_simple].items()} == {0: 11, 1: 22, 2: 33, 3: 44}

    broker.restart(kill=True)

    admin = kp_admin(broker)
    after = {g: admin.list_group_offsets(g)[g] for g in groups}
    assert after == before, "committed offsets came back unchanged"
    listed = {g["group_id"] for g in admin.list_groups()}
    assert set(groups) <= listed

    # The live member carries on with new records; the others resume from their commits.
    produce(40)
    wait_for(lambda: live.consumed >= 440, 60, "the live member to get the new records")
    resumed = GroupMember(broker, g_sub, topic, None, "sub2")
    resumed.start()
    committed = {tp.partition: om.offset for tp, om in before[g_sub].items()}
    remaining = 440 - sum(committed.values())
    wait_for(lambda: resumed.consumed >= remaining, 30, f"{remaining} remaining records")
    time.sleep(0.5)
    assert resumed.consumed == remaining, "nothing before the committed offsets again"
    # Partitions without a commit start over (auto.offset.reset=earliest).
    expected = {p: committed.get(p, 0) for p in range(4)}
    assert resumed.first_offsets == {p: o for p, o in expected.items() if o < 110}
    resumed.stop()
    live.stop()


@pytest.mark.skipif(KCAT is None, reason="kcat not installed (scripts/test.sh installs it)")
def test_kcat_balanced_consumer(broker_factory):
    """kcat -G (librdkafka 2.0.2): joins, consumes, commits; a second run
    starts from the commit."""
    broker = broker_factory(overrides=FAST)
    topic = unique_topic("kcat-g")
    create_topic(broker, topic, partitions=3)
    p = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(300):
        p.produce(topic, value=b"line-%d" % i, partition=i % 3)
    p.flush()
    group = unique_topic("kg")

    def run():
        cmd = [KCAT, "-b", broker.bootstrap, "-G", group, "-X", "auto.offset.reset=earliest",
               "-e", "-q", topic]
        r = subprocess.run(cmd, capture_output=True, timeout=60)
        assert r.returncode == 0, r.stderr.decode(errors="replace")[-2000:]
        return [line for line in r.stdout.split(b"\n") if line]

    assert len(run()) == 300
    offsets = kp_admin(broker).list_group_offsets(group)[group]
    assert {tp.partition: om.offset for tp, om in offsets.items()} == {0: 100, 1: 100, 2: 100}
    for i in range(30):
        p.produce(topic, value=b"more-%d" % i, partition=i % 3)
    p.flush()
    again = run()
    assert sorted(again) == sorted(b"more-%d" % i for i in range(30))


def test_a_join_waiting_when_the_coordinator_reloads_its_partition_is_answered(broker_factory):
    """A member's JoinGroup is waiting for the group's other member to
    rejoin when the group's `__consumer_offsets` range is split (the
    coordinator unloads and reloads the group's partition). Kafka answers
    the waiting JoinGroup NOT_COORDINATOR and the client joins again; the
    group then forms with both members. Before, the waiting request held
    the unloaded group alive and was never answered: the joiner stayed out
    of the group until its request timed out (max.poll.interval.ms, 5
    minutes; and a commit queued behind it waited as long, the fault
    harness's "stuck in commit")."""
    from confluent_kafka import ConsumerGroupState
    from confluent_kafka.admin import AdminClient
    from test_elastic_ranges import admin_call
    from test_replica_sets import kafka_partition_for

    broker = broker_factory(overrides=FAST)
    broker.single_node("splits a range through one broker's admin port, which may not lead it")
    topic = unique_topic("reload")
    create_topic(broker, topic, partitions=4)
    group = unique_topic("rg")
    first = Consumer({
        "bootstrap.servers": broker.bootstrap, "group.id": group, "client.id": "first",
        "auto.offset.reset": "earliest", "enable.auto.commit": False,
        "session.timeout.ms": 6000, "heartbeat.interval.ms": 300,
    })
    first.subscribe([topic])
    joiner = None
    try:
        wait_for(lambda: first.poll(0.2) is None and len(first.assignment()) == 4, 30,
                 "the first member to own every partition")
        # The first member's application stops polling: it cannot rejoin,
        # so the joiner's JoinGroup waits (up to the first member's
        # rebalance timeout, max.poll.interval.ms, 5 minutes).
        joiner = GroupMember(broker, group, topic, None, "joiner")
        joiner.start()
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})

        def preparing():
            [future] = admin.describe_consumer_groups([group]).values()
            return future.result(10).state == ConsumerGroupState.PREPARING_REBALANCING

        wait_for(preparing, 30, "the group to wait for its members to join")
        time.sleep(1)  # the joiner's JoinGroup is waiting in the coordinator

        offsets = kafka_partition_for(group, 50)
        [rng] = [r for r in admin_call(broker, "GET", "/ranges")
                 if r["topic"] == "__consumer_offsets" and r["active"]
                 and r["lo"] <= offsets < r["hi"]]
        admin_call(broker, "POST", f"/ranges/split?range={rng['id']}")

        # The first member polls again and rejoins the reloaded group; the
        # joiner, answered, joins it too.
        def both_own_some():
            first.poll(0.1)
            return len(first.assignment()) in (1, 2, 3) and joiner.snapshot()

        wait_for(both_own_some, 60, "the joiner to be in the group with the first member")
        assert len(first.assignment()) + len(joiner.snapshot()) == 4
    finally:
        first.close()
        if joiner is not None:
            joiner.stop()
