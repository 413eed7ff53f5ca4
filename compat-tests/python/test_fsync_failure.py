"""Fault injection: fsync fails (or a write fails, EIO or ENOSPC) under an
acks=all producer.

Kafka's rule: a failed fsync takes the log dir offline. Nothing written after
the failure is acknowledged -- not even once fsync works again, because the
kernel reports a writeback error once and may already have dropped the pages
it could not write -- until the broker restarts and recovers the log from
disk. Nothing acknowledged before the failure may be lost.

tessera runs with ``LD_PRELOAD`` of ``shims/failsync.c`` (compiled here with
gcc): while the trigger file exists, fsync/fdatasync on files under
``<data>/topics/`` fail with EIO (the metadata log under ``meta/`` keeps
working). Two paths are covered: the group-commit flusher (default segment
size) and the segment roll, which fsyncs the full segment before opening the
next one (``segment.bytes`` smaller than one batch, so every append rolls).

1. produce N records, all acknowledged, offsets recorded;
2. create the trigger; produce M more: every one must fail
   (KAFKA_STORAGE_ERROR, or a timeout / NOT_LEADER), the broker stays up and
   answers /health and Metadata;
3. delete the trigger (fsync works again) and produce K more without a
   restart: every one must still fail;
4. kill -9 and restart on the same data dir: every acknowledged record is at
   its acknowledged offset with its value, offsets are dense, no value appears
   twice, and producing works again.
"""

from __future__ import annotations

import shutil
import subprocess
import time
import urllib.request
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from helpers import admin, create_topic, unique_topic, wait_topic

SHIM_SRC = Path(__file__).resolve().parent / "shims" / "failsync.c"
PARTITIONS = 3
N_BEFORE, M_DURING, K_AFTER = 120, 30, 12
VALUE_BYTES = 2000
# What a producer may see for a record the broker could not make durable.
EXPECTED_ERRORS = {
    KafkaError.KAFKA_STORAGE_ERROR,
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.REQUEST_TIMED_OUT,
    KafkaError._MSG_TIMED_OUT,
    KafkaError._TIMED_OUT,
}


@pytest.fixture(scope="module")
def failsync_lib(tmp_path_factory) -> Path:
    gcc = shutil.which("gcc")
    # A failure, not a skip: a missing compiler must not pass the suite
    # (scripts/test.sh installs gcc).
    assert gcc is not None, "gcc not found: cannot build the fsync fault-injection shim"
    out = tmp_path_factory.mktemp("failsync") / "libfailsync.so"
    r = subprocess.run(
        [gcc, "-shared", "-fPIC", "-O2", "-o", str(out), str(SHIM_SRC), "-ldl"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, f"building {SHIM_SRC.name} failed:\n{r.stderr}"
    return out


def value(phase: str, i: int) -> bytes:
    return f"{phase}-{i:06d}|".encode().ljust(VALUE_BYTES, b".")


def produce(bootstrap: str, topic: str, phase: str, n: int):
    """Produces n records round-robin over the partitions; returns one
    (value, partition, offset or None, KafkaError or None) per record."""
    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": False,
            "retries": 2,
            "retry.backoff.ms": 100,
            "linger.ms": 5,
            "request.timeout.ms": 5000,
            "message.timeout.ms": 10000,
        }
    )
    results = []

    def cb(err, msg):
        results.append((msg.value(), msg.partition(), None if err else msg.offset(), err))

    for i in range(n):
        p.produce(topic, value=value(phase, i), partition=i % PARTITIONS, on_delivery=cb)
        p.poll(0)
    assert p.flush(30) == 0, f"{phase}: records still queued after 30 s"
    assert len(results) == n, f"{phase}: {len(results)} delivery reports for {n} records"
    return results


def error_summary(results) -> str:
    c = Counter(err.name() if err else "acknowledged" for _, _, _, err in results)
    return ", ".join(f"{k}: {v}" for k, v in sorted(c.items()))


def watermarks(bootstrap: str, topic: str) -> dict[int, tuple[int, int]]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"wm-{topic}"})
    try:
        return {
            p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)
            for p in range(PARTITIONS)
        }
    finally:
        c.close()


def read_all(bootstrap: str, topic: str, ends: dict[int, int]) -> dict[int, list[tuple[int, bytes]]]:
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"read-{topic}",
            "enable.auto.commit": False,
            "auto.offset.reset": "error",
        }
    )
    c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    out: dict[int, list[tuple[int, bytes]]] = defaultdict(list)
    total, n = sum(ends.values()), 0
    deadline = time.monotonic() + 60
    try:
        while n < total and time.monotonic() < deadline:
            for m in c.consume(num_messages=1000, timeout=1.0):
                if m.error():
                    raise AssertionError(f"consumer error: {m.error()}")
                out[m.partition()].append((m.offset(), m.value()))
                n += 1
    finally:
        c.close()
    return out


