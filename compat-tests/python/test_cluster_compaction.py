"""Log compaction of replicated ranges on a 3-node cluster (issue 8).

* A compacted topic with replication factor 3 and small segments gets many
  updates to a few keys and tombstones (short ``delete.retention.ms``); a
  follower is killed -9 while passes run and restarted. The
  primary records each cleaning pass in the metadata log and every replica
  applies it to its own copy: the sealed segments' files end byte-identical
  on the three brokers and as large as the image says, far smaller than
  what was written; a consumer reads the latest value of every key, the
  deleted keys are gone; after SIGKILL of the primary the new leader serves
  the same compacted records.
* ``__consumer_offsets`` (replicated on the three brokers): one group
  commits thousands of times; its partition's files stay bounded on every
  broker (before this change replicated ranges were never cleaned).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)

from helpers import admin_ready
from test_cluster import cluster, eventually, http, node_pid  # noqa: F401 - fixture
from test_replication import create_replicated, kill_and_restart_later, leader_of

OVERRIDES = {
    "log.cleaner.backoff.ms": "300",
    "offsets.topic.segment.bytes": "16384",
}
KEYS = 20
DELETED = 5
UPDATES = 20_000
# How long cleaning may take to show (lower it to check an old build fails fast).
WAIT = float(os.environ.get("TESSERA_CLEANING_WAIT", "240"))


def range_dirs(workdir: Path, node: int, topic: str) -> list[Path]:
    """The directories of `topic`'s ranges on node `node`."""
    root = workdir / "cluster" / f"node-{node}"
    return [d for t in root.rglob(f"topics/{topic}-*") for d in t.iterdir() if d.is_dir()]


def segment_files(workdir: Path, node: int, topic: str) -> dict[tuple[str, int], bytes]:
    """`(range, seq) -> bytes` of every segment file of `topic` on `node`."""
    out = {}
    for d in range_dirs(workdir, node, topic):
        for f in d.glob("*.log"):
            out[(d.name, int(f.stem))] = f.read_bytes()
    return out


def sealed_segments(admin_url: str, topic: str) -> dict[tuple[str, int], dict]:
    """The sealed segments of `topic` that hold data (a re-placement right
    after another seals an empty one: nothing to clean there)."""
    return {(str(s["range"]), s["seq"]): s for s in http(admin_url + "/segments")
            if s["topic"] == topic and s["sealed_bytes"]}


def identical_cleaned_copies(cluster, topic: str) -> tuple[bool, str]:
    """Every sealed segment of `topic` cleaned at least once, its file the
    same bytes on each of its replicas, of the size the image records."""
    sealed = sealed_segments(cluster["admin"][0], topic)
    uncleaned = sorted(k for k, s in sealed.items() if s.get("clean_pass", 0) == 0)
    if not sealed or uncleaned:
        return False, f"{len(uncleaned)} of {len(sealed)} sealed segments never cleaned: {uncleaned[:10]}"
    files = {n: segment_files(cluster["workdir"], n, topic) for n in (1, 2, 3)}
    for k, s in sealed.items():
        copies = [files[n].get(k) for n in s["replicas"]]
        if any(c is None for c in copies):
            return False, f"segment {k} missing on a node"
        if len({c for c in copies}) != 1 or len(copies[0]) != s["sealed_bytes"]:
            return False, f"segment {k}: sizes {[len(c) for c in copies]}, image {s['sealed_bytes']}"
    return True, "ok"


def consume_all(boot: str, topic: str) -> list[tuple[int, bytes, bytes | None]]:
    c = Consumer({"bootstrap.servers": boot, "group.id": f"reader-{time.monotonic_ns()}",
                  "enable.auto.commit": False, "enable.partition.eof": True})
    try:
        c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        got = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    return got
                raise AssertionError(m.error())
            got.append((m.offset(), m.key(), m.value()))
        raise AssertionError("did not reach the end")
    finally:
        c.close()


def latest(records) -> dict[bytes, bytes | None]:
    out = {}
    for _, k, v in records:
        out[k] = v
    return out


