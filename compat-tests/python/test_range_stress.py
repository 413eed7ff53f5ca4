"""Range moves racing appends (issue 12: no append may land in a sealed
range).

Eight idempotent confluent-kafka producers (eight Producer instances, so
eight connections; acks=all, linger.ms=5), each in its own thread, write
STRESS_RECORDS records in total (default 200,000) to one 32-partition topic:
record `seq` of producer `i` goes to partition `seq % 32` with value `i:seq`.
Meanwhile a background thread moves the topic's ranges every STRESS_MOVE_MS
(default 100 ms) through the admin HTTP API: it splits the widest range until
the topic has 8-16 ranges, then merges adjacent pairs down to 1-2, and again,
so the layout keeps changing while batches are in flight.

Production is spread over STRESS_MOVES moves (default 60), so a fast
machine cannot finish before the moves happen: a producer's k-th share of
its records is paced over the time from the mover's k-th move to the next
(estimated from the moves so far), so appends are in flight whenever a range
is sealed. (Where producing is the slower part, the pacing never holds anyone
back.) Time only paces the producers; nothing measures or asserts it.

Afterwards the whole topic is read back from offset 0 (all 32 partitions
assigned, read up to each high watermark), once from the live broker and
once more after a restart (the sealed ranges then come back from disk), and
each time:

(a) every partition's offsets are dense from 0 to its high watermark (no
    transactions, so every offset holds a record);
(b) every acknowledged record is read exactly once, at its acknowledged offset,
    with its value;
(c) no record (acknowledged or not) is read twice;

and (d) no delivery failed (the idempotent producer retries
NOT_LEADER_OR_FOLLOWER by itself) and no client error was fatal; (e) the
moves happened: at least STRESS_MIN_MOVES splits and as many merges.

Knobs (environment): STRESS_RECORDS, STRESS_PRODUCERS (8), STRESS_MOVE_MS
(100), STRESS_MOVES (60), STRESS_MIN_MOVES (10), STRESS_RESTART (1: also read
back after a restart), STRESS_SEED (random; printed, so a run's move choices
can be replayed). scripts/stress-ranges.sh runs this test N times.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
import urllib.error
import urllib.request
from collections import Counter, defaultdict

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from helpers import broker_log_lines, create_topic, unique_topic

PARTITIONS = 32
RECORDS = int(os.environ.get("STRESS_RECORDS", "200000"))
PRODUCERS = int(os.environ.get("STRESS_PRODUCERS", "8"))
MOVE_INTERVAL_S = int(os.environ.get("STRESS_MOVE_MS", "100")) / 1000
MOVES = max(1, int(os.environ.get("STRESS_MOVES", "60")))
MIN_MOVES = int(os.environ.get("STRESS_MIN_MOVES", "10"))
RESTART = os.environ.get("STRESS_RESTART", "1") == "1"
SEED = int(os.environ.get("STRESS_SEED", str(random.randrange(1 << 30))))
# Client-side bounds only (a stalled broker fails the test instead of hanging
# it); nothing here measures how fast the broker is.
FLUSH_TIMEOUT_S = 240
CONSUME_STALL_S = 30


def admin_call(broker, method: str, path: str):
    """(HTTP status, parsed JSON body). 4xx/5xx answers are returned, not raised."""
    req = urllib.request.Request(f"http://127.0.0.1:{broker.admin_port}{path}", method=method,
                                 data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as e:
        body = e.read()
        try:
            return e.code, json.loads(body or b"null")
        except ValueError:
            return e.code, body.decode(errors="replace")


def active_ranges(broker, topic: str) -> list[dict]:
    status, body = admin_call(broker, "GET", "/ranges")
    assert status == 200, (status, body)
    return sorted((r for r in body if r["topic"] == topic and r["active"]), key=lambda r: r["lo"])


class Mover:
    """Splits and merges the topic's ranges every MOVE_INTERVAL_S until stopped:
    the widest range split until 8-16 ranges, then adjacent pairs merged down
    to 1-2, again."""

    def __init__(self, broker, topic: str, rnd: random.Random):
        self.broker, self.topic, self.rnd = broker, topic, rnd
        self.stop = threading.Event()
        self.started = 0  # moves begun (the producers' gate)
        self.last_start = 0.0
        self.cycle = MOVE_INTERVAL_S  # running estimate of the time from one move's start to the next
        self.splits = self.merges = 0
        self.refused: list[tuple[str, int, object]] = []  # 4xx: a move that lost a race
        self.failed: list[tuple[str, int, object]] = []   # anything else
        self.max_ranges = 1
        self.thread = threading.Thread(target=self.run, name="mover", daemon=True)

    def gate_open(self, fraction: float) -> bool:
        """May a producer go past `fraction` of its records? Its k-th share
        (of MOVES) is spread over the time from the k-th move's start to the
        next one's (estimated from the moves so far)."""
        if self.started > MOVES or not self.thread.is_alive():
            return True
        if self.started == 0:
            return False
        into = min(1.0, (time.monotonic() - self.last_start) / self.cycle)
        return fraction * MOVES < self.started - 1 + into

    def run(self):
        try:
            self.moves()
        finally:
            self.started = MOVES + 1  # never hold producers back once moving stopped

    def moves(self):
        splitting, goal = True, self.rnd.randint(8, 16)
        while not self.stop.wait(MOVE_INTERVAL_S):
            try:
                ranges = active_ranges(self.broker, self.topic)
                self.max_ranges = max(self.max_ranges, len(ranges))
                if splitting and len(ranges) >= goal:
                    splitting, goal = False, self.rnd.randint(1, 2)
                elif not splitting and len(ranges) <= goal:
                    splitting, goal = True, self.rnd.randint(8, 16)
                if splitting:
                    widest = max(r["hi"] - r["lo"] for r in ranges)
                    r = self.rnd.choice([r for r in ranges if r["hi"] - r["lo"] == widest])
                    what, path = f"split {r['id']}", f"/ranges/split?range={r['id']}"
                else:
                    i = self.rnd.randrange(len(ranges) - 1)
                    left, right = ranges[i]["id"], ranges[i + 1]["id"]
                    what, path = f"merge {left}+{right}", f"/ranges/merge?left={left}&right={right}"
                now = time.monotonic()
                if self.started:
                    self.cycle = 0.8 * self.cycle + 0.2 * (now - self.last_start)
                self.last_start = now
                self.started += 1
                status, body = admin_call(self.broker, "POST", path)
            except Exception as e:  # noqa: BLE001 - recorded, asserted on at the end
                self.failed.append(("admin call", -1, repr(e)))
                continue
            if status == 200:
                if splitting:
                    self.splits += 1
                else:
                    self.merges += 1
            elif 400 <= status < 500:
                self.refused.append((what, status, body))
            else:
                self.failed.append((what, status, body))