def http_status(url: str) -> int:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.status


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "path, topic_config",
    [
        ("flush", {}),
        # Every batch is larger than a segment: every append first rolls,
        # i.e. fsyncs the full segment before opening the next one.
        ("roll", {"segment.bytes": "1024"}),
        # Not fsync: the write itself fails (a bad sector; a full disk).
        # Kafka takes the log dir offline on any I/O error alike.
        ("write-EIO", {}),
        ("write-ENOSPC", {}),
    ],
)
def test_failed_fsync_never_acks_and_loses_nothing_acked(
    broker_factory, failsync_lib, path, topic_config
):
    broker = broker_factory(start=False)
    broker.require_persistence()
    trigger = broker.workdir / "fail-fsync"
    faults = {"FAILSYNC_TRIGGER": str(trigger)}
    if path.startswith("write-"):
        faults = {"FAILSYNC_WRITE_TRIGGER": str(trigger),
                  "FAILSYNC_WRITE_ERRNO": path.split("-", 1)[1]}
    broker.env.update(
        {
            "LD_PRELOAD": str(failsync_lib),
            "FAILSYNC_PATH_MATCH": "/topics/",
            **faults,
        }
    )
    broker.start()
    topic = unique_topic(f"fsync-{path}")
    create_topic(broker, topic, partitions=PARTITIONS, config=topic_config)

    # 1. Healthy: everything is acknowledged.
    before = produce(broker.bootstrap, topic, "before", N_BEFORE)
    assert all(err is None for *_, err in before), error_summary(before)
    acked = {(p, o): v for v, p, o, _ in before}
    assert len(acked) == N_BEFORE, "two records acknowledged at the same offset"

    # 2. fsync fails: nothing may be acknowledged.
    trigger.touch()
    during = produce(broker.bootstrap, topic, "during", M_DURING)
    injected = [ln for ln in broker.log_tail(100_000).splitlines() if ln.startswith("failsync: ")]
    print(f"\n[{path}] while fsync fails: {error_summary(during)}; "
          f"{len(injected)} fsync calls failed, first: {injected[:1]}")
    assert injected, "the shim never failed a call (is LD_PRELOAD honoured?)"
    if path.startswith("write-"):
        assert all(ln.startswith("failsync: write(") for ln in injected), injected[:3]
    acked_during = [(p, o) for _, p, o, err in during if err is None]
    assert not acked_during, (
        f"acknowledged although fsync failed: {acked_during[:10]} ({error_summary(during)})"
    )
    unexpected = {err.name() for *_, err in during if err.code() not in EXPECTED_ERRORS}
    assert not unexpected, f"unexpected produce errors: {unexpected} ({error_summary(during)})"

    # The broker survived the failure and still answers.
    assert broker.running(), f"broker exited with {broker.proc.returncode} after the fsync failure"
    assert http_status(broker.admin_url("/health")) == 200
    md = admin(broker).list_topics(topic=topic, timeout=10)
    assert topic in md.topics, "Metadata does not answer after the fsync failure"
    print(f"[{path}] metadata after the failure: "
          f"{ {p: (m.leader, str(m.error)) for p, m in md.topics[topic].partitions.items()} }")

    # 3. fsync works again, but the log must stay offline until a restart.
    trigger.unlink()
    after = produce(broker.bootstrap, topic, "after", K_AFTER)
    print(f"[{path}] fsync works again, no restart: {error_summary(after)}")
    acked_after = [(p, o) for _, p, o, err in after if err is None]
    assert broker.running(), f"broker exited with {broker.proc.returncode}"

    # 4. kill -9 and restart: nothing acknowledged is lost.
    broker.restart(kill=True)
    wait_topic(admin(broker), topic, PARTITIONS)
    for v, p, o, err in after:
        if err is None:
            assert (p, o) not in acked, f"offset {(p, o)} acknowledged twice"
            acked[(p, o)] = v
    wm = watermarks(broker.bootstrap, topic)
    records = read_all(broker.bootstrap, topic, {p: hi for p, (_, hi) in wm.items()})
    seen: dict[bytes, tuple[int, int]] = {}
    for p in range(PARTITIONS):
        lo, hi = wm[p]
        got = records.get(p, [])
        assert lo == 0, f"partition {p}: log start {lo} after restart"
        assert [o for o, _ in got] == list(range(hi)), (
            f"partition {p}: offsets read back are not 0..{hi - 1} ({len(got)} records)"
        )
        for o, v in got:
            assert v not in seen, f"value {v[:16]!r} at {seen[v]} and {(p, o)}"
            seen[v] = (p, o)
    by_offset = {(p, o): v for p, got in records.items() for o, v in got}
    for (p, o), v in sorted(acked.items()):
        assert (p, o) in by_offset, f"acknowledged record lost: partition {p} offset {o}"
        assert by_offset[(p, o)] == v, (
            f"partition {p} offset {o}: {by_offset[(p, o)][:16]!r} != acknowledged {v[:16]!r}"
        )
    acked_values = set(acked.values())
    failed_present = sum(1 for v in seen if v not in acked_values)
    print(f"[{path}] after restart: watermarks {wm}; {len(acked)} acknowledged records intact, "
          f"{failed_present} records whose produce failed are present")

    # The log is back online after the restart.
    again = produce(broker.bootstrap, topic, "restarted", PARTITIONS)
    assert all(err is None for *_, err in again), error_summary(again)
    assert {p: o for _, p, o, _ in again} == {p: wm[p][1] for p in range(PARTITIONS)}

    assert not acked_after, (
        f"acknowledged after an fsync failure (fsync working again, no restart): "
        f"{acked_after[:10]} ({error_summary(after)}); Kafka keeps the log dir offline "
        "until a restart"
    )