@pytest.mark.timeout(600)
@pytest.mark.cluster_overrides(OVERRIDES)
def test_replicas_of_a_compacted_topic_are_cleaned_alike_and_failover_serves_them(cluster):
    boot = ",".join(cluster["bootstrap"])
    workdir = cluster["workdir"]
    topic = "compacted-rf3"
    admin = create_replicated(boot, topic, 1, 3, {
        "cleanup.policy": "compact",
        "segment.bytes": "16384",
        "min.cleanable.dirty.ratio": "0.01",
        "delete.retention.ms": "2000",
        "min.insync.replicas": "2",
    })
    p = Producer({"bootstrap.servers": boot, "acks": "all", "enable.idempotence": True,
                  "linger.ms": 5, "batch.size": 4096})
    want: dict[bytes, bytes | None] = {}
    produced = 0
    for i in range(UPDATES):
        k = f"key-{i % KEYS}".encode()
        v = f"value-{i}-".encode() + b"x" * 40
        want[k] = v
        produced += len(k) + len(v)
        p.produce(topic, key=k, value=v, partition=0)
        if i % 1000 == 0:
            p.poll(0)
    for k in range(DELETED):
        p.produce(topic, key=f"key-{k}".encode(), value=None, partition=0)
        want[f"key-{k}".encode()] = None
    assert p.flush(60) == 0
    # A follower is killed -9 while passes run and comes back 8 s later
    # (past broker.session.timeout.ms: it is fenced, and the active segment
    # is re-placed on the two others, then on all three once it is back): it
    # applies the passes it finds pending (or fetches again the copies it
    # cannot clean to the recorded bytes) and ends identical too; the
    # segments written on the other replica sets are cleaned as well.
    leader = leader_of(admin, topic)
    follower = next(n for n in (1, 2, 3) if n != leader)
    restart = kill_and_restart_later(workdir, follower, 8)
    # Records while the set is without it, so the segment re-placed on the
    # two others holds data when it is sealed (on a busy machine the
    # follower came back before any was written: an empty segment, and
    # "no re-placement happened").
    eventually("the active segment re-placed without the killed follower", lambda: any(
        s["topic"] == topic and s["sealed_bytes"] is None and follower not in s["replicas"]
        for s in http(cluster["admin"][leader - 1] + "/segments")), timeout=30)
    for i in range(300):
        k = f"key-{KEYS - 1}".encode()
        v = f"while-down-{i}-".encode() + b"z" * 40
        want[k] = v
        p.produce(topic, key=k, value=v, partition=0)
    assert p.flush(60) == 0
    restart.join()
    eventually("the follower serves again", lambda: admin_ready(cluster["admin"][follower - 1]), timeout=60)
    # Trickle updates so the active segment rolls and the tombstones' horizon
    # passes while passes keep running.

    # Each round rolls a segment; the check waits for the passes over it to
    # reach every replica before the next round adds another.
    def cleaned():
        for i in range(200):
            p.produce(topic, key=f"key-{KEYS - 1}".encode(), value=f"late-{i}".encode() + b"y" * 80,
                      partition=0)
        want[f"key-{KEYS - 1}".encode()] = f"late-199".encode() + b"y" * 80
        p.flush(30)
        settle = time.monotonic() + 20
        ok, why = identical_cleaned_copies(cluster, topic)
        while not ok and time.monotonic() < settle:
            time.sleep(0.5)
            ok, why = identical_cleaned_copies(cluster, topic)
        if not ok:
            print(why[:300])
            return False
        records = consume_all(boot, topic)
        return all(k not in {r[1] for r in records} for k in
                   (f"key-{d}".encode() for d in range(DELETED)))

    eventually("every replica cleaned alike and the tombstones gone", cleaned, timeout=WAIT)
    # One more settled check: no producer now, copies identical.
    eventually("copies identical", lambda: identical_cleaned_copies(cluster, topic)[0], timeout=60)
    sealed = sealed_segments(cluster["admin"][0], topic)
    replica_sets = {tuple(sorted(s["replicas"])) for s in sealed.values()}
    assert len(replica_sets) > 1, f"no re-placement happened: {replica_sets}"
    per_node = [sum(len(segment_files(workdir, n, topic).get(k, b"")) for k in sealed) for n in (1, 2, 3)]
    print(f"key+value bytes produced {produced}, sealed segment bytes after cleaning on each node {per_node} "
          f"({len(sealed)} sealed segments, passes {max(s.get('clean_pass', 0) for s in sealed.values())})")
    before = consume_all(boot, topic)
    # The first burst is in sealed segments cleaned before the kill (each
    # round of late updates rolled a segment since).
    sealed_end = UPDATES + DELETED
    assert latest(before) == {k: v for k, v in want.items() if v is not None}
    assert len(before) < UPDATES / 10

    # SIGKILL the primary: the new leader serves the same compacted data.
    old = leader_of(admin, topic)
    os.kill(node_pid(workdir, old), signal.SIGKILL)
    eventually("a new leader", lambda: leader_of(admin, topic) not in (old, -1), timeout=60)
    after = consume_all(boot, topic)
    # The same records (the new leader may clean the segment the failover
    # sealed, so it may hold fewer of the superseded ones).
    assert latest(after) == latest(before)
    assert set(after) <= set(before)
    assert [r for r in before if r[0] < sealed_end] == [r for r in after if r[0] < sealed_end]


