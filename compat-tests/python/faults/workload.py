"""The fault harness's workloads, real confluent-kafka clients in threads,
and the history they record (every ack, poll, commit and transaction
outcome, with monotonic times):

* queue: idempotent acks=all producers append unique values
  ``q:<producer>:<seq>:<padding>`` round-robin over the partitions; a
  consumer group (``queue-g``) polls them and commits what it polled, each
  member's assignment counted as a session (a new one at every assign);
* txn (list-append style): transactional producers each append one value
  ``t:<producer>:<txn>:<i>`` to 2-3 random partitions per transaction, and
  commit (70 %) or abort it; a read_committed group (``txn-g``) polls.

``read_back`` is the final read of every partition from the start, after
healing, read_uncommitted and read_committed.
"""

from __future__ import annotations

import json
import logging
import os
import random
import threading
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

QUEUE, TXN = "queue", "txn"
QUEUE_GROUP, TXN_GROUP = "queue-g", "txn-g"


class History:
    def __init__(self):
        self.lock = threading.Lock()
        self.t0 = time.monotonic()
        self.acks: list[dict] = []
        self.failed: list[dict] = []
        self.txns: list[dict] = []
        self.polls: list[dict] = []
        self.commits: list[dict] = []
        self.faults: list[dict] = []
        # Clients that could not go on (a fatal error, a worker that died).
        self.workers: list[dict] = []
        self.final: dict = {}

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 4)

    def add(self, kind: str, event: dict) -> None:
        event.setdefault("t", self.now())
        with self.lock:
            getattr(self, kind).append(event)

    def as_dict(self) -> dict:
        with self.lock:
            return {k: list(getattr(self, k)) for k in
                    ("acks", "failed", "txns", "polls", "commits", "faults", "workers")} | {
                "final": self.final}

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.as_dict()))

    def last_ack(self) -> float | None:
        with self.lock:
            return self.acks[-1]["t"] if self.acks else None


def client_logger(path: Path) -> logging.Logger:
    """librdkafka's own log lines go to a file, not the harness's output."""
    log = logging.getLogger("rdkafka")
    if not log.handlers:
        h = logging.FileHandler(path)
        h.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        log.addHandler(h)
        log.setLevel(logging.INFO)
        log.propagate = False
    return log


class Worker(threading.Thread):
    def __init__(self, name: str, bootstrap: str, history: History, stop: threading.Event,
                 logger: logging.Logger):
        super().__init__(name=name, daemon=True)
        self.bootstrap, self.history, self.stop_event, self.logger = bootstrap, history, stop, logger
        self.error: BaseException | None = None

    def run(self):
        try:
            self.work()
        except BaseException as e:  # noqa: BLE001 - reported by the runner
            self.error = e
            self.logger.exception("worker %s died", self.name)


class QueueProducer(Worker):
    def __init__(self, *a, producer: int, partitions: int, rate: float, value_bytes: int, **kw):
        super().__init__(*a, **kw)
        self.producer, self.partitions, self.rate = producer, partitions, rate
        self.pad = "x" * value_bytes
        self.unacked = 0

    def work(self):
        fatal = threading.Event()

        def on_error(err):
            # An idempotent producer's fatal error is the broker's fault
            # (its producer state disagrees with what it acknowledged):
            # recorded as an anomaly, and the work goes on with a new
            # producer (a new producer id).
            if err.fatal() and not fatal.is_set():
                fatal.set()
                self.history.add("workers", {"worker": self.name, "what": "fatal",
                                             "error": str(err)})

        def new_producer() -> Producer:
            return Producer({"bootstrap.servers": self.bootstrap, "enable.idempotence": True,
                             "acks": "all", "linger.ms": 5, "message.timeout.ms": 180000,
                             "error_cb": on_error, "logger": self.logger})

        p = new_producer()

        sent: dict[str, float] = {}

        def delivered(err, msg):
            v = msg.value().decode()
            v = v[:v.rfind(":")]
            if err is None:
                self.history.add("acks", {"topic": QUEUE, "p": msg.partition(), "o": msg.offset(),
                                          "v": v, "txn": None, "sent": sent.pop(v, None)})
            else:
                self.history.add("failed", {"topic": QUEUE, "v": v, "error": str(err)})

        seq, start = 0, time.monotonic()
        while not self.stop_event.is_set():
            wait = start + seq / self.rate - time.monotonic()
            if wait > 0:
                p.poll(min(0.05, wait))  # never negative: poll(-1) blocks for good
                continue
            if fatal.is_set():
                p.flush(0)  # every message still queued fails with the fatal error
                p = new_producer()
                fatal.clear()
            value = f"q:{self.producer}:{seq}:{self.pad}"
            sent[value[:value.rfind(":")]] = self.history.now()
            try:
                p.produce(QUEUE, value.encode(), partition=seq % self.partitions,
                          on_delivery=delivered)
                seq += 1
            except BufferError:
                p.poll(0.1)
            p.poll(0)
        self.unacked = p.flush(200)  # neither acknowledged nor failed by then