def produce_all(broker, topic: str, index: int, count: int, mover: Mover, acked: dict, errors: list,
                client_errors: list):
    """Producer `index`: records seq 0..count-1, seq % PARTITIONS as partition."""

    def on_error(err):
        client_errors.append((index, err))

    def on_delivery(err, msg):
        i, seq = (int(x) for x in msg.value().split(b":"))
        if err is not None:
            errors.append((i, seq, err))
        else:
            acked[(i, seq)] = (msg.partition(), msg.offset())

    p = Producer({
        "bootstrap.servers": broker.bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "error_cb": on_error,
    })
    for seq in range(count):
        while not mover.gate_open(seq / count):
            p.poll(0.002)
        value = b"%d:%d" % (index, seq)
        while True:
            try:
                p.produce(topic, value=value, key=value, partition=seq % PARTITIONS, on_delivery=on_delivery)
                break
            except BufferError:
                p.poll(0.05)
        if seq % 500 == 0:
            p.poll(0)
    left = p.flush(FLUSH_TIMEOUT_S)
    if left:
        errors.append((index, -1, f"{left} records still undelivered after flush({FLUSH_TIMEOUT_S})"))


def read_everything(broker, topic: str):
    """Reads every partition from 0 to its high watermark.
    Returns ({(p, o): value}, duplicate (p, o) reads, high watermarks, errors, stalled partitions)."""
    c = Consumer({
        "bootstrap.servers": broker.bootstrap,
        "group.id": f"stress-read-{topic}",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        # An offset the broker no longer (or never) serves is an error, not a silent skip.
        "auto.offset.reset": "error",
    })
    hw = {}
    errors = []
    for p in range(PARTITIONS):
        lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
        if lo != 0:
            errors.append((p, lo, "low watermark is not 0"))
        hw[p] = hi
    c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS) if hw[p] > 0])
    read: dict[tuple[int, int], bytes] = {}
    dup_offsets = []
    next_offset = defaultdict(int)
    last_progress = time.monotonic()
    while any(next_offset[p] < hw[p] for p in hw):
        msgs = c.consume(num_messages=10_000, timeout=1.0)
        for m in msgs:
            if m.error():
                if m.error().code() != KafkaError._PARTITION_EOF:
                    errors.append((m.partition(), m.offset(), m.error()))
                continue
            key = (m.partition(), m.offset())
            if key in read:
                dup_offsets.append(key)
            read[key] = m.value()
            next_offset[m.partition()] = max(next_offset[m.partition()], m.offset() + 1)
            last_progress = time.monotonic()
        if time.monotonic() - last_progress > CONSUME_STALL_S:
            break
    stalled = {p: (next_offset[p], hw[p]) for p in hw if next_offset[p] < hw[p]}
    c.close()
    return read, dup_offsets, hw, errors, stalled