@pytest.mark.timeout(600)
@pytest.mark.cluster_overrides(OVERRIDES)
def test_consumer_offsets_stays_bounded_on_every_replica(cluster):
    boot = ",".join(cluster["bootstrap"])
    workdir = cluster["workdir"]
    topic = "offsets-source"
    create_replicated(boot, topic, 1, 3, {})
    c = Consumer({"bootstrap.servers": boot, "group.id": "committer", "enable.auto.commit": False})
    commits = 4000
    for i in range(commits):
        for attempt in range(100):
            try:
                c.commit(offsets=[TopicPartition(topic, 0, i + 1)], asynchronous=False)
                break
            except KafkaException:  # the coordinator is being found or moved
                if attempt == 99:
                    raise
                time.sleep(0.2)
    committed = c.committed([TopicPartition(topic, 0)], timeout=10)[0].offset
    assert committed == commits

    def disk(n: int) -> int:
        return sum(len(b) for b in segment_files(workdir, n, "__consumer_offsets").values())

    def bounded():
        sizes = [disk(n) for n in (1, 2, 3)]
        sealed = sealed_segments(cluster["admin"][0], "__consumer_offsets")
        cleaned = [s for s in sealed.values() if s.get("clean_pass", 0) > 0]
        same, why = identical_cleaned_copies(cluster, "__consumer_offsets")
        print(f"__consumer_offsets on disk per node: {sizes}; sealed {len(sealed)}, "
              f"cleaned {len(cleaned)}; copies identical: {why[:200]}")
        return same and max(sizes) < 64 * 1024

    eventually("__consumer_offsets cleaned on every broker", bounded, timeout=WAIT)
    c2 = Consumer({"bootstrap.servers": boot, "group.id": "committer", "enable.auto.commit": False})
    assert c2.committed([TopicPartition(topic, 0)], timeout=10)[0].offset == commits
    c.close()
    c2.close()


@pytest.mark.timeout(600)
@pytest.mark.cluster_overrides(OVERRIDES)
def test_a_child_led_without_its_parents_log_reads_past_segments_the_cleaner_emptied(cluster):
    """A compacted topic's range is cleaned (its early segments hold nothing
    of partition 0 any more but the first record: one key updated over and
    over), then split; the child's primary is killed, and the follower
    that takes over holds the parent's segments only as copies (no log of
    the parent open). Reading partition 0 from the beginning, it must pass
    over the copies the cleaner emptied, as a Kafka log read passes over
    compacted-away offsets. Before, a read at an offset inside such a copy
    answered nothing below the high watermark: a consumer stalled there for
    good, and a coordinator replaying `__transaction_state` or
    `__consumer_offsets` the same way took the empty answer for the end
    (the 35-minute seed-7 fault run: a transaction coordinator that loaded
    no transactional id, INVALID_PRODUCER_ID_MAPPING, never-aborted
    transactions pinning the last stable offset; group offsets going
    backwards)."""
    boot = ",".join(cluster["bootstrap"])
    workdir = cluster["workdir"]
    topic = "emptied-by-cleaner"
    # Six partitions: one range of two per broker; the first one is split.
    admin = create_replicated(boot, topic, 6, 3, {
        "cleanup.policy": "compact",
        "segment.bytes": "4096",
        "min.cleanable.dirty.ratio": "0.01",
        "min.insync.replicas": "2",
    })
    p = Producer({"bootstrap.servers": boot, "acks": "all", "enable.idempotence": True,
                  "linger.ms": 5, "batch.size": 1024})
    p.produce(topic, key=b"first", value=b"kept", partition=0)
    for i in range(600):
        p.produce(topic, key=b"hot", value=f"update-{i:04d}-".encode() + b"x" * 60, partition=0)
        p.produce(topic, key=b"other", value=f"p1-{i}".encode(), partition=1)
        if i % 100 == 0:
            p.poll(0)
    assert p.flush(60) == 0

    def cleaned_out() -> bool:
        # The oldest sealed segments cleaned (the cleaner leaves the newest
        # dirty ones until more roll in): the first holds only `first` now,
        # the next ones nothing of partition 0.
        first = next(r["id"] for r in http(cluster["admin"][0] + "/ranges")
                     if r["topic"] == topic and r["lo"] == 0)
        sealed = sorted((s for s in http(cluster["admin"][0] + "/segments")
                         if s["range"] == first and s["sealed_bytes"] is not None),
                        key=lambda s: s["seq"])
        print([(s["seq"], s["sealed_bytes"], s.get("clean_pass", 0)) for s in sealed][:12])
        return len(sealed) > 4 and all(s.get("clean_pass", 0) > 0 for s in sealed[:3])

    eventually("the sealed segments cleaned", cleaned_out, timeout=WAIT)
    before = consume_all(boot, topic)
    assert latest(before)[b"first"] == b"kept"
    assert latest(before)[b"hot"].startswith(b"update-0599-")

    url = cluster["admin"][0]
    (root,) = [r for r in http(url + "/ranges")
               if r["topic"] == topic and r["active"] and r["lo"] == 0]
    assert root["hi"] == 2, root
    primary = leader_of(admin, topic)
    http(cluster["admin"][primary - 1] + f"/ranges/split?range={root['id']}", "POST")
    eventually("split", lambda: len([r for r in http(url + "/ranges")
                                     if r["topic"] == topic and r["active"] and r["hi"] <= 2]) == 2)
    p.produce(topic, key=b"hot", value=b"after-the-split", partition=0)
    assert p.flush(60) == 0
    dead = leader_of(admin, topic)
    # The followers hold the producer snapshot where the child starts (they
    # lead it without the parent's log; see test_replica_sets).
    (child,) = [r for r in http(url + "/ranges")
                if r["topic"] == topic and r["active"] and r["lo"] == 0]
    eventually("the child's producer snapshot on its followers", lambda: all(
        any((workdir / "cluster" / f"node-{n}").glob(f"topics/{topic}-*/{child['id']}/{0:010}.snapshot"))
        for n in (1, 2, 3) if n != dead), timeout=60)
    os.kill(node_pid(workdir, dead), signal.SIGKILL)
    survivors = ",".join(cluster["bootstrap"][n - 1] for n in (1, 2, 3) if n != dead)
    eventually("a new leader", lambda: leader_of(admin, topic) not in (dead, -1), timeout=60)
    after = consume_all(survivors, topic)
    assert latest(after) == {b"first": b"kept", b"hot": b"after-the-split"}
    # Nothing but the new record that the first leader did not serve, in
    # offset order.
    assert {r for r in after if r not in before} == {r for r in after if r[2] == b"after-the-split"}
    assert [r[0] for r in after] == sorted(r[0] for r in after)


