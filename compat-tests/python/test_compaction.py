"""Log compaction with real clients (confluent-kafka producing, confluent-kafka
and kafka-python consuming).

The issue's test: many updates to 1,000 keys end as one record per key plus
the tombstones, and a consumer of the compacted topic sees the latest value
of every key. CI runs ``COMPACTION_UPDATES`` updates (default 100,000); the
full 1,000,000 was run by hand (``COMPACTION_UPDATES=1000000``, see
docs/BENCHMARKS.md). And kill -9 in the middle of a cleaning pass (a
``.cleaned`` copy on disk), several times over: after each restart the
partitions hold every key's latest value, each offset at most once, and
nothing that was not produced."""

from __future__ import annotations

import os
import time

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from helpers import create_topic, unique_topic

UPDATES = int(os.environ.get("COMPACTION_UPDATES", "100000"))
KEYS = 1000
DELETED = 100
PARTITIONS = 3
TIMEOUT = 60


def produce(broker, topic: str, records, delivered: dict | None = None) -> None:
    """Produces `(key, value)` pairs (value None: a tombstone); records
    `(partition, offset) -> (key, value)` in `delivered`."""
    p = Producer({
        "bootstrap.servers": broker.bootstrap,
        "acks": "all",
        "linger.ms": 5,
        "enable.idempotence": True,
        "queue.buffering.max.messages": 1_000_000,
    })

    def done(err, msg):
        assert err is None, err
        if delivered is not None:
            delivered[(msg.partition(), msg.offset())] = (msg.key(), msg.value())

    for i, (k, v) in enumerate(records):
        while True:
            try:
                p.produce(topic, key=k, value=v, on_delivery=done)
                break
            except BufferError:
                p.poll(0.1)
        if i % 10_000 == 0:
            p.poll(0)
    assert p.flush(TIMEOUT * 5) == 0


def consume_all(broker, topic: str, isolation: str = "read_committed"
                ) -> list[tuple[int, int, bytes, bytes | None]]:
    """Every record of every partition, from the beginning to the end:
    `(partition, offset, key, value)`."""
    c = Consumer({
        "bootstrap.servers": broker.bootstrap,
        "group.id": unique_topic("compaction-reader"),
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "fetch.max.bytes": 8 << 20,
        "isolation.level": isolation,
    })
    try:
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        got = []
        at_end: set[int] = set()
        deadline = time.monotonic() + 120
        while len(at_end) < PARTITIONS and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    at_end.add(m.partition())
                    continue
                raise AssertionError(m.error())
            at_end.discard(m.partition())
            got.append((m.partition(), m.offset(), m.key(), m.value()))
        assert len(at_end) == PARTITIONS, "read every partition to its end"
        return got
    finally:
        c.close()


def latest_per_key(records) -> dict[bytes, bytes | None]:
    out = {}
    for _, _, k, v in sorted(records, key=lambda r: (r[0], r[1])):
        out[k] = v
    return out


def check_consistent(records, delivered: dict) -> None:
    """Offsets strictly increase per partition and every record is one
    that was produced at that offset."""
    last = {}
    for p, o, k, v in records:
        assert o > last.get(p, -1), f"offset {o} of partition {p} twice or out of order"
        last[p] = o
        assert delivered.get((p, o)) == (k, v), f"record at {p}/{o} was not produced"


def wait_compacted(broker, topic: str, want: int, timeout: float = 240):
    """Reads the topic until it holds `want` records (the cleaner runs in
    the background); returns them."""
    deadline = time.monotonic() + timeout
    records = []
    while time.monotonic() < deadline:
        records = consume_all(broker, topic)
        if len(records) <= want:
            return records
        time.sleep(1)
    raise AssertionError(f"{topic} still holds {len(records)} records, want {want}")


COMPACT = {
    "cleanup.policy": "compact",
    "segment.bytes": str(256 * 1024),
    "min.cleanable.dirty.ratio": "0.01",
    "segment.ms": "1000",
}


@pytest.mark.timeout(900)
@pytest.mark.broker_overrides({"log.cleaner.backoff.ms": "200"})
def test_updates_to_a_thousand_keys_end_as_one_record_per_key(broker):
    topic = unique_topic("compacted")
    create_topic(broker, topic, partitions=PARTITIONS, config=COMPACT)
    delivered: dict = {}
    # Keys that get a value and are then deleted: their tombstones stay
    # (delete.retention.ms is a day by default).
    produce(broker, topic, [(f"dead-{i}".encode(), b"soon gone") for i in range(DELETED)], delivered)
    produce(broker, topic, ((f"key-{i % KEYS}".encode(), f"value-{i}".encode()) for i in range(UPDATES)),
            delivered)
    produce(broker, topic, [(f"dead-{i}".encode(), None) for i in range(DELETED)], delivered)
    # segment.ms has passed by the time this record arrives: it rolls the
    # active segment, so everything before it is sealed and cleanable.
    time.sleep(1.5)
    produce(broker, topic, [(b"roll", b"last")], delivered)
    want = {f"key-{i % KEYS}".encode(): f"value-{i}".encode() for i in range(max(0, UPDATES - KEYS), UPDATES)}
    want.update({f"dead-{i}".encode(): None for i in range(DELETED)})
    want[b"roll"] = b"last"

    records = wait_compacted(broker, topic, KEYS + DELETED + 1)
    check_consistent(records, delivered)
    assert latest_per_key(records) == want
    assert len(records) == KEYS + DELETED + 1
    assert sum(1 for r in records if r[3] is None) == DELETED

    # kafka-python reads the compacted topic (offset gaps) the same way.
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    kc = KafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False,
                       auto_offset_reset="earliest", consumer_timeout_ms=5000)
    try:
        tps = [KTP(topic, p) for p in range(PARTITIONS)]
        kc.assign(tps)
        kc.seek_to_beginning()
        ends = kc.end_offsets(tps)
        seen = []
        deadline = time.monotonic() + 60
        while any(kc.position(tp) < ends[tp] for tp in tps) and time.monotonic() < deadline:
            for tp, msgs in kc.poll(timeout_ms=1000).items():
                seen.extend((tp.partition, m.offset, m.key, m.value) for m in msgs)
        assert latest_per_key(seen) == want
        assert len(seen) == len(records)
    finally:
        kc.close()