class GroupConsumer(Worker):
    """A member of `group` over `topic`; polls are recorded per assignment
    session; what it polled is committed every second."""

    def __init__(self, *a, consumer: str, group: str, topic: str, committed: bool, **kw):
        super().__init__(*a, **kw)
        self.consumer, self.group, self.topic, self.committed = consumer, group, topic, committed
        self.session = 0
        self.next: dict[int, int] = {}

    def work(self):
        def on_assign(c, parts):
            self.session += 1
            self.next = {}

        def on_revoke(c, parts):
            self.commit(c)
            self.next = {}

        conf = {"bootstrap.servers": self.bootstrap, "group.id": self.group,
                "auto.offset.reset": "earliest", "enable.auto.commit": False,
                "isolation.level": "read_committed" if self.committed else "read_uncommitted",
                "session.timeout.ms": 10000, "heartbeat.interval.ms": 1000,
                "logger": self.logger}
        debug = os.environ.get("FAULTS_CONSUMER_DEBUG")
        if debug:
            # librdkafka's own stderr logger writes from its threads; the Python
            # logger is served from consume() and goes quiet when the
            # application thread blocks, which is what this is for.
            conf["debug"] = debug
            del conf["logger"]
        c = Consumer(conf)
        c.subscribe([self.topic], on_assign=on_assign, on_revoke=on_revoke)
        last_commit = time.monotonic()
        try:
            while not self.stop_event.is_set():
                for m in c.consume(200, 0.5):
                    if m.error():
                        continue
                    v = m.value().decode()
                    self.history.add("polls", {
                        "consumer": self.consumer, "session": self.session, "group": self.group,
                        "topic": self.topic, "p": m.partition(), "o": m.offset(),
                        "v": v[:v.rfind(":")] if v.startswith("q:") else v,
                        "committed": self.committed})
                    self.next[m.partition()] = m.offset() + 1
                if time.monotonic() - last_commit > 1.0:
                    self.commit(c)
                    last_commit = time.monotonic()
            self.commit(c)
        finally:
            c.close()

    def commit(self, c):
        if not self.next:
            return
        offsets = [TopicPartition(self.topic, p, o) for p, o in self.next.items()]
        try:
            done = c.commit(offsets=offsets, asynchronous=False)
        except KafkaException:
            return
        for tp in done or []:
            if tp.error is None:
                self.history.add("commits", {"group": self.group, "topic": self.topic,
                                             "p": tp.partition, "o": tp.offset})


class TxnProducer(Worker):
    def __init__(self, *a, producer: int, partitions: int, seed: int, pace: float, **kw):
        super().__init__(*a, **kw)
        self.producer, self.partitions, self.pace = producer, partitions, pace
        self.rng = random.Random(seed * 1000 + producer)

    def new_producer(self) -> Producer:
        p = Producer({"bootstrap.servers": self.bootstrap,
                      "transactional.id": f"faults-txn-{self.producer}",
                      "transaction.timeout.ms": 20000, "message.timeout.ms": 20000,
                      "logger": self.logger})
        while not self.stop_event.is_set():
            try:
                p.init_transactions(30)
                return p
            except KafkaException as e:
                self.logger.warning("init_transactions: %s", e)
                time.sleep(1)
        return p

    def work(self):
        p = self.new_producer()
        n = 0
        while not self.stop_event.is_set():
            n += 1
            txn = f"{self.producer}:{n}"
            parts = self.rng.sample(range(self.partitions), self.rng.choice((2, 3)))
            values = [f"t:{txn}:{i}" for i in range(len(parts))]
            commit = self.rng.random() < 0.7
            status = self.run_txn(p, txn, parts, values, commit)
            self.history.add("txns", {"id": txn, "status": status, "values": values})
            if status == "unknown":
                p = self.new_producer()
            time.sleep(self.pace)

    def run_txn(self, p: Producer, txn: str, parts: list[int], values: list[str],
                commit: bool) -> str:
        def delivered(err, msg):
            if err is None:
                self.history.add("acks", {"topic": TXN, "p": msg.partition(),
                                          "o": msg.offset(), "v": msg.value().decode(),
                                          "txn": txn})
        try:
            p.begin_transaction()
            for part, v in zip(parts, values):
                p.produce(TXN, v.encode(), partition=part, on_delivery=delivered)
            if not commit:
                p.abort_transaction(30)
                return "aborted"
            for _ in range(5):
                try:
                    p.commit_transaction(30)
                    return "committed"
                except KafkaException as e:
                    if e.args[0].retriable():
                        continue
                    raise
            return "unknown"
        except KafkaException as e:
            err: KafkaError = e.args[0]
            if err.txn_requires_abort():
                try:
                    p.abort_transaction(30)
                    return "aborted"
                except KafkaException:
                    return "unknown"
            return "unknown"