def _produce_one_batch(boot: str, topic: str, records: list[tuple[bytes | None, int]]):
    """Produces `records` ((key, timestamp ms)) to partition 0 as one batch
    (idempotence off, a long linger) and returns each record's delivery error."""
    out: dict[int, KafkaError | None] = {}
    p = Producer({
        "bootstrap.servers": boot,
        "enable.idempotence": False,
        "linger.ms": 2000,
        "batch.num.messages": 10000,
        "retries": 0,
        "acks": "all",
    })
    for i, (key, ts) in enumerate(records):
        p.produce(topic, value=b"v%d" % i, key=key, partition=0, timestamp=ts,
                  on_delivery=lambda err, msg, i=i: out.__setitem__(i, err))
    assert p.flush(60) == 0, "delivery reports never came"
    return [out[i] for i in range(len(records))]


def test_a_batch_with_bad_records_fails_those_records_by_index(cluster):
    """Issue 24 item 1, as librdkafka's test 0011 checks it: one batch of 100
    records to a compacted topic, 10 without a key. Kafka refuses the batch
    with INVALID_RECORD and lists the 10 in the Produce response's
    record_errors, so librdkafka fails those 10 with INVALID_RECORD and the
    other 90 with _INVALID_DIFFERENT_RECORD (before: all 100 INVALID_RECORD).
    A timestamp outside message.timestamp.before.max.ms is INVALID_TIMESTAMP
    (also listed). On 3 nodes, RF 3."""
    boot = ",".join(cluster["bootstrap"])
    now = int(time.time() * 1000)
    create_replicated(boot, "keyed", 1, 3, {"cleanup.policy": "compact"})
    keyless = set(range(5, 100, 10))
    errors = _produce_one_batch(
        boot, "keyed", [(None if i in keyless else b"k%d" % i, now) for i in range(100)])
    codes = {i: e.code() if e else None for i, e in enumerate(errors)}
    assert {i for i, c in codes.items() if c == KafkaError.INVALID_RECORD} == keyless, codes
    assert all(codes[i] == KafkaError._INVALID_DIFFERENT_RECORD for i in range(100) if i not in keyless), codes

    create_replicated(boot, "recent", 1, 3, {"message.timestamp.before.max.ms": "3600000"})
    # librdkafka splits a batch by record_errors for INVALID_RECORD only:
    # against Kafka, as here, an INVALID_TIMESTAMP batch fails whole.
    errors = _produce_one_batch(boot, "recent", [(b"a", now), (b"b", now - 7_200_000), (b"c", now)])
    assert [e.code() if e else None for e in errors] == [KafkaError.INVALID_TIMESTAMP] * 3, errors
    assert _produce_one_batch(boot, "recent", [(b"x", now - 1_800_000)]) == [None]
    # The broker goes on: a good batch is acknowledged.
    assert _produce_one_batch(boot, "recent", [(b"d", now)]) == [None]
