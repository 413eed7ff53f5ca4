"""KIP-848 consumer groups (`group.protocol=consumer`) with confluent-kafka.

Three consumers share a 12-partition topic while a producer keeps writing;
a fourth joins, then one leaves. Throughout:

* no partition is ever held by two consumers at once (checked on every
  assignment change reported by the rebalance callbacks);
* after each change the group settles with every partition owned by exactly
  one member (as the consumers see it, and as ConsumerGroupDescribe reports);
* at the end every produced record was consumed, and a record was consumed
  twice only if it lay beyond the last offset committed for its partition
  when the next owner took over (consumers commit synchronously as they go
  and when partitions are revoked, so in practice there are none).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import defaultdict

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from helpers import consumer_group_epochs, create_topic, unique_topic

PARTITIONS = 12
SETTLE_TIMEOUT_S = 30.0


class Ledger:
    """Everything the consumers did, with the invariant checks."""

    def __init__(self):
        self.lock = threading.Lock()
        self.owned: dict[str, set[int]] = {}
        self.overlaps: list[str] = []
        # (partition, offset) -> list of (consumer, time)
        self.consumed: dict[tuple[int, int], list[tuple[str, float]]] = defaultdict(list)
        # partition -> list of (time, committed offset)
        self.commits: dict[int, list[tuple[float, int]]] = defaultdict(list)
        # partition -> list of (time, consumer, first offset) per ownership run
        self.runs: dict[int, list[tuple[float, str, int]]] = defaultdict(list)
        self.commit_errors: list[str] = []

    def set_owned(self, name: str, parts: set[int]):
        with self.lock:
            self.owned[name] = set(parts)
            seen: dict[int, str] = {}
            for who, ps in self.owned.items():
                for p in ps:
                    if p in seen:
                        self.overlaps.append(f"partition {p} held by {seen[p]} and {who}")
                    seen[p] = who

    def snapshot(self) -> dict[str, set[int]]:
        with self.lock:
            return {k: set(v) for k, v in self.owned.items()}


class GroupConsumer:
    """A consumer on its own thread: processes, commits, reports ownership."""

    def __init__(self, broker, group: str, topic: str, name: str, ledger: Ledger):
        self.name = name
        self.ledger = ledger
        self.topic = topic
        self.stop = threading.Event()
        self.next_offset: dict[int, int] = {}
        self.committed: dict[int, int] = {}
        self.started: set[int] = set()
        self.errors: list[str] = []
        self.consumer = Consumer(
            {
                "bootstrap.servers": broker.bootstrap,
                "group.id": group,
                "group.protocol": "consumer",
                "client.id": name,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
        self.thread = threading.Thread(target=self.run, name=name, daemon=True)

    # -- rebalance callbacks (run on this consumer's thread, inside poll) --
    def on_assign(self, consumer, partitions):
        mine = set(self.ledger.snapshot().get(self.name, set()))
        for tp in partitions:
            mine.add(tp.partition)
            self.started.discard(tp.partition)
        self.ledger.set_owned(self.name, mine)

    def on_revoke(self, consumer, partitions):
        revoked = {tp.partition for tp in partitions}
        self.commit(only=revoked)
        mine = set(self.ledger.snapshot().get(self.name, set())) - revoked
        self.ledger.set_owned(self.name, mine)
        for p in revoked:
            self.next_offset.pop(p, None)

    def on_lost(self, consumer, partitions):
        lost = {tp.partition for tp in partitions}
        mine = set(self.ledger.snapshot().get(self.name, set())) - lost
        self.ledger.set_owned(self.name, mine)
        for p in lost:
            self.next_offset.pop(p, None)

    def commit(self, only: set[int] | None = None):
        offsets = [
            TopicPartition(self.topic, p, o)
            for p, o in self.next_offset.items()
            if (only is None or p in only) and self.committed.get(p) != o
        ]
        if not offsets:
            return
        try:
            result = self.consumer.commit(offsets=offsets, asynchronous=False)
        except Exception as e:  # noqa: BLE001 - recorded, checked by the test
            with self.ledger.lock:
                self.ledger.commit_errors.append(f"{self.name}: {e}")
            return
        now = time.monotonic()
        with self.ledger.lock:
            for tp in result:
                if tp.error is None:
                    self.ledger.commits[tp.partition].append((now, tp.offset))
                    self.committed[tp.partition] = tp.offset
                else:
                    self.ledger.commit_errors.append(f"{self.name}: {tp}")

    def run(self):
        self.consumer.subscribe(
            [self.topic], on_assign=self.on_assign, on_revoke=self.on_revoke, on_lost=self.on_lost
        )
        last_commit = time.monotonic()
        while not self.stop.is_set():
            msgs = self.consumer.consume(num_messages=200, timeout=0.2)
            now = time.monotonic()
            for m in msgs:
                if m.error():
                    if m.error().code() != KafkaError._PARTITION_EOF:
                        self.errors.append(str(m.error()))
                    continue
                p, o = m.partition(), m.offset()
                with self.ledger.lock:
                    self.ledger.consumed[(p, o)].append((self.name, now))
                    if p not in self.started:
                        self.started.add(p)
                        self.ledger.runs[p].append((now, self.name, o))
                self.next_offset[p] = o + 1
            if now - last_commit > 0.3:
                self.commit()
                last_commit = now
        self.commit()
        # close() revokes (and commits, in on_revoke) and leaves the group.
        self.consumer.close()
        self.ledger.set_owned(self.name, set())

    def start(self):
        self.thread.start()
        return self

    def close(self, timeout: float = 30.0):
        self.stop.set()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"{self.name} did not close"


class SteadyProducer:
    def __init__(self, broker, topic: str, rate_per_s: int = 400):
        self.topic = topic
        self.rate = rate_per_s
        self.stop = threading.Event()
        self.delivered: set[tuple[int, int]] = set()
        self.failed: list[str] = []
        self.crashed: BaseException | None = None
        self.unflushed: int | None = None
        self.producer = Producer(
            {"bootstrap.servers": broker.bootstrap, "linger.ms": 5, "acks": "all"}
        )
        self.thread = threading.Thread(target=self.run, name="producer", daemon=True)

    def on_delivery(self, err, msg):
        if err is not None:
            self.failed.append(str(err))
        else:
            self.delivered.add((msg.partition(), msg.offset()))

    def run(self):
        # Whatever ends this thread reaches the test through `close`: an
        # exception, or records still queued after the final flush.
        try:
            i = 0
            start = time.monotonic()
            while not self.stop.is_set():
                try:
                    self.producer.produce(
                        self.topic,
                        key=str(i).encode(),
                        value=f"record-{i}".encode(),
                        partition=i % PARTITIONS,
                        on_delivery=self.on_delivery,
                    )
                except BufferError:
                    self.producer.poll(0.05)
                    continue
                i += 1
                self.producer.poll(0)
                ahead = i / self.rate - (time.monotonic() - start)
                if ahead > 0:
                    time.sleep(ahead)
            self.unflushed = self.producer.flush(30)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            self.crashed = e

    def start(self):
        self.thread.start()
        return self

    def close(self):
        self.stop.set()
        self.thread.join(60)
        assert not self.thread.is_alive()
        if self.crashed is not None:
            raise AssertionError("the producer thread failed") from self.crashed
        assert self.unflushed == 0, f"{self.unflushed} records never acknowledged"


def wait_settled(ledger: Ledger, names: list[str], timeout: float = SETTLE_TIMEOUT_S):
    """Until the named consumers own the partitions evenly and exactly once."""
    deadline = time.monotonic() + timeout
    quota = PARTITIONS // len(names)
    last = None
    while time.monotonic() < deadline:
        owned = ledger.snapshot()
        last = {n: sorted(owned.get(n, set())) for n in names}
        everyone = [p for n in names for p in owned.get(n, set())]
        if (
            sorted(everyone) == list(range(PARTITIONS))
            and all(len(owned.get(n, set())) == quota for n in names)
            and not any(owned.get(n) for n in owned if n not in names)
        ):
            return last
        time.sleep(0.1)
    raise AssertionError(f"group did not settle on {names}: {last}")


def describe_group(broker, group: str, members: int, timeout: float = SETTLE_TIMEOUT_S):
    """ConsumerGroupDescribe through the AdminClient: a consumer-type group,
    `members` members, every partition in exactly one member's assignment."""
    a = AdminClient({"bootstrap.servers": broker.bootstrap})
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        d = a.describe_consumer_groups([group])[group].result(timeout=10)
        last = d
        parts = [
            tp.partition for m in d.members for tp in m.assignment.topic_partitions
        ]
        if len(d.members) == members and sorted(parts) == list(range(PARTITIONS)) and (
            str(d.state).endswith("STABLE")
        ):
            assert str(d.type).endswith("CONSUMER"), d.type
            return d
        time.sleep(0.2)
    raise AssertionError(f"describe never showed {members} stable members: {last}")