@pytest.mark.timeout(900)
@pytest.mark.broker_overrides({
    "log.cleaner.backoff.ms": "200",
    # Slow passes (a few seconds each), so kill -9 lands inside one.
    "log.cleaner.io.max.bytes.per.second": "1000000",
})
def test_kill_9_in_the_middle_of_cleaning_loses_and_duplicates_nothing(broker):
    broker.require_persistence()
    topic = unique_topic("compact-crash")
    keys = 300
    create_topic(broker, topic, partitions=PARTITIONS,
                 config={**COMPACT, "segment.bytes": str(64 * 1024)})
    delivered: dict = {}
    updates = 30_000
    produce(broker, topic, ((f"key-{i % keys}".encode(), f"value-{i}".encode()) for i in range(updates)),
            delivered)
    time.sleep(1.5)
    produce(broker, topic, [(b"roll", b"last")], delivered)
    want = {f"key-{i % keys}".encode(): f"value-{i}".encode() for i in range(updates - keys, updates)}
    want[b"roll"] = b"last"

    kills = 0
    for _ in range(3):
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if any(p.suffix == ".cleaned" for p in broker.data_files()):
                break
            time.sleep(0.02)
        else:
            break  # nothing left to clean
        broker.kill()
        kills += 1
        broker.start()
        records = consume_all(broker, topic)
        check_consistent(records, delivered)
        assert latest_per_key(records) == want, "every key's latest value after kill -9"
    assert kills >= 1, "a cleaning pass was caught in the middle"
    records = wait_compacted(broker, topic, keys + 1)
    check_consistent(records, delivered)
    assert latest_per_key(records) == want
    assert len(records) == keys + 1


@pytest.mark.broker_overrides({"log.cleaner.backoff.ms": "200"})
def test_aborted_transactions_are_cleaned_away_and_committed_ones_kept(broker):
    topic = unique_topic("compact-txn")
    create_topic(broker, topic, partitions=PARTITIONS, config=COMPACT)
    p = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": unique_topic("txn")})
    p.init_transactions(TIMEOUT)

    def txn(values, commit: bool):
        p.begin_transaction()
        for k, v in values:
            p.produce(topic, key=k, value=v)
        if commit:
            p.commit_transaction(TIMEOUT)
        else:
            p.abort_transaction(TIMEOUT)

    txn([(f"key-{i}".encode(), f"c1-{i}".encode()) for i in range(50)], True)
    txn([(f"key-{i}".encode(), f"aborted-{i}".encode()) for i in range(50)], False)
    txn([(f"key-{i}".encode(), f"c3-{i}".encode()) for i in range(25)], True)
    time.sleep(1.5)
    produce(broker, topic, [(b"roll", b"last")])
    want = {f"key-{i}".encode(): (f"c3-{i}" if i < 25 else f"c1-{i}").encode() for i in range(50)}
    want[b"roll"] = b"last"
    # read_uncommitted sees what is stored: the aborted records are gone
    # once cleaned, and each key once.
    deadline = time.monotonic() + 120
    stored = []
    while time.monotonic() < deadline:
        stored = consume_all(broker, topic, "read_uncommitted")
        if len(stored) == len(want):
            break
        time.sleep(1)
    assert not [r for r in stored if r[3].startswith(b"aborted")], "aborted data removed"
    assert latest_per_key(stored) == want
    assert len(stored) == len(want)
    committed = consume_all(broker, topic, "read_committed")
    assert latest_per_key(committed) == want
    assert len(committed) == len(want)


@pytest.mark.broker_overrides({"log.cleaner.backoff.ms": "200"})
def test_history_a_split_left_behind_is_compacted(broker):
    """A compacted topic's range splits: the sealed parent range (the
    history its children read) is cleaned too, down to one record per key
    and partition, and a consumer sees every key's latest value across the
    parent and the children."""
    from test_elastic_ranges import active_ranges, admin_call

    topic = unique_topic("compact-split")
    create_topic(broker, topic, partitions=PARTITIONS, config=COMPACT)
    delivered: dict = {}
    keys, updates = 100, 6000
    produce(broker, topic, ((f"key-{i % keys}".encode(), f"old-{i}".encode()) for i in range(updates)),
            delivered)
    [root] = active_ranges(broker, topic)
    admin_call(broker, "POST", f"/ranges/split?range={root['id']}")
    assert len(active_ranges(broker, topic)) == 2
    produce(broker, topic, [(f"key-{i}".encode(), f"new-{i}".encode()) for i in range(keys // 2)], delivered)
    want = {f"key-{i % keys}".encode(): f"old-{i}".encode() for i in range(updates - keys, updates)}
    want.update({f"key-{i}".encode(): f"new-{i}".encode() for i in range(keys // 2)})
    # The parent keeps each key's last record before the split (the
    # children's newer ones do not reach into it); the children's active
    # segments hold the 50 new ones.
    records = wait_compacted(broker, topic, keys + keys // 2)
    check_consistent(records, delivered)
    assert latest_per_key(records) == want
    assert len(records) == keys + keys // 2