def check_read_back(broker, topic: str, acked: dict, when: str) -> list[str]:
    """Checks (a), (b) and (c) on a full read of the topic; returns the problems."""
    read, dup_offsets, hw, read_errors, stalled = read_everything(broker, topic)
    print(f"{when}: read back {len(read):,} records; high watermarks sum to {sum(hw.values()):,}")
    problems = []
    if read_errors:
        problems.append(f"consumer errors: {read_errors[:5]}")
    if stalled:
        problems.append(f"reading stalled (next offset, high watermark): {stalled}")
    if dup_offsets:
        problems.append(f"offsets delivered twice: {dup_offsets[:10]}")
    # (a) dense offsets
    for p in range(PARTITIONS):
        holes = [o for o in range(hw[p]) if (p, o) not in read]
        if holes:
            problems.append(f"partition {p}: {len(holes)} offset(s) below the high watermark {hw[p]} hold "
                            f"no record, first {holes[:10]}")
        beyond = sorted(o for (q, o) in read if q == p and o >= hw[p])
        if beyond:
            problems.append(f"partition {p}: records read at/after the high watermark {hw[p]}: {beyond[:10]}")
    # (c) no record read twice (acknowledged or not)
    where: dict[bytes, list[tuple[int, int]]] = defaultdict(list)
    for key, value in read.items():
        where[value].append(key)
    twice = {v: ks for v, ks in where.items() if len(ks) > 1}
    if twice:
        problems.append(f"{len(twice)} record(s) stored more than once, e.g. {sorted(twice.items())[:5]}")
    foreign = [v for v in where if v.count(b":") != 1]
    if foreign:
        problems.append(f"unexpected values read: {foreign[:5]}")
    # (b) every acknowledged record exactly where it was acknowledged
    misplaced = []
    for (i, seq), (p, o) in acked.items():
        value = b"%d:%d" % (i, seq)
        if p != seq % PARTITIONS or read.get((p, o)) != value:
            misplaced.append(((i, seq), (p, o), read.get((p, o)), where.get(value)))
    if misplaced:
        problems.append(f"{len(misplaced)} acknowledged record(s) not read back at their offset "
                        f"((producer, seq), acked at, read there, found at): {misplaced[:5]}")
    return [f"{when}: {p}" for p in problems]