def members_and_partitions(d) -> list[tuple[str, list[int]]]:
    return sorted(
        (m.member_id, sorted(tp.partition for tp in m.assignment.topic_partitions))
        for m in d.members
    )


@pytest.mark.broker_overrides({"group.consumer.heartbeat.interval.ms": "500"})
def test_consumer_protocol_group_rebalances_without_overlap_or_loss(broker):
    topic = unique_topic("kip848")
    group = f"g-{uuid.uuid4().hex[:8]}"
    create_topic(broker, topic, partitions=PARTITIONS)
    ledger = Ledger()

    producer = SteadyProducer(broker, topic).start()
    consumers = {
        n: GroupConsumer(broker, group, topic, n, ledger).start() for n in ("c1", "c2", "c3")
    }
    try:
        settled = wait_settled(ledger, ["c1", "c2", "c3"])
        assert all(len(v) == 4 for v in settled.values()), settled
        describe_group(broker, group, 3)

        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        listed = admin.list_consumer_groups().result(timeout=10)
        mine = [g for g in listed.valid if g.group_id == group]
        assert mine and str(mine[0].type).endswith("CONSUMER"), (listed.valid, listed.errors)

        time.sleep(2.0)
        consumers["c4"] = GroupConsumer(broker, group, topic, "c4", ledger).start()
        settled = wait_settled(ledger, ["c1", "c2", "c3", "c4"])
        assert all(len(v) == 3 for v in settled.values()), settled
        describe_group(broker, group, 4)

        time.sleep(2.0)
        consumers.pop("c2").close()
        wait_settled(ledger, ["c1", "c3", "c4"])
        describe_group(broker, group, 3)
        time.sleep(2.0)
    finally:
        producer.close()

    # Let the remaining consumers catch up with everything produced.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with ledger.lock:
            missing = producer.delivered - set(ledger.consumed)
        if not missing:
            break
        time.sleep(0.2)
    for c in consumers.values():
        c.close()

    assert not producer.failed, producer.failed[:5]
    assert len(producer.delivered) > 1000, len(producer.delivered)
    assert not ledger.overlaps, ledger.overlaps[:5]
    for c in consumers.values():
        assert not c.errors, (c.name, c.errors[:5])

    # A failed commit would also widen the window where check_consumed
    # accepts a record consumed again.
    assert not ledger.commit_errors, ledger.commit_errors[:5]
    total_dupes = check_consumed(ledger, producer.delivered)
    print(
        f"delivered={len(producer.delivered)} consumed={len(ledger.consumed)} "
        f"redelivered={total_dupes} commits={sum(len(c) for c in ledger.commits.values())}"
    )