def read_back(bootstrap: str, topic: str, partitions: int, committed: bool,
              logger: logging.Logger, unavailable: list, idle: float = 20.0) -> dict[int, list]:
    """Every record of `topic` from the start: {partition: [[offset, value]]};
    a partition whose end offset cannot be had is added to `unavailable`."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"readback-{uuid.uuid4().hex[:8]}",
                  "enable.auto.commit": False,
                  "isolation.level": "read_committed" if committed else "read_uncommitted",
                  "logger": logger})
    out: dict[int, list] = {p: [] for p in range(partitions)}
    try:
        ends = {}
        deadline = time.monotonic() + 60  # for all partitions: a dead topic costs a minute
        for p in range(partitions):
            while True:
                try:
                    ends[p] = c.get_watermark_offsets(TopicPartition(topic, p), timeout=15)[1]
                    break
                except KafkaException as e:
                    # A fresh client may not know the partition yet; a
                    # partition that stays unknown is reported unavailable.
                    if time.monotonic() > deadline:
                        logger.error("final read: %s/%d has no end offset: %s", topic, p, e)
                        unavailable.append({"topic": topic, "p": p, "error": str(e)})
                        ends[p] = 1 << 62
                        break
                    time.sleep(1)
        c.assign([TopicPartition(topic, p, -2) for p in range(partitions)])  # OFFSET_BEGINNING
        pos = {p: 0 for p in range(partitions)}
        quiet_since = time.monotonic()
        while any(pos[p] < ends[p] for p in pos) and time.monotonic() - quiet_since < idle:
            msgs = c.consume(500, 1.0)
            for m in msgs:
                if m.error():
                    continue
                v = m.value().decode()
                out[m.partition()].append([m.offset(), v[:v.rfind(":")] if v.startswith("q:") else v])
                pos[m.partition()] = m.offset() + 1
            if msgs:
                quiet_since = time.monotonic()
            if committed:
                # Markers and aborted records end a partition with no record.
                for p in pos:
                    tp = c.position([TopicPartition(topic, p)])[0]
                    if tp.offset >= 0:
                        pos[p] = max(pos[p], tp.offset)
    finally:
        c.close()
    return out


def group_offsets(bootstrap: str, group: str, topic: str, partitions: int,
                  logger: logging.Logger) -> dict[int, int]:
    """The group's committed offsets. A coordinator that is moving (the
    internal range led elsewhere after healing, or repairing its copies
    before it leads) answers NOT_COORDINATOR or a timeout for a while: that
    is retried for a minute, as for the end offsets in `read_back`."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "logger": logger,
                  "enable.auto.commit": False})
    deadline = time.monotonic() + 60
    try:
        while True:
            try:
                got = c.committed([TopicPartition(topic, p) for p in range(partitions)],
                                  timeout=30)
                return {tp.partition: tp.offset for tp in got if tp.offset >= 0}
            except KafkaException as e:
                moving = e.args[0].code() in (
                    KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                    KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError._TIMED_OUT,
                    KafkaError._TRANSPORT)
                if not (moving or e.args[0].retriable()) or time.monotonic() > deadline:
                    raise
                logger.info("final read: committed offsets of %s not yet: %s", group, e)
                time.sleep(1)
    finally:
        c.close()