@pytest.mark.timeout(600)
@pytest.mark.broker_overrides({"range.policy.enable": "false"})  # only this test moves ranges
def test_appends_racing_splits_and_merges(broker):
    if not broker.has_admin_http:
        pytest.skip(f"{broker.kind} has no admin HTTP port to move ranges with")
    topic = unique_topic("stress")
    create_topic(broker, topic, PARTITIONS)
    assert len(active_ranges(broker, topic)) == 1
    print(f"seed {SEED}, {RECORDS:,} records from {PRODUCERS} producers over {MOVES} moves, one every "
          f"{MOVE_INTERVAL_S * 1000:.0f} ms; broker dir {broker.workdir}")

    acked: dict[tuple[int, int], tuple[int, int]] = {}
    delivery_errors: list = []
    client_errors: list = []
    per_producer = [RECORDS // PRODUCERS + (1 if i < RECORDS % PRODUCERS else 0) for i in range(PRODUCERS)]

    mover = Mover(broker, topic, random.Random(SEED))
    producers = [
        threading.Thread(target=produce_all, name=f"producer-{i}",
                         args=(broker, topic, i, per_producer[i], mover, acked, delivery_errors, client_errors))
        for i in range(PRODUCERS)
    ]
    t0 = time.monotonic()
    mover.thread.start()
    for t in producers:
        t.start()
    for t in producers:
        t.join()
    produce_s = time.monotonic() - t0
    mover.stop.set()
    mover.thread.join(120)
    assert not mover.thread.is_alive(), "the mover is stuck in an admin call"
    final = active_ranges(broker, topic)

    err_counts = Counter(
        e[2].name() if isinstance(e[2], KafkaError) else str(e[2]) for e in delivery_errors)
    client_counts = Counter(f"{e.name()}{' (fatal)' if e.fatal() else ''}" for _, e in client_errors)
    print(f"produced for {produce_s:.1f} s: {len(acked):,} acknowledged, delivery errors {dict(err_counts)}, "
          f"client errors {dict(client_counts)}")
    print(f"moves: {mover.splits} splits, {mover.merges} merges, {len(mover.refused)} refused (4xx), "
          f"{len(mover.failed)} failed; up to {mover.max_ranges} ranges, final "
          f"{[(r['id'], r['lo'], r['hi']) for r in final]}")
    for what in mover.refused[:5] + mover.failed[:5]:
        print(f"  move answer: {what}")

    problems = check_read_back(broker, topic, acked, "live broker")
    if RESTART:
        broker.restart()
        problems += check_read_back(broker, topic, acked, "after a restart")

    suspicious = broker_log_lines(broker, " ERROR ", " WARN ", "panicked")
    for line in suspicious[:20]:
        print(f"  broker log: {line}")
    acked_at = Counter(acked.values())
    shared = [k for k, n in acked_at.items() if n > 1]
    if shared:
        problems.append(f"{len(shared)} offset(s) acknowledged to more than one record: {shared[:5]}")
    # per producer and partition, offsets follow the send order (idempotence keeps order)
    order = []
    by_stream = defaultdict(list)
    for (i, seq), (p, o) in acked.items():
        by_stream[(i, p)].append((seq, o))
    for stream, pairs in by_stream.items():
        pairs.sort()
        if any(a[1] >= b[1] for a, b in zip(pairs, pairs[1:])):
            order.append(stream)
    if order:
        problems.append(f"send order broken for (producer, partition) {order[:5]}")
    # (d) delivery and client errors
    if delivery_errors:
        problems.append(f"{len(delivery_errors)} delivery error(s) {dict(err_counts)}: {delivery_errors[:5]}")
    if len(acked) != RECORDS and not delivery_errors:
        problems.append(f"{len(acked):,} of {RECORDS:,} records acknowledged")
    fatal = [e for _, e in client_errors if e.fatal()
             or (not e.retriable() and e.code() not in (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN))]
    if fatal:
        problems.append(f"client errors: {fatal[:5]}")
    # (e) the moves happened
    if mover.failed:
        problems.append(f"admin moves failed: {mover.failed[:5]}")
    if mover.splits < MIN_MOVES or mover.merges < MIN_MOVES:
        problems.append(f"only {mover.splits} splits and {mover.merges} merges (want >= {MIN_MOVES} each)")
    panics = [line for line in suspicious if "panicked" in line or "records were skipped" in line]
    if panics:
        problems.append(f"broker log: {panics[:5]}")
    assert not problems, "\n".join(problems)