def check_consumed(ledger: Ledger, delivered: set[tuple[int, int]]):
    """Every record consumed; a record consumed again only at or beyond the
    partition's last commit before the run that consumed it again began."""
    with ledger.lock:
        missing = sorted(delivered - set(ledger.consumed))
    assert not missing, f"{len(missing)} records never consumed, e.g. {missing[:10]}"

    def committed_before(p: int, t: float) -> int:
        before = [o for (ct, o) in ledger.commits[p] if ct <= t]
        return max(before) if before else 0

    dupes = []
    for (p, o), events in ledger.consumed.items():
        for who, t in events[1:]:
            runs = [r for r in ledger.runs[p] if r[1] == who and r[0] <= t]
            run_start = runs[-1][0] if runs else t
            if o < committed_before(p, run_start):
                dupes.append((p, o, [e[0] for e in events]))
    assert not dupes, f"records consumed again below the last commit: {dupes[:10]}"
    return sum(len(e) - 1 for e in ledger.consumed.values())


@pytest.mark.broker_overrides({"group.consumer.heartbeat.interval.ms": "500"})
def test_consumer_protocol_group_survives_a_broker_restart(broker):
    """The group is durable (KIP-848 records in __consumer_offsets): after a
    restart the same members are back at the same epochs and carry on
    consuming, without rejoining."""
    broker.require_persistence()
    broker.single_node(
        "after a whole cluster's restart one consumer's close() hung past 30 s in 1 of 3 "
        "runs (not investigated yet; docs/COMPATIBILITY.md)"
    )
    topic = unique_topic("kip848-restart")
    group = f"g-{uuid.uuid4().hex[:8]}"
    create_topic(broker, topic, partitions=PARTITIONS)
    ledger = Ledger()
    producer = SteadyProducer(broker, topic, rate_per_s=200).start()
    consumers = {n: GroupConsumer(broker, group, topic, n, ledger).start() for n in ("r1", "r2")}
    try:
        wait_settled(ledger, ["r1", "r2"])
        time.sleep(2.0)
        settled = describe_group(broker, group, 2)
        epochs = consumer_group_epochs(broker.bootstrap, group)
        assert sorted(epochs[1]) == sorted(m.member_id for m in settled.members), epochs
        assert epochs[0] > 0 and all(e > 0 for e in epochs[1].values()), epochs
        log_mark = broker.log_path.stat().st_size if broker.log_path.exists() else 0
        broker.restart()
        with ledger.lock:
            before = len(ledger.consumed)
        # Consumption resumes and the group settles again.
        wait_settled(ledger, ["r1", "r2"], timeout=60)
        resumed = describe_group(broker, group, 2, timeout=60)
        # Same members with the same partitions at the same epochs (group
        # and members), and nobody rejoined.
        assert members_and_partitions(resumed) == members_and_partitions(settled), (
            settled,
            resumed,
        )
        assert consumer_group_epochs(broker.bootstrap, group) == epochs
        if broker.kind == "tessera":
            since = broker.log_path.read_bytes()[log_mark:].decode(errors="replace")
            rejoins = [
                line
                for line in since.splitlines()
                if "joins the consumer group" in line and group in line
            ]
            assert not rejoins, rejoins[:4]
        # Consumption goes on (a whole cluster's restart takes its
        # leaders a few seconds longer to serve than one node's).
        deadline = time.monotonic() + 30
        while True:
            time.sleep(0.5)
            with ledger.lock:
                if len(ledger.consumed) > before:
                    break
            assert time.monotonic() < deadline, "nothing consumed after the restart"
    finally:
        producer.close()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with ledger.lock:
            if not producer.delivered - set(ledger.consumed):
                break
        time.sleep(0.2)
    for c in consumers.values():
        c.close()
    assert not producer.failed, producer.failed[:5]
    redelivered = check_consumed(ledger, producer.delivered)
    print(f"delivered={len(producer.delivered)} redelivered={redelivered}")
